/* ISA target: x86-64-v3 (AVX2, FMA, F16C, BMI2), 32-byte vectors.  The
 * primitives of isa/portable.h, each mapped to its AVX2 form or to the portable
 * one.  Included once by simd.h (setup.py names it in FA_ISA_HEADER). */
#ifndef FASTATTN_ISA_TARGET_H
#define FASTATTN_ISA_TARGET_H

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#  error "isa/x86_avx2.h needs -march=x86-64-v3"
#endif

#define FA_TARGET "x86_avx2"
#define FA_VBYTES 32
#define FA_WF 8
#define FA_WD 4

/* Register blocking (simd.h explains each): 16 ymm registers */
#define FA_QK_MR 6
#define FA_QK_NV 2
#define FA_PV_MR 3
#define FA_PV_NV 4
#define FA_QVEC_NV 2
#define FA_QVEC_MR 6
#define FA_QVEC_MR2 6
#define FA_QVEC_MR1 8

/* v stays in a register for its uses: GCC otherwise folds the load of a query
 * vector into each FMA that uses it as a memory operand, one load per key
 * (fa_qk_pass, a GQA group of 4: 10 loads per 8 FMAs, the load ports the bound;
 * with the query vectors held, 6).  Used by the line-by-line loop that float16
 * keys take (widen.h, fa_line_vecs_s: the measured types) */
#define FA_IN_REG(v) __asm__("" : "+x"(v))

#include <immintrin.h>
#include "portable.h"

/* ---- per compute type ---- */
static inline fa_v_f fa_vmax_f(fa_v_f a, fa_v_f b) { return (fa_v_f)_mm256_max_ps((__m256)a, (__m256)b); }
static inline fa_v_d fa_vmax_d(fa_v_d a, fa_v_d b) { return (fa_v_d)_mm256_max_pd((__m256d)a, (__m256d)b); }

/* vmaskmov loads (lanes past n not read) blended with the fill; the partial
 * store stays portable (vmaskmovps stores are microcoded on AMD cores) */
static inline fa_v_f fa_load_part_f(const float *p, int64_t n, float fill)
{
    const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return (fa_v_f)_mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, k), _mm256_castsi256_ps(k));
}

static inline fa_v_d fa_load_part_d(const double *p, int64_t n, double fill)
{
    const __m256i k = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
    return (fa_v_d)_mm256_blendv_pd(_mm256_set1_pd(fill), _mm256_maskload_pd(p, k), _mm256_castsi256_pd(k));
}

#define fa_store_part_f fa_port_store_part_f
#define fa_store_part_d fa_port_store_part_d

static inline unsigned fa_lane_bits_f(fa_vi_f m) { return (unsigned)_mm256_movemask_ps((__m256)m); }
static inline unsigned fa_lane_bits_d(fa_vi_d m) { return (unsigned)_mm256_movemask_pd((__m256d)m); }

static inline fa_vi_f fa_widen_bytes_f(const uint8_t *b)
{
    return (fa_vi_f)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
}

static inline fa_vi_d fa_widen_bytes_d(const uint8_t *b)
{
    int32_t w;
    memcpy(&w, b, sizeof w);
    return (fa_vi_d)_mm256_cvtepu8_epi64(_mm_cvtsi32_si128(w));
}

#define fa_hsum_f fa_port_hsum_f
#define fa_hsum_d fa_port_hsum_d
#define fa_hmax_f fa_port_hmax_f
#define fa_hmax_d fa_port_hmax_d
#define fa_transpose_f fa_port_transpose_f
#define fa_transpose_d fa_port_transpose_d
#define fa_transpose_add_f fa_port_transpose_add_f
#define fa_transpose_add_d fa_port_transpose_add_d
#define fa_transpose_u8x16 fa_port_transpose_u8x16

/* ---- storage types: F16C, shifts, sign extension ---- */
static inline float fa_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t fa_f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

static inline fa_v_f fa_load_f16(const uint16_t *p)
{
    return (fa_v_f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline fa_v_f fa_load_part_f16(const uint16_t *p, int64_t n, float fill)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = i < n ? _cvtsh_ss(p[i]) : fill;
    return fa_port_loadu_f(t);
}

static inline void fa_store_f16(uint16_t *p, fa_v_f x)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph((__m256)x, _MM_FROUND_TO_NEAREST_INT));
}

static inline fa_v_f fa_load_bf16(const uint16_t *p)
{
    return (fa_v_f)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

#define fa_load_part_bf16 fa_port_load_part_bf16
#define fa_bf16_to_f32 fa_port_bf16_to_f32
#define fa_f32_to_bf16 fa_port_f32_to_bf16
#define fa_store_bf16 fa_port_store_bf16

static inline fa_v_f fa_load_i8(const int8_t *p)
{
    return (fa_v_f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

#define fa_load_part_i8 fa_port_load_part_i8

/* ---- float8 through F16C (see isa/x86_avx512.h): e5m2 shifted into a half;
 * e4m3fn as the half s 0eeee mmm0000000 times 2^8: the byte moved to the top
 * of a 16-bit lane and shifted right arithmetically by one (the sign lands in
 * bits 15 and 14) with bit 14 cleared; magnitude 0x7f (NaN, the byte shifted
 * left by 9 is 0xfe00) replaced by the half NaN 0x7e00 before the widening, so
 * it widens to NaN and stays NaN times 2^8.  Sixteen bytes are made halves in
 * one 256-bit register, then widened in two halves: 7 integer operations per 16
 * elements instead of 9 per 8 (and no float blend) ---- */
static inline __m128i fa_f8e4_halves8_(__m128i b)      /* b: 8 bytes zero-extended to 16 bits */
{
    const __m128i h = _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(b, 8), 1), _mm_set1_epi16((short)0xbfff));
    const __m128i nan = _mm_cmpeq_epi16(_mm_slli_epi16(b, 9), _mm_set1_epi16((short)0xfe00));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), nan);
}

