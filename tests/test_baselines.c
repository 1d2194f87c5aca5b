/* The reset baselines of SPHERE's comparison (include/specmoe/methods/sphere/baselines.h): ReDo
 * (Sokar et al. 2023) and continual backprop (Dohare et al. 2024) reinitialise exactly the units
 * they should - fresh incoming weights, zero incoming bias, zero outgoing weights, Adam moments of
 * all of them cleared - and touch no other value or moment; CBP's next-layer bias absorbs the
 * replaced unit's mean contribution. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "baselines_fixture.h"
#include "specmoe/methods/sphere/baselines.h"
#include "specmoe/nn/moe.h"

static void one_thread(void) { omp_set_num_threads(1); }
TestSuite(baselines, .init = one_thread);

#define T 8

typedef struct {
    sm_model *m;
    sm_optim opt;
    sm_real *data, *mom, *vel; /* copies before the reset */
    float x[T * 4];
} fx;

static void setup(fx *f, int moe, uint64_t seed) {
    sm_rng r;
    sm_rng_seed(&r, seed);
    f->m = baselines_fixture(moe, SM_ACT_RELU, T, &r);
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = SM_OPT_ADAM;
    sm_error err;
    cr_assert_eq(sm_optim_init(&f->opt, &oc, &f->m->params, &err), SM_OK, "%s", err.msg);
    const size_t P = f->m->params.total;
    for (size_t i = 0; i < P; i++) f->opt.m[i] = 1, f->opt.v[i] = 2;
    for (int i = 0; i < T * 4; i++) f->x[i] = (float)sm_rng_normal(&r);
    /* every bias at +5 and every weight >= 0: every unit is active on every row (the inputs are about
     * 1, the first layers' weights at most 1/2) unless a test silences it */
    for (int i = 0; i < f->m->params.n; i++) {
        const char *nm = f->m->params.p[i].name;
        size_t n = strlen(nm);
        sm_real *v = sm_params_data(&f->m->params, i);
        const int bias = (n > 5 && !strcmp(nm + n - 5, ".bias")) || strstr(nm, "experts.b");
        for (size_t j = 0; j < f->m->params.p[i].numel; j++) v[j] = bias ? 5 : (sm_real)fabs((double)v[j]);
    }
}

static void snapshot(fx *f) {
    const size_t P = f->m->params.total;
    f->data = malloc(sizeof(sm_real) * P), f->mom = malloc(sizeof(sm_real) * P), f->vel = malloc(sizeof(sm_real) * P);
    memcpy(f->data, f->m->params.data, sizeof(sm_real) * P);
    memcpy(f->mom, f->opt.m, sizeof(sm_real) * P);
    memcpy(f->vel, f->opt.v, sizeof(sm_real) * P);
}

static void teardown(fx *f) {
    free(f->data), free(f->mom), free(f->vel);
    sm_optim_free(&f->opt);
    sm_model_free(f->m);
}

/* marks (P) set by the test: 1 a value of a reset unit (moments cleared), 2 a value CBP's bias
 * correction may change (moments kept), 0 untouched */
static void expect_only(fx *f, const unsigned char *mark) {
    const sm_params *ps = &f->m->params;
    for (int i = 0; i < ps->n; i++)
        for (size_t j = 0; j < ps->p[i].numel; j++) {
            size_t k = ps->p[i].offset + j;
            if (mark[k] == 2) {
                cr_expect(f->opt.m[k] == f->mom[k] && f->opt.v[k] == f->vel[k], "%s[%zu]: moments changed", ps->p[i].name, j);
            } else if (mark[k]) {
                cr_expect(f->opt.m[k] == 0 && f->opt.v[k] == 0, "%s[%zu]: moments not cleared", ps->p[i].name, j);
            } else {
                cr_expect(ps->data[k] == f->data[k], "%s[%zu] changed", ps->p[i].name, j);
                cr_expect(f->opt.m[k] == f->mom[k] && f->opt.v[k] == f->vel[k], "%s[%zu]: moments changed", ps->p[i].name, j);
            }
        }
}

/* marks unit u's incoming row (+ bias) and outgoing column, expecting zero outgoing weights, a fresh
 * incoming row and a zero bias (unless CBP's correction from the layer below has moved it) */
