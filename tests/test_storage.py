"""Storage types: float16, bfloat16 and int8 (with scales) read where they are stored.

The kernels compute in float32 on the exactly widened (and scaled) values, so a
float32 result is compared with the float64 reference on those same values
(relative RMS <= 1e-5 before any rounding to a half output); half outputs are
that result rounded once.  Every option, strides, grouped heads, both layouts
(few rows read in place, many rows through widened tiles), no conversion copy
(tracemalloc sees NumPy's allocations), the scale errors.
"""
import numpy as np
import pytest

import fastattn
from fastattn import _dispatch
from fastattn import reference as R
from fa_testutil import P_ROUNDING_VARIANTS, within_bf16_p_rounding

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = [np.dtype(np.float16), BF16]


def rel_rms(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    return float(np.sqrt(np.mean((got - want) ** 2) / max(np.mean(want ** 2), 1e-300)))


def f64(x):
    return np.asarray(x).astype(np.float64)


SHAPES = [  # (q shape, k shape): decode, draft rows, GQA groups, query-vectorised, odd sizes
    ((1, 4, 1, 64), (1, 4, 300, 64)),
    ((2, 3, 5, 32), (2, 3, 77, 32)),
    ((1, 8, 2, 128), (1, 2, 520, 128)),
    ((1, 2, 40, 64), (1, 2, 300, 64)),
    ((2, 2, 100, 48), (2, 2, 130, 48)),
    ((3, 33, 16), (3, 200, 16)),
]

OPTIONS = [
    {},
    {"causal": True},
    {"causal": "bottom_right", "window": (20, 0)},
    {"softcap": 5.0, "return_lse": True},
    {"kv_lengths": "lengths"},
    {"alibi_slopes": "slopes", "causal": "bottom_right"},
    {"mask": "mask"},
    {"bias": "bias"},
    {"return_weights": True, "causal": True},
]


def _options(opts, rng, qshape, kshape, dtype=np.float32):
    kw = dict(opts)
    batch = qshape[:-2]
    Lq, Lk = qshape[-2], kshape[-2]
    if kw.get("kv_lengths") == "lengths":
        kw["kv_lengths"] = rng.integers(0, Lk + 1, size=batch[:-1] + (1,))
    if kw.get("alibi_slopes") == "slopes":
        kw["alibi_slopes"] = rng.uniform(0.01, 0.5, size=batch[-1:])
    if kw.get("mask") == "mask":
        kw["mask"] = rng.random((Lq, Lk)) < 0.7
    if kw.get("bias") == "bias":
        kw["bias"] = rng.standard_normal((Lq, Lk)).astype(dtype)
    return kw


def _parts(res):
    return res if isinstance(res, tuple) else (res,)


@pytest.mark.parametrize("half", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_half_kv_with_float32_queries_against_the_reference(half, shape, rng):
    """float32 q with float16 / bfloat16 k, v: float32 results within 1e-5 of the
    float64 reference on the stored values, for every option."""
    qs, ks = shape
    q = rng.standard_normal(qs).astype(np.float32)
    k = rng.standard_normal(ks).astype(half)
    v = rng.standard_normal(ks[:-1] + (ks[-1] // 2 + 3,)).astype(half)
    for opts in OPTIONS:
        kw = _options(opts, rng, qs, ks)
        got = _parts(fastattn.attention(q, k, v, **kw))
        want = _parts(R.attention(q, f64(k), f64(v), **kw))
        assert got[0].dtype == np.float32
        for a, b in zip(got, want):
            if np.isfinite(b).all():
                assert rel_rms(a, b) <= 1e-5, (opts, shape)
            else:
                np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b))


@pytest.mark.parametrize("half", HALVES, ids=["float16", "bfloat16"])
def test_all_half_inputs_give_half_outputs_rounded_once(half, rng):
    """All of q, k, v (and a bias) in one half type: the output in that type, the
    float32 result rounded once; lse in float32."""
    for qs, ks in SHAPES[:5]:
        q = rng.standard_normal(qs).astype(half)
        k = rng.standard_normal(ks).astype(half)
        v = rng.standard_normal(ks).astype(half)
        bias = rng.standard_normal(qs[-2:-1] + ks[-2:-1]).astype(half)
        out, lse = fastattn.attention(q, k, v, bias=bias, causal="bottom_right", return_lse=True)
        assert out.dtype == half and lse.dtype == np.float32
        want, want_lse = R.attention(f64(q), f64(k), f64(v), bias=f64(bias), causal="bottom_right",
                                     return_lse=True)
        assert rel_rms(lse, want_lse) <= 1e-5
        if half == BF16 and _dispatch.VARIANT in P_ROUNDING_VARIANTS:
            # P.V by bfloat16 pair dot products: each probability rounded to
            # bfloat16 (relative error <= 2^-8) before the float32 sums, so an
            # output moves by at most 2^-8 * sum_j w_j |v_j| from the float32
            # result, then rounds once (half an ulp: <= 2^-8 of its magnitude)
            absw = R.attention(f64(q), f64(k), np.abs(f64(v)), bias=f64(bias), causal="bottom_right")
            assert np.all(within_bf16_p_rounding(out, want, absw, slack=1e-5))
            continue
        # rounding the float32 result once: at most half an ulp of the half type
        # beyond the float32 error
        np.testing.assert_allclose(f64(out), want, rtol=np.finfo(np.float16).eps if half == np.float16
                                   else 2.0 ** -7, atol=1e-3)
        exact = fastattn.attention(q.astype(np.float32), k, v, bias=bias, causal="bottom_right")
        if half == BF16 and _dispatch.VARIANT.endswith("_bf16"):
            # bfloat16 dot products (neon_bf16: the scores only): the float32
            # scores themselves differ in the last bits from the float32-query
            # path, so rounding may land one ulp away; a score's last-bit change
            # moves an output by ~eps32 * max|v| in absolute terms, more than an
            # ulp of an output near zero (seen under qemu on neon_bf16: 2 ulps at
            # |out| = 2.2e-6, 3e-8 apart)
            ulp = np.spacing(np.abs(f64(exact)).astype(np.float32)) * 2.0 ** 16
            near = 8 * np.finfo(np.float32).eps * np.abs(f64(v)).max()
            assert np.all(np.abs(f64(out) - f64(exact.astype(half))) <= ulp * 1.0001 + near)
        else:
            np.testing.assert_array_equal(out, exact.astype(half))          # one rounding


@pytest.mark.parametrize("half", HALVES, ids=["float16", "bfloat16"])
def test_half_outputs_written_by_the_kernels(half, rng):
    """Half results are narrowed by the kernels, each element once: decode with
    split key ranges (merged, then rounded), the query-vectorised layout,
    strided and preallocated out= arrays of the half dtype, empty rows -- the
    same bits as the float32 result rounded by NumPy."""
    for qs, ks in (((1, 4, 1, 64), (1, 4, 3000, 64)), ((1, 2, 3, 32), (1, 2, 2500, 32)),
                   ((1, 2, 70, 64), (1, 2, 200, 64)), ((2, 3, 5, 16), (2, 3, 40, 16))):
        q, k, v = (rng.standard_normal(s).astype(half) for s in (qs, ks, ks))
        lengths = np.array([[0] + [ks[-2] - 7] * (qs[1] - 1)])      # a head that sees nothing (1, H)
        want = fastattn.attention(q.astype(np.float32), k, v, kv_lengths=lengths).astype(half)
        got = fastattn.attention(q, k, v, kv_lengths=lengths)
        if half == BF16 and _dispatch.VARIANT in P_ROUNDING_VARIANTS:
            # the query-vectorised unit's P.V by bfloat16 pair dot products rounds P
            # to bfloat16 first (test_all_half_inputs_give_half_outputs_rounded_once):
            # within that of the float32 path; the out= forms below give its bits
            absw = fastattn.attention(q.astype(np.float32), k, np.abs(f64(v)).astype(np.float32),
                                      kv_lengths=lengths)
            f32 = f64(fastattn.attention(q.astype(np.float32), k, v, kv_lengths=lengths))
            assert np.all(within_bf16_p_rounding(got, f32, absw, slack=1e-6))
            want = got
        np.testing.assert_array_equal(got, want)
        out = np.full(qs, np.nan, half)
        assert fastattn.attention(q, k, v, kv_lengths=lengths, out=out) is out
        np.testing.assert_array_equal(out, want)
        buf = np.zeros(qs[:-2] + (qs[-1], qs[-2]), half)
        strided = buf.swapaxes(-1, -2)                                   # columns of out
        fastattn.attention(q, k, v, kv_lengths=lengths, out=strided)
        np.testing.assert_array_equal(strided, want)


def test_output_dtypes_follow_result_type(rng):
    """np.result_type of q, k, v: float32 with a half type gives float32; float16
    with bfloat16 gives float32; int8 k, v with a float16 q give float16."""
    q = rng.standard_normal((2, 3, 16)).astype(np.float32)
    h = q.astype(np.float16)
    b = q.astype(BF16)
    i8 = (q * 30).astype(np.int8)
    assert fastattn.attention(q, h, h).dtype == np.float32
    assert fastattn.attention(q, b, b).dtype == np.float32
    assert fastattn.attention(h, b, b).dtype == np.float32
    assert fastattn.attention(b, b, b).dtype == BF16
    assert fastattn.attention(h, i8, i8).dtype == np.float16
    assert fastattn.attention(q, i8, i8).dtype == np.float32
    assert fastattn.attention(q.astype(np.float64), h, h).dtype == np.float64
    np.testing.assert_allclose(fastattn.attention(h, b, b), R.attention(f64(h), f64(b), f64(b)), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["per_key", "per_channel", "per_head", "per_tensor", "none"])
def test_int8_kv_with_scales_against_the_reference(shape, kind, rng):
    """int8 k and v with per-key, per-channel, per-head or per-tensor scales (or
    none: the values as they are): within 1e-5 of the reference on k * k_scale."""
    qs, ks = shape
    Dv = ks[-1] // 2 + 3
    q = rng.standard_normal(qs).astype(np.float32)
    k = rng.integers(-127, 128, size=ks).astype(np.int8)
    v = rng.integers(-127, 128, size=ks[:-1] + (Dv,)).astype(np.int8)
    if kind == "per_key":
        ksc = rng.uniform(0.001, 0.03, ks[:-1] + (1,)).astype(np.float32)
        vsc = rng.uniform(0.001, 0.03, ks[:-1] + (1,))                   # float64: read as float32
    elif kind == "per_channel":
        ksc = rng.uniform(0.001, 0.03, ks[:-2] + (1, ks[-1])).astype(np.float32)
        vsc = rng.uniform(0.001, 0.03, (Dv,)).astype(np.float32)         # 1-D: per channel
    elif kind == "per_head":
        ksc = rng.uniform(0.001, 0.03, ks[:-2] + (1, 1)).astype(np.float32)
        vsc = ksc
    elif kind == "per_tensor":
        ksc, vsc = np.float32(0.01), np.array(0.02)
    else:
        ksc = vsc = None
    for opts in OPTIONS:
        kw = _options(opts, rng, qs, ks)
        got = _parts(fastattn.attention(q, k, v, k_scale=ksc, v_scale=vsc, **kw))
        want = _parts(R.attention(q, k, v, k_scale=None if ksc is None else np.float32(ksc).astype(np.float64),
                                  v_scale=None if vsc is None else np.asarray(vsc).astype(np.float32), **kw))
        assert got[0].dtype == np.float32
        for a, b in zip(got, want):
            if np.isfinite(b).all():
                assert rel_rms(a, b) <= 1e-5, (opts, kind, shape)
            else:
                np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b))


