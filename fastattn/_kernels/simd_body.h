/* One body for the float and double SIMD primitives; included by simd.h with
 * FA_T (element type), FA_V / FA_VI (vector and same-width integer vector),
 * FA_SFX (name suffix) and the exp constants defined.  Not a standalone header. */

#define FA_W ((int)(FA_VBYTES / sizeof(FA_T)))        /* lanes per vector */
#define FA_QK_NR (FA_QK_NV * FA_W)                      /* columns per QK panel */

static inline FA_V FA_SFX(fa_load)(const FA_T *p)
{
    FA_V v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void FA_SFX(fa_store)(FA_T *p, FA_V v)
{
    memcpy(p, &v, sizeof v);
}

/* Broadcast.  x - 0 (unlike x + 0) is an exact identity, -0 included, so GCC
 * folds it away and emits a single broadcast. */
static inline FA_V FA_SFX(fa_set1)(FA_T x)
{
    return x - (FA_V){0};
}

/* Lane-wise mask ? a : b, with mask lanes all-ones or all-zeros. */
static inline FA_V FA_SFX(fa_select)(FA_VI mask, FA_V a, FA_V b)
{
    return (FA_V)(((FA_VI)a & mask) | ((FA_VI)b & ~mask));
}

/* 2^n * p(r) for x = n*ln2 + r, |r| <= ln2/2, with n + bias in [0, 2*FA_EXP_BIAS]
 * (or x NaN).  n is rounded by adding 1.5*2^mantissa + bias, whose low mantissa
 * bits then hold n + bias: shifted into the exponent field they are 2^n, or
 * +0 for n = -bias: an exact 0 (AVX-512's scalef instead of the shift and
 * multiply rounds tiny products to 0; measured 16 % slower on causal attention,
 * where half the scores are -inf: an underflowing result takes a microcode
 * assist on Intel cores).
 * p(r) ~ exp(r) with p(0) = 1 exactly: minimax polynomials of degree 6 (float,
 * relative error 2.0e-9 before rounding) and 11 (double, 3.5e-18), Horner.
 * With a smaller bias b the exact 0 comes at n = -b instead: the exponent field
 * n + b then stands for 2^(n + b - FA_EXP_BIAS), and the polynomial's
 * coefficients carry the missing factor sc = 2^(FA_EXP_BIAS - b) (a power of
 * two: every Horner step is the unscaled one times sc, rounded alike, so the
 * result has the same bits wherever it is a normal number). */
static inline __attribute__((always_inline)) FA_V FA_SFX(fa_exp_core_b)(FA_V xc, const FA_T b, const FA_T sc)
{
    const FA_V t = xc * (FA_T)1.44269504088896341 + (FA_MAGIC + b);
    const FA_V n = t - (FA_MAGIC + b);
#ifdef FA_DOUBLE
    FA_V r = xc - n * 6.93145751953125E-1;
    r = r - n * 1.42860682030941723212E-6;
    FA_V p = FA_SFX(fa_set1)((FA_T)(2.499118884489274055e-8) * sc);
    p = p * r + (FA_T)(2.763132843850631781e-7) * sc;
    p = p * r + (FA_T)(2.755762916579226872e-6) * sc;
    p = p * r + (FA_T)(2.480148986345278541e-5) * sc;
    p = p * r + (FA_T)(1.984126943191994086e-4) * sc;
    p = p * r + (FA_T)(1.388888894704294583e-3) * sc;
    p = p * r + (FA_T)(8.333333333553175658e-3) * sc;
    p = p * r + (FA_T)(4.166666666651544158e-2) * sc;
    p = p * r + (FA_T)(1.666666666666620817e-1) * sc;
    p = p * r + (FA_T)(5.000000000000012745e-1) * sc;
    p = p * r + (FA_T)(1.000000000000000024) * sc;
    p = p * r + (FA_T)(1.0) * sc;
#else
    FA_V r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    FA_V p = FA_SFX(fa_set1)((FA_T)(1.384346530388662598e-3f) * sc);
    p = p * r + (FA_T)(8.374316813622095255e-3f) * sc;
    p = p * r + (FA_T)(4.166801284456309566e-2f) * sc;
    p = p * r + (FA_T)(1.666642940717968866e-1f) * sc;
    p = p * r + (FA_T)(4.999999413903377880e-1f) * sc;
    p = p * r + (FA_T)(1.000000032541406760f) * sc;
    p = p * r + (FA_T)(1.0f) * sc;
#endif
    return p * (FA_V)((FA_VI)t << FA_MANT_BITS);
}

static inline FA_V FA_SFX(fa_exp_core)(FA_V xc)
{
    return FA_SFX(fa_exp_core_b)(xc, FA_EXP_BIAS, 1);
}

/* exp(x) lane-wise: 0 below FA_EXP_LO (-inf included), +inf above FA_EXP_HI,
 * NaN stays NaN. */
static inline FA_V FA_SFX(fa_vexp)(FA_V x)
{
    const FA_VI under = x < FA_EXP_LO;          /* includes -inf */
    const FA_VI over = x > FA_EXP_HI;           /* includes +inf */
    const FA_V xc = FA_SFX(fa_select)(under | over, FA_SFX(fa_set1)(0), x);   /* NaN stays NaN */
    FA_V res = FA_SFX(fa_exp_core)(xc);
    res = FA_SFX(fa_select)(under, FA_SFX(fa_set1)(0), res);
    res = FA_SFX(fa_select)(over, FA_SFX(fa_set1)((FA_T)INFINITY), res);
    return res;
}

/* exp(x) for the softmax arguments x - max (<= 0, -inf or NaN; at most
 * FA_EXP_HI): one max clamps at FA_EXP_ZERO, where 2^n is +0 exactly, so -inf
 * and everything below gives 0 and NaN passes through (the max's second
 * operand).  Unlike fa_vexp, results between FA_EXP_ZERO and FA_EXP_LO are
 * exp(x) as a subnormal (or 0) instead of 0; arguments above FA_EXP_HI, which a
 * max-subtracted score never is, are not allowed.  For softmax() and returned
 * attention weights. */
static inline FA_V FA_SFX(fa_vexp_nonpos)(FA_V x)
{
    return FA_SFX(fa_exp_core)(FA_SFX(FA_VMAX)(FA_SFX(fa_set1)(FA_EXP_ZERO), x));
}

/* The same for the probabilities that only weight the values in P.V (and enter
 * the row sum), but 0 below about 2^-62.5 of the row's running max in float
 * (x < -43.3) and 2^-576.5 in double (x < -399.6); the same bits above.  The
 * reason is speed: with a probability near the bottom of the normal range,
 * p * v (and the rescaled accumulator) is a subnormal, and every multiply-add
 * with a subnormal lane costs a microcode assist (~100+ cycles on Intel cores)
 * for the whole vector.  Scores that fall off steadily along a row (ALiBi, a
 * distance bias, large logits) put such a probability in most vectors: 8
 * heads of 1024^2 with ALiBi slope 1 took 44 ms on one thread, 12.7 ms with
 * this cut (12.6 with the CPU's flush-to-zero; 12.6 with slope 0).  The terms
 * dropped are below 2^-62.5 of the largest, so an output moves by at most
 * Lk * 2^-62.5 of its scale: far below float32 rounding for any Lk (float64:
 * Lk * 2^-576). */
static inline FA_V FA_SFX(fa_vexp_p)(FA_V x)
{
    /* fa_vexp_nonpos's one max, with the exact 0 moved up to n = -FA_P_BIAS */
    return FA_SFX(fa_exp_core_b)(FA_SFX(FA_VMAX)(FA_SFX(fa_set1)(FA_P_ZERO), x), FA_P_BIAS, FA_P_SCALE);
}

/* The same for one argument (the row-major path's rescale factor exp(m_old -
 * m_new)); libm's exp, bit for bit, from FA_P_ZERO on. */
static inline FA_T FA_SFX(fa_exp_p)(FA_T x)
{
    return x < FA_P_ZERO ? (FA_T)0 : (FA_T)exp(x);
}

/* p[0:n] with the lanes from n on set to fill (0 <= n <= W).  One masked load
 * where the ISA has one: lanes past n are not read, so p + n may be the end of
 * an array, and no store-forwarding stall (a row of scalar stores read back as
 * one vector waits for every store to retire: on the short score rows of a
 * small problem, where every row ends in a partial vector, that stall was a
 * large part of the row's softmax). */
static inline FA_V FA_SFX(fa_load_part)(const FA_T *p, int64_t n, FA_T fill)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  ifdef FA_DOUBLE
    return (FA_V)_mm512_mask_loadu_pd(_mm512_set1_pd(fill), (__mmask8)((1u << n) - 1), p);
#  else
    return (FA_V)_mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << n) - 1), p);
#  endif
#elif FA_VBYTES == 32 && defined(__AVX2__)
#  ifdef FA_DOUBLE
    const __m256i k = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
    return (FA_V)_mm256_blendv_pd(_mm256_set1_pd(fill), _mm256_maskload_pd(p, k), _mm256_castsi256_pd(k));
#  else
    const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return (FA_V)_mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, k), _mm256_castsi256_ps(k));
#  endif
#else
    FA_T tmp[FA_W];
    for (int i = 0; i < FA_W; i++) tmp[i] = i < n ? p[i] : fill;
    return FA_SFX(fa_load)(tmp);
#endif
}

/* p[0:n] = the first n lanes of v (0 <= n <= W): a masked store on AVX-512;
 * elsewhere one vector store to the stack copied out lane by lane (a vector
 * store read back in smaller pieces forwards without a stall; AVX2's masked
 * store, vmaskmovps, is microcoded on AMD cores). */
static inline void FA_SFX(fa_store_part)(FA_T *p, FA_V v, int64_t n)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  ifdef FA_DOUBLE
    _mm512_mask_storeu_pd(p, (__mmask8)((1u << n) - 1), (__m512d)v);
#  else
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#  endif
#else
    FA_T tmp[FA_W];
    FA_SFX(fa_store)(tmp, v);
    for (int64_t i = 0; i < n; i++) p[i] = tmp[i];
#endif
}

#if FA_HAVE_SHUFFLE
/* The mask c ^ h (lanes c < W, h < W <= 16) read from a constant table, so the
 * compiler sees a constant: a mask built lane by lane is built at run time. */
