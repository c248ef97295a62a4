/* ISA target: x86-64-v4 (AVX-512 F/BW/CD/DQ/VL, FMA, F16C), 64-byte vectors.
 * The primitives of isa/portable.h, each mapped to its AVX-512 form or to the
 * portable one.  Also compiled with AVX512_BF16 (the avx512_bf16 variant).
 * Included once by simd.h (setup.py names it in FA_ISA_HEADER). */
#ifndef FASTATTN_ISA_TARGET_H
#define FASTATTN_ISA_TARGET_H

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__F16C__)
#  error "isa/x86_avx512.h needs -march=x86-64-v4"
#endif

#define FA_TARGET "x86_avx512"
#define FA_VBYTES 64
#define FA_WF 16
#define FA_WD 8

/* Register blocking (simd.h explains each): 32 zmm registers */
#define FA_QK_MR 8
#define FA_QK_NV 2
#define FA_PV_MR 6
#define FA_PV_NV 4
#define FA_QVEC_NV 4
#define FA_QVEC_MR 6
#define FA_QVEC_MR2 8
#define FA_QVEC_MR1 16

#include <immintrin.h>
#include "portable.h"

/* ---- per compute type ---- */
static inline fa_v_f fa_vmax_f(fa_v_f a, fa_v_f b) { return (fa_v_f)_mm512_max_ps((__m512)a, (__m512)b); }
static inline fa_v_d fa_vmax_d(fa_v_d a, fa_v_d b) { return (fa_v_d)_mm512_max_pd((__m512d)a, (__m512d)b); }

/* masked loads and stores: lanes past n are not touched, and no
 * store-forwarding stall (a row of scalar stores read back as one vector waits
 * for every store to retire: on the short score rows of a small problem, where
 * every row ends in a partial vector, that stall was a large part of the row's
 * softmax) */
static inline fa_v_f fa_load_part_f(const float *p, int64_t n, float fill)
{
    return (fa_v_f)_mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << n) - 1), p);
}

static inline fa_v_d fa_load_part_d(const double *p, int64_t n, double fill)
{
    return (fa_v_d)_mm512_mask_loadu_pd(_mm512_set1_pd(fill), (__mmask8)((1u << n) - 1), p);
}

static inline void fa_store_part_f(float *p, fa_v_f v, int64_t n)
{
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
}

static inline void fa_store_part_d(double *p, fa_v_d v, int64_t n)
{
    _mm512_mask_storeu_pd(p, (__mmask8)((1u << n) - 1), (__m512d)v);
}

static inline unsigned fa_lane_bits_f(fa_vi_f m) { return _mm512_test_epi32_mask((__m512i)m, (__m512i)m); }
static inline unsigned fa_lane_bits_d(fa_vi_d m) { return _mm512_test_epi64_mask((__m512i)m, (__m512i)m); }

/* vpmovzxb{d,q} (GCC lowers a conversion between vectors of different sizes to
 * a vpinsr per lane) */
static inline fa_vi_f fa_widen_bytes_f(const uint8_t *b)
{
    return (fa_vi_f)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
}

static inline fa_vi_d fa_widen_bytes_d(const uint8_t *b)
{
    return (fa_vi_d)_mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)b));
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

/* ---- storage types: F16C, shifts, sign extension; masked partial loads ---- */
static inline float fa_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t fa_f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

static inline fa_v_f fa_load_f16(const uint16_t *p)
{
    return (fa_v_f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline fa_v_f fa_load_part_f16(const uint16_t *p, int64_t n, float fill)
{
    const __mmask16 k = (__mmask16)((1u << n) - 1);
    return (fa_v_f)_mm512_mask_blend_ps(k, _mm512_set1_ps(fill), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p)));
}

static inline void fa_store_f16(uint16_t *p, fa_v_f x)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph((__m512)x, _MM_FROUND_TO_NEAREST_INT));
}

