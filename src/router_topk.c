/* Token-choice softmax top-k router (Shazeer et al. 2017; Mixtral's gate).
 *
 *   logits = x Wg^T                                  (T,E)
 *   noisy:   logits += eps * softplus(x Wn^T),  eps ~ N(0,1), training only (Shazeer Eq. 4)
 *   p      = softmax(logits / temperature)           (T,E)
 *   S_t    = the k largest p (ties -> lower index);  w = p_S, renormalised to sum 1 if cfg.renorm
 *   capacity cf > 0: each expert keeps at most ceil(cf * T * k / E) assignments, tokens served in
 *   index order, choices in rank order; the rest are dropped (counted in route->dropped).
 *   k == E is the dense mixture (every expert, weights = p).
 *
 * Letters: T tokens, d width, E experts, k choices per token.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/ops.h"
#include "specmoe/router.h"

typedef struct {
    int iw, inw;        /* parameter indices: gate (E,d), noise gate (E,d) or -1 */
    sm_real *wg, *dwg;  /* (E,d) */
    sm_real *wn, *dwn;  /* (E,d) noise projection, NULL unless noisy */
    int max_T;
    sm_real *logits;    /* (T,E) noisy logits actually fed to the softmax */
    sm_real *npre;      /* (T,E) x Wn^T (noisy only) */
    sm_real *eps;       /* (T,E) the noise draw (noisy only) */
    int *choice;        /* (T,k) chosen expert per rank, -1 if dropped */
    sm_real *wsel;      /* (T,k) combine weights before capacity */
    sm_real *dbuf;      /* (T,E) gradient scratch */
    int *count;         /* (E) capacity counters */
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
    int E = r->cfg.E, k = r->cfg.k;
    s->max_T = max_T;
    s->logits = calloc((size_t)max_T * E, sizeof(sm_real));
    s->npre = calloc((size_t)max_T * E, sizeof(sm_real));
    s->eps = calloc((size_t)max_T * E, sizeof(sm_real));
    s->dbuf = calloc((size_t)max_T * E, sizeof(sm_real));
    s->choice = calloc((size_t)max_T * k, sizeof(int));
    s->wsel = calloc((size_t)max_T * k, sizeof(sm_real));
    s->count = calloc((size_t)E, sizeof(int));
    if (!s->logits || !s->npre || !s->eps || !s->dbuf || !s->choice || !s->wsel || !s->count)
        return sm_fail(err, SM_ERR_NOMEM, "router topk: out of memory for %d tokens", max_T);
    return SM_OK;
}

static sm_real softplus(sm_real x) { return x > 20 ? x : (sm_real)log1p(exp((double)x)); }
static sm_real sigmoid(sm_real x) { return (sm_real)(1.0 / (1.0 + exp(-(double)x))); }

/* Indices of the k largest of p (E values), larger first, ties to the lower index. */
static void topk_select(int *idx, const sm_real *p, int E, int k) {
    for (int j = 0; j < k; j++) idx[j] = -1;
    for (int e = 0; e < E; e++) {
        int pos = k;
        while (pos > 0 && (idx[pos - 1] < 0 || p[e] > p[idx[pos - 1]])) pos--;
        if (pos >= k) continue;
        for (int j = k - 1; j > pos; j--) idx[j] = idx[j - 1];
        idx[pos] = e;
    }
}

