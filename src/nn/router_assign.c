/* Routers that assign without a per-token softmax choice:
 *
 * "expert-choice" (Zhou et al. 2022): S = softmax(x Wg^T / temperature) over experts (T,E); each
 *    expert takes its top-p tokens by S[:,e], p = ceil(cf * T / E) (cf = --capacity, 1 if 0), weight
 *    S[t,e]. A token may get several experts or none (counted in route->dropped).
 * "hash" (Roller et al. 2021): expert = FNV-1a hash of the token's input bytes mod E (for k > 1 the
 *    next k-1 experts too), weight 1/k; no parameters, no gradient to x.
 * "random": k distinct experts uniformly at random per token, weight 1/k. Training draws from the
 *    training RNG; evaluation seeds a generator per token from (--seed, the token's bytes) so it is
 *    reproducible.
 *
 * Letters: T tokens, d width, E experts, p tokens per expert.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/nn/routers.h"
#include "specmoe/core/ops.h"
#include "specmoe/nn/router.h"

/* ---------------------------------------------------------------------------------------------- */
/* expert choice */

typedef struct {
    int iw;
    sm_real *wg, *dwg; /* (E,d) */
    sm_real *logits;   /* (T,E); reused for dlogits */
    sm_real *dS;       /* (T,E) */
    sm_real *col;      /* (T) scratch: one expert's column of a group, contiguous */
    int *order;        /* (T) scratch for the per-expert selection */
    int *picked;       /* (T) experts per token in this batch */
    sm_real *block;    /* the allocations the arrays above are carved from: sm_real */
    int *iblock;       /* and int */
} ec_state;

/* tokens each expert picks from a group of T */
static int ec_tokens_per_expert(const sm_router *r, int T) {
    double cf = r->cfg.capacity > 0 ? r->cfg.capacity : 1.0;
    int p = (int)ceil(cf * T / r->cfg.E);
    return p < 1 ? 1 : p > T ? T : p;
}

/* tokens per group (the batch when no group is set) */
static int ec_group(const sm_router *r, int T) {
    int m = sm_group_opts(&r->cfg)->group;
    return m > 0 && m < T ? m : T;
}

static sm_status ec_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    ec_state *s = calloc(1, sizeof *s);
    if (!s) return sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
    r->state = s;
    char name[SM_NAME_MAX];
    int64_t shape[2] = {r->cfg.E, r->d};
    snprintf(name, sizeof name, "%s.weight", prefix);
    s->iw = sm_params_add(ps, name, 2, shape, SM_INIT_UNIFORM_FANIN, r->d, 0, 0, err);
    return s->iw < 0 ? SM_ERR_ARG : SM_OK;
}

static void ec_bind(sm_router *r, const sm_params *ps) {
    ec_state *s = r->state;
    s->wg = sm_params_data(ps, s->iw);
    s->dwg = sm_params_grad(ps, s->iw);
}

/* every full group gives each expert p(m); a shorter last group no more */
static int ec_max_assign(const sm_router *r, int T) {
    int m = ec_group(r, T), G = (T + m - 1) / m;
    return r->cfg.E * G * ec_tokens_per_expert(r, m);
}

static sm_status ec_reserve(sm_router *r, int max_T, sm_error *err) {
    ec_state *s = r->state;
    size_t sizes[] = {(size_t)max_T * r->cfg.E, (size_t)max_T * r->cfg.E, (size_t)max_T};
    sm_real **ptrs[] = {&s->logits, &s->dS, &s->col};
    size_t isizes[] = {(size_t)max_T, (size_t)max_T};
    int **iptrs[] = {&s->order, &s->picked};
    s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router expert-choice (%d tokens)", max_T);
    s->iblock = sm_carve_int(iptrs, isizes, SM_LEN(isizes), err, "router expert-choice (%d tokens)", max_T);
    return s->block && s->iblock ? SM_OK : SM_ERR_NOMEM;
}

/* The p best tokens of column e of S (T,E) - by value, ties to the lower index - into order[0..p) in
 * token order: token t is chosen when fewer than p tokens beat it. The column is copied out
 * contiguous first and the beats counted in two loops that vectorise; a selection sort that chased
 * the column's stride E per comparison took a quarter of ExpertChoice-4's DQN update (BENCHMARKS.md,
 * "Frames/s of every variant"). O(T^2) compares at T = one observation's tokens (64 on MinAtar). */
