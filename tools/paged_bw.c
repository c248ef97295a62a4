/* What the paged decode's read order costs the memory system, without the
 * kernels: the decode case of bench/compare.py ("paged-decode": 8 sequences,
 * 8 key/value heads, 4096 keys of D 128 float32, blocks of 16 slots, shuffled)
 * read by two OpenMP threads with the kernels' arithmetic per key row (four
 * query rows: 4 FMAs per 16 elements), in three orders:
 *
 *   contiguous  each (sequence, head) a 2 MiB stream: K tile, V tile, 128 keys
 *               at a time (the contiguous twin, "paged-decode-contiguous");
 *   lockstep    per sequence and 128-key tile, each cache block read for the
 *               8 heads in turn (64 KiB, one stretch of memory), K then V --
 *               the order of paged_heads.pxi;
 *   per-head    per (sequence, head), tile by tile, the head's 8 KiB of each
 *               block (no lockstep).
 *
 * each with software prefetch PFR_ROWS rows ahead (default 12: 6 KiB) into L1
 * (prefetcht0), into L2 (prefetcht1), or none.  In those three orders the
 * prefetch requests the rows that follow in memory, across a block's end too
 * (another sequence's block); with prefetch, two more lockstep orders request
 * through the block table:
 *
 *   next-block  with each row, the same row of the next block (one block, 64
 *               KiB, ahead: the kernels' next_run_rows since stop 52);
 *   table-rows  PFR_ROWS rows ahead, past a block's end in the next block.
 *
 * Prints the best of 15 passes and each order's time over the contiguous
 * order's with the same prefetch.  x86-64 with AVX-512 only.
 *
 *     gcc -O2 -mavx512f -mfma -fopenmp [-DPFR_ROWS=24] tools/paged_bw.c -o /tmp/paged_bw && /tmp/paged_bw
 */
#include <immintrin.h>
#ifndef PFR_ROWS
#define PFR_ROWS 12
#endif
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

enum { S = 8, H = 8, BS = 16, D = 128, L = 4096, TILE = 128, PFR = PFR_ROWS };
enum { NBPS = L / BS, NB = S * NBPS };
static const long BLK = (long)H * BS * D;      /* floats per cache block (all heads) */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* one key row: 8 vectors, each into 4 accumulators (four query rows); pf != 0: the
 * row at pfp requested (pf 1 into L1, 2 into L2) */
static inline void row_at(const float *r, const float *pfp, __m512 *acc, int pf)
{
    if (pf && pfp) {
        const char *q = (const char *)pfp;
        for (int c = 0; c < D * 4; c += 64) {
            if (pf == 1) _mm_prefetch(q + c, _MM_HINT_T0);
            else _mm_prefetch(q + c, _MM_HINT_T1);
        }
    }
    for (int v = 0; v < D / 16; v++) {
        const __m512 x = _mm512_load_ps(r + v * 16);
        for (int i = 0; i < 4; i++) acc[i] = _mm512_fmadd_ps(x, acc[4 + i], acc[i]);
    }
}

/* the same, requesting the row PFR rows on in memory */
static inline void row(const float *r, __m512 *acc, int pf)
{
    row_at(r, r + (long)PFR * D, acc, pf);
}

