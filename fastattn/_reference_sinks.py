"""Attention sinks in the reference (pure NumPy, float64): the specification.

A sink is one extra logit per query row, equal to the row's ``sinks`` entry:
not scaled, not soft-capped, no bias or ALiBi, never masked.  It takes part in
the row's softmax and its column is then dropped::

    p_j = exp(s_j) / (exp(sink) + sum_k exp(s_k))      over the row's visible keys
    out = sum_j p_j v_j
    lse = log(exp(sink) + sum_k exp(s_k))               (the sink included)

so the weights over the keys sum to less than 1, and a row with no visible key
gives output 0, weights 0 and lse equal to its sink.  Given the softmax over the
keys alone (weights ``w``, log-sum-exp ``lse``), the sink only rescales:
``lse' = logaddexp(lse, sink)``, ``w' = w * exp(lse - lse')``, ``out' = out *
exp(lse - lse')`` -- which is also how parts merged by ``merge_attention`` take
their sink, once.

The backward: with ``D = rowsum(grad_out * out)`` and ``P_sink = exp(sink - lse')``,
``d sink = -P_sink * D`` (summed over the dims ``sinks`` was broadcast along);
the gradients of q, k and v keep their form, since the probabilities recomputed
from ``lse'`` already carry the sink.
"""
from __future__ import annotations

import numpy as np

from ._reference_checks import _is_bfloat16, _is_float8

__all__ = ["check_sinks", "apply_sinks", "sink_gradient"]


def check_sinks(sinks, batch):
    """``sinks`` as a float64 array broadcast to the query batch dims ``batch``
    (a read-only view).  TypeError for a non-real dtype (bool included),
    ValueError naming ``sinks`` when it does not broadcast."""
    a = np.asarray(sinks)
    if a.dtype.kind not in "iuf" and not (_is_bfloat16(a) or _is_float8(a)):   # as the kernels take them
        raise TypeError(f"sinks must be a real (float) array, got dtype {a.dtype}")
    a = a.astype(np.float64, copy=False)
    try:
        if np.broadcast_shapes(a.shape, tuple(batch)) != tuple(batch):
            raise ValueError
    except ValueError:
        raise ValueError(f"sinks with shape {a.shape} does not broadcast to the query batch dimensions "
                         f"{tuple(batch)} (one sink per query head, e.g. shape {tuple(batch)[-1:]})") from None
    return np.broadcast_to(a, tuple(batch))


def apply_sinks(lse, sinks):
    """The sink of each row on a softmax computed over the keys alone.

    ``lse``: (..., Lq) log-sum-exp over the visible keys (``-inf`` for a row
    without any); ``sinks``: float64 broadcastable to ``lse.shape[:-1]``.
    Returns ``(lse_total, factor)``: ``logaddexp(lse, sink)`` and the factor
    ``exp(lse - lse_total)`` that scales the row's weights and output (0 for a
    row without keys, whose lse becomes its sink)."""
    s = np.asarray(sinks, dtype=np.float64)
    s = np.broadcast_to(s[..., None] if lse.ndim else s, lse.shape)
    with np.errstate(all="ignore"):
        total = np.logaddexp(lse, s)
        factor = np.where(lse == -np.inf, 0.0, np.exp(lse - total))
    return total, factor


def sink_gradient(grad_out, out, lse, sinks):
    """``d sink`` of every row summed over the row axis: ``-sum_i exp(sink - lse_i)
    * rowsum(grad_out * out)_i``, of shape ``lse.shape[:-1]`` (the caller sums it
    to the shape of ``sinks`` as passed).

    ``grad_out``, ``out``: (..., Lq, Dv); ``lse``: (..., Lq), the forward's
    (sink included); ``sinks``: float64 broadcast to ``lse.shape[:-1]``.  A row
    whose lse is ``-inf`` (no key and a ``-inf`` sink) contributes 0."""
    s = np.asarray(sinks, dtype=np.float64)[..., None]
    with np.errstate(all="ignore"):
        d = np.einsum("...d,...d->...", np.asarray(grad_out, dtype=np.float64), np.asarray(out, dtype=np.float64))
        p_sink = np.where(lse == -np.inf, 0.0, np.exp(s - lse))
        return -(p_sink * d).sum(axis=-1)
