/* The eNTK effective rank by stochastic Lanczos quadrature (SPHERE App. A.5, Eqs. 28-29), for held-out
 * batches too large for sm_entk_rank_exact's N x P Jacobian.
 *
 * Eq. 28: with p_i = lambda_i / tr(K) over the eigenvalues of K = J J^T,
 *   H = -sum_i p_i log p_i = log tr(K) - tr(K log K) / tr(K),   srank = exp(H).
 * Eq. 29: each trace is a Hutchinson average over Gaussian probes z, z^T f(K) z, and each z^T f(K) z is
 * Gauss quadrature on the Lanczos tridiagonal T_m of K started at z / ||z||:
 *   z^T f(K) z ~ ||z||^2 sum_k (e_1^T y_k)^2 f(theta_k),   T_m = Y diag(theta) Y^T,
 * with f(x) = x for tr(K) and f(x) = x log x (0 at x <= 0) for tr(K log K), both from the same probes.
 * Lanczos runs in double with full reorthogonalisation (m <= a few dozen steps, so the basis is small)
 * and stops early at an invariant subspace (beta ~ 0: then the quadrature is exact for that probe).
 *
 * K's matrix-vector product K v = J (J^T v) without J (the paper: reverse- and forward-mode autodiff):
 *   J^T v  one batched backward of the forward on x with d logits_t = v_t u, minus the backward with
 *          d logits = 0 (the routers' auxiliary losses and the penalties add the same gradient to both
 *          and drop out, as in sm_entk_rank_exact);
 *   J w    the directional derivative of f_t = u^T logits(x_t) along w, by central differences
 *          (f(theta + h w) - f(theta - h w)) / 2h with h ||w||_inf = 1e-3 of the parameters' RMS
 *          (specmoe has no forward mode): exact for piecewise-linear networks unless the step crosses a
 *          kink or flips a routing choice; in the double build the test holds it to the exact rank.
 * Batches of at most m->max_T states; a router whose choices depend on the batch (capacity limits)
 * makes K differ from the per-state K of sm_entk_rank_exact. */
#include "specmoe/methods/sphere/sphere.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

