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

__all__ = ["register", "attention_forward", "NAME"]

NAME = "fastattn"


def register(name=NAME):
    """Make ``attn_implementation=name`` (default ``"fastattn"``) available to every
    transformers model that uses the attention interface.

    Registers :func:`attention_forward` as the attention function and
    transformers' sdpa mask builder as the mask function under ``name``.
    Idempotent.

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
    """transformers' attention function for ``attn_implementation="fastattn"``.

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer (its ``is_causal`` is read when ``is_causal`` is None).
    query : torch.Tensor, shape (B, H, Lq, D)
    key, value : torch.Tensor, shape (B, Hkv, Lk, D)
        Hkv divides H (grouped-query attention is native).
    attention_mask : torch.Tensor or None
        transformers' sdpa mask: boolean (B or 1, 1, Lq, Lk), True = may attend;
        a float mask is added to the scores.
    dropout : float
        Must be 0.
    scaling : float, optional
        Score scale; default ``1 / sqrt(D)``.
    is_causal : bool, optional
    softcap : float, optional
        Gemma2's attention logit soft-capping.
    sliding_window : int, optional
        The layer's sliding window: a hint for the mask decomposition (the mask
        itself is what is computed).
    **kwargs
        Ignored, as sdpa ignores them (position ids, cache flags).

    Returns
    -------
    (attn_output, None)
        ``attn_output`` of shape (B, Lq, H, D), contiguous, in the query's dtype.
    """
    if dropout:
        raise ValueError(f"fastattn computes attention without dropout, got dropout={dropout} "
                         f"(put the model in eval mode, or set its attention dropout to 0)")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    B, H, Lq, _ = query.shape
    options = dict(mask_options(attention_mask, Lq, is_causal, sliding_window), scale=scaling, softcap=softcap)
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:   # added to the scores, as sdpa does (with a float mask: both)
        options["bias"] = position_bias if "bias" not in options else options["bias"] + position_bias
    if torch_integration._needs_grad(query, key, value, options.get("bias")):
        out = torch_integration.attention(query, key, value, **options)
        return out.transpose(1, 2).contiguous(), None
    # written straight into the (B, Lq, H, Dv) layout transformers wants next
    out = torch.empty((B, Lq, H, value.shape[-1]), dtype=query.dtype)
    torch_integration.attention(query, key, value, out=out.transpose(1, 2), **options)
    return out, None
