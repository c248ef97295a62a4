/* Every kernel that reads q, k or v where the caller stores them: dot products
 * and scores of few query rows against key rows read in place (decode), P.V
 * over value rows read in place, the copy of value rows into a packed tile, and
 * the transposed pack of query or key rows.  Stored elements have the storage
 * type FA_S and are read through widen.h (FA_SSFX names this instantiation);
 * the packed query rows, scores, probabilities and accumulators are FA_T.
 * Part of the per-type body (simd_body.h).  Not a standalone header. */

/* Transposed query pack: qt[d * ld + i] = q[qoff[i] + d] * scale for i < nr,
 * d < D (query elements contiguous).  W x W blocks through registers as in
 * fa_qvec_store_rows.  pf != 0: while a block of W rows is read, the same elements
 * pf further on are requested (the key pack streams its rows from memory and
 * passes W rows' stride: the next block's rows). */
static inline void FA_SSFX(fa_pack_transposed)(const FA_S *q, const int64_t *qoff, int64_t nr, int64_t D, FA_T scale,
                                      FA_T *qt, int64_t ld, int64_t pf)
{
    int64_t i0 = 0;
    for (; i0 + FA_W <= nr; i0 += FA_W) {
        int64_t d0 = 0;
        for (; d0 + FA_W <= D; d0 += FA_W) {
            FA_V r[FA_W];
            if (pf)
                FA_UNROLL for (int i = 0; i < FA_W; i++) __builtin_prefetch(q + qoff[i0 + i] + pf + d0, 0, FA_PF_LOC);
            FA_UNROLL for (int i = 0; i < FA_W; i++) r[i] = FA_SSFX(fa_load_s)(q + qoff[i0 + i] + d0);
            FA_SFX(fa_transpose)(r);
            FA_UNROLL for (int d = 0; d < FA_W; d++) FA_SFX(fa_store)(qt + (d0 + d) * ld + i0, r[d] * scale);
        }
        for (int64_t d = d0; d < D; d++)
            for (int64_t i = i0; i < i0 + FA_W; i++) qt[d * ld + i] = FA_SSFX(fa_scalar_s)(q[qoff[i] + d]) * scale;
    }
    for (int64_t d = 0; d < D; d++)
        for (int64_t i = i0; i < nr; i++) qt[d * ld + i] = FA_SSFX(fa_scalar_s)(q[qoff[i] + d]) * scale;
}

/* mr may reach 4 on targets whose block is 3 rows (fa_pv_rows: a GQA group of 4 in
 * one block of 4 x 2 vectors) */
#ifndef FA_PV_MRX
#  define FA_PV_MRX (FA_PV_MR < 4 ? 4 : FA_PV_MR)
#endif

/* PV micro-kernel (two-level sums as fa_qvec_pv_micro: the keys of one call
 * accumulate from zero, then add to O once) on mr (<= FA_PV_MR) rows and nv (<= FA_PV_NV) vectors of
 * columns, both compile-time constants after inlining:
 * O[0:mr, :nv*W] += P[0:mr, k0:k1] . V[k0:k1, :nv*W].  pfn > 0: the value rows
 * pf further on are requested, pfn elements each (V streamed from memory), into
 * L1 or, l2 != 0, into L2. */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_pv_micro)(const FA_T *restrict p, int64_t ldp, const FA_S *restrict vp, int64_t ldv,
                    int64_t k0, int64_t k1, FA_T *restrict o, int64_t ldo, const int mr, const int nv,
                    int64_t pf, int64_t pfn, int l2)
{
    FA_V acc[FA_PV_MRX][FA_PV_NV];
    FA_UNROLL for (int i = 0; i < FA_PV_MRX; i++)
        FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
            if (i < mr && v < nv) acc[i][v] = FA_SFX(fa_set1)(0);
    for (int64_t k = k0; k < k1; k++) {
        FA_V b[FA_PV_NV];
        if (pfn) fa_prefetch_bytes_at(vp + (k + pf) * ldv, pfn * (int64_t)sizeof(FA_S), l2);
        FA_UNROLL for (int v = 0; v + 1 < FA_PV_NV; v += 2)
            if (v + 1 < nv) FA_SSFX(fa_load2_raw_s)(vp + k * ldv + v * FA_W, b + v);
        if (nv % 2) b[nv - 1] = FA_SSFX(fa_load_raw_s)(vp + k * ldv + (nv - 1) * FA_W);
        FA_UNROLL for (int i = 0; i < FA_PV_MRX; i++)
            if (i < mr) {
                const FA_V a = FA_SFX(fa_set1)(p[i * ldp + k]);
                FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
                    if (v < nv) acc[i][v] += a * b[v];
            }
    }
    FA_UNROLL for (int i = 0; i < FA_PV_MRX; i++)
        FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
            if (i < mr && v < nv)
                FA_SFX(fa_store)(o + i * ldo + v * FA_W, FA_SFX(fa_load)(o + i * ldo + v * FA_W)
                                                        + FA_SSFX(fa_raw_scale_s)(acc[i][v]));
}

/* O[0:mr, 0:nvec*W] += P[0:mr, k0:k1] . V[k0:k1, 0:nvec*W] (mr a compile-time
 * constant after inlining), in column chunks of FA_PV_NV vectors and one chunk
 * of the rest.  pfn > 0: the first chunk requests the value rows pf ahead (into
 * L2 where l2 != 0). */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_pv_cols)(const FA_T *restrict p, int64_t ldp, const FA_S *restrict vp, int64_t ldv,
                   int64_t k0, int64_t k1, FA_T *restrict o, int64_t ldo, int64_t nvec, const int mr,
                   int64_t pf, int64_t pfn, int l2)
{
    int64_t c = 0;
    for (; c + FA_PV_NV <= nvec; c += FA_PV_NV, pfn = 0)
        FA_SSFX(fa_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, mr, FA_PV_NV, pf, pfn, l2);
    switch (nvec - c) {
    case 1: FA_SSFX(fa_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, mr, 1, pf, pfn, l2); break;
    case 2: FA_SSFX(fa_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, mr, 2, pf, pfn, l2); break;
    case 3: FA_SSFX(fa_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, mr, 3, pf, pfn, l2); break;
    default: break;
    }
}

