/* What a pure read loop streams from two arrays in decode's order: two OpenMP
 * threads, each summing its half of a "key" and a "value" array (MiB total,
 * default 128 = the decode cases' K+V), alternating 64 KiB of one and 64 KiB
 * of the other as a 128-key tile of D 128 float32 does, with software
 * prefetch PF bytes ahead (default 6144, FA_PF_BYTES).  No arithmetic beyond
 * the adds: the ceiling that a decode kernel's GB/s is read against.  Prints
 * the best of 20 passes.
 *
 *     gcc -O2 -mavx2 -fopenmp tools/read_bw.c -o /tmp/read_bw && /tmp/read_bw [MiB] [PF] [THREADS]
 *
 * (-mavx512f instead of -mavx2: 64-byte loads, one prefetch per 4 lines.)
 *
 * (bench/compare.py's "read bandwidth" is numpy's np.max / np.sum over 256 MiB:
 * a lower figure, one stream per thread.)  x86-64 with AVX2 or AVX-512 only. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __AVX512F__
#define V __m512
#define VW 16
#define ZERO _mm512_setzero_ps
#define LOAD _mm512_load_ps
#define ADD _mm512_add_ps
#define STORE _mm512_storeu_ps
#else
#define V __m256
#define VW 8
#define ZERO _mm256_setzero_ps
#define LOAD _mm256_load_ps
#define ADD _mm256_add_ps
#define STORE _mm256_storeu_ps
#endif

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 128;
    size_t pf = (argc > 2 ? (size_t)atol(argv[2]) : 6144) / sizeof(float);
    int nt = argc > 3 ? atoi(argv[3]) : 2;
    const size_t tile = 16384;                       /* floats: 64 KiB */
    size_t n = mib * 1024 * 1024 / sizeof(float) / 2; /* per array */
    n -= n % (tile * nt);
    float *a = aligned_alloc(64, n * sizeof(float)), *b = aligned_alloc(64, n * sizeof(float));
    if (!a || !b || n == 0) {
        fprintf(stderr, "allocation failed\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) a[i] = b[i] = (float)(i & 7);
    double best = 1e30;
    volatile float sink = 0;
    for (int rep = 0; rep < 20; rep++) {
        double t = omp_get_wtime();
#pragma omp parallel num_threads(nt)
        {
            size_t c = n / nt, lo = c * omp_get_thread_num(), hi = lo + c;
            V s0 = ZERO(), s1 = s0, s2 = s0, s3 = s0;
            for (size_t t0 = lo; t0 < hi; t0 += tile)
                for (int w = 0; w < 2; w++) {
                    const float *x = w ? b : a;
                    for (size_t i = t0; i < t0 + tile; i += 4 * VW) {
                        if (pf) _mm_prefetch((const char *)(x + i + pf), _MM_HINT_T0);
                        s0 = ADD(s0, LOAD(x + i));
                        s1 = ADD(s1, LOAD(x + i + VW));
                        s2 = ADD(s2, LOAD(x + i + 2 * VW));
                        s3 = ADD(s3, LOAD(x + i + 3 * VW));
                    }
                }
            float r[VW];
            STORE(r, ADD(ADD(s0, s1), ADD(s2, s3)));
#pragma omp atomic
            sink += r[0];
        }
        t = omp_get_wtime() - t;
        if (t < best) best = t;
    }
    printf("%zu MiB, %d threads, prefetch %zu B: %.1f GB/s (best of 20)\n", mib, nt, pf * sizeof(float),
           2.0 * n * sizeof(float) / best / 1e9);
    return 0;
}
