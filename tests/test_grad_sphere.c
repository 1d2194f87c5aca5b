/* SPHERE's penalty (Eq. 26, include/specmoe/methods/sphere/sphere.h) in double precision: its
 * gradient against finite differences in both branches (T < D: the sample-space Gram; T >= D: the
 * feature-space Gram), the two branches giving the same value on transposed-size problems, zero for
 * a Parseval frame (orthogonal columns of equal norm), and D times the variance of the eigenvalues
 * computed another way (from the Gram's own entries for D = 2). */
#include <criterion/criterion.h>
#include <omp.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe_fixture.h"
#include "specmoe/core/spectral.h"
#include "specmoe/methods/sphere/sphere.h"

/* These problems are tiny: OpenMP's threads only spin against each other, which on a loaded machine
 * costs seconds per test (each test runs in its own process) */
static void one_thread(void) { omp_set_num_threads(1); }
TestSuite(grad_sphere, .init = one_thread);

typedef struct {
    sm_real *phi, *work;
    int T, D;
} sp_ctx;

static double sp_loss(void *p) {
    sp_ctx *c = p;
    return sm_sphere_penalty(c->phi, c->T, c->D, NULL, 1, c->work);
}

static void check_shape(int T, int D, uint64_t seed) {
    sm_rng r;
    sm_rng_seed(&r, seed);
    sp_ctx c = {calloc((size_t)T * D, sizeof(sm_real)), calloc(sm_sphere_work_values(T, D), sizeof(sm_real)), T, D};
    sm_real *g = calloc((size_t)T * D, sizeof(sm_real));
    gc_fill_normal(c.phi, (size_t)T * D, 1, &r);
    /* ReLU-like features: some exact zeros, as unselected experts give */
    for (int i = 0; i < T * D; i += 3) c.phi[i] = 0;
    sm_sphere_penalty(c.phi, T, D, g, 1, c.work);
    char name[64];
    snprintf(name, sizeof name, "sphere T=%d D=%d", T, D);
    gc_check(name, c.phi, g, (size_t)T * D, sp_loss, &c, &r, 60);
    free(c.phi), free(c.work), free(g);
}

Test(grad_sphere, both_branches) {
    check_shape(5, 12, 1);  /* sample space */
    check_shape(12, 5, 2);  /* feature space */
    check_shape(7, 7, 3);   /* equal: feature space */
    check_shape(1, 4, 4);
}

/* the scale multiplies the gradient and dphi accumulates */
Test(grad_sphere, scale_and_accumulate) {
    const int T = 4, D = 6;
    sm_rng r;
    sm_rng_seed(&r, 5);
    sm_real phi[24], g1[24] = {0}, g2[24], work[64];
    cr_assert_geq(64, (int)sm_sphere_work_values(T, D));
    gc_fill_normal(phi, 24, 1, &r);
    sm_sphere_penalty(phi, T, D, g1, 1, work);
    for (int i = 0; i < 24; i++) g2[i] = 1;
    sm_sphere_penalty(phi, T, D, g2, 0.5, work);
    for (int i = 0; i < 24; i++) cr_expect(fabs(g2[i] - (1 + 0.5 * g1[i])) < 1e-12, "dphi[%d]", i);
}

/* zero on a flat spectrum; D times the eigenvalue variance otherwise */
Test(grad_sphere, values) {
    sm_real work[256];
    /* T = 4 samples, D = 2: columns orthogonal with equal norms -> A = c I -> L = 0 */
    const sm_real flat[8] = {1, 1, 1, -1, -1, 1, -1, -1};
    cr_expect(fabs(sm_sphere_penalty(flat, 4, 2, NULL, 1, work)) < 1e-12);
    /* the same frame seen as T = 2 samples of D = 4 features: the T x T branch; A = phi phi^T / 2 has
     * eigenvalues 2 and 2 and D = 4 pads two zeros: L = 8 - 16 / 4 = 4 = D var(2, 2, 0, 0) */
    const sm_real wide[8] = {1, 1, 1, 1, 1, -1, 1, -1};
    cr_expect(fabs(sm_sphere_penalty(wide, 2, 4, NULL, 1, work) - 4) < 1e-12, "%g",
              sm_sphere_penalty(wide, 2, 4, NULL, 1, work));
    /* D = 2, T = 3: A's eigenvalues from its 2 x 2 entries; L = 2 var = (l1 - l2)^2 / 2 */
    const sm_real phi[6] = {1, 2, -1, 0.5, 3, 1};
    double a = 0, b = 0, c = 0;
    for (int t = 0; t < 3; t++) a += phi[2 * t] * phi[2 * t] / 3, b += phi[2 * t] * phi[2 * t + 1] / 3, c += phi[2 * t + 1] * phi[2 * t + 1] / 3;
    const double disc = sqrt((a - c) * (a - c) + 4 * b * b); /* l1 - l2 */
    cr_expect(fabs(sm_sphere_penalty(phi, 3, 2, NULL, 1, work) - disc * disc / 2) < 1e-12);
}

/* The exact eNTK against finite differences: on a small MoE model (top-2 of 3 experts with a
 * balance loss, whose gradient must not leak into the Jacobian), K's eigenvalues from
 * sm_entk_rank_exact equal those of J_fd J_fd^T, J_fd the central-difference Jacobian of u^T f(x_i)
 * over every parameter; and the rank of N identical states is 1. */

/* smooth (no kinks for the finite differences), with a balance loss */
static void tanh_balance(sm_model_config *cfg) {
    cfg->act = SM_ACT_TANH;
    cfg->moe.router.balance_coef = 0.5;
}

Test(grad_sphere, entk_exact_against_finite_differences) {
    sm_error err = {0};
    sm_rng r;
    sm_rng_seed(&r, 9);
    sm_model *m = moe_fixture(3, 2, tanh_balance, 8, &r);
    enum { N = 5 };
    float x[N * 4];
    for (int i = 0; i < N * 4; i++) x[i] = (float)sm_rng_normal(&r);
    const sm_real u[3] = {0.7, -0.2, 0.5};
    double rank, eig[N];
    cr_assert_eq(sm_entk_rank_exact(m, x, N, u, &rank, eig, &err), SM_OK, "%s", err.msg);
    const size_t P = m->params.total;
    double *J = calloc((size_t)N * P, sizeof(double));
    for (size_t j = 0; j < P; j++) {
        sm_real *th = &m->params.data[j];
        const sm_real t0 = *th, h = 1e-6;
        for (int i = 0; i < N; i++) {
            double f[2];
            for (int s = 0; s < 2; s++) {
                *th = t0 + (s ? -h : h);
                const sm_real *lg = sm_model_forward(m, x + i * 4, 1, NULL, 0);
                f[s] = u[0] * lg[0] + u[1] * lg[1] + u[2] * lg[2];
            }
            J[(size_t)i * P + j] = (f[0] - f[1]) / (2 * h);
        }
        *th = t0;
    }
    double K[N * N], w[N];
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++) {
            double s = 0;
            for (size_t j = 0; j < P; j++) s += J[(size_t)a * P + j] * J[(size_t)b * P + j];
            K[a * N + b] = s;
        }
    cr_assert_eq(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'U', N, K, N, w), 0);
    for (int i = 0; i < N; i++) /* w ascending, eig descending */
        cr_expect(fabs(eig[i] - w[N - 1 - i]) <= 1e-6 * (fabs(w[N - 1]) + 1), "eigenvalue %d: %.10g vs %.10g", i, eig[i],
                  w[N - 1 - i]);
    cr_expect(rank > 1 && rank <= N, "rank %g", rank);
    /* N copies of one state: K = c 1 1^T, rank 1 */
    float same[N * 4];
    for (int i = 0; i < N * 4; i++) same[i] = x[i % 4];
    cr_assert_eq(sm_entk_rank_exact(m, same, N, u, &rank, NULL, &err), SM_OK);
    cr_expect(fabs(rank - 1) < 1e-6, "rank of identical states %g", rank);
    free(J);
    sm_model_free(m);
}

