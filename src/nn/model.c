/* Model: layer stack, one parameter block, one activation arena (see include/specmoe/model.h). */
#include "specmoe/nn/model.h"

#include "specmoe/core/conv.h"
#include "specmoe/core/json.h"
#include "specmoe/nn/loss.h"
#include "specmoe/nn/metrics.h"
#include "specmoe/nn/penalty.h"

#include <cjson/cJSON.h>
#include <math.h>
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

static const char *const kKindNames[] = {"dense", "ffn",     "moe",     "ln",     "conv", "maxpool", "avgpool", "gap", "tokens",
                                         "perfeat", "shuffle", "flatten", "tokmean", "toksum", "res", "act",   "moehead"};
/* numbers after the kind: dense/ffn/moe W; conv OC:K:S:P; pools K:S; shuffle SEED; res C; moehead H (or
 * H:G:GW, below); the rest none */
static const int kKindArgs[] = {1, 1, 1, 0, 4, 2, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1};
_Static_assert(sizeof kKindNames / sizeof kKindNames[0] == SM_LAYER_MOEHEAD + 1, "a name per layer kind");
_Static_assert(sizeof kKindArgs / sizeof kKindArgs[0] == SM_LAYER_MOEHEAD + 1, "an argument count per layer kind");

sm_status sm_model_parse_arch(sm_model_config *c, const char *arch, sm_error *err) {
    char buf[512];
    if (strlen(arch) >= sizeof buf) return sm_fail(err, SM_ERR_ARG, "--arch: too long");
    strcpy(buf, arch);
    /* strtok_r skips empty tokens: "dense:256," would read as "dense:256" */
    size_t len = strlen(arch);
    if (len && (arch[0] == ',' || arch[len - 1] == ',' || strstr(arch, ",,")))
        return sm_fail(err, SM_ERR_ARG, "--arch: empty layer in '%s' (a comma with no layer on one side)", arch);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == SM_MAX_LAYERS) return sm_fail(err, SM_ERR_ARG, "--arch: more than %d layers", SM_MAX_LAYERS);
        char *save2 = NULL, *kind = strtok_r(tok, ":", &save2);
        int K = -1;
        for (int k = 0; k < (int)(sizeof kKindNames / sizeof kKindNames[0]); k++)
            if (kind && !strcmp(kind, kKindNames[k])) K = k;
        if (K < 0)
            return sm_fail(err, SM_ERR_ARG, "--arch: unknown layer kind '%s' (dense:W ffn:H moe:H ln conv:OC:K:S:P "
                                            "maxpool:K:S avgpool:K:S gap tokens perfeat shuffle:SEED flatten tokmean "
                                            "toksum res:C act)", kind ? kind : "");
        long v[4] = {0, 0, 0, 0};
        int got = 0;
        for (char *num = strtok_r(NULL, ":", &save2); num; num = strtok_r(NULL, ":", &save2)) {
            char *end;
            if (got == 4) return sm_fail(err, SM_ERR_ARG, "--arch: too many numbers for layer %d (%s)", n, kind);
            v[got] = strtol(num, &end, 10);
            if (*end || v[got] < 0 || v[got] > 1 << 20) return sm_fail(err, SM_ERR_ARG, "--arch: bad number '%s' in layer %d (%s)", num, n, kind);
            got++;
        }
        if (got != kKindArgs[K] && !(K == SM_LAYER_MOEHEAD && got == 3))
            return sm_fail(err, SM_ERR_ARG, "--arch: layer %d (%s) takes %d number(s)%s, got %d", n, kind, kKindArgs[K],
                           K == SM_LAYER_MOEHEAD ? " or 3 (H:G:GW)" : "", got);
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
            if (K == SM_LAYER_MOEHEAD) s->k = (int)v[1], s->s = (int)v[2]; /* the gate MLP (0, 0: none) */
        }
        if ((kKindArgs[K] == 1 || K == SM_LAYER_CONV) && s->width < 1 && K != SM_LAYER_SHUFFLE)
            return sm_fail(err, SM_ERR_ARG, "--arch: layer %d (%s) needs a width >= 1", n, kind);
        if ((K == SM_LAYER_CONV || K == SM_LAYER_MAXPOOL || K == SM_LAYER_AVGPOOL) && (s->k < 1 || s->s < 1))
            return sm_fail(err, SM_ERR_ARG, "--arch: layer %d (%s) needs kernel and stride >= 1", n, kind);
        if (K == SM_LAYER_MOEHEAD && got == 3 && (s->k < 1 || s->k > 8 || s->s < 1))
            return sm_fail(err, SM_ERR_ARG, "--arch: layer %d (moehead:H:G:GW) needs 1 <= G <= 8 gate layers of width GW >= 1", n);
        n++;
    }
    if (n == 0) return sm_fail(err, SM_ERR_ARG, "--arch: no layers");
    for (int i = 0; i < n - 1; i++)
        if (c->layers[i].kind == SM_LAYER_MOEHEAD)
            return sm_fail(err, SM_ERR_ARG, "--arch: moehead (layer %d) ends the network: it must be the last layer", i);
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
        case SM_LAYER_MOEHEAD:
            if (l->k > 0) used += (size_t)snprintf(buf + used, n - used, "%smoehead:%d:%d:%d", sep, l->width, l->k, l->s);
            else used += (size_t)snprintf(buf + used, n - used, "%smoehead:%d", sep, l->width);
            break;
        default: /* no number (ln, gap, the token layers) or one (dense, ffn, moe widths; the shuffle seed) */
            if (kKindArgs[l->kind] == 0) used += (size_t)snprintf(buf + used, n - used, "%s%s", sep, kKindNames[l->kind]);
            else used += (size_t)snprintf(buf + used, n - used, "%s%s:%d", sep, kKindNames[l->kind], l->width);
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
    if (c->hidden_ln) cJSON_AddNumberToObject(o, "hidden_ln", c->hidden_ln); /* absent: as every config before it */
    sm_moe_config_to_json(&c->moe, cJSON_AddObjectToObject(o, "moe"));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* the config's fields, through the shared readers of src/core/json.c */
