/* Vector primitives on one register of FA_W lanes of FA_T: loads and stores
 * (whole and partial), broadcast, select, horizontal sum and max, lane masks,
 * the in-register W x W transpose, row max / scale / shift, prefetch hints and
 * the inf/NaN probe of a block.  Part of the per-type body (simd_body.h): FA_T,
 * FA_V, FA_VI, FA_IT and FA_SFX are defined by simd.h.  Not a standalone header. */

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

/* p[0:n] with the lanes from n on set to fill (0 <= n <= W).  One masked load
 * where the ISA has one: lanes past n are not read, so p + n may be the end of
 * an array, and no store-forwarding stall (a row of scalar stores read back as
 * one vector waits for every store to retire: on the short score rows of a
 * small problem, where every row ends in a partial vector, that stall was a
 * large part of the row's softmax). */
static inline FA_V FA_SFX(fa_load_part)(const FA_T *p, int64_t n, FA_T fill)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  ifdef FA_DOUBLE
    return (FA_V)_mm512_mask_loadu_pd(_mm512_set1_pd(fill), (__mmask8)((1u << n) - 1), p);
#  else
    return (FA_V)_mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << n) - 1), p);
#  endif
#elif FA_VBYTES == 32 && defined(__AVX2__)
#  ifdef FA_DOUBLE
    const __m256i k = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
    return (FA_V)_mm256_blendv_pd(_mm256_set1_pd(fill), _mm256_maskload_pd(p, k), _mm256_castsi256_pd(k));
#  else
    const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return (FA_V)_mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, k), _mm256_castsi256_ps(k));
#  endif
#else
    FA_T tmp[FA_W];
    for (int i = 0; i < FA_W; i++) tmp[i] = i < n ? p[i] : fill;
    return FA_SFX(fa_load)(tmp);
#endif
}

/* p[0:n] = the first n lanes of v (0 <= n <= W): a masked store on AVX-512;
 * elsewhere one vector store to the stack copied out lane by lane (a vector
 * store read back in smaller pieces forwards without a stall; AVX2's masked
 * store, vmaskmovps, is microcoded on AMD cores). */
static inline void FA_SFX(fa_store_part)(FA_T *p, FA_V v, int64_t n)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  ifdef FA_DOUBLE
    _mm512_mask_storeu_pd(p, (__mmask8)((1u << n) - 1), (__m512d)v);
#  else
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#  endif
#else
    FA_T tmp[FA_W];
    FA_SFX(fa_store)(tmp, v);
    for (int64_t i = 0; i < n; i++) p[i] = tmp[i];
#endif
}

#if FA_HAVE_SHUFFLE
/* The mask c ^ h (lanes c < W, h < W <= 16) read from a constant table, so the
 * compiler sees a constant: a mask built lane by lane is built at run time. */
static inline FA_VI FA_SFX(fa_xor_mask)(int h)
{
    static const FA_IT t[4][16] = {
        {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14},
        {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
        {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
        {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
    };
    FA_VI v;
    memcpy(&v, t[__builtin_ctz(h)], sizeof v);
    return v;
}
#endif

/* Sum and max of the W lanes of v as a butterfly (log2 W shuffle + add steps),
 * not a chain of W dependent scalar adds: the dot products of the decode path
 * end in one of these per key and row.  Fixed order, so deterministic.  GCC's
 * __builtin_shuffle; elsewhere the scalar loop.  fa_hmax: no NaN lanes. */
static inline FA_T FA_SFX(fa_hsum)(FA_V v)
{
#if FA_HAVE_SHUFFLE
    FA_UNROLL for (int h = FA_W / 2; h >= 1; h /= 2) v += __builtin_shuffle(v, FA_SFX(fa_xor_mask)(h));
    return v[0];
#else
    FA_T s = 0;
    for (int i = 0; i < FA_W; i++) s += v[i];
    return s;
#endif
}

static inline FA_T FA_SFX(fa_hmax)(FA_V v)
{
#if FA_HAVE_SHUFFLE
    FA_UNROLL for (int h = FA_W / 2; h >= 1; h /= 2)
        v = FA_SFX(FA_VMAX)(v, __builtin_shuffle(v, FA_SFX(fa_xor_mask)(h)));
    return v[0];
#else
    FA_T m = v[0];
    for (int i = 1; i < FA_W; i++) m = v[i] > m ? v[i] : m;
    return m;
#endif
}

/* The lanes of a comparison mask m (each lane all ones or all zeros) as the low
 * W bits of an int: one movemask / test where x86 has one (a loop over the
 * lanes extracts them one by one). */
static inline unsigned FA_SFX(fa_lane_bits)(FA_VI m)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  ifdef FA_DOUBLE
    return _mm512_test_epi64_mask((__m512i)m, (__m512i)m);
#  else
    return _mm512_test_epi32_mask((__m512i)m, (__m512i)m);
#  endif
#elif FA_VBYTES == 32 && defined(__AVX2__)
#  ifdef FA_DOUBLE
    return (unsigned)_mm256_movemask_pd((__m256d)m);
#  else
    return (unsigned)_mm256_movemask_ps((__m256)m);
#  endif
#elif FA_VBYTES == 16 && defined(__SSE2__)
#  ifdef FA_DOUBLE
    return (unsigned)_mm_movemask_pd((__m128d)m);
#  else
    return (unsigned)_mm_movemask_ps((__m128)m);
#  endif
#else
    unsigned bits = 0;
    for (int i = 0; i < FA_W; i++) bits |= (unsigned)(m[i] != 0) << i;
    return bits;
#endif
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
        m0 = FA_SFX(FA_VMAX)(m0, x0);
        m1 = FA_SFX(FA_VMAX)(m1, x1);
        m2 = FA_SFX(FA_VMAX)(m2, x2);
        m3 = FA_SFX(FA_VMAX)(m3, x3);
        bad |= (x0 != x0) | (x1 != x1) | (x2 != x2) | (x3 != x3);
    }
    for (; j + FA_W <= n; j += FA_W) {
        const FA_V x0 = FA_SFX(fa_load)(x + j);
        m0 = FA_SFX(FA_VMAX)(m0, x0);
        bad |= x0 != x0;
    }
    if (j < n) {
        const FA_V x0 = FA_SFX(fa_load_part)(x + j, n - j, -(FA_T)INFINITY);
        m1 = FA_SFX(FA_VMAX)(m1, x0);
        bad |= x0 != x0;
    }
    m0 = FA_SFX(FA_VMAX)(FA_SFX(FA_VMAX)(m0, m1), FA_SFX(FA_VMAX)(m2, m3));
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
        m0 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j), m0);
        m1 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j + FA_W), m1);
        m2 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j + 2 * FA_W), m2);
        m3 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j + 3 * FA_W), m3);
    }
    for (; j + FA_W <= n; j += FA_W) m0 = FA_SFX(FA_VMAX)(FA_SFX(fa_load)(x + j), m0);
    if (j < n) m1 = FA_SFX(FA_VMAX)(FA_SFX(fa_load_part)(x + j, n - j, -(FA_T)INFINITY), m1);
    m0 = FA_SFX(FA_VMAX)(FA_SFX(FA_VMAX)(m0, m1), FA_SFX(FA_VMAX)(m2, m3));
    return FA_SFX(fa_hmax)(m0);
}

