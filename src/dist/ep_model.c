/* Expert parallelism inside a model (include/specmoe/dist/ep.h, sm_ep_model_attach): every MoE
 * layer of the model runs through an sm_ep_moe whose router and experts read and write the model's
 * own parameter block, so the training loop, the optimiser, checkpoints and evaluation are the
 * data-parallel ones unchanged.
 *
 * Why the plain gradient allreduce is then right: under sm_train's data parallelism each rank's
 * output gradient carries the factor P/B per row (the global mean, times P for the mean over ranks
 * the allreduce takes). Rank r computes the complete gradient of its own experts from every rank's
 * rows (P times the global-mean gradient) and zero for the others, and its part of the router's
 * gradient (its own tokens); the allreduce sums the disjoint expert gradients and the router's
 * parts, and the division by P leaves the global-mean gradient everywhere. */
#include "specmoe/dist/ep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sm_moe_exec base;     /* first: the module calls back with it */
    sm_ep_moe *ep;
    struct sm_ep_model *owner;
    size_t router_off;    /* offset of the layer's first router tensor in the model's block */
    size_t off[4], per[4];/* experts.w1, b1, w2, b2: offset in the block and values per expert (per 0: absent) */
} ep_layer;

struct sm_ep_model {
    sm_model *m;
    int n;
    ep_layer layer[SM_MAX_LAYERS];
    sm_error err;         /* the first failure inside a forward or backward */
    int failed;
};

/* the layer's router and this rank's experts onto the call's view of the model's block */
static void bind(ep_layer *l, const sm_params *pv) {
    sm_ep_moe *ep = l->ep;
    sm_params rv = ep->params; /* the router's tensors lead both tables in the same layout */
    rv.data = pv->data + l->router_off;
    rv.grad = pv->grad ? pv->grad + l->router_off : NULL;
    ep->router->ops->bind(ep->router, &rv);
    sm_real **w[4] = {&ep->w1, &ep->b1, &ep->w2, &ep->b2}, **g[4] = {&ep->dw1, &ep->db1, &ep->dw2, &ep->db2};
    for (int i = 0; i < 4; i++) {
        const size_t at = l->off[i] + (size_t)ep->e0 * l->per[i];
        *w[i] = l->per[i] ? pv->data + at : NULL;
        *g[i] = l->per[i] && pv->grad ? pv->grad + at : NULL;
    }
}

/* this rank's route into the layer's own (the routing statistics read it) */
static void route_copy(sm_route *dst, const sm_route *src, int T) {
    const int E = src->E, A = src->n_assign;
    dst->T = T, dst->n_assign = A, dst->dropped = src->dropped, dst->aux_loss = src->aux_loss;
    memcpy(dst->offset, src->offset, sizeof(int) * (size_t)(E + 1));
    memcpy(dst->token, src->token, sizeof(int) * (size_t)A);
    memcpy(dst->slot, src->slot, sizeof(int) * (size_t)A);
    memcpy(dst->weight, src->weight, sizeof(sm_real) * (size_t)A);
    memcpy(dst->load, src->load, sizeof(int) * (size_t)E);
    if (T > 0) memcpy(dst->probs, src->probs, sizeof(sm_real) * (size_t)T * E);
}

static void fail(ep_layer *l, sm_real *poison, size_t n, const sm_error *e) {
    if (!l->owner->failed) l->owner->err = *e;
    l->owner->failed = 1;
    for (size_t i = 0; i < n; i++) poison[i] = NAN;
}

static void ep_forward(sm_moe_exec *x, sm_moe *moe, sm_real *out, const sm_real *in, int T, const sm_params *pv, sm_rng *rng,
                       int train) {
    ep_layer *l = (ep_layer *)x;
    sm_error e;
    bind(l, pv);
    if (sm_ep_moe_forward(l->ep, out, in, T, rng, train, &e) != SM_OK) fail(l, out, (size_t)T * l->ep->O, &e);
    else route_copy(&moe->route, &l->ep->route, T);
}

