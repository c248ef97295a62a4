"""The avx512_amx variant: bfloat16 Q.K^T and P.V of the query-vectorised unit by
AMX tiles (fastattn/_kernels/amx_tiles.h), checked against the float64
reference on the shapes where the tiles meet their edges -- key counts that are
not whole blocks of 16, tiles a causal diagonal or a window cuts into runs, head
sizes the tiles do not divide (the pair dot products take those), values with
an inf (the widened path), paged caches, sinks -- and against torch's own AMX
use in the same threads (no tile state assumed or left behind).

The scores are exact bfloat16 products summed in float32 (lse to float32
rounding); P.V rounds P to bfloat16 against each tile's max, as avx512_bf16
does (fa_testutil.within_bf16_p_rounding; the exp of those probabilities has a
relative error of 2.9e-6, far inside that rounding).  Runs where the dispatcher chose
avx512_amx (an AMX CPU under Linux, or FASTATTN_ISA=avx512_amx); elsewhere the
file is skipped with that reason, and the same inputs run on the other variants
in test_bf16_products.py and test_storage.py."""
import numpy as np
import pytest

import fastattn
from fastattn import _dispatch
from fastattn import reference as R
from fa_testutil import within_bf16_p_rounding

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

pytestmark = pytest.mark.skipif(_dispatch.VARIANT != "avx512_amx",
                                reason=f"the avx512_amx variant is not in use (this CPU / build: {_dispatch.VARIANT})")


def f64(x):
    return np.asarray(x).astype(np.float64)


def check(q, k, v, slack=2e-6, **kw):
    out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
    want, want_lse = R.attention(f64(q), f64(k), f64(v), return_lse=True, **kw)
    absw = R.attention(f64(q), f64(k), np.abs(f64(v)), **kw)
    assert out.dtype == BF16
    fin = np.isfinite(want_lse)
    assert np.array_equal(fin, np.isfinite(lse))
    assert np.abs(lse[fin] - want_lse[fin]).max(initial=0) <= 4e-6 * max(1.0, np.abs(want_lse[fin]).max(initial=0))
    assert np.all(within_bf16_p_rounding(out, want, absw, slack=slack))
    return out


@pytest.mark.parametrize("lq, lk", [(16, 16), (33, 47), (64, 129), (130, 300), (200, 1000), (1, 64), (5, 77)])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_tiles_against_float64(lq, lk, d, rng):
    q = rng.standard_normal((1, 2, lq, d)).astype(BF16)
    k, v = (rng.standard_normal((1, 2, lk, d)).astype(BF16) for _ in range(2))
    check(q, k, v)


@pytest.mark.parametrize("causal", [True, "bottom_right"])
@pytest.mark.parametrize("shape", [(1, 2, 300, 64), (2, 1, 257, 128), (1, 3, 100, 32)])
def test_causal_runs(shape, causal, rng):
    """A causal diagonal cuts a tile into key runs seen by some vectors of lanes:
    the tiles take the chunk's whole range (P is 0 where a lane sees no key)."""
    q, k, v = (rng.standard_normal(shape).astype(BF16) for _ in range(3))
    check(q, k, v, causal=causal)


def test_window_lengths_and_sinks(rng):
    q = rng.standard_normal((2, 4, 150, 64)).astype(BF16)
    k, v = (rng.standard_normal((2, 2, 333, 64)).astype(BF16) for _ in range(2))   # GQA, groups of 2
    check(q, k, v, window=(40, 7), causal="bottom_right")
    check(q, k, v, kv_lengths=np.array([[333, 17], [0, 200]]).repeat(2, axis=1))
    check(q, k, v, sinks=rng.standard_normal(4).astype(np.float32))
    check(q, k, v, softcap=5.0, causal=True)


