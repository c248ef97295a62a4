/* Query-vectorised kernels: lanes over query rows, so each query's online
 * softmax (max, sum, rescale) is a vertical vector operation and keys and
 * values are read in place as broadcast scalars.  St[j][i] = score of key j for
 * query i; Qt[d][i] = scale * q[i][d]; Ot[c][i] = output column c of query i.  A
 * chunk = nv vectors of query lanes (nv = 1, 2 or FA_QVEC_NV), nv * W lanes.
 * Part of the per-type body (simd_body.h).  Not a standalone header. */

/* Tails of a block loop: rem (< MR) rows in power-of-two micro-blocks, so each
 * kernel has four instantiations instead of MR - 1. */
#define FA_QVEC_TAILS(MR, rem, CALL) do {                    \
        if ((MR) > 8 && ((rem) & 8)) { CALL(8); }           \
        if ((MR) > 4 && ((rem) & 4)) { CALL(4); }           \
        if ((MR) > 2 && ((rem) & 2)) { CALL(2); }           \
        if ((rem) & 1) { CALL(1); }                         \
    } while (0)

/* BODY(MR, NV) for the chunk width nv, as a constant: FA_QVEC_NV, 2 or 1 vectors with
 * their MR; the _chunk functions below are these per-width instantiations of
 * their always-inline _nv bodies. */
#if FA_QVEC_NV > 2
#  define FA_QVEC_BY_WIDTH(nv, BODY) do {                                          \
        if ((nv) > 2) { BODY(FA_QVEC_MR, FA_QVEC_NV); }                               \
        else if ((nv) == 2) { BODY(FA_QVEC_MR2, 2); }                              \
        else { BODY(FA_QVEC_MR1, 1); }                                             \
    } while (0)
#else
#  define FA_QVEC_BY_WIDTH(nv, BODY) do {                                          \
        if ((nv) == 2) { BODY(FA_QVEC_MR2, 2); }                                   \
        else { BODY(FA_QVEC_MR1, 1); }                                             \
    } while (0)
#endif

/* St[r][chunk] = sum_d K[r][d] * Qt[d][chunk] for the first mr (constant) keys;
 * pfk: the rows requested meanwhile, into L2 where l2 (a constant) != 0. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qvec_qk_micro)(const FA_T *k, int64_t ksr, int64_t ksc, const FA_T *restrict qt, int64_t ldq,
                     int64_t D, FA_T *restrict st, int64_t lds, FA_T *restrict mx, const int mr,
                     const int nv, const FA_T *pfk, const int l2)
{
    FA_V acc[FA_QVEC_MRMAX][FA_QVEC_NV];
    const FA_T *kr[FA_QVEC_MRMAX];
    const int64_t line = 64 / (int64_t)sizeof(FA_T);
    FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++) {
        if (r < mr) {
            kr[r] = k + r * ksr;
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) acc[r][v] = FA_SFX(fa_set1)(0);
        }
    }
    for (int64_t d0 = 0; d0 < D; d0 += line) {
        /* one cache line of each of the next block's rows per line of d */
        if (pfk)
            FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
                if (r < mr) fa_prefetch_at(pfk + r * ksr + d0, l2);
        const int64_t d1 = d0 + line < D ? d0 + line : D;
        for (int64_t d = d0; d < d1; d++) {
            FA_V b[FA_QVEC_NV];
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) b[v] = FA_SFX(fa_load)(qt + d * ldq + v * FA_W);
            FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++) {
                if (r < mr) {
                    const FA_V a = FA_SFX(fa_set1)(kr[r][d * ksc]);
                    FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                        if (v < nv) acc[r][v] += a * b[v];
                }
            }
        }
    }
    FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) FA_SFX(fa_store)(st + r * lds + v * FA_W, acc[r][v]);
    if (mx) {
        /* running max per lane while the scores are in registers (NaN scores are
         * skipped here: they reach the row through its sum, see fa_qvec_softmax_chunk) */
        FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++) {
            if (v < nv) {
                FA_V m = FA_SFX(fa_load)(mx + v * FA_W);
                FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
                    if (r < mr) m = FA_SFX(fa_vmax)(acc[r][v], m);
                FA_SFX(fa_store)(mx + v * FA_W, m);
            }
        }
    }
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_qvec_qk_nv)(const FA_T *k, int64_t ksr, int64_t ksc, const FA_T *qt, int64_t ldq, int64_t D,
                  FA_T *st, int64_t lds, int64_t j0, int64_t j1, FA_T *mx, const int MR, const int nv,
                  int pf, const int l2)
{
    int64_t j = j0;
    /* with pf (contiguous key rows, first chunk of the tile): each block requests
     * the rows of the block after it, a line of each per line of d, spread over
     * the block's FMAs (the last block requests the next tile's first rows) */
    for (; j + MR <= j1; j += MR)
        FA_SFX(fa_qvec_qk_micro)(k + j * ksr, ksr, ksc, qt, ldq, D, st + j * lds, lds, mx, MR, nv,
                             pf ? k + (j + MR) * ksr : NULL, l2);
    const int64_t rem = j1 - j;
#define FA_QVEC_QK_TAIL(R) \
    FA_SFX(fa_qvec_qk_micro)(k + j * ksr, ksr, ksc, qt, ldq, D, st + j * lds, lds, mx, R, nv, NULL, 0); j += R
    FA_QVEC_TAILS(MR, rem, FA_QVEC_QK_TAIL);
#undef FA_QVEC_QK_TAIL
}

