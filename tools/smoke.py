"""Small smoke run of every public fastattn function and option.

Used by tools/sanitize.sh (ASan/UBSan build) and tools/valgrind_smoke.sh
(memcheck): shapes are tiny so the script stays fast under instrumentation, but
every kernel path is touched -- prefill, causal (both alignments), windows,
masks, bias, kv_lengths, softcap, ALiBi, GQA, split-key decode, return_weights /
return_lse, out=, strided / broadcast / big-endian / float16 / integer inputs,
empty dimensions, inf/NaN, softmax / log_softmax on every axis, merge_attention,
the backward, packed variable-length batches and paged caches, thread control,
and the error paths.  Every result is compared with
fastattn.reference.  Exits 1 (after printing the failures) on any mismatch.

    python tools/smoke.py [--quick]     # --quick: fewer dtype/thread combinations
"""
from __future__ import annotations

import glob
import os
import sys

# the source tree this script lives in, ahead of anything installed, when it is built in
# place (an unbuilt checkout would shadow the installed fastattn with its bare sources)
_TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if glob.glob(os.path.join(_TREE, "fastattn", "_kernels", "_cpu*.so")) or glob.glob(
        os.path.join(_TREE, "fastattn", "_kernels", "_cpu*.pyd")):
    sys.path.insert(0, _TREE)

import numpy as np  # noqa: E402

import fastattn  # noqa: E402
from fastattn import reference as R  # noqa: E402

QUICK = "--quick" in sys.argv
FAIL = []
NCHECK = [0]
TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 2e-4, np.dtype(np.float16): 5e-3}


def close(name, got, ref, dtype):
    NCHECK[0] += 1
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        FAIL.append(f"{name}: shape {got.shape} != {ref.shape}")
        return
    if not np.array_equal(np.isnan(got), np.isnan(ref)):
        FAIL.append(f"{name}: NaN positions differ")
        return
    fin = np.isfinite(ref)
    if not np.array_equal(np.where(fin, 0, got), np.where(fin, 0, ref), equal_nan=True):
        FAIL.append(f"{name}: infinities differ")
        return
    if fin.any():
        err = np.max(np.abs(got[fin] - ref[fin])) / max(1.0, np.max(np.abs(ref[fin])))
        if not err <= TOL[np.dtype(dtype)]:
            FAIL.append(f"{name}: max error {err:.3g} (dtype {np.dtype(dtype)})")


