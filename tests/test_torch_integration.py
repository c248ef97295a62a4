"""torch tensors in and out, fastattn.scaled_dot_product_attention against torch's,
and the autograd Function (gradcheck in float64 for every option).

The gradient tests call the real ``fastattn.attention_backward`` (issue 25)."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastattn
from fa_testutil import assert_close, child_process_env, reference

torch = pytest.importorskip("torch")
F = torch.nn.functional
from fastattn.integrations import torch as fat  # noqa: E402

TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3}


def _rand(rng, shape, dtype=torch.float32, requires_grad=False):
    t = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
    return t.requires_grad_(requires_grad)


def _close(got, want, dtype=torch.float32):
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
    assert_close(got.detach().double().numpy(), want.detach().double().numpy(), np.float64, tol=TOL[dtype])


# ------------------------------------------------------------------ scaled_dot_product_attention vs torch

MASK_SHAPES = [(1, 9), (6, 9), (2, 1, 6, 9), (1, 4, 6, 9), (2, 4, 1, 9), (4, 1, 1)]


@pytest.mark.parametrize("shape", MASK_SHAPES)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sdpa_masks_match_torch(rng, shape, kind, dtype):
    q, k, v = _rand(rng, (2, 4, 6, 8), dtype), _rand(rng, (2, 4, 9, 8), dtype), _rand(rng, (2, 4, 9, 5), dtype)
    if kind == "bool":
        mask = torch.from_numpy(rng.random(shape) < 0.7)
        mask[..., 0] = True
    else:
        mask = _rand(rng, shape, dtype)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    _close(fastattn.scaled_dot_product_attention(q, k, v, attn_mask=mask), want, dtype)
    # NumPy in, NumPy out: the same numbers
    got = fastattn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), attn_mask=mask.numpy())
    assert isinstance(got, np.ndarray) and got.dtype == q.numpy().dtype
    assert_close(got, want.double().numpy(), np.float64, tol=TOL[dtype])


@pytest.mark.parametrize("Lq,Lk", [(7, 7), (4, 11), (11, 4)])
def test_sdpa_is_causal_and_scale_match_torch(rng, Lq, Lk):
    q, k, v = _rand(rng, (2, 3, Lq, 16)), _rand(rng, (2, 3, Lk, 16)), _rand(rng, (2, 3, Lk, 16))
    for kw in ({"is_causal": True}, {"scale": 0.37}, {"is_causal": True, "scale": 1.5}):
        _close(fastattn.scaled_dot_product_attention(q, k, v, **kw), F.scaled_dot_product_attention(q, k, v, **kw))


@pytest.mark.parametrize("Hq,Hk", [(4, 2), (6, 3), (8, 1), (4, 4)])
def test_sdpa_enable_gqa_matches_torch(rng, Hq, Hk):
    q, k, v = _rand(rng, (2, Hq, 5, 8)), _rand(rng, (2, Hk, 13, 8)), _rand(rng, (2, Hk, 13, 8))
    mask = torch.from_numpy(rng.random((2, 1, 5, 13)) < 0.8)
    mask[..., 0] = True
    for kw in ({}, {"is_causal": True}, {"attn_mask": mask}):
        want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        _close(fastattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw), want)


def test_sdpa_broadcast_batch_dims_match_torch(rng):
    # a shared key/value batch, a single key/value head (broadcast without enable_gqa), 3-D inputs
    q, k, v = _rand(rng, (3, 4, 6, 8)), _rand(rng, (1, 1, 9, 8)), _rand(rng, (1, 1, 9, 8))
    _close(fastattn.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    q, k, v = _rand(rng, (5, 6, 8)), _rand(rng, (5, 9, 8)), _rand(rng, (5, 9, 3))
    _close(fastattn.scaled_dot_product_attention(q, k, v, is_causal=True),
           F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_sdpa_one_dimensional_mask(rng):
    """A 1-D attn_mask broadcasts by NumPy rules, as a (1, S) one (torch itself wants >= 2 dims)."""
    q, k, v = _rand(rng, (2, 4, 6, 8)), _rand(rng, (2, 4, 9, 8)), _rand(rng, (2, 4, 9, 5))
    mask = torch.from_numpy(rng.random(9) < 0.7)
    mask[0] = True
    _close(fastattn.scaled_dot_product_attention(q, k, v, attn_mask=mask),
           F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None]))


def test_sdpa_fully_masked_row_is_zero_like_torch(rng):
    q, k, v = _rand(rng, (1, 2, 4, 8)), _rand(rng, (1, 2, 6, 8)), _rand(rng, (1, 2, 6, 8))
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    got = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    _close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert torch.equal(got[:, :, 2], torch.zeros(1, 2, 8))


def test_sdpa_is_attention(rng):
    """Apart from the names, exactly fastattn.attention's result (bit for bit)."""
    q = rng.standard_normal((2, 4, 7, 16)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, 9, 16)).astype(np.float32), rng.standard_normal((2, 2, 9, 16)).astype(np.float32)
    mask = rng.random((7, 9)) < 0.6
    bias = rng.standard_normal((4, 7, 9)).astype(np.float32)
    sdpa = fastattn.scaled_dot_product_attention
    np.testing.assert_array_equal(sdpa(q, k, v, is_causal=True, enable_gqa=True), fastattn.attention(q, k, v, causal=True))
    np.testing.assert_array_equal(sdpa(q, k, v, mask, enable_gqa=True, scale=0.2),
                                  fastattn.attention(q, k, v, mask=mask, scale=0.2))
    np.testing.assert_array_equal(sdpa(q, k, v, bias, enable_gqa=True), fastattn.attention(q, k, v, bias=bias))
    # array-likes in, NumPy out
    out = sdpa(q[0, 0].tolist(), k[0, 0].tolist(), v[0, 0].tolist())
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    assert_close(out, reference.attention(q[0, 0], k[0, 0], v[0, 0]), np.float32)


