/* sm_gemm_tiny (src/core/gemm_tiny.c), the small-matrix product of SoftMoE's dispatch and combine,
 * against a double-precision reference: every shape from 1 to past two tiles in each dimension
 * (the 6 x 16 tile's edges), A read as stored and transposed, leading dimensions wider than the
 * matrices, alpha and beta; the entries of C outside the M x N block untouched; beta = 0 never
 * reads C (NaN there does not leak). Prints which kernel ran (AVX-512, AVX2 or the portable loops);
 * on an AVX-512 CPU the sweep also runs capped at AVX2, and the two kernels must give the same bits. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe.h"

static double rel_tol(int K) { return 4e-7 * (K + 2); }

static void check_case(int M, int N, int K, int transA, float alpha, float beta, sm_rng *g) {
    const int lda = (transA ? M : K) + 3, ldb = N + 5, ldc = N + 2;
    const int arows = transA ? K : M;
    float *A = malloc(sizeof(float) * (size_t)(arows ? arows : 1) * lda), *B = malloc(sizeof(float) * (size_t)(K ? K : 1) * ldb);
    float *C = malloc(sizeof(float) * (size_t)(M + 1) * ldc), *C0 = malloc(sizeof(float) * (size_t)(M + 1) * ldc);
    for (int i = 0; i < arows * lda; i++) A[i] = (float)sm_rng_normal(g);
    for (int i = 0; i < K * ldb; i++) B[i] = (float)sm_rng_normal(g);
    for (int i = 0; i < (M + 1) * ldc; i++) C[i] = beta == 0 ? NAN : (float)sm_rng_normal(g);
    memcpy(C0, C, sizeof(float) * (size_t)(M + 1) * ldc);
    const ptrdiff_t ars = transA ? 1 : lda, acs = transA ? lda : 1;
    sm_gemm_tiny(M, N, K, alpha, A, ars, acs, B, ldb, beta, C, ldc);
    for (int i = 0; i < M + 1; i++)
        for (int j = 0; j < ldc; j++) {
            const float got = C[i * ldc + j];
            if (i >= M || j >= N) { /* outside the block: untouched (NaN stays NaN) */
                const float was = C0[i * ldc + j];
                cr_assert(got == was || (isnan(got) && isnan(was)), "M=%d N=%d K=%d: C[%d,%d] written outside the block",
                          M, N, K, i, j);
                continue;
            }
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double t = (double)A[i * ars + k * acs] * B[k * ldb + j];
                ref += t;
                mag += fabs(t);
            }
            ref *= alpha;
            mag *= fabs(alpha);
            if (beta != 0) {
                ref += (double)beta * C0[i * ldc + j];
                mag += fabs((double)beta * C0[i * ldc + j]);
            }
            cr_assert(fabs(got - ref) <= rel_tol(K) * mag + 1e-30, "M=%d N=%d K=%d transA=%d alpha=%g beta=%g: C[%d,%d] = %.9g, reference %.9g",
                      M, N, K, transA, alpha, beta, i, j, got, ref);
        }
    free(A), free(B), free(C), free(C0);
}

static void edge_sweep(void) {
    fprintf(stderr, "gemm_tiny: %s kernel\n",
            sm_gemm_tiny_isa() >= SM_ISA_AVX512 ? "AVX-512" : sm_gemm_tiny_simd() ? "AVX2" : "portable loops");
    sm_rng g;
    sm_rng_seed(&g, 7);
    static const float alphas[] = {1, -0.5f}, betas[] = {0, 1, 0.25f};
    for (int M = 1; M <= 18; M++)
        for (int N = 1; N <= 35; N += (N < 18 ? 1 : 5))
            for (int K = 0; K <= 20; K += (K < 3 ? 1 : 6))
                for (int t = 0; t < 2; t++) check_case(M, N, K, t, alphas[(M + N) % 2], betas[(M + N + K) % 3], &g);
}

Test(gemm_tiny, every_edge_against_a_double_reference) { edge_sweep(); }

Test(gemm_tiny, every_edge_capped_at_avx2) {
    sm_gemm_tiny_set_isa(SM_ISA_AVX2);
    edge_sweep();
    sm_gemm_tiny_set_simd(1);
}

/* each output one FMA chain over k in order, then alpha *, then + beta C, in both kernels */
Test(gemm_tiny, avx512_and_avx2_give_the_same_bits) {
    if (sm_gemm_tiny_isa() < SM_ISA_AVX512) {
        fprintf(stderr, "gemm_tiny: no AVX-512 on this CPU: nothing to compare\n");
        return;
    }
    sm_rng g;
    sm_rng_seed(&g, 9);
    static const int shapes[][4] = {{16, 16, 64, 1}, {64, 16, 16, 0}, {64, 64, 16, 0}, {13, 37, 9, 1}, {7, 5, 30, 0}, {9, 70, 20, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], tr = shapes[s][3];
        const int lda = (tr ? M : K) + 1, ldb = N + 3, ldc = N + 2;
        float *A = malloc(sizeof(float) * (size_t)(tr ? K : M) * lda), *B = malloc(sizeof(float) * (size_t)K * ldb);
        float *C0 = malloc(sizeof(float) * (size_t)M * ldc), *C[2];
        for (int i = 0; i < (tr ? K : M) * lda; i++) A[i] = (float)sm_rng_normal(&g);
        for (int i = 0; i < K * ldb; i++) B[i] = (float)sm_rng_normal(&g);
        for (int i = 0; i < M * ldc; i++) C0[i] = (float)sm_rng_normal(&g);
        for (int v = 0; v < 2; v++) {
            sm_gemm_tiny_set_isa(v ? SM_ISA_AVX512 : SM_ISA_AVX2);
            C[v] = malloc(sizeof(float) * (size_t)M * ldc);
            memcpy(C[v], C0, sizeof(float) * (size_t)M * ldc);
            sm_gemm_tiny(M, N, K, -0.75f, A, tr ? 1 : lda, tr ? lda : 1, B, ldb, 0.5f, C[v], ldc);
        }
        sm_gemm_tiny_set_simd(1);
        cr_assert(!memcmp(C[0], C[1], sizeof(float) * (size_t)M * ldc), "M=%d N=%d K=%d: AVX2 and AVX-512 differ", M, N, K);
        free(A), free(B), free(C0), free(C[0]), free(C[1]);
    }
}

Test(gemm_tiny, softmoe_shapes) {
    sm_rng g;
    sm_rng_seed(&g, 8);
    /* dispatch (p x w x mg, A transposed), combine (mg x w x p, beta 1), the inner products (mg x S x w) */
    check_case(16, 16, 64, 1, 1, 0, &g);
    check_case(64, 16, 16, 0, 1, 1, &g);
    check_case(64, 64, 16, 0, 1, 0, &g);
    check_case(100, 37, 70, 1, 1, 1, &g);
}
