/* The convolution's packed path (src/core/conv.c, "The packed path": im2col into 16-pixel panels, the
 * GEMMs on the register tile: AVX-512 where the CPU has it, and AVX2) against a double-precision
 * reference, next to the OpenBLAS path (sm_gemm_tiny_set_simd(0) turns the packed path off):
 *   forward  out = conv(inp, weight) + bias   (every entry overwritten)
 *   backward dweight += ..., dbias += ..., dinp += ... (accumulating into what is there)
 * over shapes that take the packed path (OC and OH*OW multiples of 16: MinAtar's 10 x 10 x 4 -> 16,
 * padding, stride 2, rows of 10 and 16 pixels that do and do not tile a panel, C*K*K not a multiple
 * of the tiles' 6 or 12 rows) and one that does not (P = 49). Both paths must match the reference,
 * the packed one must give the same bits when run twice, and the AVX-512 tile the AVX2 tile's bits. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe.h"
#include "specmoe/core/conv.h"

typedef struct {
    int B, C, H, W, OC, K, S, P;
} shape;

/* a shape's output size, and its input, output and weight counts */
typedef struct {
    int OH, OW;
    size_t nin, nout, nw;
} sizes;

static sizes sizes_of(const shape *s) {
    sizes z;
    cr_assert(sm_conv2d_shape(s->H, s->W, s->K, s->K, s->S, s->P, &z.OH, &z.OW, NULL) == SM_OK);
    z.nout = (size_t)s->B * s->OC * z.OH * z.OW, z.nin = (size_t)s->B * s->C * s->H * s->W;
    z.nw = (size_t)s->OC * s->C * s->K * s->K;
    return z;
}

static float *randv(size_t n, sm_rng *g) {
    float *v = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = (float)sm_rng_normal(g);
    return v;
}

/* |got - ref| <= tol * (sum of |terms|): float sums reassociated */
static void close_to(const char *what, const shape *s, size_t i, double got, double ref, double mag, int terms) {
    const double tol = 4e-7 * (terms + 4);
    cr_assert(fabs(got - ref) <= tol * mag + 1e-30, "%s (B=%d C=%d %dx%d OC=%d K=%d S=%d P=%d, packed %d): [%zu] = %.9g, reference %.9g",
              what, s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P, sm_gemm_tiny_simd(), i, got, ref);
}

/* 1: run() takes the direct forward and the backward without columns (sm_conv2d_backward_direct) */
static int g_direct;

/* runs forward + backward; out, dx, dw, db hold the results (dx, dw, db start from dx0, dw0, db0) */
static void run(const shape *s, const float *x, const float *w, const float *b, const float *dy, const float *dx0,
                const float *dw0, const float *db0, float *out, float *dx, float *dw, float *db) {
    int OH, OW;
    cr_assert(sm_conv2d_shape(s->H, s->W, s->K, s->K, s->S, s->P, &OH, &OW, NULL) == SM_OK);
    const size_t ncol = sm_conv2d_col_size(s->C, s->H, s->W, s->K, s->K, s->S, s->P);
    const size_t nout = (size_t)s->B * s->OC * OH * OW, nin = (size_t)s->B * s->C * s->H * s->W;
    const size_t nw = (size_t)s->OC * s->C * s->K * s->K;
    float *col = malloc(sizeof(float) * s->B * ncol), *dcol = malloc(sizeof(float) * ncol), *tmp = malloc(sizeof(float) * nout);
    for (size_t i = 0; i < nout; i++) out[i] = NAN;
    memcpy(dx, dx0, sizeof(float) * nin);
    memcpy(dw, dw0, sizeof(float) * nw);
    memcpy(db, db0, sizeof(float) * s->OC);
    if (g_direct) {
        cr_assert(s->S == 1 && s->P == 0);
        for (size_t i = 0; i < ncol; i++) dcol[i] = NAN; /* scratch of dinp's GEMM only */
        sm_conv2d_forward_direct(out, x, w, b, s->B, s->C, s->H, s->W, s->OC, s->K, s->K);
        sm_conv2d_backward_direct(dx, dw, db, dcol, dy, x, w, s->B, s->C, s->H, s->W, s->OC, s->K, s->K);
    } else {
        sm_conv2d_forward(out, col, tmp, x, w, b, s->B, s->C, s->H, s->W, s->OC, s->K, s->K, s->S, s->P);
        sm_conv2d_backward(dx, dw, db, dcol, tmp, dy, col, w, s->B, s->C, s->H, s->W, s->OC, s->K, s->K, s->S, s->P);
    }
    free(col);
    free(dcol);
    free(tmp);
}

