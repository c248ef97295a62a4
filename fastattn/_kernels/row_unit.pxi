# The row-major work unit: a block of query rows against a key range, rows of
# scores over keys (lanes over the head dimension or over keys).  Few rows
# (decode, draft tokens, GQA groups) read keys and values in place; more rows
# pack tiles for the register-blocked micro-kernels.

cdef void pv_rows_exact(const Plan *P, const Workspace *ws, const floating *s, int vstore, const char *vsrc,
                        int64_t ldv, floating *o, int64_t dvp, int64_t r0, int64_t nr, int64_t t0, int64_t n,
                        int64_t mbo, int64_t vbo_paged) noexcept nogil:
    """O += P . V one row at a time over exactly the keys each row sees.

    Used for tiles whose values hold inf/NaN: the blocked kernel multiplies the
    zero probabilities of invisible keys by those values too (0 * NaN = NaN), so
    a NaN in a masked-out KV-cache slot would leak into rows that never see it.
    vbo_paged >= 0: the values are paged rows read in place (batch offset
    vbo_paged; vsrc, ldv unused)."""
    cdef int64_t i, j, c, a, e, grp, pos
    cdef const uint8_t *mask = NULL
    cdef const char *vrow
    cdef floating p
    for i in range(nr):
        a = ws.lo[i] - t0
        e = ws.hi[i] - t0
        if a < 0:
            a = 0
        if e > n:
            e = n
        if P.has_mask:
            grp = ws.goff[i]
            pos = r0 + i - grp * P.Lq
            mask = (<const uint8_t *>P.mask.base) + mbo + grp * P.mask.sg + pos * P.mask.sr
        for j in range(a, e):
            if P.has_mask and not mask[(t0 + j) * P.mask.sc]:
                continue
            p = s[i * BLOCK_K + j]
            if vbo_paged >= 0:
                vrow = stored_at(&P.v, vbo_paged + row_at(P, &P.v, t0 + j))
                for c in range(P.Dv):
                    o[i * dvp + c] += p * <floating>stored_value(vstore, vrow, c)
                continue
            for c in range(P.Dv):
                o[i * dvp + c] += p * <floating>stored_value(vstore, vsrc, j * ldv + c)

cdef inline void rows_key_span(const Workspace *ws, int64_t i0, int64_t i1, int64_t t0, int64_t n,
                               int64_t *a, int64_t *e) noexcept nogil:
    """[a, e): the keys of tile [t0, t0 + n) that any of rows i0..i1-1 can see (tile-relative)."""
    cdef int64_t i
    a[0] = n
    e[0] = 0
    for i in range(i0, i1):
        if ws.hi[i] > ws.lo[i]:
            a[0] = min(a[0], max(ws.lo[i] - t0, 0))
            e[0] = max(e[0], min(ws.hi[i] - t0, n))

cdef inline void unit_qk_rows(const Plan *P, bint bdqk, const floating *qp, int64_t nr, const char *k, int64_t n,
                              floating *s, int64_t pfo) noexcept nogil:
    """The scores of a few-rows unit's nr rows against n key rows at k (read in
    place), BLOCK_K apart in s: by pair dot products where bdqk (row_bf16_dot; qp
    then holds the bfloat16 query rows), else from the packed rows qp; the key
    rows requested pfo rows on (FA_PF_AUTO: the kernel's distance)."""
    if bdqk:
        if floating is float:
            fa_qk_rows_bd(<const uint16_t *>qp, P.Dk, nr, P.Dk, <const uint16_t *>k, P.k.sr, n, <float>P.scale,
                          s, BLOCK_K, pfo)
    else:
        stored_qk_rows_po(P.k.store, qp, P.Dk, nr, P.Dk, k, P.k.sr, n, s, BLOCK_K, pfo)

