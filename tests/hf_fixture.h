/* Small Hugging Face MoE checkpoints for the tests, in every layout src/hf.c reads.
 *
 * The weights are "logical" first - router (E, d) and, per expert, gate (I, d), up (I, d) and down
 * (d, I) exactly as a per-expert checkpoint stores them - each filled from its own seeded stream, so a
 * test can recompute any of them without reading the files (hf_fix_logical). The writer then lays
 * them out as the model type and storage ask (per-expert tensors, fused (E, 2I, d) or (E, d, 2I)),
 * adds the dense parts of a decoder (embeddings, norms, one attention matrix, dense MLP layers where
 * the config makes a layer dense), spreads the layers over the shards and writes config.json and,
 * when sharded, model.safetensors.index.json. With bf16 the values are rounded to BF16 first, so
 * the logical weights equal what is stored.
 *
 * `breakage` spoils one thing for the refusal tests: "missing-tensor", "config-mismatch",
 * "missing-shard", "index-extra", "extra-expert" (a tensor "experts.01.*"), "router-inf",
 * "config-fewer-layers" (num_hidden_layers one below the layers written); or adds
 * "router-bias" (a gate.bias (E) per MoE layer). Used by tests/test_hf.c and by tests/hf_gen.c (for the CLI tests).
 */
#ifndef SPECMOE_HF_FIXTURE_H
#define SPECMOE_HF_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specmoe/core/core.h"
#include "specmoe/io/safetensors.h"

typedef struct {
    const char *type;     /* mixtral | olmoe | qwen2_moe | qwen3_moe | deepseek_v3 */
    const char *storage;  /* split | fused | fused_t */
    int d, I, E, k, layers, shards, bf16;
    unsigned long long seed;
    const char *breakage; /* NULL or one of the above */
} hf_spec;

/* the first layer is dense in the qwen2_moe (mlp_only_layers) and deepseek_v3 (first_k_dense_replace) fixtures */
static inline int hf_fix_is_moe(const hf_spec *s, int L) {
    return !(L == 0 && (!strcmp(s->type, "qwen2_moe") || !strcmp(s->type, "deepseek_v3")));
}
static inline const char *hf_fix_block(const hf_spec *s) { return strcmp(s->type, "mixtral") ? "mlp" : "block_sparse_moe"; }
static inline const char *hf_fix_w(const hf_spec *s, int j) {
    static const char *mix[3] = {"w1", "w3", "w2"}, *std[3] = {"gate_proj", "up_proj", "down_proj"};
    return strcmp(s->type, "mixtral") ? std[j] : mix[j];
}
static inline int hf_fix_shared_rows(const hf_spec *s) {
    if (!strcmp(s->type, "qwen2_moe")) return 2 * s->I;
    if (!strcmp(s->type, "deepseek_v3")) return s->I; /* n_shared_experts 1 */
    return 0;
}

static inline int hf_fix_broken(const hf_spec *s, const char *what) { return s->breakage && !strcmp(s->breakage, what); }

static inline float hf_fix_round(const hf_spec *s, float v) {
    if (!s->bf16) return v;
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* round to nearest even */
    memcpy(&v, &u, 4);
    return v;
}

/* n values of the stream `tag` (FNV-1a of the tag mixed with the seed), scaled, BF16-rounded if asked. */
static inline void hf_fix_fill(const hf_spec *s, const char *tag, size_t n, double scale, float *out) {
    uint64_t h = 1469598103934665603ull ^ s->seed;
    for (const char *p = tag; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    sm_rng r;
    sm_rng_seed(&r, h);
    for (size_t i = 0; i < n; i++) out[i] = hf_fix_round(s, (float)(sm_rng_normal(&r) * scale));
}

/* Logical weights of MoE layer L: j = -1 router (E, d); j = 0 gate (I, d), 1 up (I, d), 2 down (d, I)
 * of expert e. */
static inline void hf_fix_logical(const hf_spec *s, int L, int e, int j, float *out) {
    char tag[64];
    if (j < 0) {
        snprintf(tag, sizeof tag, "L%d.router", L);
        hf_fix_fill(s, tag, (size_t)s->E * s->d, 1.0, out);
    } else {
        snprintf(tag, sizeof tag, "L%d.e%d.m%d", L, e, j);
        hf_fix_fill(s, tag, (size_t)s->I * s->d, 0.1, out);
    }
}

/* ---- the writer ---- */

typedef struct {
    char name[160];
    int ndim;
    int64_t shape[3];
    float *data;
    int shard;
} hf_fix_tensor;

typedef struct {
    hf_fix_tensor *t;
    int n, cap;
} hf_fix_list;

static inline float *hf_fix_add(hf_fix_list *l, int shard, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = realloc(l->t, sizeof *l->t * (size_t)l->cap);
    }
    hf_fix_tensor *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    size_t n = (size_t)a * (ndim > 1 ? (size_t)b : 1) * (ndim > 2 ? (size_t)c : 1);
    t->data = calloc(n ? n : 1, sizeof(float));
    t->shard = shard;
    return t->data;
}

