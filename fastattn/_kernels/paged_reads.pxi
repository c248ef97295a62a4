# Paged keys and values (attention_paged) read in place by the few-rows unit
# (row_unit.pxi): key t of a sequence is slot t % page of cache block
# pages[t // page] (row_at), so a tile of BLOCK_K keys is a few runs of rows
# stored one after another.  The in-place readers (scores, P.V, both fused) run
# once per run; the online softmax still runs once per tile, so a block size
# of 16 costs a few kernel calls per tile, not a softmax update per block.
# The next run's block lies anywhere in the cache, out of reach of the readers'
# own prefetch (a fixed distance ahead, into whatever follows the run in
# memory): so while a run of a short block is read, each of its rows requests
# its counterpart in the next run (next_run_rows, the readers' prefetch offset
# pfo), every line of the next block requested once, one block ahead; a long
# block's runs keep the readers' distance, and the next run's first rows are
# requested (prefetch_run).  Zen 4, 2 threads, S8 Hq32 Hkv8 ctx 4096 in shuffled
# blocks of 16, paired against the second scheme alone: float32 1.2x, bfloat16
# 1.5x, float16 1.5-1.8x, int8 1.3x faster (docs/performance.rst, "Paged
# decode: the next block's rows").

cdef extern from "simd.h" nogil:
    int64_t fa_pf_rows_bytes(int64_t bytes)


cdef inline void prefetch_run(const Plan *P, const Operand *op, int64_t bo, int64_t t, int64_t lim,
                              int64_t D) noexcept nogil:
    """Request the first rows (a prefetch distance of them) of the run of k or v
    rows from key t, when t < lim (the keys the unit reads)."""
    cdef int64_t n, r
    cdef const char *p
    if t >= lim or op.sc != 1:
        return
    n = run_end(P, t, lim) - t
    r = fa_pf_rows_bytes(D * op.item)
    if n > r:
        n = r
    p = stored_at(op, bo + row_at(P, op, t))
    for r in range(n):
        fa_prefetch_bytes(p + r * op.sr * op.item, D * op.item)


cdef inline void prefetch_key_scales(const Plan *P, const Operand *s, int64_t off, int64_t t, int64_t x) noexcept nogil:
    """Request the per-key scales (int8 caches) of keys [t, x), run by run: a
    paged cache's scales lie a block's line here and there, out of the hardware
    prefetcher's reach."""
    cdef const char *p
    cdef int64_t j, e
    while t < x:
        e = run_end(P, t, x)
        p = <const char *>((<const float *>s.base) + off + row_at(P, s, t))
        if s.sr == 1:
            fa_prefetch_bytes(p, (e - t) * 4)
        else:
            for j in range(e - t):
                fa_prefetch_bytes(p + j * s.sr * 4, 4)
        t = e


cdef inline void prefetch_head_scales(const Plan *P, int64_t ksoff, int64_t vsoff, int64_t t, int64_t x) noexcept nogil:
    """Request one head's per-key k_scale and v_scale (whichever are per key) of
    keys [t, x): ksoff / vsoff from key_scale_offset."""
    if P.kscale == SCALE_PER_KEY:
        prefetch_key_scales(P, &P.ks, ksoff, t, x)
    if P.vscale == SCALE_PER_KEY:
        prefetch_key_scales(P, &P.vs, vsoff, t, x)


cdef enum:
    NEXT_RUN_MAX_BYTES = 16384   # a block's run of one head's rows up to this size: next_run_rows


cdef inline int64_t next_run_rows(const Plan *P, const Operand *op, int64_t t, int64_t x, int64_t lim,
                                  int64_t D) noexcept nogil:
    """The prefetch offset (pfo of fa_qk_rows / fa_pv_rows) of the run of rows
    [t, x) of D elements: the rows from its first to the first of the next run,
    [x, ...), in the next block of the table -- so each row of this run requests
    its counterpart one block on, for every head (the heads' rows lie at the
    same place in each block).  0 (nothing to request) at lim, the last run.
    FA_PF_AUTO (the readers' own distance, and prefetch_run) where that offset
    is not a whole number of rows, or where a block's run of rows is longer than
    NEXT_RUN_MAX_BYTES: there the readers' distance lies mostly inside the run,
    and a whole block ahead measured slower (float32 D 128, blocks of 64 keys
    0.96x, of 128 0.94x; 16 1.21x, 32 1.03x faster)."""
    cdef int64_t d
    if P.page * D * op.item > NEXT_RUN_MAX_BYTES:
        return FA_PF_AUTO
    if x >= lim:
        return 0
    d = row_at(P, op, x) - row_at(P, op, t)
    if op.sr <= 0 or d % op.sr != 0:
        return FA_PF_AUTO
    return d // op.sr


