/* Finite-difference gradient checks (double precision) of every elementary module and loss. */
#include <criterion/criterion.h>
#include <string.h>

#include "gradcheck.h"
#include "specmoe/nn/mlp.h"
#include "specmoe/core/ops.h"

enum { T = 5, C = 7, OC = 4, H = 6, V = 5 };

/* L = sum(out * G) for a module out = f(inputs) */
typedef struct {
    int which; /* module under test */
    sm_act act;
    sm_real inp[T * C], w[OC * C], b[OC], G[T * OC * 2];
    sm_real out[T * C * 2], tmp[T * C * 2], mean[T], rstd[T];
    sm_real lnw[C], lnb[C];
    sm_real temp;
    int targets[T];
    unsigned char mask[V];
    int use_mask, use_bias;
} ctx_t;

enum { M_LINEAR, M_ACT, M_LAYERNORM, M_SOFTMAX, M_CE, M_MSE };

static double dot(const sm_real *a, const sm_real *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static double loss(void *p) {
    ctx_t *c = p;
    switch (c->which) {
    case M_LINEAR:
        sm_linear_forward(c->out, c->inp, c->w, c->use_bias ? c->b : NULL, T, C, OC);
        return dot(c->out, c->G, T * OC);
    case M_ACT:
        sm_act_forward(c->out, c->inp, T * C, c->act);
        return dot(c->out, c->G, T * C);
    case M_LAYERNORM:
        sm_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->lnw, c->lnb, T, C);
        return dot(c->out, c->G, T * C);
    case M_SOFTMAX:
        sm_softmax_forward(c->out, c->inp, c->temp, T, C);
        return dot(c->out, c->G, T * C);
    case M_CE:
        return sm_crossentropy_forward(c->tmp, c->out, c->inp, c->targets, c->use_mask ? c->mask : NULL, T, V);
    case M_MSE:
        return sm_mse_forward(c->inp, c->G, T * C);
    }
    return 0;
}

static ctx_t *setup(int which, uint64_t seed) {
    static ctx_t c;
    memset(&c, 0, sizeof c);
    c.which = which;
    sm_rng r;
    sm_rng_seed(&r, seed);
    gc_fill_normal(c.inp, T * C, 1, &r);
    gc_fill_normal(c.w, OC * C, 0.5, &r);
    gc_fill_normal(c.b, OC, 0.5, &r);
    gc_fill_normal(c.G, T * OC * 2, 1, &r);
    gc_fill_normal(c.lnw, C, 1, &r);
    gc_fill_normal(c.lnb, C, 1, &r);
    c.temp = 1;
    for (int t = 0; t < T; t++) c.targets[t] = (int)sm_rng_below(&r, V);
    c.use_bias = 1;
    return &c;
}

Test(grad, linear_with_and_without_bias) {
    for (int bias = 0; bias < 2; bias++) {
        ctx_t *c = setup(M_LINEAR, 1 + bias);
        c->use_bias = bias;
        sm_real dinp[T * C] = {0}, dw[OC * C] = {0}, db[OC] = {0};
        loss(c);
        sm_linear_backward(dinp, dw, bias ? db : NULL, c->G, c->inp, c->w, T, C, OC);
        sm_rng r;
        sm_rng_seed(&r, 99);
        gc_check("linear.inp", c->inp, dinp, T * C, loss, c, &r, 40);
        gc_check("linear.weight", c->w, dw, OC * C, loss, c, &r, 40);
        if (bias) gc_check("linear.bias", c->b, db, OC, loss, c, &r, 40);
    }
}

Test(grad, activations) {
    sm_act acts[] = {SM_ACT_NONE, SM_ACT_RELU, SM_ACT_GELU, SM_ACT_TANH, SM_ACT_SILU};
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
        ctx_t *c = setup(M_ACT, 10 + a);
        c->act = acts[a];
        sm_real dinp[T * C] = {0};
        sm_act_backward(dinp, c->G, c->inp, T * C, c->act);
        /* the in-place form must agree with the accumulating one */
        sm_real d2[T * C];
        memcpy(d2, c->G, sizeof d2);
        sm_act_backward_inplace(d2, c->inp, T * C, c->act);
        for (int i = 0; i < T * C; i++) cr_expect_float_eq(d2[i], dinp[i], 1e-12);
        sm_rng r;
        sm_rng_seed(&r, 5);
        gc_check(sm_act_name(c->act), c->inp, dinp, T * C, loss, c, &r, T * C);
    }
}

Test(grad, layernorm) {
    ctx_t *c = setup(M_LAYERNORM, 3);
    sm_real dinp[T * C] = {0}, dw[C] = {0}, db[C] = {0};
    loss(c);
    sm_layernorm_backward(dinp, dw, db, c->G, c->inp, c->lnw, c->mean, c->rstd, T, C);
    sm_rng r;
    sm_rng_seed(&r, 6);
    gc_check("layernorm.inp", c->inp, dinp, T * C, loss, c, &r, T * C);
    gc_check("layernorm.weight", c->lnw, dw, C, loss, c, &r, C);
    gc_check("layernorm.bias", c->lnb, db, C, loss, c, &r, C);
}

