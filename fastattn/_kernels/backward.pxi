# The attention backward: dq, dk, dv (and dbias) of attention(), the
# FlashAttention-2 backward written for CPUs.  Included at the end of
# _attn_body.pxi, so it is compiled once per ISA with the forward's plan,
# packing routines and micro-kernels; its own C kernels are backward_kernels.h.
#
# Per tile pair (a block of BWD_BQ query rows against a block of BWD_BK keys),
# with Qs = scale * q and Ks = scale * k (the plan and workspace: backward_plan.pxi):
#     S  = Qs . K^T, then softcap, bias, ALiBi, mask (the forward's order)
#     P  = exp(S - lse)                    lse from the forward: P is recomputed, never stored
#     dP = dO . V^T
#     dS = P * (dP - D), D = rowsum(dO * O) (times softcap's 1 - tanh^2)
#     dV += P^T . dO,  dK += dS^T . Qs,  dQ += dS . Ks
# All five products are register-blocked micro-kernels: S and dP the forward's
# QK products of packed rows against transposed key / value panels (qk_block;
# where both operands are bfloat16 and the target has pair dot products,
# fa_qk_block_bd of bf16_dot.h on panels of bfloat16 pairs: exact products,
# float32 sums, the scale applied to the sums as in the forward),
# the other three its P.V blocking (pv_block) summed in two levels
# (fa_bwd_pv_block) of row tiles against packed rows; fa_bwd_tile makes P and
# dS and their transposes in one pass.
#
# Work units are (slice, key group): a slice is one batch element (several when
# a returned dbias is shared by them: they are summed inside one unit, in
# order), a key group a fixed set of key blocks of every batch element of the
# slice.  For each key block the unit loops over the query blocks that see it:
# its dK and dV stay private and are written once.  dQ sums over key blocks:
# with one key group it is accumulated in the thread's workspace and written
# at the end of the batch element; with G > 1 groups each (batch element,
# group) accumulates into its own partial buffer and a second parallel loop
# adds the G partials in group order.  G depends on the shape only (never on
# the thread count), so the results are bit-identical for any num_threads.
#
# Pairs whose score is -inf (invisible, masked, or a -inf bias) contribute
# nothing (see reference.attention_backward): fa_bwd_tile zeroes their P and
# dS; a tile pair whose Qs, dO or Ks rows hold inf or NaN takes the affected
# products pair by pair over live pairs only (0 * inf would leak NaN).

from libc.string cimport memset

cdef extern from "backward_kernels.h" nogil:
    int fa_bwd_pack_rows_f(const float *src, const int64_t *off, int64_t sc, int64_t n, int64_t D,
                           float scale, float *dst, int64_t ldd, int64_t npad)
    int fa_bwd_pack_rows_d(const double *src, const int64_t *off, int64_t sc, int64_t n, int64_t D,
                           double scale, double *dst, int64_t ldd, int64_t npad)
    void fa_bwd_softcap_factor_f(const float *x, float *f, int64_t n, float c)
    void fa_bwd_softcap_factor_d(const double *x, double *f, int64_t n, double c)
    void fa_bwd_tile_f(const float *s, const float *dp, const float *f, int64_t lds, const float *lse,
                       const float *dd, int64_t nr, int64_t nc, float *dsr, float *db, float *pt,
                       float *dst, int64_t ldt)
    void fa_bwd_tile_d(const double *s, const double *dp, const double *f, int64_t lds, const double *lse,
                       const double *dd, int64_t nr, int64_t nc, double *dsr, double *db, double *pt,
                       double *dst, int64_t ldt)
    void fa_bwd_pv_block_f(const float *p, int64_t ldp, const float *vp, int64_t ldv, int64_t k0, int64_t k1,
                           float *o, int64_t ldo, int64_t nvec)
    void fa_bwd_pv_block_d(const double *p, int64_t ldp, const double *vp, int64_t ldv, int64_t k0, int64_t k1,
                           double *o, int64_t ldo, int64_t nvec)
    void fa_bwd_sum_rows_f(const float *src, int64_t stride, int64_t G, int64_t D, float *dst)
    void fa_bwd_sum_rows_d(const double *src, int64_t stride, int64_t G, int64_t D, double *dst)
    float fa_dot_f(const float *a, const float *b, int64_t n)
    double fa_dot_d(const double *a, const double *b, int64_t n)


include "backward_plan.pxi"


# ---------------------------------------------------------------- fused-type wrappers

cdef inline int bwd_pack_rows(const floating *src, const int64_t *off, int64_t sc, int64_t n, int64_t D,
                              floating scale, floating *dst, int64_t ldd, int64_t npad) noexcept nogil:
    if floating is float:
        return fa_bwd_pack_rows_f(src, off, sc, n, D, scale, dst, ldd, npad)
    else:
        return fa_bwd_pack_rows_d(src, off, sc, n, D, scale, dst, ldd, npad)


