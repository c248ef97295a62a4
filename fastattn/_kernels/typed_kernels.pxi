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

cdef inline floating row_exp_sum_next(const floating *x, floating *y, int64_t n, floating m,
                                     const floating *nxt) noexcept nogil:
    if floating is float:
        return fa_row_exp_sum_next_f(x, y, n, m, nxt)
    else:
        return fa_row_exp_sum_next_d(x, y, n, m, nxt)

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

cdef inline void row_scale_stream(const floating *x, floating *y, int64_t n, floating a) noexcept nogil:
    if floating is float:
        fa_row_scale_stream_f(x, y, n, a)
    else:
        fa_row_scale_stream_d(x, y, n, a)

cdef inline void row_shift_stream(const floating *x, floating *y, int64_t n, floating a) noexcept nogil:
    if floating is float:
        fa_row_shift_stream_f(x, y, n, a)
    else:
        fa_row_shift_stream_d(x, y, n, a)

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


# ---------------------------------------------------------------- readers of stored operands
# One branch per storage type (STORE_*, plan.pxi): the kernels of stored_reads.h
# instantiated for it.  Stored pointers are addresses of elements of that type
# (stored_at); the double compute type reads only float64.

cdef inline int native_store(floating dummy) noexcept nogil:
    """The storage type that is the compute type itself (packed tiles)."""
    return STORE_F32 if floating is float else STORE_F64


cdef inline double stored_value(int store, const char *p, int64_t i) noexcept nogil:
    """Element i of the stored array at p, exactly (every storage type's values are
    float32 or float64 values)."""
    if store == STORE_F32:
        return (<const float *>p)[i]
    if store == STORE_F64:
        return (<const double *>p)[i]
    if store == STORE_F16:
        return fa_scalar_s_fh((<const uint16_t *>p)[i])
    if store == STORE_BF16:
        return fa_scalar_s_fb((<const uint16_t *>p)[i])
    if store == STORE_F8E4:
        return fa_scalar_s_fe4((<const uint8_t *>p)[i])
    if store == STORE_F8E5:
        return fa_scalar_s_fe5((<const uint8_t *>p)[i])
    return (<const int8_t *>p)[i]


cdef inline void stored_qk_rows(int store, const floating *qp, int64_t ldq, int64_t nr, int64_t D,
                                const char *k, int64_t ksr, int64_t n, floating *s, int64_t lds) noexcept nogil:
    """S[i][j] = qp[i] . k[j] for nr packed query rows and n stored key rows (ksr apart)."""
    stored_qk_rows_po(store, qp, ldq, nr, D, k, ksr, n, s, lds, FA_PF_AUTO)


cdef inline void stored_qk_rows_po(int store, const floating *qp, int64_t ldq, int64_t nr, int64_t D,
                                   const char *k, int64_t ksr, int64_t n, floating *s, int64_t lds,
                                   int64_t pfo) noexcept nogil:
    """stored_qk_rows, the key rows requested pfo rows on (FA_PF_AUTO: the kernel's distance)."""
    if floating is double:
        fa_qk_rows_d(qp, ldq, nr, D, <const double *>k, ksr, n, s, lds, pfo)
    elif store == STORE_F32:
        fa_qk_rows_f(qp, ldq, nr, D, <const float *>k, ksr, n, s, lds, pfo)
    elif store == STORE_F16:
        fa_qk_rows_fh(qp, ldq, nr, D, <const uint16_t *>k, ksr, n, s, lds, pfo)
    elif store == STORE_BF16:
        fa_qk_rows_fb(qp, ldq, nr, D, <const uint16_t *>k, ksr, n, s, lds, pfo)
    elif store == STORE_F8E4:
        fa_qk_rows_fe4(qp, ldq, nr, D, <const uint8_t *>k, ksr, n, s, lds, pfo)
    elif store == STORE_F8E5:
        fa_qk_rows_fe5(qp, ldq, nr, D, <const uint8_t *>k, ksr, n, s, lds, pfo)
    else:
        fa_qk_rows_fi8(qp, ldq, nr, D, <const int8_t *>k, ksr, n, s, lds, pfo)


