/* Vector primitives on one register of FA_W lanes of FA_T that every
 * instruction set shares: whole loads and stores, broadcast, select, any / all
 * lanes, row max / scale / shift, prefetch hints and the inf/NaN probe of a
 * block.  The ones that differ between instruction sets (partial loads and
 * stores, max, horizontal sum and max, lane bits, transposes, widening of mask
 * bytes) come from the target header (isa/portable.h lists them) under the same
 * FA_SFX names.  Part of the per-type body (simd_body.h): FA_T, FA_V, FA_VI,
 * FA_IT and FA_SFX are defined by simd.h.  Not a standalone header. */

static inline FA_V FA_SFX(fa_load)(const FA_T *p)
{
    FA_V v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void FA_SFX(fa_store)(FA_T *p, FA_V v)
{
    memcpy(p, &v, sizeof v);
}

/* Broadcast.  x - 0 (unlike x + 0) is an exact identity, -0 included, so GCC
 * folds it away and emits a single broadcast. */
static inline FA_V FA_SFX(fa_set1)(FA_T x)
{
    return x - (FA_V){0};
}

/* Lane-wise mask ? a : b, with mask lanes all-ones or all-zeros. */
static inline FA_V FA_SFX(fa_select)(FA_VI mask, FA_V a, FA_V b)
{
    return (FA_V)(((FA_VI)a & mask) | ((FA_VI)b & ~mask));
}

/* 1 if any / every lane of the comparison mask m is set. */
static inline int FA_SFX(fa_any)(FA_VI m)
{
    return FA_SFX(fa_lane_bits)(m) != 0;
}

static inline int FA_SFX(fa_all)(FA_VI m)
{
    return FA_SFX(fa_lane_bits)(m) == (1u << FA_W) - 1;
}

/* max(x[0:n]) with NaN propagation; -inf for n == 0.  Four max chains (one
 * instruction each on x86) and NaN tracked apart by OR-ing x != x. */
static inline FA_T FA_SFX(fa_row_max)(const FA_T *x, int64_t n)
{
    FA_V m0 = FA_SFX(fa_set1)(-(FA_T)INFINITY), m1 = m0, m2 = m0, m3 = m0;
    FA_VI bad = (FA_VI)FA_SFX(fa_set1)(0);
    int64_t j = 0;
    for (; j + 4 * FA_W <= n; j += 4 * FA_W) {
        const FA_V x0 = FA_SFX(fa_load)(x + j), x1 = FA_SFX(fa_load)(x + j + FA_W);
        const FA_V x2 = FA_SFX(fa_load)(x + j + 2 * FA_W), x3 = FA_SFX(fa_load)(x + j + 3 * FA_W);
        m0 = FA_SFX(fa_vmax)(m0, x0);
        m1 = FA_SFX(fa_vmax)(m1, x1);
        m2 = FA_SFX(fa_vmax)(m2, x2);
        m3 = FA_SFX(fa_vmax)(m3, x3);
        bad |= (x0 != x0) | (x1 != x1) | (x2 != x2) | (x3 != x3);
    }
    for (; j + FA_W <= n; j += FA_W) {
        const FA_V x0 = FA_SFX(fa_load)(x + j);
        m0 = FA_SFX(fa_vmax)(m0, x0);
        bad |= x0 != x0;
    }
    if (j < n) {
        const FA_V x0 = FA_SFX(fa_load_part)(x + j, n - j, -(FA_T)INFINITY);
        m1 = FA_SFX(fa_vmax)(m1, x0);
        bad |= x0 != x0;
    }
    m0 = FA_SFX(fa_vmax)(FA_SFX(fa_vmax)(m0, m1), FA_SFX(fa_vmax)(m2, m3));
    return FA_SFX(fa_any)(bad) ? (FA_T)NAN : FA_SFX(fa_hmax)(m0);
}

/* max over the non-NaN elements of x[0:n] (-inf if there are none): four plain
 * max chains, one instruction per vector.  For a softmax whose NaN reaches
 * every output through the sum anyway; fa_row_max when NaN must show in m. */
static inline FA_T FA_SFX(fa_row_max_nonan)(const FA_T *x, int64_t n)
{
    FA_V m0 = FA_SFX(fa_set1)(-(FA_T)INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j + 4 * FA_W <= n; j += 4 * FA_W) {
        /* the load as second operand: a NaN element leaves the chain unchanged */
        m0 = FA_SFX(fa_vmax)(FA_SFX(fa_load)(x + j), m0);
        m1 = FA_SFX(fa_vmax)(FA_SFX(fa_load)(x + j + FA_W), m1);
        m2 = FA_SFX(fa_vmax)(FA_SFX(fa_load)(x + j + 2 * FA_W), m2);
        m3 = FA_SFX(fa_vmax)(FA_SFX(fa_load)(x + j + 3 * FA_W), m3);
    }
    for (; j + FA_W <= n; j += FA_W) m0 = FA_SFX(fa_vmax)(FA_SFX(fa_load)(x + j), m0);
    if (j < n) m1 = FA_SFX(fa_vmax)(FA_SFX(fa_load_part)(x + j, n - j, -(FA_T)INFINITY), m1);
    m0 = FA_SFX(fa_vmax)(FA_SFX(fa_vmax)(m0, m1), FA_SFX(fa_vmax)(m2, m3));
    return FA_SFX(fa_hmax)(m0);
}

/* y[j] = x[j] * a */
static inline void FA_SFX(fa_row_scale)(const FA_T *x, FA_T *y, int64_t n, FA_T a)
{
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W) FA_SFX(fa_store)(y + j, FA_SFX(fa_load)(x + j) * a);
    for (; j < n; j++) y[j] = x[j] * a;
}

