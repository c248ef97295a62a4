/* Q.K^T of bfloat16 queries and keys by bfloat16 pair dot products, for the
 * query-vectorised unit (targets that define FA_HAVE_BF16_DOT and
 * fa_bf16_dot2_f: AVX512_BF16's VDPBF16PS, ARMv8.6's BFDOT).
 *
 * Layout: Q2[d2][i] holds the bfloat16 pair (q[i][2 d2], q[i][2 d2 + 1]) of query
 * lane i as one 32-bit word, unscaled (the stored values exactly); each key row
 * is read in place and its pair (k[j][2 d2], k[j][2 d2 + 1]) broadcast as one
 * 32-bit word, so one instruction multiplies two d of a key with a vector of
 * queries: half the instructions of the float32 kernel, and no widened key
 * tile.  The products of two bfloat16 are exact in float32; the scale multiplies
 * the sums once.  Lanes, blocking and the running max are those of
 * fa_qvec_qk_micro_f (qvec_kernels.h).  Included once by simd.h, after the
 * float body.  Without the instructions: FA_BF16_DOT is 0 and the entry points
 * are empty (the units never call them). */

#if defined(FA_HAVE_BF16_DOT)
#define FA_BF16_DOT 1

#ifndef FA_HAVE_BF16_PAIR_BCAST
/* the 32-bit word at p (a bfloat16 pair) in every lane */
static inline fa_vi_f fa_bf16_pair_bcast(const uint16_t *p)
{
    int32_t x;
    memcpy(&x, p, sizeof x);
    return x + (fa_vi_f){0};
}
#endif

/* the tails and widths of qvec_kernels.h (FA_QVEC_TAILS, FA_QVEC_BY_WIDTH) */
#define FA_BD_TAILS(MR, rem, CALL) do {                      \
        if ((MR) > 8 && ((rem) & 8)) { CALL(8); }           \
        if ((MR) > 4 && ((rem) & 4)) { CALL(4); }           \
        if ((MR) > 2 && ((rem) & 2)) { CALL(2); }           \
        if ((rem) & 1) { CALL(1); }                         \
    } while (0)
#if FA_QVEC_NV > 2
#  define FA_BD_BY_WIDTH(nv, BODY) do {                                            \
        if ((nv) > 2) { BODY(FA_QVEC_MR, FA_QVEC_NV); }                               \
        else if ((nv) == 2) { BODY(FA_QVEC_MR2, 2); }                              \
        else { BODY(FA_QVEC_MR1, 1); }                                             \
    } while (0)
#else
#  define FA_BD_BY_WIDTH(nv, BODY) do {                                            \
        if ((nv) == 2) { BODY(FA_QVEC_MR2, 2); }                                   \
        else { BODY(FA_QVEC_MR1, 1); }                                             \
    } while (0)
#endif

static inline __attribute__((always_inline)) void
fa_qvec_qk_micro_bd(const uint16_t *k, int64_t ksr, const float *restrict q2, int64_t ldq, int64_t D2,
                    float scale, float *restrict st, int64_t lds, float *restrict mx, const int mr,
                    const int nv, const uint16_t *pfk)
{
    fa_v_f acc[FA_QVEC_MRMAX][FA_QVEC_NV];
    FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) acc[r][v] = fa_set1_f(0);
    for (int64_t p0 = 0; p0 < D2; p0 += 16) {
        /* one cache line (16 pairs) of each of the next block's rows per 16 pairs */
        if (pfk)
            FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
                if (r < mr) __builtin_prefetch(pfk + r * ksr + 2 * p0, 0, FA_PF_LOC);
        const int64_t p1 = p0 + 16 < D2 ? p0 + 16 : D2;
        for (int64_t p = p0; p < p1; p++) {
            fa_vi_f b[FA_QVEC_NV];
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) b[v] = (fa_vi_f)fa_load_f(q2 + p * ldq + v * FA_WF);
            FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++) {
                if (r < mr) {
                    const fa_vi_f a = fa_bf16_pair_bcast(k + r * ksr + 2 * p);
                    FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                        if (v < nv) acc[r][v] = fa_bf16_dot2_f(acc[r][v], b[v], a);
                }
            }
        }
    }
    const fa_v_f s = fa_set1_f(scale);
    FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) {
                    acc[r][v] *= s;
                    fa_store_f(st + r * lds + v * FA_WF, acc[r][v]);
                }
    if (mx) {
        FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++) {
            if (v < nv) {
                fa_v_f m = fa_load_f(mx + v * FA_WF);
                FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
                    if (r < mr) m = fa_vmax_f(acc[r][v], m);
                fa_store_f(mx + v * FA_WF, m);
            }
        }
    }
}

