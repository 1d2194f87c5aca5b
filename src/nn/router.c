/* Router registry and the route (assignment) buffers shared by every router. */
#include "specmoe/nn/router.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>

#include "specmoe/core/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each router file exports its ops table; adding a router = one line here. */
extern const sm_router_ops sm_router_topk_ops, sm_router_switch_ops, sm_router_expert_choice_ops,
    sm_router_hash_ops, sm_router_random_ops, sm_router_soft_ops, sm_router_vmf_ops, sm_router_grassmann_ops,
    sm_router_prototype_ops, sm_router_ev_ops;

static const sm_router_ops *const kRouters[] = {
    &sm_router_topk_ops, &sm_router_switch_ops, &sm_router_expert_choice_ops, &sm_router_hash_ops,
    &sm_router_random_ops, &sm_router_soft_ops, &sm_router_vmf_ops, &sm_router_grassmann_ops,
    &sm_router_prototype_ops, &sm_router_ev_ops,
};
#define N_ROUTERS (sizeof kRouters / sizeof kRouters[0])

void sm_router_config_default(sm_router_config *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->name, "topk");
    c->E = 8;
    c->k = 2;
    c->temperature = 1.0;
    c->renorm = 1;
    c->kappa_init = 1.0;
    c->alpha = 1.0;
    c->kr = 16;
    c->amort_hidden = 32;
    c->subspace_beta = 0.01;
    c->rho0 = 0.3;
    c->soft_norm = 1;
    c->seed = 1;
    c->ev_c = 5;
}

const char *sm_router_names(void) { return "topk, switch, expert-choice, hash, random, soft, vmf, grassmann, prototype, ev"; }

