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

cdef enum:
    HEADS_LOCKSTEP = 8   # heads of one block read together (8 x 8 KiB: a 64 KiB stretch)


cdef inline int lockstep_heads(const Plan *P, int64_t nrows, size_t item) noexcept nogil:
    """Do the heads of a paged sequence with nrows query rows per head run in
    lockstep?  Units of few rows with keys and values read in place (the
    conditions of row_unit_begin), more than one head."""
    cdef int64_t W = FA_VBYTES // <int64_t>item
    return (P.pages != NULL and P.nbatch > 1 and nrows <= FEW_MAX_ROWS and P.k.sc == 1 and P.v.sc == 1
            and P.Dv > 0 and P.Dv % W == 0 and not P.has_mask and P.k.store < STORE_U8Z and P.v.store < STORE_U8Z)


cdef void run_paged_heads(const Plan *P, Workspace **ws, int64_t b0, int64_t nh, int64_t nr, int64_t kb,
                          int64_t ke, int mode, floating *part_o, floating *part_m, double *part_l,
                          int64_t hstride) noexcept nogil:
    """Rows 0..nr-1 of key/value heads b0..b0+nh-1 (nh <= HEADS_LOCKSTEP, one
    workspace each) of a paged sequence against keys [kb, ke): per tile the
    scores of every head run by run, each head's online softmax, then P.V run
    by run (values holding inf / NaN: that head's tile again, exactly).
    MODE_PARTIAL: head h's partial results at part_* + h * hstride rows."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef RowUnit U[HEADS_LOCKSTEP]
    cdef int64_t a[HEADS_LOCKSTEP]
    cdef int64_t e[HEADS_LOCKSTEP]
    cdef int64_t h, i, t0, t1, t, x, x0, x1, dvp, lo_all, hi_all, pfo
    cdef int64_t ksoff[HEADS_LOCKSTEP]
    cdef int64_t vsoff[HEADS_LOCKSTEP]
    cdef bint per_key, scales_ahead
    cdef floating *o
    cdef floating *vp
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
    # every head of a sequence sees the same keys (the same rows, no mask)
    lo_all = U[0].lo_all
    hi_all = U[0].hi_all
    dvp = U[0].dvp
    if per_key:
        for h in range(nh):
            prefetch_head_scales(P, ksoff[h], vsoff[h], lo_all, min(lo_all + BLOCK_K, hi_all))
    t0 = lo_all
    while t0 < hi_all:
        t1 = min(t0 + BLOCK_K, hi_all)
        t = t0
        while t < t1:
            x = run_end(P, t, t1)
            pfo = run_pfo(P, &P.k, U[0].kbo, t, x, hi_all, P.Dk)
            # the scales the online softmax reads a tile on
            scales_ahead = per_key and t + BLOCK_K < hi_all
            for h in range(nh):
                if scales_ahead:
                    prefetch_head_scales(P, ksoff[h], vsoff[h], t + BLOCK_K, min(x + BLOCK_K, hi_all))
                stored_qk_rows_po(P.k.store, <floating *>ws[h].qp, P.Dk, nr, P.Dk,
                                  stored_at(&P.k, U[h].kbo + row_at(P, &P.k, t)), P.k.sr, x - t,
                                  (<floating *>U[h].s) + (t - t0), BLOCK_K, pfo)
            t = x
        for h in range(nh):
            row_tile_softmax(P, ws[h], &U[h], <floating *>NULL, t0, t1 - t0)
            rows_key_span(ws[h], 0, nr, t0, t1 - t0, &a[h], &e[h])
            if t0 != lo_all:
                # kept for the exact redo of a tile whose values hold inf / NaN (row_tile_pv)
                o = <floating *>ws[h].o
                vp = <floating *>ws[h].vp
                for i in range(nr * dvp):
                    vp[i] = o[i]
        t = t0
        while t < t1:
            x = run_end(P, t, t1)
            pfo = run_pfo(P, &P.v, U[0].vbo, t, x, hi_all, P.Dv)
            for h in range(nh):
                x0 = max(t, t0 + a[h])
                x1 = min(x, t0 + e[h])
                if x0 < x1:
                    stored_pv_rows_po(P.v.store, (<floating *>U[h].s) + (x0 - t0), BLOCK_K, nr,
                                      stored_at(&P.v, U[h].vbo + row_at(P, &P.v, x0)), P.v.sr, 0, x1 - x0,
                                      <floating *>ws[h].o, dvp, dvp // W, pfo)
            t = x
        for h in range(nh):
            o = <floating *>ws[h].o
            if a[h] < e[h] and block_nonfinite(o, nr, P.Dv, dvp, 1):
                vp = <floating *>ws[h].vp
                for i in range(nr * dvp):
                    o[i] = vp[i] if t0 != lo_all else 0
                pv_rows_exact(P, ws[h], <floating *>U[h].s, P.v.store, <const char *>NULL, 0, o, dvp, 0, nr, t0,
                              t1 - t0, U[h].mbo, U[h].vbo)
        t0 = t1
    for h in range(nh):
        if mode == MODE_PARTIAL:
            row_unit_finish(P, ws[h], &U[h], <floating *>NULL, part_o + h * hstride * P.Dv, part_m + h * hstride,
                            part_l + h * hstride)
        else:
            row_unit_finish(P, ws[h], &U[h], <floating *>NULL, <floating *>NULL, <floating *>NULL, <double *>NULL)
