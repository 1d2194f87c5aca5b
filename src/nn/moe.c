/* The MoE layer (see include/specmoe/moe.h). */
#include "specmoe/nn/moe.h"

#include <cjson/cJSON.h>

#include "specmoe/core/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sm_moe_config_default(sm_moe_config *c) {
    memset(c, 0, sizeof *c);
    sm_router_config_default(&c->router);
    c->H = 256;
    c->act = SM_ACT_RELU;
    c->expert_bias = 1;
}

void sm_moe_config_to_json(const sm_moe_config *c, cJSON *o) {
    if (!o) return;
    sm_router_config_to_json(&c->router, o);
    cJSON_AddNumberToObject(o, "shared", c->n_shared);
    cJSON_AddNumberToObject(o, "expert_bias", c->expert_bias);
    cJSON_AddStringToObject(o, "expert_act", sm_act_name(c->act));
}

sm_status sm_moe_config_from_json(sm_moe_config *c, const cJSON *o, sm_error *err) {
    const char *what = "model config";
    char eact[16];
    if (!cJSON_IsObject(o)) return sm_fail(err, SM_ERR_FORMAT, "%s: field 'moe' missing", what);
    sm_status st = sm_router_config_from_json(&c->router, o, what, err);
    if (st == SM_OK) st = sm_json_int(o, "shared", 0, &c->n_shared, what, err);
    if (st == SM_OK) st = sm_json_int(o, "expert_bias", 0, &c->expert_bias, what, err);
    if (st == SM_OK) st = sm_json_str(o, "expert_act", eact, sizeof eact, what, err);
    if (st == SM_OK && sm_act_parse(eact, &c->act)) st = sm_fail(err, SM_ERR_FORMAT, "%s: unknown activation '%s'", what, eact);
    return st;
}

sm_moe *sm_moe_create(const sm_moe_config *cfg, int d, sm_error *err) {
    if (cfg->H < 1) {
        sm_fail(err, SM_ERR_ARG, "moe: expert hidden width must be >= 1 (got %d)", cfg->H);
        return NULL;
    }
    if (cfg->n_shared < 0) {
        sm_fail(err, SM_ERR_ARG, "moe: shared experts must be >= 0 (got %d)", cfg->n_shared);
        return NULL;
    }
    sm_moe *m = calloc(1, sizeof *m);
    if (!m) {
        sm_fail(err, SM_ERR_NOMEM, "moe: out of memory");
        return NULL;
    }
    m->cfg = *cfg;
    m->d = d;
    m->O = cfg->out_dim > 0 ? cfg->out_dim : d;
    m->E = cfg->router.E;
    m->S = cfg->n_shared;
    m->H = cfg->H;
    m->router = sm_router_create(&cfg->router, d, err);
    if (!m->router) {
        free(m);
        return NULL;
    }
    for (int i = 0; i < 8; i++) m->ip[i] = -1;
    return m;
}

void sm_moe_free(sm_moe *m) {
    if (!m) return;
    sm_router_free(m->router);
    sm_route_free(&m->route);
    free(m->act_block);
    free(m);
}

