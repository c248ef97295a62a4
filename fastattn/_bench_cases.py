"""The benchmark cases of the timing harness (fastattn/_bench.py): what a case is,
the tables of cases, and what follows from a case without running it -- its
description, its arithmetic (visible pairs, FLOPs, bytes) and its inputs.

Loaded by path from ``_bench.py`` (like it, it must work outside the package, so it
imports nothing from the package); every name is also importable from
``fastattn._bench``, which callers use.  NumPy is passed in (``np``).

A case is a plain dict (it travels to the child as JSON)::

    {"id": "prefill", "kind": "attention", "B": 1, "Hq": 8, "Hkv": 8, "Lq": 1024,
     "Lk": 1024, "D": 64, "Dv": 64, "dtype": "float32", "causal": False,
     "window": None, "mask": None, "kv_lengths": None, "memory": False}

``kind`` is "attention" or "softmax" (then ``rows`` and ``cols``).  ``mask`` is
"random" for a boolean (Lq, Lk) mask where True means "may attend", as in
torch.  ``window`` is ``[left, right]``: query i sees keys i-left .. i+right.
``kv_lengths`` lists, per batch entry, how many leading keys are valid.
``alibi`` (optional, absent in older saved runs) adds ALiBi with the usual
slopes 2^(-8(h+1)/H): fastattn gets ``alibi_slopes``, torch and NumPy the same
-slope·|i - j| as a float bias.  ``backward`` (optional) times the gradients
instead of the forward: "bwd" one backward, "fwd+bwd" a forward and a backward.
"""
import importlib.util
import os


def attention_case(id, B, Hq, Lq, Lk, D, *, Hkv=None, Dv=None, dtype="float32",
                   causal=False, window=None, mask=None, kv_lengths=None,
                   memory=False, **extra):
    """Return an attention case dict (see the module docstring)."""
    case = dict(id=id, kind="attention", B=B, Hq=Hq, Hkv=Hkv or Hq, Lq=Lq, Lk=Lk,
                D=D, Dv=Dv or D, dtype=dtype, causal=causal,
                window=list(window) if window is not None else None, mask=mask,
                kv_lengths=list(kv_lengths) if kv_lengths is not None else None,
                memory=memory)
    case.update(extra)
    return case


def softmax_case(id, rows, cols, dtype="float32", **extra):
    """Return a softmax case dict (softmax over the last axis of rows x cols)."""
    case = dict(id=id, kind="softmax", rows=rows, cols=cols, dtype=dtype, memory=False)
    case.update(extra)
    return case


_A, _S = attention_case, softmax_case


def _load_sibling(name, filename):
    # by path, like this file itself: importing the package would load the kernels
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                     filename))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# float8 and QuantizedKV caches, attention sinks (issue 34): fastattn/_bench_kv.py
_KV = _load_sibling("fastattn_bench_kv", "_bench_kv.py")

# The standard cases of the project's benchmarking guide (float32 unless noted,
# torch layout B, H, L, D).  ``decode`` marks cases bound by reading K and V;
# ``slow_numpy`` the ones where the naive NumPy baseline takes seconds.
STANDARD_CASES = [
    _A("prefill", 1, 8, 1024, 1024, 64),
    _A("long", 1, 4, 4096, 4096, 128, slow_numpy=True),
    _A("causal", 1, 8, 1024, 1024, 64, causal=True),
    _A("causal-batch", 4, 8, 512, 512, 64, causal=True),
    _A("decode", 1, 32, 1, 4096, 128, decode=True),
    _A("decode-1head", 1, 1, 1, 131072, 128, decode=True, slow_numpy=True),
    _A("batch", 32, 8, 128, 128, 64),
    _A("f64", 1, 8, 1024, 1024, 64, dtype="float64"),
    _A("tiny", 1, 1, 3, 3, 64),
    _S("softmax", 4096, 4096),
    _A("memory", 1, 1, 16384, 16384, 64, memory=True, slow_numpy=True),
]
# Features the standard table does not exercise.
EXTRA_CASES = [
    _A("gqa-decode", 1, 32, 1, 8192, 128, Hkv=8, decode=True, extra=True),
    _A("gqa8-decode", 1, 64, 1, 8192, 128, Hkv=8, decode=True, extra=True,
       note="8 query heads per key/value head (a 70B-class model's layout)"),
    _A("chunk", 1, 8, 16, 8192, 128, decode=True, extra=True,
       note="16 new queries against a long KV cache (chunked prefill, speculative decoding)"),
    _A("window", 1, 4, 8192, 8192, 64, window=(256, 0), extra=True, slow_numpy=True,
       note="torch: same rule as a bool mask (it has no window)"),
    _A("mask", 1, 8, 1024, 1024, 64, mask="random", extra=True,
       note="random bool (Lq, Lk) mask, half the keys visible"),
    _A("kv-lengths", 8, 8, 1, 4096, 128, kv_lengths=[512 * (i + 1) for i in range(8)],
       decode=True, extra=True, note="padded decode batch; torch: same rule as a bool mask"),
    _A("draft", 1, 8, 4, 4096, 128, decode=True, extra=True,
       note="4 draft tokens verified against a KV cache (speculative decoding): the few-rows "
            "path, keys and values read in place"),
    _A("d256", 1, 4, 1024, 1024, 256, extra=True,
       note="head size 256"),
    _A("short", 1, 4, 33, 33, 64, extra=True,
       note="a short odd length: each score row ends in a partial vector and a tile in a "
            "partial key panel; threaded, tens of microseconds"),
    _A("small-heads", 64, 8, 32, 32, 64, extra=True,
       note="many small heads (512 units of 32x32)"),
    _A("alibi", 1, 8, 1024, 1024, 64, alibi=True, extra=True,
       note="ALiBi slopes 2^-1 .. 2^-8 (BLOOM, MPT); torch: the same biases as a float attn_mask"),
]