/* The penalty through an MoE layer (double): loss = <G, out> + 0.3 L(phi(x)), phi the routing-weighted
 * last hidden features of a top-2-of-3 layer; the gradient reaches the experts (through h), the router
 * (through the combine weights) and x, checked by finite differences over all of them. */
typedef struct {
    sm_moe *m;
    sm_params ps;
    int T, d;
    sm_real *x, *G, *out, *dx, *phi, *dphi, *work;
} sp_moe_ctx;

static double sp_moe_loss(void *p) {
    sp_moe_ctx *c = p;
    sm_moe_forward(c->m, c->out, c->x, c->T, NULL, 1);
    double s = c->m->route.aux_loss;
    for (int i = 0; i < c->T * c->m->O; i++) s += (double)c->out[i] * c->G[i];
    sm_error err;
    cr_assert_eq(sm_sphere_features(c->m, c->phi, &err), SM_OK, "%s", err.msg);
    return s + 0.3 * sm_sphere_penalty(c->phi, c->T, c->m->E * c->m->H, NULL, 1, c->work);
}

Test(grad_sphere, through_an_moe_layer) {
    sm_moe_config cfg;
    sm_moe_config_default(&cfg);
    cfg.router.E = 3;
    cfg.router.k = 2;
    cfg.H = 4;
    cfg.act = SM_ACT_TANH;
    sp_moe_ctx c = {.T = 7, .d = 5};
    sm_error err;
    sm_params_init_table(&c.ps);
    c.m = sm_moe_create(&cfg, c.d, &err);
    cr_assert(c.m, "%s", err.msg);
    cr_assert_eq(sm_moe_declare(c.m, &c.ps, "moe", &err), SM_OK);
    cr_assert_eq(sm_params_alloc(&c.ps, &err), SM_OK);
    sm_rng r;
    sm_rng_seed(&r, 12);
    sm_params_initialize(&c.ps, &r);
    sm_moe_bind(c.m, &c.ps);
    cr_assert_eq(sm_moe_reserve(c.m, c.T, &err), SM_OK);
    const int D = 3 * 4, O = c.m->O;
    c.x = calloc((size_t)c.T * c.d, sizeof(sm_real));
    c.dx = calloc((size_t)c.T * c.d, sizeof(sm_real));
    c.G = calloc((size_t)c.T * O, sizeof(sm_real));
    c.out = calloc((size_t)c.T * O, sizeof(sm_real));
    c.phi = calloc((size_t)c.T * D, sizeof(sm_real));
    c.dphi = calloc((size_t)c.T * D, sizeof(sm_real));
    c.work = calloc(sm_sphere_work_values(c.T, D), sizeof(sm_real));
    gc_fill_normal(c.x, (size_t)c.T * c.d, 1.5, &r);
    gc_fill_normal(c.G, (size_t)c.T * O, 1, &r);
    sm_params_zero_grad(&c.ps);
    sp_moe_loss(&c);
    memset(c.dphi, 0, sizeof(sm_real) * (size_t)c.T * D);
    sm_sphere_penalty(c.phi, c.T, D, c.dphi, 0.3, c.work);
    sm_sphere_features_backward(c.m, c.dphi);
    sm_moe_backward(c.m, c.dx, c.G, c.x, c.T);
    gc_check("sphere.moe.x", c.x, c.dx, (size_t)c.T * c.d, sp_moe_loss, &c, &r, 35);
    for (int i = 0; i < c.ps.n; i++) {
        char name[160];
        snprintf(name, sizeof name, "sphere.moe:%s", c.ps.p[i].name);
        gc_check(name, sm_params_data(&c.ps, i), sm_params_grad(&c.ps, i), c.ps.p[i].numel, sp_moe_loss, &c, &r, 35);
    }
    sm_moe_free(c.m);
    sm_params_free(&c.ps);
    free(c.x), free(c.dx), free(c.G), free(c.out), free(c.phi), free(c.dphi), free(c.work);
}

/* ---- SPHERE in training: the regulariser on a model and the App. A.3 combination ---------------- */

/* A small MoE model: dense:6 -> moe:5 with 2-hidden-layer experts (top-2 of 3, a balance loss whose
 * gradient must stay out of grad L), tanh so finite differences see no kinks. */
static void deep_tanh_experts(sm_model_config *cfg) {
    tanh_balance(cfg);
    cfg->moe.act = SM_ACT_TANH;
    cfg->moe.depth = 2;
}

static sm_model *reg_model(uint64_t seed) {
    sm_rng r;
    sm_rng_seed(&r, seed);
    return moe_fixture(3, 2, deep_tanh_experts, 8, &r);
}

/* The gradient Gram's setting: SPHERE's actor in small, dense:6 -> moehead:5 (no head after it; with
 * gate, a 1-layer gate MLP of width 4 in front of the router) over 4 inputs and 3 outputs, ReLU experts
 * (act: ReLU, the only activation it supports) of 2 hidden layers with biases, top-2 of 3 with a balance loss, tanh in the dense layer. */
static sm_model *moehead_model(uint64_t seed, int gate, sm_act act) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, gate ? "dense:6,moehead:5:1:4" : "dense:6,moehead:5", &err), SM_OK, "%s", err.msg);
    cfg.in_dim = 4;
    cfg.n_classes = 3;
    cfg.moe.router.E = 3;
    cfg.moe.router.k = 2;
    tanh_balance(&cfg);
    cfg.moe.act = act;
    cfg.moe.depth = 2;
    cfg.moe.expert_bias = 1;
    sm_rng r;
    sm_rng_seed(&r, seed);
    sm_model *m = sm_model_create(&cfg, 8, &r, &err);
    cr_assert(m, "%s", err.msg);
    return m;
}

/* n states of 4 inputs, N(0, scale^2), from seed (the tests' RNG r is seeded from seed too) */
static void draw_states(float *x, int n, double scale, sm_rng *r, uint64_t seed) {
    sm_rng_seed(r, seed);
    for (int i = 0; i < n * 4; i++) x[i] = (float)(scale * sm_rng_normal(r));
}

typedef struct {
    sm_model *m;
    sm_sphere_reg *reg;
    const float *x;
    int T;
    sm_real *scratch; /* (P) the gradient the value-only calls write and ignore */
} reg_ctx;

/* L of the regulariser at the model's current parameters */
static double reg_loss(void *p) {
    reg_ctx *c = p;
    sm_model_forward(c->m, c->x, c->T, NULL, 1);
    sm_params v = sm_params_view(&c->m->params, c->scratch);
    return sm_sphere_reg_grad(c->reg, &v, c->T);
}

