# Score options applied to a tile of scores, in the reference's order: softcap,
# bias, ALiBi, the boolean mask -- for the row-major layout (rows of keys) and
# the query-vectorised layout (lanes of queries).

cdef void apply_score_options(const Plan *P, floating *srow, int64_t i, int64_t t0, int64_t a, int64_t e,
                              int64_t b, int64_t moff, int64_t boff, const Workspace *ws) noexcept nogil:
    """softcap, then bias, then ALiBi, then the boolean mask, on srow[a:e] (keys t0+a..t0+e-1)."""
    cdef int64_t j, grp = ws.goff[i], r = i
    cdef int64_t pos_in = 0
    cdef floating slope, d
    cdef const char *bias
    cdef const uint8_t *mask
    if P.softcap > 0:
        row_softcap(srow + a, e - a, <floating>P.softcap)
    if P.has_bias:
        bias = stored_at(&P.bias, boff)
        if P.bias.store == native_store(<floating>0):
            for j in range(a, e):
                srow[j] += (<const floating *>bias)[(t0 + j) * P.bias.sc]
        elif P.bias.sc == 1:
            stored_add_row(P.bias.store, srow + a, bias + (t0 + a) * P.bias.item, e - a)
        else:
            for j in range(a, e):
                srow[j] += <floating>stored_value(P.bias.store, bias, (t0 + j) * P.bias.sc)
    if P.has_alibi:
        slope = (<const floating *>P.slopes)[b * P.g + grp]
        for j in range(a, e):
            d = <floating>(ws.pos[i] - (t0 + j))
            if d < 0:
                d = -d
            srow[j] -= slope * d
    if P.has_mask:
        mask = (<const uint8_t *>P.mask.base) + moff
        if P.mask.sc == 1:
            if floating is float:
                fa_row_mask_bool_f(srow + a, mask + t0 + a, e - a)
            else:
                fa_row_mask_bool_d(srow + a, mask + t0 + a, e - a)
        else:
            for j in range(a, e):
                if not mask[(t0 + j) * P.mask.sc]:
                    srow[j] = -INFINITY

cdef void apply_score_options_qvec(const Plan *P, const Workspace *ws, floating *st, int64_t ld,
                                int64_t j0, int64_t j1, int64_t t0, int64_t i0, int64_t ni, int64_t nlanes,
                                int64_t b, int64_t r0, int64_t mbo, int64_t bbo) noexcept nogil:
    """softcap, bias, ALiBi and the boolean mask on St[j0:j1, lanes i0..i0+ni-1] (st points at lane i0).

    The same order as the row-major path (apply_score_options)."""
    cdef int64_t i, j, r, grp, pos, p
    cdef floating *lane
    cdef const char *brow
    cdef const uint8_t *mrows[64]       # one chunk of lanes (at most 64)
    cdef const char *brows[64]
    cdef floating slope, dist
    cdef int nv = <int>(nlanes // (FA_VBYTES // sizeof(floating)))
    cdef int fast_bias = P.has_bias and P.bias.sc == 1
    # ALiBi distances computed in floating point are exact below 2^22 (float);
    # after a bias applied element by element, ALiBi follows it the same way (the
    # order of the two updates is the row-major path's)
    cdef int fast_alibi = (P.has_alibi and (floating is double or P.Lq + P.Lk < 4194304)
                           and (fast_bias or not P.has_bias))
    if P.softcap > 0:
        for j in range(j0, j1):
            row_softcap(st + j * ld, nlanes, <floating>P.softcap)
    if fast_bias:
        for i in range(ni):
            r = i0 + i
            grp = ws.goff[r]
            brows[i] = stored_at(&P.bias, bbo + grp * P.bias.sg + (r0 + r - grp * P.Lq) * P.bias.sr + t0)
        stored_qvec_bias(P.bias.store, st, ld, j0, j1, brows, ni)
    if fast_alibi:
        if floating is float:
            fa_qvec_alibi_f(st, ld, j0, j1, t0, (<const float *>P.slopes) + b * P.g, ws.goff + i0,
                        ws.pos + i0, ni, nv)
        else:
            fa_qvec_alibi_d(st, ld, j0, j1, t0, (<const double *>P.slopes) + b * P.g, ws.goff + i0,
                        ws.pos + i0, ni, nv)
    if (P.has_bias and not fast_bias) or (P.has_alibi and not fast_alibi):
        for i in range(ni):
            r = i0 + i
            lane = st + i
            grp = ws.goff[r]
            pos = r0 + r - grp * P.Lq
            if P.has_bias and not fast_bias:
                brow = stored_at(&P.bias, bbo + grp * P.bias.sg + pos * P.bias.sr)
                for j in range(j0, j1):
                    lane[j * ld] += <floating>stored_value(P.bias.store, brow, (t0 + j) * P.bias.sc)
            if P.has_alibi and not fast_alibi:
                slope = (<const floating *>P.slopes)[b * P.g + grp]
                p = ws.pos[r]
                for j in range(j0, j1):
                    dist = <floating>(p - (t0 + j))
                    if dist < 0:
                        dist = -dist
                    lane[j * ld] -= slope * dist
    if P.has_mask:
        for i in range(ni):
            r = i0 + i
            grp = ws.goff[r]
            mrows[i] = (<const uint8_t *>P.mask.base) + mbo + grp * P.mask.sg + (r0 + r - grp * P.Lq) * P.mask.sr
        qvec_bool_mask_chunk(st, ld, j0, j1, t0, mrows, ni, P.mask.sc, <uint8_t *>ws.mtb, nv)