static inline __m256i fa_f8e4_halves16_(__m256i b)     /* b: 16 bytes zero-extended to 16 bits */
{
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 1),
                                       _mm256_set1_epi16((short)0xbfff));
    const __m256i nan = _mm256_cmpeq_epi16(_mm256_slli_epi16(b, 9), _mm256_set1_epi16((short)0xfe00));
    return _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7e00), nan);
}

static inline fa_v_f fa_load_f8e5(const uint8_t *p)
{
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return (fa_v_f)_mm256_cvtph_ps(_mm_slli_epi16(b, 8));
}

/* 16 consecutive e5m2 elements as two vectors: one widening of 16 bytes */
static inline void fa_load2_f8e5(const uint8_t *p, fa_v_f *v)
{
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    v[0] = (fa_v_f)_mm256_cvtph_ps(_mm256_castsi256_si128(h));
    v[1] = (fa_v_f)_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}
#define fa_load2_f8e5 fa_load2_f8e5

/* 32 consecutive float8 elements as four vectors: 16 bytes at a time */
static inline void fa_load4_f8e5(const uint8_t *p, fa_v_f *v)
{
    fa_load2_f8e5(p, v);
    fa_load2_f8e5(p + 16, v + 2);
}

/* e4m3fn "raw" (widen.h): the values / 2^8, the halves as they widen; the
 * kernels that sum raw products scale their sums by FA_F8E4_RAW_FACTOR once */
#define FA_F8E4_RAW_FACTOR 256.0f

static inline fa_v_f fa_load_f8e4_raw(const uint8_t *p)
{
    return (fa_v_f)_mm256_cvtph_ps(fa_f8e4_halves8_(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p))));
}

static inline void fa_load2_f8e4_raw(const uint8_t *p, fa_v_f *v)
{
    const __m256i h = fa_f8e4_halves16_(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)));
    v[0] = (fa_v_f)_mm256_cvtph_ps(_mm256_castsi256_si128(h));
    v[1] = (fa_v_f)_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

static inline void fa_load4_f8e4_raw(const uint8_t *p, fa_v_f *v)
{
    fa_load2_f8e4_raw(p, v);
    fa_load2_f8e4_raw(p + 16, v + 2);
}

static inline fa_v_f fa_load_f8e4(const uint8_t *p)
{
    return (fa_v_f)_mm256_mul_ps((__m256)fa_load_f8e4_raw(p), _mm256_set1_ps(FA_F8E4_RAW_FACTOR));
}

static inline void fa_load4_f8e4(const uint8_t *p, fa_v_f *v)
{
    fa_load4_f8e4_raw(p, v);
    for (int i = 0; i < 4; i++) v[i] = (fa_v_f)_mm256_mul_ps((__m256)v[i], _mm256_set1_ps(FA_F8E4_RAW_FACTOR));
}

static inline float fa_f8e5_to_f32(uint8_t b) { return _cvtsh_ss((unsigned short)(b << 8)); }
#define fa_f8e4_to_f32 fa_port_f8e4_to_f32
#define fa_load_part_f8e4 fa_port_load_part_f8e4
#define fa_load_part_f8e5 fa_port_load_part_f8e5

/* QuantizedKV codes: 8 bytes zero-extended (VPMOVZXBD); 4 bits: 4 bytes split
 * into low and high nibbles, interleaved (even element first), then widened */
static inline fa_v_f fa_load_u8(const uint8_t *p)
{
    return (fa_v_f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline fa_v_f fa_load_u4(const uint8_t *p)
{
    int32_t w;
    memcpy(&w, p, sizeof w);
    const __m128i b = _mm_cvtsi32_si128(w), m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return (fa_v_f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}

/* 16 codes from 8 bytes: one split and interleave, its two halves widened */
static inline void fa_load2_u4(const uint8_t *p, fa_v_f *v)
{
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    const __m128i x = _mm_unpacklo_epi8(lo, hi);
    v[0] = (fa_v_f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x));
    v[1] = (fa_v_f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(x, 8)));
}

/* VPERMPS takes 3 index bits on 256 bits: 8 entries, not 16 */
#define fa_low4 fa_port_low4

#define fa_load4_f16(p, v) FA_LOAD4_BY_ONE(fa_load_f16, p, v, FA_WF)
#define fa_load4_bf16(p, v) FA_LOAD4_BY_ONE(fa_load_bf16, p, v, FA_WF)
#define fa_load4_i8(p, v) FA_LOAD4_BY_ONE(fa_load_i8, p, v, FA_WF)

/* streaming stores (MOVNTPS / MOVNTPD) of whole vectors to aligned addresses,
 * and the store fence after them (simd.h: fa_stream_f) */
#define FA_HAVE_STREAM 1
static inline void fa_stream_f(float *p, fa_v_f x) { _mm256_stream_ps(p, (__m256)x); }
static inline void fa_stream_d(double *p, fa_v_d x) { _mm256_stream_pd(p, (__m256d)x); }
static inline void fa_stream_fence(void) { _mm_sfence(); }

#endif /* FASTATTN_ISA_TARGET_H */
