"""The ``fastattn`` command (also ``python -m fastattn``): the attention formula
worked through, a quick benchmark, the build.

    fastattn                      # the walkthrough (same as `fastattn walkthrough`)
    fastattn bench                # fastattn vs NumPy (and torch when installed)
    fastattn info                 # fastattn.show_config()

``fastattn`` is the console script ``pip install`` puts on PATH; it imports the
installed package wherever it runs.  ``python -m fastattn`` is the same command,
but run inside a source checkout it imports the checkout (the current directory
comes first on sys.path): it works there after ``python setup.py build_ext
--inplace`` and otherwise stops with a one-line hint (``fastattn/_unbuilt.py``).

The walkthrough follows one query -- the word "it" -- against three keys
("trophy", "suitcase", "it") whose raw dot products are [16, 8, 0] with
64-wide vectors.  Every number is computed by fastattn and checked against
``fastattn.reference`` (the float64 NumPy specification); each check prints
"ok", and the command exits with status 1 if any check fails.
"""
import argparse
import math
import os
import sys
import textwrap

import numpy as np

WORDS = ("trophy", "suitcase", "it")
DK = 64
VALUES = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])   # trophy, suitcase, it
# The lesson's figures, rounded as it prints them.
SCALED_WEIGHTS = np.array([0.665241, 0.244728, 0.090031])
CONTEXT = np.array([0.755272, 0.334759])


