# The parallel driver: cut a plan into work units (query blocks, key splits),
# pick the layout, hand the units to the OpenMP team without the GIL, merge
# splits, run a filled plan.

cdef extern from *:
    """
    #ifdef _WIN32
    /* Windows: MinGW-w64's default CRT (msvcrt) declares no timespec_get; the
       performance counter is monotonic and in every Windows CRT's kernel32 */
    #ifndef WIN32_LEAN_AND_MEAN
    #define WIN32_LEAN_AND_MEAN
    #endif
    #ifndef NOMINMAX
    #define NOMINMAX
    #endif
    #include <windows.h>
    static double fa_seconds(void)
    {
        LARGE_INTEGER f, c;
        QueryPerformanceFrequency(&f);
        QueryPerformanceCounter(&c);
        return (double)c.QuadPart / (double)f.QuadPart;
    }
    #else
    #include <time.h>
    /* a monotonic-enough clock in seconds for the interrupt checks (C11) */
    static double fa_seconds(void)
    {
        struct timespec t;
        timespec_get(&t, TIME_UTC);
        return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
    }
    #endif
    """
    double fa_seconds() nogil
    # declared without an exception clause: a KeyboardInterrupt it raises stays
    # set for attention_run's caller instead of being reported here
    int PyErr_CheckSignals()

cdef enum:
    INTERRUPT_MIN_WORK = 1 << 27      # smaller problems are never interrupted (no clock reads)

cdef double INTERRUPT_EVERY = 0.05    # seconds between signal checks of a long call


cdef inline int interrupt_check(int *stop, double *next_check) noexcept nogil:
    """On the calling thread (OpenMP thread 0) of a long call: every
    INTERRUPT_EVERY seconds, take the GIL and run Python's pending signal
    handlers; when one raised (Ctrl-C: KeyboardInterrupt), set *stop so every
    thread abandons its remaining units.  The exception stays set for the caller."""
    cdef double now
    if stop[0]:
        return 1
    now = fa_seconds()
    if now < next_check[0]:
        return 0
    next_check[0] = now + INTERRUPT_EVERY
    with gil:
        if PyErr_CheckSignals() != 0:
            stop[0] = 1
    return stop[0]


cdef inline int64_t plan_work(const Plan *P) noexcept nogil:
    """A size measure of the problem: below PARALLEL_MIN_WORK it runs on one thread."""
    return P.nbatch * P.nrows * (P.Lk + 1) * (P.Dk + P.Dv + 1)


cdef enum:
    UNIT_PLAIN = 0       # row-major unit, online softmax over all keys
    UNIT_QVEC = 1           # query-vectorised unit
    UNIT_WEIGHTS = 2     # row-major unit, statistics pass then weights pass
    UNIT_SPLIT = 3       # one key split of a row-major unit (merged afterwards)
    UNIT_QVEC_SPLIT = 4     # one key split of a query-vectorised unit
    UNIT_QVEC_WEIGHTS = 5   # query-vectorised unit, statistics pass then weights pass


