"""bench/compare.py's report from saved results: the paired ratio column and
--from-json (no measuring: synthetic results with known samples)."""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("fastattn_compare_under_test",
                                                  os.path.join(HERE, "compare.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _results(torch_s, fa_s):
    case = {"id": "prefill", "kind": "attention", "B": 1, "Hq": 8, "Hkv": 8, "Lq": 1024,
            "Lk": 1024, "D": 64, "Dv": 64, "dtype": "float32", "causal": False, "window": None,
            "mask": None, "kv_lengths": None, "memory": False}
    runs = {"torch": [{"seconds": t} if t else {"error": "boom"} for t in torch_s],
            "fastattn": [{"seconds": f, "max_err": 1e-7} for f in fa_s]}
    return {"machine": {"cpu": "test CPU", "logical_cpus": 2, "usable_cpus": 2, "python": "3",
                        "platform": "test", "numpy": "2", "scipy": None, "torch": "2"},
            "threads": 2, "repeats": len(fa_s), "min_time": 0.1,
            "available": {"torch": True, "numpy": True, "scipy": False, "fastattn": True},
            "ceilings": [{"matmul_gflops": 100.0, "read_gbs": 10.0}],
            "cases": [{"case": case, "describe": "B1 H8 L1024 D64", "numpy_skipped": None,
                       "runs": runs}],
            "loadavg_start": 0.1, "loadavg_end": 0.2, "scaling": []}


def _table_row(text, case_id):
    header = next(ln for ln in text.splitlines() if ln.startswith("| case |"))
    row = next(ln for ln in text.splitlines() if ln.startswith(f"| {case_id} |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    return dict(zip(cols, (c.strip() for c in row.strip("|").split("|"))))


def test_paired_ratio_is_the_median_of_per_repeat_ratios(compare, capsys):
    # drift: the box slows down over the run, both libraries alike, and one
    # repeat is disturbed.  Per repeat torch / fastattn is 1.2, 1.2, 1.2, 0.5,
    # 1.2 -> median 1.2; the medians of the two columns (4.0 and 5.0) give 0.8.
    torch_s = [1.2, 2.4, 6.0, 4.0, 12.0]
    fa_s = [1.0, 2.0, 5.0, 8.0, 10.0]
    res = _results(torch_s, fa_s)
    ceil, rows = compare.summarize(res)
    assert rows[0]["paired"] == pytest.approx(1.2)
    compare.print_report(res, ceil, rows)
    row = _table_row(capsys.readouterr().out, "prefill")
    assert row["torch / fastattn"] == "0.80×"      # medians 4.0 / 5.0
    assert row["paired"] == "1.20×"


def test_paired_ratio_skips_failed_repeats(compare):
    res = _results([2.0, None, 3.0], [1.0, 1.0, 1.0])      # repeat 2: torch failed
    _, rows = compare.summarize(res)
    assert rows[0]["paired"] == pytest.approx(2.5)         # median of 2.0 and 3.0


def test_paired_ratio_without_torch(compare):
    res = _results([1.0], [1.0])
    del res["cases"][0]["runs"]["torch"]
    res["available"]["torch"] = False
    _, rows = compare.summarize(res)
    assert rows[0]["paired"] is None


def test_from_json_prints_the_saved_run(compare, tmp_path, capsys):
    res = _results([3.0, 3.3, 2.7], [1.5, 1.5, 1.5])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(res))
    compare.main(["--from-json", str(path)])
    out = capsys.readouterr().out
    assert "test CPU" in out
    row = _table_row(out, "prefill")
    assert row["fastattn"] == "1500.00 ms"
    assert row["paired"] == "2.00×"
    assert row["torch / fastattn"] == "2.00×"


@pytest.mark.parametrize("opt", [["--cases", "long"], ["--threads", "1"], ["--json", "x.json"],
                                 ["--repeats", "5"], ["--quick"]])
def test_from_json_refuses_measuring_options(compare, tmp_path, opt, capsys):
    # those options choose what to measure; a reprint would silently ignore them
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_results([3.0], [1.5])))
    with pytest.raises(SystemExit) as exc:
        compare.main(["--from-json", str(path)] + opt)
    assert exc.value.code == 2
    assert opt[0] in capsys.readouterr().err


def test_scaling_lines_for_prefill_and_the_one_head_backward(compare, capsys):
    res = _results([2.0], [1.0])
    res["scaling"] = [{"one": 2.0, "many": 1.0}]
    res["scaling_bwd_1head"] = [{"one": 3.0, "many": 1.6}, {"one": 3.0, "many": 1.5}, {"one": 3.0, "many": 2.0}]
    ceil, rows = compare.summarize(res)
    compare.print_report(res, ceil, rows)
    out = capsys.readouterr().out
    assert "Thread scaling, prefill:" in out and "2.00×" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("Thread scaling, bwd-1head"))
    assert "1.88×" in line and "median of 3" in line     # 3/1.6, 3/1.5, 3/2.0 -> median 1.875


