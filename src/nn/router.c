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
    sm_router_prototype_ops, sm_router_ev_ops, sm_router_ds_ops;

static const sm_router_ops *const kRouters[] = {
    &sm_router_topk_ops, &sm_router_switch_ops, &sm_router_expert_choice_ops, &sm_router_hash_ops,
    &sm_router_random_ops, &sm_router_soft_ops, &sm_router_vmf_ops, &sm_router_grassmann_ops,
    &sm_router_prototype_ops, &sm_router_ev_ops, &sm_router_ds_ops,
};
#define N_ROUTERS (sizeof kRouters / sizeof kRouters[0])

/* The options several routers read. Each router's own are in its ops table. The first eight are
 * the fields of the first checkpoints, required in JSON; later ones keep their defaults when absent. */
static const sm_router_opt kShared[] = {
    SM_ROUTER_OPT("experts", NULL, SM_OPT_INT, E, "8", "experts per MoE layer", 1),
    SM_ROUTER_OPT("topk", NULL, SM_OPT_INT, k, "2", "experts per token (= experts: dense mixture; grassmann default: all)", 1),
    SM_ROUTER_OPT("temperature", NULL, SM_OPT_NUM, temperature, "1", "router softmax temperature", 1),
    SM_ROUTER_OPT("noisy", NULL, SM_OPT_BOOL, noisy, "0", "noisy top-k gating (Shazeer 2017) during training", 1),
    SM_ROUTER_OPT("renorm", NULL, SM_OPT_BOOL, renorm, "1", "renormalise the k selected routing weights", 1),
    SM_ROUTER_OPT("capacity", NULL, SM_OPT_NUM, capacity, "0",
                  "capacity factor (0 = unlimited; expert-choice: tokens per expert = cf*T/E)", 1),
    SM_ROUTER_OPT("balance", NULL, SM_OPT_NUM, balance_coef, "0", "load-balancing loss weight (topk and switch default 0.01)", 0),
    SM_ROUTER_OPT("zloss", NULL, SM_OPT_NUM, zloss_coef, "0", "router z-loss weight", 0),
};

const sm_router_opt *sm_router_shared_opts(int *n) {
    *n = (int)SM_LEN(kShared);
    return kShared;
}

int sm_router_count(void) { return (int)N_ROUTERS; }

const sm_router_ops *sm_router_at(int i) { return i >= 0 && i < (int)N_ROUTERS ? kRouters[i] : NULL; }

const sm_router_ops *sm_router_find(const char *name) {
    for (size_t i = 0; i < N_ROUTERS; i++)
        if (strcmp(kRouters[i]->name, name) == 0) return kRouters[i];
    return NULL;
}

/* Calls fn on every option of the router named c->name once per JSON key: the shared ones, then
 * the router's own that are not shared keys (prototype's "tau" sets the shared temperature). */
static void for_each_key(const sm_router_config *c, void (*fn)(const sm_router_opt *, void *), void *user) {
    for (size_t i = 0; i < SM_LEN(kShared); i++) fn(&kShared[i], user);
    const sm_router_ops *ops = sm_router_find(c->name);
    for (int i = 0; ops && i < ops->n_opts; i++) {
        int shared = 0;
        for (size_t j = 0; j < SM_LEN(kShared) && !shared; j++) shared = !strcmp(kShared[j].key, ops->opts[i].key);
        if (!shared) fn(&ops->opts[i], user);
    }
}

void sm_router_config_default(sm_router_config *c) {
    memset(c, 0, sizeof *c);
    /* a built-in default that does not parse leaves the field zero; tests/test_router_opts.c parses
     * every default, so the bug is caught there rather than by exiting the caller */
    (void)sm_opt_defaults(kShared, (int)SM_LEN(kShared), c);
    (void)sm_router_config_set(c, "topk", NULL);
}

