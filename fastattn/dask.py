"""Attention and softmax on Dask arrays: one machine's cores, or a cluster.

    >>> import dask.array as da, fastattn.dask
    >>> q = da.random.random((1, 8, 4096, 64), chunks=(1, 8, 1024, 64)).astype("float32")
    >>> out = fastattn.dask.attention(q, q, q, causal=True)       # lazy
    >>> out.compute().shape
    (1, 8, 4096, 64)

Install with ``pip install 'fastattn[dask]'``.  :func:`fastattn.attention`,
:func:`fastattn.softmax` and :func:`fastattn.log_softmax` given a Dask array (as any
argument) return the same lazy result as the functions here; ``import fastattn`` itself
never imports Dask.

What runs where
---------------
* Chunks along the batch and head dims and along the query axis are independent tasks.
* Chunks along the key axis give one partial ``(out, lse)`` task per (query chunk, key
  chunk) pair -- an in-memory :func:`fastattn.attention` call on the two chunks with its
  causal / window / ALiBi / kv_lengths options shifted to the chunks' global positions
  (exact, see :mod:`fastattn._chunk_attention`) -- merged with
  :func:`fastattn.merge_attention` in a tree of ``split_every`` parts per task (as
  ``dask.array.reduction``; default ``dask.config.get("split_every", 4)``).  This is the
  blockwise / ring-attention decomposition.
* A pair that no query of the chunk can see (causal of either alignment, window,
  kv_lengths) has no task: causal attention over n x n equal chunks has n(n+1)/2
  partial tasks, not n^2.  A query chunk that sees no key at all is a task that makes
  zeros (lse -inf).  Masks are not inspected for this (they may be lazy).
* NumPy kv_lengths are read when the graph is built (per batch chunk).  Dask
  kv_lengths are not computed then: pairs are pruned only where no length in [0, Lk]
  could make them visible, and the tasks of the remaining pairs check the lengths
  (range errors are raised at compute time) and return at once when the pair is
  invisible for the actual lengths.
* Head dims D are one chunk (rechunked if not).  Chunks of the batch dims of q, k, v,
  mask, bias, kv_lengths and alibi_slopes are unified to a common refinement (as
  ``dask.array`` does); with grouped heads (q's head axis g times k's) the query head
  chunks are coarsened to multiples of g so each task holds whole groups.
  mask / bias (dask or NumPy) are rechunked to the query and key chunks.

Threads
-------
``num_threads=n`` is passed to every task's kernel call.  With the default ``None``
each task runs its kernels on one thread -- Dask already runs one task per worker
thread (``distributed`` also starts worker processes with ``OMP_NUM_THREADS=1``) --
unless ``fastattn.set_num_threads(n)`` was called in the worker process, e.g. on
every worker with ``client.run(fastattn.set_num_threads, n)``; then that setting.
Use it for workers with fewer threads than cores.

Not supported
-------------
``out=`` raises TypeError: the result is lazy (write it with ``dask.array.store``).
``return_weights=True`` is supported: the weights are a lazy (..., Lq, Lk) array
chunked like the scores; pairs without a task give zero blocks.  They are as large as
the scores, which chunked attention otherwise never holds.
"""
from __future__ import annotations

import itertools
import numbers
import operator
from functools import partial

import numpy as np

try:
    import dask
    import dask.array as da
    from dask.array.core import common_blockdim
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
except ImportError as exc:  # pragma: no cover - exercised only without dask
    raise ImportError("fastattn.dask needs Dask's array module: pip install 'fastattn[dask]' "
                      "(or pip install 'dask[array]')") from exc

from . import _api
from ._quantized import QuantizedKV
from ._dask_softmax import as_dask as _as_dask, log_softmax, softmax
from ._chunk_attention import (PairOptions, batch_shape, check_lengths, head_groups,
                               pair_attention, rescale_weights)

__all__ = ["attention", "softmax", "log_softmax"]

PARTIAL_NAME = "fastattn-attention-partial"


