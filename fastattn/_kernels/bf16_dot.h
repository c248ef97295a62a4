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

#if !(defined(FA_HAVE_BF16_DOT) && defined(FA_HAVE_AMX))
/* no tiles (amx_tiles.h): FA_AMX is 0 and the units' end-of-unit hook a no-op */
#define FA_AMX 0
static inline void fa_amx_unit_end(void) {}
#endif

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

#if defined(FA_HAVE_AMX)
#include "amx_tiles.h"
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
#if FA_AMX
    /* whole blocks of 16 keys by tiles, the rest below */
    j0 = fa_amx_qk_chunk(k, ksr, q2, ldq, D, scale, st, lds, j0, j1, mx, nv);
    if (j0 >= j1) return;
#endif
#define FA_QVEC_QK_BD(MR, NV) fa_qvec_qk_nv_bd(k, ksr, q2, ldq, D / 2, scale, st, lds, j0, j1, mx, MR, NV, pf)
    FA_BD_BY_WIDTH(nv, FA_QVEC_QK_BD);
#undef FA_QVEC_QK_BD
}

#if defined(FA_HAVE_BF16_PV)
/* P.V by the same pair dot products (targets that define FA_HAVE_BF16_PV,
 * fa_bf16_round_pair, fa_bf16_pack_pairs and FA_BF16_PACK_COLS: x86 AVX512_BF16).
 * The query-vectorised unit's tile of
 * P (St[j][lane], float) becomes pairs of bfloat16 probabilities in place --
 * P2[p][lane] = (P[2p][lane], P[2p + 1][lane]) in the 32-bit word of row p of
 * St -- and the value tile becomes pairs of rows, V2[p][c] = (v[2p][c],
 * v[2p + 1][c]), so one instruction adds two keys' terms for a vector of
 * queries and one column c.
 *
 * Accuracy: rounding P to bfloat16 is the error torch's bfloat16 SDPA makes
 * (its CPU flash attention rounds P for its bfloat16 GEMM, over blocks of 512
 * keys).  Measured, the largest probabilities dominate that error, and a
 * probability rounds exactly when it is 1: so here each tile's P is taken
 * against the tile's own max (P = exp(s - mt), its largest exactly 1; the
 * tile's sums enter Ot and l times f = exp(mt - m), m the lazily moved
 * reference of fa_qvec_softmax_nv), not against m itself.  With tiles of
 * 128 keys the output error is then 1-5 % below torch's on random inputs
 * (docs/kernels.rst, "bfloat16 dot products"); l sums the unrounded P, so lse
 * is the float32 computation's. */
#define FA_BF16_PV 1

/* V2 above from n value rows at v (bfloat16, rows vsr, elements vsc apart):
 * row p of V2 at v2 + p * ld, the partner of an odd n's last row 0.  Returns
 * whether any value is an inf or NaN (the unit then widens the tile instead). */
