/* Modules: forward/backward pairs composed by hand into networks, in the style of llm.c and
 * PufferLib's puffernet.h. Not a graph engine: a module is a struct with an ops table.
 *
 *   sm_params ps; sm_params_init_table(&ps);
 *   sm_module *enc = sm_conv2d_module("enc", 8, 3, 2, 1, SM_ACT_RELU, &err);   // (1,1,28,28) -> (1,8,14,14)
 *   sm_module *tok = sm_tokens_module("tok", &err);                          // -> (196 rows, 8)
 *   sm_module *net = sm_seq_module("net", (sm_module *[]){enc, tok}, 2, &err);
 *   sm_module_declare(net, &ps, sm_shape_image(1, 28, 28), &err);            // parameters under "net."
 *   sm_params_alloc(&ps, &err); sm_params_initialize(&ps, &rng);
 *   sm_module_reserve(net, max_B, &err);                                     // one activation arena
 *   sm_ctx ctx = sm_ctx_make(&ps, &rng, 1);
 *   sm_module_forward(net, out, x, B, &ctx);                                 // out (B*196, 8)
 *   sm_module_backward(net, dx, dout, x, B, &ctx);                           // grads += into ctx.pv->grad
 *
 * Shapes. A shape is per example: `rows` rows of c*h*w features (an image is one row of c x h x w,
 * stored CHW; a token sequence is `rows` rows of c features). A batch of B examples is B*rows rows,
 * row-major, so a module may change the row count (observations -> tokens) and flattening tokens back
 * is free. Letters: B examples, R rows per example, N = B*R rows, F = c*h*w features per row.
 *
 * Contract of every module:
 *   declare   m->in is set by the caller; the module checks it, sets m->out and declares its
 *             parameters under m->name (sm_params_add). Nothing is allocated for data yet.
 *   reserve   takes its activation buffers for max_B examples from the arena (sm_arena_take). The
 *             arena is walked twice, once to measure and once to carve, so reserve only records
 *             pointers: one allocation holds every activation of a network.
 *   forward   out (B*Rout, Fout) from in (B*Rin, Fin); reads parameters from ctx->pv->data.
 *   backward  from a given output gradient dout: din (may be NULL: not needed) and the parameter
 *             gradients ACCUMULATE (+=), the latter into ctx->pv->grad - the gradient view is passed
 *             at call time, so one network can feed a base gradient and a penalty gradient into
 *             separate buffers (make a view with sm_params_view). `in` is the forward's input.
 *             Parameter gradients are taken through sm_ctx_grad, which zeroes a fresh one first
 *             (sm_ctx.fresh: sm_model_backward_set; docs/ARCHITECTURE.md, "Modules").
 *   to_json   the module's description (kind and arguments); sm_module_from_json is the inverse.
 *   destroy   frees what the module allocated itself (never the parameters or the arena).
 * Every module's backward is checked against central differences in double precision
 * (tests/test_grad_module.c).
 */
#ifndef SPECMOE_MODULE_H
#define SPECMOE_MODULE_H

#include "specmoe/core/ops.h"
#include "specmoe/core/params.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;

typedef struct {
    int rows;    /* rows per example (R) */
    int c, h, w; /* features of a row: c x h x w (h = w = 1 for a feature vector) */
} sm_shape;

static inline sm_shape sm_shape_vec(int F) { sm_shape s = {1, F, 1, 1}; return s; }
static inline sm_shape sm_shape_image(int c, int h, int w) { sm_shape s = {1, c, h, w}; return s; }
static inline int sm_shape_width(sm_shape s) { return s.c * s.h * s.w; }
/* values per example: rows * width */
static inline size_t sm_shape_numel(sm_shape s) { return (size_t)s.rows * (size_t)sm_shape_width(s); }

/* Taps: a callback that sees every linear map's input rows and output-gradient rows during the
 * backward (per row, so per example when rows = 1), e.g. for per-example gradients and the eNTK.
 * `param` names the weight tensor; in (N, fan_in), dout (N, fan_out). */
