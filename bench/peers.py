"""The peers of bench/compare.py beside torch and NumPy: OpenVINO, ONNX Runtime, JAX.

Each peer runs a case in a fresh Python process that imports that library only
(the libraries' thread pools and allocators must not meet), with the run's
thread count, after a warm-up; bench/compare.py alternates the processes and
takes medians.  A peer is included when its package is importable; a case it
cannot express gets a reason instead of a time (:func:`unsupported`).

* **OpenVINO**: a one-op model of ``openvino.opset13.scaled_dot_product_attention``
  compiled for ``CPU`` with ``INFERENCE_PRECISION_HINT`` ``f32`` (``bf16`` for
  bfloat16 cases), ``INFERENCE_NUM_THREADS`` = threads, one stream, inputs in
  the case's dtype (int8 caches: Convert and Multiply by the scales in the same
  model).  Grouped heads (Hq > Hkv) are folded into the query rows, (B, Hkv,
  group * Lq, D), masks tiled to match; masks, windows and lengths as a boolean
  ``attention_mask``, ALiBi as a float one (what torch gets).
* **ONNX Runtime**: ``com.microsoft.MultiHeadAttention`` (Hq == Hkv; query
  (B, Lq, H * D), keys and values (B, H, Lk, D); ``unidirectional`` for causal,
  masks and ALiBi as ``attention_bias``) or ``com.microsoft.GroupQueryAttention``
  for grouped decode (one query row: the cache as ``past_key`` / ``past_value``
  bound to the ``present`` outputs, so no copy; the last key as the new one),
  float32 or float16 -- the CPU provider has no bfloat16 kernels of them.  The
  graph is built with ``onnx.helper`` when ``onnx`` is importable, else written
  as protobuf bytes here (:mod:`bench.onnx_bytes`).  ``intra_op_num_threads`` =
  threads; inputs and output bound once (I/O binding).
* **JAX**: ``jax.nn.dot_product_attention`` (layout B, L, H, D), jitted, warm,
  on the CPU backend; causal, windows (``local_window_size``), kv_lengths
  (``key_value_seq_lengths``), masks and ALiBi (``bias``) in its own terms; the
  backward cases through ``jax.vjp``.  Threads: XLA's CPU thread pool follows
  the CPUs the process may run on, so a run with fewer threads than CPUs pins
  the JAX process to that many (one thread: XLA's single-threaded Eigen).

Every peer's output is checked against float64 on a slice, like fastattn's and
torch's, and against fastattn's own output on the same inputs (compare.py).
"""
import importlib.util
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

PEERS = ("openvino", "onnxruntime", "jax")
LABELS = {"fastattn": "fastattn", "torch": "torch", "numpy": "NumPy", "scipy": "SciPy",
          "openvino": "OpenVINO", "onnxruntime": "ONNX Runtime", "jax": "JAX"}


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Loaded by path (not ``import fastattn._bench``): importing the package needs
# the compiled kernels, and only the fastattn child may load them.
H = _load("fastattn_bench_harness", os.path.join(REPO, "fastattn", "_bench.py"))


def peer_available(lib):
    """True when the peer's package can be found (without importing it here)."""
    return importlib.util.find_spec(lib) is not None