#define json_num(o, k, out, err) sm_json_num(o, k, 0, out, "model config", err)
#define json_int(o, k, out, err) sm_json_int(o, k, 0, out, "model config", err)
#define json_opt_num(o, k, out, err) sm_json_num(o, k, 1, out, "model config", err)
#define json_opt_int(o, k, out, err) sm_json_int(o, k, 1, out, "model config", err)
#define json_str(o, k, out, n, err) sm_json_str(o, k, out, n, "model config", err)

sm_status sm_model_config_from_json(sm_model_config *c, const char *json, sm_error *err) {
    sm_model_config_default(c);
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return sm_fail(err, SM_ERR_FORMAT, "model config: not a JSON object");
    }
    char arch[512], act[16];
    sm_status st = SM_OK;
    if (st == SM_OK) st = json_int(o, "in_dim", &c->in_dim, err);
    if (st == SM_OK) st = json_int(o, "n_classes", &c->n_classes, err);
    if (st == SM_OK) st = json_str(o, "arch", arch, sizeof arch, err);
    if (st == SM_OK) st = json_str(o, "act", act, sizeof act, err);
    if (st == SM_OK) st = json_int(o, "residual", &c->residual, err);
    if (st == SM_OK) st = sm_moe_config_from_json(&c->moe, cJSON_GetObjectItemCaseSensitive(o, "moe"), err);
    if (st == SM_OK) st = json_opt_int(o, "in_c", &c->in_c, err);
    if (st == SM_OK) st = json_opt_int(o, "in_h", &c->in_h, err);
    if (st == SM_OK) st = json_opt_int(o, "in_w", &c->in_w, err);
    if (st == SM_OK) st = json_opt_num(o, "spectral_alpha", &c->spectral_alpha, err);
    if (st == SM_OK) st = json_opt_num(o, "sigma_t", &c->sigma_t, err);
    if (st == SM_OK) st = json_opt_num(o, "rho_t", &c->rho_t, err);
    if (st == SM_OK) st = json_opt_num(o, "diversity_beta", &c->diversity_beta, err);
    if (st == SM_OK) st = json_opt_int(o, "penalty_on_prototypes", &c->penalty_on_prototypes, err);
    if (st == SM_OK) st = json_opt_int(o, "hidden_ln", &c->hidden_ln, err);
    cJSON_Delete(o);
    if (st != SM_OK) return st;
    if (sm_act_parse(act, &c->act)) return sm_fail(err, SM_ERR_FORMAT, "model config: unknown activation '%s'", act);
    return sm_model_parse_arch(c, arch, err);
}

