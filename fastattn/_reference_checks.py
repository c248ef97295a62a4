"""Argument checks and conversions of the reference (pure NumPy, float64).

Part of :mod:`fastattn.reference` (the specification), shared by its forward,
backward and batched functions: turning array-likes into float64 (bfloat16,
float8 and :class:`fastattn.QuantizedKV` inputs included), scaling int8 / float8
keys and values by their scales, and checking and normalising the options
(``axis``, ``causal``, ``window``, ``scale``, ``softcap``, ``align``,
``kv_lengths`` / ``kv_start`` tables, broadcasting).  Each raises the
TypeError / ValueError that the public functions document.
"""
from __future__ import annotations

import math
import numbers
import sys

import numpy as np

_CAUSAL_MODES = ("top_left", "bottom_right")


# --------------------------------------------------------------------------- dtypes
def _is_bfloat16(a):
    """An array of the bfloat16 dtype (ml_dtypes), recognised by the dtype itself."""
    return a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.name == "bfloat16"


_FLOAT8_NAMES = ("float8_e4m3fn", "float8_e5m2")


def _is_float8(a):
    """An array of ml_dtypes' float8_e4m3fn or float8_e5m2, recognised by the
    dtype's name and size (ml_dtypes is never imported here)."""
    return a.dtype.itemsize == 1 and a.dtype.kind in "Vf" and a.dtype.name in _FLOAT8_NAMES


def _is_quantized(x):
    """A fastattn.QuantizedKV, recognised by its class.  None can exist before
    ``fastattn._quantized`` is imported, so that module is looked up, never
    imported: this also holds when the reference was loaded from its path,
    without the package."""
    mod = sys.modules.get("fastattn._quantized")
    return mod is not None and isinstance(x, mod.QuantizedKV)


def _dequantized(c):
    """The float64 values of a QuantizedKV, from its documented fields: element d
    of a row is (code - zero[..., d // G]) * scale[..., d // G]; 8 bits: one
    code per byte; 4 bits: element 2i in the low nibble of byte i, 2i + 1 in the
    high nibble."""
    data = np.asarray(c.data)
    if c.bits == 8:
        codes = data.astype(np.float64)
    else:
        codes = np.empty(data.shape[:-1] + (2 * data.shape[-1],))
        codes[..., 0::2] = data & 0x0F
        codes[..., 1::2] = data >> 4
    group = np.arange(codes.shape[-1]) // c.group_size
    scale = np.asarray(c.scale, np.float64)[..., group]
    zero = np.asarray(c.zero, np.float64)[..., group]
    return (codes - zero) * scale


def _kv_input(x, name):
    """k or v as (raw, float64 values): a QuantizedKV is dequantized from its
    fields (raw: the QuantizedKV), anything else goes through _as_f64."""
    if _is_quantized(x):
        return x, _dequantized(x)
    raw = np.asarray(x)
    return raw, _as_f64(raw, name)


def _as_f64(x, name):
    """Convert a real numeric / bool array-like to float64 (bfloat16 and float8
    included); TypeError otherwise."""
    a = np.asarray(x)
    if a.dtype.kind not in "biuf" and not _is_bfloat16(a) and not _is_float8(a):
        raise TypeError(
            f"{name}: unsupported dtype {a.dtype}; expected a real numeric or boolean array"
        )
    return a.astype(np.float64, copy=False)


def _kv_scaled(kv64, kv_raw, scale, name, kvname):
    """An integer (int8) or float8 k or v times its k_scale / v_scale (float64),
    the scale broadcast per key (to kv.shape[:-1] + (1,)) or per channel (to
    kv.shape[:-2] + (1, D))."""
    if scale is None:
        return kv64
    s = np.asarray(scale)
    if s.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real (float) array, got dtype {s.dtype}")
    if _is_quantized(kv_raw):
        raise TypeError(f"{name} is given for a QuantizedKV {kvname}: its scales are its own fields")
    if kv_raw.dtype.kind not in "iu" and not _is_float8(kv_raw):
        raise TypeError(f"{name} is given for {kvname} of dtype {kv_raw.dtype}: scales are for integer "
                        f"(int8) and float8 {kvname} only")
    per_key = kv64.shape[:-1] + (1,)
    per_channel = kv64.shape[:-2] + (1, kv64.shape[-1])

    def fits(target):
        try:
            return s.ndim <= len(target) and np.broadcast_shapes(s.shape, target) == target
        except ValueError:
            return False

    if not (fits(per_key) or fits(per_channel)):
        raise ValueError(f"{name} with shape {s.shape} broadcasts neither to {per_key} (per key) nor to "
                         f"{per_channel} (per channel)")
    s = s.astype(np.float64)
    if not np.isfinite(s).all():
        raise ValueError(f"{name} must be finite")
    return kv64 * s