static inline FA_VI FA_SFX(fa_xor_mask)(int h)
{
    static const FA_IT t[4][16] = {
        {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14},
        {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
        {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
        {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
    };
    FA_VI v;
    memcpy(&v, t[__builtin_ctz(h)], sizeof v);
    return v;
}
#endif

/* Sum and max of the W lanes of v as a butterfly (log2 W shuffle + add steps),
 * not a chain of W dependent scalar adds: the dot products of the decode path
 * end in one of these per key and row.  Fixed order, so deterministic.  GCC's
 * __builtin_shuffle; elsewhere the scalar loop.  fa_hmax: no NaN lanes. */
static inline FA_T FA_SFX(fa_hsum)(FA_V v)
{
#if FA_HAVE_SHUFFLE
    FA_UNROLL for (int h = FA_W / 2; h >= 1; h /= 2) v += __builtin_shuffle(v, FA_SFX(fa_xor_mask)(h));
    return v[0];
#else
    FA_T s = 0;
    for (int i = 0; i < FA_W; i++) s += v[i];
    return s;
#endif
}

static inline FA_T FA_SFX(fa_hmax)(FA_V v)
{
#if FA_HAVE_SHUFFLE
    FA_UNROLL for (int h = FA_W / 2; h >= 1; h /= 2)
        v = FA_SFX(FA_VMAX)(v, __builtin_shuffle(v, FA_SFX(fa_xor_mask)(h)));
    return v[0];
#else
    FA_T m = v[0];
    for (int i = 1; i < FA_W; i++) m = v[i] > m ? v[i] : m;
    return m;
#endif
}

/* The lanes of a comparison mask m (each lane all ones or all zeros) as the low
 * W bits of an int: one movemask / test where x86 has one (a loop over the
 * lanes extracts them one by one). */
static inline unsigned FA_SFX(fa_lane_bits)(FA_VI m)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  ifdef FA_DOUBLE
    return _mm512_test_epi64_mask((__m512i)m, (__m512i)m);
#  else
    return _mm512_test_epi32_mask((__m512i)m, (__m512i)m);
#  endif
#elif FA_VBYTES == 32 && defined(__AVX2__)
#  ifdef FA_DOUBLE
    return (unsigned)_mm256_movemask_pd((__m256d)m);
#  else
    return (unsigned)_mm256_movemask_ps((__m256)m);
#  endif
#elif FA_VBYTES == 16 && defined(__SSE2__)
#  ifdef FA_DOUBLE
    return (unsigned)_mm_movemask_pd((__m128d)m);
#  else
    return (unsigned)_mm_movemask_ps((__m128)m);
#  endif
#else
    unsigned bits = 0;
    for (int i = 0; i < FA_W; i++) bits |= (unsigned)(m[i] != 0) << i;
    return bits;
#endif
}

/* 1 if any / every lane of the comparison mask m is set. */
static inline int FA_SFX(fa_any)(FA_VI m)
{
    return FA_SFX(fa_lane_bits)(m) != 0;
}

static inline int FA_SFX(fa_all)(FA_VI m)
{
    return FA_SFX(fa_lane_bits)(m) == (1u << FA_W) - 1;
}

/* max(x[0:n]) with NaN propagation; -inf for n == 0.  Four max chains (one
 * instruction each on x86) and NaN tracked apart by OR-ing x != x. */
static inline FA_T FA_SFX(fa_row_max)(const FA_T *x, int64_t n)
{
    FA_V m0 = FA_SFX(fa_set1)(-(FA_T)INFINITY), m1 = m0, m2 = m0, m3 = m0;
    FA_VI bad = (FA_VI)FA_SFX(fa_set1)(0);
    int64_t j = 0;
    for (; j + 4 * FA_W <= n; j += 4 * FA_W) {
        const FA_V x0 = FA_SFX(fa_load)(x + j), x1 = FA_SFX(fa_load)(x + j + FA_W);
        const FA_V x2 = FA_SFX(fa_load)(x + j + 2 * FA_W), x3 = FA_SFX(fa_load)(x + j + 3 * FA_W);
        m0 = FA_SFX(FA_VMAX)(m0, x0);
        m1 = FA_SFX(FA_VMAX)(m1, x1);
        m2 = FA_SFX(FA_VMAX)(m2, x2);
        m3 = FA_SFX(FA_VMAX)(m3, x3);
        bad |= (x0 != x0) | (x1 != x1) | (x2 != x2) | (x3 != x3);
    }
    for (; j + FA_W <= n; j += FA_W) {
        const FA_V x0 = FA_SFX(fa_load)(x + j);
        m0 = FA_SFX(FA_VMAX)(m0, x0);
        bad |= x0 != x0;
    }
    if (j < n) {
        const FA_V x0 = FA_SFX(fa_load_part)(x + j, n - j, -(FA_T)INFINITY);
        m1 = FA_SFX(FA_VMAX)(m1, x0);
        bad |= x0 != x0;
    }
    m0 = FA_SFX(FA_VMAX)(FA_SFX(FA_VMAX)(m0, m1), FA_SFX(FA_VMAX)(m2, m3));
    return FA_SFX(fa_any)(bad) ? (FA_T)NAN : FA_SFX(fa_hmax)(m0);
}

/* max over the non-NaN elements of x[0:n] (-inf if there are none): four plain
 * max chains, one instruction per vector.  For a softmax whose NaN reaches
 * every output through the sum anyway; fa_row_max when NaN must show in m. */
static inline FA_T FA_SFX(fa_row_max_nonan)(const FA_T *x, int64_t n)
{
    FA_V m0 = FA_SFX(fa_set1)(-(FA_T)INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j + 4 * FA_W <= n; j += 4 * FA_W) {
        /* the load as second operand: a NaN element leaves the chain unchanged */
        m0 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j), m0);
        m1 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j + FA_W), m1);
        m2 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j + 2 * FA_W), m2);
        m3 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j + 3 * FA_W), m3);
    }
    for (; j + FA_W <= n; j += FA_W) m0 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j), m0);
    if (j < n) m1 = FA_SFX(FA_VMAX)(FA_SFX(fa_load_part)(x + j, n - j, -(FA_T)INFINITY), m1);
    m0 = FA_SFX(FA_VMAX)(FA_SFX(FA_VMAX)(m0, m1), FA_SFX(FA_VMAX)(m2, m3));
    return FA_SFX(fa_hmax)(m0);
}

/* y[j] = exp(x[j] - m) for j < n (x and y may be the same row) as fa_vexp_p
 * (p = 1) or fa_vexp_nonpos (p = 0, a compile-time constant); returns the sum. */
static inline __attribute__((always_inline)) FA_V FA_SFX(fa_vexp_pick)(FA_V x, const int p)
{
    return p ? FA_SFX(fa_vexp_p)(x) : FA_SFX(fa_vexp_nonpos)(x);
}

static inline __attribute__((always_inline)) FA_T
FA_SFX(fa_row_exp_sum_pick)(const FA_T *x, FA_T *y, int64_t n, FA_T m, const int p)
{
    const FA_V vm = FA_SFX(fa_set1)(m);
    FA_V s0 = FA_SFX(fa_set1)(0), s1 = s0;
    int64_t j = 0;
    for (; j + 2 * FA_W <= n; j += 2 * FA_W) {
        FA_V e0 = FA_SFX(fa_vexp_pick)(FA_SFX(fa_load)(x + j) - vm, p);
        FA_V e1 = FA_SFX(fa_vexp_pick)(FA_SFX(fa_load)(x + j + FA_W) - vm, p);
        FA_SFX(fa_store)(y + j, e0);
        FA_SFX(fa_store)(y + j + FA_W, e1);
        s0 += e0;
        s1 += e1;
    }
    for (; j + FA_W <= n; j += FA_W) {
        FA_V e0 = FA_SFX(fa_vexp_pick)(FA_SFX(fa_load)(x + j) - vm, p);
        FA_SFX(fa_store)(y + j, e0);
        s0 += e0;
    }
    if (j < n) {
        /* the fill value -inf becomes exp(-inf) = 0 and adds nothing */
        FA_V e0 = FA_SFX(fa_vexp_pick)(FA_SFX(fa_load_part)(x + j, n - j, -(FA_T)INFINITY) - vm, p);
        FA_SFX(fa_store_part)(y + j, e0, n - j);
        s1 += e0;
    }
    return FA_SFX(fa_hsum)(s0 + s1);
}

/* softmax() and returned weights: exp as fa_vexp_nonpos */
static inline FA_T FA_SFX(fa_row_exp_sum)(const FA_T *x, FA_T *y, int64_t n, FA_T m)
{
    return FA_SFX(fa_row_exp_sum_pick)(x, y, n, m, 0);
}

/* the online softmax of attention (probabilities for P.V): exp as fa_vexp_p */
static inline FA_T FA_SFX(fa_row_exp_sum_p)(const FA_T *x, FA_T *y, int64_t n, FA_T m)
{
    return FA_SFX(fa_row_exp_sum_pick)(x, y, n, m, 1);
}

/* Softmax (or log-softmax) down nv * W columns at once: element j of column c
 * at x[j * sx + c], result at y[j * sy + c], j < n.  Lanes run over the
 * columns (the contiguous axis), so a softmax along a strided axis reads whole
 * vectors: max, exp and sum, then scale or shift.  A column of only -inf gives
 * zeros (-inf for log); +inf or NaN in a column gives NaN in that column. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_col_softmax_nv)(const FA_T *x, int64_t sx, FA_T *y, int64_t sy, int64_t n, int log_mode, const int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY), zero = FA_SFX(fa_set1)(0);
    FA_V m[FA_T_NV], s[FA_T_NV];
    FA_UNROLL for (int v = 0; v < FA_T_NV; v++) {
        m[v] = ninf;
        s[v] = zero;
    }
    /* the max skips NaN (the load is max's second operand); a NaN still makes
     * its column NaN, through exp(NaN - m) in the sum */
    for (int64_t j = 0; j < n; j++)
        FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
            if (v < nv) m[v] = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j * sx + v * FA_W), m[v]);
    /* a column without a value above -inf: exp(x - 0) = 0 (or NaN) everywhere */
    FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
        if (v < nv) m[v] = FA_SFX(fa_select)(m[v] == ninf, zero, m[v]);
    for (int64_t j = 0; j < n; j++)
        FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
            if (v < nv) {
                const FA_V e = FA_SFX(fa_vexp_nonpos)(FA_SFX(fa_load)(x + j * sx + v * FA_W) - m[v]);
                s[v] += e;
                if (!log_mode) FA_SFX(fa_store)(y + j * sy + v * FA_W, e);
            }
    FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
        if (v < nv) {
            if (log_mode) {
                /* lse = m + log(s); log(0) = -inf gives -inf - (-inf) = NaN below,
                 * so an all -inf column is set to -inf apart */
                for (int i = 0; i < FA_W; i++) s[v][i] = m[v][i] + (FA_T)log((double)s[v][i]);
            } else {
                s[v] = (FA_T)1 / s[v];
                s[v] = FA_SFX(fa_select)(s[v] == -ninf, zero, s[v]);     /* s = 0: zeros */
            }
        }
    for (int64_t j = 0; j < n; j++)
        FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
            if (v < nv) {
                FA_T *p = y + j * sy + v * FA_W;
                if (log_mode) {
                    const FA_V a = FA_SFX(fa_load)(x + j * sx + v * FA_W);
                    FA_SFX(fa_store)(p, FA_SFX(fa_select)(s[v] == ninf, ninf, a - s[v]));
                } else {
                    FA_SFX(fa_store)(p, FA_SFX(fa_load)(p) * s[v]);
                }
            }
}

