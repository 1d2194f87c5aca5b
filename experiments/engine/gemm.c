/* specmoe bench gemm: sgemm (OpenBLAS, through sm_gemm) at the small shapes of RL networks - batch
 * 1-256 rows, widths 64-1024 - against the one-thread FMA peak. At these sizes a call's fixed cost
 * (argument checks, packing the weight matrix into OpenBLAS's panels on every call) weighs against
 * few FLOPs, so the rate falls far below the peak; this measures by how much, shape by shape:
 *   bench-gemm M=.. K=.. N=.. us_per_call=.. gflops=.. peak_fraction=..
 * The layer is out (M, N) = x (M, K) @ W (N, K)^T, as a dense layer's forward.
 *
 * Then, from 2 rows, the three products of that layer (forward, dinp += dout W, dweight += dout^T x)
 * through OpenBLAS and through the packed small GEMM (src/core/linear_small.c), alternated in
 * batches of 4 calls; each side's figure is its fastest batch (a neighbour's load only slows a
 * batch down, so the fastest is the one closest to an idle core), over --seconds per shape:
 *   bench-gemm-packed M=.. K=.. N=.. product=fwd|dinp|dweight openblas_us=.. packed_us=..
 *                     openblas_gflops=.. packed_gflops=.. openblas_peak_fraction=.. packed_peak_fraction=..
 *                     ratio=.. rule=0|1
 * (rates and fractions per CPU second, against the peak per CPU second).
 * ratio is OpenBLAS's time over the packed kernel's; rule says whether sm_linear_small_use picks
 * the packed kernel for that product at that shape (0 everywhere without AVX2). Last, the
 * convolution's two paths (bench_conv below). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/engine/peak.h"
#include "experiments/experiments.h"
#include "specmoe/core/conv.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* product p (0 forward, 1 dinp, 2 dweight) of a T x C -> OC layer, packed or through OpenBLAS */
static void run_product(int p, int packed, int T, int C, int OC, const sm_real *x, const sm_real *w, const sm_real *b,
                        const sm_real *dy, sm_real *y, sm_real *dx, sm_real *dw, sm_real *ws) {
    if (p == 0) {
        if (packed) sm_linear_forward_small(y, x, w, b, T, C, OC, ws);
        else sm_linear_forward(y, x, w, b, T, C, OC);
    } else if (packed) {
        sm_linear_backward_small(p == 1 ? dx : NULL, p == 2 ? dw : NULL, dy, x, w, T, C, OC, ws);
    } else {
        sm_linear_backward(p == 1 ? dx : NULL, p == 2 ? dw : NULL, NULL, dy, x, w, T, C, OC);
    }
}

static int bench_packed(double seconds, double peak) {
    static const int Ms[] = {2, 8, 32, 64, 128, 256};
    static const int Ks[] = {64, 128, 256, 512, 1024, 128}, Ns[] = {64, 128, 256, 512, 128, 6};
    static const char *names[] = {"fwd", "dinp", "dweight"};
    static const int bits[] = {SM_LINEAR_SMALL_FWD, SM_LINEAR_SMALL_DINP, SM_LINEAR_SMALL_DWEIGHT};
    const int maxm = 256, maxw = 1024;
    sm_real *x = malloc(sizeof(sm_real) * maxm * maxw), *w = malloc(sizeof(sm_real) * maxw * maxw),
            *y = malloc(sizeof(sm_real) * maxm * maxw), *dy = malloc(sizeof(sm_real) * maxm * maxw),
            *dx = calloc((size_t)maxm * maxw, sizeof(sm_real)), *dw = calloc((size_t)maxw * maxw, sizeof(sm_real)),
            *b = calloc(maxw, sizeof(sm_real)), *ws = malloc(sizeof(sm_real) * sm_linear_small_ws(maxm, maxw, maxw));
    if (!x || !w || !y || !dy || !dx || !dw || !b || !ws) {
        free(x), free(w), free(y), free(dy), free(dx), free(dw), free(b), free(ws);
        fprintf(stderr, "specmoe bench gemm: out of memory\n");
        return CLI_EXIT_RUNTIME;
    }
    sm_rng rng;
    sm_rng_seed(&rng, 2);
    for (int i = 0; i < maxm * maxw; i++) x[i] = (sm_real)sm_rng_normal(&rng), dy[i] = (sm_real)sm_rng_normal(&rng);
    for (int i = 0; i < maxw * maxw; i++) w[i] = (sm_real)(0.03 * sm_rng_normal(&rng));
    for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
        for (size_t s = 0; s < sizeof Ks / sizeof Ks[0]; s++)
            for (int p = 0; p < 3; p++) {
                const int T = Ms[a], C = Ks[s], OC = Ns[s];
                double best[2] = {1e30, 1e30};
                const double t_end = cpu_now() + seconds;
                do
                    for (int packed = 0; packed < 2; packed++) {
                        const double t0 = cpu_now();
                        for (int r = 0; r < 4; r++) run_product(p, packed, T, C, OC, x, w, b, dy, y, dx, dw, ws);
                        const double t = (cpu_now() - t0) / 4;
                        best[packed] = t < best[packed] ? t : best[packed];
                    }
                while (cpu_now() < t_end);
                const double fl = 2.0 * T * C * OC;
                printf("bench-gemm-packed M=%d K=%d N=%d product=%s openblas_us=%.2f packed_us=%.2f openblas_gflops=%.1f "
                       "packed_gflops=%.1f openblas_peak_fraction=%.3f packed_peak_fraction=%.3f ratio=%.2f rule=%d\n",
                       T, C, OC, names[p], best[0] * 1e6, best[1] * 1e6, fl / best[0] / 1e9, fl / best[1] / 1e9,
                       fl / best[0] / 1e9 / peak, fl / best[1] / 1e9 / peak, best[0] / best[1],
                       (sm_linear_small_use(T, C, OC) & bits[p]) != 0);
                fflush(stdout);
            }
    free(x), free(w), free(y), free(dy), free(dx), free(dw), free(b), free(ws);
    return 0;
}

