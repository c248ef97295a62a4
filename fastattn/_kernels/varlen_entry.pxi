# attention_varlen() / attention_paged(): the public entry points of packed
# variable-length batches and paged KV caches.  The argument path of
# attention() (arguments.pxi: inputs, compute and storage types, grouped heads,
# scalar options, the ALiBi table, out= checks, int8 scales), then the sequence
# tables -- cu_seqlens, block tables, seq_lens -- checked here, all before any
# work; the kernel is varlen.pxi.  Docstrings: fastattn._docstrings.

# set by fastattn._api (set_varlen_hooks): refuses masked arrays (their mask
# would be ignored), called only when an argument is not a plain ndarray
_refuse_foreign = None


def set_varlen_hooks(refuse):
    """The Python function the packed / paged entry points call out to (see fastattn._api)."""
    global _refuse_foreign
    _refuse_foreign = refuse


cdef cnp.ndarray int_table(x, str name, int ndim, str what):
    """An integer array of ndim dims as a C-contiguous int64 copy (a small table;
    the kernels index it row-major, so a Fortran-ordered or transposed table is
    reordered, not copied as it lies)."""
    cdef cnp.ndarray a = <cnp.ndarray>x if type(x) is cnp.ndarray else np.asarray(x)
    if not cnp.PyArray_ISINTEGER(a):
        raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {(<object>a).shape}")
    return np.array(a, dtype=np.int64, order="C")


cdef cnp.ndarray cu_seqlens_table(x, str name, int64_t total):
    """cu_seqlens: (S + 1,) integers starting at 0, non-decreasing, ending at total."""
    cdef cnp.ndarray cu = int_table(x, name, 1, "(S + 1,)")
    if cu.shape[0] == 0:
        raise ValueError(f"{name} must have at least one entry (0), got an empty array")
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu[0]}")
    cdef const int64_t *c = <const int64_t *>cnp.PyArray_DATA(cu)
    cdef int64_t s
    for s in range(cu.shape[0] - 1):
        if c[s + 1] < c[s]:
            raise ValueError(f"{name} must be non-decreasing, got {c[s]} then {c[s + 1]}")
    if cu[cu.shape[0] - 1] != total:
        raise ValueError(f"{name} must end at the total number of rows {total}, got {cu[cu.shape[0] - 1]}")
    return cu


cdef int check_rank(cnp.ndarray a, str name, int ndim, str what) except -1:
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {(<object>a).shape}")
    return 0


cdef int check_heads(int64_t hq, int64_t hk, int64_t hv, str qname, str kname, str vname) except -1:
    """Grouped heads: the key and value head counts agree and divide the query head count."""
    if hk != hv:
        raise ValueError(f"{kname} and {vname} must have the same number of heads, got {hk} and {hv}")
    if (hk == 0) != (hq == 0) or (hk > 0 and hq % hk):
        raise ValueError(f"the query heads of {qname} ({hq}) must be a multiple of the key/value heads of "
                         f"{kname} ({hk})")
    return 0


cdef int check_head_dims(int64_t Dk, int64_t Dv, int ctype) except -1:
    if (Dk + Dv) * (4 if ctype == cnp.NPY_FLOAT else 8) > (<int64_t>1 << 48):
        # the kernels' per-thread workspace is ~200 rows of Dk + Dv
        raise MemoryError(f"head dimensions Dk={Dk}, Dv={Dv} are too large: the attention workspace "
                          f"cannot be allocated")
    return 0


cdef cnp.ndarray first_of(cnp.ndarray a):
    """a[0], the layout of one sequence or cache block (an empty a: a zero-stride
    stand-in of its shape, never read)."""
    if a.shape[0]:
        return <cnp.ndarray>a[0]
    return np.broadcast_to(np.zeros((), dtype=a.dtype), (<object>a).shape[1:])


cdef inline int64_t elements(cnp.ndarray a, int axis):
    """a's stride along axis, in elements."""
    return a.strides[axis] // cnp.PyArray_ITEMSIZE(a) if a.shape[axis] > 1 else 0


