/* Model: layer stack, one parameter block, one activation arena (see include/specmoe/model.h). */
#include "specmoe/nn/model.h"

#include "specmoe/core/conv.h"

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

static const char *const kKindNames[] = {"dense", "ffn", "moe", "ln", "conv", "maxpool", "avgpool", "gap"};
/* numbers after the kind: dense/ffn/moe W; conv OC:K:S:P; pools K:S; ln, gap none */
static const int kKindArgs[] = {1, 1, 1, 0, 4, 2, 2, 0};

sm_status sm_model_parse_arch(sm_model_config *c, const char *arch, sm_error *err) {
    char buf[512];
    if (strlen(arch) >= sizeof buf) return sm_fail(err, SM_ERR_ARG, "--arch: too long");
    strcpy(buf, arch);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == SM_MAX_LAYERS) return sm_fail(err, SM_ERR_ARG, "--arch: more than %d layers", SM_MAX_LAYERS);
        char *save2 = NULL, *kind = strtok_r(tok, ":", &save2);
        int K = -1;
        for (int k = 0; k < (int)(sizeof kKindNames / sizeof kKindNames[0]); k++)
            if (kind && !strcmp(kind, kKindNames[k])) K = k;
        if (K < 0)
            return sm_fail(err, SM_ERR_ARG, "--arch: unknown layer kind '%s' (dense:W ffn:H moe:H ln conv:OC:K:S:P "
                                            "maxpool:K:S avgpool:K:S gap)", kind ? kind : "");
        long v[4] = {0, 0, 0, 0};
        int got = 0;
        for (char *num = strtok_r(NULL, ":", &save2); num; num = strtok_r(NULL, ":", &save2)) {
            char *end;
            if (got == 4) return sm_fail(err, SM_ERR_ARG, "--arch: too many numbers for layer %d (%s)", n, kind);
            v[got] = strtol(num, &end, 10);
            if (*end || v[got] < 0 || v[got] > 1 << 20) return sm_fail(err, SM_ERR_ARG, "--arch: bad number '%s' in layer %d (%s)", num, n, kind);
            got++;
        }
        if (got != kKindArgs[K])
            return sm_fail(err, SM_ERR_ARG, "--arch: layer %d (%s) takes %d number(s), got %d", n, kind, kKindArgs[K], got);
        sm_layer_spec *s = &c->layers[n];
        memset(s, 0, sizeof *s);
        s->kind = (sm_layer_kind)K;
        if (K == SM_LAYER_CONV) {
            s->width = (int)v[0];
            s->k = (int)v[1];
            s->s = (int)v[2];
            s->p = (int)v[3];
        } else if (K == SM_LAYER_MAXPOOL || K == SM_LAYER_AVGPOOL) {
            s->k = (int)v[0];
            s->s = (int)v[1];
        } else if (kKindArgs[K] == 1) {
            s->width = (int)v[0];
        }
        if ((kKindArgs[K] == 1 || K == SM_LAYER_CONV) && s->width < 1)
            return sm_fail(err, SM_ERR_ARG, "--arch: layer %d (%s) needs a width >= 1", n, kind);
        if ((K == SM_LAYER_CONV || K == SM_LAYER_MAXPOOL || K == SM_LAYER_AVGPOOL) && (s->k < 1 || s->s < 1))
            return sm_fail(err, SM_ERR_ARG, "--arch: layer %d (%s) needs kernel and stride >= 1", n, kind);
        n++;
    }
    if (n == 0) return sm_fail(err, SM_ERR_ARG, "--arch: no layers");
    c->n_layers = n;
    return SM_OK;
}

sm_status sm_model_arch_srmoe(sm_model_config *c, int stages, int width, const int *stem, int n_stem, sm_error *err) {
    if (stages < 1 || width < 1 || n_stem < 1 || n_stem > 4 || n_stem + 3 + 3 * stages > SM_MAX_LAYERS)
        return sm_fail(err, SM_ERR_ARG, "srmoe: need 1 <= stem convs <= 4, stages >= 1 (at most %d layers), width >= 1",
                       SM_MAX_LAYERS);
    char arch[512];
    size_t n = 0;
    for (int i = 0; i < n_stem; i++) {
        if (stem[i] < 1) return sm_fail(err, SM_ERR_ARG, "srmoe: stem channels must be >= 1");
        n += (size_t)snprintf(arch + n, sizeof arch - n, "%sconv:%d:3:2:1", i ? "," : "", stem[i]);
    }
    n += (size_t)snprintf(arch + n, sizeof arch - n, ",maxpool:2:2,gap,dense:%d", width);
    for (int s = 0; s < stages; s++) n += (size_t)snprintf(arch + n, sizeof arch - n, ",dense:%d,ln,moe:%d", width, width);
    return sm_model_parse_arch(c, arch, err);
}

