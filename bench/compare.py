#!/usr/bin/env python
"""Side-by-side speed of fastattn, torch, NumPy, OpenVINO, ONNX Runtime and JAX.

Each library runs each case in its own fresh Python process (two OpenMP
runtimes in one process disturb each other), the order of the libraries
rotates from one repeat to the next, every child warms up before timing, and
the figures are medians.  The box's ceilings are measured in the same run with
the same thread count (best of several readings, spread over the run):
fastattn's compiled FMA-peak loop (GFLOP/s) and multi-stream read loop over the
bytes each memory-bound case reads (GB/s), so that no kernel figure can exceed
100 %; NumPy's float32 matmul and reductions are shown beside them.

    python bench/compare.py                      # all cases, 2 threads, 3 repeats
    python bench/compare.py --quick --cases prefill,decode
    python bench/compare.py --threads 1 --json out.json --plot out.png
    python bench/compare.py --peers jax --cases prefill   # one peer only
    python bench/compare.py --from-json out.json      # the table of a saved run again
    python bench/compare.py --group kv                # float8 / QuantizedKV caches and sinks (issue 34)

torch and the peers (bench/peers.py: OpenVINO, ONNX Runtime, JAX) are optional;
a library that is not importable gets a note instead of a column of times, and
a case a peer cannot express gets "--" with the reason.  Every output is checked
against float64 and every peer's against fastattn's own.  The NumPy column is
the naive ``softmax(q @ kᵀ / √d) @ v`` in the input dtype, the baseline every
NumPy user has; for the softmax case it is ``scipy.special.softmax``.
"""
import argparse
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, path):
    # Loaded by path rather than imported: ``import fastattn._bench`` would run
    # the package's __init__, which needs the compiled kernels, and the NumPy
    # and torch columns must work before they are built.
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


HERE = os.path.dirname(os.path.abspath(__file__))
P = _load("fastattn_bench_peers", os.path.join(HERE, "peers.py"))
H = P.H                      # fastattn/_bench.py, loaded once by peers.py
CASES = (H.STANDARD_CASES + H.EXTRA_CASES + H.STORAGE_CASES + H.KV_CASES + H.ACCURACY_CASES
         + H.BACKWARD_CASES + H.SERVING_CASES)
CASE_IDS = [c["id"] for c in CASES]
GROUPS = sorted({c["group"] for c in CASES if c.get("group")})


def machine_info():
    """CPU model, cores and library versions (versions read without importing)."""
    from importlib import metadata
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    versions = {}
    for lib in ("numpy", "scipy", "torch", "openvino", "onnxruntime", "jax", "onnx"):
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return {"cpu": model, "logical_cpus": os.cpu_count(), "usable_cpus": usable,
            "python": platform.python_version(), "platform": platform.platform(), **versions}


def libraries_for(case, skip_numpy):
    if case["kind"] in H.SERVING_KINDS:     # fastattn's baselines are cases of their own
        return ["fastattn"] if case.get("no_torch") else ["fastattn", "torch"]
    libs = list(H.SOFTMAX_LIBS if case["kind"] == "softmax" else H.ATTENTION_LIBS)
    if skip_numpy and "numpy" in libs:
        libs.remove("numpy")
    return libs


def numpy_skip_reason(case, args):
    if case["kind"] in H.SERVING_KINDS:
        return "numpy skipped: a serving case (compared with fastattn's own baseline and torch)"
    if case["kind"] != "attention":
        return None
    if case.get("kv_dtype"):
        return "numpy skipped: a storage-type case (the naive baseline has no such cache)"
    if case.get("sinks"):
        return "numpy skipped: sinks (the naive baseline has none)"
    if args.skip_slow_numpy and case.get("slow_numpy"):
        return "numpy skipped (--skip-slow-numpy)"
    need = 2 * H.numpy_scores_bytes(case)
    if need > args.numpy_max_gib * 2**30:
        return f"numpy skipped: needs ~{need / 2**30:.1f} GiB (> --numpy-max-gib)"
    return None


def log(msg):
    print(msg, file=sys.stderr, flush=True)


ceiling_bytes = P.ceiling_bytes


def peers_for(case, args, available):
    """(peers that run ``case``, {peer: why not} for the others)."""
    run, why = [], {}
    for lib in args.peers:
        if not available.get(lib):
            why[lib] = "not importable"
            continue
        reason = P.unsupported(lib, case)
        if reason:
            why[lib] = reason
        else:
            run.append(lib)
    return run, why


def selected(args):
    """The cases a run measures: --cases and --group (either or both), else the
    standard ones (and the extra ones with --extra); a serving case brings its
    baseline, a storage or sinks case its float32 (and int8) twin."""
    if args.cases or args.group:
        cases = [c for c in CASES if c["id"] in (args.cases or ()) or c.get("group") in (args.group or ())]
    else:
        cases = [c for c in CASES if not c.get("extra") or args.extra]
    wanted = {c["id"] for c in cases}
    for key in ("baseline", "twin", "int8_twin"):
        wanted |= {c[key] for c in cases if c.get(key)}
    return [c for c in CASES if c["id"] in wanted]


