/* specmoe bench layer: forward + backward + Adam step of one MoE layer (d -> h -> d ReLU experts,
 * token-choice top-k), timed per shape, beside the same expert GEMMs run through plain OpenBLAS
 * sgemm in the same process. Prints one machine-readable line per shape (tools/bench_compare.sh
 * parses them).
 *
 * Where it lives: this is a benchmark of the engine, not a paper study, but it sits under
 * experiments/engine/ rather than cli/ so that every `specmoe bench` row reaches its benchmark the
 * same way (cli/cmd_bench.c -> experiments/experiments.h) and cli/ holds only commands and their
 * shared helpers.
 *
 * Parse (flags -> layer_settings), run (one measurement -> a result struct) and report (result ->
 * the machine-readable line) are separate functions; the entry point reports each measurement as
 * soon as it is taken, so the lines still appear one by one during a long run. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/engine/peak.h"
#include "experiments/experiments.h"

typedef struct {
    int T, d, h, E, k;
} shape;

#define MAX_SHAPES 32

typedef struct {
    shape shapes[MAX_SHAPES];
    int n_shapes, threads, verbose, routing;
    double seconds;
    uint64_t seed;
} layer_settings;

/* the machine's fp32 multiply-add peak (peak.c) */
typedef struct {
    int threads;
    double one, all, peak; /* GFLOP/s: one thread, all threads, the bound */
    const char *isa;
} peak_result;

/* one shape */
typedef struct {
    shape s;
    int threads;
    double step_s;  /* seconds per forward + backward + Adam step */
    double gemm_s;  /* seconds for the same expert GEMMs through plain sgemm */
    double flops;   /* expert GEMM FLOPs of one step */
    int gemm_calls; /* GEMM calls of one step on the sgemm side: 6 per expert */
    double floor_s; /* those FLOPs at the peak */
} shape_result;

/* the routing step alone: topk against three GrMoE variants */
#define N_GRASSMANN 3
typedef struct {
    int T, d, E, kr;
    double topk_s;                /* seconds per topk routing step */
    double grassmann_s[N_GRASSMANN];
    double floor_s;               /* GrMoE's unavoidable affinity FLOPs at the peak */
} routing_result;

static const struct {
    const char *label;
    int amortize, dense; /* dense: k = E, else k = 2 */
} kGrassmann[N_GRASSMANN] = {{"grassmann", 0, 1}, {"grassmann+amortizer", 1, 1}, {"grassmann-top2", 0, 0}};

static const char *kDefaultShapes = "256,64,256,8,2;256,128,256,10,2;1024,256,512,8,2;4096,512,2048,8,2;2048,256,1024,32,4";

static int parse_shapes(const char *s, shape *out, int max) {
    int n = 0;
    const char *p = s;
    while (*p && n < max) {
        shape x;
        int used = 0;
        if (sscanf(p, "%d,%d,%d,%d,%d%n", &x.T, &x.d, &x.h, &x.E, &x.k, &used) != 5) return -1;
        if (x.T < 1 || x.d < 1 || x.h < 1 || x.E < 1 || x.k < 1 || x.k > x.E) return -1;
        out[n++] = x;
        p += used;
        if (*p == ';') p++;
        else if (*p) return -1;
    }
    return n;
}

/* The six expert GEMMs of one step for an expert with n tokens (forward 2, backward 4). */
static void expert_gemms_sgemm(int n, int d, int h, const float *X, const float *W1, const float *W2, float *Hb,
                               float *Y, float *dW1, float *dW2, float *dX) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, h, d, 1, X, d, W1, d, 0, Hb, h);    /* H = X W1^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, d, h, 1, Hb, h, W2, h, 0, Y, d);    /* Y = H W2^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, h, d, 1, Y, d, W2, h, 0, Hb, h);  /* dH = dY W2 */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, h, n, 1, Y, d, Hb, h, 1, dW2, h);   /* dW2 += dY^T H */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, h, d, n, 1, Hb, h, X, d, 1, dW1, d);   /* dW1 += dH^T X */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, h, 1, Hb, h, W1, d, 0, dX, d); /* dX = dH W1 */
}

/* ---------------------------------------------------------------------------------------------- */
/* run */

/* Times one shape; peak: the machine's measured fp32 multiply-add bound in GFLOP/s. Returns -1 after
 * printing what failed. */
