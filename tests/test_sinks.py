"""Attention sinks in the kernels (issue 34): every option, both layouts (few
rows, query-vectorised), split-KV decode, grouped heads, storage types, packed
and paged batches, Dask chunks, the backward's dsinks and merge_attention,
against fastattn.reference (itself checked against the eager formula in
test_reference_sinks.py)."""
from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fa_testutil import assert_close, assert_unchanged, reference as R, snapshot, torch_or_skip

# (Lq, Lk): decode (one row, few-rows unit), a few rows, query-vectorised
# prefill, and one row against a long cache (split-KV decode, merged splits)
SHAPES = [(1, 37), (5, 70), (40, 150), (1, 3000), (20, 2600)]

OPTIONS = {
    "none": {},
    "causal": {"causal": True},
    "bottom_right": {"causal": "bottom_right"},
    "window": {"window": (6, 2)},
    "softcap": {"softcap": 1.5, "scale": 0.9},
    "alibi": {"alibi_slopes": np.array([0.1, 0.3, 0.05, 0.2])},
    "kv_lengths": {"kv_lengths": np.array([[3], [0]])},          # batch 1: no key at all
    "kv_start": {"kv_start": np.array([[2], [9]]), "causal": "bottom_right"},
}


def _problem(rng, lq, lk, dtype, hq=4, hkv=2, d=16):
    q = rng.standard_normal((2, hq, lq, d)).astype(dtype)
    k = rng.standard_normal((2, hkv, lk, d)).astype(dtype)
    v = rng.standard_normal((2, hkv, lk, d)).astype(dtype)
    # about log(Lk) (scores are ~N(0, 1)): the sink takes a real share of every row
    sinks = (rng.standard_normal((2, hq)) + np.log(lk + 1)).astype(dtype)
    return q, k, v, sinks


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"Lq{a}-Lk{b}" for a, b in SHAPES])
@pytest.mark.parametrize("opt", sorted(OPTIONS))
def test_options_with_sinks_match_reference(rng, dtype, shape, opt):
    lq, lk = shape
    q, k, v, sinks = _problem(rng, lq, lk, dtype)
    kw = OPTIONS[opt]
    out, lse = fastattn.attention(q, k, v, sinks=sinks, return_lse=True, **kw)
    rout, rlse = R.attention(q, k, v, sinks=sinks, return_lse=True, **kw)
    assert_close(out, rout, what="out")
    assert_close(lse, rlse, what="lse")
    # the sinks change the result (else this test would test nothing)
    plain = fastattn.attention(q, k, v, **kw)
    assert np.abs(plain - out).max() > 1e-2


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 37), (5, 70), (40, 150)])
@pytest.mark.parametrize("opt", ["none", "causal", "kv_lengths", "softcap"])
def test_return_weights_with_sinks(rng, dtype, shape, opt):
    q, k, v, sinks = _problem(rng, *shape, dtype)
    kw = OPTIONS[opt]
    out, w, lse = fastattn.attention(q, k, v, sinks=sinks, return_weights=True, return_lse=True, **kw)
    rout, rw, rlse = R.attention(q, k, v, sinks=sinks, return_weights=True, return_lse=True, **kw)
    assert_close(out, rout, what="out")
    assert_close(w, rw, what="weights")
    assert_close(lse, rlse, what="lse")
    assert np.all(w.sum(-1) < 1)


def test_mask_and_bias_with_sinks(rng):
    q, k, v, sinks = _problem(rng, 30, 50, np.float32)
    mask = rng.random((2, 1, 30, 50)) > 0.3
    mask[0, 0, 4] = False                        # a row that sees no key
    bias = rng.standard_normal((30, 50)).astype(np.float32)
    out, lse = fastattn.attention(q, k, v, mask=mask, bias=bias, sinks=sinks[0], return_lse=True)
    rout, rlse = R.attention(q, k, v, mask=mask, bias=bias, sinks=sinks[0], return_lse=True)
    assert_close(out, rout)
    assert_close(lse, rlse)
    assert np.all(out[0, :2, 4] == 0)
    np.testing.assert_array_equal(lse[0, :2, 4], sinks[0, :2])