cdef void do_unit(const Plan *P, Workspace *ws, int64_t u, int kind, int64_t units, int64_t nblk,
                  int64_t bq, int64_t rows, int64_t chunk, int64_t stride_split, floating *stats,
                  floating *po, floating *pm, double *pl) noexcept nogil:
    """Work unit u of attention_run (the same on the serial and the threaded path)."""
    cdef int64_t b, r0, nr, sp, kb, ke, uu
    if kind == UNIT_SPLIT or kind == UNIT_QVEC_SPLIT:
        sp = u // units
        uu = u % units
        b = uu // nblk
        r0 = (uu % nblk) * bq
        nr = min(bq, P.nrows - r0)
        kb = sp * chunk
        ke = min(P.Lk, kb + chunk)
        if kind == UNIT_QVEC_SPLIT:
            run_qvec_unit(P, ws, b, r0, nr, kb, ke, MODE_PARTIAL, <floating *>NULL,
                       po + (sp * stride_split + uu * rows) * P.Dv,
                       pm + sp * stride_split + uu * rows,
                       pl + sp * stride_split + uu * rows)
        else:
            run_row_unit(P, ws, b, r0, nr, kb, ke, MODE_PARTIAL, <floating *>NULL,
                     po + (sp * stride_split + uu * rows) * P.Dv,
                     pm + sp * stride_split + uu * rows,
                     pl + sp * stride_split + uu * rows)
        return
    b = u // nblk
    r0 = (u % nblk) * bq
    nr = min(bq, P.nrows - r0)
    if kind == UNIT_QVEC:
        run_qvec_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_ONLINE, <floating *>NULL,
                   <floating *>NULL, <floating *>NULL, <double *>NULL)
    elif kind == UNIT_QVEC_WEIGHTS:
        run_qvec_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_STATS, stats + u * rows,
                   <floating *>NULL, <floating *>NULL, <double *>NULL)
        run_qvec_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_WEIGHTS, stats + u * rows,
                   <floating *>NULL, <floating *>NULL, <double *>NULL)
    elif kind == UNIT_WEIGHTS:
        run_row_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_STATS, stats + u * rows,
                 <floating *>NULL, <floating *>NULL, <double *>NULL)
        run_row_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_WEIGHTS, stats + u * rows,
                 <floating *>NULL, <floating *>NULL, <double *>NULL)
    else:
        run_row_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_ONLINE, <floating *>NULL,
                 <floating *>NULL, <floating *>NULL, <double *>NULL)


