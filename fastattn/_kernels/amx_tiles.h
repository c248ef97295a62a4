/* AMX tiles for the query-vectorised unit's bfloat16 Q.K^T and P.V (targets
 * that define FA_HAVE_AMX: the avx512_amx variant, Sapphire Rapids and later
 * Xeons).  Included by bf16_dot.h, whose pair dot product kernels call these
 * first and do what is left (key rows past the last full block of 16, widths
 * the tiles do not divide).
 *
 * TDPBF16PS C[m][n] += sum_k A.bf16[m][2k] B.bf16[k][2n] + A.bf16[m][2k+1]
 * B.bf16[k][2n+1] over 16 x 16 float32 C, 16 x 32 bfloat16 A and 16 x (16
 * pairs) B: the products exact, the sums float32, subnormal inputs read as zero
 * (as VDPBF16PS).  Every tile here is 16 rows of 64 bytes (one configuration,
 * fa_amx_begin):
 *
 * - scores, keys x query lanes (the unit's St): A = 16 key rows read in place
 *   (32 d of each), B = 16 rows of Q2 (the unit's query pairs, bf16_dot.h), C =
 *   16 rows of St; the scale multiplies the sums once, as fa_qvec_qk_micro_bd.
 * - P.V, columns x query lanes (the unit's transposed output Ot): A = 16 rows
 *   of the value tile transposed (column c: 16 pairs of keys, fa_amx_pack_values),
 *   B = 16 rows of P2 (the probabilities' bfloat16 pairs the softmax writes in
 *   place of St), C = the tile's sums, added to Ot times f as fa_qvec_pv_micro_bd.
 *
 * A tile configuration is loaded by the first tile kernel a query unit calls
 * (fa_amx_use) and released when the unit ends (fa_amx_unit_end: TILERELEASE,
 * run_qvec_unit), so no other library's tile state is assumed or left behind
 * between units; within a unit only these kernels run on the thread.  Loading
 * and releasing cost ~250 cycles, once per unit instead of twice per chunk.
 * Linux grants a process the tile state only on request
 * (arch_prctl(ARCH_REQ_XCOMP_PERM)): the CPU-feature module asks before the
 * dispatcher may choose this target (fastattn/_kernels/_cpu.pyx). */

#define FA_AMX 1
/* 32-bit words per row of the transposed value tile: pairs of a tile's keys
 * (BLOCK_K = 128 in plan.pxi), a multiple of 16 */
#define FA_AMX_VT_LD 64

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} fa_amx_config;

