#!/usr/bin/env python
"""Accuracy of each KV-cache format: relative RMS error of attention outputs.

    python bench/kv_accuracy.py            # the table of docs/guide.rst ("Cache formats")
    python bench/kv_accuracy.py --json out.json

(from a source tree built in place: ``PYTHONPATH=. python bench/kv_accuracy.py``)

For every format the keys and values are stored in it, attention is computed
with the same float32 queries, and the output is compared with the exact
(float64) attention over the float32 keys and values:
``sqrt(sum (out - exact)^2 / sum exact^2)`` over every output element.  So an
error counts both what storing the cache loses and what the computation rounds.

* float32, float16, bfloat16, int8 (symmetric, one scale per key, the scales
  ``max |x| / 127`` of each key or value row), float8 e4m3fn / e5m2 (a plain
  cast, no scale) and e4m3fn with one scale per tensor (``max |x| / 448``, the
  format's largest value): fastattn's kernels, which read these in place and
  compute in float32.
* QuantizedKV (``fastattn.quantize_kv``: asymmetric u8 with one group per row
  (G = D) or G = 32, 4-bit with G = 32 or 64): the kernels when they take a
  QuantizedKV, else :func:`fastattn.reference.attention` in float64 on the
  codes, scales and zero points (the "computed by" column says which) -- the
  error is then the format's alone.
* torch's ``scaled_dot_product_attention`` with q, k and v in bfloat16 (its
  output in bfloat16), against the same float64 attention: the error a torch
  user of a bf16 model gets (when torch is installed).

Two kinds of data:

(a) random: q, k, v standard Gaussian, B1 H8 Lq64 Lk2048 D128 (scores about
    N(0, 1)), no mask;
(b) model: the queries, keys (after rotary embedding) and values of every layer
    of a small Llama (transformers' ``LlamaConfig``: 4 layers, hidden 1024, 8
    query and 2 key/value heads of 128, 512 tokens of seeded random ids),
    causal.  The weights are **random-initialised** (seeded; no pretrained
    weights are downloaded), so the K/V have the statistics of an untrained
    model -- no outlier channels or attention spikes of a trained one.
    Skipped, with the reason, when transformers or torch is not installed.

Deterministic (fixed seeds); well under a minute on two cores.
"""
import argparse
import json
import math
import sys
import time

import numpy as np

import fastattn
from fastattn import reference

# (label, kind, parameters); bytes per element of a D128 row are computed below
FORMATS = [
    ("float32", "plain", {"dtype": "float32"}),
    ("float16", "plain", {"dtype": "float16"}),
    ("bfloat16", "plain", {"dtype": "bfloat16"}),
    ("int8, scale per key", "int8", {}),
    ("float8 e4m3fn", "plain", {"dtype": "float8_e4m3fn"}),
    ("float8 e4m3fn, scale per tensor", "float8-scaled", {"dtype": "float8_e4m3fn", "max": 448.0}),
    ("float8 e5m2", "plain", {"dtype": "float8_e5m2"}),
    ("u8 asymmetric, G = D", "qkv", {"bits": 8, "group_size": None}),
    ("u8 asymmetric, G = 32", "qkv", {"bits": 8, "group_size": 32}),
    ("4-bit, G = 32", "qkv", {"bits": 4, "group_size": 32}),
    ("4-bit, G = 64", "qkv", {"bits": 4, "group_size": 64}),
]


