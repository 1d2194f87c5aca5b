/* The router interface. The MoE layer (moe.h) sees only this: a router turns token features x (T,d)
 * into an sm_route - (token, expert, weight) assignments grouped by expert - and, in its backward,
 * turns the gradient w.r.t. each assignment's combine weight into gradients w.r.t. x and its own
 * parameters. Adding a router means adding one file that fills an sm_router_ops table and one line
 * in the registry (router.c); the layer is not touched.
 *
 * Letters: T tokens, d token width, E experts, k experts per token, A assignments (<= max_assign).
 */
#ifndef SPECMOE_ROUTER_H
#define SPECMOE_ROUTER_H

#include "specmoe/core.h"
#include "specmoe/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of every router, set from flags. A router reads the fields it understands. */
typedef struct {
    char name[32];       /* "topk", ... (sm_router_names lists them) */
    int E;               /* experts */
    int k;               /* experts per token; k == E gives the dense mixture */
    double temperature;  /* softmax temperature (> 0) */
    int noisy;           /* Shazeer noisy top-k gating: + N(0,1) * softplus(x W_noise) at train time */
    int renorm;          /* renormalise the k selected weights to sum to 1 */
    double capacity;     /* capacity factor; 0 = unlimited. capacity = ceil(cf * T * k / E) */
} sm_router_config;

void sm_router_config_default(sm_router_config *c);

/* One routing decision for a batch. Buffers are sized once for the largest batch (max_T). */
typedef struct {
    int T, E;
    int n_assign;       /* assignments kept in this batch */
    int *offset;        /* (E+1) assignments of expert e are [offset[e], offset[e+1]) */
    int *token;         /* (A) token of each assignment, grouped by expert, token order within */
    int *slot;          /* (A) rank of the expert among the token's choices (0 = first) */
    sm_real *weight;    /* (A) combine weight */
    sm_real *dweight;   /* (A) dLoss/dweight, written by the layer before router backward */
    sm_real *probs;     /* (T,E) routing probabilities (after temperature), for metrics */
    int *load;          /* (E) kept assignments per expert */
    long dropped;       /* assignments dropped by the capacity limit in this batch */
    double aux_loss;    /* auxiliary loss the router adds to the objective (0 if none) */
} sm_route;

typedef struct sm_router sm_router;

typedef struct {
    const char *name;
    /* Declares the router's parameters under prefix (e.g. "layers.1.router"). */
    sm_status (*declare)(sm_router *r, sm_params *ps, const char *prefix, sm_error *err);
    /* Takes pointers into the allocated parameter table. */
    void (*bind)(sm_router *r, const sm_params *ps);
    /* Upper bound on assignments for a batch of T tokens. */
    int (*max_assign)(const sm_router *r, int T);
    /* Allocates per-batch scratch for up to max_T tokens. */
    sm_status (*reserve)(sm_router *r, int max_T, sm_error *err);
    /* x (T,d) -> route. rng is used only when train != 0 and the router is stochastic. */
    void (*forward)(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train);
    /* dx (T,d) += ..., parameter gradients += ..., from route->dweight and the aux loss weight. */
    void (*backward)(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T);
    void (*destroy)(sm_router *r);
} sm_router_ops;

struct sm_router {
    const sm_router_ops *ops;
    sm_router_config cfg;
    int d;        /* token width */
    void *state;  /* router-specific */
};

/* Creates the router named cfg->name for tokens of width d; validates cfg (k <= E, T > 0, ...). */
sm_router *sm_router_create(const sm_router_config *cfg, int d, sm_error *err);
void sm_router_free(sm_router *r);
/* Comma-separated list of registered router names. */
const char *sm_router_names(void);

sm_status sm_route_alloc(sm_route *route, int max_T, int E, int max_assign, sm_error *err);
void sm_route_free(sm_route *route);
/* Groups per-token choices into the expert-major layout: choice (T,k) expert ids (-1 = dropped
 * or unused), w (T,k) weights. Fills offset/token/slot/weight/load. Stable in token order. */
void sm_route_group(sm_route *route, const int *choice, const sm_real *w, int T, int k);

#ifdef __cplusplus
}
#endif
#endif
