# Packed variable-length batches (attention_varlen) and paged caches
# (attention_paged): one work list over (sequence, key/value head, block of
# query rows[, key split]).  Each sequence is a plan of its own -- a view of the
# call's plan with the sequence's query / key counts and the operands' bases
# moved to its first row (or, paged, its block-table row) -- so the units of
# row_unit.pxi and qvec_unit.pxi run it unchanged: grouped heads, every option,
# bottom-right alignment per sequence.  The units are sorted by estimated cost,
# heaviest first, and handed out dynamically, so short and long sequences share
# the cores; units much larger than the average share (long sequences with few
# queries) are split over their keys and merged in split order.  The cuts
# depend on the shapes only: results are the same bits for any thread count.

from libc.stdlib cimport qsort


cdef struct Seqs:
    # the sequences of a call, filled by varlen_entry.pxi; per sequence s:
    int64_t S
    const int64_t *nq          # its query rows
    const int64_t *nk          # its keys
    const int64_t *qo          # element offsets of its first query row in q, out and lse
    const int64_t *oo
    const int64_t *lo
    const int64_t *ko          # ... of its first key in k and v (0 when paged)
    const int64_t *vo
    const int64_t *pages       # paged: its row of the (S, max_blocks) block table; NULL: packed keys
    int64_t max_blocks
    int64_t sinks_stride       # sinks per sequence ((S, Hq) table, paged 4-D q); 0: one table for all


cdef struct WorkItem:
    # one unit: rows r0..r0+nr-1 of key/value heads b..b+nh-1 of sequence s against keys [kb, ke)
    int64_t s, b, nh, r0, nr, kb, ke
    int64_t part               # a key split: its first row in the partial results; -1: a whole unit
    int64_t hstride            # ... and head b + h's, hstride rows on (nh > 1: paged heads in lockstep)
    int qvec                   # the query-vectorised unit (else the row-major one)
    double cost                # the schedule's estimate (rows x keys) ...
    double seq_cost            # ... and that of the unit's sequence


cdef struct MergeItem:
    # the key splits of one unit: split sp's rows start at row part + sp * nr of the partial results
    int64_t s, b, r0, nr, nsplit, part


cdef struct VarThread:
    # a thread's view of the plan and its workspaces (made on first use)
    Plan V
    Workspace *wsr             # row-major units
    Workspace *wsq             # query-vectorised units
    Workspace *wsh[HEADS_LOCKSTEP]  # the units of paged heads in lockstep


cdef inline void seq_view(const Plan *P, const Seqs *Q, Plan *V, int64_t s) noexcept nogil:
    """V (a copy of P) becomes sequence s's plan: its lengths, its rows."""
    V.Lq = Q.nq[s]
    V.Lk = Q.nk[s]
    V.nrows = V.g * V.Lq
    V.q.base = P.q.base + Q.qo[s] * P.q.item
    V.o.base = P.o.base + Q.oo[s] * P.o.item
    if P.want_lse:
        V.lse.base = P.lse.base + Q.lo[s] * P.lse.item
    V.k.base = P.k.base + Q.ko[s] * P.k.item
    V.v.base = P.v.base + Q.vo[s] * P.v.item
    if Q.pages != NULL:
        V.pages = Q.pages + s * Q.max_blocks
    if Q.sinks_stride:
        V.sinks = P.sinks + s * Q.sinks_stride


cdef double unit_cost(const Plan *V, int64_t r0, int64_t nr, int64_t lanes, int64_t *lo, int64_t *hi) noexcept nogil:
    """Rows r0..r0+nr-1 of a sequence's plan V: keys [lo, hi) holding every key
    any of them sees, and the unit's estimated cost, lanes x (visible keys + a
    fixed part), in O(1): causal and window ranges only move forward with the
    position (a row's first and last key never decrease), so the first and last
    positions bound them (rows of several query-head groups: the sequence's)."""
    cdef int64_t g0 = r0 // V.Lq, g1 = (r0 + nr - 1) // V.Lq, p0, p1, l0, h0, l1, h1
    if g0 == g1:
        p0 = r0 - g0 * V.Lq
        p1 = r0 + nr - 1 - g0 * V.Lq
    else:
        p0 = 0
        p1 = V.Lq - 1
    key_range(V, row_diag(V, p0, V.Lk), 0, V.Lk, &l0, &h0)
    key_range(V, row_diag(V, p1, V.Lk), 0, V.Lk, &l1, &h1)
    lo[0] = l0
    hi[0] = h1 if h1 > l0 else l0
    return <double>lanes * (0.5 * <double>((h0 - l0) + (h1 - l1)) + 32)


