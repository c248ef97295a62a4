/* The ISA seam's portable layer: every primitive the kernels take from a target,
 * written with GNU C vector extensions only (vector types, lane-wise operators,
 * __builtin_convertvector, constant shuffles), so it compiles for any CPU with
 * GCC >= 5 or clang.  Each target header (x86_avx512.h, x86_avx2.h, x86_sse2.h,
 * neon.h, generic.h) defines FA_VBYTES, FA_WF and FA_WD, includes this file, and
 * then gives every primitive below its name without the "port_" -- its own
 * version where the instruction set has a better one, else the portable one
 * (`#define fa_hsum_f fa_port_hsum_f`).  The kernel bodies call only those
 * names, so they name no instruction set.
 *
 * Per compute type (float: _f, W = FA_WF lanes; double: _d, W = FA_WD lanes;
 * portable_typed.h, included once per type):
 *   fa_vmax(a, b)            a > b ? a : b lane-wise (a NaN in either lane gives b)
 *   fa_load_part(p, n, fill) p[0:n], lanes from n on = fill; p[n:] is not read
 *   fa_store_part(p, v, n)   p[0:n] = the first n lanes of v
 *   fa_hsum(v), fa_hmax(v)   butterfly over the lanes (a fixed order)
 *   fa_lane_bits(m)          the lanes of a comparison mask as the low W bits
 *   fa_transpose(r)          W x W block of W vectors, transposed in place
 *   fa_transpose_add(r)      r[0] lane x = fa_hsum(r[x]) for all W vectors at once
 *   fa_widen_bytes(b)        W bytes zero-extended to the lanes of an integer vector
 * Storage types, widened to float exactly (float compute only):
 *   fa_f16_to_f32 / fa_f32_to_f16 (scalar, round to nearest even), fa_load_f16 (W
 *   lanes), fa_load4_f16 (4 W lanes: v[0..3], one wide load where that is cheaper
 *   than four narrow ones), fa_load_part_f16, fa_store_f16; the same for bf16;
 *   fa_load_i8, fa_load4_i8, fa_load_part_i8; float8 (ml_dtypes float8_e4m3fn:
 *   bias 7, no inf, NaN = 0x7f / 0xff; float8_e5m2: bias 15, the top byte of an
 *   IEEE half): fa_f8e4_to_f32 / fa_f8e5_to_f32 (scalar), fa_load_f8e4,
 *   fa_load_part_f8e4, fa_load4_f8e4, the same for f8e5.
 *   QuantizedKV codes: fa_load_u8 (W codes from W bytes), fa_load_u4 (W 4-bit
 *   codes from W / 2 bytes, the even element in the low nibble), fa_load2_u4
 *   (2 W 4-bit codes from W bytes into v[0], v[1]), fa_low4 (the low 4 bits
 *   of each 32-bit lane of a fa_u32_wf, as float).
 * Byte masks: fa_transpose_u8x16(r), 16 rows of 16 bytes transposed in place.
 * Not a standalone header. */
#ifndef FASTATTN_ISA_PORTABLE_H
#define FASTATTN_ISA_PORTABLE_H

#include <stdint.h>
#include <string.h>

#if !defined(FA_VBYTES) || !defined(FA_WF) || !defined(FA_WD)
#  error "a target header defines FA_VBYTES, FA_WF and FA_WD before including isa/portable.h"
#endif

typedef float fa_v_f __attribute__((vector_size(FA_VBYTES)));
typedef int32_t fa_vi_f __attribute__((vector_size(FA_VBYTES)));
typedef double fa_v_d __attribute__((vector_size(FA_VBYTES)));
typedef int64_t fa_vi_d __attribute__((vector_size(FA_VBYTES)));
typedef uint8_t fa_u8x16 __attribute__((vector_size(16)));

#if defined(__clang__)
#  define FA_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#  define FA_UNROLL _Pragma("GCC unroll 16")
#else
#  define FA_UNROLL
#endif

