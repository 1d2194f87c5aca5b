/* specmoe bench oneshot: SR-MoE's one-shot interference experiment (paper 004, Sec. 4, Tables 1-2,
 * Figs. 2-4 and 6) on four Fashion-MNIST classes.
 *
 * For every (data phase, depth, model, seed) one SR-MoE network (conv stem -> `stages` stages of
 * Linear-ReLU-LayerNorm + a dense MoE over E experts -> head) is trained with AdamW. The three models
 * differ only in routing:
 *   Baseline    linear softmax gate (router "topk" with k = E: the dense mixture), no penalties
 *   Clustering  prototype router (Eq. 2), dense, no penalties
 *   Spectral    prototype router + spectral-norm and stable-rank penalties (Eq. 3-5) + diversity (Eq. 6)
 * Then, for every held-out novel image x_new (never trained on), starting each time from the pristine
 * trained parameters: ONE optimiser step on the batch [x_new ; anchor batch drawn from the training
 * subset] (the paper's Anchor-Batch update), and the accuracy on the whole 4-class test split is
 * measured again. Delta = accuracy after - accuracy before (the interference delta). Two variants:
 *   standard  every parameter receives its gradient
 *   surgical  only the experts on x_new's top-1 path (per stage the argmax of its routing
 *             probabilities) keep their gradient slices; everything else is zeroed before the step
 *             (Fig. 1's "blue path").
 * Reported over seeds: mean and 95% interval of initial accuracy, per-class and mean deltas, path
 * diversity of the test set (distinct top-1 expert chains, dominant chain per class) and the
 * per-expert gradient norm of the standard update ("gradient vitality", Fig. 6).
 *
 * Design notes (the paper leaves these open):
 *  - Labels are relabelled 0..C-1 (n_classes = C): the head predicts only the studied classes.
 *  - The one-shot step uses the task cross-entropy only, for all three models (the penalties shape
 *    training; the update is the same plain gradient step for everybody). The updated copy is
 *    created with the penalties off, which keeps the parameter layout identical.
 *  - The standard and surgical variants share one gradient computation (both start from the same
 *    pristine parameters and batch); the surgical one only masks it.
 *  - Runs are independent: OpenMP over (phase, depth, model, seed), each run single-threaded.
 *  - The network is sm_model_arch_srmoe's layout without its separate projection after the pooling
 *    (stage 1's Linear does that job): with it, 2 stem convs + 4 stages need 17 > SM_MAX_LAYERS
 *    layers and the 4 x 4 model cannot be built. --stem-proj 1 keeps it (at most 3 stages).
 *  - Penalty settings (alpha 0.01, sigma_t 1, rho_t 16 = d/4, beta 0.1) are our choice; the paper
 *    gives none. One-shot SGD lr 1e-3: the standard-update delta grows steeply with it (2e-3 already
 *    costs tens of points on the 4 x 4 models).
 *
 * Letters: C classes (4), S stages, E experts per stage, P = E^S expert paths.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "common.h"
#include "flags.h"

#define MAX_C 10
#define MAX_PHASES 4
#define MAX_DEPTHS 4
#define MAX_S 8
#define MAX_E 16
#define MAX_PATHS 4096
#define N_MODELS 3

static const char *kModelNames[N_MODELS] = {"Baseline", "Clustering", "Spectral"};

typedef struct {
    int C, classes[MAX_C];
    int n_phases, phases[MAX_PHASES];   /* training images per class */
    int n_depths, stages[MAX_DEPTHS], experts[MAX_DEPTHS];
    int novel, seeds, seed_offset, width, stem[4], n_stem, eval_batch, anchor;
    int epochs, batch, proto_sq, threads, update_kind;
    double lr, wd, tau, alpha, sigma_t, rho_t, beta, update_lr;
    int on_prototypes, stem_proj;
} bench_opts;

/* Per-run results. */
typedef struct {
    int ok;
    char err[512];
    double acc0;                        /* initial test accuracy (fraction) */
    double delta[2][MAX_C];             /* [standard, surgical][class]: mean over the class's novel images */
    double delta_mean[2];               /* mean over all novel images */
    int n_paths, n_paths1;              /* distinct top-1 paths on the test set; those with >= 1% of it */
    int dom_path[MAX_C];                /* most frequent path per class (test set) */
    double dom_frac[MAX_C];             /* its share of the class */
    double usage[MAX_C][MAX_S][MAX_E];  /* share of the class's test images whose top-1 at stage s is e */
    double gnorm[MAX_S][MAX_E];         /* mean over novel images of ||grad of expert e at stage s||_2 (standard) */
    double novel_same_path;             /* share of novel images whose path is their class's dominant path */
    double train_s, shot_s;
} run_result;

/* ---------------------------------------------------------------------------------------------- */
/* data */

typedef struct {
    sm_dataset train[MAX_PHASES]; /* first phases[p] images of every class, relabelled 0..C-1 */
    sm_dataset novel;             /* the next `novel` images of every class, class-major */
    sm_dataset test;              /* the C classes of the test split, relabelled */
} bench_data;

static sm_status alloc_ds(sm_dataset *ds, int n, int dim, int C, sm_error *err) {
    ds->n = n;
    ds->dim = dim;
    ds->n_classes = C;
    ds->x = malloc(sizeof(float) * (size_t)n * dim);
    ds->y = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!ds->x || !ds->y) return sm_fail(err, SM_ERR_NOMEM, "bench oneshot: out of memory");
    return SM_OK;
}

/* Training subsets are the first N images of each class in file order; the novel images are the
 * next `novel` images of each class after the LARGEST training subset, so they are unseen in every
 * phase and the same images in every phase. */
static sm_status load_data(bench_data *bd, const char *dir, const bench_opts *o, sm_error *err) {
    memset(bd, 0, sizeof *bd);
    sm_dataset full;
    sm_status st = sm_dataset_load_fashion(&full, dir, "train", err);
    if (st != SM_OK) return st;
    int maxN = 0;
    for (int p = 0; p < o->n_phases; p++) maxN = o->phases[p] > maxN ? o->phases[p] : maxN;
    int count[MAX_C] = {0};
    int label_map[256];
    for (int i = 0; i < 256; i++) label_map[i] = -1;
    for (int c = 0; c < o->C; c++) label_map[o->classes[c]] = c;
    for (int i = 0; i < full.n; i++)
        if (full.y[i] >= 0 && full.y[i] < 256 && label_map[full.y[i]] >= 0) count[label_map[full.y[i]]]++;
    for (int c = 0; c < o->C; c++)
        if (count[c] < maxN + o->novel) {
            st = sm_fail(err, SM_ERR_ARG,
                         "bench oneshot: class %d has %d training images; %d for training plus %d novel images are needed",
                         o->classes[c], count[c], maxN, o->novel);
            sm_dataset_free(&full);
            return st;
        }
    const int D = full.dim;
    for (int p = 0; p < o->n_phases && st == SM_OK; p++) st = alloc_ds(&bd->train[p], o->C * o->phases[p], D, o->C, err);
    if (st == SM_OK) st = alloc_ds(&bd->novel, o->C * o->novel, D, o->C, err);
    if (st != SM_OK) {
        sm_dataset_free(&full);
        return st;
    }
    int seen[MAX_C] = {0}, filled[MAX_PHASES] = {0};
    for (int i = 0; i < full.n; i++) {
        int c = full.y[i] >= 0 && full.y[i] < 256 ? label_map[full.y[i]] : -1;
        if (c < 0) continue;
        int r = seen[c]++;
        const float *x = full.x + (size_t)i * D;
        for (int p = 0; p < o->n_phases; p++)
            if (r < o->phases[p]) {
                memcpy(bd->train[p].x + (size_t)filled[p] * D, x, sizeof(float) * D);
                bd->train[p].y[filled[p]++] = c;
            }
        if (r >= maxN && r < maxN + o->novel) {
            int j = c * o->novel + (r - maxN);
            memcpy(bd->novel.x + (size_t)j * D, x, sizeof(float) * D);
            bd->novel.y[j] = c;
        }
    }
    sm_dataset_free(&full);
    st = sm_dataset_load_fashion(&bd->test, dir, "test", err);
    if (st == SM_OK) st = sm_dataset_select(&bd->test, o->classes, o->C, 0, 1, err);
    return st;
}