sm_status sm_router_config_set(sm_router_config *c, const char *name, sm_error *err) {
    const sm_router_ops *ops = sm_router_find(name);
    if (!ops) return sm_fail(err, SM_ERR_ARG, "router: unknown router '%s' (known: %s)", name, sm_router_names());
    if (c->name != name) snprintf(c->name, sizeof c->name, "%s", name); /* registry names fit */
    memset(c->own, 0, sizeof c->own);
    for (int i = 0; i < ops->n_opts; i++)
        if (ops->opts[i].offset >= offsetof(sm_router_config, own)) (void)sm_opt_set(&ops->opts[i], c, ops->opts[i].def);
    return SM_OK;
}

sm_status sm_router_config_set_flag(sm_router_config *c, const char *flag, const char *text, sm_error *err) {
    const sm_router_ops *ops = sm_router_find(c->name);
    char name[64];
    const sm_router_opt *o = NULL;
    for (int i = 0; ops && i < ops->n_opts && !o; i++)
        if (!strcmp(sm_opt_flag(&ops->opts[i], name, sizeof name), flag)) o = &ops->opts[i];
    for (size_t i = 0; i < SM_LEN(kShared) && !o; i++)
        if (!strcmp(sm_opt_flag(&kShared[i], name, sizeof name), flag)) o = &kShared[i];
    if (!o) {
        char users[256] = "";
        size_t at = 0;
        int n = 0;
        for (size_t r = 0; r < N_ROUTERS; r++)
            for (int i = 0; i < kRouters[r]->n_opts; i++)
                if (!strcmp(sm_opt_flag(&kRouters[r]->opts[i], name, sizeof name), flag) && at < sizeof users) {
                    at += (size_t)snprintf(users + at, sizeof users - at, "%s%s", n++ ? ", " : "", kRouters[r]->name);
                    break;
                }
        if (!n) return sm_fail(err, SM_ERR_ARG, "--%s is not a router option", flag);
        return sm_fail(err, SM_ERR_ARG, "--%s is an option of the %s router%s, not of %s", flag, users, n > 1 ? "s" : "",
                       c->name);
    }
    if (sm_opt_set(o, c, text)) return sm_fail(err, SM_ERR_ARG, "--%s: invalid value '%s'", flag, text);
    return SM_OK;
}

int sm_router_is_dial(const sm_router_ops *ops, const char *key) {
    if (!strcmp(key, "temperature")) return 1;
    for (int i = 0; ops && ops->dials && ops->dials[i]; i++)
        if (!strcmp(ops->dials[i], key)) return 1;
    return 0;
}

const sm_router_opt *sm_router_find_opt(const sm_router_ops *ops, const char *key) {
    for (int i = 0; ops && i < ops->n_opts; i++)
        if (!strcmp(ops->opts[i].key, key)) return &ops->opts[i];
    for (size_t i = 0; i < SM_LEN(kShared); i++)
        if (!strcmp(kShared[i].key, key)) return &kShared[i];
    return NULL;
}

const char *sm_router_names(void) {
    static _Thread_local char names[512]; /* per thread: built on every call, callers may race */
    size_t at = 0;
    for (size_t i = 0; i < N_ROUTERS && at < sizeof names; i++)
        at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", kRouters[i]->name);
    return names;
}