static int fa_pack_value_pairs_bd(const uint16_t *v, int64_t vsr, int64_t vsc, int64_t n, int64_t Dv,
                                  uint32_t *v2, int64_t ld)
{
#if FA_AMX
    /* the transposed tile of fa_amx_pv: the same choice there (Dv) */
    if (Dv % 16 == 0) return fa_amx_pack_values(v, vsr, vsc, n, Dv, v2);
#endif
    typedef uint16_t u16v __attribute__((vector_size(FA_VBYTES / 2)));
    typedef uint32_t u32v __attribute__((vector_size(FA_VBYTES)));
    const int64_t WW = FA_VBYTES / 4;
    uint32_t nf = 0;
    u32v nfv = (u32v){0};
    for (int64_t p = 0; 2 * p < n; p++) {
        const uint16_t *r0 = v + 2 * p * vsr;
        const uint16_t *r1 = 2 * p + 1 < n ? r0 + vsr : NULL;
        uint32_t *d = v2 + p * ld;
        int64_t c = 0;
        if (vsc == 1) {
            for (; c + FA_BF16_PACK_COLS <= Dv; c += FA_BF16_PACK_COLS)
                nf |= fa_bf16_pack_pairs(r0 + c, r1 ? r1 + c : NULL, d + c);
            for (; c + WW <= Dv; c += WW) {
                u16v a, b = (u16v){0};
                memcpy(&a, r0 + c, sizeof a);
                if (r1) memcpy(&b, r1 + c, sizeof b);
                const u32v wa = __builtin_convertvector(a, u32v), wb = __builtin_convertvector(b, u32v);
                nfv |= (u32v)((wa & 0x7f80u) == 0x7f80u) | (u32v)((wb & 0x7f80u) == 0x7f80u);
                const u32v w = wa | (wb << 16);
                memcpy(d + c, &w, sizeof w);
            }
        }
        for (; c < Dv; c++) {
            const uint32_t a = r0[c * vsc], b = r1 ? r1[c * vsc] : 0;
            nf |= ((a & 0x7f80u) == 0x7f80u) | ((b & 0x7f80u) == 0x7f80u);
            d[c] = a | (b << 16);
        }
    }
    for (int i = 0; i < WW; i++) nf |= nfv[i];
    return nf != 0;
}

/* The online softmax of fa_qvec_softmax_nv for one chunk over rows [j0, j1) of
 * St, with P against each tile's max (above): m moves to the tile max as in
 * fa_qvec_softmax_nv (lazily; Ot and l rescaled by exp(m_old - m_new)), f[lane] = exp(mt - m)
 * is written to f (which may be mx: each vector's max is read before its f is
 * written), and P2 rows [j0 / 2, (j1 + 1) / 2) are written in place of St,
 * probabilities of keys outside [j0, j1) 0.  A lane that sees no key in the
 * tile (mt = -inf) gets P = 0 and f = 0; NaN propagates through P and l.
 * sc: the scale St still needs (1, or the score scale where the AMX tiles left
 * St and mx unscaled: P = exp(sc * s - mt) by one multiply-add, mt = sc * mx,
 * the max of the scaled scores since rounding is monotonic).  P's exp is
 * fa_vexp_p4_f (degree 4: P is rounded to bfloat16 right after, and the row sum
 * adds the same function's values, so the weights P / l move by at most ~6e-6
 * of themselves); the factors exp(mt - m) keep fa_vexp_p_f. */