/* Rows [j0, j1) of St for one chunk of nv vectors: keys k + j*ksr; with mx
 * (nv * W lanes, -inf on entry) also the max over those rows per lane. */
static inline void FA_SFX(fa_qvec_qk_chunk)(const FA_T *k, int64_t ksr, int64_t ksc, const FA_T *qt, int64_t ldq,
                                        int64_t D, FA_T *st, int64_t lds, int64_t j0, int64_t j1, FA_T *mx,
                                        int nv, int pf)
{
    /* contiguous key rows (the usual case) get their own instantiations: with
     * ksc = 1 the broadcasts of a block address one row pointer plus constant
     * offsets, instead of a register per row multiple of ksc (on AVX2 the
     * general form spills loop registers to the stack); requesting the next
     * rows into L2 (fa_pf_l2) has instantiations of its own, the hint level a
     * constant: chosen per hint in the loop it cost the float32 prefill 1 %
     * (paired, Zen 4) */
#define FA_QVEC_QK_CONTIG(MR, NV) FA_SFX(fa_qvec_qk_nv)(k, ksr, 1, qt, ldq, D, st, lds, j0, j1, mx, MR, NV, pf, 0)
#define FA_QVEC_QK_CONTIG_L2(MR, NV) FA_SFX(fa_qvec_qk_nv)(k, ksr, 1, qt, ldq, D, st, lds, j0, j1, mx, MR, NV, 1, 1)
#define FA_QVEC_QK_STRIDED(MR, NV) FA_SFX(fa_qvec_qk_nv)(k, ksr, ksc, qt, ldq, D, st, lds, j0, j1, mx, MR, NV, 0, 0)
    if (ksc == 1 && pf && fa_pf_l2)
        FA_QVEC_BY_WIDTH(nv, FA_QVEC_QK_CONTIG_L2);
    else if (ksc == 1)
        FA_QVEC_BY_WIDTH(nv, FA_QVEC_QK_CONTIG);
    else
        FA_QVEC_BY_WIDTH(nv, FA_QVEC_QK_STRIDED);
#undef FA_QVEC_QK_CONTIG
#undef FA_QVEC_QK_CONTIG_L2
#undef FA_QVEC_QK_STRIDED
}