static void free_data(bench_data *bd, int n_phases) {
    for (int p = 0; p < n_phases; p++) sm_dataset_free(&bd->train[p]);
    sm_dataset_free(&bd->novel);
    sm_dataset_free(&bd->test);
}

/* ---------------------------------------------------------------------------------------------- */
/* one run */

static sm_status make_config(sm_model_config *mc, const bench_opts *o, int depth, int model, int penalties, sm_error *err) {
    sm_model_config_default(mc);
    sm_status st;
    if (o->stem_proj) {
        st = sm_model_arch_srmoe(mc, o->stages[depth], o->width, o->stem, o->n_stem, err);
    } else {
        /* The SR-MoE layout of sm_model_arch_srmoe minus its separate projection "dense:W" after the
         * pooling: stage 1's local processor Linear(32 -> W) already maps the pooled features to the
         * stage width. Without this, 2 stem convs + 4 stages need 17 layers > SM_MAX_LAYERS (16) and
         * sm_model_arch_srmoe refuses the 4 x 4 model; with it every depth uses the same stem. */
        char arch[512];
        size_t n = 0;
        for (int i = 0; i < o->n_stem; i++) n += (size_t)snprintf(arch + n, sizeof arch - n, "%sconv:%d:3:2:1", i ? "," : "", o->stem[i]);
        n += (size_t)snprintf(arch + n, sizeof arch - n, ",maxpool:2:2,gap");
        for (int s = 0; s < o->stages[depth]; s++)
            n += (size_t)snprintf(arch + n, sizeof arch - n, ",dense:%d,ln,moe:%d", o->width, o->width);
        st = sm_model_parse_arch(mc, arch, err);
    }
    if (st != SM_OK) return st;
    mc->in_c = 1;
    mc->in_h = mc->in_w = 28;
    mc->in_dim = 784;
    mc->n_classes = o->C;
    mc->act = SM_ACT_RELU;
    mc->moe.act = SM_ACT_RELU;
    sm_router_config *r = &mc->moe.router;
    sm_router_config_default(r);
    strcpy(r->name, model == 0 ? "topk" : "prototype");
    r->E = o->experts[depth];
    r->k = r->E;        /* dense mixture (Eq. 1) */
    r->renorm = 1;      /* a no-op for k = E */
    r->temperature = model == 0 ? 1.0 : o->tau;
    r->proto_sq = o->proto_sq;
    if (model == 2 && penalties) {
        mc->spectral_alpha = o->alpha;
        mc->sigma_t = o->sigma_t;
        mc->rho_t = o->rho_t;
        mc->diversity_beta = o->beta;
        mc->penalty_on_prototypes = o->on_prototypes;
    }
    return SM_OK;
}


/* Test accuracy, batched. If paths != NULL, also writes each test image's top-1 expert path id
 * (sum_s e_s E^s). If cache != NULL, also copies the input of layer `first` (the first MoE layer)
 * of every test image into cache (n, in). */
static double evaluate(sm_model *m, const sm_dataset *ds, int eb, int *paths, float *cache, int first) {
    const int V = m->cfg.n_classes, nm = sm_model_n_moe(m);
    long correct = 0;
    int arg[1024];
    for (int i = 0; i < ds->n; i += eb) {
        int B = ds->n - i < eb ? ds->n - i : eb;
        const sm_real *lg = sm_model_forward(m, ds->x + (size_t)i * ds->dim, B, NULL, 0);
        for (int t = 0; t < B; t++) correct += sm_argmax(lg + (size_t)t * V, V) == ds->y[i + t];
        if (cache) {
            const sm_layer *L = &m->layers[first - 1];
            memcpy(cache + (size_t)i * L->out, L->out_act, sizeof(float) * (size_t)B * L->out);
        }
        if (paths) {
            for (int t = 0; t < B; t++) paths[i + t] = 0;
            int mul = 1;
            for (int l = 0; l < nm; l++) {
                sm_moe *moe = sm_model_moe(m, l);
                for (int t0 = 0; t0 < B; t0 += 1024) {
                    /* sm_route_argmax works on the whole route; do it by hand in chunks */
                    int nb = B - t0 < 1024 ? B - t0 : 1024;
                    for (int t = 0; t < nb; t++) arg[t] = sm_argmax(moe->route.probs + (size_t)(t0 + t) * moe->E, moe->E);
                    for (int t = 0; t < nb; t++) paths[i + t0 + t] += arg[t] * mul;
                }
                mul *= moe->E;
            }
        }
    }
    return ds->n ? (double)correct / ds->n : 0;
}

_Static_assert(sizeof(sm_real) == sizeof(float), "the benchmark caches activations as float");

/* The surgical update changes expert weights only, so everything before the first MoE layer (stem,
 * first local processor) computes the same features before and after it. The "tail" model is the
 * full model from the first MoE layer on (layers first..n-1 and the head), evaluated on those cached
 * features: a surgical re-evaluation then costs the MoE stages only, not the convolutions. */
typedef struct {
    sm_model *m;
    int first;          /* index of the first MoE layer in the full model */
    int n_map;
    int *map_full;      /* (n_map) parameter index in the full model of tail parameter i */
} tail_model;

static sm_status tail_create(tail_model *t, const sm_model *full, int maxT, sm_error *err) {
    memset(t, 0, sizeof *t);
    const sm_model_config *fc = &full->cfg;
    int f = 0;
    while (f < fc->n_layers && fc->layers[f].kind != SM_LAYER_MOE) f++;
    if (f == 0 || f >= fc->n_layers) return sm_fail(err, SM_ERR_ARG, "bench oneshot: no MoE layer after the stem");
    sm_model_config tc = *fc;
    tc.n_layers = fc->n_layers - f;
    memmove(tc.layers, fc->layers + f, sizeof(sm_layer_spec) * (size_t)tc.n_layers);
    tc.in_dim = full->layers[f - 1].out;
    tc.in_c = tc.in_h = tc.in_w = 0; /* a feature vector */
    tc.spectral_alpha = tc.diversity_beta = 0;
    t->first = f;
    t->m = sm_model_create(&tc, maxT, NULL, err);
    if (!t->m) return SM_ERR_ARG;
    const sm_params *tp = &t->m->params, *fp = &full->params;
    t->n_map = tp->n;
    t->map_full = malloc(sizeof(int) * (size_t)tp->n);
    if (!t->map_full) return sm_fail(err, SM_ERR_NOMEM, "bench oneshot: out of memory");
    for (int i = 0; i < tp->n; i++) {
        char name[SM_NAME_MAX + 16];
        int j, used = 0;
        if (sscanf(tp->p[i].name, "layers.%d.%n", &j, &used) == 1 && used > 0)
            snprintf(name, sizeof name, "layers.%d.%s", j + f, tp->p[i].name + used);
        else
            snprintf(name, sizeof name, "%s", tp->p[i].name);
        int k = sm_params_find(fp, name);
        if (k < 0 || fp->p[k].numel != tp->p[i].numel)
            return sm_fail(err, SM_ERR_MISMATCH, "bench oneshot: tail tensor %s has no match %s in the full model",
                           tp->p[i].name, name);
        t->map_full[i] = k;
    }
    return SM_OK;
}

