# Loads of the stored operands into the compute type: the scaled query pack, the
# transposed key tile, the value tile, prefetch of a tile.  Every read of q, k or
# v that packs goes through here (the in-place readers are the C kernels of
# stored_reads.h); a new storage type adds its load-and-widen here.

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
                fa_pack_transposed_f(kbase, offs, nk, Dk, 1, kt + (p0 // NR) * Dk * NR, NR, W * sr)
            else:
                fa_pack_transposed_d(kbase, offs, nk, Dk, 1, kt + (p0 // NR) * Dk * NR, NR, W * sr)
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

cdef inline void prefetch_tile(const Plan *P, const floating *kbase, const floating *vbase,
                               int64_t t0, int64_t t1) noexcept nogil:
    """Request key and value rows t0..t1-1 (rows with contiguous elements only)."""
    if P.k.sc == 1:
        prefetch_rows(kbase + t0 * P.k.sr, t1 - t0, P.k.sr, P.Dk)
    if P.v.sc == 1:
        prefetch_rows(vbase + t0 * P.v.sr, t1 - t0, P.v.sr, P.Dv)