/* Two-source shuffle with constant lane indices (0..W-1: a, W..2W-1: b) into a
 * vector of a's type; VI is the integer vector of a's size and lane count.
 * clang and GCC >= 12 have __builtin_shufflevector; older GCC takes the indices
 * as a constant vector. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#  define FA_SHUF2(VI, a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#  define FA_SHUF2(VI, a, b, ...) __builtin_shuffle(a, b, (VI){__VA_ARGS__})
#endif

/* Lane indices for W lanes and step h: FA_XOR_W_h lane c ^ h (the butterfly);
 * FA_TRA_W_h / FA_TRB_W_h the two halves of transpose step h: TRA takes lane c of
 * a where c & h == 0, else lane c - h of b; TRB lane c + h of a, else lane c of b
 * (the off-diagonal h x h blocks of every 2h x 2h block swap). */
#define FA_XOR_2_1 1, 0
#define FA_TRA_2_1 0, 2
#define FA_TRB_2_1 1, 3
#define FA_XOR_4_2 2, 3, 0, 1
#define FA_TRA_4_2 0, 1, 4, 5
#define FA_TRB_4_2 2, 3, 6, 7
#define FA_XOR_4_1 1, 0, 3, 2
#define FA_TRA_4_1 0, 4, 2, 6
#define FA_TRB_4_1 1, 5, 3, 7
#define FA_XOR_8_4 4, 5, 6, 7, 0, 1, 2, 3
#define FA_TRA_8_4 0, 1, 2, 3, 8, 9, 10, 11
#define FA_TRB_8_4 4, 5, 6, 7, 12, 13, 14, 15
#define FA_XOR_8_2 2, 3, 0, 1, 6, 7, 4, 5
#define FA_TRA_8_2 0, 1, 8, 9, 4, 5, 12, 13
#define FA_TRB_8_2 2, 3, 10, 11, 6, 7, 14, 15
#define FA_XOR_8_1 1, 0, 3, 2, 5, 4, 7, 6
#define FA_TRA_8_1 0, 8, 2, 10, 4, 12, 6, 14
#define FA_TRB_8_1 1, 9, 3, 11, 5, 13, 7, 15
#define FA_XOR_16_8 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7
#define FA_TRA_16_8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define FA_TRB_16_8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define FA_XOR_16_4 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11
#define FA_TRA_16_4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define FA_TRB_16_4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define FA_XOR_16_2 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13
#define FA_TRA_16_2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define FA_TRB_16_2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define FA_XOR_16_1 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14
#define FA_TRA_16_1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define FA_TRB_16_1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#define FA_CAT2_(a, b) a##b
#define FA_CAT2(a, b) FA_CAT2_(a, b)
#define FA_CAT3_(a, b, c) a##b##_##c
#define FA_CAT3(a, b, c) FA_CAT3_(a, b, c)
/* STEP(W, h, x) for h = W/2, W/4, ..., 1 */
#define FA_STEPS_2(STEP, x) STEP(2, 1, x)
#define FA_STEPS_4(STEP, x) STEP(4, 2, x) STEP(4, 1, x)
#define FA_STEPS_8(STEP, x) STEP(8, 4, x) STEP(8, 2, x) STEP(8, 1, x)
#define FA_STEPS_16(STEP, x) STEP(16, 8, x) STEP(16, 4, x) STEP(16, 2, x) STEP(16, 1, x)
#define FA_STEPS(W, STEP, x) FA_CAT2(FA_STEPS_, W)(STEP, x)

/* 16 rows of 16 bytes, transposed in place: four rounds of interleaving row i
 * with row i + 8 byte by byte (after round s, byte b of row r holds element
 * (b's and r's index bits rotated by s)), 64 two-source byte shuffles
 * (punpck{l,h}bw, zip1/zip2) for 256 bytes instead of 256 scalar loads and
 * stores.  The boolean mask of the query-vectorised path: rows are queries,
 * columns keys. */