static inline void fa_amx_begin(void)
{
    fa_amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

static inline void fa_amx_end(void) { _tile_release(); }

/* whether this thread's tiles hold fa_amx_begin's configuration (set by
 * fa_amx_use, cleared by fa_amx_unit_end) */
static __thread int fa_amx_live;

static inline void fa_amx_use(void)
{
    if (!fa_amx_live) {
        fa_amx_begin();
        fa_amx_live = 1;
    }
}

static inline void fa_amx_unit_end(void)
{
    if (fa_amx_live) {
        fa_amx_end();
        fa_amx_live = 0;
    }
}

/* St rows [0, 16) for nv (<= 4) vectors of lanes: C tiles 0-3, A tile 4 (keys),
 * B tiles 5 and 6 (query pairs) */
static inline void fa_amx_qk16(const uint16_t *k, int64_t ksr, const float *q2, int64_t ldq, int64_t D2,
                               float *st, int64_t lds, int nv)
{
    const int64_t sa = ksr * 2, sb = ldq * 4, sc = lds * 4;
    _tile_zero(0);
    if (nv > 1) _tile_zero(1);
    if (nv > 2) _tile_zero(2);
    if (nv > 3) _tile_zero(3);
    for (int64_t p = 0; p < D2; p += 16) {
        const float *b = q2 + p * ldq;
        _tile_loadd(4, k + 2 * p, sa);
        _tile_loadd(5, b, sb);
        _tile_dpbf16ps(0, 4, 5);
        if (nv > 1) {
            _tile_loadd(6, b + FA_WF, sb);
            _tile_dpbf16ps(1, 4, 6);
        }
        if (nv > 2) {
            _tile_loadd(5, b + 2 * FA_WF, sb);
            _tile_dpbf16ps(2, 4, 5);
        }
        if (nv > 3) {
            _tile_loadd(6, b + 3 * FA_WF, sb);
            _tile_dpbf16ps(3, 4, 6);
        }
    }
    _tile_stored(0, st, sc);
    if (nv > 1) _tile_stored(1, st + FA_WF, sc);
    if (nv > 2) _tile_stored(2, st + 2 * FA_WF, sc);
    if (nv > 3) _tile_stored(3, st + 3 * FA_WF, sc);
}

/* the 16 key rows of D bfloat16 at pk, ksr apart, requested (a tile load
 * waits for all 16) */
static inline __attribute__((always_inline)) void fa_amx_prefetch16(const uint16_t *pk, int64_t ksr, int64_t D)
{
    for (int r = 0; r < 16; r++)
        for (int64_t b = 0; b < 2 * D; b += 64)
            __builtin_prefetch((const char *)(pk + r * ksr) + b, 0, 3);
}

/* 16 rows of St after the tiles: scaled (unless scale is 1) and their max
 * per lane into m; row r of the 16 key rows at pk (or NULL) requested on the
 * way (fa_amx_prefetch16, spread over the pass) */
static inline __attribute__((always_inline)) void
fa_amx_qk_post(float *sj, int64_t lds, float scale, fa_v_f m[4], int nv, const uint16_t *pk, int64_t ksr,
               int64_t D)
{
    const fa_v_f s = fa_set1_f(scale);
    for (int r = 0; r < 16; r++) {
        if (pk)
            for (int64_t b = 0; b < 2 * D; b += 64)
                __builtin_prefetch((const char *)(pk + r * ksr) + b, 0, 3);
        for (int v = 0; v < nv; v++) {
            fa_v_f x = fa_load_f(sj + r * lds + v * FA_WF);
            if (scale != 1.0f) {
                x = x * s;
                fa_store_f(sj + r * lds + v * FA_WF, x);
            }
            m[v] = fa_vmax_f(x, m[v]);
        }
    }
}

/* The full blocks of 16 key rows of [j0, j1) (fa_qvec_qk_chunk_bd's
 * arguments): scaled scores into St and, with mx, the max per lane.  Returns
 * where the rows it left begin (j0 when it did nothing). */
static int64_t fa_amx_qk_chunk(const uint16_t *k, int64_t ksr, const float *q2, int64_t ldq, int64_t D,
                               float scale, float *st, int64_t lds, int64_t j0, int64_t j1, float *mx, int nv)
{
    if (D % 32 != 0 || D <= 0 || j1 - j0 < 16 || nv > 4)
        return j0;
    fa_v_f m[4];
    for (int v = 0; v < nv; v++)
        m[v] = mx ? fa_load_f(mx + v * FA_WF) : fa_set1_f(-INFINITY);
    int64_t j = j0;
    fa_amx_use();
    /* software-pipelined: block j's tiles are stored, then block j - 16 (stored
     * one block earlier: its tile stores have left the store buffer) is
     * scaled and its max taken, while the tiles of block j are still on their
     * way; the key rows of block j + 32 are requested in that pass */
    if (j + 32 <= j1)
        fa_amx_prefetch16(k + (j + 16) * ksr, ksr, D);
    for (; j + 16 <= j1; j += 16) {
        fa_amx_qk16(k + j * ksr, ksr, q2, ldq, D / 2, st + j * lds, lds, nv);
        if (j > j0)
            fa_amx_qk_post(st + (j - 16) * lds, lds, scale, m, nv, j + 48 <= j1 ? k + (j + 32) * ksr : NULL,
                           ksr, D);
    }
    fa_amx_qk_post(st + (j - 16) * lds, lds, scale, m, nv, NULL, ksr, D);
    if (mx)
        for (int v = 0; v < nv; v++) fa_store_f(mx + v * FA_WF, m[v]);
    return j;
}

/* 16 x 16 32-bit words transposed in registers: four rounds of VPERMT2D, each
 * swapping the off-diagonal h x h blocks of every 2h x 2h block (h = 8, 4, 2,
 * 1; the index vectors are constants, the loops unrolled) */
#define FA_AMX_TR_ROUND(H, IL, IH) do {                                         \
        FA_UNROLL for (int i = 0; i < 16; i++) {                                \
            if (i & (H)) continue;                                              \
            const __m512i a_ = r[i], b_ = r[i + (H)];                           \
            r[i] = _mm512_permutex2var_epi32(a_, IL, b_);                       \
            r[i + (H)] = _mm512_permutex2var_epi32(a_, IH, b_);                 \
        }                                                                       \
    } while (0)
