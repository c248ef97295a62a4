/* The per-type part of the portable primitives (isa/portable.h includes it once
 * per compute type with FA_PT the element type, FA_PV / FA_PVI its vector and
 * integer vector, FA_PIT the integer lane type, FA_PW the lane count as a
 * literal, FA_PSFX the name suffix).  GNU C vector extensions only.  Not a
 * standalone header. */

/* W unaligned elements as a vector */
static inline FA_PV FA_PSFX(fa_port_loadu)(const FA_PT *p)
{
    FA_PV v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* maxps semantics: a > b ? a : b lane-wise, so a NaN in either lane gives b */
static inline FA_PV FA_PSFX(fa_port_vmax)(FA_PV a, FA_PV b)
{
    const FA_PVI m = a > b;
    return (FA_PV)(((FA_PVI)a & m) | ((FA_PVI)b & ~m));
}

/* p[0:n] with the lanes from n on set to fill (0 <= n <= W); lanes past n are
 * not read, so p + n may be the end of an array */
static inline FA_PV FA_PSFX(fa_port_load_part)(const FA_PT *p, int64_t n, FA_PT fill)
{
    FA_PT tmp[FA_PW];
    for (int i = 0; i < FA_PW; i++) tmp[i] = i < n ? p[i] : fill;
    return FA_PSFX(fa_port_loadu)(tmp);
}

/* p[0:n] = the first n lanes of v (0 <= n <= W): one vector store to the stack
 * copied out lane by lane (a vector store read back in smaller pieces forwards
 * without a stall) */
static inline void FA_PSFX(fa_port_store_part)(FA_PT *p, FA_PV v, int64_t n)
{
    FA_PT tmp[FA_PW];
    memcpy(tmp, &v, sizeof v);
    for (int64_t i = 0; i < n; i++) p[i] = tmp[i];
}

/* Sum and max of the W lanes as a butterfly (log2 W shuffle + add steps), not
 * a chain of W dependent scalar adds: the dot products of the decode path end in
 * one of these per key and row.  Fixed order, so deterministic; lane 0 of step
 * h = W/2 ... 1 adds lane c ^ h.  fa_hmax: no NaN lanes. */
#define FA_PORT_HSUM_STEP(W, h, v) v += FA_SHUF2(FA_PVI, v, v, FA_CAT3(FA_XOR_, W, h));
#define FA_PORT_HMAX_STEP(W, h, v) v = FA_PSFX(fa_port_vmax)(v, FA_SHUF2(FA_PVI, v, v, FA_CAT3(FA_XOR_, W, h)));
static inline FA_PT FA_PSFX(fa_port_hsum)(FA_PV v)
{
    FA_STEPS(FA_PW, FA_PORT_HSUM_STEP, v)
    return v[0];
}

static inline FA_PT FA_PSFX(fa_port_hmax)(FA_PV v)
{
    FA_STEPS(FA_PW, FA_PORT_HMAX_STEP, v)
    return v[0];
}
#undef FA_PORT_HSUM_STEP
#undef FA_PORT_HMAX_STEP

/* The lanes of a comparison mask m (each lane all ones or all zeros) as the low
 * W bits of an int. */
static inline unsigned FA_PSFX(fa_port_lane_bits)(FA_PVI m)
{
    unsigned bits = 0;
    for (int i = 0; i < FA_PW; i++) bits |= (unsigned)(m[i] != 0) << i;
    return bits;
}

/* In-register transpose of a W x W block: r[a][c] -> r[c][a].  At each step h
 * the off-diagonal h x h blocks of every 2h x 2h block swap (two two-source
 * shuffles per row pair: vpermt2ps on AVX-512, zip / trn on NEON). */
#define FA_PORT_TRANSPOSE_STEP(W, h, r)                                          \
    FA_UNROLL for (int a = 0; a < W; a++)                                        \
        if (!(a & h)) {                                                          \
            const FA_PV A = r[a], B = r[a + h];                                  \
            r[a] = FA_SHUF2(FA_PVI, A, B, FA_CAT3(FA_TRA_, W, h));               \
            r[a + h] = FA_SHUF2(FA_PVI, A, B, FA_CAT3(FA_TRB_, W, h));           \
        }
static inline __attribute__((always_inline)) void FA_PSFX(fa_port_transpose)(FA_PV *r)
{
    FA_STEPS(FA_PW, FA_PORT_TRANSPOSE_STEP, r)
}
#undef FA_PORT_TRANSPOSE_STEP

/* The horizontal sums of W vectors at once: afterwards lane x of r[0] is the sum
 * of the lanes of the original r[x], added in fa_hsum's order (a transpose-and-add
 * tree: W - 1 vector adds instead of W butterflies).  r[1:] are clobbered. */
#define FA_PORT_TRANSPOSE_ADD_STEP(W, h, r)                                      \
    FA_UNROLL for (int a = 0; a < h; a++)                                        \
        r[a] = FA_SHUF2(FA_PVI, r[a], r[a + h], FA_CAT3(FA_TRA_, W, h))          \
             + FA_SHUF2(FA_PVI, r[a], r[a + h], FA_CAT3(FA_TRB_, W, h));
static inline __attribute__((always_inline)) void FA_PSFX(fa_port_transpose_add)(FA_PV *r)
{
    FA_STEPS(FA_PW, FA_PORT_TRANSPOSE_ADD_STEP, r)
}
#undef FA_PORT_TRANSPOSE_ADD_STEP

/* W bytes, zero-extended to the W lanes of an integer vector */
static inline FA_PVI FA_PSFX(fa_port_widen_bytes)(const uint8_t *b)
{
    typedef uint8_t bytes_t __attribute__((vector_size(FA_PW)));
    bytes_t x;
    memcpy(&x, b, sizeof x);
    return __builtin_convertvector(x, FA_PVI);
}
