/* PW, the Parseval regulariser of SPHERE's baselines (include/specmoe/methods/sphere/baselines.h;
 * Chung et al. 2024), in double precision: its gradient 4 coef (W W^T - s I) W against finite
 * differences over every parameter of a dense and an MoE actor, the tensors it selects, zero on
 * matrices with orthonormal rows, and a value computed entry by entry. C-CHAIN's churn gradient and
 * coefficient, SN's gradient and power iteration, and SR's gradient, power iteration and effect
 * (further down). */
#include <criterion/criterion.h>
#include <lapacke.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "baselines_fixture.h"
#include "gradcheck.h"
#include "specmoe/methods/sphere/baselines.h"

static void one_thread(void) { omp_set_num_threads(1); }
TestSuite(grad_baselines, .init = one_thread);

typedef struct {
    sm_params *ps;
    sm_real *work;
    double s;
} pw_ctx;

static double pw_loss(void *p) {
    pw_ctx *c = p;
    return sm_parseval_penalty(c->ps, NULL, c->s, 1, c->work);
}

static void check_pw(int moe, double s, uint64_t seed) {
    sm_rng r;
    sm_rng_seed(&r, seed);
    sm_model *m = baselines_fixture(moe, SM_ACT_RELU, 8, &r);
    sm_params *ps = &m->params;
    pw_ctx c = {ps, malloc(sizeof(sm_real) * sm_parseval_work_values(ps)), s};
    sm_real *g = calloc(ps->total, sizeof(sm_real));
    for (size_t i = 0; i < ps->total; i++) g[i] = 0.25; /* the gradient accumulates */
    const double v = sm_parseval_penalty(ps, g, s, 0.5, c.work);
    cr_expect(v > 0 && isfinite(v));
    for (size_t i = 0; i < ps->total; i++) g[i] = (sm_real)((g[i] - 0.25) / 0.5);
    char name[64];
    snprintf(name, sizeof name, "pw %s s=%g", moe ? "moe" : "mlp", s);
    gc_check(name, ps->data, g, ps->total, pw_loss, &c, &r, 120);
    /* the parameters it leaves alone get no gradient */
    for (int i = 0; i < ps->n; i++) {
        if (sm_parseval_tensor(ps, i)) continue;
        for (size_t j = 0; j < ps->p[i].numel; j++) cr_expect(g[ps->p[i].offset + j] == 0, "%s[%zu]", ps->p[i].name, j);
    }
    free(c.work), free(g);
    sm_model_free(m);
}

Test(grad_baselines, pw_gradient) {
    check_pw(0, 1, 1);
    check_pw(1, 1, 2);
    check_pw(0, 0.3, 3);
    check_pw(1, 2, 4);
}

/* hidden weight matrices only: not the head, the experts' output layer or the router */
Test(grad_baselines, pw_selects_the_hidden_weights) {
    sm_rng r;
    sm_rng_seed(&r, 5);
    for (int moe = 0; moe < 2; moe++) {
        sm_model *m = baselines_fixture(moe, SM_ACT_RELU, 4, &r);
        const sm_params *ps = &m->params;
        int n = 0;
        for (int i = 0; i < ps->n; i++) {
            const char *nm = ps->p[i].name;
            const int want = moe ? (strstr(nm, "experts.w1") || strstr(nm, "experts.wh") ||
                                    (strstr(nm, ".gate.") && strstr(nm, ".weight")))
                                 : !strcmp(nm, "layers.0.weight") || !strcmp(nm, "layers.1.weight");
            cr_expect_eq(sm_parseval_tensor(ps, i), want, "%s", nm);
            n += want;
        }
        cr_expect_eq(n, moe ? 4 : 2);
        sm_model_free(m);
    }
}

