# softmax and log_softmax: rows (contiguous or strided) and columns (lanes over
# the contiguous axis of a softmax along a strided axis).

cdef void softmax_row(const floating *x, floating *y, int64_t n, int log_mode,
                      floating *tmp=NULL, const floating *nxt=NULL) noexcept nogil:
    """y = softmax(x) (or log_softmax) of one contiguous row; x and y must not alias.
    tmp (n elements, or NULL): the exponentials go there, and y is written once,
    by streaming stores (softmax_run's stream); the same values either way.
    nxt: the row to be read next, requested into L2 during the exponentials (so
    that its read from memory overlaps this row's arithmetic), or NULL."""
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
    cdef floating *e = tmp if tmp != NULL else y       # where the exponentials go
    s = row_exp_sum_next(x, e, n, m, nxt)
    if log_mode:
        if tmp != NULL:
            row_shift_stream(x, y, n, -(m + <floating>log(s)))
        else:
            row_shift(x, y, n, -(m + <floating>log(s)))
    elif tmp != NULL:
        row_scale_stream(e, y, n, <floating>(1.0 / s))
    else:
        row_scale(e, y, n, <floating>(1.0 / s))


cdef void softmax_rows(const Plan *P, int64_t r0, int64_t r1, int64_t n, int log_mode,
                       floating *buf, int stream=0) noexcept nogil:
    """Rows r0..r1-1 of softmax_run; buf (2 rows) when a row is not contiguous or
    not of the compute type (float16 / bfloat16 input or output: read and written
    in place, each row widened into buf and its result rounded once), or when
    contiguous rows are written by streaming stores (stream: buf holds a row's
    exponentials; a store fence after the rows)."""
    cdef int64_t r, j
    cdef const floating *x
    cdef floating *y
    cdef const char *xs
    cdef char *ys
    cdef int native = native_store(<floating>0)
    for r in range(r0, r1):
        if buf == NULL or stream:
            x = (<const floating *>P.q.base) + batch_offset(P, &P.q, r)
            y = (<floating *>P.o.base) + batch_offset(P, &P.o, r)
            softmax_row(x, y, n, log_mode, buf if stream else NULL,
                        (<const floating *>P.q.base) + batch_offset(P, &P.q, r + 1) if r + 1 < P.nbatch
                        else NULL)
            continue
        # gather (widen), softmax_row (input and result must not alias), scatter (narrow)
        xs = stored_at(&P.q, batch_offset(P, &P.q, r))
        ys = <char *>stored_at(&P.o, batch_offset(P, &P.o, r))
        softmax_row(widen_row(&P.q, xs, buf, n), buf + n, n, log_mode)
        if P.o.store == native:
            y = <floating *>ys
            for j in range(n):
                y[j * P.o.sc] = buf[n + j]
        elif P.o.sc == 1:
            stored_scale_row_out(P.o.store, buf + n, ys, n, <floating>1)
        else:
            for j in range(n):
                stored_set(P.o.store, ys, j * P.o.sc, buf[n + j])
    if stream:
        fa_stream_fence()


