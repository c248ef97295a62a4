/* The 4-bit readers of a QuantizedKV in nibble lanes (quant_reads.h's few-rows
 * scores and P.V for the (D, G) that fa_u4l_groups serves, little-endian targets):
 * included by quant_reads.h inside its float-compute part.  Part of the per-type
 * body (simd_body.h).  Not a standalone header. */
/* ---- 4-bit codes in nibble lanes (little-endian targets) ----
 * 4 W bytes (8 W codes) read as W 32-bit lanes: nibble k of lane l (bits 4k..4k+3)
 * is element 8 l + k of the chunk (byte 4 l + k / 2, the low nibble for even k).
 * fa_u4_nib gives those W codes as floats by a shift and the target's fa_low4 (a
 * mask and a conversion, or on AVX-512 one permutation of a table):
 * no nibble interleave, no byte-to-lane widening (fa_load_u4's five to six
 * instructions per W codes become three).  The readers below take the rows in
 * that order: the few query rows' elements are permuted into the same lanes once
 * per call, and the P.V accumulators are permuted back once per block of keys.
 * A chunk lies in NG groups (1: inside one group; 2 or 4: lane l in group
 * l * NG / W), whose scales and zero points are broadcast into the lanes by
 * fa_lane_groups.  fa_u4l_groups says which (D, G) this layout serves. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#  define FA_U4L_DMAX 1024      /* the permuted query rows live on the stack */
/* sums a pass of fa_qk_pass_u4l keeps in registers (rows x keys, t and e each):
 * 8 where the target has 32 vector registers, 4 where it has 16.  (16, with e
 * kept in memory, measured slower: GQA u4 Hq32 Hkv8 1.13 -> 1.07x the one-key
 * pass, two rows a group 1.23 -> 1.09x) */
#  if FA_VBYTES == 64 || defined(__aarch64__)
#    define FA_U4L_ACC 8
#  else
#    define FA_U4L_ACC 4
#  endif

static inline __attribute__((always_inline)) FA_V FA_SFX(fa_u4_nib)(fa_u32_wf x, const int k)
{
    return fa_low4(x >> (4 * k));
}

/* NG (1, 2 or 4) for 4-bit codes of D elements in groups of G, 0 when the layout
 * does not apply (D not a multiple of 8 W, a chunk not in whole groups, or a
 * group not in whole lanes) */
static inline int FA_SFX(fa_u4l_groups)(int64_t D, int64_t G)
{
    const int64_t C = 8 * FA_W;
    if (D % C != 0 || D > FA_U4L_DMAX) return 0;
    if (G % C == 0) return 1;
    if (C % G == 0 && G % 8 == 0 && (C / G == 2 || C / G == 4)) return (int)(C / G);
    return 0;
}

/* lane l: src[(l * NG / W) * sc]: NG broadcasts and NG - 1 blends by constant masks,
 * or on AVX-512 where the entries are side by side (sc = 1, the scales and zero
 * points of a row's groups) one masked load and one permutation (4-bit G 32 on a
 * Zen 4, 2 threads: GQA decode Hq32 Hkv8 1.35-1.41 -> 1.26 ms, MHA decode H32
 * 2.81-3.04 -> 2.59-2.60 ms; the same values, so the same bits).  Not on AVX2:
 * there a chunk holds two groups (a broadcast and a blend), and the masked load
 * and permutation measured level to 2 % slower (GQA u4, one thread 3.24-3.34 ->
 * 3.32-3.37 ms) */
