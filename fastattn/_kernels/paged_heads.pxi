# Paged decode with the key/value heads of a block in lockstep.  A cache block
# (num_blocks, Hkv, block_size, D) holds every head's slots one after another:
# read head by head over the whole sequence, a unit of one head reads 8 KiB
# here and 8 KiB there (block 16, D 128, float32), scattered over the cache --
# a pattern memory serves at about half the bandwidth of one stream (measured
# on an AMD EPYC VM, one core: 20 GB/s for random 8 KiB chunks against 40
# sequential and 30-34 for 64 KiB chunks).  Here the few-rows units of up to
# HEADS_LOCKSTEP heads of a sequence run tile by tile together, and within a
# tile each run of slots is read for every head in turn: the block's heads,
# one stretch of memory.  Each head keeps its own unit (row_unit.pxi: its
# begin, online softmax and finish), so the results are those of the
# separate units, bit for bit.  While a run is read, each head's rows request
# their counterparts in the next run's block (next_run_rows, paged_reads.pxi).
# One query row per head (MHA decode): each tile's P.V pass also computes the
# next tile's scores, value runs and key runs side by side
# (lockstep_pv_qk_row1), as the contiguous decode fuses them.

cdef enum:
    HEADS_LOCKSTEP = 8   # heads of one block read together (8 x 8 KiB: a 64 KiB stretch)


cdef inline int lockstep_heads(const Plan *P, int64_t nrows, size_t item) noexcept nogil:
    """Do the heads of a paged sequence with nrows query rows per head run in
    lockstep?  Units of few rows with keys and values read in place (the
    conditions of row_unit_begin), more than one head."""
    cdef int64_t W = FA_VBYTES // <int64_t>item
    return (P.pages != NULL and P.nbatch > 1 and nrows <= FEW_MAX_ROWS and P.k.sc == 1 and P.v.sc == 1
            and P.Dv > 0 and P.Dv % W == 0 and not P.has_mask and P.k.store < STORE_U8Z and P.v.store < STORE_U8Z)


cdef inline void lockstep_scores(const Plan *P, Workspace **ws, RowUnit *U, int64_t nh, int64_t nr,
                                 const int64_t *ksoff, const int64_t *vsoff, bint per_key, int64_t t0, int64_t t1,
                                 int64_t hi_all, floating dummy) noexcept nogil:
    """The scores of keys [t0, t1) (one tile) for every head into U[h].s, run
    by run: each run of slots read for every head in turn; the heads' per-key
    scales of the keys a tile on are requested as each run is read."""
    cdef int64_t t = t0, x, h, pfo
    cdef bint scales_ahead
    while t < t1:
        x = run_end(P, t, t1)
        pfo = run_pfo(P, &P.k, U[0].kbo, t, x, hi_all, P.Dk)
        # the scales the online softmax reads a tile on
        scales_ahead = per_key and t + BLOCK_K < hi_all
        for h in range(nh):
            if scales_ahead:
                prefetch_head_scales(P, ksoff[h], vsoff[h], t + BLOCK_K, min(x + BLOCK_K, hi_all))
            unit_qk_rows(P, U[h].bdqk, <floating *>ws[h].qp, nr, stored_at(&P.k, U[h].kbo + row_at(P, &P.k, t)),
                         x - t, (<floating *>U[h].s) + (t - t0), pfo)
        t = x


