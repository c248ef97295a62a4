# The per-thread workspace: one arena per thread and call holding every buffer
# a unit needs (packed tiles, scores, accumulators, per-row key ranges), and
# setup_rows, which fills the per-row part for a unit's rows.

cdef struct Workspace:
    char *arena     # one allocation holding this struct and every buffer below
    int64_t nbytes  # its size
    void *qp        # BLOCK_Q' x Dk      packed, scaled query rows
    void *kt        # panels of Dk x NR  packed, transposed key tile
    void *vp        # BLOCK_K x Dvp      packed value tile (columns padded to a vector)
    void *s         # BLOCK_Q' x BLOCK_K scores, then probabilities
    void *o         # BLOCK_Q' x Dvp     output accumulator
    void *m         # BLOCK_Q'           running row max
    void *pm        # BLOCK_Q'           the tile's largest probability per row (row-major unit, row_bf16_pv)
    double *l       # BLOCK_Q'           running row sum (double even for float inputs)
    int64_t *lo     # BLOCK_Q'           first visible key of each row
    int64_t *hi     # BLOCK_Q'           one past the last visible key
    int64_t *pos    # BLOCK_Q'           diagonal position p(i) of each row
    int64_t *qoff   # BLOCK_Q'           element offset of each query row (without batch)
    int64_t *goff   # BLOCK_Q'           group index of each row (GQA)
    # query-vectorised path (lanes = query rows, ld = the unit's rows, at least BLOCK_Q_QVEC,
    # rounded to a chunk, plus a line: qvec_ld)
    int64_t ld
    void *qt        # Dk x ld            scaled queries, transposed
    void *st        # BLOCK_K x ld       scores / probabilities, transposed
    void *ot        # Dv x ld            output accumulator, transposed
    void *mt        # ld                 running max per query lane
    void *lt        # ld                 running sum per query lane
    void *lof       # ld                 visible key range per lane, as floats
    void *hif       # ld
    void *mxt       # chunk              max of the current tile per query lane
    void *mtb       # BLOCK_K x chunk    transposed boolean-mask block (bytes)
    void *kw        # BLOCK_K x Dkp      a key tile widened from its storage type (non-native only;
                    #                    row-major units: a QuantizedKV key tile before its panels)
    void *vw        # BLOCK_K x Dvp      a value tile widened likewise


cdef inline int64_t rows_alloc(int64_t rows) noexcept nogil:
    # rows rounded up so both micro-kernels can run whole register blocks, and
    # the few-rows QK (fa_qk_rows) whole blocks of up to 8 rows
    return max(round_up(rows, FA_QK_MR), round_up(rows, 8)) + FA_PV_MR