static void topk_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng,
                         int train) {
    topk_state *s = r->state;
    const sm_router_config *c = &r->cfg;
    int E = c->E, k = c->k, d = r->d;
    sm_linear_forward(s->logits, x, s->wg, NULL, T, d, E);
    s->used_noise = c->noisy && train && rng;
    if (s->used_noise) {
        sm_linear_forward(s->npre, x, s->wn, NULL, T, d, E);
        for (int i = 0; i < T * E; i++) {
            s->eps[i] = (sm_real)sm_rng_normal(rng);
            s->logits[i] += s->eps[i] * softplus(s->npre[i]);
        }
    }
    sm_softmax_forward(route->probs, s->logits, (sm_real)c->temperature, T, E);
    for (int t = 0; t < T; t++) {
        const sm_real *p = route->probs + (size_t)t * E;
        int *ch = s->choice + (size_t)t * k;
        sm_real *w = s->wsel + (size_t)t * k;
        topk_select(ch, p, E, k);
        sm_real sum = 0;
        for (int j = 0; j < k; j++) sum += p[ch[j]];
        for (int j = 0; j < k; j++) w[j] = c->renorm ? p[ch[j]] / sum : p[ch[j]];
    }
    route->dropped = 0;
    if (c->capacity > 0) {
        int cap = (int)ceil(c->capacity * (double)T * k / E);
        memset(s->count, 0, sizeof(int) * (size_t)E);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++) {
                int *e = &s->choice[(size_t)t * k + j];
                if (s->count[*e] >= cap) {
                    *e = -1 - *e; /* remember the expert as -1-e for the backward */
                    route->dropped++;
                } else {
                    s->count[*e]++;
                }
            }
    }
    /* sm_route_group skips negative choices, i.e. the dropped ones */
    sm_route_group(route, s->choice, s->wsel, T, k);
    route->aux_loss = 0;
}

static void topk_backward(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T) {
    topk_state *s = r->state;
    const sm_router_config *c = &r->cfg;
    int E = c->E, k = c->k, d = r->d;
    /* dw (T,k): gradient of each chosen weight; dropped choices got no output, so dw = 0 */
    sm_real *dw = s->wsel; /* reuse: the weights themselves are in route->weight */
    memset(dw, 0, sizeof(sm_real) * (size_t)T * k);
    for (int a = 0; a < route->n_assign; a++) dw[(size_t)route->token[a] * k + route->slot[a]] = route->dweight[a];
    /* dp (T,E) */
    sm_real *dp = s->dbuf;
    memset(dp, 0, sizeof(sm_real) * (size_t)T * E);
    for (int t = 0; t < T; t++) {
        const sm_real *p = route->probs + (size_t)t * E;
        const int *ch = s->choice + (size_t)t * k;
        const sm_real *g = dw + (size_t)t * k;
        sm_real *dpt = dp + (size_t)t * E;
        if (c->renorm) {
            /* w_j = p_j / S:  dL/dp_i = (dw_i - sum_j dw_j w_j) / S */
            sm_real S = 0, dot = 0;
            for (int j = 0; j < k; j++) S += p[ch[j] < 0 ? -1 - ch[j] : ch[j]];
            for (int j = 0; j < k; j++) dot += g[j] * p[ch[j] < 0 ? -1 - ch[j] : ch[j]] / S;
            for (int j = 0; j < k; j++) dpt[ch[j] < 0 ? -1 - ch[j] : ch[j]] += (g[j] - dot) / S;
        } else {
            for (int j = 0; j < k; j++)
                if (ch[j] >= 0) dpt[ch[j]] += g[j];
        }
    }
    /* dlogits (T,E) through the tempered softmax, written over the forward logits (no longer needed) */
    sm_real *dlog = s->logits;
    memset(dlog, 0, sizeof(sm_real) * (size_t)T * E);
    sm_softmax_backward(dlog, dp, route->probs, (sm_real)c->temperature, T, E);
    sm_linear_backward(dx, s->dwg, NULL, dlog, x, s->wg, T, d, E);
    if (s->used_noise) {
        /* logits += eps * softplus(npre):  dnpre = dlogits * eps * sigmoid(npre) */
        for (int i = 0; i < T * E; i++) dp[i] = dlog[i] * s->eps[i] * sigmoid(s->npre[i]);
        sm_linear_backward(dx, s->dwn, NULL, dp, x, s->wn, T, d, E);
    }
}

static void topk_destroy(sm_router *r) {
    topk_state *s = r->state;
    if (!s) return;
    free(s->logits);
    free(s->npre);
    free(s->eps);
    free(s->dbuf);
    free(s->choice);
    free(s->wsel);
    free(s->count);
    free(s);
    r->state = NULL;
}

const sm_router_ops sm_router_topk_ops = {
    .name = "topk",
    .declare = topk_declare,
    .bind = topk_bind,
    .max_assign = topk_max_assign,
    .reserve = topk_reserve,
    .forward = topk_forward,
    .backward = topk_backward,
    .destroy = topk_destroy,
};