cdef int fill_seqs(Seqs *Q, list keep, cnp.ndarray nq, cnp.ndarray nk, cnp.ndarray qo, cnp.ndarray oo,
                   cnp.ndarray lo, cnp.ndarray ko, cnp.ndarray vo) except -1:
    """The per-sequence tables (contiguous int64, kept alive in keep)."""
    keep.extend((nq, nk, qo, oo, lo, ko, vo))
    Q.S = nq.shape[0]
    Q.nq = <const int64_t *>cnp.PyArray_DATA(nq)
    Q.nk = <const int64_t *>cnp.PyArray_DATA(nk)
    Q.qo = <const int64_t *>cnp.PyArray_DATA(qo)
    Q.oo = <const int64_t *>cnp.PyArray_DATA(oo)
    Q.lo = <const int64_t *>cnp.PyArray_DATA(lo)
    Q.ko = <const int64_t *>cnp.PyArray_DATA(ko)
    Q.vo = <const int64_t *>cnp.PyArray_DATA(vo)
    Q.pages = NULL
    Q.max_blocks = 0
    Q.sinks_stride = 0
    return 0


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k=None, *, scale=None, causal=False, window=None,
                     softcap=None, alibi_slopes=None, sinks=None, return_lse=False, out=None, num_threads=None):
    cdef cnp.ndarray qa, ka, va, res, cuq, cuk, tab, lse = None, slt = None, snk = None
    cdef Plan P
    cdef Seqs Q
    cdef int ctype, otype, nbq
    cdef cnp.npy_intp dims[MAXDIM + 2]
    cdef list keep = []
    if not (type(q) is cnp.ndarray and type(k) is cnp.ndarray and type(v) is cnp.ndarray and plain(out)
            and plain(sinks)):
        refuse_qkv("attention_varlen", (("k", k), ("v", v)))
        _refuse_foreign((("q", q), ("k", k), ("v", v), ("out", out), ("sinks", sinks)))
    qa = as_input(q, "q")
    ka = as_input(k, "k")
    va = as_input(v, "v")
    check_rank(qa, "q", 3, "(Hq, total_q, Dk)")
    check_rank(ka, "k", 3, "(Hkv, total_k, Dk)")
    check_rank(va, "v", 3, "(Hkv, total_k, Dv)")
    check_qkv_shapes(qa, ka, va)
    check_heads(qa.shape[0], ka.shape[0], va.shape[0], "q", "k", "v")
    check_num_threads(num_threads)
    ctype = compute_type(qa, ka, va, &otype)
    cuq = cu_seqlens_table(cu_seqlens_q, "cu_seqlens_q", qa.shape[1])
    if cu_seqlens_k is None:
        if ka.shape[1] != qa.shape[1]:
            raise ValueError(f"cu_seqlens_k=None (self-attention) needs as many keys as queries, got "
                             f"{ka.shape[1]} keys and {qa.shape[1]} queries")
        cuk = cuq
    else:
        cuk = cu_seqlens_table(cu_seqlens_k, "cu_seqlens_k", ka.shape[1])
    if cuk.shape[0] != cuq.shape[0]:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must count the same sequences, got "
                         f"{cuq.shape[0] - 1} and {cuk.shape[0] - 1}")
    P.Lq = qa.shape[1]
    P.Lk = ka.shape[1]
    P.Dk = qa.shape[2]
    P.Dv = va.shape[2]
    check_head_dims(P.Dk, P.Dv, ctype)
    batch_layout(&P, qa, ka, va, dims, &nbq)
    parse_scalar_options(&P, scale, causal, window, softcap)
    if alibi_slopes is not None:
        slt = batch_table(as_input(alibi_slopes, "alibi_slopes"), "alibi_slopes", dims, nbq, ctype)
    if sinks is not None:
        snk = sinks_table(sinks, dims, nbq)
    dims[1] = P.Lq
    dims[2] = P.Dv
    if out is not None:
        check_out(out, 3, dims, otype, (("q", qa), ("k", ka), ("v", va)), "out")
    if out is not None and otype == ctype and behaved_array(<cnp.ndarray>out):
        res = <cnp.ndarray>out
    else:
        res = cnp.PyArray_EMPTY(3, dims, ctype, 0)
    if return_lse:
        lse = cnp.PyArray_EMPTY(2, dims, ctype, 0)
    # (the converted arrays must outlive the plan, which holds their data pointers)
    if cnp.PyArray_TYPE(qa) != ctype or not behaved_array(qa):
        qa = stored_operand(qa, ctype, False)
    if cnp.PyArray_TYPE(ka) != ctype or not behaved_array(ka):
        ka = stored_operand(ka, ctype, True)
    if cnp.PyArray_TYPE(va) != ctype or not behaved_array(va):
        va = stored_operand(va, ctype, True)
    plan_init(&P, qa, ka, va, res)
    plan_options(&P, None, None, None, slt, None, lse)
    if snk is not None:
        P.sinks = <const double *>cnp.PyArray_DATA(snk)
    tab = seq_table(cuq.shape[0] - 1)
    seq_fill(tab, SEQ_NQ, cuq, 0, 0, 1)
    seq_fill(tab, SEQ_NK, cuk, 0, 0, 1)
    seq_fill(tab, SEQ_QO, cuq, 0, P.q.sr, 0)
    seq_fill(tab, SEQ_OO, cuq, 0, P.o.sr, 0)
    seq_fill(tab, SEQ_LO, cuq, 0, P.lse.sr if lse is not None else 0, 0)
    seq_fill(tab, SEQ_KO, cuk, 0, P.k.sr, 0)
    seq_fill(tab, SEQ_VO, cuk, 0, P.v.sr, 0)
    fill_seq_table(&Q, keep, tab, None)
    varlen_execute(&P, &Q, ctype, num_threads)
    if out is None and otype == ctype and lse is None:
        return res
    return finish_outputs(out, res, None, lse, ctype, otype)


