/* Finite-difference gradient checks (double precision) of the whole MoE layer in every routing
 * mode, and of a whole model (dense + MoE + ffn layers, residuals, cross-entropy head). */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "gradcheck.h"
#include "specmoe/nn/model.h"
#include "specmoe/nn/moe.h"
#include "specmoe/nn/routers.h"
#include "specmoe/methods/grmoe/router.h"
#include "specmoe/methods/srmoe/srmoe.h"

typedef struct {
    sm_moe *m;
    sm_params ps;
    int T, d, O;
    sm_real *x, *G, *out, *dx;
    uint64_t noise_seed;
} moe_ctx;

static double moe_loss(void *p) {
    moe_ctx *c = p;
    sm_rng r; /* the same noise draw on every call, so noisy gating is a fixed function */
    sm_rng_seed(&r, c->noise_seed);
    sm_moe_forward(c->m, c->out, c->x, c->T, &r, 1);
    double s = c->m->route.aux_loss; /* balance / z / subspace losses are part of the objective */
    for (int i = 0; i < c->T * c->O; i++) s += (double)c->out[i] * c->G[i];
    return s;
}

/* A layer of config c on width d for up to max_T tokens, its parameters drawn from r (seeded) */
static sm_moe *layer_of(const sm_moe_config *c, int d, int max_T, sm_params *ps, sm_rng *r, uint64_t seed) {
    sm_error err = {0};
    sm_moe *m = sm_moe_create(c, d, &err);
    cr_assert(m, "%s", err.msg);
    sm_params_init_table(ps);
    cr_assert_eq(sm_moe_declare(m, ps, "moe", &err), SM_OK);
    cr_assert_eq(sm_params_alloc(ps, &err), SM_OK);
    sm_rng_seed(r, seed);
    sm_params_initialize(ps, r);
    sm_moe_bind(m, ps);
    cr_assert_eq(sm_moe_reserve(m, max_T, &err), SM_OK);
    return m;
}

static void moe_setup(moe_ctx *c, const sm_moe_config *cfg, int T, int d, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->T = T;
    c->d = d;
    c->noise_seed = seed * 7 + 1;
    sm_rng r;
    c->m = layer_of(cfg, d, T, &c->ps, &r, seed);
    /* random, not zero, noise weights so the noise path is exercised */
    for (size_t i = 0; i < c->ps.total; i++) c->ps.data[i] += (sm_real)(0.2 * sm_rng_normal(&r));
    c->O = c->m->O;
    c->x = calloc((size_t)T * d, sizeof(sm_real));
    c->G = calloc((size_t)T * c->O, sizeof(sm_real));
    c->out = calloc((size_t)T * c->O, sizeof(sm_real));
    c->dx = calloc((size_t)T * d, sizeof(sm_real));
    gc_fill_normal(c->x, (size_t)T * d, 1.5, &r);
    gc_fill_normal(c->G, (size_t)T * c->O, 1, &r);
}

static void moe_teardown(moe_ctx *c) {
    sm_moe_free(c->m);
    sm_params_free(&c->ps);
    free(c->x);
    free(c->G);
    free(c->out);
    free(c->dx);
}

/* x_scale multiplies the drawn inputs (1 in every check but the soft router's wide-logit path);
 * the largest spread of any group's soft logits X Phi^T is returned in *soft_spread if asked */
