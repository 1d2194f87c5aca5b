/* Golden cases: the models whose outputs and gradients tests/data/golden_v0.safetensors holds.
 *
 * The file was written by tests/golden_gen.c at commit 007f635, the last commit before the module
 * refactor (one thread). tests/test_golden.c rebuilds each case from the model JSON stored beside it,
 * loads the stored parameters and requires the same logits, loss and gradients bit for bit. The
 * configs are built through the public API that a checkpoint's model JSON also goes through, so the
 * file doubles as a check that old model descriptions still load.
 *
 * Letters: T rows of the batch, D input width, V classes.
 */
#ifndef SPECMOE_TESTS_GOLDEN_CASES_H
#define SPECMOE_TESTS_GOLDEN_CASES_H

#include <string.h>

#include "specmoe.h"

#define GOLDEN_T 12
#define GOLDEN_SEED 20261122u

typedef struct {
    const char *name;
    const char *arch;    /* --arch string, or NULL for SR-MoE (stages 2, width 8, stem {4}) */
    const char *router;  /* router name */
    int in_c, in_h, in_w;/* input image (in_c * in_h * in_w = D) */
    int E, k;
    int noisy, renorm, residual, shared, expert_bias, gelu;
    double capacity, balance, zloss, spectral_alpha, diversity_beta;
    int amortize, proto_on;
} golden_case;

static const golden_case kGoldenCases[] = {
    /* name         arch                                   router  image     E  k  noisy renorm res sh bias gelu cap   bal   zl    spec  div   am po */
    {"dense_moe",   "dense:16,moe:12",                     "topk", 20, 1, 1, 4, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"moe_ffn_res", "dense:6,moe:5,ffn:7",                 "topk", 20, 1, 1, 4, 2, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    {"noisy_cap",   "dense:12,moe:10",                     "topk", 20, 1, 1, 6, 2, 1, 1, 0, 0, 1, 0, 1.0, 0, 0, 0, 0, 0, 0},
    {"dense_mix",   "dense:12,moe:10",                     "topk", 20, 1, 1, 4, 4, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"conv_stack",  "conv:3:3:2:1,maxpool:2:1,gap,dense:6,ln,moe:5,dense:6,ln,moe:4", "topk", 1, 8, 8, 4, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"conv_avg",    "conv:2:3:1:1,avgpool:2:2,dense:8,moe:6", "topk", 2, 4, 4, 4, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"switch",      "dense:12,moe:10",                     "switch", 20, 1, 1, 4, 1, 0, 0, 0, 0, 1, 0, 1.25, 0.01, 0.001, 0, 0, 0, 0},
    {"expert_choice","dense:12,moe:10",                    "expert-choice", 20, 1, 1, 4, 1, 0, 0, 0, 0, 1, 0, 1.0, 0, 0, 0, 0, 0, 0},
    {"hash",        "dense:12,moe:10",                     "hash", 20, 1, 1, 4, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"random",      "dense:12,moe:10",                     "random", 20, 1, 1, 4, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"soft",        "dense:12,moe:10",                     "soft", 20, 1, 1, 4, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"vmf",         "dense:12,moe:10",                     "vmf", 20, 1, 1, 4, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"grassmann",   "dense:12,moe:10",                     "grassmann", 20, 1, 1, 4, 4, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"grassmann_am","dense:12,moe:10",                     "grassmann", 20, 1, 1, 4, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0},
    {"prototype",   "dense:12,ln,moe:10",                  "prototype", 20, 1, 1, 4, 4, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0.2, 0, 0},
    {"srmoe",       NULL,                                  "prototype", 1, 8, 8, 3, 3, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0.01, 0.1, 0, 0},
    {"srmoe_proto", NULL,                                  "prototype", 1, 8, 8, 3, 3, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0.01, 0, 0, 1},
    {"ev",          "dense:12,moe:10",                     "ev", 20, 1, 1, 4, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
};
#define N_GOLDEN (sizeof kGoldenCases / sizeof kGoldenCases[0])

/* The model config of case c through the public API; 0 on success. */
static inline int golden_config(const golden_case *c, sm_model_config *cfg, sm_error *err) {
    sm_model_config_default(cfg);
    cfg->in_c = c->in_c;
    cfg->in_h = c->in_h;
    cfg->in_w = c->in_w;
    cfg->in_dim = c->in_c * c->in_h * c->in_w;
    cfg->n_classes = 5;
    cfg->residual = c->residual;
    if (c->gelu) cfg->act = SM_ACT_GELU;
    sm_router_config *r = &cfg->moe.router;
    if (sm_router_config_set(r, c->router, err) != SM_OK) return 1;
    r->E = c->E;
    r->k = c->k;
    r->noisy = c->noisy;
    r->renorm = c->renorm;
    r->capacity = c->capacity;
    r->balance_coef = c->balance;
    r->zloss_coef = c->zloss;
    r->temperature = 0.9;
    if (!strcmp(c->router, "grassmann") || !strcmp(c->router, "vmf")) {
        sm_grmoe_opts(r)->amortize = c->amortize;
        sm_grmoe_opts(r)->kr = 3;
        sm_grmoe_opts(r)->alpha = 1.3;
    } else if (!strcmp(c->router, "ev")) {
        sm_ev_opts(r)->ev_c = 3;
        sm_ev_opts(r)->alpha = 0.5;
    } else if (!strcmp(c->router, "soft")) {
        sm_soft_opts(r)->slots = 2;
        sm_soft_opts(r)->soft_group = 4;
        r->temperature = 1; /* the stored reference was written when the soft router ignored it */
    }
    cfg->moe.n_shared = c->shared;
    cfg->moe.expert_bias = c->expert_bias;
    cfg->spectral_alpha = c->spectral_alpha;
    cfg->diversity_beta = c->diversity_beta;
    cfg->sigma_t = 1.0;
    cfg->rho_t = 2.0;
    cfg->penalty_on_prototypes = c->proto_on;
    if (!c->arch) {
        int stem[1] = {4};
        return sm_model_arch_srmoe(cfg, 2, 8, stem, 1, err) != SM_OK;
    }
    return sm_model_parse_arch(cfg, c->arch, err) != SM_OK;
}

#endif
