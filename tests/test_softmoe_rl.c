/* SoftMoE-in-RL's expert resets and shrink-and-perturb (include/specmoe/methods/softmoe_rl/reset.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe_fixture.h"
#include "specmoe.h"

/* every expert sees every token */
static sm_model *small_moe(sm_rng *r) { return moe_fixture(3, 3, NULL, 16, r); }

/* theta_e <- 0.5 theta_e + 0.5 phi_e for expert 1 only, phi the initialiser's next draw; the
 * optimiser's moments of those values cleared, the rest untouched. */
Test(softmoe_rl, shrink_and_perturb_one_expert) {
    sm_rng r;
    sm_rng_seed(&r, 1);
    sm_model *m = small_moe(&r);
    sm_optim opt;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    sm_error err = {0};
    cr_assert_eq(sm_optim_init(&opt, &oc, &m->params, &err), SM_OK);
    for (size_t i = 0; i < opt.n; i++) opt.m[i] = opt.v[i] = 1; /* moments as after some steps */
    const size_t N = m->params.total;
    sm_real *before = malloc(sizeof(sm_real) * N);
    memcpy(before, m->params.data, sizeof(sm_real) * N);
    sm_rng a, b;
    sm_rng_seed(&a, 9);
    sm_rng_seed(&b, 9);
    const int one[1] = {1};
    size_t changed = sm_moe_shrink_perturb(m, &opt, 1, one, 1, 0, 0.5, 0.5, &a);
    cr_expect_gt(changed, 0);
    size_t seen = 0;
    for (int i = 0; i < m->params.n; i++) {
        const sm_param *q = &m->params.p[i];
        const int expert_tensor = strstr(q->name, "layers.1.experts.") == q->name;
        sm_real *fresh = malloc(sizeof(sm_real) * q->numel);
        if (expert_tensor) sm_params_init_draw(&m->params, i, fresh, &b); /* the same draws, in order */
        const size_t block = q->numel / 3;
        for (size_t k = 0; k < q->numel; k++) {
            const size_t at = q->offset + k;
            const int hit = expert_tensor && k >= block && k < 2 * block;
            const sm_real want = hit ? (sm_real)(0.5 * before[at] + 0.5 * fresh[k]) : before[at];
            cr_expect_eq(m->params.data[at], want, "%s[%zu]", q->name, k);
            cr_expect_eq(opt.m[at], hit ? 0 : 1, "%s[%zu] first moment", q->name, k);
            cr_expect_eq(opt.v[at], hit ? 0 : 1, "%s[%zu] second moment", q->name, k);
            seen += hit;
        }
        free(fresh);
    }
    cr_expect_eq(seen, changed);
    /* a reset of every expert and the router: shrink 0, perturb 1 changes the router too */
    memcpy(before, m->params.data, sizeof(sm_real) * N);
    sm_moe_shrink_perturb(m, &opt, -1, NULL, 0, 1, 0.0, 1.0, &a);
    const sm_real *rw = sm_params_data(&m->params, sm_params_find(&m->params, "layers.1.router.weight"));
    const size_t off = m->params.p[sm_params_find(&m->params, "layers.1.router.weight")].offset;
    cr_expect_neq(rw[0], before[off]);
    const size_t d0 = m->params.p[sm_params_find(&m->params, "layers.0.weight")].offset;
    cr_expect_eq(m->params.data[d0], before[d0], "the dense layer is not an expert");
    free(before);
    sm_optim_free(&opt);
    sm_model_free(m);
}

/* expert e's first layer (weights and bias) times s: 0 silences it */
static void scale_expert(sm_moe *moe, int e, sm_real s) {
    const size_t blk = (size_t)moe->H * moe->d;
    for (size_t i = 0; i < blk; i++) moe->w1[(size_t)e * blk + i] *= s;
    for (int i = 0; moe->b1 && i < moe->H; i++) moe->b1[(size_t)e * moe->H + i] *= s;
}

/* the most dormant experts: expert 2 silenced (zero first layer) is picked first */
Test(softmoe_rl, most_dormant_experts) {
    sm_rng r;
    sm_rng_seed(&r, 2);
    sm_model *m = small_moe(&r);
    scale_expert(sm_model_moe(m, 0), 2, 0);
    float x[8 * 4];
    for (int i = 0; i < 32; i++) x[i] = (float)sm_rng_normal(&r);
    sm_model_forward(m, x, 8, NULL, 0);
    int pick[2];
    sm_dormant_entry e[8];
    int ne = sm_model_dormant(m, 8, 0.0, e, 8);
    cr_assert_eq(sm_moe_most_dormant(e, ne, 1, 2, pick), 2);
    cr_expect_eq(pick[0], 2);
    cr_expect_neq(pick[1], 2);
    sm_model_free(m);
}

