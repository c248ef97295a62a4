"""The pure-NumPy reference (the specification) checked against independent sources:

* the seed lesson's worked numbers,
* naive pure-Python loops over (i, j) (an independent formula, math.exp / math.fsum),
* scipy.special.softmax / log_softmax,
* the empty-row / non-finite rules.

These tests need no compiled kernels.
"""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from fa_testutil import assert_close, reference as R, rms_rel_err, scipy_special

SEED_WEIGHTS = np.array([0.665241, 0.244728, 0.090031])
SEED_CONTEXT = np.array([0.755272, 0.334759])
SEED_VALUES = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def seed_qk(d=64):
    """q (1, d), k (3, d) with q . k = [16, 8, 0] exactly."""
    q = np.zeros((1, d))
    q[0, 0] = 4.0
    q[0, 1] = 4.0
    k = np.zeros((3, d))
    k[0, 0], k[0, 1] = 2.0, 2.0  # 16
    k[1, 0], k[1, 2] = 2.0, 5.0  # 8
    k[2, 3] = 7.0  # 0
    return q, k


# ------------------------------------------------------------------ naive loops
def naive_attention_2d(q, k, v, *, scale=None, causal=False, mask=None, bias=None,
                       window=None, kv_len=None, softcap=None, slope=None):
    """One head, pure Python; returns (out, weights, lse) as nested lists."""
    q, k, v = np.asarray(q).tolist(), np.asarray(k).tolist(), np.asarray(v).tolist()
    Lq, Lk = len(q), len(k)
    Dk = len(q[0]) if Lq else (len(k[0]) if Lk else 0)
    Dv = len(v[0]) if Lk else 0
    if scale is None:
        scale = 1.0 / math.sqrt(Dk)
    kl = Lk if kv_len is None else int(kv_len)
    if isinstance(window, int):
        window = (window, window)
    outs, weights, lses = [], [], []
    for i in range(Lq):
        p = i + (kl - Lq) if causal == "bottom_right" else i
        scores = {}
        for j in range(Lk):
            if j >= kl:
                continue
            if causal in (True, "top_left") and j > i:
                continue
            if causal == "bottom_right" and j > p:
                continue
            if window is not None:
                lo, hi = window
                if lo is not None and j < p - lo:
                    continue
                if hi is not None and j > p + hi:
                    continue
            if mask is not None and not mask[i][j]:
                continue
            s = math.fsum(q[i][d] * k[j][d] for d in range(Dk)) * scale
            if softcap is not None:
                s = softcap * math.tanh(s / softcap)
            if bias is not None:
                s += bias[i][j]
            if slope is not None:
                s -= slope * abs(p - j)
            scores[j] = s
        finite = [s for s in scores.values() if s != -math.inf]
        if not finite:
            outs.append([0.0] * Dv)
            weights.append([0.0] * Lk)
            lses.append(-math.inf)
            continue
        mx = max(finite)
        ex = {j: math.exp(s - mx) for j, s in scores.items()}
        z = math.fsum(ex.values())
        w = [ex.get(j, 0.0) / z for j in range(Lk)]
        outs.append([math.fsum(w[j] * v[j][c] for j in range(Lk)) for c in range(Dv)])
        weights.append(w)
        lses.append(mx + math.log(z))
    return outs, weights, lses


def naive_softmax_1d(row):
    row = [float(x) for x in row]
    if any(math.isnan(x) or x == math.inf for x in row):
        return [math.nan] * len(row)
    if all(x == -math.inf for x in row):
        return [0.0] * len(row)
    mx = max(row)
    ex = [math.exp(x - mx) for x in row]
    z = math.fsum(ex)
    return [e / z for e in ex]


# ------------------------------------------------------------------ seed example
def test_seed_softmax_numbers():
    w = R.softmax(np.array([16.0, 8.0, 0.0]) / math.sqrt(64))
    np.testing.assert_allclose(w, SEED_WEIGHTS, atol=1e-6)
    np.testing.assert_allclose(w @ SEED_VALUES, SEED_CONTEXT, atol=1e-6)
    assert w.dtype == np.float64
    assert math.isclose(w.sum(), 1.0, rel_tol=1e-15, abs_tol=1e-15)