def unsupported(lib, case):
    """Why ``lib`` cannot express ``case`` (a short reason), or None when it can."""
    kind = case["kind"]
    if kind in H.SERVING_KINDS:
        return "no packed or paged batch op (fastattn's own baseline is the comparison)"
    if kind == "softmax":
        return None
    q_dtype = case.get("q_dtype") or case["dtype"]
    kv_dtype = case.get("kv_dtype") or case["dtype"]
    if kv_dtype in H._KV.KV_FORMATS:
        return ("no float8 or QuantizedKV cache input here (a torch user's dequantize-then-SDPA is the "
                "torch column)")
    if case.get("sinks"):
        return "no attention-sink input in its attention op"
    if case.get("backward") and lib in ("openvino", "onnxruntime"):
        return "an inference runtime: no backward"
    if case["D"] != case["Dv"] and lib == "onnxruntime":
        return "MultiHeadAttention here needs Dk == Dv"
    if lib == "onnxruntime":
        if "bfloat16" in (q_dtype, kv_dtype):
            return "the CPU provider has no bfloat16 MultiHeadAttention / GroupQueryAttention"
        if case["dtype"] == "float64":
            return "the CPU provider has no float64 MultiHeadAttention"
        if case["Hq"] != case["Hkv"]:
            if case["Lq"] != 1:
                return "GroupQueryAttention expresses grouped decode (one query row) here"
            if case["mask"] or case["window"] or case.get("alibi") or case["kv_lengths"]:
                return "GroupQueryAttention has no mask or bias input"
            if kv_dtype == "int8":
                return "GroupQueryAttention takes the cache as stored: no int8 here"
    if lib == "jax" and "float16" in (q_dtype, kv_dtype):
        return "XLA:CPU has no float16 dot with float32 sums (dot_general F16_F16_F32)"
    if lib == "openvino" and case["dtype"] == "float64":
        return "the CPU plugin computes in float32 at best (no float64 SDPA)"
    return None


# ---------------------------------------------------------------------------
# Inputs in a peer's terms
# ---------------------------------------------------------------------------

def _storage(case):
    """(query dtype name, key/value dtype name) as stored."""
    return case.get("q_dtype") or case["dtype"], case.get("kv_dtype") or case["dtype"]


def _mask_needed(case):
    """True when a case's visibility rule is not a plain causal flag on a square."""
    return bool(case["mask"] or case["window"] or case["kv_lengths"]
                or (case["causal"] and case["Lq"] != case["Lk"]))


