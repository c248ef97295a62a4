"""fastattn.dask: attention and softmax on Dask arrays, on a real two-process cluster.

Results are compared with the in-memory functions (float32 to 1e-6 of the largest
magnitude, float64 to 1e-12) for random chunkings of every axis and random options;
graph sizes are compared with a brute-force count of the visible chunk pairs.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import dask  # noqa: E402

import fastattn  # noqa: E402
import fastattn.dask as fdask  # noqa: E402
from fastattn import _chunk_attention as chunk  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as c:
            yield c


# ------------------------------------------------------------------ helpers

def _chunks(rng, n):
    """A random chunking of an axis of length n (1 to 3 chunks)."""
    if n <= 1:
        return (n,)
    parts = int(rng.integers(1, min(n, 3) + 1))
    cuts = np.sort(rng.choice(np.arange(1, n), size=parts - 1, replace=False))
    return tuple(np.diff(np.r_[0, cuts, n]).astype(int).tolist())


def _lazy(rng, x):
    return da.from_array(x, chunks=tuple(_chunks(rng, n) for n in x.shape))


def _check(got, want):
    """Same dtype, shape, infinities and NaNs; finite values within float rounding."""
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {np.float64: 1e-12, np.float32: 1e-6, np.float16: 1e-3}[want.dtype.type]
    inf = np.isinf(want)
    assert np.array_equal(np.isinf(got), inf) and np.array_equal(got[inf], want[inf])
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    fin = ~(inf | nan)
    if fin.any():
        scale = max(1.0, float(np.abs(want[fin].astype(np.float64)).max()))
        err = float(np.abs(got[fin].astype(np.float64) - want[fin]).max())
        assert err <= tol * scale, (err, scale)


def _random_case(rng):
    """(q, k, v, options) of a random problem, NumPy arrays, with grouped heads,
    broadcast batch dims and every option at random."""
    dtype = np.dtype(rng.choice([np.float32, np.float64]))
    B, Hk, g = (int(rng.integers(1, 3)) for _ in range(3))
    Hq = Hk * g
    Lq, Lk = int(rng.integers(1, 24)), int(rng.integers(1, 40))
    Dk, Dv = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    Bk = B if rng.random() < 0.7 else 1
    q = rng.standard_normal((B, Hq, Lq, Dk)).astype(dtype)
    k = rng.standard_normal((Bk, Hk, Lk, Dk)).astype(dtype)
    v = rng.standard_normal((Bk, Hk, Lk, Dv)).astype(dtype)
    kw = {"causal": [False, True, "top_left", "bottom_right"][rng.integers(4)]}
    if rng.random() < 0.5:
        kw["window"] = tuple(None if rng.random() < 0.3 else int(rng.integers(0, 10)) for _ in range(2))
    if rng.random() < 0.5:
        kw["kv_lengths"] = rng.integers(0, Lk + 1, size=(B, 1) if rng.random() < 0.5 else (B, Hq))
    if rng.random() < 0.4:
        kw["alibi_slopes"] = (rng.random(Hq) * 0.5).astype(dtype)
    if rng.random() < 0.3:
        kw["mask"] = rng.random((B if rng.random() < 0.5 else 1, Hq, Lq, Lk)) < 0.8
    if rng.random() < 0.3:
        kw["bias"] = rng.standard_normal((1, Hq if rng.random() < 0.5 else 1, Lq, Lk)).astype(dtype)
    if rng.random() < 0.3:
        kw["softcap"] = 3.0
    if rng.random() < 0.3:
        kw["scale"] = 0.3
    kw["return_weights"] = bool(rng.random() < 0.4)
    return q, k, v, kw


def _partial_tasks(x):
    """The number of (query chunk, key chunk) attention tasks in x's graph."""
    return sum(1 for key in dict(x.__dask_graph__()) if isinstance(key, tuple)
               and key[0].startswith(fdask.PARTIAL_NAME) and isinstance(key[-1], int))


