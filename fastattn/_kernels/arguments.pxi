# The argument path: every option of attention() parsed and checked once, the
# inputs turned into arrays the kernels read in place, the plan filled.  Each
# step takes the usual spelling first (an aligned ndarray of the compute dtype,
# a float, an int, a bool) and falls back to the general rule -- array-likes,
# conversions, broadcasting -- in the same function, so a rule and its error
# message exist once.  Used by attention() (attention_entry.pxi); the error
# texts name the argument.

import math
import numbers
import operator

# set by fastattn._api (set_call_hooks): the thread count of a call
# (fastattn._threads), the check of an explicit num_threads, and the handlers of
# arguments that are not NumPy arrays (torch tensors, lazy arrays, masked arrays)
_thread_resolver = None
_check_num_threads = None
_foreign_attention = None
_foreign_softmax = None
# softmax / log_softmax into a caller's out= of at least this many bytes write it
# by streaming stores (0: never); set by fastattn._api from the size of the
# last-level cache (fastattn._memory)
_stream_min_bytes = 0


def set_stream_min_bytes(nbytes):
    """Outputs (out=) of softmax / log_softmax of at least nbytes are written by
    streaming stores; 0 turns them off.  Returns the previous value."""
    global _stream_min_bytes
    prev = _stream_min_bytes
    _stream_min_bytes = max(0, int(nbytes))
    return prev


def set_prefetch_wide(on):
    """Software prefetch of the float32 / float64 key and value rows that the
    one-row decode loops read in place (simd.h's fa_pf_wide): on when on is
    true.  Results never depend on it.  Returns the previous setting."""
    global fa_pf_wide
    prev = bool(fa_pf_wide)
    fa_pf_wide = 1 if on else 0
    return prev


def set_prefetch_l2(on):
    """Where the software prefetch hints of the streaming loops put their lines
    (simd.h's fa_pf_l2): into L2 when on is true, else into L1.  Results never
    depend on it.  Returns the previous setting."""
    global fa_pf_l2
    prev = bool(fa_pf_l2)
    fa_pf_l2 = 1 if on else 0
    return prev


def set_call_hooks(resolver, checker, foreign_attention, foreign_softmax):
    """The Python functions the argument path calls out to (see fastattn._api)."""
    global _thread_resolver, _check_num_threads, _foreign_attention, _foreign_softmax
    _thread_resolver = resolver
    _check_num_threads = checker
    _foreign_attention = foreign_attention
    _foreign_softmax = foreign_softmax


cdef inline bint plain(x) noexcept:
    """None or an ndarray itself: an argument no foreign-type handler needs to see."""
    return x is None or type(x) is cnp.ndarray


cdef inline bint behaved_array(cnp.ndarray a) noexcept:
    """Aligned, native byte order, strides multiples of the item size."""
    cdef int d
    cdef cnp.npy_intp item = cnp.PyArray_ITEMSIZE(a), bits = 0
    if not cnp.PyArray_ISBEHAVED_RO(a):
        return False
    if item & (item - 1):
        for d in range(a.ndim):
            if a.strides[d] % item:
                return False
        return True
    for d in range(a.ndim):
        bits |= a.strides[d]
    return (bits & (item - 1)) == 0


cdef cnp.ndarray as_input(x, str name):
    """x as an ndarray of a real numeric or boolean dtype (bfloat16, float8_e4m3fn
    and float8_e5m2 included: the ml_dtypes dtypes, recognised by the dtype itself): itself when it is an
    ndarray, else np.asarray(x).  TypeError for complex and other dtypes."""
    cdef cnp.ndarray a = <cnp.ndarray>x if type(x) is cnp.ndarray else np.asarray(x)
    cdef int t = cnp.PyArray_TYPE(a)
    if t == cnp.NPY_FLOAT or t == cnp.NPY_DOUBLE or t == cnp.NPY_FLOAT16 or store_of(a) >= STORE_BF16:
        return a
    kind = a.dtype.kind
    if kind not in "fiub":
        if kind == "c":
            raise TypeError(f"{name}: complex arrays are not supported (dtype {a.dtype})")
        raise TypeError(f"{name}: expected a real numeric array, got dtype {a.dtype}")
    return a


