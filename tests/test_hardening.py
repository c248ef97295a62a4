"""Hardening: a table of bad / extreme inputs and what each must do.

Every row of ``ATTENTION_CASES`` / ``SOFTMAX_CASES`` / ``MERGE_CASES`` is one call with
an expected outcome: an exception type (the call must raise exactly that kind of
error) or ``REF`` (a defined result, checked against :mod:`fastattn.reference`
including NaN / inf positions) or a custom checker (huge broadcast inputs, where the
reference cannot run on the whole array).  After every call, successful or not,
every input array must be bit-for-bit unchanged (its memory, shape, strides, dtype
and write flag); an ``out=`` array must also be unchanged when the call fails.

``markdown_table()`` renders the table for the README ("Errors" section).
"""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import textwrap
import zlib
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest

import fastattn
from fa_testutil import assert_close, child_process_env, expected_dtype
from fa_testutil import reference as R

f16, f32, f64 = np.float16, np.float32, np.float64
REF = "reference"          # defined result, compared with fastattn.reference


class Case(NamedTuple):
    name: str
    group: str                                  # README grouping
    what: str                                   # human description of the input
    make: Callable[[], tuple]                   # -> (fn, args, kwargs), fresh arrays
    expect: Any                                 # exception type, REF, or checker(result, args, kwargs)
    match: str | None = None                    # regex the error message must match


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _qkv(B=2, H=2, Lq=5, Lk=7, D=8, Dv=4, dtype=f64, shapes=None):
    rng = _rng(B, H, Lq, Lk, D, Dv, str(dtype), shapes)
    if shapes is None:
        shapes = ((B, H, Lq, D), (B, H, Lk, D), (B, H, Lk, Dv))
    return tuple(rng.standard_normal(s).astype(dtype) for s in shapes)


def att(*, qkv=None, dtype=f64, shapes=None, mod=None, **kw):
    """A factory for an attention call: default (2, 2, 5|7, 8|4) inputs, optionally
    replaced (``qkv``), reshaped (``shapes``) or modified (``mod(q, k, v) -> (q, k, v)``);
    kwargs are evaluated lazily when callables (so out= buffers etc. are fresh)."""
    def make():
        q, k, v = qkv() if qkv is not None else _qkv(dtype=dtype, shapes=shapes)
        if mod is not None:
            q, k, v = mod(q, k, v)
        kwargs = {key: (val(q, k, v) if callable(val) else val) for key, val in kw.items()}
        return fastattn.attention, (q, k, v), kwargs
    return make


def sm(x, fn="softmax", **kw):
    def make():
        xx = x() if callable(x) else x
        kwargs = {key: (val(xx) if callable(val) else val) for key, val in kw.items()}
        return getattr(fastattn, fn), (xx,), kwargs
    return make


def X(shape=(3, 4, 9), dtype=f64):
    return lambda: _rng("x", shape, str(dtype)).standard_normal(shape).astype(dtype)


def _set(a, idx, val):
    a = np.array(a, copy=True)
    a[idx] = val
    return a


