#!/usr/bin/env python
"""Long-context attention over a chunked KV cache with fastattn.dask.

A batch of 4 sequences shares one cache layout of 8 heads x 131072 positions x 64
(float32, 256 MiB for K and V each), chunked in 8192 positions.  The sequences are
filled to different lengths (kv_lengths); each decodes one token and, for the last
sequence, a 1024-token chunk of prompt is prefilled with bottom-right causal alignment.
Chunks past a sequence's length are never scheduled.

    pip install 'fastattn[dask]'
    python examples/dask_long_context.py

On a real cluster, change the one line marked below to
``client = Client("tcp://scheduler:8786")`` (the workers need fastattn installed).
"""
import numpy as np
import dask.array as da
from distributed import Client, LocalCluster

import fastattn
import fastattn.dask

HEADS, POSITIONS, DIM, CHUNK = 8, 131072, 64, 8192


def cache_chunk(which, block_id=None, block_info=None):
    """One chunk of the K (which=0) or V (which=1) cache, made on the worker that needs it
    (a real cache would be read from storage here: zarr, HDF5, memory-mapped files)."""
    shape = block_info[None]["chunk-shape"]
    rng = np.random.default_rng([which, *block_id])
    return rng.standard_normal(shape, dtype=np.float32)


def main():
    client = Client(LocalCluster(n_workers=2, threads_per_worker=1))   # <- Client("tcp://scheduler:8786")
    print(client)
    batch = 4
    chunks = ((1,) * batch, (HEADS,), (CHUNK,) * (POSITIONS // CHUNK), (DIM,))
    k, v = (da.map_blocks(cache_chunk, which, chunks=chunks, dtype=np.float32,
                          meta=np.empty((0,) * 4, np.float32)) for which in (0, 1))
    k, v = client.persist(k), client.persist(v)      # the cache lives on the workers
    lengths = np.array([[5000], [40000], [90000], [131072]])

    # decode: one new query per sequence and head
    q = np.random.default_rng(0).standard_normal((batch, HEADS, 1, DIM), dtype=np.float32)
    out = fastattn.dask.attention(q, k, v, kv_lengths=lengths, causal="bottom_right")
    tasks = sum(1 for key in dict(out.__dask_graph__()) if str(key[0]).startswith(fastattn.dask.PARTIAL_NAME))
    print(f"decode: {tasks} attention tasks for {batch * POSITIONS // CHUNK} (sequence, cache chunk) pairs")
    decoded = out.compute()

    # prefill: the last sequence's final 1024 positions attend causally to its whole cache
    qp = da.random.default_rng(1).standard_normal((1, HEADS, 1024, DIM), chunks=(1, HEADS, 256, DIM))
    qp = qp.astype(np.float32)
    prefill, lse = fastattn.dask.attention(qp, k[3:], v[3:], causal="bottom_right", return_lse=True)
    prefill = prefill.compute()
    print(f"decode out {decoded.shape}, prefill out {prefill.shape}")

    # the same decode in one process, for comparison (K and V fetched whole: 512 MiB)
    want = fastattn.attention(q, k.compute(), v.compute(), kv_lengths=lengths, causal="bottom_right")
    print(f"largest difference from the in-memory call: {np.abs(decoded - want).max():.1e}")
    client.close()


if __name__ == "__main__":
    main()