/* grad L of the regulariser on m (freed here) against finite differences over every parameter */
static void check_reg_on(sm_model *m, sm_sphere_config sc, const char *what, uint64_t seed) {
    sm_error err = {0};
    sm_rng r;
    enum { T = 6 };
    float x[T * 4];
    draw_states(x, T, 1.5, &r, seed + 100);
    reg_ctx c = {m, sm_sphere_reg_create(&sc, m, &err), x, T, calloc(m->params.total, sizeof(sm_real))};
    cr_assert(c.reg, "%s", err.msg);
    /* as in training: a base backward first (its dweight must not leak into grad L) */
    sm_model_forward(m, x, T, NULL, 1);
    gc_fill_normal(m->dlogits, (size_t)T * m->cfg.n_classes, 1, &r);
    sm_params_zero_grad(&m->params);
    sm_model_backward(m, T);
    sm_real *g = calloc(m->params.total, sizeof(sm_real));
    sm_params v = sm_params_view(&m->params, g);
    double L = sm_sphere_reg_grad(c.reg, &v, T);
    cr_expect(L > 0, "%s: L = %g", what, L);
    for (int i = 0; i < m->params.n; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s:%s", what, m->params.p[i].name);
        gc_check(name, sm_params_data(&m->params, i), g + m->params.p[i].offset, m->params.p[i].numel, reg_loss, &c, &r, 20);
    }
    sm_sphere_reg_free(c.reg);
    free(c.scratch), free(g);
    sm_model_free(m);
}

static void check_reg(sm_sphere_config sc, const char *what, uint64_t seed) { check_reg_on(reg_model(seed), sc, what, seed); }

Test(grad_sphere, regulariser_over_the_parameters) {
    sm_sphere_config sc = {.rho = 1, .mode = SM_SPHERE_GRAD};
    check_reg(sc, "sphere.last", 21);
    sc.all_layers = 1;
    check_reg(sc, "sphere.all_layers", 22);
    sc.all_layers = 0, sc.per_expert = 1;
    check_reg(sc, "sphere.per_expert", 23);
    sc.per_expert = 0, sc.unweighted = 1;
    check_reg(sc, "sphere.unweighted", 24);
}

/* SPHERE with LayerNorm (the paper's Table 11): the moehead's experts are then factory experts,
 * Linear -> LayerNorm -> act blocks and an output layer (model.c), whose hidden features the layer
 * gathers from the containers (moe.h feat_seq). The features are what the output layer reads - y_a =
 * W_out h_a + b_out for every assignment - and grad L over every parameter (the LayerNorms' gains and
 * biases included) matches finite differences, for each placement. tanh: no kinks. */
Test(grad_sphere, layernorm_experts) {
    for (int v = 0; v < 4; v++) {
        sm_model_config cfg;
        sm_model_config_default(&cfg);
        sm_error err = {0};
        cr_assert_eq(sm_model_parse_arch(&cfg, "dense:6,moehead:5:1:4", &err), SM_OK, "%s", err.msg);
        cfg.in_dim = 4, cfg.n_classes = 3, cfg.hidden_ln = 1;
        cfg.moe.router.E = 3, cfg.moe.router.k = 2;
        tanh_balance(&cfg);
        cfg.moe.act = SM_ACT_TANH, cfg.act = SM_ACT_TANH, cfg.moe.depth = 2;
        sm_rng r;
        sm_rng_seed(&r, 60 + v);
        sm_model *m = sm_model_create(&cfg, 8, &r, &err);
        cr_assert(m, "%s", err.msg);
        sm_moe *moe = sm_model_moe(m, 0);
        cr_assert(moe->experts && moe->feat_seq, "LayerNorm experts are factory experts laid out as feat_seq");
        cr_assert_eq(moe->L, 2);
        cr_assert_eq(moe->H, 5);
        float x[6 * 4];
        draw_states(x, 6, 1.5, &r, 160 + v);
        sm_model_forward(m, x, 6, NULL, 1);
        const sm_real *h = sm_moe_features(moe, NULL);
        cr_assert(h);
        double worst = 0;
        for (int e = 0; e < 3; e++) {
            char nw[64], nb[64];
            snprintf(nw, sizeof nw, "layers.1.experts.%d.2.weight", e);
            snprintf(nb, sizeof nb, "layers.1.experts.%d.2.bias", e);
            const int iw = sm_params_find(&m->params, nw), ib = sm_params_find(&m->params, nb);
            cr_assert(iw >= 0 && ib >= 0, "%s", nw);
            const sm_real *W = sm_params_data(&m->params, iw), *b = sm_params_data(&m->params, ib);
            for (int a = moe->route.offset[e]; a < moe->route.offset[e + 1]; a++)
                for (int o = 0; o < 3; o++) {
                    double y = b[o];
                    for (int i = 0; i < 5; i++) y += (double)W[o * 5 + i] * h[(size_t)a * 5 + i];
                    worst = fmax(worst, fabs(y - moe->y[(size_t)a * 3 + o]));
                }
        }
        cr_expect(worst < 1e-5, "the gathered features are not the output layer's inputs (off by %g)", worst);
        sm_sphere_config sc = {.rho = 1, .mode = SM_SPHERE_GRAD, .all_layers = v == 1, .per_expert = v == 2, .unweighted = v == 3};
        static const char *const what[4] = {"ln.last", "ln.all_layers", "ln.per_expert", "ln.unweighted"};
        check_reg_on(m, sc, what[v], 70 + v);
    }
}

/* The App. A.3 combination: after sm_sphere_step the gradients equal g_base + c grad L with grad L
 * from central differences of L alone and c from the formula over the global norms (a second
 * parameter set stands in for the critic) or the losses - never the gradient of L_base + c(theta) L,
 * which would carry L grad c (checked to differ, so the comparison can tell). */
