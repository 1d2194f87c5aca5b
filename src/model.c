/* Model: layer stack, one parameter block, one activation arena (see include/specmoe/model.h). */
#include "specmoe/model.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sm_model_config_default(sm_model_config *c) {
    memset(c, 0, sizeof *c);
    c->in_dim = 784;
    c->n_classes = 10;
    c->act = SM_ACT_RELU;
    sm_moe_config_default(&c->moe);
    sm_error e;
    sm_model_parse_arch(c, "dense:256,moe:256", &e);
}

static const char *kind_name(sm_layer_kind k) {
    return k == SM_LAYER_DENSE ? "dense" : k == SM_LAYER_FFN ? "ffn" : "moe";
}

sm_status sm_model_parse_arch(sm_model_config *c, const char *arch, sm_error *err) {
    char buf[512];
    if (strlen(arch) >= sizeof buf) return sm_fail(err, SM_ERR_ARG, "--arch: too long");
    strcpy(buf, arch);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == SM_MAX_LAYERS) return sm_fail(err, SM_ERR_ARG, "--arch: more than %d layers", SM_MAX_LAYERS);
        char *colon = strchr(tok, ':');
        if (!colon) return sm_fail(err, SM_ERR_ARG, "--arch: '%s' is not KIND:WIDTH (dense|ffn|moe)", tok);
        *colon = 0;
        sm_layer_spec *s = &c->layers[n];
        if (strcmp(tok, "dense") == 0) s->kind = SM_LAYER_DENSE;
        else if (strcmp(tok, "ffn") == 0) s->kind = SM_LAYER_FFN;
        else if (strcmp(tok, "moe") == 0) s->kind = SM_LAYER_MOE;
        else return sm_fail(err, SM_ERR_ARG, "--arch: unknown layer kind '%s' (dense|ffn|moe)", tok);
        char *end;
        long w = strtol(colon + 1, &end, 10);
        if (*end || w < 1 || w > 1 << 20)
            return sm_fail(err, SM_ERR_ARG, "--arch: bad width '%s' for layer %d", colon + 1, n);
        s->width = (int)w;
        n++;
    }
    if (n == 0) return sm_fail(err, SM_ERR_ARG, "--arch: no layers");
    c->n_layers = n;
    return SM_OK;
}

void sm_model_format_arch(const sm_model_config *c, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n_layers && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s:%d", i ? "," : "", kind_name(c->layers[i].kind),
                                 c->layers[i].width);
}

char *sm_model_config_to_json(const sm_model_config *c) {
    char arch[512];
    sm_model_format_arch(c, arch, sizeof arch);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "in_dim", c->in_dim);
    cJSON_AddNumberToObject(o, "n_classes", c->n_classes);
    cJSON_AddStringToObject(o, "arch", arch);
    cJSON_AddStringToObject(o, "act", sm_act_name(c->act));
    cJSON_AddNumberToObject(o, "residual", c->residual);
    cJSON *m = cJSON_AddObjectToObject(o, "moe");
    const sm_router_config *r = &c->moe.router;
    cJSON_AddStringToObject(m, "router", r->name);
    cJSON_AddNumberToObject(m, "experts", r->E);
    cJSON_AddNumberToObject(m, "topk", r->k);
    cJSON_AddNumberToObject(m, "temperature", r->temperature);
    cJSON_AddNumberToObject(m, "noisy", r->noisy);
    cJSON_AddNumberToObject(m, "renorm", r->renorm);
    cJSON_AddNumberToObject(m, "capacity", r->capacity);
    cJSON_AddNumberToObject(m, "shared", c->moe.n_shared);
    cJSON_AddNumberToObject(m, "expert_bias", c->moe.expert_bias);
    cJSON_AddStringToObject(m, "expert_act", sm_act_name(c->moe.act));
    cJSON_AddNumberToObject(m, "balance", r->balance_coef);
    cJSON_AddNumberToObject(m, "zloss", r->zloss_coef);
    cJSON_AddNumberToObject(m, "kappa_init", r->kappa_init);
    cJSON_AddNumberToObject(m, "alpha", r->alpha);
    cJSON_AddNumberToObject(m, "kr", r->kr);
    cJSON_AddNumberToObject(m, "amortize", r->amortize);
    cJSON_AddNumberToObject(m, "amort_hidden", r->amort_hidden);
    cJSON_AddNumberToObject(m, "subspace_beta", r->subspace_beta);
    cJSON_AddNumberToObject(m, "rho0", r->rho0);
    cJSON_AddNumberToObject(m, "pairs", r->pairs);
    cJSON_AddNumberToObject(m, "slots", r->slots);
    cJSON_AddNumberToObject(m, "soft_group", r->soft_group);
    cJSON_AddNumberToObject(m, "soft_norm", r->soft_norm);
    cJSON_AddNumberToObject(m, "seed", (double)r->seed);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static sm_status json_num(const cJSON *o, const char *key, double *out, sm_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) return sm_fail(err, SM_ERR_FORMAT, "model config: field '%s' missing or not a number", key);
    *out = v->valuedouble;
    return SM_OK;
}

