"""Shared helpers for the fastattn test-suite.

Helpers are plain functions importable with ``from fa_testutil import ...`` (pytest's
default "prepend" import mode puts ``tests/`` on ``sys.path``); the fixtures live in
conftest.py.  Not named conftest: ``pytest tests bench`` puts both folders on
``sys.path`` and bench/ has a conftest of its own.

``reference`` is loaded without needing the compiled kernels, so
``tests/test_reference.py`` runs even before the extension modules are built.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import zlib

import numpy as np
import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_REF_PATH = os.path.join(os.path.dirname(_HERE), "fastattn", "reference.py")


def _load_reference():
    try:
        from fastattn import reference as mod  # noqa: F401

        return mod
    except Exception:  # package __init__ needs the kernels: load the file directly
        spec = importlib.util.spec_from_file_location("_fastattn_reference", _REF_PATH)
        mod = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("_fastattn_reference", mod)
        spec.loader.exec_module(mod)
        return mod


reference = _load_reference()

# Relative-RMS tolerances per output dtype.
TOL = {
    np.dtype(np.float64): 1e-12,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float16): 2e-3,
}


def tol_for(dtype):
    return TOL[np.dtype(dtype)]


def rms_rel_err(a, ref):
    """sqrt(mean((a - ref)^2)) / sqrt(mean(ref^2)), over finite entries of ``ref``.

    When the reference is (nearly) all zeros the absolute RMS error is returned
    instead, so that zero outputs are compared with an absolute tolerance.
    """
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ref.size == 0:
        return 0.0
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    r = ref[fin]
    d = a[fin] - r
    if not np.isfinite(d).all():
        return float("inf")
    big = float(np.max(np.abs(r)))
    if big < 1e-300:  # all-zero reference: absolute RMS error
        return float(np.sqrt(np.mean(d * d)))
    d = d / big  # rescale to avoid overflow/underflow in the squares
    r = r / big
    return float(np.sqrt(np.mean(d * d)) / np.sqrt(np.mean(r * r)))


# The variants whose query-vectorised unit multiplies bfloat16 P.V with P rounded to
# bfloat16 (against each tile's max): VDPBF16PS pair dot products, or AMX tiles.
P_ROUNDING_VARIANTS = ("avx512_bf16", "avx512_amx")


def within_bf16_p_rounding(out, want, absw, slack=2e-6):
    """Elementwise: is out within the rounding of P to bfloat16 of want?  Each
    probability rounded to bfloat16 (relative error <= 2^-8: 8 significant bits)
    moves an output by at most 2^-8 * sum_j w_j |v_j| (absw: the attention of
    |v|) before the output itself rounds once to bfloat16 (<= 2^-8 of its
    magnitude); slack covers the float32 computation."""
    err = 2.0 ** -8 * np.asarray(absw, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.abs(np.asarray(out).astype(np.float64) - want) <= err + 2.0 ** -8 * (np.abs(want) + err) + slack


def assert_close(actual, ref, dtype=None, tol=None, what="result"):
    """Assert ``actual`` matches ``ref`` within the relative-RMS tolerance of ``dtype``.

    Non-finite entries of ``ref`` (NaN, +-inf) must be reproduced exactly (same
    positions; same infinities).  ``dtype`` defaults to ``actual.dtype``.
    """
    actual = np.asarray(actual)
    ref = np.asarray(ref)
    assert actual.shape == ref.shape, f"{what}: shape {actual.shape} != expected {ref.shape}"
    if dtype is None:
        dtype = actual.dtype
    if tol is None:
        tol = tol_for(dtype)
    a64 = actual.astype(np.float64)
    r64 = ref.astype(np.float64)
    nan_r = np.isnan(r64)
    nan_a = np.isnan(a64)
    assert np.array_equal(nan_r, nan_a), (
        f"{what}: NaN positions differ ({int(nan_a.sum())} NaN in result vs {int(nan_r.sum())} expected)"
    )
    inf_r = np.isinf(r64)
    assert np.array_equal(np.where(inf_r, r64, 0), np.where(np.isinf(a64) & inf_r, a64, 0)) and \
        np.array_equal(inf_r, np.isinf(a64)), f"{what}: infinities differ"
    fin = np.isfinite(r64)
    if fin.any() and np.issubdtype(np.dtype(dtype), np.floating) and \
            np.max(np.abs(r64[fin])) < np.finfo(dtype).tiny:
        # the whole reference is below the dtype's smallest normal number: no
        # relative accuracy is representable, compare absolutely
        err = float(np.max(np.abs(a64[fin] - r64[fin])))
    else:
        err = rms_rel_err(a64, r64)
    assert err <= tol, f"{what}: relative RMS error {err:.3e} > tol {tol:.1e} (dtype {np.dtype(dtype)})"


def expected_dtype(*arrays):
    """The fast API's result dtype for these inputs (np.result_type; ints/bools -> float64)."""
    rt = np.result_type(*[np.asarray(a) for a in arrays])
    if rt.kind in "biu":
        return np.dtype(np.float64)
    return rt