@pytest.mark.parametrize("arrays", ["numpy", "torch"])
def test_sdpa_errors_like_torch(rng, arrays):
    conv = (lambda a: a) if arrays == "numpy" else torch.from_numpy
    q = conv(rng.standard_normal((2, 8, 5, 4)).astype(np.float32))
    k = conv(rng.standard_normal((2, 2, 6, 4)).astype(np.float32))
    v = conv(rng.standard_normal((2, 2, 6, 4)).astype(np.float32))
    sdpa = fastattn.scaled_dot_product_attention
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="is_causal"):
        sdpa(q, q, q, conv(np.ones((5, 5), bool)), is_causal=True)
    with pytest.raises(ValueError, match="enable_gqa"):     # torch: "The size of tensor a (8) must match ..."
        sdpa(q, k, v)
    k3 = conv(rng.standard_normal((2, 3, 6, 4)).astype(np.float32))
    with pytest.raises(ValueError, match="divide"):
        sdpa(q, k3, k3, enable_gqa=True)
    with pytest.raises(ValueError, match="same number of heads"):
        sdpa(q, k, v[:, :1], enable_gqa=True)
    with pytest.raises(ValueError, match="head axis"):
        sdpa(q[0, 0], q[0, 0], q[0, 0], enable_gqa=True)
    with pytest.raises(TypeError, match="boolean or floating-point"):
        sdpa(q, q, q, conv(np.ones((5, 5), np.int32)))
    with pytest.raises(TypeError):      # scale and enable_gqa are keyword-only, as in torch
        sdpa(q, q, q, None, 0.0, False, 0.5)
    with pytest.raises(TypeError, match="is_causal"):
        sdpa(q, q, q, is_causal="yes")


def test_sdpa_signature_is_torchs():
    import inspect
    ours = inspect.signature(fastattn.scaled_dot_product_attention)
    assert list(ours.parameters) == ["query", "key", "value", "attn_mask", "dropout_p", "is_causal",
                                     "scale", "enable_gqa"]
    assert [p.default for p in ours.parameters.values()][3:] == [None, 0.0, False, None, False]
    assert fastattn.scaled_dot_product_attention.__doc__.count("Examples") == 1


