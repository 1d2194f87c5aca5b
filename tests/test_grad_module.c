/* Finite-difference gradient checks (double precision) of every module through the module API
 * (include/specmoe/nn/module.h): parameter gradients and the input gradient of
 * L = sum(out * G), with the backward started from dout = G. Also: gradients land in the view
 * passed at call time, taps see each linear layer's rows, and JSON descriptions round-trip. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "specmoe/nn/loss.h"
#include "specmoe/nn/module.h"
#include "specmoe/nn/moe.h"
#include "specmoe/nn/routers.h"

enum { B = 3 };

typedef struct {
    sm_module *m;
    sm_params ps;
    sm_real *x, *dx, *out, *G;
    size_t nin, nout;
    sm_rng rng;
} mctx;

static double mloss(void *p) {
    mctx *c = p;
    sm_ctx ctx = sm_ctx_make(&c->ps, NULL, 1);
    sm_module_forward(c->m, c->out, c->x, B, &ctx);
    double s = 0;
    for (size_t i = 0; i < c->nout; i++) s += (double)c->out[i] * c->G[i];
    return s;
}

static void mctx_init(mctx *c, sm_module *m, sm_shape in, uint64_t seed) {
    sm_error err = {0};
    memset(c, 0, sizeof *c);
    cr_assert(m, "construction failed");
    c->m = m;
    sm_rng_seed(&c->rng, seed);
    sm_params_init_table(&c->ps);
    cr_assert_eq(sm_module_declare(m, &c->ps, in, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_params_alloc(&c->ps, &err), SM_OK, "%s", err.msg);
    sm_params_initialize(&c->ps, &c->rng);
    cr_assert_eq(sm_module_reserve(m, B, &err), SM_OK, "%s", err.msg);
    c->nin = (size_t)B * sm_shape_numel(in);
    c->nout = (size_t)B * sm_shape_numel(m->out);
    c->x = calloc(c->nin, sizeof(sm_real));
    c->dx = calloc(c->nin, sizeof(sm_real));
    c->out = calloc(c->nout, sizeof(sm_real));
    c->G = calloc(c->nout, sizeof(sm_real));
    gc_fill_normal(c->x, c->nin, 1.0, &c->rng);
    gc_fill_normal(c->G, c->nout, 1.0, &c->rng);
}

static void mctx_free(mctx *c) {
    sm_module_free(c->m);
    sm_params_free(&c->ps);
    free(c->x), free(c->dx), free(c->out), free(c->G);
}

/* forward, backward from G, then every parameter and the input against central differences */
static void check_module(const char *what, sm_module *m, sm_shape in, uint64_t seed) {
    mctx c;
    mctx_init(&c, m, in, seed);
    mloss(&c);
    sm_params_zero_grad(&c.ps);
    sm_ctx ctx = sm_ctx_make(&c.ps, NULL, 1);
    sm_module_backward(m, c.dx, c.G, c.x, B, &ctx);
    char name[160];
    for (int i = 0; i < c.ps.n; i++) {
        snprintf(name, sizeof name, "%s:%s", what, c.ps.p[i].name);
        gc_check(name, sm_params_data(&c.ps, i), sm_params_grad(&c.ps, i), c.ps.p[i].numel, mloss, &c, &c.rng, 24);
    }
    snprintf(name, sizeof name, "%s:input", what);
    gc_check(name, c.x, c.dx, c.nin, mloss, &c, &c.rng, 24);
    mctx_free(&c);
}

static sm_error e;

Test(grad_module, dense_linear_act) {
    check_module("dense-tanh", sm_dense_module("d", 5, SM_ACT_TANH, &e), sm_shape_vec(7), 1);
    check_module("linear", sm_dense_module("d", 4, SM_ACT_NONE, &e), sm_shape_vec(6), 2);
    check_module("dense-on-image", sm_dense_module("d", 4, SM_ACT_GELU, &e), sm_shape_image(2, 3, 3), 3);
    check_module("act-silu", sm_act_module("a", SM_ACT_SILU, &e), sm_shape_vec(6), 4);
}

Test(grad_module, layernorm_ffn_mlp) {
    check_module("ln", sm_layernorm_module("ln", &e), sm_shape_vec(6), 5);
    check_module("ffn", sm_ffn_module("f", 5, SM_ACT_GELU, &e), sm_shape_vec(6), 6);
    int w[3] = {5, 7, 4};
    check_module("mlp3", sm_mlp_module("p", w, 3, 2, SM_ACT_TANH, &e), sm_shape_vec(6), 7);
    check_module("mlp0", sm_mlp_module("p", w, 0, 3, SM_ACT_TANH, &e), sm_shape_vec(4), 8);
}

