/* Finite-difference gradient checks (double precision) of the image ops in include/specmoe/conv.h:
 * conv2d w.r.t. input, weight and bias; max, average and adaptive average pooling w.r.t. the input.
 * Every check differentiates L = sum(out * G) for a fixed random upstream gradient G. Also: conv2d
 * against a naive 7-loop direct convolution, accumulation (+=) and the NULL gradients of the
 * backward, pooling edge cases (ties, NaN, bins), and sm_conv2d_shape refusing impossible sizes.
 *
 * Run from the repo root: make build/tests/test_grad_conv && build/tests/test_grad_conv
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "specmoe/core/conv.h"

static double dot(const sm_real *a, const sm_real *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static sm_real *alloc0(size_t n) {
    sm_real *p = calloc(n ? n : 1, sizeof(sm_real));
    cr_assert(p, "out of memory");
    return p;
}

static double max_abs_diff(const sm_real *a, const sm_real *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || isnan(d)) m = d;
    }
    return m;
}

/* ------------------------------------------------------------------------------------------ conv2d */

typedef struct {
    int B, C, H, W, OC, KH, KW, stride, pad, bias;
} conv_cfg;

/* with/without bias, stride 1 and 2, pad 0 and 1, non-square kernels and inputs, 1x1, C > 1, OC > 1 */
static const conv_cfg CONV_CFGS[] = {
    {2, 3, 6, 5, 4, 3, 2, 1, 0, 1}, /* non-square kernel, stride 1, no padding */
    {2, 2, 7, 6, 3, 3, 3, 2, 1, 1}, /* stride 2, padding 1 (the stem's usual layer) */
    {2, 3, 5, 7, 2, 2, 3, 2, 0, 0}, /* stride 2, no padding, no bias, W not reached by the last window */
    {2, 2, 5, 4, 3, 3, 3, 1, 1, 0}, /* "same" padding, no bias */
    {2, 3, 4, 5, 2, 1, 1, 1, 0, 1}, /* 1x1 convolution */
    {2, 2, 4, 4, 3, 3, 5, 2, 1, 1}, /* kernel wider than the unpadded input (5 > 4, fits 4 + 2) */
    {2, 2, 10, 10, 3, 3, 3, 1, 0, 1}, /* MinAtar's layer (8-wide output rows: im2col's unrolled copy) */
};
#define N_CONV (sizeof CONV_CFGS / sizeof CONV_CFGS[0])

typedef struct {
    conv_cfg k;
    int OH, OW;
    size_t nin, nw, nout, ncol;
    sm_real *inp, *w, *b, *G, *out, *col, *dcol, *tmp; /* col: the batch's columns (B * ncol) */
} conv_ctx;

static void conv_open(conv_ctx *c, const conv_cfg *k, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->k = *k;
    sm_error err = {0};
    cr_assert_eq(sm_conv2d_shape(k->H, k->W, k->KH, k->KW, k->stride, k->pad, &c->OH, &c->OW, &err), SM_OK, "%s",
                 err.msg);
    c->nin = (size_t)k->B * k->C * k->H * k->W;
    c->nw = (size_t)k->OC * k->C * k->KH * k->KW;
    c->nout = (size_t)k->B * k->OC * c->OH * c->OW;
    c->ncol = sm_conv2d_col_size(k->C, k->H, k->W, k->KH, k->KW, k->stride, k->pad);
    cr_assert_eq(c->ncol, (size_t)k->C * k->KH * k->KW * c->OH * c->OW);
    c->inp = alloc0(c->nin);
    c->w = alloc0(c->nw);
    c->b = alloc0((size_t)k->OC);
    c->G = alloc0(c->nout);
    c->out = alloc0(c->nout);
    c->col = alloc0((size_t)k->B * c->ncol);
    c->dcol = alloc0(c->ncol);
    c->tmp = alloc0(c->nout);
    sm_rng r;
    sm_rng_seed(&r, seed);
    gc_fill_normal(c->inp, c->nin, 1, &r);
    gc_fill_normal(c->w, c->nw, 0.5, &r);
    gc_fill_normal(c->b, (size_t)k->OC, 0.5, &r);
    gc_fill_normal(c->G, c->nout, 1, &r);
}