# ------------------------------------------------------------------ tensors in and out

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_tensors_in_tensors_out(rng, dtype):
    q, k, v = _rand(rng, (2, 3, 6, 8), dtype), _rand(rng, (2, 3, 9, 8), dtype), _rand(rng, (2, 3, 9, 8), dtype)
    out, w, lse = fastattn.attention(q, k, v, causal="bottom_right", return_weights=True, return_lse=True)
    assert all(isinstance(t, torch.Tensor) for t in (out, w, lse))
    assert out.dtype == dtype and w.dtype == dtype
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    want = fastattn.attention(q.numpy(), k.numpy(), v.numpy(), causal="bottom_right", return_weights=True,
                              return_lse=True)
    for got, exp in zip((out, w, lse), want):
        np.testing.assert_array_equal(got.numpy(), exp)
    x = _rand(rng, (4, 7), dtype)
    for f, tf in ((fastattn.softmax, torch.softmax), (fastattn.log_softmax, torch.log_softmax)):
        for axis in (-1, 0):
            got = f(x, axis)
            assert isinstance(got, torch.Tensor) and got.dtype == dtype
            _close(got, tf(x.double(), axis).to(dtype), dtype)
        got = f(x, None)
        _close(got, tf(x.double().reshape(-1), 0).reshape(4, 7).to(dtype), dtype)


def test_strided_tensors_are_read_in_place(rng):
    """Transposed, sliced and expanded (stride 0) tensors: read without a copy, same result."""
    base = _rand(rng, (2, 9, 3, 8))                  # (B, L, H, D) memory, used as (B, H, L, D)
    q = base.transpose(1, 2)
    k = _rand(rng, (2, 3, 18, 8))[:, :, ::2]
    v = _rand(rng, (1, 3, 9, 8)).expand(2, 3, 9, 8)
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        a = fat._tensor_to_array(t, name)
        assert a.ctypes.data == t.data_ptr() and a.strides == tuple(s * t.element_size() for s in t.stride())
    got = fastattn.attention(q, k, v, causal=True)
    np.testing.assert_array_equal(got.numpy(), fastattn.attention(q.contiguous().numpy(), k.contiguous().numpy(),
                                                                  v.contiguous().numpy(), causal=True))
    x = base[:, :, 0]                                # a strided softmax input
    np.testing.assert_array_equal(fastattn.softmax(x).numpy(), fastattn.softmax(x.contiguous().numpy()))


def test_results_share_memory_and_out_is_written_in_place(rng):
    q = _rand(rng, (2, 4, 5, 8))
    out = torch.empty(2, 4, 5, 8)
    res = fastattn.attention(q, q, q, out=out)
    assert res is out
    np.testing.assert_array_equal(out.numpy(), fastattn.attention(q.numpy(), q.numpy(), q.numpy()))
    # a strided out (a (B, L, H, D) buffer seen as (B, H, L, D)) is written in place too
    buf = torch.zeros(2, 5, 4, 8)
    res, lse = fastattn.attention(q, q, q, out=buf.transpose(1, 2), return_lse=True)
    assert res.data_ptr() == buf.data_ptr() and torch.equal(buf.transpose(1, 2), out)
    assert isinstance(lse, torch.Tensor)
    s_out = torch.empty(2, 4, 5, 8)
    assert fastattn.softmax(q, out=s_out) is s_out
    _close(s_out, torch.softmax(q, -1))
    # the result tensor is a view of fastattn's result array, not a copy of it
    a = fastattn.attention(q.numpy(), q.numpy(), q.numpy())
    assert fat._array_to_tensor(a).data_ptr() == a.ctypes.data


def test_inputs_are_not_written(rng):
    q, k, v = _rand(rng, (1, 2, 5, 8)), _rand(rng, (1, 2, 7, 8)), _rand(rng, (1, 2, 7, 8))
    before = [t.clone() for t in (q, k, v)]
    fastattn.attention(q, k, v, causal=True)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))


