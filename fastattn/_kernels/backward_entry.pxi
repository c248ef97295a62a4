# attention_backward(): the public entry point of the gradients.  The same
# argument path as attention() (arguments.pxi: shapes, batch layout and grouped
# heads, every option), then the forward's results grad_out / out / lse checked
# against what attention() returns, the gradient buffers, the kernel
# (backward.pxi), and the sums over broadcast dims.  Its docstring is
# fastattn._docstrings.ATTENTION_BACKWARD.

cdef object forward_result(x, str name, int nd, const cnp.npy_intp *shape, int typenum, int ctype):
    """grad_out / out / lse: exactly the shape and dtype attention() returns for
    these inputs; as the kernels read it (float16 / bfloat16 in place)."""
    cdef cnp.ndarray a = as_input(x, name)
    cdef int d
    cdef bint same = a.ndim == nd
    if same:
        for d in range(nd):
            same = same and a.shape[d] == shape[d]
    if not same:
        raise ValueError(f"{name} has shape {(<object>a).shape}, expected {tuple(shape[d] for d in range(nd))} "
                         f"(what attention() returns for these q, k, v)")
    if cnp.PyArray_TYPE(a) != typenum:
        raise TypeError(f"{name} has dtype {a.dtype}, expected {dtype_of(typenum)} (what attention() returns "
                        f"for these q, k, v)")
    return stored_operand(a, ctype, False)


