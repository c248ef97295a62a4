/* The readers of a QuantizedKV (asymmetric 8-bit or 4-bit codes with a float32
 * scale and zero point per group of G elements of a row; element d of a row is
 * (code - zero[d / G]) * scale[d / G]): the few-rows scores and P.V reading the
 * codes in place (below), and rows dequantized into a tile of the compute type
 * -- the tile-sized scratch the other units read (the row unit's key panels and
 * value tile, the query-vectorised unit's widened tiles) -- never a copy of the
 * cache.
 *
 * fa_dequant_rows, float compute: W codes at a time widened in registers by the target's
 * fa_load_u8 / fa_load_u4 (isa/portable.h), the group's scale and zero point
 * broadcast when a vector lies in one group (G a multiple of W), or gathered
 * lane by lane into a vector otherwise (G < W, or not a multiple of it).
 * Double compute: element by element (a float64 query with a quantized cache).
 * Part of the per-type body (simd_body.h).  Not a standalone header. */

#ifndef FA_DOUBLE
/* 2 W codes of a row from element e (even) into c[0], c[1] */
static inline __attribute__((always_inline)) void FA_SFX(fa_codes2)(const uint8_t *xr, int64_t e, const int bits,
                                                                   FA_V *c)
{
    if (bits == 8) {
        c[0] = fa_load_u8(xr + e);
        c[1] = fa_load_u8(xr + e + FA_W);
    } else {
        fa_load2_u4(xr + e / 2, c);
    }
}
#endif

static inline FA_T FA_SFX(fa_code_at)(const uint8_t *x, int bits, int64_t d)
{
    return (FA_T)(bits == 8 ? x[d] : (x[d >> 1] >> ((d & 1) * 4)) & 15);
}

/* The hints for one key of a QuantizedKV cache: its codes (rb bytes at x), its
 * scale and zero point rows (at scale, zero) -- the scores' and P.V's readers
 * hint the key pf rows ahead of the one they read. */
static inline __attribute__((always_inline)) void FA_SFX(fa_qz_prefetch_key)(const uint8_t *x, int64_t rb,
                                                                            const float *scale, const float *zero,
                                                                            const int l2)
{
    fa_prefetch_bytes_at(x, rb, l2);
    fa_prefetch_at(scale, l2);
    fa_prefetch_at(zero, l2);
}

/* Rows j < n: codes at x + j * xsr (bytes; 4 bits: element d in byte d / 2),
 * scales at scale + j * ssr + g * ssc, zero points at zero + j * zsr + g * zsc
 * (float32, group g = d / G), into dst + j * ld (columns D..ld-1 zero: the
 * kernels run whole vectors).  Returns 1 when a value is inf or NaN (a scale
 * that overflows it: see pv_rows_exact). */
static int FA_SFX(fa_dequant_rows)(const uint8_t *x, int64_t xsr, int bits, const float *scale, int64_t ssr,
                                   int64_t ssc, const float *zero, int64_t zsr, int64_t zsc, int64_t n, int64_t D,
                                   int64_t G, FA_T *dst, int64_t ld)
{
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *xr = x + j * xsr;
        const float *sr = scale + j * ssr, *zr = zero + j * zsr;
        FA_T *y = dst + j * ld;
        int64_t d = 0;
#ifndef FA_DOUBLE
        if (G % FA_W == 0) {
            for (; d + FA_W <= D; d += FA_W) {
                const int64_t g = d / G;
                const FA_V c = bits == 8 ? fa_load_u8(xr + d) : fa_load_u4(xr + d / 2);
                FA_SFX(fa_store)(y + d, (c - FA_SFX(fa_set1)(zr[g * zsc])) * FA_SFX(fa_set1)(sr[g * ssc]));
            }
        } else {
            for (; d + FA_W <= D; d += FA_W) {
                FA_T sv[FA_W], zv[FA_W];
                for (int i = 0; i < FA_W; i++) {
                    const int64_t g = (d + i) / G;
                    sv[i] = sr[g * ssc];
                    zv[i] = zr[g * zsc];
                }
                const FA_V c = bits == 8 ? fa_load_u8(xr + d) : fa_load_u4(xr + d / 2);
                FA_SFX(fa_store)(y + d, (c - FA_SFX(fa_load)(zv)) * FA_SFX(fa_load)(sv));
            }
        }
#endif
        for (; d < D; d++) {
            const int64_t g = d / G;
            y[d] = (FA_SFX(fa_code_at)(xr, bits, d) - (FA_T)zr[g * zsc]) * (FA_T)sr[g * ssc];
        }
        for (d = D; d < ld; d++) y[d] = 0;
    }
    /* the inf / NaN probe: a pass of its own over the tile, which is in cache */
    return FA_SFX(fa_block_nonfinite)(dst, n, D, ld, 1);
}

