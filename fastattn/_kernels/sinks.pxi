# Attention sinks (issue 34): one extra logit per query row, equal to its sink
# (not scaled, soft-capped, biased or masked), whose column is dropped.  It
# enters once, where a row's result is finished (row_unit_finish,
# qvec_unit_finish, and merge_splits for a row whose keys were split): the tile
# loops never see it.  With the running max m and sum l over the keys,
#     lse = log(l exp(m) + exp(sink)),   out = acc exp(m - lse)
# (acc: the unnormalised accumulator, relative to m), computed as a logaddexp so
# that neither a sink far above the scores nor one far below overflows; a row
# without a visible key (l = 0) gives out 0 and lse = sink.

from libc.math cimport log1p


cdef inline double sink_of(const Plan *P, int64_t b, int64_t grp) noexcept nogil:
    """The sink of query head grp of batch element b (P.sinks: a (nbatch * g) table)."""
    return P.sinks[b * P.g + grp]


cdef inline double sink_lse(double m, double l, double sink) noexcept nogil:
    """log(l exp(m) + exp(sink)): a row's lse with its sink (l: the sum over its
    keys relative to m; l = 0 for a row that saw no key: the sink).  NaN in m,
    l or the sink gives NaN."""
    cdef double a
    if l == 0:
        return sink
    a = m + log(l)
    if a >= sink:
        return a + log1p(exp(sink - a))
    if a < sink:
        return sink + log1p(exp(a - sink))
    return a + sink            # NaN (one of them NaN)