def run(args):
    cases = selected(args)
    # The fastattn children import the in-place build of this checkout unless
    # --installed asks for the one on sys.path.
    path = () if args.installed else (REPO,)
    available = {lib: H.library_available(lib) for lib in ("torch", "numpy", "scipy") + P.PEERS}
    fa_error = H.import_error("from fastattn import attention, softmax, set_num_threads", path)
    available["fastattn"] = fa_error is None
    for lib, ok in available.items():
        if not ok and (lib not in P.PEERS or lib in args.peers):
            log(f"{lib} is not importable" + (f" ({fa_error})" if lib == "fastattn" else "")
                + ": its column stays empty")
    results = {"machine": machine_info(), "threads": args.threads, "repeats": args.repeats,
               "min_time": args.min_time, "available": available, "peers": list(args.peers),
               "ceilings": [], "cases": [], "loadavg_start": _loadavg()}
    read_bytes = sorted({n for n in map(ceiling_bytes, cases) if n})
    dump_dir = tempfile.mkdtemp(prefix="fastattn-compare-")
    try:
        _run_cases(args, cases, path, available, results, read_bytes, dump_dir)
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)

    # The ceilings are measured `repeats` times spread over the run (the box's
    # load changes while it runs); the table uses the best of them.
    # Thread scaling of prefill (and of the one-head backward when it runs): 1
    # thread against --threads, in alternating processes, the ratio taken pair
    # by pair (the box's speed drifts).
    for case_id, key in (("prefill", "scaling"), ("bwd-1head", "scaling_bwd_1head")):
        case = next((c for c in cases if c["id"] == case_id), None)
        if case is not None and args.threads > 1 and available["fastattn"]:
            results[key] = _scaling_pairs(case, args, path)
    results["loadavg_end"] = _loadavg()
    return results


def _run_cases(args, cases, path, available, results, read_bytes, dump_dir):
    # The ceilings are measured `repeats` times spread over the run (the box's
    # load changes while it runs); the table uses the best of them.
    ceiling_before = {round(i * len(cases) / args.repeats) for i in range(args.repeats)}
    for ci, case in enumerate(cases):
        if ci in ceiling_before:
            results["ceilings"].append(_measure_ceilings(args, path, read_bytes, len(results["ceilings"]),
                                                         len(ceiling_before)))
        skip = numpy_skip_reason(case, args)
        peers, no_peer = peers_for(case, args, available)
        libs = [lib for lib in libraries_for(case, skip is not None) if available[lib]] + peers
        runs = {lib: [] for lib in libs}
        dumps = {}
        for rep in range(args.repeats):
            order = libs[rep % len(libs):] + libs[:rep % len(libs)]   # rotate per repeat
            for lib in order:
                if lib in no_peer:       # fastattn said "unsupported" on the first repeat
                    continue
                log(f"[{ci + 1}/{len(cases)}] {case['id']} {lib} (repeat {rep + 1}/{args.repeats}) ...")
                dump = os.path.join(dump_dir, f"{ci}-{lib}.npy") if rep == 0 else None
                r = P.run_child(lib, case, args.threads, min_time=args.min_time,
                                pythonpath=path, timeout=args.timeout, dump=dump)
                if "error" in r:
                    log(f"  failed: {r['error']}")
                elif "unsupported" in r:
                    log(f"  -- {r['unsupported']}")
                    no_peer.setdefault(lib, r["unsupported"])
                else:
                    dumps.setdefault(lib, dump)
                    err = f", max err {r['max_err']:.1e}" if r.get("max_err") is not None else ""
                    mem = (f", extra memory {r['extra_bytes'] / 2**20:.1f} MiB"
                           if r.get("extra_bytes") is not None else "")
                    log(f"  {H.fmt_time(r['seconds'])}{err}{mem}")
                runs[lib].append(r)
        # every output against fastattn's on the same inputs (the slice of the float64 check)
        vs_fa = {lib: P.max_diff(d, dumps.get("fastattn")) for lib, d in dumps.items() if lib != "fastattn"}
        results["cases"].append({"case": case, "describe": H.describe(case), "numpy_skipped": skip,
                                 "runs": runs, "unsupported": no_peer,
                                 "vs_fastattn": {k: v for k, v in vs_fa.items() if v is not None}})


