/* The steady-state loops of the kernels, one small exported function each, so
 * tools/arm/mca_report.py can compile this file for a target (the kernel headers
 * with a target header, as a kernel variant is built), find each function's
 * innermost hot loop in the assembly and give it to llvm-mca.  Nothing here is
 * shipped; the functions only call the kernels' own building blocks with the
 * shapes of the standard cases. */
#include "simd.h"

/* prefill, query-vectorised (lanes over queries): a widest chunk of FA_QVEC_NV
 * vectors, D = 64 and 128 */
void mca_qvec_qk(const float *k, int64_t ksr, const float *qt, int64_t ldq, int64_t D, float *st, int64_t lds,
                 int64_t n, float *mx)
{
    fa_qvec_qk_chunk_f(k, ksr, 1, qt, ldq, D, st, lds, 0, n, mx, FA_QVEC_NV, 0);
}

void mca_qvec_pv(const float *v, int64_t vsr, int64_t Dv, const float *pt, int64_t lds, int64_t n, float *ot,
                 int64_t ldo)
{
    fa_qvec_pv_chunk_f(v, vsr, 1, Dv, pt, lds, 0, n, ot, ldo, FA_QVEC_NV);
}

#if FA_BF16_DOT
/* the same chunk of bfloat16 queries and keys by pair dot products (bf16_dot.h) */
void mca_qvec_qk_bd(const uint16_t *k, int64_t ksr, const float *q2, int64_t ldq, int64_t D, float *st,
                    int64_t lds, int64_t n, float *mx)
{
    fa_qvec_qk_chunk_bd(k, ksr, q2, ldq, D, 0.125f, st, lds, 0, n, mx, FA_QVEC_NV, 0);
}
#endif

/* the row-major path's packed tiles: QK panels and the P.V micro-kernel */
void mca_tile_qk(const float *qp, int64_t ldq, const float *kt, int64_t D, float *s, int64_t lds, int64_t e)
{
    fa_qk_block_f(qp, ldq, kt, D, s, lds, 0, e);
}

void mca_tile_pv(const float *p, int64_t ldp, const float *v, int64_t ldv, int64_t n, float *o, int64_t ldo,
                 int64_t nvec)
{
    fa_pv_block_f(p, ldp, v, ldv, 0, n, o, ldo, nvec);
}

/* decode: one query row against key rows read in place (scores), and its P.V
 * over value rows read in place, per storage type */
#define MCA_DECODE(SFX, S)                                                                        \
    void mca_decode_qk_##S(const float *qp, int64_t D, const FA_STORE_##S *k, int64_t ksr, int64_t n, \
                           float *s)                                                              \
    {                                                                                             \
        fa_qk_rows_##SFX(qp, D, 1, D, k, ksr, n, s, n);                                           \
    }                                                                                             \
    void mca_decode_pv_##S(const float *p, const FA_STORE_##S *v, int64_t ldv, int64_t n, float *o,   \
                           int64_t nvec)                                                          \
    {                                                                                             \
        fa_pv_row1_##SFX(p, v, ldv, 0, n, o, nvec, 1);                                            \
    }
#define FA_STORE_f32 float
#define FA_STORE_f16 uint16_t
#define FA_STORE_bf16 uint16_t
#define FA_STORE_i8 int8_t
MCA_DECODE(f, f32)
MCA_DECODE(fh, f16)
MCA_DECODE(fb, bf16)
MCA_DECODE(fi8, i8)

/* grouped-query decode: 4 query rows of one key/value head share each key row */
void mca_gqa_qk_f32(const float *qp, int64_t D, const float *k, int64_t ksr, int64_t n, float *s, int64_t lds)
{
    fa_qk_rows_r_f(qp, D, 4, 4, D, k, ksr, n, s, lds, 1);
}

void mca_gqa_pv_f32(const float *p, int64_t ldp, const float *v, int64_t ldv, int64_t n, float *o, int64_t ldo,
                    int64_t nvec)
{
    fa_pv_rows_f(p, ldp, 4, v, ldv, 0, n, o, ldo, nvec);
}

/* the model's FMA peak: 24 independent multiply-add chains on registers */
#define MCA_X24(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) \
                   M(12) M(13) M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
void mca_fma_peak(float *x, int64_t n)
{
    fa_v_f b = fa_load_f(x);
    const fa_v_f c = fa_load_f(x + FA_WF);
#define MCA_DECL(i) fa_v_f a##i = fa_load_f(x + (i) * FA_WF);
#define MCA_FMA(i) a##i += b * c;
#define MCA_STORE(i) fa_store_f(x + (i) * FA_WF, a##i);
    MCA_X24(MCA_DECL)
    for (int64_t j = 0; j < n; j++) {
        __asm__("" : "+w"(b));           /* b opaque: b * c is not hoisted out of the loop */
        MCA_X24(MCA_FMA)
    }
    MCA_X24(MCA_STORE)
}

/* the same with the multiplier broadcast from a lane (fmla by element: the form
 * GCC emits where one operand is a scalar from memory; some models give it other
 * pipes) */
void mca_fma_peak_lane(float *x, int64_t n)
{
    fa_v_f b = fa_load_f(x);
    const float *cs = x + FA_WF;
    MCA_X24(MCA_DECL)
    for (int64_t j = 0; j < n; j++) {
        __asm__("" : "+w"(b));
        const float c = cs[j & 3];
#define MCA_FMA_LANE(i) a##i += b * c;
        MCA_X24(MCA_FMA_LANE)
    }
    MCA_X24(MCA_STORE)
}
