"""fastattn as an attention backend for Hugging Face transformers::

    import fastattn.integrations.transformers
    fastattn.integrations.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fastattn")

:func:`register` adds ``"fastattn"`` to transformers' attention interface and to
its mask interface: a name missing from the mask interface gets no mask at all
(``attention_mask=None``, padding ignored).  The masks are the ones transformers
builds for ``"sdpa"`` (boolean, True = may attend; None where sdpa's ``is_causal``
does the job), and :func:`attention_forward` receives and returns what sdpa's
does.  It passes transformers' (B, H, L, D) tensors to fastattn as they are
(grouped key/value heads natively, no ``repeat_kv``), with the module's
``scaling``, Gemma2's ``softcap``, and each mask turned into the cheapest exact
options (:mod:`fastattn.integrations._mask_decomposition`): causal alignment
chosen by where the queries sit, sliding window, per-key padding, and a full
mask only when nothing else reproduces it.

float32, float16 and bfloat16 models (bfloat16 tensors are read through
``ml_dtypes``' NumPy dtype: ``pip install ml_dtypes``).  CPU only.  ``dropout`` must be 0 (models pass 0 in eval mode).
"""
import weakref

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import _mask_decomposition
from . import torch as torch_integration

__all__ = ["register", "attention_forward", "NAME", "IGNORED_KEYWORDS"]

NAME = "fastattn"

#: Keywords that models pass to the attention function and that do not change
#: its result here, so :func:`attention_forward` accepts and ignores them (as
#: sdpa's attention function does): positions and cache bookkeeping (the mask
#: transformers builds for sdpa already encodes padding and packed sequences),
#: flags about other outputs (the weights are None, as with sdpa), and
#: flash-attention's packed-sequence descriptors, which describe the sequences
#: that mask encodes.  Any other keyword that is not None raises
#: NotImplementedError naming it: a keyword fastattn does not know is never
#: silently dropped.
IGNORED_KEYWORDS = frozenset({
    "position_ids", "cache_position", "past_key_values", "past_key_value", "use_cache", "layer_idx",
    "output_attentions", "output_hidden_states", "output_router_logits", "return_dict", "num_items_in_batch",
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx",
    "deterministic",        # flash-attn's deterministic backward: fastattn's always is
})
# keywords that change the math and are handled: added to the scores, or attention sinks
_HANDLED_KEYWORDS = frozenset({"position_bias", "s_aux", "sinks"})


def register(name=NAME):
    """Make ``attn_implementation=name`` available to transformers models.

    Registers :func:`attention_forward` as the attention function and
    transformers' sdpa mask builder (``transformers.masking_utils.sdpa_mask``)
    as the mask function under ``name``, in transformers' global
    ``AttentionInterface`` and ``AttentionMaskInterface``, so that every model
    that uses the attention interface accepts ``attn_implementation=name``
    (``from_pretrained(..., attn_implementation=name)``,
    ``model.set_attn_implementation(name)``).  Idempotent: registering a name
    again stores the same functions under it.

    Parameters
    ----------
    name : str, optional
        The implementation's name.  Default ``"fastattn"`` (the module's ``NAME``).

    Returns
    -------
    None
        Nothing: the registration lasts for the process.

    See Also
    --------
    attention_forward : The attention function registered.

    Examples
    --------
    >>> import fastattn.integrations.transformers as fa_hf
    >>> fa_hf.register()
    >>> from transformers import AttentionInterface
    >>> "fastattn" in AttentionInterface()
    True
    """
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)


class _MaskOptionsCache:
    """The options of the last few mask tensors.  transformers builds a mask once
    per forward pass and hands the same tensor to every layer: decompose it once.
    An entry is used only for the very same tensor object (a weak reference),
    unchanged since (its version counter, data pointer, shape and strides).
    Inference-mode tensors have no version counter: they are not cached."""

    def __init__(self, size=4):
        self._size = size
        self._entries = []

    @staticmethod
    def _key(mask, hints):
        if mask.is_inference():
            return None
        return (mask._version, mask.data_ptr(), tuple(mask.shape), mask.stride(), hints)

    def get(self, mask, hints):
        key = self._key(mask, hints)
        for ref, k, options in self._entries:
            if key is not None and ref() is mask and k == key:
                return options
        return None

    def put(self, mask, hints, options):
        key = self._key(mask, hints)
        if key is not None:
            self._entries = [(weakref.ref(mask), key, options)] + self._entries[:self._size - 1]


