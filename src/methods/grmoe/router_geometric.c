/* Geometric routers: "vmf" (rank-1 hyperspherical gating, GrMoE's vMF-Gate ablation) and
 * "grassmann" (GrMoE, Grassmannian routing with Bingham concentration gating).
 *
 * vmf:        logit_te = kappa_e * cos(x_t, u_e)                         (u_e learned, normalised)
 * grassmann:  logit_te = alpha * h_e(x_t) * kappa_e * ||U_e^T x_t||^2       (GrMoE Eq. 5, Eq. 10)
 *             U_e in St(k_r, d) stored as the rows of a (k_r, d) block, Haar-initialised, kept
 *             orthonormal by the Riemannian optimiser (SM_PARAM_STIEFEL); the affinity is computed
 *             as one GEMM X Ucat^T and squared norms - the projector U U^T is never formed.
 *             h(x) = E * softmax(MLP(x)) with --amortize (GrMoE Sec. 5.2), else 1.
 *             alpha is the post-hoc sparsity dial (train at 1, deploy at any value).
 *             Subspace regulariser (GrMoE Eq. 12, App. D): beta * sum over pairs {e,e'} of
 *             max(0, ||U_e^T U_e'||_F^2 - rho0 k_r), over all pairs or M pairs sampled per step.
 * Both: kappa_e = exp(s_e) > 0 learned; then the shared softmax gate (gate.h), dense by default for
 * grassmann (k = E), top-k on the Bingham weights when k < E.
 *
 * Letters: T tokens, d width, E experts, R = k_r, Ha amortiser hidden width.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/gate.h"
#include "specmoe/methods/grmoe/router.h"
#include "specmoe/nn/mlp.h"
#include "specmoe/core/ops.h"

typedef struct {
    int grassmann;
    int iu, ik, ia[4];    /* parameter indices: directions/frames, log-kappa, amortiser w1 b1 w2 b2 */
    sm_real *u, *du;      /* vmf: (E,d) raw directions; grassmann: (E,R,d) frames */
    sm_real *lk, *dlk;    /* (E) log kappa */
    sm_real *aw[4], *daw[4]; /* amortiser (Ha,d) (Ha) (E,Ha) (E) */
    sm_gate gate;
    int max_T;
    sm_real *logits;      /* (T,E), reused for dlogits */
    sm_real *proj;        /* grassmann: (T,E*R) X Ucat^T;  vmf: (T,E) cosines */
    sm_real *aff;         /* (T,E) grassmann affinities ||U_e^T x||^2 */
    sm_real *xn;          /* (T,d) vmf: normalised x */
    sm_real *xnorm;       /* (T) vmf: ||x|| */
    sm_real *un;          /* (E,d) vmf: normalised directions */
    sm_real *unorm;       /* (E) */
    sm_real *h;           /* (T,E) amortiser h = E softmax(z) (1 without amortiser) */
    sm_real *zsm;         /* (T,E) softmax(z) */
    sm_real *ahpre, *ahid;/* (T,Ha) amortiser hidden pre-activation / activation */
    sm_real *scratch;     /* (T, max(E*R, d, Ha)) */
    sm_real *scratch2;    /* (T, max(E*R, d, Ha)) */
    int *pairs;           /* (2*n_pairs) sampled pairs of the last training forward */
    int n_pairs, max_pairs;
    sm_real *ovl;         /* (R,R) overlap scratch */
    sm_real *block;       /* the allocations the arrays above are carved from: sm_real */
    int *iblock;          /* and int (pairs) */
    int used_reg;
} geo_state;

static int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

