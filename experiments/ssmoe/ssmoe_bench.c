/* specmoe bench ssmoe: SSMoE (papers/001) Table 1 (expert dropping, SSMoE-full), Table 6 (the alpha /
 * top-c ablation, scored on embeddings) and Table 7 (an upcycled model, as CLIP-MoE) at CPU scale, on
 * Fashion-MNIST.
 *
 * Per (configuration, seed) one MoE classifier (default "dense:128,moe:128,moe:128", ReLU, topk router
 * with renormalised top-k weights, no balance loss) is made on the --classes of Fashion-MNIST:
 *   --model scratch   trained as an MoE with AdamW on a cosine schedule (--epochs);
 *   --model upcycle   the same layers with ffn in place of moe trained densely (--dense-epochs), then
 *                     upcycled (every expert a copy of its FFN, sm_model_upcycle; the router random)
 *                     and fine-tuned briefly (--ft-epochs at --ft-lr), as CLIP-MoE is made.
 * Then,
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
 * SSMoE Lemma 3.1's collapse statistic per MoE layer, on the logits (sm_ssmoe_logit_collapse, on the
 * calibration images): the mean |pairwise correlation| of the learned router's logits, the EV logits,
 * their mix at --alpha, and logits of random Gaussian rows on the same inputs, uncentred (the Lemma's
 * E[s_i s_j]) and centred, and the EV-learned cross correlation (the Lemma's assumption 2).
 *
 * Expert collapse per MoE layer: sm_ssmoe_expert_similarity (mean pairwise cosine of the experts'
 * outputs on the calibration images), the statistic that tells an upcycled model from a scratch one.
 * The App. D.6 overlap (the share of the mixed router's picks the learned router's top-k also makes)
 * is measured on the clean test images for every mixed-routing row.
 *
 * MoEE-style probe (Table 6 scores embeddings): the routing probabilities of every MoE layer,
 * concatenated (sm_ssmoe_routing_embed; alpha 0 = learned router, 1 = EV router, between = mixed), as
 * an embedding of images of the --probe-classes, which the model never saw. A ridge linear probe
 * (sm_ridge_probe) is fitted on --probe-train training images of those classes; its lambda, and the
 * alpha and c the summary picks, are chosen on the next --probe-val training images; the test split is
 * only scored.
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
#include "specmoe/methods/ssmoe/ssmoe.h"

#define MAX_CFG 4
#define MAX_L 4
#define MAX_SWEEP 16

enum { M_ORIG = 0, M_FULL, M_AVG, M_RAND, M_ROUTER, M_SSDROP, M_SSDROP_MIX, N_METHODS };
static const char *kNames[N_METHODS] = {"Original", "SSMoE-full", "SSMoE-avgEV", "RandDrop", "Router-drop",
                                        "SSMoE-drop", "SSMoE-drop + mixed"};
static const char *kRouting[N_METHODS] = {"learned top-k", "mixed EV+router", "mixed avgEV+router", "learned top-k",
                                          "learned top-k", "learned top-k", "mixed EV+router"};

#define MAX_CLS 10
#define N_LAMBDA 6
static const double kLambdas[N_LAMBDA] = {1e-6, 1e-4, 1e-3, 1e-2, 1e-1, 1}; /* ridge probe grid, picked on validation */

typedef struct {
    const char *arch, *data, *out_dir;
    int seeds, epochs, batch, calib, ev_c, threads, seed_offset, eval_batch;
    double lr, wd, keep, severity, alpha;
    int n_cfg, cfg_E[MAX_CFG], cfg_k[MAX_CFG];
    int n_alpha, n_c;
    double alphas[MAX_SWEEP];
    int cs[MAX_SWEEP];
    int upcycle, dense_epochs, ft_epochs, residual; /* --model upcycle and its schedule */
    double ft_lr, balance;
    int n_cls, cls[MAX_CLS], n_probe, probe_cls[MAX_CLS], probe_train, probe_val;
} ssmoe_settings;

/* one embedding's probe: [validation, clean test, corrupted test] accuracy at the lambda picked on
 * validation, and the D.6 overlap on the clean probe test images */
typedef struct {
    double acc[3], overlap;
} probe_result;

