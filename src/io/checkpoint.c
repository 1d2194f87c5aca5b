/* Checkpoints in safetensors (see include/specmoe/checkpoint.h). */
#include "specmoe/io/checkpoint.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/io/safetensors.h"

/* Parameters are sm_real in memory (double in the gradient-check build); files are F32. */
static float *to_f32(const sm_real *x, size_t n) {
    float *f = malloc((n ? n : 1) * sizeof(float));
    if (f)
        for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

/* The generic writer: every set's parameters under "<prefix><name>", its optimiser moments under
 * "<prefix>optim.m.<name>" / "<prefix>optim.v.<name>", and the key/value metadata. */
sm_status sm_checkpoint_write(const char *path, const sm_ckpt_set *sets, int n_sets, const sm_st_meta *meta, int n_meta,
                              sm_error *err) {
    return sm_checkpoint_write_blobs(path, sets, n_sets, meta, n_meta, NULL, 0, err);
}

sm_status sm_checkpoint_read_blob(const sm_safetensors *st, const char *path, const char *name, void *out, size_t bytes,
                                  sm_error *err) {
    const sm_st_tensor *t = sm_safetensors_find(st, name);
    if (!t || t->dtype != SM_DT_U8 || t->ndim != 1 || (size_t)t->shape[0] != bytes)
        return sm_fail(err, SM_ERR_FORMAT, "%s: state '%s' is missing or not %zu bytes (a checkpoint of another run?)", path,
                       name, bytes);
    return sm_st_read_bytes(st, t, 0, bytes, out, err);
}

sm_status sm_checkpoint_write_blobs(const char *path, const sm_ckpt_set *sets, int n_sets, const sm_st_meta *meta,
                                    int n_meta, const sm_ckpt_blob *blobs, int n_blobs, sm_error *err) {
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_status st = SM_OK;
    int n_blocks = 0, n_names = 0, cap = 0;
    for (int k = 0; k < n_sets; k++) cap += sets[k].ps->n * 3;
    /* float copies of data, m, v of every set: one block each, freed after the write */
    float **blocks = calloc((size_t)n_sets * 3 + 1, sizeof *blocks);
    char **names = calloc((size_t)cap + 1, sizeof *names);
    if (!blocks || !names) st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    for (int k = 0; k < n_sets && st == SM_OK; k++) {
        const sm_params *ps = sets[k].ps;
        const sm_optim *opt = sets[k].opt;
        const sm_real *src[3] = {ps->data, opt ? opt->m : NULL, opt ? opt->v : NULL};
        const char *pre[3] = {"", "optim.m.", "optim.v."};
        for (int g = 0; g < (opt ? 3 : 1) && st == SM_OK; g++) {
            float *f = blocks[n_blocks++] = to_f32(src[g], ps->total);
            if (!f) {
                st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            for (int i = 0; i < ps->n && st == SM_OK; i++) {
                const sm_param *q = &ps->p[i];
                size_t len = strlen(sets[k].prefix) + strlen(pre[g]) + strlen(q->name) + 1;
                char *nm = names[n_names++] = malloc(len);
                if (!nm) {
                    st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
                    break;
                }
                snprintf(nm, len, "%s%s%s", sets[k].prefix, pre[g], q->name);
                st = sm_st_writer_add(&w, nm, q->ndim, q->shape, f + q->offset, err);
            }
        }
    }
    for (int i = 0; i < n_blobs && st == SM_OK; i++) st = sm_st_writer_add_u8(&w, blobs[i].name, blobs[i].bytes, blobs[i].data, err);
    for (int i = 0; i < n_meta && st == SM_OK; i++) st = sm_st_writer_meta(&w, meta[i].key, meta[i].value, err);
    if (st == SM_OK) st = sm_st_writer_write(&w, path, err);
    sm_st_writer_free(&w);
    for (int i = 0; names && i < n_names; i++) free(names[i]);
    for (int i = 0; blocks && i < n_blocks; i++) free(blocks[i]);
    free(names);
    free(blocks);
    return st;
}

sm_status sm_checkpoint_save(const char *path, const sm_model *m, const sm_optim *opt, const sm_train_state *ts,
                             sm_error *err) {
    char *model_json = sm_model_config_to_json(&m->cfg), *train_json = NULL;
    if (ts) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", (double)ts->step);
        cJSON_AddNumberToObject(o, "epoch", ts->epoch);
        cJSON_AddNumberToObject(o, "pos", ts->pos);
        cJSON_AddNumberToObject(o, "optim_step", opt ? (double)opt->step : 0);
        cJSON_AddStringToObject(o, "optimizer", opt ? sm_opt_name(opt->cfg.kind) : "none");
        cJSON *rng = cJSON_AddArrayToObject(o, "rng");
        for (int i = 0; i < 4; i++) {
            char b[32];
            snprintf(b, sizeof b, "%" PRIu64, ts->rng.s[i]);
            cJSON_AddItemToArray(rng, cJSON_CreateString(b));
        }
        if (ts->classes[0]) cJSON_AddStringToObject(o, "classes", ts->classes);
        if (ts->best_step >= 0) {
            cJSON_AddNumberToObject(o, "best_step", (double)ts->best_step);
            cJSON_AddNumberToObject(o, "best_score", ts->best_score);
        }
        train_json = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    }
    sm_st_meta meta[5] = {{"format", "specmoe"}, {"version", "1"}, {"model", model_json ? model_json : "{}"},
                          {"train", train_json ? train_json : "{}"}, {"settings", ts && ts->settings ? (char *)ts->settings : ""}}; /* the writer copies it */
    sm_ckpt_set set = {"", &m->params, (sm_optim *)opt}; /* the writer only reads the moments */
    sm_status st = sm_checkpoint_write(path, &set, 1, meta, !ts ? 3 : ts->settings ? 5 : 4, err);
    free(model_json);
    free(train_json);
    return st;
}

static sm_status read_model_meta(const sm_safetensors *st, const char *path, sm_model_config *cfg, sm_error *err) {
    const char *fmt = sm_safetensors_meta(st, "format");
    const char *json = sm_safetensors_meta(st, "model");
    if (!fmt || strcmp(fmt, "specmoe") != 0 || !json)
        return sm_fail(err, SM_ERR_FORMAT, "%s: not a specmoe checkpoint (no __metadata__ format/model)", path);
    sm_error e2;
    if (sm_model_config_from_json(cfg, json, &e2) != SM_OK)
        return sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.model: %s", path, e2.msg);
    return SM_OK;
}

sm_status sm_checkpoint_read_meta(const char *path, const char *key, char **value, sm_error *err) {
    *value = NULL;
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, path, err);
    if (s != SM_OK) return s;
    const char *v = sm_safetensors_meta(&st, key);
    if (v && !(*value = strdup(v))) s = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    sm_safetensors_free(&st);
    return s;
}