static double run(const float *K, const float *V, const float *Kc, const float *Vc, const int *table, int order,
                  int pf)
{
    double best = 1e30;
    volatile float sink = 0;
    for (int rep = 0; rep < 15; rep++) {
        const double t0 = now();
        if (order == 0) {
#pragma omp parallel for schedule(dynamic) num_threads(2)
            for (int u = 0; u < S * H; u++) {
                __m512 a[8];
                for (int i = 0; i < 8; i++) a[i] = _mm512_set1_ps(0.5f);
                const long base = (long)u * L * D;
                for (int t = 0; t < L; t += TILE) {
                    for (int j = t; j < t + TILE; j++) row(Kc + base + (long)j * D, a, pf);
                    for (int j = t; j < t + TILE; j++) row(Vc + base + (long)j * D, a, pf);
                }
                sink += _mm512_reduce_add_ps(a[0] + a[1] + a[2] + a[3]);
            }
        } else if (order == 1 || order == 3 || order == 4) {
            /* lockstep, each row's prefetch PFR rows on in memory (order 1), the same row
             * of the next block in this array (order 3: one block, 64 KiB, ahead) or PFR rows
             * ahead through the table (order 4) */
#pragma omp parallel for schedule(dynamic) num_threads(2)
            for (int s = 0; s < S; s++) {
                __m512 a[8];
                for (int i = 0; i < 8; i++) a[i] = _mm512_set1_ps(0.5f);
                for (int t = 0; t < L; t += TILE)
                    for (int kv = 0; kv < 2; kv++)
                        for (int r = t / BS; r < (t + TILE) / BS; r++) {
                            const float *arr = kv ? V : K;
                            const float *b = arr + (long)table[s * NBPS + r] * BLK;
                            const float *nb = r + 1 < NBPS ? arr + (long)table[s * NBPS + r + 1] * BLK : NULL;
                            for (int j = 0; j < H * BS; j++) {
                                const float *pp;
                                if (order == 1) pp = b + (long)(j + PFR) * D;
                                else if (order == 3) pp = nb ? nb + (long)j * D : NULL;
                                else if (j + PFR < H * BS) pp = b + (long)(j + PFR) * D;
                                else pp = nb ? nb + (long)(j + PFR - H * BS) * D : NULL;
                                row_at(b + (long)j * D, pp, a, pf);
                            }
                        }
                sink += _mm512_reduce_add_ps(a[0] + a[1] + a[2] + a[3]);
            }
        } else {
#pragma omp parallel for schedule(dynamic) num_threads(2)
            for (int u = 0; u < S * H; u++) {
                const int s = u / H, h = u % H;
                __m512 a[8];
                for (int i = 0; i < 8; i++) a[i] = _mm512_set1_ps(0.5f);
                for (int t = 0; t < L; t += TILE)
                    for (int kv = 0; kv < 2; kv++)
                        for (int r = t / BS; r < (t + TILE) / BS; r++) {
                            const float *b = (kv ? V : K) + (long)table[s * NBPS + r] * BLK + (long)h * BS * D;
                            for (int j = 0; j < BS; j++) row(b + (long)j * D, a, pf);
                        }
                sink += _mm512_reduce_add_ps(a[0] + a[1] + a[2] + a[3]);
            }
        }
        const double t1 = now();
        if (t1 - t0 < best) best = t1 - t0;
    }
    (void)sink;
    return best;
}

int main(void)
{
    const long n = (long)NB * BLK;
    float *buf[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = aligned_alloc(2 << 20, n * sizeof(float));
        if (!buf[i]) return 1;
        madvise(buf[i], n * sizeof(float), MADV_HUGEPAGE);
        for (long e = 0; e < n; e++) buf[i][e] = 1e-3f;
    }
    int *table = malloc(sizeof(int) * NB);
    for (int i = 0; i < NB; i++) table[i] = i;
    srand(1);
    for (int i = NB - 1; i > 0; i--) {
        const int j = rand() % (i + 1), t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    const double bytes = 2.0 * n * sizeof(float);
    static const char *pfname[] = {"none", "prefetcht0", "prefetcht1"};
    printf("K+V %.0f MiB, 2 threads, best of 15, prefetch %d rows (%d KiB) ahead\n", bytes / (1 << 20), PFR,
           PFR * D * 4 / 1024);
    for (int pf = 0; pf < 3; pf++) {
        const double c = run(buf[0], buf[1], buf[2], buf[3], table, 0, pf);
        const double l = run(buf[0], buf[1], buf[2], buf[3], table, 1, pf);
        const double h = run(buf[0], buf[1], buf[2], buf[3], table, 2, pf);
        const double n3 = pf ? run(buf[0], buf[1], buf[2], buf[3], table, 3, pf) : 0;
        const double n4 = pf ? run(buf[0], buf[1], buf[2], buf[3], table, 4, pf) : 0;
        printf("prefetch %-10s contiguous %6.2f ms (%4.1f GB/s)  lockstep %6.2f ms (%.2fx)  per-head %6.2f ms "
               "(%.2fx)", pfname[pf], c * 1e3, bytes / c / 1e9, l * 1e3, l / c, h * 1e3, h / c);
        if (pf) printf("  next-block %.2fx  table-rows %.2fx", n3 / c, n4 / c);
        printf("\n");
    }
    return 0;
}
