"""Property-based differential tests: fastattn vs fastattn.reference on random
shapes, memory layouts, dtypes and options (hypothesis).

Profiles (``FASTATTN_HYPOTHESIS_PROFILE``):

``ci``    (default) about 30 s on 2 cores;
``long``  ~20x more examples, for a nightly / pre-release run;
``dev``   a handful of examples, for editing this file.

Run ``pytest tests/test_hypothesis.py --hypothesis-show-statistics`` to see how
many examples ran.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fastattn  # noqa: E402
from fa_testutil import tol_for, assert_close, compute_dtype, expected_dtype, make_layout  # noqa: E402
from fa_testutil import reference as R  # noqa: E402

_COMMON = dict(deadline=None, derandomize=False, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=500, **_COMMON)
settings.register_profile("long", max_examples=10000, **_COMMON)
settings.register_profile("dev", max_examples=20, **_COMMON)
PROFILE = os.environ.get("FASTATTN_HYPOTHESIS_PROFILE", "ci")
BASE = settings.get_profile(PROFILE)


def scaled(n):
    """Examples for one test: the profile's budget times n (tests differ in cost)."""
    return settings(BASE, max_examples=max(1, int(BASE.max_examples * n)))


DTYPES = [np.float64, np.float32, np.float16, np.int8, np.int32, np.bool_]
FLOATS = [np.float64, np.float32, np.float16]
LAYOUTS = ["contiguous", "transposed", "negative", "sliced", "fortran", "readonly", "big_endian"]


def _layout(a, layout):
    if layout == "big_endian":
        if a.dtype.kind in "fiu" and a.dtype.itemsize > 1:
            return a.astype(a.dtype.newbyteorder(">"))
        return a
    if a.ndim < 2:
        return a
    return make_layout(a, layout)


def _values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-3, 4, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _broadcastable(rng, shape):
    """A random shape that broadcasts to ``shape`` (dims dropped from the left or set to 1)."""
    nd = len(shape) - int(rng.integers(0, len(shape) + 1)) if len(shape) else 0
    nd = max(nd, 0)
    sub = list(shape[len(shape) - nd:])
    for i in range(len(sub)):
        if rng.random() < 0.3:
            sub[i] = 1
    return tuple(sub)


@st.composite
def attention_problems(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    nbatch = draw(st.integers(0, 2))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=nbatch, max_size=nbatch)))
    if draw(st.integers(0, 30)) == 0 and batch:
        batch = (0,) + batch[1:]                      # an empty batch dim now and then
    hk = draw(st.integers(1, 3))
    g = draw(st.sampled_from([1, 1, 2, 3]))           # GQA: query heads = g * kv heads
    kind = draw(st.sampled_from(["prefill", "prefill", "decode", "long_decode", "long_chunk", "tiny"]))
    if kind == "prefill":
        Lq, Lk = draw(st.integers(1, 70)), draw(st.integers(1, 140))
    elif kind == "decode":
        Lq, Lk = draw(st.integers(1, 3)), draw(st.integers(1, 300))
    elif kind == "long_decode":                       # the split-key path
        Lq, Lk = 1, draw(st.integers(1024, 2600))
        batch, hk, g = (), draw(st.integers(1, 2)), draw(st.sampled_from([1, 4]))
    elif kind == "long_chunk":                        # query-vectorised units, split keys
        Lq, Lk = draw(st.sampled_from([16, 31, 32, 45, 64, 80])), draw(st.integers(2048, 2600))
        batch, hk, g = (), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    else:
        Lq, Lk = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    long = kind in ("long_decode", "long_chunk")
    Dk = draw(st.sampled_from([1, 3, 8, 16, 17, 32, 64, 0])) if not long else 16
    Dv = draw(st.sampled_from([1, 4, 8, 13, 32, 0])) if not long else 8
    dts = [draw(st.sampled_from(DTYPES)) for _ in range(3)]
    if draw(st.booleans()):
        dts = [dts[0]] * 3
    heads_q = (g * hk,)
    qs = batch + heads_q + (Lq, Dk)
    ks = batch + (hk, Lk, Dk)
    vs = batch + (hk, Lk, Dv)
    if draw(st.booleans()):                            # broadcast k/v batch dims
        ks = tuple(1 if (i < len(batch) and rng.random() < 0.5) else s for i, s in enumerate(ks))
        vs = ks[:-1] + (Dv,)
    arrays = []
    for shape, dt in zip((qs, ks, vs), dts):
        a = _values(rng, shape, dt)
        arrays.append(_layout(a, draw(st.sampled_from(LAYOUTS))))
    bshape = np.broadcast_shapes(qs[:-2], ks[:-2][:-1] + (g * hk,), vs[:-2][:-1] + (g * hk,))
    score = bshape + (Lq, Lk)
    kw = {}
    kw["causal"] = draw(st.sampled_from([False, True, "top_left", "bottom_right"]))
    if draw(st.booleans()):
        side = st.one_of(st.none(), st.integers(0, max(Lk, 1) + 2))
        kw["window"] = draw(st.one_of(st.integers(0, max(Lk, 1) + 2), st.tuples(side, side)))
    if draw(st.integers(0, 3)) == 0:
        kw["mask"] = _layout(rng.random(_broadcastable(rng, score)) < 0.8, draw(st.sampled_from(LAYOUTS[:5])))
    if draw(st.integers(0, 3)) == 0:
        kw["bias"] = _layout(_values(rng, _broadcastable(rng, score), draw(st.sampled_from(FLOATS))),
                             draw(st.sampled_from(LAYOUTS)))
    if draw(st.integers(0, 2)) == 0:
        shape = _broadcastable(rng, bshape)
        if len(shape) == 1 and len(bshape) >= 2:
            shape = (1,) + shape          # a 1-D table is per sequence: per-head values as (1, H)
        kw["kv_lengths"] = rng.integers(0, Lk + 1, size=shape)
    if draw(st.integers(0, 3)) == 0:
        kw["softcap"] = draw(st.floats(0.5, 50.0))
    if draw(st.integers(0, 3)) == 0:
        kw["alibi_slopes"] = rng.uniform(0, 1, size=_broadcastable(rng, bshape))
    if draw(st.integers(0, 3)) == 0:
        kw["scale"] = draw(st.floats(-2.0, 2.0))
    kw["return_weights"] = not long and draw(st.booleans())
    kw["return_lse"] = draw(st.booleans())
    kw["num_threads"] = draw(st.sampled_from([1, 2, 3]))
    if draw(st.integers(0, 4)) == 0:
        out_shape = bshape + (Lq, Dv)
        odt = expected_dtype(*arrays)
        kw["out"] = make_layout(np.full(out_shape, 7, dtype=odt), draw(st.sampled_from(LAYOUTS[:5])))
    return arrays, kw


