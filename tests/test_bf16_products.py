"""bfloat16 queries and keys: scores from exact bfloat16 products (the
avx512_bf16 / neon_bf16 variants multiply them with pair dot products, other
variants widen them to float32 first); either way the scores are the float32
computation of the stored values.  On avx512_bf16 the query-vectorised P.V of
bfloat16 values uses them too (P rounded to bfloat16 against each tile's max):
the output within that rounding of the float64 result
(fa_testutil.within_bf16_p_rounding), and at least as accurate as torch's
bfloat16 scaled_dot_product_attention on the same inputs."""
import numpy as np
import pytest

import fastattn
from fastattn import _dispatch
from fa_testutil import P_ROUNDING_VARIANTS, rms_rel_err, within_bf16_p_rounding
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
    if _dispatch.VARIANT in P_ROUNDING_VARIANTS:
        # P.V by pair dot products (or AMX tiles) too: P rounded to bfloat16 first
        assert np.all(within_bf16_p_rounding(o, want, R.attention(f64(q), f64(k), np.abs(f64(v)), causal=causal)))
    else:
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


@pytest.mark.parametrize("qs, ks, vdt", [((2, 32, 1, 128), (2, 8, 700, 128), BF16),   # GQA decode, groups of 4
                                         ((1, 16, 1, 64), (1, 2, 333, 64), BF16),    # groups of 8
                                         ((1, 4, 5, 64), (1, 4, 300, 64), BF16),     # 5 draft rows: 4 + 1
                                         ((1, 2, 12, 32), (1, 1, 129, 32), BF16),    # 24 rows of a group
                                         ((1, 3, 1, 32), (1, 3, 257, 32), np.float32),  # one row, not fused
                                         ((1, 6, 2, 62), (1, 3, 100, 62), BF16)])    # D 62: widened keys
@pytest.mark.parametrize("opts", [{}, {"causal": True, "align": "bottom_right"}, {"window": (40, 0)},
                                  {"softcap": 5.0, "scale": 0.3}, {"kv_lengths": "half"}, {"sinks": True},
                                  {"return_weights": True}, {"num_threads": 1}, {"num_threads": 2}])
def test_bf16_few_rows_scores(qs, ks, vdt, opts, rng):
    """Units of a few rows (decode, GQA groups, draft tokens): on avx512_bf16 their
    scores of bfloat16 queries and keys come from pair dot products on the key
    rows in place (fa_qk_rows_bd), elsewhere from widened keys; either way exact
    products summed in float32, so lse is the float64 one to float32 rounding,
    under every option, split over threads or not."""
    q = rng.standard_normal(qs).astype(BF16)
    k = rng.standard_normal(ks).astype(BF16)
    v = rng.standard_normal(ks[:-1] + (ks[-1] + 2,)).astype(vdt)
    kw = dict(opts)
    if kw.get("kv_lengths") == "half":
        kw["kv_lengths"] = np.arange(1, qs[0] + 1) * ks[2] // (qs[0] + 1)
    if kw.get("sinks"):
        kw["sinks"] = rng.standard_normal(qs[1]).astype(np.float32)
    weights = kw.pop("return_weights", False)
    res = fastattn.attention(q, k, v, return_lse=True, return_weights=weights, **kw)
    kw.pop("num_threads", None)
    want = R.attention(f64(q), f64(k), f64(v), return_lse=True, return_weights=weights, **kw)
    out, lse = res[0], res[-1]
    fin = np.isfinite(want[-1])
    assert np.array_equal(fin, np.isfinite(lse))
    assert np.abs(lse - want[-1])[fin].max() <= 4e-6 * max(1.0, np.abs(want[-1][fin]).max())
    if out.dtype == BF16:
        np.testing.assert_allclose(f64(out), want[0], rtol=2.0 ** -8, atol=2.0 ** -9)
    else:
        np.testing.assert_allclose(out, want[0], rtol=1e-5, atol=2e-6)
    if weights:
        np.testing.assert_allclose(f64(res[1]), want[1], rtol=2.0 ** -8, atol=1e-6)


