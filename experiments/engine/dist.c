/* specmoe bench dist: time per training step of one MoE layer split over the ranks of an MPI run,
 * data parallel (every rank the whole layer and T/P tokens, the gradient block allreduced) and expert
 * parallel (every rank E/P experts, tokens exchanged by all-to-all, include/specmoe/dist/ep.h), at
 * the `bench layer` shapes; the bytes each rank sends per step; and a cost model
 *
 *   t(P) = t1 / P + comm(P),
 *   data parallel:   comm = 2 (P-1) alpha + 2 (P-1)/P * N_grad / beta       (ring allreduce)
 *   expert parallel: comm = 5 (P-1) alpha + bytes_rank(P) / beta, bytes_rank(P) = (P-1)/P * (T k / P) (2d + 2O) * 4
 *                    (+ the router's allreduce, as data parallel over its few values)
 *
 * with t1 the one-rank step time of the whole batch (measured here, on rank 0 alone), alpha and
 * beta the latency and bandwidth between two ranks (fitted here from allreduces of 8 bytes and of
 * 16 MiB), which predicts the measured P = 2 step, and a network's alpha and beta (--net-gbps,
 * --net-latency-us) for P = 8 ... 64 nodes. The model assumes no overlap of computation and
 * communication, no congestion, and perfectly balanced experts.
 *
 * Run: mpirun --allow-run-as-root --oversubscribe -np 2 build/specmoe bench dist (or -np 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"
#include "specmoe/dist/ep.h"

#define MAX_SHAPES 8
typedef struct {
    int T, d, h, E, k;
} dshape;

typedef struct {
    dshape s[MAX_SHAPES];
    int n, steps, threads;
    double net_gbps, net_lat_us;
} dist_settings;

static int parse_dshapes(const char *s, dshape *out, int max) {
    int n = 0;
    while (*s && n < max) {
        dshape x;
        int used = 0;
        if (sscanf(s, "%d,%d,%d,%d,%d%n", &x.T, &x.d, &x.h, &x.E, &x.k, &used) != 5 || x.T < 1 || x.d < 1 || x.h < 1 ||
            x.k < 1 || x.k > x.E)
            return -1;
        out[n++] = x;
        s += used;
        if (*s == ';') s++;
        else if (*s) return -1;
    }
    return n;
}

/* one layer's step: forward, backward, and the step's exchange (mode 0: allreduce of the whole
 * gradient block; 1: the expert-parallel layer) and Adam; seconds per step and in communication */
typedef struct {
    double step_s, comm_s, bytes; /* per step, this rank */
    size_t n_grad;                /* values in the (this rank's) gradient block */
} step_time;

static sm_status time_dense(sm_dist *dist, const dshape *s, int T, int steps, int reduce, step_time *out, sm_error *err) {
    sm_moe_config cfg;
    sm_moe_config_default(&cfg);
    cfg.H = s->h, cfg.router.E = s->E, cfg.router.k = s->k;
    sm_moe *m = sm_moe_create(&cfg, s->d, err);
    if (!m) return SM_ERR_ARG;
    sm_params ps;
    sm_params_init_table(&ps);
    sm_optim opt;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    sm_rng rng;
    sm_rng_seed(&rng, 1);
    sm_status st = sm_moe_declare(m, &ps, "moe", err);
    if (st == SM_OK) st = sm_params_alloc(&ps, err);
    if (st == SM_OK) sm_params_initialize(&ps, &rng), sm_moe_bind(m, &ps), st = sm_moe_reserve(m, T, err);
    int have_opt = st == SM_OK && (st = sm_optim_init(&opt, &oc, &ps, err)) == SM_OK;
    sm_real *x = malloc(sizeof(sm_real) * (size_t)T * s->d * 2), *dx = x + (size_t)T * s->d;
    sm_real *y = malloc(sizeof(sm_real) * (size_t)T * m->O * 2), *dy = y + (size_t)T * m->O;
    if (st == SM_OK && (!x || !y)) st = sm_fail(err, SM_ERR_NOMEM, "bench dist: out of memory");
    for (size_t i = 0; st == SM_OK && i < (size_t)T * s->d; i++) x[i] = (sm_real)sm_rng_normal(&rng);
    for (size_t i = 0; st == SM_OK && i < (size_t)T * m->O; i++) dy[i] = (sm_real)sm_rng_normal(&rng);
    double comm = 0, bytes0 = dist->bytes_allreduce, t0 = 0;
    for (int it = -1; st == SM_OK && it < steps; it++) { /* one warm-up step */
        if (it == 0) t0 = sm_time_now(), comm = 0, bytes0 = dist->bytes_allreduce;
        sm_params_zero_grad(&ps);
        memset(dx, 0, sizeof(sm_real) * (size_t)T * s->d);
        sm_moe_forward(m, y, x, T, &rng, 1);
        sm_moe_backward(m, dx, dy, x, T);
        double c0 = sm_time_now();
        if (reduce) st = sm_dist_grad_mean(dist, &ps, err);
        comm += sm_time_now() - c0;
        sm_optim_step(&opt, &ps, 1e-4);
    }
    if (st == SM_OK)
        *out = (step_time){(sm_time_now() - t0) / steps, comm / steps, (dist->bytes_allreduce - bytes0) / steps, ps.total};
    free(x);
    free(y);
    if (have_opt) sm_optim_free(&opt);
    sm_params_free(&ps);
    sm_moe_free(m);
    return st;
}