def _visible_set(q_chunks, k_chunks, **kw):
    """Brute force: the chunk pairs with a visible key, from the reference's weights on
    all-zero inputs (every visible key gets weight 1 / count > 0)."""
    Lq, Lk = sum(q_chunks), sum(k_chunks)
    z = np.zeros
    w = fastattn.reference.attention(z((Lq, 1)), z((Lk, 1)), z((Lk, 1)), return_weights=True, **kw)[1]
    qb, kb = np.cumsum((0,) + q_chunks), np.cumsum((0,) + k_chunks)
    return {(a, b) for a in range(len(q_chunks)) for b in range(len(k_chunks))
            if (w[..., qb[a]:qb[a + 1], kb[b]:kb[b + 1]] > 0).any()}


def _visible_pairs(q_chunks, k_chunks, **kw):
    return len(_visible_set(q_chunks, k_chunks, **kw))


# ------------------------------------------------------------------ one chunk pair, NumPy only

def test_pair_attention_equals_rows_and_keys_of_the_whole_call():
    """Every chunk pair of random problems, merged, equals the in-memory call (float64):
    the offsets of causal / window / ALiBi / kv_lengths per pair are exact."""
    rng = np.random.default_rng(27)
    for _ in range(250):
        q, k, v, kw = _random_case(rng)
        q, k, v = (x.astype(np.float64) for x in (q, k, v))
        want = fastattn.attention(q, k, v, return_lse=True, **dict(kw, return_weights=True))
        Lq, Lk = q.shape[-2], k.shape[-2]
        opt = chunk.PairOptions(Lq, Lk, kw.get("scale"), fdask._causal_mode(kw["causal"]),
                                *fdask._window_sides(kw.get("window")), kw.get("softcap"), True, None,
                                np.dtype(np.float64))
        out, lse, w = np.zeros_like(want[0]), np.zeros_like(want[2]), np.zeros_like(want[1])
        qb, kb = np.cumsum((0,) + _chunks(rng, Lq)), np.cumsum((0,) + _chunks(rng, Lk))
        m, b = kw.get("mask"), kw.get("bias")
        for qs, qe in zip(qb[:-1], qb[1:]):
            parts = [(ks, ke, chunk.pair_attention(
                q[..., qs:qe, :], k[..., ks:ke, :], v[..., ks:ke, :],
                None if m is None else m[..., qs:qe, ks:ke], None if b is None else b[..., qs:qe, ks:ke],
                kw.get("kv_lengths"), kw.get("alibi_slopes"), int(qs), int(ks), opt))
                for ks, ke in zip(kb[:-1], kb[1:])]
            out[..., qs:qe, :], lse[..., qs:qe] = fastattn.merge_attention(
                [p[0] for *_, p in parts], [p[1] for *_, p in parts])
            for ks, ke, p in parts:
                w[..., qs:qe, ks:ke] = chunk.rescale_weights(p[2], p[1], lse[..., qs:qe])
        for got, ref in zip((out, w, lse), want):
            _check(got, ref)


# ------------------------------------------------------------------ attention on the cluster

def test_random_chunkings_and_options_equal_in_memory(client):
    rng = np.random.default_rng(2027)
    cases, lazies = [], []
    for _ in range(16):
        q, k, v, kw = _random_case(rng)
        lazy_kw = dict(kw)
        for name in ("mask", "bias", "kv_lengths", "alibi_slopes"):
            if name in kw and rng.random() < 0.5:
                lazy_kw[name] = _lazy(rng, kw[name])
        lazies.append(fdask.attention(_lazy(rng, q), _lazy(rng, k), _lazy(rng, v), return_lse=True,
                                      split_every=int(rng.integers(2, 4)), **lazy_kw))
        cases.append((q, k, v, kw))
    results = client.compute(lazies, sync=True)
    for (q, k, v, kw), got in zip(cases, results):
        want = fastattn.attention(q, k, v, return_lse=True, **kw)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _check(a, b)