static inline __attribute__((always_inline)) void
fa_qvec_softmax_nv_bd(float *st, int64_t lds, int64_t j0, int64_t j1, float *m, float *l, float *ot,
                      int64_t ldo, int64_t Dv, const float *mx, float sc, float *f, const int nv)
{
    const fa_v_f ninf = fa_set1_f(-INFINITY), zero = fa_set1_f(0);
    fa_v_f alpha[FA_QVEC_NV];
    fa_vi_f moved = (fa_vi_f)zero;
    const int64_t p0 = j0 >> 1, p1 = (j1 + 1) >> 1;
    FA_UNROLL for (int v = 0; v < nv; v++) {
        fa_v_f mt0 = ninf, mt1 = ninf;
        if (mx) {
            mt0 = fa_load_f(mx + v * FA_WF) * sc;
        } else {
            int64_t j = j0;
            for (; j + 2 <= j1; j += 2) {
                mt0 = fa_vmax_f(fa_load_f(st + j * lds + v * FA_WF), mt0);
                mt1 = fa_vmax_f(fa_load_f(st + (j + 1) * lds + v * FA_WF), mt1);
            }
            if (j < j1) mt0 = fa_vmax_f(fa_load_f(st + j * lds + v * FA_WF), mt0);
        }
        const fa_v_f mt = fa_vmax_f(mt0, mt1);
        const fa_v_f mo = fa_load_f(m + v * FA_WF);
        /* the running reference moves lazily, as in fa_qvec_softmax_nv (most
         * tiles then skip the pass over Ot); P is against mt regardless, and f
         * = exp(mt - m) <= e^FA_RESCALE_SLACK carries the difference */
        const fa_v_f mn = fa_select_f(mt > mo + (float)FA_RESCALE_SLACK, mt, mo);
        moved |= mn != mo;
        const fa_v_f mn_safe = fa_select_f(mn == ninf, zero, mn);
        const fa_v_f mt_safe = fa_select_f(mt == ninf, zero, mt);
        alpha[v] = fa_vexp_p_f(mo - mn_safe);
        const fa_v_f fv = fa_vexp_p_f(mt - mn_safe);
        fa_v_f s0 = zero, s1 = zero;
        float *col = st + v * FA_WF;
        int64_t p = p0;
        if (j0 & 1) {           /* key j0 - 1 is not in the range: P 0 */
            const fa_v_f e1 = fa_vexp_p4_f(fa_load_f(col + j0 * lds) * sc - mt_safe);
            s1 += e1;
            fa_store_f(col + p * lds, (fa_v_f)fa_bf16_round_pair(zero, e1));
            p++;
        }
        for (; 2 * p + 2 <= j1; p++) {
            const fa_v_f e0 = fa_vexp_p4_f(fa_load_f(col + 2 * p * lds) * sc - mt_safe);
            const fa_v_f e1 = fa_vexp_p4_f(fa_load_f(col + (2 * p + 1) * lds) * sc - mt_safe);
            s0 += e0;
            s1 += e1;
            fa_store_f(col + p * lds, (fa_v_f)fa_bf16_round_pair(e0, e1));
        }
        if (p < p1) {           /* j1 odd: key j1 is not in the range */
            const fa_v_f e0 = fa_vexp_p4_f(fa_load_f(col + 2 * p * lds) * sc - mt_safe);
            s0 += e0;
            fa_store_f(col + p * lds, (fa_v_f)fa_bf16_round_pair(e0, zero));
        }
        fa_store_f(l + v * FA_WF, fa_load_f(l + v * FA_WF) * alpha[v] + fv * (s0 + s1));
        fa_store_f(m + v * FA_WF, mn);
        fa_store_f(f + v * FA_WF, fv);
    }
    if (!fa_any_f(moved)) return;
    for (int64_t c = 0; c < Dv; c++)
        FA_UNROLL for (int v = 0; v < nv; v++) {
            float *q = ot + c * ldo + v * FA_WF;
            fa_store_f(q, fa_load_f(q) * alpha[v]);
        }
}

static void fa_qvec_softmax_chunk_bd(float *st, int64_t lds, int64_t j0, int64_t j1, float *m, float *l,
                                     float *ot, int64_t ldo, int64_t Dv, const float *mx, float sc, float *f,
                                     int nv)
{
#define FA_QVEC_SOFTMAX_BD(MR, NV) fa_qvec_softmax_nv_bd(st, lds, j0, j1, m, l, ot, ldo, Dv, mx, sc, f, NV)
    FA_BD_BY_WIDTH(nv, FA_QVEC_SOFTMAX_BD);
#undef FA_QVEC_SOFTMAX_BD
}

/* Ot[c][chunk] += f[chunk] * sum_{p in [p0, p1)} P2[p][chunk] . V2[p][c] for
 * the first mr (constant) columns: the tile's pairs from zero, then one add to
 * Ot (the two-level sum of fa_qvec_pv_micro). */
static inline __attribute__((always_inline)) void
fa_qvec_pv_micro_bd(const uint32_t *v2, int64_t ld2, const float *restrict p2, int64_t lds, int64_t p0,
                    int64_t p1, float *restrict ot, int64_t ldo, const float *f, const int mr, const int nv)
{
    fa_v_f acc[FA_QVEC_MRMAX][FA_QVEC_NV];
    FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) acc[r][v] = fa_set1_f(0);
    for (int64_t p = p0; p < p1; p++) {
        fa_vi_f b[FA_QVEC_NV];
        const uint16_t *vrow = (const uint16_t *)(v2 + p * ld2);
        FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
            if (v < nv) b[v] = (fa_vi_f)fa_load_f(p2 + p * lds + v * FA_WF);
        FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++) {
            if (r < mr) {
                const fa_vi_f a = fa_bf16_pair_bcast(vrow + 2 * r);
                FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                    if (v < nv) acc[r][v] = fa_bf16_dot2_f(acc[r][v], b[v], a);
            }
        }
    }
    FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv)
                    fa_store_f(ot + r * ldo + v * FA_WF,
                               fa_load_f(ot + r * ldo + v * FA_WF) + acc[r][v] * fa_load_f(f + v * FA_WF));
}