/* W with orthonormal rows scaled by sqrt(s) gives 0; otherwise the sum of squared entries of W W^T - s I */
Test(grad_baselines, pw_values) {
    sm_rng r;
    sm_rng_seed(&r, 6);
    sm_model *m = baselines_fixture(0, SM_ACT_RELU, 4, &r);
    sm_params *ps = &m->params;
    sm_real *work = malloc(sizeof(sm_real) * sm_parseval_work_values(ps));
    const int w0 = sm_params_find(ps, "layers.0.weight"), w1 = sm_params_find(ps, "layers.1.weight");
    /* layers.1.weight is (5, 6): rows e_0 .. e_4 times sqrt(2); layers.0.weight (6, 4) is random */
    sm_real *W1 = sm_params_data(ps, w1);
    memset(W1, 0, sizeof(sm_real) * 30);
    for (int i = 0; i < 5; i++) W1[i * 6 + i] = sqrt(2.0);
    const sm_real *W0 = sm_params_data(ps, w0);
    double want = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++) {
            double d = 0;
            for (int k = 0; k < 4; k++) d += (double)W0[a * 4 + k] * W0[b * 4 + k];
            d -= a == b ? 2 : 0;
            want += d * d;
        }
    const double got = sm_parseval_penalty(ps, NULL, 2, 1, work);
    cr_expect(fabs(got - want) < 1e-10 * (1 + want), "%.12g vs %.12g", got, want);
    free(work);
    sm_model_free(m);
}

/* C-CHAIN: the churn's gradient through the whole network, scaled by the adaptive coefficient
 * beta |L_main| / (L_churn + 1e-8), against finite differences of L_churn (the routers' balance loss
 * must not leak into it), and nothing before there is a previous step. */
typedef struct {
    sm_model *m, *prev;
    const float *x;
    int n;
    sm_real *target;
} churn_ctx;

static double churn_loss(void *p) {
    churn_ctx *c = p;
    const int V = c->m->cfg.n_classes;
    memcpy(c->target, sm_model_forward(c->prev, c->x, c->n, NULL, 0), sizeof(sm_real) * (size_t)c->n * V);
    return sm_churn_loss(NULL, sm_model_forward(c->m, c->x, c->n, NULL, 1), c->target, c->n, V);
}

static void check_cchain(int moe, uint64_t seed) {
    enum { N = 6 };
    sm_rng r;
    sm_rng_seed(&r, seed);
    sm_model *m = baselines_fixture(moe, SM_ACT_TANH, N, &r);
    if (moe) m->layers[0].moe->router->cfg.balance_coef = 0.1; /* a balance loss the churn's backward must keep out */
    sm_model *prev = baselines_fixture(moe, SM_ACT_TANH, N, &r);
    float x[N * 4];
    for (int i = 0; i < N * 4; i++) x[i] = (float)sm_rng_normal(&r);
    sm_error err;
    sm_baselines_config bc = {.cchain = 1, .cchain_ratio = 0.5};
    sm_baselines *b = sm_baselines_create(&bc, m, &r, &err);
    cr_assert(b, "%s", err.msg);
    sm_params *ps = &m->params;
    const size_t P = ps->total;
    /* the first step: no previous parameters, no churn; its parameters become the previous ones */
    sm_baselines_churn(b, m, x, N);
    sm_params_zero_grad(ps);
    sm_baselines_grad(b, m, 2.0);
    for (size_t i = 0; i < P; i++) cr_expect(ps->grad[i] == 0, "a gradient before any previous step");
    memcpy(prev->params.data, ps->data, sizeof(sm_real) * P);
    for (size_t i = 0; i < P; i++) ps->data[i] += (sm_real)(0.05 * sm_rng_normal(&r)); /* "the optimiser step" */
    sm_baselines_churn(b, m, x, N);
    sm_params_zero_grad(ps);
    sm_baselines_grad(b, m, -2.0);
    const char *keys[SM_BASELINES_STATS];
    double vals[SM_BASELINES_STATS];
    const int ns = sm_baselines_stats(b, keys, vals);
    cr_assert_eq(ns, 2);
    cr_expect_str_eq(keys[0], "cchain/churn");
    const double Lc = vals[0], coef = vals[1];
    cr_expect(Lc > 0 && coef == 100, "coef %g for churn %g: a launch's first updates run at 100", coef, Lc);
    sm_real *g = malloc(sizeof(sm_real) * P);
    for (size_t i = 0; i < P; i++) g[i] = (sm_real)(ps->grad[i] / coef);
    churn_ctx c = {m, prev, x, N, malloc(sizeof(sm_real) * N * 3)};
    cr_expect(fabs(churn_loss(&c) - Lc) < 1e-12 * (1 + Lc));
    gc_check(moe ? "cchain moe" : "cchain mlp", ps->data, g, P, churn_loss, &c, &r, 120);
    free(g), free(c.target);
    sm_baselines_free(b);
    sm_model_free(prev);
    sm_model_free(m);
}