sm_status sm_moe_declare(sm_moe *m, sm_params *ps, const char *prefix, sm_error *err) {
    char name[SM_NAME_MAX];
    snprintf(name, sizeof name, "%s.router", prefix);
    sm_status st = m->router->ops->declare(m->router, ps, name, err);
    if (st != SM_OK) return st;
    /* routed experts then shared experts: the same four tensors with a leading count dimension */
    const char *group[2] = {"experts", "shared"};
    int count[2] = {m->E, m->S};
    for (int g = 0; g < 2; g++) {
        if (count[g] == 0) continue;
        int64_t s_w1[3] = {count[g], m->H, m->d}, s_b1[2] = {count[g], m->H};
        int64_t s_w2[3] = {count[g], m->O, m->H}, s_b2[2] = {count[g], m->O};
        int *ip = m->ip + 4 * g;
        snprintf(name, sizeof name, "%s.%s.w1", prefix, group[g]);
        if ((ip[0] = sm_params_add(ps, name, 3, s_w1, SM_INIT_UNIFORM_FANIN, m->d, 0, 0, err)) < 0) return SM_ERR_ARG;
        if (m->cfg.expert_bias) {
            snprintf(name, sizeof name, "%s.%s.b1", prefix, group[g]);
            if ((ip[1] = sm_params_add(ps, name, 2, s_b1, SM_INIT_UNIFORM_FANIN, m->d, 0, SM_PARAM_NO_DECAY, err)) < 0) return SM_ERR_ARG;
        }
        snprintf(name, sizeof name, "%s.%s.w2", prefix, group[g]);
        if ((ip[2] = sm_params_add(ps, name, 3, s_w2, SM_INIT_UNIFORM_FANIN, m->H, 0, 0, err)) < 0) return SM_ERR_ARG;
        if (m->cfg.expert_bias) {
            snprintf(name, sizeof name, "%s.%s.b2", prefix, group[g]);
            if ((ip[3] = sm_params_add(ps, name, 2, s_b2, SM_INIT_UNIFORM_FANIN, m->H, 0, SM_PARAM_NO_DECAY, err)) < 0) return SM_ERR_ARG;
        }
    }
    return SM_OK;
}

static void bind2(const sm_params *ps, int i, sm_real **data, sm_real **grad) {
    *data = i >= 0 ? sm_params_data(ps, i) : NULL;
    *grad = i >= 0 ? sm_params_grad(ps, i) : NULL;
}

void sm_moe_bind(sm_moe *m, const sm_params *ps) {
    m->router->ops->bind(m->router, ps);
    bind2(ps, m->ip[0], &m->w1, &m->dw1);
    bind2(ps, m->ip[1], &m->b1, &m->db1);
    bind2(ps, m->ip[2], &m->w2, &m->dw2);
    bind2(ps, m->ip[3], &m->b2, &m->db2);
    bind2(ps, m->ip[4], &m->sw1, &m->dsw1);
    bind2(ps, m->ip[5], &m->sb1, &m->dsb1);
    bind2(ps, m->ip[6], &m->sw2, &m->dsw2);
    bind2(ps, m->ip[7], &m->sb2, &m->dsb2);
}

sm_status sm_moe_reserve(sm_moe *m, int max_T, sm_error *err) {
    if (max_T < 1) return sm_fail(err, SM_ERR_ARG, "moe: batch size must be >= 1");
    if (m->act_block) return sm_fail(err, SM_ERR_ARG, "moe: activations are already reserved (reserve once, for the largest batch)");
    m->max_T = max_T;
    m->max_A = m->router->ops->max_assign(m->router, max_T);
    sm_status st = m->router->ops->reserve(m->router, max_T, err);
    if (st != SM_OK) return st;
    const sm_router_ops *ops = m->router->ops;
    st = sm_route_alloc(&m->route, ops->kind, max_T, m->E, m->max_A,
                        ops->max_slots ? ops->max_slots(m->router, max_T) : 0, err);
    if (st != SM_OK) return st;
    size_t A = (size_t)m->max_A, T = (size_t)max_T, d = (size_t)m->d, O = (size_t)m->O, H = (size_t)m->H;
    size_t S = (size_t)m->S, dh_rows = A > T ? A : T;
    size_t sizes[] = {A * d, A * H, A * H, A * O, A * O, A * d, dh_rows * H, S * T * H, S * T * H, T * O};
    sm_real **ptrs[] = {&m->xg, &m->hpre, &m->h, &m->y, &m->dy, &m->dxg, &m->dh, &m->shpre, &m->sh, &m->sy};
    m->act_block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "moe (activations for %d tokens)", max_T);
    return m->act_block ? SM_OK : SM_ERR_NOMEM;
}

static sm_mlp_weights expert_weights(const sm_real *w1, const sm_real *b1, const sm_real *w2,
                                     const sm_real *b2, int e, int d, int H, int O) {
    sm_mlp_weights w = {
        .w1 = w1 + (size_t)e * H * d,
        .b1 = b1 ? b1 + (size_t)e * H : NULL,
        .w2 = w2 + (size_t)e * O * H,
        .b2 = b2 ? b2 + (size_t)e * O : NULL,
    };
    return w;
}