sm_status sm_checkpoint_read_config(const char *path, sm_model_config *cfg, sm_error *err) {
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, path, err);
    if (s != SM_OK) return s;
    s = read_model_meta(&st, path, cfg, err);
    sm_safetensors_free(&st);
    return s;
}

static sm_status load_tensor(const sm_safetensors *st, const char *path, const char *name, const sm_param *q,
                             sm_real *dst, float *tmp, sm_error *err) {
    const sm_st_tensor *t = sm_safetensors_find(st, name);
    if (!t) return sm_fail(err, SM_ERR_MISMATCH, "%s: tensor '%s' missing", path, name);
    int same = t->ndim == q->ndim;
    for (int d = 0; same && d < q->ndim; d++) same = t->shape[d] == q->shape[d];
    if (!same) return sm_fail(err, SM_ERR_MISMATCH, "%s: tensor '%s' has a different shape than the model's", path, name);
    sm_status s = sm_st_tensor_to_f32(t, tmp, q->numel, err);
    if (s != SM_OK) return s;
    /* a NaN or Inf parameter would evaluate to loss nan and rank every expert equal: refuse it */
    for (size_t i = 0; i < q->numel; i++)
        if (!isfinite(tmp[i]))
            return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value (%g at element %zu)", path, name,
                           (double)tmp[i], i);
    if (!dst) return SM_OK; /* validation only */
    for (size_t i = 0; i < q->numel; i++) dst[i] = (sm_real)tmp[i];
    return SM_OK;
}

static sm_status parse_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsString(v)) return SM_ERR_FORMAT;
    char *end;
    unsigned long long x = strtoull(v->valuestring, &end, 10);
    if (*end || !*v->valuestring) return SM_ERR_FORMAT;
    *out = (uint64_t)x;
    return SM_OK;
}

