# attention(): the public entry point.  Compiled, so that a call costs no Python
# frame (a Python function fills each of its keyword-only defaults with a dict
# lookup: about a fifth of a tiny call); it runs the argument path
# (arguments.pxi), allocates the outputs, runs the plan (driver.pxi) and returns
# the results in the output dtype.  Its docstring is fastattn._docstrings.ATTENTION.

cdef inline int check_qkv_shapes(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v) except -1:
    """At least 2-D; q and k share Dk, k and v share Lk."""
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        for name, a in (("q", q), ("k", k), ("v", v)):
            if (<cnp.ndarray>a).ndim < 2:
                raise ValueError(f"{name} must have at least 2 dimensions (..., L, D), got shape "
                                 f"{(<object>a).shape}")
    if q.shape[q.ndim - 1] != k.shape[k.ndim - 1]:
        raise ValueError(f"q and k must have the same last dimension Dk: q {(<object>q).shape}, k {(<object>k).shape}")
    if k.shape[k.ndim - 2] != v.shape[v.ndim - 2]:
        raise ValueError(f"k and v must have the same number of keys Lk: k {(<object>k).shape}, v {(<object>v).shape}")
    return 0


cdef object finish_outputs(out, cnp.ndarray res, cnp.ndarray wts, cnp.ndarray lse, int ctype, int otype):
    """The results as the caller asked for them: written into out (converted to
    its dtype when the kernels could not write it directly), or in the output
    dtype; the tuple (out, weights, lse) with only the parts asked for."""
    if out is not None:
        if res is not out:
            out[...] = res
        res = <cnp.ndarray>out
    elif cnp.PyArray_TYPE(res) != otype:
        res = res.astype(dtype_of(otype))
    if wts is None and lse is None:
        return res
    if wts is not None and otype != ctype:
        wts = wts.astype(dtype_of(otype))
    if wts is None:
        return res, lse
    if lse is None:
        return res, wts
    return res, wts, lse