typedef struct sm_taps {
    void (*linear)(struct sm_taps *t, const char *param, const sm_real *in, const sm_real *dout, int N, int fan_in,
                   int fan_out);
    /* the linear maps inside MoE experts (may be NULL): matrix `block` of tensor `param` viewed as
     * (blocks, fan_out, fan_in) - the expert for w1 / w2, expert * (L-1) + layer for the hidden
     * layers wh - over the n assignments routed to that expert; token (n) are their rows in the
     * layer's input (row / rows-per-example = the example); dout already carries the routing weight.
     * Called from one thread, expert after expert; a built-in expert with more than 128 rows may
     * report them in pieces of at most 128, in order (where its products run in such chunks on the
     * packed GEMM: src/nn/moe.c). */
    void (*expert_linear)(struct sm_taps *t, const char *param, int block, const int *token, const sm_real *in,
                          const sm_real *dout, int n, int fan_in, int fan_out);
    void *user;
} sm_taps;

/* What travels with a call: the parameter view (values and the gradient destination), the RNG,
 * the train flag and optional taps. */
typedef struct {
    const sm_params *pv; /* table + data + grad (grad may be NULL when no backward follows) */
    sm_rng *rng;         /* stochastic modules at train time (noisy gating); may be NULL at eval */
    int train;
    sm_taps *taps;       /* NULL: none */
    /* NULL, or a flag per tensor of pv: 1 = its gradient holds garbage that this backward has not yet
     * replaced (sm_model_backward_set; only tensors flagged SM_PARAM_GRAD_CTX). A module takes such a
     * gradient through sm_ctx_grad (which zeroes it first) or sm_ctx_grad_take (which tells it to
     * write with =); either clears the flag. */
    unsigned char *fresh;
} sm_ctx;

static inline sm_ctx sm_ctx_make(const sm_params *pv, sm_rng *rng, int train) {
    sm_ctx c = {pv, rng, train, NULL, NULL};
    return c;
}
/* A view of ps whose gradients go to grad (ps->total values) instead of ps->grad. */
static inline sm_params sm_params_view(const sm_params *ps, sm_real *grad) {
    sm_params v = *ps;
    v.grad = grad;
    return v;
}

/* The two-pass arena: with base == NULL, take() only counts; then one allocation, and take()
 * hands out the same sizes in the same order. */
typedef struct {
    sm_real *base;
    size_t used, cap;
    int *ibase;
    size_t iused, icap;
} sm_arena;
sm_real *sm_arena_take(sm_arena *a, size_t n);
int *sm_arena_take_int(sm_arena *a, size_t n);

typedef struct sm_module sm_module;

typedef struct {
    const char *kind;
    sm_status (*declare)(sm_module *m, sm_params *ps, sm_error *err);
    void (*reserve)(sm_module *m, int max_B, sm_arena *a);
    /* after the arena is carved: allocations a module makes for itself (NULL if none) */
    sm_status (*setup)(sm_module *m, int max_B, sm_error *err);
    void (*forward)(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx);
    void (*backward)(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx);
    /* fills o with the module's arguments (the caller adds "kind" and "name") */
    void (*to_json)(const sm_module *m, struct cJSON *o);
    void (*destroy)(sm_module *m);
    /* multiply-adds of one example's forward after declare, at nominal routing (NULL: none worth
     * counting - element-wise work, copies, pools); see sm_module_macs */
    double (*macs)(const sm_module *m);
} sm_module_ops;

struct sm_module {
    const sm_module_ops *ops;
    char name[SM_NAME_MAX]; /* parameter prefix */
    sm_shape in, out;       /* per example; in set by the caller of declare */
    int residual;           /* a container adds the input to the output (in == out) */
    sm_real *arena_block;   /* set on the outermost module by sm_module_reserve */
    int *iarena_block;
    int max_B;
};

/* Declares m (and its children) for input shape in. */
sm_status sm_module_declare(sm_module *m, sm_params *ps, sm_shape in, sm_error *err);
/* Reserves every activation of m for max_B examples in one allocation (plus one for indices). */
sm_status sm_module_reserve(sm_module *m, int max_B, sm_error *err);
static inline void sm_module_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    m->ops->forward(m, out, in, B, ctx);
}
static inline void sm_module_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B,
                                      const sm_ctx *ctx) {
    m->ops->backward(m, din, dout, in, B, ctx);
}
void sm_module_free(sm_module *m);
/* Multiply-adds of one example's forward (a multiply-add is 2 FLOPs): linear maps, convolutions,
 * MoE routers and experts; element-wise work is not counted. MoE layers count their nominal routing:
 * every token's k experts (token choice) or every slot (SoftMoE), no capacity drops. A backward costs
 * about twice the forward (the gradients of both operands of every product), less the input gradient
 * of a network's first layer. */
