"""Quantized KV caches: :class:`QuantizedKV` (asymmetric 8-bit and 4-bit codes
with a scale and a zero point per group of the head dimension) and
:func:`quantize_kv`.

The format (the one OpenVINO's CPU plugin keeps for its u8 / u4 caches):

* the logical array has shape ``(..., L, D)``; groups of ``group_size`` (G)
  consecutive elements run along the last axis, G divides D;
* ``scale`` and ``zero`` are float32 arrays of shape ``shape[:-1] + (D // G,)``;
* 8 bits: ``data`` is uint8 of shape ``shape``, codes 0..255;
* 4 bits: ``data`` is uint8 of shape ``shape[:-1] + (D // 2,)``, element ``2i``
  of a row in the low nibble of byte ``i``, element ``2i + 1`` in the high
  nibble, codes 0..15;
* element ``d`` of a row means ``(code - zero[..., d // G]) * scale[..., d // G]``.

Pure NumPy: importable without the compiled kernels.
"""
import numbers

import numpy as np

__all__ = ["QuantizedKV", "quantize_kv"]


def _refuse_masked(name, x, hint=None):
    """TypeError naming a numpy.ma argument, whose mask would be ignored (hint:
    what to pass instead; fastattn._api gives q, k, v theirs)."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name}: masked arrays (numpy.ma) are not supported: their mask would be ignored; "
                        + (hint or f"pass numpy.ma.getdata({name}) (or fill the masked entries) instead"))


def _check_bits(bits):
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, numbers.Integral):
        raise TypeError(f"bits must be 4 or 8, got {bits!r}")
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    return int(bits)


def _check_group_size(group_size, D, bits):
    if group_size is None:
        group_size = D if bits == 8 else min(32, D)
    if isinstance(group_size, (bool, np.bool_)) or not isinstance(group_size, numbers.Integral):
        raise TypeError(f"group_size must be a positive int, got {group_size!r}")
    group_size = int(group_size)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if D % group_size:
        raise ValueError(f"group_size {group_size} does not divide the head dimension D = {D}")
    if bits == 4 and group_size % 2:
        raise ValueError(f"group_size must be even for 4 bits (two codes per byte), got {group_size}")
    return group_size


class QuantizedKV:
    """A key or value cache of uint8 codes with a scale and zero point per group.

    The logical shape is ``(..., L, D)``; a float32 scale and zero point belong
    to each group of ``group_size`` consecutive elements of the last axis.
    Element ``d`` of a row is ``(code - zero[..., d // group_size]) *
    scale[..., d // group_size]``.  ``bits=8``: ``data`` has the logical shape,
    one code (0..255) per byte.  ``bits=4``: ``data`` has shape ``(..., L, D //
    2)``, element ``2i`` of a row in the **low** nibble of byte ``i`` and element
    ``2i + 1`` in the high nibble (codes 0..15).  ``scale.shape == zero.shape ==
    shape[:-1] + (D // group_size,)``.

    The constructor wraps existing buffers (a serving engine's cache) without
    copying them: ``data`` must be uint8, ``scale`` and ``zero`` float32 (other
    real dtypes are converted: they are small), all three with the batch and
    key axes of the logical shape.  :func:`fastattn.attention` and
    :func:`fastattn.attention_paged` read the codes in place; nothing is ever
    dequantized into a copy of the cache.  ``codes()`` and ``dequantize()``
    return the codes (unpacked) and the values as new arrays, for inspection
    and tests.

    Parameters
    ----------
    data : numpy.ndarray of uint8
        The codes, ``(..., L, D)`` for 8 bits, ``(..., L, D // 2)`` for 4 bits.
    scale, zero : array_like of float32
        ``(..., L, D // group_size)``.  ``scale`` must be finite; ``zero`` too.
    bits : {4, 8}
    group_size : int
        G, dividing D (even for 4 bits).

    Attributes
    ----------
    data, scale, zero, bits, group_size
        As given.
    shape : tuple
        The logical shape ``(..., L, D)``.
    dtype : numpy.dtype
        float32 (the dtype of the values the codes stand for).
    ndim : int

    Raises
    ------
    TypeError
        ``data`` not a uint8 ndarray, ``scale`` / ``zero`` not real, ``bits`` or
        ``group_size`` not ints.
    ValueError
        ``bits`` not 4 or 8, ``group_size`` not dividing D (or odd for 4 bits),
        ``scale`` / ``zero`` of the wrong shape or not finite.  Each message
        names the field.

    See Also
    --------
    quantize_kv : Quantize values into a QuantizedKV.
    fastattn.reference.attention : The float64 specification, computing a QuantizedKV from its fields.
    fastattn.attention : Takes a QuantizedKV for ``k`` and / or ``v``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 2, 32)
    >>> c = fastattn.quantize_kv(x, bits=4, group_size=16)
    >>> c.shape, c.data.shape, c.scale.shape
    ((1, 2, 32), (1, 2, 16), (1, 2, 2))
    """

    __slots__ = ("data", "scale", "zero", "bits", "group_size", "shape")

    def __init__(self, data, scale, zero, bits=8, group_size=None):
        bits = _check_bits(bits)
        for name, x in (("data", data), ("scale", scale), ("zero", zero)):
            _refuse_masked(name, x)
        if not isinstance(data, np.ndarray):
            raise TypeError(f"data must be a numpy.ndarray of uint8, got {type(data).__name__}")
        if data.dtype != np.uint8:
            raise TypeError(f"data must be uint8 (the codes), got dtype {data.dtype}")
        if data.ndim < 2:
            raise ValueError(f"data must have at least 2 dimensions (..., L, D), got shape {data.shape}")
        D = data.shape[-1] * (2 if bits == 4 else 1)
        # D = 0: any valid group size (a plain int: the kernels check it again)
        group_size = _check_group_size(group_size if D or group_size is not None else 2, D, bits)
        fields = {}
        for name, x in (("scale", scale), ("zero", zero)):
            a = np.asarray(x)
            if a.dtype.kind not in "fiu" or a.dtype.kind == "b":
                raise TypeError(f"{name} must be a real (float32) array, got dtype {a.dtype}")
            if a.dtype != np.float32:
                a = a.astype(np.float32)
            want = QuantizedKV._group_shape(data.shape[:-1] + (D,), group_size)
            if a.shape != want:
                raise ValueError(f"{name} has shape {a.shape}, expected {want} (data.shape[:-1] + "
                                 f"(D // group_size,) with D = {D}, group_size = {group_size})")
            if a.size and not np.isfinite(a).all():
                raise ValueError(f"{name} must be finite")
            fields[name] = a
        self.data = data
        self.scale = fields["scale"]
        self.zero = fields["zero"]
        self.bits = bits
        self.group_size = group_size
        self.shape = data.shape[:-1] + (D,)

    @staticmethod
    def _data_shape(shape, bits):
        """The shape of ``data`` for a logical ``shape`` ``(..., L, D)``: ``shape``
        itself (8 bits) or ``D // 2`` bytes per row (4 bits)."""
        return tuple(shape) if bits == 8 else tuple(shape[:-1]) + (shape[-1] // 2,)

    @staticmethod
    def _group_shape(shape, group_size):
        """The shape of ``scale`` and ``zero`` for a logical ``shape``:
        ``shape[:-1] + (D // group_size,)``.  The one rule for the constructor and
        for the kernels' check of a QuantizedKV argument (whose fields may have been
        reassigned since)."""
        D = shape[-1]
        return tuple(shape[:-1]) + (D // group_size if D else 0,)

    @property
    def dtype(self):
        return np.dtype(np.float32)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def nbytes(self):
        """Bytes of the codes, scales and zero points."""
        return self.data.nbytes + self.scale.nbytes + self.zero.nbytes

    def codes(self):
        """The codes as a uint8 array of the logical shape (4 bits: unpacked, a new array)."""
        if self.bits == 8:
            return self.data
        out = np.empty(self.shape, np.uint8)
        out[..., 0::2] = self.data & 0x0F
        out[..., 1::2] = self.data >> 4
        return out

    def dequantize(self, dtype=np.float32):
        """The values ``(code - zero) * scale`` as a new array of the logical shape.
        For inspection and tests: the forward attention functions never call it
        (:func:`fastattn.attention_backward`, which has no quantized readers,
        computes the same values in its compute dtype)."""
        return self._values(np.float32).astype(dtype, copy=False)

    def _values(self, dtype):
        """``(code - zero) * scale`` of the logical shape, computed in ``dtype``."""
        c = self.codes().astype(dtype)
        G = self.group_size
        if self.shape[-1]:
            c = c.reshape(self.shape[:-1] + (self.shape[-1] // G, G))
            c = (c - self.zero.astype(dtype)[..., None]) * self.scale.astype(dtype)[..., None]
        return c.reshape(self.shape)

    def __repr__(self):
        return (f"QuantizedKV(shape={self.shape}, bits={self.bits}, group_size={self.group_size}, "
                f"{self.nbytes} bytes)")


def quantize_kv(x, bits=8, group_size=None):
    """Quantize a key or value array to a :class:`QuantizedKV`.

    Asymmetric min/max quantization per group of the last axis.  For each group of ``group_size`` elements of a row: ``scale = (max - min) /
    (2**bits - 1)``, ``zero = -min / scale``, ``code = clip(round(x / scale +
    zero), 0, 2**bits - 1)``: code 0 stands for the group's minimum, the top code
    for its maximum, and every element comes back within ``scale / 2`` (up to
    float32 rounding).  A constant group gets ``scale = 1``, ``zero = -value``
    (so its codes are 0 and it comes back exactly), never NaN or inf.

    Parameters
    ----------
    x : array_like, (..., L, D)
        Real values (float32 is what the result stands for; float64, float16,
        bfloat16 are read as their values).  Finite.
    bits : {8, 4}
    group_size : int, optional
        Elements per group, dividing D (even for 4 bits).  Default: D for 8 bits
        (one scale per token and head), 32 for 4 bits (D when D < 32).

    Returns
    -------
    QuantizedKV
        The codes, scales and zero points of ``x``, of logical shape
        ``x.shape``; :func:`fastattn.attention` and
        :func:`fastattn.attention_paged` read it in place.

    Raises
    ------
    ValueError
        x with fewer than 2 dims or non-finite values, bits not 4 or 8,
        group_size not dividing D.
    TypeError
        A non-real x.

    See Also
    --------
    QuantizedKV : The format, and wrapping existing buffers.
    fastattn.attention : Takes a QuantizedKV for ``k`` and / or ``v``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> x = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
    >>> c = fastattn.quantize_kv(x, bits=8)
    >>> bool(np.all(np.abs(c.dequantize() - x) <= c.scale.max() / 2 + 1e-6))
    True
    """
    bits = _check_bits(bits)
    _refuse_masked("x", x)
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" and not (a.dtype.kind == "V" and a.dtype.name == "bfloat16"):
        raise TypeError(f"x must be a real array, got dtype {a.dtype}")
    if a.ndim < 2:
        raise ValueError(f"x must have at least 2 dimensions (..., L, D), got shape {a.shape}")
    D = a.shape[-1]
    if bits == 4 and D % 2:
        raise ValueError(f"x: 4-bit codes pack two elements per byte, the head dimension D = {D} must be even")
    G = _check_group_size(group_size, D, bits) if D else 1
    a = a.astype(np.float64)
    if a.size and not np.isfinite(a).all():
        raise ValueError("x must be finite")
    top = (1 << bits) - 1
    ng = D // G if D else 0
    g = a.reshape(a.shape[:-1] + (ng, G))
    lo = g.min(axis=-1) if a.size else np.zeros(g.shape[:-1])
    hi = g.max(axis=-1) if a.size else np.zeros(g.shape[:-1])
    scale = ((hi - lo) / top).astype(np.float32)
    const = scale == 0
    scale[const] = 1
    # the zero point in float32 (what the kernels use), codes computed against the
    # float32 scale and zero so the round trip holds for the stored fields
    zero = (-lo / scale.astype(np.float64)).astype(np.float32)
    codes = np.rint(g / scale[..., None].astype(np.float64) + zero[..., None].astype(np.float64))
    codes = np.clip(codes, 0, top).astype(np.uint8).reshape(a.shape)
    if bits == 4:
        data = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    else:
        data = codes
    return QuantizedKV(data, scale, zero, bits=bits, group_size=G)
