"""Packed and paged batches in the reference (pure NumPy, float64).

Part of :mod:`fastattn.reference` (the specification): :func:`attention_varlen`
(variable-length sequences packed along one axis, ``cu_seqlens``) and
:func:`attention_paged` (keys and values in paged caches, block tables), both
checked as a whole first and then computed as :func:`attention
<fastattn.reference.attention>` per sequence.
"""
from __future__ import annotations

import numpy as np

from ._reference_attention import attention
from ._reference_checks import (_as_f64, _broadcast_arg, _check_causal, _check_scale, _check_softcap,
                                _check_window, _kv_input, _kv_scaled)
from ._reference_sinks import check_sinks


# --------------------------------------------------------------------------- checks
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


# --------------------------------------------------------------------------- packed
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


# --------------------------------------------------------------------------- paged
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
    sinks : array_like, optional
        Attention sinks, as for :func:`attention`: broadcastable to the query
        batch dims, ``(S, Hq)`` for a 4-D ``q`` (one per query head, e.g.
        ``(Hq,)``, or per sequence and head), ``(Hq,)`` with ``cu_seqlens_q``.
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
    if sinks is not None:   # per query head, or (S, Hq) per sequence and head when q is (S, Hq, Lq, Dk)
        sinks = check_sinks(sinks, (hq,) if packed else (n_seq, hq))
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
                                             softcap=softcap, alibi_slopes=alibi_slopes,
                                             sinks=None if sinks is None else sinks if packed else sinks[s],
                                             return_lse=True)
    if not packed:
        out = np.moveaxis(out.reshape(hq, n_seq, q.shape[2], out.shape[-1]), 1, 0)
        lse = np.moveaxis(lse.reshape(hq, n_seq, q.shape[2]), 1, 0)
    return (out, lse) if return_lse else out