cdef object sum_to_shape(cnp.ndarray x, tuple shape):
    """x summed over the dims that were broadcast from shape (NumPy rules)."""
    cdef int lead = x.ndim - len(shape)
    if lead:
        x = np.asarray(x.sum(axis=tuple(range(lead))))     # to a 0-d shape: a NumPy scalar
    axes = tuple(d for d, n in enumerate(shape) if n == 1 and x.shape[d] != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x.reshape(shape)


cdef object finish_gradient(cnp.ndarray grad, cnp.ndarray like, int otype):
    """A gradient in its input's shape (summed over broadcast dims) and dtype (an
    integer or boolean input's: the output dtype)."""
    shape = (<object>like).shape
    if (<object>grad).shape != shape:
        grad = sum_to_shape(grad, shape)
    dt = like.dtype if like.dtype.kind == "f" or store_of(like) == STORE_BF16 else dtype_of(otype)
    return grad if grad.dtype == dt else grad.astype(dt)


cdef object gradient_buffer(cnp.ndarray like, int nd, const cnp.npy_intp *shape, int ctype, bint empty):
    """The array a gradient is computed into: of the compute type, or of its float16 /
    bfloat16 input's dtype (float32 compute) when it has that input's shape (nothing
    to sum over broadcast dims): the kernels round into it, no float32 gradient
    and cast.  Zeros when empty (no kernel runs)."""
    cdef int d, st = store_of(like)
    shp = tuple(shape[d] for d in range(nd))
    if ctype == cnp.NPY_FLOAT and (st == STORE_F16 or st == STORE_BF16) and (<object>like).shape == shp:
        dt = like.dtype.newbyteorder("=")
    else:
        dt = dtype_of(ctype)
    return np.zeros(shp, dtype=dt) if empty else np.empty(shp, dtype=dt)


cdef object sinks_gradient(dout, outc, lsec, cnp.ndarray snk, tuple batch):
    """d sink per (batch element, query head): -sum over rows of exp(sink - lse) *
    rowsum(grad_out * out), in float64 (lse includes the sink: the probability the
    sink took; a row whose lse is -inf contributes 0).  The kernels' dq, dk, dv
    need nothing else: the probabilities recomputed from that lse carry the sink."""
    s = snk.reshape(batch)[..., None]
    if dout.dtype.kind != "f" or outc.dtype.kind != "f":     # bfloat16 (ml_dtypes): einsum widens float types only
        dout, outc = dout.astype(np.float32), outc.astype(np.float32)
    with np.errstate(all="ignore"):
        d = np.einsum("...d,...d->...", dout, outc, dtype=np.float64)
        p_sink = np.where(lsec == -np.inf, 0.0, np.exp(s - lsec))
        return -(p_sink * d).sum(axis=-1)


cdef cnp.ndarray backward_kv(cnp.ndarray a, kq, kv_scale, int ctype):
    """k or v as the backward kernels read it: float16 / bfloat16 in place, anything
    else in the compute type -- an int8 / float8 array times its parsed scale
    (a.astype(compute) * scale, the forward's values) and a QuantizedKV's
    (code - zero) * scale (kq: the cache, a its stand-in): a copy of the values.
    The backward kernels have no int8 / float8 / quantized readers; a gradient
    step reads K and V a few times over, so the copy is a fraction of its work."""
    cdef object dt = dtype_of(ctype)
    if kq is not None:
        return kq._values(dt)
    if kv_scale is not None:
        return np.multiply(a.astype(dt), np.asarray(kv_scale).astype(dt))
    return stored_operand(a, ctype, False)


def attention_backward(grad_out, q, k, v, out, lse, *, scale=None, causal=False, mask=None, bias=None,
                       window=None, kv_lengths=None, kv_start=None, align="top_left", softcap=None,
                       alibi_slopes=None, k_scale=None, v_scale=None, sinks=None, return_dbias=False,
                       return_dsinks=False, num_threads=None):
    cdef BwdPlan B
    cdef cnp.ndarray qa, ka, va, q0, k0, v0, dq, dk, dv
    cdef cnp.ndarray ma = None, ba = None, kvt = None, kst = None, slt = None, dbias = None, bias_in = None
    cdef cnp.ndarray snk = None
    cdef int ctype, otype, nbq, d, kkind = SCALE_NONE, vkind = SCALE_NONE
    cdef cnp.npy_intp dims[MAXDIM + 2]
    cdef cnp.npy_intp kvdims[MAXDIM + 2]
    cdef object kq = None, vq = None
    if type(k) is not cnp.ndarray and is_qkv(k):
        kq = k
        k = qkv_stand_in(k, "k")
    if type(v) is not cnp.ndarray and is_qkv(v):
        vq = v
        v = qkv_stand_in(v, "v")
    if not (type(q) is cnp.ndarray and type(k) is cnp.ndarray and type(v) is cnp.ndarray and plain(mask)
            and plain(bias) and plain(sinks) and plain(k_scale) and plain(v_scale)):
        # masked arrays: refused (their mask would be ignored); torch tensors and other
        # array-likes are converted below
        _refuse_foreign((("q", q), ("k", k), ("v", v), ("mask", mask), ("bias", bias), ("sinks", sinks),
                         ("k_scale", k_scale), ("v_scale", v_scale)))
    qa = as_input(q, "q")
    ka = as_input(k, "k")
    va = as_input(v, "v")
    check_qkv_shapes(qa, ka, va)
    check_num_threads(num_threads)
    ctype = compute_type(qa, ka, va, &otype)
    check_qkv_scales(kq, vq, k_scale, v_scale, "k", "v")
    k_scale = parse_kv_scale(k_scale, "k_scale", ka, "k", &kkind)
    v_scale = parse_kv_scale(v_scale, "v_scale", va, "v", &vkind)
    # the gradients of a QuantizedKV or scaled k / v are with respect to the values the
    # forward computed with, in the output's dtype, in its logical shape
    q0 = qa
    k0 = ka if kq is None and k_scale is None else np.broadcast_to(np.zeros((), np.int8), (<object>ka).shape)
    v0 = va if vq is None and v_scale is None else np.broadcast_to(np.zeros((), np.int8), (<object>va).shape)
    B.P.Lq = qa.shape[qa.ndim - 2]
    B.P.Lk = ka.shape[ka.ndim - 2]
    B.P.Dk = qa.shape[qa.ndim - 1]
    B.P.Dv = va.shape[va.ndim - 1]
    batch_layout(&B.P, qa, ka, va, dims, &nbq)
    parse_scalar_options(&B.P, scale, causal, window, softcap, align)
    B.softcap = B.P.softcap         # the backward applies softcap itself (its derivative)
    B.P.softcap = 0
    if not isinstance(return_dbias, (bool, np.bool_)):
        raise TypeError(f"return_dbias must be True or False, got {return_dbias!r}")
    if return_dbias and bias is None:
        raise ValueError("return_dbias=True needs a bias")
    if not isinstance(return_dsinks, (bool, np.bool_)):
        raise TypeError(f"return_dsinks must be True or False, got {return_dsinks!r}")
    if return_dsinks and sinks is None:
        raise ValueError("return_dsinks=True needs sinks")
    if mask is not None:
        ma = score_operand(mask, "mask", dims, nbq, B.P.Lq, B.P.Lk, cnp.NPY_BOOL)
    if bias is not None:
        bias_in = as_input(bias, "bias")
        ba = to_compute(score_operand(bias_in, "bias", dims, nbq, B.P.Lq, B.P.Lk, ctype), ctype)
    if kv_lengths is not None:
        kvt = kv_lengths_table(kv_lengths, dims, nbq, B.P.Lk)
    if kv_start is not None:
        kst = kv_lengths_table(kv_start, dims, nbq, B.P.Lk, "kv_start")
    if alibi_slopes is not None:
        slt = batch_table(as_input(alibi_slopes, "alibi_slopes"), "alibi_slopes", dims, nbq, ctype)
    if sinks is not None:
        snk = sinks_table(sinks, dims, nbq)
    batch = tuple(dims[d] for d in range(nbq))

    dims[nbq] = B.P.Lq
    dims[nbq + 1] = B.P.Dv
    dout = forward_result(grad_out, "grad_out", nbq + 2, dims, otype, ctype)
    outc = forward_result(out, "out", nbq + 2, dims, otype, ctype)
    lsec = forward_result(lse, "lse", nbq + 1, dims, ctype, ctype)
    # the gradients in the broadcast batch shape (the inputs' own when nothing is
    # broadcast): dq over the query heads, dk / dv over the key/value heads
    for d in range(nbq):
        kvdims[d] = B.P.bshape[d]
    dims[nbq + 1] = B.P.Dk
    kvdims[nbq] = B.P.Lk
    kvdims[nbq + 1] = B.P.Dk
    empty = B.P.Lq == 0 or any(B.P.bshape[d] == 0 for d in range(nbq))
    dq = gradient_buffer(q0, nbq + 2, dims, ctype, empty)
    dk = gradient_buffer(k0, nbq + 2, kvdims, ctype, empty)
    kvdims[nbq + 1] = B.P.Dv
    dv = gradient_buffer(v0, nbq + 2, kvdims, ctype, empty)
    if return_dbias:
        dbias = np.zeros((<object>ba).shape, dtype=dtype_of(ctype))
    if not empty:
        # float16 / bfloat16 q, k, v (and grad_out, out) are read in place; other
        # types are converted to the compute type (int8 / float8 k and v, with their
        # scales, and QuantizedKV caches: a copy of the values, see backward_kv)
        qa = stored_operand(qa, ctype, False)
        ka = backward_kv(ka, kq, k_scale, ctype)
        va = backward_kv(va, vq, v_scale, ctype)
        backward_execute(&B, dout, qa, ka, va, outc, lsec, dq, dk, dv, dbias, ma, ba, kvt, kst, slt, num_threads)
    res = (finish_gradient(dq, q0, otype), finish_gradient(dk, k0, otype), finish_gradient(dv, v0, otype))
    if return_dbias:
        res += (finish_gradient(dbias, bias_in, otype),)
    if return_dsinks:
        res += (finish_gradient(sinks_gradient(dout, outc, lsec, snk, batch).astype(dtype_of(ctype)),
                                as_input(sinks, "sinks"), otype),)
    return res