@pytest.mark.parametrize("bs", [1, 7, 16])
@pytest.mark.parametrize("lq, g", [(1, 4), (1, 1), (3, 2)], ids=["decode-gqa", "decode", "draft-gqa"])
def test_bf16_paged_few_rows_scores(bs, lq, g, rng):
    """Paged bfloat16 caches in shuffled blocks: the few-rows units (their heads in
    lockstep, keys read run by run) take the pair-dot-product scores on
    avx512_bf16 as the contiguous ones do; lse to float32 rounding."""
    lens = np.array([lq, 2 * bs + 5, 333, lq + 40])
    hkv, d = 2, 64
    need = -(-lens // bs)
    nb = int(need.sum()) + 2
    kc, vc = (rng.standard_normal((nb, hkv, bs, d)).astype(BF16) for _ in range(2))
    order = rng.permutation(nb)
    table = np.zeros((len(lens), int(need.max())), np.int32)
    used = 0
    for s, n in enumerate(need):
        table[s, :n] = order[used:used + n]
        used += n
    q = rng.standard_normal((len(lens), hkv * g, lq, d)).astype(BF16)
    for kw in ({}, {"causal": "bottom_right"}, {"softcap": 3.0, "scale": 0.2},
               {"causal": "bottom_right", "window": (9, 0)}, {"num_threads": 1}):
        out, lse = fastattn.attention_paged(q, kc, vc, table, lens, return_lse=True, **kw)
        kw.pop("num_threads", None)
        want, want_lse = R.attention_paged(f64(q), f64(kc), f64(vc), table, lens, return_lse=True, **kw)
        assert np.abs(lse - want_lse).max() <= 4e-6 * max(1.0, np.abs(want_lse).max())
        if _dispatch.VARIANT == "avx512_bf16" and g * lq > 1:
            # units of two or more rows: P.V by pair dot products (P rounded to bfloat16)
            absw = R.attention_paged(f64(q), f64(kc), np.abs(f64(vc)), table, lens, **kw)
            assert np.all(within_bf16_p_rounding(out, want, absw)), kw
        else:
            np.testing.assert_allclose(f64(out), want, rtol=2.0 ** -8, atol=2.0 ** -9)


@pytest.mark.parametrize("qs, ks", [((2, 32, 1, 128), (2, 8, 700, 128)),    # GQA decode, groups of 4
                                    ((1, 16, 1, 64), (1, 2, 333, 64)),     # groups of 8: blocks of 4 + 4
                                    ((1, 4, 5, 64), (1, 4, 301, 64)),      # 5 draft rows: 4 + 1, odd Lk
                                    ((1, 6, 2, 32), (1, 2, 129, 32)),      # 6 rows: 4 + 2, a tile of one key
                                    ((1, 4, 1, 64), (1, 1, 6000, 64))])    # one unit: keys split over threads
@pytest.mark.parametrize("opts", [{}, {"causal": True, "align": "bottom_right"}, {"window": (40, 0)},
                                  {"softcap": 5.0, "scale": 0.3}, {"kv_lengths": "half"}, {"sinks": True},
                                  {"num_threads": 1}])
def test_bf16_few_rows_pv(qs, ks, opts, rng):
    """Units of two or more rows with bfloat16 queries, keys and values (GQA
    decode, draft tokens): on avx512_bf16 their P.V comes from pair dot products
    too (fa_pv_rows_bd: P rounded to bfloat16 against the tile's largest, two
    keys per instruction), so the output is within the rounding of P of the
    float64 result; lse keeps float32 rounding (l sums the unrounded P); 1 and 2
    threads give the same bits."""
    q = rng.standard_normal(qs).astype(BF16)
    k, v = (rng.standard_normal(ks).astype(BF16) for _ in range(2))
    kw = dict(opts)
    if kw.get("kv_lengths") == "half":
        kw["kv_lengths"] = np.arange(1, qs[0] + 1) * ks[2] // (qs[0] + 1)
    if kw.get("sinks"):
        kw["sinks"] = rng.standard_normal(qs[1]).astype(np.float32)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
    threads = kw.pop("num_threads", None)
    want, want_lse = R.attention(f64(q), f64(k), f64(v), return_lse=True, **kw)
    absw = R.attention(f64(q), f64(k), np.abs(f64(v)), **kw)
    fin = np.isfinite(want_lse)
    assert np.array_equal(fin, np.isfinite(lse))
    assert np.abs(lse - want_lse)[fin].max() <= 4e-6 * max(1.0, np.abs(want_lse[fin]).max())
    assert out.dtype == BF16
    assert np.all(within_bf16_p_rounding(out, want, absw))
    if threads is None:
        np.testing.assert_array_equal(out, fastattn.attention(q, k, v, num_threads=1, **kw))


def test_bf16_few_rows_pv_nonfinite(rng):
    """A GQA decode group whose value rows hold an inf and a NaN: the rows that see
    them get inf / NaN as the float64 reference does, the rows a window keeps
    away from them stay finite and within the rounding of P (inf * 0 never
    reaches them), as with widened values."""
    q = rng.standard_normal((1, 8, 3, 64)).astype(BF16)
    k, v = (rng.standard_normal((1, 2, 300, 64)).astype(BF16) for _ in range(2))
    v[0, 0, 150, 7] = np.inf
    v[0, 1, 20, 9] = np.nan
    for kw in ({}, {"window": (100, 0), "causal": "bottom_right"}):
        got = fastattn.attention(q, k, v, **kw)
        ref = R.attention(f64(q), f64(k), f64(v), **kw)
        np.testing.assert_array_equal(np.isnan(f64(got)), np.isnan(ref))
        np.testing.assert_array_equal(np.isposinf(f64(got)), np.isposinf(ref))
        fin = np.isfinite(ref)
        vz = np.where(np.isfinite(f64(v)), f64(v), 0)
        absw = R.attention(f64(q), f64(k), np.abs(vz), **kw)
        assert np.all(within_bf16_p_rounding(got, ref, absw)[fin]), kw
    assert np.isfinite(f64(fastattn.attention(q, k, v, window=(100, 0), causal="bottom_right")[0, :4])).all()


@pytest.mark.parametrize("qs, ks", [((1, 32, 1, 128), (1, 8, 4096, 128)), ((1, 16, 4, 64), (1, 4, 1024, 64)),
                                    ((4, 8, 1, 128), (4, 1, 2048, 128))])
@pytest.mark.parametrize("qscale", [1.0, 3.0])
def test_bf16_decode_error_at_most_torch(qs, ks, qscale, rng):
    """GQA decode and draft rows of bfloat16 caches: relative RMS error against
    float64 at or below torch's bfloat16 SDPA on the same inputs (its CPU kernel
    rounds P to bfloat16 too), flat and peaked attention."""
    torch = pytest.importorskip("torch")
    q = (rng.standard_normal(qs) * qscale).astype(BF16)
    k, v = (rng.standard_normal(ks).astype(BF16) for _ in range(2))
    want = R.attention(f64(q), f64(k), f64(v))
    ours = f64(fastattn.attention(q, k, v))
    g = qs[1] // ks[1]
    t = [torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v)]
    t[1], t[2] = t[1].repeat_interleave(g, 1), t[2].repeat_interleave(g, 1)
    with torch.no_grad():
        theirs = torch.nn.functional.scaled_dot_product_attention(*t).float().numpy()
    assert rms_rel_err(ours, want) <= rms_rel_err(theirs, want)


