/* GrMoE's synthetic routing task (see include/specmoe/synth.h). */
#include "specmoe/methods/grmoe/synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/ops.h"
#include "specmoe/core/stiefel.h"

sm_status sm_synth_setting(sm_synth_config *c, const char *name, sm_error *err) {
    memset(c, 0, sizeof *c);
    c->N = 8;
    c->d = 128;
    c->kr = 16;
    c->out = 16;
    if (!strcmp(name, "easy")) {
        c->rho = 0.1;
        c->sigma2 = 0.1;
    } else if (!strcmp(name, "hard")) {
        c->rho = 0.4;
        c->sigma2 = 0.5;
    } else {
        return sm_fail(err, SM_ERR_ARG, "synthetic task: unknown setting '%s' (easy|hard)", name);
    }
    return SM_OK;
}

double sm_mean_overlap(const sm_real *U, int N, int R, int d) {
    sm_real *O = malloc(sizeof(sm_real) * (size_t)R * R);
    if (!O) return NAN;
    double sum = 0;
    int pairs = 0;
    for (int a = 0; a < N; a++)
        for (int b = a + 1; b < N; b++) {
            sm_gemm(0, 1, R, R, d, 1, U + (size_t)a * R * d, d, U + (size_t)b * R * d, d, 0, O, R);
            sum += sm_sumsq(O, (size_t)R * R) / R;
            pairs++;
        }
    free(O);
    return pairs ? sum / pairs : 0;
}

/* U_e = orth(cos t Q_e + sin t S) for all e */
static void tilt(sm_real *U, const sm_real *Q, const sm_real *S, int N, int R, int d, double t) {
    for (int e = 0; e < N; e++) {
        sm_real *u = U + (size_t)e * R * d;
        const sm_real *q = Q + (size_t)e * R * d;
        for (size_t i = 0; i < (size_t)R * d; i++) u[i] = (sm_real)(cos(t) * q[i] + sin(t) * S[i]);
        sm_stiefel_orthonormalize_gs(u, R, d);
    }
}

sm_status sm_synth_create(sm_synth *s, const sm_synth_config *c, sm_rng *rng, sm_error *err) {
    memset(s, 0, sizeof *s);
    if (c->N < 1 || c->d < 1 || c->kr < 1 || c->kr > c->d || c->out < 1 || !(c->rho >= 0 && c->rho < 1) ||
        !(c->sigma2 >= 0))
        return sm_fail(err, SM_ERR_ARG, "synthetic task: need N, d, out >= 1, 1 <= k_r <= d, 0 <= rho < 1, sigma^2 >= 0");
    s->cfg = *c;
    const int N = c->N, d = c->d, R = c->kr;
    size_t fr = (size_t)R * d;
    s->U = malloc(sizeof(sm_real) * N * fr);
    s->W = malloc(sizeof(sm_real) * (size_t)N * c->out * d);
    sm_real *Q = malloc(sizeof(sm_real) * N * fr), *S = malloc(sizeof(sm_real) * fr);
    if (!s->U || !s->W || !Q || !S) {
        free(Q);
        free(S);
        sm_synth_free(s);
        return sm_fail(err, SM_ERR_NOMEM, "synthetic task: out of memory");
    }
    sm_status st = SM_OK;
    if ((size_t)N * R <= (size_t)d) { /* mutually orthogonal private frames: rows of one Haar frame */
        st = sm_stiefel_haar(Q, N * R, d, rng, err);
    } else {
        for (int e = 0; e < N && st == SM_OK; e++) st = sm_stiefel_haar(Q + e * fr, R, d, rng, err);
    }
    if (st == SM_OK) st = sm_stiefel_haar(S, R, d, rng, err);
    if (st == SM_OK) {
        /* overlap(theta) rises from overlap(Q) to 1: bisect for rho* */
        double lo = 0, hi = 1.5707963267948966;
        tilt(s->U, Q, S, N, R, d, lo);
        if (sm_mean_overlap(s->U, N, R, d) > c->rho) hi = lo;
        for (int it = 0; it < 60 && hi > lo; it++) {
            double mid = 0.5 * (lo + hi);
            tilt(s->U, Q, S, N, R, d, mid);
            if (sm_mean_overlap(s->U, N, R, d) < c->rho) lo = mid;
            else hi = mid;
        }
        tilt(s->U, Q, S, N, R, d, 0.5 * (lo + hi));
        s->overlap = sm_mean_overlap(s->U, N, R, d);
        for (size_t i = 0; i < (size_t)N * c->out * d; i++) s->W[i] = (sm_real)(sm_rng_normal(rng) / sqrt((double)d));
    }
    free(Q);
    free(S);
    if (st != SM_OK) sm_synth_free(s);
    return st;
}

void sm_synth_free(sm_synth *s) {
    free(s->U);
    free(s->W);
    s->U = s->W = NULL;
}

void sm_synth_sample(const sm_synth *s, float *x, float *y, int *comp, int T, sm_rng *rng) {
    const int N = s->cfg.N, d = s->cfg.d, R = s->cfg.kr, O = s->cfg.out;
    const double sigma = sqrt(s->cfg.sigma2);
    double *z = malloc(sizeof(double) * (size_t)(d > R ? d : R)), *coef = malloc(sizeof(double) * (size_t)R);
    double *xv = malloc(sizeof(double) * (size_t)d);
    for (int t = 0; t < T; t++) {
        int e = (int)sm_rng_below(rng, (uint32_t)N);
        comp[t] = e;
        const sm_real *U = s->U + (size_t)e * R * d;
        /* x = U_e^T-basis z1 + sigma (I - P_e) z2 */
        for (int i = 0; i < d; i++) z[i] = sm_rng_normal(rng);
        for (int j = 0; j < R; j++) { /* coefficients of z2 in the subspace, to remove them */
            double c = 0;
            for (int i = 0; i < d; i++) c += U[(size_t)j * d + i] * z[i];
            coef[j] = c;
        }
        for (int i = 0; i < d; i++) {
            double v = z[i];
            for (int j = 0; j < R; j++) v -= coef[j] * U[(size_t)j * d + i];
            xv[i] = sigma * v;
        }
        for (int j = 0; j < R; j++) {
            double g = sm_rng_normal(rng);
            for (int i = 0; i < d; i++) xv[i] += g * U[(size_t)j * d + i];
        }
        for (int i = 0; i < d; i++) x[(size_t)t * d + i] = (float)xv[i];
        const sm_real *W = s->W + (size_t)e * O * d;
        for (int o = 0; o < O; o++) {
            double v = 0;
            for (int i = 0; i < d; i++) v += W[(size_t)o * d + i] * xv[i];
            y[(size_t)t * O + o] = (float)v;
        }
    }
    free(z);
    free(coef);
    free(xv);
}

void sm_mean_ci95(const double *x, int n, double *mean, double *half) {
    /* two-sided 97.5% Student-t quantiles for 1..30 degrees of freedom, then the normal 1.96 */
    static const double t975[31] = {0,     12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                    2.201, 2.179,  2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080,
                                    2.074, 2.069,  2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
    double m = 0, v = 0;
    for (int i = 0; i < n; i++) m += x[i];
    m = n ? m / n : 0;
    for (int i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    *mean = m;
    if (n < 2) {
        *half = 0;
        return;
    }
    double sd = sqrt(v / (n - 1)), t = n - 1 <= 30 ? t975[n - 1] : 1.96;
    *half = t * sd / sqrt((double)n);
}