static void conv_close(conv_ctx *c) {
    free(c->inp);
    free(c->w);
    free(c->b);
    free(c->G);
    free(c->out);
    free(c->col);
    free(c->dcol);
    free(c->tmp);
}

static void conv_fwd(conv_ctx *c) {
    const conv_cfg *k = &c->k;
    sm_conv2d_forward(c->out, c->col, c->tmp, c->inp, c->w, k->bias ? c->b : NULL, k->B, k->C, k->H, k->W, k->OC, k->KH,
                      k->KW, k->stride, k->pad);
}

static double conv_loss(void *p) {
    conv_ctx *c = p;
    conv_fwd(c);
    return dot(c->out, c->G, c->nout);
}

/* a forward first: the backward reads the columns it wrote */
static void conv_bwd(conv_ctx *c, sm_real *dinp, sm_real *dw, sm_real *db) {
    const conv_cfg *k = &c->k;
    conv_fwd(c);
    sm_conv2d_backward(dinp, dw, db, c->dcol, c->tmp, c->G, c->col, c->w, k->B, k->C, k->H, k->W, k->OC, k->KH,
                       k->KW, k->stride, k->pad);
}

/* The definition, written out: 7 loops, zero padding by bounds checks, no im2col, no BLAS. */
static void conv_naive(sm_real *out, const sm_real *inp, const sm_real *w, const sm_real *bias, const conv_cfg *k,
                       int OH, int OW) {
    for (int b = 0; b < k->B; b++)
        for (int o = 0; o < k->OC; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    double s = bias ? bias[o] : 0;
                    for (int c = 0; c < k->C; c++)
                        for (int p = 0; p < k->KH; p++)
                            for (int q = 0; q < k->KW; q++) {
                                int ih = i * k->stride - k->pad + p, iw = j * k->stride - k->pad + q;
                                if (ih < 0 || ih >= k->H || iw < 0 || iw >= k->W) continue;
                                s += (double)w[((o * k->C + c) * k->KH + p) * k->KW + q] *
                                     inp[((b * k->C + c) * k->H + ih) * k->W + iw];
                            }
                    out[((b * k->OC + o) * OH + i) * OW + j] = (sm_real)s;
                }
}

Test(grad_conv, conv2d_forward_matches_naive_direct_convolution) {
    for (size_t t = 0; t < N_CONV; t++) {
        conv_ctx c;
        conv_open(&c, &CONV_CFGS[t], 100 + t);
        /* poison the output and the scratch: the forward must write every value it owns */
        for (size_t i = 0; i < c.nout; i++) c.out[i] = NAN;
        for (size_t i = 0; i < c.k.B * c.ncol; i++) c.col[i] = NAN;
        for (size_t i = 0; i < c.nout; i++) c.tmp[i] = NAN;
        conv_fwd(&c);
        sm_real *ref = alloc0(c.nout);
        conv_naive(ref, c.inp, c.w, c.k.bias ? c.b : NULL, &c.k, c.OH, c.OW);
        double d = max_abs_diff(c.out, ref, c.nout);
        cr_expect(d < 1e-12, "conv config %zu: max|im2col+GEMM - naive| = %.3g", t, d);
        free(ref);
        conv_close(&c);
    }
}

