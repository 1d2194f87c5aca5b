/* SoftMoE router (Puigcerver et al. 2024), applied per group of tokens (one observation's tokens
 * in RL; the whole batch by default here). For a group of m tokens X (m,d) and S = E*p slots:
 *
 *   L = normalise(X) (scale * normalise(Phi))^T / tau    (m,S)   [without --soft-norm: X Phi^T / tau]
 *   D = softmax of L over the m tokens (per slot)        dispatch: slot inputs  X~ = D^T X
 *   C = softmax of L over the S slots  (per token)       combine:  outputs      Y  = C Y~
 * Slot s = e*p + j belongs to expert e. Phi is stored as (S,d) rows (one per slot), normalised along
 * d; scale is a learned scalar initialised at 1 (REFERENCE-NOTES, SoftMoE). tau is the router
 * temperature every router reads (--temperature, 1 by default: Puigcerver et al. and Dopamine's
 * SoftMoE have none); below 1 it sharpens both softmaxes from the first update, where the learned
 * scale moves by about the learning rate per update. The layer (moe.c) does the dispatch/combine
 * products; this file owns L and the two softmaxes.
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
    sm_real *logits;         /* (m,S) one group's logits; reused for its dlogits */
    sm_real *phint;          /* (d,S) the slot rows the logits read, transposed */
    sm_real *colbuf;         /* (2 S) per-slot scratch: column maxima / sums, column dots */
    sm_real *dxn;            /* (T,d) */
    sm_real *dphin;          /* (S,d) */
    sm_real *block;          /* the allocation the arrays above are carved from */
    sm_real *slot_on;        /* (S) 1 for the slots of active experts, 0 for pruned ones; NULL: none pruned */
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
    const int g = sm_soft_opts(&r->cfg)->soft_group;
    size_t m = g > 0 && (size_t)g < T ? (size_t)g : T; /* the largest group */
    size_t sizes[] = {T * d, T, S * d, S, m * S, d * S, 2 * S, T * d, S * d};
    sm_real **ptrs[] = {&s->xn, &s->xnorm, &s->phin, &s->phinorm, &s->logits, &s->phint, &s->colbuf, &s->dxn, &s->dphin};
    s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router soft (%d tokens)", max_T);
    return s->block ? SM_OK : SM_ERR_NOMEM;
}


/* The two softmaxes of one group's logits L (mg, S), rows contiguous. SoftMoE takes an exp per
 * logit twice - over the slots for the combine weights, over the tokens for the dispatch weights -
 * but both are ratios of exp(L - shift) for any shift, so one exp per logit serves both when a
 * single shift keeps every exp in float's normal range: the group's maximum M, when all of the
 * group's logits lie within 64 of it (exp(-64) = 1.6e-28). With normalised tokens and slots
 * (--soft-norm) the logits lie within 2 |scale| / tau of each other, so this is the path taken unless
 * the learned scale passes 32 tau. Otherwise each softmax subtracts its own maxima (rows, then columns).
 * The loops run along the rows (the slots), contiguous, so they vectorise; the float exp is
 * sm_expf_v (core/vexp.h, within 2 ulp of expf), built for AVX-512, AVX2 and the baseline ISA (the same
 * bits in each: separate IEEE multiplies and adds, no contraction). */
#ifdef SPECMOE_DOUBLE
#define SOFT_EXP(x) exp(x)
#else
#define SOFT_EXP(x) sm_expf_v(x)
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define SOFT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SOFT_CLONES
#endif

/* The helpers are inlined into the two group functions below, which are built per ISA. */
#define SOFT_INLINE static inline __attribute__((always_inline))

/* y[j] = exp(x[j] - shift[j]) when per_col, else exp(x[j] - shift[0]), j < n */
SOFT_INLINE void exp_row(sm_real *restrict y, const sm_real *restrict x, const sm_real *restrict shift, int per_col,
                         size_t n) {
    if (per_col)
        for (size_t j = 0; j < n; j++) y[j] = SOFT_EXP(x[j] - shift[j]);
    else {
        const sm_real sh = shift[0];
        for (size_t j = 0; j < n; j++) y[j] = SOFT_EXP(x[j] - sh);
    }
}

