"""A decode step's read rate against the compiled read loop over the same bytes, in ONE process.

    python tools/decode_vs_read.py [CASE ...] [--rounds 3] [--threads 2]

For each case (bench/compare.py's case ids, default gqa-decode-f32, decode-bf16 and
decode-8k: 64, 128 and 256 MiB of K and V) and each round: the time of the case's
fastattn call on the in-place build of this checkout (compare.py's inputs, runner
and timing), then the read loop of the kernel module (``kernels.read_bandwidth``,
the ceiling of compare.py) over the case's K and V bytes, right after it.
Printed: the case's GB/s of stored K and V, the read loop's GB/s and their ratio.

Why: on a VM the memory system moves by a quarter or more within minutes, and a
buffer up to a few times the last-level cache is partly served from that cache by
a bare read loop run again and again.  Back to back, case and loop see the same
machine state.  compare.py quotes a case against the best of its ceiling readings
spread over the run and those taken right after each of the case's fastattn runs;
this tool repeats case and loop in rounds, one process, for a closer look.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fastattn._bench as H  # noqa: E402
from fastattn._dispatch import kernels  # noqa: E402

CASES = {c["id"]: c for c in H.STANDARD_CASES + H.EXTRA_CASES + H.STORAGE_CASES + H.KV_CASES + H.SERVING_CASES}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=["gqa-decode-f32", "decode-bf16", "decode-8k"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds timed per case and round")
    args = ap.parse_args()
    runs = {}
    for cid in args.cases:
        case = CASES.get(cid)
        if case is None or not case.get("decode"):     # compare.py's ceiling_bytes: decode cases only
            sys.exit(f"{cid!r}: not a decode case of bench/compare.py")
        step, _ = H._fastattn_runner(case, H.make_inputs(case, np), args.threads, np)
        runs[cid] = (step, H.kv_bytes(case))
    for r in range(args.rounds):
        for cid, (step, nbytes) in runs.items():
            t = float(np.median(H.time_calls(step, args.min_time)))
            loop = kernels.read_bandwidth(nbytes, args.threads, min_time=0.1)
            print(f"round {r + 1} {cid}: {t * 1e3:.3f} ms, {nbytes / t / 1e9:.1f} GB/s; read loop over "
                  f"{nbytes / 2**20:.1f} MiB {loop:.1f} GB/s: {nbytes / t / 1e9 / loop * 100:.0f} %", flush=True)


if __name__ == "__main__":
    main()