cdef object paged_scale(x, str name, cnp.ndarray cache, str cname, int *kind):
    """k_scale / v_scale of a paged cache (parse_kv_scale against the whole
    cache), broadcast to the cache's per-key (num_blocks, Hkv, block_size, 1) or
    per-channel (num_blocks, Hkv, 1, D) shape; a per-channel scale must be the
    same for every block (the kernels fold it into the queries once)."""
    a = parse_kv_scale(x, name, cache, cname, kind)
    if a is None:
        return None
    shape = (<object>cache).shape
    target = shape[:3] + (1,) if kind[0] == SCALE_PER_KEY else shape[:2] + (1, shape[3])
    b = np.broadcast_to(a, target)
    if kind[0] == SCALE_PER_CHANNEL and shape[0] > 1 and b.strides[0] != 0:
        raise ValueError(f"{name}: a per-channel scale of a paged {cname} must be the same for every block "
                         f"(shape (Hkv, 1, D) or (1, Hkv, 1, D)), got shape {(<object>a).shape}")
    return a


cdef int plan_paged_scale(Plan *P, Operand *op, scale, cnp.ndarray cache, int kind, list keep) except -1:
    """A k_scale / v_scale as an operand of the plan: float32, broadcast to the
    cache's per-key or per-channel shape, the layout of one block and the
    stride between blocks (row_at)."""
    shape = (<object>cache).shape
    b = np.broadcast_to(scale_table(scale), shape[:3] + (1,) if kind == SCALE_PER_KEY else shape[:2] + (1, shape[3]))
    keep.append(b)
    plan_scale(P, op, first_of(b), kind)
    op.sp = elements(b, 0)
    return 0


cdef int plan_paged_quantized(Plan *P, Operand *op, Operand *sc, Operand *zp, int64_t *group, x) except -1:
    """A QuantizedKV cache (num_blocks, Hkv, block_size, D) as operands of the
    plan: one block's layout of its codes, scales and zero points, and the
    stride between blocks of each (row_at)."""
    cdef cnp.ndarray data = x.data, scale = x.scale, zero = x.zero
    plan_quantized(P, op, sc, zp, group, x, first_of(data), first_of(scale), first_of(zero))
    op.sp = elements(data, 0)
    sc.sp = elements(scale, 0)
    zp.sp = elements(zero, 0)
    return 0


