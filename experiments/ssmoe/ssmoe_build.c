/* specmoe bench ssmoe-build: the one-off cost of building SSMoE's EV router for one MoE layer of
 * SwiGLU experts (gate and up as stored, down transposed: 3 descriptors per expert), experts spread
 * over the OpenMP threads. Random weights: the SVD cost does not depend on the values.
 *
 * parse (flags -> build_settings), run (settings -> build_results: the timing), report (results ->
 * one machine-readable line). */
#include <stdio.h>
#include <stdlib.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"

typedef struct {
    int E, d, I, c, threads;
    uint64_t seed;
} build_settings;

typedef struct {
    double seconds;
    int failed; /* descriptor builds that failed */
} build_results;

/* ---------------------------------------------------------------------------------------------- */
/* parse */

/* flags -> settings; returns 0, 1 after --help, 2 after a usage error (printed), like fl_parse */
static int parse(build_settings *o, int argc, char **argv) {
    fl_flag fl[] = {
        {"experts", FL_INT, &o->E, "64", "experts in the layer", 0},
        {"d", FL_INT, &o->d, "2048", "model width", 0},
        {"inter", FL_INT, &o->I, "1024", "expert intermediate width I (SwiGLU)", 0},
        {"ev-c", FL_INT, &o->c, "50", "singular vectors per descriptor (the paper's language-model setting)", 0},
        {"threads", FL_INT, &o->threads, "2", "OpenMP threads (experts in parallel)", 0},
        {"seed", FL_U64, &o->seed, "1", "seed of the random weights", 0},
    };
    int npos;
    const char *pos[1];
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 3, "bench ssmoe-build", "[flags]", pos, 0, &npos);
    if (rc) return rc;
    if (o->E < 1 || o->d < 1 || o->I < 1 || o->c < 1 || o->threads < 1 || (double)o->I * o->d > 1e9) {
        fprintf(stderr, "specmoe bench ssmoe-build: --experts, --d, --inter, --ev-c, --threads must be >= 1 (I*d <= 1e9)\n");
        return 2;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* run */

static void run(const build_settings *o, build_results *R) {
    const int E = o->E, d = o->d, I = o->I, c = o->c;
    int failed = 0, done = 0, every = E / 16 > 1 ? E / 16 : 1; /* about 16 progress lines */
    cli_set_threads(o->threads);
    double t0 = sm_time_now();
#pragma omp parallel
    {
        float *w = malloc(sizeof(float) * (size_t)I * d), *row = malloc(sizeof(float) * (size_t)d);
        double *desc = malloc(sizeof(double) * (size_t)d);
#pragma omp for schedule(dynamic, 1)
        for (int e = 0; e < E; e++) {
            sm_rng r;
            sm_rng_seed(&r, o->seed * 1000003 + (uint64_t)e);
            for (int k = 0; k < d; k++) row[k] = (float)sm_rng_normal(&r);
            for (int j = 0; j < 3; j++) { /* gate, up, down^T: each (I, d) */
                for (size_t i = 0; i < (size_t)I * d; i++) w[i] = (float)(sm_rng_normal(&r) * 0.02);
                sm_error err;
                if (!w || !row || !desc || sm_ev_descriptor(desc, w, I, d, row, c, &err) != SM_OK) {
#pragma omp atomic
                    failed++;
                }
            }
            /* progress on stderr (a large layer takes minutes); the timing includes these few lines */
#pragma omp critical(build_progress)
            if (++done % every == 0 || done == E) {
                fprintf(stderr, "bench ssmoe-build: [%d/%d] experts built (%.0f s)\n", done, E, sm_time_now() - t0);
                fflush(stderr);
            }
        }
        free(w);
        free(row);
        free(desc);
    }
    R->seconds = sm_time_now() - t0;
    R->failed = failed;
}

/* ---------------------------------------------------------------------------------------------- */
/* report */

/* the timing line, or the failure; the exit code */
static int report(const build_settings *o, const build_results *R) {
    if (R->failed) {
        fprintf(stderr, "specmoe: bench ssmoe-build: %d descriptor builds failed\n", R->failed);
        return CLI_EXIT_RUNTIME;
    }
    printf("bench-ssmoe-build experts=%d d=%d I=%d matrices=%d c=%d threads=%d seconds=%.2f per_expert_ms=%.1f\n", o->E,
           o->d, o->I, 3 * o->E, o->c, o->threads, R->seconds, 1e3 * R->seconds / o->E);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */

int exp_ssmoe_build(int argc, char **argv) {
    build_settings o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    build_results R;
    run(&o, &R);
    return report(&o, &R);
}
