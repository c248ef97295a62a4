"""reference: attention sinks, the specification (issue 34).

Checked against the eager formula written here (the sink as an extra score
column, softmax, the column dropped) and against torch autograd for ``dsinks``.
Runs without the compiled kernels (fa_testutil loads reference.py by path).
"""
from __future__ import annotations

import numpy as np
import pytest

from fa_testutil import reference as R
from fa_testutil import torch_or_skip


def eager_sinks(q, k, v, sinks, *, scale=None, causal=False, mask=None, bias=None, softcap=None):
    """Scores, the sink column appended (not scaled, capped, biased or masked),
    a softmax over the row, the column dropped.  Returns (out, weights, lse)."""
    d = q.shape[-1]
    scale = 1 / np.sqrt(d) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    lq, lk = s.shape[-2:]
    vis = np.ones(s.shape, dtype=bool)
    if causal:
        vis &= np.tril(np.ones((lq, lk), dtype=bool))
    if mask is not None:
        vis &= mask
    s = np.where(vis, s, -np.inf)
    sink_col = np.broadcast_to(np.asarray(sinks, dtype=float)[..., None, None], s.shape[:-1] + (1,))
    full = np.concatenate([s, sink_col], axis=-1)
    m = full.max(axis=-1, keepdims=True)
    e = np.exp(full - m)
    tot = e.sum(axis=-1, keepdims=True)
    p = e / tot
    lse = (m + np.log(tot))[..., 0]
    w = p[..., :-1]
    return w @ v, w, lse


def _qkv(rng, b=2, h=3, lq=5, lk=7, d=8, dv=6):
    return (rng.standard_normal((b, h, lq, d)), rng.standard_normal((b, h, lk, d)),
            rng.standard_normal((b, h, lk, dv)))


@pytest.mark.parametrize("opts", [
    {}, {"causal": True}, {"softcap": 2.0, "scale": 0.7}, {"bias": True}, {"mask": True},
])
@pytest.mark.parametrize("sink_shape", [(3,), (2, 3), (1, 3), ()])
def test_reference_sinks_match_eager(rng, opts, sink_shape):
    q, k, v = _qkv(rng)
    sinks = rng.standard_normal(sink_shape) * 2
    kw = dict(opts)
    if kw.pop("bias", False):
        kw["bias"] = rng.standard_normal((2, 3, 5, 7))
    if kw.pop("mask", False):
        kw["mask"] = rng.random((2, 1, 5, 7)) > 0.4
    sink_b = np.broadcast_to(sinks, (2, 3))
    out_e, w_e, lse_e = eager_sinks(q, k, v, sink_b, **kw)
    out, w, lse = R.attention(q, k, v, sinks=sinks, return_weights=True, return_lse=True, **kw)
    np.testing.assert_allclose(out, out_e, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w, w_e, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, lse_e, rtol=1e-12, atol=1e-12)
    assert np.all(w.sum(-1) < 1)


def test_reference_sinks_not_scaled_capped_or_biased(rng):
    """The sink column is the raw sink: scale, softcap, bias and ALiBi change
    the keys' scores only (a row whose keys all score 0 puts exp(sink) beside Lk)."""
    q = np.zeros((1, 2, 4))
    k = np.zeros((1, 3, 4))
    v = np.ones((1, 3, 2))
    out, lse = R.attention(q, k, v, sinks=[1.5], scale=3.0, softcap=0.5, alibi_slopes=[0.0],
                           bias=np.zeros((2, 3)), return_lse=True)
    np.testing.assert_allclose(out, 3 / (3 + np.exp(1.5)), rtol=1e-14)
    np.testing.assert_allclose(lse, np.log(3 + np.exp(1.5)), rtol=1e-14)


def test_reference_sinks_no_visible_key(rng):
    q, k, v = _qkv(rng, b=1, h=2)
    sinks = np.array([0.3, -2.0])
    out, w, lse = R.attention(q, k, v, sinks=sinks, kv_lengths=0, return_weights=True, return_lse=True)
    assert np.all(out == 0) and np.all(w == 0)
    np.testing.assert_array_equal(lse, np.broadcast_to(sinks[:, None], lse.shape))
    # -inf sinks change nothing, also for a row without keys (lse -inf)
    out0, lse0 = R.attention(q, k, v, causal=True, return_lse=True)
    out1, lse1 = R.attention(q, k, v, causal=True, sinks=[-np.inf, -np.inf], return_lse=True)
    np.testing.assert_array_equal(out0, out1)
    np.testing.assert_array_equal(lse0, lse1)


