/* SSMoE eigenvector descriptors (see include/specmoe/ssmoe.h). */
#include "specmoe/methods/ssmoe/ssmoe.h"
#include "specmoe/core/ops.h"

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
                st = sm_ev_descriptor(desc, w, H, d, sm_ev_opts(rc)->ev_avg ? NULL : row, sm_ev_opts(rc)->ev_c, err);
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

sm_model *sm_ssmoe_twin(const sm_model *m, double alpha, int c, int avg, sm_error *err) {
    sm_model_config ec = m->cfg;
    if (sm_router_config_set(&ec.moe.router, "ev", err) != SM_OK) return NULL;
    sm_ev_opts(&ec.moe.router)->alpha = alpha;
    sm_ev_opts(&ec.moe.router)->ev_c = c;
    sm_ev_opts(&ec.moe.router)->ev_avg = avg;
    sm_model *ev = sm_model_create(&ec, m->max_T, NULL, err);
    if (!ev) return NULL;
    for (int i = 0; i < m->params.n; i++) {
        int j = sm_params_find(&ev->params, m->params.p[i].name);
        if (j >= 0)
            memcpy(sm_params_data(&ev->params, j), sm_params_data(&m->params, i), sizeof(sm_real) * m->params.p[i].numel);
    }
    if (sm_model_build_ev(ev, err) != SM_OK) {
        sm_model_free(ev);
        return NULL;
    }
    return ev;
}

sm_status sm_expert_scores(sm_model *m, const float *x, int n, sm_expert_rank rank, double alpha, int c, int avg,
                           uint64_t seed, double *score, sm_error *err) {
    const int L = sm_model_n_moe(m), E = m->cfg.moe.router.E;
    if (strcmp(m->cfg.moe.router.name, "topk") != 0)
        return sm_fail(err, SM_ERR_ARG, "expert scores: the model's router is '%s'; ranking needs a topk model",
                       m->cfg.moe.router.name);
    if (n < 1) return sm_fail(err, SM_ERR_ARG, "expert scores: no calibration inputs");
    for (int i = 0; i < L * E; i++) score[i] = 0;
    if (rank == SM_RANK_RANDOM) {
        sm_rng r;
        sm_rng_seed(&r, seed);
        for (int i = 0; i < L * E; i++) score[i] = sm_rng_uniform(&r);
        return SM_OK;
    }
    sm_model *ev = NULL;
    if (rank == SM_RANK_SSMOE && !(ev = sm_ssmoe_twin(m, alpha, c, avg, err))) return SM_ERR_ARG;
    sm_model *use = ev ? ev : m;
    for (int i = 0; i < n; i += use->max_T) {
        int B = n - i < use->max_T ? n - i : use->max_T;
        sm_model_forward(use, x + (size_t)i * use->cfg.in_dim, B, NULL, 0);
        /* route->probs is p_r for topk, and for ev the gate's softmax of log P, i.e. P itself */
        for (int l = 0; l < L; l++) {
            const sm_route *r = &sm_model_moe(use, l)->route;
            for (int t = 0; t < B; t++)
                for (int e = 0; e < E; e++) score[l * E + e] += (double)r->probs[(size_t)t * E + e] / n;
        }
    }
    sm_model_free(ev);
    return SM_OK;
}

