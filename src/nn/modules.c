/* Leaf modules: thin wrappers over the forward/backward pairs of src/core (ops.c, conv.c) and the
 * MLP (mlp.c). Every kind is one `leaf` struct with the fields it uses, its own ops table, and a
 * constructor in include/specmoe/nn/module.h.
 *
 * Letters: B examples, N = B * rows rows, F input features per row, W output features per row,
 * H hidden width, K kernel, S stride, P padding.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/module_internal.h"
#include "specmoe/core/conv.h"
#include "specmoe/nn/mlp.h"

#define MLP_MAX_HIDDEN 8

typedef struct {
    sm_module base;
    int width, k, s, p;   /* dense / ffn width (H) / conv OC; kernel, stride, padding */
    sm_act act;
    int n_hidden, widths[MLP_MAX_HIDDEN]; /* mlp */
    int ip[2 * (MLP_MAX_HIDDEN + 1)];     /* parameter indices (weight, bias pairs) */
    sm_real *pre, *dpre;  /* (N, W) dense / conv pre-activation and its gradient; mlp: every layer's */
    sm_real *hid, *dh;    /* (N, H) ffn hidden activation, backward scratch; mlp: every layer's activation */
    sm_real *stats;       /* (2N) LayerNorm mean, rstd */
    sm_real *scratch;     /* (N, F) input-gradient scratch when the caller needs none */
    sm_real *col, *dcol;  /* conv im2col columns of the batch (CKK, N*P), kept for the backward; one image's */
    sm_real *tmp;         /* (W, N*P) conv GEMM output / transposed output gradient */
    sm_real *ws;          /* dense: the packed small GEMM's workspace (sm_linear_small_ws) for up to */
    int ws_rows;          /* this many rows */
    int *idx;             /* (N, W) max-pool argmax */
    int col_ok;           /* conv: col holds the last forward's columns (a direct forward writes none) */
    int pre_ok;           /* conv: pre holds the last forward's pre-activation (a direct ReLU forward writes none) */
} leaf;

static int rows(const sm_module *m, int B) { return B * m->in.rows; }
static int fin(const sm_module *m) { return sm_shape_width(m->in); }
static int fout(const sm_module *m) { return sm_shape_width(m->out); }

sm_module *sm_module_alloc(size_t bytes, const sm_module_ops *ops, const char *name, sm_error *err) {
    sm_module *m = calloc(1, bytes);
    if (!m) {
        sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", name ? name : "module");
        return NULL;
    }
    m->ops = ops;
    snprintf(m->name, sizeof m->name, "%s", name ? name : "");
    return m;
}

static sm_module *leaf_new(const sm_module_ops *ops, const char *name, sm_error *err) {
    leaf *l = (leaf *)sm_module_alloc(sizeof(leaf), ops, name, err);
    for (size_t i = 0; l && i < sizeof l->ip / sizeof l->ip[0]; i++) l->ip[i] = -1;
    return l ? &l->base : NULL;
}

static void leaf_destroy(sm_module *m) { free(m); }

/* name.<w> (out, in) and name.<b> (out), torch.nn.Linear's initialisation; flags added to both
 * (SM_PARAM_GRAD_CTX) */
static sm_status add_linear(sm_params *ps, const char *prefix, const char *w, const char *b, int out, int in,
                            int *iw, int *ib, unsigned flags, sm_error *err) {
    char name[SM_NAME_MAX];
    int64_t sw[2] = {out, in}, sb[1] = {out};
    if (sm_param_name(name, prefix, w)) return sm_fail(err, SM_ERR_ARG, "%s: name too long", prefix);
    if ((*iw = sm_params_add(ps, name, 2, sw, SM_INIT_UNIFORM_FANIN, in, 0, flags, err)) < 0) return SM_ERR_ARG;
    if (sm_param_name(name, prefix, b)) return sm_fail(err, SM_ERR_ARG, "%s: name too long", prefix);
    if ((*ib = sm_params_add(ps, name, 1, sb, SM_INIT_UNIFORM_FANIN, in, 0, SM_PARAM_NO_DECAY | flags, err)) < 0)
        return SM_ERR_ARG;
    return SM_OK;
}

static void tap_linear(const sm_ctx *ctx, const sm_params *ps, int iw, const sm_real *in, const sm_real *dout, int N,
                       int F, int W) {
    if (ctx->taps && ctx->taps->linear) ctx->taps->linear(ctx->taps, ps->p[iw].name, in, dout, N, F, W);
}

static void json_act(const leaf *l, cJSON *o) { cJSON_AddStringToObject(o, "act", sm_act_name(l->act)); }

/* ---- dense: linear then activation ---------------------------------------------------------- */

