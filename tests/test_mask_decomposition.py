"""fastattn.integrations._mask_decomposition: boolean masks as cheap fastattn options,
used only when they reproduce the mask exactly (NumPy only: runs without torch)."""
import numpy as np
import pytest

import fastattn
from fastattn.integrations._mask_decomposition import decompose, implied_mask


def _band(Lq, Lk, d, left=None):
    """transformers' causal (sliding-window) pattern with the diagonal at key i + d."""
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    m = j <= i + d
    if left is not None:
        m &= j >= i + d - left
    return m


def _keys(Lk, starts, stops):
    j = np.arange(Lk)
    return np.stack([(j >= s) & (j < e) for s, e in zip(starts, stops)])[:, None, None, :]   # (B, 1, 1, Lk)


def _attend(options, shape, rng):
    B, Lq, Lk = shape[0], shape[-2], shape[-1]
    q = rng.standard_normal((B, 4, Lq, 8))
    k, v = rng.standard_normal((B, 2, Lk, 8)), rng.standard_normal((B, 2, Lk, 8))
    return q, k, v


# ------------------------------------------------------------------ implied_mask is fastattn's rule

OPTION_SETS = [
    {},
    {"causal": True},
    {"causal": "bottom_right"},
    {"causal": "bottom_right", "kv_lengths": np.array([[9], [5]])},
    {"causal": True, "window": (3, None)},
    {"causal": "bottom_right", "window": (2, None), "kv_lengths": np.array([[11], [7]])},
    {"window": (None, 4)},
    {"window": (2, 3)},
    {"kv_lengths": np.array([[3], [11]])},
    {"mask": np.arange(11) % 3 != 1},
    {"causal": True, "kv_lengths": np.array([[8], [6]]), "mask": np.arange(11) > 1},
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(o) or "none")
@pytest.mark.parametrize("Lq", [1, 6, 11, 15])
def test_implied_mask_is_what_fastattn_computes(rng, options, Lq):
    Lk = 11
    q, k, v = _attend(options, (2, 1, Lq, Lk), rng)
    vis = implied_mask((2, 4, Lq, Lk), **options)
    want = fastattn.attention(q, k, v, mask=vis)
    np.testing.assert_allclose(fastattn.attention(q, k, v, **options), want, rtol=1e-12, atol=1e-12)
    # and the reference agrees on which keys are visible: weights vanish exactly where vis is False
    _, w = fastattn.reference.attention(q, k, v, return_weights=True, **options)
    assert not np.any(w[~vis])
    rows = [0, Lq - 1]
    np.testing.assert_array_equal(implied_mask((2, 4, Lq, Lk), rows=rows, **options), vis[..., rows, :])


# ------------------------------------------------------------------ decompositions

def _check(mask, expect, rng, **hints):
    """decompose(mask) reproduces mask exactly, takes the expected option names, and
    gives attention equal to the full mask's."""
    options = decompose(mask, **hints)
    assert set(options) == set(expect), options
    if "mask" in options:
        assert options["mask"].shape[-2] == 1, "a per-key row, not a full mask"
    np.testing.assert_array_equal(implied_mask(mask.shape, **options), mask)
    q, k, v = _attend(options, mask.shape, rng)
    np.testing.assert_allclose(fastattn.attention(q, k, v, **options), fastattn.attention(q, k, v, mask=mask),
                               rtol=1e-12, atol=1e-12)
    return options


def test_causal_prefill_and_kv_cache_continuation(rng):
    # prefill: top-left; a continuation of 4 queries after 9 cached keys: bottom-right
    o = _check(np.broadcast_to(_band(7, 7, 0), (2, 1, 7, 7)), {"causal"}, rng)
    assert o["causal"] is True
    o = _check(np.broadcast_to(_band(4, 13, 9), (2, 1, 4, 13)), {"causal"}, rng)
    assert o["causal"] == "bottom_right"


def test_static_cache_prefill_and_decode(rng):
    # static cache of 16 slots: the first 6 queries fill slots 0..5 (top-left); later
    # queries at positions 6..8 see slots <= their position: bottom-right on kv_lengths
    o = _check(np.broadcast_to(_band(6, 16, 0), (2, 1, 6, 16)), {"causal", "kv_lengths"}, rng)
    assert o["causal"] == "bottom_right" and (o["kv_lengths"] == 6).all()     # the same as top-left here
    m = np.broadcast_to(_band(3, 16, 6), (2, 1, 3, 16))
    o = _check(m, {"causal", "kv_lengths"}, rng)
    assert o["causal"] == "bottom_right" and (o["kv_lengths"] == 9).all()
    # one decode query: only the filled slots, as lengths
    o = _check(np.broadcast_to(np.arange(16) < 10, (2, 1, 1, 16)), {"kv_lengths"}, rng)
    assert (o["kv_lengths"] == 10).all()