/* The convolution at RL shapes, packed path (src/core/conv.c) against the OpenBLAS path
 * (sm_gemm_tiny_set_simd(0) turns the packed path off), forward and backward (weight and bias
 * gradients; the first layer's input needs none), alternated in batches of 4 calls, each side's
 * fastest batch in CPU time:
 *   bench-gemm-conv B=.. C=.. H=.. W=.. OC=.. K=.. pad=.. product=fwd|bwd openblas_us=.. packed_us=..
 *                   openblas_gflops=.. packed_gflops=.. packed_peak_fraction=.. ratio=.. packed=0|1 */
static int bench_conv(double seconds, double peak) {
    static const int shapes[][7] = {
        {32, 4, 10, 10, 16, 3, 0},  /* the MinAtar DQN's conv (batch 32) */
        {256, 4, 10, 10, 16, 3, 0}, /* the same at batch 256 */
        {32, 16, 8, 8, 32, 3, 1},   /* a second conv layer, padded */
    };
    int rc = 0;
    const int had = sm_gemm_tiny_simd();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && !rc; s++) {
        const int B = shapes[s][0], C = shapes[s][1], H = shapes[s][2], W = shapes[s][3], OC = shapes[s][4],
                  K = shapes[s][5], pad = shapes[s][6];
        int OH, OW;
        if (sm_conv2d_shape(H, W, K, K, 1, pad, &OH, &OW, NULL) != SM_OK) return CLI_EXIT_RUNTIME;
        const size_t ncol = sm_conv2d_col_size(C, H, W, K, K, 1, pad), nin = (size_t)B * C * H * W,
                     nout = (size_t)B * OC * OH * OW, nw = (size_t)OC * C * K * K;
        sm_real *x = malloc(sizeof(sm_real) * nin), *w = malloc(sizeof(sm_real) * nw), *b = calloc((size_t)OC, sizeof(sm_real)),
                *out = malloc(sizeof(sm_real) * nout), *dy = malloc(sizeof(sm_real) * nout), *col = malloc(sizeof(sm_real) * B * ncol),
                *dcol = malloc(sizeof(sm_real) * ncol), *tmp = malloc(sizeof(sm_real) * nout), *dw = calloc(nw, sizeof(sm_real)),
                *db = calloc((size_t)OC, sizeof(sm_real));
        if (!x || !w || !b || !out || !dy || !col || !dcol || !tmp || !dw || !db) {
            fprintf(stderr, "specmoe bench gemm: out of memory\n");
            rc = CLI_EXIT_RUNTIME;
        } else {
            sm_rng rng;
            sm_rng_seed(&rng, 3);
            for (size_t i = 0; i < nin; i++) x[i] = (sm_real)(sm_rng_uniform(&rng) < 0.1); /* MinAtar-like frames */
            for (size_t i = 0; i < nw; i++) w[i] = (sm_real)(0.1 * sm_rng_normal(&rng));
            for (size_t i = 0; i < nout; i++) dy[i] = (sm_real)sm_rng_normal(&rng);
            for (int p = 0; p < 2; p++) {
                double best[2] = {1e30, 1e30};
                const double t_end = cpu_now() + seconds;
                do
                    for (int packed = 0; packed < 2; packed++) {
                        sm_gemm_tiny_set_simd(packed && had);
                        /* the backward reads the columns its own path's forward wrote */
                        if (p == 1) sm_conv2d_forward(out, col, tmp, x, w, b, B, C, H, W, OC, K, K, 1, pad);
                        const double t0 = cpu_now();
                        for (int r = 0; r < 4; r++) {
                            if (p == 0) sm_conv2d_forward(out, col, tmp, x, w, b, B, C, H, W, OC, K, K, 1, pad);
                            else sm_conv2d_backward(NULL, dw, db, dcol, tmp, dy, col, w, B, C, H, W, OC, K, K, 1, pad);
                        }
                        const double t = (cpu_now() - t0) / 4;
                        best[packed] = t < best[packed] ? t : best[packed];
                    }
                while (cpu_now() < t_end);
                sm_gemm_tiny_set_simd(had);
                const double fl = 2.0 * B * OH * OW * OC * C * K * K; /* forward, or the weight gradient */
                printf("bench-gemm-conv B=%d C=%d H=%d W=%d OC=%d K=%d pad=%d product=%s openblas_us=%.2f packed_us=%.2f "
                       "openblas_gflops=%.1f packed_gflops=%.1f packed_peak_fraction=%.3f ratio=%.2f packed=%d\n",
                       B, C, H, W, OC, K, pad, p ? "bwd" : "fwd", best[0] * 1e6, best[1] * 1e6, fl / best[0] / 1e9,
                       fl / best[1] / 1e9, fl / best[1] / 1e9 / peak, best[0] / best[1], sm_conv2d_packed(OC, OH, OW));
                fflush(stdout);
            }
        }
        free(x), free(w), free(b), free(out), free(dy), free(col), free(dcol), free(tmp), free(dw), free(db);
    }
    return rc;
}

