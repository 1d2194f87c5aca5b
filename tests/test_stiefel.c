/* The Stiefel manifold (Haar frames, tangent projection, QR retraction) and the Riemannian Adam / SGD
 * update of SM_PARAM_STIEFEL tensors in sm_optim_step.
 *
 * Layout (specmoe/stiefel.h): a frame is R (r, d) row-major with orthonormal rows, U = R^T.
 * Tolerances are float32 ones: one QR of an (8, 32) frame leaves R R^T - I at ~1e-7, so 1e-5 only
 * fails if orthonormality is lost or errors accumulate across steps.
 *
 * Run from the repo root: make build/tests/test_stiefel && build/tests/test_stiefel
 */
#include <criterion/criterion.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/optim.h"
#include "specmoe/core/params.h"
#include "specmoe/core/stiefel.h"

#ifdef SPECMOE_DOUBLE
#define SYEV LAPACKE_dsyev
#else
#define SYEV LAPACKE_ssyev
#endif

static sm_real *alloc_real(size_t n) {
    sm_real *p = calloc(n ? n : 1, sizeof(sm_real));
    cr_assert(p, "out of memory");
    return p;
}

static void haar(sm_real *R, int r, int d, sm_rng *rng) {
    sm_error err = {0};
    cr_assert_eq(sm_stiefel_haar(R, r, d, rng, &err), SM_OK, "%s", err.msg);
}

static void fill_normal(sm_real *x, size_t n, double scale, sm_rng *rng) {
    for (size_t i = 0; i < n; i++) x[i] = (sm_real)(scale * sm_rng_normal(rng));
}

/* max |R G^T + G R^T|: zero exactly when G is tangent at R */
static double tangent_error(const sm_real *R, const sm_real *G, int r, int d) {
    double worst = 0;
    for (int i = 0; i < r; i++)
        for (int k = 0; k < r; k++) {
            double s = 0;
            for (int j = 0; j < d; j++)
                s += (double)R[i * d + j] * G[k * d + j] + (double)G[i * d + j] * R[k * d + j];
            if (fabs(s) > worst) worst = fabs(s);
        }
    return worst;
}

static double max_abs_diff(const sm_real *a, const sm_real *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* ----------------------------------------------------------------------------- manifold primitives */

Test(stiefel, haar_frames_are_orthonormal) {
    static const int shapes[][2] = {{1, 1}, {1, 7}, {3, 3}, {4, 24}, {8, 32}, {16, 16}, {8, 200}, {40, 64}};
    sm_rng rng;
    sm_rng_seed(&rng, 1);
    sm_real *R = alloc_real(40 * 200), *R2 = alloc_real(40 * 200), *work = alloc_real(SM_STIEFEL_WORK(40));
    sm_error err = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int r = shapes[s][0], d = shapes[s][1];
        for (int rep = 0; rep < 5; rep++) {
            haar(R, r, d, &rng);
            double e = sm_stiefel_orth_error(R, r, d);
            cr_expect_leq(e, 1e-5, "Haar (%d, %d): max|R R^T - I| = %.3e", r, d, e);
            /* with the sign fix, qf of a frame is the frame itself: the retraction is idempotent */
            memcpy(R2, R, sizeof(sm_real) * (size_t)r * d);
            cr_assert_eq(sm_stiefel_retract_qr(R2, r, d, work, &err), SM_OK, "%s", err.msg);
            double id = max_abs_diff(R, R2, (size_t)r * d);
            cr_expect_leq(id, 1e-5, "(%d, %d): qf(R) differs from R by %.3e", r, d, id);
        }
    }
    free(R);
    free(R2);
    free(work);
}

/* Haar statistics: E[U U^T] = (r/d) I_d, and E[U] = 0. Without the column-sign fix LAPACK's
 * Householder convention makes U[0][0] = -|z_00| / |z_0| < 0 on every draw, so E[U_00] = 0 catches a
 * missing fix. N = 4000 draws put the standard error of each mean near 0.005. */