def _measure_ceilings(args, path, read_bytes, i, n):
    log(f"[ceilings] {i + 1}/{n} ...")
    r = P.run_child("ceilings", {"read_bytes": read_bytes}, args.threads, min_time=args.min_time,
                    pythonpath=path, timeout=args.timeout)
    if "error" in r:
        log(f"  ceilings failed: {r['error']}")
        return r
    log(f"  NumPy: matmul {r['matmul_gflops']:.0f} GFLOP/s, read {r['read_gbs']:.1f} GB/s "
        f"(np.sum alone {r['read_sum_gbs']:.1f})")
    if r.get("compiled_error"):
        log(f"  no compiled ceilings (fastattn not importable: {r['compiled_error']})")
    elif r.get("fma_gflops"):
        reads = ", ".join(f"{int(k) / 2**20:.1f} MiB {v:.1f}" for k, v in r.get("read_ceiling_gbs", {}).items())
        log(f"  {r['variant']}: FMA peak {r['fma_gflops']:.0f} GFLOP/s (float64 {r['fma_f64_gflops']:.0f}"
            + (f", bfloat16 {'tiles' if r.get('bf16_tiles') else 'dots'} {r['bf16_dot_gflops']:.0f}"
               if r.get("bf16_dot_gflops") else "")
            + f"); read GB/s: {reads or '(no memory-bound case)'}")
    return r
def _scaling_pairs(case, args, path):
    pairs = []
    for rep in range(args.repeats):
        log(f"[scaling] {case['id']} 1 vs {args.threads} threads (repeat {rep + 1}/{args.repeats}) ...")
        one = H.run_child("fastattn", case, 1, min_time=args.min_time, pythonpath=path,
                          timeout=args.timeout)
        many = H.run_child("fastattn", case, args.threads, min_time=args.min_time,
                           pythonpath=path, timeout=args.timeout)
        if "error" in one or "error" in many:
            log(f"  failed: {one.get('error') or many.get('error')}")
            continue
        pairs.append({"one": one["seconds"], "many": many["seconds"]})
    return pairs


def _loadavg():
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _median_of(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None and "error" not in r]
    return H._median(vals) if vals else None


def _paired_ratio(num_runs, den_runs):
    """Median over repeats of num[i] / den[i]: the two processes of repeat i ran
    back to back, so the ratio of each pair is taken before the median (on a box
    whose speed drifts, more stable than the ratio of the two medians).  Repeats
    where either failed are left out; None when no pair is left."""
    if not num_runs or not den_runs:
        return None
    ratios = [a["seconds"] / b["seconds"] for a, b in zip(num_runs, den_runs)
              if "error" not in a and "error" not in b and a.get("seconds") and b.get("seconds")]
    return H._median(ratios) if ratios else None


READ_SPREAD_WARN = 1.25


def _read_ceiling_readings(readings):
    """{bytes: [GB/s of each reading]} of the compiled read ceiling over the run."""
    seen = {}
    for r in readings:
        for n, gbs in (r.get("read_ceiling_gbs") or {}).items():
            seen.setdefault(int(n), []).append(gbs)
    return seen


def read_ceiling_spread(readings):
    """{bytes: (lowest, highest) GB/s} of the read ceiling over the run's readings,
    for each size read more than once."""
    return {n: (min(v), max(v)) for n, v in _read_ceiling_readings(readings).items() if len(v) > 1}


def best_ceilings(readings):
    """The best of each ceiling over the run's readings (None where never measured):
    NumPy's matmul_gflops and read_gbs, the compiled fma_gflops, fma_f64_gflops,
    bf16_dot_gflops and read_ceiling_gbs ({bytes: GB/s})."""
    ceil = {k: max((r[k] for r in readings if r.get(k)), default=None)
            for k in ("matmul_gflops", "read_gbs", "fma_gflops", "fma_f64_gflops", "bf16_dot_gflops")}
    ceil["read_ceiling_gbs"] = {n: max(v) for n, v in _read_ceiling_readings(readings).items()}
    ceil["bf16_tiles"] = any(r.get("bf16_tiles") for r in readings)
    return ceil


def case_read_ceiling(best, fastattn_runs):
    """A memory-bound case's read ceiling: the best of the run's readings over its
    bytes (``best``) and of the readings taken right after each of its fastattn
    runs, in that run's process (``read_after_gbs``): on a VM the memory system
    moves by a quarter or more within minutes, and a reading taken apart from the
    case can be slower than the case itself was (decode-1head read 107 % of such a
    ceiling; back to back, 84-90 %)."""
    after = [r["read_after_gbs"] for r in fastattn_runs or () if r.get("read_after_gbs")]
    return max([best] + after if best else after, default=None)