/* ---------------------------------------------------------------------------------------------- */

/* The Impala ResNet's residual block (Espeholt et al. 2018): x + conv(act(conv(act(x)))), both
 * convolutions 3 x 3, stride 1, padding 1, C channels; the input must have C channels (the
 * residual check of sm_seq_module's caller names the mismatch). A sequential container flagged
 * residual, so its checkpoint names are <name>.conv0.weight, <name>.conv1.weight, ... */
static sm_module *res_block(const char *name, int C, sm_act act, sm_error *err) {
    char n[3][48];
    snprintf(n[0], sizeof n[0], "%s.act", name);
    snprintf(n[1], sizeof n[1], "%s.conv0", name);
    snprintf(n[2], sizeof n[2], "%s.conv1", name);
    sm_module *ch[3] = {sm_act_module(n[0], act, err), NULL, NULL};
    if (ch[0]) ch[1] = sm_conv2d_module(n[1], C, 3, 1, 1, act, err);
    if (ch[1]) ch[2] = sm_conv2d_module(n[2], C, 3, 1, 1, SM_ACT_NONE, err);
    if (!ch[2]) {
        for (int i = 0; i < 3; i++) sm_module_free(ch[i]);
        return NULL;
    }
    sm_module *m = sm_seq_module(name, ch, 3, err);
    if (m) m->residual = 1;
    return m;
}

/* SPHERE's MoE actor as a layer (model.h, moehead): experts F -> H (moe.depth hidden layers) -> V, and a
 * gate MLP of sp->k dense layers of width sp->s with the activation (parameters <name>.gate.<i>.*) that
 * the router reads; none when sp->k = 0. */
/* A hidden dense layer of `width` units: Linear -> act, or with ln Linear -> LayerNorm -> act (a
 * sequential container of three children; pre-activation LayerNorm as in Lyle et al. 2024). */
static sm_module *hidden_dense(const char *name, int width, sm_act act, int ln, sm_error *err) {
    if (!ln) return sm_dense_module(name, width, act, err);
    sm_module *k[3] = {sm_dense_module("", width, SM_ACT_NONE, err), NULL, NULL};
    if (k[0]) k[1] = sm_layernorm_module("", err);
    if (k[1]) k[2] = sm_act_module("", act, err);
    if (!k[2]) {
        for (int i = 0; i < 3; i++)
            if (k[i]) sm_module_free(k[i]);
        return NULL;
    }
    return sm_seq_module(name, k, 3, err);
}

/* A stack of n hidden layers of `width` (then, if out > 0, a linear map to out) as one container */
static sm_module *hidden_stack(const char *name, int n, int width, int out, sm_act act, int ln, sm_error *err) {
    sm_module *g[SM_MAX_LAYERS + 1] = {NULL};
    int k = 0;
    for (; k < n; k++)
        if (!(g[k] = hidden_dense("", width, act, ln, err))) break;
    if (k == n && out > 0 && (g[k] = sm_dense_module("", out, SM_ACT_NONE, err))) k++;
    if (k < n + (out > 0)) {
        for (int j = 0; j < k; j++) sm_module_free(g[j]);
        return NULL;
    }
    return sm_seq_module(name, g, k, err);
}

typedef struct {
    const sm_model_config *c;
    int width, depth;
} ln_expert;

