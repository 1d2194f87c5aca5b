/* SR-MoE's surgical one-shot update (src/methods/srmoe/surgical.c), as `bench oneshot` runs it:
 *  - the masked gradient of the one-shot loss (Eq. 7: cross-entropy + spectral-norm + stable-rank
 *    penalties + diversity) against central differences, double precision, on the chain's experts;
 *  - every entry outside the active chain is exactly zero, and an SGD or fresh-Adam step on it leaves
 *    every parameter outside the chain bit for bit unchanged while the chain's experts move;
 *  - refusals. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "gradcheck.h"
#include "specmoe/core/optim.h"
#include "specmoe/methods/srmoe/srmoe.h"
#include "specmoe/nn/moe.h"

typedef struct {
    sm_model *m;
    float *x; /* (T, 72) */
    int *y;   /* (T) */
    int T;
} os_ctx;

/* the one-shot loss of the bench: a train-mode forward and the model's whole objective */
static double os_loss(void *p) {
    os_ctx *c = p;
    sm_model_forward(c->m, c->x, c->T, NULL, 1);
    return sm_model_loss(c->m, c->y, NULL, c->T);
}

/* SR-MoE in miniature, as the bench builds it: conv stem, two stages (Linear, LayerNorm, MoE);
 * router 0 prototype + penalties on the gates, 1 prototype + penalties on the prototypes, 2 the hard
 * top-1 linear gate (the paper's Baseline) with penalties on the gates. Experts 3 deep in stage
 * hidden layers (depth 2) so the deeper-expert slices are covered too. */
static void os_setup(os_ctx *c, int router, int depth, uint64_t seed) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err;
    cr_assert_eq(sm_model_parse_arch(&cfg, "conv:3:3:2:1,maxpool:2:1,gap,dense:6,ln,moe:5,dense:6,ln,moe:4", &err), SM_OK,
                 "%s", err.msg);
    cfg.in_c = 2, cfg.in_h = 6, cfg.in_w = 6, cfg.in_dim = 72, cfg.n_classes = 3;
    cfg.act = SM_ACT_TANH;
    cfg.moe.act = SM_ACT_TANH;
    cfg.moe.depth = depth;
    sm_router_config_set(&cfg.moe.router, router == 2 ? "topk" : "prototype", NULL);
    cfg.moe.router.E = 3;
    cfg.moe.router.k = router == 2 ? 1 : 3;
    cfg.moe.router.renorm = router != 2;
    cfg.moe.router.temperature = 0.8;
    cfg.spectral_alpha = 0.3;
    cfg.sigma_t = 1.0;
    cfg.rho_t = 1.5;
    cfg.diversity_beta = 0.4;
    cfg.penalty_on_prototypes = router == 1;
    c->T = 6;
    sm_rng r;
    sm_rng_seed(&r, seed);
    c->m = sm_model_create(&cfg, c->T, &r, &err);
    cr_assert(c->m, "%s", err.msg);
    sm_srmoe_set_power_iters(c->m, 300); /* converged power iteration: the loss is then a function of W */
    c->x = malloc(sizeof(float) * c->T * 72);
    c->y = malloc(sizeof(int) * c->T);
    for (int i = 0; i < c->T * 72; i++) c->x[i] = (float)sm_rng_normal(&r);
    for (int t = 0; t < c->T; t++) c->y[t] = (int)sm_rng_below(&r, 3);
}

static void os_teardown(os_ctx *c) {
    free(c->x);
    free(c->y);
    sm_model_free(c->m);
}

/* One gradient of the one-shot loss, masked to row 0's active chain (path, 2 MoE layers). */
static void os_surgical_grad(os_ctx *c, int *path) {
    sm_params_zero_grad(&c->m->params);
    os_loss(c);
    cr_expect(c->m->penalty > 0, "the penalties are part of the one-shot loss");
    sm_model_backward(c->m, c->T);
    cr_assert_eq(sm_srmoe_active_chain(c->m, 0, path), 2);
    sm_error err;
    cr_assert_eq(sm_srmoe_surgical_mask(c->m, path, &err), SM_OK, "%s", err.msg);
}

/* the [start, start + n) entries of every expert tensor of the chain, as (pointer offset, length) */
typedef struct {
    size_t off, n;
} slice;

static int chain_slices(const sm_model *m, const int *path, slice *out) {
    int ns = 0;
    for (int l = 0; l < sm_model_n_moe(m); l++) {
        const sm_moe *moe = sm_model_moe(m, l);
        const size_t H = (size_t)moe->H, hid = moe->L > 1 ? (size_t)(moe->L - 1) : 0;
        const sm_real *base[6] = {moe->w1, moe->b1, moe->wh, moe->bh, moe->w2, moe->b2};
        const size_t per[6] = {H * moe->d, H, hid * H * H, hid * H, (size_t)moe->O * H, (size_t)moe->O};
        for (int k = 0; k < 6; k++)
            if (base[k] && per[k]) out[ns++] = (slice){(size_t)(base[k] - m->params.data) + (size_t)path[l] * per[k], per[k]};
    }
    return ns;
}