/* Columns [c0, c0 + FA_T_NV * FA_W) or [c0, c0 + FA_W) of a column softmax. */
static inline void FA_SFX(fa_col_softmax_chunk)(const FA_T *x, int64_t sx, FA_T *y, int64_t sy, int64_t n,
                                                int log_mode)
{
    FA_SFX(fa_col_softmax_nv)(x, sx, y, sy, n, log_mode, FA_T_NV);
}

static inline void FA_SFX(fa_col_softmax_vec)(const FA_T *x, int64_t sx, FA_T *y, int64_t sy, int64_t n,
                                              int log_mode)
{
    FA_SFX(fa_col_softmax_nv)(x, sx, y, sy, n, log_mode, 1);
}

/* In-register transpose of a W x W block: r[a][c] -> r[c][a].  At each level h
 * the off-diagonal h x h blocks of every 2h x 2h block swap (two two-source
 * shuffles per row pair, vpermt2ps on AVX-512).  Only with FA_HAVE_SHUFFLE;
 * without it callers use scalar code. */
#if FA_HAVE_SHUFFLE
/* Masks of the transpose step h (below) for W lanes, from constant tables:
 * built lane by lane, GCC assembles them at run time on every call. */
static inline void FA_SFX(fa_transpose_masks)(int h, FA_VI *ma, FA_VI *mb)
{
    /* [log2 W - 1][log2 h][lane]: ma picks lane c of A (c & h == 0) or lane
     * c - h of B; mb lane c + h of A or lane c of B (B's lanes numbered from W) */
    static const FA_IT ta[4][4][16] = {
        {{0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{0, 4, 2, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 4, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{0, 8, 2, 10, 4, 12, 6, 14, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 8, 9, 4, 5, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 2, 3, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}, {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}, {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}, {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}},
    };
    static const FA_IT tb[4][4][16] = {
        {{1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{1, 5, 3, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 3, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{1, 9, 3, 11, 5, 13, 7, 15, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 3, 10, 11, 6, 7, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0}, {4, 5, 6, 7, 12, 13, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}, {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}, {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
    };
    memcpy(ma, ta[__builtin_ctz(FA_W) - 1][__builtin_ctz(h)], sizeof *ma);
    memcpy(mb, tb[__builtin_ctz(FA_W) - 1][__builtin_ctz(h)], sizeof *mb);
}

static inline __attribute__((always_inline)) void FA_SFX(fa_transpose)(FA_V *r)
{
    FA_UNROLL for (int h = FA_W / 2; h >= 1; h /= 2) {
        FA_VI ma, mb;
        FA_SFX(fa_transpose_masks)(h, &ma, &mb);
        FA_UNROLL for (int a = 0; a < FA_W; a++)
            if (!(a & h)) {
                const FA_V A = r[a], B = r[a + h];
                r[a] = __builtin_shuffle(A, B, ma);
                r[a + h] = __builtin_shuffle(A, B, mb);
            }
    }
}
#endif

/* Output rows of the query-vectorised path: o[i * sor + c] = Ot[c][i] * inv[i]
 * for i < nr, c < Dv (output elements contiguous).  Whole W x W blocks go
 * through registers (W contiguous loads, a transpose, W contiguous stores)
 * instead of W*W strided scalar reads. */
static inline void FA_SFX(fa_tout_rows)(const FA_T *ot, int64_t ldo, int64_t nr, int64_t Dv,
                                        const FA_T *inv, FA_T *o, int64_t sor)
{
    int64_t i0 = 0;
#if FA_HAVE_SHUFFLE
    for (; i0 + FA_W <= nr; i0 += FA_W) {
        int64_t c0 = 0;
        for (; c0 + FA_W <= Dv; c0 += FA_W) {
            FA_V r[FA_W];
            FA_UNROLL for (int k = 0; k < FA_W; k++) r[k] = FA_SFX(fa_load)(ot + (c0 + k) * ldo + i0);
            FA_SFX(fa_transpose)(r);
            FA_UNROLL for (int i = 0; i < FA_W; i++)
                FA_SFX(fa_store)(o + (i0 + i) * sor + c0, r[i] * inv[i0 + i]);
        }
        for (int64_t i = i0; i < i0 + FA_W; i++)
            for (int64_t c = c0; c < Dv; c++) o[i * sor + c] = ot[c * ldo + i] * inv[i];
    }
#endif
    for (int64_t i = i0; i < nr; i++)
        for (int64_t c = 0; c < Dv; c++) o[i * sor + c] = ot[c * ldo + i] * inv[i];
}

/* Transposed query pack: qt[d * ld + i] = q[qoff[i] + d] * scale for i < nr,
 * d < D (query elements contiguous).  W x W blocks through registers as in
 * fa_tout_rows.  pf != 0: while a block of W rows is read, the same elements
 * pf further on are requested (the key pack streams its rows from memory and
 * passes W rows' stride: the next block's rows). */
static inline void FA_SFX(fa_tq_pack)(const FA_T *q, const int64_t *qoff, int64_t nr, int64_t D, FA_T scale,
                                      FA_T *qt, int64_t ld, int64_t pf)
{
    int64_t i0 = 0;
#if FA_HAVE_SHUFFLE
    for (; i0 + FA_W <= nr; i0 += FA_W) {
        int64_t d0 = 0;
        for (; d0 + FA_W <= D; d0 += FA_W) {
            FA_V r[FA_W];
            if (pf)
                FA_UNROLL for (int i = 0; i < FA_W; i++) __builtin_prefetch(q + qoff[i0 + i] + pf + d0, 0, FA_PF_LOC);
            FA_UNROLL for (int i = 0; i < FA_W; i++) r[i] = FA_SFX(fa_load)(q + qoff[i0 + i] + d0);
            FA_SFX(fa_transpose)(r);
            FA_UNROLL for (int d = 0; d < FA_W; d++) FA_SFX(fa_store)(qt + (d0 + d) * ld + i0, r[d] * scale);
        }
        for (int64_t d = d0; d < D; d++)
            for (int64_t i = i0; i < i0 + FA_W; i++) qt[d * ld + i] = q[qoff[i] + d] * scale;
    }
#endif
    for (int64_t d = 0; d < D; d++)
        for (int64_t i = i0; i < nr; i++) qt[d * ld + i] = q[qoff[i] + d] * scale;
}

/* y[j] = x[j] * a */
static inline void FA_SFX(fa_row_scale)(const FA_T *x, FA_T *y, int64_t n, FA_T a)
{
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W) FA_SFX(fa_store)(y + j, FA_SFX(fa_load)(x + j) * a);
    for (; j < n; j++) y[j] = x[j] * a;
}

/* y[j] = x[j] + a */
static inline void FA_SFX(fa_row_shift)(const FA_T *x, FA_T *y, int64_t n, FA_T a)
{
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W) FA_SFX(fa_store)(y + j, FA_SFX(fa_load)(x + j) + a);
    for (; j < n; j++) y[j] = x[j] + a;
}

/* x[j] = c * tanh(x[j] / c).  For |u| = |x/c| below a threshold tanh comes from
 * its odd Taylor series (to u^15), above it from 1 - 2 / (exp(2u) + 1), which
 * gives the exact limits +-1 for large |u| and propagates NaN; each form is used
 * where its relative error is below the type's rounding error. */
static inline void FA_SFX(fa_row_softcap)(FA_T *x, int64_t n, FA_T c)
{
#ifdef FA_DOUBLE
    const FA_T thr = 0.1;
#else
    const FA_T thr = 0.3f;
#endif
    const FA_T inv_c = 1 / c;
    int64_t j = 0;
    for (; j < n; j += FA_W) {
        int64_t m = n - j < FA_W ? n - j : FA_W;
        FA_V u = (m == FA_W ? FA_SFX(fa_load)(x + j) : FA_SFX(fa_load_part)(x + j, m, 0)) * inv_c;
        FA_V u2 = u * u;
        FA_V p = FA_SFX(fa_set1)((FA_T)(-929569.0 / 638512875.0));
        p = p * u2 + (FA_T)(21844.0 / 6081075.0);
        p = p * u2 + (FA_T)(-1382.0 / 155925.0);
        p = p * u2 + (FA_T)(62.0 / 2835.0);
        p = p * u2 + (FA_T)(-17.0 / 315.0);
        p = p * u2 + (FA_T)(2.0 / 15.0);
        p = p * u2 + (FA_T)(-1.0 / 3.0);
        p = p * u2 * u + u;
        /* the exp and the division only for a vector with a lane past the
         * threshold (scores are mostly well inside a cap: c = 50 for Gemma 2) */
        const FA_VI small = (u < thr) & (u > -thr);
        FA_V t = p;
        if (!FA_SFX(fa_all)(small)) {
            FA_V e = FA_SFX(fa_vexp)(u + u);
            FA_V big = 1 - 2 / (e + 1);
            t = FA_SFX(fa_select)(small, p, big);
        }
        t = t * c;
        if (m == FA_W) FA_SFX(fa_store)(x + j, t);
        else FA_SFX(fa_store_part)(x + j, t, m);
    }
}

/* One QK panel: S[0:MR, 0:nv*W] = Qp[0:MR, 0:D] . panel[:, 0:nv*W] (nv <= NV a
 * compile-time constant after inlining). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_panel)(const FA_T *restrict qp, int64_t ldq, const FA_T *restrict panel, int64_t D,
                    FA_T *restrict s, int64_t lds, const int nv)
{
    FA_V acc[FA_QK_MR][FA_QK_NV];
    FA_UNROLL for (int i = 0; i < FA_QK_MR; i++)
        FA_UNROLL for (int v = 0; v < FA_QK_NV; v++) acc[i][v] = FA_SFX(fa_set1)(0);
    for (int64_t d = 0; d < D; d++) {
        FA_V b[FA_QK_NV];
        FA_UNROLL for (int v = 0; v < FA_QK_NV; v++)
            if (v < nv) b[v] = FA_SFX(fa_load)(panel + d * FA_QK_NR + v * FA_W);
        FA_UNROLL for (int i = 0; i < FA_QK_MR; i++) {
            const FA_V a = FA_SFX(fa_set1)(qp[i * ldq + d]);
            FA_UNROLL for (int v = 0; v < FA_QK_NV; v++)
                if (v < nv) acc[i][v] += a * b[v];
        }
    }
    FA_UNROLL for (int i = 0; i < FA_QK_MR; i++)
        FA_UNROLL for (int v = 0; v < FA_QK_NV; v++)
            if (v < nv) FA_SFX(fa_store)(s + i * lds + v * FA_W, acc[i][v]);
}

/* QK micro-kernel.  S[0:MR, c*NR:e] = Qp[0:MR, 0:D] . panel_c for each panel c
 * from c0 on that holds columns below e.  Qp rows are ldq apart; Kt is stored as
 * panels of D x NR (panel c at kt + c*D*NR, row d of it at + d*NR), so the inner
 * loop reads K sequentially; S rows are lds apart.  A last panel with at most one
 * vector of columns below e is computed one vector wide (a tile of 33 keys is one
 * and a half panels, not two; a causal diagonal block ends anywhere); the
 * columns past e of it are left unwritten. */
static inline void FA_SFX(fa_qk_block)(const FA_T *restrict qp, int64_t ldq,
                                       const FA_T *restrict kt, int64_t D,
                                       FA_T *restrict s, int64_t lds, int64_t c0, int64_t e)
{
    for (int64_t c = c0; c * FA_QK_NR < e; c++) {
        if (FA_QK_NV > 1 && e - c * FA_QK_NR <= FA_W)
            FA_SFX(fa_qk_panel)(qp, ldq, kt + c * D * FA_QK_NR, D, s + c * FA_QK_NR, lds, 1);
        else
            FA_SFX(fa_qk_panel)(qp, ldq, kt + c * D * FA_QK_NR, D, s + c * FA_QK_NR, lds, FA_QK_NV);
    }
}

/* Prefetch the n elements from p (one hint per cache line).  These loops stream
 * keys and values from memory one row at a time; the hardware prefetcher stops
 * at every 4 KiB page, so a single core only reaches its read bandwidth when the
 * rows a few KiB ahead are already requested.  A hint never faults, so running
 * past the end of an array is harmless. */
static inline void FA_SFX(fa_prefetch)(const FA_T *p, int64_t n)
{
    const char *c = (const char *)p;
    for (int64_t b = 0; b < n * (int64_t)sizeof(FA_T); b += 64) __builtin_prefetch(c + b, 0, FA_PF_LOC);
}

/* Prefetch rows [0, nrows) of n contiguous elements, sr apart. */
static inline void FA_SFX(fa_prefetch_rows)(const FA_T *p, int64_t nrows, int64_t sr, int64_t n)
{
    for (int64_t r = 0; r < nrows; r++) FA_SFX(fa_prefetch)(p + r * sr, n);
}

static inline int64_t FA_SFX(fa_pf_rows)(int64_t row_elems)
{
    int64_t bytes = row_elems * (int64_t)sizeof(FA_T);
    int64_t r = bytes > 0 ? (FA_PF_BYTES + bytes - 1) / bytes : 1;
    return r < 1 ? 1 : r;
}

/* PV micro-kernel on mr (<= FA_PV_MR) rows and nv (<= FA_PV_NV) vectors of
 * columns, both compile-time constants after inlining:
 * O[0:mr, :nv*W] += P[0:mr, k0:k1] . V[k0:k1, :nv*W].  pfn > 0: the value rows
 * pf further on are requested, pfn elements each (V streamed from memory). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_micro)(const FA_T *restrict p, int64_t ldp, const FA_T *restrict vp, int64_t ldv,
                    int64_t k0, int64_t k1, FA_T *restrict o, int64_t ldo, const int mr, const int nv,
                    int64_t pf, int64_t pfn)
{
    FA_V acc[FA_PV_MR][FA_PV_NV];
    FA_UNROLL for (int i = 0; i < FA_PV_MR; i++)
        FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
            if (i < mr && v < nv) acc[i][v] = FA_SFX(fa_load)(o + i * ldo + v * FA_W);
    for (int64_t k = k0; k < k1; k++) {
        FA_V b[FA_PV_NV];
        if (pfn) FA_SFX(fa_prefetch)(vp + (k + pf) * ldv, pfn);
        FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
            if (v < nv) b[v] = FA_SFX(fa_load)(vp + k * ldv + v * FA_W);
        FA_UNROLL for (int i = 0; i < FA_PV_MR; i++)
            if (i < mr) {
                const FA_V a = FA_SFX(fa_set1)(p[i * ldp + k]);
                FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
                    if (v < nv) acc[i][v] += a * b[v];
            }
    }
    FA_UNROLL for (int i = 0; i < FA_PV_MR; i++)
        FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
            if (i < mr && v < nv) FA_SFX(fa_store)(o + i * ldo + v * FA_W, acc[i][v]);
}

/* O[0:mr, 0:nvec*W] += P[0:mr, k0:k1] . V[k0:k1, 0:nvec*W] (mr a compile-time
 * constant after inlining), in column chunks of FA_PV_NV vectors and one chunk
 * of the rest.  pfn > 0: the first chunk requests the value rows pf ahead. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_pv_cols)(const FA_T *restrict p, int64_t ldp, const FA_T *restrict vp, int64_t ldv,
                   int64_t k0, int64_t k1, FA_T *restrict o, int64_t ldo, int64_t nvec, const int mr,
                   int64_t pf, int64_t pfn)
{
    int64_t c = 0;
    for (; c + FA_PV_NV <= nvec; c += FA_PV_NV, pfn = 0)
        FA_SFX(fa_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, mr, FA_PV_NV, pf, pfn);
    switch (nvec - c) {
    case 1: FA_SFX(fa_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, mr, 1, pf, pfn); break;
    case 2: FA_SFX(fa_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, mr, 2, pf, pfn); break;
    case 3: FA_SFX(fa_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, mr, 3, pf, pfn); break;
    default: break;
    }
}

/* O[0:MR, 0:nvec*W] += P[0:MR, k0:k1] . V[k0:k1, 0:nvec*W], in column chunks. */
static inline void FA_SFX(fa_pv_block)(const FA_T *restrict p, int64_t ldp, const FA_T *restrict vp,
                                       int64_t ldv, int64_t k0, int64_t k1, FA_T *restrict o,
                                       int64_t ldo, int64_t nvec)
{
    FA_SFX(fa_pv_cols)(p, ldp, vp, ldv, k0, k1, o, ldo, nvec, FA_PV_MR, 0, 0);
}

/* ---------------- few query rows (decode) ----------------
 * Lanes run over the head dimension: keys and values are read in place, one
 * contiguous row at a time, so nothing is packed and no lane is wasted on
 * padding rows; these loops are bound by memory bandwidth, not FLOPs. */

static inline FA_T FA_SFX(fa_dot)(const FA_T *a, const FA_T *b, int64_t n)
{
    FA_V acc0 = FA_SFX(fa_set1)(0), acc1 = acc0;
    int64_t d = 0;
    for (; d + 2 * FA_W <= n; d += 2 * FA_W) {
        acc0 += FA_SFX(fa_load)(a + d) * FA_SFX(fa_load)(b + d);
        acc1 += FA_SFX(fa_load)(a + d + FA_W) * FA_SFX(fa_load)(b + d + FA_W);
    }
    for (; d + FA_W <= n; d += FA_W) acc0 += FA_SFX(fa_load)(a + d) * FA_SFX(fa_load)(b + d);
    FA_T s = 0;
    for (; d < n; d++) s += a[d] * b[d];
    return s + FA_SFX(fa_hsum)(acc0 + acc1);
}

/* Copy n rows of D contiguous elements (rows sr apart) into dst rows ldd apart,
 * whole vectors at a time; a row's last partial vector is stored whole with
 * zeros past D (dst rows hold D rounded up to a vector).  Returns 1 if any
 * copied element is inf or NaN (x * 0 is NaN only for those). */
static inline int FA_SFX(fa_pack_rows)(const FA_T *src, int64_t sr, int64_t n, int64_t D,
                                       FA_T *dst, int64_t ldd)
{
    FA_V acc0 = FA_SFX(fa_set1)(0), acc1 = acc0;
    const int64_t pf = FA_SFX(fa_pf_rows)(D);
    for (int64_t j = 0; j < n; j++) {
        const FA_T *s = src + j * sr;
        FA_T *d = dst + j * ldd;
        FA_SFX(fa_prefetch)(s + pf * sr, D);
        int64_t c = 0;
        for (; c + 2 * FA_W <= D; c += 2 * FA_W) {
            const FA_V x0 = FA_SFX(fa_load)(s + c), x1 = FA_SFX(fa_load)(s + c + FA_W);
            FA_SFX(fa_store)(d + c, x0);
            FA_SFX(fa_store)(d + c + FA_W, x1);
            acc0 += x0 * 0;
            acc1 += x1 * 0;
        }
        for (; c < D; c += FA_W) {
            const FA_V x = c + FA_W <= D ? FA_SFX(fa_load)(s + c) : FA_SFX(fa_load_part)(s + c, D - c, 0);
            FA_SFX(fa_store)(d + c, x);
            acc0 += x * 0;
        }
    }
    return FA_SFX(fa_hsum)(acc0 + acc1) != 0;    /* lanes hold 0 or NaN */
}

/* fa_qk_rows takes the rows in blocks of at most this many (a power of two) */
#define FA_QKR_MAX (FA_W < 8 ? FA_W : 8)
#if FA_HAVE_SHUFFLE
/* Scores of R query rows (R a power of two <= W) with G = W / R keys, kg's rows
 * ksr apart, in one pass over the keys: one accumulator per (row, key) pair, so
 * W independent FMA chains, each key vector loaded once for the R rows; then
 * one transpose-and-add tree instead of W horizontal sums.  Lane i*G + u of the
 * tree's result is the sum of the lanes of pair (i, u) in fa_hsum's order, so a
 * score does not depend on R or on the key's place in the group.  Stores the
 * first nrow rows' scores of the first nk keys (s rows lds apart); keys past nk
 * are not read.  pf != 0: while a key vector is read, the same vector pf rows
 * further on is requested (the keys stream from memory: one request per load,
 * spread evenly over the pass). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_pass)(const FA_T *qp, int64_t ldq, const int R, int nrow, int64_t D, const FA_T *kg, int64_t ksr,
                   int nk, int64_t pf, FA_T *s, int64_t lds)
{
    const int G = FA_W / R;
    FA_V r[FA_W];
    FA_UNROLL for (int x = 0; x < FA_W; x++) r[x] = FA_SFX(fa_set1)(0);
    int64_t d = 0;
    for (; d + FA_W <= D; d += FA_W) {
        FA_V kv[FA_W];
        FA_UNROLL for (int u = 0; u < G; u++)
            if (u < nk) {
                if (pf) __builtin_prefetch(kg + (u + pf) * ksr + d, 0, FA_PF_LOC);
                kv[u] = FA_SFX(fa_load)(kg + u * ksr + d);
            }
        FA_UNROLL for (int i = 0; i < R; i++) {
            const FA_V qv = FA_SFX(fa_load)(qp + i * ldq + d);
            FA_UNROLL for (int u = 0; u < G; u++)
                if (u < nk) r[i * G + u] += qv * kv[u];
        }
    }
    if (d < D) {
        FA_V kv[FA_W];
        FA_UNROLL for (int u = 0; u < G; u++)
            if (u < nk) kv[u] = FA_SFX(fa_load_part)(kg + u * ksr + d, D - d, 0);
        FA_UNROLL for (int i = 0; i < R; i++) {
            const FA_V qv = FA_SFX(fa_load_part)(qp + i * ldq + d, D - d, 0);
            FA_UNROLL for (int u = 0; u < G; u++)
                if (u < nk) r[i * G + u] += qv * kv[u];
        }
    }
    FA_UNROLL for (int h = FA_W / 2; h >= 1; h /= 2) {
        FA_VI ma, mb;
        FA_SFX(fa_transpose_masks)(h, &ma, &mb);
        FA_UNROLL for (int a = 0; a < h; a++)
            r[a] = __builtin_shuffle(r[a], r[a + h], ma) + __builtin_shuffle(r[a], r[a + h], mb);
    }
    if (R == 1 && nk == FA_W) {
        FA_SFX(fa_store)(s, r[0]);
    } else {
        FA_T t[FA_W];
        FA_SFX(fa_store)(t, r[0]);
        for (int i = 0; i < nrow; i++)
            for (int u = 0; u < nk; u++) s[i * lds + u] = t[i * G + u];
    }
}

/* fa_qk_rows for nrow <= R rows (qp rows up to R readable; the padding rows'
 * scores are computed and dropped). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_qk_rows_r)(const FA_T *qp, int64_t ldq, const int R, int nrow, int64_t D, const FA_T *k, int64_t ksr,
                     int64_t n, FA_T *s, int64_t lds, int stream)
{
    const int G = FA_W / R;
    const int64_t pfr = FA_SFX(fa_pf_rows)(D);
    const int64_t pf = !stream ? 0 : pfr > G ? pfr : G;
    int64_t j = 0;
    for (; j + G <= n; j += G)
        FA_SFX(fa_qk_pass)(qp, ldq, R, nrow, D, k + j * ksr, ksr, G, pf, s + j, lds);
    if (j < n)
        FA_SFX(fa_qk_pass)(qp, ldq, R, nrow, D, k + j * ksr, ksr, (int)(n - j), 0, s + j, lds);
}
#endif

#if FA_HAVE_SHUFFLE
/* One block of rows (<= FA_QKR_MAX) in one pass per group of keys, its row count
 * padded to a power of two. */
static inline void FA_SFX(fa_qk_rows_pad)(const FA_T *q, int64_t ldq, int rows, int64_t D, const FA_T *k,
                                          int64_t ksr, int64_t n, FA_T *s, int64_t lds, int stream)
{
    if (rows <= 1)
        FA_SFX(fa_qk_rows_r)(q, ldq, 1, rows, D, k, ksr, n, s, lds, stream);
    else if (rows <= 2 || FA_QKR_MAX < 4)
        FA_SFX(fa_qk_rows_r)(q, ldq, 2, rows, D, k, ksr, n, s, lds, stream);
    else if (rows <= 4 || FA_QKR_MAX < 8)
        FA_SFX(fa_qk_rows_r)(q, ldq, FA_QKR_MAX >= 4 ? 4 : 2, rows, D, k, ksr, n, s, lds, stream);
    else
        FA_SFX(fa_qk_rows_r)(q, ldq, FA_QKR_MAX >= 8 ? 8 : 2, rows, D, k, ksr, n, s, lds, stream);
}
#endif

/* S[i][j] = qp[i] . k[j] for i < nr, j < n; key rows contiguous, ksr apart.
 * Blocks of up to FA_QKR_MAX rows, each in one pass over the keys per group of
 * keys (fa_qk_pass) with its row count rounded up to a power of two (5-6 rows
 * as 4 + 1 or 4 + 2): qp must hold zeros (or any finite numbers) up to nr
 * rounded up to FA_QKR_MAX rows.  Replaces one dot product and horizontal sum
 * per row and key (the horizontal sums' latency chains made it 4-6x slower
 * than the FMAs allow): 1.1-1.4x faster on 2-14 rows, paired, keys from memory
 * or from cache. */
static inline void FA_SFX(fa_qk_rows)(const FA_T *qp, int64_t ldq, int64_t nr, int64_t D,
                                      const FA_T *k, int64_t ksr, int64_t n, FA_T *s, int64_t lds)
{
    const int64_t pf = FA_SFX(fa_pf_rows)(D);
#if FA_HAVE_SHUFFLE
    if (nr == 1) {
        /* a unit of a single row: key by key, one sequential stream (the decode
         * cases, bound by memory: 5-7 % faster than fa_qk_pass's group order).
         * Only for a unit of one row: a row's scores are otherwise the same for
         * any number of rows in the unit */
        for (int64_t j = 0; j < n; j++) {
            FA_SFX(fa_prefetch)(k + (j + pf) * ksr, D);
            s[j] = FA_SFX(fa_dot)(qp, k + j * ksr, D);
        }
        return;
    }
    for (int64_t i0 = 0; i0 < nr; i0 += FA_QKR_MAX) {
        const int rows = nr - i0 < FA_QKR_MAX ? (int)(nr - i0) : FA_QKR_MAX;
        const FA_T *q = qp + i0 * ldq;
        FA_T *si = s + i0 * lds;
        const int stream = i0 == 0;
        if (FA_QKR_MAX == 8 && (rows == 5 || rows == 6)) {
            /* a block of 4 and one of 1 or 2 (paired, 1.05-1.08x faster than one
             * block of 8 with 2-3 padding rows; splitting 3 rows as 2 + 1
             * measured 0.93x, 7 rows as 4 + 2 + 1 1.0x) */
            FA_SFX(fa_qk_rows_pad)(q, ldq, 4, D, k, ksr, n, si, lds, stream);
            FA_SFX(fa_qk_rows_pad)(q + 4 * ldq, ldq, rows - 4, D, k, ksr, n, si + 4 * lds, lds, 0);
        } else {
            FA_SFX(fa_qk_rows_pad)(q, ldq, rows, D, k, ksr, n, si, lds, stream);
        }
    }
#else
    for (int64_t j = 0; j < n; j++) {
        FA_SFX(fa_prefetch)(k + (j + pf) * ksr, D);
        for (int64_t i = 0; i < nr; i++) s[i * lds + j] = FA_SFX(fa_dot)(qp + i * ldq, k + j * ksr, D);
    }
#endif
}

/* One pass over the keys [k0, k1) for NB (8, 4 or 1, a constant after
 * inlining) vectors of one output row: O[0:NB*W] += sum_k P[k] * V[k][0:NB*W],
 * V rows ldv apart, read in place, accumulated key by key.  With nk > 0 the
 * same loop also computes the single-row scores of the NEXT key tile,
 * sn[j] = fa_dot(qp, kn[j]) for j < nk (fa_qk_rows' one-row order): a decode
 * unit otherwise reads a tile's keys, then its values, one stream at a time,
 * and two streams in flight keep more of a core's memory requests outstanding.
 * The values and the scores are the same bits either way. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_pv1_qk_pass)(const FA_T *p, const FA_T *vv, int64_t ldv, int64_t k0, int64_t k1, FA_T *o,
                       const int NB, int prefetch, const FA_T *qp, int64_t D, const FA_T *kn, int64_t ksr,
                       int64_t nk, FA_T *sn)
{
    const int64_t pfv = FA_SFX(fa_pf_rows)(NB * FA_W), pfk = FA_SFX(fa_pf_rows)(D);
    const int64_t nv = k1 > k0 ? k1 - k0 : 0, both = nk < nv ? nk : nv;
    FA_V a[8];
    FA_UNROLL for (int u = 0; u < NB; u++) a[u] = FA_SFX(fa_load)(o + u * FA_W);
    int64_t i = 0;
    for (; i < both; i++) {
        const FA_V w = FA_SFX(fa_set1)(p[k0 + i]);
        const FA_T *vr = vv + (k0 + i) * ldv;
        if (prefetch) FA_SFX(fa_prefetch)(vr + pfv * ldv, NB * FA_W);
        FA_SFX(fa_prefetch)(kn + (i + pfk) * ksr, D);
        FA_UNROLL for (int u = 0; u < NB; u++) a[u] += w * FA_SFX(fa_load)(vr + u * FA_W);
        sn[i] = FA_SFX(fa_dot)(qp, kn + i * ksr, D);
    }
    for (; i < nv; i++) {
        const FA_V w = FA_SFX(fa_set1)(p[k0 + i]);
        const FA_T *vr = vv + (k0 + i) * ldv;
        if (prefetch) FA_SFX(fa_prefetch)(vr + pfv * ldv, NB * FA_W);
        FA_UNROLL for (int u = 0; u < NB; u++) a[u] += w * FA_SFX(fa_load)(vr + u * FA_W);
    }
    for (; i < nk; i++) {
        FA_SFX(fa_prefetch)(kn + (i + pfk) * ksr, D);
        sn[i] = FA_SFX(fa_dot)(qp, kn + i * ksr, D);
    }
    FA_UNROLL for (int u = 0; u < NB; u++) FA_SFX(fa_store)(o + u * FA_W, a[u]);
}

/* O[0][0:nvec*W] += sum_{k in [k0,k1)} P[0][k] * V[k][0:nvec*W] for one row (V
 * rows ldv apart, read in place), in blocks of 8 vectors (a 128-float or
 * 64-double row in one pass over the keys), then 4, then 1; prefetch: the 8-
 * and 4-vector passes request the value rows ahead.  nk > 0: the first pass
 * also computes the next tile's nk one-row scores (fa_pv1_qk_pass). */
static inline void FA_SFX(fa_pv_qk_row1)(const FA_T *p, const FA_T *vv, int64_t ldv, int64_t k0, int64_t k1,
                                         FA_T *o, int64_t nvec, int prefetch, const FA_T *qp, int64_t D,
                                         const FA_T *kn, int64_t ksr, int64_t nk, FA_T *sn)
{
    int64_t c = 0;
    for (; c + 8 <= nvec; c += 8, nk = 0)
        FA_SFX(fa_pv1_qk_pass)(p, vv + c * FA_W, ldv, k0, k1, o + c * FA_W, 8, prefetch, qp, D, kn, ksr, nk, sn);
    for (; c + 4 <= nvec; c += 4, nk = 0)
        FA_SFX(fa_pv1_qk_pass)(p, vv + c * FA_W, ldv, k0, k1, o + c * FA_W, 4, prefetch, qp, D, kn, ksr, nk, sn);
    for (; c < nvec; c++, nk = 0)
        FA_SFX(fa_pv1_qk_pass)(p, vv + c * FA_W, ldv, k0, k1, o + c * FA_W, 1, 0, qp, D, kn, ksr, nk, sn);
    if (nk)     /* no value columns at all: the scores alone */
        FA_SFX(fa_pv1_qk_pass)(p, vv, ldv, 0, 0, o, 0, 0, qp, D, kn, ksr, nk, sn);
}

/* fa_pv_qk_row1 without the next tile's scores. */
static inline void FA_SFX(fa_pv_row1)(const FA_T *p, const FA_T *vv, int64_t ldv, int64_t k0, int64_t k1,
                                      FA_T *o, int64_t nvec, int prefetch)
{
    FA_SFX(fa_pv_qk_row1)(p, vv, ldv, k0, k1, o, nvec, prefetch, NULL, 0, NULL, 0, 0, NULL);
}

/* O[i][0:nvec*W] += sum_{k in [k0,k1)} P[i][k] * V[k][0:nvec*W] for i < nr, V rows
 * ldv apart, read in place.  Blocks of up to FA_PV_MR rows through the PV
 * micro-kernel, so each value vector is loaded once per block of rows, not once
 * per row (its accumulation order per element is the packed path's); a last
 * single row through fa_pv_row1.  The first pass over the keys streams the
 * values from memory and requests whole rows ahead. */
static inline void FA_SFX(fa_pv_rows)(const FA_T *p, int64_t ldp, int64_t nr, const FA_T *vv, int64_t ldv,
                                      int64_t k0, int64_t k1, FA_T *o, int64_t ldo, int64_t nvec)
{
    const int64_t pf = FA_SFX(fa_pf_rows)(nvec * FA_W);
    int64_t i0 = 0;
    while (nr - i0 >= 2) {
        const int mr = nr - i0 < FA_PV_MR ? (int)(nr - i0) : FA_PV_MR;
        const FA_T *pi = p + i0 * ldp;
        FA_T *oi = o + i0 * ldo;
        const int64_t pfn = i0 == 0 ? nvec * FA_W : 0;
#define FA_PV_ROWS_CASE(MR) \
        case MR: FA_SFX(fa_pv_cols)(pi, ldp, vv, ldv, k0, k1, oi, ldo, nvec, MR, pf, pfn); break;
        switch (mr) {
        FA_PV_ROWS_CASE(2)
#if FA_PV_MR >= 3
        FA_PV_ROWS_CASE(3)
#endif
#if FA_PV_MR >= 4
        FA_PV_ROWS_CASE(4)
#endif
#if FA_PV_MR >= 5
        FA_PV_ROWS_CASE(5)
#endif
#if FA_PV_MR >= 6
        FA_PV_ROWS_CASE(6)
#endif
        default: break;
        }
#undef FA_PV_ROWS_CASE
        i0 += mr;
    }
    for (; i0 < nr; i0++)
        FA_SFX(fa_pv_row1)(p + i0 * ldp, vv, ldv, k0, k1, o + i0 * ldo, nvec, i0 == 0);
}

/* ---------------- query-vectorised ("transposed") kernels ----------------
 * St[j][i] = score of key j for query i; Qt[d][i] = scale * q[i][d];
 * Ot[c][i] = output column c of query i.  A chunk = nv vectors of query lanes
 * (nv = 1, 2 or FA_T_NV), nv * W lanes. */

/* Tails of a block loop: rem (< MR) rows in power-of-two micro-blocks, so each
 * kernel has four instantiations instead of MR - 1. */
#define FA_T_TAILS(MR, rem, CALL) do {                    \
        if ((MR) > 8 && ((rem) & 8)) { CALL(8); }           \
        if ((MR) > 4 && ((rem) & 4)) { CALL(4); }           \
        if ((MR) > 2 && ((rem) & 2)) { CALL(2); }           \
        if ((rem) & 1) { CALL(1); }                         \
    } while (0)

/* BODY(MR, NV) for the chunk width nv, as a constant: FA_T_NV, 2 or 1 vectors with
 * their MR; the _chunk functions below are these per-width instantiations of
 * their always-inline _nv bodies. */
#if FA_T_NV > 2
#  define FA_T_BY_WIDTH(nv, BODY) do {                                          \
        if ((nv) > 2) { BODY(FA_T_MR, FA_T_NV); }                               \
        else if ((nv) == 2) { BODY(FA_T_MR2, 2); }                              \
        else { BODY(FA_T_MR1, 1); }                                             \
    } while (0)
#else
#  define FA_T_BY_WIDTH(nv, BODY) do {                                          \
        if ((nv) == 2) { BODY(FA_T_MR2, 2); }                                   \
        else { BODY(FA_T_MR1, 1); }                                             \
    } while (0)
#endif

/* St[r][chunk] = sum_d K[r][d] * Qt[d][chunk] for the first mr (constant) keys. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_tqk_micro)(const FA_T *k, int64_t ksr, int64_t ksc, const FA_T *restrict qt, int64_t ldq,
                     int64_t D, FA_T *restrict st, int64_t lds, FA_T *restrict mx, const int mr,
                     const int nv, const FA_T *pfk)
{
    FA_V acc[FA_T_MRMAX][FA_T_NV];
    const FA_T *kr[FA_T_MRMAX];
    const int64_t line = 64 / (int64_t)sizeof(FA_T);
    FA_UNROLL for (int r = 0; r < FA_T_MRMAX; r++) {
        if (r < mr) {
            kr[r] = k + r * ksr;
            FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
                if (v < nv) acc[r][v] = FA_SFX(fa_set1)(0);
        }
    }
    for (int64_t d0 = 0; d0 < D; d0 += line) {
        /* one cache line of each of the next block's rows per line of d */
        if (pfk)
            FA_UNROLL for (int r = 0; r < FA_T_MRMAX; r++)
                if (r < mr) __builtin_prefetch(pfk + r * ksr + d0, 0, FA_PF_LOC);
        const int64_t d1 = d0 + line < D ? d0 + line : D;
        for (int64_t d = d0; d < d1; d++) {
            FA_V b[FA_T_NV];
            FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
                if (v < nv) b[v] = FA_SFX(fa_load)(qt + d * ldq + v * FA_W);
            FA_UNROLL for (int r = 0; r < FA_T_MRMAX; r++) {
                if (r < mr) {
                    const FA_V a = FA_SFX(fa_set1)(kr[r][d * ksc]);
                    FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
                        if (v < nv) acc[r][v] += a * b[v];
                }
            }
        }
    }
    FA_UNROLL for (int r = 0; r < FA_T_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
                if (v < nv) FA_SFX(fa_store)(st + r * lds + v * FA_W, acc[r][v]);
    if (mx) {
        /* running max per lane while the scores are in registers (NaN scores are
         * skipped here: they reach the row through its sum, see fa_tsoftmax_chunk) */
        FA_UNROLL for (int v = 0; v < FA_T_NV; v++) {
            if (v < nv) {
                FA_V m = FA_SFX(fa_load)(mx + v * FA_W);
                FA_UNROLL for (int r = 0; r < FA_T_MRMAX; r++)
                    if (r < mr) m = FA_SFX(FA_VMAX)(acc[r][v], m);
                FA_SFX(fa_store)(mx + v * FA_W, m);
            }
        }
    }
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_tqk_nv)(const FA_T *k, int64_t ksr, int64_t ksc, const FA_T *qt, int64_t ldq, int64_t D,
                  FA_T *st, int64_t lds, int64_t j0, int64_t j1, FA_T *mx, const int MR, const int nv,
                  int pf)
{
    int64_t j = j0;
    /* with pf (contiguous key rows, first chunk of the tile): each block requests
     * the rows of the block after it, a line of each per line of d, spread over
     * the block's FMAs (the last block requests the next tile's first rows) */
    for (; j + MR <= j1; j += MR)
        FA_SFX(fa_tqk_micro)(k + j * ksr, ksr, ksc, qt, ldq, D, st + j * lds, lds, mx, MR, nv,
                             pf ? k + (j + MR) * ksr : NULL);
    const int64_t rem = j1 - j;
#define FA_TQK_TAIL(R) \
    FA_SFX(fa_tqk_micro)(k + j * ksr, ksr, ksc, qt, ldq, D, st + j * lds, lds, mx, R, nv, NULL); j += R
    FA_T_TAILS(MR, rem, FA_TQK_TAIL);
#undef FA_TQK_TAIL
}