def test_shapes_and_dtypes(client):
    """2-D and 3-D inputs, one key/value head for many query heads, NumPy inputs, float16,
    integer inputs, int8 keys and values with scales, kv_start and align, no keys at
    all, and num_threads passed through."""
    rng = np.random.default_rng(5)
    x2 = rng.standard_normal((40, 8))
    k3 = rng.standard_normal((3, 33, 8)).astype(np.float32)
    q4 = rng.standard_normal((2, 6, 17, 8)).astype(np.float32)
    kv1 = rng.standard_normal((2, 1, 33, 8)).astype(np.float32)
    h16 = rng.standard_normal((2, 30, 8)).astype(np.float16)
    ints = rng.integers(-3, 4, size=(2, 12, 4))
    i8 = rng.integers(-127, 128, size=(2, 6, 33, 8)).astype(np.int8)[:, ::3]   # (2, 2, 33, 8)
    i8_scale = rng.uniform(0.001, 0.02, size=(2, 2, 33, 1)).astype(np.float32)
    cases = [
        ((x2, x2, x2), dict(causal=True)),
        ((x2[:5], k3, k3), dict(window=3)),                     # q broadcast over k's heads
        ((q4, kv1, kv1), dict(causal="bottom_right", alibi_slopes=np.linspace(0.1, 0.6, 6))),
        ((h16, h16, h16), dict(causal=True)),
        ((ints, ints, ints), dict()),
        ((q4, kv1[..., :0, :], kv1[..., :0, :]), dict()),       # Lk = 0: zeros, lse -inf
        ((q4, kv1, kv1), dict(num_threads=2)),
        ((q4, i8, i8), dict(k_scale=i8_scale, v_scale=np.float32(0.01), causal=True)),   # int8 caches
        ((q4, kv1, kv1), dict(kv_start=np.array([3, 10]), align="bottom_right", window=(5, 2),
                              alibi_slopes=np.linspace(0.1, 0.6, 6))),    # left padding, aligned window
        ((x2, x2, x2), dict(bias=da.from_array(np.linspace(-1, 1, 40), chunks=15), window=[4, None],
                            kv_lengths=30, causal=np.bool_(True))),
    ]
    lazies = []
    for (q, k, v), kw in cases:
        lq = _lazy(rng, q) if q.ndim > 2 or rng.random() < 0.5 else q
        lazies.append(fdask.attention(lq, _lazy(rng, k), _lazy(rng, v), return_lse=True, **kw))
    for ((q, k, v), kw), got in zip(cases, client.compute(lazies, sync=True)):
        kw = {name: x.compute() if isinstance(x, da.Array) else x for name, x in kw.items()}
        for a, b in zip(got, fastattn.attention(q, k, v, return_lse=True, **kw)):
            _check(a, b)


