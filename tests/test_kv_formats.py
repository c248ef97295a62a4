"""float8 k / v caches (ml_dtypes float8_e4m3fn, float8_e5m2) read in place, and
QuantizedKV / quantize_kv (fields, validation, round trip), against
fastattn.reference."""
import numpy as np
import pytest

import fastattn
from fastattn import reference
from fastattn._quantized import QuantizedKV, quantize_kv
from fa_testutil import CACHE_OPTIONS, cache_options

try:
    import ml_dtypes
except ImportError:         # only the float8 tests need it
    ml_dtypes = None

needs_f8 = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
F8 = ["float8_e4m3fn", "float8_e5m2"]


def f8(x, name):
    return np.asarray(x, np.float32).astype(getattr(ml_dtypes, name))


def rng_for(*key):
    return np.random.default_rng(abs(hash(key)) % 2**32)


@needs_f8
@pytest.mark.parametrize("name", F8)
def test_every_float8_value_widens_exactly(name):
    """All 256 codes as keys of one-hot queries: the scores are the codes' values
    (NaN where the code is NaN), every lane position of the vector loads."""
    dt = np.dtype(getattr(ml_dtypes, name))
    codes = np.arange(256, dtype=np.uint8).view(dt)
    want = codes.astype(np.float64)
    D = 256
    finite_codes = np.where(np.isfinite(want), np.arange(256), 0).astype(np.uint8).view(dt)
    k = finite_codes.reshape(1, D)               # one key holding every finite code
    v = np.zeros((1, 1), np.float32)
    # one key: the lse is its score, q one-hot picks one code
    for j in range(D):
        q = np.zeros((1, D), np.float32)
        q[0, j] = 1
        _, lse = fastattn.attention(q, k, v, scale=1.0, return_lse=True)
        w = want[j] if np.isfinite(want[j]) else 0.0
        assert lse[0] == np.float32(w), (j, lse[0], w)
    for j in np.flatnonzero(~np.isfinite(want)):
        kk = np.full((1, 16), 0, np.uint8)
        kk[0, 3] = j
        _, lse = fastattn.attention(np.ones((1, 16), np.float32), kk.view(dt), v, scale=1.0, return_lse=True)
        assert np.isnan(lse[0]) or np.isinf(lse[0]), (j, lse[0])
    # all codes at once through the P.V path: values of one key, output = the values
    finite = np.where(np.isfinite(want), want, 0)
    vrow = np.asarray(finite, np.float32).astype(dt).reshape(1, D)
    out = fastattn.attention(np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32), vrow)
    np.testing.assert_array_equal(out[0], finite.astype(np.float32))