@pytest.mark.parametrize("shape, causal, qscale", [((1, 8, 512, 64), True, 1.0), ((1, 8, 1024, 64), False, 1.0),
                                                    ((1, 4, 1024, 128), False, 1.0), ((1, 8, 1024, 64), False, 3.0),
                                                    ((1, 8, 1024, 64), True, 0.2), ((2, 4, 700, 64), True, 1.0)])
def test_bf16_error_at_most_torch(shape, causal, qscale, rng):
    """Relative RMS error against float64, outputs in bfloat16: at or below torch's
    bfloat16 SDPA on the same inputs -- with P.V by pair dot products (P rounded
    to bfloat16 against each tile's max) as with the float32 P.V; flat (q / 5)
    and peaked (q * 3) attention too."""
    torch = pytest.importorskip("torch")
    q = (rng.standard_normal(shape) * qscale).astype(BF16)
    k, v = (rng.standard_normal(shape).astype(BF16) for _ in range(2))
    want = R.attention(f64(q), f64(k), f64(v), causal=causal)
    ours = f64(fastattn.attention(q, k, v, causal=causal))
    t = [torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v)]
    with torch.no_grad():
        theirs = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=causal).float().numpy()
    assert rms_rel_err(ours, want) <= rms_rel_err(theirs, want)


@pytest.mark.parametrize("qs, ks, dv", [((1, 2, 300, 64), (1, 2, 300, 64), 64),     # tiles of 128, 128, 44
                                        ((1, 8, 77, 64), (1, 2, 301, 64), 64),      # GQA, odd Lk
                                        ((2, 3, 130, 48), (2, 3, 257, 48), 33),     # odd Dv, D 48
                                        ((1, 1, 200, 32), (1, 1, 129, 32), 7),      # last tile of one key
                                        ((1, 1, 48, 64), (1, 1, 6000, 64), 64)])    # keys split over threads
