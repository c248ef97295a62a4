"""Public functions: argument checking, dtype promotion, output allocation.

Everything about *what* to compute is decided here; the compiled kernels
(``fastattn._kernels._attn_<isa>``, chosen by ``fastattn._dispatch``) only
execute the plan.  Inputs are never written and never copied when they already
have the compute dtype: broadcast batch dims, transposed or negative strides,
read-only and memory-mapped arrays are passed to the kernels as they are.
Copies happen only for dtype conversion (float16, integers, mixed dtypes,
big-endian data) and for misaligned data.
"""
import math
import numbers
import operator

import numpy as np

from . import _dispatch, _docstrings, _lazy
from ._threads import _check_num_threads as check_num_threads, resolve_num_threads

_K = _dispatch.kernels
_K.set_thread_resolver(resolve_num_threads)

__all__ = ["attention", "scaled_dot_product_attention", "softmax", "log_softmax", "merge_attention"]


# ---------------------------------------------------------------- helpers

def _as_array(x, name):
    a = np.asarray(x)
    kind = a.dtype.kind
    if kind not in "fiub":
        if kind == "c":
            raise TypeError(f"{name}: complex arrays are not supported (dtype {a.dtype})")
        raise TypeError(f"{name}: expected a real numeric array, got dtype {a.dtype}")
    return a


def _dtypes(*arrays):
    """(compute dtype, output dtype) for inputs promoted like np.result_type."""
    rt = np.result_type(*arrays)
    if rt == np.float32:
        return np.dtype(np.float32), np.dtype(np.float32)
    if rt == np.float16:
        return np.dtype(np.float32), np.dtype(np.float16)
    return np.dtype(np.float64), np.dtype(np.float64)


def _to_compute(a, dtype):
    """a in the compute dtype, native byte order and aligned; a view when possible."""
    if a.dtype != dtype:  # also catches non-native byte order
        return a.astype(dtype)
    if not _K.behaved(a):
        return np.array(a, dtype=dtype)
    return a


def _broadcast_shape(shapes):
    """np.broadcast_shapes of tuples of ints, or None where they do not broadcast.

    In Python: np.broadcast_shapes builds broadcast objects and costs ~5 us a
    call, more than a small attention call's kernel."""
    first = shapes[0]
    if all(s == first for s in shapes):
        return tuple(first)
    nd = max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        off = nd - len(s)
        for i, n in enumerate(s):
            m = out[off + i]
            if n != m:
                if m == 1:
                    out[off + i] = n
                elif n != 1:
                    return None
    return tuple(out)


def _broadcast(shapes, names):
    shape = _broadcast_shape(shapes)
    if shape is None:
        desc = ", ".join(f"{n} {s}" for n, s in zip(names, shapes))
        raise ValueError(f"batch dimensions do not broadcast: {desc}")
    return shape


def _check_out(out, shape, dtype, inputs, name="out"):
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != tuple(shape):
        raise ValueError(f"{name} has shape {out.shape}, expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{name} has dtype {out.dtype}, expected {dtype}")
    if not out.flags.writeable:
        raise ValueError(f"{name} is read-only")
    if out.size and any(st == 0 and n > 1 for st, n in zip(out.strides, out.shape)):
        raise ValueError(f"{name} has overlapping elements (a zero stride); it must be a plain writeable array")
    for arr_name, arr in inputs:
        if arr is not None and np.may_share_memory(out, arr):
            raise ValueError(f"{name} overlaps the input {arr_name}")


