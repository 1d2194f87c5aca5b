/* specmoe ssmoe: SSMoE (papers/001) from the command line.
 *
 *   ssmoe prune CHECKPOINT   expert dropping on a specmoe checkpoint
 *   ssmoe build --hf DIR     the EV router of a Hugging Face MoE model (ev_router.safetensors + report)
 *   ssmoe prune --hf DIR     expert dropping on a Hugging Face MoE model, streamed layer by layer
 *
 * specmoe ssmoe prune CHECKPOINT: SSMoE expert dropping on a specmoe checkpoint.
 * Experts are ranked on a calibration set (the first --calib training images) by one of
 *   router  mean learned-router probability per expert ("Router drop"),
 *   ssmoe   mean mixed EV/router probability per expert ("SSMoE drop"),
 *   random  a seeded random order ("RandDrop"),
 * and the top round(keep * E) of each MoE layer are kept; the pruned model, with the other experts
 * physically removed, is written as a new checkpoint. UNCONFIRMED in the paper's code: how experts
 * are ranked for dropping (REFERENCE-NOTES); this is the natural reading, documented in the README. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/io/hf.h"
#include <cjson/cJSON.h>

/* kept (E_keep) = the experts with the highest scores (ties to the lower index), ascending: the
 * E_keep / groups best of each of `groups` equal blocks of consecutive experts (1: of all of them).
 * Prints the layer's line. */
static void keep_top(const double *score, int E, int E_keep, int groups, int *kept, int layer, const char *rank_s) {
    const int per = E_keep / groups, size = E / groups;
    for (int j = 0; j < E_keep; j++) {
        const int g = j / per;
        int best = -1;
        for (int e = g * size; e < (g + 1) * size; e++) {
            int taken = 0;
            for (int q = g * per; q < j; q++) taken |= kept[q] == e;
            if (!taken && (best < 0 || score[e] > score[best])) best = e;
        }
        kept[j] = best;
    }
    for (int a = 1; a < E_keep; a++)
        for (int b = a; b > 0 && kept[b] < kept[b - 1]; b--) {
            int t = kept[b];
            kept[b] = kept[b - 1];
            kept[b - 1] = t;
        }
    printf("moe layer %d (%s ranking%s): kept", layer, rank_s, groups > 1 ? ", per expert group" : "");
    for (int j = 0; j < E_keep; j++) printf(" %d", kept[j]);
    printf(" of %d; scores", E);
    for (int e = 0; e < E; e++) printf(" %.4f", score[e]);
    printf("\n");
}