# KV caches stored in half precision or int8 (``kv_dtype``; q in ``q_dtype``,
# default the case's dtype): fastattn reads them in place; torch gets the same
# dtype for q, k, v (for int8: the dequantize-then-SDPA a torch user writes).
# ``twin``: the float32 case of the same shape, fastattn's own baseline.
STORAGE_CASES = [
    _A("decode-8k", 1, 32, 1, 8192, 128, decode=True, extra=True,
       note="float32 twin of the storage decode cases"),
    _A("decode-f16", 1, 32, 1, 8192, 128, decode=True, extra=True, kv_dtype="float16", q_dtype="float16",
       twin="decode-8k"),
    _A("decode-bf16", 1, 32, 1, 8192, 128, decode=True, extra=True, kv_dtype="bfloat16", q_dtype="bfloat16",
       twin="decode-8k"),
    _A("decode-int8", 1, 32, 1, 8192, 128, decode=True, extra=True, kv_dtype="int8", twin="decode-8k", group="kv",
       note="int8 k, v with per-key scales; torch: k.float() * k_scale, then SDPA"),
    _A("gqa-decode-f32", 1, 32, 1, 8192, 128, Hkv=8, decode=True, extra=True,
       note="float32 twin of gqa-decode-bf16"),
    _A("gqa-decode-bf16", 1, 32, 1, 8192, 128, Hkv=8, decode=True, extra=True, kv_dtype="bfloat16",
       q_dtype="bfloat16", twin="gqa-decode-f32"),
    _A("prefill-f16", 1, 8, 1024, 1024, 64, extra=True, kv_dtype="float16", q_dtype="float16", twin="prefill"),
    _A("prefill-bf16", 1, 8, 1024, 1024, 64, extra=True, kv_dtype="bfloat16", q_dtype="bfloat16",
       twin="prefill"),
    _A("causal-bf16", 1, 8, 1024, 1024, 64, causal=True, extra=True, kv_dtype="bfloat16",
       q_dtype="bfloat16", twin="causal"),
    _S("softmax-f16", 4096, 4096, dtype="float16", extra=True, twin="softmax",
       note="float16 in, float16 out (fastattn reads and writes it in place); torch: torch.softmax of the "
            "float16 tensor; scipy: scipy.special.softmax of the float16 array"),
]

# float8 (e4m3fn, e5m2) and QuantizedKV (u8, u4) caches and attention sinks, side
# by side with their float32 and int8 twins (group "kv": compare.py --group kv)
KV_CASES = _KV.kv_cases(_A)

# float32 accuracy against torch on the same inputs (the accuracy table of compare.py)
ACCURACY_CASES = [
    _A("acc-1k", 1, 2, 1024, 1024, 64, extra=True, slow_numpy=True),
    _A("acc-4k", 1, 2, 256, 4096, 64, extra=True, slow_numpy=True),
    _A("acc-64k", 1, 2, 256, 65536, 64, extra=True, slow_numpy=True),
    _A("acc-64k-d128", 1, 2, 64, 65536, 128, extra=True, slow_numpy=True),
]

