/* ISA target: AArch64 Advanced SIMD (NEON), 16-byte vectors, 32 registers.
 * The `neon` variant is plain ARMv8.0-A; `neon_bf16` is the same header compiled
 * for cores with BF16 (ARMv8.6-A and some v8.2+ cores: Graviton3/4, Neoverse
 * N2/V1/V2, Apple M2 and later).  float16 widens by FCVTL / narrows by FCVTN,
 * bfloat16 by a 16-bit shift (SHLL), int8 by SXTL; everything else is the
 * portable GNU-vector code, which GCC and clang map onto zip / trn / ext /
 * faddp.  Included once by simd.h (setup.py names it in FA_ISA_HEADER). */
#ifndef FASTATTN_ISA_TARGET_H
#define FASTATTN_ISA_TARGET_H

#if !defined(__aarch64__) && !defined(_M_ARM64)
#  error "isa/neon.h is for AArch64"
#endif

#define FA_TARGET "neon"
#define FA_VBYTES 16
#define FA_WF 4
#define FA_WD 2

/* Register blocking (simd.h explains each): 32 q registers hold the
 * accumulators, the vectors of one operand and the broadcast scalars of the
 * other (GCC keeps those in s registers and multiplies by element), so 5 x 4
 * blocks (20 + 4 + 5 registers; 6 x 4 spilled two accumulators to the stack on
 * every step).  Decode loops: 8 dot-product accumulators, 16-vector output
 * passes and 16 (row, key) pairs per score pass of a few rows give the 16
 * independent FMA chains that 4 pipes of latency 4 need. */
#define FA_QK_MR 5
#define FA_QK_NV 4
#define FA_PV_MR 5
#define FA_PV_NV 4
#define FA_QVEC_NV 4
#define FA_QVEC_MR 5
#define FA_QVEC_MR2 10
#define FA_QVEC_MR1 16
#define FA_DOT_ACCS 8
#define FA_ROW_NB 16
#define FA_QK_PAIRS_W 4

#include <arm_neon.h>
#include "portable.h"

/* ---- per compute type ---- */
#define fa_vmax_f fa_port_vmax_f
#define fa_vmax_d fa_port_vmax_d
#define fa_load_part_f fa_port_load_part_f
#define fa_load_part_d fa_port_load_part_d
#define fa_store_part_f fa_port_store_part_f
#define fa_store_part_d fa_port_store_part_d
#define fa_hsum_f fa_port_hsum_f
#define fa_hsum_d fa_port_hsum_d
#define fa_hmax_f fa_port_hmax_f
#define fa_hmax_d fa_port_hmax_d
#define fa_transpose_f fa_port_transpose_f
#define fa_transpose_d fa_port_transpose_d
#define fa_transpose_add_f fa_port_transpose_add_f
#define fa_transpose_add_d fa_port_transpose_add_d
#define fa_transpose_u8x16 fa_port_transpose_u8x16

/* one AND and one add across the lanes (ADDV) instead of a loop over lanes */
static inline unsigned fa_lane_bits_f(fa_vi_f m)
{
    const uint32x4_t bit = {1, 2, 4, 8};
    return vaddvq_u32(vandq_u32(vreinterpretq_u32_s32(m), bit));
}

static inline unsigned fa_lane_bits_d(fa_vi_d m)
{
    const uint64x2_t bit = {1, 2};
    return (unsigned)vaddvq_u64(vandq_u64(vreinterpretq_u64_s64(m), bit));
}

/* 4 bytes (one 32-bit load) zero-extended by two UXTLs */
static inline fa_vi_f fa_widen_bytes_f(const uint8_t *b)
{
    uint32_t w;
    memcpy(&w, b, sizeof w);
    const uint8x8_t x = vreinterpret_u8_u32(vdup_n_u32(w));
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(x))));
}

#define fa_widen_bytes_d fa_port_widen_bytes_d

/* ---- storage types ---- */
static inline float fa_f16_to_f32(uint16_t h)
{
    __fp16 x;
    memcpy(&x, &h, sizeof x);
    return (float)x;                      /* FCVT s, h */
}

static inline uint16_t fa_f32_to_f16(float f)
{
    const __fp16 x = (__fp16)f;           /* FCVT h, s: round to nearest even, NaN quiet */
    uint16_t h;
    memcpy(&h, &x, sizeof h);
    return h;
}

