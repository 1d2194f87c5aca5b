/* GrMoE's synthetic routing task, its Bayes rule and supervised probes
 * (see include/specmoe/methods/grmoe/synth.h). */
#include "specmoe/methods/grmoe/synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/ops.h"
#include "specmoe/core/optim.h"
#include "specmoe/core/stiefel.h"
#include "specmoe/nn/loss.h"

sm_status sm_synth_setting(sm_synth_config *c, const char *name, sm_error *err) {
    memset(c, 0, sizeof *c);
    c->N = 8;
    c->d = 128;
    c->kr = 16;
    c->out = 16;
    c->overlap = SM_SYNTH_OVERLAP_TILT;
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

sm_status sm_synth_overlap_parse(const char *name, int *overlap, sm_error *err) {
    if (!strcmp(name, "tilt")) *overlap = SM_SYNTH_OVERLAP_TILT;
    else if (!strcmp(name, "shared")) *overlap = SM_SYNTH_OVERLAP_SHARED;
    else return sm_fail(err, SM_ERR_ARG, "synthetic task: unknown overlap construction '%s' (tilt|shared)", name);
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

/* SM_SYNTH_OVERLAP_TILT: private frames tilted toward a shared frame, theta bisected for rho* */
static sm_status build_tilted(sm_real *U, const sm_synth_config *c, sm_rng *rng, sm_error *err) {
    const int N = c->N, d = c->d, R = c->kr;
    size_t fr = (size_t)R * d;
    sm_real *Q = malloc(sizeof(sm_real) * N * fr), *S = malloc(sizeof(sm_real) * fr);
    sm_status st = (Q && S) ? SM_OK : sm_fail(err, SM_ERR_NOMEM, "synthetic task: out of memory");
    if (st == SM_OK && (size_t)N * R <= (size_t)d) { /* mutually orthogonal private frames: rows of one Haar frame */
        st = sm_stiefel_haar(Q, N * R, d, rng, err);
    } else {
        for (int e = 0; e < N && st == SM_OK; e++) st = sm_stiefel_haar(Q + e * fr, R, d, rng, err);
    }
    if (st == SM_OK) st = sm_stiefel_haar(S, R, d, rng, err);
    if (st == SM_OK) {
        /* overlap(theta) rises from overlap(Q) to 1: bisect for rho* */
        double lo = 0, hi = 1.5707963267948966;
        tilt(U, Q, S, N, R, d, lo);
        if (sm_mean_overlap(U, N, R, d) > c->rho) hi = lo;
        for (int it = 0; it < 60 && hi > lo; it++) {
            double mid = 0.5 * (lo + hi);
            tilt(U, Q, S, N, R, d, mid);
            if (sm_mean_overlap(U, N, R, d) < c->rho) lo = mid;
            else hi = mid;
        }
        tilt(U, Q, S, N, R, d, 0.5 * (lo + hi));
    }
    free(Q);
    free(S);
    return st;
}

/* SM_SYNTH_OVERLAP_SHARED: a common core of m = round(rho* k_r) rows in every frame, the rest
 * private and orthogonal to the core (mutually orthogonal too when m + N (k_r - m) <= d) */
static sm_status build_shared(sm_real *U, const sm_synth_config *c, sm_rng *rng, sm_error *err) {
    const int N = c->N, d = c->d, R = c->kr, m = (int)lround(c->rho * R), p = R - m;
    const int all = m + N * p;
    sm_status st = SM_OK;
    if (all <= d) { /* core and private rows: one Haar frame */
        sm_real *F = malloc(sizeof(sm_real) * (size_t)all * d);
        if (!F) return sm_fail(err, SM_ERR_NOMEM, "synthetic task: out of memory");
        st = sm_stiefel_haar(F, all, d, rng, err);
        for (int e = 0; e < N && st == SM_OK; e++) {
            memcpy(U + (size_t)e * R * d, F, sizeof(sm_real) * (size_t)m * d);
            memcpy(U + ((size_t)e * R + m) * d, F + ((size_t)m + (size_t)e * p) * d, sizeof(sm_real) * (size_t)p * d);
        }
        free(F);
        return st;
    }
    /* the core, then per frame independent private rows orthonormalised against it (Gram-Schmidt
     * keeps the first m rows, already orthonormal) */
    sm_real *core = m ? malloc(sizeof(sm_real) * (size_t)m * d) : NULL;
    if (m && !core) return sm_fail(err, SM_ERR_NOMEM, "synthetic task: out of memory");
    if (m) st = sm_stiefel_haar(core, m, d, rng, err);
    for (int e = 0; e < N && st == SM_OK; e++) {
        sm_real *u = U + (size_t)e * R * d;
        if (m) memcpy(u, core, sizeof(sm_real) * (size_t)m * d);
        if (p) st = sm_stiefel_haar(u + (size_t)m * d, p, d, rng, err);
        if (st == SM_OK) sm_stiefel_orthonormalize_gs(u, R, d);
    }
    free(core);
    return st;
}

/* One token of component e into xv (d): mu_e + U_e^T g + sigma (I - P_e) z, g ~ N(0, I_R), z ~ N(0, I_d);
 * z (max(d,R)) and coef (R) are scratch. The draws are made in this order (z, then g) in every
 * variant, so the zero-mean continuous task stays the stream it always was. */
static void draw_token(const sm_synth *s, int e, double *xv, double *z, double *coef, sm_rng *rng) {
    const int d = s->cfg.d, R = s->cfg.kr;
    const double sigma = sqrt(s->cfg.sigma2);
    const sm_real *U = s->U + (size_t)e * R * d;
    for (int i = 0; i < d; i++) z[i] = sm_rng_normal(rng);
    for (int j = 0; j < R; j++) { /* coefficients of z in the subspace, to remove them */
        double c = 0;
        for (int i = 0; i < d; i++) c += U[(size_t)j * d + i] * z[i];
        coef[j] = c;
    }
    for (int i = 0; i < d; i++) {
        double v = z[i];
        for (int j = 0; j < R; j++) v -= coef[j] * U[(size_t)j * d + i];
        xv[i] = sigma * v + s->mu[(size_t)e * d + i];
    }
    for (int j = 0; j < R; j++) {
        double g = sm_rng_normal(rng);
        for (int i = 0; i < d; i++) xv[i] += g * U[(size_t)j * d + i];
    }
}

sm_status sm_synth_create(sm_synth *s, const sm_synth_config *c, sm_rng *rng, sm_error *err) {
    memset(s, 0, sizeof *s);
    if (c->N < 1 || c->d < 1 || c->kr < 1 || c->kr > c->d || c->out < 1 || !(c->rho >= 0 && c->rho < 1) ||
        !(c->sigma2 >= 0) || !(c->mean >= 0) || c->vocab < 0 || (c->vocab > 0 && c->vocab < c->N) ||
        (c->overlap != SM_SYNTH_OVERLAP_TILT && c->overlap != SM_SYNTH_OVERLAP_SHARED))
        return sm_fail(err, SM_ERR_ARG, "synthetic task: need N, d, out >= 1, 1 <= k_r <= d, 0 <= rho < 1, sigma^2 >= 0, "
                                        "mean >= 0, vocabulary 0 or >= N, overlap tilt or shared");
    s->cfg = *c;
    const int N = c->N, d = c->d, R = c->kr;
    s->U = malloc(sizeof(sm_real) * (size_t)N * R * d);
    s->W = malloc(sizeof(sm_real) * (size_t)N * c->out * d);
    s->mu = calloc((size_t)N * d, sizeof(sm_real));
    s->emb = c->vocab ? malloc(sizeof(sm_real) * (size_t)c->vocab * d) : NULL;
    double *z = malloc(sizeof(double) * (size_t)(d > R ? d : R)), *coef = malloc(sizeof(double) * (size_t)R);
    double *xv = malloc(sizeof(double) * (size_t)d);
    sm_status st = SM_OK;
    if (!s->U || !s->W || !s->mu || (c->vocab && !s->emb) || !z || !coef || !xv)
        st = sm_fail(err, SM_ERR_NOMEM, "synthetic task: out of memory");
    if (st == SM_OK)
        st = c->overlap == SM_SYNTH_OVERLAP_SHARED ? build_shared(s->U, c, rng, err) : build_tilted(s->U, c, rng, err);
    if (st == SM_OK) {
        s->overlap = sm_mean_overlap(s->U, N, R, d);
        for (size_t i = 0; i < (size_t)N * c->out * d; i++) s->W[i] = (sm_real)(sm_rng_normal(rng) / sqrt((double)d));
        /* means and embeddings are drawn after the teachers, so the default task is unchanged */
        for (int e = 0; e < N && c->mean > 0; e++) { /* mu_e = mean * U_e^T g / ||g|| */
            double nrm = 0;
            for (int j = 0; j < R; j++) {
                coef[j] = sm_rng_normal(rng);
                nrm += coef[j] * coef[j];
            }
            nrm = sqrt(nrm);
            for (int j = 0; j < R; j++)
                for (int i = 0; i < d; i++)
                    s->mu[(size_t)e * d + i] += (sm_real)(c->mean * coef[j] / nrm * s->U[((size_t)e * R + j) * d + i]);
        }
        for (int v = 0; v < c->vocab; v++) { /* id v belongs to component v mod N */
            draw_token(s, v % N, xv, z, coef, rng);
            for (int i = 0; i < d; i++) s->emb[(size_t)v * d + i] = (sm_real)xv[i];
        }
    }
    free(z);
    free(coef);
    free(xv);
    if (st != SM_OK) sm_synth_free(s);
    return st;
}

void sm_synth_free(sm_synth *s) {
    free(s->U);
    free(s->W);
    free(s->mu);
    free(s->emb);
    s->U = s->W = s->mu = s->emb = NULL;
}

void sm_synth_sample(const sm_synth *s, float *x, float *y, int *comp, int T, sm_rng *rng) {
    const int N = s->cfg.N, d = s->cfg.d, R = s->cfg.kr, O = s->cfg.out, V = s->cfg.vocab;
    double *z = malloc(sizeof(double) * (size_t)(d > R ? d : R)), *coef = malloc(sizeof(double) * (size_t)R);
    double *xv = malloc(sizeof(double) * (size_t)d);
    for (int t = 0; t < T; t++) {
        int e = (int)sm_rng_below(rng, (uint32_t)N);
        comp[t] = e;
        if (V) { /* a uniform id among the component's ids e, e + N, e + 2N, ... < V */
            int v = e + N * (int)sm_rng_below(rng, (uint32_t)((V - e + N - 1) / N));
            for (int i = 0; i < d; i++) xv[i] = s->emb[(size_t)v * d + i];
        } else {
            draw_token(s, e, xv, z, coef, rng);
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

/* The log-likelihood of component e up to a constant shared by all e (equal priors; every
 * covariance P_e + sigma^2 (I - P_e) has the determinant sigma^(2(d - R))), times 2:
 *   -(x - mu_e)^T S_e^-1 (x - mu_e) = (1/sigma^2 - 1) ||P_e x||^2 + 2 mu_e^T x - ||mu_e||^2 - ||x||^2/sigma^2
 * using S_e^-1 = P_e + (I - P_e)/sigma^2 and P_e mu_e = mu_e. With sigma^2 = 0 the tokens lie in
 * their subspace and the out-of-subspace term decides alone: argmax ||P_e x||^2. */
void sm_synth_bayes(const sm_synth *s, const float *x, int T, int *pred) {
    const int N = s->cfg.N, d = s->cfg.d, R = s->cfg.kr;
    const double w = s->cfg.sigma2 > 0 ? 1 / s->cfg.sigma2 - 1 : 1;
    const int use_mean = s->cfg.sigma2 > 0 && s->cfg.mean > 0;
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * d;
        double best = -INFINITY;
        pred[t] = 0;
        for (int e = 0; e < N; e++) {
            double a = 0, lin = 0, mm = 0;
            for (int j = 0; j < R; j++) {
                const sm_real *u = s->U + ((size_t)e * R + j) * d;
                double p = 0;
                for (int i = 0; i < d; i++) p += (double)u[i] * xt[i];
                a += p * p;
            }
            for (int i = 0; use_mean && i < d; i++) {
                double m = s->mu[(size_t)e * d + i];
                lin += m * xt[i];
                mm += m * m;
            }
            double score = w * a + 2 * lin - mm;
            if (score > best) {
                best = score;
                pred[t] = e;
            }
        }
    }
}

int sm_synth_merged(const int *pred, const int *comp, int n, int N, int E) {
    int *cnt = calloc((size_t)N * E, sizeof(int)), merged = 0;
    int *top = malloc(sizeof(int) * (size_t)N); /* (N) each component's plurality expert, -1 if it has no token */
    if (!cnt || !top) {
        free(cnt);
        free(top);
        return 0;
    }
    for (int t = 0; t < n; t++) cnt[(size_t)comp[t] * E + pred[t]]++;
    for (int c = 0; c < N; c++) {
        int b = 0;
        for (int e = 1; e < E; e++)
            if (cnt[(size_t)c * E + e] > cnt[(size_t)c * E + b]) b = e;
        top[c] = cnt[(size_t)c * E + b] > 0 ? b : -1;
        for (int a = 0; a < c && top[c] >= 0; a++) merged |= top[a] == top[c];
    }
    free(cnt);
    free(top);
    return merged;
}

/* ---------------------------------------------------------------------------------------------- */
/* supervised probes */

sm_status sm_synth_probe_create(sm_synth_probe *p, int d, int N, int hidden, int max_T, sm_rng *init, sm_error *err) {
    memset(p, 0, sizeof *p);
    if (d < 1 || N < 2 || hidden < 0 || max_T < 1)
        return sm_fail(err, SM_ERR_ARG, "synthetic probe: need d >= 1, N >= 2, hidden >= 0, max_T >= 1");
    p->N = N;
    p->d = d;
    p->max_T = max_T;
    sm_params_init_table(&p->ps);
    p->net = sm_mlp_module("probe", &hidden, hidden > 0 ? 1 : 0, N, SM_ACT_RELU, err);
    sm_status st = p->net ? SM_OK : SM_ERR_ARG;
    if (st == SM_OK) st = sm_module_declare(p->net, &p->ps, sm_shape_vec(d), err);
    if (st == SM_OK) st = sm_params_alloc(&p->ps, err);
    if (st == SM_OK) {
        sm_params_initialize(&p->ps, init);
        st = sm_module_reserve(p->net, max_T, err);
    }
    if (st == SM_OK) {
        size_t TN = (size_t)max_T * N, sizes[] = {TN, TN, TN, (size_t)max_T};
        sm_real **ptrs[] = {&p->logits, &p->dlogits, &p->probs, &p->losses};
        p->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "synthetic probe (%d tokens)", max_T);
        if (!p->block) st = SM_ERR_NOMEM;
    }
    if (st != SM_OK) sm_synth_probe_free(p);
    return st;
}

void sm_synth_probe_free(sm_synth_probe *p) {
    if (p->net) sm_module_free(p->net);
    sm_params_free(&p->ps);
    free(p->block);
    memset(p, 0, sizeof *p);
}

double sm_synth_probe_loss(sm_synth_probe *p, const sm_real *x, const int *labels, int T, int grad) {
    sm_ctx ctx = sm_ctx_make(&p->ps, NULL, 1);
    sm_module_forward(p->net, p->logits, x, T, &ctx);
    double L = sm_loss_crossentropy(p->dlogits, p->probs, p->losses, p->logits, labels, NULL, T, p->N, 1);
    if (grad) sm_module_backward(p->net, NULL, p->dlogits, x, T, &ctx);
    return L;
}

void sm_synth_probe_predict(sm_synth_probe *p, const sm_real *x, int T, int *pred) {
    sm_ctx ctx = sm_ctx_make(&p->ps, NULL, 0);
    sm_module_forward(p->net, p->logits, x, T, &ctx);
    for (int t = 0; t < T; t++) {
        const sm_real *l = p->logits + (size_t)t * p->N;
        int b = 0;
        for (int e = 1; e < p->N; e++)
            if (l[e] > l[b]) b = e;
        pred[t] = b;
    }
}

sm_status sm_synth_probe_fit(const sm_synth *s, const sm_synth_probe_opts *o, uint64_t init_seed, uint64_t train_seed,
                             uint64_t test_seed, double *test_acc, sm_error *err) {
    *test_acc = 0;
    if (!s || o->steps < 1 || o->batch < 1 || o->test_tokens < 1 || !(o->lr > 0))
        return sm_fail(err, SM_ERR_ARG, "synthetic probe: need a task, steps, batch, test tokens >= 1 and lr > 0");
    const int d = s->cfg.d, O = s->cfg.out, B = o->batch;
    sm_rng init, data;
    sm_rng_seed(&init, init_seed);
    sm_synth_probe p;
    sm_status st = sm_synth_probe_create(&p, d, s->cfg.N, o->hidden, B, &init, err);
    if (st != SM_OK) return st;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = SM_OPT_ADAM;
    oc.lr = o->lr;
    sm_optim opt;
    st = sm_optim_init(&opt, &oc, &p.ps, err);
    if (st != SM_OK) {
        sm_synth_probe_free(&p);
        return st;
    }
    float *x = malloc(sizeof(float) * B * d), *y = malloc(sizeof(float) * B * O);
    int *comp = malloc(sizeof(int) * B), *pred = malloc(sizeof(int) * B);
    sm_real *xr = malloc(sizeof(sm_real) * B * d);
    sm_rng_seed(&data, train_seed);
    for (int step = 0; step < o->steps && st == SM_OK; step++) { /* the training split: a fresh stream */
        sm_synth_sample(s, x, y, comp, B, &data);
        for (int i = 0; i < B * d; i++) xr[i] = x[i];
        sm_params_zero_grad(&p.ps);
        sm_synth_probe_loss(&p, xr, comp, B, 1);
        if (!sm_all_finite(p.ps.grad, p.ps.total))
            st = sm_fail(err, SM_ERR_NUMERIC, "synthetic probe: non-finite gradient at step %d", step);
        sm_optim_step(&opt, &p.ps, 0.5 * o->lr * (1 + cos(3.141592653589793 * step / o->steps)));
    }
    sm_rng_seed(&data, test_seed); /* the test split: the held-out tokens the routers are scored on */
    long right = 0;
    for (int done = 0; done < o->test_tokens && st == SM_OK;) {
        int b = o->test_tokens - done < B ? o->test_tokens - done : B;
        sm_synth_sample(s, x, y, comp, b, &data);
        for (int i = 0; i < b * d; i++) xr[i] = x[i];
        sm_synth_probe_predict(&p, xr, b, pred);
        for (int t = 0; t < b; t++) right += pred[t] == comp[t];
        done += b;
    }
    if (st == SM_OK) *test_acc = (double)right / o->test_tokens;
    free(x); free(y); free(comp); free(pred); free(xr);
    sm_optim_free(&opt);
    sm_synth_probe_free(&p);
    return st;
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
