"""torch tensors in and out of fastattn, and attention as a ``torch.autograd.Function``.

:func:`fastattn.attention`, :func:`fastattn.softmax`, :func:`fastattn.log_softmax`
and :func:`fastattn.scaled_dot_product_attention` come here when an argument is
a torch tensor (this module, and torch, are imported only then).  CPU tensors
of float32, float64 and float16 are read in place through ``Tensor.numpy()``
(a view of the tensor's memory, with its strides: no copy), bfloat16 as an
``ml_dtypes.bfloat16`` view of the same memory, and the results
come back as tensors that share the result arrays' memory
(``torch.from_numpy``).  Tensors on another device raise ``TypeError``.

When gradients are needed (grad mode on and ``q``, ``k``, ``v``, ``bias`` or
``sinks`` requiring grad) attention runs as :class:`AttentionFunction`: fastattn's
forward with ``return_lse=True``, and :func:`fastattn.attention_backward` for
the backward.  Softmax and log-softmax have their backward in torch operations.

Examples
--------
>>> import torch, fastattn
>>> from fastattn.integrations.torch import attention
>>> q = torch.randn(1, 4, 8, 16, dtype=torch.float64, requires_grad=True)
>>> k = v = torch.randn(1, 4, 8, 16, dtype=torch.float64)
>>> out = attention(q, k, v, causal=True)
>>> out.shape, out.requires_grad
(torch.Size([1, 4, 8, 16]), True)
>>> torch.allclose(fastattn.attention(q.detach(), k, v, causal=True), out)
True
"""
import numpy as np
import torch

import fastattn     # fastattn.attention_backward (issue 25), looked up when a backward runs
from .. import _api, _sdpa

__all__ = ["attention", "scaled_dot_product_attention", "softmax", "log_softmax", "AttentionFunction"]

# the attention keywords that the backward needs as the forward had them
_BACKWARD_OPTIONS = ("scale", "causal", "mask", "window", "kv_lengths", "kv_start", "align", "softcap",
                     "alibi_slopes", "k_scale", "v_scale", "num_threads")


def _tensor_to_array(t, name):
    """A NumPy view of the CPU tensor ``t`` (detached, same memory and strides);
    any other value is returned as it is."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type != "cpu":
        raise TypeError(f"{name}: fastattn computes on the CPU, got a tensor on device '{t.device}' "
                        f"(move it with {name}.cpu())")
    if t.layout != torch.strided:
        raise TypeError(f"{name}: only dense (strided) tensors are supported, got layout {t.layout}")
    if t.dtype == torch.bfloat16:
        # bfloat16: the tensor's memory viewed as NumPy's bfloat16 dtype (ml_dtypes,
        # which fastattn recognises by the dtype itself): no copy
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(f"{name}: bfloat16 tensors need the ml_dtypes package for a NumPy view of their "
                            f"memory (pip install ml_dtypes); or convert with {name}.float()") from None
        return t.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    try:
        return t.detach().numpy()
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"{name}: a tensor of dtype {t.dtype} cannot be read by fastattn ({e})") from None


def _array_to_tensor(a):
    """A tensor sharing the memory of the ndarray ``a`` (a bfloat16 array, whose
    dtype NumPy knows from ml_dtypes, becomes a torch.bfloat16 tensor)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _wrap(result, out_tensor):
    """fastattn's result (an array or a tuple of arrays) as tensors; the first part
    is ``out_tensor`` itself when the caller passed one."""
    parts = result if isinstance(result, tuple) else (result,)
    first = out_tensor if out_tensor is not None else _array_to_tensor(parts[0])
    wrapped = (first,) + tuple(_array_to_tensor(p) for p in parts[1:])
    return wrapped if isinstance(result, tuple) else first


def _check_out(out):
    if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
        raise TypeError("out: fastattn writes out= in place, which autograd cannot record; "
                        "pass a tensor that does not require grad")


# ---------------------------------------------------------------- attention

