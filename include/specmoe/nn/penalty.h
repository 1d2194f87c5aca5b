/* Penalty hooks: a penalty computes its value after the forward and, before the network's backward,
 * adds its gradient where it acts - into parameter gradients (the call's view), into routing
 * probabilities (route.dprobs, consumed by the router's backward) or into a module's features.
 *
 *   value = p->ops->apply(p, pv, T, 0);   // after forward: value (may advance state, e.g. power iteration)
 *   p->ops->apply(p, pv, T, 1);           // before backward: gradients += into pv->grad / dprobs
 *
 * A penalty kind attaches itself to a classifier (model.h) when the model's config asks for it;
 * the registry (src/nn/penalty.c) lists the kinds, one line each, as the router registry does.
 * Methods put their penalties in src/methods/<paper>/ (SR-MoE: srmoe.c).
 */
#ifndef SPECMOE_PENALTY_H
#define SPECMOE_PENALTY_H

#include "specmoe/nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    /* grad = 0: returns the value; grad = 1: adds the gradient of the value of the last grad = 0 call */
    double (*apply)(sm_penalty *p, const sm_params *pv, int T, int grad);
    void (*destroy)(sm_penalty *p);
} sm_penalty_ops;

struct sm_penalty {
    const sm_penalty_ops *ops;
};

typedef struct {
    const char *name;
    /* the penalty m's config asks for, NULL with *st = SM_OK when it asks for none */
    sm_penalty *(*attach)(sm_model *m, sm_status *st, sm_error *err);
} sm_penalty_kind;

/* Attaches every penalty m->cfg asks for (called by sm_model_create after the parameters exist). */
sm_status sm_model_attach_penalties(sm_model *m, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
