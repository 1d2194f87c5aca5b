/* specmoe bench routing / bench alpha: GrMoE's synthetic routing benchmark (Table 1) and the
 * post-hoc sparsity sweep (Fig. 1, Table 3), on the task of include/specmoe/synth.h.
 *
 * Every method trains the same MoE layer (experts d -> H -> out, ReLU, biases) with the same Adam,
 * steps, batch and data stream on MSE to the teacher outputs; only the router differs. Metrics on
 * held-out tokens: assignment accuracy (top-1 expert vs ground-truth component after the best
 * one-to-one matching, Hungarian), load CV, collapse (an expert with < 1% of the tokens), mean
 * per-token routing entropy, entropy of the load distribution, and test MSE. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/methods/grmoe/synth.h"

typedef struct {
    const char *label, *router;
    int k;          /* 0 = all experts (dense) */
    int renorm;
    double balance; /* Switch loss */
    double capacity;
    int amortize;
} method;

/* top-1 routers keep the raw probability as the gate (renorm off), so the router gets a gradient */
static const method kMethods[] = {
    {"Softmax Top-1", "topk", 1, 0, 0, 0, 0},    {"Switch", "switch", 1, 0, 0.01, 0, 0},
    {"Expert Choice", "expert-choice", 1, 0, 0, 1, 0}, {"Hash", "hash", 1, 0, 0, 0, 0},
    {"Soft MoE", "soft", 1, 0, 0, 0, 0},         {"vMF-Gate", "vmf", 1, 0, 0, 0, 0},
    {"GrMoE", "grassmann", 0, 1, 0, 0, 0},       {"GrMoE + Amort.", "grassmann", 0, 1, 0, 0, 1},
};
#define N_METHODS (int)(sizeof kMethods / sizeof kMethods[0])

typedef struct {
    int steps, batch, hidden, test_tokens;
    double lr;
} train_opts;

/* The training flags both synthetic benchmarks share; the defaults were chosen on seeds 500-503. */
#define SYNTH_TRAIN_FLAGS(to)                                                                       \
    {"steps", FL_INT, &to.steps, "1500", "training steps per model", 0},                           \
    {"batch", FL_INT, &to.batch, "256", "tokens per step", 0},                                     \
    {"hidden", FL_INT, &to.hidden, "64", "expert hidden width", 0},                                \
    {"lr", FL_DOUBLE, &to.lr, "1e-2", "Adam learning rate (cosine decay)", 0},                     \
    {"test-tokens", FL_INT, &to.test_tokens, "4096", "held-out tokens per evaluation", 0}

/* The shared checks of those flags; 0 if they are valid. */
static int synth_train_opts_bad(const train_opts *to, const sm_synth_config *sc) {
    return to->steps < 1 || to->batch < sc->N || to->hidden < 1 || to->test_tokens < 1 || !(to->lr > 0);
}

typedef struct {
    double acc, cv, entropy, load_entropy, mse, eff;
    int collapsed;
} run_result;

/* One trained layer and what it needs to be evaluated again (bench alpha). */
typedef struct {
    sm_moe *moe;
    sm_params ps;
} trained;

static sm_status make_layer(trained *tr, const method *me, const sm_synth_config *sc, const train_opts *to,
                            uint64_t seed, sm_error *err) {
    sm_moe_config mc;
    sm_moe_config_default(&mc);
    sm_router_config *r = &mc.router;
    strcpy(r->name, me->router);
    r->E = sc->N;
    r->k = me->k > 0 ? me->k : sc->N;
    r->renorm = me->renorm;
    r->balance_coef = me->balance;
    r->capacity = me->capacity;
    r->amortize = me->amortize;
    r->kr = sc->kr;
    r->slots = (to->batch + sc->N - 1) / sc->N; /* soft: as many slots as tokens */
    mc.H = to->hidden;
    mc.out_dim = sc->out;
    sm_params_init_table(&tr->ps);
    tr->moe = sm_moe_create(&mc, sc->d, err);
    if (!tr->moe) return SM_ERR_ARG;
    sm_status st = sm_moe_declare(tr->moe, &tr->ps, "moe", err);
    if (st == SM_OK) st = sm_params_alloc(&tr->ps, err);
    if (st != SM_OK) return st;
    sm_rng init;
    sm_rng_seed(&init, seed * 7919 + 17);
    sm_params_initialize(&tr->ps, &init);
    sm_moe_bind(tr->moe, &tr->ps);
    return sm_moe_reserve(tr->moe, to->batch, err);
}