static void mark_unit(fx *f, unsigned char *mark, const char *win, const char *bin, size_t in_block, size_t bin_block,
                      int I, const char *wout, size_t out_block, int O, int H, int u) {
    const sm_params *ps = &f->m->params;
    const size_t wi = ps->p[sm_params_find(ps, win)].offset + in_block, wo = ps->p[sm_params_find(ps, wout)].offset + out_block;
    int fresh = 0;
    for (int j = 0; j < I; j++) {
        mark[wi + (size_t)u * I + j] = 1;
        fresh += ps->data[wi + (size_t)u * I + j] != f->data[wi + (size_t)u * I + j];
    }
    cr_expect_gt(fresh, 0, "%s unit %d: incoming weights not redrawn", win, u);
    if (bin) {
        const size_t bi = ps->p[sm_params_find(ps, bin)].offset + bin_block;
        cr_expect(ps->data[bi + u] == 0 || mark[bi + u] == 2, "%s unit %d: bias %g", bin, u, (double)ps->data[bi + u]);
        mark[bi + u] = 1;
    }
    for (int o = 0; o < O; o++) {
        mark[wo + (size_t)o * H + u] = 1;
        cr_expect(ps->data[wo + (size_t)o * H + u] == 0, "%s column %d not zero", wout, u);
    }
}

static void silence(fx *f, const char *win, const char *bin, size_t in_block, size_t bin_block, int I, int u, double bias) {
    sm_params *ps = &f->m->params;
    sm_real *w = ps->data + ps->p[sm_params_find(ps, win)].offset + in_block + (size_t)u * I;
    for (int j = 0; j < I; j++) w[j] = 0;
    ps->data[ps->p[sm_params_find(ps, bin)].offset + bin_block + u] = (sm_real)bias;
}

/* ReDo at tau 0.1 after a forward of f's batch: expects `want` units reset; returns the marks to fill */
static unsigned char *redo_on(fx *f, int want) {
    sm_model_forward(f->m, f->x, T, NULL, 1);
    snapshot(f);
    sm_rng r;
    sm_rng_seed(&r, 9);
    cr_expect_eq(sm_redo(f->m, &f->opt, T, 0.1, &r), want);
    return calloc(f->m->params.total, 1);
}

static void finish(fx *f, unsigned char *mark) {
    expect_only(f, mark);
    free(mark);
    teardown(f);
}

Test(baselines, redo_resets_the_dormant_dense_units) {
    fx f;
    setup(&f, 0, 1);
    silence(&f, "layers.0.weight", "layers.0.bias", 0, 0, 4, 1, -1); /* relu(-1) = 0 on every row */
    silence(&f, "layers.0.weight", "layers.0.bias", 0, 0, 4, 4, -1);
    silence(&f, "layers.1.weight", "layers.1.bias", 0, 0, 6, 3, 0.01); /* active, but 1/500 of the mean: dormant */
    unsigned char *mark = redo_on(&f, 3);
    mark_unit(&f, mark, "layers.0.weight", "layers.0.bias", 0, 0, 4, "layers.1.weight", 0, 5, 6, 1);
    mark_unit(&f, mark, "layers.0.weight", "layers.0.bias", 0, 0, 4, "layers.1.weight", 0, 5, 6, 4);
    mark_unit(&f, mark, "layers.1.weight", "layers.1.bias", 0, 0, 6, "head.weight", 0, 3, 5, 3);
    finish(&f, mark);
}

Test(baselines, redo_resets_a_dormant_expert_unit) {
    fx f;
    setup(&f, 1, 2);
    const int H = 5, D = 4, e = 1;
    /* expert 1, hidden layer 0, unit 2: incoming w1[1] row 2 and b1[1][2]; outgoing wh[1][0] column 2 */
    silence(&f, "layers.0.experts.w1", "layers.0.experts.b1", (size_t)e * H * D, (size_t)e * H, D, 2, -1);
    unsigned char *mark = redo_on(&f, 1);
    const sm_moe *q = f.m->layers[0].moe;
    cr_expect_gt(q->route.offset[e + 1] - q->route.offset[e], 0, "expert 1 got no rows");
    /* wh is (E, L-1, H, H): expert 1's first block starts at e (L-1) H H */
    mark_unit(&f, mark, "layers.0.experts.w1", "layers.0.experts.b1", (size_t)e * H * D, (size_t)e * H, D,
              "layers.0.experts.wh", (size_t)e * 2 * H * H, H, H, 2);
    finish(&f, mark);
}