Test(stiefel, haar_distribution_moments) {
    enum { r = 2, d = 5, N = 4000 };
    sm_rng rng;
    sm_rng_seed(&rng, 2);
    sm_real R[r * d];
    double P[d * d] = {0}, mean[r * d] = {0};
    for (int t = 0; t < N; t++) {
        haar(R, r, d, &rng);
        for (int i = 0; i < r * d; i++) mean[i] += R[i] / (double)N;
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++)
                for (int k = 0; k < r; k++) P[a * d + b] += (double)R[k * d + a] * R[k * d + b] / N;
    }
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) {
            double want = a == b ? (double)r / d : 0;
            cr_expect(fabs(P[a * d + b] - want) < 0.03, "E[U U^T][%d][%d] = %.4f, want %.4f", a, b, P[a * d + b], want);
        }
    for (int i = 0; i < r * d; i++) cr_expect(fabs(mean[i]) < 0.03, "E[R][%d] = %.4f, want 0", i, mean[i]);
}

Test(stiefel, projection_is_tangent_and_idempotent) {
    static const int shapes[][2] = {{1, 6}, {4, 24}, {8, 32}, {12, 12}};
    sm_rng rng;
    sm_rng_seed(&rng, 3);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int r = shapes[s][0], d = shapes[s][1];
        size_t n = (size_t)r * d;
        sm_real *R = alloc_real(n), *G = alloc_real(n), *G2 = alloc_real(n), *work = alloc_real(SM_STIEFEL_WORK(r));
        haar(R, r, d, &rng);
        fill_normal(G, n, 1.0, &rng);
        sm_stiefel_project(G, R, r, d, work);
        double te = tangent_error(R, G, r, d);
        cr_expect_leq(te, 1e-5, "(%d, %d): max|R G^T + G R^T| = %.3e after projection", r, d, te);
        memcpy(G2, G, sizeof(sm_real) * n);
        sm_stiefel_project(G2, R, r, d, work);
        double id = max_abs_diff(G, G2, n);
        cr_expect_leq(id, 1e-5, "(%d, %d): projecting twice moved G by %.3e", r, d, id);
        /* the normal part R^T-symmetric: a vector S R with S symmetric projects to zero */
        for (int i = 0; i < r; i++)
            for (int j = 0; j < d; j++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += (1.0 + (i + k) % 3) * R[k * d + j]; /* S_ik = 1 + (i+k)%3 */
                G2[i * d + j] = (sm_real)acc;
            }
        sm_stiefel_project(G2, R, r, d, work);
        double nz = 0;
        for (size_t i = 0; i < n; i++) nz = fmax(nz, fabs(G2[i]));
        cr_expect_leq(nz, 1e-5, "(%d, %d): normal vector S R projects to %.3e, want 0", r, d, nz);
        free(R), free(G), free(G2), free(work);
    }
}

Test(stiefel, retraction_of_a_tangent_step_is_orthonormal_and_second_order) {
    static const int shapes[][2] = {{1, 6}, {4, 24}, {8, 32}, {12, 12}};
    sm_rng rng;
    sm_rng_seed(&rng, 4);
    sm_error err = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int r = shapes[s][0], d = shapes[s][1];
        size_t n = (size_t)r * d;
        sm_real *R = alloc_real(n), *X = alloc_real(n), *Y = alloc_real(n), *xi = alloc_real(n),
                *work = alloc_real(SM_STIEFEL_WORK(r));
        haar(R, r, d, &rng);
        fill_normal(xi, n, 1.0, &rng);
        sm_stiefel_project(xi, R, r, d, work);
        double nrm = 0;
        for (size_t i = 0; i < n; i++) nrm += (double)xi[i] * xi[i];
        nrm = sqrt(nrm);
        for (size_t i = 0; i < n; i++) xi[i] = (sm_real)(xi[i] / nrm); /* ||xi||_F = 1 */
        for (int k = 0; k < 3; k++) {
            double t = k == 0 ? 0.1 : k == 1 ? 0.03 : 0.01;
            for (size_t i = 0; i < n; i++) X[i] = Y[i] = (sm_real)(R[i] + t * xi[i]);
            cr_assert_eq(sm_stiefel_retract_qr(X, r, d, work, &err), SM_OK, "%s", err.msg);
            double e = sm_stiefel_orth_error(X, r, d);
            cr_expect_leq(e, 1e-5, "(%d, %d) t=%g: retracted frame has max|R R^T - I| = %.3e", r, d, t, e);
            /* qf(R + t xi) = R + t xi + O(t^2) for tangent xi: a first-order retraction that agrees
             * with the exponential map to first order */
            double dev = max_abs_diff(X, Y, n);
            cr_expect_leq(dev, t * t, "(%d, %d) t=%g: |qf(R + t xi) - (R + t xi)| = %.3e > t^2", r, d, t, dev);
        }
        /* Gram-Schmidt fallback gives the same frame as the sign-fixed QR */
        for (size_t i = 0; i < n; i++) X[i] = Y[i] = (sm_real)(R[i] + 0.3 * xi[i]);
        cr_assert_eq(sm_stiefel_retract_qr(X, r, d, work, &err), SM_OK, "%s", err.msg);
        cr_assert_eq(sm_stiefel_orthonormalize_gs(Y, r, d), 0);
        double gs = max_abs_diff(X, Y, n);
        cr_expect_leq(gs, 1e-5, "(%d, %d): Gram-Schmidt and QR differ by %.3e", r, d, gs);
        free(R), free(X), free(Y), free(xi), free(work);
    }
}