/* the moehead's experts with LayerNorm: obs -> width (depth layers, Linear -> LN -> act) -> classes */
static sm_module *make_ln_expert(void *user, int e, sm_error *err) {
    (void)e;
    const ln_expert *x = user;
    return hidden_stack("", x->depth, x->width, x->c->n_classes, x->c->act, 1, err);
}

static sm_module *moehead_module(const sm_model_config *c, const sm_layer_spec *sp, const char *name, sm_error *err) {
    sm_moe_config mc = c->moe;
    mc.H = sp->width;
    mc.out_dim = c->n_classes;
    sm_module *gate = NULL;
    if (sp->k > 0 && !(gate = hidden_stack("", sp->k, sp->s, 0, c->act, c->hidden_ln, err))) return NULL;
    if (c->hidden_ln) {
        /* the built-in [E, ...] experts have no LayerNorm: factory experts built from modules */
        ln_expert x = {c, sp->width, mc.depth > 1 ? mc.depth : 1};
        return sm_moe_module_experts(name, &mc, make_ln_expert, &x, gate, err);
    }
    return sm_moe_module_gated(name, &mc, gate, err);
}

/* The module of layer i (named layers.<i>, the names every checkpoint uses). */
static sm_module *layer_module(const sm_model_config *c, int i, sm_error *err) {
    const sm_layer_spec *sp = &c->layers[i];
    char name[32];
    snprintf(name, sizeof name, "layers.%d", i);
    sm_module *mod = NULL;
    switch (sp->kind) {
    case SM_LAYER_DENSE: mod = hidden_dense(name, sp->width, c->act, c->hidden_ln, err); break;
    case SM_LAYER_FFN: mod = sm_ffn_module(name, sp->width, c->act, err); break;
    case SM_LAYER_MOE: {
        sm_moe_config mc = c->moe;
        mc.H = sp->width;
        mod = sm_moe_module(name, &mc, err);
        break;
    }
    case SM_LAYER_LN: mod = sm_layernorm_module(name, err); break;
    case SM_LAYER_CONV: mod = sm_conv2d_module(name, sp->width, sp->k, sp->s, sp->p, c->act, err); break;
    case SM_LAYER_MAXPOOL: mod = sm_maxpool_module(name, sp->k, sp->s, err); break;
    case SM_LAYER_AVGPOOL: mod = sm_avgpool_module(name, sp->k, sp->s, err); break;
    case SM_LAYER_GAP: mod = sm_gap_module(name, err); break;
    case SM_LAYER_TOKENS: mod = sm_tokens_module(name, err); break;
    case SM_LAYER_PERFEAT: mod = sm_perfeat_module(name, err); break;
    case SM_LAYER_SHUFFLE: mod = sm_shuffle_module(name, (uint64_t)sp->width, err); break;
    case SM_LAYER_FLATTEN: mod = sm_flatten_module(name, err); break;
    case SM_LAYER_TOKMEAN: mod = sm_tokpool_module(name, 1, err); break;
    case SM_LAYER_TOKSUM: mod = sm_tokpool_module(name, 0, err); break;
    case SM_LAYER_RES: return res_block(name, sp->width, c->act, err);
    case SM_LAYER_ACT: mod = sm_act_module(name, c->act, err); break;
    case SM_LAYER_MOEHEAD: return moehead_module(c, sp, name, err);
    }
    if (mod) mod->residual = c->residual && (sp->kind == SM_LAYER_FFN || sp->kind == SM_LAYER_MOE);
    return mod;
}

/* The network of cfg: body (the layers, under "layers.<i>") and head (linear to the classes),
 * declared into the table ps (initialised here; nothing allocated but the table). On failure
 * *body and *head are whatever was built (the caller frees them). */