static void check_step(sm_sphere_mode mode, sm_sphere_gram gram) {
    sm_model *m = gram == SM_SPHERE_GRAM_GRADIENT ? moehead_model(31, 1, SM_ACT_RELU) : reg_model(31);
    sm_error err = {0};
    sm_rng r;
    enum { T = 6 };
    float x[T * 4];
    draw_states(x, T, 1.5, &r, 32);
    sm_sphere_config sc = {.rho = 0.3, .mode = mode, .gram = gram, .seed = 33};
    reg_ctx c = {m, sm_sphere_reg_create(&sc, m, &err), x, T, calloc(m->params.total, sizeof(sm_real))};
    cr_assert(c.reg, "%s", err.msg);
    const size_t P = m->params.total;
    /* the base: <G, logits> + the router's balance loss, and a critic-like set with its own gradient */
    sm_real G[T * 3];
    gc_fill_normal(G, T * 3, 1, &r);
    const sm_real *lg = sm_model_forward(m, x, T, NULL, 1);
    double L_base = m->aux_loss;
    for (int i = 0; i < T * 3; i++) L_base += (double)lg[i] * G[i];
    memcpy(m->dlogits, G, sizeof G);
    sm_params_zero_grad(&m->params);
    sm_model_backward(m, T);
    sm_params other;
    sm_params_init_table(&other);
    int64_t sh[1] = {5};
    cr_assert_geq(sm_params_add(&other, "critic", 1, sh, SM_INIT_ZERO, 0, 0, 0, &err), 0);
    cr_assert_eq(sm_params_alloc(&other, &err), SM_OK);
    gc_fill_normal(other.grad, 5, 2, &r);
    sm_real *gbase = malloc(sizeof(sm_real) * P);
    memcpy(gbase, m->params.grad, sizeof(sm_real) * P);
    sm_params *others[1] = {&other};
    sm_sphere_stats st;
    sm_sphere_step(c.reg, others, 1, L_base, T, &st);
    /* grad L by central differences */
    double *gfd = calloc(P, sizeof(double)), nb = 0, np = 0;
    for (size_t j = 0; j < P; j++) {
        sm_real *th = &m->params.data[j], t0 = *th;
        *th = t0 + 1e-6;
        double lp = reg_loss(&c);
        *th = t0 - 1e-6;
        double lm = reg_loss(&c);
        *th = t0;
        gfd[j] = (lp - lm) / 2e-6;
        nb += (double)gbase[j] * gbase[j], np += gfd[j] * gfd[j];
    }
    for (int i = 0; i < 5; i++) nb += (double)other.grad[i] * other.grad[i];
    double L = reg_loss(&c);
    double coef = mode == SM_SPHERE_GRAD   ? 0.3 * sqrt(nb) / (sqrt(np) + 1e-8)
                  : mode == SM_SPHERE_LOSS ? 0.3 * fabs(L_base) / (L + 1e-8)
                                           : 0.3; /* fixed: rho itself */
    cr_expect(fabs(st.coef - coef) <= 1e-6 * coef, "coefficient %.10g, formula %.10g", st.coef, coef);
    cr_expect(fabs(st.penalty - L) <= 1e-9 * (L + 1), "penalty %.10g vs %.10g", st.penalty, L);
    double worst = 0;
    for (size_t j = 0; j < P; j++) {
        double want = gbase[j] + coef * gfd[j], d = fabs(m->params.grad[j] - want) / (1e-6 * fabs(want) + 1e-8);
        worst = d > worst ? d : worst;
    }
    cr_expect(worst <= 1, "combined gradient off the formula by %.3g times the tolerance", worst);
    if (mode != SM_SPHERE_GRAD) { /* sm_sphere_inject: one backward carries both, the same gradient */
        sm_real *two = malloc(sizeof(sm_real) * P);
        memcpy(two, m->params.grad, sizeof(sm_real) * P);
        sm_model_forward(m, x, T, NULL, 1);
        memcpy(m->dlogits, G, sizeof G);
        sm_params_zero_grad(&m->params);
        sm_sphere_stats s1;
        const double L1 = sm_sphere_inject(c.reg, L_base, T, &s1);
        sm_model_backward(m, T);
        cr_expect(fabs(L1 - st.penalty) <= 1e-12 * (L1 + 1) && fabs(s1.coef - st.coef) <= 1e-12 * st.coef,
                  "inject: L %.12g vs %.12g, lambda %.12g vs %.12g", L1, st.penalty, s1.coef, st.coef);
        double w1 = 0;
        for (size_t j = 0; j < P; j++) w1 = fmax(w1, fabs(m->params.grad[j] - two[j]) / (1e-10 * fabs(two[j]) + 1e-14));
        cr_expect(w1 <= 1, "one-backward loss mode off the two-backward gradient by %.3g times 1e-10", w1);
        memcpy(m->params.grad, two, sizeof(sm_real) * P);
        free(two);
    }
    /* the alternative with gradient through the coefficient, by finite differences of the
     * coefficient itself along the parameters (loss mode: lambda(theta) = rho |L_base(theta)| / L(theta)) */
    if (mode == SM_SPHERE_LOSS) {
        double diff = 0, scale = 0;
        for (size_t j = 0; j < P && j < 40; j++) {
            sm_real *th = &m->params.data[j], t0 = *th;
            double lam[2];
            for (int s = 0; s < 2; s++) {
                *th = t0 + (s ? -1e-6 : 1e-6);
                const sm_real *l2 = sm_model_forward(m, x, T, NULL, 1);
                double lb = m->aux_loss;
                for (int i = 0; i < T * 3; i++) lb += (double)l2[i] * G[i];
                sm_params v = sm_params_view(&m->params, c.scratch);
                double Lp = sm_sphere_reg_grad(c.reg, &v, T);
                lam[s] = 0.3 * fabs(lb) / (Lp + 1e-8);
            }
            *th = t0;
            const double wrong = L * (lam[0] - lam[1]) / 2e-6; /* the term a gradient through lambda would add */
            diff += fabs(wrong), scale += fabs(gbase[j] + coef * gfd[j]);
        }
        cr_expect(diff > 1e-3 * scale, "the check cannot tell a gradient through lambda (%.3g vs %.3g)", diff, scale);
    }
    sm_sphere_reg_free(c.reg);
    sm_params_free(&other);
    free(c.scratch), free(gbase), free(gfd);
    sm_model_free(m);
}

Test(grad_sphere, combination_grad_mode) { check_step(SM_SPHERE_GRAD, SM_SPHERE_GRAM_FEATURE); }
Test(grad_sphere, combination_loss_mode) { check_step(SM_SPHERE_LOSS, SM_SPHERE_GRAM_FEATURE); }
Test(grad_sphere, combination_fixed_mode) { check_step(SM_SPHERE_FIXED, SM_SPHERE_GRAM_FEATURE); }
Test(grad_sphere, gradient_gram_combination_grad_mode) { check_step(SM_SPHERE_GRAD, SM_SPHERE_GRAM_GRADIENT); }
Test(grad_sphere, gradient_gram_combination_loss_mode) { check_step(SM_SPHERE_LOSS, SM_SPHERE_GRAM_GRADIENT); }

Test(grad_sphere, coefficient_and_refusals) {
    sm_sphere_config sc = {.rho = 0.5, .mode = SM_SPHERE_GRAD};
    cr_expect(fabs(sm_sphere_coef(&sc, 4, 2, 10, 3) - 0.5 * 4 / (2 + 1e-8)) < 1e-12);
    sc.mode = SM_SPHERE_LOSS;
    cr_expect(fabs(sm_sphere_coef(&sc, 4, 2, -10, 3) - 0.5 * 10 / (3 + 1e-8)) < 1e-12);
    sm_sphere_mode md;
    cr_expect_eq(sm_sphere_mode_parse("loss", &md), 0);
    cr_expect_eq(md, SM_SPHERE_LOSS);
    cr_expect_eq(sm_sphere_mode_parse("Grad", &md), -1);
    cr_expect_eq(sm_sphere_mode_parse("fixed", &md), 0);
    cr_expect_eq(md, SM_SPHERE_FIXED);
    sc.mode = SM_SPHERE_FIXED;
    cr_expect(fabs(sm_sphere_coef(&sc, 4, 2, -10, 3) - 0.5) < 1e-15, "fixed: the coefficient is rho");
    /* a network with no MoE layer, and rho <= 0 */
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, "dense:4", &err), SM_OK);
    cfg.in_dim = 3;
    sm_model *m = sm_model_create(&cfg, 4, NULL, &err);
    cr_assert(m);
    sc.rho = 1;
    cr_expect_null(sm_sphere_reg_create(&sc, m, &err));
    cr_expect(strstr(err.msg, "no MoE layer"), "%s", err.msg);
    sm_model_free(m);
    m = reg_model(5);
    sc.rho = 0;
    cr_expect_null(sm_sphere_reg_create(&sc, m, &err));
    cr_expect(strstr(err.msg, "rho"), "%s", err.msg);
    sm_model_free(m);
}

/* The diagnostics: the eNTK rank is sm_entk_rank_exact's; the feature rank is the effective rank of
 * A's eigenvalues, here from phi's singular values (s^2 / N, by gesdd: another route than dsyev on the
 * Gram); the norm is the mean row norm of phi and the penalty Eq. 26 on it. */