cdef inline void bwd_softcap_factor(const floating *x, floating *f, int64_t n, floating c) noexcept nogil:
    if floating is float:
        fa_bwd_softcap_factor_f(x, f, n, c)
    else:
        fa_bwd_softcap_factor_d(x, f, n, c)


cdef inline void bwd_tile_grads(const floating *s, const floating *dp, const floating *f, int64_t lds,
                                const floating *lse, const floating *dd, int64_t nr, int64_t nc, floating *dsr,
                                floating *db, floating *pt, floating *dst, int64_t ldt) noexcept nogil:
    if floating is float:
        fa_bwd_tile_f(s, dp, f, lds, lse, dd, nr, nc, dsr, db, pt, dst, ldt)
    else:
        fa_bwd_tile_d(s, dp, f, lds, lse, dd, nr, nc, dsr, db, pt, dst, ldt)


cdef inline void bwd_pv_block(const floating *p, int64_t ldp, const floating *vp, int64_t ldv,
                              int64_t k0, int64_t k1, floating *o, int64_t ldo, int64_t nvec) noexcept nogil:
    if floating is float:
        fa_bwd_pv_block_f(p, ldp, vp, ldv, k0, k1, o, ldo, nvec)
    else:
        fa_bwd_pv_block_d(p, ldp, vp, ldv, k0, k1, o, ldo, nvec)


cdef inline floating dot(const floating *a, const floating *b, int64_t n) noexcept nogil:
    if floating is float:
        return fa_dot_f(a, b, n)
    else:
        return fa_dot_d(a, b, n)


# ---------------------------------------------------------------- one batch element of a unit

cdef inline int64_t key_group(int64_t c, int64_t G) noexcept nogil:
    """The key group of key block c: blocks dealt to the G groups back and forth
    (0, 1, .., G-1, G-1, .., 0, 0, 1, ..), so that under a causal mask, where a
    block's cost falls with its position, every group gets as much work."""
    cdef int64_t m = c % (2 * G)
    return m if m < G else 2 * G - 1 - m


cdef int bwd_pack_stored(const Operand *op, const char *base, const int64_t *off, int64_t n, int64_t D,
                         floating scale, floating *dst, int64_t ldd, int64_t npad) noexcept nogil:
    """bwd_pack_rows of rows base + off[i] (elements) of a stored operand: the
    compute type directly; float16 / bfloat16 (q, k, v, dO read in place) widened
    a row at a time into dst (exact), then scaled, padded and probed there by
    bwd_pack_rows -- the arithmetic a float32 copy of the operand would get."""
    cdef int64_t i
    cdef int64_t zero = 0
    cdef int nonfinite = 0
    cdef floating *row
    if op.store == native_store(<floating>0):
        return bwd_pack_rows(<const floating *>base, off, op.sc, n, D, scale, dst, ldd, npad)
    for i in range(n):
        row = dst + i * ldd
        widen_row(op, base + off[i] * op.item, row, D)
        nonfinite |= bwd_pack_rows(<const floating *>row, &zero, 1, 1, D, scale, row, ldd, 1)
    if npad > n:
        bwd_pack_rows(<const floating *>dst, &zero, 1, 0, D, scale, dst + n * ldd, ldd, npad - n)
    return nonfinite


cdef void bwd_row_stats(const BwdPlan *B, BwdWorkspace *ws, int64_t b, floating *lse,
                        floating *dd) noexcept nogil:
    """Per row of batch element b: lse (+inf instead of -inf, so that a row that
    sees no key gets P = exp(-inf - inf) = 0) and D = rowsum(dO * O).  A float16 /
    bfloat16 dO or O (read in place) is widened a row at a time into the
    workspace (ws.dor, ws.dv: free until the key blocks), exactly, so D is the
    sum a float32 copy would give."""
    cdef const Plan *P = &B.P
    cdef const char *obase = stored_at(&P.o, batch_offset(P, &P.o, b))
    cdef const char *gbase = stored_at(&B.dout, batch_offset(P, &B.dout, b))
    cdef const floating *lbase = (<const floating *>P.lse.base) + batch_offset(P, &P.lse, b)
    cdef int native = native_store(<floating>0)
    cdef bint widen = P.o.store != native or B.dout.store != native
    cdef const floating *orow
    cdef const floating *grow
    cdef int64_t r, c, grp, pos
    cdef floating d, x
    for r in range(P.nrows):
        grp = r // P.Lq
        pos = r - grp * P.Lq
        orow = <const floating *>(obase + (grp * P.o.sg + pos * P.o.sr) * P.o.item)
        grow = <const floating *>(gbase + (grp * B.dout.sg + pos * B.dout.sr) * B.dout.item)
        if widen:
            d = dot(widen_row(&B.dout, <const char *>grow, <floating *>ws.dor, P.Dv),
                    widen_row(&P.o, <const char *>orow, <floating *>ws.dv, P.Dv), P.Dv)
        elif P.o.sc == 1 and B.dout.sc == 1:
            d = dot(grow, orow, P.Dv)
        else:
            d = 0
            for c in range(P.Dv):
                d += grow[c * B.dout.sc] * orow[c * P.o.sc]
        dd[r] = d
        x = lbase[grp * P.lse.sg + pos * P.lse.sr]
        lse[r] = INFINITY if x == -INFINITY else x


