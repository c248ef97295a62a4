"""Attention and merging in the reference (pure NumPy, float64).

Part of :mod:`fastattn.reference` (the specification): :func:`attention`,
which materialises the whole masked ``(..., Lq, Lk)`` score matrix, and
:func:`merge_attention`; also the key visibility (causal, window, mask,
``kv_lengths`` / ``kv_start``, alignment) and the grouped-query head mapping
that :func:`attention_backward <fastattn.reference.attention_backward>` shares.
"""
from __future__ import annotations

import numpy as np

from ._reference_checks import (_as_f64, _broadcast_arg, _check_align, _check_causal, _check_scale,
                                _check_softcap, _check_window, _kv_input, _kv_scaled, _length_table)
from ._reference_sinks import apply_sinks, check_sinks
from ._reference_softmax import _softmax_lse_lastaxis


# --------------------------------------------------------------------------- visibility and heads
def _visibility(batch, Lq, Lk, causal, window, mask, kv_lengths, kv_start, align):
    """Which keys each query sees, and its diagonal position: (visible of shape
    batch + (Lq, Lk), pos of shape batch + (Lq, 1), j the key indices (1, Lk)).
    p(i) = i, or i + Lk_eff - Lq when bottom-right aligned (causal="bottom_right",
    or align="bottom_right"); keys j >= kv_lengths and j < kv_start are invisible."""
    mode = _check_causal(causal)
    bottom_right = mode == "bottom_right" or _check_align(align) == "bottom_right"
    left, right = _check_window(window)
    full = batch + (Lq, Lk)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
        mask = _broadcast_arg(mask, full, "mask", "(..., Lq, Lk) =")
    if kv_lengths is not None:
        lk_eff = _length_table(kv_lengths, "kv_lengths", batch, Lk)
    else:
        lk_eff = np.full(batch + (1, 1), Lk, dtype=np.int64)
    i = np.arange(Lq, dtype=np.int64)[:, None]
    j = np.arange(Lk, dtype=np.int64)[None, :]
    pos = i + lk_eff - Lq if bottom_right else np.broadcast_to(i, batch + (Lq, 1))
    visible = np.broadcast_to(j < lk_eff, full)
    if mode is not None:
        visible = visible & (j <= pos)
    if left is not None:
        visible = visible & (j >= pos - left)
    if right is not None:
        visible = visible & (j <= pos + right)
    if kv_start is not None:
        visible = visible & (j >= _length_table(kv_start, "kv_start", batch, Lk))
    if mask is not None:
        visible = visible & mask
    return np.broadcast_to(visible, full), pos, j


def _group_heads(q, k, v):
    """Grouped-query / multi-query heads: when q has g > 1 times the heads (axis -3)
    of k and v, query head h uses kv head h // g, so k and v are repeated g times.
    Returns (k, v, g, batch shape of q, k, v), or raises ValueError (naming the
    shapes as given) when the batch dims do not broadcast."""
    g = 1
    kg, vg = k, v
    if q.ndim >= 3 and k.ndim >= 3 and v.ndim >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk == hv and hk > 0 and hq != hk and hq % hk == 0:
            g = hq // hk
            kg = np.repeat(k, g, axis=-3)
            vg = np.repeat(v, g, axis=-3)
    try:
        batch = np.broadcast_shapes(q.shape[:-2], kg.shape[:-2], vg.shape[:-2])
    except ValueError:
        raise ValueError(f"batch dimensions of q, k, v are not broadcastable: "
                         f"q.shape={q.shape}, k.shape={k.shape}, v.shape={v.shape}") from None
    return kg, vg, g, batch