cdef int check_block_table(cnp.ndarray table, cnp.ndarray lens, cnp.ndarray nq, int64_t num_blocks,
                           int64_t bs) except -1:
    """seq_lens in [the sequence's query rows, max_blocks * block_size]; the
    block-table entries each sequence uses (those of its seq_lens keys) in
    [0, num_blocks).  All three C-contiguous int64 (int_table, seq_table); loops,
    not NumPy calls: a decode step's fixed cost."""
    cdef int64_t S = table.shape[0], mb = table.shape[1], cap = mb * bs, s, j, used
    cdef const int64_t *t = <const int64_t *>cnp.PyArray_DATA(table)
    cdef const int64_t *L = <const int64_t *>cnp.PyArray_DATA(lens)
    cdef const int64_t *N = <const int64_t *>cnp.PyArray_DATA(nq)
    for s in range(S):
        if L[s] < N[s] or L[s] > cap:
            raise ValueError(f"seq_lens[{s}] = {L[s]} must lie in [{N[s]}, {cap}] (the sequence's query rows, "
                             f"max_blocks * block_size)")
    for s in range(S):
        used = (L[s] + bs - 1) // bs
        for j in range(used):
            if t[s * mb + j] < 0 or t[s * mb + j] >= num_blocks:
                raise ValueError(f"block_table[{s}, {j}] = {t[s * mb + j]} is outside [0, num_blocks={num_blocks}) "
                                 f"(sequence {s} uses its first {used} entries)")
    return 0


cdef enum:
    # rows of a sequence table (seq_table): what fill_seqs hands the kernel
    SEQ_NQ, SEQ_NK, SEQ_QO, SEQ_OO, SEQ_LO, SEQ_KO, SEQ_VO, SEQ_ROWS


cdef cnp.ndarray seq_table(int64_t S):
    """(SEQ_ROWS, S) int64 zeros: each sequence's query and key counts and the
    element offsets of its q, output, lse, k and v rows, filled by the loops
    below (not NumPy calls: a decode step's fixed cost)."""
    cdef cnp.npy_intp dims[2]
    dims[0] = SEQ_ROWS
    dims[1] = S
    return cnp.PyArray_ZEROS(2, dims, cnp.NPY_INT64, 0)


cdef void seq_fill(cnp.ndarray r, int row, cnp.ndarray cu, int64_t n, int64_t stride, int lengths):
    """Row row of a seq_table: with lengths, cu[s + 1] - cu[s] (cu None: n);
    else the start of sequence s times stride, cu[s] * stride (cu None: s * stride)."""
    cdef int64_t S = r.shape[1], s
    cdef int64_t *x = <int64_t *>cnp.PyArray_DATA(r) + row * S
    cdef const int64_t *c = <const int64_t *>cnp.PyArray_DATA(cu) if cu is not None else NULL
    for s in range(S):
        if lengths:
            x[s] = c[s + 1] - c[s] if c != NULL else n
        else:
            x[s] = (c[s] if c != NULL else s) * stride


cdef int fill_seq_table(Seqs *Q, list keep, cnp.ndarray r, cnp.ndarray nk) except -1:
    """fill_seqs from a seq_table's rows (nk: the key counts, None: its own row)."""
    return fill_seqs(Q, keep, <cnp.ndarray>r[SEQ_NQ], <cnp.ndarray>r[SEQ_NK] if nk is None else nk,
                     <cnp.ndarray>r[SEQ_QO], <cnp.ndarray>r[SEQ_OO], <cnp.ndarray>r[SEQ_LO],
                     <cnp.ndarray>r[SEQ_KO], <cnp.ndarray>r[SEQ_VO])