def compute_peak(case, ceil):
    """The GFLOP/s ceiling of a case: the float64 FMA peak for float64, the faster of
    the float32 FMA and the bfloat16 peak (pair dots, or AMX tiles) where q and k are bfloat16 (each
    flop runs on one or the other: the faster bounds both), else the float32 FMA peak."""
    if case["dtype"] == "float64":
        return ceil.get("fma_f64_gflops")
    peak = ceil.get("fma_gflops")
    if case.get("kv_dtype") == "bfloat16" and case.get("q_dtype") == "bfloat16" and ceil.get("bf16_dot_gflops"):
        peak = max(peak or 0.0, ceil["bf16_dot_gflops"])
    return peak


def summarize(results):
    """Per case: median seconds per library and the derived rates."""
    ceil = best_ceilings(results["ceilings"])
    rows = []
    for entry in results["cases"]:
        case, runs = entry["case"], entry["runs"]
        t = {lib: _median_of(rs, "seconds") for lib, rs in runs.items()}
        errs = {lib: [r["error"] for r in rs if "error" in r] for lib, rs in runs.items()}
        row = {"id": case["id"], "describe": entry["describe"], "case": case, "t": t,
               "errors": {k: v[0] for k, v in errs.items() if v},
               "max_err": {lib: max((r["max_err"] for r in rs if r.get("max_err") is not None),
                                    default=None) for lib, rs in runs.items()},
               "extra_bytes": {lib: _median_of(rs, "extra_bytes") for lib, rs in runs.items()},
               "numpy_skipped": entry["numpy_skipped"],
               "rms_err": {lib: _median_of(rs, "rms_err") for lib, rs in runs.items()}}
        row["paired"] = _paired_ratio(runs.get("torch"), runs.get("fastattn"))
        row["unsupported"] = entry.get("unsupported", {})
        row["vs_fastattn"] = entry.get("vs_fastattn", {})
        fa = t.get("fastattn")
        row["ratios"] = {lib: t[lib] / fa for lib in t if lib != "fastattn" and t[lib] and fa}
        if case["kind"] in ("attention",) + H.SERVING_KINDS:
            row["gflops"] = H.attention_flops(case) / fa / 1e9 if fa else None
            peak = compute_peak(case, ceil)
            row["pct_peak"] = 100 * row["gflops"] / peak if fa and peak else None
        nbytes = ceiling_bytes(case)
        if nbytes and fa:
            row["gbs"] = nbytes / fa / 1e9
            read = case_read_ceiling(ceil["read_ceiling_gbs"].get(nbytes), runs.get("fastattn"))
            row["pct_bw"] = 100 * row["gbs"] / read if read else None
        rows.append(row)
    by_id = {r["id"]: r for r in rows}
    for r in rows:            # a serving case against fastattn's own baseline (its own case)
        base = by_id.get(r["case"].get("baseline"))
        bt, fa = base and base["t"].get("fastattn"), r["t"].get("fastattn")
        if bt and fa:
            r["ratios"]["baseline"] = bt / fa
    return ceil, rows


def _fmt(x, spec, suffix=""):
    return "—" if x is None else format(x, spec) + suffix


def _time_cell(row, lib, available):
    if not available[lib]:
        return "not installed" if lib == "torch" else "not importable"
    if lib in row.get("unsupported", {}) and row["t"].get(lib) is None:
        return "--"
    if lib in row["errors"] and row["t"].get(lib) is None:
        return "failed"
    if lib == "numpy" and row["numpy_skipped"]:
        return "skipped"
    t = row["t"].get(lib)
    if t is None:
        return "—"
    if row["id"] == "tiny":
        return f"{t * 1e6:.2f} µs"
    return H.fmt_time(t)


