/* Hugging Face MoE checkpoints: every layout is generated (tests/hf_fixture.h), read back, turned
 * into SSMoE descriptors that must equal the brute-force ones (eigenvectors of W^T W from LAPACKE
 * dsyev on the generator's own weights, same sign convention), scored on calibration inputs against
 * a direct computation, and pruned; the pruned directory must open again with the kept experts'
 * bytes intact. Malformed directories are refused with a message naming the tensor or file. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <sys/stat.h>

#include "hf_fixture.h"
#include "specmoe/io/hf.h"
#include "specmoe/io/json_util.h"
#include "specmoe/methods/ssmoe/ssmoe.h"
#include "testutil.h"

static const hf_spec layouts[] = {
    /* type          storage    d   I   E  k  layers shards bf16 seed */
    {"mixtral", "split", 16, 12, 4, 2, 2, 2, 0, 11, NULL},
    {"olmoe", "split", 20, 8, 5, 2, 2, 1, 1, 12, NULL},
    {"qwen2_moe", "split", 16, 10, 6, 2, 3, 3, 0, 13, NULL}, /* layer 0 dense; shared expert + its gate */
    {"deepseek_v3", "split", 18, 8, 6, 2, 3, 2, 1, 14, NULL}, /* layer 0 dense; bias; sigmoid; groups */
    {"mixtral", "fused", 16, 12, 4, 2, 2, 2, 0, 15, NULL},
    {"olmoe", "fused_t", 20, 8, 5, 3, 2, 1, 0, 16, NULL},
    {"qwen3_moe", "fused", 16, 8, 4, 2, 2, 2, 1, 17, NULL}, /* d == 2I: the down_proj shape decides */
    {"qwen3_moe", "fused_t", 16, 8, 4, 2, 2, 1, 0, 18, NULL},
    {"mixtral", "split", 8, 4, 12, 2, 11, 3, 0, 19, NULL}, /* experts.1 vs experts.10, layers.1 vs layers.10 */
    {"olmoe", "fused", 12, 12, 4, 2, 2, 1, 0, 20, "router-bias"}, /* d == I; a router bias to slice */
};
#define N_LAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))
#define C_EV 3

static const char *make_model(const hf_spec *s) {
    const char *dir = tu_tmpdir();
    cr_assert_eq(hf_fixture_write(dir, s), 0, "fixture %s/%s not written", s->type, s->storage);
    return dir;
}

/* Brute-force descriptors of logical layer L: (E, 3, d) via sm_ev_descriptor_eig. */
static void brute_ev(const hf_spec *s, int L, double *ev) {
    const int d = s->d, I = s->I, E = s->E;
    float *router = malloc(sizeof(float) * (size_t)E * d), *m = malloc(sizeof(float) * (size_t)I * d);
    float *w = malloc(sizeof(float) * (size_t)I * d);
    hf_fix_logical(s, L, 0, -1, router);
    sm_error err;
    for (int e = 0; e < E; e++)
        for (int j = 0; j < 3; j++) {
            hf_fix_logical(s, L, e, j, m);
            for (int i = 0; i < I; i++) /* down (d, I) transposed to (I, d) */
                for (int k = 0; k < d; k++) w[(size_t)i * d + k] = j < 2 ? m[(size_t)i * d + k] : m[(size_t)k * I + i];
            cr_assert_eq(sm_ev_descriptor_eig(ev + ((size_t)e * 3 + j) * d, w, I, d, router + (size_t)e * d, C_EV, &err),
                         SM_OK, "%s", err.msg);
        }
    free(router);
    free(m);
    free(w);
}

/* Every layout: layers found, expert matrices exact, descriptors equal to the brute force. */
Test(hf, layouts_read_and_ev_matches_brute_force) {
    for (int c = 0; c < N_LAYOUTS; c++) {
        const hf_spec *s = &layouts[c];
        const char *dir = make_model(s);
        sm_hf_model m;
        sm_error err;
        cr_assert_eq(sm_hf_open(&m, dir, &err), SM_OK, "%s/%s: %s", s->type, s->storage, err.msg);
        int n_moe = 0;
        for (int L = 0; L < s->layers; L++) n_moe += hf_fix_is_moe(s, L);
        cr_assert_eq(m.n_moe, n_moe, "%s: %d MoE layers, want %d", s->type, m.n_moe, n_moe);
        sm_hf_storage want = !strcmp(s->storage, "split") ? SM_HF_SPLIT : !strcmp(s->storage, "fused") ? SM_HF_FUSED : SM_HF_FUSED_T;
        const int d = s->d, I = s->I, E = s->E;
        float *got = malloc(sizeof(float) * (size_t)I * d), *ref = malloc(sizeof(float) * (size_t)I * d);
        float *router = malloc(sizeof(float) * (size_t)E * d), *ev = malloc(sizeof(float) * (size_t)E * 3 * d);
        double *bev = malloc(sizeof(double) * (size_t)E * 3 * d);
        for (int l = 0; l < m.n_moe; l++) {
            int L = m.moe[l].layer;
            cr_expect(hf_fix_is_moe(s, L));
            cr_expect_eq(m.moe[l].storage, want, "%s/%s layer %d: storage %d", s->type, s->storage, L, m.moe[l].storage);
            cr_expect_eq(m.moe[l].has_bias, !strcmp(s->type, "deepseek_v3"));
            for (int e = 0; e < E; e++)
                for (int j = 0; j < 3; j++) {
                    cr_assert_eq(sm_hf_read_expert(&m, l, e, j, got, &err), SM_OK, "%s", err.msg);
                    hf_fix_logical(s, L, e, j, ref);
                    for (int i = 0; i < I; i++)
                        for (int k = 0; k < d; k++) {
                            float r = j < 2 ? ref[(size_t)i * d + k] : ref[(size_t)k * I + i];
                            cr_assert_eq(got[(size_t)i * d + k], r, "%s/%s L%d e%d m%d (%d,%d)", s->type, s->storage, L,
                                         e, j, i, k);
                        }
                }
            cr_assert_eq(sm_hf_read_router(&m, l, router, &err), SM_OK, "%s", err.msg);
            cr_assert_eq(sm_hf_build_ev(&m, l, C_EV, 0, router, ev, &err), SM_OK, "%s", err.msg);
            brute_ev(s, L, bev);
            double worst = 0;
            for (size_t i = 0; i < (size_t)E * 3 * d; i++) worst = fmax(worst, fabs(ev[i] - bev[i]));
            cr_expect_lt(worst, 1e-4, "%s/%s layer %d: descriptors differ from the brute force by %g", s->type, s->storage,
                         L, worst);
        }
        free(got); free(ref); free(router); free(ev); free(bev);
        sm_hf_close(&m);
    }
}