def test_seed_attention_numbers():
    q, k = seed_qk()
    np.testing.assert_array_equal(q @ k.T, [[16.0, 8.0, 0.0]])
    out, w, lse = R.attention(q, k, SEED_VALUES, return_weights=True, return_lse=True)
    np.testing.assert_allclose(w[0], SEED_WEIGHTS, atol=1e-6)
    np.testing.assert_allclose(out[0], SEED_CONTEXT, atol=1e-6)
    np.testing.assert_allclose(lse[0], math.log(sum(math.exp(s) for s in (2.0, 1.0, 0.0))), rtol=1e-15)


def test_seed_scaling_extremes():
    q, k = seed_qk()
    w1 = R.attention(q, k, SEED_VALUES, scale=1.0, return_weights=True)[1][0]
    assert w1[0] > 0.999  # no scaling: nearly one-hot
    w64 = R.attention(q, k, SEED_VALUES, scale=1.0 / 64, return_weights=True)[1][0]
    assert w64.max() / w64.min() < 1.3  # dividing by d: nearly flat
    np.testing.assert_allclose(w64, R.softmax(np.array([0.25, 0.125, 0.0])), rtol=1e-15)


def test_seed_properties():
    q, k = seed_qk()
    v2 = SEED_VALUES.copy()
    v2[1] = [5.0, -3.0]
    _, w_a = R.attention(q, k, SEED_VALUES, return_weights=True)
    out_b, w_b = R.attention(q, k, v2, return_weights=True)
    np.testing.assert_array_equal(w_a, w_b)  # values never change the weights
    assert w_a.shape == (1, 3)  # one weight per value row
    # subtracting the row max changes nothing
    s = np.array([2.0, 1.0, 0.0])
    np.testing.assert_allclose(R.softmax(s - s.max()), R.softmax(s), rtol=1e-15)
    # value width may differ from key width
    assert out_b.shape == (1, 2)


# ------------------------------------------------------------------ softmax vs scipy
SOFTMAX_SHAPES = [(7,), (3, 5), (2, 3, 4), (4, 1), (1, 9), (2, 1, 3, 5)]


@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
def test_softmax_vs_scipy(shape, rng):
    x = 3 * rng.standard_normal(shape)
    for axis in list(range(-len(shape), len(shape))) + [None]:
        np.testing.assert_allclose(R.softmax(x, axis=axis), scipy_special.softmax(x, axis=axis),
                                   rtol=1e-13, atol=1e-300)
        np.testing.assert_allclose(R.log_softmax(x, axis=axis),
                                   scipy_special.log_softmax(x, axis=axis), rtol=1e-13, atol=1e-13)


def test_softmax_vs_naive_rows(rng):
    x = 10 * rng.standard_normal((6, 11))
    x[1, 3] = -np.inf
    x[2, :] = -np.inf
    x[3, 4] = np.inf
    x[4, 0] = np.nan
    got = R.softmax(x)
    want = np.array([naive_softmax_1d(r) for r in x])
    assert_close(got, want, np.float64)


def test_softmax_int_bool_inputs():
    x = np.array([[1, 2, 3], [0, 0, 0]], dtype=np.int32)
    got = R.softmax(x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, scipy_special.softmax(x.astype(float), axis=-1), rtol=1e-15)
    b = np.array([True, False])
    np.testing.assert_allclose(R.softmax(b), scipy_special.softmax([1.0, 0.0]), rtol=1e-15)
    assert R.softmax(np.float32([1, 2])).dtype == np.float64


def test_softmax_large_values_stable():
    x = np.array([1000.0, 999.0, -1000.0])
    np.testing.assert_allclose(R.softmax(x), scipy_special.softmax(x), rtol=1e-15)
    np.testing.assert_allclose(R.log_softmax(x), scipy_special.log_softmax(x), rtol=1e-15)


def test_softmax_special_rows():
    x = np.array([
        [-np.inf, -np.inf, -np.inf],
        [0.0, np.inf, 1.0],
        [np.nan, 0.0, 1.0],
        [-np.inf, 0.0, -np.inf],
        [np.inf, np.inf, -np.inf],
    ])
    sm = R.softmax(x)
    np.testing.assert_array_equal(sm[0], [0.0, 0.0, 0.0])
    assert np.isnan(sm[1]).all() and np.isnan(sm[2]).all() and np.isnan(sm[4]).all()
    np.testing.assert_array_equal(sm[3], [0.0, 1.0, 0.0])
    ls = R.log_softmax(x)
    np.testing.assert_array_equal(ls[0], [-np.inf] * 3)
    assert np.isnan(ls[1]).all() and np.isnan(ls[2]).all()
    np.testing.assert_array_equal(ls[3], [-np.inf, 0.0, -np.inf])