# --------------------------------------------------------------------------- attention
def attention(q, k, v, *, scale=None, causal=False, mask=None, bias=None, window=None,
              kv_lengths=None, kv_start=None, align="top_left", softcap=None, alibi_slopes=None,
              k_scale=None, v_scale=None, sinks=None, return_weights=False, return_lse=False):
    """Exact scaled dot-product attention in float64: the specification of :func:`fastattn.attention`.

    Builds the whole masked score matrix ``(..., Lq, Lk)``: obviously correct,
    not fast.  Takes the same arguments as :func:`fastattn.attention` but
    ``out`` and ``num_threads``.

    Parameters
    ----------
    q : array_like, shape (..., Lq, Dk)
        Queries (at least 2-D; leading dims are batch dims).
    k : array_like, shape (..., Lk, Dk)
        Keys.
    v : array_like, shape (..., Lk, Dv)
        Values.  Batch dims broadcast by NumPy rules; when the head axis (-3)
        of ``q`` is a multiple ``g > 1`` of ``k``'s and ``v``'s, query head
        ``h`` uses key/value head ``h // g`` (grouped-query attention).
        ``k`` and ``v`` may be float8 arrays (``ml_dtypes.float8_e4m3fn`` /
        ``float8_e5m2``, their values exactly) or :class:`fastattn.QuantizedKV`
        (element ``d`` of a row: ``(code - zero[..., d // G]) * scale[..., d // G]``).
    scale : float, optional
        Multiplies ``q @ kᵀ``; default ``1 / sqrt(Dk)`` (1 when ``Dk`` is 0).
    causal : {False, True, "top_left", "bottom_right"}, optional
        ``True``/``"top_left"``: query ``i`` sees keys ``j <= i``.
        ``"bottom_right"``: query ``i`` sees keys ``j <= i + Lk_eff - Lq``,
        ``Lk_eff`` being the row's number of valid keys.
    mask : array_like of bool, broadcastable to (..., Lq, Lk), optional
        ``True`` where a query may attend to a key.
    bias : array_like, broadcastable to (..., Lq, Lk), optional
        Added to the scaled, soft-capped scores.
    window : int or (int or None, int or None), optional
        Key ``j`` is visible iff ``p(i) - left <= j <= p(i) + right``, where
        ``p(i)`` is ``i``, or ``i + Lk_eff - Lq`` with
        ``causal="bottom_right"``; ``None`` leaves a side unbounded.
    kv_lengths : array_like of int, broadcastable to the batch dims, optional
        Keys ``j >= kv_lengths[b]`` are invisible; each length in ``[0, Lk]``.
    kv_start : array_like of int, broadcastable to the batch dims, optional
        Keys ``j < kv_start`` are invisible (left padding); ``p(i)`` does not move.
        1-D tables of ``kv_lengths`` / ``kv_start`` with two or more batch dims hold
        one value per sequence (the leading batch dim).
    align : {"top_left", "bottom_right"}, optional
        ``p(i) = i`` or ``i + Lk_eff - Lq`` for windows and ALiBi, without masking
        by itself; ``causal="bottom_right"`` implies ``"bottom_right"``.
    softcap : float, optional
        Scaled scores ``s`` become ``softcap * tanh(s / softcap)``.
    alibi_slopes : array_like, broadcastable to the batch dims, optional
        Adds ``-slope * |p(i) - j|`` to each score.
    k_scale, v_scale : array_like, optional
        Scales of integer (int8) or float8 ``k`` / ``v``: the keys are ``k * k_scale``,
        with ``k_scale`` broadcastable to ``k.shape[:-1] + (1,)`` (per tensor,
        head or key) or to ``k.shape[:-2] + (1, Dk)`` (per channel); likewise
        ``v_scale`` for ``v``.
    sinks : array_like, broadcastable to the batch dims, optional
        Attention sinks (one per query head: shape ``(Hq,)``, ``(B, Hq)``, ...):
        one extra logit per row, equal to its sink -- not scaled, soft-capped,
        biased or masked -- whose column is dropped, so the weights over the
        keys sum to less than 1 and the lse includes ``exp(sink)``.
    return_weights : bool, optional
        Also return the weights ``(..., Lq, Lk)``.
    return_lse : bool, optional
        Also return each row's log-sum-exp ``(..., Lq)``.

    Returns
    -------
    out : ndarray of float64, shape (..., Lq, Dv)
        The output; the whole result when neither flag is set, else the first
        item of the tuple ``(out, weights, lse)`` holding the parts asked for.
    weights : ndarray of float64, shape (..., Lq, Lk)
        Only with ``return_weights=True``.
    lse : ndarray of float64, shape (..., Lq)
        Only with ``return_lse=True``.

    Raises
    ------
    TypeError
        A complex, object or string array; a non-boolean ``mask``;
        non-integer ``kv_lengths`` or ``kv_start``; ``scale``, ``softcap``,
        ``window``, ``causal`` or ``align`` of the wrong type; ``k_scale`` /
        ``v_scale`` for non-integer keys / values.
    ValueError
        Fewer than 2 dims; mismatched ``Dk`` or ``Lk``; batch dims, ``mask``,
        ``bias``, ``kv_lengths``, ``kv_start``, ``alibi_slopes`` or the scales
        that do not broadcast; ``kv_lengths`` or ``kv_start`` outside
        ``[0, Lk]``; a negative window side; ``softcap <= 0``; a non-finite
        ``scale`` or ``softcap``; an unknown ``causal`` or ``align`` string;
        ``sinks`` that do not broadcast to the batch dims.

    See Also
    --------
    fastattn.attention : The compiled implementation.
    merge_attention : Combine results over disjoint key sets.

    Notes
    -----
    Scores are built as ``s = scale * q @ kᵀ``, then the softcap, ``+ bias``,
    the ALiBi term, and ``-inf`` for every invisible key.  A row with no
    visible key gives output 0, weights 0 and lse ``-inf`` (with ``sinks``:
    lse equal to its sink).  Values of invisible keys never contribute, even
    when they are inf or NaN.  With sinks,
    ``p_j = exp(s_j) / (exp(sink) + sum_k exp(s_k))``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn import reference
    >>> q = np.ones((2, 4))
    >>> k = np.ones((2, 4))
    >>> v = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> print(reference.attention(q, k, v))                 # equal scores: the mean
    [[0.5 0.5]
     [0.5 0.5]]
    >>> print(reference.attention(q, k, v, causal=True))    # row 0 sees key 0 only
    [[1.  0. ]
     [0.5 0.5]]
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
        raise ValueError(
            f"q and k must have the same head dimension Dk (last axis): "
            f"q.shape={q.shape}, k.shape={k.shape}"
        )
    if Lv != Lk:
        raise ValueError(
            f"k and v must have the same number of keys Lk (axis -2): "
            f"k.shape={k.shape}, v.shape={v.shape}"
        )

    k, v, _, batch = _group_heads(q, k, v)
    full = batch + (Lq, Lk)

    scale = _check_scale(scale, Dk)
    softcap = _check_softcap(softcap)
    visible, pos, j = _visibility(batch, Lq, Lk, causal, window, mask, kv_lengths, kv_start, align)
    if bias is not None:
        bias = _as_f64(bias, "bias")
        bias = _broadcast_arg(bias, full, "bias", "(..., Lq, Lk) =")
    if alibi_slopes is not None:
        slopes = _as_f64(alibi_slopes, "alibi_slopes")
        slopes = _broadcast_arg(slopes, batch, "alibi_slopes", "the batch dims")[..., None, None]
    if sinks is not None:
        sinks = check_sinks(sinks, batch)

    with np.errstate(all="ignore"):
        s = scale * np.matmul(q, np.swapaxes(k, -1, -2))
        s = np.array(np.broadcast_to(s, full), dtype=np.float64)
        if softcap is not None:
            s = softcap * np.tanh(s / softcap)
        if bias is not None:
            s = s + bias
        if alibi_slopes is not None:
            s = s - slopes * np.abs(pos - j).astype(np.float64)
    s = np.where(visible, s, -np.inf)

    w, lse, empty = _softmax_lse_lastaxis(s)
    if sinks is not None:
        lse, factor = apply_sinks(lse, sinks)
        w = w * factor[..., None]
    with np.errstate(all="ignore"):
        # Invisible keys never contribute, even when their values are inf/NaN
        # (e.g. garbage padding beyond kv_lengths): 0 * NaN must not leak in.
        finite_v = np.isfinite(v)
        if finite_v.all():
            out = np.matmul(w, v)
        else:
            out = np.matmul(w, np.where(finite_v, v, 0.0))
            vbad = np.where(finite_v, 0.0, v)
            out = out + np.where(visible[..., None], w[..., None] * vbad[..., None, :, :], 0.0).sum(-2)
    out = np.array(np.broadcast_to(out, batch + (Lq, Dv)), dtype=np.float64)
    out = np.where(empty[..., None], 0.0, out)

    res = (out,)
    if return_weights:
        res += (w,)
    if return_lse:
        res += (lse,)
    return res[0] if len(res) == 1 else res


# --------------------------------------------------------------------------- merge
def merge_attention(outs, lses, sinks=None):
    """Combine attention results computed over disjoint key sets, in float64.

    The specification of :func:`fastattn.merge_attention`:
    ``lse = logaddexp(lse_1, ..., lse_n)`` and
    ``out = sum_i exp(lse_i - lse) * out_i``.

    Parameters
    ----------
    outs : sequence of array_like, each of shape (..., Lq, Dv)
        Each part's normalised attention output; all of one shape.
    lses : sequence of array_like, each of shape (..., Lq)
        Each part's log-sum-exp, in the order of ``outs``.
    sinks : array_like, broadcastable to ``lses[0].shape[:-1]``, optional
        Attention sinks applied once to the merged rows (the parts computed
        without them): the merged result is the attention over the union of
        the keys with these sinks, its lse including the sink.

    Returns
    -------
    out : ndarray of float64, shape (..., Lq, Dv)
        The output over the union of the parts' keys.  Rows where every part
        is empty (lse ``-inf``) give 0.
    lse : ndarray of float64, shape (..., Lq)
        Its log-sum-exp (``-inf`` for those rows, NaN where a part's is NaN).

    Raises
    ------
    TypeError
        An input of a complex, object or string dtype.
    ValueError
        No parts; a different number of ``outs`` and ``lses``; shapes that do
        not match; ``sinks`` that do not broadcast.

    See Also
    --------
    fastattn.merge_attention : The compiled implementation.
    attention : The attention reference.

    Examples
    --------
    Two parts of one key each, with equal log-sum-exps, weigh equally:

    >>> import numpy as np
    >>> from fastattn import reference
    >>> out, lse = reference.merge_attention([[[1.0, 0.0]], [[0.0, 1.0]]], [[0.0], [0.0]])
    >>> print(out, np.round(lse, 6))
    [[0.5 0.5]] [0.693147]
    """
    outs = [_as_f64(o, "outs") for o in outs]
    lses = [_as_f64(x, "lses") for x in lses]
    if len(outs) == 0:
        raise ValueError("merge_attention needs at least one part (outs is empty)")
    if len(outs) != len(lses):
        raise ValueError(f"outs and lses must have the same length, got {len(outs)} and {len(lses)}")
    shape = outs[0].shape
    for idx, (o, l) in enumerate(zip(outs, lses)):
        if o.ndim < 1:
            raise ValueError(f"outs[{idx}] must be at least 1-D, got shape {o.shape}")
        if o.shape != shape:
            raise ValueError(f"outs[{idx}] has shape {o.shape}, expected {shape} like outs[0]")
        if l.shape != shape[:-1]:
            raise ValueError(
                f"lses[{idx}] has shape {l.shape}, expected {shape[:-1]} (outs shape without the last axis)"
            )
    if sinks is not None:
        sinks = check_sinks(sinks, shape[:-2])
    L = np.stack(lses)  # (n, ..., Lq)
    O = np.stack(outs)  # (n, ..., Lq, Dv)
    with np.errstate(all="ignore"):
        m = np.max(L, axis=0)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        tot = np.sum(np.exp(L - m_safe), axis=0)
        lse = m_safe + np.log(tot)
        empty = m == -np.inf
        lse = np.where(empty, -np.inf, lse)
        lse = np.where(np.isnan(m), np.nan, lse)
        lse_safe = np.where(np.isfinite(lse), lse, 0.0)
        wts = np.where(L == -np.inf, 0.0, np.exp(L - lse_safe))
        out = np.sum(wts[..., None] * O, axis=0)
    out = np.where(empty[..., None], 0.0, out)
    if sinks is not None:
        lse, factor = apply_sinks(lse, sinks)
        out = out * factor[..., None]
    return out, lse