/* Copies the tail's tensors from the full model's parameter values. */
static void tail_sync(tail_model *t, const sm_params *fp) {
    sm_params *tp = &t->m->params;
    for (int i = 0; i < t->n_map; i++)
        memcpy(sm_params_data(tp, i), sm_params_data(fp, t->map_full[i]), sizeof(sm_real) * tp->p[i].numel);
}

static void tail_free(tail_model *t) {
    sm_model_free(t->m);
    free(t->map_full);
    memset(t, 0, sizeof *t);
}

static void run_one(const bench_opts *o, const bench_data *bd, int phase, int depth, int model, int seed, run_result *R) {
    memset(R, 0, sizeof *R);
    sm_error err;
    const int C = o->C, S = o->stages[depth], E = o->experts[depth], D = 784;
    const sm_dataset *tr = &bd->train[phase];
    sm_model_config mc, mcw;
    int maxT = o->eval_batch;
    if (o->batch > maxT) maxT = o->batch;
    if (o->anchor + 1 > maxT) maxT = o->anchor + 1;
    sm_model *m = NULL, *w = NULL;
    tail_model tail = {0};
    float *feat = NULL;
    sm_dataset tds = {0};
    sm_real *pristine = NULL, *gfull = NULL;
    int *paths = NULL;
    float *xb = NULL;
    int *yb = NULL, *idx = NULL;
    const uint64_t useed = (uint64_t)seed;
    if (make_config(&mc, o, depth, model, 1, &err) != SM_OK || make_config(&mcw, o, depth, model, 0, &err) != SM_OK)
        goto fail;
    sm_rng init;
    sm_rng_seed(&init, 1000003ULL * (useed + 1) + 7919ULL * (uint64_t)(phase * 16 + depth));
    m = sm_model_create(&mc, maxT, &init, &err);
    if (!m) goto fail;
    w = sm_model_create(&mcw, maxT, NULL, &err);
    if (!w) goto fail;
    if (w->params.total != m->params.total) {
        sm_fail(&err, SM_ERR_MISMATCH, "bench oneshot: parameter layouts differ (internal error)");
        goto fail;
    }
    /* train: AdamW, cosine schedule, the same data order for the three models of a (phase, depth, seed) */
    sm_train_config tc;
    cli_bench_train_config(&tc, o->epochs, o->batch, o->lr, o->wd, 17 + useed * 101 + (uint64_t)phase * 7 + (uint64_t)depth * 3);
    sm_train_result tres;
    double t0 = sm_time_now();
    if (sm_train(m, tr, NULL, &tc, NULL, NULL, &tres, &err) != SM_OK) goto fail;
    R->train_s = sm_time_now() - t0;
    t0 = sm_time_now();
    const size_t P = m->params.total;
    pristine = malloc(sizeof(sm_real) * P);
    gfull = malloc(sizeof(sm_real) * P);
    paths = malloc(sizeof(int) * (size_t)bd->test.n);
    xb = malloc(sizeof(float) * (size_t)(o->anchor + 1) * D);
    yb = malloc(sizeof(int) * (size_t)(o->anchor + 1));
    idx = malloc(sizeof(int) * (size_t)tr->n);
    if (!pristine || !gfull || !paths || !xb || !yb || !idx) {
        sm_fail(&err, SM_ERR_NOMEM, "bench oneshot: out of memory");
        goto fail;
    }
    memcpy(pristine, m->params.data, sizeof(sm_real) * P);
    memcpy(w->params.data, pristine, sizeof(sm_real) * P);
    sm_model_free(m);
    m = NULL;
    /* before: accuracy, the test set's expert paths and its features at the first MoE layer */
    if (tail_create(&tail, w, maxT, &err) != SM_OK) goto fail;
    feat = malloc(sizeof(float) * (size_t)bd->test.n * tail.m->cfg.in_dim);
    if (!feat) {
        sm_fail(&err, SM_ERR_NOMEM, "bench oneshot: out of memory");
        goto fail;
    }
    R->acc0 = evaluate(w, &bd->test, o->eval_batch, paths, feat, tail.first);
    tds = (sm_dataset){.n = bd->test.n, .dim = tail.m->cfg.in_dim, .n_classes = C, .x = feat, .y = bd->test.y};
    tail_sync(&tail, &w->params);
    {
        /* the tail on cached features must reproduce the full model exactly (same code, same numbers) */
        double a = evaluate(tail.m, &tds, o->eval_batch, NULL, NULL, 0);
        if (fabs(a - R->acc0) > 1e-12) {
            sm_fail(&err, SM_ERR_MISMATCH, "bench oneshot: internal error: tail accuracy %.6f != full %.6f", a, R->acc0);
            goto fail;
        }
    }
    {
        int np = 1;
        for (int s = 0; s < S; s++) np *= E;
        int *cnt = calloc((size_t)np * C, sizeof(int)), *tot = calloc((size_t)np, sizeof(int));
        int ccount[MAX_C] = {0};
        if (!cnt || !tot) {
            free(cnt);
            free(tot);
            sm_fail(&err, SM_ERR_NOMEM, "bench oneshot: out of memory");
            goto fail;
        }
        for (int i = 0; i < bd->test.n; i++) {
            int c = bd->test.y[i], p = paths[i];
            cnt[(size_t)c * np + p]++;
            tot[p]++;
            ccount[c]++;
            for (int s = 0, q = p; s < S; s++, q /= E) R->usage[c][s][q % E] += 1;
        }
        for (int p = 0; p < np; p++) {
            R->n_paths += tot[p] > 0;
            R->n_paths1 += tot[p] >= 0.01 * bd->test.n;
        }
        for (int c = 0; c < C; c++) {
            int best = 0;
            for (int p = 1; p < np; p++)
                if (cnt[(size_t)c * np + p] > cnt[(size_t)c * np + best]) best = p;
            R->dom_path[c] = best;
            R->dom_frac[c] = ccount[c] ? (double)cnt[(size_t)c * np + best] / ccount[c] : 0;
            for (int s = 0; s < S; s++)
                for (int e = 0; e < E; e++) R->usage[c][s][e] /= ccount[c] ? ccount[c] : 1;
        }
        free(cnt);
        free(tot);
    }
    /* the one-shot updates */
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = o->update_kind;
    oc.lr = o->update_lr;
    oc.weight_decay = 0;
    oc.momentum = 0;
    const int nm = sm_model_n_moe(w), A = o->anchor, B = A + 1;
    double dsum[2][MAX_C] = {{0}};
    int same = 0;
    sm_rng noise;
    sm_rng_seed(&noise, 99 + useed);
    for (int j = 0; j < bd->novel.n; j++) {
        int c = bd->novel.y[j];
        /* the batch: the novel image first, then A anchors drawn without replacement from the training
         * subset; the anchor RNG depends on (seed, phase, image) only, so the three models and both
         * variants see the same anchors */
        memcpy(xb, bd->novel.x + (size_t)j * D, sizeof(float) * D);
        yb[0] = c;
        sm_rng ar;
        sm_rng_seed(&ar, 0xa4c40000ULL + useed * 1000003ULL + (uint64_t)phase * 1009ULL + (uint64_t)j);
        for (int i = 0; i < tr->n; i++) idx[i] = i;
        for (int a = 0; a < A; a++) {
            int r = a + (int)sm_rng_below(&ar, (uint32_t)(tr->n - a));
            int t = idx[a];
            idx[a] = idx[r];
            idx[r] = t;
            memcpy(xb + (size_t)(a + 1) * D, tr->x + (size_t)idx[a] * D, sizeof(float) * D);
            yb[a + 1] = tr->y[idx[a]];
        }
        /* one gradient on the pristine parameters (w holds them here), shared by both variants */
        sm_params_zero_grad(&w->params);
        sm_model_forward(w, xb, B, &noise, 1);
        sm_model_loss(w, yb, NULL, B);
        sm_model_backward(w, B);
        memcpy(gfull, w->params.grad, sizeof(sm_real) * P);
        int path[MAX_S], pid = 0, mul = 1;
        for (int l = 0; l < nm; l++) {
            sm_moe *moe = sm_model_moe(w, l);
            path[l] = sm_argmax(moe->route.probs, moe->E); /* row 0: the novel image */
            pid += path[l] * mul;
            mul *= moe->E;
            /* gradient vitality: ||(dw1, db1, dw2, db2) of expert e||_2 */
            for (int e = 0; e < moe->E; e++) {
                double s2 = 0;
                size_t hd = (size_t)moe->H * moe->d, oh = (size_t)moe->O * moe->H;
                for (size_t q = 0; q < hd; q++) s2 += (double)moe->dw1[e * hd + q] * moe->dw1[e * hd + q];
                for (size_t q = 0; q < oh; q++) s2 += (double)moe->dw2[e * oh + q] * moe->dw2[e * oh + q];
                if (moe->db1)
                    for (int q = 0; q < moe->H; q++) s2 += (double)moe->db1[e * moe->H + q] * moe->db1[e * moe->H + q];
                if (moe->db2)
                    for (int q = 0; q < moe->O; q++) s2 += (double)moe->db2[e * moe->O + q] * moe->db2[e * moe->O + q];
                R->gnorm[l][e] += sqrt(s2) / bd->novel.n;
            }
        }
        same += pid == R->dom_path[c];
        for (int v = 0; v < 2; v++) {
            if (v == 1) {
                /* surgical: keep only the path experts' slices of layers.<i>.experts.* */
                memset(w->params.grad, 0, sizeof(sm_real) * P);
                for (int l = 0; l < nm; l++) {
                    sm_moe *moe = sm_model_moe(w, l);
                    int e = path[l];
                    size_t hd = (size_t)moe->H * moe->d, oh = (size_t)moe->O * moe->H;
                    size_t off;
#define KEEP(ptr, n)                                                                          \
    do {                                                                                      \
        off = (size_t)((ptr) - w->params.grad);                                               \
        memcpy(w->params.grad + off + (size_t)e * (n), gfull + off + (size_t)e * (n), sizeof(sm_real) * (n)); \
    } while (0)
                    KEEP(moe->dw1, hd);
                    KEEP(moe->dw2, oh);
                    if (moe->db1) KEEP(moe->db1, (size_t)moe->H);
                    if (moe->db2) KEEP(moe->db2, (size_t)moe->O);
#undef KEEP
                }
            } else {
                /* the model's backward already left the full gradient in place */
            }
            sm_optim opt;
            if (sm_optim_init(&opt, &oc, &w->params, &err) != SM_OK) goto fail; /* fresh optimiser state */
            sm_optim_step(&opt, &w->params, o->update_lr);
            sm_optim_free(&opt);
            double acc;
            if (v == 0) {
                acc = evaluate(w, &bd->test, o->eval_batch, NULL, NULL, 0);
            } else {
                tail_sync(&tail, &w->params);
                acc = evaluate(tail.m, &tds, o->eval_batch, NULL, NULL, 0);
            }
            dsum[v][c] += acc - R->acc0;
            memcpy(w->params.data, pristine, sizeof(sm_real) * P); /* back to the trained model */
        }
    }
    for (int v = 0; v < 2; v++) {
        double tot = 0;
        for (int c = 0; c < C; c++) {
            R->delta[v][c] = dsum[v][c] / o->novel;
            tot += dsum[v][c];
        }
        R->delta_mean[v] = tot / bd->novel.n;
    }
    R->novel_same_path = (double)same / bd->novel.n;
    R->shot_s = sm_time_now() - t0;
    R->ok = 1;
    goto done;
fail:
    snprintf(R->err, sizeof R->err, "%s", err.msg);
done:
    sm_model_free(m);
    sm_model_free(w);
    tail_free(&tail);
    free(feat);
    free(pristine);
    free(gfull);
    free(paths);
    free(xb);
    free(yb);
    free(idx);
}

