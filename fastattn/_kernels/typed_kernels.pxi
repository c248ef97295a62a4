# Fused-type wrappers: one Cython name per C kernel, resolving to its _f (float)
# or _d (double) instantiation at compile time.

cdef inline floating row_max(const floating *x, int64_t n) noexcept nogil:
    if floating is float:
        return fa_row_max_f(x, n)
    else:
        return fa_row_max_d(x, n)

cdef inline floating row_max_nonan(const floating *x, int64_t n) noexcept nogil:
    if floating is float:
        return fa_row_max_nonan_f(x, n)
    else:
        return fa_row_max_nonan_d(x, n)

cdef inline void qvec_store_rows(const floating *ot, int64_t ldo, int64_t nr, int64_t Dv, const floating *inv,
                           floating *o, int64_t sor) noexcept nogil:
    if floating is float:
        fa_qvec_store_rows_f(ot, ldo, nr, Dv, inv, o, sor)
    else:
        fa_qvec_store_rows_d(ot, ldo, nr, Dv, inv, o, sor)

cdef inline floating row_exp_sum(const floating *x, floating *y, int64_t n, floating m) noexcept nogil:
    if floating is float:
        return fa_row_exp_sum_f(x, y, n, m)
    else:
        return fa_row_exp_sum_d(x, y, n, m)

cdef inline void row_scale(const floating *x, floating *y, int64_t n, floating a) noexcept nogil:
    if floating is float:
        fa_row_scale_f(x, y, n, a)
    else:
        fa_row_scale_d(x, y, n, a)

cdef inline void row_shift(const floating *x, floating *y, int64_t n, floating a) noexcept nogil:
    if floating is float:
        fa_row_shift_f(x, y, n, a)
    else:
        fa_row_shift_d(x, y, n, a)

cdef inline void prefetch_rows(const floating *p, int64_t nrows, int64_t sr, int64_t n) noexcept nogil:
    if floating is float:
        fa_prefetch_rows_f(p, nrows, sr, n)
    else:
        fa_prefetch_rows_d(p, nrows, sr, n)

cdef inline void row_softcap(floating *x, int64_t n, floating c) noexcept nogil:
    if floating is float:
        fa_row_softcap_f(x, n, c)
    else:
        fa_row_softcap_d(x, n, c)

cdef inline void qk_block(const floating *qp, int64_t ldq, const floating *kt, int64_t D,
                          floating *s, int64_t lds, int64_t c0, int64_t e) noexcept nogil:
    if floating is float:
        fa_qk_block_f(qp, ldq, kt, D, s, lds, c0, e)
    else:
        fa_qk_block_d(qp, ldq, kt, D, s, lds, c0, e)

cdef inline void pv_block(const floating *p, int64_t ldp, const floating *vp, int64_t ldv,
                          int64_t k0, int64_t k1, floating *o, int64_t ldo, int64_t nvec) noexcept nogil:
    if floating is float:
        fa_pv_block_f(p, ldp, vp, ldv, k0, k1, o, ldo, nvec)
    else:
        fa_pv_block_d(p, ldp, vp, ldv, k0, k1, o, ldo, nvec)


cdef inline void qvec_qk_chunk(const floating *k, int64_t ksr, int64_t ksc, const floating *qt, int64_t ldq,
                           int64_t D, floating *st, int64_t lds, int64_t j0, int64_t j1,
                           floating *mx, int nv, int pf) noexcept nogil:
    if floating is float:
        fa_qvec_qk_chunk_f(k, ksr, ksc, qt, ldq, D, st, lds, j0, j1, mx, nv, pf)
    else:
        fa_qvec_qk_chunk_d(k, ksr, ksc, qt, ldq, D, st, lds, j0, j1, mx, nv, pf)

