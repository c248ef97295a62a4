"""attention_backward (and torch autograd) through the forward's other cache
formats: int8 / float8 keys and values with k_scale / v_scale, and
fastattn.QuantizedKV caches.  The gradients are with respect to the values the
forward computed with; the reference is checked against the float64 backward of
those values built here from the documented fields, the kernels against the
reference."""
import zlib

import numpy as np
import pytest

import fastattn
from fastattn import reference
from fastattn._quantized import QuantizedKV, quantize_kv
from fa_testutil import dequantized

try:
    import ml_dtypes
except ImportError:     # the float8 cases skip with their reason
    ml_dtypes = None


def rng_for(*key):
    """A generator seeded by the test's parameters (crc32: the same in every process)."""
    return np.random.default_rng(zlib.crc32(repr(("bwd-kv",) + key).encode()))


def close(got, want, tol=2e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w)
        scale = max(1.0, float(np.max(np.abs(w)))) if np.size(w) else 1.0
        t = 2e-3 if g.dtype == np.float16 else tol      # a float16 input's gradient is rounded to it
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=t, atol=t * scale)


def forward(q, k, v, **opts):
    return fastattn.attention(q, k, v, return_lse=True, **opts)


OPTIONS = [{}, {"causal": "bottom_right"}, {"window": (5, 0), "softcap": 20.0},
           {"sinks": np.array([0.5, -1.0, 2.0, 0.0])}]


@pytest.mark.parametrize("bits, G", [(4, 16), (4, 32), (8, 8), (8, 32)])
@pytest.mark.parametrize("opt", range(len(OPTIONS)))
def test_reference_backward_of_a_quantized_cache_is_that_of_its_values(bits, G, opt):
    rng = rng_for("ref", bits, G, opt)
    B, Hq, Hkv, Lq, Lk, D = 1, 4, 2, 6, 19, 32
    q = rng.standard_normal((B, Hq, Lq, D))
    kc = quantize_kv(rng.standard_normal((B, Hkv, Lk, D)).astype(np.float32), bits=bits, group_size=G)
    vc = quantize_kv(rng.standard_normal((B, Hkv, Lk, D)).astype(np.float32), bits=bits, group_size=G)
    kf, vf = dequantized(kc), dequantized(vc)
    o = OPTIONS[opt]
    out, lse = reference.attention(q, kf, vf, return_lse=True, **o)
    g = rng.standard_normal(out.shape)
    want = reference.attention_backward(g, q, kf, vf, out, lse, **o)
    got = reference.attention_backward(g, q, kc, vc, out, lse, **o)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert got[1].shape == kc.shape and got[2].shape == vc.shape


@pytest.mark.parametrize("per", ["key", "channel", "tensor"])
def test_reference_backward_of_scaled_int8_is_that_of_its_values(per):
    rng = rng_for("ref-i8", per)
    q = rng.standard_normal((2, 3, 5, 16))
    k = rng.integers(-127, 128, (2, 3, 11, 16)).astype(np.int8)
    v = rng.integers(-127, 128, (2, 3, 11, 16)).astype(np.int8)
    shape = {"key": (2, 3, 11, 1), "channel": (3, 1, 16), "tensor": ()}[per]
    ks = rng.uniform(0.001, 0.02, shape)
    vs = rng.uniform(0.001, 0.02, shape)
    kf, vf = k * ks, v * vs
    out, lse = reference.attention(q, kf, vf, return_lse=True)
    g = rng.standard_normal(out.shape)
    want = reference.attention_backward(g, q, kf, vf, out, lse)
    got = reference.attention_backward(g, q, k, v, out, lse, k_scale=ks, v_scale=vs)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="k_scale"):
        reference.attention_backward(g, q, kf, vf, out, lse, k_scale=ks)
    with pytest.raises(TypeError, match="k_scale"):
        reference.attention_backward(g, q, quantize_kv(kf.astype(np.float32)), vf, out, lse, k_scale=ks)