Test(baselines, cbp_replaces_the_lowest_utility_mature_units) {
    fx f;
    setup(&f, 0, 3);
    silence(&f, "layers.0.weight", "layers.0.bias", 0, 0, 4, 3, 0.01); /* h = 0.01: the lowest utility of layer 0 */
    sm_params *ps = &f.m->params;
    sm_real *head = sm_params_data(ps, sm_params_find(ps, "head.weight")); /* (3, 5) */
    for (int o = 0; o < 3; o++) head[o * 5 + 2] = (sm_real)1e-4; /* layer 1's unit 2 contributes little */
    sm_model_forward(f.m, f.x, T, NULL, 1);
    /* unit 2 of layer 1 must be the lowest: its mean activation times 3e-4 against the others' */
    snapshot(&f);
    sm_error err;
    sm_rng r;
    sm_rng_seed(&r, 9);
    /* a first step with maturity 1 replaces nothing (every age is 1) */
    sm_cbp *c = sm_cbp_create(f.m, 0.2, 0.99, 1, &err);
    cr_assert(c, "%s", err.msg);
    cr_expect_eq(sm_cbp_step(c, f.m, &f.opt, T, &r), 0);
    unsigned char *mark = calloc(ps->total, 1);
    expect_only(&f, mark);
    /* the second: 6 and 5 mature units at rate 0.2 -> one unit per layer */
    cr_expect_eq(sm_cbp_step(c, f.m, &f.opt, T, &r), 2);
    /* the next biases took the mean contribution w_out f, f = mean h / (1 - 0.99^2) with the running
     * mean 0.99 * 0.01 h + 0.01 h over two steps = (1 - 0.99^2) h, so f = h (0.01 for layer 0's unit 3);
     * layer 1's unit 2 was replaced first (deepest first), so its bias is 0 + its fresh w_out f */
    const sm_real *b1 = sm_params_data(ps, sm_params_find(ps, "layers.1.bias"));
    const size_t o1 = ps->p[sm_params_find(ps, "layers.1.bias")].offset;
    const sm_real *W1 = f.data + ps->p[sm_params_find(ps, "layers.1.weight")].offset;
    for (int o = 0; o < 5; o++) {
        mark[o1 + o] = 2;
        double want = f.data[o1 + o] + W1[o * 6 + 3] * 0.01;
        if (o != 2) cr_expect(fabs(b1[o] - want) < 1e-5, "layers.1.bias[%d] %g, want %g", o, (double)b1[o], want);
        else cr_expect(b1[o] != 0 && fabs(b1[o]) <= 0.01, "layers.1.bias[2] %g: 0 plus a fresh weight times 0.01", (double)b1[o]);
    }
    const size_t oh = ps->p[sm_params_find(ps, "head.bias")].offset;
    for (int o = 0; o < 3; o++) mark[oh + o] = 2;
    mark_unit(&f, mark, "layers.0.weight", "layers.0.bias", 0, 0, 4, "layers.1.weight", 0, 5, 6, 3);
    mark_unit(&f, mark, "layers.1.weight", "layers.1.bias", 0, 0, 6, "head.weight", 0, 3, 5, 2);
    sm_cbp_free(c);
    finish(&f, mark);
}

/* the agent-facing object refuses what cannot work, with the reason */
Test(baselines, refusals) {
    sm_rng r;
    sm_rng_seed(&r, 4);
    sm_model *m = baselines_fixture(0, SM_ACT_RELU, 4, &r);
    sm_error err;
    sm_baselines_config bad_redo = {.redo = 1, .redo_every = 0, .redo_tau = 0.1};
    cr_expect_null(sm_baselines_create(&bad_redo, m, &r, &err));
    cr_expect(strstr(err.msg, "redo"), "%s", err.msg);
    cr_expect_null(sm_cbp_create(m, 2, 0.99, 100, &err));
    cr_expect(strstr(err.msg, "cbp"), "%s", err.msg);
    sm_model_free(m);
}