cdef inline void stored_pv_rows(int store, const floating *p, int64_t ldp, int64_t nr, const char *v, int64_t ldv,
                                int64_t k0, int64_t k1, floating *o, int64_t ldo, int64_t nvec) noexcept nogil:
    """O[i] += sum_k P[i][k] V[k] for nr rows over stored value rows (ldv apart)."""
    stored_pv_rows_po(store, p, ldp, nr, v, ldv, k0, k1, o, ldo, nvec, FA_PF_AUTO)


cdef inline void stored_pv_rows_po(int store, const floating *p, int64_t ldp, int64_t nr, const char *v,
                                   int64_t ldv, int64_t k0, int64_t k1, floating *o, int64_t ldo, int64_t nvec,
                                   int64_t pfo) noexcept nogil:
    """stored_pv_rows, the value rows requested pfo rows on (FA_PF_AUTO: the kernel's distance)."""
    if floating is double:
        fa_pv_rows_d(p, ldp, nr, <const double *>v, ldv, k0, k1, o, ldo, nvec, pfo)
    elif store == STORE_F32:
        fa_pv_rows_f(p, ldp, nr, <const float *>v, ldv, k0, k1, o, ldo, nvec, pfo)
    elif store == STORE_F16:
        fa_pv_rows_fh(p, ldp, nr, <const uint16_t *>v, ldv, k0, k1, o, ldo, nvec, pfo)
    elif store == STORE_BF16:
        fa_pv_rows_fb(p, ldp, nr, <const uint16_t *>v, ldv, k0, k1, o, ldo, nvec, pfo)
    elif store == STORE_F8E4:
        fa_pv_rows_fe4(p, ldp, nr, <const uint8_t *>v, ldv, k0, k1, o, ldo, nvec, pfo)
    elif store == STORE_F8E5:
        fa_pv_rows_fe5(p, ldp, nr, <const uint8_t *>v, ldv, k0, k1, o, ldo, nvec, pfo)
    else:
        fa_pv_rows_fi8(p, ldp, nr, <const int8_t *>v, ldv, k0, k1, o, ldo, nvec, pfo)


cdef inline void stored_pv_qk_row1(int store, const floating *p, const char *v, int64_t ldv, int64_t k0, int64_t k1,
                                   floating *o, int64_t nvec, const floating *qp, int64_t D, const char *kn,
                                   int64_t ksr, int64_t nk, floating *sn) noexcept nogil:
    """One row's P.V over stored value rows and the next tile's scores over stored
    key rows (both of storage type store) in one pass."""
    stored_pv_qk_row1_po(store, p, v, ldv, k0, k1, o, nvec, qp, D, kn, ksr, nk, sn, FA_PF_AUTO, FA_PF_AUTO)


cdef inline void stored_pv_qk_row1_po(int store, const floating *p, const char *v, int64_t ldv, int64_t k0,
                                      int64_t k1, floating *o, int64_t nvec, const floating *qp, int64_t D,
                                      const char *kn, int64_t ksr, int64_t nk, floating *sn, int64_t pfov,
                                      int64_t pfok) noexcept nogil:
    """stored_pv_qk_row1, the value and key rows requested pfov / pfok rows on
    (FA_PF_AUTO: the kernel's distance)."""
    if floating is double:
        fa_pv_qk_row1_d(p, <const double *>v, ldv, k0, k1, o, nvec, 1, qp, D, <const double *>kn,
                        ksr, nk, sn, pfov, pfok)
    elif store == STORE_F32:
        fa_pv_qk_row1_f(p, <const float *>v, ldv, k0, k1, o, nvec, 1, qp, D, <const float *>kn,
                        ksr, nk, sn, pfov, pfok)
    elif store == STORE_F16:
        fa_pv_qk_row1_fh(p, <const uint16_t *>v, ldv, k0, k1, o, nvec, 1, qp, D, <const uint16_t *>kn,
                         ksr, nk, sn, pfov, pfok)
    elif store == STORE_BF16:
        fa_pv_qk_row1_fb(p, <const uint16_t *>v, ldv, k0, k1, o, nvec, 1, qp, D, <const uint16_t *>kn,
                         ksr, nk, sn, pfov, pfok)
    elif store == STORE_F8E4:
        fa_pv_qk_row1_fe4(p, <const uint8_t *>v, ldv, k0, k1, o, nvec, 1, qp, D, <const uint8_t *>kn,
                          ksr, nk, sn, pfov, pfok)
    elif store == STORE_F8E5:
        fa_pv_qk_row1_fe5(p, <const uint8_t *>v, ldv, k0, k1, o, nvec, 1, qp, D, <const uint8_t *>kn,
                          ksr, nk, sn, pfov, pfok)
    else:
        fa_pv_qk_row1_fi8(p, <const int8_t *>v, ldv, k0, k1, o, nvec, 1, qp, D, <const int8_t *>kn,
                          ksr, nk, sn, pfov, pfok)