def test_softmax_empty_and_axis_none():
    assert R.softmax(np.zeros((3, 0))).shape == (3, 0)
    assert R.softmax(np.zeros((0, 4))).shape == (0, 4)
    assert R.log_softmax(np.zeros((0, 4))).shape == (0, 4)
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(R.softmax(x, axis=None).sum(), 1.0, rtol=1e-15)
    np.testing.assert_allclose(R.softmax(np.float64(3.0), axis=None), 1.0)


def test_softmax_errors():
    with pytest.raises(TypeError, match="x"):
        R.softmax(np.array([1 + 2j]))
    with pytest.raises(TypeError):
        R.softmax(np.array(["a", "b"]))
    with pytest.raises(ValueError, match="axis"):
        R.softmax(np.zeros((2, 3)), axis=2)
    with pytest.raises(TypeError, match="axis"):
        R.softmax(np.zeros((2, 3)), axis=1.5)


# ------------------------------------------------------------------ attention vs naive loops
def _batched_naive(q, k, v, *, causal=False, mask=None, bias=None, window=None,
                   kv_lengths=None, softcap=None, alibi_slopes=None, scale=None):
    """q (B, Hq, Lq, D), k/v (B, Hk, Lk, D); GQA via h // g; options per (b, h)."""
    B, Hq, Lq, _ = q.shape
    Hk, Lk = k.shape[1], k.shape[2]
    g = Hq // Hk
    Dv = v.shape[-1]
    out = np.zeros((B, Hq, Lq, Dv))
    wts = np.zeros((B, Hq, Lq, Lk))
    lse = np.zeros((B, Hq, Lq))
    for b in range(B):
        for h in range(Hq):
            kh = h // g
            kw = dict(scale=scale, causal=causal, window=window, softcap=softcap)
            if mask is not None:
                kw["mask"] = np.broadcast_to(mask, (B, Hq, Lq, Lk))[b, h].tolist()
            if bias is not None:
                kw["bias"] = np.broadcast_to(bias, (B, Hq, Lq, Lk))[b, h].tolist()
            if kv_lengths is not None:
                kw["kv_len"] = int(np.broadcast_to(kv_lengths, (B, Hq))[b, h])
            if alibi_slopes is not None:
                kw["slope"] = float(np.broadcast_to(alibi_slopes, (B, Hq))[b, h])
            o, w, l = naive_attention_2d(q[b, h], k[b, kh], v[b, kh], **kw)
            out[b, h] = np.array(o).reshape(Lq, Dv)
            wts[b, h] = np.array(w).reshape(Lq, Lk)
            lse[b, h] = l
    return out, wts, lse


def _random_options(rng, B, Hq, Lq, Lk):
    opts = {}
    if rng.random() < 0.4:
        opts["causal"] = [True, "top_left", "bottom_right"][rng.integers(3)]
    if rng.random() < 0.3:
        opts["mask"] = rng.random((B, 1, Lq, Lk)) < 0.7
    if rng.random() < 0.3:
        opts["bias"] = rng.standard_normal((Hq, Lq, Lk))
    if rng.random() < 0.3:
        w = rng.integers(0, 4)
        opts["window"] = [int(w), (int(w), 0), (None, int(w)), (int(w), None), (1, 2)][rng.integers(5)]
    if rng.random() < 0.3:
        opts["kv_lengths"] = rng.integers(0, Lk + 1, size=(B, 1))
    if rng.random() < 0.25:
        opts["softcap"] = float(rng.uniform(0.5, 5))
    if rng.random() < 0.25:
        opts["alibi_slopes"] = rng.uniform(0.0, 1.0, size=(Hq,))
    if rng.random() < 0.2:
        opts["scale"] = float(rng.uniform(-1, 2))
    return opts