static void check(const shape *s, int want_packed) {
    sm_rng g;
    sm_rng_seed(&g, 7);
    int OH, OW;
    cr_assert(sm_conv2d_shape(s->H, s->W, s->K, s->K, s->S, s->P, &OH, &OW, NULL) == SM_OK);
    cr_assert_eq(sm_conv2d_packed(s->OC, OH, OW), want_packed && sm_gemm_tiny_simd(), "sm_conv2d_packed(%d, %d, %d)", s->OC, OH, OW);
    const int KK = s->K * s->K, CKK = s->C * KK, Pn = OH * OW;
    const size_t nout = (size_t)s->B * s->OC * Pn, nin = (size_t)s->B * s->C * s->H * s->W, nw = (size_t)s->OC * CKK;
    float *x = randv(nin, &g), *w = randv(nw, &g), *b = randv(s->OC, &g), *dy = randv(nout, &g);
    float *dx0 = randv(nin, &g), *dw0 = randv(nw, &g), *db0 = randv(s->OC, &g);
    float *out = malloc(sizeof(float) * nout), *dx = malloc(sizeof(float) * nin), *dw = malloc(sizeof(float) * nw),
          *db = malloc(sizeof(float) * s->OC);
    float *out2 = malloc(sizeof(float) * nout), *dx2 = malloc(sizeof(float) * nin), *dw2 = malloc(sizeof(float) * nw),
          *db2 = malloc(sizeof(float) * s->OC);
    double *rdx = calloc(nin, sizeof(double)), *mdx = calloc(nin, sizeof(double));
    run(s, x, w, b, dy, dx0, dw0, db0, out, dx, dw, db);
    /* the reference, in double: every (b, o, i, j) and every tap (c, p, q) */
    for (int bb = 0; bb < s->B; bb++)
        for (int o = 0; o < s->OC; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    const size_t at = ((size_t)(bb * s->OC + o) * OH + i) * OW + j;
                    double ref = b[o], mag = fabs(ref);
                    for (int c = 0; c < s->C; c++)
                        for (int p = 0; p < s->K; p++)
                            for (int q = 0; q < s->K; q++) {
                                const int ih = i * s->S - s->P + p, iw = j * s->S - s->P + q;
                                if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) continue;
                                const size_t xi = ((size_t)(bb * s->C + c) * s->H + ih) * s->W + iw;
                                const double t = (double)w[(size_t)o * CKK + c * KK + p * s->K + q] * x[xi];
                                ref += t, mag += fabs(t);
                                rdx[xi] += (double)w[(size_t)o * CKK + c * KK + p * s->K + q] * dy[at];
                                mdx[xi] += fabs((double)w[(size_t)o * CKK + c * KK + p * s->K + q] * dy[at]);
                            }
                    close_to("forward", s, at, out[at], ref, mag, CKK);
                }
    for (size_t i = 0; i < nin; i++) close_to("dinp (+=)", s, i, dx[i], dx0[i] + rdx[i], fabs(dx0[i]) + mdx[i], s->OC * KK);
    for (int o = 0; o < s->OC; o++) {
        double ref = db0[o], mag = fabs(ref);
        for (int bb = 0; bb < s->B; bb++)
            for (int t = 0; t < Pn; t++) ref += dy[(size_t)(bb * s->OC + o) * Pn + t], mag += fabs(dy[(size_t)(bb * s->OC + o) * Pn + t]);
        close_to("dbias (+=)", s, o, db[o], ref, mag, s->B * Pn);
        for (int r = 0; r < CKK; r++) {
            const int c = r / KK, p = r / s->K % s->K, q = r % s->K;
            double rw = dw0[(size_t)o * CKK + r], mw = fabs(rw);
            for (int bb = 0; bb < s->B; bb++)
                for (int i = 0; i < OH; i++)
                    for (int j = 0; j < OW; j++) {
                        const int ih = i * s->S - s->P + p, iw = j * s->S - s->P + q;
                        if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) continue;
                        const double t = (double)dy[((size_t)(bb * s->OC + o) * OH + i) * OW + j] *
                                         x[((size_t)(bb * s->C + c) * s->H + ih) * s->W + iw];
                        rw += t, mw += fabs(t);
                    }
            close_to("dweight (+=)", s, (size_t)o * CKK + r, dw[(size_t)o * CKK + r], rw, mw, s->B * Pn);
        }
    }
    /* same inputs, same bits */
    run(s, x, w, b, dy, dx0, dw0, db0, out2, dx2, dw2, db2);
    cr_assert(!memcmp(out, out2, sizeof(float) * nout) && !memcmp(dx, dx2, sizeof(float) * nin) &&
                  !memcmp(dw, dw2, sizeof(float) * nw) && !memcmp(db, db2, sizeof(float) * s->OC),
              "a second run gave other bits");
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0), free(out), free(dx), free(dw), free(db);
    free(out2), free(dx2), free(dw2), free(db2), free(rdx), free(mdx);
}

