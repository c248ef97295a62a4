# The kernel body shared by every ISA variant (_attn_baseline.pyx, _attn_avx2.pyx,
# _attn_avx512.pyx include it; setup.py compiles each with its own -march flags).
#
# Division of labour: fastattn/_api.py validates arguments, promotes dtypes and
# allocates outputs; `attention_forward` / `softmax_forward` below turn the arrays
# into a flat plan (pointers, element strides, a broadcast batch shape) and run
# the OpenMP loops without the GIL.  The register-blocked micro-kernels and the
# vectorised exp live in simd.h.

from cython.parallel cimport prange, parallel
from libc.stdint cimport int32_t, int64_t, uint8_t, uintptr_t
from libc.math cimport exp, log, sqrt, isfinite, INFINITY, NAN

cimport numpy as cnp
import numpy as np

cnp.import_array()

ctypedef fused floating:
    float
    double

cdef extern from "simd.h" nogil:
    """
    #if FASTATTN_HAVE_OPENMP
    #include <omp.h>
    #endif
    """
    const char *FA_ISA
    enum:
        FA_VBYTES
        FA_T_MR
        FA_T_NV
        FA_QK_MR
        FA_QK_NV
        FA_PV_MR
        FA_PV_NV
    void *fa_alloc(size_t nbytes)
    void fa_free(void *p)
    float fa_row_max_f(const float *x, int64_t n)
    double fa_row_max_d(const double *x, int64_t n)
    float fa_row_max_nonan_f(const float *x, int64_t n)
    double fa_row_max_nonan_d(const double *x, int64_t n)
    void fa_col_softmax_chunk_f(const float *x, int64_t sx, float *y, int64_t sy, int64_t n, int log_mode)
    void fa_col_softmax_chunk_d(const double *x, int64_t sx, double *y, int64_t sy, int64_t n, int log_mode)
    void fa_col_softmax_vec_f(const float *x, int64_t sx, float *y, int64_t sy, int64_t n, int log_mode)
    void fa_col_softmax_vec_d(const double *x, int64_t sx, double *y, int64_t sy, int64_t n, int log_mode)
    void fa_tq_pack_f(const float *q, const int64_t *qoff, int64_t nr, int64_t D, float scale, float *qt,
                      int64_t ld, int64_t pf)
    void fa_tq_pack_d(const double *q, const int64_t *qoff, int64_t nr, int64_t D, double scale, double *qt,
                      int64_t ld, int64_t pf)
    void fa_tout_rows_f(const float *ot, int64_t ldo, int64_t nr, int64_t Dv, const float *inv, float *o, int64_t sor)
    void fa_tout_rows_d(const double *ot, int64_t ldo, int64_t nr, int64_t Dv, const double *inv, double *o, int64_t sor)
    float fa_row_exp_sum_f(const float *x, float *y, int64_t n, float m)
    double fa_row_exp_sum_d(const double *x, double *y, int64_t n, double m)
    float fa_row_exp_sum_p_f(const float *x, float *y, int64_t n, float m)
    double fa_row_exp_sum_p_d(const double *x, double *y, int64_t n, double m)
    float fa_exp_p_f(float x)
    double fa_exp_p_d(double x)
    void fa_row_scale_f(const float *x, float *y, int64_t n, float a)
    void fa_row_scale_d(const double *x, double *y, int64_t n, double a)
    void fa_row_shift_f(const float *x, float *y, int64_t n, float a)
    void fa_row_shift_d(const double *x, double *y, int64_t n, double a)
    void fa_row_softcap_f(float *x, int64_t n, float c)
    void fa_row_softcap_d(double *x, int64_t n, double c)
    void fa_row_mask_bool_f(float *x, const uint8_t *m, int64_t n)
    void fa_row_mask_bool_d(double *x, const uint8_t *m, int64_t n)
    void fa_tbias_f(float *st, int64_t lds, int64_t j0, int64_t j1, const float *const *brows, int64_t ni)
    void fa_tbias_d(double *st, int64_t lds, int64_t j0, int64_t j1, const double *const *brows, int64_t ni)
    void fa_talibi_f(float *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0, const float *slopes,
                     const int64_t *goff, const int64_t *pos, int64_t ni, int nv)
    void fa_talibi_d(double *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0, const double *slopes,
                     const int64_t *goff, const int64_t *pos, int64_t ni, int nv)
    void fa_qk_block_f(const float *qp, int64_t ldq, const float *kt, int64_t D,
                       float *s, int64_t lds, int64_t c0, int64_t e)
    void fa_qk_block_d(const double *qp, int64_t ldq, const double *kt, int64_t D,
                       double *s, int64_t lds, int64_t c0, int64_t e)
    void fa_pv_block_f(const float *p, int64_t ldp, const float *vp, int64_t ldv,
                       int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec)
    void fa_pv_block_d(const double *p, int64_t ldp, const double *vp, int64_t ldv,
                       int64_t k0, int64_t k1, double *o, int64_t ldo, int64_t nvec)
    void fa_tqk_chunk_f(const float *k, int64_t ksr, int64_t ksc, const float *qt, int64_t ldq,
                        int64_t D, float *st, int64_t lds, int64_t j0, int64_t j1, float *mx, int nv,
                        int pf)
    void fa_tqk_chunk_d(const double *k, int64_t ksr, int64_t ksc, const double *qt, int64_t ldq,
                        int64_t D, double *st, int64_t lds, int64_t j0, int64_t j1, double *mx, int nv,
                        int pf)
    void fa_tpv_chunk_f(const float *v, int64_t vsr, int64_t vsc, int64_t Dv, const float *pt,
                        int64_t lds, int64_t j0, int64_t j1, float *ot, int64_t ldo, int nv)
    void fa_tpv_chunk_d(const double *v, int64_t vsr, int64_t vsc, int64_t Dv, const double *pt,
                        int64_t lds, int64_t j0, int64_t j1, double *ot, int64_t ldo, int nv)
    void fa_tmask_chunk_f(float *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                          const float *lo, const float *hi, int nv)
    void fa_tmask_chunk_d(double *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                          const double *lo, const double *hi, int nv)
    void fa_tsoftmax_chunk_f(float *st, int64_t lds, int64_t j0, int64_t j1, float *m, float *l,
                             float *ot, int64_t ldo, int64_t Dv, const float *mx, int nv)
    void fa_tsoftmax_chunk_d(double *st, int64_t lds, int64_t j0, int64_t j1, double *m, double *l,
                             double *ot, int64_t ldo, int64_t Dv, const double *mx, int nv)
    void fa_qk_rows_f(const float *qp, int64_t ldq, int64_t nr, int64_t D, const float *k, int64_t ksr,
                      int64_t n, float *s, int64_t lds)
    void fa_qk_rows_d(const double *qp, int64_t ldq, int64_t nr, int64_t D, const double *k, int64_t ksr,
                      int64_t n, double *s, int64_t lds)
    void fa_pv_rows_f(const float *p, int64_t ldp, int64_t nr, const float *v, int64_t ldv,
                      int64_t k0, int64_t k1, float *o, int64_t ldo, int64_t nvec)
    void fa_pv_rows_d(const double *p, int64_t ldp, int64_t nr, const double *v, int64_t ldv,
                      int64_t k0, int64_t k1, double *o, int64_t ldo, int64_t nvec)
    void fa_pv_qk_row1_f(const float *p, const float *v, int64_t ldv, int64_t k0, int64_t k1,
                         float *o, int64_t nvec, int prefetch, const float *qp, int64_t D, const float *kn,
                         int64_t ksr, int64_t nk, float *sn)
    void fa_pv_qk_row1_d(const double *p, const double *v, int64_t ldv, int64_t k0, int64_t k1,
                         double *o, int64_t nvec, int prefetch, const double *qp, int64_t D, const double *kn,
                         int64_t ksr, int64_t nk, double *sn)
    void fa_tmask_bool_chunk_f(float *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                               const uint8_t *const *mrows, int64_t nl, int64_t sc, uint8_t *tbuf,
                               int nv)
    void fa_tmask_bool_chunk_d(double *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                               const uint8_t *const *mrows, int64_t nl, int64_t sc, uint8_t *tbuf,
                               int nv)
    void fa_tweights_chunk_f(float *st, int64_t lds, int64_t j0, int64_t j1, const float *lse, int nv)
    void fa_tweights_chunk_d(double *st, int64_t lds, int64_t j0, int64_t j1, const double *lse, int nv)
    void fa_prefetch_rows_f(const float *p, int64_t nrows, int64_t sr, int64_t n)
    void fa_prefetch_rows_d(const double *p, int64_t nrows, int64_t sr, int64_t n)
    int fa_block_nonfinite_f(const float *x, int64_t rows, int64_t cols, int64_t sr, int64_t sc)
    int fa_block_nonfinite_d(const double *x, int64_t rows, int64_t cols, int64_t sr, int64_t sc)
    int fa_pack_rows_f(const float *src, int64_t sr, int64_t n, int64_t D, float *dst, int64_t ldd)
    int fa_pack_rows_d(const double *src, int64_t sr, int64_t n, int64_t D, double *dst, int64_t ldd)

ISA = FA_ISA.decode()

cdef enum:
    MAXDIM = 64          # batch dims supported (NumPy's own limit)
    BLOCK_Q = 64         # query rows per work unit (row-major path: decode, few rows, weights)
    BLOCK_QT = 128       # query rows per work unit (query-vectorised path)
    T_MIN_ROWS = 14      # fewer query rows than this: row-major path (see use_t_path)
    FEW_MAX_ROWS = 13    # units of at most this many rows read keys and values in place (run_unit;
                         # 14 and more rows are query-vectorised, or packed where T pads too much)
    T_RUNS_MAX = 32      # key runs of a chunk's tile (t_runs: <= 22 for FA_T_NV <= 4)
    BLOCK_K = 128        # keys per tile (a multiple of every QK panel width).  Paired on
                         # AVX2 (Zen 3): 64 was 2-8 % slower on long, 1-4 % on prefill, 9 %
                         # on D 256 (fixed costs per tile and chunk: P.V accumulator
                         # loads/stores, softmax setup, a 4-key QK tail), 192 5-7 % slower
                         # on long and D 256, 96 level.  AVX-512 (Xeon): 64 was 1-3 % slower
                         # on long, prefill, batch, f64, D 80 and D 256, level on causal; 256
                         # 2-3 % slower on long, prefill, causal, f64, D 256
    FUSE_CHUNK = 16      # keys per alternating P.V / next-tile Q.K chunk (pv_qk_chunks): a
                         # multiple of FA_W (fa_qk_rows groups keys by W / rows); paired
                         # against 32: 2-13 rows 1.00-1.03x; 64: 0.96-0.99x
    PANEL_MAX = 32       # keys per QK panel, at most (FA_QK_NV vectors of floats)
    PARALLEL_MIN_WORK = 200000  # smaller problems run on the calling thread alone
    STATIC_MAX_WORK = 1 << 24   # smaller threaded problems: fixed unit -> thread map (attention_run)
    SOFTMAX_PARALLEL_MIN = 32768  # elements; softmax of fewer runs on the calling thread
    SPLIT_TARGET = 32    # split the key range when fewer units than this ...
    SPLIT_MIN_KEYS = 512 # ... into chunks of at least this many keys
    SPLIT_MIN_KEYS_T = 1024  # (query-vectorised units: each split repacks its queries,
                         # writes a partial output and is merged: measured 4-5 % of
                         # the time at 512 keys per split, so at most ~2 % here)
    CAUSAL_NONE = 0
    CAUSAL_TOP_LEFT = 1
    CAUSAL_BOTTOM_RIGHT = 2
    MODE_ONLINE = 0      # online softmax, final out and lse
    MODE_STATS = 1       # first pass of return_weights: only the row lse
    MODE_WEIGHTS = 2     # second pass: weights = exp(s - lse), out = weights . V
    MODE_PARTIAL = 3     # one key split of a decode problem: m, l, unnormalised out


# a per-thread workspace beyond this (64 GiB: absurd head dims) is a MemoryError;
# with memory overcommit such a malloc can "succeed" and fault later
cdef int64_t WORKSPACE_MAX_BYTES = (<int64_t>1) << 36


# ---------------------------------------------------------------- the plan

cdef struct Operand:
    char *base                 # data pointer (compute dtype, bool for masks)
    int64_t bs[MAXDIM]         # strides of the broadcast batch dims, in elements (0 = broadcast)
    int64_t sg                 # stride between query heads of one key/value head group (GQA)
    int64_t sr                 # row stride
    int64_t sc                 # column stride

cdef struct Plan:
    int nb                     # number of batch dims
    int64_t bshape[MAXDIM]
    int64_t nbatch             # product of bshape
    int64_t g                  # query heads per key/value head (1 without GQA)
    int64_t Lq, Lk, Dk, Dv
    int64_t nrows              # g * Lq: the query rows of one batch element
    double scale
    double softcap             # 0: none
    int causal
    int64_t wl, wr             # window sides, -1: unbounded
    int has_mask, has_bias, has_kvlen, has_alibi, want_lse, want_weights
    Operand q, k, v, o, mask, bias, w, lse
    int64_t *kvlen             # (nbatch * g) valid key counts
    char *slopes               # (nbatch * g) ALiBi slopes, compute dtype


cdef inline int64_t batch_offset(const Plan *P, const Operand *op, int64_t b) noexcept nogil:
    """Element offset of batch element b (row-major over bshape) in operand op."""
    cdef int64_t off = 0, idx
    cdef int d
    for d in range(P.nb - 1, -1, -1):
        idx = b % P.bshape[d]
        b = b // P.bshape[d]
        off += idx * op.bs[d]
    return off


cdef int fill_operand(Operand *op, cnp.ndarray a, int trailing, const Plan *P, int64_t hq) except -1:
    """Describe array `a` whose last `trailing` dims are (rows[, cols]) and whose
    leading dims broadcast to the plan's batch shape, the last batch dim being the
    query-head axis of size hq = g * bshape[-1] when GQA folds heads into rows."""
    cdef int nd = a.ndim
    cdef int nbd = nd - trailing
    cdef int64_t item = cnp.PyArray_ITEMSIZE(a)
    cdef int d, pd
    cdef int64_t size, stride
    op.base = <char *>cnp.PyArray_DATA(a)
    op.sg = 0
    for d in range(P.nb):
        op.bs[d] = 0
    for d in range(nbd):
        pd = P.nb - nbd + d
        size = a.shape[d]
        stride = a.strides[d]
        if stride % item:
            raise ValueError("array strides must be multiples of the item size")
        stride //= item
        if size == 1:
            continue
        if pd == P.nb - 1 and P.g > 1 and size == hq:
            op.bs[pd] = stride * P.g
            op.sg = stride
        else:
            op.bs[pd] = stride
    op.sr = a.strides[nd - trailing] // item if trailing >= 1 else 0
    op.sc = a.strides[nd - 1] // item if trailing >= 2 else 0
    if trailing >= 1 and a.shape[nd - trailing] == 1:
        op.sr = 0
    if trailing >= 2 and a.shape[nd - 1] == 1:
        op.sc = 0
    return 0


# ---------------------------------------------------------------- fused-type wrappers

cdef inline floating row_max(const floating *x, int64_t n) noexcept nogil:
    if floating is float:
        return fa_row_max_f(x, n)
    else:
        return fa_row_max_d(x, n)

