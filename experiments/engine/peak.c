/* The machine's fp32 multiply-add peak, measured: the roofline that `bench layer` sets its
 * timings against.
 *
 * A GEMM or a router cannot run faster than (its FLOPs) / (the rate at which the cores retire
 * fused multiply-adds). This file measures that rate directly: each thread runs 12 independent
 * chains of vector FMAs (enough to cover the FMA latency on both FMA pipes of current x86 cores),
 * with no loads or stores, at the widest vector width the CPU supports (AVX-512, AVX2+FMA, or
 * plain SSE as the portable fallback). Both the one-thread rate and the all-threads rate are
 * measured; the bound `bench layer` uses is the larger of (all-threads rate) and
 * (threads x one-thread rate), so a neighbour on a shared host can only make the bound looser,
 * never tighter than the hardware. */
#include <omp.h>
#include <stdio.h>
/* the kernels must be optimised in every build: at -O0 (make debug) each multiply-add would go
 * through the stack and the "peak" would fall below what OpenBLAS reaches */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O2")
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "experiments/engine/peak.h"
#include "specmoe.h"

/* One thread's kernel: iters x 12 vector multiply-adds in 12 independent chains; returns a value
 * so the chains are not dead code. MADD(a) is the fused multiply-add of the instruction set (the
 * build uses -std=c11, where GCC does not contract a * b + c on its own). */
#define FMA_KERNEL(NAME, ATTR, VT, LANES, MADD)                                                      \
    ATTR static float NAME(long iters, float seed) {                                                 \
        VT a[12], b, c;                                                                              \
        for (int j = 0; j < LANES; j++) {                                                            \
            b[j] = 0.999999f;                                                                        \
            c[j] = 1e-7f;                                                                            \
            for (int q = 0; q < 12; q++) a[q][j] = seed * (float)(q + 1) + (float)j;                 \
        }                                                                                            \
        VT a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7],   \
           a8 = a[8], a9 = a[9], a10 = a[10], a11 = a[11];                                           \
        for (long i = 0; i < iters; i++) {                                                           \
            a0 = MADD(a0); a1 = MADD(a1); a2 = MADD(a2); a3 = MADD(a3);                              \
            a4 = MADD(a4); a5 = MADD(a5); a6 = MADD(a6); a7 = MADD(a7);                              \
            a8 = MADD(a8); a9 = MADD(a9); a10 = MADD(a10); a11 = MADD(a11);                          \
        }                                                                                            \
        VT s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11));       \
        float r = 0;                                                                                 \
        for (int j = 0; j < LANES; j++) r += s[j];                                                   \
        return r;                                                                                    \
    }

#if defined(__x86_64__) && defined(__GNUC__)
#define MADD512(a) _mm512_fmadd_ps(a, b, c)
#define MADD256(a) _mm256_fmadd_ps(a, b, c)
FMA_KERNEL(fma_avx512, __attribute__((target("avx512f"))), __m512, 16, MADD512)
FMA_KERNEL(fma_avx2, __attribute__((target("avx2,fma"))), __m256, 8, MADD256)
#endif
typedef float v4f __attribute__((vector_size(16)));
#define MADD_GENERIC(a) ((a) * b + c)
FMA_KERNEL(fma_generic, , v4f, 4, MADD_GENERIC)

typedef float (*fma_fn)(long, float);

/* The widest kernel this CPU runs; *lanes gets its width, *name its instruction set. */
static fma_fn pick_kernel(int *lanes, const char **name) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *lanes = 16, *name = "avx512";
        return fma_avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *lanes = 8, *name = "avx2-fma";
        return fma_avx2;
    }
#endif
    /* without FMA the compiler emits a multiply and an add: still 2 FLOPs per lane */
    *lanes = 4, *name = "sse";
    return fma_generic;
}

/* GFLOP/s of `threads` threads each running the kernel; best of `reps` timings. */
static double fma_rate(fma_fn f, int lanes, int threads, long iters, int reps, float *sink) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        float acc = 0;
        double t0 = sm_time_now();
#pragma omp parallel num_threads(threads) reduction(+ : acc)
        acc += f(iters, 1.0f + 1e-3f * (float)omp_get_thread_num());
        double t = sm_time_now() - t0;
        *sink += acc;
        double g = (double)threads * (double)iters * 12.0 * lanes * 2.0 / t / 1e9;
        if (g > best) best = g;
    }
    return best;
}

double exp_fma_peak(int threads, double *one_thread, double *all_threads, const char **isa) {
    int lanes;
    fma_fn f = pick_kernel(&lanes, isa);
    float sink = 0;
    long iters = 4000000; /* about 0.03-0.1 s per timing at 100 GFLOP/s per core */
    double g1 = fma_rate(f, lanes, 1, iters, 5, &sink);
    double gn = fma_rate(f, lanes, threads, iters, 5, &sink);
    if (sink == 12345.678f) fputc(' ', stderr); /* keeps the results observable */
    *one_thread = g1;
    *all_threads = gn;
    return gn > threads * g1 ? gn : threads * g1;
}