#ifndef FA_DOUBLE
/* The few-rows readers (decode, draft tokens, GQA groups) of a QuantizedKV read
 * in place, G a multiple of W (every vector inside one group; D too then).
 *
 * Scores: each key vector dequantized in registers, (codes - zero) * scale
 * (the values fa_dequant_rows would store), and multiplied into the rows'
 * accumulators, which are summed by transpose-and-add trees: no dequantized
 * key exists in memory.  Every path sums a score's lanes in the same order
 * (fa_hsum's), so a score does not depend on the rows of its unit or on the
 * key's place in a pass.  One group per row (G = D, the 8-bit default): the
 * passes sum q . codes (no dequantization in the loop) and each score is
 * (q . codes - zero * sum(q)) * scale, one subtraction and one multiplication
 * per key instead of two per element.  Rows of qp (ldq apart, pre-scaled); key j's codes at
 * x + j * xsr, its scales / zero points at scale + j * ssr + g * ssc (zero
 * likewise); s[i * lds + j]. */

/* Key vectors of U keys (u < nk) dequantized: the W elements from d, group g */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qz_dequant_keys)(const uint8_t *x, int64_t xsr, const float *scale, int64_t ssr, const float *zero,
                           int64_t zsr, int64_t gs, int64_t gz, int64_t d, const int U, int nk, const int bits,
                           FA_V *c)
{
    FA_UNROLL for (int u = 0; u < U; u++)
        if (u < nk) {
            const uint8_t *xr = x + u * xsr;
            c[u] = ((bits == 8 ? fa_load_u8(xr + d) : fa_load_u4(xr + d / 2)) - FA_SFX(fa_set1)(zero[u * zsr + gz]))
                   * FA_SFX(fa_set1)(scale[u * ssr + gs]);
        }
}

/* The W scores of a pass (lane i * U + u: row i, key u, U = W / R) stored: the
 * first nrow rows' first nk keys into s (rows lds apart).  one (one group per
 * row): q . (codes - zero) * scale = (q . codes - zero * sum(q)) * scale applied
 * first, in one vector step -- ql: each row's sum of q in the same lane order
 * (applied score by score instead: GQA decode u8, Hq32 Hkv8 Lk8192 D128, one
 * Zen 4 thread 1.98 -> 1.79 ms; the same bits). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qz_store_scores)(FA_V r, const int R, int nrow, int nk, const float *scale, int64_t ssr, const float *zero,
                           int64_t zsr, const int one, const float *ql, float *s, int64_t lds)
{
    const int U = FA_W / R;
    float t[FA_W] __attribute__((aligned(64)));
    if (one) {
        float zz[FA_W] __attribute__((aligned(64))), ss[FA_W] __attribute__((aligned(64)));
        FA_UNROLL for (int u = 0; u < U; u++) {
            zz[u] = u < nk ? zero[u * zsr] : 0;
            ss[u] = u < nk ? scale[u * ssr] : 0;
        }
        FA_UNROLL for (int i = 1; i < R; i++)
            FA_UNROLL for (int u = 0; u < U; u++) {
                zz[i * U + u] = zz[u];
                ss[i * U + u] = ss[u];
            }
        r = (r - FA_SFX(fa_load)(zz) * FA_SFX(fa_load)(ql)) * FA_SFX(fa_load)(ss);
    }
    FA_SFX(fa_store)(t, r);
    if (nk == U)
        FA_UNROLL for (int i = 0; i < R; i++) {
            if (i < nrow) memcpy(s + i * lds, t + i * U, U * sizeof(float));
        }
    else
        for (int i = 0; i < nrow; i++)
            for (int u = 0; u < nk; u++) s[i * lds + u] = t[i * U + u];
}

/* each row's sum of q (qs[i], i < R) in the tree's lane order: ql[i * U + u] */
static inline __attribute__((always_inline)) void FA_SFX(fa_qz_sum_lanes)(const float *qs, const int R, float *ql)
{
    FA_UNROLL for (int a = 0; a < FA_W; a++) ql[a] = qs[a / (FA_W / R)];
}