/* ---------------- few query rows (decode) ----------------
 * Lanes run over the head dimension: keys and values are read in place, one
 * contiguous row at a time, so nothing is packed and no lane is wasted on
 * padding rows; these loops are bound by memory bandwidth, not FLOPs. */

/* a . b over n elements in FA_DOT_ACCS independent accumulators (the target's
 * choice: enough FMA chains to cover the latency of its FMA pipes), the last
 * partial vector into the first, summed pairwise, then across the lanes. */
static inline FA_T FA_SSFX(fa_dot)(const FA_T *a, const FA_S *b, int64_t n)
{
    FA_V acc[FA_DOT_ACCS];
    FA_UNROLL for (int u = 0; u < FA_DOT_ACCS; u++) acc[u] = FA_SFX(fa_set1)(0);
    int64_t d = 0;
#if FA_DOT_ACCS == 2
    /* two steps of the loop below at a time, so that a target may widen four
     * stored vectors in one go (float8: 32 bytes, half the instructions); the
     * accumulators see the same products in the same order */
    for (; d + 4 * FA_W <= n; d += 4 * FA_W) {
        FA_V bv[4];
        FA_SSFX(fa_load4_raw_s)(b + d, bv);
        FA_UNROLL for (int i = 0; i < 4; i++) acc[i & 1] += FA_SFX(fa_load)(a + d + i * FA_W) * bv[i];
    }
#endif
    for (; d + FA_DOT_ACCS * FA_W <= n; d += FA_DOT_ACCS * FA_W) {
#if FA_DOT_ACCS % 4 == 0
        FA_UNROLL for (int u = 0; u < FA_DOT_ACCS; u += 4) {
            FA_V bv[4];
            FA_SSFX(fa_load4_raw_s)(b + d + u * FA_W, bv);
            FA_UNROLL for (int i = 0; i < 4; i++) acc[u + i] += FA_SFX(fa_load)(a + d + (u + i) * FA_W) * bv[i];
        }
#else
        FA_UNROLL for (int u = 0; u < FA_DOT_ACCS; u++)
            acc[u] += FA_SFX(fa_load)(a + d + u * FA_W) * FA_SSFX(fa_load_raw_s)(b + d + u * FA_W);
#endif
    }
    for (; d + FA_W <= n; d += FA_W) acc[0] += FA_SFX(fa_load)(a + d) * FA_SSFX(fa_load_raw_s)(b + d);
    /* the last partial vector as a vector (lanes past n zero): a scalar loop here
     * was compiled differently per storage type (contracted into FMAs for float8,
     * products rounded apart where the compiler vectorised the float32 one), so a
     * float8 row's score differed in the last bit from its float32 copy's */
    if (d < n) acc[0] += FA_SFX(fa_load_part)(a + d, n - d, 0) * FA_SSFX(fa_load_part_raw_s)(b + d, n - d, 0);
#if FA_DOT_ACCS >= 8
    FA_UNROLL for (int u = 0; u < 4; u++) acc[u] += acc[u + 4];
#endif
#if FA_DOT_ACCS >= 4
    FA_UNROLL for (int u = 0; u < 2; u++) acc[u] += acc[u + 2];
#endif
#if FA_DOT_ACCS >= 2
    acc[0] += acc[1];
#endif
    const FA_T s = FA_SFX(fa_hsum)(acc[0]);
    return FA_SSFX(fa_raw_factor_s)() == 1 ? s : s * FA_SSFX(fa_raw_factor_s)();
}

/* Copy n rows of D contiguous elements (rows sr apart) into dst rows ldd apart,
 * whole vectors at a time; a row's last partial vector is stored whole with
 * zeros past D (dst rows hold D rounded up to a vector).  Returns 1 if any
 * copied element is inf or NaN (x * 0 is NaN only for those). */
static inline int FA_SSFX(fa_pack_rows)(const FA_S *src, int64_t sr, int64_t n, int64_t D,
                                       FA_T *dst, int64_t ldd)
{
    FA_V acc0 = FA_SFX(fa_set1)(0), acc1 = acc0;
    const int64_t pf = FA_SSFX(fa_pf_rows_s)(D);
    for (int64_t j = 0; j < n; j++) {
        const FA_S *s = src + j * sr;
        FA_T *d = dst + j * ldd;
        FA_SSFX(fa_prefetch_s)(s + pf * sr, D);
        int64_t c = 0;
        for (; c + 2 * FA_W <= D; c += 2 * FA_W) {
            const FA_V x0 = FA_SSFX(fa_load_s)(s + c), x1 = FA_SSFX(fa_load_s)(s + c + FA_W);
            FA_SFX(fa_store)(d + c, x0);
            FA_SFX(fa_store)(d + c + FA_W, x1);
            acc0 += x0 * 0;
            acc1 += x1 * 0;
        }
        for (; c < D; c += FA_W) {
            const FA_V x = c + FA_W <= D ? FA_SSFX(fa_load_s)(s + c) : FA_SSFX(fa_load_part_s)(s + c, D - c, 0);
            FA_SFX(fa_store)(d + c, x);
            acc0 += x * 0;
        }
    }
    return FA_SFX(fa_hsum)(acc0 + acc1) != 0;    /* lanes hold 0 or NaN */
}