cdef int cmp_cost(const void *a, const void *b) noexcept nogil:
    """qsort order: the heaviest sequences first, each head's units together
    (the threads share its keys and values in cache), heaviest first within
    it (the last blocks of a causal head), then rows and keys (a fixed order)."""
    cdef const WorkItem *x = <const WorkItem *>a
    cdef const WorkItem *y = <const WorkItem *>b
    if x.seq_cost != y.seq_cost:
        return -1 if x.seq_cost > y.seq_cost else 1
    if x.s != y.s:
        return -1 if x.s < y.s else 1
    if x.b != y.b:
        return -1 if x.b < y.b else 1
    if x.cost != y.cost:
        return -1 if x.cost > y.cost else 1
    if x.r0 != y.r0:
        return -1 if x.r0 < y.r0 else 1
    return -1 if x.kb < y.kb else (1 if x.kb > y.kb else 0)


cdef int64_t varlen_work(const Plan *P, const Seqs *Q) noexcept nogil:
    """plan_work over the sequences: below PARALLEL_MIN_WORK a call runs on one thread."""
    cdef int64_t s, w = 0
    for s in range(Q.S):
        w += P.nbatch * P.g * Q.nq[s] * (Q.nk[s] + 1) * (P.Dk + P.Dv + 1)
    return w


cdef inline int64_t qvec_unit_rows(const Plan *P, size_t item) noexcept nogil:
    """Query rows per query-vectorised unit of a packed or paged call.  Tiles the
    unit copies into its workspace -- paged blocks too small to read a tile in
    place (paged_tile_kind of a block-aligned tile), keys or values
    of another storage type (widened) -- are copied once per unit and tile: twice
    the rows per unit, half the copies.  Measured (AMD EPYC Zen 4, AVX-512, one
    thread, S4 Hq32 Hkv8 Lq256 against 2304 keys, D 128, blocks of 16 shuffled)
    the copy was 14 % of the call at 128 rows."""
    cdef int native = STORE_F32 if item == 4 else STORE_F64
    if (P.pages != NULL and paged_tile_kind(P, 0, BLOCK_K) == TILE_COPY) or P.k.store != native or P.v.store != native:
        return BLOCK_Q_QVEC_COPY
    return BLOCK_Q_QVEC


cdef int run_item(const Plan *P, const Seqs *Q, VarThread *ts, const WorkItem *it, floating *po, floating *pm,
                  double *pl) noexcept nogil:
    """One unit of the work list on the thread's view; -1 when its workspace
    cannot be allocated."""
    cdef Plan *V = &ts.V
    cdef int mode = MODE_PARTIAL if it.part >= 0 else MODE_ONLINE
    cdef floating *o = po + it.part * P.Dv if it.part >= 0 else NULL
    cdef floating *m = pm + it.part if it.part >= 0 else NULL
    cdef double *l = pl + it.part if it.part >= 0 else NULL
    cdef int64_t h
    seq_view(P, Q, V, it.s)
    if it.nh > 1:
        for h in range(it.nh):
            if ts.wsh[h] == NULL:
                ts.wsh[h] = workspace_new(V, FEW_MAX_ROWS, sizeof(floating), 0)
                if ts.wsh[h] == NULL:
                    return -1
        run_paged_heads(V, ts.wsh, it.b, it.nh, it.nr, it.kb, it.ke, mode, o, m, l, it.hstride)
    elif it.qvec:
        if ts.wsq == NULL:
            ts.wsq = workspace_new(V, qvec_unit_rows(V, sizeof(floating)), sizeof(floating), 1)
            if ts.wsq == NULL:
                return -1
        run_qvec_unit(V, ts.wsq, it.b, it.r0, it.nr, it.kb, it.ke, mode, <floating *>NULL, o, m, l)
    else:
        if ts.wsr == NULL:
            ts.wsr = workspace_new(V, BLOCK_Q, sizeof(floating), 0)
            if ts.wsr == NULL:
                return -1
        run_row_unit(V, ts.wsr, it.b, it.r0, it.nr, it.kb, it.ke, mode, <floating *>NULL, o, m, l)
    return 0


cdef VarThread *var_thread_new(const Plan *P) noexcept nogil:
    cdef VarThread *ts = <VarThread *>fa_alloc(sizeof(VarThread))
    cdef int h
    if ts != NULL:
        ts.V = P[0]
        ts.wsr = NULL
        ts.wsq = NULL
        for h in range(HEADS_LOCKSTEP):
            ts.wsh[h] = NULL
    return ts


cdef void var_thread_delete(VarThread *ts) noexcept nogil:
    cdef int h
    if ts != NULL:
        workspace_delete(ts.wsr)
        workspace_delete(ts.wsq)
        for h in range(HEADS_LOCKSTEP):
            workspace_delete(ts.wsh[h])
        fa_free(ts)


