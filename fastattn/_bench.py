"""Timing harness shared by ``fastattn bench`` (fastattn/_quickbench.py) and ``bench/compare.py``.

Every measurement runs in a fresh Python process that imports exactly one
library: two OpenMP runtimes in one process (ours and the libgomp bundled with
torch) keep their worker threads spinning after a parallel region and steal
cores from each other, so timing them side by side in one process is wrong.

This file must also work when it is *not* imported as part of the package
(``bench/compare.py`` loads it by path so that the comparison runs before the
kernels are built), so it imports ``fastattn`` only inside the fastattn runner
and nothing from the package at module level.

The cases -- what a case dict holds, the tables of cases, a case's description,
arithmetic and inputs -- are in ``fastattn/_bench_cases.py`` (loaded by path, like
``fastattn/_bench_kv.py``); their names are importable from here too.
"""
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import time

# Libraries a case can be timed with; the first is the one being measured.
ATTENTION_LIBS = ("fastattn", "torch", "numpy")
SOFTMAX_LIBS = ("fastattn", "torch", "scipy")

# Environment variables set for old OpenBLAS builds that slow numpy's BLAS
# down; removed in benchmark processes only (never in tests or CI).
_OPENBLAS_TUNING_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "BLIS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


# The cases: fastattn/_bench_cases.py, and through it fastattn/_bench_kv.py (float8
# and QuantizedKV caches, attention sinks: issue 34).  Their names stay importable
# from here (bench/compare.py, bench/peers.py, fastattn bench, the tests).  Loaded by
# path, like this file itself: importing the package would load the kernels.
_spec = importlib.util.spec_from_file_location(
    "fastattn_bench_cases", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bench_cases.py"))
_C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_C)
_KV = _C._KV
attention_case, softmax_case = _C.attention_case, _C.softmax_case
varlen_case, paged_case = _C.varlen_case, _C.paged_case
STANDARD_CASES, EXTRA_CASES, STORAGE_CASES = _C.STANDARD_CASES, _C.EXTRA_CASES, _C.STORAGE_CASES
KV_CASES, ACCURACY_CASES, BACKWARD_CASES = _C.KV_CASES, _C.ACCURACY_CASES, _C.BACKWARD_CASES
SERVING_CASES, SERVING_KINDS = _C.SERVING_CASES, _C.SERVING_KINDS
describe, visible_pairs, attention_flops = _C.describe, _C.visible_pairs, _C.attention_flops
kv_bytes, numpy_scores_bytes = _C.kv_bytes, _C.numpy_scores_bytes
make_inputs, alibi_bias, allowed_mask = _C.make_inputs, _C.alibi_bias, _C.allowed_mask
_numpy_dtype = _C._numpy_dtype


# ---------------------------------------------------------------------------
# The naive NumPy baseline and the float64 checks
# ---------------------------------------------------------------------------

