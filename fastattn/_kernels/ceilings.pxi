# The machine's ceilings in this variant's vector width (ceilings.h):
# read_bandwidth(nbytes, threads) and fma_peak(threads), what bench/compare.py
# reads the kernels' GB/s and GFLOP/s against.  Not part of the public API.

from time import perf_counter

cdef extern from "ceilings.h" nogil:
    double fa_ceil_read(const float *x, int64_t n, int threads, int streams, int64_t pf_bytes, int64_t reps)
    void fa_ceil_fill(float *x, int64_t n, int threads)
    double fa_ceil_peak(int kind, int chains, int64_t iters, int threads)
    enum:
        FA_CEIL_HAVE_BF16_DOT
        FA_CEIL_HAVE_AMX
        FA_CEIL_AMX_MACS_PER_ITER
        FA_PF_BYTES
        FA_WF
        FA_WD

# (streams, prefetch bytes) tried by read_bandwidth; the best is the ceiling
READ_CONFIGS = tuple((s, pf) for s in (1, 2, 4, 8) for pf in (0, FA_PF_BYTES, 4 * FA_PF_BYTES))
PEAK_CHAINS = (8, 12, 16)
_PEAK_KINDS = {"float32": 0, "float64": 1, "bfloat16": 2}


cdef int _ceiling_threads(threads) except -1:
    if threads is None:
        return _thread_resolver(None) if _thread_resolver is not None else 1
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int >= 1 or None, got {type(threads).__name__}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return threads


cdef double _check_min_time(min_time) except -1:
    if not isinstance(min_time, (int, float)) or isinstance(min_time, bool) or not min_time > 0:
        raise ValueError(f"min_time must be a positive number of seconds, got {min_time!r}")
    return min_time


def read_bandwidth(nbytes, threads=None, *, min_time=0.05, details=False):
    """Read bandwidth in GB/s of ``threads`` threads streaming ``nbytes`` bytes.

    A buffer of ``nbytes`` (rounded down to whole float32) is filled by the
    threads that read it, then read over and over with a compiled loop of this
    kernel variant: each thread sums its contiguous share into 8 independent
    vector accumulators, as 1, 2, 4 or 8 concurrent streams, with and without
    software prefetch.  Every configuration is timed for about ``min_time``
    seconds (at least 3 timings); the best time of the best configuration is
    the ceiling: repeated passes over the same bytes, as repeated calls of a
    kernel see them (a buffer that fits in a cache is read from it).

    Returns GB/s (1e9 bytes per second); with ``details=True`` a dict of GB/s
    per ``(streams, prefetch_bytes)`` as well.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
    if nbytes < 64:
        raise ValueError(f"nbytes must be at least 64 (one cache line), got {nbytes}")
    cdef int nt = _ceiling_threads(threads)
    cdef double budget = _check_min_time(min_time)
    cdef int64_t n = nbytes // 4
    cdef float *buf = <float *>fa_alloc(n * sizeof(float))
    if buf == NULL:
        raise MemoryError(f"read_bandwidth: cannot allocate {nbytes} bytes")
    cdef int streams
    cdef int64_t pf, reps
    cdef double sink = 0.0
    per_config = {}
    try:
        with nogil:
            fa_ceil_fill(buf, n, nt)
            sink += fa_ceil_read(buf, n, nt, 1, 0, 1)          # warm: pages, caches, threads
        # passes per timing: at least 1 ms of reading at ~100 GB/s
        reps = max(1, <int64_t>(1e8 / (n * 4.0)))
        for streams, pf in READ_CONFIGS:
            best = float("inf")
            spent = 0.0
            timings = 0
            while timings < 3 or spent < budget:
                t0 = perf_counter()
                with nogil:
                    sink += fa_ceil_read(buf, n, nt, streams, pf, reps)
                dt = perf_counter() - t0
                spent += dt
                timings += 1
                best = min(best, dt / reps)
            per_config[(streams, pf)] = n * 4.0 / best / 1e9
    finally:
        fa_free(buf)
    if sink != sink:        # never true: the sums are finite; keeps them alive
        raise RuntimeError("read_bandwidth: NaN sum")
    best_gbs = max(per_config.values())
    return {"gbs": best_gbs, "configs": per_config} if details else best_gbs


def fma_peak(threads=None, *, dtype="float32", min_time=0.05, details=False):
    """Multiply-add peak in GFLOP/s of ``threads`` threads at this variant's vector width.

    Each thread runs 8, 12 and 16 independent chains ``acc = acc * x + y`` in
    vector registers (one FMA instruction each where the variant has FMA), no
    memory traffic; 2 flops per lane per step.  ``dtype`` "float32" or
    "float64"; "bfloat16": the bfloat16 products of variants that have them --
    AMX tiles where the variant has them (four independent C tiles of
    TDPBF16PS, 32768 flops each), else pair dot products (4 flops per 32-bit
    lane per instruction) -- ``None`` elsewhere.
    The best chain count, timed for about ``min_time`` seconds each, is the
    peak.  With ``details=True`` a dict of GFLOP/s per chain count as well.
    """
    if dtype not in _PEAK_KINDS:
        raise ValueError(f"dtype must be one of {', '.join(_PEAK_KINDS)}, got {dtype!r}")
    cdef int nt = _ceiling_threads(threads)
    cdef double budget = _check_min_time(min_time)
    cdef int kind = _PEAK_KINDS[dtype]
    if kind == 2 and not FA_CEIL_HAVE_BF16_DOT:
        return None
    if kind == 2 and FA_CEIL_HAVE_AMX:
        kind = 3
    cdef int lanes = FA_WD if kind == 1 else FA_WF
    cdef int flops_per_lane = 4 if kind == 2 else 2
    cdef int chains
    cdef int64_t iters = 1 << 16 if kind != 3 else 1 << 10
    cdef double sink = 0.0
    per_chains = {}
    with nogil:
        sink += fa_ceil_peak(kind, 8, iters, nt)               # warm: threads, clocks
    for chains in (PEAK_CHAINS if kind != 3 else (4,)):
        best = float("inf")
        spent = 0.0
        timings = 0
        while timings < 3 or spent < budget:
            t0 = perf_counter()
            with nogil:
                sink += fa_ceil_peak(kind, chains, iters, nt)
            dt = perf_counter() - t0
            spent += dt
            timings += 1
            best = min(best, dt)
            if dt < 2e-3:           # too short to time well: lengthen the next one
                iters *= 2
                best = float("inf")
                timings = 0
        if kind == 3:       # 4 C tiles: chains counts them
            per_chains[chains] = nt * iters * 2.0 * FA_CEIL_AMX_MACS_PER_ITER / best / 1e9
        else:
            per_chains[chains] = nt * iters * chains * lanes * flops_per_lane / best / 1e9
    if sink != sink:
        raise RuntimeError("fma_peak: NaN sum")
    peak = max(per_chains.values())
    return {"gflops": peak, "chains": per_chains} if details else peak


def ceiling_info():
    """What the ceilings of this variant run on: vector lanes, read configurations."""
    return {"float32_lanes": FA_WF, "float64_lanes": FA_WD, "read_configs": READ_CONFIGS,
            "peak_chains": PEAK_CHAINS, "bf16_dot": bool(FA_CEIL_HAVE_BF16_DOT),
            "bf16_tiles": bool(FA_CEIL_HAVE_AMX)}