static sm_mlp_grads expert_grads(sm_real *dw1, sm_real *db1, sm_real *dw2, sm_real *db2, int e, int d,
                                 int H, int O) {
    sm_mlp_grads g = {
        .dw1 = dw1 + (size_t)e * H * d,
        .db1 = db1 ? db1 + (size_t)e * H : NULL,
        .dw2 = dw2 + (size_t)e * O * H,
        .db2 = db2 ? db2 + (size_t)e * O : NULL,
    };
    return g;
}

/* SOFT routes: slot inputs of expert e, group g are rows (e*G + g)*p .. +p of xg:
 * xg_(e,g) = D_g[:, e-block]^T X_g  (p, m_g), and the output is out_g = sum_e C_g[:, e-block] y_(e,g). */
static void soft_dispatch(sm_moe *m, const sm_real *x, int T) {
    const sm_route *r = &m->route;
    const int d = m->d, E = m->E, p = r->slots, S = E * p, G = r->groups, gm = r->group_size;
    for (int g = 0; g < G; g++) {
        int t0 = g * gm, mg = T - t0 < gm ? T - t0 : gm;
        for (int e = 0; e < E; e++)
            sm_gemm(1, 0, p, d, mg, 1, r->dispatch + (size_t)t0 * S + e * p, S, x + (size_t)t0 * d, d, 0,
                    m->xg + (size_t)(e * G + g) * p * d, d);
    }
}

static void soft_combine(sm_moe *m, sm_real *out, int T) {
    const sm_route *r = &m->route;
    const int O = m->O, E = m->E, p = r->slots, S = E * p, G = r->groups, gm = r->group_size;
    for (int g = 0; g < G; g++) {
        int t0 = g * gm, mg = T - t0 < gm ? T - t0 : gm;
        for (int e = 0; e < E; e++)
            sm_gemm(0, 0, mg, O, p, 1, r->combine + (size_t)t0 * S + e * p, S, m->y + (size_t)(e * G + g) * p * O, O,
                    1, out + (size_t)t0 * O, O);
    }
}

void sm_moe_forward(sm_moe *m, sm_real *out, const sm_real *x, int T, sm_rng *rng, int train) {
    const int d = m->d, H = m->H, E = m->E, O = m->O;
    sm_route *r = &m->route;
    m->router->ops->forward(m->router, r, x, T, rng, train);
    memset(r->dprobs, 0, sizeof(sm_real) * (size_t)T * E);
    const int A = r->n_assign;
    if (r->kind == SM_ROUTE_SOFT) soft_dispatch(m, x, T);
    else
        for (int a = 0; a < A; a++) memcpy(m->xg + (size_t)a * d, x + (size_t)r->token[a] * d, sizeof(sm_real) * d);
    /* experts are independent: one per thread (BLAS runs single-threaded inside the region) */
#pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < E; e++) {
        int a0 = r->offset[e], n = r->offset[e + 1] - a0;
        if (n == 0) continue;
        sm_mlp_forward(m->y + (size_t)a0 * O, m->hpre + (size_t)a0 * H, m->h + (size_t)a0 * H,
                       m->xg + (size_t)a0 * d, expert_weights(m->w1, m->b1, m->w2, m->b2, e, d, H, O),
                       m->cfg.act, n, d, H, O);
    }
    memset(out, 0, sizeof(sm_real) * (size_t)T * O);
    if (r->kind == SM_ROUTE_SOFT) {
        soft_combine(m, out, T);
    } else {
        for (int a = 0; a < A; a++) {
            sm_real w = r->weight[a];
            const sm_real *y = m->y + (size_t)a * O;
            sm_real *o = out + (size_t)r->token[a] * O;
            for (int i = 0; i < O; i++) o[i] += w * y[i];
        }
    }
    for (int s = 0; s < m->S; s++) {
        sm_mlp_forward(m->sy, m->shpre + (size_t)s * T * H, m->sh + (size_t)s * T * H, x,
                       expert_weights(m->sw1, m->sb1, m->sw2, m->sb2, s, d, H, O), m->cfg.act, T, d, H, O);
        for (size_t i = 0; i < (size_t)T * O; i++) out[i] += m->sy[i];
    }
}