static const shape kPacked[] = {
    {32, 4, 10, 10, 16, 3, 1, 0}, /* the MinAtar DQN's layer: 8 x 8 outputs, rows of 8 (half a panel) */
    {3, 2, 8, 8, 32, 3, 1, 1},    /* padding on every side, two channel panels */
    {2, 3, 9, 9, 16, 2, 1, 0},    /* C*K*K = 12 */
    {2, 1, 6, 34, 16, 3, 2, 0},   /* stride 2, rows of 16 pixels (one panel each) */
    {3, 2, 8, 10, 16, 3, 1, 1},   /* rows of 10 pixels that straddle panels (P = 80) */
    {2, 5, 4, 8, 16, 1, 1, 0},    /* 1 x 1 kernel, C*K*K = 5: a partial tile of rows */
    {1, 7, 12, 12, 48, 5, 1, 0},  /* C*K*K = 175, three channel panels */
    {2, 64, 10, 10, 32, 3, 1, 0}, /* OC*C*K*K = 18432: the weight read as stored, not packed */
};

Test(conv_packed, matches_the_reference_on_both_paths) {
    /* the CPU's tile (AVX-512 where there is one), the AVX2 tile, then the OpenBLAS path */
    for (int isa = SM_ISA_AVX512; isa >= SM_ISA_NONE; isa--) {
        sm_gemm_tiny_set_isa(isa);
        for (size_t i = 0; i < sizeof kPacked / sizeof kPacked[0]; i++) check(&kPacked[i], 1);
        const shape other = {2, 3, 7, 7, 16, 3, 1, 1}; /* P = 49: never packed */
        check(&other, 0);
        const shape odd_oc = {2, 3, 10, 10, 24, 3, 1, 0}; /* OC = 24: never packed */
        check(&odd_oc, 0);
    }
    sm_gemm_tiny_set_simd(1);
}

Test(conv_packed, the_minatar_layer_takes_the_packed_path_on_avx2) {
    /* the point of the path: on an AVX2 + FMA CPU the DQN's conv must not fall back to OpenBLAS */
    cr_assert_eq(sm_conv2d_packed(16, 8, 8), sm_gemm_tiny_simd());
    cr_assert(!sm_conv2d_packed(16, 7, 7) && !sm_conv2d_packed(8, 8, 8));
}

Test(conv_packed, avx512_and_avx2_tiles_give_the_same_bits) {
    if (sm_gemm_tiny_isa() < SM_ISA_AVX512) {
        fprintf(stderr, "conv_packed: no AVX-512 on this CPU: nothing to compare\n");
        return;
    }
    for (size_t k = 0; k < sizeof kPacked / sizeof kPacked[0]; k++) {
        const shape *s = &kPacked[k];
        const sizes z = sizes_of(s);
        const size_t nout = z.nout, nin = z.nin, nw = z.nw;
        sm_rng g;
        sm_rng_seed(&g, 9);
        float *x = randv(nin, &g), *w = randv(nw, &g), *b = randv(s->OC, &g), *dy = randv(nout, &g), *dx0 = randv(nin, &g),
              *dw0 = randv(nw, &g), *db0 = randv(s->OC, &g);
        float *r[2][4];
        for (int v = 0; v < 2; v++) {
            sm_gemm_tiny_set_isa(v ? SM_ISA_AVX512 : SM_ISA_AVX2);
            r[v][0] = malloc(sizeof(float) * nout), r[v][1] = malloc(sizeof(float) * nin),
            r[v][2] = malloc(sizeof(float) * nw), r[v][3] = malloc(sizeof(float) * s->OC);
            run(s, x, w, b, dy, dx0, dw0, db0, r[v][0], r[v][1], r[v][2], r[v][3]);
        }
        sm_gemm_tiny_set_simd(1);
        const size_t n[4] = {nout, nin, nw, (size_t)s->OC};
        for (int p = 0; p < 4; p++) {
            cr_assert(!memcmp(r[0][p], r[1][p], sizeof(float) * n[p]), "shape %zu, output %d: AVX2 and AVX-512 differ", k, p);
            free(r[0][p]), free(r[1][p]);
        }
        free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0);
    }
}