Test(grad_conv, conv2d_input_weight_bias) {
    double worst = 0, sc;
    for (size_t t = 0; t < N_CONV; t++) {
        conv_ctx c;
        conv_open(&c, &CONV_CFGS[t], 200 + t);
        sm_real *dinp = alloc0(c.nin), *dw = alloc0(c.nw), *db = alloc0((size_t)c.k.OC);
        /* poison the scratch too: the backward must not read stale values out of dcol / tmp (col is
         * the forward's, which conv_bwd runs first) */
        for (size_t i = 0; i < c.k.B * c.ncol; i++) c.col[i] = NAN;
        for (size_t i = 0; i < c.ncol; i++) c.dcol[i] = NAN;
        for (size_t i = 0; i < c.nout; i++) c.tmp[i] = NAN;
        conv_bwd(&c, dinp, dw, c.k.bias ? db : NULL);
        sm_rng r;
        sm_rng_seed(&r, 300 + t);
        char what[64];
        snprintf(what, sizeof what, "conv%zu.inp", t);
        if ((sc = gc_check(what, c.inp, dinp, c.nin, conv_loss, &c, &r, 80)) > worst) worst = sc;
        snprintf(what, sizeof what, "conv%zu.weight", t);
        if ((sc = gc_check(what, c.w, dw, c.nw, conv_loss, &c, &r, 80)) > worst) worst = sc;
        if (c.k.bias) {
            snprintf(what, sizeof what, "conv%zu.bias", t);
            if ((sc = gc_check(what, c.b, db, (size_t)c.k.OC, conv_loss, &c, &r, c.k.OC)) > worst) worst = sc;
        }
        free(dinp);
        free(dw);
        free(db);
        conv_close(&c);
    }
    printf("gradcheck conv2d: %zu configurations, worst score %.3g (<= 1 passes)\n", N_CONV, worst);
    fflush(stdout);
}

/* Backward accumulates: a second call adds the same amounts again; NULL gradients are skipped and do
 * not change the others. */
Test(grad_conv, conv2d_backward_accumulates_and_skips_null) {
    conv_ctx c;
    conv_open(&c, &CONV_CFGS[1], 7);
    sm_real *dinp = alloc0(c.nin), *dw = alloc0(c.nw), *db = alloc0((size_t)c.k.OC);
    conv_bwd(&c, dinp, dw, db);
    sm_real *dinp1 = alloc0(c.nin), *dw1 = alloc0(c.nw), *db1 = alloc0((size_t)c.k.OC);
    memcpy(dinp1, dinp, sizeof(sm_real) * c.nin);
    memcpy(dw1, dw, sizeof(sm_real) * c.nw);
    memcpy(db1, db, sizeof(sm_real) * (size_t)c.k.OC);
    conv_bwd(&c, dinp, dw, db);
    for (size_t i = 0; i < c.nin; i++) cr_expect_float_eq(dinp[i], 2 * dinp1[i], 1e-12);
    for (size_t i = 0; i < c.nw; i++) cr_expect_float_eq(dw[i], 2 * dw1[i], 1e-12);
    for (int o = 0; o < c.k.OC; o++) cr_expect_float_eq(db[o], 2 * db1[o], 1e-12);
    /* each gradient alone equals its part of the full call */
    sm_real *a = alloc0(c.nin), *bw = alloc0(c.nw), *bb = alloc0((size_t)c.k.OC);
    conv_bwd(&c, a, NULL, NULL);
    conv_bwd(&c, NULL, bw, NULL);
    conv_bwd(&c, NULL, NULL, bb);
    cr_expect(max_abs_diff(a, dinp1, c.nin) == 0, "dinp alone differs");
    cr_expect(max_abs_diff(bw, dw1, c.nw) == 0, "dweight alone differs");
    cr_expect(max_abs_diff(bb, db1, (size_t)c.k.OC) == 0, "dbias alone differs");
    free(a);
    free(bw);
    free(bb);
    free(dinp);
    free(dw);
    free(db);
    free(dinp1);
    free(dw1);
    free(db1);
    conv_close(&c);
}