/* Routing statistics against a direct computation (softmax, or DeepSeek-V3's normalised sigmoid). */
Test(hf, route_stats_match_direct_computation) {
    for (int c = 0; c < N_LAYOUTS; c++) {
        const hf_spec *s = &layouts[c];
        const char *dir = make_model(s);
        sm_hf_model m;
        sm_error err;
        cr_assert_eq(sm_hf_open(&m, dir, &err), SM_OK, "%s", err.msg);
        const int d = s->d, E = s->E, T = 37, k = s->k;
        const double alpha = 0.6;
        float *x = malloc(sizeof(float) * (size_t)T * d), *router = malloc(sizeof(float) * (size_t)E * d);
        float *ev = malloc(sizeof(float) * (size_t)E * 3 * d);
        double mr[16], mm[16], ov, br[16] = {0}, bm[16] = {0}, bov = 0;
        hf_fix_fill(s, "calib", (size_t)T * d, 1.0, x);
        cr_assert_eq(sm_hf_read_router(&m, 0, router, &err), SM_OK);
        cr_assert_eq(sm_hf_build_ev(&m, 0, C_EV, 0, router, ev, &err), SM_OK);
        cr_assert_eq(sm_hf_route_stats(&m, router, ev, x, T, alpha, mr, mm, &ov, &err), SM_OK, "%s", err.msg);
        const int sig = !strcmp(s->type, "deepseek_v3"); /* the fixture's scoring_func, not the parser's reading */
        cr_assert_eq(m.cfg.sigmoid, sig, "%s: sigmoid scoring %d", s->type, m.cfg.sigmoid);
        for (int t = 0; t < T; t++) {
            double pr[16], pe[16], P[16], zr = 0, ze = 0;
            for (int e = 0; e < E; e++) {
                double lr = 0, le = 0;
                for (int i = 0; i < d; i++) {
                    lr += (double)x[t * d + i] * router[e * d + i];
                    le += (double)x[t * d + i] * (ev[(e * 3) * d + i] + ev[(e * 3 + 1) * d + i] + ev[(e * 3 + 2) * d + i]) / 3;
                }
                pr[e] = sig ? 1 / (1 + exp(-lr)) : exp(lr);
                pe[e] = exp(le);
                zr += pr[e];
                ze += pe[e];
            }
            for (int e = 0; e < E; e++) {
                pr[e] /= zr;
                P[e] = alpha * pe[e] / ze + (1 - alpha) * pr[e];
                br[e] += pr[e] / T;
                bm[e] += P[e] / T;
            }
            int both = 0; /* top-k of each by brute force: rank = number of strictly larger entries */
            for (int e = 0; e < E; e++) {
                int r1 = 0, r2 = 0;
                for (int f = 0; f < E; f++) {
                    r1 += pr[f] > pr[e];
                    r2 += P[f] > P[e];
                }
                both += r1 < k && r2 < k;
            }
            bov += (double)both / k / T;
        }
        for (int e = 0; e < E; e++) {
            cr_expect_float_eq(mr[e], br[e], 1e-5, "%s router mean e%d", s->type, e);
            cr_expect_float_eq(mm[e], bm[e], 1e-5, "%s mixed mean e%d", s->type, e);
        }
        cr_expect_float_eq(ov, bov, 1e-9, "%s overlap %g vs %g", s->type, ov, bov);
        free(x); free(router); free(ev);
        sm_hf_close(&m);
    }
}