static void ec_select(int *order, sm_real *col, const sm_real *S, int E, int e, int T, int p) {
    if (p >= T) { /* every token (a single expert at capacity 1: ExpertChoice-1) */
        for (int t = 0; t < T; t++) order[t] = t;
        return;
    }
    for (int t = 0; t < T; t++) col[t] = S[(size_t)t * E + e];
    for (int t = 0, n = 0; t < T && n < p; t++) {
        const sm_real v = col[t];
        int beat = 0;
        for (int u = 0; u < T; u++) beat += col[u] > v;
        for (int u = 0; u < t; u++) beat += col[u] == v;
        if (beat < p) order[n++] = t;
    }
}

static void ec_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train) {
    (void)rng;
    (void)train;
    ec_state *s = r->state;
    const int E = r->cfg.E, d = r->d, m = ec_group(r, T);
    sm_linear_forward(s->logits, x, s->wg, NULL, T, d, E);
    sm_softmax_forward(route->probs, s->logits, (sm_real)r->cfg.temperature, T, E);
    memset(s->picked, 0, sizeof(int) * (size_t)T);
    int a = 0;
    for (int e = 0; e < E; e++) {
        route->offset[e] = a;
        /* within each group of m tokens (one observation's when grouped), the expert's top p */
        for (int t0 = 0; t0 < T; t0 += m) {
            const int mg = T - t0 < m ? T - t0 : m, p = ec_tokens_per_expert(r, mg);
            ec_select(s->order, s->col, route->probs + (size_t)t0 * E, E, e, mg, p);
            for (int i = 0; i < p; i++, a++) {
                int t = t0 + s->order[i];
                route->token[a] = t;
                route->slot[a] = 0;
                route->weight[a] = route->probs[(size_t)t * E + e];
                s->picked[t]++;
            }
        }
        route->load[e] = a - route->offset[e];
    }
    route->offset[E] = a;
    route->n_assign = a;
    route->T = T;
    route->dropped = 0;
    for (int t = 0; t < T; t++) route->dropped += s->picked[t] == 0; /* tokens no expert chose */
    route->aux_loss = 0;
}

static void ec_backward(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T) {
    ec_state *s = r->state;
    const int E = r->cfg.E, d = r->d;
    memcpy(s->dS, route->dprobs, sizeof(sm_real) * (size_t)T * E); /* outside losses on S */
    for (int e = 0; e < E; e++)
        for (int a = route->offset[e]; a < route->offset[e + 1]; a++)
            s->dS[(size_t)route->token[a] * E + e] += route->dweight[a];
    sm_real *dlog = s->logits;
    memset(dlog, 0, sizeof(sm_real) * (size_t)T * E);
    sm_softmax_backward(dlog, s->dS, route->probs, (sm_real)r->cfg.temperature, T, E);
    sm_linear_backward(dx, s->dwg, NULL, dlog, x, s->wg, T, d, E);
}

static void ec_destroy(sm_router *r) {
    ec_state *s = r->state;
    if (!s) return;
    free(s->block);
    free(s->iblock);
    free(s);
    r->state = NULL;
}

static const sm_router_opt kEcOpts[] = {SM_GROUP_ROUTER_OPT};

/* one token slot per expert choice by default */
static void ec_defaults(sm_router_config *c, const sm_router_given *g) {
    if (!g->given(g->user, "topk")) c->k = 1;
}

const sm_router_ops sm_router_expert_choice_ops = {
    .name = "expert-choice", .kind = SM_ROUTE_SPARSE, .declare = ec_declare, .bind = ec_bind,
    .max_assign = ec_max_assign, .reserve = ec_reserve, .forward = ec_forward, .backward = ec_backward,
    .destroy = ec_destroy, .defaults = ec_defaults, .opts = kEcOpts, .n_opts = SM_LEN(kEcOpts), .check = sm_group_router_check,
    .group_key = "group",
};

/* ---------------------------------------------------------------------------------------------- */
/* hash and random: parameter-free, weight 1/k, no gradient */

typedef struct {
    int *choice;    /* (T,k) */
    sm_real *w;     /* (T,k) */
    int *iblock;    /* the allocations choice and w are carved from */
    sm_real *block;
} fixed_state;

