"""attention_backward: argument checking, dtype promotion, outputs, reductions.

The steps below are kept apart so that they can be folded into the one
compiled argument path: (1) q, k, v and their batch layout (grouped heads
folded into the query rows, as attention() does), (2) the options, (3) the
forward's results grad_out, out and lse, (4) the gradient buffers, (5) the
kernel call (``attention_backward_run`` in the kernel module), (6) sums over
broadcast dims and casts back to the inputs' dtypes.
"""
import math

import numpy as np

from . import _dispatch
from ._api import (_as_array, _batch_table, _broadcast, _check_real, _dtypes, _parse_causal,
                   _parse_window, _score_operand, _to_compute)
from ._threads import _check_num_threads as check_num_threads
from .reference import _sum_to_shape

_K = _dispatch.kernels

__all__ = ["attention_backward"]


def _qkv_layout(q, k, v):
    """Step 1: (q, k, v, g, bshape, bshape_q) as attention() lays them out."""
    q = _as_array(q, "q")
    k = _as_array(k, "k")
    v = _as_array(v, "v")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., L, D), got shape {a.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension Dk: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys Lk: k {k.shape}, v {v.shape}")
    qb, kb, vb = q.shape[:-2], k.shape[:-2], v.shape[:-2]
    kvb = _broadcast((kb, vb), ("k", "v"))
    g = 1
    if (len(qb) >= 1 and len(kb) >= 1 and len(vb) >= 1 and kb[-1] == vb[-1]
            and 0 < kvb[-1] < qb[-1] and qb[-1] % kvb[-1] == 0):
        g = qb[-1] // kvb[-1]
    if g > 1:
        bshape = _broadcast((qb[:-1] + (kvb[-1],), kb, vb), ("q (heads grouped)", "k", "v"))
        bshape_q = bshape[:-1] + (qb[-1],)
    else:
        bshape = _broadcast((qb, kb, vb), ("q", "k", "v"))
        bshape_q = bshape
    return q, k, v, g, bshape, bshape_q


def _options(cdt, Dk, Lk, score_shape, bshape_q, scale, causal, mask, bias, window, kv_lengths,
             softcap, alibi_slopes):
    """Step 2: the options in the kernel's terms, checked as attention() checks them."""
    causal_code = _parse_causal(causal)
    wl, wr = _parse_window(window)
    if scale is None:
        scale = 1.0 / math.sqrt(Dk) if Dk > 0 else 1.0
    else:
        scale = _check_real(scale, "scale")
    if softcap is None:
        softcap = 0.0
    else:
        softcap = _check_real(softcap, "softcap")
        if softcap <= 0:
            raise ValueError(f"softcap must be > 0, got {softcap}")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
        mask = _score_operand(mask, "mask", score_shape)
    if bias is not None:
        bias = _to_compute(_score_operand(bias, "bias", score_shape), cdt)
    nbatch_g = math.prod(bshape_q)
    kvlen = None
    if kv_lengths is not None:
        kl = np.asarray(kv_lengths)
        if kl.dtype.kind not in "iu":
            raise TypeError(f"kv_lengths must be an integer array, got dtype {kl.dtype}")
        kvlen = _batch_table(kl, "kv_lengths", bshape_q, nbatch_g, np.int64)
        lo, hi = _K.int64_range(kvlen) if kvlen.size else (0, 0)
        if lo < 0 or hi > Lk:
            raise ValueError(f"kv_lengths must lie in [0, Lk={Lk}], got values in [{lo}, {hi}]")
    slopes = None
    if alibi_slopes is not None:
        slopes = _batch_table(_as_array(alibi_slopes, "alibi_slopes"), "alibi_slopes", bshape_q,
                              nbatch_g, cdt)
    return causal_code, wl, wr, scale, softcap, mask, bias, kvlen, slopes


def _forward_result(x, name, shape, dtype, cdt):
    """Step 3: grad_out / out / lse, which must have the shape and dtype that
    attention() returns for these inputs; in the compute dtype."""
    x = _as_array(x, name)
    if x.shape != tuple(shape):
        raise ValueError(f"{name} has shape {x.shape}, expected {tuple(shape)} (what attention() "
                         f"returns for these q, k, v)")
    if x.dtype != dtype:
        raise TypeError(f"{name} has dtype {x.dtype}, expected {dtype} (what attention() returns "
                        f"for these q, k, v)")
    return _to_compute(x, cdt)


def _grad_dtype(a, odt):
    """A gradient takes its input's dtype; integer and boolean inputs the output's."""
    return a.dtype if a.dtype.kind == "f" else odt


def _finish(grad, shape, dtype):
    """Step 6: a gradient in the broadcast batch shape, summed back to its
    input's shape and cast to its dtype."""
    if grad.shape != tuple(shape):
        grad = _sum_to_shape(grad, tuple(shape))
    return grad if grad.dtype == dtype else grad.astype(dtype)


def attention_backward(grad_out, q, k, v, out, lse, *, scale=None, causal=False, mask=None, bias=None,
                       window=None, kv_lengths=None, softcap=None, alibi_slopes=None,
                       return_dbias=False, num_threads=None):
    """Gradients of :func:`attention` with respect to q, k, v (and bias).

    The FlashAttention-2 backward: the probabilities are recomputed from the
    forward's ``lse`` tile by tile (nothing of size Lq x Lk is stored), the work
    is spread over blocks of keys, so one long head fills every core, and the
    result is bit-identical for any ``num_threads``.

    Parameters
    ----------
    grad_out : array_like, shape (..., Hq, Lq, Dv)
        Gradient of the loss with respect to ``out``; the shape and dtype of ``out``.
    q, k, v : array_like
        The forward's inputs, as given to :func:`attention`.
    out, lse : array_like
        The forward's results: ``out, lse = attention(q, k, v, ..., return_lse=True)``
        with the same options.
    scale, causal, mask, bias, window, kv_lengths, softcap, alibi_slopes
        The options of the forward call, with their meaning there.  softcap's
        ``tanh`` enters the chain rule; masks, ``kv_lengths`` and ALiBi slopes
        take no gradient.
    return_dbias : bool, optional
        Also return the gradient of ``bias`` (which must then be given).
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).

    Returns
    -------
    dq, dk, dv : ndarray
        In the shapes of q, k, v and their dtypes (integer inputs: the output's
        dtype).  Gradients of broadcast batch dims are summed back to the input's
        shape; with grouped heads (GQA/MQA) dk and dv sum over the query heads of
        their group.
    dbias : ndarray
        Only with ``return_dbias=True``: in bias's shape, summed over the dims
        along which bias was broadcast.

    Raises
    ------
    ValueError
        Shapes that attention() rejects, ``grad_out``, ``out`` or ``lse`` of another
        shape than attention() returns, ``return_dbias`` without a bias, invalid
        options.
    TypeError
        Non-numeric inputs, ``grad_out``, ``out`` or ``lse`` of another dtype than
        attention() returns, options of the wrong type.

    Notes
    -----
    A (query, key) pair whose score is -inf -- invisible under causal, window,
    mask or kv_lengths, or given a -inf bias -- contributes nothing to any
    gradient, even when its key, value, query or output-gradient row holds inf
    or NaN; a query row that sees no key gets zero gradients.  NaN and inf
    elsewhere propagate.  Inputs broadcast along a batch dim (shared keys, say)
    have their gradient computed in the broadcast shape and then summed, which
    takes a temporary of that shape; a broadcast bias is summed inside the
    kernel.  ``fastattn.reference.attention_backward`` is the specification.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 16, 8), dtype=np.float32) for _ in range(3))
    >>> out, lse = fastattn.attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = fastattn.attention_backward(np.ones_like(out), q, k, v, out, lse, causal=True)
    >>> dq.shape, dk.dtype
    ((1, 2, 16, 8), dtype('float32'))
    """
    q, k, v, g, bshape, bshape_q = _qkv_layout(q, k, v)
    if num_threads is not None:
        check_num_threads(num_threads)
    cdt, odt = _dtypes(q, k, v)
    Lq, Dk = q.shape[-2:]
    Lk, Dv = v.shape[-2:]
    if not isinstance(return_dbias, (bool, np.bool_)):
        raise TypeError(f"return_dbias must be True or False, got {return_dbias!r}")
    return_dbias = bool(return_dbias)
    if return_dbias and bias is None:
        raise ValueError("return_dbias=True needs a bias")
    bias_in = None if bias is None else _as_array(bias, "bias")
    causal_code, wl, wr, scale, softcap, mask, bias, kvlen, slopes = _options(
        cdt, Dk, Lk, bshape_q + (Lq, Lk), bshape_q, scale, causal, mask, bias_in, window, kv_lengths,
        softcap, alibi_slopes)
    dout = _forward_result(grad_out, "grad_out", bshape_q + (Lq, Dv), odt, cdt)
    outc = _forward_result(out, "out", bshape_q + (Lq, Dv), odt, cdt)
    lsec = _forward_result(lse, "lse", bshape_q + (Lq,), cdt, cdt)

    # step 4: gradients in the broadcast shape (the inputs' own when nothing is broadcast)
    empty = Lq == 0 or math.prod(bshape) == 0
    alloc = np.zeros if empty else np.empty
    dq = alloc(bshape_q + (Lq, Dk), dtype=cdt)
    dk = alloc(bshape + (Lk, Dk), dtype=cdt)
    dv = alloc(bshape + (Lk, Dv), dtype=cdt)
    dbias = np.zeros(bias.shape, dtype=cdt) if return_dbias else None
    if not empty:
        _K.attention_backward_run(dout, _to_compute(q, cdt), _to_compute(k, cdt), _to_compute(v, cdt),
                                  outc, lsec, dq, dk, dv, dbias, tuple(bshape), g, scale, causal_code,
                                  wl, wr, softcap, mask, bias, kvlen, slopes, num_threads)
    res = (_finish(dq, q.shape, _grad_dtype(q, odt)), _finish(dk, k.shape, _grad_dtype(k, odt)),
           _finish(dv, v.shape, _grad_dtype(v, odt)))
    if return_dbias:
        res += (_finish(dbias, bias_in.shape, _grad_dtype(bias_in, odt)),)
    return res