cdef int softmax_run(Plan *P, floating dummy, int64_t n, int log_mode, int nthreads,
                     int stream=0) except -1:
    """Rows of length n: P.q describes the input (sc = element stride along the
    row), P.o the output; the batch dims enumerate the rows.  stream: contiguous
    rows of the compute type are written by streaming stores (softmax_call)."""
    cdef int64_t rows_per_unit = 1 + 16384 // (n if n > 0 else 1)
    cdef int64_t units = (P.nbatch + rows_per_unit - 1) // rows_per_unit
    cdef int64_t u
    cdef int native = native_store(<floating>0)
    cdef int contiguous = P.q.sc == 1 and P.o.sc == 1 and P.q.store == native and P.o.store == native
    stream = stream and contiguous
    # a per-thread row buffer: gathered / widened rows, or a streamed row's exponentials
    cdef int need_buf = not contiguous or stream
    cdef int use_threads = nthreads > 1 and P.nbatch * n > SOFTMAX_PARALLEL_MIN
    cdef floating *buf = NULL
    cdef int failed = 0
    cdef int *failed_p = &failed
    cdef int stop = 0
    cdef int *stop_p = &stop
    # long calls check for Ctrl-C between units (interrupt_check, driver.pxi)
    cdef bint interruptible = P.nbatch * n > INTERRUPT_MIN_WORK
    cdef double next_check = fa_seconds() + INTERRUPT_EVERY if interruptible else 0
    if not use_threads:
        # no OpenMP region at all for small inputs (see attention_run)
        with nogil:
            if need_buf:
                buf = <floating *>fa_alloc(2 * (n if n > 0 else 1) * sizeof(floating))
                failed = buf == NULL
            if not failed:
                for u in range(units):
                    if interruptible and interrupt_check(stop_p, &next_check):
                        break
                    softmax_rows(P, u * rows_per_unit, min(P.nbatch, (u + 1) * rows_per_unit), n, log_mode, buf, stream)
            fa_free(buf)
    else:
        with nogil, parallel(num_threads=nthreads):
            buf = NULL
            if need_buf:
                buf = <floating *>fa_alloc(2 * (n if n > 0 else 1) * sizeof(floating))
                if buf == NULL:
                    failed_p[0] = 1
            if not interruptible:
                for u in prange(units, schedule='static'):
                    if buf != NULL or not need_buf:
                        softmax_rows(P, u * rows_per_unit, min(P.nbatch, (u + 1) * rows_per_unit), n, log_mode, buf, stream)
            else:
                # dynamic: the calling thread keeps taking units (and checking for
                # Ctrl-C) however unevenly the others progress
                for u in prange(units, schedule='dynamic'):
                    if (buf != NULL or not need_buf) and not stop_p[0]:
                        if threadid() == 0 and interrupt_check(stop_p, &next_check):
                            continue
                        softmax_rows(P, u * rows_per_unit, min(P.nbatch, (u + 1) * rows_per_unit), n, log_mode, buf, stream)
            fa_free(buf)
    if stop:
        return -1           # interrupted (KeyboardInterrupt set): no result
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
    cdef int stop = 0
    cdef int *stop_p = &stop
    # long calls check for Ctrl-C between units (interrupt_check, driver.pxi)
    cdef bint interruptible = outer * n * inner > INTERRUPT_MIN_WORK
    cdef double next_check = fa_seconds() + INTERRUPT_EVERY if interruptible else 0
    if not use_threads:
        with nogil:
            for u in range(units):
                if interruptible and interrupt_check(stop_p, &next_check):
                    break
                cols_unit(x, xso, xsn, y, yso, ysn, n, inner, nblk, u, log_mode)
    else:
        with nogil:
            if not interruptible:
                for u in prange(units, schedule='static', num_threads=nthreads):
                    cols_unit(x, xso, xsn, y, yso, ysn, n, inner, nblk, u, log_mode)
            else:
                # handed out dynamically, so the calling thread keeps taking units
                # (and checking) while the others are slow (page faults of a new output)
                for u in prange(units, schedule='dynamic', num_threads=nthreads):
                    if not stop_p[0]:
                        if threadid() == 0 and interrupt_check(stop_p, &next_check):
                            continue
                        cols_unit(x, xso, xsn, y, yso, ysn, n, inner, nblk, u, log_mode)
    return -1 if stop else 0     # -1: interrupted, KeyboardInterrupt set


# a softmax along a non-last axis takes the column kernel when the axes after
# it hold at least this many elements (one float vector); below, row by row
cdef int64_t SOFTMAX_COL_MIN = FA_VBYTES // 4


cdef int softmax_cols_forward(cnp.ndarray x, cnp.ndarray out, int log_mode, int nthreads) except -1:
    """Softmax along axis 1 of 3-D x (outer, n, inner) into out of the same shape
    and compute type; both have element stride 1 along the last axis (at least
    a vector long) and item-multiple strides.  Lanes run over the last axis."""
    cdef int64_t item = cnp.PyArray_ITEMSIZE(x)
    if x.size == 0:
        return 0            # (an empty array's strides may be anything)
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT:
        softmax_cols_run(<const float *>cnp.PyArray_DATA(x), x.strides[0] // item, x.strides[1] // item,
                         <float *>cnp.PyArray_DATA(out), out.strides[0] // item, out.strides[1] // item,
                         x.shape[0], x.shape[1], x.shape[2], log_mode, nthreads)
    else:
        softmax_cols_run(<const double *>cnp.PyArray_DATA(x), x.strides[0] // item, x.strides[1] // item,
                         <double *>cnp.PyArray_DATA(out), out.strides[0] // item, out.strides[1] // item,
                         x.shape[0], x.shape[1], x.shape[2], log_mode, nthreads)
    return 0


cdef int softmax_forward(cnp.ndarray x, cnp.ndarray out, int log_mode, int nthreads, int stream=0) except -1:
    """Softmax along the LAST axis of x into out (same shape, any item-multiple
    strides): both of the compute type, or (float32 compute) either float16 /
    bfloat16, read or written in place."""
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
        return 0
    if cnp.PyArray_TYPE(x) != cnp.NPY_DOUBLE:
        softmax_run(&P, <float>0, n, log_mode, nthreads, stream)
    else:
        softmax_run(&P, <double>0, n, log_mode, nthreads, stream)
    return 0


