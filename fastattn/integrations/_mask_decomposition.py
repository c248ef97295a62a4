"""A boolean attention mask as the cheapest fastattn options that reproduce it.

A full (..., Lq, Lk) mask stops the kernels from skipping invisible key tiles
(issue 28: 512 tokens, 1.66 ms with a full causal mask, 0.84 ms with
``causal=True``).  Masks built by transformers are nearly always a causal band
(a diagonal at some offset, maybe a sliding window) intersected with a
per-key visibility row (padding, unfilled static-cache slots).  :func:`decompose`
finds such a structure, expresses it as ``causal`` / ``window`` /
``kv_lengths`` / ``kv_start`` / a per-key ``mask`` of shape (..., 1, Lk), then builds the mask
those options mean (:func:`implied_mask`, fastattn's visibility rule) and
compares it with the given one, element for element: a decomposition is used
only when it reproduces the mask exactly, otherwise the full mask is passed.

The comparison costs a few passes over the mask's booleans (a wrong candidate is
rejected on three rows first): milliseconds for one 2048 × 2048 mask, less than
transformers takes to build it, and the backend does it once per mask tensor,
not once per layer.  NumPy only; no torch here.
"""
import numpy as np

__all__ = ["decompose", "implied_mask"]


def implied_mask(shape, causal=False, window=None, kv_lengths=None, kv_start=None, mask=None, rows=None):
    """The boolean visibility (True = may attend) that fastattn's options mean, for
    scores of ``shape`` = (..., Lq, Lk): the rule of ``fastattn.reference.attention``.

    ``kv_lengths`` and ``kv_start`` are integer arrays broadcastable to ``shape[:-2]``
    (keys ``j >= kv_lengths`` and ``j < kv_start`` invisible); ``mask`` a
    boolean array broadcastable to ``shape`` (one row, (..., 1, Lk), when ``rows``
    is given); ``window`` None or (left, right) with None sides.  ``rows``: only
    these query rows (the result then has ``len(rows)`` rows)."""
    *batch, Lq, Lk = shape
    batch = tuple(batch)
    i = (np.arange(Lq) if rows is None else np.asarray(rows))[:, None]
    j = np.arange(Lk)[None, :]
    lk = np.full(batch + (1, 1), Lk) if kv_lengths is None else \
        np.broadcast_to(np.asarray(kv_lengths), batch)[..., None, None]
    pos = i + lk - Lq if causal == "bottom_right" else i
    visible = j < lk
    if causal:
        visible = visible & (j <= pos)
    left, right = window if window is not None else (None, None)
    if left is not None:
        visible = visible & (j >= pos - left)
    if right is not None:
        visible = visible & (j <= pos + right)
    if kv_start is not None:
        visible = visible & (j >= np.broadcast_to(np.asarray(kv_start), batch)[..., None, None])
    if mask is not None:
        visible = visible & mask
    return np.broadcast_to(visible, batch + (i.shape[0], Lk))


def _squeeze_broadcast_dims(mask):
    """A view of ``mask`` with size-1 dims where it was broadcast (stride 0): a mask
    expanded over the batch (transformers does that without padding) is read once."""
    index = tuple(slice(0, 1) if st == 0 and n > 1 else slice(None)
                  for st, n in zip(mask.strides[:-2], mask.shape[:-2]))
    return mask[index + (Ellipsis,)]


def _key_ranges(keys):
    """(start, stop) per row of ``keys`` (..., Lk) when every row's True entries form
    one contiguous run ([0, 0) for an empty row); None otherwise."""
    Lk = keys.shape[-1]
    any_key = keys.any(axis=-1)
    start = np.where(any_key, keys.argmax(axis=-1), 0)
    stop = np.where(any_key, Lk - keys[..., ::-1].argmax(axis=-1), 0)
    count = keys.sum(axis=-1)
    if not np.array_equal(count, stop - start):
        return None
    return start, stop


def _diagonal_offset(m):
    """d where the mask's rows end at key i + d: from the last query row, the row
    that sees the most keys in a causal mask (its last visible key is the query's
    own position unless that key is padding)."""
    last = m[..., -1, :]
    seen = last.any(axis=-1)
    if not seen.any():
        return None
    hi = last.shape[-1] - 1 - last[..., ::-1].argmax(axis=-1)
    return int(hi[seen].max()) - (m.shape[-2] - 1)


