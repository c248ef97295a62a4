/* The query-vectorised micro-kernels alone, in the tile order of one unit of
 * `long` (D 128, float32, AVX2 build): per 128-key tile, the values' inf/NaN
 * probe, then for each of 8 chunks of 16 query lanes Q.K^T (with the tile max
 * from the registers) and P.V -- no softmax, no bookkeeping.  Keys and values
 * cycle through 32 tiles (2 MiB each: one head's 4096 keys, as in `long`), so
 * they come from L3 as in the real call.  Prints the best of 15 timings, one
 * thread, against tools/fma_peak.c's ceiling.
 *
 *     gcc -O3 -fno-math-errno -fno-trapping-math -ffp-contract=fast \
 *         -march=x86-64-v3 -mtune=generic -I fastattn/_kernels \
 *         tools/kernel_loop.c -o /tmp/kernel_loop -lm && /tmp/kernel_loop
 *
 * (the flags are setup.py's for the avx2 variant: `python -c "import fastattn;
 * fastattn.show_config()"` lists them) */
#include "simd.h"
#include <stdio.h>
#include <time.h>

#define D 128        /* head size (Dk = Dv) */
#define BK 128       /* keys per tile (BLOCK_K) */
#define LD 144       /* lane stride of Qt / St / Ot: 128 lanes + one cache line (t_ld) */
#define NCH 8        /* chunks of 16 lanes (two vectors) per unit of 128 queries */
#define NTILES 32

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void)
{
    float *K = aligned_alloc(64, (size_t)NTILES * BK * D * 4), *V = aligned_alloc(64, (size_t)NTILES * BK * D * 4);
    float *qt = aligned_alloc(64, D * LD * 4), *st = aligned_alloc(64, BK * LD * 4), *ot = aligned_alloc(64, D * LD * 4);
    float mx[16];
    int sink = 0;
    for (long i = 0; i < (long)NTILES * BK * D; i++) {
        K[i] = (float)(i % 7) * 0.01f;
        V[i] = (float)(i % 5) * 0.01f;
    }
    for (int i = 0; i < D * LD; i++) {
        qt[i] = 0.001f * (float)(i % 11);
        ot[i] = 0;
    }
    for (int i = 0; i < BK * LD; i++) st[i] = 0.01f;
    double best = 0;
    const long iters = 2048;
    for (int rep = 0; rep < 15; rep++) {
        double t0 = now();
        for (long it = 0; it < iters; it++) {
            const float *k = K + (it % NTILES) * BK * D, *v = V + (it % NTILES) * BK * D;
            sink += fa_block_nonfinite_f(v, BK, D, D, 1);
            for (int ch = 0; ch < NCH; ch++) {
                for (int i = 0; i < 16; i++) mx[i] = -INFINITY;
                fa_qvec_qk_chunk_f(k, D, 1, qt + ch * 16, LD, D, st + ch * 16, LD, 0, BK, mx, 2, ch == 0);
                fa_qvec_pv_chunk_f(v, D, 1, D, st + ch * 16, LD, 0, BK, ot + ch * 16, LD, 2);
            }
        }
        double g = 2.0 * 2 * BK * D * 16 * NCH * iters / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    printf("Q.K^T + P.V micro-kernels, long's tile order, 1 thread: best %.1f GFLOP/s\n", best);
    return sink + (ot[5] != ot[5]);
}
