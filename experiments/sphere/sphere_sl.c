/* bench sphere, supervised: continual sequences on Fashion-MNIST for quick evidence about SPHERE
 * outside RL (the paper's App. J.14.2 runs the same protocol on SplitCIFAR-100).
 *
 *   split     5 tasks of 2 classes (0-1, 2-3, ..., 8-9), trained with task-masked cross-entropy (the
 *             softmax restricted to the task's classes: sm_model_loss's mask); scored by task-masked
 *             accuracy on the task's test examples.
 *   permuted  --sl-permuted tasks of all 10 classes, each with its own fixed pixel permutation (task 0
 *             the identity); scored by accuracy on the first 2000 test images under that permutation.
 *
 * One model goes through the tasks in order (sequential fine-tuning): AdamW lr 1e-3, no weight decay,
 * batch 64, --sl-epochs per task, one optimiser kept through the sequence. Each task is scored right
 * after its training, and the final model on every task (their means are the tables' two columns).
 * The model is the paper's MoE classifier shape at Fashion-MNIST scale: `moehead:64:1:64` - 8 experts,
 * each an MLP 784 -> 64 -> 64 -> 10, a gate MLP of one layer of 64 before a top-2 router (temperature
 * 1, subset softmax, no balance loss). SPHERE: Eq. 26 on the routing-weighted last hidden features,
 * grad mode (App. A.3) with --sl-rho, through sm_sphere_step. The eNTK effective rank (Eq. 7, of the
 * logits projected on a fixed unit direction) after each task on a fixed held-out batch of 32 test
 * images (the first 32, unpermuted, all classes), the same for every method.
 *
 * Results per (protocol, method, seed) are kept in DIR/<protocol>-<method>-s<seed>.json and read back
 * by a later session. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/sphere/sphere_sl.h"
#include "specmoe/core/optim.h"
#include "specmoe/io/data.h"
#include "specmoe/methods/sphere/sphere.h"
#include "specmoe/nn/model.h"

#define SL_MAX_TASKS 20
#define SL_BATCH 64
#define SL_HELD 32
#define SL_PERM_TEST 2000

typedef struct {
    float *x; /* (n, 784) */
    int *y;   /* (n) */
    int n;
} sl_set;

typedef struct {
    sl_set train, test;
    unsigned char mask[10];
    int masked;
} sl_task;

typedef struct {
    int n_tasks;
    double after[SL_MAX_TASKS], final[SL_MAX_TASKS], entk[SL_MAX_TASKS];
    double seconds;
} sl_result;

static const char *const kSlMethods[2] = {"topk", "topk+sphere"};

/* rows of src whose label passes keep (per class at most per_class, 0: all), permuted by perm (or not) */
static int take(sl_set *out, const sm_dataset *src, const unsigned char *keep, int per_class, int max_n, const int *perm) {
    int count[10] = {0}, n = 0;
    out->x = malloc(sizeof(float) * (size_t)src->n * 784);
    out->y = malloc(sizeof(int) * (size_t)src->n);
    if (!out->x || !out->y) return -1;
    for (int i = 0; i < src->n && (max_n <= 0 || n < max_n); i++) {
        const int c = src->y[i];
        if (!keep[c] || (per_class > 0 && count[c] >= per_class)) continue;
        count[c]++;
        const float *s = src->x + (size_t)i * 784;
        float *d = out->x + (size_t)n * 784;
        for (int j = 0; j < 784; j++) d[j] = perm ? s[perm[j]] : s[j];
        out->y[n++] = c;
    }
    out->n = n;
    return 0;
}

static void free_tasks(sl_task *t, int n) {
    for (int i = 0; i < n; i++) free(t[i].train.x), free(t[i].train.y), free(t[i].test.x), free(t[i].test.y);
}

static int make_tasks(sl_task *t, const char *proto, const sp_sl_opts *o, const sm_dataset *tr, const sm_dataset *te) {
    const int split = !strcmp(proto, "split"), n = split ? 5 : o->n_permuted;
    int perm[784];
    for (int k = 0; k < n; k++) {
        memset(&t[k], 0, sizeof t[k]);
        for (int c = 0; c < 10; c++) t[k].mask[c] = split ? c / 2 == k : 1;
        t[k].masked = split;
        sm_rng r;
        sm_rng_seed(&r, 0x5045524dULL + (uint64_t)k); /* the task's permutation, the same for every run */
        for (int j = 0; j < 784; j++) perm[j] = j;
        for (int j = 783; j > 0 && k > 0 && !split; j--) {
            int i = (int)sm_rng_below(&r, (uint32_t)j + 1), s = perm[i];
            perm[i] = perm[j], perm[j] = s;
        }
        if (take(&t[k].train, tr, t[k].mask, o->per_class, 0, split ? NULL : perm) ||
            take(&t[k].test, te, t[k].mask, 0, split ? 0 : SL_PERM_TEST, split ? NULL : perm)) {
            free_tasks(t, k + 1);
            return -1;
        }
    }
    return n;
}

