/* Adam / AdamW over a whole parameter block (src/optim.c: one parallel pass, each thread a
 * contiguous slice of the block, spanning tensor boundaries). Checked against a plain serial loop
 * written here from torch's formula, for a table large enough to take the parallel path, with a
 * frozen tensor, a NO_DECAY tensor and tensors cut by the thread slices:
 *   - every element updated exactly once, in the same bits as the serial loop;
 *   - frozen tensors untouched, NO_DECAY honoured by AdamW (and ignored by Adam's L2 term, as torch);
 *   - the same bits for 1 and 2 threads.
 * (The PyTorch comparison itself is in tests/test_reference.c, on a smaller table.)
 *
 * Run from the repo root: make build/tests/test_optim && build/tests/test_optim
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/optim.h"
#include "specmoe/core/params.h"

#ifdef SPECMOE_DOUBLE
#define R_SQRT sqrt
#else
#define R_SQRT sqrtf
#endif

/* a (70001), b (3001, NO_DECAY), c (5003, FROZEN), d (40009): 118,014 elements, above the
 * 65,536-element parallel threshold, with odd sizes so the thread slices cut inside tensors */
static void make_table(sm_params *ps) {
    sm_error err;
    sm_params_init_table(ps);
    const struct { const char *name; int64_t n; unsigned flags; } t[] = {
        {"a", 70001, 0}, {"b", 3001, SM_PARAM_NO_DECAY}, {"c", 5003, SM_PARAM_FROZEN}, {"d", 40009, 0}};
    for (int i = 0; i < 4; i++)
        cr_assert_geq(sm_params_add(ps, t[i].name, 1, &t[i].n, SM_INIT_NORMAL, 1, 0.5, t[i].flags, &err), 0, "%s",
                      err.msg);
    cr_assert_eq(sm_params_alloc(ps, &err), SM_OK, "%s", err.msg);
    sm_rng rng;
    sm_rng_seed(&rng, 11);
    sm_params_initialize(ps, &rng);
}

static void set_grads(sm_params *ps, int step) {
    sm_rng rng;
    sm_rng_seed(&rng, 100 + (uint64_t)step);
    for (size_t j = 0; j < ps->total; j++) ps->grad[j] = (sm_real)sm_rng_normal(&rng);
}

/* torch's Adam / AdamW, one element at a time, over the table in order */
static void reference_step(const sm_optim_config *c, const sm_params *ps, sm_real *w, sm_real *m, sm_real *v,
                           const sm_real *g, long step, double lr) {
    const double bc1 = 1 - pow(c->beta1, (double)step), bc2 = 1 - pow(c->beta2, (double)step);
    const sm_real b1 = (sm_real)c->beta1, b2 = (sm_real)c->beta2, eps = (sm_real)c->eps;
    const sm_real step_size = (sm_real)(lr / bc1), isbc2 = (sm_real)(1 / sqrt(bc2));
    for (int i = 0; i < ps->n; i++) {
        const sm_param *q = &ps->p[i];
        if (q->flags & SM_PARAM_FROZEN) continue;
        int decoupled = c->kind == SM_OPT_ADAMW;
        double wd = decoupled && (q->flags & SM_PARAM_NO_DECAY) ? 0 : c->weight_decay;
        const sm_real decay = (sm_real)(decoupled ? 1 - lr * wd : 1), l2 = (sm_real)(decoupled ? 0 : wd);
        for (size_t j = q->offset; j < q->offset + q->numel; j++) {
            sm_real gj = g[j] + l2 * w[j];
            sm_real wj = w[j] * decay;
            m[j] = b1 * m[j] + (1 - b1) * gj;
            v[j] = b2 * v[j] + (1 - b2) * gj * gj;
            w[j] = wj - step_size * m[j] / (R_SQRT(v[j]) * isbc2 + eps);
        }
    }
}

