# softmax and log_softmax: rows (contiguous or strided) and columns (lanes over
# the contiguous axis of a softmax along a strided axis).

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
    cdef int64_t CW = FA_QVEC_NV * W
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
    cdef int64_t CW = FA_QVEC_NV * (FA_VBYTES // sizeof(floating))
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