static sm_status dense_declare(sm_module *m, sm_params *ps, sm_error *err) {
    leaf *l = (leaf *)m;
    m->out = sm_shape_vec(l->width);
    m->out.rows = m->in.rows;
    /* its backward writes both gradients through the context (sm_ctx_grad_take), nothing else does */
    return add_linear(ps, m->name, "weight", "bias", l->width, fin(m), &l->ip[0], &l->ip[1], SM_PARAM_GRAD_CTX, err);
}
static void dense_reserve(sm_module *m, int B, sm_arena *a) {
    leaf *l = (leaf *)m;
    size_t n = l->act == SM_ACT_NONE ? 0 : (size_t)rows(m, B) * l->width;
    l->pre = sm_arena_take(a, n);
    l->dpre = sm_arena_take(a, n);
    /* the packed small GEMM (src/core/linear_small.c) at up to the batch's rows */
    const size_t nws = sm_linear_small_ws_upto(rows(m, B), fin(m), l->width, &l->ws_rows);
    l->ws = l->ws_rows ? sm_arena_take(a, nws) : NULL;
}
/* Rows beyond the packed product's reach (a batch's tokens through one dense layer: Fig. 5's
 * tokenised baseline, 32 observations x 64 tokens of 16) run SM_LINEAR_SMALL_CHUNK at a time on it when its
 * rule takes that many rows (every product with AVX-512), as an expert's rows do (moe.c,
 * EXPERT_CHUNK): OpenBLAS in one piece ran 2048 x 16 -> 512 at about 15% of the FMA peak
 * (BENCHMARKS.md, "Frames/s of every variant"). Each row's output is the same for any chunking; the
 * parameter gradients add the chunks in order. */
static int dense_chunk(const leaf *l, int N) {
    return N > l->ws_rows && l->ws_rows >= SM_LINEAR_SMALL_CHUNK ? SM_LINEAR_SMALL_CHUNK : N;
}

static void dense_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    const int N = rows(m, B), F = fin(m), W = l->width;
    const sm_real *w = sm_ctx_data(ctx, l->ip[0]), *b = sm_ctx_data(ctx, l->ip[1]);
    if (N == 1) { /* one row: gemv (an RL agent acting on one observation) */
        /* without an activation the linear map writes the output directly */
        sm_linear_forward_row(l->act == SM_ACT_NONE ? out : l->pre, in, w, b, F, W);
        if (l->act != SM_ACT_NONE) sm_act_forward(out, l->pre, (size_t)W, l->act);
        return;
    }
    const int c = dense_chunk(l, N);
    for (int r0 = 0; r0 < N; r0 += c) {
        const int n = N - r0 < c ? N - r0 : c;
        const size_t o = (size_t)r0 * W;
        sm_real *ws = n <= l->ws_rows ? l->ws : NULL;
        if (l->act == SM_ACT_NONE) sm_linear_forward_ws(out + o, in + (size_t)r0 * F, w, b, n, F, W, ws);
        else /* the ReLU in the packed product's tiles when it runs */
            sm_linear_forward_act_ws(l->pre + o, out + o, in + (size_t)r0 * F, w, b, n, F, W, ws, l->act);
    }
}
static void dense_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    int N = rows(m, B);
    const sm_real *dpre = dout;
    if (l->act != SM_ACT_NONE) {
        sm_act_backward_set(l->dpre, dout, l->pre, (size_t)N * l->width, l->act);
        dpre = l->dpre;
    }
    int set_w, set_b; /* both fresh or neither: sm_model_backward_set flags the two alike */
    sm_real *dw = sm_ctx_grad_take(ctx, l->ip[0], &set_w), *db = sm_ctx_grad_take(ctx, l->ip[1], &set_b);
    if (set_w != set_b) { /* not reached through sm_model_backward_set; accumulate into zeroes then */
        if (set_w) memset(dw, 0, sizeof(sm_real) * ctx->pv->p[l->ip[0]].numel);
        if (set_b) memset(db, 0, sizeof(sm_real) * ctx->pv->p[l->ip[1]].numel);
        set_w = 0;
    }
    const int F = fin(m), W = l->width, c = dense_chunk(l, N);
    for (int r0 = 0; r0 < N; r0 += c) { /* the first chunk sets the gradients (when set_w), the rest add */
        const int n = N - r0 < c ? N - r0 : c;
        sm_linear_backward_ex(din ? din + (size_t)r0 * F : NULL, dw, db, dpre + (size_t)r0 * W, in + (size_t)r0 * F,
                              sm_ctx_data(ctx, l->ip[0]), n, F, W, n <= l->ws_rows ? l->ws : NULL, r0 ? 0 : set_w);
    }
    tap_linear(ctx, ctx->pv, l->ip[0], in, dpre, N, F, W);
}
static void dense_json(const sm_module *m, cJSON *o) {
    cJSON_AddNumberToObject(o, "width", ((const leaf *)m)->width);
    json_act((const leaf *)m, o);
}
static double dense_macs(const sm_module *m) { return (double)m->in.rows * fin(m) * ((const leaf *)m)->width; }
static const sm_module_ops kDense = {"dense", dense_declare, dense_reserve, NULL, dense_forward, dense_backward,
                                     dense_json, leaf_destroy, dense_macs};

sm_module *sm_dense_module(const char *name, int width, sm_act act, sm_error *err) {
    if (width < 1) {
        sm_fail(err, SM_ERR_ARG, "%s: dense width must be >= 1", name);
        return NULL;
    }
    sm_module *m = leaf_new(&kDense, name, err);
    if (m) ((leaf *)m)->width = width, ((leaf *)m)->act = act;
    return m;
}

/* ---- activation ----------------------------------------------------------------------------- */

