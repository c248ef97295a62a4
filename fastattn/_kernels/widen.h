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
#define FA_S_RAW_FACTOR 1
#define FA_S_LOAD2_ONE 0
#define FA_S_LOAD_RAW FA_SSFX(fa_load_s)
#define FA_S_LOAD2_RAW(p, v) FA_LOAD2_BY_ONE(FA_SSFX(fa_load_s), p, v, FA_W)
#define FA_S_LOAD4_RAW FA_SSFX(fa_load4_s)
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

/* the raw reads of the storage type (below): a target whose widening of e4m3fn
 * ends with an exact scaling by 2^8 (F16C: the byte as a half with a rebiased
 * exponent) names forms without it, fa_load_f8e4_raw ... and FA_F8E4_RAW_FACTOR;
 * a target may name fa_load2_<type> for two vectors in one widening */
#if FA_S_F8E4 && defined(FA_F8E4_RAW_FACTOR)
#  define FA_S_RAW_FACTOR FA_F8E4_RAW_FACTOR
#  define FA_S_LOAD2_ONE 1
#  define FA_S_LOAD_RAW fa_load_f8e4_raw
#  define FA_S_LOAD2_RAW fa_load2_f8e4_raw
#  define FA_S_LOAD4_RAW fa_load4_f8e4_raw
#else
#  define FA_S_RAW_FACTOR 1
#  define FA_S_LOAD_RAW FA_SSFX(fa_load_s)
#  if FA_S_F8E5 && defined(fa_load2_f8e5)
#    define FA_S_LOAD2_ONE 1
#    define FA_S_LOAD2_RAW fa_load2_f8e5
#  else
#    define FA_S_LOAD2_ONE 0
#    define FA_S_LOAD2_RAW(p, v) FA_LOAD2_BY_ONE(FA_SSFX(fa_load_s), p, v, FA_W)
#  endif
#  define FA_S_LOAD4_RAW FA_SSFX(fa_load4_s)
#endif
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

/* Raw reads: the stored values divided by FA_SSFX(fa_raw_factor_s)(), an exact
 * power of two (1 but for a target that widens a type more cheaply without a last
 * scaling: e4m3fn through F16C, a half times 2^8).  A kernel that sums products of
 * raw values multiplies its sums once by the factor at the end, and gets the bits
 * of the scaled reads: every product and partial sum is the same real number
 * times a power of two, so it rounds alike -- unless it falls below the smallest
 * normal float32 times the factor (products under 2^-118 for e4m3), where the
 * subnormal rounding may differ in the last place. */
static inline FA_T FA_SSFX(fa_raw_factor_s)(void)
{
    return (FA_T)FA_S_RAW_FACTOR;
}

/* a sum of raw products as the sum of the stored values' products */
static inline FA_V FA_SSFX(fa_raw_scale_s)(FA_V x)
{
    return FA_S_RAW_FACTOR == 1 ? x : x * FA_SFX(fa_set1)((FA_T)FA_S_RAW_FACTOR);
}

static inline FA_V FA_SSFX(fa_load_raw_s)(const FA_S *p)
{
    return FA_S_LOAD_RAW(p);
}

/* two consecutive vectors; fa_load2_one_s(): in one widening (a kernel may then
 * step two vectors at a time) */
static inline void FA_SSFX(fa_load2_raw_s)(const FA_S *p, FA_V *v)
{
    FA_S_LOAD2_RAW(p, v);
}

static inline int FA_SSFX(fa_load2_one_s)(void)
{
    return FA_S_LOAD2_ONE;
}

static inline void FA_SSFX(fa_load4_raw_s)(const FA_S *p, FA_V *v)
{
    FA_S_LOAD4_RAW(p, v);
}

static inline FA_V FA_SSFX(fa_load_part_raw_s)(const FA_S *p, int64_t n, FA_T fill)
{
    if (FA_S_RAW_FACTOR == 1) return FA_SSFX(fa_load_part_s)(p, n, fill);
    return FA_SSFX(fa_load_part_s)(p, n, fill * (FA_T)FA_S_RAW_FACTOR) * FA_SFX(fa_set1)((FA_T)1 / (FA_T)FA_S_RAW_FACTOR);
}
#undef FA_S_RAW_FACTOR
#undef FA_S_LOAD_RAW
#undef FA_S_LOAD2_RAW
#undef FA_S_LOAD2_ONE
#undef FA_S_LOAD4_RAW

