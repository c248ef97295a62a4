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