def print_report(results, ceil, rows, out=None):
    out = sys.stdout if out is None else out     # looked up per call, not at import
    m, avail = results["machine"], results["available"]
    p = lambda *a: print(*a, file=out)
    p(f"## fastattn side by side — {results['threads']} thread(s), "
      f"median of {results['repeats']} process(es) per library\n")
    p(f"- CPU: {m['cpu']} ({m['logical_cpus']} logical CPUs, {m['usable_cpus']} usable); "
      f"Python {m['python']}; {m['platform']}")
    fa_ver = next((r.get("version") for e in results["cases"] for r in e["runs"].get("fastattn", [])
                   if r.get("version")), None)
    p(f"- numpy {m['numpy']}, scipy {m['scipy'] or 'not installed'}, "
      f"torch {m['torch'] or 'not installed (torch column empty)'}, fastattn {fa_ver or 'not importable'}")
    peers = [lib for lib in results.get("peers", []) if avail.get(lib)]
    if results.get("peers"):
        p("- peers: " + ", ".join(f"{P.LABELS[lib]} {m.get(lib) or '?'}" if avail.get(lib)
                                  else f"{P.LABELS[lib]} not importable" for lib in results["peers"])
          + " (bench/peers.py: each in its own process, same threads)")
    cfg = next((r.get("config") for e in results["cases"] for r in e["runs"].get("fastattn", [])
                if r.get("config")), None)
    if cfg:
        p("- fastattn config: " + " | ".join(ln.strip() for ln in cfg.strip().splitlines()[:6]))
    start, end = results.get("loadavg_start"), results.get("loadavg_end")
    if start is not None:
        busy = start > 0.5
        p(f"- load average (1 min) before / after the run: {start:.2f} / {_fmt(end, '.2f')}"
          + (" — other work was running: absolute times are noisy, trust the ratios more"
             if busy else ""))
    variant = next((r.get("variant") for r in results["ceilings"] if r.get("variant")), None)
    p(f"- ceilings, best of {len(results['ceilings'])} readings spread over the run, {results['threads']} "
      f"thread(s), fastattn's compiled loops ({variant or 'not measured'}): FMA peak "
      f"{_fmt(ceil['fma_gflops'], '.0f')} GFLOP/s float32, {_fmt(ceil['fma_f64_gflops'], '.0f')} float64"
      + (f", {ceil['bf16_dot_gflops']:.0f} bfloat16 {'AMX tiles' if ceil.get('bf16_tiles') else 'pair dots'}"
         if ceil.get("bf16_dot_gflops") else "")
      + "; read " + (", ".join(f"{n / 2**20:.1f} MiB {g:.1f} GB/s" for n, g in sorted(ceil["read_ceiling_gbs"].items()))
                     or "—"))
    p(f"- NumPy beside them: float32 matmul 2048³ {_fmt(ceil['matmul_gflops'], '.0f')} GFLOP/s, "
      f"reductions {_fmt(ceil['read_gbs'], '.1f')} GB/s (256 MiB float32, faster of np.max and "
      f"np.sum, one chunk per thread)")
    mm = sorted(r["matmul_gflops"] for r in results["ceilings"] if r.get("matmul_gflops"))
    if len(mm) > 1:
        # the percentages use the best reading; the median says how far the box moved
        p(f"- matmul ceiling readings: {mm[0]:.0f}-{mm[-1]:.0f} GFLOP/s, median "
          f"{mm[len(mm) // 2]:.0f}")
    spread = read_ceiling_spread(results["ceilings"])
    if spread:
        # a read loop whose bytes a shared cache holds at one reading and not at the next
        # (a VM's neighbours): its best reading can be twice its worst
        p("- read ceiling readings: " + ", ".join(f"{n / 2**20:.1f} MiB {lo:.1f}-{hi:.1f} GB/s"
                                                  for n, (lo, hi) in sorted(spread.items()))
          + (" — the read loop moved by more than a quarter between readings (part of its bytes "
             "served from a cache at some readings and not at others): % read ceiling is against "
             "the best reading; trust the time ratios more"
             if any(hi > READ_SPREAD_WARN * lo for lo, hi in spread.values()) else ""))
    p("")
    p("| case | shape | fastattn | torch | numpy | torch / fastattn | paired | numpy / fastattn "
      "| fastattn GFLOP/s | % FMA peak | GB/s | % read ceiling | max err fastattn |")
    p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for r in rows:
        fa, tt, nn = (r["t"].get(k) for k in ("fastattn", "torch", "numpy"))
        if r["case"]["kind"] == "softmax":
            nn = r["t"].get("scipy")
        label = r["id"] + (" (extra)" if r["case"].get("extra") else "")
        numpy_cell = (_time_cell(r, "scipy", avail) + " (scipy)" if r["case"]["kind"] == "softmax"
                      else _time_cell(r, "numpy", avail))
        p(f"| {label} | {r['describe']} | {_time_cell(r, 'fastattn', avail)} | "
          f"{_time_cell(r, 'torch', avail)} | {numpy_cell} | "
          f"{_fmt(tt / fa if tt and fa else None, '.2f', '×')} | "
          f"{_fmt(r.get('paired'), '.2f', '×')} | "
          f"{_fmt(nn / fa if nn and fa else None, '.1f', '×')} | "
          f"{_fmt(r.get('gflops'), '.1f')} | {_fmt(r.get('pct_peak'), '.0f', '%')} | "
          f"{_fmt(r.get('gbs'), '.1f')} | {_fmt(r.get('pct_bw'), '.0f', '%')} | "
          f"{_fmt(r['max_err'].get('fastattn'), '.1e')} |")
        if r["case"].get("note"):
            notes.append(f"{r['id']}: {r['case']['note']}")
        if r["numpy_skipped"]:
            notes.append(f"{r['id']}: {r['numpy_skipped']}")
        if r["t"].get("fastattn") is None and "fastattn" in r["unsupported"]:
            notes.append(f"{r['id']}: fastattn --: {r['unsupported']['fastattn']}")
        for lib, e in r["errors"].items():
            notes.append(f"{r['id']}: {lib} failed: {e}")
        for key in ("pct_peak", "pct_bw"):
            if (r.get(key) or 0) > 100:
                notes.append(f"{r['id']}: {r[key]:.0f} % of a ceiling: that ceiling reading is wrong "
                             "(measured while the box was busy?) -- rerun on a quiet machine")
    if results.get("peers"):
        notes += _print_peers(results, rows, peers, p)
    for key, what in (("scaling", "prefill"), ("scaling_bwd_1head", "bwd-1head")):
        pairs = results.get(key)
        if pairs:
            one = H._median([q["one"] for q in pairs])
            many = H._median([q["many"] for q in pairs])
            ratio = H._median([q["one"] / q["many"] for q in pairs])
            p(f"\nThread scaling, {what}: 1 thread {H.fmt_time(one)}, {results['threads']} threads "
              f"{H.fmt_time(many)}: {ratio:.2f}× (median of {len(pairs)} alternating pairs)")
    acc = [r for r in rows if r["rms_err"].get("fastattn") is not None and r["rms_err"].get("torch") is not None]
    if acc:
        p("\nAccuracy: relative RMS error against the float64 computation on the same inputs (a "
          "slice of rows of two heads):\n")
        p("| case | dtype | fastattn | torch | fastattn / torch |")
        p("|---|---|---:|---:|---:|")
        for r in acc:
            fe, te = r["rms_err"]["fastattn"], r["rms_err"]["torch"]
            p(f"| {r['id']} | {r['case'].get('kv_dtype') or r['case']['dtype']} | {fe:.2e} | {te:.2e} | "
              f"{_fmt(fe / te if te else None, '.2f')} |")
    by_id = {r["id"]: r for r in rows}     # a case's float32 twin or serving baseline
    twins = [r for r in rows if r["case"].get("twin") and not r["case"].get("sinks")]
    if twins:
        p("\nStorage types against fastattn's own float32 on the same shape (bandwidth counted in "
          "stored bytes):\n")
        p("| case | stored as | fastattn | float32 twin | twin / case | int8 / case | targets | GB/s stored "
          "| % read ceiling |")
        p("|---|---|---:|---:|---:|---:|---|---:|---:|")
        for r in twins:
            fa = r["t"].get("fastattn")
            tw, i8 = (by_id[r["case"][key]]["t"].get("fastattn") if r["case"].get(key) in by_id else None
                      for key in ("twin", "int8_twin"))
            tg = r["case"].get("targets", {})
            targets = ", ".join(f"{'twin' if k == 'twin' else k} / case ≥ {v:.2f}" for k, v in tg.items())
            p(f"| {r['id']} | {H._KV.stored_as(r['case'])} | {_time_cell(r, 'fastattn', avail)} | "
              f"{H.fmt_time(tw) if tw else '—'} | {_fmt(tw / fa if tw and fa else None, '.2f', '×')} | "
              f"{_fmt(i8 / fa if i8 and fa else None, '.2f', '×')} | {targets or '—'} | "
              f"{_fmt(r.get('gbs'), '.1f')} | {_fmt(r.get('pct_bw'), '.0f', '%')} |")
    sinks = [r for r in rows if r["case"].get("sinks") and r["case"].get("twin")]
    if sinks:
        p("\nSinks cost: the same call with and without sinks= (target: at most 3 % slower):\n")
        p("| case | fastattn | without sinks | case / without | cost |")
        p("|---|---:|---:|---:|---:|")
        for r in sinks:
            fa = r["t"].get("fastattn")
            tw = by_id[r["case"]["twin"]]["t"].get("fastattn") if r["case"]["twin"] in by_id else None
            p(f"| {r['id']} | {_time_cell(r, 'fastattn', avail)} | {H.fmt_time(tw) if tw else '—'} | "
              f"{_fmt(fa / tw if tw and fa else None, '.3f', '×')} | "
              f"{_fmt(100 * (fa / tw - 1) if tw and fa else None, '+.1f', ' %')} |")
    serving = [r for r in rows if r["case"].get("baseline")]
    if serving:
        p("\nServing cases against fastattn's own baseline and torch (targets: baseline / case and torch / case "
          "at least):\n")
        p("| case | fastattn | baseline | baseline time | baseline / case | target | torch / case | target |")
        p("|---|---:|---|---:|---:|---:|---:|---:|")
        for r in serving:
            base = by_id.get(r["case"]["baseline"])
            fa, bt = r["t"].get("fastattn"), base["t"].get("fastattn") if base else None
            tt = r["t"].get("torch")
            tg = r["case"].get("targets", {})
            p(f"| {r['id']} | {_time_cell(r, 'fastattn', avail)} | {r['case']['baseline']} | "
              f"{H.fmt_time(bt) if bt else '—'} | {_fmt(bt / fa if bt and fa else None, '.2f', '×')} | "
              f"{_fmt(tg.get('baseline'), '.2f', '×')} | {_fmt(tt / fa if tt and fa else None, '.2f', '×')} | "
              f"{_fmt(tg.get('torch'), '.2f', '×')} |")
    mem_rows = [r for r in rows if r["case"].get("memory")]
    if mem_rows:
        p("\nPeak memory beyond inputs and output (one call, VmHWM after a reset):\n")
        p("| case | fastattn | torch | numpy |")
        p("|---|---:|---:|---:|")
        for r in mem_rows:
            cells = [_fmt(None if r["extra_bytes"].get(lib) is None else r["extra_bytes"][lib] / 2**20,
                          ".1f", " MiB") for lib in ("fastattn", "torch", "numpy")]
            p(f"| {r['id']} | " + " | ".join(cells) + " |")
    p("\nFLOPs = 2·(Dk+Dv)·H·(visible query-key pairs): half for causal, the window band for "
      "window, valid keys for kv_lengths; a random mask counts every pair. GB/s: K+V read once "
      "(decode cases), read+write (softmax; fastattn and ONNX Runtime write the softmax into one "
      "preallocated output, the others allocate theirs). % FMA peak: of the compiled FMA loop of the case's "
      "compute type; % read ceiling: of the compiled read loop over the same bytes, the best of its "
      "readings spread over the run and those taken right after each fastattn run of the case. max err: largest "
      "|fastattn − float64| on a slice. paired: median over repeats of torch / fastattn of the two "
      "processes of one repeat.")
    for n in notes:
        p(f"- {n}")


