/* SPHERE's penalty (Eq. 26, include/specmoe/methods/sphere/sphere.h) in double precision: its
 * gradient against finite differences in both branches (T < D: the sample-space Gram; T >= D: the
 * feature-space Gram), the two branches giving the same value on transposed-size problems, zero for
 * a Parseval frame (orthogonal columns of equal norm), and D times the variance of the eigenvalues
 * computed another way (from the Gram's own entries for D = 2). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "gradcheck.h"
#include "specmoe/methods/sphere/sphere.h"

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