sm_router *sm_router_create(const sm_router_config *cfg, int d, sm_error *err) {
    const sm_router_ops *ops = NULL;
    for (size_t i = 0; i < N_ROUTERS; i++)
        if (strcmp(kRouters[i]->name, cfg->name) == 0) ops = kRouters[i];
    if (!ops) {
        sm_fail(err, SM_ERR_ARG, "router: unknown router '%s' (known: %s)", cfg->name, sm_router_names());
        return NULL;
    }
    /* every impossible setting is refused here, before any parameter or data is touched */
    const char *why = NULL;
    char buf[160];
    if (cfg->E < 1) why = "number of experts must be >= 1";
    else if (cfg->k < 1 || cfg->k > cfg->E) why = "top-k must be in [1, E]";
    else if (!(cfg->temperature > 0)) why = "temperature must be > 0";
    else if (!(cfg->capacity >= 0)) why = "capacity factor must be > 0, or 0 for unlimited";
    else if (!(cfg->balance_coef >= 0) || !(cfg->zloss_coef >= 0)) why = "loss coefficients must be >= 0";
    else if (!(cfg->alpha >= 0)) why = "alpha (the sparsity dial) must be >= 0";
    else if (!(cfg->kappa_init > 0)) why = "initial concentration kappa must be > 0";
    else if (!strcmp(cfg->name, "grassmann") && (cfg->kr < 1 || cfg->kr > d)) {
        snprintf(buf, sizeof buf, "routing rank k_r must be in [1, d=%d]", d);
        why = buf;
    } else if (cfg->amortize && cfg->amort_hidden < 1) why = "amortiser hidden width must be >= 1";
    else if (!(cfg->subspace_beta >= 0) || !(cfg->rho0 >= 0)) why = "subspace beta and rho0 must be >= 0";
    else if (cfg->pairs < -1) why = "sampled pairs must be >= 1, 0 (4E) or -1 (all)";
    else if (cfg->slots < 0 || cfg->soft_group < 0) why = "soft slots and group size must be >= 0";
    else if (d < 1) why = "token width must be >= 1";
    else if (!strcmp(cfg->name, "ev") && (cfg->ev_c < 1 || cfg->alpha > 1)) why = "ev needs c >= 1 and a mixing alpha in [0, 1]";
    if (why) {
        sm_fail(err, SM_ERR_ARG, "router %s: %s (E=%d, k=%d, temperature=%g, capacity=%g, alpha=%g, k_r=%d)",
                cfg->name, why, cfg->E, cfg->k, cfg->temperature, cfg->capacity, cfg->alpha, cfg->kr);
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

sm_status sm_route_alloc(sm_route *route, sm_route_kind kind, int max_T, int E, int max_assign, int slots,
                         sm_error *err) {
    memset(route, 0, sizeof *route);
    route->kind = kind;
    route->E = E;
    size_t A = max_assign > 0 ? (size_t)max_assign : 1, TE = (size_t)max_T * E;
    size_t n = kind == SM_ROUTE_SOFT ? TE * (size_t)slots : 0;
    /* the four SOFT matrices close the table: a SPARSE route carves only the first four arrays and
     * leaves them NULL */
    size_t sizes[] = {A, A, TE, TE, n, n, n, n};
    sm_real **ptrs[] = {&route->weight, &route->dweight, &route->probs, &route->dprobs,
                        &route->dispatch, &route->combine, &route->ddispatch, &route->dcombine};
    size_t isizes[] = {(size_t)E + 1, A, A, (size_t)E};
    int **iptrs[] = {&route->offset, &route->token, &route->slot, &route->load};
    const char *what = kind == SM_ROUTE_SOFT ? "soft" : "sparse";
    size_t n_real = SM_LEN(sizes) - (kind == SM_ROUTE_SOFT ? 0 : 4);
    route->block = sm_carve(ptrs, sizes, n_real, err, "route (%s, %d tokens)", what, max_T);
    route->iblock = sm_carve_int(iptrs, isizes, SM_LEN(isizes), err, "route (%s, %d tokens)", what, max_T);
    if (!route->block || !route->iblock) {
        sm_route_free(route);
        return SM_ERR_NOMEM;
    }
    return SM_OK;
}

void sm_route_free(sm_route *route) {
    free(route->block);
    free(route->iblock);
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

/* Router options as stored in a model's JSON ("moe" object): one row per field of sm_router_config.
 * Fields added after the first checkpoints are optional and keep their defaults when absent. */
typedef enum { OPT_INT, OPT_NUM, OPT_U64 } opt_type;
typedef struct {
    const char *key;
    opt_type type;
    size_t offset;
    int required;
} router_opt;
#define OPT(key, type, field, req) {key, type, offsetof(sm_router_config, field), req}
static const router_opt kOpts[] = {
    OPT("experts", OPT_INT, E, 1),          OPT("topk", OPT_INT, k, 1),
    OPT("temperature", OPT_NUM, temperature, 1), OPT("noisy", OPT_INT, noisy, 1),
    OPT("renorm", OPT_INT, renorm, 1),      OPT("capacity", OPT_NUM, capacity, 1),
    OPT("balance", OPT_NUM, balance_coef, 0), OPT("zloss", OPT_NUM, zloss_coef, 0),
    OPT("kappa_init", OPT_NUM, kappa_init, 0), OPT("alpha", OPT_NUM, alpha, 0),
    OPT("kr", OPT_INT, kr, 0),              OPT("amortize", OPT_INT, amortize, 0),
    OPT("amort_hidden", OPT_INT, amort_hidden, 0), OPT("subspace_beta", OPT_NUM, subspace_beta, 0),
    OPT("rho0", OPT_NUM, rho0, 0),          OPT("pairs", OPT_INT, pairs, 0),
    OPT("slots", OPT_INT, slots, 0),        OPT("soft_group", OPT_INT, soft_group, 0),
    OPT("soft_norm", OPT_INT, soft_norm, 0), OPT("seed", OPT_U64, seed, 0),
    OPT("proto_sq", OPT_INT, proto_sq, 0),  OPT("ev_c", OPT_INT, ev_c, 0),
    OPT("ev_avg", OPT_INT, ev_avg, 0),
};
#undef OPT

void sm_router_config_to_json(const sm_router_config *c, cJSON *o) {
    cJSON_AddStringToObject(o, "router", c->name);
    for (size_t i = 0; i < sizeof kOpts / sizeof kOpts[0]; i++) {
        const char *f = (const char *)c + kOpts[i].offset;
        if (kOpts[i].type == OPT_U64 && *(const uint64_t *)f > (1ull << 53)) {
            /* beyond 2^53 a JSON number loses bits: the exact decimal string instead */
            char b[32];
            snprintf(b, sizeof b, "%llu", (unsigned long long)*(const uint64_t *)f);
            cJSON_AddStringToObject(o, kOpts[i].key, b);
            continue;
        }
        double v = kOpts[i].type == OPT_INT ? *(const int *)f
                   : kOpts[i].type == OPT_NUM ? *(const double *)f : (double)*(const uint64_t *)f;
        cJSON_AddNumberToObject(o, kOpts[i].key, v);
    }
}

sm_status sm_router_config_from_json(sm_router_config *c, const cJSON *o, const char *what, sm_error *err) {
    sm_status st = sm_json_str(o, "router", c->name, sizeof c->name, what, err);
    for (size_t i = 0; i < sizeof kOpts / sizeof kOpts[0] && st == SM_OK; i++) {
        char *f = (char *)c + kOpts[i].offset;
        int opt = !kOpts[i].required;
        if (kOpts[i].type == OPT_INT) {
            st = sm_json_int(o, kOpts[i].key, opt, (int *)f, what, err);
        } else if (kOpts[i].type == OPT_NUM) {
            st = sm_json_num(o, kOpts[i].key, opt, (double *)f, what, err);
        } else { /* a number up to 2^53, or the exact decimal string */
            const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, kOpts[i].key);
            if (cJSON_IsString(j)) {
                char *end = NULL;
                errno = 0;
                unsigned long long u = strtoull(j->valuestring, &end, 10);
                if (!*j->valuestring || *end || errno || j->valuestring[0] == '-')
                    st = sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' is not an unsigned 64-bit integer", what, kOpts[i].key);
                else
                    *(uint64_t *)f = (uint64_t)u;
                continue;
            }
            double v = (double)*(uint64_t *)f;
            st = sm_json_num(o, kOpts[i].key, opt, &v, what, err);
            /* files written before seeds above 2^53 became strings hold them as (rounded) numbers */
            if (st == SM_OK && !(v >= 0 && v < 18446744073709551616.0 && v == floor(v)))
                st = sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' is not an unsigned 64-bit integer", what, kOpts[i].key);
            if (st == SM_OK) *(uint64_t *)f = (uint64_t)v;
        }
    }
    return st;
}