cdef inline void qvec_pv_chunk(const floating *v, int64_t vsr, int64_t vsc, int64_t Dv, const floating *pt,
                           int64_t lds, int64_t j0, int64_t j1, floating *ot, int64_t ldo,
                           int nv) noexcept nogil:
    if floating is float:
        fa_qvec_pv_chunk_f(v, vsr, vsc, Dv, pt, lds, j0, j1, ot, ldo, nv)
    else:
        fa_qvec_pv_chunk_d(v, vsr, vsc, Dv, pt, lds, j0, j1, ot, ldo, nv)

cdef inline void qvec_range_mask_chunk(floating *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                             const floating *lo, const floating *hi, int nv) noexcept nogil:
    if floating is float:
        fa_qvec_range_mask_chunk_f(st, lds, j0, j1, t0, lo, hi, nv)
    else:
        fa_qvec_range_mask_chunk_d(st, lds, j0, j1, t0, lo, hi, nv)

cdef inline void qvec_softmax_chunk(floating *st, int64_t lds, int64_t j0, int64_t j1, floating *m,
                                floating *l, floating *ot, int64_t ldo, int64_t Dv,
                                const floating *mx, int nv) noexcept nogil:
    if floating is float:
        fa_qvec_softmax_chunk_f(st, lds, j0, j1, m, l, ot, ldo, Dv, mx, nv)
    else:
        fa_qvec_softmax_chunk_d(st, lds, j0, j1, m, l, ot, ldo, Dv, mx, nv)

cdef inline void qk_rows(const floating *qp, int64_t ldq, int64_t nr, int64_t D, const floating *k,
                         int64_t ksr, int64_t n, floating *s, int64_t lds) noexcept nogil:
    if floating is float:
        fa_qk_rows_f(qp, ldq, nr, D, k, ksr, n, s, lds)
    else:
        fa_qk_rows_d(qp, ldq, nr, D, k, ksr, n, s, lds)

cdef inline void pv_rows(const floating *p, int64_t ldp, int64_t nr, const floating *v, int64_t ldv,
                         int64_t k0, int64_t k1, floating *o, int64_t ldo, int64_t nvec) noexcept nogil:
    if floating is float:
        fa_pv_rows_f(p, ldp, nr, v, ldv, k0, k1, o, ldo, nvec)
    else:
        fa_pv_rows_d(p, ldp, nr, v, ldv, k0, k1, o, ldo, nvec)

cdef inline void pv_qk_row1(const floating *p, const floating *v, int64_t ldv, int64_t k0, int64_t k1,
                            floating *o, int64_t nvec, const floating *qp, int64_t D, const floating *kn,
                            int64_t ksr, int64_t nk, floating *sn) noexcept nogil:
    if floating is float:
        fa_pv_qk_row1_f(p, v, ldv, k0, k1, o, nvec, 1, qp, D, kn, ksr, nk, sn)
    else:
        fa_pv_qk_row1_d(p, v, ldv, k0, k1, o, nvec, 1, qp, D, kn, ksr, nk, sn)

cdef inline void qvec_bool_mask_chunk(floating *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                                  const uint8_t *const *mrows, int64_t nl, int64_t sc,
                                  uint8_t *tbuf, int nv) noexcept nogil:
    if floating is float:
        fa_qvec_bool_mask_chunk_f(st, lds, j0, j1, t0, mrows, nl, sc, tbuf, nv)
    else:
        fa_qvec_bool_mask_chunk_d(st, lds, j0, j1, t0, mrows, nl, sc, tbuf, nv)

cdef inline void qvec_weights_chunk(floating *st, int64_t lds, int64_t j0, int64_t j1, const floating *lse,
                                int nv) noexcept nogil:
    if floating is float:
        fa_qvec_weights_chunk_f(st, lds, j0, j1, lse, nv)
    else:
        fa_qvec_weights_chunk_d(st, lds, j0, j1, lse, nv)

cdef inline int block_nonfinite(const floating *x, int64_t rows, int64_t cols, int64_t sr, int64_t sc) noexcept nogil:
    if floating is float:
        return fa_block_nonfinite_f(x, rows, cols, sr, sc)
    else:
        return fa_block_nonfinite_d(x, rows, cols, sr, sc)