static inline __attribute__((always_inline)) void fa_amx_transpose16(__m512i r[16])
{
    /* lo[c] = c & h ? 16 + c - h : c;  hi[c] = c & h ? 16 + c : c + h  (listed high to low) */
    FA_AMX_TR_ROUND(8, _mm512_set_epi32(23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0),
                    _mm512_set_epi32(31, 30, 29, 28, 27, 26, 25, 24, 15, 14, 13, 12, 11, 10, 9, 8));
    FA_AMX_TR_ROUND(4, _mm512_set_epi32(27, 26, 25, 24, 11, 10, 9, 8, 19, 18, 17, 16, 3, 2, 1, 0),
                    _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 23, 22, 21, 20, 7, 6, 5, 4));
    FA_AMX_TR_ROUND(2, _mm512_set_epi32(29, 28, 13, 12, 25, 24, 9, 8, 21, 20, 5, 4, 17, 16, 1, 0),
                    _mm512_set_epi32(31, 30, 15, 14, 27, 26, 11, 10, 23, 22, 7, 6, 19, 18, 3, 2));
    FA_AMX_TR_ROUND(1, _mm512_set_epi32(30, 14, 28, 12, 26, 10, 24, 8, 22, 6, 20, 4, 18, 2, 16, 0),
                    _mm512_set_epi32(31, 15, 29, 13, 27, 11, 25, 9, 23, 7, 21, 5, 19, 3, 17, 1));
}
#undef FA_AMX_TR_ROUND

/* The value tile for fa_amx_pv from n (<= 2 FA_AMX_VT_LD) bfloat16 rows at v
 * (rows vsr, elements vsc apart), Dv a multiple of 16: row c of vt (FA_AMX_VT_LD
 * words apart) holds (v[2p][c], v[2p + 1][c]) as word p, the partner of an odd
 * n's last row 0, words up to the next multiple of 16 zero.  Returns whether any
 * value is an inf or NaN (the unit then widens the tile instead). */
static int fa_amx_pack_values(const uint16_t *v, int64_t vsr, int64_t vsc, int64_t n, int64_t Dv, uint32_t *vt)
{
    const int64_t np = (n + 1) / 2, npr = (np + 15) & ~(int64_t)15;
    if (np > FA_AMX_VT_LD)
        return 1;
    uint32_t nf = 0;
    if (vsc != 1) {
        for (int64_t c = 0; c < Dv; c++)
            for (int64_t p = 0; p < npr; p++) {
                const uint32_t a = 2 * p < n ? v[2 * p * vsr + c * vsc] : 0;
                const uint32_t b = 2 * p + 1 < n ? v[(2 * p + 1) * vsr + c * vsc] : 0;
                nf |= ((a & 0x7f80u) == 0x7f80u) | ((b & 0x7f80u) == 0x7f80u);
                vt[c * FA_AMX_VT_LD + p] = a | (b << 16);
            }
        return nf != 0;
    }
    const __m256i e = _mm256_set1_epi16(0x7f80);
    for (int64_t p0 = 0; p0 < npr; p0 += 16)
        for (int64_t c0 = 0; c0 < Dv; c0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const int64_t k0 = 2 * (p0 + i);
                const __m256i a = k0 < n ? _mm256_loadu_si256((const __m256i *)(v + k0 * vsr + c0))
                                         : _mm256_setzero_si256();
                const __m256i b = k0 + 1 < n ? _mm256_loadu_si256((const __m256i *)(v + (k0 + 1) * vsr + c0))
                                             : _mm256_setzero_si256();
                nf |= _mm256_cmpeq_epi16_mask(_mm256_and_si256(a, e), e) |
                      _mm256_cmpeq_epi16_mask(_mm256_and_si256(b, e), e);
                r[i] = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
            }
            fa_amx_transpose16(r);
            for (int c = 0; c < 16; c++)
                _mm512_storeu_si512(vt + (c0 + c) * FA_AMX_VT_LD + p0, r[c]);
        }
    return nf != 0;
}