/* ---------------------------------------------------------------------------------------------- */
/* flags */

static int parse_int_list(const char *s, int *out, int max, int lo) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > 1000000 || n >= max) return -1;
        out[n++] = (int)v;
        if (*end == ',') p = end + 1;
        else if (*end) return -1;
        else p = end;
    }
    return n;
}

/* "2x2,4x4": stages x experts */
static int parse_depths(const char *s, int *stages, int *experts, int max) {
    int n = 0;
    const char *p = s;
    while (*p) {
        int a, b, used = 0;
        if (n >= max || sscanf(p, "%dx%d%n", &a, &b, &used) != 2) return -1;
        stages[n] = a;
        experts[n] = b;
        n++;
        p += used;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

static void path_str(char *buf, size_t n, int pid, int S, int E) {
    size_t u = 0;
    buf[0] = 0;
    for (int s = 0; s < S && u < n; s++, pid /= E) u += (size_t)snprintf(buf + u, n - u, "%s%d", s ? "-" : "", pid % E);
}


/* appends to a growing string */
static double mean_dom_frac(const run_result *r, int C) {
    double a = 0;
    for (int c = 0; c < C; c++) a += r->dom_frac[c];
    return a / C;
}

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

int cmd_bench_oneshot(int argc, char **argv) {
    const char *data_dir, *classes_s, *phases_s, *depths_s, *stem_s, *optim_s, *target_s, *out_dir;
    bench_opts o;
    memset(&o, 0, sizeof o);
    fl_flag fl[] = {
        {"data", FL_STRING, &data_dir, SM_FASHION_MNIST_DIR, "directory with the Fashion-MNIST IDX .gz files", 0},
        {"classes", FL_STRING, &classes_s, "0,1,7,8", "Fashion-MNIST class ids (T-shirt/top, Trouser, Sneaker, Bag)", 0},
        {"phases", FL_STRING, &phases_s, "525,1600", "training images per class, one data phase each", 0},
        {"novel", FL_INT, &o.novel, "25", "held-out novel images per class (each gets one one-shot update)", 0},
        {"depths", FL_STRING, &depths_s, "2x2,4x4", "stages x experts per architecture", 0},
        {"seeds", FL_INT, &o.seeds, "5", "seeds per (phase, depth, model)", 0},
        {"seed-offset", FL_INT, &o.seed_offset, "0", "first seed", 0},
        {"width", FL_INT, &o.width, "64", "stage width d (experts d -> d -> d)", 0},
        {"stem", FL_STRING, &stem_s, "16,32", "channels of the 3x3 stride-2 stem convolutions", 0},
        {"stem-proj", FL_BOOL, &o.stem_proj, "0", "keep sm_model_arch_srmoe's separate projection after the pooling (fits at most 3 stages with 2 stem convs)", 0},
        {"tau", FL_DOUBLE, &o.tau, "1", "prototype router temperature tau (Eq. 2)", 0},
        {"proto-sq", FL_BOOL, &o.proto_sq, "0", "prototype router: squared Euclidean distance", 0},
        {"spectral-alpha", FL_DOUBLE, &o.alpha, "0.01", "Spectral: weight alpha of the spectral-norm + stable-rank penalties (Eq. 7)", 0},
        {"sigma-t", FL_DOUBLE, &o.sigma_t, "1", "Spectral: target spectral norm sigma_t (Eq. 3)", 0},
        {"rho-t", FL_DOUBLE, &o.rho_t, "16", "Spectral: target stable rank rho_t (Eq. 5); d/4 = the stable rank of a random square init", 0},
        {"diversity-beta", FL_DOUBLE, &o.beta, "0.1", "Spectral: weight beta of the CV^2 diversity loss (Eq. 6)", 0},
        {"penalty-target", FL_STRING, &target_s, "gate", "Spectral: penalise the gate (linear map feeding each stage's router) or the prototypes", 0},
        {"epochs", FL_INT, &o.epochs, "8", "training epochs (AdamW, cosine schedule)", 0},
        {"batch", FL_INT, &o.batch, "64", "training minibatch", 0},
        {"lr", FL_DOUBLE, &o.lr, "1e-3", "training learning rate", 0},
        {"weight-decay", FL_DOUBLE, &o.wd, "1e-4", "AdamW decoupled weight decay", 0},
        {"update-optim", FL_STRING, &optim_s, "sgd", "one-shot optimiser, fresh state per update (sgd|adam)", 0},
        {"update-lr", FL_DOUBLE, &o.update_lr, "1e-3", "one-shot learning rate", 0},
        {"anchor", FL_INT, &o.anchor, "16", "anchor-batch size (training images added to the novel image)", 0},
        {"eval-batch", FL_INT, &o.eval_batch, "500", "test images per forward", 0},
        {"threads", FL_INT, &o.threads, "2", "runs in parallel (each run single-threaded)", 0},
        {"out", FL_STRING, &out_dir, "runs/bench-oneshot", "directory for oneshot.md, oneshot.json, data and PNGs", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "bench oneshot", "[flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    double t_start = sm_time_now();
    sm_error err;
    /* every check before any work */
    o.C = sm_parse_class_list(classes_s, o.classes, MAX_C, 10, &err);
    if (o.C < 0) {
        fprintf(stderr, "specmoe bench oneshot: --classes: %s (Fashion-MNIST ids are 0-9)\n", err.msg);
        return CLI_EXIT_USAGE;
    }
    if (o.C < 2) {
        fprintf(stderr, "specmoe bench oneshot: --classes: need at least 2 classes\n");
        return CLI_EXIT_USAGE;
    }
    for (int i = 0; i < o.C; i++)
        for (int j = 0; j < i; j++)
            if (o.classes[i] == o.classes[j]) {
                fprintf(stderr, "specmoe bench oneshot: --classes: class %d is listed twice\n", o.classes[i]);
                return CLI_EXIT_USAGE;
            }
    o.n_phases = parse_int_list(phases_s, o.phases, MAX_PHASES, 1);
    if (o.n_phases < 1) {
        fprintf(stderr, "specmoe bench oneshot: --phases: '%s' is not a list of at most %d counts >= 1\n", phases_s, MAX_PHASES);
        return CLI_EXIT_USAGE;
    }
    o.n_depths = parse_depths(depths_s, o.stages, o.experts, MAX_DEPTHS);
    if (o.n_depths < 1) {
        fprintf(stderr, "specmoe bench oneshot: --depths: '%s' is not a list like 2x2,4x4 (stages x experts)\n", depths_s);
        return CLI_EXIT_USAGE;
    }
    for (int d = 0; d < o.n_depths; d++) {
        double np = pow(o.experts[d], o.stages[d]);
        if (o.stages[d] < 1 || o.stages[d] > MAX_S || o.experts[d] < 1 || o.experts[d] > MAX_E || np > MAX_PATHS) {
            fprintf(stderr, "specmoe bench oneshot: --depths: %dx%d: need 1 <= stages <= %d, 1 <= experts <= %d and "
                            "experts^stages <= %d (zero experts is not an MoE)\n",
                    o.stages[d], o.experts[d], MAX_S, MAX_E, MAX_PATHS);
            return CLI_EXIT_USAGE;
        }
    }
    o.n_stem = parse_int_list(stem_s, o.stem, 4, 1);
    if (o.n_stem < 1) {
        fprintf(stderr, "specmoe bench oneshot: --stem: '%s' is not a list of 1-4 channel counts >= 1\n", stem_s);
        return CLI_EXIT_USAGE;
    }
    if (!strcmp(optim_s, "sgd")) o.update_kind = SM_OPT_SGD;
    else if (!strcmp(optim_s, "adam")) o.update_kind = SM_OPT_ADAM;
    else {
        fprintf(stderr, "specmoe bench oneshot: --update-optim: '%s' is not sgd or adam\n", optim_s);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(target_s, "gate") && strcmp(target_s, "prototypes")) {
        fprintf(stderr, "specmoe bench oneshot: --penalty-target: '%s' is not gate or prototypes\n", target_s);
        return CLI_EXIT_USAGE;
    }
    o.on_prototypes = !strcmp(target_s, "prototypes");
    if (!(o.tau > 0) || !isfinite(o.tau)) {
        fprintf(stderr, "specmoe bench oneshot: --tau must be > 0 (it divides the distances of Eq. 2)\n");
        return CLI_EXIT_USAGE;
    }
    if (o.novel < 1 || o.seeds < 1 || o.seed_offset < 0 || o.width < 1 || o.epochs < 1 || o.batch < 1 ||
        o.batch > 65536 || o.anchor < 0 || o.anchor > 4096 || o.eval_batch < 1 || o.eval_batch > 65536 || o.threads < 1 ||
        !(o.lr > 0) || !(o.update_lr > 0) || !(o.wd >= 0) || !(o.alpha >= 0) || !(o.beta >= 0) || !(o.sigma_t >= 0) ||
        !(o.rho_t >= 0)) {
        fprintf(stderr, "specmoe bench oneshot: --novel, --seeds, --width, --epochs, --batch (<= 65536), --eval-batch, "
                        "--threads must be >= 1; --anchor in [0, 4096]; --lr, --update-lr > 0; --seed-offset, "
                        "--weight-decay, --spectral-alpha, --diversity-beta, --sigma-t, --rho-t >= 0\n");
        return CLI_EXIT_USAGE;
    }
    for (int p = 0; p < o.n_phases; p++)
        if (o.anchor > o.C * o.phases[p]) {
            fprintf(stderr, "specmoe bench oneshot: --anchor %d exceeds the %d training images of phase %d\n", o.anchor,
                    o.C * o.phases[p], o.phases[p]);
            return CLI_EXIT_USAGE;
        }
    /* the architectures build (refuses a stem too deep for 28 x 28, ...) */
    for (int d = 0; d < o.n_depths; d++)
        for (int mdl = 0; mdl < N_MODELS; mdl++) {
            sm_model_config mc;
            if (make_config(&mc, &o, d, mdl, 1, &err) != SM_OK) {
                fprintf(stderr, "specmoe bench oneshot: --depths %dx%d: %s (a stage takes 3 layers; the stem %d + %d)\n",
                        o.stages[d], o.experts[d], err.msg, o.n_stem, o.stem_proj ? 3 : 2);
                return CLI_EXIT_USAGE;
            }
            sm_model *pm = sm_model_create(&mc, 1, NULL, &err);
            if (!pm) {
                fprintf(stderr, "specmoe bench oneshot: %dx%d %s: %s\n", o.stages[d], o.experts[d], kModelNames[mdl], err.msg);
                return CLI_EXIT_USAGE;
            }
            sm_model_free(pm);
        }
    bench_data bd;
    sm_status st = load_data(&bd, data_dir, &o, &err);
    if (st != SM_OK) {
        free_data(&bd, o.n_phases);
        return st == SM_ERR_ARG ? (fprintf(stderr, "specmoe: %s\n", err.msg), CLI_EXIT_USAGE) : cli_fail(st, &err);
    }
    const int nruns = o.n_phases * o.n_depths * N_MODELS * o.seeds;
    run_result *res = calloc((size_t)nruns, sizeof(run_result));
    /* order the work by cost (largest phase and deepest model first) so the last runs are short */
    int *order = malloc(sizeof(int) * (size_t)nruns);
    double *cost = malloc(sizeof(double) * (size_t)nruns);
    for (int i = 0; i < nruns; i++) {
        int p = i / (o.n_depths * N_MODELS * o.seeds), d = (i / (N_MODELS * o.seeds)) % o.n_depths;
        order[i] = i;
        cost[i] = (double)o.phases[p] * o.epochs * 0.2 + 4.0 * o.novel * o.C * (1 + 0.1 * o.stages[d] * o.experts[d]) +
                  o.stages[d] * o.experts[d] * 1e-3;
    }
    for (int i = 1; i < nruns; i++)
        for (int j = i; j > 0 && cost[order[j]] > cost[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    fprintf(stderr, "bench oneshot: %d runs (%d phases x %d depths x %d models x %d seeds), %d novel images each, on %d threads\n",
            nruns, o.n_phases, o.n_depths, N_MODELS, o.seeds, o.C * o.novel, o.threads);
    int done = 0;
    omp_set_num_threads(o.threads);
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < nruns; k++) {
        int i = order[k];
        int p = i / (o.n_depths * N_MODELS * o.seeds), d = (i / (N_MODELS * o.seeds)) % o.n_depths;
        int mdl = (i / o.seeds) % N_MODELS, s = i % o.seeds;
        run_one(&o, &bd, p, d, mdl, s + o.seed_offset, &res[i]);
#pragma omp critical
        {
            done++;
            if (res[i].ok)
                fprintf(stderr, "[%3d/%d] N=%d %dx%d %-10s seed %d: acc %.2f%%, mean delta %+.2f / surgical %+.2f pp, "
                                "%d paths (train %.0f s, one-shot %.0f s, elapsed %.0f s)\n",
                        done, nruns, o.phases[p], o.stages[d], o.experts[d], kModelNames[mdl], s + o.seed_offset,
                        100 * res[i].acc0, 100 * res[i].delta_mean[0], 100 * res[i].delta_mean[1], res[i].n_paths,
                        res[i].train_s, res[i].shot_s, sm_time_now() - t_start);
            else
                fprintf(stderr, "specmoe: bench oneshot: N=%d %dx%d %s seed %d: %s\n", o.phases[p], o.stages[d],
                        o.experts[d], kModelNames[mdl], s + o.seed_offset, res[i].err);
        }
    }
    free(order);
    free(cost);
    double secs = sm_time_now() - t_start;

    /* ------------------------------------------------------------------------------------------ */
    /* report */
    mkdir("runs", 0755);
    mkdir(out_dir, 0755);
    cli_buf md = {0}, js = {0};
    char clsnames[256] = "";
    for (int c = 0; c < o.C; c++)
        snprintf(clsnames + strlen(clsnames), sizeof clsnames - strlen(clsnames), "%s%s (%d)", c ? ", " : "",
                 sm_fashion_class_name(o.classes[c]), o.classes[c]);
    cli_bprintf(&md,
              "## One-shot interference (SR-MoE Tables 1-2) on Fashion-MNIST\n\n"
              "Classes: %s. Novel images: %d per class (held out of training). Test: %d images. %d seeds; "
              "training %d epochs AdamW lr %g batch %d; one-shot step: %s lr %g, anchor batch %d. "
              "Spectral: alpha %g, sigma_t %g, rho_t %g on the %s, beta %g; tau %g. Deltas in percentage points "
              "(accuracy after - before), mean ± 95%% interval over seeds. Wall time %.0f s on %d threads.\n",
              clsnames, o.novel, bd.test.n, o.seeds, o.epochs, o.lr, o.batch, optim_s, o.update_lr, o.anchor, o.alpha,
              o.sigma_t, o.rho_t, o.on_prototypes ? "prototypes" : "gate (linear map feeding each router)", o.beta, o.tau,
              secs, o.threads);
    cli_bprintf(&js,
              "{\"classes\":[");
    for (int c = 0; c < o.C; c++) cli_bprintf(&js, "%s%d", c ? "," : "", o.classes[c]);
    cli_bprintf(&js,
              "],\"novel_per_class\":%d,\"test_images\":%d,\"seeds\":%d,\"epochs\":%d,\"lr\":%g,\"batch\":%d,"
              "\"update_optim\":\"%s\",\"update_lr\":%g,\"anchor\":%d,\"spectral_alpha\":%g,\"sigma_t\":%g,\"rho_t\":%g,"
              "\"penalty_target\":\"%s\",\"diversity_beta\":%g,\"tau\":%g,\"width\":%d,\"seconds\":%.1f,\"threads\":%d,"
              "\"settings\":[",
              o.novel, bd.test.n, o.seeds, o.epochs, o.lr, o.batch, optim_s, o.update_lr, o.anchor, o.alpha, o.sigma_t,
              o.rho_t, target_s, o.beta, o.tau, o.width, secs, o.threads);
    double *v = malloc(sizeof(double) * (size_t)o.seeds);
    int failed = 0;
    for (int i = 0; i < nruns; i++) failed += !res[i].ok;
    /* gnuplot data: usage heat map (seed 0 of each setting) and rank-sorted gradient norms */
    char path[4096];
    snprintf(path, sizeof path, "%s/oneshot_usage.dat", out_dir);
    FILE *fu = fopen(path, "w");
    snprintf(path, sizeof path, "%s/oneshot_gnorm.dat", out_dir);
    FILE *fg = fopen(path, "w");
    int first_setting = 1, panel = 0;
    for (int p = 0; p < o.n_phases; p++)
        for (int d = 0; d < o.n_depths; d++) {
            const int S = o.stages[d], E = o.experts[d];
            cli_bprintf(&md, "\n### N = %d per class, %d stages x %d experts\n\n| Metric | %s | %s | %s |\n|---|---|---|---|\n",
                      o.phases[p], S, E, kModelNames[0], kModelNames[1], kModelNames[2]);
            /* rows: rowfn(model) -> value per seed */
            const run_result *rr[N_MODELS];
#define RUN(mdl, s) (&res[((p * o.n_depths + d) * N_MODELS + (mdl)) * o.seeds + (s)])
#define ROW(label, prec, sign, scale, expr)                                                           \
    do {                                                                                       \
        cli_bprintf(&md, "| %s |", label);                                                       \
        for (int mdl = 0; mdl < N_MODELS; mdl++) {                                             \
            int cnt = 0;                                                                       \
            for (int s = 0; s < o.seeds; s++) {                                                \
                const run_result *r = RUN(mdl, s);                                             \
                if (r->ok) v[cnt++] = (scale) * (expr);                                        \
            }                                                                                  \
            double mu, hw;                                                                     \
            sm_mean_ci95(v, cnt, &mu, &hw);                                                    \
            cli_bprintf(&md, sign ? " %+.*f ± %.*f |" : " %.*f ± %.*f |", prec, mu, prec, hw);     \
        }                                                                                      \
        cli_bprintf(&md, "\n");                                                                  \
    } while (0)
            ROW("Initial test accuracy %", 2, 0, 100.0, r->acc0);
            for (int var = 0; var < 2; var++) {
                cli_bprintf(&md, "| *Δ, %s update* | | | |\n", var ? "surgical (top-1 path experts only)" : "standard (all parameters)");
                for (int c = 0; c < o.C; c++) {
                    char lab[96];
                    snprintf(lab, sizeof lab, "— %s", sm_fashion_class_name(o.classes[c]));
                    ROW(lab, 2, 1, 100.0, r->delta[var][c]);
                }
                ROW(var ? "**Mean Δ (surgical)**" : "**Mean Δ (standard)**", 2, 1, 100.0, r->delta_mean[var]);
            }
            ROW("Distinct top-1 paths (test set)", 1, 0, 1.0, (double)r->n_paths);
            ROW("Paths with >= 1% of the test set", 1, 0, 1.0, (double)r->n_paths1);
            ROW("Share of each class on its dominant path %", 1, 0, 100.0, mean_dom_frac(r, o.C));
            ROW("Novel images on their class's dominant path %", 1, 0, 100.0, r->novel_same_path);
            /* distinct dominant paths across classes + per-class dominant path of the first seed */
            cli_bprintf(&md, "| Classes with distinct dominant paths |");
            for (int mdl = 0; mdl < N_MODELS; mdl++) {
                int cnt = 0;
                for (int s = 0; s < o.seeds; s++) {
                    const run_result *r = RUN(mdl, s);
                    if (!r->ok) continue;
                    int nd = 0;
                    for (int c = 0; c < o.C; c++) {
                        int uniq = 1;
                        for (int c2 = 0; c2 < c; c2++) uniq &= r->dom_path[c2] != r->dom_path[c];
                        nd += uniq;
                    }
                    v[cnt++] = nd;
                }
                double mu, hw;
                sm_mean_ci95(v, cnt, &mu, &hw);
                cli_bprintf(&md, " %.1f of %d |", mu, o.C);
            }
            cli_bprintf(&md, "\n| Dominant path per class (seed %d; stage experts, share) |", o.seed_offset);
            for (int mdl = 0; mdl < N_MODELS; mdl++) {
                rr[mdl] = RUN(mdl, 0);
                if (!rr[mdl]->ok) {
                    cli_bprintf(&md, " failed |");
                    continue;
                }
                for (int c = 0; c < o.C; c++) {
                    char ps[64];
                    path_str(ps, sizeof ps, rr[mdl]->dom_path[c], S, E);
                    cli_bprintf(&md, "%s%s: %s (%.0f%%)", c ? "; " : " ", sm_fashion_class_name(o.classes[c]), ps, 100 * rr[mdl]->dom_frac[c]);
                }
                cli_bprintf(&md, " |");
            }
            cli_bprintf(&md, "\n");
            /* gradient vitality: rank-sorted per stage (expert ids are arbitrary per seed), mean over seeds */
            cli_bprintf(&md, "\nGradient vitality (standard update): L2 norm of each expert's gradient per stage, experts "
                           "sorted by norm within each stage and run, mean over seeds and novel images; "
                           "last column: largest / smallest.\n\n| Model | Stage |");
            for (int e = 0; e < E; e++) cli_bprintf(&md, " rank %d |", e + 1);
            cli_bprintf(&md, " max/min |\n|---|---|");
            for (int e = 0; e <= E; e++) cli_bprintf(&md, "---|");
            cli_bprintf(&md, "\n");
            double gs[N_MODELS][MAX_S][MAX_E];
            memset(gs, 0, sizeof gs);
            for (int mdl = 0; mdl < N_MODELS; mdl++) {
                int cnt = 0;
                for (int s = 0; s < o.seeds; s++) {
                    const run_result *r = RUN(mdl, s);
                    if (!r->ok) continue;
                    cnt++;
                    for (int l = 0; l < S; l++) {
                        double tmp[MAX_E];
                        for (int e = 0; e < E; e++) tmp[e] = r->gnorm[l][e];
                        qsort(tmp, (size_t)E, sizeof(double), cmp_desc);
                        for (int e = 0; e < E; e++) gs[mdl][l][e] += tmp[e];
                    }
                }
                for (int l = 0; l < S; l++) {
                    cli_bprintf(&md, "| %s | %d |", kModelNames[mdl], l);
                    for (int e = 0; e < E; e++) {
                        gs[mdl][l][e] /= cnt ? cnt : 1;
                        cli_bprintf(&md, " %.3g |", gs[mdl][l][e]);
                    }
                    cli_bprintf(&md, " %.3g |\n", gs[mdl][l][E - 1] > 0 ? gs[mdl][l][0] / gs[mdl][l][E - 1] : INFINITY);
                }
            }
            /* plot data: one gnuplot index block per (setting, model) */
            for (int mdl = 0; mdl < N_MODELS; mdl++, panel++) {
                if (fu) {
                    fprintf(fu, "# panel %d: N=%d %dx%d %s seed %d: rows classes, columns stage*E + expert\n", panel,
                            o.phases[p], S, E, kModelNames[mdl], o.seed_offset);
                    for (int c = 0; c < o.C; c++) {
                        for (int l = 0; l < S; l++)
                            for (int e = 0; e < E; e++) fprintf(fu, "%s%.4f", l + e ? " " : "", rr[mdl]->ok ? rr[mdl]->usage[c][l][e] : 0);
                        fprintf(fu, "\n");
                    }
                    fprintf(fu, "\n\n");
                }
                if (fg) {
                    fprintf(fg, "# panel %d: N=%d %dx%d %s: stage, then rank-sorted expert gradient norms\n", panel,
                            o.phases[p], S, E, kModelNames[mdl]);
                    for (int l = 0; l < S; l++) {
                        fprintf(fg, "%d", l);
                        for (int e = 0; e < E; e++) fprintf(fg, " %.6g", gs[mdl][l][e] > 1e-12 ? gs[mdl][l][e] : 1e-12);
                        fprintf(fg, "\n");
                    }
                    fprintf(fg, "\n\n");
                }
            }
            /* JSON: every run of this setting */
            for (int mdl = 0; mdl < N_MODELS; mdl++)
                for (int s = 0; s < o.seeds; s++) {
                    const run_result *r = RUN(mdl, s);
                    cli_bprintf(&js, "%s{\"train_per_class\":%d,\"stages\":%d,\"experts\":%d,\"model\":\"%s\",\"seed\":%d,\"ok\":%d",
                              first_setting ? "" : ",", o.phases[p], S, E, kModelNames[mdl], s + o.seed_offset, r->ok);
                    first_setting = 0;
                    if (!r->ok) {
                        cli_bprintf(&js, ",\"error\":\"run failed\"}");
                        continue;
                    }
                    cli_bprintf(&js, ",\"initial_acc\":%.5f,\"delta_standard\":[", r->acc0);
                    for (int c = 0; c < o.C; c++) cli_bprintf(&js, "%s%.6f", c ? "," : "", r->delta[0][c]);
                    cli_bprintf(&js, "],\"delta_surgical\":[");
                    for (int c = 0; c < o.C; c++) cli_bprintf(&js, "%s%.6f", c ? "," : "", r->delta[1][c]);
                    cli_bprintf(&js, "],\"mean_delta_standard\":%.6f,\"mean_delta_surgical\":%.6f,\"distinct_paths\":%d,"
                                   "\"paths_over_1pct\":%d,\"novel_on_dominant_path\":%.4f,\"dominant_path\":[",
                              r->delta_mean[0], r->delta_mean[1], r->n_paths, r->n_paths1, r->novel_same_path);
                    for (int c = 0; c < o.C; c++) {
                        char ps[64];
                        path_str(ps, sizeof ps, r->dom_path[c], S, E);
                        cli_bprintf(&js, "%s{\"path\":\"%s\",\"share\":%.4f}", c ? "," : "", ps, r->dom_frac[c]);
                    }
                    cli_bprintf(&js, "],\"usage\":[");
                    for (int c = 0; c < o.C; c++) {
                        cli_bprintf(&js, "%s[", c ? "," : "");
                        for (int l = 0; l < S; l++) {
                            cli_bprintf(&js, "%s[", l ? "," : "");
                            for (int e = 0; e < E; e++) cli_bprintf(&js, "%s%.4f", e ? "," : "", r->usage[c][l][e]);
                            cli_bprintf(&js, "]");
                        }
                        cli_bprintf(&js, "]");
                    }
                    cli_bprintf(&js, "],\"grad_norm\":[");
                    for (int l = 0; l < S; l++) {
                        cli_bprintf(&js, "%s[", l ? "," : "");
                        for (int e = 0; e < E; e++) cli_bprintf(&js, "%s%.6g", e ? "," : "", r->gnorm[l][e]);
                        cli_bprintf(&js, "]");
                    }
                    cli_bprintf(&js, "],\"train_seconds\":%.1f,\"oneshot_seconds\":%.1f}", r->train_s, r->shot_s);
                }
#undef ROW
#undef RUN
        }
    cli_bprintf(&js, "]}\n");
    if (failed) cli_bprintf(&md, "\n%d of %d runs failed (see stderr); they are left out of the statistics.\n", failed, nruns);
    free(v);
    if (fu) fclose(fu);
    if (fg) fclose(fg);
    /* plots: a grid of panels, rows = (phase, depth), columns = models */
    int rows = o.n_phases * o.n_depths, gok = 0;
    char gp[4096];
    snprintf(gp, sizeof gp, "%s/oneshot_plots.gp", out_dir);
    FILE *g = fopen(gp, "w");
    if (g) {
        fprintf(g, "set terminal pngcairo size 1200,%d font ',9'\nset output '%s/oneshot_paths.png'\n", 260 * rows + 60, out_dir);
        fprintf(g, "set multiplot layout %d,3 title 'Top-1 expert usage per class on the test set (seed %d): rows = classes, "
                   "columns = stage:expert'\n", rows, o.seed_offset);
        fprintf(g, "set palette defined (0 'white', 1 '#2166ac')\nset cbrange [0:1]\nunset key\nset bmargin 4\nset lmargin 12\n");
        int pn = 0;
        for (int p = 0; p < o.n_phases; p++)
            for (int d = 0; d < o.n_depths; d++)
                for (int mdl = 0; mdl < N_MODELS; mdl++, pn++) {
                    int S = o.stages[d], E = o.experts[d];
                    fprintf(g, "set title 'N=%d, %dx%d, %s'\n", o.phases[p], S, E, kModelNames[mdl]);
                    fprintf(g, "set xrange [-0.5:%d.5]\nset yrange [%d.5:-0.5]\nset xtics (", S * E - 1, o.C - 1);
                    for (int l = 0; l < S; l++)
                        for (int e = 0; e < E; e++) fprintf(g, "%s\"s%de%d\" %d", l + e ? ", " : "", l, e, l * E + e);
                    fprintf(g, ") %s font ',7'\nset ytics (", S * E > 6 ? "rotate by 90 right" : "norotate center");
                    for (int c = 0; c < o.C; c++) fprintf(g, "%s\"%s\" %d", c ? ", " : "", sm_fashion_class_name(o.classes[c]), c);
                    fprintf(g, ")\nplot '%s/oneshot_usage.dat' index %d matrix with image\n", out_dir, pn);
                }
        fprintf(g, "unset multiplot\n");
        fprintf(g, "reset\nset terminal pngcairo size 1200,%d font ',9'\nset output '%s/oneshot_gradnorm.png'\n", 260 * rows + 60, out_dir);
        fprintf(g, "set multiplot layout %d,3 title 'Gradient vitality: L2 norm of each expert gradient in the standard "
                   "one-shot update (experts rank-sorted per stage, mean over seeds and novel images)'\n", rows);
        fprintf(g, "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
                   "set logscale y\nset yrange [1e-6:*]\nset format y '10^{%%L}'\nset ylabel '||grad E_i||_2'\nset xlabel 'stage'\nset key top right font ',7'\n");
        pn = 0;
        for (int p = 0; p < o.n_phases; p++)
            for (int d = 0; d < o.n_depths; d++)
                for (int mdl = 0; mdl < N_MODELS; mdl++, pn++) {
                    int E = o.experts[d];
                    fprintf(g, "set title 'N=%d, %dx%d, %s'\nplot ", o.phases[p], o.stages[d], E, kModelNames[mdl]);
                    for (int e = 0; e < E; e++)
                        fprintf(g, "%s'%s/oneshot_gnorm.dat' index %d using %d%s title 'rank %d'", e ? ", " : "", out_dir, pn,
                                e + 2, e ? "" : ":xtic(1)", e + 1);
                    fprintf(g, "\n");
                }
        fprintf(g, "unset multiplot\n");
        fclose(g);
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", gp);
        gok = system(cmd) == 0;
    }
    secs = sm_time_now() - t_start;
    cli_bprintf(&md, "\nTotal wall time: %.1f s (%d runs on %d threads).\n", secs, nruns, o.threads);
    if (md.failed || js.failed || !md.s || !js.s) {
        fprintf(stderr, "specmoe: bench oneshot: out of memory for the report\n");
        free(md.s);
        free(js.s);
        free(res);
        free_data(&bd, o.n_phases);
        return CLI_EXIT_RUNTIME;
    }
    fputs(md.s, stdout);
    snprintf(path, sizeof path, "%s/oneshot.md", out_dir);
    int w1 = cli_write_text(path, md.s);
    snprintf(path, sizeof path, "%s/oneshot.json", out_dir);
    int w2 = cli_write_text(path, js.s);
    if (w1 || w2) fprintf(stderr, "specmoe: %s: cannot write results\n", out_dir);
    else printf("\nwrote %s/oneshot.{md,json}%s\n", out_dir,
                gok ? ", oneshot_paths.png, oneshot_gradnorm.png" : " (gnuplot failed: no PNGs; install gnuplot-nox)");
    printf("bench oneshot: total wall time %.1f s\n", secs);
    free(md.s);
    free(js.s);
    free(res);
    free_data(&bd, o.n_phases);
    return (w1 || w2) ? CLI_EXIT_RUNTIME : (failed ? CLI_EXIT_RUNTIME : 0);
}
