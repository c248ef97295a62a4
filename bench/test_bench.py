"""pytest-benchmark suite: fastattn against the naive NumPy baseline, one group per case.

    pytest bench/ --benchmark-only                 # time everything (a few minutes)
    pytest bench/ --benchmark-disable              # one call each + correctness: the CI check
    pytest bench/ --benchmark-only -k "prefill or decode" --bench-threads 1

(``python -m pytest`` from a checkout with the in-place build; plain
``pytest`` finds the installed package.)

Every fastattn benchmark also checks its result against ``fastattn.reference``
(the float64 specification) on a cheap slice -- a few query rows of the first
and last (batch, head) -- so that ``--benchmark-disable`` is a quick
correctness run over the same shapes.  The "numpy" contestant is the naive
``softmax(q kᵀ/√d) v`` in the input dtype; it is skipped on cases whose score
matrix would be huge.

Both contestants run in this one process, which is fine for NumPy against
fastattn; the authoritative comparison with torch (which must not share a
process with fastattn's OpenMP runtime) is ``python bench/compare.py``.
"""
import math

import numpy as np
import pytest

import fastattn  # an import failure must fail CI, not skip the suite
from fastattn import _bench as H
from fastattn import reference

A, S = H.attention_case, H.softmax_case

# The numpy contestant is skipped when its score matrix exceeds this.
NUMPY_MAX_SCORES_BYTES = 512 * 2**20

# The same speed must hold off the standard shapes: head sizes and odd lengths.
SWEEP = [
    A(f"D{d}-{dt[5:]}{'-causal' if c else ''}", 1, 4, 512, 512, d, dtype=dt, causal=c)
    for d in (64, 80, 96, 128, 256) for dt in ("float32", "float64") for c in (False, True)
] + [
    A(f"L{n}-{dt[5:]}{'-causal' if c else ''}", 1, 4, n, n, 64, dtype=dt, causal=c)
    for n in (1, 777, 1000) for dt in ("float32", "float64") for c in (False, True)
] + [
    # query rows against a KV cache, across the kernel regimes (few-row, row-major,
    # query-vectorised with 1, 2 and 4+1 vectors of lanes, key splits)
    A(f"rows{n}-{dt[5:]}", 1, 8, n, 4096, 128, dtype=dt)
    for n in (4, 8, 16, 24, 32, 48, 80) for dt in ("float32",)
] + [A("rows16-64", 1, 8, 16, 4096, 128, dtype="float64")]

ATTENTION_CASES = [c for c in H.STANDARD_CASES + H.EXTRA_CASES if c["kind"] == "attention"] + SWEEP
SOFTMAX_CASES = [c for c in H.STANDARD_CASES if c["kind"] == "softmax"] + [
    S("softmax-f64-odd", 1000, 777, dtype="float64"),
    S("softmax-axis0", 2048, 2048, axis=0),          # along the strided axis
    S("softmax-axis0-narrow", 3000, 40, axis=0)]

_inputs_cache = {}


def inputs_for(case):
    """Inputs of a case, built once for its contestants (the largest are ~270 MiB)."""
    if case["id"] not in _inputs_cache:
        _inputs_cache.clear()          # keep one case's inputs alive at a time
        _inputs_cache[case["id"]] = H.make_inputs(case, np)
    return _inputs_cache[case["id"]]


def tolerance(dtype):
    return dict(rtol=2e-4, atol=2e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)


