"""The gradients of attention in the reference (pure NumPy, float64).

Part of :mod:`fastattn.reference` (the specification): :func:`attention_backward`,
from materialised scores and the forward's ``out`` and ``lse``, as the kernels
compute it.
"""
from __future__ import annotations

import numpy as np

from ._reference_attention import _group_heads, _visibility
from ._reference_checks import _as_f64, _broadcast_arg, _check_scale, _check_softcap, _kv_input, _kv_scaled
from ._reference_sinks import check_sinks, sink_gradient


def _sum_to_shape(x, shape):
    """Sum ``x`` over the dims that were broadcast from ``shape`` (NumPy rules)."""
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(axis=tuple(range(lead)))
    axes = tuple(d for d, n in enumerate(shape) if n == 1 and x.shape[d] != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x.reshape(shape)


def _live_matmul(w, x, live):
    """``sum_j w[..., i, j] * x[..., j, :]`` over the live pairs ``(i, j)`` only.

    A plain matmul multiplies the zero weights of dead pairs by the entries of
    ``x`` too, and ``0 * inf`` is NaN: an inf or NaN in a masked-out key, value,
    query or output-gradient row must not reach any gradient."""
    finite = np.isfinite(x)
    if finite.all():
        return np.matmul(w, x)
    res = np.matmul(w, np.where(finite, x, 0.0))
    bad = np.where(finite, 0.0, x)
    return res + np.where(live[..., None], w[..., None] * bad[..., None, :, :], 0.0).sum(-2)


def _check_grad_operand(x, name, shape):
    a = _as_f64(x, name)
    if a.shape != tuple(shape):
        raise ValueError(f"{name} has shape {a.shape}, expected {tuple(shape)} (the shape "
                         f"attention() gives for these q, k, v)")
    return a


def attention_backward(grad_out, q, k, v, out, lse, *, scale=None, causal=False, mask=None,
                       bias=None, window=None, kv_lengths=None, kv_start=None, align="top_left",
                       softcap=None, alibi_slopes=None, k_scale=None, v_scale=None, sinks=None,
                       return_dbias=False, return_dsinks=False):
    """Compute the gradients of :func:`attention` (reference, float64, materialised scores).

    ``out, lse = attention(q, k, v, ..., return_lse=True)`` with the same options;
    ``grad_out`` is the gradient of the loss with respect to ``out`` (its shape).
    Like the kernels, this recomputes the probabilities from ``lse`` and the row
    terms from ``out``::

        s   = scores as in attention() (softcap, bias, ALiBi, then -inf where invisible)
        P   = exp(s - lse)                       0 where s is -inf
        D   = rowsum(grad_out * out)
        dS  = P * (grad_out @ v^T - D)           0 where s is -inf
        dbias = dS                               summed over bias's broadcast dims
        dS *= 1 - tanh(scale q k^T / softcap)^2  (softcap only)
        dq  = scale * dS @ k,  dk = scale * dS^T @ q,  dv = P^T @ grad_out

    A pair whose score is -inf (invisible, or a -inf bias) contributes nothing to
    any gradient, even when its key, value, query or output-gradient row holds
    inf or NaN; a row with no visible key (lse -inf) gets zero gradients.  NaN
    and inf elsewhere propagate by IEEE arithmetic.  ALiBi slopes, masks and
    kv_lengths take no gradient.  Gradients of broadcast batch dims are summed
    back to each input's shape, grouped query heads (GQA/MQA) are summed into
    their key/value head.  With ``sinks`` (and ``lse`` from the forward with
    those sinks, so that it includes them) the formulas above hold as written,
    and ``d sink = -sum_rows exp(sink - lse) * D``.  Keys and values stored as
    int8 / float8 with ``k_scale`` / ``v_scale``, or as a
    :class:`fastattn.QuantizedKV`, enter as the values :func:`attention` computes
    with (``k * k_scale``; ``(code - zero) * scale``), and ``dk`` / ``dv`` are the
    gradients with respect to those values.

    Parameters
    ----------
    grad_out : array_like, shape (..., Lq, Dv)
        Gradient of the loss with respect to ``out``.
    q : array_like, shape (..., Lq, Dk)
        The forward's queries.
    k : array_like or fastattn.QuantizedKV, shape (..., Lk, Dk)
        The forward's keys.
    v : array_like or fastattn.QuantizedKV, shape (..., Lk, Dv)
        The forward's values.
    out : array_like, shape (..., Lq, Dv)
        The forward's output.
    lse : array_like, shape (..., Lq)
        The forward's log-sum-exp.
    scale, causal, mask, bias, window, kv_lengths, kv_start, align, softcap, alibi_slopes : optional
        The forward call's options, meaning what they mean for :func:`attention`.
    k_scale, v_scale : array_like, optional
        The forward's scales of int8 / float8 ``k`` / ``v``, as for :func:`attention`.
    sinks : array_like, broadcastable to the batch dims, optional
        The forward's attention sinks.
    return_dbias : bool, optional
        Also return the gradient of ``bias``.
    return_dsinks : bool, optional
        Also return the gradient of ``sinks`` (needs ``sinks``).

    Returns
    -------
    dq, dk, dv : ndarray of float64
        In the shapes of q, k, v (a QuantizedKV's logical shape); ``dk`` / ``dv``
        with respect to the keys / values the forward computed with.
    dbias : ndarray of float64
        Only with ``return_dbias=True``: in bias's shape.
    dsinks : ndarray of float64
        Only with ``return_dsinks=True``: in the shape of ``sinks`` as passed
        (summed over the dims it was broadcast along); last in the tuple.

    Raises
    ------
    TypeError
        As :func:`attention`, and ``return_dbias`` that is not a bool.
    ValueError
        As :func:`attention`, ``grad_out`` / ``out`` / ``lse`` of the wrong shape,
        ``return_dbias`` without a bias, ``return_dsinks`` without sinks,
        ``sinks`` that do not broadcast to the batch dims.

    See Also
    --------
    fastattn.attention_backward : The compiled implementation.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn import reference
    >>> q = k = v = np.eye(3)[None]                       # (1, 3, 3)
    >>> out, lse = reference.attention(q, k, v, return_lse=True)
    >>> dq, dk, dv = reference.attention_backward(np.ones_like(out), q, k, v, out, lse)
    >>> dv.shape, float(np.round(dv.sum(), 6))              # each row's weights sum to 1
    ((1, 3, 3), 9.0)
    """
    q = _as_f64(q, "q")
    k_raw, k = _kv_input(k, "k")
    v_raw, v = _kv_input(v, "v")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must be at least 2-D (..., L, D), got shape {a.shape}")
    # int8 / float8 keys and values with scales: the values are k * k_scale, v * v_scale
    k = _kv_scaled(k, k_raw, k_scale, "k_scale", "k")
    v = _kv_scaled(v, v_raw, v_scale, "v_scale", "v")
    Lq, Dk = q.shape[-2:]
    Lk, Dk2 = k.shape[-2:]
    Lv, Dv = v.shape[-2:]
    if Dk2 != Dk:
        raise ValueError(f"q and k must have the same head dimension Dk (last axis): "
                         f"q.shape={q.shape}, k.shape={k.shape}")
    if Lv != Lk:
        raise ValueError(f"k and v must have the same number of keys Lk (axis -2): "
                         f"k.shape={k.shape}, v.shape={v.shape}")
    if return_dbias and bias is None:
        raise ValueError("return_dbias=True needs a bias")
    if return_dsinks and sinks is None:
        raise ValueError("return_dsinks=True needs sinks")
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    k, v, g, batch = _group_heads(q, k, v)
    full = batch + (Lq, Lk)
    grad_out = _check_grad_operand(grad_out, "grad_out", batch + (Lq, Dv))
    out = _check_grad_operand(out, "out", batch + (Lq, Dv))
    lse = _check_grad_operand(lse, "lse", batch + (Lq,))
    if sinks is not None:
        sinks_shape = np.shape(sinks)
        sinks = check_sinks(sinks, batch)

    scale = _check_scale(scale, Dk)
    softcap = _check_softcap(softcap)
    visible, pos, j = _visibility(batch, Lq, Lk, causal, window, mask, kv_lengths, kv_start, align)
    bias_shape = None
    if bias is not None:
        bias = _as_f64(bias, "bias")
        bias_shape = bias.shape
        bias = _broadcast_arg(bias, full, "bias", "(..., Lq, Lk) =")
    if alibi_slopes is not None:
        slopes = _as_f64(alibi_slopes, "alibi_slopes")
        slopes = _broadcast_arg(slopes, batch, "alibi_slopes", "the batch dims")[..., None, None]

    with np.errstate(all="ignore"):
        s = scale * np.matmul(q, np.swapaxes(k, -1, -2))
        s = np.array(np.broadcast_to(s, full), dtype=np.float64)
        if softcap is not None:
            t = np.tanh(s / softcap)
            s = softcap * t
        if bias is not None:
            s = s + bias
        if alibi_slopes is not None:
            s = s - slopes * np.abs(pos - j).astype(np.float64)
        s = np.where(visible, s, -np.inf)
        live = s != -np.inf
        lse_eff = np.where(lse == -np.inf, np.inf, lse)[..., None]
        p = np.where(live, np.exp(s - lse_eff), 0.0)
        dp = np.matmul(grad_out, np.swapaxes(v, -1, -2))
        d = np.sum(grad_out * out, axis=-1)[..., None]
        ds = np.where(live, p * (dp - d), 0.0)
        dbias = ds
        if softcap is not None:
            ds = ds * (1.0 - t * t)
        live_t = np.swapaxes(live, -1, -2)
        dv = _live_matmul(np.swapaxes(p, -1, -2), grad_out, live_t)
        dk = scale * _live_matmul(np.swapaxes(ds, -1, -2), q, live_t)
        dq = scale * _live_matmul(ds, k, live)

    if g > 1:   # the query heads of a group share their key/value head
        dk = dk.reshape(dk.shape[:-3] + (-1, g) + dk.shape[-2:]).sum(axis=-3)
        dv = dv.reshape(dv.shape[:-3] + (-1, g) + dv.shape[-2:]).sum(axis=-3)
    res = (_sum_to_shape(dq, q_shape), _sum_to_shape(dk, k_shape), _sum_to_shape(dv, v_shape))
    if return_dbias:
        res += (_sum_to_shape(dbias, bias_shape),)
    if return_dsinks:
        res += (_sum_to_shape(sink_gradient(grad_out, out, lse, sinks), sinks_shape),)
    return res
