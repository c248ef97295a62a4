"""``fastattn bench``: a quick look at fastattn against NumPy (and torch), honest on a busy machine.

Each library runs in its own long-lived worker process (two OpenMP runtimes in
one process disturb each other; see ``_bench.py``), so a measurement costs no
process start.  The measurements alternate: every repeat times every case once
in each library, the libraries in an order that rotates, and the repeats of one
case are spread over the whole run, so that a burst of other work on the
machine lands in one repeat instead of in one library's column.  Every figure
is the median of its repeats, printed with its spread; a ratio is the median of
the per-repeat ratios of two measurements taken back to back.  A figure whose
repeats disagree by more than ``NOISY_SPREAD`` is marked noisy instead of being
printed as if it could be trusted (a NumPy baseline slowed down in the one call
that was timed once made this command print a 382× speed-up).
"""
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

from . import _bench

# Quartile deviation over the median above which a figure is flagged noisy:
# repeats on an idle machine agree to a few per cent.
NOISY_SPREAD = 0.10
# Involuntary context switches per second and thread above which a measurement
# shared its CPUs with other work (idle: a few; shared: the scheduler tick, 100-1000).
BUSY_PREEMPTIONS = 25.0
# Fewer repeats than this cannot show a spread: their figures count as noisy.
MIN_REPEATS = 3
DEFAULT_REPEATS = 5
DEFAULT_MIN_TIME = 0.1          # seconds timed per measurement
QUICK_CASE_IDS = ("prefill", "causal", "decode", "batch", "tiny", "softmax")
ALL_CASES = _bench.STANDARD_CASES + _bench.EXTRA_CASES


# ---------------------------------------------------------------------------
# Statistics of repeated measurements (pure functions)
# ---------------------------------------------------------------------------

def quartiles(values):
    """Lower quartile, median and upper quartile (linear interpolation, as numpy's default).

    Parameters
    ----------
    values : sequence of float
        At least one value.

    Returns
    -------
    tuple of float
        ``(q1, median, q3)``.

    Examples
    --------
    >>> quartiles([5, 1, 3, 2, 4])
    (2.0, 3.0, 4.0)
    """
    xs = sorted(values)
    if not xs:
        raise ValueError("quartiles() of no values")

    def at(p):
        pos = p * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))

    return at(0.25), at(0.5), at(0.75)


def summarize(values, threshold=NOISY_SPREAD, preemptions=(), busy=BUSY_PREEMPTIONS):
    """Median and spread of the repeats of one figure, and whether to trust it.

    Parameters
    ----------
    values : sequence of float or None
        One value per repeat; None (a failed repeat) and non-positive values are left out.
    threshold : float
        Largest spread of a trustworthy figure.
    preemptions : sequence of float or None
        Involuntary context switches per second and thread while each repeat
        was timed (None where unknown); empty when the platform has no count.
    busy : float
        The rate above which the CPUs were taken by other work.

    Returns
    -------
    dict or None
        None when no value is left; else ``median``, ``spread`` (half the
        interquartile range over the median, None with fewer than
        ``MIN_REPEATS`` values), ``n``, ``noisy`` (the spread is unknown or
        above ``threshold``) and ``busy`` (the median preemption rate is above
        ``busy``: steady figures can still be several times too slow).

    Examples
    --------
    >>> s = summarize([1.0, 1.02, 0.98, 1.01, 0.99])
    >>> s["median"], s["noisy"], s["busy"]
    (1.0, False, False)
    >>> summarize([0.1, 0.1, 6.0, 5.0, 0.12])["noisy"]
    True
    >>> summarize([12.0, 12.0, 12.0], preemptions=[125, 125, 125])["busy"]
    True
    """
    xs = [float(v) for v in values if v is not None and v > 0]
    if not xs:
        return None
    q1, med, q3 = quartiles(xs)
    spread = (q3 - q1) / (2 * med) if len(xs) >= MIN_REPEATS else None
    rates = [float(r) for r in preemptions if r is not None]
    return {"median": med, "spread": spread, "n": len(xs),
            "noisy": spread is None or spread > threshold,
            "busy": bool(rates) and quartiles(rates)[1] > busy}