cdef inline void stored_pack_transposed(int store, const char *q, const int64_t *qoff, int64_t nr, int64_t D,
                                        floating scale, floating *qt, int64_t ld, int64_t pf) noexcept nogil:
    """qt[d * ld + i] = q[qoff[i] + d] * scale (stored rows, elements contiguous)."""
    if floating is double:
        fa_pack_transposed_d(<const double *>q, qoff, nr, D, scale, qt, ld, pf)
    elif store == STORE_F32:
        fa_pack_transposed_f(<const float *>q, qoff, nr, D, scale, qt, ld, pf)
    elif store == STORE_F16:
        fa_pack_transposed_fh(<const uint16_t *>q, qoff, nr, D, scale, qt, ld, pf)
    elif store == STORE_BF16:
        fa_pack_transposed_fb(<const uint16_t *>q, qoff, nr, D, scale, qt, ld, pf)
    elif store == STORE_F8E4:
        fa_pack_transposed_fe4(<const uint8_t *>q, qoff, nr, D, scale, qt, ld, pf)
    elif store == STORE_F8E5:
        fa_pack_transposed_fe5(<const uint8_t *>q, qoff, nr, D, scale, qt, ld, pf)
    else:
        fa_pack_transposed_fi8(<const int8_t *>q, qoff, nr, D, scale, qt, ld, pf)


cdef inline int stored_pack_rows(int store, const char *src, int64_t sr, int64_t n, int64_t D,
                                 floating *dst, int64_t ldd) noexcept nogil:
    """n stored rows of D contiguous elements into dst rows ldd apart (widened);
    1 when one of them is inf or NaN."""
    if floating is double:
        return fa_pack_rows_d(<const double *>src, sr, n, D, dst, ldd)
    elif store == STORE_F32:
        return fa_pack_rows_f(<const float *>src, sr, n, D, dst, ldd)
    elif store == STORE_F16:
        return fa_pack_rows_fh(<const uint16_t *>src, sr, n, D, dst, ldd)
    elif store == STORE_BF16:
        return fa_pack_rows_fb(<const uint16_t *>src, sr, n, D, dst, ldd)
    elif store == STORE_F8E4:
        return fa_pack_rows_fe4(<const uint8_t *>src, sr, n, D, dst, ldd)
    elif store == STORE_F8E5:
        return fa_pack_rows_fe5(<const uint8_t *>src, sr, n, D, dst, ldd)
    else:
        return fa_pack_rows_fi8(<const int8_t *>src, sr, n, D, dst, ldd)


cdef inline void stored_scale_row(int store, const char *x, floating *y, int64_t n, floating a) noexcept nogil:
    """y[j] = x[j] * a, x a stored row."""
    if floating is double:
        fa_row_scale_d(<const double *>x, y, n, a)
    elif store == STORE_F32:
        fa_row_scale_f(<const float *>x, y, n, a)
    elif store == STORE_F16:
        fa_widen_scale_row_fh(<const uint16_t *>x, y, n, a)
    elif store == STORE_BF16:
        fa_widen_scale_row_fb(<const uint16_t *>x, y, n, a)
    elif store == STORE_F8E4:
        fa_widen_scale_row_fe4(<const uint8_t *>x, y, n, a)
    elif store == STORE_F8E5:
        fa_widen_scale_row_fe5(<const uint8_t *>x, y, n, a)
    else:
        fa_widen_scale_row_fi8(<const int8_t *>x, y, n, a)


cdef inline void stored_add_row(int store, floating *x, const char *b, int64_t n) noexcept nogil:
    """x[j] += b[j], b a stored row (a bias of a half-precision type)."""
    if floating is double:
        fa_add_row_d(x, <const double *>b, n)
    elif store == STORE_F32:
        fa_add_row_f(x, <const float *>b, n)
    elif store == STORE_F16:
        fa_add_row_fh(x, <const uint16_t *>b, n)
    elif store == STORE_BF16:
        fa_add_row_fb(x, <const uint16_t *>b, n)
    elif store == STORE_F8E4:
        fa_add_row_fe4(x, <const uint8_t *>b, n)
    elif store == STORE_F8E5:
        fa_add_row_fe5(x, <const uint8_t *>b, n)
    else:
        fa_add_row_fi8(x, <const int8_t *>b, n)