static sm_status same_shape(sm_module *m, sm_params *ps, sm_error *err) {
    (void)ps, (void)err;
    m->out = m->in;
    return SM_OK;
}
void sm_module_no_reserve(sm_module *m, int B, sm_arena *a) { (void)m, (void)B, (void)a; }
static void act_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    sm_act_forward(out, in, (size_t)B * sm_shape_numel(m->in), ((leaf *)m)->act);
}
static void act_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    if (din) sm_act_backward(din, dout, in, (size_t)B * sm_shape_numel(m->in), ((leaf *)m)->act);
}
static void act_json(const sm_module *m, cJSON *o) { json_act((const leaf *)m, o); }
static const sm_module_ops kAct = {"act", same_shape, sm_module_no_reserve, NULL, act_forward, act_backward, act_json, leaf_destroy, NULL};

sm_module *sm_act_module(const char *name, sm_act act, sm_error *err) {
    sm_module *m = leaf_new(&kAct, name, err);
    if (m) ((leaf *)m)->act = act;
    return m;
}

/* ---- LayerNorm ------------------------------------------------------------------------------ */

static sm_status ln_declare(sm_module *m, sm_params *ps, sm_error *err) {
    leaf *l = (leaf *)m;
    char name[SM_NAME_MAX];
    int64_t sh[1] = {fin(m)};
    m->out = m->in;
    if (sm_param_name(name, m->name, "weight")) return sm_fail(err, SM_ERR_ARG, "%s: name too long", m->name);
    if ((l->ip[0] = sm_params_add(ps, name, 1, sh, SM_INIT_ONE, 1, 0, SM_PARAM_NO_DECAY, err)) < 0) return SM_ERR_ARG;
    if (sm_param_name(name, m->name, "bias")) return sm_fail(err, SM_ERR_ARG, "%s: name too long", m->name);
    if ((l->ip[1] = sm_params_add(ps, name, 1, sh, SM_INIT_ZERO, 1, 0, SM_PARAM_NO_DECAY, err)) < 0) return SM_ERR_ARG;
    return SM_OK;
}
static void ln_reserve(sm_module *m, int B, sm_arena *a) {
    leaf *l = (leaf *)m;
    l->stats = sm_arena_take(a, 2 * (size_t)rows(m, B));
    l->scratch = sm_arena_take(a, (size_t)rows(m, B) * fin(m));
}
static void ln_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    int N = rows(m, B);
    sm_layernorm_forward(out, l->stats, l->stats + N, in, sm_ctx_data(ctx, l->ip[0]), sm_ctx_data(ctx, l->ip[1]), N,
                         fin(m));
}
static void ln_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    int N = rows(m, B);
    sm_real *dx = din; /* the kernel always writes an input gradient */
    if (!dx) memset(dx = l->scratch, 0, sizeof(sm_real) * (size_t)N * fin(m));
    sm_layernorm_backward(dx, sm_ctx_grad(ctx, l->ip[0]), sm_ctx_grad(ctx, l->ip[1]), dout, in,
                          sm_ctx_data(ctx, l->ip[0]), l->stats, l->stats + N, N, fin(m));
}
static const sm_module_ops kLn = {"ln", ln_declare, ln_reserve, NULL, ln_forward, ln_backward, NULL, leaf_destroy, NULL};

sm_module *sm_layernorm_module(const char *name, sm_error *err) { return leaf_new(&kLn, name, err); }

/* ---- conv2d then activation, pools ------------------------------------------------------------ */

sm_status sm_module_image_in(const sm_module *m, sm_error *err) {
    return m->in.rows == 1 ? SM_OK : sm_fail(err, SM_ERR_ARG, "%s: takes one image per example, not %d rows", m->name, m->in.rows);
}

