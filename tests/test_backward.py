"""fastattn.attention_backward against reference.attention_backward (and torch).

float64 gradients within 1e-10 relative RMS of the reference; float32 ones no
further from the float64 reference than twice torch's float32 gradients on the
same inputs; bit-identical for any thread count; every option, alone and
combined; layouts, broadcasting, grouped heads; errors; inf/NaN.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import _dispatch
from fa_testutil import make_layout, reference as R, rms_rel_err, torch_or_skip

F64_TOL = 1e-10
F32_TOL = 3e-5      # relative RMS against the float64 reference (torch's own is ~1e-6 here)


def _err(a, b):
    """Relative RMS error, relative to at least 0.1: with standard-normal inputs the
    products that make a gradient are of order 1, and a gradient that vanishes in
    exact arithmetic (one visible key: dq = dk = 0) leaves rounding noise of
    that order's eps to compare."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if b.size == 0:
        return 0.0
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b * b)), 0.1))


def _inputs(rng, qs, ks, vs, dtype):
    q = rng.standard_normal(qs).astype(dtype)
    k = rng.standard_normal(ks).astype(dtype)
    v = rng.standard_normal(vs).astype(dtype)
    return q, k, v


def _ref_grads(g, q, k, v, return_dbias=False, **opts):
    """reference gradients from float64 copies of the inputs (the exact ones)."""
    q6, k6, v6 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if opts.get("bias") is not None:
        opts = dict(opts, bias=np.asarray(opts["bias"], dtype=np.float64))
    out, lse = R.attention(q6, k6, v6, return_lse=True, **opts)
    return R.attention_backward(np.asarray(g, dtype=np.float64), q6, k6, v6, out, lse,
                                return_dbias=return_dbias, **opts)


def _check(rng, qs, ks, vs, dtype=np.float64, return_dbias=False, layout=None, num_threads=None, **opts):
    q, k, v = _inputs(rng, qs, ks, vs, dtype)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    g = rng.standard_normal(out.shape).astype(out.dtype)
    args = [g, q, k, v, out, lse]
    if layout is not None:
        args = [make_layout(a, layout) for a in args]
    got = fastattn.attention_backward(*args, return_dbias=return_dbias, num_threads=num_threads, **opts)
    want = _ref_grads(g, q, k, v, return_dbias=return_dbias, **opts)
    names = ("dq", "dk", "dv", "dbias")
    tol = F64_TOL if np.dtype(dtype) == np.float64 else F32_TOL
    for name, a, b, x in zip(names, got, want, (q, k, v, opts.get("bias"))):
        assert a.shape == b.shape, f"{name}: shape {a.shape} != {b.shape}"
        assert a.dtype == np.asarray(x).dtype, f"{name}: dtype {a.dtype}"
        assert np.isfinite(a).all(), f"{name}: not finite"
        err = _err(a, b)
        assert err <= tol, f"{name}: relative RMS error {err:.2e} > {tol:.0e} ({dtype.__name__}, {opts})"
    return got


# ------------------------------------------------------------------ every option