def test_strided_and_grouped_half_and_int8_caches(rng):
    """(B, L, H, D) caches passed as transposed views, negative strides, grouped
    heads, one query row and many: read in place, the same values as contiguous
    copies (to rounding)."""
    for dt in (np.float16, BF16, np.int8):
        raw = rng.standard_normal((2, 260, 4, 64)) * (40 if dt == np.int8 else 1)
        k = raw.astype(dt).transpose(0, 2, 1, 3)                 # (2, 4, 260, 64), strided
        v = raw[:, ::-1].astype(dt).transpose(0, 2, 1, 3)
        sc = {} if dt != np.int8 else {"k_scale": np.float32(0.02), "v_scale": np.float32(0.02)}
        for lq in (1, 3, 20, 70):
            q = rng.standard_normal((2, 8, lq, 64)).astype(np.float32)
            got = fastattn.attention(q, k, v, causal="bottom_right", **sc)
            want = fastattn.attention(q, np.ascontiguousarray(k), np.ascontiguousarray(v), causal="bottom_right",
                                      **sc)
            assert rel_rms(got, want) <= 1e-6
            ref = R.attention(q, f64(k) * (0.02 if sc else 1), f64(v) * (0.02 if sc else 1), causal="bottom_right")
            assert rel_rms(got, ref) <= 1e-5