/* In-register transpose of a W x W block: r[a][c] -> r[c][a].  At each level h
 * the off-diagonal h x h blocks of every 2h x 2h block swap (two two-source
 * shuffles per row pair, vpermt2ps on AVX-512).  Only with FA_HAVE_SHUFFLE;
 * without it callers use scalar code. */
#if FA_HAVE_SHUFFLE
/* Masks of the transpose step h (below) for W lanes, from constant tables:
 * built lane by lane, GCC assembles them at run time on every call. */
static inline void FA_SFX(fa_transpose_masks)(int h, FA_VI *ma, FA_VI *mb)
{
    /* [log2 W - 1][log2 h][lane]: ma picks lane c of A (c & h == 0) or lane
     * c - h of B; mb lane c + h of A or lane c of B (B's lanes numbered from W) */
    static const FA_IT ta[4][4][16] = {
        {{0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{0, 4, 2, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 4, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{0, 8, 2, 10, 4, 12, 6, 14, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 8, 9, 4, 5, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 2, 3, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}, {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}, {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}, {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}},
    };
    static const FA_IT tb[4][4][16] = {
        {{1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{1, 5, 3, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 3, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{1, 9, 3, 11, 5, 13, 7, 15, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 3, 10, 11, 6, 7, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0}, {4, 5, 6, 7, 12, 13, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {{1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}, {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}, {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
    };
    memcpy(ma, ta[__builtin_ctz(FA_W) - 1][__builtin_ctz(h)], sizeof *ma);
    memcpy(mb, tb[__builtin_ctz(FA_W) - 1][__builtin_ctz(h)], sizeof *mb);
}

static inline __attribute__((always_inline)) void FA_SFX(fa_transpose)(FA_V *r)
{
    FA_UNROLL for (int h = FA_W / 2; h >= 1; h /= 2) {
        FA_VI ma, mb;
        FA_SFX(fa_transpose_masks)(h, &ma, &mb);
        FA_UNROLL for (int a = 0; a < FA_W; a++)
            if (!(a & h)) {
                const FA_V A = r[a], B = r[a + h];
                r[a] = __builtin_shuffle(A, B, ma);
                r[a + h] = __builtin_shuffle(A, B, mb);
            }
    }
}
#endif

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

/* W bytes, zero-extended to the W lanes of an integer vector: one vpmovzxb{d,q}
 * where the ISA has it (GCC lowers __builtin_convertvector between vectors of
 * different sizes, and a loop of element inserts, to a vpinsr per lane). */
static inline FA_VI FA_SFX(fa_widen_bytes)(const uint8_t *b)
{
#if FA_VBYTES == 64 && defined(__AVX512F__)
#  ifdef FA_DOUBLE
    return (FA_VI)_mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)b));
#  else
    return (FA_VI)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
#  endif
#elif FA_VBYTES == 32 && defined(__AVX2__)
#  ifdef FA_DOUBLE
    int32_t w;
    memcpy(&w, b, sizeof w);
    return (FA_VI)_mm256_cvtepu8_epi64(_mm_cvtsi32_si128(w));
#  else
    return (FA_VI)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
#  endif
#else
    FA_VI k;
    for (int l = 0; l < FA_W; l++) k[l] = b[l];
    return k;
#endif
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