/* Pruning keeps exactly the chosen experts, renumbered, bytes intact, and the result opens again. */
Test(hf, prune_keeps_chosen_experts_byte_for_byte) {
    for (int c = 0; c < N_LAYOUTS; c++) {
        const hf_spec *s = &layouts[c];
        const char *dir = make_model(s);
        sm_hf_model m, p;
        sm_error err;
        cr_assert_eq(sm_hf_open(&m, dir, &err), SM_OK, "%s", err.msg);
        const int E = s->E, d = s->d, I = s->I, E_keep = E / 2 + (c % 2); /* 2..4 of 4..6 */
        int keep[256];
        for (int l = 0; l < m.n_moe; l++) /* a different ascending choice per layer */
            for (int j = 0; j < E_keep; j++) keep[l * E_keep + j] = (j * E) / E_keep + (l % 2 && j == 0 && E_keep * 2 <= E);
        const char *out = tu_tmpdir();
        cr_assert_eq(sm_hf_prune(&m, keep, E_keep, out, &err), SM_OK, "%s/%s: %s", s->type, s->storage, err.msg);
        cr_assert_eq(sm_hf_open(&p, out, &err), SM_OK, "%s/%s pruned: %s", s->type, s->storage, err.msg);
        cr_expect_eq(p.cfg.E, E_keep);
        cr_expect_eq(p.cfg.k, s->k < E_keep ? s->k : E_keep);
        cr_expect_eq(p.n_moe, m.n_moe);
        cr_expect_eq(p.n_shards, m.n_shards);
        cr_expect_eq(p.indexed, m.indexed);
        if (!strcmp(s->type, "deepseek_v3")) cr_expect_eq(p.cfg.n_group, E_keep % 2 ? 1 : 2);
        float *a = malloc(sizeof(float) * (size_t)I * d), *b = malloc(sizeof(float) * (size_t)I * d);
        float *ra = malloc(sizeof(float) * (size_t)E * d), *rb = malloc(sizeof(float) * (size_t)E * d);
        for (int l = 0; l < m.n_moe; l++) {
            cr_assert_eq(sm_hf_read_router(&m, l, ra, &err), SM_OK);
            cr_assert_eq(sm_hf_read_router(&p, l, rb, &err), SM_OK);
            for (int j = 0; j < E_keep; j++) {
                int e = keep[l * E_keep + j];
                cr_expect(memcmp(rb + (size_t)j * d, ra + (size_t)e * d, sizeof(float) * d) == 0, "router row %d", j);
                for (int q = 0; q < 3; q++) {
                    cr_assert_eq(sm_hf_read_expert(&m, l, e, q, a, &err), SM_OK);
                    cr_assert_eq(sm_hf_read_expert(&p, l, j, q, b, &err), SM_OK, "%s", err.msg);
                    cr_expect(memcmp(a, b, sizeof(float) * (size_t)I * d) == 0, "%s/%s layer %d: pruned expert %d != "
                              "source expert %d (matrix %d)", s->type, s->storage, l, j, e, q);
                }
            }
        }
        /* every other tensor byte-identical, dtype kept */
        const sm_hf_entry *ea = sm_hf_find(&m, "lm_head.weight"), *eb = sm_hf_find(&p, "lm_head.weight");
        cr_assert(ea && eb);
        cr_expect_eq(eb->t->dtype, s->bf16 ? SM_DT_BF16 : SM_DT_F32);
        size_t nb = ea->t->end - ea->t->begin;
        unsigned char *x = malloc(nb), *y = malloc(nb);
        cr_assert_eq(sm_st_read_bytes(&m.shard[ea->shard], ea->t, 0, nb, x, &err), SM_OK);
        cr_assert_eq(sm_st_read_bytes(&p.shard[eb->shard], eb->t, 0, nb, y, &err), SM_OK);
        cr_expect(memcmp(x, y, nb) == 0);
        if (!strcmp(s->storage, "split")) /* every dropped expert takes its three tensors along */
            cr_expect_eq(p.n_entries, m.n_entries - 3 * (E - E_keep) * m.n_moe, "%d entries of %d", p.n_entries, m.n_entries);
        else
            cr_expect_eq(p.n_entries, m.n_entries);
        /* sliced vectors (router bias, DeepSeek-V3 correction bias) hold the kept experts' entries;
         * shared-expert tensors are untouched */
        for (int l = 0; l < m.n_moe; l++) {
            static const char *vec[2] = {"gate.bias", "gate.e_score_correction_bias"};
            for (int v = 0; v < 2; v++) {
                char nm[160];
                snprintf(nm, sizeof nm, "%s.%s", m.moe[l].block, vec[v]);
                const sm_hf_entry *va = sm_hf_find(&m, nm), *vb = sm_hf_find(&p, nm);
                cr_expect_eq(va != NULL, vb != NULL, "%s", nm);
                if (!va || !vb) continue;
                cr_assert_eq(vb->t->shape[0], E_keep, "%s not sliced", nm);
                float fa[16], fb[16];
                cr_assert_eq(sm_st_read_f32(&m.shard[va->shard], va->t, 0, (size_t)E, fa, &err), SM_OK);
                cr_assert_eq(sm_st_read_f32(&p.shard[vb->shard], vb->t, 0, (size_t)E_keep, fb, &err), SM_OK);
                for (int j = 0; j < E_keep; j++) cr_expect_eq(fb[j], fa[keep[l * E_keep + j]], "%s[%d]", nm, j);
            }
            if (hf_fix_shared_rows(s)) {
                char nm[160];
                snprintf(nm, sizeof nm, "%s.%s.%s.weight", m.moe[l].block,
                         !strcmp(s->type, "qwen2_moe") ? "shared_expert" : "shared_experts", hf_fix_w(s, 2));
                const sm_hf_entry *sa = sm_hf_find(&m, nm), *sb = sm_hf_find(&p, nm);
                cr_assert(sa && sb, "%s", nm);
                size_t n = sa->t->end - sa->t->begin;
                unsigned char *u = malloc(n), *v = malloc(n);
                cr_assert_eq(sm_st_read_bytes(&m.shard[sa->shard], sa->t, 0, n, u, &err), SM_OK);
                cr_assert_eq(sm_st_read_bytes(&p.shard[sb->shard], sb->t, 0, n, v, &err), SM_OK);
                cr_expect(memcmp(u, v, n) == 0, "%s changed", nm);
                free(u);
                free(v);
            }
        }
        char path[512];
        snprintf(path, sizeof path, "%s/tokenizer.json", out);
        cr_expect(access(path, F_OK) == 0, "tokenizer.json not carried over");
        free(a); free(b); free(ra); free(rb); free(x); free(y);
        sm_hf_close(&p);
        /* the source directory itself is refused as the output */
        cr_expect_neq(sm_hf_prune(&m, keep, E_keep, dir, &err), SM_OK);
        sm_hf_close(&m);
    }
}

static void expect_refusal(const hf_spec *s, const char *needle1, const char *needle2) {
    const char *dir = make_model(s);
    sm_hf_model m;
    sm_error err = {0};
    cr_assert_neq(sm_hf_open(&m, dir, &err), SM_OK, "%s accepted", s->breakage);
    cr_expect(strstr(err.msg, needle1) != NULL, "%s: message '%s' lacks '%s'", s->breakage, err.msg, needle1);
    cr_expect(strstr(err.msg, needle2) != NULL, "%s: message '%s' lacks '%s'", s->breakage, err.msg, needle2);
}