@pytest.mark.parametrize("kind", [("q4", "q4"), ("q8", "q8"), ("q4", "f32"), ("f32", "q8"), ("q8", "f16")])
@pytest.mark.parametrize("opt", range(len(OPTIONS)))
@pytest.mark.parametrize("Lq", [1, 7, 33])
def test_kernel_backward_through_quantized_caches(kind, opt, Lq):
    rng = rng_for("kernel", kind, opt, Lq)
    B, Hq, Hkv, Lk, D, G = 2, 4, 2, 45, 32, 16

    def make(k):
        x = rng.standard_normal((B, Hkv, Lk, D)).astype(np.float32)
        if k == "f32":
            return x
        if k == "f16":
            return x.astype(np.float16)
        return quantize_kv(x, bits=4 if k == "q4" else 8, group_size=G)

    q = rng.standard_normal((B, Hq, Lq, D)).astype(np.float32)
    k, v = make(kind[0]), make(kind[1])
    o = OPTIONS[opt]
    out, lse = forward(q, k, v, **o)
    g = rng.standard_normal(out.shape).astype(np.float32)
    got = fastattn.attention_backward(g, q, k, v, out, lse, **o)
    want = reference.attention_backward(g, q, k, v, out, lse, **o)
    close(got, want)
    for grad, x in zip(got[1:], (k, v)):
        assert grad.shape == tuple(x.shape)
        assert grad.dtype == (np.float16 if getattr(x, "dtype", None) == np.float16 else np.float32)
    # the same bits for any thread count
    one = fastattn.attention_backward(g, q, k, v, out, lse, num_threads=1, **o)
    two = fastattn.attention_backward(g, q, k, v, out, lse, num_threads=2, **o)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_kernel_backward_float64_query_with_a_quantized_cache():
    rng = rng_for("f64")
    q = rng.standard_normal((1, 2, 4, 64))
    kc = quantize_kv(rng.standard_normal((1, 2, 30, 64)).astype(np.float32), bits=4)
    vc = quantize_kv(rng.standard_normal((1, 2, 30, 64)).astype(np.float32), bits=8, group_size=16)
    out, lse = forward(q, kc, vc, causal="bottom_right")
    g = rng.standard_normal(out.shape)
    got = fastattn.attention_backward(g, q, kc, vc, out, lse, causal="bottom_right")
    want = reference.attention_backward(g, q, kc, vc, out, lse, causal="bottom_right")
    assert all(x.dtype == np.float64 for x in got)
    close(got, want, tol=1e-9)