cdef inline floating row_max_nonan(const floating *x, int64_t n) noexcept nogil:
    if floating is float:
        return fa_row_max_nonan_f(x, n)
    else:
        return fa_row_max_nonan_d(x, n)

cdef inline void tout_rows(const floating *ot, int64_t ldo, int64_t nr, int64_t Dv, const floating *inv,
                           floating *o, int64_t sor) noexcept nogil:
    if floating is float:
        fa_tout_rows_f(ot, ldo, nr, Dv, inv, o, sor)
    else:
        fa_tout_rows_d(ot, ldo, nr, Dv, inv, o, sor)

cdef inline floating row_exp_sum(const floating *x, floating *y, int64_t n, floating m) noexcept nogil:
    if floating is float:
        return fa_row_exp_sum_f(x, y, n, m)
    else:
        return fa_row_exp_sum_d(x, y, n, m)

cdef inline void row_scale(const floating *x, floating *y, int64_t n, floating a) noexcept nogil:
    if floating is float:
        fa_row_scale_f(x, y, n, a)
    else:
        fa_row_scale_d(x, y, n, a)

cdef inline void row_shift(const floating *x, floating *y, int64_t n, floating a) noexcept nogil:
    if floating is float:
        fa_row_shift_f(x, y, n, a)
    else:
        fa_row_shift_d(x, y, n, a)

cdef inline void prefetch_rows(const floating *p, int64_t nrows, int64_t sr, int64_t n) noexcept nogil:
    if floating is float:
        fa_prefetch_rows_f(p, nrows, sr, n)
    else:
        fa_prefetch_rows_d(p, nrows, sr, n)

cdef inline void row_softcap(floating *x, int64_t n, floating c) noexcept nogil:
    if floating is float:
        fa_row_softcap_f(x, n, c)
    else:
        fa_row_softcap_d(x, n, c)

cdef inline void qk_block(const floating *qp, int64_t ldq, const floating *kt, int64_t D,
                          floating *s, int64_t lds, int64_t c0, int64_t e) noexcept nogil:
    if floating is float:
        fa_qk_block_f(qp, ldq, kt, D, s, lds, c0, e)
    else:
        fa_qk_block_d(qp, ldq, kt, D, s, lds, c0, e)

cdef inline void pv_block(const floating *p, int64_t ldp, const floating *vp, int64_t ldv,
                          int64_t k0, int64_t k1, floating *o, int64_t ldo, int64_t nvec) noexcept nogil:
    if floating is float:
        fa_pv_block_f(p, ldp, vp, ldv, k0, k1, o, ldo, nvec)
    else:
        fa_pv_block_d(p, ldp, vp, ldv, k0, k1, o, ldo, nvec)


cdef inline void tqk_chunk(const floating *k, int64_t ksr, int64_t ksc, const floating *qt, int64_t ldq,
                           int64_t D, floating *st, int64_t lds, int64_t j0, int64_t j1,
                           floating *mx, int nv, int pf) noexcept nogil:
    if floating is float:
        fa_tqk_chunk_f(k, ksr, ksc, qt, ldq, D, st, lds, j0, j1, mx, nv, pf)
    else:
        fa_tqk_chunk_d(k, ksr, ksc, qt, ldq, D, st, lds, j0, j1, mx, nv, pf)

cdef inline void tpv_chunk(const floating *v, int64_t vsr, int64_t vsc, int64_t Dv, const floating *pt,
                           int64_t lds, int64_t j0, int64_t j1, floating *ot, int64_t ldo,
                           int nv) noexcept nogil:
    if floating is float:
        fa_tpv_chunk_f(v, vsr, vsc, Dv, pt, lds, j0, j1, ot, ldo, nv)
    else:
        fa_tpv_chunk_d(v, vsr, vsc, Dv, pt, lds, j0, j1, ot, ldo, nv)

cdef inline void tmask_chunk(floating *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                             const floating *lo, const floating *hi, int nv) noexcept nogil:
    if floating is float:
        fa_tmask_chunk_f(st, lds, j0, j1, t0, lo, hi, nv)
    else:
        fa_tmask_chunk_d(st, lds, j0, j1, t0, lo, hi, nv)

cdef inline void tsoftmax_chunk(floating *st, int64_t lds, int64_t j0, int64_t j1, floating *m,
                                floating *l, floating *ot, int64_t ldo, int64_t Dv,
                                const floating *mx, int nv) noexcept nogil:
    if floating is float:
        fa_tsoftmax_chunk_f(st, lds, j0, j1, m, l, ot, ldo, Dv, mx, nv)
    else:
        fa_tsoftmax_chunk_d(st, lds, j0, j1, m, l, ot, ldo, Dv, mx, nv)

cdef inline void qk_rows(const floating *qp, int64_t ldq, int64_t nr, int64_t D, const floating *k,
                         int64_t ksr, int64_t n, floating *s, int64_t lds) noexcept nogil:
    if floating is float:
        fa_qk_rows_f(qp, ldq, nr, D, k, ksr, n, s, lds)
    else:
        fa_qk_rows_d(qp, ldq, nr, D, k, ksr, n, s, lds)

cdef inline void pv_rows(const floating *p, int64_t ldp, int64_t nr, const floating *v, int64_t ldv,
                         int64_t k0, int64_t k1, floating *o, int64_t ldo, int64_t nvec) noexcept nogil:
    if floating is float:
        fa_pv_rows_f(p, ldp, nr, v, ldv, k0, k1, o, ldo, nvec)
    else:
        fa_pv_rows_d(p, ldp, nr, v, ldv, k0, k1, o, ldo, nvec)

cdef inline void pv_qk_row1(const floating *p, const floating *v, int64_t ldv, int64_t k0, int64_t k1,
                            floating *o, int64_t nvec, const floating *qp, int64_t D, const floating *kn,
                            int64_t ksr, int64_t nk, floating *sn) noexcept nogil:
    if floating is float:
        fa_pv_qk_row1_f(p, v, ldv, k0, k1, o, nvec, 1, qp, D, kn, ksr, nk, sn)
    else:
        fa_pv_qk_row1_d(p, v, ldv, k0, k1, o, nvec, 1, qp, D, kn, ksr, nk, sn)

cdef inline void tmask_bool_chunk(floating *st, int64_t lds, int64_t j0, int64_t j1, int64_t t0,
                                  const uint8_t *const *mrows, int64_t nl, int64_t sc,
                                  uint8_t *tbuf, int nv) noexcept nogil:
    if floating is float:
        fa_tmask_bool_chunk_f(st, lds, j0, j1, t0, mrows, nl, sc, tbuf, nv)
    else:
        fa_tmask_bool_chunk_d(st, lds, j0, j1, t0, mrows, nl, sc, tbuf, nv)

cdef inline void tweights_chunk(floating *st, int64_t lds, int64_t j0, int64_t j1, const floating *lse,
                                int nv) noexcept nogil:
    if floating is float:
        fa_tweights_chunk_f(st, lds, j0, j1, lse, nv)
    else:
        fa_tweights_chunk_d(st, lds, j0, j1, lse, nv)

cdef inline int block_nonfinite(const floating *x, int64_t rows, int64_t cols, int64_t sr, int64_t sc) noexcept nogil:
    if floating is float:
        return fa_block_nonfinite_f(x, rows, cols, sr, sc)
    else:
        return fa_block_nonfinite_d(x, rows, cols, sr, sc)


cdef inline int64_t round_up(int64_t x, int64_t m) noexcept nogil:
    if m & (m - 1) == 0:        # a power of two (every call but a few): no division
        return (x + m - 1) & -m
    return (x + m - 1) // m * m


# ---------------------------------------------------------------- per-thread workspace

cdef struct Workspace:
    char *arena     # one allocation holding every buffer below
    void *qp        # BLOCK_Q' x Dk      packed, scaled query rows
    void *kt        # panels of Dk x NR  packed, transposed key tile
    void *vp        # BLOCK_K x Dvp      packed value tile (columns padded to a vector)
    void *s         # BLOCK_Q' x BLOCK_K scores, then probabilities
    void *o         # BLOCK_Q' x Dvp     output accumulator
    void *m         # BLOCK_Q'           running row max
    double *l       # BLOCK_Q'           running row sum (double even for float inputs)
    int64_t *lo     # BLOCK_Q'           first visible key of each row
    int64_t *hi     # BLOCK_Q'           one past the last visible key
    int64_t *pos    # BLOCK_Q'           diagonal position p(i) of each row
    int64_t *qoff   # BLOCK_Q'           element offset of each query row (without batch)
    int64_t *goff   # BLOCK_Q'           group index of each row (GQA)
    # query-vectorised path (lanes = query rows, ld = BLOCK_QT rounded to a chunk, plus a line)
    void *qt        # Dk x ld            scaled queries, transposed
    void *st        # BLOCK_K x ld       scores / probabilities, transposed
    void *ot        # Dv x ld            output accumulator, transposed
    void *mt        # ld                 running max per query lane
    void *lt        # ld                 running sum per query lane
    void *lof       # ld                 visible key range per lane, as floats
    void *hif       # ld
    void *mxt       # chunk              max of the current tile per query lane
    void *mtb       # BLOCK_K x chunk    transposed boolean-mask block (bytes)


cdef inline int64_t rows_alloc(int64_t rows) noexcept nogil:
    # rows rounded up so both micro-kernels can run whole register blocks, and
    # the few-rows QK (fa_qk_rows) whole blocks of up to 8 rows
    return max(round_up(rows, FA_QK_MR), round_up(rows, 8)) + FA_PV_MR


