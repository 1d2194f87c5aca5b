/* SoftMoE router (Puigcerver et al. 2024), applied per group of tokens (one observation's tokens
 * in RL; the whole batch by default here). For a group of m tokens X (m,d) and S = E*p slots:
 *
 *   L = normalise(X) (scale * normalise(Phi))^T          (m,S)   [without --soft-norm: X Phi^T]
 *   D = softmax of L over the m tokens (per slot)        dispatch: slot inputs  X~ = D^T X
 *   C = softmax of L over the S slots  (per token)       combine:  outputs      Y  = C Y~
 * Slot s = e*p + j belongs to expert e. Phi is stored as (S,d) rows (one per slot), normalised along
 * d; scale is a learned scalar initialised at 1 (REFERENCE-NOTES, SoftMoE). The layer (moe.c) does
 * the dispatch/combine products; this file owns L and the two softmaxes.
 *
 * Letters: T tokens, d width, E experts, p slots per expert, S = E p, G groups of m tokens.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/nn/routers.h"
#include "specmoe/core/ops.h"
#include "specmoe/nn/router.h"
#include "core/vexp.h"

typedef struct {
    int iphi, iscale, p;
    sm_real *phi, *dphi;     /* (S,d) */
    sm_real *scale, *dscale; /* (1) */
    sm_real *xn, *xnorm;     /* (T,d), (T) */
    sm_real *phin, *phinorm; /* (S,d), (S) */
    sm_real *logits;         /* (T,S); reused for dlogits */
    sm_real *raw;            /* (T,S) Xn Phin^T before the scale (for dscale) */
    sm_real *colbuf;         /* (2 S) per-slot scratch: column maxima / sums, column dots */
    sm_real *dxn;            /* (T,d) */
    sm_real *dphin;          /* (S,d) */
    sm_real *block;          /* the allocation the arrays above are carved from */
} soft_state;

static int soft_slots(const sm_router *r) {
    if (sm_soft_opts(&r->cfg)->slots > 0) return sm_soft_opts(&r->cfg)->slots;
    return sm_soft_opts(&r->cfg)->soft_group > 0 ? (sm_soft_opts(&r->cfg)->soft_group + r->cfg.E - 1) / r->cfg.E : 0;
}

static sm_status soft_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    soft_state *s = calloc(1, sizeof *s);
    if (!s) return sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
    r->state = s;
    s->p = soft_slots(r);
    if (s->p < 1)
        return sm_fail(err, SM_ERR_ARG, "router soft: slots per expert must be given (--slots) when the group is the whole batch");
    char name[SM_NAME_MAX];
    int64_t shape[2] = {(int64_t)r->cfg.E * s->p, r->d}, one[1] = {1};
    snprintf(name, sizeof name, "%s.phi", prefix);
    /* LeCun-normal slot embeddings, as in the reference implementation */
    s->iphi = sm_params_add(ps, name, 2, shape, SM_INIT_NORMAL, r->d, 1.0 / sqrt((double)r->d), 0, err);
    if (s->iphi < 0) return SM_ERR_ARG;
    s->iscale = -1;
    if (sm_soft_opts(&r->cfg)->soft_norm) {
        snprintf(name, sizeof name, "%s.scale", prefix);
        s->iscale = sm_params_add(ps, name, 1, one, SM_INIT_ONE, 1, 0, SM_PARAM_NO_DECAY, err);
        if (s->iscale < 0) return SM_ERR_ARG;
    }
    return SM_OK;
}

static void soft_bind(sm_router *r, const sm_params *ps) {
    soft_state *s = r->state;
    s->phi = sm_params_data(ps, s->iphi);
    s->dphi = sm_params_grad(ps, s->iphi);
    if (s->iscale >= 0) {
        s->scale = sm_params_data(ps, s->iscale);
        s->dscale = sm_params_grad(ps, s->iscale);
    }
}

static int n_groups(const sm_router *r, int T) {
    int m = sm_soft_opts(&r->cfg)->soft_group > 0 ? sm_soft_opts(&r->cfg)->soft_group : T;
    return (T + m - 1) / m;
}

static int soft_max_assign(const sm_router *r, int T) { return r->cfg.E * soft_slots(r) * n_groups(r, T); }
static int soft_max_slots(const sm_router *r, int max_T) {
    (void)max_T;
    return soft_slots(r);
}

