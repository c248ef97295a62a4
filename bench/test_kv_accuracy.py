"""bench/kv_accuracy.py's pieces on small data (its full run is the docs' table)."""
import importlib.util
import os

import numpy as np
import pytest

import fastattn

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def acc():
    pytest.importorskip("ml_dtypes")
    spec = importlib.util.spec_from_file_location("fastattn_kv_accuracy", os.path.join(HERE, "kv_accuracy.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_stored_bytes(acc):
    # D 128: codes plus a float32 scale (and zero point) per row or group
    want = {"float32": 4, "bfloat16": 2, "int8, scale per key": 132 / 128, "float8 e5m2": 1,
            "u8 asymmetric, G = D": 136 / 128, "u8 asymmetric, G = 32": 160 / 128,
            "4-bit, G = 32": 96 / 128, "4-bit, G = 64": 80 / 128}
    got = {label: acc.stored_bytes(kind, params, 128) for label, kind, params in acc.FORMATS}
    for label, b in want.items():
        assert got[label] == pytest.approx(b), label


def test_errors_order_and_the_quantized_path(acc):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 8, 64), dtype=np.float32)
    k = rng.standard_normal((1, 2, 256, 64), dtype=np.float32)
    v = rng.standard_normal((1, 2, 256, 64), dtype=np.float32)
    res = acc.measure([(q, k, v)], causal=True, with_torch=False)
    e = {label: err for label, (err, _) in res.items()}
    assert e["float32"] < 1e-6
    assert e["float32"] < e["float16"] < e["bfloat16"] < e["int8, scale per key"] < e["float8 e5m2"]
    assert e["u8 asymmetric, G = 32"] < e["4-bit, G = 32"] < 0.3
    for label in ("u8 asymmetric, G = D", "4-bit, G = 64"):
        assert res[label][1] in ("kernels", "reference (float64)")
    # the QuantizedKV error is the attention over the dequantized values
    ck, cv = fastattn.quantize_kv(k, bits=4, group_size=32), fastattn.quantize_kv(v, bits=4, group_size=32)
    out = fastattn.reference.attention(q, ck.dequantize(np.float64), cv.dequantize(np.float64), causal=True)
    exact = fastattn.reference.attention(q, k, v, causal=True)
    assert acc.rel_rms(out, exact) == pytest.approx(e["4-bit, G = 32"], rel=1e-4)


def test_model_capture(acc):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    layers, causal = acc.model_data(tokens=16)
    assert causal and len(layers) == 4
    for q, k, v in layers:
        assert q.shape == (1, 8, 16, 128) and k.shape == v.shape == (1, 2, 16, 128)
        assert q.dtype == np.float32 and np.isfinite(q).all()