static void moe_check_scaled(const char *what, const sm_moe_config *cfg, int T, int d, uint64_t seed, long *dropped,
                             double x_scale, double *soft_spread, const unsigned char *on) {
    /* hash routing is a function of the input's bytes: any change of x re-routes, so only the
     * parameters are differentiable there */
    int check_x = strcmp(cfg->router.name, "hash") != 0;
    moe_ctx c;
    moe_setup(&c, cfg, T, d, seed);
    for (int i = 0; i < T * d; i++) c.x[i] *= (sm_real)x_scale;
    if (on) cr_assert_eq(c.m->router->ops->set_active(c.m->router, on), 0); /* pruned experts */
    if (soft_spread) { /* unnormalised soft logits: L = X Phi^T, Phi the router's (S,d) slot rows */
        int ip = sm_params_find(&c.ps, "moe.router.phi");
        cr_assert(ip >= 0);
        const sm_real *phi = sm_params_data(&c.ps, ip);
        const int S = (int)(c.ps.p[ip].numel / d), m = sm_soft_opts(&cfg->router)->soft_group > 0 ? sm_soft_opts(&cfg->router)->soft_group : T;
        *soft_spread = 0;
        for (int t0 = 0; t0 < T; t0 += m) {
            double hi = -1e300, lo = 1e300;
            for (int t = t0; t < T && t < t0 + m; t++)
                for (int j = 0; j < S; j++) {
                    double l = 0;
                    for (int i = 0; i < d; i++) l += (double)c.x[t * d + i] * phi[j * d + i];
                    hi = l > hi ? l : hi;
                    lo = l < lo ? l : lo;
                }
            *soft_spread = hi - lo > *soft_spread ? hi - lo : *soft_spread;
        }
    }
    sm_params_zero_grad(&c.ps);
    moe_loss(&c);
    sm_moe_backward(c.m, c.dx, c.G, c.x, T);
    if (dropped) *dropped = c.m->route.dropped;
    sm_rng r;
    sm_rng_seed(&r, seed + 100);
    char name[160];
    snprintf(name, sizeof name, "%s.x", what);
    if (check_x) gc_check(name, c.x, c.dx, (size_t)T * d, moe_loss, &c, &r, 60);
    for (int i = 0; i < c.ps.n; i++) {
        snprintf(name, sizeof name, "%s:%s", what, c.ps.p[i].name);
        gc_check(name, sm_params_data(&c.ps, i), sm_params_grad(&c.ps, i), c.ps.p[i].numel, moe_loss, &c, &r, 40);
    }
    moe_teardown(&c);
}

static void moe_check(const char *what, const sm_moe_config *cfg, int T, int d, uint64_t seed, long *dropped) {
    moe_check_scaled(what, cfg, T, d, seed, dropped, 1, NULL, NULL);
}

static sm_moe_config base_router(const char *router, int E, int k, int H) {
    sm_moe_config c;
    sm_moe_config_default(&c);
    sm_router_config_set(&c.router, router, NULL);
    c.router.E = E;
    c.router.k = k;
    c.H = H;
    return c;
}

static sm_moe_config base(int E, int k, int H) {
    sm_moe_config c;
    sm_moe_config_default(&c);
    c.router.E = E;
    c.router.k = k;
    c.H = H;
    return c;
}

Test(grad_moe, topk_renormalised) {
    sm_moe_config c = base(6, 2, 8);
    moe_check("topk2.renorm", &c, 12, 5, 1, NULL);
}

Test(grad_moe, topk_raw_weights_with_temperature_and_gelu) {
    sm_moe_config c = base(5, 3, 7);
    c.router.renorm = 0;
    c.router.temperature = 0.6;
    c.act = SM_ACT_GELU;
    moe_check("topk3.temp", &c, 10, 6, 2, NULL);
}

Test(grad_moe, noisy_gating) {
    sm_moe_config c = base(6, 2, 8);
    c.router.noisy = 1;
    moe_check("topk.noisy", &c, 12, 5, 3, NULL);
}

Test(grad_moe, capacity_drops_tokens) {
    sm_moe_config c = base(4, 2, 6);
    c.router.capacity = 0.75; /* cap = ceil(0.75 * 16 * 2 / 4) = 6 per expert: some must drop */
    long dropped = 0;
    moe_check("topk.capacity", &c, 16, 5, 4, &dropped);
    cr_expect(dropped > 0, "the capacity case must actually drop assignments (dropped %ld)", dropped);
    /* with renormalisation off too */
    c.router.renorm = 0;
    moe_check("topk.capacity.raw", &c, 16, 5, 5, &dropped);
    cr_expect(dropped > 0);
    /* capacity per group of 4 tokens (one observation's): ceil(0.75 * 4 * 2 / 4) = 2 per expert each */
    c.router.renorm = 1;
    sm_group_opts(&c.router)->group = 4;
    moe_check("topk.capacity.grouped", &c, 16, 5, 6, &dropped);
    cr_expect(dropped > 0);
}