# The backward: attention_backward against torch's scaled_dot_product_attention
# backward.  "bwd" times one backward (the forward ran once, when the runner was
# set up: its out and lse, torch's graph); "fwd+bwd" a forward and a backward.
BACKWARD_CASES = [
    _A("bwd-prefill", 1, 8, 1024, 1024, 64, backward="bwd", extra=True),
    _A("bwd-causal", 1, 8, 1024, 1024, 64, causal=True, backward="bwd", extra=True),
    _A("bwd-1head", 1, 1, 4096, 4096, 128, causal=True, backward="bwd", extra=True, slow_numpy=True,
       note="one long head: torch's backward parallelises over batch x heads"),
    _A("bwd-batch", 4, 8, 512, 512, 64, causal=True, backward="bwd", extra=True),
    _A("bwd-f64", 1, 8, 1024, 1024, 64, dtype="float64", backward="bwd", extra=True),
    _A("bwd-prefill-bf16", 1, 8, 1024, 1024, 64, backward="bwd", extra=True, kv_dtype="bfloat16",
       q_dtype="bfloat16", twin="bwd-prefill", note="bfloat16 q, k, v and grad_out; torch: the same in bfloat16"),
    _A("bwd-causal-bf16", 1, 8, 1024, 1024, 64, causal=True, backward="bwd", extra=True, kv_dtype="bfloat16",
       q_dtype="bfloat16", twin="bwd-causal"),
    _A("bwd-memory", 1, 1, 16384, 16384, 64, memory=True, backward="bwd", extra=True, slow_numpy=True,
       note="extra memory beyond inputs, out, lse and the gradients"),
    _A("train-prefill", 1, 8, 1024, 1024, 64, backward="fwd+bwd", extra=True),
    _A("train-causal", 1, 8, 1024, 1024, 64, causal=True, backward="fwd+bwd", extra=True),
]


# Serving: packed variable-length batches (attention_varlen) and paged KV caches
# (attention_paged), kinds "varlen" and "paged".  ``impl`` names what a case
# times with fastattn -- the packed or paged call itself, or its baseline: a
# Python loop of fastattn.attention over the sequences ("loop"), the same
# decode on contiguous caches with kv_lengths ("contiguous"); ``baseline`` is
# the id of a case's baseline and ``targets`` the (baseline / case and
# torch / case at least these).  torch: SDPA in a loop over the sequences
# (varlen), or gather + SDPA with a padding mask (paged).

def varlen_case(id, n_seqs, lo, hi, H, D, *, seed=0, causal=True, impl="varlen", **extra):
    """A packed batch of n_seqs sequences of seeded lengths in [lo, hi] (self-attention)."""
    import random
    r = random.Random(seed)
    lens = [r.randint(lo, hi) for _ in range(n_seqs)]
    case = dict(id=id, kind="varlen", lens=lens, Hq=H, Hkv=H, D=D, Dv=D, dtype="float32", causal=causal,
                impl=impl, memory=False, extra=True)
    case.update(extra)
    return case


def paged_case(id, S, Hq, Hkv, D, Lq, context, block_size, *, seed=0, impl="paged", **extra):
    """S sequences of about ``context`` keys each (seeded, up to one block less) in a
    paged cache of ``block_size`` slots per block, ``Lq`` new queries each, causal
    bottom-right."""
    import random
    r = random.Random(seed)
    seq_lens = [context - r.randint(0, block_size - 1) if Lq == 1 else context for _ in range(S)]
    case = dict(id=id, kind="paged", S=S, Hq=Hq, Hkv=Hkv, D=D, Dv=D, Lq=Lq, seq_lens=seq_lens,
                block_size=block_size, dtype="float32", causal="bottom_right", impl=impl, memory=False,
                extra=True)
    case.update(extra)
    return case


