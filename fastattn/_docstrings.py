"""The docstrings of fastattn's public functions, in NumPy style.

Kept apart from the code: ``fastattn.attention`` is a compiled function whose
docstring is assigned at import (``fastattn._api``), and the argument path that
implements these functions is compiled too.  Each docstring's Examples run as
doctests (``tests/test_docstrings.py``, and ``sphinx -b doctest`` in CI).
"""

ATTENTION = """Exact scaled dot-product attention, ``softmax(q @ kᵀ * scale + ...) @ v``.

Computes, for every query row, a softmax over the scores of the keys it may
see and the weighted sum of their values, streaming over the keys (an online
softmax): the ``(..., Lq, Lk)`` score matrix is never built.  Every option is
defined by :func:`fastattn.reference.attention`, which does build it.

Parameters
----------
q : array_like, shape (..., Lq, Dk)
    Queries.  At least 2-D; the leading dims are batch dims (for example
    ``(B, H)``).
k : array_like or fastattn.QuantizedKV, shape (..., Lk, Dk)
    Keys: the same last dimension ``Dk`` as ``q``.  A
    :class:`fastattn.QuantizedKV` (8-bit or 4-bit codes with a scale and
    zero point per group, from :func:`fastattn.quantize_kv` or a serving
    engine's buffers) is read in place, never dequantized into a copy; its
    ``dtype`` is float32 in the output dtype's rule below (a float16 ``q``
    with a QuantizedKV cache gives a float32 output).
v : array_like or fastattn.QuantizedKV, shape (..., Lk, Dv)
    Values: as many rows ``Lk`` as ``k``; ``Dv`` may differ from ``Dk``.
    The batch dims of ``q``, ``k`` and ``v`` broadcast by NumPy rules, as
    stride-0 views (nothing is copied).  When the head axis (-3) of ``q`` is
    ``g > 1`` times that of ``k`` and ``v`` (which share a head count; one
    key/value head included), query head ``h`` uses key/value head
    ``h // g``: grouped-query and multi-query attention, as torch's
    ``enable_gqa``, reading each key and value once for its group.
scale : float, optional
    Multiplies ``q @ kᵀ``.  Default ``1 / sqrt(Dk)`` (1 when ``Dk`` is 0).
causal : {False, True, "top_left", "bottom_right"}, optional
    ``True`` or ``"top_left"``: query ``i`` sees keys ``j <= i`` (torch's
    ``is_causal``).  ``"bottom_right"``: query ``i`` sees keys
    ``j <= i + Lk_eff - Lq``, the alignment of new queries against a KV cache
    (flash-attn's), where ``Lk_eff`` is the row's number of valid keys
    (``Lk``, or its ``kv_lengths`` entry).  Default False (``None`` too).
mask : array_like of bool, broadcastable to (..., Lq, Lk), optional
    ``True`` where a query may attend to a key (the torch/JAX convention).
    A 1-D mask is one entry per key (a padding mask).
bias : array_like, broadcastable to (..., Lq, Lk), optional
    Added to the scaled (and soft-capped) scores, in the compute dtype.
window : int or (int or None, int or None), optional
    Sliding window: key ``j`` is visible to query ``i`` iff
    ``p(i) - left <= j <= p(i) + right``, where ``p(i)`` is the query's
    diagonal position (``i``, or ``i + Lk_eff - Lq`` with
    ``causal="bottom_right"``).  An int ``w`` means ``(w, w)``; ``None`` for a
    side leaves it unbounded.  Default None (no window).
kv_lengths : array_like of int, broadcastable to the batch dims, optional
    Number of valid keys per batch element (e.g. shape ``(B, 1)`` or
    ``(B, H)``): keys ``j >= kv_lengths[b]`` are invisible, whatever they hold.
    Each length must lie in ``[0, Lk]``.  A 1-D table with two or more batch
    dims holds one value per sequence (the leading batch dim, flash-attn's
    ``cache_seqlens``), never per head; per-head values take ``(1, H)``.
kv_start : array_like of int, broadcastable to the batch dims, optional
    First valid key per batch element (left padding): keys
    ``j < kv_start[b]`` are invisible; the diagonal position ``p(i)`` does
    not move.  Values in ``[0, Lk]``; 1-D tables as ``kv_lengths``.
align : {"top_left", "bottom_right"}, optional
    Where the diagonal position ``p(i)`` of windows and ALiBi sits:
    ``i`` (default), or ``i + Lk_eff - Lq`` (flash-attn's alignment when
    ``Lq != Lk``) without hiding any key by itself.  ``causal="bottom_right"``
    implies it; ``causal=True`` with ``align="bottom_right"`` is
    ``causal="bottom_right"``.
softcap : float, optional
    Soft capping: each scaled score ``s`` becomes
    ``softcap * tanh(s / softcap)`` before the bias and masking.  Must be
    finite and > 0.
alibi_slopes : array_like, broadcastable to the batch dims, optional
    ALiBi: adds ``-slope * |p(i) - j|`` to each score (shape ``(H,)`` or
    ``(B, H)``).
k_scale : array_like, optional
    Scales of an integer (int8) or float8 (``ml_dtypes.float8_e4m3fn`` /
    ``float8_e5m2``) ``k``: the keys the kernels see are
    ``k.astype(float32) * k_scale``.  Broadcastable either to
    ``k.shape[:-1] + (1,)`` (per tensor, per head or per key) or to
    ``k.shape[:-2] + (1, Dk)`` (per channel); finite.  int8 and float8 keys
    with a float32 (or half-precision) query are read in place and the scale
    is applied in the kernels; other integer keys are converted with the
    scale folded in.  Not for a :class:`fastattn.QuantizedKV` (it carries
    its own scales).
v_scale : array_like, optional
    The same for an integer or float8 ``v`` (per key, or per channel
    ``(..., 1, Dv)``).
sinks : array_like, broadcastable to the batch dims, optional
    Attention sinks (gpt-oss, StreamingLLM): one extra logit per query row,
    equal to its sink -- not scaled, soft-capped, biased or masked -- that
    takes part in the row's softmax and whose column is then dropped:
    ``p_j = exp(s_j) / (exp(sink) + sum_k exp(s_k))``.  One per query head
    (shape ``(Hq,)`` or ``(B, Hq)``; per *query* head under grouped heads),
    float32 or float64.  The weights then sum to less than 1, the lse
    includes ``exp(sink)``, and a row with no visible key gives output 0 and
    lse equal to its sink.
return_weights : bool, optional
    Also return the attention weights (the softmax rows).  Costs about twice
    the time of the output alone, and ``Lq * Lk`` elements of memory.
return_lse : bool, optional
    Also return the log-sum-exp of each row's visible scores, the quantity
    :func:`merge_attention` needs.
out : ndarray, optional
    Where to write the output: a writeable array of exactly the output's
    shape and dtype, not overlapping an input.  Written and returned.
num_threads : int, optional
    Threads for this call (default: :func:`fastattn.get_num_threads`).
    Results are bit-identical for any thread count.

Returns
-------
out : ndarray, shape (..., Lq, Dv)
    The attention output; the whole result when neither ``return_weights``
    nor ``return_lse`` is set, else the first item of the tuple
    ``(out, weights, lse)`` holding the parts asked for, in that order.
    ``...`` is the broadcast batch shape (with the
    query head count for grouped heads).  Its dtype is
    ``np.result_type(q, k, v)``: float32 and float64 compute natively;
    float16 and bfloat16 (``ml_dtypes.bfloat16``) are read where they are
    stored, widened in registers, computed in float32 and rounded once to
    the output dtype (float32 ``q`` with float16 ``k``, ``v`` gives float32;
    float16 with bfloat16 gives float32); int8 ``k``, ``v`` are read in place
    with a float ``q``; other integer and bool inputs compute in float64.
weights : ndarray, shape (..., Lq, Lk)
    Only with ``return_weights=True``: the weights, in the output dtype.
lse : ndarray, shape (..., Lq)
    Only with ``return_lse=True``: each row's log-sum-exp, in the compute
    dtype (float32 for float32, float16 or bfloat16 results, float64
    otherwise).

Raises
------
TypeError
    An array of a complex, object, string, bytes or datetime dtype; a
    ``mask`` that is not boolean; ``kv_lengths`` or ``kv_start`` that are
    not integers; an ``align`` that is not a string; ``k_scale`` / ``v_scale`` given for a ``k`` / ``v`` that is neither integer nor float8;
    ``scale``, ``softcap``, ``window`` or ``causal`` of the wrong type; ``out``
    that is not an ndarray or has the wrong dtype (byte order included);
    ``num_threads`` that is not an int; an option passed positionally.
ValueError
    ``q``, ``k`` or ``v`` with fewer than 2 dims; ``Dk`` of ``q`` and ``k``
    or ``Lk`` of ``k`` and ``v`` that differ; batch dims that do not
    broadcast (including a query head count that is not a multiple of the
    key/value head count); ``mask``, ``bias``, ``kv_lengths``,
    ``alibi_slopes`` or ``sinks`` that do not broadcast; a ``k_scale`` / ``v_scale`` that
    is not finite or broadcasts neither per key nor per channel;
    ``kv_lengths`` or ``kv_start`` outside
    ``[0, Lk]`` (or a 1-D table whose length is not the leading batch dim);
    an unknown ``align``; a negative window side; ``softcap <= 0``; a non-finite
    ``scale`` or ``softcap``; an unknown ``causal`` string; ``out`` with the
    wrong shape, read-only, with zero strides or overlapping an input;
    ``num_threads < 1``.  Every message names the argument.
MemoryError
    The outputs or the per-thread workspace cannot be allocated.

See Also
--------
fastattn.reference.attention : The float64 NumPy specification.
merge_attention : Combine results computed over disjoint key sets.
softmax : The softmax alone.

Notes
-----
Scores are built in this order: ``s = scale * q @ kᵀ``; the softcap; ``+ bias``;
the ALiBi term; then every key the row may not see (causal, window, mask,
``kv_lengths``) is ``-inf``.  Options intersect.

A row that sees no key (fully masked, an empty window, ``kv_lengths`` 0,
``Lk = 0``) gives output 0, weights 0 and lse ``-inf`` (its sink with
``sinks``): never NaN, never a warning.  Sinks enter once, where a row's
online softmax is finished (``lse = log(l e^m + e^sink)``, ``out = acc e^(m -
lse)``), also after a split of the keys: the tile loops do not change.  Values of keys a row cannot see never reach it, even if they are
inf or NaN (an uninitialised KV-cache slot behind ``kv_lengths`` is
harmless).  NaN or inf inside ``q``, ``k`` or ``v`` propagate to the rows that
see them.

Inputs are never written.  Any strides are read in place (transposed views,
negative strides, read-only and memory-mapped arrays); copies are made only to
convert a dtype the kernels do not read (float16 / bfloat16 / int8 with a
float64 compute, integers other than int8, big-endian inputs) or for
misaligned data.  Extra memory is one small workspace per thread, never
``Lq * Lk``.

Examples
--------
The query of the word "it" against the keys of "trophy", "suitcase" and "it",
whose raw dot products are 16, 8 and 0 with 64-wide vectors:

>>> import numpy as np
>>> import fastattn
>>> q = np.full((1, 64), 0.5)                     # one query
>>> k = np.zeros((3, 64))
>>> k[0] = 0.5                                    # q . k0 = 16
>>> k[1, :32] = 0.5                               # q . k1 = 8
>>> k[2] = np.where(np.arange(64) % 2 == 0, 0.5, -0.5)   # q . k2 = 0
>>> v = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
>>> out, weights = fastattn.attention(q, k, v, return_weights=True)
>>> print(np.round(weights, 6))                   # softmax([16, 8, 0] / 8)
[[0.665241 0.244728 0.090031]]
>>> print(np.round(out, 6))
[[0.755272 0.334759]]

Batches of heads, causal, float32 in and out:

>>> rng = np.random.default_rng(0)
>>> q, k, v = (rng.standard_normal((2, 4, 16, 32), dtype=np.float32) for _ in range(3))
>>> out = fastattn.attention(q, k, v, causal=True)
>>> print(out.shape, out.dtype)
(2, 4, 16, 32) float32
>>> want = fastattn.reference.attention(q, k, v, causal=True)
>>> print(np.allclose(out, want, atol=1e-5))
True

Grouped-query attention (8 query heads, 2 key/value heads) in a decode step:
one new query per head against a preallocated cache of which 5 slots are
filled:

>>> q = rng.standard_normal((1, 8, 1, 32))
>>> k_cache = np.zeros((1, 2, 16, 32))
>>> v_cache = np.zeros((1, 2, 16, 32))
>>> k_cache[:, :, :5] = rng.standard_normal((1, 2, 5, 32))
>>> v_cache[:, :, :5] = rng.standard_normal((1, 2, 5, 32))
>>> out, lse = fastattn.attention(q, k_cache, v_cache, kv_lengths=np.array([5]),
...                               causal="bottom_right", return_lse=True)
>>> print(out.shape, lse.shape)
(1, 8, 1, 32) (1, 8, 1)
>>> k5, v5 = np.repeat(k_cache[:, :, :5], 4, axis=1), np.repeat(v_cache[:, :, :5], 4, axis=1)
>>> print(np.allclose(out, fastattn.attention(q, k5, v5)))
True

A row that sees no key gives 0, and lse -inf:

>>> out, lse = fastattn.attention(np.ones((1, 4)), np.ones((2, 4)), np.ones((2, 3)),
...                               mask=np.zeros(2, dtype=bool), return_lse=True)
>>> print(out, lse)
[[0. 0. 0.]] [-inf]
"""

