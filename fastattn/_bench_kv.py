"""The KV-cache formats and attention sinks of issue 34 in the timing harness
(``fastattn/_bench.py``, ``bench/compare.py --group kv``).

Loaded by path from ``_bench_cases.py`` (like ``_bench.py``, it must work outside the
package and import fastattn only in the fastattn runner).  A case's ``kv_dtype`` may be

* ``"float8_e4m3fn"`` / ``"float8_e5m2"``: k and v cast to ml_dtypes' float8
  (no scale), read in place by fastattn; torch gets the same bits as
  ``torch.float8_*`` and dequantizes (``k.float()``) before its SDPA;
* ``"u8"`` / ``"u4"``: a :class:`fastattn.QuantizedKV` of 8 / 4 bits with
  ``group_size`` (``fastattn.quantize_kv``'s asymmetric min/max codes, computed
  here by ``fastattn/_quantized.py`` loaded by path); torch gets the same codes,
  scales and zero points and dequantizes them per call (unpacking the nibbles
  for 4 bits), then SDPA -- what a torch user of such a cache writes.

``sinks`` (True) gives every query head a sink (seeded, N(0, 1)): fastattn gets
``sinks=``, torch the sink as one more key of value 0 whose score comes from a
float ``attn_mask`` column (built once, not timed).

Until the kernels take a QuantizedKV, ``fastattn.attention`` raises TypeError
on the u8 / u4 cases; the fastattn child then reports the case as unsupported
(``--`` and the reason in compare.py's tables) instead of failing.
"""
import importlib.util
import os

FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
QUANTIZED = {"u8": 8, "u4": 4}
KV_FORMATS = FLOAT8 + tuple(QUANTIZED)

_HERE = os.path.dirname(os.path.abspath(__file__))
_quantized = None


def _quantized_module():
    """fastattn/_quantized.py (pure NumPy) loaded by path: no package import, so
    no compiled kernels and no OpenMP runtime in a torch or peer child."""
    global _quantized
    if _quantized is None:
        spec = importlib.util.spec_from_file_location("fastattn_bench_quantized",
                                                      os.path.join(_HERE, "_quantized.py"))
        _quantized = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_quantized)
    return _quantized


def kv_cases(A):
    """The issue-34 cases (``A`` is _bench.attention_case); group "kv", extra.
    Decode B1 H32 Lq1 Lk8192 D128 and GQA decode Hq32 Hkv8, each format beside
    its float32 twin; sinks on prefill and decode beside the same calls without."""
    dec = dict(decode=True, extra=True, group="kv")
    cases = []
    for prefix, heads, twin in (("decode", {}, "decode-8k"), ("gqa-decode", {"Hkv": 8}, "gqa-decode-f32")):
        if prefix == "gqa-decode":
            cases.append(A("gqa-decode-int8", 1, 32, 1, 8192, 128, kv_dtype="int8", twin=twin, **heads, **dec,
                           note="int8 k, v with per-key scales; torch: k.float() * k_scale, then SDPA"))
        for suffix, fmt, extra in (("f8e4", "float8_e4m3fn", {}), ("f8e5", "float8_e5m2", {}),
                                   ("u8", "u8", {"group_size": 128}), ("u4", "u4", {"group_size": 32})):
            targets = {"float8_e4m3fn": {"twin": 1.8}, "float8_e5m2": {"twin": 1.8},
                       "u8": {"int8": 0.95}, "u4": {"twin": 6.0, "int8": 1.7}}[fmt]
            cases.append(A(f"{prefix}-{suffix}", 1, 32, 1, 8192, 128, kv_dtype=fmt, twin=twin,
                           int8_twin=f"{prefix}-int8", targets=targets, **extra, **heads, **dec,
                           note=_NOTES[fmt]))
    cases += [
        A("prefill-sinks", 1, 8, 1024, 1024, 64, sinks=True, twin="prefill", extra=True, group="kv",
          targets={"twin": 1 / 1.03}, note=_NOTES["sinks"]),
        A("decode-sinks", 1, 32, 1, 8192, 128, sinks=True, twin="decode-8k", targets={"twin": 1 / 1.03}, **dec),
        A("gqa-decode-sinks", 1, 32, 1, 8192, 128, Hkv=8, sinks=True, twin="gqa-decode-f32",
          targets={"twin": 1 / 1.03}, **dec),
    ]
    return cases


_NOTES = {
    "float8_e4m3fn": "float8 e4m3fn k, v (no scale); torch: k.float(), then SDPA",
    "float8_e5m2": "float8 e5m2 k, v (no scale); torch: k.float(), then SDPA",
    "u8": "QuantizedKV bits=8, G = D (one scale and zero point per key); torch: (codes - zero) * scale, "
          "then SDPA",
    "u4": "QuantizedKV bits=4, G = 32; torch: nibbles unpacked, (codes - zero) * scale, then SDPA",
    "sinks": "one sink per query head; torch: the sink as an extra key of value 0 (a float attn_mask "
             "column, built once)",
}


def is_quantized(case):
    return case.get("kv_dtype") in QUANTIZED


def stored_as(case):
    """What the storage table calls a case's K/V storage."""
    fmt = case.get("kv_dtype") or case.get("dtype", "float32")
    if fmt in QUANTIZED:
        return f"QuantizedKV {QUANTIZED[fmt]} bits, G {case['group_size']}"
    return fmt