static sm_status geo_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    geo_state *s = calloc(1, sizeof *s);
    if (!s) return sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
    r->state = s;
    s->grassmann = !strcmp(r->cfg.name, "grassmann");
    const int E = r->cfg.E, d = r->d, R = sm_grmoe_opts(&r->cfg)->kr;
    char name[SM_NAME_MAX];
    for (int i = 0; i < 4; i++) s->ia[i] = -1;
    if (s->grassmann) {
        int64_t shape[3] = {E, R, d};
        snprintf(name, sizeof name, "%s.frames", prefix);
        s->iu = sm_params_add(ps, name, 3, shape, SM_INIT_STIEFEL, d, 0, SM_PARAM_STIEFEL | SM_PARAM_NO_DECAY, err);
    } else {
        int64_t shape[2] = {E, d};
        snprintf(name, sizeof name, "%s.directions", prefix);
        s->iu = sm_params_add(ps, name, 2, shape, SM_INIT_NORMAL, d, 1.0, SM_PARAM_NO_DECAY, err);
    }
    if (s->iu < 0) return SM_ERR_ARG;
    int64_t se[1] = {E};
    snprintf(name, sizeof name, "%s.log_kappa", prefix);
    s->ik = sm_params_add(ps, name, 1, se, SM_INIT_CONST, 1, log(sm_grmoe_opts(&r->cfg)->kappa_init), SM_PARAM_NO_DECAY, err);
    if (s->ik < 0) return SM_ERR_ARG;
    if (s->grassmann && sm_grmoe_opts(&r->cfg)->amortize) {
        /* the output layer starts at zero so h(x) = 1 at initialisation: training starts from basic GrMoE */
        const int Ha = sm_grmoe_opts(&r->cfg)->amort_hidden;
        int64_t s1[2] = {Ha, d}, sb1[1] = {Ha}, s2[2] = {E, Ha}, sb2[1] = {E};
        const char *nm[4] = {"amortizer.w1", "amortizer.b1", "amortizer.w2", "amortizer.b2"};
        const int64_t *sh[4] = {s1, sb1, s2, sb2};
        const int nd[4] = {2, 1, 2, 1};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "%s.%s", prefix, nm[i]);
            s->ia[i] = sm_params_add(ps, name, nd[i], sh[i], i < 2 ? SM_INIT_UNIFORM_FANIN : SM_INIT_ZERO, d, 0,
                                     i % 2 ? SM_PARAM_NO_DECAY : 0, err);
            if (s->ia[i] < 0) return SM_ERR_ARG;
        }
    }
    return SM_OK;
}

static void geo_bind(sm_router *r, const sm_params *ps) {
    geo_state *s = r->state;
    s->u = sm_params_data(ps, s->iu);
    s->du = sm_params_grad(ps, s->iu);
    s->lk = sm_params_data(ps, s->ik);
    s->dlk = sm_params_grad(ps, s->ik);
    for (int i = 0; i < 4; i++)
        if (s->ia[i] >= 0) {
            s->aw[i] = sm_params_data(ps, s->ia[i]);
            s->daw[i] = sm_params_grad(ps, s->ia[i]);
        }
}

static int geo_max_assign(const sm_router *r, int T) { return T * r->cfg.k; }

static int n_pairs_per_step(const sm_router *r) {
    int E = r->cfg.E, all = E * (E - 1) / 2;
    if (sm_grmoe_opts(&r->cfg)->pairs < 0) return all;
    return sm_grmoe_opts(&r->cfg)->pairs == 0 ? 4 * E : sm_grmoe_opts(&r->cfg)->pairs;
}

static sm_status geo_reserve(sm_router *r, int max_T, sm_error *err) {
    geo_state *s = r->state;
    const int E = r->cfg.E, d = r->d, R = sm_grmoe_opts(&r->cfg)->kr, Ha = sm_grmoe_opts(&r->cfg)->amort_hidden;
    size_t T = (size_t)max_T, w = (size_t)max3(s->grassmann ? E * R : E, d, Ha);
    /* scratch2 also holds the (E,d) direction gradient of vmf, which can exceed T*w for small T */
    size_t w2 = T * w > (size_t)E * d ? T * w : (size_t)E * d;
    s->max_T = max_T;
    s->max_pairs = E * (E - 1) / 2 > n_pairs_per_step(r) ? E * (E - 1) / 2 : n_pairs_per_step(r);
    size_t sizes[] = {T * E, T * (size_t)(s->grassmann ? E * R : E), T * E, T * d, T, (size_t)E * d, (size_t)E,
                      T * E, T * E, T * Ha, T * Ha, T * w, w2, (size_t)R * R};
    sm_real **ptrs[] = {&s->logits, &s->proj, &s->aff, &s->xn, &s->xnorm, &s->un, &s->unorm,
                        &s->h, &s->zsm, &s->ahpre, &s->ahid, &s->scratch, &s->scratch2, &s->ovl};
    size_t isizes[] = {2 * (size_t)(s->max_pairs ? s->max_pairs : 1)};
    int **iptrs[] = {&s->pairs};
    s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router %s (%d tokens)", r->cfg.name, max_T);
    s->iblock = sm_carve_int(iptrs, isizes, SM_LEN(isizes), err, "router %s (%d tokens)", r->cfg.name, max_T);
    if (!s->block || !s->iblock) return SM_ERR_NOMEM;
    return sm_gate_init(&s->gate, &r->cfg, max_T, err);
}


