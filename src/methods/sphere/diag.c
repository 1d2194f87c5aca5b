/* SPHERE's diagnostics on a held-out batch (include/specmoe/methods/sphere/sphere.h): the eNTK's
 * effective rank (Eq. 7) and the spectrum of the routing-weighted feature Gram (Eq. 26's A, Fig. 7). */
#include "specmoe/methods/sphere/sphere.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/ops.h"
#include "specmoe/core/spectral.h"
#include "specmoe/nn/router.h"

sm_status sm_sphere_diagnose(sm_model *m, const float *x, int N, const sm_real *u, sm_sphere_diag *out, sm_error *err) {
    memset(out, 0, sizeof *out);
    if (N < 1 || N > m->max_T) return sm_fail(err, SM_ERR_ARG, "sphere diagnostics: %d states, the model takes 1 to %d", N, m->max_T);
    sm_status st = sm_entk_rank_exact(m, x, N, u, &out->entk_srank, NULL, err);
    if (st != SM_OK) return st;
    const int n_moe = sm_model_n_moe(m);
    sm_moe *moe = n_moe ? sm_model_moe(m, n_moe - 1) : NULL;
    if (!moe || !sm_moe_has_features(moe) || moe->router->ops->kind != SM_ROUTE_SPARSE) return SM_OK;
    sm_model_forward(m, x, N, NULL, 0);
    const int D = moe->E * moe->H;
    sm_real *phi = malloc(sizeof(sm_real) * (size_t)N * D), *work = malloc(sizeof(sm_real) * sm_sphere_work_values(N, D));
    sm_real *K = malloc(sizeof(sm_real) * (size_t)N * N);
    double *Kd = malloc(sizeof(double) * (size_t)N * N), *w = malloc(sizeof(double) * (size_t)N);
    if (!phi || !work || !K || !Kd || !w) {
        st = sm_fail(err, SM_ERR_NOMEM, "sphere diagnostics: out of memory for %d x %d features", N, D);
        goto done;
    }
    if ((st = sm_sphere_features(moe, phi, err)) != SM_OK) goto done;
    out->penalty = sm_sphere_penalty(phi, N, D, NULL, 1, work);
    /* A's non-zero eigenvalues are those of the N x N Gram phi phi^T / N */
    sm_gemm(0, 1, N, N, D, (sm_real)1 / N, phi, D, phi, D, 0, K, N);
    for (size_t i = 0; i < (size_t)N * N; i++) Kd[i] = K[i];
    lapack_int info = LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'U', N, Kd, N, w);
    if (info != 0) {
        st = sm_fail(err, SM_ERR_NUMERIC, "sphere diagnostics: LAPACKE_dsyev failed (info %d) on the %d x %d Gram", (int)info, N, N);
        goto done;
    }
    for (int i = 0; i < N; i++) w[i] = w[i] > 0 ? w[i] : 0; /* round-off below zero */
    out->feature_srank = sm_effective_rank(w, N);
    double norm = 0;
    for (int t = 0; t < N; t++) norm += sqrt((double)K[(size_t)t * N + t] * N);
    out->feature_norm = norm / N;
    if (N >= 2 && (st = sm_sphere_specialisation(m, x, N, N - 1 < 5 ? N - 1 : 5, &out->spec, err)) != SM_OK) goto done;
    out->have_features = 1;
done:
    free(phi), free(work), free(K), free(Kd), free(w);
    return st;
}