SOFTMAX = """Max-stabilised softmax along ``axis``: ``exp(x - max) / sum(exp(x - max))``.

Each slice along ``axis`` becomes non-negative weights that sum to 1; the
larger an entry, the larger its weight.  Subtracting the slice's maximum first
changes nothing in exact arithmetic and keeps ``exp`` from overflowing.

Parameters
----------
x : array_like
    Input of any shape and strides (read in place, never written).
axis : int or None, optional
    The axis along which the entries sum to 1 (negative counts from the end),
    or None for the whole array.  Default -1.
out : ndarray, optional
    Where to write the result: a writeable array of exactly ``x``'s shape and
    the result's dtype, not overlapping ``x``.  Written and returned.
num_threads : int, optional
    Threads for this call (default: :func:`fastattn.get_num_threads`).
    Inputs of up to 32768 elements run on the calling thread.

Returns
-------
ndarray
    The softmax, of ``x``'s shape and, along an axis, of ``x``'s memory
    layout (as a NumPy ufunc: a Fortran-ordered input gives a
    Fortran-ordered result).  Its dtype: float32 and float64 compute and
    return natively; float16 and bfloat16 (``ml_dtypes.bfloat16``) are
    computed in float32 and returned in their own dtype (read and written in
    place, each result rounded once, when the slices along ``axis`` are
    contiguous; along other axes they are widened to float32 a slab of 4 MiB
    at a time, never as a whole copy); integers
    and bools compute and return in float64.

Raises
------
TypeError
    ``x`` of a complex, object or string dtype; ``axis`` that is neither an
    int nor None; ``out`` that is not an ndarray or has the wrong dtype;
    ``num_threads`` that is not an int.
ValueError
    ``axis`` out of range (``numpy.exceptions.AxisError``, a ValueError);
    ``out`` with the wrong shape, read-only or overlapping ``x``;
    ``num_threads < 1``.

See Also
--------
log_softmax : ``log(softmax(x))``, computed stably.
fastattn.reference.softmax : The float64 NumPy specification.

Notes
-----
A slice that is entirely ``-inf`` gives zeros (no NaN, no warning); ``+inf``
or NaN in a slice gives NaN in that slice only.  Along an axis that is not the
contiguous one of a dense array the vector lanes run across the contiguous
axis, so no slice is gathered element by element.

Examples
--------
The scaled scores of the seed lesson, ``[16, 8, 0] / sqrt(64)``:

>>> import numpy as np
>>> import fastattn
>>> print(np.round(fastattn.softmax(np.array([16.0, 8.0, 0.0]) / 8), 6))
[0.665241 0.244728 0.090031]

Along the first axis of a float32 array; a fully masked row:

>>> x = np.array([[0.0, 1.0], [0.0, 2.0]], dtype=np.float32)
>>> w = fastattn.softmax(x, axis=0)
>>> print(np.round(w, 4), w.dtype)
[[0.5    0.2689]
 [0.5    0.7311]] float32
>>> print(fastattn.softmax(np.array([-np.inf, -np.inf])))
[0. 0.]

Integers compute in float64:

>>> print(fastattn.softmax(np.array([1, 1, 1, 1])))
[0.25 0.25 0.25 0.25]
"""

