"""Paired A/B of two fastattn builds in ONE process, for kernel changes of a few percent.

    python tools/ab_builds.py OLD_TREE NEW_TREE [--cases prefill,long,...] [--reps 30]
    (a case may also be any shape: attn:BxHqxHkvxLqxLkxD[:f64|:bf16][:causal][:weights][:mask][:bias][:alibi][:window=L][:softcap=C]
    [:bwd][:kv=bf16|f16|int8|f8e4|f8e5|u8|u4[gG]] -- keys and values stored in that type, int8 with per-key scales, float8 and
    bfloat16 through ml_dtypes, u8 / u4 as each build's QuantizedKV (quantize_kv, group size G or the default); bf16: q, k
    and v in bfloat16; bwd: attention_backward of that forward, out and lse from the first build asked -- or
    paged:SxHqxHkvxCTXxBSxD[:kv=T][:q=bf16][:vllm][:contig]: a paged decode step (bench/compare.py's paged-decode is
    paged:8x32x8x4096x16x128; contig: its contiguous baseline) -- or
    calls:OPT[+OPT...]: 1000 small decode steps with options, e.g. calls:br+kvlen+lse)

OLD_TREE and NEW_TREE are source trees with in-place builds (``python setup.py
build_ext --inplace``), e.g. a ``git worktree`` of the base commit and this checkout.
Each tree's ``fastattn`` package is copied to a temporary directory under another
name (``fa_old`` / ``fa_new``, its kernel imports renamed), both are imported into
this process, and every case calls them alternately (order flipped every round) on
the same inputs.  Printed per case: median and minimum time of each build and
OLD / NEW as ratio of medians, of minima, and the median of the per-round ratios
(> 1: NEW is faster).

Why: on a shared machine the speed drifts by 10-20 % between processes, far more
than most single kernel changes; back-to-back calls of the two builds see the
same machine state, so the per-round ratio resolves 1-2 %.  For the side-by-side
against torch use bench/compare.py.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time

import numpy as np

CASES = {
    # name: (B, H, L, D, dtype, causal) -- the standard attention cases
    "prefill": (1, 8, 1024, 64, np.float32, False),
    "long": (1, 4, 4096, 128, np.float32, False),
    "causal": (1, 8, 1024, 64, np.float32, True),
    "causal-batch": (4, 8, 512, 64, np.float32, True),
    "batch": (32, 8, 128, 64, np.float32, False),
    "f64": (1, 8, 1024, 64, np.float64, False),
}
OTHER = ["decode", "decode-1head", "tiny", "softmax", "softmax-cached", "softmax-axis0"]


def load_copy(tree, name, tmp):
    """Import tree/fastattn as package ``name`` (kernel imports renamed)."""
    src = os.path.join(os.path.abspath(tree), "fastattn")
    if not os.path.isdir(src):
        sys.exit(f"no fastattn package in {tree}")
    dst = os.path.join(tmp, name)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for fn in os.listdir(dst):
        if fn.endswith(".py"):
            path = os.path.join(dst, fn)
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace('"fastattn._', f'"{name}._'))
    mod = importlib.import_module(name)
    built = [f for f in os.listdir(os.path.join(dst, "_kernels")) if f.startswith("_attn_")]
    if not any(f.endswith((".so", ".pyd")) for f in built):
        sys.exit(f"{tree}: no compiled kernels (run: python setup.py build_ext --inplace)")
    return mod


def stored_kv(kind, k, v):
    """k and v stored as ``kind`` (attn:...:kv=KIND): the keyword arguments that replace them.
    QuantizedKV kinds (u8, u4, u4g64, ...) give a function of the build (each has its own class)."""
    if kind[:2] in ("u4", "u8"):
        bits, g = int(kind[1]), kind[2:]
        if g and not (g[0] == "g" and g[1:].isdigit()):
            sys.exit(f"kv={kind}: u4 or u8, optionally gG (a group size), e.g. u4g64")
        opts = {"bits": bits, **({"group_size": int(g[1:])} if g else {})}
        made = {}

        def quantized(M):
            # the compiled modules recognise fastattn._quantized.QuantizedKV (an import
            # load_copy cannot rename): one pair of caches, made by the first build
            # asked, its class registered under that name, serves both builds
            if not made:
                sys.modules.setdefault("fastattn._quantized", sys.modules[M.__name__ + "._quantized"])
                made.update(k=M.quantize_kv(k, **opts), v=M.quantize_kv(v, **opts))
            return made
        return {"quantized": quantized}
    if kind == "int8":
        ks, vs = ((np.abs(x).max(-1, keepdims=True) / 127 + 1e-30).astype(np.float32) for x in (k, v))
        return {"k": np.rint(k / ks).astype(np.int8), "v": np.rint(v / vs).astype(np.int8),
                "k_scale": ks, "v_scale": vs}
    if kind == "f16":
        return {"k": k.astype(np.float16), "v": v.astype(np.float16)}
    import ml_dtypes
    types = {"bf16": ml_dtypes.bfloat16, "f8e4": ml_dtypes.float8_e4m3fn, "f8e5": ml_dtypes.float8_e5m2}
    if kind not in types:
        sys.exit(f"kv={kind}: known storage types bf16, f16, int8, f8e4, f8e5, u8, u4 (u4gG, u8gG)")
    return {"k": k.astype(types[kind]), "v": v.astype(types[kind])}


def make_case(case, rng):
    if case in CASES:
        B, H, L, D, dt, causal = CASES[case]
        q, k, v = (rng.standard_normal((B, H, L, D)).astype(dt) for _ in range(3))
        return lambda M: M.attention(q, k, v, causal=causal)
    if case in ("decode", "decode-1head"):
        H, Lk = (32, 4096) if case == "decode" else (1, 131072)
        q = rng.standard_normal((1, H, 1, 128), dtype=np.float32)
        k = rng.standard_normal((1, H, Lk, 128), dtype=np.float32)
        v = rng.standard_normal((1, H, Lk, 128), dtype=np.float32)
        return lambda M: M.attention(q, k, v)
    if case == "tiny":
        q, k, v = (rng.standard_normal((1, 1, 3, 64)).astype(np.float32) for _ in range(3))

        def many(M):
            for _ in range(1000):
                M.attention(q, k, v)
        return many
    if case == "softmax":
        x = rng.standard_normal((4096, 4096)).astype(np.float32)
        return lambda M: M.softmax(x)
    if case == "softmax-cached":
        x = rng.standard_normal((256, 4096)).astype(np.float32)
        out = np.empty_like(x)
        return lambda M: M.softmax(x, out=out)
    if case == "softmax-axis0":
        x = rng.standard_normal((2048, 2048)).astype(np.float32)
        return lambda M: M.softmax(x, axis=0)
    if case.startswith("attn:"):
        # attn:BxHqxHkvxLqxLkxD[:f64|:bf16][:causal][:weights][:mask][:bias][:alibi][:window=LEFT][:softcap=C][:bwd]
        # [:kv=T] -- any attention shape (window=LEFT: each query sees itself and LEFT keys before it)
        dims, *flags = case[5:].split(":")
        B, Hq, Hkv, Lq, Lk, D = (int(x) for x in dims.split("x"))
        dt = np.float64 if "f64" in flags else np.float32
        causal = "causal" in flags
        weights = "weights" in flags
        mask = rng.random((Lq, Lk)) < 0.5 if "mask" in flags else None   # half the keys visible
        kw = {}
        if "bias" in flags:
            kw["bias"] = rng.standard_normal((Lq, Lk)).astype(dt)
        if "alibi" in flags:
            kw["alibi_slopes"] = np.linspace(0.05, 1, Hq)
        q = rng.standard_normal((B, Hq, Lq, D)).astype(dt)
        k, v = (rng.standard_normal((B, Hkv, Lk, D)).astype(dt) for _ in range(2))
        for f in flags:
            if f.startswith("window="):
                kw["window"] = (int(f[7:]), 0)
            elif f.startswith("softcap="):
                kw["softcap"] = float(f[8:])
            elif f.startswith("kv="):
                kw.update(stored_kv(f[3:], k, v))
        k, v = kw.pop("k", k), kw.pop("v", v)
        if "bf16" in flags:
            import ml_dtypes
            q, k, v = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v))
        quantized = kw.pop("quantized", None)
        if "bwd" in flags:
            if quantized is not None or weights:
                sys.exit(f"{case}: bwd takes neither kv=u4 / u8 nor weights")
            fwd = {}

            def backward(M):
                if not fwd:
                    out, lse = M.attention(q, k, v, causal=causal, mask=mask, return_lse=True, **kw)
                    fwd.update(out=out, lse=lse, g=rng.standard_normal(out.shape).astype(out.dtype))
                return M.attention_backward(fwd["g"], q, k, v, fwd["out"], fwd["lse"], causal=causal, mask=mask,
                                            **kw)
            return backward
        if quantized is not None:
            return lambda M: M.attention(q, causal=causal, return_weights=weights, mask=mask,
                                         **quantized(M), **kw)
        return lambda M: M.attention(q, k, v, causal=causal, return_weights=weights, mask=mask, **kw)
    if case.startswith("paged:"):
        # paged:SxHqxHkvxCTXxBSxD[:kv=T][:vllm][:contig] -- a decode step (Lq 1, causal bottom-right) of S
        # sequences of about CTX keys in a cache of shuffled blocks of BS slots: the inputs of bench/compare.py's
        # paged cases (paged-decode: 8x32x8x4096x16x128); kv=T: the caches stored as T (no u4 / u8); vllm: each
        # cache stored (num_blocks, BS, Hkv, D) and passed transposed; contig: the same keys in contiguous caches
        # with kv_lengths (paged-decode-contiguous), the baseline of the paged time
        dims, *flags = case[6:].split(":")
        S, Hq, Hkv, ctx, bs, D = (int(x) for x in dims.split("x"))
        bc = importlib.import_module("fa_new._bench_cases")
        spec = bc.paged_case("ab", S, Hq, Hkv, D, 1, ctx, bs, decode=True,
                             impl="contiguous" if "contig" in flags else "paged")
        ip = bc._serving_inputs(spec, np)
        k, v = (ip["k"], ip["v"]) if "contig" in flags else (ip["k_cache"], ip["v_cache"])
        kw = {}
        for f in flags:
            if f.startswith("kv="):
                if f[3:5] in ("u4", "u8"):
                    sys.exit(f"{case}: paged cases take kv=bf16, f16, int8, f8e4 or f8e5")
                kw = stored_kv(f[3:], k, v)
        k, v = kw.pop("k", k), kw.pop("v", v)
        q, lens = ip["q"], ip["seq_lens"]
        if "q=bf16" in flags:       # bfloat16 queries too (a bfloat16 model's decode)
            import ml_dtypes
            q = q.astype(ml_dtypes.bfloat16)
        if "contig" in flags:
            return lambda M: M.attention(q, k, v, kv_lengths=lens, causal="bottom_right", **kw)
        if "vllm" in flags:
            k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (k, v))
            kw = {n: np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for n, x in kw.items()}
        table = ip["block_table"]
        return lambda M: M.attention_paged(q, k, v, table, lens, causal="bottom_right", **kw)
    if case.startswith("calls:"):
        # calls:OPT[+OPT...] -- 1000 small decode steps (8 query heads, 1 row, 16 keys,
        # D 64): the per-call cost of the argument handling for these options
        opts = case[6:].split("+")
        q = rng.standard_normal((1, 8, 1, 64), dtype=np.float32)
        hkv = 2 if "gqa" in opts else 8
        k, v = (rng.standard_normal((1, hkv, 16, 64), dtype=np.float32) for _ in range(2))
        known = {"plain": {}, "gqa": {}, "br": {"causal": "bottom_right"},
                 "kvlen": {"kv_lengths": np.array([12])}, "lse": {"return_lse": True},
                 "weights": {"return_weights": True}, "npscale": {"scale": 1 / np.sqrt(64)},
                 "window": {"window": (8, 0)}, "softcap": {"softcap": 30.0},
                 "alibi": {"alibi_slopes": np.linspace(0.1, 1, 8)},
                 "mask": {"mask": np.arange(16)[None] < 12},
                 "bias": {"bias": rng.standard_normal((1, 16), dtype=np.float32)},
                 "out": {"out": np.empty((1, 8, 1, 64), np.float32)}}
        kw = {}
        for o in opts:
            if o not in known:
                sys.exit(f"calls: unknown option {o!r}; known: {', '.join(known)}")
            kw.update(known[o])

        def calls(M):
            for _ in range(1000):
                M.attention(q, k, v, **kw)
        return calls
    sys.exit(f"unknown case {case!r}; known: {', '.join(list(CASES) + OTHER)}, "
             "attn:BxHqxHkvxLqxLkxD[:f64|:bf16][:causal][:weights][:mask][:bias][:alibi][:window=L][:softcap=C][:bwd]"
             "[:kv=T], paged:SxHqxHkvxCTXxBSxD[:kv=T][:vllm][:contig], or calls:OPT[+OPT...]")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--cases", default="prefill,long,causal,batch,decode,softmax")
    ap.add_argument("--reps", type=int, default=30, help="rounds per case (each calls both builds)")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="fa_ab_")
    sys.path.insert(0, tmp)
    try:
        old = load_copy(args.old, "fa_old", tmp)
        new = load_copy(args.new, "fa_new", tmp)
        rng = np.random.default_rng(0)
        print(f"old: {os.path.abspath(args.old)}\nnew: {os.path.abspath(args.new)}")
        for case in args.cases.split(","):
            f = make_case(case, rng)
            for M in (old, new, old, new):      # warm-up: pools, pages, caches
                f(M)
            t_old, t_new = [], []
            for r in range(args.reps):
                order = ((old, t_old), (new, t_new)) if r % 2 == 0 else ((new, t_new), (old, t_old))
                for M, ts in order:
                    t0 = time.perf_counter()
                    f(M)
                    ts.append(time.perf_counter() - t0)
            a, b = np.array(t_old), np.array(t_new)
            print(f"{case:15s} old med {np.median(a) * 1e3:9.3f} ms min {a.min() * 1e3:9.3f} | "
                  f"new med {np.median(b) * 1e3:9.3f} ms min {b.min() * 1e3:9.3f} | "
                  f"old/new med {np.median(a) / np.median(b):.3f} min {a.min() / b.min():.3f} "
                  f"paired {np.median(a / b):.3f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