def test_float64_equals_the_reference(client):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 4, 50, 16))
    k, v = rng.standard_normal((2, 2, 70, 16)), rng.standard_normal((2, 2, 70, 8))
    kw = dict(causal="bottom_right", window=(20, None), kv_lengths=np.array([[70], [41]]),
              alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]), softcap=5.0)
    got = fdask.attention(_lazy(rng, q), _lazy(rng, k), _lazy(rng, v), return_lse=True, **kw)
    got = client.compute(list(got), sync=True)
    for a, b in zip(got, fastattn.reference.attention(q, k, v, return_lse=True, **kw)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ the graph

def test_causal_graph_has_n_n_plus_1_over_2_partial_tasks():
    for n in (1, 3, 8):
        x = da.zeros((1, 2, 16 * n, 8), chunks=(1, 2, 16, 8), dtype=np.float32)
        assert _partial_tasks(fdask.attention(x, x, x)) == n * n
        assert _partial_tasks(fdask.attention(x, x, x, causal=True)) == n * (n + 1) // 2
    # two batch blocks: the count per block
    x = da.zeros((2, 2, 64, 8), chunks=(1, 2, 16, 8), dtype=np.float32)
    assert _partial_tasks(fdask.attention(x, x, x, causal="top_left")) == 2 * 10


@pytest.mark.parametrize("kw", [
    dict(causal="bottom_right"),
    dict(causal=True, window=(20, None)),
    dict(window=(5, 9)),
    dict(window=(None, 0)),
    dict(causal="bottom_right", window=10),
])
def test_graph_skips_exactly_the_invisible_pairs(kw):
    q_chunks, k_chunks = (10, 7, 13, 9), (16, 16, 16, 16, 5)
    q = da.zeros((1, sum(q_chunks), 4), chunks=(1, q_chunks, 4))
    k = da.zeros((1, sum(k_chunks), 4), chunks=(1, k_chunks, 4))
    assert _partial_tasks(fdask.attention(q, k, k, **kw)) == _visible_pairs(q_chunks, k_chunks, **kw)


def test_kv_lengths_skip_pairs(client):
    """NumPy kv_lengths: exactly the pairs visible for the batch chunk's lengths.
    Dask kv_lengths: exactly the pairs visible for some length in [0, Lk]."""
    lens = np.array([[20], [50], [3]])
    q_chunks, k_chunks = (8, 8, 8, 8), (16, 16, 16, 16)
    rng = np.random.default_rng(3)
    qn = rng.standard_normal((3, 2, 32, 4))
    kn = rng.standard_normal((3, 2, 64, 4))
    q = da.from_array(qn, chunks=(1, 2, q_chunks, 4))
    k = da.from_array(kn, chunks=(1, 2, k_chunks, 4))
    pruned_lazily = 0
    for kw in (dict(causal=False), dict(causal="bottom_right"), dict(causal="bottom_right", window=(6, 0)),
               dict(causal=True, window=(12, 0))):
        exact = sum(_visible_pairs(q_chunks, k_chunks, kv_lengths=np.array(n), **kw) for n in lens.ravel())
        any_length = set().union(*(_visible_set(q_chunks, k_chunks, kv_lengths=np.array(n), **kw)
                                   for n in range(65)))
        eager = fdask.attention(q, k, k, kv_lengths=lens, **kw)
        lazy = fdask.attention(q, k, k, kv_lengths=da.from_array(lens, chunks=1), **kw)
        assert _partial_tasks(eager) == exact < 3 * 16
        assert _partial_tasks(lazy) == 3 * len(any_length)
        pruned_lazily += len(any_length) < 16
        for got in client.compute([eager, lazy], sync=True):
            _check(got, fastattn.attention(qn, kn, kn, kv_lengths=lens, **kw))
    assert pruned_lazily == 3


def test_one_dimensional_lengths_are_per_sequence_with_a_chunked_batch(client):
    """A 1-D kv_lengths / kv_start (one value per sequence) with the batch dim split
    over chunks: each chunk's tasks read their own sequences' values, eager or lazy,
    and the pairs past each chunk's lengths are pruned."""
    rng = np.random.default_rng(11)
    qn = rng.standard_normal((3, 2, 4, 8))
    kn = rng.standard_normal((3, 2, 64, 8))
    q = da.from_array(qn, chunks=(1, 2, 4, 8))
    k = da.from_array(kn, chunks=(1, 2, 16, 8))
    lens, start = np.array([20, 64, 3]), np.array([0, 30, 1])
    want = fastattn.attention(qn, kn, kn, kv_lengths=lens, kv_start=start)
    eager = fdask.attention(q, k, k, kv_lengths=lens, kv_start=start)
    lazy = fdask.attention(q, k, k, kv_lengths=da.from_array(lens, chunks=1),
                           kv_start=da.from_array(start, chunks=1))
    assert _partial_tasks(eager) == 2 + 4 + 1          # key chunks under each length
    for got in client.compute([eager, lazy], sync=True):
        _check(got, want)
    with pytest.raises(ValueError, match="kv_lengths: a 1-D table holds one value per sequence"):
        fdask.attention(q, k, k, kv_lengths=np.array([1, 2]))


def test_query_chunk_that_sees_no_key_gives_zeros_and_minus_inf(client):
    q = da.ones((1, 32, 4), chunks=(1, 8, 4))
    k = da.ones((1, 64, 4), chunks=(1, 16, 4))
    out, lse = fdask.attention(q, k, k, kv_lengths=np.array([0]), return_lse=True)
    assert _partial_tasks(out) == 0
    out, lse = client.compute([out, lse], sync=True)
    assert (out == 0).all() and (lse == -np.inf).all()


def test_split_every_sets_the_merge_tree():
    x = da.zeros((1, 16, 4), chunks=(1, 16, 4))
    k = da.zeros((1, 16 * 16, 4), chunks=(1, 16, 4))
    for split_every, merges in ((2, 15), (4, 5), (16, 1)):
        graph = dict(fdask.attention(x, k, k, split_every=split_every).__dask_graph__())
        assert sum(1 for key in graph if key[0].startswith("fastattn-attention-merge")) == merges
    with pytest.raises(ValueError, match="split_every"):
        fdask.attention(x, k, k, split_every=1)


def test_weights_are_lazy_and_chunked_like_the_scores(client):
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 30, 8)).astype(np.float32)
    k = rng.standard_normal((2, 45, 8)).astype(np.float32)
    out, w = fdask.attention(da.from_array(q, chunks=(1, 10, 8)), da.from_array(k, chunks=(2, 15, 8)), k,
                             causal=True, return_weights=True)
    assert w.chunks == ((1, 1), (10, 10, 10), (15, 15, 15))
    got = client.compute([out, w], sync=True)
    for a, b in zip(got, fastattn.attention(q, k, k, causal=True, return_weights=True)):
        _check(a, b)