LOG_SOFTMAX = """``log(softmax(x))`` along ``axis``, computed stably.

The result is ``x - max - log(sum(exp(x - max)))`` per slice: no softmax is
formed and then logged, so entries whose weight underflows to 0 keep their
finite log-probability.

Parameters
----------
x : array_like
    Input of any shape and strides (read in place, never written).
axis : int or None, optional
    The axis of the softmax (negative counts from the end), or None for the
    whole array.  Default -1.
out : ndarray, optional
    Where to write the result: a writeable array of exactly ``x``'s shape and
    the result's dtype, not overlapping ``x``.  Written and returned.
num_threads : int, optional
    Threads for this call (default: :func:`fastattn.get_num_threads`).

Returns
-------
ndarray
    The log-softmax, of ``x``'s shape (and, along an axis, memory layout).
    Its dtype follows :func:`softmax`: float32 and float64 native, float16
    and bfloat16 computed in float32 and returned in their own dtype,
    integers and bools in float64.

Raises
------
TypeError
    ``x`` of a complex, object or string dtype; ``axis`` that is neither an
    int nor None; ``out`` that is not an ndarray or has the wrong dtype;
    ``num_threads`` that is not an int.
ValueError
    ``axis`` out of range (``numpy.exceptions.AxisError``, a ValueError);
    ``out`` with the wrong shape, read-only or overlapping ``x``;
    ``num_threads < 1``.

See Also
--------
softmax : The softmax itself.
fastattn.reference.log_softmax : The float64 NumPy specification.

Notes
-----
A slice that is entirely ``-inf`` gives ``-inf`` (no NaN, no warning);
``+inf`` or NaN in a slice gives NaN in that slice only.

Examples
--------
>>> import numpy as np
>>> import fastattn
>>> print(np.round(fastattn.log_softmax(np.array([16.0, 8.0, 0.0]) / 8), 6))
[-0.407606 -1.407606 -2.407606]
>>> print(fastattn.log_softmax(np.array([0.0, -1000.0])))
[    0. -1000.]
"""

