/* SSMoE eigenvector router "ev" (papers/001, Eq. 5, Alg. 1): training-free routing from the experts'
 * own weights, mixed with the learned router:
 *
 *   p_r  = softmax(x W_r^T / temperature)        the learned router (weight as in "topk")
 *   p_ev = softmax(x Dbar^T)                     Dbar_e = mean of expert e's m descriptors (no temperature)
 *   P    = alpha p_ev + (1 - alpha) p_r          top-k on P, renormalised where the model renormalises
 *
 * The descriptors (ssmoe.h) are built once from a trained model by sm_model_build_ev and stored as the
 * frozen parameter "ev" (E, m, d), so a checkpoint caches them. The router is not trained: its
 * backward passes no gradient (specmoe train refuses it).
 *
 * Letters: T tokens, d width, E experts, m descriptors per expert (2 for two-layer experts).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/gate.h"
#include "specmoe/methods/ssmoe/ssmoe.h"
#include "specmoe/core/ops.h"

#define EV_M 2 /* descriptors per two-layer expert: W1 as stored, W2 transposed */

typedef struct {
    int iw, iev;
    sm_real *w;     /* (E,d) learned router */
    sm_real *ev;    /* (E,m,d) descriptors */
    sm_gate gate;
    sm_real *dbar;  /* (E,d) mean descriptor per expert */
    sm_real *lr;    /* (T,E) router logits, then p_r */
    sm_real *lev;   /* (T,E) EV logits, then p_ev, then the mixture's log for the gate */
    int *rtop;      /* (k) the learned router's own top-k for one token */
    sm_real *block; /* the allocations the arrays above are carved from: sm_real */
    int *iblock;    /* and int (rtop) */
    long agree, chosen; /* SSMoE App. D.6: the gate's picks on P that p_r's top-k shares, and all picks */
} ev_state;

static sm_status ev_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    ev_state *s = calloc(1, sizeof *s);
    if (!s) return sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
    r->state = s;
    char name[SM_NAME_MAX];
    int64_t sw[2] = {r->cfg.E, r->d}, sev[3] = {r->cfg.E, EV_M, r->d};
    snprintf(name, sizeof name, "%s.weight", prefix);
    s->iw = sm_params_add(ps, name, 2, sw, SM_INIT_UNIFORM_FANIN, r->d, 0, SM_PARAM_FROZEN, err);
    if (s->iw < 0) return SM_ERR_ARG;
    snprintf(name, sizeof name, "%s.ev", prefix);
    s->iev = sm_params_add(ps, name, 3, sev, SM_INIT_ZERO, r->d, 0, SM_PARAM_FROZEN | SM_PARAM_NO_DECAY, err);
    return s->iev < 0 ? SM_ERR_ARG : SM_OK;
}

static void ev_bind(sm_router *r, const sm_params *ps) {
    ev_state *s = r->state;
    s->w = sm_params_data(ps, s->iw);
    s->ev = sm_params_data(ps, s->iev);
}

static int ev_max_assign(const sm_router *r, int T) { return T * r->cfg.k; }

static sm_status ev_reserve(sm_router *r, int max_T, sm_error *err) {
    ev_state *s = r->state;
    size_t n = (size_t)max_T * r->cfg.E;
    size_t sizes[] = {(size_t)r->cfg.E * r->d, n, n}, isizes[] = {(size_t)r->cfg.k};
    sm_real **ptrs[] = {&s->dbar, &s->lr, &s->lev};
    int **iptrs[] = {&s->rtop};
    s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router ev (%d tokens)", max_T);
    s->iblock = sm_carve_int(iptrs, isizes, SM_LEN(isizes), err, "router ev (%d tokens)", max_T);
    if (!s->block || !s->iblock) return SM_ERR_NOMEM;
    return sm_gate_init(&s->gate, &r->cfg, max_T, err);
}