/* sum of x[j] * (y ? y[j] : 1) over j < S, in 8 interleaved partial sums (so the loop vectorises;
 * the order is fixed) */
SOFT_INLINE sm_real row_dot(const sm_real *restrict x, const sm_real *restrict y, int S) {
    sm_real a[8] = {0};
    int j = 0;
    for (; j + 8 <= S; j += 8)
        for (int l = 0; l < 8; l++) a[l] += x[j + l] * (y ? y[j + l] : 1);
    sm_real r = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    for (; j < S; j++) r += x[j] * (y ? y[j] : 1);
    return r;
}

/* largest and smallest of x (n >= 1), 8 lanes at a time; a NaN in x may or may not show. The lanes
 * are GCC vectors with the selects spelled out as masks: written on 8-element arrays, the ternaries
 * compiled to scalar vmaxss/vminss (`perf`: the pass was a sixth of soft_softmaxes' samples). */
#ifdef SPECMOE_DOUBLE
typedef long long soft_lane_int;
#else
typedef int soft_lane_int;
#endif
typedef sm_real soft_vec __attribute__((vector_size(8 * sizeof(sm_real))));
typedef soft_lane_int soft_ivec __attribute__((vector_size(8 * sizeof(sm_real))));
SOFT_INLINE void min_max(const sm_real *restrict x, size_t n, sm_real *hi, sm_real *lo) {
    soft_vec h, l;
    for (int k = 0; k < 8; k++) h[k] = l[k] = x[0];
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        soft_vec v;
        memcpy(&v, x + i, sizeof v);
        const soft_ivec gt = v > h, lt = v < l;
        h = (soft_vec)(((soft_ivec)v & gt) | ((soft_ivec)h & ~gt));
        l = (soft_vec)(((soft_ivec)v & lt) | ((soft_ivec)l & ~lt));
    }
    sm_real H = h[0], L = l[0];
    for (int k = 1; k < 8; k++) {
        H = h[k] > H ? h[k] : H;
        L = l[k] < L ? l[k] : L;
    }
    for (; i < n; i++) {
        H = x[i] > H ? x[i] : H;
        L = x[i] < L ? x[i] : L;
    }
    *hi = H;
    *lo = L;
}

/* sum of x[j] over j < n, in the order of row_dot; not inlined into a target clone, so it is built
 * for the baseline ISA only (its rows are p = 16 wide) */
static sm_real soft_sum(const sm_real *restrict x, int n) { return row_dot(x, NULL, n); }

/* C (mg,S) = softmax of L over each row; D (mg,S) = softmax of L over each column; cmax, csum (S)
 * scratch. With on (S) given, each row's softmax runs over the slots with on = 1 only (the others,
 * a pruned expert's, get C = 0); D is computed for every slot (a pruned slot's output is unused). */
SOFT_CLONES static void soft_softmaxes(sm_real *restrict C, sm_real *restrict D, const sm_real *restrict L,
                                       sm_real *restrict cmax, sm_real *restrict csum, const sm_real *restrict on, int mg,
                                       int S) {
    const size_t n = (size_t)mg * S;
    sm_real hi, lo;
    min_max(L, n, &hi, &lo);
    for (int j = 0; j < S; j++) csum[j] = 0;
    if (hi - lo <= 64) { /* one exp per logit, E = exp(L - hi), kept in D */
        exp_row(D, L, &hi, 0, n); /* the whole group in one loop: its rows are S = 64 short */
        for (int t = 0; t < mg; t++) {
            sm_real *e = D + (size_t)t * S, *c = C + (size_t)t * S;
            const sm_real by = 1 / row_dot(e, on, S);
            for (int j = 0; j < S; j++) {
                c[j] = e[j] * (on ? on[j] * by : by);
                csum[j] += e[j];
            }
        }
    } else {
        for (int t = 0; t < mg; t++) { /* rows: their own maxima */
            const sm_real *l = L + (size_t)t * S;
            sm_real mx, mn;
            min_max(l, S, &mx, &mn);
            sm_real *c = C + (size_t)t * S;
            exp_row(c, l, &mx, 0, S); /* a pruned slot may hold the maximum: still a valid shift */
            const sm_real by = 1 / row_dot(c, on, S);
            for (int j = 0; j < S; j++) c[j] *= on ? on[j] * by : by;
        }
        for (int j = 0; j < S; j++) cmax[j] = L[j];
        for (int t = 1; t < mg; t++)
            for (int j = 0; j < S; j++) cmax[j] = L[(size_t)t * S + j] > cmax[j] ? L[(size_t)t * S + j] : cmax[j];
        for (int t = 0; t < mg; t++) {
            sm_real *e = D + (size_t)t * S;
            exp_row(e, L + (size_t)t * S, cmax, 1, S);
            for (int j = 0; j < S; j++) csum[j] += e[j];
        }
    }
    for (int j = 0; j < S; j++) csum[j] = 1 / csum[j];
    for (int t = 0; t < mg; t++)
        for (int j = 0; j < S; j++) D[(size_t)t * S + j] *= csum[j];
}

