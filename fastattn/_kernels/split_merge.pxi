# Split-KV: the partial results of a unit's key splits combined in split order
# (deterministic, independent of the thread count).

cdef void merge_splits(const Plan *P, int64_t b, int64_t r0, int64_t nr, int64_t nsplit,
                       floating *po, const floating *pm, const double *pl, int64_t stride_split) noexcept nogil:
    """Combine the key splits of rows r0.. of batch b, in split order (deterministic).

    Each split's weight exp(m_split - M) / L is computed once per row; the output
    row is then a sum of whole split rows (a vector loop: with many rows, e.g.
    a query-vectorised unit split in two, the merge must not cost Dv exps per row),
    accumulated in the compute type in the first contributing split's row and
    stored once (a half-precision output is rounded once)."""
    cdef int64_t i, sp, c, grp, pos, Dv = P.Dv, osc = P.o.sc
    cdef floating M, mi, wf
    cdef double L, fac
    cdef double wgt[SPLIT_TARGET]       # exp(m_split - M) of each split (nsplit <= SPLIT_TARGET)
    cdef char *orow
    cdef const floating *src
    cdef floating *acc
    for i in range(nr):
        M = -INFINITY
        for sp in range(nsplit):
            mi = pm[sp * stride_split + i]
            if mi != mi or mi > M:
                M = mi
        grp = (r0 + i) // P.Lq
        pos = r0 + i - grp * P.Lq
        orow = <char *>stored_at(&P.o, batch_offset(P, &P.o, b) + grp * P.o.sg + pos * P.o.sr)
        L = 0
        for sp in range(nsplit):
            mi = pm[sp * stride_split + i]
            # a split that saw no key (max -inf) takes no part
            wgt[sp] = exp(mi - M) if mi != -INFINITY else 0
            if mi != -INFINITY:
                L += pl[sp * stride_split + i] * wgt[sp]
        if M == -INFINITY or not (L > 0 or L != L):
            for c in range(Dv):
                stored_set(P.o.store, orow, c * osc, 0)
            if P.want_lse:
                (<floating *>P.lse.base)[batch_offset(P, &P.lse, b) + grp * P.lse.sg + pos * P.lse.sr] = \
                    <floating>sink_of(P, b, grp) if P.sinks != NULL else -INFINITY
            continue
        # the sink enters once, here: weights exp(m_split - lse) with lse = log(L e^M + e^sink)
        fac = exp(M - sink_lse(M, L, sink_of(P, b, grp))) if P.sinks != NULL else 1 / L
        acc = NULL
        for sp in range(nsplit):
            if pm[sp * stride_split + i] == -INFINITY:
                continue
            src = po + (sp * stride_split + i) * Dv
            wf = <floating>(wgt[sp] / L) if P.sinks == NULL else <floating>(wgt[sp] * fac)
            if acc == NULL:
                acc = po + (sp * stride_split + i) * Dv
                for c in range(Dv):
                    acc[c] = src[c] * wf
            else:
                for c in range(Dv):
                    acc[c] += src[c] * wf
        if osc == 1:
            stored_scale_row_out(P.o.store, acc, orow, Dv, <floating>1)
        else:
            for c in range(Dv):
                stored_set(P.o.store, orow, c * osc, acc[c])
        if P.want_lse:
            (<floating *>P.lse.base)[batch_offset(P, &P.lse, b) + grp * P.lse.sg + pos * P.lse.sr] = \
                <floating>(M + log(L)) if P.sinks == NULL else <floating>sink_lse(M, L, sink_of(P, b, grp))
