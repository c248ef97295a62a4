"""Every attention option of the fast API against the reference, singly and combined.

mask, bias, causal (True / top_left / bottom_right), window, kv_lengths, softcap,
ALiBi slopes, grouped heads (GQA / MQA), return_weights / return_lse, empty
shapes, merge_attention of key splits, and torch where importable.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastattn
from fa_testutil import assert_close, compute_dtype, randn, reference as R, tol_for

FLOATS = [np.float32, np.float64]


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def check(q, k, v, dtype=None, **opts):
    """Compare fast vs reference for out, weights and lse (and the out-only path)."""
    if dtype is None:
        dtype = q.dtype
    dtype = np.dtype(dtype)
    out, w, lse = fastattn.attention(q, k, v, return_weights=True, return_lse=True, **opts)
    r_out, r_w, r_lse = R.attention(q, k, v, return_weights=True, return_lse=True, **opts)
    desc = ", ".join(f"{a}={b if np.ndim(b) == 0 else np.shape(b)}" for a, b in opts.items())
    assert out.dtype == dtype, f"out dtype {out.dtype} ({desc})"
    assert lse.dtype == compute_dtype(dtype), f"lse dtype {lse.dtype} ({desc})"
    assert out.shape == r_out.shape and w.shape == r_w.shape and lse.shape == r_lse.shape
    assert not np.isnan(out).any(), f"NaN in output ({desc})"
    assert not np.isnan(w).any(), f"NaN in weights ({desc})"
    assert_close(out, r_out, dtype, what=f"out ({desc})")
    assert_close(w, r_w, dtype, what=f"weights ({desc})")
    assert_close(lse, r_lse, compute_dtype(dtype), what=f"lse ({desc})")
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(r_lse), err_msg=f"empty rows differ ({desc})")
    # masked keys get exactly zero weight
    assert (np.asarray(w)[r_w == 0] == 0).all(), f"invisible keys got non-zero weight ({desc})"
    sums = np.asarray(w, np.float64).sum(-1)
    tol = 1e-5 if compute_dtype(dtype) == np.float32 else 1e-12
    expect = np.where(np.isneginf(r_lse), 0.0, 1.0)
    np.testing.assert_allclose(sums, expect, atol=tol, err_msg=f"weight rows must sum to 1 or 0 ({desc})")
    # the fast path without weights / lse gives the same output
    out2 = fastattn.attention(q, k, v, **opts)
    assert_close(out2, r_out, dtype, what=f"out, no weights ({desc})")
    return out, w, lse


def qkv(rng, B=2, Hq=3, Hk=None, Lq=13, Lk=21, D=16, Dv=8, dtype=np.float64):
    Hk = Hq if Hk is None else Hk
    return (randn(rng, (B, Hq, Lq, D), dtype), randn(rng, (B, Hk, Lk, D), dtype),
            randn(rng, (B, Hk, Lk, Dv), dtype))


# ------------------------------------------------------------------ mask
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mshape", ["LqLk", "B1LqLk", "BHLqLk", "1Lk", "B11Lk"])
def test_mask(mshape, dtype, rng):
    B, H, Lq, Lk = 2, 3, 17, 70
    q, k, v = qkv(rng, B, H, Lq=Lq, Lk=Lk, dtype=dtype)
    shape = {"LqLk": (Lq, Lk), "B1LqLk": (B, 1, Lq, Lk), "BHLqLk": (B, H, Lq, Lk), "1Lk": (1, Lk),
             "B11Lk": (B, 1, 1, Lk)}[mshape]
    mask = rng.random(shape) < 0.6
    if mshape in ("LqLk", "B1LqLk", "BHLqLk"):
        mask[..., 3, :] = False  # a fully masked row
    check(q, k, v, mask=mask)


def test_mask_all_false_and_all_true(rng):
    q, k, v = qkv(rng)
    out, w, lse = check(q, k, v, mask=np.zeros((13, 21), bool))
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(lse, -np.inf)
    a = fastattn.attention(q, k, v, mask=np.ones((13, 21), bool))
    assert_close(a, fastattn.attention(q, k, v).astype(np.float64), np.float64)


# ------------------------------------------------------------------ bias
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bshape", ["LqLk", "HLqLk", "BH1Lk", "BHLqLk"])
def test_bias(bshape, dtype, rng):
    B, H, Lq, Lk = 2, 3, 19, 40
    q, k, v = qkv(rng, B, H, Lq=Lq, Lk=Lk, dtype=dtype)
    shape = {"LqLk": (Lq, Lk), "HLqLk": (H, Lq, Lk), "BH1Lk": (B, H, 1, Lk), "BHLqLk": (B, H, Lq, Lk)}[bshape]
    bias = randn(rng, shape, dtype, scale=2.0)
    check(q, k, v, bias=bias)


def test_bias_with_neg_inf_entries(rng):
    q, k, v = qkv(rng, Lq=9, Lk=30)
    bias = rng.standard_normal((9, 30))
    bias[rng.random((9, 30)) < 0.5] = -np.inf
    bias[4] = -np.inf  # whole row: acts like a fully masked row
    out, w, lse = check(q, k, v, bias=bias)
    np.testing.assert_array_equal(out[..., 4, :], 0.0)


# ------------------------------------------------------------------ causal
CAUSAL_SIZES = [(5, 9), (9, 5), (7, 7), (1, 100), (100, 1), (130, 67), (67, 130), (64, 64), (1, 1)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("causal", [True, "top_left", "bottom_right"])
@pytest.mark.parametrize("Lq,Lk", CAUSAL_SIZES)
def test_causal(Lq, Lk, causal, dtype, rng):
    q, k, v = qkv(rng, 1, 2, Lq=Lq, Lk=Lk, D=32, Dv=16, dtype=dtype)
    check(q, k, v, causal=causal)


def test_causal_true_equals_top_left(rng):
    q, k, v = qkv(rng, Lq=20, Lk=33)
    np.testing.assert_array_equal(fastattn.attention(q, k, v, causal=True),
                                  fastattn.attention(q, k, v, causal="top_left"))
    np.testing.assert_array_equal(fastattn.attention(q, k, v, causal=False), fastattn.attention(q, k, v))


def test_causal_equals_explicit_tril_mask(rng):
    for Lq, Lk in [(12, 30), (30, 12)]:
        q, k, v = qkv(rng, Lq=Lq, Lk=Lk)
        tl = np.tril(np.ones((Lq, Lk), bool))
        br = np.tril(np.ones((Lq, Lk), bool), k=Lk - Lq)
        assert_close(fastattn.attention(q, k, v, causal=True), R.attention(q, k, v, mask=tl), np.float64)
        assert_close(fastattn.attention(q, k, v, causal="bottom_right"), R.attention(q, k, v, mask=br),
                     np.float64)


# ------------------------------------------------------------------ window
WINDOWS = [0, 3, (0, 0), (4, 0), (None, 3), (3, None), (None, None), (2, 5), (0, None), (100, 100)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_window(window, causal, dtype, rng):
    for Lq, Lk in [(23, 23), (10, 75), (75, 10)]:
        q, k, v = qkv(rng, 1, 2, Lq=Lq, Lk=Lk, dtype=dtype)
        check(q, k, v, window=window, causal=causal)


def test_window_long_sequence(rng):
    q, k, v = qkv(rng, 1, 2, Lq=300, Lk=700, D=64, Dv=64, dtype=np.float32)
    check(q, k, v, window=(64, 0), causal="bottom_right")
    check(q, k, v, window=(17, 33))


def test_window_int_equals_pair(rng):
    q, k, v = qkv(rng, Lq=30, Lk=30)
    np.testing.assert_array_equal(fastattn.attention(q, k, v, window=4), fastattn.attention(q, k, v, window=(4, 4)))
    assert_close(fastattn.attention(q, k, v, window=(None, None)), fastattn.attention(q, k, v).astype(float),
                 np.float64)


# ------------------------------------------------------------------ kv_lengths
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("lshape", ["B1", "BH", "scalar", "H"])
def test_kv_lengths(lshape, dtype, rng):
    B, H, Lq, Lk = 3, 2, 11, 50
    q, k, v = qkv(rng, B, H, Lq=Lq, Lk=Lk, dtype=dtype)
    lens = {"B1": np.array([[0], [Lk], [17]]), "BH": np.array([[0, 1], [Lk, 49], [17, 33]]),
            "scalar": np.array(23), "H": np.array([[5, Lk]])}[lshape]
    out, w, lse = check(q, k, v, kv_lengths=lens)
    lb = np.broadcast_to(lens, (B, H))
    for b in range(B):
        for h in range(H):
            if lb[b, h] == 0:
                np.testing.assert_array_equal(out[b, h], 0)
                np.testing.assert_array_equal(lse[b, h], -np.inf)
            assert (np.asarray(w)[b, h, :, lb[b, h]:] == 0).all()


def test_one_dimensional_tables_are_per_sequence(rng):
    """A 1-D kv_lengths / kv_start with two or more batch dims holds one value per
    sequence (the leading batch dim, flash-attn's cache_seqlens) -- also when
    B == H, where a per-head reading would silently differ; a 1-D table of any
    other length raises, naming the argument; per-head values take (1, H)."""
    B, H, Lq, Lk = 2, 2, 3, 40
    q, k, v = qkv(rng, B, H, Lq=Lq, Lk=Lk, dtype=np.float64)
    for name in ("kv_lengths", "kv_start"):
        vals = np.array([30, 7]) if name == "kv_lengths" else np.array([7, 30])
        got = fastattn.attention(q, k, v, **{name: vals})
        want = fastattn.attention(q, k, v, **{name: vals[:, None]})       # (B, 1): per sequence
        np.testing.assert_array_equal(got, want)
        per_head = fastattn.attention(q, k, v, **{name: vals[None, :]})   # (1, H)
        assert not np.allclose(got, per_head)
        assert_close(got, R.attention(q, k, v, **{name: vals}), np.float64)
        q4, k4, v4 = qkv(rng, B, 4, Lq=Lq, Lk=Lk, dtype=np.float64)
        np.testing.assert_array_equal(fastattn.attention(q4, k4, v4, **{name: vals}),
                                      fastattn.attention(q4, k4, v4, **{name: vals[:, None]}))
        with pytest.raises(ValueError, match=name):
            fastattn.attention(q4, k4, v4, **{name: np.array([1, 2, 3, 4])})   # 4 heads, 2 sequences
        with pytest.raises(ValueError, match=name):
            R.attention(q4, k4, v4, **{name: np.array([1, 2, 3, 4])})


@pytest.mark.parametrize("dtype", FLOATS)
def test_kv_start_left_padding(dtype, rng):
    """kv_start: keys j < kv_start are invisible (left padding), per batch
    element; the diagonal stays where it is (bottom-right causal counts from
    Lk_eff); with kv_lengths both ends are cut; a row left with no key gives 0 and
    lse -inf.  Equals the reference and the same attention on the keys cut out."""
    B, H, Lq, Lk = 3, 2, 6, 300
    q, k, v = qkv(rng, B, H, Lq=Lq, Lk=Lk, dtype=dtype)
    starts = np.array([0, 130, 295])
    for kw in (dict(), dict(causal="bottom_right"), dict(causal="bottom_right", window=(20, 0)),
               dict(kv_lengths=np.array([300, 200, 298])), dict(alibi_slopes=np.array([0.1, 0.5]))):
        out, lse = fastattn.attention(q, k, v, kv_start=starts, return_lse=True, **kw)
        ro, rl = R.attention(q, k, v, kv_start=starts, return_lse=True, **kw)
        assert_close(out, ro, dtype)
        assert_close(lse, rl, dtype)
    # a left-padded batch equals each sequence without its padding (bottom-right causal)
    for b, s0 in enumerate(starts):
        sub = fastattn.attention(q[b], k[b, :, s0:], v[b, :, s0:], causal="bottom_right")
        full = fastattn.attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], causal="bottom_right",
                                  kv_start=np.array([s0]))[0]
        assert_close(full, sub, dtype)
    # decode shapes (split key ranges), grouped heads, everything cut
    qd, kd, vd = qkv(rng, 2, 4, Lq=1, Lk=5000, dtype=dtype)
    kd, vd = kd[:, :2], vd[:, :2]
    st = np.array([4999, 1234])
    assert_close(fastattn.attention(qd, kd, vd, kv_start=st), R.attention(qd, kd, vd, kv_start=st), dtype)
    out, lse = fastattn.attention(q, k, v, kv_start=np.array([[300]]), return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()
    with pytest.raises(ValueError, match="kv_start"):
        fastattn.attention(q, k, v, kv_start=np.array([[301]]))
    with pytest.raises(TypeError, match="kv_start"):
        fastattn.attention(q, k, v, kv_start=np.array([1.0]))


@pytest.mark.parametrize("dtype", FLOATS)
def test_align_bottom_right_without_causality(dtype, rng):
    """align="bottom_right" places p(i) = i + Lk_eff - Lq for windows and ALiBi
    without hiding the keys right of the diagonal (flash-attn's local windows and
    ALiBi with Lq != Lk); causal=True with it is causal="bottom_right"; invisible
    tiles outside the window are still skipped.  Against the reference and a
    boolean mask built by hand."""
    B, H, Lq, Lk = 2, 3, 4, 8
    q, k, v = qkv(rng, B, H, Lq=Lq, Lk=Lk, dtype=dtype)
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    p = i + Lk - Lq
    banded = np.abs(j - p) <= 1
    got = fastattn.attention(q, k, v, window=(1, 1), align="bottom_right")
    assert_close(got, R.attention(q, k, v, mask=banded), dtype)
    assert_close(got, R.attention(q, k, v, window=(1, 1), align="bottom_right"), dtype)
    slopes = np.array([0.5, 1.0, 2.0])
    got = fastattn.attention(q, k, v, alibi_slopes=slopes, align="bottom_right")
    bias = -slopes[:, None, None] * np.abs(p - j)
    assert_close(got, R.attention(q, k, v, bias=bias), dtype)
    np.testing.assert_array_equal(fastattn.attention(q, k, v, causal=True, align="bottom_right"),
                                  fastattn.attention(q, k, v, causal="bottom_right"))
    np.testing.assert_array_equal(fastattn.attention(q, k, v, causal="bottom_right", align="top_left"),
                                  fastattn.attention(q, k, v, causal="bottom_right"))
    ql, kl, vl = qkv(rng, 1, 2, Lq=200, Lk=3000, dtype=dtype)
    assert_close(fastattn.attention(ql, kl, vl, window=(64, 64), align="bottom_right"),
                 R.attention(ql, kl, vl, window=(64, 64), align="bottom_right"), dtype)
    with pytest.raises(ValueError, match="align"):
        fastattn.attention(q, k, v, align="bottom-right")
    with pytest.raises(TypeError, match="align"):
        fastattn.attention(q, k, v, align=True)


@pytest.mark.parametrize("lens_dtype", [np.int32, np.int64, np.uint32, np.int16])
def test_kv_lengths_int_dtypes(lens_dtype, rng):
    q, k, v = qkv(rng, 2, 2, Lq=5, Lk=9)
    check(q, k, v, kv_lengths=np.array([[3], [9]], dtype=lens_dtype))


@pytest.mark.parametrize("causal", [True, "bottom_right"])
def test_kv_lengths_with_causal(causal, rng):
    q, k, v = qkv(rng, 3, 2, Lq=8, Lk=40)
    check(q, k, v, kv_lengths=np.array([[3], [8], [40]]), causal=causal)
    check(q, k, v, kv_lengths=np.array([[3], [8], [40]]), causal=causal, window=(2, 1))


def test_kv_lengths_equals_slicing(rng):
    q, k, v = qkv(rng, 2, 2, Lq=7, Lk=64, dtype=np.float32)
    lens = np.array([[10], [64]])
    out = fastattn.attention(q, k, v, kv_lengths=lens, causal="bottom_right")
    for b in range(2):
        L = lens[b, 0]
        want = fastattn.attention(q[b], k[b, :, :L], v[b, :, :L], causal="bottom_right")
        assert_close(out[b], want.astype(np.float64), np.float32)


# ------------------------------------------------------------------ softcap
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("softcap", [0.5, 1.0, 5.0, 30.0, 1e6])
def test_softcap(softcap, dtype, rng):
    q, k, v = qkv(rng, Lq=14, Lk=29, dtype=dtype)
    check(q, k, v, softcap=softcap, scale=2.0)
    check(q, k, v, softcap=softcap, causal=True)


def test_softcap_huge_is_no_cap(rng):
    q, k, v = qkv(rng, Lq=8, Lk=10)
    assert_close(fastattn.attention(q, k, v, softcap=1e9), R.attention(q, k, v), np.float64, tol=1e-10)


# ------------------------------------------------------------------ alibi
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("sshape", ["H", "BH", "scalar", "B1"])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_alibi(sshape, causal, dtype, rng):
    B, H = 2, 4
    q, k, v = qkv(rng, B, H, Lq=15, Lk=37, dtype=dtype)
    slopes = {"H": 2.0 ** -np.arange(1, H + 1), "BH": rng.uniform(0, 1, (B, H)), "scalar": np.array(0.3),
              "B1": np.array([[0.1], [0.7]])}[sshape].astype(dtype)
    check(q, k, v, alibi_slopes=slopes, causal=causal)


def test_alibi_with_kv_lengths_bottom_right(rng):
    q, k, v = qkv(rng, 2, 2, Lq=6, Lk=30)
    check(q, k, v, alibi_slopes=np.array([0.5, 0.25]), kv_lengths=np.array([[9], [30]]),
          causal="bottom_right", window=(5, 0))


def test_alibi_zero_slope_is_plain(rng):
    q, k, v = qkv(rng)
    assert_close(fastattn.attention(q, k, v, alibi_slopes=np.zeros(3)), R.attention(q, k, v), np.float64)


# ------------------------------------------------------------------ GQA / MQA
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("Hq,Hk", [(4, 2), (8, 2), (4, 1), (6, 3), (3, 3)])
def test_grouped_heads(Hq, Hk, dtype, rng):
    q, k, v = qkv(rng, 2, Hq, Hk, Lq=19, Lk=45, D=32, Dv=24, dtype=dtype)
    out, _, _ = check(q, k, v)
    g = Hq // Hk
    for h in range(Hq):
        want = R.attention(q[:, h], k[:, h // g], v[:, h // g])
        assert_close(out[:, h], want, dtype, what=f"query head {h} -> kv head {h // g}")


def test_grouped_heads_with_options(rng):
    B, Hq, Hk = 2, 8, 2
    q, k, v = qkv(rng, B, Hq, Hk, Lq=12, Lk=40)
    check(q, k, v, causal="bottom_right", kv_lengths=np.array([[20], [40]]),
          alibi_slopes=2.0 ** -np.arange(1, Hq + 1), window=(8, 0), softcap=5.0,
          mask=rng.random((B, 1, 12, 40)) < 0.9, bias=rng.standard_normal((Hq, 12, 40)))
    check(q, k, v, kv_lengths=rng.integers(0, 41, size=(B, Hq)))


def test_mqa_broadcast_2d_kv(rng):
    q = randn(rng, (2, 4, 9, 16))
    k = randn(rng, (30, 16))
    v = randn(rng, (30, 8))
    check(q, k, v, causal="bottom_right")


# ------------------------------------------------------------------ return values & empty shapes
def test_return_structure(rng):
    q, k, v = qkv(rng)
    out = fastattn.attention(q, k, v)
    assert isinstance(out, np.ndarray)
    r = fastattn.attention(q, k, v, return_weights=True)
    assert isinstance(r, tuple) and len(r) == 2 and r[1].shape == (2, 3, 13, 21)
    r = fastattn.attention(q, k, v, return_lse=True)
    assert isinstance(r, tuple) and len(r) == 2 and r[1].shape == (2, 3, 13)
    r = fastattn.attention(q, k, v, return_weights=True, return_lse=True)
    assert isinstance(r, tuple) and len(r) == 3
    assert r[1].shape == (2, 3, 13, 21) and r[2].shape == (2, 3, 13)


@pytest.mark.parametrize("dtype", FLOATS)
def test_weights_are_softmax_of_scores(dtype, rng):
    q, k, v = qkv(rng, Lq=33, Lk=65, dtype=dtype)
    bias = randn(rng, (33, 65), dtype)
    _, w = fastattn.attention(q, k, v, bias=bias, scale=0.7, return_weights=True)
    s = 0.7 * q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) + bias
    assert_close(w, R.softmax(s), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_lk_zero(dtype, rng):
    q, k, v = qkv(rng, Lq=5, Lk=0, dtype=dtype)
    out, w, lse = check(q, k, v)
    assert out.shape == (2, 3, 5, 8) and w.shape == (2, 3, 5, 0)
    np.testing.assert_array_equal(out, 0)
    np.testing.assert_array_equal(lse, -np.inf)
    check(q, k, v, causal="bottom_right")


@pytest.mark.parametrize("dtype", FLOATS)
def test_lq_zero(dtype, rng):
    q, k, v = qkv(rng, Lq=0, Lk=7, dtype=dtype)
    out, w, lse = check(q, k, v)
    assert out.shape == (2, 3, 0, 8) and w.shape == (2, 3, 0, 7) and lse.shape == (2, 3, 0)
    q, k, v = qkv(rng, Lq=0, Lk=0, dtype=dtype)
    out = fastattn.attention(q, k, v)
    assert out.shape == (2, 3, 0, 8)


def test_zero_batch(rng):
    q, k, v = qkv(rng, B=0, Lq=4, Lk=5)
    out, lse = fastattn.attention(q, k, v, return_lse=True)
    assert out.shape == (0, 3, 4, 8) and lse.shape == (0, 3, 4)


# ------------------------------------------------------------------ combinations
def _random_opts(rng, B, Hq, Lq, Lk, dtype):
    o = {}
    if rng.random() < 0.5:
        o["causal"] = [True, "top_left", "bottom_right"][rng.integers(3)]
    if rng.random() < 0.35:
        o["mask"] = rng.random([(Lq, Lk), (B, 1, Lq, Lk), (B, Hq, Lq, Lk)][rng.integers(3)]) < 0.8
    if rng.random() < 0.35:
        o["bias"] = randn(rng, [(Lq, Lk), (Hq, Lq, Lk)][rng.integers(2)], dtype)
    if rng.random() < 0.35:
        w = int(rng.integers(0, 40))
        o["window"] = [w, (w, 0), (None, w), (w, None), (w // 2, w)][rng.integers(5)]
    if rng.random() < 0.35:
        o["kv_lengths"] = rng.integers(0, Lk + 1, size=[(B, 1), (B, Hq)][rng.integers(2)])
    if rng.random() < 0.3:
        o["softcap"] = float(rng.uniform(0.5, 20))
    if rng.random() < 0.3:
        o["alibi_slopes"] = rng.uniform(0, 0.5, size=[(Hq,), (B, Hq)][rng.integers(2)]).astype(dtype)
    if rng.random() < 0.2:
        o["scale"] = float(rng.uniform(0.01, 1.0))
    return o


@pytest.mark.parametrize("case", range(40))
def test_random_combinations(case):
    rng = np.random.default_rng(20_000 + case)
    dtype = [np.float32, np.float64][case % 2]
    B = int(rng.integers(1, 3))
    Hk = int(rng.integers(1, 3))
    Hq = Hk * int(rng.choice([1, 2, 4]))
    Lq = int(rng.choice([1, 3, 17, 64, 65, 130]))
    Lk = int(rng.choice([1, 2, 17, 63, 129, 300]))
    D = int(rng.choice([1, 8, 64, 80]))
    Dv = int(rng.choice([1, 16, 64]))
    q, k, v = qkv(rng, B, Hq, Hk, Lq=Lq, Lk=Lk, D=D, Dv=Dv, dtype=dtype)
    opts = _random_opts(rng, B, Hq, Lq, Lk, dtype)
    check(q, k, v, **opts)


# ------------------------------------------------------------------ merge_attention
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("nparts", [1, 2, 3, 6])
def test_merge_random_key_splits(nparts, dtype, rng):
    q, k, v = qkv(rng, 2, 3, Lq=16, Lk=90, dtype=dtype)
    full, full_lse = fastattn.attention(q, k, v, return_lse=True)
    labels = rng.integers(0, nparts, size=90)
    labels[:nparts] = np.arange(nparts)  # every part non-empty
    outs, lses = [], []
    for p in range(nparts):
        idx = np.flatnonzero(labels == p)
        o, l = fastattn.attention(q, k[..., idx, :], v[..., idx, :], return_lse=True, scale=1 / 4)
        outs.append(o)
        lses.append(l)
    out, lse = fastattn.merge_attention(outs, lses)
    assert out.shape == full.shape and lse.shape == full_lse.shape
    assert_close(out, full, dtype)
    assert_close(lse, full_lse, dtype)
    assert_close(out, R.attention(q, k, v), dtype)


def test_merge_contiguous_chunks_with_causal_mask(rng):
    """Split keys into chunks (ring/flash-decoding style) with a global causal mask."""
    Lq = Lk = 50
    q, k, v = qkv(rng, 1, 2, Lq=Lq, Lk=Lk)
    full = R.attention(q, k, v, causal=True)
    tril = np.tril(np.ones((Lq, Lk), bool))
    outs, lses = [], []
    for lo, hi in [(0, 7), (7, 30), (30, 50)]:
        o, l = fastattn.attention(q, k[..., lo:hi, :], v[..., lo:hi, :], mask=tril[:, lo:hi],
                                  scale=1 / 4, return_lse=True)
        outs.append(o)
        lses.append(l)
    out, lse = fastattn.merge_attention(outs, lses)
    assert_close(out, full, np.float64)
    assert not np.isnan(out).any()


def test_merge_all_empty_rows():
    outs = [np.zeros((2, 4, 3)), np.ones((2, 4, 3))]
    lses = [np.full((2, 4), -np.inf), np.full((2, 4), -np.inf)]
    lses[1][0, 1] = 0.5
    out, lse = fastattn.merge_attention(outs, lses)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[1], 0)
    np.testing.assert_array_equal(out[0, 1], 1.0)
    assert lse[0, 1] == 0.5
    np.testing.assert_array_equal(lse[1], -np.inf)
    want_o, want_l = R.merge_attention(outs, lses)
    assert_close(out, want_o, np.float64)
    assert_close(lse, want_l, np.float64)


# ------------------------------------------------------------------ torch
def _t(torch, *arrs):
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrs]


@pytest.mark.parametrize("dtype", FLOATS)
def test_torch_bool_and_float_masks(dtype):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, 2, 3, Lq=17, Lk=33, D=32, Dv=16, dtype=dtype)
    mask = rng.random((2, 1, 17, 33)) < 0.7
    mask[..., 0] = True  # torch gives NaN for fully masked rows; avoid them here
    tol = 1e-5 if dtype == np.float32 else 1e-10
    want = F.scaled_dot_product_attention(*_t(torch, q, k, v), attn_mask=torch.from_numpy(mask)).numpy()
    assert_close(fastattn.attention(q, k, v, mask=mask), want, dtype, tol=tol)
    bias = randn(rng, (3, 17, 33), dtype)
    want = F.scaled_dot_product_attention(*_t(torch, q, k, v), attn_mask=torch.from_numpy(bias)).numpy()
    assert_close(fastattn.attention(q, k, v, bias=bias), want, dtype, tol=tol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("Lq,Lk", [(20, 20), (10, 30), (30, 10)])
def test_torch_is_causal(Lq, Lk, dtype):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(12)
    q, k, v = qkv(rng, 1, 2, Lq=Lq, Lk=Lk, D=16, Dv=16, dtype=dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-10
    want = F.scaled_dot_product_attention(*_t(torch, q, k, v), is_causal=True).numpy()
    got = fastattn.attention(q, k, v, causal=True)  # torch's is_causal is top-left aligned
    assert_close(got, want, dtype, tol=tol)


@pytest.mark.parametrize("Hq,Hk", [(4, 2), (8, 1), (6, 3)])
def test_torch_enable_gqa(Hq, Hk):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(13)
    for dtype in FLOATS:
        q, k, v = qkv(rng, 2, Hq, Hk, Lq=15, Lk=31, D=32, Dv=32, dtype=dtype)
        try:
            want = F.scaled_dot_product_attention(*_t(torch, q, k, v), enable_gqa=True, scale=0.3).numpy()
        except TypeError:
            pytest.skip("this torch has no enable_gqa")
        tol = 1e-5 if dtype == np.float32 else 1e-10
        assert_close(fastattn.attention(q, k, v, scale=0.3), want, dtype, tol=tol)


# ------------------------------------------------------------------ option arrays: layouts & python types
def test_option_arrays_with_odd_strides(rng):
    B, H, Lq, Lk = 2, 3, 14, 37
    q, k, v = qkv(rng, B, H, Lq=Lq, Lk=Lk)
    mask = np.ascontiguousarray((rng.random((Lk, Lq)) < 0.7)).T  # transposed view
    bias = np.ascontiguousarray(rng.standard_normal((H, Lq, Lk))[:, ::-1, ::-1])[:, ::-1, ::-1]  # negative
    slopes = np.array([0.5, 0.0, 0.1, 0.25, 0.3, 0.9])[::2]  # strided
    lens = np.array([[5, 0], [37, 0]])[:, :1]  # strided (B, 1)
    assert not mask.flags.c_contiguous and bias.strides[-1] < 0
    check(q, k, v, mask=mask, bias=bias, alibi_slopes=slopes, kv_lengths=lens, causal=True)
    # zero-stride broadcast views
    check(q, k, v, mask=np.broadcast_to(mask, (B, H, Lq, Lk)), bias=np.broadcast_to(bias[:1], (B, H, Lq, Lk)))


def test_option_python_types(rng):
    q, k, v = qkv(rng, 2, 2, Lq=5, Lk=9)
    check(q, k, v, kv_lengths=[[3], [9]], alibi_slopes=[0.5, 0.25], mask=[[True] * 9] * 5,
          bias=[[0.1] * 9] * 5)
    check(q, k, v, kv_lengths=4, alibi_slopes=0.5, window=np.int64(2), softcap=np.float32(3.0))


def test_bottom_right_window_at_the_end_of_long_keys(rng):
    q, k, v = qkv(rng, 1, 2, Lq=4, Lk=8192, D=64, Dv=64, dtype=np.float32)
    check(q, k, v, causal="bottom_right", window=(100, 0))
    check(q, k, v, causal="bottom_right", window=(100, 0), kv_lengths=np.array([[5000]]))


@pytest.mark.parametrize("dtype", [np.float16])
def test_float16_with_options(dtype, rng):
    q, k, v = qkv(rng, 2, 4, 2, Lq=20, Lk=45, dtype=dtype)
    out, lse = fastattn.attention(q, k, v, causal="bottom_right", window=(7, 1), softcap=10.0,
                                  alibi_slopes=np.float16([0.1, 0.2, 0.3, 0.4]), return_lse=True)
    want, want_lse = R.attention(q, k, v, causal="bottom_right", window=(7, 1), softcap=10.0,
                                 alibi_slopes=np.float16([0.1, 0.2, 0.3, 0.4]), return_lse=True)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    assert_close(out, want, np.float16)
    assert_close(lse, want_lse, np.float32, tol=1e-5)


def test_kv_lengths_padding_may_hold_garbage(rng):
    """Keys/values beyond kv_lengths are never read into the result (NaN/inf padding is harmless)."""
    for dtype in FLOATS:
        q, k, v = qkv(rng, 2, 2, Lq=6, Lk=40, dtype=dtype)
        lens = np.array([[9], [40]])
        kp, vp = k.copy(), v.copy()
        kp[0, :, 9:] = np.nan
        vp[0, :, 9:] = np.inf
        out = fastattn.attention(q, kp, vp, kv_lengths=lens)
        assert not np.isnan(out).any()
        assert_close(out, R.attention(q, k, v, kv_lengths=lens), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["nan_key", "nan_query", "inf_key", "inf_query", "neg_inf_key",
                                  "nan_tail_keys", "huge_query"])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"return_lse": True}])
def test_nonfinite_scores_many_rows(case, opts, dtype, rng):
    """With many query rows (the query-vectorised path, several key tiles) inf and
    NaN scores give what the reference gives: the tile max there skips NaN, which
    must still reach its row through the sum."""
    q = randn(rng, (2, 3, 40, 16), dtype)
    k = randn(rng, (2, 3, 300, 16), dtype)
    v = randn(rng, (2, 3, 300, 8), dtype)
    if case == "nan_key":
        k[0, 1, 70, 3] = np.nan
    elif case == "nan_query":
        q[1, 2, 5, 0] = np.nan
    elif case == "inf_key":
        k[0, 0, 10, :] = np.inf
    elif case == "inf_query":
        q[0, 0, 0, 0] = np.inf
    elif case == "neg_inf_key":
        k[1, 1, 100, 2] = -np.inf
    elif case == "nan_tail_keys":
        k[:, :, 130:, :] = np.nan
    elif case == "huge_query":
        q[0, 1] = 1e30
    got = fastattn.attention(q, k, v, **opts)
    want = R.attention(q, k, v, **opts)
    if not isinstance(got, tuple):
        got, want = (got,), (want,)
    for g, w in zip(got, want):
        assert_close(g, w, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Dv", [8, 16, 24, 40])
@pytest.mark.parametrize("Dk", [16, 21])
@pytest.mark.parametrize("layout", ["plain", "gqa", "out_transposed"])
def test_output_rows_many_queries(Dk, Dv, layout, dtype, rng):
    """The query-vectorised path packs its queries and writes its output rows
    through blocks transposed in registers (contiguous rows) or element by
    element (rows of two groups in one unit, strided output).  Partial blocks of
    rows and columns, rows that see no key (whose accumulators hold NaN from an
    inf value: the output must still be exactly 0), against the reference."""
    Lq, Lk, Hq = 45, 90, 4
    Hk = 2 if layout == "gqa" else Hq
    q = randn(rng, (2, Hq, Lq, Dk), dtype)
    k = randn(rng, (2, Hk, Lk, Dk), dtype)
    v = randn(rng, (2, Hk, Lk, Dv), dtype)
    empty = [0, 17, 44]
    v[:, :, 5, :] = np.inf
    mask = np.ones((Lq, Lk), bool)
    mask[:, 5] = False                   # rows with keys never see the inf value ...
    mask[empty, 5] = True                # ... the empty rows do, with weight exp(-inf) = 0,
    bias = np.zeros((Lq, Lk), dtype)     # so their accumulators hold 0 * inf = NaN
    bias[empty, :] = -np.inf
    kw = dict(mask=mask, bias=bias)
    want = R.attention(q, k, v, **kw)
    if layout == "out_transposed":
        buf = np.empty((2, Hq, Dv, Lq), dtype)
        out = np.swapaxes(buf, -1, -2)   # element stride Lq along the output row
        got = fastattn.attention(q, k, v, out=out, **kw)
        assert got is out
    else:
        got = fastattn.attention(q, k, v, **kw)
    assert_close(got, want, dtype)
    np.testing.assert_array_equal(got[:, :, empty, :], 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rise", [0.0, 2.0, 30.0, -30.0, 300.0])
@pytest.mark.parametrize("causal", [False, True])
def test_running_max_drift(rise, causal, dtype, rng):
    """Scores that climb (or fall) steadily across the key tiles: the running max
    of the query-vectorised path moves in every tile, in some, or never (it is
    kept until a tile's max exceeds it by a slack).  Output and lse must match the
    reference whatever the drift: total rises far below the slack, rises that move
    it every few keys, and scores that peak in the first tile."""
    Lq, Lk, D = 40, 700, 16
    q = randn(rng, (1, 2, Lq, D), dtype)
    k = randn(rng, (1, 2, Lk, D), dtype)
    v = randn(rng, (1, 2, Lk, 8), dtype)
    # a component every query sees: score_j = rise * j / Lk + N(0, 1) noise
    q[..., 0] = np.sqrt(D)
    k[..., 0] = rise * np.arange(Lk) / Lk
    got, lse = fastattn.attention(q, k, v, causal=causal, return_lse=True)
    want, want_lse = R.attention(q, k, v, causal=causal, return_lse=True)
    # the inputs are rounded to dtype, so scores of size |rise| carry an error of
    # ~|rise| * eps that the softmax passes on: scale the tolerance with it
    tol = tol_for(dtype) * max(1.0, abs(rise) / 8)
    assert_close(got, want, dtype, tol=tol)
    assert_close(lse, want_lse, dtype, tol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["hidden_nan", "visible_inf_then_hidden_nan", "visible_nan"])
def test_decode_values_nonfinite(case, dtype, rng):
    """Decode rows read values in place and check them only after each tile's
    update: a hidden NaN must still never reach the output, and a visible inf or
    NaN must give what the reference gives, whatever tile it sits in."""
    Lk, D = 300, 128          # three key tiles of 128, whole vectors of values
    q = randn(rng, (2, 1, D), dtype)
    k = randn(rng, (2, Lk, D), dtype)
    v = randn(rng, (2, Lk, D), dtype)
    mask = np.ones(Lk, bool)
    mask[200:210] = False
    v[:, 205, :] = np.nan                 # hidden by the mask (second tile)
    if case == "visible_inf_then_hidden_nan":
        v[0, 10, 3] = np.inf              # visible, first tile: column 3 becomes inf
    if case == "visible_nan":
        v[1, 270, 7] = np.nan             # visible, third tile: column 7 becomes NaN
    out = fastattn.attention(q, k, v, mask=mask)
    want = R.attention(q, k, v, mask=mask)
    if case == "hidden_nan":
        assert np.isfinite(want).all()
    assert_close(out, want, dtype)
    # the same with kv_lengths hiding the tail instead of a mask
    v2 = v.copy()
    v2[:, 280:, :] = np.nan
    out2 = fastattn.attention(q, k, v2, mask=mask, kv_lengths=np.array([280, 280]))
    assert_close(out2, R.attention(q, k, v2, mask=mask, kv_lengths=np.array([280, 280])), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [(8, 1), (12, 1), (1, 8), (17, 1), (20, 1), (4, 10), (40, 1)])
def test_packed_tiles_mid_rows(rows, dtype, rng):
    """Between the few-row path (up to 13 rows; it packs key and value tiles only
    when their elements are strided) and the query-vectorised path, key and value
    tiles are packed with vector copies and register transposes when their rows are
    contiguous: every mix of whole and partial vectors (Dk, Dv, keys per panel),
    grouped heads, several tiles, strided keys/values (the scalar pack), and values
    holding inf/NaN found by the pack's probe -- hidden ones must not leak, visible
    ones must reach their columns as in the reference."""
    Lq, g = rows
    for Dk, Dv, Lk in [(64, 64, 200), (33, 17, 65), (5, 3, 31), (80, 128, 130), (16, 48, 1)]:
        q = randn(rng, (2, 2 * g, Lq, Dk), dtype)
        k = randn(rng, (2, 2, Lk, Dk), dtype)
        v = randn(rng, (2, 2, Lk, Dv), dtype)
        assert_close(fastattn.attention(q, k, v), R.attention(q, k, v), dtype,
                     what=f"Lq={Lq} g={g} Dk={Dk} Dv={Dv} Lk={Lk}")
        # strided key and value rows (every other element): the scalar packs
        k2 = randn(rng, (2, 2, Lk, 2 * Dk), dtype)[..., ::2]
        v2 = randn(rng, (2, 2, Lk, 2 * Dv), dtype)[..., ::2]
        assert_close(fastattn.attention(q, k2, v2), R.attention(q, k2, v2), dtype,
                     what=f"strided, Lq={Lq} g={g} Dk={Dk} Dv={Dv} Lk={Lk}")
    Lk, Dk, Dv = 200, 40, 24
    q = randn(rng, (1, 2 * g, Lq, Dk), dtype)
    k = randn(rng, (1, 2, Lk, Dk), dtype)
    v = randn(rng, (1, 2, Lk, Dv), dtype)
    mask = np.ones(Lk, bool)
    mask[100:104] = False
    v[..., 101, :] = np.nan             # hidden by the mask, inside every row's key range
    v[0, 1, 102, 5] = np.inf            # hidden
    lengths = np.repeat([150, 190], g)[None]    # per query head; grouped heads share their key head's
    v[..., 170:, :] = np.nan            # hidden from key head 0 (length 150), visible to head 1
    opts = dict(mask=mask, kv_lengths=lengths)
    want = R.attention(q, k, v, **opts)
    assert np.isfinite(want[:, :g]).all() and np.isnan(want[:, g:]).all()
    assert_close(fastattn.attention(q, k, v, **opts), want, dtype)
    v[0, 0, 20, 3] = np.inf             # visible to key head 0: its column 3 becomes inf or NaN
    assert_close(fastattn.attention(q, k, v, **opts), R.attention(q, k, v, **opts), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Lq", [5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 20, 21, 23, 24, 25, 27, 28, 31, 32,
                                33, 41, 42, 47, 48, 49, 64, 65])
def test_path_boundaries(Lq, dtype, rng):
    """Query-row counts around the switches between the few-row, packed row-major
    and query-vectorised paths (13/14 rows; whole vectors with at most 1/8 padding:
    14-16, 28-32, 42-47 float32 rows or 14-16, 21-23 float64 rows on AVX-512; 3/4 of a
    widest chunk: 48 float32 / 24 float64 rows on AVX-512; other counts on other
    ISAs), plain, causal and with key lengths, against the reference."""
    q = randn(rng, (2, 2, Lq, 40), dtype)
    k = randn(rng, (2, 2, 150, 40), dtype)
    v = randn(rng, (2, 2, 150, 24), dtype)
    lengths = np.array([[150, 97], [64, 1]])
    for opts in (dict(), dict(causal="bottom_right"), dict(kv_lengths=lengths)):
        assert_close(fastattn.attention(q, k, v, **opts), R.attention(q, k, v, **opts), dtype,
                     what=f"Lq={Lq} {opts}")
        # return_weights takes its own passes (statistics, then weights) on each path
        check(q, k, v, **opts)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("D, Dv, Lk", [(128, 128, 300), (64, 32, 130), (72, 72, 65), (100, 48, 17),
                                       (33, 64, 40), (8, 16, 7), (17, 8, 1)])
def test_few_rows_in_place(D, Dv, Lk, dtype, rng):
    """Units of 2-13 query rows read keys and values in place: the scores of blocks
    of up to 8 rows (4 + 1 or 4 + 2, or padded to a power of two) come from one
    pass over a group of keys and a transpose-and-add tree, the P.V update from
    row blocks that load each value vector once.  Every row count, key counts
    that leave a partial group, head sizes that leave a partial vector, grouped
    heads, causal and key lengths: against the reference.  A row's scores must not depend on how many rows share
    its unit (padding rows, group width), so any leading subset of the rows gives
    bit-identical rows, and so do 1 and 2 threads."""
    q = randn(rng, (2, 2, 13, D), dtype)
    k = randn(rng, (2, 2, Lk, D), dtype)
    v = randn(rng, (2, 2, Lk, Dv), dtype)
    full = fastattn.attention(q, k, v, num_threads=1)
    assert_close(full, R.attention(q, k, v), dtype, what=f"13 rows D={D} Lk={Lk}")
    for n in range(2, 13):
        part = fastattn.attention(q[:, :, :n], k, v, num_threads=2)
        assert_close(part, R.attention(q[:, :, :n], k, v), dtype, what=f"{n} rows D={D} Lk={Lk}")
        np.testing.assert_array_equal(part, full[:, :, :n], err_msg=f"{n} rows vs 13, D={D} Lk={Lk}")
    # grouped heads fold into the rows of a unit (3 query heads x 4 rows), causal
    # rows that see different key counts, per-head key lengths
    gq = randn(rng, (2, 6, 4, D), dtype)
    lengths = np.repeat([[Lk, max(1, Lk // 2)], [1, Lk]], 3, axis=1)   # per query head
    for opts in (dict(), dict(causal="bottom_right"), dict(kv_lengths=lengths)):
        out = fastattn.attention(gq, k, v, num_threads=1, **opts)
        assert_close(out, R.attention(gq, k, v, **opts), dtype, what=f"grouped D={D} Lk={Lk} {opts}")
        np.testing.assert_array_equal(fastattn.attention(gq, k, v, num_threads=2, **opts), out)


@pytest.mark.parametrize("how", ["mask", "causal", "window"])
def test_masked_keys_may_hold_garbage(how, rng):
    """Values of keys a row cannot see never reach that row, even when inf/NaN
    (e.g. an uninitialised KV-cache slot hidden by a padding mask or by causality)."""
    q, k, v = qkv(rng, 1, 2, Lq=6, Lk=6)
    vp = v.copy()
    vp[..., 5, :] = np.nan  # last key: invisible to rows 0..4 under causal / (0, 0) window / mask
    opts = {"mask": dict(mask=np.arange(6) < 5), "causal": dict(causal=True), "window": dict(window=(0, 0))}[how]
    out = fastattn.attention(q, k, vp, **opts)
    want = R.attention(q, k, vp, **opts)
    if how == "mask":
        assert not np.isnan(want).any()
    else:
        assert np.isnan(want[..., 5, :]).all() and not np.isnan(want[..., :5, :]).any()
    assert_close(out, want, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Lq", [16, 32, 45, 80, 104])
def test_query_vectorised_key_splits(Lq, dtype, rng):
    """Few query-vectorised units over many keys: the key range is split (a rule of
    the shape alone) and the splits merged.  Row counts that cut a unit into
    chunks of 4, 2 and 1 vectors; splits that some rows cannot see (causal top-left,
    key lengths), a NaN query row, a row whose scores are all -inf, inf/NaN values
    hidden by the mask.  Against the reference, and bit-identical for any number
    of threads."""
    Lk = 2600
    q = randn(rng, (1, 2, Lq, 24), dtype)
    k = randn(rng, (1, 2, Lk, 24), dtype)
    v = randn(rng, (1, 2, Lk, 40), dtype)
    q[0, 1, 3] = np.nan                                  # one NaN row
    bias = np.zeros((1, 2, Lq, Lk), dtype)
    bias[0, 0, 5] = -np.inf                              # one row that sees nothing
    mask = rng.random((Lq, Lk)) < 0.9
    v[0, 0, ~mask[0]] = np.inf                           # hidden from row 0 only
    lengths = np.array([[Lk, 1000]])
    cases = (dict(), dict(causal=True), dict(causal="bottom_right"), dict(kv_lengths=lengths),
             dict(window=(300, 40)), dict(bias=bias), dict(mask=mask))
    for opts in cases:
        vv = v if "mask" in opts else np.where(np.isinf(v), 1.0, v).astype(dtype)
        qq = q if "bias" not in opts else np.nan_to_num(q)
        want_out, want_lse = R.attention(qq, k, vv, return_lse=True, **opts)
        outs = [fastattn.attention(qq, k, vv, return_lse=True, num_threads=nt, **opts)
                for nt in (1, 2, 3)]
        what = f"Lq={Lq} {sorted(opts)}"
        assert_close(outs[0][0], want_out, dtype, what=f"out {what}")
        assert_close(outs[0][1], want_lse, compute_dtype(dtype), what=f"lse {what}")
        for o, lse in outs[1:]:
            assert np.array_equal(o, outs[0][0], equal_nan=True), f"out differs with threads ({what})"
            assert np.array_equal(lse, outs[0][1], equal_nan=True), f"lse differs with threads ({what})"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Lq", [8, 80, 200])
def test_nonfinite_values_hidden_by_key_ranges(Lq, dtype, rng):
    """inf and NaN in value rows reach exactly the rows that see those keys: causal
    (both alignments), windows (each side, and one side unbounded) and key lengths
    hide them from the others, whose outputs stay finite: a tile that some row of
    a unit sees only in part must keep them from that row (on the query-vectorised
    path, the values' inf/NaN probe sends such a tile to the per-row exact P.V; a
    probe skipped where either end of a row's range cuts the tile fails here).
    Row-major (8 rows) and query-vectorised (80, 200) units, against the reference
    and bit-identical for 1 and 2 threads."""
    Lk = 300
    q = randn(rng, (1, 2, Lq, 24), dtype)
    k = randn(rng, (1, 2, Lk, 24), dtype)
    v = randn(rng, (1, 2, Lk, 40), dtype)
    for key in (3, 100, 170, 290):
        v[0, :, key, 3] = np.inf
    v[0, :, 140, 7] = np.nan
    cases = (dict(causal=True), dict(causal="bottom_right"), dict(window=(20, 5)),
             dict(window=(50, None)), dict(window=(None, 10)), dict(window=(0, 0)),
             dict(kv_lengths=np.array([[Lk, 150]])))
    for opts in cases:
        want = R.attention(q, k, v, **opts)
        outs = [fastattn.attention(q, k, v, num_threads=nt, **opts) for nt in (1, 2)]
        what = f"Lq={Lq} {opts}"
        assert np.isfinite(want).any() and not np.isfinite(want).all(), what
        assert_close(outs[0], want, dtype, what=what)
        assert np.array_equal(outs[1], outs[0], equal_nan=True), f"differs with threads ({what})"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Lq", [16, 45, 80, 128])
def test_query_vectorised_strided_keys_and_values(Lq, dtype, rng):
    """The query-vectorised kernels read keys and values in place: rows with
    contiguous elements have their own instantiations, other element strides
    (a column of a bigger array; a transposed buffer) the general ones.  Every
    chunk width (row counts of 1, 3, 5 and 8 vectors), against the reference."""
    Lk = 150
    q = randn(rng, (2, Lq, 24), dtype)
    k0 = randn(rng, (2, Lk, 24), dtype)
    v0 = randn(rng, (2, Lk, 20), dtype)
    k_col = np.stack([k0, k0 + 1], axis=-1)[..., 0]          # element stride 2
    v_t = np.ascontiguousarray(v0.transpose(0, 2, 1)).transpose(0, 2, 1)  # element stride Lk
    assert k_col.strides[-1] == 2 * k0.itemsize and v_t.strides[-1] == Lk * v0.itemsize
    for k, v in ((k_col, v0), (k0, v_t), (k_col, v_t)):
        for opts in (dict(), dict(causal="bottom_right")):
            assert_close(fastattn.attention(q, k, v, **opts), R.attention(q, k0, v0, **opts), dtype,
                         what=f"Lq={Lq} k{k.strides} v{v.strides} {opts}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Lq", [14, 16, 33, 48, 100, 130])
def test_query_vectorised_boolean_masks(Lq, dtype, rng):
    """Boolean masks on the query-vectorised path: the mask block of a tile is
    transposed (queries to lanes) in blocks of 16 x 16 bytes when the mask's rows
    are contiguous, element by element otherwise.  Key counts that cut the
    16-key blocks and the 128-key tiles, row counts that leave lanes empty, every
    chunk width; masks full, broadcast over heads, one row for every query, a
    slice of a bigger array (rows further apart, not aligned), Fortran-ordered
    and strided (the element-wise transpose); with causal and a bias on top.
    Against the float64 reference, with and without weights."""
    for Lk in (5, 16, 37, 64, 129):
        q = randn(rng, (2, 2, Lq, 16), dtype)
        k = randn(rng, (2, 2, Lk, 16), dtype)
        v = randn(rng, (2, 2, Lk, 8), dtype)
        full = rng.random((2, 2, Lq, Lk)) < 0.5
        full[..., 1, :] = False                                   # a row that sees nothing
        full[..., 2, :] = True
        big = rng.random((Lq, Lk + 19)) < 0.3
        masks = {"full": full, "heads": full[:, :1], "one row": full[0, 0, :1],
                 "slice": big[:, 3:Lk + 3], "fortran": np.asfortranarray(full[0, 1]),
                 "strided": (rng.random((Lq, 2 * Lk)) < 0.5)[:, ::2]}
        for name, m in masks.items():
            for opts in (dict(), dict(causal="bottom_right", bias=randn(rng, (Lq, Lk), dtype))):
                what = f"Lq={Lq} Lk={Lk} mask {name} {sorted(opts)}"
                out, w = fastattn.attention(q, k, v, mask=m, return_weights=True, **opts)
                want, want_w = R.attention(q, k, v, mask=m, return_weights=True, **opts)
                assert_close(out, want, dtype, what=what)
                assert_close(w, want_w, dtype, what=what)
                assert_close(fastattn.attention(q, k, v, mask=m, **opts), want, dtype, what=what)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Lq", [14, 16, 33, 100, 130])
def test_query_vectorised_bias_and_alibi(Lq, dtype, rng):
    """Biases and ALiBi slopes on the query-vectorised path: a bias with contiguous
    rows is added in W x W register-transposed blocks, the ALiBi distance is
    computed per vector of lanes; other biases element by element, and ALiBi after
    them the same way.  Key counts that cut the blocks and tiles, row counts that
    leave lanes empty, grouped heads (a slope per query head), bottom-right
    positions (negative when Lq > Lk); biases full, broadcast, a slice of a bigger
    array, Fortran-ordered and strided.  Against the float64 reference."""
    for Lk in (5, 16, 37, 129):
        q = randn(rng, (2, 4, Lq, 16), dtype)
        k = randn(rng, (2, 2, Lk, 16), dtype)
        v = randn(rng, (2, 2, Lk, 8), dtype)
        big = randn(rng, (Lq, Lk + 7), dtype)
        biases = {"full": randn(rng, (2, 4, Lq, Lk), dtype), "heads": randn(rng, (2, 1, Lq, Lk), dtype),
                  "row": randn(rng, (1, Lk), dtype), "slice": big[:, 5:Lk + 5],
                  "fortran": np.asfortranarray(randn(rng, (Lq, Lk), dtype)),
                  "strided": randn(rng, (Lq, 2 * Lk), dtype)[:, ::2]}
        slopes = rng.uniform(0.05, 1.5, (2, 4))
        for name, bias in biases.items():
            for opts in (dict(bias=bias), dict(bias=bias, alibi_slopes=slopes),
                         dict(bias=bias, alibi_slopes=slopes[0], causal="bottom_right"),
                         dict(bias=bias, alibi_slopes=slopes, window=(7, 3), mask=rng.random((Lq, Lk)) < 0.8)):
                what = f"Lq={Lq} Lk={Lk} bias {name} {sorted(opts)}"
                assert_close(fastattn.attention(q, k, v, **opts), R.attention(q, k, v, **opts), dtype, what=what)
        for opts in (dict(alibi_slopes=slopes), dict(alibi_slopes=slopes[1], causal="bottom_right"),
                     dict(alibi_slopes=np.array(0.7), causal=True, softcap=3.0)):
            what = f"Lq={Lq} Lk={Lk} {sorted(opts)}"
            out, w = fastattn.attention(q, k, v, return_weights=True, **opts)
            want, want_w = R.attention(q, k, v, return_weights=True, **opts)
            assert_close(out, want, dtype, what=what)
            assert_close(w, want_w, dtype, what=what)
            assert_close(fastattn.attention(q, k, v, **opts), want, dtype, what=what)


@pytest.mark.parametrize("Lq", [3, 8, 16, 64, 80])
def test_weights_of_nan_rows_are_all_nan(Lq, rng):
    """A row whose scores hold NaN has NaN weights for every key, the keys it
    cannot see included (the reference's rule), on every path; the other rows
    keep exact zeros for their invisible keys."""
    q = randn(rng, (1, 2, Lq, 8), np.float32)
    k = randn(rng, (1, 2, 70, 8), np.float32)
    v = randn(rng, (1, 2, 70, 5), np.float32)
    q[0, 1, 1] = np.nan
    for opts in (dict(causal=True), dict(window=(3, 3)), dict(kv_lengths=np.array([[70, 9]]))):
        out, w, lse = fastattn.attention(q, k, v, return_weights=True, return_lse=True, **opts)
        r_out, r_w, r_lse = R.attention(q, k, v, return_weights=True, return_lse=True, **opts)
        assert np.isnan(w[0, 1, 1]).all() and np.isnan(out[0, 1, 1]).all() and np.isnan(lse[0, 1, 1])
        assert_close(w, r_w, np.float32, what=f"weights Lq={Lq} {sorted(opts)}")
        assert_close(out, r_out, np.float32, what=f"out Lq={Lq} {sorted(opts)}")
        assert_close(lse, r_lse, np.float32, what=f"lse Lq={Lq} {sorted(opts)}")
        assert (w[r_w == 0] == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Lq", [16, 24, 40, 64])
def test_query_vectorised_clipped_key_runs(Lq, dtype, rng):
    """In a tile where some lanes are masked, each vector of query lanes runs the
    QK and P.V kernels only over the keys one of its lanes sees (the causal
    diagonal), in runs of adjacent vectors.  Four query heads on one key/value
    head put different heads side by side in a chunk: per-head key lengths make
    vectors that see keys not in one range, so a run can skip a vector in the
    middle; with causal masks and windows on top, the runs of every kind.
    Options, weights and lse along, against the reference; bit-identical for
    any thread count."""
    Lk = 230
    q = randn(rng, (2, 4, Lq, 24), dtype)
    k = randn(rng, (2, 1, Lk, 24), dtype)
    v = randn(rng, (2, 1, Lk, 18), dtype)
    lengths = np.array([[Lk, 20, Lk - 7, 33], [0, 150, 64, Lk]])
    bias = randn(rng, (4, Lq, Lk), dtype)
    mask = rng.random((Lq, Lk)) < 0.8
    cases = (dict(causal=True), dict(causal="bottom_right"), dict(kv_lengths=lengths),
             dict(kv_lengths=lengths, causal="bottom_right"), dict(kv_lengths=lengths, window=(25, 3)),
             dict(window=(40, 0)), dict(causal=True, softcap=5.0, bias=bias),
             dict(kv_lengths=lengths, mask=mask), dict(causal=True, return_weights=True))
    for opts in cases:
        want = R.attention(q, k, v, return_lse=True, **opts)
        got = [fastattn.attention(q, k, v, return_lse=True, num_threads=nt, **opts) for nt in (1, 2)]
        what = f"Lq={Lq} {sorted(opts)}"
        for i, name in enumerate(("out", "weights", "lse") if "return_weights" in opts else ("out", "lse")):
            assert_close(got[0][i], want[i], dtype if name != "lse" else compute_dtype(dtype),
                         what=f"{name} {what}")
            assert np.array_equal(got[1][i], got[0][i], equal_nan=True), f"{name} differs with threads ({what})"
