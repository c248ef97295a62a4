"""Pure-NumPy reference implementation: the *specification* of fastattn.

Everything here computes in float64 and always returns float64 arrays.  The
attention reference materialises the full ``(..., Lq, Lk)`` score matrix; it is
meant to be obviously correct, not fast.  The compiled kernels in
``fastattn._kernels`` are tested against these functions.

Conventions shared with the fast API
------------------------------------
* ``softmax`` of a row that is entirely ``-inf`` is all zeros; ``log_softmax`` of
  such a row is all ``-inf``.  A row containing ``+inf`` or ``NaN`` is all ``NaN``.
  No floating-point warnings are ever emitted.
* An attention query row with no visible key (everything masked, an empty
  window, ``kv_lengths`` 0, ``Lk == 0``, or all visible scores ``-inf``) yields
  output 0, weights 0 and lse ``-inf``.
* Scores are built in this order: ``s = scale * q @ k^T``; softcap
  ``s = c * tanh(s / c)``; ``+ bias``; ``- slope * |p(i) - j|`` (ALiBi); then every
  invisible key (causal, window, mask, kv_lengths) is set to ``-inf``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

if __package__:
    from ._reference_sinks import apply_sinks, check_sinks, sink_gradient
else:   # loaded from its path (the tests, before the kernels are built): its sibling likewise
    import importlib.util as _ilu
    import os as _os

    _spec = _ilu.spec_from_file_location(
        "_fastattn_reference_sinks", _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "_reference_sinks.py"))
    _sinks_mod = _ilu.module_from_spec(_spec)
    _spec.loader.exec_module(_sinks_mod)
    apply_sinks, check_sinks, sink_gradient = _sinks_mod.apply_sinks, _sinks_mod.check_sinks, _sinks_mod.sink_gradient

__all__ = ["softmax", "log_softmax", "attention", "merge_attention"]

_CAUSAL_MODES = ("top_left", "bottom_right")


# --------------------------------------------------------------------------- helpers
def _is_bfloat16(a):
    """An array of the bfloat16 dtype (ml_dtypes), recognised by the dtype itself."""
    return a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.name == "bfloat16"


_FLOAT8_NAMES = ("float8_e4m3fn", "float8_e5m2")


def _is_float8(a):
    """An array of ml_dtypes' float8_e4m3fn or float8_e5m2, recognised by the
    dtype's name and size (ml_dtypes is never imported here)."""
    return a.dtype.itemsize == 1 and a.dtype.kind in "Vf" and a.dtype.name in _FLOAT8_NAMES


def _is_quantized(x):
    """A fastattn.QuantizedKV (recognised by its class, imported lazily)."""
    from ._quantized import QuantizedKV
    return isinstance(x, QuantizedKV)


def _dequantized(c):
    """The float64 values of a QuantizedKV, from its documented fields: element d
    of a row is (code - zero[..., d // G]) * scale[..., d // G]; 8 bits: one
    code per byte; 4 bits: element 2i in the low nibble of byte i, 2i + 1 in the
    high nibble."""
    data = np.asarray(c.data)
    if c.bits == 8:
        codes = data.astype(np.float64)
    else:
        codes = np.empty(data.shape[:-1] + (2 * data.shape[-1],))
        codes[..., 0::2] = data & 0x0F
        codes[..., 1::2] = data >> 4
    group = np.arange(codes.shape[-1]) // c.group_size
    scale = np.asarray(c.scale, np.float64)[..., group]
    zero = np.asarray(c.zero, np.float64)[..., group]
    return (codes - zero) * scale


def _kv_input(x, name):
    """k or v as (raw, float64 values): a QuantizedKV is dequantized from its
    fields (raw: the QuantizedKV), anything else goes through _as_f64."""
    if _is_quantized(x):
        return x, _dequantized(x)
    raw = np.asarray(x)
    return raw, _as_f64(raw, name)