static sm_status time_ep(sm_dist *dist, const dshape *s, int T, int steps, step_time *out, sm_error *err) {
    sm_moe_config cfg;
    sm_moe_config_default(&cfg);
    cfg.H = s->h, cfg.router.E = s->E, cfg.router.k = s->k;
    sm_rng rng;
    sm_rng_seed(&rng, 1);
    sm_ep_moe *ep = sm_ep_moe_create(dist, &cfg, s->d, T, "moe", &rng, err);
    if (!ep) return SM_ERR_ARG;
    sm_optim opt;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    sm_status st = sm_optim_init(&opt, &oc, &ep->params, err);
    int have_opt = st == SM_OK;
    sm_real *x = malloc(sizeof(sm_real) * (size_t)T * s->d * 2), *dx = x + (size_t)T * s->d;
    sm_real *y = malloc(sizeof(sm_real) * (size_t)T * ep->O * 2), *dy = y + (size_t)T * ep->O;
    if (st == SM_OK && (!x || !y)) st = sm_fail(err, SM_ERR_NOMEM, "bench dist: out of memory");
    sm_rng_seed(&rng, 2 + (uint64_t)dist->rank);
    for (size_t i = 0; st == SM_OK && i < (size_t)T * s->d; i++) x[i] = (sm_real)sm_rng_normal(&rng);
    for (size_t i = 0; st == SM_OK && i < (size_t)T * ep->O; i++) dy[i] = (sm_real)sm_rng_normal(&rng);
    double t0 = 0, c0 = 0, b0 = 0;
    for (int it = -1; st == SM_OK && it < steps; it++) {
        if (it == 0) t0 = sm_time_now(), c0 = ep->seconds_comm, b0 = dist->bytes_alltoall + dist->bytes_allreduce;
        sm_params_zero_grad(&ep->params);
        memset(dx, 0, sizeof(sm_real) * (size_t)T * s->d);
        if ((st = sm_ep_moe_forward(ep, y, x, T, &rng, 1, err)) != SM_OK) break;
        if ((st = sm_ep_moe_backward(ep, dx, dy, x, T, err)) != SM_OK) break;
        double r0 = sm_time_now();
        if ((st = sm_ep_moe_router_grad_sum(ep, err)) != SM_OK) break;
        ep->seconds_comm += sm_time_now() - r0;
        sm_optim_step(&opt, &ep->params, 1e-4);
    }
    if (st == SM_OK)
        *out = (step_time){(sm_time_now() - t0) / steps, (ep->seconds_comm - c0) / steps,
                           (dist->bytes_alltoall + dist->bytes_allreduce - b0) / steps, ep->params.total};
    free(x);
    free(y);
    if (have_opt) sm_optim_free(&opt);
    sm_ep_moe_free(ep);
    return st;
}