# --------------------------------------------------------------------------- options
def _normalize_axis(axis, ndim, name="axis"):
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of bounds for an array of ndim {ndim}")
    return axis % ndim


def _check_causal(causal):
    if causal is None or (isinstance(causal, (bool, np.bool_)) and not causal):
        return None
    if isinstance(causal, (bool, np.bool_)):
        return "top_left"
    if isinstance(causal, str):
        if causal in _CAUSAL_MODES:
            return causal
        raise ValueError(
            f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}"
        )
    raise TypeError(f"causal must be a bool or one of {_CAUSAL_MODES}, got {causal!r}")


def _window_side(x, which):
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"window {which} side must be a non-negative int or None, got {x!r}")
    if x < 0:
        raise ValueError(f"window {which} side must be >= 0, got {x}")
    return int(x)


def _check_window(window):
    if window is None:
        return None, None
    if isinstance(window, numbers.Integral) and not isinstance(window, (bool, np.bool_)):
        w = _window_side(window, "left")
        return w, w
    if isinstance(window, (tuple, list)) and len(window) == 2:
        return _window_side(window[0], "left"), _window_side(window[1], "right")
    raise TypeError(f"window must be None, an int or a (left, right) pair, got {window!r}")


def _scalar(x):
    """A 0-d array as its scalar (np.array(2.0) is a real number here too)."""
    return x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x


def _check_scale(scale, dk):
    scale = _scalar(scale)
    if scale is None:
        return 1.0 / math.sqrt(dk) if dk > 0 else 1.0
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return scale


def _check_softcap(softcap):
    softcap = _scalar(softcap)
    if softcap is None:
        return None
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a positive real number or None, got {softcap!r}")
    c = float(softcap)
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"softcap must be a finite number > 0, got {softcap!r}")
    return c


def _broadcast_arg(a, shape, name, what):
    try:
        return np.broadcast_to(a, shape)
    except ValueError:
        raise ValueError(
            f"{name} with shape {a.shape} is not broadcastable to {what} {shape}"
        ) from None


def _check_align(align):
    if align is None or align == "top_left":
        return "top_left"
    if isinstance(align, str):
        if align == "bottom_right":
            return align
        raise ValueError(f"align must be 'top_left' or 'bottom_right', got {align!r}")
    raise TypeError(f"align must be 'top_left' or 'bottom_right', got {align!r}")


def _length_table(x, name, batch, Lk):
    """kv_lengths / kv_start: integers broadcast to the batch dims, each in [0, Lk],
    as a batch + (1, 1) int64 array.  A 1-D table with two or more batch dims is
    one value per sequence -- per element of the leading batch dim -- never per head."""
    lens = np.asarray(x)
    if lens.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {lens.dtype}")
    if lens.ndim == 1 and len(batch) >= 2 and lens.shape[0] != 1:
        if lens.shape[0] != batch[0]:
            raise ValueError(f"{name}: a 1-D table holds one value per sequence (the leading batch dim, "
                             f"{batch[0]}), got {lens.shape[0]} values")
        lens = lens.reshape((lens.shape[0],) + (1,) * (len(batch) - 1))
    lens = _broadcast_arg(lens, batch, name, "the batch dims")
    if lens.size and (lens.min() < 0 or lens.max() > Lk):
        raise ValueError(f"{name} must satisfy 0 <= value <= Lk={Lk}; got values in "
                         f"[{lens.min()}, {lens.max()}]")
    return lens.astype(np.int64)[..., None, None]
