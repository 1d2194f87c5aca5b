/* The MoE layer: a router (router.h) picks experts per token; the output is the routing-weighted
 * sum of the chosen experts' outputs plus the sum of the always-on shared experts (DeepSeek-MoE):
 *
 *   out_t = sum_{e in route(t)} w_{t,e} E_e(x_t)  +  sum_s S_s(x_t)
 *
 * Built-in experts are MLPs d -> H -> ... -> H -> O (O = d unless out_dim is set), stored as
 * contiguous [E, ...] blocks so per-expert statistics, SVDs and spectral penalties are one loop.
 * Factory experts (sm_moe_module_experts, below) are any modules d -> O. The layer never looks
 * inside the router.
 *
 * Letters: T tokens, d width, E experts, H expert hidden width, S shared experts,
 *          A assignments (<= router max_assign(T)).
 */
#ifndef SPECMOE_MOE_H
#define SPECMOE_MOE_H

#include "specmoe/nn/mlp.h"
#include "specmoe/nn/module.h"
#include "specmoe/nn/router.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    sm_router_config router; /* router name, E, k, temperature, noise, renorm, capacity */
    int H;                   /* expert hidden width */
    int n_shared;            /* always-on shared experts (same shape as a routed expert) */
    sm_act act;              /* expert activation */
    int expert_bias;         /* experts have biases (1) or not (0, Mixtral style) */
    int out_dim;             /* expert output width O; 0 = the input width d */
    int depth;               /* hidden layers per expert, each H wide (0 or 1: the two-layer MLP d -> H -> O;
                              * L > 1: d -> H -> ... -> H -> O, e.g. SPHERE's 3-hidden-layer experts) */
} sm_moe_config;

void sm_moe_config_default(sm_moe_config *c);
/* The config as the "moe" object of a model's JSON (router options plus shared, expert_bias,
 * expert_act), and back; H is not part of it (it comes from the layer). */
void sm_moe_config_to_json(const sm_moe_config *c, struct cJSON *o);
sm_status sm_moe_config_from_json(sm_moe_config *c, const struct cJSON *o, sm_error *err);

typedef struct {
    sm_moe_config cfg;
    int d, O, E, S, H, max_T, max_A; /* in width, out width, experts, shared, hidden, ... */
    int L;               /* hidden layers per expert */
    int dg;              /* width of the router's input (d, or a gate network's output) */
    sm_router *router;
    sm_route route;      /* the last forward's routing: loads, dropped, probs */
    int ip[10];          /* parameter indices: w1 b1 w2 b2 sw1 sb1 sw2 sb2 wh bh (-1 if absent) */
    sm_real *w1, *dw1;   /* (E,H,d) */
    sm_real *b1, *db1;   /* (E,H) or NULL */
    sm_real *w2, *dw2;   /* (E,O,H) */
    sm_real *b2, *db2;   /* (E,O) or NULL */
    sm_real *wh, *dwh;   /* (E,L-1,H,H) hidden-to-hidden layers of deeper experts, or NULL */
    sm_real *bh, *dbh;   /* (E,L-1,H) or NULL */
    sm_real *sw1, *dsw1; /* (S,H,d) */
    sm_real *sb1, *dsb1; /* (S,H) */
    sm_real *sw2, *dsw2; /* (S,O,H) */
    sm_real *sb2, *dsb2; /* (S,O) */
    /* activations: one block, carved */
    sm_real *act_block;
    sm_real *xg;   /* (A,d) inputs gathered per assignment, expert-major */
    sm_real *hpre; /* (L,A,H) pre-activations, hidden layer after hidden layer (stride max_A*H); built-in
                    * ReLU experts leave it unwritten (their backward reads the derivative off h) */
    sm_real *h;    /* (L,A,H) activations; the last block is the experts' last hidden features */
    sm_real *y;    /* (A,O) expert outputs */
    sm_real *dy;   /* (A,O) scratch for backward */
    sm_real *dxg;  /* (A,d) scratch for backward */
    sm_real *slot_t; /* (A, max(d,O)) soft routes: each group's slot rows as columns (the backward's inner products) */
    sm_real *lin_ws; /* (lin_threads, lin_stride) the built-in experts' small-GEMM workspaces, one per thread */
    size_t lin_stride;
    int lin_threads, lin_rows; /* ... for up to lin_rows rows per expert (0: none) */
    sm_real *dh;   /* (A,H) scratch for backward; also (T,H) for shared experts */
    sm_real *shpre;/* (S,T,H) */
    sm_real *sh;   /* (S,T,H) */
    sm_real *sy;   /* (T,O) shared expert output scratch */
    sm_real *dh2;  /* (A,H) second backward scratch of deeper experts */
    sm_real *dfeat;/* (L,A,H) extra gradients on the hidden features (sm_moe_features_at), stride max_A*H */
    int dfeat_used;
    struct sm_taps *taps;  /* set by the module for one backward: expert linear maps are reported */
    const sm_params *tap_ps; /* whose tensor names the taps report */
    /* Factory experts (sm_moe_module_experts): E modules d -> O, each run on its own gathered rows
     * (xg, dxg, y, dy above) in place of the built-in MLP; NULL for the built-in experts. Owned by
     * the module; their activations live in its arena, for expert_rows rows each. */
    sm_module **experts; /* (E) */
    int expert_rows;     /* the most rows one expert gets: max_T (SPARSE) or its slot rows (SOFT) */
    int feat_seq;        /* factory experts whose hidden features the layer reads (sm_moe_features_at): each a
                          * sequential container of L + 1 children, child j < L giving hidden layer j (H wide;
                          * L and H above are then taken from them), the last the output map */
    const sm_ctx *ctx;   /* set by the module for one forward / backward: the experts' call context */
} sm_moe;