/* The adjoint of conv_naive: dinp and dweight accumulated by the same 7 loops. */
static void conv_naive_backward(sm_real *dinp, sm_real *dw, const sm_real *dout, const sm_real *inp,
                                const sm_real *w, const conv_cfg *k, int OH, int OW) {
    for (int b = 0; b < k->B; b++)
        for (int o = 0; o < k->OC; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    const sm_real g = dout[((b * k->OC + o) * OH + i) * OW + j];
                    for (int c = 0; c < k->C; c++)
                        for (int p = 0; p < k->KH; p++)
                            for (int q = 0; q < k->KW; q++) {
                                int ih = i * k->stride - k->pad + p, iw = j * k->stride - k->pad + q;
                                if (ih < 0 || ih >= k->H || iw < 0 || iw >= k->W) continue;
                                size_t xi = (size_t)((b * k->C + c) * k->H + ih) * k->W + iw;
                                size_t wi = (size_t)((o * k->C + c) * k->KH + p) * k->KW + q;
                                dinp[xi] += w[wi] * g;
                                dw[wi] += inp[xi] * g;
                            }
                }
}

/* Sizes past the threshold where im2col / col2im and the pooling loops split over threads (more than
 * 65536 values): the results must equal the serial definitions. */
Test(grad_conv, threaded_sizes_match_serial_definitions) {
    const conv_cfg big[] = {{2, 8, 32, 32, 16, 3, 3, 1, 1, 1}, {2, 12, 65, 63, 4, 4, 3, 2, 1, 0}};
    for (size_t t = 0; t < 2; t++) {
        conv_ctx c;
        conv_open(&c, &big[t], 900 + t);
        conv_fwd(&c);
        sm_real *ref = alloc0(c.nout);
        conv_naive(ref, c.inp, c.w, c.k.bias ? c.b : NULL, &c.k, c.OH, c.OW);
        double d = max_abs_diff(c.out, ref, c.nout);
        cr_expect(d < 1e-12, "big conv %zu forward: max|diff| %.3g", t, d);
        sm_real *dinp = alloc0(c.nin), *dw = alloc0(c.nw), *rinp = alloc0(c.nin), *rw = alloc0(c.nw);
        conv_bwd(&c, dinp, dw, NULL);
        conv_naive_backward(rinp, rw, c.G, c.inp, c.w, &c.k, c.OH, c.OW);
        d = max_abs_diff(dinp, rinp, c.nin);
        cr_expect(d < 1e-11, "big conv %zu dinp: max|diff| %.3g", t, d);
        d = max_abs_diff(dw, rw, c.nw);
        cr_expect(d < 1e-10, "big conv %zu dweight: max|diff| %.3g", t, d); /* sums of 2048 products */
        free(ref);
        free(dinp);
        free(dw);
        free(rinp);
        free(rw);
        conv_close(&c);
    }
    /* pooling: the whole batch at once (threaded over planes) against one plane at a time (serial) */
    enum { B = 2, C = 16, H = 64, W = 48, NIN = B * C * H * W };
    sm_real *x = alloc0(NIN), *d1 = alloc0(NIN), *d2 = alloc0(NIN), *y1 = alloc0(NIN), *y2 = alloc0(NIN);
    sm_real *g = alloc0(NIN);
    int *i1 = calloc(NIN, sizeof(int)), *i2 = calloc(NIN, sizeof(int));
    cr_assert(i1 && i2);
    sm_rng r;
    sm_rng_seed(&r, 77);
    gc_fill_normal(x, NIN, 1, &r);
    gc_fill_normal(g, NIN, 1, &r);
    for (int op = 0; op < 3; op++) {
        const int K = 3, S = 2, OH = op == 2 ? 5 : (H - K) / S + 1, OW = op == 2 ? 7 : (W - K) / S + 1;
        memset(d1, 0, sizeof(sm_real) * NIN);
        memset(d2, 0, sizeof(sm_real) * NIN);
        if (op == 0) {
            sm_maxpool2d_forward(y1, i1, x, B, C, H, W, K, S);
            sm_maxpool2d_backward(d1, g, i1, B, C, H, W, K, S);
        } else if (op == 1) {
            sm_avgpool2d_forward(y1, x, B, C, H, W, K, S);
            sm_avgpool2d_backward(d1, g, B, C, H, W, K, S);
        } else {
            sm_adaptive_avgpool2d_forward(y1, x, B, C, H, W, OH, OW);
            sm_adaptive_avgpool2d_backward(d1, g, B, C, H, W, OH, OW);
        }
        for (int pl = 0; pl < B * C; pl++) {
            const sm_real *xp = x + (size_t)pl * H * W, *gp = g + (size_t)pl * OH * OW;
            sm_real *yp = y2 + (size_t)pl * OH * OW, *dp = d2 + (size_t)pl * H * W;
            int *ip = i2 + (size_t)pl * OH * OW;
            if (op == 0) {
                sm_maxpool2d_forward(yp, ip, xp, 1, 1, H, W, K, S);
                sm_maxpool2d_backward(dp, gp, ip, 1, 1, H, W, K, S);
            } else if (op == 1) {
                sm_avgpool2d_forward(yp, xp, 1, 1, H, W, K, S);
                sm_avgpool2d_backward(dp, gp, 1, 1, H, W, K, S);
            } else {
                sm_adaptive_avgpool2d_forward(yp, xp, 1, 1, H, W, OH, OW);
                sm_adaptive_avgpool2d_backward(dp, gp, 1, 1, H, W, OH, OW);
            }
        }
        size_t nout = (size_t)B * C * OH * OW;
        cr_expect(max_abs_diff(y1, y2, nout) == 0, "pool op %d: batched forward differs from per-plane", op);
        cr_expect(max_abs_diff(d1, d2, NIN) == 0, "pool op %d: batched backward differs from per-plane", op);
        if (op == 0) cr_expect(memcmp(i1, i2, sizeof(int) * nout) == 0, "maxpool indices differ");
    }
    free(x);
    free(d1);
    free(d2);
    free(y1);
    free(y2);
    free(g);
    free(i1);
    free(i2);
}