static int run_shape(shape s, double seconds, uint64_t seed, double peak, shape_result *res) {
    sm_error err;
    sm_moe_config cfg;
    sm_moe_config_default(&cfg);
    cfg.router.E = s.E;
    cfg.router.k = s.k;
    cfg.H = s.h;
    cfg.act = SM_ACT_RELU;
    sm_params ps;
    sm_params_init_table(&ps);
    sm_moe *m = sm_moe_create(&cfg, s.d, &err);
    if (!m || sm_moe_declare(m, &ps, "moe", &err) != SM_OK || sm_params_alloc(&ps, &err) != SM_OK) {
        fprintf(stderr, "specmoe: bench: %s\n", err.msg);
        return -1;
    }
    sm_rng rng;
    sm_rng_seed(&rng, seed);
    sm_params_initialize(&ps, &rng);
    sm_moe_bind(m, &ps);
    if (sm_moe_reserve(m, s.T, &err) != SM_OK) {
        fprintf(stderr, "specmoe: bench: %s\n", err.msg);
        return -1;
    }
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = SM_OPT_ADAM;
    sm_optim opt;
    sm_optim_init(&opt, &oc, &ps, &err);
    size_t N = (size_t)s.T * s.d;
    float *x = malloc(N * sizeof(float)), *G = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float)),
          *dx = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) {
        x[i] = (float)sm_rng_normal(&rng);
        G[i] = (float)sm_rng_normal(&rng) / (float)N;
    }
    /* one step = forward, backward with a fixed upstream gradient, Adam */
#define STEP()                                                \
    do {                                                      \
        sm_params_zero_grad(&ps);                             \
        sm_moe_forward(m, out, x, s.T, &rng, 1);              \
        memset(dx, 0, N * sizeof(float));                     \
        sm_moe_backward(m, dx, G, x, s.T);                    \
        sm_optim_step(&opt, &ps, 1e-4);                       \
    } while (0)
    for (int i = 0; i < 3; i++) STEP();
    int loads[4096];
    int E = s.E < 4096 ? s.E : 4096;
    for (int e = 0; e < E; e++) loads[e] = m->route.load[e];
    long iters = 0;
    double t0 = sm_time_now(), t1 = t0;
    while (t1 - t0 < seconds || iters < 3) {
        STEP();
        iters++;
        t1 = sm_time_now();
    }
#undef STEP
    double step_s = (t1 - t0) / iters;
    /* expert GEMM flops of one step: 6 GEMMs of 2*n*d*h per expert, n = tokens routed to it */
    double flops = 0;
    for (int e = 0; e < E; e++) flops += 12.0 * m->route.load[e] * s.d * s.h;
    /* the same GEMMs through plain sgemm, experts one after another (each GEMM multi-threaded) */
    float *W1 = malloc(sizeof(float) * s.h * s.d), *W2 = malloc(sizeof(float) * s.d * s.h);
    float *dW1 = calloc((size_t)s.h * s.d, sizeof(float)), *dW2 = calloc((size_t)s.d * s.h, sizeof(float));
    int maxn = 1;
    for (int e = 0; e < E; e++) maxn = loads[e] > maxn ? loads[e] : maxn;
    for (int e = 0; e < E; e++) maxn = m->route.load[e] > maxn ? m->route.load[e] : maxn;
    float *X = malloc(sizeof(float) * maxn * s.d), *Hb = malloc(sizeof(float) * maxn * s.h),
          *Y = malloc(sizeof(float) * maxn * s.d), *dX = malloc(sizeof(float) * maxn * s.d);
    for (size_t i = 0; i < (size_t)s.h * s.d; i++) W1[i] = W2[i] = 0.01f * (float)sm_rng_normal(&rng);
    for (size_t i = 0; i < (size_t)maxn * s.d; i++) X[i] = (float)sm_rng_normal(&rng);
    long g_iters = 0;
    double g0 = sm_time_now(), g1 = g0;
    while (g1 - g0 < seconds || g_iters < 3) {
        for (int e = 0; e < E; e++)
            if (m->route.load[e]) expert_gemms_sgemm(m->route.load[e], s.d, s.h, X, W1, W2, Hb, Y, dW1, dW2, dX);
        g_iters++;
        g1 = sm_time_now();
    }
    double gemm_s = (g1 - g0) / g_iters;
    /* the roofline: no fp32 implementation does the expert GEMMs alone faster than flops / peak */
    *res = (shape_result){.s = s, .threads = omp_get_max_threads(), .step_s = step_s, .gemm_s = gemm_s,
                          .flops = flops, .gemm_calls = 6 * E, .floor_s = flops / (peak * 1e9)};
    free(W1); free(W2); free(dW1); free(dW2); free(X); free(Hb); free(Y); free(dX);
    free(x); free(G); free(out); free(dx);
    sm_optim_free(&opt);
    sm_moe_free(m);
    sm_params_free(&ps);
    return 0;
}