Test(grad_sphere, diagnostics_on_a_held_out_batch) {
    enum { N = 7 };
    const sm_real u[3] = {0.6, 0, -0.8};
    float x[N * 4];
    sm_rng r;
    draw_states(x, N, 1, &r, 52);
    sm_model *m = reg_model(51);
    sm_error err = {0};
    sm_sphere_diag dg;
    cr_assert_eq(sm_sphere_diagnose(m, x, N, u, &dg, &err), SM_OK, "%s", err.msg);
    double rank;
    cr_assert_eq(sm_entk_rank_exact(m, x, N, u, &rank, NULL, &err), SM_OK);
    cr_expect(fabs(dg.entk_srank - rank) < 1e-12, "%g vs %g", dg.entk_srank, rank);
    cr_assert(dg.have_features);
    sm_moe *moe = sm_model_moe(m, 0);
    const int D = moe->E * moe->H;
    sm_model_forward(m, x, N, NULL, 0);
    sm_real *phi = calloc((size_t)N * D, sizeof(sm_real)), *work = calloc(sm_sphere_work_values(N, D), sizeof(sm_real));
    cr_assert_eq(sm_sphere_features(moe, phi, &err), SM_OK);
    double sv[N], norm = 0;
    cr_assert_eq(sm_singular_values(phi, N, D, sv, &err), SM_OK);
    for (int i = 0; i < N; i++) sv[i] = sv[i] * sv[i] / N;
    for (int t = 0; t < N; t++) {
        double s = 0;
        for (int j = 0; j < D; j++) s += (double)phi[t * D + j] * phi[t * D + j];
        norm += sqrt(s) / N;
    }
    cr_expect(fabs(dg.feature_srank - sm_effective_rank(sv, N)) < 1e-9, "%g vs %g", dg.feature_srank, sm_effective_rank(sv, N));
    cr_expect(fabs(dg.feature_norm - norm) < 1e-9 * (norm + 1), "%g vs %g", dg.feature_norm, norm);
    cr_expect(fabs(dg.penalty - sm_sphere_penalty(phi, N, D, NULL, 1, work)) < 1e-12);
    cr_expect(dg.feature_srank > 1 && dg.feature_srank <= N);
    free(phi), free(work);
    sm_model_free(m);
}

/* Stochastic Lanczos quadrature (SPHERE Eqs. 28-29): on a diagonal operator of known spectrum the
 * estimate is the spectral-entropy rank within the probes' sampling error (and with as many steps as
 * dimensions each probe's quadrature is exact, so only Hutchinson's error remains); a rank-3 operator
 * stops Lanczos early and gives about 3; and on a small MoE model the eNTK rank by SLQ (J^T v by a
 * backward, J w by central differences) matches sm_entk_rank_exact. */
typedef struct {
    int n;
    const double *d; /* diagonal */
} diag_op;
static void diag_mv(const double *v, double *out, void *user) {
    const diag_op *o = user;
    for (int i = 0; i < o->n; i++) out[i] = o->d[i] * v[i];
}
static double srank_of(const double *d, int n) {
    double s = 0, h = 0;
    for (int i = 0; i < n; i++) s += d[i];
    for (int i = 0; i < n; i++)
        if (d[i] > 0) h -= d[i] / s * log(d[i] / s);
    return exp(h);
}

Test(grad_sphere, slq_effective_rank_of_known_spectra) {
    sm_error err = {0};
    sm_rng r;
    sm_rng_seed(&r, 4);
    enum { n = 30 };
    double d[n];
    for (int i = 0; i < n; i++) d[i] = pow(i + 1, -1.2);
    const double want = srank_of(d, n);
    diag_op o = {n, d};
    double rank, se;
    cr_assert_eq(sm_slq_effective_rank(n, diag_mv, &o, 400, n, &r, &rank, &se, &err), SM_OK, "%s", err.msg);
    cr_expect(fabs(rank - want) < 0.05 * want && fabs(rank - want) < 4 * se + 1e-9, "slq %g (se %g), exact %g", rank, se, want);
    /* fewer steps than dimensions: Gauss quadrature of 10 nodes is still close for this smooth f */
    cr_assert_eq(sm_slq_effective_rank(n, diag_mv, &o, 400, 10, &r, &rank, NULL, &err), SM_OK);
    cr_expect(fabs(rank - want) < 0.08 * want, "10 steps: slq %g, exact %g", rank, want);
    /* rank 3 of 50 dimensions: an invariant subspace after 3 steps */
    double d3[50] = {0};
    d3[3] = 1, d3[17] = 1, d3[40] = 1;
    diag_op o3 = {50, d3};
    cr_assert_eq(sm_slq_effective_rank(50, diag_mv, &o3, 200, 20, &r, &rank, NULL, &err), SM_OK);
    cr_expect(fabs(rank - 3) < 0.15, "three equal eigenvalues: slq %g", rank);
    /* refusals */
    cr_expect_eq(sm_slq_effective_rank(0, diag_mv, &o, 10, 10, &r, &rank, NULL, &err), SM_ERR_ARG);
    cr_expect_eq(sm_slq_effective_rank(n, diag_mv, &o, 0, 10, &r, &rank, NULL, &err), SM_ERR_ARG);
    double z[n] = {0};
    diag_op oz = {n, z};
    cr_expect_eq(sm_slq_effective_rank(n, diag_mv, &oz, 10, 10, &r, &rank, NULL, &err), SM_ERR_NUMERIC);
}

Test(grad_sphere, entk_rank_slq_against_exact) {
    sm_error err = {0};
    sm_rng r;
    sm_rng_seed(&r, 9);
    sm_model *m = moe_fixture(3, 2, tanh_balance, 8, &r); /* max_T 8 < N: the products run in chunks */
    enum { N = 12 };
    float x[N * 4];
    for (int i = 0; i < N * 4; i++) x[i] = (float)sm_rng_normal(&r);
    const sm_real u[3] = {0.7, -0.2, 0.5};
    double exact, rank, se;
    cr_assert_eq(sm_entk_rank_exact(m, x, N, u, &exact, NULL, &err), SM_OK, "%s", err.msg);
    sm_real *before = malloc(sizeof(sm_real) * m->params.total);
    memcpy(before, m->params.data, sizeof(sm_real) * m->params.total);
    cr_assert_eq(sm_entk_rank_slq(m, x, N, u, 400, N, &r, &rank, &se, &err), SM_OK, "%s", err.msg);
    cr_expect(fabs(rank - exact) < 0.05 * exact, "eNTK rank: slq %g (se %g), exact %g", rank, se, exact);
    cr_expect(!memcmp(before, m->params.data, sizeof(sm_real) * m->params.total), "the parameters are restored");
    free(before);
    sm_model_free(m);
}

/* App. J.11's specialisation metrics on cases with known answers:
 *  - a router with zero weights: uniform probabilities, every state picks the same k experts (ties
 *    go to the lowest index), so entropy 1, kNN Jaccard 1, one top-1 cluster (silhouette NaN), k of E
 *    experts active and MaxVio E/k - 1;
 *  - experts that are copies of one: every pair of selected experts has the same features, so
 *    overlap 1 and orthogonality 0;
 *  - a random model: the load metrics equal those computed from the route's assignments here. */
static void set_block_copies(sm_model *m, const char *name, int E) {
    const int i = sm_params_find(&m->params, name);
    cr_assert(i >= 0, "%s", name);
    sm_real *d = m->params.data + m->params.p[i].offset;
    const size_t blk = m->params.p[i].numel / (size_t)E;
    for (int e = 1; e < E; e++) memcpy(d + e * blk, d, sizeof(sm_real) * blk);
}