static inline __attribute__((always_inline)) void
fa_qvec_pv_nv_bd(const uint32_t *v2, int64_t ld2, int64_t Dv, const float *p2, int64_t lds, int64_t p0,
                 int64_t p1, float *ot, int64_t ldo, const float *f, const int MR, const int nv)
{
    int64_t c = 0;
    for (; c + MR <= Dv; c += MR)
        fa_qvec_pv_micro_bd(v2 + c, ld2, p2, lds, p0, p1, ot + c * ldo, ldo, f, MR, nv);
    const int64_t rem = Dv - c;
#define FA_QVEC_PV_TAIL_BD(R) \
    fa_qvec_pv_micro_bd(v2 + c, ld2, p2, lds, p0, p1, ot + c * ldo, ldo, f, R, nv); c += R
    FA_BD_TAILS(MR, rem, FA_QVEC_PV_TAIL_BD);
#undef FA_QVEC_PV_TAIL_BD
}

/* All Dv output columns of one chunk of nv vectors over pairs [p0, p1). */
static void fa_qvec_pv_chunk_bd(const uint32_t *v2, int64_t ld2, int64_t Dv, const float *p2, int64_t lds,
                                int64_t p0, int64_t p1, float *ot, int64_t ldo, const float *f, int nv)
{
#if FA_AMX
    /* tiles over whole blocks of 16 pairs (rows of P2 outside [p0, p1) in them
     * are zeroed: the unit calls this once per chunk, not per key run) */
    if (Dv % 16 == 0) {
        (void)ld2;
        fa_amx_pv(v2, Dv, (float *)p2, lds, p0, p1, ot, ldo, f, nv);
        return;
    }
#endif
#define FA_QVEC_PV_BD(MR, NV) fa_qvec_pv_nv_bd(v2, ld2, Dv, p2, lds, p0, p1, ot, ldo, f, MR, NV)
    FA_BD_BY_WIDTH(nv, FA_QVEC_PV_BD);
#undef FA_QVEC_PV_BD
}

/* The few-rows unit's P.V (GQA decode groups, draft rows) of bfloat16 value
 * rows read in place, by the same pair dot products: O[i][0:D] += sum_{k in
 * [k0, k1)} P[i][k] v[k][0:D] for i < nr, as fa_pv_rows (stored_reads.h) does
 * with widened values, but two keys per instruction: value rows k and k + 1
 * interleaved in registers (fa_bf16_zip_rows, two VPERMT2W per
 * FA_BF16_PACK_COLS columns, shared by the block's rows) against the pair
 * (P[i][k], P[i][k + 1]) broadcast as one 32-bit word.  Each row's P is divided
 * by pm[i], the largest P of its tile (row_tile_softmax), and rounded to
 * bfloat16 -- the largest exactly 1, as the query-vectorised unit's tile-max P
 * above; the same for every call of one tile (its chunks, a paged cache's runs)
 * -- and its terms, summed from zero in float32 per segment of at most
 * FA_BD_PVR_SEG keys, are added to O times pm[i] (two-level sums; pm[i] not
 * positive and finite: P times 0).  Blocks of up to FA_BD_PVR_ROWS rows by up to
 * 16 accumulators of columns; an odd segment's last key pairs with itself
 * (probability 0 in the high half).  D a multiple of FA_BF16_PACK_COLS (the
 * unit checks).  The first column pass of the first block streams the values:
 * every line of whole rows requested into L2 FA_PF_L2_BYTES ahead, or pfo rows ahead where
 * pfo is not FA_PF_AUTO (0: none), as fa_qk_rows_bd.  Values holding an inf or
 * NaN make the sums inf or NaN, and the unit redoes such a tile exactly, as for
 * the widened loop (row_tile_pv). */