/* Ot[c][chunk] += sum_{j in [j0,j1)} V[j][c] * Pt[j][chunk] for the first mr (constant) columns.
 * Two-level sum: the tile's keys accumulate from zero, then add to Ot once, so
 * an output's rounding error grows with the keys of a tile plus the number of
 * tiles, not with the whole row (float32 error at Lk 65536 was 3x torch's with
 * one running sum; a row of 2^31 equal terms saturated at 2^24 of them). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qvec_pv_micro)(const FA_T *vv, int64_t vsr, int64_t vsc, const FA_T *restrict pt, int64_t lds,
                     int64_t j0, int64_t j1, FA_T *restrict ot, int64_t ldo, const int mr, const int nv)
{
    FA_V acc[FA_QVEC_MRMAX][FA_QVEC_NV];
    FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) acc[r][v] = FA_SFX(fa_set1)(0);
    for (int64_t j = j0; j < j1; j++) {
        FA_V b[FA_QVEC_NV];
        const FA_T *vrow = vv + j * vsr;
        FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
            if (v < nv) b[v] = FA_SFX(fa_load)(pt + j * lds + v * FA_W);
        FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++) {
            if (r < mr) {
                const FA_V a = FA_SFX(fa_set1)(vrow[r * vsc]);
                FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                    if (v < nv) acc[r][v] += a * b[v];
            }
        }
    }
    FA_UNROLL for (int r = 0; r < FA_QVEC_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
                if (v < nv) FA_SFX(fa_store)(ot + r * ldo + v * FA_W, FA_SFX(fa_load)(ot + r * ldo + v * FA_W) + acc[r][v]);
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_qvec_pv_nv)(const FA_T *vv, int64_t vsr, int64_t vsc, int64_t Dv, const FA_T *pt, int64_t lds,
                  int64_t j0, int64_t j1, FA_T *ot, int64_t ldo, const int MR, const int nv)
{
    int64_t c = 0;
    for (; c + MR <= Dv; c += MR)
        FA_SFX(fa_qvec_pv_micro)(vv + c * vsc, vsr, vsc, pt, lds, j0, j1, ot + c * ldo, ldo, MR, nv);
    const int64_t rem = Dv - c;
#define FA_QVEC_PV_TAIL(R) \
    FA_SFX(fa_qvec_pv_micro)(vv + c * vsc, vsr, vsc, pt, lds, j0, j1, ot + c * ldo, ldo, R, nv); c += R
    FA_QVEC_TAILS(MR, rem, FA_QVEC_PV_TAIL);
#undef FA_QVEC_PV_TAIL
}

/* All Dv output columns of one chunk of nv vectors: values v + j*vsr + c*vsc. */
static inline void FA_SFX(fa_qvec_pv_chunk)(const FA_T *vv, int64_t vsr, int64_t vsc, int64_t Dv, const FA_T *pt,
                                        int64_t lds, int64_t j0, int64_t j1, FA_T *ot, int64_t ldo, int nv)
{
    /* contiguous value rows get their own instantiations: see fa_qvec_qk_chunk */
#define FA_QVEC_PV_CONTIG(MR, NV) FA_SFX(fa_qvec_pv_nv)(vv, vsr, 1, Dv, pt, lds, j0, j1, ot, ldo, MR, NV)
#define FA_QVEC_PV_STRIDED(MR, NV) FA_SFX(fa_qvec_pv_nv)(vv, vsr, vsc, Dv, pt, lds, j0, j1, ot, ldo, MR, NV)
    if (vsc == 1)
        FA_QVEC_BY_WIDTH(nv, FA_QVEC_PV_CONTIG);
    else
        FA_QVEC_BY_WIDTH(nv, FA_QVEC_PV_STRIDED);
#undef FA_QVEC_PV_CONTIG
#undef FA_QVEC_PV_STRIDED
}