Test(grad, softmax_with_temperature) {
    double temps[] = {1.0, 0.3, 2.5};
    for (int i = 0; i < 3; i++) {
        ctx_t *c = setup(M_SOFTMAX, 20 + i);
        c->temp = temps[i];
        loss(c);
        sm_real dinp[T * C] = {0};
        sm_softmax_backward(dinp, c->G, c->out, c->temp, T, C);
        sm_rng r;
        sm_rng_seed(&r, 7);
        gc_check("softmax.inp", c->inp, dinp, T * C, loss, c, &r, T * C);
    }
}

Test(grad, crossentropy_plain_and_masked) {
    for (int masked = 0; masked < 2; masked++) {
        ctx_t *c = setup(M_CE, 30 + masked);
        c->use_mask = masked;
        /* task-incremental mask: classes 1 and 3 are out of the current task */
        for (int v = 0; v < V; v++) c->mask[v] = (v == 1 || v == 3) ? 0 : 1;
        if (masked)
            for (int t = 0; t < T; t++) c->targets[t] = (t % 3 == 0) ? 0 : (t % 3 == 1) ? 2 : 4;
        double l = loss(c);
        cr_expect(isfinite(l));
        sm_real d[T * C] = {0};
        sm_crossentropy_backward(d, c->out, c->targets, 1, T, V);
        if (masked) /* masked classes get exactly zero probability and gradient */
            for (int t = 0; t < T; t++) cr_expect(d[t * V + 1] == 0 && d[t * V + 3] == 0);
        sm_rng r;
        sm_rng_seed(&r, 8);
        gc_check(masked ? "crossentropy.masked" : "crossentropy", c->inp, d, T * V, loss, c, &r, T * V);
    }
}

Test(grad, mse) {
    ctx_t *c = setup(M_MSE, 40);
    sm_real d[T * C] = {0};
    sm_mse_backward(d, c->inp, c->G, 1, T * C);
    sm_rng r;
    sm_rng_seed(&r, 9);
    gc_check("mse.pred", c->inp, d, T * C, loss, c, &r, T * C);
}

/* MLP expert: its own closure, since W1 is (H,C) */
typedef struct {
    sm_act act;
    sm_real inp[T * C], w1[H * C], b1[H], w2[OC * H], b2[OC], G[T * OC];
    sm_real out[T * OC], hpre[T * H], h[T * H], dh[T * H];
} mlp_ctx;

static double mlp_loss(void *p) {
    mlp_ctx *c = p;
    sm_mlp_weights w = {c->w1, c->b1, c->w2, c->b2};
    sm_mlp_forward(c->out, c->hpre, c->h, c->inp, w, c->act, T, C, H, OC);
    return dot(c->out, c->G, T * OC);
}

Test(grad, mlp_expert) {
    sm_act acts[] = {SM_ACT_RELU, SM_ACT_GELU, SM_ACT_SILU, SM_ACT_TANH};
    for (int a = 0; a < 4; a++) {
        static mlp_ctx c;
        c.act = acts[a];
        sm_rng r;
        sm_rng_seed(&r, 60 + a);
        gc_fill_normal(c.inp, T * C, 1, &r);
        gc_fill_normal(c.w1, H * C, 0.5, &r);
        gc_fill_normal(c.b1, H, 0.5, &r);
        gc_fill_normal(c.w2, OC * H, 0.5, &r);
        gc_fill_normal(c.b2, OC, 0.5, &r);
        gc_fill_normal(c.G, T * OC, 1, &r);
        sm_real dinp[T * C] = {0}, dw1[H * C] = {0}, db1[H] = {0}, dw2[OC * H] = {0}, db2[OC] = {0};
        mlp_loss(&c);
        sm_mlp_weights w = {c.w1, c.b1, c.w2, c.b2};
        sm_mlp_grads g = {dw1, db1, dw2, db2};
        sm_mlp_backward(dinp, g, c.dh, c.G, c.hpre, c.h, c.inp, w, c.act, T, C, H, OC);
        gc_check("mlp.inp", c.inp, dinp, T * C, mlp_loss, &c, &r, T * C);
        gc_check("mlp.w1", c.w1, dw1, H * C, mlp_loss, &c, &r, 30);
        gc_check("mlp.b1", c.b1, db1, H, mlp_loss, &c, &r, H);
        gc_check("mlp.w2", c.w2, dw2, OC * H, mlp_loss, &c, &r, 30);
        gc_check("mlp.b2", c.b2, db2, OC, mlp_loss, &c, &r, OC);
    }
}
