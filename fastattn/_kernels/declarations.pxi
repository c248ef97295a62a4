# The C side as Cython sees it: the kernels of simd.h (every ISA variant compiles
# the same names for its own vector width), the fused compute type, the imports
# every other part of the kernel module uses.

from cython.parallel cimport prange, parallel, threadid
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uintptr_t
from libc.math cimport exp, log, sqrt, isfinite, INFINITY, NAN

cimport numpy as cnp
import numpy as np

cnp.import_array()

ctypedef fused floating:
    float
    double

cdef extern from "simd.h" nogil:
    """
    #if FASTATTN_HAVE_OPENMP
    #include <omp.h>
    #endif
    """
    const char *FA_ISA
    int fa_pf_wide
    int fa_pf_l2
    const int64_t FA_PF_AUTO   # the few-rows streams' own prefetch distance (simd.h)
    enum:
        FA_VBYTES
        FA_QVEC_MR
        FA_QVEC_NV
        FA_QK_MR
        FA_QK_NV
        FA_PV_MR
        FA_PV_NV
    void *fa_alloc(size_t nbytes)
    void fa_free(void *p)
    void *fa_arena_take(size_t nbytes)
    void fa_arena_give(void *p, size_t nbytes)
    float fa_row_max_f(const float *x, int64_t n)
    double fa_row_max_d(const double *x, int64_t n)
    float fa_row_max_nonan_f(const float *x, int64_t n)
    double fa_row_max_nonan_d(const double *x, int64_t n)
    void fa_col_softmax_chunk_f(const float *x, int64_t sx, float *y, int64_t sy, int64_t n, int log_mode)
    void fa_col_softmax_chunk_d(const double *x, int64_t sx, double *y, int64_t sy, int64_t n, int log_mode)
    void fa_col_softmax_vec_f(const float *x, int64_t sx, float *y, int64_t sy, int64_t n, int log_mode)
    void fa_col_softmax_vec_d(const double *x, int64_t sx, double *y, int64_t sy, int64_t n, int log_mode)
    void fa_pack_transposed_f(const float *q, const int64_t *qoff, int64_t nr, int64_t D, float scale, float *qt,
                      int64_t ld, int64_t pf)
    void fa_pack_transposed_d(const double *q, const int64_t *qoff, int64_t nr, int64_t D, double scale, double *qt,
                      int64_t ld, int64_t pf)
    void fa_qvec_store_rows_f(const float *ot, int64_t ldo, int64_t nr, int64_t Dv, const float *inv, float *o, int64_t sor)
    void fa_qvec_store_rows_d(const double *ot, int64_t ldo, int64_t nr, int64_t Dv, const double *inv, double *o, int64_t sor)
    float fa_row_exp_sum_f(const float *x, float *y, int64_t n, float m)
    double fa_row_exp_sum_d(const double *x, double *y, int64_t n, double m)
    float fa_row_exp_sum_next_f(const float *x, float *y, int64_t n, float m, const float *nxt)
    double fa_row_exp_sum_next_d(const double *x, double *y, int64_t n, double m, const double *nxt)
    float fa_row_exp_sum_p_f(const float *x, float *y, int64_t n, float m)
    double fa_row_exp_sum_p_d(const double *x, double *y, int64_t n, double m)
    float fa_exp_p_f(float x)
    double fa_exp_p_d(double x)
    void fa_row_scale_f(const float *x, float *y, int64_t n, float a)
    void fa_row_scale_d(const double *x, double *y, int64_t n, double a)
    void fa_row_shift_f(const float *x, float *y, int64_t n, float a)
    void fa_row_shift_d(const double *x, double *y, int64_t n, double a)
    void fa_row_scale_stream_f(const float *x, float *y, int64_t n, float a)
    void fa_row_scale_stream_d(const double *x, double *y, int64_t n, double a)
    void fa_row_shift_stream_f(const float *x, float *y, int64_t n, float a)
    void fa_row_shift_stream_d(const double *x, double *y, int64_t n, double a)
    void fa_stream_fence()
    void fa_row_softcap_f(float *x, int64_t n, float c)
    void fa_row_softcap_d(double *x, int64_t n, double c)
    void fa_row_mask_bool_f(float *x, const uint8_t *m, int64_t n)
    void fa_row_mask_bool_d(double *x, const uint8_t *m, int64_t n)
    void fa_qvec_bias_f(float *st, int64_t lds, int64_t j0, int64_t j1, const float *const *brows, int64_t ni)
    void fa_qvec_bias_d(double *st, int64_t lds, int64_t j0, int64_t j1, const double *const *brows, int64_t ni)
    void fa_qvec_alibi_f(float *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0, const float *slopes,
                     const int64_t *goff, const int64_t *pos, int64_t ni, int nv)
    void fa_qvec_alibi_d(double *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0, const double *slopes,
                     const int64_t *goff, const int64_t *pos, int64_t ni, int nv)
    void fa_qk_block_f(const float *qp, int64_t ldq, const float *kt, int64_t D,
                       float *s, int64_t lds, int64_t c0, int64_t e)
    void fa_qk_block_d(const double *qp, int64_t ldq, const double *kt, int64_t D,
                       double *s, int64_t lds, int64_t c0, int64_t e)
    void fa_pv_block_f(const float *p, int64_t ldp, const float *vp, int64_t ldv,
                       int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec)
    void fa_pv_block_d(const double *p, int64_t ldp, const double *vp, int64_t ldv,
                       int64_t k0, int64_t k1, double *o, int64_t ldo, int64_t nvec)
    void fa_qvec_qk_chunk_f(const float *k, int64_t ksr, int64_t ksc, const float *qt, int64_t ldq,
                        int64_t D, float *st, int64_t lds, int64_t j0, int64_t j1, float *mx, int nv,
                        int pf)
    void fa_qvec_qk_chunk_d(const double *k, int64_t ksr, int64_t ksc, const double *qt, int64_t ldq,
                        int64_t D, double *st, int64_t lds, int64_t j0, int64_t j1, double *mx, int nv,
                        int pf)
    int FA_BF16_DOT
    int FA_AMX
    void fa_amx_unit_end()
    void fa_qvec_qk_chunk_bd(const uint16_t *k, int64_t ksr, const float *q2, int64_t ldq, int64_t D,
                             float scale, float *st, int64_t lds, int64_t j0, int64_t j1, float *mx,
                             int nv, int pf)
    void fa_pack_pairs_bd(const uint16_t *q, const int64_t *qoff, int64_t nr, int64_t D, float *q2,
                          int64_t ld)
    void fa_qk_block_bd(const uint16_t *q2, int64_t ldq, const uint32_t *kt2, int64_t D2, float scale,
                        float *s, int64_t lds, int64_t c0, int64_t e)
    void fa_pack_rows_bd(const uint16_t *base, const int64_t *off, int64_t sc, int64_t nr, int64_t D,
                         uint16_t *dst, int64_t ld, int64_t npad)
    int FA_BD_QKR_MAX
    void fa_qk_rows_bd(const uint16_t *q2, int64_t ldq, int64_t nr, int64_t D, const uint16_t *k, int64_t ksr,
                       int64_t n, float scale, float *s, int64_t lds, int64_t pfo)
    void fa_pack_key_pairs_bd(const uint16_t *base, const int64_t *off, int64_t sc, int64_t n, int64_t D,
                              uint32_t *kt2)
    int FA_BF16_PV
    int fa_pack_value_pairs_bd(const uint16_t *v, int64_t vsr, int64_t vsc, int64_t n, int64_t Dv,
                               uint32_t *v2, int64_t ld)
    void fa_qvec_softmax_chunk_bd(float *st, int64_t lds, int64_t j0, int64_t j1, float *m, float *l,
                                  float *ot, int64_t ldo, int64_t Dv, const float *mx, float sc, float *f,
                                  int nv)
    void fa_qvec_pv_chunk_bd(const uint32_t *v2, int64_t ld2, int64_t Dv, const float *p2, int64_t lds,
                             int64_t p0, int64_t p1, float *ot, int64_t ldo, const float *f, int nv)
    int FA_BF16_PACK_COLS
    void fa_pv_rows_bd(const float *p, int64_t ldp, int64_t nr, const uint16_t *v, int64_t ldv, int64_t k0,
                       int64_t k1, float *o, int64_t ldo, int64_t D, const float *pm, int64_t pfo)
    void fa_qvec_pv_chunk_f(const float *v, int64_t vsr, int64_t vsc, int64_t Dv, const float *pt,
                        int64_t lds, int64_t j0, int64_t j1, float *ot, int64_t ldo, int nv)
    void fa_qvec_pv_chunk_d(const double *v, int64_t vsr, int64_t vsc, int64_t Dv, const double *pt,
                        int64_t lds, int64_t j0, int64_t j1, double *ot, int64_t ldo, int nv)
    void fa_qvec_range_mask_chunk_f(float *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                          const float *lo, const float *hi, int nv)
    void fa_qvec_range_mask_chunk_d(double *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                          const double *lo, const double *hi, int nv)
    void fa_qvec_softmax_chunk_f(float *st, int64_t lds, int64_t j0, int64_t j1, float *m, float *l,
                             float *ot, int64_t ldo, int64_t Dv, const float *mx, int nv)
    void fa_qvec_softmax_chunk_d(double *st, int64_t lds, int64_t j0, int64_t j1, double *m, double *l,
                             double *ot, int64_t ldo, int64_t Dv, const double *mx, int nv)
    void fa_qk_rows_f(const float *qp, int64_t ldq, int64_t nr, int64_t D, const float *k, int64_t ksr,
                      int64_t n, float *s, int64_t lds, int64_t pfo)
    void fa_qk_rows_d(const double *qp, int64_t ldq, int64_t nr, int64_t D, const double *k, int64_t ksr,
                      int64_t n, double *s, int64_t lds, int64_t pfo)
    void fa_pv_rows_f(const float *p, int64_t ldp, int64_t nr, const float *v, int64_t ldv,
                      int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec, int64_t pfo)
    void fa_pv_rows_d(const double *p, int64_t ldp, int64_t nr, const double *v, int64_t ldv,
                      int64_t k0, int64_t k1, double *o, int64_t ldo, int64_t nvec, int64_t pfo)
    void fa_pv_qk_row1_f(const float *p, const float *v, int64_t ldv, int64_t k0, int64_t k1,
                         float *o, int64_t nvec, int prefetch, const float *qp, int64_t D, const float *kn,
                         int64_t ksr, int64_t nk, float *sn, int64_t pfov, int64_t pfok)
    void fa_pv_qk_row1_d(const double *p, const double *v, int64_t ldv, int64_t k0, int64_t k1,
                         double *o, int64_t nvec, int prefetch, const double *qp, int64_t D, const double *kn,
                         int64_t ksr, int64_t nk, double *sn, int64_t pfov, int64_t pfok)
    void fa_qvec_bool_mask_chunk_f(float *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                               const uint8_t *const *mrows, int64_t nl, int64_t sc, uint8_t *tbuf,
                               int nv)
    void fa_qvec_bool_mask_chunk_d(double *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                               const uint8_t *const *mrows, int64_t nl, int64_t sc, uint8_t *tbuf,
                               int nv)
    void fa_qvec_weights_chunk_f(float *st, int64_t lds, int64_t j0, int64_t j1, const float *lse, int nv)
    void fa_qvec_weights_chunk_d(double *st, int64_t lds, int64_t j0, int64_t j1, const double *lse, int nv)
    void fa_prefetch_rows_f(const float *p, int64_t nrows, int64_t sr, int64_t n)
    void fa_prefetch_rows_d(const double *p, int64_t nrows, int64_t sr, int64_t n)
    int fa_block_nonfinite_f(const float *x, int64_t rows, int64_t cols, int64_t sr, int64_t sc)
    int fa_block_nonfinite_d(const double *x, int64_t rows, int64_t cols, int64_t sr, int64_t sc)
    int fa_pack_rows_f(const float *src, int64_t sr, int64_t n, int64_t D, float *dst, int64_t ldd)
    int fa_pack_rows_d(const double *src, int64_t sr, int64_t n, int64_t D, double *dst, int64_t ldd)

    # readers of stored rows for float compute and half-precision / int8 storage
    # (stored_reads.h instantiated with widen.h; _fh float16, _fb bfloat16, _fi8 int8,
    # _fe4 float8_e4m3fn, _fe5 float8_e5m2)
    float fa_scalar_s_fh(uint16_t x)
    void fa_pack_transposed_fh(const uint16_t *q, const int64_t *qoff, int64_t nr, int64_t D, float scale, float *qt,
                      int64_t ld, int64_t pf)
    int fa_pack_rows_fh(const uint16_t *src, int64_t sr, int64_t n, int64_t D, float *dst, int64_t ldd)
    void fa_qk_rows_fh(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint16_t *k, int64_t ksr,
                      int64_t n, float *s, int64_t lds, int64_t pfo)
    void fa_pv_rows_fh(const float *p, int64_t ldp, int64_t nr, const uint16_t *v, int64_t ldv,
                      int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec, int64_t pfo)
    void fa_pv_qk_row1_fh(const float *p, const uint16_t *v, int64_t ldv, int64_t k0, int64_t k1,
                         float *o, int64_t nvec, int prefetch, const float *qp, int64_t D, const uint16_t *kn,
                         int64_t ksr, int64_t nk, float *sn, int64_t pfov, int64_t pfok)
    void fa_qvec_bias_fh(float *st, int64_t lds, int64_t j0, int64_t j1, const uint16_t *const *brows, int64_t ni)
    void fa_widen_scale_row_fh(const uint16_t *x, float *y, int64_t n, float a)
    void fa_add_row_fh(float *x, const uint16_t *b, int64_t n)
    float fa_scalar_s_fb(uint16_t x)
    void fa_pack_transposed_fb(const uint16_t *q, const int64_t *qoff, int64_t nr, int64_t D, float scale, float *qt,
                      int64_t ld, int64_t pf)
    int fa_pack_rows_fb(const uint16_t *src, int64_t sr, int64_t n, int64_t D, float *dst, int64_t ldd)
    void fa_qk_rows_fb(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint16_t *k, int64_t ksr,
                      int64_t n, float *s, int64_t lds, int64_t pfo)
    void fa_pv_rows_fb(const float *p, int64_t ldp, int64_t nr, const uint16_t *v, int64_t ldv,
                      int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec, int64_t pfo)
    void fa_pv_qk_row1_fb(const float *p, const uint16_t *v, int64_t ldv, int64_t k0, int64_t k1,
                         float *o, int64_t nvec, int prefetch, const float *qp, int64_t D, const uint16_t *kn,
                         int64_t ksr, int64_t nk, float *sn, int64_t pfov, int64_t pfok)
    void fa_qvec_bias_fb(float *st, int64_t lds, int64_t j0, int64_t j1, const uint16_t *const *brows, int64_t ni)
    void fa_widen_scale_row_fb(const uint16_t *x, float *y, int64_t n, float a)
    void fa_add_row_fb(float *x, const uint16_t *b, int64_t n)
    float fa_scalar_s_fi8(int8_t x)
    void fa_pack_transposed_fi8(const int8_t *q, const int64_t *qoff, int64_t nr, int64_t D, float scale, float *qt,
                      int64_t ld, int64_t pf)
    int fa_pack_rows_fi8(const int8_t *src, int64_t sr, int64_t n, int64_t D, float *dst, int64_t ldd)
    void fa_qk_rows_fi8(const float *qp, int64_t ldq, int64_t nr, int64_t D, const int8_t *k, int64_t ksr,
                      int64_t n, float *s, int64_t lds, int64_t pfo)
    void fa_pv_rows_fi8(const float *p, int64_t ldp, int64_t nr, const int8_t *v, int64_t ldv,
                      int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec, int64_t pfo)
    void fa_pv_qk_row1_fi8(const float *p, const int8_t *v, int64_t ldv, int64_t k0, int64_t k1,
                         float *o, int64_t nvec, int prefetch, const float *qp, int64_t D, const int8_t *kn,
                         int64_t ksr, int64_t nk, float *sn, int64_t pfov, int64_t pfok)
    void fa_qvec_bias_fi8(float *st, int64_t lds, int64_t j0, int64_t j1, const int8_t *const *brows, int64_t ni)
    void fa_widen_scale_row_fi8(const int8_t *x, float *y, int64_t n, float a)
    void fa_add_row_fi8(float *x, const int8_t *b, int64_t n)
    float fa_scalar_s_fe4(uint8_t x)
    void fa_pack_transposed_fe4(const uint8_t *q, const int64_t *qoff, int64_t nr, int64_t D, float scale, float *qt,
                      int64_t ld, int64_t pf)
    int fa_pack_rows_fe4(const uint8_t *src, int64_t sr, int64_t n, int64_t D, float *dst, int64_t ldd)
    void fa_qk_rows_fe4(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint8_t *k, int64_t ksr,
                      int64_t n, float *s, int64_t lds, int64_t pfo)
    void fa_pv_rows_fe4(const float *p, int64_t ldp, int64_t nr, const uint8_t *v, int64_t ldv,
                      int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec, int64_t pfo)
    void fa_pv_qk_row1_fe4(const float *p, const uint8_t *v, int64_t ldv, int64_t k0, int64_t k1,
                         float *o, int64_t nvec, int prefetch, const float *qp, int64_t D, const uint8_t *kn,
                         int64_t ksr, int64_t nk, float *sn, int64_t pfov, int64_t pfok)
    void fa_qvec_bias_fe4(float *st, int64_t lds, int64_t j0, int64_t j1, const uint8_t *const *brows, int64_t ni)
    void fa_widen_scale_row_fe4(const uint8_t *x, float *y, int64_t n, float a)
    void fa_add_row_fe4(float *x, const uint8_t *b, int64_t n)
    float fa_scalar_s_fe5(uint8_t x)
    void fa_pack_transposed_fe5(const uint8_t *q, const int64_t *qoff, int64_t nr, int64_t D, float scale, float *qt,
                      int64_t ld, int64_t pf)
    int fa_pack_rows_fe5(const uint8_t *src, int64_t sr, int64_t n, int64_t D, float *dst, int64_t ldd)
    void fa_qk_rows_fe5(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint8_t *k, int64_t ksr,
                      int64_t n, float *s, int64_t lds, int64_t pfo)
    void fa_pv_rows_fe5(const float *p, int64_t ldp, int64_t nr, const uint8_t *v, int64_t ldv,
                      int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec, int64_t pfo)
    void fa_pv_qk_row1_fe5(const float *p, const uint8_t *v, int64_t ldv, int64_t k0, int64_t k1,
                         float *o, int64_t nvec, int prefetch, const float *qp, int64_t D, const uint8_t *kn,
                         int64_t ksr, int64_t nk, float *sn, int64_t pfov, int64_t pfok)
    void fa_qvec_bias_fe5(float *st, int64_t lds, int64_t j0, int64_t j1, const uint8_t *const *brows, int64_t ni)
    void fa_widen_scale_row_fe5(const uint8_t *x, float *y, int64_t n, float a)
    void fa_add_row_fe5(float *x, const uint8_t *b, int64_t n)
    # QuantizedKV rows dequantized into a tile (quant_reads.h)
    int fa_dequant_rows_f(const uint8_t *x, int64_t xsr, int bits, const float *scale, int64_t ssr, int64_t ssc,
                          const float *zero, int64_t zsr, int64_t zsc, int64_t n, int64_t D, int64_t G, float *dst,
                          int64_t ld)
    int fa_dequant_rows_d(const uint8_t *x, int64_t xsr, int bits, const float *scale, int64_t ssr, int64_t ssc,
                          const float *zero, int64_t zsr, int64_t zsc, int64_t n, int64_t D, int64_t G, double *dst,
                          int64_t ld)
    void fa_qk_rows_qz_f(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint8_t *x, int64_t xsr, int bits,
                         const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr, int64_t zsc,
                         int64_t G, int64_t n, float *s, int64_t lds)
    void fa_pv_rows_qz_f(const float *p, int64_t ldp, int64_t nr, const uint8_t *x, int64_t xsr, int bits,
                         const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr, int64_t zsc,
                         int64_t G, int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t D)
    void fa_prefetch_bytes(const void *p, int64_t nbytes)
    void fa_widen_scale_row_f(const float *x, float *y, int64_t n, float a)
    void fa_add_row_f(float *x, const float *b, int64_t n)
    void fa_add_row_d(double *x, const double *b, int64_t n)
    # stores of outputs: the native types and the half-precision ones (narrowed once)
    void fa_qvec_store_rows_fh(const float *ot, int64_t ldo, int64_t nr, int64_t Dv, const float *inv,
                                 uint16_t *o, int64_t sor)
    void fa_store_scaled_row_fh(const float *x, uint16_t *y, int64_t n, float a)
    uint16_t fa_narrow_s_fh(float x)
    void fa_qvec_store_rows_fb(const float *ot, int64_t ldo, int64_t nr, int64_t Dv, const float *inv,
                                 uint16_t *o, int64_t sor)
    void fa_store_scaled_row_fb(const float *x, uint16_t *y, int64_t n, float a)
    uint16_t fa_narrow_s_fb(float x)

ISA = FA_ISA.decode()