static uint64_t fnv1a(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static sm_status fixed_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    (void)ps;
    (void)prefix;
    r->state = calloc(1, sizeof(fixed_state));
    return r->state ? SM_OK : sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
}

static void fixed_bind(sm_router *r, const sm_params *ps) {
    (void)r;
    (void)ps;
}

static int fixed_max_assign(const sm_router *r, int T) { return T * r->cfg.k; }

static sm_status fixed_reserve(sm_router *r, int max_T, sm_error *err) {
    fixed_state *s = r->state;
    size_t sizes[] = {(size_t)max_T * r->cfg.k}; /* the same (T,k) table for both blocks */
    sm_real **ptrs[] = {&s->w};
    int **iptrs[] = {&s->choice};
    s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router %s (%d tokens)", r->cfg.name, max_T);
    s->iblock = sm_carve_int(iptrs, sizes, SM_LEN(sizes), err, "router %s (%d tokens)", r->cfg.name, max_T);
    return s->block && s->iblock ? SM_OK : SM_ERR_NOMEM;
}

/* k distinct experts for one token from a 64-bit stream */
static void pick_distinct(int *ch, int k, int E, sm_rng *g) {
    for (int j = 0; j < k; j++) {
        int e, dup;
        do {
            e = (int)sm_rng_below(g, (uint32_t)E);
            dup = 0;
            for (int i = 0; i < j; i++) dup |= ch[i] == e;
        } while (dup);
        ch[j] = e;
    }
}

static void fixed_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train) {
    fixed_state *s = r->state;
    const int E = r->cfg.E, k = r->cfg.k, d = r->d;
    const int is_hash = !strcmp(r->cfg.name, "hash");
    for (int t = 0; t < T; t++) {
        int *ch = s->choice + (size_t)t * k;
        sm_rng g;
        if (!is_hash && train && rng) {
            pick_distinct(ch, k, E, rng);
        } else {
            /* hash of the token's bytes (and the seed for "random"): the same token, the same experts */
            uint64_t h = fnv1a(x + (size_t)t * d, sizeof(sm_real) * d, 0xcbf29ce484222325ULL ^ (is_hash ? 0 : sm_random_opts(&r->cfg)->seed));
            sm_rng_seed(&g, h);
            if (is_hash) {
                ch[0] = (int)(h % (uint64_t)E);
                for (int j = 1; j < k; j++) ch[j] = (ch[0] + j) % E; /* the next k-1 experts */
            } else {
                pick_distinct(ch, k, E, &g);
            }
        }
        sm_real *p = route->probs + (size_t)t * E;
        for (int e = 0; e < E; e++) p[e] = 0;
        for (int j = 0; j < k; j++) {
            s->w[(size_t)t * k + j] = (sm_real)1 / (sm_real)k;
            p[ch[j]] = (sm_real)1 / (sm_real)k;
        }
    }
    sm_route_group(route, s->choice, s->w, T, k);
    route->dropped = 0;
    route->aux_loss = 0;
}

static void fixed_backward(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T) {
    (void)r; (void)dx; (void)route; (void)x; (void)T; /* constant routing: no gradient */
}

static void fixed_destroy(sm_router *r) {
    fixed_state *s = r->state;
    if (!s) return;
    free(s->block);
    free(s->iblock);
    free(s);
    r->state = NULL;
}

const sm_router_ops sm_router_hash_ops = {
    .name = "hash", .kind = SM_ROUTE_SPARSE, .declare = fixed_declare, .bind = fixed_bind,
    .max_assign = fixed_max_assign, .reserve = fixed_reserve, .forward = fixed_forward,
    .backward = fixed_backward, .destroy = fixed_destroy,
};

static const sm_router_opt kRandomOpts[] = {
    SM_ROUTER_OWN_OPT(sm_random_router_opts, "seed", "router-seed", SM_OPT_U64, seed, "1", "seed of the router at evaluation"),
};

const sm_router_ops sm_router_random_ops = {
    .name = "random", .kind = SM_ROUTE_SPARSE, .declare = fixed_declare, .bind = fixed_bind,
    .max_assign = fixed_max_assign, .reserve = fixed_reserve, .forward = fixed_forward,
    .backward = fixed_backward, .destroy = fixed_destroy, .opts = kRandomOpts, .n_opts = SM_LEN(kRandomOpts),
};