cdef inline int64_t t_ld(size_t item) noexcept nogil:
    # Row stride of the query-vectorised tiles (Qt, St, Ot: one row per dim / key /
    # value column, one lane per query row): BLOCK_QT lanes plus one cache line.
    # A chunk walks one 64-byte column of a tile; with a 512-byte stride its
    # rows map to 8 of the 64 L1 sets, and 64 score rows alone fill all 8 ways
    # of a 32 KiB L1 (Zen 3): the extra line spreads them over every set.
    # Paired on Zen 3 (AVX2): prefill 1.03-1.05x, long 1.04-1.06x, causal
    # 1.06-1.07x, D 256 1.07x, mask/bias 1.05-1.06x.
    return round_up(BLOCK_QT, FA_T_NV * (FA_VBYTES // item)) + 64 // <int64_t>item


cdef inline char *carve(char **cursor, int64_t nbytes) noexcept nogil:
    """Next 64-byte aligned piece of nbytes from the arena at cursor[0]."""
    cdef char *p = cursor[0]
    cursor[0] += round_up(nbytes if nbytes > 0 else 1, 64)
    return p


cdef int64_t workspace_layout(Workspace *ws, const Plan *P, int64_t rows, size_t item, int use_t,
                          char *base) noexcept nogil:
    """Lay the buffers out from base (NULL: only measure); returns the bytes needed.

    One arena per thread and call: a tiny problem pays for one allocation, not twenty."""
    cdef char *cur = base
    cdef int64_t R = rows_alloc(rows)
    cdef int64_t W = FA_VBYTES // item
    cdef int64_t dvp = round_up(P.Dv if P.Dv > 0 else 1, W)
    cdef int64_t dk = P.Dk if P.Dk > 0 else 1
    cdef int64_t dv = P.Dv if P.Dv > 0 else 1
    cdef int64_t ld = t_ld(item)
    ws.qp = ws.kt = ws.vp = ws.s = ws.o = ws.m = NULL
    ws.l = NULL
    ws.qt = ws.st = ws.ot = ws.mt = ws.lt = ws.lof = ws.hif = ws.mtb = ws.mxt = NULL
    if use_t:
        ws.qt = carve(&cur, dk * ld * item)
        ws.st = carve(&cur, BLOCK_K * ld * item)
        ws.ot = carve(&cur, dv * ld * item)
        ws.mt = carve(&cur, ld * item)
        ws.lt = carve(&cur, ld * item)
        ws.lof = carve(&cur, ld * item)
        ws.hif = carve(&cur, ld * item)
        ws.mtb = carve(&cur, BLOCK_K * FA_T_NV * (FA_VBYTES // item))
        ws.mxt = carve(&cur, FA_T_NV * (FA_VBYTES // item) * item)
    else:
        ws.qp = carve(&cur, R * dk * item)
        ws.kt = carve(&cur, round_up(BLOCK_K, FA_QK_NV * W) * dk * item)
        ws.vp = carve(&cur, BLOCK_K * dvp * item)
        ws.s = carve(&cur, (R + FEW_MAX_ROWS) * BLOCK_K * item)   # + the next tile's scores (run_unit)
        ws.o = carve(&cur, R * dvp * item)
        ws.m = carve(&cur, R * item)
        ws.l = <double *>carve(&cur, R * sizeof(double))
    ws.lo = <int64_t *>carve(&cur, R * sizeof(int64_t))
    ws.hi = <int64_t *>carve(&cur, R * sizeof(int64_t))
    ws.pos = <int64_t *>carve(&cur, R * sizeof(int64_t))
    ws.qoff = <int64_t *>carve(&cur, R * sizeof(int64_t))
    ws.goff = <int64_t *>carve(&cur, R * sizeof(int64_t))
    return cur - base


cdef int workspace_alloc(Workspace *ws, const Plan *P, int64_t rows, size_t item, int use_t) noexcept nogil:
    cdef int64_t nbytes
    ws.arena = NULL
    if P.Dk > (<int64_t>1 << 32) or P.Dv > (<int64_t>1 << 32):
        return -1       # the byte counts below could overflow int64
    nbytes = workspace_layout(ws, P, rows, item, use_t, NULL)
    if nbytes > WORKSPACE_MAX_BYTES:
        return -1       # absurd head dims: fail like an allocation failure, never overcommit
    ws.arena = <char *>fa_alloc(nbytes)
    if ws.arena == NULL:
        return -1
    workspace_layout(ws, P, rows, item, use_t, ws.arena)
    return 0


cdef void workspace_free(Workspace *ws) noexcept nogil:
    fa_free(ws.arena)
    ws.arena = NULL


cdef Workspace *workspace_new(const Plan *P, int64_t rows, size_t item, int use_t) noexcept nogil:
    """A heap workspace with its arena allocated; NULL (nothing left allocated) on failure."""
    cdef Workspace *ws = <Workspace *>fa_alloc(sizeof(Workspace))
    if ws == NULL:
        return NULL
    if workspace_alloc(ws, P, rows, item, use_t) != 0:
        workspace_free(ws)
        fa_free(ws)
        return NULL
    return ws


cdef void workspace_delete(Workspace *ws) noexcept nogil:
    if ws != NULL:
        workspace_free(ws)
        fa_free(ws)


# ---------------------------------------------------------------- attention: one work unit

cdef inline int64_t row_diag(const Plan *P, int64_t pos, int64_t kl) noexcept nogil:
    """Diagonal position p(i) of query position pos against kl keys: pos itself,
    or shifted so the last query meets the last key (bottom-right causal)."""
    return pos + kl - P.Lq if P.causal == CAUSAL_BOTTOM_RIGHT else pos


cdef inline void key_range(const Plan *P, int64_t p, int64_t kb, int64_t ke,
                           int64_t *lo, int64_t *hi) noexcept nogil:
    """Keys [lo, hi) of [kb, ke) that a row at diagonal position p sees (causal,
    window); hi = lo when it sees none."""
    lo[0] = kb
    hi[0] = ke
    if P.causal != CAUSAL_NONE and p + 1 < hi[0]:
        hi[0] = p + 1
    if P.wr >= 0 and p + P.wr + 1 < hi[0]:
        hi[0] = p + P.wr + 1
    if P.wl >= 0 and p - P.wl > lo[0]:
        lo[0] = p - P.wl
    if hi[0] < lo[0]:
        hi[0] = lo[0]


cdef void setup_rows(const Plan *P, Workspace *ws, int64_t b, int64_t r0, int64_t nr,
                        int64_t kb, int64_t ke, int64_t *lo_all, int64_t *hi_all) noexcept nogil:
    """Visible key range [lo, hi) of each row, clipped to the key split [kb, ke).

    Causal, window and kv_lengths all make a contiguous range per row, so tiles
    outside the union of the ranges are never touched."""
    cdef int64_t i, r, grp, pos, kl, p, lo, hi
    lo_all[0] = ke
    hi_all[0] = kb
    for i in range(nr):
        r = r0 + i
        grp = r // P.Lq
        pos = r - grp * P.Lq
        ws.goff[i] = grp
        ws.qoff[i] = grp * P.q.sg + pos * P.q.sr
        kl = P.Lk
        if P.has_kvlen and P.kvlen[b * P.g + grp] < kl:
            kl = P.kvlen[b * P.g + grp]
        p = row_diag(P, pos, kl)
        ws.pos[i] = p
        key_range(P, p, kb, kl if kl < ke else ke, &lo, &hi)
        if hi > lo:
            if lo < lo_all[0]:
                lo_all[0] = lo
            if hi > hi_all[0]:
                hi_all[0] = hi
        ws.lo[i] = lo
        ws.hi[i] = hi


cdef void pack_q(const Plan *P, Workspace *ws, floating *qbase, int64_t nr, int64_t pad) noexcept nogil:
    """Qp[i, :] = scale * q[row i, :], then zero rows up to pad (the QK kernels'
    whole blocks)."""
    cdef floating *qp = <floating *>ws.qp
    cdef floating scale = <floating>P.scale
    cdef int64_t i, d, Dk = P.Dk, sc = P.q.sc
    cdef floating *src
    for i in range(nr):
        src = qbase + ws.qoff[i]
        if sc == 1:
            row_scale(src, qp + i * Dk, Dk, scale)
        else:
            for d in range(Dk):
                qp[i * Dk + d] = src[d * sc] * scale
    for i in range(nr * Dk, pad * Dk):
        qp[i] = 0


cdef void pack_k_tile(const Plan *P, floating *kt, const floating *kbase, int64_t t0, int64_t n) noexcept nogil:
    """Transpose keys t0..t0+n-1 into panels of Dk x NR (see fa_qk_block)."""
    cdef int64_t NR = FA_QK_NV * (FA_VBYTES // sizeof(floating))
    cdef int64_t j, d, Dk = P.Dk, sr = P.k.sr, sc = P.k.sc, p0, nk
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef floating *panel
    cdef const floating *src
    cdef int64_t offs[PANEL_MAX]
    if sc == 1:
        # rows with contiguous elements: W x W blocks through register transposes
        # (the query pack's routine, with scale 1), each block requesting the rows
        # of the next (the tiles stream from memory; past the tile's end are the
        # next tile's rows, and a prefetch never faults)
        p0 = 0
        while p0 < n:
            nk = min(NR, n - p0)
            for j in range(nk):
                offs[j] = (t0 + p0 + j) * sr
            if floating is float:
                fa_tq_pack_f(kbase, offs, nk, Dk, 1, kt + (p0 // NR) * Dk * NR, NR, W * sr)
            else:
                fa_tq_pack_d(kbase, offs, nk, Dk, 1, kt + (p0 // NR) * Dk * NR, NR, W * sr)
            p0 += NR
    else:
        for j in range(n):
            panel = kt + (j // NR) * Dk * NR + (j % NR)
            src = kbase + (t0 + j) * sr
            for d in range(Dk):
                panel[d * NR] = src[d * sc]
    # a partial last panel: the QK kernel computes whole vectors of it (one, or
    # all NR columns), so the columns past the tile that it reads get zeros rather
    # than the workspace's old contents (subnormal garbage would make those FMAs
    # microcode assists)
    if n % NR:
        panel = kt + (n // NR) * Dk * NR
        nk = W if n % NR <= W else NR
        for d in range(Dk):
            for j in range(n % NR, nk):
                panel[d * NR + j] = 0


cdef int pack_v_tile(const Plan *P, floating *vp, int64_t dvp, const floating *vbase,
                     int64_t t0, int64_t n) noexcept nogil:
    """Copy value rows t0..t0+n-1 into rows of dvp, padding columns set to zero
    (the P.V kernel runs whole vectors).  Returns 1 when the tile holds an inf or
    NaN (see pv_rows_exact)."""
    cdef int64_t j, c, Dv = P.Dv, sr = P.v.sr, sc = P.v.sc
    cdef const floating *src
    cdef floating x, probe = 0
    if sc == 1:
        if floating is float:
            return fa_pack_rows_f(vbase + t0 * sr, sr, n, Dv, vp, dvp)
        else:
            return fa_pack_rows_d(vbase + t0 * sr, sr, n, Dv, vp, dvp)
    for j in range(n):
        src = vbase + (t0 + j) * sr
        for c in range(Dv):
            x = src[c * sc]
            vp[j * dvp + c] = x
            probe += x * 0      # stays 0 unless some x is inf or NaN
        for c in range(Dv, dvp):
            vp[j * dvp + c] = 0
    return probe != 0


cdef void pv_rows_exact(const Plan *P, const Workspace *ws, const floating *s, const floating *vsrc,
                        int64_t ldv, floating *o, int64_t dvp, int64_t r0, int64_t nr, int64_t t0, int64_t n,
                        int64_t mbo) noexcept nogil:
    """O += P . V one row at a time over exactly the keys each row sees.

    Used for tiles whose values hold inf/NaN: the blocked kernel multiplies the
    zero probabilities of invisible keys by those values too (0 * NaN = NaN), so
    a NaN in a masked-out KV-cache slot would leak into rows that never see it."""
    cdef int64_t i, j, c, a, e, grp, pos
    cdef const uint8_t *mask = NULL
    cdef floating p
    for i in range(nr):
        a = ws.lo[i] - t0
        e = ws.hi[i] - t0
        if a < 0:
            a = 0
        if e > n:
            e = n
        if P.has_mask:
            grp = ws.goff[i]
            pos = r0 + i - grp * P.Lq
            mask = (<const uint8_t *>P.mask.base) + mbo + grp * P.mask.sg + pos * P.mask.sr
        for j in range(a, e):
            if P.has_mask and not mask[(t0 + j) * P.mask.sc]:
                continue
            p = s[i * BLOCK_K + j]
            for c in range(P.Dv):
                o[i * dvp + c] += p * vsrc[j * ldv + c]


cdef void apply_score_options(const Plan *P, floating *srow, int64_t i, int64_t t0, int64_t a, int64_t e,
                              int64_t b, int64_t moff, int64_t boff, const Workspace *ws) noexcept nogil:
    """softcap, then bias, then ALiBi, then the boolean mask, on srow[a:e] (keys t0+a..t0+e-1)."""
    cdef int64_t j, grp = ws.goff[i], r = i
    cdef int64_t pos_in = 0
    cdef floating slope, d
    cdef const floating *bias
    cdef const uint8_t *mask
    if P.softcap > 0:
        row_softcap(srow + a, e - a, <floating>P.softcap)
    if P.has_bias:
        bias = (<const floating *>P.bias.base) + boff
        for j in range(a, e):
            srow[j] += bias[(t0 + j) * P.bias.sc]
    if P.has_alibi:
        slope = (<const floating *>P.slopes)[b * P.g + grp]
        for j in range(a, e):
            d = <floating>(ws.pos[i] - (t0 + j))
            if d < 0:
                d = -d
            srow[j] -= slope * d
    if P.has_mask:
        mask = (<const uint8_t *>P.mask.base) + moff
        if P.mask.sc == 1:
            if floating is float:
                fa_row_mask_bool_f(srow + a, mask + t0 + a, e - a)
            else:
                fa_row_mask_bool_d(srow + a, mask + t0 + a, e - a)
        else:
            for j in range(a, e):
                if not mask[(t0 + j) * P.mask.sc]:
                    srow[j] = -INFINITY


cdef inline void rows_key_span(const Workspace *ws, int64_t i0, int64_t i1, int64_t t0, int64_t n,
                               int64_t *a, int64_t *e) noexcept nogil:
    """[a, e): the keys of tile [t0, t0 + n) that any of rows i0..i1-1 can see (tile-relative)."""
    cdef int64_t i
    a[0] = n
    e[0] = 0
    for i in range(i0, i1):
        if ws.hi[i] > ws.lo[i]:
            a[0] = min(a[0], max(ws.lo[i] - t0, 0))
            e[0] = max(e[0], min(ws.hi[i] - t0, n))


cdef inline void pv_qk_chunks(const floating *p, int64_t nr, const floating *v, int64_t ldv, int64_t a,
                              int64_t e, floating *o, int64_t dvp, const floating *qp, int64_t Dk,
                              const floating *kn, int64_t ksr, int64_t nn, floating *sn) noexcept nogil:
    """O += P . V over keys [a, e) of this tile (rows BLOCK_K apart in p) and the
    scores of the next tile's first nn keys (kn) into sn, in alternating chunks of
    FUSE_CHUNK keys.  The same per-key order as one pv_rows and one qk_rows call:
    P.V accumulates key by key, and a chunk boundary is a multiple of every key
    group of fa_qk_rows, so the bits are the same."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t c = 0, c1, x0, x1
    cdef int64_t top = e if e > nn else nn
    while c < top:
        c1 = c + FUSE_CHUNK
        x0 = a if a > c else c
        x1 = e if e < c1 else c1
        if x0 < x1:
            pv_rows(p, BLOCK_K, nr, v, ldv, x0, x1, o, dvp, dvp // W)
        x1 = nn if nn < c1 else c1
        if c < x1:
            qk_rows(qp, Dk, nr, Dk, kn + c * ksr, ksr, x1 - c, sn + c, BLOCK_K)
        c = c1


cdef void run_unit(const Plan *P, Workspace *ws, int64_t b, int64_t r0, int64_t nr,
                   int64_t kb, int64_t ke, int mode, floating *stats,
                   floating *part_o, floating *part_m, double *part_l) noexcept nogil:
    """Rows r0..r0+nr-1 of batch element b against keys [kb, ke).

    stats: per-row lse of the whole problem (MODE_STATS writes it, MODE_WEIGHTS reads it).
    part_*: where MODE_PARTIAL leaves this split's running max, sum and unnormalised output."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t NR = FA_QK_NV * W
    cdef int64_t dvp = round_up(P.Dv if P.Dv > 0 else 1, W)
    cdef int64_t Dk = P.Dk, Dv = P.Dv
    cdef floating *qp = <floating *>ws.qp
    cdef floating *kt = <floating *>ws.kt
    cdef floating *vp = <floating *>ws.vp
    cdef floating *s = <floating *>ws.s
    cdef floating *o = <floating *>ws.o
    cdef floating *m = <floating *>ws.m
    cdef double *l = ws.l
    cdef int64_t lo_all, hi_all, t0, t1, n, i, i0, j, a, e, c, rr, grp, pos
    cdef int64_t qb = batch_offset(P, &P.q, b)
    cdef int64_t kbo = batch_offset(P, &P.k, b)
    cdef int64_t vbo = batch_offset(P, &P.v, b)
    cdef int64_t mbo = batch_offset(P, &P.mask, b) if P.has_mask else 0
    cdef int64_t bbo = batch_offset(P, &P.bias, b) if P.has_bias else 0
    cdef int64_t wbo = batch_offset(P, &P.w, b) if mode == MODE_WEIGHTS else 0
    cdef int64_t roff
    cdef floating mt, mn, alpha, lse_i, inv, fill
    cdef double sm
    cdef floating *wrow
    cdef floating *orow
    cdef floating *srow
    cdef int need_pv = mode != MODE_STATS
    cdef int v_nonfinite
    # few rows: dot products straight from the key rows and values read in place
    # (no packing), when the rows are contiguous and the values fill whole vectors.
    # Up to FEW_MAX_ROWS rows (14-16 are query-vectorised); paired against the packed
    # tiles and register-blocked kernels (AVX-512, 8 heads, 4096 keys, D 128):
    # 4 rows 1.41x, 8 rows 1.33x, 12 rows 1.14-1.20x, 13-14 rows 1.10x, 15 rows 1.0x
    cdef int few = nr <= FEW_MAX_ROWS
    cdef int k_in_place = few and P.k.sc == 1
    cdef int v_in_place = few and P.v.sc == 1 and Dv % W == 0 and Dv > 0
    cdef const floating *vsrc = NULL
    cdef int64_t ldv = 0
    cdef int needs_options = P.softcap > 0 or P.has_bias or P.has_alibi or P.has_mask
    cdef int64_t Rq = round_up(nr, FA_QK_MR), Rp = round_up(nr, FA_PV_MR)
    # few rows with keys and values read in place (decode, draft tokens, GQA
    # groups): each tile's P.V pass also computes the next tile's scores, so keys
    # and values stream side by side (one row: fa_pv_qk_row1, key by key; more
    # rows: alternating chunks of FUSE_CHUNK keys, see pv_qk_chunks).  Bit-
    # identical to the separate passes.  The next scores go to rows past the
    # unit's own in the score buffer (FEW_MAX_ROWS of them are reserved).
    cdef int fuse = few and k_in_place and v_in_place and need_pv
    cdef floating *s2 = s + rows_alloc(nr) * BLOCK_K
    cdef floating *stmp
    cdef const floating *kbase = (<floating *>P.k.base) + kbo
    cdef int64_t nn

    setup_rows(P, ws, b, r0, nr, kb, ke, &lo_all, &hi_all)
    # Zero padding only where a kernel reads it (a decode step's units have one
    # row each: the fixed cost of a unit is most of such a call).  Query rows:
    # fa_qk_rows (keys in place) reads blocks of up to 8 rows, each padded to a
    # power of two, and a single row alone; fa_qk_block whole blocks of FA_QK_MR.
    pack_q(P, ws, (<floating *>P.q.base) + qb, nr,
           (1 if nr == 1 else round_up(nr, 8)) if k_in_place else rows_alloc(nr))
    # The packed P.V kernel (fa_pv_block) runs whole blocks of FA_PV_MR rows, so it
    # also reads the probability rows nr..Rp-1, which the QK kernel may never
    # write: zeros, not whatever the workspace held (subnormal garbage made every
    # FMA of those rows a microcode assist: the same call 2-3x slower in some
    # processes).  The few-rows kernel (fa_pv_rows) reads exactly nr rows.
    if few:
        Rp = nr
    for i in range(nr * BLOCK_K, Rp * BLOCK_K):
        s[i] = 0
    for i in range(Rp):
        m[i] = -INFINITY
        l[i] = 0
    for i in range(Rp * dvp):
        o[i] = 0
    if mode == MODE_WEIGHTS:
        # every weight of the row is written: zeros first (NaN for a row whose lse
        # is NaN: the whole row is NaN, invisible keys too), visible keys below
        for i in range(nr):
            wrow = (<floating *>P.w.base) + wbo + ws.goff[i] * P.w.sg + (r0 + i - ws.goff[i] * P.Lq) * P.w.sr
            fill = stats[i] if stats[i] != stats[i] else 0
            for j in range(P.Lk):
                wrow[j * P.w.sc] = fill

    if fuse and lo_all < hi_all:
        qk_rows(qp, Dk, nr, Dk, kbase + lo_all * P.k.sr, P.k.sr, min(BLOCK_K, hi_all - lo_all), s, BLOCK_K)
    t0 = lo_all
    while t0 < hi_all:
        t1 = t0 + BLOCK_K
        if t1 > hi_all:
            t1 = hi_all
        n = t1 - t0
        if not k_in_place:
            pack_k_tile(P, kt, (<floating *>P.k.base) + kbo, t0, n)
        if not need_pv:
            v_nonfinite = 0
        elif v_in_place:
            # read in place; inf/NaN values are caught after the P.V update below
            # (one pass over the values instead of two)
            vsrc = (<floating *>P.v.base) + vbo + t0 * P.v.sr
            ldv = P.v.sr
            v_nonfinite = 0
        else:
            v_nonfinite = pack_v_tile(P, vp, dvp, (<floating *>P.v.base) + vbo, t0, n)
            vsrc = vp
            ldv = dvp

        # S = Qp . Ktᵀ, each register block of rows only over the panels its rows
        # can see (this is what clips the causal diagonal tile)
        i0 = nr if k_in_place else 0
        if k_in_place and not fuse:
            qk_rows(qp, Dk, nr, Dk, kbase + t0 * P.k.sr, P.k.sr, n, s, BLOCK_K)
        while i0 < nr:
            rows_key_span(ws, i0, min(i0 + FA_QK_MR, nr), t0, n, &a, &e)
            if a < e:
                qk_block(qp + i0 * Dk, Dk, kt, Dk, s + i0 * BLOCK_K, BLOCK_K, a // NR, e)
            i0 += FA_QK_MR

        # per row: options, then the online softmax update (or final weights)
        for i in range(nr):
            srow = s + i * BLOCK_K
            a = ws.lo[i] - t0
            e = ws.hi[i] - t0
            if a < 0:
                a = 0
            if e > n:
                e = n
            if a >= e:
                for j in range(n):
                    srow[j] = 0
                continue
            if needs_options:
                grp = ws.goff[i]
                pos = r0 + i - grp * P.Lq
                apply_score_options(P, srow, i, t0, a, e, b,
                                    mbo + grp * P.mask.sg + pos * P.mask.sr,
                                    bbo + grp * P.bias.sg + pos * P.bias.sr, ws)
            if mode == MODE_WEIGHTS:
                lse_i = stats[i]
                if lse_i == -INFINITY:
                    for j in range(n):
                        srow[j] = 0
                    continue
                row_exp_sum(srow + a, srow + a, e - a, lse_i)
                wrow = (<floating *>P.w.base) + wbo + ws.goff[i] * P.w.sg + (r0 + i - ws.goff[i] * P.Lq) * P.w.sr
                for j in range(a, e):
                    wrow[(t0 + j) * P.w.sc] = srow[j]
            else:
                mt = row_max(srow + a, e - a)
                if mt != mt or mt > m[i]:
                    mn = mt
                else:
                    mn = m[i]
                if mn == -INFINITY:
                    for j in range(n):
                        srow[j] = 0
                    continue
                # probabilities (and the rescale) as fa_vexp_p: 0 below ~2^-62.5 of the max
                if floating is float:
                    alpha = fa_exp_p_f(m[i] - mn)
                    sm = fa_row_exp_sum_p_f(srow + a, srow + a, e - a, mn)
                else:
                    alpha = fa_exp_p_d(m[i] - mn)
                    sm = fa_row_exp_sum_p_d(srow + a, srow + a, e - a, mn)
                l[i] = l[i] * alpha + sm
                m[i] = mn
                if need_pv and alpha != 1:
                    row_scale(o + i * dvp, o + i * dvp, Dv, alpha)
            for j in range(a):
                srow[j] = 0
            for j in range(e, n):
                srow[j] = 0

        # O += P . V, each register block of rows over the keys its rows see
        if v_nonfinite:
            pv_rows_exact(P, ws, s, vsrc, ldv, o, dvp, r0, nr, t0, n, mbo)
        elif need_pv and few:
            rows_key_span(ws, 0, nr, t0, n, &a, &e)
            if a < e:
                # values read in place were not checked: keep the accumulators,
                # and if the update made any of them inf/NaN, redo the tile
                # exactly (see pv_rows_exact).  The packed value buffer is free
                # when values are read in place.
                # (before the first tile's update the accumulators are all 0:
                # nothing to keep)
                if v_in_place and t0 != lo_all:
                    for i in range(nr * dvp):
                        vp[i] = o[i]
                if fuse:
                    nn = min(BLOCK_K, hi_all - t1) if t1 < hi_all else 0
                    if nr == 1:
                        pv_qk_row1(s, vsrc, ldv, a, e, o, dvp // W, qp, Dk, kbase + t1 * P.k.sr, P.k.sr, nn, s2)
                    else:
                        pv_qk_chunks(s, nr, vsrc, ldv, a, e, o, dvp, qp, Dk, kbase + t1 * P.k.sr, P.k.sr, nn, s2)
                else:
                    pv_rows(s, BLOCK_K, nr, vsrc, ldv, a, e, o, dvp, dvp // W)
                if v_in_place and block_nonfinite(o, nr, Dv, dvp, 1):
                    for i in range(nr * dvp):
                        o[i] = vp[i] if t0 != lo_all else 0
                    pv_rows_exact(P, ws, s, vsrc, ldv, o, dvp, r0, nr, t0, n, mbo)
            elif fuse and t1 < hi_all:
                qk_rows(qp, Dk, nr, Dk, kbase + t1 * P.k.sr, P.k.sr, min(BLOCK_K, hi_all - t1), s2, BLOCK_K)
            if fuse:
                stmp = s
                s = s2
                s2 = stmp
        elif need_pv:
            i0 = 0
            while i0 < nr:
                rows_key_span(ws, i0, min(i0 + FA_PV_MR, nr), t0, n, &a, &e)
                if a < e:
                    pv_block(s + i0 * BLOCK_K, BLOCK_K, vsrc, ldv, a, e, o + i0 * dvp, dvp, dvp // W)
                i0 += FA_PV_MR
        t0 = t1

    # finish the rows
    for i in range(nr):
        grp = ws.goff[i]
        pos = r0 + i - grp * P.Lq
        if mode == MODE_STATS:
            stats[i] = <floating>(m[i] + log(l[i])) if l[i] > 0 or l[i] != l[i] else -INFINITY
            continue
        if mode == MODE_PARTIAL:
            part_m[i] = m[i]
            part_l[i] = l[i]
            for c in range(Dv):
                part_o[i * Dv + c] = o[i * dvp + c]
            continue
        orow = (<floating *>P.o.base) + batch_offset(P, &P.o, b) + grp * P.o.sg + pos * P.o.sr
        if mode == MODE_WEIGHTS:
            for c in range(Dv):
                orow[c * P.o.sc] = o[i * dvp + c]
            lse_i = stats[i]
        elif l[i] > 0 or l[i] != l[i]:
            inv = <floating>(1.0 / l[i])
            if P.o.sc == 1:
                row_scale(o + i * dvp, orow, Dv, inv)
            else:
                for c in range(Dv):
                    orow[c * P.o.sc] = o[i * dvp + c] * inv
            lse_i = <floating>(m[i] + log(l[i])) if P.want_lse else 0
        else:
            for c in range(Dv):
                orow[c * P.o.sc] = 0
            lse_i = -INFINITY
        if P.want_lse:
            (<floating *>P.lse.base)[batch_offset(P, &P.lse, b) + grp * P.lse.sg + pos * P.lse.sr] = lse_i


cdef void apply_score_options_t(const Plan *P, const Workspace *ws, floating *st, int64_t ld,
                                int64_t j0, int64_t j1, int64_t t0, int64_t i0, int64_t ni, int64_t nlanes,
                                int64_t b, int64_t r0, int64_t mbo, int64_t bbo) noexcept nogil:
    """softcap, bias, ALiBi and the boolean mask on St[j0:j1, lanes i0..i0+ni-1] (st points at lane i0).

    The same order as the row-major path (apply_score_options)."""
    cdef int64_t i, j, r, grp, pos, p
    cdef floating *lane
    cdef const floating *brow
    cdef const uint8_t *mrows[64]       # one chunk of lanes (at most 64)
    cdef const floating *brows[64]
    cdef floating slope, dist
    cdef int nv = <int>(nlanes // (FA_VBYTES // sizeof(floating)))
    cdef int fast_bias = P.has_bias and P.bias.sc == 1
    # ALiBi distances computed in floating point are exact below 2^22 (float);
    # after a bias applied element by element, ALiBi follows it the same way (the
    # order of the two updates is the row-major path's)
    cdef int fast_alibi = (P.has_alibi and (floating is double or P.Lq + P.Lk < 4194304)
                           and (fast_bias or not P.has_bias))
    if P.softcap > 0:
        for j in range(j0, j1):
            row_softcap(st + j * ld, nlanes, <floating>P.softcap)
    if fast_bias:
        for i in range(ni):
            r = i0 + i
            grp = ws.goff[r]
            brows[i] = ((<const floating *>P.bias.base) + bbo + grp * P.bias.sg
                        + (r0 + r - grp * P.Lq) * P.bias.sr + t0)
        if floating is float:
            fa_tbias_f(st, ld, j0, j1, brows, ni)
        else:
            fa_tbias_d(st, ld, j0, j1, brows, ni)
    if fast_alibi:
        if floating is float:
            fa_talibi_f(st, ld, j0, j1, t0, (<const float *>P.slopes) + b * P.g, ws.goff + i0,
                        ws.pos + i0, ni, nv)
        else:
            fa_talibi_d(st, ld, j0, j1, t0, (<const double *>P.slopes) + b * P.g, ws.goff + i0,
                        ws.pos + i0, ni, nv)
    if (P.has_bias and not fast_bias) or (P.has_alibi and not fast_alibi):
        for i in range(ni):
            r = i0 + i
            lane = st + i
            grp = ws.goff[r]
            pos = r0 + r - grp * P.Lq
            if P.has_bias and not fast_bias:
                brow = (<const floating *>P.bias.base) + bbo + grp * P.bias.sg + pos * P.bias.sr
                for j in range(j0, j1):
                    lane[j * ld] += brow[(t0 + j) * P.bias.sc]
            if P.has_alibi and not fast_alibi:
                slope = (<const floating *>P.slopes)[b * P.g + grp]
                p = ws.pos[r]
                for j in range(j0, j1):
                    dist = <floating>(p - (t0 + j))
                    if dist < 0:
                        dist = -dist
                    lane[j * ld] -= slope * dist
    if P.has_mask:
        for i in range(ni):
            r = i0 + i
            grp = ws.goff[r]
            mrows[i] = (<const uint8_t *>P.mask.base) + mbo + grp * P.mask.sg + (r0 + r - grp * P.Lq) * P.mask.sr
        tmask_bool_chunk(st, ld, j0, j1, t0, mrows, ni, P.mask.sc, <uint8_t *>ws.mtb, nv)


cdef inline void prefetch_tile(const Plan *P, const floating *kbase, const floating *vbase,
                               int64_t t0, int64_t t1) noexcept nogil:
    """Request key and value rows t0..t1-1 (rows with contiguous elements only)."""
    if P.k.sc == 1:
        prefetch_rows(kbase + t0 * P.k.sr, t1 - t0, P.k.sr, P.Dk)
    if P.v.sc == 1:
        prefetch_rows(vbase + t0 * P.v.sr, t1 - t0, P.v.sr, P.Dv)


cdef inline int t_width(int64_t nvec) noexcept nogil:
    """The widest query-vectorised kernel width that nvec (>= 1) vectors of lanes
    fill: FA_T_NV, 2 or 1 vectors (the widths the kernels are instantiated for)."""
    return FA_T_NV if nvec >= FA_T_NV else (2 if nvec >= 2 else 1)


cdef int t_runs(int64_t j0, int64_t j1, const int64_t *a, const int64_t *e, int nv,
                int64_t *rs, int64_t *re, int *rv, int *rw) noexcept nogil:
    """Cut keys [j0, j1) of a chunk whose vector v sees keys [a[v], e[v]) (tile
    rows; empty when e[v] <= a[v]) into runs: keys [rs, re) seen by every vector
    of rv .. rv + rw - 1, a maximal group of adjacent vectors.  The keys a vector
    sees are the union of its runs.  Returns the number of runs (at most
    (2 nv + 1) * (nv + 1) / 2: 2 nv + 1 segments between the range ends)."""
    cdef int64_t bp[2 * FA_T_NV + 2]
    cdef int64_t x, st
    cdef int nb = 0, n = 0, i, k, v
    bp[nb] = j0
    nb += 1
    for v in range(nv):
        if e[v] > a[v]:
            if j0 < a[v] < j1:
                bp[nb] = a[v]
                nb += 1
            if j0 < e[v] < j1:
                bp[nb] = e[v]
                nb += 1
    bp[nb] = j1
    nb += 1
    for i in range(1, nb):          # insertion sort: at most 2 nv + 2 entries
        x = bp[i]
        k = i - 1
        while k >= 0 and bp[k] > x:
            bp[k + 1] = bp[k]
            k -= 1
        bp[k + 1] = x
    for i in range(nb - 1):
        st = bp[i]
        if bp[i + 1] <= st:
            continue
        v = 0
        while v < nv:
            if a[v] <= st < e[v]:
                k = v
                while k + 1 < nv and a[k + 1] <= st < e[k + 1]:
                    k += 1
                rs[n] = st
                re[n] = bp[i + 1]
                rv[n] = v
                rw[n] = k - v + 1
                n += 1
                v = k + 1
            else:
                v += 1
    return n


cdef void run_unit_t(const Plan *P, Workspace *ws, int64_t b, int64_t r0, int64_t nr,
                     int64_t kb, int64_t ke, int mode, floating *stats, floating *part_o,
                     floating *part_m, double *part_l) noexcept nogil:
    """Query-vectorised unit: rows r0..r0+nr-1 (nr <= BLOCK_QT) of batch b, keys kb..ke-1.

    Lanes run over queries: Qt (Dk x lanes) is packed once, keys and values are
    read in place as broadcast scalars, and each query's online softmax (max,
    sum, rescale) is a vertical vector operation.  The rows are cut into chunks
    of FA_T_NV, 2 or 1 vectors of lanes (the widest that the remaining rows
    fill), so a unit of 16 float32 rows is one vector wide, not a quarter of a
    4-vector chunk.

    mode: MODE_ONLINE (out and lse); MODE_PARTIAL (a key split: each row's
    reference max, sum and unnormalised output go to part_o / part_m / part_l
    for merge_splits); return_weights in two passes, MODE_STATS (only each row's
    lse, into stats: no P.V) and MODE_WEIGHTS (weights = exp(s - lse) written
    to the weights rows, out = weights . V)."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t ld = t_ld(sizeof(floating))
    cdef int64_t nch = 0, lanes = 0, nvec = (nr + W - 1) // W
    cdef int64_t Dk = P.Dk, Dv = P.Dv, i, d, c, ch, j, j0, j1, jj0, jj1, t0, t1, n, c0, cw
    cdef int nv
    cdef int64_t lo_all, hi_all, grp, pos
    cdef floating *qt = <floating *>ws.qt
    cdef floating *st = <floating *>ws.st
    cdef floating *ot = <floating *>ws.ot
    cdef floating *m = <floating *>ws.mt
    cdef floating *l = <floating *>ws.lt
    cdef floating *lof = <floating *>ws.lof
    cdef floating *hif = <floating *>ws.hif
    cdef floating *mxt = <floating *>ws.mxt
    cdef floating *mx
    cdef int masked
    cdef const floating *qbase = (<const floating *>P.q.base) + batch_offset(P, &P.q, b)
    cdef const floating *kbase = (<const floating *>P.k.base) + batch_offset(P, &P.k, b)
    cdef const floating *vbase = (<const floating *>P.v.base) + batch_offset(P, &P.v, b)
    cdef floating *obase = (<floating *>P.o.base) + batch_offset(P, &P.o, b)
    cdef int64_t mbo = batch_offset(P, &P.mask, b) if P.has_mask else 0
    cdef int64_t bbo = batch_offset(P, &P.bias, b) if P.has_bias else 0
    cdef int needs_options = P.softcap > 0 or P.has_bias or P.has_alibi or P.has_mask
    cdef const uint8_t *mrow = NULL
    cdef floating scale = <floating>P.scale
    cdef floating inv, p, lse_i
    cdef const floating *src
    cdef floating *orow
    cdef int vnf
    # per chunk: min lo / max hi over lanes that see keys (the chunk's key range),
    # max lo / min hi over all lanes (does any lane need masking?)
    cdef int64_t ch_lo[64]
    cdef int64_t ch_hi[64]
    cdef int64_t ch_lomax[64]
    cdef int64_t ch_himin[64]
    cdef int64_t ch_c0[64]      # first lane of each chunk
    cdef int ch_nv[64]          # its width in vectors
    # per vector of lanes: min lo / max hi over its lanes that see keys; in a
    # masked tile, keys that no lane of a vector sees are left out of the QK
    # and P.V kernels for that vector (the causal diagonal: a quarter to three
    # quarters of a 4-vector chunk's keys, per vector)
    cdef int64_t vec_lo[64]
    cdef int64_t vec_hi[64]
    cdef int64_t va[FA_T_NV]
    cdef int64_t ve[FA_T_NV]
    cdef int64_t run_s[T_RUNS_MAX]
    cdef int64_t run_e[T_RUNS_MAX]
    cdef int run_v[T_RUNS_MAX]
    cdef int run_w[T_RUNS_MAX]
    cdef int nruns, ri, rv0, rw0, nw, v
    cdef int need_pv = mode != MODE_STATS
    cdef floating *wbase = (<floating *>P.w.base) + batch_offset(P, &P.w, b) if mode == MODE_WEIGHTS else NULL
    cdef floating *wrow
    cdef floating fill
    cdef int64_t ni

    # chunks: as many of FA_T_NV vectors as the rows fill, then 2, then 1 (t_width)
    while nvec > 0:
        nv = t_width(nvec)
        ch_c0[nch] = lanes
        ch_nv[nch] = nv
        lanes += nv * W
        nvec -= nv
        nch += 1
    setup_rows(P, ws, b, r0, nr, kb, ke, &lo_all, &hi_all)
    # Start the first key/value tile and the query rows on their way from
    # memory before the (latency-bound) transposed query pack; later key rows
    # are requested a register block ahead by the QK kernel, value rows ahead
    # of the inf/NaN probe (block_nonfinite).
    if lo_all < hi_all:
        prefetch_tile(P, kbase, vbase, lo_all, min(lo_all + BLOCK_K, hi_all))
    if P.q.sc == 1:
        for i in range(nr):
            prefetch_rows(qbase + ws.qoff[i], 1, 0, Dk)
    # transposed pack: W x W register transposes for contiguous query rows;
    # otherwise d outer (contiguous stores, the nr source rows stay in L1)
    if P.q.sc == 1:
        if floating is float:
            fa_tq_pack_f(qbase, ws.qoff, nr, Dk, scale, qt, ld, 0)
        else:
            fa_tq_pack_d(qbase, ws.qoff, nr, Dk, scale, qt, ld, 0)
    else:
        for d in range(Dk):
            for i in range(nr):
                qt[d * ld + i] = qbase[ws.qoff[i] + d * P.q.sc] * scale
    for i in range(nr):
        lof[i] = <floating>ws.lo[i]
        hif[i] = <floating>ws.hi[i]
    for i in range(nr, lanes):
        for d in range(Dk):
            qt[d * ld + i] = 0
        lof[i] = 0
        hif[i] = 0
    for i in range(lanes):
        m[i] = -INFINITY
        l[i] = 0
    for c in range(Dv):
        for i in range(lanes):
            ot[c * ld + i] = 0
    for ch in range(nch):
        ch_lo[ch] = P.Lk
        ch_hi[ch] = 0
        ch_lomax[ch] = 0
        ch_himin[ch] = P.Lk
        for i in range(ch_c0[ch], ch_c0[ch] + ch_nv[ch] * W):
            if i < nr and ws.hi[i] > ws.lo[i]:
                ch_lo[ch] = min(ch_lo[ch], ws.lo[i])
                ch_hi[ch] = max(ch_hi[ch], ws.hi[i])
                ch_lomax[ch] = max(ch_lomax[ch], ws.lo[i])
                ch_himin[ch] = min(ch_himin[ch], ws.hi[i])
            else:
                ch_himin[ch] = -1     # an empty or padding lane: always mask
    for v in range(lanes // W):
        vec_lo[v] = P.Lk
        vec_hi[v] = 0
        for i in range(v * W, min(v * W + W, nr)):
            if ws.hi[i] > ws.lo[i]:
                vec_lo[v] = min(vec_lo[v], ws.lo[i])
                vec_hi[v] = max(vec_hi[v], ws.hi[i])

    if mode == MODE_WEIGHTS:
        # m holds each lane's lse (padding lanes 0); the tiles below write each
        # row's weights for the keys its chunk visits (0 where masked), the rest
        # of the row is filled here: 0, or NaN for a NaN row (all of it NaN)
        # (a chunk's key range [ch_lo, ch_hi) lies inside [lo_all, hi_all))
        for i in range(lanes):
            m[i] = stats[i] if i < nr else 0
        for i in range(FA_T_NV * W):
            mxt[i] = 1        # the row scales of the transposed weight writes
        for ch in range(nch):
            for i in range(ch_c0[ch], min(ch_c0[ch] + ch_nv[ch] * W, nr)):
                grp = ws.goff[i]
                wrow = wbase + grp * P.w.sg + (r0 + i - grp * P.Lq) * P.w.sr
                fill = m[i] if m[i] != m[i] else 0
                if ch_lo[ch] >= ch_hi[ch]:
                    for j in range(P.Lk):
                        wrow[j * P.w.sc] = fill
                    continue
                for j in range(ch_lo[ch]):
                    wrow[j * P.w.sc] = fill
                for j in range(ch_hi[ch], P.Lk):
                    wrow[j * P.w.sc] = fill

    t0 = lo_all
    while t0 < hi_all:
        t1 = min(t0 + BLOCK_K, hi_all)
        n = t1 - t0
        vnf = block_nonfinite(vbase + t0 * P.v.sr, n, Dv, P.v.sr, P.v.sc) if need_pv else 0
        for ch in range(nch):
            j0 = max(t0, ch_lo[ch]) - t0
            j1 = min(t1, ch_hi[ch]) - t0
            if j0 >= j1:
                continue
            c0 = ch_c0[ch]
            nv = ch_nv[ch]
            cw = nv * W
            # scores left as computed (no options, no lane masked in this tile):
            # the tile max comes out of the QK registers instead of a pass over St
            masked = ch_lomax[ch] > t0 + j0 or ch_himin[ch] < t0 + j1
            mx = NULL
            if not needs_options and not masked and mode != MODE_WEIGHTS:
                mx = mxt
                for i in range(cw):
                    mx[i] = -INFINITY
            nruns = 0
            if masked and nv > 1:
                for v in range(nv):
                    va[v] = max(vec_lo[c0 // W + v] - t0, j0)
                    ve[v] = min(vec_hi[c0 // W + v] - t0, j1)
                nruns = t_runs(j0, j1, va, ve, nv, run_s, run_e, run_v, run_w)
                if nruns == 1 and run_w[0] == nv:
                    nruns = 0         # every vector sees every key: one block
            if nruns == 0:
                tqk_chunk(kbase + t0 * P.k.sr, P.k.sr, P.k.sc, qt + c0, ld, Dk, st + c0, ld, j0, j1, mx, nv,
                          ch == 0)
            else:
                for ri in range(nruns):
                    rv0 = run_v[ri]
                    rw0 = run_w[ri]
                    while rw0 > 0:
                        nw = t_width(rw0)
                        tqk_chunk(kbase + t0 * P.k.sr, P.k.sr, P.k.sc, qt + c0 + rv0 * W, ld, Dk,
                                  st + c0 + rv0 * W, ld, run_s[ri], run_e[ri], <floating *>NULL, nw, ch == 0)
                        rv0 += nw
                        rw0 -= nw
                # the scores a vector does not see: -inf (the mask pass below
                # would set them; this keeps unset memory out of the options)
                for v in range(nv):
                    for j in range(j0, j1):
                        if j < va[v] or j >= ve[v]:
                            for i in range(c0 + v * W, c0 + v * W + W):
                                st[j * ld + i] = -INFINITY
            if needs_options:
                apply_score_options_t(P, ws, st + c0, ld, j0, j1, t0, c0,
                                      min(cw, nr - c0), cw, b, r0, mbo, bbo)
            if masked:
                tmask_chunk(st + c0, ld, j0, j1, t0, lof + c0, hif + c0, nv)
            if mode == MODE_WEIGHTS:
                tweights_chunk(st + c0, ld, j0, j1, m + c0, nv)
                ni = min(cw, nr - c0)
                if P.w.sc == 1 and ws.goff[c0] == ws.goff[c0 + ni - 1]:
                    # rows of one group are equally spaced: register transposes
                    # (mxt holds ones: the scale of each row)
                    grp = ws.goff[c0]
                    tout_rows(st + j0 * ld + c0, ld, ni, j1 - j0, mxt,
                              wbase + grp * P.w.sg + (r0 + c0 - grp * P.Lq) * P.w.sr + t0 + j0, P.w.sr)
                else:
                    for i in range(c0, c0 + ni):
                        grp = ws.goff[i]
                        wrow = wbase + grp * P.w.sg + (r0 + i - grp * P.Lq) * P.w.sr
                        for j in range(j0, j1):
                            wrow[(t0 + j) * P.w.sc] = st[j * ld + i]
            else:
                tsoftmax_chunk(st + c0, ld, j0, j1, m + c0, l + c0, ot + c0, ld, Dv if need_pv else 0,
                               mx, nv)
            if not need_pv:
                continue
            if not vnf and nruns > 0:
                # P is 0 where a vector sees no key: its runs only
                for ri in range(nruns):
                    rv0 = run_v[ri]
                    rw0 = run_w[ri]
                    while rw0 > 0:
                        nw = t_width(rw0)
                        tpv_chunk(vbase + t0 * P.v.sr, P.v.sr, P.v.sc, Dv, st + c0 + rv0 * W, ld,
                                  run_s[ri], run_e[ri], ot + c0 + rv0 * W, ld, nw)
                        rv0 += nw
                        rw0 -= nw
            elif not vnf:
                tpv_chunk(vbase + t0 * P.v.sr, P.v.sr, P.v.sc, Dv, st + c0, ld, j0, j1, ot + c0, ld, nv)
            else:
                # values hold inf/NaN: only each lane's visible keys may touch it
                for i in range(c0, min(c0 + cw, nr)):
                    jj0 = max(ws.lo[i] - t0, j0)
                    jj1 = min(ws.hi[i] - t0, j1)
                    if P.has_mask:
                        grp = ws.goff[i]
                        mrow = ((<const uint8_t *>P.mask.base) + mbo + grp * P.mask.sg
                                + (r0 + i - grp * P.Lq) * P.mask.sr)
                    for j in range(jj0, jj1):
                        if P.has_mask and not mrow[(t0 + j) * P.mask.sc]:
                            continue
                        p = st[j * ld + i]
                        src = vbase + (t0 + j) * P.v.sr
                        for c in range(Dv):
                            ot[c * ld + i] += p * src[c * P.v.sc]
        t0 = t1

    if mode == MODE_STATS:
        for i in range(nr):
            stats[i] = <floating>(m[i] + log(l[i])) if l[i] > 0 or l[i] != l[i] else -INFINITY
        return
    if mode == MODE_WEIGHTS:
        # out = weights . V as accumulated (no division); lse = stats (m): l = 1,
        # or 0 for a row that saw nothing (out 0, lse -inf)
        for i in range(nr):
            l[i] = 0 if m[i] == -INFINITY else 1
    if mode == MODE_PARTIAL:
        # a key split: the reference max (NaN for a row made NaN by NaN scores,
        # whose max skipped them), the sum and the unnormalised output, per row
        for i in range(nr):
            part_m[i] = m[i] if l[i] == l[i] else <floating>NAN
            part_l[i] = l[i]
            lof[i] = 1        # (the lanes' key ranges are no longer needed)
        tout_rows(ot, ld, nr, Dv, lof, part_o, Dv)
        return

    # Ot / l into the output rows (zeros for a row that saw no key).  Rows of
    # one group with contiguous elements are equally spaced: blocks transposed
    # in registers; otherwise one strided element at a time.
    if P.o.sc == 1 and ws.goff[0] == ws.goff[nr - 1]:
        # lof (the lanes' key ranges, needed only by the tile loop) holds 1 / l
        for i in range(nr):
            lof[i] = 1 / l[i] if l[i] > 0 or l[i] != l[i] else 0
        grp = ws.goff[0]
        tout_rows(ot, ld, nr, Dv, lof, obase + grp * P.o.sg + (r0 - grp * P.Lq) * P.o.sr, P.o.sr)
        for i in range(nr):
            if not (l[i] > 0 or l[i] != l[i]):
                orow = obase + grp * P.o.sg + (r0 + i - grp * P.Lq) * P.o.sr
                for c in range(Dv):
                    orow[c] = 0
    else:
        for i in range(nr):
            grp = ws.goff[i]
            pos = r0 + i - grp * P.Lq
            orow = obase + grp * P.o.sg + pos * P.o.sr
            if l[i] > 0 or l[i] != l[i]:
                inv = 1 / l[i]
                for c in range(Dv):
                    orow[c * P.o.sc] = ot[c * ld + i] * inv
            else:
                for c in range(Dv):
                    orow[c * P.o.sc] = 0
    if P.want_lse:
        for i in range(nr):
            grp = ws.goff[i]
            pos = r0 + i - grp * P.Lq
            lse_i = <floating>(m[i] + log(l[i])) if l[i] > 0 or l[i] != l[i] else -INFINITY
            (<floating *>P.lse.base)[batch_offset(P, &P.lse, b) + grp * P.lse.sg + pos * P.lse.sr] = lse_i


cdef void merge_splits(const Plan *P, int64_t b, int64_t r0, int64_t nr, int64_t nsplit,
                       const floating *po, const floating *pm, const double *pl, int64_t stride_split) noexcept nogil:
    """Combine the key splits of rows r0.. of batch b, in split order (deterministic).

    Each split's weight exp(m_split - M) / L is computed once per row; the output
    row is then a sum of whole split rows (a vector loop: with many rows, e.g.
    a query-vectorised unit split in two, the merge must not cost Dv exps per row)."""
    cdef int64_t i, sp, c, grp, pos, Dv = P.Dv, osc = P.o.sc
    cdef floating M, mi, wf
    cdef double L
    cdef double wgt[SPLIT_TARGET]       # exp(m_split - M) of each split (nsplit <= SPLIT_TARGET)
    cdef floating *orow
    cdef const floating *src
    cdef int first
    for i in range(nr):
        M = -INFINITY
        for sp in range(nsplit):
            mi = pm[sp * stride_split + i]
            if mi != mi or mi > M:
                M = mi
        grp = (r0 + i) // P.Lq
        pos = r0 + i - grp * P.Lq
        orow = (<floating *>P.o.base) + batch_offset(P, &P.o, b) + grp * P.o.sg + pos * P.o.sr
        L = 0
        for sp in range(nsplit):
            mi = pm[sp * stride_split + i]
            # a split that saw no key (max -inf) takes no part
            wgt[sp] = exp(mi - M) if mi != -INFINITY else 0
            if mi != -INFINITY:
                L += pl[sp * stride_split + i] * wgt[sp]
        if M == -INFINITY or not (L > 0 or L != L):
            for c in range(Dv):
                orow[c * osc] = 0
            if P.want_lse:
                (<floating *>P.lse.base)[batch_offset(P, &P.lse, b) + grp * P.lse.sg + pos * P.lse.sr] = -INFINITY
            continue
        first = 1
        for sp in range(nsplit):
            if pm[sp * stride_split + i] == -INFINITY:
                continue
            src = po + (sp * stride_split + i) * Dv
            wf = <floating>(wgt[sp] / L)
            if first:
                if osc == 1:
                    for c in range(Dv):
                        orow[c] = src[c] * wf
                else:
                    for c in range(Dv):
                        orow[c * osc] = src[c] * wf
                first = 0
            elif osc == 1:
                for c in range(Dv):
                    orow[c] += src[c] * wf
            else:
                for c in range(Dv):
                    orow[c * osc] += src[c] * wf
        if P.want_lse:
            (<floating *>P.lse.base)[batch_offset(P, &P.lse, b) + grp * P.lse.sg + pos * P.lse.sr] = <floating>(M + log(L))


# ---------------------------------------------------------------- attention: the parallel driver

cdef inline int64_t plan_work(const Plan *P) noexcept nogil:
    """A size measure of the problem: below PARALLEL_MIN_WORK it runs on one thread."""
    return P.nbatch * P.nrows * (P.Lk + 1) * (P.Dk + P.Dv + 1)


cdef enum:
    UNIT_PLAIN = 0       # row-major unit, online softmax over all keys
    UNIT_T = 1           # query-vectorised unit
    UNIT_WEIGHTS = 2     # row-major unit, statistics pass then weights pass
    UNIT_SPLIT = 3       # one key split of a row-major unit (merged afterwards)
    UNIT_T_SPLIT = 4     # one key split of a query-vectorised unit
    UNIT_T_WEIGHTS = 5   # query-vectorised unit, statistics pass then weights pass


cdef void do_unit(const Plan *P, Workspace *ws, int64_t u, int kind, int64_t units, int64_t nblk,
                  int64_t bq, int64_t rows, int64_t chunk, int64_t stride_split, floating *stats,
                  floating *po, floating *pm, double *pl) noexcept nogil:
    """Work unit u of attention_run (the same on the serial and the threaded path)."""
    cdef int64_t b, r0, nr, sp, kb, ke, uu
    if kind == UNIT_SPLIT or kind == UNIT_T_SPLIT:
        sp = u // units
        uu = u % units
        b = uu // nblk
        r0 = (uu % nblk) * bq
        nr = min(bq, P.nrows - r0)
        kb = sp * chunk
        ke = min(P.Lk, kb + chunk)
        if kind == UNIT_T_SPLIT:
            run_unit_t(P, ws, b, r0, nr, kb, ke, MODE_PARTIAL, <floating *>NULL,
                       po + (sp * stride_split + uu * rows) * P.Dv,
                       pm + sp * stride_split + uu * rows,
                       pl + sp * stride_split + uu * rows)
        else:
            run_unit(P, ws, b, r0, nr, kb, ke, MODE_PARTIAL, <floating *>NULL,
                     po + (sp * stride_split + uu * rows) * P.Dv,
                     pm + sp * stride_split + uu * rows,
                     pl + sp * stride_split + uu * rows)
        return
    b = u // nblk
    r0 = (u % nblk) * bq
    nr = min(bq, P.nrows - r0)
    if kind == UNIT_T:
        run_unit_t(P, ws, b, r0, nr, 0, P.Lk, MODE_ONLINE, <floating *>NULL,
                   <floating *>NULL, <floating *>NULL, <double *>NULL)
    elif kind == UNIT_T_WEIGHTS:
        run_unit_t(P, ws, b, r0, nr, 0, P.Lk, MODE_STATS, stats + u * rows,
                   <floating *>NULL, <floating *>NULL, <double *>NULL)
        run_unit_t(P, ws, b, r0, nr, 0, P.Lk, MODE_WEIGHTS, stats + u * rows,
                   <floating *>NULL, <floating *>NULL, <double *>NULL)
    elif kind == UNIT_WEIGHTS:
        run_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_STATS, stats + u * rows,
                 <floating *>NULL, <floating *>NULL, <double *>NULL)
        run_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_WEIGHTS, stats + u * rows,
                 <floating *>NULL, <floating *>NULL, <double *>NULL)
    else:
        run_unit(P, ws, b, r0, nr, 0, P.Lk, MODE_ONLINE, <floating *>NULL,
                 <floating *>NULL, <floating *>NULL, <double *>NULL)


cdef inline int use_t_path(int64_t nrows, size_t item) noexcept nogil:
    """Query-vectorised path for this many query rows (per batch entry)?  Its lanes
    are queries, so with a row count that is not a whole number of vectors part of
    the last vector is padding.  Measured on AVX-512 (float32, Lk 2048-8192, D 64
    and 128; 2 threads, paired against the row-major path): 16 and 32 rows 1.02-1.46x
    faster query-vectorised, 47 rows 1.04x; 6-12 rows 0.66-0.86x (a 16-lane vector
    6-12 lanes full), 24 rows 0.92x, 40 rows 0.95x; float64 16 rows 1.22x.  14-15
    rows against the few-rows path (keys and values in place): float64 on AVX-512
    1.15-1.30x, AVX2 float32 1.15-1.24x and float64 1.29x.  So: from
    max(T_MIN_ROWS, 3/4 of an FA_T_NV-vector chunk) rows on (48 float32 rows on
    AVX-512), and below that from T_MIN_ROWS rows on when at most 1/8 of the last
    vector is padding (float32 on AVX-512: 14-16, 28-32, 42-47)."""
    cdef int64_t W = FA_VBYTES // item
    cdef int64_t lanes = round_up(nrows, W)
    if nrows >= max(<int64_t>T_MIN_ROWS, 3 * FA_T_NV * W // 4):
        return 1
    return nrows >= T_MIN_ROWS and 8 * (lanes - nrows) <= lanes


cdef inline int64_t zigzag(int64_t u, int64_t nt, int64_t total) noexcept nogil:
    """Unit for iteration u of a round-robin loop over nt threads: rounds of nt
    iterations, every other round reversed, the last partial round as it is (a
    permutation of 0..total-1).  Thread t gets units t, 2nt-1-t, 2nt+t, ...: with
    unit costs that rise or fall along a run (the blocks of a causal head), each
    pair of rounds gives every thread about the same work."""
    cdef int64_t r = u // nt
    if r % 2 == 0 or (r + 1) * nt > total:
        return u
    return r * nt + nt - 1 - u % nt


cdef int attention_run(Plan *P, floating dummy, int nthreads) except -1:
    cdef int use_t = use_t_path(P.nrows, sizeof(floating))
    cdef int64_t bq = BLOCK_QT if use_t else BLOCK_Q
    cdef int64_t nblk = (P.nrows + bq - 1) // bq
    cdef int64_t rows = P.nrows if P.nrows < bq else bq
    cdef int64_t units = P.nbatch * nblk
    cdef int64_t nsplit = 1, chunk = P.Lk, u, b, r0, nr, min_keys
    cdef int kind = UNIT_PLAIN
    cdef int64_t total = units
    cdef int failed = 0
    cdef int *failed_p = &failed    # written through the pointer: shared by all threads
    cdef Workspace *ws              # assigned inside the parallel block: one per thread
    cdef floating *stats = NULL
    cdef floating *po = NULL
    cdef floating *pm = NULL
    cdef double *pl = NULL
    cdef int use_threads = nthreads > 1 and plan_work(P) > PARALLEL_MIN_WORK
    cdef int64_t stride_split = 0
    cdef int64_t kb0, ke0, kb1, ke1
    cdef int rev, static_map
    if units == 0:
        return 0
    # Decode-like problems (few units, many keys) split the key range; the split
    # count depends on the shape only, never on the thread count, so results are
    # bit-identical for any num_threads.
    min_keys = SPLIT_MIN_KEYS_T if use_t else SPLIT_MIN_KEYS
    if units < SPLIT_TARGET and not P.want_weights and P.Lk >= 2 * min_keys:
        nsplit = (SPLIT_TARGET + units - 1) // units
        if nsplit > P.Lk // min_keys:
            nsplit = P.Lk // min_keys
        chunk = round_up((P.Lk + nsplit - 1) // nsplit, BLOCK_K)
        nsplit = (P.Lk + chunk - 1) // chunk

    if P.want_weights:
        stats = <floating *>fa_alloc(P.nbatch * nblk * rows * sizeof(floating))
        if stats == NULL:
            raise MemoryError()
    if nsplit > 1:
        stride_split = units * rows
        po = <floating *>fa_alloc(nsplit * stride_split * (P.Dv if P.Dv > 0 else 1) * sizeof(floating))
        pm = <floating *>fa_alloc(nsplit * stride_split * sizeof(floating))
        pl = <double *>fa_alloc(nsplit * stride_split * sizeof(double))
        if po == NULL or pm == NULL or pl == NULL:
            fa_free(po)
            fa_free(pm)
            fa_free(pl)
            raise MemoryError()

    if nsplit > 1:
        kind = UNIT_T_SPLIT if use_t else UNIT_SPLIT
        total = units * nsplit
    elif P.want_weights:
        kind = UNIT_T_WEIGHTS if use_t else UNIT_WEIGHTS
    elif use_t:
        kind = UNIT_T
    # Causal and left windows give later rows more keys: the threads take units
    # last-first, heaviest first, so the team does not wait at the end for one
    # thread's last diagonal block (any order gives the same bits: each unit
    # writes its own rows or split).
    key_range(P, row_diag(P, 0, P.Lk), 0, P.Lk, &kb0, &ke0)
    key_range(P, row_diag(P, P.Lq - 1, P.Lk), 0, P.Lk, &kb1, &ke1)
    rev = ke1 - kb1 > ke0 - kb0
    # Small threaded problems: each unit goes to the same thread on every call
    # (static, zigzag order), so the output rows a thread writes stay in its
    # core's cache from one call to the next.  Handed out dynamically, a unit
    # often lands on the other core, whose stores must first take every line
    # of its output rows from the first core: on 2 cores (Intel Xeon, AVX-512)
    # 16 heads of 16x16 D 64 took 15.3 us against 12.6 mapped, 8 heads of 64x64
    # 43.6 against 34.6, causal 38.1 against 33.0.  Larger problems keep the
    # dynamic heaviest-first order, which also copes with a preempted thread
    # (the zigzag map measured level with it there; plain round-robin left
    # causal units unbalanced: 8 heads of 256x256 0.77x).
    static_map = plan_work(P) < STATIC_MAX_WORK
    if not use_threads:
        # Small problems: no OpenMP region at all (even a one-thread region is a
        # runtime call with locking), one workspace on the calling thread.
        with nogil:
            ws = workspace_new(P, rows, sizeof(floating), use_t)
            if ws == NULL:
                failed = 1
            else:
                for u in range(total):
                    do_unit(P, ws, u, kind, units, nblk, bq, rows, chunk, stride_split, stats, po, pm, pl)
                workspace_delete(ws)
    else:
        with nogil, parallel(num_threads=nthreads):
            # Every thread must reach the worksharing loop below (OpenMP requires
            # it), so a failed allocation only disables the thread's share of work.
            ws = workspace_new(P, rows, sizeof(floating), use_t)
            if ws == NULL:
                failed_p[0] = 1
            if static_map:
                for u in prange(total, schedule='static', chunksize=1):
                    if ws != NULL:
                        do_unit(P, ws, zigzag(u, nthreads, total), kind, units, nblk, bq, rows, chunk, stride_split, stats, po, pm, pl)
            else:
                for u in prange(total, schedule='dynamic'):
                    if ws != NULL:
                        do_unit(P, ws, total - 1 - u if rev else u, kind, units, nblk, bq, rows, chunk, stride_split, stats, po, pm, pl)
            workspace_delete(ws)

    if nsplit > 1 and not failed:
        with nogil:
            for u in prange(units, schedule='static', num_threads=nthreads, use_threads_if=use_threads):
                b = u // nblk
                r0 = (u % nblk) * bq
                nr = min(bq, P.nrows - r0)
                merge_splits(P, b, r0, nr, nsplit, po + u * rows * P.Dv, pm + u * rows,
                             pl + u * rows, stride_split)
    fa_free(stats)
    fa_free(po)
    fa_free(pm)
    fa_free(pl)
    if failed:
        raise MemoryError("fastattn: could not allocate the per-thread attention workspace")
    return 0


cdef int plan_init(Plan *P, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.ndarray out, int64_t g,
                   double scale, int causal, int64_t wl, int64_t wr, double softcap) except -1:
    """Shapes, scalar options and the q, k, v, out operands of a plan whose P.nb and
    P.bshape the caller has set; every optional operand starts switched off."""
    cdef int d
    cdef int64_t hq = g * (P.bshape[P.nb - 1] if P.nb > 0 else 1)
    P.nbatch = 1
    for d in range(P.nb):
        P.nbatch *= P.bshape[d]
    P.g = g
    P.Lq = q.shape[q.ndim - 2]
    P.Lk = k.shape[k.ndim - 2]
    P.Dk = q.shape[q.ndim - 1]
    P.Dv = v.shape[v.ndim - 1]
    P.nrows = g * P.Lq
    P.scale = scale
    P.softcap = softcap
    P.causal = causal
    P.wl = wl
    P.wr = wr
    P.has_mask = P.has_bias = P.has_kvlen = P.has_alibi = P.want_lse = P.want_weights = 0
    P.kvlen = NULL
    P.slopes = NULL
    fill_operand(&P.q, q, 2, P, hq)
    fill_operand(&P.k, k, 2, P, hq)
    fill_operand(&P.v, v, 2, P, hq)
    fill_operand(&P.o, out, 2, P, hq)
    return 0


cdef int plan_execute(Plan *P, int typenum, int nthreads) except -1:
    """Run a filled plan in its dtype (nothing to do without query rows or batch elements)."""
    if P.Lq == 0 or P.nbatch == 0:
        return 0
    if typenum == cnp.NPY_FLOAT:
        attention_run(P, <float>0, nthreads)
    else:
        attention_run(P, <double>0, nthreads)
    return 0


cdef inline int plan_options(Plan *P, mask, bias, kvlen, slopes, weights, lse) except -1:
    """The optional operands of a plan after plan_init (None: unused): mask / bias /
    weights with trailing dims (Lq, Lk), lse (Lq,), kvlen (int64) and slopes
    contiguous (nbatch * g) tables."""
    cdef int64_t hq = P.g * (P.bshape[P.nb - 1] if P.nb > 0 else 1)
    P.has_mask = mask is not None
    if P.has_mask:
        fill_operand(&P.mask, mask, 2, P, hq)
    P.has_bias = bias is not None
    if P.has_bias:
        fill_operand(&P.bias, bias, 2, P, hq)
    P.want_weights = weights is not None
    if P.want_weights:
        fill_operand(&P.w, weights, 2, P, hq)
    P.want_lse = lse is not None
    if P.want_lse:
        fill_operand(&P.lse, lse, 1, P, hq)
    P.has_kvlen = kvlen is not None
    if P.has_kvlen:
        P.kvlen = <int64_t *>cnp.PyArray_DATA(kvlen)
    P.has_alibi = slopes is not None
    if P.has_alibi:
        P.slopes = <char *>cnp.PyArray_DATA(slopes)
    return 0


cdef inline int plan_run(Plan *P, int typenum, num_threads) except -1:
    """Execute a filled plan; the thread count (num_threads as the caller gave it)
    is asked of fastattn._threads only when the problem is large enough for
    threads, which also records that this thread may own an OpenMP pool (fork
    safety)."""
    cdef int nthreads = 1
    if plan_work(P) > PARALLEL_MIN_WORK:
        nthreads = _thread_resolver(num_threads)
    return plan_execute(P, typenum, nthreads)


def attention_forward(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.ndarray out, tuple bshape,
                      Py_ssize_t g, double scale, int causal, Py_ssize_t wl, Py_ssize_t wr,
                      double softcap, mask, bias, kvlen, slopes, weights, lse, num_threads):
    """Run attention on prepared arrays (see fastattn._api.attention).

    q (..., Hq, Lq, Dk), k (..., Hk, Lk, Dk), v (..., Hk, Lk, Dv), out (..., Hq, Lq, Dv)
    all of the compute dtype; bshape is the broadcast batch shape with the head axis
    of the key/value heads (Hk = Hq / g).  mask (bool) / bias / weights have trailing
    dims (Lq, Lk), lse (Lq,).  kvlen (int64) and slopes are contiguous (nbatch * g)
    tables.  Optional arrays are None when unused.  num_threads as the caller gave
    it (None or a valid count): asked of fastattn._threads only when the problem is
    large enough for threads.  Nothing here validates: the Python layer has done it."""
    cdef Plan P
    cdef int d
    P.nb = len(bshape)
    if P.nb > MAXDIM:
        raise ValueError("too many batch dimensions")
    for d in range(P.nb):
        P.bshape[d] = bshape[d]
    plan_init(&P, q, k, v, out, g, scale, causal, wl, wr, softcap)
    plan_options(&P, mask, bias, kvlen, slopes, weights, lse)
    plan_run(&P, cnp.PyArray_TYPE(q), num_threads)
    return out


cdef inline bint behaved_array(cnp.ndarray a) noexcept:
    """Aligned, native byte order, strides multiples of the item size."""
    cdef int d
    if not cnp.PyArray_ISBEHAVED_RO(a):
        return False
    for d in range(a.ndim):
        if a.strides[d] % cnp.PyArray_ITEMSIZE(a):
            return False
    return True


def behaved(cnp.ndarray a):
    """True when the kernels can read a as it is (its dtype aside): aligned, native
    byte order, strides multiples of the item size."""
    return behaved_array(a)


def int64_range(cnp.ndarray t):
    """(min, max) of a contiguous non-empty 1-D int64 array."""
    cdef const int64_t *p = <const int64_t *>cnp.PyArray_DATA(t)
    cdef Py_ssize_t i, n = cnp.PyArray_SIZE(t)
    cdef int64_t lo, hi
    if cnp.PyArray_TYPE(t) != cnp.NPY_INT64 or t.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(t) or n == 0:
        raise ValueError("int64_range: a contiguous non-empty 1-D int64 array expected")
    lo = hi = p[0]
    for i in range(1, n):
        lo = min(lo, p[i])
        hi = max(hi, p[i])
    return lo, hi


_thread_resolver = None


def set_thread_resolver(resolver):
    """The function plain calls use to pick their thread count (fastattn._threads)."""
    global _thread_resolver
    _thread_resolver = resolver


cdef inline bint plain_operand(cnp.ndarray a, int typenum) noexcept:
    """float32/float64 of the given type, native byte order, aligned, item-multiple strides."""
    return cnp.PyArray_TYPE(a) == typenum and behaved_array(a)


cdef inline void byte_extent(cnp.ndarray a, char **lo, char **hi) noexcept:
    """[lo, hi): the bytes a's elements span (nonempty a)."""
    cdef int d
    cdef char *l = <char *>cnp.PyArray_DATA(a)
    cdef char *h = l + cnp.PyArray_ITEMSIZE(a)
    for d in range(a.ndim):
        if a.strides[d] < 0:
            l += (a.shape[d] - 1) * a.strides[d]
        else:
            h += (a.shape[d] - 1) * a.strides[d]
    lo[0] = l
    hi[0] = h


cdef bint may_overlap(cnp.ndarray a, cnp.ndarray b) noexcept:
    """np.may_share_memory(a, b): do the byte extents intersect?"""
    cdef char *alo
    cdef char *ahi
    cdef char *blo
    cdef char *bhi
    if cnp.PyArray_SIZE(a) == 0 or cnp.PyArray_SIZE(b) == 0:
        return False
    byte_extent(a, &alo, &ahi)
    byte_extent(b, &blo, &bhi)
    return alo < bhi and blo < ahi


cdef inline bint fast_window_side(w, Py_ssize_t *side):
    """One side of window= as the general path reads it (None or an int >= 0, not
    a bool); False for anything else, which the general path checks."""
    if w is None:
        side[0] = -1
        return True
    if type(w) is not int or not 0 <= w <= 0x3fffffffffffffff:
        return False
    side[0] = w
    return True


cdef inline bint fast_real(x):
    """A float the general path's _check_real takes as float(x): a Python float or
    a subclass of it (numpy.float64, what 1 / np.sqrt(d) gives), or a numpy
    float32 / float16 scalar.  (Ints and 0-d arrays are left to the general path.)"""
    return isinstance(x, float) or isinstance(x, (np.float32, np.float16))


cdef object fast_batch_table(cnp.ndarray x, cnp.ndarray q, int64_t Lk, int typenum):
    """A per-(batch, query head) option as the contiguous table that the kernels
    read, one entry per batch entry of q in C order over q's batch dims (what the
    general path's _batch_table builds): kv_lengths (typenum NPY_INT64; x int32 or
    int64, every length in [0, Lk]) or alibi_slopes (typenum q's float type; x
    float32 or float64, converted as numpy's assignment does).  x must broadcast to
    q's batch dims.  None when x is anything else or a length lies outside [0, Lk]
    (the general path then converts or raises its errors)."""
    cdef int nb = q.ndim - 2
    cdef int off, d, xt = cnp.PyArray_TYPE(x)
    cdef cnp.npy_intp n = 1
    cdef cnp.npy_intp i
    cdef cnp.npy_intp cnt[64]
    cdef cnp.npy_intp st[64]
    cdef const char *p
    cdef int64_t val
    cdef double f
    cdef cnp.ndarray t
    cdef char *tab
    if typenum == cnp.NPY_INT64:
        if xt != cnp.NPY_INT64 and xt != cnp.NPY_INT32:
            return None
    elif xt != cnp.NPY_FLOAT and xt != cnp.NPY_DOUBLE:
        return None
    if not behaved_array(x) or x.ndim > nb:
        return None
    off = nb - x.ndim
    for d in range(nb):
        n *= q.shape[d]
        cnt[d] = 0
        st[d] = 0
        if d >= off:
            if x.shape[d - off] == q.shape[d]:
                st[d] = x.strides[d - off]
            elif x.shape[d - off] != 1:
                return None
    t = cnp.PyArray_EMPTY(1, &n, typenum, 0)
    tab = <char *>cnp.PyArray_DATA(t)
    p = <const char *>cnp.PyArray_DATA(x)
    for i in range(n):
        if typenum == cnp.NPY_INT64:
            val = (<const int64_t *>p)[0] if xt == cnp.NPY_INT64 else (<const int32_t *>p)[0]
            if val < 0 or val > Lk:
                return None
            (<int64_t *>tab)[i] = val
        else:
            f = (<const double *>p)[0] if xt == cnp.NPY_DOUBLE else (<const float *>p)[0]
            if typenum == cnp.NPY_FLOAT:
                (<float *>tab)[i] = <float>f
            else:
                (<double *>tab)[i] = f
        # next multi-index over q's batch dims (the last one fastest)
        d = nb - 1
        while d >= 0:
            cnt[d] += 1
            p += st[d]
            if cnt[d] < q.shape[d]:
                break
            p -= st[d] * cnt[d]
            cnt[d] = 0
            d -= 1
    return t


cdef bint fast_score_operand(cnp.ndarray x, cnp.ndarray q, int64_t Lk, int typenum):
    """mask / bias as the general path's _score_operand accepts them without a
    reshape or conversion: of the given type, behaved, at least 2 dims, broadcasting
    to q's batch dims + (Lq, Lk) (each dim 1 or equal, right-aligned)."""
    cdef int nd = q.ndim, xd = x.ndim, d, off
    if cnp.PyArray_TYPE(x) != typenum or not behaved_array(x) or xd < 2 or xd > nd:
        return False
    if x.shape[xd - 1] != 1 and x.shape[xd - 1] != Lk:
        return False
    off = nd - xd
    for d in range(xd - 1):
        if x.shape[d] != 1 and x.shape[d] != q.shape[off + d]:
            return False
    return True


_general_attention = None


def set_general_attention(f):
    """The general path of attention() (fastattn._api._attention_general): called
    with (q, k, v, scale, causal, mask, bias, window, kv_lengths, softcap,
    alibi_slopes, return_weights, return_lse, out, num_threads) for every call the
    compiled fast path declines."""
    global _general_attention
    _general_attention = f


def attention(q, k, v, *, scale=None, causal=False, mask=None, bias=None, window=None,
              kv_lengths=None, softcap=None, alibi_slopes=None, return_weights=False,
              return_lse=False, out=None, num_threads=None):
    # fastattn.attention itself (its docstring is set by fastattn._api).  Compiled
    # so that a call costs no Python frame: a Python function fills each of these
    # twelve keyword-only defaults with a dict lookup (about a fifth of a tiny
    # call).  The compiled fast path first, the general path for anything else.
    result = attention_fast_impl(q, k, v, scale, causal, window, softcap, return_lse, num_threads,
                                 out, kv_lengths, mask, bias, alibi_slopes, return_weights)
    if result is not None:
        return result
    return _general_attention(q, k, v, scale, causal, mask, bias, window, kv_lengths, softcap,
                              alibi_slopes, return_weights, return_lse, out, num_threads)


cdef object attention_fast_impl(q, k, v, scale, causal, window, softcap, return_lse, num_threads, out,
                                kv_lengths, mask, bias, alibi_slopes, return_weights):
    """``attention(q, k, v, ...)`` without Python overhead, for the options a decode
    loop passes: scale, causal, window, softcap, return_lse, out, grouped heads,
    kv_lengths, a boolean mask, a bias, ALiBi slopes (and return_weights).

    Taken when q, k, v are ndarrays of one native float dtype and the same number
    of dims, k and v with identical batch dims that equal q's or are 1 (shared by
    q's batch elements), or on the head axis a divisor of q's (grouped-query
    attention; one key/value head: multi-query), scale and softcap are floats (or
    None) as fast_real takes them, causal is False, None, True, "top_left" or "bottom_right", window None, an int
    or a pair of ints or None, return_lse and return_weights bools, kv_lengths (if
    given) an int32 or int64 ndarray that broadcasts to q's batch dims with every
    length in [0, Lk], alibi_slopes a float32 or float64 ndarray that broadcasts
    to them, mask (bool) and bias (the dtype of q) ndarrays of at least 1 dim
    that broadcast to q's batch dims + (Lq, Lk), and out (if given) a writeable,
    aligned array of that dtype and the output's shape that overlaps none of them.  Returns None for anything else,
    and the caller takes the general path, which also produces the errors.  Small
    problems run on the calling thread and never ask for a thread count; larger ones
    ask fastattn._threads (which honours num_threads)."""
    cdef cnp.ndarray qa, ka, va, oa, res, lse = None, kvt = None, slt = None, wts = None
    cdef int nd, d, typenum, code
    cdef Plan P
    cdef cnp.npy_intp dims[64]
    cdef double sc, cap = 0.0
    cdef Py_ssize_t wl = -1, wr = -1
    cdef int64_t g = 1
    if num_threads is not None and (type(num_threads) is not int or not 1 <= num_threads <= 0x7fffffff):
        return None
    if return_lse is not False and return_lse is not True:
        return None
    if return_weights is not False and return_weights is not True:
        return None
    if causal is False or causal is None:
        code = CAUSAL_NONE
    elif causal is True:
        code = CAUSAL_TOP_LEFT
    elif type(causal) is str and causal == "top_left":
        code = CAUSAL_TOP_LEFT
    elif type(causal) is str and causal == "bottom_right":
        code = CAUSAL_BOTTOM_RIGHT
    else:
        return None
    if window is not None:
        if type(window) is tuple or type(window) is list:
            if len(window) != 2 or not (fast_window_side(window[0], &wl) and fast_window_side(window[1], &wr)):
                return None
        elif fast_window_side(window, &wl):
            wr = wl
        else:
            return None
    if softcap is not None:
        if not fast_real(softcap):
            return None
        cap = softcap
        if not (isfinite(cap) and cap > 0):
            return None
    if type(q) is not cnp.ndarray or type(k) is not cnp.ndarray or type(v) is not cnp.ndarray:
        return None
    qa, ka, va = q, k, v
    nd = qa.ndim
    if nd < 2 or nd > MAXDIM or ka.ndim != nd or va.ndim != nd:
        return None
    typenum = cnp.PyArray_TYPE(qa)
    if typenum != cnp.NPY_FLOAT and typenum != cnp.NPY_DOUBLE:
        return None
    if not (plain_operand(qa, typenum) and plain_operand(ka, typenum) and plain_operand(va, typenum)):
        return None
    for d in range(nd - 2):
        if va.shape[d] != ka.shape[d]:
            return None
        if ka.shape[d] != qa.shape[d]:
            if d == nd - 3 and 0 < ka.shape[d] < qa.shape[d] and qa.shape[d] % ka.shape[d] == 0:
                # grouped heads: the head axis (-3) of k and v divides q's (the
                # general path's rule; one key/value head too: multi-query)
                g = qa.shape[d] // ka.shape[d]
            elif ka.shape[d] != 1:
                return None
            # else k and v are shared along this batch dim (stride 0 in the plan)
    if ka.shape[nd - 1] != qa.shape[nd - 1] or va.shape[nd - 2] != ka.shape[nd - 2]:
        return None
    if scale is None:
        sc = 1.0 / sqrt(<double>qa.shape[nd - 1]) if qa.shape[nd - 1] > 0 else 1.0
    elif fast_real(scale):
        sc = scale
        if not isfinite(sc):
            return None
    else:
        return None
    if kv_lengths is not None:
        if type(kv_lengths) is not cnp.ndarray:
            return None
        kvt = fast_batch_table(kv_lengths, qa, ka.shape[nd - 2], cnp.NPY_INT64)
        if kvt is None:
            return None
    if alibi_slopes is not None:
        if type(alibi_slopes) is not cnp.ndarray:
            return None
        slt = fast_batch_table(alibi_slopes, qa, ka.shape[nd - 2], typenum)
        if slt is None:
            return None
    # a 1-D mask or bias (per key: a padding mask) is its (1, Lk) view, as the
    # general path makes it
    if type(mask) is cnp.ndarray and (<cnp.ndarray>mask).ndim == 1:
        mask = mask[None]
    if type(bias) is cnp.ndarray and (<cnp.ndarray>bias).ndim == 1:
        bias = bias[None]
    if mask is not None and (type(mask) is not cnp.ndarray
                             or not fast_score_operand(mask, qa, ka.shape[nd - 2], cnp.NPY_BOOL)):
        return None
    if bias is not None and (type(bias) is not cnp.ndarray
                             or not fast_score_operand(bias, qa, ka.shape[nd - 2], typenum)):
        return None
    for d in range(nd - 1):
        dims[d] = qa.shape[d]
    dims[nd - 1] = va.shape[nd - 1]
    if out is None:
        res = cnp.PyArray_EMPTY(nd, dims, typenum, 0)
    else:
        # a preallocated output (a decode loop's): the same checks as the general
        # path's, which raises the errors; here any doubt means None
        if type(out) is not cnp.ndarray:
            return None
        oa = out
        if oa.ndim != nd or not plain_operand(oa, typenum) or not cnp.PyArray_ISWRITEABLE(oa):
            return None
        for d in range(nd):
            if oa.shape[d] != dims[d]:
                return None
        if cnp.PyArray_SIZE(oa) > 0:
            for d in range(nd):
                if oa.strides[d] == 0 and oa.shape[d] > 1:
                    return None
        if may_overlap(oa, qa) or may_overlap(oa, ka) or may_overlap(oa, va):
            return None
        if (mask is not None and may_overlap(oa, mask)) or (bias is not None and may_overlap(oa, bias)):
            return None
        res = oa
    if return_lse:
        lse = cnp.PyArray_EMPTY(nd - 1, qa.shape, typenum, 0)
    if return_weights:
        dims[nd - 1] = ka.shape[nd - 2]
        wts = cnp.PyArray_EMPTY(nd, dims, typenum, 0)      # q's batch dims + (Lq, Lk)

    P.nb = nd - 2
    for d in range(P.nb):
        P.bshape[d] = qa.shape[d]       # q's batch dims (k and v may broadcast) ...
    if g > 1:
        P.bshape[P.nb - 1] = ka.shape[P.nb - 1]     # ... with the key heads when grouped
    plan_init(&P, qa, ka, va, res, g, sc, code, wl, wr, cap)
    plan_options(&P, mask, bias, kvt, slt, wts, lse)
    plan_run(&P, typenum, num_threads)
    if return_weights:
        return (res, wts, lse) if return_lse else (res, wts)
    if return_lse:
        return res, lse
    return res


# ---------------------------------------------------------------- softmax

cdef void softmax_row(const floating *x, floating *y, int64_t n, int log_mode) noexcept nogil:
    """y = softmax(x) (or log_softmax) of one contiguous row; x and y must not alias."""
    # the max skips NaN: a NaN element still makes the whole row NaN, through
    # exp(NaN - m) in the sum s.  Only a row with no other value than -inf needs
    # the NaN-aware max (all -inf gives zeros, any NaN gives NaN).
    cdef floating m = row_max_nonan(x, n)
    if m == -INFINITY:
        m = row_max(x, n)
    cdef floating s
    cdef int64_t j
    if m == -INFINITY:
        # all -inf (or empty): zeros, or -inf for log_softmax
        for j in range(n):
            y[j] = -INFINITY if log_mode else 0
        return
    if log_mode:
        s = row_exp_sum(x, y, n, m)
        row_shift(x, y, n, -(m + <floating>log(s)))
    else:
        s = row_exp_sum(x, y, n, m)
        row_scale(y, y, n, <floating>(1.0 / s))


cdef void softmax_rows(const Plan *P, int64_t r0, int64_t r1, int64_t n, int log_mode,
                       floating *buf) noexcept nogil:
    """Rows r0..r1-1 of softmax_run; buf (2 rows) when a row is not contiguous."""
    cdef int64_t r, j
    cdef const floating *x
    cdef floating *y
    for r in range(r0, r1):
        x = (<const floating *>P.q.base) + batch_offset(P, &P.q, r)
        y = (<floating *>P.o.base) + batch_offset(P, &P.o, r)
        if buf == NULL:
            softmax_row(x, y, n, log_mode)
        else:
            # gather, softmax_row (input and result must not alias), scatter
            for j in range(n):
                buf[j] = x[j * P.q.sc]
            softmax_row(buf, buf + n, n, log_mode)
            for j in range(n):
                y[j * P.o.sc] = buf[n + j]


cdef int softmax_run(Plan *P, floating dummy, int64_t n, int log_mode, int nthreads) except -1:
    """Rows of length n: P.q describes the input (sc = element stride along the
    row), P.o the output; the batch dims enumerate the rows."""
    cdef int64_t rows_per_unit = 1 + 16384 // (n if n > 0 else 1)
    cdef int64_t units = (P.nbatch + rows_per_unit - 1) // rows_per_unit
    cdef int64_t u
    cdef int contiguous = P.q.sc == 1 and P.o.sc == 1
    cdef int use_threads = nthreads > 1 and P.nbatch * n > SOFTMAX_PARALLEL_MIN
    cdef floating *buf = NULL
    cdef int failed = 0
    cdef int *failed_p = &failed
    if not use_threads:
        # no OpenMP region at all for small inputs (see attention_run)
        with nogil:
            if not contiguous:
                buf = <floating *>fa_alloc(2 * (n if n > 0 else 1) * sizeof(floating))
                failed = buf == NULL
            if not failed:
                softmax_rows(P, 0, P.nbatch, n, log_mode, buf)
            fa_free(buf)
    else:
        with nogil, parallel(num_threads=nthreads):
            buf = NULL
            if not contiguous:
                buf = <floating *>fa_alloc(2 * (n if n > 0 else 1) * sizeof(floating))
                if buf == NULL:
                    failed_p[0] = 1
            for u in prange(units, schedule='static'):
                if contiguous or buf != NULL:
                    softmax_rows(P, u * rows_per_unit, min(P.nbatch, (u + 1) * rows_per_unit), n, log_mode, buf)
            fa_free(buf)
    if failed:
        raise MemoryError("fastattn: could not allocate the softmax row buffer")
    return 0


cdef void cols_unit(const floating *x, int64_t xso, int64_t xsn, floating *y, int64_t yso, int64_t ysn,
                    int64_t n, int64_t inner, int64_t nblk, int64_t u, int log_mode) noexcept nogil:
    """Block u of a column softmax: outer index u // nblk, columns from
    (u % nblk) * chunk; the last block of a row also takes the leftover columns.
    Whole chunks, then single vectors, then one vector ending at the block's
    last column (it overlaps columns already done in this block and rewrites
    them with the same values).  Needs inner >= one vector; no column is
    touched by two blocks."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t CW = FA_T_NV * W
    cdef int64_t o = u // nblk
    cdef int64_t c0 = (u % nblk) * CW
    cdef int64_t w = (inner - c0) if u % nblk == nblk - 1 else CW
    cdef int64_t c = 0
    cdef const floating *xb = x + o * xso + c0
    cdef floating *yb = y + o * yso + c0
    while c + CW <= w:
        if floating is float:
            fa_col_softmax_chunk_f(xb + c, xsn, yb + c, ysn, n, log_mode)
        else:
            fa_col_softmax_chunk_d(xb + c, xsn, yb + c, ysn, n, log_mode)
        c += CW
    while c + W <= w:
        if floating is float:
            fa_col_softmax_vec_f(xb + c, xsn, yb + c, ysn, n, log_mode)
        else:
            fa_col_softmax_vec_d(xb + c, xsn, yb + c, ysn, n, log_mode)
        c += W
    if c < w:
        if floating is float:
            fa_col_softmax_vec_f(xb + w - W, xsn, yb + w - W, ysn, n, log_mode)
        else:
            fa_col_softmax_vec_d(xb + w - W, xsn, yb + w - W, ysn, n, log_mode)


cdef int softmax_cols_run(const floating *x, int64_t xso, int64_t xsn, floating *y, int64_t yso, int64_t ysn,
                          int64_t outer, int64_t n, int64_t inner, int log_mode, int nthreads) except -1:
    cdef int64_t CW = FA_T_NV * (FA_VBYTES // sizeof(floating))
    cdef int64_t nblk = inner // CW if inner >= CW else 1    # the last block takes the rest
    cdef int64_t units = outer * nblk, u
    cdef int use_threads = nthreads > 1 and units > 1 and outer * n * inner > SOFTMAX_PARALLEL_MIN
    if not use_threads:
        with nogil:
            for u in range(units):
                cols_unit(x, xso, xsn, y, yso, ysn, n, inner, nblk, u, log_mode)
    else:
        with nogil:
            for u in prange(units, schedule='static', num_threads=nthreads):
                cols_unit(x, xso, xsn, y, yso, ysn, n, inner, nblk, u, log_mode)
    return 0


# a softmax along a non-last axis takes the column kernel when the axes after
# it hold at least this many elements (one float vector); below, row by row
SOFTMAX_COL_MIN = FA_VBYTES // 4
# softmax of at most this many elements runs on the calling thread (the general
# path then does not ask fastattn._threads for a count)
SOFTMAX_THREADS_MIN = SOFTMAX_PARALLEL_MIN


def softmax_cols_forward(cnp.ndarray x, cnp.ndarray out, bint log_mode, int nthreads):
    """Softmax along axis 1 of 3-D x (outer, n, inner) into out of the same shape
    and dtype (float32/float64); both need element stride 1 along the last axis
    and item-multiple strides.  Lanes run over the last (contiguous) axis."""
    cdef int64_t item = cnp.PyArray_ITEMSIZE(x)
    if x.ndim == 3 and x.size == 0:
        return out          # (an empty array's strides may be anything)
    if x.ndim != 3 or out.ndim != 3 or x.strides[2] != item or out.strides[2] != item:
        raise ValueError("softmax_cols_forward: 3-D arrays with a contiguous last axis expected")
    if x.strides[0] % item or x.strides[1] % item or out.strides[0] % item or out.strides[1] % item:
        raise ValueError("softmax_cols_forward: strides must be multiples of the item size")
    if x.shape[2] < SOFTMAX_COL_MIN:
        raise ValueError(f"softmax_cols_forward: the last axis needs at least {SOFTMAX_COL_MIN} elements")
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT:
        softmax_cols_run(<const float *>cnp.PyArray_DATA(x), x.strides[0] // item, x.strides[1] // item,
                         <float *>cnp.PyArray_DATA(out), out.strides[0] // item, out.strides[1] // item,
                         x.shape[0], x.shape[1], x.shape[2], log_mode, nthreads)
    else:
        softmax_cols_run(<const double *>cnp.PyArray_DATA(x), x.strides[0] // item, x.strides[1] // item,
                         <double *>cnp.PyArray_DATA(out), out.strides[0] // item, out.strides[1] // item,
                         x.shape[0], x.shape[1], x.shape[2], log_mode, nthreads)
    return out


def softmax_fast(x, bint log_mode, num_threads):
    """softmax(x) / log_softmax(x) along the last axis, no ``out``, without Python
    overhead: taken when x is an ndarray of a native float dtype (aligned,
    item-multiple strides, at least one dimension, contiguous last axis).
    Returns None for anything else; the caller then takes the general path,
    which also produces the errors.  Small inputs run on the calling thread and
    never ask for a thread count."""
    cdef cnp.ndarray xa, out
    cdef int typenum, nthreads = 1
    if num_threads is not None and (type(num_threads) is not int or not 1 <= num_threads <= 0x7fffffff):
        return None
    if type(x) is not cnp.ndarray:
        return None
    xa = x
    typenum = cnp.PyArray_TYPE(xa)
    if (typenum != cnp.NPY_FLOAT and typenum != cnp.NPY_DOUBLE) or xa.ndim < 1 or xa.ndim > MAXDIM + 1:
        return None
    if not plain_operand(xa, typenum):
        return None
    if xa.shape[xa.ndim - 1] > 1 and xa.strides[xa.ndim - 1] != cnp.PyArray_ITEMSIZE(xa):
        return None     # strided rows: the general path picks a layout-aware kernel
    out = cnp.PyArray_EMPTY(xa.ndim, xa.shape, typenum, 0)
    if cnp.PyArray_SIZE(xa) > SOFTMAX_PARALLEL_MIN:
        nthreads = _thread_resolver(num_threads)
    softmax_forward(xa, out, log_mode, nthreads)
    return out


def softmax_forward(cnp.ndarray x, cnp.ndarray out, bint log_mode, int nthreads):
    """Softmax along the LAST axis of x into out (same shape, compute dtype, any strides)."""
    cdef Plan P
    cdef int d
    cdef int64_t n = x.shape[x.ndim - 1]
    P.nb = x.ndim - 1
    if P.nb > MAXDIM:
        raise ValueError("too many dimensions")
    P.nbatch = 1
    for d in range(P.nb):
        P.bshape[d] = x.shape[d]
        P.nbatch *= P.bshape[d]
    P.g = 1
    fill_operand(&P.q, x, 1, &P, 0)
    fill_operand(&P.o, out, 1, &P, 0)
    # fill_operand with one trailing dim stores the element stride in sr
    P.q.sc = P.q.sr
    P.o.sc = P.o.sr
    if P.nbatch == 0:
        return out
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT:
        softmax_run(&P, <float>0, n, log_mode, nthreads)
    else:
        softmax_run(&P, <double>0, n, log_mode, nthreads)
    return out


include "backward.pxi"
