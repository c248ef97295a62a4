# The backward's plan (BwdPlan: the forward's Plan plus the gradients, tiles and key
# groups) and per-thread workspace (BwdWorkspace: one arena of tiles and row
# buffers), their sizes and layout.  Included by backward.pxi; compiled once per
# ISA with it.

cdef enum:
    BWD_BQ = 96              # query rows per tile; with BWD_BK a multiple of every register
    BWD_BK = 96              # block, vector width and QK panel width of every ISA and dtype
    BWD_UNIT_TARGET = 32     # key groups per batch element: at least this many units when possible
    BWD_NARROW = 256         # dq columns summed at a time before a float16 / bfloat16 dq's rounding

# dq partials (G > 1 key groups) take at most this many bytes; G shrinks to fit
cdef int64_t BWD_PARTIAL_BUDGET = 16 << 20


cdef struct BwdPlan:
    Plan P                  # the forward's plan: q, k, v, out (P.o), lse (P.lse), mask, bias,
                            # kv_lengths, ALiBi; P.softcap is 0 (softcap is applied here)
    Plan Pv                 # P with v in the key slot: pack_k_tile packs value panels with it
    Operand dout, dq, dk, dv, dbias
    double softcap          # 0: none
    int want_dbias
    int bd_s, bd_dp         # S = Q.K^T / dP = dO.V^T by bfloat16 pair dot products (bf16_dot.h):
                            # float32 compute on a target with them, both operands bfloat16
    int64_t dkp, dvp        # head dims rounded up to whole vectors
    int64_t nkb, nqb        # key blocks, query blocks (over the g * Lq rows of a batch element)
    int64_t tq, ts          # row strides of the transposed tiles (query rows) and of the score
                            # tiles (keys): BWD_BQ and BWD_BK, less for problems smaller than a tile
    int64_t G               # key groups per batch element
    int64_t nslices
    const int64_t *order    # batch elements slice by slice (NULL: slice s = batch element s)
    const int64_t *starts   # slice s is order[starts[s]:starts[s + 1]]
    char *partial           # G > 1: dq partials (nbatch, G, nrows, dkp)


cdef struct BwdWorkspace:
    char *arena             # one allocation holding every buffer below
    Workspace rows          # the forward's per-row arrays (lo, hi, pos, qoff, goff) of one query
                            # block, for setup_rows, rows_key_span and apply_score_options
    # (tq <= BQ query rows, ts <= BK keys: BwdPlan)
    void *qs                # tq x dkp    scaled query rows
    void *dor               # tq x dvp    output-gradient rows
    void *kt                # Dk x ts     key panels (pack_k_tile)
    void *vt                # Dv x ts     value panels
    void *ks                # ts x dkp    scaled key rows
    void *s                 # tq x ts     scores
    void *dp                # tq x ts     dO . V^T, then dS
    void *f                 # tq x ts     softcap factor 1 - tanh^2
    void *db                # tq x ts     bias gradient before the softcap factor
    void *pt                # ts x tq     P^T
    void *dst               # ts x tq     dS^T
    void *dk                # ts x dkp    dK accumulator of the key block
    void *dv                # ts x dvp    dV accumulator
    void *tail              # PV_MR x dkp the dQ rows of a partial register block
    void *lse               # nrows + tq  per-row lse (+inf for rows that see no key)
    void *dd                # nrows + tq  rowsum(dO * O)
    int64_t *qlo            # nqb         first key any row of a query block sees
    int64_t *qhi            # nqb         one past its last
    int64_t *off            # max(tq, ts) element offsets of rows to pack
    void *dq                # nrows x dkp dQ accumulator (G == 1)
    void *q2                # tq x 2*dk2  bfloat16 query rows, unscaled (bd_s; dk2 = (Dk + 1) // 2)
    void *do2               # tq x 2*dv2  bfloat16 output-gradient rows (bd_dp)