Test(grad_conv, conv2d_shape_refuses_impossible_sizes) {
    sm_error err = {0};
    int OH = -7, OW = -7;
    /* a 4x4 kernel cannot fit a 3x5 input without padding: refused, naming the sizes, outputs untouched */
    cr_expect_eq(sm_conv2d_shape(3, 5, 4, 4, 1, 0, &OH, &OW, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "4 x 4") && strstr(err.msg, "3 x 5"), "message does not name the sizes: %s", err.msg);
    cr_expect(OH == -7 && OW == -7);
    cr_expect_eq(sm_conv2d_col_size(2, 3, 5, 4, 4, 1, 0), 0);
    /* ... only in the dimension that is too small */
    cr_expect_eq(sm_conv2d_shape(8, 3, 3, 4, 1, 0, &OH, &OW, &err), SM_ERR_ARG);
    /* padding can make it fit: 3 + 2*1 = 5 >= 5 */
    cr_expect_eq(sm_conv2d_shape(3, 3, 5, 5, 1, 1, &OH, &OW, &err), SM_OK, "%s", err.msg);
    cr_expect(OH == 1 && OW == 1);
    cr_expect_eq(sm_conv2d_shape(3, 3, 5, 6, 1, 1, &OH, &OW, &err), SM_ERR_ARG);
    /* stride, padding, kernel and input sizes */
    cr_expect_eq(sm_conv2d_shape(8, 8, 3, 3, 0, 0, &OH, &OW, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "stride 0"), "%s", err.msg);
    cr_expect_eq(sm_conv2d_shape(8, 8, 3, 3, 1, -1, &OH, &OW, &err), SM_ERR_ARG);
    cr_expect_eq(sm_conv2d_shape(8, 8, 0, 3, 1, 0, &OH, &OW, &err), SM_ERR_ARG);
    cr_expect_eq(sm_conv2d_shape(8, 8, 3, -2, 1, 0, &OH, &OW, &err), SM_ERR_ARG);
    cr_expect_eq(sm_conv2d_shape(0, 8, 1, 1, 1, 0, &OH, &OW, &err), SM_ERR_ARG);
    cr_expect_eq(sm_conv2d_shape(8, 8, 3, 3, 1, 1 << 30, &OH, &OW, &err), SM_ERR_ARG); /* > INT_MAX pixels */
    cr_expect_eq(sm_conv2d_shape(8, 8, 3, 3, 1, 0, &OH, &OW, NULL), SM_OK); /* err may be NULL */
    /* floor((H + 2 pad - K) / stride) + 1 */
    cr_expect_eq(sm_conv2d_shape(7, 5, 3, 2, 2, 1, &OH, &OW, &err), SM_OK);
    cr_expect(OH == 4 && OW == 3, "7x5, kernel 3x2, stride 2, pad 1: got %d x %d", OH, OW);
    cr_expect_eq(sm_conv2d_shape(28, 28, 5, 5, 1, 0, &OH, &OW, &err), SM_OK);
    cr_expect(OH == 24 && OW == 24);
    cr_expect_eq(sm_conv2d_shape(6, 7, 2, 2, 2, 0, &OH, &OW, &err), SM_OK); /* pooling window, odd W */
    cr_expect(OH == 3 && OW == 3);
}

