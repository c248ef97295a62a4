"""Attention of one (query chunk, key chunk) pair of a larger problem: the task body of
:mod:`fastattn.dask` (NumPy only; no Dask import, so it is cheap on a worker).

A chunk pair holds queries ``qs <= i < qs + lq`` and keys ``ks <= j < ks + lk`` of a
problem with ``Lq`` queries and ``Lk`` keys.  Causal, window and ALiBi terms depend on
the *global* distance ``p(i) - j``, with ``p(i) = i + c`` (``c = Lk_eff - Lq`` for
``causal="bottom_right"`` or ``align="bottom_right"``, else 0).  In the pair's local indices ``i' = i - qs``,
``j' = j - ks`` that distance is ``i' - j' + delta`` with ``delta = qs - ks + c``, so
one pair is an ordinary in-memory :func:`fastattn.attention` call with options shifted
by ``delta``:

* causal and window become one band ``lo <= j' - i' <= hi`` (``lo = delta - left``,
  ``hi = delta + right``, right = 0 under causal), i.e. ``window=(-lo, hi)`` on local
  indices.  Keys in front that no row sees (``lo > 0``) and rows in front that see no
  key (``hi < 0``) are sliced off first (views, no copies), so both sides are >= 0;
* kv_lengths become local key limits ``clip(Lk_eff - ks, 0, lk)``;
* ALiBi ``-slope * |p(i) - j|`` is the kernel's own term when ``delta == 0``.  When
  every visible key lies on one side of the diagonal it is a per-key bias
  ``slope * side * (j' - r)`` (shape (..., 1, lk), bounded by ``slope * lk``) plus a
  per-row constant that leaves the output unchanged and is added to the lse.  A pair
  that straddles the diagonal with ``delta != 0`` is split into a one-sided part and a
  part with ``delta == 0``.

``delta`` is one number for the whole pair except with ``causal="bottom_right"`` and
kv_lengths that differ within the batch chunk; then the pair is computed per distinct
position of the kv_lengths block.  Everything is exact: the result equals the rows and
keys of the in-memory call up to float rounding (tests/test_dask.py).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _threads
from ._api import attention, merge_attention


@dataclass(frozen=True)
class PairOptions:
    """What every pair of one attention graph shares.

    ``scale`` and ``softcap`` are passed to the kernel as the user gave them (already
    validated); ``causal`` is None, "top_left" or "bottom_right"; ``left`` / ``right``
    the window sides (None = unbounded); ``cdt`` the compute dtype."""
    Lq: int
    Lk: int
    scale: object
    causal: Optional[str]
    left: Optional[int]
    right: Optional[int]
    softcap: object
    weights: bool
    num_threads: Optional[int]
    cdt: np.dtype
    bottom_right: bool = False      # p(i) = i + Lk_eff - Lq: align="bottom_right" (implied by causal)

    def __post_init__(self):
        if self.causal == "bottom_right":
            object.__setattr__(self, "bottom_right", True)


def task_threads(num_threads):
    """The thread count a task passes to the kernels.

    An explicit ``num_threads`` is used as given.  Otherwise one thread (Dask already
    runs one task per worker thread), unless ``fastattn.set_num_threads`` was called in
    this process (e.g. on every worker with ``client.run``): then that setting."""
    if num_threads is not None:
        return num_threads
    return None if _threads._global_num_threads is not None else 1


def head_groups(qb, kb, vb):
    """g > 1 when query head h uses key/value head h // g (the in-memory rule), else 1;
    qb, kb, vb: the batch dims of q, k, v."""
    if len(qb) >= 1 and len(kb) >= 1 and len(vb) >= 1 and kb[-1] == vb[-1]:
        hk = np.broadcast_shapes(kb, vb)[-1]
        if 0 < hk < qb[-1] and qb[-1] % hk == 0:
            return qb[-1] // hk
    return 1


def batch_shape(q, k, v):
    """The output batch dims of attention(q, k, v), grouped heads folded as in-memory."""
    qb, kb, vb = q.shape[:-2], k.shape[:-2], v.shape[:-2]
    if head_groups(qb, kb, vb) > 1:
        return np.broadcast_shapes(qb[:-1] + (kb[-1],), kb, vb)[:-1] + (qb[-1],)
    return np.broadcast_shapes(qb, kb, vb)


def check_lengths(lengths, Lk, name="kv_lengths"):
    """kv_lengths (kv_start) values must lie in [0, Lk] (the in-memory message);
    returns the table."""
    if lengths is not None and lengths.size:
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 0 or hi > Lk:
            raise ValueError(f"{name} must lie in [0, Lk={Lk}], got values in [{lo}, {hi}]")
    return lengths


# --------------------------------------------------------------- result pieces

def _empty(bshape, lq, lk, dv, opt):
    """The result of rows that see no key: output 0, lse -inf, weights 0."""
    parts = [np.zeros(bshape + (lq, dv), opt.cdt), np.full(bshape + (lq,), -np.inf, opt.cdt)]
    if opt.weights:
        parts.append(np.zeros(bshape + (lq, lk), opt.cdt))
    return tuple(parts)


def rescale_weights(w, lse_part, lse_total):
    """Weights normalised over a part of the keys, renormalised over all of them."""
    with np.errstate(invalid="ignore", over="ignore"):
        f = np.where(lse_total == -np.inf, 0, np.exp(lse_part - lse_total))
    return (w * f[..., None]).astype(w.dtype, copy=False)


def _join_keys(a, b):
    """Two results over consecutive key ranges merged into one."""
    out, lse = merge_attention([a[0], b[0]], [a[1], b[1]])
    if len(a) == 2:
        return out, lse
    w = np.concatenate([rescale_weights(a[2], a[1], lse), rescale_weights(b[2], b[1], lse)], axis=-1)
    return out, lse, w


def _join_rows(a, b):
    """Two results over consecutive query rows stacked into one (rows are axis -2 of out
    and weights, axis -1 of lse, which is second)."""
    return tuple(np.concatenate([x, y], axis=-1 if i == 1 else -2) for i, (x, y) in enumerate(zip(a, b)))


def _rows(x, start, stop=None):
    """Rows [start:stop] of a (..., Lq, Lk) operand; a broadcast row axis stays."""
    return x if x is None or x.shape[-2] == 1 else x[..., start:stop, :]


def _cols(x, start, stop=None):
    return x if x is None or x.shape[-1] == 1 else x[..., start:stop]


# --------------------------------------------------------------- one pair, one delta

def _band(q, k, v, mask, bias, klim, slopes, delta, opt):
    """Attention of the pair with one diagonal offset ``delta`` (see the module doc).

    ``klim``: local key limits (int64 array broadcasting to the batch dims, or None)."""
    lq, lk = q.shape[-2], k.shape[-2]
    right = 0 if opt.causal else opt.right
    lo = None if opt.left is None else delta - opt.left       # visible: lo <= j' - i' <= hi
    hi = None if right is None else delta + right
    bshape = batch_shape(q, k, v)
    if (lq == 0 or lk == 0 or (hi is not None and hi < 1 - lq) or (lo is not None and lo > lk - 1)
            or (klim is not None and not klim.any())):
        return _empty(bshape, lq, lk, v.shape[-1], opt)
    if lo is not None and lo > 0:        # keys [0, lo) are seen by no row
        part = _band(q, k[..., lo:, :], v[..., lo:, :], _cols(mask, lo), _cols(bias, lo),
                     None if klim is None else np.maximum(klim - lo, 0), slopes, delta - lo, opt)
        if opt.weights:
            part = part[:2] + (np.concatenate([np.zeros(bshape + (lq, lo), opt.cdt), part[2]], -1),)
        return part
    if hi is not None and hi < 0:        # rows [0, -hi) see no key
        t = -hi
        head = _empty(bshape, t, lk, v.shape[-1], opt)
        return _join_rows(head, _band(q[..., t:, :], k, v, _rows(mask, t), _rows(bias, t),
                                      klim, slopes, delta + t, opt))

    side = 0      # ALiBi: 0 = the kernel's own term (delta == 0), +1 / -1 = one-sided
    if slopes is not None and delta != 0:
        d_max = lk - 1 if hi is None else min(hi, lk - 1)      # extremes of visible j' - i'
        d_min = 1 - lq if lo is None else max(lo, 1 - lq)
        if d_max <= delta:
            side = 1           # every visible key at or before the diagonal: p(i) >= j
        elif d_min >= delta:
            side = -1          # every visible key at or after it
        elif delta > 0:        # keys [0, delta) lie before the diagonal, the rest has delta 0
            return _join_keys(
                _band(q, k[..., :delta, :], v[..., :delta, :], _cols(mask, 0, delta),
                      _cols(bias, 0, delta), None if klim is None else np.minimum(klim, delta),
                      slopes, delta, opt),
                _band(q, k[..., delta:, :], v[..., delta:, :], _cols(mask, delta), _cols(bias, delta),
                      None if klim is None else np.maximum(klim - delta, 0), slopes, 0, opt))
        else:                  # rows [0, -delta) lie before the diagonal, the rest has delta 0
            t = -delta
            return _join_rows(
                _band(q[..., :t, :], k, v, _rows(mask, 0, t), _rows(bias, 0, t), klim, slopes, delta, opt),
                _band(q[..., t:, :], k, v, _rows(mask, t), _rows(bias, t), klim, slopes, 0, opt))

    row_const = None
    if side:
        # -slope * side * (p(i) - j) = -slope * side * (i' + delta - r) + slope * side * (j' - r);
        # r is the chunk's far key, so the key term stays within [-slope * lk, 0]
        r = lk - 1 if side > 0 else 0
        sl = np.asarray(slopes, np.float64)[..., None]
        key_bias = (side * sl[..., None] * (np.arange(lk) - r)).astype(opt.cdt)
        bias = key_bias if bias is None else bias + key_bias
        row_const = -side * sl * (np.arange(lq) + (delta - r))
    if klim is not None and klim.min() >= lk:
        klim = None
    window = None if lo is None and hi is None else (None if lo is None else -lo, hi)
    res = attention(q, k, v, scale=opt.scale, causal=False, mask=mask, bias=bias, window=window,
                    kv_lengths=klim, softcap=opt.softcap,
                    alibi_slopes=slopes if slopes is not None and not side else None,
                    return_weights=opt.weights, return_lse=True,
                    num_threads=task_threads(opt.num_threads))
    if row_const is not None:
        res = res[:-1] + ((res[-1] + row_const).astype(opt.cdt),)
    # the kernel's order is (out, weights, lse); ours is (out, lse[, weights])
    return (res[0], res[-1]) + ((res[1],) if opt.weights else ())


# --------------------------------------------------------------- one pair

def _batch_take(x, r, i, g=1):
    """Batch position ``i`` (kept as a length-1 axis) of x's r-th batch dim from the
    right (r = 1: the head axis); ``g``: the grouped-query factor of x's heads."""
    if x is None:
        return None
    a = x.ndim - 2 - r
    if a < 0 or x.shape[a] == 1:
        return x
    i //= g
    return x[(slice(None),) * a + (slice(i, i + 1),)]


