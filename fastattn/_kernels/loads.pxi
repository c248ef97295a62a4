# Loads of the stored operands into the compute type: the scaled query pack, the
# transposed key tile, the value tile, a key/value tile widened into the
# workspace, prefetch of a tile.  Every read of q, k or v that packs goes through
# here, addressed in the operand's own storage type (stored_at, the stored_*
# wrappers); the in-place readers are the C kernels of stored_reads.h.

cdef inline double scale_at(const Operand *s, int64_t off, int64_t j, int64_t c) noexcept nogil:
    """k_scale / v_scale (float32) of key j, head dimension c, from batch offset off."""
    return (<const float *>s.base)[off + j * s.sr + c * s.sc]


cdef inline int64_t key_scale_offset(const Plan *P, const Operand *s, int64_t b, int64_t g) noexcept nogil:
    """Offset of the k_scale / v_scale of key / value head b, query group g (a
    query row's group under GQA): what scale_at, key_scale_at and scale_by_keys
    address from."""
    return batch_offset(P, s, b) + g * s.sg


cdef inline double key_scale_at(const Plan *P, const Operand *s, int64_t off, int64_t t) noexcept nogil:
    """A per-key k_scale / v_scale of key t (paged like its cache: row_at)."""
    return (<const float *>s.base)[off + row_at(P, s, t)]


cdef inline void scale_by_keys(const Plan *P, const Operand *s, int64_t off, floating *srow, int64_t t0, int64_t a,
                               int64_t e) noexcept nogil:
    """srow[j] *= the per-key scale of key t0 + j (key_scale_at), for j in [a, e):
    one row_at per run of slots -- a paged cache's block -- not one per key (its
    division and table read, per key and query row, took a quarter of a paged
    int8 decode)."""
    cdef const float *sp = <const float *>s.base
    cdef int64_t t = t0 + a, x, j, sr = s.sr
    cdef const float *r
    while t < t0 + e:
        x = run_end(P, t, t0 + e)
        r = sp + off + row_at(P, s, t)
        for j in range(x - t):
            srow[t - t0 + j] *= <floating>r[j * sr]
        t = x


cdef void pack_q(const Plan *P, Workspace *ws, const char *qbase, int64_t b, int64_t nr,
                 int64_t pad, floating dummy) noexcept nogil:
    """Qp[i, :] = scale * q[row i, :] (times the per-channel k_scale of int8 keys),
    then zero rows up to pad (the QK kernels' whole blocks)."""
    cdef floating *qp = <floating *>ws.qp
    cdef floating scale = <floating>P.scale
    cdef int64_t i, d, Dk = P.Dk, sc = P.q.sc, koff
    cdef const char *src
    for i in range(nr):
        src = qbase + ws.qoff[i] * P.q.item
        if sc == 1:
            stored_scale_row(P.q.store, src, qp + i * Dk, Dk, scale)
        else:
            for d in range(Dk):
                qp[i * Dk + d] = <floating>stored_value(P.q.store, src, d * sc) * scale
        if P.kscale == SCALE_PER_CHANNEL:
            # q . (k * s) = (q * s) . k: the channel scales once per query row
            koff = key_scale_offset(P, &P.ks, b, ws.goff[i])
            for d in range(Dk):
                qp[i * Dk + d] *= <floating>scale_at(&P.ks, koff, 0, d)
    for i in range(nr * Dk, pad * Dk):
        qp[i] = 0