/* R rows (a power of two, R <= W) against U = W / R keys in one pass: one
 * accumulator per (row, key), each key vector dequantized once for the R rows,
 * one transpose-and-add tree; the first nrow rows' scores of the first nk keys
 * stored.  pf: rows requested that many keys ahead.  one: zero points and
 * scales applied per score (fa_qz_store_scores; ql: the rows' sums of q in lane
 * order). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_pass_qz)(const float *qp, int64_t ldq, const int R, int nrow, int64_t D, const uint8_t *x, int64_t xsr,
                      const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr, int64_t zsc,
                      int64_t G, int nk, float *s, int64_t lds, const int bits, int64_t pf, const int one,
                      const float *ql, const int l2)
{
    const int U = FA_W / R;
    const int64_t rb = D * bits / 8;
    FA_V r[FA_W];
    FA_UNROLL for (int a = 0; a < FA_W; a++) r[a] = FA_SFX(fa_set1)(0);
    if (pf)
        for (int u = 0; u < nk; u++) {
            FA_SFX(fa_qz_prefetch_key)(x + (u + pf) * xsr, rb, scale + (u + pf) * ssr, zero + (u + pf) * zsr, l2);
        }
    int64_t d = 0;
    if (bits == 4)      /* two vectors of 4-bit codes from one split (fa_load2_u4) */
        for (; d + 2 * FA_W <= D; d += 2 * FA_W) {
            const int64_t g0 = d / G, g1 = (d + FA_W) / G;
            const FA_V q0 = FA_SFX(fa_load)(qp + d), q1 = FA_SFX(fa_load)(qp + d + FA_W);
            FA_UNROLL for (int u = 0; u < U; u++)
                if (u < nk) {
                    FA_V c[2];
                    fa_load2_u4(x + u * xsr + d / 2, c);
                    if (!one) {
                        const float *sr = scale + u * ssr, *zr = zero + u * zsr;
                        c[0] = (c[0] - FA_SFX(fa_set1)(zr[g0 * zsc])) * FA_SFX(fa_set1)(sr[g0 * ssc]);
                        c[1] = (c[1] - FA_SFX(fa_set1)(zr[g1 * zsc])) * FA_SFX(fa_set1)(sr[g1 * ssc]);
                    }
                    if (R == 1) {
                        r[u] += q0 * c[0];
                        r[u] += q1 * c[1];
                    } else {
                        FA_UNROLL for (int i = 0; i < R; i++) {
                            r[i * U + u] += FA_SFX(fa_load)(qp + i * ldq + d) * c[0];
                            r[i * U + u] += FA_SFX(fa_load)(qp + i * ldq + d + FA_W) * c[1];
                        }
                    }
                }
        }
    for (; d < D && R == 1; d += FA_W) {
        /* one row: key by key, each key vector used as soon as it is widened (an
         * array of W widened vectors beside the W accumulators spilled to the
         * stack: 1.2x slower) */
        const int64_t g = d / G;
        const FA_V qv = FA_SFX(fa_load)(qp + d);
        FA_UNROLL for (int u = 0; u < U; u++)
            if (u < nk) {
                const uint8_t *xr = x + u * xsr;
                FA_V c = bits == 8 ? fa_load_u8(xr + d) : fa_load_u4(xr + d / 2);
                if (!one)
                    c = (c - FA_SFX(fa_set1)(zero[u * zsr + g * zsc])) * FA_SFX(fa_set1)(scale[u * ssr + g * ssc]);
                r[u] += qv * c;
            }
    }
    for (; d < D; d += FA_W) {
        const int64_t g = d / G;
        FA_V c[FA_W];
        if (one)
            FA_UNROLL for (int u = 0; u < U; u++) {
                if (u < nk) c[u] = bits == 8 ? fa_load_u8(x + u * xsr + d) : fa_load_u4(x + u * xsr + d / 2);
            }
        else
            FA_SFX(fa_qz_dequant_keys)(x, xsr, scale, ssr, zero, zsr, g * ssc, g * zsc, d, U, nk, bits, c);
        FA_UNROLL for (int i = 0; i < R; i++) {
            const FA_V qv = FA_SFX(fa_load)(qp + i * ldq + d);
            FA_UNROLL for (int u = 0; u < U; u++)
                if (u < nk) r[i * U + u] += qv * c[u];
        }
    }
    FA_SFX(fa_transpose_add)(r);
    FA_SFX(fa_qz_store_scores)(r[0], R, nrow, nk, scale, ssr, zero, zsr, one, ql, s, lds);
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_rows_qz_r)(const float *qp, int64_t ldq, const int R, int nrow, int64_t D, const uint8_t *x,
                        int64_t xsr, const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr,
                        int64_t zsc, int64_t G, int64_t n, float *s, int64_t lds, const int bits, const int one,
                        const float *qs, const int l2)
{
    const int U = FA_W / R;
    const int64_t pfr = fa_pf_rows_bytes(D * bits / 8), pf = pfr > U ? pfr : U;
    float ql[FA_W] __attribute__((aligned(64)));
    FA_SFX(fa_qz_sum_lanes)(qs, R, ql);
    int64_t j = 0;
    for (; j + U <= n; j += U)
        FA_SFX(fa_qk_pass_qz)(qp, ldq, R, nrow, D, x + j * xsr, xsr, scale + j * ssr, ssr, ssc, zero + j * zsr, zsr,
                              zsc, G, U, s + j, lds, bits, pf, one, ql, l2);
    if (j < n)
        FA_SFX(fa_qk_pass_qz)(qp, ldq, R, nrow, D, x + j * xsr, xsr, scale + j * ssr, ssr, ssc, zero + j * zsr, zsr,
                              zsc, G, (int)(n - j), s + j, lds, bits, 0, one, ql, l2);
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_rows_qz_bits)(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint8_t *x, int64_t xsr,
                           const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr, int64_t zsc,
                           int64_t G, int64_t n, float *s, int64_t lds, const int bits, const int one, const int l2)
{
    /* blocks of up to 4 rows (qp holds zero rows up to nr rounded up: rows_alloc),
     * 3 rows as 4; one row: W keys per pass.  One group per row (G = D): the
     * passes sum q . codes and the zero point and scale are applied to each score
     * (qs: each row's sum of q, the same vector sum whichever rows share a pass) */
    for (int64_t i0 = 0; i0 < nr; i0 += 4) {
        const int rows = nr - i0 < 4 ? (int)(nr - i0) : 4;
        const float *q = qp + i0 * ldq;
        float *si = s + i0 * lds;
        float qs[4] = {0, 0, 0, 0};
        if (one)
            for (int i = 0; i < rows; i++) {
                FA_V a = FA_SFX(fa_set1)(0);
                for (int64_t d = 0; d < D; d += FA_W) a += FA_SFX(fa_load)(q + i * ldq + d);
                qs[i] = FA_SFX(fa_hsum)(a);
            }
        if (rows == 1)
            FA_SFX(fa_qk_rows_qz_r)(q, ldq, 1, 1, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, si, lds, bits,
                                    one, qs, l2);
        else if (rows == 2 || FA_W < 4)
            for (int a = 0; a < rows; a += 2)
                FA_SFX(fa_qk_rows_qz_r)(q + a * ldq, ldq, 2, rows - a < 2 ? rows - a : 2, D, x, xsr, scale, ssr,
                                        ssc, zero, zsr, zsc, G, n, si + a * lds, lds, bits, one, qs + a, l2);
        else
            FA_SFX(fa_qk_rows_qz_r)(q, ldq, 4, rows, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, si, lds, bits,
                                    one, qs, l2);
    }
}