/* accuracy on s, the argmax over the task's classes (task-masked) or over all */
static double accuracy(sm_model *m, const sl_set *s, const unsigned char *mask) {
    long right = 0;
    for (int i = 0; i < s->n; i += SL_BATCH) {
        const int B = s->n - i < SL_BATCH ? s->n - i : SL_BATCH;
        const sm_real *z = sm_model_forward(m, s->x + (size_t)i * 784, B, NULL, 0);
        for (int b = 0; b < B; b++) {
            int best = -1;
            for (int c = 0; c < 10; c++)
                if (mask[c] && (best < 0 || z[(size_t)b * 10 + c] > z[(size_t)b * 10 + best])) best = c;
            right += best == s->y[i + b];
        }
    }
    return s->n ? (double)right / s->n : NAN;
}

static sm_status run_one(const sl_task *tasks, int n_tasks, const sp_sl_opts *o, int sphere, int seed, const float *held,
                         sl_result *res, sm_error *err) {
    sm_model_config mc;
    sm_model_config_default(&mc);
    mc.in_dim = 784, mc.in_c = 1, mc.in_h = mc.in_w = 28, mc.n_classes = 10, mc.act = SM_ACT_RELU;
    sm_status st = sm_model_parse_arch(&mc, "moehead:64:1:64", err);
    if (st == SM_OK) st = sm_router_config_set(&mc.moe.router, "topk", err);
    if (st != SM_OK) return st;
    mc.moe.depth = 2;
    mc.moe.router.E = 8, mc.moe.router.k = 2, mc.moe.router.temperature = 1, mc.moe.router.renorm = 1;
    mc.moe.router.balance_coef = 0;
    sm_rng rng;
    sm_rng_seed(&rng, (uint64_t)seed);
    sm_model *m = sm_model_create(&mc, SL_BATCH, &rng, err);
    if (!m) return SM_ERR_ARG;
    sm_optim opt;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.lr = 1e-3, oc.weight_decay = 0;
    memset(&opt, 0, sizeof opt);
    st = sm_optim_init(&opt, &oc, &m->params, err);
    sm_sphere_config sc = {.rho = o->rho, .mode = SM_SPHERE_GRAD};
    sm_sphere_reg *reg = NULL;
    if (st == SM_OK && sphere && !(reg = sm_sphere_reg_create(&sc, m, err))) st = SM_ERR_ARG;
    size_t maxn = 0;
    for (int k = 0; k < n_tasks; k++) maxn = (size_t)tasks[k].train.n > maxn ? (size_t)tasks[k].train.n : maxn;
    int *order = malloc(sizeof(int) * (maxn ? maxn : 1));
    float *xb = malloc(sizeof(float) * SL_BATCH * 784);
    int yb[SL_BATCH];
    if (st == SM_OK && (!order || !xb)) st = sm_fail(err, SM_ERR_NOMEM, "fmnist: out of memory");
    sm_real u[10];
    sm_rng ur;
    sm_rng_seed(&ur, 0x5350484552ULL);
    double n2 = 0;
    for (int c = 0; c < 10; c++) u[c] = (sm_real)sm_rng_normal(&ur), n2 += (double)u[c] * u[c];
    for (int c = 0; c < 10; c++) u[c] = (sm_real)(u[c] / sqrt(n2));
    const double t0 = sm_time_now();
    res->n_tasks = n_tasks;
    for (int k = 0; k < n_tasks && st == SM_OK; k++) {
        const sl_task *T = &tasks[k];
        const int N = T->train.n;
        for (int i = 0; i < N; i++) order[i] = i;
        for (int ep = 0; ep < o->epochs && st == SM_OK; ep++) {
            for (int i = N - 1; i > 0; i--) {
                int j = (int)sm_rng_below(&rng, (uint32_t)i + 1), s = order[i];
                order[i] = order[j], order[j] = s;
            }
            for (int i = 0; i + SL_BATCH <= N; i += SL_BATCH) {
                for (int b = 0; b < SL_BATCH; b++) {
                    memcpy(xb + (size_t)b * 784, T->train.x + (size_t)order[i + b] * 784, sizeof(float) * 784);
                    yb[b] = T->train.y[order[i + b]];
                }
                sm_model_forward(m, xb, SL_BATCH, &rng, 1);
                const double loss = sm_model_loss(m, yb, T->masked ? T->mask : NULL, SL_BATCH);
                if (!isfinite(loss)) {
                    st = sm_fail(err, SM_ERR_NUMERIC, "fmnist: the loss became %g on task %d", loss, k);
                    break;
                }
                sm_params_zero_grad(&m->params);
                sm_model_backward(m, SL_BATCH);
                if (reg) {
                    sm_sphere_stats ss;
                    sm_sphere_step(reg, NULL, 0, loss, SL_BATCH, &ss);
                }
                sm_optim_step(&opt, &m->params, oc.lr);
            }
        }
        if (st != SM_OK) break;
        res->after[k] = accuracy(m, &T->test, T->mask);
        sm_sphere_diag dg;
        st = sm_sphere_diagnose(m, held, SL_HELD, u, &dg, err);
        res->entk[k] = dg.entk_srank;
    }
    for (int k = 0; k < n_tasks && st == SM_OK; k++) res->final[k] = accuracy(m, &tasks[k].test, tasks[k].mask);
    res->seconds = sm_time_now() - t0;
    free(order), free(xb);
    sm_sphere_reg_free(reg);
    sm_optim_free(&opt);
    sm_model_free(m);
    return st;
}

