/* Rows of a QuantizedKV (asymmetric 8-bit or 4-bit codes with a float32 scale
 * and zero point per group of G elements of a row) dequantized into a tile of
 * the compute type: the tile-sized scratch the units read (the row unit's key
 * panels and value tile, the query-vectorised unit's widened tiles), never a
 * copy of the cache.  Element d of a row is (code - zero[d / G]) * scale[d / G].
 *
 * Float compute: W codes at a time widened in registers by the target's
 * fa_load_u8 / fa_load_u4 (isa/portable.h), the group's scale and zero point
 * broadcast when a vector lies in one group (G a multiple of W), or gathered
 * lane by lane into a vector otherwise (G < W, or not a multiple of it).
 * Double compute: element by element (a float64 query with a quantized cache).
 * Part of the per-type body (simd_body.h).  Not a standalone header. */

static inline FA_T FA_SFX(fa_code_at)(const uint8_t *x, int bits, int64_t d)
{
    return (FA_T)(bits == 8 ? x[d] : (x[d >> 1] >> ((d & 1) * 4)) & 15);
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
    FA_V acc = FA_SFX(fa_set1)(0);
    FA_T probe = 0;
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
                const FA_V v = (c - FA_SFX(fa_set1)(zr[g * zsc])) * FA_SFX(fa_set1)(sr[g * ssc]);
                FA_SFX(fa_store)(y + d, v);
                acc += v * 0;
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
                const FA_V v = (c - FA_SFX(fa_load)(zv)) * FA_SFX(fa_load)(sv);
                FA_SFX(fa_store)(y + d, v);
                acc += v * 0;
            }
        }
#endif
        for (; d < D; d++) {
            const int64_t g = d / G;
            const FA_T v = (FA_SFX(fa_code_at)(xr, bits, d) - (FA_T)zr[g * zsc]) * (FA_T)sr[g * ssc];
            y[d] = v;
            probe += v * 0;
        }
        for (d = D; d < ld; d++) y[d] = 0;
    }
    return probe + FA_SFX(fa_hsum)(acc) != 0;     /* 0 or NaN */
}