cdef int compute_type(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, int *out_type) except -1:
    """The compute type of q, k, v (NPY_FLOAT or NPY_DOUBLE) and, in out_type, the
    output type: promoted like np.result_type; float16 computes in float32 and
    returns float16; float8 alone computes and returns float32; everything else
    that is not float32 computes in float64."""
    cdef int t = cnp.PyArray_TYPE(q)
    if t == cnp.PyArray_TYPE(k) and t == cnp.PyArray_TYPE(v) and (t == cnp.NPY_FLOAT or t == cnp.NPY_DOUBLE):
        out_type[0] = t
        return t
    rt = np.result_type(q, k, v)
    if rt == np.float32:
        out_type[0] = cnp.NPY_FLOAT
        return cnp.NPY_FLOAT
    if rt == np.float16 or rt.name == "bfloat16":
        out_type[0] = rt.num
        return cnp.NPY_FLOAT
    if rt.itemsize == 1 and rt.name in ("float8_e4m3fn", "float8_e5m2"):
        # float8 everywhere: computed and returned in float32 (a float8 result would
        # keep 2-3 bits)
        out_type[0] = cnp.NPY_FLOAT
        return cnp.NPY_FLOAT
    out_type[0] = cnp.NPY_DOUBLE
    return cnp.NPY_DOUBLE


cdef cnp.ndarray stored_operand(cnp.ndarray a, int ctype, bint allow_int8):
    """a as the kernels read it: in place when its storage type is one they read
    for the compute type ctype -- float32 compute: float32, float16, bfloat16
    (and int8, float8_e4m3fn, float8_e5m2, for k and v: allow_int8); float64
    compute: float64 -- and it is behaved (aligned, native byte order); else
    converted to ctype (a copy)."""
    cdef int st
    if cnp.PyArray_TYPE(a) == ctype and behaved_array(a):
        return a
    if ctype == cnp.NPY_FLOAT:
        st = store_of(a)
        if (st == STORE_F16 or st == STORE_BF16 or (allow_int8 and (st == STORE_I8 or st == STORE_F8E4
                                                                    or st == STORE_F8E5))) and behaved_array(a):
            return a
    return to_compute(a, ctype)


cdef cnp.ndarray to_compute(cnp.ndarray a, int typenum):
    """a in the compute type, native byte order, aligned and with item-multiple
    strides: a itself when it is (any other strides are fine), else a copy."""
    if cnp.PyArray_TYPE(a) == typenum and behaved_array(a):
        return a
    return np.array(a, dtype=np.float32 if typenum == cnp.NPY_FLOAT else np.float64)


cdef object dtype_of(int typenum):
    return cnp.PyArray_DescrFromType(typenum)


# ---------------------------------------------------------------- scalar options

cdef double real_option(value, str name) except? -1:
    """A real scalar: a Python or NumPy real number, or a 0-d real array (the
    reference's rule too); bools, complex, strings and arrays of ndim >= 1 are
    not.  Finite."""
    cdef double v
    if type(value) is float:
        v = value
    else:
        if isinstance(value, cnp.ndarray) and (<cnp.ndarray>value).ndim == 0:
            value = value[()]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {value!r}")
        v = float(value)
    if not isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


cdef int causal_code(causal) except -1:
    """causal= as CAUSAL_NONE / CAUSAL_TOP_LEFT / CAUSAL_BOTTOM_RIGHT."""
    if causal is False or causal is None:
        return CAUSAL_NONE
    if causal is True:
        return CAUSAL_TOP_LEFT
    if type(causal) is str:
        if causal == "bottom_right":
            return CAUSAL_BOTTOM_RIGHT
        if causal == "top_left":
            return CAUSAL_TOP_LEFT
    if isinstance(causal, np.bool_):
        return CAUSAL_TOP_LEFT if causal else CAUSAL_NONE
    if isinstance(causal, str):
        if causal == "top_left":
            return CAUSAL_TOP_LEFT
        if causal == "bottom_right":
            return CAUSAL_BOTTOM_RIGHT
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")
    raise TypeError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")