cdef inline int64_t qvec_ld(int64_t rows, size_t item) noexcept nogil:
    # Row stride of the query-vectorised tiles (Qt, St, Ot: one row per dim / key /
    # value column, one lane per query row): BLOCK_Q_QVEC lanes (or the unit's rows,
    # when more) plus one cache line.
    # A chunk walks one 64-byte column of a tile; with a 512-byte stride its
    # rows map to 8 of the 64 L1 sets, and 64 score rows alone fill all 8 ways
    # of a 32 KiB L1 (Zen 3): the extra line spreads them over every set.
    # Paired on Zen 3 (AVX2): prefill 1.03-1.05x, long 1.04-1.06x, causal
    # 1.06-1.07x, D 256 1.07x, mask/bias 1.05-1.06x.
    return (round_up(rows if rows > BLOCK_Q_QVEC else BLOCK_Q_QVEC, FA_QVEC_NV * (FA_VBYTES // item))
            + 64 // <int64_t>item)


cdef inline char *carve(char **cursor, int64_t nbytes) noexcept nogil:
    """Next 64-byte aligned piece of nbytes from the arena at cursor[0]."""
    cdef char *p = cursor[0]
    cursor[0] += round_up(nbytes if nbytes > 0 else 1, 64)
    return p


cdef int64_t workspace_layout(Workspace *ws, const Plan *P, int64_t rows, size_t item, int use_qvec,
                          char *base) noexcept nogil:
    """Lay the buffers out from base (NULL: only measure); returns the bytes needed.

    One arena per thread and call: a tiny problem pays for one allocation, not twenty."""
    cdef char *cur = base
    cdef int64_t R = rows_alloc(rows)
    cdef int64_t W = FA_VBYTES // item
    cdef int64_t dvp = round_up(P.Dv if P.Dv > 0 else 1, W)
    cdef int64_t dk = P.Dk if P.Dk > 0 else 1
    cdef int64_t dv = P.Dv if P.Dv > 0 else 1
    cdef int64_t ld = qvec_ld(rows, item)
    cdef int native = STORE_F32 if item == 4 else STORE_F64
    ws.qp = ws.kt = ws.vp = ws.s = ws.o = ws.m = ws.pm = NULL
    ws.l = NULL
    ws.ld = ld
    ws.qt = ws.st = ws.ot = ws.mt = ws.lt = ws.lof = ws.hif = ws.mtb = ws.mxt = ws.kw = ws.vw = NULL
    if use_qvec:
        if P.k.store != native or P.v.store != native or P.pages != NULL:
            ws.kw = carve(&cur, BLOCK_K * round_up(dk, W) * item)
            ws.vw = carve(&cur, BLOCK_K * dvp * item)
        ws.qt = carve(&cur, dk * ld * item)
        ws.st = carve(&cur, BLOCK_K * ld * item)
        ws.ot = carve(&cur, dv * ld * item)
        ws.mt = carve(&cur, ld * item)
        ws.lt = carve(&cur, ld * item)
        ws.lof = carve(&cur, ld * item)
        ws.hif = carve(&cur, ld * item)
        ws.mtb = carve(&cur, BLOCK_K * FA_QVEC_NV * (FA_VBYTES // item))
        ws.mxt = carve(&cur, FA_QVEC_NV * (FA_VBYTES // item) * item)
    else:
        if P.k.store == STORE_U8Z or P.k.store == STORE_U4Z:
            ws.kw = carve(&cur, BLOCK_K * round_up(dk, W) * item)   # the dequantized key tile
        ws.qp = carve(&cur, R * dk * item)
        ws.kt = carve(&cur, round_up(BLOCK_K, FA_QK_NV * W) * dk * item)
        ws.vp = carve(&cur, BLOCK_K * dvp * item)
        ws.s = carve(&cur, (R + FEW_MAX_ROWS) * BLOCK_K * item)   # + the next tile's scores (run_row_unit)
        ws.o = carve(&cur, R * dvp * item)
        ws.m = carve(&cur, R * item)
        ws.pm = carve(&cur, R * item)
        ws.l = <double *>carve(&cur, R * sizeof(double))
    ws.lo = <int64_t *>carve(&cur, R * sizeof(int64_t))
    ws.hi = <int64_t *>carve(&cur, R * sizeof(int64_t))
    ws.pos = <int64_t *>carve(&cur, R * sizeof(int64_t))
    ws.qoff = <int64_t *>carve(&cur, R * sizeof(int64_t))
    ws.goff = <int64_t *>carve(&cur, R * sizeof(int64_t))
    return cur - base


cdef Workspace *workspace_new(const Plan *P, int64_t rows, size_t item, int use_qvec) noexcept nogil:
    """A workspace and its buffers in one arena (the thread's kept one when it is
    large enough: fa_arena_take); NULL on failure."""
    cdef Workspace probe
    cdef Workspace *ws
    cdef int64_t head = round_up(sizeof(Workspace), 64), nbytes
    cdef char *arena
    if P.Dk > (<int64_t>1 << 32) or P.Dv > (<int64_t>1 << 32):
        return NULL     # the byte counts below could overflow int64
    nbytes = head + workspace_layout(&probe, P, rows, item, use_qvec, NULL)
    if nbytes > WORKSPACE_MAX_BYTES:
        return NULL     # absurd head dims: fail like an allocation failure, never overcommit
    arena = <char *>fa_arena_take(nbytes)
    if arena == NULL:
        return NULL
    ws = <Workspace *>arena
    ws.arena = arena
    ws.nbytes = nbytes
    workspace_layout(ws, P, rows, item, use_qvec, arena + head)
    return ws


cdef void workspace_delete(Workspace *ws) noexcept nogil:
    if ws != NULL:
        fa_arena_give(ws.arena, ws.nbytes)

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
        if P.has_kvstart and P.kvstart[b * P.g + grp] > lo:
            # left padding: keys before kv_start are invisible (the diagonal stays)
            lo = P.kvstart[b * P.g + grp]
            if hi < lo:
                hi = lo
        if hi > lo:
            if lo < lo_all[0]:
                lo_all[0] = lo
            if hi > hi_all[0]:
                hi_all[0] = hi
        ws.lo[i] = lo
        ws.hi[i] = hi