void sm_moe_backward(sm_moe *m, sm_real *dx, const sm_real *dout, const sm_real *x, int T) {
    const int d = m->d, H = m->H, E = m->E, O = m->O;
    sm_route *r = &m->route;
    const int A = r->n_assign;
    const int p = r->slots, S = E * p, G = r->groups, gm = r->group_size;
    if (r->kind == SM_ROUTE_SOFT) {
        /* out_g = C_g Y_g:  dY_(e,g) = C_g[:, e-block]^T dout_g,  dC_g[:, e-block] = dout_g Y_(e,g)^T */
        for (int g = 0; g < G; g++) {
            int t0 = g * gm, mg = T - t0 < gm ? T - t0 : gm;
            for (int e = 0; e < E; e++) {
                size_t row = (size_t)(e * G + g) * p * O;
                sm_gemm(1, 0, p, O, mg, 1, r->combine + (size_t)t0 * S + e * p, S, dout + (size_t)t0 * O, O, 0,
                        m->dy + row, O);
                sm_gemm(0, 1, mg, p, O, 1, dout + (size_t)t0 * O, O, m->y + row, O, 0,
                        r->dcombine + (size_t)t0 * S + e * p, S);
            }
        }
    }
    /* combine: out_t += w_a y_a  =>  dw_a = <dout_t, y_a>,  dy_a = w_a dout_t */
    for (int a = 0; a < A && r->kind == SM_ROUTE_SPARSE; a++) {
        const sm_real *g = dout + (size_t)r->token[a] * O, *y = m->y + (size_t)a * O;
        sm_real *dy = m->dy + (size_t)a * O;
        sm_real w = r->weight[a], dot = 0;
        for (int i = 0; i < O; i++) {
            dot += g[i] * y[i];
            dy[i] = w * g[i];
        }
        r->dweight[a] = dot;
    }
    memset(m->dxg, 0, sizeof(sm_real) * (size_t)A * d);
#pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < E; e++) {
        int a0 = r->offset[e], n = r->offset[e + 1] - a0;
        if (n == 0) continue;
        sm_mlp_backward(m->dxg + (size_t)a0 * d, expert_grads(m->dw1, m->db1, m->dw2, m->db2, e, d, H, O),
                        m->dh + (size_t)a0 * H, m->dy + (size_t)a0 * O, m->hpre + (size_t)a0 * H,
                        m->h + (size_t)a0 * H, m->xg + (size_t)a0 * d,
                        expert_weights(m->w1, m->b1, m->w2, m->b2, e, d, H, O), m->cfg.act, n, d, H, O);
    }
    if (r->kind == SM_ROUTE_SOFT) {
        /* xg_(e,g) = D_g[:, e-block]^T X_g:  dD_g[:, e-block] = X_g dxg_(e,g)^T,  dX_g += D_g[:, e-block] dxg_(e,g) */
        for (int g = 0; g < G; g++) {
            int t0 = g * gm, mg = T - t0 < gm ? T - t0 : gm;
            for (int e = 0; e < E; e++) {
                size_t row = (size_t)(e * G + g) * p * d;
                sm_gemm(0, 1, mg, p, d, 1, x + (size_t)t0 * d, d, m->dxg + row, d, 0,
                        r->ddispatch + (size_t)t0 * S + e * p, S);
                sm_gemm(0, 0, mg, d, p, 1, r->dispatch + (size_t)t0 * S + e * p, S, m->dxg + row, d, 1,
                        dx + (size_t)t0 * d, d);
            }
        }
    } else {
        for (int a = 0; a < A; a++) {
            const sm_real *g = m->dxg + (size_t)a * d;
            sm_real *o = dx + (size_t)r->token[a] * d;
            for (int i = 0; i < d; i++) o[i] += g[i];
        }
    }
    for (int s = 0; s < m->S; s++) {
        sm_mlp_backward(dx, expert_grads(m->dsw1, m->dsb1, m->dsw2, m->dsb2, s, d, H, O), m->dh, dout,
                        m->shpre + (size_t)s * T * H, m->sh + (size_t)s * T * H, x,
                        expert_weights(m->sw1, m->sb1, m->sw2, m->sb2, s, d, H, O), m->cfg.act, T, d, H, O);
    }
    m->router->ops->backward(m->router, dx, r, x, T);
}

