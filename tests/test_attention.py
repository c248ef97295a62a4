"""Differential tests of fastattn.attention against the float64 reference.

Shapes (odd lengths around tile sizes, long Lk with short Lq, many head dims,
broadcast batch dims), memory layouts, dtypes, thread determinism, input
immutability and ``out=``.  Torch comparisons run only where torch is importable.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastattn
from fa_testutil import (LAYOUTS, assert_close, assert_unchanged, compute_dtype, expected_dtype,
                      make_layout, randn, reference as R, snapshot, tol_for)

FLOATS = [np.float32, np.float64]


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# (q batch, k batch, v batch, Lq, Lk, Dk, Dv)
SHAPES = [
    ((), (), (), 1, 1, 1, 1),
    ((2,), (2,), (2,), 3, 17, 2, 5),
    ((2, 3), (2, 3), (2, 3), 63, 65, 64, 64),
    ((1, 2), (1, 2), (1, 2), 127, 129, 80, 80),
    ((2,), (2,), (2,), 65, 63, 96, 32),
    ((1,), (1,), (1,), 129, 127, 128, 128),
    ((), (), (), 17, 1000, 256, 256),
    ((2,), (2,), (2,), 4, 8192, 64, 64),
    ((), (), (), 1, 8192, 128, 128),
    ((), (), (), 1000, 1000, 64, 64),
    ((3,), (3,), (3,), 33, 1, 16, 8),
    ((2,), (2,), (2,), 1, 33, 8, 16),
    ((2, 3), (1, 3), (3,), 20, 31, 32, 32),
    ((4,), (), (), 9, 15, 24, 12),
    ((), (2, 2), (2, 2), 5, 7, 3, 9),
    ((2, 1), (1, 3), (1, 3), 6, 11, 16, 16),
    ((1,), (1,), (1,), 256, 64, 32, 1),
    ((2,), (2,), (2,), 3, 1025, 2, 2),
]


def _ids(s):
    return f"q{s[0]}k{s[1]}v{s[2]}-Lq{s[3]}-Lk{s[4]}-D{s[5]}-Dv{s[6]}".replace(" ", "")


def _make(rng, shape, dtype):
    qb, kb, vb, Lq, Lk, Dk, Dv = shape
    q = randn(rng, qb + (Lq, Dk), dtype)
    k = randn(rng, kb + (Lk, Dk), dtype)
    v = randn(rng, vb + (Lk, Dv), dtype)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_vs_reference(shape, dtype, causal, rng):
    q, k, v = _make(rng, shape, dtype)
    out = fastattn.attention(q, k, v, causal=causal)
    want = R.attention(q, k, v, causal=causal)
    assert out.dtype == dtype
    assert out.shape == want.shape
    assert_close(out, want, dtype)


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3], SHAPES[12]], ids=_ids)
def test_vs_reference_with_lse(shape, rng):
    for dtype in FLOATS:
        q, k, v = _make(rng, shape, dtype)
        out, lse = fastattn.attention(q, k, v, return_lse=True)
        want, want_lse = R.attention(q, k, v, return_lse=True)
        assert lse.dtype == dtype and lse.shape == want_lse.shape
        assert_close(out, want, dtype)
        assert_close(lse, want_lse, dtype)


@pytest.mark.parametrize("scale", [0.0, 1.0, 0.01, -0.5, 3.0])
def test_explicit_scale(scale, rng):
    q, k, v = _make(rng, ((2,), (2,), (2,), 13, 40, 16, 8), np.float64)
    assert_close(fastattn.attention(q, k, v, scale=scale), R.attention(q, k, v, scale=scale), np.float64)


def test_large_scores_stable(rng):
    """Scores in the thousands: online softmax must not overflow.  The float32
    scores themselves carry a rounding error of about half an ulp of their size
    (~3e-5 at 1000), which the weights inherit, so the tolerance grows with the
    largest score: the usual 1e-5 held or failed by the seed alone."""
    for dtype in FLOATS:
        q, k, v = _make(rng, ((), (), (), 31, 300, 32, 8), dtype)
        out = fastattn.attention(q, k, v, scale=50.0)
        want = R.attention(q, k, v, scale=50.0)
        assert np.isfinite(out).all()
        top = 50.0 * np.abs(q.astype(np.float64) @ k.astype(np.float64).T).max()
        assert top > 500                  # the case is what it says
        tol = max(tol_for(dtype), float(np.finfo(dtype).eps) * top / 4)
        assert_close(out, want, dtype, tol=tol)


# ------------------------------------------------------------------ dtypes
DTYPE_CASES = [
    (np.float16, np.float16, np.float16),
    (np.float32, np.float32, np.float32),
    (np.float64, np.float64, np.float64),
    (np.int64, np.int64, np.int64),
    (np.int32, np.int32, np.int32),
    (np.bool_, np.bool_, np.bool_),
    (np.float32, np.float64, np.float32),
    (np.float16, np.float32, np.float32),
    (np.float16, np.float16, np.float32),
    (np.int64, np.float32, np.float32),
    (np.int8, np.float64, np.float64),
    (np.uint8, np.uint8, np.float64),
]


@pytest.mark.parametrize("dq,dk,dv", DTYPE_CASES, ids=lambda d: np.dtype(d).name)
def test_dtypes(dq, dk, dv, rng):
    Lq, Lk, D, Dv = 23, 77, 40, 24
    q = randn(rng, (2, Lq, D), dq)
    k = randn(rng, (2, Lk, D), dk)
    v = randn(rng, (2, Lk, Dv), dv)
    want_dtype = expected_dtype(q, k, v)
    out, lse = fastattn.attention(q, k, v, return_lse=True)
    assert out.dtype == want_dtype, f"output dtype {out.dtype} != {want_dtype}"
    assert lse.dtype == compute_dtype(want_dtype), f"lse dtype {lse.dtype}"
    want = R.attention(q, k, v)
    assert_close(out, want, want_dtype)


def test_float16_computes_in_float32(rng):
    """float16 in, float16 out; accuracy of a float32 computation rounded once to float16."""
    q = randn(rng, (4, 100, 64), np.float16)
    k = randn(rng, (4, 300, 64), np.float16)
    v = randn(rng, (4, 300, 64), np.float16)
    out = fastattn.attention(q, k, v)
    assert out.dtype == np.float16
    want = R.attention(q, k, v)
    # a float16 accumulation would be far worse than the rounding of the final result
    err = np.sqrt(np.mean((out.astype(np.float64) - want) ** 2)) / np.sqrt(np.mean(want ** 2))
    assert err < 1e-3
    # and matches the float32 path rounded to float16 closely
    o32 = fastattn.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    np.testing.assert_allclose(out.astype(np.float32), o32.astype(np.float16).astype(np.float32),
                               rtol=2e-3, atol=2e-3)


def test_python_lists_accepted():
    q = [[1.0, 0.0], [0.0, 1.0]]
    k = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    v = [[1.0], [2.0], [3.0]]
    out = fastattn.attention(q, k, v)
    assert out.dtype == np.float64
    assert_close(out, R.attention(q, k, v), np.float64)


# ------------------------------------------------------------------ layouts
@pytest.mark.parametrize("layout", LAYOUTS + ["memmap"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_layouts(layout, dtype, rng, tmp_path):
    q0 = randn(rng, (2, 3, 37, 64), dtype)
    k0 = randn(rng, (2, 3, 70, 64), dtype)
    v0 = randn(rng, (2, 3, 70, 48), dtype)
    q, k, v = (make_layout(a, layout, tmp_path) for a in (q0, k0, v0))
    snaps = snapshot(q, k, v)
    out, lse = fastattn.attention(q, k, v, causal=True, return_lse=True)
    want, want_lse = R.attention(q0, k0, v0, causal=True, return_lse=True)
    assert_close(out, want, dtype)
    assert_close(lse, want_lse, dtype)
    assert_unchanged((q, k, v), snaps)
    # same result as the contiguous call
    c = fastattn.attention(np.ascontiguousarray(q0), np.ascontiguousarray(k0), np.ascontiguousarray(v0),
                           causal=True)
    assert_close(out, c, dtype)


def test_transposed_blhd_views(rng):
    """q/k/v given as (B, H, L, D) views of (B, L, H, D) buffers (a common layout)."""
    B, L, H, D = 2, 45, 4, 32
    for dtype in FLOATS:
        buf_q = randn(rng, (B, L, H, D), dtype)
        buf_k = randn(rng, (B, L + 7, H, D), dtype)
        buf_v = randn(rng, (B, L + 7, H, D), dtype)
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (buf_q, buf_k, buf_v))
        assert not q.flags.c_contiguous
        out = fastattn.attention(q, k, v)
        assert out.shape == (B, H, L, D)
        assert_close(out, R.attention(q, k, v), dtype)


def test_mixed_layouts_and_strange_strides(rng, tmp_path):
    q0 = randn(rng, (3, 29, 16), np.float32)
    k0 = randn(rng, (3, 41, 16), np.float32)
    v0 = randn(rng, (3, 41, 8), np.float32)
    q = make_layout(q0, "transposed")
    k = make_layout(k0, "negative")
    v = make_layout(v0, "memmap", tmp_path)
    snaps = snapshot(q, k, v)
    assert_close(fastattn.attention(q, k, v), R.attention(q0, k0, v0), np.float32)
    assert_unchanged((q, k, v), snaps)
    # zero strides from broadcast_to (read-only views)
    kb = np.broadcast_to(k0[:1], (3, 41, 16))
    assert_close(fastattn.attention(q0, kb, v0), R.attention(q0, kb, v0), np.float32)
    # a single column of a bigger array (element stride != 1 in the last axis)
    big = randn(rng, (3, 41, 16, 2), np.float32)
    ks = big[..., 0]
    assert_close(fastattn.attention(q0, ks, v0), R.attention(q0, ks, v0), np.float32)


def test_inputs_unchanged_with_all_options(rng):
    q = randn(rng, (2, 4, 17, 8), np.float64)
    k = randn(rng, (2, 2, 19, 8), np.float64)
    v = randn(rng, (2, 2, 19, 5), np.float64)
    mask = rng.random((17, 19)) < 0.8
    bias = randn(rng, (4, 17, 19), np.float64)
    lens = np.array([[19], [5]])
    slopes = np.array([0.1, 0.2, 0.3, 0.4])
    arrays = (q, k, v, mask, bias, lens, slopes)
    snaps = snapshot(*arrays)
    fastattn.attention(q, k, v, mask=mask, bias=bias, kv_lengths=lens, alibi_slopes=slopes,
                       causal="bottom_right", window=(5, 2), softcap=3.0,
                       return_weights=True, return_lse=True)
    assert_unchanged(arrays, snaps)


# ------------------------------------------------------------------ threads
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [((2, 4), (2, 4), (2, 4), 65, 300, 64, 64),
                                   ((), (), (), 3, 5000, 32, 16),
                                   ((1,), (1,), (1,), 257, 129, 80, 80)], ids=_ids)
def test_thread_determinism(shape, dtype, rng):
    q, k, v = _make(rng, shape, dtype)
    # each return mode may take its own code path; within a mode, the thread count must not matter
    for flags in (dict(), dict(return_lse=True), dict(return_weights=True, return_lse=True)):
        r1 = fastattn.attention(q, k, v, causal=True, num_threads=1, **flags)
        r1 = r1 if isinstance(r1, tuple) else (r1,)
        for nt in (2, 3, None):
            rn = fastattn.attention(q, k, v, causal=True, num_threads=nt, **flags)
            rn = rn if isinstance(rn, tuple) else (rn,)
            for a, b, name in zip(r1, rn, ("out", "2nd", "3rd")):
                assert np.array_equal(a, b), f"{name} differs between num_threads=1 and {nt} ({flags})"


def test_repeatable(rng):
    q, k, v = _make(rng, ((2,), (2,), (2,), 100, 333, 64, 64), np.float32)
    a = fastattn.attention(q, k, v)
    for _ in range(3):
        assert np.array_equal(fastattn.attention(q, k, v), a)


# ------------------------------------------------------------------ out=
@pytest.mark.parametrize("dtype", FLOATS + [np.float16])
def test_out_argument(dtype, rng):
    q, k, v = _make(rng, ((2,), (2,), (2,), 19, 23, 8, 6), dtype)
    out = np.full((2, 19, 6), np.nan, dtype=dtype)
    r = fastattn.attention(q, k, v, out=out)
    assert r is out
    assert_close(out, R.attention(q, k, v), dtype)
    out2 = np.zeros((2, 19, 6), dtype=dtype)
    r = fastattn.attention(q, k, v, out=out2, return_lse=True)
    assert isinstance(r, tuple) and r[0] is out2
    np.testing.assert_array_equal(out2, out)


def test_out_non_contiguous_view(rng):
    q, k, v = _make(rng, ((2,), (2,), (2,), 19, 23, 8, 6), np.float64)
    buf = np.zeros((2, 6, 19))
    out = buf.transpose(0, 2, 1)
    r = fastattn.attention(q, k, v, out=out)
    assert r is out
    assert_close(buf.transpose(0, 2, 1), R.attention(q, k, v), np.float64)


@pytest.mark.parametrize("dtype", FLOATS)
def test_out_is_written_in_place(dtype, rng):
    """out= (a decode loop's preallocated output) is written by the kernels
    directly -- C-ordered, transposed and negative-stride outputs, causal or not --
    with results bit-identical to the call without out=, and no output-sized
    temporary (tracemalloc sees NumPy's allocations).  Overlap with an input, a
    wrong shape, dtype or a read-only output raise."""
    import tracemalloc
    q, k, v = _make(rng, ((2,), (2,), (2,), 5, 40, 16, 8), dtype)
    want = fastattn.attention(q, k, v)
    want_c = fastattn.attention(q, k, v, causal=True)
    for out in (np.full((2, 5, 8), np.nan, dtype),
                np.zeros((2, 8, 5), dtype).transpose(0, 2, 1),
                np.zeros((2, 5, 16), dtype)[:, ::-1, ::2]):
        assert fastattn.attention(q, k, v, out=out) is out
        np.testing.assert_array_equal(out, want)
        assert fastattn.attention(q, k, v, causal=True, out=out, num_threads=1) is out
        np.testing.assert_array_equal(out, want_c)
    big_q, big_k, big_v = _make(rng, ((4,), (4,), (4,), 256, 64, 64, 64), dtype)
    out = np.empty((4, 256, 64), dtype)
    fastattn.attention(big_q, big_k, big_v, out=out, num_threads=1)
    tracemalloc.start()
    try:
        fastattn.attention(big_q, big_k, big_v, out=out, num_threads=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < out.nbytes // 4, f"{peak} bytes allocated for a {out.nbytes}-byte out="
    buf = np.zeros(2 * 5 * 16 + 2 * 40 * 16, dtype)
    qo = buf[:2 * 5 * 16].reshape(2, 5, 16)
    qo[...] = q
    with pytest.raises(ValueError, match="overlaps the input q"):
        fastattn.attention(qo, k, v, out=qo[..., :8])
    kv = buf[2 * 5 * 16:].reshape(2, 40, 16)
    kv[...] = k
    with pytest.raises(ValueError, match="overlaps the input k"):
        fastattn.attention(q, kv, v, out=kv[:, ::8, :8])
    with pytest.raises(ValueError, match="shape"):
        fastattn.attention(q, k, v, out=np.zeros((2, 5, 9), dtype))
    with pytest.raises(TypeError, match="dtype"):
        fastattn.attention(q, k, v, out=np.zeros((2, 5, 8), np.float16))
    ro = np.zeros((2, 5, 8), dtype)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fastattn.attention(q, k, v, out=ro)
    np.testing.assert_array_equal(ro, 0)


def test_attention_is_one_documented_function(rng):
    """fastattn.attention is compiled (the ISA module's ``attention``) but behaves as
    the documented Python function: docstring, keyword-only signature, module name,
    pickling by reference, positional extras refused, unknown keywords refused, and
    array-likes, float16 and int scales taken like numpy would."""
    import inspect
    import pickle

    import fastattn._api as api
    f = fastattn.attention
    assert f is api._K.attention
    assert f.__doc__.startswith("Exact scaled dot-product attention") and "num_threads" in f.__doc__
    assert f.__module__ == "fastattn"
    assert pickle.loads(pickle.dumps(f)) is f
    params = inspect.signature(f).parameters
    assert list(params)[:3] == ["q", "k", "v"]
    assert all(p.kind is p.KEYWORD_ONLY for p in list(params.values())[3:]) and len(params) == 20
    assert params["causal"].default is False and params["scale"].default is None
    q = rng.standard_normal((2, 5, 8)).astype(np.float32)
    with pytest.raises(TypeError):
        f(q, q, q, 0.5)                       # scale is keyword-only
    with pytest.raises(TypeError):
        f(q, q, q, sclae=0.5)
    with pytest.raises(TypeError):
        f(q, q)
    # a list, float16, an int scale: converted like numpy would
    got = f(q.tolist(), q, q, scale=1)
    assert got.dtype == np.float64                 # a list of floats promotes like numpy
    np.testing.assert_array_equal(got, f(q.astype(np.float64), q, q, scale=1.0))
    assert_close(got, fastattn.reference.attention(q, q, q, scale=1.0), np.float64)
    h = f(q.astype(np.float16), q.astype(np.float16), q.astype(np.float16), scale=1.0)
    assert h.dtype == np.float16
    assert_close(h, fastattn.reference.attention(q, q, q, scale=1.0), np.float16)


def _respelled(opts):
    """The same options in other spellings: arrays as nested lists, numpy scalars as
    Python numbers and back, tuples as lists, True as numpy.True_."""
    out = {}
    for name, x in opts.items():
        if isinstance(x, np.ndarray):
            x = x.tolist()
        elif isinstance(x, np.generic):
            x = x.item()
        elif isinstance(x, float):
            x = np.float64(x)
        elif isinstance(x, tuple):
            x = list(x)
        elif x is True and name == "causal":
            x = np.True_
        out[name] = x
    return out


@pytest.mark.parametrize("dtype", FLOATS)
def test_option_spellings_give_the_same_bits(dtype, rng):
    """Every option (causal in every spelling, window, softcap, return_lse,
    return_weights, out=, kv_lengths, masks, biases, ALiBi slopes, grouped heads,
    shared k and v) gives the same bits whichever way it is spelled -- ndarray or
    nested list, numpy scalar or Python number, tuple or list -- with out= too, and
    agrees with the float64 reference.  (One argument path: the spelling only
    changes how an option is converted, never what is computed.)"""
    shapes = [((2, 6), (2, 6), 5, 40), ((2, 6), (2, 2), 5, 40), ((6,), (3,), 40, 9), ((1, 4), (1, 2), 1, 33),
              ((2, 6), (2, 1), 5, 40), ((3, 4), (1, 4), 3, 20), ((2, 4), (1, 1), 1, 33)]   # MQA; shared k, v
    options = [dict(causal=None), dict(causal=True), dict(causal="top_left"),
               dict(causal="bottom_right"), dict(window=3), dict(window=(2, None)),
               dict(window=[None, 1], causal="bottom_right"), dict(window=(0, 0)),
               dict(softcap=5.0), dict(return_lse=True), dict(return_lse=False, scale=0.3),
               dict(causal="bottom_right", window=(4, 0), softcap=2.5, return_lse=True),
               dict(scale=np.float32(0.3)), dict(softcap=np.float64(4.0), scale=1 / np.sqrt(16)),
               dict(return_weights=True), dict(return_weights=True, return_lse=True, causal=True),
               dict(return_weights=True, window=(2, 1), softcap=3.0, causal="bottom_right")]

    for qb, kb, Lq, Lk in shapes:
        q = randn(rng, qb + (Lq, 16), dtype)
        k = randn(rng, kb + (Lk, 16), dtype)
        v = randn(rng, kb + (Lk, 8), dtype)
        n = int(np.prod(qb))
        kv_opts = [dict(kv_lengths=np.arange(n).reshape(qb) % (Lk + 1)),          # 0 .. Lk
                   dict(kv_lengths=np.full(qb[:-1] + (1,), Lk // 2, np.int32)),   # broadcast heads
                   dict(kv_lengths=(np.arange(2 * n, dtype=np.int64) % Lk)[::-2].reshape(qb),
                        causal="bottom_right", return_lse=True),                    # strided
                   dict(kv_lengths=np.array(Lk - 1), window=(3, 0))]               # 0-d
        m = rng.random(qb + (Lq, Lk)) < 0.7
        m[..., 0, :] = False                                                        # a row sees nothing
        score_opts = [dict(mask=m), dict(mask=m[..., :1, :, :]),                    # broadcast heads
                      dict(mask=np.ascontiguousarray(m[(0,) * (len(qb) - 1)][0, :1]), causal=True),  # (1, Lk)
                      dict(mask=np.asfortranarray(m[(0,) * len(qb)]), return_lse=True),   # (Lq, Lk), strided
                      dict(bias=randn(rng, qb + (Lq, Lk), dtype)),
                      dict(bias=randn(rng, (Lq, 1), dtype), mask=m, softcap=3.0),
                      dict(bias=randn(rng, qb[-1:] + (1, Lk), dtype), kv_lengths=np.array(Lk // 2)),
                      dict(mask=m[(0,) * len(qb)][-1], bias=randn(rng, (Lk,), dtype))]  # 1-D: per key
        alibi_opts = [dict(alibi_slopes=rng.uniform(0, 1, qb)),                            # float64
                      dict(alibi_slopes=rng.uniform(0, 1, qb[-1:]).astype(np.float32),     # per head
                           causal="bottom_right", return_lse=True),
                      dict(alibi_slopes=rng.uniform(0, 1, qb[:-1] + (1,))[..., ::-1],      # broadcast heads
                           mask=m, window=(3, 1)),
                      dict(alibi_slopes=rng.uniform(0, 2, 2 * n)[::2].reshape(qb),         # strided
                           kv_lengths=np.array(Lk // 2), softcap=4.0, causal=True),
                      dict(alibi_slopes=np.array(0.25), bias=randn(rng, (Lq, Lk), dtype)),  # 0-d
                      dict(alibi_slopes=rng.uniform(0, 1, qb), mask=m, kv_lengths=np.array(Lk - 2),
                           return_weights=True, return_lse=True)]
        for opts in options + kv_opts + score_opts + alibi_opts:
            want = fastattn.attention(q, k, v, **_respelled(opts))
            got = fastattn.attention(q, k, v, **opts)
            out = np.full(qb + (Lq, 8), np.nan, dtype)
            got_out = fastattn.attention(q, k, v, out=out, num_threads=1, **opts)
            if opts.get("return_lse") or opts.get("return_weights"):
                parts = 1 + bool(opts.get("return_lse")) + bool(opts.get("return_weights"))
                assert type(got) is tuple and len(got) == len(got_out) == len(want) == parts
                assert got_out[0] is out
                if opts.get("return_lse"):
                    assert got[-1].shape == q.shape[:-1] and got[-1].dtype == dtype
                if opts.get("return_weights"):
                    assert got[1].shape == q.shape[:-1] + (Lk,) and got[1].dtype == dtype
                    assert_close(got[1], R.attention(q, k, v, **opts)[1], dtype)
                for a, b, w in zip(got[1:], got_out[1:], want[1:]):
                    np.testing.assert_array_equal(a, w)
                    np.testing.assert_array_equal(b, w)
                got, got_out, want = got[0], got_out[0], want[0]
            else:
                assert got_out is out
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got_out, want)
            ref_opts = {n: o for n, o in opts.items() if n not in ("return_lse", "return_weights")}
            assert_close(got, R.attention(q, k, v, **ref_opts), dtype)
    # conversions (unsigned, big-endian, float16, lists, ints for floats): the same
    # answers; invalid values: errors naming the argument
    q = randn(rng, (2, 6, 5, 16), dtype)
    k = randn(rng, (2, 2, 40, 16), dtype)
    v = randn(rng, (2, 2, 40, 8), dtype)
    want = fastattn.attention(q, k, v, causal="bottom_right", softcap=2.0, window=3)
    for kw, plain in ((dict(causal=np.True_), dict(causal=True)), (dict(softcap=2), dict(softcap=2.0)),
                      (dict(window=np.int64(3)), dict(window=3)), (dict(scale=1), dict(scale=1.0))):
        np.testing.assert_array_equal(fastattn.attention(q, k, v, **kw), fastattn.attention(q, k, v, **plain))
    lengths = np.array([[3], [40]])
    want_kl = fastattn.attention(q, k, v, kv_lengths=lengths)
    for kl in (lengths.astype(np.uint16), lengths.tolist(), lengths.astype(">i8")):
        np.testing.assert_array_equal(fastattn.attention(q, k, v, kv_lengths=kl), want_kl)
    mask = rng.random((5, 40)) < 0.5
    bias = randn(rng, (5, 40), dtype)
    want_mb = fastattn.attention(q, k, v, mask=mask, bias=bias)
    np.testing.assert_array_equal(fastattn.attention(q, k, v, mask=mask.tolist(), bias=bias), want_mb)
    assert_close(fastattn.attention(q, k, v, mask=mask, bias=bias.astype(np.float16)), want_mb, np.float16)
    np.testing.assert_array_equal(fastattn.attention(q, k, v, mask=mask[0], bias=bias),      # 1-D
                                  fastattn.attention(q, k, v, mask=mask[:1], bias=bias))
    slopes = np.array([0.5, 0.25, 0.125, 1.0, 2.0, 0.0])
    want_al = fastattn.attention(q, k, v, alibi_slopes=slopes.astype(dtype))
    for sl in (slopes.tolist(), slopes.astype(np.float16), slopes.astype(">f8")):
        np.testing.assert_array_equal(fastattn.attention(q, k, v, alibi_slopes=sl), want_al)
    np.testing.assert_array_equal(fastattn.attention(q, k, v, alibi_slopes=np.array([1, 0, 2, 1, 0, 3])),
                                  fastattn.attention(q, k, v, alibi_slopes=np.array([1., 0, 2, 1, 0, 3])))
    buf = np.zeros((2, 6, 5, 40), dtype)
    with pytest.raises(ValueError, match="overlaps the input bias"):
        fastattn.attention(q, k, v, bias=buf, out=buf[..., :8])
    np.testing.assert_array_equal(
        fastattn.attention(q, k, v, causal="bottom_right", softcap=np.float64(2.0), window=(3, 3)), want)
    lse = fastattn.attention(q, k, v, return_lse=1)
    assert isinstance(lse, tuple) and len(lse) == 2
    w = fastattn.attention(q, k, v, return_weights=np.True_, causal=True)
    assert isinstance(w, tuple) and len(w) == 2
    np.testing.assert_array_equal(w[1], fastattn.attention(q, k, v, return_weights=True, causal=True)[1])
    # one key/value head (multi-query) is grouped (6 query heads over 1), not
    # broadcast: the same values as the heads repeated, to rounding
    assert_close(fastattn.attention(q, k[:, :1], v[:, :1]),
                 fastattn.attention(q, np.repeat(k[:, :1], 6, axis=1), np.repeat(v[:, :1], 6, axis=1)),
                 dtype)
    for kw, err, match in ((dict(window=(1, 2, 3)), TypeError, "window"),
                           (dict(window=-1), ValueError, "window"),
                           (dict(window=True), TypeError, "window"),
                           (dict(softcap=-1.0), ValueError, "softcap"),
                           (dict(softcap=float("inf")), ValueError, "softcap"),
                           (dict(causal="top-left"), ValueError, "causal"),
                           (dict(scale=float("nan")), ValueError, "scale"),
                           (dict(kv_lengths=np.array([41])), ValueError, "kv_lengths"),
                           (dict(kv_lengths=np.array([[-1], [3]], np.int32)), ValueError, "kv_lengths"),
                           (dict(kv_lengths=np.array([1, 2, 3])), ValueError, "kv_lengths"),
                           (dict(kv_lengths=np.array([2.0])), TypeError, "kv_lengths"),
                           (dict(mask=np.ones((3, 40), bool)), ValueError, "mask"),
                           (dict(mask=np.ones((5, 40), np.int8)), TypeError, "mask"),
                           (dict(bias=np.zeros((2, 5, 40))), ValueError, "bias"),
                           (dict(alibi_slopes=np.ones(3)), ValueError, "alibi_slopes"),
                           (dict(alibi_slopes=np.ones((6, 1))), ValueError, "alibi_slopes"),
                           (dict(alibi_slopes=np.ones(6, complex)), TypeError, "alibi_slopes")):
        with pytest.raises(err, match=match):
            fastattn.attention(q, k, v, **kw)
    with pytest.raises(ValueError, match="broadcast"):
        fastattn.attention(q, k[:, :1].repeat(4, axis=1), v[:, :1].repeat(4, axis=1))

# ------------------------------------------------------------------ torch
def _torch_sdpa(torch, q, k, v, **kw):
    t = [torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v)]
    return torch.nn.functional.scaled_dot_product_attention(*t, **kw).numpy()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("causal", [False, True])
def test_vs_torch(dtype, causal):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    for shape in [((2, 3), (2, 3), (2, 3), 33, 33, 64, 64), ((1, 2), (1, 2), (1, 2), 65, 65, 80, 80),
                  ((2,), (2,), (2,), 17, 129, 32, 16)]:
        q, k, v = _make(rng, shape, dtype)
        want = _torch_sdpa(torch, q, k, v, is_causal=causal)
        out = fastattn.attention(q, k, v, causal=causal)
        assert_close(out, want, dtype, tol=1e-5 if dtype == np.float32 else 1e-10)


# ------------------------------------------------------------------ unusual inputs
@pytest.mark.parametrize("dtype", [">f8", ">f4", "<f8"])
def test_byte_order(dtype, rng):
    q0, k0, v0 = _make(rng, ((2,), (2,), (2,), 9, 21, 16, 8), np.float64)
    q, k, v = (a.astype(dtype) for a in (q0, k0, v0))
    out = fastattn.attention(q, k, v)
    want_dtype = np.dtype(dtype).newbyteorder("=")
    assert out.dtype == want_dtype or out.dtype == np.dtype(dtype)
    assert_close(out, R.attention(q, k, v), np.dtype(dtype).newbyteorder("="))


def test_misaligned_data(rng):
    q0, k0, v0 = _make(rng, ((2,), (2,), (2,), 9, 21, 16, 8), np.float64)

    def misaligned(a):
        buf = np.zeros(a.nbytes + 1, dtype=np.uint8)
        m = buf[1:].view(a.dtype).reshape(a.shape)
        m[...] = a
        assert not m.flags.aligned
        return m

    q, k, v = (misaligned(a) for a in (q0, k0, v0))
    assert_close(fastattn.attention(q, k, v), R.attention(q0, k0, v0), np.float64)


@pytest.mark.parametrize("D,Dv", [(512, 512), (1024, 64), (64, 1024), (300, 3)])
def test_large_head_dims(D, Dv, rng):
    for dtype in FLOATS:
        q, k, v = _make(rng, ((2,), (2,), (2,), 33, 70, D, Dv), dtype)
        out, lse = fastattn.attention(q, k, v, causal=True, return_lse=True)
        want, want_lse = R.attention(q, k, v, causal=True, return_lse=True)
        assert_close(out, want, dtype)
        assert_close(lse, want_lse, dtype)


def test_nan_in_query_row_poisons_only_that_row(rng):
    q, k, v = _make(rng, ((2,), (2,), (2,), 9, 21, 16, 8), np.float64)
    q[1, 4, 3] = np.nan
    out = fastattn.attention(q, k, v)
    want = R.attention(q, k, v)
    assert np.isnan(out[1, 4]).all()
    assert np.isnan(out).sum() == out.shape[-1]
    assert_close(out, want, np.float64)


def test_long_keys_small_queries_many_threads(rng):
    for dtype in FLOATS:
        q, k, v = _make(rng, ((1, 2), (1, 2), (1, 2), 2, 8192, 64, 64), dtype)
        for causal in (False, "bottom_right"):
            want = R.attention(q, k, v, causal=causal)
            out = fastattn.attention(q, k, v, causal=causal, num_threads=2)
            assert_close(out, want, dtype)
            assert np.array_equal(out, fastattn.attention(q, k, v, causal=causal, num_threads=1))


def test_many_rows_tiny_dims(rng):
    q, k, v = _make(rng, ((3,), (3,), (3,), 1500, 700, 1, 1), np.float32)
    assert_close(fastattn.attention(q, k, v, causal=True), R.attention(q, k, v, causal=True), np.float32)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("Lq", [4, 40, 300])
def test_steep_score_falloff(Lq, dtype, rng):
    """Scores that fall off steadily along a row (ALiBi, a distance bias, large
    logits) give probabilities spanning the whole exponent range: the kernels
    drop the P.V terms far below float rounding (fa_vexp_p) to keep subnormals
    out of the multiply-adds, and the result still matches the float64
    reference; returned weights and softmax() keep their tiny values."""
    Lk = 333
    q = randn(rng, (2, 2, Lq, 32), dtype)
    k = randn(rng, (2, 2, Lk, 32), dtype)
    v = randn(rng, (2, 2, Lk, 16), dtype)
    for opts in (dict(alibi_slopes=np.array([1.0, 4.0])),
                 dict(alibi_slopes=np.array([0.3, 1.0]), causal="bottom_right"),
                 dict(bias=-np.abs(np.arange(Lq)[:, None] - np.arange(Lk)[None, :]).astype(dtype)),
                 dict(scale=8.0)):                                       # logits of size ~50
        assert_close(fastattn.attention(q, k, v, **opts), R.attention(q, k, v, **opts), dtype,
                     what=str(sorted(opts)))
    # a probability of e^-50 (~2e-22): below the P.V cut, kept where it is returned
    s = np.array([[0.0, -50.0, -80.0]], dtype)
    want = np.exp(s - np.log(np.exp(s.astype(np.float64)).sum()))
    np.testing.assert_allclose(fastattn.softmax(s), want, rtol=1e-5)
    qq = np.ones((1, 1), dtype)
    _, w = fastattn.attention(qq, s.T, np.ones((3, 1), dtype), scale=1.0, return_weights=True)
    np.testing.assert_allclose(w, want, rtol=1e-5)
