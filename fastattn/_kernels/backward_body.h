/* One body for the float and double backward kernels; included by
 * backward_kernels.h with FA_T, FA_V, FA_VI and FA_SFX defined.  Not a
 * standalone header. */

#define FA_W ((int)(FA_VBYTES / sizeof(FA_T)))        /* lanes per vector */

/* dst[i * ldd + d] = src[off[i] + d * sc] * scale for i < n, d < D, zeros in
 * columns D..ldd-1 (ldd a multiple of W) and in rows n..npad-1: the row
 * operands of the backward's products (scaled queries and keys, output
 * gradients), padded to whole vectors and register blocks.  Returns 1 when a
 * packed element is inf or NaN (x * 0 is NaN only for those): such a block must
 * not meet the zero weights of invisible pairs in a blocked product. */
static inline int FA_SFX(fa_bwd_pack_rows)(const FA_T *src, const int64_t *off, int64_t sc, int64_t n,
                                           int64_t D, FA_T scale, FA_T *dst, int64_t ldd, int64_t npad)
{
    FA_V acc = FA_SFX(fa_set1)(0);
    for (int64_t i = 0; i < n; i++) {
        const FA_T *s = src + off[i];
        FA_T *d = dst + i * ldd;
        int64_t c = 0;
        if (sc == 1) {
            for (; c + FA_W <= D; c += FA_W) {
                const FA_V x = FA_SFX(fa_load)(s + c) * scale;
                FA_SFX(fa_store)(d + c, x);
                acc += x * 0;
            }
            if (c < D) {
                const FA_V x = FA_SFX(fa_load_part)(s + c, D - c, 0) * scale;
                FA_SFX(fa_store)(d + c, x);
                acc += x * 0;
                c += FA_W;
            }
        } else {
            FA_T probe = 0;
            for (; c < D; c++) {
                const FA_T x = s[c * sc] * scale;
                d[c] = x;
                probe += x * 0;
            }
            acc += probe;
            for (; c < ldd; c++) d[c] = 0;
        }
        for (; c < ldd; c += FA_W) FA_SFX(fa_store)(d + c, FA_SFX(fa_set1)(0));
    }
    for (int64_t i = n; i < npad; i++)
        for (int64_t c = 0; c < ldd; c += FA_W) FA_SFX(fa_store)(dst + i * ldd + c, FA_SFX(fa_set1)(0));
    return FA_SFX(fa_hsum)(acc) != 0;
}

/* f[j] = 1 - (x[j] / c)^2 for j < n: the derivative of c * tanh(s / c) at the
 * capped scores x (the softcap's factor in the chain rule). */
static inline void FA_SFX(fa_bwd_softcap_factor)(const FA_T *x, FA_T *f, int64_t n, FA_T c)
{
    const FA_T inv_c = 1 / c;
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W) {
        const FA_V t = FA_SFX(fa_load)(x + j) * inv_c;
        FA_SFX(fa_store)(f + j, 1 - t * t);
    }
    for (; j < n; j++) {
        const FA_T t = x[j] * inv_c;
        f[j] = 1 - t * t;
    }
}

/* exp(x) for x = s - lse (<= 0 up to rounding): fa_vexp_p (0 below ~2^-62.5,
 * no subnormal probabilities), with x clamped at 80 so that an lse that does
 * not belong to these scores gives large finite numbers, not garbage. */
static inline __attribute__((always_inline)) FA_V FA_SFX(fa_bwd_prob)(FA_V x)
{
    const FA_V hi = FA_SFX(fa_set1)(80);
    return FA_SFX(fa_vexp_p)(FA_SFX(fa_select)(x > hi, hi, x));
}

/* The probabilities and score gradients of one tile, rows [0, nr) by keys
 * [0, nc) (both multiples of W; s, dp, f, dsr and db rows lds apart).  With
 * live = (s != -inf):
 *     p  = live ? exp(s - lse[i]) : 0
 *     g  = live ? p * (dp - dd[i]) : 0        -> db (the bias gradient; NULL: none)
 *     ds = live ? g * f : 0  (f NULL: ds = g)  -> dsr (dsr may be dp itself)
 * and the transposes pt[j * ldt + i] = p, dst[j * ldt + i] = ds, for the
 * products over queries (dV += P^T dO, dK += dS^T Q).  A dead pair gives 0 even
 * when its dp, f or lse is inf or NaN.  W x W blocks go through registers: W
 * row vectors, one transpose, W column vectors. */