sm_moe *sm_moe_create(const sm_moe_config *cfg, int d, sm_error *err);
void sm_moe_free(sm_moe *m);
/* Parameters under prefix: prefix.router.*, prefix.experts.{w1,b1,w2,b2}, prefix.shared.* */
sm_status sm_moe_declare(sm_moe *m, sm_params *ps, const char *prefix, sm_error *err);
void sm_moe_bind(sm_moe *m, const sm_params *ps);
sm_status sm_moe_reserve(sm_moe *m, int max_T, sm_error *err);
/* The sm_real values sm_moe_reserve would take for max_T tokens (its arrays and the route's; the
 * router's own small buffers are not counted): the memory estimate calls it before allocating. */
size_t sm_moe_act_values(const sm_moe *m, int max_T);
/* out (T,O) = MoE(x (T,d)). rng drives stochastic routers when train != 0. */
void sm_moe_forward(sm_moe *m, sm_real *out, const sm_real *x, int T, sm_rng *rng, int train);
/* dx (T,d) += ..., parameter gradients += ..., given dout (T,O) and the same x as the forward. */
void sm_moe_backward(sm_moe *m, sm_real *dx, const sm_real *dout, const sm_real *x, int T);

/* The experts' last hidden features of the last forward, one row per assignment in the route's
 * expert-major order (route.token / route.weight say whose and how much): (A,H) with A =
 * route.n_assign. Built-in experts, and factory experts laid out as m->feat_seq says (gathered from
 * their containers' outputs at the call); NULL, and *dfeat = NULL, for other factory experts, whose
 * insides the layer does not know (sm_moe_has_features says which). dfeat (A,H) takes an extra
 * gradient on them (e.g. a penalty on routing-weighted expert features, SPHERE): asking for it makes
 * the next backward add it in; the next forward zeroes it and ends the request (a layer nobody asks
 * pays nothing). */
const sm_real *sm_moe_features(sm_moe *m, sm_real **dfeat);
/* Whether sm_moe_features can read m's experts: built-in MLPs, or factory experts laid out as
 * feat_seq says. */
int sm_moe_has_features(const sm_moe *m);
/* The same for hidden layer j (0 <= j < L; L-1 is sm_moe_features), after its activation: (A,H)
 * rows in the same order, with its own extra-gradient buffer dfeat (A,H), requested as above
 * and added in before layer j's activation backward (factory experts: to child j's output gradient).
 * NULL for factory experts not laid out so, or j out of range. */
const sm_real *sm_moe_features_at(sm_moe *m, int j, sm_real **dfeat);
/* A router reading gate input g (T,dg) instead of x: the layer is built with sm_moe_create_gated,
 * and forward/backward take g and its gradient dg (T,dg) += ... (dg may alias dx when g is x). */