def test_bf16_pv_every_option(qs, ks, dv, rng):
    """bfloat16 q, k, v with every option of the forward (masks that cut tiles
    at odd keys, windows, bias, softcap, sinks, lse, a key split): within the
    rounding of P of the float64 reference (within_bf16_p_rounding), lse to
    float32 rounding."""
    q = rng.standard_normal(qs).astype(BF16)
    k = rng.standard_normal(ks).astype(BF16)
    v = rng.standard_normal(ks[:-1] + (dv,)).astype(BF16)
    Lq, Lk = qs[-2], ks[-2]
    mask = rng.random((Lq, Lk)) < 0.7
    opts = [dict(), dict(causal=True), dict(causal="bottom_right"), dict(window=(37, 5)),
            dict(window=(3, 0), causal="bottom_right"), dict(mask=mask), dict(bias=rng.standard_normal((Lq, Lk))),
            dict(softcap=2.0), dict(sinks=rng.standard_normal(qs[:-2])), dict(kv_lengths=np.full(qs[0], Lk - 3)),
            dict(scale=0.6, causal=True)]
    for kw in opts:
        out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
        want, want_lse = R.attention(f64(q), f64(k), f64(v), return_lse=True, **kw)
        absw = R.attention(f64(q), f64(k), np.abs(f64(v)), **kw)
        assert out.dtype == BF16, kw
        assert np.all(within_bf16_p_rounding(out, want, absw)), kw
        fin = np.isfinite(want_lse)
        np.testing.assert_array_equal(fin, np.isfinite(lse))
        assert np.abs(lse[fin] - want_lse[fin]).max() <= 4e-6 * max(1.0, np.abs(want_lse[fin]).max()), kw


def test_bf16_pv_varlen(rng):
    """A packed batch of bfloat16 sequences (causal, sinks): within the rounding of
    P of the float64 reference, sequence by sequence."""
    lens = [300, 1, 129, 77]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, k, v = (rng.standard_normal((4, cu[-1], 64)).astype(BF16) for _ in range(3))    # (H, total, D)
    for kw in (dict(causal=True), dict(sinks=rng.standard_normal(4))):
        got = fastattn.attention_varlen(q, k, v, cu, **kw)
        want = R.attention_varlen(f64(q), f64(k), f64(v), cu, **kw)
        absw = R.attention_varlen(f64(q), f64(k), np.abs(f64(v)), cu, **kw)
        assert got.dtype == BF16
        assert np.all(within_bf16_p_rounding(got, want, absw)), kw


def test_bf16_pv_strided_values_nonfinite_and_threads(rng):
    """Values with a column stride (packed element by element), a value tile
    holding inf / NaN (that tile widened: inf * 0 stays out of the outputs that do
    not see it), and 1 or 2 threads giving the same bits."""
    q, k = (rng.standard_normal((1, 2, 200, 64)).astype(BF16) for _ in range(2))
    vt = rng.standard_normal((1, 2, 64, 300)).astype(BF16)
    v = np.swapaxes(vt, -1, -2)                           # column stride 300
    k = rng.standard_normal((1, 2, 300, 64)).astype(BF16)
    want = R.attention(f64(q), f64(k), f64(v))
    out = fastattn.attention(q, k, v)
    assert np.all(within_bf16_p_rounding(out, want, R.attention(f64(q), f64(k), np.abs(f64(v)))))
    np.testing.assert_array_equal(out, fastattn.attention(q, k, np.ascontiguousarray(v)))
    vn = np.ascontiguousarray(v)
    vn[0, 0, 250, 3] = np.inf
    vn[0, 1, 10, 5] = np.nan
    for causal in (False, "bottom_right"):
        got = fastattn.attention(q, k, vn, causal=causal)
        ref = R.attention(f64(q), f64(k), f64(vn), causal=causal)
        np.testing.assert_array_equal(np.isnan(f64(got)), np.isnan(ref))
        np.testing.assert_array_equal(np.isposinf(f64(got)), np.isposinf(ref))
        fin = np.isfinite(ref)
        absw = R.attention(f64(q), f64(k), np.abs(f64(np.where(np.isfinite(f64(vn)), f64(vn), 0))), causal=causal)
        assert np.all(within_bf16_p_rounding(got, ref, absw)[fin])
    np.testing.assert_array_equal(fastattn.attention(q, k, vn, num_threads=1),
                                  fastattn.attention(q, k, vn, num_threads=2))


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