static void free_layer(trained *tr) {
    sm_moe_free(tr->moe);
    sm_params_free(&tr->ps);
}

/* Trains on a fresh stream of batches drawn from the task with data_seed (the same for every method). */
static sm_status train_layer(trained *tr, const sm_synth *task, const train_opts *to, uint64_t data_seed, sm_error *err) {
    const int d = task->cfg.d, O = task->cfg.out, B = to->batch;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = SM_OPT_ADAM;
    oc.lr = to->lr;
    sm_optim opt;
    sm_status st = sm_optim_init(&opt, &oc, &tr->ps, err);
    if (st != SM_OK) return st;
    float *x = malloc(sizeof(float) * B * d), *y = malloc(sizeof(float) * B * O);
    int *comp = malloc(sizeof(int) * B);
    sm_real *xr = malloc(sizeof(sm_real) * B * d), *out = malloc(sizeof(sm_real) * B * O);
    sm_real *dout = malloc(sizeof(sm_real) * B * O), *dx = malloc(sizeof(sm_real) * B * d);
    sm_rng data, noise;
    sm_rng_seed(&data, data_seed);
    sm_rng_seed(&noise, data_seed ^ 0xabcdefULL);
    for (int step = 0; step < to->steps && st == SM_OK; step++) {
        sm_synth_sample(task, x, y, comp, B, &data);
        for (int i = 0; i < B * d; i++) xr[i] = x[i];
        sm_params_zero_grad(&tr->ps);
        sm_moe_forward(tr->moe, out, xr, B, &noise, 1);
        for (int i = 0; i < B * O; i++) dout[i] = (sm_real)(2.0 * (out[i] - y[i]) / (B * O));
        memset(dx, 0, sizeof(sm_real) * B * d);
        sm_moe_backward(tr->moe, dx, dout, xr, B);
        if (!sm_all_finite(tr->ps.grad, tr->ps.total))
            st = sm_fail(err, SM_ERR_NUMERIC, "bench routing: non-finite gradient at step %d", step);
        /* cosine decay to 0 over the run */
        double lr = 0.5 * to->lr * (1 + cos(3.141592653589793 * step / to->steps));
        sm_optim_step(&opt, &tr->ps, lr);
    }
    free(x); free(y); free(comp); free(xr); free(out); free(dout); free(dx);
    sm_optim_free(&opt);
    return st;
}

/* Evaluates on test_tokens held-out tokens (in batches of the training batch size). */
static void eval_layer(trained *tr, const sm_synth *task, const train_opts *to, uint64_t test_seed, run_result *res) {
    const int d = task->cfg.d, O = task->cfg.out, B = to->batch, N = task->cfg.N, n = to->test_tokens;
    float *x = malloc(sizeof(float) * B * d), *y = malloc(sizeof(float) * B * O);
    int *comp = malloc(sizeof(int) * n), *pred = malloc(sizeof(int) * n);
    sm_real *xr = malloc(sizeof(sm_real) * B * d), *out = malloc(sizeof(sm_real) * B * O);
    sm_rng data;
    sm_rng_seed(&data, test_seed);
    sm_routing_stats st;
    sm_routing_stats_reset(&st, N, tr->moe->cfg.router.k);
    double se = 0;
    int done = 0;
    while (done < n) {
        int b = n - done < B ? n - done : B;
        sm_synth_sample(task, x, y, comp + done, b, &data);
        for (int i = 0; i < b * d; i++) xr[i] = x[i];
        sm_moe_forward(tr->moe, out, xr, b, NULL, 0);
        for (int i = 0; i < b * O; i++) se += ((double)out[i] - y[i]) * ((double)out[i] - y[i]);
        sm_route_argmax(pred + done, &tr->moe->route);
        sm_routing_stats_add(&st, &tr->moe->route);
        done += b;
    }
    sm_routing_summary s;
    sm_routing_summarize(&st, &s);
    res->acc = sm_assignment_accuracy(pred, comp, n, N, N);
    res->cv = s.cv;
    res->entropy = s.entropy;
    res->eff = s.eff_experts;
    res->collapsed = s.collapsed;
    res->mse = se / ((double)n * O);
    double h = 0;
    for (int e = 0; e < N; e++)
        if (s.load_frac[e] > 0) h -= s.load_frac[e] * log(s.load_frac[e]);
    res->load_entropy = h;
    free(x); free(y); free(comp); free(pred); free(xr); free(out);
}