Test(grad_moe, shared_experts) {
    sm_moe_config c = base(4, 1, 6);
    c.n_shared = 2;
    c.act = SM_ACT_SILU;
    moe_check("topk1.shared", &c, 10, 5, 6, NULL);
}

Test(grad_moe, dense_mixture_all_experts) {
    sm_moe_config c = base(4, 4, 6);
    c.act = SM_ACT_TANH;
    moe_check("dense", &c, 9, 5, 7, NULL);
}

Test(grad_moe, no_expert_bias) {
    sm_moe_config c = base(4, 2, 6);
    c.expert_bias = 0;
    moe_check("nobias", &c, 9, 5, 8, NULL);
}

Test(grad_moe, switch_balance_and_zloss) {
    sm_moe_config c = base_router("switch", 5, 1, 6);
    c.router.balance_coef = 0.3;
    c.router.zloss_coef = 0.05;
    c.router.renorm = 0;
    moe_check("switch", &c, 12, 5, 21, NULL);
    /* the aux losses on a top-2 router with capacity as well */
    c = base_router("topk", 5, 2, 6);
    c.router.balance_coef = 0.2;
    c.router.zloss_coef = 0.1;
    c.router.capacity = 1.0;
    moe_check("topk.aux.capacity", &c, 12, 5, 22, NULL);
}

/* DeepSeekMoE routing: 2 shared experts (weight 1) plus top-2 of the 4 routed ones, with the aux
 * losses over the routed experts and, second, capacity drops among them and 3-hidden-layer experts */
static void one_thread(void) { omp_set_num_threads(1); } /* a tiny problem: threads would only spin */
Test(grad_moe, ds_shared_plus_routed, .init = one_thread) {
    sm_moe_config c = base_router("ds", 6, 2, 5);
    sm_ds_opts(&c.router)->ds_shared = 2;
    c.router.balance_coef = 0.2;
    c.router.zloss_coef = 0.05;
    c.router.temperature = 0.8;
    moe_check("ds.2+2", &c, 12, 5, 23, NULL);
    c.router.capacity = 0.75;
    c.depth = 3;
    c.act = SM_ACT_TANH;
    long dropped = 0;
    moe_check("ds.capacity.deep", &c, 16, 5, 24, &dropped);
    cr_expect(dropped > 0, "the capacity case must drop routed assignments (dropped %ld)", dropped);
}

Test(grad_moe, expert_choice) {
    sm_moe_config c = base_router("expert-choice", 4, 1, 6);
    c.router.capacity = 1.5;
    c.router.temperature = 0.8;
    long dropped = 0;
    moe_check("expert-choice", &c, 12, 5, 23, &dropped);
    /* each expert picks within groups of 5 tokens (the last group has 2): ceil(1.5 * 5 / 4) = 2 each */
    sm_group_opts(&c.router)->group = 5;
    moe_check("expert-choice.grouped", &c, 12, 5, 26, &dropped);
}

/* Grouped routing keeps to its groups: an expert-choice expert takes the same number of tokens from
 * every full group, and a token-choice expert's kept assignments in a group never exceed the
 * group's capacity. */
Test(grad_moe, grouped_routing_stays_within_groups) {
    sm_moe_config c = base_router("expert-choice", 3, 1, 5);
    c.router.capacity = 1.0;
    sm_group_opts(&c.router)->group = 6; /* T = 18: three groups of 6, ceil(6 / 3) = 2 per expert each */
    sm_params ps;
    sm_rng r;
    sm_moe *m = layer_of(&c, 4, 18, &ps, &r, 5);
    sm_real x[18 * 4], out[18 * 4];
    for (int i = 0; i < 18 * 4; i++) x[i] = (sm_real)sm_rng_normal(&r);
    sm_moe_forward(m, out, x, 18, NULL, 0);
    for (int e = 0; e < 3; e++) {
        int per_group[3] = {0, 0, 0};
        for (int a = m->route.offset[e]; a < m->route.offset[e + 1]; a++) per_group[m->route.token[a] / 6]++;
        for (int g = 0; g < 3; g++) cr_expect_eq(per_group[g], 2, "expert %d took %d tokens of group %d", e, per_group[g], g);
    }
    sm_moe_free(m);
    sm_params_free(&ps);
}

