# The plan: what one attention (or softmax) call computes, as flat C data --
# shapes, scalar options, and every operand as a pointer with element strides
# over the broadcast batch dims -- plus the tiling constants and the geometry of
# which keys a query row sees (causal, window, kv_lengths).  The argument path
# (arguments.pxi) fills it; the units (row_unit.pxi, qvec_unit.pxi) read it.

cdef enum:
    MAXDIM = 64          # batch dims supported (NumPy's own limit)
    BLOCK_Q = 64         # query rows per work unit (row-major path: decode, few rows, weights)
    BLOCK_Q_QVEC = 128       # query rows per work unit (query-vectorised path)
    BLOCK_Q_QVEC_COPY = 256  # ... of a packed or paged call whose key / value tiles are copied
                             # into the workspace (qvec_unit_rows): one copy per 256 rows
    QVEC_VECS_MAX = 128      # vectors of lanes in a query-vectorised unit (256 rows of 2 lanes)
    QVEC_MIN_ROWS = 14      # fewer query rows than this: row-major path (see use_qvec_path)
    FEW_MAX_ROWS = 13    # units of at most this many rows read keys and values in place (run_row_unit;
                         # 14 and more rows are query-vectorised, or packed where query lanes pad too much)
    QVEC_RUNS_MAX = 32      # key runs of a chunk's tile (qvec_key_runs: <= 22 for FA_QVEC_NV <= 4)
    BLOCK_K = 128        # keys per tile (a multiple of every QK panel width).  Paired on
                         # AVX2 (Zen 3): 64 was 2-8 % slower on long, 1-4 % on prefill, 9 %
                         # on D 256 (fixed costs per tile and chunk: P.V accumulator
                         # loads/stores, softmax setup, a 4-key QK tail), 192 5-7 % slower
                         # on long and D 256, 96 level.  AVX-512 (Xeon): 64 was 1-3 % slower
                         # on long, prefill, batch, f64, D 80 and D 256, level on causal; 256
                         # 2-3 % slower on long, prefill, causal, f64, D 256
    FUSE_CHUNK = 64      # keys per alternating P.V / next-tile Q.K chunk (pv_qk_chunks): a
                         # multiple of FA_W (fa_qk_rows groups keys by W / rows).  Xeon
                         # (AVX-512), 16 paired against 32: 2-13 rows 1.00-1.03x, against
                         # 64: 0.96-0.99x.  Zen 4 (AVX-512), GQA decode (4 rows per unit,
                         # keys from memory), alternating builds: 16 -> 64 1.07-1.33x
                         # faster (S8 Hq32 Hkv8 Lk4096 D128, 2 threads, 15.9-18.7 ->
                         # 13.3-14.9 ms; one 65536-key unit 7.7-8.9 -> 5.9-7.3 ms), 32
                         # between (14.6-14.7 ms), separate passes like 64: 64 it is
    PANEL_MAX = 32       # keys per QK panel, at most (FA_QK_NV vectors of floats)
    PARALLEL_MIN_WORK = 200000  # smaller problems run on the calling thread alone
    STATIC_MAX_WORK = 1 << 24   # smaller threaded problems: fixed unit -> thread map (attention_run)
    SOFTMAX_PARALLEL_MIN = 32768  # elements; softmax of fewer runs on the calling thread
    SPLIT_TARGET = 32    # split the key range when fewer units than this ...
    SPLIT_MIN_KEYS = 512 # ... into chunks of at least this many keys
    SPLIT_MIN_KEYS_QVEC = 1024  # (query-vectorised units: each split repacks its queries,
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

cdef enum:
    # how the caller stores q, k, v or a bias (the kernels compute in float32 or
    # float64): each storage type has its load-and-widen kernels (widen.h,
    # stored_reads.h) and one branch in each stored_* wrapper (typed_kernels.pxi)
    STORE_F32 = 0
    STORE_F64 = 1
    STORE_F16 = 2
    STORE_BF16 = 3
    STORE_I8 = 4
    STORE_F8E4 = 5             # ml_dtypes float8_e4m3fn (k, v only)
    STORE_F8E5 = 6             # ml_dtypes float8_e5m2 (k, v only)
    STORE_U8Z = 7              # QuantizedKV, 8 bits (k, v only): codes, per-group scale and zero point
    STORE_U4Z = 8              # QuantizedKV, 4 bits: two codes a byte (quant_reads.h, loads.pxi dequant_tile)
    # k_scale / v_scale (int8 / float8 k, v): one value per key, or per head dimension
    SCALE_NONE = 0
    SCALE_PER_KEY = 1
    SCALE_PER_CHANNEL = 2
    SCALE_GROUPED = 3          # a QuantizedKV's own scales: ks / vs (..., Lk, D // G), zero points kz / vz