static void arr(cJSON *o, const char *k, const double *v, int n) {
    cJSON *a = cJSON_AddArrayToObject(o, k);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(isfinite(v[i]) ? v[i] : -1));
}
static void get_arr(const cJSON *o, const char *k, double *v, int n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, k);
    for (int i = 0; i < n; i++) v[i] = cJSON_GetArrayItem(a, i) ? cJSON_GetArrayItem(a, i)->valuedouble : NAN;
}

/* reads an earlier session's result; 1 if there is one */
static int read_result(const char *path, sl_result *r) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *nt = cJSON_GetObjectItemCaseSensitive(j, "tasks");
    if (!cJSON_IsNumber(nt) || nt->valueint < 1 || nt->valueint > SL_MAX_TASKS) {
        cJSON_Delete(j);
        return 0;
    }
    r->n_tasks = nt->valueint;
    get_arr(j, "acc_after", r->after, r->n_tasks);
    get_arr(j, "acc_final", r->final, r->n_tasks);
    get_arr(j, "entk_after", r->entk, r->n_tasks);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "seconds");
    r->seconds = cJSON_IsNumber(s) ? s->valuedouble : NAN;
    cJSON_Delete(j);
    return 1;
}

static double mean_of(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s / n;
}

/* mean and sample std over seeds of per-seed values x[0..n) */
static void ms(const double *x, int n, double *m, double *sd) {
    *m = mean_of(x, n);
    double q = 0;
    for (int i = 0; i < n; i++) q += (x[i] - *m) * (x[i] - *m);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

sm_status sp_fmnist(const sp_sl_opts *o, const char *dir, int quick, cli_buf *md, cJSON *json, sm_error *err) {
    if (cli_mkdirs(dir)) return sm_fail(err, SM_ERR_IO, "%s: cannot create", dir);
    sm_dataset tr = {0}, te = {0};
    sm_status st = sm_dataset_load_fashion(&tr, NULL, "train", err);
    if (st == SM_OK) st = sm_dataset_load_fashion(&te, NULL, "test", err);
    float held[SL_HELD * 784];
    if (st == SM_OK) memcpy(held, te.x, sizeof held);
    char list[64];
    snprintf(list, sizeof list, "%s", o->protocols);
    for (char *save = NULL, *proto = strtok_r(list, ",", &save); proto && st == SM_OK; proto = strtok_r(NULL, ",", &save)) {
        if (strcmp(proto, "split") && strcmp(proto, "permuted")) {
            st = sm_fail(err, SM_ERR_ARG, "--sl-tasks: unknown protocol '%s' (split, permuted)", proto);
            break;
        }
        sl_task tasks[SL_MAX_TASKS];
        const int nt = make_tasks(tasks, proto, o, &tr, &te);
        if (nt < 0) {
            st = sm_fail(err, SM_ERR_NOMEM, "fmnist: out of memory");
            break;
        }
        char per[32];
        if (o->per_class > 0) snprintf(per, sizeof per, "%d", o->per_class);
        else snprintf(per, sizeof per, "all");
        cli_bprintf(md, "\n### Fashion-MNIST %s: %d tasks, %d epochs per task, %s training examples per class, mean +- sample std "
                        "over %d seeds%s\n\n| method | accuracy right after each task (mean over tasks) | final model on all tasks "
                        "(mean) | eNTK srank after task 1 | after the last | seconds per run |\n|---|---|---|---|---|---|\n",
                    proto, nt, o->epochs, per, o->seeds, quick ? " [quick tier: a smoke test, decides nothing]" : "");
        cJSON *tab = cJSON_CreateObject();
        cJSON_AddStringToObject(tab, "id", "fmnist");
        cJSON_AddStringToObject(tab, "protocol", proto);
        cJSON *rows = cJSON_AddArrayToObject(tab, "rows");
        for (int me = 0; me < 2 && st == SM_OK; me++) {
            double after[100], final[100], e0[100], e1[100], secs[100];
            const int ns = o->seeds < 100 ? o->seeds : 100;
            cJSON *row = cJSON_CreateObject();
            cJSON_AddStringToObject(row, "method", kSlMethods[me]);
            cJSON *per = cJSON_AddArrayToObject(row, "seeds");
            for (int s = 0; s < ns && st == SM_OK; s++) {
                char path[700];
                snprintf(path, sizeof path, "%s/%s-%s-s%d.json", dir, proto, kSlMethods[me], s + 1);
                sl_result r;
                if (!read_result(path, &r) || r.n_tasks != nt) {
                    if ((st = run_one(tasks, nt, o, me, s + 1, held, &r, err)) != SM_OK) break;
                    cJSON *j = cJSON_CreateObject();
                    cJSON_AddNumberToObject(j, "tasks", nt);
                    arr(j, "acc_after", r.after, nt), arr(j, "acc_final", r.final, nt), arr(j, "entk_after", r.entk, nt);
                    cJSON_AddNumberToObject(j, "seconds", r.seconds);
                    char *text = cJSON_Print(j);
                    if (!text || cli_write_text(path, text)) st = sm_fail(err, SM_ERR_IO, "%s: cannot write", path);
                    free(text);
                    cJSON_Delete(j);
                    printf("bench-sphere-fmnist protocol=%s method=%s seed=%d after=%.4f final=%.4f seconds=%.1f\n", proto,
                           kSlMethods[me], s + 1, mean_of(r.after, nt), mean_of(r.final, nt), r.seconds);
                    fflush(stdout);
                }
                after[s] = mean_of(r.after, nt), final[s] = mean_of(r.final, nt), e0[s] = r.entk[0], e1[s] = r.entk[nt - 1];
                secs[s] = r.seconds;
                cJSON *ps = cJSON_CreateObject();
                arr(ps, "acc_after", r.after, nt), arr(ps, "acc_final", r.final, nt), arr(ps, "entk_after", r.entk, nt);
                cJSON_AddItemToArray(per, ps);
            }
            if (st != SM_OK) {
                cJSON_Delete(row);
                break;
            }
            const double *cols[5] = {after, final, e0, e1, secs};
            static const char *const keys[5] = {"acc_after_mean", "acc_final_mean", "entk_after_first", "entk_after_last", "seconds"};
            cli_bprintf(md, "| %s |", kSlMethods[me]);
            for (int c = 0; c < 5; c++) {
                double m, sd;
                ms(cols[c], ns, &m, &sd);
                cli_bprintf(md, c == 4 ? " %.1f |" : " %.4g +- %.2g |", m, sd);
                cJSON *cc = cJSON_AddObjectToObject(row, keys[c]);
                cJSON_AddNumberToObject(cc, "mean", m);
                cJSON_AddNumberToObject(cc, "std", sd);
            }
            cli_bprintf(md, "\n");
            cJSON_AddItemToArray(rows, row);
        }
        cJSON_AddItemToArray(cJSON_GetObjectItem(json, "tables"), tab);
        free_tasks(tasks, nt);
    }
    sm_dataset_free(&tr), sm_dataset_free(&te);
    return st;
}