/* With a single expert, expert choice does not route (BENCHMARKS.md, "Fig. 8"): the softmax over one
 * expert is 1 for every token, so every probability ties and each group's p picks are its first p
 * tokens, whatever the input; at capacity 1 it takes every token with weight 1. Fig. 8's
 * ExpertChoice-1 x4 at 10% (p = ceil(0.1 x 64) = 7) sees a fixed crop of each observation. */
Test(grad_moe, expert_choice_with_one_expert_takes_the_first_tokens_of_each_group) {
    enum { d = 4, m = 64, G = 3, T = G * m };
    const double caps[2] = {0.1, 1.0};
    const int want_p[2] = {7, 64};
    for (int c_i = 0; c_i < 2; c_i++) {
        sm_moe_config c = base_router("expert-choice", 1, 1, 5);
        c.router.capacity = caps[c_i];
        sm_group_opts(&c.router)->group = m;
        sm_params ps;
        sm_rng r;
        sm_moe *mo = layer_of(&c, d, T, &ps, &r, 11);
        static sm_real x[T * d], out[T * d];
        for (int i = 0; i < T * d; i++) x[i] = (sm_real)sm_rng_normal(&r);
        sm_moe_forward(mo, out, x, T, NULL, 0);
        const sm_route *rt = &mo->route;
        cr_assert_eq(rt->offset[1] - rt->offset[0], G * want_p[c_i], "capacity %g: %d picks", caps[c_i], rt->offset[1]);
        for (int a = 0; a < G * want_p[c_i]; a++) {
            const int g = a / want_p[c_i], j = a % want_p[c_i];
            cr_assert_eq(rt->token[rt->offset[0] + a], g * m + j, "capacity %g: pick %d is token %d", caps[c_i], a,
                         rt->token[rt->offset[0] + a]);
            cr_assert_eq(rt->weight[rt->offset[0] + a], (sm_real)1, "a single expert's weight is 1");
        }
        for (int g = 0; g < G; g++) /* the tokens not picked output 0 */
            for (int t = g * m + want_p[c_i]; t < (g + 1) * m; t++)
                for (int i = 0; i < d; i++) cr_assert_eq(out[t * d + i], (sm_real)0, "token %d was not picked", t);
        sm_moe_free(mo);
        sm_params_free(&ps);
    }
}

/* Expert choice takes, per expert and group, the p tokens of highest probability, ties to the lower
 * index, in token order: checked against a direct count on groups of 8 tokens whose rows repeat (so
 * probabilities tie), p = ceil(1.5 * 8 / 3) = 4. */
Test(grad_moe, expert_choice_takes_the_top_p_ties_to_the_lower_index) {
    sm_moe_config c = base_router("expert-choice", 3, 1, 5);
    c.router.capacity = 1.5;
    sm_group_opts(&c.router)->group = 8;
    enum { T = 24, d = 4, m = 8, p = 4 };
    sm_params ps;
    sm_rng r;
    sm_moe *mo = layer_of(&c, d, T, &ps, &r, 8);
    sm_real x[T * d], out[T * d];
    for (int i = 0; i < T * d; i++) x[i] = (sm_real)sm_rng_normal(&r);
    for (int t = 1; t < T; t += 4) /* rows repeat in pairs within a group: t - 1 and t = 1, 5, 9, ... */
        for (int i = 0; i < d; i++) x[t * d + i] = x[(t - 1) * d + i];
    sm_moe_forward(mo, out, x, T, NULL, 0);
    const sm_route *rt = &mo->route;
    int ties = 0;
    for (int e = 0; e < 3; e++) {
        int a = rt->offset[e];
        cr_assert_eq(rt->offset[e + 1] - a, (T / m) * p);
        for (int g = 0; g < T / m; g++)
            for (int t = g * m; t < (g + 1) * m; t++) {
                const sm_real v = rt->probs[t * 3 + e];
                int beat = 0;
                for (int u = g * m; u < (g + 1) * m; u++) {
                    const sm_real w = rt->probs[u * 3 + e];
                    beat += w > v || (w == v && u < t);
                    ties += w == v && u != t;
                }
                if (beat < p) cr_assert_eq(rt->token[a++], t, "expert %d, group %d: token %d is among the top %d", e, g, t, p);
            }
    }
    cr_assert_gt(ties, 0, "the case must have tied probabilities");
    sm_moe_free(mo);
    sm_params_free(&ps);
}