def _as_f64(x, name):
    """Convert a real numeric / bool array-like to float64 (bfloat16 and float8
    included); TypeError otherwise."""
    a = np.asarray(x)
    if a.dtype.kind not in "biuf" and not _is_bfloat16(a) and not _is_float8(a):
        raise TypeError(
            f"{name}: unsupported dtype {a.dtype}; expected a real numeric or boolean array"
        )
    return a.astype(np.float64, copy=False)


def _normalize_axis(axis, ndim, name="axis"):
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of bounds for an array of ndim {ndim}")
    return axis % ndim


def _softmax_lse_lastaxis(s):
    """Row softmax and log-sum-exp over the last axis of a float64 array.

    Returns ``(w, lse, empty)`` where ``empty`` marks rows whose scores are all
    ``-inf`` (or that have no entries): weights 0, lse -inf.  Rows containing
    ``+inf`` or ``NaN`` get NaN weights and NaN lse.
    """
    n = s.shape[-1]
    if n == 0:
        lse = np.full(s.shape[:-1], -np.inf)
        return np.zeros(s.shape), lse, np.ones(s.shape[:-1], dtype=bool)
    with np.errstate(all="ignore"):
        bad = np.any(np.isnan(s) | (s == np.inf), axis=-1)
        m = np.max(s, axis=-1)
        empty = (m == -np.inf) & ~bad
        m_safe = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - m_safe[..., None])
        tot = np.sum(e, axis=-1)
        tot_safe = np.where(tot > 0, tot, 1.0)
        w = e / tot_safe[..., None]
        lse = m_safe + np.log(tot_safe)
    w = np.where(empty[..., None], 0.0, w)
    lse = np.where(empty, -np.inf, lse)
    w = np.where(bad[..., None], np.nan, w)
    lse = np.where(bad, np.nan, lse)
    return w, lse, empty


# --------------------------------------------------------------------------- softmax
def _rowwise(x, axis, fn):
    x = _as_f64(x, "x")
    if axis is None:
        flat = x.reshape(1, -1)
        return fn(flat).reshape(x.shape)
    if x.ndim == 0:
        raise ValueError("axis must be None for a 0-d input x (shape ())")
    ax = _normalize_axis(axis, x.ndim)
    moved = np.moveaxis(x, ax, -1)
    return np.moveaxis(fn(moved), -1, ax).copy()


def softmax(x, axis=-1):
    """Softmax of ``x`` along ``axis``, in float64 (the specification of :func:`fastattn.softmax`).

    Computed as ``exp(x - max) / sum(exp(x - max))`` per slice, with NumPy
    operations on float64 copies.

    Parameters
    ----------
    x : array_like
        A real numeric or boolean array.
    axis : int or None, optional
        The axis along which the result sums to 1 (negative counts from the
        end), or None for the whole array.  Default -1.

    Returns
    -------
    ndarray of float64
        The softmax, of ``x``'s shape.  An all ``-inf`` slice gives zeros; a
        slice containing ``+inf`` or NaN gives NaN.  No floating-point
        warnings.

    Raises
    ------
    TypeError
        ``x`` of a complex, object or string dtype; ``axis`` not an int or
        None.
    ValueError
        ``axis`` out of range, or an int ``axis`` for a 0-d ``x``.

    See Also
    --------
    fastattn.softmax : The compiled implementation.
    log_softmax : The log-softmax reference.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn import reference
    >>> print(np.round(reference.softmax(np.array([16.0, 8.0, 0.0]) / 8), 6))
    [0.665241 0.244728 0.090031]
    >>> print(reference.softmax([-np.inf, -np.inf]))
    [0. 0.]
    """

    def fn(a):
        return _softmax_lse_lastaxis(a)[0]

    return _rowwise(x, axis, fn)