static inline __attribute__((always_inline)) void fa_port_transpose_u8x16(fa_u8x16 *r)
{
    FA_UNROLL for (int s = 0; s < 4; s++) {
        fa_u8x16 n[16];
        FA_UNROLL for (int i = 0; i < 8; i++) {
            n[2 * i] = FA_SHUF2(fa_u8x16, r[i], r[i + 8], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            n[2 * i + 1] = FA_SHUF2(fa_u8x16, r[i], r[i + 8], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        }
        FA_UNROLL for (int i = 0; i < 16; i++) r[i] = n[i];
    }
}

/* ---- the per-type primitives ---- */
#define FA_PT float
#define FA_PV fa_v_f
#define FA_PVI fa_vi_f
#define FA_PIT int32_t
#define FA_PW FA_WF
#define FA_PSFX(name) name##_f
#include "portable_typed.h"
#undef FA_PT
#undef FA_PV
#undef FA_PVI
#undef FA_PIT
#undef FA_PW
#undef FA_PSFX
#define FA_PT double
#define FA_PV fa_v_d
#define FA_PVI fa_vi_d
#define FA_PIT int64_t
#define FA_PW FA_WD
#define FA_PSFX(name) name##_d
#include "portable_typed.h"
#undef FA_PT
#undef FA_PV
#undef FA_PVI
#undef FA_PIT
#undef FA_PW
#undef FA_PSFX

/* ---- storage types (float compute) ---- */

/* four consecutive vectors of W lanes by four single loads: v[i] = LOAD(p + i *
 * W), for targets whose wide loads gain nothing (#define fa_load4_f16(p, v)
 * FA_LOAD4_BY_ONE(fa_load_f16, p, v, FA_WF)) */
#define FA_LOAD4_BY_ONE(LOAD, p, v, W)                                           \
    do {                                                                        \
        (v)[0] = LOAD(p);                                                       \
        (v)[1] = LOAD((p) + (W));                                               \
        (v)[2] = LOAD((p) + 2 * (W));                                           \
        (v)[3] = LOAD((p) + 3 * (W));                                           \
    } while (0)

/* two consecutive vectors by two loads (widen.h's default fa_load2_raw) */
#define FA_LOAD2_BY_ONE(LOAD, p, v, W)                                           \
    do {                                                                        \
        (v)[0] = LOAD(p);                                                       \
        (v)[1] = LOAD((p) + (W));                                               \
    } while (0)

/* IEEE binary16 -> binary32, every value exact (subnormals normalised) */
static inline float fa_port_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);                /* inf, NaN (payload kept) */
    } else if (e) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else if (m) {
        uint32_t shifts = 0;
        while (!(m & 0x400u)) {
            m <<= 1;
            shifts++;
        }
        bits = sign | ((113 - shifts) << 23) | ((m & 0x3ffu) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float32 -> IEEE half, rounded to nearest even (overflow to inf, subnormals,
 * NaN kept quiet) */
static inline uint16_t fa_port_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)                                   /* inf, NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* >= 65520: rounds to inf */
    if (ax >= 0x38800000u) {                                 /* normal half */
        const uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((r >> 13) - (112u << 10)));
    }
    if (ax < 0x33000000u) return (uint16_t)sign;             /* < 2^-25: rounds to 0 */
    const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, s = 126 - e;   /* 14 <= s <= 24 */
    uint32_t q = m >> s;
    const uint32_t rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

static inline fa_v_f fa_port_load_f16(const uint16_t *p)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = fa_port_f16_to_f32(p[i]);
    return fa_port_loadu_f(t);
}

static inline fa_v_f fa_port_load_part_f16(const uint16_t *p, int64_t n, float fill)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = i < n ? fa_port_f16_to_f32(p[i]) : fill;
    return fa_port_loadu_f(t);
}

static inline void fa_port_store_f16(uint16_t *p, fa_v_f x)
{
    for (int i = 0; i < FA_WF; i++) p[i] = fa_port_f32_to_f16(x[i]);
}