def test_read_ceiling_spread_is_reported_and_flagged(compare, capsys):
    # three readings of the 64 MiB read loop: 87, 98 and 41 GB/s (a cache shared with
    # other guests); the table's % uses 98, and the report says how far it moved
    res = _results([2.0], [1.0])
    res["ceilings"] = [{"matmul_gflops": 100.0, "read_gbs": 10.0,
                        "read_ceiling_gbs": {str(64 << 20): g, str(128 << 20): h}}
                       for g, h in ((87.0, 40.0), (98.0, 41.0), (41.0, 42.0))]
    assert compare.read_ceiling_spread(res["ceilings"]) == {64 << 20: (41.0, 98.0), 128 << 20: (40.0, 42.0)}
    ceil, rows = compare.summarize(res)
    assert ceil["read_ceiling_gbs"][64 << 20] == 98.0
    compare.print_report(res, ceil, rows)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("- read ceiling readings"))
    assert "64.0 MiB 41.0-98.0 GB/s" in line and "128.0 MiB 40.0-42.0 GB/s" in line
    assert "moved by more than a quarter" in line
    # readings within a quarter of each other: the spread without the warning
    for r, g in zip(res["ceilings"], (50.0, 55.0, 60.0)):
        r["read_ceiling_gbs"] = {str(64 << 20): g}
    compare.print_report(res, *compare.summarize(res))
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("- read ceiling readings"))
    assert "moved" not in line


def test_serving_cases_are_reported_against_their_baseline(compare, capsys):
    """A serving case and its fastattn baseline (their own cases): the serving
    table divides the baseline's time by the case's and shows the targets."""
    case = next(c for c in compare.H.SERVING_CASES if c["id"] == "varlen-64")
    base = next(c for c in compare.H.SERVING_CASES if c["id"] == case["baseline"])
    res = _results([3.0], [1.0])
    res["cases"] = [
        {"case": case, "describe": compare.H.describe(case), "numpy_skipped": "serving",
         "runs": {"fastattn": [{"seconds": 0.020, "max_err": 1e-7}], "torch": [{"seconds": 0.060}]}},
        {"case": base, "describe": compare.H.describe(base), "numpy_skipped": "serving",
         "runs": {"fastattn": [{"seconds": 0.035, "max_err": 1e-7}]}},
    ]
    ceil, rows = compare.summarize(res)
    compare.print_report(res, ceil, rows)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("| varlen-64 | 20.00 ms | varlen-64-loop"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:8] == ["35.00 ms", "1.75×", "1.50×", "3.00×", "2.00×"]
    assert rows[0]["gflops"] == pytest.approx(compare.H.attention_flops(case) / 0.020 / 1e9)