cdef int64_t window_side(w, str which) except -2:
    """One side of window=: None (-1, unbounded) or an int >= 0 (not a bool)."""
    if w is None:
        return -1
    if type(w) is int and 0 <= w <= 0x3fffffffffffffff:
        return w
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Integral):
        raise TypeError(f"window: {which} side must be an int or None, got {w!r}")
    w = operator.index(w)
    if w < 0:
        raise ValueError(f"window: {which} side must be >= 0, got {w}")
    return min(w, 0x3fffffffffffffff)


cdef int parse_window(window, int64_t *wl, int64_t *wr) except -1:
    """window= as its (left, right) sides, -1 for an unbounded side."""
    if window is None:
        wl[0] = wr[0] = -1
    elif type(window) is tuple or type(window) is list:
        if len(window) != 2:
            raise TypeError(f"window must be an int or a (left, right) pair, got {window!r}")
        wl[0] = window_side(window[0], "left")
        wr[0] = window_side(window[1], "right")
    else:
        wl[0] = wr[0] = window_side(window, "both")
    return 0


cdef int align_code(align) except -1:
    """align= as 0 ("top_left", the default: p(i) = i) or 1 ("bottom_right")."""
    if align is None or (type(align) is str and align == "top_left"):
        return 0
    if type(align) is str and align == "bottom_right":
        return 1
    if isinstance(align, str):
        raise ValueError(f"align must be 'top_left' or 'bottom_right', got {align!r}")
    raise TypeError(f"align must be 'top_left' or 'bottom_right', got {align!r}")


cdef inline int parse_scalar_options(Plan *P, scale, causal, window, softcap, align=None) except -1:
    """causal, align, window, scale and softcap into the plan (P.Dk set).
    causal="bottom_right" implies the bottom-right alignment; causal=True with
    align="bottom_right" is causal="bottom_right"."""
    P.causal = causal_code(causal)
    P.align = 1 if P.causal == CAUSAL_BOTTOM_RIGHT else align_code(align)
    if P.align and P.causal == CAUSAL_TOP_LEFT:
        P.causal = CAUSAL_BOTTOM_RIGHT
    parse_window(window, &P.wl, &P.wr)
    if scale is None:
        P.scale = 1.0 / sqrt(<double>P.Dk) if P.Dk > 0 else 1.0
    else:
        P.scale = real_option(scale, "scale")
    P.softcap = 0.0
    if softcap is not None:
        P.softcap = real_option(softcap, "softcap")
        if P.softcap <= 0:
            raise ValueError(f"softcap must be > 0, got {P.softcap}")
    return 0


cdef int check_num_threads(num_threads) except -1:
    """An explicit num_threads must be a positive int (the count itself is asked
    for by plan_run, only for problems large enough for threads)."""
    if num_threads is not None and not (type(num_threads) is int and 1 <= num_threads <= 0x7fffffff):
        _check_num_threads(num_threads)
    return 0


# ---------------------------------------------------------------- batch dims

cdef int broadcast_into(cnp.npy_intp *out, int nout, const cnp.npy_intp *s, int ns) noexcept:
    """Broadcast shape s (ns dims) into out (nout >= ns dims, right-aligned, 1 where
    unset); 0, or -1 where they do not broadcast."""
    cdef int d, o
    for d in range(ns):
        o = nout - ns + d
        if s[d] != out[o]:
            if out[o] == 1:
                out[o] = s[d]
            elif s[d] != 1:
                return -1
    return 0


cdef str shape_text(cnp.ndarray a, int ndrop):
    return str((<object>a).shape[:a.ndim - ndrop])