#define FA_BD_PVR_SEG 128
#define FA_BD_PVR_ROWS 4
#define FA_BD_PVR_ACC 16
static inline __attribute__((always_inline)) void
fa_pv_pass_bd(const uint32_t *restrict pb, const int R, const uint16_t *restrict v, int64_t ldv, int64_t n,
              const int NC, int64_t pf, int64_t pfn, float *restrict o, int64_t ldo, const float *pm)
{
    fa_v_f acc[FA_BD_PVR_ROWS][FA_BD_PVR_ACC / 2];
    FA_UNROLL for (int i = 0; i < FA_BD_PVR_ROWS; i++)
        FA_UNROLL for (int c = 0; c < FA_BD_PVR_ACC / 2; c++)
            if (i < R && c < 2 * NC) acc[i][c] = fa_set1_f(0);
    for (int64_t k = 0; k < n; k += 2) {
        const uint16_t *r0 = v + k * ldv;
        const uint16_t *r1 = k + 1 < n ? r0 + ldv : r0;
        if (pfn) {
            fa_prefetch_bytes_at(r0 + pf * ldv, pfn * 2, 1);
            if (r1 != r0) fa_prefetch_bytes_at(r1 + pf * ldv, pfn * 2, 1);
        }
        fa_vi_f z[FA_BD_PVR_ACC / 2];
        FA_UNROLL for (int c = 0; c < NC; c++) {
            fa_vi_f x, y;
            memcpy(&x, r0 + c * FA_BF16_PACK_COLS, sizeof x);
            memcpy(&y, r1 + c * FA_BF16_PACK_COLS, sizeof y);
            fa_bf16_zip_rows(x, y, &z[2 * c], &z[2 * c + 1]);
        }
        FA_UNROLL for (int i = 0; i < FA_BD_PVR_ROWS; i++) {
            if (i < R) {
                const fa_vi_f a = fa_bf16_pair_bcast((const uint16_t *)(pb + i * (FA_BD_PVR_SEG / 2) + k / 2));
                FA_UNROLL for (int c = 0; c < 2 * NC; c++) acc[i][c] = fa_bf16_dot2_f(acc[i][c], z[c], a);
            }
        }
    }
    FA_UNROLL for (int i = 0; i < FA_BD_PVR_ROWS; i++)
        if (i < R) {
            const fa_v_f f = fa_set1_f(pm[i]);
            FA_UNROLL for (int c = 0; c < 2 * NC; c++) {
                float *q = o + i * ldo + c * FA_WF;
                fa_store_f(q, fa_load_f(q) + acc[i][c] * f);
            }
        }
}

/* One segment of n <= FA_BD_PVR_SEG keys for a block of R rows: each row's
 * probabilities over pmx[i] (its tile's largest), rounded to bfloat16 pairs
 * (zeros past n),
 * then the column passes (NCMAX chunks of FA_BF16_PACK_COLS per pass, R * 2 *
 * NCMAX <= FA_BD_PVR_ACC). */
