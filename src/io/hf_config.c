/* Hugging Face config.json and model.safetensors.index.json parsers (see include/specmoe/hf.h).
 * Both read outside data: every value is type- and range-checked before use, a key given twice is
 * refused (src/io/json_util.c), and both have a libFuzzer target (fuzz/fuzz_hf.c). Kept apart from src/hf.c so the fuzz build needs only cJSON. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/io/hf.h"
#include "specmoe/io/json_util.h"

/* ---------------------------------------------------------------------------------------------- */
/* config.json */

/* The supported families: where E and I live in config.json, the block and matrix names. */
static const struct family {
    const char *type, *e_key, *i_key, *block, *w0, *w1, *w2, *shared;
    int qwen, deepseek, norm_default; /* deepseek: 1 (v1, v2) or 3 (v3, whose defaults differ) */
} families[] = {
    {"mixtral", "num_local_experts", "intermediate_size", "block_sparse_moe", "w1", "w3", "w2", NULL, 0, 0, 1},
    {"olmoe", "num_experts", "intermediate_size", "mlp", "gate_proj", "up_proj", "down_proj", NULL, 0, 0, 0},
    {"qwen2_moe", "num_experts", "moe_intermediate_size", "mlp", "gate_proj", "up_proj", "down_proj", "shared_expert", 1, 0, 0},
    {"qwen3_moe", "num_experts", "moe_intermediate_size", "mlp", "gate_proj", "up_proj", "down_proj", NULL, 1, 0, 0},
    {"deepseek", "n_routed_experts", "moe_intermediate_size", "mlp", "gate_proj", "up_proj", "down_proj", "shared_experts", 0, 1, 0},
    {"deepseek_v2", "n_routed_experts", "moe_intermediate_size", "mlp", "gate_proj", "up_proj", "down_proj", "shared_experts", 0, 1, 0},
    {"deepseek_v3", "n_routed_experts", "moe_intermediate_size", "mlp", "gate_proj", "up_proj", "down_proj", "shared_experts", 0, 3, 1},
};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

/* An integer config entry in [lo, hi]: 1 found, 0 absent (or JSON null), -1 present but invalid. */
static int cfg_int(const cJSON *root, const char *key, long lo, long hi, int *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j)) return -1;
    double v = j->valuedouble;
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v)) return -1;
    *out = (int)v;
    return 1;
}

static sm_status cfg_need(const cJSON *root, const char *key, long lo, long hi, int *out, int dflt, int required,
                          const char *what, sm_error *err) {
    int r = cfg_int(root, key, lo, hi, out);
    if (r == 1) return SM_OK;
    if (r == 0 && !required) {
        *out = dflt;
        return SM_OK;
    }
    return sm_fail(err, SM_ERR_FORMAT, "%s: \"%s\" %s (expected an integer in [%ld, %ld])", what, key,
                   r == 0 ? "is missing" : "is not valid", lo, hi);
}

void sm_hf_config_free(sm_hf_config *cfg) {
    if (!cfg) return;
    free(cfg->is_moe);
    memset(cfg, 0, sizeof *cfg);
}