cdef inline void unit_pv_rows(const Plan *P, const floating *pm, const floating *p, int64_t nr, const char *v,
                              int64_t ldv, int64_t k0, int64_t k1, floating *o, int64_t dvp,
                              int64_t pfo) noexcept nogil:
    """O += P . V for a few-rows unit's nr rows (P rows BLOCK_K apart) over the value
    rows k0..k1-1 at v (read in place, ldv apart): by pair dot products where pm is
    not NULL (row_bf16_pv: pm[i] the tile's largest P of row i, P rounded to
    bfloat16 against it, fa_pv_rows_bd), else widened (fa_pv_rows); the value rows
    requested pfo rows on (FA_PF_AUTO: the kernel's distance)."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    if pm != NULL:
        if floating is float:
            fa_pv_rows_bd(p, BLOCK_K, nr, <const uint16_t *>v, ldv, k0, k1, o, dvp, P.Dv, pm, pfo)
    else:
        stored_pv_rows_po(P.v.store, p, BLOCK_K, nr, v, ldv, k0, k1, o, dvp, dvp // W, pfo)


cdef inline void pv_qk_chunks(const Plan *P, const floating *p, int64_t nr, const char *v, int64_t a,
                              int64_t e, floating *o, int64_t dvp, const floating *qp, bint bdqk,
                              const floating *pm, const char *kn, int64_t nn, floating *sn) noexcept nogil:
    """O += P . V over keys [a, e) of this tile (rows BLOCK_K apart in p; value rows
    v stored in place) and the scores of the next tile's first nn keys (kn, stored
    like v) into sn, in alternating chunks of FUSE_CHUNK keys.  A chunk boundary
    is a multiple of every key group of fa_qk_rows, so the scores are those of
    one qk_rows call bit for bit; P.V accumulates key by key, summed per chunk
    (two-level sums: the last bits follow FUSE_CHUNK)."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t c = 0, c1, x0, x1
    cdef int64_t top = e if e > nn else nn
    while c < top:
        c1 = c + FUSE_CHUNK
        x0 = a if a > c else c
        x1 = e if e < c1 else c1
        if x0 < x1:
            unit_pv_rows(P, pm, p, nr, v, P.v.sr, x0, x1, o, dvp, FA_PF_AUTO)
        x1 = nn if nn < c1 else c1
        if c < x1:
            unit_qk_rows(P, bdqk, qp, nr, kn + c * P.k.sr * P.k.item, x1 - c, sn + c, FA_PF_AUTO)
        c = c1

cdef struct RowUnit:
    # a row-major unit: rows r0..r0+nr-1 of batch element b against keys [kb, ke)
    int64_t b, r0, nr, kb, ke
    int mode                   # MODE_ONLINE / MODE_STATS / MODE_WEIGHTS / MODE_PARTIAL
    int64_t dvp                # Dv rounded up to a vector: the accumulator's row stride
    int64_t lo_all, hi_all     # the keys any of the rows sees
    int64_t kbo, vbo, mbo, bbo, wbo    # batch offsets of k, v, mask, bias, weights
    int few                    # at most FEW_MAX_ROWS rows: the few-rows kernels
    int k_in_place, v_in_place # keys / values read where they are stored (no packing)
    int kq_in_place, vq_in_place   # QuantizedKV keys / values read in place (few rows: quantized_in_place)
    int fuse                   # each tile's P.V pass also computes the next tile's scores
    int bdqk                   # scores by bfloat16 pair dot products (row_bf16_dot; Qp holds bfloat16 rows)
    int bdpv                   # P.V by bfloat16 pair dot products (row_bf16_pv)
    int lockstep               # driven tile by tile beside the other heads of a paged block (paged_heads.pxi)
    int need_pv                # a pass that accumulates P.V (all but MODE_STATS)
    int needs_options          # softcap, bias, ALiBi or a mask
    char *s                    # this tile's scores, BLOCK_K apart
    char *s2                   # the next tile's scores when fusing (swapped with s per tile)