MERGE_ATTENTION = """Combine attention results computed over disjoint sets of keys.

If the keys of one attention problem are split into parts (chunks of a long
cache, other processes or machines) and each part's output and log-sum-exp are
computed with ``attention(..., return_lse=True)``, this gives the output and
log-sum-exp over the union of the keys:
``lse = logaddexp(lse_1, ..., lse_n)`` and
``out = sum_i exp(lse_i - lse) * out_i``.

Parameters
----------
outs : sequence of array_like, each of shape (..., Lq, Dv)
    Each part's (normalised) attention output; all of one shape.
lses : sequence of array_like, each of shape (..., Lq)
    Each part's log-sum-exp, in the same order as ``outs``.
sinks : array_like, broadcastable to ``lses[0].shape[:-1]``, optional
    Attention sinks applied once, to the merged rows, as one more part of
    lse ``sink`` and output 0: parts computed without sinks and merged with
    ``sinks=s`` equal ``attention(..., sinks=s)`` over all the keys (the
    merged lse includes the sink).

Returns
-------
out : ndarray, shape (..., Lq, Dv)
    The attention output over all the parts' keys, in the compute dtype of
    the inputs: float32 when every input is float32, float16 or bfloat16, float64
    otherwise.
lse : ndarray, shape (..., Lq)
    Its log-sum-exp, in the same dtype.

Raises
------
TypeError
    An input of a complex, object or string dtype.
ValueError
    No parts; a different number of ``outs`` and ``lses``; outputs of
    different shapes; an output whose shape is not its lse's shape plus one
    axis; ``sinks`` that do not broadcast.

See Also
--------
attention : Produces the parts (with ``return_lse=True``).
fastattn.reference.merge_attention : The float64 NumPy specification.

Notes
-----
Stable with empty parts: a part whose row saw no key (lse ``-inf``, output 0)
contributes nothing, and a row that no part saw stays 0 with lse ``-inf``.  A
NaN lse makes its row NaN.

Examples
--------
Attention over 10 keys, computed as two parts of 6 and 4 keys and merged:

>>> import numpy as np
>>> import fastattn
>>> rng = np.random.default_rng(1)
>>> q = rng.standard_normal((3, 8))
>>> k = rng.standard_normal((10, 8))
>>> v = rng.standard_normal((10, 4))
>>> o1, l1 = fastattn.attention(q, k[:6], v[:6], return_lse=True)
>>> o2, l2 = fastattn.attention(q, k[6:], v[6:], return_lse=True)
>>> out, lse = fastattn.merge_attention([o1, o2], [l1, l2])
>>> whole, whole_lse = fastattn.attention(q, k, v, return_lse=True)
>>> print(np.allclose(out, whole), np.allclose(lse, whole_lse))
True True
"""