def attention(q, k, v, *, scale=None, causal=False, mask=None, bias=None, window=None,
              kv_lengths=None, kv_start=None, align="top_left", softcap=None, alibi_slopes=None,
              k_scale=None, v_scale=None, sinks=None, return_weights=False, return_lse=False, out=None,
              num_threads=None):
    cdef cnp.ndarray qa, ka, va, res
    cdef cnp.ndarray ma = None, ba = None, kvt = None, kst = None, slt = None, wts = None, lse = None
    cdef cnp.ndarray snk = None
    cdef Plan P
    cdef int ctype, otype, nbq, kkind = SCALE_NONE, vkind = SCALE_NONE
    cdef cnp.npy_intp dims[MAXDIM + 2]
    cdef object kq = None, vq = None
    if type(k) is not cnp.ndarray and is_qkv(k):
        kq = k
        k = qkv_stand_in(k, "k")
    if type(v) is not cnp.ndarray and is_qkv(v):
        vq = v
        v = qkv_stand_in(v, "v")
    if not (type(q) is cnp.ndarray and type(k) is cnp.ndarray and type(v) is cnp.ndarray and plain(mask)
            and plain(bias) and plain(out) and plain(kv_lengths) and plain(kv_start) and plain(alibi_slopes)
            and plain(k_scale) and plain(v_scale) and plain(sinks)):
        result = _foreign_attention(q, k if kq is None else kq, v if vq is None else vq, dict(
            scale=scale, causal=causal, mask=mask, bias=bias, window=window, kv_lengths=kv_lengths,
            kv_start=kv_start, align=align, softcap=softcap, alibi_slopes=alibi_slopes, k_scale=k_scale,
            v_scale=v_scale, sinks=sinks, return_weights=return_weights, return_lse=return_lse, out=out,
            num_threads=num_threads))
        if result is not NotImplemented:
            return result
    qa = as_input(q, "q")
    ka = as_input(k, "k")
    va = as_input(v, "v")
    check_qkv_shapes(qa, ka, va)
    check_num_threads(num_threads)
    ctype = compute_type(qa, ka, va, &otype)
    check_qkv_scales(kq, vq, k_scale, v_scale, "k", "v")
    if k_scale is not None or v_scale is not None:
        k_scale = parse_kv_scale(k_scale, "k_scale", ka, "k", &kkind)
        v_scale = parse_kv_scale(v_scale, "v_scale", va, "v", &vkind)
        ka = scaled_kv(ka, k_scale, ctype, &kkind)
        va = scaled_kv(va, v_scale, ctype, &vkind)
    P.Lq = qa.shape[qa.ndim - 2]
    P.Lk = ka.shape[ka.ndim - 2]
    P.Dk = qa.shape[qa.ndim - 1]
    P.Dv = va.shape[va.ndim - 1]
    if (P.Dk + P.Dv) * (4 if ctype == cnp.NPY_FLOAT else 8) > (<int64_t>1 << 48):
        # the kernels' per-thread workspace is ~200 rows of Dk + Dv
        raise MemoryError(f"head dimensions Dk={P.Dk}, Dv={P.Dv} are too large: the attention workspace "
                          f"cannot be allocated")
    batch_layout(&P, qa, ka, va, dims, &nbq)
    parse_scalar_options(&P, scale, causal, window, softcap, align)
    if mask is not None:
        ma = score_operand(mask, "mask", dims, nbq, P.Lq, P.Lk, cnp.NPY_BOOL)
    if bias is not None:
        ba = score_operand(bias, "bias", dims, nbq, P.Lq, P.Lk, ctype)
    if kv_lengths is not None:
        kvt = kv_lengths_table(kv_lengths, dims, nbq, P.Lk)
    if kv_start is not None:
        kst = kv_lengths_table(kv_start, dims, nbq, P.Lk, "kv_start")
    if alibi_slopes is not None:
        slt = batch_table(as_input(alibi_slopes, "alibi_slopes"), "alibi_slopes", dims, nbq, ctype)
    if sinks is not None:
        snk = sinks_table(sinks, dims, nbq)

    dims[nbq] = P.Lq
    dims[nbq + 1] = P.Dv
    if out is not None:
        check_out(out, nbq + 2, dims, otype, (("q", qa), ("k", ka), ("v", va), ("mask", ma), ("bias", ba)), "out")
    # float16 / bfloat16 results are written by the kernels themselves, each element
    # rounded once: no float32 temporary
    half_out = otype != ctype and ctype == cnp.NPY_FLOAT
    if out is not None and (otype == ctype or half_out) and behaved_array(<cnp.ndarray>out):
        res = <cnp.ndarray>out
    else:
        res = cnp.PyArray_EMPTY(nbq + 2, dims, otype if half_out else ctype, 0)
    if return_weights:
        dims[nbq + 1] = P.Lk
        wts = cnp.PyArray_EMPTY(nbq + 2, dims, ctype, 0)
    if return_lse:
        lse = cnp.PyArray_EMPTY(nbq + 1, dims, ctype, 0)
    # (the converted arrays must outlive the plan, which holds their data pointers)
    if cnp.PyArray_TYPE(qa) != ctype or not behaved_array(qa):
        qa = stored_operand(qa, ctype, False)
    if kq is None and (cnp.PyArray_TYPE(ka) != ctype or not behaved_array(ka)):
        ka = stored_operand(ka, ctype, True)
    if vq is None and (cnp.PyArray_TYPE(va) != ctype or not behaved_array(va)):
        va = stored_operand(va, ctype, True)
    plan_init(&P, qa, ka, va, res)
    plan_options(&P, ma, ba, kvt, slt, wts, lse)
    if kq is not None:
        plan_quantized(&P, &P.k, &P.ks, &P.kz, &P.kgroup, kq, kq.data, kq.scale, kq.zero)
        P.kscale = SCALE_GROUPED
    if vq is not None:
        plan_quantized(&P, &P.v, &P.vs, &P.vz, &P.vgroup, vq, vq.data, vq.scale, vq.zero)
        P.vscale = SCALE_GROUPED
    if snk is not None:
        P.sinks = <const double *>cnp.PyArray_DATA(snk)
    if kst is not None:
        P.has_kvstart = 1
        P.kvstart = <int64_t *>cnp.PyArray_DATA(kst)
    if kkind != SCALE_NONE:
        k_scale = scale_table(k_scale)
        plan_scale(&P, &P.ks, k_scale, kkind)
        P.kscale = kkind
    if vkind != SCALE_NONE:
        v_scale = scale_table(v_scale)
        plan_scale(&P, &P.vs, v_scale, vkind)
        P.vscale = vkind
    plan_run(&P, ctype, num_threads)
    if out is None and cnp.PyArray_TYPE(res) == otype and wts is None and lse is None:
        return res
    return finish_outputs(out, res, wts, lse, ctype, otype)