def naive_probabilities(q, k, scale, blocked, np, bias=None):
    """softmax(q kᵀ · scale + bias, masked), the full (B, Hkv, Hq / Hkv, Lq, Lk)
    matrix, NumPy style (see naive_attention)."""
    B, Hq, Lq, D = q.shape
    Hkv = k.shape[1]
    q5 = q.reshape(B, Hkv, Hq // Hkv, Lq, D)
    s = q5 @ np.swapaxes(k, -1, -2)[:, :, None]
    s *= s.dtype.type(scale)
    if bias is not None:
        s += bias.reshape(1, Hkv, Hq // Hkv, Lq, bias.shape[-1])
    if blocked is not None:
        np.copyto(s, -np.inf, where=blocked)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def naive_attention(q, k, v, scale, blocked, np, bias=None):
    """softmax(q kᵀ · scale + bias, masked) v with the full score matrix, NumPy style.

    q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); Hq a multiple of
    Hkv (grouped heads share K/V).  ``blocked`` is True where a score is
    masked out (broadcastable to (B, 1, 1, Lq, Lk)) or None; ``bias`` a float
    array (1, Hq, Lq, Lk) or None.
    """
    B, Hq, Lq, D = q.shape
    out = naive_probabilities(q, k, scale, blocked, np, bias=bias) @ v[:, :, None]
    return out.reshape(B, Hq, Lq, v.shape[-1])


def naive_attention_backward(p, out, q, k, v, grad, scale, np):
    """dq, dk, dv of naive_attention from the forward's probabilities p (from
    naive_probabilities) and output, every matrix materialised, NumPy style."""
    B, Hq, Lq, D = q.shape
    Hkv = k.shape[1]
    shape5 = (B, Hkv, Hq // Hkv, Lq)
    q5 = q.reshape(shape5 + (D,))
    g5 = grad.reshape(shape5 + (grad.shape[-1],))
    ds = g5 @ np.swapaxes(v, -1, -2)[:, :, None]
    ds -= np.sum(g5 * out.reshape(g5.shape), axis=-1, keepdims=True)
    ds *= p
    ds *= ds.dtype.type(scale)
    dq = (ds @ k[:, :, None]).reshape(q.shape)
    dk = (np.swapaxes(ds, -1, -2) @ q5).sum(axis=2)
    dv = (np.swapaxes(p, -1, -2) @ g5).sum(axis=2)
    return dq, dk, dv


def _blocked(allowed):
    """Turn a (B, 1, L, L) allowed mask into the 5-D blocked mask naive_attention wants."""
    return None if allowed is None else ~allowed[:, :, None]


def _check_rows(case, np):
    """The query rows the float64 checks compare: all of up to 96, else the first
    and last 32 and 32 in between."""
    Lq = case["Lq"]
    return np.arange(Lq) if Lq <= 96 else np.unique(np.r_[0:32, Lq - 32:Lq, np.linspace(0, Lq - 1, 32).astype(int)])


def _check_heads(case, inputs, rows, np):
    """(b, h, q, k, v) for the two (batch, query head) pairs the float64 checks
    compare: q's rows and its key/value head's k, v in float64, int8 scales applied."""
    group = case["Hq"] // case["Hkv"]
    for b, h in sorted({(0, 0), (case["B"] - 1, case["Hq"] - 1)}):
        kv = slice(h // group, h // group + 1)
        q = inputs["q"][b:b + 1, h:h + 1, rows].astype(np.float64)
        k = _KV.values(case, inputs, "k", (slice(b, b + 1), kv), np)
        v = _KV.values(case, inputs, "v", (slice(b, b + 1), kv), np)
        if "k_scale" in inputs:
            k = k * inputs["k_scale"][b:b + 1, kv]
            v = v * inputs["v_scale"][b:b + 1, kv]
        yield b, h, q, k, v


def _float64_outputs(case, inputs, out, rows, np):
    """(got, exact) float64 output rows of each pair of _check_heads."""
    for b, h, q, k, v in _check_heads(case, inputs, rows, np):
        if case.get("sinks"):          # the sink cases have no mask, window or bias
            ref = _KV.naive_with_sinks(q, k, v, 1.0 / math.sqrt(case["D"]), float(inputs["sinks"][h]), np)
            yield np.asarray(out[b, h, rows], dtype=np.float64), ref
            continue
        ref = naive_attention(q, k, v, 1.0 / math.sqrt(case["D"]),
                              _blocked(allowed_mask(case, inputs, np, rows=rows, batch=b)), np,
                              bias=alibi_bias(case, inputs, np, rows=rows, heads=[h]))[0, 0]
        yield np.asarray(out[b, h, rows], dtype=np.float64), ref


def rms_against_float64(case, inputs, out, np):
    """Relative RMS error of a forward attention output against the float64
    computation on the same (widened) inputs, over the slice of
    check_against_float64; None for other kinds of case."""
    if case["kind"] != "attention" or case.get("backward"):
        return None
    num = den = 0.0
    for got, ref in _float64_outputs(case, inputs, out, _check_rows(case, np), np):
        num += float(np.sum((got - ref) ** 2))
        den += float(np.sum(ref ** 2))
    return math.sqrt(num / den) if den > 0 else None


def check_against_float64(case, inputs, out, np):
    """Largest |out - exact| over a cheap slice, computed in float64.

    Two (batch, head) pairs, up to 96 query rows each (first, last and some
    in between), all keys: enough to see a wrong mask, scale or head mapping.
    Computed here rather than by ``fastattn.reference`` because it also checks
    torch, in processes that must not import fastattn.
    """
    if case["kind"] in SERVING_KINDS:
        return _serving_check(case, inputs, out, np)
    if case["kind"] == "softmax":
        x = inputs["x"][:64].astype(np.float64)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        ref = e / e.sum(axis=-1, keepdims=True)
        return float(np.max(np.abs(np.asarray(out[:64], dtype=np.float64) - ref)))
    rows = _check_rows(case, np)
    if case.get("backward"):
        return _check_dq_against_float64(case, inputs, out[0], rows, np)
    return max(float(np.max(np.abs(got - ref))) for got, ref in _float64_outputs(case, inputs, out, rows, np))


def _check_dq_against_float64(case, inputs, dq, rows, np):
    """Largest |dq - exact| over the rows of check_against_float64: a row's dq
    depends on that row alone (its probabilities, output and gradient), so a
    slice of rows against all keys is exact (dk and dv would need every row)."""
    scale = 1.0 / math.sqrt(case["D"])
    worst = 0.0
    for b, h, q, k, v in _check_heads(case, inputs, rows, np):
        g = inputs["grad"][b:b + 1, h:h + 1, rows].astype(np.float64)
        p = naive_probabilities(q, k, scale, _blocked(allowed_mask(case, inputs, np, rows=rows, batch=b)), np,
                                bias=alibi_bias(case, inputs, np, rows=rows, heads=[h]))
        ref = naive_attention_backward(p, p @ v[:, :, None], q, k, v, g, scale, np)[0]
        worst = max(worst, float(np.max(np.abs(np.asarray(dq[b, h, rows], dtype=np.float64) - ref[0, 0]))))
    return worst


# ---------------------------------------------------------------------------
# Serving cases: runners, check
# ---------------------------------------------------------------------------

def _serving_fastattn(fastattn, case, inputs, threads):
    """The call a serving case times with fastattn (see SERVING_CASES)."""
    q = inputs["q"]
    if case["kind"] == "varlen":
        k, v, cu = inputs["k"], inputs["v"], inputs["cu"]
        causal = case["causal"]
        if case["impl"] == "loop":
            spans = list(zip(cu[:-1].tolist(), cu[1:].tolist()))
            return lambda: [fastattn.attention(q[:, a:b], k[:, a:b], v[:, a:b], causal=causal, num_threads=threads)
                            for a, b in spans]
        return lambda: fastattn.attention_varlen(q, k, v, cu, causal=causal, num_threads=threads)
    lens = inputs["seq_lens"]
    if case["impl"] == "contiguous":
        k, v, kvl = inputs["k"], inputs["v"], lens[:, None]
        return lambda: fastattn.attention(q, k, v, kv_lengths=kvl, causal="bottom_right", num_threads=threads)
    kc, vc, table = inputs["k_cache"], inputs["v_cache"], inputs["block_table"]
    return lambda: fastattn.attention_paged(q, kc, vc, table, lens, causal="bottom_right", num_threads=threads)


def _serving_torch(torch, F, case, inputs, np):
    """torch's way: SDPA per sequence in a loop (contiguous per-sequence tensors,
    split once); a paged cache gathered per call, then one SDPA with a padding
    (and bottom-right causal) mask."""
    if case["kind"] == "varlen":
        cu = inputs["cu"]
        seqs = [tuple(torch.from_numpy(np.ascontiguousarray(inputs[n][None, :, a:b])) for n in "qkv")
                for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
        causal = bool(case["causal"])
        return lambda: [F.scaled_dot_product_attention(q, k, v, is_causal=causal)[0].numpy() for q, k, v in seqs]
    q = torch.from_numpy(inputs["q"])
    kc, vc = torch.from_numpy(inputs["k_cache"]), torch.from_numpy(inputs["v_cache"])
    table = torch.from_numpy(inputs["block_table"])
    lens = torch.from_numpy(inputs["seq_lens"])
    S, Hkv, Lq = case["S"], case["Hkv"], case["Lq"]
    gqa = case["Hq"] != Hkv

    def step():
        k = kc[table].permute(0, 2, 1, 3, 4).reshape(S, Hkv, -1, kc.shape[3])
        v = vc[table].permute(0, 2, 1, 3, 4).reshape(S, Hkv, -1, vc.shape[3])
        keys = torch.arange(k.shape[2])
        pos = lens[:, None] - Lq + torch.arange(Lq)[None, :]                    # (S, Lq)
        mask = (keys[None, None, :] <= pos[:, :, None]) & (keys[None, None, :] < lens[:, None, None])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=gqa).numpy()
    return step


def _serving_check(case, inputs, out, np):
    """Largest |out - exact| (float64) over the first and last sequence, first and
    last head, up to 96 query rows each."""
    worst = 0.0
    scale = 1.0 / math.sqrt(case["D"])
    g = case["Hq"] // case["Hkv"]
    if case["kind"] == "varlen":
        cu = inputs["cu"]
        for s in {0, len(case["lens"]) - 1}:
            a, b = int(cu[s]), int(cu[s + 1])
            got_s = out[s] if isinstance(out, list) else out[:, a:b]
            rows = np.arange(b - a) if b - a <= 96 else np.unique(np.r_[0:32, b - a - 32:b - a,
                                                                      np.linspace(0, b - a - 1, 32).astype(int)])
            for h in {0, case["Hq"] - 1}:
                q = inputs["q"][h, a:b][rows].astype(np.float64)
                k = inputs["k"][h // g, a:b].astype(np.float64)
                v = inputs["v"][h // g, a:b].astype(np.float64)
                sc = q @ k.T * scale
                if case["causal"]:
                    sc[np.arange(b - a)[None, :] > rows[:, None]] = -np.inf
                p = np.exp(sc - sc.max(axis=1, keepdims=True))
                ref = (p / p.sum(axis=1, keepdims=True)) @ v
                worst = max(worst, float(np.max(np.abs(np.asarray(got_s[h][rows], np.float64) - ref))))
        return worst
    lens, Lq = inputs["seq_lens"], case["Lq"]
    rows = np.arange(Lq) if Lq <= 96 else np.unique(np.r_[0:32, Lq - 32:Lq, np.linspace(0, Lq - 1, 32).astype(int)])
    for s in {0, case["S"] - 1}:
        L = int(lens[s])
        for h in {0, case["Hq"] - 1}:
            if "k" in inputs:
                k, v = inputs["k"][s, h // g, :L], inputs["v"][s, h // g, :L]
            else:
                blocks = inputs["block_table"][s, :-(-L // case["block_size"])]
                k = inputs["k_cache"][blocks, h // g].reshape(-1, case["D"])[:L]
                v = inputs["v_cache"][blocks, h // g].reshape(-1, case["Dv"])[:L]
            q = inputs["q"][s, h, rows].astype(np.float64)
            sc = q @ k.astype(np.float64).T * scale
            sc[np.arange(L)[None, :] > (L - Lq + rows)[:, None]] = -np.inf
            p = np.exp(sc - sc.max(axis=1, keepdims=True))
            ref = (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
            worst = max(worst, float(np.max(np.abs(np.asarray(out[s, h, rows], np.float64) - ref))))
    return worst


# ---------------------------------------------------------------------------
# One library per child process
# ---------------------------------------------------------------------------

def _fastattn_runner(case, inputs, threads, np):
    import fastattn
    fastattn.set_num_threads(threads)
    info = {"version": getattr(fastattn, "__version__", "?")}
    try:
        info["config"] = fastattn.show_config(file=io.StringIO())   # stdout carries the result
    except Exception as exc:                               # config is informative only
        info["config"] = f"show_config() failed: {exc!r}"
    if case["kind"] == "softmax":
        # written into one preallocated output, as ONNX Runtime's runner binds its
        # output (bench/peers.py): a fresh 64 MiB result costs its page faults
        # (4096 x 4096 float32, 2 threads: 4.4-4.7 ms with out=, 9.5-12 ms without)
        x = inputs["x"]
        out = np.empty_like(x)
        return (lambda: fastattn.softmax(x, axis=-1, out=out, num_threads=threads)), info
    if case["kind"] in SERVING_KINDS:
        return _serving_fastattn(fastattn, case, inputs, threads), info
    kw = dict(fastattn_kwargs(case, inputs), num_threads=threads)
    q, (k, v) = inputs["q"], _KV.fastattn_kv(fastattn, case, inputs)
    if case.get("backward") == "fwd+bwd":
        def step():
            out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
            return fastattn.attention_backward(inputs["grad"], q, k, v, out, lse, **kw)
        return step, info
    if case.get("backward"):
        out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
        return (lambda: fastattn.attention_backward(inputs["grad"], q, k, v, out, lse, **kw)), info
    return (lambda: fastattn.attention(q, k, v, **kw)), info


def fastattn_kwargs(case, inputs):
    """The keyword arguments of fastattn.attention that express ``case``."""
    kw = {"causal": case["causal"]}
    if case["window"]:
        kw["window"] = tuple(case["window"])
    if case["mask"]:
        kw["mask"] = inputs["mask"]
    if case["kv_lengths"]:
        kw["kv_lengths"] = inputs["kv_lengths"]
    if case.get("alibi"):
        kw["alibi_slopes"] = inputs["alibi_slopes"]
    if "k_scale" in inputs:
        kw["k_scale"], kw["v_scale"] = inputs["k_scale"], inputs["v_scale"]
    if case.get("sinks"):
        kw["sinks"] = inputs["sinks"]
    return kw


def _torch_runner(case, inputs, threads, np):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    info = {"version": torch.__version__}
    if case["kind"] == "softmax":
        x = torch.from_numpy(inputs["x"])
        return (lambda: torch.softmax(x, dim=-1).numpy()), info
    if case["kind"] in SERVING_KINDS:
        return _serving_torch(torch, F, case, inputs, np), info
    # 4-D (B, H, L, D): 3-D input silently takes torch's slow "math" path.
    kv_dtype = case.get("kv_dtype")
    if kv_dtype in _KV.KV_FORMATS or case.get("sinks"):
        kw = {"enable_gqa": True} if case["Hq"] != case["Hkv"] else {}
        return _KV.torch_call(torch, F, case, inputs, kw, np), info

    def tensor(x):
        # q, k, v and grad_out of one dtype (torch requires it): a float16 / bfloat16
        # case's (bfloat16 through an int16 view), else the array's own
        if kv_dtype == "bfloat16":
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(x).to(torch.float16) if kv_dtype == "float16" else torch.from_numpy(x)
    q, k, v = (tensor(inputs[n]) for n in "qkv")
    kw = {}
    if case["Hq"] != case["Hkv"]:
        kw["enable_gqa"] = True
    if case["window"] or case["mask"] or case["kv_lengths"]:
        # torch has no window or length argument: the same rule as a bool mask.
        kw["attn_mask"] = torch.from_numpy(np.ascontiguousarray(allowed_mask(case, inputs, np)))
    elif case.get("alibi"):
        # nor ALiBi: the biases as a float mask, built once (how torch users run it)
        kw["attn_mask"] = torch.from_numpy(alibi_bias(case, inputs, np))
    else:
        kw["is_causal"] = case["causal"]
    if case.get("backward"):
        # the gradients of the forward's graph, kept for every call (retain_graph):
        # "bwd" times torch.autograd.grad alone, "fwd+bwd" the forward too
        torch.set_grad_enabled(True)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        grad = tensor(inputs["grad"])

        def backward(out):
            grads = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
            return tuple((t.float() if kv_dtype else t).numpy() for t in grads)
        if case["backward"] == "fwd+bwd":
            return (lambda: backward(F.scaled_dot_product_attention(q, k, v, **kw))), info
        out = F.scaled_dot_product_attention(q, k, v, **kw)
        return (lambda: backward(out)), info
    if kv_dtype == "int8":
        # what a torch user writes for an int8 cache: dequantize, then attention
        ks, vs = torch.from_numpy(inputs["k_scale"]), torch.from_numpy(inputs["v_scale"])
        return (lambda: F.scaled_dot_product_attention(q, k.float() * ks, v.float() * vs, **kw).numpy()), info
    if kv_dtype:
        return (lambda: F.scaled_dot_product_attention(q, k, v, **kw).float().numpy()), info
    return (lambda: F.scaled_dot_product_attention(q, k, v, **kw).numpy()), info


def _numpy_runner(case, inputs, threads, np):
    info = {"version": np.__version__}
    if case["kind"] == "softmax":
        raise ValueError("softmax cases compare against scipy, not the numpy runner")
    if case["kind"] in SERVING_KINDS:
        raise ValueError("serving cases compare against fastattn's own baseline and torch, not numpy")
    blocked = _blocked(allowed_mask(case, inputs, np))    # built once, like torch's mask
    bias = alibi_bias(case, inputs, np)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    scale = 1.0 / math.sqrt(case["D"])
    if case.get("backward"):
        def forward():
            p = naive_probabilities(q, k, scale, blocked, np, bias=bias)
            return p, p @ v[:, :, None]
        if case["backward"] == "fwd+bwd":
            return (lambda: naive_attention_backward(*forward(), q, k, v, inputs["grad"], scale, np)), info
        p, out = forward()
        return (lambda: naive_attention_backward(p, out, q, k, v, inputs["grad"], scale, np)), info
    return (lambda: naive_attention(q, k, v, scale, blocked, np, bias=bias)), info


def _scipy_runner(case, inputs, threads, np):
    import scipy
    import scipy.special
    x = inputs["x"]
    return (lambda: scipy.special.softmax(x, axis=-1)), {"version": scipy.__version__}


RUNNERS = {"fastattn": _fastattn_runner, "torch": _torch_runner,
           "numpy": _numpy_runner, "scipy": _scipy_runner}


def time_calls(fn, min_time, warmup=2, batch_time=0.02, max_samples=25):
    """Per-call seconds of ``fn``: one entry per timed batch, after warm-up.

    Calls are grouped into batches of at least ``batch_time`` seconds (so a
    microsecond call is timed over thousands of calls) and batches repeated
    until ``min_time`` seconds are spent, at least three times.
    """
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-9)
    per_batch = max(1, int(batch_time / one))
    n_samples = min(max_samples, max(3, int(min_time / (per_batch * one))))
    samples = []
    for _ in range(n_samples):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter() - t0) / per_batch)
    return samples


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss():
    """Make VmHWM equal the current RSS (Linux >= 4.0); False if impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_extra_memory(case, lib, threads, np):
    """Peak resident bytes one call needs beyond its inputs and its output.

    Warm up on a small copy of the case (thread pools, lazy library set-up),
    reset the high-water mark, make the one big call and read it back.
    /proc is used because tracemalloc does not see C-level allocations.
    """
    small = dict(case, Lq=min(case["Lq"], 256), Lk=min(case["Lk"], 256))
    small_inputs = make_inputs(small, np)
    fn, _ = RUNNERS[lib](small, small_inputs, threads, np)
    fn(); fn()
    del fn, small_inputs
    inputs = make_inputs(case, np)
    fn, _ = RUNNERS[lib](case, inputs, threads, np)
    if not _reset_peak_rss():
        return None
    before = _status_kib("VmRSS")
    out = fn()
    peak = _status_kib("VmHWM")
    results = out if isinstance(out, tuple) else (out,)       # the backward's: dq, dk, dv
    return max(0, (peak - before) * 1024 - sum(np.asarray(r).nbytes for r in results))


def measure_ceilings(threads, min_time, np):
    """Float32 matmul GFLOP/s at 2048³ and read GB/s (sum of 256 MiB), ``threads`` wide."""
    from concurrent.futures import ThreadPoolExecutor
    rng = np.random.default_rng(0)
    n = 2048
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    t_mm = time_calls(lambda: a @ b, min_time)
    big = np.ones(256 * 2**20 // 4, dtype=np.float32)
    chunks = np.array_split(big, threads)
    # numpy's reductions are single-threaded; one chunk per thread (they
    # release the GIL) reads with the same width the kernels get.  np.sum's
    # pairwise summation can be compute-bound where np.max (SIMD) is not: the
    # ceiling is the faster of the two.
    reads = {}
    with ThreadPoolExecutor(threads) as pool:
        for name, reduce in (("sum", np.sum), ("max", np.max)):
            reads[name] = time_calls(lambda: list(pool.map(reduce, chunks)), min_time)
    return {"matmul_gflops": 2 * n**3 / 1e9 / _median(t_mm),
            "read_gbs": big.nbytes / 1e9 / min(_median(t) for t in reads.values()),
            "read_sum_gbs": big.nbytes / 1e9 / _median(reads["sum"]),
            "matmul_samples": t_mm, "read_samples": reads}


def _median(xs):
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])


def child_main(lib, case, threads, min_time, check):
    """Run one library on one case in this (fresh) process; return a result dict."""
    import numpy as np
    if lib == "ceilings":
        return measure_ceilings(threads, min_time, np)
    result = {}
    if case.get("memory"):
        result["extra_bytes"] = measure_extra_memory(case, lib, threads, np)
    inputs = make_inputs(case, np)
    fn, info = RUNNERS[lib](case, inputs, threads, np)
    result.update(info)
    try:
        first = fn()
    except TypeError as exc:
        if lib == "fastattn" and _KV.is_quantized(case):    # until the kernels take a QuantizedKV
            return dict(result, unsupported=_KV.unsupported_reason(exc))
        raise
    if check:
        result["max_err"] = check_against_float64(case, inputs, first, np)
        result["rms_err"] = rms_against_float64(case, inputs, first, np)
    result["samples"] = time_calls(fn, min_time)
    result["seconds"] = _median(result["samples"])
    return result


def _preemptions():
    """Involuntary context switches of this process so far (all threads), or None.

    Counted while timing, per second and thread, they say whether other work
    took the CPUs: a thread that has a core to itself is hardly ever preempted,
    one that shares it is preempted at every scheduler tick (hundreds a second)
    -- and the times it gives can be steady yet several times too slow, which no
    spread between repeats reveals.  Not available on Windows.
    """
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


# Reply lines of a worker start with this, so that whatever a library prints on
# stdout is not mistaken for a result.
WORKER_REPLY = "@@fastattn-bench-worker "


def worker_main(lib, threads, requests=None, replies=None):
    """Serve timing requests for ``lib`` until ``requests`` ends (``fastattn bench``).

    A long-lived child that imports one library only: the quick bench asks each
    library's worker in turn, so the libraries alternate without paying a
    process start (torch: seconds) per measurement.  One JSON request per line,
    ``{"case": ..., "min_time": seconds}``; a first line ``{"ready": lib}`` once
    the library is imported, then one reply line per request,
    ``WORKER_REPLY`` + JSON: ``{"seconds": median per call, "samples": [...],
    "preemptions_per_s": ...}`` (see :func:`_preemptions`; absent where the
    platform does not count them), plus ``max_err`` and the runner's info the
    first time a case is seen, or
    ``{"error": "..."}`` when the case fails (the worker carries on).  Inputs
    and the callable of a case are built once and kept.
    """
    import importlib

    import numpy as np
    requests = sys.stdin if requests is None else requests
    replies = sys.stdout if replies is None else replies
    # Import the library before saying "ready", so that no import runs while
    # another worker is being timed.
    importlib.import_module({"numpy": "numpy", "scipy": "scipy.special"}.get(lib, lib))
    replies.write(WORKER_REPLY + json.dumps({"ready": lib}) + "\n")
    replies.flush()
    prepared = {}
    for line in requests:
        req = json.loads(line)
        case = req["case"]
        result = {}
        try:
            if case["id"] not in prepared:
                inputs = make_inputs(case, np)
                fn, info = RUNNERS[lib](case, inputs, threads, np)
                result.update(info, max_err=check_against_float64(case, inputs, fn(), np))
                prepared[case["id"]] = fn
            switches, t0 = _preemptions(), time.perf_counter()
            samples = time_calls(prepared[case["id"]], req["min_time"], warmup=1)
            wall = time.perf_counter() - t0
            result.update(samples=samples, seconds=_median(samples))
            if switches is not None:
                result["preemptions_per_s"] = (_preemptions() - switches) / wall / threads
        except Exception as exc:                  # reported per case; the worker carries on
            result = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(WORKER_REPLY + json.dumps(result) + "\n")
        replies.flush()


# ---------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------

def child_env(threads, pythonpath=()):
    """Environment of a benchmark child: thread counts set, OpenBLAS tuning unset."""
    env = dict(os.environ)
    for var in _OPENBLAS_TUNING_VARS:
        env.pop(var, None)
    for var in _THREAD_VARS:
        env[var] = str(threads)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(list(pythonpath) + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def python_argv(code, args=()):
    """argv of a fresh interpreter running ``code`` with ``args`` as its sys.argv[1:]."""
    # `python -c` puts the working directory first on sys.path; drop it so that
    # PYTHONPATH (or site-packages) alone decides which fastattn is imported.
    code = "import sys\nif sys.path and sys.path[0] == '': del sys.path[0]\n" + code
    return [sys.executable, "-c", code, *args]


# Runs this file by path: a child must not import fastattn unless it is the
# fastattn child (its OpenMP runtime would disturb torch's).
RUN_THIS_FILE = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"


def _python(code, args=(), *, threads, pythonpath=(), timeout=None):
    """Run ``code`` in a fresh interpreter with the benchmark environment."""
    return subprocess.run(python_argv(code, args), env=child_env(threads, pythonpath),
                          capture_output=True, text=True, timeout=timeout)


def _last_error_line(proc):
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return err[-1] if err else f"exit status {proc.returncode}"


def run_child(lib, case, threads, *, min_time=0.5, check=True, pythonpath=(), timeout=900):
    """Time ``lib`` on ``case`` in a fresh interpreter; return its result dict.

    On failure the dict has an "error" key (the last line of the child's stderr).
    """
    spec = json.dumps({"lib": lib, "case": case, "threads": threads,
                       "min_time": min_time, "check": check})
    try:
        proc = _python(RUN_THIS_FILE, ("--child", spec), threads=threads, pythonpath=pythonpath, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": _last_error_line(proc)}
    return json.loads(lines[-1])


def import_error(statement, pythonpath=()):
    """None when ``statement`` (an import) runs in a fresh child process, else the error line."""
    proc = _python(statement, threads=1, pythonpath=pythonpath)
    return None if proc.returncode == 0 else _last_error_line(proc)


def library_available(lib):
    """True when ``lib`` can be found without importing it here."""
    import importlib.util
    return importlib.util.find_spec(lib) is not None


def fmt_time(seconds):
    """Human time: µs below 1 ms, ms below 10 s."""
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 10:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.1f} s"


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] in ("--child", "--worker"):
    _spec = json.loads(sys.argv[2])
    if sys.argv[1] == "--child":      # one measurement (bench/compare.py)
        print(json.dumps(child_main(_spec["lib"], _spec.get("case"), _spec["threads"],
                                    _spec["min_time"], _spec["check"])))
    else:                             # a long-lived worker (fastattn bench)
        worker_main(_spec["lib"], _spec["threads"])