static inline __attribute__((always_inline)) void
fa_qvec_qk_nv_bd(const uint16_t *k, int64_t ksr, const float *q2, int64_t ldq, int64_t D2, float scale,
                 float *st, int64_t lds, int64_t j0, int64_t j1, float *mx, const int MR, const int nv, int pf)
{
    int64_t j = j0;
    for (; j + MR <= j1; j += MR)
        fa_qvec_qk_micro_bd(k + j * ksr, ksr, q2, ldq, D2, scale, st + j * lds, lds, mx, MR, nv,
                            pf ? k + (j + MR) * ksr : NULL);
    const int64_t rem = j1 - j;
#define FA_QVEC_QK_TAIL_BD(R) \
    fa_qvec_qk_micro_bd(k + j * ksr, ksr, q2, ldq, D2, scale, st + j * lds, lds, mx, R, nv, NULL); j += R
    FA_BD_TAILS(MR, rem, FA_QVEC_QK_TAIL_BD);
#undef FA_QVEC_QK_TAIL_BD
}

/* Rows [j0, j1) of St for one chunk of nv vectors: key rows k + j*ksr (bfloat16,
 * D contiguous elements, D even), Q2 as above; with mx also the max per lane. */
static void fa_qvec_qk_chunk_bd(const uint16_t *k, int64_t ksr, const float *q2, int64_t ldq, int64_t D,
                                float scale, float *st, int64_t lds, int64_t j0, int64_t j1, float *mx,
                                int nv, int pf)
{
#define FA_QVEC_QK_BD(MR, NV) fa_qvec_qk_nv_bd(k, ksr, q2, ldq, D / 2, scale, st, lds, j0, j1, mx, MR, NV, pf)
    FA_BD_BY_WIDTH(nv, FA_QVEC_QK_BD);
#undef FA_QVEC_QK_BD
}

#undef FA_BD_TAILS
#undef FA_BD_BY_WIDTH

#else
#define FA_BF16_DOT 0
static inline void fa_qvec_qk_chunk_bd(const uint16_t *k, int64_t ksr, const float *q2, int64_t ldq, int64_t D,
                                       float scale, float *st, int64_t lds, int64_t j0, int64_t j1, float *mx,
                                       int nv, int pf)
{
    (void)k; (void)ksr; (void)q2; (void)ldq; (void)D; (void)scale; (void)st; (void)lds;
    (void)j0; (void)j1; (void)mx; (void)nv; (void)pf;
}
#endif

/* Q2 of the pairs above from nr bfloat16 query rows at q + qoff[i] (elements
 * contiguous, D even): Q2[d2 * ld + i], lanes past nr untouched. */
static inline void fa_pack_pairs_bd(const uint16_t *q, const int64_t *qoff, int64_t nr, int64_t D, float *q2,
                                    int64_t ld)
{
    for (int64_t i = 0; i < nr; i++) {
        const uint16_t *row = q + qoff[i];
        for (int64_t p = 0; p < D / 2; p++)
            memcpy(q2 + p * ld + i, row + 2 * p, 4);
    }
}
