/* SSMoE eigenvector descriptors (see include/specmoe/ssmoe.h). */
#include "specmoe/ssmoe.h"

/* lapacke.h pulls in complex.h, whose macro I is the imaginary unit: rows are called nrow here */

#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Make the largest-magnitude component of v (n) positive. */
static void canonical_sign(double *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (fabs(v[i]) > fabs(v[best])) best = i;
    if (v[best] < 0)
        for (int i = 0; i < n; i++) v[i] = -v[i];
}

/* Shared tail: vectors V (r, d) rows ordered by singular value -> descriptor. */
static void select_and_average(double *out, double *V, int r, int d, const float *row, int c) {
    for (int j = 0; j < r; j++) canonical_sign(V + (size_t)j * d, d);
    if (c > r) c = r;
    int *idx = malloc(sizeof(int) * (size_t)r);
    double *score = malloc(sizeof(double) * (size_t)r);
    for (int j = 0; j < r; j++) {
        idx[j] = j;
        double s = 0;
        if (row)
            for (int i = 0; i < d; i++) s += V[(size_t)j * d + i] * row[i];
        score[j] = row ? s : -(double)j; /* averaged EV: by singular value order */
    }
    /* partial selection of the c largest scores, ties to the larger singular value (lower j) */
    for (int a = 0; a < c; a++) {
        int b = a;
        for (int j = a + 1; j < r; j++)
            if (score[idx[j]] > score[idx[b]] || (score[idx[j]] == score[idx[b]] && idx[j] < idx[b])) b = j;
        int t = idx[a];
        idx[a] = idx[b];
        idx[b] = t;
    }
    for (int i = 0; i < d; i++) out[i] = 0;
    for (int a = 0; a < c; a++)
        for (int i = 0; i < d; i++) out[i] += V[(size_t)idx[a] * d + i] / c;
    free(idx);
    free(score);
}

static sm_status check_args(const float *W, int nrow, int d, int c, sm_error *err) {
    if (!W || nrow < 1 || d < 1 || c < 1)
        return sm_fail(err, SM_ERR_ARG, "ev descriptor: need a matrix of at least 1x1 and c >= 1 (got %dx%d, c %d)", nrow, d, c);
    for (size_t i = 0; i < (size_t)nrow * d; i++)
        if (!isfinite(W[i])) return sm_fail(err, SM_ERR_NUMERIC, "ev descriptor: non-finite weight at index %zu", i);
    return SM_OK;
}

sm_status sm_ev_descriptor(double *out, const float *W, int nrow, int d, const float *row, int c, sm_error *err) {
    sm_status st = check_args(W, nrow, d, c, err);
    if (st != SM_OK) return st;
    int r = nrow < d ? nrow : d;
    double *a = malloc(sizeof(double) * (size_t)nrow * d), *s = malloc(sizeof(double) * (size_t)r);
    double *vt = malloc(sizeof(double) * (size_t)r * d), *u = malloc(sizeof(double) * (size_t)nrow * r);
    if (!a || !s || !vt || !u) {
        free(a); free(s); free(vt); free(u);
        return sm_fail(err, SM_ERR_NOMEM, "ev descriptor: out of memory for %dx%d", nrow, d);
    }
    for (size_t i = 0; i < (size_t)nrow * d; i++) a[i] = W[i];
    /* thin SVD in double: W = U diag(s) Vt, Vt (r, d) rows = right singular vectors, descending s */
    lapack_int info = LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', nrow, d, a, d, s, u, r, vt, d);
    if (info != 0) st = sm_fail(err, SM_ERR_NUMERIC, "ev descriptor: LAPACKE_dgesdd failed (info %d) on %dx%d", (int)info, nrow, d);
    else select_and_average(out, vt, r, d, row, c);
    free(a); free(s); free(vt); free(u);
    return st;
}