/* Per layer and per expert (sm_model_dormant): a dense layer with 3 of its 6 units silenced (zero
 * weights and bias under ReLU) and an MoE layer whose expert 0 is silenced the same way. */
Test(softmoe_rl, dormant_per_layer_and_per_expert_of_a_model) {
    sm_rng r;
    sm_rng_seed(&r, 3);
    sm_model *m = small_moe(&r);
    sm_real *w = sm_params_data(&m->params, sm_params_find(&m->params, "layers.0.weight"));
    sm_real *b = sm_params_data(&m->params, sm_params_find(&m->params, "layers.0.bias"));
    for (int u = 0; u < 3; u++) {
        for (int i = 0; i < 4; i++) w[u * 4 + i] = 0;
        b[u] = 0;
    }
    sm_moe *moe = sm_model_moe(m, 0);
    for (int i = 0; i < 5 * 6; i++) moe->w1[i] = 0; /* expert 0's (H=5, d=6) first layer */
    if (moe->b1)
        for (int i = 0; i < 5; i++) moe->b1[i] = 0;
    float x[16 * 4];
    for (int i = 0; i < 16 * 4; i++) x[i] = (float)sm_rng_normal(&r);
    sm_model_forward(m, x, 16, NULL, 0);
    sm_dormant_entry e[16];
    int n = sm_model_dormant(m, 16, 0.0, e, 16);
    cr_assert_eq(n, 1 + 3 + 1, "dense, three experts, the moe layer");
    cr_expect(e[0].layer == 0 && e[0].expert == -1 && e[0].fraction >= 0.5, "dense: %g", e[0].fraction);
    cr_expect(e[1].layer == 1 && e[1].expert == 0 && e[1].fraction == 1.0, "expert 0: %g", e[1].fraction);
    cr_expect(e[2].expert == 1 && e[2].fraction < 1.0 && e[3].expert == 2 && e[3].fraction < 1.0);
    cr_expect(e[4].expert == -1 && e[4].fraction >= 5.0 / 15.0, "moe layer: %g", e[4].fraction);
    sm_model_free(m);
}

/* An expert that is weak throughout (its first layer scaled by 1e-3) is dormant against the layer:
 * its units score about 1e-3 of the layer's mean, so the "most dormant" expert to reset is it (a
 * score against the expert's own mean would call none of its units dormant). */
Test(softmoe_rl, a_uniformly_weak_expert_is_dormant_against_its_layer) {
    sm_rng r;
    sm_rng_seed(&r, 5);
    sm_model *m = small_moe(&r);
    scale_expert(sm_model_moe(m, 0), 1, (sm_real)1e-3);
    float x[16 * 4];
    for (int i = 0; i < 16 * 4; i++) x[i] = (float)sm_rng_normal(&r);
    sm_model_forward(m, x, 16, NULL, 0);
    sm_dormant_entry e[16];
    int n = sm_model_dormant(m, 16, 0.1, e, 16);
    int k = -1;
    for (int i = 0; i < n; i++)
        if (e[i].layer == 1 && e[i].expert == 1) k = i;
    cr_assert(k >= 0);
    cr_expect_eq(e[k].fraction, 1.0, "the weak expert's dormant fraction: %g", e[k].fraction);
    int pick[1];
    cr_assert_eq(sm_moe_most_dormant(e, n, 1, 1, pick), 1);
    cr_expect_eq(pick[0], 1, "the most dormant expert: %d", pick[0]);
    sm_model_free(m);
}

/* the pruning schedule of the DQN family's prune_* options */
Test(softmoe_rl, prune_schedule) {
    cr_expect_eq(sm_prune_count(0, 0, 100, 50), 0);
    cr_expect_eq(sm_prune_count(2, 100, 100, 99), 0, "nothing before prune_from");
    cr_expect_eq(sm_prune_count(2, 100, 100, 100), 2, "all at once when from == to");
    cr_expect_eq(sm_prune_count(2, 100, 300, 100), 1, "gradual: the first at from");
    cr_expect_eq(sm_prune_count(2, 100, 300, 299), 1);
    cr_expect_eq(sm_prune_count(2, 100, 300, 300), 2, "the last at to");
    cr_expect_eq(sm_prune_count(3, 0, 100, 50), 2, "three evenly: at 0, 50, 100");
    cr_expect_eq(sm_prune_count(3, 0, 100, 10000), 3);
}