cdef inline void stored_qvec_bias(int store, floating *st, int64_t lds, int64_t j0, int64_t j1,
                                  const char *const *brows, int64_t ni) noexcept nogil:
    """St[j][i] += B_i[j] over lanes i < ni, B_i the lanes' stored bias rows."""
    if floating is double:
        fa_qvec_bias_d(st, lds, j0, j1, <const double *const *>brows, ni)
    elif store == STORE_F32:
        fa_qvec_bias_f(st, lds, j0, j1, <const float *const *>brows, ni)
    elif store == STORE_F16:
        fa_qvec_bias_fh(st, lds, j0, j1, <const uint16_t *const *>brows, ni)
    elif store == STORE_BF16:
        fa_qvec_bias_fb(st, lds, j0, j1, <const uint16_t *const *>brows, ni)
    elif store == STORE_F8E4:
        fa_qvec_bias_fe4(st, lds, j0, j1, <const uint8_t *const *>brows, ni)
    elif store == STORE_F8E5:
        fa_qvec_bias_fe5(st, lds, j0, j1, <const uint8_t *const *>brows, ni)
    else:
        fa_qvec_bias_fi8(st, lds, j0, j1, <const int8_t *const *>brows, ni)


# ---------------------------------------------------------------- stores of outputs
# Outputs are written in the compute type or, for float16 / bfloat16 results,
# narrowed here: each output element rounded once (STORE_F16 / STORE_BF16).

cdef inline void stored_set(int store, char *p, int64_t i, double x) noexcept nogil:
    """Element i of the output at p = x (a value of the compute type), in its storage type."""
    if store == STORE_F32:
        (<float *>p)[i] = <float>x
    elif store == STORE_F64:
        (<double *>p)[i] = x
    elif store == STORE_F16:
        (<uint16_t *>p)[i] = fa_narrow_s_fh(<float>x)
    else:
        (<uint16_t *>p)[i] = fa_narrow_s_fb(<float>x)


cdef inline void stored_scale_row_out(int store, const floating *x, char *y, int64_t n, floating a) noexcept nogil:
    """y[j] = x[j] * a, y an output row of its storage type (elements contiguous)."""
    if floating is double:
        fa_row_scale_d(x, <double *>y, n, a)
    elif store == STORE_F32:
        fa_row_scale_f(x, <float *>y, n, a)
    elif store == STORE_F16:
        fa_store_scaled_row_fh(x, <uint16_t *>y, n, a)
    else:
        fa_store_scaled_row_fb(x, <uint16_t *>y, n, a)


cdef inline void stored_qvec_store_rows(int store, const floating *ot, int64_t ldo, int64_t nr, int64_t Dv,
                                        const floating *inv, char *o, int64_t sor) noexcept nogil:
    """The query-vectorised unit's output rows o[i * sor + c] = Ot[c][i] * inv[i]."""
    if floating is double:
        fa_qvec_store_rows_d(ot, ldo, nr, Dv, inv, <double *>o, sor)
    elif store == STORE_F32:
        fa_qvec_store_rows_f(ot, ldo, nr, Dv, inv, <float *>o, sor)
    elif store == STORE_F16:
        fa_qvec_store_rows_fh(ot, ldo, nr, Dv, inv, <uint16_t *>o, sor)
    else:
        fa_qvec_store_rows_fb(ot, ldo, nr, Dv, inv, <uint16_t *>o, sor)


cdef inline int dequant_rows(const uint8_t *x, int64_t xsr, int bits, const float *scale, int64_t ssr, int64_t ssc,
                             const float *zero, int64_t zsr, int64_t zsc, int64_t n, int64_t D, int64_t G,
                             floating *dst, int64_t ld) noexcept nogil:
    if floating is float:
        return fa_dequant_rows_f(x, xsr, bits, scale, ssr, ssc, zero, zsr, zsc, n, D, G, dst, ld)
    else:
        return fa_dequant_rows_d(x, xsr, bits, scale, ssr, ssc, zero, zsr, zsc, n, D, G, dst, ld)