/* bfloat16 -> float32: each element the high half of a 32-bit lane, zeros below.
 * One VPERMW with a zeroing mask (word 2i + 1 of the result = word i of the
 * load, the even words zero) instead of VPMOVZXWD + VPSLLD: one instruction
 * less per 16 elements, the same bits.  A grouped-query decode over a bfloat16
 * cache (four query rows per key/value head) is bound by these instructions
 * and the FMAs, not by memory: 0.90x the time in a loop of its Q.K^T in cache
 * (Intel Xeon 6).  The avx512_bf16 variant (chosen automatically on AMD Zen 4 /
 * 5, where VPERMW on 512-bit vectors was not measured) keeps the shift. */
#if defined(__AVX512BF16__)
static inline __m512i fa_widen_bf16_(__m256i x)
{
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16);
}
#else
static inline __m512i fa_widen_bf16_(__m256i x)
{
    const __m512i idx = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                         7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    return _mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, _mm512_castsi256_si512(x));
}
#endif

static inline fa_v_f fa_load_bf16(const uint16_t *p)
{
    return (fa_v_f)_mm512_castsi512_ps(fa_widen_bf16_(_mm256_loadu_si256((const __m256i *)p)));
}

static inline fa_v_f fa_load_part_bf16(const uint16_t *p, int64_t n, float fill)
{
    const __mmask16 k = (__mmask16)((1u << n) - 1);
    const __m512 x = _mm512_castsi512_ps(fa_widen_bf16_(_mm256_maskz_loadu_epi16(k, p)));
    return (fa_v_f)_mm512_mask_blend_ps(k, _mm512_set1_ps(fill), x);
}

#define fa_bf16_to_f32 fa_port_bf16_to_f32
#define fa_f32_to_bf16 fa_port_f32_to_bf16
#define fa_store_bf16 fa_port_store_bf16

static inline fa_v_f fa_load_i8(const int8_t *p)
{
    return (fa_v_f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline fa_v_f fa_load_part_i8(const int8_t *p, int64_t n, float fill)
{
    const __mmask16 k = (__mmask16)((1u << n) - 1);
    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, p)));
    return (fa_v_f)_mm512_mask_blend_ps(k, _mm512_set1_ps(fill), x);
}

/* ---- float8 through F16C: e5m2 is the top byte of an IEEE half; e4m3fn
 * (s eeee mmm) becomes the half s 0eeee mmm0000000 -- its exponent read with
 * bias 15 instead of 7, so the value / 2^8, e4m3 subnormals half subnormals --
 * widened by vcvtph2ps and multiplied by 2^8 (exact: each product is a normal
 * float32 or zero); magnitude 0x7f is e4m3fn's NaN (it has no inf) ---- */
static inline __m512 fa_f8e5_halves_to_ps(__m256i b) { return _mm512_cvtph_ps(_mm256_slli_epi16(b, 8)); }

static inline __m512 fa_f8e4_halves_to_ps(__m256i b)
{
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_xor_si256(b, mag), 8), _mm256_slli_epi16(mag, 7));
    const __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    return _mm512_mask_blend_ps(_mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f)), x,
                                _mm512_set1_ps(__builtin_nanf("")));
}

static inline fa_v_f fa_load_f8e5(const uint8_t *p)
{
    return (fa_v_f)fa_f8e5_halves_to_ps(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)));
}

static inline fa_v_f fa_load_f8e4(const uint8_t *p)
{
    return (fa_v_f)fa_f8e4_halves_to_ps(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)));
}

/* e4m3fn "raw" (widen.h): the values / 2^8, the halves as they widen, no
 * multiplication; the kernels that sum raw products scale their sums by
 * FA_F8E4_RAW_FACTOR once (as x86_avx2.h).  The half of byte b: its sign and
 * magnitude moved down one bit (s 0 eeee mmm 0000000), magnitude 0x7f -> NaN */
#define FA_F8E4_RAW_FACTOR 256.0f