def log_softmax(x, axis=-1):
    """Log-softmax of ``x`` along ``axis``, in float64 (the specification of :func:`fastattn.log_softmax`).

    Computed as ``(x - max) - log(sum(exp(x - max)))``, which avoids the
    cancellation of ``x - lse``.

    Parameters
    ----------
    x : array_like
        A real numeric or boolean array.
    axis : int or None, optional
        The axis of the softmax (negative counts from the end), or None for
        the whole array.  Default -1.

    Returns
    -------
    ndarray of float64
        The log-softmax, of ``x``'s shape.  An all ``-inf`` slice stays all
        ``-inf``; a slice containing ``+inf`` or NaN gives NaN.

    Raises
    ------
    TypeError
        ``x`` of a complex, object or string dtype; ``axis`` not an int or
        None.
    ValueError
        ``axis`` out of range, or an int ``axis`` for a 0-d ``x``.

    See Also
    --------
    fastattn.log_softmax : The compiled implementation.
    softmax : The softmax reference.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn import reference
    >>> print(np.round(reference.log_softmax([2.0, 1.0, 0.0]), 6))
    [-0.407606 -1.407606 -2.407606]
    """

    def fn(a):
        _, lse, empty = _softmax_lse_lastaxis(a)
        if a.shape[-1] == 0:
            return np.zeros(a.shape)
        with np.errstate(all="ignore"):
            # (x - max) - log(sum(exp(x - max))): avoids cancellation in x - lse
            m = np.max(a, axis=-1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            sh = a - m
            out = sh - np.log(np.sum(np.exp(sh), axis=-1, keepdims=True))
        out = np.where(empty[..., None], -np.inf, out)
        out = np.where(np.isnan(lse)[..., None], np.nan, out)
        return out

    return _rowwise(x, axis, fn)


# --------------------------------------------------------------------------- options
def _check_causal(causal):
    if causal is None or (isinstance(causal, (bool, np.bool_)) and not causal):
        return None
    if isinstance(causal, (bool, np.bool_)):
        return "top_left"
    if isinstance(causal, str):
        if causal in _CAUSAL_MODES:
            return causal
        raise ValueError(
            f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}"
        )
    raise TypeError(f"causal must be a bool or one of {_CAUSAL_MODES}, got {causal!r}")


def _window_side(x, which):
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"window {which} side must be a non-negative int or None, got {x!r}")
    if x < 0:
        raise ValueError(f"window {which} side must be >= 0, got {x}")
    return int(x)


def _check_window(window):
    if window is None:
        return None, None
    if isinstance(window, numbers.Integral) and not isinstance(window, (bool, np.bool_)):
        w = _window_side(window, "left")
        return w, w
    if isinstance(window, (tuple, list)) and len(window) == 2:
        return _window_side(window[0], "left"), _window_side(window[1], "right")
    raise TypeError(f"window must be None, an int or a (left, right) pair, got {window!r}")


def _scalar(x):
    """A 0-d array as its scalar (np.array(2.0) is a real number here too)."""
    return x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x


def _check_scale(scale, dk):
    scale = _scalar(scale)
    if scale is None:
        return 1.0 / math.sqrt(dk) if dk > 0 else 1.0
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return scale


def _check_softcap(softcap):
    softcap = _scalar(softcap)
    if softcap is None:
        return None
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a positive real number or None, got {softcap!r}")
    c = float(softcap)
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"softcap must be a finite number > 0, got {softcap!r}")
    return c


def _broadcast_arg(a, shape, name, what):
    try:
        return np.broadcast_to(a, shape)
    except ValueError:
        raise ValueError(
            f"{name} with shape {a.shape} is not broadcastable to {what} {shape}"
        ) from None


# --------------------------------------------------------------------------- attention
def _check_align(align):
    if align is None or align == "top_left":
        return "top_left"
    if isinstance(align, str):
        if align == "bottom_right":
            return align
        raise ValueError(f"align must be 'top_left' or 'bottom_right', got {align!r}")
    raise TypeError(f"align must be 'top_left' or 'bottom_right', got {align!r}")