Test(grad_baselines, cchain_gradient_and_coefficient) {
    check_cchain(0, 7);
    check_cchain(1, 8);
}

/* C-CHAIN's coefficient over a launch, as the authors' PPO code: 100 until 50 updates have ended,
 * then after each update beta * mean |L_main| / (mean L_churn + 1e-8) * frac over the last 100
 * updates' final steps (one step per update here) */
Test(grad_baselines, cchain_coefficient_schedule) {
    enum { N = 6, U = 130 };
    sm_rng r;
    sm_rng_seed(&r, 21);
    sm_model *m = baselines_fixture(0, SM_ACT_TANH, N, &r);
    float x[N * 4];
    for (int i = 0; i < N * 4; i++) x[i] = (float)sm_rng_normal(&r);
    sm_error err;
    const double beta = 0.05, frac = 0.5;
    sm_baselines_config bc = {.cchain = 1, .cchain_ratio = beta};
    sm_baselines *b = sm_baselines_create(&bc, m, &r, &err);
    cr_assert(b, "%s", err.msg);
    double mains[U], churns[U];
    const char *keys[SM_BASELINES_STATS];
    double vals[SM_BASELINES_STATS];
    for (int u = 0; u < U; u++) {
        sm_baselines_churn(b, m, x, N);
        sm_params_zero_grad(&m->params);
        mains[u] = (u % 2 ? -1.0 : 1.0) * (0.5 + 0.01 * u); /* |L_main| enters */
        sm_baselines_grad(b, m, mains[u]);
        cr_assert_eq(sm_baselines_stats(b, keys, vals), 2);
        churns[u] = u ? vals[0] : 0; /* the first step has no previous parameters: no churn */
        if (u) {
            double want = 100;
            if (u >= 50) { /* the coefficient set after update u (u updates ended) */
                const int n = u < 100 ? u : 100;
                double sm = 0, sc = 0;
                for (int k = u - n; k < u; k++) sm += fabs(mains[k]), sc += churns[k];
                want = beta * (sm / n) / (sc / n + 1e-8) * frac;
            }
            cr_expect(fabs(vals[1] - want) <= 1e-12 * want, "update %d: coefficient %g, expected %g", u, vals[1], want);
        }
        sm_baselines_end_update(b, frac);
        for (size_t i = 0; i < m->params.total; i++) m->params.data[i] += (sm_real)(0.01 * sm_rng_normal(&r));
    }
    sm_baselines_free(b);
    sm_model_free(m);
}

/* SN: the raw gradient (G - <G, W_sn> u v^T) / sigma against finite differences of
 * L(W) = <C, W / (u^T W v)> with u, v held (as torch's spectral_norm), and the bookkeeping: the raw
 * weights come back from W_sn exactly, and repeated steps' power iterations reach sigma_max. */
typedef struct {
    sm_real *W, *C, *u, *v;
    int r, c;
} sn_ctx;

static double sn_loss(void *p) {
    sn_ctx *s = p;
    double sigma = 0, L = 0;
    for (int i = 0; i < s->r; i++)
        for (int j = 0; j < s->c; j++) sigma += s->u[i] * s->W[i * s->c + j] * s->v[j];
    for (int k = 0; k < s->r * s->c; k++) L += s->C[k] * s->W[k] / sigma;
    return L;
}

Test(grad_baselines, sn_gradient) {
    enum { R = 5, C = 7 };
    sm_rng r;
    sm_rng_seed(&r, 11);
    sm_real W[R * C], Cm[R * C], u[R], v[C], Wsn[R * C], dW[R * C];
    gc_fill_normal(W, R * C, 1, &r);
    gc_fill_normal(Cm, R * C, 1, &r);
    gc_fill_normal(u, R, 1, &r);
    gc_fill_normal(v, C, 1, &r);
    sn_ctx s = {W, Cm, u, v, R, C};
    double sigma = 0;
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) sigma += u[i] * W[i * C + j] * v[j];
    for (int k = 0; k < R * C; k++) Wsn[k] = (sm_real)(W[k] / sigma);
    sm_sn_backward(dW, Cm, Wsn, u, v, sigma, R, C); /* G = dL/dW_sn = C */
    gc_check("sn", W, dW, R * C, sn_loss, &s, &r, R * C);
}