cdef int softmax_along(cnp.ndarray xc, cnp.ndarray res, int axis, int log_mode, int nthreads,
                       int stream=0) except -1:
    """Softmax of xc along axis into res (same shape and compute type), by layout.

    When xc and res share one dense layout (C order, Fortran order, or any
    transposition of them), ordered by decreasing stride both are C-contiguous
    and the softmax axis sits at position p.  p last: contiguous rows.
    Otherwise, when the axes after p hold at least one float vector: 3-D
    (outer, n, inner) views for the column kernel.  Anything else goes row by
    row (rows gathered through the strides)."""
    cdef int nd = xc.ndim, p
    if axis == nd - 1 and cnp.PyArray_IS_C_CONTIGUOUS(xc) and cnp.PyArray_IS_C_CONTIGUOUS(res):
        return softmax_forward(xc, res, log_mode, nthreads, stream)
    perm = sorted(range(nd), key=lambda d: (-abs(xc.strides[d]), d))
    xt, rt = xc.transpose(perm), res.transpose(perm)
    if xt.flags.c_contiguous and rt.flags.c_contiguous:
        p = perm.index(axis)
        if p == nd - 1:
            return softmax_forward(np.moveaxis(xc, axis, -1), np.moveaxis(res, axis, -1), log_mode, nthreads,
                                   stream)
        inner = math.prod(xt.shape[p + 1:])
        if inner >= SOFTMAX_COL_MIN:
            shape3 = (math.prod(xt.shape[:p]), xt.shape[p], inner)
            return softmax_cols_forward(xt.reshape(shape3), rt.reshape(shape3), log_mode, nthreads)
    return softmax_forward(np.moveaxis(xc, axis, -1), np.moveaxis(res, axis, -1), log_mode, nthreads)


cdef bint half_in_place(cnp.ndarray xa, axis, int ctype, int otype):
    """A float16 / bfloat16 x whose softmax rows are contiguous (axis None on a
    C-contiguous x, or an int axis of element stride 1) is read in place and its
    result written in its own dtype (softmax_half); other layouts of it are
    converted to float32 first (the column kernel, or rows gathered)."""
    cdef int st = store_of(xa)
    if not (otype != ctype and ctype == cnp.NPY_FLOAT and (st == STORE_F16 or st == STORE_BF16)
            and behaved_array(xa) and xa.size > 0):
        return False
    if axis is None:
        return cnp.PyArray_IS_C_CONTIGUOUS(xa)
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral) \
            or not -xa.ndim <= axis < xa.ndim:
        return False        # (the usual path checks it and says what is wrong)
    return xa.strides[operator.index(axis) % xa.ndim] == xa.itemsize


cdef object softmax_half(cnp.ndarray xa, axis, out, int log_mode, int nthreads):
    """softmax_call of a float16 / bfloat16 x accepted by half_in_place: rows
    widened a row at a time, results rounded once into out (or a new array of
    x's dtype and memory layout)."""
    cdef int ax
    dt = xa.dtype
    if axis is None:
        xv = xa.reshape(1, -1)
        if out is not None and behaved_array(<cnp.ndarray>out) and (<cnp.ndarray>out).flags.c_contiguous:
            softmax_forward(xv, (<cnp.ndarray>out).reshape(1, -1), log_mode, nthreads)
            return out
        res = np.empty(xv.shape, dtype=dt)
        softmax_forward(xv, res, log_mode, nthreads)
        res = res.reshape((<object>xa).shape)
    else:
        ax = operator.index(axis) % xa.ndim
        if out is not None and behaved_array(<cnp.ndarray>out):
            softmax_forward(np.moveaxis(xa, ax, -1), np.moveaxis(out, ax, -1), log_mode, nthreads)
            return out
        res = np.empty_like(xa, dtype=dt)
        softmax_forward(np.moveaxis(xa, ax, -1), np.moveaxis(res, ax, -1), log_mode, nthreads)
    if out is not None:
        out[...] = res
        return out
    return res


# float16 / bfloat16 x along an axis of non-adjacent elements: elements widened
# to float32 per slab (4 MiB of float32; slabs of 2^18 elements made a (4096,
# 4096) softmax along axis 0 1.3x (float16) to 2x (bfloat16) slower than the
# whole copy, NumPy's casts of short strided rows costing more per element)
cdef Py_ssize_t HALF_SLAB = 1 << 20