def test_a_serving_case_brings_its_baseline(compare, monkeypatch):
    """--cases varlen-64 also runs varlen-64-loop, its baseline."""
    seen = []
    monkeypatch.setattr(compare.P, "run_child",
                        lambda lib, case, threads, **kw: seen.append((lib, case and case.get("id"))) or
                        ({"matmul_gflops": 1.0, "read_gbs": 1.0, "read_sum_gbs": 1.0} if lib == "ceilings"
                         else {"seconds": 1.0}))
    monkeypatch.setattr(compare.H, "import_error", lambda *a, **k: None)
    monkeypatch.setattr(compare.H, "library_available", lambda lib: lib == "torch")
    compare.run(compare.parse_args(["--cases", "varlen-64", "--quick"]))
    assert ("fastattn", "varlen-64") in seen and ("torch", "varlen-64") in seen
    assert ("fastattn", "varlen-64-loop") in seen and ("torch", "varlen-64-loop") not in seen


def test_the_kv_group_brings_its_twins(compare):
    """--group kv: the float8 / QuantizedKV / sinks cases and the float32 and int8
    twins their tables divide by."""
    ids = [c["id"] for c in compare.selected(compare.parse_args(["--group", "kv"]))]
    for want in ("decode-f8e4", "decode-f8e5", "decode-u8", "decode-u4", "gqa-decode-u4", "gqa-decode-int8",
                 "prefill-sinks", "decode-sinks", "gqa-decode-sinks",           # the group
                 "decode-8k", "gqa-decode-f32", "decode-int8", "prefill"):     # their twins
        assert want in ids
    assert "long" not in ids and "bwd-prefill" not in ids
    # not in the default run (extra), and an unknown group is refused
    assert "decode-u4" not in [c["id"] for c in compare.selected(compare.parse_args([]))]
    with pytest.raises(SystemExit):
        compare.parse_args(["--group", "nope"])


def test_a_case_fastattn_cannot_take_shows_dashes_and_the_reason(compare, capsys):
    """A QuantizedKV case before the kernels take one: the child reports
    'unsupported'; the tables show '--' and the notes the reason, nothing fails."""
    case = next(c for c in compare.H.KV_CASES if c["id"] == "decode-u4")
    twin = next(c for c in compare.H.STORAGE_CASES if c["id"] == case["twin"])
    res = _results([3.0], [1.0])
    why = "fastattn.attention does not take this cache yet (TypeError: k: ...)"
    res["cases"] = [
        {"case": twin, "describe": compare.H.describe(twin), "numpy_skipped": None,
         "runs": {"fastattn": [{"seconds": 0.004, "max_err": 1e-7}], "torch": [{"seconds": 0.01}]}},
        {"case": case, "describe": compare.H.describe(case), "numpy_skipped": "storage",
         "runs": {"fastattn": [{"unsupported": why}], "torch": [{"seconds": 0.02, "max_err": 1e-7}]},
         "unsupported": {"fastattn": why}},
    ]
    ceil, rows = compare.summarize(res)
    compare.print_report(res, ceil, rows)
    out = capsys.readouterr().out
    assert _table_row(out, "decode-u4")["fastattn"] == "--"
    assert f"decode-u4: fastattn --: {why}" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("| decode-u4 | QuantizedKV 4 bits, G 32 |"))
    assert "twin / case ≥ 6.00" in line


def test_kv_cases_inputs_and_float64_check(compare):
    """The harness's inputs of the new formats at a tiny size: QuantizedKV fields
    as quantize_kv makes them, float8 cast, sinks; torch's dequantize-then-SDPA
    and the float64 check agree (torch only when installed)."""
    import numpy as np
    H = compare.H
    for cid in ("decode-u4", "gqa-decode-u8", "decode-f8e5", "decode-sinks"):
        case = dict(next(c for c in H.KV_CASES if c["id"] == cid), Lk=64)
        inputs = H.make_inputs(case, np)
        if H._KV.is_quantized(case):
            bits = H._KV.QUANTIZED[case["kv_dtype"]]
            assert inputs["k"].dtype == np.uint8
            assert inputs["k"].shape[-1] == case["D"] * bits // 8
            assert inputs["k_qscale"].shape[-1] == case["D"] // case["group_size"]
        # stored bytes per key row of D 128: codes, then 4-byte scale and zero per group
        row = {"decode-u4": 64 + 8 * 4, "gqa-decode-u8": 128 + 8, "decode-f8e5": 128, "decode-sinks": 4 * 128}[cid]
        assert H.kv_bytes(case) == 64 * case["Hkv"] * 2 * row
        if H.library_available("torch"):
            import torch
            grad, threads = torch.is_grad_enabled(), torch.get_num_threads()
            try:           # the runner sets torch's global grad mode and threads: restored after
                fn, _ = H.RUNNERS["torch"](case, inputs, 1, np)
                err = H.check_against_float64(case, inputs, fn(), np)
            finally:
                torch.set_grad_enabled(grad)
                torch.set_num_threads(threads)
            assert err < 1e-5, (cid, err)


