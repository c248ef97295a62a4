"""Are two fastattn builds bit-identical?  Random outputs of both, compared bit for bit.

    python tools/ab_identity.py OLD_TREE NEW_TREE [--n 2000] [--seed 0]
    FASTATTN_ISA=avx2 python tools/ab_identity.py OLD_TREE NEW_TREE    # one variant

OLD_TREE and NEW_TREE are source trees with in-place builds, imported side by side
into one process as in tools/ab_builds.py.  Each of N random problems -- attention
with a random mix of every option (masks, bias, both causal alignments, windows,
kv_lengths, softcap, ALiBi, grouped heads, weights, lse, transposed and broadcast
operands, Dv != Dk, float32 and float64, decode shapes that split the key range,
one and two threads) and softmax / log_softmax along random axes -- runs on both
builds with the same inputs; the outputs must have the same bytes (NaN payloads
included).  Exit status 1 when any output differs.  For refactors and changes that
claim "same bits"; a change of arithmetic shows up here first.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_builds import load_copy  # noqa: E402


def _operand(rng, shape, dt):
    """A random array of shape, sometimes as a transposed or broadcast view."""
    a = rng.standard_normal(shape).astype(dt)
    r = rng.random()
    if r < 0.15 and len(shape) >= 2:
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)   # column-major rows
    elif r < 0.3 and len(shape) >= 3:
        a = np.ascontiguousarray(np.swapaxes(a, -2, -3)).swapaxes(-2, -3)   # (B, L, H, D) layout
    return a


def attention_case(rng):
    dt = np.float64 if rng.random() < 0.25 else np.float32
    B = int(rng.integers(1, 3))
    Hkv = int(rng.integers(1, 4))
    g = int(rng.choice([1, 1, 2, 4]))
    Hq = Hkv * g
    kind = rng.random()
    if kind < 0.25:       # decode: few rows, many keys (splits the key range)
        Lq, Lk = int(rng.integers(1, 5)), int(rng.integers(600, 3000))
    elif kind < 0.5:      # query-vectorised sizes
        Lq, Lk = int(rng.integers(14, 200)), int(rng.integers(1, 400))
    else:
        Lq, Lk = int(rng.integers(1, 80)), int(rng.integers(1, 300))
    D = int(rng.choice([8, 16, 33, 64, 80, 128]))
    Dv = D if rng.random() < 0.8 else int(rng.choice([2, 16, 48]))
    q = _operand(rng, (B, Hq, Lq, D), dt)
    k = _operand(rng, (B, Hkv, Lk, D), dt)
    v = _operand(rng, (B, Hkv, Lk, Dv), dt)
    if rng.random() < 0.1:
        k, v = k[:1], v[:1]                      # shared by the batch
    kw = {}
    if rng.random() < 0.4:
        kw["causal"] = (True, "top_left", "bottom_right")[int(rng.integers(3))]
    if rng.random() < 0.2:
        kw["window"] = (int(rng.integers(0, 50)), int(rng.integers(0, 50)) if rng.random() < 0.5 else None)
    if rng.random() < 0.2:
        kw["kv_lengths"] = rng.integers(0, Lk + 1, size=(B, 1))
    if rng.random() < 0.2:
        kw["mask"] = rng.random((Lq, Lk) if rng.random() < 0.5 else (B, Hq, Lq, Lk)) < 0.7
    if rng.random() < 0.2:
        kw["bias"] = rng.standard_normal((Hq, Lq, Lk) if rng.random() < 0.5 else (Lk,)).astype(dt)
    if rng.random() < 0.15:
        kw["softcap"] = float(rng.choice([5.0, 30.0]))
    if rng.random() < 0.15:
        kw["alibi_slopes"] = rng.random(Hq).astype(dt)
    if rng.random() < 0.1:
        kw["scale"] = float(rng.random() + 0.1)
    if rng.random() < 0.15 and Lq * Lk <= 40000:
        kw["return_weights"] = True
    if rng.random() < 0.4:
        kw["return_lse"] = True
    if rng.random() < 0.05:
        v = v.copy()
        v[..., 0, 0] = np.nan                   # a non-finite value
    kw["num_threads"] = int(rng.choice([1, 2]))
    return lambda M: M.attention(q, k, v, **kw)


def softmax_case(rng):
    dt = np.float64 if rng.random() < 0.3 else np.float32
    nd = int(rng.integers(1, 4))
    shape = tuple(int(x) for x in rng.integers(1, 70, size=nd))
    x = _operand(rng, shape, dt) * 4
    if rng.random() < 0.2:
        x[..., 0] = -np.inf
    axis = int(rng.integers(-nd, nd)) if rng.random() < 0.5 else -1
    fn = "log_softmax" if rng.random() < 0.4 else "softmax"
    nt = int(rng.choice([1, 2]))
    return lambda M: getattr(M, fn)(x, axis=axis, num_threads=nt)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--n", type=int, default=2000, help="random problems")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="fa_id_")
    sys.path.insert(0, tmp)
    try:
        old = load_copy(args.old, "fa_old", tmp)
        new = load_copy(args.new, "fa_new", tmp)
        print(f"variant {old._dispatch.VARIANT} / {new._dispatch.VARIANT}")
        rng = np.random.default_rng(args.seed)
        outputs = differ = 0
        for i in range(args.n):
            f = attention_case(rng) if rng.random() < 0.8 else softmax_case(rng)
            a, b = f(old), f(new)
            a = a if isinstance(a, tuple) else (a,)
            b = b if isinstance(b, tuple) else (b,)
            for x, y in zip(a, b):
                outputs += 1
                if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(_bits(x), _bits(y)):
                    differ += 1
                    if differ <= 10:
                        print(f"problem {i}: output differs ({x.shape} {x.dtype})")
        print(f"{outputs} outputs of {args.n} problems: {differ} differ")
        return 1 if differ else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
