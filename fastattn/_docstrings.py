"""The docstrings of fastattn's public functions, in NumPy style.

Kept apart from the code: ``fastattn.attention`` is a compiled function whose
docstring is assigned at import (``fastattn._api``), and the argument path that
implements these functions is compiled too.  Each docstring's Examples run as
doctests in CI.
"""

ATTENTION = """Exact scaled dot-product attention, ``softmax(q @ kᵀ * scale + ...) @ v``.

Parameters
----------
q : array_like, shape (..., Lq, Dk)
k : array_like, shape (..., Lk, Dk)
v : array_like, shape (..., Lk, Dv)
    Leading (batch) dims broadcast by NumPy rules without copies.  When the
    head axis (-3) of ``q`` is g > 1 times that of ``k``/``v`` (one key/value
    head included), query head h uses key/value head h // g (grouped- and
    multi-query attention): each key and value is read once for its group.
scale : float, optional
    Multiplies the scores; default ``1 / sqrt(Dk)``.
causal : {False, True, "top_left", "bottom_right"}
    ``True``/"top_left": query i sees keys j <= i.  "bottom_right": query i
    sees keys j <= i + Lk_eff - Lq (KV-cache alignment).
mask : bool array broadcastable to (..., Lq, Lk), optional
    True where a query may attend to a key.
bias : float array broadcastable to (..., Lq, Lk), optional
    Added to the (scaled, soft-capped) scores.
window : int or (left, right), optional
    Key j is visible iff p(i) - left <= j <= p(i) + right (None = unbounded).
kv_lengths : int array broadcastable to the batch dims, optional
    Keys j >= length are invisible.
softcap : float > 0, optional
    Scores s become softcap * tanh(s / softcap) before bias and masking.
alibi_slopes : float array broadcastable to the batch dims, optional
    Adds -slope * |p(i) - j| to each score.
return_weights, return_lse : bool
    Also return the attention weights (..., Lq, Lk) and the log-sum-exp of
    each row (..., Lq).
out : ndarray, optional
    Written in place and returned; exactly the result's shape and dtype.
num_threads : int, optional
    Threads for this call (default: ``fastattn.get_num_threads()``).

Returns
-------
out, or the tuple (out, weights, lse) with only the parts asked for.
A query row that sees no key gives output 0, weights 0 and lse -inf.
"""

SOFTMAX = """Max-stabilised softmax along ``axis`` (an int, or None for the whole array).

    A slice that is entirely -inf gives zeros; +inf or NaN in a slice gives NaN
    in that slice only.  float32/float64 are computed natively, float16 in
    float32, integers and bools in float64.
    """

LOG_SOFTMAX = """``log(softmax(x))`` computed stably as ``x - max - log(sum(exp(x - max)))``.

    A slice that is entirely -inf gives -inf; +inf or NaN gives NaN.
    """

MERGE_ATTENTION = """Combine attention results computed over disjoint sets of keys.

    Parameters
    ----------
    outs : sequence of arrays (..., Lq, Dv)
        Each part's (normalised) attention output.
    lses : sequence of arrays (..., Lq)
        Each part's log-sum-exp (``attention(..., return_lse=True)``).

    Returns
    -------
    (out, lse) over the union of the keys.  Rows that no part saw stay 0 / -inf.
    """