Test(grad_baselines, sn_round_trip_and_sigma) {
    sm_rng r;
    sm_rng_seed(&r, 12);
    sm_model *m = baselines_fixture(1, SM_ACT_RELU, 4, &r);
    sm_params *ps = &m->params;
    const size_t P = ps->total;
    sm_real *data0 = malloc(sizeof(sm_real) * P);
    memcpy(data0, ps->data, sizeof(sm_real) * P);
    sm_error err;
    sm_sn *sn = sm_sn_create(m, &r, &err);
    cr_assert(sn, "%s", err.msg);
    sm_params_zero_grad(ps);
    sm_sn_to_raw(sn, m);
    for (size_t i = 0; i < P; i++) cr_expect(fabs(ps->data[i] - data0[i]) <= 1e-13 * (1 + fabs(data0[i])), "value %zu", i);
    for (int k = 0; k < 200; k++) { /* steps with zero gradients: the power iteration converges */
        sm_sn_from_raw(sn, m);
        sm_sn_to_raw(sn, m);
    }
    sm_sn_from_raw(sn, m);
    /* the largest singular value over the selected matrices, from LAPACK */
    double want = 0;
    for (int i = 0; i < ps->n; i++) {
        if (!sm_parseval_tensor(ps, i)) continue;
        const sm_param *q = &ps->p[i];
        const int R = (int)q->shape[q->ndim - 2], C = (int)q->shape[q->ndim - 1];
        for (size_t k = 0; k < q->numel / ((size_t)R * C); k++) {
            double *A = malloc(sizeof(double) * R * C), *sv = malloc(sizeof(double) * (R < C ? R : C));
            for (int e = 0; e < R * C; e++) A[e] = data0[q->offset + k * R * C + e];
            cr_assert_eq(LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'N', R, C, A, C, sv, NULL, R, NULL, C), 0);
            want = sv[0] > want ? sv[0] : want;
            free(A), free(sv);
        }
    }
    cr_expect(fabs(sm_sn_sigma_max(sn) - want) < 1e-9 * want, "sigma_max %.12g, LAPACK %.12g", sm_sn_sigma_max(sn), want);
    sm_sn_free(sn);
    free(data0);
    sm_model_free(m);
}

/* SR: spectral regularisation's term lambda (sigma^k - 1)^2 of one matrix with sigma = u^T W v (u, v
 * held, not singular vectors: the formula alone) against finite differences for k = 2 and 3; then on
 * the actors with u, v converged: the gradient sm_specreg_grad adds against finite differences of
 * lambda sum_W (sigma_max(W)^2 - 1)^2 with sigma_max from LAPACK (so d sigma / dW = u v^T is the
 * true one), over every parameter; the tensors it selects; and gradient descent on the penalty alone
 * drives every matrix's sigma_max to 1 from above and from below. */
typedef struct {
    sm_real *W, *u, *v;
    int r, c;
    double k, coef;
} sr_ctx;

static double sr_loss(void *p) {
    sr_ctx *s = p;
    return s->coef * sm_specreg_term(NULL, s->W, s->u, s->v, s->r, s->c, s->k, s->coef, NULL);
}

Test(grad_baselines, specreg_term_gradient) {
    enum { R = 5, C = 7 };
    sm_rng r;
    sm_rng_seed(&r, 21);
    const double ks[2] = {2, 3};
    for (int t = 0; t < 2; t++) {
        sm_real W[R * C], u[R], v[C], dW[R * C] = {0};
        gc_fill_normal(W, R * C, 0.5, &r);
        gc_fill_normal(u, R, 1, &r);
        gc_fill_normal(v, C, 1, &r);
        sr_ctx s = {W, u, v, R, C, ks[t], 0.7};
        double sigma;
        const double f = sm_specreg_term(dW, W, u, v, R, C, ks[t], 0.7, &sigma);
        cr_expect(fabs(f - pow(pow(sigma, ks[t]) - 1, 2)) < 1e-12 * (1 + f), "value %g", f);
        gc_check(ks[t] == 2 ? "specreg term k=2" : "specreg term k=3", W, dW, R * C, sr_loss, &s, &r, R * C);
    }
}