/* A pruned expert of a SoftMoE model takes no part: the outputs do not move when its weights do,
 * its gradients are zero, and each token's combine weights sum to 1 over the other experts' slots.
 * Routers that cannot prune, and pruning every expert, are refused with nothing changed. */
Test(softmoe_rl, pruned_experts_take_no_part) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, "conv:3:3:1:1,tokens,moe:5,flatten", &err), SM_OK);
    cfg.in_c = 2, cfg.in_h = cfg.in_w = 4, cfg.in_dim = 32, cfg.n_classes = 3;
    sm_router_config_set(&cfg.moe.router, "soft", NULL);
    cfg.moe.router.E = 4;
    cfg.moe.router.k = 1;
    sm_rng r;
    sm_rng_seed(&r, 3);
    const int T = 6;
    sm_model *m = sm_model_create(&cfg, T, &r, &err);
    cr_assert(m, "%s", err.msg);
    float x[6 * 32];
    for (int i = 0; i < T * 32; i++) x[i] = (float)sm_rng_normal(&r);
    const sm_real *y0 = sm_model_forward(m, x, T, NULL, 0);
    sm_real before[6 * 3];
    memcpy(before, y0, sizeof before);
    cr_assert_eq(sm_model_prune_last(m, 2, &err), SM_OK, "%s", err.msg);
    sm_real pruned[6 * 3];
    memcpy(pruned, sm_model_forward(m, x, T, NULL, 0), sizeof pruned);
    int moved = 0;
    for (int i = 0; i < T * 3; i++) moved |= pruned[i] != before[i];
    cr_expect(moved, "pruning two of four experts changes the outputs");
    /* combine weights: 0 on experts 2, 3; rows sum to 1 */
    const sm_moe *q = sm_model_moe(m, 0);
    const sm_route *rt = &q->route;
    const int S = 4 * rt->slots;
    for (int t = 0; t < rt->T; t++) {
        double on = 0, off = 0;
        for (int s = 0; s < S; s++) *(s >= 2 * rt->slots ? &off : &on) += rt->combine[(size_t)t * S + s];
        cr_expect(fabs(on - 1) < 1e-5 && off == 0, "token %d: combine mass %g on active slots, %g on pruned", t, on, off);
    }
    /* the pruned experts' weights do not matter, and get no gradient */
    for (int i = 0; i < m->params.n; i++) {
        const sm_param *p = &m->params.p[i];
        if (!strstr(p->name, ".experts.")) continue;
        sm_real *v = sm_params_data(&m->params, i);
        for (size_t j = p->numel / 2; j < p->numel; j++) v[j] += 0.5f; /* experts 2, 3: the second half */
    }
    const sm_real *y2 = sm_model_forward(m, x, T, NULL, 1);
    for (int i = 0; i < T * 3; i++) cr_expect_eq(y2[i], pruned[i], "output %d moved with a pruned expert's weights", i);
    int y[6] = {0, 1, 2, 0, 1, 2};
    sm_params_zero_grad(&m->params);
    sm_model_loss(m, y, NULL, T);
    sm_model_backward(m, T);
    for (int i = 0; i < m->params.n; i++) {
        const sm_param *p = &m->params.p[i];
        if (!strstr(p->name, ".experts.")) continue;
        const sm_real *g = sm_params_grad(&m->params, i);
        double lo = 0, hi = 0;
        for (size_t j = 0; j < p->numel / 2; j++) lo += fabs(g[j]);
        for (size_t j = p->numel / 2; j < p->numel; j++) hi += fabs(g[j]);
        cr_expect(lo > 0 && hi == 0, "%s: |grad| %g on active experts, %g on pruned", p->name, lo, hi);
    }
    /* restoring them gives the first outputs back */
    for (int i = 0; i < m->params.n; i++) {
        const sm_param *p = &m->params.p[i];
        if (!strstr(p->name, ".experts.")) continue;
        sm_real *v = sm_params_data(&m->params, i);
        for (size_t j = p->numel / 2; j < p->numel; j++) v[j] -= 0.5f;
    }
    cr_assert_eq(sm_model_prune_last(m, 0, &err), SM_OK);
    const sm_real *y3 = sm_model_forward(m, x, T, NULL, 0);
    for (int i = 0; i < T * 3; i++) cr_expect(fabs(y3[i] - before[i]) < 1e-6, "output %d after restoring", i);
    cr_expect_eq(sm_model_prune_last(m, 4, &err), SM_ERR_ARG, "every expert pruned");
    cr_expect(strstr(err.msg, "at least one must stay"), "%s", err.msg);
    sm_model_free(m);
    /* a router that cannot prune */
    sm_model *t = small_moe(&r);
    cr_expect_eq(sm_model_prune_last(t, 1, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "cannot prune"), "%s", err.msg);
    sm_model_free(t);
}