/* St[j][lane] = -inf where key t0+j lies outside the lane's visible range
 * [lo[lane], hi[lane]) (ranges stored in FA_T, exact for lengths < 2^24 / 2^53). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qvec_range_mask_nv)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                    const FA_T *lo, const FA_T *hi, const int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    FA_UNROLL for (int v = 0; v < nv; v++) {
        const FA_V lov = FA_SFX(fa_load)(lo + v * FA_W), hiv = FA_SFX(fa_load)(hi + v * FA_W);
        for (int64_t j = j0; j < j1; j++) {
            const FA_V jv = FA_SFX(fa_set1)((FA_T)(t0 + j));
            FA_T *p = st + j * lds + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_select)((jv >= lov) & (jv < hiv), FA_SFX(fa_load)(p), ninf));
        }
    }
}

/* The same for a chunk of nv = 1, 2 or FA_QVEC_NV vectors (instantiated per width). */
static inline void FA_SFX(fa_qvec_range_mask_chunk)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                                          const FA_T *lo, const FA_T *hi, int nv)
{
#define FA_QVEC_RANGE_MASK(MR, NV) FA_SFX(fa_qvec_range_mask_nv)(st, lds, j0, j1, t0, lo, hi, NV)
    FA_QVEC_BY_WIDTH(nv, FA_QVEC_RANGE_MASK);
#undef FA_QVEC_RANGE_MASK
}

/* ALiBi on the query-vectorised path: St[j][i] -= slope_i * |pos_i - (t0 + j)|
 * over lanes [0, nv * W) (lanes past ni get slope 0: padding lanes, masked
 * later) and keys [j0, j1).  slopes: the batch entry's table (one per group),
 * goff / pos: each lane's group and diagonal position.  The distance is exact
 * in FA_T while positions and keys stay below 2^22 (float; the caller checks). */
static inline void FA_SFX(fa_qvec_alibi)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                                     const FA_T *slopes, const int64_t *goff, const int64_t *pos,
                                     int64_t ni, int nv)
{
    FA_T sl[FA_QVEC_NV * FA_W] __attribute__((aligned(FA_ALIGN)));
    FA_T ps[FA_QVEC_NV * FA_W] __attribute__((aligned(FA_ALIGN)));
    for (int64_t i = 0; i < (int64_t)nv * FA_W; i++) {
        sl[i] = i < ni ? slopes[goff[i]] : 0;
        ps[i] = i < ni ? (FA_T)pos[i] : 0;
    }
    for (int v = 0; v < nv; v++) {
        const FA_V sv = FA_SFX(fa_load)(sl + v * FA_W), pv = FA_SFX(fa_load)(ps + v * FA_W);
        for (int64_t j = j0; j < j1; j++) {
            FA_V d = pv - FA_SFX(fa_set1)((FA_T)(t0 + j));
            d = FA_SFX(fa_select)(d < 0, -d, d);
            FA_T *p = st + j * lds + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_load)(p) - sv * d);
        }
    }
}

/* St[j][lane] = -inf where the boolean mask says the lane's query may not see key
 * t0+j.  mrows[lane] points at the lane's mask row (column 0), columns sc bytes
 * apart; lanes >= nl are left alone (padding lanes are masked by their empty
 * range).  The mask block is first transposed into tbuf (cw x (j1-j0) bytes) so
 * the select runs on whole vectors of lanes without branches: a random mask would
 * mispredict half of its branches. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qvec_bool_mask_nv)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                         const uint8_t *const *mrows, int64_t nl, int64_t sc, uint8_t *tbuf, const int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    const int64_t cw = (int64_t)nv * FA_W;
    if (sc == 1) {
        /* contiguous mask rows: blocks of 16 lanes x 16 keys, loaded as 16 rows
         * of 16 bytes and transposed in registers (a partial block: the missing
         * keys are zero bytes, never stored; lanes past nl keep everything) */
        const fa_u8x16 ones = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        for (int64_t L0 = 0; L0 < cw; L0 += 16) {
            const int64_t nlb = cw - L0 < 16 ? cw - L0 : 16;
            for (int64_t J0 = j0; J0 < j1; J0 += 16) {
                const int64_t nk = j1 - J0 < 16 ? j1 - J0 : 16;
                fa_u8x16 r[16];
                for (int l = 0; l < 16; l++) {
                    if (L0 + l < nl) {
                        const uint8_t *m = mrows[L0 + l] + t0 + J0;
                        if (nk == 16) {
                            memcpy(&r[l], m, 16);
                        } else {
                            r[l] = ones - ones;
                            memcpy(&r[l], m, (size_t)nk);
                        }
                    } else {
                        r[l] = ones;
                    }
                }
                fa_transpose_u8x16(r);
                for (int64_t jj = 0; jj < nk; jj++) {
                    uint8_t *dst = tbuf + (J0 + jj - j0) * cw + L0;
                    if (nlb == 16)
                        memcpy(dst, &r[jj], 16);
                    else
                        memcpy(dst, &r[jj], (size_t)nlb);
                }
            }
        }
    } else
    for (int64_t i = 0; i < cw; i++) {
        uint8_t *col = tbuf + i;
        if (i < nl) {
            const uint8_t *m = mrows[i] + t0 * sc;
            for (int64_t j = j0; j < j1; j++) col[(j - j0) * cw] = m[j * sc];
        } else {
            for (int64_t j = j0; j < j1; j++) col[(j - j0) * cw] = 1;
        }
    }
    for (int64_t j = j0; j < j1; j++) {
        const uint8_t *row = tbuf + (j - j0) * cw;
        FA_UNROLL for (int v = 0; v < nv; v++) {
            const FA_VI keep = FA_SFX(fa_widen_bytes)(row + v * FA_W);
            FA_T *p = st + j * lds + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_select)(keep != 0, FA_SFX(fa_load)(p), ninf));
        }
    }
}