cdef struct Operand:
    char *base                 # data pointer (bool for masks)
    int64_t item               # bytes per element
    int store                  # the storage type (STORE_*) of q, k, v, bias
    int64_t bs[MAXDIM]         # strides of the broadcast batch dims, in elements (0 = broadcast)
    int64_t sg                 # stride between query heads of one key/value head group (GQA)
    int64_t sr                 # row stride
    int64_t sc                 # column stride
    int64_t sp                 # paged k, v (and their scales): stride between cache blocks (row_at)

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
    int align                  # 1: p(i) bottom-right aligned (i + Lk_eff - Lq), 0: p(i) = i
    int64_t wl, wr             # window sides, -1: unbounded
    int has_mask, has_bias, has_kvlen, has_kvstart, has_alibi, want_lse, want_weights
    int kscale, vscale         # SCALE_NONE / SCALE_PER_KEY / SCALE_PER_CHANNEL
    Operand q, k, v, o, mask, bias, w, lse
    Operand ks, vs             # the scales (float32), trailing dims (Lk, 1) or (1, D); QuantizedKV: (Lk, D // G)
    Operand kz, vz             # QuantizedKV k, v: the zero points (float32), trailing dims (Lk, D // G)
    int64_t kgroup, vgroup     # QuantizedKV k, v: the group size G
    int64_t *kvlen             # (nbatch * g) valid key counts
    int64_t *kvstart           # (nbatch * g) first valid key (left padding)
    char *slopes               # (nbatch * g) ALiBi slopes, compute dtype
    const int64_t *pages       # paged k, v (attention_paged): the blocks holding keys 0, page, 2 page, ...
    int64_t page               # keys per block (NULL pages: the key rows of k, v are sr apart)
    const double *sinks        # (nbatch * g) attention sinks, float64 (sinks.pxi); NULL: none


cdef inline int64_t batch_offset(const Plan *P, const Operand *op, int64_t b) noexcept nogil:
    """Element offset of batch element b (row-major over bshape) in operand op."""
    cdef int64_t off = 0, idx
    cdef int d
    if b == 0:
        return 0
    for d in range(P.nb - 1, -1, -1):
        idx = b % P.bshape[d]
        b = b // P.bshape[d]
        off += idx * op.bs[d]
    return off


