/* Finite-difference gradient checking in double precision (the test binaries named test_grad_*
 * link the -DSPECMOE_DOUBLE build of the library, so sm_real is double here).
 *
 * Two checks per tensor, as in ggml's test-backend-ops grad mode and kann's kad_check_grad:
 *  - central differences on random coordinates, scored by relative error;
 *  - one random direction u over the tensor: <grad, u> against (L(x+hu) - L(x-hu)) / 2h.
 * A coordinate whose central difference changes between step h and h/2 sits on a kink (ReLU at 0,
 * a top-k tie, a capacity boundary): it is skipped, never scored with a looser tolerance. A check
 * fails if more than a quarter of its coordinates had to be skipped, so it cannot pass vacuously.
 */
#ifndef SPECMOE_GRADCHECK_H
#define SPECMOE_GRADCHECK_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "specmoe/core/core.h"

#ifndef SPECMOE_DOUBLE
#error "gradient checks must be compiled with -DSPECMOE_DOUBLE"
#endif

typedef double (*gc_loss_fn)(void *ctx);

#define GC_H 1e-5
#define GC_TOL 1e-6

/* Error of analytic a against numeric b, in units of the allowed error: tol * max(|a|,|b|) plus the
 * round-off floor of a central difference, ~1e-14 * (|L| + 1) / h for a loss of size |L| (a
 * gradient far below that floor is not resolvable by finite differences at all). */
static inline double gc_score(double a, double b, double tol, double floor) {
    double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return fabs(a - b) / (tol * m + floor);
}

/* Checks analytic gradient g (n) of loss(ctx) w.r.t. x (n). Returns the worst score (<= 1 passes). */
static inline double gc_check(const char *what, sm_real *x, const sm_real *g, size_t n, gc_loss_fn loss, void *ctx,
                              sm_rng *rng, int ncoords) {
    double worst = 0;
    int checked = 0, skipped = 0;
    const double L0 = loss(ctx), floor = 1e-14 * (fabs(L0) + 1) / (GC_H / 2);
    int m = (size_t)ncoords < n ? ncoords : (int)n;
    for (int c = 0; c < m; c++) {
        size_t i = (size_t)ncoords >= n ? (size_t)c : sm_rng_below(rng, (uint32_t)n);
        sm_real x0 = x[i];
        double nd[2];
        for (int s = 0; s < 2; s++) {
            double h = GC_H / (1 << s);
            x[i] = x0 + h;
            double lp = loss(ctx);
            x[i] = x0 - h;
            double lm = loss(ctx);
            nd[s] = (lp - lm) / (2 * h);
        }
        x[i] = x0;
        if (gc_score(nd[0], nd[1], 1e-4, floor) > 1) { /* the step size matters: a kink */
            skipped++;
            continue;
        }
        double r = gc_score(g[i], nd[1], GC_TOL, floor);
        if (r > worst) worst = r;
        if (r > 1) cr_log_error("%s[%zu]: analytic %.10g numeric %.10g (score %.3g)", what, i, (double)g[i], nd[1], r);
        checked++;
    }
    /* random direction */
    sm_real *x0 = malloc(n * sizeof(sm_real)), *u = malloc(n * sizeof(sm_real));
    double dot = 0, h = GC_H;
    for (size_t i = 0; i < n; i++) {
        x0[i] = x[i];
        u[i] = (sm_real)sm_rng_normal(rng);
        dot += (double)g[i] * u[i];
    }
    for (size_t i = 0; i < n; i++) x[i] = x0[i] + h * u[i];
    double lp = loss(ctx);
    for (size_t i = 0; i < n; i++) x[i] = x0[i] - h * u[i];
    double lm = loss(ctx);
    for (size_t i = 0; i < n; i++) x[i] = x0[i];
    double nd = (lp - lm) / (2 * h);
    /* the direction check also crosses kinks when any coordinate does: only score it if half-steps agree */
    for (size_t i = 0; i < n; i++) x[i] = x0[i] + h / 2 * u[i];
    double lp2 = loss(ctx);
    for (size_t i = 0; i < n; i++) x[i] = x0[i] - h / 2 * u[i];
    double lm2 = loss(ctx);
    for (size_t i = 0; i < n; i++) x[i] = x0[i];
    double nd2 = (lp2 - lm2) / h;
    if (gc_score(nd, nd2, 1e-4, floor) <= 1) {
        double r = gc_score(dot, nd2, GC_TOL, floor);
        if (r > 1) cr_log_error("%s: direction analytic %.10g numeric %.10g (score %.3g)", what, dot, nd2, r);
        if (r > worst) worst = r;
    }
    free(x0);
    free(u);
    cr_expect(skipped * 4 <= checked + skipped, "%s: %d of %d coordinates sat on kinks", what, skipped, checked + skipped);
    cr_expect(worst <= 1, "%s: worst error %.3g times the allowed (relative %.0e + round-off floor %.2g)", what, worst,
              GC_TOL, floor);
    return worst;
}

static inline void gc_fill_normal(sm_real *x, size_t n, double scale, sm_rng *rng) {
    for (size_t i = 0; i < n; i++) x[i] = (sm_real)(scale * sm_rng_normal(rng));
}

#endif