static sm_status build_net(const sm_model_config *cfg, sm_params *ps, sm_module **body, sm_module **head, sm_error *err) {
    sm_params_init_table(ps);
    *body = *head = NULL;
    sm_module *mods[SM_MAX_LAYERS];
    for (int i = 0; i < cfg->n_layers; i++)
        if (!(mods[i] = layer_module(cfg, i, err))) {
            for (int j = 0; j < i; j++) sm_module_free(mods[j]);
            return SM_ERR_ARG;
        }
    if (!(*body = sm_seq_module("layers", mods, cfg->n_layers, err))) return SM_ERR_ARG;
    /* the input is an image when its shape is given and consistent, else a feature vector */
    int c = cfg->in_c, h = cfg->in_h, w = cfg->in_w;
    if (c < 1 || h < 1 || w < 1 || (int64_t)c * h * w != cfg->in_dim) c = cfg->in_dim, h = w = 1;
    if (sm_module_declare(*body, ps, sm_shape_image(c, h, w), err) != SM_OK) return SM_ERR_ARG;
    if ((*body)->out.rows != 1)
        return sm_fail(err, SM_ERR_ARG, "--arch: the layers end with %d tokens per example; end them with flatten, "
                       "tokmean or toksum before the head", (*body)->out.rows);
    /* a moehead layer already gives the classes: the head is then the identity (no parameters) */
    const int moehead = cfg->layers[cfg->n_layers - 1].kind == SM_LAYER_MOEHEAD;
    if (!(*head = moehead ? sm_act_module("head", SM_ACT_NONE, err) : sm_dense_module("head", cfg->n_classes, SM_ACT_NONE, err)))
        return SM_ERR_ARG;
    return sm_module_declare(*head, ps, (*body)->out, err) != SM_OK ? SM_ERR_ARG : SM_OK;
}

/* the model's own arena: input copy, logits, probabilities, their gradient, losses, dtop */
static size_t model_arena_values(const sm_model_config *cfg, int max_T, const sm_module *body) {
    size_t T = (size_t)max_T, V = (size_t)cfg->n_classes, W = (size_t)sm_shape_width(body->out);
    return T * (size_t)cfg->in_dim + 3 * T * V + T + T * W;
}

sm_status sm_model_estimate_memory(const sm_model_config *cfg, int max_T, sm_model_memory *out, sm_error *err) {
    memset(out, 0, sizeof *out);
    if (cfg->in_dim < 1 || cfg->n_classes < 2 || cfg->n_layers < 1 || cfg->n_layers > SM_MAX_LAYERS || max_T < 1)
        return sm_fail(err, SM_ERR_ARG, "model: bad dimensions (in %d, classes %d, layers %d, batch %d)", cfg->in_dim,
                       cfg->n_classes, cfg->n_layers, max_T);
    /* the same network sm_model_create builds, declared only: the table knows every parameter's
     * size, and the arenas' counting pass (base NULL) measures the activations without taking them */
    sm_params ps;
    sm_module *body, *head;
    sm_status st = build_net(cfg, &ps, &body, &head, err);
    if (st == SM_OK) {
        size_t act = model_arena_values(cfg, max_T, body);
        sm_module *net[2] = {body, head};
        for (int k = 0; k < 2; k++) {
            sm_arena a = {0};
            net[k]->ops->reserve(net[k], max_T, &a);
            act += a.used + a.iused * sizeof(int) / sizeof(sm_real);
        }
        /* MoE layers take their activations in their setup, outside the arena */
        for (int i = 0; i < cfg->n_layers; i++) {
            const sm_module *L = sm_seq_child(body, i);
            const sm_moe *moe = sm_moe_of(L);
            if (moe) act += sm_moe_act_values(moe, max_T * L->in.rows);
        }
        out->params = ps.total;
        out->param_bytes = ps.total * sizeof(sm_real);
        out->act_bytes = act * sizeof(sm_real);
        /* values, gradients, the optimiser's two moments (sm_optim_init allocates both for every
         * kind), and the float copies of values and moments a checkpoint write makes */
        out->train_bytes = 4 * out->param_bytes + 3 * ps.total * sizeof(float) + out->act_bytes;
    }
    sm_module_free(body);
    sm_module_free(head);
    sm_params_free(&ps);
    return st;
}