static void ev_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train) {
    (void)rng;
    (void)train;
    ev_state *s = r->state;
    const int E = r->cfg.E, d = r->d;
    const double a = sm_ev_opts(&r->cfg)->alpha, temp = r->cfg.temperature;
    for (int e = 0; e < E; e++) /* EV logit = mean over the expert's descriptors of x . C */
        for (int i = 0; i < d; i++) {
            sm_real acc = 0;
            for (int j = 0; j < EV_M; j++) acc += s->ev[((size_t)e * EV_M + j) * d + i];
            s->dbar[(size_t)e * d + i] = acc / EV_M;
        }
    sm_linear_forward(s->lr, x, s->w, NULL, T, d, E);
    sm_softmax_forward(s->lr, s->lr, (sm_real)temp, T, E);
    sm_linear_forward(s->lev, x, s->dbar, NULL, T, d, E);
    sm_softmax_forward(s->lev, s->lev, 1, T, E);
    /* the gate applies softmax(l / temperature): l = temperature * log P gives back P exactly */
    for (size_t i = 0; i < (size_t)T * E; i++) {
        double P = a * s->lev[i] + (1 - a) * s->lr[i];
        s->lev[i] = (sm_real)(temp * log(P > 1e-300 ? P : 1e-300));
    }
    sm_gate_forward(&s->gate, route, s->lev, T);
    /* App. D.6: how many of the gate's picks (top-k on P) p_r's own top-k also makes */
    const int k = r->cfg.k;
    for (int t = 0; t < T; t++) {
        sm_gate_topk(s->rtop, s->lr + (size_t)t * E, E, k);
        for (int j = 0; j < k; j++)
            for (int q = 0; q < k; q++) s->agree += sm_gate_expert(s->gate.choice[(size_t)t * k + j]) == s->rtop[q];
        s->chosen += k;
    }
}

static void ev_backward(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T) {
    (void)r; (void)dx; (void)route; (void)x; (void)T; /* training-free: no gradient */
}

static void ev_destroy(sm_router *r) {
    ev_state *s = r->state;
    if (!s) return;
    sm_gate_free(&s->gate);
    free(s->block);
    free(s->iblock);
    free(s);
    r->state = NULL;
}

extern const sm_router_ops sm_router_ev_ops;

double sm_ev_router_take_overlap(sm_router *r) {
    if (!r || r->ops != &sm_router_ev_ops || !r->state) return NAN;
    ev_state *s = r->state;
    double v = s->chosen ? (double)s->agree / (double)s->chosen : NAN;
    s->agree = s->chosen = 0;
    return v;
}

static const sm_router_opt kEvOpts[] = {
    SM_ROUTER_OWN_OPT(sm_ev_router_opts, "alpha", NULL, SM_OPT_NUM, alpha, "0.5", "weight of the EV router in the mix"),
    SM_ROUTER_OWN_OPT(sm_ev_router_opts, "ev_c", NULL, SM_OPT_INT, ev_c, "5", "right singular vectors averaged per descriptor"),
    SM_ROUTER_OWN_OPT(sm_ev_router_opts, "ev_avg", NULL, SM_OPT_BOOL, ev_avg, "0", "router-free averaged-EV descriptors"),
};

/* the mix weight and the descriptor variant: the descriptors are (re)built from the experts at load */
static const char *const kEvDials[] = {"alpha", "ev_c", "ev_avg", NULL};

static const char *ev_check(const sm_router_config *cfg, int d, char *buf, size_t n) {
    (void)d, (void)buf, (void)n;
    const sm_ev_router_opts *c = sm_ev_opts(cfg);
    if (!(c->alpha >= 0)) return "alpha (the sparsity dial) must be >= 0";
    if (c->ev_c < 1 || c->alpha > 1) return "ev needs c >= 1 and a mixing alpha in [0, 1]";
    return NULL;
}

const sm_router_ops sm_router_ev_ops = {
    .name = "ev", .kind = SM_ROUTE_SPARSE, .declare = ev_declare, .bind = ev_bind,
    .max_assign = ev_max_assign, .reserve = ev_reserve, .forward = ev_forward,
    .backward = ev_backward, .destroy = ev_destroy, .opts = kEvOpts, .n_opts = SM_LEN(kEvOpts),
    .check = ev_check, .built_from = "a trained topk model", .dials = kEvDials,
};
