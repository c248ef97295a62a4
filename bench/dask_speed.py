#!/usr/bin/env python
"""Speed of fastattn.dask (issue 27): two worker processes against one, and against the
in-memory call with two threads.

q, k, v are (1, 8, 4096, 64) float32 in chunks of 1024 queries and 1024 keys, already
on the cluster (persisted) before the timing; a timing is one ``persist`` of the result
until it is in worker memory (no gather; q gets a fresh name each time so nothing
is reused), median of ``--repeats``.  The in-memory call
is ``fastattn.attention(..., num_threads=2)`` on NumPy arrays in this process.

    python bench/dask_speed.py                    # non-causal and causal, 7 repeats
    python bench/dask_speed.py --repeats 3 --cases causal
    python bench/dask_speed.py --keep-memory      # workers' glibc keeps freed memory (see below)
    (from a source tree built in place: PYTHONPATH=. python bench/dask_speed.py)

``--keep-memory``: the nanny starts each worker with MALLOC_TRIM_THRESHOLD_=65536
(distributed's default, so that freed memory goes back to the system); glibc then
also stops raising its mmap threshold, so every array above 128 KiB -- each
task's 2 MiB output, the merges' arrays -- is a fresh mapping whose pages fault
in.  This option starts the workers with MALLOC_TRIM_THRESHOLD_ = 256 MiB and
MALLOC_MMAP_THRESHOLD_ = 64 MiB instead (``distributed.nanny.pre-spawn-environ``).

The issue's targets: 2 workers >= 1.6 x one worker, and >= 0.7 x the in-memory call
with 2 threads.  Timings on a shared machine are noise; measure on a quiet one.
"""
import argparse
import statistics
import sys
import time
import uuid

import numpy as np

SHAPE = (1, 8, 4096, 64)
CHUNK = 1024


def _median_time(fn, repeats):
    fn()                                   # warm-up: imports, first OpenMP team, caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _same(block):
    return block


KEEP_MEMORY = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(64 << 20)}


def _on_cluster(n_workers, arrays, cases, repeats, keep_memory=False):
    import dask
    import dask.array as da
    import distributed

    import fastattn.dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    if keep_memory:
        environ.update(KEEP_MEMORY)
    dask.config.set({"distributed.nanny.pre-spawn-environ": environ})     # for the workers started here
    with distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        client.run(lambda: __import__("fastattn.dask"))
        q, k, v = (client.persist(da.from_array(a, chunks=(1, 8, CHUNK, 64))) for a in arrays)
        distributed.wait([q, k, v])
        result = {}
        for case in cases:
            def run():
                # a fresh name for q each time, so no result of an earlier run is reused
                fresh = q.map_blocks(_same, name=f"q-{uuid.uuid4().hex}")
                res = client.persist(fastattn.dask.attention(fresh, k, v, causal=(case == "causal")))
                distributed.wait(res)
                del res
            result[case] = _median_time(run, repeats)
        return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cases", default="full,causal", help="comma-separated: full, causal")
    ap.add_argument("--keep-memory", action="store_true",
                    help="start the workers with glibc keeping freed memory (MALLOC_TRIM_THRESHOLD_, "
                         "MALLOC_MMAP_THRESHOLD_)")
    args = ap.parse_args(argv)
    cases = args.cases.split(",")

    import fastattn

    rng = np.random.default_rng(27)
    arrays = [rng.standard_normal(SHAPE, dtype=np.float32) for _ in range(3)]
    in_memory = {}
    for case in cases:
        in_memory[case] = _median_time(
            lambda: fastattn.attention(*arrays, causal=(case == "causal"), num_threads=2), args.repeats)
    one = _on_cluster(1, arrays, cases, args.repeats, args.keep_memory)
    two = _on_cluster(2, arrays, cases, args.repeats, args.keep_memory)
    print(f"q, k, v {SHAPE} float32, chunks of {CHUNK} queries x {CHUNK} keys; median of {args.repeats}"
          + ("; workers keep freed memory" if args.keep_memory else ""))
    print(f"{'case':8} {'in-memory 2 thr':>16} {'1 worker':>10} {'2 workers':>10} "
          f"{'2w / 1w':>8} {'2w / in-mem':>12}")
    for case in cases:
        print(f"{case:8} {in_memory[case] * 1e3:13.1f} ms {one[case] * 1e3:7.1f} ms "
              f"{two[case] * 1e3:7.1f} ms "
              f"{one[case] / two[case]:7.2f}x {in_memory[case] / two[case]:11.2f}x")
    print("targets (issue 27): 2w / 1w >= 1.6, 2w / in-mem >= 0.7 (speed relative to in-memory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