def _dtype(name):
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def stored_bytes(kind, params, D):
    """Bytes per element of a stored row of D elements (scales and zero points included)."""
    if kind in ("plain", "float8-scaled"):
        return _dtype(params["dtype"]).itemsize
    if kind == "int8":
        return (D + 4) / D
    G = params["group_size"] or (D if params["bits"] == 8 else 32)
    return (D * params["bits"] / 8 + 8 * D // G) / D


def store(x, kind, params):
    """x (float32) in a format: (what attention is given, extra keyword arguments)."""
    if kind == "plain":
        return x.astype(_dtype(params["dtype"])), {}
    if kind == "float8-scaled":         # the tensor's largest |x| to the format's largest value
        s = np.float32(max(float(np.abs(x).max()), 1e-30) / params["max"])
        return (x / s).astype(_dtype(params["dtype"])), {"scale": s}
    if kind == "int8":
        s = (np.maximum(np.abs(x).max(axis=-1, keepdims=True), 1e-30) / 127).astype(np.float32)
        return np.clip(np.rint(x / s), -127, 127).astype(np.int8), {"scale": s}
    return fastattn.quantize_kv(x, bits=params["bits"], group_size=params["group_size"]), {}


def attend(q, k, v, kind, params, causal):
    """(output as float64, 'kernels' or 'reference') for q, k, v stored in a format."""
    ks, kx = store(k, kind, params)
    vs, vx = store(v, kind, params)
    kw = {"causal": causal}
    if kind in ("int8", "float8-scaled"):
        kw.update(k_scale=kx["scale"], v_scale=vx["scale"])
    try:
        return np.asarray(fastattn.attention(q, ks, vs, **kw), np.float64), "kernels"
    except TypeError:
        if kind != "qkv":            # only QuantizedKV may be unsupported by the kernels (so far)
            raise
    return np.asarray(reference.attention(q, ks, vs, **kw), np.float64), "reference (float64)"


def torch_bf16(q, k, v, causal):
    """torch's SDPA with q, k, v in bfloat16 (output bfloat16, as float64); None without torch."""
    try:
        import torch
    except ImportError:
        return None
    import torch.nn.functional as F
    t = [torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16) for a in (q, k, v)]
    with torch.no_grad():
        out = F.scaled_dot_product_attention(*t, is_causal=causal, enable_gqa=q.shape[-3] != k.shape[-3])
    return out.float().numpy().astype(np.float64)


def rel_rms(got, exact):
    return math.sqrt(float(np.sum((got - exact) ** 2)) / float(np.sum(exact ** 2)))


def random_data(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 8, 64, 128), dtype=np.float32)
    k = rng.standard_normal((1, 8, 2048, 128), dtype=np.float32)
    v = rng.standard_normal((1, 8, 2048, 128), dtype=np.float32)
    return [(q, k, v)], False


def model_data(seed=0, tokens=512):
    """[(q, k, v) per layer] of a small random-initialised Llama, captured where
    attention is called (after rotary; K/V with their own head count), and causal=True."""
    import torch
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    captured = []

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured.append(tuple(t.detach().float().numpy().copy() for t in (query, key, value)))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("fastattn_kv_accuracy_capture", capture)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                         max_position_embeddings=2 * tokens, rope_theta=10000.0,
                         attn_implementation="fastattn_kv_accuracy_capture")
    model = LlamaForCausalLM(config).eval()
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, config.vocab_size, (1, tokens)))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    return captured, True


def measure(layers, causal, with_torch=True):
    """{label: (rel RMS over every layer's output, computed by)} and torch's bf16 error."""
    exact = [reference.attention(q, k, v, causal=causal) for q, k, v in layers]

    def pooled(outs):
        num = sum(float(np.sum((o - e) ** 2)) for o, e in zip(outs, exact))
        den = sum(float(np.sum(e ** 2)) for e in exact)
        return math.sqrt(num / den)
    res = {}
    for label, kind, params in FORMATS:
        outs, how = [], None
        for q, k, v in layers:
            out, how = attend(q, k, v, kind, params, causal)
            outs.append(out)
        res[label] = (pooled(outs), how)
    if with_torch:
        outs = [torch_bf16(q, k, v, causal) for q, k, v in layers]
        res["torch SDPA, bfloat16 q, k, v"] = (pooled(outs), "torch") if outs[0] is not None else (None, None)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    fastattn.set_num_threads(2)
    columns = {"random": measure(*random_data())}
    why_no_model = None
    try:
        columns["model"] = measure(*model_data())
    except ImportError as exc:
        why_no_model = f"model column skipped: {exc}"
    labels = [f[0] for f in FORMATS] + ["torch SDPA, bfloat16 q, k, v"]
    D = 128
    bytes_of = {label: stored_bytes(kind, params, D) for label, kind, params in FORMATS}
    print("| format | bytes / element (D 128) | random Gaussian | random-init Llama K/V | computed by |")
    print("|---|---:|---:|---:|---|")
    for label in labels:
        cells = []
        for col in ("random", "model"):
            e = columns.get(col, {}).get(label, (None, None))[0]
            cells.append("--" if e is None else f"{e:.1e}")
        how = columns["random"].get(label, (None, None))[1] or "--"
        nb = f"{bytes_of[label]:.3g}" if label in bytes_of else "2"
        print(f"| {label} | {nb} | {cells[0]} | {cells[1]} | {how} |")
    if why_no_model:
        print(f"\n{why_no_model}")
    print(f"\n({time.perf_counter() - t0:.0f} s; errors: relative RMS of the attention output against "
          "float64 attention over the float32 K/V)", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({c: {k: v[0] for k, v in col.items()} for c, col in columns.items()}, f, indent=1)


if __name__ == "__main__":
    main()
