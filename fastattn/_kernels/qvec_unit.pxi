# The query-vectorised work unit: lanes over query rows (prefill and other
# problems with many rows), keys and values read in place as broadcast scalars.

cdef inline int qvec_chunk_width(int64_t nvec) noexcept nogil:
    """The widest query-vectorised kernel width that nvec (>= 1) vectors of lanes
    fill: FA_QVEC_NV, 2 or 1 vectors (the widths the kernels are instantiated for)."""
    return FA_QVEC_NV if nvec >= FA_QVEC_NV else (2 if nvec >= 2 else 1)

cdef int qvec_key_runs(int64_t j0, int64_t j1, const int64_t *a, const int64_t *e, int nv,
                int64_t *rs, int64_t *re, int *rv, int *rw) noexcept nogil:
    """Cut keys [j0, j1) of a chunk whose vector v sees keys [a[v], e[v]) (tile
    rows; empty when e[v] <= a[v]) into runs: keys [rs, re) seen by every vector
    of rv .. rv + rw - 1, a maximal group of adjacent vectors.  The keys a vector
    sees are the union of its runs.  Returns the number of runs (at most
    (2 nv + 1) * (nv + 1) / 2: 2 nv + 1 segments between the range ends)."""
    cdef int64_t bp[2 * FA_QVEC_NV + 2]
    cdef int64_t x, st
    cdef int nb = 0, n = 0, i, k, v
    bp[nb] = j0
    nb += 1
    for v in range(nv):
        if e[v] > a[v]:
            if j0 < a[v] < j1:
                bp[nb] = a[v]
                nb += 1
            if j0 < e[v] < j1:
                bp[nb] = e[v]
                nb += 1
    bp[nb] = j1
    nb += 1
    for i in range(1, nb):          # insertion sort: at most 2 nv + 2 entries
        x = bp[i]
        k = i - 1
        while k >= 0 and bp[k] > x:
            bp[k + 1] = bp[k]
            k -= 1
        bp[k + 1] = x
    for i in range(nb - 1):
        st = bp[i]
        if bp[i + 1] <= st:
            continue
        v = 0
        while v < nv:
            if a[v] <= st < e[v]:
                k = v
                while k + 1 < nv and a[k + 1] <= st < e[k + 1]:
                    k += 1
                rs[n] = st
                re[n] = bp[i + 1]
                rv[n] = v
                rw[n] = k - v + 1
                n += 1
                v = k + 1
            else:
                v += 1
    return n

cdef struct QvecUnit:
    # a query-vectorised unit: rows r0..r0+nr-1 of batch element b against keys [kb, ke)
    int64_t b, r0, nr, kb, ke
    int mode                   # MODE_ONLINE / MODE_STATS / MODE_WEIGHTS / MODE_PARTIAL
    int64_t lanes              # nr rounded up to whole chunks
    int64_t nch                # chunks of FA_QVEC_NV, 2 or 1 vectors of lanes
    int64_t lo_all, hi_all     # the keys any of the rows sees
    int64_t mbo, bbo           # batch offsets of mask and bias
    int needs_options          # softcap, bias, ALiBi or a mask
    int need_pv                # a pass that accumulates P.V (all but MODE_STATS)
    # per chunk: min lo / max hi over lanes that see keys (the chunk's key range),
    # max lo / min hi over all lanes (does any lane need masking?)
    int64_t ch_lo[QVEC_VECS_MAX]
    int64_t ch_hi[QVEC_VECS_MAX]
    int64_t ch_lomax[QVEC_VECS_MAX]
    int64_t ch_himin[QVEC_VECS_MAX]
    int64_t ch_c0[QVEC_VECS_MAX]   # first lane of each chunk
    int ch_nv[QVEC_VECS_MAX]       # its width in vectors
    # per vector of lanes: min lo / max hi over its lanes that see keys; in a
    # masked tile, keys that no lane of a vector sees are left out of the QK
    # and P.V kernels for that vector (the causal diagonal: a quarter to three
    # quarters of a 4-vector chunk's keys, per vector)
    int64_t vec_lo[QVEC_VECS_MAX]
    int64_t vec_hi[QVEC_VECS_MAX]


cdef struct TileSource:
    # where a unit's tile of keys and values is read: in place, or widened into
    # the workspace (non-native storage types, int8 scales folded in)
    const char *k              # key row t0 of the tile
    int64_t ksr, ksc
    int kstore
    const char *v              # value row t0 of the tile
    int64_t vsr, vsc
    int vstore
    int vnf                    # the value tile holds an inf or NaN
    int vpairs                 # v is V2, pairs of bfloat16 value rows (qvec_bf16_pv; P.V by pair products)
    int kpaged, vpaged         # paged k / v read in place: k, v are the head's rows of the cache,
    int64_t t0                 # key t0 + j of the tile is found through the block table (paged_reads.pxi)


