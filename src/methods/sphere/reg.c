/* SPHERE in training (App. A.2-A.3; include/specmoe/methods/sphere/sphere.h): the penalty of
 * Eq. 26 on a model's expert features, its gradient over the parameters kept apart from the base
 * loss's, and the adaptive coefficient that combines the two. */
#include "specmoe/methods/sphere/sphere.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/optim.h"
#include "specmoe/nn/router.h"

#define MAX_SITES 64

struct sm_sphere_reg {
    sm_sphere_config c;
    sm_model *m;
    int n_sites;
    sm_moe *moe[MAX_SITES]; /* site i: hidden layer layer[i] of moe[i]'s experts */
    int layer[MAX_SITES];
    sm_real *block;         /* one allocation for the buffers below */
    sm_real *phi, *dphi;    /* (max_T, E H) of the widest site */
    sm_real *slice, *dslice;/* (max_T, H) one expert's columns (per_expert) */
    sm_real *work;          /* sm_sphere_work_values of the largest penalty */
    sm_real *gpen;          /* (P) grad L over the model's parameters (sm_sphere_step) */
    sm_real *u;             /* (O) gradient Gram: the scalar output's direction */
};

int sm_sphere_mode_parse(const char *s, sm_sphere_mode *mode) {
    if (!strcmp(s, "grad")) *mode = SM_SPHERE_GRAD;
    else if (!strcmp(s, "loss")) *mode = SM_SPHERE_LOSS;
    else if (!strcmp(s, "fixed")) *mode = SM_SPHERE_FIXED;
    else return -1;
    return 0;
}

int sm_sphere_gram_parse(const char *s, sm_sphere_gram *gram) {
    if (!strcmp(s, "feature")) *gram = SM_SPHERE_GRAM_FEATURE;
    else if (!strcmp(s, "gradient")) *gram = SM_SPHERE_GRAM_GRADIENT;
    else return -1;
    return 0;
}

void sm_sphere_direction(uint64_t seed, sm_real *u, int n) {
    sm_rng r;
    sm_rng_seed(&r, seed ^ 0x5350484552ULL); /* its own stream: a training's RNG is untouched */
    double n2 = 0;
    for (int j = 0; j < n; j++) u[j] = (sm_real)sm_rng_normal(&r), n2 += (double)u[j] * u[j];
    for (int j = 0; j < n; j++) u[j] = (sm_real)(u[j] / sqrt(n2));
}

/* The gradient Gram's placement (gradgram.c): psi is d(u^T out)/dz exactly only when the MoE layer's
 * output is the network's and relu' is piecewise constant. */
const char *sm_sphere_gram_refusal(const sm_sphere_config *c, const sm_model_config *mc) {
    if (c->gram != SM_SPHERE_GRAM_GRADIENT) return NULL;
    if (c->all_layers) return "the gradient Gram is derived for the last hidden expert layer only, not with all_layers";
    if (mc->n_layers < 1 || mc->layers[mc->n_layers - 1].kind != SM_LAYER_MOEHEAD)
        return "the gradient Gram needs the MoE layer to be the network's output (a moehead layer, SPHERE's actor): a layer "
               "after it would enter the backprop vectors";
    if (mc->moe.act != SM_ACT_RELU) return "the gradient Gram is exact for ReLU experts only (relu' piecewise constant), not tanh, gelu or silu";
    return NULL;
}

double sm_sphere_coef(const sm_sphere_config *c, double gnorm_base, double gnorm_pen, double loss_base, double loss_pen) {
    /* App. A.3: both are plain numbers, computed from this minibatch and then held fixed */
    if (c->mode == SM_SPHERE_LOSS) return c->rho * fabs(loss_base) / (loss_pen + 1e-8);
    if (c->mode == SM_SPHERE_FIXED) return c->rho;
    return c->rho * gnorm_base / (gnorm_pen + 1e-8);
}