/* ||R_a R_b^T||_F^2 with R_a, R_b (R,d) frames; O (R,R) left in ovl */
static double overlap(geo_state *s, const sm_real *Ra, const sm_real *Rb, int R, int d) {
    sm_gemm(0, 1, R, R, d, 1, Ra, d, Rb, d, 0, s->ovl, R);
    return sm_sumsq(s->ovl, (size_t)R * R);
}

static void geo_forward(sm_router *r, sm_route *route, const sm_real *x, int T, sm_rng *rng, int train) {
    geo_state *s = r->state;
    const sm_grmoe_router_opts *c = sm_grmoe_opts(&r->cfg);
    const int E = r->cfg.E, d = r->d, R = c->kr;
    if (!s->grassmann) {
        sm_l2norm_forward(s->xn, s->xnorm, x, T, d);
        sm_l2norm_forward(s->un, s->unorm, s->u, E, d);
        sm_gemm(0, 1, T, E, d, 1, s->xn, d, s->un, d, 0, s->proj, E); /* cosines (T,E) */
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++)
                s->logits[(size_t)t * E + e] = (sm_real)exp((double)s->lk[e]) * s->proj[(size_t)t * E + e];
        sm_gate_forward(&s->gate, route, s->logits, T);
        return;
    }
    /* affinities a_te = ||U_e^T x_t||^2 from one GEMM: proj (T, E*R) = X Ucat^T */
    sm_gemm(0, 1, T, E * R, d, 1, x, d, s->u, d, 0, s->proj, E * R);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            const sm_real *p = s->proj + (size_t)t * E * R + (size_t)e * R;
            sm_real a = 0;
            for (int j = 0; j < R; j++) a += p[j] * p[j];
            s->aff[(size_t)t * E + e] = a;
        }
    if (c->amortize) {
        sm_mlp_weights w = {s->aw[0], s->aw[1], s->aw[2], s->aw[3]};
        sm_real *z = s->scratch;
        sm_mlp_forward(z, s->ahpre, s->ahid, x, w, SM_ACT_RELU, T, d, c->amort_hidden, E);
        sm_softmax_forward(s->zsm, z, 1, T, E);
        for (size_t i = 0; i < (size_t)T * E; i++) s->h[i] = (sm_real)E * s->zsm[i];
    } else {
        for (size_t i = 0; i < (size_t)T * E; i++) s->h[i] = 1;
    }
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            size_t i = (size_t)t * E + e;
            s->logits[i] = (sm_real)(c->alpha * s->h[i] * exp((double)s->lk[e]) * s->aff[i]);
        }
    sm_gate_forward(&s->gate, route, s->logits, T);
    /* subspace-overlap regulariser: a function of the frames only, added at training time */
    s->used_reg = train && c->subspace_beta > 0 && E > 1;
    s->n_pairs = 0;
    if (s->used_reg) {
        int M = n_pairs_per_step(r);
        if (c->pairs < 0 || !rng) { /* all pairs (also when no rng is given) */
            for (int a = 0; a < E; a++)
                for (int b = a + 1; b < E; b++) {
                    s->pairs[2 * s->n_pairs] = a;
                    s->pairs[2 * s->n_pairs + 1] = b;
                    s->n_pairs++;
                }
        } else {
            for (int i = 0; i < M; i++) { /* M pairs drawn uniformly with replacement */
                int a = (int)sm_rng_below(rng, (uint32_t)E), b = (int)sm_rng_below(rng, (uint32_t)(E - 1));
                if (b >= a) b++;
                s->pairs[2 * i] = a < b ? a : b;
                s->pairs[2 * i + 1] = a < b ? b : a;
            }
            s->n_pairs = M;
        }
        double reg = 0;
        for (int i = 0; i < s->n_pairs; i++) {
            double ov = overlap(s, s->u + (size_t)s->pairs[2 * i] * R * d, s->u + (size_t)s->pairs[2 * i + 1] * R * d, R, d);
            if (ov > c->rho0 * R) reg += ov - c->rho0 * R;
        }
        route->aux_loss += c->subspace_beta * reg;
    }
}