def test_reference_sinks_errors(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="sinks"):
        R.attention(q, k, v, sinks=np.zeros(4))
    with pytest.raises(TypeError, match="sinks"):
        R.attention(q, k, v, sinks=np.zeros(3, dtype=complex))
    with pytest.raises(ValueError, match="sinks"):
        R.attention_backward(q[..., :6], q, k, v, q[..., :6], q[..., 0], return_dsinks=True)


def test_reference_merge_with_sinks(rng):
    q, k, v = _qkv(rng, lk=11)
    sinks = rng.standard_normal(3)
    full, lse_full = R.attention(q, k, v, sinks=sinks, return_lse=True)
    parts = [R.attention(q, k[..., a:b, :], v[..., a:b, :], return_lse=True) for a, b in ((0, 4), (4, 11))]
    out, lse = R.merge_attention([p[0] for p in parts], [p[1] for p in parts], sinks=sinks)
    np.testing.assert_allclose(out, full, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, lse_full, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="sinks"):
        R.merge_attention([p[0] for p in parts], [p[1] for p in parts], sinks=np.zeros(5))


def test_reference_varlen_and_paged_sinks(rng):
    hq, hkv, d = 4, 2, 8
    cu = np.array([0, 3, 3, 8])
    cuk = np.array([0, 5, 7, 13])
    q = rng.standard_normal((hq, 8, d))
    k = rng.standard_normal((hkv, 13, d))
    v = rng.standard_normal((hkv, 13, d))
    sinks = rng.standard_normal(hq)
    out, lse = R.attention_varlen(q, k, v, cu, cuk, causal="bottom_right", sinks=sinks, return_lse=True)
    for s in range(3):
        a, b = cu[s], cu[s + 1]
        if a == b:
            continue
        kk = np.repeat(k[:, cuk[s]:cuk[s + 1]], 2, axis=0)
        vv = np.repeat(v[:, cuk[s]:cuk[s + 1]], 2, axis=0)
        lk = cuk[s + 1] - cuk[s]
        mask = np.arange(lk)[None, :] <= np.arange(b - a)[:, None] + lk - (b - a)
        o_e, _, l_e = eager_sinks(q[:, a:b], kk, vv, sinks, mask=mask)
        np.testing.assert_allclose(out[:, a:b], o_e, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(lse[:, a:b], l_e, rtol=1e-12)
    # paged: one sequence of 5 keys in blocks of 2
    kc = rng.standard_normal((4, hkv, 2, d))
    vc = rng.standard_normal((4, hkv, 2, d))
    qp = rng.standard_normal((1, hq, 1, d))
    table = np.array([[2, 0, 3]])
    got, lse_p = R.attention_paged(qp, kc, vc, table, [5], sinks=sinks, return_lse=True)
    ks = np.concatenate([kc[b] for b in table[0]], axis=1)[:, :5]
    vs = np.concatenate([vc[b] for b in table[0]], axis=1)[:, :5]
    o_e, _, l_e = eager_sinks(qp[0], np.repeat(ks, 2, axis=0), np.repeat(vs, 2, axis=0), sinks)
    np.testing.assert_allclose(got[0], o_e, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse_p[0], l_e, rtol=1e-12)


@pytest.mark.parametrize("sink_shape", [(3,), (2, 3), (2, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_dsinks_match_torch(rng, sink_shape, causal):
    torch = torch_or_skip()
    q, k, v = _qkv(rng)
    k[0, 0, 1:] += 3.0            # some rows lean on few keys: the sink matters
    sinks = rng.standard_normal(sink_shape)
    go = rng.standard_normal((2, 3, 5, 6))
    out, lse = R.attention(q, k, v, sinks=sinks, causal=causal, return_lse=True)
    dq, dk, dv, ds = R.attention_backward(go, q, k, v, out, lse, sinks=sinks, causal=causal,
                                          return_dsinks=True)
    assert ds.shape == sinks.shape
    tq, tk, tv, ts = (torch.tensor(a, requires_grad=True) for a in (q, k, v, sinks))
    s = tq @ tk.transpose(-1, -2) / np.sqrt(8)
    if causal:
        s = s.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), -torch.inf)
    col = torch.broadcast_to(ts, (2, 3))[..., None, None].expand(2, 3, 5, 1)
    p = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]
    (p @ tv * torch.tensor(go)).sum().backward()
    for mine, t in ((dq, tq), (dk, tk), (dv, tv), (ds, ts)):
        np.testing.assert_allclose(mine, t.grad.numpy(), rtol=1e-10, atol=1e-12)
