/* The vectorised exp (exact 0 for -inf and below the normal range, +inf above,
 * NaN kept) in its three forms -- general, softmax arguments, and the online
 * softmax's probabilities with their cut below 2^-62.5 of the running max --,
 * the row exp-and-sum of a softmax row, and softcap's tanh.  Part of the
 * per-type body (simd_body.h).  Not a standalone header. */

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
 * result has the same bits wherever it is a normal number).
 * low (a constant; float only): a degree-4 polynomial instead (relative error
 * 2.9e-6, minimax for the relative error with p(0) = 1), for probabilities
 * rounded to bfloat16 right after (fa_vexp_p4). */
static inline __attribute__((always_inline)) FA_V FA_SFX(fa_exp_core_b)(FA_V xc, const FA_T b, const FA_T sc,
                                                                          const int low)
{
    (void)low;                  /* float only */
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
    if (low) {
        FA_V p = FA_SFX(fa_set1)((FA_T)(4.1513602482723524e-2f) * sc);
        p = p * r + (FA_T)(1.6787438486282272e-1f) * sc;
        p = p * r + (FA_T)(5.000301417141942e-1f) * sc;
        p = p * r + (FA_T)(9.999668562438684e-1f) * sc;
        p = p * r + (FA_T)(1.0f) * sc;
        return p * (FA_V)((FA_VI)t << FA_MANT_BITS);
    }
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
    return FA_SFX(fa_exp_core_b)(xc, FA_EXP_BIAS, 1, 0);
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
    return FA_SFX(fa_exp_core)(FA_SFX(fa_vmax)(FA_SFX(fa_set1)(FA_EXP_ZERO), x));
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
    return FA_SFX(fa_exp_core_b)(FA_SFX(fa_vmax)(FA_SFX(fa_set1)(FA_P_ZERO), x), FA_P_BIAS, FA_P_SCALE, 0);
}

/* fa_vexp_p with fa_exp_core_b's degree-4 polynomial in float (double: the
 * same as fa_vexp_p): for the probabilities the bfloat16 softmax rounds to
 * bfloat16 pairs right after (bf16_dot.h), where 2.9e-6 is far below that
 * rounding (2^-9). */
static inline FA_V FA_SFX(fa_vexp_p4)(FA_V x)
{
    return FA_SFX(fa_exp_core_b)(FA_SFX(fa_vmax)(FA_SFX(fa_set1)(FA_P_ZERO), x), FA_P_BIAS, FA_P_SCALE, 1);
}

/* The same for one argument (the row-major path's rescale factor exp(m_old -
 * m_new)); libm's exp, bit for bit, from FA_P_ZERO on. */
static inline FA_T FA_SFX(fa_exp_p)(FA_T x)
{
    return x < FA_P_ZERO ? (FA_T)0 : (FA_T)exp(x);
}

/* y[j] = exp(x[j] - m) for j < n (x and y may be the same row) as fa_vexp_p
 * (p = 1) or fa_vexp_nonpos (p = 0, a compile-time constant); returns the sum. */
static inline __attribute__((always_inline)) FA_V FA_SFX(fa_vexp_pick)(FA_V x, const int p)
{
    return p ? FA_SFX(fa_vexp_p)(x) : FA_SFX(fa_vexp_nonpos)(x);
}

static inline __attribute__((always_inline)) FA_T
FA_SFX(fa_row_exp_sum_pick)(const FA_T *x, FA_T *y, int64_t n, FA_T m, const int p, const FA_T *next)
{
    const FA_V vm = FA_SFX(fa_set1)(m);
    FA_V s0 = FA_SFX(fa_set1)(0), s1 = s0;
    int64_t j = 0;
    for (; j + 2 * FA_W <= n; j += 2 * FA_W) {
        /* next: the row that comes after this one, as many bytes requested into
         * L2 as this step reads, so that its read from memory overlaps this
         * row's arithmetic */
        if (next) fa_prefetch_l2_bytes(next + j, 2 * FA_W * (int64_t)sizeof(FA_T));
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
    return FA_SFX(fa_row_exp_sum_pick)(x, y, n, m, 0, NULL);
}

/* fa_row_exp_sum that also requests the row `next` (n elements; the next row of
 * a softmax over many rows) into L2 while it computes: the same values */
static inline FA_T FA_SFX(fa_row_exp_sum_next)(const FA_T *x, FA_T *y, int64_t n, FA_T m, const FA_T *next)
{
    return FA_SFX(fa_row_exp_sum_pick)(x, y, n, m, 0, next);
}

/* the online softmax of attention (probabilities for P.V): exp as fa_vexp_p */
static inline FA_T FA_SFX(fa_row_exp_sum_p)(const FA_T *x, FA_T *y, int64_t n, FA_T m)
{
    return FA_SFX(fa_row_exp_sum_pick)(x, y, n, m, 1, NULL);
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