@needs_f8
@pytest.mark.parametrize("name", F8)
@pytest.mark.parametrize("Hq,Lq", [(2, 1), (8, 1), (2, 4), (8, 3), (2, 40)])
@pytest.mark.parametrize("D", [4, 16, 40, 44, 128])
def test_every_float8_code_in_every_kernel_path(name, Hq, Lq, D):
    """Every finite code (subnormals, zeros of both signs, the largest) at every
    lane of the keys and values, through the one-row decode, the grouped rows of
    GQA (4 query heads per key head), the row units and the packed tiles, and
    whole vectors, pairs of vectors and partial vectors (D 4; 44 = 2 x 16 + 8 + 4
    on AVX2): the same bits as the same call on float32 copies
    (the widening is exact, so only the loads differ).  A NaN code makes its
    key's rows NaN."""
    dt = np.dtype(getattr(ml_dtypes, name))
    all_codes = np.arange(256, dtype=np.uint8)
    finite = all_codes[np.isfinite(all_codes.view(dt).astype(np.float32))]
    rng = rng_for(name, Hq, Lq, D, "codes")
    Lk = 2 * 256 // D + 3
    k = rng.permutation(np.resize(finite, 2 * Lk * D)).reshape(1, 2, Lk, D).view(dt)
    v = rng.permutation(np.resize(finite, 2 * Lk * D)).reshape(1, 2, Lk, D).view(dt)
    q = (rng.standard_normal((1, Hq, Lq, D)) / 64).astype(np.float32)
    kf, vf = k.astype(np.float32), v.astype(np.float32)
    for kw in ({}, {"causal": "bottom_right"}, {"return_lse": True}):
        got = fastattn.attention(q, k, v, **kw)
        want = fastattn.attention(q, kf, vf, **kw)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_array_equal(g, w)
    nan_code = all_codes[np.isnan(all_codes.view(dt).astype(np.float32))]
    kn, vn = k.copy(), v.copy()
    kn.view(np.uint8)[0, 0, 1, D - 1] = nan_code[0]
    vn.view(np.uint8)[0, 1, 2, D // 2] = nan_code[-1]
    out = fastattn.attention(q, kn, vn)
    assert np.isnan(out[0, : Hq // 2]).all()          # key 1 of head 0 is NaN: every score row of its group
    assert np.isnan(out[0, Hq // 2:, :, D // 2]).all() and not np.isnan(out[0, Hq // 2:, :, D // 2 - 1]).any()


@needs_f8
@pytest.mark.parametrize("kname", F8 + ["float16"])
@pytest.mark.parametrize("vname", F8)
@pytest.mark.parametrize("Lq", [1, 3, 40])
@pytest.mark.parametrize("opt", range(len(CACHE_OPTIONS)))
def test_float8_against_reference(kname, vname, Lq, opt):
    rng = rng_for(kname, vname, Lq, opt)
    B, Hq, Hkv, Lk, D = 2, 4, 2, 23, 32
    q = rng.standard_normal((B, Hq, Lq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, Lk, D))
    v = rng.standard_normal((B, Hkv, Lk, D))
    k = k.astype(np.float16) if kname == "float16" else f8(k, kname)
    v = f8(v, vname)
    options = cache_options(opt, rng, B, Hq, Lq, Lk)
    got = fastattn.attention(q, k, v, **options)
    want = reference.attention(q, k, v, **options)
    if not isinstance(got, tuple):
        got, want = (got,), (want,)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


@needs_f8
@pytest.mark.parametrize("name", F8)
@pytest.mark.parametrize("kind", ["tensor", "head", "key", "channel"])
def test_float8_scales(name, kind):
    rng = rng_for(name, kind)
    B, H, Lq, Lk, D = 1, 3, 5, 70, 16
    q = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
    k = f8(rng.standard_normal((B, H, Lk, D)), name)
    v = f8(rng.standard_normal((B, H, Lk, D)), name)
    shape = {"tensor": (), "head": (H, 1, 1), "key": (B, H, Lk, 1), "channel": (B, H, 1, D)}[kind]
    ks = (rng.random(shape) + 0.5).astype(np.float32)
    vs = (rng.random(shape) + 0.5).astype(np.float32)
    for Lq_ in (1, Lq):
        got = fastattn.attention(q[..., :Lq_, :], k, v, k_scale=ks, v_scale=vs, causal="bottom_right")
        want = reference.attention(q[..., :Lq_, :], k, v, k_scale=ks, v_scale=vs, causal="bottom_right")
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@needs_f8
@pytest.mark.parametrize("name", F8)
def test_float8_split_kv_decode_and_threads(name):
    """A long key range with one query row (split-KV), identical for any thread count."""
    rng = rng_for(name, "split")
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    k = f8(rng.standard_normal((1, 2, 5000, 64)), name)
    v = f8(rng.standard_normal((1, 2, 5000, 64)), name)
    outs = [fastattn.attention(q, k, v, num_threads=t) for t in (1, 2, 3)]
    np.testing.assert_allclose(outs[0], reference.attention(q, k, v), rtol=2e-5, atol=2e-6)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@needs_f8
@pytest.mark.parametrize("name", F8)
@pytest.mark.parametrize("bs", [1, 7, 16])
@pytest.mark.parametrize("Lq", [1, 5])
def test_float8_paged(name, bs, Lq):
    rng = rng_for(name, bs, Lq)
    S, Hq, Hkv, D = 3, 4, 2, 32
    lens = np.array([Lq + 3, 40, 17])
    nblk = -(-lens.max() // bs)
    num_blocks = S * nblk + 2
    table = rng.permutation(num_blocks)[:S * nblk].reshape(S, nblk)
    kc = f8(rng.standard_normal((num_blocks, Hkv, bs, D)), name)
    vc = f8(rng.standard_normal((num_blocks, Hkv, bs, D)), name)
    q = rng.standard_normal((S, Hq, Lq, D)).astype(np.float32)
    ks = np.float32(0.75)
    got = fastattn.attention_paged(q, kc, vc, table, lens, causal="bottom_right", k_scale=ks)
    want = reference.attention_paged(q, kc, vc, table, lens, causal="bottom_right", k_scale=ks)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@needs_f8
def test_float8_read_in_place():
    """No copy of a float8 cache: tracemalloc sees far less than its float32 size."""
    import tracemalloc
    rng = np.random.default_rng(5)
    k = f8(rng.standard_normal((1, 8, 4096, 128)), "float8_e4m3fn")
    v = f8(rng.standard_normal((1, 8, 4096, 128)), "float8_e5m2")
    q = rng.standard_normal((1, 8, 1, 128)).astype(np.float32)
    fastattn.attention(q, k, v)
    tracemalloc.start()
    fastattn.attention(q, k, v, k_scale=np.float32(0.5))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < k.nbytes // 4, peak


@needs_f8
def test_float8_errors_before_work():
    k = f8(np.ones((2, 4, 8)), "float8_e4m3fn")
    q = np.ones((2, 3, 8), np.float32)
    before = k.copy()
    with pytest.raises(ValueError, match="k_scale"):
        fastattn.attention(q, k, k, k_scale=np.ones((2, 5, 1), np.float32))
    with pytest.raises(TypeError, match="k_scale"):
        fastattn.attention(q, q, q, k_scale=np.float32(2))
    assert before.view(np.uint8).tobytes() == k.view(np.uint8).tobytes()


# ---------------------------------------------------------------- QuantizedKV

@pytest.mark.parametrize("bits,G", [(8, None), (8, 16), (4, None), (4, 8), (4, 64)])
def test_quantize_kv_round_trip(bits, G):
    rng = np.random.default_rng(bits * 100 + (G or 0))
    x = (rng.standard_normal((2, 3, 17, 64)) * rng.random((2, 3, 17, 1)) * 4).astype(np.float32)
    c = quantize_kv(x, bits=bits, group_size=G)
    Gd = G or (64 if bits == 8 else 32)
    assert c.group_size == Gd and c.bits == bits and c.shape == x.shape
    assert c.data.dtype == np.uint8
    assert c.data.shape == (x.shape if bits == 8 else x.shape[:-1] + (32,))
    assert c.scale.shape == c.zero.shape == x.shape[:-1] + (64 // Gd,)
    assert c.scale.dtype == c.zero.dtype == np.float32
    back = reference._dequantized(c)
    bound = np.repeat(c.scale.astype(np.float64), Gd, axis=-1) / 2
    assert np.all(np.abs(back - x) <= bound * (1 + 1e-5) + 1e-6)
    codes = c.codes()
    assert codes.max() <= (1 << bits) - 1
    # code 0 and the top code are used in every (non-constant) group
    g = codes.reshape(x.shape[:-1] + (64 // Gd, Gd))
    assert np.all(g.min(-1) == 0) and np.all(g.max(-1) == (1 << bits) - 1)


def test_quantize_kv_nibble_order():
    """Element 2i in the low nibble of byte i, element 2i + 1 in the high one."""
    x = np.array([[[0, 15, 3, 12]]], np.float32)
    c = quantize_kv(x, bits=4, group_size=4)
    assert c.scale[0, 0, 0] == 1 and c.zero[0, 0, 0] == 0
    assert list(c.data[0, 0]) == [0 | (15 << 4), 3 | (12 << 4)]


def test_quantize_kv_constant_group():
    x = np.full((1, 2, 3, 32), 2.5, np.float32)
    x[0, 1] = 0
    for bits in (4, 8):
        c = quantize_kv(x, bits=bits)
        assert np.all(np.isfinite(c.scale)) and np.all(np.isfinite(c.zero))
        np.testing.assert_array_equal(c.dequantize(), x)


def test_quantized_kv_validation():
    data = np.zeros((2, 5, 16), np.uint8)
    s = np.ones((2, 5, 2), np.float32)
    QuantizedKV(data, s, s, bits=8, group_size=8)
    QuantizedKV(data, np.ones((2, 5, 4)), s.repeat(2, -1), bits=4, group_size=8)
    with pytest.raises(TypeError, match="data"):
        QuantizedKV(data.astype(np.int8), s, s, bits=8, group_size=8)
    with pytest.raises(TypeError, match="data"):
        QuantizedKV(data.tolist(), s, s, bits=8, group_size=8)
    with pytest.raises(ValueError, match="bits"):
        QuantizedKV(data, s, s, bits=5, group_size=8)
    with pytest.raises(TypeError, match="bits"):
        QuantizedKV(data, s, s, bits=8.0, group_size=8)
    with pytest.raises(ValueError, match="group_size"):
        QuantizedKV(data, s, s, bits=8, group_size=5)
    with pytest.raises(ValueError, match="scale"):
        QuantizedKV(data, s[..., :1], s, bits=8, group_size=8)
    with pytest.raises(ValueError, match="zero"):
        QuantizedKV(data, s, s[:1], bits=8, group_size=8)
    with pytest.raises(ValueError, match="scale"):
        QuantizedKV(data, s * np.inf, s, bits=8, group_size=8)
    with pytest.raises(TypeError, match="zero"):
        QuantizedKV(data, s, s.astype(bool), bits=8, group_size=8)
    with pytest.raises(ValueError, match="D"):
        quantize_kv(np.zeros((2, 3, 7), np.float32), bits=4, group_size=7)
    with pytest.raises(ValueError, match="group_size"):
        quantize_kv(np.zeros((2, 3, 8), np.float32), bits=8, group_size=3)
    with pytest.raises(ValueError, match="finite"):
        quantize_kv(np.full((2, 3, 8), np.nan, np.float32))


def test_reference_quantized_matches_dequantized():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 3, 32))
    k = quantize_kv(rng.standard_normal((1, 2, 9, 32)), bits=4, group_size=16)
    v = quantize_kv(rng.standard_normal((1, 2, 9, 32)), bits=8)
    got = reference.attention(q, k, v, causal="bottom_right")
    want = reference.attention(q, k.dequantize(np.float64), v.dequantize(np.float64), causal="bottom_right")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="k_scale"):
        reference.attention(q, k, v, k_scale=1.0)