static sm_status json_int(const cJSON *o, const char *key, int *out, sm_error *err) {
    double d = 0;
    sm_status st = json_num(o, key, &d, err);
    if (st != SM_OK) return st;
    if (d != (double)(int)d) return sm_fail(err, SM_ERR_FORMAT, "model config: field '%s' is not an integer", key);
    *out = (int)d;
    return SM_OK;
}

static sm_status json_opt_num(const cJSON *o, const char *key, double *out, sm_error *err) {
    return cJSON_GetObjectItemCaseSensitive(o, key) ? json_num(o, key, out, err) : SM_OK;
}

static sm_status json_opt_int(const cJSON *o, const char *key, int *out, sm_error *err) {
    return cJSON_GetObjectItemCaseSensitive(o, key) ? json_int(o, key, out, err) : SM_OK;
}

static sm_status json_str(const cJSON *o, const char *key, char *out, size_t n, sm_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n)
        return sm_fail(err, SM_ERR_FORMAT, "model config: field '%s' missing or not a short string", key);
    strcpy(out, v->valuestring);
    return SM_OK;
}

sm_status sm_model_config_from_json(sm_model_config *c, const char *json, sm_error *err) {
    sm_model_config_default(c);
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return sm_fail(err, SM_ERR_FORMAT, "model config: not a JSON object");
    }
    char arch[512], act[16], eact[16];
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "moe");
    sm_router_config *r = &c->moe.router;
    sm_status st = SM_OK;
    if (!cJSON_IsObject(m)) st = sm_fail(err, SM_ERR_FORMAT, "model config: field 'moe' missing");
    if (st == SM_OK) st = json_int(o, "in_dim", &c->in_dim, err);
    if (st == SM_OK) st = json_int(o, "n_classes", &c->n_classes, err);
    if (st == SM_OK) st = json_str(o, "arch", arch, sizeof arch, err);
    if (st == SM_OK) st = json_str(o, "act", act, sizeof act, err);
    if (st == SM_OK) st = json_int(o, "residual", &c->residual, err);
    if (st == SM_OK) st = json_str(m, "router", r->name, sizeof r->name, err);
    if (st == SM_OK) st = json_int(m, "experts", &r->E, err);
    if (st == SM_OK) st = json_int(m, "topk", &r->k, err);
    if (st == SM_OK) st = json_num(m, "temperature", &r->temperature, err);
    if (st == SM_OK) st = json_int(m, "noisy", &r->noisy, err);
    if (st == SM_OK) st = json_int(m, "renorm", &r->renorm, err);
    if (st == SM_OK) st = json_num(m, "capacity", &r->capacity, err);
    if (st == SM_OK) st = json_int(m, "shared", &c->moe.n_shared, err);
    if (st == SM_OK) st = json_int(m, "expert_bias", &c->moe.expert_bias, err);
    if (st == SM_OK) st = json_str(m, "expert_act", eact, sizeof eact, err);
    /* router options added after the first checkpoints: optional, defaults when absent */
    double seed = (double)r->seed;
    if (st == SM_OK) st = json_opt_num(m, "balance", &r->balance_coef, err);
    if (st == SM_OK) st = json_opt_num(m, "zloss", &r->zloss_coef, err);
    if (st == SM_OK) st = json_opt_num(m, "kappa_init", &r->kappa_init, err);
    if (st == SM_OK) st = json_opt_num(m, "alpha", &r->alpha, err);
    if (st == SM_OK) st = json_opt_int(m, "kr", &r->kr, err);
    if (st == SM_OK) st = json_opt_int(m, "amortize", &r->amortize, err);
    if (st == SM_OK) st = json_opt_int(m, "amort_hidden", &r->amort_hidden, err);
    if (st == SM_OK) st = json_opt_num(m, "subspace_beta", &r->subspace_beta, err);
    if (st == SM_OK) st = json_opt_num(m, "rho0", &r->rho0, err);
    if (st == SM_OK) st = json_opt_int(m, "pairs", &r->pairs, err);
    if (st == SM_OK) st = json_opt_int(m, "slots", &r->slots, err);
    if (st == SM_OK) st = json_opt_int(m, "soft_group", &r->soft_group, err);
    if (st == SM_OK) st = json_opt_int(m, "soft_norm", &r->soft_norm, err);
    if (st == SM_OK) st = json_opt_num(m, "seed", &seed, err);
    r->seed = (uint64_t)seed;
    cJSON_Delete(o);
    if (st != SM_OK) return st;
    if (sm_act_parse(act, &c->act) || sm_act_parse(eact, &c->moe.act))
        return sm_fail(err, SM_ERR_FORMAT, "model config: unknown activation '%s'/'%s'", act, eact);
    return sm_model_parse_arch(c, arch, err);
}