/* The direct forward (no im2col: the tile reads B where it lies) must give the packed forward's bits,
 * on both tiles, with and without a bias, overwriting out; sm_conv2d_columns must write the columns
 * the forward writes (packed or not), so a backward after a direct forward is the usual one. */
static const shape kDirect[] = {
    {32, 4, 10, 10, 16, 3, 1, 0}, /* MinAtar: 8 x 8 outputs, two input rows per panel */
    {3, 2, 6, 10, 32, 3, 1, 0},   /* OW = 8, OH = 4, two channel blocks */
    {2, 3, 6, 18, 16, 3, 1, 0},   /* OW = 16: one input run of 16 per panel row */
    {2, 5, 9, 9, 48, 2, 1, 0},    /* 2 x 2 kernel, C*K*K = 20, OC = 48 (16-row tiles, and 6-row ones) */
    {1, 1, 17, 8, 16, 1, 1, 0},   /* 1 x 1 kernel, C*K*K = 1, OH = 17 odd: P = 136 is no multiple of 16 */
};

Test(conv_packed, the_direct_forward_gives_the_packed_bits_and_columns_the_forwards) {
    cr_assert_eq(sm_conv2d_direct(4, 10, 10, 16, 3, 3, 1, 0), sm_gemm_tiny_simd(), "MinAtar's layer must take the direct path");
    cr_assert(!sm_conv2d_direct(4, 10, 10, 16, 3, 3, 1, 1) && !sm_conv2d_direct(4, 10, 10, 16, 3, 3, 2, 0) &&
              !sm_conv2d_direct(4, 12, 12, 16, 3, 3, 1, 0) && !sm_conv2d_direct(4, 10, 10, 24, 3, 3, 1, 0) &&
              !sm_conv2d_direct(1, 17, 8, 16, 1, 1, 1, 0),
              "padding, stride 2, rows of 10, OC = 24 and P % 16 != 0 are not direct");
    for (int isa = SM_ISA_AVX512; isa >= SM_ISA_NONE; isa--) {
        sm_gemm_tiny_set_isa(isa);
        for (size_t k = 0; k < sizeof kDirect / sizeof kDirect[0]; k++) {
            const shape *s = &kDirect[k];
            const sizes z = sizes_of(s);
            const size_t nout = z.nout, nin = z.nin, nw = z.nw;
            const size_t ncol = (size_t)s->B * sm_conv2d_col_size(s->C, s->H, s->W, s->K, s->K, s->S, s->P);
            sm_rng g;
            sm_rng_seed(&g, 11 + k);
            float *x = randv(nin, &g), *w = randv(nw, &g), *b = randv(s->OC, &g);
            float *out = malloc(sizeof(float) * nout), *out2 = malloc(sizeof(float) * nout), *tmp = malloc(sizeof(float) * nout);
            float *col = malloc(sizeof(float) * ncol), *col2 = malloc(sizeof(float) * ncol);
            const int direct = sm_conv2d_direct(s->C, s->H, s->W, s->OC, s->K, s->K, s->S, s->P);
            cr_assert_eq(direct, isa >= SM_ISA_AVX2 && k < 4, "isa %d shape %zu: sm_conv2d_direct = %d", isa, k, direct);
            for (int wb = 0; wb < 2; wb++) {
                const float *bias = wb ? b : NULL;
                sm_conv2d_forward(out, col, tmp, x, w, bias, s->B, s->C, s->H, s->W, s->OC, s->K, s->K, s->S, s->P);
                if (direct) {
                    for (size_t i = 0; i < nout; i++) out2[i] = NAN;
                    sm_conv2d_forward_direct(out2, x, w, bias, s->B, s->C, s->H, s->W, s->OC, s->K, s->K);
                    cr_assert(!memcmp(out, out2, sizeof(float) * nout), "isa %d shape %zu bias %d: direct and packed forwards differ",
                              isa, k, wb);
                }
            }
            for (size_t i = 0; i < ncol; i++) col2[i] = NAN;
            sm_conv2d_columns(col2, x, s->B, s->C, s->H, s->W, s->OC, s->K, s->K, s->S, s->P);
            cr_assert(!memcmp(col, col2, sizeof(float) * ncol), "isa %d shape %zu: sm_conv2d_columns differs from the forward's",
                      isa, k);
            free(x), free(w), free(b), free(out), free(out2), free(tmp), free(col), free(col2);
        }
    }
    sm_gemm_tiny_set_simd(1);
    /* a stride-1, unpadded shape the tiles do not take (rows of 10): plain loops, the same outputs */
    const shape o = {2, 3, 12, 12, 16, 3, 1, 0};
    const sizes z = sizes_of(&o);
    const size_t ncol = (size_t)o.B * sm_conv2d_col_size(o.C, o.H, o.W, o.K, o.K, 1, 0);
    sm_rng g;
    sm_rng_seed(&g, 21);
    float *x = randv(z.nin, &g), *w = randv(z.nw, &g), *b = randv(o.OC, &g), *col = malloc(sizeof(float) * ncol);
    float *out = malloc(sizeof(float) * z.nout), *out2 = malloc(sizeof(float) * z.nout), *tmp = malloc(sizeof(float) * z.nout);
    cr_assert(!sm_conv2d_direct(o.C, o.H, o.W, o.OC, o.K, o.K, 1, 0));
    sm_conv2d_forward(out, col, tmp, x, w, b, o.B, o.C, o.H, o.W, o.OC, o.K, o.K, 1, 0);
    for (size_t i = 0; i < z.nout; i++) out2[i] = NAN;
    sm_conv2d_forward_direct(out2, x, w, b, o.B, o.C, o.H, o.W, o.OC, o.K, o.K);
    for (size_t i = 0; i < z.nout; i++)
        cr_assert(fabsf(out[i] - out2[i]) <= 1e-5f * (1 + fabsf(out[i])), "loops [%zu]: %g, forward %g", i, (double)out2[i],
                  (double)out[i]);
    free(x), free(w), free(b), free(col), free(out), free(out2), free(tmp);
}

