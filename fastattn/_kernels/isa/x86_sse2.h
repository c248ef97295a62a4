/* ISA target: x86-64 baseline (SSE2), 16-byte vectors: the portable primitives,
 * with SSE2's max and movemask.  Included once by simd.h (setup.py names it in
 * FA_ISA_HEADER). */
#ifndef FASTATTN_ISA_TARGET_H
#define FASTATTN_ISA_TARGET_H

#define FA_TARGET "x86_sse2"
#define FA_VBYTES 16
#define FA_WF 4
#define FA_WD 2

/* Register blocking (simd.h explains each): 16 xmm registers */
#define FA_QK_MR 4
#define FA_QK_NV 2
#define FA_PV_MR 2
#define FA_PV_NV 4
#define FA_QVEC_NV 2
#define FA_QVEC_MR 6
#define FA_QVEC_MR2 6
#define FA_QVEC_MR1 8

#include <emmintrin.h>
#include "portable.h"

static inline fa_v_f fa_vmax_f(fa_v_f a, fa_v_f b) { return (fa_v_f)_mm_max_ps((__m128)a, (__m128)b); }
static inline fa_v_d fa_vmax_d(fa_v_d a, fa_v_d b) { return (fa_v_d)_mm_max_pd((__m128d)a, (__m128d)b); }
static inline unsigned fa_lane_bits_f(fa_vi_f m) { return (unsigned)_mm_movemask_ps((__m128)m); }
static inline unsigned fa_lane_bits_d(fa_vi_d m) { return (unsigned)_mm_movemask_pd((__m128d)m); }

#define fa_load_part_f fa_port_load_part_f
#define fa_load_part_d fa_port_load_part_d
#define fa_store_part_f fa_port_store_part_f
#define fa_store_part_d fa_port_store_part_d
#define fa_widen_bytes_f fa_port_widen_bytes_f
#define fa_widen_bytes_d fa_port_widen_bytes_d
#define fa_hsum_f fa_port_hsum_f
#define fa_hsum_d fa_port_hsum_d
#define fa_hmax_f fa_port_hmax_f
#define fa_hmax_d fa_port_hmax_d
#define fa_transpose_f fa_port_transpose_f
#define fa_transpose_d fa_port_transpose_d
#define fa_transpose_add_f fa_port_transpose_add_f
#define fa_transpose_add_d fa_port_transpose_add_d
#define fa_transpose_u8x16 fa_port_transpose_u8x16

#define fa_f16_to_f32 fa_port_f16_to_f32
#define fa_f32_to_f16 fa_port_f32_to_f16
#define fa_load_f16 fa_port_load_f16
#define fa_load_part_f16 fa_port_load_part_f16
#define fa_store_f16 fa_port_store_f16
#define fa_bf16_to_f32 fa_port_bf16_to_f32
#define fa_f32_to_bf16 fa_port_f32_to_bf16
#define fa_load_bf16 fa_port_load_bf16
#define fa_load_part_bf16 fa_port_load_part_bf16
#define fa_store_bf16 fa_port_store_bf16
#define fa_load_i8 fa_port_load_i8
#define fa_load_part_i8 fa_port_load_part_i8

#define fa_load4_f16(p, v) FA_LOAD4_BY_ONE(fa_load_f16, p, v, FA_WF)
#define fa_load4_bf16(p, v) FA_LOAD4_BY_ONE(fa_load_bf16, p, v, FA_WF)
#define fa_load4_i8(p, v) FA_LOAD4_BY_ONE(fa_load_i8, p, v, FA_WF)

/* float8: the portable bit arithmetic (isa/portable.h) */
#define fa_f8e4_to_f32 fa_port_f8e4_to_f32
#define fa_f8e5_to_f32 fa_port_f8e5_to_f32
#define fa_load_f8e4 fa_port_load_f8e4
#define fa_load_f8e5 fa_port_load_f8e5
#define fa_load_part_f8e4 fa_port_load_part_f8e4
#define fa_load_part_f8e5 fa_port_load_part_f8e5
#define fa_load4_f8e4(p, v) FA_LOAD4_BY_ONE(fa_load_f8e4, p, v, FA_WF)
#define fa_load4_f8e5(p, v) FA_LOAD4_BY_ONE(fa_load_f8e5, p, v, FA_WF)

/* QuantizedKV codes: the portable vector code (isa/portable.h) */
#define fa_load_u8 fa_port_load_u8
#define fa_load_u4 fa_port_load_u4
#define fa_load2_u4 fa_port_load2_u4
#define fa_low4 fa_port_low4

/* streaming stores (MOVNTPS / MOVNTPD) of whole vectors to aligned addresses,
 * and the store fence after them (simd.h: fa_stream_f) */
#define FA_HAVE_STREAM 1
static inline void fa_stream_f(float *p, fa_v_f x) { _mm_stream_ps(p, (__m128)x); }
static inline void fa_stream_d(double *p, fa_v_d x) { _mm_stream_pd(p, (__m128d)x); }
static inline void fa_stream_fence(void) { _mm_sfence(); }

#endif /* FASTATTN_ISA_TARGET_H */