cdef void bwd_block_bounds(const BwdPlan *B, BwdWorkspace *ws, int64_t b) noexcept nogil:
    """qlo / qhi: the union of the key ranges of each query block's rows (causal,
    window, kv_lengths make them contiguous), so key blocks skip the query
    blocks that cannot see them."""
    cdef int64_t r, r0
    for r in range(B.nqb):
        r0 = r * BWD_BQ
        setup_rows(&B.P, &ws.rows, b, r0, min(<int64_t>BWD_BQ, B.P.nrows - r0), 0, B.P.Lk,
                   &ws.qlo[r], &ws.qhi[r])


cdef int bwd_pack_keys(const BwdPlan *B, BwdWorkspace *ws, int64_t b, int64_t kb, int64_t n,
                       floating *kt) noexcept nogil:
    """Key and value panels and the scaled key rows of keys kb..kb+n-1; returns
    1 when those rows hold inf or NaN."""
    cdef const Plan *P = &B.P
    cdef const char *kbase = stored_at(&P.k, batch_offset(P, &P.k, b))
    cdef const char *vbase = stored_at(&P.v, batch_offset(P, &P.v, b))
    cdef int64_t j
    if B.bd_dp:     # value pairs (the panels' buffer holds them: (Dv + 1) // 2 words <= Dv floats a key)
        for j in range(n):
            ws.off[j] = (kb + j) * P.v.sr
        fa_pack_key_pairs_bd(<const uint16_t *>vbase, ws.off, P.v.sc, n, P.Dv, <uint32_t *>ws.vt)
    else:
        pack_k_tile(&B.Pv, <floating *>ws.vt, vbase, kb, n)
    for j in range(n):
        ws.off[j] = (kb + j) * P.k.sr
    if B.bd_s:
        fa_pack_key_pairs_bd(<const uint16_t *>kbase, ws.off, P.k.sc, n, P.Dk, <uint32_t *>kt)
    else:
        pack_k_tile(P, kt, kbase, kb, n)
    return bwd_pack_stored(&P.k, kbase, ws.off, n, P.Dk, <floating>P.scale, <floating *>ws.ks, B.dkp, n)


