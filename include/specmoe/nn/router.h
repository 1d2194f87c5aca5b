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

#include <stddef.h>

#include "specmoe/core/core.h"
#include "specmoe/core/opt.h"
#include "specmoe/core/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The options of a router. The fields below are the ones every router shares; a router's own
 * options live in `own`, which holds that router's own option struct (e.g. sm_grmoe_router_opts,
 * include/specmoe/methods/grmoe/router.h) and is read through the router's accessor. Which router's
 * struct `own` holds is said by `name`: change the router with sm_router_config_set, which resets
 * `own` to that router's defaults. A new router with new options therefore touches only its own files
 * and one registry line: its struct, its option table (SM_ROUTER_OWN_OPT rows) and its accessor. */
#define SM_ROUTER_OWN_BYTES 128
typedef struct {
    char name[32];       /* "topk", "switch", ... (sm_router_names lists them) */
    int E;               /* experts */
    int k;               /* experts per token; k == E gives the dense mixture */
    double temperature;  /* softmax temperature (> 0) */
    int noisy;           /* Shazeer noisy top-k gating: + N(0,1) * softplus(x W_noise) at train time */
    int renorm;          /* renormalise the k selected weights to sum to 1 */
    double capacity;     /* capacity factor; 0 = unlimited. capacity = ceil(cf * T * k / E);
                          * expert-choice: each expert takes ceil(cf * T / E) tokens (0 means 1) */
    double balance_coef; /* Switch load-balancing loss weight (switch default 0.01) */
    double zloss_coef;   /* router z-loss weight (ST-MoE), 0 = off */
    _Alignas(16) unsigned char own[SM_ROUTER_OWN_BYTES]; /* the named router's own option struct */
} sm_router_config;

/* The own option struct T of a router in c (a router's accessor wraps this and checks the size). */
#define SM_ROUTER_OWN(T, c) ((T *)(void *)(c)->own)
#define SM_ROUTER_OWN_FITS(T) _Static_assert(sizeof(T) <= SM_ROUTER_OWN_BYTES, #T " exceeds SM_ROUTER_OWN_BYTES")
/* Declares fn(cfg), the accessor of own struct T: a pointer into cfg->own (cfg must name a router
 * whose own struct is T; writable through a const cfg, like strchr), with the size checked. */
#define SM_ROUTER_OWN_ACCESSOR(T, fn)                                                   \
    SM_ROUTER_OWN_FITS(T);                                                              \
    static inline T *fn(const sm_router_config *c) { return SM_ROUTER_OWN(T, (sm_router_config *)c); }

/* One router option: the JSON key it is stored under in a model description, the command-line flag
 * that sets it, its type, where it lives in sm_router_config, its default and a help line. Options
 * every router reads (experts, topk, temperature, ...) are in one shared table (router.c,
 * sm_router_shared_opts); each router's ops table lists its own (SM_ROUTER_OWN_OPT: a field of its
 * own struct). Two routers may list the same key (alpha: grassmann and ev) with the same type; each
 * keeps it in its own struct. From these tables come the defaults (sm_router_config_set), the JSON
 * fields (sm_router_config_to_json / _from_json: the shared options and the named router's own) and
 * the command-line flags of `specmoe train` and of `specmoe eval` (the dials). */
/* (the generic option row, include/specmoe/core/opt.h) */
typedef sm_opt sm_router_opt;

#define SM_ROUTER_OPT(key, flag, type, field, def, help, required) \
    {key, flag, type, offsetof(sm_router_config, field), def, help, required, 0}
#define SM_ROUTER_OWN_OPT(T, key, flag, type, field, def, help) \
    {key, flag, type, offsetof(sm_router_config, own) + offsetof(T, field), def, help, 0, 0}

/* What a front end knows when it fills a config from user options, for sm_router_ops.defaults. */
typedef struct {
    int (*given)(const void *user, const char *key); /* 1 if the user set the option with this key */
    const void *user;
    int batch;  /* examples per training batch, 0 if unknown */
} sm_router_given;

/* The shared defaults and the topk router. */
void sm_router_config_default(sm_router_config *c);
/* Names router `name` in c and resets c->own to that router's defaults (the shared fields are kept);
 * an unknown name is refused listing the known ones. */