@pytest.mark.parametrize("case", range(40))
def test_attention_vs_naive_random(case):
    rng = np.random.default_rng(1000 + case)
    B = int(rng.integers(1, 3))
    Hk = int(rng.integers(1, 3))
    g = int(rng.choice([1, 1, 2, 3]))
    Hq = Hk * g
    Lq = int(rng.integers(1, 8))
    Lk = int(rng.integers(1, 9))
    D = int(rng.integers(1, 6))
    Dv = int(rng.integers(1, 5))
    q = rng.standard_normal((B, Hq, Lq, D))
    k = rng.standard_normal((B, Hk, Lk, D))
    v = rng.standard_normal((B, Hk, Lk, Dv))
    opts = _random_options(rng, B, Hq, Lq, Lk)
    out, w, lse = R.attention(q, k, v, return_weights=True, return_lse=True, **opts)
    n_out, n_w, n_lse = _batched_naive(q, k, v, **opts)
    assert out.shape == (B, Hq, Lq, Dv) and w.shape == (B, Hq, Lq, Lk) and lse.shape == (B, Hq, Lq)
    assert out.dtype == w.dtype == lse.dtype == np.float64
    assert_close(out, n_out, np.float64, what=f"out {opts}")
    assert_close(w, n_w, np.float64, what=f"weights {opts}")
    np.testing.assert_array_equal(w == 0, n_w == 0)  # exactly the same invisible keys
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(n_lse))
    fin = np.isfinite(n_lse)
    np.testing.assert_allclose(lse[fin], n_lse[fin], rtol=1e-12, atol=1e-12)
    assert not np.isnan(out).any() and not np.isnan(w).any()


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("Lq,Lk", [(3, 5), (5, 3), (4, 4), (1, 6), (6, 1)])
def test_causal_variants_vs_naive(causal, Lq, Lk, rng):
    q, k, v = (rng.standard_normal(s) for s in ((Lq, 3), (Lk, 3), (Lk, 2)))
    out, w, lse = R.attention(q, k, v, causal=causal, return_weights=True, return_lse=True)
    n_out, n_w, n_lse = naive_attention_2d(q, k, v, causal=causal)
    assert_close(out, np.array(n_out).reshape(Lq, 2), np.float64)
    assert_close(w, np.array(n_w).reshape(Lq, Lk), np.float64)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(n_lse))