/* ----------------------------------------------------------------------------------------- pooling */

enum { P_MAX, P_AVG, P_ADAPTIVE };

typedef struct {
    int which, B, C, H, W, K, S; /* K, S: max / avg; OH, OW given for adaptive */
    int OH, OW;
} pool_cfg;

typedef struct {
    pool_cfg k;
    size_t nin, nout;
    sm_real *inp, *G, *out;
    int *idx;
} pool_ctx;

static void pool_open(pool_ctx *c, const pool_cfg *k, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->k = *k;
    if (k->which != P_ADAPTIVE) {
        sm_error err = {0};
        cr_assert_eq(sm_conv2d_shape(k->H, k->W, k->K, k->K, k->S, 0, &c->k.OH, &c->k.OW, &err), SM_OK, "%s",
                     err.msg);
    }
    c->nin = (size_t)k->B * k->C * k->H * k->W;
    c->nout = (size_t)k->B * k->C * c->k.OH * c->k.OW;
    c->inp = alloc0(c->nin);
    c->G = alloc0(c->nout);
    c->out = alloc0(c->nout);
    c->idx = calloc(c->nout, sizeof(int));
    cr_assert(c->idx);
    sm_rng r;
    sm_rng_seed(&r, seed);
    if (k->which == P_MAX) {
        /* distinct values 0.01 apart (a shuffled ramp): no ties, and a finite-difference step of 1e-5
         * never changes which input is the maximum of its window */
        int *perm = malloc(sizeof(int) * c->nin);
        cr_assert(perm);
        for (size_t i = 0; i < c->nin; i++) perm[i] = (int)i;
        sm_rng_shuffle(&r, perm, (int)c->nin);
        for (size_t i = 0; i < c->nin; i++) c->inp[i] = 0.01 * (perm[i] - (double)c->nin / 2);
        free(perm);
    } else {
        gc_fill_normal(c->inp, c->nin, 1, &r);
    }
    gc_fill_normal(c->G, c->nout, 1, &r);
}

static void pool_close(pool_ctx *c) {
    free(c->inp);
    free(c->G);
    free(c->out);
    free(c->idx);
}

static void pool_fwd(pool_ctx *c) {
    const pool_cfg *k = &c->k;
    switch (k->which) {
    case P_MAX: sm_maxpool2d_forward(c->out, c->idx, c->inp, k->B, k->C, k->H, k->W, k->K, k->S); break;
    case P_AVG: sm_avgpool2d_forward(c->out, c->inp, k->B, k->C, k->H, k->W, k->K, k->S); break;
    case P_ADAPTIVE: sm_adaptive_avgpool2d_forward(c->out, c->inp, k->B, k->C, k->H, k->W, k->OH, k->OW); break;
    }
}

static double pool_loss(void *p) {
    pool_ctx *c = p;
    pool_fwd(c);
    return dot(c->out, c->G, c->nout);
}