cdef inline int64_t run_pfo(const Plan *P, const Operand *op, int64_t bo, int64_t t, int64_t x, int64_t lim,
                            int64_t D) noexcept nogil:
    """The prefetch offset of the run of rows [t, x) (next_run_rows); where
    that is the readers' own distance (FA_PF_AUTO), the next run's first rows
    are requested here (prefetch_run) -- its block lies out of that distance's
    reach.  Every paged reader that takes an offset gets it from here."""
    cdef int64_t pfo = next_run_rows(P, op, t, x, lim, D)
    if pfo == FA_PF_AUTO:
        prefetch_run(P, op, bo, x, lim, D)
    return pfo


cdef void paged_qk_rows(const Plan *P, bint bdqk, const floating *qp, int64_t nr, int64_t kbo, int64_t t0,
                        int64_t n, int64_t lim, floating *s) noexcept nogil:
    """Scores of nr packed query rows against keys t0..t0+n-1 read in place (s
    rows BLOCK_K apart), one unit_qk_rows call per run (bdqk: row_bf16_dot); keys
    up to lim are requested a run ahead."""
    cdef int64_t t = t0, e
    cdef int64_t pfo
    while t < t0 + n:
        e = run_end(P, t, t0 + n)
        pfo = run_pfo(P, &P.k, kbo, t, e, lim, P.Dk)
        unit_qk_rows(P, bdqk, qp, nr, stored_at(&P.k, kbo + row_at(P, &P.k, t)), e - t, s + (t - t0), pfo)
        t = e