static sm_status read_train_state(const sm_safetensors *st, const char *path, sm_train_state *ts, long *optim_step,
                                  sm_error *err) {
    const char *json = sm_safetensors_meta(st, "train");
    if (!json) return sm_fail(err, SM_ERR_MISMATCH, "%s: no training state (an inference-only checkpoint?)", path);
    cJSON *o = cJSON_Parse(json);
    sm_status s = SM_OK;
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step"), *epoch = cJSON_GetObjectItemCaseSensitive(o, "epoch");
    const cJSON *pos = cJSON_GetObjectItemCaseSensitive(o, "pos"), *os = cJSON_GetObjectItemCaseSensitive(o, "optim_step");
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(o, "rng");
    const cJSON *classes = cJSON_GetObjectItemCaseSensitive(o, "classes"); /* optional */
    /* optional, together: the best checkpoint so far */
    const cJSON *best_step = cJSON_GetObjectItemCaseSensitive(o, "best_step"), *best_score = cJSON_GetObjectItemCaseSensitive(o, "best_score");
    if (classes && (!cJSON_IsString(classes) || strlen(classes->valuestring) >= sizeof ts->classes)) {
        s = sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.train.classes is not a class list", path);
    } else if ((best_step || best_score) && (!cJSON_IsNumber(best_step) || !cJSON_IsNumber(best_score) ||
               !(best_step->valuedouble >= 0 && best_step->valuedouble <= 1e15) || !isfinite(best_score->valuedouble))) {
        s = sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.train.best_step/best_score are malformed", path);
    } else if (!cJSON_IsObject(o) || !cJSON_IsNumber(step) || !cJSON_IsNumber(epoch) || !cJSON_IsNumber(pos) ||
        !cJSON_IsNumber(os) || !cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4 || !(step->valuedouble >= 0) ||
        !(epoch->valuedouble >= 0) || !(pos->valuedouble >= 0) || !(os->valuedouble >= 0) || step->valuedouble > 1e15 ||
        os->valuedouble > 1e15 || epoch->valuedouble > 2e9 || pos->valuedouble > 2e9) {
        s = sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.train is malformed", path);
    } else {
        ts->step = (long)step->valuedouble;
        ts->epoch = (int)epoch->valuedouble;
        ts->pos = (int)pos->valuedouble;
        *optim_step = (long)os->valuedouble;
        snprintf(ts->classes, sizeof ts->classes, "%s", classes ? classes->valuestring : "");
        ts->settings = NULL; /* not parsed here: sm_checkpoint_read_meta(path, "settings") */
        ts->best_step = best_step ? (long)best_step->valuedouble : -1;
        ts->best_score = best_score ? best_score->valuedouble : 0;
        for (int i = 0; i < 4 && s == SM_OK; i++)
            if (parse_u64(cJSON_GetArrayItem(rng, i), &ts->rng.s[i]) != SM_OK)
                s = sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.train.rng[%d] is not a u64", path, i);
    }
    cJSON_Delete(o);
    return s;
}

sm_status sm_checkpoint_read_classes(const char *path, char *buf, size_t n, sm_error *err) {
    if (n) buf[0] = 0;
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, path, err);
    if (s != SM_OK) return s;
    if (sm_safetensors_meta(&st, "train")) { /* an inference-only checkpoint has none */
        sm_train_state ts;
        long optim_step;
        s = read_train_state(&st, path, &ts, &optim_step, err);
        if (s == SM_OK && strlen(ts.classes) >= n) s = sm_fail(err, SM_ERR_ARG, "%s: class list longer than the buffer", path);
        if (s == SM_OK) memcpy(buf, ts.classes, strlen(ts.classes) + 1);
    }
    sm_safetensors_free(&st);
    return s;
}

