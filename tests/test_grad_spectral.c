/* SR-MoE penalties: gradient checks (double precision) and agreement with LAPACK's SVD. */
#include <criterion/criterion.h>
#include <math.h>

#include "gradcheck.h"
#include "specmoe/core/spectral.h"

enum { M = 6, N = 4, T = 7, E = 5 };

typedef struct {
    sm_power_iter p;
    sm_real W[M * N];
    int which; /* 0 spectral norm, 1 stable rank */
} pen_ctx;

static double pen_loss(void *c_) {
    pen_ctx *c = c_;
    /* converged power iteration: the gradient u v^T is then exact */
    return c->which == 0 ? sm_spectral_norm_penalty(&c->p, c->W, NULL, 1.5, 0.7, 300)
                         : sm_stable_rank_penalty(&c->p, c->W, NULL, 1.2, 0.7, 300);
}

Test(grad_spectral, spectral_norm_and_stable_rank) {
    for (int which = 0; which < 2; which++) {
        pen_ctx c = {.which = which};
        sm_rng r;
        sm_rng_seed(&r, 3 + which);
        sm_error err;
        cr_assert_eq(sm_power_iter_init(&c.p, M, N, &r, &err), SM_OK);
        gc_fill_normal(c.W, M * N, 1, &r);
        sm_real dW[M * N] = {0};
        if (which == 0) sm_spectral_norm_penalty(&c.p, c.W, dW, 1.5, 0.7, 300);
        else sm_stable_rank_penalty(&c.p, c.W, dW, 1.2, 0.7, 300);
        gc_check(which ? "stable_rank" : "spectral_norm", c.W, dW, M * N, pen_loss, &c, &r, M * N);
        sm_power_iter_free(&c.p);
    }
}

typedef struct {
    sm_real probs[T * E];
} div_ctx;

static double div_loss(void *c_) { return sm_diversity_penalty(((div_ctx *)c_)->probs, NULL, T, E, 0.3); }

Test(grad_spectral, diversity_cv2) {
    div_ctx c;
    sm_rng r;
    sm_rng_seed(&r, 9);
    for (int i = 0; i < T * E; i++) c.probs[i] = (sm_real)(0.05 + sm_rng_uniform(&r));
    sm_real d[T * E] = {0};
    double v = sm_diversity_penalty(c.probs, d, T, E, 0.3);
    cr_expect(v > 0);
    gc_check("diversity", c.probs, d, T * E, div_loss, &c, &r, T * E);
    /* uniform routing has zero CV */
    for (int i = 0; i < T * E; i++) c.probs[i] = 1.0 / E;
    cr_expect_float_eq(sm_diversity_penalty(c.probs, NULL, T, E, 1), 0, 1e-15);
}

Test(grad_spectral, power_iteration_matches_lapack_and_effective_rank) {
    sm_rng r;
    sm_rng_seed(&r, 11);
    sm_real W[M * N];
    gc_fill_normal(W, M * N, 1, &r);
    double sv[N];
    sm_error err;
    cr_assert_eq(sm_singular_values(W, M, N, sv, &err), SM_OK);
    sm_power_iter p;
    sm_power_iter_init(&p, M, N, &r, &err);
    double s = sm_power_iter_run(&p, W, 500);
    cr_expect(fabs(s - sv[0]) < 1e-9 * sv[0], "power iteration %.12g vs svd %.12g", s, sv[0]);
    for (int i = 1; i < N; i++) cr_expect(sv[i] <= sv[i - 1]);
    double ones[5] = {1, 1, 1, 1, 1}, one[3] = {2, 0, 0};
    cr_expect_float_eq(sm_effective_rank(ones, 5), 5.0, 1e-12);
    cr_expect_float_eq(sm_effective_rank(one, 3), 1.0, 1e-12);
    sm_power_iter_free(&p);
}
