"""Softmax and log-softmax of Dask arrays (the half of :mod:`fastattn.dask` that is
not attention; imported by it, which holds the public names and the docs).

Along an axis that is one chunk, each block is an in-memory kernel call; along a
chunked axis, a tree reduction of each slice's (max, sum of exponentials) in float64
NumPy, then a blockwise normalisation.
"""
from __future__ import annotations

import math
import operator

import numpy as np
import dask.array as da

from . import _api
from ._chunk_attention import task_threads

__all__ = ["softmax", "log_softmax"]


def as_dask(x, name):
    """``x`` as a Dask array (one chunk if it is not one), chunk sizes known."""
    if not isinstance(x, da.Array):
        a = np.asarray(x)
        x = da.from_array(a, chunks=a.shape)
    if any(math.isnan(c) for cs in x.chunks for c in cs):
        raise ValueError(f"{name} has unknown chunk sizes; call {name}.compute_chunk_sizes() first")
    return x


_STATS = np.dtype([("m", np.float64), ("s", np.float64)])


def _stats_chunk(x, axis, keepdims):
    """(max, sum of exp(x - max)) of a block along ``axis``; a slice holding +inf or NaN
    gets max NaN, which every later step propagates (the whole slice becomes NaN)."""
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        m = x.max(axis=axis, keepdims=True)
        m[m == np.inf] = np.nan
        s = np.exp(x - np.where(np.isfinite(m), m, 0)).sum(axis=axis, keepdims=True)
    st = np.empty(m.shape, _STATS)
    st["m"], st["s"] = m, s
    return st


def _stats_combine(st, axis, keepdims):
    m, s = st["m"], st["s"]
    with np.errstate(all="ignore"):
        M = m.max(axis=axis, keepdims=True)
        S = (s * np.exp(m - np.where(np.isfinite(M), M, 0))).sum(axis=axis, keepdims=True)
    out = np.empty(M.shape, _STATS)
    out["m"], out["s"] = M, S
    return out


def _normalise(x, st, log, odt):
    """softmax / log_softmax of a block given the slices' (max, sum) statistics."""
    m, s = st["m"], st["s"]
    with np.errstate(all="ignore"):
        y = np.asarray(x, np.float64) - m
        if log:
            r = np.where(m == -np.inf, -np.inf, y - np.log(s))
        else:
            r = np.where(m == -np.inf, 0.0, np.exp(y) / s)
    return r.astype(odt)


def _softmax_block(x, axis, log, num_threads):
    fn = _api.log_softmax if log else _api.softmax
    return fn(x, axis=axis, num_threads=task_threads(num_threads))


def _softmax(x, axis, out, num_threads, log, split_every):
    fname = "log_softmax" if log else "softmax"
    if out is not None:
        raise TypeError(f"{fname}: out= is not supported for Dask arrays: the result is lazy "
                        f"(write it with dask.array.store(result, out))")
    x = as_dask(x, "x")
    fn = _api.log_softmax if log else _api.softmax
    # the in-memory checks of dtype, axis and num_threads, on a zero-size stand-in
    odt = fn(np.zeros((0,) * x.ndim if x.ndim else (), x.dtype), axis=axis, num_threads=num_threads).dtype
    axes = tuple(range(x.ndim)) if axis is None else (operator.index(axis) % x.ndim,)
    if x.size == 0 or all(x.numblocks[a] == 1 for a in axes):
        return x.map_blocks(_softmax_block, axis=axis, log=log, num_threads=num_threads,
                            dtype=odt, meta=np.empty((0,) * x.ndim, odt), token=f"fastattn-{fname}")
    st = da.reduction(x, _stats_chunk, _stats_combine, combine=_stats_combine, axis=axes,
                      keepdims=True, dtype=_STATS, split_every=split_every,
                      meta=np.empty((0,) * x.ndim, _STATS), name=f"fastattn-{fname}-stats")
    return da.map_blocks(_normalise, x, st, log=log, odt=odt, dtype=odt,
                         meta=np.empty((0,) * x.ndim, odt), token=f"fastattn-{fname}")