/* The same for a chunk of nv = 1, 2 or FA_QVEC_NV vectors (instantiated per width). */
static inline void FA_SFX(fa_qvec_bool_mask_chunk)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                                               const uint8_t *const *mrows, int64_t nl, int64_t sc,
                                               uint8_t *tbuf, int nv)
{
#define FA_QVEC_BOOL_MASK(MR, NV) FA_SFX(fa_qvec_bool_mask_nv)(st, lds, j0, j1, t0, mrows, nl, sc, tbuf, NV)
    FA_QVEC_BY_WIDTH(nv, FA_QVEC_BOOL_MASK);
#undef FA_QVEC_BOOL_MASK
}

/* Online softmax update of one chunk over rows [j0, j1) of St: running
 * reference m, rescale of the running sum l and of the accumulator Ot (Dv rows)
 * by exp(m_old - m_new), St -> P = exp(St - m_new).  NaN propagates per lane; a
 * lane whose scores are all -inf so far keeps m = -inf, l = 0 and gets P = 0.
 *
 * Lazy rescale: m is the first finite max of the lane and moves only when a
 * tile's max exceeds it by more than FA_RESCALE_SLACK, so P <= exp(slack) and
 * the result is the same softmax (any reference cancels in Ot / l).  Once the
 * lanes settle, alpha is exactly 1 and the pass over Ot is skipped. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qvec_softmax_nv)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, FA_T *m, FA_T *l,
                       FA_T *ot, int64_t ldo, int64_t Dv, const FA_T *mx, const int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    FA_V alpha[FA_QVEC_NV];
    FA_VI moved = (FA_VI)FA_SFX(fa_set1)(0);
    FA_UNROLL for (int v = 0; v < nv; v++) {
        /* The tile max per lane (given in mx, or a pass over the tile) with plain
         * max, which skips NaN scores: a NaN still makes its lane NaN, through
         * exp(NaN - m) in the sum l and through P.V, exactly as a NaN max would. */
        FA_V mt0 = ninf, mt1 = ninf;
        int64_t j = j0;
        if (mx) {
            mt0 = FA_SFX(fa_load)(mx + v * FA_W);
        } else {
            for (; j + 2 <= j1; j += 2) {
                mt0 = FA_SFX(fa_vmax)(FA_SFX(fa_load)(st + j * lds + v * FA_W), mt0);
                mt1 = FA_SFX(fa_vmax)(FA_SFX(fa_load)(st + (j + 1) * lds + v * FA_W), mt1);
            }
            if (j < j1) mt0 = FA_SFX(fa_vmax)(FA_SFX(fa_load)(st + j * lds + v * FA_W), mt0);
        }
        const FA_V mo = FA_SFX(fa_load)(m + v * FA_W);
        const FA_V mt = FA_SFX(fa_vmax)(mt0, mt1);
        /* mo = -inf: -inf + slack is -inf, any finite or +inf max moves it */
        const FA_V mn = FA_SFX(fa_select)(mt > mo + (FA_T)FA_RESCALE_SLACK, mt, mo);
        moved |= mn != mo;
        const FA_V mn_safe = FA_SFX(fa_select)(mn == ninf, FA_SFX(fa_set1)(0), mn);
        alpha[v] = FA_SFX(fa_vexp_p)(mo - mn_safe);
        FA_V s0 = FA_SFX(fa_set1)(0), s1 = s0;
        for (j = j0; j + 2 <= j1; j += 2) {
            FA_T *p0 = st + j * lds + v * FA_W, *p1 = p0 + lds;
            const FA_V e0 = FA_SFX(fa_vexp_p)(FA_SFX(fa_load)(p0) - mn_safe);
            const FA_V e1 = FA_SFX(fa_vexp_p)(FA_SFX(fa_load)(p1) - mn_safe);
            FA_SFX(fa_store)(p0, e0);
            FA_SFX(fa_store)(p1, e1);
            s0 += e0;
            s1 += e1;
        }
        if (j < j1) {
            FA_T *p0 = st + j * lds + v * FA_W;
            const FA_V e0 = FA_SFX(fa_vexp_p)(FA_SFX(fa_load)(p0) - mn_safe);
            FA_SFX(fa_store)(p0, e0);
            s0 += e0;
        }
        FA_SFX(fa_store)(l + v * FA_W, FA_SFX(fa_load)(l + v * FA_W) * alpha[v] + (s0 + s1));
        FA_SFX(fa_store)(m + v * FA_W, mn);
    }
    /* no lane moved: every alpha is exp(0) = 1 exactly, or exp(-inf) = 0 for a
     * lane still at -inf, whose Ot holds only 0 * v terms and whose l is 0 (its
     * output is written as zeros) -- the multiply would change nothing */
    if (!FA_SFX(fa_any)(moved)) return;
    for (int64_t c = 0; c < Dv; c++)
        FA_UNROLL for (int v = 0; v < nv; v++) {
            FA_T *p = ot + c * ldo + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_load)(p) * alpha[v]);
        }
}