cdef struct KeyRuns:
    # the keys of one chunk's tile cut into runs seen by groups of its vectors
    int n                      # number of runs; 0: one block over every key
    int64_t va[FA_QVEC_NV]     # per vector: the tile keys [va, ve) it sees
    int64_t ve[FA_QVEC_NV]
    int64_t s[QVEC_RUNS_MAX]   # run keys [s, e) ...
    int64_t e[QVEC_RUNS_MAX]
    int v[QVEC_RUNS_MAX]       # ... seen by vectors v .. v + w - 1
    int w[QVEC_RUNS_MAX]


cdef inline bint qvec_bf16_dot(const Plan *P, floating dummy) noexcept nogil:
    """Q.K^T by bfloat16 pair dot products (bf16_dot.h): float compute on a target
    with them, bfloat16 q and k, contiguous rows of an even length, k not paged."""
    return (floating is float and FA_BF16_DOT != 0 and P.q.store == STORE_BF16 and P.k.store == STORE_BF16
            and P.pages == NULL and P.q.sc == 1 and P.k.sc == 1 and P.Dk % 2 == 0 and P.kscale == SCALE_NONE)


cdef inline bint qvec_bf16_pv(const Plan *P, const QvecUnit *U, floating dummy) noexcept nogil:
    """P.V by bfloat16 pair dot products too (bf16_dot.h, FA_HAVE_BF16_PV): the
    scores by them (qvec_bf16_dot), bfloat16 values without scales, a pass that
    accumulates P.V with the online softmax (not return_weights' second pass)."""
    return (FA_BF16_PV != 0 and qvec_bf16_dot(P, <floating>0) and P.v.store == STORE_BF16
            and P.vscale == SCALE_NONE and U.need_pv and U.mode != MODE_WEIGHTS)