cdef void lockstep_pv_qk_row1(const Plan *P, Workspace **ws, RowUnit *U, int64_t nh, const int64_t *a,
                              const int64_t *e, const int64_t *ksoff, const int64_t *vsoff, bint per_key, int64_t t0,
                              int64_t t1, int64_t nn, int64_t hi_all, floating dummy) noexcept nogil:
    """One query row per head: O += P . V over each head's keys t0+a[h]..t0+e[h]-1
    and the next tile's scores (keys t1..t1+nn-1, into U[h].s2) in one pass per
    pair of runs -- a run of value slots and a run of the next tile's key slots,
    each read for every head in turn, side by side (fa_pv_qk_row1, as the
    contiguous decode fuses them), every row requesting its counterpart a block
    on (run_pfo).  Per head the same value runs as the separate passes, and a
    score depends on its key alone: the same bits."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t va = t1 - t0, ve = 0, h, tv, tk, xv, xk, x0, x1, pfv, pfk
    cdef bint scales_ahead
    cdef const char *vrow
    cdef const char *krow
    # the value slots any head sees (every head sees the same keys here)
    for h in range(nh):
        if a[h] < e[h]:
            va = min(va, a[h])
            ve = max(ve, e[h])
    if va >= ve:
        va = ve = 0
    tv = t0 + va
    tk = t1
    while tv < t0 + ve or tk < t1 + nn:
        xv = run_end(P, tv, t0 + ve) if tv < t0 + ve else tv
        xk = run_end(P, tk, t1 + nn) if tk < t1 + nn else tk
        pfv = run_pfo(P, &P.v, U[0].vbo, tv, xv, hi_all, P.Dv) if xv > tv else 0
        pfk = run_pfo(P, &P.k, U[0].kbo, tk, xk, hi_all, P.Dk) if xk > tk else 0
        scales_ahead = per_key and xk > tk and tk + BLOCK_K < hi_all
        for h in range(nh):
            if scales_ahead:
                prefetch_head_scales(P, ksoff[h], vsoff[h], tk + BLOCK_K, min(xk + BLOCK_K, hi_all))
            x0 = max(tv, t0 + a[h])
            x1 = min(xv, t0 + e[h])
            if x1 < x0:
                x1 = x0
            vrow = stored_at(&P.v, U[h].vbo + (row_at(P, &P.v, x0) if x1 > x0 else 0))
            krow = stored_at(&P.k, U[h].kbo + (row_at(P, &P.k, tk) if xk > tk else 0))
            stored_pv_qk_row1_po(P.v.store, (<floating *>U[h].s) + (x0 - t0), vrow, P.v.sr, 0, x1 - x0,
                                 <floating *>ws[h].o, U[h].dvp // W, <floating *>ws[h].qp, P.Dk, krow, P.k.sr,
                                 xk - tk, (<floating *>U[h].s2) + (tk - t1), pfv, pfk)
        tv = xv
        tk = xk


cdef void run_paged_heads(const Plan *P, Workspace **ws, int64_t b0, int64_t nh, int64_t nr, int64_t kb,
                          int64_t ke, int mode, floating *part_o, floating *part_m, double *part_l,
                          int64_t hstride) noexcept nogil:
    """Rows 0..nr-1 of key/value heads b0..b0+nh-1 (nh <= HEADS_LOCKSTEP, one
    workspace each) of a paged sequence against keys [kb, ke): per tile the
    scores of every head run by run, each head's online softmax, then P.V run
    by run (values holding inf / NaN: that head's tile again, exactly).  One
    row per head (MHA decode), keys and values of one storage type (not int8),
    a block's rows of a head one after another: each tile's P.V also computes
    the next tile's scores (lockstep_pv_qk_row1).
    MODE_PARTIAL: head h's partial results at part_* + h * hstride rows."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef RowUnit U[HEADS_LOCKSTEP]
    cdef int64_t a[HEADS_LOCKSTEP]
    cdef int64_t e[HEADS_LOCKSTEP]
    cdef int64_t h, i, t0, t1, t, x, x0, x1, dvp, lo_all, hi_all, pfo
    cdef int64_t ksoff[HEADS_LOCKSTEP]
    cdef int64_t vsoff[HEADS_LOCKSTEP]
    cdef bint per_key, fuse1
    cdef floating *o
    cdef floating *vp
    cdef char *sw
    for h in range(nh):
        U[h].b = b0 + h
        U[h].r0 = 0
        U[h].nr = nr
        U[h].kb = kb
        U[h].ke = ke
        U[h].mode = mode
        U[h].lockstep = 1
        row_unit_begin(P, ws[h], &U[h], <floating *>NULL)
    for h in range(nh):
        # the per-key scales of head h's keys (a unit's rows share its key / value head)
        ksoff[h] = key_scale_offset(P, &P.ks, U[h].b, ws[h].goff[0]) if P.kscale == SCALE_PER_KEY else 0
        vsoff[h] = key_scale_offset(P, &P.vs, U[h].b, ws[h].goff[0]) if P.vscale == SCALE_PER_KEY else 0
    per_key = P.kscale == SCALE_PER_KEY or P.vscale == SCALE_PER_KEY
    # (rows of a run one after another: in vLLM's layout, a head's rows a slot
    # apart, fusing measured 0.91x -- two strided streams per head; int8 caches,
    # 2 KiB runs with per-key scales, 0.94-0.96x: both keep the separate passes)
    fuse1 = (nr == 1 and P.k.store == P.v.store and P.k.store != STORE_I8 and U[0].need_pv and P.k.sr == P.Dk
             and P.v.sr == P.Dv)
    # every head of a sequence sees the same keys (the same rows, no mask)
    lo_all = U[0].lo_all
    hi_all = U[0].hi_all
    dvp = U[0].dvp
    if per_key:
        for h in range(nh):
            prefetch_head_scales(P, ksoff[h], vsoff[h], lo_all, min(lo_all + BLOCK_K, hi_all))
    if fuse1 and lo_all < hi_all:
        lockstep_scores(P, ws, U, nh, nr, ksoff, vsoff, per_key, lo_all, min(lo_all + BLOCK_K, hi_all), hi_all,
                        <floating>0)
    t0 = lo_all
    while t0 < hi_all:
        t1 = min(t0 + BLOCK_K, hi_all)
        if not fuse1:
            lockstep_scores(P, ws, U, nh, nr, ksoff, vsoff, per_key, t0, t1, hi_all, <floating>0)
        for h in range(nh):
            row_tile_softmax(P, ws[h], &U[h], <floating *>NULL, t0, t1 - t0)
            rows_key_span(ws[h], 0, nr, t0, t1 - t0, &a[h], &e[h])
            if t0 != lo_all:
                # kept for the exact redo of a tile whose values hold inf / NaN (row_tile_pv)
                o = <floating *>ws[h].o
                vp = <floating *>ws[h].vp
                for i in range(nr * dvp):
                    vp[i] = o[i]
        if fuse1:
            lockstep_pv_qk_row1(P, ws, U, nh, a, e, ksoff, vsoff, per_key, t0, t1, min(BLOCK_K, hi_all - t1),
                                hi_all, <floating>0)
        else:
            t = t0
            while t < t1:
                x = run_end(P, t, t1)
                pfo = run_pfo(P, &P.v, U[0].vbo, t, x, hi_all, P.Dv)
                for h in range(nh):
                    x0 = max(t, t0 + a[h])
                    x1 = min(x, t0 + e[h])
                    if x0 < x1:
                        unit_pv_rows(P, <const floating *>ws[h].pm if U[h].bdpv else NULL,
                                     (<floating *>U[h].s) + (x0 - t0), nr,
                                     stored_at(&P.v, U[h].vbo + row_at(P, &P.v, x0)), P.v.sr, 0, x1 - x0,
                                     <floating *>ws[h].o, dvp, pfo)
                t = x
        for h in range(nh):
            o = <floating *>ws[h].o
            if a[h] < e[h] and block_nonfinite(o, nr, P.Dv, dvp, 1):
                vp = <floating *>ws[h].vp
                for i in range(nr * dvp):
                    o[i] = vp[i] if t0 != lo_all else 0
                pv_rows_exact(P, ws[h], <floating *>U[h].s, P.v.store, <const char *>NULL, 0, o, dvp, 0, nr, t0,
                              t1 - t0, U[h].mbo, U[h].vbo)
            if fuse1:
                # the next tile's scores are in s2: swap the buffers
                sw = U[h].s
                U[h].s = U[h].s2
                U[h].s2 = sw
        t0 = t1
    for h in range(nh):
        if mode == MODE_PARTIAL:
            row_unit_finish(P, ws[h], &U[h], <floating *>NULL, part_o + h * hstride * P.Dv, part_m + h * hstride,
                            part_l + h * hstride)
        else:
            row_unit_finish(P, ws[h], &U[h], <floating *>NULL, <floating *>NULL, <floating *>NULL, <double *>NULL)