sm_status sm_slq_effective_rank(int n, sm_matvec_fn mv, void *user, int probes, int steps, sm_rng *rng, double *rank,
                                double *rank_se, sm_error *err) {
    if (n < 1) return sm_fail(err, SM_ERR_ARG, "slq: need a dimension >= 1 (got %d)", n);
    if (probes < 1 || steps < 1) return sm_fail(err, SM_ERR_ARG, "slq: need probes >= 1 and steps >= 1 (got %d, %d)", probes, steps);
    const int m = steps < n ? steps : n;
    double *Q = malloc(sizeof(double) * (size_t)(m + 1) * n), *w = malloc(sizeof(double) * n), *z = malloc(sizeof(double) * n);
    double *a = malloc(sizeof(double) * m), *b = malloc(sizeof(double) * m), *Y = malloc(sizeof(double) * (size_t)m * m);
    double *tk = malloc(sizeof(double) * probes), *tl = malloc(sizeof(double) * probes);
    sm_status st = SM_OK;
    if (!Q || !w || !z || !a || !b || !Y || !tk || !tl) {
        st = sm_fail(err, SM_ERR_NOMEM, "slq: out of memory (%d x %d basis)", m + 1, n);
        goto done;
    }
    for (int p = 0; p < probes && st == SM_OK; p++) {
        double zz = 0;
        for (int i = 0; i < n; i++) z[i] = sm_rng_normal(rng), zz += z[i] * z[i];
        const double zn = sqrt(zz);
        for (int i = 0; i < n; i++) Q[i] = z[i] / zn;
        int k = 0; /* Lanczos steps done */
        for (; k < m; k++) {
            const double *q = Q + (size_t)k * n;
            mv(q, w, user);
            double al = 0;
            for (int i = 0; i < n; i++) al += q[i] * w[i];
            a[k] = al;
            /* full reorthogonalisation against every basis vector (twice is enough) */
            for (int pass = 0; pass < 2; pass++)
                for (int j = 0; j <= k; j++) {
                    const double *qj = Q + (size_t)j * n;
                    double d = 0;
                    for (int i = 0; i < n; i++) d += qj[i] * w[i];
                    for (int i = 0; i < n; i++) w[i] -= d * qj[i];
                }
            double be = 0;
            for (int i = 0; i < n; i++) be += w[i] * w[i];
            be = sqrt(be);
            b[k] = be;
            if (k + 1 == m || be <= 1e-12 * (fabs(a[0]) + 1e-300)) {
                k++;
                break;
            }
            for (int i = 0; i < n; i++) Q[(size_t)(k + 1) * n + i] = w[i] / be;
        }
        /* T_k = tridiag(b, a, b): eigenvalues theta and eigenvectors Y (LAPACKE dstev) */
        double *e = malloc(sizeof(double) * (k > 1 ? k - 1 : 1));
        if (!e) {
            st = sm_fail(err, SM_ERR_NOMEM, "slq: out of memory");
            break;
        }
        for (int j = 0; j + 1 < k; j++) e[j] = b[j];
        lapack_int info = LAPACKE_dstev(LAPACK_ROW_MAJOR, 'V', k, a, e, Y, k);
        free(e);
        if (info != 0) {
            st = sm_fail(err, SM_ERR_NUMERIC, "slq: LAPACKE_dstev failed (info %d) on a %d-step tridiagonal", (int)info, k);
            break;
        }
        double sk = 0, sl = 0;
        for (int j = 0; j < k; j++) {
            const double th = a[j], t2 = Y[j] * Y[j]; /* row 0 of Y: the first components */
            sk += t2 * th;
            if (th > 0) sl += t2 * th * log(th);
        }
        tk[p] = zz * sk;
        tl[p] = zz * sl;
    }
    if (st == SM_OK) {
        double sk = 0, sl = 0;
        for (int p = 0; p < probes; p++) sk += tk[p], sl += tl[p];
        if (!(sk > 0)) {
            st = sm_fail(err, SM_ERR_NUMERIC, "slq: the trace estimate is %g (the operator is zero or not positive)", sk / probes);
            goto done;
        }
        *rank = exp(log(sk / probes) - sl / sk);
        if (rank_se) { /* the jackknife over probes */
            double s = 0, mean = 0, *r = malloc(sizeof(double) * probes);
            if (!r || probes < 2) {
                *rank_se = NAN;
            } else {
                for (int p = 0; p < probes; p++) {
                    const double k1 = sk - tk[p], l1 = sl - tl[p];
                    r[p] = k1 > 0 ? exp(log(k1 / (probes - 1)) - l1 / k1) : *rank;
                    mean += r[p] / probes;
                }
                for (int p = 0; p < probes; p++) s += (r[p] - mean) * (r[p] - mean);
                *rank_se = sqrt((double)(probes - 1) / probes * s);
            }
            free(r);
        }
    }
done:
    free(Q), free(w), free(z), free(a), free(b), free(Y), free(tk), free(tl);
    return st;
}

/* ---- the eNTK's product ------------------------------------------------------------------------- */

typedef struct {
    sm_model *m;
    const float *x;
    int N;
    const sm_real *u;
    sm_real *g, *g0, *theta; /* (P) J^T v, the backward with d logits = 0, the parameters as given */
    double h_scale;          /* 1e-3 x the parameters' RMS */
} entk_op;

/* f_t = u^T logits(x_t) for t in [t0, t0 + B) at the parameters now in m, into f */
static void scalar_out(entk_op *o, int t0, int B, double *f) {
    const int V = o->m->cfg.n_classes;
    const sm_real *lg = sm_model_forward(o->m, o->x + (size_t)t0 * o->m->cfg.in_dim, B, NULL, 0);
    for (int t = 0; t < B; t++) {
        double s = 0;
        for (int v = 0; v < V; v++) s += (double)o->u[v] * lg[(size_t)t * V + v];
        f[t] = s;
    }
}