sm_status sm_hf_config_parse(sm_hf_config *cfg, const char *text, size_t n, const char *what, sm_error *err) {
    if (!cfg || (!text && n)) return sm_fail(err, SM_ERR_ARG, "sm_hf_config_parse: NULL argument");
    memset(cfg, 0, sizeof *cfg);
    if (!what) what = "config.json";
    cJSON *root = cJSON_ParseWithLength(text ? text : "", n);
    if (!root) return sm_fail(err, SM_ERR_FORMAT, "%s: not valid JSON", what);
    sm_status st = SM_OK;
    if (!cJSON_IsObject(root)) {
        st = sm_fail(err, SM_ERR_FORMAT, "%s: not a JSON object", what);
        goto done;
    }
    if ((st = sm_json_check_unique_keys(root, what, err)) != SM_OK) goto done;
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(jt) || !jt->valuestring) {
        st = sm_fail(err, SM_ERR_FORMAT, "%s: \"model_type\" is missing or not a string", what);
        goto done;
    }
    const struct family *f = NULL;
    for (int i = 0; i < N_FAMILIES; i++)
        if (strcmp(jt->valuestring, families[i].type) == 0) f = &families[i];
    if (!f) {
        char shown[40];
        snprintf(shown, sizeof shown, "%.32s", jt->valuestring);
        for (char *p = shown; *p; p++)
            if ((unsigned char)*p < 0x20) *p = '?';
        st = sm_fail(err, SM_ERR_FORMAT,
                     "%s: model_type '%s' is not a supported MoE layout (mixtral, olmoe, qwen2_moe, qwen3_moe, "
                     "deepseek, deepseek_v2, deepseek_v3)", what, shown);
        goto done;
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", f->type);
    snprintf(cfg->expert_key, sizeof cfg->expert_key, "%s", f->e_key);
    cfg->block = f->block;
    cfg->w[0] = f->w0;
    cfg->w[1] = f->w1;
    cfg->w[2] = f->w2;
    if ((st = cfg_need(root, "hidden_size", 1, 1 << 17, &cfg->d, 0, 1, what, err)) != SM_OK ||
        (st = cfg_need(root, "num_hidden_layers", 1, 1 << 12, &cfg->n_layers, 0, 1, what, err)) != SM_OK ||
        (st = cfg_need(root, f->e_key, 1, 1 << 16, &cfg->E, 0, 1, what, err)) != SM_OK ||
        (st = cfg_need(root, f->i_key, 1, 1 << 20, &cfg->inter, 0, 1, what, err)) != SM_OK ||
        (st = cfg_need(root, "num_experts_per_tok", 1, cfg->E, &cfg->k, 0, 1, what, err)) != SM_OK)
        goto done;
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(root, "norm_topk_prob");
    cfg->norm_topk = f->norm_default;
    if (jn && !cJSON_IsNull(jn)) {
        if (!cJSON_IsBool(jn)) {
            st = sm_fail(err, SM_ERR_FORMAT, "%s: \"norm_topk_prob\" is not true or false", what);
            goto done;
        }
        cfg->norm_topk = cJSON_IsTrue(jn);
    }
    cfg->is_moe = calloc((size_t)cfg->n_layers, 1);
    if (!cfg->is_moe) {
        st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", what);
        goto done;
    }
    for (int l = 0; l < cfg->n_layers; l++) cfg->is_moe[l] = 1;
    cfg->n_group = cfg->topk_group = 1;
    if (f->qwen) {
        int step, shared_i;
        if ((st = cfg_need(root, "decoder_sparse_step", 1, 1 << 12, &step, 1, 0, what, err)) != SM_OK ||
            (st = cfg_need(root, "shared_expert_intermediate_size", 0, 1 << 20, &shared_i, 0, 0, what, err)) != SM_OK)
            goto done;
        if (f->shared && shared_i > 0) {
            cfg->shared = f->shared;
            cfg->n_shared_rows = shared_i;
        }
        const cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
        if (only && !cJSON_IsNull(only) && !cJSON_IsArray(only)) {
            st = sm_fail(err, SM_ERR_FORMAT, "%s: \"mlp_only_layers\" is not a list", what);
            goto done;
        }
        for (int l = 0; l < cfg->n_layers; l++) cfg->is_moe[l] = (l + 1) % step == 0;
        for (const cJSON *e = only ? only->child : NULL; e; e = e->next) {
            double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
            if (!(v >= 0 && v < cfg->n_layers) || v != floor(v)) {
                st = sm_fail(err, SM_ERR_FORMAT, "%s: \"mlp_only_layers\" holds a value that is not a layer index", what);
                goto done;
            }
            cfg->is_moe[(int)v] = 0;
        }
    }
    if (f->deepseek) {
        /* absent keys take transformers' defaults: DeepseekV3Config has one shared expert, three dense
         * layers, 8 groups (top 4) and sigmoid scores; V2 none of these */
        const int v3 = f->deepseek == 3, g_def = v3 && cfg->E % 8 == 0 ? 8 : 1;
        int n_shared, first_dense, freq;
        if ((st = cfg_need(root, "n_shared_experts", 0, 1 << 10, &n_shared, v3, 0, what, err)) != SM_OK ||
            (st = cfg_need(root, "first_k_dense_replace", 0, cfg->n_layers, &first_dense,
                           v3 ? (cfg->n_layers < 3 ? cfg->n_layers : 3) : 0, 0, what, err)) != SM_OK ||
            (st = cfg_need(root, "moe_layer_freq", 1, 1 << 12, &freq, 1, 0, what, err)) != SM_OK ||
            (st = cfg_need(root, "n_group", 1, cfg->E, &cfg->n_group, g_def, 0, what, err)) != SM_OK ||
            (st = cfg_need(root, "topk_group", 1, cfg->n_group, &cfg->topk_group, g_def > 1 ? 4 : 1, 0, what, err)) != SM_OK)
            goto done;
        cfg->sigmoid = v3;
        if ((long)n_shared * cfg->inter > (1L << 22)) {
            st = sm_fail(err, SM_ERR_FORMAT, "%s: n_shared_experts * moe_intermediate_size is implausibly large", what);
            goto done;
        }
        if (n_shared > 0) {
            cfg->shared = f->shared;
            cfg->n_shared_rows = n_shared * cfg->inter;
        }
        for (int l = 0; l < cfg->n_layers; l++) cfg->is_moe[l] = l >= first_dense && l % freq == 0;
        const cJSON *sf = cJSON_GetObjectItemCaseSensitive(root, "scoring_func");
        if (sf && !cJSON_IsNull(sf)) {
            if (!cJSON_IsString(sf) || !sf->valuestring ||
                (strcmp(sf->valuestring, "softmax") != 0 && strcmp(sf->valuestring, "sigmoid") != 0)) {
                st = sm_fail(err, SM_ERR_FORMAT, "%s: \"scoring_func\" is not \"softmax\" or \"sigmoid\"", what);
                goto done;
            }
            cfg->sigmoid = strcmp(sf->valuestring, "sigmoid") == 0;
        }
    }
done:
    cJSON_Delete(root);
    if (st != SM_OK) sm_hf_config_free(cfg);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* model.safetensors.index.json */

void sm_hf_index_free(char **names, char **files, int count) {
    for (int i = 0; i < count; i++) {
        if (names) free(names[i]);
        if (files) free(files[i]);
    }
    free(names);
    free(files);
}

/* A shard name must stay inside the model directory: a plain file name ending in .safetensors. */
static int plain_shard_name(const char *s) {
    size_t n = strlen(s);
    if (n <= 12 || n > 255 || strcmp(s + n - 12, ".safetensors") != 0 || s[0] == '.') return 0;
    for (const char *p = s; *p; p++)
        if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20) return 0;
    return 1;
}