@pytest.mark.parametrize("scale", [None, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("lk", [64, 77, 300])
def test_unscaled_tile_scores(scale, lk, rng):
    """Where only the softmax reads the scores (no option, no mask), the tiles
    leave them unscaled and the softmax applies the scale in one multiply-add
    with the max scaled once; the rows past the last block of 16 (the pair dot
    products) must agree.  Large logits (scale 2.5 on scores of ~+-30) put the
    whole weight on a few keys, where the max's own probability must be 1."""
    q = (3 * rng.standard_normal((1, 2, 70, 64))).astype(BF16)
    k, v = (rng.standard_normal((1, 2, lk, 64)).astype(BF16) for _ in range(2))
    check(q, k, v, scale=scale)
    check(q, k, v, scale=scale, causal=True)


@pytest.mark.parametrize("dk, dv", [(80, 80), (96, 40), (62, 64), (64, 24)])
def test_head_sizes_the_tiles_do_not_divide(dk, dv, rng):
    """Q.K^T by tiles needs D a multiple of 32, P.V a multiple of 16 columns:
    otherwise the pair dot products (or the widened path) do that product."""
    q = rng.standard_normal((1, 2, 70, dk)).astype(BF16)
    k = rng.standard_normal((1, 2, 190, dk)).astype(BF16)
    v = rng.standard_normal((1, 2, 190, dv)).astype(BF16)
    check(q, k, v)


def test_nonfinite_values_and_scores(rng):
    q, k, v = (rng.standard_normal((1, 2, 64, 64)).astype(BF16) for _ in range(3))
    v = v.copy()
    v[0, 0, 5, 3] = np.inf           # a tile with an inf is widened: inf * 0 stays out
    out = fastattn.attention(q, k, v)
    want = R.attention(f64(q), f64(k), f64(v))
    assert np.array_equal(np.isnan(f64(out)), np.isnan(want))
    assert np.array_equal(np.isinf(f64(out)), np.isinf(want))
    k = k.copy()
    k[0, 1, 9, 0] = np.nan           # a NaN key: its row's scores NaN, as the reference
    out = fastattn.attention(q, k, v)
    want = R.attention(f64(q), f64(k), f64(v))
    assert np.array_equal(np.isnan(f64(out)), np.isnan(want))


def test_strided_rows_and_paged_cache(rng):
    """Key rows a stride apart in place; value rows with a column stride (the
    scalar pack); a paged bfloat16 cache read by the query-vectorised unit."""
    q = rng.standard_normal((1, 2, 90, 64)).astype(BF16)
    kbig = rng.standard_normal((1, 2, 200, 128)).astype(BF16)
    k = kbig[..., ::2, :64]
    vt = np.ascontiguousarray(rng.standard_normal((1, 2, 64, 100)).astype(BF16))
    v = np.swapaxes(vt, -1, -2)
    check(q, k, v)
    nb, bs, h, d = 40, 16, 2, 64
    kc = rng.standard_normal((nb, h, bs, d)).astype(BF16)
    vc = rng.standard_normal((nb, h, bs, d)).astype(BF16)
    table = rng.permutation(nb)[:30].reshape(2, 15).astype(np.int32)
    lens = np.array([230, 97], np.int32)
    qp = rng.standard_normal((2, h, 40, d)).astype(BF16)
    out = fastattn.attention_paged(qp, kc, vc, table, lens, causal="bottom_right")
    for s in range(2):
        rows = np.concatenate([np.arange(b * bs, b * bs + bs) for b in table[s]])[:lens[s]]
        kk = kc.transpose(1, 0, 2, 3).reshape(h, nb * bs, d)[:, rows]
        vv = vc.transpose(1, 0, 2, 3).reshape(h, nb * bs, d)[:, rows]
        want = R.attention(f64(qp[s]), f64(kk), f64(vv), causal="bottom_right")
        absw = R.attention(f64(qp[s]), f64(kk), np.abs(f64(vv)), causal="bottom_right")
        assert np.all(within_bf16_p_rounding(out[s], want, absw))


def test_threads_give_the_same_bits(rng):
    q, k, v = (rng.standard_normal((2, 4, 300, 64)).astype(BF16) for _ in range(3))
    a = fastattn.attention(q, k, v, causal=True, num_threads=1)
    b = fastattn.attention(q, k, v, causal=True, num_threads=2)
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


def test_inputs_untouched(rng):
    q, k, v = (rng.standard_normal((1, 2, 100, 64)).astype(BF16) for _ in range(3))
    before = [x.copy() for x in (q, k, v)]
    fastattn.attention(q, k, v, causal=True)
    assert all(np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(before, (q, k, v)))


def test_torch_tiles_unaffected(rng):
    """torch's CPU attention and matmul of bfloat16 use oneDNN's AMX kernels in the
    same threads: their results are the same before and after fastattn's tiles."""
    torch = pytest.importorskip("torch")
    q, k, v = (rng.standard_normal((1, 4, 256, 64)).astype(np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    before = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    mm = tq[0, 0] @ tk[0, 0].T
    qb, kb, vb = (x.astype(BF16) for x in (q, k, v))
    ours = fastattn.attention(qb, kb, vb)
    after = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    assert torch.equal(before, after)
    assert torch.equal(mm, tq[0, 0] @ tk[0, 0].T)
    assert np.array_equal(ours.view(np.uint16), fastattn.attention(qb, kb, vb).view(np.uint16))


def test_bfloat16_peak_is_the_tiles():
    """compare.py reads bfloat16 cases against fma_peak(dtype="bfloat16"): on this
    variant that is a loop of tiles (a pair-dot loop would put the tile kernels
    above 100 % of their ceiling)."""
    k = _dispatch.kernels
    assert k.ceiling_info()["bf16_tiles"] and k.ceiling_info()["bf16_dot"]
    d = k.fma_peak(1, dtype="bfloat16", min_time=0.02, details=True)
    assert list(d["chains"]) == [4]
    # 16 x 16 x 32 products per TDPBF16PS against 16 per float32 FMA
    assert d["gflops"] > 4 * k.fma_peak(1, min_time=0.02)