/* The conv module (src/nn/modules.c) takes the direct forward out of training and makes the columns
 * in its backward when one follows after all: a train = 0 forward and then a backward must give the
 * bits of a train = 1 forward and backward (outputs and every gradient), on the MinAtar DQN's shape. */
Test(conv_packed, a_backward_after_a_direct_forward_gives_the_training_bits) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, "conv:16:3:1:0,flatten,dense:32", &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_conv2d_direct(4, 10, 10, 16, 3, 3, 1, 0), sm_gemm_tiny_simd(), "the train = 0 forward must be direct");
    cfg.in_c = 4, cfg.in_h = cfg.in_w = 10, cfg.in_dim = 400, cfg.n_classes = 6;
    sm_rng r;
    sm_rng_seed(&r, 5);
    const int T = 32;
    sm_model *m = sm_model_create(&cfg, T, &r, &err);
    cr_assert(m, "%s", err.msg);
    float *x = malloc(sizeof(float) * T * 400), *y[2], *g[2];
    for (int i = 0; i < T * 400; i++) x[i] = sm_rng_uniform(&r) < 0.1 ? 1.0f : 0.0f;
    const size_t P = m->params.total;
    for (int train = 0; train < 2; train++) {
        sm_params_zero_grad(&m->params);
        const sm_real *out = sm_model_forward(m, x, T, NULL, train);
        y[train] = malloc(sizeof(float) * T * 6), g[train] = malloc(sizeof(float) * P);
        memcpy(y[train], out, sizeof(float) * T * 6);
        for (int i = 0; i < T * 6; i++) m->dlogits[i] = (sm_real)sin(0.1 * i);
        sm_model_backward(m, T);
        memcpy(g[train], m->params.grad, sizeof(float) * P);
    }
    cr_assert(!memcmp(y[0], y[1], sizeof(float) * T * 6), "the outputs differ");
    cr_assert(!memcmp(g[0], g[1], sizeof(float) * P), "the gradients differ");
    free(x), free(y[0]), free(y[1]), free(g[0]), free(g[1]);
    sm_model_free(m);
}

/* The ReLU stored by the tiles (sm_conv2d_forward_ex, sm_conv2d_forward_direct_ex: the activation in
 * the forward's epilogue, not a pass of its own) must give sm_act_forward's bits on the forward's
 * output: on the packed, direct and OpenBLAS paths, every ISA, with and without a bias, and with a
 * NaN weight (its channel's outputs are NaN, their ReLU 0 as sm_act_forward's x > 0 ? x : 0). The
 * pre-activation must be the plain forward's, and the direct forward may skip it. */