static void geo_backward(sm_router *r, sm_real *dx, const sm_route *route, const sm_real *x, int T) {
    geo_state *s = r->state;
    const sm_grmoe_router_opts *c = sm_grmoe_opts(&r->cfg);
    const int E = r->cfg.E, d = r->d, R = c->kr;
    sm_real *dl = s->logits;
    sm_gate_backward(&s->gate, dl, route, T);
    if (!s->grassmann) {
        /* logit = kappa_e * cos_te: dkappa_e = sum_t dl cos; dcos = dl kappa */
        sm_real *dcos = s->scratch; /* (T,E) */
        for (int e = 0; e < E; e++) {
            double kap = exp((double)s->lk[e]), acc = 0;
            for (int t = 0; t < T; t++) {
                size_t i = (size_t)t * E + e;
                acc += (double)dl[i] * s->proj[i];
                dcos[i] = (sm_real)(dl[i] * kap);
            }
            s->dlk[e] += (sm_real)(acc * kap); /* through kappa = exp(s) */
        }
        sm_real *dxn = s->scratch2; /* (T,d) = dcos Un */
        sm_gemm(0, 0, T, d, E, 1, dcos, E, s->un, d, 0, dxn, d);
        sm_l2norm_backward(dx, dxn, s->xn, s->xnorm, T, d);
        sm_real *dun = s->scratch2; /* (E,d) = dcos^T Xn */
        sm_gemm(1, 0, E, d, T, 1, dcos, E, s->xn, d, 0, dun, d);
        sm_l2norm_backward(s->du, dun, s->un, s->unorm, E, d);
        return;
    }
    /* l = alpha h kappa a:  da = dl alpha h kappa;  dkappa = sum_t dl alpha h a;  dh = dl alpha kappa a */
    sm_real *dh = s->scratch2; /* (T,E) */
    for (int e = 0; e < E; e++) {
        double kap = exp((double)s->lk[e]), acc = 0;
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)t * E + e;
            double g = (double)dl[i] * c->alpha;
            acc += g * s->h[i] * s->aff[i];
            dh[i] = (sm_real)(g * kap * s->aff[i]);
            dl[i] = (sm_real)(g * s->h[i] * kap); /* dl now holds da */
        }
        s->dlk[e] += (sm_real)(acc * kap);
    }
    if (c->amortize) {
        /* h = E softmax(z): dz = softmax_backward(E dh); then the MLP */
        for (size_t i = 0; i < (size_t)T * E; i++) dh[i] *= (sm_real)E;
        sm_real *dz = s->scratch;
        memset(dz, 0, sizeof(sm_real) * (size_t)T * E);
        sm_softmax_backward(dz, dh, s->zsm, 1, T, E);
        sm_mlp_weights w = {s->aw[0], s->aw[1], s->aw[2], s->aw[3]};
        sm_mlp_grads g = {s->daw[0], s->daw[1], s->daw[2], s->daw[3]};
        sm_mlp_backward(dx, g, s->scratch2, dz, s->ahpre, s->ahid, x, w, SM_ACT_RELU, T, d, c->amort_hidden, E);
    }
    /* a = sum_j proj^2: dproj = 2 proj da; proj = X Ucat^T: dUcat += dproj^T X, dX += dproj Ucat */
    sm_real *dproj = s->scratch; /* (T, E*R) */
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            sm_real g = 2 * dl[(size_t)t * E + e];
            const sm_real *p = s->proj + (size_t)t * E * R + (size_t)e * R;
            sm_real *q = dproj + (size_t)t * E * R + (size_t)e * R;
            for (int j = 0; j < R; j++) q[j] = g * p[j];
        }
    sm_gemm(1, 0, E * R, d, T, 1, dproj, E * R, x, d, 1, s->du, d);
    sm_gemm(0, 0, T, d, E * R, 1, dproj, E * R, s->u, d, 1, dx, d);
    if (s->used_reg) {
        /* d/dR_a ||R_a R_b^T||^2 = 2 O R_b,  d/dR_b = 2 O^T R_a, for active (over-threshold) pairs */
        for (int i = 0; i < s->n_pairs; i++) {
            int a = s->pairs[2 * i], b = s->pairs[2 * i + 1];
            const sm_real *Ra = s->u + (size_t)a * R * d, *Rb = s->u + (size_t)b * R * d;
            double ov = overlap(s, Ra, Rb, R, d);
            if (!(ov > c->rho0 * R)) continue;
            sm_real coef = (sm_real)(2 * c->subspace_beta);
            sm_gemm(0, 0, R, d, R, coef, s->ovl, R, Rb, d, 1, s->du + (size_t)a * R * d, d);
            sm_gemm(1, 0, R, d, R, coef, s->ovl, R, Ra, d, 1, s->du + (size_t)b * R * d, d);
        }
    }
}