SERVING_CASES = [
    varlen_case("varlen-64", 64, 16, 512, 8, 64, baseline="varlen-64-loop", targets={"baseline": 1.5, "torch": 2.0},
                note="64 sequences of 16-512 tokens; baseline: a Python loop of fastattn.attention over them"),
    varlen_case("varlen-64-loop", 64, 16, 512, 8, 64, impl="loop", no_torch=True),
    varlen_case("varlen-8-long", 8, 256, 4096, 8, 128, baseline="varlen-8-long-loop", targets={"baseline": 1.0},
                note="8 sequences of 256-4096 tokens"),
    varlen_case("varlen-8-long-loop", 8, 256, 4096, 8, 128, impl="loop", no_torch=True),
    paged_case("paged-decode", 8, 32, 8, 128, 1, 4096, 16, decode=True, baseline="paged-decode-contiguous",
               targets={"baseline": 1 / 1.1, "torch": 2.0},
               note="decode, shuffled blocks of 16; baseline: the same decode on contiguous caches with kv_lengths"),
    paged_case("paged-decode-contiguous", 8, 32, 8, 128, 1, 4096, 16, decode=True, impl="contiguous",
               no_torch=True),
    paged_case("paged-prefill", 4, 32, 8, 128, 256, 2304, 16, baseline="paged-prefill-contiguous",
               targets={"baseline": 1 / 1.15},
               note="chunked prefill: 256 new tokens against 2048 cached, causal bottom-right"),
    paged_case("paged-prefill-contiguous", 4, 32, 8, 128, 256, 2304, 16, impl="contiguous", no_torch=True),
]
SERVING_KINDS = ("varlen", "paged")


def _serving_describe(case):
    heads = f"Hq{case['Hq']} Hkv{case['Hkv']}" if case["Hq"] != case["Hkv"] else f"H{case['Hq']}"
    what = {"loop": " (loop of attention)", "contiguous": " (contiguous, kv_lengths)"}.get(case["impl"], "")
    if case["kind"] == "varlen":
        return (f"{len(case['lens'])} seqs L{min(case['lens'])}-{max(case['lens'])} {heads} D{case['D']}"
                + (" causal" if case["causal"] else "") + what)
    return (f"S{case['S']} {heads} D{case['D']} Lq{case['Lq']} keys≈{max(case['seq_lens'])} "
            f"block {case['block_size']} bottom-right" + what)