int exp_engine_gemm(int argc, char **argv) {
    double seconds;
    fl_flag fl[] = {
        {"seconds", FL_DOUBLE, &seconds, "0.3", "minimum timed seconds per shape", 0},
    };
    const char *pos[1];
    int npos;
    int rc = fl_parse(fl, 1, argc, argv, 3, "bench gemm", "[--seconds S]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (!(seconds > 0 && seconds <= 60)) {
        fprintf(stderr, "specmoe bench gemm: --seconds must be in (0, 60]\n");
        return CLI_EXIT_USAGE;
    }
    cli_set_threads(1);
    double one = 0, all = 0;
    const char *isa = "";
    const double pc0 = cpu_now();
    const double peak = exp_fma_peak(1, &one, &all, &isa);
    /* the same kernel's rate per CPU second (as tools/peers/dqn_update.c): exp_fma_peak times 5 + 5
     * runs of 4e6 x 12 vector multiply-adds on one thread; a loaded machine lowers the wall-clock
     * peak with this process's share of the core, not this one. The packed lines below are timed
     * in CPU seconds and divided by it. */
    const int lanes = !strcmp(isa, "avx512") ? 16 : !strcmp(isa, "avx2-fma") ? 8 : 4;
    const double peak_cpu = 10.0 * 4e6 * 12 * lanes * 2 / (cpu_now() - pc0) / 1e9;
    printf("bench-gemm-peak threads=1 isa=%s gflops=%.1f gflops_per_cpu_s=%.1f\n", isa, peak, peak_cpu);
    static const int Ms[] = {1, 32, 64, 128, 256}, Ws[] = {64, 128, 256, 512, 1024};
    const int maxw = 1024, maxm = 256;
    sm_real *x = malloc(sizeof(sm_real) * maxm * maxw), *w = malloc(sizeof(sm_real) * maxw * maxw),
            *y = malloc(sizeof(sm_real) * maxm * maxw);
    if (!x || !w || !y) {
        free(x), free(w), free(y);
        fprintf(stderr, "specmoe bench gemm: out of memory\n");
        return CLI_EXIT_RUNTIME;
    }
    sm_rng rng;
    sm_rng_seed(&rng, 1);
    for (int i = 0; i < maxm * maxw; i++) x[i] = (sm_real)sm_rng_normal(&rng);
    for (int i = 0; i < maxw * maxw; i++) w[i] = (sm_real)(0.03 * sm_rng_normal(&rng));
    for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
        for (size_t b = 0; b < sizeof Ws / sizeof Ws[0]; b++) {
            const int M = Ms[a], K = Ws[b], N = Ws[b] == 1024 ? 128 : Ws[b]; /* 1024 -> 128: the MinAtar DQN layer */
            long calls = 0;
            double t0 = sm_time_now(), t;
            do {
                for (int r = 0; r < 16; r++) sm_gemm(0, 1, M, N, K, 1, x, K, w, K, 0, y, N);
                calls += 16;
                t = sm_time_now() - t0;
            } while (t < seconds);
            const double us = t / calls * 1e6, gf = 2.0 * M * N * K / (t / calls) / 1e9;
            printf("bench-gemm M=%d K=%d N=%d us_per_call=%.2f gflops=%.1f peak_fraction=%.3f\n", M, K, N, us, gf, gf / peak);
            fflush(stdout);
        }
    free(x);
    free(w);
    free(y);
    rc = bench_packed(seconds, peak_cpu);
    return rc ? rc : bench_conv(seconds, peak_cpu);
}
