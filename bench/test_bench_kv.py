"""pytest-benchmark cases of the KV-cache formats and sinks (issue 34), side by side
with their float32 and int8 twins: one benchmark group per shape.

    pytest bench/test_bench_kv.py --benchmark-only            # time them
    pytest bench/test_bench_kv.py --benchmark-disable         # one call each + correctness

Groups: "decode B1 H32 Lk8192 D128" and "gqa-decode Hq32 Hkv8 Lk8192 D128"
(float32, int8 per key, float8 e4m3fn / e5m2, QuantizedKV u8 G=D and u4 G=32,
with sinks), "prefill B1 H8 L1024 D64" (with and without sinks).  The cases are
fastattn/_bench.py's (the same as ``bench/compare.py --group kv``).  Each output
is checked against :func:`fastattn.reference.attention` (float64, computing
float8 and QuantizedKV from their values / documented fields) on the first and
last (batch, head).  The QuantizedKV cases skip, saying so, while
``fastattn.attention`` does not take a QuantizedKV (a TypeError on a tiny probe,
before the big inputs are built); they run unchanged once it does.
"""
import numpy as np
import pytest

import fastattn
from fastattn import _bench as H
from fastattn import reference

_BY_ID = {c["id"]: c for c in H.STANDARD_CASES + H.EXTRA_CASES + H.STORAGE_CASES + H.KV_CASES}
_GROUPS = {
    "decode B1 H32 Lk8192 D128": ["decode-8k", "decode-int8", "decode-f8e4", "decode-f8e5", "decode-u8",
                                  "decode-u4", "decode-sinks"],
    "gqa-decode Hq32 Hkv8 Lk8192 D128": ["gqa-decode-f32", "gqa-decode-int8", "gqa-decode-f8e4",
                                         "gqa-decode-f8e5", "gqa-decode-u8", "gqa-decode-u4", "gqa-decode-sinks"],
    "prefill B1 H8 L1024 D64": ["prefill", "prefill-sinks"],
}
CASES = [(group, _BY_ID[cid]) for group, ids in _GROUPS.items() for cid in ids]

_inputs = {}


def inputs_for(case):
    if case["id"] not in _inputs:
        _inputs.clear()                       # one case's inputs alive at a time (~270 MiB)
        _inputs[case["id"]] = H.make_inputs(case, np)
    return _inputs[case["id"]]


def _skip_unless_kernels_take(case):
    """Skip a QuantizedKV case while the kernels refuse one (probed on a tiny cache)."""
    if not H._KV.is_quantized(case):
        return
    tiny = dict(case, B=1, Hq=1, Hkv=1, Lk=4)
    ins = H.make_inputs(tiny, np)
    k, v = H._KV.fastattn_kv(fastattn, tiny, ins)
    try:
        fastattn.attention(ins["q"], k, v)
    except TypeError as exc:
        pytest.skip(H._KV.unsupported_reason(exc))


def _reference_kv(case, inputs, name, b, hk):
    """k or v of one (batch, key/value head) as the reference takes it."""
    if H._KV.is_quantized(case):
        return fastattn.QuantizedKV(inputs[name][b, hk], inputs[name + "_qscale"][b, hk],
                                    inputs[name + "_qzero"][b, hk], bits=H._KV.QUANTIZED[case["kv_dtype"]],
                                    group_size=case.get("group_size") or case["D"])
    return inputs[name][b, hk]


def check(case, inputs, out):
    """out against reference.attention on up to 48 rows of the first and last (batch, head)."""
    assert out.shape == (case["B"], case["Hq"], case["Lq"], case["Dv"])
    assert out.dtype == np.float32
    group = case["Hq"] // case["Hkv"]
    rows = slice(0, min(case["Lq"], 48))
    for b, h in {(0, 0), (case["B"] - 1, case["Hq"] - 1)}:
        kw = {}
        if "k_scale" in inputs:
            kw = {"k_scale": inputs["k_scale"][b, h // group], "v_scale": inputs["v_scale"][b, h // group]}
        if case.get("sinks"):
            kw["sinks"] = inputs["sinks"][h]
        ref = reference.attention(inputs["q"][b, h, rows], _reference_kv(case, inputs, "k", b, h // group),
                                  _reference_kv(case, inputs, "v", b, h // group), **kw)
        np.testing.assert_allclose(out[b, h, rows], ref, rtol=2e-4, atol=2e-5,
                                   err_msg=f"{case['id']}: batch {b}, head {h}")


@pytest.mark.parametrize("group, case", CASES, ids=[c["id"] for _, c in CASES])
def test_kv_format(benchmark, group, case, bench_threads):
    _skip_unless_kernels_take(case)
    benchmark.group = group
    benchmark.extra_info["kv_mib"] = H.kv_bytes(case) / 2**20
    benchmark.extra_info["stored_as"] = H._KV.stored_as(case)
    inputs = inputs_for(case)
    k, v = H._KV.fastattn_kv(fastattn, case, inputs)
    out = benchmark(fastattn.attention, inputs["q"], k, v, num_threads=bench_threads,
                    **H.fastattn_kwargs(case, inputs))
    check(case, inputs, out)