def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def attention(q, k, v, **options):
    """Compute :func:`fastattn.attention` on torch tensors, differentiably.

    Takes the arguments and options of :func:`fastattn.attention`; any of them
    may be a CPU tensor (or a NumPy array, or a plain value).  Tensors are read
    in place through ``Tensor.numpy()`` (a view with the tensor's strides, no
    copy), bfloat16 ones as an ``ml_dtypes.bfloat16`` view of the same memory.
    The results are tensors sharing memory with fastattn's result arrays
    (``torch.from_numpy``).  When grad mode is on and ``q``, ``k``, ``v``,
    ``bias`` or ``sinks`` is a tensor that requires grad, the call runs through
    ``AttentionFunction``, a ``torch.autograd.Function``: fastattn's forward with
    ``return_lse=True``, and :func:`fastattn.attention_backward` for the
    backward, which gives the gradients of ``q``, ``k``, ``v``, ``bias`` and
    ``sinks`` (summed back over broadcast dims: ``sinks.grad`` has the shape
    of ``sinks``).  The backward is not differentiable
    itself (once differentiable).  Otherwise no autograd graph is recorded.

    Parameters
    ----------
    q : torch.Tensor or array_like, shape (..., Lq, Dk)
        Queries, as :func:`fastattn.attention`.
    k : torch.Tensor or array_like, shape (..., Lk, Dk)
        Keys, as :func:`fastattn.attention`.
    v : torch.Tensor or array_like, shape (..., Lk, Dv)
        Values, as :func:`fastattn.attention`.
    **options
        The keyword options of :func:`fastattn.attention` (``scale``,
        ``causal``, ``mask``, ``bias``, ...), each a CPU tensor, a NumPy array
        or a plain value.  ``out`` may be a tensor of the output's shape and
        dtype: it is written in place and returned.  When a gradient is
        needed, the options other than ``bias``, ``sinks``, ``return_weights`` and
        ``return_lse`` that are given (not None) must be ones that
        :func:`fastattn.attention_backward` takes: ``out`` then raises
        TypeError.  Scaled int8 / float8 and :class:`fastattn.QuantizedKV`
        ``k`` / ``v`` take no gradient themselves; ``q`` (and a float ``k`` or
        ``v`` beside them) get theirs.

    Returns
    -------
    out : torch.Tensor, shape (..., Lq, Dv)
        The attention output, in fastattn's output dtype (the ``out`` tensor
        itself when one was given); the whole result when neither
        ``return_weights`` nor ``return_lse`` is set, else the first item of
        the tuple ``(out, weights, lse)`` holding the parts asked for, in that
        order.  When a gradient is needed, it requires grad.
    weights : torch.Tensor, shape (..., Lq, Lk)
        Only with ``return_weights=True``: the weights.  No gradient flows
        through them.
    lse : torch.Tensor, shape (..., Lq)
        Only with ``return_lse=True``: each row's log-sum-exp.  No gradient
        flows through it.

    Raises
    ------
    TypeError
        A tensor on a device other than the CPU, a tensor that is not dense
        (strided), one whose dtype ``Tensor.numpy()`` cannot read, or a
        bfloat16 tensor without ml_dtypes installed; an ``out`` tensor that
        requires grad while grad mode is on.  When a gradient is needed:
        ``out``, an ``alibi_slopes`` tensor that requires grad (slopes take no
        gradient), or an option :func:`fastattn.attention_backward` does not
        take.  And the TypeErrors of :func:`fastattn.attention`.
    ValueError
        As :func:`fastattn.attention`.

    See Also
    --------
    fastattn.attention : The NumPy function this wraps.
    fastattn.attention_backward : The gradients the backward computes.
    fastattn.integrations.transformers.attention_forward : The transformers backend built on this.

    Examples
    --------
    >>> import torch
    >>> from fastattn.integrations.torch import attention
    >>> q = torch.randn(2, 8, 32, 64, requires_grad=True)
    >>> k = torch.randn(2, 2, 32, 64, requires_grad=True)
    >>> v = torch.randn(2, 2, 32, 64, requires_grad=True)
    >>> attention(q, k, v, causal=True).square().sum().backward()
    >>> k.grad.shape
    torch.Size([2, 2, 32, 64])

    Without a gradient, the output can be written into a tensor:

    >>> out = torch.empty(2, 8, 32, 64)
    >>> with torch.no_grad():
    ...     result = attention(q, k, v, causal=True, out=out)
    >>> result is out
    True
    """
    bias = options.get("bias")
    if _needs_grad(q, k, v, bias, options.get("sinks")):
        return _attention_with_grad(q, k, v, options)
    _check_out(options.get("out"))
    out_tensor = options.get("out") if isinstance(options.get("out"), torch.Tensor) else None
    arrays = {name: _tensor_to_array(value, name) for name, value in options.items()}
    result = _api.attention(_tensor_to_array(q, "q"), _tensor_to_array(k, "k"), _tensor_to_array(v, "v"),
                            **arrays)
    return _wrap(result, out_tensor)