/* fa_qk_rows takes the rows in blocks of at most this many (a power of two) */
#define FA_QKR_MAX (FA_QK_PAIRS < 8 ? FA_QK_PAIRS : 8)
/* keys per sweep of fa_qk_pass's key-major loop: two key rows read side by
 * side, each query vector loaded once for both (one key at a time loaded the
 * query vectors once per key: 5 vector loads per 4 FMAs, load-bound on Zen 4).
 * GQA decode Hq32 Hkv8 D128 on 2 Zen 4 threads, paired: 1.03-1.08x faster with
 * the keys in cache, level from memory; four keys were 1.19x in cache but 0.89x
 * from memory (four streams a row apart: the hardware prefetchers' trouble of
 * the group order, below) */
#define FA_QK_KEYS_SWEEP 2
/* One step of fa_qk_pass: the vector at element d of each of the group's keys
 * (u < nk), times each row's query vector at d, into the (row, key)
 * accumulators r; pfd != 0: each key row's element d pfd rows further on is
 * requested; hold: the query vectors are held in registers (FA_IN_REG) rather
 * than folded into the FMAs as memory operands. */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_qk_step)(const FA_T *qp, int64_t ldq, const int R, int nk, const FA_S *kg, int64_t ksr, int64_t d,
                   int64_t pfd, const int hold, FA_V *r, const int l2)
{
    const int G = FA_QK_PAIRS / R;
    FA_V kv[FA_QK_PAIRS];
    FA_UNROLL for (int u = 0; u < G; u++)
        if (u < nk) {
            if (pfd) fa_prefetch_at(kg + (u + pfd) * ksr + d, l2);
            kv[u] = FA_SSFX(fa_load_raw_s)(kg + u * ksr + d);
        }
    FA_UNROLL for (int i = 0; i < R; i++) {
        FA_V qv = FA_SFX(fa_load)(qp + i * ldq + d);
        if (hold) FA_IN_REG(qv);
        FA_UNROLL for (int u = 0; u < G; u++)
            if (u < nk) r[i * G + u] += qv * kv[u];
    }
}

/* Scores of R query rows (R a power of two <= FA_QKR_MAX) with G = FA_QK_PAIRS /
 * R keys, kg's rows ksr apart, in one pass over the keys: one accumulator per
 * (row, key) pair, so FA_QK_PAIRS independent FMA chains (the target's choice:
 * W on x86, 4 W on NEON, whose 4-lane vectors would give too few), each key
 * vector loaded once for the R rows; then per W of them one transpose-and-add
 * tree instead of W horizontal sums.  Lane x of tree b is the sum of the lanes
 * of pair b * W + x = (i, u) -- pair i*G + u -- in fa_hsum's order, so a score
 * does not depend on R or on the key's place in the group.  Stores the first
 * nrow rows' scores of the first nk keys (s rows lds apart); keys past nk are not
 * read.  pf != 0: the keys stream from memory, and the same part of the key
 * rows pf rows further on is requested: per 64-byte line where the storage type
 * takes the line-by-line loop (fa_line_vecs_s: float16), else per key vector.
 * In that loop the query vectors are held in registers (FA_IN_REG).
 * keymajor (float32 / float64 keys read without L1 hints, see fa_qk_rows_r):
 * a whole group's keys one after the other, the same bits, pf != 0 the L2
 * hints' distance in rows. */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_qk_pass)(const FA_T *qp, int64_t ldq, const int R, int nrow, int64_t D, const FA_S *kg, int64_t ksr,
                   int nk, int64_t pf, FA_T *s, int64_t lds, int keymajor, const int l2)
{
    const int G = FA_QK_PAIRS / R;
    FA_V r[FA_QK_PAIRS];
    FA_UNROLL for (int x = 0; x < FA_QK_PAIRS; x++) r[x] = FA_SFX(fa_set1)(0);
    int64_t d = 0;
    if (pf && D > 0)    /* the line of each row's last element: a row that does not start a line
                         * touches one more than the loops below request (fa_prefetch_bytes_at) */
        FA_UNROLL for (int u = 0; u < G; u++)
            if (u < nk) {
                if (keymajor) fa_prefetch_at(kg + (u + pf) * ksr + D - 1, 1);
                else fa_prefetch_at(kg + (u + pf) * ksr + D - 1, l2);
            }
#ifdef FA_S_NATIVE
    if (keymajor && nk == G && D % FA_W == 0) {
        /* key pair by key pair (FA_QK_KEYS_SWEEP), each pair's rows read start
         * to end side by side: the group's rows are nearly one sequential stream
         * for the hardware prefetchers (keys u, u + 1's vectors d, then d + W,
         * ..., then keys u + 2, u + 3) instead of G streams a row apart.  Each
         * accumulator sees the same products in the same order of d, so the
         * same bits; 2 R chains per pair, not R * G.  pf != 0: each line of the
         * rows pf rows further on is requested into L2 */
        enum { KS = FA_QK_KEYS_SWEEP };
        FA_UNROLL for (int u0 = 0; u0 < G; u0 += KS) {
            const int ku = G - u0 < KS ? G - u0 : KS;
            const FA_S *kr = kg + u0 * ksr;
            for (d = 0; d < D; d += FA_W) {
                if (pf && FA_SSFX(fa_line_start_s)(d))
                    FA_UNROLL for (int u = 0; u < KS; u++)
                        if (u < ku) fa_prefetch_at(kr + (pf + u) * ksr + d, 1);
                FA_V kv[KS];
                FA_UNROLL for (int u = 0; u < KS; u++)
                    if (u < ku) kv[u] = FA_SSFX(fa_load_raw_s)(kr + u * ksr + d);
                FA_UNROLL for (int i = 0; i < R; i++) {
                    const FA_V qv = FA_SFX(fa_load)(qp + i * ldq + d);
                    FA_UNROLL for (int u = 0; u < KS; u++)
                        if (u < ku) r[i * G + u0 + u] += qv * kv[u];
                }
            }
        }
    }
#else
    (void)keymajor;
#endif
    /* where the storage type widens two vectors in one go (float8 on AVX2), two
     * vectors of each key at a time; each accumulator sees the same products in
     * the same order */
    for (; FA_SSFX(fa_load2_one_s)() && d + 2 * FA_W <= D; d += 2 * FA_W) {
        FA_V kv[FA_QK_PAIRS][2];
        FA_UNROLL for (int u = 0; u < G; u++)
            if (u < nk) {
                if (pf) fa_prefetch_at(kg + (u + pf) * ksr + d, l2);
                FA_SSFX(fa_load2_raw_s)(kg + u * ksr + d, kv[u]);
            }
        FA_UNROLL for (int h = 0; h < 2; h++)
            FA_UNROLL for (int i = 0; i < R; i++) {
                const FA_V qv = FA_SFX(fa_load)(qp + i * ldq + d + h * FA_W);
                FA_UNROLL for (int u = 0; u < G; u++)
                    if (u < nk) r[i * G + u] += qv * kv[u][h];
            }
    }
    /* a 64-byte line of each key row at a time (VL vectors; the lines of the
     * rows' starts), one prefetch per line, the query vectors held */
    const int VL = FA_SSFX(fa_line_vecs_s)();
    for (; VL > 1 && d + VL * FA_W <= D; d += VL * FA_W) {
        if (pf)     /* all before the line's loads (interleaved with them: 5 of 6 pairs slower from memory) */
            FA_UNROLL for (int u = 0; u < G; u++)
                if (u < nk) fa_prefetch_at(kg + (u + pf) * ksr + d, l2);
        FA_UNROLL for (int h = 0; h < VL; h++)
            FA_SSFX(fa_qk_step)(qp, ldq, R, nk, kg, ksr, d + h * FA_W, 0, G > 1, r, l2);
    }
    for (; d + FA_W <= D; d += FA_W)
        FA_SSFX(fa_qk_step)(qp, ldq, R, nk, kg, ksr, d, VL == 1 || FA_SSFX(fa_line_start_s)(d) ? pf : 0, 0, r, l2);
    if (d < D) {
        FA_V kv[FA_QK_PAIRS];
        FA_UNROLL for (int u = 0; u < G; u++)
            if (u < nk) kv[u] = FA_SSFX(fa_load_part_raw_s)(kg + u * ksr + d, D - d, 0);
        FA_UNROLL for (int i = 0; i < R; i++) {
            const FA_V qv = FA_SFX(fa_load_part)(qp + i * ldq + d, D - d, 0);
            FA_UNROLL for (int u = 0; u < G; u++)
                if (u < nk) r[i * G + u] += qv * kv[u];
        }
    }
    FA_UNROLL for (int b = 0; b < FA_QK_PAIRS / FA_W; b++) {
        FA_SFX(fa_transpose_add)(r + b * FA_W);
        r[b * FA_W] = FA_SSFX(fa_raw_scale_s)(r[b * FA_W]);
    }
    if (FA_QK_PAIRS == FA_W && R == 1 && nk == FA_W) {
        FA_SFX(fa_store)(s, r[0]);
    } else {
        FA_T t[FA_QK_PAIRS];
        FA_UNROLL for (int b = 0; b < FA_QK_PAIRS / FA_W; b++) FA_SFX(fa_store)(t + b * FA_W, r[b * FA_W]);
        for (int i = 0; i < nrow; i++)
            for (int u = 0; u < nk; u++) s[i * lds + u] = t[i * G + u];
    }
}