/* Fig. 5's tokenised baseline puts a batch's tokens through one dense layer: 8 observations x 64
 * tokens = 512 rows, beyond the packed product's 256, run 128 at a time on it (modules.c,
 * DENSE_CHUNK), the first chunk's gradients set and the rest added. So the layer's gradients from one
 * call of 8 observations equal, bit for bit, those of four calls of 2 (128 rows each, one packed
 * product per call) accumulated in order - which OpenBLAS in one piece would not give. Checked
 * where the rule packs all three products at 128 rows (an AVX-512 core); skipped elsewhere. */
Test(softmoe_rl, dense_rows_beyond_the_packed_reach_run_in_chunks) {
    const int C = 16, HW = 8, W = 512, B = 8, Bs = 2, V = 6;
    const int all = SM_LINEAR_SMALL_FWD | SM_LINEAR_SMALL_DINP | SM_LINEAR_SMALL_DWEIGHT;
    if ((sm_linear_small_use(128, C, W) & all) != all) {
        fprintf(stderr, "softmoe_rl: the packed product does not take 128 rows of 16 -> 512 here: no bits to compare\n");
        return;
    }
    sm_model_config mc;
    sm_model_config_default(&mc);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&mc, "tokens,dense:512,toksum", &err), SM_OK, "%s", err.msg);
    mc.act = SM_ACT_RELU;
    mc.in_c = C;
    mc.in_h = mc.in_w = HW;
    mc.in_dim = C * HW * HW;
    mc.n_classes = V;
    sm_rng r;
    sm_rng_seed(&r, 3);
    sm_model *m = sm_model_create(&mc, B, &r, &err);
    cr_assert(m, "%s", err.msg);
    const int D = mc.in_dim;
    float *x = malloc(sizeof(float) * B * D);
    sm_real *G = malloc(sizeof(sm_real) * B * V);
    for (int i = 0; i < B * D; i++) x[i] = (float)sm_rng_normal(&r);
    for (int i = 0; i < B * V; i++) G[i] = (sm_real)sm_rng_normal(&r);
    const int iw = sm_params_find(&m->params, "layers.1.weight"), ib = sm_params_find(&m->params, "layers.1.bias");
    cr_assert(iw >= 0 && ib >= 0, "no dense layer named layers.1");
    const size_t nw = m->params.p[iw].numel, nb = m->params.p[ib].numel;
    sm_real *gw = malloc(sizeof(sm_real) * nw), *gb = malloc(sizeof(sm_real) * nb);
    /* one call of 8 observations (512 rows: four chunks) */
    sm_params_zero_grad(&m->params);
    sm_model_forward(m, x, B, NULL, 1);
    memcpy(m->dlogits, G, sizeof(sm_real) * B * V);
    sm_model_backward(m, B);
    memcpy(gw, sm_params_grad(&m->params, iw), sizeof(sm_real) * nw);
    memcpy(gb, sm_params_grad(&m->params, ib), sizeof(sm_real) * nb);
    /* four calls of 2 (128 rows each), the gradients accumulated */
    sm_params_zero_grad(&m->params);
    for (int b0 = 0; b0 < B; b0 += Bs) {
        sm_model_forward(m, x + (size_t)b0 * D, Bs, NULL, 1);
        memcpy(m->dlogits, G + (size_t)b0 * V, sizeof(sm_real) * Bs * V);
        sm_model_backward(m, Bs);
    }
    const sm_real *hw = sm_params_grad(&m->params, iw), *hb = sm_params_grad(&m->params, ib);
    for (size_t i = 0; i < nw; i++)
        cr_assert(gw[i] == hw[i], "weight gradient [%zu]: %.9g in one call, %.9g in four", i, gw[i], hw[i]);
    for (size_t i = 0; i < nb; i++)
        cr_assert(gb[i] == hb[i], "bias gradient [%zu]: %.9g in one call, %.9g in four", i, gb[i], hb[i]);
    free(x), free(G), free(gw), free(gb);
    sm_model_free(m);
}