static sm_status conv_declare(sm_module *m, sm_params *ps, sm_error *err) {
    leaf *l = (leaf *)m;
    sm_error e2; /* a separate buffer: its message is quoted into err */
    int oh, ow;
    if (sm_module_image_in(m, err) != SM_OK) return SM_ERR_ARG;
    if (sm_conv2d_shape(m->in.h, m->in.w, l->k, l->k, l->s, l->p, &oh, &ow, &e2) != SM_OK)
        return sm_fail(err, SM_ERR_ARG, "%s (conv): %s", m->name, e2.msg);
    if (sm_conv2d_col_size(m->in.c, m->in.h, m->in.w, l->k, l->k, l->s, l->p) == 0)
        return sm_fail(err, SM_ERR_ARG, "%s (conv): im2col buffer too large", m->name);
    m->out = sm_shape_image(l->width, oh, ow);
    char name[SM_NAME_MAX];
    int64_t sw[4] = {l->width, m->in.c, l->k, l->k}, sb[1] = {l->width};
    int fan = m->in.c * l->k * l->k;
    if (sm_param_name(name, m->name, "weight")) return sm_fail(err, SM_ERR_ARG, "%s: name too long", m->name);
    if ((l->ip[0] = sm_params_add(ps, name, 4, sw, SM_INIT_UNIFORM_FANIN, fan, 0, 0, err)) < 0) return SM_ERR_ARG;
    if (sm_param_name(name, m->name, "bias")) return sm_fail(err, SM_ERR_ARG, "%s: name too long", m->name);
    if ((l->ip[1] = sm_params_add(ps, name, 1, sb, SM_INIT_UNIFORM_FANIN, fan, 0, SM_PARAM_NO_DECAY, err)) < 0)
        return SM_ERR_ARG;
    return SM_OK;
}
static void conv_reserve(sm_module *m, int B, sm_arena *a) {
    leaf *l = (leaf *)m;
    size_t col = sm_conv2d_col_size(m->in.c, m->in.h, m->in.w, l->k, l->k, l->s, l->p);
    l->pre = sm_arena_take(a, (size_t)B * fout(m));
    l->dpre = sm_arena_take(a, (size_t)B * fout(m));
    l->col = sm_arena_take(a, (size_t)B * col);
    l->dcol = sm_arena_take(a, col);
    l->tmp = sm_arena_take(a, (size_t)B * fout(m));
}
/* Out of training (ctx->train = 0: a target network's forward, an agent's greedy step), where the
 * shape allows, the forward is direct - no im2col, the same bits (sm_conv2d_forward_direct) - and a
 * backward that follows after all makes the columns from its input. In training the forward writes
 * them: measured on the MinAtar DQN (`dqn_update`, Zen 5), the direct forward saves 11 us of the
 * packed one's 91, and columns made in the backward cost 17.
 * Where the direct weight gradient runs (sm_conv2d_dweight_direct: those shapes on an AVX-512 CPU)
 * the training forward is direct too, and neither pass writes columns: measured on the MinAtar DQN,
 * BENCHMARKS.md "DQN on MinAtar".
 * A ReLU layer's activation is stored by the forward's register tiles with its output (the `_ex`
 * forwards), not by a pass of its own; out of training only the activation is written, and a
 * backward that follows after all runs the direct forward again for the pre-activation. */
static void conv_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    const sm_real *w = sm_ctx_data(ctx, l->ip[0]), *b = sm_ctx_data(ctx, l->ip[1]);
    /* a ReLU layer's activation is stored by the forward's tiles as they store pre (sm_conv2d_forward_ex) */
    sm_real *relu = l->act == SM_ACT_RELU ? out : NULL;
    if (!ctx->train && sm_conv2d_direct(m->in.c, m->in.h, m->in.w, l->width, l->k, l->k, l->s, l->p)) {
        /* no backward is expected: with the ReLU, only its output */
        sm_conv2d_forward_direct_ex(relu ? NULL : l->pre, relu, in, w, b, B, m->in.c, m->in.h, m->in.w, l->width, l->k, l->k);
        l->col_ok = 0, l->pre_ok = !relu;
    } else if (sm_conv2d_dweight_direct(m->in.c, m->in.h, m->in.w, l->width, l->k, l->k, l->s, l->p)) {
        /* training, and the backward's weight gradient needs no columns either */
        sm_conv2d_forward_direct_ex(l->pre, relu, in, w, b, B, m->in.c, m->in.h, m->in.w, l->width, l->k, l->k);
        l->col_ok = 0, l->pre_ok = 1;
    } else {
        sm_conv2d_forward_ex(l->pre, relu, l->col, l->tmp, in, w, b, B, m->in.c, m->in.h, m->in.w, l->width, l->k, l->k, l->s,
                             l->p);
        l->col_ok = 1, l->pre_ok = 1;
    }
    if (!relu) sm_act_forward(out, l->pre, (size_t)B * fout(m), l->act);
}
static void conv_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    const sm_real *w = sm_ctx_data(ctx, l->ip[0]);
    sm_real *dw = sm_ctx_grad(ctx, l->ip[0]), *db = sm_ctx_grad(ctx, l->ip[1]);
    if (!l->pre_ok) { /* after a direct ReLU forward: the forward again for the pre-activation */
        sm_conv2d_forward_direct(l->pre, in, w, sm_ctx_data(ctx, l->ip[1]), B, m->in.c, m->in.h, m->in.w, l->width, l->k, l->k);
        l->pre_ok = 1;
    }
    sm_act_backward_set(l->dpre, dout, l->pre, (size_t)B * fout(m), l->act);
    if (!l->col_ok && sm_conv2d_dweight_direct(m->in.c, m->in.h, m->in.w, l->width, l->k, l->k, l->s, l->p)) {
        sm_conv2d_backward_direct(din, dw, db, l->dcol, l->dpre, in, w, B, m->in.c, m->in.h, m->in.w, l->width, l->k, l->k);
        return;
    }
    if (!l->col_ok && dw) { /* the weight gradient reads the forward's columns */
        sm_conv2d_columns(l->col, in, B, m->in.c, m->in.h, m->in.w, l->width, l->k, l->k, l->s, l->p);
        l->col_ok = 1;
    }
    sm_conv2d_backward(din, dw, db, l->dcol, l->tmp, l->dpre, l->col, w, B, m->in.c, m->in.h, m->in.w, l->width, l->k, l->k,
                       l->s, l->p);
}
static void kernel_json(const sm_module *m, cJSON *o) {
    const leaf *l = (const leaf *)m;
    if (l->width) cJSON_AddNumberToObject(o, "width", l->width);
    cJSON_AddNumberToObject(o, "k", l->k);
    cJSON_AddNumberToObject(o, "stride", l->s);
    if (l->width) {
        cJSON_AddNumberToObject(o, "pad", l->p);
        json_act(l, o);
    }
}
static double conv_macs(const sm_module *m) { /* OC x (C K K) per output position */
    const leaf *l = (const leaf *)m;
    return (double)fout(m) * m->in.c * l->k * l->k;
}
static const sm_module_ops kConv = {"conv", conv_declare, conv_reserve, NULL, conv_forward, conv_backward,
                                    kernel_json, leaf_destroy, conv_macs};