/* fa_qk_rows for nrow <= R rows (qp rows up to R readable; the padding rows'
 * scores are computed and dropped).  l2n (a constant; the storage types of
 * fa_pf_l2_few_s only): their hints go into L2, FA_PF_L2_BYTES ahead (fa_pf_l2).
 * pfo: the prefetch offset in rows where stream (FA_PF_AUTO: the distance
 * below). */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_qk_rows_r)(const FA_T *qp, int64_t ldq, const int R, int nrow, int64_t D, const FA_S *k, int64_t ksr,
                     int64_t n, FA_T *s, int64_t lds, int stream, const int l2n, int64_t pfo)
{
    const int G = FA_QK_PAIRS / R;
    const int64_t pfr = FA_SSFX(fa_pf_rows_s)(D);
    /* float32 / float64 keys streamed where wide rows go without L1 hints
     * (fa_pf_wide off: AMD; a paged cache's short runs everywhere: fa_pf_hinted_po_s):
     * each group's keys read key by key, with L2 hints.
     * On a Zen 4 the group order (G rows a key row apart, a 64-byte line of
     * each in turn) kept the hardware prefetchers from streaming:
     * GQA decode Hq32 Hkv8 Lk8192 D128: one thread 6.6-7.3 -> 4.1-4.2 ms, two 3.2-3.5 -> 2.3-2.4
     * (docs/performance.rst, "GQA decode: keys in order") */
#ifdef FA_S_NATIVE
    const int keymajor = stream && !FA_SSFX(fa_pf_hinted_po_s)(pfo);
#else
    const int keymajor = 0;
#endif
    /* keymajor: L2 hints FA_PF_L2_BYTES ahead (docs/performance.rst, "GQA
     * decode: L2 hints"): GQA decode 2.12-2.58 -> 1.57-1.83 ms on 2 Zen 4 threads */
    const int l2 = FA_SSFX(fa_pf_l2_few_s)() && l2n;
    const int64_t pf = !stream ? 0 : pfo != FA_PF_AUTO ? pfo
                     : keymajor || l2 ? FA_SSFX(fa_pf_l2_rows_s)(D) : pfr > G ? pfr : G;
    int64_t j = 0;
    for (; j + G <= n; j += G)
        FA_SSFX(fa_qk_pass)(qp, ldq, R, nrow, D, k + j * ksr, ksr, G, pf, s + j, lds, keymajor, l2);
    if (j < n)
        FA_SSFX(fa_qk_pass)(qp, ldq, R, nrow, D, k + j * ksr, ksr, (int)(n - j), 0, s + j, lds, 0, l2);
}