Test(stiefel, rejects_bad_input) {
    sm_real R[6] = {1, 0, 0, 0, NAN, 0}, work[SM_STIEFEL_WORK(3)];
    sm_error err = {0};
    cr_expect_eq(sm_stiefel_retract_qr(R, 2, 3, work, &err), SM_ERR_NUMERIC);
    cr_expect(isnan(R[4]), "a rejected frame must be left as it was");
    cr_expect_eq(sm_stiefel_retract_qr(R, 3, 2, work, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "r=3") != NULL, "message: %s", err.msg);
    cr_expect(isnan(sm_stiefel_orth_error(R, 2, 3)));
    /* a rank-deficient input still becomes a frame under Gram-Schmidt */
    sm_real D[6] = {1, 2, 3, 2, 4, 6};
    cr_expect_eq(sm_stiefel_orthonormalize_gs(D, 2, 3), 0);
    cr_expect_leq(sm_stiefel_orth_error(D, 2, 3), 1e-6);

    /* the optimiser refuses a Stiefel tensor that is not (E, r, d) / (r, d) with r <= d */
    sm_params ps;
    sm_params_init_table(&ps);
    int64_t shape[3] = {2, 5, 3};
    cr_assert_geq(sm_params_add(&ps, "bad_frames", 3, shape, SM_INIT_ZERO, 0, 0, SM_PARAM_STIEFEL, &err), 0);
    cr_assert_eq(sm_params_alloc(&ps, &err), SM_OK);
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    sm_optim o;
    cr_expect_eq(sm_optim_init(&o, &oc, &ps, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "bad_frames") != NULL, "message: %s", err.msg);
    sm_params_free(&ps);
}

/* ------------------------------------------------------------------------- the Riemannian optimiser */

/* One table with a single Stiefel tensor (E, r, d), Haar-initialised frame by frame. */
static void stiefel_table(sm_params *ps, int E, int r, int d, sm_rng *rng) {
    sm_error err = {0};
    sm_params_init_table(ps);
    int64_t shape[3] = {E, r, d};
    cr_assert_geq(sm_params_add(ps, "frames", 3, shape, SM_INIT_ZERO, 0, 0, SM_PARAM_STIEFEL, &err), 0, "%s",
                  err.msg);
    cr_assert_eq(sm_params_alloc(ps, &err), SM_OK, "%s", err.msg);
    for (int e = 0; e < E; e++) haar(ps->data + (size_t)e * r * d, r, d, rng);
}

