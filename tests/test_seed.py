"""The seed lesson's worked example and properties, through the FAST public API.

Raw scores [16, 8, 0] with d_k = 64 -> weights ~ [0.665241, 0.244728, 0.090031];
values [[1,0],[0,1],[1,1]] -> context ~ [0.755272, 0.334759].  No scaling is nearly
one-hot; dividing by 64 is nearly flat.  Weights sum to one, one weight per value
row, values never change the weights, shifting a score row changes nothing, and
the value width may differ from the key width.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import fastattn
from fa_testutil import assert_close, reference as R

SEED_WEIGHTS = np.array([0.665241, 0.244728, 0.090031])
SEED_CONTEXT = np.array([0.755272, 0.334759])
SEED_VALUES = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
FLOATS = [np.float64, np.float32]


def seed_qk(dtype=np.float64, d=64):
    """q (1, d), k (3, d) with q . k = [16, 8, 0] exactly (all entries exact in fp16 too)."""
    q = np.zeros((1, d), dtype=dtype)
    q[0, 0] = 4.0
    q[0, 1] = 4.0
    k = np.zeros((3, d), dtype=dtype)
    k[0, 0], k[0, 1] = 2.0, 2.0  # 8 + 8 = 16
    k[1, 0], k[1, 2] = 2.0, 5.0  # 8
    k[2, 3] = 7.0  # 0
    return q, k


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_public_names():
    for name in ("attention", "scaled_dot_product_attention", "softmax", "log_softmax", "merge_attention"):
        assert callable(getattr(fastattn, name))


@pytest.mark.parametrize("dtype", FLOATS)
def test_seed_softmax(dtype):
    scores = (np.array([16.0, 8.0, 0.0]) / math.sqrt(64)).astype(dtype)
    w = fastattn.softmax(scores)
    assert w.dtype == dtype
    np.testing.assert_allclose(w, SEED_WEIGHTS, atol=1e-6)
    np.testing.assert_allclose(w.astype(np.float64) @ SEED_VALUES, SEED_CONTEXT, atol=1e-6)
    assert abs(float(w.astype(np.float64).sum()) - 1.0) < (1e-6 if dtype == np.float32 else 1e-14)
    # max subtraction changes nothing
    assert_close(fastattn.softmax(scores - scores.max()), w, dtype)


@pytest.mark.parametrize("dtype", FLOATS + [np.float16])
def test_seed_attention(dtype):
    q, k = seed_qk(dtype)
    np.testing.assert_array_equal(q.astype(np.float64) @ k.T.astype(np.float64), [[16.0, 8.0, 0.0]])
    v = SEED_VALUES.astype(dtype)
    out, w, lse = fastattn.attention(q, k, v, return_weights=True, return_lse=True)
    assert out.dtype == dtype
    atol = 1e-6 if dtype != np.float16 else 1e-3
    np.testing.assert_allclose(np.asarray(w, np.float64)[0], SEED_WEIGHTS, atol=atol)
    np.testing.assert_allclose(out.astype(np.float64)[0], SEED_CONTEXT, atol=atol)
    np.testing.assert_allclose(float(lse[0]), math.log(math.exp(2) + math.exp(1) + 1), rtol=1e-6)
    assert out.shape == (1, 2)  # value width 2 != key width 64
    assert np.asarray(w).shape == (1, 3)  # one weight per value row
    # the same through scaled_dot_product_attention with an explicit scale
    out2 = fastattn.scaled_dot_product_attention(q, k, v, scale=1 / 8)
    np.testing.assert_allclose(out2.astype(np.float64)[0], SEED_CONTEXT, atol=atol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_seed_no_scaling_is_nearly_one_hot(dtype):
    q, k = seed_qk(dtype)
    out, w = fastattn.attention(q, k, SEED_VALUES.astype(dtype), scale=1.0, return_weights=True)
    assert w[0, 0] > 0.999
    np.testing.assert_allclose(w[0], [1 / (1 + math.exp(-8) + math.exp(-16)),
                                      math.exp(-8) / (1 + math.exp(-8) + math.exp(-16)),
                                      math.exp(-16) / (1 + math.exp(-8) + math.exp(-16))],
                               rtol=1e-5, atol=1e-9)
    assert fastattn.softmax(np.array([16.0, 8.0, 0.0], dtype=dtype))[0] > 0.999


@pytest.mark.parametrize("dtype", FLOATS)
def test_seed_divide_by_d_is_nearly_flat(dtype):
    q, k = seed_qk(dtype)
    _, w = fastattn.attention(q, k, SEED_VALUES.astype(dtype), scale=1.0 / 64, return_weights=True)
    w = np.asarray(w, np.float64)[0]
    assert w.max() / w.min() < 1.3
    np.testing.assert_allclose(w, R.softmax(np.array([0.25, 0.125, 0.0])), rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rows_sum_to_one(dtype, rng):
    q = rng.standard_normal((2, 3, 37, 16)).astype(dtype)
    k = rng.standard_normal((2, 3, 70, 16)).astype(dtype)
    v = rng.standard_normal((2, 3, 70, 5)).astype(dtype)
    _, w = fastattn.attention(q, k, v, return_weights=True)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(w, np.float64).sum(-1), 1.0, atol=tol)
    assert (np.asarray(w) >= 0).all()
    s = fastattn.softmax(rng.standard_normal((9, 33)).astype(dtype) * 4)
    np.testing.assert_allclose(s.astype(np.float64).sum(-1), 1.0, atol=tol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("Lq,Lk", [(3, 3), (5, 17), (64, 200)])
def test_identity_values_return_the_weights(dtype, Lq, Lk, rng):
    q = rng.standard_normal((Lq, 8)).astype(dtype)
    k = rng.standard_normal((Lk, 8)).astype(dtype)
    eye = np.eye(Lk, dtype=dtype)
    rows = fastattn.attention(q, k, eye)
    want = R.softmax((q.astype(np.float64) @ k.T.astype(np.float64)) / math.sqrt(8))
    assert_close(rows, want, dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(rows.astype(np.float64).sum(-1), 1.0, atol=tol)
    _, w = fastattn.attention(q, k, eye, return_weights=True)
    assert_close(rows, w, dtype)
    # the weights do not change when the values change
    v2 = rng.standard_normal((Lk, Lk)).astype(dtype)
    _, w2 = fastattn.attention(q, k, v2, return_weights=True)
    np.testing.assert_array_equal(w, w2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_output_linear_in_v(dtype, rng):
    q = rng.standard_normal((2, 19, 32)).astype(dtype)
    k = rng.standard_normal((2, 45, 32)).astype(dtype)
    v1 = rng.standard_normal((2, 45, 24)).astype(dtype)
    v2 = rng.standard_normal((2, 45, 24)).astype(dtype)
    a, b = dtype(1.5), dtype(-0.25)
    lhs = fastattn.attention(q, k, a * v1 + b * v2)
    rhs = a * fastattn.attention(q, k, v1).astype(np.float64) + b * fastattn.attention(q, k, v2).astype(np.float64)
    assert_close(lhs, rhs, dtype, tol=3 * (1e-5 if dtype == np.float32 else 1e-12))


@pytest.mark.parametrize("dtype", FLOATS)
def test_row_constant_shift_changes_nothing(dtype, rng):
    q = rng.standard_normal((11, 16)).astype(dtype)
    k = rng.standard_normal((23, 16)).astype(dtype)
    v = rng.standard_normal((23, 4)).astype(dtype)
    base, w0 = fastattn.attention(q, k, v, return_weights=True)
    c = (rng.standard_normal((11, 1)) * 10).astype(dtype)
    shifted, w1 = fastattn.attention(q, k, v, bias=np.broadcast_to(c, (11, 23)), return_weights=True)
    assert_close(shifted, base, dtype)
    assert_close(w1, w0, dtype)
    x = rng.standard_normal((7, 29)).astype(dtype)
    assert_close(fastattn.softmax(x + dtype(30)), fastattn.softmax(x).astype(np.float64), dtype)
    assert_close(fastattn.softmax(x - x.max(-1, keepdims=True)), fastattn.softmax(x).astype(np.float64), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("Dk,Dv", [(64, 2), (2, 64), (7, 129), (128, 1)])
def test_value_width_differs_from_key_width(dtype, Dk, Dv, rng):
    q = rng.standard_normal((3, 10, Dk)).astype(dtype)
    k = rng.standard_normal((3, 12, Dk)).astype(dtype)
    v = rng.standard_normal((3, 12, Dv)).astype(dtype)
    out = fastattn.attention(q, k, v)
    assert out.shape == (3, 10, Dv) and out.dtype == dtype
    assert_close(out, R.attention(q, k, v), dtype)