def paired_ratios(numerators, denominators):
    """``numerators[i] / denominators[i]`` per repeat; repeats where either failed are left out.

    The two measurements of repeat i were taken back to back, so each ratio is
    taken before the median: a machine whose speed drifts moves both.

    Examples
    --------
    >>> paired_ratios([2.0, None, 9.0], [1.0, 1.0, 3.0])
    [2.0, 3.0]
    """
    return [a / b for a, b in zip(numerators, denominators) if a and b and a > 0 and b > 0]


def fmt_figure(summary, fmt):
    """A summary as a table cell: ``"12.3× ±4%"``, ``"12.3× ±40% noisy"``,
    ``"12.3× ±2% busy"``, or ``"—"``.

    Examples
    --------
    >>> fmt_figure(summarize([2.0, 2.0, 2.1]), lambda r: f"{r:.3g}×")
    '2× ±1%'
    >>> fmt_figure(summarize([2.0]), lambda r: f"{r:.3g}×")
    '2× ±? noisy'
    """
    if summary is None:
        return "—"
    spread = "?" if summary["spread"] is None else f"{100 * summary['spread']:.0f}%"
    flags = [word for word in ("noisy", "busy") if summary[word]]
    return " ".join([f"{fmt(summary['median'])} ±{spread}", *flags])


def fmt_ratio(r):
    """Three significant digits (whole numbers from 100) and a ×: ``0.953×``, ``12.3×``, ``5470×``."""
    return f"{r:.0f}×" if r >= 100 else f"{r:.3g}×"


def baseline_lib(case):
    """The library every user has for this case: NumPy, or SciPy for softmax."""
    return "scipy" if case["kind"] == "softmax" else "numpy"


def summarize_case(case, runs, threshold=NOISY_SPREAD):
    """The figures of one case from its per-repeat results.

    Parameters
    ----------
    case : dict
        The case (``_bench`` format).
    runs : dict
        ``{library: [result per repeat]}``; a result has ``seconds`` or ``error``.
    threshold : float
        See :func:`summarize`.

    Returns
    -------
    dict
        ``time`` and ``ratio`` (library time / fastattn time, paired per
        repeat): ``{library: summary or None}``; ``max_err`` of fastattn;
        ``errors``: ``{library: first error message}``.
    """
    secs = {lib: [r.get("seconds") for r in rs] for lib, rs in runs.items()}
    rates = {lib: [r.get("preemptions_per_s") for r in rs] for lib, rs in runs.items()}
    fa = secs.get("fastattn", [])
    errs = [r["max_err"] for r in runs.get("fastattn", []) if r.get("max_err") is not None]

    def ratio(lib):
        ratios, pair_rates = [], []
        for a, b, rate_a, rate_b in zip(secs[lib], fa, rates[lib], rates.get("fastattn", [])):
            if paired_ratios([a], [b]):
                ratios.append(a / b)
                # a pair is as busy as the busier of its two measurements
                pair_rates.append(None if rate_a is None or rate_b is None else max(rate_a, rate_b))
        return summarize(ratios, threshold, pair_rates)

    return {
        "time": {lib: summarize(s, threshold, rates[lib]) for lib, s in secs.items()},
        "ratio": {lib: ratio(lib) for lib in secs if lib != "fastattn"},
        "max_err": max(errs) if errs else None,
        "errors": {lib: next(r["error"] for r in rs if "error" in r)
                   for lib, rs in runs.items() if any("error" in r for r in rs)},
    }


# ---------------------------------------------------------------------------
# Workers: one library per long-lived process
# ---------------------------------------------------------------------------