def test_option_tensors(rng):
    """mask, bias, kv_lengths and alibi_slopes may be tensors; a NumPy q with a tensor
    mask gives a tensor (any tensor argument: tensors out)."""
    qa = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    mask = rng.random((2, 1, 5, 5)) < 0.7
    bias = rng.standard_normal((3, 5, 5)).astype(np.float32)
    lens = np.array([[4], [2]])
    slopes = np.array([0.5, 0.25, 0.125], np.float32)
    want = fastattn.attention(qa, qa, qa, mask=mask, bias=bias, kv_lengths=lens, alibi_slopes=slopes)
    t = torch.from_numpy
    got = fastattn.attention(t(qa), t(qa), t(qa), mask=t(mask), bias=t(bias), kv_lengths=t(lens), alibi_slopes=t(slopes))
    np.testing.assert_array_equal(got.numpy(), want)
    got = fastattn.attention(qa, qa, qa, mask=t(mask), bias=bias, kv_lengths=lens, alibi_slopes=slopes)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), want)


def test_tensor_errors_name_the_argument(rng):
    q = _rand(rng, (1, 2, 4, 8))
    meta = torch.empty(1, 2, 4, 8, device="meta")     # not a CPU tensor (as a CUDA one would be)
    for name, kw in (("k", {}), ("mask", {"mask": torch.ones(4, 4, dtype=torch.bool, device="meta")})):
        args = (q, meta, q) if name == "k" else (q, q, q)
        with pytest.raises(TypeError, match=f"{name}: .*CPU.*'meta'"):
            fastattn.attention(*args, **kw)
    with pytest.raises(TypeError, match="x: .*CPU"):
        fastattn.softmax(meta[0, 0])
    with pytest.raises(TypeError, match="layout"):
        fastattn.softmax(torch.eye(3).to_sparse())
    with pytest.raises(TypeError, match="out: .*autograd"):
        fastattn.attention(q.requires_grad_(), q, q, out=torch.empty(1, 2, 4, 8))


def test_bfloat16_tensors_in_and_out(rng):
    """bfloat16 tensors are read in place (a NumPy bfloat16 view of their memory) and
    the result is a bfloat16 tensor; float32 queries with bfloat16 keys give float32;
    the values are those of the float32 computation on the bfloat16 values."""
    pytest.importorskip("ml_dtypes")
    from fastattn.integrations.torch import _tensor_to_array
    q = _rand(rng, (1, 2, 5, 16))
    k = _rand(rng, (1, 2, 9, 16)).bfloat16()
    view = _tensor_to_array(k, "k")
    assert view.dtype.name == "bfloat16" and view.ctypes.data == k.data_ptr()
    out = fastattn.attention(q.bfloat16(), k, k, causal="bottom_right")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    want = fastattn.attention(q.bfloat16().float().numpy(), k.float().numpy(), k.float().numpy(),
                              causal="bottom_right")
    np.testing.assert_allclose(out.float().numpy(), want, rtol=2 ** -7, atol=1e-3)
    mixed = fastattn.attention(q, k, k)
    assert mixed.dtype == torch.float32
    sd = fastattn.scaled_dot_product_attention(q.bfloat16(), k, k, is_causal=True)
    assert sd.dtype == torch.bfloat16


def test_bfloat16_arrays_become_bfloat16_tensors():
    """The output half of bfloat16 support: an ml_dtypes.bfloat16 array becomes a
    torch.bfloat16 tensor on the same memory, same values."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([[1.5, -2.25], [3.0, 0.0078125]], dtype=ml_dtypes.bfloat16)
    t = fat._array_to_tensor(a)
    assert t.dtype == torch.bfloat16 and t.data_ptr() == a.ctypes.data
    assert torch.equal(t, torch.tensor([[1.5, -2.25], [3.0, 0.0078125]], dtype=torch.bfloat16))


def test_numpy_calls_do_not_import_torch():
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import fastattn, fastattn.integrations
        q = np.ones((1, 2, 4, 8), np.float16)           # float16: the general path
        fastattn.attention(q, q, q, mask=np.ones((4, 4), bool))
        fastattn.scaled_dot_product_attention(q, q, q, np.ones(4, bool))
        fastattn.softmax(q, axis=0)
        assert "torch" not in sys.modules, "torch was imported"
    """)
    env, cwd = child_process_env()
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=cwd)


# ------------------------------------------------------------------ autograd