/* One block of rows (<= FA_QKR_MAX) in one pass per group of keys, its row count
 * padded to a power of two. */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_qk_rows_pad_l)(const FA_T *q, int64_t ldq, int rows, int64_t D, const FA_S *k, int64_t ksr, int64_t n,
                         FA_T *s, int64_t lds, int stream, const int l2n, int64_t pfo)
{
    if (rows <= 1)
        FA_SSFX(fa_qk_rows_r)(q, ldq, 1, rows, D, k, ksr, n, s, lds, stream, l2n, pfo);
    else if (rows <= 2 || FA_QKR_MAX < 4)
        FA_SSFX(fa_qk_rows_r)(q, ldq, 2, rows, D, k, ksr, n, s, lds, stream, l2n, pfo);
    else if (rows <= 4 || FA_QKR_MAX < 8)
        FA_SSFX(fa_qk_rows_r)(q, ldq, FA_QKR_MAX >= 4 ? 4 : 2, rows, D, k, ksr, n, s, lds, stream, l2n, pfo);
    else
        FA_SSFX(fa_qk_rows_r)(q, ldq, FA_QKR_MAX >= 8 ? 8 : 2, rows, D, k, ksr, n, s, lds, stream, l2n, pfo);
}

/* ... l2n (narrow keys' hints into L2: fa_qk_rows_r) a constant of each branch */
static inline void FA_SSFX(fa_qk_rows_pad)(const FA_T *q, int64_t ldq, int rows, int64_t D, const FA_S *k,
                                          int64_t ksr, int64_t n, FA_T *s, int64_t lds, int stream, int l2n,
                                          int64_t pfo)
{
    if (FA_SSFX(fa_pf_l2_few_s)() && l2n)
        FA_SSFX(fa_qk_rows_pad_l)(q, ldq, rows, D, k, ksr, n, s, lds, stream, 1, pfo);
    else
        FA_SSFX(fa_qk_rows_pad_l)(q, ldq, rows, D, k, ksr, n, s, lds, stream, 0, pfo);
}

/* S[i][j] = qp[i] . k[j] for i < nr, j < n; key rows contiguous, ksr apart.
 * Blocks of up to FA_QKR_MAX rows, each in one pass over the keys per group of
 * keys (fa_qk_pass) with its row count rounded up to a power of two (5-6 rows
 * as 4 + 1 or 4 + 2): qp must hold zeros (or any finite numbers) up to nr
 * rounded up to FA_QKR_MAX rows.  Replaces one dot product and horizontal sum
 * per row and key (the horizontal sums' latency chains made it 4-6x slower
 * than the FMAs allow): 1.1-1.4x faster on 2-14 rows, paired, keys from memory
 * or from cache. */
static inline void FA_SSFX(fa_qk_rows)(const FA_T *qp, int64_t ldq, int64_t nr, int64_t D,
                                      const FA_S *k, int64_t ksr, int64_t n, FA_T *s, int64_t lds, int64_t pfo)
{
    const int64_t pf = pfo != FA_PF_AUTO ? pfo : FA_SSFX(fa_pf_rows_s)(D);
    if (nr == 1) {
        /* a unit of a single row: key by key, one sequential stream (the decode
         * cases, bound by memory: 5-7 % faster than fa_qk_pass's group order).
         * Only for a unit of one row: a row's scores are otherwise the same for
         * any number of rows in the unit */
        /* the hint level a constant of each loop (fa_pf_l2) */
#define FA_QK_ROW1_LOOP(L2)                                                  \
        for (int64_t j = 0; j < n; j++) {                                    \
            FA_SSFX(fa_prefetch_row1_s)(k + (j + pf) * ksr, D, L2);          \
            s[j] = FA_SSFX(fa_dot)(qp, k + j * ksr, D);                      \
        }
        if (fa_pf_l2)
            FA_QK_ROW1_LOOP(1)
        else
            FA_QK_ROW1_LOOP(0)
#undef FA_QK_ROW1_LOOP
        return;
    }
    /* float16, bfloat16 and int8 keys (fa_pf_l2_few_s): hints into L2 where
     * fa_pf_l2 (AMD) */
    const int l2n = fa_pf_l2;
    for (int64_t i0 = 0; i0 < nr; i0 += FA_QKR_MAX) {
        const int rows = nr - i0 < FA_QKR_MAX ? (int)(nr - i0) : FA_QKR_MAX;
        const FA_T *q = qp + i0 * ldq;
        FA_T *si = s + i0 * lds;
        const int stream = i0 == 0;
        if (FA_QKR_MAX == 8 && (rows == 5 || rows == 6)) {
            /* a block of 4 and one of 1 or 2 (paired, 1.05-1.08x faster than one
             * block of 8 with 2-3 padding rows; splitting 3 rows as 2 + 1
             * measured 0.93x, 7 rows as 4 + 2 + 1 1.0x) */
            FA_SSFX(fa_qk_rows_pad)(q, ldq, 4, D, k, ksr, n, si, lds, stream, l2n, pfo);
            FA_SSFX(fa_qk_rows_pad)(q + 4 * ldq, ldq, rows - 4, D, k, ksr, n, si + 4 * lds, lds, 0, l2n, pfo);
        } else {
            FA_SSFX(fa_qk_rows_pad)(q, ldq, rows, D, k, ksr, n, si, lds, stream, l2n, pfo);
        }
    }
}

/* a[u] += w * vr[u * W : (u + 1) * W] for u < NB (a constant after inlining),
 * four vectors of vr at a time where NB allows (one wide load on some targets) */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_pv1_axpy)(FA_V *a, FA_V w, const FA_S *vr, const int NB)
{
    if (NB % 4 == 0) {
        FA_UNROLL for (int u = 0; u < NB; u += 4) {
            FA_V x[4];
            FA_SSFX(fa_load4_raw_s)(vr + u * FA_W, x);
            FA_UNROLL for (int i = 0; i < 4; i++) a[u + i] += w * x[i];
        }
    } else {
        FA_UNROLL for (int u = 0; u < NB; u++) a[u] += w * FA_SSFX(fa_load_raw_s)(vr + u * FA_W);
    }
}