def _check_real(value, name):
    """A real scalar: a Python or NumPy real number, or a 0-d real array (the
    reference's rule too); bools, complex, strings and arrays of ndim >= 1 are not."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def _window_side(w, name):
    if w is None:
        return -1
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Integral):
        raise TypeError(f"window: {name} side must be an int or None, got {w!r}")
    w = operator.index(w)
    if w < 0:
        raise ValueError(f"window: {name} side must be >= 0, got {w}")
    return w


def _parse_window(window):
    if window is None:
        return -1, -1
    if isinstance(window, (tuple, list)):
        if len(window) != 2:
            raise TypeError(f"window must be an int or a (left, right) pair, got {window!r}")
        return _window_side(window[0], "left"), _window_side(window[1], "right")
    w = _window_side(window, "both")
    return w, w


_CAUSAL = {False: 0, None: 0, True: 1, "top_left": 1, "bottom_right": 2}


def _parse_causal(causal):
    if isinstance(causal, (bool, np.bool_)) or causal is None:
        return 1 if causal else 0
    if isinstance(causal, str) and causal in _CAUSAL:
        return _CAUSAL[causal]
    if not isinstance(causal, str):
        raise TypeError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")
    raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")


def _batch_table(values, name, bshape_q, nbatch_g, dtype):
    """A contiguous (prod(bshape_q),) table of a per-(batch, head) option."""
    vshape = np.shape(values)
    if len(vshape) > len(bshape_q) or _broadcast_shape((vshape, bshape_q)) != tuple(bshape_q):
        raise ValueError(f"{name} with shape {vshape} does not broadcast to the "
                         f"batch dimensions {tuple(bshape_q)}")
    t = np.empty(bshape_q, dtype=dtype)
    t[...] = values         # (np.broadcast_to + a copy cost ~7 us more)
    t = t.reshape(-1)
    assert t.size == nbatch_g
    return t


def _score_operand(x, name, full_shape):
    """mask / bias: must broadcast to (..., Lq, Lk); returned with >= 2 dims."""
    if x.ndim > len(full_shape) or _broadcast_shape((x.shape, tuple(full_shape))) != tuple(full_shape):
        raise ValueError(f"{name} with shape {x.shape} does not broadcast to the score shape "
                         f"{tuple(full_shape)}")
    if x.ndim < 2:
        x = x.reshape((1,) * (2 - x.ndim) + x.shape)
    return x


# ---------------------------------------------------------------- attention



def _attention_general(q, k, v, scale=None, causal=False, mask=None, bias=None, window=None,
                       kv_lengths=None, softcap=None, alibi_slopes=None, return_weights=False,
                       return_lse=False, out=None, num_threads=None):
    """attention()'s general path: array-likes, dtype promotion and conversion,
    broadcast batch dims, every error message.  ``fastattn.attention`` is the
    compiled ``_K.attention``, which calls this for every call its fast path
    (``attention_fast_impl`` in the kernel module: matching float ndarrays,
    options in their plain spellings) declines; the arguments come positionally,
    in this order."""
    if _lazy.any_dask(q, k, v, mask, bias, kv_lengths, alibi_slopes):   # a lazy result (fastattn.dask)
        return _lazy.call("attention", (q, k, v), dict(
            scale=scale, causal=causal, mask=mask, bias=bias, window=window, kv_lengths=kv_lengths,
            softcap=softcap, alibi_slopes=alibi_slopes, return_weights=return_weights,
            return_lse=return_lse, out=out, num_threads=num_threads))
    q = _as_array(q, "q")
    k = _as_array(k, "k")
    v = _as_array(v, "v")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., L, D), got shape {a.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension Dk: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys Lk: k {k.shape}, v {v.shape}")
    if num_threads is not None:
        check_num_threads(num_threads)   # the count itself is asked for by the kernel
    cdt, odt = _dtypes(q, k, v)
    Lq, Dk = q.shape[-2:]
    Lk, Dv = v.shape[-2:]
    if (Dk + Dv) * cdt.itemsize > 2**48:  # the kernels' per-thread workspace is ~200 rows of Dk + Dv
        raise MemoryError(f"head dimensions Dk={Dk}, Dv={Dv} are too large: the attention workspace "
                          f"cannot be allocated")

    # batch dims, with grouped heads folded into the query rows
    qb, kb, vb = q.shape[:-2], k.shape[:-2], v.shape[:-2]
    kvb = _broadcast((kb, vb), ("k", "v"))
    g = 1
    # grouped heads (torch enable_gqa): k and v share a head count that divides q's;
    # one key/value head (multi-query) is grouped too, not broadcast, so the kernel
    # reads each key and value once for all the query heads
    if (len(qb) >= 1 and len(kb) >= 1 and len(vb) >= 1 and kb[-1] == vb[-1]
            and 0 < kvb[-1] < qb[-1] and qb[-1] % kvb[-1] == 0):
        g = qb[-1] // kvb[-1]
    if g > 1:
        bshape = _broadcast((qb[:-1] + (kvb[-1],), kb, vb), ("q (heads grouped)", "k", "v"))
        bshape_q = bshape[:-1] + (qb[-1],)
    else:
        bshape = _broadcast((qb, kb, vb), ("q", "k", "v"))
        bshape_q = bshape
    out_shape = bshape_q + (Lq, Dv)
    score_shape = bshape_q + (Lq, Lk)
    nbatch_g = math.prod(bshape_q)

    causal_code = _parse_causal(causal)
    wl, wr = _parse_window(window)
    scale = 1.0 / math.sqrt(Dk) if scale is None and Dk > 0 else (1.0 if scale is None else _check_real(scale, "scale"))
    if softcap is None:
        softcap = 0.0
    else:
        softcap = _check_real(softcap, "softcap")
        if softcap <= 0:
            raise ValueError(f"softcap must be > 0, got {softcap}")

    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
        mask = _score_operand(mask, "mask", score_shape)
    if bias is not None:
        bias = _as_array(bias, "bias")
        bias = _to_compute(_score_operand(bias, "bias", score_shape), cdt)
    kvlen = None
    if kv_lengths is not None:
        kl = np.asarray(kv_lengths)
        if kl.dtype.kind not in "iu":
            raise TypeError(f"kv_lengths must be an integer array, got dtype {kl.dtype}")
        kvlen = _batch_table(kl, "kv_lengths", bshape_q, nbatch_g, np.int64)
        lo, hi = _K.int64_range(kvlen) if kvlen.size else (0, 0)
        if lo < 0 or hi > Lk:
            raise ValueError(f"kv_lengths must lie in [0, Lk={Lk}], got values in [{lo}, {hi}]")
    slopes = None
    if alibi_slopes is not None:
        sl = _as_array(alibi_slopes, "alibi_slopes")
        slopes = _batch_table(sl, "alibi_slopes", bshape_q, nbatch_g, cdt)

    inputs = (("q", q), ("k", k), ("v", v), ("mask", mask), ("bias", bias))
    if out is not None:
        _check_out(out, out_shape, odt, inputs)
    qc, kc, vc = _to_compute(q, cdt), _to_compute(k, cdt), _to_compute(v, cdt)
    if out is not None and odt == cdt and out.flags.aligned:
        result = out
    else:
        result = np.empty(out_shape, dtype=cdt)
    weights = np.empty(score_shape, dtype=cdt) if return_weights else None
    lse = np.empty(bshape_q + (Lq,), dtype=cdt) if return_lse else None

    _K.attention_forward(qc, kc, vc, result, tuple(bshape), g, scale, causal_code, wl, wr,
                         softcap, mask, bias, kvlen, slopes, weights, lse, num_threads)

    if out is not None:
        if result is not out:
            out[...] = result
        result = out
    elif odt != cdt:
        result = result.astype(odt)
    if not (return_weights or return_lse):
        return result
    parts = [result]
    if return_weights:
        parts.append(weights if odt == cdt else weights.astype(odt))
    if return_lse:
        parts.append(lse)
    return tuple(parts)


_K.set_general_attention(_attention_general)
attention = _K.attention
attention.__doc__ = _docstrings.ATTENTION
attention.__module__ = "fastattn"
scaled_dot_product_attention = attention


# ---------------------------------------------------------------- softmax

def _softmax_views(xc, res, axis):
    """How to run a softmax along ``axis`` when x and the result share one dense
    layout (C order, Fortran order, or any transposition of them).

    Ordered by decreasing stride both are C-contiguous; the softmax axis then sits
    at position p.  p last: ("rows", x, res) with the axis moved last (contiguous
    rows).  Otherwise, when the axes after p hold at least one float vector:
    ("cols", x3, res3) with 3-D (outer, n, inner) views for the column kernel.
    None for anything else (the caller goes row by row).
    """
    nd = xc.ndim
    perm = sorted(range(nd), key=lambda d: (-abs(xc.strides[d]), d))
    xt, rt = xc.transpose(perm), res.transpose(perm)
    if not (xt.flags.c_contiguous and rt.flags.c_contiguous):
        return None
    p = perm.index(axis)
    if p == nd - 1:
        return "rows", np.moveaxis(xc, axis, -1), np.moveaxis(res, axis, -1)
    inner = math.prod(xt.shape[p + 1:])
    if inner < _K.SOFTMAX_COL_MIN:
        return None
    shape3 = (math.prod(xt.shape[:p]), xt.shape[p], inner)
    return "cols", xt.reshape(shape3), rt.reshape(shape3)


def _softmax(x, axis, out, num_threads, log_mode, fname):
    if _lazy.any_dask(x):   # a lazy result (fastattn.dask)
        return _lazy.call(fname, (x,), dict(axis=axis, out=out, num_threads=num_threads))
    x = _as_array(x, "x")
    if num_threads is not None:
        check_num_threads(num_threads)
    # small inputs run on the calling thread: no thread count asked for (as on the fast path)
    nthreads = resolve_num_threads(num_threads) if x.size > _K.SOFTMAX_THREADS_MIN else 1
    cdt, odt = _dtypes(x)
    if out is not None:
        _check_out(out, x.shape, odt, (("x", x),))
    xc = _to_compute(x, cdt)
    if axis is None:
        flat = np.ascontiguousarray(xc).reshape(1, -1) if xc.ndim != 1 else xc.reshape(1, -1)
        res = np.empty(flat.shape, dtype=cdt)
        if flat.size:
            _K.softmax_forward(flat, res, log_mode, nthreads)
        res = res.reshape(x.shape)
    else:
        if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
            raise TypeError(f"{fname}: axis must be an int or None, got {axis!r}")
        axis = np.lib.array_utils.normalize_axis_index(operator.index(axis), x.ndim)
        direct = out is not None and odt == cdt and out.flags.aligned
        # the result takes the input's memory layout (as NumPy ufuncs do), so a
        # slice that is contiguous in x is contiguous in the result too
        res = out if direct else np.empty_like(xc, dtype=cdt)
        views = _softmax_views(xc, res, axis)
        if views is None:
            _K.softmax_forward(np.moveaxis(xc, axis, -1), np.moveaxis(res, axis, -1), log_mode, nthreads)
        elif views[0] == "rows":
            _K.softmax_forward(views[1], views[2], log_mode, nthreads)
        else:
            _K.softmax_cols_forward(views[1], views[2], log_mode, nthreads)
        if direct:
            return out
    if out is not None:
        out[...] = res
        return out
    return res if odt == cdt else res.astype(odt)


def softmax(x, axis=-1, *, out=None, num_threads=None):
    if out is None and type(axis) is int and axis == -1:
        # the plain call, checked and run in compiled code (None: take the general path)
        result = _K.softmax_fast(x, False, num_threads)
        if result is not None:
            return result
    return _softmax(x, axis, out, num_threads, False, "softmax")


def log_softmax(x, axis=-1, *, out=None, num_threads=None):
    if out is None and type(axis) is int and axis == -1:
        result = _K.softmax_fast(x, True, num_threads)
        if result is not None:
            return result
    return _softmax(x, axis, out, num_threads, True, "log_softmax")


# ---------------------------------------------------------------- merging partial results

def merge_attention(outs, lses):
    outs = [_as_array(o, "outs") for o in outs]
    lses = [_as_array(s, "lses") for s in lses]
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"merge_attention needs one lse per output and at least one part, "
                         f"got {len(outs)} outputs and {len(lses)} lses")
    for o, s in zip(outs, lses):
        if o.ndim < 1 or o.shape[:-1] != s.shape:
            raise ValueError(f"each output must have shape lse.shape + (Dv,): got outs {o.shape}, lses {s.shape}")
        if o.shape != outs[0].shape:
            raise ValueError(f"all outputs must have the same shape: {outs[0].shape} vs {o.shape}")
    cdt, _ = _dtypes(*outs, *lses)
    L = np.stack([s.astype(cdt, copy=False) for s in lses])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        M = L.max(axis=0)
        nan_rows = np.isnan(L).any(axis=0)
        M_safe = np.where(np.isfinite(M), M, 0).astype(cdt)
        w = np.where(L == -np.inf, 0, np.exp(L - M_safe))
        total = w.sum(axis=0)
        seen = total > 0
        lse = np.where(seen, M_safe + np.log(np.where(seen, total, 1)), -np.inf).astype(cdt)
        out = np.zeros(outs[0].shape, dtype=cdt)
        for wi, oi in zip(w, outs):
            out += (wi / np.where(seen, total, 1))[..., None] * oi.astype(cdt, copy=False)
        lse[nan_rows] = np.nan
        out[nan_rows] = np.nan
    return out, lse


softmax.__doc__ = _docstrings.SOFTMAX
log_softmax.__doc__ = _docstrings.LOG_SOFTMAX
merge_attention.__doc__ = _docstrings.MERGE_ATTENTION