#include "quant_u4l.h"     /* 4-bit codes in nibble lanes: fa_qk_rows_u4l, fa_pv_rows_u4l_r */

static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_rows_qz_l)(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint8_t *x, int64_t xsr,
                        int bits, const float *scale, int64_t ssr, int64_t ssc, const float *zero,
                        int64_t zsr, int64_t zsc, int64_t G, int64_t n, float *s, int64_t lds, const int l2)
{
#ifdef FA_U4L_DMAX
    const int ng = bits == 4 ? FA_SFX(fa_u4l_groups)(D, G) : 0;
    if (ng) {
        FA_SFX(fa_qk_rows_u4l)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, ng, l2);
        return;
    }
#endif
    if (G == D) {
        if (bits == 8)
            FA_SFX(fa_qk_rows_qz_bits)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 8, 1, l2);
        else
            FA_SFX(fa_qk_rows_qz_bits)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 4, 1, l2);
    } else if (bits == 8)
        FA_SFX(fa_qk_rows_qz_bits)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 8, 0, l2);
    else
        FA_SFX(fa_qk_rows_qz_bits)(qp, ldq, nr, D, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 4, 0, l2);
}

/* the score readers with the hint level (fa_pf_l2) a constant of each
 * instantiation: a branch per hint spilled the loops' registers (one-row u8
 * decode 1.6x slower) */