sm_model *sm_model_create(const sm_model_config *cfg, int max_T, sm_rng *rng, sm_error *err) {
    if (cfg->in_dim < 1 || cfg->n_classes < 1 || cfg->n_layers < 1 || cfg->n_layers > SM_MAX_LAYERS || max_T < 1) {
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
    sm_params *ps = &m->params;
    if (build_net(cfg, ps, &m->body, &m->head, err) != SM_OK) goto fail;
    for (int i = 0; i < m->n_layers; i++) {
        sm_layer *L = &m->layers[i];
        L->kind = cfg->layers[i].kind;
        L->mod = sm_seq_child(m->body, i);
        L->in = sm_shape_width(L->mod->in);
        L->out = sm_shape_width(L->mod->out);
        L->hidden = (L->kind == SM_LAYER_FFN || L->kind == SM_LAYER_MOE || L->kind == SM_LAYER_MOEHEAD) ? cfg->layers[i].width : 0;
        L->moe = sm_moe_of(L->mod);
    }
    if (sm_params_alloc(ps, err) != SM_OK) goto fail;
    if (!(m->fresh = calloc((size_t)ps->n, 1))) {
        sm_fail(err, SM_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    if (rng) sm_params_initialize(ps, rng);
    /* MoE layers read their parameters through pointers bound at each call; bind them to the model's
     * own table too, for code that inspects experts between calls (SSMoE, pruning, analysis) */
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].moe) sm_moe_bind(m->layers[i].moe, ps);
    if (sm_module_reserve(m->body, max_T, err) != SM_OK || sm_module_reserve(m->head, max_T, err) != SM_OK) goto fail;
    if (sm_model_attach_penalties(m, err) != SM_OK) goto fail;

    size_t total = model_arena_values(cfg, max_T, m->body);
    if (!(m->arena = malloc(total * sizeof(sm_real)))) {
        sm_fail(err, SM_ERR_NOMEM, "model: cannot allocate %zu MiB of activations", total * sizeof(sm_real) >> 20);
        goto fail;
    }
    sm_real *p = m->arena;
    size_t T = (size_t)max_T, V = (size_t)cfg->n_classes, W = (size_t)sm_shape_width(m->body->out);
#define CARVE(ptr, n) (ptr = p, p += (n))
    CARVE(m->input, T * (size_t)cfg->in_dim);
    CARVE(m->logits, T * V);
    CARVE(m->probs, T * V);
    CARVE(m->dlogits, T * V);
    CARVE(m->losses, T);
    CARVE(m->dtop, T * W);
#undef CARVE
    return m;
fail:
    sm_model_free(m);
    return NULL;
}

void sm_model_free(sm_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_penalties; i++) m->penalties[i]->ops->destroy(m->penalties[i]);
    sm_module_free(m->body);
    sm_module_free(m->head);
    sm_params_free(&m->params);
    free(m->arena);
    free(m->fresh);
    free(m);
}

const sm_real *sm_model_forward(sm_model *m, const float *x, int T, sm_rng *rng, int train) {
    for (size_t i = 0; i < (size_t)T * m->cfg.in_dim; i++) m->input[i] = (sm_real)x[i];
    return sm_model_forward_from(m, 0, m->input, T, rng, train);
}

const sm_real *sm_model_forward_from(sm_model *m, int first, const sm_real *h, int T, sm_rng *rng, int train) {
    sm_ctx ctx = sm_ctx_make(&m->params, rng, train);
    const int n = m->n_layers;
    sm_seq_forward_range(m->body, first, n, NULL, h, T, &ctx);
    m->aux_loss = 0;
    for (int i = first; i < n; i++)
        if (m->layers[i].moe) m->aux_loss += m->layers[i].moe->route.aux_loss;
    sm_module_forward(m->head, m->logits, first < n ? sm_seq_output(m->body, n - 1) : h, T, &ctx);
    return m->logits;
}