def _grouped_rows(a, Hkv, np):
    """(B, Hq, Lq, X) -> (B, Hkv, group * Lq, X): the query heads of a group as rows."""
    B, Hq, Lq, X = a.shape
    return np.ascontiguousarray(a.reshape(B, Hkv, (Hq // Hkv) * Lq, X))


def _ungrouped(out, Hq, np):
    """(B, Hkv, group * Lq, X) -> (B, Hq, Lq, X)."""
    B, Hkv, R, X = out.shape
    return out.reshape(B, Hq, R * Hkv // Hq, X)


# ---------------------------------------------------------------------------
# OpenVINO
# ---------------------------------------------------------------------------

def _ov_tensor(ov, arr, np):
    if arr.dtype.name == "bfloat16":          # no NumPy dtype on OpenVINO's side: copy the bits
        t = ov.Tensor(ov.Type.bf16, list(arr.shape))
        t.data.view(np.uint16)[...] = arr.view(np.uint16)
        return t
    return ov.Tensor(np.ascontiguousarray(arr), shared_memory=True)


def _ov_type(ov, dtype_name):
    return {"float32": ov.Type.f32, "float16": ov.Type.f16, "bfloat16": ov.Type.bf16,
            "int8": ov.Type.i8, "bool": ov.Type.boolean}[dtype_name]


def _openvino_runner(case, inputs, threads, np):
    import openvino as ov
    import openvino.opset13 as ops
    info = {"version": ov.__version__}
    q_dt, kv_dt = _storage(case)
    precision = "bf16" if "bfloat16" in (q_dt, kv_dt) else "f32"
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    params, feeds = [], []

    def param(name, arr):
        p = ops.parameter(list(arr.shape), _ov_type(ov, arr.dtype.name), name=name)
        params.append(p)
        feeds.append(arr)
        return p

    if case["kind"] == "softmax":
        x = inputs["x"]
        out_node = ops.softmax(param("x", x), -1)
        canon = None
    else:
        Hq, Hkv = case["Hq"], case["Hkv"]
        grouped = Hq != Hkv
        q = _grouped_rows(inputs["q"], Hkv, np) if grouped else inputs["q"]
        qn, kn, vn = param("q", q), param("k", inputs["k"]), param("v", inputs["v"])
        if kv_dt == "int8":       # dequantize in the model: Convert, then Multiply by the scales
            kn = ops.multiply(ops.convert(kn, ov.Type.f32), param("k_scale", inputs["k_scale"]))
            vn = ops.multiply(ops.convert(vn, ov.Type.f32), param("v_scale", inputs["v_scale"]))
        mask = None
        causal = bool(case["causal"])
        if _mask_needed(case) or (grouped and causal):
            m = H.allowed_mask(case, inputs, np)               # broadcastable to (B, H, Lq, Lk)
            if grouped and m.shape[2] != 1:
                m = np.tile(m, (1, 1, Hq // Hkv, 1))
            mask, causal = param("mask", np.ascontiguousarray(m)), False
        elif case.get("alibi"):
            bias = H.alibi_bias(case, inputs, np)               # (1, Hq, Lq, Lk)
            bias = _grouped_rows(bias, Hkv, np) if grouped else bias
            mask = param("bias", bias.astype(inputs["q"].dtype))     # the query's type
        args = [qn, kn, vn] + ([mask] if mask is not None else [])
        out_node = ops.scaled_dot_product_attention(*args, causal=causal)

        def canon(out):
            return _ungrouped(out, Hq, np) if grouped else out
    compiled = ov.Core().compile_model(ov.Model([out_node], params, "sdpa"), "CPU", config)
    info["precision"] = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    info["threads"] = int(compiled.get_property("INFERENCE_NUM_THREADS"))
    req = compiled.create_infer_request()
    tensors = [_ov_tensor(ov, a, np) for a in feeds]
    for i, t in enumerate(tensors):
        req.set_input_tensor(i, t)
    bf16_out = req.get_output_tensor(0).get_element_type() == ov.Type.bf16

    def result():
        data = req.get_output_tensor(0).data
        if bf16_out:
            data = data.view(np.uint16).view(H._numpy_dtype("bfloat16", np))
        data = np.asarray(data, dtype=np.float32)
        return canon(data) if canon else data
    # the shared-memory tensors do not keep their arrays alive: the closure does
    keep = (feeds, tensors)
    return (lambda: req.infer() and keep), info, result


# ---------------------------------------------------------------------------
# ONNX Runtime
# ---------------------------------------------------------------------------

def _onnx_model(nodes, graph_inputs, graph_outputs):
    """Serialized ModelProto: with onnx.helper when onnx is importable, else our bytes."""
    if importlib.util.find_spec("onnx") is not None:
        import onnx
        from onnx import TensorProto, helper
        elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int8": TensorProto.INT8,
                "int32": TensorProto.INT32, "bool": TensorProto.BOOL}
        graph = helper.make_graph(
            [helper.make_node(op, ins, outs, domain=dom or None, **attrs) for op, ins, outs, dom, attrs in nodes],
            "g", [helper.make_tensor_value_info(n, elem[d], s) for n, d, s in graph_inputs],
            [helper.make_tensor_value_info(n, elem[d], s) for n, d, s in graph_outputs])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 8
        return model.SerializeToString(), "onnx.helper"
    ob = _load("fastattn_onnx_bytes", os.path.join(HERE, "onnx_bytes.py"))
    return ob.model([ob.node(op, ins, outs, domain=dom, **attrs) for op, ins, outs, dom, attrs in nodes],
                    graph_inputs, graph_outputs), "bench/onnx_bytes.py"


def _onnxruntime_runner(case, inputs, threads, np):
    import onnxruntime as ort
    info = {"version": ort.__version__}
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    feeds, outs, nodes, g_in, g_out = {}, {}, [], [], []
    past = {}                 # GroupQueryAttention's cache, bound as input and output

    def inp(name, arr):
        arr = np.ascontiguousarray(arr)
        feeds[name] = arr
        g_in.append((name, arr.dtype.name, list(arr.shape)))
        return name

    if case["kind"] == "softmax":
        x = inputs["x"]
        nodes.append(("Softmax", [inp("x", x)], ["y"], "", {"axis": -1}))
        g_out.append(("y", x.dtype.name, list(x.shape)))
        outs["y"] = np.empty_like(x)
        canon = None
    else:
        q_dt, kv_dt = _storage(case)
        B, Hq, Hkv, Lq, Lk, D, Dv = (case[n] for n in ("B", "Hq", "Hkv", "Lq", "Lk", "D", "Dv"))
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        ct = "float16" if q_dt == "float16" else "float32"       # compute type of the op
        k_name, v_name = "k", "v"
        if kv_dt == "int8":       # dequantize in the graph: Cast, then Mul by the scales
            inp("k", k), inp("v", v)
            for n in "kv":
                nodes.append(("Cast", [n], [n + "_f"], "", {"to": 1}))
                nodes.append(("Mul", [n + "_f", inp(n + "_scale", inputs[n + "_scale"])], [n + "_dq"], "", {}))
            k_name, v_name = "k_dq", "v_dq"
        q3 = q.transpose(0, 2, 1, 3).reshape(B, Lq, Hq * D)
        if Hq == Hkv:
            if kv_dt != "int8":
                inp("k", k), inp("v", v)
            extra = ["", "", ""]                          # bias, key_padding_mask, attention_bias
            if _mask_needed(case):
                allowed = np.broadcast_to(H.allowed_mask(case, inputs, np), (B, 1, Lq, Lk))
                batch = B if case["kv_lengths"] else 1
                bias = np.where(allowed[:batch], 0.0, -np.inf).astype(ct)
                extra[2] = inp("attention_bias", bias)
            elif case.get("alibi"):
                extra[2] = inp("attention_bias", H.alibi_bias(case, inputs, np).astype(ct))
            attrs = {"num_heads": Hq, "unidirectional": int(bool(case["causal"]) and not _mask_needed(case))}
            while extra and not extra[-1]:
                extra.pop()
            nodes.append(("MultiHeadAttention", [inp("q", q3), k_name, v_name] + extra, ["o"],
                          "com.microsoft", attrs))
            g_out.append(("o", ct, [B, Lq, Hq * Dv]))
        else:
            # decode: the cache (all but the last key) as past_key / past_value
            # bound to present_key / present_value (the same buffer: no copy);
            # the last key and value as the new ones, written in place of themselves
            if kv_dt == "int8":
                raise ValueError("GroupQueryAttention takes the cache as stored: no int8 here")
            kc, vc = (np.ascontiguousarray(a) for a in (k, v))
            gi = [inp("q", q3),
                  inp("k_new", kc[:, :, -1:].transpose(0, 2, 1, 3).reshape(B, 1, Hkv * D)),
                  inp("v_new", vc[:, :, -1:].transpose(0, 2, 1, 3).reshape(B, 1, Hkv * Dv)),
                  "past_key", "past_value",
                  inp("seqlens_k", np.full(B, Lk - 1, np.int32)), inp("total_len", np.array([Lk], np.int32))]
            g_in.extend([("past_key", ct, list(kc.shape)), ("past_value", ct, list(vc.shape))])
            nodes.append(("GroupQueryAttention", gi, ["o", "present_key", "present_value"], "com.microsoft",
                          {"num_heads": Hq, "kv_num_heads": Hkv}))
            g_out.extend([("o", ct, [B, 1, Hq * Dv]), ("present_key", ct, list(kc.shape)),
                          ("present_value", ct, list(vc.shape))])
            past = {"past_key": ort.OrtValue.ortvalue_from_numpy(kc),
                    "past_value": ort.OrtValue.ortvalue_from_numpy(vc)}
        outs["o"] = np.empty((B, Lq, Hq * Dv), dtype=ct)

        def canon(out):
            return out.reshape(B, Lq, Hq, Dv).transpose(0, 2, 1, 3)
    model, builder = _onnx_model(nodes, g_in, g_out)
    info["graph_builder"] = builder
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(arr) for name, arr in feeds.items()}
    for name, val in values.items():
        io.bind_ortvalue_input(name, val)
    bound = {name: ort.OrtValue.ortvalue_from_numpy(arr) for name, arr in outs.items()}
    for name, val in bound.items():
        io.bind_ortvalue_output(name, val)
    for name, val in past.items():
        io.bind_ortvalue_input(name, val)
        io.bind_ortvalue_output(name.replace("past", "present"), val)
    out_name = next(iter(outs))

    def result():
        data = np.asarray(bound[out_name].numpy(), dtype=np.float32)
        return canon(data) if canon else data
    # the bound values share the arrays' memory without owning it: the closure keeps both
    keep = (feeds, outs, values, bound, past)
    return (lambda: sess.run_with_iobinding(io) and keep), info, result


# ---------------------------------------------------------------------------
# JAX
# ---------------------------------------------------------------------------

def _jax_threads(threads):
    """Before importing jax: XLA's CPU pool follows the process's CPUs."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None
    if threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    if threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])
        return f"pinned to CPUs {cpus[:threads]}"
    return None


def _jax_runner(case, inputs, threads, np):
    pinned = _jax_threads(threads)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    info = {"version": jax.__version__}
    if pinned:
        info["threads"] = pinned
    if case["kind"] == "softmax":
        x = jax.device_put(inputs["x"])
        f = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))
        return (lambda: f(x).block_until_ready()), info, lambda out: np.asarray(out, dtype=np.float32)
    q_dt, kv_dt = _storage(case)
    bthd = lambda a: np.ascontiguousarray(a.transpose(0, 2, 1, 3))      # noqa: E731
    q, k, v = (bthd(inputs[n]) for n in "qkv")
    kw = {}
    extra = {}
    if case["window"]:
        kw["local_window_size"] = tuple(case["window"])
    if case["causal"] and case["Lq"] == case["Lk"]:
        kw["is_causal"] = True
    elif case["causal"]:
        extra["mask"] = np.ascontiguousarray(H.allowed_mask(case, inputs, np))
    if case["mask"]:
        extra["mask"] = np.ascontiguousarray(H.allowed_mask(case, inputs, np))
        kw.pop("local_window_size", None)
        kw.pop("is_causal", None)
    if case["kv_lengths"]:
        extra["key_value_seq_lengths"] = inputs["kv_lengths"].astype(np.int32)
    if case.get("alibi"):
        extra["bias"] = H.alibi_bias(case, inputs, np).astype(inputs["q"].dtype)
    if kv_dt == "int8":       # dequantize inside the jitted function (XLA may fuse it)
        extra["k_scale"] = bthd(inputs["k_scale"])
        extra["v_scale"] = bthd(inputs["v_scale"])

    def attend(q, k, v, extra):
        ex = dict(extra)
        if "k_scale" in ex:
            k = k.astype(jnp.float32) * ex.pop("k_scale")
            v = v.astype(jnp.float32) * ex.pop("v_scale")
        return jax.nn.dot_product_attention(q, k, v, **ex, **kw)

    q, k, v = (jax.device_put(a) for a in (q, k, v))
    extra = {n: jax.device_put(a) for n, a in extra.items()}
    tohd = lambda out: np.asarray(out, dtype=np.float32).transpose(0, 2, 1, 3)     # noqa: E731
    if case.get("backward"):
        grad = jax.device_put(bthd(inputs["grad"]))
        if case["backward"] == "fwd+bwd":
            step = jax.jit(lambda q, k, v, g, ex: jax.vjp(lambda q, k, v: attend(q, k, v, ex), q, k, v)[1](g))
            fn = lambda: jax.block_until_ready(step(q, k, v, grad, extra))     # noqa: E731
        else:
            _, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, extra), q, k, v)
            back = jax.jit(vjp)
            fn = lambda: jax.block_until_ready(back(grad))      # noqa: E731
        return fn, info, lambda grads: tuple(tohd(g) for g in grads)
    f = jax.jit(attend)
    return (lambda: f(q, k, v, extra).block_until_ready()), info, tohd


PEER_RUNNERS = {"openvino": _openvino_runner, "onnxruntime": _onnxruntime_runner, "jax": _jax_runner}


def runner(lib, case, inputs, threads, np):
    """(fn, info, result) for any library: ``fn()`` is what is timed, ``result(r)``
    turns what it returned into fastattn's layout (B, H, Lq, Dv) as float32
    NumPy (the backward: dq, dk, dv)."""
    if lib in PEER_RUNNERS:
        fn, info, result = PEER_RUNNERS[lib](case, inputs, threads, np)
        if lib in ("openvino", "onnxruntime"):         # the output lives in a bound buffer
            return fn, info, lambda _: result()
        return fn, info, result
    fn, info = H.RUNNERS[lib](case, inputs, threads, np)
    if case["kind"] in H.SERVING_KINDS:          # per-sequence outputs: checked as they are
        return fn, info, lambda r: r

    def to_numpy(r):
        if isinstance(r, tuple):
            return tuple(to_numpy(x) for x in r)
        r = np.asarray(r)
        return r if r.dtype in (np.float32, np.float64) else r.astype(np.float32)
    return fn, info, to_numpy


# ---------------------------------------------------------------------------
# The child process: one library, one case
# ---------------------------------------------------------------------------

def check_slice(case, out, np):
    """The part of an output the checks compare, float64: for attention the rows
    of H._check_rows of the two heads of H._check_heads (the backward: of dq),
    for softmax the first 64 rows; None for serving cases."""
    if case["kind"] in H.SERVING_KINDS:
        return None
    if case["kind"] == "softmax":
        return np.asarray(out[:64], dtype=np.float64)
    if case.get("backward"):
        out = out[0]
    rows = H._check_rows(case, np)
    pairs = sorted({(0, 0), (case["B"] - 1, case["Hq"] - 1)})
    return np.stack([np.asarray(out[b, h, rows], dtype=np.float64) for b, h in pairs])


def ceiling_bytes(case):
    """Bytes a memory-bound case must move, over which its read ceiling is measured
    (None for compute-bound cases): K and V once for decode, read + write for softmax."""
    if case["kind"] == "softmax":
        return 2 * case["rows"] * case["cols"] * (8 if case["dtype"] == "float64" else 4)
    if case.get("decode"):
        return H.kv_bytes(case)
    return None


def child_main(lib, case, threads, min_time, check, dump=None):
    """Time ``lib`` on ``case`` in this (fresh) process; return a result dict.
    ``dump``: where to save the output's check slice (a .npy path) for the
    parent's comparison against fastattn."""
    import numpy as np
    if lib == "ceilings":
        return ceilings_main(threads, min_time, case.get("read_bytes", []) if case else [], np)
    result = {}
    if case.get("memory") and lib in H.RUNNERS:
        result["extra_bytes"] = H.measure_extra_memory(case, lib, threads, np)
    inputs = H.make_inputs(case, np)
    fn, info, to_numpy = runner(lib, case, inputs, threads, np)
    result.update(info)
    try:
        first = to_numpy(fn())
    except TypeError as exc:
        if lib == "fastattn" and H._KV.is_quantized(case):   # until the kernels take a QuantizedKV
            return dict(result, unsupported=H._KV.unsupported_reason(exc))
        raise
    if check:
        result["max_err"] = H.check_against_float64(case, inputs, first, np)
        result["rms_err"] = H.rms_against_float64(case, inputs, first, np)
        piece = check_slice(case, first, np)
        if dump and piece is not None:
            np.save(dump, piece)
    result["samples"] = H.time_calls(fn, min_time)
    result["seconds"] = H._median(result["samples"])
    nbytes = ceiling_bytes(case)
    if lib == "fastattn" and nbytes:
        # the read loop over the same bytes right after the case, in its process:
        # the same state of the machine (compare.case_read_ceiling)
        from fastattn._dispatch import kernels
        result["read_after_gbs"] = read_ceiling(kernels, nbytes, threads, min_time)
    return result


def read_ceiling(kernels, nbytes, threads, min_time):
    """GB/s of the compiled read loop over ``nbytes``: the same timing for the run's
    spread readings (ceilings_main) and the one after each memory-bound case."""
    return kernels.read_bandwidth(int(nbytes), threads, min_time=min(min_time, 0.1) / 4)


def ceilings_main(threads, min_time, read_bytes, np):
    """The ceilings of this run, ``threads`` wide: fastattn's compiled loops
    (FMA peak per compute type, read bandwidth at each size in ``read_bytes``)
    and NumPy's matmul and reductions (for reference)."""
    res = H.measure_ceilings(threads, min_time, np)
    res = {k: v for k, v in res.items() if not k.endswith("_samples")}
    try:
        from fastattn._dispatch import VARIANT, kernels
    except ImportError as exc:
        res["compiled_error"] = f"{type(exc).__name__}: {exc}"
        return res
    t = min(min_time, 0.1)
    res["variant"] = VARIANT
    res["fma_gflops"] = kernels.fma_peak(threads, min_time=t)
    res["fma_f64_gflops"] = kernels.fma_peak(threads, dtype="float64", min_time=t)
    res["bf16_dot_gflops"] = kernels.fma_peak(threads, dtype="bfloat16", min_time=t)
    res["bf16_tiles"] = bool(kernels.ceiling_info().get("bf16_tiles"))     # AMX: the peak is the tiles'
    res["read_ceiling_gbs"] = {str(n): read_ceiling(kernels, n, threads, min_time)
                               for n in sorted(set(int(n) for n in read_bytes))}
    return res


RUN_THIS_FILE = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"


def run_child(lib, case, threads, *, min_time=0.5, check=True, pythonpath=(), timeout=900, dump=None):
    """Time ``lib`` on ``case`` in a fresh interpreter (this file's child); its result dict,
    with an "error" key on failure (the last line of the child's stderr)."""
    import subprocess
    spec = json.dumps({"lib": lib, "case": case, "threads": threads, "min_time": min_time,
                       "check": check, "dump": dump})
    try:
        proc = H._python(RUN_THIS_FILE, ("--child", spec), threads=threads, pythonpath=pythonpath,
                         timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": _error_line(proc)}
    try:
        return json.loads(lines[-1])
    except ValueError:
        return {"error": f"unreadable reply: {lines[-1][:200]}"}


def _error_line(proc):
    """The exception line of a failed child's stderr (JAX prints a note after it)."""
    import re
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(err):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", ln):
            return ln
    return err[-1] if err else f"exit status {proc.returncode}"


def max_diff(a_path, b_path):
    """Largest |a - b| of two saved check slices, or None when either is missing."""
    import numpy as np
    if not (a_path and b_path and os.path.exists(a_path) and os.path.exists(b_path)):
        return None
    a, b = np.load(a_path), np.load(b_path)
    if a.shape != b.shape:
        return math.inf
    return float(np.max(np.abs(a - b))) if a.size else 0.0


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    _spec = json.loads(sys.argv[2])
    print(json.dumps(child_main(_spec["lib"], _spec.get("case"), _spec["threads"], _spec["min_time"],
                                _spec["check"], _spec.get("dump"))))