cdef void pack_k_tile(const Plan *P, floating *kt, const char *kbase, int64_t t0, int64_t n) noexcept nogil:
    """Transpose keys t0..t0+n-1 into panels of Dk x NR (see fa_qk_block)."""
    cdef int64_t NR = FA_QK_NV * (FA_VBYTES // sizeof(floating))
    cdef int64_t j, d, Dk = P.Dk, sr = P.k.sr, sc = P.k.sc, p0, nk
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef floating *panel
    cdef const char *src
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
                offs[j] = row_at(P, &P.k, t0 + p0 + j)
            # (paged keys: the rows W on may lie in another block, or in none)
            stored_pack_transposed(P.k.store, kbase, offs, nk, Dk, <floating>1, kt + (p0 // NR) * Dk * NR, NR,
                                   W * sr if P.pages == NULL else 0)
            p0 += NR
    else:
        for j in range(n):
            panel = kt + (j // NR) * Dk * NR + (j % NR)
            src = kbase + row_at(P, &P.k, t0 + j) * P.k.item
            for d in range(Dk):
                panel[d * NR] = <floating>stored_value(P.k.store, src, d * sc)
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


cdef inline const floating *widen_row(const Operand *op, const char *src, floating *dst,
                                      int64_t n) noexcept nogil:
    """n elements of one stored row (elements op.sc apart) into dst, contiguous,
    in the compute type (float16 / bfloat16 widened exactly, the compute type
    copied); returns dst."""
    cdef int64_t c
    if op.store == native_store(<floating>0):
        for c in range(n):
            dst[c] = (<const floating *>src)[c * op.sc]
    elif op.sc == 1:
        stored_scale_row(op.store, src, dst, n, <floating>1)
    else:
        for c in range(n):
            dst[c] = <floating>stored_value(op.store, src, c * op.sc)
    return dst


cdef int pack_rows_widened(const Plan *P, const Operand *op, floating *dst, int64_t ld, const char *base, int64_t t0,
                           int64_t n, int64_t D) noexcept nogil:
    """Copy rows t0..t0+n-1 of D elements of a stored operand (k or v) into dst
    rows ld apart, widened to the compute type, columns D..ld-1 zero when ld
    rounds D up (the P.V kernel runs whole vectors).  Returns 1 when the tile
    holds an inf or NaN (see pv_rows_exact).  Paged rows: run by run (row_at)."""
    cdef int64_t j, c, sr = op.sr, sc = op.sc, t, e
    cdef const char *src
    cdef floating x, probe = 0
    cdef int nonfinite = 0
    if sc == 1:
        if P.pages == NULL:
            return stored_pack_rows(op.store, base + t0 * sr * op.item, sr, n, D, dst, ld)
        t = t0
        while t < t0 + n:
            e = run_end(P, t, t0 + n)
            nonfinite |= stored_pack_rows(op.store, base + row_at(P, op, t) * op.item, sr, e - t, D,
                                          dst + (t - t0) * ld, ld)
            t = e
        return nonfinite
    for j in range(n):
        src = base + row_at(P, op, t0 + j) * op.item
        for c in range(D):
            x = <floating>stored_value(op.store, src, c * sc)
            dst[j * ld + c] = x
            probe += x * 0      # stays 0 unless some x is inf or NaN
        for c in range(D, ld):
            dst[j * ld + c] = 0
    return probe != 0


cdef inline int pack_v_tile(const Plan *P, floating *vp, int64_t dvp, const char *vbase,
                            int64_t t0, int64_t n) noexcept nogil:
    """Value rows t0..t0+n-1 into rows of dvp (padding columns zero); 1 when the
    tile holds an inf or NaN."""
    return pack_rows_widened(P, &P.v, vp, dvp, vbase, t0, n, P.Dv)


cdef int widen_tile(const Plan *P, const Operand *op, int scale_kind, const Operand *sc, int64_t soff,
                    floating *dst, int64_t ld, const char *base, int64_t t0, int64_t n, int64_t D) noexcept nogil:
    """Rows t0..t0+n-1 of a stored k or v of a non-native storage type widened into
    dst (rows ld >= D apart, rounded up to a vector, the compute type), with its
    int8 scales folded in: the value a kernel sees is k * k_scale.  Returns 1
    when the tile holds an inf or NaN.  The query-vectorised unit reads the
    widened tile in place."""
    cdef int64_t j, c
    cdef floating s
    cdef int nonfinite = pack_rows_widened(P, op, dst, ld, base, t0, n, D)
    if scale_kind == SCALE_PER_KEY:
        for j in range(n):
            s = <floating>key_scale_at(P, sc, soff, t0 + j)
            for c in range(D):
                dst[j * ld + c] *= s
    elif scale_kind == SCALE_PER_CHANNEL:
        for j in range(n):
            for c in range(D):
                dst[j * ld + c] *= <floating>scale_at(sc, soff, 0, c)
    return nonfinite


cdef inline bint is_quantized(const Operand *op) noexcept nogil:
    """A QuantizedKV k or v (STORE_U8Z / STORE_U4Z): read through dequant_tile."""
    return op.store == STORE_U8Z or op.store == STORE_U4Z


cdef int dequant_tile(const Plan *P, const Operand *op, const Operand *sc, const Operand *zp, int64_t G, int64_t b,
                      floating *dst, int64_t ld, int64_t t0, int64_t n, int64_t D) noexcept nogil:
    """Rows t0..t0+n-1 of a QuantizedKV k or v (op: its codes, sc / zp: its scales
    and zero points, G its group size) of batch element b dequantized into dst
    (rows ld >= D apart, padding columns zero): a tile of the workspace, read in
    place from the cache run by run (paged: row_at).  Returns 1 when the tile
    holds an inf or NaN."""
    cdef const char *base = stored_at(op, batch_offset(P, op, b))
    cdef const float *scale = (<const float *>sc.base) + batch_offset(P, sc, b)
    cdef const float *zero = (<const float *>zp.base) + batch_offset(P, zp, b)
    cdef int bits = 8 if op.store == STORE_U8Z else 4
    cdef int64_t t = t0, e
    cdef int nonfinite = 0
    while t < t0 + n:
        e = run_end(P, t, t0 + n)
        nonfinite |= dequant_rows(<const uint8_t *>(base + row_at(P, op, t) * op.item), op.sr, bits,
                                  scale + row_at(P, sc, t), sc.sr, sc.sc, zero + row_at(P, zp, t), zp.sr, zp.sc,
                                  e - t, D, G, dst + (t - t0) * ld, ld)
        t = e
    return nonfinite


cdef inline bint quantized_in_place(const Operand *op, int64_t G, floating dummy) noexcept nogil:
    """Do the few-rows readers (fa_qk_rows_qz / fa_pv_rows_qz) read this QuantizedKV
    k or v in place?  Float compute, groups of whole vectors."""
    if floating is double:
        return False
    return is_quantized(op) and G % (FA_VBYTES // sizeof(float)) == 0


cdef void qk_rows_quantized(const Plan *P, const floating *qp, int64_t nr, int64_t b, int64_t t0, int64_t n,
                            floating *s) noexcept nogil:
    """Scores s[i * BLOCK_K + j] of nr packed query rows against keys t0..t0+n-1 of a
    QuantizedKV k read in place, run by run (quantized_in_place)."""
    cdef const Operand *op = &P.k
    cdef const char *base = stored_at(op, batch_offset(P, op, b))
    cdef const float *scale = (<const float *>P.ks.base) + batch_offset(P, &P.ks, b)
    cdef const float *zero = (<const float *>P.kz.base) + batch_offset(P, &P.kz, b)
    cdef int bits = 8 if op.store == STORE_U8Z else 4
    cdef int64_t t = t0, e
    if floating is double:
        return
    else:
        while t < t0 + n:
            e = run_end(P, t, t0 + n)
            fa_qk_rows_qz_f(qp, P.Dk, nr, P.Dk, <const uint8_t *>(base + row_at(P, op, t) * op.item), op.sr, bits,
                            scale + row_at(P, &P.ks, t), P.ks.sr, P.ks.sc, zero + row_at(P, &P.kz, t), P.kz.sr,
                            P.kz.sc, P.kgroup, e - t, s + (t - t0), BLOCK_K)
            t = e


cdef void pv_rows_quantized(const Plan *P, const floating *p, int64_t nr, int64_t b, int64_t t0, int64_t a,
                            int64_t e, floating *o, int64_t dvp) noexcept nogil:
    """O += P . V over keys t0+a..t0+e-1 (probability rows BLOCK_K apart, from tile
    key t0) of a QuantizedKV v read in place, run by run (quantized_in_place)."""
    cdef const Operand *op = &P.v
    cdef const char *base = stored_at(op, batch_offset(P, op, b))
    cdef const float *scale = (<const float *>P.vs.base) + batch_offset(P, &P.vs, b)
    cdef const float *zero = (<const float *>P.vz.base) + batch_offset(P, &P.vz, b)
    cdef int bits = 8 if op.store == STORE_U8Z else 4
    cdef int64_t t = t0 + a, x
    if floating is double:
        return
    else:
        while t < t0 + e:
            x = run_end(P, t, t0 + e)
            fa_pv_rows_qz_f(p + (t - t0), BLOCK_K, nr, <const uint8_t *>(base + row_at(P, op, t) * op.item), op.sr,
                            bits, scale + row_at(P, &P.vs, t), P.vs.sr, P.vs.sc, zero + row_at(P, &P.vz, t), P.vz.sr,
                            P.vz.sc, P.vgroup, 0, x - t, o, dvp, P.Dv)
            t = x


cdef void pack_k_tile_quantized(const Plan *P, Workspace *ws, int64_t b, floating *kt, int64_t t0,
                                int64_t n) noexcept nogil:
    """pack_k_tile for a QuantizedKV k: keys t0..t0+n-1 dequantized into the
    workspace's key tile (ws.kw), then transposed into panels of Dk x NR."""
    cdef int64_t W = FA_VBYTES // sizeof(floating)
    cdef int64_t NR = FA_QK_NV * W
    cdef int64_t Dk = P.Dk, ldk = round_up(Dk if Dk > 0 else 1, W), p0, nk, j, d
    cdef floating *kw = <floating *>ws.kw
    cdef floating *panel
    cdef int64_t offs[PANEL_MAX]
    dequant_tile(P, &P.k, &P.ks, &P.kz, P.kgroup, b, kw, ldk, t0, n, Dk)
    p0 = 0
    while p0 < n:
        nk = min(NR, n - p0)
        for j in range(nk):
            offs[j] = (p0 + j) * ldk
        stored_pack_transposed(native_store(<floating>0), <const char *>kw, offs, nk, Dk, <floating>1,
                               kt + (p0 // NR) * Dk * NR, NR, 0)
        p0 += NR
    if n % NR:      # (as pack_k_tile: the columns of a partial panel the QK kernel reads)
        panel = kt + (n // NR) * Dk * NR
        nk = W if n % NR <= W else NR
        for d in range(Dk):
            for j in range(n % NR, nk):
                panel[d * NR + j] = 0


cdef inline void prefetch_tile(const Plan *P, const char *kbase, const char *vbase,
                               int64_t t0, int64_t t1) noexcept nogil:
    """Request key and value rows t0..t1-1 (rows with contiguous elements only)."""
    cdef int64_t r
    if P.k.sc == 1:
        for r in range(t0, t1):
            fa_prefetch_bytes(kbase + row_at(P, &P.k, r) * P.k.item, P.Dk * P.k.item)
    if P.v.sc == 1:
        for r in range(t0, t1):
            fa_prefetch_bytes(vbase + row_at(P, &P.v, r) * P.v.item, P.Dv * P.v.item)