def _serving_pairs(case):
    """Visible (query, key) pairs per head of a serving case."""
    if case["kind"] == "varlen":
        return sum(n * (n + 1) // 2 if case["causal"] else n * n for n in case["lens"])
    n = case["Lq"]
    return sum(n * L - n * (n - 1) // 2 for L in case["seq_lens"])


def describe(case):
    """Short shape description, e.g. 'B1 H8 L1024 D64 causal'."""
    if case["kind"] in SERVING_KINDS:
        return _serving_describe(case)
    if case["kind"] == "softmax":
        return f"{case['rows']}×{case['cols']} {case['dtype']}"
    heads = f"Hq{case['Hq']} Hkv{case['Hkv']}" if case["Hq"] != case["Hkv"] else f"H{case['Hq']}"
    lens = f"L{case['Lq']}" if case["Lq"] == case["Lk"] else f"Lq{case['Lq']} Lk{case['Lk']}"
    parts = [f"B{case['B']}", heads, lens, f"D{case['D']}"]
    if case["dtype"] != "float32":
        parts.append(case["dtype"])
    if case["causal"]:
        parts.append("causal")
    if case["window"]:
        parts.append(f"window={tuple(case['window'])}")
    if case["mask"]:
        parts.append("bool mask")
    if case["kv_lengths"]:
        parts.append("kv_lengths")
    if case.get("alibi"):
        parts.append("ALiBi")
    if case.get("sinks"):
        parts.append("sinks")
    if case.get("backward"):
        parts.append("backward" if case["backward"] == "bwd" else "forward+backward")
    return " ".join(parts)


# ---------------------------------------------------------------------------
# Arithmetic about a case (used by the parent to turn times into rates)
# ---------------------------------------------------------------------------

def visible_pairs(case):
    """Number of (query, key) pairs per (batch, head) summed over batch entries.

    Causal, window and kv_lengths limits are counted (a block-sparse kernel can
    skip the rest); a random boolean mask is not (no kernel can skip it).
    """
    total = 0
    for b in range(case["B"]):
        n = case["kv_lengths"][b] if case["kv_lengths"] else case["Lk"]
        if case["causal"] or case["window"]:
            total += sum(max(0, hi - lo) for lo, hi in
                         (_visible_range(case, i, n) for i in range(case["Lq"])))
        else:
            total += case["Lq"] * n
    return total


def _visible_range(case, i, n_keys):
    """Half-open key range [lo, hi) that query row i may see.

    Top-left alignment (query i sits at key position i), the meaning of
    ``causal=True`` in fastattn, its reference and torch.
    """
    lo, hi = 0, n_keys
    if case["causal"]:
        hi = min(hi, i + 1)
    if case["window"]:
        left, right = case["window"]
        lo = max(lo, i - left)
        hi = min(hi, i + right + 1)
    return lo, hi


# FLOPs of a backward counted as 2.5 forwards (five products against two)
_BACKWARD_FLOPS = {None: 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


def attention_flops(case):
    """FLOPs of attention: 2*D for q.k plus 2*Dv for p.v per visible pair (the
    backward: 2.5 times that, forward and backward 3.5 times)."""
    pairs = _serving_pairs(case) if case["kind"] in SERVING_KINDS else visible_pairs(case)
    return _BACKWARD_FLOPS[case.get("backward")] * 2 * (case["D"] + case["Dv"]) * case["Hq"] * pairs


def _numpy_dtype(name, np):
    """A dtype by name; bfloat16 from ml_dtypes (imported only for it)."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def kv_bytes(case):
    """Bytes of K and V that must be read once (valid keys only), in their stored type."""
    itemsize = {"float64": 8, "float16": 2, "bfloat16": 2, "int8": 1}.get(case.get("kv_dtype") or case["dtype"], 4)
    if case["kind"] in SERVING_KINDS:
        keys = sum(case["lens"] if case["kind"] == "varlen" else case["seq_lens"])
    else:
        keys = sum(case["kv_lengths"]) if case["kv_lengths"] else case["B"] * case["Lk"]
    if _KV.row_bytes(case, case["D"]) is not None:     # float8, QuantizedKV (codes, scales, zeros)
        return keys * case["Hkv"] * (_KV.row_bytes(case, case["D"]) + _KV.row_bytes(case, case["Dv"]))
    return keys * case["Hkv"] * (case["D"] + case["Dv"]) * itemsize


def numpy_scores_bytes(case):
    """Bytes of the full score matrices the naive NumPy version materialises (the
    backward: probabilities, their gradient and the score gradient)."""
    itemsize = 8 if case["dtype"] == "float64" else 4
    return (3 if case.get("backward") else 1) * case["B"] * case["Hq"] * case["Lq"] * case["Lk"] * itemsize


# ---------------------------------------------------------------------------
# Inputs, and a case's mask and ALiBi biases as arrays
# ---------------------------------------------------------------------------

def make_inputs(case, np):
    """Deterministic inputs for a case (touched, contiguous, in case['dtype'])."""
    if case["kind"] in SERVING_KINDS:
        return _serving_inputs(case, np)
    rng = np.random.default_rng(0)
    dt = np.dtype(case["dtype"])
    if case["kind"] == "softmax":
        return {"x": (rng.standard_normal((case["rows"], case["cols"]), dtype=np.float32) * 3).astype(dt)}
    B, Hq, Hkv = case["B"], case["Hq"], case["Hkv"]
    q = rng.standard_normal((B, Hq, case["Lq"], case["D"]), dtype=np.float32).astype(dt)
    k = rng.standard_normal((B, Hkv, case["Lk"], case["D"]), dtype=np.float32).astype(dt)
    v = rng.standard_normal((B, Hkv, case["Lk"], case["Dv"]), dtype=np.float32).astype(dt)
    inputs = {"q": q, "k": k, "v": v}
    if case.get("q_dtype"):
        inputs["q"] = q.astype(_numpy_dtype(case["q_dtype"], np))
    if case.get("kv_dtype") == "int8":
        # per-key symmetric quantisation: x = round(x / s) * s, s = max|x| / 127
        for name in "kv":
            x = inputs[name]
            s = np.maximum(np.abs(x).max(axis=-1, keepdims=True), 1e-30) / 127
            inputs[name] = np.clip(np.rint(x / s), -127, 127).astype(np.int8)
            inputs[name + "_scale"] = s.astype(np.float32)
    elif case.get("kv_dtype") in _KV.KV_FORMATS:
        inputs.update(_KV.stored_inputs(case, k, v, np))
    elif case.get("kv_dtype"):
        kv_dt = _numpy_dtype(case["kv_dtype"], np)
        inputs["k"], inputs["v"] = k.astype(kv_dt), v.astype(kv_dt)
    if case["mask"] == "random":
        m = rng.random((case["Lq"], case["Lk"])) < 0.5
        idx = np.arange(min(case["Lq"], case["Lk"]))
        m[idx, idx] = True                                  # no row without a key
        inputs["mask"] = m
    if case["kv_lengths"]:
        inputs["kv_lengths"] = np.asarray(case["kv_lengths"], dtype=np.int64)
    if case.get("alibi"):
        inputs["alibi_slopes"] = 2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)
    if case.get("sinks"):
        inputs["sinks"] = _KV.sinks_input(case, np)
    if case.get("backward"):
        # the output gradient in the output's dtype: q's (bfloat16 for the -bf16 cases)
        gdt = _numpy_dtype(case["q_dtype"], np) if case.get("q_dtype") else dt
        inputs["grad"] = rng.standard_normal((B, Hq, case["Lq"], case["Dv"]), dtype=np.float32).astype(gdt)
    return inputs


def alibi_bias(case, inputs, np, rows=None, heads=None):
    """The ALiBi biases -slope·|i - j| as a float array (1, heads, rows, Lk) in the
    case's dtype, or None without ALiBi (non-causal cases: the diagonal is i)."""
    if not case.get("alibi"):
        return None
    rows = np.arange(case["Lq"]) if rows is None else np.asarray(rows)
    slopes = inputs["alibi_slopes"] if heads is None else inputs["alibi_slopes"][heads]
    dist = np.abs(rows[:, None] - np.arange(case["Lk"])[None, :]).astype(np.float64)
    return (-slopes[:, None, None] * dist[None])[None].astype(case["dtype"])


def allowed_mask(case, inputs, np, rows=None, batch=None):
    """Boolean "may attend" array broadcastable to (B, H, Lq, Lk), or None.

    ``rows`` selects query rows (absolute indices); ``batch`` one batch entry.
    """
    Lq, Lk = case["Lq"], case["Lk"]
    rows = np.arange(Lq) if rows is None else np.asarray(rows)
    cols = np.arange(Lk)
    allowed = None
    if case["causal"] or case["window"]:
        lo_hi = np.array([_visible_range(case, int(i), Lk) for i in rows])
        allowed = (cols[None, :] >= lo_hi[:, :1]) & (cols[None, :] < lo_hi[:, 1:])
    if case["mask"] == "random":
        m = inputs["mask"][rows]
        allowed = m if allowed is None else allowed & m
    if allowed is not None:
        allowed = allowed[None, None]                      # (1, 1, rows, Lk)
    if case["kv_lengths"]:
        lengths = inputs["kv_lengths"] if batch is None else inputs["kv_lengths"][batch:batch + 1]
        by_len = (cols[None, :] < lengths[:, None])[:, None, None, :]   # (B, 1, 1, Lk)
        allowed = by_len if allowed is None else allowed & by_len
    return allowed


def _serving_inputs(case, np):
    """varlen: q, k, v (H, total, D) and cu_seqlens.  paged: q (S, Hq, Lq, D), caches
    (num_blocks, Hkv, block_size, D) in shuffled blocks, the block table and
    seq_lens -- or, for the contiguous baseline, the same keys gathered into
    (S, Hkv, max(seq_lens), D) caches."""
    rng = np.random.default_rng(0)
    D, Dv = case["D"], case["Dv"]
    if case["kind"] == "varlen":
        total = sum(case["lens"])
        q, k, v = (rng.standard_normal((case["Hq"], total, d), dtype=np.float32) for d in (D, D, Dv))
        return {"q": q, "k": k, "v": v, "cu": np.concatenate([[0], np.cumsum(case["lens"])]).astype(np.int64)}
    S, Hkv, bs = case["S"], case["Hkv"], case["block_size"]
    lens = np.asarray(case["seq_lens"], dtype=np.int64)
    per_seq = -(-lens // bs)
    nb = int(per_seq.sum())
    kc = rng.standard_normal((nb, Hkv, bs, D), dtype=np.float32)
    vc = rng.standard_normal((nb, Hkv, bs, Dv), dtype=np.float32)
    table = np.zeros((S, int(per_seq.max())), dtype=np.int64)
    order = rng.permutation(nb)
    for s, start in enumerate(np.concatenate([[0], np.cumsum(per_seq)[:-1]])):
        table[s, :per_seq[s]] = order[start:start + per_seq[s]]
    q = rng.standard_normal((S, case["Hq"], case["Lq"], D), dtype=np.float32)
    inputs = {"q": q, "block_table": table, "seq_lens": lens}
    if case["impl"] == "contiguous":
        L = int(lens.max())
        for name, c in (("k", kc), ("v", vc)):
            g = c[table].transpose(0, 2, 1, 3, 4).reshape(S, Hkv, -1, c.shape[3])[:, :, :L]
            inputs[name] = np.ascontiguousarray(g)
    else:
        inputs["k_cache"], inputs["v_cache"] = kc, vc
    return inputs