Test(stiefel, frames_stay_orthonormal_after_10k_adam_steps) {
    enum { E = 4, r = 8, d = 32, STEPS = 10000 };
    const size_t n = (size_t)r * d;
    sm_rng rng;
    sm_rng_seed(&rng, 5);
    sm_params ps;
    stiefel_table(&ps, E, r, d, &rng);
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = SM_OPT_ADAM;
    oc.lr = 1e-2;
    sm_optim o;
    sm_error err = {0};
    cr_assert_eq(sm_optim_init(&o, &oc, &ps, &err), SM_OK, "%s", err.msg);
    /* a real objective plus noise: pull every frame toward a fixed random target T_e,
     * loss = sum_e ||R_e - T_e||^2 / 2 + <noise, R>, so the frames keep moving for all 10k steps */
    sm_real *T = alloc_real(E * n);
    fill_normal(T, E * n, 1.0, &rng);
    double worst_during = 0;
    for (int s = 0; s < STEPS; s++) {
        for (size_t i = 0; i < E * n; i++) ps.grad[i] = (sm_real)(ps.data[i] - T[i] + 0.5 * sm_rng_normal(&rng));
        sm_optim_step(&o, &ps, oc.lr);
        if (s % 100 == 99)
            for (int e = 0; e < E; e++) worst_during = fmax(worst_during, sm_stiefel_orth_error(ps.data + e * n, r, d));
    }
    double worst = 0, worst_tangent = 0;
    for (int e = 0; e < E; e++) {
        worst = fmax(worst, sm_stiefel_orth_error(ps.data + e * n, r, d));
        /* the first moment was transported: it is tangent at the current point */
        worst_tangent = fmax(worst_tangent, tangent_error(ps.data + e * n, o.m + e * n, r, d));
    }
    fprintf(stderr, "stiefel: after %d Riemannian Adam steps (E=%d, r=%d, d=%d, lr %g): max|R R^T - I| = %.3e "
            "(worst seen every 100 steps %.3e), max|R m^T + m R^T| = %.3e\n",
            STEPS, E, r, d, oc.lr, worst, worst_during, worst_tangent);
    cr_expect_leq(worst, 1e-5, "max orthonormality error %.3e after %d steps", worst, STEPS);
    cr_expect_leq(worst_during, 1e-5, "max orthonormality error %.3e during the run", worst_during);
    cr_expect_leq(worst_tangent, 1e-5, "first moment not tangent: %.3e", worst_tangent);
    free(T);
    sm_optim_free(&o);
    sm_params_free(&ps);
}

/* Top-r eigenvalue problem: maximise tr(U^T Sigma U) over St(r, d). The maximisers are the frames
 * spanning the top-r eigenvectors of Sigma (Ky Fan), maximum = sum of the top-r eigenvalues.
 * Sigma = Q diag(lambda) Q^T with Q a Haar rotation, top eigenvalues 10, 8, 6, 4 and the rest in
 * [0.5, 2]: a gap of 2 between lambda_4 and lambda_5, so the optimum is well posed. The eigenvectors
 * used for checking come from LAPACK's syev, not from Q. */
typedef struct {
    double dist;    /* ||U U^T - V V^T||_F */
    double rel_gap; /* (sum top-r eigenvalues - tr(U^T Sigma U)) / sum */
} toy_result;

static toy_result run_toy(sm_opt_kind kind, double lr0, double lr1, double momentum, long steps, uint64_t seed) {
    enum { d = 24, r = 4 };
    sm_rng rng;
    sm_rng_seed(&rng, seed);
    sm_real *Q = alloc_real(d * d), *S = alloc_real(d * d), *A = alloc_real(d * d), *w = alloc_real(d);
    haar(Q, d, d, &rng);
    double lambda[d];
    static const double top[r] = {10, 8, 6, 4};
    for (int i = 0; i < d; i++) lambda[i] = i < r ? top[i] : 0.5 + 1.5 * sm_rng_uniform(&rng);
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) {
            double s = 0;
            for (int k = 0; k < d; k++) s += lambda[k] * Q[k * d + a] * Q[k * d + b]; /* rows of Q = eigvecs */
            S[a * d + b] = (sm_real)s;
        }
    for (int a = 0; a < d; a++)
        for (int b = 0; b < a; b++) S[a * d + b] = S[b * d + a]; /* exactly symmetric */
    /* reference eigenvectors: syev, ascending eigenvalues, eigenvectors in the columns of A */
    memcpy(A, S, sizeof(sm_real) * d * d);
    cr_assert_eq(SYEV(LAPACK_ROW_MAJOR, 'V', 'U', d, A, d, w), 0, "syev failed");
    double best = 0;
    for (int k = d - r; k < d; k++) best += w[k];
    cr_assert(fabs(best - 28) < 1e-3, "syev: top-%d eigenvalue sum %.6f, constructed 28", r, best);

    sm_params ps;
    stiefel_table(&ps, 1, r, d, &rng);
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = kind;
    oc.lr = lr0;
    oc.momentum = momentum;
    sm_optim o;
    sm_error err = {0};
    cr_assert_eq(sm_optim_init(&o, &oc, &ps, &err), SM_OK, "%s", err.msg);
    sm_schedule sch = {.kind = SM_SCHED_COSINE, .base_lr = lr0, .final_lr = lr1, .warmup = 0, .total_steps = steps};
    sm_real *R = ps.data, *G = ps.grad;
    for (long s = 0; s < steps; s++) {
        /* f(U) = -tr(U^T Sigma U), df/dU = -2 Sigma U; in the row layout G = -2 R Sigma */
        for (int i = 0; i < r; i++)
            for (int b = 0; b < d; b++) {
                double acc = 0;
                for (int a = 0; a < d; a++) acc += (double)R[i * d + a] * S[a * d + b];
                G[i * d + b] = (sm_real)(-2 * acc);
            }
        sm_optim_step(&o, &ps, sm_schedule_lr(&sch, s));
    }
    /* objective and projection distance, in double */
    double obj = 0;
    for (int i = 0; i < r; i++)
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) obj += (double)R[i * d + a] * S[a * d + b] * R[i * d + b];
    double dist2 = 0;
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) {
            double uu = 0, vv = 0;
            for (int k = 0; k < r; k++) uu += (double)R[k * d + a] * R[k * d + b];
            for (int k = d - r; k < d; k++) vv += (double)A[a * d + k] * A[b * d + k];
            dist2 += (uu - vv) * (uu - vv);
        }
    cr_expect_leq(sm_stiefel_orth_error(R, r, d), 1e-5);
    toy_result res = {sqrt(dist2), (best - obj) / best};
    sm_optim_free(&o);
    sm_params_free(&ps);
    free(Q), free(S), free(A), free(w);
    return res;
}

