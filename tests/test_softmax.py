"""fastattn.softmax / log_softmax against the reference and scipy."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastattn
from fa_testutil import (LAYOUTS, assert_close, assert_unchanged, expected_dtype, make_layout, randn,
                      reference as R, scipy_special, snapshot)

FLOATS = [np.float32, np.float64]
FUNCS = {"softmax": (fastattn.softmax, R.softmax), "log_softmax": (fastattn.log_softmax, R.log_softmax)}


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


SHAPES = [(1,), (7,), (1000,), (3, 5), (5, 1), (1, 5), (4, 129), (17, 1023), (2, 3, 65),
          (3, 1, 4, 33), (2, 8193)]


def _axes(ndim):
    return list(range(-ndim, ndim)) + [None]


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_vs_reference_all_axes(shape, dtype, name, rng):
    fast, ref = FUNCS[name]
    x = randn(rng, shape, dtype, scale=4.0)
    for axis in _axes(len(shape)):
        got = fast(x, axis=axis)
        assert got.dtype == dtype and got.shape == x.shape
        assert_close(got, ref(x, axis=axis), dtype, what=f"{name} axis={axis}")


@pytest.mark.parametrize("name", list(FUNCS))
def test_default_axis_is_last(name, rng):
    fast, _ = FUNCS[name]
    x = randn(rng, (4, 6, 9), np.float64)
    np.testing.assert_array_equal(fast(x), fast(x, axis=-1))
    np.testing.assert_array_equal(fast(x), fast(x, axis=2))


@pytest.mark.parametrize("dtype", FLOATS)
def test_vs_scipy(dtype, rng):
    x = randn(rng, (6, 7, 8), dtype, scale=3.0)
    for axis in _axes(3):
        assert_close(fastattn.softmax(x, axis=axis), scipy_special.softmax(x.astype(np.float64), axis=axis),
                     dtype)
        assert_close(fastattn.log_softmax(x, axis=axis),
                     scipy_special.log_softmax(x.astype(np.float64), axis=axis), dtype)


def test_extreme_values(rng):
    x = np.array([[1000.0, 999.0, -1000.0], [-1e300, 0.0, 1e300], [1e-300, -1e-300, 0.0]])
    assert_close(fastattn.softmax(x), scipy_special.softmax(x, axis=-1), np.float64)
    assert_close(fastattn.log_softmax(x), scipy_special.log_softmax(x, axis=-1), np.float64)
    x32 = np.array([[80.0, 90.0, -100.0], [1e38, -1e38, 0.0]], dtype=np.float32)
    assert_close(fastattn.softmax(x32), R.softmax(x32), np.float32)
    assert_close(fastattn.log_softmax(x32), R.log_softmax(x32), np.float32)


@pytest.mark.parametrize("dtype", FLOATS)
def test_exp_elementwise_accuracy(dtype):
    """Every element's weight to a few ulp: rows [0, x] give 1 / (1 + e^x) and
    e^x / (1 + e^x), so the vectorised exp is seen one argument at a time over
    its whole normal range (the RMS tolerances elsewhere would hide a bad
    polynomial coefficient or range reduction at some arguments)."""
    lo = -86.0 if dtype == np.float32 else -700.0
    x = np.linspace(lo, 0.0, 200003).astype(dtype)
    rows = np.stack([np.zeros_like(x), x], axis=1)
    got = fastattn.softmax(rows, axis=-1).astype(np.float64)
    e = np.exp(x.astype(np.float64))
    want = np.stack([1 / (1 + e), e / (1 + e)], axis=1)
    eps = np.finfo(dtype).eps
    rel = np.abs(got - want) / want
    assert rel.max() <= 4 * eps, (float(rel.max() / eps), float(x[np.argmax(rel.max(axis=1))]))


# ------------------------------------------------------------------ special rows
@pytest.mark.parametrize("dtype", FLOATS + [np.float16])
@pytest.mark.parametrize("axis", [-1, 0])
def test_all_neg_inf_rows(dtype, axis, rng):
    x = randn(rng, (5, 37), dtype)
    x[2] = -np.inf
    x[4, 3:] = -np.inf
    if axis == 0:
        x = np.ascontiguousarray(x.T)
    sm = fastattn.softmax(x, axis=axis)
    ls = fastattn.log_softmax(x, axis=axis)
    if axis == 0:
        sm, ls, xx = sm.T, ls.T, x.T
    else:
        xx = x
    assert not np.isnan(sm).any() and not np.isnan(ls).any()
    np.testing.assert_array_equal(sm[2], 0.0)
    np.testing.assert_array_equal(ls[2], -np.inf)
    np.testing.assert_array_equal(sm[4, 3:], 0.0)
    np.testing.assert_array_equal(ls[4, 3:], -np.inf)
    assert_close(sm, R.softmax(xx), dtype)
    assert_close(ls, R.log_softmax(xx), dtype)


def test_all_neg_inf_whole_array_axis_none():
    x = np.full((3, 4), -np.inf)
    np.testing.assert_array_equal(fastattn.softmax(x, axis=None), 0.0)
    np.testing.assert_array_equal(fastattn.log_softmax(x, axis=None), -np.inf)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_inf_nan_poison_only_their_row(dtype, bad, rng):
    x = randn(rng, (6, 50), dtype)
    x[1, 7] = bad
    x[4, 49] = bad
    x[3] = -np.inf
    for fast, ref in FUNCS.values():
        got = fast(x)
        assert np.isnan(got[1]).all() and np.isnan(got[4]).all()
        rest = [0, 2, 3, 5]
        assert not np.isnan(got[rest]).any()
        assert_close(got[rest], ref(x[rest]), dtype)
    # along axis 0 the poisoned rows become columns
    got = fastattn.softmax(x, axis=0)
    assert np.isnan(got[:, 7]).all() and np.isnan(got[:, 49]).all()
    assert not np.isnan(np.delete(got, [7, 49], axis=1)).any()


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("dtype", FLOATS)
def test_special_rows_match_reference(name, dtype):
    """Rows built from -inf, NaN, +inf and a few finite values, with the special
    values in the vector body and in the tail (length 100): every output, NaN
    positions included, is what the reference gives."""
    n = 100
    rows = []
    for pos in (0, 37, 63, 64, 95, 99):
        r = np.full(n, -np.inf)
        r[pos] = np.nan
        rows.append(r)                       # NaN among -inf only
        r = np.linspace(-3.0, 2.0, n)
        r[pos] = np.nan
        rows.append(r)                       # NaN among finite values
        r = np.linspace(-3.0, 2.0, n)
        r[pos] = np.inf
        rows.append(r)                       # +inf among finite values
        r = np.full(n, -np.inf)
        r[pos] = 1.5
        rows.append(r)                       # one finite value among -inf
    rows.append(np.full(n, np.nan))
    rows.append(np.full(n, -np.inf))
    r = np.full(n, -np.inf)
    r[[3, 80]] = [np.nan, np.inf]
    rows.append(r)
    x = np.array(rows, dtype=dtype)
    fast, ref = FUNCS[name]
    assert_close(fast(x), ref(x), dtype)
    assert_close(fast(x, axis=0), ref(x, axis=0), dtype)


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,axis", [((300, 203), 0), ((5, 40, 77), 1), ((2, 9, 3, 70), 1),
                                        ((6, 8), 0), ((40, 17), 0), ((3, 50, 2, 9), -3)], ids=str)
def test_strided_axis_columns(name, dtype, shape, axis, rng):
    """A softmax along a non-last axis runs with vector lanes across the
    trailing axes (whole chunks, single vectors and leftover scalar columns).
    Random values plus -inf, NaN and +inf columns (in the first chunk and in the
    leftover columns), against the reference, at 1 and 2 threads, bit-identical."""
    x = randn(rng, shape, dtype, scale=3.0)
    ax = axis % x.ndim
    x3 = x.reshape(int(np.prod(shape[:ax])), shape[ax], -1)   # (outer, n, columns), a view
    assert np.shares_memory(x3, x)
    cols = x3.shape[2]
    for o, c, kind in ((0, 0, "neginf"), (-1, 3, "nan"), (0, cols - 1, "inf"), (-1, cols - 2, "neginf_nan"),
                       (0, cols // 2, "neginf")):
        if kind == "neginf":
            x3[o, :, c] = -np.inf
        elif kind == "nan":
            x3[o, 1, c] = np.nan
        elif kind == "inf":
            x3[o, -1, c] = np.inf
        else:
            x3[o, :, c] = -np.inf
            x3[o, 0, c] = np.nan
    fast, ref = FUNCS[name]
    got = fast(x, axis=axis, num_threads=1)
    assert_close(got, ref(x, axis=axis), dtype)
    assert np.array_equal(fast(x, axis=axis, num_threads=2), got, equal_nan=True)


def test_single_element_rows():
    x = np.array([[3.0], [-np.inf], [np.nan], [np.inf]])
    sm = fastattn.softmax(x)
    np.testing.assert_array_equal(sm[:2, 0], [1.0, 0.0])
    assert np.isnan(sm[2:]).all()
    ls = fastattn.log_softmax(x)
    np.testing.assert_array_equal(ls[:2, 0], [0.0, -np.inf])


def test_empty_arrays():
    for shape in [(0,), (3, 0), (0, 5), (2, 0, 3), (0, 0, 40), (2, 0, 40), (0, 3, 40)]:
        x = np.zeros(shape)
        for fast, _ in FUNCS.values():
            for axis in [-1] + list(range(x.ndim)):
                got = fast(x, axis=axis)
                assert got.shape == shape and got.dtype == np.float64


# ------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.int32, np.int64, np.uint8, np.bool_])
def test_dtypes(dtype, rng):
    x = randn(rng, (7, 33), dtype)
    want_dtype = expected_dtype(x)
    for name, (fast, ref) in FUNCS.items():
        got = fast(x)
        assert got.dtype == want_dtype, f"{name}: {got.dtype} != {want_dtype}"
        assert_close(got, ref(x), want_dtype, what=name)


def test_lists_accepted():
    got = fastattn.softmax([1.0, 2.0, 3.0])
    assert got.dtype == np.float64
    assert_close(got, scipy_special.softmax([1.0, 2.0, 3.0]), np.float64)


# ------------------------------------------------------------------ float16 / bfloat16 in place
def _half(name):
    if name == "float16":
        return np.dtype(np.float16)
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)


def _half_views(x):
    """Views of a half-precision array whose rows along some axis are contiguous
    (read in place) or not (converted first): C order, Fortran order, transposed,
    reversed, sliced."""
    return {"C": x, "F": np.asfortranarray(x), "T": x.transpose(1, 0, 2), "reversed": x[::-1, :, ::-1],
            "sliced": x[:, 1:-1, ::2]}


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(FUNCS))
def test_half_in_place(half, name, rng):
    """float16 / bfloat16 x: computed in float32 and rounded once into x's dtype
    -- bit for bit what the float32 softmax of the widened x gives, cast -- on
    every axis and layout (rows read in place where they are contiguous, the
    others through a float32 copy), with -inf, inf and NaN rows; within the
    dtype's rounding of the float64 reference; x untouched."""
    dt = _half(half)
    fast, ref = FUNCS[name]
    x0 = (rng.standard_normal((6, 33, 70)) * 3).astype(dt)
    x0[1, 2, :] = -np.inf
    x0[2, 3, 5] = np.inf
    x0[3, 4, 6] = np.nan
    x0[4, :, 7] = -np.inf
    eps = 2.0 ** -7 if half == "bfloat16" else 2.0 ** -10      # at most one unit in the last place
    tiny = 1e-38 if half == "bfloat16" else 2.0 ** -25         # half of float16's subnormal step
    xmax = float(np.abs(x0.astype(np.float64)[np.isfinite(x0.astype(np.float64))]).max())
    for lay, x in _half_views(x0).items():
        snaps = snapshot(x)
        for axis in (-1, 0, 1, None):
            got = fast(x, axis=axis)
            assert got.dtype == dt and got.shape == x.shape
            same = fast(x.astype(np.float32), axis=axis).astype(dt)
            assert np.array_equal(got.view(np.uint16), same.view(np.uint16)), f"{name} {lay} axis={axis}"
            want = ref(x.astype(np.float64), axis=axis)
            g = got.astype(np.float64)
            fin = np.isfinite(want)
            assert np.array_equal(np.isnan(g), np.isnan(want)), f"{name} {lay} axis={axis}: NaN"
            assert np.array_equal(g[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
            # (log_softmax: x - max - log(sum) in float32 also errs by float32's
            # rounding of |x| where the result is near 0)
            absolute = tiny + (2.0 ** -20 * xmax if name == "log_softmax" else 0)
            assert np.all(np.abs(g[fin] - want[fin]) <= eps * np.abs(want[fin]) + absolute), \
                f"{name} {lay} axis={axis}"
        assert_unchanged((x,), snaps)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_out_and_threads(half, rng):
    """out= of x's dtype (contiguous or strided) is written in place; any thread
    count gives the same bits."""
    dt = _half(half)
    x = (rng.standard_normal((300, 257)) * 2).astype(dt)
    want = fastattn.softmax(x.astype(np.float32)).astype(dt)
    out = np.empty_like(x)
    assert fastattn.softmax(x, out=out) is out and np.array_equal(out, want)
    big = np.zeros((300, 514), dtype=dt)
    strided = big[:, ::2]
    assert fastattn.softmax(x, out=strided) is strided and np.array_equal(strided, want)
    assert not big[:, 1::2].any()
    flat = np.empty_like(x)
    assert fastattn.softmax(x, axis=None, out=flat) is flat
    assert np.array_equal(flat, fastattn.softmax(x.astype(np.float32), axis=None).astype(dt))
    for t in (1, 2, 3):
        assert np.array_equal(fastattn.softmax(x, num_threads=t), want)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_rows_never_copied(half, rng):
    """A softmax over 8 MiB of float16 / bfloat16 rows allocates its result and
    nothing else of that size (a float32 copy of x and a float32 result would be
    4x x.nbytes); tracemalloc sees NumPy's allocations."""
    import tracemalloc
    x = rng.standard_normal((2048, 2048)).astype(_half(half))
    fastattn.softmax(x)
    tracemalloc.start()
    try:
        fastattn.log_softmax(x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.25 * x.nbytes, f"{peak / x.nbytes:.2f} x x.nbytes allocated"


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(FUNCS))
def test_half_strided_axes_in_slabs(half, name, rng):
    """float16 / bfloat16 x of more than 2**20 elements along an axis whose
    elements are not adjacent (columns of C order, rows of Fortran order,
    transposed, reversed, sliced, a strided 1-D row): widened a slab at a time,
    with the bits of the float32 softmax of the whole widened x, cast -- slabs
    split over one or two outer axes, a last ragged slab, out= of x's dtype
    (contiguous or strided); x untouched."""
    dt = _half(half)
    fast, _ = FUNCS[name]
    x0 = (rng.standard_normal((2, 1100, 1000)) * 3).astype(dt)
    x0[1, 2, :] = -np.inf
    x0[0, :, 7] = np.nan
    views = {"C": x0, "F": np.asfortranarray(x0), "T": x0.transpose(2, 0, 1), "reversed": x0[::-1, :, ::-1],
             "sliced": x0[:, 1:-1, ::2]}
    for lay, x in views.items():
        snaps = snapshot(x)
        with_out = True                       # out= on the first strided axis of each layout
        for axis in range(x.ndim):
            if x.strides[axis] == x.itemsize:
                continue                      # rows read in place: test_half_in_place
            got = fast(x, axis=axis)
            same = fast(x.astype(np.float32), axis=axis).astype(dt)
            assert got.dtype == dt and got.shape == x.shape
            assert np.array_equal(got.view(np.uint16), same.view(np.uint16)), f"{name} {lay} axis={axis}"
            if with_out:
                out = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), dt)[..., ::2]
                assert fast(x, axis=axis, out=out) is out
                assert np.array_equal(out.view(np.uint16), same.view(np.uint16)), f"{name} {lay} axis={axis} out="
                with_out = False
        assert_unchanged((x,), snaps)
    row = (rng.standard_normal(2 ** 21 + 3) * 3).astype(dt)[::2]
    assert np.array_equal(fast(row).view(np.uint16), fast(row.astype(np.float32)).astype(dt).view(np.uint16))


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_columns_never_copied(half, rng):
    """A softmax of 32 MiB of float16 / bfloat16 along axis 0 (columns) allocates
    its result and two slabs of 4 MiB, not a float32 copy of x and a float32
    result (4x x.nbytes more)."""
    import tracemalloc
    x = rng.standard_normal((4096, 4096)).astype(_half(half))
    fastattn.softmax(x, axis=0)
    tracemalloc.start()
    try:
        fastattn.softmax(x, axis=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * x.nbytes, f"{peak / x.nbytes:.2f} x x.nbytes allocated"


# ------------------------------------------------------------------ layouts
@pytest.mark.parametrize("layout", LAYOUTS + ["memmap"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_layouts(layout, dtype, rng, tmp_path):
    x0 = randn(rng, (3, 4, 45, 70), dtype, scale=3.0)
    x = make_layout(x0, layout, tmp_path)
    snaps = snapshot(x)
    for name, (fast, ref) in FUNCS.items():
        for axis in (-1, 1, None):
            assert_close(fast(x, axis=axis), ref(x0, axis=axis), dtype, what=f"{name} {layout} axis={axis}")
    assert_unchanged((x,), snaps)


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("order", ["F", (2, 0, 1), (1, 2, 0), (0, 2, 1)], ids=str)
def test_dense_layouts_every_axis(order, dtype, name, rng):
    """Fortran-ordered and transposed dense arrays: every axis is computed from
    the array's own layout (rows when the axis is the contiguous one, the column
    kernel otherwise), matches the reference, and the result keeps the input's
    layout (like a NumPy ufunc)."""
    base = randn(rng, (40, 33, 70), dtype, scale=3.0)
    base[3, 5, :] = -np.inf
    base[7, :, 11] = np.nan
    x = np.asfortranarray(base) if order == "F" else base.transpose(order)   # dense, not C order
    assert not x.flags.c_contiguous
    fast, ref = FUNCS[name]
    for axis in range(x.ndim):
        got = fast(x, axis=axis)
        assert_close(got, ref(x, axis=axis), dtype, what=f"{name} order={order} axis={axis}")
        assert got.strides == x.strides, f"layout not kept: {got.strides} vs {x.strides}"
        assert np.array_equal(fast(x, axis=axis, num_threads=2), got, equal_nan=True)


def test_strided_1d(rng):
    x = randn(rng, (999,), np.float64)
    for view in (x[::3], x[::-1], x[::-7]):
        assert_close(fastattn.softmax(view), R.softmax(view), np.float64)
        assert_close(fastattn.log_softmax(view), R.log_softmax(view), np.float64)


# ------------------------------------------------------------------ out= and threads
@pytest.mark.parametrize("dtype", FLOATS + [np.float16])
@pytest.mark.parametrize("name", list(FUNCS))
def test_out_argument(name, dtype, rng):
    fast, ref = FUNCS[name]
    x = randn(rng, (9, 31), dtype)
    out = np.full((9, 31), np.nan, dtype=dtype)
    r = fast(x, out=out)
    assert r is out
    assert_close(out, ref(x), dtype)
    out2 = np.empty((9, 31), dtype=dtype)
    assert fast(x, axis=0, out=out2) is out2
    assert_close(out2, ref(x, axis=0), dtype)


def test_out_may_alias_a_copy_not_input(rng):
    x = randn(rng, (5, 20), np.float64)
    xc = x.copy()
    out = np.empty_like(x)
    fastattn.softmax(x, out=out)
    np.testing.assert_array_equal(x, xc)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,axis", [((64, 4099), -1), ((1000, 257), 0), ((300, 301), None),
                                        ((4, 50, 60), 1)], ids=str)
def test_thread_determinism(shape, axis, dtype, rng):
    x = randn(rng, shape, dtype, scale=3.0)
    for fast, _ in FUNCS.values():
        a = fast(x, axis=axis, num_threads=1)
        for nt in (2, 3):
            assert np.array_equal(fast(x, axis=axis, num_threads=nt), a, equal_nan=True)
        assert np.array_equal(fast(x, axis=axis), a, equal_nan=True)


def test_vs_torch(rng):
    torch = pytest.importorskip("torch")
    for dtype in FLOATS:
        x = randn(rng, (5, 6, 77), dtype, scale=3.0)
        for dim in (0, 1, 2):
            t = torch.from_numpy(x)
            assert_close(fastattn.softmax(x, axis=dim), torch.softmax(t, dim=dim).numpy(), dtype, tol=2e-6
                         if dtype == np.float32 else 1e-12)
            assert_close(fastattn.log_softmax(x, axis=dim), torch.log_softmax(t, dim=dim).numpy(), dtype,
                         tol=2e-6 if dtype == np.float32 else 1e-12)


# ------------------------------------------------------------------ streaming stores
@pytest.fixture
def stream_all():
    """Every softmax into out= written by streaming stores (normally only outputs
    of at least the last-level cache's size are)."""
    from fastattn import _api
    prev = _api._K.set_stream_min_bytes(1)
    yield _api._K
    _api._K.set_stream_min_bytes(prev)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [1, 5, 8, 17, 31, 64, 4099])