def _attention_with_grad(q, k, v, options):
    options = dict(options)
    if options.pop("out", None) is not None:
        raise TypeError("out: fastattn writes out= in place, which autograd cannot record; "
                        "leave out=None when gradients are needed")
    slopes = options.get("alibi_slopes")
    if isinstance(slopes, torch.Tensor) and slopes.requires_grad:
        raise TypeError("alibi_slopes: fastattn computes no gradient for ALiBi slopes; "
                        "pass alibi_slopes.detach()")
    return_weights = bool(options.pop("return_weights", False))
    return_lse = bool(options.pop("return_lse", False))
    bias = options.pop("bias", None)
    sinks = options.pop("sinks", None)
    # options left at None are the defaults: only the ones given must be the backward's
    fixed = {name: _tensor_to_array(value, name) for name, value in options.items() if value is not None}
    unknown = sorted(set(fixed) - set(_BACKWARD_OPTIONS))
    if unknown:
        raise TypeError(f"attention() got an unexpected keyword argument {unknown[0]!r} (or one that "
                        f"fastattn.attention_backward does not take, with gradients needed)")
    out, lse, weights = AttentionFunction.apply(q, k, v, bias, fixed, return_weights, sinks)
    parts = (out,) + ((weights,) if return_weights else ()) + ((lse,) if return_lse else ())
    return parts if len(parts) > 1 else out