sm_module *sm_conv2d_module(const char *name, int oc, int K, int stride, int pad, sm_act act, sm_error *err) {
    if (oc < 1 || K < 1 || stride < 1 || pad < 0) {
        sm_fail(err, SM_ERR_ARG, "%s: conv needs channels, kernel and stride >= 1 and padding >= 0", name);
        return NULL;
    }
    sm_module *m = leaf_new(&kConv, name, err);
    if (m) {
        leaf *l = (leaf *)m;
        l->width = oc, l->k = K, l->s = stride, l->p = pad, l->act = act;
    }
    return m;
}

static sm_status pool_declare(sm_module *m, sm_params *ps, sm_error *err) {
    (void)ps;
    leaf *l = (leaf *)m;
    sm_error e2;
    int oh, ow;
    if (sm_module_image_in(m, err) != SM_OK) return SM_ERR_ARG;
    if (sm_conv2d_shape(m->in.h, m->in.w, l->k, l->k, l->s, 0, &oh, &ow, &e2) != SM_OK)
        return sm_fail(err, SM_ERR_ARG, "%s (%s): %s", m->name, m->ops->kind, e2.msg);
    m->out = sm_shape_image(m->in.c, oh, ow);
    return SM_OK;
}
static void maxpool_reserve(sm_module *m, int B, sm_arena *a) {
    ((leaf *)m)->idx = sm_arena_take_int(a, (size_t)B * fout(m));
}
static void maxpool_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    leaf *l = (leaf *)m;
    sm_maxpool2d_forward(out, l->idx, in, B, m->in.c, m->in.h, m->in.w, l->k, l->s);
}
static void maxpool_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx, (void)in;
    leaf *l = (leaf *)m;
    if (din) sm_maxpool2d_backward(din, dout, l->idx, B, m->in.c, m->in.h, m->in.w, l->k, l->s);
}
static const sm_module_ops kMaxpool = {"maxpool", pool_declare, maxpool_reserve, NULL, maxpool_forward,
                                       maxpool_backward, kernel_json, leaf_destroy, NULL};
static void avgpool_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    leaf *l = (leaf *)m;
    sm_avgpool2d_forward(out, in, B, m->in.c, m->in.h, m->in.w, l->k, l->s);
}
static void avgpool_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx, (void)in;
    leaf *l = (leaf *)m;
    if (din) sm_avgpool2d_backward(din, dout, B, m->in.c, m->in.h, m->in.w, l->k, l->s);
}
static const sm_module_ops kAvgpool = {"avgpool", pool_declare, sm_module_no_reserve, NULL, avgpool_forward,
                                       avgpool_backward, kernel_json, leaf_destroy, NULL};

static sm_module *pool_new(const sm_module_ops *ops, const char *name, int K, int stride, sm_error *err) {
    if (K < 1 || stride < 1) {
        sm_fail(err, SM_ERR_ARG, "%s: pooling needs kernel and stride >= 1", name);
        return NULL;
    }
    sm_module *m = leaf_new(ops, name, err);
    if (m) ((leaf *)m)->k = K, ((leaf *)m)->s = stride;
    return m;
}
sm_module *sm_maxpool_module(const char *name, int K, int stride, sm_error *err) {
    return pool_new(&kMaxpool, name, K, stride, err);
}
sm_module *sm_avgpool_module(const char *name, int K, int stride, sm_error *err) {
    return pool_new(&kAvgpool, name, K, stride, err);
}

static sm_status gap_declare(sm_module *m, sm_params *ps, sm_error *err) {
    (void)ps;
    if (sm_module_image_in(m, err) != SM_OK) return SM_ERR_ARG;
    m->out = sm_shape_image(m->in.c, 1, 1);
    return SM_OK;
}
static void gap_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    sm_adaptive_avgpool2d_forward(out, in, B, m->in.c, m->in.h, m->in.w, 1, 1);
}
static void gap_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx, (void)in;
    if (din) sm_adaptive_avgpool2d_backward(din, dout, B, m->in.c, m->in.h, m->in.w, 1, 1);
}
static const sm_module_ops kGap = {"gap", gap_declare, sm_module_no_reserve, NULL, gap_forward, gap_backward, NULL, leaf_destroy, NULL};
sm_module *sm_gap_module(const char *name, sm_error *err) { return leaf_new(&kGap, name, err); }

/* ---- flatten and tokens: row-count changes ---------------------------------------------------- */