static void entk_matvec(const double *v, double *out, void *user) {
    entk_op *o = user;
    sm_model *m = o->m;
    const size_t P = m->params.total;
    const int V = m->cfg.n_classes, Bmax = m->max_T;
    /* g = J^T v: per chunk the backward with d logits = v_t u minus the one with d logits = 0 */
    memset(o->g, 0, sizeof(sm_real) * P);
    for (int t0 = 0; t0 < o->N; t0 += Bmax) {
        const int B = o->N - t0 < Bmax ? o->N - t0 : Bmax;
        sm_model_forward(m, o->x + (size_t)t0 * m->cfg.in_dim, B, NULL, 0);
        for (int pass = 0; pass < 2; pass++) {
            for (int t = 0; t < B; t++)
                for (int c = 0; c < V; c++) m->dlogits[(size_t)t * V + c] = pass ? (sm_real)(v[t0 + t] * o->u[c]) : 0;
            sm_params_zero_grad(&m->params);
            sm_model_backward(m, B);
            if (pass == 0) memcpy(o->g0, m->params.grad, sizeof(sm_real) * P);
        }
        for (size_t j = 0; j < P; j++) o->g[j] += m->params.grad[j] - o->g0[j];
    }
    sm_params_zero_grad(&m->params);
    /* out = J g by central differences along g */
    double gmax = 0;
    for (size_t j = 0; j < P; j++) gmax = fmax(gmax, fabs((double)o->g[j]));
    if (gmax == 0) {
        memset(out, 0, sizeof(double) * o->N);
        return;
    }
    const double h = o->h_scale / gmax;
    double fp[1024], fm[1024];
    for (int t0 = 0; t0 < o->N; t0 += Bmax) {
        const int B = o->N - t0 < Bmax ? o->N - t0 : Bmax;
        for (int t1 = 0; t1 < B; t1 += 1024) { /* fp / fm hold at most 1024 states */
            const int b = B - t1 < 1024 ? B - t1 : 1024;
            for (int s = 0; s < 2; s++) {
                for (size_t j = 0; j < P; j++) m->params.data[j] = (sm_real)(o->theta[j] + (s ? -h : h) * o->g[j]);
                scalar_out(o, t0 + t1, b, s ? fm : fp);
            }
            for (int t = 0; t < b; t++) out[t0 + t1 + t] = (fp[t] - fm[t]) / (2 * h);
        }
    }
    memcpy(m->params.data, o->theta, sizeof(sm_real) * P);
}

sm_status sm_entk_rank_slq(sm_model *m, const float *x, int N, const sm_real *u, int probes, int steps, sm_rng *rng,
                           double *rank, double *rank_se, sm_error *err) {
    if (N < 1) return sm_fail(err, SM_ERR_ARG, "entk slq: need at least one state");
    if (m->max_T > 1024 && m->max_T < N)
        return sm_fail(err, SM_ERR_ARG, "entk slq: batches of at most 1024 states (the model's max_T is %d)", m->max_T);
    const size_t P = m->params.total;
    entk_op o = {m, x, N, u, malloc(sizeof(sm_real) * P), malloc(sizeof(sm_real) * P), malloc(sizeof(sm_real) * P), 0};
    if (!o.g || !o.g0 || !o.theta) {
        free(o.g), free(o.g0), free(o.theta);
        return sm_fail(err, SM_ERR_NOMEM, "entk slq: out of memory for %zu parameters", P);
    }
    memcpy(o.theta, m->params.data, sizeof(sm_real) * P);
    double ss = 0;
    for (size_t j = 0; j < P; j++) ss += (double)o.theta[j] * o.theta[j];
    o.h_scale = 1e-3 * (P ? fmax(sqrt(ss / (double)P), 1e-3) : 1);
    sm_status st = sm_slq_effective_rank(N, entk_matvec, &o, probes, steps, rng, rank, rank_se, err);
    memcpy(m->params.data, o.theta, sizeof(sm_real) * P);
    sm_params_zero_grad(&m->params);
    free(o.g), free(o.g0), free(o.theta);
    return st;
}