/* One pass (its keys summed from zero, then added to O: two-level sums) over the keys [k0, k1) for NB (8, 4 or 1, a constant after
 * inlining) vectors of one output row: O[0:NB*W] += sum_k P[k] * V[k][0:NB*W],
 * V rows ldv apart, read in place, accumulated key by key.  With nk > 0 the
 * same loop also computes the single-row scores of the NEXT key tile,
 * sn[j] = fa_dot(qp, kn[j]) for j < nk (fa_qk_rows' one-row order): a decode
 * unit otherwise reads a tile's keys, then its values, one stream at a time,
 * and two streams in flight keep more of a core's memory requests outstanding.
 * The values and the scores are the same bits either way. */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_pv1_qk_pass)(const FA_T *p, const FA_S *vv, int64_t ldv, int64_t k0, int64_t k1, FA_T *o,
                       const int NB, int prefetch, const FA_T *qp, int64_t D, const FA_S *kn, int64_t ksr,
                       int64_t nk, FA_T *sn, const int l2, int64_t pfo, int64_t pfok)
{
    const int64_t pfv = pfo != FA_PF_AUTO ? pfo : FA_SSFX(fa_pf_rows_s)(NB * FA_W);
    const int64_t pfk = pfok != FA_PF_AUTO ? pfok : FA_SSFX(fa_pf_rows_s)(D);
    const int64_t nv = k1 > k0 ? k1 - k0 : 0, both = nk < nv ? nk : nv;
    FA_V a[FA_ROW_NB];
    FA_UNROLL for (int u = 0; u < NB; u++) a[u] = FA_SFX(fa_set1)(0);
    int64_t i = 0;
    for (; i < both; i++) {
        const FA_V w = FA_SFX(fa_set1)(p[k0 + i]);
        const FA_S *vr = vv + (k0 + i) * ldv;
        if (prefetch) FA_SSFX(fa_prefetch_row1_s)(vr + pfv * ldv, NB * FA_W, l2);
        FA_SSFX(fa_prefetch_row1_s)(kn + (i + pfk) * ksr, D, l2);
        FA_SSFX(fa_pv1_axpy)(a, w, vr, NB);
        sn[i] = FA_SSFX(fa_dot)(qp, kn + i * ksr, D);
    }
    for (; i < nv; i++) {
        const FA_V w = FA_SFX(fa_set1)(p[k0 + i]);
        const FA_S *vr = vv + (k0 + i) * ldv;
        if (prefetch) FA_SSFX(fa_prefetch_row1_s)(vr + pfv * ldv, NB * FA_W, l2);
        FA_SSFX(fa_pv1_axpy)(a, w, vr, NB);
    }
    for (; i < nk; i++) {
        FA_SSFX(fa_prefetch_row1_s)(kn + (i + pfk) * ksr, D, l2);
        sn[i] = FA_SSFX(fa_dot)(qp, kn + i * ksr, D);
    }
    FA_UNROLL for (int u = 0; u < NB; u++)
        FA_SFX(fa_store)(o + u * FA_W, FA_SFX(fa_load)(o + u * FA_W) + FA_SSFX(fa_raw_scale_s)(a[u]));
}

/* O[0][0:nvec*W] += sum_{k in [k0,k1)} P[0][k] * V[k][0:nvec*W] for one row (V
 * rows ldv apart, read in place), in blocks of FA_ROW_NB vectors (the target's
 * choice: 8 on x86, a 128-float or 64-double row in one pass over the keys on
 * AVX-512; 16 on NEON), then 8, then 4, then 1; prefetch: the passes of 4 or
 * more vectors request the value rows ahead.  nk > 0: the first pass also
 * computes the next tile's nk one-row scores (fa_pv1_qk_pass). */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_pv_qk_row1_l)(const FA_T *p, const FA_S *vv, int64_t ldv, int64_t k0, int64_t k1, FA_T *o, int64_t nvec,
                        int prefetch, const FA_T *qp, int64_t D, const FA_S *kn, int64_t ksr, int64_t nk, FA_T *sn,
                        const int l2, int64_t pfo, int64_t pfok)
{
    int64_t c = 0;
#if FA_ROW_NB > 8
    for (; c + FA_ROW_NB <= nvec; c += FA_ROW_NB, nk = 0)
        FA_SSFX(fa_pv1_qk_pass)(p, vv + c * FA_W, ldv, k0, k1, o + c * FA_W, FA_ROW_NB, prefetch, qp, D, kn, ksr,
                                nk, sn, l2, pfo, pfok);
#endif
    for (; c + 8 <= nvec; c += 8, nk = 0)
        FA_SSFX(fa_pv1_qk_pass)(p, vv + c * FA_W, ldv, k0, k1, o + c * FA_W, 8, prefetch, qp, D, kn, ksr, nk, sn, l2,
                                pfo, pfok);
    for (; c + 4 <= nvec; c += 4, nk = 0)
        FA_SSFX(fa_pv1_qk_pass)(p, vv + c * FA_W, ldv, k0, k1, o + c * FA_W, 4, prefetch, qp, D, kn, ksr, nk, sn, l2,
                                pfo, pfok);
    for (; c < nvec; c++, nk = 0)
        FA_SSFX(fa_pv1_qk_pass)(p, vv + c * FA_W, ldv, k0, k1, o + c * FA_W, 1, 0, qp, D, kn, ksr, nk, sn, l2, pfo,
                                pfok);
    if (nk)     /* no value columns at all: the scores alone */
        FA_SSFX(fa_pv1_qk_pass)(p, vv, ldv, 0, 0, o, 0, 0, qp, D, kn, ksr, nk, sn, l2, FA_PF_AUTO, pfok);
}

