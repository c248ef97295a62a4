# Paged keys and values (attention_paged) read in place by the few-rows unit
# (row_unit.pxi): key t of a sequence is slot t % page of cache block
# pages[t // page] (row_at), so a tile of BLOCK_K keys is a few runs of rows
# stored one after another.  The in-place readers (scores, P.V, both fused) run
# once per run; the online softmax still runs once per tile, so a block size
# of 16 costs a few kernel calls per tile, not a softmax update per block.
# While a run is read, the first rows of the next one are requested: its block
# lies anywhere in the cache, out of reach of the readers' own prefetch (a
# fixed distance ahead within a run).

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


cdef void paged_qk_rows(const Plan *P, const floating *qp, int64_t nr, int64_t kbo, int64_t t0, int64_t n,
                        int64_t lim, floating *s) noexcept nogil:
    """Scores of nr packed query rows against keys t0..t0+n-1 read in place (s
    rows BLOCK_K apart), one stored_qk_rows call per run; keys up to lim are
    requested a run ahead."""
    cdef int64_t t = t0, e
    while t < t0 + n:
        e = run_end(P, t, t0 + n)
        prefetch_run(P, &P.k, kbo, e, lim, P.Dk)
        stored_qk_rows(P.k.store, qp, P.Dk, nr, P.Dk, stored_at(&P.k, kbo + row_at(P, &P.k, t)), P.k.sr, e - t,
                       s + (t - t0), BLOCK_K)
        t = e


cdef void paged_pv_qk(const Plan *P, int64_t kbo, int64_t vbo, const floating *p, int64_t nr, int64_t t0,
                      int64_t a, int64_t e, floating *o, int64_t dvp, const floating *qp, int64_t t1, int64_t nn,
                      floating *sn, int64_t lim) noexcept nogil:
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
        prefetch_run(P, &P.v, vbo, xv, lim, P.Dv)
        vrow = stored_at(&P.v, vbo + (row_at(P, &P.v, tv) if xv > tv else 0))
        if nn == 0:
            stored_pv_rows(P.v.store, p + (tv - t0), BLOCK_K, nr, vrow, P.v.sr, 0, xv - tv, o, dvp, dvp // W)
        else:
            prefetch_run(P, &P.k, kbo, xk, lim, P.Dk)
            krow = stored_at(&P.k, kbo + (row_at(P, &P.k, tk) if xk > tk else 0))
            if nr == 1:
                stored_pv_qk_row1(P.v.store, p + (tv - t0), vrow, P.v.sr, 0, xv - tv, o, dvp // W, qp, P.Dk, krow,
                                  P.k.sr, xk - tk, sn + (tk - t1))
            else:
                pv_qk_chunks(P, p + (tv - t0), nr, vrow, 0, xv - tv, o, dvp, qp, krow, xk - tk, sn + (tk - t1))
        tv = xv
        tk = xk