/* The routing step alone (router forward + backward, no experts) for one router configuration.
 * Returns seconds per step. */
static double bench_router(const char *name, int amortize, int T, int d, int E, int k, int kr, double seconds) {
    sm_error err;
    sm_router_config c;
    sm_router_config_default(&c);
    (void)sm_router_config_set(&c, name, NULL); /* a router of the registry */
    c.E = E;
    c.k = k;
    if (!strcmp(name, "grassmann") || !strcmp(name, "vmf")) {
        sm_grmoe_opts(&c)->kr = kr;
        sm_grmoe_opts(&c)->amortize = amortize;
        sm_grmoe_opts(&c)->subspace_beta = 0; /* the regulariser is per step, not per token: timed separately below */
    }
    sm_params ps;
    sm_params_init_table(&ps);
    sm_router *r = sm_router_create(&c, d, &err);
    sm_route route;
    if (!r || r->ops->declare(r, &ps, "r", &err) != SM_OK || sm_params_alloc(&ps, &err) != SM_OK) {
        fprintf(stderr, "specmoe: bench: %s\n", err.msg);
        return -1;
    }
    sm_rng rng;
    sm_rng_seed(&rng, 5);
    sm_params_initialize(&ps, &rng);
    r->ops->bind(r, &ps);
    if (r->ops->reserve(r, T, &err) != SM_OK ||
        sm_route_alloc(&route, r->ops->kind, T, E, r->ops->max_assign(r, T), 0, &err) != SM_OK) {
        fprintf(stderr, "specmoe: bench: %s\n", err.msg);
        return -1;
    }
    float *x = malloc(sizeof(float) * (size_t)T * d), *dx = malloc(sizeof(float) * (size_t)T * d);
    for (size_t i = 0; i < (size_t)T * d; i++) x[i] = (float)sm_rng_normal(&rng) / 16;
    long iters = 0;
    double t0 = sm_time_now(), t1 = t0;
    while (t1 - t0 < seconds || iters < 5) {
        r->ops->forward(r, &route, x, T, &rng, 1);
        for (int a = 0; a < route.n_assign; a++) route.dweight[a] = 1e-3f;
        r->ops->backward(r, dx, &route, x, T);
        iters++;
        t1 = sm_time_now();
    }
    free(x);
    free(dx);
    sm_route_free(&route);
    sm_router_free(r);
    sm_params_free(&ps);
    return (t1 - t0) / iters;
}

/* The routing step alone at T=4096 d=512 E=16 k_r=32: topk, then the three GrMoE variants. GrMoE's
 * affinities ||U_e^T x||^2 for all experts are one GEMM Z = X [U_1 .. U_E] (T x d x E k_r) forward
 * and two backward (dU = X^T dZ, dx = dZ U^T): 6 T d E k_r FLOPs that no implementation avoids, so
 * floor_s = those FLOPs at the peak. */
static void run_routing(double seconds, double peak, routing_result *res) {
    const int T = 4096, d = 512, E = 16, kr = 32;
    *res = (routing_result){.T = T, .d = d, .E = E, .kr = kr};
    res->topk_s = bench_router("topk", 0, T, d, E, 2, kr, seconds);
    res->floor_s = 6.0 * T * d * E * kr / (peak * 1e9);
    for (int i = 0; i < N_GRASSMANN; i++)
        res->grassmann_s[i] = bench_router("grassmann", kGrassmann[i].amortize, T, d, E, kGrassmann[i].dense ? E : 2, kr, seconds);
}

/* ---------------------------------------------------------------------------------------------- */
/* report: one machine-readable line per measurement (tools/bench_compare.sh parses them) */

static void report_peak(const peak_result *p, int verbose) {
    printf("bench-peak threads=%d isa=%s fma_gflops_1thread=%.1f fma_gflops_all=%.1f peak_gflops=%.1f\n", p->threads,
           p->isa, p->one, p->all, p->peak);
    if (verbose)
        printf("  (fp32 multiply-add rate with no memory traffic: peak_gflops = max(all threads, threads x one "
               "thread) bounds every GEMM below)\n");
}