double sm_model_loss(sm_model *m, const int *y, const unsigned char *mask, int T) {
    /* the backward starts from dlogits = (probs - onehot) / T */
    double ce = sm_loss_crossentropy(m->dlogits, m->probs, m->losses, m->logits, y, mask, T, m->cfg.n_classes, 1);
    m->penalty = 0;
    for (int i = 0; i < m->n_penalties; i++) m->penalty += m->penalties[i]->ops->apply(m->penalties[i], &m->params, T, 0);
    return ce + m->aux_loss + m->penalty;
}

/* the backward with the context's fresh flags (sm_ctx.fresh; NULL: every gradient accumulates) */
static void backward_ctx(sm_model *m, const sm_params *pv, int T, unsigned char *fresh) {
    /* penalties first: they add into parameter gradients and the routes' dprobs, which the routers'
     * backward consumes */
    for (int i = 0; i < m->n_penalties; i++) m->penalties[i]->ops->apply(m->penalties[i], pv, T, 1);
    sm_ctx ctx = sm_ctx_make(pv, NULL, 1);
    ctx.fresh = fresh;
    const int n = m->n_layers;
    memset(m->dtop, 0, sizeof(sm_real) * (size_t)T * sm_shape_width(m->body->out));
    sm_module_backward(m->head, m->dtop, m->dlogits, sm_seq_output(m->body, n - 1), T, &ctx);
    sm_module_backward(m->body, NULL, m->dtop, m->input, T, &ctx);
}

void sm_model_backward_into(sm_model *m, const sm_params *pv, int T) { backward_ctx(m, pv, T, NULL); }

void sm_model_backward(sm_model *m, int T) { sm_model_backward_into(m, &m->params, T); }

void sm_model_backward_set(sm_model *m, int T) {
    sm_params *ps = &m->params;
    if (m->n_penalties > 0) {
        sm_params_zero_grad(ps);
        backward_ctx(m, ps, T, NULL);
        return;
    }
    for (int i = 0; i < ps->n; i++) {
        m->fresh[i] = (ps->p[i].flags & SM_PARAM_GRAD_CTX) != 0;
        if (!m->fresh[i]) memset(sm_params_grad(ps, i), 0, sizeof(sm_real) * ps->p[i].numel);
    }
    backward_ctx(m, ps, T, m->fresh);
    /* a tensor the backward did not reach (none in a plain network) holds the zero it would have had */
    for (int i = 0; i < ps->n; i++)
        if (m->fresh[i]) {
            memset(sm_params_grad(ps, i), 0, sizeof(sm_real) * ps->p[i].numel);
            m->fresh[i] = 0;
        }
}

sm_status sm_model_set_dial(sm_model *m, const char *key, const char *value, sm_error *err) {
    /* check on every layer's router first (its own width: GrMoE's k_r <= d), then set */
    for (int pass = 0; pass < 2; pass++) {
        int n_moe = 0;
        for (int i = 0; i < m->n_layers; i++) {
            sm_router *r = m->layers[i].moe ? m->layers[i].moe->router : NULL;
            if (!r) continue;
            n_moe++;
            const sm_router_opt *o = sm_router_is_dial(r->ops, key) ? sm_router_find_opt(r->ops, key) : NULL;
            if (!o) return sm_fail(err, SM_ERR_ARG, "'%s' is not a dial of the %s router", key, r->cfg.name);
            sm_router_config c = r->cfg;
            if (sm_opt_set(o, &c, value)) return sm_fail(err, SM_ERR_ARG, "%s: '%s' is not a valid value", key, value);
            if (pass == 0) {
                sm_router *probe = sm_router_create(&c, r->d, err);
                if (!probe) return SM_ERR_ARG;
                sm_router_free(probe);
            } else {
                r->cfg = c;
                (void)sm_opt_set(o, &m->cfg.moe.router, value);
            }
        }
        if (!n_moe) return sm_fail(err, SM_ERR_ARG, "'%s': the model has no MoE layer", key);
    }
    return SM_OK;
}

/* the mean |activation| of each of the C channels of (B, C, P) activations, as (1, C) rows for
 * sm_dormant_fraction: the mean over examples and positions */
