/* Internal: the softmax gate shared by score-based token-choice routers (topk, switch, vmf,
 * grassmann). A router computes logits (T,E); the gate turns them into a route:
 *
 *   p = softmax(logits / temperature)       the routing probabilities (route->probs)
 *   top-k per token (ties -> lower index), weights p_S, renormalised if renorm
 *   capacity cf > 0: ceil(cf * T * k / E) assignments per expert, tokens in index order; with a
 *     group size m, ceil(cf * m * k / E) per expert within each group of m tokens
 *   aux losses on the route (added to the objective by the model):
 *     balance (Switch, Fedus et al. 2022 Eq. 4): coef * E * sum_e f_e P_e with f_e the fraction of
 *       choices that picked e (before capacity, no gradient) and P_e = mean_t p_te
 *     z-loss (ST-MoE, Zoph et al. 2022 Eq. 5): coef * mean_t (logsumexp_e logits_te)^2
 * and back: from route->dweight (and the aux losses) to dlogits.
 *
 * Letters: T tokens, E experts, k choices per token.
 */
#ifndef SPECMOE_GATE_H
#define SPECMOE_GATE_H

#include "specmoe/nn/router.h"

typedef struct {
    const sm_router_config *cfg; /* read at every call: temperature / alpha are live dials */
    int E, k, max_T;
    int group;       /* tokens per capacity group (0: the whole batch), set by the router */
    int *choice;     /* (T,k) chosen expert per rank; -1-e when dropped by capacity */
    sm_real *wsel;   /* (T,k) weights before capacity; reused as dw in the backward */
    sm_real *dp;     /* (T,E) scratch */
    sm_real *lse;    /* (T) logsumexp of the raw logits (z-loss) */
    sm_real *zprob;  /* (T,E) softmax of the raw logits (z-loss gradient) */
    double *frac;    /* (E) f_e of the balance loss */
    int *count;      /* (E) capacity counters */
    sm_real *block;  /* the allocations the arrays above are carved from (sm_carve): sm_real, */
    int *iblock;     /* int */
    double *dblock;  /* and double */
} sm_gate;

/* Indices of the k largest of p (E values), larger first, ties to the lower index: the gate's choice. */
void sm_gate_topk(int *idx, const sm_real *p, int E, int k);
/* The expert of a choice entry (dropped ones are stored as -1-e). */
static inline int sm_gate_expert(int c) { return c < 0 ? -1 - c : c; }

sm_status sm_gate_init(sm_gate *g, const sm_router_config *c, int max_T, sm_error *err);
void sm_gate_free(sm_gate *g);
void sm_gate_forward(sm_gate *g, sm_route *route, const sm_real *logits, int T);
/* dlogits (T,E) = dLoss/dlogits (overwritten, not accumulated). */
void sm_gate_backward(sm_gate *g, sm_real *dlogits, const sm_route *route, int T);

#endif