/* 3 steps of sm_optim_step with `threads` threads; returns the final parameters (caller frees) */
static sm_real *run(sm_opt_kind kind, int threads) {
    sm_params ps;
    make_table(&ps);
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = kind;
    oc.weight_decay = 0.1;
    sm_optim opt;
    sm_error err;
    cr_assert_eq(sm_optim_init(&opt, &oc, &ps, &err), SM_OK, "%s", err.msg);
    const size_t N = ps.total;
    sm_real *w = malloc(N * sizeof(sm_real)), *m = calloc(N, sizeof(sm_real)), *v = calloc(N, sizeof(sm_real)),
            *frozen0 = malloc(N * sizeof(sm_real));
    memcpy(w, ps.data, N * sizeof(sm_real));
    memcpy(frozen0, ps.data, N * sizeof(sm_real));
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    for (int s = 1; s <= 3; s++) {
        set_grads(&ps, s);
        sm_optim_step(&opt, &ps, 1e-2);
        reference_step(&oc, &ps, w, m, v, ps.grad, s, 1e-2);
    }
    omp_set_num_threads(saved);
    /* the block pass against the serial loop */
    size_t mism = 0, first = N;
    for (size_t j = 0; j < N; j++)
        if (memcmp(&w[j], &ps.data[j], sizeof(sm_real)) || memcmp(&m[j], &opt.m[j], sizeof(sm_real)) ||
            memcmp(&v[j], &opt.v[j], sizeof(sm_real))) {
            if (first == N) first = j;
            mism++;
        }
    cr_assert_eq(mism, 0, "%s, %d threads: %zu of %zu elements differ from the serial loop (first at %zu)",
                 sm_opt_name(kind), threads, mism, N, first);
    int c = sm_params_find(&ps, "c");
    const sm_param *qc = &ps.p[c];
    cr_assert(!memcmp(ps.data + qc->offset, frozen0 + qc->offset, qc->numel * sizeof(sm_real)),
              "the frozen tensor changed");
    /* the parameters really moved (a no-op optimiser would also "match" a no-op reference) */
    int a = sm_params_find(&ps, "a");
    cr_assert_neq(ps.data[ps.p[a].offset], frozen0[ps.p[a].offset], "parameters did not move");
    sm_real *out = malloc(N * sizeof(sm_real));
    memcpy(out, ps.data, N * sizeof(sm_real));
    free(w); free(m); free(v); free(frozen0);
    sm_optim_free(&opt);
    sm_params_free(&ps);
    return out;
}

/* both thread counts against the serial loop, then against each other */
static void check_kind(sm_opt_kind kind) {
    sm_real *one = run(kind, 1), *two = run(kind, 2);
    sm_params ps;
    make_table(&ps);
    cr_assert(!memcmp(one, two, ps.total * sizeof(sm_real)), "%s: 1 and 2 threads give different bits",
              sm_opt_name(kind));
    sm_params_free(&ps);
    free(one);
    free(two);
}

Test(optim, adamw_block_pass_equals_serial_loop_and_is_thread_count_independent) { check_kind(SM_OPT_ADAMW); }

Test(optim, adam_l2_block_pass_equals_serial_loop_and_is_thread_count_independent) { check_kind(SM_OPT_ADAM); }

/* RMSprop against torch.optim.RMSprop's update written out here (momentum 0), centered and not,
 * with L2 weight decay, over a few steps. */
static void check_rmsprop(int centered) {
    sm_params ps;
    sm_error err;
    sm_params_init_table(&ps);
    const int64_t n = 257;
    cr_assert_geq(sm_params_add(&ps, "w", 1, &n, SM_INIT_NORMAL, 1, 0.5, 0, &err), 0);
    cr_assert_eq(sm_params_alloc(&ps, &err), SM_OK);
    sm_rng rng;
    sm_rng_seed(&rng, 5);
    sm_params_initialize(&ps, &rng);
    sm_optim_config c;
    sm_optim_config_default(&c);
    c.kind = SM_OPT_RMSPROP;
    c.lr = 2.5e-4;
    c.alpha = 0.95;
    c.eps = 0.01;
    c.centered = centered;
    c.weight_decay = 0.1;
    sm_optim o;
    cr_assert_eq(sm_optim_init(&o, &c, &ps, &err), SM_OK, "%s", err.msg);
    double w[257], sq[257] = {0}, ga[257] = {0};
    for (int j = 0; j < n; j++) w[j] = ps.data[j];
    for (int step = 0; step < 4; step++) {
        for (int j = 0; j < n; j++) ps.grad[j] = (sm_real)sin(0.37 * j + step);
        for (int j = 0; j < n; j++) {
            double g = (double)ps.grad[j] + 0.1 * w[j];
            sq[j] = 0.95 * sq[j] + 0.05 * g * g;
            double avg;
            if (centered) {
                ga[j] = 0.95 * ga[j] + 0.05 * g;
                avg = sqrt(sq[j] - ga[j] * ga[j]) + 0.01;
            } else {
                avg = sqrt(sq[j]) + 0.01;
            }
            w[j] -= 2.5e-4 * g / avg;
        }
        sm_optim_step(&o, &ps, 2.5e-4);
        for (int j = 0; j < n; j++) cr_assert(fabs(ps.data[j] - w[j]) < 1e-6, "step %d elem %d: %g vs %g", step, j, (double)ps.data[j], w[j]);
    }
    sm_optim_free(&o);
    sm_params_free(&ps);
}

Test(optim, rmsprop_matches_torch_formula) { check_rmsprop(0); }
Test(optim, rmsprop_centered_matches_torch_formula) { check_rmsprop(1); }