/* ---------------------------------------------------------------------------------------------- */

int cmd_bench_routing(int argc, char **argv) {
    const char *setting, *out_dir, *only;
    int seeds, threads, seed_offset;
    train_opts to;
    fl_flag fl[] = {
        {"setting", FL_STRING, &setting, "easy", "easy (rho* 0.1, sigma^2 0.1) or hard (rho* 0.4, sigma^2 0.5)", 0},
        {"seeds", FL_INT, &seeds, "50", "seeds per method", 0},
        SYNTH_TRAIN_FLAGS(to),
        {"methods", FL_STRING, &only, "all", "comma-separated method indices 0-7 or all", 0},
        {"threads", FL_INT, &threads, "2", "runs in parallel", 0},
        {"seed-offset", FL_INT, &seed_offset, "0", "first seed (use a disjoint range, e.g. 1000, to choose settings)", 0},
        {"out", FL_STRING, &out_dir, "runs/bench-routing", "directory for the Markdown and JSON results", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "bench routing", "[flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    sm_error err;
    sm_synth_config sc;
    if (sm_synth_setting(&sc, setting, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    if (seeds < 1 || seed_offset < 0 || synth_train_opts_bad(&to, &sc) || threads < 1) {
        fprintf(stderr, "specmoe bench routing: --seeds, --steps, --hidden, --test-tokens, --threads must be >= 1, "
                        "--batch >= %d, --lr > 0\n", sc.N);
        return CLI_EXIT_USAGE;
    }
    int use[N_METHODS];
    for (int i = 0; i < N_METHODS; i++) use[i] = !strcmp(only, "all");
    if (strcmp(only, "all")) {
        int list[N_METHODS];
        int n = sm_parse_class_list(only, list, N_METHODS, N_METHODS, &err);
        if (n < 0) {
            fprintf(stderr, "specmoe bench routing: --methods: %s\n", err.msg);
            return CLI_EXIT_USAGE;
        }
        for (int i = 0; i < n; i++) use[list[i]] = 1;
    }
    /* the tasks, one per seed, shared by every method */
    sm_synth *tasks = calloc((size_t)seeds, sizeof(sm_synth));
    for (int s = 0; s < seeds; s++) {
        sm_rng r;
        sm_rng_seed(&r, 1000 + (uint64_t)(s + seed_offset));
        if (sm_synth_create(&tasks[s], &sc, &r, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    }
    int runs = N_METHODS * seeds;
    run_result *res = calloc((size_t)runs, sizeof(run_result));
    int *ok = calloc((size_t)runs, sizeof(int));
    double t0 = sm_time_now();
    omp_set_num_threads(threads);
    /* one run per thread; the BLAS calls inside run single-threaded (OpenBLAS-OpenMP in a region) */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < runs; i++) {
        int m = i / seeds, s = i % seeds;
        if (!use[m]) continue;
        sm_error e2;
        trained tr = {0};
        uint64_t sd = (uint64_t)(s + seed_offset);
        if (make_layer(&tr, &kMethods[m], &sc, &to, sd, &e2) == SM_OK &&
            train_layer(&tr, &tasks[s], &to, 1000003 + sd, &e2) == SM_OK) {
            eval_layer(&tr, &tasks[s], &to, 2000003 + sd, &res[i]);
            ok[i] = 1;
        } else {
#pragma omp critical
            fprintf(stderr, "specmoe: bench routing: %s seed %d: %s\n", kMethods[m].label, s, e2.msg);
        }
        free_layer(&tr);
    }
    double secs = sm_time_now() - t0;
    double mean_overlap = 0;
    for (int s = 0; s < seeds; s++) mean_overlap += tasks[s].overlap / seeds;
    /* table */
    char md[16384];
    int n = snprintf(md, sizeof md,
                     "Synthetic routing (%s: N=%d, d=%d, k_r=%d, rho*=%.2f (achieved %.3f), sigma^2=%.2f), %d seeds, "
                     "%d steps x %d tokens, %.0f s on %d threads\n\n"
                     "| Method | Assign. acc. %% (95%% CI) | CV | Collapse | Entropy (per token) | Entropy (load) | Test MSE |\n"
                     "|---|---|---|---|---|---|---|\n",
                     setting, sc.N, sc.d, sc.kr, sc.rho, mean_overlap, sc.sigma2, seeds, to.steps, to.batch, secs, threads);
    char json[65536];
    int j = snprintf(json, sizeof json, "{\"setting\":\"%s\",\"seeds\":%d,\"steps\":%d,\"batch\":%d,\"seconds\":%.1f,"
                                        "\"achieved_overlap\":%.4f,\"methods\":[",
                     setting, seeds, to.steps, to.batch, secs, mean_overlap);
    int first = 1;
    for (int m = 0; m < N_METHODS; m++) {
        if (!use[m]) continue;
        double *acc = malloc(sizeof(double) * seeds), *cv = malloc(sizeof(double) * seeds);
        double *ent = malloc(sizeof(double) * seeds), *lent = malloc(sizeof(double) * seeds), *mse = malloc(sizeof(double) * seeds);
        int cnt = 0, coll = 0;
        for (int s = 0; s < seeds; s++) {
            const run_result *r = &res[m * seeds + s];
            if (!ok[m * seeds + s]) continue;
            acc[cnt] = 100 * r->acc;
            cv[cnt] = r->cv;
            ent[cnt] = r->entropy;
            lent[cnt] = r->load_entropy;
            mse[cnt] = r->mse;
            coll += r->collapsed;
            cnt++;
        }
        double ma, ha, mc, hc, me, he, ml, hl, mm, hm;
        sm_mean_ci95(acc, cnt, &ma, &ha);
        sm_mean_ci95(cv, cnt, &mc, &hc);
        sm_mean_ci95(ent, cnt, &me, &he);
        sm_mean_ci95(lent, cnt, &ml, &hl);
        sm_mean_ci95(mse, cnt, &mm, &hm);
        n += snprintf(md + n, sizeof md - n, "| %s | %.1f ± %.1f | %.3f | %.0f%% | %.2f | %.2f | %.4f |\n", kMethods[m].label,
                      ma, ha, mc, cnt ? 100.0 * coll / cnt : 0, me, ml, mm);
        j += snprintf(json + j, sizeof json - j,
                      "%s{\"method\":\"%s\",\"router\":\"%s\",\"runs\":%d,\"assign_acc\":%.4f,\"assign_acc_ci95\":%.4f,"
                      "\"cv\":%.5f,\"cv_ci95\":%.5f,\"collapse_rate\":%.4f,\"entropy\":%.4f,\"load_entropy\":%.4f,"
                      "\"test_mse\":%.6f,\"test_mse_ci95\":%.6f,\"per_seed_acc\":[",
                      first ? "" : ",", kMethods[m].label, kMethods[m].router, cnt, ma, ha, mc, hc,
                      cnt ? (double)coll / cnt : 0, me, ml, mm, hm);
        for (int s = 0; s < cnt; s++) j += snprintf(json + j, sizeof json - j, "%s%.2f", s ? "," : "", acc[s]);
        j += snprintf(json + j, sizeof json - j, "]}");
        first = 0;
        free(acc); free(cv); free(ent); free(lent); free(mse);
    }
    snprintf(json + j, sizeof json - j, "]}\n");
    fputs(md, stdout);
    char path[4096];
    mkdir("runs", 0755);
    mkdir(out_dir, 0755);
    snprintf(path, sizeof path, "%s/routing_%s.md", out_dir, setting);
    int w1 = cli_write_text(path, md);
    snprintf(path, sizeof path, "%s/routing_%s.json", out_dir, setting);
    int w2 = cli_write_text(path, json);
    if (w1 || w2) fprintf(stderr, "specmoe: %s: cannot write results\n", out_dir);
    else printf("\nwrote %s/routing_%s.md and .json\n", out_dir, setting);
    for (int s = 0; s < seeds; s++) sm_synth_free(&tasks[s]);
    free(tasks);
    free(res);
    free(ok);
    return (w1 || w2) ? CLI_EXIT_RUNTIME : 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* bench alpha: one GrMoE and one softmax-gated (dense) model per seed, then the dial swept without
 * retraining. GrMoE's dial is alpha (logits alpha * h * kappa * affinity); the softmax model's dial is
 * its inverse temperature beta = 1/T, which like alpha multiplies the logits (beta = 0: uniform). */

int cmd_bench_alpha(int argc, char **argv) {
    const char *setting, *out_dir, *dials_s;
    int seeds, threads;
    train_opts to;
    fl_flag fl[] = {
        {"setting", FL_STRING, &setting, "easy", "easy or hard synthetic setting", 0},
        {"seeds", FL_INT, &seeds, "5", "seeds (one GrMoE and one softmax model each)", 0},
        {"dials", FL_STRING, &dials_s, "0,0.25,0.5,1,2,5,10", "alpha / inverse-temperature values", 0},
        SYNTH_TRAIN_FLAGS(to),
        {"threads", FL_INT, &threads, "2", "models trained in parallel", 0},
        {"out", FL_STRING, &out_dir, "runs/bench-alpha", "directory for the table, JSON, data and PNG", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "bench alpha", "[flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    sm_error err;
    sm_synth_config sc;
    if (sm_synth_setting(&sc, setting, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    double dials[32];
    int nd = 0;
    for (const char *p = dials_s; *p && nd < 32;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v >= 0) || !isfinite(v)) { nd = -1; break; }
        dials[nd++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') { nd = -1; break; }
    }
    if (nd < 2 || seeds < 1 || synth_train_opts_bad(&to, &sc) || threads < 1) {
        fprintf(stderr, "specmoe bench alpha: --dials needs >= 2 values >= 0 in increasing order; --seeds, --steps, "
                        "--hidden, --test-tokens, --threads >= 1; --batch >= %d; --lr > 0\n", sc.N);
        return CLI_EXIT_USAGE;
    }
    for (int i = 1; i < nd; i++)
        if (dials[i] <= dials[i - 1]) {
            fprintf(stderr, "specmoe bench alpha: --dials must increase\n");
            return CLI_EXIT_USAGE;
        }
    const method gr = {"GrMoE", "grassmann", 0, 1, 0, 0, 0}, sm = {"Softmax (dense)", "topk", 0, 1, 0, 0, 0};
    const method *models[2] = {&gr, &sm};
    /* res[(model * seeds + seed) * nd + i] */
    run_result *res = calloc((size_t)2 * seeds * nd, sizeof(run_result));
    int *ok = calloc((size_t)2 * seeds, sizeof(int));
    double t0 = sm_time_now();
    omp_set_num_threads(threads);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < 2 * seeds; i++) {
        int m = i / seeds, s = i % seeds;
        sm_error e2;
        sm_synth task;
        sm_rng r;
        sm_rng_seed(&r, 1000 + (uint64_t)s);
        trained tr = {0};
        if (sm_synth_create(&task, &sc, &r, &e2) == SM_OK && make_layer(&tr, models[m], &sc, &to, (uint64_t)s, &e2) == SM_OK &&
            train_layer(&tr, &task, &to, 1000003 + (uint64_t)s, &e2) == SM_OK) {
            for (int k = 0; k < nd; k++) {
                sm_router_config *rc2 = &tr.moe->router->cfg;
                if (m == 0) rc2->alpha = dials[k];
                else rc2->temperature = dials[k] > 0 ? 1.0 / dials[k] : 1e300; /* beta = 0: uniform */
                eval_layer(&tr, &task, &to, 2000003 + (uint64_t)s, &res[(size_t)i * nd + k]);
            }
            ok[i] = 1;
        } else {
#pragma omp critical
            fprintf(stderr, "specmoe: bench alpha: %s seed %d: %s\n", models[m]->label, s, e2.msg);
        }
        free_layer(&tr);
        sm_synth_free(&task);
    }
    double secs = sm_time_now() - t0;
    mkdir("runs", 0755);
    mkdir(out_dir, 0755);
    char md[16384], path[4096];
    int n = snprintf(md, sizeof md,
                     "Post-hoc sparsity (%s setting, %d seeds, trained at alpha = 1 / temperature 1, %.0f s)\n\n"
                     "| dial | GrMoE entropy | GrMoE eff. experts | GrMoE test MSE | softmax entropy | softmax eff. experts | softmax test MSE |\n"
                     "|---|---|---|---|---|---|---|\n",
                     setting, seeds, secs);
    snprintf(path, sizeof path, "%s/alpha_%s.dat", out_dir, setting);
    FILE *dat = fopen(path, "w");
    if (dat) fprintf(dat, "# dial grmoe_entropy grmoe_ci softmax_entropy softmax_ci\n");
    double *v = malloc(sizeof(double) * seeds);
    for (int k = 0; k < nd; k++) {
        double mean[2][3], half[2][3];
        for (int m = 0; m < 2; m++)
            for (int q = 0; q < 3; q++) {
                int c = 0;
                for (int s = 0; s < seeds; s++) {
                    if (!ok[m * seeds + s]) continue;
                    const run_result *r = &res[(size_t)(m * seeds + s) * nd + k];
                    v[c++] = q == 0 ? r->entropy : q == 1 ? r->eff : r->mse;
                }
                sm_mean_ci95(v, c, &mean[m][q], &half[m][q]);
            }
        n += snprintf(md + n, sizeof md - n, "| %g | %.3f ± %.3f | %.2f | %.4f | %.3f ± %.3f | %.2f | %.4f |\n", dials[k],
                      mean[0][0], half[0][0], mean[0][1], mean[0][2], mean[1][0], half[1][0], mean[1][1], mean[1][2]);
        if (dat) fprintf(dat, "%g %.6f %.6f %.6f %.6f\n", dials[k], mean[0][0], half[0][0], mean[1][0], half[1][0]);
    }
    free(v);
    if (dat) fclose(dat);
    /* monotonicity of every seed's entropy curve (non-increasing in the dial) */
    for (int m = 0; m < 2; m++) {
        int mono = 0, cnt = 0;
        for (int s = 0; s < seeds; s++) {
            if (!ok[m * seeds + s]) continue;
            cnt++;
            int good = 1;
            for (int k = 1; k < nd; k++)
                if (res[(size_t)(m * seeds + s) * nd + k].entropy > res[(size_t)(m * seeds + s) * nd + k - 1].entropy + 1e-9)
                    good = 0;
            mono += good;
        }
        n += snprintf(md + n, sizeof md - n, "\n%s: entropy is monotone non-increasing in the dial for %d of %d seeds%s",
                      models[m]->label, mono, cnt, mono == cnt ? " (every seed)." : ".");
    }
    n += snprintf(md + n, sizeof md - n, "\n");
    fputs(md, stdout);
    snprintf(path, sizeof path, "%s/alpha_%s.md", out_dir, setting);
    int w = cli_write_text(path, md);
    /* JSON with every seed's curve */
    snprintf(path, sizeof path, "%s/alpha_%s.json", out_dir, setting);
    FILE *js = fopen(path, "w");
    if (js) {
        fprintf(js, "{\"setting\":\"%s\",\"seeds\":%d,\"dials\":[", setting, seeds);
        for (int k = 0; k < nd; k++) fprintf(js, "%s%g", k ? "," : "", dials[k]);
        fprintf(js, "],\"models\":[");
        for (int m = 0; m < 2; m++) {
            fprintf(js, "%s{\"model\":\"%s\",\"runs\":[", m ? "," : "", models[m]->label);
            for (int s = 0; s < seeds; s++) {
                fprintf(js, "%s{\"seed\":%d,\"ok\":%d,\"entropy\":[", s ? "," : "", s, ok[m * seeds + s]);
                for (int k = 0; k < nd; k++) fprintf(js, "%s%.5f", k ? "," : "", res[(size_t)(m * seeds + s) * nd + k].entropy);
                fprintf(js, "],\"eff_experts\":[");
                for (int k = 0; k < nd; k++) fprintf(js, "%s%.4f", k ? "," : "", res[(size_t)(m * seeds + s) * nd + k].eff);
                fprintf(js, "],\"test_mse\":[");
                for (int k = 0; k < nd; k++) fprintf(js, "%s%.6f", k ? "," : "", res[(size_t)(m * seeds + s) * nd + k].mse);
                fprintf(js, "]}");
            }
            fprintf(js, "]}");
        }
        fprintf(js, "]}\n");
        w |= fclose(js);
    } else {
        w = -1;
    }
    /* the plot: entropy vs dial, both models, with 95% intervals */
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "gnuplot -e \"set terminal pngcairo size 800,500; set output '%s/alpha_%s.png'; "
             "set title 'Routing entropy vs sparsity dial (%s setting, %d seeds, no retraining)'; "
             "set xlabel 'GrMoE alpha / softmax inverse temperature'; set ylabel 'mean routing entropy (nats)'; "
             "set key top right; "
             "plot '%s/alpha_%s.dat' using 1:2:3 with yerrorlines title 'GrMoE (alpha)', "
             "'' using 1:4:5 with yerrorlines title 'softmax (1/temperature)'\" 2>&1",
             out_dir, setting, setting, seeds, out_dir, setting);
    int g = system(cmd);
    if (g == 0) printf("\nwrote %s/alpha_%s.{md,json,dat,png}\n", out_dir, setting);
    else fprintf(stderr, "specmoe: bench alpha: gnuplot failed (install gnuplot-nox); the table and JSON are written\n");
    free(res);
    free(ok);
    return w ? CLI_EXIT_RUNTIME : 0;
}