class Worker:
    """One library in its own process, timing cases on request (``_bench.worker_main``).

    Between its measurements a worker is stopped (SIGSTOP, where the platform
    has it): after a call, OpenMP and OpenBLAS threads keep spinning for a while,
    and an idle worker's spinning threads would take cores from the library
    being timed next.
    """

    def __init__(self, lib, threads, pythonpath=(), timeout=300):
        self.lib, self.timeout, self.error = lib, timeout, None
        self._stderr = tempfile.TemporaryFile(mode="w+")     # read back on failure only
        spec = json.dumps({"lib": lib, "threads": threads})
        self._proc = subprocess.Popen(
            _bench.python_argv(_bench.RUN_THIS_FILE, ("--worker", spec)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env=_bench.child_env(threads, pythonpath))
        # A reader thread gives the replies a timeout on every platform.
        self._replies = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self._proc.stdout:
            if line.startswith(_bench.WORKER_REPLY):
                self._replies.put(json.loads(line[len(_bench.WORKER_REPLY):]))
        self._replies.put(None)                              # the worker has exited

    def _signal(self, name):
        sig = getattr(signal, name, None)
        if sig is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    def _reply(self):
        """The next reply, or None (and ``self.error`` set) when the worker died or hung."""
        try:
            reply = self._replies.get(timeout=self.timeout)
        except queue.Empty:
            self._proc.kill()
            self.error = f"no answer within {self.timeout} s"
            return None
        if reply is None:
            self._proc.wait()
            self.error = self._last_stderr_line()
        return reply

    def wait_ready(self):
        """Wait until the library is imported, then stop the worker; False if it failed."""
        ok = self._reply() is not None
        self._signal("SIGSTOP")
        return ok

    def measure(self, case, min_time):
        """Time ``case``; the result dict has ``seconds``, or ``error``."""
        if self.error is None:
            self._signal("SIGCONT")
            try:
                self._proc.stdin.write(json.dumps({"case": case, "min_time": min_time}) + "\n")
                self._proc.stdin.flush()
            except OSError:
                pass                                         # it died: _reply() says why
            reply = self._reply()
            self._signal("SIGSTOP")
            if reply is not None:
                return reply
        return {"error": self.error}

    def _last_stderr_line(self):
        self._stderr.seek(0)
        lines = [ln.strip() for ln in self._stderr.read().splitlines() if ln.strip()]
        return lines[-1] if lines else f"worker exited with status {self._proc.returncode}"

    def close(self):
        self._signal("SIGCONT")
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()


# ---------------------------------------------------------------------------
# The run and its report
# ---------------------------------------------------------------------------

def _loadavg():
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def run(cases, threads, repeats=DEFAULT_REPEATS, min_time=DEFAULT_MIN_TIME, torch=True,
        progress=None):
    """Time ``cases`` in fastattn, the NumPy/SciPy baseline and torch, alternating.

    Returns
    -------
    dict
        ``threads``, ``repeats``, ``libs`` (the libraries timed), ``loadavg``
        (before, after), and ``cases``: ``[{"case": case, "runs": {lib: [result
        per repeat]}}]``.
    """
    import fastattn
    progress = sys.stderr if progress is None else progress    # looked up per call
    # The fastattn worker must import the same fastattn as this process.
    path = [os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))]
    wanted = ["fastattn"] + sorted({baseline_lib(c) for c in cases})
    if torch:
        wanted.append("torch")
    libs = [lib for lib in wanted if lib == "fastattn" or _bench.library_available(lib)]
    per_case = [[lib for lib in libs if lib not in ("numpy", "scipy") or lib == baseline_lib(c)]
                for c in cases]
    results = {"threads": threads, "repeats": repeats, "libs": libs, "loadavg": [_loadavg(), None],
               "cases": [{"case": c, "runs": {lib: [] for lib in ls}} for c, ls in zip(cases, per_case)]}
    print(f"fastattn bench: {', '.join(libs)}, {threads} thread(s), {len(cases)} case(s), "
          f"{repeats} repeats ...", file=progress, flush=True)
    workers = {}
    try:
        for lib in libs:                 # one at a time, so that `finally` closes those started
            workers[lib] = Worker(lib, threads, path if lib == "fastattn" else ())
        for w in workers.values():                           # the imports run side by side
            if not w.wait_ready():
                print(f"  {w.lib} failed to start: {w.error}", file=progress, flush=True)
        for rep in range(repeats):
            t0 = time.perf_counter()
            for ci, (entry, ls) in enumerate(zip(results["cases"], per_case)):
                k = (rep + ci) % len(ls)
                for lib in ls[k:] + ls[:k]:                  # rotate the order
                    entry["runs"][lib].append(workers[lib].measure(entry["case"], min_time))
            print(f"  repeat {rep + 1}/{repeats} done ({time.perf_counter() - t0:.1f} s)",
                  file=progress, flush=True)
    finally:
        for w in workers.values():
            w.close()
    results["loadavg"][1] = _loadavg()
    return results