sm_model *sm_model_prune_experts(const sm_model *m, const int *keep, int E_keep, sm_error *err) {
    const int E = m->cfg.moe.router.E, L = sm_model_n_moe(m);
    if (E_keep < 1 || E_keep > E) {
        sm_fail(err, SM_ERR_ARG, "prune: kept experts must be in [1, %d] (got %d)", E, E_keep);
        return NULL;
    }
    for (int l = 0; l < L; l++)
        for (int j = 0; j < E_keep; j++)
            if (keep[l * E_keep + j] < 0 || keep[l * E_keep + j] >= E) {
                sm_fail(err, SM_ERR_ARG, "prune: expert index %d out of range", keep[l * E_keep + j]);
                return NULL;
            }
    sm_model_config pc = m->cfg;
    pc.moe.router.E = E_keep;
    if (pc.moe.router.k > E_keep) pc.moe.router.k = E_keep;
    sm_model *p = sm_model_create(&pc, m->max_T, NULL, err);
    if (!p) return NULL;
    /* every tensor by name; tensors with a leading expert dimension keep the chosen slices */
    for (int i = 0; i < p->params.n; i++) {
        const sm_param *q = &p->params.p[i];
        int j = sm_params_find(&m->params, q->name);
        if (j < 0) {
            sm_fail(err, SM_ERR_MISMATCH, "prune: tensor '%s' missing in the source model", q->name);
            sm_model_free(p);
            return NULL;
        }
        const sm_param *src = &m->params.p[j];
        sm_real *dst = sm_params_data(&p->params, i);
        const sm_real *from = sm_params_data(&m->params, j);
        int per_expert = src->shape[0] == E && q->shape[0] == E_keep && E_keep != E &&
                         (strstr(q->name, ".experts.") || strstr(q->name, ".router."));
        if (src->numel == q->numel && !per_expert) {
            memcpy(dst, from, sizeof(sm_real) * q->numel);
            continue;
        }
        /* which MoE layer this tensor belongs to: the MoE module whose parameters it is among */
        int l = -1;
        for (int t = 0, k = 0; t < m->n_layers && l < 0; t++) {
            if (m->layers[t].kind != SM_LAYER_MOE) continue;
            size_t n = strlen(m->layers[t].mod->name);
            if (!strncmp(q->name, m->layers[t].mod->name, n) && q->name[n] == '.') l = k;
            k++;
        }
        size_t slice = src->numel / (size_t)E;
        if (!per_expert || l < 0 || l >= L) {
            sm_fail(err, SM_ERR_MISMATCH, "prune: cannot map tensor '%s'", q->name);
            sm_model_free(p);
            return NULL;
        }
        for (int k = 0; k < E_keep; k++)
            memcpy(dst + (size_t)k * slice, from + (size_t)keep[l * E_keep + k] * slice, sizeof(sm_real) * slice);
    }
    return p;
}

double sm_mean_abs_offdiag_corr(const sm_real *V, int E, int d) {
    if (E < 2 || d < 2) return 0;
    double *z = malloc(sizeof(double) * (size_t)E * d);
    if (!z) return NAN;
    for (int e = 0; e < E; e++) { /* standardise each row */
        double mu = 0, var = 0;
        for (int i = 0; i < d; i++) mu += V[(size_t)e * d + i] / d;
        for (int i = 0; i < d; i++) var += (V[(size_t)e * d + i] - mu) * (V[(size_t)e * d + i] - mu);
        double sd = sqrt(var > 1e-300 ? var : 1e-300);
        for (int i = 0; i < d; i++) z[(size_t)e * d + i] = (V[(size_t)e * d + i] - mu) / sd;
    }
    double acc = 0;
    for (int a = 0; a < E; a++)
        for (int b = a + 1; b < E; b++) {
            double c = 0;
            for (int i = 0; i < d; i++) c += z[(size_t)a * d + i] * z[(size_t)b * d + i];
            acc += fabs(c);
        }
    free(z);
    return acc / (E * (E - 1) / 2.0);
}