void sm_model_format_arch(const sm_model_config *c, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n_layers && used < n; i++) {
        const sm_layer_spec *l = &c->layers[i];
        const char *sep = i ? "," : "";
        switch (l->kind) {
        case SM_LAYER_CONV:
            used += (size_t)snprintf(buf + used, n - used, "%sconv:%d:%d:%d:%d", sep, l->width, l->k, l->s, l->p);
            break;
        case SM_LAYER_MAXPOOL:
        case SM_LAYER_AVGPOOL:
            used += (size_t)snprintf(buf + used, n - used, "%s%s:%d:%d", sep, kKindNames[l->kind], l->k, l->s);
            break;
        case SM_LAYER_LN:
        case SM_LAYER_GAP:
            used += (size_t)snprintf(buf + used, n - used, "%s%s", sep, kKindNames[l->kind]);
            break;
        default:
            used += (size_t)snprintf(buf + used, n - used, "%s%s:%d", sep, kKindNames[l->kind], l->width);
        }
    }
}

char *sm_model_config_to_json(const sm_model_config *c) {
    char arch[512];
    sm_model_format_arch(c, arch, sizeof arch);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "in_dim", c->in_dim);
    cJSON_AddNumberToObject(o, "in_c", c->in_c);
    cJSON_AddNumberToObject(o, "in_h", c->in_h);
    cJSON_AddNumberToObject(o, "in_w", c->in_w);
    cJSON_AddNumberToObject(o, "spectral_alpha", c->spectral_alpha);
    cJSON_AddNumberToObject(o, "sigma_t", c->sigma_t);
    cJSON_AddNumberToObject(o, "rho_t", c->rho_t);
    cJSON_AddNumberToObject(o, "diversity_beta", c->diversity_beta);
    cJSON_AddNumberToObject(o, "penalty_on_prototypes", c->penalty_on_prototypes);
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
    cJSON_AddNumberToObject(m, "proto_sq", r->proto_sq);
    cJSON_AddNumberToObject(m, "ev_c", r->ev_c);
    cJSON_AddNumberToObject(m, "ev_avg", r->ev_avg);
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
    if (!(d >= -2147483647.0 && d <= 2147483647.0) || d != (double)(int)d)
        return sm_fail(err, SM_ERR_FORMAT, "model config: field '%s' is not an integer in range", key);
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
    if (st == SM_OK) st = json_opt_int(m, "proto_sq", &r->proto_sq, err);
    if (st == SM_OK) st = json_opt_int(m, "ev_c", &r->ev_c, err);
    if (st == SM_OK) st = json_opt_int(m, "ev_avg", &r->ev_avg, err);
    if (st == SM_OK) st = json_opt_int(o, "in_c", &c->in_c, err);
    if (st == SM_OK) st = json_opt_int(o, "in_h", &c->in_h, err);
    if (st == SM_OK) st = json_opt_int(o, "in_w", &c->in_w, err);
    if (st == SM_OK) st = json_opt_num(o, "spectral_alpha", &c->spectral_alpha, err);
    if (st == SM_OK) st = json_opt_num(o, "sigma_t", &c->sigma_t, err);
    if (st == SM_OK) st = json_opt_num(o, "rho_t", &c->rho_t, err);
    if (st == SM_OK) st = json_opt_num(o, "diversity_beta", &c->diversity_beta, err);
    if (st == SM_OK) st = json_opt_int(o, "penalty_on_prototypes", &c->penalty_on_prototypes, err);
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