cdef inline bint row_bf16_dot(const Plan *P, const RowUnit *U, floating dummy) noexcept nogil:
    """Scores of a few-rows unit by bfloat16 pair dot products (fa_qk_rows_bd): float
    compute on a target with them, bfloat16 queries and keys, the keys read in
    place (unit_qk_rows, paged runs too; no key scales; a fused or lockstep unit
    of one row reads them in fa_pv_qk_row1 instead), whole vectors of pairs per
    row.  The products are exact and the scale multiplies the sums, as in the
    query-vectorised unit's qvec_bf16_dot.  Not on an AMX target (FA_AMX: Intel
    cores, where VDPBF16PS is slower than widening)."""
    return (floating is float and FA_BF16_DOT != 0 and FA_AMX == 0 and P.q.store == STORE_BF16 and P.k.store == STORE_BF16
            and U.k_in_place and not (U.nr == 1 and (U.fuse or U.lockstep))
            and P.kscale == SCALE_NONE and P.Dk > 0 and P.Dk % (FA_VBYTES // 2) == 0)


cdef inline bint row_bf16_pv(const Plan *P, const RowUnit *U, floating dummy) noexcept nogil:
    """P.V of a few-rows unit of two or more rows by bfloat16 pair dot products
    (fa_pv_rows_bd): float compute on a target with them, bfloat16 queries, keys
    and values (as the query-vectorised unit's qvec_bf16_pv), the values read in
    place without scales, whole chunks of FA_BF16_PACK_COLS columns, a pass that
    accumulates P.V with the online softmax (not return_weights' second pass).
    P is rounded to bfloat16 against the tile's largest per row (ws.pm, kept by
    row_tile_softmax: the largest exactly 1), as the query-vectorised unit
    rounds P against each tile's max; l sums the unrounded P.  A unit of one row
    (MHA decode, fa_pv_qk_row1) keeps the widened loop.  Not on an AMX target
    (row_bf16_dot)."""
    return (floating is float and FA_BF16_PV != 0 and FA_AMX == 0 and P.q.store == STORE_BF16 and P.k.store == STORE_BF16
            and P.v.store == STORE_BF16 and U.few and U.v_in_place and U.nr >= 2 and U.need_pv
            and U.mode != MODE_WEIGHTS
            and P.vscale == SCALE_NONE and P.Dv > 0 and P.Dv % FA_BF16_PACK_COLS == 0)


cdef void row_unit_begin(const Plan *P, Workspace *ws, RowUnit *U, floating *stats) noexcept nogil:
    """Decide the unit's kernels, find each row's visible keys, pack the queries
    and zero the accumulators (and, for MODE_WEIGHTS, fill the weight rows)."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t nr = U.nr, Rp = round_up(nr, FA_PV_MR), i, j
    cdef floating *s = <floating *>ws.s
    cdef floating *m = <floating *>ws.m
    cdef floating *o = <floating *>ws.o
    cdef floating *wrow
    cdef floating fill
    U.dvp = round_up(P.Dv if P.Dv > 0 else 1, W)
    U.kbo = batch_offset(P, &P.k, U.b)
    U.vbo = batch_offset(P, &P.v, U.b)
    U.mbo = batch_offset(P, &P.mask, U.b) if P.has_mask else 0
    U.bbo = batch_offset(P, &P.bias, U.b) if P.has_bias else 0
    U.wbo = batch_offset(P, &P.w, U.b) if U.mode == MODE_WEIGHTS else 0
    U.need_pv = U.mode != MODE_STATS
    U.needs_options = P.softcap > 0 or P.has_bias or P.has_alibi or P.has_mask
    # few rows: dot products straight from the key rows and values read in place
    # (no packing), when the rows are contiguous and the values fill whole vectors.
    # Up to FEW_MAX_ROWS rows (14-16 are query-vectorised); paired against the packed
    # tiles and register-blocked kernels (AVX-512, 8 heads, 4096 keys, D 128):
    # 4 rows 1.41x, 8 rows 1.33x, 12 rows 1.14-1.20x, 13-14 rows 1.10x, 15 rows 1.0x
    U.few = nr <= FEW_MAX_ROWS
    U.k_in_place = U.few and P.k.sc == 1 and not is_quantized(&P.k)
    U.v_in_place = U.few and P.v.sc == 1 and P.Dv % W == 0 and P.Dv > 0 and not is_quantized(&P.v)
    U.kq_in_place = U.few and quantized_in_place(&P.k, P.kgroup, <floating>0)
    U.vq_in_place = U.few and U.need_pv and P.Dv > 0 and quantized_in_place(&P.v, P.vgroup, <floating>0)
    # few rows with keys and values read in place (decode, draft tokens, GQA
    # groups): each tile's P.V pass also computes the next tile's scores, so keys
    # and values stream side by side (one row: fa_pv_qk_row1, key by key; more
    # rows: alternating chunks of FUSE_CHUNK keys, see pv_qk_chunks).  The
    # scores are those of the separate passes bit for bit; P.V sums each
    # chunk's keys from zero, then adds them to O (two-level sums), so the
    # outputs can differ from one pass over the tile in the last bits (fixed
    # by the shape, never by the thread count).  The next scores go to rows
    # past the unit's own in the score buffer (FEW_MAX_ROWS of them are reserved).
    U.fuse = U.few and U.k_in_place and U.v_in_place and U.need_pv and P.k.store == P.v.store and not U.lockstep
    U.bdqk = row_bf16_dot(P, U, <floating>0)
    U.bdpv = row_bf16_pv(P, U, <floating>0)
    U.s = <char *>s
    U.s2 = <char *>(s + rows_alloc(nr) * BLOCK_K)

    setup_rows(P, ws, U.b, U.r0, nr, U.kb, U.ke, &U.lo_all, &U.hi_all)
    # Zero padding only where a kernel reads it (a decode step's units have one
    # row each: the fixed cost of a unit is most of such a call).  Query rows:
    # fa_qk_rows (keys in place) reads blocks of up to 8 rows, each padded to a
    # power of two, and a single row alone; fa_qk_block whole blocks of FA_QK_MR.
    if U.bdqk:
        # the query rows as stored (bfloat16, unscaled), zeros up to whole blocks of fa_qk_rows_bd
        fa_pack_rows_bd(<const uint16_t *>stored_at(&P.q, batch_offset(P, &P.q, U.b)), ws.qoff, P.q.sc, nr,
                        P.Dk, <uint16_t *>ws.qp, P.Dk, round_up(nr, FA_BD_QKR_MAX))
    else:
        pack_q(P, ws, stored_at(&P.q, batch_offset(P, &P.q, U.b)), U.b, nr,
               (1 if nr == 1 else round_up(nr, 8)) if U.k_in_place else rows_alloc(nr), <floating>0)
    # The packed P.V kernel (fa_pv_block) runs whole blocks of FA_PV_MR rows, so it
    # also reads the probability rows nr..Rp-1, which the QK kernel may never
    # write: zeros, not whatever the workspace held (subnormal garbage made every
    # FMA of those rows a microcode assist: the same call 2-3x slower in some
    # processes).  The few-rows kernel (fa_pv_rows) reads exactly nr rows.
    if U.few:
        Rp = nr
    for i in range(nr * BLOCK_K, Rp * BLOCK_K):
        s[i] = 0
    for i in range(Rp):
        m[i] = -INFINITY
        ws.l[i] = 0
    for i in range(Rp * U.dvp):
        o[i] = 0
    if U.mode == MODE_WEIGHTS:
        # every weight of the row is written: zeros first (NaN for a row whose lse
        # is NaN: the whole row is NaN, invisible keys too), visible keys below
        for i in range(nr):
            wrow = (<floating *>P.w.base) + U.wbo + ws.goff[i] * P.w.sg + (U.r0 + i - ws.goff[i] * P.Lq) * P.w.sr
            fill = stats[i] if stats[i] != stats[i] else 0
            for j in range(P.Lk):
                wrow[j * P.w.sc] = fill
    if U.fuse and U.lo_all < U.hi_all and P.pages != NULL:
        paged_qk_rows(P, U.bdqk, <floating *>ws.qp, nr, U.kbo, U.lo_all, min(BLOCK_K, U.hi_all - U.lo_all),
                      U.hi_all, s)
    elif U.fuse and U.lo_all < U.hi_all:
        unit_qk_rows(P, U.bdqk, <floating *>ws.qp, nr, stored_at(&P.k, U.kbo + U.lo_all * P.k.sr),
                     min(BLOCK_K, U.hi_all - U.lo_all), s, FA_PF_AUTO)


cdef int row_tile_scores(const Plan *P, Workspace *ws, const RowUnit *U, int64_t t0, int64_t n,
                         const char **vsrc, int64_t *ldv, int *vstore, floating dummy) noexcept nogil:
    """Load tile [t0, t0 + n): pack its keys and values unless read in place, and
    compute its scores (already computed when fusing).  Sets the value rows the
    P.V pass reads (vsrc, ldv apart, of storage type vstore); returns 1 when a
    packed value tile holds an inf or NaN."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t NR = FA_QK_NV * W
    cdef int64_t Dk = P.Dk, nr = U.nr, i0, a, e
    cdef floating *qp = <floating *>ws.qp
    cdef floating *kt = <floating *>ws.kt
    cdef floating *s = <floating *>U.s
    cdef const char *kbase = stored_at(&P.k, U.kbo)
    cdef int v_nonfinite = 0
    if U.kq_in_place:
        pass        # scores below, from the codes in place
    elif not U.k_in_place and is_quantized(&P.k):
        pack_k_tile_quantized(P, ws, U.b, kt, t0, n)
    elif not U.k_in_place:
        pack_k_tile(P, kt, kbase, t0, n)
    if not U.need_pv:
        v_nonfinite = 0
    elif U.v_in_place:
        # read in place; inf/NaN values are caught after the P.V update
        # (one pass over the values instead of two)
        # (paged values: vsrc unused, the P.V pass reads them run by run)
        vsrc[0] = stored_at(&P.v, U.vbo + (t0 * P.v.sr if P.pages == NULL else 0))
        ldv[0] = P.v.sr
        vstore[0] = P.v.store
    elif U.vq_in_place:
        vsrc[0] = NULL      # (pv_rows_quantized reads the codes in place)
        ldv[0] = 0
        vstore[0] = native_store(<floating>0)
    else:
        if is_quantized(&P.v):
            v_nonfinite = dequant_tile(P, &P.v, &P.vs, &P.vz, P.vgroup, U.b, <floating *>ws.vp, U.dvp, t0, n, P.Dv)
        else:
            v_nonfinite = pack_v_tile(P, <floating *>ws.vp, U.dvp, stored_at(&P.v, U.vbo), t0, n)
        vsrc[0] = <const char *>ws.vp
        ldv[0] = U.dvp
        vstore[0] = native_store(<floating>0)

    # S = Qp . Ktᵀ, each register block of rows only over the panels its rows
    # can see (this is what clips the causal diagonal tile)
    i0 = nr if U.k_in_place or U.kq_in_place else 0
    if U.kq_in_place:
        qk_rows_quantized(P, qp, nr, U.b, t0, n, s)
    elif U.k_in_place and not U.fuse and P.pages != NULL:
        paged_qk_rows(P, U.bdqk, qp, nr, U.kbo, t0, n, U.hi_all, s)
    elif U.k_in_place and not U.fuse:
        unit_qk_rows(P, U.bdqk, qp, nr, kbase + t0 * P.k.sr * P.k.item, n, s, FA_PF_AUTO)
    while i0 < nr:
        rows_key_span(ws, i0, min(i0 + FA_QK_MR, nr), t0, n, &a, &e)
        if a < e:
            qk_block(qp + i0 * Dk, Dk, kt, Dk, s + i0 * BLOCK_K, BLOCK_K, a // NR, e)
        i0 += FA_QK_MR
    return v_nonfinite


cdef void row_tile_softmax(const Plan *P, Workspace *ws, const RowUnit *U, floating *stats,
                           int64_t t0, int64_t n) noexcept nogil:
    """Per row of tile [t0, t0 + n): the score options, then the online softmax
    update (running max and sum, accumulator rescale) or, for MODE_WEIGHTS, the
    final weights.  Scores of keys a row does not see become 0."""
    cdef floating *s = <floating *>U.s
    cdef floating *m = <floating *>ws.m
    cdef floating *o = <floating *>ws.o
    cdef floating *pm = <floating *>ws.pm
    cdef double *l = ws.l
    cdef int64_t i, j, a, e, grp, pos, soff
    cdef floating mt, mn, alpha, lse_i
    cdef double sm
    cdef floating *srow
    cdef floating *wrow
    for i in range(U.nr):
        srow = s + i * BLOCK_K
        if U.bdpv:
            pm[i] = 0
        a = ws.lo[i] - t0
        e = ws.hi[i] - t0
        if a < 0:
            a = 0
        if e > n:
            e = n
        if a >= e:
            for j in range(n):
                srow[j] = 0
            continue
        if P.kscale == SCALE_PER_KEY:
            # int8 keys: q . (k_j * s_j) = (q . k_j) * s_j
            soff = key_scale_offset(P, &P.ks, U.b, ws.goff[i])
            scale_by_keys(P, &P.ks, soff, srow, t0, a, e)
        if U.needs_options:
            grp = ws.goff[i]
            pos = U.r0 + i - grp * P.Lq
            apply_score_options(P, srow, i, t0, a, e, U.b,
                                U.mbo + grp * P.mask.sg + pos * P.mask.sr,
                                U.bbo + grp * P.bias.sg + pos * P.bias.sr, ws)
        if U.mode == MODE_WEIGHTS:
            lse_i = stats[i]
            if lse_i == -INFINITY:
                for j in range(n):
                    srow[j] = 0
                continue
            row_exp_sum(srow + a, srow + a, e - a, lse_i)
            wrow = (<floating *>P.w.base) + U.wbo + ws.goff[i] * P.w.sg + (U.r0 + i - ws.goff[i] * P.Lq) * P.w.sr
            for j in range(a, e):
                wrow[(t0 + j) * P.w.sc] = srow[j]
        else:
            mt = row_max(srow + a, e - a)
            if mt != mt or mt > m[i]:
                mn = mt
            else:
                mn = m[i]
            if mn == -INFINITY:
                for j in range(n):
                    srow[j] = 0
                continue
            # probabilities (and the rescale) as fa_vexp_p: 0 below ~2^-62.5 of the max
            if floating is float:
                alpha = fa_exp_p_f(m[i] - mn)
                sm = fa_row_exp_sum_p_f(srow + a, srow + a, e - a, mn)
            else:
                alpha = fa_exp_p_d(m[i] - mn)
                sm = fa_row_exp_sum_p_d(srow + a, srow + a, e - a, mn)
            l[i] = l[i] * alpha + sm
            m[i] = mn
            if U.bdpv:
                # the tile's largest probability: P.V rounds P against it (fa_pv_rows_bd)
                pm[i] = fa_exp_p_f(mt - mn) if floating is float else fa_exp_p_d(mt - mn)
            if U.need_pv and alpha != 1:
                row_scale(o + i * U.dvp, o + i * U.dvp, P.Dv, alpha)
        if P.vscale == SCALE_PER_KEY and U.need_pv:
            # int8 values: sum_j p_j (v_j * s_j) = sum_j (p_j * s_j) v_j (after the row sum)
            soff = key_scale_offset(P, &P.vs, U.b, ws.goff[i])
            scale_by_keys(P, &P.vs, soff, srow, t0, a, e)
        for j in range(a):
            srow[j] = 0
        for j in range(e, n):
            srow[j] = 0


cdef void row_tile_pv(const Plan *P, Workspace *ws, RowUnit *U, int vstore, const char *vsrc, int64_t ldv,
                      int v_nonfinite, int64_t t0, int64_t t1, floating dummy) noexcept nogil:
    """O += P . V for tile [t0, t1), each register block of rows over the keys its
    rows see; when fusing, also the next tile's scores (then the two score
    buffers swap)."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t n = t1 - t0, nr = U.nr, dvp = U.dvp, Dk = P.Dk, i, i0, a, e, nn
    cdef floating *s = <floating *>U.s
    cdef floating *s2 = <floating *>U.s2
    cdef floating *o = <floating *>ws.o
    cdef floating *vp = <floating *>ws.vp
    cdef floating *qp = <floating *>ws.qp
    cdef const floating *pmx = <const floating *>ws.pm if U.bdpv else NULL
    cdef const char *kn = stored_at(&P.k, U.kbo + (t1 * P.k.sr if P.pages == NULL else 0))
    cdef int64_t vbo_paged = U.vbo if U.v_in_place and P.pages != NULL else -1
    if v_nonfinite:
        pv_rows_exact(P, ws, s, vstore, vsrc, ldv, o, dvp, U.r0, nr, t0, n, U.mbo, -1)
    elif U.need_pv and U.few:
        rows_key_span(ws, 0, nr, t0, n, &a, &e)
        if a < e:
            # values read in place were not checked: keep the accumulators,
            # and if the update made any of them inf/NaN, redo the tile
            # exactly (see pv_rows_exact).  The packed value buffer is free
            # when values are read in place.
            # (before the first tile's update the accumulators are all 0:
            # nothing to keep)
            if U.v_in_place and t0 != U.lo_all:
                for i in range(nr * dvp):
                    vp[i] = o[i]
            if vbo_paged >= 0:
                nn = min(BLOCK_K, U.hi_all - t1) if U.fuse and t1 < U.hi_all else 0
                paged_pv_qk(P, U.kbo, U.vbo, s, nr, t0, a, e, o, dvp, qp, U.bdqk, pmx, t1, nn, s2, U.hi_all)
            elif U.fuse:
                nn = min(BLOCK_K, U.hi_all - t1) if t1 < U.hi_all else 0
                if nr == 1:
                    stored_pv_qk_row1(vstore, s, vsrc, ldv, a, e, o, dvp // W, qp, Dk, kn, P.k.sr, nn, s2)
                else:
                    pv_qk_chunks(P, s, nr, vsrc, a, e, o, dvp, qp, U.bdqk, pmx, kn, nn, s2)
            elif U.vq_in_place:
                pv_rows_quantized(P, s, nr, U.b, t0, a, e, o, dvp)
            elif U.bdpv:
                unit_pv_rows(P, pmx, s, nr, vsrc, ldv, a, e, o, dvp, FA_PF_AUTO)
            else:
                stored_pv_rows(vstore, s, BLOCK_K, nr, vsrc, ldv, a, e, o, dvp, dvp // W)
            if U.v_in_place and block_nonfinite(o, nr, P.Dv, dvp, 1):
                for i in range(nr * dvp):
                    o[i] = vp[i] if t0 != U.lo_all else 0
                pv_rows_exact(P, ws, s, vstore, vsrc, ldv, o, dvp, U.r0, nr, t0, n, U.mbo, vbo_paged)
        elif U.fuse and t1 < U.hi_all and P.pages != NULL:
            paged_qk_rows(P, U.bdqk, qp, nr, U.kbo, t1, min(BLOCK_K, U.hi_all - t1), U.hi_all, s2)
        elif U.fuse and t1 < U.hi_all:
            unit_qk_rows(P, U.bdqk, qp, nr, kn, min(BLOCK_K, U.hi_all - t1), s2, FA_PF_AUTO)
        if U.fuse:
            U.s = <char *>s2
            U.s2 = <char *>s
    elif U.need_pv:
        i0 = 0
        while i0 < nr:
            rows_key_span(ws, i0, min(i0 + FA_PV_MR, nr), t0, n, &a, &e)
            if a < e:
                pv_block(s + i0 * BLOCK_K, BLOCK_K, <const floating *>vsrc, ldv, a, e, o + i0 * dvp, dvp, dvp // W)
            i0 += FA_PV_MR


cdef void row_unit_finish(const Plan *P, const Workspace *ws, const RowUnit *U, floating *stats,
                          floating *part_o, floating *part_m, double *part_l) noexcept nogil:
    """The rows' results: lse only (MODE_STATS), this split's running max, sum and
    unnormalised output (MODE_PARTIAL), or the output rows (and lse).  Sinks enter
    here (MODE_STATS: the lse the weights are computed from; MODE_ONLINE: lse
    and the output's factor), not in a key split (merge_splits applies them)."""
    cdef floating *o = <floating *>ws.o
    cdef const floating *m = <const floating *>ws.m
    cdef const double *l = ws.l
    cdef int64_t i, c, grp, pos, Dv = P.Dv, dvp = U.dvp, soff
    cdef floating lse_i, inv
    cdef double lse_s
    cdef char *orow
    for i in range(U.nr):
        grp = ws.goff[i]
        pos = U.r0 + i - grp * P.Lq
        if U.mode == MODE_STATS:
            if P.sinks != NULL:
                stats[i] = <floating>sink_lse(m[i], l[i], sink_of(P, U.b, grp))
                continue
            stats[i] = <floating>(m[i] + log(l[i])) if l[i] > 0 or l[i] != l[i] else -INFINITY
            continue
        if P.vscale == SCALE_PER_CHANNEL:
            # int8 values: sum_j p_j v_jc s_c = s_c sum_j p_j v_jc
            soff = key_scale_offset(P, &P.vs, U.b, grp)
            for c in range(Dv):
                o[i * dvp + c] *= <floating>scale_at(&P.vs, soff, 0, c)
        if U.mode == MODE_PARTIAL:
            part_m[i] = m[i]
            part_l[i] = l[i]
            for c in range(Dv):
                part_o[i * Dv + c] = o[i * dvp + c]
            continue
        orow = <char *>stored_at(&P.o, batch_offset(P, &P.o, U.b) + grp * P.o.sg + pos * P.o.sr)
        if U.mode == MODE_WEIGHTS:
            for c in range(Dv):
                stored_set(P.o.store, orow, c * P.o.sc, o[i * dvp + c])
            lse_i = stats[i]
        elif P.sinks != NULL and (l[i] > 0 or l[i] != l[i]):
            lse_s = sink_lse(m[i], l[i], sink_of(P, U.b, grp))
            inv = <floating>exp(m[i] - lse_s)
            if P.o.sc == 1:
                stored_scale_row_out(P.o.store, o + i * dvp, orow, Dv, inv)
            else:
                for c in range(Dv):
                    stored_set(P.o.store, orow, c * P.o.sc, o[i * dvp + c] * inv)
            lse_i = <floating>lse_s
        elif l[i] > 0 or l[i] != l[i]:
            inv = <floating>(1.0 / l[i])
            if P.o.sc == 1:
                stored_scale_row_out(P.o.store, o + i * dvp, orow, Dv, inv)
            else:
                for c in range(Dv):
                    stored_set(P.o.store, orow, c * P.o.sc, o[i * dvp + c] * inv)
            lse_i = <floating>(m[i] + log(l[i])) if P.want_lse else 0
        else:
            for c in range(Dv):
                stored_set(P.o.store, orow, c * P.o.sc, 0)
            lse_i = <floating>sink_of(P, U.b, grp) if P.sinks != NULL else -INFINITY
        if P.want_lse:
            (<floating *>P.lse.base)[batch_offset(P, &P.lse, U.b) + grp * P.lse.sg + pos * P.lse.sr] = lse_i


cdef void run_row_unit(const Plan *P, Workspace *ws, int64_t b, int64_t r0, int64_t nr,
                       int64_t kb, int64_t ke, int mode, floating *stats,
                       floating *part_o, floating *part_m, double *part_l) noexcept nogil:
    """Rows r0..r0+nr-1 of batch element b against keys [kb, ke), tile by tile.

    stats: per-row lse of the whole problem (MODE_STATS writes it, MODE_WEIGHTS reads it).
    part_*: where MODE_PARTIAL leaves this split's running max, sum and unnormalised output."""
    cdef RowUnit U
    cdef int64_t t0, t1, ldv = 0
    cdef const char *vsrc = NULL
    cdef int v_nonfinite, vstore = native_store(<floating>0)
    U.b = b
    U.r0 = r0
    U.nr = nr
    U.kb = kb
    U.ke = ke
    U.mode = mode
    U.lockstep = 0
    row_unit_begin(P, ws, &U, stats)
    t0 = U.lo_all
    while t0 < U.hi_all:
        t1 = min(t0 + BLOCK_K, U.hi_all)
        v_nonfinite = row_tile_scores(P, ws, &U, t0, t1 - t0, &vsrc, &ldv, &vstore, <floating>0)
        row_tile_softmax(P, ws, &U, stats, t0, t1 - t0)
        row_tile_pv(P, ws, &U, vstore, vsrc, ldv, v_nonfinite, t0, t1, <floating>0)
        t0 = t1
    row_unit_finish(P, ws, &U, stats, part_o, part_m, part_l)