/* ---------------------------------------------------------------------------------------------- */

static int add_linear(sm_params *ps, const char *prefix, const char *wname, const char *bname, int out, int in,
                      int *iw, int *ib, sm_error *err) {
    char name[SM_NAME_MAX];
    int64_t sw[2] = {out, in}, sb[1] = {out};
    snprintf(name, sizeof name, "%s.%s", prefix, wname);
    if ((*iw = sm_params_add(ps, name, 2, sw, SM_INIT_UNIFORM_FANIN, in, 0, 0, err)) < 0) return -1;
    snprintf(name, sizeof name, "%s.%s", prefix, bname);
    if ((*ib = sm_params_add(ps, name, 1, sb, SM_INIT_UNIFORM_FANIN, in, 0, SM_PARAM_NO_DECAY, err)) < 0) return -1;
    return 0;
}

sm_model *sm_model_create(const sm_model_config *cfg, int max_T, sm_rng *rng, sm_error *err) {
    if (cfg->in_dim < 1 || cfg->n_classes < 2 || cfg->n_layers < 0 || cfg->n_layers > SM_MAX_LAYERS || max_T < 1) {
        sm_fail(err, SM_ERR_ARG, "model: bad dimensions (in %d, classes %d, layers %d, batch %d)", cfg->in_dim,
                cfg->n_classes, cfg->n_layers, max_T);
        return NULL;
    }
    sm_model *m = calloc(1, sizeof *m);
    if (!m) {
        sm_fail(err, SM_ERR_NOMEM, "model: out of memory");
        return NULL;
    }
    m->cfg = *cfg;
    m->max_T = max_T;
    m->n_layers = cfg->n_layers;
    sm_params_init_table(&m->params);
    sm_params *ps = &m->params;
    int width = cfg->in_dim, maxw = cfg->in_dim;
    char prefix[SM_NAME_MAX];
    for (int i = 0; i < cfg->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        L->kind = cfg->layers[i].kind;
        L->in = width;
        snprintf(prefix, sizeof prefix, "layers.%d", i);
        for (int j = 0; j < 4; j++) L->ip[j] = -1;
        if (L->kind == SM_LAYER_DENSE) {
            L->out = cfg->layers[i].width;
            if (add_linear(ps, prefix, "weight", "bias", L->out, L->in, &L->ip[0], &L->ip[1], err)) goto fail;
        } else if (L->kind == SM_LAYER_FFN) {
            L->out = width;
            L->hidden = cfg->layers[i].width;
            if (add_linear(ps, prefix, "w1", "b1", L->hidden, L->in, &L->ip[0], &L->ip[1], err) ||
                add_linear(ps, prefix, "w2", "b2", L->out, L->hidden, &L->ip[2], &L->ip[3], err))
                goto fail;
        } else {
            L->out = width;
            L->hidden = cfg->layers[i].width;
            sm_moe_config mc = cfg->moe;
            mc.H = L->hidden;
            L->moe = sm_moe_create(&mc, width, err);
            if (!L->moe) goto fail;
            if (sm_moe_declare(L->moe, ps, prefix, err) != SM_OK) goto fail;
        }
        width = L->out;
        if (width > maxw) maxw = width;
        if (L->hidden > maxw) maxw = L->hidden;
    }
    if (add_linear(ps, "head", "weight", "bias", cfg->n_classes, width, &m->ip_head[0], &m->ip_head[1], err)) goto fail;
    if (sm_params_alloc(ps, err) != SM_OK) goto fail;
    if (rng) sm_params_initialize(ps, rng);

    /* activation arena: sizes first, then one allocation carved in the same order */
    size_t T = (size_t)max_T, V = (size_t)cfg->n_classes, total = 0;
    total += T * (size_t)cfg->in_dim + 3 * T * V + T + T * (size_t)maxw;
    for (int i = 0; i < m->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        size_t pre = L->kind == SM_LAYER_DENSE ? (size_t)L->out : L->kind == SM_LAYER_FFN ? (size_t)L->hidden : 0;
        size_t hid = L->kind == SM_LAYER_FFN ? (size_t)L->hidden : 0;
        total += T * (pre + hid + 2 * (size_t)L->out);
    }
    m->arena = malloc(total * sizeof(sm_real));
    if (!m->arena) {
        sm_fail(err, SM_ERR_NOMEM, "model: cannot allocate %zu MiB of activations", total * sizeof(sm_real) >> 20);
        goto fail;
    }
    sm_real *p = m->arena;
#define CARVE(ptr, n) (ptr = p, p += (n))
    CARVE(m->input, T * (size_t)cfg->in_dim);
    CARVE(m->logits, T * V);
    CARVE(m->probs, T * V);
    CARVE(m->dlogits, T * V);
    CARVE(m->losses, T);
    CARVE(m->scratch, T * (size_t)maxw);
    for (int i = 0; i < m->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        size_t pre = L->kind == SM_LAYER_DENSE ? (size_t)L->out : L->kind == SM_LAYER_FFN ? (size_t)L->hidden : 0;
        size_t hid = L->kind == SM_LAYER_FFN ? (size_t)L->hidden : 0;
        CARVE(L->pre, T * pre);
        CARVE(L->hid, T * hid);
        CARVE(L->out_act, T * (size_t)L->out);
        CARVE(L->dout, T * (size_t)L->out);
        if (L->moe) {
            sm_moe_bind(L->moe, ps);
            if (sm_moe_reserve(L->moe, max_T, err) != SM_OK) goto fail;
        }
    }
#undef CARVE
    return m;
fail:
    sm_model_free(m);
    return NULL;
}