def _readonly(a):
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def _self_overlapping(shape, dtype=f64):
    """A writeable view whose elements all share one memory location."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=shape, strides=(0,) * len(shape))


def _big(shape, dtype=f64, seed=0):
    """A read-only broadcast view of ``shape`` backed by one random row (no memory)."""
    if shape[-1] > 2**16:   # huge last dim: one repeated value
        return np.broadcast_to(np.full(1, 0.5, dtype), shape)
    row = _rng("big", seed, str(dtype)).standard_normal(shape[-1]).astype(dtype)
    return np.broadcast_to(row, shape)


def _strided_out(shape, dtype=f64):
    buf = np.full(shape[:-1] + (2 * shape[-1] + 1,), 99.0, dtype)
    return buf[..., 1::2]


S = (2, 2, 5, 4)       # default attention output shape
SC = (2, 2, 5, 7)      # default score shape


# ------------------------------------------------------------------ huge (> 2**31 elements) checkers
BIG_B = 2**20          # batch of the huge-batch cases: q has 2**20 * 4 * 1 * 512 = 2**31 elements


def _huge_batch_case():
    rng = _rng("huge")
    qb = rng.standard_normal((1, 4, 1, 512)).astype(f32)
    kb = rng.standard_normal((1, 4, 3, 512)).astype(f32) * 0.05
    vb = rng.standard_normal((1, 4, 3, 2)).astype(f32)
    q = np.broadcast_to(qb, (BIG_B, 4, 1, 512))
    k = np.broadcast_to(kb, (BIG_B, 4, 3, 512))
    v = np.broadcast_to(vb, (BIG_B, 4, 3, 2))
    lens = np.broadcast_to((np.arange(BIG_B) % 4)[:, None], (BIG_B, 4))
    return fastattn.attention, (q, k, v), dict(kv_lengths=lens, return_lse=True)


def _check_huge_batch(res, args, kw):
    out, lse = res
    q, k, v = args
    assert out.shape == (BIG_B, 4, 1, 2) and lse.shape == (BIG_B, 4, 1)
    for b in (0, 1, 2, 3, 5, 2**19 + 2, BIG_B - 1):
        ro, rl = R.attention(q[b], k[b], v[b], kv_lengths=kw["kv_lengths"][b], return_lse=True)
        assert_close(out[b], ro, what=f"out[{b}]")
        assert_close(lse[b], rl, what=f"lse[{b}]")


LONG_L = 2**22         # rows of the huge-Lq cases: q has 2**22 * 512 = 2**31 elements


def _huge_rows_case(**kw):
    def make():
        q = _big((LONG_L, 512), f32, seed=1)
        rng = _rng("huge-rows")
        k = rng.standard_normal((3, 512)).astype(f32) * 0.05
        v = rng.standard_normal((3, 2)).astype(f32)
        return fastattn.attention, (q, k, v), dict(kw)
    return make


def _check_huge_rows(res, args, kw):
    res = res if isinstance(res, tuple) else (res,)
    q, k, v = args
    rows = np.array([0, 1, 63, 64, 2**21 + 7, LONG_L - 2, LONG_L - 1])
    kw = {key: val for key, val in kw.items() if key != "num_threads"}
    causal = kw.pop("causal", False)
    for i in rows:
        # row i of a causal bottom_right problem sees keys j <= i + Lk - Lq
        if causal == "bottom_right":
            n_vis = max(0, min(3, i + 3 - LONG_L + 1))
            sub = R.attention(q[i:i + 1], k[:max(n_vis, 0)], v[:max(n_vis, 0)], **kw)
        else:
            sub = R.attention(q[i:i + 1], k, v, **kw)
        sub = sub if isinstance(sub, tuple) else (sub,)
        for part, (got, want) in enumerate(zip(res, sub)):
            if got.ndim == 2 and want.shape[-1] != got.shape[-1]:   # weights of a clipped key range
                want = np.pad(want, ((0, 0), (0, got.shape[-1] - want.shape[-1])))
            assert_close(got[i:i + 1], want, what=f"part {part} row {i}")


def _out_is_bias():
    q, k, v = _qkv(shapes=((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 7)))
    bias = np.zeros((2, 2, 5, 7))
    return fastattn.attention, (q, k, v), dict(bias=bias, out=bias)


# ------------------------------------------------------------------ the attention table
def _A(name, group, what, make, expect, match=None):
    return Case(name, group, what, make, expect, match)


def _with_nan(which, idx, val):
    def mod(q, k, v):
        arrs = {"q": q, "k": k, "v": v}
        arrs[which] = _set(arrs[which], idx, val)
        return arrs["q"], arrs["k"], arrs["v"]
    return mod


ATTENTION_CASES = [
    # ---- dimensions and shapes
    _A("q_1d", "shape", "q 1-D", att(mod=lambda q, k, v: (q[0, 0, 0], k, v)), ValueError, r"\bq\b"),
    _A("k_0d", "shape", "k 0-D", att(mod=lambda q, k, v: (q, k[0, 0, 0, 0], v)), ValueError, r"\bk\b"),
    _A("v_1d", "shape", "v 1-D", att(mod=lambda q, k, v: (q, k, v[0, 0, 0])), ValueError, r"\bv\b"),
    _A("dk_mismatch", "shape", "q and k last dims differ (Dk 8 vs 9)",
       att(shapes=((2, 2, 5, 8), (2, 2, 7, 9), (2, 2, 7, 4))), ValueError, "Dk"),
    _A("lk_mismatch", "shape", "k and v key counts differ (Lk 7 vs 6)",
       att(shapes=((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 6, 4))), ValueError, "Lk"),
    _A("batch_mismatch", "shape", "batch dims of q and k/v do not broadcast (2 vs 3)",
       att(shapes=((2, 2, 5, 8), (3, 2, 7, 8), (3, 2, 7, 4))), ValueError, "broadcast"),
    _A("kv_batch_mismatch", "shape", "batch dims of k and v do not broadcast",
       att(shapes=((2, 2, 5, 8), (2, 2, 7, 8), (3, 2, 7, 4))), ValueError, "broadcast"),
    _A("heads_not_divisible", "shape", "query heads not a multiple of key/value heads (4 vs 3)",
       att(shapes=((2, 4, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4))), ValueError),
    _A("gqa_more_kv_heads", "shape", "more key/value heads than query heads (2 vs 4)",
       att(shapes=((2, 2, 5, 8), (2, 4, 7, 8), (2, 4, 7, 4))), ValueError),
    _A("broadcast_batch", "shape", "batch dims broadcast (q (1,2), k (2,1), v (2))",
       att(shapes=((1, 2, 5, 8), (2, 1, 7, 8), (2, 7, 4))), REF),
    _A("gqa", "shape", "grouped-query heads (4 query heads over 2)",
       att(shapes=((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 4)), causal=True), REF),
    _A("mqa_2d_kv", "shape", "2-D k/v shared by every batch element and head",
       att(shapes=((2, 3, 5, 8), (7, 8), (7, 4))), REF),
    # ---- mask / bias / kv_lengths / alibi_slopes shapes
    _A("mask_not_broadcastable", "broadcast", "mask (Lk, Lq) instead of (Lq, Lk)",
       att(mask=np.ones((7, 5), bool)), ValueError, "mask"),
    _A("mask_batch_mismatch", "broadcast", "mask batch dim 3 vs 2",
       att(mask=np.ones((3, 1, 5, 7), bool)), ValueError, "mask"),
    _A("mask_too_many_dims", "broadcast", "mask with more dims than the scores",
       att(mask=np.ones((1, 2, 2, 5, 7), bool)), ValueError, "mask"),
    _A("mask_1d", "broadcast", "mask of shape (Lk,) (broadcasts over queries)",
       att(mask=np.array([True, False, True, True, False, True, True])), REF),
    _A("mask_list", "broadcast", "mask as a nested list of bools",
       att(mask=[[True] * 3 + [False] * 4] * 5), REF),
    _A("bias_not_broadcastable", "broadcast", "bias (5, 6) for (5, 7) scores",
       att(bias=np.ones((5, 6))), ValueError, "bias"),
    _A("bias_batch_mismatch", "broadcast", "bias batch dim 3 vs 2",
       att(bias=np.ones((3, 2, 5, 7))), ValueError, "bias"),
    _A("kv_lengths_shape", "broadcast", "kv_lengths (3,) for batch (2, 2)",
       att(kv_lengths=np.array([1, 2, 3])), ValueError, "kv_lengths"),
    _A("kv_lengths_too_many_dims", "broadcast", "kv_lengths with more dims than the batch",
       att(kv_lengths=np.ones((1, 2, 2), int)), ValueError, "kv_lengths"),
    _A("alibi_shape", "broadcast", "alibi_slopes (3,) for batch (2, 2)",
       att(alibi_slopes=np.ones(3)), ValueError, "alibi_slopes"),
    _A("alibi_2d_mismatch", "broadcast", "alibi_slopes (3, 2) for batch (2, 2)",
       att(alibi_slopes=np.ones((3, 2))), ValueError, "alibi_slopes"),
    # ---- option dtypes and values
    _A("mask_float", "options", "float mask", att(mask=np.ones((5, 7))), TypeError, "mask"),
    _A("mask_int8", "options", "int8 mask", att(mask=np.ones((5, 7), np.int8)), TypeError, "mask"),
    _A("mask_object", "options", "object mask", att(mask=np.ones((5, 7), object)), TypeError, "mask"),
    _A("mask_str", "options", "string mask", att(mask=np.full((5, 7), "T")), TypeError, "mask"),
    _A("kv_lengths_negative", "options", "kv_lengths < 0",
       att(kv_lengths=np.array([[3], [-1]])), ValueError, "kv_lengths"),
    _A("kv_lengths_gt_lk", "options", "kv_lengths > Lk",
       att(kv_lengths=np.array(8)), ValueError, "kv_lengths"),
    _A("kv_lengths_float", "options", "float kv_lengths",
       att(kv_lengths=np.array([[3.0], [2.0]])), TypeError, "kv_lengths"),
    _A("kv_lengths_bool", "options", "bool kv_lengths",
       att(kv_lengths=np.array([[True], [False]])), TypeError, "kv_lengths"),
    _A("kv_lengths_object", "options", "object kv_lengths",
       att(kv_lengths=np.array([[3], [2]], object)), TypeError, "kv_lengths"),
    _A("kv_lengths_zero", "options", "kv_lengths 0 (rows see no key)",
       att(kv_lengths=np.array([[0], [7]]), return_weights=True, return_lse=True), REF),
    _A("kv_lengths_uint8_bigendian", "options", "kv_lengths uint8 / big-endian int",
       att(kv_lengths=np.array([[3, 7], [0, 5]], ">i4"), causal="bottom_right"), REF),
    _A("window_negative", "options", "window -1", att(window=-1), ValueError, "window"),
    _A("window_right_negative", "options", "window (0, -1)", att(window=(0, -1)), ValueError, "window"),
    _A("window_left_negative", "options", "window (-3, None)", att(window=(-3, None)), ValueError, "window"),
    _A("window_float", "options", "window 1.5", att(window=1.5), TypeError, "window"),
    _A("window_bool", "options", "window True", att(window=True), TypeError, "window"),
    _A("window_triple", "options", "window (1, 2, 3)", att(window=(1, 2, 3)), TypeError, "window"),
    _A("window_single", "options", "window (1,)", att(window=(1,)), TypeError, "window"),
    _A("window_zero", "options", "window 0 (each query sees its diagonal key only)",
       att(window=0, return_weights=True), REF),
    _A("softcap_zero", "options", "softcap 0", att(softcap=0.0), ValueError, "softcap"),
    _A("softcap_negative", "options", "softcap -1", att(softcap=-1.0), ValueError, "softcap"),
    _A("softcap_nan", "options", "softcap NaN", att(softcap=float("nan")), ValueError, "softcap"),
    _A("softcap_inf", "options", "softcap inf", att(softcap=float("inf")), ValueError, "softcap"),
    _A("softcap_str", "options", "softcap '1'", att(softcap="1"), TypeError, "softcap"),
    _A("softcap_tiny", "options", "softcap 1e-300 (defined: scores squashed to ~0)",
       att(softcap=1e-300), REF),
    _A("scale_nan", "options", "scale NaN", att(scale=float("nan")), ValueError, "scale"),
    _A("scale_inf", "options", "scale inf", att(scale=float("inf")), ValueError, "scale"),
    _A("scale_neg_inf", "options", "scale -inf", att(scale=-float("inf")), ValueError, "scale"),
    _A("scale_str", "options", "scale '1'", att(scale="1"), TypeError, "scale"),
    _A("scale_complex", "options", "scale 1j", att(scale=1j), TypeError, "scale"),
    _A("scale_bool", "options", "scale True", att(scale=True), TypeError, "scale"),
    _A("scale_zero", "options", "scale 0 (uniform weights)", att(scale=0.0, return_weights=True), REF),
    _A("scale_negative", "options", "scale -2", att(scale=-2.0), REF),
    _A("causal_bad_str", "options", "causal 'diagonal'", att(causal="diagonal"), ValueError, "causal"),
    _A("causal_int", "options", "causal 1 (an int, not a bool)", att(causal=1), TypeError, "causal"),
    _A("alibi_nan", "options", "alibi_slopes NaN (rows of that head become NaN)",
       att(alibi_slopes=np.array([np.nan, 0.5])), REF),
    # ---- out=
    _A("out_shape", "out", "out with the wrong shape", att(out=lambda q, k, v: np.empty((2, 2, 4, 5))),
       ValueError, "out"),
    _A("out_dtype", "out", "out float32 for float64 inputs", att(out=lambda q, k, v: np.empty(S, f32)),
       TypeError, "out"),
    _A("out_bigendian", "out", "out '>f8' for float64 inputs", att(out=lambda q, k, v: np.empty(S, ">f8")),
       TypeError, "out"),
    _A("out_readonly", "out", "read-only out", att(out=lambda q, k, v: _readonly(np.empty(S))),
       ValueError, "out"),
    _A("out_is_q", "out", "out is q (Dv == Dk)", att(shapes=((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)),
                                                     out=lambda q, k, v: q), ValueError, "overlap"),
    _A("out_overlaps_v", "out", "out is a view of v",
       att(shapes=((2, 2, 7, 8), (2, 2, 7, 8), (2, 2, 7, 4)), out=lambda q, k, v: v[:, ::-1]),
       ValueError, "overlap"),
    _A("out_overlaps_bias", "out", "out is the bias array", _out_is_bias, ValueError, "overlap"),
    _A("out_self_overlapping", "out", "out whose elements share memory (zero strides)",
       att(out=lambda q, k, v: _self_overlapping(S)), ValueError, "out"),
    _A("out_list", "out", "out a list", att(out=lambda q, k, v: np.zeros(S).tolist()), TypeError, "out"),
    _A("out_strided", "out", "non-contiguous out (defined result)", att(out=lambda q, k, v: _strided_out(S)),
       REF),
    _A("out_f16", "out", "float16 out for float16 inputs", att(dtype=f16, out=lambda q, k, v: np.empty(S, f16)),
       REF),
    # ---- dtypes
    _A("q_complex", "dtype", "complex q", att(mod=lambda q, k, v: (q.astype(complex), k, v)), TypeError, "q"),
    _A("k_complex64", "dtype", "complex64 k", att(mod=lambda q, k, v: (q, k.astype(np.complex64), v)),
       TypeError, "k"),
    _A("v_object", "dtype", "object v", att(mod=lambda q, k, v: (q, k, v.astype(object))), TypeError, "v"),
    _A("q_str", "dtype", "string q", att(mod=lambda q, k, v: (q.astype("U5"), k, v)), TypeError, "q"),
    _A("k_bytes", "dtype", "bytes k", att(mod=lambda q, k, v: (q, k.astype("S5"), v)), TypeError, "k"),
    _A("q_datetime", "dtype", "datetime64 q", att(mod=lambda q, k, v: (q.astype("M8[s]"), k, v)), TypeError),
    _A("q_structured", "dtype", "structured q",
       att(mod=lambda q, k, v: (np.zeros(q.shape, [("a", f64)]), k, v)), TypeError),
    _A("bias_complex", "dtype", "complex bias", att(bias=np.ones((5, 7), complex)), TypeError, "bias"),
    _A("bias_str", "dtype", "string bias", att(bias=np.full((5, 7), "1")), TypeError, "bias"),
    _A("alibi_str", "dtype", "string alibi_slopes", att(alibi_slopes=np.array(["1", "2"])), TypeError,
       "alibi_slopes"),
    _A("alibi_complex", "dtype", "complex alibi_slopes", att(alibi_slopes=np.array([1j, 1])), TypeError,
       "alibi_slopes"),
    _A("big_endian_f8", "dtype", "big-endian '>f8' q, k, v",
       att(mod=lambda q, k, v: (q.astype(">f8"), k.astype(">f8"), v.astype(">f8"))), REF),
    _A("big_endian_f4", "dtype", "big-endian '>f4' q, k, v",
       att(mod=lambda q, k, v: (q.astype(">f4"), k.astype(">f4"), v.astype(">f4")), return_lse=True), REF),
    _A("big_endian_f2_mixed", "dtype", "big-endian '>f2' q with '<f4' k and '>f8' v",
       att(mod=lambda q, k, v: (q.astype(">f2"), k.astype("<f4"), v.astype(">f8"))), REF),
    _A("big_endian_options", "dtype", "big-endian bias and alibi_slopes",
       att(bias=np.linspace(-1, 1, 35).reshape(5, 7).astype(">f8"), alibi_slopes=np.array([0.5, 0.1], ">f4")),
       REF),
    _A("int_inputs", "dtype", "integer and bool q, k, v (computed in float64)",
       att(mod=lambda q, k, v: ((q * 3).astype(np.int16), (k > 0), (v * 3).astype(np.uint8))), REF),
    _A("list_inputs", "dtype", "nested lists", att(mod=lambda q, k, v: (q.tolist(), k.tolist(), v.tolist())), REF),
    _A("misaligned", "dtype", "misaligned float64 data",
       att(mod=lambda q, k, v: (np.frombuffer(b"\0" + q.tobytes(), f64, offset=1).reshape(q.shape), k, v)), REF),
    # ---- num_threads
    _A("num_threads_zero", "threads", "num_threads 0", att(num_threads=0), ValueError, "num_threads"),
    _A("num_threads_negative", "threads", "num_threads -1", att(num_threads=-1), ValueError, "num_threads"),
    _A("num_threads_float", "threads", "num_threads 2.0", att(num_threads=2.0), TypeError, "num_threads"),
    _A("num_threads_str", "threads", "num_threads '2'", att(num_threads="2"), TypeError, "num_threads"),
    _A("num_threads_bool", "threads", "num_threads True", att(num_threads=True), TypeError, "num_threads"),
    _A("num_threads_too_big", "threads", "num_threads 2**31", att(num_threads=2**31), ValueError, "num_threads"),
    _A("num_threads_np_int", "threads", "num_threads np.int64(3)", att(num_threads=np.int64(3)), REF),
    # ---- empty dimensions (defined results)
    _A("empty_lq", "empty", "Lq = 0", att(shapes=((2, 2, 0, 8), (2, 2, 7, 8), (2, 2, 7, 4)),
                                          return_weights=True, return_lse=True), REF),
    _A("empty_lk", "empty", "Lk = 0 (output 0, lse -inf)",
       att(shapes=((2, 2, 5, 8), (2, 2, 0, 8), (2, 2, 0, 4)), return_weights=True, return_lse=True), REF),
    _A("empty_lk_causal", "empty", "Lk = 0, causal bottom_right, kv_lengths 0",
       att(shapes=((2, 2, 5, 8), (2, 2, 0, 8), (2, 2, 0, 4)), causal="bottom_right",
           kv_lengths=np.array(0), return_lse=True), REF),
    _A("empty_batch", "empty", "batch 0", att(shapes=((0, 2, 5, 8), (0, 2, 7, 8), (0, 2, 7, 4)),
                                              return_weights=True, return_lse=True), REF),
    _A("empty_heads_gqa", "empty", "0 query heads, 0 kv heads",
       att(shapes=((2, 0, 5, 8), (2, 0, 7, 8), (2, 0, 7, 4)), return_lse=True), REF),
    _A("empty_dk", "empty", "Dk = 0 (scores 0, uniform weights)",
       att(shapes=((2, 2, 5, 0), (2, 2, 7, 0), (2, 2, 7, 4)), return_weights=True, return_lse=True), REF),
    _A("empty_dv", "empty", "Dv = 0", att(shapes=((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 0)), return_lse=True),
       REF),
    _A("empty_batch_kv_lengths", "empty", "batch 0 with kv_lengths of shape (0, 1)",
       att(shapes=((0, 2, 5, 8), (0, 2, 7, 8), (0, 2, 7, 4)), kv_lengths=np.zeros((0, 1), int)), REF),
    # ---- non-finite values (NaN / inf reach exactly the rows the reference says)
    _A("nan_q", "nonfinite", "NaN in one q element (that row only)",
       att(mod=_with_nan("q", (0, 1, 2, 3), np.nan), return_weights=True, return_lse=True), REF),
    _A("nan_k", "nonfinite", "NaN in one k element (rows that see the key)",
       att(mod=_with_nan("k", (1, 0, 4, 0), np.nan), causal=True, return_lse=True), REF),
    _A("nan_v", "nonfinite", "NaN in one v element (that output column of rows that see it)",
       att(mod=_with_nan("v", (0, 0, 3, 1), np.nan), causal=True), REF),
    _A("inf_q", "nonfinite", "+inf in q", att(mod=_with_nan("q", (1, 1, 0, 0), np.inf), return_lse=True), REF),
    _A("neg_inf_k", "nonfinite", "-inf in k", att(mod=_with_nan("k", (0, 1, 6, 2), -np.inf), return_weights=True),
       REF),
    _A("inf_v", "nonfinite", "+inf and -inf in v",
       att(mod=lambda q, k, v: (q, k, _set(_set(v, (0, 0, 2, 0), np.inf), (0, 0, 5, 3), -np.inf))), REF),
    _A("nan_k_masked", "nonfinite", "NaN in a key that the mask hides (no effect)",
       att(mod=_with_nan("k", (..., 6, 0), np.nan), mask=np.arange(7) < 6), REF),
    _A("nan_kv_padding", "nonfinite", "NaN/inf in k and v beyond kv_lengths (no effect)",
       att(mod=lambda q, k, v: (q, _set(k, (..., slice(5, None), slice(None)), np.nan),
                                _set(v, (..., slice(5, None), slice(None)), np.inf)),
           kv_lengths=np.array(5), return_lse=True), REF),
    _A("inf_bias", "nonfinite", "-inf bias rows (empty rows) and +inf bias (NaN rows)",
       att(bias=_set(_set(np.zeros((5, 7)), (1, slice(None)), -np.inf), (3, 2), np.inf),
           return_weights=True, return_lse=True), REF),
    _A("nan_bias", "nonfinite", "NaN in bias", att(bias=_set(np.zeros((5, 7)), (2, 4), np.nan), return_lse=True),
       REF),
    _A("huge_values_f32", "nonfinite", "float32 values near the overflow limit",
       att(dtype=f32, mod=lambda q, k, v: (q * np.float32(1e17), k * np.float32(1e17), v * np.float32(1e37)),
           return_lse=True), REF),
    _A("denormal_values", "nonfinite", "subnormal q and k",
       att(mod=lambda q, k, v: (q * 1e-160, k * 1e-160, v)), REF),
    # ---- more than 2**31 elements (broadcast views, no memory)
    _A("huge_batch", "huge", f"q of 2**31 elements: batch ({BIG_B}, 4), Dk 512, kv_lengths varying per batch",
       _huge_batch_case, _check_huge_batch),
    _A("huge_rows", "huge", "q of 2**31 elements: Lq = 2**22, Dk 512", _huge_rows_case(return_lse=True),
       _check_huge_rows),
    _A("huge_rows_causal", "huge", "q of 2**31 elements, causal bottom_right",
       _huge_rows_case(causal="bottom_right", return_lse=True), _check_huge_rows),
    # ---- allocation failure
    _A("out_too_big", "memory", "output of 2**40 float64 (broadcast q)",
       att(qkv=lambda: (_big((2**40, 1)), np.ones((1, 1)), np.ones((1, 1))), return_lse=True), MemoryError),
    _A("weights_too_big", "memory", "weights of 2**40 elements (return_weights=True)",
       att(qkv=lambda: (_big((2**20, 1)), _big((2**20, 1)), np.ones((2**20, 1))), return_weights=True),
       MemoryError),
    _A("workspace_too_big", "memory", "Dk = 2**40 (broadcast q, k): workspace cannot be allocated",
       att(qkv=lambda: (_big((2, 2**40)), _big((3, 2**40)), np.ones((3, 2)))), MemoryError),
    _A("workspace_dk_overflow_f64", "memory", "Dk = 2**58, float64 (workspace size overflows int64)",
       att(qkv=lambda: (_big((1, 2**58)), _big((1, 2**58)), np.ones((1, 1)))), MemoryError),
    _A("workspace_dk_overflow_f32", "memory", "Dk = 2**60, float32",
       att(qkv=lambda: (_big((1, 2**60), f32), _big((1, 2**60), f32), np.ones((1, 1), f32))), MemoryError),
    _A("workspace_dk_overflow_lk0", "memory", "Dk = 2**58 with Lk = 0",
       att(qkv=lambda: (_big((1, 2**58)), _big((0, 2**58)), np.ones((0, 1)))), MemoryError),
    _A("dv_too_big", "memory", "Dv = 2**40 (broadcast v): output cannot be allocated",
       att(qkv=lambda: (np.ones((1, 4)), np.ones((2, 4)), _big((2, 2**40)))), MemoryError),
    _A("kv_lengths_table_too_big", "memory", "kv_lengths over a broadcast batch of 2**40 (Dv = 0)",
       att(qkv=lambda: (_big((2**40, 1, 1)), np.ones((1, 1)), np.ones((1, 0))), kv_lengths=np.array([1])),
       MemoryError),
]

# ------------------------------------------------------------------ softmax / log_softmax
SOFTMAX_CASES = []
for _fn in ("softmax", "log_softmax"):
    def _S(name, group, what, make, expect, match=None, _fn=_fn):
        SOFTMAX_CASES.append(Case(f"{_fn}-{name}", group, what, make, expect, match))

    _S("complex", "dtype", "complex x", sm(X(dtype=complex), _fn), TypeError, "complex")
    _S("object", "dtype", "object x", sm(X(dtype=object), _fn), TypeError)
    _S("str", "dtype", "string x", sm(np.full((2, 3), "1"), _fn), TypeError)
    _S("datetime", "dtype", "datetime64 x", sm(np.zeros(3, "M8[s]"), _fn), TypeError)
    _S("axis_too_big", "options", "axis 3 for a 3-D x", sm(X(), _fn, axis=3), ValueError, "axis")
    _S("axis_too_negative", "options", "axis -4", sm(X(), _fn, axis=-4), ValueError, "axis")
    _S("axis_float", "options", "axis 1.0", sm(X(), _fn, axis=1.0), TypeError, "axis")
    _S("axis_str", "options", "axis '0'", sm(X(), _fn, axis="0"), TypeError, "axis")
    _S("axis_bool", "options", "axis True", sm(X(), _fn, axis=True), TypeError, "axis")
    _S("axis_tuple", "options", "axis (0, 1)", sm(X(), _fn, axis=(0, 1)), TypeError, "axis")
    _S("0d_axis", "shape", "0-D x with axis=-1", sm(np.float64(1.5), _fn), ValueError, "axis")
    _S("0d_axis_none", "shape", "0-D x with axis=None", sm(np.float64(1.5), _fn, axis=None), REF)
    _S("out_shape", "out", "out with the wrong shape", sm(X(), _fn, out=lambda x: np.empty((3, 9, 4))),
       ValueError, "out")
    _S("out_dtype", "out", "out float32 for float64 x", sm(X(), _fn, out=lambda x: np.empty(x.shape, f32)),
       TypeError, "out")
    _S("out_readonly", "out", "read-only out", sm(X(), _fn, out=lambda x: _readonly(np.empty(x.shape))),
       ValueError, "out")
    _S("out_is_x", "out", "out is x", sm(X(), _fn, out=lambda x: x), ValueError, "overlap")
    _S("out_overlaps_x", "out", "out is a reversed view of x", sm(X(), _fn, out=lambda x: x[::-1]),
       ValueError, "overlap")
    _S("out_self_overlapping", "out", "out whose elements share memory (zero strides)",
       sm(X(), _fn, out=lambda x: _self_overlapping(x.shape)), ValueError, "out")
    _S("out_self_overlapping_huge", "out", "zero-stride out of 2**59 elements (row buffer size overflows)",
       sm(lambda: _big((2**59,)), _fn, out=lambda x: _self_overlapping(x.shape)), ValueError, "out")
    _S("out_list", "out", "out a list", sm(X(), _fn, out=lambda x: np.zeros(x.shape).tolist()), TypeError, "out")
    _S("out_strided", "out", "non-contiguous out, axis 0", sm(X(), _fn, axis=0, out=lambda x: _strided_out(x.shape)),
       REF)
    _S("num_threads_zero", "threads", "num_threads 0", sm(X(), _fn, num_threads=0), ValueError, "num_threads")
    _S("num_threads_float", "threads", "num_threads 1.5", sm(X(), _fn, num_threads=1.5), TypeError, "num_threads")
    _S("empty_row", "empty", "rows of length 0", sm(np.ones((3, 0)), _fn), REF)
    _S("empty_rows", "empty", "0 rows", sm(np.ones((0, 4)), _fn, axis=0), REF)
    _S("empty_none", "empty", "empty x, axis=None", sm(np.ones((2, 0, 3)), _fn, axis=None), REF)
    _S("nonfinite", "nonfinite", "NaN, +inf and an all -inf row",
       sm(lambda: _set(_set(_set(X()(), (0, 0, 3), np.nan), (1, 2, 0), np.inf), (2, 1), -np.inf), _fn), REF)
    _S("nonfinite_axis0", "nonfinite", "NaN / -inf along axis 0",
       sm(lambda: _set(_set(X()(), (1, 0, 3), np.nan), (slice(None), 2, 2), -np.inf), _fn, axis=0), REF)
    _S("big_endian_f8", "dtype", "big-endian '>f8'", sm(X(dtype=">f8"), _fn), REF)
    _S("big_endian_f4", "dtype", "big-endian '>f4', axis=None", sm(X(dtype=">f4"), _fn, axis=None), REF)
    _S("big_endian_f2", "dtype", "big-endian '>f2', axis 1", sm(X(dtype=">f2"), _fn, axis=1), REF)
    _S("ints", "dtype", "int8 / bool x (computed in float64)", sm(np.arange(-6, 6, dtype=np.int8).reshape(3, 4),
                                                                    _fn), REF)
    _S("bool", "dtype", "bool x", sm(np.eye(4, dtype=bool), _fn), REF)
    _S("negative_strides", "dtype", "negative-stride view", sm(lambda: X()()[::-1, :, ::-2], _fn, axis=1), REF)
    _S("out_too_big", "memory", "output of 2**41 float64 (broadcast x)", sm(lambda: _big((2**40, 2)), _fn),
       MemoryError)


# ------------------------------------------------------------------ merge_attention
def _merge(outs, lses):
    return lambda: (fastattn.merge_attention, (outs() if callable(outs) else outs,
                                               lses() if callable(lses) else lses), {})


def _parts():
    rng = _rng("merge")
    o = [rng.standard_normal((2, 3, 4)) for _ in range(3)]
    s = [rng.standard_normal((2, 3)) for _ in range(3)]
    s[1][0, 1] = -np.inf
    s[0][1, :] = -np.inf
    s[1][1, :] = -np.inf
    s[2][1, :] = -np.inf
    return o, s


MERGE_CASES = [
    Case("merge-empty", "merge", "no parts", _merge([], []), ValueError),
    Case("merge-count", "merge", "2 outputs, 1 lse", _merge([np.zeros((3, 2))] * 2, [np.zeros(3)]), ValueError),
    Case("merge-lse_shape", "merge", "lse shape != out shape[:-1]", _merge([np.zeros((3, 2))], [np.zeros(4)]),
         ValueError),
    Case("merge-out_shapes", "merge", "outputs of different shapes",
         _merge([np.zeros((3, 2)), np.zeros((3, 3))], [np.zeros(3), np.zeros(3)]), ValueError),
    Case("merge-complex", "merge", "complex output", _merge([np.zeros((3, 2), complex)], [np.zeros(3)]), TypeError),
    Case("merge-0d", "merge", "0-D output", _merge([np.float64(1.0)], [np.float64(0.0)]), ValueError),
    Case("merge-neg_inf", "merge", "parts with lse -inf (empty rows stay 0 / -inf)",
         lambda: (fastattn.merge_attention, _parts(), {}), REF),
    Case("merge-nan", "merge", "a NaN lse (that row only)",
         lambda: (fastattn.merge_attention, (_parts()[0], [_set(s, (0, 2), np.nan) if i == 1 else s
                                                          for i, s in enumerate(_parts()[1])]), {}), REF),
    Case("merge-big_endian", "merge", "big-endian parts",
         lambda: (fastattn.merge_attention, tuple([a.astype(">f8") for a in p] for p in _parts()), {}), REF),
]

ALL_CASES = ATTENTION_CASES + SOFTMAX_CASES + MERGE_CASES


# ------------------------------------------------------------------ the checks
def _arrays(obj):
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _arrays(o)


def _snap(a):
    """Bytes of the memory a may reach, plus its metadata (works for broadcast views)."""
    lo, hi = np.lib.array_utils.byte_bounds(a)
    data = ctypes.string_at(lo, hi - lo) if hi > lo else b""
    return data, a.shape, a.strides, a.dtype, a.flags.writeable


def _reference(fn, args, kw):
    kw = {key: val for key, val in kw.items() if key not in ("out", "num_threads")}
    if fn is fastattn.merge_attention:
        return R.merge_attention(*args)
    return getattr(R, fn.__name__)(*args, **kw)


def _check_against_reference(fn, args, kw, res):
    ref = _reference(fn, args, kw)
    res_t = res if isinstance(res, tuple) else (res,)
    ref_t = ref if isinstance(ref, tuple) else (ref,)
    assert len(res_t) == len(ref_t)
    if fn is fastattn.merge_attention:
        dt = np.result_type(*[np.asarray(a) for a in args[0]], *[np.asarray(a) for a in args[1]])
        dt = np.dtype(f64) if dt.kind != "f" else dt.newbyteorder("=")
        for r, w in zip(res_t, ref_t):
            assert_close(r, w, dtype=dt)
        return
    arrs = [np.asarray(a) for a in args] if fn is fastattn.attention else [np.asarray(args[0])]
    odt = expected_dtype(*arrs).newbyteorder("=")
    assert res_t[0].dtype == odt, (res_t[0].dtype, odt)
    if kw.get("out") is not None:
        assert res_t[0] is kw["out"]
    for i, (r, w) in enumerate(zip(res_t, ref_t)):
        assert_close(r, w, dtype=odt if i < 2 else (f32 if odt == f16 else odt), what=f"result part {i}")


# cases that compute on all 2**31 elements take 10-40 s on 2 cores: opt in with FASTATTN_SLOW_TESTS=1
SLOW = {"huge_batch", "huge_rows"}
# cases that have crashed the process (SIGSEGV): run in a child by test_workspace_overflow_in_subprocess
IN_SUBPROCESS = {"workspace_too_big", "workspace_dk_overflow_f64", "workspace_dk_overflow_f32",
                 "workspace_dk_overflow_lk0"}


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.name for c in ALL_CASES])
def test_table(case):
    if case.name in SLOW and os.environ.get("FASTATTN_SLOW_TESTS", "") in ("", "0"):
        pytest.skip("slow (> 10 s); set FASTATTN_SLOW_TESTS=1")
    if case.name in IN_SUBPROCESS:
        pytest.skip("checked in a child process by test_workspace_overflow_in_subprocess")
    fn, args, kw = case.make()
    inputs = list(_arrays(args)) + [a for key, a in kw.items() if key != "out" and isinstance(a, np.ndarray)]
    out = kw.get("out")
    before = [_snap(a) for a in inputs]
    out_before = _snap(out) if isinstance(out, np.ndarray) else None
    if isinstance(case.expect, type) and issubclass(case.expect, BaseException):
        with pytest.raises(case.expect) as ei:
            fn(*args, **kw)
        # ValueError must not be a TypeError and vice versa (and MemoryError is MemoryError)
        for other in (ValueError, TypeError, MemoryError):
            if other is not case.expect:
                assert not isinstance(ei.value, other), f"{type(ei.value).__name__}: {ei.value}"
        if case.match:
            assert re.search(case.match, str(ei.value)), f"message {str(ei.value)!r} lacks {case.match!r}"
        if out_before is not None:
            assert _snap(out) == out_before, "out= was modified by a failed call"
    else:
        res = fn(*args, **kw)
        if case.expect == REF:
            _check_against_reference(fn, args, kw, res)
        else:
            case.expect(res, args, kw)
    for a, b in zip(inputs, before):
        assert _snap(a) == b, "an input was modified (data, shape, strides, dtype or write flag)"


def test_table_is_complete():
    """Every category the hardening issue lists appears in the table."""
    groups = {c.group for c in ALL_CASES}
    assert {"shape", "broadcast", "options", "out", "dtype", "threads", "empty", "nonfinite", "huge",
            "memory", "merge"} <= groups
    names = [c.name for c in ALL_CASES]
    assert len(names) == len(set(names))


# ------------------------------------------------------------------ the README table
_GROUP_TITLES = {
    "shape": "Shapes", "broadcast": "Broadcasting of options", "options": "Option values and dtypes",
    "out": "`out=`", "dtype": "Array dtypes", "threads": "`num_threads`", "empty": "Empty dimensions",
    "nonfinite": "NaN / inf / extreme values", "huge": "More than 2**31 elements",
    "memory": "Allocation failure", "merge": "`merge_attention`",
}


def markdown_table():
    """The README "Errors" table (Markdown), generated from the cases above."""
    lines = ["| Function | Input | Outcome |", "|---|---|---|"]
    for group, title in _GROUP_TITLES.items():
        for c in ALL_CASES:
            if c.group != group:
                continue
            fn = ("`attention`" if c in ATTENTION_CASES else
                  "`merge_attention`" if c in MERGE_CASES else f"`{c.name.split('-')[0]}`")
            if isinstance(c.expect, type):
                outcome = f"`{c.expect.__name__}`"
            elif c.expect == REF:
                outcome = "result = reference"
            else:
                outcome = "result = reference (sampled rows)"
            lines.append(f"| {fn} | {title}: {c.what} | {outcome} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ a crash must not take pytest down
def test_workspace_overflow_in_subprocess():
    """The Dk sizes whose workspace byte count overflows int64 used to crash the
    process (SIGSEGV); run them in a child so a regression is a failure, not a crash."""
    code = textwrap.dedent("""
        import numpy as np, fastattn
        for D, dt, L in ((2**57, np.float64, 1), (2**58, np.float64, 1), (2**60, np.float32, 1),
                         (2**59, np.float64, 1), (2**30, np.float64, 2), (2**34, np.float64, 2),
                         (2**40, np.float64, 2)):
            try:
                x = np.broadcast_to(np.full(1, 0.5, dt), (L, D))
                kk = np.broadcast_to(np.full(1, 0.5, dt), (3, D))
                fastattn.attention(x, kk, np.ones((3, 2), dt))
            except MemoryError:
                print("MemoryError", D)
            except ValueError as e:   # numpy: array too big
                print("ValueError", D)
    """)
    env, cwd = child_process_env()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=env, cwd=cwd)
    assert res.returncode == 0, f"child died with {res.returncode}: {res.stderr[-2000:]}"
    lines = res.stdout.split()
    # every size ends in an exception: MemoryError from fastattn, or numpy's own
    # ValueError when even the broadcast view is too big to describe
    assert res.stdout.count("MemoryError") + res.stdout.count("ValueError") == 7, res.stdout
    assert res.stdout.count("MemoryError") >= 5, res.stdout
