"""Errors of the fast API: right exception type, message naming the argument (and shapes)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import fastattn
from fa_testutil import reference as R

Z = np.zeros


def qkv(B=2, Lq=5, Lk=7, D=8, Dv=4, dtype=np.float64):
    return Z((B, Lq, D), dtype), Z((B, Lk, D), dtype), Z((B, Lk, Dv), dtype)


def word(name):
    """Regex matching ``name`` as a whole word (so 'q' does not match 'requires')."""
    return rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])"


def shape_str(shape):
    return str(tuple(shape))


BOTH = (ValueError, TypeError)


# ------------------------------------------------------------------ shapes
def test_head_dim_mismatch():
    q, k, v = Z((2, 5, 8)), Z((2, 7, 9)), Z((2, 7, 4))
    with pytest.raises(ValueError, match=word("q")) as ei:
        fastattn.attention(q, k, v)
    msg = str(ei.value)
    assert re.search(word("k"), msg), msg
    assert shape_str(q.shape) in msg and shape_str(k.shape) in msg, msg


def test_key_count_mismatch():
    q, k, v = Z((2, 5, 8)), Z((2, 7, 8)), Z((2, 6, 4))
    with pytest.raises(ValueError, match=word("v")) as ei:
        fastattn.attention(q, k, v)
    msg = str(ei.value)
    assert re.search(word("k"), msg), msg
    assert shape_str(k.shape) in msg and shape_str(v.shape) in msg, msg


def test_batch_not_broadcastable():
    q, k, v = Z((2, 5, 8)), Z((3, 7, 8)), Z((3, 7, 4))
    with pytest.raises(ValueError) as ei:
        fastattn.attention(q, k, v)
    msg = str(ei.value)
    assert re.search(word("q"), msg) and re.search(word("k"), msg), msg
    # full shapes or just the batch dims
    assert (shape_str(q.shape) in msg and shape_str(k.shape) in msg) or ("(2,)" in msg and "(3,)" in msg), msg


def test_heads_not_divisible():
    q, k, v = Z((1, 4, 5, 8)), Z((1, 3, 7, 8)), Z((1, 3, 7, 4))
    with pytest.raises(ValueError) as ei:
        fastattn.attention(q, k, v)
    msg = str(ei.value)
    assert re.search(word("q"), msg) and re.search(word("k"), msg), msg
    assert any(s in msg for s in (shape_str(q.shape), shape_str(k.shape), "(1, 4)", "(1, 3)")), msg


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [(), (8,)])
def test_ndim_below_two(which, bad):
    args = dict(zip("qkv", qkv(B=1)))
    args = {n: a[0] for n, a in args.items()}  # 2-D is fine
    fastattn.attention(args["q"], args["k"], args["v"])
    args[which] = Z(bad)
    with pytest.raises(ValueError, match=word(which)):
        fastattn.attention(args["q"], args["k"], args["v"])


# ------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64, object, "U3", "S2"])
def test_bad_dtypes(which, dtype):
    args = dict(zip("qkv", qkv()))
    args[which] = args[which].astype(dtype)
    with pytest.raises(TypeError):
        fastattn.attention(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("dtype", [np.complex128, object, "U3"])
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_bad_dtypes(fn, dtype):
    with pytest.raises(TypeError):
        getattr(fastattn, fn)(np.zeros((3, 4)).astype(dtype))


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("window", [-1, (-1, 0), (0, -2), (None, -1)], ids=str)
def test_negative_window(window):
    with pytest.raises(ValueError, match="window"):
        fastattn.attention(*qkv(), window=window)


@pytest.mark.parametrize("window", ["abc", (1, 2, 3), 1.5, (1.5, 0)], ids=str)
def test_bad_window_type(window):
    with pytest.raises(BOTH, match="window"):
        fastattn.attention(*qkv(), window=window)


@pytest.mark.parametrize("name", ["scale", "softcap"])
def test_scalar_options_zero_d_arrays(name, rng):
    """scale and softcap: a 0-d real array counts as a number, in the fast API and
    in the reference alike; a 1-element array of ndim 1, a bool or a complex does not."""
    q, k, v = (rng.standard_normal((2, 5, 8)) for _ in range(3))
    for ok in (np.array(2.5), np.array(2.5, np.float32), np.array(3)):
        got = fastattn.attention(q, k, v, **{name: ok})
        want = fastattn.attention(q, k, v, **{name: float(ok)})
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(R.attention(q, k, v, **{name: ok}), want, rtol=1e-12, atol=1e-13)
    for bad in (np.array([2.5]), np.array(True), np.array(1 + 2j), np.array("2")):
        for fn in (fastattn.attention, R.attention):
            with pytest.raises(TypeError, match=name):
                fn(q, k, v, **{name: bad})


@pytest.mark.parametrize("softcap", [0, 0.0, -1.0])
def test_bad_softcap(softcap):
    with pytest.raises(ValueError, match="softcap"):
        fastattn.attention(*qkv(), softcap=softcap)


@pytest.mark.parametrize("lens", [np.array([[-1], [3]]), np.array([[8], [3]]), np.array(-2), np.array(100)],
                         ids=["neg", "gt_Lk", "neg_scalar", "big_scalar"])
def test_bad_kv_lengths_values(lens):
    q, k, v = Z((2, 2, 5, 8)), Z((2, 2, 7, 8)), Z((2, 2, 7, 4))
    with pytest.raises(ValueError, match="kv_lengths"):
        fastattn.attention(q, k, v, kv_lengths=lens)


def test_bad_kv_lengths_shape_and_dtype():
    q, k, v = Z((2, 2, 5, 8)), Z((2, 2, 7, 8)), Z((2, 2, 7, 4))
    with pytest.raises(ValueError, match="kv_lengths"):
        fastattn.attention(q, k, v, kv_lengths=np.array([1, 2, 3]))
    with pytest.raises(BOTH, match="kv_lengths"):
        fastattn.attention(q, k, v, kv_lengths=np.array([[1.5], [2.0]]))


def test_non_bool_mask():
    q, k, v = qkv()
    for m in (np.ones((5, 7)), np.ones((5, 7), dtype=np.int8)):
        with pytest.raises(BOTH, match="mask"):
            fastattn.attention(q, k, v, mask=m)


def test_mask_not_broadcastable():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="mask") as ei:
        fastattn.attention(q, k, v, mask=np.ones((7, 5), bool))
    assert "(7, 5)" in str(ei.value), str(ei.value)
    with pytest.raises(ValueError, match="mask"):
        fastattn.attention(q, k, v, mask=np.ones((3, 5, 7), bool))


def test_bias_not_broadcastable():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="bias") as ei:
        fastattn.attention(q, k, v, bias=np.ones((5, 6)))
    assert "(5, 6)" in str(ei.value), str(ei.value)


def test_bias_bad_dtype():
    q, k, v = qkv()
    with pytest.raises(TypeError):
        fastattn.attention(q, k, v, bias=np.ones((5, 7), complex))


def test_alibi_not_broadcastable():
    q, k, v = Z((2, 4, 5, 8)), Z((2, 4, 7, 8)), Z((2, 4, 7, 4))
    with pytest.raises(ValueError, match="alibi_slopes"):
        fastattn.attention(q, k, v, alibi_slopes=np.ones(3))
    with pytest.raises(ValueError, match="alibi_slopes"):
        fastattn.attention(q, k, v, alibi_slopes=np.ones((3, 4)))


@pytest.mark.parametrize("causal", ["diagonal", "bottom-right", "TOP_LEFT"])
def test_bad_causal(causal):
    with pytest.raises(ValueError, match="causal"):
        fastattn.attention(*qkv(), causal=causal)


def test_options_are_keyword_only():
    q, k, v = qkv()
    with pytest.raises(TypeError):
        fastattn.attention(q, k, v, None)  # scale must be passed by keyword


# ------------------------------------------------------------------ out=
def test_out_wrong_shape():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="out"):
        fastattn.attention(q, k, v, out=np.empty((2, 5, 5)))
    with pytest.raises(ValueError, match="out"):
        fastattn.softmax(np.zeros((3, 4)), out=np.empty((4, 3)))


def test_out_wrong_dtype():
    q, k, v = qkv()
    with pytest.raises(BOTH, match="out"):
        fastattn.attention(q, k, v, out=np.empty((2, 5, 4), np.float32))
    with pytest.raises(BOTH, match="out"):
        fastattn.log_softmax(np.zeros((3, 4), np.float32), out=np.empty((3, 4)))


def test_out_read_only():
    q, k, v = qkv()
    o = np.empty((2, 5, 4))
    o.setflags(write=False)
    with pytest.raises(BOTH, match="out"):
        fastattn.attention(q, k, v, out=o)
    s = np.empty((3, 4))
    s.setflags(write=False)
    with pytest.raises(BOTH, match="out"):
        fastattn.softmax(np.zeros((3, 4)), out=s)


def test_out_not_an_array():
    q, k, v = qkv()
    with pytest.raises(BOTH, match="out"):
        fastattn.attention(q, k, v, out=[[0.0] * 4] * 5)


# ------------------------------------------------------------------ num_threads
@pytest.mark.parametrize("nt", [0, -1])
def test_num_threads_non_positive(nt):
    with pytest.raises(ValueError, match="num_threads"):
        fastattn.attention(*qkv(), num_threads=nt)
    with pytest.raises(ValueError, match="num_threads"):
        fastattn.softmax(np.zeros((3, 4)), num_threads=nt)


@pytest.mark.parametrize("nt", [1.5, "2", 2.0])
def test_num_threads_wrong_type(nt):
    with pytest.raises(BOTH, match="num_threads"):
        fastattn.attention(*qkv(), num_threads=nt)
    with pytest.raises(BOTH, match="num_threads"):
        fastattn.log_softmax(np.zeros((3, 4)), num_threads=nt)


def test_num_threads_valid_values():
    q, k, v = qkv()
    for nt in (None, 1, 2, np.int64(2), 64):
        fastattn.attention(q, k, v, num_threads=nt)
        fastattn.softmax(np.zeros((3, 4)), num_threads=nt)


# ------------------------------------------------------------------ softmax axis
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_bad_axis(fn):
    f = getattr(fastattn, fn)
    with pytest.raises(ValueError, match="axis"):
        f(np.zeros((3, 4)), axis=2)
    with pytest.raises(ValueError, match="axis"):
        f(np.zeros((3, 4)), axis=-3)
    with pytest.raises(BOTH):
        f(np.zeros((3, 4)), axis=1.0)


# ------------------------------------------------------------------ merge_attention
def test_merge_errors():
    with pytest.raises(ValueError):
        fastattn.merge_attention([], [])
    with pytest.raises(ValueError):
        fastattn.merge_attention([np.zeros((3, 2))], [np.zeros(3), np.zeros(3)])
    with pytest.raises(ValueError, match="lses") as ei:
        fastattn.merge_attention([np.zeros((3, 2))], [np.zeros(4)])
    assert "(4,)" in str(ei.value) or "(3,)" in str(ei.value), str(ei.value)
    with pytest.raises(ValueError, match="outs|output"):
        fastattn.merge_attention([np.zeros((3, 2)), np.zeros((3, 3))], [np.zeros(3), np.zeros(3)])


# ------------------------------------------------------------------ errors leave inputs alone
def test_failed_call_leaves_out_and_inputs_untouched():
    q, k, v = qkv()
    q[:] = 1.0
    o = np.full((2, 5, 4), 7.0)
    with pytest.raises(ValueError):
        fastattn.attention(q, k, v, out=o, window=-1)
    np.testing.assert_array_equal(o, 7.0)
    np.testing.assert_array_equal(q, 1.0)


def test_reference_and_fast_agree_on_error_types():
    """The reference raises the same exception types for the same bad calls."""
    q, k, v = qkv()
    calls = [
        dict(args=(Z((2, 5, 8)), Z((2, 7, 9)), Z((2, 7, 4))), kw={}),
        dict(args=(q, k, Z((2, 6, 4))), kw={}),
        dict(args=(q, k, v), kw=dict(window=-1)),
        dict(args=(q, k, v), kw=dict(softcap=0.0)),
        dict(args=(q, k, v), kw=dict(kv_lengths=np.array(9))),
        dict(args=(q, k, v), kw=dict(mask=np.ones((7, 5), bool))),
        dict(args=(q, k, v), kw=dict(bias=np.ones((5, 6)))),
        dict(args=(q, k, v), kw=dict(causal="nope")),
        dict(args=(q.astype(complex), k, v), kw={}),
    ]
    for c in calls:
        with pytest.raises(BOTH) as e_ref:
            R.attention(*c["args"], **c["kw"])
        with pytest.raises(BOTH) as e_fast:
            fastattn.attention(*c["args"], **c["kw"])
        assert e_ref.type is e_fast.type, (c["kw"], e_ref.value, e_fast.value)
