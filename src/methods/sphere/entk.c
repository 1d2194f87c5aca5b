/* The empirical NTK's effective rank, exactly (SPHERE Eq. 7; include/specmoe/methods/sphere/sphere.h).
 * N backward passes (two per state) and one N x N eigendecomposition: for the few hundred held-out
 * states of the paper's diagnostics. For larger batches stochastic Lanczos quadrature is the way
 * (Eqs. 28-29), not built yet. */
#include "specmoe/methods/sphere/sphere.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/ops.h"
#include "specmoe/core/spectral.h"

sm_status sm_entk_rank_exact(sm_model *m, const float *x, int N, const sm_real *u, double *rank, double *eig,
                             sm_error *err) {
    if (N < 1) return sm_fail(err, SM_ERR_ARG, "entk: need at least one state");
    const size_t P = m->params.total;
    const int V = m->cfg.n_classes, D = m->cfg.in_dim;
    sm_real *J = malloc(sizeof(sm_real) * (size_t)N * P), *g0 = malloc(sizeof(sm_real) * P);
    sm_real *K = malloc(sizeof(sm_real) * (size_t)N * N);
    double *Kd = malloc(sizeof(double) * (size_t)N * N), *w = malloc(sizeof(double) * (size_t)N);
    sm_status st = SM_OK;
    if (!J || !g0 || !K || !Kd || !w) {
        st = sm_fail(err, SM_ERR_NOMEM, "entk: out of memory for %d states x %zu parameters", N, P);
        goto done;
    }
    for (int i = 0; i < N; i++) {
        sm_model_forward(m, x + (size_t)i * D, 1, NULL, 0);
        for (int pass = 0; pass < 2; pass++) { /* d logits = 0, then u: the difference is u^T d logits / d theta */
            for (int v = 0; v < V; v++) m->dlogits[v] = pass ? u[v] : 0;
            sm_params_zero_grad(&m->params);
            sm_model_backward(m, 1);
            if (pass == 0) memcpy(g0, m->params.grad, sizeof(sm_real) * P);
        }
        sm_real *row = J + (size_t)i * P;
        for (size_t j = 0; j < P; j++) row[j] = m->params.grad[j] - g0[j];
    }
    sm_params_zero_grad(&m->params);
    sm_gemm(0, 1, N, N, (int)P, 1, J, (int)P, J, (int)P, 0, K, N); /* K = J J^T */
    for (size_t i = 0; i < (size_t)N * N; i++) Kd[i] = K[i];
    lapack_int info = LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'U', N, Kd, N, w);
    if (info != 0) {
        st = sm_fail(err, SM_ERR_NUMERIC, "entk: LAPACKE_dsyev failed (info %d) on the %d x %d kernel", (int)info, N, N);
        goto done;
    }
    /* dsyev: ascending; report descending, negative round-off clamped to 0 for the rank */
    for (int i = 0; i < N / 2; i++) {
        double t = w[i];
        w[i] = w[N - 1 - i];
        w[N - 1 - i] = t;
    }
    if (eig) memcpy(eig, w, sizeof(double) * (size_t)N);
    for (int i = 0; i < N; i++) w[i] = w[i] > 0 ? w[i] : 0;
    *rank = sm_effective_rank(w, N);
done:
    free(J), free(g0), free(K), free(Kd), free(w);
    return st;
}
