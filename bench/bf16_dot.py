"""bfloat16 prefill: dot-product kernels against widening, side by side.

    python bench/bf16_dot.py [--threads 2] [--rounds 5]

Loads two kernel variants of this build in one process -- the dot-product one
(avx512_amx's tiles where the CPU has AMX, else avx512_bf16 / neon_bf16) and
the one below it (avx512 / neon) -- and times, in
alternating rounds, the float32 prefill and the bfloat16 prefill on each
(B1 H8 L1024 D64, plain and causal; best of 7 calls per round, median of the
rounds).  The ratio says whether the dot products earn their variant on this
core (docs/kernels.rst, "bfloat16 dot products").
"""
import argparse
import importlib
import statistics
import time

import numpy as np

import fastattn
import fastattn._api as api
from fastattn import _dispatch
from fastattn._kernels import _cpu

PAIRS = (("avx512_amx", "avx512"), ("avx512_bf16", "avx512"), ("neon_bf16", "neon"))


def best_of(f, n=7):
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    ml_dtypes = importlib.import_module("ml_dtypes")
    have = set(_dispatch.available_variants())
    pair = next(((a, b) for a, b in PAIRS if a in have and b in have), None)
    if pair is None:
        print(f"no dot-product variant runs here (this CPU and build: {', '.join(sorted(have))})")
        return 0
    mods = {name: importlib.import_module(f"fastattn._kernels._attn_{name}") for name in pair}
    for m in mods.values():
        m.set_call_hooks(api.resolve_num_threads, api._check_num_threads, api._foreign_attention,
                         api._foreign_softmax)
    rng = np.random.default_rng(0)
    f32 = [rng.standard_normal((1, 8, 1024, 64)).astype(np.float32) for _ in range(3)]
    b16 = [x.astype(ml_dtypes.bfloat16) for x in f32]
    print(f"# fastattn {fastattn.__version__}, {args.threads} threads, B1 H8 L1024 D64; ms, median of "
          f"{args.rounds} rounds of best-of-7")
    for causal in (False, True):
        times = {key: [] for key in ((pair[1], "float32"), (pair[1], "bfloat16"), (pair[0], "bfloat16"))}
        for _ in range(args.rounds):
            for (name, dt) in times:
                x = f32 if dt == "float32" else b16
                times[(name, dt)].append(best_of(lambda: mods[name].attention(
                    *x, causal=causal, num_threads=args.threads)))
        med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
        ref = med[(pair[1], "float32")]
        print(f"causal={causal!s:5}  " + "  ".join(
            f"{name} {dt}: {ms:.2f} ({ref / ms:.2f}x float32)" for (name, dt), ms in med.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