sm_status sm_router_config_set(sm_router_config *c, const char *name, sm_error *err);
/* The config as JSON fields ("router", "experts", "topk", ...) added to object o, and back (what
 * names the document in messages; fields added after the first checkpoints are optional). */
struct cJSON;
void sm_router_config_to_json(const sm_router_config *c, struct cJSON *o);
sm_status sm_router_config_from_json(sm_router_config *c, const struct cJSON *o, const char *what, sm_error *err);

/* One routing decision for a batch. Buffers are sized once for the largest batch (max_T). */
typedef enum { SM_ROUTE_SPARSE = 0, SM_ROUTE_SOFT } sm_route_kind;

typedef struct {
    sm_route_kind kind; /* SPARSE: (token, expert, weight) assignments; SOFT: dispatch/combine */
    int T, E;
    int n_assign;       /* assignments kept in this batch (SOFT: slot rows, E * groups * slots) */
    int *offset;        /* (E+1) assignments of expert e are [offset[e], offset[e+1]) */
    int *token;         /* (A) token of each assignment, grouped by expert, token order within */
    int *slot;          /* (A) rank of the expert among the token's choices (0 = first) */
    sm_real *weight;    /* (A) combine weight */
    sm_real *dweight;   /* (A) dLoss/dweight: zeroed by the layer's forward, added to by penalties on the
                         * combine weights (SPHERE's features) and by the layer's backward, before the
                         * router's backward */
    sm_real *probs;     /* (T,E) routing probabilities (after temperature), for metrics */
    sm_real *dprobs;    /* (T,E) gradient of outside losses on probs (diversity, ...): zeroed by the
                         * layer's forward, added to by penalties, consumed by the router backward */
    int *load;          /* (E) kept assignments per expert */
    long dropped;       /* assignments dropped by the capacity limit in this batch */
    double aux_loss;    /* auxiliary loss the router adds to the objective (0 if none) */
    /* SOFT routes (SoftMoE): tokens form G groups of m; each group has S = E * p slots, slot
     * s = e * p + j belongs to expert e. Slot inputs are dispatch-weighted sums of the group's
     * tokens, outputs return to tokens with combine weights. */
    int groups, group_size, slots; /* G, m, p */
    sm_real *dispatch;  /* (G, m, S) softmax over the m tokens, per slot */
    sm_real *combine;   /* (G, m, S) softmax over the S slots, per token */
    sm_real *ddispatch; /* (G, m, S) written by the layer */
    sm_real *dcombine;  /* (G, m, S) written by the layer */
    sm_real *block;     /* the two allocations the arrays above are carved from (sm_carve): sm_real */
    int *iblock;        /* and int */
} sm_route;

typedef struct sm_router sm_router;