# ------------------------------------------------------------------ errors and the hook

def test_errors_are_the_in_memory_ones():
    q = da.zeros((2, 3, 8, 4), chunks=2)
    with pytest.raises(TypeError, match="out="):
        fdask.attention(q, q, q, out=np.empty((2, 3, 8, 4)))
    for kw in (dict(scale="x"), dict(causal="left"), dict(window=-1), dict(softcap=0.0),
               dict(mask=np.ones((8, 8))), dict(mask=np.ones((5, 8), bool)), dict(kv_lengths=np.array([1.0])),
               dict(kv_lengths=np.array([9])), dict(alibi_slopes=np.ones(4)), dict(num_threads=0)):
        n = np.zeros((2, 3, 8, 4))
        with pytest.raises((TypeError, ValueError)) as want:
            fastattn.attention(n, n, n, **kw)
        with pytest.raises(want.type, match=None) as got:
            fdask.attention(q, q, q, **kw)
        assert str(got.value) == str(want.value)
    with pytest.raises(ValueError, match="the same last dimension"):
        fdask.attention(q, q[..., :3], q)
    with pytest.raises(ValueError, match="batch dimensions"):
        fdask.attention(q, q[:, :2, :, :], q[:, :2, :, :])
    with pytest.raises(TypeError, match="out="):
        fdask.softmax(q, out=np.empty(q.shape))


def test_lazy_kv_lengths_out_of_range_fail_at_compute():
    q = da.zeros((2, 8, 4), chunks=(1, 4, 4))
    lazy = fdask.attention(q, q, q, kv_lengths=da.from_array(np.array([3, 9]), chunks=1))
    with pytest.raises(ValueError, match=r"kv_lengths must lie in \[0, Lk=8\]"):
        lazy.compute(scheduler="synchronous")


def test_lazy_kv_start_out_of_range_fails_at_compute():
    q = da.zeros((2, 8, 4), chunks=(1, 4, 4))
    for bad in ([3, 9], [-1, 2]):
        lazy = fdask.attention(q, q, q, kv_start=da.from_array(np.array(bad), chunks=1))
        with pytest.raises(ValueError, match=r"kv_start must lie in \[0, Lk=8\]"):
            lazy.compute(scheduler="synchronous")


def test_python_float_scales_keep_the_float32_result():
    rng = np.random.default_rng(12)
    q = rng.standard_normal((2, 4, 8), dtype=np.float32)
    k = rng.integers(-127, 128, (2, 16, 8), dtype=np.int8)
    want = fastattn.attention(q, k, k, k_scale=0.02, v_scale=0.03)
    got = fdask.attention(q, da.from_array(k, chunks=(1, 8, 8)), k, k_scale=0.02, v_scale=0.03).compute()
    assert got.dtype == want.dtype == np.float32
    _check(got, want)


def test_public_functions_return_lazy_results_for_dask_arrays():
    def boom():
        raise AssertionError("computed")
    q = da.from_delayed(dask.delayed(boom)(), shape=(1, 2, 16, 8), dtype=np.float32)
    for result in (fastattn.attention(q, q, q, causal=True),
                   fastattn.attention(np.zeros((1, 2, 16, 8), np.float32), q, q),
                   fastattn.attention(np.zeros((16, 8)), np.zeros((16, 8)), np.zeros((16, 8)),
                                      bias=da.zeros((16, 16), chunks=8)),
                   fastattn.softmax(q, axis=2), fastattn.log_softmax(q)):
        assert isinstance(result, da.Array)
    out, lse = fastattn.attention(q, q, q, return_lse=True)
    assert isinstance(lse, da.Array) and lse.shape == (1, 2, 16)


