"""Softmax and log-softmax of the reference (pure NumPy, float64).

Part of :mod:`fastattn.reference` (the specification): :func:`softmax`,
:func:`log_softmax`, and the row softmax with log-sum-exp that the attention
reference is built on.  An all ``-inf`` row gives weights 0 and lse ``-inf``; a
row containing ``+inf`` or NaN gives NaN; no floating-point warnings.
"""
from __future__ import annotations

import numpy as np

from ._reference_checks import _as_f64, _normalize_axis


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