Test(hf, malformed_directories_refused_naming_tensor_or_file) {
    hf_spec s = layouts[0];
    s.breakage = "missing-tensor";
    expect_refusal(&s, "model.layers.1.block_sparse_moe.experts.1.w2.weight", "missing");
    s.breakage = "config-mismatch";
    expect_refusal(&s, "model.layers.0.block_sparse_moe.gate.weight", "config.json implies [5, 16]");
    s.breakage = "missing-shard";
    expect_refusal(&s, "model-00002-of-00002.safetensors", "index");
    s.breakage = "index-extra";
    expect_refusal(&s, "model.layers.0.extra.weight", "no shard holds it");
    s.breakage = "extra-expert";
    expect_refusal(&s, "model.layers.0.block_sparse_moe.experts.01.w1.weight", "not one of experts 0..3");
    /* a layer beyond num_hidden_layers would be copied with all its experts: refused, naming the first
     * tensor of the first such layer (numerically: layer 10 of 11, not "1x" by name) and its shard */
    s.breakage = "config-fewer-layers";
    expect_refusal(&s, "tensor 'model.layers.1.block_sparse_moe.experts.0.w1.weight'", "num_hidden_layers 1");
    expect_refusal(&s, "/model-00002-of-00002.safetensors: ", "layer 1");
    hf_spec many = layouts[8];
    many.breakage = "config-fewer-layers";
    expect_refusal(&many, "/model-00002-of-00003.safetensors: tensor 'model.layers.10.block_sparse_moe.experts.0.w1.weight'",
                   "num_hidden_layers 10");
    hf_spec f = layouts[4]; /* fused: a missing down_proj */
    f.breakage = "missing-tensor";
    expect_refusal(&f, "model.layers.1.block_sparse_moe.experts.down_proj", "missing");
    /* an empty directory */
    sm_hf_model m;
    sm_error err;
    cr_expect_neq(sm_hf_open(&m, tu_tmpdir(), &err), SM_OK);
    cr_expect(strstr(err.msg, "config.json") != NULL, "%s", err.msg);
}