sm_sphere_reg *sm_sphere_reg_create(const sm_sphere_config *c, sm_model *m, sm_error *err) {
    if (!(c->rho > 0)) {
        sm_fail(err, SM_ERR_ARG, "sphere: rho must be > 0 (got %g)", c->rho);
        return NULL;
    }
    if (m->n_penalties > 0) {
        sm_fail(err, SM_ERR_ARG, "sphere: the model carries penalties of its own (SR-MoE), which would enter SPHERE's backward");
        return NULL;
    }
    const int n_moe = sm_model_n_moe(m);
    if (n_moe == 0) {
        sm_fail(err, SM_ERR_ARG, "sphere: the network has no MoE layer (SPHERE regularises the experts' features)");
        return NULL;
    }
    sm_sphere_reg *r = calloc(1, sizeof *r);
    if (!r) {
        sm_fail(err, SM_ERR_NOMEM, "sphere: out of memory");
        return NULL;
    }
    r->c = *c;
    r->m = m;
    size_t wide = 0, H_max = 0, work = 0;
    for (int i = c->all_layers ? 0 : n_moe - 1; i < n_moe; i++) {
        sm_moe *moe = sm_model_moe(m, i);
        if (!sm_moe_has_features(moe) || moe->router->ops->kind != SM_ROUTE_SPARSE) {
            sm_fail(err, SM_ERR_ARG, "sphere: MoE layer %d needs a top-k (sparse) router (router %s) and built-in MLP experts or "
                    "factory experts whose hidden features it can read (containers of hidden blocks, moe.h feat_seq)", i,
                    moe->router->cfg.name);
            sm_sphere_reg_free(r);
            return NULL;
        }
        const char *why = sm_sphere_gram_refusal(c, &m->cfg);
        if (!why && c->gram == SM_SPHERE_GRAM_GRADIENT && moe->experts)
            why = "the gradient Gram reads the built-in experts' output weights, not factory experts' (LayerNorm experts)";
        if (!why && c->gram == SM_SPHERE_GRAM_GRADIENT && moe->cfg.act != SM_ACT_RELU) /* the layer's own, to be sure */
            why = "the gradient Gram is exact for ReLU experts only (relu' piecewise constant)";
        if (why) {
            sm_fail(err, SM_ERR_ARG, "sphere: %s", why);
            sm_sphere_reg_free(r);
            return NULL;
        }
        for (int j = c->all_layers ? 0 : moe->L - 1; j < moe->L; j++) {
            if (r->n_sites == MAX_SITES) {
                sm_fail(err, SM_ERR_ARG, "sphere: more than %d hidden expert layers", MAX_SITES);
                sm_sphere_reg_free(r);
                return NULL;
            }
            r->moe[r->n_sites] = moe, r->layer[r->n_sites++] = j;
        }
        size_t D = (size_t)moe->E * moe->H, w = sm_sphere_work_values(m->max_T, c->per_expert ? moe->H : (int)D);
        const size_t wr = sm_sphere_routed_work_values(m->max_T, moe->H);
        w = wr > w ? wr : w;
        wide = D > wide ? D : wide;
        H_max = (size_t)moe->H > H_max ? (size_t)moe->H : H_max;
        work = w > work ? w : work;
    }
    const size_t T = (size_t)m->max_T;
    const size_t O = (size_t)m->cfg.n_classes;
    r->block = malloc(sizeof(sm_real) * (2 * T * wide + 2 * T * H_max + work + m->params.total + O));
    if (!r->block) {
        sm_fail(err, SM_ERR_NOMEM, "sphere: out of memory for the features of %zu rows x %zu", T, wide);
        sm_sphere_reg_free(r);
        return NULL;
    }
    r->phi = r->block, r->dphi = r->phi + T * wide;
    r->slice = r->dphi + T * wide, r->dslice = r->slice + T * H_max, r->work = r->dslice + T * H_max;
    r->gpen = r->work + work;
    r->u = r->gpen + m->params.total;
    sm_sphere_direction(c->seed, r->u, (int)O);
    return r;
}

void sm_sphere_reg_free(sm_sphere_reg *r) {
    if (!r) return;
    free(r->block);
    free(r);
}

/* Eq. 26 on phi (T, E H) - or, per_expert, the sum over e of Eq. 26 on expert e's H columns -
 * with its gradient written into dphi. */
static double site_penalty(sm_sphere_reg *r, int T, int E, int H) {
    const int D = E * H;
    memset(r->dphi, 0, sizeof(sm_real) * (size_t)T * D);
    if (!r->c.per_expert) return sm_sphere_penalty(r->phi, T, D, r->dphi, 1, r->work);
    double L = 0;
    for (int e = 0; e < E; e++) {
        for (int t = 0; t < T; t++) memcpy(r->slice + (size_t)t * H, r->phi + (size_t)t * D + (size_t)e * H, sizeof(sm_real) * H);
        memset(r->dslice, 0, sizeof(sm_real) * (size_t)T * H);
        L += sm_sphere_penalty(r->slice, T, H, r->dslice, 1, r->work);
        for (int t = 0; t < T; t++) memcpy(r->dphi + (size_t)t * D + (size_t)e * H, r->dslice + (size_t)t * H, sizeof(sm_real) * H);
    }
    return L;
}

/* the routed path (sm_sphere_penalty_routed: no dense phi, only the pairs that share an expert) where
 * the dense one would use the sample-space Gram: T <= D (its T x T Gram fits the work area) */
static int routed(const sm_sphere_reg *r, const sm_moe *moe, int T) {
    if (r->c.gram == SM_SPHERE_GRAM_GRADIENT) return 0; /* psi is dense within each selected block too */
    return T <= (r->c.per_expert ? moe->H : moe->E * moe->H);
}

/* site s's L; what its backward needs stays in the work areas (dphi, or the routed Gram) */
static double site_forward(sm_sphere_reg *r, int s, int T) {
    sm_moe *moe = r->moe[s];
    const int j = r->layer[s], w = !r->c.unweighted;
    if (routed(r, moe, T)) return sm_sphere_penalty_routed(moe, j, w, r->c.per_expert, r->work);
    /* checked at create: cannot fail */
    if (r->c.gram == SM_SPHERE_GRAM_GRADIENT) (void)sm_sphere_grad_features(moe, r->u, w, r->phi, NULL);
    else (void)sm_sphere_features_at(moe, j, w, r->phi, NULL);
    return site_penalty(r, T, moe->E, moe->H);
}