ATTENTION_BACKWARD = """Compute the gradients of :func:`attention` with respect to q, k, v (and bias).

The FlashAttention-2 backward: the probabilities are recomputed from the
forward's ``lse`` tile by tile (nothing of size Lq x Lk is stored), the work
is spread over blocks of keys, so one long head fills every core, and the
result is bit-identical for any ``num_threads``.

Parameters
----------
grad_out : array_like, shape (..., Hq, Lq, Dv)
    Gradient of the loss with respect to ``out``; the shape and dtype of ``out``.
q, k, v : array_like (k, v: or fastattn.QuantizedKV)
    The forward's inputs, as given to :func:`attention`.  An int8 / float8
    ``k`` or ``v`` (with its ``k_scale`` / ``v_scale``) or a
    :class:`fastattn.QuantizedKV` is read as the values the forward computed
    with (``k.astype(float32) * k_scale``; ``(code - zero) * scale``),
    converted into a temporary of the compute dtype: the backward kernels have
    no readers for these formats (float16 and bfloat16 are read in place).
out, lse : array_like
    The forward's results: ``out, lse = attention(q, k, v, ..., return_lse=True)``
    with the same options.
scale, causal, mask, bias, window, kv_lengths, kv_start, align, softcap, alibi_slopes : optional
    The options of the forward call, with their meaning there.  softcap's
    ``tanh`` enters the chain rule; masks, ``kv_lengths`` and ALiBi slopes
    take no gradient.
k_scale, v_scale : array_like, optional
    The forward's scales of an int8 / float8 ``k`` / ``v`` (as for
    :func:`attention`; not for a QuantizedKV, which carries its own).
sinks : array_like, optional
    The forward's attention sinks (``lse`` then includes them, and the
    gradients of q, k, v keep their form).
return_dbias : bool, optional
    Also return the gradient of ``bias`` (which must then be given).
return_dsinks : bool, optional
    Also return the gradient of ``sinks`` (which must then be given):
    ``dsink = -sum_rows exp(sink - lse) * rowsum(grad_out * out)``.
num_threads : int, optional
    Threads for this call (default: :func:`fastattn.get_num_threads`).

Returns
-------
dq, dk, dv : ndarray
    In the shapes of q, k, v and their dtypes (integer inputs: the output's
    dtype; float16 / bfloat16 inputs are read in place, computed in float32
    and their gradients rounded once into the input's dtype).  For a scaled
    int8 / float8 or a QuantizedKV ``k`` / ``v``: the gradient with respect to
    the values the forward computed with, in the output's dtype and the
    logical shape ``(..., Lk, D)``.  Gradients of
    broadcast batch dims are summed back to the input's shape; with grouped
    heads (GQA/MQA) dk and dv sum over the query heads of their group.
dbias : ndarray
    Only with ``return_dbias=True``: in bias's shape, summed over the dims
    along which bias was broadcast.
dsinks : ndarray
    Only with ``return_dsinks=True`` (last in the tuple: ``(dq, dk, dv,
    dsinks)`` or ``(dq, dk, dv, dbias, dsinks)``): in the shape of ``sinks`` as
    passed, summed over the dims along which it was broadcast.

Raises
------
ValueError
    Shapes that attention() rejects, ``grad_out``, ``out`` or ``lse`` of another
    shape than attention() returns, ``return_dbias`` without a bias,
    ``return_dsinks`` without sinks, invalid options, a ``k_scale`` /
    ``v_scale`` that broadcasts neither per key nor per channel.
TypeError
    Non-numeric inputs, ``grad_out``, ``out`` or ``lse`` of another dtype than
    attention() returns, options of the wrong type, a ``k_scale`` / ``v_scale``
    for a ``k`` / ``v`` that is neither int8 nor float8 (or a QuantizedKV).

See Also
--------
attention : The forward.
fastattn.reference.attention_backward : The float64 specification.
fastattn.integrations.torch.attention : The same gradients through torch's autograd.

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

ATTENTION_VARLEN = """Attention over a packed batch of variable-length sequences (``cu_seqlens``).

