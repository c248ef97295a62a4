"""reference.attention_backward: the specification of the gradients.

Checked against central finite differences of reference.attention (float64) for
every option, and against torch autograd where torch expresses the same thing.
Runs without the compiled kernels (fa_testutil loads reference.py by path).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fa_testutil import reference as R
from fa_testutil import torch_or_skip


def _loss_grads_fd(fn, arrays, names, h=1e-5):
    """Central differences of fn(**arrays) (a scalar) with respect to each named array."""
    grads = {}
    for name in names:
        x = arrays[name]
        gx = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            old = x[idx]
            x[idx] = old + h
            fp = fn(**arrays)
            x[idx] = old - h
            fm = fn(**arrays)
            x[idx] = old
            gx[idx] = (fp - fm) / (2 * h)
        grads[name] = gx
    return grads


def _check_fd(rng, qs, ks, vs, opts, bias_shape=None, tol=2e-7):
    q = rng.standard_normal(qs)
    k = rng.standard_normal(ks)
    v = rng.standard_normal(vs)
    arrays = {"q": q, "k": k, "v": v}
    if bias_shape is not None:
        arrays["bias"] = rng.standard_normal(bias_shape)
    out, lse = R.attention(q, k, v, return_lse=True, **opts, **({"bias": arrays["bias"]} if bias_shape else {}))
    gout = rng.standard_normal(out.shape)

    def loss(q, k, v, bias=None):
        o = R.attention(q, k, v, bias=bias, **opts)
        return float(np.sum(o * gout))

    fd = _loss_grads_fd(loss, arrays, list(arrays))
    res = R.attention_backward(gout, q, k, v, out, lse, return_dbias=bias_shape is not None,
                               bias=arrays.get("bias"), **opts)
    for name, got in zip(("q", "k", "v", "bias"), res):
        want = fd[name]
        assert got.shape == want.shape, name
        err = np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want)))
        assert err < tol, f"d{name}: {err:.2e} (options {opts})"


OPTION_SETS = [
    {},
    {"causal": True},
    {"causal": "bottom_right"},
    {"window": (1, 0)},
    {"window": (2, 1)},
    {"softcap": 1.5},
    {"alibi_slopes": np.array([0.5, 0.25])},
    {"scale": 0.7},
    {"kv_lengths": np.array([4, 7])},
    {"causal": True, "softcap": 2.0, "window": (3, None), "alibi_slopes": np.array([0.3, 0.1])},
]


@pytest.mark.parametrize("opts", OPTION_SETS, ids=lambda o: ",".join(sorted(o)) or "plain")
def test_finite_differences_options(opts, rng):
    _check_fd(rng, (2, 5, 3), (2, 7, 3), (2, 7, 4), opts)


@pytest.mark.parametrize("bias_shape", [(2, 5, 7), (5, 7), (1, 7), (5, 1), (7,)])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_finite_differences_bias(bias_shape, softcap, rng):
    _check_fd(rng, (2, 5, 3), (2, 7, 3), (2, 7, 4), {"softcap": softcap}, bias_shape=bias_shape)


def test_finite_differences_mask(rng):
    mask = rng.random((5, 7)) < 0.6
    mask[:, 0] = True
    _check_fd(rng, (2, 5, 3), (2, 7, 3), (2, 7, 4), {"mask": mask})


def test_finite_differences_gqa_mqa_broadcast(rng):
    _check_fd(rng, (1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 3), {"causal": "bottom_right"})   # GQA
    _check_fd(rng, (1, 3, 3, 2), (1, 1, 5, 2), (1, 1, 5, 3), {})                           # MQA
    _check_fd(rng, (2, 2, 3, 2), (1, 2, 5, 2), (2, 1, 5, 3), {"softcap": 3.0})             # k, v broadcast
    _check_fd(rng, (3, 2), (2, 5, 2), (2, 5, 3), {"causal": True})                          # q broadcast


def test_empty_rows_zero_gradients(rng):
    q = rng.standard_normal((2, 4, 3))
    k = rng.standard_normal((2, 5, 3))
    v = rng.standard_normal((2, 5, 2))
    bias = rng.standard_normal((4, 5))
    opts = dict(kv_lengths=np.array([0, 5]), causal="bottom_right", bias=bias)
    out, lse = R.attention(q, k, v, return_lse=True, **opts)
    g = rng.standard_normal(out.shape)
    with np.errstate(all="raise"):
        dq, dk, dv, db = R.attention_backward(g, q, k, v, out, lse, return_dbias=True, **opts)
    assert np.all(dq[0] == 0) and np.all(dk[0] == 0) and np.all(dv[0] == 0)
    assert np.all(np.isfinite(dq)) and np.all(np.isfinite(db))
    assert np.any(dq[1] != 0)


def test_dead_pairs_never_contribute(rng):
    """inf/NaN in keys and values past kv_lengths, and in masked-out keys, reach no gradient."""
    q = rng.standard_normal((1, 4, 3))
    k = rng.standard_normal((1, 6, 3))
    v = rng.standard_normal((1, 6, 2))
    mask = np.ones((4, 6), dtype=bool)
    mask[:, 3] = False
    out, lse = R.attention(q, k, v, return_lse=True, kv_lengths=np.array([5]), mask=mask)
    g = rng.standard_normal(out.shape)
    ref = R.attention_backward(g, q, k, v, out, lse, kv_lengths=np.array([5]), mask=mask)
    k2, v2 = k.copy(), v.copy()
    k2[0, 5] = np.nan
    v2[0, 5] = np.inf
    k2[0, 3] = np.inf
    v2[0, 3] = np.nan
    got = R.attention_backward(g, q, k2, v2, out, lse, kv_lengths=np.array([5]), mask=mask)
    for name, a, b in zip("qkv", got, ref):
        np.testing.assert_array_equal(a, b, err_msg=f"d{name}")
    assert np.all(got[1][0, 3] == 0) and np.all(got[2][0, 5] == 0)


def test_nan_query_row_poisons_only_what_it_sees(rng):
    q = rng.standard_normal((4, 3))
    k = rng.standard_normal((5, 3))
    v = rng.standard_normal((5, 2))
    q[1, 0] = np.nan
    out, lse = R.attention(q, k, v, return_lse=True, causal=True)
    g = rng.standard_normal(out.shape)
    dq, dk, dv = R.attention_backward(g, q, k, v, out, lse, causal=True)
    assert np.isnan(dq[1]).all() and np.isfinite(dq[[0, 2, 3]]).all()
    # row 1 sees keys 0, 1: their gradients are NaN, the others are not
    assert np.isnan(dk[:2]).all() and np.isfinite(dk[2:]).all()
    assert np.isnan(dv[:2]).all() and np.isfinite(dv[2:]).all()


def test_errors_name_the_argument(rng):
    q = rng.standard_normal((2, 4, 3))
    k = rng.standard_normal((2, 5, 3))
    v = rng.standard_normal((2, 5, 2))
    out, lse = R.attention(q, k, v, return_lse=True)
    g = np.ones_like(out)
    with pytest.raises(ValueError, match="grad_out"):
        R.attention_backward(g[:, :3], q, k, v, out, lse)
    with pytest.raises(ValueError, match="out has shape"):
        R.attention_backward(g, q, k, v, out[..., :1], lse)
    with pytest.raises(ValueError, match="lse"):
        R.attention_backward(g, q, k, v, out, lse[:, None])
    with pytest.raises(ValueError, match="return_dbias"):
        R.attention_backward(g, q, k, v, out, lse, return_dbias=True)
    with pytest.raises(TypeError, match="grad_out"):
        R.attention_backward(g.astype(complex), q, k, v, out, lse)


# ------------------------------------------------------------------ torch autograd

def _torch_attention(torch, q, k, v, scale, causal=None, mask=None, bias=None, softcap=None,
                     window=None, alibi=None):
    """The reference's score rules as a torch graph (float64), for autograd."""
    Lq, Lk = q.shape[-2], k.shape[-2]
    s = scale * q @ k.transpose(-1, -2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    i = torch.arange(Lq)[:, None]
    j = torch.arange(Lk)[None, :]
    pos = i + Lk - Lq if causal == "bottom_right" else i
    if alibi is not None:
        s = s - alibi[:, None, None] * (pos - j).abs().to(s.dtype)
    vis = torch.ones(Lq, Lk, dtype=torch.bool)
    if causal:
        vis &= j <= pos
    if window is not None:
        vis &= (j >= pos - window[0]) & (j <= pos + window[1])
    if mask is not None:
        vis = vis & torch.from_numpy(mask)
    s = s.masked_fill(~vis, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("opts", [
    {}, {"causal": True}, {"causal": "bottom_right"}, {"softcap": 2.0}, {"window": (3, 1)},
    {"alibi": True}, {"bias": True}, {"mask": True},
    {"causal": True, "softcap": 1.0, "bias": True, "alibi": True},
], ids=lambda o: ",".join(sorted(o)) or "plain")
def test_against_torch_autograd(opts, rng):
    torch = torch_or_skip()
    H, Lq, Lk, D = 3, 9, 12, 5
    q, k, v = (rng.standard_normal((2, H, n, D)) for n in (Lq, Lk, Lk))
    bias = rng.standard_normal((H, Lq, Lk)) if opts.get("bias") else None
    mask = None
    if opts.get("mask"):
        mask = rng.random((Lq, Lk)) < 0.5
        mask[:, -1] = True
    slopes = np.array([0.5, 0.25, 0.125]) if opts.get("alibi") else None
    causal = opts.get("causal")
    window = opts.get("window")
    kw = dict(causal=causal or False, softcap=opts.get("softcap"), window=window, mask=mask,
              bias=bias, alibi_slopes=slopes)
    out, lse = R.attention(q, k, v, return_lse=True, **kw)
    g = rng.standard_normal(out.shape)
    got = R.attention_backward(g, q, k, v, out, lse, return_dbias=bias is not None, **kw)

    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    tb = torch.tensor(bias, requires_grad=True) if bias is not None else None
    to = _torch_attention(torch, tq, tk, tv, 1 / math.sqrt(D), causal=causal, mask=mask, bias=tb,
                          softcap=opts.get("softcap"), window=window,
                          alibi=torch.from_numpy(slopes) if slopes is not None else None)
    np.testing.assert_allclose(to.detach().numpy(), out, rtol=1e-12, atol=1e-12)
    wrt = [tq, tk, tv] + ([tb] if tb is not None else [])
    want = torch.autograd.grad(to, wrt, torch.from_numpy(g))
    for name, a, b in zip("qkvb", got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"d{name}")


def test_against_torch_sdpa_gqa(rng):
    torch = torch_or_skip()
    import torch.nn.functional as F
    q = rng.standard_normal((2, 6, 7, 4))
    k = rng.standard_normal((2, 2, 10, 4))
    v = rng.standard_normal((2, 2, 10, 3))
    out, lse = R.attention(q, k, v, return_lse=True, scale=0.4)
    g = rng.standard_normal(out.shape)
    got = R.attention_backward(g, q, k, v, out, lse, scale=0.4)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    to = F.scaled_dot_product_attention(tq, tk, tv, scale=0.4, enable_gqa=True)
    want = torch.autograd.grad(to, (tq, tk, tv), torch.from_numpy(g))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12)