cdef bint batch_layout_same_rank(Plan *P, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.npy_intp *bq) noexcept:
    """batch_layout's usual case, without broadcasting arithmetic: q, k, v of one
    rank, k and v with the same batch dims, each equal to q's or 1 (shared), the
    head axis (-3) of k dividing q's (grouped heads).  False for anything else."""
    cdef int nb = q.ndim - 2, d
    cdef int64_t g = 1
    for d in range(nb):
        if k.shape[d] != v.shape[d]:
            return False
        if k.shape[d] != q.shape[d]:
            if d == nb - 1 and 0 < k.shape[d] < q.shape[d] and q.shape[d] % k.shape[d] == 0:
                g = q.shape[d] // k.shape[d]
            elif k.shape[d] != 1:
                return False
    for d in range(nb):
        P.bshape[d] = q.shape[d]
        bq[d] = q.shape[d]
    if g > 1:
        P.bshape[nb - 1] = k.shape[nb - 1]
    P.nb = nb
    P.g = g
    return True


cdef int batch_layout(Plan *P, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v,
                      cnp.npy_intp *bq, int *nbq) except -1:
    """The broadcast batch dims of q, k, v.  Grouped heads (torch enable_gqa): when
    the head axis (-3) of q is g > 1 times that of k and v (which share a head
    count; one key/value head included: multi-query), the g query heads of a
    group are folded into the rows of one batch element, so each key and value
    is read once for its group.  Sets P.nb / P.bshape (the key/value heads) and
    P.g; bq / nbq: the batch dims over q's heads (the output's)."""
    cdef int nq = q.ndim - 2, nk = k.ndim - 2, nv = v.ndim - 2, nb, d
    cdef cnp.npy_intp kv[MAXDIM]
    cdef int64_t g = 1
    if nq == nk and nq == nv and nq <= MAXDIM and batch_layout_same_rank(P, q, k, v, bq):
        nbq[0] = nq
        return 0
    nb = max(nq, max(nk, nv))
    if nb > MAXDIM:
        raise ValueError("too many batch dimensions")
    # k and v first (they share the head count that grouping needs)
    for d in range(nb):
        kv[d] = 1
    if broadcast_into(kv, max(nk, nv), k.shape, nk) or broadcast_into(kv, max(nk, nv), v.shape, nv):
        raise ValueError(f"batch dimensions do not broadcast: k {shape_text(k, 2)}, v {shape_text(v, 2)}")
    if (nq >= 1 and nk >= 1 and nv >= 1 and k.shape[nk - 1] == v.shape[nv - 1]
            and 0 < kv[max(nk, nv) - 1] < q.shape[nq - 1] and q.shape[nq - 1] % kv[max(nk, nv) - 1] == 0):
        g = q.shape[nq - 1] // kv[max(nk, nv) - 1]
    for d in range(nb):
        P.bshape[d] = 1
        bq[d] = 1
    if g > 1:
        # q's batch dims with the key/value head count on the head axis
        for d in range(nq):
            bq[nb - nq + d] = q.shape[d]
        bq[nb - 1] = kv[max(nk, nv) - 1]
        if broadcast_into(bq, nb, k.shape, nk) or broadcast_into(bq, nb, v.shape, nv):
            grouped = (<object>q).shape[:nq - 1] + (kv[max(nk, nv) - 1],)
            raise ValueError(f"batch dimensions do not broadcast: q (heads grouped) {grouped}, "
                             f"k {shape_text(k, 2)}, v {shape_text(v, 2)}")
        for d in range(nb):
            P.bshape[d] = bq[d]
        bq[nb - 1] = q.shape[nq - 1]
    else:
        if (broadcast_into(bq, nb, q.shape, nq) or broadcast_into(bq, nb, k.shape, nk)
                or broadcast_into(bq, nb, v.shape, nv)):
            raise ValueError(f"batch dimensions do not broadcast: q {shape_text(q, 2)}, "
                             f"k {shape_text(k, 2)}, v {shape_text(v, 2)}")
        for d in range(nb):
            P.bshape[d] = bq[d]
    P.nb = nb
    P.g = g
    nbq[0] = nb
    return 0


# ---------------------------------------------------------------- array options

cdef bint fits(cnp.ndarray x, const cnp.npy_intp *shape, int nd) noexcept:
    """x broadcasts to shape (nd dims) without changing it: at most nd dims, each
    (right-aligned) 1 or equal."""
    cdef int d, off = nd - x.ndim
    if off < 0:
        return False
    for d in range(x.ndim):
        if x.shape[d] != 1 and x.shape[d] != shape[off + d]:
            return False
    return True