def test_left_padding_is_kv_start(rng):
    keys = _keys(12, [0, 3], [12, 12])
    o = _check(_band(12, 12, 0) & keys, {"causal", "kv_start"}, rng)
    np.testing.assert_array_equal(o["kv_start"].ravel(), [0, 3])
    _check(np.broadcast_to(keys, (2, 1, 1, 12)), {"kv_start"}, rng)             # decode
    _check(_band(5, 12, 7) & keys, {"causal", "kv_start"}, rng)                 # continuation
    _check(_band(12, 12, 0, left=3) & keys, {"causal", "window", "kv_start"}, rng, sliding_window=4)
    # left and right padding at once
    _check(_band(12, 12, 0) & _keys(12, [2, 3], [12, 9]), {"causal", "kv_start", "kv_lengths"}, rng)


def test_right_padding_is_kv_lengths(rng):
    keys = _keys(10, [0, 0], [10, 6])
    o = _check(_band(10, 10, 0) & keys, {"causal", "kv_lengths"}, rng)
    np.testing.assert_array_equal(o["kv_lengths"].ravel(), [10, 6])
    # every sequence padded: the diagonal is not seen in the last row
    _check(_band(10, 10, 0) & _keys(10, [0, 0], [8, 6]), {"causal", "kv_lengths"}, rng)
    # an encoder (not causal) with padding
    _check(np.broadcast_to(keys, (2, 1, 10, 10)), {"kv_lengths"}, rng, is_causal=False)


def test_sliding_window(rng):
    m = np.broadcast_to(_band(12, 12, 0, left=3), (1, 1, 12, 12))
    o = _check(m, {"causal", "window"}, rng, sliding_window=4)
    assert o["window"] == (3, None)
    # no hint: the window is not guessed, the full mask is kept (still exact)
    assert set(decompose(m)) == {"mask"}
    # a sliding-window cache continuation
    _check(np.broadcast_to(_band(3, 9, 6, left=4), (2, 1, 3, 9)), {"causal", "window"}, rng, sliding_window=5)
    # the diagonal at i + 5 ends a key range of 8 but not one of 6 (a static cache
    # continuation with different lengths): a window around p(i) = i, no causal flag
    o = _check(np.broadcast_to(_band(3, 12, 5), (2, 1, 3, 12)) & _keys(12, [0, 0], [8, 6]),
               {"window", "kv_lengths"}, rng)
    assert o["window"] == (None, 5)
    o = _check(np.broadcast_to(_band(3, 12, 5, left=6), (2, 1, 3, 12)) & _keys(12, [0, 0], [8, 6]),
               {"window", "kv_lengths"}, rng, sliding_window=7)
    assert o["window"] == (1, 5)


def test_expanded_masks_are_read_once(rng):
    m = np.broadcast_to(_band(8, 8, 0), (4, 1, 8, 8))       # stride 0 over the batch
    o = _check(m, {"causal"}, rng)
    m = np.broadcast_to(np.arange(8) < 5, (4, 1, 8, 8))
    o = _check(m, {"kv_lengths"}, rng, is_causal=False)
    assert o["kv_lengths"].shape == (1, 1)


def test_anything_else_keeps_the_full_mask(rng):
    base = _band(9, 9, 0) & _keys(9, [0, 2], [9, 9])
    for b, i, j in [(0, 4, 1), (1, 8, 5), (1, 0, 0), (0, 0, 1)]:   # one element flipped
        m = base.copy()
        m[b, 0, i, j] = not m[b, 0, i, j]
        options = decompose(m)
        assert set(options) == {"mask"} and options["mask"] is m
    rand = rng.random((2, 1, 9, 9)) < 0.5
    assert decompose(rand)["mask"] is rand
    # a band with a hole inside it (a per-query pattern, not per key)
    m = _band(9, 9, 0)[None, None].copy()
    m[..., 5, 2] = False
    assert set(decompose(m)) == {"mask"}


def test_rows_without_keys(rng):
    # left padding: padded query rows see nothing, and give 0 as with the full mask
    m = _band(6, 6, 0) & _keys(6, [0, 4], [6, 6])
    _check(m, {"causal", "kv_start"}, rng)
    m = _band(6, 6, 0) & _keys(6, [0, 6], [6, 6])      # one sequence all padding
    _check(m, {"causal", "kv_lengths"}, rng)
    options = decompose(np.zeros((2, 1, 4, 5), bool))
    assert "mask" not in options and (options["kv_lengths"] == 0).all()