_cache = _MaskOptionsCache()
_FULL_MASK = "the mask itself"      # cached for masks that no cheaper option set reproduces


def mask_options(attention_mask, q_length, is_causal, sliding_window):
    """fastattn options (``causal``, ``window``, ``kv_lengths``, ``mask``, ``bias``)
    for the mask transformers passed to the attention function.

    None: sdpa's rule, ``is_causal = q_length > 1 and is_causal`` (top-left: a
    query block at the start of a longer static cache sees no unfilled slot).  A
    boolean mask: its exact decomposition.  A float mask is added to the scores
    (fastattn's ``bias``), as sdpa does."""
    if attention_mask is None:
        return {"causal": "top_left" if (q_length > 1 and is_causal) else False}
    if attention_mask.dtype != torch.bool:
        return {"bias": attention_mask}
    hints = (bool(is_causal), sliding_window)
    options = _cache.get(attention_mask, hints)
    if options is not None and options is not _FULL_MASK:
        return options
    array = torch_integration._tensor_to_array(attention_mask, "attention_mask")
    if options is _FULL_MASK:
        return {"mask": array}
    options = _mask_decomposition.decompose(array, is_causal=is_causal, sliding_window=sliding_window)
    # the cache keeps small arrays only, never a view of a full mask (it would keep the mask alive)
    _cache.put(attention_mask, hints, _FULL_MASK if options.get("mask") is array else options)
    return options


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, softcap=None, sliding_window=None, **kwargs):
    """Attention function of transformers' ``attn_implementation="fastattn"``.

    Called by the model's attention layers with what they pass to sdpa's
    attention function, and returns what that function returns.  The
    (B, H, L, D) tensors go to :func:`fastattn.integrations.torch.attention`
    as they are (grouped key/value heads natively, no ``repeat_kv``), with
    ``scale=scaling`` and ``softcap``.  The mask becomes fastattn options: with
    no mask, ``causal="top_left"`` when ``Lq > 1`` and the layer is causal
    (sdpa's rule), else none; a boolean mask is decomposed into the cheapest
    options that reproduce it exactly (causal alignment, sliding window,
    ``kv_lengths``, ``kv_start``, a per-key mask; the full mask only when
    nothing else reproduces it), once per mask tensor object for the last few
    masks; any other mask is added to the scores (``bias``).  A
    ``position_bias`` keyword is added to the scores too, as sdpa does, and
    ``s_aux`` (gpt-oss's learned attention sinks, one per query head) becomes
    fastattn's ``sinks``.  No keyword is dropped silently: the ones in
    :data:`IGNORED_KEYWORDS` do not change the result, any other that is not
    None raises NotImplementedError.  When grad mode is on and ``query``,
    ``key``, ``value``, the bias or the sinks require grad, the call runs
    through autograd; otherwise fastattn writes the output
    straight into a new (B, Lq, H, Dv) tensor of ``query``'s dtype.

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer.  Its ``is_causal`` attribute is read when
        ``is_causal`` is None (True when it has none); nothing else of it is.
    query : torch.Tensor, shape (B, H, Lq, D)
        The queries, a CPU tensor of float32, float64, float16 or bfloat16.
    key : torch.Tensor, shape (B, Hkv, Lk, D)
        The keys; ``Hkv`` divides ``H`` (grouped-query attention).
    value : torch.Tensor, shape (B, Hkv, Lk, Dv)
        The values.
    attention_mask : torch.Tensor or None
        The mask transformers built for sdpa: boolean, broadcastable to
        (B, H, Lq, Lk), True where a query may attend to a key; or a float
        mask, added to the scores; or None.
    dropout : float, optional
        Attention dropout probability.  Must be 0 (eval mode).
    scaling : float, optional
        Score scale.  Default ``1 / sqrt(D)``.
    is_causal : bool, optional
        Whether the layer is causal; default ``module.is_causal``.  With no
        mask it decides ``causal``; with a boolean mask it is only a hint for
        the decomposition (the mask is what is computed); with a float mask
        it is unused.
    softcap : float, optional
        Attention logit soft-capping (Gemma2's), as the ``softcap`` of
        :func:`fastattn.attention`.
    sliding_window : int, optional
        The layer's sliding window: a hint for the decomposition of a boolean
        mask (the mask is what is computed).
    **kwargs
        ``position_bias`` (a tensor broadcastable to (B, H, Lq, Lk)) is added
        to the scores; ``s_aux`` (or ``sinks``), a tensor of shape (H,), gives
        each query head's attention sink (:func:`fastattn.attention`'s
        ``sinks``); the keywords in :data:`IGNORED_KEYWORDS` (position ids,
        cache bookkeeping, output flags, flash-attention's packed-sequence
        descriptors) are accepted and do not change the result; any other
        keyword raises NotImplementedError unless it is None.

    Returns
    -------
    attn_output : torch.Tensor, shape (B, Lq, H, Dv)
        The attention output, contiguous.
    attn_weights : None
        Always None: no weights are returned, as with sdpa.

    Raises
    ------
    ValueError
        ``dropout`` other than 0; both ``s_aux`` and ``sinks``.  And the
        errors of :func:`fastattn.integrations.torch.attention`.
    NotImplementedError
        A keyword (other than None) that is neither handled nor in
        :data:`IGNORED_KEYWORDS`: fastattn would compute something else than
        the model asks for.
    TypeError
        The errors of :func:`fastattn.integrations.torch.attention` (for
        example a tensor on a GPU); without gradients, ``key`` or ``value``
        whose dtype gives an output dtype other than ``query``'s.

    See Also
    --------
    register : Make this function the ``"fastattn"`` attention implementation.
    fastattn.integrations.torch.attention : The differentiable attention it calls.

    Examples
    --------
    Called as an attention layer calls it; ``module`` is only asked for
    ``is_causal``:

    >>> import types, torch
    >>> from fastattn.integrations.transformers import attention_forward
    >>> layer = types.SimpleNamespace(is_causal=True)
    >>> q = torch.randn(2, 4, 6, 8)                 # (B, H, Lq, D)
    >>> k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    >>> out, weights = attention_forward(layer, q, k, v, None)
    >>> out.shape, weights
    (torch.Size([2, 6, 4, 8]), None)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    >>> torch.allclose(out, ref.transpose(1, 2), atol=1e-6)
    True
    """
    if dropout:
        raise ValueError(f"fastattn computes attention without dropout, got dropout={dropout} "
                         f"(put the model in eval mode, or set its attention dropout to 0)")
    unknown = sorted(name for name, value in kwargs.items()
                     if value is not None and name not in IGNORED_KEYWORDS and name not in _HANDLED_KEYWORDS)
    if unknown:
        raise NotImplementedError(
            f"fastattn's attention backend does not handle the attention keyword {unknown[0]!r} (given by the "
            f"model: computing without it would give other results); use attn_implementation='sdpa' or 'eager' "
            f"for this model")
    sinks = kwargs.get("s_aux")
    if kwargs.get("sinks") is not None:
        if sinks is not None:
            raise ValueError("attention sinks given twice, as s_aux and as sinks")
        sinks = kwargs["sinks"]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    B, H, Lq, _ = query.shape
    options = dict(mask_options(attention_mask, Lq, is_causal, sliding_window), scale=scaling, softcap=softcap)
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:   # added to the scores, as sdpa does (with a float mask: both)
        options["bias"] = position_bias if "bias" not in options else options["bias"] + position_bias
    if sinks is not None:
        options["sinks"] = sinks
    plain = (key.shape[0] == value.shape[0] == B and query.dtype == key.dtype == value.dtype
             and all(x.shape[0] == B for x in (options.get("mask"), options.get("bias"))
                     if isinstance(x, torch.Tensor) and x.dim() == 4))
    if not plain or torch_integration._needs_grad(query, key, value, options.get("bias"), sinks):
        # gradients, broadcast batches or mixed dtypes: the result's own shape and dtype
        out = torch_integration.attention(query, key, value, **options)
        return out.transpose(1, 2).contiguous(), None
    # written straight into the (B, Lq, H, Dv) layout transformers wants next
    out = torch.empty((B, Lq, H, value.shape[-1]), dtype=query.dtype)
    torch_integration.attention(query, key, value, out=out.transpose(1, 2), **options)
    return out, None