sm_status sm_ev_descriptor_eig(double *out, const float *W, int nrow, int d, const float *row, int c, sm_error *err) {
    sm_status st = check_args(W, nrow, d, c, err);
    if (st != SM_OK) return st;
    int r = nrow < d ? nrow : d;
    double *g = calloc((size_t)d * d, sizeof(double)), *w = malloc(sizeof(double) * (size_t)d);
    double *V = malloc(sizeof(double) * (size_t)r * d);
    if (!g || !w || !V) {
        free(g); free(w); free(V);
        return sm_fail(err, SM_ERR_NOMEM, "ev descriptor: out of memory for %dx%d", nrow, d);
    }
    for (int k = 0; k < nrow; k++) /* G = W^T W by brute force */
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) g[(size_t)i * d + j] += (double)W[(size_t)k * d + i] * W[(size_t)k * d + j];
    lapack_int info = LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'V', 'U', d, g, d, w); /* ascending eigenvalues */
    if (info != 0) {
        st = sm_fail(err, SM_ERR_NUMERIC, "ev descriptor: LAPACKE_dsyev failed (info %d)", (int)info);
    } else {
        /* eigenvector of the j-th largest eigenvalue = column d-1-j of g (row-major) */
        for (int j = 0; j < r; j++)
            for (int i = 0; i < d; i++) V[(size_t)j * d + i] = g[(size_t)i * d + (d - 1 - j)];
        select_and_average(out, V, r, d, row, c);
    }
    free(g); free(w); free(V);
    return st;
}

sm_status sm_model_build_ev(sm_model *m, sm_error *err) {
    const sm_params *ps = &m->params;
    for (int i = 0; i < m->n_layers; i++) {
        sm_moe *moe = m->layers[i].moe;
        if (!moe || strcmp(moe->router->cfg.name, "ev") != 0) continue;
        const sm_router_config *rc = &moe->router->cfg;
        char name[64];
        snprintf(name, sizeof name, "layers.%d.router.weight", i);
        int iw = sm_params_find(ps, name);
        snprintf(name, sizeof name, "layers.%d.router.ev", i);
        int iev = sm_params_find(ps, name);
        if (iw < 0 || iev < 0) return sm_fail(err, SM_ERR_MISMATCH, "ev: layer %d has no router weight / ev tensor", i);
        const int E = moe->E, d = moe->d, H = moe->H, O = moe->O;
        if (O != d) return sm_fail(err, SM_ERR_ARG, "ev: layer %d experts map %d -> %d; descriptors need d -> d", i, d, O);
        float *w = malloc(sizeof(float) * (size_t)H * d), *row = malloc(sizeof(float) * (size_t)d);
        double *desc = malloc(sizeof(double) * (size_t)d);
        sm_status st = (w && row && desc) ? SM_OK : sm_fail(err, SM_ERR_NOMEM, "ev: out of memory");
        sm_real *ev = sm_params_data(ps, iev);
        for (int e = 0; e < E && st == SM_OK; e++) {
            for (int k = 0; k < d; k++) row[k] = (float)sm_params_data(ps, iw)[(size_t)e * d + k];
            for (int j = 0; j < 2 && st == SM_OK; j++) {
                /* j = 0: W1_e (H, d) as stored; j = 1: W2_e (d, H) transposed to (H, d) */
                for (int h = 0; h < H; h++)
                    for (int k = 0; k < d; k++)
                        w[(size_t)h * d + k] = (float)(j == 0 ? moe->w1[((size_t)e * H + h) * d + k]
                                                              : moe->w2[((size_t)e * d + k) * H + h]);
                st = sm_ev_descriptor(desc, w, H, d, rc->ev_avg ? NULL : row, rc->ev_c, err);
                for (int k = 0; k < d && st == SM_OK; k++) ev[((size_t)e * 2 + j) * d + k] = (sm_real)desc[k];
            }
        }
        free(w);
        free(row);
        free(desc);
        if (st != SM_OK) return st;
    }
    return SM_OK;
}