cdef cnp.ndarray score_operand(x, str name, const cnp.npy_intp *bq, int nbq, int64_t Lq, int64_t Lk,
                               int typenum):
    """mask (typenum NPY_BOOL) or bias (typenum: the compute type) as an array with
    at least 2 dims that broadcasts to the score shape bq + (Lq, Lk); a 1-D one
    (per key: a padding mask) is its (1, Lk) view.  The bias is read in place when
    it has the compute type, else converted."""
    cdef cnp.npy_intp full[MAXDIM + 2]
    cdef cnp.ndarray a
    cdef int d
    if typenum == cnp.NPY_BOOL:
        a = <cnp.ndarray>x if type(x) is cnp.ndarray else np.asarray(x)
        if cnp.PyArray_TYPE(a) != cnp.NPY_BOOL:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {a.dtype}")
    else:
        a = as_input(x, name)
    for d in range(nbq):
        full[d] = bq[d]
    full[nbq] = Lq
    full[nbq + 1] = Lk
    if not fits(a, full, nbq + 2):
        raise ValueError(f"{name} with shape {(<object>a).shape} does not broadcast to the score shape "
                         f"{tuple(full[d] for d in range(nbq + 2))}")
    if a.ndim < 2:
        a = a.reshape((1,) * (2 - a.ndim) + (<object>a).shape)
    if typenum != cnp.NPY_BOOL:
        a = stored_operand(a, typenum, False)
    return a


cdef cnp.ndarray batch_table(x, str name, const cnp.npy_intp *bq, int nbq, int typenum):
    """A per-(batch, query head) option (kv_lengths: typenum NPY_INT64; alibi_slopes:
    the compute type) as the contiguous table the kernels read, one entry per
    batch element of the output in C order; x must broadcast to the batch dims
    bq.  int32/int64 and float32/float64 sources are read in place, others
    converted first (as numpy's assignment would)."""
    cdef cnp.ndarray a = <cnp.ndarray>x if type(x) is cnp.ndarray else np.asarray(x)
    cdef cnp.npy_intp n = 1, i
    cdef cnp.npy_intp cnt[MAXDIM]
    cdef cnp.npy_intp st[MAXDIM]
    cdef int d, off, xt
    cdef const char *p
    cdef char *tab
    cdef cnp.ndarray t
    if not fits(a, bq, nbq):
        raise ValueError(f"{name} with shape {(<object>a).shape} does not broadcast to the "
                         f"batch dimensions {tuple(bq[d] for d in range(nbq))}")
    xt = cnp.PyArray_TYPE(a)
    if typenum == cnp.NPY_INT64:
        if (xt != cnp.NPY_INT64 and xt != cnp.NPY_INT32) or not behaved_array(a):
            a = a.astype(np.int64)
    elif (xt != cnp.NPY_FLOAT and xt != cnp.NPY_DOUBLE) or not behaved_array(a):
        a = a.astype(np.float64)
    xt = cnp.PyArray_TYPE(a)
    off = nbq - a.ndim
    for d in range(nbq):
        n *= bq[d]
        cnt[d] = 0
        st[d] = a.strides[d - off] if d >= off and a.shape[d - off] != 1 else 0
    t = cnp.PyArray_EMPTY(1, &n, typenum, 0)
    tab = <char *>cnp.PyArray_DATA(t)
    p = <const char *>cnp.PyArray_DATA(a)
    for i in range(n):
        if typenum == cnp.NPY_INT64:
            (<int64_t *>tab)[i] = (<const int64_t *>p)[0] if xt == cnp.NPY_INT64 else (<const int32_t *>p)[0]
        elif typenum == cnp.NPY_FLOAT:
            (<float *>tab)[i] = <float>((<const double *>p)[0] if xt == cnp.NPY_DOUBLE else (<const float *>p)[0])
        else:
            (<double *>tab)[i] = (<const double *>p)[0] if xt == cnp.NPY_DOUBLE else (<const float *>p)[0]
        # next multi-index over the batch dims (the last one fastest)
        d = nbq - 1
        while d >= 0:
            cnt[d] += 1
            p += st[d]
            if cnt[d] < bq[d]:
                break
            p -= st[d] * cnt[d]
            cnt[d] = 0
            d -= 1
    return t


