/* SR-MoE's penalties as a penalty hook (include/specmoe/methods/srmoe/srmoe.h). */
#include "specmoe/methods/srmoe/srmoe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/spectral.h"

typedef struct {
    sm_penalty base;
    const sm_model *m;
    double alpha, sigma_t, rho_t, beta;
    int power_iters;      /* per step on persistent vectors (Miyato et al. 2018) */
    int n;                /* MoE stages */
    sm_moe *moe[SM_MAX_LAYERS];
    int target[SM_MAX_LAYERS];        /* penalised gate matrix (-1: none) */
    sm_power_iter power[SM_MAX_LAYERS];
} srmoe_penalty;

/* The loss pass (grad = 0) runs the power iterations and returns the value; the gradient pass
 * (grad = 1) reuses the same singular vectors and adds the gradients into the parameter gradients
 * (spectral) and the routes' dprobs (diversity). Stage by stage, as the sum is taken. */
static double srmoe_apply(sm_penalty *pp, const sm_params *pv, int T, int grad) {
    srmoe_penalty *p = (srmoe_penalty *)pp;
    double pen = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->target[i] >= 0) {
            sm_real *W = sm_params_data(pv, p->target[i]), *dW = grad ? sm_params_grad(pv, p->target[i]) : NULL;
            pen += sm_spectral_norm_penalty(&p->power[i], W, dW, p->sigma_t, p->alpha, grad ? 0 : p->power_iters);
            pen += sm_stable_rank_penalty(&p->power[i], W, dW, p->rho_t, p->alpha, 0);
        }
        if (p->beta > 0)
            pen += sm_diversity_penalty(p->moe[i]->route.probs, grad ? p->moe[i]->route.dprobs : NULL, T, p->moe[i]->E,
                                        p->beta);
    }
    return pen;
}

static void srmoe_destroy(sm_penalty *pp) {
    srmoe_penalty *p = (srmoe_penalty *)pp;
    for (int i = 0; i < p->n; i++) sm_power_iter_free(&p->power[i]);
    free(p);
}

static const sm_penalty_ops kOps = {"srmoe", srmoe_apply, srmoe_destroy};

/* Each MoE stage's gate matrix is the linear map feeding it (the dense layer right before,
 * skipping a LayerNorm) or, by flag, the router's prototype matrix. */
static sm_penalty *srmoe_attach(sm_model *m, sm_status *st, sm_error *err) {
    const sm_model_config *c = &m->cfg;
    if (!(c->spectral_alpha > 0) && !(c->diversity_beta > 0)) return NULL;
    srmoe_penalty *p = calloc(1, sizeof *p);
    if (!p) {
        *st = sm_fail(err, SM_ERR_NOMEM, "srmoe penalty: out of memory");
        return NULL;
    }
    p->base.ops = &kOps;
    p->m = m;
    p->alpha = c->spectral_alpha, p->sigma_t = c->sigma_t, p->rho_t = c->rho_t, p->beta = c->diversity_beta;
    p->power_iters = 1;
    const sm_params *ps = &m->params;
    for (int i = 0; i < m->n_layers; i++) {
        if (m->layers[i].kind != SM_LAYER_MOE) continue;
        int k = p->n++, target = -1;
        p->moe[k] = m->layers[i].moe;
        p->target[k] = -1;
        if (!(c->spectral_alpha > 0)) continue;
        if (c->penalty_on_prototypes) {
            char name[SM_NAME_MAX + 32];
            snprintf(name, sizeof name, "%s.router.prototypes", m->layers[i].mod->name);
            target = sm_params_find(ps, name);
        } else {
            for (int j = i - 1; j >= 0 && target < 0; j--) {
                char name[SM_NAME_MAX + 32];
                snprintf(name, sizeof name, "%s.weight", m->layers[j].mod->name);
                if (m->layers[j].kind == SM_LAYER_DENSE) target = sm_params_find(ps, name);
                else if (m->layers[j].kind != SM_LAYER_LN) break;
            }
        }
        if (target < 0) {
            *st = sm_fail(err, SM_ERR_ARG, "model: spectral penalty on MoE layer %d needs %s", i,
                          c->penalty_on_prototypes ? "a prototype router" : "a dense layer feeding it");
            srmoe_destroy(&p->base);
            return NULL;
        }
        p->target[k] = target;
        const sm_param *q = &ps->p[target];
        sm_rng pr; /* the power-iteration start is fixed, so runs are reproducible */
        sm_rng_seed(&pr, 0x5eed + (uint64_t)i);
        if ((*st = sm_power_iter_init(&p->power[k], (int)q->shape[0], (int)(q->numel / (size_t)q->shape[0]), &pr, err)) !=
            SM_OK) {
            p->n = k; /* power[k] was not initialised */
            srmoe_destroy(&p->base);
            return NULL;
        }
    }
    return &p->base;
}

const sm_penalty_kind sm_srmoe_penalty_kind = {"srmoe", srmoe_attach};

void sm_srmoe_set_power_iters(sm_model *m, int iters) {
    for (int i = 0; i < m->n_penalties; i++)
        if (m->penalties[i]->ops == &kOps) ((srmoe_penalty *)m->penalties[i])->power_iters = iters;
}