/* Over the matrices SR selects, with sigma_max from LAPACK: returns sum (sigma_max^2 - 1)^2; the largest
 * sigma_max in *mx, the largest |sigma_max - 1| in *worst. */
static double sr_exact(const sm_params *ps, double *mx, double *worst) {
    double f = 0;
    *mx = *worst = 0;
    for (int i = 0; i < ps->n; i++) {
        if (!sm_specreg_tensor(ps, i)) continue;
        const sm_param *q = &ps->p[i];
        const int R = (int)q->shape[q->ndim - 2], C = (int)q->shape[q->ndim - 1];
        for (size_t k = 0; k < q->numel / ((size_t)R * C); k++) {
            double A[64 * 64], sv[64];
            cr_assert(R * C <= 64 * 64);
            memcpy(A, ps->data + q->offset + k * R * C, sizeof(double) * R * C);
            cr_assert_eq(LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'N', R, C, A, C, sv, NULL, R, NULL, C), 0);
            f += (sv[0] * sv[0] - 1) * (sv[0] * sv[0] - 1);
            *mx = sv[0] > *mx ? sv[0] : *mx;
            *worst = fabs(sv[0] - 1) > *worst ? fabs(sv[0] - 1) : *worst;
        }
    }
    return f;
}

typedef struct {
    sm_params *ps;
    double coef;
} srm_ctx;

static double srm_loss(void *p) {
    srm_ctx *c = p;
    double mx, worst;
    return c->coef * sr_exact(c->ps, &mx, &worst);
}

static void check_specreg(int moe, uint64_t seed) {
    sm_rng r;
    sm_rng_seed(&r, seed);
    sm_model *m = baselines_fixture(moe, SM_ACT_RELU, 4, &r);
    sm_params *ps = &m->params;
    for (size_t i = 0; i < ps->total; i++) ps->data[i] *= 2; /* sigma_max away from 1 */
    sm_error err;
    const double coef = 0.3;
    sm_specreg *s = sm_specreg_create(m, coef, 2, &r, &err);
    cr_assert(s, "%s", err.msg);
    for (int k = 0; k < 300; k++) sm_specreg_grad(s, m); /* the power iterations converge (grad is scratch) */
    sm_params_zero_grad(ps);
    const double f = sm_specreg_grad(s, m);
    double mx, before, after;
    const double want = sr_exact(ps, &mx, &before);
    cr_expect(fabs(f - want) < 1e-9 * (1 + want), "penalty %.12g, LAPACK %.12g", f, want);
    cr_expect(fabs(sm_specreg_sigma_max(s) - mx) < 1e-9 * mx, "sigma_max %.12g, LAPACK %.12g", sm_specreg_sigma_max(s), mx);
    sm_real *g = malloc(sizeof(sm_real) * ps->total);
    memcpy(g, ps->grad, sizeof(sm_real) * ps->total);
    srm_ctx c = {ps, coef};
    gc_check(moe ? "specreg moe" : "specreg mlp", ps->data, g, ps->total, srm_loss, &c, &r, (int)ps->total);
    /* the penalty alone, by gradient descent, from above (x2) and from below (x0.1): every matrix's
     * sigma_max ends at 1 */
    const double scale[2] = {1, 0.05};
    for (int d = 0; d < 2; d++) {
        for (size_t i = 0; i < ps->total; i++) ps->data[i] *= scale[d];
        sr_exact(ps, &mx, &before);
        for (int k = 0; k < 3000; k++) {
            sm_params_zero_grad(ps);
            sm_specreg_grad(s, m);
            for (size_t i = 0; i < ps->total; i++) ps->data[i] -= 0.05 / coef * ps->grad[i];
        }
        sr_exact(ps, &mx, &after);
        cr_expect(before > 0.3 && after < 1e-3, "%s, scale %g: max |sigma_max - 1| %g before, %g after", moe ? "moe" : "mlp",
                  scale[d], before, after);
    }
    free(g);
    sm_specreg_free(s);
    sm_model_free(m);
}

Test(grad_baselines, specreg_gradient_and_descent) {
    check_specreg(0, 22);
    check_specreg(1, 23);
}