def lesson_vectors():
    """Query of "it" (1, 64) and keys (3, 64) whose dot products are exactly 16, 8, 0.

    q is 0.5 everywhere; trophy's key is 0.5 everywhere (64 · 0.25 = 16),
    suitcase's is 0.5 on the first half only (32 · 0.25 = 8) and it's own key
    alternates ±0.5 (the products cancel to 0).  All exact in binary.
    """
    q = np.full((1, DK), 0.5)
    k = np.zeros((3, DK))
    k[0] = 0.5
    k[1, : DK // 2] = 0.5
    k[2] = np.where(np.arange(DK) % 2 == 0, 0.5, -0.5)
    return q, k


class Checker:
    """Prints each check as "ok" or "FAILED" and remembers whether all passed."""

    def __init__(self, out):
        self.out = out
        self.failed = 0

    def close(self, what, got, want, atol=1e-12):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        good = got.shape == want.shape and bool(np.allclose(got, want, rtol=0, atol=atol))
        detail = "" if good else f"   (got {_vec(got)}, expected {_vec(want)}, tolerance {atol:g})"
        self._report(good, what, detail)

    def true(self, what, condition, detail=""):
        self._report(bool(condition), what, "" if condition else f"   ({detail})")

    def _report(self, good, what, detail):
        self.failed += not good
        print(f"    {'ok' if good else 'FAILED'}  {what}{detail}", file=self.out)


def _vec(x):
    return "[" + ", ".join(f"{v:.6g}" for v in np.ravel(x)) + "]"


def walkthrough(out=None):
    """Print the worked example to ``out`` (default: sys.stdout at call time);
    return the number of failed checks."""
    out = sys.stdout if out is None else out
    import fastattn
    from fastattn import reference

    p = lambda *a: print(*a, file=out)
    check = Checker(out)
    q, k = lesson_vectors()
    v = VALUES

    def attend(scale):
        """Output and weights of the query "it", computed by fastattn."""
        o, w = fastattn.attention(q, k, v, scale=scale, return_weights=True)
        return np.asarray(o)[0], np.asarray(w)[0]

    p("Scaled dot-product attention, one step at a time")
    p("=================================================")
    p("Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V.  We follow the query of the word 'it'")
    p(f"against the keys of {', '.join(WORDS)}; query and key vectors are {DK} numbers wide.\n")

    p("1. Raw scores: one dot product of the query with each key.")
    raw = (q @ k.T)[0]
    p(f"   q · k = {_vec(raw)}   (trophy matches best, then suitcase, then it)")
    check.close("the raw scores are exactly [16, 8, 0]", raw, [16.0, 8.0, 0.0], atol=0)

    p(f"\n2. Scale: a dot product of d_k = {DK} terms grows like √d_k = {math.sqrt(DK):g}, so divide by it.")
    scaled = raw / math.sqrt(DK)
    p(f"   scores / √{DK} = {_vec(scaled)}   (same order, smaller gaps)")
    check.close("the scaled scores are [2, 1, 0]", scaled, [2.0, 1.0, 0.0], atol=0)

    p("\n3. Softmax WITHOUT scaling: exp of each score, divided by their sum.")
    w_raw = np.asarray(fastattn.softmax(raw))
    p(f"   softmax([16, 8, 0]) = {_vec(w_raw)}")
    p("   Nearly one-hot: e^16 / e^8 ≈ 2981, so suitcase can pass on almost nothing.")
    check.close("fastattn.softmax matches reference.softmax", w_raw, reference.softmax(raw))
    _, w_attn = attend(scale=1.0)
    check.close("fastattn.attention(scale=1) weights match the same row", w_attn, w_raw)
    check.true("trophy takes more than 99.9% of the weight", w_raw[0] > 0.999, f"got {w_raw[0]:.6f}")

    p("\n4. Softmax WITH the 1/√d_k scaling (fastattn's default scale).")
    w_scaled = np.asarray(fastattn.softmax(scaled))
    p(f"   softmax([2, 1, 0]) = {_vec(w_scaled)}")
    p("   Trophy still leads, but suitcase and it now contribute.")
    check.close("fastattn.softmax matches reference.softmax", w_scaled, reference.softmax(scaled))
    check.close("the weights are ≈ [0.665241, 0.244728, 0.090031]", w_scaled, SCALED_WEIGHTS, atol=5e-7)
    o_def, w_def = attend(scale=None)
    ref_o, ref_w = reference.attention(q, k, v, return_weights=True)
    check.close("fastattn.attention(default scale) weights match reference.attention", w_def, ref_w[0])

    p(f"\n5. Softmax after dividing by d_k = {DK} instead of √d_k: scores {_vec(raw / DK)}.")
    _, w_flat = attend(scale=1.0 / DK)
    p(f"   weights = {_vec(w_flat)}")
    p("   Nearly flat: the real preference for trophy is mostly thrown away.")
    check.close("fastattn.attention(scale=1/64) weights match reference.attention",
                w_flat, reference.attention(q, k, v, scale=1.0 / DK, return_weights=True)[1][0])
    check.true("the largest and smallest weights are within 0.1 of each other",
               w_flat.max() - w_flat.min() < 0.1, f"spread {w_flat.max() - w_flat.min():.4f}")

    p("\n6. Subtracting the row maximum changes nothing (it keeps exp from overflowing).")
    shifted = raw - raw.max()
    p(f"   [16, 8, 0] − 16 = {_vec(shifted)};  softmax = {_vec(fastattn.softmax(shifted))}")
    check.close("softmax(raw − max) equals softmax(raw)", fastattn.softmax(shifted), w_raw, atol=1e-15)
    check.close("softmax(scaled − max) equals softmax(scaled)",
                fastattn.softmax(scaled - scaled.max()), w_scaled, atol=1e-15)
    big = np.array([1000.0, 992.0, 984.0])
    check.close("softmax([1000, 992, 984]) equals softmax([16, 8, 0]) without overflow",
                fastattn.softmax(big), w_raw, atol=1e-15)

    p("\n7. The context vector: the weights mix the VALUES (not the keys).")
    p(f"   values: trophy {_vec(v[0])}, suitcase {_vec(v[1])}, it {_vec(v[2])}")
    p(f"   {w_def[0]:.6f}·{_vec(v[0])} + {w_def[1]:.6f}·{_vec(v[1])} + {w_def[2]:.6f}·{_vec(v[2])}"
      f" = {_vec(o_def)}")
    check.close("fastattn.attention matches reference.attention", o_def, ref_o[0])
    check.close("the context is ≈ [0.755272, 0.334759]", o_def, CONTEXT, atol=5e-7)
    check.close("the context equals weights @ values", o_def, w_def @ v)

    p("\n8. Each row of weights sums to one (one weight per value row).")
    for name, w in (("no scaling", w_raw), ("1/√d_k", w_scaled), ("1/d_k", w_flat)):
        check.close(f"weights with {name} sum to 1", w.sum(), 1.0, atol=1e-12)
    check.true("there is one weight per value row", w_def.shape == (v.shape[0],), f"shape {w_def.shape}")

    p("")
    if check.failed:
        p(f"{check.failed} check(s) FAILED.")
    else:
        p("All checks passed: fastattn agrees with the float64 reference at every step.")
    return check.failed


def _prog():
    """How the user called us, for the usage line: ``fastattn`` or ``python -m fastattn``."""
    return "python -m fastattn" if os.path.basename(sys.argv[0]) == "__main__.py" else "fastattn"


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _case_list(text):
    from fastattn import _quickbench
    ids = [x.strip() for x in text.split(",") if x.strip()]
    known = [c["id"] for c in _quickbench.ALL_CASES]
    unknown = [x for x in ids if x not in known]
    if unknown or not ids:
        raise argparse.ArgumentTypeError(f"unknown case(s) {', '.join(unknown) or repr(text)}; "
                                         f"known: {', '.join(known)}")
    return ids


def parser():
    """The argument parser of the ``fastattn`` command."""
    from fastattn import _quickbench as Q
    prog = _prog()
    ap = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="fastattn: fast exact attention and softmax for NumPy arrays on CPUs.",
        epilog=f"Without a command: the walkthrough.  Examples:\n"
               f"  {prog}                      # the formula step by step, checked\n"
               f"  {prog} bench                # about half a minute\n"
               f"  {prog} bench --cases decode,tiny --threads 1\n"
               f"  {prog} info                 # version, build, CPU, threads")
    sub = ap.add_subparsers(dest="command", metavar="{walkthrough,bench,info}")
    sub.add_parser("walkthrough", help="the attention formula step by step, each step checked "
                                       "against fastattn.reference (the default); exit status 1 "
                                       "if a check fails",
                   description="Scaled dot-product attention worked through on the seed example "
                               "(the query 'it' against 'trophy', 'suitcase', 'it'); every number "
                               "is computed by fastattn and checked against the float64 "
                               "reference.")
    b = sub.add_parser(
        "bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="quick side-by-side: fastattn vs NumPy (and torch if installed), with the spread "
             "of every figure",
        description=textwrap.fill(
            "Time fastattn against the naive NumPy baseline (SciPy for softmax) and torch, each "
            "library in its own worker process.  The libraries alternate, the repeats are spread "
            "over the run, and every figure is the median of its repeats with its spread (±); a "
            f"figure whose repeats disagree by more than ±{100 * Q.NOISY_SPREAD:.0f}% is marked "
            "'noisy' (a busy machine): rerun it on an idle one.  For the full comparison with "
            "the machine's ceilings: python bench/compare.py in a source checkout.", 78),
        epilog="cases: " + ", ".join(c["id"] for c in Q.ALL_CASES)
               + f"\n(default: {','.join(Q.QUICK_CASE_IDS)})")
    b.add_argument("--threads", type=_positive(int), default=None,
                   help="threads for every library (default: fastattn.get_num_threads())")
    b.add_argument("--repeats", type=int, default=Q.DEFAULT_REPEATS,
                   help=f"measurements per case and library (default {Q.DEFAULT_REPEATS}, "
                        f"at least {Q.MIN_REPEATS})")
    b.add_argument("--min-time", type=_positive(float), default=Q.DEFAULT_MIN_TIME,
                   help=f"seconds timed per measurement (default {Q.DEFAULT_MIN_TIME})")
    b.add_argument("--cases", type=_case_list, default=list(Q.QUICK_CASE_IDS),
                   help="comma-separated case ids (listed below)")
    b.add_argument("--no-torch", action="store_true", help="leave torch out even if installed")
    sub.add_parser("info", help="print fastattn.show_config(): version, build, CPU, threads",
                   description="Print fastattn.show_config(): version, the compiled kernel "
                               "variants and the one in use, CPU features, OpenMP runtimes, "
                               "threads.")
    return ap


def main(argv=None):
    """Run the ``fastattn`` command; return its exit status.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success (``bench``: also when it flags noisy figures); 1 when a
        walkthrough check fails.  Bad arguments exit with status 2 (argparse).
    """
    ap = parser()
    args = ap.parse_args(argv)
    if args.command == "bench":
        from fastattn import _quickbench
        if args.repeats < _quickbench.MIN_REPEATS:
            ap.error(f"--repeats must be at least {_quickbench.MIN_REPEATS}: fewer cannot show "
                     f"how far the figures can be trusted")
        import fastattn
        cases = [c for c in _quickbench.ALL_CASES if c["id"] in args.cases]
        results = _quickbench.run(cases, args.threads or fastattn.get_num_threads(),
                                  repeats=args.repeats, min_time=args.min_time,
                                  torch=not args.no_torch)
        _quickbench.report(results)       # noisy figures are flagged there, not failed
        print("\nFor the full comparison with the machine's ceilings: python bench/compare.py "
              "(in a source checkout).")
        return 0
    if args.command == "info":
        import fastattn
        fastattn.show_config()          # prints the text (and returns it)
        return 0
    return 1 if walkthrough() else 0


if __name__ == "__main__":
    sys.exit(main())
