/* specmoe bench gemm: sgemm (OpenBLAS, through sm_gemm) at the small shapes of RL networks - batch
 * 1-256 rows, widths 64-1024 - against the one-thread FMA peak. At these sizes a call's fixed cost
 * (argument checks, packing the weight matrix into OpenBLAS's panels on every call) weighs against
 * few FLOPs, so the rate falls far below the peak; this measures by how much, shape by shape:
 *   bench-gemm M=.. K=.. N=.. us_per_call=.. gflops=.. peak_fraction=..
 * The layer is out (M, N) = x (M, K) @ W (N, K)^T, as a dense layer's forward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/engine/peak.h"
#include "experiments/experiments.h"

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
    const double peak = exp_fma_peak(1, &one, &all, &isa);
    printf("bench-gemm-peak threads=1 isa=%s gflops=%.1f\n", isa, peak);
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
    return 0;
}