class AttentionFunction(torch.autograd.Function):
    """fastattn's attention as an autograd Function.

    ``AttentionFunction.apply(q, k, v, bias, options, return_weights[, sinks])``
    returns ``(out, lse, weights)`` (``weights`` None unless asked for);
    ``options`` holds fastattn.attention's other keywords (mask, causal,
    window, ...) as NumPy arrays or plain values.  Gradients flow to ``q``,
    ``k``, ``v``, ``bias`` and ``sinks`` (``fastattn.attention_backward`` with
    ``return_dbias`` / ``return_dsinks`` when they need one); ``lse`` and
    ``weights`` are constants.  Once differentiable.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, options, return_weights, sinks=None):
        inputs = (q, k, v, bias, sinks)
        arrays = [_tensor_to_array(x, name) for x, name in zip(inputs, ("q", "k", "v", "bias", "sinks"))]
        result = _api.attention(*arrays[:3], bias=arrays[3], sinks=arrays[4], return_lse=True,
                                return_weights=return_weights, **options)
        out, lse = _array_to_tensor(result[0]), _array_to_tensor(result[-1])
        weights = _array_to_tensor(result[1]) if return_weights else None
        # tensors through save_for_backward (autograd then notices in-place changes
        # before the backward); NumPy inputs are kept as they are
        ctx.save_for_backward(*(x if isinstance(x, torch.Tensor) else None for x in inputs), out, lse)
        ctx.arrays = [None if isinstance(x, torch.Tensor) else a for x, a in zip(inputs, arrays)]
        ctx.options = options
        ctx.mark_non_differentiable(lse, *((weights,) if weights is not None else ()))
        return out, lse, weights

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_lse, grad_weights):
        *saved, out, lse = ctx.saved_tensors
        names = ("q", "k", "v", "bias", "sinks")
        q, k, v, bias, sinks = (a if t is None else _tensor_to_array(t, n)
                                for t, a, n in zip(saved, ctx.arrays, names))
        n_in = len(ctx.needs_input_grad)          # 6 inputs, or 7 with sinks
        want_dbias = bias is not None and ctx.needs_input_grad[3]
        want_dsinks = sinks is not None and n_in > 6 and ctx.needs_input_grad[6]
        grads = fastattn.attention_backward(
            _tensor_to_array(grad_out, "grad_out"), q, k, v, _tensor_to_array(out, "out"),
            _tensor_to_array(lse, "lse"), bias=bias, sinks=sinks, return_dbias=want_dbias,
            return_dsinks=want_dsinks, **ctx.options)
        tensors = [_array_to_tensor(np.asarray(g)) if need else None
                   for g, need in zip(grads, ctx.needs_input_grad[:3])]
        tensors.append(_array_to_tensor(np.asarray(grads[3])) if want_dbias else None)
        tensors += [None, None]
        if n_in > 6:
            tensors.append(_array_to_tensor(np.asarray(grads[-1])) if want_dsinks else None)
        return tuple(tensors)


# ---------------------------------------------------------------- scaled_dot_product_attention

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 *, scale=None, enable_gqa=False):
    """Compute torch's ``scaled_dot_product_attention`` with fastattn, on tensors.

    A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on CPU
    tensors: the arguments mean what they mean there (a boolean ``attn_mask``
    is ``True`` where a query may attend, a float one is added to the scores),
    and the call is :func:`attention` with the matching fastattn options, so
    it is differentiable the same way.

    Parameters
    ----------
    query : torch.Tensor, shape (..., Hq, Lq, Dk)
        Queries.
    key : torch.Tensor, shape (..., Hkv, Lk, Dk)
        Keys.
    value : torch.Tensor, shape (..., Hkv, Lk, Dv)
        Values.
    attn_mask : torch.Tensor or array_like, optional
        Boolean (``True`` = may attend) or float (added to the scores) mask,
        broadcastable to ``(..., Hq, Lq, Lk)``.
    dropout_p : float, default 0.0
        Must be 0: fastattn has no dropout.
    is_causal : bool, default False
        Query ``i`` sees keys ``j <= i`` (top-left aligned, as torch).
    scale : float, optional
        Score scale; default ``1 / sqrt(Dk)``.
    enable_gqa : bool, default False
        Allow ``Hq`` to be a multiple of ``Hkv`` (grouped-query heads).

    Returns
    -------
    torch.Tensor, shape (..., Hq, Lq, Dv)
        The attention output (it requires grad when an input does).

    Raises
    ------
    ValueError
        ``dropout_p`` other than 0, ``attn_mask`` together with ``is_causal``,
        grouped heads without ``enable_gqa``, and the shape errors of
        :func:`fastattn.attention`.
    TypeError
        As :func:`attention`.

    See Also
    --------
    fastattn.scaled_dot_product_attention : The same on NumPy arrays.

    Examples
    --------
    >>> import torch
    >>> from fastattn.integrations.torch import scaled_dot_product_attention
    >>> q, k, v = (torch.randn(1, 4, 16, 32) for _ in range(3))
    >>> ours = scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> bool(torch.allclose(ours, theirs, atol=1e-6))
    True
    """
    if isinstance(attn_mask, torch.Tensor):
        if attn_mask.dtype == torch.bool:
            kind = "b"
        else:
            kind = "f" if attn_mask.is_floating_point() else str(attn_mask.dtype)
    else:
        attn_mask, kind = _sdpa.mask_and_kind(attn_mask)
    options = _sdpa.sdpa_options(np.shape(query), np.shape(key), np.shape(value), attn_mask, kind,
                                 dropout_p, is_causal, scale, enable_gqa)
    return attention(query, key, value, **options)


# ---------------------------------------------------------------- softmax

class _SoftmaxFunction(torch.autograd.Function):
    """fastattn's softmax (or log-softmax) forward; the backward in torch operations
    on the saved result, so it is differentiable again."""

    @staticmethod
    def forward(ctx, x, axis, log_mode, num_threads):
        f = _api.log_softmax if log_mode else _api.softmax
        y = _array_to_tensor(f(_tensor_to_array(x, "x"), axis, num_threads=num_threads))
        ctx.save_for_backward(y)
        ctx.axis, ctx.log_mode = axis, log_mode
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        dims = {} if ctx.axis is None else {"dim": ctx.axis, "keepdim": True}
        if ctx.log_mode:
            return g - y.exp() * g.sum(**dims), None, None, None
        return y * (g - (g * y).sum(**dims)), None, None, None


def _softmax(x, axis, out, num_threads, log_mode):
    if _needs_grad(x):
        if out is not None:
            raise TypeError("out: fastattn writes out= in place, which autograd cannot record; "
                            "leave out=None when gradients are needed")
        return _SoftmaxFunction.apply(x, axis, log_mode, num_threads)
    _check_out(out)
    f = _api.log_softmax if log_mode else _api.softmax
    result = f(_tensor_to_array(x, "x"), axis, out=_tensor_to_array(out, "out"), num_threads=num_threads)
    return _wrap(result, out if isinstance(out, torch.Tensor) else None)


_SOFTMAX_DOC = """:func:`fastattn.{fn}` on torch tensors, differentiably.

    The {what} of ``x`` along ``axis``, computed by fastattn's kernels on the
    tensor's memory (no copy); when grad mode is on and ``x`` requires grad, the
    result does too (the backward is written in torch operations on the saved
    result, so it is differentiable again).

    Parameters
    ----------
    x : torch.Tensor or array_like
        Input; a CPU tensor (float32, float64, float16 or bfloat16) or anything
        :func:`fastattn.{fn}` takes.
    axis : int or None, default -1
        The axis to normalise along; None for the whole array.
    out : torch.Tensor, optional
        Written in place and returned (of the result's shape and dtype); not
        allowed when a gradient is needed.
    num_threads : int, optional
        Threads for this call (see :func:`fastattn.set_num_threads`).

    Returns
    -------
    torch.Tensor
        The {what}, of ``x``'s shape and dtype (``out`` itself when given).

    Raises
    ------
    TypeError
        ``out`` given while a gradient is needed, a tensor that is not on the
        CPU or not dense, and the TypeErrors of :func:`fastattn.{fn}`.
    ValueError
        As :func:`fastattn.{fn}` (an axis out of range).

    See Also
    --------
    fastattn.{fn} : The same on NumPy arrays.

    Examples
    --------
    >>> import torch
    >>> from fastattn.integrations.torch import {fn}
    >>> x = torch.randn(4, 10, requires_grad=True)
    >>> y = {fn}(x, axis=-1)
    >>> bool(torch.allclose(y, torch.{fn}(x, dim=-1), atol=1e-6))
    True
    >>> y.sum().backward()
    >>> x.grad.shape
    torch.Size([4, 10])
    """


def softmax(x, axis=-1, *, out=None, num_threads=None):
    return _softmax(x, axis, out, num_threads, False)


def log_softmax(x, axis=-1, *, out=None, num_threads=None):
    return _softmax(x, axis, out, num_threads, True)


softmax.__doc__ = _SOFTMAX_DOC.format(fn="softmax", what="softmax")
log_softmax.__doc__ = _SOFTMAX_DOC.format(fn="log_softmax", what="log-softmax")