def check_attention(name, q, k, v, **kw):
    snaps = [np.array(a, copy=True) for a in (q, k, v)]
    want_w, want_l = kw.get("return_weights", False), kw.get("return_lse", False)
    try:
        got = fastattn.attention(q, k, v, **kw)
    except Exception as e:  # noqa: BLE001 - report, keep going
        FAIL.append(f"{name}: raised {type(e).__name__}: {e}")
        return
    kw_ref = {key: val for key, val in kw.items() if key not in ("out", "num_threads")}
    ref = R.attention(q, k, v, **kw_ref)
    got = got if isinstance(got, tuple) else (got,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    dt = got[0].dtype
    for part, g, r in zip(["out"] + (["weights"] if want_w else []) + (["lse"] if want_l else []), got, ref):
        close(f"{name}/{part}", g, r, dt)
    for a, s in zip((q, k, v), snaps):
        if not np.array_equal(np.asarray(a), s, equal_nan=True):
            FAIL.append(f"{name}: input modified")


def expect_error(name, exc, fn, *args, **kw):
    NCHECK[0] += 1
    try:
        fn(*args, **kw)
    except exc:
        return
    except Exception as e:  # noqa: BLE001
        FAIL.append(f"{name}: expected {exc.__name__}, got {type(e).__name__}: {e}")
        return
    FAIL.append(f"{name}: expected {exc.__name__}, no error")


def main():
    rng = np.random.default_rng(0)
    dtypes = [np.float64, np.float32] if QUICK else [np.float64, np.float32, np.float16]
    nts = [1, 2] if QUICK else [1, 2, 3]
    B, H, Lq, Lk, D, Dv = 2, 2, 9, 13, 8, 5
    for dt in dtypes:
        q = rng.standard_normal((B, H, Lq, D)).astype(dt)
        k = rng.standard_normal((B, H, Lk, D)).astype(dt)
        v = rng.standard_normal((B, H, Lk, Dv)).astype(dt)
        mask = rng.random((B, 1, Lq, Lk)) < 0.7
        bias = rng.standard_normal((H, Lq, Lk)).astype(dt)
        lens = np.array([[Lk], [6]])
        slopes = np.array([0.5, 0.25])
        for nt in nts:
            tag = f"{np.dtype(dt).name}/nt{nt}"
            base = dict(num_threads=nt)
            check_attention(f"plain/{tag}", q, k, v, **base)
            check_attention(f"weights_lse/{tag}", q, k, v, return_weights=True, return_lse=True, **base)
            for c in (True, "top_left", "bottom_right"):
                check_attention(f"causal={c}/{tag}", q, k, v, causal=c, return_lse=True, **base)
            check_attention(f"window/{tag}", q, k, v, window=(3, 1), causal="bottom_right", **base)
            check_attention(f"window_int/{tag}", q, k, v, window=2, return_weights=True, **base)
            check_attention(f"mask/{tag}", q, k, v, mask=mask, return_weights=True, **base)
            check_attention(f"bias/{tag}", q, k, v, bias=bias, scale=0.3, **base)
            check_attention(f"kv_lengths/{tag}", q, k, v, kv_lengths=lens, causal="bottom_right",
                            return_lse=True, **base)
            check_attention(f"softcap/{tag}", q, k, v, softcap=2.0, **base)
            check_attention(f"alibi/{tag}", q, k, v, alibi_slopes=slopes, causal=True, **base)
            check_attention(f"all/{tag}", q, k, v, mask=mask, bias=bias, window=(4, 0), kv_lengths=lens,
                            softcap=5.0, alibi_slopes=slopes, causal="bottom_right",
                            return_weights=True, return_lse=True, **base)
            # GQA: 4 query heads over 2 key/value heads
            q4 = rng.standard_normal((B, 4, Lq, D)).astype(dt)
            check_attention(f"gqa/{tag}", q4, k, v, causal=True, return_lse=True, **base)
            check_attention(f"gqa_weights/{tag}", q4, k, v, mask=mask, return_weights=True, **base)
            # decode with split keys (few work units, many keys), also GQA decode
            kd = rng.standard_normal((1, 2, 1100, D)).astype(dt)
            vd = rng.standard_normal((1, 2, 1100, Dv)).astype(dt)
            check_attention(f"decode_split/{tag}", q[:1, :, :1], kd, vd, return_lse=True, **base)
            check_attention(f"decode_gqa/{tag}", q4[:1, :, :1], kd, vd, kv_lengths=np.array([[1100, 700, 900, 50]]),
                            **base)
            # strided, broadcast, out=
            check_attention(f"strided/{tag}", q[:, :, ::-2], np.swapaxes(np.swapaxes(k, 1, 2).copy(), 1, 2),
                            v[..., ::-1], **base)
            check_attention(f"broadcast/{tag}", np.broadcast_to(q[:1], q.shape), k[0], v[0], **base)
    # output buffers, conversions
    q = rng.standard_normal((3, 7, 6))
    k = rng.standard_normal((3, 10, 6))
    v = rng.standard_normal((3, 10, 4))
    out = np.empty((3, 7, 4))
    check_attention("out=", q, k, v, out=out)
    out16 = np.empty((3, 7, 4), np.float16)
    check_attention("out=f16", q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), out=out16)
    check_attention("big_endian", q.astype(">f8"), k.astype(">f4"), v.astype(">f8"))
    check_attention("int", (q * 3).astype(np.int32), (k * 3).astype(np.int64), v.astype(np.int8))
    check_attention("mixed", q.astype(np.float32), k, v.astype(np.float16))
    # empty dimensions and non-finite values
    for shp in [((3, 0, 6), (3, 10, 6), (3, 10, 4)), ((3, 7, 6), (3, 0, 6), (3, 0, 4)),
                ((0, 7, 6), (0, 10, 6), (0, 10, 4)), ((3, 7, 0), (3, 10, 0), (3, 10, 4)),
                ((3, 7, 6), (3, 10, 6), (3, 10, 0))]:
        check_attention(f"empty{shp}", *(np.ones(s) for s in shp), return_weights=True, return_lse=True)
    qn, kn, vn = q.copy(), k.copy(), v.copy()
    qn[0, 2, 1] = np.nan
    kn[1, 3, 0] = np.inf
    vn[2, 4, 2] = -np.inf
    check_attention("nonfinite", qn, kn, vn, return_weights=True, return_lse=True)
    check_attention("nonfinite_masked", qn, kn, vn, kv_lengths=np.array([10, 3, 4]), return_lse=True)
    # softmax / log_softmax
    x = rng.standard_normal((4, 5, 37))
    x[0, 0, :] = -np.inf
    x[1, 1, 3] = np.nan
    x[2, 2, 4] = np.inf
    for fn, ref in ((fastattn.softmax, R.softmax), (fastattn.log_softmax, R.log_softmax)):
        for dt in (np.float64, np.float32, np.float16, ">f8", np.int16):
            xd = x.astype(dt) if np.dtype(dt).kind == "f" else (np.nan_to_num(x, posinf=0, neginf=0) * 4).astype(dt)
            for axis in (-1, 0, 1, None):
                for nt in (1, 2):
                    close(f"{fn.__name__}/{np.dtype(dt).str}/axis={axis}/nt{nt}",
                          fn(xd, axis=axis, num_threads=nt), ref(xd, axis=axis),
                          np.result_type(xd.dtype, np.float16) if np.dtype(dt).kind == "f" else np.float64)
        close(f"{fn.__name__}/strided", fn(x[:, ::-2, ::3]), ref(x[:, ::-2, ::3]), np.float64)
        o = np.empty_like(x)
        close(f"{fn.__name__}/out", fn(x, axis=1, out=o), ref(x, axis=1), np.float64)
        close(f"{fn.__name__}/empty", fn(np.ones((3, 0))), ref(np.ones((3, 0))), np.float64)
        close(f"{fn.__name__}/0d", fn(np.float64(2.0), axis=None), ref(np.float64(2.0), axis=None), np.float64)
    # merge_attention
    q = rng.standard_normal((2, 5, 8))
    k = rng.standard_normal((2, 20, 8))
    v = rng.standard_normal((2, 20, 3))
    o1, l1 = fastattn.attention(q, k[:, :12], v[:, :12], return_lse=True)
    o2, l2 = fastattn.attention(q, k[:, 12:], v[:, 12:], return_lse=True)
    mo, ml = fastattn.merge_attention([o1, o2], [l1, l2])
    full, lse = R.attention(q, k, v, return_lse=True)
    close("merge/out", mo, full, np.float64)
    close("merge/lse", ml, lse, np.float64)
    # the backward: every option, grouped heads, a shared dbias, one long head (key groups)
    for dt in (np.float32, np.float64):
        for shapes, kw in ((((2, 4, 33, 8), (2, 2, 50, 8), (2, 2, 50, 5)),
                            dict(causal="bottom_right", softcap=2.0, window=(20, 1),
                                 mask=rng.random((33, 50)) < 0.8, bias=rng.standard_normal((4, 33, 50)),
                                 alibi_slopes=np.full(4, 0.2),
                                 kv_lengths=np.array([[40, 50, 3, 0], [50, 1, 50, 49]]))),
                           (((1, 1, 300, 16), (1, 1, 400, 16), (1, 1, 400, 16)), dict(causal=True))):
            q, k, v = (rng.standard_normal(sh).astype(dt) for sh in shapes)
            if "bias" in kw:
                kw["bias"] = kw["bias"].astype(dt)
            out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
            g = rng.standard_normal(out.shape).astype(dt)
            got = fastattn.attention_backward(g, q, k, v, out, lse, return_dbias="bias" in kw, **kw)
            o6, l6 = R.attention(q, k, v, return_lse=True, **kw)
            ref = R.attention_backward(g, q, k, v, o6, l6, return_dbias="bias" in kw, **kw)
            for name, a, b in zip(("dq", "dk", "dv", "dbias"), got, ref):
                close(f"backward/{name}/{np.dtype(dt).name}/{len(kw)}", a, b, np.dtype(dt))
    # bfloat16 q, k, v, grad_out (pair dot products for S and dP on the variants with
    # them): every option, then odd head dims; the gradients are rounded to bfloat16
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    if ml_dtypes is not None:
        bf = ml_dtypes.bfloat16
        for shapes, kw in ((((2, 4, 33, 8), (2, 2, 50, 8), (2, 2, 50, 5)),
                            dict(causal="bottom_right", softcap=2.0, window=(20, 1),
                                 mask=rng.random((33, 50)) < 0.8, alibi_slopes=np.full(4, 0.2),
                                 kv_lengths=np.array([[40, 50, 3, 0], [50, 1, 50, 49]]))),
                           (((1, 2, 40, 7), (1, 1, 50, 7), (1, 1, 50, 5)), dict(causal=True))):
            q, k, v = (rng.standard_normal(sh).astype(bf) for sh in shapes)
            out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
            g = rng.standard_normal(out.shape).astype(bf)
            got = fastattn.attention_backward(g, q, k, v, out, lse, **kw)
            wide = [x.astype(np.float64) for x in (g, q, k, v, out)]
            ref = R.attention_backward(*wide, lse.astype(np.float64), **kw)
            for name, a, b in zip(("dq", "dk", "dv"), got, ref):
                close(f"backward/{name}/bfloat16/{len(kw)}", a, b, np.float16)
    # packed variable-length batches and paged caches: both unit kinds, key
    # splits, paged heads in lockstep, query-vectorised tiles copied / read run
    # by run / in one block, block sizes 1, 7, 16, 64; NaN in unused slots
    nq, nk = np.array([3, 0, 40, 1, 17]), np.array([5, 3, 40, 1300, 0])
    for dt in (np.float32, np.float64):
        q = rng.standard_normal((4, nq.sum(), 16)).astype(dt)
        k = rng.standard_normal((2, nk.sum(), 16)).astype(dt)
        v = rng.standard_normal((2, nk.sum(), 8)).astype(dt)
        cq, ck = np.r_[0, np.cumsum(nq)], np.r_[0, np.cumsum(nk)]
        for kw in ({}, dict(causal="bottom_right", window=(30, 0), softcap=3.0, alibi_slopes=np.full(4, 0.1))):
            for nt in (1, 2):
                got = fastattn.attention_varlen(q, k, v, cq, ck, return_lse=True, num_threads=nt, **kw)
                for name, a, b in zip(("out", "lse"), got, R.attention_varlen(q, k, v, cq, ck, return_lse=True, **kw)):
                    close(f"varlen/{name}/{np.dtype(dt).name}/{len(kw)}/nt{nt}", a, b, np.dtype(dt))
        for bs in (1, 7, 16, 64):
            lens = np.array([700, 45, 3])
            need = -(-lens // bs)
            kc = np.full((need.sum() + 2, 2, bs, 16), np.nan)
            vc = np.full((need.sum() + 2, 2, bs, 16), np.nan)
            table = np.full((3, need.max() + 1), -1)
            perm = rng.permutation(kc.shape[0])
            for s_, (n, start) in enumerate(zip(need, np.r_[0, np.cumsum(need)[:-1]])):
                table[s_, :n] = perm[start:start + n]
                for j in range(lens[s_]):
                    kc[table[s_, j // bs], :, j % bs] = rng.standard_normal((2, 16))
                    vc[table[s_, j // bs], :, j % bs] = rng.standard_normal((2, 16))
            kc, vc = kc.astype(dt), vc.astype(dt)
            for lq in (1, 3):
                qp = rng.standard_normal((3, 8, lq, 16)).astype(dt)
                got = fastattn.attention_paged(qp, kc, vc, table, lens, causal="bottom_right", return_lse=True)
                ref = R.attention_paged(qp, kc, vc, table, lens, causal="bottom_right", return_lse=True)
                for name, a, b in zip(("out", "lse"), got, ref):
                    close(f"paged/{name}/{np.dtype(dt).name}/bs{bs}/lq{lq}", a, b, np.dtype(dt))
            qp = rng.standard_normal((4, 33 + 2, 16)).astype(dt)
            cu = np.array([0, 33, 34, 35])
            close(f"paged/packed/{np.dtype(dt).name}/bs{bs}",
                  fastattn.attention_paged(qp, kc, vc, table, lens, cu_seqlens_q=cu, causal="bottom_right"),
                  R.attention_paged(qp, kc, vc, table, lens, cu_seqlens_q=cu, causal="bottom_right"), np.dtype(dt))
    k8 = np.nan_to_num(kc * 20).clip(-100, 100).astype(np.int8)
    sc = np.full(kc.shape[:3] + (1,), 0.05, np.float32)
    qp = rng.standard_normal((3, 8, 1, 16)).astype(np.float32)
    close("paged/int8", fastattn.attention_paged(qp, k8, k8, table, lens, k_scale=sc, v_scale=sc),
          R.attention_paged(qp, k8, k8, table, lens, k_scale=sc, v_scale=sc), np.float32)
    close("paged/f16", fastattn.attention_paged(qp, kc.astype(np.float16), vc.astype(np.float16), table, lens),
          R.attention_paged(qp, kc.astype(np.float16), vc.astype(np.float16), table, lens), np.float32)
    expect_error("varlen cu", ValueError, fastattn.attention_varlen, q, k, v, cq[::-1], ck)
    expect_error("paged table", ValueError, fastattn.attention_paged, qp, kc, vc, -table - 2, lens)
    # thread control
    with fastattn.threads(2):
        check_attention("threads_ctx", q, k, v)
    fastattn.set_num_threads(1)
    check_attention("set_num_threads", q, k, v)
    fastattn.set_num_threads(None)
    # error paths
    a = np.zeros((2, 5, 8))
    expect_error("ndim", ValueError, fastattn.attention, a[0, 0], a, a)
    expect_error("Dk", ValueError, fastattn.attention, a, a[..., :7], a)
    expect_error("mask dtype", TypeError, fastattn.attention, a, a, a, mask=np.ones((5, 5)))
    expect_error("kv_lengths", ValueError, fastattn.attention, a, a, a, kv_lengths=np.array(6))
    expect_error("window", ValueError, fastattn.attention, a, a, a, window=-1)
    expect_error("softcap", ValueError, fastattn.attention, a, a, a, softcap=0.0)
    expect_error("out overlap", ValueError, fastattn.attention, a, a, a, out=a)
    expect_error("complex", TypeError, fastattn.softmax, np.zeros(3, complex))
    expect_error("num_threads", ValueError, fastattn.softmax, np.zeros(3), num_threads=0)
    if "--no-memoryerror" not in sys.argv:
        huge = np.broadcast_to(np.zeros((1, 1)), (1, 2**40))
        expect_error("workspace MemoryError", MemoryError, fastattn.attention, huge, huge, np.zeros((1, 1)))

    if FAIL:
        print(f"smoke: {len(FAIL)} of {NCHECK[0]} checks FAILED:", *FAIL[:50], sep="\n  ")
        return 1
    print(f"smoke: {NCHECK[0]} checks passed ({fastattn._dispatch.VARIANT} kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