static void geo_destroy(sm_router *r) {
    geo_state *s = r->state;
    if (!s) return;
    sm_gate_free(&s->gate);
    free(s->block);
    free(s->iblock);
    free(s);
    r->state = NULL;
}

/* kappa_init (first row) is both routers'; the rest are grassmann's */
static const sm_router_opt kGeoOpts[] = {
    SM_ROUTER_OWN_OPT(sm_grmoe_router_opts, "kappa_init", NULL, SM_OPT_NUM, kappa_init, "1", "initial concentration kappa"),
    SM_ROUTER_OWN_OPT(sm_grmoe_router_opts, "alpha", NULL, SM_OPT_NUM, alpha, "1", "sparsity dial alpha (changeable at eval)"),
    SM_ROUTER_OWN_OPT(sm_grmoe_router_opts, "kr", NULL, SM_OPT_INT, kr, "16", "routing rank k_r"),
    SM_ROUTER_OWN_OPT(sm_grmoe_router_opts, "amortize", NULL, SM_OPT_BOOL, amortize, "0", "amortiser h(x) = E softmax(MLP(x))"),
    SM_ROUTER_OWN_OPT(sm_grmoe_router_opts, "amort_hidden", NULL, SM_OPT_INT, amort_hidden, "32", "amortiser hidden width"),
    SM_ROUTER_OWN_OPT(sm_grmoe_router_opts, "subspace_beta", NULL, SM_OPT_NUM, subspace_beta, "0.01", "subspace-overlap regulariser weight"),
    SM_ROUTER_OWN_OPT(sm_grmoe_router_opts, "rho0", NULL, SM_OPT_NUM, rho0, "0.3", "overlap threshold rho0"),
    SM_ROUTER_OWN_OPT(sm_grmoe_router_opts, "pairs", NULL, SM_OPT_INT, pairs, "0", "sampled pairs per step (0 = 4E, -1 = all)"),
};

static const char *vmf_check(const sm_router_config *cfg, int d, char *buf, size_t n) {
    (void)d, (void)buf, (void)n;
    return sm_grmoe_opts(cfg)->kappa_init > 0 ? NULL : "initial concentration kappa must be > 0";
}

static const char *grassmann_check(const sm_router_config *cfg, int d, char *buf, size_t n) {
    const sm_grmoe_router_opts *c = sm_grmoe_opts(cfg);
    if (!(c->alpha >= 0)) return "alpha (the sparsity dial) must be >= 0";
    const char *why = vmf_check(cfg, d, buf, n);
    if (why) return why;
    if (c->kr < 1 || c->kr > d) {
        snprintf(buf, n, "routing rank k_r must be in [1, d=%d]", d);
        return buf;
    }
    if (c->amortize && c->amort_hidden < 1) return "amortiser hidden width must be >= 1";
    if (!(c->subspace_beta >= 0) || !(c->rho0 >= 0)) return "subspace beta and rho0 must be >= 0";
    if (c->pairs < -1) return "sampled pairs must be >= 1, 0 (4E) or -1 (all)";
    return NULL;
}

/* the post-hoc sparsity dial (GrMoE Sec. 5.1): train at 1, deploy at any value */
static const char *const kGrassmannDials[] = {"alpha", NULL};

/* GrMoE: a dense mixture by default */
static void grassmann_defaults(sm_router_config *c, const sm_router_given *g) {
    if (!g->given(g->user, "topk")) c->k = c->E;
}

const sm_router_ops sm_router_vmf_ops = {
    .name = "vmf", .kind = SM_ROUTE_SPARSE, .declare = geo_declare, .bind = geo_bind,
    .max_assign = geo_max_assign, .reserve = geo_reserve, .forward = geo_forward,
    .backward = geo_backward, .destroy = geo_destroy, .opts = kGeoOpts, .n_opts = 1, .check = vmf_check,
};

const sm_router_ops sm_router_grassmann_ops = {
    .name = "grassmann", .kind = SM_ROUTE_SPARSE, .declare = geo_declare, .bind = geo_bind,
    .max_assign = geo_max_assign, .reserve = geo_reserve, .forward = geo_forward,
    .backward = geo_backward, .destroy = geo_destroy, .opts = kGeoOpts, .n_opts = SM_LEN(kGeoOpts),
    .check = grassmann_check, .defaults = grassmann_defaults, .dials = kGrassmannDials,
};