# --------------------------------------------------------------- arguments

def _check_shapes(q, k, v):
    """The in-memory shape errors, with the same messages."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., L, D), got shape {a.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension Dk: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys Lk: k {k.shape}, v {v.shape}")


def _score_operand(x, name, score_shape):
    """mask / bias as a dask array of >= 2 dims broadcasting to the score shape."""
    x = _as_dask(x, name)
    if x.ndim < 2:
        x = x.reshape((1,) * (2 - x.ndim) + x.shape)
    try:
        ok = x.ndim <= len(score_shape) and np.broadcast_shapes(x.shape, score_shape) == score_shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name} with shape {x.shape} does not broadcast to the score shape {score_shape}")
    return x


def _small(x):
    """kv_lengths / alibi_slopes: a dask array stays lazy, anything else is read now."""
    if x is None or isinstance(x, da.Array):
        return x
    return np.asarray(x)


def _stand_in(x):
    """A NumPy stand-in of x's shape and dtype (zero-strided, no memory) for argument checks."""
    return np.broadcast_to(np.zeros((), x.dtype), x.shape)


def _validate(q, k, v, mask, bias, lengths, slopes, kwargs):
    """Run the in-memory argument checks on zero-size stand-ins of the inputs (every
    error message is the in-memory one); returns (output dtype, compute dtype)."""
    Lq, Lk = q.shape[-2], k.shape[-2]

    def seq(x):
        if x is None:
            return None
        rows = 0 if x.shape[-2] == Lq else x.shape[-2]
        cols = 0 if x.shape[-1] == Lk else x.shape[-1]
        return np.zeros(x.shape[:-2] + (rows, cols), x.dtype)

    res = _api.attention(
        np.zeros(q.shape[:-2] + (0, q.shape[-1]), q.dtype),
        np.zeros(k.shape[:-2] + (0, k.shape[-1]), k.dtype),
        np.zeros(v.shape[:-2] + (0, v.shape[-1]), v.dtype),
        mask=seq(mask), bias=seq(bias),
        kv_lengths=None if lengths is None else _stand_in(lengths),
        alibi_slopes=None if slopes is None else _stand_in(slopes),
        return_lse=True, **kwargs)
    if lengths is not None and not isinstance(lengths, da.Array):
        check_lengths(lengths, Lk)
    return res[0].dtype, res[-1].dtype


def _causal_mode(causal):
    if isinstance(causal, str):
        return causal
    return "top_left" if causal else None


def _window_sides(window):
    if window is None:
        return None, None
    if isinstance(window, (tuple, list)):
        return tuple(None if w is None else operator.index(w) for w in window)
    w = operator.index(window)
    return w, w


def _split_every(split_every):
    if split_every is None:
        split_every = dask.config.get("split_every", 4)
        if not isinstance(split_every, numbers.Integral):
            split_every = 4
    if isinstance(split_every, bool) or not isinstance(split_every, numbers.Integral) or split_every < 2:
        raise ValueError(f"split_every must be an int >= 2 or None, got {split_every!r}")
    return int(split_every)


# --------------------------------------------------------------- chunks

def _bounds(chunks):
    return np.concatenate([[0], np.cumsum(chunks, dtype=np.int64)]).tolist()


def _coarsen(chunks, g):
    """Chunks whose boundaries are the multiples of g among the given ones."""
    cuts = [b for b in _bounds(chunks)[1:] if b % g == 0]
    return tuple(np.diff([0] + cuts).tolist()) or chunks