# below this |peer - float64| a peer is right (the check is on the case's output dtype)
_WRONG_AT = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 8e-2, "int8": 1e-4}


def peer_is_wrong(row, lib):
    """True when ``lib``'s output on the row's case is far from float64: its times
    compare nothing (a peer that computes something else is not a comparison)."""
    err = row["max_err"].get(lib)
    case = row["case"]
    dtype = case.get("q_dtype") or case["dtype"]
    if case.get("kv_dtype") in ("float16", "bfloat16"):
        dtype = case["kv_dtype"]
    fa = row["max_err"].get("fastattn") or 0.0
    return err is not None and err > max(_WRONG_AT.get(dtype, 1e-4), 20 * fa)


def _peer_cell(row, lib, avail):
    if not avail.get(lib):
        return "not importable"
    if lib in row["unsupported"]:
        return "--"
    if lib in row["errors"] and row["t"].get(lib) is None:
        return "failed"
    t, ratio = row["t"].get(lib), row["ratios"].get(lib)
    if t is None:
        return "—"
    flag = " (!)" if peer_is_wrong(row, lib) else ""
    return f"{H.fmt_time(t)} ({ratio:.2f}×){flag}" if ratio else H.fmt_time(t) + flag


def _print_peers(results, rows, peers, p):
    """The peers table (time and peer time / fastattn time), their agreement with
    fastattn and float64; returns notes (reasons for "--", wrong peers)."""
    avail = results["available"]
    libs = ["torch"] + list(results["peers"])
    names = [P.LABELS[lib] for lib in libs]
    p("\nEvery peer beside fastattn (time, and in brackets peer time / fastattn time: above 1, "
      "fastattn is faster; --: the peer cannot express the case, see the notes):\n")
    p("| case | fastattn | " + " | ".join(names) + " | fastest peer / fastattn |")
    p("|---|---:|" + "---:|" * len(libs) + "---:|")
    notes = []
    reasons = {}
    for r in rows:
        right = [r["ratios"][lib] for lib in libs if lib in r["ratios"] and not peer_is_wrong(r, lib)]
        p(f"| {r['id']} | {_time_cell(r, 'fastattn', avail)} | "
          + " | ".join(_peer_cell(r, lib, avail) for lib in libs)
          + f" | {_fmt(min(right) if right else None, '.2f', '×')} |")
        for lib, why in r["unsupported"].items():
            if why != "not importable" and lib in libs:
                reasons.setdefault((lib, why), []).append(r["id"])
        for lib in libs:
            if lib in r["t"] and peer_is_wrong(r, lib):
                notes.append(f"{r['id']}: {P.LABELS[lib]} is wrong (max |out − float64| "
                             f"{r['max_err'][lib]:.1e}): its time compares nothing")
    for (lib, why), ids in reasons.items():
        notes.append(f"{P.LABELS[lib]} -- on {', '.join(ids)}: {why}")
    checked = [r for r in rows if r["vs_fastattn"]]
    if checked:
        p("\nAgreement: max |peer − fastattn| on the checked slice of the same inputs (max |peer − "
          "float64| in brackets; fastattn's own in the first column):\n")
        p("| case | fastattn − float64 | " + " | ".join(names) + " |")
        p("|---|---:|" + "---:|" * len(libs))
        for r in checked:
            cells = []
            for lib in libs:
                d, e = r["vs_fastattn"].get(lib), r["max_err"].get(lib)
                cells.append("—" if d is None else f"{d:.1e} ({_fmt(e, '.1e')})"
                             + (" (!)" if peer_is_wrong(r, lib) else ""))
            p(f"| {r['id']} | {_fmt(r['max_err'].get('fastattn'), '.1e')} | " + " | ".join(cells) + " |")
    return notes