static double conv_dormant(const sm_real *h, int B, int C, int P, double tau) {
    sm_real *mean = calloc((size_t)C, sizeof *mean);
    if (!mean) return NAN;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int p = 0; p < P; p++) s += fabs((double)h[((size_t)b * C + c) * P + p]);
            mean[c] += (sm_real)(s / ((double)B * P));
        }
    double f = sm_dormant_fraction(mean, 1, C, tau, NULL);
    free(mean);
    return f;
}

int sm_model_dormant(sm_model *m, int T, double tau, sm_dormant_entry *out, int max) {
    int n = 0;
    for (int i = 0; i < m->n_layers && n < max; i++) {
        const sm_layer *L = &m->layers[i];
        const sm_module *mod = L->mod;
        if (L->kind == SM_LAYER_DENSE || L->kind == SM_LAYER_CONV) {
            if (m->cfg.act == SM_ACT_NONE) continue;
            const sm_real *h = sm_seq_output(m->body, i);
            double f = L->kind == SM_LAYER_CONV
                           ? conv_dormant(h, T, mod->out.c, mod->out.h * mod->out.w, tau)
                           : sm_dormant_fraction(h, T * mod->out.rows, sm_shape_width(mod->out), tau, NULL);
            out[n++] = (sm_dormant_entry){i, -1, f};
        } else if (L->moe) { /* moe and moehead layers */
            sm_moe *moe = L->moe;
            const sm_real *h = sm_moe_features(moe, NULL);
            if (!h) continue;
            const sm_route *r = &moe->route;
            const int E = moe->E, H = moe->H;
            /* (E, H) mean |h| of each expert's units over its own rows; their scores against the
             * whole layer's mean (Sokar et al.: a unit's activity relative to its layer's), so an
             * expert that is weak throughout counts as dormant, as "the experts with the highest
             * fraction of dormant neurons" (SoftMoE-in-RL Sec. 6) needs */
            sm_real *all = calloc((size_t)E * H, sizeof *all);
            double *score = malloc(sizeof(double) * (size_t)E * H);
            if (!all || !score) {
                free(all), free(score);
                continue;
            }
            for (int e = 0; e < E; e++) {
                /* an expert's rows: its assignments (sparse), or its slots of every group (soft) */
                int a0 = r->kind == SM_ROUTE_SOFT ? e * r->groups * r->slots : r->offset[e];
                int a1 = r->kind == SM_ROUTE_SOFT ? (e + 1) * r->groups * r->slots : r->offset[e + 1];
                for (int k = a0; k < a1; k++)
                    for (int u = 0; u < H; u++) all[(size_t)e * H + u] += (sm_real)(fabs((double)h[(size_t)k * H + u]) / (a1 - a0));
            }
            const double layer = sm_dormant_fraction(all, 1, E * H, tau, score); /* an expert with no rows: all 0, dormant */
            for (int e = 0; e < E && n < max; e++) {
                int d = 0;
                for (int u = 0; u < H; u++) d += score[(size_t)e * H + u] <= tau;
                out[n++] = (sm_dormant_entry){i, e, (double)d / H};
            }
            if (n < max) out[n++] = (sm_dormant_entry){i, -1, layer};
            free(all), free(score);
        }
    }
    return n;
}

int sm_model_n_moe(const sm_model *m) {
    int n = 0;
    for (int i = 0; i < m->n_layers; i++) n += m->layers[i].moe != NULL; /* moe and moehead layers */
    return n;
}

sm_moe *sm_model_moe(const sm_model *m, int idx) {
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].moe && idx-- == 0) return m->layers[i].moe;
    return NULL;
}

double sm_model_macs(const sm_model *m) { return sm_module_macs(m->body) + sm_module_macs(m->head); }

double sm_model_update_macs(const sm_model *m, int B, int forwards) {
    const double f = sm_model_macs(m);
    const double first = sm_seq_count(m->body) > 0 ? sm_module_macs(sm_seq_child(m->body, 0)) : sm_module_macs(m->head);
    return (double)B * (forwards * f + 2 * f - first);
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