def _assert_lse_close(r, w, dt, Lk):
    """Same NaN/inf positions (and infinities); finite values within the dtype's
    tolerance relative to max(|lse|) + log(Lk + 1) + 1."""
    r64, w64 = np.asarray(r, np.float64), np.asarray(w, np.float64)
    assert r64.shape == w64.shape
    assert np.array_equal(np.isnan(r64), np.isnan(w64)), "lse: NaN positions differ"
    inf = np.isinf(w64)
    assert np.array_equal(np.isinf(r64), inf) and np.array_equal(r64[inf], w64[inf]), "lse: infinities differ"
    fin = np.isfinite(w64)
    if fin.any():
        floor = np.abs(w64[fin]).max() + np.log(Lk + 1) + 1
        err = np.abs(r64[fin] - w64[fin]).max() / floor
        assert err <= tol_for(dt), f"lse: error {err:.3e} (relative to {floor:.3g}) > {tol_for(dt):.1e}"


@scaled(1.0)
@given(problem=attention_problems())
def test_attention_matches_reference(problem):
    (q, k, v), kw = problem
    snaps = [np.array(a, copy=True) for a in (q, k, v)]
    res = fastattn.attention(q, k, v, **kw)
    ref_kw = {key: val for key, val in kw.items() if key not in ("out", "num_threads")}
    ref = R.attention(q, k, v, **ref_kw)
    res = res if isinstance(res, tuple) else (res,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    odt = expected_dtype(q, k, v).newbyteorder("=")
    assert res[0].dtype == odt
    if "out" in kw:
        assert res[0] is kw["out"]
    # float16 inputs with large Lk accumulate rounding in the float16 output only
    names = ["out"] + (["weights"] if kw["return_weights"] else []) + (["lse"] if kw["return_lse"] else [])
    for name, r, w in zip(names, res, ref):
        dt = compute_dtype(odt) if name == "lse" else odt
        if name == "lse":
            assert r.dtype == compute_dtype(odt)
        if name == "lse":
            # lse values are O(log Lk + |scores|): compare them with an absolute
            # floor (one visible key whose score is ~0 by cancellation has no
            # relative accuracy to offer)
            _assert_lse_close(r, w, dt, k.shape[-2])
        elif name == "out":
            # outputs are weighted means of the values: their rounding error scales
            # with |v|, not with |out|, which can be ~0 by cancellation (one query,
            # one value column of mixed signs)
            w64 = np.asarray(w, np.float64)
            vf = np.abs(np.asarray(v, np.float64))
            vmax = vf[np.isfinite(vf)].max() if np.isfinite(vf).any() else 0.0
            fin = np.isfinite(w64)
            rms = np.sqrt(np.mean(w64[fin] ** 2)) if fin.any() else 0.0
            tol = tol_for(dt) * (max(1.0, vmax / rms) if rms > 0 else 1.0)
            assert_close(r, w, dtype=dt, tol=tol, what=name)
        else:
            assert_close(r, w, dtype=dt, what=name)
    for a, s in zip((q, k, v), snaps):
        np.testing.assert_array_equal(a, s)


@st.composite
def softmax_problems(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    nd = draw(st.integers(0, 4))
    hi = {0: 1, 1: 300, 2: 70, 3: 20, 4: 10}[nd]
    shape = tuple(draw(st.lists(st.integers(0, hi), min_size=nd, max_size=nd)))
    dt = draw(st.sampled_from(DTYPES))
    x = _values(rng, shape, dt)
    if x.dtype.kind == "f" and x.size and draw(st.booleans()):
        flat = x.reshape(-1)
        for val in draw(st.lists(st.sampled_from([np.nan, np.inf, -np.inf]), max_size=4)):
            flat[rng.integers(0, x.size)] = val
        if x.ndim and draw(st.booleans()):
            x[..., 0] = -np.inf                       # rows that may be all -inf
    x = _layout(x, draw(st.sampled_from(LAYOUTS))) if x.ndim >= 2 else x
    axis = draw(st.one_of(st.none(), st.integers(-x.ndim, x.ndim - 1))) if x.ndim else None
    fn = draw(st.sampled_from(["softmax", "log_softmax"]))
    kw = dict(axis=axis, num_threads=draw(st.sampled_from([1, 2, 3])))
    if draw(st.integers(0, 3)) == 0:
        odt = expected_dtype(x).newbyteorder("=")
        kw["out"] = make_layout(np.full(x.shape, 7, odt), draw(st.sampled_from(LAYOUTS[:5]))) \
            if x.ndim >= 2 else np.full(x.shape, 7, odt)
    return fn, x, kw


@scaled(0.6)
@given(problem=softmax_problems())
def test_softmax_matches_reference(problem):
    fn, x, kw = problem
    snap = np.array(x, copy=True)
    res = getattr(fastattn, fn)(x, **kw)
    ref = getattr(R, fn)(x, axis=kw["axis"])
    odt = expected_dtype(x).newbyteorder("=")
    assert res.dtype == odt and res.shape == x.shape
    if "out" in kw:
        assert res is kw["out"]
    assert_close(res, ref, dtype=odt)
    np.testing.assert_array_equal(x, snap)


@st.composite
def split_problems(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    B, Lq, Dk, Dv = draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.integers(1, 16)), draw(st.integers(1, 8))
    Lk = draw(st.integers(1, 200))
    cuts = sorted(set(draw(st.lists(st.integers(0, Lk), max_size=3))) | {0, Lk})
    dt = draw(st.sampled_from([np.float64, np.float32]))
    q, k, v = (rng.standard_normal(s).astype(dt) for s in ((B, Lq, Dk), (B, Lk, Dk), (B, Lk, Dv)))
    causal = draw(st.sampled_from([False, "bottom_right"]))
    return q, k, v, cuts, causal


@scaled(0.3)
@given(problem=split_problems())
def test_merge_of_key_splits_matches_full_attention(problem):
    """attention over key ranges + merge_attention == attention over all keys."""
    q, k, v, cuts, causal = problem
    Lk = k.shape[1]
    outs, lses = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        # causal bottom_right over the full key range, restricted to [a, b): a mask
        i = np.arange(q.shape[1])[:, None]
        j = np.arange(a, b)[None, :]
        mask = (j <= i + Lk - q.shape[1]) if causal else np.ones((q.shape[1], b - a), bool)
        o, s = fastattn.attention(q, k[:, a:b], v[:, a:b], mask=mask, return_lse=True)
        outs.append(o)
        lses.append(s)
    mo, ml = fastattn.merge_attention(outs, lses)
    ro, rl = R.attention(q, k, v, causal=causal, return_lse=True)
    # Compared against rounding bounds, not a relative tolerance: random draws
    # make outputs and lse values that are near 0 by cancellation (one visible
    # key with q.k ~ 0, values of mixed sign), where a relative comparison asks
    # for digits the dtype never had.  A score's rounding error is at most about
    # Dk eps sum|q_i k_i| scale; it moves lse by as much and each weight by that
    # relative amount, so the output by that times max|v|.  Infinities exactly.
    eps = np.finfo(q.dtype).eps
    scale = 1 / np.sqrt(q.shape[-1])
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    dot_abs = (np.abs(q64) @ np.abs(k64).transpose(0, 2, 1)).max(-1) * scale      # (B, Lq)
    score_err = (q.shape[-1] + 2) * dot_abs + np.log(Lk) + 1
    ml64, rl64 = ml.astype(np.float64), rl.astype(np.float64)
    fin = np.isfinite(rl64)
    assert np.array_equal(np.isfinite(ml64), fin) and np.array_equal(ml64[~fin], rl64[~fin])
    assert np.all(np.abs(ml64[fin] - rl64[fin]) <= (4 * eps * (score_err + np.abs(rl64)))[fin])
    vmax = np.abs(v.astype(np.float64)).max(axis=(1, 2))[:, None, None] if v.size else 0.0
    out_bound = 4 * eps * (2 * score_err[..., None] + Lk + 4) * vmax   # + the P.V sum of Lk terms
    assert np.all(np.abs(mo.astype(np.float64) - ro) <= out_bound)
