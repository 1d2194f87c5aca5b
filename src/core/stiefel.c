/* The Stiefel manifold: Haar frames, tangent projection, QR retraction (see include/specmoe/stiefel.h).
 *
 * Letters: r frame rank, d ambient dimension. A frame R is (r, d) row-major with orthonormal rows; the
 * same memory read column-major with leading dimension d is U = R^T (d, r), which LAPACK factorises
 * in place.
 */
#include "specmoe/core/stiefel.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/ops.h"

/* one spelling of the LAPACK calls for both builds (float library, -DSPECMOE_DOUBLE twin) */
#ifdef SPECMOE_DOUBLE
#define SM_GEQRF_WORK LAPACKE_dgeqrf_work
#define SM_ORGQR_WORK LAPACKE_dorgqr_work
#else
#define SM_GEQRF_WORK LAPACKE_sgeqrf_work
#define SM_ORGQR_WORK LAPACKE_sorgqr_work
#endif

int sm_stiefel_shape(int ndim, const int64_t *shape, int *E, int *r, int *d) {
    int64_t e, rr, dd;
    if (ndim == 2) {
        e = 1, rr = shape[0], dd = shape[1];
    } else if (ndim == 3) {
        e = shape[0], rr = shape[1], dd = shape[2];
    } else {
        return -1;
    }
    if (e < 1 || rr < 1 || rr > dd || dd > INT32_MAX || e > INT32_MAX) return -1;
    *E = (int)e, *r = (int)rr, *d = (int)dd;
    return 0;
}