Test(stiefel, adam_finds_the_top_eigenspace) {
    for (uint64_t seed = 10; seed < 13; seed++) {
        toy_result t = run_toy(SM_OPT_ADAM, 5e-2, 1e-4, 0, 1500, seed);
        fprintf(stderr, "stiefel: Riemannian Adam, seed %llu: ||UU^T - VV^T||_F = %.3e, objective gap %.3e relative\n",
                (unsigned long long)seed, t.dist, t.rel_gap);
        cr_expect_lt(t.dist, 1e-2, "seed %llu: projection distance %.3e", (unsigned long long)seed, t.dist);
        cr_expect(fabs(t.rel_gap) < 1e-4, "seed %llu: relative objective gap %.3e", (unsigned long long)seed,
                  t.rel_gap);
    }
}

Test(stiefel, sgd_finds_the_top_eigenspace) {
    for (uint64_t seed = 10; seed < 13; seed++) {
        toy_result t = run_toy(SM_OPT_SGD, 2e-2, 2e-2, 0.9, 1000, seed);
        fprintf(stderr, "stiefel: Riemannian SGD (momentum 0.9), seed %llu: ||UU^T - VV^T||_F = %.3e, objective "
                "gap %.3e relative\n", (unsigned long long)seed, t.dist, t.rel_gap);
        cr_expect_lt(t.dist, 1e-2, "seed %llu: projection distance %.3e", (unsigned long long)seed, t.dist);
        cr_expect(fabs(t.rel_gap) < 1e-4, "seed %llu: relative objective gap %.3e", (unsigned long long)seed,
                  t.rel_gap);
    }
}

/* ------------------------------------------------- a Stiefel and a plain tensor in the same table */

/* Reference implementations in double, written from the formulas (geoopt RiemannianAdam /
 * RiemannianSGD, torch Adam/AdamW/SGD), with the retraction done by Gram-Schmidt: for a full-rank
 * matrix the sign-fixed QR factor is exactly the Gram-Schmidt orthonormalisation of the rows. */
static void ref_project(double *G, const double *R, int r, int d) {
    double S[64 * 64];
    for (int i = 0; i < r; i++)
        for (int k = 0; k < r; k++) {
            double s = 0;
            for (int j = 0; j < d; j++) s += R[i * d + j] * G[k * d + j];
            S[i * r + k] = s;
        }
    double P[64 * 64];
    for (int i = 0; i < r; i++)
        for (int k = 0; k < r; k++) P[i * r + k] = 0.5 * (S[i * r + k] + S[k * r + i]);
    for (int i = 0; i < r; i++)
        for (int j = 0; j < d; j++) {
            double s = 0;
            for (int k = 0; k < r; k++) s += P[i * r + k] * R[k * d + j];
            G[i * d + j] -= s;
        }
}