Test(hf, config_and_index_parsers_refuse_bad_input) {
    static const struct { const char *json, *needle; } bad[] = {
        {"[1, 2]", "not a JSON object"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 8}", "not a supported MoE layout"},
        {"{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2}", "\"hidden_size\" is missing"},
        {"{\"model_type\": \"mixtral\", \"hidden_size\": 8, \"num_hidden_layers\": 2, \"num_local_experts\": 4, "
         "\"intermediate_size\": 4, \"num_experts_per_tok\": 5}", "\"num_experts_per_tok\" is not valid"},
        {"{\"model_type\": \"olmoe\", \"hidden_size\": -8}", "\"hidden_size\" is not valid"},
        {"{\"model_type\": \"qwen2_moe\", \"hidden_size\": 8, \"num_hidden_layers\": 2, \"num_experts\": 4, "
         "\"moe_intermediate_size\": 4, \"num_experts_per_tok\": 2, \"mlp_only_layers\": [7]}", "mlp_only_layers"},
        {"{\"model_type\": \"deepseek_v3\", \"hidden_size\": 8, \"num_hidden_layers\": 2, \"n_routed_experts\": 4, "
         "\"moe_intermediate_size\": 4, \"num_experts_per_tok\": 2, \"scoring_func\": \"relu\"}", "scoring_func"},
        {"{\"model_type\": \"mixtral\", \"hidden_size\": 8.5}", "\"hidden_size\" is not valid"},
        {"{\"model_type\": \"mixtral\"", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sm_hf_config c;
        sm_error err = {0};
        cr_expect_neq(sm_hf_config_parse(&c, bad[i].json, strlen(bad[i].json), "cfg", &err), SM_OK, "accepted %s", bad[i].json);
        cr_expect(strstr(err.msg, bad[i].needle) != NULL, "'%s' lacks '%s'", err.msg, bad[i].needle);
    }
    static const struct { const char *json, *needle; } badi[] = {
        {"{\"weight_map\": {\"a\": \"../evil.safetensors\"}}", "not a .safetensors file in the model directory"},
        {"{\"weight_map\": {\"a\": \"sub/x.safetensors\"}}", "not a .safetensors file"},
        {"{\"weight_map\": {\"a\": 3}}", "is not a tensor name mapped"},
        {"{\"weight_map\": {}}", "has 0 entries"},
        {"{\"metadata\": {}}", "no \"weight_map\""},
        {"nope", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof badi / sizeof badi[0]; i++) {
        char **n, **f;
        int cnt;
        sm_error err = {0};
        cr_expect_neq(sm_hf_index_parse(badi[i].json, strlen(badi[i].json), "idx", &n, &f, &cnt, &err), SM_OK);
        cr_expect(strstr(err.msg, badi[i].needle) != NULL, "'%s' lacks '%s'", err.msg, badi[i].needle);
    }
}

/* Calibration files: per-block tensors or one "hidden_states"; wrong widths refused. */
Test(hf, calibration_file) {
    const hf_spec *s = &layouts[0];
    const char *dir = tu_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/calib.safetensors", dir);
    cr_assert_eq(hf_fixture_write_calib(path, s, 9, 0), 0);
    float *x;
    int T;
    sm_error err;
    cr_assert_eq(sm_hf_read_calib(path, "model.layers.1.block_sparse_moe", s->d, &x, &T, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(T, 9);
    free(x);
    cr_expect_neq(sm_hf_read_calib(path, "model.layers.1.block_sparse_moe", s->d + 1, &x, &T, &err), SM_OK);
    cr_expect(strstr(err.msg, "(T, 17)") != NULL, "%s", err.msg);
    cr_expect_neq(sm_hf_read_calib(path, "model.layers.7.mlp", s->d, &x, &T, &err), SM_OK);
    cr_expect(strstr(err.msg, "hidden_states") != NULL, "%s", err.msg);
    cr_assert_eq(hf_fixture_write_calib(path, s, 5, 1), 0);
    cr_assert_eq(sm_hf_read_calib(path, "model.layers.7.mlp", s->d, &x, &T, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(T, 5);
    free(x);
}

/* A non-finite router weight is refused when read, naming the tensor and the entry. */
Test(hf, non_finite_router_refused) {
    hf_spec s = layouts[0];
    s.breakage = "router-inf";
    const char *dir = make_model(&s);
    sm_hf_model m;
    sm_error err;
    cr_assert_eq(sm_hf_open(&m, dir, &err), SM_OK, "%s", err.msg);
    float *w = malloc(sizeof(float) * (size_t)s.E * s.d);
    cr_expect_eq(sm_hf_read_router(&m, 0, w, &err), SM_OK);
    cr_expect_neq(sm_hf_read_router(&m, 1, w, &err), SM_OK);
    cr_expect(strstr(err.msg, "model.layers.1.block_sparse_moe.gate.weight") && strstr(err.msg, "row 1, column 1"), "%s",
              err.msg);
    free(w);
    sm_hf_close(&m);
}

/* DeepSeek-V3 group-limited routing survives pruning only with equal groups of >= 2 that can still
 * supply k experts; the pruner refuses a keep list that breaks a kept grouping. */
Test(hf, deepseek_groups_after_pruning) {
    sm_hf_config c = {0};
    c.E = 8;
    c.k = 2;
    c.n_group = 2;
    c.topk_group = 1;
    cr_expect_eq(sm_hf_pruned_groups(&c, 6), 2); /* 3 per group, top-1 group supplies 3 >= 2 */
    cr_expect_eq(sm_hf_pruned_groups(&c, 4), 2);
    cr_expect_eq(sm_hf_pruned_groups(&c, 2), 1); /* 1 per group: group top-2 impossible */
    cr_expect_eq(sm_hf_pruned_groups(&c, 5), 1); /* unequal groups */
    c.k = 4;
    cr_expect_eq(sm_hf_pruned_groups(&c, 6), 1); /* one group of 3 cannot supply k = 4 */
    c.n_group = 1;
    cr_expect_eq(sm_hf_pruned_groups(&c, 6), 1);

    const hf_spec *s = &layouts[3]; /* deepseek_v3: E 6, n_group 2, topk_group 1, k 2 */
    const char *dir = make_model(s);
    sm_hf_model m;
    sm_error err;
    cr_assert_eq(sm_hf_open(&m, dir, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(m.cfg.n_group, 2);
    int uneven[4] = {0, 1, 2, 3}; /* 3 of group 0, 1 of group 1, in each MoE layer */
    int bad[8];
    for (int l = 0; l < m.n_moe; l++) memcpy(bad + 4 * l, uneven, sizeof(int) * 4);
    cr_expect_eq(sm_hf_prune(&m, bad, 4, tu_tmpdir(), &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "needs 2 from each") != NULL, "%s", err.msg);
    sm_hf_close(&m);
}

/* Duplicate keys: cJSON's lookups take the first, Python's json the last, so the two would read
 * different models from one config.json. Refused at any depth, naming the file and the key. */
Test(hf, duplicate_keys_refused_naming_file_and_key) {
    static const char *base = "\"hidden_size\": 8, \"num_hidden_layers\": 2, \"num_local_experts\": 4, "
                              "\"intermediate_size\": 4, \"num_experts_per_tok\": 2";
    static const struct { const char *pre, *post, *key; } bad[] = {
        {"\"model_type\": \"mixtral\", ", ", \"num_local_experts\": 8", "num_local_experts"},
        {"\"model_type\": \"mixtral\", \"model_type\": \"olmoe\", ", "", "model_type"},
        {"\"model_type\": \"mixtral\", ", ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2, \"type\": \"yarn\"}", "type"},
        {"\"model_type\": \"mixtral\", ", ", \"x\": [1, {\"a\": {\"deep\": 1, \"deep\": 2}}]", "deep"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{%s%s%s}", bad[i].pre, base, bad[i].post);
        sm_hf_config c;
        sm_error err = {0};
        cr_expect_neq(sm_hf_config_parse(&c, json, strlen(json), "DIR/config.json", &err), SM_OK, "accepted %s", json);
        char want[64];
        snprintf(want, sizeof want, "\"%s\"", bad[i].key);
        cr_expect(strstr(err.msg, "DIR/config.json") && strstr(err.msg, want) && strstr(err.msg, "more than once"),
                  "'%s' lacks the file, %s or 'more than once'", err.msg, want);
    }
    static const char *badi[] = {
        "{\"weight_map\": {\"a.weight\": \"m-1.safetensors\", \"b\": \"m-1.safetensors\", \"a.weight\": \"m-2.safetensors\"}}",
        "{\"metadata\": {\"total_size\": 1, \"total_size\": 2}, \"weight_map\": {\"a.weight\": \"m.safetensors\"}}",
    };
    for (size_t i = 0; i < sizeof badi / sizeof badi[0]; i++) {
        char **n, **f;
        int cnt;
        sm_error err = {0};
        cr_expect_neq(sm_hf_index_parse(badi[i], strlen(badi[i]), "DIR/idx.json", &n, &f, &cnt, &err), SM_OK, "accepted %s",
                      badi[i]);
        cr_expect(strstr(err.msg, "DIR/idx.json") && strstr(err.msg, i ? "\"total_size\"" : "\"a.weight\"") &&
                  strstr(err.msg, "more than once"), "'%s'", err.msg);
    }
}

/* The reusable check itself: where the duplicate sits, large objects (checked by sorting), arrays. */
Test(hf, json_unique_keys_check) {
    static const struct { const char *json, *needle; } cases[] = {
        {"{\"a\": 1, \"b\": {\"c\": [0, {\"d\": 1, \"e\": 2, \"d\": 3}]}}", "key \"d\" appears more than once in b.c[1]"},
        {"{\"a\": 1, \"a\": 1}", "key \"a\" appears more than once in the top-level object"},
        {"[{\"x\": 1}, {\"y\": 1, \"y\": 2}]", "key \"y\" appears more than once in [1]"},
        {"{\"k\": {\"A\": 1, \"a\": 2}}", NULL}, /* keys are case-sensitive, as in Python */
        {"{\"a\": {\"x\": 1}, \"b\": {\"x\": 1}}", NULL}, /* the same key in two objects is fine */
        {"[1, \"two\", null]", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *j = cJSON_Parse(cases[i].json);
        cr_assert(j, "%s", cases[i].json);
        sm_error err = {0};
        sm_status st = sm_json_check_unique_keys(j, "f.json", &err);
        if (cases[i].needle)
            cr_expect(st == SM_ERR_FORMAT && strstr(err.msg, "f.json: ") && strstr(err.msg, cases[i].needle), "%s: '%s'",
                      cases[i].json, err.msg);
        else
            cr_expect_eq(st, SM_OK, "%s: %s", cases[i].json, err.msg);
        cJSON_Delete(j);
    }
    /* 200 distinct keys pass; one repeated far apart is found */
    cJSON *o = cJSON_CreateObject();
    char key[16];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        cJSON_AddNumberToObject(o, key, i);
    }
    sm_error err = {0};
    cr_expect_eq(sm_json_check_unique_keys(o, "big", &err), SM_OK, "%s", err.msg);
    cJSON_AddNumberToObject(o, "k007", 1);
    cr_expect_eq(sm_json_check_unique_keys(o, "big", &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "\"k007\"") != NULL, "%s", err.msg);
    cJSON_Delete(o);
    cr_expect_eq(sm_json_check_unique_keys(NULL, "none", &err), SM_OK);
}

/* A calibration file of one (T, d) tensor `name` in dtype dt with the given raw bytes. */
static void write_calib_raw(const char *path, const char *name, sm_dtype dt, int T, int d, const void *bytes) {
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err;
    sm_st_stream s;
    cr_assert_eq(sm_st_writer_add_layout(&w, name, dt, 2, (int64_t[]){T, d}, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_stream_begin(&s, &w, path, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_stream_write(&s, bytes, (size_t)T * d * sm_dtype_size(dt), &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_stream_finish(&s, &err), SM_OK, "%s", err.msg);
    sm_st_writer_free(&w);
}

/* A calibration tensor of a dtype that is not F32/F16/BF16 is refused naming the file and the tensor. */
Test(hf, calibration_dtype_error_names_file_and_tensor) {
    char path[512];
    snprintf(path, sizeof path, "%s/calib-i32.safetensors", tu_tmpdir());
    int32_t v[4 * 8];
    for (int i = 0; i < 4 * 8; i++) v[i] = i;
    write_calib_raw(path, "model.layers.0.mlp", SM_DT_I32, 4, 8, v);
    float *x = NULL;
    int T = 0;
    sm_error err = {0};
    cr_expect_neq(sm_hf_read_calib(path, "model.layers.0.mlp", 8, &x, &T, &err), SM_OK);
    cr_expect(x == NULL && T == 0);
    cr_expect(strstr(err.msg, path) && strstr(err.msg, "'model.layers.0.mlp'") && strstr(err.msg, "I32"),
              "'%s' lacks the file, the tensor or its dtype", err.msg);
}

/* Non-finite calibration inputs, and finite ones so large that the router logits overflow float
 * (they used to give NaN scores, a pruned model chosen from them and `null` in the report), are
 * refused naming the file, the tensor and the entry. */
Test(hf, calibration_non_finite_or_huge_refused) {
    const char *dir = tu_tmpdir();
    static const struct { sm_dtype dt; uint32_t word; const char *what; } cases[] = {
        {SM_DT_F32, 0x7fc00000u, "non-finite"},        /* NaN */
        {SM_DT_F32, 0xff800000u, "non-finite"},        /* -Inf */
        {SM_DT_F16, 0x7c007c00u, "non-finite"},        /* +Inf, two halves */
        {SM_DT_BF16, 0x7fc07fc0u, "non-finite"},       /* NaN, two halves */
        {SM_DT_F32, 0x7f61b1e6u, "3e+38"},             /* finite, but x . w overflows */
        {SM_DT_BF16, 0xe0a0e0a0u, "-9.2"},             /* about -9.2e19 */
    };
    const int T = 3, d = 8, bad_at = 13; /* row 1, column 5 */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char path[512];
        snprintf(path, sizeof path, "%s/calib-%zu.safetensors", dir, c);
        const size_t es = sm_dtype_size(cases[c].dt);
        uint8_t raw[3 * 8 * 4];
        for (int i = 0; i < T * d; i++) { /* 0.5 everywhere but one entry */
            uint32_t w = es == 4 ? 0x3f000000u : 0x3f003f00u; /* F16 0x3800 is 0.5 */
            if (cases[c].dt == SM_DT_F16) w = 0x38003800u;
            if (i == bad_at) w = cases[c].word;
            memcpy(raw + (size_t)i * es, &w, es);
        }
        write_calib_raw(path, "model.layers.1.mlp", cases[c].dt, T, d, raw);
        float *x = NULL;
        int got_T = 0;
        sm_error err = {0};
        cr_expect_neq(sm_hf_read_calib(path, "model.layers.1.mlp", d, &x, &got_T, &err), SM_OK, "case %zu accepted", c);
        cr_expect(x == NULL && got_T == 0);
        cr_expect(strstr(err.msg, path) && strstr(err.msg, "'model.layers.1.mlp'") && strstr(err.msg, "row 1, column 5") &&
                  strstr(err.msg, cases[c].what), "case %zu: '%s'", c, err.msg);
    }
}

/* The routing statistics themselves never turn finite inputs into NaN: DeepSeek-V3's sigmoid scores
 * whose every logit is below -88 underflow to 0 in float and were normalised as 0/0; logits that
 * overflow float are refused. */
Test(hf, route_stats_stay_finite) {
    sm_hf_model m = {0};
    m.dir = "DIR";
    m.cfg.E = 2;
    m.cfg.d = 2;
    m.cfg.k = 1;
    m.cfg.sigmoid = 1;
    const float router[4] = {1, 0, 0, 1}, x[2] = {-200, -100}; /* logits -200 and -100 */
    double mr[2], ov;
    sm_error err = {0};
    cr_assert_eq(sm_hf_route_stats(&m, router, NULL, x, 1, 0.5, mr, NULL, &ov, &err), SM_OK, "%s", err.msg);
    /* sigmoid(l) ~ exp(l) there, so the normalised scores are softmax(-200, -100) */
    cr_expect(isfinite(mr[0]) && isfinite(mr[1]), "scores %g %g", mr[0], mr[1]);
    cr_expect_float_eq(mr[1], 1.0, 1e-12, "%g", mr[1]);
    cr_expect_float_eq(mr[0], exp(-100.0), 1e-40, "%g", mr[0]);
    const float huge[4] = {3e38f, 3e38f, 0, 1}, x2[2] = {2, 2}; /* logit 1.2e39: not a float */
    m.cfg.sigmoid = 0;
    cr_expect_eq(sm_hf_route_stats(&m, huge, NULL, x2, 1, 0.5, mr, NULL, &ov, &err), SM_ERR_NUMERIC);
    cr_expect(strstr(err.msg, "DIR") && strstr(err.msg, "not finite"), "%s", err.msg);
}

/* The output of sm_hf_prune must be a new or empty directory outside the model directory: files of an
 * earlier run would stay beside the new shards, and a directory inside the model would be copied into
 * itself. Nothing is written when refused. */
Test(hf, prune_output_directory_rules) {
    const hf_spec *s = &layouts[0]; /* mixtral, E 4, 2 MoE layers */
    const char *dir = make_model(s);
    sm_hf_model m;
    sm_error err = {0};
    cr_assert_eq(sm_hf_open(&m, dir, &err), SM_OK, "%s", err.msg);
    int keep[4] = {0, 1, 1, 3};
    char out[512], path[600];
    /* a non-empty directory: an earlier run's shard stays untouched, nothing is added */
    snprintf(out, sizeof out, "%s", tu_tmpdir());
    snprintf(path, sizeof path, "%s/model-00003-of-00003.safetensors", out);
    cr_assert_eq(tu_write_file(path, "stale", 5), 0);
    cr_expect_eq(sm_hf_prune(&m, keep, 2, out, &err), SM_ERR_ARG, "a non-empty output directory was accepted");
    cr_expect(strstr(err.msg, out) && strstr(err.msg, "not empty") && strstr(err.msg, "model-00003-of-00003.safetensors") &&
              strstr(err.msg, "--out") && strstr(err.msg, "remove it"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/config.json", out);
    cr_expect(access(path, F_OK) != 0, "config.json written into a refused directory");
    /* the model directory itself, a new or an existing empty directory inside it, a link to it */
    snprintf(out, sizeof out, "%s/pruned", dir);
    cr_expect_eq(sm_hf_prune(&m, keep, 2, out, &err), SM_ERR_ARG, "an output inside the model directory was accepted");
    cr_expect(strstr(err.msg, "inside the model directory") != NULL, "%s", err.msg);
    cr_expect(access(out, F_OK) != 0, "%s created", out);
    cr_assert_eq(mkdir(out, 0755), 0);
    cr_expect_eq(sm_hf_prune(&m, keep, 2, out, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "inside the model directory") != NULL, "%s", err.msg);
    cr_expect_eq(sm_hf_prune(&m, keep, 2, dir, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "is the model directory") != NULL, "%s", err.msg);
    snprintf(out, sizeof out, "%s/link-to-model", tu_tmpdir());
    cr_assert_eq(symlink(dir, out), 0);
    cr_expect_eq(sm_hf_prune(&m, keep, 2, out, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "is the model directory") != NULL, "%s", err.msg);
    /* an existing empty directory, and a new one whose parent exists, are fine */
    cr_expect_eq(sm_hf_prune(&m, keep, 2, tu_tmpdir(), &err), SM_OK, "%s", err.msg);
    snprintf(out, sizeof out, "%s/new/", tu_tmpdir());
    cr_expect_eq(sm_hf_prune(&m, keep, 2, out, &err), SM_OK, "%s", err.msg);
    sm_hf_close(&m);
}

static int mode_of(const char *dir, const char *name) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return lstat(p, &sb) == 0 ? (int)(sb.st_mode & 07777) : -1;
}

static void write_mode(const char *dir, const char *name, const char *text, int mode) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(tu_write_file(p, text, strlen(text)), 0, "%s", p);
    cr_assert_eq(chmod(p, (mode_t)mode), 0, "%s", p);
}

/* Prunes the 2-MoE-layer, 4-expert model in dir to experts {0, 1} into out = a new directory. */
static sm_status prune_2_of_4(const char *dir, char out[256], sm_error *err) {
    sm_hf_model m;
    snprintf(out, 256, "%s/pruned", tu_tmpdir());
    cr_assert_eq(sm_hf_open(&m, dir, err), SM_OK, "%s", err->msg);
    int keep[4] = {0, 1, 0, 1};
    sm_status st = sm_hf_prune(&m, keep, 2, out, err);
    sm_hf_close(&m);
    return st;
}

/* The other files of the model directory: a symlink is followed only to a file inside the directory
 * (tokenizer.json -> /etc/shadow used to be copied, world-readable), and every copy keeps its
 * source's mode bits exactly, umask or not, as do the shards, index and config.json pruning writes. */
Test(hf, prune_copies_other_files_without_escaping_or_widening) {
    umask(022);
    hf_spec s = layouts[0]; /* mixtral, 2 shards with an index */
    const char *dir = make_model(&s), *outside = tu_tmpdir();
    char dirc[256], secret[600], link[600];
    snprintf(dirc, sizeof dirc, "%s", dir);
    write_mode(outside, "secret", "root:x:0:0\n", 0600);
    snprintf(secret, sizeof secret, "%s/secret", outside);
    snprintf(link, sizeof link, "%s/tokenizer.json", dirc);
    cr_assert_eq(unlink(link), 0);
    for (int t = 0; t < 2; t++) { /* an absolute link, then a relative one */
        char target[600];
        if (t == 0) snprintf(target, sizeof target, "%s", secret);
        else snprintf(target, sizeof target, "../%s/secret", strrchr(outside, '/') + 1);
        (void)unlink(link);
        cr_assert_eq(symlink(target, link), 0);
        char out[256];
        sm_error err = {0};
        cr_expect_neq(prune_2_of_4(dirc, out, &err), SM_OK, "a link to %s was followed", target);
        cr_expect(strstr(err.msg, link) && strstr(err.msg, target) && strstr(err.msg, "outside the model directory"),
                  "'%s' lacks the link, its target or the reason", err.msg);
        cr_expect(access(out, F_OK) != 0, "%s written although refused", out);
    }
    /* links that stay inside are copied as regular files with the target's content and mode; every
     * copy keeps its mode */
    cr_assert_eq(unlink(link), 0);
    write_mode(dirc, "tokenizer_real.json", "{\"real\": 1}\n", 0640);
    cr_assert_eq(symlink("tokenizer_real.json", link), 0);
    write_mode(dirc, "generation_config.json", "{}\n", 0664);
    write_mode(dirc, "run.sh", "#!/bin/sh\n", 0755);
    write_mode(dirc, "private.txt", "p\n", 0600);
    char p[600];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dirc);
    cr_assert_eq(chmod(p, 0600), 0);
    snprintf(p, sizeof p, "%s/config.json", dirc);
    cr_assert_eq(chmod(p, 0640), 0);
    char out[256];
    sm_error err = {0};
    cr_assert_eq(prune_2_of_4(dirc, out, &err), SM_OK, "%s", err.msg);
    static const struct { const char *name; int mode; } want[] = {
        {"tokenizer.json", 0640}, {"tokenizer_real.json", 0640}, {"generation_config.json", 0664}, {"run.sh", 0755},
        {"private.txt", 0600}, {"model-00001-of-00002.safetensors", 0600}, {"model-00002-of-00002.safetensors", 0644},
        {"config.json", 0640}, {"model.safetensors.index.json", 0644},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_eq(mode_of(out, want[i].name), want[i].mode, "%s: mode %o, source %o", want[i].name,
                     (unsigned)mode_of(out, want[i].name), (unsigned)want[i].mode);
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    size_t n = 0;
    unsigned char *text = tu_read_file(p, &n);
    cr_expect(text && n == 12 && !memcmp(text, "{\"real\": 1}\n", 12), "the link's target was not copied");
    free(text);
}

static void make_subdir(const char *dir, const char *name, int mode) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(mkdir(p, 0700), 0, "%s", p);
    cr_assert_eq(chmod(p, (mode_t)mode), 0, "%s", p);
}

/* Subdirectories (original/, onnx/, ...) are copied recursively under the same rules as the files
 * beside config.json: modes kept (directories' too), a link inside copied as what it points to
 * (a directory as a directory), a link out of the model directory, a link loop or a FIFO refused. */
Test(hf, prune_copies_subdirectories) {
    umask(022);
    hf_spec s = layouts[0];
    char dir[256];
    snprintf(dir, sizeof dir, "%s", make_model(&s));
    make_subdir(dir, "original", 0750);
    write_mode(dir, "original/params.json", "{\"dim\": 16}\n", 0640);
    make_subdir(dir, "onnx", 0755);
    write_mode(dir, "onnx/model.onnx", "onnx\n", 0600);
    make_subdir(dir, "onnx/deep", 0700);
    make_subdir(dir, "onnx/deep/er", 0755);
    write_mode(dir, "onnx/deep/er/x.txt", "x\n", 0644);
    write_mode(dir, "onnx/.hidden", "h\n", 0644); /* dot names are skipped, as beside config.json */
    char p[600], q[600];
    snprintf(p, sizeof p, "%s/alias", dir);
    cr_assert_eq(symlink("original", p), 0); /* a link to a directory inside: copied as a directory */
    char out[256];
    sm_error err = {0};
    cr_assert_eq(prune_2_of_4(dir, out, &err), SM_OK, "%s", err.msg);
    static const struct { const char *name; int mode; } want[] = {
        {"original", 0750}, {"original/params.json", 0640}, {"onnx", 0755}, {"onnx/model.onnx", 0600},
        {"onnx/deep", 0700}, {"onnx/deep/er", 0755}, {"onnx/deep/er/x.txt", 0644}, {"alias", 0750},
        {"alias/params.json", 0640}, {"tokenizer.json", 0644},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_eq(mode_of(out, want[i].name), want[i].mode, "%s: mode %o, source %o", want[i].name,
                     (unsigned)mode_of(out, want[i].name), (unsigned)want[i].mode);
    snprintf(p, sizeof p, "%s/alias", out);
    struct stat sb;
    cr_expect(lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode), "alias/ is not a real directory in the copy");
    snprintf(p, sizeof p, "%s/original/params.json", out);
    size_t n = 0;
    unsigned char *text = tu_read_file(p, &n);
    cr_expect(text && n == 12 && !memcmp(text, "{\"dim\": 16}\n", 12));
    free(text);
    cr_expect_eq(mode_of(out, "onnx/.hidden"), -1, "onnx/.hidden copied");

    /* refusals, each naming the entry, with nothing written */
    const char *outside = tu_tmpdir();
    write_mode(outside, "secret", "s\n", 0600);
    snprintf(p, sizeof p, "%s/onnx/deep/leak", dir);
    snprintf(q, sizeof q, "%s/secret", outside);
    cr_assert_eq(symlink(q, p), 0);
    cr_expect_neq(prune_2_of_4(dir, out, &err), SM_OK, "a link out of a subdirectory was followed");
    cr_expect(strstr(err.msg, "onnx/deep/leak") && strstr(err.msg, q) && strstr(err.msg, "outside the model directory"),
              "%s", err.msg);
    cr_expect(access(out, F_OK) != 0);
    cr_assert_eq(unlink(p), 0);
    snprintf(p, sizeof p, "%s/onnx/deep/up", dir);
    cr_assert_eq(symlink("../..", p), 0); /* back to the model directory: a loop */
    cr_expect_neq(prune_2_of_4(dir, out, &err), SM_OK, "a link loop was followed");
    cr_expect(strstr(err.msg, "onnx/deep/up") && strstr(err.msg, "loop"), "%s", err.msg);
    cr_assert_eq(unlink(p), 0);
    snprintf(p, sizeof p, "%s/original/pipe", dir);
    cr_assert_eq(mkfifo(p, 0644), 0);
    cr_expect_neq(prune_2_of_4(dir, out, &err), SM_OK, "a FIFO was skipped or waited on");
    cr_expect((strstr(err.msg, "/original/pipe: ") || strstr(err.msg, "/alias/pipe: ")) && /* whichever comes first */
              strstr(err.msg, "not a regular file, directory or symbolic link"), "%s", err.msg);
    cr_assert_eq(unlink(p), 0);
    cr_expect_eq(prune_2_of_4(dir, out, &err), SM_OK, "%s", err.msg);
}