def _length_table(x, name, batch, Lk):
    """kv_lengths / kv_start: integers broadcast to the batch dims, each in [0, Lk],
    as a batch + (1, 1) int64 array.  A 1-D table with two or more batch dims is
    one value per sequence -- per element of the leading batch dim -- never per head."""
    lens = np.asarray(x)
    if lens.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {lens.dtype}")
    if lens.ndim == 1 and len(batch) >= 2 and lens.shape[0] != 1:
        if lens.shape[0] != batch[0]:
            raise ValueError(f"{name}: a 1-D table holds one value per sequence (the leading batch dim, "
                             f"{batch[0]}), got {lens.shape[0]} values")
        lens = lens.reshape((lens.shape[0],) + (1,) * (len(batch) - 1))
    lens = _broadcast_arg(lens, batch, name, "the batch dims")
    if lens.size and (lens.min() < 0 or lens.max() > Lk):
        raise ValueError(f"{name} must satisfy 0 <= value <= Lk={Lk}; got values in "
                         f"[{lens.min()}, {lens.max()}]")
    return lens.astype(np.int64)[..., None, None]


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


def _kv_scaled(kv64, kv_raw, scale, name, kvname):
    """An integer (int8) or float8 k or v times its k_scale / v_scale (float64),
    the scale broadcast per key (to kv.shape[:-1] + (1,)) or per channel (to
    kv.shape[:-2] + (1, D))."""
    if scale is None:
        return kv64
    s = np.asarray(scale)
    if s.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real (float) array, got dtype {s.dtype}")
    if _is_quantized(kv_raw):
        raise TypeError(f"{name} is given for a QuantizedKV {kvname}: its scales are its own fields")
    if kv_raw.dtype.kind not in "iu" and not _is_float8(kv_raw):
        raise TypeError(f"{name} is given for {kvname} of dtype {kv_raw.dtype}: scales are for integer "
                        f"(int8) and float8 {kvname} only")
    per_key = kv64.shape[:-1] + (1,)
    per_channel = kv64.shape[:-2] + (1, kv64.shape[-1])

    def fits(target):
        try:
            return s.ndim <= len(target) and np.broadcast_shapes(s.shape, target) == target
        except ValueError:
            return False

    if not (fits(per_key) or fits(per_channel)):
        raise ValueError(f"{name} with shape {s.shape} broadcasts neither to {per_key} (per key) nor to "
                         f"{per_channel} (per channel)")
    s = s.astype(np.float64)
    if not np.isfinite(s).all():
        raise ValueError(f"{name} must be finite")
    return kv64 * s


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


# --------------------------------------------------------------------------- backward
__all__ += ["attention_backward"]


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
                       softcap=None, alibi_slopes=None, sinks=None, return_dbias=False, return_dsinks=False):
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
    and ``d sink = -sum_rows exp(sink - lse) * D``.

    Parameters
    ----------
    grad_out : array_like, shape (..., Lq, Dv)
        Gradient of the loss with respect to ``out``.
    q : array_like, shape (..., Lq, Dk)
        The forward's queries.
    k : array_like, shape (..., Lk, Dk)
        The forward's keys.
    v : array_like, shape (..., Lk, Dv)
        The forward's values.
    out : array_like, shape (..., Lq, Dv)
        The forward's output.
    lse : array_like, shape (..., Lq)
        The forward's log-sum-exp.
    scale, causal, mask, bias, window, kv_lengths, kv_start, align, softcap, alibi_slopes : optional
        The forward call's options, meaning what they mean for :func:`attention`.
    sinks : array_like, broadcastable to the batch dims, optional
        The forward's attention sinks.
    return_dbias : bool, optional
        Also return the gradient of ``bias``.
    return_dsinks : bool, optional
        Also return the gradient of ``sinks`` (needs ``sinks``).

    Returns
    -------
    dq, dk, dv : ndarray of float64
        In the shapes of q, k, v.
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
    k = _as_f64(k, "k")
    v = _as_f64(v, "v")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must be at least 2-D (..., L, D), got shape {a.shape}")
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