@pytest.mark.parametrize("storage", ["float16", "bfloat16", "int8"])
@pytest.mark.parametrize("shape", [(1, 700), (24, 90)])
def test_storage_types_with_sinks(rng, storage, shape):
    q, k, v, sinks = _problem(rng, *shape, np.float32)
    kw = {}
    if storage == "int8":
        k = rng.integers(-100, 100, k.shape).astype(np.int8)
        v = rng.integers(-100, 100, v.shape).astype(np.int8)
        kw = dict(k_scale=np.float32(0.01), v_scale=rng.random((2, 2, 1, 16)).astype(np.float32) * 0.02)
    elif storage == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        k, v = k.astype(ml_dtypes.bfloat16), v.astype(ml_dtypes.bfloat16)
    else:
        k, v = k.astype(np.float16), v.astype(np.float16)
    out, lse = fastattn.attention(q, k, v, sinks=sinks, return_lse=True, **kw)
    rout, rlse = R.attention(q, k, v, sinks=sinks, return_lse=True, **kw)
    assert_close(out, rout, dtype=np.float32)
    assert_close(lse, rlse, dtype=np.float32)


def test_half_precision_output_and_out_argument(rng):
    q, k, v, sinks = _problem(rng, 9, 40, np.float16)
    res = np.full((2, 4, 9, 16), np.nan, np.float16)
    got = fastattn.attention(q, k, v, sinks=sinks.astype(np.float32), causal=True, out=res)
    assert got is res
    assert_close(res, R.attention(q, k, v, sinks=sinks, causal=True), dtype=np.float16)


def test_grouped_heads_take_one_sink_per_query_head(rng):
    q, k, v, _ = _problem(rng, 3, 40, np.float64, hq=8, hkv=2)
    sinks = np.linspace(-3, 3, 8)
    out = fastattn.attention(q, k, v, sinks=sinks)
    ref = R.attention(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1), sinks=sinks)
    assert_close(out, ref)
    # sinks of shape (Hkv,) do not broadcast to the query heads
    with pytest.raises(ValueError, match="sinks"):
        fastattn.attention(q, k, v, sinks=sinks[:2])


def test_extreme_sinks(rng):
    q, k, v, _ = _problem(rng, 20, 300, np.float32)
    big = np.full(4, 500.0)
    out, lse = fastattn.attention(q, k, v, sinks=big, return_lse=True)
    assert np.all(np.isfinite(out)) and np.abs(out).max() < 1e-30
    np.testing.assert_allclose(lse, 500.0, rtol=1e-6)
    tiny = np.full(4, -500.0)
    out2, lse2 = fastattn.attention(q, k, v, sinks=tiny, return_lse=True)
    o0, l0 = fastattn.attention(q, k, v, return_lse=True)
    np.testing.assert_allclose(out2, o0, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lse2, l0, rtol=1e-6)
    # -inf sinks: no sink at all (a row without keys keeps lse -inf)
    out3, lse3 = fastattn.attention(q, k, v, sinks=np.full(4, -np.inf), kv_lengths=np.array([[0], [300]]),
                                    return_lse=True)
    assert np.all(out3[0] == 0) and np.all(lse3[0] == -np.inf)
    np.testing.assert_allclose(out3[1], o0[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("lk", [37, 5000])
def test_thread_count_determinism(rng, lk):
    q, k, v, sinks = _problem(rng, 1 if lk > 1000 else 70, lk, np.float32)
    results = [fastattn.attention(q, k, v, sinks=sinks, return_lse=True, num_threads=n) for n in (1, 2, 3)]
    for out, lse in results[1:]:
        np.testing.assert_array_equal(out, results[0][0])
        np.testing.assert_array_equal(lse, results[0][1])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_varlen_with_sinks(rng, dtype):
    hq, hkv, d = 4, 2, 16
    cu_q = np.array([0, 1, 1, 40, 41, 45])
    cu_k = np.array([0, 3000, 3000, 3100, 3101, 3101])        # a long decode (split), an empty key set
    q = rng.standard_normal((hq, 45, d)).astype(dtype)
    k = rng.standard_normal((hkv, 3101, d)).astype(dtype)
    v = rng.standard_normal((hkv, 3101, d)).astype(dtype)
    sinks = rng.standard_normal(hq) * 2
    for causal in (False, "bottom_right"):
        out, lse = fastattn.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, sinks=sinks, return_lse=True)
        rout, rlse = R.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, sinks=sinks, return_lse=True)
        assert_close(out, rout)
        assert_close(lse, rlse)
    np.testing.assert_array_equal(lse[:, 41:], np.repeat(sinks[:, None], 4, axis=1).astype(dtype))