Test(grad_moe, hash_and_random_constant_routing) {
    sm_moe_config c = base_router("hash", 4, 2, 6);
    moe_check("hash", &c, 10, 5, 24, NULL);
    c = base_router("random", 4, 1, 6);
    moe_check("random", &c, 10, 5, 25, NULL);
}

Test(grad_moe, soft_whole_batch_and_groups) {
    sm_moe_config c = base_router("soft", 3, 1, 6);
    sm_soft_opts(&c.router)->slots = 2;
    moe_check("soft.batch.norm", &c, 8, 5, 26, NULL);
    sm_soft_opts(&c.router)->soft_norm = 0;
    moe_check("soft.batch.nonorm", &c, 8, 5, 27, NULL);
    /* the router temperature divides the logits (router_soft.c), raw and normalised */
    c.router.temperature = 0.6;
    moe_check("soft.batch.nonorm.tau", &c, 8, 5, 32, NULL);
    sm_soft_opts(&c.router)->soft_norm = 1;
    moe_check("soft.batch.norm.tau", &c, 8, 5, 33, NULL);
    /* groups of 4 tokens (one "observation" each) with a ragged last group */
    c = base_router("soft", 3, 1, 6);
    sm_soft_opts(&c.router)->soft_group = 4;
    sm_soft_opts(&c.router)->slots = 0; /* ceil(4 / 3) = 2 slots per expert */
    moe_check("soft.groups", &c, 10, 5, 28, NULL);
    /* logits spread over more than 64 within a group: each softmax subtracts its own maxima
     * (src/nn/router_soft.c) instead of sharing one exp per logit */
    sm_soft_opts(&c.router)->soft_norm = 0;
    double spread = 0;
    moe_check_scaled("soft.groups.wide", &c, 10, 5, 29, NULL, 40, &spread, NULL);
    cr_assert_gt(spread, 64, "the inputs must spread the logits past the one-exp path's bound (%g)", spread);
    /* an expert pruned (Fig. 19): the combine softmax over the other experts' slots, both paths */
    static const unsigned char on[3] = {1, 0, 1};
    moe_check_scaled("soft.groups.pruned", &c, 10, 5, 30, NULL, 1, NULL, on);
    moe_check_scaled("soft.groups.pruned.wide", &c, 10, 5, 31, NULL, 40, NULL, on);
}

/* The soft router's temperature tau is the logits' divisor: tau = 0.5 gives the outputs of tau = 1
 * with the slot rows Phi doubled (raw logits X Phi^T), or with the learned scale doubled (normalised
 * logits). A router that ignored --temperature fails both. */