static void FA_SFX(fa_qk_rows_qz)(const float *qp, int64_t ldq, int64_t nr, int64_t D, const uint8_t *x, int64_t xsr,
                                  int bits, const float *scale, int64_t ssr, int64_t ssc, const float *zero,
                                  int64_t zsr, int64_t zsc, int64_t G, int64_t n, float *s, int64_t lds)
{
    if (fa_pf_l2)
        FA_SFX(fa_qk_rows_qz_l)(qp, ldq, nr, D, x, xsr, bits, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 1);
    else
        FA_SFX(fa_qk_rows_qz_l)(qp, ldq, nr, D, x, xsr, bits, scale, ssr, ssc, zero, zsr, zsc, G, n, s, lds, 0);
}

#define FA_PV_QZ_WK 128    /* keys per run of fa_pv_rows_qz_r's precomputed weights */

/* O += P . V over keys [k0, k1) of quantized values read in place: R rows (p
 * rows ldp apart, o rows ldo apart) and NB output vectors from column d held in
 * registers while the keys stream by once: per key and vector, (codes - zero)
 * widened in registers and added with weight p * scale.  VPG (a constant): the
 * vectors of one group, at least 1 (a group of G elements is G / W vectors;
 * NB or more: the whole block in one group) -- each group's zero point and the
 * rows' weights p * scale are broadcast once per key and group, not once per
 * vector (the same values, so the same bits).  wt (VPG = NB only): those
 * weights computed ahead, row r's key j at wt[r * FA_PV_QZ_WK + j - k0]. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_cols_qz)(const float *p, int64_t ldp, const uint8_t *x, int64_t xsr, const float *scale, int64_t ssr,
                      int64_t ssc, const float *zero, int64_t zsr, int64_t zsc, int64_t G, int64_t k0, int64_t k1,
                      float *o, int64_t ldo, int64_t d, const int R, const int NB, const int bits, int64_t pf,
                      int64_t rb, const int VPG, const float *wt, const int l2)
{
    FA_V acc[4][8];
    int64_t so[8], zo[8];
    FA_UNROLL for (int b = 0; b < NB; b++) {
        so[b] = (d + b * FA_W) / G * ssc;
        zo[b] = (d + b * FA_W) / G * zsc;
        FA_UNROLL for (int r = 0; r < R; r++) acc[r][b] = FA_SFX(fa_load)(o + r * ldo + d + b * FA_W);
    }
    for (int64_t j = k0; j < k1; j++) {
        const uint8_t *xr = x + j * xsr;
        const float *sr = scale + j * ssr, *zr = zero + j * zsr;
        if (pf) FA_SFX(fa_qz_prefetch_key)(xr + pf * xsr, rb, sr + pf * ssr, zr + pf * zsr, l2);
        float pj[4];
        if (!wt) FA_UNROLL for (int r = 0; r < R; r++) pj[r] = p[r * ldp + j];
        FA_V c[8];
        if (NB == 1)
            c[0] = bits == 8 ? fa_load_u8(xr + d) : fa_load_u4(xr + d / 2);
        else
            FA_UNROLL for (int b = 0; b < NB; b += 2) FA_SFX(fa_codes2)(xr, d + b * FA_W, bits, c + b);
        FA_V zv = FA_SFX(fa_set1)(0), wv[4];
        FA_UNROLL for (int b = 0; b < NB; b++) {
            if (b % VPG == 0) {
                zv = FA_SFX(fa_set1)(zr[zo[b]]);
                if (wt)
                    FA_UNROLL for (int r = 0; r < R; r++) wv[r] = FA_SFX(fa_set1)(wt[r * FA_PV_QZ_WK + j - k0]);
                else {
                    const float sj = sr[so[b]];
                    FA_UNROLL for (int r = 0; r < R; r++) wv[r] = FA_SFX(fa_set1)(pj[r] * sj);
                }
            }
            const FA_V cz = c[b] - zv;
            FA_UNROLL for (int r = 0; r < R; r++) acc[r][b] += cz * wv[r];
        }
    }
    FA_UNROLL for (int b = 0; b < NB; b++)
        FA_UNROLL for (int r = 0; r < R; r++) FA_SFX(fa_store)(o + r * ldo + d + b * FA_W, acc[r][b]);
}

/* R rows over every column: blocks of NB vectors (a last one of fewer), the
 * first block's pass requesting the rows ahead (the later blocks find them in
 * cache); a block's vectors per group (G a multiple of W: quant_reads' readers)
 * a constant of each instantiation. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_rows_qz_r)(const float *p, int64_t ldp, const uint8_t *x, int64_t xsr, const float *scale, int64_t ssr,
                        int64_t ssc, const float *zero, int64_t zsr, int64_t zsc, int64_t G, int64_t k0, int64_t k1,
                        float *o, int64_t ldo, int64_t D, const int R, const int bits, const int l2)
{
    const int NB = R == 1 ? 8 : R == 2 || FA_VBYTES >= 64 ? 4 : 2;   /* R x NB accumulators: 8 or 16 */
    const int64_t rb = D * bits / 8, pfr = fa_pf_rows_bytes(rb);
    int64_t d = 0;