cdef void bwd_scores(const BwdPlan *B, BwdWorkspace *ws, int64_t b, int64_t r0, int64_t nr,
                     int64_t kb, int64_t n, int64_t rw, int64_t cw, floating *s) noexcept nogil:
    """S and dP of the tile (only the key panels each register block of rows
    sees), then per row softcap (and its factor), bias, ALiBi and mask on the
    visible keys, -inf on the others and on the padding rows and keys."""
    cdef const Plan *P = &B.P
    cdef Workspace *rw_ = &ws.rows
    cdef int64_t NR = FA_QK_NV * (FA_VBYTES // sizeof(floating))
    cdef floating *dp = <floating *>ws.dp
    cdef floating *qs = <floating *>ws.qs
    cdef floating *dor = <floating *>ws.dor
    cdef floating *srow
    cdef int64_t i, i0, j, a, e, grp, pos
    cdef int64_t mbo = batch_offset(P, &P.mask, b) if P.has_mask else 0
    cdef int64_t bbo = batch_offset(P, &P.bias, b) if P.has_bias else 0
    cdef int needs_options = P.has_bias or P.has_alibi or P.has_mask
    i0 = 0
    while i0 < nr:
        rows_key_span(rw_, i0, min(i0 + FA_QK_MR, nr), kb, n, &a, &e)
        if a < e:
            if floating is float and B.bd_s:
                fa_qk_block_bd((<const uint16_t *>ws.q2) + i0 * bd_ld(P.Dk), bd_ld(P.Dk), <const uint32_t *>ws.kt,
                               bd_ld(P.Dk) // 2, <float>P.scale, s + i0 * B.ts, B.ts, a // NR, e)
            else:
                qk_block(qs + i0 * B.dkp, B.dkp, <floating *>ws.kt, P.Dk, s + i0 * B.ts, B.ts, a // NR, e)
            if floating is float and B.bd_dp:
                fa_qk_block_bd((<const uint16_t *>ws.do2) + i0 * bd_ld(P.Dv), bd_ld(P.Dv), <const uint32_t *>ws.vt,
                               bd_ld(P.Dv) // 2, 1, dp + i0 * B.ts, B.ts, a // NR, e)
            else:
                qk_block(dor + i0 * B.dvp, B.dvp, <floating *>ws.vt, P.Dv, dp + i0 * B.ts, B.ts, a // NR, e)
        i0 += FA_QK_MR
    for i in range(rw):
        srow = s + i * B.ts
        if i >= nr or rw_.hi[i] <= rw_.lo[i]:
            for j in range(cw):
                srow[j] = -INFINITY
            continue
        a = rw_.lo[i] - kb
        e = rw_.hi[i] - kb
        if B.softcap > 0:
            row_softcap(srow + a, e - a, <floating>B.softcap)
            bwd_softcap_factor(srow + a, (<floating *>ws.f) + i * B.ts + a, e - a, <floating>B.softcap)
        if needs_options:
            grp = rw_.goff[i]
            pos = r0 + i - grp * P.Lq
            apply_score_options(P, srow, i, kb, a, e, b, mbo + grp * P.mask.sg + pos * P.mask.sr,
                                bbo + grp * P.bias.sg + pos * P.bias.sr, rw_)
        for j in range(a):
            srow[j] = -INFINITY
        for j in range(e, cw):
            srow[j] = -INFINITY


cdef void bwd_products(const BwdPlan *B, BwdWorkspace *ws, int64_t r0, int64_t nr, int64_t kb, int64_t n,
                       int qnf, int dnf, int knf, floating *dqacc) noexcept nogil:
    """dV += P^T . dO and dK += dS^T . Qs (each register block of keys over the
    query rows that see it), dQ += dS . Ks (each block of rows over the keys it
    sees).  A product whose packed rows hold inf/NaN goes pair by pair over the
    live pairs instead (bwd_products_exact)."""
    cdef const Plan *P = &B.P
    cdef const Workspace *rw_ = &ws.rows
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef floating *pt = <floating *>ws.pt
    cdef floating *dst = <floating *>ws.dst
    cdef floating *dsr = <floating *>ws.dp
    cdef floating *tail = <floating *>ws.tail
    cdef int64_t i, i0, j0, j1, qa, qe, a, e, c, m
    cdef int full = 1
    for i in range(nr):
        if rw_.lo[i] > kb or rw_.hi[i] < kb + n:
            full = 0
            break
    j0 = 0
    while j0 < n and not (qnf and dnf):
        qa = 0
        qe = nr
        if not full:
            # rows i with lo_i < kb + j1 and hi_i > kb + j0 (and some key at all)
            j1 = min(j0 + FA_PV_MR, n)
            qa = nr
            qe = 0
            for i in range(nr):
                if rw_.hi[i] > rw_.lo[i] and rw_.lo[i] < kb + j1 and rw_.hi[i] > kb + j0:
                    if i < qa:
                        qa = i
                    qe = i + 1
        if qa < qe:
            if not dnf:
                bwd_pv_block(pt + j0 * B.tq, B.tq, <floating *>ws.dor, B.dvp, qa, qe,
                         (<floating *>ws.dv) + j0 * B.dvp, B.dvp, B.dvp // W)
            if not qnf:
                bwd_pv_block(dst + j0 * B.tq, B.tq, <floating *>ws.qs, B.dkp, qa, qe,
                         (<floating *>ws.dk) + j0 * B.dkp, B.dkp, B.dkp // W)
        j0 += FA_PV_MR
    i0 = 0
    while i0 < nr and not knf:
        m = min(<int64_t>FA_PV_MR, nr - i0)
        rows_key_span(rw_, i0, i0 + m, kb, n, &a, &e)
        if a < e:
            if m == FA_PV_MR:
                bwd_pv_block(dsr + i0 * B.ts, B.ts, <floating *>ws.ks, B.dkp, a, e,
                         dqacc + (r0 + i0) * B.dkp, B.dkp, B.dkp // W)
            else:
                # the last, partial block of rows: through a whole-block buffer, not
                # into the rows of the next query block (dS rows past nr are zero)
                for c in range(m * B.dkp):
                    tail[c] = dqacc[(r0 + i0) * B.dkp + c]
                bwd_pv_block(dsr + i0 * B.ts, B.ts, <floating *>ws.ks, B.dkp, a, e, tail, B.dkp, B.dkp // W)
                for c in range(m * B.dkp):
                    dqacc[(r0 + i0) * B.dkp + c] = tail[c]
        i0 += FA_PV_MR
    if qnf or dnf or knf:
        bwd_products_exact(B, ws, r0, nr, n, qnf, dnf, knf, dqacc)


cdef void bwd_products_exact(const BwdPlan *B, BwdWorkspace *ws, int64_t r0, int64_t nr, int64_t n,
                             int qnf, int dnf, int knf, floating *dqacc) noexcept nogil:
    """The products of bwd_products whose rows hold inf/NaN, over live pairs
    (score not -inf) only: dV when dO has them, dK when Qs has, dQ when Ks has."""
    cdef const floating *s = <const floating *>ws.s
    cdef const floating *pt = <const floating *>ws.pt
    cdef const floating *dst = <const floating *>ws.dst
    cdef const floating *dsr = <const floating *>ws.dp
    cdef const floating *qs = <const floating *>ws.qs
    cdef const floating *dor = <const floating *>ws.dor
    cdef const floating *ks = <const floating *>ws.ks
    cdef floating *dv = <floating *>ws.dv
    cdef floating *dk = <floating *>ws.dk
    cdef floating x
    cdef int64_t i, j, c
    for j in range(n):
        for i in range(nr):
            if s[i * B.ts + j] == -INFINITY:
                continue
            if dnf:
                x = pt[j * B.tq + i]
                for c in range(B.P.Dv):
                    dv[j * B.dvp + c] += x * dor[i * B.dvp + c]
            if qnf:
                x = dst[j * B.tq + i]
                for c in range(B.P.Dk):
                    dk[j * B.dkp + c] += x * qs[i * B.dkp + c]
    if knf:
        for i in range(nr):
            for j in range(n):
                if s[i * B.ts + j] == -INFINITY:
                    continue
                x = dsr[i * B.ts + j]
                for c in range(B.P.Dk):
                    dqacc[(r0 + i) * B.dkp + c] += x * ks[j * B.dkp + c]


cdef void bwd_dbias_add(const BwdPlan *B, const BwdWorkspace *ws, int64_t b, int64_t r0, int64_t nr,
                        int64_t kb, const floating *src) noexcept nogil:
    """dbias += the tile's bias gradient on each row's visible keys (a dbias
    broadcast along the keys takes the row sum, key by key)."""
    cdef const Plan *P = &B.P
    cdef const Workspace *rw_ = &ws.rows
    cdef floating *dbase = (<floating *>B.dbias.base) + batch_offset(P, &B.dbias, b)
    cdef floating *row
    cdef const floating *g
    cdef floating acc
    cdef int64_t i, j, grp, pos, sc = B.dbias.sc
    for i in range(nr):
        if rw_.hi[i] <= rw_.lo[i]:
            continue
        grp = rw_.goff[i]
        pos = r0 + i - grp * P.Lq
        row = dbase + grp * B.dbias.sg + pos * B.dbias.sr
        g = src + i * B.ts - kb
        if sc != 0 or P.Lk == 1:
            for j in range(rw_.lo[i], rw_.hi[i]):
                row[j * sc] += g[j]
        else:
            acc = row[0]
            for j in range(rw_.lo[i], rw_.hi[i]):
                acc += g[j]
            row[0] = acc


cdef inline int64_t tile_span(int64_t x, int64_t W) noexcept nogil:
    """Rows (keys) of a tile with x real ones that the kernels touch: whole
    register blocks of both micro-kernels, whole W x W blocks of fa_bwd_tile
    (at most BWD_BQ = BWD_BK, a multiple of all of them)."""
    return round_up(max(round_up(x, FA_QK_MR), round_up(x, FA_PV_MR)), W)


cdef void bwd_tile(const BwdPlan *B, BwdWorkspace *ws, int64_t b, int64_t r, int64_t kb, int64_t n,
                   int knf, floating *dqacc) noexcept nogil:
    """Query block r of batch element b against keys kb..kb+n-1 (packed)."""
    cdef const Plan *P = &B.P
    cdef int64_t r0 = r * BWD_BQ
    cdef int64_t nr = min(<int64_t>BWD_BQ, P.nrows - r0)
    cdef int64_t lo_all, hi_all, i, grp, pos, rw, cw
    cdef int qnf, dnf
    cdef floating *s = <floating *>ws.s
    cdef floating *dp = <floating *>ws.dp
    cdef const char *qbase
    cdef const char *gbase
    setup_rows(P, &ws.rows, b, r0, nr, kb, kb + n, &lo_all, &hi_all)
    if lo_all >= hi_all:
        return
    rw = tile_span(nr, FA_VBYTES // sizeof(floating))
    cw = tile_span(n, FA_VBYTES // sizeof(floating))
    qbase = stored_at(&P.q, batch_offset(P, &P.q, b))
    gbase = stored_at(&B.dout, batch_offset(P, &B.dout, b))
    qnf = bwd_pack_stored(&P.q, qbase, ws.rows.qoff, nr, P.Dk, <floating>P.scale, <floating *>ws.qs, B.dkp, rw)
    if B.bd_s:
        fa_pack_rows_bd(<const uint16_t *>qbase, ws.rows.qoff, P.q.sc, nr, P.Dk, <uint16_t *>ws.q2, bd_ld(P.Dk), rw)
    for i in range(nr):
        grp = ws.rows.goff[i]
        pos = r0 + i - grp * P.Lq
        ws.off[i] = grp * B.dout.sg + pos * B.dout.sr
    dnf = bwd_pack_stored(&B.dout, gbase, ws.off, nr, P.Dv, 1, <floating *>ws.dor, B.dvp, rw)
    if B.bd_dp:
        fa_pack_rows_bd(<const uint16_t *>gbase, ws.off, B.dout.sc, nr, P.Dv, <uint16_t *>ws.do2, bd_ld(P.Dv), rw)
    bwd_scores(B, ws, b, r0, nr, kb, n, rw, cw, s)
    bwd_tile_grads(s, dp, <floating *>ws.f, B.ts, (<floating *>ws.lse) + r0, (<floating *>ws.dd) + r0, rw, cw,
                   dp, <floating *>ws.db, <floating *>ws.pt, <floating *>ws.dst, B.tq)
    bwd_products(B, ws, r0, nr, kb, n, qnf, dnf, knf, dqacc)
    if B.want_dbias:
        bwd_dbias_add(B, ws, b, r0, nr, kb, <floating *>ws.db if B.softcap > 0 else dp)


cdef inline void bwd_store_row(const Operand *op, int64_t off, const floating *src, int64_t n) noexcept nogil:
    """A gradient row (n elements of src) into element off of dk / dv: the compute
    type at any column stride, or float16 / bfloat16 (contiguous rows: the entry
    allocates those) rounded once."""
    cdef floating *dst
    cdef int64_t c
    if op.store == native_store(<floating>0):
        dst = (<floating *>op.base) + off
        for c in range(n):
            dst[c * op.sc] = src[c]
    else:
        stored_scale_row_out(op.store, src, <char *>stored_at(op, off), n, 1)


cdef void bwd_key_block(const BwdPlan *B, BwdWorkspace *ws, int64_t b, int64_t kb, int64_t n,
                        floating *dqacc) noexcept nogil:
    """dK and dV of keys kb..kb+n-1 of batch element b over every query block
    that sees them (written once, at the end; zeros when none does, without
    reading the keys), and their share of dQ."""
    cdef const Plan *P = &B.P
    cdef floating *dk = <floating *>ws.dk
    cdef floating *dv = <floating *>ws.dv
    cdef int64_t r, j, r_first = B.nqb
    cdef int knf = 0
    for r in range(B.nqb):
        if ws.qhi[r] > kb and ws.qlo[r] < kb + n:
            r_first = r
            break
    if r_first < B.nqb:
        knf = bwd_pack_keys(B, ws, b, kb, n, <floating *>ws.kt)
    for j in range(round_up(n, FA_PV_MR) * B.dkp):
        dk[j] = 0
    for j in range(round_up(n, FA_PV_MR) * B.dvp):
        dv[j] = 0
    for r in range(r_first, B.nqb):
        if ws.qhi[r] > kb and ws.qlo[r] < kb + n:
            bwd_tile(B, ws, b, r, kb, n, knf, dqacc)
    for j in range(n):
        bwd_store_row(&B.dk, batch_offset(P, &B.dk, b) + (kb + j) * B.dk.sr, dk + j * B.dkp, P.Dk)
        bwd_store_row(&B.dv, batch_offset(P, &B.dv, b) + (kb + j) * B.dv.sr, dv + j * B.dvp, P.Dv)


cdef void bwd_store_dq_rows(const BwdPlan *B, int64_t b, int64_t r0, int64_t r1, const floating *src,
                            int64_t stride_g, int64_t G) noexcept nogil:
    """dq rows r0..r1-1 of batch element b = the sum over g < G, in order, of the
    rows src + g * stride_g + r * dkp (G == 1: a copy of the accumulator)."""
    cdef const Plan *P = &B.P
    cdef floating *dbase = (<floating *>B.dq.base) + batch_offset(P, &B.dq, b)
    cdef floating *dst
    cdef const floating *row
    cdef int64_t r, c, gi, grp, pos, m
    cdef floating acc
    cdef floating tmp[BWD_NARROW]
    for r in range(r0, r1):
        grp = r // P.Lq
        pos = r - grp * P.Lq
        row = src + r * B.dkp
        if floating is float:
            if B.dq.store != STORE_F32:
                # float16 / bfloat16 dq (contiguous: the entry allocates it): summed in
                # float32 BWD_NARROW columns at a time, rounded once
                c = 0
                while c < P.Dk:
                    m = min(<int64_t>BWD_NARROW, P.Dk - c)
                    fa_bwd_sum_rows_f(row + c, stride_g, G, m, tmp)
                    stored_scale_row_out(B.dq.store, tmp, <char *>stored_at(&B.dq, batch_offset(P, &B.dq, b)
                                         + grp * B.dq.sg + pos * B.dq.sr + c), m, 1)
                    c += m
                continue
        dst = dbase + grp * B.dq.sg + pos * B.dq.sr
        if B.dq.sc == 1:
            if floating is float:
                fa_bwd_sum_rows_f(row, stride_g, G, P.Dk, dst)
            else:
                fa_bwd_sum_rows_d(row, stride_g, G, P.Dk, dst)
            continue
        for c in range(P.Dk):
            acc = row[c]
            for gi in range(1, G):
                acc = acc + row[gi * stride_g + c]
            dst[c * B.dq.sc] = acc


cdef void bwd_unit(const BwdPlan *B, BwdWorkspace *ws, int64_t u, floating *dummy,
                   int *stop, double *next_check, bint checker) noexcept nogil:
    """Unit u: key group u % G of every batch element of slice u // G.  Stops
    early once *stop is set; the checker thread of a long call looks for Ctrl-C
    between key blocks (interrupt_check, driver.pxi)."""
    cdef const Plan *P = &B.P
    cdef int64_t sl = u // B.G, kg = u % B.G
    cdef int64_t first = B.starts[sl] if B.order != NULL else sl
    cdef int64_t last = B.starts[sl + 1] if B.order != NULL else sl + 1
    cdef int64_t idx, b, c, j, kb
    cdef floating *dqacc
    for idx in range(first, last):
        b = B.order[idx] if B.order != NULL else idx
        bwd_row_stats(B, ws, b, <floating *>ws.lse, <floating *>ws.dd)
        bwd_block_bounds(B, ws, b)
        if B.G == 1:
            dqacc = <floating *>ws.dq
        else:
            dqacc = (<floating *>B.partial) + (b * B.G + kg) * P.nrows * B.dkp
        for j in range(P.nrows * B.dkp):
            dqacc[j] = 0
        for c in range(B.nkb):
            if stop[0] or (checker and interrupt_check(stop, next_check)):
                return
            if key_group(c, B.G) == kg:
                kb = c * BWD_BK
                bwd_key_block(B, ws, b, kb, min(<int64_t>BWD_BK, P.Lk - kb), dqacc)
        if B.G == 1:
            bwd_store_dq_rows(B, b, 0, P.nrows, dqacc, 0, 1)


# ---------------------------------------------------------------- the parallel driver

cdef int bwd_run(BwdPlan *B, floating dummy, int nthreads) except -1:
    cdef int64_t units = B.nslices * B.G, u, b, r0
    cdef int64_t nred = B.P.nbatch * B.nqb
    cdef int64_t stride_g = B.P.nrows * B.dkp
    cdef int use_threads = nthreads > 1 and plan_work(&B.P) > PARALLEL_MIN_WORK
    cdef int failed = 0
    cdef int *failed_p = &failed
    cdef int stop = 0
    cdef int *stop_p = &stop
    # long calls check for Ctrl-C on the calling thread (OpenMP thread 0)
    cdef bint interruptible = plan_work(&B.P) > INTERRUPT_MIN_WORK
    cdef double next_check = fa_seconds() + INTERRUPT_EVERY if interruptible else 0
    cdef double *next_p = &next_check
    cdef BwdWorkspace *ws
    if not use_threads:
        with nogil:
            ws = bwd_workspace_new(B, sizeof(floating))
            if ws == NULL:
                failed = 1
            else:
                for u in range(units):
                    if stop:
                        break
                    bwd_unit(B, ws, u, <floating *>NULL, stop_p, next_p, interruptible)
                bwd_workspace_delete(ws)
    else:
        with nogil, parallel(num_threads=nthreads):
            ws = bwd_workspace_new(B, sizeof(floating))
            if ws == NULL:
                failed_p[0] = 1
            for u in prange(units, schedule='dynamic'):
                if ws != NULL and not stop_p[0]:
                    bwd_unit(B, ws, u, <floating *>NULL, stop_p, next_p, interruptible and threadid() == 0)
            bwd_workspace_delete(ws)
    if stop:
        return -1           # interrupted (KeyboardInterrupt set): no result
    if failed:
        raise MemoryError("fastattn: could not allocate the per-thread attention backward workspace")
    if B.G > 1:
        with nogil:
            for u in prange(nred, schedule='static', num_threads=nthreads, use_threads_if=use_threads):
                b = u // B.nqb
                r0 = (u % B.nqb) * BWD_BQ
                bwd_store_dq_rows(B, b, r0, min(r0 + BWD_BQ, B.P.nrows),
                                  (<floating *>B.partial) + b * B.G * stride_g, stride_g, B.G)
    return 0


cdef int64_t bwd_key_groups(const BwdPlan *B, size_t item) noexcept nogil:
    """Key groups per batch element: enough units for BWD_UNIT_TARGET, no more
    than key blocks, dq partials within BWD_PARTIAL_BUDGET; 1 when a dbias
    broadcast along the keys sums over all key blocks.  A function of the
    shape alone: the results must not depend on the thread count."""
    cdef int64_t G = (BWD_UNIT_TARGET + B.nslices - 1) // B.nslices
    cdef int64_t per_group = B.P.nbatch * B.P.nrows * B.dkp * <int64_t>item
    if G > B.nkb:
        G = B.nkb
    if per_group > 0 and G > BWD_PARTIAL_BUDGET // per_group:
        G = BWD_PARTIAL_BUDGET // per_group
    if B.want_dbias and B.dbias.sc == 0 and B.P.Lk > 1:
        G = 1
    return G if G > 1 else 1


cdef int backward_execute(BwdPlan *B, cnp.ndarray dout, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v,
                          cnp.ndarray out, cnp.ndarray lse, cnp.ndarray dq, cnp.ndarray dk, cnp.ndarray dv,
                          dbias, mask, bias, kvlen, kvstart, slopes, num_threads) except -1:
    """Gradients of attention on prepared arrays (the argument path of
    attention_backward, backward_entry.pxi, has checked them): B.P's batch
    layout, shapes and scalar options are set (P.softcap 0: B.softcap holds the
    softcap, applied here); dout and out (..., Hq, Lq, Dv), q, k, v of the
    compute type or, for a float32 compute type, float16 / bfloat16 (read in
    place, widened as the tiles are packed), lse of the compute type; dq, dk,
    dv writeable arrays of q's / k's / v's shape in the broadcast batch shape (no dim broadcast), every element written, of the
    compute type or (float32 compute) contiguous float16 / bfloat16; dbias (None:
    not wanted) zeros of bias's shape (>= 2 dims), accumulated into."""
    cdef int d, typenum = cnp.PyArray_TYPE(lse)         # the compute type (q, k, v, dO, O and the
    cdef size_t item = cnp.PyArray_ITEMSIZE(lse)        # gradients may be float16 / bfloat16)
    cdef int64_t W = FA_VBYTES // item
    cdef int64_t hq, b
    cdef int nthreads = 1
    cdef cnp.ndarray order = None, starts = None, partial = None, offs
    plan_init(&B.P, q, k, v, out)
    plan_options(&B.P, mask, bias, kvlen, slopes, None, lse)
    if kvstart is not None:
        B.P.has_kvstart = 1
        B.P.kvstart = <int64_t *>cnp.PyArray_DATA(kvstart)
    if B.P.Lq == 0 or B.P.nbatch == 0:
        return 0
    hq = B.P.g * (B.P.bshape[B.P.nb - 1] if B.P.nb > 0 else 1)
    B.Pv = B.P
    B.Pv.k = B.P.v
    B.Pv.Dk = B.P.Dv
    fill_operand(&B.dout, dout, 2, &B.P, hq)
    fill_operand(&B.dq, dq, 2, &B.P, hq)
    fill_operand(&B.dk, dk, 2, &B.P, hq)
    fill_operand(&B.dv, dv, 2, &B.P, hq)
    B.want_dbias = dbias is not None
    # bfloat16 pair dot products for S and dP where both operands are bfloat16 (the
    # forward's choice for S: fastattn.attention reads q and k the same way); not on
    # an AMX target, whose Intel cores widen faster (isa/x86_avx512_amx.h)
    B.bd_s = (typenum == cnp.NPY_FLOAT and FA_BF16_DOT != 0 and FA_AMX == 0 and B.P.q.store == STORE_BF16
              and B.P.k.store == STORE_BF16 and B.P.Dk > 0)
    B.bd_dp = (typenum == cnp.NPY_FLOAT and FA_BF16_DOT != 0 and FA_AMX == 0 and B.dout.store == STORE_BF16
               and B.P.v.store == STORE_BF16 and B.P.Dv > 0)
    if B.want_dbias:
        fill_operand(&B.dbias, dbias, 2, &B.P, hq)
    B.dkp = round_up(B.P.Dk if B.P.Dk > 0 else 1, W)
    B.dvp = round_up(B.P.Dv if B.P.Dv > 0 else 1, W)
    B.nkb = (B.P.Lk + BWD_BK - 1) // BWD_BK
    B.nqb = (B.P.nrows + BWD_BQ - 1) // BWD_BQ
    # small problems get small tiles (a small arena: no page faults per call);
    # QK panels are written whole, so score rows hold whole panels
    B.tq = tile_span(min(B.P.nrows, <int64_t>BWD_BQ), W)
    B.ts = max(tile_span(min(B.P.Lk, <int64_t>BWD_BK), W), round_up(min(B.P.Lk, <int64_t>BWD_BK), FA_QK_NV * W))
    # a dbias shared by batch elements: the elements of one dbias slice go to one
    # unit (they add into the same rows), in batch order
    B.order = NULL
    B.starts = NULL
    B.nslices = B.P.nbatch
    if B.want_dbias:
        offs = np.empty(B.P.nbatch, dtype=np.int64)
        for b in range(B.P.nbatch):
            (<int64_t *>cnp.PyArray_DATA(offs))[b] = batch_offset(&B.P, &B.dbias, b)
        if np.unique(offs).size < B.P.nbatch:
            order = np.ascontiguousarray(np.argsort(offs, kind="stable"), dtype=np.int64)
            cuts = np.flatnonzero(np.diff(offs[order])) + 1
            starts = np.ascontiguousarray(np.concatenate(([0], cuts, [B.P.nbatch])), dtype=np.int64)
            B.order = <const int64_t *>cnp.PyArray_DATA(order)
            B.starts = <const int64_t *>cnp.PyArray_DATA(starts)
            B.nslices = starts.size - 1
    B.G = bwd_key_groups(B, item)
    B.partial = NULL
    if B.G > 1:
        partial = np.empty(B.P.nbatch * B.G * B.P.nrows * B.dkp, dtype=lse.dtype)
        B.partial = <char *>cnp.PyArray_DATA(partial)
    if plan_work(&B.P) > PARALLEL_MIN_WORK:
        nthreads = _thread_resolver(num_threads)
    if typenum == cnp.NPY_FLOAT:
        bwd_run(B, <float>0, nthreads)
    else:
        bwd_run(B, <double>0, nthreads)
    return 0