/* bfloat16: the upper half of a float32's bits */
typedef uint16_t fa_u16_wf __attribute__((vector_size(FA_WF * 2)));
typedef uint32_t fa_u32_wf __attribute__((vector_size(FA_VBYTES)));

static inline float fa_port_bf16_to_f32(uint16_t h)
{
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float32 -> bfloat16, rounded to nearest even (NaN kept, made quiet) */
static inline uint16_t fa_port_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline fa_v_f fa_port_load_bf16(const uint16_t *p)
{
    fa_u16_wf h;
    memcpy(&h, p, sizeof h);
    return (fa_v_f)(__builtin_convertvector(h, fa_u32_wf) << 16);
}

static inline fa_v_f fa_port_load_part_bf16(const uint16_t *p, int64_t n, float fill)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = i < n ? fa_port_bf16_to_f32(p[i]) : fill;
    return fa_port_loadu_f(t);
}

/* W lanes rounded as fa_port_f32_to_bf16, lane-wise */
static inline void fa_port_store_bf16(uint16_t *p, fa_v_f x)
{
    const fa_u32_wf u = (fa_u32_wf)x;
    const fa_u32_wf r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const fa_u32_wf qnan = (u >> 16) | 0x40u;
    const fa_u32_wf isnan = (fa_u32_wf)((u & 0x7fffffffu) > 0x7f800000u);
    const fa_u16_wf b = __builtin_convertvector((r & ~isnan) | (qnan & isnan), fa_u16_wf);
    memcpy(p, &b, sizeof b);
}

/* int8: sign extension and an exact int-to-float conversion */
typedef int8_t fa_i8_wf __attribute__((vector_size(FA_WF)));

static inline fa_v_f fa_port_load_i8(const int8_t *p)
{
    fa_i8_wf b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(__builtin_convertvector(b, fa_vi_f), fa_v_f);
}

static inline fa_v_f fa_port_load_part_i8(const int8_t *p, int64_t n, float fill)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = i < n ? (float)p[i] : fill;
    return fa_port_loadu_f(t);
}

/* Codes of a QuantizedKV (unsigned, exact as float32): fa_load_u8, W 8-bit
 * codes from W bytes, zero-extended and converted; fa_load_u4, W 4-bit codes
 * from W / 2 bytes, element 2i in the low nibble of byte i and 2i + 1 in its
 * high nibble (p at the byte of an even element).  Portable: lane e takes byte
 * e / 2 shifted by 4 (e % 2), a vector shift and mask. */
typedef uint8_t fa_u8_wf __attribute__((vector_size(FA_WF)));

static inline fa_v_f fa_port_load_u8(const uint8_t *p)
{
    fa_u8_wf b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(__builtin_convertvector(b, fa_vi_f), fa_v_f);
}

static inline fa_v_f fa_port_load_u4(const uint8_t *p)
{
    fa_vi_f w, sh;
    for (int e = 0; e < FA_WF; e++) {
        w[e] = p[e >> 1];
        sh[e] = (e & 1) * 4;
    }
    return __builtin_convertvector((w >> sh) & 15, fa_v_f);
}

/* the low 4 bits of each 32-bit lane, as float: a mask and a conversion */
static inline fa_v_f fa_port_low4(fa_u32_wf x)
{
    return __builtin_convertvector((fa_vi_f)(x & 15), fa_v_f);
}

/* 2 W 4-bit codes from W bytes: v[0], v[1] */
static inline void fa_port_load2_u4(const uint8_t *p, fa_v_f *v)
{
    v[0] = fa_port_load_u4(p);
    v[1] = fa_port_load_u4(p + FA_WF / 2);
}

/* float8: the bytes zero-extended to 32-bit lanes, then bit arithmetic on all
 * lanes at once (no per-element branch): a normal value's exponent and mantissa
 * bits moved into float32 position with the exponent rebiased; a subnormal one
 * (exponent field 0) converted from its integer mantissa and scaled by a power
 * of two (exact, and no float32 subnormal is ever formed: those cost microcode
 * assists on x86); e4m3fn's NaN (magnitude 0x7f) and e5m2's inf / NaN (exponent
 * 31) selected in.  Every value exact. */