cdef inline int use_qvec_path(int64_t nrows, size_t item) noexcept nogil:
    """Query-vectorised path for this many query rows (per batch entry)?  Its lanes
    are queries, so with a row count that is not a whole number of vectors part of
    the last vector is padding.  Measured on AVX-512 (float32, Lk 2048-8192, D 64
    and 128; 2 threads, paired against the row-major path): 16 and 32 rows 1.02-1.46x
    faster query-vectorised, 47 rows 1.04x; 6-12 rows 0.66-0.86x (a 16-lane vector
    6-12 lanes full), 24 rows 0.92x, 40 rows 0.95x; float64 16 rows 1.22x.  14-15
    rows against the few-rows path (keys and values in place): float64 on AVX-512
    1.15-1.30x, AVX2 float32 1.15-1.24x and float64 1.29x.  So: from
    max(QVEC_MIN_ROWS, 3/4 of an FA_QVEC_NV-vector chunk) rows on (48 float32 rows on
    AVX-512), and below that from QVEC_MIN_ROWS rows on when at most 1/8 of the last
    vector is padding (float32 on AVX-512: 14-16, 28-32, 42-47)."""
    cdef int64_t W = FA_VBYTES // item
    cdef int64_t lanes = round_up(nrows, W)
    if nrows >= max(<int64_t>QVEC_MIN_ROWS, 3 * FA_QVEC_NV * W // 4):
        return 1
    return nrows >= QVEC_MIN_ROWS and 8 * (lanes - nrows) <= lanes


cdef inline int64_t zigzag(int64_t u, int64_t nt, int64_t total) noexcept nogil:
    """Unit for iteration u of a round-robin loop over nt threads: rounds of nt
    iterations, every other round reversed, the last partial round as it is (a
    permutation of 0..total-1).  Thread t gets units t, 2nt-1-t, 2nt+t, ...: with
    unit costs that rise or fall along a run (the blocks of a causal head), each
    pair of rounds gives every thread about the same work."""
    cdef int64_t r = u // nt
    if r % 2 == 0 or (r + 1) * nt > total:
        return u
    return r * nt + nt - 1 - u % nt


cdef int attention_run(Plan *P, floating dummy, int nthreads) except -1:
    cdef int use_qvec = use_qvec_path(P.nrows, sizeof(floating))
    cdef int64_t bq = BLOCK_Q_QVEC if use_qvec else BLOCK_Q
    cdef int64_t nblk = (P.nrows + bq - 1) // bq
    cdef int64_t rows = P.nrows if P.nrows < bq else bq
    cdef int64_t units = P.nbatch * nblk
    cdef int64_t nsplit = 1, chunk = P.Lk, u, b, r0, nr, min_keys
    cdef int kind = UNIT_PLAIN
    cdef int64_t total = units
    cdef int failed = 0
    cdef int *failed_p = &failed    # written through the pointer: shared by all threads
    cdef int stop = 0
    cdef int *stop_p = &stop        # set when Ctrl-C interrupts a long call (interrupt_check)
    cdef double next_check
    cdef bint interruptible
    cdef Workspace *ws              # assigned inside the parallel block: one per thread
    cdef floating *stats = NULL
    cdef floating *po = NULL
    cdef floating *pm = NULL
    cdef double *pl = NULL
    cdef int use_threads = nthreads > 1 and plan_work(P) > PARALLEL_MIN_WORK
    cdef int64_t stride_split = 0
    cdef int64_t kb0, ke0, kb1, ke1
    cdef int rev, static_map
    if units == 0:
        return 0
    # Decode-like problems (few units, many keys) split the key range; the split
    # count depends on the shape only, never on the thread count, so results are
    # bit-identical for any num_threads.
    min_keys = SPLIT_MIN_KEYS_QVEC if use_qvec else SPLIT_MIN_KEYS
    if units < SPLIT_TARGET and not P.want_weights and P.Lk >= 2 * min_keys:
        nsplit = (SPLIT_TARGET + units - 1) // units
        if nsplit > P.Lk // min_keys:
            nsplit = P.Lk // min_keys
        chunk = round_up((P.Lk + nsplit - 1) // nsplit, BLOCK_K)
        nsplit = (P.Lk + chunk - 1) // chunk

    if P.want_weights:
        stats = <floating *>fa_alloc(P.nbatch * nblk * rows * sizeof(floating))
        if stats == NULL:
            raise MemoryError()
    if nsplit > 1:
        stride_split = units * rows
        po = <floating *>fa_alloc(nsplit * stride_split * (P.Dv if P.Dv > 0 else 1) * sizeof(floating))
        pm = <floating *>fa_alloc(nsplit * stride_split * sizeof(floating))
        pl = <double *>fa_alloc(nsplit * stride_split * sizeof(double))
        if po == NULL or pm == NULL or pl == NULL:
            fa_free(po)
            fa_free(pm)
            fa_free(pl)
            raise MemoryError()

    if nsplit > 1:
        kind = UNIT_QVEC_SPLIT if use_qvec else UNIT_SPLIT
        total = units * nsplit
    elif P.want_weights:
        kind = UNIT_QVEC_WEIGHTS if use_qvec else UNIT_WEIGHTS
    elif use_qvec:
        kind = UNIT_QVEC
    # Causal and left windows give later rows more keys: the threads take units
    # last-first, heaviest first, so the team does not wait at the end for one
    # thread's last diagonal block (any order gives the same bits: each unit
    # writes its own rows or split).
    key_range(P, row_diag(P, 0, P.Lk), 0, P.Lk, &kb0, &ke0)
    key_range(P, row_diag(P, P.Lq - 1, P.Lk), 0, P.Lk, &kb1, &ke1)
    rev = ke1 - kb1 > ke0 - kb0
    # Small threaded problems: each unit goes to the same thread on every call
    # (static, zigzag order), so the output rows a thread writes stay in its
    # core's cache from one call to the next.  Handed out dynamically, a unit
    # often lands on the other core, whose stores must first take every line
    # of its output rows from the first core: on 2 cores (Intel Xeon, AVX-512)
    # 16 heads of 16x16 D 64 took 15.3 us against 12.6 mapped, 8 heads of 64x64
    # 43.6 against 34.6, causal 38.1 against 33.0.  Larger problems keep the
    # dynamic heaviest-first order, which also copes with a preempted thread
    # (the zigzag map measured level with it there; plain round-robin left
    # causal units unbalanced: 8 heads of 256x256 0.77x).
    static_map = plan_work(P) < STATIC_MAX_WORK
    # long calls check for Ctrl-C between units (on the calling thread only)
    interruptible = plan_work(P) > INTERRUPT_MIN_WORK
    next_check = fa_seconds() + INTERRUPT_EVERY if interruptible else 0
    if not use_threads:
        # Small problems: no OpenMP region at all (even a one-thread region is a
        # runtime call with locking), one workspace on the calling thread.
        with nogil:
            ws = workspace_new(P, rows, sizeof(floating), use_qvec)
            if ws == NULL:
                failed = 1
            else:
                for u in range(total):
                    if interruptible and interrupt_check(stop_p, &next_check):
                        break
                    do_unit(P, ws, u, kind, units, nblk, bq, rows, chunk, stride_split, stats, po, pm, pl)
                workspace_delete(ws)
    else:
        with nogil, parallel(num_threads=nthreads):
            # Every thread must reach the worksharing loop below (OpenMP requires
            # it), so a failed allocation only disables the thread's share of work.
            ws = workspace_new(P, rows, sizeof(floating), use_qvec)
            if ws == NULL:
                failed_p[0] = 1
            if static_map:
                for u in prange(total, schedule='static', chunksize=1):
                    if ws != NULL:
                        do_unit(P, ws, zigzag(u, nthreads, total), kind, units, nblk, bq, rows, chunk, stride_split, stats, po, pm, pl)
            else:
                for u in prange(total, schedule='dynamic'):
                    if ws != NULL and not stop_p[0]:
                        if interruptible and threadid() == 0 and interrupt_check(stop_p, &next_check):
                            continue
                        do_unit(P, ws, total - 1 - u if rev else u, kind, units, nblk, bq, rows, chunk, stride_split, stats, po, pm, pl)
            workspace_delete(ws)

    if stop:
        # interrupted: the results are incomplete and never returned
        fa_free(stats)
        fa_free(po)
        fa_free(pm)
        fa_free(pl)
        return -1
    if nsplit > 1 and not failed:
        with nogil:
            for u in prange(units, schedule='static', num_threads=nthreads, use_threads_if=use_threads):
                b = u // nblk
                r0 = (u % nblk) * bq
                nr = min(bq, P.nrows - r0)
                merge_splits(P, b, r0, nr, nsplit, po + u * rows * P.Dv, pm + u * rows,
                             pl + u * rows, stride_split)
    fa_free(stats)
    fa_free(po)
    fa_free(pm)
    fa_free(pl)
    if failed:
        raise MemoryError("fastattn: could not allocate the per-thread attention workspace")
    return 0

cdef int plan_execute(Plan *P, int typenum, int nthreads) except -1:
    """Run a filled plan in its dtype (nothing to do without query rows or batch elements)."""
    if P.Lq == 0 or P.nbatch == 0:
        return 0
    if typenum == cnp.NPY_FLOAT:
        attention_run(P, <float>0, nthreads)
    else:
        attention_run(P, <double>0, nthreads)
    return 0

cdef inline int plan_run(Plan *P, int typenum, num_threads) except -1:
    """Execute a filled plan; the thread count (num_threads as the caller gave it)
    is asked of fastattn._threads only when the problem is large enough for
    threads, which also records that this thread may own an OpenMP pool (fork
    safety)."""
    cdef int nthreads = 1
    if plan_work(P) > PARALLEL_MIN_WORK:
        nthreads = _thread_resolver(num_threads)
    return plan_execute(P, typenum, nthreads)