static void pool_bwd(pool_ctx *c, sm_real *dinp) {
    const pool_cfg *k = &c->k;
    switch (k->which) {
    case P_MAX: sm_maxpool2d_backward(dinp, c->G, c->idx, k->B, k->C, k->H, k->W, k->K, k->S); break;
    case P_AVG: sm_avgpool2d_backward(dinp, c->G, k->B, k->C, k->H, k->W, k->K, k->S); break;
    case P_ADAPTIVE: sm_adaptive_avgpool2d_backward(dinp, c->G, k->B, k->C, k->H, k->W, k->OH, k->OW); break;
    }
}

static void pool_gradcheck(const pool_cfg *cfgs, size_t n, const char *name, uint64_t seed) {
    double worst = 0, sc;
    for (size_t t = 0; t < n; t++) {
        pool_ctx c;
        pool_open(&c, &cfgs[t], seed + t);
        pool_fwd(&c); /* the max-pool backward needs the forward's argmax */
        sm_real *dinp = alloc0(c.nin);
        pool_bwd(&c, dinp);
        sm_rng r;
        sm_rng_seed(&r, seed + 50 + t);
        char what[64];
        snprintf(what, sizeof what, "%s%zu.inp", name, t);
        sc = gc_check(what, c.inp, dinp, c.nin, pool_loss, &c, &r, (int)c.nin); /* every coordinate */
        if (sc > worst) worst = sc;
        /* the backward accumulates */
        sm_real *twice = alloc0(c.nin);
        memcpy(twice, dinp, sizeof(sm_real) * c.nin);
        pool_bwd(&c, twice);
        for (size_t i = 0; i < c.nin; i++) cr_expect_float_eq(twice[i], 2 * dinp[i], 1e-12);
        free(twice);
        free(dinp);
        pool_close(&c);
    }
    printf("gradcheck %s: %zu configurations, worst score %.3g (<= 1 passes)\n", name, n, worst);
    fflush(stdout);
}

Test(grad_conv, maxpool) {
    const pool_cfg cfgs[] = {
        {P_MAX, 2, 3, 6, 6, 2, 2, 0, 0}, /* the usual 2x2 / 2 */
        {P_MAX, 2, 2, 7, 7, 3, 2, 0, 0}, /* overlapping windows: one pixel may get several gradients */
        {P_MAX, 2, 2, 5, 8, 2, 1, 0, 0}, /* stride 1 */
        {P_MAX, 2, 2, 7, 6, 2, 3, 0, 0}, /* stride > K: pixels no window sees get zero gradient */
    };
    pool_gradcheck(cfgs, sizeof cfgs / sizeof cfgs[0], "maxpool", 400);
}

Test(grad_conv, avgpool) {
    const pool_cfg cfgs[] = {
        {P_AVG, 2, 3, 6, 6, 2, 2, 0, 0},
        {P_AVG, 2, 2, 7, 5, 3, 2, 0, 0}, /* overlapping, non-square input */
        {P_AVG, 2, 2, 5, 7, 3, 1, 0, 0},
    };
    pool_gradcheck(cfgs, sizeof cfgs / sizeof cfgs[0], "avgpool", 500);
}

Test(grad_conv, adaptive_avgpool) {
    const pool_cfg cfgs[] = {
        {P_ADAPTIVE, 2, 3, 7, 5, 0, 0, 3, 2}, /* non-divisible: overlapping bins of sizes 3,3,3 and 3,3 */
        {P_ADAPTIVE, 2, 2, 6, 4, 0, 0, 1, 1}, /* global average pooling */
        {P_ADAPTIVE, 2, 2, 8, 6, 0, 0, 4, 3}, /* divisible: plain 2x2 average pooling */
        {P_ADAPTIVE, 2, 2, 3, 2, 0, 0, 5, 3}, /* more outputs than inputs: rows repeat */
    };
    pool_gradcheck(cfgs, sizeof cfgs / sizeof cfgs[0], "adaptive", 600);
}