sm_status sm_hf_index_parse(const char *text, size_t n, const char *what, char ***names_out, char ***files_out,
                            int *count, sm_error *err) {
    *names_out = *files_out = NULL;
    *count = 0;
    if (!what) what = "model.safetensors.index.json";
    cJSON *root = cJSON_ParseWithLength(text ? text : "", n);
    if (!root) return sm_fail(err, SM_ERR_FORMAT, "%s: not valid JSON", what);
    sm_status st = SM_OK;
    char **names = NULL, **files = NULL;
    int k = 0, total = 0;
    if ((st = sm_json_check_unique_keys(root, what, err)) != SM_OK) goto done;
    const cJSON *map = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) {
        st = sm_fail(err, SM_ERR_FORMAT, "%s: no \"weight_map\" object", what);
        goto done;
    }
    total = cJSON_GetArraySize(map);
    if (total < 1 || total > (1 << 24)) {
        st = sm_fail(err, SM_ERR_FORMAT, "%s: \"weight_map\" has %d entries", what, total);
        goto done;
    }
    names = calloc((size_t)total, sizeof *names);
    files = calloc((size_t)total, sizeof *files);
    if (!names || !files) {
        st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for %d entries", what, total);
        goto done;
    }
    for (const cJSON *e = map->child; e && k < total; e = e->next) {
        if (!e->string || !e->string[0] || !cJSON_IsString(e) || !e->valuestring) {
            st = sm_fail(err, SM_ERR_FORMAT, "%s: weight_map entry %d is not a tensor name mapped to a file name", what, k);
            goto done;
        }
        if (!plain_shard_name(e->valuestring)) {
            char a[88], b[88];
            snprintf(a, sizeof a, "%.80s", e->string);
            snprintf(b, sizeof b, "%.80s", e->valuestring);
            for (char *p = a; *p; p++) *p = (unsigned char)*p < 0x20 ? '?' : *p;
            for (char *p = b; *p; p++) *p = (unsigned char)*p < 0x20 ? '?' : *p;
            st = sm_fail(err, SM_ERR_FORMAT, "%s: weight_map maps '%s' to '%s', not a .safetensors file in the model "
                         "directory", what, a, b);
            goto done;
        }
        names[k] = strdup(e->string);
        files[k] = strdup(e->valuestring);
        k++;
        if (!names[k - 1] || !files[k - 1]) {
            st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", what);
            goto done;
        }
    }
done:
    cJSON_Delete(root);
    if (st != SM_OK) {
        sm_hf_index_free(names, files, names ? total : 0);
        return st;
    }
    *names_out = names;
    *files_out = files;
    *count = k;
    return SM_OK;
}