static void report_shape(const shape_result *r, int verbose) {
    const shape s = r->s;
    double ours = r->flops / r->step_s / 1e9, plain = r->flops / r->gemm_s / 1e9;
    printf("bench-layer T=%d d=%d h=%d E=%d k=%d threads=%d ms_per_step=%.4f tokens_per_s=%.0f expert_gflops=%.2f "
           "sgemm_gflops=%.2f gemm_ratio=%.3f floor_ms=%.4f max_tokens_per_s=%.0f\n",
           s.T, s.d, s.h, s.E, s.k, r->threads, 1e3 * r->step_s, s.T / r->step_s, ours, plain, ours / plain,
           1e3 * r->floor_s, s.T / r->floor_s);
    if (verbose) {
        printf("  (expert GEMM rate counts the whole step - router, gather/scatter, Adam - as GEMM time; "
               "sgemm runs the same %d GEMM calls back to back; floor_ms is the expert GEMMs' %.1f MFLOP at "
               "the measured peak, max_tokens_per_s the rate no fp32 implementation of this step exceeds)\n",
               r->gemm_calls, r->flops / 1e6);
    }
    fflush(stdout);
}

/* min_ratio_vs_topk = floor / (the topk router's measured time) is the smallest ratio any fp32
 * GrMoE router reaches against this topk router on this machine. */
static void report_routing(const routing_result *r) {
    const double base = r->topk_s;
    printf("bench-routing router=topk T=%d d=%d E=%d k=2 ms_per_step=%.4f ratio_vs_topk=1.000\n", r->T, r->d, r->E,
           1e3 * base);
    for (int i = 0; i < N_GRASSMANN; i++) {
        double t = r->grassmann_s[i];
        printf("bench-routing router=%s T=%d d=%d E=%d k=%d k_r=%d ms_per_step=%.4f ratio_vs_topk=%.3f floor_ms=%.4f "
               "min_ratio_vs_topk=%.3f\n",
               kGrassmann[i].label, r->T, r->d, r->E, kGrassmann[i].dense ? r->E : 2, r->kr, 1e3 * t, t / base,
               1e3 * r->floor_s, r->floor_s / base);
    }
    fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------- */
/* parse */

/* flags -> settings; returns 0, 1 after --help, 2 after a usage error (printed), like fl_parse */
static int parse(layer_settings *o, int argc, char **argv) {
    const char *shapes_s;
    fl_flag fl[] = {
        {"shapes", FL_STRING, &shapes_s, kDefaultShapes, "T,d,h,E,k;... shapes to time", 0},
        {"threads", FL_INT, &o->threads, "2", "OpenMP / OpenBLAS threads", 0},
        {"seconds", FL_DOUBLE, &o->seconds, "1", "minimum timed seconds per shape and per side", 0},
        {"seed", FL_U64, &o->seed, "1", "seed of weights and inputs", 0},
        {"verbose", FL_BOOL, &o->verbose, "0", "explain each measurement", 0},
        {"routing", FL_BOOL, &o->routing, "1", "also time the routing step alone: topk vs grassmann (T=4096 d=512 E=16 k_r=32)", 0},
    };
    int npos;
    const char *pos[1];
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 3, "bench layer", "[flags]", pos, 0, &npos);
    if (rc) return rc;
    o->n_shapes = parse_shapes(shapes_s, o->shapes, MAX_SHAPES);
    if (o->n_shapes <= 0) {
        fprintf(stderr, "specmoe bench layer: --shapes: '%s' is not a list of T,d,h,E,k with 1 <= k <= E\n", shapes_s);
        return 2;
    }
    if (o->threads < 1 || !(o->seconds > 0)) {
        fprintf(stderr, "specmoe bench layer: --threads must be >= 1 and --seconds > 0\n");
        return 2;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */

int exp_engine_layer(int argc, char **argv) {
    layer_settings o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    cli_set_threads(o.threads);
    peak_result p = {.threads = o.threads};
    p.peak = exp_fma_peak(o.threads, &p.one, &p.all, &p.isa);
    report_peak(&p, o.verbose);
    for (int i = 0; i < o.n_shapes; i++) {
        shape_result r;
        if (run_shape(o.shapes[i], o.seconds, o.seed, p.peak, &r) < 0) return CLI_EXIT_RUNTIME;
        report_shape(&r, o.verbose);
    }
    if (o.routing) {
        routing_result r;
        run_routing(o.seconds, p.peak, &r);
        report_routing(&r);
    }
    return 0;
}