static inline void FA_SSFX(fa_prefetch_s)(const FA_S *p, int64_t n)
{
    fa_prefetch_bytes(p, n * (int64_t)sizeof(FA_S));
}

/* do the decode loops that stream this storage type's rows in place request
 * them ahead?  Narrow rows always; float32 / float64 rows only where fa_pf_wide
 * (simd.h).  The one rule of fa_prefetch_row1_s and the few-rows loops
 * (fa_qk_rows_r, fa_pv_rows: stored_reads.h) */
static inline int FA_SSFX(fa_pf_hinted_s)(void)
{
    return sizeof(FA_S) < 4 || fa_pf_wide;
}

/* ... and for the few-rows loops given a prefetch offset pfo: where it is not
 * FA_PF_AUTO (a paged cache's short runs, each row requesting its counterpart
 * in the next block: next_run_rows, paged_reads.pxi), float32 / float64 rows
 * are read as where fa_pf_wide is off -- a group's keys key by key, hints into
 * L2 -- on every CPU.  On a 2-vCPU Xeon 6 (AMX) the paged float32 decode S8
 * Hq32 Hkv8 ctx 4096 in blocks of 16 took 14.4 ms with those hints into L1
 * (its contiguous twin 10.6 ms); AMD had this already (docs/performance.rst,
 * "Intel Xeon 6 with AMX, stop 62"). */
static inline int FA_SSFX(fa_pf_hinted_po_s)(int64_t pfo)
{
    return sizeof(FA_S) < 4 || (fa_pf_wide && pfo == FA_PF_AUTO);
}

/* may the few-rows loops (fa_qk_rows' blocks, fa_pv_rows) put this storage
 * type's hints into L2 (where fa_pf_l2)?  The 2-byte types and int8: GQA decode
 * Hq32 Hkv8 Lk8192 D128, Zen 4, 2 threads, paired: bfloat16 1.16-1.43x,
 * float16 1.23-1.39x, int8 0.97-1.07x; float8 (widening-bound) read 0.98-0.99x
 * with L2 hints and the same with its code unchanged -- level either way, so
 * it keeps its L1 hints and one copy of its loops (docs/performance.rst, "GQA
 * decode: L2 hints") */
static inline int FA_SSFX(fa_pf_l2_few_s)(void)
{
#if FA_S_F8E4 || FA_S_F8E5
    return 0;
#else
    return sizeof(FA_S) < 4;
#endif
}

/* the hints of the one-row loops (a decode unit of one query row: fa_qk_rows'
 * single row, fa_pv1_qk_pass) */
static inline __attribute__((always_inline)) void FA_SSFX(fa_prefetch_row1_s)(const FA_S *p, int64_t n, const int l2)
{
    if (FA_SSFX(fa_pf_hinted_s)()) fa_prefetch_bytes_at(p, n * (int64_t)sizeof(FA_S), l2);
}

/* element d of a row starts a 64-byte line (relative to the row's start) */
static inline int FA_SSFX(fa_line_start_s)(int64_t d)
{
    return (d * (int64_t)sizeof(FA_S)) % 64 == 0;
}

/* vectors of FA_W elements in a 64-byte line for fa_qk_pass' line-by-line loop
 * (one prefetch per line, query vectors held in registers), taken by float16
 * keys; 1 (the loop of one vector, one prefetch per vector) for the others.  A
 * GQA group of 4 on one Zen 3 thread, alternating builds: float16 keys 1.2x
 * faster in L3 and ~1.1x from memory; float32 8 % faster in L3 but slower from
 * memory (5 of 6 pairs), bfloat16 up to 5 % slower, float8 (its two-vector
 * loop) 5-10 % slower (docs/performance.rst) */
static inline __attribute__((always_inline)) int FA_SSFX(fa_line_vecs_s)(void)
{
#if FA_S_F16
    return 64 / (FA_W * (int)sizeof(FA_S)) > 1 ? 64 / (FA_W * (int)sizeof(FA_S)) : 1;
#else
    return 1;
#endif
}

static inline int64_t FA_SSFX(fa_pf_rows_s)(int64_t row_elems)
{
    return fa_pf_rows_bytes(row_elems * (int64_t)sizeof(FA_S));
}

/* the same for the L2 hints' distance FA_PF_L2_BYTES */
static inline int64_t FA_SSFX(fa_pf_l2_rows_s)(int64_t row_elems)
{
    const int64_t b = row_elems * (int64_t)sizeof(FA_S);
    return b > 0 && b < FA_PF_L2_BYTES ? (FA_PF_L2_BYTES + b - 1) / b : 1;
}
