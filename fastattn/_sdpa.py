"""``fastattn.scaled_dot_product_attention``: torch's signature and semantics on top
of :func:`fastattn.attention`.

The translation of torch's arguments into fastattn's options lives in
:func:`sdpa_options`, shared by the NumPy entry point here and the torch one in
:mod:`fastattn.integrations.torch` (which converts tensors, and takes the
autograd path for tensors that require grad).
"""
import numbers

import numpy as np

from ._api import attention
from .integrations import any_torch_tensor

__all__ = ["scaled_dot_product_attention"]


def _heads(shape):
    return shape[-3] if len(shape) >= 3 else None


def sdpa_options(query_shape, key_shape, value_shape, attn_mask, mask_kind, dropout_p, is_causal,
                 scale, enable_gqa):
    """fastattn.attention's keyword options for torch's arguments.

    ``mask_kind`` is the attn_mask's dtype kind as NumPy spells it ("b" for a
    boolean mask, "f" for a floating-point one, None without a mask): the caller
    reads it from an array or a tensor.
    """
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a number, got {dropout_p!r}")
    if dropout_p != 0:
        raise ValueError(f"dropout_p={dropout_p}: fastattn computes exact attention without dropout; "
                         f"pass dropout_p=0.0")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {enable_gqa!r}")
    if is_causal and attn_mask is not None:
        # torch: "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True"
        raise ValueError("scaled_dot_product_attention: an explicit attn_mask must not be set when "
                         "is_causal=True (as in torch)")
    hq, hk, hv = _heads(query_shape), _heads(key_shape), _heads(value_shape)
    if enable_gqa:
        # torch repeats key/value heads to the query's count (repeat_interleave on dim -3)
        if hq is None or hk is None or hv is None:
            raise ValueError(f"enable_gqa=True needs query, key and value with a head axis (-3): "
                             f"query {tuple(query_shape)}, key {tuple(key_shape)}, value {tuple(value_shape)}")
        if hk != hv:
            raise ValueError(f"enable_gqa=True: key and value must have the same number of heads, "
                             f"got key {hk} and value {hv}")
        if hk == 0 or hq % hk:
            raise ValueError(f"enable_gqa=True: the number of key/value heads ({hk}) must divide the "
                             f"number of query heads ({hq})")
    elif hq is not None and hk is not None and hv is not None and hq != hk and hk != 1:
        # fastattn.attention would group these heads by itself; torch broadcasts them and fails
        raise ValueError(f"query has {hq} heads and key {hk}: they do not broadcast; grouped-query "
                         f"attention needs enable_gqa=True (as in torch)")
    options = {"scale": scale, "causal": "top_left" if is_causal else False}
    if attn_mask is not None:
        if mask_kind == "b":
            options["mask"] = attn_mask        # True = may attend, as fastattn's mask
        elif mask_kind == "f":
            options["bias"] = attn_mask        # added to the scores, as fastattn's bias
        else:
            raise TypeError(f"attn_mask must be a boolean or floating-point array, got dtype {mask_kind}")
    return options


def mask_and_kind(attn_mask):
    """(attn_mask as an ndarray, its kind for sdpa_options)."""
    if attn_mask is None:
        return None, None
    if isinstance(attn_mask, np.ma.MaskedArray):
        # np.asarray would drop its mask: refused like every masked-array argument
        raise TypeError("attn_mask: masked arrays (numpy.ma) are not supported: their mask would be ignored; "
                        "pass a boolean attn_mask (True = may attend), e.g. ~numpy.ma.getmaskarray(attn_mask) "
                        "combined with its data as you intend")
    mask = np.asarray(attn_mask)
    kind = mask.dtype.kind
    return mask, (kind if kind in "bf" else str(mask.dtype))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 *, scale=None, enable_gqa=False):
    """Attention with the signature and semantics of torch's SDPA.

    ``torch.nn.functional.scaled_dot_product_attention``'s arguments, on NumPy
    arrays or torch tensors.  NumPy arrays (and array-likes) in, NumPy arrays out; torch tensors in, torch
    tensors out (CPU tensors, read without copies; see
    :mod:`fastattn.integrations.torch`).  Apart from the argument names the
    result is exactly that of :func:`fastattn.attention`.

    Parameters
    ----------
    query : array_like or torch.Tensor, shape (..., L, E)
        The queries.
    key : array_like or torch.Tensor, shape (..., S, E)
        The keys.
    value : array_like or torch.Tensor, shape (..., S, Ev)
        The values.  Leading (batch) dims broadcast as in torch.  Without ``enable_gqa`` the
        head axis (-3) of ``key``/``value`` must equal that of ``query`` or be 1.
    attn_mask : bool or float array, broadcastable to (..., L, S), optional
        Boolean: True where a query may attend to a key (fastattn's ``mask``).
        Floating point: added to the scaled scores (fastattn's ``bias``).
    dropout_p : float
        Must be 0: fastattn computes exact attention.
    is_causal : bool
        Query i attends to keys j <= i (top-left aligned, as in torch).  Cannot
        be combined with ``attn_mask``.
    scale : float, optional
        Multiplies the scores; default ``1 / sqrt(E)``.  Keyword-only, as in torch.
    enable_gqa : bool
        Grouped-query attention: the head count of ``key`` and ``value`` (equal)
        divides that of ``query``, and query head h uses key/value head
        ``h // (Hq // Hkv)``.  Keyword-only, as in torch.

    Returns
    -------
    ndarray or torch.Tensor, shape (..., L, Ev)
        The attention output, in the dtype :func:`fastattn.attention` gives (torch requires equal
        dtypes of query, key and value; fastattn promotes them).  A query that
        sees no key gives 0 (as torch does on CPU).

    Raises
    ------
    ValueError
        ``dropout_p`` other than 0; ``attn_mask`` together with ``is_causal``;
        head counts that neither broadcast nor, with ``enable_gqa``, group; any
        error of :func:`fastattn.attention` (shapes, options).
    TypeError
        An ``attn_mask`` that is neither boolean nor floating point, or a
        ``numpy.ma`` masked array (its mask would be ignored); a tensor on a
        device other than the CPU.

    See Also
    --------
    attention : The same computation with fastattn's options.
    fastattn.integrations.torch.attention : A differentiable version for tensors.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((1, 8, 16, 64), dtype=np.float32)
    >>> k = v = rng.standard_normal((1, 2, 16, 64), dtype=np.float32)
    >>> out = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    >>> out.shape, out.dtype
    ((1, 8, 16, 64), dtype('float32'))
    >>> bool(np.allclose(out, fastattn.attention(q, k, v, causal=True)))
    True
    >>> padding = np.arange(16) < 12          # a boolean mask: the last 4 keys are padding
    >>> out = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=padding, enable_gqa=True)
    >>> bool(np.allclose(out, fastattn.attention(q, k, v, kv_lengths=12)))
    True
    """
    if any_torch_tensor(query, key, value, attn_mask):
        from .integrations import torch as torch_integration
        return torch_integration.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    attn_mask, kind = mask_and_kind(attn_mask)
    options = sdpa_options(np.shape(query), np.shape(key), np.shape(value), attn_mask, kind, dropout_p,
                           is_causal, scale, enable_gqa)
    return attention(query, key, value, **options)