Test(conv_packed, the_relu_in_the_epilogue_gives_the_activation_bits) {
    const shape kRelu[] = {
        {32, 4, 10, 10, 16, 3, 1, 0}, /* MinAtar: packed and direct */
        {2, 5, 9, 9, 48, 2, 1, 0},    /* 16-row and 6-row tiles */
        {2, 3, 8, 8, 16, 3, 2, 1},    /* stride 2, padded: packed, not direct */
        {2, 3, 9, 9, 16, 3, 1, 1},    /* P = 81: neither (OpenBLAS, then the ReLU) */
        {2, 64, 10, 10, 32, 3, 1, 0}, /* OC*C*K*K = 18432: the weight read as stored, the ReLU a loop after the tiles */
    };
    for (int isa = SM_ISA_AVX512; isa >= SM_ISA_NONE; isa--) {
        sm_gemm_tiny_set_isa(isa);
        for (size_t k = 0; k < sizeof kRelu / sizeof kRelu[0]; k++) {
            const shape *s = &kRelu[k];
            const sizes z = sizes_of(s);
            const size_t ncol = (size_t)s->B * sm_conv2d_col_size(s->C, s->H, s->W, s->K, s->K, s->S, s->P);
            sm_rng g;
            sm_rng_seed(&g, 31 + k);
            float *x = randv(z.nin, &g), *w = randv(z.nw, &g), *b = randv(s->OC, &g);
            float *out = malloc(sizeof(float) * z.nout), *ref = malloc(sizeof(float) * z.nout), *out2 = malloc(sizeof(float) * z.nout),
                  *relu = malloc(sizeof(float) * z.nout), *tmp = malloc(sizeof(float) * z.nout), *col = malloc(sizeof(float) * ncol);
            for (int v = 0; v < 3; v++) {
                const float *bias = v == 1 ? NULL : b;
                if (v == 2) w[0] = NAN; /* channel 0's outputs NaN */
                sm_conv2d_forward(out, col, tmp, x, w, bias, s->B, s->C, s->H, s->W, s->OC, s->K, s->K, s->S, s->P);
                sm_act_forward(ref, out, z.nout, SM_ACT_RELU);
                for (size_t i = 0; i < z.nout; i++) out2[i] = relu[i] = -1;
                sm_conv2d_forward_ex(out2, relu, col, tmp, x, w, bias, s->B, s->C, s->H, s->W, s->OC, s->K, s->K, s->S, s->P);
                cr_assert(!memcmp(out, out2, sizeof(float) * z.nout), "isa %d shape %zu case %d: the pre-activation differs", isa, k, v);
                cr_assert(!memcmp(ref, relu, sizeof(float) * z.nout), "isa %d shape %zu case %d: the ReLU differs", isa, k, v);
                if (v == 2) cr_assert(relu[0] == 0 && isnan(out[0]), "isa %d shape %zu: a NaN's ReLU must be 0", isa, k);
                if (s->S != 1 || s->P != 0) continue;
                /* the direct forward (its plain loops where its tiles do not run: other bits than the packed path's) */
                sm_conv2d_forward_direct(out2, x, w, bias, s->B, s->C, s->H, s->W, s->OC, s->K, s->K);
                sm_act_forward(ref, out2, z.nout, SM_ACT_RELU);
                for (size_t i = 0; i < z.nout; i++) relu[i] = -1;
                sm_conv2d_forward_direct_ex(NULL, relu, x, w, bias, s->B, s->C, s->H, s->W, s->OC, s->K, s->K);
                cr_assert(!memcmp(ref, relu, sizeof(float) * z.nout), "isa %d shape %zu case %d: the direct forward's ReLU differs",
                          isa, k, v);
            }
            free(x), free(w), free(b), free(out), free(ref), free(out2), free(relu), free(tmp), free(col);
        }
    }
    sm_gemm_tiny_set_simd(1);
}

/* The backward without columns (sm_conv2d_backward_direct: the weight gradient with lanes over 16
 * output pixels, read from the input where it lies, on an AVX-512 CPU; plain loops elsewhere) after
 * the direct forward, against the double reference on the direct shapes, every ISA; and its bits do
 * not depend on the thread count. */