/* the model's communication seconds per step for P ranks (see the top comment) */
static double model_dp(double alpha, double beta, int P, size_t n_grad) {
    return P < 2 ? 0 : 2.0 * (P - 1) * alpha + 2.0 * (P - 1) / P * (double)n_grad * sizeof(sm_real) / beta;
}
static double model_ep(double alpha, double beta, int P, const dshape *s, size_t n_router) {
    if (P < 2) return 0;
    double rows = (double)s->T * s->k / P, bytes = (double)(P - 1) / P * rows * (2.0 * s->d + 2.0 * s->d) * sizeof(sm_real);
    return 5.0 * (P - 1) * alpha + bytes / beta + model_dp(alpha, beta, P, n_router);
}

int exp_engine_dist(int argc, char **argv) {
    dist_settings o;
    const char *shapes_s;
    fl_flag fl[] = {
        {"shapes", FL_STRING, &shapes_s, "256,64,256,8,2;1024,256,512,8,2;4096,512,2048,8,2;2048,256,1024,32,4",
         "T,d,h,E,k;... global batch T split over the ranks (bench layer's shapes whose E the ranks divide)", 0},
        {"steps", FL_INT, &o.steps, "20", "timed steps per shape and mode", 0},
        {"threads", FL_INT, &o.threads, "1", "OpenMP / OpenBLAS threads per rank", 0},
        {"net-gbps", FL_DOUBLE, &o.net_gbps, "100", "the model's network bandwidth between nodes, Gbit/s", 0},
        {"net-latency-us", FL_DOUBLE, &o.net_lat_us, "2", "the model's network latency, microseconds", 0},
    };
    int npos;
    const char *pos[1];
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 3, "bench dist", "[flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    o.n = parse_dshapes(shapes_s, o.s, MAX_SHAPES);
    if (o.n <= 0 || o.steps < 1 || o.threads < 1) {
        fprintf(stderr, "specmoe bench dist: --shapes must be T,d,h,E,k;... with 1 <= k <= E; --steps, --threads >= 1\n");
        return CLI_EXIT_USAGE;
    }
    sm_dist dist;
    sm_error err;
    if (sm_dist_init(&dist, &argc, &argv, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    if (!dist.active && dist.size == 1 && sm_dist_built() && sm_dist_launched_size() == 0) {
        fprintf(stderr, "specmoe bench dist: start it with mpirun (-np 1 or more): the expert-parallel layer needs MPI\n");
        return CLI_EXIT_USAGE;
    }
    if (!sm_dist_built()) {
        fprintf(stderr, "specmoe bench dist: specmoe was built without MPI (make MPI=1)\n");
        return CLI_EXIT_USAGE;
    }
    cli_set_threads(o.threads);
    const int P = dist.size, me = dist.rank;
    if (me != 0 && !freopen("/dev/null", "w", stdout)) return CLI_EXIT_RUNTIME;
    /* latency and bandwidth between the ranks, from allreduces (2-rank ring: 2 alpha + N / beta) */
    double alpha = 0, beta = 1e30;
    if (P > 1) {
        const int big = 1 << 21; /* 16 MiB of doubles */
        double *buf = calloc((size_t)big, sizeof(double));
        if (!buf) {
            fprintf(stderr, "specmoe: bench dist: out of memory\n");
            return CLI_EXIT_RUNTIME;
        }
        double t_small = 1e30, t_big = 1e30;
        for (int r = 0; r < 50; r++) {
            double t0 = sm_time_now();
            sm_dist_sum(&dist, buf, 1, &err);
            double t = sm_time_now() - t0;
            if (t < t_small) t_small = t;
        }
        for (int r = 0; r < 5; r++) {
            double t0 = sm_time_now();
            sm_dist_sum(&dist, buf, big, &err);
            double t = sm_time_now() - t0;
            if (t < t_big) t_big = t;
        }
        free(buf);
        double both[2] = {t_small, t_big}; /* rank 0's view, shared */
        sm_dist_bcast(&dist, both, sizeof both, 0, &err);
        alpha = both[0] / (2.0 * (P - 1));
        beta = 2.0 * (P - 1) / P * (double)big * sizeof(double) / (both[1] - 2.0 * (P - 1) * alpha);
        printf("bench-dist ranks=%d link: alpha=%.2f us beta=%.2f GB/s (allreduce of 8 B: %.1f us, of 16 MiB: %.2f ms)\n", P,
               1e6 * alpha, beta / 1e9, 1e6 * t_small, 1e3 * t_big);
    }
    const double net_alpha = o.net_lat_us * 1e-6, net_beta = o.net_gbps * 1e9 / 8;
    for (int i = 0; i < o.n; i++) {
        const dshape *s = &o.s[i];
        if (s->T % P || s->E % P) {
            printf("bench-dist T=%d d=%d h=%d E=%d k=%d: skipped (T and E must be divisible by %d ranks)\n", s->T, s->d, s->h,
                   s->E, s->k, P);
            continue;
        }
        /* t1: the whole batch on rank 0 alone, the others waiting */
        step_time one = {0}, dp, ep;
        double x = 0;
        sm_status st = me == 0 ? time_dense(&dist, s, s->T, o.steps, 0, &one, &err) : SM_OK;
        if (st == SM_OK) st = sm_dist_sum(&dist, &x, 1, &err); /* a barrier */
        if (st == SM_OK) st = sm_dist_bcast(&dist, &one, sizeof one, 0, &err);
        if (st == SM_OK) st = time_dense(&dist, s, s->T / P, o.steps, 1, &dp, &err);
        if (st == SM_OK) st = time_ep(&dist, s, s->T / P, o.steps, &ep, &err);
        if (st != SM_OK) {
            sm_dist_finalize(&dist);
            return cli_fail(st, &err);
        }
        /* the slowest rank sets the pace */
        double worst[4] = {dp.step_s, dp.comm_s, ep.step_s, ep.comm_s};
        sm_dist_max(&dist, worst, 4, &err);
        const size_t n_router = (size_t)s->E * s->d; /* the topk router's weight */
        printf("bench-dist T=%d d=%d h=%d E=%d k=%d ranks=%d one_rank_ms=%.3f\n", s->T, s->d, s->h, s->E, s->k, P,
               1e3 * one.step_s);
        printf("  data   parallel: ms_per_step=%.3f comm_ms=%.3f bytes_per_step_per_rank=%.0f model_ms=%.3f\n", 1e3 * worst[0],
               1e3 * worst[1], dp.bytes, 1e3 * (one.step_s / P + model_dp(alpha, beta, P, dp.n_grad)));
        printf("  expert parallel: ms_per_step=%.3f comm_ms=%.3f bytes_per_step_per_rank=%.0f model_ms=%.3f\n",
               1e3 * worst[2], 1e3 * worst[3], ep.bytes, 1e3 * (one.step_s / P + model_ep(alpha, beta, P, s, n_router)));
        printf("  model at %.0f Gbit/s, %.1f us (ms per step; speed-up over one rank):", o.net_gbps, o.net_lat_us);
        for (int q = 8; q <= 64; q *= 2) {
            if (s->E % q) { /* expert parallel needs E divisible by the ranks */
                double t = one.step_s / q + model_dp(net_alpha, net_beta, q, dp.n_grad);
                printf(" P=%d dp %.3f (%.1fx), ep -;", q, 1e3 * t, one.step_s / t);
                continue;
            }
            double tdp = one.step_s / q + model_dp(net_alpha, net_beta, q, dp.n_grad);
            double tep = one.step_s / q + model_ep(net_alpha, net_beta, q, s, n_router);
            printf(" P=%d dp %.3f (%.1fx), ep %.3f (%.1fx);", q, 1e3 * tdp, one.step_s / tdp, 1e3 * tep, one.step_s / tep);
        }
        printf("\n");
        fflush(stdout);
    }
    sm_dist_finalize(&dist);
    return 0;
}
