/* The DQN update of `specmoe rl train --agent dqn --preset minatar` on MinAtar Breakout, timed
 * alone, and its place under the fp32 multiply-add roofline (issue 13, speed: "the fraction of the
 * FLOP roofline the update reaches").
 *
 * The update is src/rl/dqn.c's update() for K = 1 atoms, through the public API:
 *   target forward on 32 next states -> y = r + gamma * disc * max_a Q_target(s', a)
 *   online forward on 32 states (train mode) -> Huber loss (sm_dqn_td_loss) -> zero_grad ->
 *   backward -> centered RMSprop step (lr 2.5e-4, alpha 0.95, eps 0.01).
 * Network: conv:16:3:1:0 (4 -> 16 channels, 3x3, 10x10 -> 8x8), ReLU, dense 1024 -> 128, ReLU,
 * head 128 -> 6, built from the same arch string as the preset. Batches are random binary images
 * (10% ones, about MinAtar's density but without its structure), fixed before timing, or with
 * --obs env frames of minatar/breakout under a uniform random policy (each transition a frame and
 * the one after it; about 8% ones, 85% of the rows all zero, which the convolution's zero skipping
 * leaves out: src/core/conv.c); --sample also times drawing them from a full 100k-transition replay
 * (sm_replay_sample), as the training loop does.
 *
 * FLOPs (a multiply-add = 2) of any network from sm_model_update_macs; for the preset's, per sample of
 * the batch (the hand count the library's is checked against):
 *   forward  conv 1024 outputs x 36 + dense 1024 x 128 + head 128 x 6 multiply-adds
 *   backward the weight gradients of the three layers (as many as the forward) and the input
 *            gradients of dense and head (the network input needs none)
 * The update's FLOPs = 32 x (2 forwards + backward); the element-wise work (bias, ReLU, Huber,
 * the RMSprop step over 132,566 parameters) is listed apart and not counted against the peak: it
 * is memory traffic, not multiply-adds.
 * The peak is `specmoe bench layer`'s (experiments/engine/peak.c, linked in): 12 independent
 * chains of vector FMAs per thread, best of 5; one thread here.
 *
 * Output (stdout):
 *   bench-peak threads=1 isa=... fma_gflops_1thread=G ...
 *   dqn-update batch=32 updates=K us_per_update=U cpu_us_per_update=V mflop=F gflops=R
 *              roofline_fraction=X target_fwd_us=.. online_fwd_us=.. backward_us=.. optim_us=.. [sample_us=..]
 *
 * Build and run (`make build/dqn_update`, with the Makefile's LIBS: -lmpi too when OpenMPI is
 * present; tools/peers/compare_dqn.sh builds its own beside its --bin):
 *   build/dqn_update [--seconds S] [--sample 0|1] [--obs random|env] [--zero-skip 0|1] [--threads T] [--arch A --router R --experts E --topk K --slots P]
 *                    [--dump FILE]   (writes the network and its Q-values on one batch instead; see dump_network)
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "experiments/engine/peak.h"
#include "specmoe.h"
#include "specmoe/io/safetensors.h"
#include "specmoe/rl/dqn.h"
#include "specmoe/rl/env.h"
#include "specmoe/rl/replay.h"

#define B 32       /* batch */
#define C 4        /* Breakout's channels */
#define HW 10      /* grid side */
#define D (C * HW * HW)
#define A 6        /* actions */
#define NB 16      /* distinct batches, reused round-robin */

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fail(const char *what, const sm_error *e) {
    fprintf(stderr, "dqn_update: %s: %s\n", what, e->msg);
    exit(1);
}

/* --dump FILE: a fixture for the PyTorch peer's check (tools/peers/dqn_minatar.py --check FILE) that
 * it computes this network's function, forward and backward. Written as safetensors:
 *   every parameter under its name, SoftMoE's learned scale set to 1.7 first (at initialisation it
 *     is 1, where a peer that left it out or squared it would agree);
 *   "check.obs" (B, C, HW, HW) the first batch's observations as the environment writes them,
 *   "check.act" (B) its actions (as floats), "check.y" (B) targets (its rewards),
 *   "check.q" (B, A) the Q-values of the observations in evaluation mode,
 *   "grad.<name>" the gradient of every parameter of the mean Huber loss of Q(s, a) - y (train mode;
 *     sm_dqn_td_loss, as the update's). */
