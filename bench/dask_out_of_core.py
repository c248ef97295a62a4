#!/usr/bin/env python
"""Out-of-core decode attention on a two-worker Dask cluster (issue 27).

One query per head attends to a KV cache that no worker could hold: K and V are each
``heads x keys x dim`` float32 (4 GiB each by default), generated chunk by chunk on the
workers from per-chunk seeds and never whole, while each worker's ``memory_limit`` is
1 GiB.  The answer is checked against a chunked NumPy computation (float64, an online
softmax over the same chunks, regenerated here one chunk at a time).

    python bench/dask_out_of_core.py                 # K, V 4 GiB each, 2 workers x 1 GiB
    python bench/dask_out_of_core.py --keys 65536    # a quick smoke run
    (from a source tree built in place: PYTHONPATH=. python bench/dask_out_of_core.py)

Prints the sizes, the wall time of the compute, each worker's peak resident memory,
and the largest error; exits with status 1 when the error is above 1e-5.
"""
import argparse
import resource
import sys
import time

import numpy as np


def kv_chunk(which, seed, heads, dim, block_id=None, block_info=None):
    """One (1, heads, keys_in_chunk, dim) chunk of K (which=0) or V (which=1)."""
    rows = block_info[None]["chunk-shape"][2]
    rng = np.random.default_rng([seed, which, block_id[2]])
    return rng.standard_normal((1, heads, rows, dim), dtype=np.float32)


def peak_rss_mib():
    # ru_maxrss: KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def numpy_decode(q, nkeys, chunk, seed, heads, dim):
    """The same attention with NumPy in float64: one chunk of K and V at a time."""
    q64 = q[0, :, 0, :].astype(np.float64) / np.sqrt(dim)          # (heads, dim)
    m = np.full(heads, -np.inf)
    s = np.zeros(heads)
    acc = np.zeros((heads, dim))
    for i, start in enumerate(range(0, nkeys, chunk)):
        rows = min(chunk, nkeys - start)
        info = {None: {"chunk-shape": (1, heads, rows, dim)}}
        k = kv_chunk(0, seed, heads, dim, (0, 0, i, 0), info)[0].astype(np.float64)
        v = kv_chunk(1, seed, heads, dim, (0, 0, i, 0), info)[0].astype(np.float64)
        scores = np.einsum("hd,hkd->hk", q64, k)
        m_new = np.maximum(m, scores.max(axis=1))
        p = np.exp(scores - m_new[:, None])
        corr = np.exp(m - m_new)
        s = s * corr + p.sum(axis=1)
        acc = acc * corr[:, None] + np.einsum("hk,hkd->hd", p, v)
        m = m_new
    return acc / s[:, None], m + np.log(s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=2**20, help="keys in the cache (default 2^20)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=32768, help="keys per chunk (default 32768)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="1GiB", help="per worker (default 1GiB)")
    ap.add_argument("--seed", type=int, default=27)
    args = ap.parse_args(argv)

    import dask.array as da
    import distributed
    from dask.utils import parse_bytes

    import fastattn
    import fastattn.dask

    shape = (1, args.heads, args.keys, args.dim)
    key_chunks = tuple(min(args.chunk, args.keys - s) for s in range(0, args.keys, args.chunk))
    chunks = ((1,), (args.heads,), key_chunks, (args.dim,))
    kv_bytes = np.prod(shape) * 4
    q = np.random.default_rng(args.seed).standard_normal((1, args.heads, 1, args.dim), dtype=np.float32)
    with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                  memory_limit=args.memory_limit, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        k, v = (da.map_blocks(kv_chunk, which, args.seed, args.heads, args.dim, chunks=chunks,
                              dtype=np.float32, meta=np.empty((0, 0, 0, 0), np.float32),
                              name=f"kv-chunk-{which}-{args.seed}-{args.keys}-{args.chunk}")
                for which in (0, 1))
        out, lse = fastattn.dask.attention(q, k, v, causal="bottom_right", return_lse=True)
        print(f"fastattn {fastattn.__version__}: q {q.shape}, K and V {shape} float32, "
              f"{kv_bytes / 2**30:.2f} GiB each, {len(chunks[2])} chunks of {args.chunk} keys")
        limit = parse_bytes(args.memory_limit)
        print(f"cluster: {args.workers} worker processes x 1 thread, memory_limit {limit / 2**30:.2f} GiB "
              f"each; K + V = {2 * kv_bytes / limit:.1f} x one worker's limit")
        client.run(lambda: __import__("fastattn.dask"))    # imports outside the timing
        t0 = time.perf_counter()
        got_out, got_lse = client.compute([out, lse], sync=True)
        wall = time.perf_counter() - t0
        peaks = client.run(peak_rss_mib)
    want_out, want_lse = numpy_decode(q, args.keys, args.chunk, args.seed, args.heads, args.dim)
    err = max(float(np.abs(got_out[0, :, 0, :] - want_out).max()),
              float(np.abs(got_lse[0, :, 0] - want_lse).max() / max(1.0, np.abs(want_lse).max())))
    print(f"compute: {wall:.1f} s")
    for addr, mib in sorted(peaks.items()):
        print(f"  worker {addr}: peak resident memory {mib:.0f} MiB")
    print(f"largest error against a chunked NumPy float64 computation: {err:.2e}")
    return 0 if err <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
