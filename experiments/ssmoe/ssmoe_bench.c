/* specmoe bench ssmoe: SSMoE (papers/001) Table 1 (expert dropping, SSMoE-full) and Table 6 (the
 * alpha / top-c ablation) at CPU scale, on Fashion-MNIST.
 *
 * Per (configuration, seed) one MoE classifier (default "dense:128,moe:128,moe:128", residual off,
 * ReLU, topk router with renormalised top-k weights) is trained with AdamW on a cosine schedule. Then,
 * with no further training, the test accuracy of these variants is measured on clean test images and
 * on corrupted ones (x + N(0, severity^2) per pixel, clipped to [0, 1], seeded by the seed only, so
 * both configurations of a seed see the same corruption):
 *
 *   Original          the trained model, learned top-k router, all experts
 *   SSMoE-full        all experts, mixed routing P = alpha p_ev + (1 - alpha) p_r (router "ev", c)
 *   SSMoE-avgEV       as SSMoE-full with the router-free averaged-EV descriptors (ev_avg 1)
 *   RandDrop          keep round(keep * E) experts per MoE layer chosen at random; learned router
 *   Router-drop       keep the experts with the highest mean learned-router probability; learned router
 *   SSMoE-drop        keep the experts with the highest mean mixed probability P; learned router
 *   SSMoE-drop+mixed  the SSMoE-drop model routed with P (descriptors rebuilt on the kept experts,
 *                     which leaves them unchanged: a descriptor depends only on its own expert)
 *
 * Rankings use sm_expert_scores on the calibration set (the first --calib training images) and the
 * pruned models come from sm_model_prune_experts (experts physically removed, k = min(k, E_keep)).
 * The ablation sweeps alpha (c fixed at --ev-c) and c (alpha fixed at --alpha) for SSMoE-full.
 * Collapse diagnostic per MoE layer: sm_mean_abs_offdiag_corr of the learned router rows (E, d) and of
 * the mean EV descriptors (E, d) (mean of the W1 and W2^T descriptors, c = --ev-c, signed selection).
 *
 * Runs (configuration x seed) are independent: OpenMP over them, each run single-threaded.
 * Letters: E experts, k experts per token, L MoE layers, d layer width.
 *
 * parse (flags -> ssmoe_settings, every check before any work), run (settings -> ssmoe_results: one
 * trained model and its variants per configuration and seed; progress lines on stderr), report
 * (results -> Markdown on stdout and in OUT/ssmoe.md, OUT/ssmoe.json).
 */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"

#define MAX_CFG 4
#define MAX_L 4
#define MAX_SWEEP 16

enum { M_ORIG = 0, M_FULL, M_AVG, M_RAND, M_ROUTER, M_SSDROP, M_SSDROP_MIX, N_METHODS };
static const char *kNames[N_METHODS] = {"Original", "SSMoE-full", "SSMoE-avgEV", "RandDrop", "Router-drop",
                                        "SSMoE-drop", "SSMoE-drop + mixed"};
static const char *kRouting[N_METHODS] = {"learned top-k", "mixed EV+router", "mixed avgEV+router", "learned top-k",
                                          "learned top-k", "learned top-k", "mixed EV+router"};

typedef struct {
    const char *arch, *data, *out_dir;
    int seeds, epochs, batch, calib, ev_c, threads, seed_offset, eval_batch;
    double lr, wd, keep, severity, alpha;
    int n_cfg, cfg_E[MAX_CFG], cfg_k[MAX_CFG];
    int n_alpha, n_c;
    double alphas[MAX_SWEEP];
    int cs[MAX_SWEEP];
} ssmoe_settings;

typedef struct {
    int ok, n_moe, E_keep;
    double acc[N_METHODS][2];        /* [method][clean, corrupted], fractions */
    double acc_alpha[MAX_SWEEP][2];  /* SSMoE-full, c = ev_c */
    double acc_c[MAX_SWEEP][2];      /* SSMoE-full, alpha = alpha */
    double corr_router[MAX_L], corr_ev[MAX_L];
    double train_s, eval_s;
} run_result;

typedef struct {
    run_result *res; /* res[ci * seeds + seed] */
    int runs, failed;
    double seconds;
} ssmoe_results;