cdef object softmax_half_slabs(cnp.ndarray xa, cnp.ndarray res, int ax, int log_mode, int nthreads):
    """res[...] = the softmax of a float16 / bfloat16 xa along ax, for layouts
    half_in_place does not read in place: slabs of xa (split along its outermost
    other axes) of at most HALF_SLAB elements -- or one softmax row, if a row is
    longer -- widened to float32 (their layout kept), through softmax_along,
    rounded into res.  The same operations, per column and row, as widening all
    of x at once, so the same bits; the scratch is two slabs, not a float32 copy
    of x and of its result."""
    cdef int c = -1, d
    cdef Py_ssize_t step, per, i0, n
    if cnp.PyArray_SIZE(xa) > HALF_SLAB:
        for d in range(xa.ndim):
            if d != ax and xa.shape[d] > 1 and (c < 0 or abs(xa.strides[d]) > abs(xa.strides[c])):
                c = d
    if c < 0:
        xc = xa.astype(np.float32)
        r32 = np.empty_like(xc)
        softmax_along(xc, r32, ax, log_mode, nthreads)
        res[...] = r32
        return res
    n = xa.shape[c]
    per = cnp.PyArray_SIZE(xa) // n
    step = max(1, HALF_SLAB // per)
    for i0 in range(0, n, step):
        sl = (slice(None),) * c + (slice(i0, i0 + step),)
        softmax_half_slabs(xa[sl], res[sl], ax, log_mode, nthreads)
    return res


cdef object softmax_call(x, axis, out, num_threads, int log_mode, str fname):
    """softmax / log_softmax of x along axis (an int, or None for the whole array).
    The result takes the input's memory layout (as NumPy ufuncs do), so a slice
    that is contiguous in x is contiguous in the result too."""
    cdef cnp.ndarray xa, xc, res
    cdef int ctype, otype, nthreads = 1, ax, t
    if not (type(x) is cnp.ndarray and plain(out)):
        result = _foreign_softmax(x, axis, out, num_threads, log_mode)
        if result is not NotImplemented:
            return result
    xa = as_input(x, "x")
    check_num_threads(num_threads)
    t = cnp.PyArray_TYPE(xa)
    if t == cnp.NPY_FLOAT or t == cnp.NPY_DOUBLE:
        ctype = otype = t
    else:
        ctype = compute_type(xa, xa, xa, &otype)
    if out is not None:
        check_out(out, xa.ndim, xa.shape, otype, (("x", xa),), "out")
    if cnp.PyArray_SIZE(xa) > SOFTMAX_PARALLEL_MIN:
        # small inputs run on the calling thread: no thread count asked for
        nthreads = _thread_resolver(num_threads)
    if half_in_place(xa, axis, ctype, otype):
        return softmax_half(xa, axis, out, log_mode, nthreads)
    if axis is not None:
        if type(axis) is int and -xa.ndim <= axis < xa.ndim:
            ax = axis % xa.ndim
        else:
            if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
                raise TypeError(f"{fname}: axis must be an int or None, got {axis!r}")
            ax = np.lib.array_utils.normalize_axis_index(operator.index(axis), xa.ndim)
        if (cnp.PyArray_SIZE(xa) > HALF_SLAB and otype != ctype and ctype == cnp.NPY_FLOAT
                and (store_of(xa) == STORE_F16 or store_of(xa) == STORE_BF16)):
            # a half-precision x along a strided axis: widened a slab at a time
            if out is not None and behaved_array(<cnp.ndarray>out):
                return softmax_half_slabs(xa, <cnp.ndarray>out, ax, log_mode, nthreads)
            res = softmax_half_slabs(xa, np.empty_like(xa, dtype=xa.dtype), ax, log_mode, nthreads)
            if out is not None:
                out[...] = res
                return out
            return res
    xc = to_compute(xa, ctype)
    if axis is None:
        flat = np.ascontiguousarray(xc).reshape(1, -1) if xc.ndim != 1 else xc.reshape(1, -1)
        res = cnp.PyArray_EMPTY(2, (<cnp.ndarray>flat).shape, ctype, 0)
        if flat.size:
            softmax_forward(flat, res, log_mode, nthreads)
        res = res.reshape((<object>xa).shape)
    else:
        if out is not None and otype == ctype and behaved_array(<cnp.ndarray>out):
            # a caller's output bigger than the last-level cache: its lines are
            # not in the caches, so stores would first read each one
            # (read-for-ownership) -- write it past the caches instead
            softmax_along(xc, <cnp.ndarray>out, ax, log_mode, nthreads,
                          0 < _stream_min_bytes <= cnp.PyArray_NBYTES(<cnp.ndarray>out))
            return out
        if cnp.PyArray_IS_C_CONTIGUOUS(xc):
            res = cnp.PyArray_EMPTY(xc.ndim, xc.shape, ctype, 0)
        else:
            res = np.empty_like(xc, dtype=dtype_of(ctype))
        softmax_along(xc, res, ax, log_mode, nthreads)
    if out is not None:
        out[...] = res
        return out
    return res if otype == ctype else res.astype(dtype_of(otype))


def softmax(x, axis=-1, *, out=None, num_threads=None):
    return softmax_call(x, axis, out, num_threads, 0, "softmax")


def log_softmax(x, axis=-1, *, out=None, num_threads=None):
    return softmax_call(x, axis, out, num_threads, 1, "log_softmax")