/* scale * dL/dphi of site s into its layer's gradients, right after site_forward(r, s, T); the
 * gradient Gram's output-weight gradient goes straight into grad (P), a gradient block of r->m's
 * parameter table */
static void site_backward(sm_sphere_reg *r, int s, int T, sm_real scale, sm_real *grad) {
    sm_moe *moe = r->moe[s];
    const int j = r->layer[s], w = !r->c.unweighted;
    if (routed(r, moe, T)) {
        sm_sphere_penalty_routed_backward(moe, j, w, r->c.per_expert, scale, r->work);
        return;
    }
    if (scale != 1) {
        const size_t n = (size_t)T * moe->E * moe->H;
        for (size_t i = 0; i < n; i++) r->dphi[i] *= scale;
    }
    if (r->c.gram == SM_SPHERE_GRAM_GRADIENT)
        sm_sphere_grad_features_backward(moe, r->u, w, r->dphi, grad + r->m->params.p[moe->ip[2]].offset);
    else sm_sphere_features_at_backward(moe, j, w, r->dphi);
}

double sm_sphere_reg_grad(sm_sphere_reg *r, const sm_params *pv, int T) {
    sm_model *m = r->m;
    const int n_moe = sm_model_n_moe(m);
    /* the base backward has added the output's gradient to the combine weights: start over */
    for (int i = 0; i < n_moe; i++) {
        sm_moe *moe = sm_model_moe(m, i);
        if (moe->route.kind == SM_ROUTE_SPARSE) memset(moe->route.dweight, 0, sizeof(sm_real) * (size_t)moe->route.n_assign);
    }
    double L = 0;
    for (int s = 0; s < r->n_sites; s++) {
        L += site_forward(r, s, T);
        site_backward(r, s, T, 1, pv->grad);
    }
    /* the penalty is the only source of this backward: no output gradient, no auxiliary losses */
    memset(m->dlogits, 0, sizeof(sm_real) * (size_t)T * m->cfg.n_classes);
    double aux[MAX_SITES][2];
    for (int i = 0; i < n_moe && i < MAX_SITES; i++) {
        sm_router_config *rc = &sm_model_moe(m, i)->router->cfg;
        aux[i][0] = rc->balance_coef, aux[i][1] = rc->zloss_coef;
        rc->balance_coef = rc->zloss_coef = 0;
    }
    sm_model_backward_into(m, pv, T);
    for (int i = 0; i < n_moe && i < MAX_SITES; i++) {
        sm_router_config *rc = &sm_model_moe(m, i)->router->cfg;
        rc->balance_coef = aux[i][0], rc->zloss_coef = aux[i][1];
    }
    return L;
}

double sm_sphere_inject(sm_sphere_reg *r, double loss_base, int T, sm_sphere_stats *out) {
    /* L over every site first (lambda needs the total), then each site's gradient again, scaled */
    double L = 0;
    for (int s = 0; s < r->n_sites; s++) L += site_forward(r, s, T);
    const double lambda = sm_sphere_coef(&r->c, 0, 0, loss_base, L);
    for (int s = 0; s < r->n_sites; s++) {
        if (r->n_sites > 1) (void)site_forward(r, s, T); /* the one site's work areas are still there otherwise */
        site_backward(r, s, T, (sm_real)lambda, r->m->params.grad);
    }
    if (out) {
        memset(out, 0, sizeof *out);
        out->penalty = L, out->coef = lambda, out->gnorm_base = NAN, out->gnorm_pen = NAN;
    }
    return L;
}

void sm_sphere_step(sm_sphere_reg *r, sm_params *const *others, int n_others, double loss_base, int T, sm_sphere_stats *out) {
    sm_params *ps = &r->m->params;
    const size_t P = ps->total;
    /* the norms over the parameters the step updates (frozen ones are not), in eight partial sums:
     * a plain running sum over the 1.5M gradients of the paper's actor is a chain of dependent adds
     * that cost as much as the penalty's backward */
    double nb = sm_grad_sq_sum(ps, 0, 0);
    for (int i = 0; i < n_others; i++) nb += sm_grad_sq_sum(others[i], 0, 0);
    memset(r->gpen, 0, sizeof(sm_real) * P);
    sm_params view = sm_params_view(ps, r->gpen);
    sm_sphere_stats s = {0};
    s.penalty = sm_sphere_reg_grad(r, &view, T);
    s.gnorm_base = sqrt(nb);
    s.gnorm_pen = sqrt(sm_grad_sq_sum(&view, 0, 0));
    s.coef = sm_sphere_coef(&r->c, s.gnorm_base, s.gnorm_pen, loss_base, s.penalty);
    for (size_t i = 0; i < P; i++) ps->grad[i] += (sm_real)(s.coef * r->gpen[i]);
    if (out) *out = s;
}
