/* One core's float32 FMA peak (AVX2): 12 independent vfmadd231ps chains on ymm
 * registers, no memory traffic.  GFLOP/s = 16 flops per FMA instruction.
 *
 *     gcc -O2 tools/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak
 *
 * The ceiling the query-vectorised micro-kernels (tools/kernel_loop.c) and the
 * README's GFLOP/s figures are read against; x86-64 with AVX2+FMA only. */
#include <stdio.h>
#include <time.h>

int main(void)
{
    for (int rep = 0; rep < 5; rep++) {
        long n = 200000000;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        __asm__ volatile(
            "vxorps %%ymm14, %%ymm14, %%ymm14\n\t"
            "vxorps %%ymm15, %%ymm15, %%ymm15\n\t"
            "1:\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm0\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm1\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm3\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm4\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm6\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm7\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm9\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm10\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm11\n\t"
            "dec %0\n\t"
            "jnz 1b\n\t"
            : "+r"(n)
            :
            : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7",
              "ymm8", "ymm9", "ymm10", "ymm11", "ymm14", "ymm15");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("%.1f GFLOP/s\n", 200000000.0 * 12 * 16 / s / 1e9);
    }
    return 0;
}