def report(results, stream=None, threshold=NOISY_SPREAD):
    """Print the Markdown table of a :func:`run`; return how many figures are noisy or busy."""
    import fastattn
    stream = sys.stdout if stream is None else stream          # looked up per call
    p = lambda *a: print(*a, file=stream)
    libs = results["libs"]
    have_torch = "torch" in libs
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    before, after = results["loadavg"]
    load = ("" if before is None else
            f"; load average {before:.2f} before, {after:.2f} after, {cpus} usable CPU(s)")
    p(f"\nfastattn {fastattn.__version__}, {results['threads']} thread(s), median of "
      f"{results['repeats']} alternating repeats{load}"
      + ("" if have_torch else "; torch not installed (or --no-torch): its columns are empty") + "\n")
    p("| case | shape | fastattn | NumPy / SciPy | NumPy ÷ fastattn | torch | torch ÷ fastattn "
      "| max err |")
    p("|---|---|---:|---:|---:|---:|---:|---:|")
    shown, untrusted, notes = 0, 0, []
    for entry in results["cases"]:
        case = entry["case"]
        s = summarize_case(case, entry["runs"], threshold)
        base = baseline_lib(case)
        cells = [fmt_figure(s["time"].get("fastattn"), _bench.fmt_time),
                 fmt_figure(s["time"].get(base), _bench.fmt_time) + (" (SciPy)" if base == "scipy" else ""),
                 fmt_figure(s["ratio"].get(base), fmt_ratio),
                 fmt_figure(s["time"].get("torch"), _bench.fmt_time) if have_torch else "n/a",
                 fmt_figure(s["ratio"].get("torch"), fmt_ratio) if have_torch else "n/a"]
        figures = [f for group in (s["time"], s["ratio"]) for f in group.values() if f]
        shown += len(figures)
        untrusted += sum(f["noisy"] or f["busy"] for f in figures)
        err = "—" if s["max_err"] is None else f"{s['max_err']:.1e}"
        p(f"| {case['id']} | {_bench.describe(case)} | " + " | ".join(cells) + f" | {err} |")
        notes += [f"{case['id']}: {lib} failed: {e}" for lib, e in s["errors"].items()]
    p("\n±: half the interquartile range of the repeats over their median (a ratio's: of the "
      "per-repeat ratios of back-to-back measurements). max err: largest |fastattn − float64| "
      "on a slice.")
    for n in notes:
        p(f"- {n}")
    if untrusted:
        p(f"\nnoisy: {untrusted} of {shown} figures cannot be trusted.  'noisy': their repeats "
          f"disagree by more than ±{100 * threshold:.0f}% (or are too few to tell); 'busy': other "
          f"work took the CPUs while they were timed (more than {BUSY_PREEMPTIONS:.0f} preemptions "
          f"per second and thread), which can make even steady figures several times too slow.  "
          f"Rerun on an idle machine.")
    return untrusted
