/* Token-choice softmax routers with a linear gate: "topk" (Shazeer et al. 2017; Mixtral's gate) and
 * "switch" (Fedus et al. 2022: top-1, load-balancing loss, optional router z-loss).
 *
 *   logits = x Wg^T                                  (T,E)
 *   noisy:   logits += eps * softplus(x Wn^T),  eps ~ N(0,1), training only (Shazeer Eq. 4)
 *   then the shared softmax gate (gate.h): softmax / temperature, top-k, renormalisation,
 *   capacity, balance and z losses.
 *
 * Letters: T tokens, d width, E experts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/gate.h"
#include "specmoe/nn/routers.h"
#include "specmoe/core/ops.h"

typedef struct {
    int iw, inw;        /* parameter indices: gate (E,d), noise gate (E,d) or -1 */
    sm_real *wg, *dwg;  /* (E,d) */
    sm_real *wn, *dwn;  /* (E,d) noise projection, NULL unless noisy */
    sm_gate gate;
    sm_real *logits;    /* (T,E) logits fed to the gate; reused for dlogits */
    sm_real *npre;      /* (T,E) x Wn^T (noisy only) */
    sm_real *eps;       /* (T,E) the noise draw (noisy only) */
    sm_real *block;     /* the allocation logits, npre and eps are carved from */
    int used_noise;     /* the last forward added noise */
} topk_state;

static sm_status topk_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    topk_state *s = calloc(1, sizeof *s);
    if (!s) return sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
    r->state = s;
    char name[SM_NAME_MAX];
    int64_t shape[2] = {r->cfg.E, r->d};
    snprintf(name, sizeof name, "%s.weight", prefix);
    s->iw = sm_params_add(ps, name, 2, shape, SM_INIT_UNIFORM_FANIN, r->d, 0, 0, err);
    if (s->iw < 0) return SM_ERR_ARG;
    s->inw = -1;
    if (r->cfg.noisy) {
        snprintf(name, sizeof name, "%s.noise_weight", prefix);
        /* zero init: the noise starts at softplus(0) = log 2 and is learned (Shazeer 2017) */
        s->inw = sm_params_add(ps, name, 2, shape, SM_INIT_ZERO, r->d, 0, 0, err);
        if (s->inw < 0) return SM_ERR_ARG;
    }
    return SM_OK;
}

/* Switch: top-1 (the CLI also defaults its balance coefficient to the paper's 0.01). */
static sm_status switch_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    if (r->cfg.k != 1) return sm_fail(err, SM_ERR_ARG, "router switch: routes each token to exactly one expert (k=%d)", r->cfg.k);
    return topk_declare(r, ps, prefix, err);
}

static void topk_bind(sm_router *r, const sm_params *ps) {
    topk_state *s = r->state;
    s->wg = sm_params_data(ps, s->iw);
    s->dwg = sm_params_grad(ps, s->iw);
    if (s->inw >= 0) {
        s->wn = sm_params_data(ps, s->inw);
        s->dwn = sm_params_grad(ps, s->inw);
    }
}

static int topk_max_assign(const sm_router *r, int T) { return T * r->cfg.k; }

static sm_status topk_reserve(sm_router *r, int max_T, sm_error *err) {
    topk_state *s = r->state;
    size_t n = (size_t)max_T * r->cfg.E;
    size_t sizes[] = {n, n, n};
    sm_real **ptrs[] = {&s->logits, &s->npre, &s->eps};
    s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router %s (%d tokens)", r->cfg.name, max_T);
    if (!s->block) return SM_ERR_NOMEM;
    sm_status st = sm_gate_init(&s->gate, &r->cfg, max_T, err);
    s->gate.group = sm_group_opts(&r->cfg)->group;
    return st;
}

static sm_real softplus(sm_real x) { return x > 20 ? x : (sm_real)log1p(exp((double)x)); }
static sm_real sigmoid(sm_real x) { return (sm_real)(1.0 / (1.0 + exp(-(double)x))); }

static void topk_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train) {
    topk_state *s = r->state;
    const int E = r->cfg.E, d = r->d;
    sm_linear_forward(s->logits, x, s->wg, NULL, T, d, E);
    s->used_noise = r->cfg.noisy && train && rng;
    if (s->used_noise) {
        sm_linear_forward(s->npre, x, s->wn, NULL, T, d, E);
        for (int i = 0; i < T * E; i++) {
            s->eps[i] = (sm_real)sm_rng_normal(rng);
            s->logits[i] += s->eps[i] * softplus(s->npre[i]);
        }
    }
    sm_gate_forward(&s->gate, route, s->logits, T);
}

static void topk_backward(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T) {
    topk_state *s = r->state;
    const int E = r->cfg.E, d = r->d;
    sm_real *dlog = s->logits; /* the forward logits are no longer needed */
    sm_gate_backward(&s->gate, dlog, route, T);
    sm_linear_backward(dx, s->dwg, NULL, dlog, x, s->wg, T, d, E);
    if (s->used_noise) {
        /* logits += eps * softplus(npre):  dnpre = dlogits * eps * sigmoid(npre) */
        sm_real *dn = s->npre;
        for (int i = 0; i < T * E; i++) dn[i] = dlog[i] * s->eps[i] * sigmoid(s->npre[i]);
        sm_linear_backward(dx, s->dwn, NULL, dn, x, s->wn, T, d, E);
    }
}

static void topk_destroy(sm_router *r) {
    topk_state *s = r->state;
    if (!s) return;
    free(s->block);
    sm_gate_free(&s->gate);
    free(s);
    r->state = NULL;
}

/* The Switch / Mixtral load-balancing loss is on by default for the token-choice softmax routers:
 * without it the default run starves 4 of 8 experts (< 0.01% of tokens). 0.01 is Switch's value; on
 * the validation split it kept every expert above 8% at the same accuracy (BENCHMARKS.md). */
static void topk_defaults(sm_router_config *c, const sm_router_given *g) {
    if (!g->given(g->user, "balance")) c->balance_coef = 0.01;
}

/* Switch: one expert per token */
static void switch_defaults(sm_router_config *c, const sm_router_given *g) {
    topk_defaults(c, g);
    if (!g->given(g->user, "topk")) c->k = 1;
}

static const sm_router_opt kTopkOpts[] = {SM_GROUP_ROUTER_OPT};

const sm_router_ops sm_router_topk_ops = {
    .name = "topk", .kind = SM_ROUTE_SPARSE, .declare = topk_declare, .bind = topk_bind,
    .max_assign = topk_max_assign, .reserve = topk_reserve, .forward = topk_forward,
    .backward = topk_backward, .destroy = topk_destroy, .defaults = topk_defaults,
    .opts = kTopkOpts, .n_opts = SM_LEN(kTopkOpts), .check = sm_group_router_check, .group_key = "group",
};

const sm_router_ops sm_router_switch_ops = {
    .name = "switch", .kind = SM_ROUTE_SPARSE, .declare = switch_declare, .bind = topk_bind,
    .max_assign = topk_max_assign, .reserve = topk_reserve, .forward = topk_forward,
    .backward = topk_backward, .destroy = topk_destroy, .defaults = switch_defaults,
    .opts = kTopkOpts, .n_opts = SM_LEN(kTopkOpts), .check = sm_group_router_check, .group_key = "group",
};