def test_causal_masks_explicit():
    """Visibility patterns written out by hand."""
    q = np.zeros((3, 1))
    k = np.zeros((5, 1))
    v = np.eye(5)
    w = R.attention(q, k, v, causal=True, return_weights=True)[1]
    np.testing.assert_array_equal(w > 0, [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    w = R.attention(q, k, v, causal="bottom_right", return_weights=True)[1]
    np.testing.assert_array_equal(w > 0, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    # Lq > Lk bottom_right: first Lq - Lk rows see nothing
    q = np.zeros((5, 1))
    k = np.zeros((3, 1))
    w, lse = R.attention(q, k, np.eye(3), causal="bottom_right", return_weights=True, return_lse=True)[1:]
    np.testing.assert_array_equal(w > 0, [[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(lse[:2], [-np.inf, -np.inf])
    # window around the diagonal
    q = np.zeros((4, 1))
    k = np.zeros((4, 1))
    w = R.attention(q, k, np.eye(4), window=(1, 0), return_weights=True)[1]
    np.testing.assert_array_equal(w > 0, [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    w = R.attention(q, k, np.eye(4), window=1, return_weights=True)[1]
    np.testing.assert_array_equal(w > 0, [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]])
    w = R.attention(q, k, np.eye(4), window=(0, 0), return_weights=True)[1]
    np.testing.assert_array_equal(w, np.eye(4))


def test_alibi_explicit():
    q = np.zeros((3, 2))
    k = np.zeros((4, 2))
    slope = 0.7
    w, lse = R.attention(q, k, np.eye(4), alibi_slopes=np.array(slope), return_weights=True,
                         return_lse=True)[1:]
    i = np.arange(3)[:, None]
    j = np.arange(4)[None, :]
    s = -slope * np.abs(i - j)
    np.testing.assert_allclose(w, scipy_special.softmax(s, axis=-1), rtol=1e-14)
    np.testing.assert_allclose(lse, scipy_special.logsumexp(s, axis=-1), rtol=1e-14)


def test_softcap_explicit(rng):
    q, k, v = rng.standard_normal((4, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    s = 3.0 * (q @ k.T)
    c = 2.5
    want = scipy_special.softmax(c * np.tanh(s / c), axis=-1)
    w = R.attention(q, k, v, scale=3.0, softcap=c, return_weights=True)[1]
    np.testing.assert_allclose(w, want, rtol=1e-13)


def test_gqa_matches_repeat_and_mqa(rng):
    q = rng.standard_normal((2, 4, 5, 3))
    k = rng.standard_normal((2, 2, 6, 3))
    v = rng.standard_normal((2, 2, 6, 2))
    got = R.attention(q, k, v)
    for h in range(4):
        want = R.attention(q[:, h], k[:, h // 2], v[:, h // 2])
        assert_close(got[:, h], want, np.float64)
    # MQA: a single kv head (both as a size-1 head axis and via 2-D broadcasting)
    k1, v1 = k[:, :1], v[:, :1]
    a = R.attention(q, k1, v1)
    b = R.attention(q, np.repeat(k1, 4, axis=1), np.repeat(v1, 4, axis=1))
    assert_close(a, b, np.float64)


def test_broadcast_batch_dims(rng):
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((1, 3, 6, 5))
    v = rng.standard_normal((3, 6, 2))
    got = R.attention(q, k, v)
    assert got.shape == (2, 3, 4, 2)
    for b in range(2):
        for h in range(3):
            o, _, _ = naive_attention_2d(q[b, h], k[0, h], v[h])
            assert_close(got[b, h], np.array(o), np.float64)
    # 2-D k/v shared by every batch element
    got = R.attention(q, k[0, 0], v[0])
    assert got.shape == (2, 3, 4, 2)


def test_kv_lengths_shapes(rng):
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((2, 3, 6, 5))
    v = rng.standard_normal((2, 3, 6, 2))
    lens_bh = np.array([[0, 3, 6], [1, 2, 5]])
    out, lse = R.attention(q, k, v, kv_lengths=lens_bh, return_lse=True)
    for b in range(2):
        for h in range(3):
            L = lens_bh[b, h]
            if L == 0:
                np.testing.assert_array_equal(out[b, h], 0.0)
                np.testing.assert_array_equal(lse[b, h], -np.inf)
            else:
                assert_close(out[b, h], R.attention(q[b, h], k[b, h, :L], v[b, h, :L]), np.float64)
    lens_b1 = np.array([[2], [6]])
    out = R.attention(q, k, v, kv_lengths=lens_b1)
    assert_close(out[0], R.attention(q[0], k[0, :, :2], v[0, :, :2]), np.float64)
    assert_close(out[1], R.attention(q[1], k[1], v[1]), np.float64)


# ------------------------------------------------------------------ empty rows / dtypes / return
def test_empty_rows_no_nan_no_warning(rng):
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out, w, lse = R.attention(q, k, v, mask=mask, return_weights=True, return_lse=True)
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(w[1], 0.0)
    assert lse[1] == -np.inf
    np.testing.assert_allclose(w.sum(-1), [1.0, 0.0, 1.0], rtol=1e-15)
    # Lk = 0 and Lq = 0
    out, w, lse = R.attention(q, k[:0], v[:0], return_weights=True, return_lse=True)
    assert out.shape == (3, 2) and w.shape == (3, 0) and lse.shape == (3,)
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(lse, -np.inf)
    out, w, lse = R.attention(q[:0], k, v, return_weights=True, return_lse=True)
    assert out.shape == (0, 2) and w.shape == (0, 5) and lse.shape == (0,)
    # bias of -inf everywhere acts as an empty row
    bias = np.zeros((3, 5))
    bias[2] = -np.inf
    out, lse = R.attention(q, k, v, bias=bias, return_lse=True)
    np.testing.assert_array_equal(out[2], 0.0)
    assert lse[2] == -np.inf
    # empty window: left 0, right 0 but causal bottom_right with Lq>Lk
    out = R.attention(rng.standard_normal((4, 2)), k[:2, :2], v[:2], causal="bottom_right", window=0)
    np.testing.assert_array_equal(out[:2], 0.0)


def test_return_tuple_structure(rng):
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    out = R.attention(q, k, v)
    assert isinstance(out, np.ndarray)
    r = R.attention(q, k, v, return_weights=True)
    assert isinstance(r, tuple) and len(r) == 2 and r[1].shape == (3, 5)
    r = R.attention(q, k, v, return_lse=True)
    assert isinstance(r, tuple) and len(r) == 2 and r[1].shape == (3,)
    r = R.attention(q, k, v, return_weights=True, return_lse=True)
    assert len(r) == 3
    np.testing.assert_array_equal(r[0], out)
    np.testing.assert_allclose(r[2], scipy_special.logsumexp(q @ k.T / 2.0, axis=-1), rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8, np.int64, np.uint16, np.bool_])
def test_attention_input_dtypes_compute_float64(dtype, rng):
    q = (rng.standard_normal((3, 4)) * 2).astype(dtype)
    k = (rng.standard_normal((5, 4)) * 2).astype(dtype)
    v = (rng.standard_normal((5, 2)) * 2).astype(dtype)
    out = R.attention(q, k, v)
    assert out.dtype == np.float64
    want = R.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    np.testing.assert_array_equal(out, want)


def test_attention_rejects_bad_dtypes():
    z = np.zeros((2, 2))
    with pytest.raises(TypeError, match="q"):
        R.attention(z.astype(complex), z, z)
    with pytest.raises(TypeError, match="v"):
        R.attention(z, z, np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(TypeError, match="k"):
        R.attention(z, z.astype(object), z)


def test_attention_shape_errors():
    with pytest.raises(ValueError, match=r"q.*\(2, 3\).*k.*\(2, 4\)"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"k.*v"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="q"):
        R.attention(np.zeros(3), np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="broadcast"):
        R.attention(np.zeros((2, 1, 3)), np.zeros((3, 1, 3)), np.zeros((3, 1, 3)))
    with pytest.raises(ValueError, match="window"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), window=(-1, 0))
    with pytest.raises(ValueError, match="softcap"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), softcap=0.0)
    with pytest.raises(ValueError, match="kv_lengths"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), kv_lengths=3)
    with pytest.raises(ValueError, match="kv_lengths"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), kv_lengths=-1)
    with pytest.raises(TypeError, match="mask"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), mask=np.ones((2, 2)))
    with pytest.raises(ValueError, match="mask"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), mask=np.ones((3, 2), bool))
    with pytest.raises(ValueError, match="bias"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), bias=np.ones((2, 3)))
    with pytest.raises(ValueError, match="alibi_slopes"):
        R.attention(np.zeros((2, 2, 3)), np.zeros((2, 2, 3)), np.zeros((2, 2, 3)),
                    alibi_slopes=np.ones(3))
    with pytest.raises(ValueError, match="causal"):
        R.attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), causal="diagonal")


# ------------------------------------------------------------------ merge_attention
@pytest.mark.parametrize("nparts", [1, 2, 3, 5])
def test_merge_random_key_partition(nparts, rng):
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((2, 3, 11, 5))
    v = rng.standard_normal((2, 3, 11, 2))
    full, full_lse = R.attention(q, k, v, return_lse=True)
    labels = rng.integers(0, nparts, size=11)
    outs, lses = [], []
    for p in range(nparts):
        idx = np.flatnonzero(labels == p)
        o, l = R.attention(q, k[..., idx, :], v[..., idx, :], return_lse=True)
        outs.append(o)
        lses.append(l)
    out, lse = R.merge_attention(outs, lses)
    assert_close(out, full, np.float64)
    np.testing.assert_allclose(lse, full_lse, rtol=1e-13)


def test_merge_with_masks_and_empty_rows(rng):
    q = rng.standard_normal((5, 3))
    k = rng.standard_normal((8, 3))
    v = rng.standard_normal((8, 2))
    mask = rng.random((5, 8)) < 0.5
    mask[0] = False
    full, full_lse = R.attention(q, k, v, mask=mask, return_lse=True)
    a = R.attention(q, k[:3], v[:3], mask=mask[:, :3], return_lse=True)
    b = R.attention(q, k[3:], v[3:], mask=mask[:, 3:], return_lse=True)
    out, lse = R.merge_attention([a[0], b[0]], [a[1], b[1]])
    assert_close(out, full, np.float64)
    np.testing.assert_array_equal(out[0], 0.0)
    assert lse[0] == -np.inf
    fin = np.isfinite(full_lse)
    np.testing.assert_allclose(lse[fin], full_lse[fin], rtol=1e-13)


def test_merge_all_empty():
    outs = [np.zeros((3, 2)), np.ones((3, 2))]
    lses = [np.full(3, -np.inf), np.full(3, -np.inf)]
    out, lse = R.merge_attention(outs, lses)
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(lse, -np.inf)


def test_merge_errors():
    with pytest.raises(ValueError, match="outs"):
        R.merge_attention([], [])
    with pytest.raises(ValueError, match="lses"):
        R.merge_attention([np.zeros((3, 2))], [np.zeros(4)])
    with pytest.raises(ValueError, match="outs"):
        R.merge_attention([np.zeros((3, 2)), np.zeros((3, 3))], [np.zeros(3), np.zeros(3)])


# ------------------------------------------------------------------ consistency of pieces
def test_weights_are_softmax_of_scores(rng):
    q = rng.standard_normal((2, 4, 6))
    k = rng.standard_normal((2, 7, 6))
    v = rng.standard_normal((2, 7, 3))
    bias = rng.standard_normal((4, 7))
    out, w, lse = R.attention(q, k, v, bias=bias, scale=0.3, return_weights=True, return_lse=True)
    s = 0.3 * q @ np.swapaxes(k, -1, -2) + bias
    np.testing.assert_allclose(w, scipy_special.softmax(s, axis=-1), rtol=1e-13)
    np.testing.assert_allclose(lse, scipy_special.logsumexp(s, axis=-1), rtol=1e-13)
    np.testing.assert_allclose(out, w @ v, rtol=1e-13)
    assert rms_rel_err(out, w @ v) < 1e-14


@pytest.mark.parametrize("opts", [dict(causal=True), dict(window=(2, 1)), dict(softcap=1.5),
                                  dict(causal="bottom_right", window=1)])
def test_options_combine_as_intersection(opts, rng):
    """Masking options intersect: equal to an explicit boolean mask of the same pattern."""
    Lq, Lk = 5, 7
    q, k, v = rng.standard_normal((Lq, 3)), rng.standard_normal((Lk, 3)), rng.standard_normal((Lk, 2))
    extra = rng.random((Lq, Lk)) < 0.8
    a, wa = R.attention(q, k, v, mask=extra, return_weights=True, **opts)
    n_out, n_w, _ = naive_attention_2d(q, k, v, mask=extra.tolist(), **opts)
    assert_close(a, np.array(n_out), np.float64)
    assert_close(wa, np.array(n_w), np.float64)


def test_all_combinations_small_grid():
    """Exhaustive small grid of option combinations against the naive loops."""
    rng = np.random.default_rng(7)
    Lq, Lk, D = 4, 5, 2
    q, k, v = rng.standard_normal((Lq, D)), rng.standard_normal((Lk, D)), rng.standard_normal((Lk, 3))
    bias = rng.standard_normal((Lq, Lk))
    mask = rng.random((Lq, Lk)) < 0.75
    for causal, window, kvl, sc, sl, use_bias, use_mask in itertools.product(
            [False, True, "bottom_right"], [None, 1, (0, 2), (None, 0)], [None, 0, 3, 5],
            [None, 2.0], [None, 0.5], [False, True], [False, True]):
        kw = dict(causal=causal, window=window, softcap=sc)
        out, w, lse = R.attention(q, k, v, kv_lengths=kvl, alibi_slopes=sl,
                                  bias=bias if use_bias else None, mask=mask if use_mask else None,
                                  return_weights=True, return_lse=True, **kw)
        n_out, n_w, n_lse = naive_attention_2d(q, k, v, kv_len=kvl, slope=sl,
                                               bias=bias.tolist() if use_bias else None,
                                               mask=mask.tolist() if use_mask else None, **kw)
        assert_close(out, np.array(n_out), np.float64, what=str(kw))
        assert_close(w, np.array(n_w), np.float64, what=str(kw))
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(n_lse))


def test_invisible_values_never_contribute(rng):
    """inf/NaN in values of invisible keys (padding beyond kv_lengths, masked keys) do not leak."""
    q, k, v = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 8, 3)), rng.standard_normal((2, 8, 2))
    kp, vp = k.copy(), v.copy()
    kp[0, 4:] = np.nan
    vp[0, 4:] = np.nan
    vp[1, 7] = np.inf
    lens = np.array([4, 7])
    out = R.attention(q, kp, vp, kv_lengths=lens)
    want = np.stack([R.attention(q[0], k[0, :4], v[0, :4]), R.attention(q[1], k[1, :7], v[1, :7])])
    assert_close(out, want, np.float64)
    mask = np.ones((5, 8), bool)
    mask[:, 2] = False
    v2 = v.copy()
    v2[:, 2] = np.nan
    assert_close(R.attention(q, k, v2, mask=mask), R.attention(q, k, v, mask=mask), np.float64)
    # a visible NaN value still poisons its output column
    v3 = v.copy()
    v3[0, 1, 0] = np.nan
    out = R.attention(q, k, v3)
    assert np.isnan(out[0, :, 0]).all() and not np.isnan(out[0, :, 1]).any()