static inline __attribute__((always_inline)) FA_V FA_SFX(fa_lane_groups)(const float *src, int64_t sc, const int NG)
{
#if FA_VBYTES == 64
    if (sc == 1 && NG > 1) {
        /* the NG entries side by side: one masked load and one permutation */
        const FA_V g = FA_SFX(fa_load_part)(src, NG, 0);
        return NG == 4 ? FA_SHUF2(FA_VI, g, g, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                       : FA_SHUF2(FA_VI, g, g, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    }
#endif
    FA_VI lane;
    FA_UNROLL for (int l = 0; l < FA_W; l++) lane[l] = l;
    FA_V v = FA_SFX(fa_set1)(src[0]);
    FA_UNROLL for (int i = 1; i < NG; i++)
        v = FA_SFX(fa_select)(lane >= (FA_VI){0} + i * FA_W / NG, FA_SFX(fa_set1)(src[i * sc]), v);
    return v;
}

/* R rows (1, 2 or 4) against U = W / R keys (nk of them) in one pass.  Q: the rows'
 * elements in nibble-lane order (row i at Q + i * D: chunk d's vector k at
 * d + k W, lane l = q[d + 8 l + k]); QS: per chunk, each lane's sum of its 8
 * elements (row i at QS + i * D / 8).  Per key and chunk: t = sum_k Q_k C_k,
 * then e += SV (t - ZV QS): the score is the sum over groups of
 * scale_g (q_g . codes_g - zero_g sum(q_g)); one group per row (one): e += Q_k C_k
 * and the zero point and scale applied per score, as in fa_qk_pass_qz.  KB keys
 * at a time (their rows' accumulators in registers, parked in rb when done), then
 * the lanes summed by the transpose-and-add tree: every row count and key
 * position sums a score in this one order. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_pass_u4l)(const float *Q, const float *QS, const int R, int nrow, int64_t D, const uint8_t *x,
                       int64_t xsr, const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr,
                       int64_t zsc, const int64_t (*go)[2], const int NG, int nk, float *s, int64_t lds, int64_t pf,
                       const int one, const float *ql, const int l2)
{
    const int U = FA_W / R;
    float rb[FA_W * FA_W] __attribute__((aligned(64)));
    if (pf)
        for (int u = 0; u < nk; u++) {
            FA_SFX(fa_qz_prefetch_key)(x + (u + pf) * xsr, D / 2, scale + (u + pf) * ssr, zero + (u + pf) * zsr, l2);
        }
    /* KB keys at a time: each row's vector of Q loaded once for the KB keys, and
     * R * KB independent sums in flight (one key at a time, R = 4: a load per FMA
     * and four chains of eight dependent FMAs per key) */
    const int KB = FA_U4L_ACC / R < U ? FA_U4L_ACC / R : U;
#pragma GCC unroll 1
    for (int u0 = 0; u0 < U; u0 += KB) {
        FA_V e[4][FA_U4L_ACC];
        FA_UNROLL for (int i = 0; i < R; i++)
            FA_UNROLL for (int b = 0; b < KB; b++) e[i][b] = FA_SFX(fa_set1)(0);
        if (u0 < nk)
            for (int64_t d = 0; d < D; d += 8 * FA_W) {
                /* the keys past nk read as zero codes; their sums are not stored */
                fa_u32_wf xv[FA_U4L_ACC];
                FA_UNROLL for (int b = 0; b < KB; b++) {
                    if (u0 + b < nk)
                        memcpy(&xv[b], x + (u0 + b) * xsr + d / 2, sizeof xv[b]);
                    else
                        xv[b] = (fa_u32_wf){0};
                }
                /* t from zero, every product an FMA into it: from the first product,
                 * GCC fused either product of the first two (its choice varied
                 * with R, and a row's bits with its group's size) */
                FA_V t[4][FA_U4L_ACC];
                FA_UNROLL for (int i = 0; i < R; i++)
                    FA_UNROLL for (int b = 0; b < KB; b++) t[i][b] = FA_SFX(fa_set1)(0);
                FA_UNROLL for (int k = 0; k < 8; k++) {
                    FA_V c[FA_U4L_ACC];
                    FA_UNROLL for (int b = 0; b < KB; b++) c[b] = FA_SFX(fa_u4_nib)(xv[b], k);
                    FA_UNROLL for (int i = 0; i < R; i++) {
                        const FA_V qv = FA_SFX(fa_load)(Q + i * D + d + k * FA_W);
                        FA_UNROLL for (int b = 0; b < KB; b++) {
                            if (one)
                                e[i][b] += qv * c[b];
                            else
                                t[i][b] += qv * c[b];
                        }
                    }
                }
                if (!one) {
                    const int64_t *g = go[d / (8 * FA_W)];
                    FA_UNROLL for (int b = 0; b < KB; b++)
                        if (u0 + b < nk) {
                            const FA_V sv = FA_SFX(fa_lane_groups)(scale + (u0 + b) * ssr + g[0], ssc, NG);
                            const FA_V zv = FA_SFX(fa_lane_groups)(zero + (u0 + b) * zsr + g[1], zsc, NG);
                            FA_UNROLL for (int i = 0; i < R; i++)
                                e[i][b] += sv * (t[i][b] - zv * FA_SFX(fa_load)(QS + i * (D / 8) + d / 8));
                        }
                }
            }
        FA_UNROLL for (int i = 0; i < R; i++)
            FA_UNROLL for (int b = 0; b < KB; b++) FA_SFX(fa_store)(rb + (i * U + u0 + b) * FA_W, e[i][b]);
    }
    FA_V r[FA_W];
    FA_UNROLL for (int a = 0; a < FA_W; a++) r[a] = FA_SFX(fa_load)(rb + a * FA_W);
    FA_SFX(fa_transpose_add)(r);
    FA_SFX(fa_qz_store_scores)(r[0], R, nrow, nk, scale, ssr, zero, zsr, one, ql, s, lds);
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_rows_u4l_r)(const float *Q, const float *QS, const int R, int nrow, int64_t D, const uint8_t *x,
                         int64_t xsr, const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr,
                         int64_t zsc, const int64_t (*go)[2], const int NG, int64_t n, float *s, int64_t lds, const int one,
                         const float *qs, const int l2)
{
    const int U = FA_W / R;
    const int64_t pfr = fa_pf_rows_bytes(D / 2), pf = pfr > U ? pfr : U;
    float ql[FA_W] __attribute__((aligned(64)));
    FA_SFX(fa_qz_sum_lanes)(qs, R, ql);
    int64_t j = 0;
    for (; j + U <= n; j += U)
        FA_SFX(fa_qk_pass_u4l)(Q, QS, R, nrow, D, x + j * xsr, xsr, scale + j * ssr, ssr, ssc, zero + j * zsr, zsr,
                               zsc, go, NG, U, s + j, lds, pf, one, ql, l2);
    if (j < n)
        FA_SFX(fa_qk_pass_u4l)(Q, QS, R, nrow, D, x + j * xsr, xsr, scale + j * ssr, ssr, ssc, zero + j * zsr, zsr,
                               zsc, go, NG, (int)(n - j), s + j, lds, 0, one, ql, l2);
}

/* nr rows of qp (ldq apart, pre-scaled) in blocks of up to 4, as fa_qk_rows_qz_bits:
 * each block's rows permuted into nibble-lane order first */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_rows_u4l_ng)(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint8_t *x, int64_t xsr,
                          const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr, int64_t zsc,
                          int64_t G, int64_t n, float *s, int64_t lds, const int NG, const int one, const int l2)
{
    float Q[4 * FA_U4L_DMAX], QS[4 * FA_U4L_DMAX / 8];
    int64_t go[FA_U4L_DMAX / 32][2];    /* each chunk's first group: scale, zero offsets */
    for (int64_t d = 0; d < D; d += 8 * FA_W) {
        go[d / (8 * FA_W)][0] = d / G * ssc;
        go[d / (8 * FA_W)][1] = d / G * zsc;
    }
    for (int64_t i0 = 0; i0 < nr; i0 += 4) {
        const int rows = nr - i0 < 4 ? (int)(nr - i0) : 4;
        const int Rb = rows == 1 ? 1 : rows == 2 || FA_W < 4 ? 2 : 4;
        const float *q = qp + i0 * ldq;
        float *si = s + i0 * lds;
        float qs[4] = {0, 0, 0, 0};
        for (int i = 0; i < Rb; i++) {
            const float *qr = q + i * ldq;
            if (i >= rows) {    /* a block of 3 rows computed as 4 */
                memset(Q + i * D, 0, D * sizeof(float));
                memset(QS + i * (D / 8), 0, D / 8 * sizeof(float));
                continue;
            }
            for (int64_t d = 0; d < D; d += 8 * FA_W)
                for (int l = 0; l < FA_W; l++)
                    for (int k = 0; k < 8; k++) Q[i * D + d + k * FA_W + l] = qr[d + 8 * l + k];
            if (one) {
                FA_V a = FA_SFX(fa_set1)(0);
                for (int64_t d = 0; d < D; d += FA_W) a += FA_SFX(fa_load)(qr + d);
                qs[i] = FA_SFX(fa_hsum)(a);
            } else
                for (int64_t d = 0; d < D; d += 8 * FA_W) {
                    FA_V a = FA_SFX(fa_load)(Q + i * D + d);
                    for (int k = 1; k < 8; k++) a += FA_SFX(fa_load)(Q + i * D + d + k * FA_W);
                    FA_SFX(fa_store)(QS + i * (D / 8) + d / 8, a);
                }
        }
#define FA_U4L_R(R, NROW, OFF)                                                                                  \
        FA_SFX(fa_qk_rows_u4l_r)(Q + (OFF) * D, QS + (OFF) * (D / 8), R, NROW, D, x, xsr, scale, ssr, ssc, zero, \
                                 zsr, zsc, go, NG, n, si + (OFF) * lds, lds, one, qs + (OFF), l2)
        if (Rb == 1)
            FA_U4L_R(1, 1, 0);
        else if (Rb == 2)
            for (int a = 0; a < rows; a += 2) FA_U4L_R(2, rows - a < 2 ? rows - a : 2, a);
        else
            FA_U4L_R(4, rows, 0);
#undef FA_U4L_R
    }
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_rows_u4l)(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint8_t *x,
                                   int64_t xsr, const float *scale, int64_t ssr, int64_t ssc, const float *zero,
                                   int64_t zsr, int64_t zsc, int64_t G, int64_t n, float *s, int64_t lds, int NG,
                       const int l2)
{
    /* one group per row (G == D) only with NG == 1 */
    if (G == D)
        FA_SFX(fa_qk_rows_u4l_ng)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 1, 1, l2);
    else if (NG == 1)
        FA_SFX(fa_qk_rows_u4l_ng)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 1, 0, l2);
    else if (NG == 2)
        FA_SFX(fa_qk_rows_u4l_ng)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 2, 0, l2);
    else
        FA_SFX(fa_qk_rows_u4l_ng)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 4, 0, l2);
}

