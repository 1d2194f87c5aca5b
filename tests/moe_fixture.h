/* A small MoE classifier for tests: "dense:6,moe:5" over 4 inputs and 3 classes, E experts of which
 * k route each token, the config's defaults otherwise; tweak(cfg) (may be NULL) adjusts the config
 * before the model is built from rng with activations for max_T rows. */
#ifndef SPECMOE_MOE_FIXTURE_H
#define SPECMOE_MOE_FIXTURE_H

#include <criterion/criterion.h>

#include "specmoe/nn/model.h"

static inline sm_model *moe_fixture(int E, int k, void (*tweak)(sm_model_config *), int max_T, sm_rng *rng) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, "dense:6,moe:5", &err), SM_OK);
    cfg.in_dim = 4;
    cfg.n_classes = 3;
    cfg.moe.router.E = E;
    cfg.moe.router.k = k;
    if (tweak) tweak(&cfg);
    sm_model *m = sm_model_create(&cfg, max_T, rng, &err);
    cr_assert(m, "%s", err.msg);
    return m;
}

#endif