void sm_model_free(sm_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_layers; i++) sm_moe_free(m->layers[i].moe);
    sm_params_free(&m->params);
    free(m->arena);
    free(m);
}

static const sm_real *layer_input(const sm_model *m, int i) {
    return i == 0 ? m->input : m->layers[i - 1].out_act;
}

const sm_real *sm_model_forward(sm_model *m, const float *x, int T, sm_rng *rng, int train) {
    const sm_params *ps = &m->params;
    for (size_t i = 0; i < (size_t)T * m->cfg.in_dim; i++) m->input[i] = (sm_real)x[i];
    m->aux_loss = 0;
    for (int i = 0; i < m->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        const sm_real *in = layer_input(m, i);
        switch (L->kind) {
        case SM_LAYER_DENSE:
            sm_linear_forward(L->pre, in, sm_params_data(ps, L->ip[0]), sm_params_data(ps, L->ip[1]), T, L->in, L->out);
            sm_act_forward(L->out_act, L->pre, (size_t)T * L->out, m->cfg.act);
            break;
        case SM_LAYER_FFN: {
            sm_mlp_weights w = {sm_params_data(ps, L->ip[0]), sm_params_data(ps, L->ip[1]),
                                sm_params_data(ps, L->ip[2]), sm_params_data(ps, L->ip[3])};
            sm_mlp_forward(L->out_act, L->pre, L->hid, in, w, m->cfg.act, T, L->in, L->hidden, L->out);
            break;
        }
        case SM_LAYER_MOE:
            sm_moe_forward(L->moe, L->out_act, in, T, rng, train);
            m->aux_loss += L->moe->route.aux_loss;
            break;
        }
        if (L->kind != SM_LAYER_DENSE && m->cfg.residual)
            for (size_t j = 0; j < (size_t)T * L->out; j++) L->out_act[j] += in[j];
    }
    int W = m->n_layers ? m->layers[m->n_layers - 1].out : m->cfg.in_dim;
    sm_linear_forward(m->logits, layer_input(m, m->n_layers), sm_params_data(ps, m->ip_head[0]),
                      sm_params_data(ps, m->ip_head[1]), T, W, m->cfg.n_classes);
    return m->logits;
}

double sm_model_loss(sm_model *m, const int *y, const unsigned char *mask, int T) {
    double ce = sm_crossentropy_forward(m->losses, m->probs, m->logits, y, mask, T, m->cfg.n_classes);
    /* remember targets for the backward in dlogits: (probs - onehot) / T */
    int V = m->cfg.n_classes;
    memset(m->dlogits, 0, sizeof(sm_real) * (size_t)T * V);
    sm_crossentropy_backward(m->dlogits, m->probs, y, 1, T, V);
    return ce + m->aux_loss;
}

