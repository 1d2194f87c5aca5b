/* The two actor shapes of SPHERE's baselines for tests (tests/test_grad_baselines.c,
 * tests/test_baselines.c): a dense stack "dense:6,dense:5" (the mlp actor) and an MoE head of E
 * experts of 3 hidden layers of 5 with a gate MLP (the moe actor), over 4 inputs and 3 outputs; with
 * ln, LayerNorm in every hidden layer (the LN baseline). */
#ifndef SPECMOE_BASELINES_FIXTURE_H
#define SPECMOE_BASELINES_FIXTURE_H

#include <criterion/criterion.h>

#include "specmoe/nn/model.h"

static inline sm_model *baselines_fixture_ln(int moe, sm_act act, int ln, int max_T, sm_rng *rng) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, moe ? "moehead:5:2:6" : "dense:6,dense:5", &err), SM_OK, "%s", err.msg);
    cfg.in_dim = 4, cfg.n_classes = 3;
    cfg.act = cfg.moe.act = act;
    cfg.moe.depth = 3;
    cfg.moe.router.E = 3, cfg.moe.router.k = 2, cfg.moe.router.renorm = 1;
    cfg.hidden_ln = ln;
    sm_model *m = sm_model_create(&cfg, max_T, rng, &err);
    cr_assert(m, "%s", err.msg);
    return m;
}

static inline sm_model *baselines_fixture(int moe, sm_act act, int max_T, sm_rng *rng) {
    return baselines_fixture_ln(moe, act, 0, max_T, rng);
}

#endif