_Static_assert(sizeof(sm_real) == sizeof(float), "dqn_update writes the float library's parameters as F32");
static sm_status dump_network(const char *path, sm_model *q, const float *obs, const int *act, const float *ret,
                              sm_error *err) {
    for (int i = 0; i < q->params.n; i++)
        if (strstr(q->params.p[i].name, "router.scale")) sm_params_data(&q->params, i)[0] = 1.7f;
    sm_rng rng;
    sm_rng_seed(&rng, 1);
    const sm_real *out = sm_model_forward(q, obs, B, &rng, 0);
    float qv[B * A], a[B], y[B];
    for (int i = 0; i < B * A; i++) qv[i] = (float)out[i];
    for (int i = 0; i < B; i++) a[i] = (float)act[i], y[i] = ret[i];
    sm_real td[B];
    out = sm_model_forward(q, obs, B, &rng, 1);
    sm_dqn_td_loss(q->dlogits, td, out, act, y, NULL, B, A, 1);
    sm_model_backward_set(q, B);
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_status st = SM_OK;
    char (*gname)[SM_NAME_MAX + 8] = calloc((size_t)q->params.n, sizeof *gname);
    if (!gname) st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < q->params.n && st == SM_OK; i++) {
        const sm_param *p = &q->params.p[i];
        snprintf(gname[i], sizeof gname[i], "grad.%s", p->name);
        st = sm_st_writer_add(&w, p->name, p->ndim, p->shape, sm_params_data(&q->params, i), err);
        if (st == SM_OK) st = sm_st_writer_add(&w, gname[i], p->ndim, p->shape, sm_params_grad(&q->params, i), err);
    }
    const int64_t so[4] = {B, C, HW, HW}, sq[2] = {B, A}, sb[1] = {B};
    if (st == SM_OK) st = sm_st_writer_add(&w, "check.obs", 4, so, obs, err);
    if (st == SM_OK) st = sm_st_writer_add(&w, "check.act", 1, sb, a, err);
    if (st == SM_OK) st = sm_st_writer_add(&w, "check.y", 1, sb, y, err);
    if (st == SM_OK) st = sm_st_writer_add(&w, "check.q", 2, sq, qv, err);
    if (st == SM_OK) st = sm_st_writer_write(&w, path, err);
    sm_st_writer_free(&w);
    free(gname);
    return st;
}

