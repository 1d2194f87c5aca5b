/* The MoE layer (see include/specmoe/moe.h). */
#include "specmoe/nn/moe.h"

#include <cjson/cJSON.h>

#include "specmoe/core/json.h"
#include "specmoe/nn/routers.h"
#include "nn/module_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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
    if (c->depth > 1) cJSON_AddNumberToObject(o, "depth", c->depth); /* absent: the two-layer expert */
}

sm_status sm_moe_config_from_json(sm_moe_config *c, const cJSON *o, sm_error *err) {
    const char *what = "model config";
    char eact[16];
    if (!cJSON_IsObject(o)) return sm_fail(err, SM_ERR_FORMAT, "%s: field 'moe' missing", what);
    sm_status st = sm_router_config_from_json(&c->router, o, what, err);
    if (st == SM_OK) st = sm_json_int(o, "shared", 0, &c->n_shared, what, err);
    if (st == SM_OK) st = sm_json_int(o, "expert_bias", 0, &c->expert_bias, what, err);
    if (st == SM_OK) st = sm_json_str(o, "expert_act", eact, sizeof eact, what, err);
    if (st == SM_OK) st = sm_json_int(o, "depth", 1, &c->depth, what, err);
    if (st == SM_OK && sm_act_parse(eact, &c->act)) st = sm_fail(err, SM_ERR_FORMAT, "%s: unknown activation '%s'", what, eact);
    return st;
}

sm_moe *sm_moe_create(const sm_moe_config *cfg, int d, sm_error *err) { return sm_moe_create_gated(cfg, d, d, err); }

#define MOE_MAX_DEPTH 16

sm_moe *sm_moe_create_gated(const sm_moe_config *cfg, int d, int dg, sm_error *err) {
    if (cfg->depth < 0 || cfg->depth > MOE_MAX_DEPTH) {
        sm_fail(err, SM_ERR_ARG, "moe: expert depth must be in [1, %d] (got %d)", MOE_MAX_DEPTH, cfg->depth);
        return NULL;
    }
    if (cfg->depth > 1 && cfg->n_shared > 0) {
        sm_fail(err, SM_ERR_ARG, "moe: shared experts are two-layer MLPs; they cannot be combined with depth %d",
                cfg->depth);
        return NULL;
    }
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
    m->L = cfg->depth > 1 ? cfg->depth : 1;
    m->dg = dg;
    m->router = sm_router_create(&cfg->router, dg, err);
    if (!m->router) {
        free(m);
        return NULL;
    }
    for (int i = 0; i < (int)SM_LEN(m->ip); i++) m->ip[i] = -1;
    return m;
}

void sm_moe_free(sm_moe *m) {
    if (!m) return;
    sm_router_free(m->router);
    sm_route_free(&m->route);
    free(m->act_block);
    free(m);
}

/* Factory experts: expert e under "<prefix>.experts.<e>", one row of d in, one row of O out, O the
 * same for all (and cfg.out_dim when set); the layer's O becomes theirs. */
#define MOE_FEAT_MAX 64 /* hidden blocks of a factory expert whose features the layer reads */
static sm_status declare_module_experts(sm_moe *m, sm_params *ps, const char *prefix, sm_error *err) {
    for (int e = 0; e < m->E; e++) {
        sm_module *x = m->experts[e];
        char what[32];
        snprintf(what, sizeof what, "experts.%d", e);
        if (sm_param_name(x->name, prefix, what)) return sm_fail(err, SM_ERR_ARG, "%s: name too long", prefix);
        sm_status st = sm_module_declare(x, ps, sm_shape_vec(m->d), err);
        if (st != SM_OK) return st;
        sm_shape o = x->out;
        if (o.rows != 1 || o.h != 1 || o.w != 1)
            return sm_fail(err, SM_ERR_ARG,
                           "%s: an expert must map one row of %d features to one row of features (it gives %d rows of "
                           "%d x %d x %d)", x->name, m->d, o.rows, o.c, o.h, o.w);
        int want = e ? m->O : m->cfg.out_dim;
        if (want > 0 && o.c != want)
            return sm_fail(err, SM_ERR_ARG, "%s: outputs %d features, but %s %d", x->name, o.c,
                           e ? "expert 0 outputs" : "the layer's out_dim is", want);
        m->O = o.c;
    }
    /* m->feat_seq (moe.h): every expert a container of hidden blocks of one width, then its output map */
    int L = sm_seq_count(m->experts[0]) - 1, H = L >= 1 ? sm_shape_width(sm_seq_child(m->experts[0], 0)->out) : 0;
    int ok = L >= 1 && L <= MOE_FEAT_MAX && m->router->ops->kind == SM_ROUTE_SPARSE;
    for (int e = 0; e < m->E && ok; e++) {
        ok = sm_seq_count(m->experts[e]) == L + 1;
        for (int j = 0; j < L && ok; j++) {
            sm_shape o = sm_seq_child(m->experts[e], j)->out;
            ok = o.rows == 1 && o.h == 1 && o.w == 1 && o.c == H;
        }
    }
    m->feat_seq = ok;
    if (ok) m->L = L, m->H = H;
    return SM_OK;
}