The queries, keys and values of ``S`` sequences lie one after another along
axis 1; sequence ``s`` owns query rows ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]``
and keys ``cu_seqlens_k[s]:cu_seqlens_k[s + 1]`` and attends only to its own
keys, as :func:`attention` on that sequence alone would: nothing is padded
and no block-diagonal mask is built.  One work list over (sequence, head,
block of query rows) shares the cores between short and long sequences; a
long sequence with few queries is split over its keys and merged in a fixed
order.  Defined by :func:`fastattn.reference.attention_varlen`.

Parameters
----------
q : array_like, shape (Hq, total_q, Dk)
    The queries, heads first as everywhere in fastattn.  Any strides:
    flash-attn's ``(total, H, D)`` arrays pass as ``x.transpose(1, 0, 2)``
    without a copy.
k : array_like, shape (Hkv, total_k, Dk)
    The keys.  ``Hq`` must be a multiple of ``Hkv``: query head ``h`` uses
    key/value head ``h // (Hq // Hkv)`` (grouped-query attention).
v : array_like, shape (Hkv, total_k, Dv)
    The values.
cu_seqlens_q : array_like of int, shape (S + 1,)
    Cumulative query counts: starts at 0, non-decreasing, ends at
    ``total_q``.  A sequence without queries is skipped.
cu_seqlens_k : array_like of int, shape (S + 1,), optional
    Cumulative key counts, likewise ending at ``total_k``.  Default None:
    ``cu_seqlens_q`` (self-attention, ``total_k == total_q``).  A sequence
    without keys gives zeros (lse ``-inf``).
scale : float, optional
    Multiplies ``q @ kᵀ``.  Default ``1 / sqrt(Dk)``.