Test(grad_module, conv_pools_tokens_flatten) {
    check_module("conv", sm_conv2d_module("c", 3, 3, 2, 1, SM_ACT_TANH, &e), sm_shape_image(2, 6, 6), 9);
    check_module("maxpool", sm_maxpool_module("m", 2, 2, &e), sm_shape_image(2, 4, 4), 10);
    check_module("avgpool", sm_avgpool_module("a", 2, 1, &e), sm_shape_image(2, 4, 4), 11);
    check_module("gap", sm_gap_module("g", &e), sm_shape_image(3, 3, 2), 12);
    check_module("tokens", sm_tokens_module("t", &e), sm_shape_image(3, 2, 4), 13);
    sm_shape toks = {4, 3, 1, 1};
    check_module("flatten", sm_flatten_module("f", &e), toks, 14);
}

/* SoftMoE-in-RL's tokenisers (src/nn/tokenize.c): PerFeat, Shuffled, the token pooling of the
 * tokenised baseline, and PerPatch as average pooling then PerConv */
Test(grad_module, tokenisers) {
    check_module("perfeat", sm_perfeat_module("t", &e), sm_shape_image(3, 2, 4), 40);
    check_module("shuffle", sm_shuffle_module("s", 7, &e), sm_shape_image(3, 2, 4), 41);
    sm_shape toks = {5, 3, 1, 1};
    check_module("tokpool-sum", sm_tokpool_module("p", 0, &e), toks, 42);
    check_module("tokpool-mean", sm_tokpool_module("p", 1, &e), toks, 43);
    sm_module *patch = sm_seq_module("pp", (sm_module *[]){sm_avgpool_module("", 2, 2, &e), sm_tokens_module("", &e)}, 2, &e);
    check_module("perpatch", patch, sm_shape_image(3, 4, 4), 44);
}

/* The shapes and values the paper's schemes give for one (c=2, h=2, w=3) encoder output. */
Test(grad_module, tokenisers_lay_out_tokens_as_the_paper_says) {
    sm_real x[12]; /* CHW: channel 0 = 0..5, channel 1 = 10..15 */
    for (int i = 0; i < 6; i++) x[i] = (sm_real)i, x[6 + i] = (sm_real)(10 + i);
    sm_params ps;
    sm_params_init_table(&ps);
    sm_ctx ctx = sm_ctx_make(&ps, NULL, 0);
    sm_error err = {0};
    sm_real out[12];
    /* PerFeat: 2 tokens of 6 (the channels) */
    sm_module *pf = sm_perfeat_module("pf", &err);
    cr_assert_eq(sm_module_declare(pf, &ps, sm_shape_image(2, 2, 3), &err), SM_OK);
    cr_expect(pf->out.rows == 2 && sm_shape_width(pf->out) == 6);
    cr_assert_eq(sm_module_reserve(pf, 1, &err), SM_OK);
    sm_module_forward(pf, out, x, 1, &ctx);
    cr_expect(out[0] == 0 && out[5] == 5 && out[6] == 10 && out[11] == 15);
    /* PerConv: 6 tokens of 2 (the positions) */
    sm_module *pc = sm_tokens_module("pc", &err);
    cr_assert_eq(sm_module_declare(pc, &ps, sm_shape_image(2, 2, 3), &err), SM_OK);
    cr_expect(pc->out.rows == 6 && sm_shape_width(pc->out) == 2);
    cr_assert_eq(sm_module_reserve(pc, 1, &err), SM_OK);
    sm_module_forward(pc, out, x, 1, &ctx);
    cr_expect(out[0] == 0 && out[1] == 10 && out[10] == 5 && out[11] == 15);
    /* Shuffled: a permutation of all 12 values, the same every time for the seed, another for another seed */
    sm_module *s1 = sm_shuffle_module("s", 3, &err), *s2 = sm_shuffle_module("s", 3, &err), *s3 = sm_shuffle_module("s", 4, &err);
    sm_real o1[12], o2[12], o3[12];
    sm_module *sh[3] = {s1, s2, s3};
    sm_real *os[3] = {o1, o2, o3};
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(sm_module_declare(sh[k], &ps, sm_shape_image(2, 2, 3), &err), SM_OK);
        cr_assert_eq(sm_module_reserve(sh[k], 1, &err), SM_OK);
        sm_module_forward(sh[k], os[k], x, 1, &ctx);
    }
    int same12 = 1, same13 = 1, mixes = 0;
    double sum = 0;
    for (int i = 0; i < 12; i++) {
        same12 &= o1[i] == o2[i];
        same13 &= o1[i] == o3[i];
        sum += o1[i];
        mixes |= (i < 6) != (o1[i] < 10); /* a channel-0 value lands in a channel-1 slot, or back */
    }
    cr_expect(same12 && !same13 && sum == 15 + 75 && mixes);
    /* tokpool: the sum and the mean of PerConv's 6 tokens */
    sm_module *tp = sm_tokpool_module("tp", 1, &err);
    sm_shape toks = {6, 2, 1, 1};
    cr_assert_eq(sm_module_declare(tp, &ps, toks, &err), SM_OK);
    cr_assert_eq(sm_module_reserve(tp, 1, &err), SM_OK);
    sm_module_forward(pc, out, x, 1, &ctx);
    sm_real pooled[2];
    sm_module_forward(tp, pooled, out, 1, &ctx);
    cr_expect_float_eq(pooled[0], 2.5, 1e-6);
    cr_expect_float_eq(pooled[1], 12.5, 1e-6);
    /* JSON keeps the seed and the pooling */
    char *j1 = sm_module_to_json(s3), *j2 = sm_module_to_json(tp);
    sm_module *b1 = sm_module_from_json(j1, &err), *b2 = sm_module_from_json(j2, &err);
    cr_assert(b1 && b2, "%s", err.msg);
    char *k1 = sm_module_to_json(b1), *k2 = sm_module_to_json(b2);
    cr_expect_str_eq(k1, j1);
    cr_expect_str_eq(k2, j2);
    cr_expect(strstr(j2, "\"mean\""), "%s", j2);
    cr_expect_null(sm_module_from_json("{\"kind\":\"tokpool\",\"name\":\"x\",\"pool\":\"max\"}", &err));
    cr_expect(strstr(err.msg, "'pool' must be"), "%s", err.msg);
    free(j1), free(j2), free(k1), free(k2);
    sm_module *all[] = {pf, pc, s1, s2, s3, tp, b1, b2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sm_module_free(all[i]);
    sm_params_free(&ps);
}