void sm_model_backward(sm_model *m, int T) {
    const sm_params *ps = &m->params;
    int V = m->cfg.n_classes;
    int W = m->n_layers ? m->layers[m->n_layers - 1].out : m->cfg.in_dim;
    sm_real *dtop = m->n_layers ? m->layers[m->n_layers - 1].dout : NULL;
    if (dtop) memset(dtop, 0, sizeof(sm_real) * (size_t)T * W);
    sm_linear_backward(dtop, sm_params_grad(ps, m->ip_head[0]), sm_params_grad(ps, m->ip_head[1]), m->dlogits,
                       layer_input(m, m->n_layers), sm_params_data(ps, m->ip_head[0]), T, W, V);
    for (int i = m->n_layers - 1; i >= 0; i--) {
        sm_layer *L = &m->layers[i];
        const sm_real *in = layer_input(m, i);
        /* gradient w.r.t. this layer's input: the previous layer's dout, or nothing for layer 0 */
        sm_real *din = i > 0 ? m->layers[i - 1].dout : NULL;
        if (din) memset(din, 0, sizeof(sm_real) * (size_t)T * L->in);
        switch (L->kind) {
        case SM_LAYER_DENSE: {
            sm_real *dpre = m->scratch; /* (T,out) */
            memcpy(dpre, L->dout, sizeof(sm_real) * (size_t)T * L->out);
            sm_act_backward_inplace(dpre, L->pre, (size_t)T * L->out, m->cfg.act);
            sm_linear_backward(din, sm_params_grad(ps, L->ip[0]), sm_params_grad(ps, L->ip[1]), dpre, in,
                               sm_params_data(ps, L->ip[0]), T, L->in, L->out);
            break;
        }
        case SM_LAYER_FFN: {
            sm_mlp_weights w = {sm_params_data(ps, L->ip[0]), sm_params_data(ps, L->ip[1]),
                                sm_params_data(ps, L->ip[2]), sm_params_data(ps, L->ip[3])};
            sm_mlp_grads g = {sm_params_grad(ps, L->ip[0]), sm_params_grad(ps, L->ip[1]),
                              sm_params_grad(ps, L->ip[2]), sm_params_grad(ps, L->ip[3])};
            sm_mlp_backward(din, g, m->scratch, L->dout, L->pre, L->hid, in, w, m->cfg.act, T, L->in, L->hidden,
                            L->out);
            break;
        }
        case SM_LAYER_MOE: {
            /* the router and expert scatter need somewhere to put dx even for layer 0 */
            sm_real *dx = din ? din : m->scratch;
            if (!din) memset(dx, 0, sizeof(sm_real) * (size_t)T * L->in);
            sm_moe_backward(L->moe, dx, L->dout, in, T);
            break;
        }
        }
        if (din && L->kind != SM_LAYER_DENSE && m->cfg.residual)
            for (size_t j = 0; j < (size_t)T * L->out; j++) din[j] += L->dout[j];
    }
}

void sm_model_set_dials(sm_model *m, double alpha, double temperature) {
    sm_router_config *all[SM_MAX_LAYERS + 1];
    int n = 0;
    all[n++] = &m->cfg.moe.router;
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].moe) all[n++] = &m->layers[i].moe->router->cfg;
    for (int i = 0; i < n; i++) {
        if (alpha >= 0) all[i]->alpha = alpha;
        if (temperature > 0) all[i]->temperature = temperature;
    }
}

int sm_model_n_moe(const sm_model *m) {
    int n = 0;
    for (int i = 0; i < m->n_layers; i++) n += m->layers[i].kind == SM_LAYER_MOE;
    return n;
}

sm_moe *sm_model_moe(const sm_model *m, int idx) {
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == SM_LAYER_MOE && idx-- == 0) return m->layers[i].moe;
    return NULL;
}

size_t sm_model_active_params(const sm_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->params.n; i++) {
        const sm_param *p = &m->params.p[i];
        /* routed expert tensors are (E, ...): only k of E are active per token */
        if (strstr(p->name, ".experts.")) {
            const sm_router_config *r = &m->cfg.moe.router;
            n += p->numel / (size_t)r->E * (size_t)r->k;
        } else {
            n += p->numel;
        }
    }
    return n;
}