/* ... with the hint level (fa_pf_l2) a constant of each instantiation; pfov /
 * pfok: the value / key rows' prefetch offsets in rows (FA_PF_AUTO: the kernel's
 * distance; the paged lockstep passes next_run_rows) */
static inline void FA_SSFX(fa_pv_qk_row1)(const FA_T *p, const FA_S *vv, int64_t ldv, int64_t k0, int64_t k1,
                                         FA_T *o, int64_t nvec, int prefetch, const FA_T *qp, int64_t D,
                                         const FA_S *kn, int64_t ksr, int64_t nk, FA_T *sn, int64_t pfov,
                                         int64_t pfok)
{
    if (fa_pf_l2)
        FA_SSFX(fa_pv_qk_row1_l)(p, vv, ldv, k0, k1, o, nvec, prefetch, qp, D, kn, ksr, nk, sn, 1, pfov, pfok);
    else
        FA_SSFX(fa_pv_qk_row1_l)(p, vv, ldv, k0, k1, o, nvec, prefetch, qp, D, kn, ksr, nk, sn, 0, pfov, pfok);
}

/* fa_pv_qk_row1 without the next tile's scores; pfo: the value rows' prefetch offset
 * (FA_PF_AUTO: FA_PF_BYTES ahead) */
static inline void FA_SSFX(fa_pv_row1)(const FA_T *p, const FA_S *vv, int64_t ldv, int64_t k0, int64_t k1,
                                      FA_T *o, int64_t nvec, int prefetch, int64_t pfo)
{
    if (fa_pf_l2)
        FA_SSFX(fa_pv_qk_row1_l)(p, vv, ldv, k0, k1, o, nvec, prefetch, NULL, 0, NULL, 0, 0, NULL, 1, pfo, FA_PF_AUTO);
    else
        FA_SSFX(fa_pv_qk_row1_l)(p, vv, ldv, k0, k1, o, nvec, prefetch, NULL, 0, NULL, 0, 0, NULL, 0, pfo, FA_PF_AUTO);
}

/* O[i][0:nvec*W] += sum_{k in [k0,k1)} P[i][k] * V[k][0:nvec*W] for i < nr, V rows
 * ldv apart, read in place.  Blocks of up to FA_PV_MR rows through the PV
 * micro-kernel, so each value vector is loaded once per block of rows, not once
 * per row (its accumulation order per element is the packed path's); a last
 * single row through fa_pv_row1.  The first pass over the keys streams the
 * values from memory and requests whole rows ahead (pfo rows on where not
 * FA_PF_AUTO). */
static inline __attribute__((always_inline)) void
FA_SSFX(fa_pv_rows_l)(const FA_T *p, int64_t ldp, int64_t nr, const FA_S *vv, int64_t ldv, int64_t k0, int64_t k1,
                     FA_T *o, int64_t ldo, int64_t nvec, const int l2n, int64_t pfo)
{
    /* the first block of rows streams the value rows and requests them ahead:
     * into L1 where the storage type's rows are hinted, else (float32 / float64
     * on AMD) into L2, FA_PF_L2_BYTES ahead; the rows of fa_pf_l2_few_s into
     * L2 where l2n (a constant: fa_pf_l2) */
    const int l2 = FA_SSFX(fa_pf_hinted_po_s)(pfo) ? l2n : 1;
    const int64_t pf = pfo != FA_PF_AUTO ? pfo
                     : l2 ? FA_SSFX(fa_pf_l2_rows_s)(nvec * FA_W) : FA_SSFX(fa_pf_rows_s)(nvec * FA_W);
    int64_t i0 = 0;
    while (nr - i0 >= 2) {
        const int mr = nr - i0 < FA_PV_MR ? (int)(nr - i0) : FA_PV_MR;
        const FA_T *pi = p + i0 * ldp;
        FA_T *oi = o + i0 * ldo;
        int64_t pfn = i0 == 0 ? nvec * FA_W : 0;
#if FA_PV_MR < 4 && !defined(FA_S_NATIVE)
        if (nr - i0 == 4) {
            /* four rows left (a GQA group of 4) on a 3-row target, values widened from a
             * narrower storage type: one block of 4 rows x 2 vectors, each value vector
             * widened once for the four (3 + 1 widened it twice); per element the same
             * two-level sums, so the same bits.  Native values keep 3 + 1: their loads
             * are free, and 4 x 2 makes twice the passes over the keys (float32 GQA
             * decode 6.0-6.2 -> 6.7-7.1 ms on one Zen 3 thread); 4 x 3 was 1.04x
             * faster with the keys in L3 but ~5 % slower from memory on one thread
             * and ~10 % on two (docs/performance.rst) */
            int64_t c = 0;
            for (; c + 2 <= nvec; c += 2, pfn = 0)
                FA_SSFX(fa_pv_micro)(pi, ldp, vv + c * FA_W, ldv, k0, k1, oi + c * FA_W, ldo, 4, 2, pf, pfn, l2);
            if (c < nvec)
                FA_SSFX(fa_pv_micro)(pi, ldp, vv + c * FA_W, ldv, k0, k1, oi + c * FA_W, ldo, 4, 1, pf, pfn, l2);
            i0 += 4;
            continue;
        }
#endif
#define FA_PV_ROWS_CASE(MR) \
        case MR: FA_SSFX(fa_pv_cols)(pi, ldp, vv, ldv, k0, k1, oi, ldo, nvec, MR, pf, pfn, l2); break;
        switch (mr) {
        FA_PV_ROWS_CASE(2)
#if FA_PV_MR >= 3
        FA_PV_ROWS_CASE(3)
#endif
#if FA_PV_MR >= 4
        FA_PV_ROWS_CASE(4)
#endif
#if FA_PV_MR >= 5
        FA_PV_ROWS_CASE(5)
#endif
#if FA_PV_MR >= 6
        FA_PV_ROWS_CASE(6)
#endif
        default: break;
        }
#undef FA_PV_ROWS_CASE
        i0 += mr;
    }
    for (; i0 < nr; i0++)
        FA_SSFX(fa_pv_row1)(p + i0 * ldp, vv, ldv, k0, k1, o + i0 * ldo, nvec, i0 == 0, pfo);
}

