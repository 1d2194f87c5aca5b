/* SPHERE's MoE actor (the moehead layer, include/specmoe/nn/model.h) end to end in double precision:
 * E experts that are each a 3-hidden-layer MLP from the observation to the action mean, a separate
 * 3-layer gate MLP in front of a top-k router with temperature and renormalised (subset-softmax)
 * weights, and the state-independent log-std, under PPO's clipped Gaussian surrogate plus 0.3 times
 * the SPHERE penalty on the routing-weighted last hidden expert features. The gradient over every
 * actor parameter and the log-std is checked against central differences, for top-2 of 4 and for
 * every expert weighted (Dense-MoE) and for 2 shared plus top-2 of 4 routed experts (DS-MoE, the ds
 * router); and the layer's arch string round-trips through the JSON. */
#include <omp.h>
#include <string.h>

#include "gradcheck.h"
#include "specmoe/methods/sphere/sphere.h"
#include "specmoe/nn/routers.h"
#include "specmoe/rl/ppo.h"

/* These problems are tiny: OpenMP's threads only spin against each other, which on a loaded machine
 * costs seconds per test (each test runs in its own process) */
static void one_thread(void) { omp_set_num_threads(1); }
TestSuite(grad_actor, .init = one_thread);

enum { B = 10, D = 4, A = 3 };

typedef struct {
    sm_model *m;
    sm_sphere_reg *reg;
    float x[B * D];
    sm_real logstd[A], box[B * A], old_logp[B], adv[B];
    sm_real dmean[B * A], dlogstd[A];
    sm_real *scratch; /* (P) */
} actor_ctx;

static double actor_loss(void *p) {
    actor_ctx *c = p;
    const sm_real *mean = sm_model_forward(c->m, c->x, B, NULL, 1);
    double L = sm_ppo_policy_loss_gaussian(c->dmean, c->dlogstd, NULL, mean, c->logstd, c->box, c->old_logp, c->adv, B, A,
                                           0.2, 0.01);
    sm_params v = sm_params_view(&c->m->params, c->scratch);
    return L + 0.3 * sm_sphere_reg_grad(c->reg, &v, B);
}

/* E experts, k routed per state; ds > 0: the ds router with that many shared experts (DS-MoE) */
static void check_actor(int E, int k, int ds, uint64_t seed) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, "moehead:5:3:6", &err), SM_OK, "%s", err.msg);
    cfg.in_dim = D, cfg.n_classes = A;
    cfg.act = cfg.moe.act = SM_ACT_TANH; /* smooth: finite differences see no kinks but top-k's and the clip's */
    cfg.moe.depth = 3;
    if (ds) {
        cr_assert_eq(sm_router_config_set(&cfg.moe.router, "ds", &err), SM_OK);
        sm_ds_opts(&cfg.moe.router)->ds_shared = ds;
    }
    cfg.moe.router.E = E, cfg.moe.router.k = k;
    cfg.moe.router.renorm = 1;
    cfg.moe.router.temperature = 0.7;
    cfg.moe.router.balance_coef = 0;
    sm_rng r;
    sm_rng_seed(&r, seed);
    actor_ctx c = {0};
    c.m = sm_model_create(&cfg, B, &r, &err);
    cr_assert(c.m, "%s", err.msg);
    for (int i = 0; i < c.m->params.n; i++) cr_expect(strncmp(c.m->params.p[i].name, "head.", 5), "a head after moehead");
    sm_sphere_config sc = {.rho = 1};
    cr_assert(c.reg = sm_sphere_reg_create(&sc, c.m, &err), "%s", err.msg);
    const size_t P = c.m->params.total;
    c.scratch = calloc(P, sizeof(sm_real));
    for (int i = 0; i < B * D; i++) c.x[i] = (float)sm_rng_normal(&r);
    gc_fill_normal(c.logstd, A, 0.3, &r);
    gc_fill_normal(c.adv, B, 1, &r);
    /* actions near the policy's means and old log-probabilities shifted from the new ones: some
     * ratios are clipped, some not */
    const sm_real *mean = sm_model_forward(c.m, c.x, B, NULL, 1);
    for (int i = 0; i < B * A; i++) c.box[i] = mean[i] + (sm_real)(0.5 * sm_rng_normal(&r));
    for (int b = 0; b < B; b++)
        c.old_logp[b] = (sm_real)(sm_gaussian_logprob(NULL, NULL, 0, c.box + b * A, mean + b * A, c.logstd, A) +
                                  0.6 * (sm_rng_uniform(&r) - 0.5));
    /* the analytic gradient, in training's order: forward, the surrogate's backward, then 0.3 times
     * SPHERE's (sm_sphere_reg_grad comes after the base backward) */
    actor_loss(&c);
    sm_model_forward(c.m, c.x, B, NULL, 1);
    sm_real *g = calloc(P, sizeof(sm_real)), dls[A];
    memcpy(dls, c.dlogstd, sizeof dls);
    memcpy(c.m->dlogits, c.dmean, sizeof c.dmean);
    sm_params_zero_grad(&c.m->params);
    sm_model_backward(c.m, B);
    memcpy(g, c.m->params.grad, sizeof(sm_real) * P);
    memset(c.scratch, 0, sizeof(sm_real) * P);
    sm_params v = sm_params_view(&c.m->params, c.scratch);
    sm_sphere_reg_grad(c.reg, &v, B);
    for (size_t i = 0; i < P; i++) g[i] += 0.3 * c.scratch[i];
    for (int i = 0; i < c.m->params.n; i++) {
        char name[160];
        snprintf(name, sizeof name, "actor E=%d k=%d shared=%d:%s", E, k, ds, c.m->params.p[i].name);
        gc_check(name, sm_params_data(&c.m->params, i), g + c.m->params.p[i].offset, c.m->params.p[i].numel, actor_loss, &c,
                 &r, 12);
    }
    gc_check("actor log_std", c.logstd, dls, A, actor_loss, &c, &r, A);
    sm_sphere_reg_free(c.reg);
    free(c.scratch), free(g);
    sm_model_free(c.m);
}

Test(grad_actor, topk_moe_actor) { check_actor(4, 2, 0, 41); }
Test(grad_actor, dense_moe_actor) { check_actor(4, 4, 0, 42); }
Test(grad_actor, ds_moe_actor_shared_plus_routed) { check_actor(6, 2, 2, 43); }

Test(grad_actor, moehead_arch_round_trips_and_ends_the_network) {
    sm_model_config cfg, back;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, "dense:8,moehead:5:3:6", &err), SM_OK, "%s", err.msg);
    cfg.moe.depth = 3;
    char *js = sm_model_config_to_json(&cfg);
    cr_assert_eq(sm_model_config_from_json(&back, js, &err), SM_OK, "%s", err.msg);
    char a[256], b[256];
    sm_model_format_arch(&cfg, a, sizeof a);
    sm_model_format_arch(&back, b, sizeof b);
    cr_expect_str_eq(a, "dense:8,moehead:5:3:6");
    cr_expect_str_eq(b, a);
    cr_expect_eq(back.moe.depth, 3);
    free(js);
    cr_expect_neq(sm_model_parse_arch(&cfg, "moehead:5,dense:4", &err), SM_OK);
    cr_expect(strstr(err.msg, "must be the last layer"), "%s", err.msg);
    cr_expect_neq(sm_model_parse_arch(&cfg, "moehead:5:0:4", &err), SM_OK);
    cr_expect_neq(sm_model_parse_arch(&cfg, "moehead:5:2", &err), SM_OK);
}