/* Rows [j0, j1) of St for one chunk of nv vectors: keys k + j*ksr; with mx
 * (nv * W lanes, -inf on entry) also the max over those rows per lane. */
static inline void FA_SFX(fa_tqk_chunk)(const FA_T *k, int64_t ksr, int64_t ksc, const FA_T *qt, int64_t ldq,
                                        int64_t D, FA_T *st, int64_t lds, int64_t j0, int64_t j1, FA_T *mx,
                                        int nv, int pf)
{
    /* contiguous key rows (the usual case) get their own instantiations: with
     * ksc = 1 the broadcasts of a block address one row pointer plus constant
     * offsets, instead of a register per row multiple of ksc (on AVX2 the
     * general form spills loop registers to the stack) */
#define FA_TQK_CONTIG(MR, NV) FA_SFX(fa_tqk_nv)(k, ksr, 1, qt, ldq, D, st, lds, j0, j1, mx, MR, NV, pf)
#define FA_TQK_STRIDED(MR, NV) FA_SFX(fa_tqk_nv)(k, ksr, ksc, qt, ldq, D, st, lds, j0, j1, mx, MR, NV, 0)
    if (ksc == 1)
        FA_T_BY_WIDTH(nv, FA_TQK_CONTIG);
    else
        FA_T_BY_WIDTH(nv, FA_TQK_STRIDED);
#undef FA_TQK_CONTIG
#undef FA_TQK_STRIDED
}

