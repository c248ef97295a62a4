# The argument path of attention(): from Python arguments to a filled plan.

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
