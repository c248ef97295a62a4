"""Public functions: attention, softmax, log_softmax (compiled) and merge_attention.

``attention``, ``softmax`` and ``log_softmax`` are the compiled functions of the
kernel module chosen for this CPU (``fastattn._dispatch``): their argument path
-- checks, dtype promotion, broadcasting, the plan -- is compiled too
(``fastattn/_kernels/arguments.pxi``), one path for every call.  Inputs are
never written and never copied when they already have the compute dtype:
broadcast batch dims, transposed or negative strides, read-only and
memory-mapped arrays are passed to the kernels as they are, and so are the
storage types (float16, bfloat16, int8 keys and values) under a float32 compute.
Copies happen only for dtype conversions the kernels do not do (a storage type
under a float64 compute, other integers, big-endian data) and for misaligned
data.
"""
import numpy as np

from . import _dispatch, _docstrings, _lazy, _memory
from ._quantized import _refuse_masked as _refuse_masked_one
from ._reference_checks import _is_float8
from ._threads import _check_num_threads, resolve_num_threads
from .integrations import any_torch_tensor, torch_attention, torch_softmax

_K = _dispatch.kernels

__all__ = ["attention", "attention_backward", "attention_varlen", "attention_paged", "softmax", "log_softmax",
           "merge_attention"]


def _refuse_masked(args):
    for name, a in args:
        _refuse_masked_one(name, a, f"pass the mask as mask= (True = may attend) and the data as "
                                    f"numpy.ma.getdata({name})")


def _foreign_attention(q, k, v, options):
    """attention() for arguments that are not all NumPy arrays: dask arrays give a
    lazy result (fastattn.dask), torch tensors give tensors
    (fastattn.integrations.torch), masked arrays are refused.  Returns
    NotImplemented for anything else (array-likes), which the compiled argument
    path then converts.  Called only when an argument is not a plain ndarray."""
    if _lazy.any_dask(q, k, v, *options.values()):
        return _lazy.call("attention", (q, k, v), options)
    if any_torch_tensor(q, k, v, *options.values()):
        return torch_attention(q, k, v, **options)
    _refuse_masked((("q", q), ("k", k), ("v", v)) + tuple(options.items()))
    return NotImplemented


def _foreign_softmax(x, axis, out, num_threads, log_mode):
    """softmax()/log_softmax() for an x or out that is not a plain ndarray (see
    _foreign_attention)."""
    if _lazy.any_dask(x):
        return _lazy.call("log_softmax" if log_mode else "softmax", (x,),
                          dict(axis=axis, out=out, num_threads=num_threads))
    if any_torch_tensor(x, out):
        return torch_softmax(x, axis, out, num_threads, log_mode)
    _refuse_masked((("x", x),))
    return NotImplemented


_K.set_call_hooks(resolve_num_threads, _check_num_threads, _foreign_attention, _foreign_softmax)
_K.set_varlen_hooks(_refuse_masked)
_K.set_stream_min_bytes(_memory.stream_min_bytes())
_K.set_prefetch_wide(_memory.prefetch_wide(_dispatch._cpu.cpu_vendor()))
_K.set_prefetch_l2(_memory.prefetch_l2(_dispatch._cpu.cpu_vendor()))
attention = _K.attention
attention_backward = _K.attention_backward
attention_varlen = _K.attention_varlen
attention_paged = _K.attention_paged
softmax = _K.softmax
log_softmax = _K.log_softmax
for _f, _doc in ((attention, _docstrings.ATTENTION), (attention_backward, _docstrings.ATTENTION_BACKWARD),
                 (attention_varlen, _docstrings.ATTENTION_VARLEN), (attention_paged, _docstrings.ATTENTION_PAGED),
                 (softmax, _docstrings.SOFTMAX), (log_softmax, _docstrings.LOG_SOFTMAX)):
    _f.__doc__ = _doc
    _f.__module__ = "fastattn"


def _is_bfloat16(a):
    return a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.name == "bfloat16"


def _as_array(x, name):
    _refuse_masked(((name, x),))
    a = np.asarray(x)
    kind = a.dtype.kind
    if kind not in "fiub" and not _is_bfloat16(a):
        if kind == "c":
            raise TypeError(f"{name}: complex arrays are not supported (dtype {a.dtype})")
        raise TypeError(f"{name}: expected a real numeric array, got dtype {a.dtype}")
    return a


def _compute_dtype(*arrays):
    """The compute dtype of arrays promoted like np.result_type (float32 for float32,
    float16 and bfloat16, else float64)."""
    rt = np.result_type(*arrays)
    return np.dtype(np.float32) if rt in (np.float32, np.float16) or rt.name == "bfloat16" else np.dtype(np.float64)


# ---------------------------------------------------------------- merging partial results

def _merge_sinks(sinks, lse_shape, cdt):
    """sinks broadcast to the merged lse's shape (one per row: the batch dims,
    then the rows), in the compute dtype; ValueError / TypeError naming sinks."""
    _refuse_masked((("sinks", sinks),))
    s = np.asarray(sinks)
    if _is_float8(s):
        s = s.astype(np.float32)     # as the kernels take them (ml_dtypes' float8)
    s = _as_array(s, "sinks")
    if s.dtype.kind == "b":
        raise TypeError(f"sinks must be a real (float) array, got dtype {s.dtype}")
    batch = lse_shape[:-1]
    try:
        ok = np.broadcast_shapes(s.shape, batch) == batch
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"sinks with shape {s.shape} does not broadcast to the batch dimensions {batch} "
                         f"(lses' shape without the rows axis)")
    return np.broadcast_to(s.astype(cdt, copy=False)[..., None] if lse_shape else s.astype(cdt), lse_shape)


def merge_attention(outs, lses, sinks=None):
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
    cdt = _compute_dtype(*outs, *lses)
    # sinks: one more part per row, of lse = sink and output 0 (applied once, here)
    S = _merge_sinks(sinks, lses[0].shape, cdt) if sinks is not None else None
    L = np.stack([s.astype(cdt, copy=False) for s in lses])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        M = L.max(axis=0) if S is None else np.maximum(L.max(axis=0), S)
        nan_rows = np.isnan(L).any(axis=0) if S is None else np.isnan(L).any(axis=0) | np.isnan(S)
        M_safe = np.where(np.isfinite(M), M, 0).astype(cdt)
        w = np.where(L == -np.inf, 0, np.exp(L - M_safe))
        total = w.sum(axis=0)
        if S is not None:
            total = total + np.where(S == -np.inf, 0, np.exp(S - M_safe))
        seen = total > 0
        lse = np.where(seen, M_safe + np.log(np.where(seen, total, 1)), -np.inf).astype(cdt)
        # part by part into out and one scratch array: no temporary per part
        out = np.empty(outs[0].shape, dtype=cdt)
        tmp = np.empty(outs[0].shape, dtype=cdt) if len(outs) > 1 else None
        denom = np.where(seen, total, 1)
        for n, (wi, oi) in enumerate(zip(w, outs)):
            coef = (wi / denom)[..., None]
            if n == 0:
                np.multiply(coef, oi, out=out)
            else:
                np.multiply(coef, oi, out=tmp)
                out += tmp
        lse[nan_rows] = np.nan
        out[nan_rows] = np.nan
    return out, lse


merge_attention.__doc__ = _docstrings.MERGE_ATTENTION
