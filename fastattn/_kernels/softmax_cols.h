/* Softmax down columns: lanes over the contiguous axis, for a softmax along a
 * strided axis.  Part of the per-type body (simd_body.h).  Not a standalone header. */

/* Softmax (or log-softmax) down nv * W columns at once: element j of column c
 * at x[j * sx + c], result at y[j * sy + c], j < n.  Lanes run over the
 * columns (the contiguous axis), so a softmax along a strided axis reads whole
 * vectors: max, exp and sum, then scale or shift.  A column of only -inf gives
 * zeros (-inf for log); +inf or NaN in a column gives NaN in that column. */
static inline __attribute__((always_inline)) void
FA_SFX(fa_col_softmax_nv)(const FA_T *x, int64_t sx, FA_T *y, int64_t sy, int64_t n, int log_mode, const int nv)
{
    const FA_V ninf = FA_SFX(fa_set1)(-(FA_T)INFINITY), zero = FA_SFX(fa_set1)(0);
    FA_V m[FA_QVEC_NV], s[FA_QVEC_NV];
    FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++) {
        m[v] = ninf;
        s[v] = zero;
    }
    /* the max skips NaN (the load is max's second operand); a NaN still makes
     * its column NaN, through exp(NaN - m) in the sum */
    for (int64_t j = 0; j < n; j++)
        FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
            if (v < nv) m[v] = FA_SFX(fa_vmax)(FA_SFX(fa_load)(x + j * sx + v * FA_W), m[v]);
    /* a column without a value above -inf: exp(x - 0) = 0 (or NaN) everywhere */
    FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
        if (v < nv) m[v] = FA_SFX(fa_select)(m[v] == ninf, zero, m[v]);
    for (int64_t j = 0; j < n; j++)
        FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
            if (v < nv) {
                const FA_V e = FA_SFX(fa_vexp_nonpos)(FA_SFX(fa_load)(x + j * sx + v * FA_W) - m[v]);
                s[v] += e;
                if (!log_mode) FA_SFX(fa_store)(y + j * sy + v * FA_W, e);
            }
    FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
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
        FA_UNROLL for (int v = 0; v < FA_QVEC_NV; v++)
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

/* Columns [c0, c0 + FA_QVEC_NV * FA_W) or [c0, c0 + FA_W) of a column softmax. */
static inline void FA_SFX(fa_col_softmax_chunk)(const FA_T *x, int64_t sx, FA_T *y, int64_t sy, int64_t n,
                                                int log_mode)
{
    FA_SFX(fa_col_softmax_nv)(x, sx, y, sy, n, log_mode, FA_QVEC_NV);
}

static inline void FA_SFX(fa_col_softmax_vec)(const FA_T *x, int64_t sx, FA_T *y, int64_t sy, int64_t n,
                                              int log_mode)
{
    FA_SFX(fa_col_softmax_nv)(x, sx, y, sy, n, log_mode, 1);
}