static inline void FA_SFX(fa_bwd_tile)(const FA_T *s, const FA_T *dp, const FA_T *f, int64_t lds,
                                       const FA_T *lse, const FA_T *dd, int64_t nr, int64_t nc,
                                       FA_T *dsr, FA_T *db, FA_T *pt, FA_T *dst, int64_t ldt)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY);
    const FA_V zero = FA_SFX(fa_set1)(0);
    for (int64_t i0 = 0; i0 < nr; i0 += FA_W) {
        for (int64_t j0 = 0; j0 < nc; j0 += FA_W) {
            FA_V r[FA_W];
            FA_UNROLL for (int k = 0; k < FA_W; k++) {
                const int64_t o = (i0 + k) * lds + j0;
                const FA_V sv = FA_SFX(fa_load)(s + o);
                const FA_VI live = sv != ninf;
                const FA_V p = FA_SFX(fa_select)(live, FA_SFX(fa_bwd_prob)(sv - lse[i0 + k]), zero);
                FA_V g = p * (FA_SFX(fa_load)(dp + o) - dd[i0 + k]);
                if (db) FA_SFX(fa_store)(db + o, FA_SFX(fa_select)(live, g, zero));
                if (f) g = g * FA_SFX(fa_load)(f + o);
                FA_SFX(fa_store)(dsr + o, FA_SFX(fa_select)(live, g, zero));
                r[k] = p;
            }
            FA_SFX(fa_transpose)(r);
            FA_UNROLL for (int c = 0; c < FA_W; c++) FA_SFX(fa_store)(pt + (j0 + c) * ldt + i0, r[c]);
            FA_UNROLL for (int k = 0; k < FA_W; k++) r[k] = FA_SFX(fa_load)(dsr + (i0 + k) * lds + j0);
            FA_SFX(fa_transpose)(r);
            FA_UNROLL for (int c = 0; c < FA_W; c++) FA_SFX(fa_store)(dst + (j0 + c) * ldt + i0, r[c]);
        }
    }
}

/* O[0:MR, 0:nv*W] += P[0:MR, k0:k1] . V[k0:k1, 0:nv*W] (nv <= FA_PV_NV a
 * compile-time constant after inlining), the register blocking of simd.h's
 * fa_pv_micro, but summed in two levels: the accumulators start at 0 and the
 * tile's sum is added to O at the end.  The backward's dK, dV and dQ each sum
 * over a whole sequence tile by tile; one running chain of Lq (or Lk) FMAs per
 * element gave float32 errors up to 1.7x torch's (dV, 1024 causal rows, D 128:
 * 8.1e-7 against 4.8e-7), sums per tile (<= 96 terms) plus one add per tile
 * 0.84x (4.0e-7); 1.00-1.07x of torch on the other shapes measured. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_bwd_pv_micro)(const FA_T *restrict p, int64_t ldp, const FA_T *restrict vp, int64_t ldv,
                        int64_t k0, int64_t k1, FA_T *restrict o, int64_t ldo, const int nv)
{
    FA_V acc[FA_PV_MR][FA_PV_NV];
    FA_UNROLL for (int i = 0; i < FA_PV_MR; i++)
        FA_UNROLL for (int v = 0; v < FA_PV_NV; v++) acc[i][v] = FA_SFX(fa_set1)(0);
    for (int64_t k = k0; k < k1; k++) {
        FA_V b[FA_PV_NV];
        FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
            if (v < nv) b[v] = FA_SFX(fa_load)(vp + k * ldv + v * FA_W);
        FA_UNROLL for (int i = 0; i < FA_PV_MR; i++) {
            const FA_V a = FA_SFX(fa_set1)(p[i * ldp + k]);
            FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
                if (v < nv) acc[i][v] += a * b[v];
        }
    }
    FA_UNROLL for (int i = 0; i < FA_PV_MR; i++)
        FA_UNROLL for (int v = 0; v < FA_PV_NV; v++)
            if (v < nv) FA_SFX(fa_store)(o + i * ldo + v * FA_W, FA_SFX(fa_load)(o + i * ldo + v * FA_W) + acc[i][v]);
}

/* O[0:MR, 0:nvec*W] += P[0:MR, k0:k1] . V[k0:k1, 0:nvec*W] in column chunks of
 * FA_PV_NV vectors, each summed in two levels (fa_bwd_pv_micro). */
static inline void FA_SFX(fa_bwd_pv_block)(const FA_T *restrict p, int64_t ldp, const FA_T *restrict vp,
                                           int64_t ldv, int64_t k0, int64_t k1, FA_T *restrict o,
                                           int64_t ldo, int64_t nvec)
{
    int64_t c = 0;
    for (; c + FA_PV_NV <= nvec; c += FA_PV_NV)
        FA_SFX(fa_bwd_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, FA_PV_NV);
    switch (nvec - c) {
    case 1: FA_SFX(fa_bwd_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, 1); break;
    case 2: FA_SFX(fa_bwd_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, 2); break;
    case 3: FA_SFX(fa_bwd_pv_micro)(p, ldp, vp + c * FA_W, ldv, k0, k1, o + c * FA_W, ldo, 3); break;
    default: break;
    }
}

/* dst[c] = sum over g < G, in order, of src[g * stride + c] for c < D (dst
 * contiguous; src rows padded to whole vectors): the dq rows from the
 * per-key-group partials. */
static inline void FA_SFX(fa_bwd_sum_rows)(const FA_T *src, int64_t stride, int64_t G, int64_t D, FA_T *dst)
{
    int64_t c = 0;
    for (; c < D; c += FA_W) {
        FA_V acc = FA_SFX(fa_load)(src + c);
        for (int64_t g = 1; g < G; g++) acc += FA_SFX(fa_load)(src + g * stride + c);
        if (c + FA_W <= D) FA_SFX(fa_store)(dst + c, acc);
        else FA_SFX(fa_store_part)(dst + c, acc, D - c);
    }
}

#undef FA_W