/* Shapes and parameters of layer i given its input shape; fails on shapes that do not fit. */
static sm_status layer_setup(sm_model *m, int i, sm_params *ps, sm_error *err) {
    sm_layer *L = &m->layers[i];
    const sm_layer_spec *sp = &m->cfg.layers[i];
    char prefix[32], name[SM_NAME_MAX];
    snprintf(prefix, sizeof prefix, "layers.%d", i);
    L->kind = sp->kind;
    L->in = L->ic * L->ih * L->iw;
    L->oc = L->ic;
    L->oh = L->ih;
    L->ow = L->iw;
    for (int j = 0; j < 4; j++) L->ip[j] = -1;
    L->pen_w = -1;
    switch (sp->kind) {
    case SM_LAYER_DENSE:
        L->oc = sp->width;
        L->oh = L->ow = 1;
        if (add_linear(ps, prefix, "weight", "bias", sp->width, L->in, &L->ip[0], &L->ip[1], err)) return SM_ERR_ARG;
        break;
    case SM_LAYER_FFN:
        L->hidden = sp->width;
        if (add_linear(ps, prefix, "w1", "b1", L->hidden, L->in, &L->ip[0], &L->ip[1], err) ||
            add_linear(ps, prefix, "w2", "b2", L->in, L->hidden, &L->ip[2], &L->ip[3], err))
            return SM_ERR_ARG;
        break;
    case SM_LAYER_MOE: {
        L->hidden = sp->width;
        sm_moe_config mc = m->cfg.moe;
        mc.H = L->hidden;
        L->moe = sm_moe_create(&mc, L->in, err);
        if (!L->moe) return SM_ERR_ARG;
        sm_status st = sm_moe_declare(L->moe, ps, prefix, err);
        if (st != SM_OK) return st;
        break;
    }
    case SM_LAYER_LN: {
        int64_t sh[1] = {L->in};
        snprintf(name, sizeof name, "%s.weight", prefix);
        if ((L->ip[0] = sm_params_add(ps, name, 1, sh, SM_INIT_ONE, 1, 0, SM_PARAM_NO_DECAY, err)) < 0) return SM_ERR_ARG;
        snprintf(name, sizeof name, "%s.bias", prefix);
        if ((L->ip[1] = sm_params_add(ps, name, 1, sh, SM_INIT_ZERO, 1, 0, SM_PARAM_NO_DECAY, err)) < 0) return SM_ERR_ARG;
        break;
    }
    case SM_LAYER_CONV: {
        sm_error e2; /* a separate buffer: the message is quoted into err */
        sm_status st = sm_conv2d_shape(L->ih, L->iw, sp->k, sp->k, sp->s, sp->p, &L->oh, &L->ow, &e2);
        if (st != SM_OK) return sm_fail(err, SM_ERR_ARG, "--arch layer %d (conv): %s", i, e2.msg);
        L->oc = sp->width;
        int64_t sw[4] = {sp->width, L->ic, sp->k, sp->k}, sb[1] = {sp->width};
        int fan = L->ic * sp->k * sp->k;
        snprintf(name, sizeof name, "%s.weight", prefix);
        if ((L->ip[0] = sm_params_add(ps, name, 4, sw, SM_INIT_UNIFORM_FANIN, fan, 0, 0, err)) < 0) return SM_ERR_ARG;
        snprintf(name, sizeof name, "%s.bias", prefix);
        if ((L->ip[1] = sm_params_add(ps, name, 1, sb, SM_INIT_UNIFORM_FANIN, fan, 0, SM_PARAM_NO_DECAY, err)) < 0)
            return SM_ERR_ARG;
        break;
    }
    case SM_LAYER_MAXPOOL:
    case SM_LAYER_AVGPOOL: {
        sm_error e2;
        sm_status st = sm_conv2d_shape(L->ih, L->iw, sp->k, sp->k, sp->s, 0, &L->oh, &L->ow, &e2);
        if (st != SM_OK) return sm_fail(err, SM_ERR_ARG, "--arch layer %d (%s): %s", i, kKindNames[sp->kind], e2.msg);
        break;
    }
    case SM_LAYER_GAP:
        L->oh = L->ow = 1;
        break;
    }
    if ((int64_t)L->oc * L->oh * L->ow > (1 << 28))
        return sm_fail(err, SM_ERR_ARG, "--arch layer %d: %d x %d x %d outputs are too many", i, L->oc, L->oh, L->ow);
    L->out = L->oc * L->oh * L->ow;
    return SM_OK;
}