cdef int64_t work_list(const Plan *P, const Seqs *Q, size_t item, WorkItem *items, MergeItem *merges,
                       int64_t *nmerge, int64_t *nparts) noexcept nogil:
    """The units of a call (items, merges NULL: only count them): per sequence
    with queries, per key/value head (paged decode: per group of up to
    HEADS_LOCKSTEP heads, lockstep_heads), blocks of query rows (qvec_unit_rows
    on the query-vectorised path, BLOCK_Q on the row-major one); a unit split
    over its keys when it costs more than 1 / SPLIT_TARGET of the whole call
    (at least SPLIT_MIN_KEYS(_QVEC) keys per split).  Returns the number of
    items; nmerge / nparts: the split units (per head) and their partial-result
    rows."""
    cdef Plan V = P[0]
    cdef int64_t W = FA_VBYTES // <int64_t>item
    cdef int64_t s, b, h, nh, group, blk, nblk, bq, r0, nr, lo, hi, nsplit, chunk, sp, min_keys, n = 0, lanes
    cdef double total = 0, c, target, seq_cost
    cdef int qvec
    # the whole call's cost first: each unit's share of it decides its splits
    for s in range(Q.S):
        if Q.nq[s] == 0:
            continue
        seq_view(P, Q, &V, s)
        qvec = use_qvec_path(V.nrows, item)
        bq = qvec_unit_rows(P, item) if qvec else BLOCK_Q
        nblk = (V.nrows + bq - 1) // bq
        for blk in range(nblk):
            r0 = blk * bq
            nr = min(bq, V.nrows - r0)
            total += unit_cost(&V, r0, nr, round_up(nr, W) if qvec else nr, &lo, &hi)
    total *= P.nbatch
    target = total / SPLIT_TARGET
    nmerge[0] = 0
    nparts[0] = 0
    for s in range(Q.S):
        if Q.nq[s] == 0:
            continue
        seq_view(P, Q, &V, s)
        qvec = use_qvec_path(V.nrows, item)
        bq = qvec_unit_rows(P, item) if qvec else BLOCK_Q
        min_keys = SPLIT_MIN_KEYS_QVEC if qvec else SPLIT_MIN_KEYS
        group = HEADS_LOCKSTEP if not qvec and lockstep_heads(&V, V.nrows, item) else 1
        nblk = (V.nrows + bq - 1) // bq
        seq_cost = 0
        for blk in range(nblk):
            r0 = blk * bq
            nr = min(bq, V.nrows - r0)
            seq_cost += unit_cost(&V, r0, nr, round_up(nr, W) if qvec else nr, &lo, &hi)
        for blk in range(nblk):
            r0 = blk * bq
            nr = min(bq, V.nrows - r0)
            lanes = round_up(nr, W) if qvec else nr
            b = 0
            while b < P.nbatch:
                nh = min(group, P.nbatch - b)
                c = nh * unit_cost(&V, r0, nr, lanes, &lo, &hi)
                nsplit = 1
                if c > target and hi - lo >= 2 * min_keys:
                    nsplit = <int64_t>(c / target) + 1
                    nsplit = min(nsplit, min((hi - lo) // min_keys, <int64_t>SPLIT_TARGET))
                    chunk = round_up((hi - lo + nsplit - 1) // nsplit, BLOCK_K)
                    nsplit = (hi - lo + chunk - 1) // chunk
                for sp in range(nsplit):
                    if items != NULL:
                        items[n].s, items[n].b, items[n].nh, items[n].r0, items[n].nr = s, b, nh, r0, nr
                        items[n].qvec, items[n].cost, items[n].seq_cost = qvec, c / nsplit, seq_cost
                        if nsplit == 1:
                            items[n].kb, items[n].ke, items[n].part, items[n].hstride = 0, V.Lk, -1, 0
                        else:
                            items[n].kb = lo + sp * chunk
                            items[n].ke = min(hi, lo + (sp + 1) * chunk)
                            items[n].part = nparts[0] + sp * nr
                            items[n].hstride = nsplit * nr
                    n += 1
                if nsplit == 1:
                    b += nh
                    continue
                for h in range(nh):
                    if merges != NULL:
                        merges[nmerge[0]].s, merges[nmerge[0]].b, merges[nmerge[0]].r0 = s, b + h, r0
                        merges[nmerge[0]].nr, merges[nmerge[0]].nsplit = nr, nsplit
                        merges[nmerge[0]].part = nparts[0] + h * nsplit * nr
                    nmerge[0] += 1
                nparts[0] += nh * nsplit * nr
                b += nh
    return n


cdef int varlen_run(const Plan *P, const Seqs *Q, floating dummy, int nthreads) except -1:
    """Run every unit of a packed or paged call, then merge the split ones."""
    cdef int64_t nmerge = 0, nparts = 0, n, i
    cdef WorkItem *items = NULL
    cdef MergeItem *merges = NULL
    cdef floating *po = NULL
    cdef floating *pm = NULL
    cdef double *pl = NULL
    cdef VarThread *ts
    cdef const MergeItem *mi
    cdef int failed = 0
    cdef int *failed_p = &failed    # written through the pointer: shared by all threads
    cdef int use_threads = nthreads > 1 and varlen_work(P, Q) > PARALLEL_MIN_WORK
    cdef int stop = 0
    cdef int *stop_p = &stop        # set when Ctrl-C interrupts a long call (interrupt_check)
    # long calls check for Ctrl-C between items (on the calling thread only)
    cdef bint interruptible = varlen_work(P, Q) > INTERRUPT_MIN_WORK
    cdef double next_check = fa_seconds() + INTERRUPT_EVERY if interruptible else 0
    n = work_list(P, Q, sizeof(floating), NULL, NULL, &nmerge, &nparts)
    if n == 0:
        return 0
    items = <WorkItem *>fa_alloc(n * sizeof(WorkItem))
    merges = <MergeItem *>fa_alloc((nmerge if nmerge > 0 else 1) * sizeof(MergeItem))
    if nparts > 0:
        po = <floating *>fa_alloc(nparts * (P.Dv if P.Dv > 0 else 1) * sizeof(floating))
        pm = <floating *>fa_alloc(nparts * sizeof(floating))
        pl = <double *>fa_alloc(nparts * sizeof(double))
    if items == NULL or merges == NULL or (nparts > 0 and (po == NULL or pm == NULL or pl == NULL)):
        fa_free(items)
        fa_free(merges)
        fa_free(po)
        fa_free(pm)
        fa_free(pl)
        raise MemoryError()
    work_list(P, Q, sizeof(floating), items, merges, &nmerge, &nparts)
    qsort(items, n, sizeof(WorkItem), cmp_cost)
    if not use_threads:
        with nogil:
            ts = var_thread_new(P)
            if ts == NULL:
                failed = 1
            else:
                for i in range(n):
                    if interruptible and interrupt_check(stop_p, &next_check):
                        break
                    if run_item(P, Q, ts, &items[i], po, pm, pl):
                        failed = 1
                        break
                for i in range(nmerge):
                    if not failed and not stop:
                        mi = &merges[i]
                        seq_view(P, Q, &ts.V, mi.s)
                        merge_splits(&ts.V, mi.b, mi.r0, mi.nr, mi.nsplit, po + mi.part * P.Dv, pm + mi.part,
                                     pl + mi.part, mi.nr)
            var_thread_delete(ts)
    else:
        with nogil, parallel(num_threads=nthreads):
            # every thread must reach the worksharing loops (OpenMP requires it):
            # a failed allocation only disables the thread's share of work
            ts = var_thread_new(P)
            if ts == NULL:
                failed_p[0] = 1
            for i in prange(n, schedule='dynamic'):
                if ts != NULL and not stop_p[0]:
                    if interruptible and threadid() == 0 and interrupt_check(stop_p, &next_check):
                        continue
                    if run_item(P, Q, ts, &items[i], po, pm, pl):
                        failed_p[0] = 1
            for i in prange(nmerge, schedule='static'):
                if ts != NULL and not failed_p[0] and not stop_p[0]:
                    mi = &merges[i]
                    seq_view(P, Q, &ts.V, mi.s)
                    merge_splits(&ts.V, mi.b, mi.r0, mi.nr, mi.nsplit, po + mi.part * P.Dv, pm + mi.part,
                                 pl + mi.part, mi.nr)
            var_thread_delete(ts)
    fa_free(items)
    fa_free(merges)
    fa_free(po)
    fa_free(pm)
    fa_free(pl)
    if stop:
        return -1           # interrupted (KeyboardInterrupt set): no result
    if failed:
        raise MemoryError("fastattn: could not allocate the per-thread attention workspace")
    return 0


cdef int varlen_execute(const Plan *P, const Seqs *Q, int typenum, num_threads) except -1:
    """Run a packed or paged call in its compute type; the thread count is asked
    of fastattn._threads only when the call is large enough for threads."""
    cdef int nthreads = 1
    if P.nbatch == 0 or Q.S == 0:
        return 0
    if varlen_work(P, Q) > PARALLEL_MIN_WORK:
        nthreads = _thread_resolver(num_threads)
    if typenum == cnp.NPY_FLOAT:
        varlen_run(P, Q, <float>0, nthreads)
    else:
        varlen_run(P, Q, <double>0, nthreads)
    return 0
