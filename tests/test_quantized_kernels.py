"""QuantizedKV k / v (asymmetric 8-bit and 4-bit codes, a scale and zero point
per group) read by the compiled kernels in place, against fastattn.reference
(float64, computed from the documented fields): every option, mixed storage,
GQA, decode (few rows, split-KV), prefill (query-vectorised), paged caches,
thread-count determinism, errors before any work, no copy of the cache."""
import numpy as np
import pytest

import fastattn
from fastattn import reference
from fastattn._quantized import QuantizedKV, quantize_kv
from fa_testutil import CACHE_OPTIONS, cache_options, dequantized


def rng_for(*key):
    return np.random.default_rng(abs(hash(key)) % 2**32)


def quantized(rng, shape, bits, G):
    return quantize_kv(rng.standard_normal(shape).astype(np.float32), bits=bits, group_size=G)


def check(got, want, tol=3e-5):
    if not isinstance(got, tuple):
        got, want = (got,), (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=tol, atol=tol)


# ---------------------------------------------------------------- every code and group

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("G", [2, 8, 16, 32, 64])
def test_every_code_and_group_dequantized(bits, G):
    """One key per code pattern, every lane position and group boundary: the
    scores of one-hot queries are the dequantized elements exactly (float32)."""
    D = 64
    rng = rng_for(bits, G, "codes")
    top = 15 if bits == 4 else 255
    codes = rng.integers(0, top + 1, size=(3, D)).astype(np.uint8)
    codes[0, :top + 1 if top + 1 <= D else D] = np.arange(min(top + 1, D))
    data = codes[:, 0::2] | (codes[:, 1::2] << 4) if bits == 4 else codes
    data = np.ascontiguousarray(data, np.uint8)
    scale = (rng.random((3, D // G)) + 0.25).astype(np.float32)
    zero = (rng.random((3, D // G)) * top).astype(np.float32)
    c = QuantizedKV(data, scale, zero, bits=bits, group_size=G)
    want = dequantized(c)
    # values: one key, out = its row; keys: the scores of one-hot queries (lse of one key)
    for j in range(3):
        vq = QuantizedKV(data[j:j + 1], scale[j:j + 1], zero[j:j + 1], bits=bits, group_size=G)
        out = fastattn.attention(np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32), vq)
        # in float32: (code - zero) rounded, times scale rounded (the kernels' two roundings)
        codes32 = (np.stack([vq.data & 15, vq.data >> 4], -1).reshape(1, D) if bits == 4 else vq.data)
        want32 = ((codes32.astype(np.float32) - np.repeat(vq.zero, G, -1)) * np.repeat(vq.scale, G, -1))[0]
        np.testing.assert_array_equal(out[0], want32)
        np.testing.assert_allclose(out[0], want[j], rtol=1e-6, atol=1e-6)
        _, lse = fastattn.attention(np.eye(D, dtype=np.float32), vq, np.zeros((1, 1), np.float32), scale=1.0,
                                    return_lse=True)
        np.testing.assert_allclose(lse, want[j], rtol=1e-6, atol=1e-6)


def test_reference_matches_fields():
    rng = rng_for("fields")
    for bits, G in ((4, 8), (8, 16)):
        c = quantized(rng, (2, 5, 32), bits, G)
        np.testing.assert_array_equal(reference._dequantized(c), dequantized(c))


# ---------------------------------------------------------------- options


KINDS = ["q4", "q8", "f32", "f16"]


def kv_of(rng, kind, shape, G):
    if kind == "f32":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "f16":
        return rng.standard_normal(shape).astype(np.float16)
    if kind.endswith("D"):       # one group per row (G = D): the scores' own zero / scale path
        kind, G = kind[:-1], shape[-1]
    return quantized(rng, shape, 4 if kind == "q4" else 8, G)


@pytest.mark.parametrize("kv", [("q4", "q4"), ("q8", "q8"), ("q4", "f32"), ("f16", "q8"), ("q8", "q4"),
                                ("q8D", "q8D"), ("q4D", "f32")])
@pytest.mark.parametrize("Lq", [1, 3, 40])
@pytest.mark.parametrize("opt", range(len(CACHE_OPTIONS)))
def test_options_against_reference(kv, Lq, opt):
    rng = rng_for(kv, Lq, opt)
    B, Hq, Hkv, Lk, D, G = 2, 4, 2, 150, 32, 16
    q = rng.standard_normal((B, Hq, Lq, D)).astype(np.float32)
    k = kv_of(rng, kv[0], (B, Hkv, Lk, D), G)
    v = kv_of(rng, kv[1], (B, Hkv, Lk, D), G)
    options = cache_options(opt, rng, B, Hq, Lq, Lk)
    got = fastattn.attention(q, k, v, **options)
    want = reference.attention(q, k, v, **options)
    check(got, want)
    out = got[0] if isinstance(got, tuple) else got
    assert out.dtype == np.float32


GROUPS = sorted({(D, G) for D in (32, 64, 80, 128) for G in (8, 16, 32, 64, D) if D % G == 0})


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("D,G", GROUPS)
def test_head_dims_and_groups(bits, D, G):
    rng = rng_for(bits, G, D)
    q = rng.standard_normal((1, 3, 20, D)).astype(np.float32)
    k = quantized(rng, (1, 3, 137, D), bits, G)
    v = quantized(rng, (1, 3, 137, D), bits, G)
    for Lq in (1, 5, 20):        # few rows, and query-vectorised
        check(fastattn.attention(q[:, :, :Lq], k, v, causal="bottom_right"),
              reference.attention(q[:, :, :Lq], k, v, causal="bottom_right"))


@pytest.mark.parametrize("bits", [4, 8])
def test_decode_rows_gqa_and_dtypes(bits):
    """Decode with 1..13 rows (draft tokens, GQA groups of 4), float16 / bfloat16 /
    float64 queries (float64 computes in float64)."""
    rng = rng_for(bits, "decode")
    k = quantized(rng, (2, 2, 300, 64), bits, 32)
    v = quantized(rng, (2, 2, 300, 64), bits, 16)
    for Lq in (1, 2, 5, 13):
        q = rng.standard_normal((2, 8, Lq, 64))
        for dt in (np.float32, np.float16, np.float64):
            qd = q.astype(dt)
            got = fastattn.attention(qd, k, v, causal="bottom_right")
            assert got.dtype == np.result_type(dt, np.float32)
            check(got, reference.attention(qd, k, v, causal="bottom_right"),
                  tol=2e-3 if dt == np.float16 else 3e-5)


@pytest.mark.parametrize("bits", [4, 8])
def test_split_kv_decode_and_threads(bits):
    """A long key range with one query row (split-KV) and a prefill, identical for any thread count."""
    rng = rng_for(bits, "split")
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    k = quantized(rng, (1, 2, 5000, 64), bits, 32)
    v = quantized(rng, (1, 2, 5000, 64), bits, 32)
    outs = [fastattn.attention(q, k, v, num_threads=t) for t in (1, 2, 3)]
    check(outs[0], reference.attention(q, k, v), tol=2e-5)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    q = rng.standard_normal((1, 4, 300, 64)).astype(np.float32)
    k2 = QuantizedKV(k.data[:, :, :700], k.scale[:, :, :700], k.zero[:, :, :700], bits=bits, group_size=32)
    outs = [fastattn.attention(q, k2, v.data[:, :, :700, :64].astype(np.float32), causal=True, num_threads=t)
            for t in (1, 2)]
    np.testing.assert_array_equal(outs[1], outs[0])


def test_strided_views_of_a_bigger_cache():
    """QuantizedKV over slices of a preallocated cache (rows of a longer buffer,
    every other head): strides are read as they are."""
    rng = rng_for("views")
    full = quantized(rng, (1, 4, 64, 32), 4, 8)
    k = QuantizedKV(full.data[:, ::2, :40], full.scale[:, ::2, :40], full.zero[:, ::2, :40], bits=4, group_size=8)
    v = quantized(rng, (1, 2, 40, 32), 8, 32)
    q = rng.standard_normal((1, 2, 3, 32)).astype(np.float32)
    check(fastattn.attention(q, k, v), reference.attention(q, k, v))
    # broadcast batch dims: one cache for every batch element
    q = rng.standard_normal((3, 2, 17, 32)).astype(np.float32)
    check(fastattn.attention(q, k, v, causal=True), reference.attention(q, k, v, causal=True))


# ---------------------------------------------------------------- paged

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("bs", [1, 7, 16])
@pytest.mark.parametrize("Lq", [1, 5, 20])
def test_paged(bits, bs, Lq):
    rng = rng_for(bits, bs, Lq, "paged")
    S, Hq, Hkv, D = 3, 4, 2, 32
    lens = np.array([Lq + 3, 40, Lq + 17])
    nblk = -(-lens.max() // bs)
    num_blocks = S * nblk + 2
    table = rng.permutation(num_blocks)[:S * nblk].reshape(S, nblk)
    kc = quantized(rng, (num_blocks, Hkv, bs, D), bits, 16)
    vc = quantized(rng, (num_blocks, Hkv, bs, D), bits, 8)
    q = rng.standard_normal((S, Hq, Lq, D)).astype(np.float32)
    for opts in ({"causal": "bottom_right"}, {"return_lse": True, "sinks": np.array([0.1, 0.2, -0.3, 1.0])}):
        got = fastattn.attention_paged(q, kc, vc, table, lens, **opts)
        want = reference.attention_paged(q, kc, vc, table, lens, **opts)
        check(got, want)
    # mixed: a float32 value cache
    vf = rng.standard_normal((num_blocks, Hkv, bs, D)).astype(np.float32)
    check(fastattn.attention_paged(q, kc, vf, table, lens, causal="bottom_right"),
          reference.attention_paged(q, kc, vf, table, lens, causal="bottom_right"))


# ---------------------------------------------------------------- errors, memory

def test_errors_before_work():
    rng = rng_for("errors")
    q = rng.standard_normal((1, 2, 3, 32)).astype(np.float32)
    c = quantized(rng, (1, 2, 9, 32), 8, 16)
    f = rng.standard_normal((1, 2, 9, 32)).astype(np.float32)
    before = (c.data.copy(), c.scale.copy(), c.zero.copy())
    out, lse = fastattn.attention(q, c, c, return_lse=True)
    with pytest.raises(TypeError, match="k_scale"):
        fastattn.attention(q, c, f, k_scale=np.float32(2))
    with pytest.raises(TypeError, match="v_scale"):
        fastattn.attention(q, f, c, v_scale=np.float32(2))
    with pytest.raises(ValueError, match="Dk"):
        fastattn.attention(q[..., :16], c, f)
    with pytest.raises(TypeError, match="k_scale is given for a QuantizedKV"):
        fastattn.attention_backward(np.ones_like(out), q, c, f, out, lse, k_scale=np.float32(2))
    with pytest.raises(TypeError, match="attention_varlen: k is a fastattn.QuantizedKV"):
        fastattn.attention_varlen(q[0], quantized(rng, (2, 9, 32), 8, 32), f[0], np.array([0, 3]),
                                  np.array([0, 9]))
    # codes whose rows are not contiguous are refused, not copied
    wide = quantized(rng, (1, 2, 9, 64), 8, 32)
    strided = QuantizedKV(wide.data[..., ::2], wide.scale[..., :1].repeat(1, -1), wide.zero[..., :1], bits=8,
                          group_size=32)
    with pytest.raises(ValueError, match="k.data"):
        fastattn.attention(q, strided, f)
    # fields replaced after construction are checked again
    bad = quantized(rng, (1, 2, 9, 32), 8, 16)
    bad.scale = bad.scale.astype(np.float64)
    with pytest.raises(ValueError, match="k.scale"):
        fastattn.attention(q, bad, f)
    for a, b in zip(before, (c.data, c.scale, c.zero)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bits", [4, 8])
def test_read_in_place(bits):
    """No dequantized copy of a cache: tracemalloc sees far less than the cache's
    float32 size (or its codes' size), decode and prefill."""
    import tracemalloc
    rng = np.random.default_rng(5)
    k = quantized(rng, (1, 8, 4096, 128), bits, 32)
    v = quantized(rng, (1, 8, 4096, 128), bits, 32)
    for Lq in (1, 64):
        q = rng.standard_normal((1, 8, Lq, 128)).astype(np.float32)
        fastattn.attention(q, k, v)
        tracemalloc.start()
        fastattn.attention(q, k, v, causal="bottom_right")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < k.data.nbytes // 4, (Lq, peak)


def test_quantized_cache_is_smaller_and_close_to_float():
    """The point of the format: a 4-bit cache's output is near the float32 one."""
    rng = rng_for("close")
    k = rng.standard_normal((1, 4, 512, 64)).astype(np.float32)
    v = rng.standard_normal((1, 4, 512, 64)).astype(np.float32)
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    exact = fastattn.attention(q, k, v)
    for bits, tol in ((8, 0.02), (4, 0.25)):
        got = fastattn.attention(q, quantize_kv(k, bits=bits), quantize_kv(v, bits=bits))
        rel = np.sqrt(np.mean((got - exact) ** 2) / np.mean(exact ** 2))
        assert rel < tol, (bits, rel)


@pytest.mark.parametrize("D,G", [(64, 32), (64, 64), (128, 16), (128, 32), (128, 128), (256, 64), (96, 32)])
@pytest.mark.parametrize("bits", [4, 8])
def test_rows_of_a_unit_do_not_change_a_row(bits, G, D):
    """Decode of a GQA group (4 rows read the codes together, 2 or 3 rows of a
    group of 3) gives each row the bits of that row decoded alone: the scores'
    lanes are summed in one order (G = D: one group per row, zero point and scale
    applied per score; 4 bits: 1, 2 or 4 groups per chunk of nibble lanes, or
    D = 96, not a whole number of chunks on 256-bit vectors)."""
    rng = rng_for(bits, "rows", G, D)
    k = quantized(rng, (1, 1, 700, D), bits, G)
    v = quantized(rng, (1, 1, 700, D), bits, G)
    for Hq in (4, 3):
        q = rng.standard_normal((1, Hq, 1, D)).astype(np.float32)
        together = fastattn.attention(q, k, v)
        np.testing.assert_allclose(together, reference.attention(q, k, v), rtol=3e-5, atol=3e-5)
        for h in range(Hq):
            np.testing.assert_array_equal(fastattn.attention(q[:, h:h + 1], k, v)[:, 0], together[:, h])


def test_torch_query_with_a_quantized_cache():
    """A torch q with a QuantizedKV k / v computes on the codes (the integration
    passes the QuantizedKV through), not on the argument path's shape stand-in."""
    torch = pytest.importorskip("torch")
    rng = rng_for("torch")
    c = quantized(rng, (1, 2, 9, 32), 4, 16)
    q = rng.standard_normal((1, 2, 3, 32)).astype(np.float32)
    got = fastattn.attention(torch.from_numpy(q), c, c)
    assert isinstance(got, torch.Tensor)
    check(got.numpy(), reference.attention(q, c, c))


def test_replaced_fields_checked_against_shape():
    """A field replaced after construction that no longer matches ``shape`` (a
    smaller data buffer, bits changed, a group size that does not divide D) is
    refused before any read -- a smaller buffer would be read past its end."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    f = rng.standard_normal((1, 2, 9, 32)).astype(np.float32)
    c = quantized(rng, (1, 2, 9, 32), 8, 32)
    c.data = c.data[:, :, :4]
    with pytest.raises(ValueError, match=r"k\.data has shape"):
        fastattn.attention(q, c, f)
    c = quantized(rng, (1, 2, 9, 32), 8, 32)
    c.bits = 4
    with pytest.raises(ValueError, match=r"v\.data has shape"):
        fastattn.attention(q, f, c)
    c = quantized(rng, (1, 2, 9, 32), 8, 32)
    c.group_size = 5
    with pytest.raises(ValueError, match=r"k\.group_size"):
        fastattn.attention(q, c, f)


@pytest.mark.parametrize("bits", [4, 8])
def test_empty_cache(bits):
    """Lk = 0 (a size-0 array's strides may all be 0): out 0, lse -inf, or the sink."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal((2, 4, 3, 64)).astype(np.float32)
    for c in (quantize_kv(np.zeros((2, 4, 0, 64), np.float32), bits=bits),
              QuantizedKV(np.zeros((2, 4, 0, 64 // (8 // bits)), np.uint8), np.zeros((2, 4, 0, 1), np.float32),
                          np.zeros((2, 4, 0, 1), np.float32), bits=bits, group_size=64)):
        out, lse = fastattn.attention(q, c, c, return_lse=True)
        assert out.shape == q.shape and not out.any() and np.all(lse == -np.inf)
        sinks = np.linspace(-1, 1, 4).astype(np.float32)
        out, lse = fastattn.attention(q, c, c, sinks=sinks, return_lse=True)
        assert not out.any()
        np.testing.assert_array_equal(lse, np.broadcast_to(sinks[:, None], lse.shape))