def attention_paged(q, k_cache, v_cache, block_table, seq_lens, *, cu_seqlens_q=None, scale=None, causal=False,
                    window=None, softcap=None, alibi_slopes=None, k_scale=None, v_scale=None, sinks=None,
                    return_lse=False, out=None, num_threads=None):
    cdef cnp.ndarray qa, ka, va, res, table, lens, nq, cuq = None, lse = None, slt = None, tab, snk = None
    cdef cnp.ndarray q1, k1, v1, o1, l1
    cdef Plan P
    cdef Seqs Q
    cdef int ctype, otype, nbq, kkind = SCALE_NONE, vkind = SCALE_NONE, packed = cu_seqlens_q is not None
    cdef int64_t S, bs, num_blocks, sink_stride = 0
    cdef cnp.npy_intp dims[MAXDIM + 2]
    cdef cnp.npy_intp sdims[2]
    cdef list keep = []
    cdef object kq = None, vq = None
    if type(k_cache) is not cnp.ndarray and is_qkv(k_cache):
        kq = k_cache
        k_cache = qkv_stand_in(k_cache, "k_cache")
    if type(v_cache) is not cnp.ndarray and is_qkv(v_cache):
        vq = v_cache
        v_cache = qkv_stand_in(v_cache, "v_cache")
    if not (type(q) is cnp.ndarray and type(k_cache) is cnp.ndarray and type(v_cache) is cnp.ndarray
            and plain(out) and plain(k_scale) and plain(v_scale) and plain(sinks)):
        _refuse_foreign((("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out),
                         ("k_scale", k_scale), ("v_scale", v_scale), ("sinks", sinks)))
    qa = as_input(q, "q")
    ka = as_input(k_cache, "k_cache")
    va = as_input(v_cache, "v_cache")
    check_rank(ka, "k_cache", 4, "(num_blocks, Hkv, block_size, Dk)")
    check_rank(va, "v_cache", 4, "(num_blocks, Hkv, block_size, Dv)")
    if ka.shape[0] != va.shape[0] or ka.shape[1] != va.shape[1] or ka.shape[2] != va.shape[2]:
        raise ValueError(f"k_cache and v_cache must have the same (num_blocks, Hkv, block_size), got "
                         f"{(<object>ka).shape[:3]} and {(<object>va).shape[:3]}")
    num_blocks = ka.shape[0]
    bs = ka.shape[2]
    if bs < 1:
        raise ValueError(f"block_size (axis 2 of k_cache) must be >= 1, got {bs}")
    if packed:
        check_rank(qa, "q", 3, "(Hq, total_q, Dk) with cu_seqlens_q")
    else:
        check_rank(qa, "q", 4, "(S, Hq, Lq, Dk) without cu_seqlens_q")
    if qa.shape[qa.ndim - 1] != ka.shape[3]:
        raise ValueError(f"q and k_cache must have the same head dimension Dk: q {(<object>qa).shape}, "
                         f"k_cache {(<object>ka).shape}")
    check_heads(qa.shape[qa.ndim - 3], ka.shape[1], va.shape[1], "q", "k_cache", "v_cache")
    check_num_threads(num_threads)
    ctype = compute_type(qa, ka, va, &otype)
    if packed:
        cuq = cu_seqlens_table(cu_seqlens_q, "cu_seqlens_q", qa.shape[1])
        S = cuq.shape[0] - 1
    else:
        S = qa.shape[0]
    tab = seq_table(S)
    seq_fill(tab, SEQ_NQ, cuq, qa.shape[2] if not packed else 0, 0, 1)
    nq = <cnp.ndarray>tab[SEQ_NQ]
    table = int_table(block_table, "block_table", 2, "(S, max_blocks)")
    lens = int_table(seq_lens, "seq_lens", 1, "(S,)")
    if table.shape[0] != S or lens.shape[0] != S:
        raise ValueError(f"q has {S} sequences, block_table {table.shape[0]} and seq_lens {lens.shape[0]}: "
                         f"they must agree")
    check_block_table(table, lens, nq, num_blocks, bs)
    check_qkv_scales(kq, vq, k_scale, v_scale, "k_cache", "v_cache")
    if k_scale is not None or v_scale is not None:
        k_scale = paged_scale(k_scale, "k_scale", ka, "k_cache", &kkind)
        v_scale = paged_scale(v_scale, "v_scale", va, "v_cache", &vkind)
        ka = scaled_kv(ka, k_scale, ctype, &kkind)
        va = scaled_kv(va, v_scale, ctype, &vkind)
        if num_blocks == 0:
            kkind = vkind = SCALE_NONE      # (no key is ever read)
    P.Lq = qa.shape[qa.ndim - 2]
    P.Lk = bs
    P.Dk = qa.shape[qa.ndim - 1]
    P.Dv = va.shape[3]
    check_head_dims(P.Dk, P.Dv, ctype)
    q1 = qa if packed else first_of(qa)
    batch_layout(&P, q1, first_of(ka), first_of(va), dims, &nbq)
    parse_scalar_options(&P, scale, causal, window, softcap)
    if alibi_slopes is not None:
        slt = batch_table(as_input(alibi_slopes, "alibi_slopes"), "alibi_slopes", dims, nbq, ctype)
    if sinks is not None and not packed:
        # the query batch dims (S, Hq): one table row per sequence (seq_view)
        sdims[0] = S
        sdims[1] = qa.shape[1]
        snk = sinks_table(sinks, sdims, 2)
        sink_stride = qa.shape[1]
    elif sinks is not None:
        snk = sinks_table(sinks, dims, nbq)
    odims = (<object>qa).shape[:qa.ndim - 1] + (P.Dv,)
    for d in range(qa.ndim):
        dims[d] = odims[d]
    if out is not None:
        check_out(out, qa.ndim, dims, otype, (("q", qa), ("k_cache", ka), ("v_cache", va)), "out")
    if out is not None and otype == ctype and behaved_array(<cnp.ndarray>out):
        res = <cnp.ndarray>out
    else:
        res = cnp.PyArray_EMPTY(qa.ndim, dims, ctype, 0)
    if return_lse:
        lse = cnp.PyArray_EMPTY(qa.ndim - 1, dims, ctype, 0)
    if cnp.PyArray_TYPE(qa) != ctype or not behaved_array(qa):
        qa = stored_operand(qa, ctype, False)
    if kq is None and (cnp.PyArray_TYPE(ka) != ctype or not behaved_array(ka)):
        ka = stored_operand(ka, ctype, True)
    if vq is None and (cnp.PyArray_TYPE(va) != ctype or not behaved_array(va)):
        va = stored_operand(va, ctype, True)
    # the plan of one sequence (q's rows, the caches' heads and slots), the rest per sequence and block
    q1 = qa if packed else first_of(qa)
    k1 = first_of(ka)
    v1 = first_of(va)
    o1 = res if packed else first_of(res)
    l1 = lse if packed or lse is None else first_of(lse)
    plan_init(&P, q1, k1, v1, o1)
    plan_options(&P, None, None, None, slt, None, l1)
    if snk is not None:
        P.sinks = <const double *>cnp.PyArray_DATA(snk)
    P.k.sp = elements(ka, 0)
    P.v.sp = elements(va, 0)
    if kq is not None:
        plan_paged_quantized(&P, &P.k, &P.ks, &P.kz, &P.kgroup, kq)
        P.kscale = SCALE_GROUPED
    if vq is not None:
        plan_paged_quantized(&P, &P.v, &P.vs, &P.vz, &P.vgroup, vq)
        P.vscale = SCALE_GROUPED
    P.pages = <const int64_t *>cnp.PyArray_DATA(table)
    P.page = bs
    if kkind != SCALE_NONE:
        plan_paged_scale(&P, &P.ks, k_scale, ka, kkind, keep)
        P.kscale = kkind
    if vkind != SCALE_NONE:
        plan_paged_scale(&P, &P.vs, v_scale, va, vkind, keep)
        P.vscale = vkind
    # the sequences' q, output and lse rows (packed: from cu_seqlens_q); keys by the block table
    seq_fill(tab, SEQ_QO, cuq, 0, P.q.sr if packed else elements(qa, 0), 0)
    seq_fill(tab, SEQ_OO, cuq, 0, P.o.sr if packed else elements(res, 0), 0)
    seq_fill(tab, SEQ_LO, cuq, 0, 0 if lse is None else P.lse.sr if packed else elements(lse, 0), 0)
    fill_seq_table(&Q, keep, tab, lens)
    Q.pages = <const int64_t *>cnp.PyArray_DATA(table)
    Q.max_blocks = table.shape[1]
    Q.sinks_stride = sink_stride
    varlen_execute(&P, &Q, ctype, num_threads)
    if out is None and otype == ctype and lse is None:
        return res
    return finish_outputs(out, res, None, lse, ctype, otype)