/* Per-row activation sizes of a layer: pre-activation, MLP hidden, LayerNorm statistics. */
static void layer_buffer_sizes(const sm_layer *L, size_t *pre, size_t *hid, size_t *st) {
    *pre = (L->kind == SM_LAYER_DENSE || L->kind == SM_LAYER_CONV) ? (size_t)L->out
           : L->kind == SM_LAYER_FFN                               ? (size_t)L->hidden : 0;
    *hid = L->kind == SM_LAYER_FFN ? (size_t)L->hidden : 0;
    *st = L->kind == SM_LAYER_LN ? 2 : 0;
}

sm_model *sm_model_create(const sm_model_config *cfg, int max_T, sm_rng *rng, sm_error *err) {
    if (cfg->in_dim < 1 || cfg->n_classes < 2 || cfg->n_layers < 0 || cfg->n_layers > SM_MAX_LAYERS || max_T < 1) {
        sm_fail(err, SM_ERR_ARG, "model: bad dimensions (in %d, classes %d, layers %d, batch %d)", cfg->in_dim,
                cfg->n_classes, cfg->n_layers, max_T);
        return NULL;
    }
    if (!(cfg->spectral_alpha >= 0) || !(cfg->diversity_beta >= 0)) {
        sm_fail(err, SM_ERR_ARG, "model: penalty weights must be >= 0");
        return NULL;
    }
    if (cfg->diversity_beta > 0 && cfg->moe.router.E > 1024) {
        sm_fail(err, SM_ERR_ARG, "model: the diversity loss supports at most 1024 experts (got %d)", cfg->moe.router.E);
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
    m->power_iters = 1;
    sm_params_init_table(&m->params);
    sm_params *ps = &m->params;
    /* the input is an image when its shape is given and consistent, else a feature vector */
    int c = cfg->in_c, h = cfg->in_h, w = cfg->in_w;
    if (c < 1 || h < 1 || w < 1 || (int64_t)c * h * w != cfg->in_dim) c = cfg->in_dim, h = w = 1;
    size_t maxw = (size_t)cfg->in_dim, maxcol = 1;
    for (int i = 0; i < cfg->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        L->ic = c;
        L->ih = h;
        L->iw = w;
        if (layer_setup(m, i, ps, err) != SM_OK) goto fail;
        c = L->oc;
        h = L->oh;
        w = L->ow;
        if ((size_t)L->out > maxw) maxw = (size_t)L->out;
        if ((size_t)L->hidden > maxw) maxw = (size_t)L->hidden;
        if (L->kind == SM_LAYER_CONV) {
            size_t col = sm_conv2d_col_size(L->ic, L->ih, L->iw, cfg->layers[i].k, cfg->layers[i].k, cfg->layers[i].s,
                                            cfg->layers[i].p);
            if (col == 0) { /* sizes the conv refuses (too large) */
                sm_fail(err, SM_ERR_ARG, "--arch layer %d (conv): im2col buffer too large", i);
                goto fail;
            }
            if (col > maxcol) maxcol = col;
        }
    }
    int W = m->n_layers ? m->layers[m->n_layers - 1].out : cfg->in_dim;
    if (add_linear(ps, "head", "weight", "bias", cfg->n_classes, W, &m->ip_head[0], &m->ip_head[1], err)) goto fail;
    /* SR-MoE penalties: each MoE stage's gate matrix is the linear map feeding it (the dense layer
     * right before, skipping a LayerNorm) or, by flag, the router's prototype matrix */
    if (cfg->spectral_alpha > 0) {
        for (int i = 0; i < m->n_layers; i++) {
            if (m->layers[i].kind != SM_LAYER_MOE) continue;
            int target = -1;
            if (cfg->penalty_on_prototypes) {
                char name[SM_NAME_MAX];
                snprintf(name, sizeof name, "layers.%d.router.prototypes", i);
                target = sm_params_find(ps, name);
            } else {
                for (int j = i - 1; j >= 0 && target < 0; j--) {
                    if (m->layers[j].kind == SM_LAYER_DENSE) target = m->layers[j].ip[0];
                    else if (m->layers[j].kind != SM_LAYER_LN) break;
                }
            }
            if (target < 0) {
                sm_fail(err, SM_ERR_ARG, "model: spectral penalty on MoE layer %d needs %s", i,
                        cfg->penalty_on_prototypes ? "a prototype router" : "a dense layer feeding it");
                goto fail;
            }
            m->layers[i].pen_w = target;
        }
    }
    if (sm_params_alloc(ps, err) != SM_OK) goto fail;
    if (rng) sm_params_initialize(ps, rng);
    m->power = calloc((size_t)(m->n_layers ? m->n_layers : 1), sizeof(sm_power_iter));
    if (!m->power) goto nomem;
    for (int i = 0; i < m->n_layers; i++) {
        if (m->layers[i].pen_w < 0) continue;
        const sm_param *q = &ps->p[m->layers[i].pen_w];
        sm_rng pr; /* the power-iteration start is fixed, so runs are reproducible */
        sm_rng_seed(&pr, 0x5eed + (uint64_t)i);
        if (sm_power_iter_init(&m->power[i], (int)q->shape[0], (int)(q->numel / (size_t)q->shape[0]), &pr, err) != SM_OK)
            goto fail;
    }

    /* activation arena: sizes first, then one allocation carved in the same order */
    size_t T = (size_t)max_T, V = (size_t)cfg->n_classes, total = 0, itotal = 0;
    total += T * (size_t)cfg->in_dim + 3 * T * V + T + T * maxw + 2 * maxcol;
    for (int i = 0; i < m->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        size_t pre, hid, st;
        layer_buffer_sizes(L, &pre, &hid, &st);
        total += T * (pre + hid + st + 2 * (size_t)L->out);
        if (L->kind == SM_LAYER_MAXPOOL) itotal += T * (size_t)L->out;
    }
    m->arena = malloc(total * sizeof(sm_real));
    m->iarena = malloc((itotal ? itotal : 1) * sizeof(int));
    if (!m->arena || !m->iarena) {
        sm_fail(err, SM_ERR_NOMEM, "model: cannot allocate %zu MiB of activations", total * sizeof(sm_real) >> 20);
        goto fail;
    }
    sm_real *p = m->arena;
    int *ip = m->iarena;
#define CARVE(ptr, n) (ptr = p, p += (n))
    CARVE(m->input, T * (size_t)cfg->in_dim);
    CARVE(m->logits, T * V);
    CARVE(m->probs, T * V);
    CARVE(m->dlogits, T * V);
    CARVE(m->losses, T);
    CARVE(m->scratch, T * maxw);
    CARVE(m->col, maxcol);
    CARVE(m->dcol, maxcol);
    for (int i = 0; i < m->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        size_t pre, hid, st;
        layer_buffer_sizes(L, &pre, &hid, &st);
        CARVE(L->pre, T * pre);
        CARVE(L->hid, T * hid);
        CARVE(L->stats, T * st);
        CARVE(L->out_act, T * (size_t)L->out);
        CARVE(L->dout, T * (size_t)L->out);
        if (L->kind == SM_LAYER_MAXPOOL) {
            L->idx = ip;
            ip += T * (size_t)L->out;
        }
        if (L->moe) {
            sm_moe_bind(L->moe, ps);
            if (sm_moe_reserve(L->moe, max_T, err) != SM_OK) goto fail;
        }
    }
#undef CARVE
    return m;
nomem:
    sm_fail(err, SM_ERR_NOMEM, "model: out of memory");
fail:
    sm_model_free(m);
    return NULL;
}

void sm_model_free(sm_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_layers; i++) {
        sm_moe_free(m->layers[i].moe);
        if (m->power) sm_power_iter_free(&m->power[i]);
    }
    free(m->power);
    sm_params_free(&m->params);
    free(m->arena);
    free(m->iarena);
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
        const sm_layer_spec *sp = &m->cfg.layers[i];
        const sm_real *in = layer_input(m, i);
        sm_real *w0 = L->ip[0] >= 0 ? sm_params_data(ps, L->ip[0]) : NULL, *w1 = L->ip[1] >= 0 ? sm_params_data(ps, L->ip[1]) : NULL;
        switch (L->kind) {
        case SM_LAYER_DENSE:
            sm_linear_forward(L->pre, in, w0, w1, T, L->in, L->out);
            sm_act_forward(L->out_act, L->pre, (size_t)T * L->out, m->cfg.act);
            break;
        case SM_LAYER_FFN: {
            sm_mlp_weights w = {w0, w1, sm_params_data(ps, L->ip[2]), sm_params_data(ps, L->ip[3])};
            sm_mlp_forward(L->out_act, L->pre, L->hid, in, w, m->cfg.act, T, L->in, L->hidden, L->out);
            break;
        }
        case SM_LAYER_MOE:
            sm_moe_forward(L->moe, L->out_act, in, T, rng, train);
            m->aux_loss += L->moe->route.aux_loss;
            break;
        case SM_LAYER_LN:
            sm_layernorm_forward(L->out_act, L->stats, L->stats + T, in, w0, w1, T, L->in);
            break;
        case SM_LAYER_CONV:
            sm_conv2d_forward(L->pre, m->col, in, w0, w1, T, L->ic, L->ih, L->iw, L->oc, sp->k, sp->k, sp->s, sp->p);
            sm_act_forward(L->out_act, L->pre, (size_t)T * L->out, m->cfg.act);
            break;
        case SM_LAYER_MAXPOOL:
            sm_maxpool2d_forward(L->out_act, L->idx, in, T, L->ic, L->ih, L->iw, sp->k, sp->s);
            break;
        case SM_LAYER_AVGPOOL:
            sm_avgpool2d_forward(L->out_act, in, T, L->ic, L->ih, L->iw, sp->k, sp->s);
            break;
        case SM_LAYER_GAP:
            sm_adaptive_avgpool2d_forward(L->out_act, in, T, L->ic, L->ih, L->iw, 1, 1);
            break;
        }
        if ((L->kind == SM_LAYER_FFN || L->kind == SM_LAYER_MOE) && m->cfg.residual)
            for (size_t j = 0; j < (size_t)T * L->out; j++) L->out_act[j] += in[j];
    }
    int W = m->n_layers ? m->layers[m->n_layers - 1].out : m->cfg.in_dim;
    sm_linear_forward(m->logits, layer_input(m, m->n_layers), sm_params_data(ps, m->ip_head[0]),
                      sm_params_data(ps, m->ip_head[1]), T, W, m->cfg.n_classes);
    return m->logits;
}