typedef struct {
    const char *name;
    /* Declares the router's parameters under prefix (e.g. "layers.1.router"). */
    sm_status (*declare)(sm_router *r, sm_params *ps, const char *prefix, sm_error *err);
    /* Takes pointers into the allocated parameter table. */
    void (*bind)(sm_router *r, const sm_params *ps);
    /* Upper bound on assignments (SOFT: slot rows) for a batch of T tokens. */
    int (*max_assign)(const sm_router *r, int T);
    /* Route kind this router produces. */
    sm_route_kind kind;
    /* SOFT routers: slots per expert for batches of up to max_T tokens (NULL for SPARSE). */
    int (*max_slots)(const sm_router *r, int max_T);
    /* Allocates per-batch scratch for up to max_T tokens. */
    sm_status (*reserve)(sm_router *r, int max_T, sm_error *err);
    /* x (T,d) -> route. rng is used only when train != 0 and the router is stochastic. */
    void (*forward)(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train);
    /* dx (T,d) += ..., parameter gradients += ..., from route->dweight and the aux loss weight. */
    void (*backward)(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T);
    void (*destroy)(sm_router *r);
    /* The options this router reads beyond the shared ones (sm_router_shared_opts); may be NULL. */
    const sm_router_opt *opts;
    int n_opts;
    /* Router-specific validation for tokens of width d: NULL if cfg is fine, else the reason (a
     * static string, or one written to buf of n bytes). sm_router_create calls it after the
     * generic checks (E, k, temperature, capacity, loss weights, d). May be NULL. */
    const char *(*check)(const sm_router_config *cfg, int d, char *buf, size_t n);
    /* Router-dependent defaults a front end applies after filling cfg from user options (topk:
     * balance 0.01 unless given; grassmann: k = E unless given, ...). May be NULL. */
    void (*defaults)(sm_router_config *cfg, const sm_router_given *g);
    /* Non-NULL for a router that is not trained but built from something else, which this names
     * (ev: "a trained topk model"); the training command refuses it and shows none of its options. */
    const char *built_from;
    /* The keys of the options that may change on a trained model without retraining (GrMoE's
     * alpha; ev's mix weight and c), NULL-terminated; may be NULL. The shared "temperature" is a dial
     * of every router. `specmoe eval` makes its flags from these, and a checkpoint loads under any
     * value of them. */
    const char *const *dials;
    /* The key of the router's own option that holds its group size - the tokens that compete for
     * slots or capacity together - or NULL if it takes the whole batch. An MoE module whose input has
     * R > 1 rows (tokens) per example sets it to R when it is 0: routing stays within an observation
     * (SoftMoE-in-RL). */
    const char *group_key;
    /* Pruning (SoftMoE-in-RL Fig. 19): experts with on[e] == 0 take no part until the next call -
     * a SOFT router gives their slots no combine weight and renormalises the rest over the other
     * experts' slots, so they get no gradient either. Returns 0, or -1 out of memory (nothing
     * changed). NULL if the router cannot prune. */
    int (*set_active)(sm_router *r, const unsigned char *on);
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
/* Comma-separated list of registered router names, from the registry. */
const char *sm_router_names(void);
/* The registry: number of routers, the i-th router's ops, the router named name (NULL if none). */
int sm_router_count(void);
const sm_router_ops *sm_router_at(int i);
const sm_router_ops *sm_router_find(const char *name);
/* The options every router shares (experts, topk, temperature, ...); n receives their number. */
const sm_router_opt *sm_router_shared_opts(int *n);
/* Sets the option whose flag is `flag` (without "--") of the router c names, from text: one of its
 * own options or a shared one. A flag only other routers have is refused naming them ("--kr is an
 * option of the grassmann router, not of topk"); a value that does not parse is refused too. */
sm_status sm_router_config_set_flag(sm_router_config *c, const char *flag, const char *text, sm_error *err);
/* 1 if key names a dial of router ops (see sm_router_ops.dials; "temperature" for every router). */
int sm_router_is_dial(const sm_router_ops *ops, const char *key);
/* The option of router ops with this key: its own, else a shared one; NULL if none. */
const sm_router_opt *sm_router_find_opt(const sm_router_ops *ops, const char *key);
/* The flag name of an option (o->flag, or the key with '_' -> '-') in buf of n bytes. */
static inline const char *sm_router_opt_flag(const sm_router_opt *o, char *buf, size_t n) { return sm_opt_flag(o, buf, n); }
/* Sets the option's field in c from text (as a flag value); 0 on success, -1 if text is invalid. */
static inline int sm_router_opt_set(const sm_router_opt *o, sm_router_config *c, const char *text) {
    return sm_opt_set(o, c, text);
}

/* Allocates a route for up to max_T tokens; SOFT routes also get their (max_T, E*slots) matrices. */
/* Declares a router's linear gate, <prefix>.weight of (rows, d) with fan-in uniform init; returns its
 * parameter index or -1 (err set). */
int sm_router_declare_linear(sm_params *ps, const char *prefix, int rows, int d, sm_error *err);
sm_status sm_route_alloc(sm_route *route, sm_route_kind kind, int max_T, int E, int max_assign, int slots,
                         sm_error *err);
void sm_route_free(sm_route *route);
/* The sm_real values sm_route_alloc takes for these sizes (the memory estimate counts them). */
size_t sm_route_values(sm_route_kind kind, int max_T, int E, int max_assign, int slots);
/* Groups per-token choices into the expert-major layout: choice (T,k) expert ids (-1 = dropped
 * or unused), w (T,k) weights. Fills offset/token/slot/weight/load. Stable in token order. */
void sm_route_group(sm_route *route, const int *choice, const sm_real *w, int T, int k);

#ifdef __cplusplus
}
#endif
#endif