double sm_module_macs(const sm_module *m);
/* JSON description {"kind": ..., "name": ..., args...} (malloc'd text) and the inverse. */
char *sm_module_to_json(const sm_module *m);
sm_module *sm_module_from_json(const char *json, sm_error *err);

/* ---- leaf modules (src/nn/modules.c); name is the parameter prefix ---- */
/* linear F -> width, then act (SM_ACT_NONE: a plain linear layer). Parameters name.weight (width, F),
 * name.bias (width). An image input is flattened. */
sm_module *sm_dense_module(const char *name, int width, sm_act act, sm_error *err);
/* element-wise activation */
sm_module *sm_act_module(const char *name, sm_act act, sm_error *err);
/* LayerNorm over the features of each row: name.weight, name.bias (F) */
sm_module *sm_layernorm_module(const char *name, sm_error *err);
/* conv2d (oc, K x K, stride, pad) then act: name.weight (oc, c, K, K), name.bias (oc) */
sm_module *sm_conv2d_module(const char *name, int oc, int K, int stride, int pad, sm_act act, sm_error *err);
sm_module *sm_maxpool_module(const char *name, int K, int stride, sm_error *err);
sm_module *sm_avgpool_module(const char *name, int K, int stride, sm_error *err);
/* adaptive average pooling to 1 x 1 */
sm_module *sm_gap_module(const char *name, sm_error *err);
/* every row of an example into one row: (R, c, h, w) -> (1, R*c*h*w) */
sm_module *sm_flatten_module(const char *name, sm_error *err);
/* an image into h*w tokens of c features: (1, c, h, w) -> (h*w, c) (CHW -> HWC, SoftMoE-in-RL's
 * "PerConv" tokenisation) */
sm_module *sm_tokens_module(const char *name, sm_error *err);
/* The other tokenisers of SoftMoE-in-RL (src/nn/tokenize.c, "Don't Flatten, Tokenize!" Sec. 3-4):
 * PerFeat, an image into c tokens of h*w features: (1, c, h, w) -> (c, h*w) */
sm_module *sm_perfeat_module(const char *name, sm_error *err);
/* Shuffled: a fixed permutation (drawn from seed) of an image's c*h*w values, same shape; PerConv
 * (sm_tokens_module) after it gives the paper's Shuffled tokens */
sm_module *sm_shuffle_module(const char *name, uint64_t seed, sm_error *err);
/* the sum (mean != 0: the mean) of an example's tokens: (R, F) -> (1, F), the tokenised baseline */
sm_module *sm_tokpool_module(const char *name, int mean, sm_error *err);
/* MLP with n_hidden hidden layers: F -> widths[0] -> ... -> widths[n_hidden-1] -> out_width, act
 * after every hidden layer, none after the last. Parameters name.{i}.weight / name.{i}.bias. */
sm_module *sm_mlp_module(const char *name, const int *widths, int n_hidden, int out_width, sm_act act,
                         sm_error *err);
/* two-layer MLP F -> H -> F with act (the "ffn" layer): name.w1 (H,F) b1 w2 (F,H) b2 */
sm_module *sm_ffn_module(const char *name, int H, sm_act act, sm_error *err);

/* ---- containers ---- */
/* Runs children in order; the output of child i is the input of child i+1. Takes ownership of the
 * children. Child i's parameters are declared under "<name>.<i>" unless the child was given its
 * own name (non-empty). Children flagged residual get their input added to their output. */
sm_module *sm_seq_module(const char *name, sm_module *const *children, int n, sm_error *err);
int sm_seq_count(const sm_module *seq);
sm_module *sm_seq_child(const sm_module *seq, int i);
/* the output buffer of child i after a forward (B * out rows) */
const sm_real *sm_seq_output(const sm_module *seq, int i);
/* Forward / backward of children [first, last) only: in is child first's input. */
void sm_seq_forward_range(sm_module *seq, int first, int last, sm_real *out, const sm_real *in, int B,
                          const sm_ctx *ctx);
/* The container's backward with extra gradients on its children's outputs: extra[i] (B * out rows of
 * child i, or NULL) is added to child i's output gradient before child i's backward, for i < n - 1
 * (the last child's is dout). extra NULL: the plain backward. */
void sm_seq_backward_extra(sm_module *seq, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx,
                           const sm_real *const *extra);

#ifdef __cplusplus
}
#endif
#endif