def softmax(x, axis=-1, *, out=None, num_threads=None, split_every=None):
    """Compute :func:`fastattn.softmax` of a Dask array, as a lazy Dask array.

    Along an axis that is one chunk (or with ``axis=None``, on an array that is
    one chunk) each block is an in-memory :func:`fastattn.softmax` call, and
    the result is the in-memory one.  Along a chunked axis, two passes: a tree
    reduction of each slice's maximum and sum of exponentials, then a
    blockwise normalisation, both in float64 NumPy (the result is the
    in-memory one up to rounding).  The edge cases are the in-memory ones: a
    slice that is entirely ``-inf`` gives zeros, ``+inf`` or NaN in a slice
    gives NaN in that slice.  :func:`fastattn.softmax` given a Dask array
    returns the result of this function.

    Parameters
    ----------
    x : dask.array.Array or array_like
        Input.  An array that is not a Dask array is wrapped as one chunk.
        Chunk sizes must be known.
    axis : int or None, optional
        As :func:`fastattn.softmax`.  Default -1.
    out : None
        Not supported: any other value raises TypeError, the result being
        lazy (write it with ``dask.array.store``).
    num_threads : int, optional
        Threads of each block's :func:`fastattn.softmax` call when ``axis`` is
        one chunk; default one thread per block, or the setting of
        :func:`fastattn.set_num_threads` if it was called in the worker's
        process.  Along a chunked axis it is checked but unused (NumPy
        computes there).
    split_every : int, optional
        For a chunked axis, the ``split_every`` of the reduction
        (``dask.array.reduction``'s argument, with its default).

    Returns
    -------
    dask.array.Array
        The lazy softmax, of ``x``'s shape and chunks, in the dtype of
        :func:`fastattn.softmax`'s result.

    Raises
    ------
    TypeError
        The errors of :func:`fastattn.softmax` (raised when the graph is
        built, on a zero-size stand-in of ``x``); and any ``out`` other than
        None.
    ValueError
        The errors of :func:`fastattn.softmax`, raised when the graph is
        built; ``x`` with unknown chunk sizes.

    See Also
    --------
    fastattn.softmax : The in-memory function.
    fastattn.dask.log_softmax : The log-softmax of a Dask array.
    fastattn.dask.attention : Attention on Dask arrays.

    Examples
    --------
    >>> import numpy as np, dask.array as da, fastattn, fastattn.dask
    >>> x = np.random.default_rng(0).standard_normal((4, 100))
    >>> lazy = fastattn.dask.softmax(da.from_array(x, chunks=(2, 30)), axis=-1)
    >>> bool(np.allclose(lazy.compute(), fastattn.softmax(x)))
    True
    """
    return _softmax(x, axis, out, num_threads, False, split_every)


def log_softmax(x, axis=-1, *, out=None, num_threads=None, split_every=None):
    """Compute :func:`fastattn.log_softmax` of a Dask array, as a lazy Dask array.

    As :func:`fastattn.dask.softmax`: along an axis that is one chunk each block
    is an in-memory :func:`fastattn.log_softmax` call; along a chunked axis a
    float64 tree reduction of each slice's maximum and sum of exponentials,
    then a blockwise ``x - max - log(sum)`` in float64 NumPy.  A slice that is
    entirely ``-inf`` gives ``-inf``, ``+inf`` or NaN in a slice gives NaN in
    that slice, as in memory.  :func:`fastattn.log_softmax` given a Dask array
    returns the result of this function.

    Parameters
    ----------
    x : dask.array.Array or array_like
        Input.  An array that is not a Dask array is wrapped as one chunk.
        Chunk sizes must be known.
    axis : int or None, optional
        As :func:`fastattn.log_softmax`.  Default -1.
    out : None
        Not supported: any other value raises TypeError, the result being
        lazy.
    num_threads : int, optional
        As :func:`fastattn.dask.softmax`.
    split_every : int, optional
        As :func:`fastattn.dask.softmax`.

    Returns
    -------
    dask.array.Array
        The lazy log-softmax, of ``x``'s shape and chunks, in the dtype of
        :func:`fastattn.log_softmax`'s result.

    Raises
    ------
    TypeError
        The errors of :func:`fastattn.log_softmax` (raised when the graph is
        built); and any ``out`` other than None.
    ValueError
        The errors of :func:`fastattn.log_softmax`, raised when the graph is
        built; ``x`` with unknown chunk sizes.

    See Also
    --------
    fastattn.log_softmax : The in-memory function.
    fastattn.dask.softmax : The softmax of a Dask array.

    Examples
    --------
    >>> import numpy as np, dask.array as da, fastattn, fastattn.dask
    >>> x = np.random.default_rng(0).standard_normal((4, 100))
    >>> lazy = fastattn.dask.log_softmax(da.from_array(x, chunks=(2, 30)), axis=-1)
    >>> bool(np.allclose(lazy.compute(), fastattn.log_softmax(x)))
    True
    """
    return _softmax(x, axis, out, num_threads, True, split_every)
