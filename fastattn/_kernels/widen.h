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
 *                a bit-exact software conversion elsewhere
 *   FA_S_BF16    bfloat16 (uint16_t bits): the bits shifted into the high half
 *   FA_S_I8      int8: sign extension and an int-to-float conversion (exact)
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

static inline FA_S FA_SSFX(fa_narrow_s)(FA_T x)
{
    return x;
}
#else

#if FA_S_F16
static inline float FA_SSFX(fa_scalar_s)(uint16_t h)
{
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    /* IEEE binary16 -> binary32, every value exact (subnormals normalised) */
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
#endif
}
#elif FA_S_BF16
static inline float FA_SSFX(fa_scalar_s)(uint16_t h)
{
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
#elif FA_S_I8
static inline float FA_SSFX(fa_scalar_s)(int8_t x)
{
    return (float)x;
}
#endif

/* FA_W elements: one widening instruction sequence where the ISA has it */
static inline FA_V FA_SSFX(fa_load_s)(const FA_S *p)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  if FA_S_F16
    return (FA_V)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#  elif FA_S_BF16
    return (FA_V)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
#  else
    return (FA_V)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#  endif
#elif FA_VBYTES == 32 && defined(__AVX2__)
#  if FA_S_F16
    return (FA_V)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#  elif FA_S_BF16
    return (FA_V)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
#  else
    return (FA_V)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#  endif
#else
    FA_T t[FA_W];
    for (int i = 0; i < FA_W; i++) t[i] = FA_SSFX(fa_scalar_s)(p[i]);
    return FA_SFX(fa_load)(t);
#endif
}

/* p[0:n] widened, lanes from n on = fill (0 <= n <= W); lanes past n are not read */
static inline FA_V FA_SSFX(fa_load_part_s)(const FA_S *p, int64_t n, FA_T fill)
{
#if FA_VBYTES == 64 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    const __mmask16 k = (__mmask16)((1u << n) - 1);
#  if FA_S_F16
    const __m512 x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
#  elif FA_S_BF16
    const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
#  else
    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, p)));
#  endif
    return (FA_V)_mm512_mask_blend_ps(k, _mm512_set1_ps(fill), x);
#else
    FA_T t[FA_W];
    for (int i = 0; i < FA_W; i++) t[i] = i < n ? FA_SSFX(fa_scalar_s)(p[i]) : fill;
    return FA_SFX(fa_load)(t);
#endif
}
#if FA_S_F16
/* float32 -> IEEE half, rounded to nearest even (overflow to inf, subnormals,
 * NaN kept quiet): F16C where the ISA has it, else the same rounding in software */
static inline uint16_t FA_SSFX(fa_narrow_s)(float f)
{
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
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
#endif
}

static inline void FA_SSFX(fa_store_s)(uint16_t *p, FA_V x)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph((__m512)x, _MM_FROUND_TO_NEAREST_INT));
#elif FA_VBYTES == 32 && defined(__F16C__)
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph((__m256)x, _MM_FROUND_TO_NEAREST_INT));
#else
    for (int i = 0; i < FA_W; i++) p[i] = FA_SSFX(fa_narrow_s)(x[i]);
#endif
}
#elif FA_S_BF16
/* float32 -> bfloat16, rounded to nearest even (NaN kept, made quiet) */
static inline uint16_t FA_SSFX(fa_narrow_s)(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline void FA_SSFX(fa_store_s)(uint16_t *p, FA_V x)
{
    typedef uint32_t fa_u32v __attribute__((vector_size(FA_VBYTES)));
    const fa_u32v u = (fa_u32v)x;
    const fa_u32v r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const fa_u32v qnan = (u >> 16) | 0x40u;
    const fa_u32v isnan = (fa_u32v)((u & 0x7fffffffu) > 0x7f800000u);
    const fa_u32v b = (r & ~isnan) | (qnan & isnan);
#if FA_VBYTES == 64 && defined(__AVX512F__)
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16((__m512i)b));
#else
    for (int i = 0; i < FA_W; i++) p[i] = (uint16_t)b[i];
#endif
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