static sm_moe_config moe_cfg(const char *router, int E, int k, int H) {
    sm_moe_config mc;
    sm_moe_config_default(&mc);
    sm_router_config_set(&mc.router, router, NULL);
    mc.router.E = E;
    mc.router.k = k;
    if (!strcmp(router, "soft")) {
        sm_soft_opts(&mc.router)->slots = 2;
        sm_soft_opts(&mc.router)->soft_group = 4;
    }
    mc.H = H;
    mc.act = SM_ACT_TANH;
    return mc;
}

Test(grad_module, moe_over_tokens) {
    sm_moe_config mc = moe_cfg("topk", 4, 2, 5);
    sm_shape toks = {4, 6, 1, 1};
    check_module("moe-topk", sm_moe_module("moe", &mc, &e), toks, 15);
    mc = moe_cfg("soft", 3, 1, 4);
    check_module("moe-soft", sm_moe_module("moe", &mc, &e), toks, 16);
}

/* conv -> tokens -> SoftMoE -> flatten -> linear head: B observations become B*h*w tokens and back */
static sm_module *token_net(void) {
    sm_moe_config mc = moe_cfg("soft", 3, 1, 5);
    sm_module *ch[5] = {sm_conv2d_module("", 4, 3, 2, 1, SM_ACT_TANH, &e), sm_tokens_module("", &e),
                        sm_moe_module("", &mc, &e), sm_flatten_module("", &e), sm_dense_module("", 3, SM_ACT_NONE, &e)};
    return sm_seq_module("net", ch, 5, &e);
}

Test(grad_module, sequential_token_network) {
    check_module("seq", token_net(), sm_shape_image(2, 4, 4), 17);
    sm_module *m = sm_seq_module("res", (sm_module *[]){sm_ffn_module("", 4, SM_ACT_TANH, &e)}, 1, &e);
    sm_seq_child(m, 0)->residual = 1;
    check_module("residual", m, sm_shape_vec(5), 18);
}

/* The gradient view: backward into a separate buffer gives exactly what backward into the table's
 * own gradient gives, and leaves the table's gradient alone. */
Test(grad_module, gradients_go_to_the_view_of_the_call) {
    mctx c;
    mctx_init(&c, token_net(), sm_shape_image(2, 4, 4), 19);
    sm_ctx ctx = sm_ctx_make(&c.ps, NULL, 1);
    mloss(&c);
    sm_params_zero_grad(&c.ps);
    sm_module_backward(c.m, NULL, c.G, c.x, B, &ctx);
    sm_real *own = malloc(sizeof(sm_real) * c.ps.total), *other = calloc(c.ps.total, sizeof(sm_real));
    memcpy(own, c.ps.grad, sizeof(sm_real) * c.ps.total);
    sm_params_zero_grad(&c.ps);
    sm_params view = sm_params_view(&c.ps, other);
    sm_ctx vctx = sm_ctx_make(&view, NULL, 1);
    mloss(&c);
    sm_module_backward(c.m, NULL, c.G, c.x, B, &vctx);
    double nz = 0;
    for (size_t i = 0; i < c.ps.total; i++) {
        cr_expect_eq(other[i], own[i], "view gradient %zu differs", i);
        cr_expect_eq(c.ps.grad[i], 0, "table gradient %zu was written", i);
        nz += other[i] != 0;
    }
    cr_expect(nz > c.ps.total / 2, "the gradient is mostly zero");
    free(own), free(other);
    mctx_free(&c);
}