/* y[j] = x[j] + a */
static inline void FA_SFX(fa_row_shift)(const FA_T *x, FA_T *y, int64_t n, FA_T a)
{
    int64_t j = 0;
    for (; j + FA_W <= n; j += FA_W) FA_SFX(fa_store)(y + j, FA_SFX(fa_load)(x + j) + a);
    for (; j < n; j++) y[j] = x[j] + a;
}

/* fa_row_scale / fa_row_shift with y written by streaming stores from its first
 * vector-aligned element on (the same values: only the store differs), for a
 * result that will not be read again while it could stay in the caches; the
 * caller fences (fa_stream_fence) before the result is read. */
static inline void FA_SFX(fa_row_scale_stream)(const FA_T *x, FA_T *y, int64_t n, FA_T a)
{
    int64_t j = 0;
    for (; j < n && ((uintptr_t)(y + j) & (FA_VBYTES - 1)); j++) y[j] = x[j] * a;
    for (; j + FA_W <= n; j += FA_W) FA_SFX(fa_stream)(y + j, FA_SFX(fa_load)(x + j) * a);
    for (; j < n; j++) y[j] = x[j] * a;
}

static inline void FA_SFX(fa_row_shift_stream)(const FA_T *x, FA_T *y, int64_t n, FA_T a)
{
    int64_t j = 0;
    for (; j < n && ((uintptr_t)(y + j) & (FA_VBYTES - 1)); j++) y[j] = x[j] + a;
    for (; j + FA_W <= n; j += FA_W) FA_SFX(fa_stream)(y + j, FA_SFX(fa_load)(x + j) + a);
    for (; j < n; j++) y[j] = x[j] + a;
}

/* Prefetch the n elements from p (one hint per cache line).  These loops stream
 * keys and values from memory one row at a time; the hardware prefetcher stops
 * at every 4 KiB page, so a single core only reaches its read bandwidth when the
 * rows a few KiB ahead are already requested.  A hint never faults, so running
 * past the end of an array is harmless. */
static inline void FA_SFX(fa_prefetch)(const FA_T *p, int64_t n)
{
    fa_prefetch_bytes(p, n * (int64_t)sizeof(FA_T));
}

/* Prefetch rows [0, nrows) of n contiguous elements, sr apart. */
static inline void FA_SFX(fa_prefetch_rows)(const FA_T *p, int64_t nrows, int64_t sr, int64_t n)
{
    for (int64_t r = 0; r < nrows; r++) FA_SFX(fa_prefetch)(p + r * sr, n);
}

static inline int64_t FA_SFX(fa_pf_rows)(int64_t row_elems)
{
    return fa_pf_rows_bytes(row_elems * (int64_t)sizeof(FA_T));
}

/* 1 if any element of the rows x cols block (strided) is inf or NaN: x * 0 is 0
 * for finite x and NaN otherwise, accumulated in vectors. */
static inline int FA_SFX(fa_block_nonfinite)(const FA_T *x, int64_t rows, int64_t cols, int64_t sr, int64_t sc)
{
    /* four independent chains: one chain would be bound by the add latency */
    FA_V acc0 = FA_SFX(fa_set1)(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    FA_T probe = 0;
    const int64_t pf = FA_SFX(fa_pf_rows)(cols);
    for (int64_t j = 0; j < rows; j++) {
        const FA_T *row = x + j * sr;
        int64_t c = 0;
        if (sc == 1) {
            FA_SFX(fa_prefetch)(row + pf * sr, cols);
            for (; c + 4 * FA_W <= cols; c += 4 * FA_W) {
                acc0 += FA_SFX(fa_load)(row + c) * 0;
                acc1 += FA_SFX(fa_load)(row + c + FA_W) * 0;
                acc2 += FA_SFX(fa_load)(row + c + 2 * FA_W) * 0;
                acc3 += FA_SFX(fa_load)(row + c + 3 * FA_W) * 0;
            }
            for (; c + FA_W <= cols; c += FA_W) acc0 += FA_SFX(fa_load)(row + c) * 0;
        }
        for (; c < cols; c++) probe += row[c * sc] * 0;
    }
    return probe + FA_SFX(fa_hsum)((acc0 + acc1) + (acc2 + acc3)) != 0;    /* 0 or NaN */
}