static inline void FA_SSFX(fa_pv_rows)(const FA_T *p, int64_t ldp, int64_t nr, const FA_S *vv, int64_t ldv,
                                      int64_t k0, int64_t k1, FA_T *o, int64_t ldo, int64_t nvec, int64_t pfo)
{
    if (FA_SSFX(fa_pf_l2_few_s)() && fa_pf_l2)
        FA_SSFX(fa_pv_rows_l)(p, ldp, nr, vv, ldv, k0, k1, o, ldo, nvec, 1, pfo);
    else
        FA_SSFX(fa_pv_rows_l)(p, ldp, nr, vv, ldv, k0, k1, o, ldo, nvec, 0, pfo);
}

/* St[j][i] += B_i[j] for lanes i < ni and keys j in [j0, j1) of the
 * query-vectorised path, B_i = brows[i] the lane's bias row (elements
 * contiguous, indexed by tile key, of the storage type).  W x W blocks go through registers (W row
 * loads, a transpose, W vector adds) instead of W*W strided scalar updates;
 * the same single add per element, so the same bits. */
static inline void FA_SSFX(fa_qvec_bias)(FA_T *st, int64_t lds, int64_t j0, int64_t j1,
                                         const FA_S *const *brows, int64_t ni)
{
    int64_t i0 = 0;
    for (; i0 + FA_W <= ni; i0 += FA_W) {
        int64_t j = j0;
        for (; j + FA_W <= j1; j += FA_W) {
            FA_V r[FA_W];
            FA_UNROLL for (int i = 0; i < FA_W; i++) r[i] = FA_SSFX(fa_load_s)(brows[i0 + i] + j);
            FA_SFX(fa_transpose)(r);
            FA_UNROLL for (int k = 0; k < FA_W; k++) {
                FA_T *p = st + (j + k) * lds + i0;
                FA_SFX(fa_store)(p, FA_SFX(fa_load)(p) + r[k]);
            }
        }
        for (; j < j1; j++)
            for (int64_t i = i0; i < i0 + FA_W; i++) st[j * lds + i] += FA_SSFX(fa_scalar_s)(brows[i][j]);
    }
    for (int64_t i = i0; i < ni; i++)
        for (int64_t j = j0; j < j1; j++) st[j * lds + i] += FA_SSFX(fa_scalar_s)(brows[i][j]);
}

/* y[j] = x[j] * a, x stored (the query pack of a non-native storage type) */
static inline void FA_SSFX(fa_widen_scale_row)(const FA_S *x, FA_T *y, int64_t n, FA_T a)
{
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W) FA_SFX(fa_store)(y + j, FA_SSFX(fa_load_s)(x + j) * a);
    for (; j < n; j++) y[j] = FA_SSFX(fa_scalar_s)(x[j]) * a;
}

/* x[j] += b[j], b stored (a bias row of a non-native storage type) */
static inline void FA_SSFX(fa_add_row)(FA_T *x, const FA_S *b, int64_t n)
{
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W) FA_SFX(fa_store)(x + j, FA_SFX(fa_load)(x + j) + FA_SSFX(fa_load_s)(b + j));
    for (; j < n; j++) x[j] += FA_SSFX(fa_scalar_s)(b[j]);
}

/* ---------------- stores of outputs (the native and half-precision types) */
#if !FA_S_I8 && !FA_S_F8E4 && !FA_S_F8E5
/* Output rows of the query-vectorised path: o[i * sor + c] = Ot[c][i] * inv[i]
 * for i < nr, c < Dv (output elements contiguous), stored as FA_S (a half
 * output rounded once, here).  Whole W x W blocks go
 * through registers (W contiguous loads, a transpose, W contiguous stores)
 * instead of W*W strided scalar reads. */
static inline void FA_SSFX(fa_qvec_store_rows)(const FA_T *ot, int64_t ldo, int64_t nr, int64_t Dv,
                                              const FA_T *inv, FA_S *o, int64_t sor)
{
    int64_t i0 = 0;
    for (; i0 + FA_W <= nr; i0 += FA_W) {
        int64_t c0 = 0;
        for (; c0 + FA_W <= Dv; c0 += FA_W) {
            FA_V r[FA_W];
            FA_UNROLL for (int k = 0; k < FA_W; k++) r[k] = FA_SFX(fa_load)(ot + (c0 + k) * ldo + i0);
            FA_SFX(fa_transpose)(r);
            FA_UNROLL for (int i = 0; i < FA_W; i++)
                FA_SSFX(fa_store_s)(o + (i0 + i) * sor + c0, r[i] * inv[i0 + i]);
        }
        for (int64_t i = i0; i < i0 + FA_W; i++)
            for (int64_t c = c0; c < Dv; c++) o[i * sor + c] = FA_SSFX(fa_narrow_s)(ot[c * ldo + i] * inv[i]);
    }
    for (int64_t i = i0; i < nr; i++)
        for (int64_t c = 0; c < Dv; c++) o[i * sor + c] = FA_SSFX(fa_narrow_s)(ot[c * ldo + i] * inv[i]);
}

/* y[j] = x[j] * a stored as FA_S: an output row (for the native type the same
 * operations as fa_row_scale) */
static inline void FA_SSFX(fa_store_scaled_row)(const FA_T *x, FA_S *y, int64_t n, FA_T a)
{
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W) FA_SSFX(fa_store_s)(y + j, FA_SFX(fa_load)(x + j) * a);
    for (; j < n; j++) y[j] = FA_SSFX(fa_narrow_s)(x[j] * a);
}
#endif