@pytest.mark.parametrize("store", ["int8", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("per", ["key", "channel", "head"])
def test_kernel_backward_of_scaled_caches(store, per):
    if store != "int8" and ml_dtypes is None:
        pytest.skip("float8 caches need ml_dtypes (pip install ml_dtypes)")
    rng = rng_for("scaled", store, per)
    B, Hq, Hkv, Lq, Lk, D = 1, 4, 2, 5, 37, 32
    q = rng.standard_normal((B, Hq, Lq, D)).astype(np.float32)
    if store == "int8":
        k = rng.integers(-127, 128, (B, Hkv, Lk, D)).astype(np.int8)
        v = rng.integers(-127, 128, (B, Hkv, Lk, D)).astype(np.int8)
    else:
        dt = getattr(ml_dtypes, store)
        k = rng.standard_normal((B, Hkv, Lk, D)).astype(dt)
        v = rng.standard_normal((B, Hkv, Lk, D)).astype(dt)
    shape = {"key": (B, Hkv, Lk, 1), "channel": (Hkv, 1, D), "head": (Hkv, 1, 1)}[per]
    ks = rng.uniform(0.01, 0.1, shape).astype(np.float32)
    vs = rng.uniform(0.01, 0.1, shape).astype(np.float32)
    before = (k.copy(), v.copy(), ks.copy(), vs.copy())
    out, lse = forward(q, k, v, k_scale=ks, v_scale=vs, causal=True)
    g = rng.standard_normal(out.shape).astype(np.float32)
    got = fastattn.attention_backward(g, q, k, v, out, lse, k_scale=ks, v_scale=vs, causal=True)
    want = reference.attention_backward(g, q, k, v, out, lse, k_scale=ks, v_scale=vs, causal=True)
    close(got, want)
    assert got[1].shape == k.shape and got[1].dtype == np.float32
    for a, b in zip(before, (k, v, ks, vs)):
        np.testing.assert_array_equal(a.view(np.uint8) if a.dtype.itemsize == 1 else a,
                                      b.view(np.uint8) if b.dtype.itemsize == 1 else b)


def test_backward_errors_before_work():
    rng = rng_for("errors")
    q = rng.standard_normal((1, 2, 3, 32)).astype(np.float32)
    c = quantize_kv(rng.standard_normal((1, 2, 9, 32)).astype(np.float32), bits=4, group_size=16)
    f = rng.standard_normal((1, 2, 9, 32)).astype(np.float32)
    i8 = rng.integers(-127, 128, (1, 2, 9, 32)).astype(np.int8)
    out, lse = forward(q, c, f)
    g = np.ones_like(out)
    with pytest.raises(TypeError, match="k_scale is given for a QuantizedKV"):
        fastattn.attention_backward(g, q, c, f, out, lse, k_scale=np.float32(2))
    with pytest.raises(TypeError, match="v_scale is given for v of dtype float32"):
        fastattn.attention_backward(g, q, c, f, out, lse, v_scale=np.float32(2))
    with pytest.raises(ValueError, match="k_scale with shape"):
        fastattn.attention_backward(g, q, i8, f, out, lse, k_scale=np.ones((3, 1, 1), np.float32))
    bad = QuantizedKV(c.data, c.scale, c.zero, bits=4, group_size=16)
    bad.data = c.data[..., :8]          # replaced after construction: checked again
    with pytest.raises(ValueError, match="k.data has shape"):
        fastattn.attention_backward(g, q, bad, f, out, lse)
    masked = np.ma.masked_array(np.ones((2, 1, 1), np.float32), mask=[[[True]], [[False]]])
    with pytest.raises(TypeError, match="k_scale"):
        fastattn.attention_backward(g, q, i8, f, out, lse, k_scale=masked)


def test_torch_autograd_through_quantized_and_scaled_caches():
    torch = pytest.importorskip("torch")
    from fastattn.integrations.torch import attention as tattention
    rng = rng_for("torch")
    q = rng.standard_normal((1, 4, 5, 32)).astype(np.float32)
    kc = quantize_kv(rng.standard_normal((1, 2, 12, 32)).astype(np.float32), bits=4, group_size=16)
    vf = rng.standard_normal((1, 2, 12, 32)).astype(np.float32)
    g = rng.standard_normal((1, 4, 5, 32)).astype(np.float32)
    qt = torch.from_numpy(q.copy()).requires_grad_()
    vt = torch.from_numpy(vf.copy()).requires_grad_()
    out = tattention(qt, kc, vt, causal="bottom_right")
    out.backward(torch.from_numpy(g))
    ro, rl = reference.attention(q, kc, vf, causal="bottom_right", return_lse=True)
    dq, _, dv = reference.attention_backward(g, q, kc, vf, ro, rl, causal="bottom_right")
    close((qt.grad.numpy(), vt.grad.numpy()), (dq, dv))
    # an int8 tensor cache with its scales: the query's gradient
    k8 = torch.from_numpy(rng.integers(-127, 128, (1, 2, 12, 32)).astype(np.int8))
    ks = torch.from_numpy(rng.uniform(0.01, 0.05, (1, 2, 12, 1)).astype(np.float32))
    qt = torch.from_numpy(q.copy()).requires_grad_()
    out = tattention(qt, k8, torch.from_numpy(vf), k_scale=ks)
    out.backward(torch.from_numpy(g))
    ro, rl = reference.attention(q, k8.numpy(), vf, k_scale=ks.numpy(), return_lse=True)
    dq = reference.attention_backward(g, q, k8.numpy(), vf, ro, rl, k_scale=ks.numpy())[0]
    close((qt.grad.numpy(),), (dq,))
