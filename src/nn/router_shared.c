/* "ds": DeepSeekMoE's routing (Dai et al. 2024, Sec. 3.2): the first S experts are shared - every
 * token goes to them with weight 1 - and the other R = E - S are routed by a linear gate through the
 * shared softmax gate (gate.h: softmax / temperature, top-k, renorm, capacity, balance and z losses
 * over the R routed experts only):
 *
 *   logits = x Wg^T                                   (T,R)
 *   route(t) = {(s, 1) : s < S}  u  {(S + e, w_te) : e in topk_R(logits_t)}
 *
 * The MoE layer never knows: shared experts are routed experts that every token selects, so the
 * layer's experts, SPHERE's features (p = 1 for a shared expert) and the metrics work unchanged.
 * k is the number of ROUTED experts per token (S + k assignments per token).
 *
 * Letters: T tokens, d width, E experts, S shared, R = E - S routed, k routed per token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/gate.h"
#include "specmoe/core/ops.h"
#include "specmoe/nn/routers.h"

typedef struct {
    int iw;             /* parameter index of the gate (R,d) */
    sm_real *wg, *dwg;  /* (R,d) */
    sm_router_config gcfg; /* the gate's config: the router's with E = R (copied at each forward: live dials) */
    sm_gate gate;
    sm_route inner;     /* the route over the R routed experts */
    sm_real *logits;    /* (T,R); reused for dlogits */
    int *choice;        /* (T, S+k) outer choices, -1 for none */
    sm_real *w;         /* (T, S+k) their weights */
} ds_state;

static int n_shared(const sm_router *r) { return sm_ds_opts(&r->cfg)->ds_shared; }

static sm_status ds_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    ds_state *s = calloc(1, sizeof *s);
    if (!s) return sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
    r->state = s;
    s->iw = sm_router_declare_linear(ps, prefix, r->cfg.E - n_shared(r), r->d, err); /* the routed experts' gate */
    return s->iw < 0 ? SM_ERR_ARG : SM_OK;
}

static void ds_bind(sm_router *r, const sm_params *ps) {
    ds_state *s = r->state;
    s->wg = sm_params_data(ps, s->iw);
    s->dwg = sm_params_grad(ps, s->iw);
}

static int ds_max_assign(const sm_router *r, int T) { return T * (n_shared(r) + r->cfg.k); }

static sm_status ds_reserve(sm_router *r, int max_T, sm_error *err) {
    ds_state *s = r->state;
    const int S = n_shared(r), R = r->cfg.E - S, K = S + r->cfg.k;
    s->gcfg = r->cfg;
    s->gcfg.E = R;
    s->logits = malloc(sizeof(sm_real) * (size_t)max_T * R);
    s->w = malloc(sizeof(sm_real) * (size_t)max_T * K);
    s->choice = malloc(sizeof(int) * (size_t)max_T * K);
    if (!s->logits || !s->w || !s->choice) return sm_fail(err, SM_ERR_NOMEM, "router ds (%d tokens): out of memory", max_T);
    sm_status st = sm_route_alloc(&s->inner, SM_ROUTE_SPARSE, max_T, R, max_T * r->cfg.k, 0, err);
    return st != SM_OK ? st : sm_gate_init(&s->gate, &s->gcfg, max_T, err);
}

static void ds_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train) {
    (void)rng, (void)train;
    ds_state *s = r->state;
    const int S = n_shared(r), E = r->cfg.E, R = E - S, k = r->cfg.k, K = S + k, d = r->d;
    s->gcfg = r->cfg;
    s->gcfg.E = R;
    sm_linear_forward(s->logits, x, s->wg, NULL, T, d, R);
    sm_route *in = &s->inner;
    memset(in->dprobs, 0, sizeof(sm_real) * (size_t)T * R);
    sm_gate_forward(&s->gate, in, s->logits, T);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            s->choice[t * K + j] = j < S ? j : -1; /* routed slots: filled below unless dropped by capacity */
            s->w[t * K + j] = 1;
        }
    for (int e = 0; e < R; e++)
        for (int a = in->offset[e]; a < in->offset[e + 1]; a++) {
            const int t = in->token[a], j = S + in->slot[a];
            s->choice[t * K + j] = S + e;
            s->w[t * K + j] = in->weight[a];
        }
    sm_route_group(route, s->choice, s->w, T, K);
    /* outer assignments of expert S + e are the inner ones of e, in the same (token) order */
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < S; e++) route->probs[(size_t)t * E + e] = 1; /* a shared expert: always, fully */
        memcpy(route->probs + (size_t)t * E + S, in->probs + (size_t)t * R, sizeof(sm_real) * R);
    }
    route->dropped = in->dropped;
    route->aux_loss = in->aux_loss;
}

static void ds_backward(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T) {
    ds_state *s = r->state;
    const int S = n_shared(r), E = r->cfg.E, R = E - S, d = r->d;
    sm_route *in = &s->inner;
    /* the shared experts' weights are constants; the routed ones go back to the gate */
    for (int e = 0; e < R; e++) {
        const int a0 = route->offset[S + e];
        for (int a = in->offset[e]; a < in->offset[e + 1]; a++) in->dweight[a] = route->dweight[a0 + (a - in->offset[e])];
    }
    for (int t = 0; t < T; t++) memcpy(in->dprobs + (size_t)t * R, route->dprobs + (size_t)t * E + S, sizeof(sm_real) * R);
    sm_gate_backward(&s->gate, s->logits, in, T);
    sm_linear_backward(dx, s->dwg, NULL, s->logits, x, s->wg, T, d, R);
}

static void ds_destroy(sm_router *r) {
    ds_state *s = r->state;
    if (!s) return;
    free(s->logits), free(s->w), free(s->choice);
    sm_route_free(&s->inner);
    sm_gate_free(&s->gate);
    free(s);
    r->state = NULL;
}

static const char *ds_check(const sm_router_config *c, int d, char *buf, size_t n) {
    (void)d;
    const int S = sm_ds_opts(c)->ds_shared;
    if (S < 1) return "ds_shared must be >= 1 (with no shared expert use topk)";
    if (S + c->k > c->E) {
        snprintf(buf, n, "ds_shared + topk = %d + %d exceeds the %d experts (topk counts the routed experts only)", S, c->k, c->E);
        return buf;
    }
    return c->noisy ? "noisy gating is not supported by ds" : NULL;
}

static const sm_router_opt kDsOpts[] = {
    SM_ROUTER_OWN_OPT(sm_ds_router_opts, "ds_shared", NULL, SM_OPT_INT, ds_shared, "1",
                      "shared experts (the first ones): every token, weight 1; topk routes among the rest"),
};

const sm_router_ops sm_router_ds_ops = {
    .name = "ds", .kind = SM_ROUTE_SPARSE, .declare = ds_declare, .bind = ds_bind,
    .max_assign = ds_max_assign, .reserve = ds_reserve, .forward = ds_forward,
    .backward = ds_backward, .destroy = ds_destroy, .opts = kDsOpts, .n_opts = SM_LEN(kDsOpts), .check = ds_check,
};