static void ep_backward(sm_moe_exec *x, sm_moe *moe, sm_real *dx, const sm_real *dout, const sm_real *in, int T,
                        const sm_params *pv) {
    (void)moe;
    ep_layer *l = (ep_layer *)x;
    sm_error e;
    bind(l, pv);
    if (sm_ep_moe_backward(l->ep, dx, dout, in, T, &e) != SM_OK) fail(l, dx, (size_t)T * l->ep->d, &e);
}

void sm_ep_model_detach(sm_ep_model *x) {
    if (!x) return;
    for (int j = 0; j < x->m->n_layers; j++)
        if (x->m->layers[j].moe) sm_moe_module_set_exec(x->m->layers[j].mod, NULL, NULL);
    for (int i = 0; i < x->n; i++) sm_ep_moe_free(x->layer[i].ep);
    free(x);
}

const char *sm_ep_model_error(const sm_ep_model *x) { return x && x->failed ? x->err.msg : NULL; }

sm_ep_model *sm_ep_model_attach(sm_dist *dist, sm_model *m, sm_error *err) {
    const int one = dist->size < 2;
    sm_ep_model *x = one ? NULL : calloc(1, sizeof *x);
    if (!x) {
        sm_fail(err, one ? SM_ERR_ARG : SM_ERR_NOMEM, "expert parallel: %s",
                one ? "needs 2 or more ranks (start it with mpirun -np N)" : "out of memory");
        return NULL;
    }
    x->m = m;
    if (m->n_penalties > 0) { /* they read and write the layer's own routes and features */
        sm_fail(err, SM_ERR_ARG, "expert parallel: the model's penalties (--spectral-alpha, --diversity-beta, ...) are not "
                "supported with split experts; train them data parallel");
        goto fail;
    }
    sm_rng rng; /* the temporary full layer sm_ep_moe_create draws is discarded: the model's values are used */
    sm_rng_seed(&rng, 1);
    for (int i = 0; i < m->n_layers; i++) {
        sm_moe *moe = m->layers[i].moe;
        if (!moe) continue;
        sm_module *mod = m->layers[i].mod;
        ep_layer *l = &x->layer[x->n];
        l->owner = x;
        l->base.forward = ep_forward, l->base.backward = ep_backward;
        const int max_T = m->max_T * mod->in.rows;
        if (!(l->ep = sm_ep_moe_create(dist, &moe->cfg, moe->d, max_T, mod->name, &rng, err))) goto fail;
        x->n++;
        /* where the layer's tensors sit in the model's block */
        const sm_params *ps = &m->params;
        int j0 = sm_params_find(ps, l->ep->params.p[0].name);
        if (j0 < 0) {
            sm_fail(err, SM_ERR_MISMATCH, "expert parallel: the model has no tensor %s", l->ep->params.p[0].name);
            goto fail;
        }
        l->router_off = ps->p[j0].offset;
        for (int k = 0; k < l->ep->params.n && (size_t)l->ep->params.p[k].offset < l->ep->router_numel; k++) {
            int j = sm_params_find(ps, l->ep->params.p[k].name);
            if (j < 0 || ps->p[j].offset - l->router_off != l->ep->params.p[k].offset) {
                sm_fail(err, SM_ERR_MISMATCH, "expert parallel: %s: the router's tensors are laid out differently", mod->name);
                goto fail;
            }
        }
        const int idx[4] = {moe->ip[0], moe->ip[1], moe->ip[2], moe->ip[3]};
        for (int k = 0; k < 4; k++) {
            l->per[k] = idx[k] >= 0 ? ps->p[idx[k]].numel / (size_t)moe->E : 0;
            l->off[k] = idx[k] >= 0 ? ps->p[idx[k]].offset : 0;
        }
        if (sm_moe_module_set_exec(mod, &l->base, err) != SM_OK) goto fail;
    }
    if (x->n == 0) {
        sm_fail(err, SM_ERR_ARG, "expert parallel: the model has no moe layer (--arch ...,moe:H,...)");
        goto fail;
    }
    return x;
fail:
    sm_ep_model_detach(x);
    return NULL;
}