static inline __attribute__((always_inline)) void
fa_pv_seg_bd(const float *p, int64_t ldp, const int R, const uint16_t *v, int64_t ldv, int64_t n, float *o,
             int64_t ldo, int64_t D, const float *pmx, int64_t pf, int stream)
{
    const int NCMAX = FA_BD_PVR_ACC / (2 * R) < 4 ? FA_BD_PVR_ACC / (2 * R) : 4;
    uint32_t pb[FA_BD_PVR_ROWS * (FA_BD_PVR_SEG / 2)] __attribute__((aligned(64)));
    float pm[FA_BD_PVR_ROWS];
    FA_UNROLL for (int i = 0; i < FA_BD_PVR_ROWS; i++) {
        if (i >= R) break;
        const float *pi = p + i * ldp;
        const float mx = pmx[i];
        const int ok = mx > 0 && mx <= __FLT_MAX__;
        pm[i] = ok ? mx : 0.0f;
        const fa_v_f s = fa_set1_f(ok ? 1.0f / mx : 0.0f);
        uint32_t *d = pb + i * (FA_BD_PVR_SEG / 2);
        int64_t k = 0;
        for (; k + 2 * FA_WF <= n; k += 2 * FA_WF) {
            const fa_vi_f w = fa_bf16_round_seq(fa_load_f(pi + k) * s, fa_load_f(pi + k + FA_WF) * s);
            memcpy(d + k / 2, &w, sizeof w);
        }
        if (k < n) {
            const fa_v_f lo = fa_load_part_f(pi + k, n - k < FA_WF ? n - k : FA_WF, 0.0f);
            const fa_v_f hi = n - k > FA_WF ? fa_load_part_f(pi + k + FA_WF, n - k - FA_WF, 0.0f) : fa_set1_f(0);
            const fa_vi_f w = fa_bf16_round_seq(lo * s, hi * s);
            memcpy(d + k / 2, &w, sizeof w);
        }
    }
    int64_t c = 0, pfn = stream ? D : 0;
    for (; c + NCMAX * FA_BF16_PACK_COLS <= D; c += NCMAX * FA_BF16_PACK_COLS, pfn = 0)
        fa_pv_pass_bd(pb, R, v + c, ldv, n, NCMAX, pf, pf ? pfn : 0, o + c, ldo, pm);
    for (; c < D; c += FA_BF16_PACK_COLS, pfn = 0)
        fa_pv_pass_bd(pb, R, v + c, ldv, n, 1, pf, pf ? pfn : 0, o + c, ldo, pm);
}

static void fa_pv_rows_bd(const float *p, int64_t ldp, int64_t nr, const uint16_t *v, int64_t ldv, int64_t k0,
                          int64_t k1, float *o, int64_t ldo, int64_t D, const float *pm, int64_t pfo)
{
    const int64_t pfa = FA_PF_L2_BYTES / (2 * (D > 0 ? D : 1));
    const int64_t pf = pfo != FA_PF_AUTO ? pfo : pfa > 1 ? pfa : 1;
    for (int64_t s0 = k0; s0 < k1; s0 += FA_BD_PVR_SEG) {
        const int64_t n = k1 - s0 < FA_BD_PVR_SEG ? k1 - s0 : FA_BD_PVR_SEG;
        const uint16_t *vs = v + s0 * ldv;
        for (int64_t i0 = 0; i0 < nr; i0 += FA_BD_PVR_ROWS) {
            const int rows = nr - i0 < FA_BD_PVR_ROWS ? (int)(nr - i0) : FA_BD_PVR_ROWS;
            const float *pi = p + i0 * ldp + s0;
            float *oi = o + i0 * ldo;
            const int stream = i0 == 0;     /* the first block streams the values */
            switch (rows) {
            case 1: fa_pv_seg_bd(pi, ldp, 1, vs, ldv, n, oi, ldo, D, pm + i0, pf, stream); break;
            case 2: fa_pv_seg_bd(pi, ldp, 2, vs, ldv, n, oi, ldo, D, pm + i0, pf, stream); break;
            case 3: fa_pv_seg_bd(pi, ldp, 3, vs, ldv, n, oi, ldo, D, pm + i0, pf, stream); break;
            default: fa_pv_seg_bd(pi, ldp, 4, vs, ldv, n, oi, ldo, D, pm + i0, pf, stream); break;
            }
        }
    }
}
#endif

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