def _key_options(keys):
    """Ways to say the per-key row ``keys`` (..., Lk), cheapest first."""
    Lk = keys.shape[-1]
    ranges = _key_ranges(keys)
    if ranges is not None:
        if (ranges[0] == 0).all():
            yield {} if (ranges[1] == Lk).all() else {"kv_lengths": ranges[1]}
        else:
            # left padding: keys j < kv_start invisible (the leading tiles skipped)
            yield ({"kv_start": ranges[0]} if (ranges[1] == Lk).all()
                   else {"kv_start": ranges[0], "kv_lengths": ranges[1]})
    yield {"mask": keys[..., None, :]}             # (..., 1, Lk): read per key, cheaply


def _band_options(shape, d, left, kopts):
    """``kopts`` with the band ``i + d - left <= j <= i + d`` (left None: unbounded)
    in fastattn's terms, or None where they cannot say it."""
    Lq, Lk = shape[-2:]
    stop = kopts.get("kv_lengths")
    causal = None
    if stop is not None and (stop - Lq == d).all():
        causal = "bottom_right"                     # p(i) = i + kv_length - Lq
    elif d == 0:
        causal = True
    elif stop is None and d == Lk - Lq:
        causal = "bottom_right"
    if causal is not None:
        return dict(kopts, causal=causal, **({} if left is None else {"window": (left, None)}))
    if d > 0 and (left is None or left >= d):
        # any other diagonal: a window around p(i) = i, without the causal flag
        return dict(kopts, window=(None if left is None else left - d, d))
    return None


def _candidates(shape, offsets, left, keys):
    """Option sets for a band with its diagonal at key i + d (d in ``offsets``; None:
    no band) intersected with a per-key row, the ones without a mask first.

    The per-key row is ``keys`` (the keys some query sees) or, for a band, the
    same with the keys the band hides from every row made visible (a sliding
    window's old keys, a static cache's unfilled slots): either may give the
    cheaper options."""
    Lq, Lk = shape[-2:]
    found = []
    for d in offsets:
        rows = [keys]
        if d is not None:
            lo, hi = (0 if left is None else max(0, d - left)), max(0, min(Lk, Lq + d))
            if lo > 0 or hi < Lk:
                widened = keys.copy()
                widened[..., :lo] = True
                widened[..., hi:] = True
                rows.append(widened)
        for row in rows:
            for kopts in _key_options(row):
                options = dict(kopts) if d is None else _band_options(shape, d, left, kopts)
                if options is not None:
                    found.append(options)
    # no mask first; kv_start only where nothing else says it (a band's own left edge
    # is cheaper said by its window)
    return sorted(found, key=lambda o: ("mask" in o, "kv_start" in o))


def decompose(mask, is_causal=True, sliding_window=None):
    """fastattn options equivalent to the boolean ``mask`` (..., Lq, Lk).

    Parameters
    ----------
    mask : ndarray of bool, shape (..., Lq, Lk)
        True where a query may attend to a key (transformers' sdpa masks:
        (B, 1, Lq, Lk), possibly expanded over B with stride 0).
    is_causal : bool
        A hint: try a causal band first (else: a per-key row first).
    sliding_window : int, optional
        A hint: transformers' sliding window (keys ``j > i - sliding_window``).

    Returns
    -------
    dict
        Options for ``fastattn.attention`` (``causal``, ``window``,
        ``kv_lengths``, ``kv_start``, ``mask``) whose visibility equals ``mask`` exactly
        (checked); ``{"mask": mask}`` when no cheaper form reproduces it.
    """
    full = {"mask": mask}
    if mask.ndim < 2 or mask.size == 0:
        return full
    m = _squeeze_broadcast_dims(mask)
    Lq, Lk = m.shape[-2:]
    keys = m.any(axis=-2)                          # (..., Lk): keys some query sees
    if Lq == 1:
        offsets = [None]
    else:
        d = _diagonal_offset(m)
        band = [o for o in dict.fromkeys((d, Lk - Lq, 0)) if o is not None]
        offsets = band + [None] if is_causal else [None] + band
    lefts = [None] if sliding_window is None else [int(sliding_window) - 1, None]
    # a wrong candidate nearly always shows in the first, middle or last row: check
    # those (O(Lk)) before the whole mask
    probe = sorted({0, Lq // 2, Lq - 1})
    for left in lefts:
        for options in _candidates(m.shape, offsets, left, keys):
            if (np.array_equal(implied_mask(m.shape, rows=probe, **options), m[..., probe, :])
                    and np.array_equal(implied_mask(m.shape, **options), m)):
                return options
    return full