static int in_chain(const slice *s, int ns, size_t i) {
    for (int k = 0; k < ns; k++)
        if (i >= s[k].off && i < s[k].off + s[k].n) return 1;
    return 0;
}

Test(grad_srmoe, surgical_gradient_of_the_eq7_loss_matches_central_differences) {
    const char *names[3] = {"prototype+gate penalties", "prototype+prototype penalties", "top-1 linear"};
    for (int router = 0; router < 3; router++)
        for (int depth = 1; depth <= 2; depth++) {
            os_ctx c;
            os_setup(&c, router, depth, 90 + (uint64_t)router * 3 + (uint64_t)depth);
            int path[2];
            os_surgical_grad(&c, path);
            slice s[12];
            int ns = chain_slices(c.m, path, s);
            cr_expect_eq(ns, depth > 1 ? 12 : 8, "%s: every expert tensor of both stages", names[router]);
            /* everything outside the chain is exactly zero, and the chain's gradient is not */
            size_t nonzero_out = 0;
            double chain_norm = 0;
            for (size_t i = 0; i < c.m->params.total; i++) {
                if (in_chain(s, ns, i)) chain_norm += (double)c.m->params.grad[i] * c.m->params.grad[i];
                else nonzero_out += c.m->params.grad[i] != 0;
            }
            cr_expect_eq(nonzero_out, 0, "%s: %zu gradient entries outside the chain are not zero", names[router], nonzero_out);
            cr_expect(chain_norm > 0, "%s: the chain's gradient is zero", names[router]);
            /* the kept entries are the loss's partial derivatives w.r.t. the chain's expert parameters */
            sm_rng r;
            sm_rng_seed(&r, 5 + (uint64_t)router);
            for (int k = 0; k < ns; k++) {
                char what[96];
                snprintf(what, sizeof what, "%s depth %d: chain slice %d", names[router], depth, k);
                gc_check(what, c.m->params.data + s[k].off, c.m->params.grad + s[k].off, s[k].n, os_loss, &c, &r, 12);
            }
            os_teardown(&c);
        }
}

Test(grad_srmoe, surgical_step_leaves_everything_outside_the_chain_bit_for_bit) {
    const sm_opt_kind kinds[2] = {SM_OPT_SGD, SM_OPT_ADAM};
    for (int router = 0; router < 3; router++)
        for (int kd = 0; kd < 2; kd++) {
            os_ctx c;
            os_setup(&c, router, 2, 200 + (uint64_t)router);
            const size_t P = c.m->params.total;
            sm_real *before = malloc(sizeof(sm_real) * P);
            memcpy(before, c.m->params.data, sizeof(sm_real) * P);
            int path[2];
            os_surgical_grad(&c, path);
            slice s[12];
            int ns = chain_slices(c.m, path, s);
            sm_optim_config oc;
            sm_optim_config_default(&oc);
            oc.kind = kinds[kd];
            oc.lr = 0.05;
            oc.weight_decay = 0;
            oc.momentum = 0;
            sm_optim opt;
            sm_error err;
            cr_assert_eq(sm_optim_init(&opt, &oc, &c.m->params, &err), SM_OK, "%s", err.msg);
            sm_optim_step(&opt, &c.m->params, oc.lr);
            sm_optim_free(&opt);
            size_t changed_out = 0, changed_in = 0;
            for (size_t i = 0; i < P; i++) {
                int same = memcmp(&before[i], &c.m->params.data[i], sizeof(sm_real)) == 0;
                if (in_chain(s, ns, i)) changed_in += !same;
                else changed_out += !same;
            }
            cr_expect_eq(changed_out, 0, "router %d optimiser %d: %zu parameters outside the chain moved", router, kd, changed_out);
            cr_expect(changed_in > 0, "router %d optimiser %d: the chain's experts did not move", router, kd);
            free(before);
            os_teardown(&c);
        }
}

Test(grad_srmoe, surgical_mask_refuses_a_path_out_of_range) {
    os_ctx c;
    os_setup(&c, 0, 1, 7);
    int path[2];
    os_surgical_grad(&c, path);
    int bad[2] = {path[0], 3};
    sm_error err;
    cr_expect_eq(sm_srmoe_surgical_mask(c.m, bad, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "out of range"), "%s", err.msg);
    os_teardown(&c);
}