static sm_status soft_reserve(sm_router *r, int max_T, sm_error *err) {
    soft_state *s = r->state;
    size_t T = (size_t)max_T, d = (size_t)r->d, S = (size_t)r->cfg.E * s->p;
    size_t sizes[] = {T * d, T, S * d, S, T * S, T * S, 2 * S, T * d, S * d};
    sm_real **ptrs[] = {&s->xn, &s->xnorm, &s->phin, &s->phinorm, &s->logits, &s->raw, &s->colbuf, &s->dxn, &s->dphin};
    s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router soft (%d tokens)", max_T);
    return s->block ? SM_OK : SM_ERR_NOMEM;
}


/* The two softmaxes of one group's logits L (mg, S), rows contiguous. SoftMoE takes an exp per
 * logit twice - over the slots for the combine weights, over the tokens for the dispatch weights -
 * but both are ratios of exp(L - shift) for any shift, so one exp per logit serves both when a
 * single shift keeps every exp in float's normal range: the group's maximum M, when all of the
 * group's logits lie within 64 of it (exp(-64) = 1.6e-28). With normalised tokens and slots
 * (--soft-norm) the logits lie within 2 |scale| of each other, so this is the path taken unless the
 * learned scale passes 32. Otherwise each softmax subtracts its own maxima (rows, then columns).
 * The loops run along the rows (the slots), contiguous, so they vectorise; the float exp is
 * sm_expf_v (core/vexp.h, within 1 ulp of expf), built for AVX2 and the baseline ISA. */
#ifdef SPECMOE_DOUBLE
#define SOFT_EXP(x) exp(x)
#else
#define SOFT_EXP(x) sm_expf_v(x)
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define SOFT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SOFT_CLONES
#endif

/* y[j] = exp(x[j] - shift[j]) when per_col, else exp(x[j] - shift[0]) */
SOFT_CLONES static void soft_exp_row(sm_real *restrict y, const sm_real *restrict x, const sm_real *restrict shift,
                                     int per_col, int S) {
    if (per_col)
        for (int j = 0; j < S; j++) y[j] = SOFT_EXP(x[j] - shift[j]);
    else
        for (int j = 0; j < S; j++) y[j] = SOFT_EXP(x[j] - shift[0]);
}

SOFT_CLONES static void soft_add_product(sm_real *restrict acc, const sm_real *restrict a, const sm_real *restrict b,
                                         int S) {
    for (int j = 0; j < S; j++) acc[j] += a[j] * b[j];
}

SOFT_CLONES static void soft_add_softmax_grad(sm_real *restrict dl, const sm_real *restrict p,
                                              const sm_real *restrict dp, const sm_real *restrict dot, int S) {
    for (int j = 0; j < S; j++) dl[j] += p[j] * (dp[j] - dot[j]);
}

/* sum of x (S), in 8 interleaved partial sums (so the loop vectorises; the order is fixed) */
SOFT_CLONES static sm_real row_sum(const sm_real *restrict x, int S) {
    sm_real a[8] = {0};
    int j = 0;
    for (; j + 8 <= S; j += 8)
        for (int l = 0; l < 8; l++) a[l] += x[j + l];
    sm_real r = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    for (; j < S; j++) r += x[j];
    return r;
}

/* largest and smallest of x (n >= 1), 8 lanes at a time; a NaN in x may or may not show */
SOFT_CLONES static void min_max(const sm_real *restrict x, size_t n, sm_real *hi, sm_real *lo) {
    sm_real h[8], l[8];
    for (int k = 0; k < 8; k++) h[k] = l[k] = x[0];
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            h[k] = x[i + k] > h[k] ? x[i + k] : h[k];
            l[k] = x[i + k] < l[k] ? x[i + k] : l[k];
        }
    for (; i < n; i++) {
        h[0] = x[i] > h[0] ? x[i] : h[0];
        l[0] = x[i] < l[0] ? x[i] : l[0];
    }
    for (int k = 1; k < 8; k++) {
        h[0] = h[k] > h[0] ? h[k] : h[0];
        l[0] = l[k] < l[0] ? l[k] : l[0];
    }
    *hi = h[0];
    *lo = l[0];
}

static void scale_row(sm_real *y, const sm_real *x, sm_real by, int S) {
    for (int j = 0; j < S; j++) y[j] = x[j] * by;
}