def check_attention(case, inputs, out):
    """Compare ``out`` with reference.attention on the first and last rows of two heads.

    The first rows need only the first keys under a causal mask (top-left);
    the last rows are compared with ``causal='bottom_right'`` so that their
    diagonal stays where it is in the full problem.
    """
    assert out.shape == (case["B"], case["Hq"], case["Lq"], case["Dv"])
    assert out.dtype == np.dtype(case["dtype"])
    r = min(case["Lq"], 48)
    group = case["Hq"] // case["Hkv"]
    kw = H.fastattn_kwargs(case, inputs)
    for b, h in {(0, 0), (case["B"] - 1, case["Hq"] - 1)}:
        q, k, v = inputs["q"][b, h], inputs["k"][b, h // group], inputs["v"][b, h // group]
        ref_kw = dict(kw)
        if case["kv_lengths"]:
            ref_kw["kv_lengths"] = inputs["kv_lengths"][b]
        # ALiBi's distances depend on the absolute row: the reference gets the
        # biases of the rows it is given
        alibi = H.alibi_bias(case, inputs, np, heads=[h])
        ref_kw.pop("alibi_slopes", None)
        mask = inputs.get("mask")
        for rows, causal in ((slice(0, r), case["causal"] and "top_left"),
                             (slice(case["Lq"] - r, case["Lq"]), case["causal"] and "bottom_right")):
            nk = r if (causal == "top_left" and case["Lq"] == case["Lk"]) else case["Lk"]
            if case["window"]:          # the window's diagonal must stay where it is
                if rows.start:
                    continue
                nk = case["Lk"]
            if mask is not None:
                ref_kw["mask"] = mask[rows, :nk]
            if alibi is not None:
                ref_kw["bias"] = alibi[0, 0, rows, :nk]
            ref = reference.attention(q[rows], k[:nk], v[:nk], **dict(ref_kw, causal=causal or False))
            np.testing.assert_allclose(out[b, h, rows], ref, **tolerance(case["dtype"]),
                                       err_msg=f"{case['id']}: batch {b}, head {h}, rows {rows}")


def _group(benchmark, case):
    benchmark.group = case["id"]
    if case["kind"] in ("attention",) + H.SERVING_KINDS:
        benchmark.extra_info["gflop"] = H.attention_flops(case) / 1e9
        benchmark.extra_info["kv_mib"] = H.kv_bytes(case) / 2**20


# Both contestants of a case run one after the other (inputs are built once).
@pytest.mark.parametrize("case, contestant",
                         [(c, who) for c in ATTENTION_CASES for who in ("fastattn", "numpy")],
                         ids=[f"{c['id']}-{who}" for c in ATTENTION_CASES for who in ("fastattn", "numpy")])
def test_attention(benchmark, case, contestant, bench_threads):
    if contestant == "numpy" and H.numpy_scores_bytes(case) > NUMPY_MAX_SCORES_BYTES:
        pytest.skip(f"naive NumPy needs a {H.numpy_scores_bytes(case) / 2**30:.1f} GiB score matrix")
    _group(benchmark, case)
    inputs = inputs_for(case)
    if contestant == "numpy":
        blocked = H._blocked(H.allowed_mask(case, inputs, np))
        out = benchmark(H.naive_attention, inputs["q"], inputs["k"], inputs["v"],
                        1.0 / math.sqrt(case["D"]), blocked, np, bias=H.alibi_bias(case, inputs, np))
        assert out.shape == (case["B"], case["Hq"], case["Lq"], case["Dv"])
        if case.get("alibi"):
            check_attention(case, inputs, out)
        return
    out = benchmark(fastattn.attention, inputs["q"], inputs["k"], inputs["v"],
                    num_threads=bench_threads, **H.fastattn_kwargs(case, inputs))
    check_attention(case, inputs, out)


@pytest.mark.parametrize("case, contestant",
                         [(c, who) for c in SOFTMAX_CASES for who in ("fastattn", "scipy")],
                         ids=[f"{c['id']}-{who}" for c in SOFTMAX_CASES for who in ("fastattn", "scipy")])
def test_softmax(benchmark, case, contestant, bench_threads):
    benchmark.group = case["id"]
    x = inputs_for(case)["x"]
    axis = case.get("axis", -1)
    if contestant == "scipy":
        special = pytest.importorskip("scipy.special")
        benchmark(special.softmax, x, axis=axis)
        return
    out = benchmark(fastattn.softmax, x, axis=axis, num_threads=bench_threads)
    assert out.dtype == x.dtype and out.shape == x.shape
    part = (slice(None), slice(0, 64)) if axis == 0 else (slice(0, 64),)
    np.testing.assert_allclose(out[part], reference.softmax(x[part], axis=axis), **tolerance(case["dtype"]))


BACKWARD_CASES = H.BACKWARD_CASES


# the naive NumPy backward runs in the compute type: not for the bfloat16 cases
BACKWARD_RUNS = [(c, who) for c in BACKWARD_CASES for who in ("fastattn", "numpy")
                 if who == "fastattn" or not c.get("kv_dtype")]


@pytest.mark.parametrize("case, contestant", BACKWARD_RUNS, ids=[f"{c['id']}-{who}" for c, who in BACKWARD_RUNS])
def test_backward(benchmark, case, contestant, bench_threads):
    """Gradients (one backward on one forward's out and lse, or both for the
    'fwd+bwd' cases); dq checked on the rows of check_against_float64 (bfloat16
    gradients: within their rounding, half a unit in the last place of the
    largest)."""
    if contestant == "numpy" and H.numpy_scores_bytes(case) > NUMPY_MAX_SCORES_BYTES:
        pytest.skip(f"naive NumPy needs {H.numpy_scores_bytes(case) / 2**30:.1f} GiB of score matrices")
    _group(benchmark, case)
    inputs = inputs_for(case)
    fn, _ = H.RUNNERS[contestant](case, inputs, bench_threads, np)
    dq, dk, dv = benchmark(fn)
    for g, name in ((dq, "q"), (dk, "k"), (dv, "v")):
        assert g.shape == inputs[name].shape and g.dtype == inputs[name].dtype
    err = H.check_against_float64(case, inputs, (dq, dk, dv), np)
    tol = 1e-4 if case["dtype"] == "float32" else 1e-11
    if case.get("q_dtype") == "bfloat16":
        tol = 2.0 ** -8 * float(np.max(np.abs(np.asarray(dq, dtype=np.float64)))) + 1e-4
    assert err <= tol, f"{case['id']}: dq error {err:.1e}"


SERVING_CASES = H.SERVING_CASES


@pytest.mark.parametrize("case", SERVING_CASES, ids=[c["id"] for c in SERVING_CASES])
def test_serving(benchmark, case, bench_threads):
    """Packed variable-length batches and paged caches, and fastattn's own
    baselines of them (a loop of attention over the sequences; the same decode
    on contiguous caches): checked against float64 on the first and last
    sequence (H.check_against_float64)."""
    _group(benchmark, case)
    inputs = inputs_for(case)
    fn, _ = H.RUNNERS["fastattn"](case, inputs, bench_threads, np)
    out = benchmark(fn)
    err = H.check_against_float64(case, inputs, out, np)
    assert err <= 1e-4, f"{case['id']}: error {err:.1e}"