/* Taps: sum over rows of dout (x) in equals the weight gradient of each linear map */
typedef struct {
    sm_taps t;
    const sm_params *ps;
    sm_real *acc;
    int calls;
} tap_acc;
/* g (W,F) += sum over the N rows of dout_r (x) in_r: a weight gradient rebuilt from tapped rows */
static void add_outer(sm_real *g, const sm_real *dout, const sm_real *in, int N, int F, int W) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < W; o++)
            for (int f = 0; f < F; f++) g[(size_t)o * F + f] += dout[(size_t)n * W + o] * in[(size_t)n * F + f];
}
static void on_linear(sm_taps *t, const char *param, const sm_real *in, const sm_real *dout, int N, int F, int W) {
    tap_acc *a = (tap_acc *)t;
    int i = sm_params_find(a->ps, param);
    cr_assert(i >= 0, "tap names unknown tensor %s", param);
    add_outer(a->acc + a->ps->p[i].offset, dout, in, N, F, W);
    a->calls++;
}

/* forward, then a backward from G with taps t */
static void tapped_backward(mctx *c, sm_taps *t) {
    sm_ctx ctx = sm_ctx_make(&c->ps, NULL, 1);
    ctx.taps = t;
    mloss(c);
    sm_params_zero_grad(&c->ps);
    sm_module_backward(c->m, c->dx, c->G, c->x, B, &ctx);
}
/* every tensor whose name holds sub (and with ndim dimensions, if ndim > 0): its gradient rebuilt
 * from the tapped rows (acc) equals the backward's; returns how many tensors were compared */
static int expect_tapped_gradients(const mctx *c, const sm_real *acc, const char *sub, int ndim) {
    int seen = 0;
    for (int i = 0; i < c->ps.n; i++) {
        const char *nm = c->ps.p[i].name;
        if (!strstr(nm, sub) || (ndim > 0 && c->ps.p[i].ndim != ndim)) continue;
        seen++;
        for (size_t j = 0; j < c->ps.p[i].numel; j++)
            cr_expect_float_eq(acc[c->ps.p[i].offset + j], sm_params_grad(&c->ps, i)[j], 1e-12, "%s[%zu]", nm, j);
    }
    return seen;
}

Test(grad_module, taps_see_every_linear_row) {
    int w[2] = {5, 4};
    mctx c;
    mctx_init(&c, sm_mlp_module("p", w, 2, 3, SM_ACT_TANH, &e), sm_shape_vec(6), 20);
    tap_acc a = {{on_linear, NULL, NULL}, &c.ps, calloc(c.ps.total, sizeof(sm_real)), 0};
    tapped_backward(&c, &a.t);
    cr_expect_eq(a.calls, 3);
    cr_expect_eq(expect_tapped_gradients(&c, a.acc, "", 2), 3);
    free(a.acc);
    mctx_free(&c);
}

/* to_json -> from_json gives a module with the same parameters and the same outputs, and the same
 * description; returns the description (the caller frees it) */