/* SR-MoE penalties of every MoE stage. The loss pass (grad = 0) runs the power iterations and
 * returns the value; the backward pass (grad = 1) reuses the same singular vectors (no further
 * iteration) and adds the gradients into the parameter gradients (spectral) and the routes' dprobs
 * (diversity), which the routers' backward consumes. */
static double model_penalties(sm_model *m, int T, int grad) {
    const sm_model_config *c = &m->cfg;
    double pen = 0;
    for (int i = 0; i < m->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        if (L->kind != SM_LAYER_MOE) continue;
        if (L->pen_w >= 0) {
            const sm_params *ps = &m->params;
            sm_real *W = sm_params_data(ps, L->pen_w), *dW = grad ? sm_params_grad(ps, L->pen_w) : NULL;
            /* m->power_iters iterations per step on persistent vectors (Miyato et al. 2018) */
            pen += sm_spectral_norm_penalty(&m->power[i], W, dW, c->sigma_t, c->spectral_alpha, grad ? 0 : m->power_iters);
            pen += sm_stable_rank_penalty(&m->power[i], W, dW, c->rho_t, c->spectral_alpha, 0);
        }
        if (c->diversity_beta > 0)
            pen += sm_diversity_penalty(L->moe->route.probs, grad ? L->moe->route.dprobs : NULL, T, L->moe->E,
                                        c->diversity_beta);
    }
    return pen;
}