/* Ot[c][chunk] += sum_{j in [j0,j1)} V[j][c] * Pt[j][chunk] for the first mr (constant) columns. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_tpv_micro)(const FA_T *vv, int64_t vsr, int64_t vsc, const FA_T *restrict pt, int64_t lds,
                     int64_t j0, int64_t j1, FA_T *restrict ot, int64_t ldo, const int mr, const int nv)
{
    FA_V acc[FA_T_MRMAX][FA_T_NV];
    FA_UNROLL for (int r = 0; r < FA_T_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
                if (v < nv) acc[r][v] = FA_SFX(fa_load)(ot + r * ldo + v * FA_W);
    for (int64_t j = j0; j < j1; j++) {
        FA_V b[FA_T_NV];
        const FA_T *vrow = vv + j * vsr;
        FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
            if (v < nv) b[v] = FA_SFX(fa_load)(pt + j * lds + v * FA_W);
        FA_UNROLL for (int r = 0; r < FA_T_MRMAX; r++) {
            if (r < mr) {
                const FA_V a = FA_SFX(fa_set1)(vrow[r * vsc]);
                FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
                    if (v < nv) acc[r][v] += a * b[v];
            }
        }
    }
    FA_UNROLL for (int r = 0; r < FA_T_MRMAX; r++)
        if (r < mr)
            FA_UNROLL for (int v = 0; v < FA_T_NV; v++)
                if (v < nv) FA_SFX(fa_store)(ot + r * ldo + v * FA_W, acc[r][v]);
}

static inline __attribute__((always_inline)) void
FA_SFX(fa_tpv_nv)(const FA_T *vv, int64_t vsr, int64_t vsc, int64_t Dv, const FA_T *pt, int64_t lds,
                  int64_t j0, int64_t j1, FA_T *ot, int64_t ldo, const int MR, const int nv)
{
    int64_t c = 0;
    for (; c + MR <= Dv; c += MR)
        FA_SFX(fa_tpv_micro)(vv + c * vsc, vsr, vsc, pt, lds, j0, j1, ot + c * ldo, ldo, MR, nv);
    const int64_t rem = Dv - c;
#define FA_TPV_TAIL(R) \
    FA_SFX(fa_tpv_micro)(vv + c * vsc, vsr, vsc, pt, lds, j0, j1, ot + c * ldo, ldo, R, nv); c += R
    FA_T_TAILS(MR, rem, FA_TPV_TAIL);
#undef FA_TPV_TAIL
}

/* All Dv output columns of one chunk of nv vectors: values v + j*vsr + c*vsc. */
static inline void FA_SFX(fa_tpv_chunk)(const FA_T *vv, int64_t vsr, int64_t vsc, int64_t Dv, const FA_T *pt,
                                        int64_t lds, int64_t j0, int64_t j1, FA_T *ot, int64_t ldo, int nv)
{
    /* contiguous value rows get their own instantiations: see fa_tqk_chunk */
#define FA_TPV_CONTIG(MR, NV) FA_SFX(fa_tpv_nv)(vv, vsr, 1, Dv, pt, lds, j0, j1, ot, ldo, MR, NV)
#define FA_TPV_STRIDED(MR, NV) FA_SFX(fa_tpv_nv)(vv, vsr, vsc, Dv, pt, lds, j0, j1, ot, ldo, MR, NV)
    if (vsc == 1)
        FA_T_BY_WIDTH(nv, FA_TPV_CONTIG);
    else
        FA_T_BY_WIDTH(nv, FA_TPV_STRIDED);
#undef FA_TPV_CONTIG
#undef FA_TPV_STRIDED
}