typedef uint8_t fa_u8_wf __attribute__((vector_size(FA_WF)));

static inline fa_u32_wf fa_port_bytes_u32(const uint8_t *p)
{
    fa_u8_wf b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, fa_u32_wf);
}

/* x: one byte per lane.  EB exponent bits, MB mantissa bits (EB + MB = 7), BIAS */
#define FA_F8_LANES(x, MB, BIAS, SUBSCALE)                                                      \
    const fa_u32_wf mag = (x) & 0x7fu, sign = ((x) & 0x80u) << 24;                             \
    const fa_u32_wf norm = (mag << (23 - (MB))) + ((uint32_t)(127 - (BIAS)) << 23);              \
    const fa_v_f subv = __builtin_convertvector((fa_vi_f)(mag & ((1u << (MB)) - 1)), fa_v_f) * (SUBSCALE); \
    const fa_u32_wf is_sub = (fa_u32_wf)(mag < (1u << (MB)));                                  \
    fa_u32_wf bits = (norm & ~is_sub) | ((fa_u32_wf)subv & is_sub)

/* e4m3fn: subnormals m * 2^-9, NaN at magnitude 0x7f (no inf) */
static inline fa_v_f fa_port_f8e4_lanes(fa_u32_wf x)
{
    FA_F8_LANES(x, 3, 7, 0x1p-9f);
    const fa_u32_wf is_nan = (fa_u32_wf)(mag == 0x7fu);
    bits = (bits & ~is_nan) | (0x7fc00000u & is_nan);
    return (fa_v_f)(bits | sign);
}

/* e5m2: subnormals m * 2^-16, exponent 31: inf (mantissa 0) or NaN */
static inline fa_v_f fa_port_f8e5_lanes(fa_u32_wf x)
{
    FA_F8_LANES(x, 2, 15, 0x1p-16f);
    const fa_u32_wf is_special = (fa_u32_wf)(mag >= 0x7cu);
    bits = (bits & ~is_special) | (((mag << 21) | 0x7f800000u) & is_special);
    return (fa_v_f)(bits | sign);
}
#undef FA_F8_LANES

static inline float fa_port_f8e4_to_f32(uint8_t b)
{
    const uint32_t mag = b & 0x7fu, e = mag >> 3, m = mag & 7u;
    float f;
    if (mag == 0x7fu) {
        f = __builtin_nanf("");
    } else if (e) {
        const uint32_t bits = (mag << 20) + (120u << 23);
        memcpy(&f, &bits, sizeof f);
    } else {
        f = (float)m * 0x1p-9f;
    }
    return (b & 0x80u) ? -f : f;
}

static inline float fa_port_f8e5_to_f32(uint8_t b)
{
    return fa_port_f16_to_f32((uint16_t)(b << 8));
}

static inline fa_v_f fa_port_load_f8e4(const uint8_t *p) { return fa_port_f8e4_lanes(fa_port_bytes_u32(p)); }
static inline fa_v_f fa_port_load_f8e5(const uint8_t *p) { return fa_port_f8e5_lanes(fa_port_bytes_u32(p)); }

static inline fa_v_f fa_port_load_part_f8e4(const uint8_t *p, int64_t n, float fill)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = i < n ? fa_port_f8e4_to_f32(p[i]) : fill;
    return fa_port_loadu_f(t);
}

static inline fa_v_f fa_port_load_part_f8e5(const uint8_t *p, int64_t n, float fill)
{
    float t[FA_WF];
    for (int i = 0; i < FA_WF; i++) t[i] = i < n ? fa_port_f8e5_to_f32(p[i]) : fill;
    return fa_port_loadu_f(t);
}

#endif /* FASTATTN_ISA_PORTABLE_H */