causal : {False, True, "top_left", "bottom_right"}, optional
    As for :func:`attention`, relative to each sequence's own lengths:
    ``"bottom_right"`` aligns a sequence's last query with its last key
    (new tokens against their sequence's context).
window : int or (int or None, int or None), optional
    Sliding window, as for :func:`attention`, per sequence.
softcap : float, optional
    Soft capping of the scaled scores, as for :func:`attention`.
alibi_slopes : array_like, broadcastable to (Hq,), optional
    ALiBi slopes, one per query head; the distances are measured within
    each sequence.
sinks : array_like, broadcastable to (Hq,), optional
    Attention sinks, one per query head, as for :func:`attention`.
return_lse : bool, optional
    Also return each row's log-sum-exp.
out : ndarray, optional
    Where to write the output: exactly its shape ``(Hq, total_q, Dv)`` and
    dtype, writeable, not overlapping an input (a transposed view of a
    ``(total_q, Hq, Dv)`` array is fine).
num_threads : int, optional
    Threads for this call.  Results are bit-identical for any thread count.

Returns
-------
out : ndarray, shape (Hq, total_q, Dv)
    The output (the first item of ``(out, lse)`` with ``return_lse=True``),
    in the dtype :func:`attention` would give for ``q``, ``k``, ``v``.
lse : ndarray, shape (Hq, total_q)
    Only with ``return_lse=True``, in the compute dtype.

Raises
------
TypeError
    ``cu_seqlens_q`` / ``cu_seqlens_k`` that are not integers; an array of a
    complex or object dtype; a masked array; options of the wrong type;
    ``out`` of the wrong type or dtype.
ValueError
    ``q``, ``k`` or ``v`` that are not 3-D; ``Dk`` of ``q`` and ``k``, the key
    counts of ``k`` and ``v`` or their head counts that differ; ``Hq`` not a
    multiple of ``Hkv``; ``cu_seqlens`` that are not 1-D, do not start at 0,
    decrease, do not end at the total or count different numbers of
    sequences; ``cu_seqlens_k=None`` with ``total_k != total_q``; bad option
    values or ``out``.  Every check runs before any work and names the
    argument.
MemoryError
    The outputs or the per-thread workspaces cannot be allocated.

See Also
--------
fastattn.reference.attention_varlen : The float64 specification.
attention_paged : The same against paged KV caches.
attention : One batch of equal-length sequences.

Examples
--------
Three sequences of 5, 1 and 9 tokens, causal self-attention, against a loop of
:func:`attention` over the sequences:

>>> import numpy as np
>>> import fastattn
>>> rng = np.random.default_rng(0)
>>> cu = np.array([0, 5, 6, 15])
>>> q, k, v = (rng.standard_normal((4, 15, 32), dtype=np.float32) for _ in range(3))
>>> out = fastattn.attention_varlen(q, k, v, cu, causal=True)
>>> print(out.shape, out.dtype)
(4, 15, 32) float32
>>> loop = np.concatenate([fastattn.attention(q[:, a:b], k[:, a:b], v[:, a:b], causal=True)
...                        for a, b in zip(cu[:-1], cu[1:])], axis=1)
>>> print(np.allclose(out, loop, atol=1e-6))
True

flash-attn's ``(total, H, D)`` layout, through transposed views (no copy):

>>> q_thd = rng.standard_normal((15, 4, 32), dtype=np.float32)
>>> out = fastattn.attention_varlen(q_thd.transpose(1, 0, 2), k, v, cu)
>>> print(out.transpose(1, 0, 2).shape)
(15, 4, 32)
"""

ATTENTION_PAGED = """Attention against paged key/value caches (block tables), read in place.

The keys and values of each sequence lie in fixed-size blocks of a shared
cache: key ``j`` of sequence ``s`` is slot ``j % block_size`` of block
``block_table[s, j // block_size]``.  The kernels read the blocks where they
are through the table, for decode steps (one or a few new tokens per
sequence) and chunked prefill alike, with every option of :func:`attention`:
nothing is gathered into a contiguous cache.  A decode step reads each run of
slots for all key/value heads of a block in turn (one stretch of memory per
block); many query rows against small blocks stage each tile of keys in a
per-thread buffer, as the kernels do for half-precision caches.  Defined by
:func:`fastattn.reference.attention_paged`.

Parameters
----------
q : array_like, shape (S, Hq, Lq, Dk), or (Hq, total_q, Dk) with cu_seqlens_q
    The queries: each sequence's ``Lq`` newest tokens, or, with
    ``cu_seqlens_q``, the queries of every sequence packed along axis 1
    (mixed prefill and decode batches).  The ``n`` queries of a sequence are
    its last positions: query ``i`` sits at position ``seq_lens[s] - n + i``,
    which ``causal="bottom_right"`` uses.
k_cache : array_like, shape (num_blocks, Hkv, block_size, Dk)
    The key cache; any ``block_size >= 1``.  flash-attn's and vLLM's
    ``(num_blocks, block_size, Hkv, D)`` caches pass as
    ``cache.transpose(0, 2, 1, 3)`` without a copy.  float32, float64,
    float16, bfloat16, int8 and float8 (with or without ``k_scale``) caches
    are read in place,
    and so is a :class:`fastattn.QuantizedKV` of that logical shape (either
    cache, or both).
v_cache : array_like, shape (num_blocks, Hkv, block_size, Dv)
    The value cache, with the blocks, heads and slots of ``k_cache``.
block_table : array_like of int, shape (S, max_blocks)
    The blocks of each sequence.  Only the entries covering its
    ``seq_lens[s]`` keys are read, and they must lie in ``[0, num_blocks)``;
    the rest are ignored.
seq_lens : array_like of int, shape (S,)
    The valid keys of each sequence, between its number of query rows and
    ``max_blocks * block_size``.  Cache slots past a sequence's length may
    hold anything, NaN included: they never reach a result.
cu_seqlens_q : array_like of int, shape (S + 1,), optional
    With a packed ``q``: sequence ``s`` owns query rows
    ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]`` (starts at 0, non-decreasing,
    ends at ``total_q``).  A sequence without queries is skipped.
scale : float, optional
    Multiplies ``q @ kᵀ``.  Default ``1 / sqrt(Dk)``.
causal : {False, True, "top_left", "bottom_right"}, optional
    As for :func:`attention`, per sequence (``Lk`` being ``seq_lens[s]``);
    ``"bottom_right"`` is the alignment of new tokens against their cache.
window : int or (int or None, int or None), optional
    Sliding window, as for :func:`attention`, per sequence.
softcap : float, optional
    Soft capping of the scaled scores.
alibi_slopes : array_like, broadcastable to (Hq,), optional
    ALiBi slopes, one per query head.
k_scale : array_like, optional
    Scales of an int8 or float8 ``k_cache``: broadcastable to
    ``k_cache.shape[:-1] + (1,)`` (per tensor, head or slot: paged like the
    cache) or per channel to ``(Hkv, 1, Dk)`` (the same for every block).
v_scale : array_like, optional
    The same for an int8 or float8 ``v_cache``.
sinks : array_like, optional
    Attention sinks, as for :func:`attention`: broadcastable to the query
    batch dims -- ``(S, Hq)`` for a 4-D ``q`` (one per query head, ``(Hq,)``,
    or per sequence and head), ``(Hq,)`` with ``cu_seqlens_q``.
return_lse : bool, optional
    Also return each query row's log-sum-exp.
out : ndarray, optional
    Where to write the output: exactly its shape and dtype, writeable, not
    overlapping an input.
num_threads : int, optional
    Threads for this call.  Results are bit-identical for any thread count.

Returns
-------
out : ndarray
    ``q``'s shape with ``Dk`` replaced by ``Dv`` (the first item of
    ``(out, lse)`` with ``return_lse=True``); zeros for a sequence without
    keys.
