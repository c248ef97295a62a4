/* ISA target: x86-64-v4 + AVX512_BF16 (Cooper Lake, Sapphire Rapids and later,
 * AMD Zen 4 / 5).  Everything of isa/x86_avx512.h, plus the bfloat16 pair dot
 * product VDPBF16PS that bf16_dot.h builds the query-vectorised Q.K^T of
 * bfloat16 queries and keys on.  Included once by simd.h. */
#include "x86_avx512.h"

#if !defined(__AVX512BF16__)
#  error "isa/x86_avx512_bf16.h needs -mavx512bf16"
#endif
#undef FA_TARGET
#define FA_TARGET "x86_avx512_bf16"

/* acc[i] += a.bf16[2i] * b.bf16[2i] + a.bf16[2i+1] * b.bf16[2i+1]: products exact
 * (8-bit significands), sums in float32 rounded to nearest; the instruction
 * treats subnormal inputs as zero and flushes subnormal results (docs/kernels.rst) */
#define FA_HAVE_BF16_DOT 1
static inline fa_v_f fa_bf16_dot2_f(fa_v_f acc, fa_vi_f a, fa_vi_f b)
{
    return (fa_v_f)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
}

/* P.V by the pair dot products (bf16_dot.h, FA_HAVE_BF16_PV): the 32-bit word
 * of lane i holds (lo[i], hi[i]) rounded to bfloat16 to nearest even
 * (VCVTNE2PS2BF16, then VPERMW interleaves the two halves; NaN stays NaN,
 * subnormal inputs become 0) */
#define FA_HAVE_BF16_PV 1
static inline fa_vi_f fa_bf16_round_pair(fa_v_f lo, fa_v_f hi)
{
    /* word 2i <- word i (lo[i]), word 2i + 1 <- word 16 + i (hi[i]) */
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i w = (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
    return (fa_vi_f)_mm512_permutexvar_epi16(idx, w);
}

/* Columns c .. c + FA_BF16_PACK_COLS - 1 of two bfloat16 rows x and y
 * interleaved in registers, two VPERMT2W: word 2i of lo = (x[i], y[i]) for
 * columns 0-15, of hi for columns 16-31 (fa_bf16_pack_pairs, fa_pv_rows_bd) */
#define FA_BF16_PACK_COLS 32
static inline __attribute__((always_inline)) void fa_bf16_zip_rows(fa_vi_f x, fa_vi_f y, fa_vi_f *lo, fa_vi_f *hi)
{
    const __m512i ilo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                         39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i ihi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                         55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    *lo = (fa_vi_f)_mm512_permutex2var_epi16((__m512i)x, ilo, (__m512i)y);
    *hi = (fa_vi_f)_mm512_permutex2var_epi16((__m512i)x, ihi, (__m512i)y);
}

/* Columns c .. c + FA_BF16_PACK_COLS - 1 of two bfloat16 rows a and b (b NULL:
 * zeros) interleaved into words (a[c], b[c]) at d (fa_bf16_zip_rows); returns a
 * nonzero mask where either row holds an inf or NaN (fa_pack_value_pairs_bd) */
static inline uint32_t fa_bf16_pack_pairs(const uint16_t *a, const uint16_t *b, uint32_t *d)
{
    const __m512i e = _mm512_set1_epi16(0x7f80);
    const __m512i x = _mm512_loadu_si512(a), y = b ? _mm512_loadu_si512(b) : _mm512_setzero_si512();
    fa_vi_f lo, hi;
    fa_bf16_zip_rows((fa_vi_f)x, (fa_vi_f)y, &lo, &hi);
    _mm512_storeu_si512(d, (__m512i)lo);
    _mm512_storeu_si512(d + 16, (__m512i)hi);
    return (uint32_t)(_mm512_cmpeq_epi16_mask(_mm512_and_si512(x, e), e) |
                      _mm512_cmpeq_epi16_mask(_mm512_and_si512(y, e), e));
}

/* 2 FA_WF floats, lo then hi, rounded to bfloat16 to nearest even in order:
 * word i = lo[i], word FA_WF + i = hi[i] (VCVTNE2PS2BF16; consecutive elements
 * become the pairs of one 32-bit word: fa_pv_rows_bd's probabilities) */
static inline fa_vi_f fa_bf16_round_seq(fa_v_f lo, fa_v_f hi)
{
    return (fa_vi_f)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
}