cdef inline int64_t row_at(const Plan *P, const Operand *op, int64_t t) noexcept nogil:
    """Element offset (past the batch offset) of key row t of k, v or a per-key
    scale: t rows on, or in a paged cache slot t % page of block pages[t // page]."""
    if P.pages == NULL:
        return t * op.sr
    return P.pages[t // P.page] * op.sp + (t % P.page) * op.sr


cdef inline int64_t run_end(const Plan *P, int64_t t, int64_t t1) noexcept nogil:
    """The end of the run of key rows from t (< t1) stored sr apart: t1, or the
    end of t's cache block."""
    cdef int64_t e
    if P.pages == NULL:
        return t1
    e = (t // P.page + 1) * P.page
    return e if e < t1 else t1


# the type numbers of ml_dtypes' bfloat16, float8_e4m3fn, float8_e5m2, once seen
# (ml_dtypes is never imported: its dtypes are recognised by name and size)
cdef int _bfloat16_num = -1
cdef int _f8e4_num = -1
cdef int _f8e5_num = -1


cdef int store_of_other(cnp.ndarray a) noexcept:
    """store_of for everything but float32 / float64."""
    global _bfloat16_num, _f8e4_num, _f8e5_num
    cdef int t = cnp.PyArray_TYPE(a)
    if t == cnp.NPY_FLOAT16:
        return STORE_F16
    if t == cnp.NPY_INT8:
        return STORE_I8
    if t == _bfloat16_num:
        return STORE_BF16
    if t == _f8e4_num:
        return STORE_F8E4
    if t == _f8e5_num:
        return STORE_F8E5
    if t >= 256:        # NPY_USERDEF
        if cnp.PyArray_ITEMSIZE(a) == 2 and a.dtype.name == "bfloat16":
            _bfloat16_num = t
            return STORE_BF16
        if cnp.PyArray_ITEMSIZE(a) == 1 and a.dtype.name == "float8_e4m3fn":
            _f8e4_num = t
            return STORE_F8E4
        if cnp.PyArray_ITEMSIZE(a) == 1 and a.dtype.name == "float8_e5m2":
            _f8e5_num = t
            return STORE_F8E5
    return -1


cdef inline int store_of(cnp.ndarray a) noexcept:
    """The storage type of a's elements (-1: none the kernels read in place)."""
    cdef int t = cnp.PyArray_TYPE(a)
    if t == cnp.NPY_FLOAT:
        return STORE_F32
    if t == cnp.NPY_DOUBLE:
        return STORE_F64
    return store_of_other(a)


cdef inline const char *stored_at(const Operand *op, int64_t off) noexcept nogil:
    """The address of element off (counted in elements) of a stored operand."""
    return op.base + off * op.item


cdef int fill_operand(Operand *op, cnp.ndarray a, int trailing, const Plan *P, int64_t hq) except -1:
    """Describe array `a` whose last `trailing` dims are (rows[, cols]) and whose
    leading dims broadcast to the plan's batch shape, the last batch dim being the
    query-head axis of size hq = g * bshape[-1] when GQA folds heads into rows."""
    cdef int nd = a.ndim
    cdef int nbd = nd - trailing
    cdef int64_t item = cnp.PyArray_ITEMSIZE(a)
    cdef int d, pd, shift = 0
    cdef int64_t size, stride
    op.base = <char *>cnp.PyArray_DATA(a)
    op.item = item
    op.store = store_of(a)
    op.sg = 0
    op.sp = 0
    while (<int64_t>1 << shift) < item:
        shift += 1      # item sizes are powers of two: strides in elements by a shift
    for d in range(P.nb):
        op.bs[d] = 0
    for d in range(nbd):
        pd = P.nb - nbd + d
        size = a.shape[d]
        stride = a.strides[d]
        if stride & (item - 1):
            raise ValueError("array strides must be multiples of the item size")
        stride >>= shift
        if size == 1:
            continue
        if pd == P.nb - 1 and P.g > 1 and size == hq:
            op.bs[pd] = stride * P.g
            op.sg = stride
        else:
            op.bs[pd] = stride
    op.sr = a.strides[nd - trailing] >> shift if trailing >= 1 else 0
    op.sc = a.strides[nd - 1] >> shift if trailing >= 2 else 0
    if trailing >= 1 and a.shape[nd - trailing] == 1:
        op.sr = 0
    if trailing >= 2 and a.shape[nd - 1] == 1:
        op.sc = 0
    return 0

cdef inline int64_t round_up(int64_t x, int64_t m) noexcept nogil:
    if m & (m - 1) == 0:        # a power of two (every call but a few): no division
        return (x + m - 1) & -m
    return (x + m - 1) // m * m

cdef inline int64_t row_diag(const Plan *P, int64_t pos, int64_t kl) noexcept nogil:
    """Diagonal position p(i) of query position pos against kl keys: pos itself,
    or shifted so the last query meets the last key (bottom-right alignment:
    causal="bottom_right", or align="bottom_right")."""
    return pos + kl - P.Lq if P.align else pos


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

cdef int plan_init(Plan *P, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.ndarray out) except -1:
    """The q, k, v, out operands of a plan whose batch layout (P.nb, P.bshape, P.g),
    shapes (Lq, Lk, Dk, Dv) and scalar options the argument path has set; every
    optional operand starts switched off."""
    cdef int d
    cdef int64_t hq = P.g * (P.bshape[P.nb - 1] if P.nb > 0 else 1)
    P.nbatch = 1
    for d in range(P.nb):
        P.nbatch *= P.bshape[d]
    P.nrows = P.g * P.Lq
    P.has_mask = P.has_bias = P.has_kvlen = P.has_kvstart = P.has_alibi = P.want_lse = P.want_weights = 0
    P.kscale = P.vscale = SCALE_NONE
    P.kvlen = NULL
    P.kvstart = NULL
    P.slopes = NULL
    P.pages = NULL
    P.page = 1
    P.sinks = NULL
    fill_operand(&P.q, q, 2, P, hq)
    fill_operand(&P.k, k, 2, P, hq)
    fill_operand(&P.v, v, 2, P, hq)
    fill_operand(&P.o, out, 2, P, hq)
    return 0

cdef int plan_scale(Plan *P, Operand *op, cnp.ndarray scale, int kind) except -1:
    """An int8 k_scale / v_scale (float32, at least 2-D: (..., Lk, 1) per key or
    (..., 1, D) per channel) as an operand of the plan."""
    fill_operand(op, scale, 2, P, P.g * (P.bshape[P.nb - 1] if P.nb > 0 else 1))
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