/* Both softmaxes backward for one group: dL = C (dC - <C, dC>_row) + D (dD - <D, dD>_column), the
 * column dots accumulated row by row (rows are contiguous, columns are not); dot (S) scratch */
SOFT_CLONES static void soft_softmaxes_backward(sm_real *restrict dL, const sm_real *restrict C,
                                                const sm_real *restrict dC, const sm_real *restrict D,
                                                const sm_real *restrict dD, sm_real *restrict dot, int mg, int S) {
    for (int j = 0; j < S; j++) dot[j] = 0;
    for (int t = 0; t < mg; t++) {
        const size_t o = (size_t)t * S;
        for (int j = 0; j < S; j++) dot[j] += D[o + j] * dD[o + j];
    }
    for (int t = 0; t < mg; t++) {
        const size_t o = (size_t)t * S;
        const sm_real rd = row_dot(C + o, dC + o, S);
        for (int j = 0; j < S; j++) dL[o + j] = C[o + j] * (dC[o + j] - rd) + D[o + j] * (dD[o + j] - dot[j]);
    }
}

/* Per group, the logits product, both softmaxes and the routing probabilities run one after the
 * other on the group's (mg, S) logits while they sit in L1 (16 KB for a MinAtar frame's 64 tokens
 * and 64 slots). The products go through sm_gemm_tiny: with K = d = 16 (forward) or S (backward)
 * and a few dozen rows per call, OpenBLAS spent more on packing and zeroing than on arithmetic
 * (BENCHMARKS.md, "SoftMoE in the DQN update"). The learned scale is the product's alpha, so the
 * unscaled Xn Phin^T is never stored: the backward gets dscale from the slot-side product instead. */
