/* ISA target: any CPU, GNU C vector extensions only, 16-byte vectors: the
 * portable primitives of isa/portable.h, nothing else.  The `baseline` variant
 * off x86; also the default when no FA_ISA_HEADER is given.  Included once by
 * simd.h. */
#ifndef FASTATTN_ISA_TARGET_H
#define FASTATTN_ISA_TARGET_H

#define FA_TARGET "generic"
#define FA_VBYTES 16
#define FA_WF 4
#define FA_WD 2

/* Register blocking (simd.h explains each): shapes that fit 16 registers */
#define FA_QK_MR 4
#define FA_QK_NV 2
#define FA_PV_MR 2
#define FA_PV_NV 4
#define FA_QVEC_NV 2
#define FA_QVEC_MR 6
#define FA_QVEC_MR2 6
#define FA_QVEC_MR1 8

#include "portable.h"

#define fa_vmax_f fa_port_vmax_f
#define fa_vmax_d fa_port_vmax_d
#define fa_lane_bits_f fa_port_lane_bits_f
#define fa_lane_bits_d fa_port_lane_bits_d
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

#endif /* FASTATTN_ISA_TARGET_H */
