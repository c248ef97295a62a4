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

__all__ = ["softmax", "log_softmax", "attention", "merge_attention"]

_CAUSAL_MODES = ("top_left", "bottom_right")


# --------------------------------------------------------------------------- helpers
def _as_f64(x, name):
    """Convert a real numeric / bool array-like to float64; TypeError otherwise."""
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
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
    """Softmax of ``x`` along ``axis`` (an int, negative allowed, or None = whole array).

    An all ``-inf`` slice gives zeros; a slice containing ``+inf``/``NaN`` gives NaN.
    """

    def fn(a):
        return _softmax_lse_lastaxis(a)[0]

    return _rowwise(x, axis, fn)


def log_softmax(x, axis=-1):
    """Log-softmax of ``x`` along ``axis``.

    An all ``-inf`` slice stays all ``-inf``; a slice containing ``+inf``/``NaN`` gives NaN.
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
def attention(q, k, v, *, scale=None, causal=False, mask=None, bias=None, window=None,
              kv_lengths=None, softcap=None, alibi_slopes=None,
              return_weights=False, return_lse=False):
    """Exact scaled dot-product attention (reference, float64).

    Shapes: ``q (..., Lq, Dk)``, ``k (..., Lk, Dk)``, ``v (..., Lk, Dv)``; leading
    (batch) dims broadcast by NumPy rules; output ``(..., Lq, Dv)``.  See the module
    docstring and the project README for the meaning of every option.

    Returns ``out``, or a tuple ``(out, weights, lse)`` restricted to the parts
    requested with ``return_weights`` / ``return_lse`` (in that order).
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
        raise ValueError(
            f"q and k must have the same head dimension Dk (last axis): "
            f"q.shape={q.shape}, k.shape={k.shape}"
        )
    if Lv != Lk:
        raise ValueError(
            f"k and v must have the same number of keys Lk (axis -2): "
            f"k.shape={k.shape}, v.shape={v.shape}"
        )

    # Grouped-query / multi-query heads: query head h uses kv head h // g.
    if q.ndim >= 3 and k.ndim >= 3 and v.ndim >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk == hv and hk > 0 and hq != hk and hq % hk == 0:
            g = hq // hk
            k = np.repeat(k, g, axis=-3)
            v = np.repeat(v, g, axis=-3)

    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"batch dimensions of q, k, v are not broadcastable: "
            f"q.shape={q.shape}, k.shape={k.shape}, v.shape={v.shape}"
        ) from None
    full = batch + (Lq, Lk)

    scale = _check_scale(scale, Dk)
    mode = _check_causal(causal)
    left, right = _check_window(window)
    softcap = _check_softcap(softcap)

    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
        mask = _broadcast_arg(mask, full, "mask", "(..., Lq, Lk) =")
    if bias is not None:
        bias = _as_f64(bias, "bias")
        bias = _broadcast_arg(bias, full, "bias", "(..., Lq, Lk) =")
    if kv_lengths is not None:
        lens = np.asarray(kv_lengths)
        if lens.dtype.kind not in "iu":
            raise TypeError(f"kv_lengths must be an integer array, got dtype {lens.dtype}")
        lens = _broadcast_arg(lens, batch, "kv_lengths", "the batch dims")
        if lens.size and (lens.min() < 0 or lens.max() > Lk):
            raise ValueError(
                f"kv_lengths must satisfy 0 <= length <= Lk={Lk}; got values in "
                f"[{lens.min()}, {lens.max()}]"
            )
        lk_eff = lens.astype(np.int64)[..., None, None]  # batch + (1, 1)
    else:
        lk_eff = np.full(batch + (1, 1), Lk, dtype=np.int64)
    if alibi_slopes is not None:
        slopes = _as_f64(alibi_slopes, "alibi_slopes")
        slopes = _broadcast_arg(slopes, batch, "alibi_slopes", "the batch dims")[..., None, None]

    i = np.arange(Lq, dtype=np.int64)[:, None]
    j = np.arange(Lk, dtype=np.int64)[None, :]
    if mode == "bottom_right":
        pos = i + lk_eff - Lq  # batch + (Lq, 1)
    else:
        pos = np.broadcast_to(i, batch + (Lq, 1))

    visible = np.broadcast_to(j < lk_eff, full)
    if mode is not None:
        visible = visible & (j <= pos)
    if left is not None:
        visible = visible & (j >= pos - left)
    if right is not None:
        visible = visible & (j <= pos + right)
    if mask is not None:
        visible = visible & mask
    visible = np.broadcast_to(visible, full)

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
def merge_attention(outs, lses):
    """Combine attention results computed over disjoint key sets.

    ``outs``: sequence of ``(..., Lq, Dv)`` arrays; ``lses``: matching sequence of
    ``(..., Lq)`` log-sum-exps.  Returns ``(out, lse)`` with
    ``lse = logaddexp(lse_1, ..., lse_n)`` and ``out = sum_i exp(lse_i - lse) * out_i``.
    Rows where every part is empty (lse -inf) give out 0 and lse -inf.
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
                       bias=None, window=None, kv_lengths=None, softcap=None,
                       alibi_slopes=None, return_dbias=False):
    """Gradients of :func:`attention` (reference, float64, materialised scores).

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
    their key/value head.

    Returns ``(dq, dk, dv)`` in the shapes of q, k, v, or ``(dq, dk, dv, dbias)``
    with ``return_dbias=True`` (dbias in bias's shape).
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
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape

    # grouped-query / multi-query heads, as in attention()
    g = 1
    if q.ndim >= 3 and k.ndim >= 3 and v.ndim >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk == hv and hk > 0 and hq != hk and hq % hk == 0:
            g = hq // hk
            k = np.repeat(k, g, axis=-3)
            v = np.repeat(v, g, axis=-3)
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(f"batch dimensions of q, k, v are not broadcastable: "
                         f"q.shape={q_shape}, k.shape={k_shape}, v.shape={v_shape}") from None
    full = batch + (Lq, Lk)
    grad_out = _check_grad_operand(grad_out, "grad_out", batch + (Lq, Dv))
    out = _check_grad_operand(out, "out", batch + (Lq, Dv))
    lse = _check_grad_operand(lse, "lse", batch + (Lq,))

    scale = _check_scale(scale, Dk)
    mode = _check_causal(causal)
    left, right = _check_window(window)
    softcap = _check_softcap(softcap)
    bias_shape = None
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
        mask = _broadcast_arg(mask, full, "mask", "(..., Lq, Lk) =")
    if bias is not None:
        bias = _as_f64(bias, "bias")
        bias_shape = bias.shape
        bias = _broadcast_arg(bias, full, "bias", "(..., Lq, Lk) =")
    if kv_lengths is not None:
        lens = np.asarray(kv_lengths)
        if lens.dtype.kind not in "iu":
            raise TypeError(f"kv_lengths must be an integer array, got dtype {lens.dtype}")
        lens = _broadcast_arg(lens, batch, "kv_lengths", "the batch dims")
        if lens.size and (lens.min() < 0 or lens.max() > Lk):
            raise ValueError(f"kv_lengths must satisfy 0 <= length <= Lk={Lk}; got values in "
                             f"[{lens.min()}, {lens.max()}]")
        lk_eff = lens.astype(np.int64)[..., None, None]
    else:
        lk_eff = np.full(batch + (1, 1), Lk, dtype=np.int64)
    if alibi_slopes is not None:
        slopes = _as_f64(alibi_slopes, "alibi_slopes")
        slopes = _broadcast_arg(slopes, batch, "alibi_slopes", "the batch dims")[..., None, None]

    i = np.arange(Lq, dtype=np.int64)[:, None]
    j = np.arange(Lk, dtype=np.int64)[None, :]
    pos = i + lk_eff - Lq if mode == "bottom_right" else np.broadcast_to(i, batch + (Lq, 1))
    visible = np.broadcast_to(j < lk_eff, full)
    if mode is not None:
        visible = visible & (j <= pos)
    if left is not None:
        visible = visible & (j >= pos - left)
    if right is not None:
        visible = visible & (j <= pos + right)
    if mask is not None:
        visible = visible & mask
    visible = np.broadcast_to(visible, full)

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
    return res
