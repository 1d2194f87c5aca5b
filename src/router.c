/* Router registry and the route (assignment) buffers shared by every router. */
#include "specmoe/router.h"

#include <stdlib.h>
#include <string.h>

/* Each router file exports its ops table; adding a router = one line here. */
extern const sm_router_ops sm_router_topk_ops;

static const sm_router_ops *const kRouters[] = {
    &sm_router_topk_ops,
};
#define N_ROUTERS (sizeof kRouters / sizeof kRouters[0])

void sm_router_config_default(sm_router_config *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->name, "topk");
    c->E = 8;
    c->k = 2;
    c->temperature = 1.0;
    c->renorm = 1;
}

const char *sm_router_names(void) { return "topk"; }

sm_router *sm_router_create(const sm_router_config *cfg, int d, sm_error *err) {
    const sm_router_ops *ops = NULL;
    for (size_t i = 0; i < N_ROUTERS; i++)
        if (strcmp(kRouters[i]->name, cfg->name) == 0) ops = kRouters[i];
    if (!ops) {
        sm_fail(err, SM_ERR_ARG, "router: unknown router '%s' (known: %s)", cfg->name, sm_router_names());
        return NULL;
    }
    if (cfg->E < 1) {
        sm_fail(err, SM_ERR_ARG, "router: number of experts must be >= 1 (got %d)", cfg->E);
        return NULL;
    }
    if (cfg->k < 1 || cfg->k > cfg->E) {
        sm_fail(err, SM_ERR_ARG, "router: top-k must be in [1, E=%d] (got %d)", cfg->E, cfg->k);
        return NULL;
    }
    if (!(cfg->temperature > 0)) {
        sm_fail(err, SM_ERR_ARG, "router: temperature must be > 0 (got %g)", cfg->temperature);
        return NULL;
    }
    if (!(cfg->capacity >= 0)) {
        sm_fail(err, SM_ERR_ARG, "router: capacity factor must be > 0, or 0 for unlimited (got %g)",
                cfg->capacity);
        return NULL;
    }
    if (d < 1) {
        sm_fail(err, SM_ERR_ARG, "router: token width must be >= 1 (got %d)", d);
        return NULL;
    }
    sm_router *r = calloc(1, sizeof *r);
    if (!r) {
        sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
        return NULL;
    }
    r->ops = ops;
    r->cfg = *cfg;
    r->d = d;
    return r;
}

void sm_router_free(sm_router *r) {
    if (!r) return;
    if (r->ops && r->ops->destroy) r->ops->destroy(r);
    free(r);
}

sm_status sm_route_alloc(sm_route *route, int max_T, int E, int max_assign, sm_error *err) {
    memset(route, 0, sizeof *route);
    route->E = E;
    size_t A = max_assign > 0 ? (size_t)max_assign : 1;
    route->offset = calloc((size_t)E + 1, sizeof(int));
    route->token = calloc(A, sizeof(int));
    route->slot = calloc(A, sizeof(int));
    route->weight = calloc(A, sizeof(sm_real));
    route->dweight = calloc(A, sizeof(sm_real));
    route->probs = calloc((size_t)max_T * E, sizeof(sm_real));
    route->load = calloc((size_t)E, sizeof(int));
    if (!route->offset || !route->token || !route->slot || !route->weight || !route->dweight ||
        !route->probs || !route->load) {
        sm_route_free(route);
        return sm_fail(err, SM_ERR_NOMEM, "route: out of memory for %d tokens", max_T);
    }
    return SM_OK;
}

void sm_route_free(sm_route *route) {
    free(route->offset);
    free(route->token);
    free(route->slot);
    free(route->weight);
    free(route->dweight);
    free(route->probs);
    free(route->load);
    memset(route, 0, sizeof *route);
}

void sm_route_group(sm_route *route, const int *choice, const sm_real *w, int T, int k) {
    int E = route->E;
    memset(route->load, 0, sizeof(int) * (size_t)E);
    for (int i = 0; i < T * k; i++)
        if (choice[i] >= 0) route->load[choice[i]]++;
    route->offset[0] = 0;
    for (int e = 0; e < E; e++) route->offset[e + 1] = route->offset[e] + route->load[e];
    route->n_assign = route->offset[E];
    /* counting sort: a running cursor per expert keeps token order within each expert */
    int *cursor = route->load; /* reuse as cursor, restore after */
    for (int e = 0; e < E; e++) cursor[e] = route->offset[e];
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < k; j++) {
            int e = choice[t * k + j];
            if (e < 0) continue;
            int a = cursor[e]++;
            route->token[a] = t;
            route->slot[a] = j;
            route->weight[a] = w[t * k + j];
        }
    }
    for (int e = 0; e < E; e++) route->load[e] = route->offset[e + 1] - route->offset[e];
    route->T = T;
}