#define FA_PV_QZ_BLOCKS(VPG)                                                                               \
    for (; d + NB * FA_W <= D; d += NB * FA_W)                                                            \
        FA_SFX(fa_pv_cols_qz)(p, ldp, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, d, R, NB, bits, \
                              d == 0 ? pfr : 0, rb, VPG, NULL, l2)
    if (G % (NB * FA_W) == 0 && R > 1) {
        /* every block inside one group: the rows' weights p * scale of a group's
         * keys computed once for all its blocks (G = D, the 8-bit default: once
         * per key instead of once per block), keys in runs of FA_PV_QZ_WK; per
         * element the same products and sums in the same key order, so the same
         * bits.  One row keeps its inline product: through this path it measured
         * level (MHA decode u8 G 128, Zen 4, avx512_bf16 2.49-2.58 against
         * 2.48-3.15 ms, avx2 2.99-3.50 against 2.79-3.65), and the inline path
         * serves the blocks of VPG < NB anyway */
        float wt[4 * FA_PV_QZ_WK];
        for (int64_t ka = k0; ka < k1; ka += FA_PV_QZ_WK) {
            const int64_t kz = k1 - ka < FA_PV_QZ_WK ? k1 : ka + FA_PV_QZ_WK;
            for (int64_t g0 = 0; g0 < D; g0 += G) {
                const float *sg = scale + g0 / G * ssc;
                for (int r = 0; r < R; r++)
                    for (int64_t j = ka; j < kz; j++) wt[r * FA_PV_QZ_WK + j - ka] = p[r * ldp + j] * sg[j * ssr];
                for (d = g0; d < g0 + G; d += NB * FA_W)
                    FA_SFX(fa_pv_cols_qz)(p, ldp, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, ka, kz, o, ldo, d, R,
                                          NB, bits, d == 0 ? pfr : 0, rb, NB, wt, l2);
            }
        }
        return;
    }
    if (G % (NB * FA_W) == 0)
        FA_PV_QZ_BLOCKS(NB);
    else if (NB >= 4 && G % (2 * FA_W) == 0)
        FA_PV_QZ_BLOCKS(2);
    else
        FA_PV_QZ_BLOCKS(1);