# --------------------------------------------------------------------------- packed and paged batches
__all__ += ["attention_varlen", "attention_paged"]


def _int_array(x, name, ndim, what):
    """An integer array of ndim dims (TypeError for other dtypes, ValueError for
    other ranks), as int64."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {a.shape}")
    return a.astype(np.int64)


def _check_cu_seqlens(x, name, total):
    """cu_seqlens: (S + 1,) integers from 0, non-decreasing, ending at total."""
    cu = _int_array(x, name, 1, "(S + 1,)")
    if cu.size == 0:
        raise ValueError(f"{name} must have at least one entry (0), got an empty array")
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu[0]}")
    if np.any(np.diff(cu) < 0):
        raise ValueError(f"{name} must be non-decreasing")
    if cu[-1] != total:
        raise ValueError(f"{name} must end at the total number of rows {total}, got {cu[-1]}")
    return cu


def _check_heads(q, k, v, qname, kname, vname):
    """Grouped heads on axis 0 (packed) or 1 (paged q: axis 1, caches: axis 1)."""
    hq, hk, hv = q, k, v
    if hk != hv:
        raise ValueError(f"{kname} and {vname} must have the same number of heads, got {hk} and {hv}")
    if (hk == 0) != (hq == 0) or (hk and hq % hk):
        raise ValueError(f"the query heads of {qname} ({hq}) must be a multiple of the key/value heads of "
                         f"{kname} ({hk})")


def _check_options(scale, causal, window, softcap, alibi_slopes, dk, hq):
    """The scalar options and ALiBi slopes (hq,), checked before any work."""
    _check_scale(scale, dk)
    _check_causal(causal)
    _check_window(window)
    _check_softcap(softcap)
    if alibi_slopes is not None:
        slopes = _as_f64(alibi_slopes, "alibi_slopes")
        _broadcast_arg(slopes, (hq,), "alibi_slopes", "the query heads")


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k=None, *, scale=None, causal=False, window=None,
                     softcap=None, alibi_slopes=None, sinks=None, return_lse=False):
    """Attention over a packed batch of variable-length sequences, in float64.

    The specification of :func:`fastattn.attention_varlen`: :func:`attention`
    applied to each sequence on its own (a loop over the sequences).

    Parameters
    ----------
    q : array_like, shape (Hq, total_q, Dk)
        The queries of every sequence, one after another along axis 1.
    k : array_like, shape (Hkv, total_k, Dk)
        The keys, packed likewise; ``Hq`` is a multiple of ``Hkv`` (query head
        ``h`` uses key/value head ``h // (Hq // Hkv)``).
    v : array_like, shape (Hkv, total_k, Dv)
        The values.
    cu_seqlens_q : array_like of int, shape (S + 1,)
        Sequence ``s`` owns query rows ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]``:
        starts at 0, non-decreasing, ends at ``total_q``.
    cu_seqlens_k : array_like of int, shape (S + 1,), optional
        The same for the keys; None: ``cu_seqlens_q`` (self-attention, then
        ``total_k == total_q``).
    scale, causal, window, softcap : optional
        As for :func:`attention`, per sequence: ``causal="bottom_right"``
        aligns each sequence's last query with its last key.
    alibi_slopes : array_like, broadcastable to (Hq,), optional
        ALiBi slopes per query head.
    sinks : array_like, broadcastable to (Hq,), optional
        Attention sinks per query head, as for :func:`attention`.
    return_lse : bool, optional
        Also return each row's log-sum-exp.

    Returns
    -------
    out : ndarray of float64, shape (Hq, total_q, Dv)
        The output; a sequence without keys gives zeros.
    lse : ndarray of float64, shape (Hq, total_q)
        Only with ``return_lse=True`` (``-inf`` for a sequence without keys).

    Raises
    ------
    TypeError
        Non-integer ``cu_seqlens``; a complex or object array; options of the
        wrong type.
    ValueError
        Arrays that are not 3-D; mismatched head dims, key counts or head
        counts; ``cu_seqlens`` not starting at 0, decreasing, not ending at the
        total or with different sequence counts; bad option values.

    See Also
    --------
    fastattn.attention_varlen : The compiled implementation.
    attention_paged : The same with keys and values in a paged cache.

    Examples
    --------
    Two sequences of 1 and 2 tokens, each attending only to itself:

    >>> import numpy as np
    >>> from fastattn import reference
    >>> q = k = np.zeros((1, 3, 2))
    >>> v = np.array([[[1.0], [2.0], [4.0]]])
    >>> print(reference.attention_varlen(q, k, v, [0, 1, 3])[0, :, 0])
    [1. 3. 3.]
    """
    q = _as_f64(q, "q")
    k = _as_f64(k, "k")
    v = _as_f64(v, "v")
    for name, a, what in (("q", q, "(Hq, total_q, Dk)"), ("k", k, "(Hkv, total_k, Dk)"),
                          ("v", v, "(Hkv, total_k, Dv)")):
        if a.ndim != 3:
            raise ValueError(f"{name} must be 3-D {what}, got shape {a.shape}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same head dimension Dk: q.shape={q.shape}, k.shape={k.shape}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of keys: k.shape={k.shape}, v.shape={v.shape}")
    _check_heads(q.shape[0], k.shape[0], v.shape[0], "q", "k", "v")
    cu_q = _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[1])
    if cu_seqlens_k is None:
        if k.shape[1] != q.shape[1]:
            raise ValueError(f"cu_seqlens_k=None (self-attention) needs as many keys as queries, got "
                             f"{k.shape[1]} keys and {q.shape[1]} queries")
        cu_k = cu_q
    else:
        cu_k = _check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[1])
    if cu_k.size != cu_q.size:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must count the same sequences, got "
                         f"{cu_q.size - 1} and {cu_k.size - 1}")
    _check_options(scale, causal, window, softcap, alibi_slopes, q.shape[2], q.shape[0])
    if sinks is not None:
        sinks = check_sinks(sinks, q.shape[:1])
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    lse = np.full(q.shape[:2], -np.inf) if sinks is None else np.repeat(sinks[:, None], q.shape[1], axis=1)
    for s in range(cu_q.size - 1):
        a, b = cu_q[s], cu_q[s + 1]
        if a == b:
            continue
        out[:, a:b], lse[:, a:b] = attention(
            q[:, a:b], k[:, cu_k[s]:cu_k[s + 1]], v[:, cu_k[s]:cu_k[s + 1]], scale=scale, causal=causal,
            window=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, return_lse=True)
    return (out, lse) if return_lse else out


def _paged_scale(scale, name, cache, cname):
    """A per-channel k_scale / v_scale of a paged cache must be the same for every
    block (the kernels fold it into the queries once per sequence)."""
    if scale is None:
        return
    s = np.asarray(scale)
    per_key = cache.shape[:3] + (1,)
    try:
        key_fit = s.ndim <= 4 and np.broadcast_shapes(s.shape, per_key) == per_key
    except ValueError:
        key_fit = False
    if not key_fit and s.ndim == 4 and s.shape[0] != 1 and cache.shape[0] > 1:
        raise ValueError(f"{name}: a per-channel scale of a paged {cname} must be the same for every block "
                         f"(shape (Hkv, 1, D) or (1, Hkv, 1, D)), got shape {s.shape}")


def attention_paged(q, k_cache, v_cache, block_table, seq_lens, *, cu_seqlens_q=None, scale=None, causal=False,
                    window=None, softcap=None, alibi_slopes=None, k_scale=None, v_scale=None, sinks=None,
                    return_lse=False):
    """Attention against paged key/value caches (block tables), in float64.

    The specification of :func:`fastattn.attention_paged`: each sequence's keys
    and values gathered from its blocks, then :func:`attention` per sequence.

    Parameters
    ----------
    q : array_like, shape (S, Hq, Lq, Dk), or (Hq, total_q, Dk) with cu_seqlens_q
        Each sequence's newest ``Lq`` tokens, or the queries of every sequence
        packed along axis 1.
    k_cache : array_like, shape (num_blocks, Hkv, block_size, Dk)
        The key cache: key ``j`` of sequence ``s`` is slot ``j % block_size``
        of block ``block_table[s, j // block_size]``.
    v_cache : array_like, shape (num_blocks, Hkv, block_size, Dv)
        The value cache, laid out like ``k_cache``.  Either cache may be float8
        or a :class:`fastattn.QuantizedKV` of that logical shape.
    block_table : array_like of int, shape (S, max_blocks)
        Each sequence's blocks; only those covering its ``seq_lens[s]`` keys are
        read (and must lie in ``[0, num_blocks)``).
    seq_lens : array_like of int, shape (S,)
        The number of keys of each sequence, in ``[n_q, max_blocks * block_size]``
        (``n_q`` its number of query rows).
    cu_seqlens_q : array_like of int, shape (S + 1,), optional
        With a packed ``q``: sequence ``s`` owns query rows
        ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]``.
    scale, causal, window, softcap : optional
        As for :func:`attention`, per sequence; ``causal="bottom_right"`` puts
        query ``i`` of a sequence with ``n`` query rows at position
        ``seq_lens[s] - n + i``.
    alibi_slopes : array_like, broadcastable to (Hq,), optional
        ALiBi slopes per query head.
    k_scale, v_scale : array_like, optional
        Scales of integer (int8) or float8 caches (QuantizedKV caches carry
        their own): broadcastable to
        ``k_cache.shape[:-1] + (1,)`` (per tensor, head or key) or to
        ``(Hkv, 1, Dk)`` (per channel, the same for every block).
    sinks : array_like, broadcastable to (Hq,), optional
        Attention sinks per query head, as for :func:`attention`.
    return_lse : bool, optional
        Also return each query row's log-sum-exp.

    Returns
    -------
    out : ndarray of float64
        ``q``'s shape with ``Dk`` replaced by ``Dv``; zeros for a sequence
        without keys.
    lse : ndarray of float64
        ``q``'s shape without its last axis; only with ``return_lse=True``.

    Raises
    ------
    TypeError
        Non-integer ``block_table``, ``seq_lens`` or ``cu_seqlens_q``; scales
        of a non-integer cache; options of the wrong type.
    ValueError
        Wrong ranks or mismatched shapes; ``block_size`` 0; block-table entries
        outside ``[0, num_blocks)``; ``seq_lens`` negative, beyond
        ``max_blocks * block_size`` or smaller than a sequence's query count;
        bad ``cu_seqlens_q``; bad option values.

    See Also
    --------
    fastattn.attention_paged : The compiled implementation.
    attention_varlen : Packed sequences with contiguous keys.

    Examples
    --------
    One sequence of 3 keys in blocks of 2 (its second block first in the cache):

    >>> import numpy as np
    >>> from fastattn import reference
    >>> k_cache = np.zeros((2, 1, 2, 1))
    >>> v_cache = np.array([[[[4.0], [9.0]]], [[[1.0], [2.0]]]])
    >>> q = np.zeros((1, 1, 1, 1))
    >>> print(reference.attention_paged(q, k_cache, v_cache, [[1, 0]], [3]).ravel())
    [2.33333333]
    """
    q = _as_f64(q, "q")
    k_raw, kc = _kv_input(k_cache, "k_cache")
    v_raw, vc = _kv_input(v_cache, "v_cache")
    for name, a in (("k_cache", kc), ("v_cache", vc)):
        if a.ndim != 4:
            raise ValueError(f"{name} must be 4-D (num_blocks, Hkv, block_size, D), got shape {a.shape}")
    if kc.shape[:3] != vc.shape[:3]:
        raise ValueError(f"k_cache and v_cache must have the same (num_blocks, Hkv, block_size), got "
                         f"{kc.shape[:3]} and {vc.shape[:3]}")
    num_blocks, hkv, bs = kc.shape[:3]
    if bs < 1:
        raise ValueError(f"block_size (axis 2 of k_cache) must be >= 1, got {bs}")
    packed = cu_seqlens_q is not None
    if q.ndim != (3 if packed else 4):
        raise ValueError("q must be " + ("3-D (Hq, total_q, Dk) with cu_seqlens_q" if packed
                                          else "4-D (S, Hq, Lq, Dk) without cu_seqlens_q") + f", got shape {q.shape}")
    hq = q.shape[-3]
    if q.shape[-1] != kc.shape[3]:
        raise ValueError(f"q and k_cache must have the same head dimension Dk: q.shape={q.shape}, "
                         f"k_cache.shape={kc.shape}")
    _check_heads(hq, hkv, vc.shape[1], "q", "k_cache", "v_cache")
    if packed:
        cu_q = _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[1])
        n_seq = cu_q.size - 1
    else:
        n_seq = q.shape[0]
        cu_q = np.arange(n_seq + 1, dtype=np.int64) * q.shape[2]
    table = _int_array(block_table, "block_table", 2, "(S, max_blocks)")
    lens = _int_array(seq_lens, "seq_lens", 1, "(S,)")
    if table.shape[0] != n_seq or lens.shape[0] != n_seq:
        raise ValueError(f"q has {n_seq} sequences, block_table {table.shape[0]} and seq_lens {lens.shape[0]}: "
                         f"they must agree")
    n_q = np.diff(cu_q)
    cap = table.shape[1] * bs
    for s in range(n_seq):
        if not n_q[s] <= lens[s] <= cap:
            raise ValueError(f"seq_lens[{s}] = {lens[s]} must lie in [{n_q[s]}, {cap}] (its query rows, "
                             f"max_blocks * block_size)")
        used = table[s, :-(-lens[s] // bs)]
        if used.size and (used.min() < 0 or used.max() >= num_blocks):
            raise ValueError(f"block_table[{s}] holds blocks outside [0, num_blocks={num_blocks}) among the "
                             f"{used.size} it uses")
    _paged_scale(k_scale, "k_scale", kc, "k_cache")
    _paged_scale(v_scale, "v_scale", vc, "v_cache")
    kc = _kv_scaled(kc, k_raw, k_scale, "k_scale", "k_cache")
    vc = _kv_scaled(vc, v_raw, v_scale, "v_scale", "v_cache")
    _check_options(scale, causal, window, softcap, alibi_slopes, q.shape[-1], hq)
    if sinks is not None:
        sinks = check_sinks(sinks, (hq,))
    qp = q if packed else np.moveaxis(q, 0, 1).reshape(hq, n_seq * q.shape[2], q.shape[-1])   # (Hq, total_q, Dk)
    out = np.zeros(qp.shape[:2] + (vc.shape[3],))
    lse = np.full(qp.shape[:2], -np.inf)
    for s in range(n_seq):
        a, b = cu_q[s], cu_q[s + 1]
        if a == b:
            continue
        blocks = table[s, :-(-lens[s] // bs)]
        ks = np.moveaxis(kc[blocks], 0, 1).reshape(hkv, blocks.size * bs, kc.shape[3])[:, :lens[s]]
        vs = np.moveaxis(vc[blocks], 0, 1).reshape(hkv, blocks.size * bs, vc.shape[3])[:, :lens[s]]
        out[:, a:b], lse[:, a:b] = attention(qp[:, a:b], ks, vs, scale=scale, causal=causal, window=window,
                                             softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                                             return_lse=True)
    if not packed:
        out = np.moveaxis(out.reshape(hq, n_seq, q.shape[2], out.shape[-1]), 1, 0)
        lse = np.moveaxis(lse.reshape(hq, n_seq, q.shape[2]), 1, 0)
    return (out, lse) if return_lse else out