@pytest.mark.parametrize("dt", [np.float16, BF16, np.int8], ids=["float16", "bfloat16", "int8"])
def test_half_and_int8_caches_are_never_copied(dt, rng):
    """A decode step over a 32 MiB cache allocates nothing of the cache's size:
    no conversion copy of k or v (tracemalloc sees NumPy's allocations)."""
    import tracemalloc
    q = rng.standard_normal((1, 16, 1, 128)).astype(np.float32)
    k = (rng.standard_normal((1, 16, 4096, 128)) * 20).astype(dt)
    v = (rng.standard_normal((1, 16, 4096, 128)) * 20).astype(dt)
    sc = {} if dt != np.int8 else {"k_scale": np.full((1, 16, 4096, 1), 0.05, np.float32),
                                   "v_scale": np.full((1, 16, 1, 128), 0.05, np.float32)}
    fastattn.attention(q, k, v, **sc)
    tracemalloc.start()
    try:
        fastattn.attention(q, k, v, **sc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < k.nbytes // 16, f"{peak} bytes allocated for a {k.nbytes}-byte cache"


def test_scale_errors_name_the_argument(rng):
    q = rng.standard_normal((2, 3, 16)).astype(np.float32)
    k8 = rng.integers(-5, 5, size=(2, 7, 16)).astype(np.int8)
    h = q.astype(np.float16)
    with pytest.raises(TypeError, match="k_scale"):
        fastattn.attention(q, h, h, k_scale=np.float32(0.1))              # not an integer k
    with pytest.raises(TypeError, match="v_scale"):
        fastattn.attention(q, k8, k8.astype(np.float32), v_scale=np.float32(0.1))
    with pytest.raises(ValueError, match="k_scale"):
        fastattn.attention(q, k8, k8, k_scale=np.ones((2, 7, 3)))          # neither per key nor channel
    with pytest.raises(ValueError, match="k_scale"):
        fastattn.attention(q, k8, k8, k_scale=np.array([[np.inf]]))
    with pytest.raises(TypeError, match="v_scale"):
        fastattn.attention(q, k8, k8, v_scale=np.ones(16, complex))
    with pytest.raises(TypeError, match="v_scale"):
        fastattn.attention(q, k8, k8, v_scale="0.1")
    # the reference raises the same
    with pytest.raises(TypeError, match="k_scale"):
        R.attention(q, h, h, k_scale=0.1)
    with pytest.raises(ValueError, match="k_scale"):
        R.attention(q, k8, k8, k_scale=np.ones((2, 7, 3)))


def test_other_integer_kv_with_scales_fold_the_scale(rng):
    """int16 (or any non-int8 integer) k with a scale, or a float64 q: converted
    with the scale folded in -- the same values."""
    q = rng.standard_normal((2, 4, 3, 16))
    k16 = rng.integers(-1000, 1000, size=(2, 4, 50, 16)).astype(np.int16)
    sc = rng.uniform(0.001, 0.002, (2, 4, 50, 1))
    want = R.attention(q, k16, k16, k_scale=sc, v_scale=sc)
    assert rel_rms(fastattn.attention(q, k16, k16, k_scale=sc, v_scale=sc), want) <= 1e-12
    k8 = (k16 // 10).astype(np.int8)
    want8 = R.attention(q, k8, k8, k_scale=sc, v_scale=sc)
    assert rel_rms(fastattn.attention(q, k8, k8, k_scale=sc, v_scale=sc), want8) <= 1e-12   # float64 q


def test_bfloat16_softmax_and_merge(rng):
    """softmax / log_softmax of float16 and bfloat16 arrays: computed in float32,
    returned in the input dtype; merge_attention takes bfloat16 parts."""
    x = rng.standard_normal((5, 70)) * 3
    for dt in HALVES:
        y = fastattn.softmax(x.astype(dt))
        assert y.dtype == dt
        np.testing.assert_allclose(f64(y), R.softmax(f64(x.astype(dt))), rtol=2.0 ** -7, atol=1e-3)
        ly = fastattn.log_softmax(x.astype(dt), axis=0)
        assert ly.dtype == dt
    q = rng.standard_normal((2, 4, 8)).astype(BF16)
    o1, l1 = fastattn.attention(q, q[:, :2], q[:, :2], return_lse=True)
    o2, l2 = fastattn.attention(q, q[:, 2:], q[:, 2:], return_lse=True)
    out, lse = fastattn.merge_attention([o1, o2], [l1, l2])
    np.testing.assert_allclose(out, fastattn.attention(q.astype(np.float32), q, q), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_against_torch_same_dtype(half, rng):
    """fastattn's half-precision attention is at least as close to the float64
    reference as torch's CPU SDPA in the same dtype."""
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, half)
    ndt = np.float16 if half == "float16" else BF16
    q, k, v = (rng.standard_normal((1, 4, 64, 64)).astype(np.float32) for _ in range(3))
    qh, kh, vh = (x.astype(ndt) for x in (q, k, v))
    ref = R.attention(f64(qh), f64(kh), f64(vh), causal=True)
    ours = fastattn.attention(qh, kh, vh, causal=True)
    tq, tk, tv = (torch.from_numpy(x).to(tdt) for x in (q, k, v))
    theirs = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).float().numpy()
    assert rel_rms(ours, ref) <= rel_rms(theirs, ref) * 1.05 + 1e-6


@pytest.mark.parametrize("store", ["float32", "float16", "bfloat16", "int8", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("D", [40, 64, 80, 128])
@pytest.mark.parametrize("group", [2, 3, 4, 5, 8])
def test_gqa_decode_groups_against_the_reference(store, D, group, rng):
    """GQA decode: the query heads of a key head read its rows together (blocks of
    2..6 rows; a group of 4 as one block of 4 rows on every target, an odd
    number of vectors leaving a 1-vector tail at D = 40 on 256-bit vectors), in
    every storage type, against the reference on the stored values, with a
    padded key tail (Lk 700) and split over two key heads."""
    dt = np.dtype(getattr(ml_dtypes, store)) if store.startswith(("float8", "bfloat")) else np.dtype(store)
    k = rng.standard_normal((1, 2, 700, D)).astype(np.float32)
    v = rng.standard_normal((1, 2, 700, D)).astype(np.float32)
    kw = {}
    if store == "int8":
        kw = {"k_scale": (np.abs(k).max(-1, keepdims=True) / 127).astype(np.float32),
              "v_scale": (np.abs(v).max(-1, keepdims=True) / 127).astype(np.float32)}
        k, v = np.round(k / kw["k_scale"]).astype(np.int8), np.round(v / kw["v_scale"]).astype(np.int8)
    else:
        k, v = k.astype(dt), v.astype(dt)
    q = rng.standard_normal((1, 2 * group, 1, D)).astype(np.float32)
    got = fastattn.attention(q, k, v, **kw)
    assert rel_rms(got, R.attention(q, k, v, **kw)) < 1e-6
    for causal in (None, "bottom_right"):
        q2 = rng.standard_normal((1, 2 * group, 2, D)).astype(np.float32)      # 2 draft rows: 2 * group rows
        assert rel_rms(fastattn.attention(q2, k, v, causal=causal, **kw),
                       R.attention(q2, k, v, causal=causal, **kw)) < 1e-6