def _qkv(rng, B=1, Hq=2, Hk=2, Lq=5, Lk=7, D=4, Dv=3):
    return (_rand(rng, (B, Hq, Lq, D), torch.float64, True), _rand(rng, (B, Hk, Lk, D), torch.float64, True),
            _rand(rng, (B, Hk, Lk, Dv), torch.float64, True))


GRAD_CASES = {
    "plain": {},
    "scale": {"scale": 0.7},
    "causal_top_left": {"causal": True},
    "causal_bottom_right": {"causal": "bottom_right"},
    "window": {"window": (2, 1)},
    "causal_window": {"causal": "bottom_right", "window": 3},
    "kv_lengths": {"kv_lengths": np.array([[6, 4]])},
    "softcap": {"softcap": 1.5},
    "alibi": {"alibi_slopes": np.array([0.5, 0.25])},
    "mask": {"mask": np.array([[True, False, True, True, False, True, True]] * 5)},
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradcheck(rng, case):
    q, k, v = _qkv(rng)
    opts = GRAD_CASES[case]
    assert torch.autograd.gradcheck(lambda q, k, v: fat.attention(q, k, v, **opts), (q, k, v))


def test_gradcheck_grouped_heads_and_broadcast_batch(rng):
    q, k, v = _qkv(rng, B=2, Hq=4, Hk=2)
    assert torch.autograd.gradcheck(lambda q, k, v: fat.attention(q, k, v, causal=True), (q, k, v))
    q, k, v = _qkv(rng, B=2)
    k1, v1 = k[:1].detach().requires_grad_(), v[:1].detach().requires_grad_()   # keys shared by the batch
    assert torch.autograd.gradcheck(lambda q, k, v: fat.attention(q, k, v, softcap=2.0), (q, k1, v1))


@pytest.mark.parametrize("bias_shape", [(1, 2, 5, 7), (5, 7), (2, 1, 7)])
def test_gradcheck_bias(rng, bias_shape):
    q, k, v = _qkv(rng)
    bias = _rand(rng, bias_shape, torch.float64, True)
    assert torch.autograd.gradcheck(lambda q, k, v, b: fat.attention(q, k, v, bias=b, causal="bottom_right"),
                                    (q, k, v, bias))


def test_gradients_match_torch_sdpa(rng):
    """The autograd path through fastattn.scaled_dot_product_attention against torch's own backward."""
    q, k, v = _qkv(rng, B=2, Hq=4, Hk=2, Lq=6, Lk=6, D=8, Dv=8)
    mask = torch.from_numpy(rng.random((2, 1, 6, 6)) < 0.7)
    mask[..., 0] = True
    grad = torch.from_numpy(rng.standard_normal((2, 4, 6, 8)))
    for kw in ({"is_causal": True}, {"attn_mask": mask}, {"attn_mask": mask.double() * 0.5}):
        ours = torch.autograd.grad(fastattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw), (q, k, v), grad)
        theirs = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw), (q, k, v), grad)
        for a, b in zip(ours, theirs):
            _close(a, b, torch.float64)


def test_grad_mode_and_constants(rng):
    q, k, v = _qkv(rng)
    out, lse = fastattn.attention(q, k, v, return_lse=True)
    assert out.requires_grad and out.grad_fn is not None and not lse.requires_grad
    with torch.no_grad():
        assert not fastattn.attention(q, k, v).requires_grad
    with pytest.raises(TypeError, match="alibi_slopes"):
        fat.attention(q, k, v, alibi_slopes=torch.ones(2, dtype=torch.float64, requires_grad=True))


@pytest.mark.parametrize("log_mode", [False, True])
def test_softmax_gradcheck(rng, log_mode):
    f = fastattn.log_softmax if log_mode else fastattn.softmax
    x = _rand(rng, (3, 6), torch.float64, True)
    for axis in (-1, 0, None):
        assert torch.autograd.gradcheck(lambda x: f(x, axis), (x,))
        assert torch.autograd.gradgradcheck(lambda x: f(x, axis), (x,))


def test_docstring_examples():
    import doctest

    import fastattn._sdpa
    for module in (fastattn._sdpa, fat):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__