cdef void paged_pv_qk(const Plan *P, int64_t kbo, int64_t vbo, const floating *p, int64_t nr, int64_t t0,
                      int64_t a, int64_t e, floating *o, int64_t dvp, const floating *qp, bint bdqk,
                      const floating *pm,
                      int64_t t1, int64_t nn, floating *sn, int64_t lim) noexcept nogil:
    """O += P . V over keys t0+a..t0+e-1 (p rows BLOCK_K apart, indexed from t0)
    and, with nn > 0, the scores of the next tile's keys t1..t1+nn-1 into sn:
    the value runs and the next tile's key runs side by side, one fused reader
    call per pair (fa_pv_qk_row1 for one row, pv_qk_chunks for more), the P.V
    alone per run without nn.  The same per-key order as the contiguous
    readers: P.V accumulates key by key, and a score depends on its key alone."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t tv = t0 + a, tk = t1, xv, xk
    cdef const char *vrow
    cdef const char *krow
    while tv < t0 + e or tk < t1 + nn:
        xv = run_end(P, tv, t0 + e) if tv < t0 + e else tv
        xk = run_end(P, tk, t1 + nn) if tk < t1 + nn else tk
        vrow = stored_at(&P.v, vbo + (row_at(P, &P.v, tv) if xv > tv else 0))
        if nn == 0:
            unit_pv_rows(P, pm, p + (tv - t0), nr, vrow, P.v.sr, 0, xv - tv, o, dvp,
                         run_pfo(P, &P.v, vbo, tv, xv, lim, P.Dv))
        else:
            # called without prefetch offsets (stored_pv_qk_row1, pv_qk_chunks): the next runs'
            # first rows are requested here (the paged lockstep passes offsets instead,
            # lockstep_pv_qk_row1; one unit alone was not measured with them)
            prefetch_run(P, &P.v, vbo, xv, lim, P.Dv)
            prefetch_run(P, &P.k, kbo, xk, lim, P.Dk)
            krow = stored_at(&P.k, kbo + (row_at(P, &P.k, tk) if xk > tk else 0))
            if nr == 1:
                stored_pv_qk_row1(P.v.store, p + (tv - t0), vrow, P.v.sr, 0, xv - tv, o, dvp // W, qp, P.Dk, krow,
                                  P.k.sr, xk - tk, sn + (tk - t1))
            else:
                pv_qk_chunks(P, p + (tv - t0), nr, vrow, 0, xv - tv, o, dvp, qp, bdqk, pm, krow, xk - tk,
                             sn + (tk - t1))
        tv = xv
        tk = xk


# ---------------------------------------------------------------- the query-vectorised unit
# (qvec_unit.pxi): a paged tile of the compute type in one run of slots is read
# like contiguous rows, one of a few runs in place, its kernels called once per
# run (TileSource.kpaged / vpaged); a tile of more runs, and other storage
# types, are widened -- copied -- into the workspace run by run
# (pack_rows_widened).  Per run, the QK kernel ends on a partial block of keys
# (16 keys: 6 + 6 + 4) and the P.V kernel reloads its accumulators: measured
# (AMD EPYC, AVX-512, one thread, 256 queries x 4 heads against 2304 keys, D
# 128, against contiguous caches) in place 1.15-1.18x the contiguous time at
# block size 16, 1.10x at 32, 1.035x at 64; copied 1.08x, 1.06x, 1.04-1.05x.
# A copied tile serves every row of its unit, so such calls run units of
# BLOCK_Q_QVEC_COPY rows (qvec_unit_rows, varlen.pxi): on a Zen 4 the copy of
# scattered 8 KiB blocks ran at ~7 GB/s and took 14 % of the time at 128 rows
# per unit, 10 % at 256.

cdef enum:
    QVEC_RUNS_IN_PLACE = 2   # a tile of at most this many runs is read in place
    TILE_ROWS = 0            # the tile's rows lie sr apart (contiguous keys, or one run of slots)
    TILE_RUNS = 1            # paged, read in place run by run
    TILE_COPY = 2            # paged, copied into the workspace


cdef inline int paged_tile_kind(const Plan *P, int64_t t0, int64_t t1) noexcept nogil:
    """How the query-vectorised unit reads keys t0..t1-1 (TILE_*)."""
    if P.pages == NULL or run_end(P, t0, t1) == t1:
        return TILE_ROWS
    if (t1 - 1) // P.page - t0 // P.page + 1 <= QVEC_RUNS_IN_PLACE:
        return TILE_RUNS
    return TILE_COPY

cdef inline void tile_qk_chunk(const Plan *P, const TileSource *T, const floating *qt, int64_t ldq, floating *st,
                               int64_t lds, int64_t j0, int64_t j1, floating *mx, int nv, int pf,
                               double scale) noexcept nogil:
    """qvec_qk_chunk over keys [j0, j1) of tile T: one call, or one per run of
    paged slots (a score depends on its key alone: the same bits).  scale: what
    the bfloat16 pair products multiply by (P.scale, or 1 where the softmax
    applies it: qvec_amx_softmax_pv)."""
    cdef int64_t j, x
    if floating is float:
        if T.kstore == STORE_BF16:      # bfloat16 pair dot products (qvec_bf16_dot)
            fa_qvec_qk_chunk_bd(<const uint16_t *>T.k, T.ksr, qt, ldq, P.Dk, <float>scale, st, lds, j0, j1,
                                mx, nv, pf)
            return
    if not T.kpaged:
        qvec_qk_chunk(<const floating *>T.k, T.ksr, T.ksc, qt, ldq, P.Dk, st, lds, j0, j1, mx, nv, pf)
        return
    j = j0
    while j < j1:
        x = run_end(P, T.t0 + j, T.t0 + j1) - T.t0
        qvec_qk_chunk(<const floating *>(T.k + row_at(P, &P.k, T.t0 + j) * P.k.item), T.ksr, T.ksc, qt, ldq, P.Dk,
                      st + j * lds, lds, 0, x - j, mx, nv, pf)
        j = x


cdef inline void tile_pv_chunk(const Plan *P, const TileSource *T, const floating *pt, int64_t lds, int64_t j0,
                               int64_t j1, floating *ot, int64_t ldo, int nv) noexcept nogil:
    """qvec_pv_chunk over keys [j0, j1) of tile T: one call, or one per run of
    paged slots (Ot accumulates key by key: the same bits)."""
    cdef int64_t j, x
    if not T.vpaged:
        qvec_pv_chunk(<const floating *>T.v, T.vsr, T.vsc, P.Dv, pt, lds, j0, j1, ot, ldo, nv)
        return
    j = j0
    while j < j1:
        x = run_end(P, T.t0 + j, T.t0 + j1) - T.t0
        qvec_pv_chunk(<const floating *>(T.v + row_at(P, &P.v, T.t0 + j) * P.v.item), T.vsr, T.vsc, P.Dv,
                      pt + j * lds, lds, 0, x - j, ot, ldo, nv)
        j = x


cdef inline double tile_value(const Plan *P, const TileSource *T, int64_t j, int64_t c) noexcept nogil:
    """Value c of key j of tile T."""
    if T.vpaged:
        return stored_value(T.vstore, T.v, row_at(P, &P.v, T.t0 + j) + c * T.vsc)
    return stored_value(T.vstore, T.v, j * T.vsr + c * T.vsc)


cdef int paged_nonfinite(const Plan *P, const char *vbase, int64_t t0, int64_t t1, floating dummy) noexcept nogil:
    """Do the paged value rows t0..t1-1 (of the compute type) hold an inf or NaN?"""
    cdef int64_t t = t0, x
    while t < t1:
        x = run_end(P, t, t1)
        if block_nonfinite(<const floating *>(vbase + row_at(P, &P.v, t) * P.v.item), x - t, P.Dv, P.v.sr, P.v.sc):
            return 1
        t = x
    return 0