/* C (mg,S) = softmax of L over each row; D (mg,S) = softmax of L over each column; cmax, csum (S) scratch */
static void soft_softmaxes(sm_real *C, sm_real *D, const sm_real *L, sm_real *cmax, sm_real *csum, int mg, int S) {
    const size_t n = (size_t)mg * S;
    sm_real hi, lo;
    min_max(L, n, &hi, &lo);
    for (int j = 0; j < S; j++) csum[j] = 0;
    if (hi - lo <= 64) { /* one exp per logit, E = exp(L - hi), kept in D */
        for (int t = 0; t < mg; t++) {
            sm_real *e = D + (size_t)t * S;
            soft_exp_row(e, L + (size_t)t * S, &hi, 0, S);
            scale_row(C + (size_t)t * S, e, 1 / row_sum(e, S), S);
            for (int j = 0; j < S; j++) csum[j] += e[j];
        }
    } else {
        for (int t = 0; t < mg; t++) { /* rows: their own maxima */
            const sm_real *l = L + (size_t)t * S;
            sm_real mx = l[0];
            for (int j = 1; j < S; j++) mx = l[j] > mx ? l[j] : mx;
            sm_real *c = C + (size_t)t * S;
            soft_exp_row(c, l, &mx, 0, S);
            scale_row(c, c, 1 / row_sum(c, S), S);
        }
        for (int j = 0; j < S; j++) cmax[j] = L[j];
        for (int t = 1; t < mg; t++)
            for (int j = 0; j < S; j++) cmax[j] = L[(size_t)t * S + j] > cmax[j] ? L[(size_t)t * S + j] : cmax[j];
        for (int t = 0; t < mg; t++) {
            sm_real *e = D + (size_t)t * S;
            soft_exp_row(e, L + (size_t)t * S, cmax, 1, S);
            for (int j = 0; j < S; j++) csum[j] += e[j];
        }
    }
    for (int j = 0; j < S; j++) csum[j] = 1 / csum[j];
    for (int t = 0; t < mg; t++)
        for (int j = 0; j < S; j++) D[(size_t)t * S + j] *= csum[j];
}

static void soft_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train) {
    (void)rng;
    (void)train;
    soft_state *s = r->state;
    const int E = r->cfg.E, d = r->d, p = s->p, S = E * p;
    const int m = sm_soft_opts(&r->cfg)->soft_group > 0 ? sm_soft_opts(&r->cfg)->soft_group : T, G = (T + m - 1) / m;
    const sm_real *xa = x, *pa = s->phi;
    sm_real sc = 1;
    if (sm_soft_opts(&r->cfg)->soft_norm) {
        sm_l2norm_forward(s->xn, s->xnorm, x, T, d);
        sm_l2norm_forward(s->phin, s->phinorm, s->phi, S, d);
        xa = s->xn;
        pa = s->phin;
        sc = s->scale[0];
    }
    sm_gemm(0, 1, T, S, d, 1, xa, d, pa, d, 0, s->raw, S); /* L (T,S) = sc * raw */
    for (size_t i = 0; i < (size_t)T * S; i++) s->logits[i] = sc * s->raw[i];
    for (int g = 0; g < G; g++) {
        const int t0 = g * m, mg = T - t0 < m ? T - t0 : m;
        soft_softmaxes(route->combine + (size_t)t0 * S, route->dispatch + (size_t)t0 * S, s->logits + (size_t)t0 * S,
                       s->colbuf, s->colbuf + S, mg, S);
    }
    /* routing probabilities for metrics: each token's combine mass per expert */
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            sm_real a = 0;
            for (int j = 0; j < p; j++) a += route->combine[(size_t)t * S + e * p + j];
            route->probs[(size_t)t * E + e] = a;
        }
    route->T = T;
    route->groups = G;
    route->group_size = m;
    route->slots = p;
    route->n_assign = E * G * p;
    for (int e = 0; e <= E; e++) route->offset[e] = e * G * p;
    for (int e = 0; e < E; e++) route->load[e] = G * p;
    route->dropped = 0;
    route->aux_loss = 0;
}