sm_status sm_moe_declare(sm_moe *m, sm_params *ps, const char *prefix, sm_error *err) {
    char name[SM_NAME_MAX];
    snprintf(name, sizeof name, "%s.router", prefix);
    sm_status st = m->router->ops->declare(m->router, ps, name, err);
    if (st != SM_OK) return st;
    if (m->experts) return declare_module_experts(m, ps, prefix, err);
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
        if (g == 0 && m->L > 1) { /* deeper experts: (E, L-1, H, H) hidden-to-hidden layers */
            int64_t s_wh[4] = {m->E, m->L - 1, m->H, m->H}, s_bh[3] = {m->E, m->L - 1, m->H};
            snprintf(name, sizeof name, "%s.experts.wh", prefix);
            if ((m->ip[8] = sm_params_add(ps, name, 4, s_wh, SM_INIT_UNIFORM_FANIN, m->H, 0, 0, err)) < 0) return SM_ERR_ARG;
            if (m->cfg.expert_bias) {
                snprintf(name, sizeof name, "%s.experts.bh", prefix);
                if ((m->ip[9] = sm_params_add(ps, name, 3, s_bh, SM_INIT_UNIFORM_FANIN, m->H, 0, SM_PARAM_NO_DECAY, err)) < 0)
                    return SM_ERR_ARG;
            }
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
    bind2(ps, m->ip[8], &m->wh, &m->dwh);
    bind2(ps, m->ip[9], &m->bh, &m->dbh);
    bind2(ps, m->ip[4], &m->sw1, &m->dsw1);
    bind2(ps, m->ip[5], &m->sb1, &m->dsb1);
    bind2(ps, m->ip[6], &m->sw2, &m->dsw2);
    bind2(ps, m->ip[7], &m->sb2, &m->dsb2);
}

/* The activation arrays sm_moe_reserve carves (in its order) for max_T tokens and max_A assignments:
 * one table, so the memory estimate (sm_moe_act_values) counts what the reserve takes. */
#define MOE_N_ACT 14
/* The built-in experts' linear maps at a few dozen rows take the packed small GEMM (linear_small.c)
 * instead of OpenBLAS, whose packing and call overhead dominate there (a PPO minibatch of 64 states
 * over 8 experts, top-2: about 16 rows per expert): the workspace one thread needs for its three
 * shapes at up to max_A rows, and the most rows at which the rule picks a product (*rows). */
static size_t lin_ws_per_thread(const sm_moe *m, int max_A, int *rows) {
    size_t n = 0;
    *rows = 0;
    if (m->experts) return 0;
    const int shapes[3][2] = {{m->d, m->H}, {m->H, m->H}, {m->H, m->O}};
    for (int s = 0; s < 3; s++) {
        if (s == 1 && m->L < 2) continue;
        int r;
        const size_t k = sm_linear_small_ws_upto(max_A, shapes[s][0], shapes[s][1], &r);
        n = k > n ? k : n;
        *rows = r > *rows ? r : *rows;
    }
    if (*rows) { /* the backward's dh = dy W2 always takes the packed product (mlp_expert_backward) */
        const size_t k = sm_linear_small_ws_for(*rows, m->H, m->O, SM_LINEAR_SMALL_DINP);
        n = k > n ? k : n;
    }
    return n;
}
static int lin_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static void act_sizes(const sm_moe *m, int max_T, int max_A, size_t sizes[MOE_N_ACT]) {
    size_t A = (size_t)max_A, T = (size_t)max_T, d = (size_t)m->d, O = (size_t)m->O, H = (size_t)m->H;
    size_t S = (size_t)m->S, dh_rows = A > T ? A : T;
    size_t L = (size_t)m->L;
    /* factory experts keep their own activations (in the module's arena); the layer holds their hidden
     * features, gathered, and the features' extra gradients only when it can read them (feat_seq) */
    const size_t Hf = sm_moe_has_features(m) ? H : 0;
    if (m->experts) H = 0;
    const size_t slot_t = m->router->ops->kind == SM_ROUTE_SOFT ? A * (d > O ? d : O) : 0;
    int rows;
    const size_t lin = lin_ws_per_thread(m, max_A, &rows) * (size_t)lin_threads();
    size_t s[MOE_N_ACT] = {A * d, L * A * H, L * A * Hf, A * O, A * O, A * d, dh_rows * H, S * T * H, S * T * H, T * O,
                           L > 1 ? A * H : 0, L * A * Hf, slot_t, lin};
    memcpy(sizes, s, sizeof s);
}

size_t sm_moe_act_values(const sm_moe *m, int max_T) {
    const sm_router_ops *ops = m->router->ops;
    int max_A = ops->max_assign(m->router, max_T);
    size_t sizes[MOE_N_ACT], n = 0;
    act_sizes(m, max_T, max_A, sizes);
    for (int i = 0; i < MOE_N_ACT; i++) n += sizes[i];
    return n + sm_route_values(ops->kind, max_T, m->E, max_A, ops->max_slots ? ops->max_slots(m->router, max_T) : 0);
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
    size_t sizes[MOE_N_ACT];
    act_sizes(m, max_T, m->max_A, sizes);
    sm_real **ptrs[] = {&m->xg, &m->hpre, &m->h, &m->y, &m->dy, &m->dxg, &m->dh, &m->shpre, &m->sh, &m->sy,
                        &m->dh2, &m->dfeat, &m->slot_t, &m->lin_ws};
    m->lin_stride = lin_ws_per_thread(m, m->max_A, &m->lin_rows);
    m->lin_threads = lin_threads();
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

/* Reports one of an expert's linear maps to the taps: matrix `block` of tensor ip[which] */
static void expert_tap(const sm_moe *m, int which, int block, int a0, const sm_real *in, const sm_real *dout, int n,
                       int fin, int fout) {
    if (!m->taps || !m->taps->expert_linear || m->ip[which] < 0) return;
    m->taps->expert_linear(m->taps, m->tap_ps->p[m->ip[which]].name, block, m->route.token + a0, in, dout, n, fin, fout);
}

/* this thread's small-GEMM workspace for n rows (NULL: OpenBLAS; sm_linear_*_ws pick by shape) */
static sm_real *expert_ws(const sm_moe *m, int n) {
    int t = 0;
#ifdef _OPENMP
    t = omp_get_thread_num();
#endif
    return n <= m->lin_rows && t < m->lin_threads && m->lin_stride ? m->lin_ws + (size_t)t * m->lin_stride : NULL;
}

/* out (n, OC) = in (n, C) @ W^T + b: gemv at one row (an agent acting on one state, as the dense
 * module), else through ws (expert_ws) */
static void expert_linear(sm_real *out, const sm_real *in, const sm_real *W, const sm_real *b, int n, int C, int OC,
                          sm_real *ws) {
    if (n == 1) sm_linear_forward_row(out, in, W, b, C, OC);
    else sm_linear_forward_ws(out, in, W, b, n, C, OC, ws);
}

/* An expert's rows beyond EXPERT_CHUNK (SM_LINEAR_SMALL_CHUNK) run EXPERT_CHUNK at a time, its whole MLP per chunk (forward:
 * every layer of a chunk before the next; backward: every gradient of a chunk, the parameter ones
 * accumulated over the chunks): each chunk takes the packed small GEMM (linear_small.c, up to
 * m->lin_rows rows), and a chunk's hidden activations (128 x 512 floats, 256 KB) stay in L2 from one
 * product to the next. SoftMoE-1 x4's expert sees all 2048 slot rows of a batch of 32 MinAtar frames:
 * through OpenBLAS in one piece its update took 6.95 ms, chunked 5.33 (64 rows: 5.42, 256: 5.82;
 * BENCHMARKS.md, "SoftMoE in the DQN update"). The sums of the parameter gradients are regrouped by
 * chunk; every other value is computed row by row as before. */
enum { EXPERT_CHUNK = SM_LINEAR_SMALL_CHUNK };
static int chunked(const sm_moe *m, int n) { return n > EXPERT_CHUNK && m->lin_rows >= EXPERT_CHUNK; }

/* What the backward reads the activation's derivative from: the pre-activations hpre, or for the
 * ReLU its output h (x > 0 iff relu(x) > 0), whose forward then writes h alone - half the stores of
 * a layer whose product does 16 FMAs per output (an expert's 16 -> 512 map; BENCHMARKS.md, "SoftMoE
 * in the DQN update"). */
static int relu_from_h(const sm_moe *m) { return m->cfg.act == SM_ACT_RELU; }
static const sm_real *pre_act(const sm_moe *m) { return relu_from_h(m) ? m->h : m->hpre; }

/* Routed expert e on its n gathered rows starting at assignment a0: hidden layer j reads
 * layer j-1's activation (layer 0 reads xg) - for L = 1 exactly sm_mlp_forward's sequence. */
static void mlp_expert_forward(sm_moe *m, int e, int a0, int n) {
    const int d = m->d, H = m->H, O = m->O, L = m->L;
    if (chunked(m, n)) {
        for (int c = 0; c < n; c += EXPERT_CHUNK) mlp_expert_forward(m, e, a0 + c, n - c < EXPERT_CHUNK ? n - c : EXPERT_CHUNK);
        return;
    }
    sm_real *ws = expert_ws(m, n);
    const size_t stride = (size_t)m->max_A * H, row = (size_t)a0 * H;
    for (int j = 0; j < L; j++) {
        const sm_real *in = j ? m->h + (j - 1) * stride + row : m->xg + (size_t)a0 * d;
        const sm_real *W = j ? m->wh + (((size_t)e * (L - 1) + j - 1) * H) * H : m->w1 + (size_t)e * H * d;
        const sm_real *b = j ? (m->bh ? m->bh + ((size_t)e * (L - 1) + j - 1) * H : NULL) : (m->b1 ? m->b1 + (size_t)e * H : NULL);
        sm_real *pre = relu_from_h(m) ? NULL : m->hpre + j * stride + row, *h = m->h + j * stride + row;
        if (n == 1) {
            sm_linear_forward_row(pre ? pre : h, in, W, b, j ? H : d, H);
            sm_act_forward(h, pre ? pre : h, (size_t)H, m->cfg.act);
        } else
            sm_linear_forward_act_ws(pre, h, in, W, b, n, j ? H : d, H, ws, m->cfg.act);
    }
    expert_linear(m->y + (size_t)a0 * O, m->h + (L - 1) * stride + row, m->w2 + (size_t)e * O * H,
                  m->b2 ? m->b2 + (size_t)e * O : NULL, n, H, O, ws);
}

/* Its backward from dy: for L = 1 and no extra feature gradient exactly sm_mlp_backward's sequence. */
static void mlp_expert_backward(sm_moe *m, int e, int a0, int n) {
    const int d = m->d, H = m->H, O = m->O, L = m->L;
    if (chunked(m, n)) {
        for (int c = 0; c < n; c += EXPERT_CHUNK) mlp_expert_backward(m, e, a0 + c, n - c < EXPERT_CHUNK ? n - c : EXPERT_CHUNK);
        return;
    }
    sm_real *ws = expert_ws(m, n);
    const size_t stride = (size_t)m->max_A * H, row = (size_t)a0 * H;
    sm_real *dh = m->dh + row, *dh2 = m->dh2 ? m->dh2 + row : NULL;
    const sm_real *W2 = m->w2 + (size_t)e * O * H, *dy = m->dy + (size_t)a0 * O, *hl = m->h + (L - 1) * stride + row;
    /* dh (n,H) = dy (n,O) @ W2 (O,H): the packed product writes it (no zeroing pass; OpenBLAS's
     * beta = 0 took one) - about 5% of SoftMoE-1 x4's update at O = 16, 128-row chunks */
    if (ws) sm_linear_backward_small_ex(dh, NULL, dy, NULL, W2, n, H, O, ws, SM_LINEAR_SET_DINP);
    else sm_gemm(0, 0, n, H, O, 1, dy, O, W2, H, 0, dh, H);
    sm_linear_backward_ws(NULL, m->dw2 + (size_t)e * O * H, m->db2 ? m->db2 + (size_t)e * O : NULL, dy, hl, W2, n, H, O,
                          ws);
    expert_tap(m, 2, e, a0, hl, dy, n, H, O);
    for (int j = L - 1; j >= 0; j--) {
        /* extra gradients on hidden layer j's activations (sm_moe_features_at), before its activation's backward */
        if (m->dfeat_used)
            for (size_t i = 0; i < (size_t)n * H; i++) dh[i] += m->dfeat[j * stride + row + i];
        sm_act_backward_inplace(dh, pre_act(m) + j * stride + row, (size_t)n * H, m->cfg.act);
        if (j == 0) {
            sm_linear_backward_ws(m->dxg + (size_t)a0 * d, m->dw1 + (size_t)e * H * d,
                                  m->db1 ? m->db1 + (size_t)e * H : NULL, dh, m->xg + (size_t)a0 * d,
                                  m->w1 + (size_t)e * H * d, n, d, H, ws);
            expert_tap(m, 0, e, a0, m->xg + (size_t)a0 * d, dh, n, d, H);
        } else {
            size_t k = ((size_t)e * (L - 1) + j - 1);
            memset(dh2, 0, sizeof(sm_real) * (size_t)n * H);
            sm_linear_backward_ws(dh2, m->dwh + k * H * H, m->dbh ? m->dbh + k * H : NULL, dh,
                                  m->h + (j - 1) * stride + row, m->wh + k * H * H, n, H, H, ws);
            expert_tap(m, 8, (int)k, a0, m->h + (j - 1) * stride + row, dh, n, H, H);
            sm_real *t = dh;
            dh = dh2, dh2 = t;
        }
    }
}

/* Factory experts: the expert's own linear taps see its rows n = 0..N-1; they are reported to the
 * caller's expert_linear with the layer's token map of those rows (block 0: the expert's tensors
 * are its own). */
typedef struct {
    sm_taps t;
    sm_taps *outer;
    const int *token; /* (N) the layer's input row of each of the expert's rows */
} expert_taps;
static void expert_taps_linear(sm_taps *t, const char *param, const sm_real *in, const sm_real *dout, int N, int fin,
                               int fout) {
    expert_taps *x = (expert_taps *)t;
    x->outer->expert_linear(x->outer, param, 0, x->token, in, dout, N, fin, fout);
}

/* Factory expert e: its module on its n rows xg (n,d) -> y (n,O), one row per "example"; the
 * backward takes dy (already scaled by the routing weight) and accumulates into dxg and the
 * parameter gradients of the call's view. */
static void module_expert_forward(sm_moe *m, int e, int a0, int n) {
    sm_ctx c = *m->ctx;
    c.taps = NULL;
    sm_module_forward(m->experts[e], m->y + (size_t)a0 * m->O, m->xg + (size_t)a0 * m->d, n, &c);
}
static void module_expert_backward(sm_moe *m, int e, int a0, int n) {
    sm_ctx c = *m->ctx;
    expert_taps t = {{expert_taps_linear, NULL, NULL}, m->taps, m->route.token + a0};
    /* SOFT slot rows mix tokens: there is no token of a row to report, so no taps */
    c.taps = m->taps && m->taps->expert_linear && m->route.kind == SM_ROUTE_SPARSE ? &t.t : NULL;
    sm_real *dx = m->dxg + (size_t)a0 * m->d;
    const sm_real *dy = m->dy + (size_t)a0 * m->O, *x = m->xg + (size_t)a0 * m->d;
    if (!m->dfeat_used) {
        sm_module_backward(m->experts[e], dx, dy, x, n, &c);
        return;
    }
    /* the hidden features' extra gradients (sm_moe_features_at) into the container's children */
    const sm_real *extra[MOE_FEAT_MAX] = {NULL};
    for (int j = 0; j < m->L; j++) extra[j] = m->dfeat + (size_t)j * m->max_A * m->H + (size_t)a0 * m->H;
    sm_seq_backward_extra(m->experts[e], dx, dy, x, n, &c, extra);
}

/* The only expert-specific step of the layer: expert e on its gathered rows [a0, a0+n). */
static void expert_forward(sm_moe *m, int e, int a0, int n) {
    if (m->experts) module_expert_forward(m, e, a0, n);
    else mlp_expert_forward(m, e, a0, n);
}
static void expert_backward(sm_moe *m, int e, int a0, int n) {
    if (m->experts) module_expert_backward(m, e, a0, n);
    else mlp_expert_backward(m, e, a0, n);
}

/* a stochastic factory expert would draw from the call's RNG: then experts run in a fixed order */
static int experts_in_parallel(const sm_moe *m) { return !m->experts || !(m->ctx->train && m->ctx->rng); }

int sm_moe_has_features(const sm_moe *m) { return !m->experts || m->feat_seq; }

const sm_real *sm_moe_features_at(sm_moe *m, int j, sm_real **dfeat) {
    if (!sm_moe_has_features(m) || j < 0 || j >= m->L) {
        if (dfeat) *dfeat = NULL;
        return NULL;
    }
    const size_t off = (size_t)j * m->max_A * m->H;
    for (int e = 0; m->experts && e < m->E; e++) { /* gathered from child j of each container */
        const int a0 = m->route.offset[e], n = m->route.offset[e + 1] - a0;
        if (n > 0) memcpy(m->h + off + (size_t)a0 * m->H, sm_seq_output(m->experts[e], j), sizeof(sm_real) * (size_t)n * m->H);
    }
    if (dfeat) {
        *dfeat = m->dfeat + off;
        m->dfeat_used = 1; /* the backward now adds it in */
    }
    return m->h + off;
}

const sm_real *sm_moe_features(sm_moe *m, sm_real **dfeat) { return sm_moe_features_at(m, m->L - 1, dfeat); }

/* SOFT routes. Group g holds tokens t0 .. t0 + mg - 1 and S = E p slots; slot s = e p + j of group g
 * is row (e G + g) p + j of the experts' inputs xg and outputs y (each expert's rows contiguous, so
 * its MLP runs over all groups in one GEMM). With D_g, C_g the group's (mg, S) dispatch and combine
 * weights (rows of r->dispatch, r->combine), in the forward
 *   dispatch  xg_(g,s) = sum_t D_g[t,s] x_t          combine  out_t = sum_s C_g[t,s] y_(g,s)
 * and in the backward
 *   dy_(g,s) = sum_t C_g[t,s] dout_t                 dC_g[t,s] = <dout_t, y_(g,s)>
 *   dD_g[t,s] = <x_t, dxg_(g,s)>                     dx_t += sum_s D_g[t,s] dxg_(g,s)
 * Per group and expert these are products of a few dozen rows - 16 slots x 64 tokens x 16 wide for
 * a MinAtar frame's PerConv tokens and 4 experts - which sm_gemm_tiny computes without BLAS's
 * per-call cost (a call per group and expert cost more than the arithmetic: BENCHMARKS.md, "SoftMoE
 * in the DQN update"). The inner products (dC, dD) first lay the group's slot rows out as columns
 * (slot_t, width x S), and the scatters copy them into rows there, so that one product covers every
 * expert. Groups write disjoint rows (and use disjoint parts of slot_t), so
 * they run one per thread. */
static size_t slot_row(int s, int p, int G, int g) { return (size_t)((s / p) * G + g) * p + (size_t)(s % p); }

/* Y_(g,e) (p, w) = W[:, e-block]^T (p, mg) X (mg, w) for every expert; W (mg, S) with row stride S */
static void slots_gather(sm_real *Y, const sm_real *W, const sm_real *X, int mg, int E, int w, int p, int G, int g) {
    const int S = E * p;
    for (int e = 0; e < E; e++)
        sm_gemm_tiny(p, w, mg, 1, W + (size_t)e * p, 1, S, X, w, 0, Y + slot_row(e * p, p, G, g) * w, w);
}

/* out (mg, w) += W (mg, S) Y_g (S, w), the group's slot rows copied to Yc (S, w) first (each expert's p
 * rows are contiguous in Y): one product with K = S instead of one per expert with K = p, so out is
 * read and written once, not E times */
static void slots_scatter(sm_real *out, const sm_real *W, const sm_real *Y, sm_real *Yc, int mg, int E, int w, int p,
                          int G, int g) {
    const int S = E * p;
    for (int e = 0; e < E; e++)
        memcpy(Yc + (size_t)e * p * w, Y + slot_row(e * p, p, G, g) * w, sizeof(sm_real) * (size_t)p * w);
    sm_gemm_tiny(mg, w, S, 1, W, S, 1, Yc, w, 1, out, w);
}

/* dW (mg, S) = A (mg, w) Y_g^T, with Y_g^T (w, S) laid out in Yt first */
static void slots_dots(sm_real *dW, const sm_real *A, const sm_real *Y, sm_real *Yt, int mg, int E, int w, int p, int G,
                       int g) {
    const int S = E * p;
    for (int s = 0; s < S; s++) {
        const sm_real *y = Y + slot_row(s, p, G, g) * w;
        for (int i = 0; i < w; i++) Yt[(size_t)i * S + s] = y[i];
    }
    sm_gemm_tiny(mg, S, w, 1, A, w, 1, Yt, S, 0, dW, S);
}

/* One pass over a call's groups (SoftMoE: one observation's tokens each), for sm_par_for: which
 * product, x the input, out the output (or the input gradient), dout the output gradient, T tokens */
typedef enum {
    GROUPS_DISPATCH,          /* xg_g = D_g^T X_g */
    GROUPS_COMBINE,           /* out_g = C_g Y_g */
    GROUPS_COMBINE_BACKWARD,  /* from dout_g: dY_g = C_g^T dout_g, and dC_g */
    GROUPS_DISPATCH_BACKWARD  /* from dxg: dD_g, and dx_g += D_g dxg_g */
} group_op;

typedef struct {
    sm_moe *m;
    group_op op;
    sm_real *out;
    const sm_real *x, *dout;
    int T;
} group_job;

static void soft_groups(void *arg, long g0, long g1) {
    const group_job *j = arg;
    sm_moe *m = j->m;
    sm_route *r = &m->route;
    const int d = m->d, O = m->O, E = m->E, p = r->slots, S = E * p, G = r->groups;
    for (long gl = g0; gl < g1; gl++) {
        const int g = (int)gl, t0 = g * r->group_size, mg = j->T - t0 < r->group_size ? j->T - t0 : r->group_size;
        const size_t ro = (size_t)t0 * S; /* the group's rows of the dispatch and combine weights */
        switch (j->op) {
        case GROUPS_DISPATCH:
            slots_gather(m->xg, r->dispatch + ro, j->x + (size_t)t0 * d, mg, E, d, p, G, g);
            break;
        case GROUPS_COMBINE:
            slots_scatter(j->out + (size_t)t0 * O, r->combine + ro, m->y, m->slot_t + (size_t)g * S * O, mg, E, O, p, G, g);
            break;
        case GROUPS_COMBINE_BACKWARD:
            slots_gather(m->dy, r->combine + ro, j->dout + (size_t)t0 * O, mg, E, O, p, G, g);
            slots_dots(r->dcombine + ro, j->dout + (size_t)t0 * O, m->y, m->slot_t + (size_t)g * S * O, mg, E, O, p, G,
                       g);
            break;
        case GROUPS_DISPATCH_BACKWARD:
            slots_dots(r->ddispatch + ro, j->x + (size_t)t0 * d, m->dxg, m->slot_t + (size_t)g * S * d, mg, E, d, p, G, g);
            slots_scatter(j->out + (size_t)t0 * d, r->dispatch + ro, m->dxg, m->slot_t + (size_t)g * S * d, mg, E, d, p, G, g);
            break;
        }
    }
}

/* experts [e0, e1), each on its rows of the layer (assignments offset[e] .. offset[e + 1]), forward
 * or backward */
typedef struct {
    sm_moe *m;
    int backward;
} experts_job;

static void experts_run(void *arg, long e0, long e1) {
    const experts_job *j = arg;
    for (long e = e0; e < e1; e++) {
        const int a0 = j->m->route.offset[e], n = j->m->route.offset[e + 1] - a0;
        if (n == 0) continue;
        if (j->backward) expert_backward(j->m, (int)e, a0, n);
        else expert_forward(j->m, (int)e, a0, n);
    }
}

void sm_moe_forward(sm_moe *m, sm_real *out, const sm_real *x, int T, sm_rng *rng, int train) {
    sm_moe_forward_gated(m, out, x, x, T, rng, train);
}

void sm_moe_forward_gated(sm_moe *m, sm_real *out, const sm_real *x, const sm_real *gx, int T, sm_rng *rng, int train) {
    const int d = m->d, H = m->H, E = m->E, O = m->O;
    sm_route *r = &m->route;
    m->router->ops->forward(m->router, r, gx, T, rng, train);
    memset(r->dprobs, 0, sizeof(sm_real) * (size_t)T * E);
    if (m->dfeat_used) { /* a request of sm_moe_features_at lasts until the next forward */
        memset(m->dfeat, 0, sizeof(sm_real) * (size_t)m->L * m->max_A * H);
        m->dfeat_used = 0;
    }
    const int A = r->n_assign;
    /* penalties may add to the combine weights' gradient before the backward adds the output's */
    if (r->kind == SM_ROUTE_SPARSE) memset(r->dweight, 0, sizeof(sm_real) * (size_t)A);
    const size_t sdw = (size_t)T * r->slots * E; /* the soft products' size per output width */
    if (r->kind == SM_ROUTE_SOFT)
        sm_par_for(sm_par_threads(sdw * d), r->groups, soft_groups, &(group_job){m, GROUPS_DISPATCH, NULL, x, NULL, T});
    else
        for (int a = 0; a < A; a++) memcpy(m->xg + (size_t)a * d, x + (size_t)r->token[a] * d, sizeof(sm_real) * d);
    /* experts are independent: one per thread (BLAS runs single-threaded inside the region) */
    sm_par_each(experts_in_parallel(m) ? 0 : 1, E, experts_run, &(experts_job){m, 0});
    memset(out, 0, sizeof(sm_real) * (size_t)T * O);
    if (r->kind == SM_ROUTE_SOFT) {
        sm_par_for(sm_par_threads(sdw * O), r->groups, soft_groups, &(group_job){m, GROUPS_COMBINE, out, NULL, NULL, T});
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
    sm_moe_backward_gated(m, dx, dx, dout, x, x, T);
}

void sm_moe_backward_gated(sm_moe *m, sm_real *dx, sm_real *dgx, const sm_real *dout, const sm_real *x, const sm_real *gx,
                           int T) {
    const int d = m->d, H = m->H, E = m->E, O = m->O;
    sm_route *r = &m->route;
    const int A = r->n_assign;
    const size_t sdw = (size_t)T * r->slots * E; /* the soft products' size per output width */
    if (r->kind == SM_ROUTE_SOFT) /* out_g = C_g Y_g */
        sm_par_for(sm_par_threads(sdw * O), r->groups, soft_groups,
                   &(group_job){m, GROUPS_COMBINE_BACKWARD, NULL, NULL, dout, T});
    /* combine: out_t += w_a y_a  =>  dw_a = <dout_t, y_a>,  dy_a = w_a dout_t */
    for (int a = 0; a < A && r->kind == SM_ROUTE_SPARSE; a++) {
        const sm_real *g = dout + (size_t)r->token[a] * O, *y = m->y + (size_t)a * O;
        sm_real *dy = m->dy + (size_t)a * O;
        sm_real w = r->weight[a], dot = 0;
        for (int i = 0; i < O; i++) {
            dot += g[i] * y[i];
            dy[i] = w * g[i];
        }
        r->dweight[a] += dot;
    }
    memset(m->dxg, 0, sizeof(sm_real) * (size_t)A * d);
    /* taps see one expert at a time, from one thread */
    sm_par_each(m->taps ? 1 : 0, E, experts_run, &(experts_job){m, 1});
    if (r->kind == SM_ROUTE_SOFT) { /* xg_g = D_g^T X_g */
        sm_par_for(sm_par_threads(sdw * d), r->groups, soft_groups,
                   &(group_job){m, GROUPS_DISPATCH_BACKWARD, dx, x, NULL, T});
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
    m->router->ops->backward(m->router, dgx, r, gx, T);
}

/* ---- the MoE layer as a module (include/specmoe/nn/module.h) ---------------------------------- */

typedef struct {
    sm_module base;
    sm_moe_config cfg;
    sm_moe *moe;
    sm_module *gate;  /* optional gate network: the router reads its output */
    sm_module **experts; /* (E) factory experts (sm_moe_module_experts), or NULL: the built-in MLPs */
    sm_real *scratch; /* (N, d) input gradient when the caller needs none: router and experts write one */
    sm_real *g, *dg;  /* (N, dg) the gate network's output and its gradient */
    sm_moe_exec *exec; /* an outside executor (sm_moe_module_set_exec), or NULL */
} moe_mod;

static sm_status moe_mod_declare(sm_module *m, sm_params *ps, sm_error *err) {
    moe_mod *mm = (moe_mod *)m;
    int d = sm_shape_width(m->in), dg = d;
    if (mm->gate) {
        if (sm_param_name(mm->gate->name, m->name, "gate")) return sm_fail(err, SM_ERR_ARG, "%s: name too long", m->name);
        sm_status st = sm_module_declare(mm->gate, ps, m->in, err);
        if (st != SM_OK) return st;
        if (mm->gate->out.rows != m->in.rows)
            return sm_fail(err, SM_ERR_ARG, "%s: the gate network must keep the row count (%d rows in, %d out)", m->name,
                           m->in.rows, mm->gate->out.rows);
        dg = sm_shape_width(mm->gate->out);
    }
    /* routing over tokens stays within an example (one observation's tokens, "Don't Flatten, Tokenize!"
     * Sec. 3): R > 1 rows per example set the router's group (sm_router_ops.group_key) to R unless
     * one was given - SoftMoE mixes each observation's tokens into its slots (p = ceil(R / E) per
     * expert by default), expert choice picks within each observation, top-k's capacity is per
     * observation */
    const sm_router_ops *rops = sm_router_find(mm->cfg.router.name);
    const sm_router_opt *go = rops && rops->group_key ? sm_router_find_opt(rops, rops->group_key) : NULL;
    if (m->in.rows > 1 && go && *(const int *)((const char *)&mm->cfg.router + go->offset) == 0) {
        char rows[16];
        snprintf(rows, sizeof rows, "%d", m->in.rows);
        (void)sm_opt_set(go, &mm->cfg.router, rows);
    }
    if (!(mm->moe = sm_moe_create_gated(&mm->cfg, d, dg, err))) return SM_ERR_ARG;
    mm->moe->experts = mm->experts;
    sm_status st = sm_moe_declare(mm->moe, ps, m->name, err);
    m->out = sm_shape_vec(mm->moe->O); /* known after declare for factory experts */
    m->out.rows = m->in.rows;
    return st;
}
/* The most rows one factory expert can get from max_T tokens: a SPARSE route gives an expert each
 * token at most once (and no more rows than assignments); a SOFT route gives each expert the same
 * number of slot rows. */
static int module_expert_rows(const sm_moe *moe, int max_T) {
    int A = moe->router->ops->max_assign(moe->router, max_T);
    if (moe->router->ops->kind == SM_ROUTE_SOFT) return A / moe->E;
    return A < max_T ? A : max_T;
}
static void moe_mod_reserve(sm_module *m, int B, sm_arena *a) {
    moe_mod *mm = (moe_mod *)m;
    mm->scratch = sm_arena_take(a, (size_t)B * sm_shape_numel(m->in));
    if (mm->gate) {
        mm->gate->max_B = B;
        mm->gate->ops->reserve(mm->gate, B, a);
        mm->g = sm_arena_take(a, (size_t)B * sm_shape_numel(mm->gate->out));
        mm->dg = sm_arena_take(a, (size_t)B * sm_shape_numel(mm->gate->out));
    }
    if (mm->experts) {
        int rows = module_expert_rows(mm->moe, B * m->in.rows);
        mm->moe->expert_rows = rows;
        for (int e = 0; e < mm->moe->E; e++) {
            mm->experts[e]->max_B = rows;
            mm->experts[e]->ops->reserve(mm->experts[e], rows, a);
        }
    }
}
static sm_status moe_mod_setup(sm_module *m, int B, sm_error *err) {
    moe_mod *mm = (moe_mod *)m;
    if (mm->gate && mm->gate->ops->setup) {
        sm_status st = mm->gate->ops->setup(mm->gate, B, err);
        if (st != SM_OK) return st;
    }
    for (int e = 0; mm->experts && e < mm->moe->E; e++)
        if (mm->experts[e]->ops->setup) {
            sm_status st = mm->experts[e]->ops->setup(mm->experts[e], mm->moe->expert_rows, err);
            if (st != SM_OK) return st;
        }
    return sm_moe_reserve(mm->moe, B * m->in.rows, err);
}
/* parameters are bound at every call: the view (and so the gradient destination) is the caller's */
static void moe_mod_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    moe_mod *mm = (moe_mod *)m;
    if (mm->exec) {
        mm->exec->forward(mm->exec, mm->moe, out, in, B * m->in.rows, ctx->pv, ctx->rng, ctx->train);
        return;
    }
    sm_moe_bind(mm->moe, ctx->pv);
    mm->moe->ctx = ctx;
    if (mm->gate) sm_module_forward(mm->gate, mm->g, in, B, ctx);
    sm_moe_forward_gated(mm->moe, out, in, mm->gate ? mm->g : in, B * m->in.rows, ctx->rng, ctx->train);
    mm->moe->ctx = NULL;
}
static void moe_mod_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    moe_mod *mm = (moe_mod *)m;
    int N = B * m->in.rows;
    sm_real *dx = din;
    if (!dx) memset(dx = mm->scratch, 0, sizeof(sm_real) * (size_t)N * mm->moe->d);
    if (mm->exec) {
        mm->exec->backward(mm->exec, mm->moe, dx, dout, in, N, ctx->pv);
        return;
    }
    sm_moe_bind(mm->moe, ctx->pv);
    mm->moe->taps = ctx->taps, mm->moe->tap_ps = ctx->pv, mm->moe->ctx = ctx;
    if (!mm->gate) {
        sm_moe_backward(mm->moe, dx, dout, in, N);
    } else {
        memset(mm->dg, 0, sizeof(sm_real) * (size_t)N * mm->moe->dg);
        sm_moe_backward_gated(mm->moe, dx, mm->dg, dout, in, mm->g, N);
        sm_module_backward(mm->gate, dx, mm->dg, in, B, ctx);
    }
    mm->moe->taps = NULL, mm->moe->ctx = NULL;
}

/* Names under prefix (the ones a parent gave: "<prefix>" and "<prefix>.<...>") removed from a
 * module description, so that it describes the module wherever it is declared. */
static void strip_names(cJSON *o, const char *prefix) {
    size_t n = strlen(prefix);
    cJSON *nm = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "name") : NULL;
    if (cJSON_IsString(nm) && n && !strncmp(nm->valuestring, prefix, n) &&
        (nm->valuestring[n] == '\0' || nm->valuestring[n] == '.'))
        cJSON_DeleteItemFromObjectCaseSensitive(o, "name");
    for (cJSON *c = o ? o->child : NULL; c; c = c->next) strip_names(c, prefix);
}
static cJSON *expert_json(const sm_module *x) {
    cJSON *o = sm_module_json_object(x);
    strip_names(o, x->name);
    return o;
}
static void moe_mod_json(const sm_module *m, cJSON *o) {
    const moe_mod *mm = (const moe_mod *)m;
    cJSON_AddNumberToObject(o, "hidden", mm->cfg.H);
    sm_moe_config_to_json(&mm->cfg, cJSON_AddObjectToObject(o, "moe"));
    if (mm->gate) cJSON_AddItemToObject(o, "gate", sm_module_json_object(mm->gate));
    if (!mm->experts) return;
    /* factory experts: expert 0 describes them all - unless they differ, which is said */
    cJSON *x0 = expert_json(mm->experts[0]);
    int alike = 1;
    for (int e = 1; e < mm->cfg.router.E && alike; e++) {
        cJSON *xe = expert_json(mm->experts[e]);
        alike = cJSON_Compare(x0, xe, 1);
        cJSON_Delete(xe);
    }
    cJSON_AddItemToObject(o, "expert", x0);
    if (!alike) cJSON_AddFalseToObject(o, "experts_alike");
}
static void free_experts(sm_module **experts, int n) {
    for (int e = 0; experts && e < n; e++)
        if (experts[e]) experts[e]->ops->destroy(experts[e]); /* their activations live in the owner's arena */
    free(experts);
}
static void moe_mod_destroy(sm_module *m) {
    moe_mod *mm = (moe_mod *)m;
    sm_moe_free(mm->moe);
    if (mm->gate) mm->gate->ops->destroy(mm->gate); /* its activations live in the owner's arena */
    free_experts(mm->experts, mm->cfg.router.E);
    free(m);
}
/* Nominal multiply-adds per example (sm_module_macs): the gate network; the router's logits (E per
 * token, dg wide; a SOFT router's m x S logits plus its dispatch (S x m x d) and combine (m x S x O)
 * products); the experts on every assignment the router makes for one example's rows (token choice:
 * k per token; SoftMoE: every slot) and the shared experts on every row. */
static double moe_mod_macs(const sm_module *m) {
    const moe_mod *mm = (const moe_mod *)m;
    const sm_moe *x = mm->moe;
    const int R = m->in.rows;
    const sm_router_ops *ro = x->router->ops;
    const double A = ro->max_assign(x->router, R);
    double expert = (double)x->d * x->H + (double)(x->L > 1 ? x->L - 1 : 0) * x->H * x->H + (double)x->H * x->O;
    if (mm->experts) expert = sm_module_macs(mm->experts[0]);
    double router = ro->kind == SM_ROUTE_SOFT ? A * R * ((double)x->dg + x->d + x->O) : (double)R * x->E * x->dg;
    return sm_module_macs(mm->gate) + router + A * expert + (double)R * x->S * ((double)x->d * x->H + (double)x->H * x->O);
}
static const sm_module_ops kMoeOps = {"moe", moe_mod_declare, moe_mod_reserve, moe_mod_setup, moe_mod_forward,
                                      moe_mod_backward, moe_mod_json, moe_mod_destroy, moe_mod_macs};

sm_module *sm_moe_module_gated(const char *name, const sm_moe_config *cfg, sm_module *gate, sm_error *err) {
    moe_mod *mm = calloc(1, sizeof *mm);
    if (!mm) {
        if (gate) sm_module_free(gate);
        sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", name);
        return NULL;
    }
    mm->base.ops = &kMoeOps;
    snprintf(mm->base.name, sizeof mm->base.name, "%s", name ? name : "");
    mm->cfg = *cfg;
    mm->gate = gate;
    return &mm->base;
}

sm_module *sm_moe_module(const char *name, const sm_moe_config *cfg, sm_error *err) {
    return sm_moe_module_gated(name, cfg, NULL, err);
}

sm_module *sm_moe_module_experts(const char *name, const sm_moe_config *cfg, sm_expert_factory make, void *user,
                                 sm_module *gate, sm_error *err) {
    const int E = cfg->router.E;
    const char *why = !make ? "no expert factory given"
                      : E < 1 || E > 1 << 16 ? "the router's expert count must be in [1, 65536]"
                      : cfg->n_shared > 0 ? "shared experts are built-in MLPs only; set n_shared = 0 with factory experts"
                                          : NULL;
    sm_module **experts = why ? NULL : calloc((size_t)E, sizeof *experts);
    if (why || !experts) {
        if (gate) sm_module_free(gate);
        sm_fail(err, why ? SM_ERR_ARG : SM_ERR_NOMEM, "%s: %s", name ? name : "moe", why ? why : "out of memory");
        return NULL;
    }
    for (int e = 0; e < E; e++)
        if (!(experts[e] = make(user, e, err))) {
            free_experts(experts, E);
            if (gate) sm_module_free(gate);
            return NULL;
        }
    sm_module *m = sm_moe_module_gated(name, cfg, gate, err);
    if (!m) free_experts(experts, E);
    else ((moe_mod *)m)->experts = experts;
    return m;
}

sm_moe *sm_moe_of(const sm_module *m) { return m && m->ops == &kMoeOps ? ((const moe_mod *)m)->moe : NULL; }

const sm_real *sm_moe_gate_out(const sm_module *m, int *dg) {
    const moe_mod *mm = m && m->ops == &kMoeOps ? (const moe_mod *)m : NULL;
    if (!mm || !mm->gate) return NULL;
    if (dg) *dg = mm->moe->dg;
    return mm->g;
}

sm_status sm_moe_module_set_exec(sm_module *m, sm_moe_exec *x, sm_error *err) {
    if (!m || m->ops != &kMoeOps) return sm_fail(err, SM_ERR_ARG, "%s: not an MoE module", m ? m->name : "(null)");
    moe_mod *mm = (moe_mod *)m;
    if (x && (mm->gate || mm->experts))
        return sm_fail(err, SM_ERR_ARG, "%s: an MoE layer with a gate network or factory experts runs its own experts", m->name);
    mm->exec = x;
    return SM_OK;
}

/* factory of sm_moe_from_json: every expert from the one description */
static sm_module *expert_from_json(void *user, int e, sm_error *err) {
    (void)e;
    return sm_module_from_json_object(user, err);
}

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
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "expert");
    if (x && !cJSON_IsObject(x)) {
        sm_fail(err, SM_ERR_FORMAT, "module '%s': 'expert' must be a module description", name);
        return NULL;
    }
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "experts_alike"))) {
        sm_fail(err, SM_ERR_FORMAT,
                "module '%s': its experts were not all alike and the description holds expert 0's only; build the "
                "layer with its factory (sm_moe_module_experts) instead", name);
        return NULL;
    }
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "gate");
    sm_module *gate = NULL;
    if (g && !(gate = sm_module_from_json_object(g, err))) return NULL;
    if (x) return sm_moe_module_experts(name, &c, expert_from_json, (void *)x, gate, err);
    return sm_moe_module_gated(name, &c, gate, err);
}