cdef cnp.ndarray sinks_table(sinks, const cnp.npy_intp *bq, int nbq):
    """Attention sinks as the float64 (nbatch * g) table the row finishes read
    (sinks.pxi): a real array broadcastable to the query batch dims (one sink
    per query head under grouped heads).  TypeError for a boolean, complex or
    other dtype, ValueError (naming sinks) when it does not broadcast."""
    cdef cnp.ndarray a = as_input(sinks, "sinks")
    if a.dtype.kind == "b":
        raise TypeError(f"sinks must be a real (float) array, got dtype {a.dtype}")
    return batch_table(a, "sinks", bq, nbq, cnp.NPY_DOUBLE)


cdef cnp.ndarray kv_lengths_table(kv_lengths, const cnp.npy_intp *bq, int nbq, int64_t Lk,
                                  str name="kv_lengths"):
    """kv_lengths (or kv_start) as the int64 table of the batch elements, every
    value in [0, Lk].  A 1-D table with two or more batch dims holds one value
    per sequence -- per element of the LEADING batch dim (flash-attn's
    cache_seqlens) -- never per head; full-rank forms broadcast by NumPy rules."""
    cdef cnp.ndarray a = <cnp.ndarray>kv_lengths if type(kv_lengths) is cnp.ndarray else np.asarray(kv_lengths)
    cdef cnp.ndarray t
    cdef const int64_t *p
    cdef int64_t lo, hi
    cdef cnp.npy_intp i, n
    if not cnp.PyArray_ISINTEGER(a):
        raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.ndim == 1 and nbq >= 2 and a.shape[0] != 1:
        if a.shape[0] != bq[0]:
            full = tuple(bq[d] for d in range(nbq))
            heads = (1,) * (nbq - 1) + (bq[nbq - 1],)
            raise ValueError(f"{name}: a 1-D table holds one value per sequence (the leading batch dim, "
                             f"{bq[0]}), got {a.shape[0]} values; per-head values take the batch shape, "
                             f"e.g. {full}" + (f" or {heads}" if heads != full else ""))
        a = a.reshape((a.shape[0],) + (1,) * (nbq - 1))
    t = batch_table(a, name, bq, nbq, cnp.NPY_INT64)
    n = cnp.PyArray_SIZE(t)
    if n:
        p = <const int64_t *>cnp.PyArray_DATA(t)
        lo = hi = p[0]
        for i in range(1, n):
            lo = min(lo, p[i])
            hi = max(hi, p[i])
        if lo < 0 or hi > Lk:
            raise ValueError(f"{name} must lie in [0, Lk={Lk}], got values in [{lo}, {hi}]")
    return t


# ---------------------------------------------------------------- outputs

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