def plot(results, rows, ceil, path):
    """Draw the run (bench/compare_plot.py: panels by family, every peer's ratio)."""
    _load("fastattn_compare_plot", os.path.join(HERE, "compare_plot.py")).plot(results, rows, ceil, path,
                                                                             wrong=peer_is_wrong)
    log(f"plot written to {path}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: " + ", ".join(
                                     c["id"] + (" (extra)" if c.get("extra") else "") for c in CASES))
    ap.add_argument("--threads", type=int, help="threads per library (default 2)")
    ap.add_argument("--cases", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                    help="comma-separated case ids (default: all standard cases)")
    ap.add_argument("--extra", action="store_true", help="also run the extra cases")
    ap.add_argument("--group", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                    help=f"comma-separated groups of cases ({', '.join(GROUPS)}; kv: the float8 / QuantizedKV "
                         "caches and sinks of issue 34 with their float32 and int8 twins), alone or with --cases")
    ap.add_argument("--all", action="store_true", help="standard and extra cases")
    ap.add_argument("--quick", action="store_true",
                    help="1 process per library and shorter timing (a smoke run, noisier)")
    ap.add_argument("--repeats", type=int, help="processes per library and case (default 3)")
    ap.add_argument("--min-time", type=float, help="seconds timed per process (default 0.5)")
    ap.add_argument("--numpy-max-gib", type=float, default=4.0,
                    help="skip the numpy baseline when it needs more memory (default 4)")
    ap.add_argument("--skip-slow-numpy", action="store_true",
                    help="skip the numpy baseline on the big cases (long, decode-1head, memory, window)")
    ap.add_argument("--peers", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                    help=f"comma-separated peers beside torch and numpy (default: {','.join(P.PEERS)}, "
                         "each when importable)")
    ap.add_argument("--no-peers", action="store_true", help="torch and numpy only")
    ap.add_argument("--installed", action="store_true",
                    help="benchmark the fastattn on sys.path instead of this checkout's in-place build")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    ap.add_argument("--json", metavar="FILE", help="write raw results (every sample) as JSON")
    ap.add_argument("--plot", metavar="FILE.png", help="draw the figures (needs matplotlib)")
    ap.add_argument("--from-json", metavar="FILE",
                    help="measure nothing: print the table (and --plot) of a run saved with --json")
    args = ap.parse_args(argv)
    if args.from_json:
        # reprinting measures nothing: options that choose what to measure would be ignored
        given = [opt for opt, val in (("--threads", args.threads), ("--cases", args.cases),
                                      ("--extra", args.extra), ("--all", args.all), ("--quick", args.quick),
                                      ("--group", args.group),
                                      ("--repeats", args.repeats), ("--min-time", args.min_time),
                                      ("--installed", args.installed), ("--json", args.json),
                                      ("--peers", args.peers), ("--no-peers", args.no_peers),
                                      ("--skip-slow-numpy", args.skip_slow_numpy))
                 if val not in (None, False)]
        if given:
            ap.error(f"--from-json reprints a saved run; it takes no {', '.join(given)}")
    if args.threads is None:
        args.threads = 2
    if args.peers is not None:
        unknown = sorted(set(args.peers) - set(P.PEERS))
        if unknown:
            ap.error(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(P.PEERS)}")
        if args.no_peers:
            ap.error("--peers and --no-peers contradict each other")
    args.peers = [] if args.no_peers else list(args.peers if args.peers is not None else P.PEERS)
    if args.group:
        unknown = sorted(set(args.group) - set(GROUPS))
        if unknown:
            ap.error(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    if args.cases:
        unknown = sorted(set(args.cases) - set(CASE_IDS))
        if unknown:
            ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASE_IDS)}")
    args.extra = args.extra or args.all
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.min_time is None:
        args.min_time = 0.15 if args.quick else 0.5
    if args.threads < 1 or args.repeats < 1:
        ap.error("--threads and --repeats must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.plot:  # fail before a long run, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit("--plot needs matplotlib (pip install matplotlib, or the 'plot' extra)")
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
    else:
        results = run(args)
    ceil, rows = summarize(results)
    results["summary"] = [{k: v for k, v in r.items() if k != "case"} for r in rows]
    results["summary_ceilings"] = ceil
    print_report(results, ceil, rows)
    if args.json and not args.from_json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        log(f"raw results written to {args.json}")
    if args.plot:
        plot(results, rows, ceil, args.plot)


if __name__ == "__main__":
    main()