Test(conv_packed, the_backward_without_columns_matches_the_reference) {
    cr_assert_eq(sm_conv2d_dweight_direct(4, 10, 10, 16, 3, 3, 1, 0), sm_gemm_tiny_isa() >= SM_ISA_AVX512,
                 "MinAtar's layer must take the direct weight gradient on AVX-512");
    cr_assert(!sm_conv2d_dweight_direct(4, 10, 10, 16, 3, 3, 1, 1) && !sm_conv2d_dweight_direct(4, 12, 12, 16, 3, 3, 1, 0));
    g_direct = 1;
    for (int isa = SM_ISA_AVX512; isa >= SM_ISA_NONE; isa--) {
        sm_gemm_tiny_set_isa(isa);
        for (size_t k = 0; k < sizeof kDirect / sizeof kDirect[0]; k++) {
            const shape *s = &kDirect[k];
            const sizes z = sizes_of(s);
            check(s, s->OC % 16 == 0 && (z.OH * z.OW) % 16 == 0);
        }
    }
    g_direct = 0;
    sm_gemm_tiny_set_simd(1);
    const shape *s = &kDirect[0]; /* MinAtar's, 32 images: large enough to split over threads */
    const sizes z = sizes_of(s);
    sm_rng g;
    sm_rng_seed(&g, 41);
    float *x = randv(z.nin, &g), *w = randv(z.nw, &g), *dy = randv(z.nout, &g), *dw[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        dw[t] = calloc(z.nw, sizeof(float));
        sm_conv2d_backward_direct(NULL, dw[t], NULL, NULL, dy, x, w, s->B, s->C, s->H, s->W, s->OC, s->K, s->K);
    }
    omp_set_num_threads(omp_get_num_procs());
    cr_assert(!memcmp(dw[0], dw[1], sizeof(float) * z.nw), "1 and 2 threads gave other bits");
    free(x), free(w), free(dy), free(dw[0]), free(dw[1]);
}

/* Zero skipping (src/core/conv.c, "Zero skipping"): the direct forward and weight gradient leave out
 * the products of input rows that hold only zeros, which must not change a bit. Inputs like
 * MinAtar's: most rows zero, the rest with a few values (ones, and other values too), some images
 * all zero, one row with a NaN; shapes with rows of 8 and of 16 output pixels, 16 and 32 output
 * channels, 4 and 10 input channels (Breakout, Seaquest). One and two threads. */
static float *sparse_rows(const shape *s, sm_rng *g) {
    const sizes z = sizes_of(s);
    float *x = calloc(z.nin, sizeof(float));
    for (int b = 0; b < s->B; b++) {
        if (b % 7 == 3) continue; /* an all-zero image */
        for (int r = 0; r < s->C * s->H; r++) {
            if (sm_rng_uniform(g) >= 0.15) continue;
            float *row = x + ((size_t)b * s->C * s->H + r) * s->W;
            for (int j = 0; j < s->W; j++)
                if (sm_rng_uniform(g) < 0.3) row[j] = b % 2 ? 1.0f : (float)sm_rng_normal(g);
        }
    }
    return x;
}

/* same bits, a NaN equal to any NaN */
static int same_bits(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

/* the shapes of both zero-skipping tests */
static const shape kSkipShapes[] = {
    {32, 4, 10, 10, 16, 3, 1, 0},  /* MinAtar Breakout: rows of 8 */
    {16, 10, 10, 10, 16, 3, 1, 0}, /* Seaquest's 10 channels */
    {6, 3, 18, 18, 32, 3, 1, 0},   /* rows of 16, two tiles of output channels */
};

Test(conv_packed, zero_skipping_gives_the_same_bits) {
    if (sm_gemm_tiny_isa() < SM_ISA_AVX512) cr_skip_test("zero skipping runs on AVX-512 CPUs only");
    for (size_t k = 0; k < sizeof kSkipShapes / sizeof kSkipShapes[0]; k++) {
        const shape *s = &kSkipShapes[k];
        const sizes z = sizes_of(s);
        cr_assert(sm_conv2d_dweight_direct(s->C, s->H, s->W, s->OC, s->K, s->K, 1, 0));
        sm_rng g;
        sm_rng_seed(&g, 11 + k);
        float *x = sparse_rows(s, &g), *w = randv(z.nw, &g), *bias = randv(s->OC, &g), *dy = randv(z.nout, &g);
        x[((size_t)1 * s->C * s->H + 2) * s->W + 3] = NAN; /* a row that must be kept */
        float *out[2][2], *relu[2][2], *dw[2][2];
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t + 1);
            for (int on = 0; on < 2; on++) {
                sm_conv2d_set_zero_skip(on);
                out[t][on] = malloc(sizeof(float) * z.nout), relu[t][on] = malloc(sizeof(float) * z.nout);
                dw[t][on] = calloc(z.nw, sizeof(float));
                sm_conv2d_forward_direct_ex(out[t][on], relu[t][on], x, w, bias, s->B, s->C, s->H, s->W, s->OC, s->K, s->K);
                sm_conv2d_backward_direct(NULL, dw[t][on], NULL, NULL, dy, x, w, s->B, s->C, s->H, s->W, s->OC, s->K, s->K);
            }
            cr_assert(same_bits(out[t][0], out[t][1], z.nout), "shape %zu, %d threads: the forward changed", k, t + 1);
            cr_assert(same_bits(relu[t][0], relu[t][1], z.nout), "shape %zu, %d threads: the ReLU changed", k, t + 1);
            cr_assert(same_bits(dw[t][0], dw[t][1], z.nw), "shape %zu, %d threads: the weight gradient changed", k, t + 1);
        }
        cr_assert(same_bits(out[0][1], out[1][1], z.nout) && same_bits(dw[0][1], dw[1][1], z.nw),
                  "shape %zu: 1 and 2 threads differ", k);
        size_t nnan = 0;
        for (size_t i = 0; i < z.nout; i++) nnan += isnan(out[0][1][i]);
        cr_assert(nnan > 0, "shape %zu: the NaN's row was skipped", k);
        for (int t = 0; t < 2; t++)
            for (int on = 0; on < 2; on++) free(out[t][on]), free(relu[t][on]), free(dw[t][on]);
        free(x), free(w), free(bias), free(dy);
    }
    omp_set_num_threads(omp_get_num_procs());
    sm_conv2d_set_zero_skip(1);
}