Test(grad_moe, soft_temperature_divides_the_logits) {
    for (int norm = 0; norm <= 1; norm++) {
        sm_moe_config c = base_router("soft", 3, 1, 6);
        sm_soft_opts(&c.router)->soft_group = 4;
        sm_soft_opts(&c.router)->soft_norm = norm;
        moe_ctx a, b;
        c.router.temperature = 0.5;
        moe_setup(&a, &c, 12, 5, 41);
        c.router.temperature = 1;
        moe_setup(&b, &c, 12, 5, 41); /* the same parameters and inputs */
        int ip = sm_params_find(&b.ps, norm ? "moe.router.scale" : "moe.router.phi");
        cr_assert(ip >= 0);
        sm_real *v = sm_params_data(&b.ps, ip);
        for (size_t i = 0; i < b.ps.p[ip].numel; i++) v[i] *= 2;
        sm_rng r;
        sm_rng_seed(&r, 1);
        sm_moe_forward(a.m, a.out, a.x, a.T, &r, 1);
        sm_moe_forward(b.m, b.out, b.x, b.T, &r, 1);
        double worst = 0, size = 0;
        for (int i = 0; i < a.T * a.O; i++) {
            double e = fabs((double)a.out[i] - b.out[i]);
            worst = e > worst ? e : worst;
            size = fabs((double)b.out[i]) > size ? fabs((double)b.out[i]) : size;
        }
        cr_assert_lt(worst, 1e-5 * (1 + size), "norm %d: tau 0.5 differs from doubled logits by %g", norm, worst);
        /* and tau changes the output at all (the check above is not vacuous) */
        c.router.temperature = 1;
        moe_ctx u;
        moe_setup(&u, &c, 12, 5, 41);
        sm_moe_forward(u.m, u.out, u.x, u.T, &r, 1);
        double moved = 0;
        for (int i = 0; i < a.T * a.O; i++) moved = fmax(moved, fabs((double)a.out[i] - u.out[i]));
        cr_assert_gt(moved, 1e-3, "norm %d: tau 0.5 left the output unchanged", norm);
        moe_teardown(&a);
        moe_teardown(&b);
        moe_teardown(&u);
    }
}

Test(grad_moe, vmf_gate) {
    sm_moe_config c = base_router("vmf", 5, 2, 6);
    sm_grmoe_opts(&c.router)->kappa_init = 3;
    moe_check("vmf", &c, 12, 6, 29, NULL);
    /* one token, wide d: the (E,d) direction gradient is larger than the per-token scratch (a heap
     * overflow found in review; the sanitizer build catches a regression) */
    moe_check("vmf.T1", &c, 1, 40, 31, NULL);
}

Test(grad_moe, grassmann_dense_amortized_topk_and_subspace) {
    sm_moe_config c = base_router("grassmann", 4, 4, 6);
    sm_grmoe_opts(&c.router)->kr = 3;
    sm_grmoe_opts(&c.router)->alpha = 0.7;
    sm_grmoe_opts(&c.router)->subspace_beta = 0; /* the routing alone */
    moe_check("grassmann.dense", &c, 10, 6, 30, NULL);
    sm_grmoe_opts(&c.router)->amortize = 1;
    sm_grmoe_opts(&c.router)->amort_hidden = 5;
    moe_check("grassmann.amortized", &c, 10, 6, 31, NULL);
    c.router.k = 2; /* top-k on the Bingham weights */
    sm_grmoe_opts(&c.router)->amortize = 0;
    moe_check("grassmann.top2", &c, 10, 6, 32, NULL);
    /* the subspace-overlap regulariser, all pairs and sampled pairs, with a threshold low enough that
     * random 3-dim subspaces of R^6 (expected overlap 1.5) exceed it */
    c.router.k = 4;
    sm_grmoe_opts(&c.router)->subspace_beta = 0.5;
    sm_grmoe_opts(&c.router)->rho0 = 0.05;
    sm_grmoe_opts(&c.router)->pairs = -1;
    moe_check("grassmann.subspace.all", &c, 10, 6, 33, NULL);
    sm_grmoe_opts(&c.router)->pairs = 5;
    moe_check("grassmann.subspace.sampled", &c, 10, 6, 34, NULL);
}

Test(grad_moe, output_width_differs_from_input) {
    sm_moe_config c = base(4, 2, 6);
    c.out_dim = 3;
    c.n_shared = 1;
    moe_check("topk.out3", &c, 10, 5, 40, NULL);
    c = base_router("soft", 3, 1, 6);
    c.out_dim = 7;
    sm_soft_opts(&c.router)->soft_group = 4;
    moe_check("soft.out7", &c, 10, 5, 41, NULL);
}

