/* Spectral penalties and diagnostics (see include/specmoe/spectral.h). */
#include "specmoe/core/spectral.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/ops.h"

static void normalise(sm_real *x, int n) {
    double s = sqrt(sm_sumsq(x, (size_t)n));
    if (s < 1e-30) s = 1e-30;
    for (int i = 0; i < n; i++) x[i] = (sm_real)(x[i] / s);
}

sm_status sm_power_iter_init(sm_power_iter *p, int m, int n, sm_rng *rng, sm_error *err) {
    memset(p, 0, sizeof *p);
    if (m < 1 || n < 1) return sm_fail(err, SM_ERR_ARG, "power iteration: matrix must be at least 1x1 (got %dx%d)", m, n);
    p->m = m;
    p->n = n;
    p->u = malloc(sizeof(sm_real) * m);
    p->v = malloc(sizeof(sm_real) * n);
    p->work = malloc(sizeof(sm_real) * (m > n ? m : n));
    if (!p->u || !p->v || !p->work) {
        sm_power_iter_free(p);
        return sm_fail(err, SM_ERR_NOMEM, "power iteration: out of memory");
    }
    for (int i = 0; i < m; i++) p->u[i] = (sm_real)sm_rng_normal(rng);
    for (int i = 0; i < n; i++) p->v[i] = (sm_real)sm_rng_normal(rng);
    normalise(p->u, m);
    normalise(p->v, n);
    return SM_OK;
}

void sm_power_iter_free(sm_power_iter *p) {
    free(p->u);
    free(p->v);
    free(p->work);
    memset(p, 0, sizeof *p);
}

double sm_power_iter_run(sm_power_iter *p, const sm_real *W, int iters) {
    const int m = p->m, n = p->n;
    for (int it = 0; it < iters; it++) {
        sm_gemm(1, 0, n, 1, m, 1, W, n, p->u, 1, 0, p->v, 1); /* v = W^T u */
        normalise(p->v, n);
        sm_gemm(0, 0, m, 1, n, 1, W, n, p->v, 1, 0, p->u, 1); /* u = W v */
        normalise(p->u, m);
    }
    sm_gemm(0, 0, m, 1, n, 1, W, n, p->v, 1, 0, p->work, 1); /* W v */
    double s = 0;
    for (int i = 0; i < m; i++) s += (double)p->u[i] * p->work[i];
    return s;
}

/* dW += c u v^T */
static void add_outer(sm_real *dW, const sm_power_iter *p, double c) {
    for (int i = 0; i < p->m; i++)
        for (int j = 0; j < p->n; j++) dW[(size_t)i * p->n + j] += (sm_real)(c * p->u[i] * p->v[j]);
}

double sm_spectral_norm_penalty(sm_power_iter *p, const sm_real *W, sm_real *dW, double sigma_t, double weight,
                                int iters) {
    double s = sm_power_iter_run(p, W, iters), g = s - sigma_t;
    if (dW) add_outer(dW, p, weight * 2 * g);
    return weight * g * g;
}

double sm_stable_rank_penalty(sm_power_iter *p, const sm_real *W, sm_real *dW, double rho_t, double weight, int iters) {
    const size_t mn = (size_t)p->m * p->n;
    double s = sm_power_iter_run(p, W, iters), fro = sm_sumsq(W, mn);
    if (s < 1e-30) s = 1e-30;
    double sr = fro / (s * s), g = sr - rho_t;
    if (dW) {
        double c = weight * 2 * g;
        for (size_t i = 0; i < mn; i++) dW[i] += (sm_real)(c * 2 * W[i] / (s * s));
        add_outer(dW, p, -c * 2 * fro / (s * s * s));
    }
    return weight * g * g;
}

double sm_diversity_penalty(const sm_real *probs, sm_real *dprobs, int T, int E, double weight) {
    /* P_e = mean_t p_te; CV^2 = V / mu^2 with V = mean_e (P_e - mu)^2 (population variance) */
    double P[1024];
    if (E > 1024 || T < 1) return 0;
    double mu = 0, V = 0;
    for (int e = 0; e < E; e++) {
        double a = 0;
        for (int t = 0; t < T; t++) a += probs[(size_t)t * E + e];
        P[e] = a / T;
        mu += P[e] / E;
    }
    for (int e = 0; e < E; e++) V += (P[e] - mu) * (P[e] - mu) / E;
    if (mu < 1e-30) return 0;
    if (dprobs)
        for (int e = 0; e < E; e++) {
            /* d(V/mu^2)/dP_e = 2 (P_e - mu) / (E mu^2) - 2 V / (E mu^3) */
            double g = weight * (2 * (P[e] - mu) / (E * mu * mu) - 2 * V / (E * mu * mu * mu)) / T;
            for (int t = 0; t < T; t++) dprobs[(size_t)t * E + e] += (sm_real)g;
        }
    return weight * V / (mu * mu);
}

sm_status sm_singular_values(const sm_real *W, int m, int n, double *sv, sm_error *err) {
    if (m < 1 || n < 1) return sm_fail(err, SM_ERR_ARG, "svd: empty matrix %dx%d", m, n);
    double *a = malloc(sizeof(double) * (size_t)m * n);
    if (!a) return sm_fail(err, SM_ERR_NOMEM, "svd: out of memory for %dx%d", m, n);
    for (size_t i = 0; i < (size_t)m * n; i++) a[i] = W[i];
    /* jobz N: no vectors; LAPACKE still checks the leading dimensions of U (m) and VT (n) */
    lapack_int info = LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'N', m, n, a, n, sv, NULL, m, NULL, n);
    free(a);
    if (info != 0) return sm_fail(err, SM_ERR_NUMERIC, "svd: LAPACKE_dgesdd failed (info %d) on a %dx%d matrix", (int)info, m, n);
    return SM_OK;
}

double sm_effective_rank(const double *sv, int n) {
    double sum = 0, h = 0;
    for (int i = 0; i < n; i++) sum += sv[i] > 0 ? sv[i] : 0;
    if (sum <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (sv[i] > 0) h -= sv[i] / sum * log(sv[i] / sum);
    return exp(h);
}