sm_status sm_ssmoe_collapse(const sm_model *m, int l, double *router_corr, double *ev_corr, sm_error *err) {
    const sm_moe *moe = sm_model_moe(m, l);
    const sm_module *mod = NULL;
    for (int t = 0, k = 0; t < m->n_layers && !mod; t++)
        if (m->layers[t].kind == SM_LAYER_MOE && k++ == l) mod = m->layers[t].mod;
    if (!moe || !mod) return sm_fail(err, SM_ERR_ARG, "ssmoe collapse: no MoE layer %d", l);
    char name[SM_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s.router.weight", mod->name);
    int iw = sm_params_find(&m->params, name);
    snprintf(name, sizeof name, "%s.router.ev", mod->name);
    int ie = sm_params_find(&m->params, name);
    if (iw < 0 || ie < 0) return sm_fail(err, SM_ERR_ARG, "ssmoe collapse: MoE layer %d has no ev router", l);
    const sm_real *w = sm_params_data(&m->params, iw), *ev = sm_params_data(&m->params, ie);
    sm_real *mean = malloc(sizeof(sm_real) * (size_t)moe->E * moe->d);
    if (!mean) return sm_fail(err, SM_ERR_NOMEM, "ssmoe collapse: out of memory");
    /* the mean of each expert's two descriptors (W1 and W2^T) */
    for (int e = 0; e < moe->E; e++)
        for (int i = 0; i < moe->d; i++)
            mean[(size_t)e * moe->d + i] = (ev[((size_t)e * 2) * moe->d + i] + ev[((size_t)e * 2 + 1) * moe->d + i]) / 2;
    *router_corr = sm_mean_abs_offdiag_corr(w, moe->E, moe->d);
    *ev_corr = sm_mean_abs_offdiag_corr(mean, moe->E, moe->d);
    free(mean);
    return SM_OK;
}

/* ---- collapsed-router benchmark helpers (issue 16) ------------------------------------------- */

/* The input (T, d) of MoE layer l in the last forward of m: the output of the layer before it. */
static const sm_real *moe_input(const sm_model *m, int l) {
    for (int t = 0, k = 0; t < m->n_layers; t++)
        if (m->layers[t].kind == SM_LAYER_MOE && k++ == l) return t == 0 ? m->input : sm_seq_output(m->body, t - 1);
    return NULL;
}

/* Forwards x (n, in_dim) through m in batches of max_T; after each batch calls fn(user, m, first row, rows). */
static sm_status forward_batches(sm_model *m, const float *x, int n, sm_status (*fn)(void *, sm_model *, int, int, sm_error *),
                                 void *user, sm_error *err) {
    if (n < 1) return sm_fail(err, SM_ERR_ARG, "ssmoe: no inputs");
    for (int i = 0; i < n; i += m->max_T) {
        int B = n - i < m->max_T ? n - i : m->max_T;
        sm_model_forward(m, x + (size_t)i * m->cfg.in_dim, B, NULL, 0);
        sm_status st = fn(user, m, i, B, err);
        if (st != SM_OK) return st;
    }
    return SM_OK;
}

typedef struct {
    double *sim;     /* (n_moe) running sums of the mean pairwise cosine per token */
    sm_real *buf;    /* (E, max_T, d) every expert's output, then pre / hid scratch */
    sm_real *pre, *hid; /* (max_T, H) */
    long tokens;
} sim_acc;

static sm_status sim_batch(void *user, sm_model *m, int first, int B, sm_error *err) {
    (void)first, (void)err;
    sim_acc *a = user;
    for (int l = 0; l < sm_model_n_moe(m); l++) {
        const sm_moe *moe = sm_model_moe(m, l);
        const int E = moe->E, d = moe->d, H = moe->H;
        const sm_real *x = moe_input(m, l);
        for (int e = 0; e < E; e++) {
            sm_mlp_weights w = {moe->w1 + (size_t)e * H * d, moe->b1 ? moe->b1 + (size_t)e * H : NULL,
                                moe->w2 + (size_t)e * d * H, moe->b2 ? moe->b2 + (size_t)e * d : NULL};
            sm_mlp_forward(a->buf + (size_t)e * m->max_T * d, a->pre, a->hid, x, w, moe->cfg.act, B, d, H, d);
        }
        for (int t = 0; t < B; t++) {
            double acc = 0;
            for (int e = 0; e < E; e++)
                for (int f = e + 1; f < E; f++) {
                    const sm_real *u = a->buf + ((size_t)e * m->max_T + t) * d, *v = a->buf + ((size_t)f * m->max_T + t) * d;
                    double uv = 0, uu = 0, vv = 0;
                    for (int i = 0; i < d; i++) uv += (double)u[i] * v[i], uu += (double)u[i] * u[i], vv += (double)v[i] * v[i];
                    acc += uu > 0 && vv > 0 ? uv / sqrt(uu * vv) : (uu == vv ? 1 : 0);
                }
            a->sim[l] += acc / (E * (E - 1) / 2.0);
        }
    }
    a->tokens += B;
    return SM_OK;
}

sm_status sm_ssmoe_expert_similarity(sm_model *m, const float *x, int n, double *sim, sm_error *err) {
    const int L = sm_model_n_moe(m);
    int E = 0, d = 0, H = 0;
    for (int l = 0; l < L; l++) {
        const sm_moe *moe = sm_model_moe(m, l);
        if (moe->experts || moe->L > 1 || moe->O != moe->d || moe->E < 2)
            return sm_fail(err, SM_ERR_ARG, "expert similarity: MoE layer %d needs >= 2 built-in two-layer experts d -> H -> d", l);
        E = moe->E > E ? moe->E : E, d = moe->d > d ? moe->d : d, H = moe->H > H ? moe->H : H;
        sim[l] = 0;
    }
    sim_acc a = {sim, malloc(sizeof(sm_real) * (size_t)E * m->max_T * d), malloc(sizeof(sm_real) * (size_t)m->max_T * H),
                 malloc(sizeof(sm_real) * (size_t)m->max_T * H), 0};
    sm_status st = a.buf && a.pre && a.hid ? forward_batches(m, x, n, sim_batch, &a, err)
                                           : sm_fail(err, SM_ERR_NOMEM, "expert similarity: out of memory");
    for (int l = 0; l < L && st == SM_OK; l++) sim[l] /= (double)a.tokens;
    free(a.buf), free(a.pre), free(a.hid);
    return st;
}

/* ---- SSMoE Lemma 3.1: pairwise logit correlation ------------------------------------------------ */

typedef struct {
    int L, E3max;
    double **M;     /* per layer (3E, 3E): sum over tokens of z z^T, z = [s; f; r] */
    double **mu;    /* per layer (3E): sum over tokens of z */
    sm_real **W;    /* per layer (3E, d): [W_r; Dbar; R] stacked, so z = h W^T */
    sm_real *z;     /* (max_T, 3E) */
    long tokens;
} logit_acc;

static sm_status logit_batch(void *user, sm_model *m, int first, int B, sm_error *err) {
    (void)first, (void)err;
    logit_acc *a = user;
    for (int l = 0; l < a->L; l++) {
        const sm_moe *moe = sm_model_moe(m, l);
        const int E3 = 3 * moe->E;
        sm_linear_forward(a->z, moe_input(m, l), a->W[l], NULL, B, moe->d, E3);
        for (int t = 0; t < B; t++) {
            const sm_real *z = a->z + (size_t)t * E3;
            for (int i = 0; i < E3; i++) {
                a->mu[l][i] += z[i];
                for (int j = 0; j < E3; j++) a->M[l][(size_t)i * E3 + j] += (double)z[i] * z[j];
            }
        }
    }
    a->tokens += B;
    return SM_OK;
}

/* The accumulated moments of one layer: the logit vectors u, v below are mixes of two of the three
 * blocks of z, u_i = wu[0] z[ou[0] + i] + wu[1] z[ou[1] + i]. */
typedef struct {
    const double *M, *mu;
    int E3, E;
    double n;
} mom;
/* E[u_i v_j] (centred: minus the product of means) for u = wu[0] z[ou[0] + i] + wu[1] z[ou[1] + i], v alike */
static double mix_moment(const mom *q, const double *wu, const int *ou, int i, const double *wv, const int *ov, int j, int centred) {
    double m2 = 0, mu = 0, mv = 0;
    for (int a = 0; a < 2; a++) {
        mu += wu[a] * q->mu[ou[a] + i] / q->n;
        mv += wv[a] * q->mu[ov[a] + j] / q->n;
        for (int b = 0; b < 2; b++) m2 += wu[a] * wv[b] * q->M[(size_t)(ou[a] + i) * q->E3 + ov[b] + j] / q->n;
    }
    return centred ? m2 - mu * mv : m2;
}
/* mean over pairs i != j (all i, j when cross) of |C_ij| / sqrt(C_ii C_jj), C_ij = E[u_i v_j] */
static double mix_corr(const mom *q, const double *wu, const int *ou, const double *wv, const int *ov, int cross, int centred) {
    double acc = 0;
    long cnt = 0;
    for (int i = 0; i < q->E; i++)
        for (int j = 0; j < q->E; j++) {
            if (!cross && i == j) continue;
            double cij = mix_moment(q, wu, ou, i, wv, ov, j, centred), cii = mix_moment(q, wu, ou, i, wu, ou, i, centred),
                   cjj = mix_moment(q, wv, ov, j, wv, ov, j, centred);
            if (cii > 0 && cjj > 0) acc += fabs(cij) / sqrt(cii * cjj), cnt++;
        }
    return cnt ? acc / (double)cnt : NAN;
}

sm_status sm_ssmoe_logit_collapse(sm_model *m, const float *x, int n, double alpha, uint64_t seed, sm_logit_collapse *out,
                                  sm_error *err) {
    const int L = sm_model_n_moe(m);
    if (L < 1) return sm_fail(err, SM_ERR_ARG, "logit collapse: the model has no MoE layer");
    if (!(alpha >= 0 && alpha <= 1)) return sm_fail(err, SM_ERR_ARG, "logit collapse: alpha %g outside [0, 1]", alpha);
    logit_acc a = {L, 0, calloc((size_t)L, sizeof(double *)), calloc((size_t)L, sizeof(double *)),
                   calloc((size_t)L, sizeof(sm_real *)), NULL, 0};
    sm_status st = a.M && a.mu && a.W ? SM_OK : sm_fail(err, SM_ERR_NOMEM, "logit collapse: out of memory");
    sm_rng rng;
    sm_rng_seed(&rng, seed);
    for (int l = 0; l < L && st == SM_OK; l++) {
        const sm_moe *moe = sm_model_moe(m, l);
        const int E = moe->E, d = moe->d, E3 = 3 * E;
        const sm_module *mod = NULL;
        for (int t = 0, k = 0; t < m->n_layers && !mod; t++)
            if (m->layers[t].kind == SM_LAYER_MOE && k++ == l) mod = m->layers[t].mod;
        char name[SM_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s.router.weight", mod->name);
        int iw = sm_params_find(&m->params, name);
        snprintf(name, sizeof name, "%s.router.ev", mod->name);
        int ie = sm_params_find(&m->params, name);
        if (iw < 0 || ie < 0) { st = sm_fail(err, SM_ERR_ARG, "logit collapse: MoE layer %d has no ev router", l); break; }
        if (E3 > a.E3max) a.E3max = E3;
        a.M[l] = calloc((size_t)E3 * E3, sizeof(double));
        a.mu[l] = calloc((size_t)E3, sizeof(double));
        a.W[l] = malloc(sizeof(sm_real) * (size_t)E3 * d);
        if (!a.M[l] || !a.mu[l] || !a.W[l]) { st = sm_fail(err, SM_ERR_NOMEM, "logit collapse: out of memory"); break; }
        const sm_real *w = sm_params_data(&m->params, iw), *ev = sm_params_data(&m->params, ie);
        memcpy(a.W[l], w, sizeof(sm_real) * (size_t)E * d);
        for (int e = 0; e < E; e++) /* Dbar: the mean of each expert's two descriptors, as the router */
            for (int i = 0; i < d; i++)
                a.W[l][(size_t)(E + e) * d + i] = (ev[((size_t)e * 2) * d + i] + ev[((size_t)e * 2 + 1) * d + i]) / 2;
        for (size_t i = 0; i < (size_t)E * d; i++) a.W[l][(size_t)2 * E * d + i] = (sm_real)sm_rng_normal(&rng);
    }
    if (st == SM_OK) {
        a.z = malloc(sizeof(sm_real) * (size_t)m->max_T * a.E3max);
        st = a.z ? forward_batches(m, x, n, logit_batch, &a, err) : sm_fail(err, SM_ERR_NOMEM, "logit collapse: out of memory");
    }
    for (int l = 0; l < L && st == SM_OK; l++) {
        const int E = sm_model_moe(m, l)->E;
        const mom q = {a.M[l], a.mu[l], 3 * E, E, (double)a.tokens};
        const double one[2] = {1, 0}, mix[2] = {1 - alpha, alpha};
        const int os[2] = {0, 0}, of[2] = {E, E}, orr[2] = {2 * E, 2 * E}, osf[2] = {0, E};
        sm_logit_collapse *o = &out[l];
        o->learned = mix_corr(&q, one, os, one, os, 0, 0), o->learned_c = mix_corr(&q, one, os, one, os, 0, 1);
        o->ev = mix_corr(&q, one, of, one, of, 0, 0), o->ev_c = mix_corr(&q, one, of, one, of, 0, 1);
        o->mixed = mix_corr(&q, mix, osf, mix, osf, 0, 0), o->mixed_c = mix_corr(&q, mix, osf, mix, osf, 0, 1);
        o->random = mix_corr(&q, one, orr, one, orr, 0, 0), o->random_c = mix_corr(&q, one, orr, one, orr, 0, 1);
        out[l].ev_learned = mix_corr(&q, one, of, one, os, 1, 0);
    }
    for (int l = 0; l < L; l++) {
        if (a.M) free(a.M[l]);
        if (a.mu) free(a.mu[l]);
        if (a.W) free(a.W[l]);
    }
    free(a.M), free(a.mu), free(a.W), free(a.z);
    return st;
}

typedef struct {
    float *emb; /* (n, n_moe * E) */
    int width;
} embed_acc;

static sm_status embed_batch(void *user, sm_model *m, int first, int B, sm_error *err) {
    (void)err;
    embed_acc *a = user;
    for (int l = 0, off = 0; l < sm_model_n_moe(m); l++) {
        const sm_moe *moe = sm_model_moe(m, l);
        for (int t = 0; t < B; t++)
            for (int e = 0; e < moe->E; e++)
                a->emb[(size_t)(first + t) * a->width + off + e] = (float)moe->route.probs[(size_t)t * moe->E + e];
        off += moe->E;
    }
    return SM_OK;
}

sm_status sm_ssmoe_routing_embed(sm_model *m, const float *x, int n, float *emb, double *overlap, sm_error *err) {
    const int L = sm_model_n_moe(m);
    int width = 0;
    for (int l = 0; l < L; l++) {
        width += sm_model_moe(m, l)->E;
        (void)sm_ev_router_take_overlap(sm_model_moe(m, l)->router); /* reset the D.6 counts */
    }
    embed_acc a = {emb, width};
    sm_status st = forward_batches(m, x, n, embed_batch, &a, err);
    if (overlap) {
        double acc = 0;
        for (int l = 0; l < L; l++) acc += sm_ev_router_take_overlap(sm_model_moe(m, l)->router) / L;
        *overlap = acc; /* NaN for the learned router: no mixture to compare */
    }
    return st;
}

int sm_ssmoe_embed_width(const sm_model *m) {
    int width = 0;
    for (int l = 0; l < sm_model_n_moe(m); l++) width += sm_model_moe(m, l)->E;
    return width;
}

/* ---- ridge linear probe ------------------------------------------------------------------------ */

sm_status sm_ridge_probe_fit(sm_ridge_probe *p, const float *X, const int *y, int n, int D, int C, double lambda,
                             sm_error *err) {
    memset(p, 0, sizeof *p);
    if (n < 2 || D < 1 || C < 2 || !(lambda >= 0))
        return sm_fail(err, SM_ERR_ARG, "ridge probe: need n >= 2, D >= 1, C >= 2, lambda >= 0 (got %d, %d, %d, %g)", n, D, C, lambda);
    for (int i = 0; i < n; i++)
        if (y[i] < 0 || y[i] >= C) return sm_fail(err, SM_ERR_ARG, "ridge probe: label %d of example %d not in [0, %d)", y[i], i, C);
    const int Z = D + 1; /* standardised features and a constant 1 */
    p->D = D, p->C = C;
    p->mu = calloc((size_t)D, sizeof(double));
    p->sd = calloc((size_t)D, sizeof(double));
    p->W = calloc((size_t)Z * C, sizeof(double));
    double *A = calloc((size_t)Z * Z, sizeof(double)), *z = malloc(sizeof(double) * (size_t)Z);
    if (!p->mu || !p->sd || !p->W || !A || !z) {
        free(A), free(z), sm_ridge_probe_free(p);
        return sm_fail(err, SM_ERR_NOMEM, "ridge probe: out of memory (%d features)", D);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++) p->mu[j] += (double)X[(size_t)i * D + j] / n;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++) p->sd[j] += ((double)X[(size_t)i * D + j] - p->mu[j]) * ((double)X[(size_t)i * D + j] - p->mu[j]) / n;
    for (int j = 0; j < D; j++) p->sd[j] = p->sd[j] > 1e-24 ? sqrt(p->sd[j]) : 1; /* constant features stay 0 */
    /* normal equations (Z^T Z + lambda n I') W = Z^T Y, Y one-hot, I' without the bias entry */
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < D; j++) z[j] = ((double)X[(size_t)i * D + j] - p->mu[j]) / p->sd[j];
        z[D] = 1;
        for (int a = 0; a < Z; a++) {
            for (int b = a; b < Z; b++) A[(size_t)a * Z + b] += z[a] * z[b];
            p->W[(size_t)a * C + y[i]] += z[a];
        }
    }
    for (int a = 0; a < Z; a++)
        for (int b = 0; b < a; b++) A[(size_t)a * Z + b] = A[(size_t)b * Z + a];
    for (int a = 0; a < D; a++) A[(size_t)a * Z + a] += lambda * n;
    /* a tiny jitter keeps the system positive definite when features are collinear and lambda is 0 */
    for (int a = 0; a < Z; a++) A[(size_t)a * Z + a] += 1e-10 * n;
    lapack_int info = LAPACKE_dposv(LAPACK_ROW_MAJOR, 'U', Z, C, A, Z, p->W, C);
    free(A), free(z);
    if (info != 0) {
        sm_ridge_probe_free(p);
        return sm_fail(err, SM_ERR_NUMERIC, "ridge probe: LAPACKE_dposv failed (info %d)", (int)info);
    }
    return SM_OK;
}

int sm_ridge_probe_predict(const sm_ridge_probe *p, const float *x) {
    int best = 0;
    double bs = -INFINITY;
    for (int c = 0; c < p->C; c++) {
        double s = p->W[(size_t)p->D * p->C + c];
        for (int j = 0; j < p->D; j++) s += ((double)x[j] - p->mu[j]) / p->sd[j] * p->W[(size_t)j * p->C + c];
        if (s > bs) bs = s, best = c;
    }
    return best;
}

double sm_ridge_probe_accuracy(const sm_ridge_probe *p, const float *X, const int *y, int n) {
    long ok = 0;
    for (int i = 0; i < n; i++) ok += sm_ridge_probe_predict(p, X + (size_t)i * p->D) == y[i];
    return n > 0 ? (double)ok / n : NAN;
}

void sm_ridge_probe_free(sm_ridge_probe *p) {
    free(p->mu), free(p->sd), free(p->W);
    memset(p, 0, sizeof *p);
}