Test(grad_moe, prototype_router_euclidean_and_squared) {
    sm_moe_config c = base_router("prototype", 4, 4, 6);
    c.router.temperature = 0.7; /* tau */
    moe_check("prototype.euclid.dense", &c, 10, 5, 50, NULL);
    sm_proto_opts(&c.router)->proto_sq = 1;
    moe_check("prototype.sq.dense", &c, 10, 5, 51, NULL);
    c.router.k = 1;
    c.router.renorm = 0;
    moe_check("prototype.sq.top1", &c, 10, 5, 52, NULL);
}

/* whole model */
typedef struct {
    sm_model *m;
    float *x;
    int *y;
    int T;
} model_ctx;

static double model_loss(void *p) {
    model_ctx *c = p;
    sm_rng r;
    sm_rng_seed(&r, 77);
    sm_model_forward(c->m, c->x, c->T, &r, 1);
    return sm_model_loss(c->m, c->y, NULL, c->T);
}

/* Random inputs (D features) and labels for c's model, one backward, every parameter against central
 * differences; frees the model. */
static void check_model(model_ctx *c, int D, int classes, sm_rng *r) {
    const int T = c->T;
    /* the model takes float inputs; the check perturbs parameters only */
    c->x = malloc(sizeof(float) * T * D);
    c->y = malloc(sizeof(int) * T);
    for (int i = 0; i < T * D; i++) c->x[i] = (float)sm_rng_normal(r);
    for (int t = 0; t < T; t++) c->y[t] = (int)sm_rng_below(r, (uint32_t)classes);
    sm_params_zero_grad(&c->m->params);
    model_loss(c);
    sm_model_backward(c->m, T);
    for (int i = 0; i < c->m->params.n; i++)
        gc_check(c->m->params.p[i].name, sm_params_data(&c->m->params, i), sm_params_grad(&c->m->params, i),
                 c->m->params.p[i].numel, model_loss, c, r, 25);
    free(c->x);
    free(c->y);
    sm_model_free(c->m);
}

Test(grad_moe, whole_model_dense_moe_ffn_residual) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err;
    cr_assert_eq(sm_model_parse_arch(&cfg, "dense:6,moe:5,ffn:7", &err), SM_OK, "%s", err.msg);
    cfg.in_dim = 4;
    cfg.n_classes = 3;
    cfg.residual = 1;
    cfg.act = SM_ACT_TANH;
    cfg.moe.router.E = 4;
    cfg.moe.router.k = 2;
    cfg.moe.n_shared = 1;
    int T = 8;
    sm_rng r;
    sm_rng_seed(&r, 11);
    model_ctx c = {.T = T};
    c.m = sm_model_create(&cfg, T, &r, &err);
    cr_assert(c.m, "%s", err.msg);
    check_model(&c, 4, 3, &r);
}

/* SoftMoE-in-RL's network from --arch: conv encoder -> PerConv tokens -> SoftMoE over each example's
 * tokens -> flatten -> dense -> head; and the other token schemes in the same place. */