/* The few-rows unit's scores (decode, GQA groups, draft tokens) of bfloat16
 * queries and keys read in place: S[i][j] = scale * (q2[i] . k[j]) for i < nr,
 * j < n, as fa_qk_rows (stored_reads.h) does with widened keys, but lanes over
 * pairs of d: one instruction multiplies FA_WF pairs of a key row with the same
 * pairs of a query row (exact products, float32 sums), R rows by G keys of
 * accumulators, each reduced across its lanes at the end (fa_transpose_add_f).
 * No widening: a key vector of 2 FA_WF elements feeds R instructions, against
 * one widening and R FMAs per FA_WF elements.  q2: bfloat16 rows ldq elements
 * apart, unscaled, zeros up to nr rounded up to FA_BD_QKR_MAX rows; D a multiple
 * of 2 FA_WF (whole vectors: the unit checks).  Key rows ksr elements apart;
 * each 64-byte line requested into L2 FA_PF_L2_BYTES ahead (the keys stream
 * from memory or L3), or pfo rows ahead where pfo is not FA_PF_AUTO (a paged
 * cache's next block: next_run_rows; 0 none), as fa_qk_rows. */
#define FA_BD_QKR_ACC (FA_QK_PAIRS_W * FA_WF)
#define FA_BD_QKR_MAX (FA_BD_QKR_ACC < 8 ? FA_BD_QKR_ACC : 8)
static inline __attribute__((always_inline)) void
fa_qk_pass_bd(const uint16_t *restrict q2, int64_t ldq, const int R, int nrow, int64_t D,
              const uint16_t *restrict kg, int64_t ksr, int nk, int64_t pf, float scale, float *restrict s,
              int64_t lds)
{
    const int G = FA_BD_QKR_ACC / R;
    fa_v_f r[FA_BD_QKR_ACC];
    FA_UNROLL for (int x = 0; x < FA_BD_QKR_ACC; x++) r[x] = fa_set1_f(0);
    for (int64_t d = 0; d < D; d += 2 * FA_WF) {
        fa_vi_f kv[FA_BD_QKR_ACC];
        FA_UNROLL for (int u = 0; u < G; u++)
            if (u < nk) {
                if (pf) fa_prefetch_at(kg + (u + pf) * ksr + d, 1);
                memcpy(&kv[u], kg + u * ksr + d, sizeof kv[u]);
            }
        if (pf && d == 0)       /* the line of a row's last element (fa_prefetch_bytes_at) */
            FA_UNROLL for (int u = 0; u < G; u++)
                if (u < nk) fa_prefetch_at(kg + (u + pf) * ksr + D - 1, 1);
        FA_UNROLL for (int i = 0; i < R; i++) {
            fa_vi_f qv;
            memcpy(&qv, q2 + i * ldq + d, sizeof qv);
            FA_UNROLL for (int u = 0; u < G; u++)
                if (u < nk) r[i * G + u] = fa_bf16_dot2_f(r[i * G + u], qv, kv[u]);
        }
    }
    float t[FA_BD_QKR_ACC];
    FA_UNROLL for (int b = 0; b < FA_BD_QKR_ACC / FA_WF; b++) {
        fa_transpose_add_f(r + b * FA_WF);
        fa_store_f(t + b * FA_WF, r[b * FA_WF] * scale);
    }
    for (int i = 0; i < nrow; i++)
        for (int u = 0; u < nk; u++) s[i * lds + u] = t[i * G + u];
}

static inline __attribute__((always_inline)) void
fa_qk_rows_r_bd(const uint16_t *q2, int64_t ldq, const int R, int nrow, int64_t D, const uint16_t *k,
                int64_t ksr, int64_t n, int64_t pf, float scale, float *s, int64_t lds)
{
    const int G = FA_BD_QKR_ACC / R;
    int64_t j = 0;
    for (; j + G <= n; j += G)
        fa_qk_pass_bd(q2, ldq, R, nrow, D, k + j * ksr, ksr, G, pf, scale, s + j, lds);
    if (j < n)
        fa_qk_pass_bd(q2, ldq, R, nrow, D, k + j * ksr, ksr, (int)(n - j), 0, scale, s + j, lds);
}