static sm_status flatten_declare(sm_module *m, sm_params *ps, sm_error *err) {
    (void)ps, (void)err;
    m->out = sm_shape_vec(m->in.rows * fin(m));
    return SM_OK;
}
/* the memory layout of (B, R, F) and (B, 1, R*F) is the same: a copy */
void sm_module_copy_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    memcpy(out, in, sizeof(sm_real) * (size_t)B * sm_shape_numel(m->in));
}
void sm_module_add_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx, (void)in;
    if (din)
        for (size_t i = 0, n = (size_t)B * sm_shape_numel(m->in); i < n; i++) din[i] += dout[i];
}
static const sm_module_ops kFlatten = {"flatten", flatten_declare, sm_module_no_reserve, NULL, sm_module_copy_forward, sm_module_add_backward, NULL,
                                       leaf_destroy, NULL};
sm_module *sm_flatten_module(const char *name, sm_error *err) { return leaf_new(&kFlatten, name, err); }

static sm_status tokens_declare(sm_module *m, sm_params *ps, sm_error *err) {
    (void)ps;
    if (sm_module_image_in(m, err) != SM_OK) return SM_ERR_ARG;
    m->out = sm_shape_vec(m->in.c);
    m->out.rows = m->in.h * m->in.w;
    return SM_OK;
}
/* out (B, h*w, c) [b][p][ch] = in (B, c, h*w) [b][ch][p] */
static void tokens_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    const int C = m->in.c, P = m->in.h * m->in.w;
    for (int b = 0; b < B; b++)
        for (int ch = 0; ch < C; ch++)
            for (int p = 0; p < P; p++) out[((size_t)b * P + p) * C + ch] = in[((size_t)b * C + ch) * P + p];
}
static void tokens_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx, (void)in;
    if (!din) return;
    const int C = m->in.c, P = m->in.h * m->in.w;
    for (int b = 0; b < B; b++)
        for (int ch = 0; ch < C; ch++)
            for (int p = 0; p < P; p++) din[((size_t)b * C + ch) * P + p] += dout[((size_t)b * P + p) * C + ch];
}
static const sm_module_ops kTokens = {"tokens", tokens_declare, sm_module_no_reserve, NULL, tokens_forward, tokens_backward,
                                      NULL, leaf_destroy, NULL};
sm_module *sm_tokens_module(const char *name, sm_error *err) { return leaf_new(&kTokens, name, err); }

/* ---- ffn: two-layer MLP F -> H -> F ---------------------------------------------------------- */

static sm_status ffn_declare(sm_module *m, sm_params *ps, sm_error *err) {
    leaf *l = (leaf *)m;
    m->out = sm_shape_vec(fin(m));
    m->out.rows = m->in.rows;
    if (add_linear(ps, m->name, "w1", "b1", l->width, fin(m), &l->ip[0], &l->ip[1], 0, err) != SM_OK) return SM_ERR_ARG;
    return add_linear(ps, m->name, "w2", "b2", fin(m), l->width, &l->ip[2], &l->ip[3], 0, err);
}
static void ffn_reserve(sm_module *m, int B, sm_arena *a) {
    leaf *l = (leaf *)m;
    size_t NH = (size_t)rows(m, B) * l->width;
    l->pre = sm_arena_take(a, NH);
    l->hid = sm_arena_take(a, NH);
    l->dh = sm_arena_take(a, NH);
}
static sm_mlp_weights ffn_weights(const leaf *l, const sm_ctx *ctx) {
    sm_mlp_weights w = {sm_ctx_data(ctx, l->ip[0]), sm_ctx_data(ctx, l->ip[1]), sm_ctx_data(ctx, l->ip[2]),
                        sm_ctx_data(ctx, l->ip[3])};
    return w;
}
static void ffn_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    sm_mlp_forward(out, l->pre, l->hid, in, ffn_weights(l, ctx), l->act, rows(m, B), fin(m), l->width, fin(m));
}
static void ffn_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    sm_mlp_grads g = {sm_ctx_grad(ctx, l->ip[0]), sm_ctx_grad(ctx, l->ip[1]), sm_ctx_grad(ctx, l->ip[2]),
                      sm_ctx_grad(ctx, l->ip[3])};
    sm_mlp_backward(din, g, l->dh, dout, l->pre, l->hid, in, ffn_weights(l, ctx), l->act, rows(m, B), fin(m), l->width,
                    fin(m));
}
static void ffn_json(const sm_module *m, cJSON *o) {
    cJSON_AddNumberToObject(o, "hidden", ((const leaf *)m)->width);
    json_act((const leaf *)m, o);
}
static double ffn_macs(const sm_module *m) { return 2.0 * m->in.rows * fin(m) * ((const leaf *)m)->width; }
static const sm_module_ops kFfn = {"ffn", ffn_declare, ffn_reserve, NULL, ffn_forward, ffn_backward, ffn_json,
                                   leaf_destroy, ffn_macs};
sm_module *sm_ffn_module(const char *name, int H, sm_act act, sm_error *err) {
    if (H < 1) {
        sm_fail(err, SM_ERR_ARG, "%s: ffn hidden width must be >= 1", name);
        return NULL;
    }
    sm_module *m = leaf_new(&kFfn, name, err);
    if (m) ((leaf *)m)->width = H, ((leaf *)m)->act = act;
    return m;
}

/* ---- mlp: n hidden layers ------------------------------------------------------------------- */

/* layer j maps width(j-1) -> width(j); width(-1) = F, width(n_hidden) = out width */
static int mlp_w(const leaf *l, int j) { return j < 0 ? fin(&l->base) : j < l->n_hidden ? l->widths[j] : l->width; }
static size_t mlp_off(const leaf *l, int j, int N) {
    size_t o = 0;
    for (int i = 0; i < j; i++) o += (size_t)N * mlp_w(l, i);
    return o;
}

