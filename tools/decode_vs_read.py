"""A decode step's read rate against the compiled read loop over the same bytes, in ONE process.

    python tools/decode_vs_read.py [--rounds 3] [--calls 25] [--threads 2]

For each decode case (bench/compare.py's gqa-decode-f32, decode-bf16 and decode-8k
shapes: 64, 128 and 256 MiB of K and V) and each round: the median time of
``fastattn.attention`` on the in-place build of this checkout, then the read loop
of the kernel module (``kernels.read_bandwidth``, the ceiling of compare.py) over
the same number of bytes, right after it.  Printed: the kernel's GB/s of stored
K and V, the read loop's GB/s and their ratio.

Why: compare.py measures its ceilings at a few points of a run and quotes each
case against the best reading; on a VM the memory system moves by a quarter or
more between readings, and a buffer up to a few times the last-level cache is
partly served from that cache by a bare read loop run again and again.  Back to
back, case and loop see the same machine state.  Needs ml_dtypes for the
bfloat16 case (skipped without it).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fastattn  # noqa: E402
from fastattn._dispatch import kernels  # noqa: E402

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None


def inputs(rng, hkv, lk, bf16):
    q = rng.standard_normal((1, 32, 1, 128), dtype=np.float32)
    k = rng.standard_normal((1, hkv, lk, 128), dtype=np.float32)
    v = rng.standard_normal((1, hkv, lk, 128), dtype=np.float32)
    if bf16:
        q, k, v = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v))
    return q, k, v


def median_time(fn, calls):
    fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=25, help="timed calls per case and round (median)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = {"gqa-decode-f32 (Hq32 Hkv8 Lk8192)": (8, 8192, False),
             "decode-bf16 (H32 Lk8192)": (32, 8192, True),
             "decode-8k (H32 Lk8192, float32)": (32, 8192, False)}
    if ml_dtypes is None:
        cases = {n: c for n, c in cases.items() if not c[2]}
    data = {name: inputs(rng, *c) for name, c in cases.items()}
    for r in range(args.rounds):
        for name, (q, k, v) in data.items():
            nbytes = k.nbytes + v.nbytes
            t = median_time(lambda: fastattn.attention(q, k, v, num_threads=args.threads), args.calls)
            loop = kernels.read_bandwidth(nbytes, args.threads, min_time=0.1)
            print(f"round {r + 1} {name}: {t * 1e3:.3f} ms, {nbytes / t / 1e9:.1f} GB/s; read loop over "
                  f"{nbytes >> 20} MiB {loop:.1f} GB/s: {nbytes / t / 1e9 / loop * 100:.0f} %", flush=True)


if __name__ == "__main__":
    main()