static void fa_qk_rows_bd(const uint16_t *q2, int64_t ldq, int64_t nr, int64_t D, const uint16_t *k,
                          int64_t ksr, int64_t n, float scale, float *s, int64_t lds, int64_t pfo)
{
    const int64_t pfa = FA_PF_L2_BYTES / (2 * (D > 0 ? D : 1));
    const int64_t pfr = pfo != FA_PF_AUTO ? pfo : pfa > 1 ? pfa : 1;
    for (int64_t i0 = 0; i0 < nr; i0 += FA_BD_QKR_MAX) {
        const int rows = nr - i0 < FA_BD_QKR_MAX ? (int)(nr - i0) : FA_BD_QKR_MAX;
        const uint16_t *q = q2 + i0 * ldq;
        float *si = s + i0 * lds;
        const int64_t pf = i0 == 0 ? pfr : 0;     /* the first block streams */
        if (rows <= 1)
            fa_qk_rows_r_bd(q, ldq, 1, rows, D, k, ksr, n, pf, scale, si, lds);
        else if (rows <= 2 || FA_BD_QKR_MAX < 4)
            fa_qk_rows_r_bd(q, ldq, 2, rows, D, k, ksr, n, pf, scale, si, lds);
        else if (rows <= 4 || FA_BD_QKR_MAX < 8)
            fa_qk_rows_r_bd(q, ldq, FA_BD_QKR_MAX >= 4 ? 4 : 2, rows, D, k, ksr, n, pf, scale, si, lds);
        else
            fa_qk_rows_r_bd(q, ldq, FA_BD_QKR_MAX >= 8 ? 8 : 2, rows, D, k, ksr, n, pf, scale, si, lds);
    }
}

#else
#define FA_BF16_DOT 0
#define FA_BD_QKR_MAX 8
static inline void fa_qk_rows_bd(const uint16_t *q2, int64_t ldq, int64_t nr, int64_t D, const uint16_t *k,
                                 int64_t ksr, int64_t n, float scale, float *s, int64_t lds, int64_t pfo)
{
    (void)q2; (void)ldq; (void)nr; (void)D; (void)k; (void)ksr; (void)n; (void)scale; (void)s; (void)lds;
    (void)pfo;
}
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

#ifndef FA_BF16_PV
/* no bfloat16 P.V on this target: the unit never calls these */
#define FA_BF16_PV 0
static inline int fa_pack_value_pairs_bd(const uint16_t *v, int64_t vsr, int64_t vsc, int64_t n, int64_t Dv,
                                         uint32_t *v2, int64_t ld)
{
    (void)v; (void)vsr; (void)vsc; (void)n; (void)Dv; (void)v2; (void)ld;
    return 1;
}
static inline void fa_qvec_softmax_chunk_bd(float *st, int64_t lds, int64_t j0, int64_t j1, float *m, float *l,
                                            float *ot, int64_t ldo, int64_t Dv, const float *mx, float sc,
                                            float *f, int nv)
{
    (void)st; (void)lds; (void)j0; (void)j1; (void)m; (void)l; (void)ot; (void)ldo; (void)Dv; (void)mx;
    (void)sc; (void)f; (void)nv;
}
static inline void fa_qvec_pv_chunk_bd(const uint32_t *v2, int64_t ld2, int64_t Dv, const float *p2,
                                       int64_t lds, int64_t p0, int64_t p1, float *ot, int64_t ldo,
                                       const float *f, int nv)
{
    (void)v2; (void)ld2; (void)Dv; (void)p2; (void)lds; (void)p0; (void)p1; (void)ot; (void)ldo; (void)f;
    (void)nv;
}
#define FA_BF16_PACK_COLS 32
static inline void fa_pv_rows_bd(const float *p, int64_t ldp, int64_t nr, const uint16_t *v, int64_t ldv,
                                 int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t D, const float *pm,
                                 int64_t pfo)
{
    (void)p; (void)ldp; (void)nr; (void)v; (void)ldv; (void)k0; (void)k1; (void)o; (void)ldo; (void)D; (void)pm;
    (void)pfo;
}
#endif