@pytest.mark.parametrize("cid", ["decode-u4", "gqa-decode-u8"])
def test_quantized_cases_time_the_kernels_once_they_take_a_quantizedkv(compare, monkeypatch, cid):
    """The same case, unchanged, once fastattn.attention takes a QuantizedKV
    (simulated: dequantize, then the float32 kernels): a time and a float64
    check instead of '--'; and '--' with the TypeError's reason today."""
    import numpy as np
    fastattn = pytest.importorskip("fastattn")
    H = compare.H
    case = dict(next(c for c in H.KV_CASES if c["id"] == cid), Lk=64)
    real = fastattn.attention

    def taking(q, k, v, **kw):
        deq = [x.dequantize() if isinstance(x, fastattn.QuantizedKV) else x for x in (k, v)]
        return real(q, *deq, **kw)
    monkeypatch.setattr(fastattn, "attention", taking)
    r = compare.P.child_main("fastattn", case, 1, 0.01, True)
    assert "unsupported" not in r and r["seconds"] > 0
    assert r["max_err"] < 1e-5           # against the float64 attention over the codes' values
    monkeypatch.setattr(fastattn, "attention", lambda *a, **k: (_ for _ in ()).throw(TypeError("k: no")))
    r = compare.P.child_main("fastattn", case, 1, 0.01, True)
    assert r["unsupported"].endswith("(TypeError: k: no)") and "seconds" not in r
    # a TypeError on any other case is a failure, not "unsupported"
    with pytest.raises(TypeError):
        compare.P.child_main("fastattn", dict(next(c for c in H.KV_CASES if c["id"] == "decode-f8e4"), Lk=64),
                             1, 0.01, True)


def test_decode_read_ceiling_includes_the_readings_after_its_runs(compare):
    # a decode case of 64 MiB that ran at 40 GB/s: the run's spread readings were
    # taken in a slow phase (30 GB/s: 133 %), the loop right after each fastattn run
    # read 45 and 50 GB/s -> 40 / 50 = 80 %
    res = _results([2.0], [1.0])
    case = dict(res["cases"][0]["case"], id="decode", Lq=1, Hq=32, Hkv=32, Lk=4096, D=128, Dv=128,
                decode=True)
    nbytes = compare.ceiling_bytes(case)
    assert nbytes == 2 * 32 * 4096 * 128 * 4
    t = nbytes / 40e9
    res["cases"][0]["case"] = case
    res["cases"][0]["runs"]["fastattn"] = [{"seconds": t, "read_after_gbs": 45.0},
                                           {"seconds": t, "read_after_gbs": 50.0}, {"seconds": t}]
    res["ceilings"] = [{"read_ceiling_gbs": {str(nbytes): 30.0}}]
    _, rows = compare.summarize(res)
    assert rows[0]["gbs"] == pytest.approx(40.0)
    assert rows[0]["pct_bw"] == pytest.approx(80.0)
    # no readings after the runs (an older JSON): the run's best reading alone
    for r in res["cases"][0]["runs"]["fastattn"]:
        r.pop("read_after_gbs", None)
    _, rows = compare.summarize(res)
    assert rows[0]["pct_bw"] == pytest.approx(100 * 40.0 / 30.0)
    assert compare.case_read_ceiling(None, []) is None
