/* SPHERE Fig. 6's picture, computed: the routing-weighted features phi (N, D) of a held-out batch in
 * the plane of their two leading singular directions, each state coloured by its dominant singular
 * direction (include/specmoe/methods/sphere/sphere.h). phi = U S V^T (LAPACKE dgesdd, no centring: A =
 * phi^T phi / N is SPHERE's uncentred Gram), state t at (U[t,0] s_0, U[t,1] s_1) = (phi_t v_0, phi_t v_1),
 * colour argmax over j < r of |U[t,j]| s_j = |phi_t v_j|, r the directions kept. A policy whose features
 * collapse onto few directions shows few colours; a wide spectrum shows many. */
#include "specmoe/methods/sphere/sphere.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>

sm_status sm_sphere_fig6(const sm_real *phi, int N, int D, int r, double *xy, int *color, double *sv, sm_error *err) {
    if (N < 2 || D < 2) return sm_fail(err, SM_ERR_ARG, "fig6: need at least 2 states and 2 features (got %d x %d)", N, D);
    const int q = N < D ? N : D;
    if (r < 1) return sm_fail(err, SM_ERR_ARG, "fig6: need at least one direction (got %d)", r);
    if (r > q) r = q;
    double *a = malloc(sizeof(double) * (size_t)N * D), *s = malloc(sizeof(double) * q), *u = malloc(sizeof(double) * (size_t)N * q),
           *vt = malloc(sizeof(double) * (size_t)q * D);
    sm_status st = SM_OK;
    if (!a || !s || !u || !vt) {
        st = sm_fail(err, SM_ERR_NOMEM, "fig6: out of memory for %d x %d features", N, D);
        goto done;
    }
    for (size_t i = 0; i < (size_t)N * D; i++) a[i] = phi[i];
    lapack_int info = LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', N, D, a, D, s, u, q, vt, D);
    if (info != 0) {
        st = sm_fail(err, SM_ERR_NUMERIC, "fig6: LAPACKE_dgesdd failed (info %d) on %d x %d features", (int)info, N, D);
        goto done;
    }
    for (int t = 0; t < N; t++) {
        xy[2 * t] = u[(size_t)t * q] * s[0];
        xy[2 * t + 1] = u[(size_t)t * q + 1] * s[1];
        int best = 0;
        for (int j = 1; j < r; j++)
            if (fabs(u[(size_t)t * q + j]) * s[j] > fabs(u[(size_t)t * q + best]) * s[best]) best = j;
        color[t] = best;
    }
    if (sv)
        for (int j = 0; j < q; j++) sv[j] = s[j];
done:
    free(a), free(s), free(u), free(vt);
    return st;
}