/* ---- the MoE layer as a module (include/specmoe/nn/module.h) ---------------------------------- */

#include "nn/module_internal.h"

typedef struct {
    sm_module base;
    sm_moe_config cfg;
    sm_moe *moe;
    sm_real *scratch; /* (N, d) input gradient when the caller needs none: router and experts write one */
} moe_mod;

static sm_status moe_mod_declare(sm_module *m, sm_params *ps, sm_error *err) {
    moe_mod *mm = (moe_mod *)m;
    int d = sm_shape_width(m->in);
    if (!(mm->moe = sm_moe_create(&mm->cfg, d, err))) return SM_ERR_ARG;
    m->out = sm_shape_vec(mm->moe->O);
    m->out.rows = m->in.rows;
    return sm_moe_declare(mm->moe, ps, m->name, err);
}
static void moe_mod_reserve(sm_module *m, int B, sm_arena *a) {
    ((moe_mod *)m)->scratch = sm_arena_take(a, (size_t)B * sm_shape_numel(m->in));
}
static sm_status moe_mod_setup(sm_module *m, int B, sm_error *err) {
    return sm_moe_reserve(((moe_mod *)m)->moe, B * m->in.rows, err);
}
/* parameters are bound at every call: the view (and so the gradient destination) is the caller's */
static void moe_mod_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    moe_mod *mm = (moe_mod *)m;
    sm_moe_bind(mm->moe, ctx->pv);
    sm_moe_forward(mm->moe, out, in, B * m->in.rows, ctx->rng, ctx->train);
}
static void moe_mod_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    moe_mod *mm = (moe_mod *)m;
    int N = B * m->in.rows;
    sm_real *dx = din;
    if (!dx) memset(dx = mm->scratch, 0, sizeof(sm_real) * (size_t)N * mm->moe->d);
    sm_moe_bind(mm->moe, ctx->pv);
    sm_moe_backward(mm->moe, dx, dout, in, N);
}
static void moe_mod_json(const sm_module *m, cJSON *o) {
    const moe_mod *mm = (const moe_mod *)m;
    cJSON_AddNumberToObject(o, "hidden", mm->cfg.H);
    sm_moe_config_to_json(&mm->cfg, cJSON_AddObjectToObject(o, "moe"));
}
static void moe_mod_destroy(sm_module *m) {
    sm_moe_free(((moe_mod *)m)->moe);
    free(m);
}
static const sm_module_ops kMoeOps = {"moe", moe_mod_declare, moe_mod_reserve, moe_mod_setup, moe_mod_forward,
                                      moe_mod_backward, moe_mod_json, moe_mod_destroy};

sm_module *sm_moe_module(const char *name, const sm_moe_config *cfg, sm_error *err) {
    moe_mod *mm = calloc(1, sizeof *mm);
    if (!mm) {
        sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", name);
        return NULL;
    }
    mm->base.ops = &kMoeOps;
    snprintf(mm->base.name, sizeof mm->base.name, "%s", name ? name : "");
    mm->cfg = *cfg;
    return &mm->base;
}

sm_moe *sm_moe_of(const sm_module *m) { return m && m->ops == &kMoeOps ? ((const moe_mod *)m)->moe : NULL; }

sm_module *sm_moe_from_json(const cJSON *o, const char *name, sm_error *err) {
    sm_moe_config c;
    sm_moe_config_default(&c);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "hidden");
    if (!cJSON_IsNumber(h) || h->valuedouble < 1 || h->valuedouble > 1 << 24) {
        sm_fail(err, SM_ERR_FORMAT, "module '%s': 'hidden' missing or out of range", name);
        return NULL;
    }
    c.H = (int)h->valuedouble;
    if (sm_moe_config_from_json(&c, cJSON_GetObjectItemCaseSensitive(o, "moe"), err) != SM_OK) return NULL;
    return sm_moe_module(name, &c, err);
}