Test(grad_baselines, specreg_selects_every_weight_matrix) {
    sm_rng r;
    sm_rng_seed(&r, 24);
    sm_model *m = baselines_fixture(1, SM_ACT_RELU, 4, &r);
    const sm_params *ps = &m->params;
    int n = 0, pw = 0;
    for (int i = 0; i < ps->n; i++) {
        const char *nm = ps->p[i].name;
        const int sel = sm_specreg_tensor(ps, i);
        n += sel, pw += sm_parseval_tensor(ps, i);
        /* every weight matrix, the output layers and the router's too; no bias */
        if (strstr(nm, "bias") || strstr(nm, ".b1") || strstr(nm, ".b2") || strstr(nm, ".bh")) cr_expect(!sel, "%s", nm);
        if (strstr(nm, ".experts.w2") || strstr(nm, "router")) cr_expect(sel, "%s", nm);
        if (sm_parseval_tensor(ps, i)) cr_expect(sel, "%s: PW's and SN's matrices are SR's too", nm);
    }
    cr_expect(n > pw, "SR selects %d tensors, PW %d", n, pw);
    sm_error err;
    cr_expect_null(sm_specreg_create(m, -1, 2, &r, &err));
    cr_expect(strstr(err.msg, "lambda"), "%s", err.msg);
    cr_expect_null(sm_specreg_create(m, 1, 0.5, &r, &err));
    cr_expect_null(sm_specreg_create(m, 1, NAN, &r, &err));
    sm_model_free(m);
}

/* LN: the actors with LayerNorm in their hidden layers (sm_model_config.hidden_ln) end to end, a
 * squared error of the outputs against a fixed target, against finite differences over every
 * parameter; the config round-trips through JSON and leaves no key when it is off. */
typedef struct {
    sm_model *m;
    const float *x;
    const sm_real *target;
    int n;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    return sm_churn_loss(NULL, sm_model_forward(c->m, c->x, c->n, NULL, 1), c->target, c->n, c->m->cfg.n_classes);
}

Test(grad_baselines, ln_actors) {
    enum { N = 5 };
    for (int moe = 0; moe < 2; moe++) {
        sm_rng r;
        sm_rng_seed(&r, 20 + moe);
        sm_model *m = baselines_fixture_ln(moe, SM_ACT_TANH, 1, N, &r);
        int n_ln = 0;
        for (int i = 0; i < m->params.n; i++) n_ln += m->params.p[i].ndim == 1 && strstr(m->params.p[i].name, ".1.weight") != NULL;
        cr_expect_eq(n_ln, moe ? 2 + 3 * 3 : 2, "LayerNorm gains: %d", n_ln); /* gate 2; 3 experts x 3 layers */
        int n_pw = 0; /* PW and SN: the hidden linear maps only, not the LN gains nor the experts' output layers */
        for (int i = 0; i < m->params.n; i++) n_pw += sm_parseval_tensor(&m->params, i);
        cr_expect_eq(n_pw, moe ? 2 + 3 * 3 : 2, "PW matrices: %d", n_pw);
        float x[N * 4];
        sm_real target[N * 3], *g = calloc(m->params.total, sizeof(sm_real));
        for (int i = 0; i < N * 4; i++) x[i] = (float)sm_rng_normal(&r);
        gc_fill_normal(target, N * 3, 0.5, &r);
        for (size_t i = 0; i < m->params.total; i++) m->params.data[i] += (sm_real)(0.1 * sm_rng_normal(&r)); /* gains off 1 */
        sm_params_zero_grad(&m->params);
        sm_churn_loss(m->dlogits, sm_model_forward(m, x, N, NULL, 1), target, N, 3);
        if (moe) m->layers[0].moe->router->cfg.balance_coef = 0;
        sm_model_backward(m, N);
        memcpy(g, m->params.grad, sizeof(sm_real) * m->params.total);
        ln_ctx c = {m, x, target, N};
        gc_check(moe ? "ln moe" : "ln mlp", m->params.data, g, m->params.total, ln_loss, &c, &r, 150);
        char *js = sm_model_config_to_json(&m->cfg);
        sm_model_config back;
        sm_error err;
        cr_expect_eq(sm_model_config_from_json(&back, js, &err), SM_OK, "%s", err.msg);
        cr_expect_eq(back.hidden_ln, 1);
        free(js);
        m->cfg.hidden_ln = 0;
        js = sm_model_config_to_json(&m->cfg);
        cr_expect_null(strstr(js, "hidden_ln"), "%s", js);
        free(js), free(g);
        sm_model_free(m);
    }
}
