/* The machine's ceilings, measured with the kernel module's own vector width,
 * compiler flags and OpenMP threads (ceilings.pxi times them):
 *
 * - a read loop: the threads each stream their share of one buffer, summing it
 *   into FA_CEIL_ACCS independent vector accumulators spread over 1, 2, 4 or 8
 *   concurrent streams, with or without software prefetch FA_PF_BYTES ahead --
 *   the bytes per second that no kernel reading the same bytes can beat;
 * - an FMA loop: NC independent chains acc = acc * x + y per thread in
 *   registers, no memory traffic -- the float32 (or float64) multiply-add peak
 *   of this vector width;
 * - where the target has bfloat16 pair dot products (FA_HAVE_BF16_DOT:
 *   VDPBF16PS, BFDOT), the same loop of them: 2 multiply-adds per 32-bit lane;
 *   where it has AMX tiles, a loop of TDPBF16PS on four C tiles.
 *
 * bench/compare.py reads the kernels' GB/s and GFLOP/s against these.  Names
 * no instruction set: the vector types and primitives come from the target
 * header through simd.h. */
#ifndef FASTATTN_CEILINGS_H
#define FASTATTN_CEILINGS_H

#include "simd.h"
#if FASTATTN_HAVE_OPENMP
#include <omp.h>
#endif

/* vector accumulators of the read loop, whatever the number of streams */
#define FA_CEIL_ACCS 8

/* One thread's sum of x[lo, hi) read as `streams` interleaved runs (the range
 * cut into `streams` equal parts read in lockstep, FA_CEIL_ACCS / streams
 * vectors of each per step), prefetching pf floats ahead when pf > 0. */
#define FA_CEIL_READ(S)                                                                     \
static float fa_ceil_read_s##S(const float *x, int64_t lo, int64_t hi, int64_t pf)          \
{                                                                                           \
    enum { PER = FA_CEIL_ACCS / (S) };                                                      \
    const int64_t step = (int64_t)PER * FA_WF;                                              \
    const int64_t part = ((hi - lo) / (S)) / step * step;                                   \
    fa_v_f acc[FA_CEIL_ACCS];                                                               \
    FA_UNROLL for (int a = 0; a < FA_CEIL_ACCS; a++) acc[a] = fa_set1_f(0.0f);              \
    for (int64_t i = 0; i < part; i += step) {                                              \
        FA_UNROLL for (int s = 0; s < (S); s++) {                                           \
            const float *p = x + lo + s * part + i;                                         \
            if (pf > 0) fa_prefetch_bytes(p + pf, step * (int64_t)sizeof(float));           \
            FA_UNROLL for (int a = 0; a < PER; a++)                                         \
                acc[s * PER + a] += fa_load_f(p + a * FA_WF);                               \
        }                                                                                   \
    }                                                                                       \
    float tail = 0.0f;                                                                      \
    for (int64_t i = lo + (S) * part; i < hi; i++) tail += x[i];                            \
    FA_UNROLL for (int a = 1; a < FA_CEIL_ACCS; a++) acc[0] += acc[a];                      \
    return fa_hsum_f(acc[0]) + tail;                                                        \
}
FA_CEIL_READ(1)
FA_CEIL_READ(2)
FA_CEIL_READ(4)
FA_CEIL_READ(8)
#undef FA_CEIL_READ

/* `reps` passes over x[0, n) by `threads` threads, each over its own
 * contiguous share (no barrier between passes); streams is 1, 2, 4 or 8.
 * Returns the sum of what was read (so that nothing is optimised away). */
static double fa_ceil_read(const float *x, int64_t n, int threads, int streams, int64_t pf_bytes,
                           int64_t reps)
{
    double total = 0.0;
    const int64_t pf = pf_bytes / (int64_t)sizeof(float);
#if FASTATTN_HAVE_OPENMP
#pragma omp parallel num_threads(threads) reduction(+:total)
#endif
    {
#if FASTATTN_HAVE_OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        for (int64_t r = 0; r < reps; r++) {
            float s;
            switch (streams) {
            case 8: s = fa_ceil_read_s8(x, lo, hi, pf); break;
            case 4: s = fa_ceil_read_s4(x, lo, hi, pf); break;
            case 2: s = fa_ceil_read_s2(x, lo, hi, pf); break;
            default: s = fa_ceil_read_s1(x, lo, hi, pf); break;
            }
            total += s;
        }
    }
    (void)threads;
    return total;
}

/* x[0, n) = 1 by the threads that will read it (first touch: each thread's
 * pages where it runs) */
static void fa_ceil_fill(float *x, int64_t n, int threads)
{
#if FASTATTN_HAVE_OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#if FASTATTN_HAVE_OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        for (int64_t i = n * t / nt; i < n * (t + 1) / nt; i++) x[i] = 1.0f;
    }
    (void)threads;
}

/* NC independent multiply-add chains of compute type T (suffix SFX) per thread,
 * iters steps each; x and y come from volatile memory so that nothing is
 * folded; x < 1, so every chain converges to y / (1 - x) without overflow or
 * subnormals.  Returns the sum of the chains. */