static void ref_gram_schmidt(double *R, int r, int d) {
    for (int i = 0; i < r; i++) {
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < i; k++) {
                double c = 0;
                for (int j = 0; j < d; j++) c += R[i * d + j] * R[k * d + j];
                for (int j = 0; j < d; j++) R[i * d + j] -= c * R[k * d + j];
            }
        double nn = 0;
        for (int j = 0; j < d; j++) nn += R[i * d + j] * R[i * d + j];
        for (int j = 0; j < d; j++) R[i * d + j] /= sqrt(nn);
    }
}

static void mixed_table_case(sm_opt_kind kind, double wd, double momentum) {
    enum { E = 3, r = 4, d = 9, PN = 35, FE = 2, FR = 2, FD = 5, STEPS = 5 };
    const int n = r * d;
    sm_rng rng;
    sm_rng_seed(&rng, 20 + (uint64_t)kind);
    sm_error err = {0};
    sm_params ps;
    sm_params_init_table(&ps);
    int64_t s_plain[2] = {5, 7}, s_frames[3] = {E, r, d}, s_frozen[3] = {FE, FR, FD}, s_bias[1] = {6};
    int ip = sm_params_add(&ps, "plain", 2, s_plain, SM_INIT_NORMAL, 0, 0.5, 0, &err);
    int is = sm_params_add(&ps, "frames", 3, s_frames, SM_INIT_ZERO, 0, 0, SM_PARAM_STIEFEL, &err);
    int iz = sm_params_add(&ps, "frozen_frames", 3, s_frozen, SM_INIT_ZERO, 0, 0,
                           SM_PARAM_STIEFEL | SM_PARAM_FROZEN, &err);
    int ib = sm_params_add(&ps, "bias", 1, s_bias, SM_INIT_NORMAL, 0, 0.5, SM_PARAM_NO_DECAY, &err);
    cr_assert(ip >= 0 && is >= 0 && iz >= 0 && ib >= 0, "%s", err.msg);
    cr_assert_eq(sm_params_alloc(&ps, &err), SM_OK, "%s", err.msg);
    sm_params_initialize(&ps, &rng);
    sm_real *W = sm_params_data(&ps, is), *Z = sm_params_data(&ps, iz);
    for (int e = 0; e < E; e++) haar(W + e * n, r, d, &rng);
    for (int e = 0; e < FE; e++) haar(Z + e * FR * FD, FR, FD, &rng);
    sm_real *Z0 = alloc_real(FE * FR * FD);
    memcpy(Z0, Z, sizeof(sm_real) * FE * FR * FD);

    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = kind;
    oc.weight_decay = wd;
    oc.momentum = momentum;
    sm_optim o;
    cr_assert_eq(sm_optim_init(&o, &oc, &ps, &err), SM_OK, "%s", err.msg);

    /* reference state in double: plain tensors (35 + 6 values), the frames, their moments */
    double pw[PN + 6], pm[PN + 6] = {0}, pv[PN + 6] = {0};
    double fw[E * r * d], fm[E * r * d] = {0}, fv[E] = {0};
    for (int j = 0; j < PN; j++) pw[j] = sm_params_data(&ps, ip)[j];
    for (int j = 0; j < 6; j++) pw[PN + j] = sm_params_data(&ps, ib)[j];
    for (int j = 0; j < E * n; j++) fw[j] = W[j];

    const double b1 = oc.beta1, b2 = oc.beta2, eps = oc.eps;
    for (int step = 1; step <= STEPS; step++) {
        const double lr = 1e-2 * (1 + 0.5 * step); /* a different lr every step, as a schedule would */
        fill_normal(ps.grad, ps.total, 1.0, &rng);
        double g[PN + 6], fg[E * r * d];
        for (int j = 0; j < PN; j++) g[j] = sm_params_grad(&ps, ip)[j];
        for (int j = 0; j < 6; j++) g[PN + j] = sm_params_grad(&ps, ib)[j];
        for (int j = 0; j < E * n; j++) fg[j] = sm_params_grad(&ps, is)[j];
        sm_optim_step(&o, &ps, lr);

        const double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        /* plain tensors: torch semantics */
        for (int j = 0; j < PN + 6; j++) {
            int nodecay = j >= PN;
            if (kind == SM_OPT_SGD) {
                double gj = g[j] + wd * pw[j];
                if (momentum > 0) gj = pm[j] = step == 1 ? gj : momentum * pm[j] + gj;
                pw[j] -= lr * gj;
            } else {
                double gj = g[j] + (kind == SM_OPT_ADAM ? wd * pw[j] : 0);
                if (kind == SM_OPT_ADAMW && !nodecay) pw[j] *= 1 - lr * wd;
                pm[j] = b1 * pm[j] + (1 - b1) * gj;
                pv[j] = b2 * pv[j] + (1 - b2) * gj * gj;
                pw[j] -= lr / bc1 * pm[j] / (sqrt(pv[j]) / sqrt(bc2) + eps);
            }
        }
        /* the frames: Riemannian, no weight decay */
        for (int e = 0; e < E; e++) {
            double *R = fw + e * n, *M = fm + e * n, *rg = fg + e * n;
            ref_project(rg, R, r, d);
            if (kind == SM_OPT_SGD) {
                const double *dir = rg;
                if (momentum > 0) {
                    for (int j = 0; j < n; j++) M[j] = step == 1 ? rg[j] : momentum * M[j] + rg[j];
                    dir = M;
                }
                for (int j = 0; j < n; j++) R[j] -= lr * dir[j];
            } else {
                double sq = 0;
                for (int j = 0; j < n; j++) {
                    M[j] = b1 * M[j] + (1 - b1) * rg[j];
                    sq += rg[j] * rg[j];
                }
                fv[e] = b2 * fv[e] + (1 - b2) * sq;
                const double denom = sqrt(fv[e] / bc2) + eps;
                for (int j = 0; j < n; j++) R[j] -= lr / bc1 * M[j] / denom;
            }
            ref_gram_schmidt(R, r, d);
            if (kind != SM_OPT_SGD || momentum > 0) ref_project(M, R, r, d);
        }

        double dp = 0, dfw = 0, dfm = 0, dfv = 0;
        for (int j = 0; j < PN; j++) dp = fmax(dp, fabs(sm_params_data(&ps, ip)[j] - pw[j]));
        for (int j = 0; j < 6; j++) dp = fmax(dp, fabs(sm_params_data(&ps, ib)[j] - pw[PN + j]));
        const sm_real *om = o.m + ps.p[is].offset, *ov = o.v + ps.p[is].offset;
        for (int j = 0; j < E * n; j++) {
            dfw = fmax(dfw, fabs(W[j] - fw[j]));
            if (kind != SM_OPT_SGD || momentum > 0) dfm = fmax(dfm, fabs(om[j] - fm[j]));
        }
        if (kind != SM_OPT_SGD)
            for (int e = 0; e < E; e++) {
                dfv = fmax(dfv, fabs(ov[e * n] - fv[e]) / fv[e]);
                for (int j = 1; j < n; j++) cr_assert_eq(ov[e * n + j], 0, "v must hold one value per frame");
            }
        cr_expect_leq(dp, 1e-5, "%s step %d: plain tensors differ from the formula by %.3e", sm_opt_name(kind), step,
                      dp);
        cr_expect_leq(dfw, 1e-5, "%s step %d: frames differ from the reference by %.3e", sm_opt_name(kind), step, dfw);
        cr_expect_leq(dfm, 1e-5, "%s step %d: first moment differs by %.3e", sm_opt_name(kind), step, dfm);
        cr_expect_leq(dfv, 1e-5, "%s step %d: per-frame second moment differs by %.3e relative",
                      sm_opt_name(kind), step, dfv);
        for (int e = 0; e < E; e++) cr_expect_leq(sm_stiefel_orth_error(W + e * n, r, d), 1e-5);
    }
    cr_expect_eq(memcmp(Z, Z0, sizeof(sm_real) * FE * FR * FD), 0, "a frozen Stiefel tensor moved");
    free(Z0);
    sm_optim_free(&o);
    sm_params_free(&ps);
}

Test(stiefel, mixed_table_adam) { mixed_table_case(SM_OPT_ADAM, 0.0, 0); }
Test(stiefel, mixed_table_adamw_decay_skips_frames) { mixed_table_case(SM_OPT_ADAMW, 0.1, 0); }
Test(stiefel, mixed_table_adam_l2_skips_frames) { mixed_table_case(SM_OPT_ADAM, 0.05, 0); }
Test(stiefel, mixed_table_sgd_momentum) { mixed_table_case(SM_OPT_SGD, 0.01, 0.9); }
Test(stiefel, mixed_table_sgd_plain) { mixed_table_case(SM_OPT_SGD, 0.0, 0); }