cdef void qvec_unit_begin(const Plan *P, Workspace *ws, QvecUnit *U, floating *stats) noexcept nogil:
    """Cut the rows into chunks, find each row's visible keys, pack the queries
    transposed, zero the accumulators, and gather each chunk's and vector's key
    range."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t ld = ws.ld
    cdef int64_t nr = U.nr, nvec = (nr + W - 1) // W, Dk = P.Dk, i, d, c, ch
    cdef int nv, v
    cdef floating *qt = <floating *>ws.qt
    cdef floating *ot = <floating *>ws.ot
    cdef floating *m = <floating *>ws.mt
    cdef floating *l = <floating *>ws.lt
    cdef floating *lof = <floating *>ws.lof
    cdef floating *hif = <floating *>ws.hif
    cdef const char *qbase = stored_at(&P.q, batch_offset(P, &P.q, U.b))
    cdef floating scale = <floating>P.scale
    U.mbo = batch_offset(P, &P.mask, U.b) if P.has_mask else 0
    U.bbo = batch_offset(P, &P.bias, U.b) if P.has_bias else 0
    U.needs_options = P.softcap > 0 or P.has_bias or P.has_alibi or P.has_mask
    U.need_pv = U.mode != MODE_STATS
    # chunks: as many of FA_QVEC_NV vectors as the rows fill, then 2, then 1 (qvec_chunk_width)
    U.nch = 0
    U.lanes = 0
    while nvec > 0:
        nv = qvec_chunk_width(nvec)
        U.ch_c0[U.nch] = U.lanes
        U.ch_nv[U.nch] = nv
        U.lanes += nv * W
        nvec -= nv
        U.nch += 1
    setup_rows(P, ws, U.b, U.r0, nr, U.kb, U.ke, &U.lo_all, &U.hi_all)
    # Start the first key/value tile and the query rows on their way from
    # memory before the (latency-bound) transposed query pack; later key rows
    # are requested a register block ahead by the QK kernel, value rows ahead
    # of the inf/NaN probe (block_nonfinite).
    if U.lo_all < U.hi_all:
        prefetch_tile(P, stored_at(&P.k, batch_offset(P, &P.k, U.b)), stored_at(&P.v, batch_offset(P, &P.v, U.b)),
                      U.lo_all, min(U.lo_all + BLOCK_K, U.hi_all))
    if P.q.sc == 1:
        for i in range(nr):
            fa_prefetch_bytes(qbase + ws.qoff[i] * P.q.item, Dk * P.q.item)
    # transposed pack: W x W register transposes for contiguous query rows;
    # otherwise d outer (contiguous stores, the nr source rows stay in L1)
    if qvec_bf16_dot(P, <floating>0):
        # the bfloat16 pairs, unscaled (the scale multiplies the scores)
        fa_pack_pairs_bd(<const uint16_t *>qbase, ws.qoff, nr, Dk, <float *>qt, ld)
    elif P.q.sc == 1:
        stored_pack_transposed(P.q.store, qbase, ws.qoff, nr, Dk, scale, qt, ld, 0)
    else:
        for d in range(Dk):
            for i in range(nr):
                qt[d * ld + i] = <floating>stored_value(P.q.store, qbase, ws.qoff[i] + d * P.q.sc) * scale
    for i in range(nr):
        lof[i] = <floating>ws.lo[i]
        hif[i] = <floating>ws.hi[i]
    for i in range(nr, U.lanes):
        for d in range(Dk):
            qt[d * ld + i] = 0
        lof[i] = 0
        hif[i] = 0
    for i in range(U.lanes):
        m[i] = -INFINITY
        l[i] = 0
    for c in range(P.Dv):
        for i in range(U.lanes):
            ot[c * ld + i] = 0
    for ch in range(U.nch):
        U.ch_lo[ch] = P.Lk
        U.ch_hi[ch] = 0
        U.ch_lomax[ch] = 0
        U.ch_himin[ch] = P.Lk
        for i in range(U.ch_c0[ch], U.ch_c0[ch] + U.ch_nv[ch] * W):
            if i < nr and ws.hi[i] > ws.lo[i]:
                U.ch_lo[ch] = min(U.ch_lo[ch], ws.lo[i])
                U.ch_hi[ch] = max(U.ch_hi[ch], ws.hi[i])
                U.ch_lomax[ch] = max(U.ch_lomax[ch], ws.lo[i])
                U.ch_himin[ch] = min(U.ch_himin[ch], ws.hi[i])
            else:
                U.ch_himin[ch] = -1     # an empty or padding lane: always mask
    for v in range(U.lanes // W):
        U.vec_lo[v] = P.Lk
        U.vec_hi[v] = 0
        for i in range(v * W, min(v * W + W, nr)):
            if ws.hi[i] > ws.lo[i]:
                U.vec_lo[v] = min(U.vec_lo[v], ws.lo[i])
                U.vec_hi[v] = max(U.vec_hi[v], ws.hi[i])
    if U.mode == MODE_WEIGHTS:
        qvec_weights_begin(P, ws, U, stats)


cdef void qvec_weights_begin(const Plan *P, Workspace *ws, const QvecUnit *U, floating *stats) noexcept nogil:
    """MODE_WEIGHTS: m holds each lane's lse (padding lanes 0); the tiles write each
    row's weights for the keys its chunk visits (0 where masked), the rest of the
    row is filled here: 0, or NaN for a NaN row (all of it NaN).  (A chunk's key
    range [ch_lo, ch_hi) lies inside [lo_all, hi_all).)"""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef floating *m = <floating *>ws.mt
    cdef floating *mxt = <floating *>ws.mxt
    cdef floating *wbase = (<floating *>P.w.base) + batch_offset(P, &P.w, U.b)
    cdef floating *wrow
    cdef floating fill
    cdef int64_t i, j, ch, grp
    for i in range(U.lanes):
        m[i] = stats[i] if i < U.nr else 0
    for i in range(FA_QVEC_NV * W):
        mxt[i] = 1        # the row scales of the transposed weight writes
    for ch in range(U.nch):
        for i in range(U.ch_c0[ch], min(U.ch_c0[ch] + U.ch_nv[ch] * W, U.nr)):
            grp = ws.goff[i]
            wrow = wbase + grp * P.w.sg + (U.r0 + i - grp * P.Lq) * P.w.sr
            fill = m[i] if m[i] != m[i] else 0
            if U.ch_lo[ch] >= U.ch_hi[ch]:
                for j in range(P.Lk):
                    wrow[j * P.w.sc] = fill
                continue
            for j in range(U.ch_lo[ch]):
                wrow[j * P.w.sc] = fill
            for j in range(U.ch_hi[ch], P.Lk):
                wrow[j * P.w.sc] = fill


cdef void qvec_chunk_scores(const Plan *P, Workspace *ws, const QvecUnit *U, const TileSource *T, KeyRuns *R,
                            int64_t ch, int64_t t0, int64_t j0, int64_t j1, int masked,
                            floating *mx, double scale) noexcept nogil:
    """St[j0:j1] of chunk ch for the tile at t0: one block, or (a masked tile of a
    chunk wider than a vector) only the key runs each group of vectors sees, the
    rest -inf.  mx (or NULL): the tile max per lane, taken from the registers.
    scale: tile_qk_chunk's."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t ld = ws.ld
    cdef int64_t c0 = U.ch_c0[ch], i, j
    cdef int nv = U.ch_nv[ch], ri, rv0, rw0, nw, v
    cdef floating *qt = <floating *>ws.qt
    cdef floating *st = <floating *>ws.st
    R.n = 0
    if masked and nv > 1:
        for v in range(nv):
            R.va[v] = max(U.vec_lo[c0 // W + v] - t0, j0)
            R.ve[v] = min(U.vec_hi[c0 // W + v] - t0, j1)
        R.n = qvec_key_runs(j0, j1, R.va, R.ve, nv, R.s, R.e, R.v, R.w)
        if R.n == 1 and R.w[0] == nv:
            R.n = 0         # every vector sees every key: one block
    if R.n == 0:
        tile_qk_chunk(P, T, qt + c0, ld, st + c0, ld, j0, j1, mx, nv, ch == 0, scale)
        return
    for ri in range(R.n):
        rv0 = R.v[ri]
        rw0 = R.w[ri]
        while rw0 > 0:
            nw = qvec_chunk_width(rw0)
            tile_qk_chunk(P, T, qt + c0 + rv0 * W, ld, st + c0 + rv0 * W, ld, R.s[ri], R.e[ri],
                          <floating *>NULL, nw, ch == 0, scale)
            rv0 += nw
            rw0 -= nw
    # the scores a vector does not see: -inf (the mask pass would set them;
    # this keeps unset memory out of the options)
    for v in range(nv):
        for j in range(j0, j1):
            if j < R.va[v] or j >= R.ve[v]:
                for i in range(c0 + v * W, c0 + v * W + W):
                    st[j * ld + i] = -INFINITY


cdef void qvec_chunk_weights(const Plan *P, Workspace *ws, const QvecUnit *U, int64_t ch,
                             int64_t t0, int64_t j0, int64_t j1, floating dummy) noexcept nogil:
    """MODE_WEIGHTS: the chunk's tile scores become weights exp(s - lse), written
    to the weight rows."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t ld = ws.ld
    cdef int64_t c0 = U.ch_c0[ch], ni = min(U.ch_nv[ch] * W, U.nr - c0), i, j, grp
    cdef floating *st = <floating *>ws.st
    cdef floating *wbase = (<floating *>P.w.base) + batch_offset(P, &P.w, U.b)
    cdef floating *wrow
    qvec_weights_chunk(st + c0, ld, j0, j1, (<floating *>ws.mt) + c0, U.ch_nv[ch])
    if P.w.sc == 1 and ws.goff[c0] == ws.goff[c0 + ni - 1]:
        # rows of one group are equally spaced: register transposes
        # (mxt holds ones: the scale of each row)
        grp = ws.goff[c0]
        qvec_store_rows(st + j0 * ld + c0, ld, ni, j1 - j0, <floating *>ws.mxt,
                        wbase + grp * P.w.sg + (U.r0 + c0 - grp * P.Lq) * P.w.sr + t0 + j0, P.w.sr)
    else:
        for i in range(c0, c0 + ni):
            grp = ws.goff[i]
            wrow = wbase + grp * P.w.sg + (U.r0 + i - grp * P.Lq) * P.w.sr
            for j in range(j0, j1):
                wrow[(t0 + j) * P.w.sc] = st[j * ld + i]


cdef void qvec_chunk_pv(const Plan *P, Workspace *ws, const QvecUnit *U, const TileSource *T, const KeyRuns *R,
                        int64_t ch, int64_t t0, int64_t j0, int64_t j1, floating dummy) noexcept nogil:
    """Ot += Pt . V for chunk ch over tile keys [j0, j1): its key runs (P is 0 where
    a vector sees no key), one block, or -- values holding inf/NaN -- each lane
    over exactly its visible keys."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t ld = ws.ld
    cdef int64_t c0 = U.ch_c0[ch], cw = U.ch_nv[ch] * W, Dv = P.Dv, i, j, jj0, jj1, c, grp
    cdef int ri, rv0, rw0, nw
    cdef floating *st = <floating *>ws.st
    cdef floating *ot = <floating *>ws.ot
    cdef const uint8_t *mrow = NULL
    cdef floating p
    cdef int v
    cdef KeyRuns PR
    if floating is float:
        if T.vpairs:
            # P2 pairs p hold keys 2p, 2p + 1 (P 0 where a lane does not see a
            # key).  The runs are cut again over pairs: a run of keys starting
            # at an odd key would share its first pair with the run before.
            # AMX tiles take the chunk's whole range at once (fa_amx_pv)
            if R.n > 0 and FA_AMX == 0:
                for v in range(U.ch_nv[ch]):
                    PR.va[v] = R.va[v] >> 1
                    PR.ve[v] = (R.ve[v] + 1) >> 1 if R.ve[v] > R.va[v] else R.va[v] >> 1
                PR.n = qvec_key_runs(j0 >> 1, (j1 + 1) >> 1, PR.va, PR.ve, U.ch_nv[ch], PR.s, PR.e, PR.v, PR.w)
                for ri in range(PR.n):
                    rv0 = PR.v[ri]
                    rw0 = PR.w[ri]
                    while rw0 > 0:
                        nw = qvec_chunk_width(rw0)
                        fa_qvec_pv_chunk_bd(<const uint32_t *>T.v, T.vsr, Dv, <const float *>(st + c0 + rv0 * W),
                                            ld, PR.s[ri], PR.e[ri], <float *>(ot + c0 + rv0 * W),
                                            ld, (<const float *>ws.mxt) + rv0 * W, nw)
                        rv0 += nw
                        rw0 -= nw
            else:
                fa_qvec_pv_chunk_bd(<const uint32_t *>T.v, T.vsr, Dv, <const float *>(st + c0), ld, j0 >> 1,
                                    (j1 + 1) >> 1, <float *>(ot + c0), ld, <const float *>ws.mxt, U.ch_nv[ch])
            return
    if not T.vnf and R.n > 0:
        for ri in range(R.n):
            rv0 = R.v[ri]
            rw0 = R.w[ri]
            while rw0 > 0:
                nw = qvec_chunk_width(rw0)
                tile_pv_chunk(P, T, st + c0 + rv0 * W, ld, R.s[ri], R.e[ri], ot + c0 + rv0 * W, ld, nw)
                rv0 += nw
                rw0 -= nw
    elif not T.vnf:
        tile_pv_chunk(P, T, st + c0, ld, j0, j1, ot + c0, ld, U.ch_nv[ch])
    else:
        for i in range(c0, min(c0 + cw, U.nr)):
            jj0 = max(ws.lo[i] - t0, j0)
            jj1 = min(ws.hi[i] - t0, j1)
            if P.has_mask:
                grp = ws.goff[i]
                mrow = ((<const uint8_t *>P.mask.base) + U.mbo + grp * P.mask.sg
                        + (U.r0 + i - grp * P.Lq) * P.mask.sr)
            for j in range(jj0, jj1):
                if P.has_mask and not mrow[(t0 + j) * P.mask.sc]:
                    continue
                p = st[j * ld + i]
                for c in range(Dv):
                    ot[c * ld + i] += p * <floating>tile_value(P, T, j, c)


cdef void qvec_tile_source(const Plan *P, Workspace *ws, const QvecUnit *U, TileSource *T, int64_t t0, int64_t t1,
                           floating dummy) noexcept nogil:
    """Where tile [t0, t1) is read: keys and values of the compute type in place;
    other storage types (float16, bfloat16, int8) widened into the workspace
    with their scales folded in (a tile's widening costs a fraction of its
    FLOPs: each key and value feeds every query lane of the unit).  Also whether
    the values hold an inf or NaN."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int native = native_store(<floating>0)
    cdef int64_t kbo = batch_offset(P, &P.k, U.b), vbo = batch_offset(P, &P.v, U.b)
    cdef int64_t ldk = round_up(P.Dk if P.Dk > 0 else 1, W), ldv = round_up(P.Dv if P.Dv > 0 else 1, W)
    cdef int kind = paged_tile_kind(P, t0, t1)
    T.vnf = 0
    T.vpairs = 0
    T.t0 = t0
    T.kpaged = kind == TILE_RUNS and P.k.store == native
    T.vpaged = kind == TILE_RUNS and P.v.store == native
    T.kstore = native
    if T.kpaged:
        T.k = stored_at(&P.k, kbo)
        T.ksr = P.k.sr
        T.ksc = P.k.sc
    elif P.k.store == native and kind == TILE_ROWS:
        T.k = stored_at(&P.k, kbo + row_at(P, &P.k, t0))
        T.ksr = P.k.sr
        T.ksc = P.k.sc
    elif qvec_bf16_dot(P, <floating>0):
        # bfloat16 keys in place, for the pair dot products (tile_qk_chunk)
        T.k = stored_at(&P.k, kbo + row_at(P, &P.k, t0))
        T.ksr = P.k.sr
        T.ksc = 1
        T.kstore = STORE_BF16
    elif is_quantized(&P.k):
        dequant_tile(P, &P.k, &P.ks, &P.kz, P.kgroup, U.b, <floating *>ws.kw, ldk, t0, t1 - t0, P.Dk)
        T.k = <const char *>ws.kw
        T.ksr = ldk
        T.ksc = 1
    else:
        widen_tile(P, &P.k, P.kscale, &P.ks, batch_offset(P, &P.ks, U.b) if P.kscale else 0,
                   <floating *>ws.kw, ldk, stored_at(&P.k, kbo), t0, t1 - t0, P.Dk)
        T.k = <const char *>ws.kw
        T.ksr = ldk
        T.ksc = 1
    qvec_tile_values(P, ws, U, T, t0, t1, vbo, ldv, kind, <floating>0)


cdef inline void qvec_tile_values(const Plan *P, Workspace *ws, const QvecUnit *U, TileSource *T, int64_t t0,
                                  int64_t t1, int64_t vbo, int64_t ldv, int kind, floating dummy) noexcept nogil:
    """The value half of qvec_tile_source."""
    cdef int native = native_store(<floating>0)
    if not U.need_pv:
        return
    if T.vpaged:
        T.v = stored_at(&P.v, vbo)
        T.vsr = P.v.sr
        T.vsc = P.v.sc
        T.vnf = paged_nonfinite(P, T.v, t0, t1, <floating>0)
    elif P.v.store == native and kind == TILE_ROWS:
        T.v = stored_at(&P.v, vbo + row_at(P, &P.v, t0))
        T.vsr = P.v.sr
        T.vsc = P.v.sc
        T.vnf = block_nonfinite(<const floating *>T.v, t1 - t0, P.Dv, P.v.sr, P.v.sc)
    elif is_quantized(&P.v):
        T.vnf = dequant_tile(P, &P.v, &P.vs, &P.vz, P.vgroup, U.b, <floating *>ws.vw, ldv, t0, t1 - t0, P.Dv)
        T.v = <const char *>ws.vw
        T.vsr = ldv
        T.vsc = 1
    elif kind == TILE_ROWS and qvec_bf16_pv(P, U, <floating>0) and not fa_pack_value_pairs_bd(
            <const uint16_t *>stored_at(&P.v, vbo + row_at(P, &P.v, t0)), P.v.sr, P.v.sc, t1 - t0, P.Dv,
            <uint32_t *>ws.vw, ldv):
        # pairs of value rows for the pair dot products (a tile holding an inf
        # or NaN is widened instead: the float32 P.V walks each lane's keys)
        T.vpairs = 1
        T.v = <const char *>ws.vw
        T.vsr = ldv
        T.vsc = 1
    else:
        T.vnf = widen_tile(P, &P.v, P.vscale, &P.vs, batch_offset(P, &P.vs, U.b) if P.vscale else 0,
                           <floating *>ws.vw, ldv, stored_at(&P.v, vbo), t0, t1 - t0, P.Dv)
        T.v = <const char *>ws.vw
        T.vsr = ldv
        T.vsc = 1
    T.vstore = native


cdef void qvec_amx_softmax_pv(const Plan *P, Workspace *ws, const TileSource *T, int64_t c0,
                              int64_t j0, int64_t j1, float *mx, float sc, int nv) noexcept nogil:
    """The softmax and P.V of a chunk on AMX tiles (FA_AMX), one vector of lanes
    at a time, software-pipelined: the P.V tiles of vector v run after the
    softmax of vector v + 1, so the tile loads of v's probabilities find their
    stores committed (a tile load of rows just stored waits for the store
    buffer to drain).  Per lane the same operations as the chunk-wide calls.
    sc: the scale St still needs (fa_qvec_softmax_chunk_bd)."""
    cdef int64_t W = FA_VBYTES // sizeof(float), ld = ws.ld, o
    cdef float *st = <float *>ws.st
    cdef float *f = <float *>ws.mxt
    cdef int v
    for v in range(nv + 1):
        if v < nv:
            o = c0 + v * W
            fa_qvec_softmax_chunk_bd(st + o, ld, j0, j1, (<float *>ws.mt) + o, (<float *>ws.lt) + o,
                                     (<float *>ws.ot) + o, ld, P.Dv, mx + v * W if mx != NULL else mx, sc,
                                     f + v * W, 1)
        if v > 0:
            o = c0 + (v - 1) * W
            fa_qvec_pv_chunk_bd(<const uint32_t *>T.v, T.vsr, P.Dv, st + o, ld, j0 >> 1, (j1 + 1) >> 1,
                                (<float *>ws.ot) + o, ld, f + (v - 1) * W, 1)


cdef void qvec_unit_tile(const Plan *P, Workspace *ws, const QvecUnit *U, int64_t t0, int64_t t1,
                         floating dummy) noexcept nogil:
    """Tile [t0, t1) for every chunk: scores, options, masks, then the online
    softmax and P.V (or the weights)."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t ld = ws.ld
    cdef int64_t ch, j0, j1, c0, cw, i
    cdef int nv, masked, amx, raw
    cdef floating *st = <floating *>ws.st
    cdef floating *mx
    cdef KeyRuns R
    cdef TileSource T
    qvec_tile_source(P, ws, U, &T, t0, t1, <floating>0)
    for ch in range(U.nch):
        j0 = max(t0, U.ch_lo[ch]) - t0
        j1 = min(t1, U.ch_hi[ch]) - t0
        if j0 >= j1:
            continue
        c0 = U.ch_c0[ch]
        nv = U.ch_nv[ch]
        cw = nv * W
        # scores left as computed (no options, no lane masked in this tile):
        # the tile max comes out of the QK registers instead of a pass over St
        masked = U.ch_lomax[ch] > t0 + j0 or U.ch_himin[ch] < t0 + j1
        mx = NULL
        if not U.needs_options and not masked and U.mode != MODE_WEIGHTS:
            mx = <floating *>ws.mxt
            for i in range(cw):
                mx[i] = -INFINITY
        # amx: the softmax and P.V of this chunk by qvec_amx_softmax_pv; raw:
        # its scores left unscaled, as nothing but that softmax reads them (mx:
        # no options, no mask) and its multiply-add applies the scale
        amx = FA_AMX != 0 and floating is float and T.vpairs and U.need_pv and nv > 1
        raw = amx and T.kstore == STORE_BF16 and mx != NULL
        qvec_chunk_scores(P, ws, U, &T, &R, ch, t0, j0, j1, masked, mx, 1.0 if raw else P.scale)
        if U.needs_options:
            apply_score_options_qvec(P, ws, st + c0, ld, j0, j1, t0, c0,
                                     min(cw, U.nr - c0), cw, U.b, U.r0, U.mbo, U.bbo)
        if masked:
            qvec_range_mask_chunk(st + c0, ld, j0, j1, t0, (<floating *>ws.lof) + c0,
                                  (<floating *>ws.hif) + c0, nv)
        if U.mode == MODE_WEIGHTS:
            qvec_chunk_weights(P, ws, U, ch, t0, j0, j1, <floating>0)
        elif T.vpairs:
            # P against the tile's max, in bfloat16 pairs in place of St; the
            # factors exp(mt - m) go to mxt (read there as mx first)
            if floating is float:
                if amx:
                    qvec_amx_softmax_pv(P, ws, &T, c0, j0, j1, <float *>mx, <float>P.scale if raw else 1, nv)
                    continue
                fa_qvec_softmax_chunk_bd(<float *>(st + c0), ld, j0, j1, (<float *>ws.mt) + c0,
                                         (<float *>ws.lt) + c0, (<float *>ws.ot) + c0, ld, P.Dv, <const float *>mx,
                                         1, <float *>ws.mxt, nv)
        else:
            qvec_softmax_chunk(st + c0, ld, j0, j1, (<floating *>ws.mt) + c0, (<floating *>ws.lt) + c0,
                               (<floating *>ws.ot) + c0, ld, P.Dv if U.need_pv else 0, mx, nv)
        if U.need_pv:
            qvec_chunk_pv(P, ws, U, &T, &R, ch, t0, j0, j1, <floating>0)


cdef void qvec_sinks_finish(const Plan *P, const Workspace *ws, const QvecUnit *U, floating *ot, floating *m,
                            floating *l) noexcept nogil:
    """MODE_ONLINE with sinks: each row's Ot scaled by exp(m - lse) (lse with the
    sink), then m = lse and l = 1, which the common finish turns into out = Ot and
    lse = m; a row that saw no key keeps l = 0 (out 0) and gets m = sink.  (Ot is
    transposed: element c of row i at c * ld + i: the factors go to a row table
    first, then Ot is scaled one contiguous column at a time -- a row at a time
    walked it ld apart, 5 % of a prefill.)"""
    cdef int64_t ld = ws.ld, nr = U.nr, i, c
    cdef double lse_s
    cdef floating *f = <floating *>ws.lof      # free at the finish (the tile loop's key ranges)
    cdef floating *col
    for i in range(nr):
        lse_s = sink_lse(m[i], l[i], sink_of(P, U.b, ws.goff[i]))
        f[i] = 1
        if l[i] > 0 or l[i] != l[i]:
            f[i] = <floating>exp(m[i] - lse_s)
            l[i] = 1 if l[i] == l[i] else l[i]
        m[i] = <floating>lse_s
    for c in range(P.Dv):
        col = ot + c * ld
        for i in range(nr):
            col[i] *= f[i]


cdef void qvec_unit_finish(const Plan *P, Workspace *ws, const QvecUnit *U, floating *stats,
                           floating *part_o, floating *part_m, double *part_l) noexcept nogil:
    """The rows' results: lse only (MODE_STATS), this split's reference max, sum
    and unnormalised output (MODE_PARTIAL), or the output rows Ot / l (and lse).
    Sinks enter here (MODE_STATS and the output rows), not in a key split."""
    cdef int64_t ld = ws.ld
    cdef int64_t nr = U.nr, Dv = P.Dv, i, c, grp, pos
    cdef floating *ot = <floating *>ws.ot
    cdef floating *m = <floating *>ws.mt
    cdef floating *l = <floating *>ws.lt
    cdef floating *lof = <floating *>ws.lof
    cdef char *obase = <char *>stored_at(&P.o, batch_offset(P, &P.o, U.b))
    cdef char *orow
    cdef floating inv, lse_i
    if U.mode == MODE_STATS:
        for i in range(nr):
            if P.sinks != NULL:
                stats[i] = <floating>sink_lse(m[i], l[i], sink_of(P, U.b, ws.goff[i]))
            else:
                stats[i] = <floating>(m[i] + log(l[i])) if l[i] > 0 or l[i] != l[i] else -INFINITY
        return
    if U.mode == MODE_WEIGHTS:
        # out = weights . V as accumulated (no division); lse = stats (m): l = 1,
        # or 0 for a row that saw nothing (out 0, lse -inf)
        for i in range(nr):
            l[i] = 0 if m[i] == -INFINITY else 1
    elif U.mode == MODE_ONLINE and P.sinks != NULL:
        # the sink as part of the sum: m becomes the row's lse and l = 1, so that
        # the factor 1 / l below is exp(m - lse) once Ot is rescaled by it
        qvec_sinks_finish(P, ws, U, ot, m, l)
    if U.mode == MODE_PARTIAL:
        # a key split: the reference max (NaN for a row made NaN by NaN scores,
        # whose max skipped them), the sum and the unnormalised output, per row
        for i in range(nr):
            part_m[i] = m[i] if l[i] == l[i] else <floating>NAN
            part_l[i] = l[i]
            lof[i] = 1        # (the lanes' key ranges are no longer needed)
        qvec_store_rows(ot, ld, nr, Dv, lof, part_o, Dv)
        return

    # Ot / l into the output rows (zeros for a row that saw no key).  Rows of
    # one group with contiguous elements are equally spaced: blocks transposed
    # in registers; otherwise one strided element at a time.
    if P.o.sc == 1 and ws.goff[0] == ws.goff[nr - 1]:
        # lof (the lanes' key ranges, needed only by the tile loop) holds 1 / l
        for i in range(nr):
            lof[i] = 1 / l[i] if l[i] > 0 or l[i] != l[i] else 0
        grp = ws.goff[0]
        stored_qvec_store_rows(P.o.store, ot, ld, nr, Dv, lof,
                               obase + (grp * P.o.sg + (U.r0 - grp * P.Lq) * P.o.sr) * P.o.item, P.o.sr)
        for i in range(nr):
            if not (l[i] > 0 or l[i] != l[i]):
                orow = obase + (grp * P.o.sg + (U.r0 + i - grp * P.Lq) * P.o.sr) * P.o.item
                for c in range(Dv):
                    stored_set(P.o.store, orow, c, 0)
    else:
        for i in range(nr):
            grp = ws.goff[i]
            pos = U.r0 + i - grp * P.Lq
            orow = obase + (grp * P.o.sg + pos * P.o.sr) * P.o.item
            if l[i] > 0 or l[i] != l[i]:
                inv = 1 / l[i]
                for c in range(Dv):
                    stored_set(P.o.store, orow, c * P.o.sc, ot[c * ld + i] * inv)
            else:
                for c in range(Dv):
                    stored_set(P.o.store, orow, c * P.o.sc, 0)
    if P.want_lse:
        for i in range(nr):
            grp = ws.goff[i]
            pos = U.r0 + i - grp * P.Lq
            if l[i] > 0 or l[i] != l[i]:
                lse_i = <floating>(m[i] + log(l[i]))
            else:   # no key: -inf, or (sinks: m holds it) the sink
                lse_i = m[i] if P.sinks != NULL else -INFINITY
            (<floating *>P.lse.base)[batch_offset(P, &P.lse, U.b) + grp * P.lse.sg + pos * P.lse.sr] = lse_i


cdef void run_qvec_unit(const Plan *P, Workspace *ws, int64_t b, int64_t r0, int64_t nr,
                        int64_t kb, int64_t ke, int mode, floating *stats, floating *part_o,
                        floating *part_m, double *part_l) noexcept nogil:
    """Query-vectorised unit: rows r0..r0+nr-1 (nr <= the workspace's rows: BLOCK_Q_QVEC or BLOCK_Q_QVEC_COPY) of batch b, keys kb..ke-1.

    Lanes run over queries: Qt (Dk x lanes) is packed once, keys and values are
    read in place as broadcast scalars, and each query's online softmax (max,
    sum, rescale) is a vertical vector operation.  The rows are cut into chunks
    of FA_QVEC_NV, 2 or 1 vectors of lanes (the widest that the remaining rows
    fill), so a unit of 16 float32 rows is one vector wide, not a quarter of a
    4-vector chunk.

    mode: MODE_ONLINE (out and lse); MODE_PARTIAL (a key split: each row's
    reference max, sum and unnormalised output go to part_o / part_m / part_l
    for merge_splits); return_weights in two passes, MODE_STATS (only each row's
    lse, into stats: no P.V) and MODE_WEIGHTS (weights = exp(s - lse) written
    to the weights rows, out = weights . V)."""
    cdef QvecUnit U
    cdef int64_t t0, t1
    U.b = b
    U.r0 = r0
    U.nr = nr
    U.kb = kb
    U.ke = ke
    U.mode = mode
    qvec_unit_begin(P, ws, &U, stats)
    t0 = U.lo_all
    while t0 < U.hi_all:
        t1 = min(t0 + BLOCK_K, U.hi_all)
        qvec_unit_tile(P, ws, &U, t0, t1, <floating>0)
        t0 = t1
    # the tile state the bfloat16 kernels configured, released (amx_tiles.h)
    fa_amx_unit_end()
    qvec_unit_finish(P, ws, &U, stats, part_o, part_m, part_l)