static inline fa_v_f fa_load_f16(const uint16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));     /* FCVTL */
}

/* two 16-byte loads, FCVTL / FCVTL2 */
static inline void fa_load4_f16(const uint16_t *p, fa_v_f *v)
{
    const float16x8_t a = vreinterpretq_f16_u16(vld1q_u16(p)), b = vreinterpretq_f16_u16(vld1q_u16(p + 8));
    v[0] = vcvt_f32_f16(vget_low_f16(a));
    v[1] = vcvt_high_f32_f16(a);
    v[2] = vcvt_f32_f16(vget_low_f16(b));
    v[3] = vcvt_high_f32_f16(b);
}

static inline fa_v_f fa_load_part_f16(const uint16_t *p, int64_t n, float fill)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = i < n ? fa_f16_to_f32(p[i]) : fill;
    return fa_port_loadu_f(t);
}

static inline void fa_store_f16(uint16_t *p, fa_v_f x)
{
    vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x)));          /* FCVTN */
}

static inline fa_v_f fa_load_bf16(const uint16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));  /* SHLL #16 */
}

/* two 16-byte loads, SHLL / SHLL2 */
static inline void fa_load4_bf16(const uint16_t *p, fa_v_f *v)
{
    const uint16x8_t a = vld1q_u16(p), b = vld1q_u16(p + 8);
    v[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16));
    v[1] = vreinterpretq_f32_u32(vshll_high_n_u16(a, 16));
    v[2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16));
    v[3] = vreinterpretq_f32_u32(vshll_high_n_u16(b, 16));
}

#define fa_load_part_bf16 fa_port_load_part_bf16
#define fa_bf16_to_f32 fa_port_bf16_to_f32
#define fa_f32_to_bf16 fa_port_f32_to_bf16
#define fa_store_bf16 fa_port_store_bf16

/* 4 bytes (one 32-bit load into a vector register) sign-extended by two SXTLs,
 * then SCVTF */
static inline fa_v_f fa_load_i8(const int8_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    const int8x8_t x = vreinterpret_s8_u64(vcreate_u64(w));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(x))));
}

/* 16 bytes in one load, widened by SXTL / SXTL2 in two steps: 6 widenings for 4
 * vectors instead of 8 and one load instead of 4 */
static inline void fa_load4_i8(const int8_t *p, fa_v_f *v)
{
    const int8x16_t b = vld1q_s8(p);
    const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
    v[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    v[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    v[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    v[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

static inline fa_v_f fa_load_part_i8(const int8_t *p, int64_t n, float fill)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = i < n ? (float)p[i] : fill;
    return fa_port_loadu_f(t);
}

/* QuantizedKV codes: 4 bytes (one 32-bit load) zero-extended by two UXTLs, then
 * UCVTF; 4 bits: 2 bytes as one 16-bit value in every lane, lane e shifted right
 * by 4e (USHL by a negative count) and masked -- element 2i is the low nibble of
 * byte i, so the little-endian value holds element e at bits 4e..4e+3 */
static inline fa_v_f fa_load_u8(const uint8_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    const uint8x8_t x = vcreate_u8(w);
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(x))));
}

static inline fa_v_f fa_load_u4(const uint8_t *p)
{
    static const int32_t shifts[4] = {0, -4, -8, -12};
    uint16_t h;
    memcpy(&h, p, sizeof h);
    const uint32x4_t x = vshlq_u32(vdupq_n_u32(h), vld1q_s32(shifts));
    return vcvtq_f32_u32(vandq_u32(x, vdupq_n_u32(15)));
}

/* 8 codes from 4 bytes: the low and high nibbles (AND, USHR) zipped (ZIP1:
 * even element first), then UXTL twice and UCVTF */
static inline void fa_load2_u4(const uint8_t *p, fa_v_f *v)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    const uint8x8_t b = vcreate_u8(w), m = vdup_n_u8(15);
    const uint16x8_t c = vmovl_u8(vzip1_u8(vand_u8(b, m), vshr_n_u8(b, 4)));
    v[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(c)));
    v[1] = vcvtq_f32_u32(vmovl_high_u16(c));
}

#define fa_low4 fa_port_low4