Test(grad_moe, whole_model_tokenised_softmoe) {
    const char *archs[] = {"conv:3:3:1:1,tokens,moe:5,flatten,dense:6", "conv:3:3:1:1,perfeat,moe:5,tokmean",
                           "conv:3:3:1:1,shuffle:5,tokens,moe:4,toksum", "conv:3:3:1:1,avgpool:2:2,tokens,moe:4,flatten",
                           /* an Impala-style encoder: residual blocks, then the activation alone */
                           "conv:3:3:1:1,res:3,res:3,act,tokens,moe:5,flatten"};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        sm_model_config cfg;
        sm_model_config_default(&cfg);
        sm_error err;
        cr_assert_eq(sm_model_parse_arch(&cfg, archs[a], &err), SM_OK, "%s", err.msg);
        char back[256];
        sm_model_format_arch(&cfg, back, sizeof back);
        cr_expect_str_eq(back, archs[a]);
        cfg.in_c = 2;
        cfg.in_h = 4;
        cfg.in_w = 4;
        cfg.in_dim = 32;
        cfg.n_classes = 3;
        cfg.act = SM_ACT_TANH;
        sm_router_config_set(&cfg.moe.router, "soft", NULL);
        cfg.moe.router.E = 3;
        cfg.moe.router.k = 1;
        int T = 5;
        sm_rng r;
        sm_rng_seed(&r, 21 + a);
        model_ctx c = {.T = T};
        c.m = sm_model_create(&cfg, T, &r, &err);
        cr_assert(c.m, "%s: %s", archs[a], err.msg);
        /* the soft router groups each example's tokens: 16 PerConv tokens, 3 PerFeat, 4 pooled */
        const int group = a == 1 ? 3 : a == 3 ? 4 : 16; /* the Impala-style one: 16 */
        cr_expect_eq(sm_soft_opts(&sm_model_moe(c.m, 0)->router->cfg)->soft_group, group, "%s", archs[a]);
        check_model(&c, 32, 3, &r);
    }
    /* tokens left at the head are refused */
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err;
    cr_assert_eq(sm_model_parse_arch(&cfg, "conv:3:3:1:1,tokens,moe:5", &err), SM_OK);
    cfg.in_c = 2, cfg.in_h = 4, cfg.in_w = 4, cfg.in_dim = 32, cfg.n_classes = 3;
    cr_expect_null(sm_model_create(&cfg, 4, NULL, &err));
    cr_expect(strstr(err.msg, "end them with flatten, tokmean or toksum"), "%s", err.msg);
}

Test(grad_moe, whole_srmoe_model_conv_stem_prototype_stages_and_penalties) {
    /* SR-MoE in miniature: conv stem, two stages (linear + ReLU + LayerNorm, prototype router, experts),
     * spectral-norm + stable-rank penalties on each stage's gate matrix and the diversity loss */
    const char *targets[2] = {"gate", "prototypes"};
    for (int pt = 0; pt < 2; pt++) {
        sm_model_config cfg;
        sm_model_config_default(&cfg);
        sm_error err;
        cr_assert_eq(sm_model_parse_arch(&cfg, "conv:3:3:2:1,maxpool:2:1,gap,dense:6,ln,moe:5,dense:6,ln,moe:4", &err),
                     SM_OK, "%s", err.msg);
        cfg.in_c = 2;
        cfg.in_h = 6;
        cfg.in_w = 6;
        cfg.in_dim = 72;
        cfg.n_classes = 3;
        cfg.act = SM_ACT_TANH;
        sm_router_config_set(&cfg.moe.router, "prototype", NULL);
        cfg.moe.router.E = 3;
        cfg.moe.router.k = 3;
        cfg.moe.router.temperature = 0.8;
        cfg.spectral_alpha = 0.3;
        cfg.sigma_t = 1.0;
        cfg.rho_t = 1.5;
        cfg.diversity_beta = 0.4;
        cfg.penalty_on_prototypes = pt;
        int T = 6;
        sm_rng r;
        sm_rng_seed(&r, 60 + pt);
        model_ctx c = {.T = T};
        c.m = sm_model_create(&cfg, T, &r, &err);
        cr_assert(c.m, "%s", err.msg);
        sm_srmoe_set_power_iters(c.m, 300); /* converged power iteration: the loss is then a function of W */
        c.x = malloc(sizeof(float) * T * 72);
        c.y = malloc(sizeof(int) * T);
        for (int i = 0; i < T * 72; i++) c.x[i] = (float)sm_rng_normal(&r);
        for (int t = 0; t < T; t++) c.y[t] = (int)sm_rng_below(&r, 3);
        sm_params_zero_grad(&c.m->params);
        model_loss(&c);
        cr_expect(c.m->penalty > 0, "%s: penalties are active", targets[pt]);
        sm_model_backward(c.m, T);
        for (int i = 0; i < c.m->params.n; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s:%s", targets[pt], c.m->params.p[i].name);
            gc_check(name, sm_params_data(&c.m->params, i), sm_params_grad(&c.m->params, i), c.m->params.p[i].numel,
                     model_loss, &c, &r, 20);
        }
        free(c.x);
        free(c.y);
        sm_model_free(c.m);
    }
}