static void soft_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train) {
    (void)rng;
    (void)train;
    soft_state *s = r->state;
    const int E = r->cfg.E, d = r->d, p = s->p, S = E * p;
    const int m = sm_soft_opts(&r->cfg)->soft_group > 0 ? sm_soft_opts(&r->cfg)->soft_group : T, G = (T + m - 1) / m;
    const sm_real *xa = x, *pa = s->phi;
    sm_real sc = (sm_real)(1.0 / r->cfg.temperature);
    if (sm_soft_opts(&r->cfg)->soft_norm) {
        sm_l2norm_forward(s->xn, s->xnorm, x, T, d);
        sm_l2norm_forward(s->phin, s->phinorm, s->phi, S, d);
        xa = s->xn;
        pa = s->phin;
        sc = (sm_real)(s->scale[0] / r->cfg.temperature);
    }
    for (int j = 0; j < S; j++) /* Pa^T (d,S): B of the logits product, rows contiguous */
        for (int k = 0; k < d; k++) s->phint[(size_t)k * S + j] = pa[(size_t)j * d + k];
    sm_real *L = s->logits;
    for (int g = 0; g < G; g++) {
        const int t0 = g * m, mg = T - t0 < m ? T - t0 : m;
        sm_real *C = route->combine + (size_t)t0 * S;
        sm_gemm_tiny(mg, S, d, sc, xa + (size_t)t0 * d, d, 1, s->phint, S, 0, L, S); /* L = sc Xa Pa^T */
        soft_softmaxes(C, route->dispatch + (size_t)t0 * S, L, s->colbuf, s->colbuf + S, s->slot_on, mg, S);
        /* routing probabilities for metrics: each token's combine mass per expert */
        for (int t = 0; t < mg; t++)
            for (int e = 0; e < E; e++) route->probs[(size_t)(t0 + t) * E + e] = soft_sum(C + (size_t)t * S + e * p, p);
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
    const int m = route->group_size, G = route->groups, norm = sm_soft_opts(&r->cfg)->soft_norm;
    sm_real *dL = s->logits;
    /* probs_te = sum_j C_t,(e,j): outside losses on probs reach every slot of expert e (most updates
     * have none: the DQN's, so the T S additions of zero are skipped) */
    int any = 0;
    for (size_t i = 0; i < (size_t)T * E; i++) any |= route->dprobs[i] != 0;
    for (int t = 0; t < T && any; t++)
        for (int e = 0; e < E; e++)
            for (int j = 0; j < p; j++) route->dcombine[(size_t)t * S + e * p + j] += route->dprobs[(size_t)t * E + e];
    /* L = sc Xa Pa^T, sc = scale / tau (without --soft-norm: X Phi^T, sc = 1 / tau): dXa = sc dL Pa,
     * dPa = sc dL^T Xa, and with the norm dscale = <dL, Xa Pa^T> / tau = <dL^T Xa, Pa> / tau, the same
     * sum regrouped over S d terms instead of T S. The norm's dXn (dPhin) are scratch, overwritten
     * (accumulated over the groups unscaled, then scaled); without it the gradients add into dx and
     * dphi. */
    const double inv_tau = 1.0 / r->cfg.temperature;
    const sm_real *xa = norm ? s->xn : x, *pa = norm ? s->phin : s->phi;
    const sm_real sc = (sm_real)((norm ? s->scale[0] : 1) * inv_tau);
    sm_real *dxa = norm ? s->dxn : dx, *dpa = norm ? s->dphin : s->dphi;
    for (int g = 0; g < G; g++) {
        const int t0 = g * m, mg = T - t0 < m ? T - t0 : m;
        const size_t o = (size_t)t0 * S;
        soft_softmaxes_backward(dL, route->combine + o, route->dcombine + o, route->dispatch + o, route->ddispatch + o,
                                s->colbuf, mg, S);
        sm_gemm_tiny(mg, d, S, sc, dL, S, 1, pa, d, norm ? 0 : 1, dxa + (size_t)t0 * d, d);
        sm_gemm_tiny(S, d, mg, norm ? 1 : sc, dL, 1, S, xa + (size_t)t0 * d, d, norm && g == 0 ? 0 : 1, dpa, d);
    }
    if (!norm) return;
    if (G == 0) memset(s->dphin, 0, sizeof(sm_real) * (size_t)S * d);
    double ds = 0;
    for (size_t i = 0; i < (size_t)S * d; i++) ds += (double)s->dphin[i] * s->phin[i];
    s->dscale[0] += (sm_real)(ds * inv_tau);
    for (size_t i = 0; i < (size_t)S * d; i++) s->dphin[i] *= sc;
    sm_l2norm_backward(dx, s->dxn, s->xn, s->xnorm, T, d);
    sm_l2norm_backward(s->dphi, s->dphin, s->phin, s->phinorm, S, d);
}

/* pruned experts' slots get no combine weight (see soft_softmaxes) */
static int soft_set_active(sm_router *r, const unsigned char *on) {
    soft_state *s = r->state;
    int all = 1;
    for (int e = 0; e < r->cfg.E; e++) all &= on[e] != 0;
    if (all) {
        free(s->slot_on);
        s->slot_on = NULL;
        return 0;
    }
    if (!s->slot_on) s->slot_on = malloc(sizeof(sm_real) * (size_t)r->cfg.E * s->p);
    if (!s->slot_on) return -1;
    for (int e = 0; e < r->cfg.E; e++)
        for (int j = 0; j < s->p; j++) s->slot_on[e * s->p + j] = on[e] ? 1 : 0;
    return 0;
}

static void soft_destroy(sm_router *r) {
    soft_state *s = r->state;
    if (!s) return;
    free(s->slot_on);
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
    .group_key = "soft_group", .set_active = soft_set_active,
};