#define FA_CEIL_FMA(T, SFX, NC)                                                             \
static double fa_ceil_fma##SFX##_c##NC(int64_t iters, int threads)                          \
{                                                                                           \
    double total = 0.0;                                                                     \
    FA_CEIL_PARALLEL(threads)                                                               \
    {                                                                                       \
        volatile T xs = (T)0.999999, ys = (T)1e-6;                                          \
        const fa_v##SFX x = fa_set1##SFX(xs), y = fa_set1##SFX(ys);                         \
        fa_v##SFX acc[NC];                                                                  \
        FA_UNROLL for (int c = 0; c < (NC); c++) acc[c] = fa_set1##SFX((T)c);               \
        for (int64_t i = 0; i < iters; i++)                                                 \
            FA_UNROLL for (int c = 0; c < (NC); c++) acc[c] = acc[c] * x + y;               \
        FA_UNROLL for (int c = 1; c < (NC); c++) acc[0] += acc[c];                          \
        total += (double)fa_hsum##SFX(acc[0]);                                              \
    }                                                                                       \
    (void)threads;                                                                          \
    return total;                                                                           \
}
#if FASTATTN_HAVE_OPENMP
#  define FA_CEIL_PARALLEL(threads) _Pragma("omp parallel num_threads(threads) reduction(+:total)")
#else
#  define FA_CEIL_PARALLEL(threads)
#endif
FA_CEIL_FMA(float, _f, 8)
FA_CEIL_FMA(float, _f, 12)
FA_CEIL_FMA(float, _f, 16)
FA_CEIL_FMA(double, _d, 8)
FA_CEIL_FMA(double, _d, 12)
FA_CEIL_FMA(double, _d, 16)

/* kind: 0 float32 FMA, 1 float64 FMA, 2 bfloat16 pair dot products, 3 AMX
 * tiles (0.0 when the target has none); chains 8, 12 or 16 (not for tiles) */
#if defined(FA_HAVE_BF16_DOT)
#define FA_CEIL_BF16_DOT(NC)                                                                \
static double fa_ceil_bf16_dot_c##NC(int64_t iters, int threads)                            \
{                                                                                           \
    double total = 0.0;                                                                     \
    FA_CEIL_PARALLEL(threads)                                                               \
    {                                                                                       \
        /* bfloat16 pairs (1/64, 1/64) and (1, 1): each step adds 2/64 */                   \
        volatile int32_t as = 0x3C803C80, bs = 0x3F803F80;                                  \
        const fa_vi_f a = as + (fa_vi_f){0}, b = bs + (fa_vi_f){0};                         \
        fa_v_f acc[NC];                                                                     \
        FA_UNROLL for (int c = 0; c < (NC); c++) acc[c] = fa_set1_f((float)c);              \
        for (int64_t i = 0; i < iters; i++)                                                 \
            FA_UNROLL for (int c = 0; c < (NC); c++) acc[c] = fa_bf16_dot2_f(acc[c], a, b); \
        FA_UNROLL for (int c = 1; c < (NC); c++) acc[0] += acc[c];                          \
        total += (double)fa_hsum_f(acc[0]);                                                 \
    }                                                                                       \
    (void)threads;                                                                          \
    return total;                                                                           \
}
FA_CEIL_BF16_DOT(8)
FA_CEIL_BF16_DOT(12)
FA_CEIL_BF16_DOT(16)
#define FA_CEIL_HAVE_BF16_DOT 1
#else
#define FA_CEIL_HAVE_BF16_DOT 0
#endif

/* AMX targets (FA_HAVE_AMX): TDPBF16PS on tiles in registers -- four independent
 * 16 x 16 float32 C tiles += A (16 x 32 bfloat16) . B, A and B loaded once per
 * thread: 4 * 16 * 16 * 32 multiply-adds per iteration.  The bfloat16 peak of
 * such a target (the tiles are its fastest bfloat16 products). */
#if defined(FA_HAVE_AMX)
#define FA_CEIL_HAVE_AMX 1
#define FA_CEIL_AMX_MACS_PER_ITER (4 * 16 * 16 * 32)
static double fa_ceil_amx_tiles(int64_t iters, int threads)
{
    double total = 0.0;
    FA_CEIL_PARALLEL(threads)
    {
        /* A: bfloat16 pairs (1/64, 1/64), B: (1, 1): each step adds 1/2 to every C element */
        uint32_t a[256], b[256];
        float c[256];
        volatile uint32_t as = 0x3C803C80u, bs = 0x3F803F80u;
        for (int i = 0; i < 256; i++) {
            a[i] = as;
            b[i] = bs;
        }
        fa_amx_begin();
        _tile_loadd(4, a, 64);
        _tile_loadd(5, b, 64);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t i = 0; i < iters; i++) {
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 5);
            _tile_dpbf16ps(2, 4, 5);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, c, 64);
        fa_amx_end();
        total += (double)c[0];
    }
    (void)threads;
    return total;
}
#else
#define FA_CEIL_HAVE_AMX 0
#define FA_CEIL_AMX_MACS_PER_ITER 0
#endif

static double fa_ceil_peak(int kind, int chains, int64_t iters, int threads)
{
#define FA_CEIL_BY_CHAINS(fn) (chains == 8 ? fn##_c8(iters, threads) : chains == 12 ? fn##_c12(iters, threads) \
                               : fn##_c16(iters, threads))
    switch (kind) {
    case 0: return FA_CEIL_BY_CHAINS(fa_ceil_fma_f);
    case 1: return FA_CEIL_BY_CHAINS(fa_ceil_fma_d);
#if defined(FA_HAVE_BF16_DOT)
    case 2: return FA_CEIL_BY_CHAINS(fa_ceil_bf16_dot);
#endif
#if defined(FA_HAVE_AMX)
    case 3: return fa_ceil_amx_tiles(iters, threads);
#endif
    default: return 0.0;
    }
#undef FA_CEIL_BY_CHAINS
}

#endif