int main(int argc, char **argv) {
    double seconds = 3;
    int sample = 1, threads = 1, experts = 0, topk = 0, slots = 0;
    const char *arch = "conv:16:3:1:0,dense:128", *router = NULL, *obs_kind = "random", *dump = NULL;
    const char *ropt[32][2]; /* other --flag value pairs: router options (--temperature, --capacity, ...) */
    int n_ropt = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--sample") && i + 1 < argc) sample = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--zero-skip") && i + 1 < argc) sm_conv2d_set_zero_skip(atoi(argv[++i]));
        else if (!strcmp(argv[i], "--obs") && i + 1 < argc && (!strcmp(argv[i + 1], "random") || !strcmp(argv[i + 1], "env")))
            obs_kind = argv[++i];
        else if (!strcmp(argv[i], "--arch") && i + 1 < argc) arch = argv[++i];
        else if (!strcmp(argv[i], "--router") && i + 1 < argc) router = argv[++i];
        else if (!strcmp(argv[i], "--experts") && i + 1 < argc) experts = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--topk") && i + 1 < argc) topk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--slots") && i + 1 < argc) slots = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strncmp(argv[i], "--", 2) && i + 1 < argc && n_ropt < 32) {
            ropt[n_ropt][0] = argv[i] + 2;
            ropt[n_ropt++][1] = argv[++i];
        } else {
            fprintf(stderr, "usage: dqn_update [--seconds S] [--sample 0|1] [--obs random|env] [--zero-skip 0|1] [--threads T] [--arch A --router R --experts E "
                            "--topk K --slots P] [--ROUTER-OPTION VALUE ...] [--dump FILE]\n");
            return 2;
        }
    }
    /* another network than the preset's (e.g. a tokenised SoftMoE): its time per update, and its
     * FLOPs by sm_model_update_macs (checked below against the hand count of the preset's) */
    const int preset = !strcmp(arch, "conv:16:3:1:0,dense:128") && !router;
    omp_set_num_threads(threads);
    sm_error err = {0};
    sm_rng rng;
    sm_rng_seed(&rng, 1);

    /* the preset's network (src/rl/dqn.c build_nets) */
    sm_model_config mc;
    sm_model_config_default(&mc);
    if (sm_model_parse_arch(&mc, arch, &err) != SM_OK) fail("arch", &err);
    if (router && sm_router_config_set(&mc.moe.router, router, &err) != SM_OK) fail("router", &err);
    if (experts > 0) mc.moe.router.E = experts;
    if (experts > 0 && mc.moe.router.k > experts) mc.moe.router.k = experts;
    if (router && !strcmp(router, "soft")) mc.moe.router.k = 1;
    if (topk > 0) mc.moe.router.k = topk;
    if (slots > 0 && router && !strcmp(router, "soft")) sm_soft_opts(&mc.moe.router)->slots = slots;
    for (int i = 0; i < n_ropt; i++) /* as `rl train` takes them (e.g. --temperature 0.1, --renorm 0) */
        if (sm_router_config_set_flag(&mc.moe.router, ropt[i][0], ropt[i][1], &err) != SM_OK) fail("router option", &err);
    mc.act = SM_ACT_RELU;
    mc.in_c = C;
    mc.in_h = mc.in_w = HW;
    mc.in_dim = D;
    mc.n_classes = A;
    sm_model *q = sm_model_create(&mc, B, &rng, &err);
    if (!q) fail("online network", &err);
    sm_model *qt = sm_model_create(&mc, B, NULL, &err);
    if (!qt) fail("target network", &err);
    memcpy(qt->params.data, q->params.data, sizeof(sm_real) * q->params.total);
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = SM_OPT_RMSPROP;
    oc.lr = 2.5e-4;
    oc.alpha = 0.95;
    oc.eps = 0.01;
    oc.centered = 1;
    sm_optim opt;
    if (sm_optim_init(&opt, &oc, &q->params, &err) != SM_OK) fail("optimiser", &err);

    /* fixed batches, and a full replay to sample from */
    float *obs = malloc(sizeof(float) * NB * B * D), *next = malloc(sizeof(float) * NB * B * D);
    float *ret = malloc(sizeof(float) * NB * B), *disc = malloc(sizeof(float) * NB * B);
    int *act = malloc(sizeof(int) * NB * B);
    if (!strcmp(obs_kind, "env")) { /* consecutive frames of Breakout under a random policy */
        sm_vecenv v;
        if (sm_vecenv_init(&v, "minatar/breakout", 1, 7, NULL, &err) != SM_OK) fail("minatar/breakout", &err);
        float frame[D], fin[D], rew;
        int a;
        unsigned char te, tr;
        sm_vecenv_bind(&v, frame, &a, NULL, &rew, &te, &tr, fin);
        sm_vecenv_reset(&v);
        for (int k = 0; k < NB * B; k++) {
            memcpy(obs + (size_t)k * D, frame, sizeof frame);
            sm_env_random_actions(v.spec, &rng, 1, &a, NULL);
            sm_vecenv_step(&v);
            memcpy(next + (size_t)k * D, te || tr ? fin : frame, sizeof frame);
        }
        sm_vecenv_free(&v);
    } else
        for (int i = 0; i < NB * B * D; i++) {
            obs[i] = sm_rng_uniform(&rng) < 0.1 ? 1.0f : 0.0f;
            next[i] = sm_rng_uniform(&rng) < 0.1 ? 1.0f : 0.0f;
        }
    for (int i = 0; i < NB * B; i++) {
        act[i] = (int)sm_rng_below(&rng, A);
        ret[i] = sm_rng_uniform(&rng) < 0.05 ? 1.0f : 0.0f;
        disc[i] = sm_rng_uniform(&rng) < 0.01 ? 0.0f : 0.99f;
    }
    sm_replay rb;
    memset(&rb, 0, sizeof rb);
    sm_replay_batch sb = {malloc(sizeof(float) * B * D), malloc(sizeof(int) * B), malloc(sizeof(float) * B),
                          malloc(sizeof(float) * B * D), malloc(sizeof(float) * B), malloc(sizeof(long) * B),
                          malloc(sizeof(float) * B), 1};
    sm_status dumped = SM_OK;
    if (dump) {
        dumped = dump_network(dump, q, obs, act, ret, &err);
        goto done; /* nothing timed */
    }
    if (sample) {
        if (sm_replay_init(&rb, 100000, 1, D, 1, 1, 0.99, 0, 0, &err) != SM_OK) fail("replay", &err);
        for (long t = 0; t < 100000; t++) {
            int k = (int)(t % (NB * B));
            uint8_t term = disc[k] == 0, trunc = 0;
            sm_replay_add(&rb, obs + (size_t)k * D, &act[k], &ret[k], &term, &trunc, next + (size_t)k * D);
        }
    }
    sm_real y[B], td[B];

    double t_tf = 0, t_of = 0, t_bw = 0, t_op = 0, t_sm = 0;
    long k = 0, warm = 50;
    double t0 = 0, c0 = 0;
    for (;;) {
        if (k == warm) {
            t0 = sm_time_now();
            c0 = cpu_now();
            t_tf = t_of = t_bw = t_op = t_sm = 0;
        }
        const float *s = obs + (size_t)(k % NB) * B * D, *s2 = next + (size_t)(k % NB) * B * D;
        const float *r = ret + (k % NB) * B, *g = disc + (k % NB) * B;
        const int *a = act + (k % NB) * B;
        double ta = sm_time_now();
        if (sample) {
            sm_replay_sample(&rb, B, &rng, 0.4, &sb);
            s = sb.obs, s2 = sb.next, r = sb.ret, g = sb.disc, a = sb.act;
        }
        double tb = sm_time_now();
        const sm_real *qn = sm_model_forward(qt, s2, B, &rng, 0);
        for (int i = 0; i < B; i++) {
            sm_real m = qn[i * A];
            for (int j = 1; j < A; j++) m = qn[i * A + j] > m ? qn[i * A + j] : m;
            y[i] = (sm_real)(r[i] + g[i] * m);
        }
        double tc = sm_time_now();
        const sm_real *out = sm_model_forward(q, s, B, &rng, 1);
        sm_dqn_td_loss(q->dlogits, td, out, a, y, NULL, B, A, 1);
        double td0 = sm_time_now();
        sm_model_backward_set(q, B);
        double te = sm_time_now();
        sm_optim_step(&opt, &q->params, 2.5e-4);
        double tf = sm_time_now();
        t_sm += tb - ta, t_tf += tc - tb, t_of += td0 - tc, t_bw += te - td0, t_op += tf - te;
        k++;
        if (k > warm && (k - warm) % 100 == 0 && sm_time_now() - t0 >= seconds) break;
    }
    const double wall = sm_time_now() - t0, cpu = cpu_now() - c0;
    const long n = k - warm;

    /* FLOPs of one update (multiply-add = 2) */
    const double conv = 16.0 * 8 * 8 * (C * 3 * 3), dense = 1024.0 * 128, head = 128.0 * A;
    const double fwd = 2 * (conv + dense + head), bwd = 2 * (conv + dense + head) + 2 * (dense + head);
    const double flops = 2 * sm_model_update_macs(q, B, 2);
    if (preset && fabs(flops - B * (2 * fwd + bwd)) > 1e-9 * flops) {
        fprintf(stderr, "dqn_update: sm_model_update_macs gives %.0f FLOPs, the hand count %.0f\n", flops, B * (2 * fwd + bwd));
        return 1;
    }
    double one, all;
    const char *isa;
    const double pc0 = cpu_now();
    double peak = exp_fma_peak(threads, &one, &all, &isa);
    /* the same kernel's rate per CPU second: exp_fma_peak runs 5 timings of one thread and 5 of
     * `threads` threads, each 4e6 x 12 vector multiply-adds per thread (peak.c); on a loaded
     * machine the wall-clock peak above drops with the share of the core this process gets, this
     * one does not (it is an average of the 10 timings, so a little below their best) */
    const int lanes = !strcmp(isa, "avx512") ? 16 : !strcmp(isa, "avx2-fma") ? 8 : 4;
    const double peak_cpu = 5.0 * (1 + threads) * 4e6 * 12 * lanes * 2 / (cpu_now() - pc0) / 1e9;
    printf("bench-peak threads=%d isa=%s fma_gflops_1thread=%.1f fma_gflops_all=%.1f peak_gflops=%.1f "
           "peak_gflops_per_cpu_s=%.1f\n",
           threads, isa, one, all, peak, peak_cpu);
    const double us = 1e6 * wall / n, us_net = 1e6 * (wall - t_sm) / n;
    printf("dqn-update batch=%d updates=%ld seconds=%.2f updates_per_s=%.0f us_per_update=%.1f cpu_us_per_update=%.1f "
           "mflop=%.2f gflops=%.2f roofline_fraction=%.4f net_us=%.1f net_gflops=%.2f net_roofline_fraction=%.4f "
           "cpu_gflops=%.2f cpu_roofline_fraction=%.4f sample_us=%.1f target_fwd_us=%.1f online_fwd_us=%.1f backward_us=%.1f optim_us=%.1f params=%zu\n",
           B, n, wall, n / wall, us, 1e6 * cpu / n, flops / 1e6, flops / (us * 1e3), flops / (us * 1e3) / peak, us_net,
           flops / (us_net * 1e3), flops / (us_net * 1e3) / peak, flops / (cpu / n) / 1e9, flops / (cpu / n) / 1e9 / peak_cpu, 1e6 * t_sm / n, 1e6 * t_tf / n, 1e6 * t_of / n,
           1e6 * t_bw / n, 1e6 * t_op / n, q->params.total);
done:
    sm_replay_free(&rb);
    sm_optim_free(&opt);
    sm_model_free(q);
    sm_model_free(qt);
    free(obs), free(next), free(ret), free(disc), free(act);
    free(sb.obs), free(sb.act), free(sb.ret), free(sb.next), free(sb.disc), free(sb.idx), free(sb.weight);
    if (dumped != SM_OK) fail("--dump", &err);
    return 0;
}