def test_import_fastattn_does_not_import_dask_and_missing_dask_is_a_clear_error():
    code = ("import sys, fastattn, numpy as np\n"
            "fastattn.attention(np.zeros((4, 2)), np.zeros((4, 2)), np.zeros((4, 2)), bias=[[0.0]])\n"
            "fastattn.softmax([1.0, 2.0], axis=0)\n"
            "assert 'dask' not in sys.modules, 'dask imported'\n"
            "sys.modules['dask'] = None\n"
            "try:\n"
            "    import fastattn.dask\n"
            "except ImportError as e:\n"
            "    assert \"pip install 'fastattn[dask]'\" in str(e), e\n"
            "else:\n"
            "    raise AssertionError('no ImportError')\n")
    here = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))   # this fastattn
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here] + sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=here)


def test_task_threads_default_one_unless_set_on_the_worker(client):
    assert chunk.task_threads(3) == 3
    assert chunk.task_threads(None) == 1
    try:
        fastattn.set_num_threads(2)
        assert chunk.task_threads(None) is None     # the process setting decides
    finally:
        fastattn.set_num_threads(None)
    # on the workers: one thread by default, the setting after client.run(set_num_threads)
    assert set(client.run(chunk.task_threads, None).values()) == {1}
    client.run(fastattn.set_num_threads, 2)
    try:
        assert set(client.run(fastattn.get_num_threads).values()) == {2}
        assert set(client.run(chunk.task_threads, None).values()) == {None}
    finally:
        client.run(fastattn.set_num_threads, None)


# ------------------------------------------------------------------ softmax

def test_softmax_along_chunked_and_unchunked_axes(client):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 50, 7)).astype(np.float32) * 4
    x[0, :, 0] = -np.inf              # an all -inf slice along axis 1
    x[1, 3, 1] = np.inf               # +inf: that slice is NaN
    x[2, 7, 2] = np.nan
    x[3, :20, 3] = -np.inf
    cases, lazies = [], []
    for axis in (1, -1, 0, None):
        for log in (False, True):
            for chunks in ((2, 20, 7), (6, 50, 7), (3, (10, 15, 25), (3, 4))):
                fn = fdask.log_softmax if log else fdask.softmax
                lazies.append(fn(da.from_array(x, chunks=chunks), axis=axis, split_every=2))
                cases.append((axis, log))
    for (axis, log), got in zip(cases, client.compute(lazies, sync=True)):
        want = (fastattn.log_softmax if log else fastattn.softmax)(x, axis=axis)
        _check(got, want)
    # float16 in, float16 out; integers in, float64 out; a chunked axis uses two passes
    h = da.from_array(x[3:5].astype(np.float16), chunks=(1, 10, 7))
    assert fdask.softmax(h, axis=1).dtype == np.float16
    i = da.arange(12, chunks=5)
    _check(fdask.log_softmax(i, axis=0).compute(), fastattn.log_softmax(np.arange(12), axis=0))
    layers = fdask.softmax(da.from_array(x, chunks=(6, 10, 7)), axis=1).__dask_graph__().layers
    assert any("stats" in name for name in layers)


def test_quantized_kv_refused_naming_the_argument():
    """A QuantizedKV k or v (read in place only by fastattn.attention /
    attention_paged on NumPy q) raises TypeError naming it, also when
    fastattn.attention hands a Dask q to the wrapper."""
    rng = np.random.default_rng(3)
    q = da.from_array(rng.standard_normal((1, 4, 3, 32)).astype(np.float32))
    c = fastattn.quantize_kv(rng.standard_normal((1, 4, 9, 32)).astype(np.float32))
    v = rng.standard_normal((1, 4, 9, 32)).astype(np.float32)
    for f in (fastattn.dask.attention, fastattn.attention):
        with pytest.raises(TypeError, match="k is a fastattn.QuantizedKV"):
            f(q, c, v)
        with pytest.raises(TypeError, match="v is a fastattn.QuantizedKV"):
            f(q, v, c)