typedef struct {
    int ok, n_moe, E_keep, d;            /* d: width of the MoE layers (the router rows' length) */
    double acc[N_METHODS][2];        /* [method][clean, corrupted], fractions */
    double overlap[N_METHODS];       /* App. D.6 on the clean test set; NaN for learned routing */
    double acc_alpha[MAX_SWEEP][2];  /* SSMoE-full, c = ev_c */
    double acc_c[MAX_SWEEP][2];      /* SSMoE-full, alpha = alpha */
    double ov_alpha[MAX_SWEEP], ov_c[MAX_SWEEP];
    probe_result pr_alpha[MAX_SWEEP], pr_c[MAX_SWEEP];
    double pick_alpha, pick_c;       /* the sweep values validation picks, and their probe's test accuracy */
    probe_result pr_pick_alpha, pr_pick_c;
    double corr_router[MAX_L], corr_ev[MAX_L], expert_sim[MAX_L];
    sm_logit_collapse logit[MAX_L];  /* Lemma 3.1's statistic on the calibration images */
    double dense_acc, upcycled_acc;  /* --model upcycle: the dense model, and the MoE right after upcycling */
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
    const char *configs_s, *alphas_s, *cs_s, *model_s, *cls_s, *probe_s;
    fl_flag fl[] = {
        {"configs", FL_STRING, &configs_s, "16:2,32:4", "comma-separated E:k MoE configurations", 0},
        {"arch", FL_STRING, &o->arch, "dense:128,moe:128,moe:128", "layers (ReLU, topk router, renorm on)", 0},
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
        {"model", FL_STRING, &model_s, "scratch", "scratch (an MoE trained as one) or upcycle (a dense model, upcycled, fine-tuned)", 0},
        {"dense-epochs", FL_INT, &o->dense_epochs, "3", "upcycle: epochs of the dense model", 0},
        {"ft-epochs", FL_INT, &o->ft_epochs, "1", "upcycle: fine-tuning epochs of the upcycled MoE (0: none)", 0},
        {"ft-lr", FL_DOUBLE, &o->ft_lr, "1e-4", "upcycle: fine-tuning learning rate (cosine decay to 0)", 0},
        {"residual", FL_BOOL, &o->residual, "0", "ffn / moe layers add their input to their output", 0},
        {"balance", FL_DOUBLE, &o->balance, "0", "load-balancing loss weight of the router", 0},
        {"classes", FL_STRING, &cls_s, "0,1,2,3,4", "classes the model is trained and tested on", 0},
        {"probe-classes", FL_STRING, &probe_s, "5,6,7,8,9", "held-out classes of the routing-embedding probe (none: no probe)", 0},
        {"probe-train", FL_INT, &o->probe_train, "5000", "probe: training images of the probe classes the probe is fitted on", 0},
        {"probe-val", FL_INT, &o->probe_val, "2000", "probe: the next training images, which pick lambda, alpha and c", 0},
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
    int up = !strcmp(model_s, "upcycle");
    if (!up && strcmp(model_s, "scratch")) {
        fprintf(stderr, "specmoe bench ssmoe: --model: expected scratch or upcycle (got '%s')\n", model_s);
        return 2;
    }
    o->upcycle = up;
    if (o->dense_epochs < 1 || o->ft_epochs < 0 || !(o->ft_lr > 0) || !isfinite(o->ft_lr) || !(o->balance >= 0) ||
        !isfinite(o->balance)) {
        fprintf(stderr, "specmoe bench ssmoe: --dense-epochs >= 1; --ft-epochs >= 0; --ft-lr > 0; --balance >= 0\n");
        return 2;
    }
    o->n_cls = sm_parse_class_list(cls_s, o->cls, MAX_CLS, 10, &err);
    if (o->n_cls < 2) {
        fprintf(stderr, "specmoe bench ssmoe: --classes: need at least 2 Fashion-MNIST classes (%s)\n",
                o->n_cls < 0 ? err.msg : cls_s);
        return 2;
    }
    o->n_probe = 0;
    if (strcmp(probe_s, "none")) {
        o->n_probe = sm_parse_class_list(probe_s, o->probe_cls, MAX_CLS, 10, &err);
        int overlap = 0;
        for (int i = 0; i < o->n_probe; i++)
            for (int j = 0; j < o->n_cls; j++) overlap |= o->probe_cls[i] == o->cls[j];
        if (o->n_probe < 2 || overlap) {
            fprintf(stderr, "specmoe bench ssmoe: --probe-classes: need at least 2 classes, none of them in --classes "
                            "(the probe's task is held out), or 'none' (got '%s')\n", probe_s);
            return 2;
        }
        /* Fashion-MNIST has 6000 training images per class */
        if (o->probe_train < 10 || o->probe_val < 10 || (long)o->probe_train + o->probe_val > 6000L * o->n_probe) {
            fprintf(stderr, "specmoe bench ssmoe: --probe-train and --probe-val: >= 10 each, together at most %d (the "
                            "training images of %d classes)\n", 6000 * o->n_probe, o->n_probe);
            return 2;
        }
    }
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
        if (nm < 1 || nm > MAX_L || bad || mc.layers[0].kind != SM_LAYER_DENSE || (up && mc.layers[0].kind == SM_LAYER_FFN)) {
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
    mc->act = SM_ACT_RELU;
    mc->residual = o->residual;
    mc->n_classes = o->n_cls;
    mc->moe.act = SM_ACT_RELU;
    sm_router_config *r = &mc->moe.router;
    sm_router_config_default(r);
    strcpy(r->name, "topk");
    r->E = E;
    r->k = k;
    r->renorm = 1;
    r->balance_coef = o->balance;
    return SM_OK;
}

/* The data of every run, built once: the model's classes (relabelled 0..n_cls-1) and the probe's. */
typedef struct {
    sm_dataset train, test, noisy;            /* --classes: training split, test split, corrupted test split */
    sm_dataset ptrain, pval, ptest, pnoisy;   /* --probe-classes: probe fit, validation, test, corrupted test */
} bench_data;

static void bench_data_free(bench_data *D) {
    sm_dataset *all[] = {&D->train, &D->test, &D->noisy, &D->ptrain, &D->pval, &D->ptest, &D->pnoisy};
    for (size_t i = 0; i < SM_LEN(all); i++) sm_dataset_free(all[i]);
}

/* out = the examples of ds whose label is in cls (relabelled to its position there), from the skip-th
 * such example on, at most count of them (count <= 0: all) */
static sm_status subset(sm_dataset *out, const sm_dataset *ds, const int *cls, int n_cls, int skip, int count, sm_error *err) {
    int pos[16], n = 0, seen = 0;
    for (int c = 0; c < 16; c++) pos[c] = -1;
    for (int i = 0; i < n_cls; i++) pos[cls[i]] = i;
    memset(out, 0, sizeof *out);
    out->dim = ds->dim;
    out->n_classes = n_cls;
    out->x = malloc(sizeof(float) * (size_t)ds->n * ds->dim);
    out->y = malloc(sizeof(int) * (size_t)ds->n);
    if (!out->x || !out->y) return sm_fail(err, SM_ERR_NOMEM, "bench ssmoe: out of memory for a data subset");
    for (int i = 0; i < ds->n && (count <= 0 || n < count); i++) {
        if (ds->y[i] < 0 || ds->y[i] >= 16 || pos[ds->y[i]] < 0 || seen++ < skip) continue;
        memcpy(out->x + (size_t)n * ds->dim, ds->x + (size_t)i * ds->dim, sizeof(float) * ds->dim);
        out->y[n++] = pos[ds->y[i]];
    }
    out->n = n;
    if (n < 1 || (count > 0 && n < count))
        return sm_fail(err, SM_ERR_ARG, "bench ssmoe: only %d examples of the requested classes (need %d)", n, count);
    return SM_OK;
}

/* x + N(0, severity^2) per pixel, clipped to [0, 1], from a fixed seed: every run sees the same corruption */
static sm_status corrupt(sm_dataset *out, const sm_dataset *ds, double severity, sm_error *err) {
    *out = *ds;
    out->x = malloc(sizeof(float) * (size_t)ds->n * ds->dim);
    out->y = malloc(sizeof(int) * (size_t)ds->n);
    if (!out->x || !out->y) return sm_fail(err, SM_ERR_NOMEM, "bench ssmoe: out of memory for the corrupted test set");
    memcpy(out->y, ds->y, sizeof(int) * (size_t)ds->n);
    sm_rng nr;
    sm_rng_seed(&nr, 0x5eed0000ULL);
    for (size_t i = 0; i < (size_t)ds->n * ds->dim; i++) {
        double v = ds->x[i] + severity * sm_rng_normal(&nr);
        out->x[i] = (float)(v < 0 ? 0 : v > 1 ? 1 : v);
    }
    return SM_OK;
}

/* Accuracy on the clean and the corrupted test sets, and (overlap, may be NULL) the App. D.6 overlap
 * on the clean one averaged over MoE layers (NaN for the learned router). */
static sm_status eval3(sm_model *m, const bench_data *D, int eb, double out[2], double *overlap, sm_error *err) {
    const int L = sm_model_n_moe(m);
    for (int l = 0; l < L; l++) (void)sm_ev_router_take_overlap(sm_model_moe(m, l)->router);
    sm_eval_result r;
    sm_status st = sm_evaluate(m, &D->test, eb, &r, err);
    if (st != SM_OK) return st;
    out[0] = r.acc;
    if (overlap) {
        *overlap = 0;
        for (int l = 0; l < L; l++) *overlap += sm_ev_router_take_overlap(sm_model_moe(m, l)->router) / L;
    }
    st = sm_evaluate(m, &D->noisy, eb, &r, err);
    out[1] = r.acc;
    return st;
}

/* The MoEE-style probe of the routing embedding of m (its router and dials as they are): embeddings
 * of the probe sets, a ridge probe per lambda of the grid fitted on ptrain, the lambda with the best
 * validation accuracy kept (ties: the larger lambda), and its accuracies. */
static sm_status probe(sm_model *m, const bench_data *D, probe_result *pr, sm_error *err) {
    const int W = sm_ssmoe_embed_width(m);
    const sm_dataset *sets[4] = {&D->ptrain, &D->pval, &D->ptest, &D->pnoisy};
    float *emb[4] = {0};
    sm_status st = SM_OK;
    for (int i = 0; i < 4 && st == SM_OK; i++) {
        emb[i] = malloc(sizeof(float) * (size_t)sets[i]->n * W);
        st = emb[i] ? sm_ssmoe_routing_embed(m, sets[i]->x, sets[i]->n, emb[i], i == 2 ? &pr->overlap : NULL, err)
                    : sm_fail(err, SM_ERR_NOMEM, "bench ssmoe: out of memory for the probe embeddings");
    }
    double best = -1;
    for (int j = N_LAMBDA - 1; j >= 0 && st == SM_OK; j--) {
        sm_ridge_probe p;
        st = sm_ridge_probe_fit(&p, emb[0], D->ptrain.y, D->ptrain.n, W, D->ptrain.n_classes, kLambdas[j], err);
        if (st != SM_OK) break;
        double v = sm_ridge_probe_accuracy(&p, emb[1], D->pval.y, D->pval.n);
        if (v > best) {
            best = v;
            pr->acc[0] = v;
            pr->acc[1] = sm_ridge_probe_accuracy(&p, emb[2], D->ptest.y, D->ptest.n);
            pr->acc[2] = sm_ridge_probe_accuracy(&p, emb[3], D->pnoisy.y, D->pnoisy.n);
        }
        sm_ridge_probe_free(&p);
    }
    for (int i = 0; i < 4; i++) free(emb[i]);
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

/* The trained model of one run: an MoE trained from scratch, or (--model upcycle) a dense model with
 * ffn in place of every moe layer, trained, upcycled and fine-tuned. NULL with err on failure. */
static sm_model *make_model(const ssmoe_settings *o, int ci, uint64_t us, const bench_data *D, run_result *R, sm_error *err) {
    const int E = o->cfg_E[ci], maxT = o->batch > o->eval_batch ? o->batch : o->eval_batch;
    sm_model_config mc;
    if (make_config(&mc, o, E, o->cfg_k[ci], err) != SM_OK) return NULL;
    sm_rng init;
    sm_rng_seed(&init, 1000003ULL * (us + 1) + 7919ULL * (uint64_t)E);
    sm_train_config tc;
    sm_train_result tres;
    sm_eval_result ev;
    sm_model *m = NULL;
    if (!o->upcycle) {
        m = sm_model_create(&mc, maxT, &init, err);
        cli_bench_train_config(&tc, o->epochs, o->batch, o->lr, o->wd, 17 + us * 101 + (uint64_t)E);
        if (m && sm_train(m, &D->train, NULL, &tc, NULL, NULL, &tres, err) != SM_OK) sm_model_free(m), m = NULL;
        return m;
    }
    sm_model_config dc = mc;
    for (int i = 0; i < dc.n_layers; i++)
        if (dc.layers[i].kind == SM_LAYER_MOE) dc.layers[i].kind = SM_LAYER_FFN;
    /* the dense seeds do not depend on E: every configuration of a seed upcycles the same dense model;
     * the routers come from init */
    sm_rng dinit;
    sm_rng_seed(&dinit, 1000003ULL * (us + 1));
    sm_model *dense = sm_model_create(&dc, maxT, &dinit, err);
    if (!dense) return NULL;
    cli_bench_train_config(&tc, o->dense_epochs, o->batch, o->lr, o->wd, 17 + us * 101);
    sm_status st = sm_train(dense, &D->train, NULL, &tc, NULL, NULL, &tres, err);
    if (st == SM_OK) st = sm_evaluate(dense, &D->test, o->eval_batch, &ev, err);
    R->dense_acc = ev.acc;
    if (st == SM_OK) m = sm_model_upcycle(dense, &mc.moe, &init, err);
    sm_model_free(dense);
    if (!m) return NULL;
    st = sm_evaluate(m, &D->test, o->eval_batch, &ev, err);
    R->upcycled_acc = ev.acc;
    cli_bench_train_config(&tc, o->ft_epochs, o->batch, o->ft_lr, o->wd, 29 + us * 101 + (uint64_t)E);
    if (st == SM_OK && o->ft_epochs > 0) st = sm_train(m, &D->train, NULL, &tc, NULL, NULL, &tres, err);
    if (st != SM_OK) sm_model_free(m), m = NULL;
    return m;
}

/* the index of the sweep entry whose probe validates best (ties: the first) */
static int pick(const probe_result *pr, int n) {
    int b = 0;
    for (int j = 1; j < n; j++)
        if (pr[j].acc[0] > pr[b].acc[0]) b = j;
    return b;
}

/* one run: make the model, then every training-free variant */
static sm_status one_run(const ssmoe_settings *o, int ci, int seed, const bench_data *D, run_result *R, sm_error *err) {
    const uint64_t us = (uint64_t)seed;
    const int E = o->cfg_E[ci];
    sm_model *ev = NULL, *p = NULL, *pev = NULL;
    double t0 = sm_time_now();
    sm_model *m = make_model(o, ci, us, D, R, err);
    R->train_s = sm_time_now() - t0;
    if (!m) return SM_ERR_ARG;
    t0 = sm_time_now();
    const int L = sm_model_n_moe(m), n_calib = o->calib < D->train.n ? o->calib : D->train.n;
    R->n_moe = L;
    R->d = sm_model_moe(m, 0)->d;
    R->overlap[M_ORIG] = NAN;
    sm_status st = eval3(m, D, o->eval_batch, R->acc[M_ORIG], NULL, err);
    double sim[MAX_L];
    if (st == SM_OK) st = sm_ssmoe_expert_similarity(m, D->train.x, n_calib, sim, err);
    for (int l = 0; l < L && l < MAX_L && st == SM_OK; l++) R->expert_sim[l] = sim[l];
    /* the ablation; c = ev_c and alpha = alpha is SSMoE-full */
    for (int j = 0; j < o->n_c && st == SM_OK; j++) {
        ev = sm_ssmoe_twin(m, o->alpha, o->cs[j], 0, err);
        if (!ev) { st = SM_ERR_ARG; break; }
        st = eval3(ev, D, o->eval_batch, R->acc_c[j], &R->ov_c[j], err);
        if (st == SM_OK && o->n_probe) st = probe(ev, D, &R->pr_c[j], err);
        sm_model_free(ev);
        ev = NULL;
    }
    if (st == SM_OK) {
        ev = sm_ssmoe_twin(m, o->alpha, o->ev_c, 0, err);
        if (!ev) st = SM_ERR_ARG;
    }
    if (st == SM_OK) st = eval3(ev, D, o->eval_batch, R->acc[M_FULL], &R->overlap[M_FULL], err);
    /* collapse diagnostic: router rows vs mean descriptors, per MoE layer */
    for (int l = 0; l < L && l < MAX_L && st == SM_OK; l++) st = sm_ssmoe_collapse(ev, l, &R->corr_router[l], &R->corr_ev[l], err);
    if (st == SM_OK && L <= MAX_L) st = sm_ssmoe_logit_collapse(ev, D->train.x, n_calib, o->alpha, us ^ 0x5eed, R->logit, err);
    for (int j = 0; j < o->n_alpha && st == SM_OK; j++) {
        char text[32];
        snprintf(text, sizeof text, "%.17g", o->alphas[j]);
        st = sm_model_set_dial(ev, "alpha", text, err);
        if (st == SM_OK) st = eval3(ev, D, o->eval_batch, R->acc_alpha[j], &R->ov_alpha[j], err);
        if (st == SM_OK && o->n_probe) st = probe(ev, D, &R->pr_alpha[j], err);
    }
    if (st == SM_OK && o->n_probe) {
        int a = pick(R->pr_alpha, o->n_alpha), c = pick(R->pr_c, o->n_c);
        R->pick_alpha = o->alphas[a], R->pr_pick_alpha = R->pr_alpha[a];
        R->pick_c = o->cs[c], R->pr_pick_c = R->pr_c[c];
    }
    sm_model_free(ev);
    ev = NULL;
    if (st == SM_OK) {
        ev = sm_ssmoe_twin(m, o->alpha, o->ev_c, 1, err);
        if (!ev) st = SM_ERR_ARG;
    }
    if (st == SM_OK) st = eval3(ev, D, o->eval_batch, R->acc[M_AVG], &R->overlap[M_AVG], err);
    sm_model_free(ev);
    ev = NULL;
    /* dropping */
    int E_keep = (int)lround(o->keep * E);
    if (E_keep < 1) E_keep = 1;
    R->E_keep = E_keep;
    const sm_expert_rank ranks[3] = {SM_RANK_RANDOM, SM_RANK_ROUTER, SM_RANK_SSMOE};
    const int slots[3] = {M_RAND, M_ROUTER, M_SSDROP};
    for (int r = 0; r < 3 && st == SM_OK; r++) {
        p = rank_and_prune(m, D->train.x, n_calib, ranks[r], o, 0xd209ULL + us * 31 + (uint64_t)E, E_keep, err);
        if (!p) { st = SM_ERR_ARG; break; }
        R->overlap[slots[r]] = NAN;
        st = eval3(p, D, o->eval_batch, R->acc[slots[r]], NULL, err);
        if (st == SM_OK && ranks[r] == SM_RANK_SSMOE) {
            pev = sm_ssmoe_twin(p, o->alpha, o->ev_c, 0, err);
            if (!pev) st = SM_ERR_ARG;
            else st = eval3(pev, D, o->eval_batch, R->acc[M_SSDROP_MIX], &R->overlap[M_SSDROP_MIX], err);
            sm_model_free(pev);
            pev = NULL;
        }
        sm_model_free(p);
        p = NULL;
    }
    R->eval_s = sm_time_now() - t0;
    sm_model_free(m);
    R->ok = st == SM_OK;
    return st;
}

/* Loads Fashion-MNIST, builds the subsets and does every run (configuration x seed); a failed run is
 * reported on stderr and left out (ok 0); only the data fails the whole run. The caller frees R->res. */
static sm_status run(const ssmoe_settings *o, ssmoe_results *R, sm_error *err) {
    memset(R, 0, sizeof *R);
    sm_dataset train = {0}, test = {0};
    bench_data D;
    memset(&D, 0, sizeof D);
    sm_status st = sm_dataset_load_fashion(&train, o->data, "train", err);
    if (st == SM_OK) st = sm_dataset_load_fashion(&test, o->data, "test", err);
    if (st == SM_OK) st = subset(&D.train, &train, o->cls, o->n_cls, 0, 0, err);
    if (st == SM_OK) st = subset(&D.test, &test, o->cls, o->n_cls, 0, 0, err);
    if (st == SM_OK) st = corrupt(&D.noisy, &D.test, o->severity, err);
    if (st == SM_OK && o->n_probe) {
        st = subset(&D.ptrain, &train, o->probe_cls, o->n_probe, 0, o->probe_train, err);
        if (st == SM_OK) st = subset(&D.pval, &train, o->probe_cls, o->n_probe, o->probe_train, o->probe_val, err);
        if (st == SM_OK) st = subset(&D.ptest, &test, o->probe_cls, o->n_probe, 0, 0, err);
        if (st == SM_OK) st = corrupt(&D.pnoisy, &D.ptest, o->severity, err);
    }
    sm_dataset_free(&train);
    sm_dataset_free(&test);
    if (st != SM_OK) {
        bench_data_free(&D);
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
        if (one_run(o, ci, s + o->seed_offset, &D, rr, &e2) != SM_OK) {
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
    bench_data_free(&D);
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

/* one "value ± ci" Markdown cell (value x scale, prec decimals; "—" when undefined, e.g. the D.6
 * overlap of the learned router) and the matching JSON object */
static void cellx(cli_buf *md, cli_buf *js, const char *key, const run_result *res, const ssmoe_settings *o, int ci,
                  size_t off, double scale, int prec) {
    double mean, half;
    seed_stat(res, o, ci, off, scale, &mean, &half, NULL);
    if (isnan(mean)) cli_bprintf(md, " — |");
    else cli_bprintf(md, " %.*f ± %.*f |", prec, mean, prec, half);
    if (isnan(mean)) cli_bprintf(js, "\"%s\":null", key);
    else cli_bprintf(js, "\"%s\":{\"mean\":%.5f,\"ci95\":%.5f}", key, mean, half);
}

static void cell(cli_buf *md, cli_buf *js, const char *key, const run_result *res, const ssmoe_settings *o, int ci,
                 size_t off) {
    double mean, half;
    seed_stat(res, o, ci, off, 100, &mean, &half, NULL);
    cli_bprintf(md, " %.2f ± %.2f |", mean, half);
    cli_bprintf(js, "\"%s\":{\"mean\":%.4f,\"ci95\":%.4f,\"per_seed\":", key, mean, half);
    json_seeds(js, res, o, ci, off);
    cli_bprintf(js, "}");
}

/* the probe's three accuracies and its D.6 overlap for the probe_result at off */
static void probe_cells(cli_buf *md, cli_buf *js, const run_result *res, const ssmoe_settings *o, int ci, size_t off) {
    const char *keys[3] = {"probe_val", "probe_test", "probe_test_corrupted"};
    for (int i = 0; i < 3; i++) {
        cli_bprintf(js, ",");
        cell(md, js, keys[i], res, o, ci, off + offsetof(probe_result, acc) + sizeof(double) * (size_t)i);
    }
    cli_bprintf(js, ",");
    cellx(md, js, "probe_overlap", res, o, ci, off + offsetof(probe_result, overlap), 1, 3);
}

/* Markdown on stdout and in OUT/ssmoe.md, every number in OUT/ssmoe.json; the exit code (1 if a file
 * cannot be written or a run failed). */
static int report(const ssmoe_settings *o, const ssmoe_results *R) {
    const run_result *res = R->res;
    const int failed = R->failed;
    cli_buf md = {0}, js = {0};
    char model[160], cls[64] = "", pcls[64] = "none";
    if (o->upcycle)
        snprintf(model, sizeof model, "upcycled: dense %d epochs at lr %g, upcycled, fine-tuned %d epochs at lr %g",
                 o->dense_epochs, o->lr, o->ft_epochs, o->ft_lr);
    else
        snprintf(model, sizeof model, "trained from scratch %d epochs at lr %g", o->epochs, o->lr);
    for (int i = 0; i < o->n_cls; i++) snprintf(cls + strlen(cls), sizeof cls - strlen(cls), "%s%d", i ? "," : "", o->cls[i]);
    for (int i = 0; i < o->n_probe; i++)
        snprintf(pcls + (i ? strlen(pcls) : 0), sizeof pcls - (i ? strlen(pcls) : 0), "%s%d", i ? "," : "", o->probe_cls[i]);
    cli_bprintf(&md,
              "SSMoE on Fashion-MNIST classes %s (arch %s, residual %d, balance %g, topk + renorm; %s), %d seeds (from "
              "%d), batch %d, AdamW wd %g cosine; drop keeps %.0f%% of experts ranked on %d calibration images; mixed "
              "routing alpha %g, c %d; corrupted = clip(x + N(0, %g^2)); probe: held-out classes %s, ridge fitted on %d "
              "images, lambda / alpha / c picked on %d more; mean ± 95%% CI over seeds; %.0f s wall on %d threads%s\n",
              cls, o->arch, o->residual, o->balance, model, o->seeds, o->seed_offset, o->batch, o->wd, 100 * o->keep,
              o->calib, o->alpha, o->ev_c, o->severity, pcls, o->probe_train, o->probe_val, R->seconds, o->threads,
              failed ? " (SOME RUNS FAILED, see stderr)" : "");
    cli_bprintf(&js, "{\"arch\":\"%s\",\"model\":\"%s\",\"classes\":\"%s\",\"probe_classes\":\"%s\",\"residual\":%d,"
                   "\"balance\":%g,\"seeds\":%d,\"seed_offset\":%d,\"epochs\":%d,\"dense_epochs\":%d,\"ft_epochs\":%d,"
                   "\"ft_lr\":%g,\"batch\":%d,\"lr\":%g,\"wd\":%g,\"keep\":%g,\"calib\":%d,\"alpha\":%g,\"ev_c\":%d,"
                   "\"severity\":%g,\"seconds\":%.1f,\"threads\":%d,\"failed_runs\":%d,\"configs\":[",
              o->arch, o->upcycle ? "upcycle" : "scratch", cls, pcls, o->residual, o->balance, o->seeds, o->seed_offset,
              o->epochs, o->dense_epochs, o->ft_epochs, o->ft_lr, o->batch, o->lr, o->wd, o->keep, o->calib, o->alpha,
              o->ev_c, o->severity, R->seconds, o->threads, failed);
    for (int ci = 0; ci < o->n_cfg; ci++) {
        const int E = o->cfg_E[ci], k = o->cfg_k[ci];
        int E_keep = (int)lround(o->keep * E), cnt, L = 0, d = 1;
        if (E_keep < 1) E_keep = 1;
        for (int s = 0; s < o->seeds; s++)
            if (res[ci * o->seeds + s].ok) L = res[ci * o->seeds + s].n_moe, d = res[ci * o->seeds + s].d;
        if (L > MAX_L) L = MAX_L;
        double mt, ht;
        seed_stat(res, o, ci, OFF(train_s), 1, &mt, &ht, &cnt);
        cli_bprintf(&md, "\n### %d experts, top-%d (%d runs, %.0f s training per run)\n", E, k, cnt, mt);
        cli_bprintf(&js, "%s{\"E\":%d,\"k\":%d,\"E_keep\":%d,\"runs\":%d,\"train_seconds\":%.1f,\"d\":%d,", ci ? "," : "",
                    E, k, E_keep, cnt, mt, d);
        /* collapse first: it says which regime the rest of the tables are in */
        cli_bprintf(&md, "\nCollapse per MoE layer: mean |off-diagonal Pearson correlation| of the learned router's rows "
                         "(SSMoE Fig. 6; independent random rows of length d = %d give about sqrt(2 / (pi d)) = %.4f) and "
                         "of the mean EV descriptors (c = %d); expert similarity = mean pairwise cosine of the experts' "
                         "outputs on the calibration images (1: every expert computes the same function)\n\n"
                         "| MoE layer | router rows | EV descriptors | expert similarity |\n|---|---|---|---|\n", d,
                    sqrt(2 / (M_PI * d)), o->ev_c);
        cli_bprintf(&js, "\"collapse\":[");
        for (int l = 0; l < L; l++) {
            cli_bprintf(&md, "| %d |", l);
            cli_bprintf(&js, "%s{\"layer\":%d,", l ? "," : "", l);
            cellx(&md, &js, "router_corr", res, o, ci, OFF(corr_router) + sizeof(double) * (size_t)l, 1, 4);
            cli_bprintf(&js, ",");
            cellx(&md, &js, "ev_corr", res, o, ci, OFF(corr_ev) + sizeof(double) * (size_t)l, 1, 4);
            cli_bprintf(&js, ",");
            cellx(&md, &js, "expert_similarity", res, o, ci, OFF(expert_sim) + sizeof(double) * (size_t)l, 1, 4);
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}");
        }
        cli_bprintf(&js, "],");
        cli_bprintf(&md, "\nCollapse on the logits (SSMoE Lemma 3.1, on the %d calibration images): mean |off-diagonal "
                         "correlation| of the learned router's logits s = h W_r^T, the EV logits f = h Dbar^T, the Lemma's "
                         "mix V = alpha f + (1 - alpha) s at alpha = %g, and logits of random Gaussian rows on the same "
                         "inputs h (the level the inputs alone give); uncentred as the Lemma's E[s_i s_j] / centred "
                         "(Pearson over tokens). EV-learned: mean |E[f_i s_j]| / sqrt(E[f_i^2] E[s_j^2]) over all (i, j), "
                         "0 under the Lemma's assumption 2\n\n"
                         "| MoE layer | learned | EV | mix | random rows | learned, centred | EV, centred | mix, centred | "
                         "random rows, centred | EV-learned |\n|---|---|---|---|---|---|---|---|---|---|\n",
                    o->calib, o->alpha);
        cli_bprintf(&js, "\"logit_collapse\":[");
        static const char *kLogitKeys[9] = {"learned", "ev", "mixed", "random", "learned_centred", "ev_centred",
                                            "mixed_centred", "random_centred", "ev_learned"};
        const size_t kLogitOff[9] = {offsetof(sm_logit_collapse, learned), offsetof(sm_logit_collapse, ev),
                                     offsetof(sm_logit_collapse, mixed), offsetof(sm_logit_collapse, random),
                                     offsetof(sm_logit_collapse, learned_c), offsetof(sm_logit_collapse, ev_c),
                                     offsetof(sm_logit_collapse, mixed_c), offsetof(sm_logit_collapse, random_c),
                                     offsetof(sm_logit_collapse, ev_learned)};
        for (int l = 0; l < L; l++) {
            cli_bprintf(&md, "| %d |", l);
            cli_bprintf(&js, "%s{\"layer\":%d", l ? "," : "", l);
            for (int q = 0; q < 9; q++) {
                cli_bprintf(&js, ",");
                cellx(&md, &js, kLogitKeys[q], res, o, ci, OFF(logit) + sizeof(sm_logit_collapse) * (size_t)l + kLogitOff[q],
                      1, 3);
            }
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}");
        }
        cli_bprintf(&js, "],");
        if (o->upcycle) {
            cli_bprintf(&md, "\nUpcycling (clean test accuracy %%): dense model |");
            cellx(&md, &js, "dense_acc", res, o, ci, OFF(dense_acc), 100, 2);
            cli_bprintf(&md, " right after upcycling (must equal it) |");
            cli_bprintf(&js, ",");
            cellx(&md, &js, "upcycled_acc", res, o, ci, OFF(upcycled_acc), 100, 2);
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, ",");
        }
        /* Table 1 */
        cli_bprintf(&md, "\nD.6 overlap: the share of the mixed router's top-%d picks that the learned router's top-%d "
                         "also makes, on the clean test images (picks at random would share %d/%d = %.3f)\n\n"
                         "| Method | Routing at test | Experts | Clean acc. %% | Corrupted acc. %% | D.6 overlap |\n"
                         "|---|---|---|---|---|---|\n", k, k, k, E, (double)k / E);
        cli_bprintf(&js, "\"methods\":[");
        for (int mth = 0; mth < N_METHODS; mth++) {
            int dropped = mth >= M_RAND;
            cli_bprintf(&md, "| %s | %s | %d/%d |", kNames[mth], kRouting[mth], dropped ? E_keep : E, E);
            cli_bprintf(&js, "%s{\"method\":\"%s\",\"routing\":\"%s\",\"experts\":%d,", mth ? "," : "", kNames[mth],
                      kRouting[mth], dropped ? E_keep : E);
            cell(&md, &js, "clean", res, o, ci, OFF(acc) + sizeof(double) * (size_t)(2 * mth));
            cli_bprintf(&js, ",");
            cell(&md, &js, "corrupted", res, o, ci, OFF(acc) + sizeof(double) * (size_t)(2 * mth + 1));
            cli_bprintf(&js, ",");
            cellx(&md, &js, "overlap", res, o, ci, OFF(overlap) + sizeof(double) * (size_t)mth, 1, 3);
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}");
        }
        /* Table 6: the sweeps, task accuracy and (when there is a probe) the routing-embedding probe */
        const char *ph = o->n_probe ? " Probe val. % | Probe test % | Probe corrupted % | Probe D.6 |" : "";
        const char *pr = o->n_probe ? "---|---|---|---|" : "";
        cli_bprintf(&js, "],\"alpha_sweep\":[");
        cli_bprintf(&md, "\nSSMoE-full, alpha sweep (c = %d; alpha 0 = the learned router alone, 1 = the EV router alone)\n\n"
                       "| alpha | Clean acc. %% | Corrupted acc. %% | D.6 overlap |%s\n|---|---|---|---|%s\n", o->ev_c, ph, pr);
        for (int j = 0; j < o->n_alpha; j++) {
            cli_bprintf(&md, "| %g |", o->alphas[j]);
            cli_bprintf(&js, "%s{\"alpha\":%g,", j ? "," : "", o->alphas[j]);
            cell(&md, &js, "clean", res, o, ci, OFF(acc_alpha) + sizeof(double) * (size_t)(2 * j));
            cli_bprintf(&js, ",");
            cell(&md, &js, "corrupted", res, o, ci, OFF(acc_alpha) + sizeof(double) * (size_t)(2 * j + 1));
            cli_bprintf(&js, ",");
            cellx(&md, &js, "overlap", res, o, ci, OFF(ov_alpha) + sizeof(double) * (size_t)j, 1, 3);
            if (o->n_probe) probe_cells(&md, &js, res, o, ci, OFF(pr_alpha) + sizeof(probe_result) * (size_t)j);
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}");
        }
        cli_bprintf(&js, "],\"c_sweep\":[");
        cli_bprintf(&md, "\nSSMoE-full, top-c sweep (alpha = %g)\n\n| c | Clean acc. %% | Corrupted acc. %% | D.6 overlap |%s\n"
                         "|---|---|---|---|%s\n", o->alpha, ph, pr);
        for (int j = 0; j < o->n_c; j++) {
            cli_bprintf(&md, "| %d |", o->cs[j]);
            cli_bprintf(&js, "%s{\"c\":%d,", j ? "," : "", o->cs[j]);
            cell(&md, &js, "clean", res, o, ci, OFF(acc_c) + sizeof(double) * (size_t)(2 * j));
            cli_bprintf(&js, ",");
            cell(&md, &js, "corrupted", res, o, ci, OFF(acc_c) + sizeof(double) * (size_t)(2 * j + 1));
            cli_bprintf(&js, ",");
            cellx(&md, &js, "overlap", res, o, ci, OFF(ov_c) + sizeof(double) * (size_t)j, 1, 3);
            if (o->n_probe) probe_cells(&md, &js, res, o, ci, OFF(pr_c) + sizeof(probe_result) * (size_t)j);
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}");
        }
        cli_bprintf(&js, "]");
        if (o->n_probe) {
            cli_bprintf(&md, "\nProbe with the sweep value validation picks (per seed; test split only scored)\n\n"
                             "| sweep | picked value (mean) | Probe val. %% | Probe test %% | Probe corrupted %% | Probe D.6 |\n"
                             "|---|---|---|---|---|---|\n");
            cli_bprintf(&js, ",\"picked\":{\"alpha\":{");
            cli_bprintf(&md, "| alpha (c = %d) |", o->ev_c);
            cellx(&md, &js, "value", res, o, ci, OFF(pick_alpha), 1, 2);
            probe_cells(&md, &js, res, o, ci, OFF(pr_pick_alpha));
            cli_bprintf(&md, "\n| c (alpha = %g) |", o->alpha);
            cli_bprintf(&js, "},\"c\":{");
            cellx(&md, &js, "value", res, o, ci, OFF(pick_c), 1, 1);
            probe_cells(&md, &js, res, o, ci, OFF(pr_pick_c));
            cli_bprintf(&md, "\n");
            cli_bprintf(&js, "}}");
        }
        cli_bprintf(&js, "}");
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
