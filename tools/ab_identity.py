"""Are two fastattn builds bit-identical?  Random outputs of both, compared bit for bit.

    python tools/ab_identity.py OLD_TREE NEW_TREE [--n 2000] [--seed 0]
    FASTATTN_ISA=avx2 python tools/ab_identity.py OLD_TREE NEW_TREE    # one variant

OLD_TREE and NEW_TREE are source trees with in-place builds, imported side by side
into one process as in tools/ab_builds.py.  Each of N random problems -- attention
with a random mix of every option (masks, bias, both causal alignments, windows,
kv_lengths, softcap, ALiBi, grouped heads, weights, lse, transposed and broadcast
operands, Dv != Dk, float32 and float64, float16 / bfloat16 / int8 storage of q, k
and v, decode shapes that split the key range, one and two threads), its backward,
packed and paged batches, and softmax / log_softmax along random axes -- runs on
both builds with the same inputs; the outputs must have the same bytes (NaN payloads
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

try:
    import ml_dtypes
except ImportError:        # bfloat16 storage is then left out
    ml_dtypes = None

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
    if dt == np.float32 and rng.random() < 0.3:
        q, k, v = _stored(rng, q, k, v, kw)
    kw["num_threads"] = int(rng.choice([1, 2]))
    return lambda M: M.attention(q, k, v, **kw)


def _stored(rng, q, k, v, kw):
    """q, k, v in a random mix of float16, bfloat16 (when ml_dtypes is there) and
    int8 with per-tensor, per-head, per-key or per-channel scales."""
    types = [np.float16, np.float32] + ([ml_dtypes.bfloat16] if ml_dtypes else [])
    pick = lambda: types[int(rng.integers(len(types)))]    # noqa: E731
    q = q.astype(pick())
    out = []
    for name, x in (("k_scale", k), ("v_scale", v)):
        if rng.random() < 0.3:
            where = int(rng.integers(4))
            shape = [(), x.shape[:-2] + (1, 1), x.shape[:-1] + (1,), x.shape[:-2] + (1, x.shape[-1])][where]
            kw[name] = (rng.random(shape) * 0.05 + 0.01).astype(np.float32)
            x = np.clip(np.round(np.nan_to_num(x) * 40), -127, 127).astype(np.int8)
        else:
            x = x.astype(pick())
        out.append(x)
    return (q, *out)


def backward_case(rng):
    dt = np.float64 if rng.random() < 0.25 else np.float32
    B, Hkv, g = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.choice([1, 2]))
    Lq, Lk = int(rng.integers(1, 150)), int(rng.integers(1, 200))
    D = int(rng.choice([16, 33, 64]))
    q = _operand(rng, (B, Hkv * g, Lq, D), dt)
    k = _operand(rng, (B, Hkv, Lk, D), dt)
    v = _operand(rng, (B, Hkv, Lk, D), dt)
    go = _operand(rng, (B, Hkv * g, Lq, D), dt)
    kw = {}
    if rng.random() < 0.4:
        kw["causal"] = (True, "bottom_right")[int(rng.integers(2))]
    if rng.random() < 0.2:
        kw["softcap"] = 20.0
    if rng.random() < 0.2:
        kw["bias"] = rng.standard_normal((Lq, Lk)).astype(dt)
        kw["return_dbias"] = bool(rng.random() < 0.5)
    nt = int(rng.choice([1, 2]))

    def run(M):
        fkw = {key: val for key, val in kw.items() if key != "return_dbias"}
        out, lse = M.attention(q, k, v, return_lse=True, num_threads=nt, **fkw)
        return (out, lse) + tuple(M.attention_backward(go, q, k, v, out, lse, num_threads=nt, **kw))
    return run


def serving_case(rng):
    """attention_varlen or attention_paged on a few packed sequences."""
    S, Hkv, g, D = int(rng.integers(1, 5)), int(rng.integers(1, 3)), int(rng.choice([1, 4])), int(rng.choice([32, 64]))
    # a third decodes (one query row per sequence: the paged lockstep over the K/V heads)
    lq = rng.integers(1, 140, size=S) if rng.random() < 0.67 else np.ones(S, np.int64)
    lk = lq + rng.integers(0, 300, size=S)
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), Hkv * g, D)).astype(np.float32).transpose(1, 0, 2)   # (H, total, D)
    kw = {"num_threads": int(rng.choice([1, 2]))}
    if rng.random() < 0.5:
        kw["causal"] = True
    if rng.random() < 0.2:
        kw["window"] = (int(rng.integers(0, 60)), 0)
    if rng.random() < 0.3:
        kw["return_lse"] = True
    if rng.random() < 0.5:
        cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
        k = rng.standard_normal((Hkv, int(cu_k[-1]), D)).astype(np.float32)
        v = rng.standard_normal((Hkv, int(cu_k[-1]), D)).astype(np.float32)
        return lambda M: M.attention_varlen(q, k, v, cu_q, cu_k, **kw)
    bs = int(rng.choice([1, 7, 16]))
    nblk = [int(-(-n // bs)) for n in lk]
    table = np.zeros((S, max(nblk)), np.int32)
    perm = rng.permutation(sum(nblk))
    o = 0
    for s_, n in enumerate(nblk):
        table[s_, :n] = perm[o:o + n]
        o += n
    kc = rng.standard_normal((sum(nblk), Hkv, bs, D)).astype(np.float32)
    vc = rng.standard_normal((sum(nblk), Hkv, bs, D)).astype(np.float32)
    r = rng.random()
    if r < 0.3:
        kc, vc = kc.astype(np.float16), vc.astype(np.float16)
    elif r < 0.6:
        # int8 caches, each with per-key (per slot) or per-tensor scales
        for name in ("k_scale", "v_scale"):
            per_key = rng.random() < 0.7
            kw[name] = np.asarray((rng.random(kc.shape[:3] + (1,)) if per_key else rng.random()) * 0.05 + 0.01,
                                  np.float32)
        kc = np.clip(np.round(kc * 40), -127, 127).astype(np.int8)
        vc = np.clip(np.round(vc * 40), -127, 127).astype(np.int8)
    return lambda M: M.attention_paged(q, kc, vc, table, lk.astype(np.int32), cu_seqlens_q=cu_q, **kw)


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
            r = rng.random()
            f = (attention_case if r < 0.6 else backward_case if r < 0.7 else serving_case if r < 0.85
                 else softmax_case)(rng)
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
