/* Load-and-widen: elements of the storage type FA_S (how q, k, v or a bias are
 * stored by the caller) as the compute type FA_T, in registers -- a vector of
 * FA_W elements, a partial vector, one scalar -- and the prefetch hints over
 * rows of FA_S.  stored_reads.h reads every stored row through these, so a
 * storage type is one more set of these functions (and one more inclusion of
 * widen.h and stored_reads.h in simd_body.h with its FA_S and FA_SSFX), not a
 * copy of the kernels.
 *
 *   FA_S_NATIVE  FA_S = FA_T (float32 or float64): plain loads
 *   FA_S_F16     IEEE half (uint16_t bits): F16C vcvtph2ps on AVX2 / AVX-512,
 *                FCVTL on NEON, a bit-exact software conversion elsewhere
 *   FA_S_BF16    bfloat16 (uint16_t bits): the bits shifted into the high half
 *   FA_S_I8      int8: sign extension and an int-to-float conversion (exact)
 *   FA_S_F8E4    float8_e4m3fn (uint8_t bits): F16C on x86 (the byte as a half
 *                with a rebiased exponent, times 2^8), bit arithmetic elsewhere
 *   FA_S_F8E5    float8_e5m2 (uint8_t bits): the top byte of a half (F16C on
 *                x86), bit arithmetic elsewhere
 *
 * The instructions come from the target header (fa_load_f16, fa_load_bf16,
 * fa_load_i8 and their partial and scalar forms: isa/portable.h); here each
 * storage type only picks its set.
 *
 * Every conversion is exact (each value of the storage type is a float32
 * value), so the kernels compute on exactly the stored values.
 * Part of the per-type body (simd_body.h).  Not a standalone header. */

#if FA_S_NATIVE
static inline FA_V FA_SSFX(fa_load_s)(const FA_S *p)
{
    return FA_SFX(fa_load)(p);
}

static inline FA_V FA_SSFX(fa_load_part_s)(const FA_S *p, int64_t n, FA_T fill)
{
    return FA_SFX(fa_load_part)(p, n, fill);
}

static inline FA_T FA_SSFX(fa_scalar_s)(FA_S x)
{
    return x;
}

static inline void FA_SSFX(fa_store_s)(FA_S *p, FA_V x)
{
    FA_SFX(fa_store)(p, x);
}

static inline void FA_SSFX(fa_load4_s)(const FA_S *p, FA_V *v)
{
    FA_LOAD4_BY_ONE(FA_SFX(fa_load), p, v, FA_W);
}

static inline FA_S FA_SSFX(fa_narrow_s)(FA_T x)
{
    return x;
}
#else
/* the storage type's primitives from the target header (isa/portable.h) */
#if FA_S_F16
#  define FA_S_TO_F32 fa_f16_to_f32
#  define FA_S_LOAD fa_load_f16
#  define FA_S_LOAD_PART fa_load_part_f16
#  define FA_S_LOAD4 fa_load4_f16
#elif FA_S_BF16
#  define FA_S_TO_F32 fa_bf16_to_f32
#  define FA_S_LOAD fa_load_bf16
#  define FA_S_LOAD_PART fa_load_part_bf16
#  define FA_S_LOAD4 fa_load4_bf16
#elif FA_S_I8
#  define FA_S_TO_F32 (float)
#  define FA_S_LOAD fa_load_i8
#  define FA_S_LOAD_PART fa_load_part_i8
#  define FA_S_LOAD4 fa_load4_i8
#elif FA_S_F8E4
#  define FA_S_TO_F32 fa_f8e4_to_f32
#  define FA_S_LOAD fa_load_f8e4
#  define FA_S_LOAD_PART fa_load_part_f8e4
#  define FA_S_LOAD4 fa_load4_f8e4
#elif FA_S_F8E5
#  define FA_S_TO_F32 fa_f8e5_to_f32
#  define FA_S_LOAD fa_load_f8e5
#  define FA_S_LOAD_PART fa_load_part_f8e5
#  define FA_S_LOAD4 fa_load4_f8e5
#endif

static inline float FA_SSFX(fa_scalar_s)(FA_S x)
{
    return FA_S_TO_F32(x);
}

/* FA_W elements: one widening instruction sequence where the ISA has it */
static inline FA_V FA_SSFX(fa_load_s)(const FA_S *p)
{
    return FA_S_LOAD(p);
}

/* p[0:n] widened, lanes from n on = fill (0 <= n <= W); lanes past n are not read */
static inline FA_V FA_SSFX(fa_load_part_s)(const FA_S *p, int64_t n, FA_T fill)
{
    return FA_S_LOAD_PART(p, n, fill);
}
/* 4 consecutive vectors (a target may load them in one go) */
static inline void FA_SSFX(fa_load4_s)(const FA_S *p, FA_V *v)
{
    FA_S_LOAD4(p, v);
}
#undef FA_S_TO_F32
#undef FA_S_LOAD
#undef FA_S_LOAD_PART
#undef FA_S_LOAD4

#if FA_S_F16
/* float32 -> IEEE half, rounded to nearest even (overflow to inf, subnormals,
 * NaN kept quiet) */
static inline uint16_t FA_SSFX(fa_narrow_s)(float f)
{
    return fa_f32_to_f16(f);
}

static inline void FA_SSFX(fa_store_s)(uint16_t *p, FA_V x)
{
    fa_store_f16(p, x);
}
#elif FA_S_BF16
/* float32 -> bfloat16, rounded to nearest even (NaN kept, made quiet) */
static inline uint16_t FA_SSFX(fa_narrow_s)(float f)
{
    return fa_f32_to_bf16(f);
}

static inline void FA_SSFX(fa_store_s)(uint16_t *p, FA_V x)
{
    fa_store_bf16(p, x);
}
#endif

#endif /* FA_S_NATIVE */

static inline void FA_SSFX(fa_prefetch_s)(const FA_S *p, int64_t n)
{
    fa_prefetch_bytes(p, n * (int64_t)sizeof(FA_S));
}

static inline int64_t FA_SSFX(fa_pf_rows_s)(int64_t row_elems)
{
    return fa_pf_rows_bytes(row_elems * (int64_t)sizeof(FA_S));
}