static inline __m256i fa_f8e4_rawhalves16_(__m256i b)     /* b: 16 bytes zero-extended to 16 bits */
{
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 1),
                                       _mm256_set1_epi16((short)0xbfff));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_slli_epi16(b, 9), _mm256_set1_epi16((short)0xfe00));
    return _mm256_mask_blend_epi16(nan, h, _mm256_set1_epi16(0x7e00));
}

static inline fa_v_f fa_load_f8e4_raw(const uint8_t *p)
{
    return (fa_v_f)_mm512_cvtph_ps(fa_f8e4_rawhalves16_(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p))));
}

static inline void fa_load2_f8e4_raw(const uint8_t *p, fa_v_f *v)
{
    v[0] = fa_load_f8e4_raw(p);
    v[1] = fa_load_f8e4_raw(p + 16);
}

static inline void fa_load4_f8e4_raw(const uint8_t *p, fa_v_f *v)
{
    fa_load2_f8e4_raw(p, v);
    fa_load2_f8e4_raw(p + 32, v + 2);
}

static inline fa_v_f fa_load_part_f8e5(const uint8_t *p, int64_t n, float fill)
{
    const __mmask16 k = (__mmask16)((1u << n) - 1);
    const __m512 x = fa_f8e5_halves_to_ps(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(k, p)));
    return (fa_v_f)_mm512_mask_blend_ps(k, _mm512_set1_ps(fill), x);
}

static inline fa_v_f fa_load_part_f8e4(const uint8_t *p, int64_t n, float fill)
{
    const __mmask16 k = (__mmask16)((1u << n) - 1);
    const __m512 x = fa_f8e4_halves_to_ps(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(k, p)));
    return (fa_v_f)_mm512_mask_blend_ps(k, _mm512_set1_ps(fill), x);
}

static inline float fa_f8e5_to_f32(uint8_t b) { return _cvtsh_ss((unsigned short)(b << 8)); }
#define fa_f8e4_to_f32 fa_port_f8e4_to_f32

/* QuantizedKV codes: 16 bytes zero-extended (VPMOVZXBD); 4 bits: 8 bytes split
 * into low and high nibbles, interleaved (even element first), then widened */
static inline fa_v_f fa_load_u8(const uint8_t *p)
{
    return (fa_v_f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline fa_v_f fa_load_u4(const uint8_t *p)
{
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return (fa_v_f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}

/* the low 4 bits of each lane as float: one VPERMPS from the table 0..15 (it reads
 * only an index's low 4 bits), in place of a mask and a conversion -- the same
 * values */
static inline fa_v_f fa_low4(fa_u32_wf x)
{
    const __m512 t = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return (fa_v_f)_mm512_permutexvar_ps((__m512i)x, t);
}

/* 32 codes from 16 bytes: one split, the two interleaved halves widened */
static inline void fa_load2_u4(const uint8_t *p, fa_v_f *v)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    v[0] = (fa_v_f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    v[1] = (fa_v_f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
}

#define fa_load4_f16(p, v) FA_LOAD4_BY_ONE(fa_load_f16, p, v, FA_WF)
#define fa_load4_bf16(p, v) FA_LOAD4_BY_ONE(fa_load_bf16, p, v, FA_WF)
#define fa_load4_i8(p, v) FA_LOAD4_BY_ONE(fa_load_i8, p, v, FA_WF)
#define fa_load4_f8e4(p, v) FA_LOAD4_BY_ONE(fa_load_f8e4, p, v, FA_WF)
#define fa_load4_f8e5(p, v) FA_LOAD4_BY_ONE(fa_load_f8e5, p, v, FA_WF)

/* streaming stores (MOVNTPS / MOVNTPD) of whole vectors to aligned addresses,
 * and the store fence after them (simd.h: fa_stream_f) */
#define FA_HAVE_STREAM 1
static inline void fa_stream_f(float *p, fa_v_f x) { _mm512_stream_ps(p, (__m512)x); }
static inline void fa_stream_d(double *p, fa_v_d x) { _mm512_stream_pd(p, (__m512d)x); }
static inline void fa_stream_fence(void) { _mm_sfence(); }

#endif /* FASTATTN_ISA_TARGET_H */