cdef inline int64_t bd_ld(int64_t D) noexcept nogil:
    """bfloat16 elements per packed row of the pair products: D rounded up to pairs
    (the kernels' panels hold (D + 1) // 2 pairs a key)."""
    return 2 * ((D + 1) // 2)


cdef int64_t bwd_workspace_layout(BwdWorkspace *ws, const BwdPlan *B, size_t item, char *base) noexcept nogil:
    """Lay the buffers out from base (NULL: only measure); returns the bytes needed."""
    cdef char *cur = base
    cdef int64_t tile = B.tq * B.ts * item
    cdef int64_t dk = B.P.Dk if B.P.Dk > 0 else 1
    cdef int64_t dv = B.P.Dv if B.P.Dv > 0 else 1
    cdef int64_t nrows = B.P.nrows
    ws.qs = carve(&cur, B.tq * B.dkp * item)
    ws.dor = carve(&cur, B.tq * B.dvp * item)
    ws.kt = carve(&cur, B.ts * dk * item)
    ws.vt = carve(&cur, B.ts * dv * item)
    ws.ks = carve(&cur, B.ts * B.dkp * item)
    ws.s = carve(&cur, tile)
    ws.dp = carve(&cur, tile)
    ws.f = carve(&cur, tile) if B.softcap > 0 else NULL
    ws.db = carve(&cur, tile) if B.softcap > 0 and B.want_dbias else NULL
    ws.pt = carve(&cur, tile)
    ws.dst = carve(&cur, tile)
    ws.dk = carve(&cur, B.ts * B.dkp * item)
    ws.dv = carve(&cur, B.ts * B.dvp * item)
    ws.tail = carve(&cur, FA_PV_MR * B.dkp * item)
    ws.lse = carve(&cur, (nrows + B.tq) * item)
    ws.dd = carve(&cur, (nrows + B.tq) * item)
    ws.qlo = <int64_t *>carve(&cur, B.nqb * sizeof(int64_t))
    ws.qhi = <int64_t *>carve(&cur, B.nqb * sizeof(int64_t))
    ws.off = <int64_t *>carve(&cur, max(B.tq, B.ts) * sizeof(int64_t))
    ws.dq = carve(&cur, nrows * B.dkp * item) if B.G == 1 else NULL
    ws.q2 = carve(&cur, B.tq * bd_ld(B.P.Dk) * 2) if B.bd_s else NULL
    ws.do2 = carve(&cur, B.tq * bd_ld(B.P.Dv) * 2) if B.bd_dp else NULL
    ws.rows.lo = <int64_t *>carve(&cur, B.tq * sizeof(int64_t))
    ws.rows.hi = <int64_t *>carve(&cur, B.tq * sizeof(int64_t))
    ws.rows.pos = <int64_t *>carve(&cur, B.tq * sizeof(int64_t))
    ws.rows.qoff = <int64_t *>carve(&cur, B.tq * sizeof(int64_t))
    ws.rows.goff = <int64_t *>carve(&cur, B.tq * sizeof(int64_t))
    return cur - base


cdef BwdWorkspace *bwd_workspace_new(const BwdPlan *B, size_t item) noexcept nogil:
    """A heap workspace with its arena allocated; NULL on failure.  The lanes of
    dP and of the softcap factor that no product writes, and the row terms of
    padding rows, are read (and discarded by fa_bwd_tile's selects): zeros
    there, not whatever the memory held (subnormal garbage costs microcode
    assists on some cores)."""
    cdef BwdWorkspace *ws = <BwdWorkspace *>fa_alloc(sizeof(BwdWorkspace))
    cdef int64_t nbytes
    if ws == NULL:
        return NULL
    memset(ws, 0, sizeof(BwdWorkspace))
    nbytes = bwd_workspace_layout(ws, B, item, NULL)
    if nbytes > WORKSPACE_MAX_BYTES:
        fa_free(ws)
        return NULL
    ws.arena = <char *>fa_alloc(nbytes)
    if ws.arena == NULL:
        fa_free(ws)
        return NULL
    bwd_workspace_layout(ws, B, item, ws.arena)
    memset(ws.dp, 0, B.tq * B.ts * item)
    if ws.f != NULL:
        memset(ws.f, 0, B.tq * B.ts * item)
    memset(ws.lse, 0, (B.P.nrows + B.tq) * item)
    memset(ws.dd, 0, (B.P.nrows + B.tq) * item)
    return ws


cdef void bwd_workspace_delete(BwdWorkspace *ws) noexcept nogil:
    if ws != NULL:
        fa_free(ws.arena)
        fa_free(ws)
