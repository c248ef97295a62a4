"""A paged decode against its contiguous twin, alternating in ONE process (one build).

    python tools/paged_vs_contig.py paged:8x32x8x4096x16x128 paged:8x32x8x4096x16x128:kv=int8 ... [--reps 21]

Each case is tools/ab_builds.py's ``paged:SxHqxHkvxCTXxBSxD[:kv=T][:vllm]`` (bench/compare.py's
paged-decode inputs); its twin is the same case with ``:contig`` -- the same keys in contiguous
caches with kv_lengths.  Both run back to back every round on the checkout's in-place build
(or the installed fastattn); printed: the median times and paged / contiguous as a ratio of
medians and as the median of the per-round ratios (issue 35: paged at most 1.1x).  On a
shared machine the per-round ratio is the figure to quote; absolute times drift.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))        # the checkout's in-place build before an installed one

import fastattn  # noqa: E402
import fastattn._bench_cases as bench_cases  # noqa: E402

# ab_builds.make_case reads the inputs through fa_new._bench_cases (the build under test)
sys.modules.setdefault("fa_new", fastattn)
sys.modules.setdefault("fa_new._bench_cases", bench_cases)
from ab_builds import make_case  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args(argv)
    print("fastattn from", os.path.dirname(fastattn.__file__))
    for case in args.cases:
        if not case.startswith("paged:") or ":contig" in case:
            sys.exit(f"{case!r}: a paged:... case without :contig")
        paged = make_case(case, np.random.default_rng(0))
        contig = make_case(case + ":contig", np.random.default_rng(0))
        for f in (paged, contig, paged, contig):
            f(fastattn)
        tp, tc = [], []
        for _ in range(args.reps):
            t = time.perf_counter()
            paged(fastattn)
            tp.append(time.perf_counter() - t)
            t = time.perf_counter()
            contig(fastattn)
            tc.append(time.perf_counter() - t)
        tp, tc = np.array(tp), np.array(tc)
        print(f"{case:42s} paged {np.median(tp) * 1e3:8.3f} ms  contiguous {np.median(tc) * 1e3:8.3f} ms  "
              f"paged / contiguous: medians {np.median(tp) / np.median(tc):.3f}, per round {np.median(tp / tc):.3f}")


if __name__ == "__main__":
    main()
