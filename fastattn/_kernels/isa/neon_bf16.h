/* ISA target: AArch64 with the ARMv8.6 bfloat16 extension (FEAT_BF16; also
 * FP16, dot products, I8MM: Graviton3 / 4, Neoverse N2 / V1 / V2, Apple M2 and
 * later).  Everything of isa/neon.h, plus the bfloat16 pair dot product BFDOT
 * that bf16_dot.h builds the query-vectorised Q.K^T of bfloat16 queries and
 * keys on.  Included once by simd.h. */
#include "neon.h"

#if !defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#  error "isa/neon_bf16.h needs -march=armv8.2-a+bf16 (or armv8.6-a)"
#endif
#undef FA_TARGET
#define FA_TARGET "neon_bf16"

/* acc[i] += a.bf16[2i] * b.bf16[2i] + a.bf16[2i+1] * b.bf16[2i+1] (BFDOT: the
 * products exact, the sum of a pair and the accumulation in float32; without
 * FEAT_EBF16 it rounds to odd and flushes subnormals, docs/kernels.rst) */
#define FA_HAVE_BF16_DOT 1
static inline fa_v_f fa_bf16_dot2_f(fa_v_f acc, fa_vi_f a, fa_vi_f b)
{
    return (fa_v_f)vbfdotq_f32((float32x4_t)acc, vreinterpretq_bf16_s32((int32x4_t)a),
                               vreinterpretq_bf16_s32((int32x4_t)b));
}