static int all_finite(const sm_real *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

sm_status sm_stiefel_retract_qr(sm_real *R, int r, int d, sm_real *work, sm_error *err) {
    if (r < 1 || r > d) return sm_fail(err, SM_ERR_ARG, "stiefel: frame rank r=%d must be in [1, d=%d]", r, d);
    if (!all_finite(R, (size_t)r * d))
        return sm_fail(err, SM_ERR_NUMERIC, "stiefel: retraction of a (%d, %d) frame with a NaN/Inf entry", r, d);
    sm_real *tau = work, *sgn = work + r, *lwork = work + 2 * r;
    const lapack_int lw = (lapack_int)SM_STIEFEL_QR_NB * r;
    /* U = R^T (d x r, column-major, lda = d) = Q Rf; Householder QR never fails on finite input, rank
     * deficient or not, so info != 0 can only mean an argument error */
    lapack_int info = SM_GEQRF_WORK(LAPACK_COL_MAJOR, d, r, R, d, tau, lwork, lw);
    if (info != 0)
        return sm_fail(err, SM_ERR_NUMERIC, "stiefel: geqrf failed (info %d) on a (%d, %d) frame", (int)info, r, d);
    /* the diagonal of Rf sits at U[j, j] = R[j*d + j]; remember its signs before orgqr overwrites it */
    for (int j = 0; j < r; j++) sgn[j] = R[(size_t)j * d + j] < 0 ? (sm_real)-1 : (sm_real)1;
    info = SM_ORGQR_WORK(LAPACK_COL_MAJOR, d, r, r, R, d, tau, lwork, lw);
    if (info != 0)
        return sm_fail(err, SM_ERR_NUMERIC, "stiefel: orgqr failed (info %d) on a (%d, %d) frame", (int)info, r, d);
    /* sign fix: column j of Q (= row j of R) times sign(Rf_jj), so Rf has a positive diagonal and qf is
     * unique (and equal to Gram-Schmidt on the rows, in order) */
    for (int j = 0; j < r; j++)
        if (sgn[j] < 0)
            for (int i = 0; i < d; i++) R[(size_t)j * d + i] = -R[(size_t)j * d + i];
    return SM_OK;
}

/* row i of R minus its components along rows 0..i-1 (assumed orthonormal); returns the squared norm
 * of what is left. Dot products in double. */
static double orthogonalize_row(sm_real *R, int i, int d) {
    sm_real *x = R + (size_t)i * d;
    for (int k = 0; k < i; k++) {
        const sm_real *q = R + (size_t)k * d;
        double c = 0;
        for (int j = 0; j < d; j++) c += (double)x[j] * q[j];
        for (int j = 0; j < d; j++) x[j] = (sm_real)(x[j] - c * q[j]);
    }
    double nn = 0;
    for (int j = 0; j < d; j++) nn += (double)x[j] * x[j];
    return nn;
}

int sm_stiefel_orthonormalize_gs(sm_real *R, int r, int d) {
    if (!all_finite(R, (size_t)r * d)) return -1;
    for (int i = 0; i < r; i++) {
        sm_real *x = R + (size_t)i * d;
        double n0 = 0;
        for (int j = 0; j < d; j++) n0 += (double)x[j] * x[j];
        orthogonalize_row(R, i, d);
        double nn = orthogonalize_row(R, i, d); /* second pass: twice is enough */
        /* a row (numerically) inside the span of the previous ones carries no direction of its own:
         * replace it by the standard basis vector e_j farthest from that span, 1 - sum_k R_kj^2 being
         * the squared norm of e_j's residual */
        if (!(nn > 1e-10 * n0) || nn == 0) {
            int best = 0;
            double best_res = -1;
            for (int j = 0; j < d; j++) {
                double res = 1;
                for (int k = 0; k < i; k++) res -= (double)R[(size_t)k * d + j] * R[(size_t)k * d + j];
                if (res > best_res) best_res = res, best = j;
            }
            memset(x, 0, sizeof(sm_real) * (size_t)d);
            x[best] = 1;
            orthogonalize_row(R, i, d);
            nn = orthogonalize_row(R, i, d);
        }
        const double inv = 1 / sqrt(nn);
        for (int j = 0; j < d; j++) x[j] = (sm_real)(x[j] * inv);
    }
    return 0;
}

sm_status sm_stiefel_haar(sm_real *R, int r, int d, sm_rng *rng, sm_error *err) {
    if (r < 1 || r > d) return sm_fail(err, SM_ERR_ARG, "stiefel: frame rank r=%d must be in [1, d=%d]", r, d);
    sm_real *work = malloc(sizeof(sm_real) * SM_STIEFEL_WORK(r));
    if (!work) return sm_fail(err, SM_ERR_NOMEM, "stiefel: out of memory for a (%d, %d) Haar frame", r, d);
    /* the d x r Gaussian matrix, column-major = R row-major; drawn in memory order so the stream of
     * normals does not depend on the layout reading */
    for (size_t i = 0; i < (size_t)r * d; i++) R[i] = (sm_real)sm_rng_normal(rng);
    sm_status s = sm_stiefel_retract_qr(R, r, d, work, err);
    free(work);
    /* a Gaussian matrix is finite and of full rank with probability one; Gram-Schmidt gives the same
     * frame should LAPACK ever refuse */
    if (s != SM_OK && sm_stiefel_orthonormalize_gs(R, r, d) != 0) return s;
    return SM_OK;
}

void sm_stiefel_project(sm_real *G, const sm_real *R, int r, int d, sm_real *work) {
    sm_real *S = work; /* (r, r) */
    /* S = R G^T = U^T u */
    sm_gemm(0, 1, r, r, d, 1, R, d, G, d, 0, S, r);
    for (int i = 0; i < r; i++)
        for (int j = i + 1; j < r; j++) {
            sm_real s = (sm_real)0.5 * (S[i * r + j] + S[j * r + i]);
            S[i * r + j] = S[j * r + i] = s;
        }
    /* G -= sym(S) R, i.e. u -= U sym(U^T u) transposed */
    sm_gemm(0, 0, r, d, r, -1, S, r, R, d, 1, G, d);
}

double sm_stiefel_orth_error(const sm_real *R, int r, int d) {
    double worst = 0;
    for (int i = 0; i < r; i++)
        for (int k = i; k < r; k++) {
            double s = 0;
            for (int j = 0; j < d; j++) s += (double)R[(size_t)i * d + j] * R[(size_t)k * d + j];
            double e = fabs(s - (i == k ? 1.0 : 0.0));
            if (isnan(e)) return e; /* a NaN frame is as far from orthonormal as it gets */
            if (e > worst) worst = e;
        }
    return worst;
}