sm_status sm_checkpoint_read_sets(const sm_safetensors *st, const char *path, const sm_ckpt_set *sets, int n_sets,
                                  int (*skip)(const char *name), sm_error *err) {
    size_t maxn = 1;
    for (int k = 0; k < n_sets; k++) maxn = sets[k].ps->total > maxn ? sets[k].ps->total : maxn;
    float *tmp = malloc(maxn * sizeof(float));
    if (!tmp) return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    sm_status s = SM_OK;
    char name[SM_NAME_MAX + 64];
    /* validate every tensor before touching anything: a failed load leaves every set as it was */
    for (int pass = 0; pass < 2 && s == SM_OK; pass++) {
        const int copy = pass == 1;
        for (int k = 0; k < n_sets && s == SM_OK; k++) {
            const sm_params *ps = sets[k].ps;
            sm_optim *opt = sets[k].opt;
            for (int i = 0; i < ps->n && s == SM_OK; i++) {
                if (skip && skip(ps->p[i].name)) continue;
                snprintf(name, sizeof name, "%s%s", sets[k].prefix, ps->p[i].name);
                s = load_tensor(st, path, name, &ps->p[i], copy ? ps->data + ps->p[i].offset : NULL, tmp, err);
                for (int g = 0; g < 2 && opt && s == SM_OK; g++) {
                    snprintf(name, sizeof name, "%soptim.%s.%s", sets[k].prefix, g ? "v" : "m", ps->p[i].name);
                    s = load_tensor(st, path, name, &ps->p[i], copy ? (g ? opt->v : opt->m) + ps->p[i].offset : NULL, tmp,
                                    err);
                }
            }
        }
    }
    free(tmp);
    return s;
}

/* the router-ev descriptors of a top-k checkpoint loaded under the ev router are built later */
static int is_ev_descriptor(const char *name) {
    size_t nl = strlen(name);
    return nl > 10 && !strcmp(name + nl - 10, ".router.ev");
}

sm_status sm_checkpoint_load(const char *path, sm_model *m, sm_optim *opt, sm_train_state *ts, sm_error *err) {
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, path, err);
    if (s != SM_OK) return s;
    sm_model_config cfg;
    s = read_model_meta(&st, path, &cfg, err);
    char *a = NULL, *b = NULL;
    int convert_ev = 0;
    if (s == SM_OK) {
        /* a trained top-k model loads under the SSMoE "ev" router: same learned router weight, the
         * descriptors are then built from the experts (sm_model_build_ev) */
        if (!strcmp(m->cfg.moe.router.name, "ev") && !strcmp(cfg.moe.router.name, "topk")) {
            (void)sm_router_config_set(&cfg.moe.router, "ev", NULL);
            convert_ev = 1;
        }
        /* the routers' inference-time dials (sm_router_ops.dials: GrMoE's alpha, ev's mix, the
         * softmax temperature): a checkpoint loads under any value of them, everything else must
         * match */
        const sm_router_ops *rops = sm_router_find(cfg.moe.router.name);
        if (rops && !strcmp(cfg.moe.router.name, m->cfg.moe.router.name)) {
            for (int i = -1; i < rops->n_opts; i++) {
                const sm_router_opt *o = i < 0 ? sm_router_find_opt(rops, "temperature") : &rops->opts[i];
                if (o && sm_router_is_dial(rops, o->key)) sm_opt_copy(o, &cfg.moe.router, &m->cfg.moe.router);
            }
        }
        a = sm_model_config_to_json(&cfg);
        b = sm_model_config_to_json(&m->cfg);
        if (!a || !b || strcmp(a, b) != 0)
        {
            /* name the first differing field: the JSON texts share a prefix up to it */
            size_t i = 0;
            while (a && b && a[i] && a[i] == b[i]) i++;
            size_t from = i > 40 ? i - 40 : 0;
            s = sm_fail(err, SM_ERR_MISMATCH, "%s: the checkpoint's model does not match the requested one; they differ "
                        "at ...%.60s (checkpoint) vs ...%.60s (requested)", path, a ? a + from : "?", b ? b + from : "?");
        }
    }
    free(a);
    free(b);
    if (ts && s == SM_OK) { /* the training state is checked before any tensor is copied */
        sm_train_state probe;
        long optim_step = 0;
        s = read_train_state(&st, path, &probe, &optim_step, err);
    }
    sm_ckpt_set set = {"", &m->params, opt};
    if (s == SM_OK) s = sm_checkpoint_read_sets(&st, path, &set, 1, convert_ev ? is_ev_descriptor : NULL, err);
    if (ts && s == SM_OK) {
        long optim_step = 0;
        s = read_train_state(&st, path, ts, &optim_step, err);
        if (opt && s == SM_OK) opt->step = optim_step;
    }
    sm_safetensors_free(&st);
    return s;
}
