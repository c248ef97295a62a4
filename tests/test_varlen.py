"""Packed variable-length batches (attention_varlen) and paged KV caches (attention_paged).

Against the float64 references (reference.attention per sequence, on the
gathered blocks) on random sequence lengths -- 0, 1, odd, long -- with every
option, grouped heads, flash-attn's (total, H, D) and (num_blocks, block_size,
H, D) layouts as transposed views, block sizes 1, 7, 16, 64, shuffled block
tables whose unused entries and cache slots hold garbage (NaN); against
fastattn.attention on each sequence alone (bit for bit where neither splits
its keys) and on the gathered cache; float16 / bfloat16 / int8 caches; each
error, raised before any array is touched; the same bits for any thread count.
"""
import sys

import numpy as np
import pytest

import fastattn
from fastattn import reference as R

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
TOL = {F32: 2e-5, F64: 1e-12}


def rel_rms(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    if want.size == 0:
        return 0.0
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)), "inf / NaN in different places"
    if not fin.any():
        return 0.0
    den = max(float(np.mean(want[fin] ** 2)), 1e-30)
    return float(np.sqrt(np.mean((got[fin] - want[fin]) ** 2) / den))


def assert_close(got, want, tol):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert rel_rms(g, w) <= tol


def cu_of(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def packed(rng, nq, nk, hq, hkv, d, dv, dtype=np.float32):
    """q (Hq, total_q, D), k (Hkv, total_k, D), v (Hkv, total_k, Dv) and the cu_seqlens."""
    q = rng.standard_normal((hq, int(np.sum(nq)), d)).astype(dtype)
    k = rng.standard_normal((hkv, int(np.sum(nk)), d)).astype(dtype)
    v = rng.standard_normal((hkv, int(np.sum(nk)), dv)).astype(dtype)
    return q, k, v, cu_of(nq), cu_of(nk)


def paged_cache(rng, lens, bs, hkv, d, dv, dtype=np.float64, spare=3):
    """Caches (num_blocks, Hkv, bs, D) holding each sequence's keys in shuffled
    blocks, NaN in every slot no sequence uses (and in spare blocks), and a block
    table whose unused entries are out of range."""
    lens = np.asarray(lens)
    need = -(-lens // bs)
    max_blocks = int(need.max(initial=0)) + 1
    nb = int(need.sum()) + spare
    kc = np.full((nb, hkv, bs, d), np.nan)
    vc = np.full((nb, hkv, bs, dv), np.nan)
    table = rng.integers(nb, 10 * nb + 5, size=(len(lens), max_blocks))      # garbage
    order = rng.permutation(nb)
    used = 0
    for s, n in enumerate(lens):
        blocks = order[used:used + need[s]]
        used += need[s]
        table[s, :need[s]] = blocks
        keys = rng.standard_normal((hkv, need[s] * bs, d))
        vals = rng.standard_normal((hkv, need[s] * bs, dv))
        keys[:, n:] = np.nan
        vals[:, n:] = np.nan
        kc[blocks] = keys.reshape(hkv, need[s], bs, d).transpose(1, 0, 2, 3)
        vc[blocks] = vals.reshape(hkv, need[s], bs, dv).transpose(1, 0, 2, 3)
    return kc.astype(dtype), vc.astype(dtype), table


def gathered(cache, table, lens, s):
    """Sequence s's keys (or values) gathered from its blocks: (Hkv, seq_len, D)."""
    bs = cache.shape[2]
    blocks = table[s, :-(-lens[s] // bs)]
    g = cache[blocks].transpose(1, 0, 2, 3).reshape(cache.shape[1], -1, cache.shape[3])
    return g[:, :lens[s]]


OPTIONS = [
    {},
    {"causal": True},
    {"causal": "bottom_right"},
    {"causal": "bottom_right", "window": (13, 0)},
    {"window": (5, 9), "softcap": 2.5},
    {"alibi_slopes": "slopes", "causal": "bottom_right", "scale": 0.3},
    {"return_lse": True, "causal": "bottom_right", "softcap": 4.0},
]


def options(opts, rng, hq):
    kw = dict(opts)
    if kw.get("alibi_slopes") == "slopes":
        kw["alibi_slopes"] = rng.uniform(0.01, 0.5, size=hq)
    return kw


# --------------------------------------------------------------------------- attention_varlen

@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("g", [1, 4], ids=["mha", "gqa4"])
@pytest.mark.parametrize("opts", OPTIONS)
def test_varlen_against_the_reference(opts, g, dtype, rng):
    """Sequences of 0, 1, odd and long lengths (both paths: the row-major units and
    the query-vectorised ones, several blocks of rows), queries and keys of
    different counts, a sequence without keys and one without queries."""
    nq = np.array([5, 1, 0, 17, 150, 3, 64])
    nk = np.array([9, 1, 4, 17, 300, 0, 200])
    q, k, v, cq, ck = packed(rng, nq, nk, 2 * g, 2, 24, 40, dtype)
    kw = options(opts, rng, 2 * g)
    got = fastattn.attention_varlen(q, k, v, cq, ck, **kw)
    want = R.attention_varlen(q, k, v, cq, ck, **kw)
    assert_close(got, want, TOL[dtype])
    out = got[0] if isinstance(got, tuple) else got
    assert out.dtype == dtype and out.shape == (2 * g, nq.sum(), 40)
    assert not out[:, cq[5]:cq[6]].any()                # the sequence without keys: zeros
    if kw.get("return_lse"):
        assert np.all(got[1][:, cq[5]:cq[6]] == -np.inf)


def test_varlen_self_attention_and_the_loop_of_attention(rng):
    """cu_seqlens_k=None is self-attention; each sequence's rows are those of
    fastattn.attention on that sequence alone, bit for bit (the same units; no
    sequence is long enough to split its keys)."""
    lens = np.array([7, 0, 1, 130, 33, 256, 2])
    q, k, v, cu, _ = packed(rng, lens, lens, 8, 2, 32, 32)
    for kw in ({"causal": True}, {"causal": "bottom_right", "window": 20, "return_lse": True}):
        got = fastattn.attention_varlen(q, k, v, cu, **kw)
        outs = got if isinstance(got, tuple) else (got,)
        for s in range(len(lens)):
            a, b = cu[s], cu[s + 1]
            if a == b:
                continue
            want = fastattn.attention(q[:, a:b], k[:, a:b], v[:, a:b], **kw)
            want = want if isinstance(want, tuple) else (want,)
            for o, w in zip(outs, want):
                np.testing.assert_array_equal(o[:, a:b], w)


def test_varlen_long_sequences_split_over_their_keys(rng):
    """Decode-like sequences (few queries, thousands of keys) beside short ones:
    units costing more than 1/32 of the call are split over their keys and
    merged (here: the row-major units of the 5000- and 2600-key sequences; with
    the 70-query sequence, its two query-vectorised units); the same as the
    reference, and the same bits for 1, 2 and 3 threads."""
    for nq, nk in (([1, 3, 2, 0], [5000, 4, 2600, 9]), ([1, 3, 2, 70, 0], [5000, 4, 2600, 3000, 9])):
        q, k, v, cq, ck = packed(rng, np.array(nq), np.array(nk), 4, 2, 64, 64)
        for kw in ({}, {"causal": "bottom_right", "return_lse": True},
                   {"window": (1500, 0), "causal": "bottom_right"}):
            runs = [fastattn.attention_varlen(q, k, v, cq, ck, num_threads=t, **kw) for t in (1, 2, 3)]
            assert_close(runs[0], R.attention_varlen(q, k, v, cq, ck, **kw), 2e-5)
            for r in runs[1:]:
                for a, b in zip(r if isinstance(r, tuple) else (r,),
                                runs[0] if isinstance(r, tuple) else (runs[0],)):
                    np.testing.assert_array_equal(a, b)


def test_varlen_flash_attn_layout_and_out(rng):
    """(total, H, D) arrays as transposed views, an out= view of a (total, H, Dv)
    array: nothing copied, the same result as contiguous arrays."""
    lens_q, lens_k = np.array([3, 40, 1, 19]), np.array([10, 40, 77, 19])
    q, k, v, cq, ck = packed(rng, lens_q, lens_k, 6, 3, 32, 16)
    qt, kt, vt = (np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (q, k, v))
    buf = np.full((lens_q.sum(), 6, 16), 7.0, np.float32)
    res = fastattn.attention_varlen(qt.transpose(1, 0, 2), kt.transpose(1, 0, 2), vt.transpose(1, 0, 2), cq, ck,
                                    causal="bottom_right", out=buf.transpose(1, 0, 2))
    assert res.base is buf or np.shares_memory(res, buf)
    want = fastattn.attention_varlen(q, k, v, cq, ck, causal="bottom_right")
    np.testing.assert_array_equal(buf.transpose(1, 0, 2), want)
    assert_close(want, R.attention_varlen(q, k, v, cq, ck, causal="bottom_right"), 2e-5)


def test_varlen_storage_types(rng):
    """float16 / bfloat16 k, v (and q) and int8 k, v read in place; results within
    float32 rounding of the reference on the stored values."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    nq, nk = np.array([2, 30, 1]), np.array([50, 30, 300])
    q, k, v, cq, ck = packed(rng, nq, nk, 4, 2, 64, 64)
    for dt in (np.float16, ml_dtypes.bfloat16):
        kh, vh = k.astype(dt), v.astype(dt)
        want = R.attention_varlen(q, kh, vh, cq, ck, causal="bottom_right")
        got = fastattn.attention_varlen(q, kh, vh, cq, ck, causal="bottom_right")
        assert got.dtype == np.float32 and rel_rms(got, want) <= 1e-5
        got = fastattn.attention_varlen(q.astype(dt), kh, vh, cq, ck, causal="bottom_right")
        assert got.dtype == np.dtype(dt)
        assert rel_rms(got, R.attention_varlen(q.astype(dt), kh, vh, cq, ck, causal="bottom_right")) <= 1e-2
    k8, v8 = (rng.integers(-100, 100, x.shape).astype(np.int8) for x in (k, v))
    got = fastattn.attention_varlen(q / 50, k8, v8, cq, ck)
    assert rel_rms(got, R.attention_varlen(q / 50, k8, v8, cq, ck)) <= 1e-5


def test_empty_and_degenerate_batches(rng):
    """No sequences, sequences without queries, head dims 0, no heads, an empty
    cache, negative strides, integer tables of other widths."""
    z = np.zeros
    cases = [
        (fastattn.attention_varlen, R.attention_varlen, (z((4, 0, 8)), z((2, 0, 8)), z((2, 0, 5)), [0]), {}),
        (fastattn.attention_varlen, R.attention_varlen, (z((4, 0, 8)), np.ones((2, 3, 8)), np.ones((2, 3, 5)),
                                                         [0, 0, 0], [0, 1, 3]), {}),
        (fastattn.attention_varlen, R.attention_varlen, (rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 7, 8)),
                                                         z((2, 7, 0)), [0, 2, 5], [0, 3, 7]), {}),
        (fastattn.attention_varlen, R.attention_varlen, (z((2, 5, 0)), z((2, 7, 0)), rng.standard_normal((2, 7, 3)),
                                                         np.array([0, 2, 5], np.uint32), np.array([0, 3, 7], np.int16)),
         {}),
        (fastattn.attention_varlen, R.attention_varlen, (z((0, 5, 4)), z((0, 7, 4)), z((0, 7, 3)), [0, 5], [0, 7]), {}),
        (fastattn.attention_paged, R.attention_paged, (z((0, 4, 1, 8)), np.ones((3, 2, 4, 8)), np.ones((3, 2, 4, 8)),
                                                       z((0, 2), int), z(0, int)), {}),
        (fastattn.attention_paged, R.attention_paged, (z((2, 4, 0, 8)), np.ones((3, 2, 4, 8)), np.ones((3, 2, 4, 8)),
                                                       np.full((2, 2), -7), np.array([0, 0])), {}),
        (fastattn.attention_paged, R.attention_paged, (z((4, 0, 8), np.float32), z((0, 2, 4, 8), np.int8),
                                                       z((0, 2, 4, 8), np.int8), z((2, 1), np.int32), [0, 0]),
         dict(cu_seqlens_q=[0, 0, 0], k_scale=np.float32(1), v_scale=np.ones((2, 1, 8), np.float32))),
    ]
    kc, vc = rng.standard_normal((2, 6, 2, 4, 8))
    q = rng.standard_normal((2, 4, 2, 8))
    cases.append((fastattn.attention_paged, R.attention_paged,
                  (q, kc[::-1, ::-1, ::-1], vc[::-1], np.array([[0, 1, 2], [5, 4, 3]], np.int32), [9, 12]),
                  dict(causal="bottom_right")))
    q, k, v = (rng.standard_normal((2, 9, 8)) for _ in range(3))
    cases.append((fastattn.attention_varlen, R.attention_varlen, (q[::-1, ::-2], k[::-1, ::-2], v[:, ::-2], [0, 2, 5]),
                  dict(causal=True)))
    for fa, ref, args, kw in cases:
        got = fa(*args, return_lse=True, **kw)
        want = ref(*args, return_lse=True, **kw)
        assert_close(got, want, 2e-5)


def test_varlen_errors_name_the_argument_and_touch_nothing(rng):
    q, k, v, cq, ck = packed(rng, [3, 2], [4, 5], 4, 2, 8, 8)
    out = np.full((4, 5, 8), 3.0, np.float32)
    cases = [
        (ValueError, "cu_seqlens_q", dict(cu_seqlens_q=[1, 3, 5])),           # not starting at 0
        (ValueError, "cu_seqlens_q", dict(cu_seqlens_q=[0, 4, 3, 5])),        # decreasing
        (ValueError, "cu_seqlens_q", dict(cu_seqlens_q=[0, 3, 4])),           # not ending at total_q
        (ValueError, "cu_seqlens_k", dict(cu_seqlens_k=[0, 4, 8])),
        (ValueError, "cu_seqlens_q", dict(cu_seqlens_q=[[0, 3, 5]])),         # not 1-D
        (ValueError, "cu_seqlens_q", dict(cu_seqlens_q=np.zeros(0, int))),
        (ValueError, "cu_seqlens", dict(cu_seqlens_k=[0, 9])),                # different sequence counts
        (TypeError, "cu_seqlens_q", dict(cu_seqlens_q=[0.0, 3.0, 5.0])),
        (TypeError, "cu_seqlens_k", dict(cu_seqlens_k=np.array([0, 4, 9], dtype=bool))),
        (ValueError, "cu_seqlens_k", dict(cu_seqlens_k=None)),                 # self-attention, 9 keys
        (ValueError, "q", dict(q=q[0])),                                        # not 3-D
        (ValueError, "k", dict(k=k[None])),
        (ValueError, "Dk", dict(k=k[..., :4], v=v)),
        (ValueError, "k and v", dict(v=v[:, :8])),
        (ValueError, "multiple", dict(q=q[:3])),                               # 3 query heads, 2 kv heads
        (ValueError, "same number of heads", dict(v=np.concatenate([v, v]))),
        (TypeError, "q", dict(q=q.astype(complex))),
        (TypeError, "causal", dict(causal=1.5)),
        (ValueError, "window", dict(window=-1)),
        (ValueError, "softcap", dict(softcap=0.0)),
        (ValueError, "scale", dict(scale=np.inf)),
        (ValueError, "alibi_slopes", dict(alibi_slopes=np.ones(3))),
        (ValueError, "out", dict(out=np.zeros((4, 5, 7), np.float32))),
        (TypeError, "out", dict(out=np.zeros((4, 5, 8)))),
        (ValueError, "num_threads", dict(num_threads=0)),
        (TypeError, "masked", dict(q=np.ma.masked_array(q))),
    ]
    for exc, name, change in cases:
        args = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck)
        args.update(change)
        kw = {n: args.pop(n) for n in list(args) if n not in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")}
        kw.setdefault("out", out)
        with pytest.raises(exc, match=name):
            fastattn.attention_varlen(args["q"], args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_k"],
                                      **kw)
        assert np.all(out == 3.0), f"out was written before the error on {name}"
        if name not in ("out", "num_threads", "masked"):
            kw.pop("out")
            with pytest.raises(exc, match=name):       # the reference raises the same
                R.attention_varlen(args["q"], args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_k"],
                                   **kw)


# --------------------------------------------------------------------------- attention_paged

@pytest.mark.parametrize("bs", [1, 7, 16, 64])
@pytest.mark.parametrize("lq,g", [(1, 4), (3, 1), (20, 2)], ids=["decode-gqa", "draft", "chunk-gqa"])
def test_paged_against_the_reference(bs, lq, g, rng):
    """Decode, draft tokens and chunks of new tokens against shuffled blocks whose
    unused slots hold NaN, every option."""
    lens = np.array([lq, lq + 1, lq + 2 * bs + 5, 333, lq + 40])
    kc, vc, table = paged_cache(rng, lens, bs, 2, 32, 24)
    q = rng.standard_normal((len(lens), 2 * g, lq, 32))
    for dtype in (F32, F64):
        for opts in OPTIONS[2:]:
            kw = options(opts, rng, 2 * g)
            got = fastattn.attention_paged(q.astype(dtype), kc.astype(dtype), vc.astype(dtype), table, lens, **kw)
            want = R.attention_paged(q.astype(dtype), kc.astype(dtype), vc.astype(dtype), table, lens, **kw)
            assert_close(got, want, TOL[dtype])


@pytest.mark.parametrize("bs", [1, 7, 16, 64, 256])
def test_paged_mixed_prefill_and_decode_with_cu_seqlens_q(bs, rng):
    """Packed queries: prefill chunks, decode steps, a sequence without queries (and
    without keys), queries of the query-vectorised path (its tiles copied, read
    in place run by run, or lying in one block)."""
    nq = np.array([1, 0, 37, 1, 130, 0, 5])
    lens = np.array([900, 0, 37, 64, 200, 11, 5])
    kc, vc, table = paged_cache(rng, lens, bs, 2, 32, 32)
    q = rng.standard_normal((4, nq.sum(), 32)).astype(np.float32)
    cu = cu_of(nq)
    for opts in ({"causal": "bottom_right", "return_lse": True}, {"causal": "bottom_right", "window": (50, 0)},
                 {"alibi_slopes": "slopes", "softcap": 3.0}):
        kw = options(opts, rng, 4)
        got = fastattn.attention_paged(q, kc.astype(np.float32), vc.astype(np.float32), table, lens,
                                       cu_seqlens_q=cu, **kw)
        want = R.attention_paged(q, kc, vc, table, lens, cu_seqlens_q=cu, **kw)
        assert_close(got, want, 2e-5)


@pytest.mark.parametrize("bs", [7, 16])
def test_paged_and_half_precision_prefill_units_of_many_rows(bs, rng):
    """Tiles copied into the workspace (small blocks; keys and values of another
    storage type) run units of up to 256 query rows (qvec_unit_rows): sequences of
    one to three such units, partial ones, every option, against the reference,
    and the same bits for 1 and 2 threads."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    lens = np.array([500, 140, 300])
    nq = np.array([100, 70, 1])                        # 400, 280 and 4 rows of 4 query heads per key head
    kc, vc, table = paged_cache(rng, lens, bs, 2, 32, 48)
    q = rng.standard_normal((8, nq.sum(), 32))
    cu = cu_of(nq)
    qp, kp, vp = packed(rng, nq, lens, 8, 2, 32, 48)[:3]
    for opts in OPTIONS[1:]:
        kw = options(opts, rng, 8)
        for dtype in (F32, F64):
            got = [fastattn.attention_paged(q.astype(dtype), kc.astype(dtype), vc.astype(dtype), table, lens,
                                            cu_seqlens_q=cu, num_threads=t, **kw) for t in (1, 2)]
            for a, b in zip(*(r if isinstance(r, tuple) else (r,) for r in got)):
                np.testing.assert_array_equal(a, b)
            assert_close(got[0], R.attention_paged(q, kc, vc, table, lens, cu_seqlens_q=cu, **kw), TOL[dtype])
        kh, vh = kp.astype(ml_dtypes.bfloat16), vp.astype(ml_dtypes.bfloat16)
        got = fastattn.attention_varlen(qp.astype(np.float32), kh, vh, cu, cu_of(lens), **kw)
        assert_close(got, R.attention_varlen(qp.astype(np.float32), kh, vh, cu, cu_of(lens), **kw), 2e-5)


def test_paged_heads_in_lockstep_are_the_separate_heads(rng):
    """Decode reads the key/value heads of a block together (paged_heads.pxi): the
    same bits as one call per head."""
    for g, lq in ((1, 1), (4, 1), (2, 3)):
        lens = np.array([900, 17, 400, 5])
        kc, vc, table = paged_cache(rng, lens, 16, 8, 64, 64, np.float32)
        q = rng.standard_normal((4, 8 * g, lq, 64)).astype(np.float32)
        for kw in ({"causal": "bottom_right"}, {"softcap": 2.0, "window": (100, 0), "causal": "bottom_right"}):
            whole = fastattn.attention_paged(q, kc, vc, table, lens, **kw)
            heads = [fastattn.attention_paged(q[:, h * g:(h + 1) * g], kc[:, h:h + 1], vc[:, h:h + 1], table, lens,
                                              **kw) for h in range(8)]
            np.testing.assert_array_equal(whole, np.concatenate(heads, axis=1))


@pytest.mark.parametrize("bs", [16, 64])
def test_paged_inf_and_nan_in_visible_values(bs, rng):
    """An inf or NaN in a value a row sees reaches that row (and only the rows that
    see it), on every path: heads in lockstep (one row per head: P.V fused with the
    next tile's scores), copied and in-place tiles."""
    for lq, g in ((1, 1), (1, 4), (40, 2)):
        lens = np.array([300, lq + 20])
        kc, vc, table = paged_cache(rng, lens, bs, 2, 32, 32)
        slot = table[0, 250 // bs], 1, 250 % bs
        vc[slot + (3,)] = np.inf
        vc[slot + (5,)] = np.nan
        q = rng.standard_normal((2, 2 * g, lq, 32))
        for dt in (F32, F64):
            got = fastattn.attention_paged(q.astype(dt), kc.astype(dt), vc.astype(dt), table, lens, causal="bottom_right")
            want = R.attention_paged(q, kc, vc, table, lens, causal="bottom_right")
            assert np.isnan(want).any() and np.isfinite(want[1]).all()
            assert rel_rms(got, want) <= TOL[dt]


def test_paged_equals_contiguous_attention_on_the_gathered_cache(rng):
    """The same numbers, to rounding, as attention() on the gathered cache with
    kv_lengths (decode: the row-major units, keys and values read in place; a
    chunk: the query-vectorised units)."""
    for bs, lq, hq in ((16, 1, 8), (16, 4, 4), (7, 40, 4)):
        lens = np.array([1200, 700, 1900, lq + 3])
        kc, vc, table = paged_cache(rng, lens, bs, 2, 64, 64, np.float32)
        q = rng.standard_normal((len(lens), hq, lq, 64)).astype(np.float32)
        L = lens.max()
        kcont = np.zeros((len(lens), 2, L, 64), np.float32)
        vcont = np.zeros((len(lens), 2, L, 64), np.float32)
        for s in range(len(lens)):
            kcont[s, :, :lens[s]] = gathered(kc, table, lens, s)
            vcont[s, :, :lens[s]] = gathered(vc, table, lens, s)
        for kw in ({"causal": "bottom_right"}, {"causal": "bottom_right", "window": (100, 0), "return_lse": True}):
            got = fastattn.attention_paged(q, kc, vc, table, lens, **kw)
            want = fastattn.attention(q, kcont, vcont, kv_lengths=lens[:, None], **kw)
            for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6)


def test_paged_flash_attn_and_vllm_layouts(rng):
    """(num_blocks, block_size, Hkv, D) caches as transpose(0, 2, 1, 3) views, q
    (S, Lq, Hq, D) as a transposed view, out= a view: read and written in place."""
    lens = np.array([50, 17, 130])
    kc, vc, table = paged_cache(rng, lens, 16, 2, 32, 32, np.float32)
    kf, vf = (np.ascontiguousarray(c.transpose(0, 2, 1, 3)) for c in (kc, vc))   # (nb, bs, Hkv, D)
    qf = rng.standard_normal((3, 2, 8, 32)).astype(np.float32)                    # (S, Lq, Hq, D)
    buf = np.zeros((3, 2, 8, 32), np.float32)
    fastattn.attention_paged(qf.transpose(0, 2, 1, 3), kf.transpose(0, 2, 1, 3), vf.transpose(0, 2, 1, 3), table,
                             lens, causal="bottom_right", out=buf.transpose(0, 2, 1, 3))
    want = fastattn.attention_paged(np.ascontiguousarray(qf.transpose(0, 2, 1, 3)), kc, vc, table, lens,
                                    causal="bottom_right")
    np.testing.assert_array_equal(buf.transpose(0, 2, 1, 3), want)
    assert_close(want, R.attention_paged(qf.transpose(0, 2, 1, 3), kc, vc, table, lens, causal="bottom_right"),
                 2e-5)


@pytest.mark.parametrize("lq", [1, 40])
def test_paged_half_and_int8_caches(lq, rng):
    """float16 / bfloat16 caches read in place; int8 caches with per-slot (paged
    like the cache), per-tensor and per-channel scales."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    lens = np.array([lq + 90, 500, lq])
    kc, vc, table = paged_cache(rng, lens, 16, 2, 64, 64)
    q = rng.standard_normal((3, 4, lq, 64)).astype(np.float32)
    for dt in (np.float16, ml_dtypes.bfloat16):
        kh, vh = kc.astype(dt), vc.astype(dt)
        got = fastattn.attention_paged(q, kh, vh, table, lens, causal="bottom_right")
        assert rel_rms(got, R.attention_paged(q, kh, vh, table, lens, causal="bottom_right")) <= 1e-5
    k8 = np.nan_to_num(kc * 30).clip(-127, 127).astype(np.int8)
    v8 = np.nan_to_num(vc * 30).clip(-127, 127).astype(np.int8)
    nb = kc.shape[0]
    scales = [
        (rng.uniform(0.01, 0.05, (nb, 2, 16, 1)).astype(np.float32), rng.uniform(0.01, 0.05, (nb, 2, 16, 1))),
        (np.float32(0.03), np.array(0.02)),
        (rng.uniform(0.01, 0.05, (2, 1, 64)).astype(np.float32), rng.uniform(0.01, 0.05, (1, 2, 1, 64))),
    ]
    for ks, vs in scales:
        got = fastattn.attention_paged(q, k8, v8, table, lens, causal="bottom_right", k_scale=ks, v_scale=vs)
        want = R.attention_paged(q, k8, v8, table, lens, causal="bottom_right", k_scale=ks, v_scale=vs)
        assert got.dtype == np.float32 and rel_rms(got, want) <= 1e-5
        got64 = fastattn.attention_paged(q.astype(np.float64), k8, v8, table, lens, causal="bottom_right",
                                         k_scale=ks, v_scale=vs)
        assert rel_rms(got64, want) <= 1e-12


def test_paged_threads_give_the_same_bits(rng):
    """A decode batch beside one long sequence (split over its keys): identical
    results for 1, 2 and 3 threads."""
    lens = np.array([6000, 300, 2500, 40])
    kc, vc, table = paged_cache(rng, lens, 16, 2, 64, 64, np.float32)
    q = rng.standard_normal((4, 8, 2, 64)).astype(np.float32)
    runs = [fastattn.attention_paged(q, kc, vc, table, lens, causal="bottom_right", return_lse=True,
                                     num_threads=t) for t in (1, 2, 3)]
    for r in runs[1:]:
        np.testing.assert_array_equal(r[0], runs[0][0])
        np.testing.assert_array_equal(r[1], runs[0][1])
    assert_close(runs[0], R.attention_paged(q, kc, vc, table, lens, causal="bottom_right", return_lse=True), 2e-5)


def test_paged_block_tables_and_seq_lens_in_any_layout(rng):
    """A Fortran-ordered block table, a transposed view, a strided seq_lens: the
    same results as the C-ordered tables (the kernels read a row-major copy; a
    Fortran-ordered copy was read row-major and gave other sequences' blocks)."""
    lens = np.array([37, 5, 64, 20])
    kc, vc, table = paged_cache(rng, lens, 8, 2, 16, 16, np.float32)
    q = rng.standard_normal((4, 4, 2, 16)).astype(np.float32)
    want = fastattn.attention_paged(q, kc, vc, table, lens, causal="bottom_right")
    assert_close(want, R.attention_paged(q, kc, vc, table, lens, causal="bottom_right"), 2e-5)
    lens_strided = np.repeat(lens, 2)[::2]
    for tab in (np.asfortranarray(table), np.ascontiguousarray(table.T).T, table.astype(np.int32, order="F")):
        got = fastattn.attention_paged(q, kc, vc, tab, lens_strided, causal="bottom_right")
        np.testing.assert_array_equal(got, want)


def test_paged_caches_are_never_copied(rng):
    """A decode step over a 32 MiB float16 cache allocates nothing of its size."""
    import tracemalloc
    nb, bs = 1024, 16
    kc = rng.standard_normal((nb, 8, bs, 128)).astype(np.float16)
    vc = rng.standard_normal((nb, 8, bs, 128)).astype(np.float16)
    table = rng.permutation(nb).reshape(4, 256)
    lens = np.array([4096, 4000, 100, 3000])
    q = rng.standard_normal((4, 32, 1, 128)).astype(np.float32)
    fastattn.attention_paged(q, kc, vc, table, lens)
    tracemalloc.start()
    try:
        fastattn.attention_paged(q, kc, vc, table, lens)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < kc.nbytes // 16, f"{peak} bytes allocated for a {kc.nbytes}-byte cache"


@pytest.mark.skipif(sys.platform != "linux", reason="minor page faults as getrusage counts them on Linux")
def test_repeated_paged_decodes_keep_their_workspaces(rng):
    """A paged decode runs a workspace per head in lockstep (paged_heads.pxi);
    the thread keeps them between calls (simd.h, fa_arena_take): repeated calls
    fault in no fresh pages.  Kept in one slot, seven of the eight (~170 KiB
    each) were allocated, given back to the system and faulted in again per call
    (7,000 page faults in these 200 calls; now none)."""
    import resource
    lens = np.array([16])
    kc, vc, table = paged_cache(rng, lens, 16, 8, 128, 128, np.float32, spare=0)
    q = rng.standard_normal((1, 32, 1, 128)).astype(np.float32)
    out = np.empty((1, 32, 1, 128), np.float32)
    for _ in range(20):
        fastattn.attention_paged(q, kc, vc, table, lens, out=out, num_threads=1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):
        fastattn.attention_paged(q, kc, vc, table, lens, out=out, num_threads=1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 100, f"{faults} page faults in 200 calls"


def test_paged_errors_name_the_argument_and_touch_nothing(rng):
    lens = np.array([5, 9])
    kc, vc, table = paged_cache(rng, lens, 4, 2, 8, 8, np.float32, spare=0)
    table[:, 3:] = -1                              # unused entries: ignored
    q = rng.standard_normal((2, 4, 2, 8)).astype(np.float32)
    out = np.full((2, 4, 2, 8), 3.0, np.float32)
    fastattn.attention_paged(q, kc, vc, table, lens, out=out)      # valid as it is
    out[...] = 3.0
    bad_table = table.copy()
    bad_table[1, 2] = kc.shape[0]                  # a used entry out of range
    neg_table = table.copy()
    neg_table[0, 1] = -1
    k8 = np.zeros(kc.shape, np.int8)
    cases = [
        (ValueError, "block_table", dict(block_table=bad_table)),
        (ValueError, "block_table", dict(block_table=neg_table)),
        (TypeError, "block_table", dict(block_table=table.astype(float))),
        (ValueError, "block_table", dict(block_table=table[0])),
        (ValueError, "seq_lens", dict(seq_lens=np.array([-1, 9]))),
        (ValueError, "seq_lens", dict(seq_lens=np.array([5, 17]))),              # beyond max_blocks * bs
        (ValueError, "seq_lens", dict(seq_lens=np.array([1, 9]))),               # fewer keys than queries
        (TypeError, "seq_lens", dict(seq_lens=lens.astype(float))),
        (ValueError, "seq_lens", dict(seq_lens=lens[:1])),                       # another sequence count
        (ValueError, "q", dict(q=q[0])),
        (ValueError, "k_cache", dict(k_cache=kc[0])),
        (ValueError, "v_cache", dict(v_cache=vc[:, :, :3])),
        (ValueError, "block_size", dict(k_cache=kc[:, :, :0], v_cache=vc[:, :, :0])),
        (ValueError, "Dk", dict(q=q[..., :4])),
        (ValueError, "multiple", dict(q=q[:, :3])),
        (ValueError, "cu_seqlens_q", dict(q=q[0], cu_seqlens_q=[0, 1, 3])),
        (TypeError, "k_scale", dict(k_scale=np.float32(0.1))),                   # scales of a float cache
        (ValueError, "k_scale", dict(k_cache=k8, v_cache=k8, k_scale=np.ones((kc.shape[0], 2, 1, 8)))),
        (ValueError, "k_scale", dict(k_cache=k8, v_cache=k8, k_scale=np.ones((3, 1, 1)))),
        (TypeError, "causal", dict(causal="yes please".encode())),
        (ValueError, "out", dict(out=np.zeros((2, 4, 2, 9), np.float32))),
        (TypeError, "masked", dict(k_cache=np.ma.masked_array(kc))),
    ]
    names = ("q", "k_cache", "v_cache", "block_table", "seq_lens")
    for exc, name, change in cases:
        args = dict(q=q, k_cache=kc, v_cache=vc, block_table=table, seq_lens=lens)
        args.update(change)
        pos = [args.pop(n) for n in names]
        args.setdefault("out", out)
        with pytest.raises(exc, match=name):
            fastattn.attention_paged(*pos, **args)
        assert np.all(out == 3.0), f"out was written before the error on {name}"
        if name not in ("out", "masked"):
            args.pop("out")
            with pytest.raises(exc, match=name):        # the reference raises the same
                R.attention_paged(*pos, **args)