def row_bytes(case, D):
    """Stored bytes of one key or value row of D elements, or None for the formats of _bench.kv_bytes."""
    fmt = case.get("kv_dtype")
    if fmt in FLOAT8:
        return D
    if fmt in QUANTIZED:
        G = case.get("group_size") or D
        return D * QUANTIZED[fmt] // 8 + 8 * (D // G)
    return None


def _float8_dtype(name, np):
    import ml_dtypes
    return np.dtype(getattr(ml_dtypes, name))


def stored_inputs(case, k, v, np):
    """{"k", "v", and for QuantizedKV "k_qscale", "k_qzero", "v_qscale", "v_qzero"} in the case's format."""
    fmt = case["kv_dtype"]
    if fmt in FLOAT8:
        dt = _float8_dtype(fmt, np)
        return {"k": k.astype(dt), "v": v.astype(dt)}
    out = {}
    quantize_kv = _quantized_module().quantize_kv
    for name, x in (("k", k), ("v", v)):
        c = quantize_kv(x, bits=QUANTIZED[fmt], group_size=case.get("group_size"))
        out[name], out[name + "_qscale"], out[name + "_qzero"] = c.data, c.scale, c.zero
    return out


def sinks_input(case, np):
    return np.random.default_rng(1).standard_normal(case["Hq"]).astype(np.float32)


def values(case, inputs, name, index, np):
    """float64 values of inputs[name][index] (index keeps the last two axes whole)."""
    a = inputs[name][index]
    if not is_quantized(case):
        return a.astype(np.float64)
    if QUANTIZED[case["kv_dtype"]] == 8:
        codes = a.astype(np.float64)
    else:
        codes = np.empty(a.shape[:-1] + (2 * a.shape[-1],))
        codes[..., 0::2] = a & 0x0F
        codes[..., 1::2] = a >> 4
    group = np.arange(codes.shape[-1]) // (case.get("group_size") or codes.shape[-1])
    scale = inputs[name + "_qscale"][index].astype(np.float64)[..., group]
    zero = inputs[name + "_qzero"][index].astype(np.float64)[..., group]
    return (codes - zero) * scale


def naive_with_sinks(q, k, v, scale, sink, np):
    """float64 attention of (1, 1, Lq, D) rows with one sink logit (no mask)."""
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    m = np.maximum(s.max(axis=-1, keepdims=True), sink)
    p = np.exp(s - m)
    return (p @ v / (p.sum(axis=-1, keepdims=True) + np.exp(sink - m)))[0, 0]


def fastattn_kv(fastattn, case, inputs):
    """(k, v) as fastattn.attention takes them: QuantizedKV wraps the codes in place."""
    if not is_quantized(case):
        return inputs["k"], inputs["v"]
    bits, G = QUANTIZED[case["kv_dtype"]], case.get("group_size")
    return tuple(fastattn.QuantizedKV(inputs[n], inputs[n + "_qscale"], inputs[n + "_qzero"],
                                      bits=bits, group_size=G or case["D"]) for n in "kv")


def unsupported_reason(exc):
    return f"fastattn.attention does not take this cache yet ({type(exc).__name__}: {exc})"


def torch_call(torch, F, case, inputs, kw, np):
    """The torch call of a float8, QuantizedKV or sinks case (dequantize per call, then SDPA)."""
    q = torch.from_numpy(inputs["q"])
    fmt = case.get("kv_dtype")
    if fmt in FLOAT8:
        tdt = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}[fmt]
        k8, v8 = (torch.from_numpy(inputs[n].view(np.uint8)).view(tdt) for n in "kv")
        return lambda: F.scaled_dot_product_attention(q, k8.float(), v8.float(), **kw).numpy()
    if fmt in QUANTIZED:
        bits, D = QUANTIZED[fmt], case["D"]
        G = case.get("group_size") or D
        parts = {n: [torch.from_numpy(inputs[n + s]) for s in ("", "_qscale", "_qzero")] for n in "kv"}

        def deq(data, scale, zero):
            if bits == 4:
                data = torch.stack((data & 0x0F, data >> 4), dim=-1).flatten(-2)
            g = data.float().unflatten(-1, (D // G, G))
            return ((g - zero.unsqueeze(-1)) * scale.unsqueeze(-1)).flatten(-2)
        return lambda: F.scaled_dot_product_attention(q, deq(*parts["k"]), deq(*parts["v"]), **kw).numpy()
    if case.get("sinks"):
        if case["causal"] or case["mask"] or case["window"] or case["kv_lengths"] or case.get("alibi"):
            raise ValueError("the sinks cases here are unmasked (the extra key must stay visible)")
        # the sink as one more key: value 0, score = the sink (a float mask column)
        k, v = (torch.from_numpy(inputs[n]) for n in "kv")
        B, Hkv, Lk, D = k.shape
        k1 = torch.cat((k, k.new_zeros(B, Hkv, 1, D)), dim=2)
        v1 = torch.cat((v, v.new_zeros(B, Hkv, 1, v.shape[-1])), dim=2)
        bias = torch.zeros(1, case["Hq"], 1, Lk + 1)
        bias[0, :, 0, Lk] = torch.from_numpy(inputs["sinks"])
        kw = dict(kw, attn_mask=bias)
        return lambda: F.scaled_dot_product_attention(q, k1, v1, **kw).numpy()
    return None