cdef int check_out(out, int nd, const cnp.npy_intp *shape, int typenum, tuple inputs, str name) except -1:
    """out= must be an ndarray of exactly the result's shape and dtype, writeable,
    without repeated elements and not overlapping any input ((name, array) pairs,
    array None when absent)."""
    cdef cnp.ndarray o
    cdef int d
    cdef bint same = True
    if not isinstance(out, cnp.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    o = <cnp.ndarray>out
    if o.ndim != nd:
        same = False
    else:
        for d in range(nd):
            if o.shape[d] != shape[d]:
                same = False
    if not same:
        raise ValueError(f"{name} has shape {(<object>o).shape}, expected {tuple(shape[d] for d in range(nd))}")
    if cnp.PyArray_TYPE(o) != typenum or not cnp.PyArray_ISNOTSWAPPED(o):
        raise TypeError(f"{name} has dtype {o.dtype}, expected {dtype_of(typenum)}")
    if not cnp.PyArray_ISWRITEABLE(o):
        raise ValueError(f"{name} is read-only")
    if cnp.PyArray_SIZE(o):
        for d in range(nd):
            if o.strides[d] == 0 and o.shape[d] > 1:
                raise ValueError(f"{name} has overlapping elements (a zero stride); it must be a plain "
                                 f"writeable array")
    for arr_name, arr in inputs:
        if arr is not None and may_overlap(o, <cnp.ndarray>arr):
            raise ValueError(f"{name} overlaps the input {arr_name}")
    return 0


# ---------------------------------------------------------------- QuantizedKV

cdef object _qkv_type = None      # fastattn.QuantizedKV, imported on first use


cdef bint is_qkv(x):
    """x is a fastattn.QuantizedKV (asked only of arguments that are not ndarrays)."""
    global _qkv_type
    if _qkv_type is None:
        from fastattn._quantized import QuantizedKV
        _qkv_type = QuantizedKV
    return isinstance(x, _qkv_type)


cdef int refuse_qkv(str where, tuple args) except -1:
    """TypeError naming the first QuantizedKV of args (name, value) for a function
    that does not read them."""
    for name, x in args:
        if type(x) is not cnp.ndarray and is_qkv(x):
            raise TypeError(f"{where}: {name} is a fastattn.QuantizedKV, which {where} does not take "
                            f"(fastattn.attention and fastattn.attention_paged read QuantizedKV caches)")
    return 0


cdef cnp.ndarray qkv_stand_in(x, str name):
    """A QuantizedKV k or v checked for what the kernels read in place -- uint8
    codes whose rows are contiguous, float32 scales and zero points of the
    documented shapes, aligned -- and its logical shape as a float32 array of
    zero strides (no memory): the argument path checks shapes and broadcasting on
    it; the plan reads the codes, scales and zero points (plan_quantized)."""
    data = x.data
    shape = tuple(x.shape)
    D = shape[len(shape) - 1]
    G = x.group_size
    if type(data) is not cnp.ndarray or data.dtype != np.uint8 or x.bits not in (4, 8):
        raise TypeError(f"{name}: a QuantizedKV with uint8 data and bits 4 or 8 expected, got data of type "
                        f"{type(data).__name__}, bits {x.bits!r}")
    if len(shape) < 2 or D < 0 or (x.bits == 4 and D % 2):
        raise ValueError(f"{name}.shape must be (..., L, D) with D even for 4 bits, got {shape} ({x.bits} bits)")
    want_data = x._data_shape(shape, x.bits)
    if tuple(data.shape) != want_data:
        raise ValueError(f"{name}.data has shape {data.shape}, expected {want_data} for a {x.bits}-bit QuantizedKV "
                         f"of shape {shape}")
    if type(G) is not int or G < 1 or (D and (D % G or (x.bits == 4 and G % 2))):
        raise ValueError(f"{name}.group_size must be a positive int dividing D = {D} (even for 4 bits), got {G!r}")
    if data.size and data.shape[data.ndim - 1] > 1 and data.strides[data.ndim - 1] != 1:
        raise ValueError(f"{name}.data must have contiguous rows (stride 1 along its last axis, the kernels "
                         f"read the codes in place), got strides {data.strides}")
    want = x._group_shape(shape, G)
    for field in ("scale", "zero"):
        sc = getattr(x, field)
        if type(sc) is not cnp.ndarray or sc.dtype != np.float32 or sc.shape != want:
            raise ValueError(f"{name}.{field} must be a float32 ndarray of shape {want}, got "
                             f"{getattr(sc, 'dtype', type(sc).__name__)} {getattr(sc, 'shape', '')}")
        if not behaved_array(<cnp.ndarray>sc):
            raise ValueError(f"{name}.{field} must be aligned and in native byte order (it is read in place)")
    return np.broadcast_to(np.zeros((), dtype=np.float32), shape)


cdef int plan_quantized(Plan *P, Operand *op, Operand *sc, Operand *zp, int64_t *group, x, cnp.ndarray data,
                        cnp.ndarray scale, cnp.ndarray zero) except -1:
    """A QuantizedKV k or v as operands of the plan: its codes (data: the layout of
    the batch rows the plan reads, e.g. one cache block) in place of the stand-in's,
    its scales and zero points, its group size."""
    cdef int64_t hq = P.g * (P.bshape[P.nb - 1] if P.nb > 0 else 1)
    fill_operand(op, data, 2, P, hq)
    op.store = STORE_U8Z if x.bits == 8 else STORE_U4Z
    fill_operand(sc, scale, 2, P, hq)
    fill_operand(zp, zero, 2, P, hq)
    group[0] = x.group_size if x.group_size > 0 else 1
    return 0


cdef int check_qkv_scales(kq, vq, k_scale, v_scale, str kname, str vname) except -1:
    """k_scale / v_scale are not given for a QuantizedKV k / v (it has its own)."""
    if kq is not None and k_scale is not None:
        raise TypeError(f"k_scale is given for a QuantizedKV {kname}: its scales are its own fields")
    if vq is not None and v_scale is not None:
        raise TypeError(f"v_scale is given for a QuantizedKV {vname}: its scales are its own fields")
    return 0


# ---------------------------------------------------------------- int8 / float8 scales

cdef inline bint is_float8(cnp.ndarray a) noexcept:
    cdef int st = store_of(a)
    return st == STORE_F8E4 or st == STORE_F8E5


cdef object parse_kv_scale(x, str name, cnp.ndarray kv, str kvname, int *kind):
    """k_scale / v_scale: a real array broadcastable to kv.shape[:-1] + (1,) (per
    tensor, per head, per key: kind SCALE_PER_KEY) or to kv.shape[:-2] + (1, D)
    (per channel: SCALE_PER_CHANNEL), finite, given for an integer or float8 kv only.
    Returned with at least 2 dims."""
    cdef cnp.ndarray a
    cdef cnp.npy_intp per_key[MAXDIM + 2]
    cdef cnp.npy_intp per_channel[MAXDIM + 2]
    cdef int d, nd = kv.ndim
    kind[0] = SCALE_NONE
    if x is None:
        return None
    a = as_input(x, name)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real (float) array, got dtype {a.dtype}")
    if not cnp.PyArray_ISINTEGER(kv) and not is_float8(kv):
        raise TypeError(f"{name} is given for {kvname} of dtype {kv.dtype}: scales are for integer "
                        f"(int8) and float8 {kvname} only")
    for d in range(nd):
        per_key[d] = kv.shape[d]
        per_channel[d] = kv.shape[d]
    per_key[nd - 1] = 1
    per_channel[nd - 2] = 1
    if fits(a, per_key, nd):
        kind[0] = SCALE_PER_KEY
    elif fits(a, per_channel, nd):
        kind[0] = SCALE_PER_CHANNEL
    else:
        raise ValueError(f"{name} with shape {(<object>a).shape} broadcasts neither to "
                         f"{tuple(per_key[d] for d in range(nd))} (per key) nor to "
                         f"{tuple(per_channel[d] for d in range(nd))} (per channel)")
    if a.size and not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite")
    if a.ndim < 2:
        a = a.reshape((1,) * (2 - a.ndim) + (<object>a).shape)
    return a


cdef cnp.ndarray scaled_kv(cnp.ndarray kv, scale, int ctype, int *kind):
    """An integer or float8 k or v with its scale: read in place as int8 / float8
    (float32 compute), the scale applied by the kernels; otherwise converted with the scale folded
    in (kv.astype(compute dtype) * scale, a copy) and kind reset to SCALE_NONE."""
    if scale is None:
        return stored_operand(kv, ctype, True)
    if ctype == cnp.NPY_FLOAT and (store_of(kv) == STORE_I8 or is_float8(kv)) and behaved_array(kv):
        return kv
    kind[0] = SCALE_NONE
    dt = dtype_of(ctype)
    return np.multiply(kv.astype(dt), np.asarray(scale).astype(dt))


cdef cnp.ndarray scale_table(scale):
    """A scale the kernels read in place: float32, behaved (else a float32 copy)."""
    cdef cnp.ndarray a = <cnp.ndarray>scale
    if cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT and behaved_array(a):
        return a
    return np.asarray(a, dtype=np.float32)