static int parse_rank(const char *cmd, const char *rank_s, sm_expert_rank *rank) {
    if (!strcmp(rank_s, "router")) *rank = SM_RANK_ROUTER;
    else if (!strcmp(rank_s, "ssmoe")) *rank = SM_RANK_SSMOE;
    else if (!strcmp(rank_s, "random")) *rank = SM_RANK_RANDOM;
    else {
        fprintf(stderr, "specmoe %s: --rank: '%s' is not router, ssmoe or random\n", cmd, rank_s);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

static int hf_build(int argc, char **argv);
static int hf_prune(int argc, char **argv);

int cmd_ssmoe(int argc, char **argv) {
    const char *sub = argc >= 3 ? argv[2] : "";
    if (!strcmp(sub, "build")) return hf_build(argc, argv);
    int hf = 0;
    for (int i = 3; i < argc; i++) hf |= !strcmp(argv[i], "--hf") || !strncmp(argv[i], "--hf=", 5);
    if (!strcmp(sub, "prune") && hf) return hf_prune(argc, argv);
    if (strcmp(sub, "prune") != 0) {
        fprintf(stderr, "usage: specmoe ssmoe prune CHECKPOINT --out PATH [flags]\n"
                        "       specmoe ssmoe build --hf DIR [flags]\n"
                        "       specmoe ssmoe prune --hf DIR --out DIR [flags]\n"
                        "(each with --help)\n");
        return (!strcmp(sub, "--help") || !strcmp(sub, "-h")) ? 0 : CLI_EXIT_USAGE;
    }
    const char *rank_s, *out, *data;
    double keep, alpha;
    int calib, c, avg;
    uint64_t seed;
    fl_flag fl[] = {
        {"keep", FL_DOUBLE, &keep, "0.75", "fraction of experts kept per MoE layer", 0},
        {"rank", FL_STRING, &rank_s, "ssmoe", "ranking: router | ssmoe | random", 0},
        {"calib", FL_INT, &calib, "1000", "calibration images (the first ones of the training split)", 0},
        {"alpha", FL_DOUBLE, &alpha, "0.5", "ssmoe ranking: weight of the EV router in the mix", 0},
        {"ev-c", FL_INT, &c, "5", "ssmoe ranking: singular vectors per descriptor", 0},
        {"ev-avg", FL_BOOL, &avg, "0", "ssmoe ranking: averaged-EV descriptors", 0},
        {"seed", FL_U64, &seed, "1", "random ranking: seed", 0},
        {"data", FL_STRING, &data, SM_FASHION_MNIST_DIR, "directory with the Fashion-MNIST IDX .gz files", 0},
        {"out", FL_STRING, &out, NULL, "path of the pruned checkpoint (required)", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "ssmoe prune", "CHECKPOINT --out PATH [flags]", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    sm_expert_rank rank;
    if (parse_rank("ssmoe prune", rank_s, &rank)) return CLI_EXIT_USAGE;
    if (npos != 1 || !out || !(keep > 0 && keep <= 1) || calib < 1 || c < 1 || !(alpha >= 0 && alpha <= 1)) {
        fprintf(stderr, "specmoe ssmoe prune: need CHECKPOINT and --out, --keep in (0, 1], --calib and --ev-c >= 1, "
                        "--alpha in [0, 1]\n");
        return CLI_EXIT_USAGE;
    }
    sm_error err;
    sm_model_config mc;
    sm_status st = sm_checkpoint_read_config(pos[0], &mc, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    if (!cli_config_has_moe(&mc)) {
        fprintf(stderr, "specmoe ssmoe prune: %s: the checkpoint has no MoE layer; there are no experts to prune\n", pos[0]);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(mc.moe.router.name, "topk") != 0) {
        fprintf(stderr, "specmoe ssmoe prune: %s: the router is '%s'; pruning ranks the experts of topk models\n", pos[0],
                mc.moe.router.name);
        return CLI_EXIT_USAGE;
    }
    sm_model *m = sm_model_create(&mc, 500, NULL, &err);
    if (!m) return cli_fail(SM_ERR_FORMAT, &err);
    st = sm_checkpoint_load(pos[0], m, NULL, NULL, &err);
    sm_dataset ds = {0};
    if (st == SM_OK) st = sm_dataset_load_fashion(&ds, data, "train", &err);
    if (st != SM_OK) {
        sm_model_free(m);
        return cli_fail(st, &err);
    }
    if (calib > ds.n) calib = ds.n;
    const int E = mc.moe.router.E, L = sm_model_n_moe(m);
    int E_keep = (int)lround(keep * E);
    if (E_keep < 1) E_keep = 1;
    double *score = malloc(sizeof(double) * (size_t)L * E);
    int *kept = malloc(sizeof(int) * (size_t)L * E_keep);
    sm_model *p = NULL;
    st = sm_expert_scores(m, ds.x, calib, rank, alpha, c, avg, seed, score, &err);
    if (st == SM_OK) {
        for (int l = 0; l < L; l++) keep_top(score + l * E, E, E_keep, 1, kept + l * E_keep, l, rank_s);
        p = sm_model_prune_experts(m, kept, E_keep, &err);
        if (!p) st = SM_ERR_ARG;
    }
    if (st == SM_OK) st = sm_checkpoint_save(out, p, NULL, NULL, &err);
    if (st == SM_OK) printf("wrote %s: %d of %d experts per MoE layer (%zu parameters, was %zu)\n", out, E_keep, E,
                            p->params.total, m->params.total);
    free(score);
    free(kept);
    sm_model_free(p);
    sm_model_free(m);
    sm_dataset_free(&ds);
    return st == SM_OK ? 0 : cli_fail(st, &err);
}

/* ---------------------------------------------------------------------------------------------- */
/* Hugging Face models */

static void print_model(const sm_hf_model *m) {
    const sm_hf_config *c = &m->cfg;
    static const char *storage[] = {"per-expert tensors", "fused gate_up_proj (E, 2I, d)", "fused gate_up_proj (E, d, 2I)"};
    printf("%s: %s, %d of %d layers MoE, %d experts (top-%d%s), d %d, I %d, %s%s, %d shard%s\n", m->dir, c->model_type,
           m->n_moe, c->n_layers, c->E, c->k, c->norm_topk ? ", renormalised" : "", c->d, c->inter,
           storage[m->moe[0].storage], c->shared ? ", shared experts kept as they are" : "", m->n_shards,
           m->n_shards == 1 ? "" : "s");
}

/* Opens and describes a model directory; a refusal is printed (a runtime error: exit 1). */
static int open_model(const char *dir, sm_hf_model *m) {
    sm_error err;
    sm_status st = sm_hf_open(m, dir, &err);
    if (st != SM_OK) {
        cli_fail(st, &err);
        return 1;
    }
    print_model(m);
    return 0;
}

static void print_memory(const sm_hf_model *m) {
    size_t layer = 0;
    for (int l = 0; l < m->n_moe; l++) {
        size_t b = sm_hf_layer_expert_bytes(m, l);
        layer = b > layer ? b : layer;
    }
    double peak = (double)sm_peak_rss_bytes();
    printf("peak memory %.1f MiB; one layer's expert weights %.1f MiB (ratio %.2f)\n", peak / 1048576.0,
           (double)layer / 1048576.0, layer ? peak / (double)layer : 0.0);
}

static int hf_build(int argc, char **argv) {
    const char *dir, *out, *report, *calib;
    int c, avg, threads;
    double alpha;
    fl_flag fl[] = {
        {"hf", FL_STRING, &dir, NULL, "Hugging Face model directory: config.json + model.safetensors or shards (required)", 0},
        {"out", FL_STRING, &out, NULL, "EV router file (default DIR/ev_router.safetensors)", 0},
        {"report", FL_STRING, &report, NULL, "JSON report (default: the --out path with .json for .safetensors)", 0},
        {"ev-c", FL_INT, &c, "50", "singular vectors averaged per descriptor (50 in the paper's language models)", 0},
        {"ev-avg", FL_BOOL, &avg, "0", "averaged-EV variant: the top-c by singular value, no router row", 0},
        {"calib", FL_STRING, &calib, NULL, "calibration inputs for the router/SSMoE overlap (safetensors, README)", 0},
        {"alpha", FL_DOUBLE, &alpha, "0.5", "weight of the EV router in the mix (overlap statistic)", 0},
        {"threads", FL_INT, &threads, "2", "OpenMP threads (experts in parallel)", 0},
    };
    int npos;
    const char *pos[1];
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 3, "ssmoe build", "--hf DIR [flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (!dir || c < 1 || threads < 1 || !(alpha >= 0 && alpha <= 1)) {
        fprintf(stderr, "specmoe ssmoe build: need --hf DIR, --ev-c >= 1, --threads >= 1, --alpha in [0, 1]\n");
        return CLI_EXIT_USAGE;
    }
    cli_set_threads(threads);
    char out_buf[4096], rep_buf[4096];
    if (!out) {
        snprintf(out_buf, sizeof out_buf, "%s/ev_router.safetensors", dir);
        out = out_buf;
    }
    if (!report) {
        size_t n = strlen(out);
        if (n > 12 && !strcmp(out + n - 12, ".safetensors")) snprintf(rep_buf, sizeof rep_buf, "%.*s.json", (int)(n - 12), out);
        else snprintf(rep_buf, sizeof rep_buf, "%s.json", out);
        report = rep_buf;
    }
    double t0 = sm_time_now();
    sm_error err;
    sm_hf_model m;
    if (open_model(dir, &m)) return CLI_EXIT_RUNTIME;
    sm_status st = SM_OK;
    const int E = m.cfg.E, d = m.cfg.d;
    /* the layout first (one (3E, d) W_EV per MoE layer, named after the block), then layer by layer */
    sm_st_writer w;
    sm_st_writer_init(&w);
    char (*names)[128] = calloc((size_t)m.n_moe, sizeof *names);
    char cbuf[32];
    st = names ? SM_OK : sm_fail(&err, SM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < m.n_moe && st == SM_OK; l++) {
        snprintf(names[l], sizeof names[l], "%s.ev_gate.weight", m.moe[l].block);
        st = sm_st_writer_add_layout(&w, names[l], SM_DT_F32, 2, (int64_t[]){3 * (int64_t)E, d}, &err);
    }
    snprintf(cbuf, sizeof cbuf, "%d", c);
    const char *meta[][2] = {{"format", "pt"},
                             {"specmoe", "ssmoe ev router"},
                             {"model_type", m.cfg.model_type},
                             {"ev_c", cbuf},
                             {"ev_avg", avg ? "1" : "0"},
                             {"rows", "expert-major: (gate, up, down^T) descriptors of expert 0, then expert 1, ..."},
                             {"logits", "EV logit of expert e = mean over its 3 rows of x . row"},
                             {"sign", "every right singular vector has its largest-magnitude component positive"}};
    for (size_t i = 0; i < sizeof meta / sizeof meta[0] && st == SM_OK; i++) st = sm_st_writer_meta(&w, meta[i][0], meta[i][1], &err);
    sm_st_stream s;
    int open_stream = 0;
    if (st == SM_OK && (st = sm_st_stream_begin(&s, &w, out, &err)) == SM_OK) open_stream = 1;
    float *router = malloc(sizeof(float) * (size_t)E * d), *ev = malloc(sizeof(float) * (size_t)E * 3 * d);
    float *dbar = malloc(sizeof(float) * (size_t)E * d);
    double *mr = malloc(sizeof(double) * (size_t)E);
    if (st == SM_OK && (!router || !ev || !dbar || !mr)) st = sm_fail(&err, SM_ERR_NOMEM, "out of memory");
    cJSON *rep = cJSON_CreateObject(), *layers = cJSON_CreateArray();
    cJSON_AddStringToObject(rep, "model_dir", dir);
    cJSON_AddStringToObject(rep, "model_type", m.cfg.model_type);
    cJSON_AddNumberToObject(rep, "experts", E);
    cJSON_AddNumberToObject(rep, "top_k", m.cfg.k);
    cJSON_AddNumberToObject(rep, "hidden_size", d);
    cJSON_AddNumberToObject(rep, "intermediate_size", m.cfg.inter);
    cJSON_AddNumberToObject(rep, "ev_c", c);
    cJSON_AddBoolToObject(rep, "ev_avg", avg);
    cJSON_AddStringToObject(rep, "ev_router", out);
    for (int l = 0; l < m.n_moe && st == SM_OK; l++) {
        double tl = sm_time_now();
        st = sm_hf_read_router(&m, l, router, &err);
        if (st == SM_OK) st = sm_hf_build_ev(&m, l, c, avg, router, ev, &err);
        if (st == SM_OK) st = sm_st_stream_write_f32(&s, ev, (size_t)E * 3 * d, &err);
        if (st != SM_OK) break;
        double secs = sm_time_now() - tl;
        sm_hf_ev_mean(ev, E, d, dbar);
        double rcorr = sm_mean_abs_offdiag_corr(router, E, d), ecorr = sm_mean_abs_offdiag_corr(dbar, E, d);
        double overlap = NAN;
        if (calib) {
            float *x = NULL;
            int T = 0;
            st = sm_hf_read_calib(calib, m.moe[l].block, d, &x, &T, &err);
            if (st == SM_OK) st = sm_hf_route_stats(&m, router, ev, x, T, alpha, mr, NULL, &overlap, &err);
            free(x);
            if (st != SM_OK) break;
        }
        cJSON *jl = cJSON_CreateObject();
        cJSON_AddNumberToObject(jl, "layer", m.moe[l].layer);
        cJSON_AddStringToObject(jl, "block", m.moe[l].block);
        cJSON_AddStringToObject(jl, "tensor", names[l]);
        cJSON_AddNumberToObject(jl, "router_corr", rcorr);
        cJSON_AddNumberToObject(jl, "ev_corr", ecorr);
        if (calib) cJSON_AddNumberToObject(jl, "overlap", overlap);
        cJSON_AddNumberToObject(jl, "seconds", secs);
        cJSON_AddItemToArray(layers, jl);
        printf("layer %d (%s): router-row correlation %.4f, EV-descriptor correlation %.4f", m.moe[l].layer,
               m.moe[l].block, rcorr, ecorr);
        if (calib) printf(", top-%d overlap SSMoE/router %.4f (alpha %.2f)", m.cfg.k, overlap, alpha);
        printf(", %.2f s\n", secs);
    }
    if (st == SM_OK) st = sm_st_stream_finish(&s, &err);
    else if (open_stream) sm_st_stream_abort(&s);
    double total = sm_time_now() - t0;
    cJSON_AddNumberToObject(rep, "seconds", total);
    cJSON_AddNumberToObject(rep, "peak_rss_bytes", (double)sm_peak_rss_bytes());
    cJSON_AddItemToObject(rep, "layers", layers);
    char *text = cJSON_Print(rep);
    if (st == SM_OK && (!text || cli_write_text(report, text) != 0)) st = sm_fail(&err, SM_ERR_IO, "%s: cannot write", report);
    if (st == SM_OK) {
        printf("wrote %s (%d MoE layers, W_EV (%d, %d) each) and %s in %.2f s\n", out, m.n_moe, 3 * E, d, report, total);
        print_memory(&m);
    }
    free(text);
    cJSON_Delete(rep);
    free(router); free(ev); free(dbar); free(mr); free(names);
    sm_st_writer_free(&w);
    sm_hf_close(&m);
    return st == SM_OK ? 0 : cli_fail(st == SM_ERR_ARG ? SM_ERR_FORMAT : st, &err);
}

/* Descriptors of MoE layer l from an EV router file written by `ssmoe build`: ev (E, 3, d). */
static sm_status read_cached_ev(const sm_safetensors *f, const sm_hf_model *m, int l, float *ev, sm_error *err) {
    char name[160];
    snprintf(name, sizeof name, "%s.ev_gate.weight", m->moe[l].block);
    const sm_st_tensor *t = sm_safetensors_find(f, name);
    if (!t) return sm_fail(err, SM_ERR_FORMAT, "%s: no tensor '%s' (was it built from this model?)", f->path, name);
    if (t->ndim != 2 || t->shape[0] != 3 * (int64_t)m->cfg.E || t->shape[1] != m->cfg.d)
        return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' is not (%d, %d): built from another model?", f->path, name,
                       3 * m->cfg.E, m->cfg.d);
    return sm_st_read_f32(f, t, 0, t->numel, ev, err);
}

static int hf_prune(int argc, char **argv) {
    const char *dir, *out, *rank_s, *calib, *ev_path;
    double keep, alpha;
    int c, avg, threads;
    uint64_t seed;
    fl_flag fl[] = {
        {"hf", FL_STRING, &dir, NULL, "Hugging Face model directory (required)", 0},
        {"out", FL_STRING, &out, NULL, "directory of the pruned model (required; not the source)", 0},
        {"keep", FL_DOUBLE, &keep, "0.75", "fraction of experts kept per MoE layer", 0},
        {"rank", FL_STRING, &rank_s, "ssmoe", "ranking: router | ssmoe | random", 0},
        {"calib", FL_STRING, &calib, NULL, "calibration inputs (safetensors, README); needed by router and ssmoe", 0},
        {"alpha", FL_DOUBLE, &alpha, "0.5", "ssmoe ranking: weight of the EV router in the mix", 0},
        {"ev-c", FL_INT, &c, "50", "ssmoe ranking: singular vectors per descriptor", 0},
        {"ev-avg", FL_BOOL, &avg, "0", "ssmoe ranking: averaged-EV descriptors", 0},
        {"ev", FL_STRING, &ev_path, NULL, "ssmoe ranking: descriptors cached by `ssmoe build` (no SVDs are run)", 0},
        {"seed", FL_U64, &seed, "1", "random ranking: seed", 0},
        {"threads", FL_INT, &threads, "2", "OpenMP threads (experts in parallel)", 0},
    };
    const int nfl = (int)(sizeof fl / sizeof fl[0]);
    int npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "ssmoe prune", "--hf DIR --out DIR [flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    sm_expert_rank rank;
    if (parse_rank("ssmoe prune", rank_s, &rank)) return CLI_EXIT_USAGE;
    if (!dir || !out || !(keep > 0 && keep <= 1) || c < 1 || threads < 1 || !(alpha >= 0 && alpha <= 1)) {
        fprintf(stderr, "specmoe ssmoe prune: need --hf DIR and --out DIR, --keep in (0, 1], --ev-c and --threads >= 1, "
                        "--alpha in [0, 1]\n");
        return CLI_EXIT_USAGE;
    }
    if (rank != SM_RANK_RANDOM && !calib) {
        fprintf(stderr, "specmoe ssmoe prune: --rank %s needs --calib FILE (the MoE blocks' inputs)\n", rank_s);
        return CLI_EXIT_USAGE;
    }
    sm_error oerr; /* a bad --out is a usage error (exit 2), found before the scoring pass */
    sm_status ost = sm_hf_check_prune_out(dir, out, &oerr);
    if (ost != SM_OK) return cli_fail(ost, &oerr);
    cli_set_threads(threads);
    double t0 = sm_time_now();
    sm_error err;
    sm_hf_model m;
    if (open_model(dir, &m)) return CLI_EXIT_RUNTIME;
    sm_status st = SM_OK;
    sm_safetensors evf = {0};
    if (ev_path && rank == SM_RANK_SSMOE) { /* the cache must match what the flags ask for */
        st = sm_safetensors_open(&evf, ev_path, &err);
        const char *fc = st == SM_OK ? sm_safetensors_meta(&evf, "ev_c") : NULL;
        const char *fa = st == SM_OK ? sm_safetensors_meta(&evf, "ev_avg") : NULL;
        if (st == SM_OK && (!fc || !fa))
            st = sm_fail(&err, SM_ERR_FORMAT, "%s: no ev_c / ev_avg metadata: not written by `specmoe ssmoe build`", ev_path);
        if (st == SM_OK && ((fl_find(fl, nfl, "ev-c")->set && atoi(fc) != c) || (fl_find(fl, nfl, "ev-avg")->set && atoi(fa) != avg)))
            st = sm_fail(&err, SM_ERR_FORMAT, "%s: built with ev_c %s, ev_avg %s; the flags ask for %d, %d", ev_path, fc, fa,
                         c, avg);
        if (st == SM_OK) {
            printf("descriptors from %s (ev_c %s, ev_avg %s)\n", ev_path, fc, fa);
            c = atoi(fc); /* what the report records */
            avg = atoi(fa);
        }
    }
    const int E = m.cfg.E, d = m.cfg.d, L = m.n_moe;
    int E_keep = (int)lround(keep * E);
    if (E_keep < 1) E_keep = 1;
    float *router = malloc(sizeof(float) * (size_t)E * d);
    float *ev = rank == SM_RANK_SSMOE ? malloc(sizeof(float) * (size_t)E * 3 * d) : NULL;
    double *mr = malloc(sizeof(double) * (size_t)E), *mm = malloc(sizeof(double) * (size_t)E);
    double *score = malloc(sizeof(double) * (size_t)L * E);
    int *kept = malloc(sizeof(int) * (size_t)L * E_keep);
    if (!router || !mr || !mm || !score || !kept || (rank == SM_RANK_SSMOE && !ev)) st = sm_fail(&err, SM_ERR_NOMEM, "out of memory");
    sm_rng rng;
    sm_rng_seed(&rng, seed);
    /* pass 1, one layer at a time: score the experts (router / ssmoe on the calibration inputs) */
    for (int l = 0; l < L && st == SM_OK; l++) {
        double *sc = score + (size_t)l * E;
        if (rank == SM_RANK_RANDOM) {
            for (int e = 0; e < E; e++) sc[e] = sm_rng_uniform(&rng);
        } else {
            float *x = NULL;
            int T = 0;
            st = sm_hf_read_router(&m, l, router, &err);
            if (st == SM_OK && ev)
                st = evf.path ? read_cached_ev(&evf, &m, l, ev, &err) : sm_hf_build_ev(&m, l, c, avg, router, ev, &err);
            if (st == SM_OK) st = sm_hf_read_calib(calib, m.moe[l].block, d, &x, &T, &err);
            if (st == SM_OK) st = sm_hf_route_stats(&m, router, ev, x, T, alpha, mr, mm, NULL, &err);
            free(x);
            for (int e = 0; e < E && st == SM_OK; e++) sc[e] = rank == SM_RANK_ROUTER ? mr[e] : mm[e];
        }
        if (st == SM_OK) keep_top(sc, E, E_keep, sm_hf_pruned_groups(&m.cfg, E_keep), kept + (size_t)l * E_keep, m.moe[l].layer, rank_s);
    }
    /* pass 2: the pruned copy, streamed tensor by tensor */
    if (st == SM_OK) st = sm_hf_prune(&m, kept, E_keep, out, &err);
    if (st == SM_OK) { /* what was kept, for the record */
        cJSON *rep = cJSON_CreateObject(), *layers = cJSON_CreateArray();
        cJSON_AddStringToObject(rep, "source", dir);
        cJSON_AddStringToObject(rep, "rank", rank_s);
        cJSON_AddNumberToObject(rep, "keep", keep);
        cJSON_AddNumberToObject(rep, "experts_before", E);
        cJSON_AddNumberToObject(rep, "experts_after", E_keep);
        if (rank == SM_RANK_SSMOE) {
            cJSON_AddNumberToObject(rep, "alpha", alpha);
            cJSON_AddNumberToObject(rep, "ev_c", c);
        }
        for (int l = 0; l < L; l++) {
            cJSON *jl = cJSON_CreateObject();
            cJSON_AddNumberToObject(jl, "layer", m.moe[l].layer);
            cJSON_AddItemToObject(jl, "kept", cJSON_CreateIntArray(kept + (size_t)l * E_keep, E_keep));
            cJSON_AddItemToObject(jl, "scores", cJSON_CreateDoubleArray(score + (size_t)l * E, E));
            cJSON_AddItemToArray(layers, jl);
        }
        cJSON_AddItemToObject(rep, "layers", layers);
        char *text = cJSON_Print(rep), path[4096];
        snprintf(path, sizeof path, "%s/specmoe_prune.json", out);
        if (!text || cli_write_text(path, text) != 0) st = sm_fail(&err, SM_ERR_IO, "%s: cannot write", path);
        free(text);
        cJSON_Delete(rep);
    }
    if (st == SM_OK) {
        printf("wrote %s: %d of %d experts in each of %d MoE layers (%s ranking) in %.2f s\n", out, E_keep, E, L, rank_s,
               sm_time_now() - t0);
        print_memory(&m);
    }
    free(router); free(ev); free(mr); free(mm); free(score); free(kept);
    sm_safetensors_free(&evf);
    sm_hf_close(&m);
    return st == SM_OK ? 0 : cli_fail(st == SM_ERR_ARG ? SM_ERR_FORMAT : st, &err);
}