def _small_take(x, r, i):
    """Like _batch_take for a batch-only array (kv_lengths, slopes)."""
    if x is None or x.ndim < r or x.shape[x.ndim - r] == 1:
        return x
    a = x.ndim - r
    return x[(slice(None),) * a + (slice(i, i + 1),)]


def pair_attention(q, k, v, mask, bias, lengths, slopes, qs, ks, opt):
    """(out, lse) — or (out, lse, weights) — of the chunk pair starting at query ``qs``
    and key ``ks`` of the global problem described by ``opt``.

    q, k, v, mask, bias are the pair's blocks (mask / bias with >= 2 dims); lengths and
    slopes the kv_lengths / alibi_slopes of the batch chunk (or None).  Results are in
    ``opt.cdt``; weights are normalised over this pair's keys (see rescale_weights)."""
    q, k, v = (x.astype(opt.cdt, copy=False) for x in (q, k, v))
    if bias is not None:
        bias = bias.astype(opt.cdt, copy=False)
    lk = k.shape[-2]
    klim = None
    c = 0
    if lengths is not None:
        lengths = np.asarray(lengths, np.int64)
        check_lengths(lengths, opt.Lk)      # lazy kv_lengths are checked here, on the worker
        klim = np.clip(lengths - ks, 0, lk)
    if opt.bottom_right:
        c = (opt.Lk if lengths is None else lengths) - opt.Lq
    delta = qs - ks + c
    if np.ndim(delta) == 0 or np.all(delta == np.ravel(delta)[0]):
        return _band(q, k, v, mask, bias, klim, slopes, int(np.ravel(delta)[0]), opt)

    # bottom_right with kv_lengths that differ inside the chunk: one delta per position of
    # the lengths block (their batch dims, counted from the right)
    bshape = batch_shape(q, k, v)
    nb, ln = len(bshape), lengths.ndim
    g = head_groups(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = None
    for idx in itertools.product(*(range(n) for n in lengths.shape)):
        sub = [q, k, v, mask, bias, lengths, slopes]
        sel = [slice(None)] * nb
        for d, i in enumerate(idx):
            r = ln - d
            if lengths.shape[d] == 1:
                continue
            gk = g if r == 1 else 1
            sub = [_batch_take(sub[0], r, i), _batch_take(sub[1], r, i, gk), _batch_take(sub[2], r, i, gk),
                   _batch_take(sub[3], r, i), _batch_take(sub[4], r, i),
                   _small_take(sub[5], r, i), _small_take(sub[6], r, i)]
            sel[nb - r] = slice(i, i + 1)
        part = pair_attention(*sub, qs, ks, opt)
        if out is None:
            out = tuple(np.empty(bshape + p.shape[len(bshape):], opt.cdt) for p in part)
        for o, p in zip(out, part):
            o[tuple(sel)] = p
    return out