def _opts(name, rng, H, Lq, Lk):
    mask = rng.random((Lq, Lk)) < 0.6
    mask[:, 0] = True
    return {
        "plain": {},
        "scale": {"scale": 0.3},
        "causal": {"causal": True},
        "causal-br": {"causal": "bottom_right"},
        "window": {"window": (17, 4)},
        "window-left": {"window": (40, None)},
        "mask": {"mask": mask},
        "bias": {"bias": rng.standard_normal((H, Lq, Lk))},
        "kv_lengths": {"kv_lengths": np.array([[Lk, Lk // 3, 1]])[:, :H]},
        "softcap": {"softcap": 1.5},
        "alibi": {"alibi_slopes": 2.0 ** -np.arange(1, H + 1)},
        "combined": {"causal": "bottom_right", "window": (60, 2), "mask": mask, "softcap": 3.0,
                     "bias": rng.standard_normal((H, Lq, Lk)), "alibi_slopes": np.full(H, 0.1),
                     "kv_lengths": np.array([[Lk - 5, Lk, Lk // 2]])[:, :H]},    # per head: (1, H)
    }[name]


OPTION_NAMES = ["plain", "scale", "causal", "causal-br", "window", "window-left", "mask", "bias",
                "kv_lengths", "softcap", "alibi", "combined"]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", OPTION_NAMES)
def test_options_match_reference(name, dtype, rng):
    H, Lq, Lk = 3, 203, 150          # several query and key blocks, partial last ones, Lq != Lk
    opts = _opts(name, rng, H, Lq, Lk)
    if opts.get("bias") is not None:
        opts["bias"] = opts["bias"].astype(dtype)
    _check(rng, (1, H, Lq, 40), (1, H, Lk, 40), (1, H, Lk, 24), dtype, **opts)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 1, 5, 1), (2, 1, 1, 7), (1, 2, 33, 33), (1, 1, 97, 193),
                                   (2, 2, 300, 17)])
@pytest.mark.parametrize("D", [1, 8, 33, 64, 130])
def test_lengths_and_head_dims(shape, D, rng):
    B, H, Lq, Lk = shape
    for dtype in (np.float64, np.float32):
        _check(rng, (B, H, Lq, D), (B, H, Lk, D), (B, H, Lk, D + 5), dtype, causal="bottom_right")


@pytest.mark.parametrize("layout", ["transposed", "negative", "sliced", "fortran", "readonly"])
def test_layouts(layout, rng):
    _check(rng, (2, 3, 70, 20), (2, 3, 110, 20), (2, 3, 110, 12), np.float64, layout=layout, causal=True)
    _check(rng, (2, 3, 70, 20), (2, 3, 110, 20), (2, 3, 110, 12), np.float32, layout=layout, softcap=2.0)


def test_grouped_heads_and_broadcasting(rng):
    for dtype in (np.float64, np.float32):
        _check(rng, (2, 6, 45, 16), (2, 2, 130, 16), (2, 2, 130, 9), dtype, causal=True)   # GQA
        _check(rng, (1, 4, 1, 16), (1, 1, 300, 16), (1, 1, 300, 16), dtype)                # MQA decode
        _check(rng, (3, 4, 50, 8), (1, 4, 60, 8), (1, 4, 60, 8), dtype, window=(10, 10))   # shared k, v
        _check(rng, (4, 50, 8), (3, 4, 60, 8), (3, 4, 60, 8), dtype)                       # shared q
        _check(rng, (2, 4, 50, 8), (2, 1, 60, 8), (1, 1, 60, 8), dtype,                    # both
               kv_lengths=np.array([[50], [60]]))


@pytest.mark.parametrize("bias_shape", [(2, 3, 70, 90), (3, 70, 90), (70, 90), (1, 3, 1, 90), (90,),
                                        (2, 1, 70, 1), (70, 1)])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_dbias(bias_shape, softcap, rng):
    bias = rng.standard_normal(bias_shape)
    for dtype in (np.float64, np.float32):
        got = _check(rng, (2, 3, 70, 16), (2, 3, 90, 16), (2, 3, 90, 16), dtype, return_dbias=True,
                     bias=bias.astype(dtype), softcap=softcap, causal="bottom_right")
        assert got[3].shape == bias_shape


def test_dbias_with_grouped_heads(rng):
    _check(rng, (2, 4, 70, 16), (2, 2, 90, 16), (2, 2, 90, 16), np.float64, return_dbias=True,
           bias=rng.standard_normal((4, 70, 90)), mask=rng.random((70, 90)) < 0.7)
    _check(rng, (2, 4, 70, 16), (2, 2, 90, 16), (2, 2, 90, 16), np.float64, return_dbias=True,
           bias=rng.standard_normal((2, 1, 70, 90)), window=(5, 5))


def test_long_head_key_groups(rng):
    """One head with many key blocks: the key range is cut into groups whose dq
    partials are summed afterwards."""
    _check(rng, (1, 1, 1100, 32), (1, 1, 1500, 32), (1, 1, 1500, 32), np.float64, causal="bottom_right")
    _check(rng, (1, 1, 1100, 32), (1, 1, 1500, 32), (1, 1, 1500, 32), np.float32, window=(200, 0))


def test_mixed_and_integer_dtypes(rng):
    q = rng.standard_normal((2, 10, 8)).astype(np.float32)
    k = rng.integers(-2, 3, (2, 12, 8))
    v = rng.standard_normal((2, 12, 8)).astype(np.float16)
    out, lse = fastattn.attention(q, k, v, return_lse=True)
    assert out.dtype == np.float64
    g = np.ones_like(out)
    dq, dk, dv = fastattn.attention_backward(g, q, k, v, out, lse)
    assert (dq.dtype, dk.dtype, dv.dtype) == (np.float32, np.float64, np.float16)
    want = _ref_grads(g, q, k, v)
    assert rms_rel_err(dk, want[1]) < 1e-10
    assert rms_rel_err(dq, want[0]) < 1e-6

    q16 = rng.standard_normal((2, 10, 8)).astype(np.float16)
    out, lse = fastattn.attention(q16, q16, q16, return_lse=True)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    dq, dk, dv = fastattn.attention_backward(np.ones_like(out), q16, q16, q16, out, lse)
    assert dq.dtype == np.float16
    want = _ref_grads(np.ones_like(out), q16, q16, q16)
    assert rms_rel_err(dv, want[2]) < 3e-3


# ------------------------------------------------------------------ float16 / bfloat16 read in place

def _half(name):
    if name == "float16":
        return np.dtype(np.float16)
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)


HALF_OPTIONS = ["plain", "causal", "window", "mask", "bias", "kv_lengths", "softcap", "alibi", "combined"]
# variants that multiply bfloat16 q . k and dO . v by pair dot products
PAIR_DOTS = _dispatch.VARIANT in ("avx512_bf16", "neon_bf16")


def _assert_f32_copies(a, b, half, name=""):
    """A float16 / bfloat16 gradient a against b, the gradient of float32 copies of
    the same inputs: equal to b rounded -- or, for bfloat16 on a variant with pair
    dot products (S and dP from the exact products, float32 sums in another order:
    tests/test_bf16_products.py), within one rounding of b."""
    if half == "bfloat16" and PAIR_DOTS:
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        assert np.all(np.abs(a64 - b64) <= 2.0 ** -7 * np.abs(b64) + 1e-5 * np.abs(b64).max()), name
    else:
        assert np.array_equal(a, b.astype(a.dtype)), f"{name}: differs from the float32 copies' gradient"


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", HALF_OPTIONS)
def test_half_inputs_read_in_place(half, name, rng):
    """float16 / bfloat16 q, k, v, grad_out and out are read in place (widened as
    the tiles are packed): the gradients are bit-for-bit those of float32 copies of
    the same arrays (widening is exact), and within the float32 tolerance of the
    float64 reference on the widened inputs, before the rounding to the input
    dtype (grouped heads, Dk != Dv, partial blocks)."""
    dt = _half(half)
    H, Hkv, Lq, Lk = 3, 3, 203, 150
    opts = _opts(name, rng, H, Lq, Lk)
    if name in ("plain", "causal", "softcap"):
        H, Hkv = 4, 2           # grouped heads where no option is per head
    q, k, v = _inputs(rng, (2, H, Lq, 40), (2, Hkv, Lk, 40), (2, Hkv, Lk, 24), dt)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    assert out.dtype == dt
    g = rng.standard_normal(out.shape).astype(dt)
    got = fastattn.attention_backward(g, q, k, v, out, lse, **opts)
    f32 = [x.astype(np.float32) for x in (g, q, k, v, out)]
    same = fastattn.attention_backward(*f32[:5], lse, **opts)
    want = R.attention_backward(*(x.astype(np.float64) for x in (g, q, k, v, out)), lse.astype(np.float64),
                                **opts)
    for name_, a, b, w in zip(("dq", "dk", "dv"), got, same, want):
        assert a.dtype == dt, f"{name_}: dtype {a.dtype}"
        _assert_f32_copies(a, b, half, name_)
        if half == "bfloat16" and PAIR_DOTS:
            assert _err(a, w) <= 1.01 * _err(b.astype(dt), w), name_
        err = _err(b, w)
        assert err <= F32_TOL, f"{name_}: relative RMS error {err:.2e} > {F32_TOL:.0e} ({half}, {opts})"


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "negative"])
def test_half_inputs_any_strides(half, layout, rng):
    """Strided float16 / bfloat16 inputs (rows or elements apart) are read in place
    too, with the gradients of their float32 copies."""
    dt = _half(half)
    q, k, v = _inputs(rng, (2, 3, 70, 20), (2, 3, 110, 20), (2, 3, 110, 12), dt)
    out, lse = fastattn.attention(q, k, v, return_lse=True, causal=True)
    g = rng.standard_normal(out.shape).astype(dt)
    args = [make_layout(a, layout) for a in (g, q, k, v, out, lse)]
    got = fastattn.attention_backward(*args, causal=True)
    same = fastattn.attention_backward(*(a.astype(np.float32) for a in (g, q, k, v, out)), lse, causal=True)
    for a, b in zip(got, same):
        _assert_f32_copies(a, b, half)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_gradients_wide_heads_and_key_groups(half, rng):
    """Head dims past the float32 chunk the dq rows are summed in (256 columns),
    dq summed over key groups (long keys), grouped heads, a broadcast k (its dk is
    summed in float32 and then rounded): the gradients of the float32 copies."""
    dt = _half(half)
    q, k, v = _inputs(rng, (2, 4, 40, 300), (2, 2, 1300, 300), (2, 2, 1300, 260), dt)
    for kk in (k, k[:1]):       # k[:1]: broadcast over the batch
        out, lse = fastattn.attention(q, kk, v, return_lse=True, window=(900, 0), align="bottom_right")
        g = rng.standard_normal(out.shape).astype(dt)
        got = fastattn.attention_backward(g, q, kk, v, out, lse, window=(900, 0), align="bottom_right")
        same = fastattn.attention_backward(*(a.astype(np.float32) for a in (g, q, kk, v, out)), lse,
                                           window=(900, 0), align="bottom_right")
        assert got[1].shape == kk.shape
        for a, b in zip(got, same):
            assert a.dtype == dt
            _assert_f32_copies(a, b, half)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_inputs_are_never_copied(half, rng):
    """A backward over 16 MiB float16 / bfloat16 k and v allocates its results --
    dk and dv in the input dtype, 2x k.nbytes, written by the kernels -- and no
    float32 copy of an input or of a gradient (float32 copies of k and v alone
    would add 4x k.nbytes, float32 dk and dv 4x); tracemalloc sees NumPy's
    allocations."""
    import tracemalloc
    dt = _half(half)
    q, k, v = _inputs(rng, (1, 8, 32, 128), (1, 8, 8192, 128), (1, 8, 8192, 128), dt)
    out, lse = fastattn.attention(q, k, v, return_lse=True)
    g = np.ones_like(out)
    fastattn.attention_backward(g, q, k, v, out, lse)
    tracemalloc.start()
    try:
        fastattn.attention_backward(g, q, k, v, out, lse)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * k.nbytes, f"{peak / k.nbytes:.2f} x k.nbytes allocated"


# ------------------------------------------------------------------ threads

@pytest.mark.parametrize("case", ["one-head", "heads", "dbias-shared", "gqa-decode"])
def test_bit_identical_for_any_thread_count(case, rng):
    if case == "one-head":
        shapes, opts = ((1, 1, 1500, 64), (1, 1, 1500, 64), (1, 1, 1500, 64)), {"causal": True}
    elif case == "heads":
        shapes, opts = ((3, 4, 300, 64),) * 3, {"window": (100, 0)}
    elif case == "dbias-shared":
        shapes = ((4, 2, 200, 32),) * 3
        opts = {"bias": rng.standard_normal((2, 200, 200)).astype(np.float32), "softcap": 5.0}
    else:
        shapes, opts = ((2, 16, 3, 64), (2, 2, 2000, 64), (2, 2, 2000, 64)), {}
    q, k, v = _inputs(rng, *shapes, np.float32)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    g = rng.standard_normal(out.shape).astype(np.float32)
    dbias = "bias" in opts
    results = [fastattn.attention_backward(g, q, k, v, out, lse, num_threads=n, return_dbias=dbias, **opts)
               for n in (1, 2, 3, 8)]
    for res in results[1:]:
        for a, b in zip(res, results[0]):
            assert np.array_equal(a, b)


# ------------------------------------------------------------------ float32 accuracy against torch

@pytest.mark.parametrize("case", ["plain", "causal", "gqa", "mask", "long-keys"])
def test_float32_error_within_twice_torch(case, rng):
    torch = torch_or_skip()
    import torch.nn.functional as F
    B, Hq, Hk, Lq, Lk, D = 1, 4, 4, 256, 256, 64
    kw, opts = {}, {}
    if case == "causal":
        kw, opts = {"is_causal": True}, {"causal": True}
    elif case == "gqa":
        Hk = 2
        kw = {"enable_gqa": True}
    elif case == "mask":
        mask = rng.random((Lq, Lk)) < 0.5
        mask[:, 0] = True
        kw, opts = {"attn_mask": torch.from_numpy(mask)}, {"mask": mask}
    elif case == "long-keys":
        B, Hq, Hk, Lq, Lk = 1, 1, 1, 64, 4096
    q = (2 * rng.standard_normal((B, Hq, Lq, D))).astype(np.float32)
    k = (2 * rng.standard_normal((B, Hk, Lk, D))).astype(np.float32)
    v = rng.standard_normal((B, Hk, Lk, D)).astype(np.float32)
    g = rng.standard_normal((B, Hq, Lq, D)).astype(np.float32)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    ours = fastattn.attention_backward(g, q, k, v, out, lse, **opts)
    exact = _ref_grads(g, q, k, v, **opts)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    to = F.scaled_dot_product_attention(tq, tk, tv, **kw)
    theirs = torch.autograd.grad(to, (tq, tk, tv), torch.from_numpy(g))
    for name, a, t, e in zip(("dq", "dk", "dv"), ours, theirs, exact):
        err, terr = rms_rel_err(a, e), rms_rel_err(t.numpy(), e)
        assert err <= 2 * terr, f"{name}: fastattn error {err:.2e} > 2 x torch's {terr:.2e}"


def test_float64_matches_torch_sdpa(rng):
    torch = torch_or_skip()
    import torch.nn.functional as F
    q, k, v = _inputs(rng, (2, 4, 130, 32), (2, 2, 170, 32), (2, 2, 170, 20), np.float64)
    out, lse = fastattn.attention(q, k, v, return_lse=True, causal="bottom_right", scale=0.2)
    g = rng.standard_normal(out.shape)
    got = fastattn.attention_backward(g, q, k, v, out, lse, causal="bottom_right", scale=0.2)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    mask = torch.ones(130, 170, dtype=torch.bool).tril(diagonal=170 - 130)
    to = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, scale=0.2, enable_gqa=True)
    want = torch.autograd.grad(to, (tq, tk, tv), torch.from_numpy(g))
    for a, b in zip(got, want):
        assert rms_rel_err(a, b.numpy()) < F64_TOL


# ------------------------------------------------------------------ empty rows, inf and NaN

def test_rows_without_keys_get_zero_gradients(rng):
    q, k, v = _inputs(rng, (2, 3, 40, 16), (2, 3, 30, 16), (2, 3, 30, 16), np.float32)
    mask = np.ones((40, 30), dtype=bool)
    mask[5:9] = False
    opts = dict(kv_lengths=np.array([[0, 30, 7], [30, 1, 0]]), causal="bottom_right", mask=mask)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    g = rng.standard_normal(out.shape).astype(np.float32)
    with np.errstate(all="raise"):
        dq, dk, dv = fastattn.attention_backward(g, q, k, v, out, lse, **opts)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    assert np.all(dq[0, 0] == 0) and np.all(dk[0, 0] == 0) and np.all(dv[1, 2] == 0)
    assert np.all(dq[:, :, 5:9] == 0)        # masked rows
    assert np.all(dq[:, :, :10] == 0)        # bottom-right causal: rows 0..9 see no key
    want = _ref_grads(g, q, k, v, **opts)
    for a, b in zip((dq, dk, dv), want):
        assert rms_rel_err(a, b) < F32_TOL


def test_invisible_garbage_never_reaches_a_gradient(rng):
    """inf/NaN in keys and values past kv_lengths, in masked-out keys, and in the
    output gradient of rows that see no key: the gradients are those of clean inputs."""
    for dtype in (np.float64, np.float32):
        q, k, v = _inputs(rng, (1, 2, 120, 16), (1, 2, 200, 16), (1, 2, 200, 16), dtype)
        mask = np.ones((120, 200), dtype=bool)
        mask[:, 50] = False
        opts = dict(kv_lengths=np.array([[150, 200]]), mask=mask)         # per head: (1, H)
        out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
        g = rng.standard_normal(out.shape).astype(dtype)
        clean = fastattn.attention_backward(g, q, k, v, out, lse, **opts)
        k2, v2 = k.copy(), v.copy()
        k2[0, 0, 160] = np.nan
        v2[0, 0, 170] = np.inf
        k2[:, :, 50] = np.inf
        v2[:, :, 50] = np.nan
        dirty = fastattn.attention_backward(g, q, k2, v2, out, lse, **opts)
        for a, b in zip(dirty, clean):
            np.testing.assert_array_equal(a, b)
        # rows that see no key (lse -inf) may carry garbage output gradients
        mask2 = mask.copy()
        mask2[7] = False
        out, lse = fastattn.attention(q, k, v, return_lse=True, mask=mask2)
        g2 = g.copy()
        g2[0, 1, 7] = np.nan
        dq, dk, dv = fastattn.attention_backward(g2, q, k, v, out, lse, mask=mask2)
        assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()


def test_nan_propagates_as_in_the_reference(rng):
    q, k, v = _inputs(rng, (1, 2, 110, 16), (1, 2, 130, 16), (1, 2, 130, 16), np.float64)
    q[0, 0, 3, 2] = np.nan
    v[0, 1, 100, 0] = np.inf
    out, lse = fastattn.attention(q, k, v, return_lse=True, causal=True)
    g = rng.standard_normal(out.shape)
    got = fastattn.attention_backward(g, q, k, v, out, lse, causal=True)
    want = R.attention_backward(g, q, k, v, out, lse, causal=True)
    for a, b in zip(got, want):
        # inf * (tiny probability) is inf, times one that rounded to 0 NaN: which of
        # the two a poisoned entry holds depends on rounding, that it is poisoned not
        assert np.array_equal(np.isfinite(a), np.isfinite(b))
        fin = np.isfinite(b)
        assert rms_rel_err(a[fin], b[fin]) < F64_TOL


def test_inputs_are_not_written(rng):
    q, k, v = _inputs(rng, (2, 2, 100, 16), (2, 2, 120, 16), (2, 2, 120, 16), np.float32)
    bias = rng.standard_normal((2, 100, 120)).astype(np.float32)
    out, lse = fastattn.attention(q, k, v, return_lse=True, bias=bias)
    g = rng.standard_normal(out.shape).astype(np.float32)
    arrays = (g, q, k, v, out, lse, bias)
    copies = [a.copy() for a in arrays]
    for a in arrays:
        a.setflags(write=False)
    fastattn.attention_backward(g, q, k, v, out, lse, bias=bias, return_dbias=True)
    for a, c in zip(arrays, copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("qs,ks", [((2, 0, 8), (2, 5, 8)), ((2, 4, 8), (2, 0, 8)), ((0, 4, 8), (0, 5, 8))])
def test_empty_dimensions(qs, ks, rng):
    q = rng.standard_normal(qs)
    k = rng.standard_normal(ks)
    out, lse = fastattn.attention(q, k, k, return_lse=True)
    dq, dk, dv = fastattn.attention_backward(np.ones_like(out), q, k, k, out, lse)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
    assert not dq.any() and not dk.any() and not dv.any()


# ------------------------------------------------------------------ errors

def _valid(rng):
    q, k, v = _inputs(rng, (2, 3, 10, 8), (2, 3, 12, 8), (2, 3, 12, 6), np.float32)
    out, lse = fastattn.attention(q, k, v, return_lse=True)
    return np.ones_like(out), q, k, v, out, lse


@pytest.mark.parametrize("which,change,exc,match", [
    (0, lambda a: a[..., :5], ValueError, "grad_out has shape"),
    (0, lambda a: a.astype(np.float64), TypeError, "grad_out has dtype"),
    (0, lambda a: a.astype(complex), TypeError, "grad_out"),
    (4, lambda a: a[:, :1], ValueError, "out has shape"),
    (4, lambda a: a.astype(np.float16), TypeError, "out has dtype"),
    (5, lambda a: a[..., None], ValueError, "lse has shape"),
    (5, lambda a: a.astype(np.float64), TypeError, "lse has dtype"),
    (1, lambda a: a[..., :4], ValueError, "q and k"),
    (3, lambda a: a[..., :5, :], ValueError, "k and v"),
])
def test_argument_errors(which, change, exc, match, rng):
    args = list(_valid(rng))
    args[which] = change(args[which])
    with pytest.raises(exc, match=match):
        fastattn.attention_backward(*args)


def test_option_errors(rng):
    args = _valid(rng)
    with pytest.raises(ValueError, match="return_dbias"):
        fastattn.attention_backward(*args, return_dbias=True)
    with pytest.raises(TypeError, match="return_dbias"):
        fastattn.attention_backward(*args, bias=np.zeros((10, 12), np.float32), return_dbias="yes")
    with pytest.raises(ValueError, match="softcap"):
        fastattn.attention_backward(*args, softcap=-1.0)
    with pytest.raises(ValueError, match="causal"):
        fastattn.attention_backward(*args, causal="left")
    with pytest.raises(TypeError, match="mask"):
        fastattn.attention_backward(*args, mask=np.ones((10, 12)))
    with pytest.raises(ValueError, match="bias"):
        fastattn.attention_backward(*args, bias=np.zeros((11, 12)))
    with pytest.raises(ValueError, match="kv_lengths"):
        fastattn.attention_backward(*args, kv_lengths=np.array([13, 1]))
    with pytest.raises(ValueError, match="num_threads"):
        fastattn.attention_backward(*args, num_threads=0)
    with pytest.raises(TypeError, match="window"):
        fastattn.attention_backward(*args, window=1.5)