/* St[j][lane] = -inf where key t0+j lies outside the lane's visible range
 * [lo[lane], hi[lane]) (ranges stored in FA_T, exact for lengths < 2^24 / 2^53). */
static inline __attribute__((always_inline)) void
FA_SFX(fa_tmask_nv)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                    const FA_T *lo, const FA_T *hi, const int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    FA_UNROLL for (int v = 0; v < nv; v++) {
        const FA_V lov = FA_SFX(fa_load)(lo + v * FA_W), hiv = FA_SFX(fa_load)(hi + v * FA_W);
        for (int64_t j = j0; j < j1; j++) {
            const FA_V jv = FA_SFX(fa_set1)((FA_T)(t0 + j));
            FA_T *p = st + j * lds + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_select)((jv >= lov) & (jv < hiv), FA_SFX(fa_load)(p), ninf));
        }
    }
}

/* The same for a chunk of nv = 1, 2 or FA_T_NV vectors (instantiated per width). */
static inline void FA_SFX(fa_tmask_chunk)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                                          const FA_T *lo, const FA_T *hi, int nv)
{
#define FA_TMASK(MR, NV) FA_SFX(fa_tmask_nv)(st, lds, j0, j1, t0, lo, hi, NV)
    FA_T_BY_WIDTH(nv, FA_TMASK);
#undef FA_TMASK
}