lse : ndarray
    Only with ``return_lse=True``: ``q``'s shape without its last axis, in
    the compute dtype (``-inf`` for a sequence without keys).

Raises
------
TypeError
    ``block_table``, ``seq_lens`` or ``cu_seqlens_q`` that are not integers;
    ``k_scale`` / ``v_scale`` for a cache that is neither int8 nor float8; an array of a complex
    or object dtype; a masked array; options or ``out`` of the wrong type.
ValueError
    A ``q`` that is not 4-D (3-D with ``cu_seqlens_q``); caches that are not
    4-D or differ in blocks, heads or block size; ``block_size`` 0; ``Dk``
    of ``q`` and ``k_cache`` that differ; ``Hq`` not a multiple of ``Hkv``;
    sequence counts of ``q``, ``block_table`` and ``seq_lens`` that differ;
    ``seq_lens`` negative, beyond ``max_blocks * block_size`` or smaller than
    a sequence's query rows; a used block-table entry outside
    ``[0, num_blocks)``; bad ``cu_seqlens_q``; a per-channel scale that
    differs between blocks; bad option values or ``out``.  Every check runs
    before any work and names the argument.
MemoryError
    The outputs or the per-thread workspaces cannot be allocated.

See Also
--------
fastattn.reference.attention_paged : The float64 specification.
attention_varlen : Packed sequences with contiguous keys.
attention : Contiguous caches with ``kv_lengths``.

Examples
--------
A decode step of two sequences (13 and 6 cached keys) in blocks of 4, their
blocks scattered over the cache, against :func:`attention` on the gathered
keys:

>>> import numpy as np
>>> import fastattn
>>> rng = np.random.default_rng(0)
>>> k_cache, v_cache = (rng.standard_normal((8, 2, 4, 16), dtype=np.float32) for _ in range(2))
>>> block_table = np.array([[5, 1, 7, 2], [0, 6, 3, 3]])
>>> seq_lens = np.array([13, 6])
>>> q = rng.standard_normal((2, 4, 1, 16), dtype=np.float32)      # 4 query heads, 2 kv heads
>>> out = fastattn.attention_paged(q, k_cache, v_cache, block_table, seq_lens, causal="bottom_right")
>>> print(out.shape)
(2, 4, 1, 16)
>>> k0 = k_cache[block_table[0]].transpose(1, 0, 2, 3).reshape(2, 16, 16)[:, :13]
>>> v0 = v_cache[block_table[0]].transpose(1, 0, 2, 3).reshape(2, 16, 16)[:, :13]
>>> print(np.allclose(out[0], fastattn.attention(q[0], k0, v0), atol=1e-6))
True
"""