/* ---- float8 through FCVTL, as on x86 with F16C (isa/x86_avx2.h): e5m2 is the
 * top byte of an IEEE half (SHLL #8); e4m3fn becomes the half s 0eeee mmm0000000
 * -- its value / 2^8, subnormals half subnormals -- by SHLL #8, SSHR #1 (the sign
 * lands in bits 15 and 14) and clearing bit 14, magnitude 0x7f (NaN) replaced by
 * the half NaN 0x7e00 (AND + CMEQ + BSL).  Eight elements take 6
 * vector operations and two FCVTLs, against about 12 per 4 for the portable bit
 * arithmetic; e4m3's raw reads (widen.h) skip the multiplication by 2^8 ---- */
static inline uint16x8_t fa_f8e4_halves_(uint16x8_t s)      /* s: bytes shifted left by 8 */
{
    const uint16x8_t h = vandq_u16(vreinterpretq_u16_s16(vshrq_n_s16(vreinterpretq_s16_u16(s), 1)),
                                   vdupq_n_u16(0xbfff));
    const uint16x8_t nan = vceqq_u16(vandq_u16(s, vdupq_n_u16(0x7f00)), vdupq_n_u16(0x7f00));
    return vbslq_u16(nan, vdupq_n_u16(0x7e00), h);
}

static inline float16x8_t fa_f8e4_halves8_(uint8x8_t b)
{
    return vreinterpretq_f16_u16(fa_f8e4_halves_(vshll_n_u8(b, 8)));
}

static inline uint8x8_t fa_bytes4_(const uint8_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return vcreate_u8(w);
}

#define FA_F8E4_RAW_FACTOR 256.0f

static inline fa_v_f fa_load_f8e4_raw(const uint8_t *p)
{
    return vcvt_f32_f16(vget_low_f16(fa_f8e4_halves8_(fa_bytes4_(p))));
}

static inline void fa_load2_f8e4_raw(const uint8_t *p, fa_v_f *v)
{
    const float16x8_t h = fa_f8e4_halves8_(vld1_u8(p));
    v[0] = vcvt_f32_f16(vget_low_f16(h));
    v[1] = vcvt_high_f32_f16(h);
}

static inline void fa_load4_f8e4_raw(const uint8_t *p, fa_v_f *v)
{
    const uint8x16_t b = vld1q_u8(p);
    const float16x8_t lo = vreinterpretq_f16_u16(fa_f8e4_halves_(vshll_n_u8(vget_low_u8(b), 8)));
    const float16x8_t hi = vreinterpretq_f16_u16(fa_f8e4_halves_(vshll_high_n_u8(b, 8)));
    v[0] = vcvt_f32_f16(vget_low_f16(lo));
    v[1] = vcvt_high_f32_f16(lo);
    v[2] = vcvt_f32_f16(vget_low_f16(hi));
    v[3] = vcvt_high_f32_f16(hi);
}

static inline fa_v_f fa_load_f8e4(const uint8_t *p)
{
    return vmulq_n_f32(fa_load_f8e4_raw(p), FA_F8E4_RAW_FACTOR);
}

static inline void fa_load4_f8e4(const uint8_t *p, fa_v_f *v)
{
    fa_load4_f8e4_raw(p, v);
    for (int i = 0; i < 4; i++) v[i] = vmulq_n_f32(v[i], FA_F8E4_RAW_FACTOR);
}

static inline fa_v_f fa_load_f8e5(const uint8_t *p)
{
    return vcvt_f32_f16(vget_low_f16(vreinterpretq_f16_u16(vshll_n_u8(fa_bytes4_(p), 8))));
}

static inline void fa_load2_f8e5(const uint8_t *p, fa_v_f *v)
{
    const float16x8_t h = vreinterpretq_f16_u16(vshll_n_u8(vld1_u8(p), 8));
    v[0] = vcvt_f32_f16(vget_low_f16(h));
    v[1] = vcvt_high_f32_f16(h);
}
#define fa_load2_f8e5 fa_load2_f8e5

static inline void fa_load4_f8e5(const uint8_t *p, fa_v_f *v)
{
    fa_load2_f8e5(p, v);
    fa_load2_f8e5(p + 8, v + 2);
}

#define fa_f8e4_to_f32 fa_port_f8e4_to_f32
#define fa_f8e5_to_f32 fa_port_f8e5_to_f32
#define fa_load_part_f8e4 fa_port_load_part_f8e4
#define fa_load_part_f8e5 fa_port_load_part_f8e5

#endif /* FASTATTN_ISA_TARGET_H */