/* W bytes, zero-extended to the W lanes of an integer vector: one vpmovzxb{d,q}
 * where the ISA has it (GCC lowers __builtin_convertvector between vectors of
 * different sizes, and a loop of element inserts, to a vpinsr per lane). */
static inline FA_VI FA_SFX(fa_widen_bytes)(const uint8_t *b)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  ifdef FA_DOUBLE
    return (FA_VI)_mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)b));
#  else
    return (FA_VI)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
#  endif
#elif FA_VBYTES == 32 && defined(__AVX2__)
#  ifdef FA_DOUBLE
    int32_t w;
    memcpy(&w, b, sizeof w);
    return (FA_VI)_mm256_cvtepu8_epi64(_mm_cvtsi32_si128(w));
#  else
    return (FA_VI)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
#  endif
#else
    FA_VI k;
    for (int l = 0; l < FA_W; l++) k[l] = b[l];
    return k;
#endif
}

/* St[j][i] += B_i[j] for lanes i < ni and keys j in [j0, j1) of the
 * query-vectorised path, B_i = brows[i] the lane's bias row (elements
 * contiguous, indexed by tile key).  W x W blocks go through registers (W row
 * loads, a transpose, W vector adds) instead of W*W strided scalar updates;
 * the same single add per element, so the same bits. */
static inline void FA_SFX(fa_tbias)(FA_T *st, int64_t lds, int64_t j0, int64_t j1,
                                    const FA_T *const *brows, int64_t ni)
{
    int64_t i0 = 0;
#if FA_HAVE_SHUFFLE
    for (; i0 + FA_W <= ni; i0 += FA_W) {
        int64_t j = j0;
        for (; j + FA_W <= j1; j += FA_W) {
            FA_V r[FA_W];
            FA_UNROLL for (int i = 0; i < FA_W; i++) r[i] = FA_SFX(fa_load)(brows[i0 + i] + j);
            FA_SFX(fa_transpose)(r);
            FA_UNROLL for (int k = 0; k < FA_W; k++) {
                FA_T *p = st + (j + k) * lds + i0;
                FA_SFX(fa_store)(p, FA_SFX(fa_load)(p) + r[k]);
            }
        }
        for (; j < j1; j++)
            for (int64_t i = i0; i < i0 + FA_W; i++) st[j * lds + i] += brows[i][j];
    }
#endif
    for (int64_t i = i0; i < ni; i++)
        for (int64_t j = j0; j < j1; j++) st[j * lds + i] += brows[i][j];
}

/* ALiBi on the query-vectorised path: St[j][i] -= slope_i * |pos_i - (t0 + j)|
 * over lanes [0, nv * W) (lanes past ni get slope 0: padding lanes, masked
 * later) and keys [j0, j1).  slopes: the batch entry's table (one per group),
 * goff / pos: each lane's group and diagonal position.  The distance is exact
 * in FA_T while positions and keys stay below 2^22 (float; the caller checks). */
static inline void FA_SFX(fa_talibi)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                                     const FA_T *slopes, const int64_t *goff, const int64_t *pos,
                                     int64_t ni, int nv)
{
    FA_T sl[FA_T_NV * FA_W] __attribute__((aligned(FA_ALIGN)));
    FA_T ps[FA_T_NV * FA_W] __attribute__((aligned(FA_ALIGN)));
    for (int64_t i = 0; i < (int64_t)nv * FA_W; i++) {
        sl[i] = i < ni ? slopes[goff[i]] : 0;
        ps[i] = i < ni ? (FA_T)pos[i] : 0;
    }
    for (int v = 0; v < nv; v++) {
        const FA_V sv = FA_SFX(fa_load)(sl + v * FA_W), pv = FA_SFX(fa_load)(ps + v * FA_W);
        for (int64_t j = j0; j < j1; j++) {
            FA_V d = pv - FA_SFX(fa_set1)((FA_T)(t0 + j));
            d = FA_SFX(fa_select)(d < 0, -d, d);
            FA_T *p = st + j * lds + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_load)(p) - sv * d);
        }
    }
}

/* x[j] = -inf where m[j] is 0 (a row's boolean mask over contiguous bytes),
 * without branches: a random mask would mispredict half of them. */
static inline void FA_SFX(fa_row_mask_bool)(FA_T *x, const uint8_t *m, int64_t n)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W)
        FA_SFX(fa_store)(x + j, FA_SFX(fa_select)(FA_SFX(fa_widen_bytes)(m + j) != 0,
                                                  FA_SFX(fa_load)(x + j), ninf));
    for (; j < n; j++)
        if (!m[j]) x[j] = -(FA_T)INFINITY;
}