Test(grad_sphere, specialisation_metrics_known_cases) {
    sm_error err = {0};
    sm_rng r;
    sm_rng_seed(&r, 21);
    enum { E = 4, K = 2, N = 16 };
    float x[N * 4];
    for (int i = 0; i < N * 4; i++) x[i] = (float)sm_rng_normal(&r);
    sm_sphere_spec s;
    /* zero router */
    sm_model *m = moe_fixture(E, K, NULL, N, &r);
    const int ri = sm_params_find(&m->params, "layers.1.router.weight");
    cr_assert(ri >= 0);
    memset(m->params.data + m->params.p[ri].offset, 0, sizeof(sm_real) * m->params.p[ri].numel);
    cr_assert_eq(sm_sphere_specialisation(m, x, N, 3, &s, &err), SM_OK, "%s", err.msg);
    cr_expect(fabs(s.entropy - 1) < 1e-9, "entropy %g", s.entropy);
    cr_expect(fabs(s.knn_jaccard - 1) < 1e-12, "jaccard %g", s.knn_jaccard);
    cr_expect(isnan(s.silhouette), "silhouette %g", s.silhouette);
    cr_expect(fabs(s.active_ratio - (double)K / E) < 1e-12 && fabs(s.max_vio - ((double)E / K - 1)) < 1e-12,
              "active %g, max_vio %g", s.active_ratio, s.max_vio);
    /* copies of one expert */
    for (const char *const *n = (const char *const[]){"layers.1.experts.w1", "layers.1.experts.b1", "layers.1.experts.w2",
                                                      "layers.1.experts.b2", NULL};
         *n; n++)
        set_block_copies(m, *n, E);
    cr_assert_eq(sm_sphere_specialisation(m, x, N, 3, &s, &err), SM_OK, "%s", err.msg);
    cr_expect(s.pairs > 0 && fabs(s.overlap - 1) < 1e-9 && fabs(s.orthogonality) < 1e-9, "pairs %ld overlap %g orth %g",
              s.pairs, s.overlap, s.orthogonality);
    sm_model_free(m);
    /* a random model: load metrics from the route */
    m = moe_fixture(E, K, NULL, N, &r);
    cr_assert_eq(sm_sphere_specialisation(m, x, N, 5, &s, &err), SM_OK, "%s", err.msg);
    const sm_route *rt = &sm_model_moe(m, 0)->route;
    int act = 0;
    double vio = 0, fair = (double)N * K / E;
    for (int e = 0; e < E; e++) {
        const int ne = rt->offset[e + 1] - rt->offset[e];
        act += ne > 0;
        vio = fmax(vio, fabs(ne - fair) / fair);
    }
    cr_expect(fabs(s.active_ratio - (double)act / E) < 1e-12 && fabs(s.max_vio - vio) < 1e-12);
    cr_expect(s.pairs > 0 && s.pairs <= N && s.overlap >= -1 && s.overlap <= 1 && s.knn_jaccard >= 0 && s.knn_jaccard <= 1);
    /* the silhouette, written out the textbook way: the layer's input is the gate embedding here */
    {
        const sm_real *g = sm_seq_output(m->body, 0);
        const int dg = m->layers[0].out;
        int top[N];
        for (int t = 0; t < N; t++) {
            top[t] = 0;
            for (int e = 1; e < E; e++)
                if (rt->probs[t * E + e] > rt->probs[t * E + top[t]]) top[t] = e;
        }
        double sil = 0;
        for (int t = 0; t < N; t++) {
            double a = 0, b = INFINITY;
            int na = 0;
            for (int e = 0; e < E; e++) {
                double sum = 0;
                int n = 0;
                for (int u = 0; u < N; u++) {
                    if (u == t || top[u] != e) continue;
                    double d = 0;
                    for (int j = 0; j < dg; j++) d += (g[t * dg + j] - g[u * dg + j]) * (g[t * dg + j] - g[u * dg + j]);
                    sum += sqrt(d), n++;
                }
                if (e == top[t]) a = sum, na = n;
                else if (n) b = fmin(b, sum / n);
            }
            if (na) sil += (b - a / na) / fmax(a / na, b);
        }
        cr_expect(fabs(s.silhouette - sil / N) < 1e-9, "silhouette %g, by hand %g", s.silhouette, sil / N);
    }
    cr_expect_eq(sm_sphere_specialisation(m, x, N, N, &s, &err), SM_ERR_ARG);
    cr_expect_eq(sm_sphere_specialisation(m, x, 1, 1, &s, &err), SM_ERR_ARG);
    sm_model_free(m);
}

/* Fig. 6's projection: states built along three orthogonal directions with weights 3 > 2 > 1 (plus a
 * little noise) land in the plane of the two leading ones at (+-3, 0) and (0, +-2) and are coloured by
 * the direction they were built on; the singular values come out descending. */
Test(grad_sphere, fig6_projection_and_colours) {
    sm_error err = {0};
    sm_rng r;
    sm_rng_seed(&r, 13);
    enum { N = 30, D = 7 };
    sm_real phi[N * D];
    const double w[3] = {3, 2, 1};
    for (int t = 0; t < N; t++)
        for (int j = 0; j < D; j++) phi[t * D + j] = (sm_real)((j == t % 3 ? w[t % 3] * (t % 2 ? -1 : 1) : 0) + 1e-4 * sm_rng_normal(&r));
    double xy[2 * N], sv[D];
    int col[N];
    cr_assert_eq(sm_sphere_fig6(phi, N, D, 3, xy, col, sv, &err), SM_OK, "%s", err.msg);
    for (int j = 0; j + 1 < D; j++) cr_expect(sv[j] >= sv[j + 1]);
    for (int t = 0; t < N; t++) {
        cr_expect_eq(col[t], t % 3, "state %d: colour %d", t, col[t]);
        const double ex = t % 3 == 0 ? 3 : 0, ey = t % 3 == 1 ? 2 : 0;
        cr_expect(fabs(fabs(xy[2 * t]) - ex) < 1e-3 && fabs(fabs(xy[2 * t + 1]) - ey) < 1e-3, "state %d at (%g, %g)", t, xy[2 * t],
                  xy[2 * t + 1]);
    }
    cr_expect_eq(sm_sphere_fig6(phi, 1, D, 3, xy, col, NULL, &err), SM_ERR_ARG);
    cr_expect_eq(sm_sphere_fig6(phi, N, D, 0, xy, col, NULL, &err), SM_ERR_ARG);
}

/* The routed penalty (no dense phi: only the pairs of assignments that share an expert) equals the
 * dense one on the same forward - L and what it adds to the layer's feature and combine-weight
 * gradients - weighted, unweighted and per expert. */
static void wide_moe(sm_model_config *cfg) { cfg->layers[1].width = 16; } /* H = 16 >= T: the routed path's range */

