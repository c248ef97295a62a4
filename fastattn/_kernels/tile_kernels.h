/* Register-blocked micro-kernels on packed tiles (the row-major path with many
 * rows): S = Qp . Kt over panels of transposed keys, O += P . V over value rows,
 * and a row's boolean mask.  Part of the per-type body (simd_body.h); the P.V
 * column loop fa_pv_cols comes from stored_reads.h.  Not a standalone header. */

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

/* O[0:MR, 0:nvec*W] += P[0:MR, k0:k1] . V[k0:k1, 0:nvec*W], in column chunks. */
static inline void FA_SFX(fa_pv_block)(const FA_T *restrict p, int64_t ldp, const FA_T *restrict vp,
                                       int64_t ldv, int64_t k0, int64_t k1, FA_T *restrict o,
                                       int64_t ldo, int64_t nvec)
{
    FA_SFX(fa_pv_cols)(p, ldp, vp, ldv, k0, k1, o, ldo, nvec, FA_PV_MR, 0, 0, 0);
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