Test(grad_conv, maxpool_ties_nan_and_indices) {
    /* ties go to the first index in row-major order: a constant 4x4 plane, 2x2 / 2 windows */
    sm_real x[16], y[4];
    int idx[4];
    for (int i = 0; i < 16; i++) x[i] = 1.5;
    sm_maxpool2d_forward(y, idx, x, 1, 1, 4, 4, 2, 2);
    const int first[4] = {0, 2, 8, 10};
    for (int t = 0; t < 4; t++) {
        cr_expect_eq(idx[t], first[t], "window %d: argmax %d, expected the first index %d", t, idx[t], first[t]);
        cr_expect(y[t] == 1.5);
    }
    /* a tie between a later maximum and the first one still goes to the first */
    for (int i = 0; i < 16; i++) x[i] = (sm_real)i;
    x[5] = 100;  /* window 0 = {0,1,4,5} */
    x[4] = 100;  /* earlier in row-major order than 5 */
    x[11] = NAN; /* window 3 = {10,11,14,15}: the NaN wins */
    x[14] = NAN;
    sm_maxpool2d_forward(y, idx, x, 1, 1, 4, 4, 2, 2);
    cr_expect_eq(idx[0], 4);
    cr_expect(y[0] == 100);
    cr_expect_eq(idx[1], 7); /* {2,3,6,7}: indices are per plane, h*W + w */
    cr_expect(isnan(y[3]) && idx[3] == 11, "NaN must propagate (first NaN of the window): idx %d", idx[3]);
    /* indices are per plane: the second image's channel 1 counts from its own plane's origin */
    sm_real x2[2 * 2 * 9];
    for (int i = 0; i < 36; i++) x2[i] = (sm_real)((i * 7) % 36);
    sm_real y2[2 * 2 * 1];
    int idx2[4];
    sm_maxpool2d_forward(y2, idx2, x2, 2, 2, 3, 3, 3, 1);
    for (int pl = 0; pl < 4; pl++) {
        cr_expect(idx2[pl] >= 0 && idx2[pl] < 9);
        cr_expect(x2[pl * 9 + idx2[pl]] == y2[pl]);
    }
}

Test(grad_conv, adaptive_avgpool_bins) {
    /* 7 -> 3 bins: [0,3) [2,5) [4,7);  5 -> 2 bins: [0,3) [2,5) (PyTorch's floor / ceil) */
    enum { H = 7, W = 5 };
    sm_real x[H * W], y[3 * 2];
    for (int i = 0; i < H * W; i++) x[i] = (sm_real)(i * i % 11) - 3.25;
    sm_adaptive_avgpool2d_forward(y, x, 1, 1, H, W, 3, 2);
    const int r0[3] = {0, 2, 4}, c0[2] = {0, 2};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            double s = 0;
            for (int h = r0[i]; h < r0[i] + 3; h++)
                for (int w = c0[j]; w < c0[j] + 3; w++) s += x[h * W + w];
            cr_expect(fabs(y[i * 2 + j] - s / 9) < 1e-14, "bin (%d,%d): %.17g vs %.17g", i, j, y[i * 2 + j], s / 9);
        }
    /* 1x1 is the global mean; same size is the identity; divisible sizes are plain average pooling */
    sm_real g;
    sm_adaptive_avgpool2d_forward(&g, x, 1, 1, H, W, 1, 1);
    double m = 0;
    for (int i = 0; i < H * W; i++) m += x[i];
    cr_expect(fabs(g - m / (H * W)) < 1e-14);
    sm_real id[H * W];
    sm_adaptive_avgpool2d_forward(id, x, 1, 1, H, W, H, W);
    cr_expect(max_abs_diff(id, x, H * W) == 0);
    sm_real z[2 * 3 * 8 * 6], a[2 * 3 * 4 * 3], p[2 * 3 * 4 * 3];
    for (int i = 0; i < 2 * 3 * 8 * 6; i++) z[i] = sin(0.37 * i);
    sm_adaptive_avgpool2d_forward(a, z, 2, 3, 8, 6, 4, 3);
    sm_avgpool2d_forward(p, z, 2, 3, 8, 6, 2, 2);
    cr_expect(max_abs_diff(a, p, 2 * 3 * 4 * 3) < 1e-15);
}