static sm_status make_config(sm_model_config *mc, const ssmoe_settings *o, int E, int k, sm_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* parse */

/* "0,0.3,0.5" -> values; -1 on a malformed list. */
static int parse_doubles(const char *s, double *v, int max) {
    int n = 0;
    while (*s) {
        char *end;
        double x = strtod(s, &end);
        if (end == s || !isfinite(x) || n >= max) return -1;
        v[n++] = x;
        if (*end == ',') s = end + 1;
        else if (*end == 0) s = end;
        else return -1;
    }
    return n;
}

/* "16:2,32:4" -> (E, k) pairs; -1 on a malformed list. */
static int parse_configs(const char *s, int *E, int *k, int max) {
    int n = 0;
    while (*s) {
        int e, kk, used;
        if (n >= max || sscanf(s, "%d:%d%n", &e, &kk, &used) != 2) return -1;
        E[n] = e;
        k[n++] = kk;
        s += used;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

/* flags -> settings; returns 0, 1 after --help, 2 after a usage error (printed), like fl_parse */
static int parse(ssmoe_settings *o, int argc, char **argv) {
    const char *configs_s, *alphas_s, *cs_s;
    fl_flag fl[] = {
        {"configs", FL_STRING, &configs_s, "16:2,32:4", "comma-separated E:k MoE configurations", 0},
        {"arch", FL_STRING, &o->arch, "dense:128,moe:128,moe:128", "layers (residual off, ReLU, topk router, renorm on)", 0},
        {"seeds", FL_INT, &o->seeds, "5", "seeds per configuration", 0},
        {"seed-offset", FL_INT, &o->seed_offset, "0", "first seed", 0},
        {"epochs", FL_INT, &o->epochs, "3", "training epochs over the 60000 training images", 0},
        {"batch", FL_INT, &o->batch, "128", "training batch", 0},
        {"lr", FL_DOUBLE, &o->lr, "1e-3", "AdamW learning rate (cosine decay to 0)", 0},
        {"wd", FL_DOUBLE, &o->wd, "0", "AdamW decoupled weight decay", 0},
        {"keep", FL_DOUBLE, &o->keep, "0.75", "fraction of experts kept by the dropping methods", 0},
        {"calib", FL_INT, &o->calib, "1000", "calibration images for the rankings (the first training images)", 0},
        {"alpha", FL_DOUBLE, &o->alpha, "0.5", "EV weight of the mixed routing (SSMoE-full, -avgEV, -drop)", 0},
        {"ev-c", FL_INT, &o->ev_c, "5", "singular vectors kept per descriptor (top-c)", 0},
        {"alphas", FL_STRING, &alphas_s, "0,0.3,0.5,0.7,0.9,1", "alpha sweep of SSMoE-full (c = --ev-c)", 0},
        {"cs", FL_STRING, &cs_s, "5,10,20,50", "top-c sweep of SSMoE-full (alpha = --alpha)", 0},
        {"severity", FL_DOUBLE, &o->severity, "0.3", "std of the Gaussian pixel noise of the corrupted test set", 0},
        {"eval-batch", FL_INT, &o->eval_batch, "500", "evaluation batch", 0},
        {"threads", FL_INT, &o->threads, "2", "runs in parallel (each single-threaded)", 0},
        {"data", FL_STRING, &o->data, SM_FASHION_MNIST_DIR, "directory with the Fashion-MNIST IDX .gz files", 0},
        {"out", FL_STRING, &o->out_dir, "runs/bench-ssmoe", "directory for ssmoe.md and ssmoe.json", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "bench ssmoe", "[flags]", pos, 0, &npos);
    if (rc) return rc;
    /* every check before any work */
    o->n_cfg = parse_configs(configs_s, o->cfg_E, o->cfg_k, MAX_CFG);
    int bad_cfg = o->n_cfg < 1;
    for (int i = 0; i < o->n_cfg; i++) bad_cfg |= o->cfg_E[i] < 2 || o->cfg_k[i] < 1 || o->cfg_k[i] > o->cfg_E[i];
    if (bad_cfg) {
        fprintf(stderr, "specmoe bench ssmoe: --configs: expected 1-%d pairs E:k with E >= 2 and 1 <= k <= E (got '%s')\n",
                MAX_CFG, configs_s);
        return 2;
    }
    o->n_alpha = parse_doubles(alphas_s, o->alphas, MAX_SWEEP);
    int bad_a = o->n_alpha < 1;
    for (int i = 0; i < o->n_alpha; i++) bad_a |= !(o->alphas[i] >= 0 && o->alphas[i] <= 1);
    double cd[MAX_SWEEP];
    o->n_c = parse_doubles(cs_s, cd, MAX_SWEEP);
    int bad_c = o->n_c < 1;
    for (int i = 0; i < o->n_c; i++) {
        bad_c |= !(cd[i] >= 1 && cd[i] <= 1e6 && cd[i] == floor(cd[i]));
        o->cs[i] = bad_c ? 0 : (int)cd[i];
    }
    if (bad_a || bad_c) {
        fprintf(stderr, "specmoe bench ssmoe: --alphas needs 1-%d values in [0, 1], --cs 1-%d integers >= 1\n", MAX_SWEEP,
                MAX_SWEEP);
        return 2;
    }
    if (o->seeds < 1 || o->seeds > 1024 || o->seed_offset < 0 || o->epochs < 1 || o->batch < 1 || !(o->lr > 0) ||
        !isfinite(o->lr) || !(o->wd >= 0) || !(o->keep > 0 && o->keep <= 1) || o->calib < 1 || !(o->alpha >= 0 && o->alpha <= 1) ||
        o->ev_c < 1 || !(o->severity >= 0) || !isfinite(o->severity) || o->eval_batch < 1 || o->threads < 1) {
        fprintf(stderr, "specmoe bench ssmoe: --seeds in [1, 1024]; --epochs, --batch, --calib, --ev-c, --eval-batch, "
                        "--threads >= 1; --seed-offset >= 0; --lr > 0; --wd >= 0; --keep in (0, 1]; --alpha in [0, 1]; "
                        "--severity >= 0\n");
        return 2;
    }
    sm_error err;
    {
        sm_model_config mc;
        if (make_config(&mc, o, o->cfg_E[0], o->cfg_k[0], &err) != SM_OK) {
            fprintf(stderr, "specmoe bench ssmoe: --arch: %s\n", err.msg);
            return 2;
        }
        int nm = 0, bad = 0;
        for (int i = 0; i < mc.n_layers; i++) {
            nm += mc.layers[i].kind == SM_LAYER_MOE;
            bad |= mc.layers[i].kind != SM_LAYER_DENSE && mc.layers[i].kind != SM_LAYER_MOE && mc.layers[i].kind != SM_LAYER_FFN &&
                   mc.layers[i].kind != SM_LAYER_LN;
        }
        if (nm < 1 || nm > MAX_L || bad || mc.layers[0].kind != SM_LAYER_DENSE) {
            fprintf(stderr, "specmoe bench ssmoe: --arch: need a dense first layer, then dense/ffn/ln/moe layers with 1-%d "
                            "MoE layers (got '%s')\n", MAX_L, o->arch);
            return 2;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* run */

static sm_status make_config(sm_model_config *mc, const ssmoe_settings *o, int E, int k, sm_error *err) {
    sm_model_config_default(mc);
    sm_status st = sm_model_parse_arch(mc, o->arch, err);
    if (st != SM_OK) return st;
    mc->in_c = 1;
    mc->in_h = mc->in_w = 28;
    mc->in_dim = 784;
    mc->n_classes = 10;
    mc->act = SM_ACT_RELU;
    mc->residual = 0;
    mc->moe.act = SM_ACT_RELU;
    sm_router_config *r = &mc->moe.router;
    sm_router_config_default(r);
    strcpy(r->name, "topk");
    r->E = E;
    r->k = k;
    r->renorm = 1;
    return SM_OK;
}

/* Accuracy on the clean and the corrupted test sets. */
static sm_status eval2(sm_model *m, const sm_dataset *clean, const sm_dataset *noisy, int eb, double out[2], sm_error *err) {
    sm_eval_result r;
    sm_status st = sm_evaluate(m, clean, eb, &r, err);
    if (st != SM_OK) return st;
    out[0] = r.acc;
    st = sm_evaluate(m, noisy, eb, &r, err);
    out[1] = r.acc;
    return st;
}

/* Ranks and prunes: the E_keep highest scores of each MoE layer (ties: lower index), in expert order. */
static sm_model *rank_and_prune(sm_model *m, const float *calib, int n_calib, sm_expert_rank rank,
                                const ssmoe_settings *o,
                                uint64_t seed, int E_keep, sm_error *err) {
    const int E = m->cfg.moe.router.E, L = sm_model_n_moe(m);
    double *score = malloc(sizeof(double) * (size_t)L * E);
    int *keep = malloc(sizeof(int) * (size_t)L * E_keep);
    sm_model *p = NULL;
    if (score && keep && sm_expert_scores(m, calib, n_calib, rank, o->alpha, o->ev_c, 0, seed, score, err) == SM_OK) {
        for (int l = 0; l < L; l++) {
            int *kl = keep + l * E_keep, n = 0;
            for (int e = 0; e < E; e++) { /* rank of e = number of experts strictly ahead of it */
                int ahead = 0;
                for (int f = 0; f < E; f++)
                    ahead += score[l * E + f] > score[l * E + e] || (score[l * E + f] == score[l * E + e] && f < e);
                if (ahead < E_keep) kl[n++] = e;
            }
        }
        p = sm_model_prune_experts(m, keep, E_keep, err);
    } else if (!score || !keep) {
        sm_fail(err, SM_ERR_NOMEM, "bench ssmoe: out of memory");
    }
    free(score);
    free(keep);
    return p;
}

/* one run: train, then every training-free variant */
static sm_status one_run(const ssmoe_settings *o, int ci, int seed, const sm_dataset *train, const sm_dataset *test,
                         run_result *R, sm_error *err) {
    const uint64_t us = (uint64_t)seed;
    const int E = o->cfg_E[ci], maxT = o->batch > o->eval_batch ? o->batch : o->eval_batch;
    sm_model_config mc;
    sm_model *m = NULL, *ev = NULL, *p = NULL, *pev = NULL;
    sm_dataset noisy = *test;
    noisy.x = NULL;
    sm_status st = make_config(&mc, o, E, o->cfg_k[ci], err);
    if (st != SM_OK) return st;
    sm_rng init;
    sm_rng_seed(&init, 1000003ULL * (us + 1) + 7919ULL * (uint64_t)E);
    m = sm_model_create(&mc, maxT, &init, err);
    if (!m) return SM_ERR_ARG;
    sm_train_config tc;
    cli_bench_train_config(&tc, o->epochs, o->batch, o->lr, o->wd, 17 + us * 101 + (uint64_t)E);
    sm_train_result tres;
    double t0 = sm_time_now();
    st = sm_train(m, train, NULL, &tc, NULL, NULL, &tres, err);
    R->train_s = sm_time_now() - t0;
    t0 = sm_time_now();
    /* the corrupted test set: a function of the seed only */
    if (st == SM_OK) {
        noisy.x = malloc(sizeof(float) * (size_t)test->n * test->dim);
        if (!noisy.x) st = sm_fail(err, SM_ERR_NOMEM, "bench ssmoe: out of memory for the corrupted test set");
    }
    if (st == SM_OK) {
        sm_rng nr;
        sm_rng_seed(&nr, 0x5eed0000ULL + us);
        for (size_t i = 0; i < (size_t)test->n * test->dim; i++) {
            double v = test->x[i] + o->severity * sm_rng_normal(&nr);
            noisy.x[i] = (float)(v < 0 ? 0 : v > 1 ? 1 : v);
        }
    }
    const int L = sm_model_n_moe(m), n_calib = o->calib < train->n ? o->calib : train->n;
    R->n_moe = L;
    if (st == SM_OK) st = eval2(m, test, &noisy, o->eval_batch, R->acc[M_ORIG], err);
    /* the ablation; c = ev_c and alpha = alpha is SSMoE-full */
    for (int j = 0; j < o->n_c && st == SM_OK; j++) {
        ev = sm_ssmoe_twin(m, o->alpha, o->cs[j], 0, err);
        if (!ev) { st = SM_ERR_ARG; break; }
        st = eval2(ev, test, &noisy, o->eval_batch, R->acc_c[j], err);
        sm_model_free(ev);
        ev = NULL;
    }
    if (st == SM_OK) {
        ev = sm_ssmoe_twin(m, o->alpha, o->ev_c, 0, err);
        if (!ev) st = SM_ERR_ARG;
    }
    if (st == SM_OK) st = eval2(ev, test, &noisy, o->eval_batch, R->acc[M_FULL], err);
    for (int j = 0; j < o->n_alpha && st == SM_OK; j++) {
        char text[32];
        snprintf(text, sizeof text, "%.17g", o->alphas[j]);
        st = sm_model_set_dial(ev, "alpha", text, err);
        if (st == SM_OK) st = eval2(ev, test, &noisy, o->eval_batch, R->acc_alpha[j], err);
    }
    /* collapse diagnostic: router rows vs mean descriptors, per MoE layer */
    if (st == SM_OK) {
        sm_real *dbar = NULL;
        for (int i = 0, l = 0; i < ev->n_layers && st == SM_OK; i++) {
            sm_moe *moe = ev->layers[i].moe;
            if (!moe) continue;
            char name[64];
            snprintf(name, sizeof name, "layers.%d.router.weight", i);
            int iw = sm_params_find(&ev->params, name);
            snprintf(name, sizeof name, "layers.%d.router.ev", i);
            int iev = sm_params_find(&ev->params, name);
            const int d = moe->d;
            free(dbar);
            dbar = malloc(sizeof(sm_real) * (size_t)E * d);
            if (iw < 0 || iev < 0 || !dbar) {
                st = sm_fail(err, SM_ERR_MISMATCH, "bench ssmoe: layer %d: router tensors not found", i);
                break;
            }
            const sm_real *D = sm_params_data(&ev->params, iev); /* (E, 2, d) */
            for (int e = 0; e < E; e++)
                for (int k = 0; k < d; k++) dbar[(size_t)e * d + k] = (D[((size_t)e * 2) * d + k] + D[((size_t)e * 2 + 1) * d + k]) / 2;
            if (l < MAX_L) {
                R->corr_router[l] = sm_mean_abs_offdiag_corr(sm_params_data(&ev->params, iw), E, d);
                R->corr_ev[l] = sm_mean_abs_offdiag_corr(dbar, E, d);
            }
            l++;
        }
        free(dbar);
    }
    sm_model_free(ev);
    ev = NULL;
    if (st == SM_OK) {
        ev = sm_ssmoe_twin(m, o->alpha, o->ev_c, 1, err);
        if (!ev) st = SM_ERR_ARG;
    }
    if (st == SM_OK) st = eval2(ev, test, &noisy, o->eval_batch, R->acc[M_AVG], err);
    sm_model_free(ev);
    ev = NULL;
    /* dropping */
    int E_keep = (int)lround(o->keep * E);
    if (E_keep < 1) E_keep = 1;
    R->E_keep = E_keep;
    const sm_expert_rank ranks[3] = {SM_RANK_RANDOM, SM_RANK_ROUTER, SM_RANK_SSMOE};
    const int slots[3] = {M_RAND, M_ROUTER, M_SSDROP};
    for (int r = 0; r < 3 && st == SM_OK; r++) {
        p = rank_and_prune(m, train->x, n_calib, ranks[r], o, 0xd209ULL + us * 31 + (uint64_t)E, E_keep, err);
        if (!p) { st = SM_ERR_ARG; break; }
        st = eval2(p, test, &noisy, o->eval_batch, R->acc[slots[r]], err);
        if (st == SM_OK && ranks[r] == SM_RANK_SSMOE) {
            pev = sm_ssmoe_twin(p, o->alpha, o->ev_c, 0, err);
            if (!pev) st = SM_ERR_ARG;
            else st = eval2(pev, test, &noisy, o->eval_batch, R->acc[M_SSDROP_MIX], err);
            sm_model_free(pev);
            pev = NULL;
        }
        sm_model_free(p);
        p = NULL;
    }
    R->eval_s = sm_time_now() - t0;
    free(noisy.x);
    sm_model_free(m);
    R->ok = st == SM_OK;
    return st;
}

/* Loads Fashion-MNIST and does every run (configuration x seed); a failed run is reported on stderr
 * and left out (ok 0); only the data loading fails the whole run. The caller frees R->res. */
static sm_status run(const ssmoe_settings *o, ssmoe_results *R, sm_error *err) {
    memset(R, 0, sizeof *R);
    sm_dataset train = {0}, test = {0};
    sm_status st = sm_dataset_load_fashion(&train, o->data, "train", err);
    if (st == SM_OK) st = sm_dataset_load_fashion(&test, o->data, "test", err);
    if (st != SM_OK) {
        sm_dataset_free(&train);
        return st;
    }
    const int runs = o->n_cfg * o->seeds;
    run_result *res = calloc((size_t)runs, sizeof(run_result));
    double t0 = sm_time_now();
    omp_set_num_threads(o->threads);
    /* one run per thread; the BLAS calls inside run single-threaded (OpenBLAS-OpenMP in a region).
     * Runs are issued last configuration first: the larger models start early, which balances better. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < runs; i++) {
        int ci = o->n_cfg - 1 - i / o->seeds, s = i % o->seeds;
        sm_error e2;
        run_result *rr = &res[ci * o->seeds + s];
        if (one_run(o, ci, s + o->seed_offset, &train, &test, rr, &e2) != SM_OK) {
#pragma omp critical
            fprintf(stderr, "specmoe: bench ssmoe: E=%d k=%d seed %d: %s\n", o->cfg_E[ci], o->cfg_k[ci], s + o->seed_offset,
                    e2.msg);
        } else {
#pragma omp critical
            {
                fprintf(stderr, "bench ssmoe: E=%d k=%d seed %d done (train %.0f s, eval %.0f s, original %.2f%%)\n",
                        o->cfg_E[ci], o->cfg_k[ci], s + o->seed_offset, rr->train_s, rr->eval_s, 100 * rr->acc[M_ORIG][0]);
                fflush(stderr);
            }
        }
    }
    R->res = res;
    R->runs = runs;
    R->seconds = sm_time_now() - t0;
    for (int i = 0; i < runs; i++) R->failed += !res[i].ok;
    sm_dataset_free(&train);
    sm_dataset_free(&test);
    return SM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* report */

/* mean and 95% half-width over the successful seeds of configuration ci of the value at offset
 * (in doubles) inside run_result; scale multiplies (100 for percentages) */
static void seed_stat(const run_result *res, const ssmoe_settings *o, int ci, size_t off, double scale, double *mean,
                      double *half, int *cnt) {
    double v[1024];
    int n = 0;
    for (int s = 0; s < o->seeds && n < 1024; s++) {
        const run_result *r = &res[ci * o->seeds + s];
        if (r->ok) v[n++] = scale * *(const double *)((const char *)r + off);
    }
    sm_mean_ci95(v, n, mean, half);
    if (cnt) *cnt = n;
}

#define OFF(field) offsetof(run_result, field)

static void json_seeds(cli_buf *j, const run_result *res, const ssmoe_settings *o, int ci, size_t off) {
    cli_bprintf(j, "[");
    int first = 1;
    for (int s = 0; s < o->seeds; s++) {
        const run_result *r = &res[ci * o->seeds + s];
        if (!r->ok) continue;
        cli_bprintf(j, "%s%.4f", first ? "" : ",", 100 * *(const double *)((const char *)r + off));
        first = 0;
    }
    cli_bprintf(j, "]");
}

/* one "value ± ci" Markdown cell and the matching JSON object */
static void cell(cli_buf *md, cli_buf *js, const char *key, const run_result *res, const ssmoe_settings *o, int ci,
                 size_t off) {
    double mean, half;
    seed_stat(res, o, ci, off, 100, &mean, &half, NULL);
    cli_bprintf(md, " %.2f ± %.2f |", mean, half);
    cli_bprintf(js, "\"%s\":{\"mean\":%.4f,\"ci95\":%.4f,\"per_seed\":", key, mean, half);
    json_seeds(js, res, o, ci, off);
    cli_bprintf(js, "}");
}

/* Markdown on stdout and in OUT/ssmoe.md, every number in OUT/ssmoe.json; the exit code (1 if a file
 * cannot be written or a run failed). */
static int report(const ssmoe_settings *o, const ssmoe_results *R) {
    const run_result *res = R->res;
    const int failed = R->failed;
    cli_buf md = {0}, js = {0};
    cli_bprintf(&md,
              "SSMoE on Fashion-MNIST (arch %s, residual off, topk + renorm), %d seeds (from %d), %d epochs x batch %d, "
              "AdamW lr %g wd %g cosine; drop keeps %.0f%% of experts ranked on %d calibration images; mixed routing "
              "alpha %g, c %d; corrupted = clip(x + N(0, %g^2)); mean ± 95%% CI of test accuracy %% over seeds; "
              "%.0f s wall on %d threads%s\n",
              o->arch, o->seeds, o->seed_offset, o->epochs, o->batch, o->lr, o->wd, 100 * o->keep, o->calib, o->alpha,
              o->ev_c, o->severity, R->seconds, o->threads, failed ? " (SOME RUNS FAILED, see stderr)" : "");
    cli_bprintf(&js, "{\"arch\":\"%s\",\"seeds\":%d,\"seed_offset\":%d,\"epochs\":%d,\"batch\":%d,\"lr\":%g,\"wd\":%g,"
                   "\"keep\":%g,\"calib\":%d,\"alpha\":%g,\"ev_c\":%d,\"severity\":%g,\"seconds\":%.1f,\"threads\":%d,"
                   "\"failed_runs\":%d,\"configs\":[",
              o->arch, o->seeds, o->seed_offset, o->epochs, o->batch, o->lr, o->wd, o->keep, o->calib, o->alpha, o->ev_c,
              o->severity, R->seconds, o->threads, failed);
    /* Table 1 */
    for (int ci = 0; ci < o->n_cfg; ci++) {
        const int E = o->cfg_E[ci], k = o->cfg_k[ci];
        int E_keep = (int)lround(o->keep * E), cnt;
        if (E_keep < 1) E_keep = 1;
        double mt, ht;
        seed_stat(res, o, ci, OFF(train_s), 1, &mt, &ht, &cnt);
        cli_bprintf(&md, "\n### %d experts, top-%d (%d runs, %.0f s training per run)\n\n"
                       "| Method | Routing at test | Experts | Clean acc. %% | Corrupted acc. %% |\n|---|---|---|---|---|\n",
                  E, k, cnt, mt);
        cli_bprintf(&js, "%s{\"E\":%d,\"k\":%d,\"E_keep\":%d,\"runs\":%d,\"train_seconds\":%.1f,\"methods\":[", ci ? "," : "", E,
                  k, E_keep, cnt, mt);
        for (int mth = 0; mth < N_METHODS; mth++) {
            int dropped = mth >= M_RAND;
            cli_bprintf(&md, "| %s | %s | %d/%d |", kNames[mth], kRouting[mth], dropped ? E_keep : E, E);
            cli_bprintf(&js, "%s{\"method\":\"%s\",\"routing\":\"%s\",\"experts\":%d,", mth ? "," : "", kNames[mth],
                      kRouting[mth], dropped ? E_keep : E);
            cell(&md, &js, "clean", res, o, ci, OFF(acc) + sizeof(double) * (size_t)(2 * mth));
            cli_bprintf(&js, ",");
            cell(&md, &js, "corrupted", res, o, ci, OFF(acc) + sizeof(double) * (size_t)(2 * mth + 1));
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}");
        }
        cli_bprintf(&js, "],\"alpha_sweep\":[");
        cli_bprintf(&md, "\nSSMoE-full, alpha sweep (c = %d; alpha 0 = the learned router alone)\n\n"
                       "| alpha | Clean acc. %% | Corrupted acc. %% |\n|---|---|---|\n", o->ev_c);
        for (int j = 0; j < o->n_alpha; j++) {
            cli_bprintf(&md, "| %g |", o->alphas[j]);
            cli_bprintf(&js, "%s{\"alpha\":%g,", j ? "," : "", o->alphas[j]);
            cell(&md, &js, "clean", res, o, ci, OFF(acc_alpha) + sizeof(double) * (size_t)(2 * j));
            cli_bprintf(&js, ",");
            cell(&md, &js, "corrupted", res, o, ci, OFF(acc_alpha) + sizeof(double) * (size_t)(2 * j + 1));
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}");
        }
        cli_bprintf(&js, "],\"c_sweep\":[");
        cli_bprintf(&md, "\nSSMoE-full, top-c sweep (alpha = %g)\n\n| c | Clean acc. %% | Corrupted acc. %% |\n|---|---|---|\n",
                  o->alpha);
        for (int j = 0; j < o->n_c; j++) {
            cli_bprintf(&md, "| %d |", o->cs[j]);
            cli_bprintf(&js, "%s{\"c\":%d,", j ? "," : "", o->cs[j]);
            cell(&md, &js, "clean", res, o, ci, OFF(acc_c) + sizeof(double) * (size_t)(2 * j));
            cli_bprintf(&js, ",");
            cell(&md, &js, "corrupted", res, o, ci, OFF(acc_c) + sizeof(double) * (size_t)(2 * j + 1));
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}");
        }
        int L = 0;
        for (int s = 0; s < o->seeds; s++)
            if (res[ci * o->seeds + s].ok) L = res[ci * o->seeds + s].n_moe;
        if (L > MAX_L) L = MAX_L;
        cli_bprintf(&md, "\nCollapse diagnostic: mean |off-diagonal Pearson correlation| between experts' embeddings\n\n"
                       "| MoE layer | learned router rows | mean EV descriptors (c = %d) |\n|---|---|---|\n", o->ev_c);
        cli_bprintf(&js, "],\"collapse\":[");
        for (int l = 0; l < L; l++) {
            double mr, hr, me, he;
            seed_stat(res, o, ci, OFF(corr_router) + sizeof(double) * (size_t)l, 1, &mr, &hr, NULL);
            seed_stat(res, o, ci, OFF(corr_ev) + sizeof(double) * (size_t)l, 1, &me, &he, NULL);
            cli_bprintf(&md, "| %d | %.4f ± %.4f | %.4f ± %.4f |\n", l, mr, hr, me, he);
            cli_bprintf(&js, "%s{\"layer\":%d,\"router_corr\":%.5f,\"router_corr_ci95\":%.5f,\"ev_corr\":%.5f,\"ev_corr_ci95\":%.5f}",
                      l ? "," : "", l, mr, hr, me, he);
        }
        cli_bprintf(&js, "]}");
    }
    cli_bprintf(&js, "]}\n");
    if (md.failed || js.failed || !md.s || !js.s) {
        fprintf(stderr, "specmoe: bench ssmoe: out of memory for the report\n");
        free(md.s); free(js.s);
        return CLI_EXIT_RUNTIME;
    }
    fputs(md.s, stdout);
    char path[4096];
    mkdir("runs", 0755);
    mkdir(o->out_dir, 0755);
    snprintf(path, sizeof path, "%s/ssmoe.md", o->out_dir);
    int w1 = cli_write_text(path, md.s);
    snprintf(path, sizeof path, "%s/ssmoe.json", o->out_dir);
    int w2 = cli_write_text(path, js.s);
    if (w1 || w2) fprintf(stderr, "specmoe: %s: cannot write results\n", o->out_dir);
    else printf("\nwrote %s/ssmoe.md and %s/ssmoe.json\n", o->out_dir, o->out_dir);
    printf("total wall time %.1f s\n", R->seconds);
    free(md.s);
    free(js.s);
    return (w1 || w2 || failed) ? CLI_EXIT_RUNTIME : 0;
}

/* ---------------------------------------------------------------------------------------------- */

int exp_ssmoe_bench(int argc, char **argv) {
    ssmoe_settings o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    ssmoe_results R;
    sm_error err;
    sm_status st = run(&o, &R, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    rc = report(&o, &R);
    free(R.res);
    return rc;
}