@pytest.mark.parametrize("block_size", [1, 7, 16])
@pytest.mark.parametrize("packed", [False, True])
def test_paged_with_sinks(rng, block_size, packed):
    hq, hkv, d = 4, 2, 16
    lens = np.array([2000, 23, 5])
    nblk = sum(-(-n // block_size) for n in lens) + 3
    kc = rng.standard_normal((nblk, hkv, block_size, d)).astype(np.float32)
    vc = rng.standard_normal((nblk, hkv, block_size, d)).astype(np.float32)
    perm = rng.permutation(nblk)
    mb = -(-lens.max() // block_size)
    table = np.zeros((3, mb), np.int64)
    pos = 0
    for s, n in enumerate(lens):
        used = -(-n // block_size)
        table[s, :used] = perm[pos:pos + used]
        pos += used
    sinks = (rng.standard_normal(hq) * 2).astype(np.float32)
    if packed:
        cu = np.array([0, 1, 6, 9])
        q = rng.standard_normal((hq, 9, d)).astype(np.float32)
        kw = dict(cu_seqlens_q=cu, causal="bottom_right")
    else:
        q = rng.standard_normal((3, hq, 1, d)).astype(np.float32)
        kw = {}
    out, lse = fastattn.attention_paged(q, kc, vc, table, lens, sinks=sinks, return_lse=True, **kw)
    rout, rlse = R.attention_paged(q, kc, vc, table, lens, sinks=sinks, return_lse=True, **kw)
    assert_close(out, rout)
    assert_close(lse, rlse)


def test_dask_key_chunks_apply_the_sink_once(rng):
    da = pytest.importorskip("dask.array")
    import fastattn.dask
    q, k, v, sinks = _problem(rng, 12, 40, np.float64)
    lazy = fastattn.dask.attention(da.from_array(q, chunks=(1, 2, 5, 16)), da.from_array(k, chunks=(1, 1, 7, 16)),
                                   da.from_array(v, chunks=(1, 1, 7, 16)), sinks=sinks, causal=True,
                                   return_weights=True, return_lse=True)
    out, w, lse = (x.compute() for x in lazy)
    rout, rw, rlse = R.attention(q, k, v, sinks=sinks, causal=True, return_weights=True, return_lse=True)
    assert_close(out, rout)
    assert_close(w, rw)
    assert_close(lse, rlse)
    # through fastattn.attention (dask arrays dispatch to fastattn.dask), lazy sinks too
    lazy2 = fastattn.attention(da.from_array(q), da.from_array(k, chunks=(2, 2, 9, 16)), da.from_array(v),
                               sinks=da.from_array(sinks, chunks=(1, 2)))
    assert_close(lazy2.compute(), R.attention(q, k, v, sinks=sinks))


def test_merge_attention_with_sinks(rng):
    q, k, v, sinks = _problem(rng, 6, 60, np.float32)
    cuts = [(0, 7), (7, 8), (8, 60)]
    parts = [fastattn.attention(q, k[..., a:b, :], v[..., a:b, :], return_lse=True) for a, b in cuts]
    out, lse = fastattn.merge_attention([p[0] for p in parts], [p[1] for p in parts], sinks=sinks)
    full, full_lse = fastattn.attention(q, k, v, sinks=sinks, return_lse=True)
    assert_close(out, full)
    assert_close(lse, full_lse)
    ref_out, ref_lse = R.merge_attention([p[0] for p in parts], [p[1] for p in parts], sinks=sinks)
    assert_close(out, ref_out, dtype=np.float32)
    # parts that saw nothing: the merged row is the sink alone
    empty = np.zeros_like(parts[0][0]), np.full_like(parts[0][1], -np.inf)
    out0, lse0 = fastattn.merge_attention([empty[0]], [empty[1]], sinks=sinks)
    assert np.all(out0 == 0)
    np.testing.assert_array_equal(lse0, np.broadcast_to(sinks[..., None], lse0.shape))
    with pytest.raises(ValueError, match="sinks"):
        fastattn.merge_attention([p[0] for p in parts], [p[1] for p in parts], sinks=np.zeros(3))


@pytest.mark.parametrize("sink_shape", [(4,), (2, 4), (2, 1)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dsinks_match_torch_autograd(rng, sink_shape, dtype):
    torch = torch_or_skip()
    q, k, v, _ = _problem(rng, 7, 300, dtype)
    sinks = rng.standard_normal(sink_shape).astype(dtype)
    bias = rng.standard_normal((7, 300)).astype(dtype)
    go = rng.standard_normal((2, 4, 7, 16)).astype(dtype)
    out, lse = fastattn.attention(q, k, v, sinks=sinks, bias=bias, causal="bottom_right", return_lse=True)
    dq, dk, dv, db, ds = fastattn.attention_backward(go, q, k, v, out, lse, sinks=sinks, bias=bias,
                                                     causal="bottom_right", return_dbias=True, return_dsinks=True)
    assert ds.shape == sinks.shape and ds.dtype == dtype
    t = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True)
         for n, a in dict(q=q, k=k, v=v, s=sinks, b=bias).items()}
    kk, vv = t["k"].repeat_interleave(2, 1), t["v"].repeat_interleave(2, 1)
    sc = t["q"] @ kk.transpose(-1, -2) / 4 + t["b"]
    vis = torch.ones(7, 300, dtype=torch.bool).tril(300 - 7)
    sc = sc.masked_fill(~vis, -torch.inf)
    col = torch.broadcast_to(t["s"], (2, 4))[..., None, None].expand(2, 4, 7, 1)
    p = torch.softmax(torch.cat([sc, col], -1), -1)[..., :-1]
    ((p @ vv) * torch.tensor(go, dtype=torch.float64)).sum().backward()
    for mine, name in ((dq, "q"), (dk, "k"), (dv, "v"), (db, "b"), (ds, "s")):
        assert_close(mine, t[name].grad.numpy(), tol=1e-10 if dtype == np.float64 else 2e-5, what=name)
    # return_dsinks alone; and the reference agrees
    g = fastattn.attention_backward(go, q, k, v, out, lse, sinks=sinks, bias=bias, causal="bottom_right",
                                    return_dsinks=True)
    assert len(g) == 4
    np.testing.assert_array_equal(g[3], ds)


def test_torch_integration_gives_sinks_grad(rng):
    torch = torch_or_skip()
    from fastattn.integrations.torch import attention
    q, k, v, _ = _problem(rng, 5, 20, np.float64)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ts = torch.tensor(rng.standard_normal(4), requires_grad=True)
    attention(tq, tk, tv, sinks=ts, causal=True).square().sum().backward()
    s2 = ts.detach().clone().requires_grad_()
    kk, vv = tk.detach().repeat_interleave(2, 1), tv.detach().repeat_interleave(2, 1)
    sc = (tq.detach() @ kk.transpose(-1, -2) / 4).masked_fill(~torch.ones(5, 20, dtype=torch.bool).tril(), -torch.inf)
    p = torch.softmax(torch.cat([sc, s2[None, :, None, None].expand(2, 4, 5, 1)], -1), -1)[..., :-1]
    (p @ vv).square().sum().backward()
    torch.testing.assert_close(ts.grad, s2.grad)


def test_errors_before_any_work(rng):
    q, k, v, sinks = _problem(rng, 4, 9, np.float32)
    res = np.full((2, 4, 4, 16), 7.0, np.float32)
    snaps = snapshot(q, k, v, sinks)
    for bad, err in ((np.zeros(3), ValueError), (np.zeros((3, 4)), ValueError), (np.zeros(4, bool), TypeError),
                     (np.zeros(4, complex), TypeError), ("x", TypeError)):
        with pytest.raises(err, match="sinks"):
            fastattn.attention(q, k, v, sinks=bad, out=res)
        assert np.all(res == 7.0)
    with pytest.raises(ValueError, match="sinks"):
        fastattn.attention_varlen(q[0], k[0], v[0], [0, 4], [0, 9], sinks=np.zeros(3))
    with pytest.raises(ValueError, match="sinks"):
        fastattn.attention_paged(q[:1, :, :1], k[:1, :, :8].reshape(2, 2, 4, 16), v[:1, :, :8].reshape(2, 2, 4, 16),
                                 [[0, 1]], [8], sinks=np.zeros(5))
    out, lse = fastattn.attention(q, k, v, sinks=sinks, return_lse=True)
    with pytest.raises(ValueError, match="sinks"):
        fastattn.attention_backward(out, q, k, v, out, lse, return_dsinks=True)
    with pytest.raises(TypeError, match="return_dsinks"):
        fastattn.attention_backward(out, q, k, v, out, lse, sinks=sinks, return_dsinks="yes")
    with pytest.raises(TypeError, match="sinks"):
        fastattn.attention(q, k, v, sinks=np.ma.masked_array(sinks))
    assert_unchanged((q, k, v, sinks), snaps)


def test_sdpa_refuses_masked_attn_mask(rng):
    q = rng.standard_normal((2, 3, 4))
    m = np.ma.masked_array(np.ones((3, 3), bool), mask=np.eye(3, dtype=bool))
    with pytest.raises(TypeError, match="attn_mask"):
        fastattn.scaled_dot_product_attention(q, q, q, attn_mask=m)


def test_backward_zero_d_sinks_and_bias(rng):
    """A 0-d sinks (one sink for every head) or bias: the gradient is 0-d too,
    the sum over everything it was broadcast to."""
    q, k, v = (rng.standard_normal((2, 4, 5, 32)).astype(np.float32) for _ in range(3))
    g = rng.standard_normal((2, 4, 5, 32)).astype(np.float32)
    s = np.float32(0.5)
    out, lse = fastattn.attention(q, k, v, sinks=s, return_lse=True)
    got = fastattn.attention_backward(g, q, k, v, out, lse, sinks=s, return_dsinks=True)[3]
    want = R.attention_backward(g, q, k, v, out, lse, sinks=s, return_dsinks=True)[3]
    assert np.shape(got) == () and abs(float(got) - float(want)) <= 1e-4 * max(1.0, abs(float(want)))
    b = np.float32(0.1)
    out, lse = fastattn.attention(q, k, v, bias=b, return_lse=True)
    got = fastattn.attention_backward(g, q, k, v, out, lse, bias=b, return_dbias=True)[3]
    want = R.attention_backward(g, q, k, v, out, lse, bias=b, return_dbias=True)[3]
    assert np.shape(got) == () and abs(float(got) - float(want)) <= 1e-4 * max(1.0, abs(float(want)))


def test_masked_arrays_refused_everywhere(rng):
    """A numpy.ma array's mask would be ignored: every array argument refuses
    one, naming it (not only q, k, v, mask, bias and sinks)."""
    from fastattn._quantized import QuantizedKV
    q, k, v = (rng.standard_normal((1, 2, 3, 8)).astype(np.float32) for _ in range(3))
    m = np.ma.masked_array
    out, lse = fastattn.attention(q, k, v, return_lse=True)
    cases = [
        ("alibi_slopes", lambda: fastattn.attention(q, k, v, alibi_slopes=m(np.ones(2, np.float32)))),
        ("k_scale", lambda: fastattn.attention(q, (k * 10).astype(np.int8), v, k_scale=m(np.float32(0.1)))),
        ("kv_lengths", lambda: fastattn.attention(q, k, v, kv_lengths=m(np.array([2])))),
        ("sinks", lambda: fastattn.merge_attention([out], [lse], sinks=m(np.zeros(2, np.float32)))),
        ("lses", lambda: fastattn.merge_attention([out], [m(lse)])),
        ("x", lambda: fastattn.quantize_kv(m(k, mask=k > 1))),
        ("data", lambda: QuantizedKV(m(np.zeros((2, 8), np.uint8)), np.ones((2, 1), np.float32),
                                     np.zeros((2, 1), np.float32))),
    ]
    for name, call in cases:
        with pytest.raises(TypeError, match=f"{name}: masked arrays"):
            call()


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_ml_dtypes_sinks_everywhere(rng, name):
    """bfloat16 / float8 sinks: taken by the kernels, the reference and
    merge_attention alike, with the same values."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (rng.standard_normal((1, 2, 3, 8)).astype(np.float32) for _ in range(3))
    s = np.array([0.5, -1.25], np.float32).astype(getattr(ml_dtypes, name))
    out, lse = fastattn.attention(q, k, v, sinks=s, return_lse=True)
    want, wlse = R.attention(q, k, v, sinks=s, return_lse=True)
    assert_close(out, want)
    assert_close(lse, wlse)
    o0, l0 = fastattn.attention(q, k, v, return_lse=True)
    mo, ml = fastattn.merge_attention([o0], [l0], sinks=s)
    assert_close(mo, want)
    assert_close(ml, wlse)


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("hkv", [8, 2])
@pytest.mark.parametrize("lq", [1, 3])
def test_paged_sinks_per_sequence(rng, block_size, hkv, lq):
    """A 4-D q's query batch dims are (S, Hq): sinks of shape (S, Hq) give each
    sequence its own (a long sequence split over its keys, paged heads in
    lockstep, quantized caches included); (1, Hq) broadcasts; a shape that does
    not broadcast is refused naming sinks before any work."""
    from fastattn._quantized import quantize_kv
    hq, d = 8, 32
    lens = np.array([3000, 23, 5, 40])
    S = lens.size
    nblk = sum(-(-n // block_size) for n in lens)
    kc = rng.standard_normal((nblk, hkv, block_size, d)).astype(np.float32)
    vc = rng.standard_normal((nblk, hkv, block_size, d)).astype(np.float32)
    perm = rng.permutation(nblk)
    table = np.zeros((S, -(-lens.max() // block_size)), np.int64)
    pos = 0
    for s, n in enumerate(lens):
        used = -(-n // block_size)
        table[s, :used] = perm[pos:pos + used]
        pos += used
    q = rng.standard_normal((S, hq, lq, d)).astype(np.float32)
    sinks = (rng.standard_normal((S, hq)) * 3).astype(np.float32)
    for caches in ((kc, vc), (quantize_kv(kc, bits=8), quantize_kv(vc, bits=4, group_size=16))):
        for s_arg in (sinks, sinks[:1], sinks[0]):
            out, lse = fastattn.attention_paged(q, *caches, table, lens, sinks=s_arg, causal="bottom_right",
                                                return_lse=True)
            rout, rlse = R.attention_paged(q, *caches, table, lens, sinks=s_arg, causal="bottom_right",
                                           return_lse=True)
            assert_close(out, rout)
            assert_close(lse, rlse)
        # each sequence's rows are those of its own call with its row of sinks
        out = fastattn.attention_paged(q, *caches, table, lens, sinks=sinks, causal="bottom_right")
        for s in (0, 2):
            one = fastattn.attention_paged(q[s:s + 1], *caches, table[s:s + 1], lens[s:s + 1], sinks=sinks[s],
                                           causal="bottom_right")
            np.testing.assert_allclose(out[s], one[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="sinks"):
        fastattn.attention_paged(q, kc, vc, table, lens, sinks=np.zeros((S + 1, hq), np.float32))
    with pytest.raises(ValueError, match="sinks"):
        R.attention_paged(q, kc, vc, table, lens, sinks=np.zeros((S + 1, hq), np.float32))
