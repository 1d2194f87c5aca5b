/* CPU time of one gradient step of SPHERE's MoE actor with and without SPHERE, per coefficient mode,
 * as the expert count grows (issue 15; the paper's Table 24 and App. J.12, whose large-E runs
 * optimise L_base + lambda L directly: our "fixed" mode).
 *
 *   cc -O3 -march=x86-64-v2 -mtune=native -fopenmp -Iinclude -I. tools/sphere/step_time.c build/libspecmoe.a \
 *      -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -llapacke -lcjson -lmujoco -lz -lm \
 *      $(mpicc --showme:link) -o build/step_time
 *   build/step_time [REPS [E...]]          (default: 200 repetitions; E = 10 20 40)
 *
 * The actor is the paper's (REFERENCE-NOTES "SPHERE"): E experts, each an MLP 17 -> 256 -> 256 -> 256
 * -> 6 (ReLU, the cheetah's observation and action widths), top-2 at temperature 1 over a separate
 * 3 x 256 gate MLP; one minibatch of T = 64 states (HumanoidBench's PPO minibatch). A step is the
 * actor's forward and backward from a fixed output gradient - the critic, the optimiser and the
 * rollouts of a PPO update are left out, so the overhead below is an upper bound of the update's. The
 * variants, alternated in every repetition so drift hits them alike, one thread:
 *   base   forward + backward
 *   fixed  + sm_sphere_inject before the backward (mode fixed, and loss: the same work)
 *   grad   + sm_sphere_step after it (mode grad: a second backward for grad L and the two norms)
 * Prints the medians and the overheads against base. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/methods/sphere/sphere.h"
#include "specmoe/nn/model.h"
#include "tools/sphere/cpu_time.h"


enum { T = 64, OBS = 17, ACT = 6, V = 3 };

static int run(int E, int reps) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    if (sm_model_parse_arch(&cfg, "moehead:256:3:256", &err) != SM_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    cfg.in_dim = OBS, cfg.n_classes = ACT;
    cfg.act = SM_ACT_RELU, cfg.moe.act = SM_ACT_RELU, cfg.moe.depth = 3, cfg.moe.expert_bias = 1;
    cfg.moe.router.E = E, cfg.moe.router.k = 2, cfg.moe.router.temperature = 1, cfg.moe.router.renorm = 1;
    cfg.moe.router.balance_coef = 0;
    sm_rng r;
    sm_rng_seed(&r, 7);
    sm_model *m = sm_model_create(&cfg, T, &r, &err);
    if (!m) return fprintf(stderr, "%s\n", err.msg), 1;
    sm_sphere_reg *reg[V] = {NULL};
    const sm_sphere_mode modes[V] = {SM_SPHERE_GRAD, SM_SPHERE_FIXED, SM_SPHERE_GRAD};
    for (int v = 1; v < V; v++) {
        sm_sphere_config sc = {.rho = 1e-3, .mode = modes[v], .seed = 7};
        if (!(reg[v] = sm_sphere_reg_create(&sc, m, &err))) return fprintf(stderr, "%s\n", err.msg), 1;
    }
    float x[T * OBS];
    sm_real g[T * ACT];
    for (int i = 0; i < T * OBS; i++) x[i] = (float)sm_rng_normal(&r);
    for (int i = 0; i < T * ACT; i++) g[i] = (sm_real)(0.01 * sm_rng_normal(&r));
    double *t = malloc(sizeof(double) * (size_t)V * reps);
    if (!t) return fprintf(stderr, "step_time: out of memory\n"), 1;
    for (int it = -5; it < reps; it++) /* five warm-up rounds */
        for (int v = 0; v < V; v++) {
            const double t0 = cpu_now();
            sm_model_forward(m, x, T, NULL, 1);
            memcpy(m->dlogits, g, sizeof g);
            sm_params_zero_grad(&m->params);
            if (v == 1) (void)sm_sphere_inject(reg[v], 1.0, T, NULL);
            sm_model_backward(m, T);
            if (v == 2) sm_sphere_step(reg[v], NULL, 0, 1.0, T, NULL);
            if (it >= 0) t[(size_t)v * reps + it] = cpu_now() - t0;
        }
    double med[V];
    for (int v = 0; v < V; v++) med[v] = median(t + (size_t)v * reps, reps);
    printf("sphere-step E=%d k=2 T=%d width=256 params=%zu base_us=%.0f fixed_us=%.0f grad_us=%.0f fixed_overhead=%+.1f%% "
           "grad_overhead=%+.1f%%\n",
           E, T, m->params.total, 1e6 * med[0], 1e6 * med[1], 1e6 * med[2], 100 * (med[1] / med[0] - 1),
           100 * (med[2] / med[0] - 1));
    fflush(stdout);
    free(t);
    for (int v = 1; v < V; v++) sm_sphere_reg_free(reg[v]);
    sm_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    if (reps < 1) return fprintf(stderr, "step_time: REPS must be a positive integer\n"), 2;
    omp_set_num_threads(1);
    int rc = 0;
    if (argc > 2)
        for (int i = 2; i < argc && !rc; i++) {
            const int E = atoi(argv[i]);
            if (E < 2 || E > 1024) return fprintf(stderr, "step_time: E must be in [2, 1024], not '%s'\n", argv[i]), 2;
            rc = run(E, reps);
        }
    else
        for (int E = 10; E <= 40 && !rc; E *= 2) rc = run(E, reps);
    return rc;
}