class _Batch:
    """The output batch dims and their chunks, and how each operand maps onto them."""

    def __init__(self, bshape, g_align):
        self.shape, self.g = tuple(bshape), g_align
        self.nb = len(bshape)

    def dims(self, x, nbx):
        """(output dim, grouped-head divisor or 1, broadcast?) of x's batch dims."""
        for d in range(nbx):
            p = self.nb - nbx + d
            n = self.shape[p]
            if x.shape[d] == n and n != 1:
                yield d, p, 1, False
            elif self.g > 1 and p == self.nb - 1 and x.shape[d] * self.g == n:
                yield d, p, self.g, False
            else:
                yield d, p, 1, True          # a length-1 dim broadcast over the output

    def unify(self, operands):
        """Common chunks of every output batch dim over (array, batch ndim) pairs."""
        cands = [[] for _ in range(self.nb)]
        for x, nbx in operands:
            for d, p, div, bc in self.dims(x, nbx):
                if not bc:
                    cands[p].append(tuple(c * div for c in x.chunks[d]))
        self.chunks = [common_blockdim(c) if c else (self.shape[p],) for p, c in enumerate(cands)]
        if self.g > 1:
            self.chunks[-1] = _coarsen(self.chunks[-1], self.g)
        self.bounds = [_bounds(c) for c in self.chunks]

    def rechunk(self, x, nbx, tail):
        """x rechunked to the output batch chunks; ``tail``: chunks of its other dims."""
        chunks = [x.chunks[d] if bc else tuple(c // div for c in self.chunks[p])
                  for d, p, div, bc in self.dims(x, nbx)]
        return x.rechunk(tuple(chunks) + tuple(tail))

    def block(self, x, nbx, bidx):
        """x's batch block index for the output batch block bidx."""
        return tuple(bidx[p] if x.numblocks[d] > 1 else 0 for d, p, _, _ in self.dims(x, nbx))

    def numpy_block(self, a, bidx):
        """The slice of a NumPy batch-only array for the output batch block bidx."""
        sl = tuple(slice(None) if bc else slice(self.bounds[p][bidx[p]], self.bounds[p][bidx[p] + 1])
                   for d, p, _, bc in self.dims(a, a.ndim))
        return a[sl]


def _seq_chunks(x, q_chunks, k_chunks, Lq, Lk):
    """mask / bias chunks along (Lq, Lk): the query and key chunks, or one for a length-1 axis."""
    return (q_chunks if x.shape[-2] == Lq and Lq != 1 else (x.shape[-2],),
            k_chunks if x.shape[-1] == Lk and Lk != 1 else (x.shape[-1],))


# --------------------------------------------------------------- visibility of a chunk pair

def _pair_visible(qs, qe, ks, ke, opt, lengths):
    """Whether some query in [qs, qe) may see some key in [ks, ke).

    ``lengths``: the distinct kv_lengths of the batch chunk, or None when they are lazy
    (then a superset: every length in [0, Lk] is possible)."""
    if qe <= qs or ke <= ks:
        return False
    right = 0 if opt.causal else opt.right
    br = opt.bottom_right
    if lengths is None:
        # top_left: a longer length only adds keys, so L = Lk decides.  bottom_right: the
        # conditions below hold for L >= ks + 1 and L >= ks - qe + 1 + Lq (d_min <= 0) and
        # a window's left side holds up to some L, so the smallest L meeting both lower
        # bounds decides: it is one of them.
        lengths = [opt.Lk]
        if br:
            lengths = [min(max(L, 0), opt.Lk) for L in (ks + 1, ks - qe + 1 + opt.Lq)]
    for L in lengths:
        kend, c = min(ke, L), (L - opt.Lq if br else 0)
        # j - p(i) = j - i - c over the rectangle spans [d_min, d_max]; visible needs
        # -left <= j - p(i) <= right
        d_max, d_min = kend - 1 - qs - c, ks - (qe - 1) - c
        if kend > ks and (opt.left is None or d_max >= -opt.left) and (right is None or d_min <= right):
            return True
    return False


# --------------------------------------------------------------- task bodies

def _merge_parts(parts):
    # in the compute dtype: a float64 copy of each part would cost more than the merge
    return _api.merge_attention([p[0] for p in parts], [p[1] for p in parts])


def _no_key(bshape, lq, dv, cdt):
    return np.zeros(bshape + (lq, dv), cdt), np.full(bshape + (lq,), -np.inf, cdt)


def _with_sinks(merged, sinks):
    """The merged (out, lse) of a query chunk with its sinks applied, once (a
    merge of one part with sinks=): every key chunk was computed without them."""
    return _api.merge_attention([merged[0]], [merged[1]], sinks=sinks)


def _final_out(merged, odt):
    return merged[0].astype(odt, copy=False)


def _final_lse(merged, cdt):
    return merged[1].astype(cdt, copy=False)


def _final_weights(part, merged, odt):
    return rescale_weights(part[2], part[1], merged[1]).astype(odt, copy=False)


# --------------------------------------------------------------- attention

def _scaled(x, scale, name, xname, cdt):
    """An integer (int8) k or v times its k_scale / v_scale, lazily, in the call's
    compute dtype cdt: every chunk's values are what fastattn.attention reads
    (x.astype(cdt) * scale.astype(cdt); a float64 scale, a Python float included,
    does not change the result's dtype, as in memory).  The scale's checks are
    the in-memory ones, on stand-ins."""
    if scale is None:
        return x
    scale = scale if isinstance(scale, da.Array) else np.asarray(scale)
    stand_k = np.broadcast_to(np.zeros((), x.dtype), x.shape)
    _api.attention(np.zeros(x.shape[:-2] + (0, x.shape[-1]), np.float32), stand_k, stand_k,
                   **{name: _stand_in(scale)})
    return x.astype(cdt) * scale.astype(cdt)


def _per_sequence(x, bshape):
    """A 1-D kv_lengths / kv_start with two or more batch dims holds one value per
    sequence (the leading batch dim), as in memory: shaped (B, 1, ..., 1) so that
    each batch chunk's tasks get their own slice.  Anything else is returned as it
    is (a 1-D table of the wrong length then raises the in-memory error)."""
    if x is not None and x.ndim == 1 and len(bshape) >= 2 and x.shape[0] == bshape[0] != 1:
        return x.reshape((x.shape[0],) + (1,) * (len(bshape) - 1))
    return x


def _start_mask(kv_start, bshape, Lk):
    """kv_start as a boolean per-key mask (..., 1, Lk) of the batch dims (keys j <
    kv_start invisible), lazy when kv_start is; a 1-D table is one value per
    sequence (the leading batch dim), as in memory."""
    if isinstance(kv_start, da.Array):
        # lazy values are checked where they are computed (the in-memory error)
        ks = kv_start.map_blocks(check_lengths, Lk, "kv_start", dtype=kv_start.dtype)
    else:
        ks = np.asarray(kv_start)
    ks = _per_sequence(ks, bshape)
    keys = da.arange(Lk, chunks=Lk) if isinstance(ks, da.Array) else np.arange(Lk)
    return keys >= ks[..., None, None]


def attention(q, k, v, *, scale=None, causal=False, mask=None, bias=None, window=None,
              kv_lengths=None, kv_start=None, align="top_left", softcap=None, alibi_slopes=None,
              k_scale=None, v_scale=None, sinks=None, return_weights=False, return_lse=False, out=None,
              num_threads=None, split_every=None):
    """Compute :func:`fastattn.attention` on Dask arrays, as a lazy Dask array.

    Builds a task graph and computes nothing.  Chunks along the batch dims and
    along the queries are independent tasks.  Chunks along the keys give one
    task per (query chunk, key chunk) pair: an in-memory
    :func:`fastattn.attention` call on the two chunks with ``return_lse=True``
    and the causal, window, ALiBi and ``kv_lengths`` options shifted to the
    chunks' positions; the partial results are merged with
    :func:`fastattn.merge_attention` in a tree of ``split_every`` parts per
    merge task.  A pair that no query of its chunk can see (``causal``,
    ``window``, ``kv_lengths``) gets no task.  The result is the in-memory one
    up to rounding (the merges round in the compute dtype).  The head dims
    ``Dk`` and ``Dv`` are rechunked to one chunk; the batch chunks of all
    operands are unified to a common refinement, with grouped query heads
    kept whole per task.  :func:`fastattn.attention` given a Dask argument
    returns the result of this function.

    Parameters
    ----------
    q : dask.array.Array or array_like, shape (..., Lq, Dk)
        Queries, as :func:`fastattn.attention`.  An array that is not a Dask
        array is wrapped as one chunk.  Chunk sizes must be known.
    k : dask.array.Array or array_like, shape (..., Lk, Dk)
        Keys, as :func:`fastattn.attention`.  The key chunks of ``k`` and ``v``
        are unified.
    v : dask.array.Array or array_like, shape (..., Lk, Dv)
        Values, as :func:`fastattn.attention`.
    scale : float, optional
        As :func:`fastattn.attention`.
    causal : {False, True, "top_left", "bottom_right"}, optional
        As :func:`fastattn.attention`.  Prunes the pairs it hides.
    mask : dask.array.Array or array_like of bool, broadcastable to (..., Lq, Lk), optional
        As :func:`fastattn.attention`; rechunked to the query and key chunks.
        Its values are not read to prune pairs.
    bias : dask.array.Array or array_like, broadcastable to (..., Lq, Lk), optional
        As :func:`fastattn.attention`; rechunked to the query and key chunks.
    window : int or (int or None, int or None), optional
        As :func:`fastattn.attention`.  Prunes the pairs it hides.
    kv_lengths : dask.array.Array or array_like of int, broadcastable to the batch dims, optional
        As :func:`fastattn.attention`.  A NumPy table is read when the graph is
        built: range errors are raised then, and pairs past each batch chunk's
        lengths get no task.  A Dask table is not computed then: only pairs that
        no length in ``[0, Lk]`` could make visible are pruned, and its range is
        checked by the tasks, at compute time.
    kv_start : dask.array.Array or array_like of int, broadcastable to the batch dims, optional
        As :func:`fastattn.attention`, applied as a per-key boolean mask
        (intersected with ``mask``), so the keys it hides are not pruned.  A
        NumPy table is checked when the graph is built; a Dask table's dtype
        and shape then, its values' range when it is computed.
    align : {"top_left", "bottom_right"}, optional
        As :func:`fastattn.attention`.
    softcap : float, optional
        As :func:`fastattn.attention`.
    alibi_slopes : dask.array.Array or array_like, broadcastable to the batch dims, optional
        As :func:`fastattn.attention`.
    k_scale : dask.array.Array or array_like, optional
        Scale of an integer ``k``, checked as by :func:`fastattn.attention`;
        the tasks see the keys ``k * k_scale`` in the call's compute dtype
        (float32 unless an input is float64), computed lazily, chunk by chunk.
        The scale's own dtype does not change the result's, as in memory.
    v_scale : dask.array.Array or array_like, optional
        The same for an integer ``v``.
    sinks : dask.array.Array or array_like, broadcastable to the batch dims, optional
        Attention sinks, as :func:`fastattn.attention`: applied once per
        query chunk, after its key chunks are merged (with
        :func:`fastattn.merge_attention`'s ``sinks``).
    return_weights : bool, optional
        Also return the attention weights, a lazy (..., Lq, Lk) array chunked
        like the scores (zero blocks for the pairs without a task).  They are
        as large as the scores, which the rest of the graph never holds.
    return_lse : bool, optional
        Also return the log-sum-exp of each row, a lazy (..., Lq) array.
    out : None
        Not supported: any other value raises TypeError, the result being
        lazy (write it with ``dask.array.store``).
    num_threads : int, optional
        Threads of each task's kernel calls.  Default: one thread per task
        (Dask runs one task per worker thread), or the setting of
        :func:`fastattn.set_num_threads` if it was called in the worker's
        process.
    split_every : int, optional
        Partial results merged per merge task, at least 2.  Default
        ``dask.config.get("split_every")`` when that is an int, else 4.

    Returns
    -------
    out : dask.array.Array, shape (..., Lq, Dv)
        The lazy attention output, in :func:`fastattn.attention`'s output
        dtype; the whole result when neither ``return_weights`` nor
        ``return_lse`` is set, else the first item of the tuple
        ``(out, weights, lse)`` holding the parts asked for, in that order.
    weights : dask.array.Array, shape (..., Lq, Lk)
        Only with ``return_weights=True``: the weights, in the output dtype.
    lse : dask.array.Array, shape (..., Lq)
        Only with ``return_lse=True``: each row's log-sum-exp, in the compute
        dtype.

    Raises
    ------
    TypeError
        The errors of :func:`fastattn.attention`, raised when the graph is
        built (its checks run on zero-size stand-ins of the inputs); and any
        ``out`` other than None.
    ValueError
        The errors of :func:`fastattn.attention`, raised when the graph is
        built, but those of a Dask ``kv_lengths``' values, raised at compute
        time; an input with unknown chunk sizes; ``split_every`` that is not
        an int >= 2 or None.

    See Also
    --------
    fastattn.attention : The in-memory function.
    fastattn.merge_attention : How the key chunks' partial results are merged.
    fastattn.dask.softmax : Softmax of a Dask array.

    Examples
    --------
    >>> import numpy as np, dask.array as da, fastattn, fastattn.dask
    >>> x = np.random.default_rng(0).standard_normal((2, 64, 16))
    >>> q = da.from_array(x, chunks=(1, 16, 16))
    >>> lazy = fastattn.dask.attention(q, q, q, causal=True)
    >>> bool(np.allclose(lazy.compute(), fastattn.attention(x, x, x, causal=True)))
    True
    """
    if out is not None:
        raise TypeError("out= is not supported for Dask arrays: the result is lazy "
                        "(write it with dask.array.store(result, out))")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if isinstance(x, QuantizedKV):
            raise TypeError(f"fastattn.dask.attention: {name} is a fastattn.QuantizedKV, which the Dask wrapper "
                            f"does not take (fastattn.attention and fastattn.attention_paged read QuantizedKV "
                            f"caches)")
    q, k, v = _as_dask(q, "q"), _as_dask(k, "k"), _as_dask(v, "v")
    _check_shapes(q, k, v)
    cdt = _api._compute_dtype(q.dtype, k.dtype, v.dtype)
    k = _scaled(k, k_scale, "k_scale", "k", cdt)
    v = _scaled(v, v_scale, "v_scale", "v", cdt)
    Lq, Dk = q.shape[-2:]
    Lk, Dv = v.shape[-2:]
    options = dict(scale=scale, causal=causal, window=window, softcap=softcap, align=align,
                   return_weights=return_weights, num_threads=num_threads)
    lengths, slopes, sinks = _small(kv_lengths), _small(alibi_slopes), _small(sinks)
    # batch dims first (in-memory order of checks): mask/bias shape errors name the score shape
    _validate(q, k, v, None, None, None, None, dict(options, return_weights=False))
    bshape = batch_shape(q, k, v)
    score_shape = tuple(bshape) + (Lq, Lk)
    lengths = _per_sequence(lengths, bshape)
    if kv_start is not None:
        # the in-memory checks of kv_start on a stand-in, then a per-key mask
        lazy = isinstance(kv_start, da.Array)
        zeros = lambda shape: np.broadcast_to(np.zeros((), np.float32), shape)     # noqa: E731
        _api.attention(zeros(q.shape[:-2] + (0, Dk)), zeros(k.shape[:-2] + (Lk, Dk)), zeros(v.shape[:-2] + (Lk, Dv)),
                       kv_start=_stand_in(kv_start) if lazy else np.asarray(kv_start))
        start = _start_mask(kv_start, bshape, Lk)
        mask = start if mask is None else _as_dask(mask, "mask") & start
    if mask is not None:
        mask = _score_operand(mask, "mask", score_shape)
    if bias is not None:
        bias = _score_operand(bias, "bias", score_shape)
    odt, cdt = _validate(q, k, v, mask, bias, lengths, slopes,
                         options if sinks is None else dict(options, sinks=_stand_in(sinks)))
    split_every = _split_every(split_every)
    left, right = _window_sides(window)
    causal_mode = _causal_mode(causal)
    bottom_right = causal_mode == "bottom_right" or align == "bottom_right"
    if bottom_right and causal_mode == "top_left":
        causal_mode = "bottom_right"       # causal=True with align="bottom_right"
    opt = PairOptions(Lq=Lq, Lk=Lk, scale=scale, causal=causal_mode, left=left, right=right,
                      softcap=softcap, weights=bool(return_weights), num_threads=num_threads, cdt=cdt,
                      bottom_right=bottom_right)

    # chunks: batch dims unified, D single chunks, keys of k and v unified
    g = head_groups(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    g_align = g if g > 1 and k.shape[-3] > 1 else 1      # one key/value head: broadcast
    batch = _Batch(bshape, g_align)
    lazy_small = [(x, x.ndim) for x in (lengths, slopes, sinks) if isinstance(x, da.Array)]
    seq_ops = [(x, x.ndim - 2) for x in (q, k, v, mask, bias) if x is not None]
    batch.unify(seq_ops + lazy_small)
    q_chunks = q.chunks[-2]
    k_chunks = common_blockdim([k.chunks[-2], v.chunks[-2]])
    q = batch.rechunk(q, q.ndim - 2, (q_chunks, (Dk,)))
    k = batch.rechunk(k, k.ndim - 2, (k_chunks, (Dk,)))
    v = batch.rechunk(v, v.ndim - 2, (k_chunks, (Dv,)))
    if mask is not None:
        mask = batch.rechunk(mask, mask.ndim - 2, _seq_chunks(mask, q_chunks, k_chunks, Lq, Lk))
    if bias is not None:
        bias = batch.rechunk(bias, bias.ndim - 2, _seq_chunks(bias, q_chunks, k_chunks, Lq, Lk))
    if isinstance(lengths, da.Array):
        lengths = batch.rechunk(lengths, lengths.ndim, ())
    if isinstance(slopes, da.Array):
        slopes = batch.rechunk(slopes, slopes.ndim, ())
    if isinstance(sinks, da.Array):
        sinks = batch.rechunk(sinks, sinks.ndim, ())

    deps = [x for x in (q, k, v, mask, bias, lengths, slopes, sinks) if isinstance(x, da.Array)]
    token = tokenize(*[x.name for x in deps], lengths if not isinstance(lengths, da.Array) else None,
                     slopes if not isinstance(slopes, da.Array) else None,
                     sinks if not isinstance(sinks, da.Array) else None, opt, split_every)
    core_name = f"{PARTIAL_NAME}-{token}"
    merge_name = f"fastattn-attention-merge-{token}"
    qb, kb = _bounds(q_chunks), _bounds(k_chunks)
    pair = partial(pair_attention, opt=opt)

    def key(x, bidx, *seq_idx):
        if x is None:
            return None
        nbx = x.ndim - len(seq_idx)
        tail = tuple(i if x.numblocks[nbx + n] > 1 else 0 for n, i in enumerate(seq_idx))
        return (x.name,) + batch.block(x, nbx, bidx) + tail

    def small_arg(x, bidx):
        if x is None:
            return None
        if isinstance(x, da.Array):
            return key(x, bidx)
        return batch.numpy_block(x, bidx)

    core, merged = {}, {}
    pairs = {}         # (bidx, qi) -> visible key chunk indices
    for bidx in itertools.product(*(range(len(c)) for c in batch.chunks)):
        lens_arg, slopes_arg = small_arg(lengths, bidx), small_arg(slopes, bidx)
        if lengths is None:
            cand = [Lk]
        elif isinstance(lengths, da.Array):
            cand = None
        else:
            cand = np.unique(lens_arg).tolist()
        bshape_blk = tuple(c[i] for c, i in zip(batch.chunks, bidx))
        for qi in range(len(q_chunks)):
            seen = [ki for ki in range(len(k_chunks))
                    if _pair_visible(qb[qi], qb[qi + 1], kb[ki], kb[ki + 1], opt, cand)]
            pairs[bidx, qi] = seen
            level = []
            for ki in seen:
                pk = (core_name,) + bidx + (qi, ki)
                core[pk] = (partial(pair, qs=qb[qi], ks=kb[ki]), key(q, bidx, qi, 0), key(k, bidx, ki, 0),
                            key(v, bidx, ki, 0), key(mask, bidx, qi, ki), key(bias, bidx, qi, ki),
                            lens_arg, slopes_arg)
                level.append(pk)
            if not level:
                pk = (core_name,) + bidx + (qi, "none")
                core[pk] = (partial(_no_key, bshape_blk, q_chunks[qi], Dv, cdt),)
                level = [pk]
            depth = 0
            while len(level) > 1:      # the merge tree, split_every parts per task
                nxt = []
                for n in range(0, len(level), split_every):
                    group = level[n:n + split_every]
                    if len(group) == 1:
                        nxt.append(group[0])
                        continue
                    mk = (merge_name,) + bidx + (qi, depth, n)
                    core[mk] = (_merge_parts, group)
                    nxt.append(mk)
                level, depth = nxt, depth + 1
            if sinks is not None:
                mk = (merge_name,) + bidx + (qi, "sinks")
                core[mk] = (_with_sinks, level[0], small_arg(sinks, bidx))
                level = [mk]
            merged[bidx, qi] = level[0]

    graph = HighLevelGraph.from_collections(core_name, core, dependencies=deps)
    bchunks = tuple(batch.chunks)

    def collection(prefix, tasks, chunks, dtype):
        name = f"{prefix}-{token}"
        layers = dict(graph.layers)
        layers[name] = {(name,) + idx: task for idx, task in tasks.items()}
        dependencies = dict(graph.dependencies)
        dependencies[name] = {core_name}
        return da.Array(HighLevelGraph(layers, dependencies), name, chunks,
                        meta=np.empty((0,) * len(chunks), dtype))

    result = collection(
        "fastattn-attention",
        {bidx + (qi, 0): (partial(_final_out, odt=odt), m) for (bidx, qi), m in merged.items()},
        bchunks + (q_chunks, (Dv,)), odt)
    parts = [result]
    if return_weights:
        wtasks = {}
        for (bidx, qi), seen in pairs.items():
            bshape_blk = tuple(c[i] for c, i in zip(batch.chunks, bidx))
            seen_set = set(seen)
            for ki in range(len(k_chunks)):
                if ki in seen_set:
                    wtasks[bidx + (qi, ki)] = (partial(_final_weights, odt=odt),
                                               (core_name,) + bidx + (qi, ki), merged[bidx, qi])
                else:
                    shape = bshape_blk + (q_chunks[qi], k_chunks[ki])
                    wtasks[bidx + (qi, ki)] = (partial(np.zeros, shape, odt),)
        parts.append(collection("fastattn-attention-weights", wtasks, bchunks + (q_chunks, k_chunks), odt))
    if return_lse:
        parts.append(collection(
            "fastattn-attention-lse",
            {bidx + (qi,): (partial(_final_lse, cdt=cdt), m) for (bidx, qi), m in merged.items()},
            bchunks + (q_chunks,), cdt))
    return parts[0] if len(parts) == 1 else tuple(parts)


# --------------------------------------------------------------- the hook

def _lazy_call(name, args, kwargs):
    """fastattn.attention / softmax / log_softmax given a Dask array land here (through
    fastattn._lazy): the same call, answered lazily."""
    return {"attention": attention, "softmax": softmax, "log_softmax": log_softmax}[name](*args, **kwargs)
