/* Q.K^T of bfloat16 queries and keys by bfloat16 pair dot products, for the
 * query-vectorised unit and the backward's S and dP (fa_qk_block_bd, below;
 * targets that define FA_HAVE_BF16_DOT and
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

/* The backward's S = Q.K^T and dP = dO.V^T (backward.pxi) on its register
 * blocks: rows i of Q2 (bfloat16, unscaled, elements in pairs: ldq elements
 * apart, zero past D) against panels of NR = FA_QK_NV * W keys holding the key
 * pair (k[j][2 p], k[j][2 p + 1]) at panel[p * NR + j] (fa_pack_key_pairs_bd);
 * S = scale * sum, the products exact and the sums in float32 as in the
 * forward's fa_qvec_qk_micro_bd.  The blocking and the panel walk are those of
 * fa_qk_panel / fa_qk_block (tile_kernels.h). */
#define FA_BD_NR (FA_QK_NV * FA_WF)
static inline __attribute__((always_inline)) void
fa_qk_panel_bd(const uint16_t *restrict q2, int64_t ldq, const uint32_t *restrict panel, int64_t D2, float scale,
               float *restrict s, int64_t lds, const int nv)
{
    fa_v_f acc[FA_QK_MR][FA_QK_NV];
    FA_UNROLL for (int i = 0; i < FA_QK_MR; i++)
        FA_UNROLL for (int v = 0; v < FA_QK_NV; v++) acc[i][v] = fa_set1_f(0);
    for (int64_t p = 0; p < D2; p++) {
        fa_vi_f b[FA_QK_NV];
        FA_UNROLL for (int v = 0; v < FA_QK_NV; v++)
            if (v < nv) b[v] = (fa_vi_f)fa_load_f((const float *)(panel + p * FA_BD_NR + v * FA_WF));
        FA_UNROLL for (int i = 0; i < FA_QK_MR; i++) {
            const fa_vi_f a = fa_bf16_pair_bcast(q2 + i * ldq + 2 * p);
            FA_UNROLL for (int v = 0; v < FA_QK_NV; v++)
                if (v < nv) acc[i][v] = fa_bf16_dot2_f(acc[i][v], a, b[v]);
        }
    }
    const fa_v_f sc = fa_set1_f(scale);
    FA_UNROLL for (int i = 0; i < FA_QK_MR; i++)
        FA_UNROLL for (int v = 0; v < FA_QK_NV; v++)
            if (v < nv) fa_store_f(s + i * lds + v * FA_WF, acc[i][v] * sc);
}

/* S[0:MR, c*NR:e] for each panel c from c0 on that holds columns below e (D2
 * pairs a row; panel c at kt2 + c * D2 * NR), as fa_qk_block. */
static inline void fa_qk_block_bd(const uint16_t *q2, int64_t ldq, const uint32_t *kt2, int64_t D2, float scale,
                                  float *s, int64_t lds, int64_t c0, int64_t e)
{
    for (int64_t c = c0; c * FA_BD_NR < e; c++) {
        if (FA_QK_NV > 1 && e - c * FA_BD_NR <= FA_WF)
            fa_qk_panel_bd(q2, ldq, kt2 + c * D2 * FA_BD_NR, D2, scale, s + c * FA_BD_NR, lds, 1);
        else
            fa_qk_panel_bd(q2, ldq, kt2 + c * D2 * FA_BD_NR, D2, scale, s + c * FA_BD_NR, lds, FA_QK_NV);
    }
}

#else
#define FA_BF16_DOT 0
#define FA_BD_NR (FA_QK_NV * FA_WF)
static inline void fa_qk_block_bd(const uint16_t *q2, int64_t ldq, const uint32_t *kt2, int64_t D2, float scale,
                                  float *s, int64_t lds, int64_t c0, int64_t e)
{
    (void)q2; (void)ldq; (void)kt2; (void)D2; (void)scale; (void)s; (void)lds; (void)c0; (void)e;
}
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

/* The element at e of a bfloat16 row of D elements sc apart; 0 at e = D (the
 * partner of an odd D's last element). */
static inline uint16_t fa_bf16_at(const uint16_t *row, int64_t e, int64_t D, int64_t sc)
{
    return e < D ? row[e * sc] : 0;
}

/* Rows of the backward's pair products (fa_qk_block_bd): nr bfloat16 rows at
 * base + off[i] (elements sc apart) copied into dst + i * ld, zeros from D to ld
 * (ld even) and in rows nr..npad-1. */
static inline void fa_pack_rows_bd(const uint16_t *base, const int64_t *off, int64_t sc, int64_t nr, int64_t D,
                                   uint16_t *dst, int64_t ld, int64_t npad)
{
    for (int64_t i = 0; i < nr; i++) {
        const uint16_t *row = base + off[i];
        uint16_t *d = dst + i * ld;
        if (sc == 1) {
            memcpy(d, row, (size_t)D * sizeof *d);
        } else {
            for (int64_t e = 0; e < D; e++) d[e] = row[e * sc];
        }
        memset(d + D, 0, (size_t)(ld - D) * sizeof *d);
    }
    if (npad > nr) memset(dst + nr * ld, 0, (size_t)((npad - nr) * ld) * sizeof *dst);
}

/* Key panels of fa_qk_block_bd from n bfloat16 rows at base + off[j] (elements
 * sc apart): panel j / NR, word p * NR + j % NR = the pair (k[j][2 p], k[j][2 p + 1])
 * (0 past D), for p < (D + 1) / 2; the columns of a partial last panel zero. */
static inline void fa_pack_key_pairs_bd(const uint16_t *base, const int64_t *off, int64_t sc, int64_t n, int64_t D,
                                        uint32_t *kt2)
{
    const int64_t D2 = (D + 1) / 2;
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *row = base + off[j];
        uint32_t *col = kt2 + (j / FA_BD_NR) * D2 * FA_BD_NR + j % FA_BD_NR;
        for (int64_t p = 0; p < D2; p++)
            col[p * FA_BD_NR] = (uint32_t)fa_bf16_at(row, 2 * p, D, sc)
                                | (uint32_t)fa_bf16_at(row, 2 * p + 1, D, sc) << 16;
    }
    if (n % FA_BD_NR) {
        uint32_t *panel = kt2 + (n / FA_BD_NR) * D2 * FA_BD_NR;
        for (int64_t p = 0; p < D2; p++)
            for (int64_t j = n % FA_BD_NR; j < FA_BD_NR; j++) panel[p * FA_BD_NR + j] = 0;
    }
}
#undef FA_BD_NR