/* Ot[c][lane] += f[lane] * sum_{p in [p0, p1)} P2[p][lane] . VT[c][p] for nv
 * (<= 4) vectors of lanes and every column c < Dv (a multiple of 16): the pairs
 * run over whole blocks of 16 from p0 & ~15, the rows of P2 outside [p0, p1) in
 * those blocks set to 0 first (keys outside the chunk: their St rows are not
 * read again).  C tiles 0-3 (four blocks of 16 columns), B tile 4 (P2), A tiles
 * 5 and 6 (VT). */
static void fa_amx_pv(const uint32_t *vt, int64_t Dv, float *p2, int64_t lds, int64_t p0, int64_t p1,
                      float *ot, int64_t ldo, const float *f, int nv)
{
    const int64_t pa = p0 & ~(int64_t)15, pb = (p1 + 15) & ~(int64_t)15;
    const int64_t sa = FA_AMX_VT_LD * 4, sb = lds * 4;
    float tmp[4 * 256] __attribute__((aligned(64)));
    for (int64_t p = pa; p < pb; p++) {
        if (p == p0) p = p1;
        if (p >= pb) break;
        for (int v = 0; v < nv; v++) fa_store_f(p2 + p * lds + v * FA_WF, fa_set1_f(0));
    }
    fa_amx_use();
    for (int v = 0; v < nv; v++) {
        const fa_v_f fv = fa_load_f(f + v * FA_WF);
        for (int64_t c0 = 0; c0 < Dv; c0 += 64) {
            const int nb = Dv - c0 >= 64 ? 4 : (int)((Dv - c0) / 16);
            _tile_zero(0);
            if (nb > 1) _tile_zero(1);
            if (nb > 2) _tile_zero(2);
            if (nb > 3) _tile_zero(3);
            for (int64_t p = pa; p < pb; p += 16) {
                const uint32_t *a = vt + c0 * FA_AMX_VT_LD + p;
                _tile_loadd(4, p2 + p * lds + v * FA_WF, sb);
                _tile_loadd(5, a, sa);
                _tile_dpbf16ps(0, 5, 4);
                if (nb > 1) {
                    _tile_loadd(6, a + 16 * FA_AMX_VT_LD, sa);
                    _tile_dpbf16ps(1, 6, 4);
                }
                if (nb > 2) {
                    _tile_loadd(5, a + 32 * FA_AMX_VT_LD, sa);
                    _tile_dpbf16ps(2, 5, 4);
                }
                if (nb > 3) {
                    _tile_loadd(6, a + 48 * FA_AMX_VT_LD, sa);
                    _tile_dpbf16ps(3, 6, 4);
                }
            }
            _tile_stored(0, tmp, 64);
            if (nb > 1) _tile_stored(1, tmp + 256, 64);
            if (nb > 2) _tile_stored(2, tmp + 512, 64);
            if (nb > 3) _tile_stored(3, tmp + 768, 64);
            for (int b = 0; b < nb; b++)
                for (int r = 0; r < 16; r++) {
                    float *o = ot + (c0 + 16 * b + r) * ldo + v * FA_WF;
                    fa_store_f(o, fa_load_f(o) + fa_load_f(tmp + 256 * b + 16 * r) * fv);
                }
        }
    }
}