static sm_status mlp_declare(sm_module *m, sm_params *ps, sm_error *err) {
    leaf *l = (leaf *)m;
    m->out = sm_shape_vec(l->width);
    m->out.rows = m->in.rows;
    for (int j = 0; j <= l->n_hidden; j++) {
        char prefix[SM_NAME_MAX], num[16];
        snprintf(num, sizeof num, "%d", j);
        if (sm_param_name(prefix, m->name, num)) return sm_fail(err, SM_ERR_ARG, "%s: name too long", m->name);
        if (add_linear(ps, prefix, "weight", "bias", mlp_w(l, j), mlp_w(l, j - 1), &l->ip[2 * j], &l->ip[2 * j + 1], 0, err))
            return SM_ERR_ARG;
    }
    return SM_OK;
}
static void mlp_reserve(sm_module *m, int B, sm_arena *a) {
    leaf *l = (leaf *)m;
    size_t n = mlp_off(l, l->n_hidden, rows(m, B)), wmax = 0;
    for (int j = -1; j <= l->n_hidden; j++) wmax = (size_t)mlp_w(l, j) > wmax ? (size_t)mlp_w(l, j) : wmax;
    l->pre = sm_arena_take(a, n);  /* hidden pre-activations, layer after layer */
    l->hid = sm_arena_take(a, n);  /* hidden activations */
    l->dpre = sm_arena_take(a, (size_t)rows(m, B) * wmax);
    l->dh = sm_arena_take(a, (size_t)rows(m, B) * wmax);
}
static void mlp_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    int N = rows(m, B);
    const sm_real *x = in;
    for (int j = 0; j <= l->n_hidden; j++) {
        sm_real *y = j < l->n_hidden ? l->pre + mlp_off(l, j, N) : out;
        sm_linear_forward(y, x, sm_ctx_data(ctx, l->ip[2 * j]), sm_ctx_data(ctx, l->ip[2 * j + 1]), N, mlp_w(l, j - 1),
                          mlp_w(l, j));
        if (j < l->n_hidden) {
            sm_act_forward(l->hid + mlp_off(l, j, N), y, (size_t)N * mlp_w(l, j), l->act);
            x = l->hid + mlp_off(l, j, N);
        }
    }
}
static void mlp_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    leaf *l = (leaf *)m;
    int N = rows(m, B);
    const sm_real *dy = dout; /* gradient w.r.t. layer j's linear output */
    for (int j = l->n_hidden; j >= 0; j--) {
        const sm_real *x = j ? l->hid + mlp_off(l, j - 1, N) : in;
        sm_real *dx = j ? l->dh : din;
        if (j) memset(dx, 0, sizeof(sm_real) * (size_t)N * mlp_w(l, j - 1));
        sm_linear_backward(dx, sm_ctx_grad(ctx, l->ip[2 * j]), sm_ctx_grad(ctx, l->ip[2 * j + 1]), dy, x,
                           sm_ctx_data(ctx, l->ip[2 * j]), N, mlp_w(l, j - 1), mlp_w(l, j));
        tap_linear(ctx, ctx->pv, l->ip[2 * j], x, dy, N, mlp_w(l, j - 1), mlp_w(l, j));
        if (j) { /* through the activation of hidden layer j-1 */
            memcpy(l->dpre, l->dh, sizeof(sm_real) * (size_t)N * mlp_w(l, j - 1));
            sm_act_backward_inplace(l->dpre, l->pre + mlp_off(l, j - 1, N), (size_t)N * mlp_w(l, j - 1), l->act);
            dy = l->dpre;
        }
    }
}
static void mlp_json(const sm_module *m, cJSON *o) {
    const leaf *l = (const leaf *)m;
    cJSON_AddItemToObject(o, "hidden", cJSON_CreateIntArray(l->widths, l->n_hidden));
    cJSON_AddNumberToObject(o, "width", l->width);
    json_act(l, o);
}
static double mlp_macs(const sm_module *m) {
    const leaf *l = (const leaf *)m;
    double n = 0;
    for (int j = 0; j <= l->n_hidden; j++) n += (double)mlp_w(l, j - 1) * mlp_w(l, j);
    return n * m->in.rows;
}
static const sm_module_ops kMlp = {"mlp", mlp_declare, mlp_reserve, NULL, mlp_forward, mlp_backward, mlp_json,
                                   leaf_destroy, mlp_macs};

sm_module *sm_mlp_module(const char *name, const int *widths, int n_hidden, int out_width, sm_act act, sm_error *err) {
    if (n_hidden < 0 || n_hidden > MLP_MAX_HIDDEN || out_width < 1) {
        sm_fail(err, SM_ERR_ARG, "%s: an mlp takes 0..%d hidden layers and an output width >= 1", name, MLP_MAX_HIDDEN);
        return NULL;
    }
    for (int j = 0; j < n_hidden; j++)
        if (widths[j] < 1) {
            sm_fail(err, SM_ERR_ARG, "%s: mlp hidden widths must be >= 1", name);
            return NULL;
        }
    sm_module *m = leaf_new(&kMlp, name, err);
    if (m) {
        leaf *l = (leaf *)m;
        l->n_hidden = n_hidden;
        memcpy(l->widths, widths, sizeof(int) * (size_t)n_hidden);
        l->width = out_width;
        l->act = act;
    }
    return m;
}

