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

cdef void run_qvec_unit(const Plan *P, Workspace *ws, int64_t b, int64_t r0, int64_t nr,
                     int64_t kb, int64_t ke, int mode, floating *stats, floating *part_o,
                     floating *part_m, double *part_l) noexcept nogil:
    """Query-vectorised unit: rows r0..r0+nr-1 (nr <= BLOCK_Q_QVEC) of batch b, keys kb..ke-1.

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
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t ld = qvec_ld(sizeof(floating))
    cdef int64_t nch = 0, lanes = 0, nvec = (nr + W - 1) // W
    cdef int64_t Dk = P.Dk, Dv = P.Dv, i, d, c, ch, j, j0, j1, jj0, jj1, t0, t1, n, c0, cw
    cdef int nv
    cdef int64_t lo_all, hi_all, grp, pos
    cdef floating *qt = <floating *>ws.qt
    cdef floating *st = <floating *>ws.st
    cdef floating *ot = <floating *>ws.ot
    cdef floating *m = <floating *>ws.mt
    cdef floating *l = <floating *>ws.lt
    cdef floating *lof = <floating *>ws.lof
    cdef floating *hif = <floating *>ws.hif
    cdef floating *mxt = <floating *>ws.mxt
    cdef floating *mx
    cdef int masked
    cdef const floating *qbase = (<const floating *>P.q.base) + batch_offset(P, &P.q, b)
    cdef const floating *kbase = (<const floating *>P.k.base) + batch_offset(P, &P.k, b)
    cdef const floating *vbase = (<const floating *>P.v.base) + batch_offset(P, &P.v, b)
    cdef floating *obase = (<floating *>P.o.base) + batch_offset(P, &P.o, b)
    cdef int64_t mbo = batch_offset(P, &P.mask, b) if P.has_mask else 0
    cdef int64_t bbo = batch_offset(P, &P.bias, b) if P.has_bias else 0
    cdef int needs_options = P.softcap > 0 or P.has_bias or P.has_alibi or P.has_mask
    cdef const uint8_t *mrow = NULL
    cdef floating scale = <floating>P.scale
    cdef floating inv, p, lse_i
    cdef const floating *src
    cdef floating *orow
    cdef int vnf
    # per chunk: min lo / max hi over lanes that see keys (the chunk's key range),
    # max lo / min hi over all lanes (does any lane need masking?)
    cdef int64_t ch_lo[64]
    cdef int64_t ch_hi[64]
    cdef int64_t ch_lomax[64]
    cdef int64_t ch_himin[64]
    cdef int64_t ch_c0[64]      # first lane of each chunk
    cdef int ch_nv[64]          # its width in vectors
    # per vector of lanes: min lo / max hi over its lanes that see keys; in a
    # masked tile, keys that no lane of a vector sees are left out of the QK
    # and P.V kernels for that vector (the causal diagonal: a quarter to three
    # quarters of a 4-vector chunk's keys, per vector)
    cdef int64_t vec_lo[64]
    cdef int64_t vec_hi[64]
    cdef int64_t va[FA_QVEC_NV]
    cdef int64_t ve[FA_QVEC_NV]
    cdef int64_t run_s[QVEC_RUNS_MAX]
    cdef int64_t run_e[QVEC_RUNS_MAX]
    cdef int run_v[QVEC_RUNS_MAX]
    cdef int run_w[QVEC_RUNS_MAX]
    cdef int nruns, ri, rv0, rw0, nw, v
    cdef int need_pv = mode != MODE_STATS
    cdef floating *wbase = (<floating *>P.w.base) + batch_offset(P, &P.w, b) if mode == MODE_WEIGHTS else NULL
    cdef floating *wrow
    cdef floating fill
    cdef int64_t ni

    # chunks: as many of FA_QVEC_NV vectors as the rows fill, then 2, then 1 (qvec_chunk_width)
    while nvec > 0:
        nv = qvec_chunk_width(nvec)
        ch_c0[nch] = lanes
        ch_nv[nch] = nv
        lanes += nv * W
        nvec -= nv
        nch += 1
    setup_rows(P, ws, b, r0, nr, kb, ke, &lo_all, &hi_all)
    # Start the first key/value tile and the query rows on their way from
    # memory before the (latency-bound) transposed query pack; later key rows
    # are requested a register block ahead by the QK kernel, value rows ahead
    # of the inf/NaN probe (block_nonfinite).
    if lo_all < hi_all:
        prefetch_tile(P, kbase, vbase, lo_all, min(lo_all + BLOCK_K, hi_all))
    if P.q.sc == 1:
        for i in range(nr):
            prefetch_rows(qbase + ws.qoff[i], 1, 0, Dk)
    # transposed pack: W x W register transposes for contiguous query rows;
    # otherwise d outer (contiguous stores, the nr source rows stay in L1)
    if P.q.sc == 1:
        if floating is float:
            fa_pack_transposed_f(qbase, ws.qoff, nr, Dk, scale, qt, ld, 0)
        else:
            fa_pack_transposed_d(qbase, ws.qoff, nr, Dk, scale, qt, ld, 0)
    else:
        for d in range(Dk):
            for i in range(nr):
                qt[d * ld + i] = qbase[ws.qoff[i] + d * P.q.sc] * scale
    for i in range(nr):
        lof[i] = <floating>ws.lo[i]
        hif[i] = <floating>ws.hi[i]
    for i in range(nr, lanes):
        for d in range(Dk):
            qt[d * ld + i] = 0
        lof[i] = 0
        hif[i] = 0
    for i in range(lanes):
        m[i] = -INFINITY
        l[i] = 0
    for c in range(Dv):
        for i in range(lanes):
            ot[c * ld + i] = 0
    for ch in range(nch):
        ch_lo[ch] = P.Lk
        ch_hi[ch] = 0
        ch_lomax[ch] = 0
        ch_himin[ch] = P.Lk
        for i in range(ch_c0[ch], ch_c0[ch] + ch_nv[ch] * W):
            if i < nr and ws.hi[i] > ws.lo[i]:
                ch_lo[ch] = min(ch_lo[ch], ws.lo[i])
                ch_hi[ch] = max(ch_hi[ch], ws.hi[i])
                ch_lomax[ch] = max(ch_lomax[ch], ws.lo[i])
                ch_himin[ch] = min(ch_himin[ch], ws.hi[i])
            else:
                ch_himin[ch] = -1     # an empty or padding lane: always mask
    for v in range(lanes // W):
        vec_lo[v] = P.Lk
        vec_hi[v] = 0
        for i in range(v * W, min(v * W + W, nr)):
            if ws.hi[i] > ws.lo[i]:
                vec_lo[v] = min(vec_lo[v], ws.lo[i])
                vec_hi[v] = max(vec_hi[v], ws.hi[i])

    if mode == MODE_WEIGHTS:
        # m holds each lane's lse (padding lanes 0); the tiles below write each
        # row's weights for the keys its chunk visits (0 where masked), the rest
        # of the row is filled here: 0, or NaN for a NaN row (all of it NaN)
        # (a chunk's key range [ch_lo, ch_hi) lies inside [lo_all, hi_all))
        for i in range(lanes):
            m[i] = stats[i] if i < nr else 0
        for i in range(FA_QVEC_NV * W):
            mxt[i] = 1        # the row scales of the transposed weight writes
        for ch in range(nch):
            for i in range(ch_c0[ch], min(ch_c0[ch] + ch_nv[ch] * W, nr)):
                grp = ws.goff[i]
                wrow = wbase + grp * P.w.sg + (r0 + i - grp * P.Lq) * P.w.sr
                fill = m[i] if m[i] != m[i] else 0
                if ch_lo[ch] >= ch_hi[ch]:
                    for j in range(P.Lk):
                        wrow[j * P.w.sc] = fill
                    continue
                for j in range(ch_lo[ch]):
                    wrow[j * P.w.sc] = fill
                for j in range(ch_hi[ch], P.Lk):
                    wrow[j * P.w.sc] = fill

    t0 = lo_all
    while t0 < hi_all:
        t1 = min(t0 + BLOCK_K, hi_all)
        n = t1 - t0
        vnf = block_nonfinite(vbase + t0 * P.v.sr, n, Dv, P.v.sr, P.v.sc) if need_pv else 0
        for ch in range(nch):
            j0 = max(t0, ch_lo[ch]) - t0
            j1 = min(t1, ch_hi[ch]) - t0
            if j0 >= j1:
                continue
            c0 = ch_c0[ch]
            nv = ch_nv[ch]
            cw = nv * W
            # scores left as computed (no options, no lane masked in this tile):
            # the tile max comes out of the QK registers instead of a pass over St
            masked = ch_lomax[ch] > t0 + j0 or ch_himin[ch] < t0 + j1
            mx = NULL
            if not needs_options and not masked and mode != MODE_WEIGHTS:
                mx = mxt
                for i in range(cw):
                    mx[i] = -INFINITY
            nruns = 0
            if masked and nv > 1:
                for v in range(nv):
                    va[v] = max(vec_lo[c0 // W + v] - t0, j0)
                    ve[v] = min(vec_hi[c0 // W + v] - t0, j1)
                nruns = qvec_key_runs(j0, j1, va, ve, nv, run_s, run_e, run_v, run_w)
                if nruns == 1 and run_w[0] == nv:
                    nruns = 0         # every vector sees every key: one block
            if nruns == 0:
                qvec_qk_chunk(kbase + t0 * P.k.sr, P.k.sr, P.k.sc, qt + c0, ld, Dk, st + c0, ld, j0, j1, mx, nv,
                          ch == 0)
            else:
                for ri in range(nruns):
                    rv0 = run_v[ri]
                    rw0 = run_w[ri]
                    while rw0 > 0:
                        nw = qvec_chunk_width(rw0)
                        qvec_qk_chunk(kbase + t0 * P.k.sr, P.k.sr, P.k.sc, qt + c0 + rv0 * W, ld, Dk,
                                  st + c0 + rv0 * W, ld, run_s[ri], run_e[ri], <floating *>NULL, nw, ch == 0)
                        rv0 += nw
                        rw0 -= nw
                # the scores a vector does not see: -inf (the mask pass below
                # would set them; this keeps unset memory out of the options)
                for v in range(nv):
                    for j in range(j0, j1):
                        if j < va[v] or j >= ve[v]:
                            for i in range(c0 + v * W, c0 + v * W + W):
                                st[j * ld + i] = -INFINITY
            if needs_options:
                apply_score_options_qvec(P, ws, st + c0, ld, j0, j1, t0, c0,
                                      min(cw, nr - c0), cw, b, r0, mbo, bbo)
            if masked:
                qvec_range_mask_chunk(st + c0, ld, j0, j1, t0, lof + c0, hif + c0, nv)
            if mode == MODE_WEIGHTS:
                qvec_weights_chunk(st + c0, ld, j0, j1, m + c0, nv)
                ni = min(cw, nr - c0)
                if P.w.sc == 1 and ws.goff[c0] == ws.goff[c0 + ni - 1]:
                    # rows of one group are equally spaced: register transposes
                    # (mxt holds ones: the scale of each row)
                    grp = ws.goff[c0]
                    qvec_store_rows(st + j0 * ld + c0, ld, ni, j1 - j0, mxt,
                              wbase + grp * P.w.sg + (r0 + c0 - grp * P.Lq) * P.w.sr + t0 + j0, P.w.sr)
                else:
                    for i in range(c0, c0 + ni):
                        grp = ws.goff[i]
                        wrow = wbase + grp * P.w.sg + (r0 + i - grp * P.Lq) * P.w.sr
                        for j in range(j0, j1):
                            wrow[(t0 + j) * P.w.sc] = st[j * ld + i]
            else:
                qvec_softmax_chunk(st + c0, ld, j0, j1, m + c0, l + c0, ot + c0, ld, Dv if need_pv else 0,
                               mx, nv)
            if not need_pv:
                continue
            if not vnf and nruns > 0:
                # P is 0 where a vector sees no key: its runs only
                for ri in range(nruns):
                    rv0 = run_v[ri]
                    rw0 = run_w[ri]
                    while rw0 > 0:
                        nw = qvec_chunk_width(rw0)
                        qvec_pv_chunk(vbase + t0 * P.v.sr, P.v.sr, P.v.sc, Dv, st + c0 + rv0 * W, ld,
                                  run_s[ri], run_e[ri], ot + c0 + rv0 * W, ld, nw)
                        rv0 += nw
                        rw0 -= nw
            elif not vnf:
                qvec_pv_chunk(vbase + t0 * P.v.sr, P.v.sr, P.v.sc, Dv, st + c0, ld, j0, j1, ot + c0, ld, nv)
            else:
                # values hold inf/NaN: only each lane's visible keys may touch it
                for i in range(c0, min(c0 + cw, nr)):
                    jj0 = max(ws.lo[i] - t0, j0)
                    jj1 = min(ws.hi[i] - t0, j1)
                    if P.has_mask:
                        grp = ws.goff[i]
                        mrow = ((<const uint8_t *>P.mask.base) + mbo + grp * P.mask.sg
                                + (r0 + i - grp * P.Lq) * P.mask.sr)
                    for j in range(jj0, jj1):
                        if P.has_mask and not mrow[(t0 + j) * P.mask.sc]:
                            continue
                        p = st[j * ld + i]
                        src = vbase + (t0 + j) * P.v.sr
                        for c in range(Dv):
                            ot[c * ld + i] += p * src[c * P.v.sc]
        t0 = t1

    if mode == MODE_STATS:
        for i in range(nr):
            stats[i] = <floating>(m[i] + log(l[i])) if l[i] > 0 or l[i] != l[i] else -INFINITY
        return
    if mode == MODE_WEIGHTS:
        # out = weights . V as accumulated (no division); lse = stats (m): l = 1,
        # or 0 for a row that saw nothing (out 0, lse -inf)
        for i in range(nr):
            l[i] = 0 if m[i] == -INFINITY else 1
    if mode == MODE_PARTIAL:
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
        qvec_store_rows(ot, ld, nr, Dv, lof, obase + grp * P.o.sg + (r0 - grp * P.Lq) * P.o.sr, P.o.sr)
        for i in range(nr):
            if not (l[i] > 0 or l[i] != l[i]):
                orow = obase + grp * P.o.sg + (r0 + i - grp * P.Lq) * P.o.sr
                for c in range(Dv):
                    orow[c] = 0
    else:
        for i in range(nr):
            grp = ws.goff[i]
            pos = r0 + i - grp * P.Lq
            orow = obase + grp * P.o.sg + pos * P.o.sr
            if l[i] > 0 or l[i] != l[i]:
                inv = 1 / l[i]
                for c in range(Dv):
                    orow[c * P.o.sc] = ot[c * ld + i] * inv
            else:
                for c in range(Dv):
                    orow[c * P.o.sc] = 0
    if P.want_lse:
        for i in range(nr):
            grp = ws.goff[i]
            pos = r0 + i - grp * P.Lq
            lse_i = <floating>(m[i] + log(l[i])) if l[i] > 0 or l[i] != l[i] else -INFINITY
            (<floating *>P.lse.base)[batch_offset(P, &P.lse, b) + grp * P.lse.sg + pos * P.lse.sr] = lse_i