/* The same for a chunk of nv = 1, 2 or FA_QVEC_NV vectors (instantiated per width). */
static inline void FA_SFX(fa_qvec_softmax_chunk)(FA_T *st, int64_t lds, int64_t j0, int64_t j1,
                                             FA_T *m, FA_T *l, FA_T *ot, int64_t ldo, int64_t Dv,
                                             const FA_T *mx, int nv)
{
#define FA_QVEC_SOFTMAX(MR, NV) FA_SFX(fa_qvec_softmax_nv)(st, lds, j0, j1, m, l, ot, ldo, Dv, mx, NV)
    FA_QVEC_BY_WIDTH(nv, FA_QVEC_SOFTMAX);
#undef FA_QVEC_SOFTMAX
}

/* return_weights, second pass: St[j][lane] -> exp(St - lse[lane]) over rows
 * [j0, j1) of a chunk of nv vectors (lse from the first pass: >= every score of
 * the lane, so the arguments are <= 0 up to rounding).  A lane with lse = -inf
 * saw only -inf scores: its weights are 0 (the -inf - 0 of the safe lse); a NaN
 * lse makes the lane's weights NaN. */
static inline void FA_SFX(fa_qvec_weights_chunk)(FA_T *st, int64_t lds, int64_t j0, int64_t j1,
                                             const FA_T *lse, int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    for (int v = 0; v < nv; v++) {
        const FA_V ls = FA_SFX(fa_load)(lse + v * FA_W);
        const FA_V ls_safe = FA_SFX(fa_select)(ls == ninf, FA_SFX(fa_set1)(0), ls);
        for (int64_t j = j0; j < j1; j++) {
            FA_T *p = st + j * lds + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_vexp_nonpos)(FA_SFX(fa_load)(p) - ls_safe));
        }
    }
}

#undef FA_QVEC_TAILS
#undef FA_QVEC_BY_WIDTH