static inline size_t hf_fix_numel(const hf_fix_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* A tensor of "other" weights: filled from its own name's stream. */
static inline void hf_fix_other(const hf_spec *s, hf_fix_list *l, int shard, const char *name, int ndim, int64_t a, int64_t b) {
    float *p = hf_fix_add(l, shard, name, ndim, a, b, 0);
    hf_fix_fill(s, name, (size_t)a * (ndim > 1 ? (size_t)b : 1), 0.05, p);
}

static inline int hf_fix_write_shard(const hf_spec *s, const hf_fix_list *l, int shard, const char *path) {
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err;
    sm_st_writer_meta(&w, "format", "pt", &err);
    for (int i = 0; i < l->n; i++)
        if (l->t[i].shard == shard && sm_st_writer_add_layout(&w, l->t[i].name, s->bf16 ? SM_DT_BF16 : SM_DT_F32, l->t[i].ndim,
                                                              l->t[i].shape, &err) != SM_OK)
            return -1;
    sm_st_stream st;
    if (sm_st_stream_begin(&st, &w, path, &err) != SM_OK) return -1;
    for (int i = 0; i < l->n; i++) {
        if (l->t[i].shard != shard) continue;
        size_t n = hf_fix_numel(&l->t[i]);
        if (!s->bf16) {
            if (sm_st_stream_write_f32(&st, l->t[i].data, n, &err) != SM_OK) return -1;
            continue;
        }
        uint8_t *b = malloc(2 * (n ? n : 1)); /* BF16: the high half of each (already rounded) float */
        for (size_t k = 0; k < n; k++) {
            uint32_t u;
            memcpy(&u, &l->t[i].data[k], 4);
            b[2 * k] = (uint8_t)(u >> 16);
            b[2 * k + 1] = (uint8_t)(u >> 24);
        }
        int bad = sm_st_stream_write(&st, b, 2 * n, &err) != SM_OK;
        free(b);
        if (bad) return -1;
    }
    int rc = sm_st_stream_finish(&st, &err) == SM_OK ? 0 : -1;
    sm_st_writer_free(&w);
    return rc;
}

static inline void hf_fix_shard_name(const hf_spec *s, int i, char *out, size_t n) {
    if (s->shards == 1) snprintf(out, n, "model.safetensors");
    else snprintf(out, n, "model-%05d-of-%05d.safetensors", i + 1, s->shards);
}

/* Writes the model directory dir (which must exist). Returns 0 on success. */
static inline int hf_fixture_write(const char *dir, const hf_spec *s) {
    const int d = s->d, I = s->I, E = s->E, V = 24;
    const int E_cfg = s->breakage && !strcmp(s->breakage, "config-mismatch") ? E + 1 : E;
    hf_fix_list l = {0};
    char name[160], path[512];
    const char *B = hf_fix_block(s);
    hf_fix_other(s, &l, 0, "model.embed_tokens.weight", 2, V, d);
    for (int L = 0; L < s->layers; L++) {
        int sh = L % s->shards;
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", L);
        hf_fix_other(s, &l, sh, name, 1, d, 0);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", L);
        hf_fix_other(s, &l, sh, name, 2, d, d);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", L);
        hf_fix_other(s, &l, sh, name, 1, d, 0);
        if (!hf_fix_is_moe(s, L)) { /* a dense SwiGLU MLP of width 2I */
            for (int j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.%s.weight", L, hf_fix_w(s, j));
                hf_fix_other(s, &l, sh, name, 2, j < 2 ? 2 * I : d, j < 2 ? d : 2 * I);
            }
            continue;
        }
        snprintf(name, sizeof name, "model.layers.%d.%s.gate.weight", L, B);
        float *rw = hf_fix_add(&l, sh, name, 2, E, d, 0);
        hf_fix_logical(s, L, 0, -1, rw);
        if (hf_fix_broken(s, "router-inf") && L == s->layers - 1) rw[d + 1] = INFINITY;
        if (hf_fix_broken(s, "router-bias")) { /* a router with a bias: pruning must slice it */
            snprintf(name, sizeof name, "model.layers.%d.%s.gate.bias", L, B);
            hf_fix_other(s, &l, sh, name, 1, E, 0);
        }
        if (hf_fix_broken(s, "extra-expert") && !strcmp(s->storage, "split")) { /* "experts.01": not canonical */
            snprintf(name, sizeof name, "model.layers.%d.%s.experts.01.%s.weight", L, B, hf_fix_w(s, 0));
            hf_fix_other(s, &l, sh, name, 2, I, d);
        }
        if (!strcmp(s->type, "deepseek_v3")) {
            snprintf(name, sizeof name, "model.layers.%d.%s.gate.e_score_correction_bias", L, B);
            hf_fix_other(s, &l, sh, name, 1, E, 0);
        }
        float *m = malloc(sizeof(float) * (size_t)I * d);
        if (!strcmp(s->storage, "split")) {
            for (int e = 0; e < E; e++)
                for (int j = 0; j < 3; j++) {
                    if (s->breakage && !strcmp(s->breakage, "missing-tensor") && L == s->layers - 1 && e == 1 && j == 2) continue;
                    snprintf(name, sizeof name, "model.layers.%d.%s.experts.%d.%s.weight", L, B, e, hf_fix_w(s, j));
                    hf_fix_logical(s, L, e, j, hf_fix_add(&l, sh, name, 2, j < 2 ? I : d, j < 2 ? d : I, 0));
                }
        } else {
            int t = !strcmp(s->storage, "fused_t");
            snprintf(name, sizeof name, "model.layers.%d.%s.experts.gate_up_proj", L, B);
            float *gu = t ? hf_fix_add(&l, sh, name, 3, E, d, 2 * I) : hf_fix_add(&l, sh, name, 3, E, 2 * I, d);
            snprintf(name, sizeof name, "model.layers.%d.%s.experts.down_proj", L, B);
            float *dn = NULL;
            if (!(s->breakage && !strcmp(s->breakage, "missing-tensor") && L == s->layers - 1))
                dn = t ? hf_fix_add(&l, sh, name, 3, E, I, d) : hf_fix_add(&l, sh, name, 3, E, d, I);
            for (int e = 0; e < E; e++) {
                for (int j = 0; j < 2; j++) { /* gate (I, d), up (I, d) */
                    hf_fix_logical(s, L, e, j, m);
                    for (int i = 0; i < I; i++)
                        for (int k = 0; k < d; k++) {
                            float v = m[(size_t)i * d + k];
                            if (t) gu[((size_t)e * d + k) * 2 * I + (size_t)j * I + i] = v;
                            else gu[((size_t)e * 2 * I + (size_t)j * I + i) * d + k] = v;
                        }
                }
                hf_fix_logical(s, L, e, 2, m); /* down (d, I) */
                for (int k = 0; k < d && dn; k++)
                    for (int i = 0; i < I; i++) {
                        float v = m[(size_t)k * I + i];
                        if (t) dn[((size_t)e * I + i) * d + k] = v;
                        else dn[((size_t)e * d + k) * I + i] = v;
                    }
            }
        }
        free(m);
        int S = hf_fix_shared_rows(s);
        if (S) {
            const char *sm = !strcmp(s->type, "qwen2_moe") ? "shared_expert" : "shared_experts";
            for (int j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "model.layers.%d.%s.%s.%s.weight", L, B, sm, hf_fix_w(s, j));
                hf_fix_other(s, &l, sh, name, 2, j < 2 ? S : d, j < 2 ? d : S);
            }
            if (!strcmp(s->type, "qwen2_moe")) {
                snprintf(name, sizeof name, "model.layers.%d.%s.shared_expert_gate.weight", L, B);
                hf_fix_other(s, &l, sh, name, 2, 1, d);
            }
        }
    }
    hf_fix_other(s, &l, s->shards - 1, "model.norm.weight", 1, d, 0);
    hf_fix_other(s, &l, s->shards - 1, "lm_head.weight", 2, V, d);

    int rc = 0;
    for (int i = 0; i < s->shards && rc == 0; i++) {
        char sn[64];
        hf_fix_shard_name(s, i, sn, sizeof sn);
        snprintf(path, sizeof path, "%s/%s", dir, sn);
        rc = hf_fix_write_shard(s, &l, i, path);
    }
    if (rc == 0 && s->shards > 1) { /* the index */
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(path, "w");
        if (!f) rc = -1;
        size_t total = 0;
        for (int i = 0; i < l.n; i++) total += hf_fix_numel(&l.t[i]) * (s->bf16 ? 2 : 4);
        if (f) {
            fprintf(f, "{\n  \"metadata\": {\"total_size\": %zu},\n  \"weight_map\": {\n", total);
            for (int i = 0; i < l.n; i++) {
                char sn[64];
                hf_fix_shard_name(s, l.t[i].shard, sn, sizeof sn);
                fprintf(f, "%s    \"%s\": \"%s\"", i ? ",\n" : "", l.t[i].name, sn);
            }
            if (s->breakage && !strcmp(s->breakage, "index-extra"))
                fprintf(f, ",\n    \"model.layers.0.extra.weight\": \"model-00001-of-%05d.safetensors\"", s->shards);
            fprintf(f, "\n  }\n}\n");
            fclose(f);
        }
    }
    if (rc == 0) { /* config.json */
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        if (!f) rc = -1;
        else {
            fprintf(f, "{\n  \"architectures\": [\"Fixture\"],\n  \"model_type\": \"%s\",\n  \"hidden_size\": %d,\n"
                       "  \"num_hidden_layers\": %d,\n  \"num_experts_per_tok\": %d,\n  \"vocab_size\": %d,\n",
                    s->type, d, s->layers - hf_fix_broken(s, "config-fewer-layers"), s->k, V);
            if (!strcmp(s->type, "mixtral"))
                fprintf(f, "  \"num_local_experts\": %d,\n  \"intermediate_size\": %d,\n", E_cfg, I);
            else if (!strcmp(s->type, "olmoe"))
                fprintf(f, "  \"num_experts\": %d,\n  \"intermediate_size\": %d,\n  \"norm_topk_prob\": false,\n", E_cfg, I);
            else if (!strcmp(s->type, "qwen2_moe"))
                fprintf(f, "  \"num_experts\": %d,\n  \"moe_intermediate_size\": %d,\n  \"intermediate_size\": %d,\n"
                           "  \"shared_expert_intermediate_size\": %d,\n  \"decoder_sparse_step\": 1,\n"
                           "  \"mlp_only_layers\": [0],\n", E_cfg, I, 2 * I, 2 * I);
            else if (!strcmp(s->type, "qwen3_moe"))
                fprintf(f, "  \"num_experts\": %d,\n  \"moe_intermediate_size\": %d,\n  \"norm_topk_prob\": true,\n", E_cfg, I);
            else
                fprintf(f, "  \"n_routed_experts\": %d,\n  \"moe_intermediate_size\": %d,\n  \"intermediate_size\": %d,\n"
                           "  \"n_shared_experts\": 1,\n  \"first_k_dense_replace\": 1,\n  \"moe_layer_freq\": 1,\n"
                           "  \"scoring_func\": \"sigmoid\",\n  \"n_group\": 2,\n  \"topk_group\": 1,\n"
                           "  \"norm_topk_prob\": true,\n", E_cfg, I, 2 * I);
            fprintf(f, "  \"torch_dtype\": \"%s\"\n}\n", s->bf16 ? "bfloat16" : "float32");
            fclose(f);
        }
        snprintf(path, sizeof path, "%s/tokenizer.json", dir); /* a file pruning must carry over */
        f = fopen(path, "w");
        if (f) {
            fputs("{\"fixture\": true}\n", f);
            fclose(f);
        }
    }
    if (rc == 0 && s->breakage && !strcmp(s->breakage, "missing-shard")) {
        char sn[64];
        hf_fix_shard_name(s, s->shards - 1, sn, sizeof sn);
        snprintf(path, sizeof path, "%s/%s", dir, sn);
        unlink(path);
    }
    for (int i = 0; i < l.n; i++) free(l.t[i].data);
    free(l.t);
    return rc;
}

/* Calibration inputs (T, d) for every MoE block (named after it), or one "hidden_states" tensor. */
static inline int hf_fixture_write_calib(const char *path, const hf_spec *s, int T, int shared_name) {
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err;
    float *x = malloc(sizeof(float) * (size_t)s->layers * T * s->d);
    char (*names)[128] = calloc((size_t)s->layers, sizeof *names);
    int64_t sh[2] = {T, s->d};
    for (int L = 0; L < s->layers; L++) {
        if (shared_name ? L > 0 : !hf_fix_is_moe(s, L)) continue; /* one shared tensor, or one per MoE block */
        if (shared_name) snprintf(names[L], sizeof names[L], "hidden_states");
        else snprintf(names[L], sizeof names[L], "model.layers.%d.%s", L, hf_fix_block(s));
        hf_fix_fill(s, names[L], (size_t)T * s->d, 1.0, x + (size_t)L * T * s->d);
        sm_st_writer_add(&w, names[L], 2, sh, x + (size_t)L * T * s->d, &err);
    }
    int rc = sm_st_writer_write(&w, path, &err) == SM_OK ? 0 : -1;
    sm_st_writer_free(&w);
    free(x);
    free(names);
    return rc;
}

#endif