sm_router *sm_router_create(const sm_router_config *cfg, int d, sm_error *err) {
    const sm_router_ops *ops = sm_router_find(cfg->name);
    if (!ops) {
        sm_fail(err, SM_ERR_ARG, "router: unknown router '%s' (known: %s)", cfg->name, sm_router_names());
        return NULL;
    }
    /* every impossible setting is refused here, before any parameter or data is touched: the
     * generic checks, then the router's own */
    const char *why = NULL;
    char buf[160];
    if (cfg->E < 1) why = "number of experts must be >= 1";
    else if (cfg->k < 1 || cfg->k > cfg->E) why = "top-k must be in [1, E]";
    else if (!(cfg->temperature > 0)) why = "temperature must be > 0";
    else if (!(cfg->capacity >= 0)) why = "capacity factor must be > 0, or 0 for unlimited";
    else if (!(cfg->balance_coef >= 0) || !(cfg->zloss_coef >= 0)) why = "loss coefficients must be >= 0";
    else if (d < 1) why = "token width must be >= 1";
    else if (ops->check) why = ops->check(cfg, d, buf, sizeof buf);
    if (why) {
        sm_fail(err, SM_ERR_ARG, "router %s: %s (E=%d, k=%d, temperature=%g, capacity=%g)", cfg->name, why, cfg->E,
                cfg->k, cfg->temperature, cfg->capacity);
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

/* The real arrays of a route (sm_route_alloc's order): the four SOFT matrices close the table, a
 * SPARSE route carves only the first four and leaves them NULL (sizes 0 here). */
#define ROUTE_N_REAL 8
static void route_sizes(sm_route_kind kind, int max_T, int E, int max_assign, int slots, size_t sizes[ROUTE_N_REAL]) {
    size_t A = max_assign > 0 ? (size_t)max_assign : 1, TE = (size_t)max_T * E;
    size_t n = kind == SM_ROUTE_SOFT ? TE * (size_t)slots : 0;
    size_t s[ROUTE_N_REAL] = {A, A, TE, TE, n, n, n, n};
    memcpy(sizes, s, sizeof s);
}

size_t sm_route_values(sm_route_kind kind, int max_T, int E, int max_assign, int slots) {
    size_t sizes[ROUTE_N_REAL], n = 0;
    route_sizes(kind, max_T, E, max_assign, slots, sizes);
    for (int i = 0; i < ROUTE_N_REAL; i++) n += sizes[i];
    return n;
}

sm_status sm_route_alloc(sm_route *route, sm_route_kind kind, int max_T, int E, int max_assign, int slots,
                         sm_error *err) {
    memset(route, 0, sizeof *route);
    route->kind = kind;
    route->E = E;
    size_t A = max_assign > 0 ? (size_t)max_assign : 1;
    size_t sizes[ROUTE_N_REAL];
    route_sizes(kind, max_T, E, max_assign, slots, sizes);
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

/* Router options as stored in a model's JSON ("moe" object): one field per option key. */
typedef struct {
    sm_router_config *c;
    const cJSON *in;
    cJSON *out;
    const char *what;
    sm_error *err;
    sm_status st;
} json_ctx;

static void opt_to_json(const sm_router_opt *o, void *user) {
    json_ctx *x = user;
    sm_opt_to_json(o, x->c, x->out);
}

void sm_router_config_to_json(const sm_router_config *c, cJSON *o) {
    cJSON_AddStringToObject(o, "router", c->name);
    json_ctx x = {(sm_router_config *)c, NULL, o, NULL, NULL, SM_OK};
    for_each_key(c, opt_to_json, &x);
}

/* Options absent from the JSON keep their defaults unless required. */
static void opt_from_json(const sm_router_opt *o, void *user) {
    json_ctx *x = user;
    if (x->st == SM_OK) x->st = sm_opt_from_json(o, x->c, x->in, x->what, x->err);
}

sm_status sm_router_config_from_json(sm_router_config *c, const cJSON *o, const char *what, sm_error *err) {
    json_ctx x = {c, o, NULL, what, err, SM_OK};
    x.st = sm_json_str(o, "router", c->name, sizeof c->name, what, err);
    /* the named router's own defaults, then what the document says (documents written before the
     * options moved into each router's struct list every router's keys: the others are ignored);
     * an unknown name keeps no own options and is refused when the router is created */
    if (x.st == SM_OK) (void)sm_router_config_set(c, c->name, NULL);
    if (x.st == SM_OK) for_each_key(c, opt_from_json, &x);
    return x.st;
}

int sm_router_declare_linear(sm_params *ps, const char *prefix, int rows, int d, sm_error *err) {
    char name[SM_NAME_MAX];
    int64_t shape[2] = {rows, d};
    snprintf(name, sizeof name, "%s.weight", prefix);
    return sm_params_add(ps, name, 2, shape, SM_INIT_UNIFORM_FANIN, d, 0, 0, err);
}