/* O += P . V, 4-bit codes in nibble lanes: R rows, the chunk at column d, its
 * nibbles k in [kb, kb + NK) held in R x NK accumulators while keys [k0, k1)
 * stream by once (accumulator k, lane l: column d + 8 l + k, gathered from o and
 * scattered back around the pass).  Per key: the W lanes of 4 W bytes, the
 * lanes' scale and zero point (fa_lane_groups), weights p * scale; per nibble
 * (codes - zero) * weight added -- per element the operations of fa_pv_cols_qz,
 * in the same key order, so the same bits. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_cols_u4l)(const float *p, int64_t ldp, const uint8_t *x, int64_t xsr, const float *scale, int64_t ssr,
                       int64_t ssc, const float *zero, int64_t zsr, int64_t zsc, int64_t G, int64_t k0, int64_t k1,
                       float *o, int64_t ldo, int64_t d, int kb, const int R, const int NK, const int NG,
                       int64_t pf, int64_t rb, const int l2)
{
    FA_V acc[4][8];
    const int64_t gs = d / G * ssc, gz = d / G * zsc;
    FA_UNROLL for (int r = 0; r < R; r++)
        FA_UNROLL for (int k = 0; k < NK; k++) {
            float t[FA_W];
            for (int l = 0; l < FA_W; l++) t[l] = o[r * ldo + d + 8 * l + kb + k];
            acc[r][k] = FA_SFX(fa_load)(t);
        }
    for (int64_t j = k0; j < k1; j++) {
        const uint8_t *xr = x + j * xsr;
        const float *sr = scale + j * ssr, *zr = zero + j * zsr;
        if (pf) FA_SFX(fa_qz_prefetch_key)(xr + pf * xsr, rb, sr + pf * ssr, zr + pf * zsr, l2);
        fa_u32_wf xv;
        memcpy(&xv, xr + d / 2, sizeof xv);
        const FA_V sv = FA_SFX(fa_lane_groups)(sr + gs, ssc, NG);
        const FA_V zv = FA_SFX(fa_lane_groups)(zr + gz, zsc, NG);
        FA_V wv[4];
        FA_UNROLL for (int r = 0; r < R; r++) wv[r] = FA_SFX(fa_set1)(p[r * ldp + j]) * sv;
        FA_UNROLL for (int k = 0; k < NK; k++) {
            const FA_V cz = FA_SFX(fa_u4_nib)(xv, kb + k) - zv;
            FA_UNROLL for (int r = 0; r < R; r++) acc[r][k] += cz * wv[r];
        }
    }
    FA_UNROLL for (int r = 0; r < R; r++)
        FA_UNROLL for (int k = 0; k < NK; k++)
        {
            float t[FA_W];
            FA_SFX(fa_store)(t, acc[r][k]);
            for (int l = 0; l < FA_W; l++) o[r * ldo + d + 8 * l + kb + k] = t[l];
        }
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_rows_u4l_r)(const float *p, int64_t ldp, const uint8_t *x, int64_t xsr, const float *scale,
                         int64_t ssr, int64_t ssc, const float *zero, int64_t zsr, int64_t zsc, int64_t G,
                         int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t D, const int R, const int NG,
                         const int l2)
{
    /* R x NK accumulators: 8 (16 registers) or 16 (32) */
    const int NK = R == 1 ? 8 : R == 2 ? (FA_VBYTES >= 64 ? 8 : 4) : FA_VBYTES >= 64 ? 4 : 2;
    const int64_t rb = D / 2, pfr = fa_pf_rows_bytes(rb);
    for (int64_t d = 0; d < D; d += 8 * FA_W)
        for (int kb = 0; kb < 8; kb += NK)
            FA_SFX(fa_pv_cols_u4l)(p, ldp, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, d, kb, R, NK,
                                   NG, d == 0 && kb == 0 ? pfr : 0, rb, l2);
}
#endif