Test(grad_sphere, routed_penalty_equals_the_dense_one) {
    sm_error err = {0};
    sm_rng r;
    sm_rng_seed(&r, 77);
    enum { T = 8 };
    sm_model *m = moe_fixture(4, 2, wide_moe, T, &r);
    float x[T * 4];
    for (int i = 0; i < T * 4; i++) x[i] = (float)sm_rng_normal(&r);
    sm_moe *moe = sm_model_moe(m, 0);
    const int E = moe->E, H = moe->H, D = E * H;
    cr_assert_eq(H, 16);
    sm_real *phi = calloc((size_t)T * D, sizeof(sm_real)), *dphi = calloc((size_t)T * D, sizeof(sm_real));
    sm_real *work = calloc(sm_sphere_work_values(T, D), sizeof(sm_real)), *G = calloc(sm_sphere_routed_work_values(T, H), sizeof(sm_real));
    for (int variant = 0; variant < 3; variant++) {
        const int weighted = variant != 1, per_expert = variant == 2;
        sm_model_forward(m, x, T, NULL, 1);
        const sm_route *rt = &moe->route;
        const int A = rt->n_assign;
        sm_real *dfeat = NULL;
        memset(rt->dweight, 0, sizeof(sm_real) * A);
        const double Lr = sm_sphere_penalty_routed(moe, moe->L - 1, weighted, per_expert, G);
        sm_sphere_penalty_routed_backward(moe, moe->L - 1, weighted, per_expert, 0.7, G);
        (void)sm_moe_features_at(moe, moe->L - 1, &dfeat);
        sm_real *df_r = malloc(sizeof(sm_real) * (size_t)A * H), *dw_r = malloc(sizeof(sm_real) * A);
        memcpy(df_r, dfeat, sizeof(sm_real) * (size_t)A * H);
        memcpy(dw_r, rt->dweight, sizeof(sm_real) * A);
        /* dense: phi, Eq. 26 (per expert: on each expert's columns), back through the features */
        memset(rt->dweight, 0, sizeof(sm_real) * A);
        cr_assert_eq(sm_sphere_features_at(moe, moe->L - 1, weighted, phi, &err), SM_OK, "%s", err.msg);
        memset(dphi, 0, sizeof(sm_real) * (size_t)T * D);
        double Ld = 0;
        if (!per_expert) Ld = sm_sphere_penalty(phi, T, D, dphi, 0.7, work);
        else
            for (int e = 0; e < E; e++) {
                sm_real sl[T * 16], dsl[T * 16];
                for (int t = 0; t < T; t++) memcpy(sl + t * H, phi + (size_t)t * D + (size_t)e * H, sizeof(sm_real) * H);
                memset(dsl, 0, sizeof dsl);
                Ld += sm_sphere_penalty(sl, T, H, dsl, 0.7, work);
                for (int t = 0; t < T; t++) memcpy(dphi + (size_t)t * D + (size_t)e * H, dsl + t * H, sizeof(sm_real) * H);
            }
        sm_sphere_features_at_backward(moe, moe->L - 1, weighted, dphi);
        cr_expect(fabs(Lr - Ld) <= 1e-10 * (fabs(Ld) + 1e-12), "variant %d: L routed %.14g, dense %.14g", variant, Lr, Ld);
        double worst = 0;
        for (size_t i = 0; i < (size_t)A * H; i++) worst = fmax(worst, fabs(df_r[i] - dfeat[i]) / (1e-10 * fabs(dfeat[i]) + 1e-14));
        for (int a = 0; a < A; a++) worst = fmax(worst, fabs(dw_r[a] - rt->dweight[a]) / (1e-10 * fabs(rt->dweight[a]) + 1e-14));
        cr_expect(worst <= 1, "variant %d: gradients differ by %.3g times the tolerance", variant, worst);
        cr_expect(Ld > 0, "variant %d: a nonzero penalty to compare (%g)", variant, Ld);
        free(df_r), free(dw_r);
    }
    free(phi), free(dphi), free(work), free(G);
    sm_model_free(m);
}

/* ---- The gradient-Gram ablation (Table 1, Eq. 20; src/methods/sphere/gradgram.c) --------------- */

/* a gated ReLU moehead model (seed) and T <= 8 states (seed + 1) */
typedef struct {
    sm_model *m;
    sm_moe *moe;
    sm_rng r;
    float x[8 * 4];
} gg_fixture;

static sm_model *gg_setup(gg_fixture *f, uint64_t seed, int T) {
    f->m = moehead_model(seed, 1, SM_ACT_RELU);
    f->moe = sm_model_moe(f->m, 0);
    draw_states(f->x, T, 1.5, &f->r, seed + 1);
    return f->m;
}

/* psi's rows are what they are defined as: psi_{t,e}[i] = d(u^T out_t) / d z_{t,e}[i], which is also the
 * derivative of u^T out_t along the bias of expert e's last hidden layer (z = W h + b): central
 * differences of that, token by token. Unselected experts' blocks are 0 both ways, and the unweighted
 * rows are the weighted ones divided by p. */