sm_moe *sm_moe_create_gated(const sm_moe_config *cfg, int d, int dg, sm_error *err);
void sm_moe_forward_gated(sm_moe *m, sm_real *out, const sm_real *x, const sm_real *g, int T, sm_rng *rng, int train);
void sm_moe_backward_gated(sm_moe *m, sm_real *dx, sm_real *dg, const sm_real *dout, const sm_real *x, const sm_real *g,
                           int T);

/* The MoE layer as a module (module.h): parameters are bound to the call's view at every forward
 * and backward, so gradients go where the caller says. Rows are tokens: an input of R rows per
 * example routes B*R tokens. */
sm_module *sm_moe_module(const char *name, const sm_moe_config *cfg, sm_error *err);
/* The same with a gate network: gate (a module, owned) maps the layer's input to the router's input
 * (e.g. an MLP), declared under "<name>.gate"; the experts read the layer's input. */
sm_module *sm_moe_module_gated(const char *name, const sm_moe_config *cfg, sm_module *gate, sm_error *err);
/* Experts of any kind: make(user, e, err) is called once per routed expert e = 0..E-1 (E =
 * cfg->router.E) and returns a module (owned by the layer, NULL on failure: the construction fails
 * with its error). Expert e is declared under "<name>.experts.<e>" with input sm_shape_vec(d), one
 * token row per example: under SPARSE routes it runs on its n_e routed token rows (xg (n_e,d) ->
 * y (n_e,O)), under SOFT routes on its slot rows; the layer combines y as for built-in experts and
 * scales dout by the routing weight into the expert's backward. Every expert must output one row
 * of the same width O (and O = cfg->out_dim when that is set); images and multi-row outputs are
 * refused at declare. cfg->H, depth, act and expert_bias describe built-in experts and are not used.
 * Shared experts (cfg->n_shared > 0) are refused: they are built-in MLPs only.
 * gate (may be NULL, owned) is a gate network as in sm_moe_module_gated.
 * Taps: under SPARSE routes an expert's own linear taps are reported as taps->expert_linear(param,
 * block 0, token map of its rows, ...) with param the expert's tensor name; under SOFT routes (slot
 * rows mix tokens) they are not reported. sm_moe_features reads them when each expert is a
 * sequential container (sm_seq_module) of hidden blocks of one width H followed by its output map -
 * hidden layer j the output of child j, so a block with several modules (Linear -> LayerNorm -> act)
 * must be one child - and the route is SPARSE; otherwise it gives NULL.
 * Experts run one per thread, except while training with an RNG (a stochastic expert must draw in
 * a fixed order): then one after another.
 * JSON: the description holds expert 0's ("expert"), with the names its parent gave it removed;
 * sm_module_from_json builds every expert from it. Experts not all alike are described with
 * "experts_alike": false and refused by sm_module_from_json. */
typedef sm_module *(*sm_expert_factory)(void *user, int e, sm_error *err);
sm_module *sm_moe_module_experts(const char *name, const sm_moe_config *cfg, sm_expert_factory make, void *user,
                                 sm_module *gate, sm_error *err);
/* the layer inside an MoE module (NULL for any other module, or before declare) */
sm_moe *sm_moe_of(const sm_module *m);
/* An MoE module's gate network output of its last forward, (N, dg) (*dg set), or NULL when it has no
 * gate network (its router then read the layer's input). */
const sm_real *sm_moe_gate_out(const sm_module *m, int *dg);

/* An outside executor of an MoE module's layer (the expert-parallel adapter of
 * include/specmoe/dist/ep.h): once set, the module's forward and backward call it instead of the
 * layer's own, with the call's parameter view (values, and the gradients to add to), and it fills
 * the layer's route (moe->route) for the routing statistics. Status: the module interface has none,
 * so an executor that fails writes NaN into out (the training's NaN guard stops the run) and keeps
 * its message. */
typedef struct sm_moe_exec {
    void (*forward)(struct sm_moe_exec *x, sm_moe *moe, sm_real *out, const sm_real *in, int T, const sm_params *pv,
                    sm_rng *rng, int train);
    /* dx (T,d) +=; parameter gradients += into pv->grad */
    void (*backward)(struct sm_moe_exec *x, sm_moe *moe, sm_real *dx, const sm_real *dout, const sm_real *in, int T,
                     const sm_params *pv);
} sm_moe_exec;
/* Sets the executor of an MoE module without a gate network (NULL: the layer's own again).
 * SM_ERR_ARG for any other module. */
sm_status sm_moe_module_set_exec(sm_module *m, sm_moe_exec *x, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