@pytest.mark.parametrize("offset", [0, 1, 3, 7])
def test_streaming_stores_same_bits(stream_all, dtype, n, offset, rng):
    """Rows written by streaming stores (from their first vector-aligned element;
    the misaligned head and the tail by ordinary stores) hold the same bits as
    ordinary stores, for rows of any length starting at any element offset,
    special rows included, softmax and log_softmax, any thread count."""
    rows = 37
    x = randn(rng, (rows, n), dtype, scale=4.0)
    x[3] = -np.inf
    x[5, n // 2] = np.nan
    x[7, 0] = np.inf
    for name, (fast, ref) in FUNCS.items():
        stream_all.set_stream_min_bytes(0)
        want = fast(x)
        stream_all.set_stream_min_bytes(1)
        for nt in (1, 2, 3):
            buf = np.full(rows * n + 8, 12345.0, dtype=dtype)
            out = buf[offset:offset + rows * n].reshape(rows, n)
            assert fast(x, out=out, num_threads=nt) is out
            np.testing.assert_array_equal(out, want)
            assert (buf[:offset] == 12345.0).all() and (buf[offset + rows * n:] == 12345.0).all()
        assert_close(want[8:], ref(x[8:]), dtype)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_streaming_stores_other_layouts(stream_all, axis, rng):
    """Fortran-ordered and transposed outputs whose softmax rows are contiguous
    stream too; strided ones take the ordinary path; all equal the reference."""
    x = randn(rng, (300, 257), np.float32)
    for xin, out in ((x, np.empty_like(x)), (np.asfortranarray(x), np.empty_like(x, order="F")),
                     (x, np.empty((300, 514), np.float32)[:, ::2])):
        got = fastattn.softmax(xin, axis=axis, out=out)
        assert got is out
        assert_close(out, R.softmax(x, axis=axis), np.float32)


def test_stream_threshold_from_cache_and_environment(monkeypatch):
    from fastattn import _memory
    llc = _memory.last_level_cache_bytes()
    assert llc is None or (isinstance(llc, int) and llc > 0)
    monkeypatch.delenv("FASTATTN_STREAM_MIN_BYTES", raising=False)
    assert _memory.stream_min_bytes() == (llc or 0)
    monkeypatch.setenv("FASTATTN_STREAM_MIN_BYTES", "0")
    assert _memory.stream_min_bytes() == 0
    monkeypatch.setenv("FASTATTN_STREAM_MIN_BYTES", " 4096 ")
    assert _memory.stream_min_bytes() == 4096
    for bad in ("-1", "1e6", "lots", "²"):
        monkeypatch.setenv("FASTATTN_STREAM_MIN_BYTES", bad)
        with pytest.warns(RuntimeWarning, match="FASTATTN_STREAM_MIN_BYTES"):
            assert _memory.stream_min_bytes() == (llc or 0)
    assert _memory._parse_size("32768K") == 32 << 20 and _memory._parse_size("1M") == 1 << 20
    assert _memory._parse_size("x") is None