Test(grad_sphere, gradient_gram_rows_are_backprop_vectors) {
    enum { T = 6 };
    gg_fixture f;
    sm_model *m = gg_setup(&f, 41, T);
    sm_moe *moe = f.moe;
    const float *x = f.x;
    const int E = moe->E, H = moe->H, O = moe->O, D = E * H, L = moe->L;
    cr_assert_eq(L, 2);
    cr_assert_eq(O, 3);
    sm_real u[3];
    sm_sphere_direction(43, u, 3);
    cr_expect(fabs(u[0] * u[0] + u[1] * u[1] + u[2] * u[2] - 1) < 1e-12, "u is a unit vector");
    sm_real *psi = calloc((size_t)T * D, sizeof(sm_real)), *psu = calloc((size_t)T * D, sizeof(sm_real));
    sm_error err = {0};
    sm_model_forward(m, x, T, NULL, 1);
    cr_assert_eq(sm_sphere_grad_features(moe, u, 1, psi, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_sphere_grad_features(moe, u, 0, psu, &err), SM_OK, "%s", err.msg);
    double p[T][3] = {{0}};
    for (int e = 0; e < E; e++)
        for (int a = moe->route.offset[e]; a < moe->route.offset[e + 1]; a++) p[moe->route.token[a]][e] = moe->route.weight[a];
    cr_assert_geq(moe->ip[9], 0, "the experts' hidden biases");
    sm_real *bh = sm_params_data(&m->params, moe->ip[9]); /* (E, L-1, H): the last hidden layer's is block L-2 */
    double worst = 0;
    int nonzero = 0;
    for (int e = 0; e < E; e++)
        for (int i = 0; i < H; i++) {
            sm_real *b = bh + ((size_t)e * (L - 1) + (L - 2)) * H + i, b0 = *b;
            const double h = 1e-6;
            double f[2][T];
            for (int s = 0; s < 2; s++) {
                *b = b0 + (s ? -h : h);
                const sm_real *lg = sm_model_forward(m, x, T, NULL, 1);
                for (int t = 0; t < T; t++) f[s][t] = u[0] * lg[3 * t] + u[1] * lg[3 * t + 1] + u[2] * lg[3 * t + 2];
            }
            *b = b0;
            for (int t = 0; t < T; t++) {
                const double nd = (f[0][t] - f[1][t]) / (2 * h), an = psi[(size_t)t * D + (size_t)e * H + i];
                worst = fmax(worst, fabs(an - nd) / (1e-6 * fabs(nd) + 1e-9));
                nonzero += an != 0;
                if (p[t][e] == 0) cr_expect(an == 0 && psu[(size_t)t * D + (size_t)e * H + i] == 0, "t %d e %d: unselected", t, e);
                else cr_expect(fabs(psu[(size_t)t * D + (size_t)e * H + i] * p[t][e] - an) <= 1e-14, "t %d e %d: p psi_unweighted", t, e);
            }
        }
    cr_expect(worst <= 1, "psi off the finite differences by %.3g times the tolerance", worst);
    cr_expect(nonzero > T * H / 2, "only %d nonzero entries", nonzero);
    free(psi), free(psu);
    sm_model_free(m);
}

/* d L / d theta through the backprop vectors (the second-order backward) against finite differences
 * over every parameter: with and without a gate network, per expert, unweighted */
Test(grad_sphere, gradient_gram_over_the_parameters) {
    sm_sphere_config sc = {.rho = 1, .mode = SM_SPHERE_GRAD, .gram = SM_SPHERE_GRAM_GRADIENT, .seed = 7};
    check_reg_on(moehead_model(51, 0, SM_ACT_RELU), sc, "ggram.last", 51);
    check_reg_on(moehead_model(52, 1, SM_ACT_RELU), sc, "ggram.gated", 52);
    sc.per_expert = 1;
    check_reg_on(moehead_model(53, 1, SM_ACT_RELU), sc, "ggram.per_expert", 53);
    sc.per_expert = 0, sc.unweighted = 1;
    check_reg_on(moehead_model(54, 1, SM_ACT_RELU), sc, "ggram.unweighted", 54);
}

/* The ablation is not SPHERE: on the same forward its L differs from the feature Gram's, its gradient
 * reaches only the experts' output weights and the routing (gate, router, the layers before), and a
 * few normalised descent steps on it reduce it. */
Test(grad_sphere, gradient_gram_differs_and_descends) {
    enum { T = 8 };
    sm_error err = {0};
    gg_fixture f;
    sm_model *m = gg_setup(&f, 61, T);
    const sm_moe *moe = f.moe;
    const float *x = f.x;
    sm_sphere_config sf = {.rho = 1, .seed = 63}, sg = sf;
    sg.gram = SM_SPHERE_GRAM_GRADIENT;
    sm_sphere_reg *rf = sm_sphere_reg_create(&sf, m, &err), *rg = sm_sphere_reg_create(&sg, m, &err);
    cr_assert(rf && rg, "%s", err.msg);
    const size_t P = m->params.total;
    sm_real *g = calloc(P, sizeof(sm_real));
    sm_params v = sm_params_view(&m->params, g);
    sm_model_forward(m, x, T, NULL, 1);
    const double Lf = sm_sphere_reg_grad(rf, &v, T);
    memset(g, 0, sizeof(sm_real) * P);
    sm_model_forward(m, x, T, NULL, 1);
    const double L0 = sm_sphere_reg_grad(rg, &v, T);
    cr_expect(L0 > 0 && fabs(L0 - Lf) > 0.1 * fmax(L0, Lf), "gradient Gram %g, feature Gram %g", L0, Lf);
    for (int i = 0; i < m->params.n; i++) {
        double n2 = 0;
        for (size_t j = 0; j < m->params.p[i].numel; j++) n2 += (double)g[m->params.p[i].offset + j] * g[m->params.p[i].offset + j];
        const int w2 = i == moe->ip[2], hidden = i == moe->ip[0] || i == moe->ip[1] || i == moe->ip[8] || i == moe->ip[9] || i == moe->ip[3];
        const char *name = m->params.p[i].name;
        if (w2 || strstr(name, "router") || strstr(name, "gate")) cr_expect(n2 > 0, "%s: no gradient", name);
        if (hidden) cr_expect(n2 == 0, "%s: gradient %g where relu' is constant", name, sqrt(n2));
    }
    double L = L0;
    for (int step = 0; step < 10; step++) {
        double n2 = 0;
        for (size_t j = 0; j < P; j++) n2 += (double)g[j] * g[j];
        const double s = 0.02 * L / sqrt(n2); /* a first-order decrease of 2% per step */
        for (size_t j = 0; j < P; j++) m->params.data[j] -= (sm_real)(s * g[j] / sqrt(n2));
        memset(g, 0, sizeof(sm_real) * P);
        sm_model_forward(m, x, T, NULL, 1);
        L = sm_sphere_reg_grad(rg, &v, T);
    }
    cr_expect(L < 0.9 * L0, "10 steps took L from %g to %g only", L0, L);
    sm_sphere_reg_free(rf), sm_sphere_reg_free(rg);
    free(g);
    sm_model_free(m);
}

/* what the gradient Gram does not support is refused, with the reason */
Test(grad_sphere, gradient_gram_refusals) {
    sm_sphere_gram gm;
    cr_expect_eq(sm_sphere_gram_parse("gradient", &gm), 0);
    cr_expect_eq(gm, SM_SPHERE_GRAM_GRADIENT);
    cr_expect_eq(sm_sphere_gram_parse("feature", &gm), 0);
    cr_expect_eq(gm, SM_SPHERE_GRAM_FEATURE);
    cr_expect_eq(sm_sphere_gram_parse("grad", &gm), -1);
    sm_error err = {0};
    sm_sphere_config sc = {.rho = 1, .gram = SM_SPHERE_GRAM_GRADIENT};
    sm_model *m = reg_model(71); /* a head after the MoE layer */
    cr_expect_null(sm_sphere_reg_create(&sc, m, &err));
    cr_expect(strstr(err.msg, "network's output"), "%s", err.msg);
    const sm_sphere_config feature = {.rho = 1};
    cr_expect_null(sm_sphere_gram_refusal(&feature, &m->cfg), "the feature Gram has no such limits");
    sm_model_free(m);
    m = moehead_model(72, 0, SM_ACT_TANH);
    cr_expect_null(sm_sphere_reg_create(&sc, m, &err));
    cr_expect(strstr(err.msg, "ReLU experts only"), "%s", err.msg);
    float x[4] = {0.1f, -0.3f, 0.2f, 0.5f};
    sm_real u[3] = {1, 0, 0}, psi[15];
    sm_model_forward(m, x, 1, NULL, 1);
    cr_expect_eq(sm_sphere_grad_features(sm_model_moe(m, 0), u, 1, psi, &err), SM_ERR_ARG);
    sm_model_free(m);
    m = moehead_model(73, 0, SM_ACT_RELU);
    sc.all_layers = 1;
    cr_expect_null(sm_sphere_reg_create(&sc, m, &err));
    cr_expect(strstr(err.msg, "last hidden expert layer only"), "%s", err.msg);
    sc.all_layers = 0;
    sm_sphere_reg *rg = sm_sphere_reg_create(&sc, m, &err);
    cr_expect(rg, "%s", err.msg);
    sm_sphere_reg_free(rg);
    sm_model_free(m);
    /* LayerNorm's factory experts: the feature Gram reads them, the gradient Gram (built-in w2) does not */
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    cr_assert_eq(sm_model_parse_arch(&cfg, "dense:6,moehead:5", &err), SM_OK, "%s", err.msg);
    cfg.in_dim = 4, cfg.n_classes = 3, cfg.hidden_ln = 1, cfg.moe.router.E = 3, cfg.moe.router.k = 2;
    cfg.moe.act = SM_ACT_RELU, cfg.moe.depth = 2;
    m = sm_model_create(&cfg, 8, NULL, &err);
    cr_assert(m, "%s", err.msg);
    cr_expect_null(sm_sphere_reg_create(&sc, m, &err));
    cr_expect(strstr(err.msg, "not factory experts"), "%s", err.msg);
    rg = sm_sphere_reg_create(&feature, m, &err);
    cr_expect(rg, "%s", err.msg);
    sm_sphere_reg_free(rg);
    sm_model_free(m);
}
