"""bfloat16 queries and keys: scores from exact bfloat16 products (the
avx512_bf16 / neon_bf16 variants multiply them with pair dot products, other
variants widen them to float32 first); either way the result is the float32
computation of the stored values, and at least as accurate as torch's bfloat16
scaled_dot_product_attention on the same inputs."""
import numpy as np
import pytest

import fastattn
from fa_testutil import rms_rel_err
from fastattn import reference as R

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def f64(x):
    return np.asarray(x).astype(np.float64)


@pytest.mark.parametrize("shape", [(1, 2, 300, 64), (2, 3, 77, 128), (1, 1, 40, 2), (1, 2, 129, 62),
                                   (1, 1, 64, 63)])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_scores_match_float64(shape, causal, rng):
    q, k, v = (rng.standard_normal(shape).astype(BF16) for _ in range(3))
    o, lse = fastattn.attention(q, k, v, causal=causal, return_lse=True)
    want, want_lse = R.attention(f64(q), f64(k), f64(v), causal=causal, return_lse=True)
    # lse carries the scores' float32 rounding only: exact products, float32 sums
    assert np.abs(lse - want_lse).max() <= 4e-6 * max(1.0, np.abs(want_lse).max())
    # the output: float32 result rounded once to bfloat16
    np.testing.assert_allclose(f64(o), want, rtol=2.0 ** -8, atol=2.0 ** -9)


def test_bf16_keys_strided_and_mixed(rng):
    """Key rows that are not contiguous, and a float32 query with bfloat16 keys,
    take the widened path: the same answer to float32 rounding."""
    q, k, v = (rng.standard_normal((1, 2, 200, 64)).astype(BF16) for _ in range(3))
    kt = np.ascontiguousarray(np.swapaxes(k, -1, -2))
    ks = np.swapaxes(kt, -1, -2)                      # same values, column stride != 1
    want = R.attention(f64(q), f64(k), f64(v))
    for qq, kk in ((q, ks), (q.astype(np.float32), k)):
        out, lse = fastattn.attention(qq, kk, v, return_lse=True)
        np.testing.assert_allclose(f64(out), want, rtol=2.0 ** -8, atol=2.0 ** -9)
        np.testing.assert_allclose(lse, R.attention(f64(q), f64(k), f64(v), return_lse=True)[1], rtol=2e-6)


def test_bf16_error_at_most_torch(rng):
    torch = pytest.importorskip("torch")
    q, k, v = (rng.standard_normal((1, 8, 512, 64)).astype(BF16) for _ in range(3))
    want = R.attention(f64(q), f64(k), f64(v), causal=True)
    ours = f64(fastattn.attention(q, k, v, causal=True))
    t = [torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v)]
    with torch.no_grad():
        theirs = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True).float().numpy()

    def rel_rms(x):
        return np.sqrt(np.mean((x - want) ** 2) / np.mean(want ** 2))
    assert rel_rms(ours) <= rel_rms(theirs)


@pytest.mark.parametrize("shapes", [((1, 2, 300, 64), (1, 2, 300, 64)), ((2, 4, 77, 63), (2, 2, 90, 63)),
                                    ((1, 1, 40, 2), (1, 1, 33, 2)), ((1, 2, 130, 128), (1, 1, 200, 128))])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_backward_as_accurate_as_rounding(shapes, causal, rng):
    """The backward of bfloat16 q, k, v, dO (S = Q.K^T and dP = dO.V^T from exact
    bfloat16 products: pair dot products where the variant has them, widened values
    elsewhere; float32 sums): each gradient within 5 % of the error of the float64
    reference's gradient rounded to bfloat16 -- grouped heads, odd head dims, D 2."""
    qs, ks = shapes
    q = rng.standard_normal(qs).astype(BF16)
    k, v = (rng.standard_normal(ks).astype(BF16) for _ in range(2))
    out, lse = fastattn.attention(q, k, v, causal=causal, align="bottom_right", return_lse=True)
    g = rng.standard_normal(out.shape).astype(BF16)
    got = fastattn.attention_backward(g, q, k, v, out, lse, causal=causal, align="bottom_right")
    want = R.attention_backward(f64(g), f64(q), f64(k), f64(v), f64(out), f64(lse), causal=causal,
                                align="bottom_right")
    for name, a, w in zip(("dq", "dk", "dv"), got, want):
        assert a.dtype == BF16 and a.shape == w.shape, name
        floor = rms_rel_err(w.astype(BF16), w)
        assert rms_rel_err(a, w) <= 1.05 * floor + 1e-6, (name, rms_rel_err(a, w), floor)