/* St[j][lane] = -inf where the boolean mask says the lane's query may not see key
 * t0+j.  mrows[lane] points at the lane's mask row (column 0), columns sc bytes
 * apart; lanes >= nl are left alone (padding lanes are masked by their empty
 * range).  The mask block is first transposed into tbuf (cw x (j1-j0) bytes) so
 * the select runs on whole vectors of lanes without branches: a random mask would
 * mispredict half of its branches. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_tmask_bool_nv)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                         const uint8_t *const *mrows, int64_t nl, int64_t sc, uint8_t *tbuf, const int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    const int64_t cw = (int64_t)nv * FA_W;
#if FA_HAVE_SHUFFLE
    if (sc == 1) {
        /* contiguous mask rows: blocks of 16 lanes x 16 keys, loaded as 16 rows
         * of 16 bytes and transposed in registers (a partial block: the missing
         * keys are zero bytes, never stored; lanes past nl keep everything) */
        const fa_u8x16 ones = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        for (int64_t L0 = 0; L0 < cw; L0 += 16) {
            const int64_t nlb = cw - L0 < 16 ? cw - L0 : 16;
            for (int64_t J0 = j0; J0 < j1; J0 += 16) {
                const int64_t nk = j1 - J0 < 16 ? j1 - J0 : 16;
                fa_u8x16 r[16];
                for (int l = 0; l < 16; l++) {
                    if (L0 + l < nl) {
                        const uint8_t *m = mrows[L0 + l] + t0 + J0;
                        if (nk == 16) {
                            memcpy(&r[l], m, 16);
                        } else {
                            r[l] = ones - ones;
                            memcpy(&r[l], m, (size_t)nk);
                        }
                    } else {
                        r[l] = ones;
                    }
                }
                fa_transpose_u8x16(r);
                for (int64_t jj = 0; jj < nk; jj++) {
                    uint8_t *dst = tbuf + (J0 + jj - j0) * cw + L0;
                    if (nlb == 16)
                        memcpy(dst, &r[jj], 16);
                    else
                        memcpy(dst, &r[jj], (size_t)nlb);
                }
            }
        }
    } else
#endif
    for (int64_t i = 0; i < cw; i++) {
        uint8_t *col = tbuf + i;
        if (i < nl) {
            const uint8_t *m = mrows[i] + t0 * sc;
            for (int64_t j = j0; j < j1; j++) col[(j - j0) * cw] = m[j * sc];
        } else {
            for (int64_t j = j0; j < j1; j++) col[(j - j0) * cw] = 1;
        }
    }
    for (int64_t j = j0; j < j1; j++) {
        const uint8_t *row = tbuf + (j - j0) * cw;
        FA_UNROLL for (int v = 0; v < nv; v++) {
            const FA_VI keep = FA_SFX(fa_widen_bytes)(row + v * FA_W);
            FA_T *p = st + j * lds + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_select)(keep != 0, FA_SFX(fa_load)(p), ninf));
        }
    }
}

/* The same for a chunk of nv = 1, 2 or FA_T_NV vectors (instantiated per width). */
static inline void FA_SFX(fa_tmask_bool_chunk)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                                               const uint8_t *const *mrows, int64_t nl, int64_t sc,
                                               uint8_t *tbuf, int nv)
{
#define FA_TMASK_BOOL(MR, NV) FA_SFX(fa_tmask_bool_nv)(st, lds, j0, j1, t0, mrows, nl, sc, tbuf, NV)
    FA_T_BY_WIDTH(nv, FA_TMASK_BOOL);
#undef FA_TMASK_BOOL
}

/* Online softmax update of one chunk over rows [j0, j1) of St: running
 * reference m, rescale of the running sum l and of the accumulator Ot (Dv rows)
 * by exp(m_old - m_new), St -> P = exp(St - m_new).  NaN propagates per lane; a
 * lane whose scores are all -inf so far keeps m = -inf, l = 0 and gets P = 0.
 *
 * Lazy rescale: m is the first finite max of the lane and moves only when a
 * tile's max exceeds it by more than FA_RESCALE_SLACK, so P <= exp(slack) and
 * the result is the same softmax (any reference cancels in Ot / l).  Once the
 * lanes settle, alpha is exactly 1 and the pass over Ot is skipped. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_tsoftmax_nv)(FA_T *st, int64_t lds, int64_t j0, int64_t j1, FA_T *m, FA_T *l,
                       FA_T *ot, int64_t ldo, int64_t Dv, const FA_T *mx, const int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    FA_V alpha[FA_T_NV];
    FA_VI moved = (FA_VI)FA_SFX(fa_set1)(0);
    FA_UNROLL for (int v = 0; v < nv; v++) {
        /* The tile max per lane (given in mx, or a pass over the tile) with plain
         * max, which skips NaN scores: a NaN still makes its lane NaN, through
         * exp(NaN - m) in the sum l and through P.V, exactly as a NaN max would. */
        FA_V mt0 = ninf, mt1 = ninf;
        int64_t j = j0;
        if (mx) {
            mt0 = FA_SFX(fa_load)(mx + v * FA_W);
        } else {
            for (; j + 2 <= j1; j += 2) {
                mt0 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(st + j * lds + v * FA_W), mt0);
                mt1 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(st + (j + 1) * lds + v * FA_W), mt1);
            }
            if (j < j1) mt0 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(st + j * lds + v * FA_W), mt0);
        }
        const FA_V mo = FA_SFX(fa_load)(m + v * FA_W);
        const FA_V mt = FA_SFX(FA_VMAX)(mt0, mt1);
        /* mo = -inf: -inf + slack is -inf, any finite or +inf max moves it */
        const FA_V mn = FA_SFX(fa_select)(mt > mo + (FA_T)FA_RESCALE_SLACK, mt, mo);
        moved |= mn != mo;
        const FA_V mn_safe = FA_SFX(fa_select)(mn == ninf, FA_SFX(fa_set1)(0), mn);
        alpha[v] = FA_SFX(fa_vexp_p)(mo - mn_safe);
        FA_V s0 = FA_SFX(fa_set1)(0), s1 = s0;
        for (j = j0; j + 2 <= j1; j += 2) {
            FA_T *p0 = st + j * lds + v * FA_W, *p1 = p0 + lds;
            const FA_V e0 = FA_SFX(fa_vexp_p)(FA_SFX(fa_load)(p0) - mn_safe);
            const FA_V e1 = FA_SFX(fa_vexp_p)(FA_SFX(fa_load)(p1) - mn_safe);
            FA_SFX(fa_store)(p0, e0);
            FA_SFX(fa_store)(p1, e1);
            s0 += e0;
            s1 += e1;
        }
        if (j < j1) {
            FA_T *p0 = st + j * lds + v * FA_W;
            const FA_V e0 = FA_SFX(fa_vexp_p)(FA_SFX(fa_load)(p0) - mn_safe);
            FA_SFX(fa_store)(p0, e0);
            s0 += e0;
        }
        FA_SFX(fa_store)(l + v * FA_W, FA_SFX(fa_load)(l + v * FA_W) * alpha[v] + (s0 + s1));
        FA_SFX(fa_store)(m + v * FA_W, mn);
    }
    /* no lane moved: every alpha is exp(0) = 1 exactly, or exp(-inf) = 0 for a
     * lane still at -inf, whose Ot holds only 0 * v terms and whose l is 0 (its
     * output is written as zeros) -- the multiply would change nothing */
    if (!FA_SFX(fa_any)(moved)) return;
    for (int64_t c = 0; c < Dv; c++)
        FA_UNROLL for (int v = 0; v < nv; v++) {
            FA_T *p = ot + c * ldo + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_load)(p) * alpha[v]);
        }
}

/* The same for a chunk of nv = 1, 2 or FA_T_NV vectors (instantiated per width). */
static inline void FA_SFX(fa_tsoftmax_chunk)(FA_T *st, int64_t lds, int64_t j0, int64_t j1,
                                             FA_T *m, FA_T *l, FA_T *ot, int64_t ldo, int64_t Dv,
                                             const FA_T *mx, int nv)
{
#define FA_TSOFTMAX(MR, NV) FA_SFX(fa_tsoftmax_nv)(st, lds, j0, j1, m, l, ot, ldo, Dv, mx, NV)
    FA_T_BY_WIDTH(nv, FA_TSOFTMAX);
#undef FA_TSOFTMAX
}

/* return_weights, second pass: St[j][lane] -> exp(St - lse[lane]) over rows
 * [j0, j1) of a chunk of nv vectors (lse from the first pass: >= every score of
 * the lane, so the arguments are <= 0 up to rounding).  A lane with lse = -inf
 * saw only -inf scores: its weights are 0 (the -inf - 0 of the safe lse); a NaN
 * lse makes the lane's weights NaN. */
static inline void FA_SFX(fa_tweights_chunk)(FA_T *st, int64_t lds, int64_t j0, int64_t j1,
                                             const FA_T *lse, int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    for (int v = 0; v < nv; v++) {
        const FA_V ls = FA_SFX(fa_load)(lse + v * FA_W);
        const FA_V ls_safe = FA_SFX(fa_select)(ls == ninf, FA_SFX(fa_set1)(0), ls);
        for (int64_t j = j0; j < j1; j++) {
            FA_T *p = st + j * lds + v * FA_W;
            FA_SFX(fa_store)(p, FA_SFX(fa_vexp_nonpos)(FA_SFX(fa_load)(p) - ls_safe));
        }
    }
}

/* 1 if any element of the rows x cols block (strided) is inf or NaN: x * 0 is 0
 * for finite x and NaN otherwise, accumulated in vectors. */
static inline int FA_SFX(fa_block_nonfinite)(const FA_T *x, int64_t rows, int64_t cols, int64_t sr, int64_t sc)
{
    /* four independent chains: one chain would be bound by the add latency */
    FA_V acc0 = FA_SFX(fa_set1)(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    FA_T probe = 0;
    const int64_t pf = FA_SFX(fa_pf_rows)(cols);
    for (int64_t j = 0; j < rows; j++) {
        const FA_T *row = x + j * sr;
        int64_t c = 0;
        if (sc == 1) {
            FA_SFX(fa_prefetch)(row + pf * sr, cols);
            for (; c + 4 * FA_W <= cols; c += 4 * FA_W) {
                acc0 += FA_SFX(fa_load)(row + c) * 0;
                acc1 += FA_SFX(fa_load)(row + c + FA_W) * 0;
                acc2 += FA_SFX(fa_load)(row + c + 2 * FA_W) * 0;
                acc3 += FA_SFX(fa_load)(row + c + 3 * FA_W) * 0;
            }
            for (; c + FA_W <= cols; c += FA_W) acc0 += FA_SFX(fa_load)(row + c) * 0;
        }
        for (; c < cols; c++) probe += row[c * sc] * 0;
    }
    return probe + FA_SFX(fa_hsum)((acc0 + acc1) + (acc2 + acc3)) != 0;    /* 0 or NaN */
}

#undef FA_T_TAILS
#undef FA_T_BY_WIDTH
#undef FA_W
#undef FA_QK_NR