double sm_model_loss(sm_model *m, const int *y, const unsigned char *mask, int T) {
    double ce = sm_crossentropy_forward(m->losses, m->probs, m->logits, y, mask, T, m->cfg.n_classes);
    /* the backward starts from dlogits = (probs - onehot) / T */
    int V = m->cfg.n_classes;
    memset(m->dlogits, 0, sizeof(sm_real) * (size_t)T * V);
    sm_crossentropy_backward(m->dlogits, m->probs, y, 1, T, V);
    m->penalty = model_penalties(m, T, 0);
    return ce + m->aux_loss + m->penalty;
}

void sm_model_backward(sm_model *m, int T) {
    const sm_params *ps = &m->params;
    if (m->cfg.spectral_alpha > 0 || m->cfg.diversity_beta > 0) model_penalties(m, T, 1);
    int V = m->cfg.n_classes;
    int W = m->n_layers ? m->layers[m->n_layers - 1].out : m->cfg.in_dim;
    sm_real *dtop = m->n_layers ? m->layers[m->n_layers - 1].dout : NULL;
    if (dtop) memset(dtop, 0, sizeof(sm_real) * (size_t)T * W);
    sm_linear_backward(dtop, sm_params_grad(ps, m->ip_head[0]), sm_params_grad(ps, m->ip_head[1]), m->dlogits,
                       layer_input(m, m->n_layers), sm_params_data(ps, m->ip_head[0]), T, W, V);
    for (int i = m->n_layers - 1; i >= 0; i--) {
        sm_layer *L = &m->layers[i];
        const sm_layer_spec *sp = &m->cfg.layers[i];
        const sm_real *in = layer_input(m, i);
        /* gradient w.r.t. this layer's input: the previous layer's dout, or nothing for layer 0 */
        sm_real *din = i > 0 ? m->layers[i - 1].dout : NULL;
        if (din) memset(din, 0, sizeof(sm_real) * (size_t)T * L->in);
        sm_real *w0 = L->ip[0] >= 0 ? sm_params_data(ps, L->ip[0]) : NULL;
        sm_real *g0 = L->ip[0] >= 0 ? sm_params_grad(ps, L->ip[0]) : NULL, *g1 = L->ip[1] >= 0 ? sm_params_grad(ps, L->ip[1]) : NULL;
        switch (L->kind) {
        case SM_LAYER_DENSE:
        case SM_LAYER_CONV: {
            sm_real *dpre = m->scratch; /* (T,out) */
            memcpy(dpre, L->dout, sizeof(sm_real) * (size_t)T * L->out);
            sm_act_backward_inplace(dpre, L->pre, (size_t)T * L->out, m->cfg.act);
            if (L->kind == SM_LAYER_DENSE)
                sm_linear_backward(din, g0, g1, dpre, in, w0, T, L->in, L->out);
            else
                sm_conv2d_backward(din, g0, g1, m->col, m->dcol, dpre, in, w0, T, L->ic, L->ih, L->iw, L->oc, sp->k,
                                   sp->k, sp->s, sp->p);
            break;
        }
        case SM_LAYER_FFN: {
            sm_mlp_weights w = {w0, sm_params_data(ps, L->ip[1]), sm_params_data(ps, L->ip[2]), sm_params_data(ps, L->ip[3])};
            sm_mlp_grads g = {g0, g1, sm_params_grad(ps, L->ip[2]), sm_params_grad(ps, L->ip[3])};
            sm_mlp_backward(din, g, m->scratch, L->dout, L->pre, L->hid, in, w, m->cfg.act, T, L->in, L->hidden, L->out);
            break;
        }
        case SM_LAYER_MOE: {
            /* the router and expert scatter need somewhere to put dx even for layer 0 */
            sm_real *dx = din ? din : m->scratch;
            if (!din) memset(dx, 0, sizeof(sm_real) * (size_t)T * L->in);
            sm_moe_backward(L->moe, dx, L->dout, in, T);
            break;
        }
        case SM_LAYER_LN: {
            sm_real *dx = din ? din : m->scratch;
            if (!din) memset(dx, 0, sizeof(sm_real) * (size_t)T * L->in);
            sm_layernorm_backward(dx, g0, g1, L->dout, in, w0, L->stats, L->stats + T, T, L->in);
            break;
        }
        case SM_LAYER_MAXPOOL:
            if (din) sm_maxpool2d_backward(din, L->dout, L->idx, T, L->ic, L->ih, L->iw, sp->k, sp->s);
            break;
        case SM_LAYER_AVGPOOL:
            if (din) sm_avgpool2d_backward(din, L->dout, T, L->ic, L->ih, L->iw, sp->k, sp->s);
            break;
        case SM_LAYER_GAP:
            if (din) sm_adaptive_avgpool2d_backward(din, L->dout, T, L->ic, L->ih, L->iw, 1, 1);
            break;
        }
        if (din && (L->kind == SM_LAYER_FFN || L->kind == SM_LAYER_MOE) && m->cfg.residual)
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