def compute_dtype(dtype):
    """dtype the fast API computes (and returns lse) in."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


# ------------------------------------------------------------------ layouts
LAYOUTS = ["contiguous", "transposed", "negative", "sliced", "fortran", "readonly"]


def make_layout(a, layout, tmp_path=None):
    """Return an array equal to ``a`` (same dtype/values) with the requested memory layout.

    contiguous   C-contiguous copy
    transposed   view of a buffer with axes -3/-2 swapped (e.g. a (B,H,L,D) view of a
                 (B,L,H,D) array); for 2-D arrays a transposed (Fortran) view
    negative     negative strides on the last two axes (and first axis when ndim>=3)
    sliced       non-contiguous strided slice of a larger buffer (stride 2 on L and D, offset)
    fortran      Fortran-ordered copy
    readonly     C-contiguous, read-only
    memmap       np.memmap backed by a file in ``tmp_path`` (read-only mode "r")
    """
    a = np.asarray(a)
    if layout == "contiguous":
        return np.ascontiguousarray(a).copy()
    if layout == "transposed":
        if a.ndim >= 3:
            buf = np.ascontiguousarray(np.swapaxes(a, -3, -2))
            out = np.swapaxes(buf, -3, -2)
        else:
            out = np.ascontiguousarray(a.T).T
        return out
    if layout == "negative":
        idx = (slice(None, None, -1),) * 2
        if a.ndim >= 3:
            sl = (slice(None, None, -1),) + (slice(None),) * (a.ndim - 3) + idx
        else:
            sl = (Ellipsis,) + idx
        buf = np.ascontiguousarray(a[sl])
        return buf[sl]
    if layout == "sliced":
        shape = list(a.shape)
        big = shape[:-2] + [2 * shape[-2] + 1, 2 * shape[-1] + 3]
        buf = np.zeros(big, dtype=a.dtype)
        view = buf[..., 1::2, 2::2][..., : shape[-2], : shape[-1]]
        view[...] = a
        return view
    if layout == "fortran":
        return np.asfortranarray(a).copy(order="F")
    if layout == "readonly":
        out = np.ascontiguousarray(a).copy()
        out.setflags(write=False)
        return out
    if layout == "memmap":
        assert tmp_path is not None, "memmap layout needs tmp_path"
        fn = os.path.join(str(tmp_path), f"mm_{id(a)}_{np.random.randint(1 << 30)}.bin")
        mm = np.memmap(fn, dtype=a.dtype, mode="w+", shape=a.shape)
        mm[...] = a
        mm.flush()
        del mm
        return np.memmap(fn, dtype=a.dtype, mode="r", shape=a.shape)
    raise ValueError(f"unknown layout {layout!r}")


def randn(rng, shape, dtype=np.float64, scale=1.0):
    """Standard-normal array of ``shape`` cast to ``dtype`` (ints: small integers)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        return rng.integers(-3, 4, size=shape).astype(dtype)
    if dtype.kind == "u":   # -3 would wrap to 253: scores of ~1e5 leave no float64 digits to compare
        return rng.integers(0, 4, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return (scale * rng.standard_normal(shape)).astype(dtype)


def snapshot(*arrays):
    """Copies (and the write flags) of arrays, for checking inputs are not modified."""
    return [(np.array(a, copy=True), None if not isinstance(a, np.ndarray) else a.flags.writeable)
            for a in arrays]


def assert_unchanged(arrays, snaps):
    for a, (copy, writeable) in zip(arrays, snaps):
        np.testing.assert_array_equal(np.asarray(a), copy, err_msg="input was modified")
        if writeable is not None:
            assert a.flags.writeable == writeable, "input's writeable flag was changed"


def torch_or_skip():
    return pytest.importorskip("torch")


class _LazyScipySpecial:
    """``scipy.special`` imported on first use; only the tests that touch it skip when
    scipy is missing (the rest of a module never does)."""

    def __getattr__(self, name):
        return getattr(pytest.importorskip("scipy.special"), name)


scipy_special = _LazyScipySpecial()


def child_process_env(env=None):
    """(env, cwd) for a ``python -c`` child that must import the same fastattn as this process.

    ``python -c`` puts its working directory first on ``sys.path``: run from a source
    checkout, the child would import the uncompiled ``fastattn/`` folder instead of the
    installed package.  So the child runs in a neutral folder, with PYTHONPATH naming
    the folder that holds the fastattn imported here (installed or built in place)."""
    import tempfile

    import fastattn

    env = dict(os.environ if env is None else env)
    home = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (home, env.get("PYTHONPATH", "")) if p)
    return env, tempfile.gettempdir()


# Every option of attention() for the cache-format tests (4 query heads, at least 20
# keys): "bias" / "mask" are drawn per call by cache_options.
CACHE_OPTIONS = [
    {},
    {"causal": True},
    {"causal": "bottom_right", "window": (5, 0)},
    {"softcap": 20.0, "alibi_slopes": np.array([0.1, 0.2, 0.3, 0.4])},
    {"kv_lengths": np.array([7, 20])},
    {"kv_start": np.array([2, 0]), "causal": "bottom_right"},
    {"bias": "bias"},
    {"mask": "mask"},
    {"return_weights": True},
    {"return_lse": True, "scale": 0.3},
    {"sinks": np.array([0.5, -1.0, 2.0, 0.0])},
]


def cache_options(opt, rng, B, Hq, Lq, Lk):
    """CACHE_OPTIONS[opt] with its bias / mask drawn for a (B, Hq, Lq, Lk) call."""
    options = dict(CACHE_OPTIONS[opt])
    if options.get("bias") == "bias":
        options["bias"] = rng.standard_normal((B, Hq, Lq, Lk)).astype(np.float32)
    if options.get("mask") == "mask":
        options["mask"] = rng.random((Lq, Lk)) < 0.7
    return options


def dequantized(c):
    """The documented meaning of a QuantizedKV's fields, independently of the
    reference: element d = (code - zero[d // G]) * scale[d // G], in float64."""
    codes = c.data.astype(np.float64)
    if c.bits == 4:
        lo, hi = c.data & 15, c.data >> 4
        codes = np.stack([lo, hi], axis=-1).reshape(c.shape).astype(np.float64)
    G = c.group_size
    s = np.repeat(c.scale.astype(np.float64), G, axis=-1)
    z = np.repeat(c.zero.astype(np.float64), G, axis=-1)
    return (codes - z) * s
