/* ISA target: x86-64-v4 + AVX512_BF16 + AMX-TILE / AMX-BF16 (Sapphire Rapids and
 * later Xeons).  Everything of isa/x86_avx512_bf16.h, plus the tile registers
 * that amx_tiles.h builds the query-vectorised unit's bfloat16 Q.K^T and P.V
 * on.  On these Intel cores VDPBF16PS issues on one port where the float32 FMA
 * has two, so the pair dot products serve only the tiles' leftovers: the
 * few-rows unit and the backward widen bfloat16 as the avx512 variant does
 * (FA_AMX in row_unit.pxi and backward.pxi).  Included once by simd.h. */
#include "x86_avx512_bf16.h"

/* GCC spells the macros __AMX_TILE__ / __AMX_BF16__, clang __AMXTILE__ / __AMXBF16__ */
#if !(defined(__AMX_TILE__) || defined(__AMXTILE__)) || !(defined(__AMX_BF16__) || defined(__AMXBF16__))
#  error "isa/x86_avx512_amx.h needs -mamx-tile -mamx-bf16"
#endif
#undef FA_TARGET
#define FA_TARGET "x86_avx512_amx"
#define FA_HAVE_AMX 1