#undef FA_PV_QZ_BLOCKS
    for (; d < D; d += FA_W)
        FA_SFX(fa_pv_cols_qz)(p, ldp, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, d, R, 1, bits,
                              d == 0 ? pfr : 0, rb, 1, NULL, l2);
}

/* R rows (a constant) over every column: the interleaved reader, or for 4-bit
 * codes in nibble lanes (NG > 0, a constant) fa_pv_rows_u4l_r */
static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_rows_qz_rn)(const float *p, int64_t ldp, const uint8_t *x, int64_t xsr, const float *scale,
                         int64_t ssr, int64_t ssc, const float *zero, int64_t zsr, int64_t zsc, int64_t G,
                         int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t D, const int R, const int bits,
                         const int NG, const int l2)
{
#ifdef FA_U4L_DMAX
    if (NG) {
        FA_SFX(fa_pv_rows_u4l_r)(p, ldp, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, R, NG, l2);
        return;
    }
#endif
    FA_SFX(fa_pv_rows_qz_r)(p, ldp, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, R, bits, l2);
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_rows_qz_bits)(const float *p, int64_t ldp, int64_t nr, const uint8_t *x, int64_t xsr,
                           const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr,
                           int64_t zsc, int64_t G, int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t D,
                           const int bits, const int NG, const int l2)
{
    for (int64_t i0 = 0; i0 < nr; i0 += 4) {
        const float *pi = p + i0 * ldp;
        float *oi = o + i0 * ldo;
#define FA_PV_QZ_ROWS(R) \
        FA_SFX(fa_pv_rows_qz_rn)(pi, ldp, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, oi, ldo, D, R, bits, NG, \
                                 l2)
        switch (nr - i0 < 4 ? (int)(nr - i0) : 4) {
        case 1: FA_PV_QZ_ROWS(1); break;
        case 2: FA_PV_QZ_ROWS(2); break;
        case 3: FA_PV_QZ_ROWS(3); break;
        default: FA_PV_QZ_ROWS(4); break;
        }
#undef FA_PV_QZ_ROWS
    }
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_rows_qz_l)(const float *p, int64_t ldp, int64_t nr, const uint8_t *x, int64_t xsr, int bits,
                        const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr,
                        int64_t zsc, int64_t G, int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t D, const int l2)
{
#ifdef FA_U4L_DMAX
    const int ng = bits == 4 ? FA_SFX(fa_u4l_groups)(D, G) : 0;
    if (ng == 1)
        FA_SFX(fa_pv_rows_qz_bits)(p, ldp, nr, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, 4, 1, l2);
    else if (ng == 2)
        FA_SFX(fa_pv_rows_qz_bits)(p, ldp, nr, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, 4, 2, l2);
    else if (ng)
        FA_SFX(fa_pv_rows_qz_bits)(p, ldp, nr, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, 4, 4, l2);
    else
#endif
    if (bits == 8)
        FA_SFX(fa_pv_rows_qz_bits)(p, ldp, nr, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, 8, 0, l2);
    else
        FA_SFX(fa_pv_rows_qz_bits)(p, ldp, nr, x, xsr, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, 4, 0, l2);
}

/* the P.V readers with the hint level a constant, as fa_qk_rows_qz */
static void FA_SFX(fa_pv_rows_qz)(const float *p, int64_t ldp, int64_t nr, const uint8_t *x, int64_t xsr, int bits,
                                  const float *scale, int64_t ssr, int64_t ssc, const float *zero, int64_t zsr,
                                  int64_t zsc, int64_t G, int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t D)
{
    if (fa_pf_l2)
        FA_SFX(fa_pv_rows_qz_l)(p, ldp, nr, x, xsr, bits, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, 1);
    else
        FA_SFX(fa_pv_rows_qz_l)(p, ldp, nr, x, xsr, bits, scale, ssr, ssc, zero, zsr, zsc, G, k0, k1, o, ldo, D, 0);
}
#endif