/* ... and it does leave those rows out, on each shape: an infinite weight on a channel whose rows are
 * all zero makes inf * 0 = NaN in every output without skipping, and nothing with it (the one
 * observable difference besides a -0 sum without bias, documented). Likewise an infinite output
 * gradient on an all-zero image poisons the weight gradient only when its products are taken (the
 * panel lists of the weight gradient). */
Test(conv_packed, zero_skipping_leaves_the_zero_rows_out) {
    if (sm_gemm_tiny_isa() < SM_ISA_AVX512) cr_skip_test("zero skipping runs on AVX-512 CPUs only");
    for (size_t k = 0; k < sizeof kSkipShapes / sizeof kSkipShapes[0]; k++) {
        const shape s = kSkipShapes[k];
        const sizes z = sizes_of(&s);
        const int KK = s.K * s.K, P = (s.H - s.K + 1) * (s.W - s.K + 1);
        sm_rng g;
        sm_rng_seed(&g, 5 + k);
        float *x = calloc(z.nin, sizeof(float)), *w = randv(z.nw, &g), *dy = randv(z.nout, &g);
        for (int b = 0; b < s.B; b++)
            if (b != 1) /* image 1 all zero; the others ones along channel 0's last row */
                for (int j = 0; j < s.W; j += 3) x[((size_t)b * s.C * s.H + s.H - 1) * s.W + j] = 1;
        const int cz = s.C - 1; /* a channel with only zero rows: an infinite middle tap */
        for (int o = 0; o < s.OC; o++) w[(size_t)o * s.C * KK + cz * KK + KK / 2] = INFINITY;
        for (size_t i = 0; i < (size_t)s.OC * P; i++) dy[1 * (size_t)s.OC * P + i] = INFINITY; /* image 1's gradient */
        float *out[2], *dw[2];
        for (int on = 0; on < 2; on++) {
            sm_conv2d_set_zero_skip(on);
            out[on] = malloc(sizeof(float) * z.nout), dw[on] = calloc(z.nw, sizeof(float));
            sm_conv2d_forward_direct(out[on], x, w, NULL, s.B, s.C, s.H, s.W, s.OC, s.K, s.K);
            sm_conv2d_backward_direct(NULL, dw[on], NULL, NULL, dy, x, w, s.B, s.C, s.H, s.W, s.OC, s.K, s.K);
        }
        sm_conv2d_set_zero_skip(1);
        size_t nan_off = 0, nan_on = 0, dnan_off = 0, dnan_on = 0;
        for (size_t i = 0; i < z.nout; i++) nan_off += isnan(out[0][i]), nan_on += isnan(out[1][i]);
        for (size_t i = 0; i < z.nw; i++) dnan_off += isnan(dw[0][i]), dnan_on += isnan(dw[1][i]);
        cr_assert_eq(nan_off, z.nout, "shape %zu: without skipping every output meets inf * 0", k);
        cr_assert_eq(nan_on, 0, "shape %zu: with skipping the zero channel's rows must be left out (%zu NaNs)", k, nan_on);
        cr_assert(dnan_off > 0 && dnan_on == 0, "shape %zu: the weight gradient: %zu NaNs without skipping, %zu with", k,
                  dnan_off, dnan_on);
        free(x), free(w), free(dy), free(out[0]), free(out[1]), free(dw[0]), free(dw[1]);
    }
}