/* ---- JSON registry ---------------------------------------------------------------------------- */

static int jint(const cJSON *o, const char *k, int def, int *bad) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) return def;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble || v->valuedouble < -1e9 || v->valuedouble > 1e9) {
        *bad = 1;
        return def;
    }
    return (int)v->valuedouble;
}

sm_module *sm_module_from_json_object(const cJSON *o, sm_error *err) {
    const cJSON *jk = cJSON_GetObjectItemCaseSensitive(o, "kind"), *jn = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *ja = cJSON_GetObjectItemCaseSensitive(o, "act");
    if (!cJSON_IsObject(o) || !cJSON_IsString(jk) || (jn && !cJSON_IsString(jn)) || (ja && !cJSON_IsString(ja))) {
        sm_fail(err, SM_ERR_FORMAT, "module: 'kind' (and 'name', 'act') must be strings");
        return NULL;
    }
    const char *kind = jk->valuestring, *name = jn ? jn->valuestring : "";
    if (strlen(name) >= SM_NAME_MAX) {
        sm_fail(err, SM_ERR_FORMAT, "module: name too long");
        return NULL;
    }
    sm_act act = SM_ACT_NONE;
    if (ja && sm_act_parse(ja->valuestring, &act)) {
        sm_fail(err, SM_ERR_FORMAT, "module '%s': unknown activation '%s'", name, ja->valuestring);
        return NULL;
    }
    int bad = 0, width = jint(o, "width", 0, &bad), k = jint(o, "k", 0, &bad), s = jint(o, "stride", 0, &bad);
    int pad = jint(o, "pad", 0, &bad), residual = jint(o, "residual", 0, &bad);
    if (bad) {
        sm_fail(err, SM_ERR_FORMAT, "module '%s': a numeric field is not an integer", name);
        return NULL;
    }
    sm_module *m = NULL;
    if (!strcmp(kind, "dense")) m = sm_dense_module(name, width, act, err);
    else if (!strcmp(kind, "act")) m = sm_act_module(name, act, err);
    else if (!strcmp(kind, "ln")) m = sm_layernorm_module(name, err);
    else if (!strcmp(kind, "conv")) m = sm_conv2d_module(name, width, k, s, pad, act, err);
    else if (!strcmp(kind, "maxpool")) m = sm_maxpool_module(name, k, s, err);
    else if (!strcmp(kind, "avgpool")) m = sm_avgpool_module(name, k, s, err);
    else if (!strcmp(kind, "gap")) m = sm_gap_module(name, err);
    else if (!strcmp(kind, "flatten")) m = sm_flatten_module(name, err);
    else if (!strcmp(kind, "tokens")) m = sm_tokens_module(name, err);
    else if (!strcmp(kind, "perfeat")) m = sm_perfeat_module(name, err);
    else if (!strcmp(kind, "shuffle")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(o, "seed");
        char *end = NULL;
        unsigned long long seed = cJSON_IsString(js) ? strtoull(js->valuestring, &end, 10) : 0;
        if (!cJSON_IsString(js) || !end || *end || !js->valuestring[0]) {
            sm_fail(err, SM_ERR_FORMAT, "module '%s': 'seed' must be a decimal string", name);
            return NULL;
        }
        m = sm_shuffle_module(name, (uint64_t)seed, err);
    } else if (!strcmp(kind, "tokpool")) {
        const cJSON *jp = cJSON_GetObjectItemCaseSensitive(o, "pool");
        if (!cJSON_IsString(jp) || (strcmp(jp->valuestring, "sum") && strcmp(jp->valuestring, "mean"))) {
            sm_fail(err, SM_ERR_FORMAT, "module '%s': 'pool' must be \"sum\" or \"mean\"", name);
            return NULL;
        }
        m = sm_tokpool_module(name, !strcmp(jp->valuestring, "mean"), err);
    }
    else if (!strcmp(kind, "ffn")) m = sm_ffn_module(name, jint(o, "hidden", 0, &bad), act, err);
    else if (!strcmp(kind, "mlp")) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "hidden");
        int w[MLP_MAX_HIDDEN], n = cJSON_GetArraySize(h);
        if (!cJSON_IsArray(h) || n > MLP_MAX_HIDDEN) {
            sm_fail(err, SM_ERR_FORMAT, "module '%s': 'hidden' must be an array of at most %d widths", name, MLP_MAX_HIDDEN);
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            const cJSON *v = cJSON_GetArrayItem(h, i);
            w[i] = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1 << 20 ? (int)v->valuedouble : -1;
        }
        m = sm_mlp_module(name, w, n, width, act, err);
    } else if (!strcmp(kind, "seq")) m = sm_seq_from_json(o, name, err);
    else if (!strcmp(kind, "moe")) m = sm_moe_from_json(o, name, err);
    else sm_fail(err, SM_ERR_FORMAT, "module '%s': unknown kind '%s'", name, kind);
    if (m) m->residual = residual != 0;
    return m;
}