static void soft_backward(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T) {
    soft_state *s = r->state;
    const int E = r->cfg.E, d = r->d, p = s->p, S = E * p;
    const int m = route->group_size, G = route->groups;
    sm_real *dL = s->logits;
    /* probs_te = sum_j C_t,(e,j): outside losses on probs reach every slot of expert e */
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++)
            for (int j = 0; j < p; j++) route->dcombine[(size_t)t * S + e * p + j] += route->dprobs[(size_t)t * E + e];
    /* combine: row softmax backward */
    memset(dL, 0, sizeof(sm_real) * (size_t)T * S);
    sm_softmax_backward(dL, route->dcombine, route->combine, 1, T, S);
    /* dispatch: column softmax backward within each group: dL += D (dD - <D, dD>_column), the
     * column dots accumulated row by row (rows are contiguous, columns are not) */
    sm_real *dot = s->colbuf;
    for (int g = 0; g < G; g++) {
        const int t0 = g * m, mg = T - t0 < m ? T - t0 : m;
        const sm_real *D = route->dispatch + (size_t)t0 * S, *dD = route->ddispatch + (size_t)t0 * S;
        for (int j = 0; j < S; j++) dot[j] = 0;
        for (int t = 0; t < mg; t++) soft_add_product(dot, D + (size_t)t * S, dD + (size_t)t * S, S);
        for (int t = 0; t < mg; t++)
            soft_add_softmax_grad(dL + (size_t)(t0 + t) * S, D + (size_t)t * S, dD + (size_t)t * S, dot, S);
    }
    if (!sm_soft_opts(&r->cfg)->soft_norm) { /* L = X Phi^T */
        sm_gemm(0, 0, T, d, S, 1, dL, S, s->phi, d, 1, dx, d);
        sm_gemm(1, 0, S, d, T, 1, dL, S, x, d, 1, s->dphi, d);
        return;
    }
    /* L = sc Xn Phin^T: dsc = <dL, Xn Phin^T>; dXn = sc dL Phin; dPhin = sc dL^T Xn */
    sm_real sc = s->scale[0];
    sm_gemm(0, 0, T, d, S, sc, dL, S, s->phin, d, 0, s->dxn, d);
    sm_gemm(1, 0, S, d, T, sc, dL, S, s->xn, d, 0, s->dphin, d);
    double ds = 0;
    for (size_t i = 0; i < (size_t)T * S; i++) ds += (double)dL[i] * s->raw[i];
    s->dscale[0] += (sm_real)ds;
    sm_l2norm_backward(dx, s->dxn, s->xn, s->xnorm, T, d);
    sm_l2norm_backward(s->dphi, s->dphin, s->phin, s->phinorm, S, d);
}

static void soft_destroy(sm_router *r) {
    soft_state *s = r->state;
    if (!s) return;
    free(s->block);
    free(s);
    r->state = NULL;
}

static const sm_router_opt kSoftOpts[] = {
    SM_ROUTER_OWN_OPT(sm_soft_router_opts, "slots", NULL, SM_OPT_INT, slots, "0", "slots per expert (0 = group / E, or batch / E)"),
    SM_ROUTER_OWN_OPT(sm_soft_router_opts, "soft_group", NULL, SM_OPT_INT, soft_group, "0", "tokens per SoftMoE group (0 = the whole batch)"),
    SM_ROUTER_OWN_OPT(sm_soft_router_opts, "soft_norm", NULL, SM_OPT_BOOL, soft_norm, "1", "normalise tokens and slot parameters, learned scale"),
};

static const char *soft_check(const sm_router_config *c, int d, char *buf, size_t n) {
    (void)d, (void)buf, (void)n;
    const sm_soft_router_opts *o = sm_soft_opts(c);
    return o->slots < 0 || o->soft_group < 0 ? "soft slots and group size must be >= 0" : NULL;
}

/* one slot per expert and token of a training batch, fixed at training time so that evaluation at
 * another batch size keeps the trained slot count */
static void soft_defaults(sm_router_config *c, const sm_router_given *g) {
    if (!g->given(g->user, "topk")) c->k = 1;
    sm_soft_router_opts *o = sm_soft_opts(c);
    if (o->slots == 0 && o->soft_group == 0 && g->batch > 0) o->slots = (g->batch + c->E - 1) / (c->E > 0 ? c->E : 1);
}

const sm_router_ops sm_router_soft_ops = {
    .name = "soft", .kind = SM_ROUTE_SOFT, .declare = soft_declare, .bind = soft_bind,
    .max_assign = soft_max_assign, .max_slots = soft_max_slots, .reserve = soft_reserve,
    .forward = soft_forward, .backward = soft_backward, .destroy = soft_destroy,
    .opts = kSoftOpts, .n_opts = SM_LEN(kSoftOpts), .check = soft_check, .defaults = soft_defaults,
    .group_key = "soft_group",
};
