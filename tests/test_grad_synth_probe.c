/* Finite-difference gradient check (double precision) of the supervised ceilings of bench routing
 * (include/specmoe/methods/grmoe/synth.h): the mean cross-entropy of a probe's logits against the
 * true components, for the linear softmax classifier (hidden 0) and the two-layer ReLU MLP, with
 * respect to every parameter. sm_synth_probe_loss accumulates its gradient, so it is checked from
 * a zeroed gradient and again from a non-zero one (accumulation, not overwrite). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "specmoe/methods/grmoe/synth.h"

enum { T = 7, D = 6, N = 4 };

typedef struct {
    sm_synth_probe p;
    sm_real x[T * D];
    int y[T];
} pctx;

static double ploss(void *c) {
    pctx *q = c;
    return sm_synth_probe_loss(&q->p, q->x, q->y, T, 0);
}

static void check_probe(int hidden, uint64_t seed) {
    pctx q;
    sm_rng rng;
    sm_rng_seed(&rng, seed);
    sm_error err;
    cr_assert_eq(sm_synth_probe_create(&q.p, D, N, hidden, T, &rng, &err), SM_OK, "%s", err.msg);
    gc_fill_normal(q.x, T * D, 1.0, &rng);
    for (int t = 0; t < T; t++) q.y[t] = (int)sm_rng_below(&rng, N);
    /* biases away from zero, so the ReLU units are not all on one side */
    gc_fill_normal(q.p.ps.data, q.p.ps.total, 0.7, &rng);
    sm_params_zero_grad(&q.p.ps);
    double L = sm_synth_probe_loss(&q.p, q.x, q.y, T, 1);
    cr_assert(L > 0 && isfinite(L), "loss %g", L);
    char name[192];
    for (int i = 0; i < q.p.ps.n; i++) {
        snprintf(name, sizeof name, "probe(h=%d):%s", hidden, q.p.ps.p[i].name);
        gc_check(name, sm_params_data(&q.p.ps, i), sm_params_grad(&q.p.ps, i), q.p.ps.p[i].numel, ploss, &q, &rng, 24);
    }
    /* accumulation: a second backward adds the same gradient again */
    sm_real *g1 = malloc(sizeof(sm_real) * q.p.ps.total);
    memcpy(g1, q.p.ps.grad, sizeof(sm_real) * q.p.ps.total);
    sm_synth_probe_loss(&q.p, q.x, q.y, T, 1);
    for (size_t i = 0; i < q.p.ps.total; i++) cr_expect(fabs(q.p.ps.grad[i] - 2 * g1[i]) <= 1e-12 * (1 + fabs(g1[i])));
    free(g1);
    sm_synth_probe_free(&q.p);
}

Test(grad_synth_probe, linear_softmax_classifier) { check_probe(0, 11); }
Test(grad_synth_probe, two_layer_mlp) { check_probe(5, 12); }