static char *check_json_round_trip(mctx *c, sm_shape in) {
    char *json = sm_module_to_json(c->m);
    cr_assert(json);
    sm_error err = {0};
    sm_module *m2 = sm_module_from_json(json, &err);
    cr_assert(m2, "%s: %s", json, err.msg);
    sm_params ps2;
    sm_params_init_table(&ps2);
    cr_assert_eq(sm_module_declare(m2, &ps2, in, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(ps2.n, c->ps.n);
    for (int i = 0; i < ps2.n; i++) cr_expect_str_eq(ps2.p[i].name, c->ps.p[i].name);
    cr_assert_eq(sm_params_alloc(&ps2, &err), SM_OK);
    memcpy(ps2.data, c->ps.data, sizeof(sm_real) * c->ps.total);
    cr_assert_eq(sm_module_reserve(m2, B, &err), SM_OK, "%s", err.msg);
    sm_real *o2 = calloc(c->nout, sizeof(sm_real));
    sm_ctx ctx2 = sm_ctx_make(&ps2, NULL, 0), ctx = sm_ctx_make(&c->ps, NULL, 0);
    sm_module_forward(m2, o2, c->x, B, &ctx2);
    sm_module_forward(c->m, c->out, c->x, B, &ctx);
    for (size_t i = 0; i < c->nout; i++) cr_expect_eq(o2[i], c->out[i]);
    char *json2 = sm_module_to_json(m2);
    cr_expect_str_eq(json2, json);
    free(json2), free(o2);
    sm_module_free(m2);
    sm_params_free(&ps2);
    return json;
}

Test(grad_module, json_round_trip) {
    mctx c;
    mctx_init(&c, token_net(), sm_shape_image(2, 4, 4), 21);
    free(check_json_round_trip(&c, sm_shape_image(2, 4, 4)));
    sm_error err = {0};
    cr_expect_null(sm_module_from_json("{\"kind\":\"warp\"}", &err));
    cr_expect(strstr(err.msg, "unknown kind"), "%s", err.msg);
    mctx_free(&c);
}

/* the losses' written gradients against central differences in the prediction */
typedef struct {
    int which;
    sm_real pred[12], target[12], d[12], probs[12], losses[4];
    int y[4];
} lctx;
static double lloss(void *p) {
    lctx *c = p;
    sm_real d[12];
    if (c->which == 0) return sm_loss_crossentropy(d, c->probs, c->losses, c->pred, c->y, NULL, 4, 3, 1);
    if (c->which == 1) return sm_loss_mse(d, c->pred, c->target, 4, 3, 1);
    return sm_loss_huber(d, c->pred, c->target, 4, 3, 0.7, 1);
}
Test(grad_module, losses_write_their_output_gradient) {
    const char *names[3] = {"crossentropy", "mse", "huber"};
    for (int w = 0; w < 3; w++) {
        lctx c = {.which = w, .y = {0, 2, 1, 2}};
        sm_rng r;
        sm_rng_seed(&r, 30 + w);
        gc_fill_normal(c.pred, 12, 1.0, &r);
        gc_fill_normal(c.target, 12, 1.0, &r);
        for (int i = 0; i < 12; i++) c.d[i] = 99; /* written, not accumulated */
        if (w == 0) sm_loss_crossentropy(c.d, c.probs, c.losses, c.pred, c.y, NULL, 4, 3, 1);
        if (w == 1) sm_loss_mse(c.d, c.pred, c.target, 4, 3, 1);
        if (w == 2) sm_loss_huber(c.d, c.pred, c.target, 4, 3, 0.7, 1);
        gc_check(names[w], c.pred, c.d, 12, lloss, &c, &r, 12);
    }
}

/* experts deeper than two layers, with their own output width (SPHERE's per-expert MLP policies) */
Test(grad_module, deep_experts_with_their_own_output_width) {
    sm_moe_config mc = moe_cfg("topk", 3, 2, 4);
    mc.depth = 3;
    mc.out_dim = 2;
    check_module("moe-depth3", sm_moe_module("moe", &mc, &e), sm_shape_vec(5), 22);
    mc.expert_bias = 0;
    check_module("moe-depth2-nobias", sm_moe_module("moe", &mc, &e), sm_shape_vec(5), 23);
}

/* a gate network between the layer's input and the router */
Test(grad_module, gate_network) {
    int w[1] = {6};
    sm_moe_config mc = moe_cfg("topk", 3, 2, 4);
    mc.depth = 2;
    check_module("moe-gated", sm_moe_module_gated("moe", &mc, sm_mlp_module("", w, 1, 4, SM_ACT_TANH, &e), &e),
                 sm_shape_vec(5), 24);
}

/* L = sum(out * G) + sum over assignments of <feat_a, F_a>: the extra gradient F enters through
 * sm_moe_features' dfeat, as a penalty on expert features would */
typedef struct {
    mctx c;
    sm_real F[64 * 4];
} fctx;
static double floss(void *p) {
    fctx *f = p;
    double s = mloss(&f->c);
    sm_moe *moe = sm_moe_of(f->c.m);
    const sm_real *feat = sm_moe_features(moe, NULL);
    for (int a = 0; a < moe->route.n_assign; a++)
        for (int h = 0; h < moe->H; h++) s += (double)feat[a * moe->H + h] * f->F[(moe->route.token[a] % 8) * moe->H + h];
    return s;
}
Test(grad_module, extra_gradient_on_expert_features) {
    static fctx f;
    sm_moe_config mc = moe_cfg("topk", 3, 2, 4);
    mc.depth = 2;
    mctx_init(&f.c, sm_moe_module("moe", &mc, &e), sm_shape_vec(5), 25);
    gc_fill_normal(f.F, 64 * 4, 1.0, &f.c.rng);
    sm_moe *moe = sm_moe_of(f.c.m);
    sm_real *dfeat;
    floss(&f);
    sm_moe_features(moe, &dfeat); /* after the forward: a request lasts until the next one */
    for (int a = 0; a < moe->route.n_assign; a++)
        for (int h = 0; h < moe->H; h++) dfeat[a * moe->H + h] = f.F[(moe->route.token[a] % 8) * moe->H + h];
    sm_params_zero_grad(&f.c.ps);
    sm_ctx ctx = sm_ctx_make(&f.c.ps, NULL, 1);
    sm_module_backward(f.c.m, f.c.dx, f.c.G, f.c.x, B, &ctx);
    for (int i = 0; i < f.c.ps.n; i++)
        gc_check(f.c.ps.p[i].name, sm_params_data(&f.c.ps, i), sm_params_grad(&f.c.ps, i), f.c.ps.p[i].numel, floss, &f,
                 &f.c.rng, 24);
    gc_check("input", f.c.x, f.c.dx, f.c.nin, floss, &f, &f.c.rng, 24);
    mctx_free(&f.c);
}

/* taps inside the experts: summed over the routed rows, dout (x) in of every expert matrix equals
 * that matrix's weight gradient, for the first, hidden and last layers */
static void on_expert_linear(sm_taps *t, const char *param, int block, const int *token, const sm_real *in,
                             const sm_real *dout, int n, int F, int W) {
    tap_acc *a = (tap_acc *)t;
    int i = sm_params_find(a->ps, param);
    cr_assert(i >= 0, "tap names unknown tensor %s", param);
    cr_assert(token[0] >= 0 && token[n - 1] < B, "token out of range");
    add_outer(a->acc + a->ps->p[i].offset + (size_t)block * W * F, dout, in, n, F, W);
    a->calls++;
}

Test(grad_module, taps_see_every_expert_linear_map) {
    sm_moe_config mc = moe_cfg("topk", 3, 2, 4);
    mc.depth = 3;
    mctx c;
    mctx_init(&c, sm_moe_module("moe", &mc, &e), sm_shape_vec(5), 26);
    tap_acc a = {{NULL, on_expert_linear, NULL}, &c.ps, calloc(c.ps.total, sizeof(sm_real)), 0};
    tapped_backward(&c, &a.t);
    cr_expect(a.calls >= 4, "only %d expert taps", a.calls);
    cr_expect_eq(expect_tapped_gradients(&c, a.acc, ".experts.w", 0), 3); /* w1, wh, w2 */
    free(a.acc);
    mctx_free(&c);
}

/* ---- experts from a module factory (sm_moe_module_experts) ----------------------------------- */

/* expert e: dense(H, tanh) -> layernorm -> dense(O), a kind the built-in MLP experts cannot be;
 * user = {H, O, expert whose output width is O+1 (or -1)} */
static sm_module *seq_expert(void *user, int e, sm_error *err) {
    const int *w = user;
    sm_module *ch[3] = {sm_dense_module("", w[0], SM_ACT_TANH, err), sm_layernorm_module("", err),
                        sm_dense_module("", w[1] + (e == w[2]), SM_ACT_NONE, err)};
    return ch[0] && ch[1] && ch[2] ? sm_seq_module("", ch, 3, err) : NULL;
}
/* the built-in expert as a module: d -> H -> O with tanh (user = {H, O}) */
static sm_module *mlp_expert(void *user, int e, sm_error *err) {
    const int *w = user;
    (void)e;
    return sm_mlp_module("", w, 1, w[1], SM_ACT_TANH, err);
}

Test(grad_module, factory_experts_under_sparse_and_soft_routes) {
    int w[3] = {5, 3, -1};
    sm_shape toks = {4, 6, 1, 1};
    sm_moe_config mc = moe_cfg("topk", 4, 2, 99); /* H is the built-in experts' and unused here */
    check_module("moe-experts-topk", sm_moe_module_experts("moe", &mc, seq_expert, w, NULL, &e), toks, 40);
    mc = moe_cfg("soft", 3, 1, 99);
    check_module("moe-experts-soft", sm_moe_module_experts("moe", &mc, seq_expert, w, NULL, &e), toks, 41);
    int w2[1] = {4};
    mc = moe_cfg("topk", 3, 2, 99);
    check_module("moe-experts-gated",
                 sm_moe_module_experts("moe", &mc, seq_expert, w, sm_mlp_module("", w2, 1, 3, SM_ACT_TANH, &e), &e),
                 sm_shape_vec(5), 42);
}

/* copies tensor `from` of ps into tensor `to` of qs (same size), or its block `blk` of n values */
static void copy_block(sm_params *qs, const char *to, const sm_params *ps, const char *from, int blk, size_t n) {
    int i = sm_params_find(ps, from), j = sm_params_find(qs, to);
    cr_assert(i >= 0 && j >= 0, "%s / %s missing", from, to);
    cr_assert_eq(qs->p[j].numel, n);
    memcpy(sm_params_data(qs, j), sm_params_data(ps, i) + (size_t)blk * n, sizeof(sm_real) * n);
}
/* the same for a gradient: q's gradient `to` against block blk of p's `from` */
static double grad_block_diff(const sm_params *qs, const char *to, const sm_params *ps, const char *from, int blk) {
    int i = sm_params_find(ps, from), j = sm_params_find(qs, to);
    cr_assert(i >= 0 && j >= 0, "%s / %s missing", from, to);
    double worst = 0;
    for (size_t k = 0, n = qs->p[j].numel; k < n; k++) {
        double a = sm_params_grad(qs, j)[k], b = sm_params_grad(ps, i)[(size_t)blk * n + k];
        double r = fabs(a - b) / (fabs(b) + 1e-12);
        worst = r > worst ? r : worst;
    }
    return worst;
}

/* Factory experts that are the built-in two-layer MLP (sm_mlp_module d -> H -> O), loaded with the
 * built-in layer's values, give its output, input gradient and parameter gradients. They run the
 * same linear / activation kernels on the same gathered rows in the same order, so the results
 * are equal to the last bit; the check allows 1e-12 relative to stay meaningful if a kernel's
 * summation order ever differs between the two. */
static void check_factory_equals_builtin(const char *router, int E, int k, int train_rng) {
    enum { D = 5, H = 4, O = 3 };
    int w[2] = {H, O};
    sm_shape toks = {4, D, 1, 1};
    sm_moe_config mc = moe_cfg(router, E, k, H);
    mc.out_dim = O;
    mctx a, b;
    mctx_init(&a, sm_moe_module("moe", &mc, &e), toks, 50);
    mctx_init(&b, sm_moe_module_experts("moe", &mc, mlp_expert, w, NULL, &e), toks, 51);
    memcpy(b.x, a.x, sizeof(sm_real) * a.nin);
    memcpy(b.G, a.G, sizeof(sm_real) * a.nout);
    for (int i = 0; i < a.ps.n; i++)
        if (strstr(a.ps.p[i].name, ".router.")) copy_block(&b.ps, a.ps.p[i].name, &a.ps, a.ps.p[i].name, 0, a.ps.p[i].numel);
    const char *mine[4] = {"0.weight", "0.bias", "1.weight", "1.bias"}, *builtin[4] = {"w1", "b1", "w2", "b2"};
    const size_t numel[4] = {H * D, H, O * H, O};
    char to[96], from[96];
    for (int x = 0; x < E; x++)
        for (int t = 0; t < 4; t++) {
            snprintf(to, sizeof to, "moe.experts.%d.%s", x, mine[t]);
            snprintf(from, sizeof from, "moe.experts.%s", builtin[t]);
            copy_block(&b.ps, to, &a.ps, from, x, numel[t]);
        }
    sm_rng ra, rb;
    sm_rng_seed(&ra, 9), sm_rng_seed(&rb, 9);
    sm_ctx ca = sm_ctx_make(&a.ps, train_rng ? &ra : NULL, 1), cb = sm_ctx_make(&b.ps, train_rng ? &rb : NULL, 1);
    sm_module_forward(a.m, a.out, a.x, B, &ca);
    sm_module_forward(b.m, b.out, b.x, B, &cb);
    sm_params_zero_grad(&a.ps), sm_params_zero_grad(&b.ps);
    sm_module_backward(a.m, a.dx, a.G, a.x, B, &ca);
    sm_module_backward(b.m, b.dx, b.G, b.x, B, &cb);
    for (size_t i = 0; i < a.nout; i++) cr_expect_float_eq(b.out[i], a.out[i], 1e-12 * (fabs(a.out[i]) + 1e-12), "%s out[%zu]", router, i);
    for (size_t i = 0; i < a.nin; i++) cr_expect_float_eq(b.dx[i], a.dx[i], 1e-12 * (fabs(a.dx[i]) + 1e-12), "%s dx[%zu]", router, i);
    for (int i = 0; i < a.ps.n; i++)
        if (strstr(a.ps.p[i].name, ".router."))
            cr_expect_leq(grad_block_diff(&b.ps, a.ps.p[i].name, &a.ps, a.ps.p[i].name, 0), 1e-12, "%s %s", router, a.ps.p[i].name);
    for (int x = 0; x < E; x++)
        for (int t = 0; t < 4; t++) {
            snprintf(to, sizeof to, "moe.experts.%d.%s", x, mine[t]);
            snprintf(from, sizeof from, "moe.experts.%s", builtin[t]);
            cr_expect_leq(grad_block_diff(&b.ps, to, &a.ps, from, x), 1e-12, "%s %s", router, to);
        }
    mctx_free(&a), mctx_free(&b);
}

Test(grad_module, factory_mlp_experts_equal_the_builtin_experts) {
    check_factory_equals_builtin("topk", 4, 2, 0);
    check_factory_equals_builtin("topk", 4, 2, 1); /* experts one after another: a training RNG */
    check_factory_equals_builtin("soft", 3, 1, 0);
    check_factory_equals_builtin("expert-choice", 3, 1, 0);
}

/* a network with factory experts round-trips through JSON: same parameter names, same outputs,
 * same description */
Test(grad_module, factory_experts_json_round_trip) {
    int w[3] = {5, 3, -1};
    sm_moe_config mc = moe_cfg("topk", 3, 2, 7);
    sm_module *ch[2] = {sm_moe_module_experts("", &mc, seq_expert, w, NULL, &e), sm_dense_module("", 2, SM_ACT_NONE, &e)};
    mctx c;
    sm_shape toks = {4, 6, 1, 1};
    mctx_init(&c, sm_seq_module("net", ch, 2, &e), toks, 60);
    char *json = check_json_round_trip(&c, toks);
    cr_expect(strstr(json, "\"expert\":{\"kind\":\"seq\""), "%s", json);
    cr_expect_null(strstr(json, "experts.1"), "%s", json);
    free(json);
    mctx_free(&c);
}

/* what factory experts refuse, with a message that says why */
Test(grad_module, factory_experts_refusals) {
    sm_error err = {0};
    sm_params ps;
    int w[3] = {5, 3, 2}; /* expert 2 outputs 4 features, the others 3 */
    sm_moe_config mc = moe_cfg("topk", 3, 2, 7);
    sm_module *m = sm_moe_module_experts("moe", &mc, seq_expert, w, NULL, &err);
    cr_assert(m, "%s", err.msg);
    sm_params_init_table(&ps);
    cr_expect_neq(sm_module_declare(m, &ps, sm_shape_vec(6), &err), SM_OK);
    cr_expect(strstr(err.msg, "moe.experts.2: outputs 4 features, but expert 0 outputs 3"), "%s", err.msg);
    /* unlike experts: the description says so and is refused */
    char *json = sm_module_to_json(m);
    cr_expect(strstr(json, "\"experts_alike\":false"), "%s", json);
    cr_expect_null(sm_module_from_json(json, &err));
    cr_expect(strstr(err.msg, "not all alike"), "%s", err.msg);
    free(json);
    sm_module_free(m);
    sm_params_free(&ps);
    /* out_dim set and different from the experts' width */
    w[2] = -1;
    mc.out_dim = 2;
    m = sm_moe_module_experts("moe", &mc, seq_expert, w, NULL, &err);
    sm_params_init_table(&ps);
    cr_expect_neq(sm_module_declare(m, &ps, sm_shape_vec(6), &err), SM_OK);
    cr_expect(strstr(err.msg, "out_dim is 2"), "%s", err.msg);
    sm_module_free(m);
    sm_params_free(&ps);
    mc.out_dim = 0;
    /* shared experts, no factory */
    mc.n_shared = 1;
    cr_expect_null(sm_moe_module_experts("moe", &mc, seq_expert, w, NULL, &err));
    cr_expect(strstr(err.msg, "shared experts"), "%s", err.msg);
    mc.n_shared = 0;
    cr_expect_null(sm_moe_module_experts("moe", &mc, NULL, NULL, NULL, &err));
    cr_expect(strstr(err.msg, "no expert factory"), "%s", err.msg);
}

/* taps inside factory experts: each expert's linear maps are reported through expert_linear with
 * the token map of its rows, and rebuild its weight gradients */
Test(grad_module, taps_see_factory_expert_linear_maps) {
    int w[3] = {5, 3, -1};
    sm_moe_config mc = moe_cfg("topk", 3, 2, 7);
    mctx c;
    mctx_init(&c, sm_moe_module_experts("moe", &mc, seq_expert, w, NULL, &e), sm_shape_vec(5), 61);
    tap_acc a = {{NULL, on_expert_linear, NULL}, &c.ps, calloc(c.ps.total, sizeof(sm_real)), 0};
    tapped_backward(&c, &a.t);
    cr_expect_eq(expect_tapped_gradients(&c, a.acc, ".experts.", 2), 6); /* the dense weights of 3 experts */
    cr_expect(a.calls >= 2, "only %d expert taps", a.calls);
    free(a.acc);
    mctx_free(&c);
    /* SoftMoE slot rows mix tokens: nothing to report */
    mc = moe_cfg("soft", 3, 1, 7);
    mctx_init(&c, sm_moe_module_experts("moe", &mc, seq_expert, w, NULL, &e), sm_shape_vec(5), 62);
    tap_acc s = {{NULL, on_expert_linear, NULL}, &c.ps, NULL, 0};
    tapped_backward(&c, &s.t);
    cr_expect_eq(s.calls, 0);
    mctx_free(&c);
}
