/* specmoe bench routing: GrMoE's synthetic routing benchmark (Table 1): eight routers, the same
 * layer, task and training (synth_layer.h), over many seeds; a Markdown table and JSON.
 *
 * parse (flags -> routing_settings), run (settings -> routing_results: one trained and evaluated
 * layer per method and seed), report (results -> table on stdout, .md and .json files). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"
#include "experiments/grmoe/synth_layer.h"

/* top-1 routers keep the raw probability as the gate (renorm off), so the router gets a gradient */
static const gr_method kMethods[] = {
    {"Softmax Top-1", "topk", 1, 0, 0, 0, 0},    {"Switch", "switch", 1, 0, 0.01, 0, 0},
    {"Expert Choice", "expert-choice", 1, 0, 0, 1, 0}, {"Hash", "hash", 1, 0, 0, 0, 0},
    {"Soft MoE", "soft", 1, 0, 0, 0, 0},         {"vMF-Gate", "vmf", 1, 0, 0, 0, 0},
    {"GrMoE", "grassmann", 0, 1, 0, 0, 0},       {"GrMoE + Amort.", "grassmann", 0, 1, 0, 0, 1},
};
#define N_METHODS (int)(sizeof kMethods / sizeof kMethods[0])

typedef struct {
    const char *setting, *out_dir;
    int seeds, threads, seed_offset;
    int use[N_METHODS]; /* the methods to run */
    gr_train_opts to;
    sm_synth_config sc;
} routing_settings;

typedef struct {
    gr_metrics *res; /* (N_METHODS, seeds) */
    int *ok;         /* (N_METHODS, seeds): the run finished */
    double seconds, mean_overlap;
} routing_results;

/* ---------------------------------------------------------------------------------------------- */
/* parse */

/* --methods: "all" or a comma-separated list of method indices or names (case-insensitive) into use;
 * 0, or 2 after printing a message that lists the methods */
static int parse_methods(const char *s, int *use) {
    for (int i = 0; i < N_METHODS; i++) use[i] = !strcmp(s, "all");
    if (!strcmp(s, "all")) return 0;
    const char *p = s;
    for (;;) {
        size_t len = strcspn(p, ",");
        int m = -1;
        char *end;
        long v = strtol(p, &end, 10);
        if (len && end == p + len && v >= 0 && v < N_METHODS) m = (int)v;
        for (int i = 0; m < 0 && i < N_METHODS; i++)
            if (len && strlen(kMethods[i].label) == len && !strncasecmp(p, kMethods[i].label, len)) m = i;
        if (m < 0) {
            fprintf(stderr, "specmoe bench routing: --methods: unknown method '%.*s' (all, or indices or names:", (int)len, p);
            for (int i = 0; i < N_METHODS; i++) fprintf(stderr, "%s %d %s", i ? "," : "", i, kMethods[i].label);
            fprintf(stderr, ")\n");
            return 2;
        }
        use[m] = 1;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

/* flags -> settings; returns 0, 1 after --help, 2 after a usage error (printed), like fl_parse */
static int parse(routing_settings *o, int argc, char **argv) {
    const char *only;
    fl_flag fl[] = {
        {"setting", FL_STRING, &o->setting, "easy", "easy (rho* 0.1, sigma^2 0.1) or hard (rho* 0.4, sigma^2 0.5)", 0},
        {"seeds", FL_INT, &o->seeds, "50", "seeds per method", 0},
        GR_TRAIN_FLAGS(o->to),
        {"methods", FL_STRING, &only, "all", "comma-separated method indices 0-7 or names (Switch, GrMoE, ...), or all", 0},
        {"threads", FL_INT, &o->threads, "2", "runs in parallel", 0},
        {"seed-offset", FL_INT, &o->seed_offset, "0", "first seed (use a disjoint range, e.g. 1000, to choose settings)", 0},
        {"out", FL_STRING, &o->out_dir, "runs/bench-routing", "directory for the Markdown and JSON results", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "bench routing", "[flags]", pos, 0, &npos);
    if (rc) return rc;
    sm_error err;
    if (sm_synth_setting(&o->sc, o->setting, &err) != SM_OK) {
        cli_fail(SM_ERR_ARG, &err);
        return 2;
    }
    if (o->seeds < 1 || o->seed_offset < 0 || gr_train_opts_bad(&o->to, &o->sc) || o->threads < 1) {
        fprintf(stderr, "specmoe bench routing: --seeds, --steps, --hidden, --test-tokens, --threads must be >= 1, "
                        "--batch >= %d, --lr > 0\n", o->sc.N);
        return 2;
    }
    return parse_methods(only, o->use);
}

/* ---------------------------------------------------------------------------------------------- */
/* run */

static sm_status run(const routing_settings *o, routing_results *R, sm_error *err) {
    const int seeds = o->seeds;
    memset(R, 0, sizeof *R);
    /* the tasks, one per seed, shared by every method */
    sm_synth *tasks = calloc((size_t)seeds, sizeof(sm_synth));
    for (int s = 0; s < seeds; s++) {
        sm_rng r;
        sm_rng_seed(&r, 1000 + (uint64_t)(s + o->seed_offset));
        if (sm_synth_create(&tasks[s], &o->sc, &r, err) != SM_OK) {
            while (s-- > 0) sm_synth_free(&tasks[s]);
            free(tasks);
            return SM_ERR_ARG;
        }
    }
    int runs = N_METHODS * seeds;
    R->res = calloc((size_t)runs, sizeof(gr_metrics));
    R->ok = calloc((size_t)runs, sizeof(int));
    double t0 = sm_time_now();
    omp_set_num_threads(o->threads);
    /* one run per thread; the BLAS calls inside run single-threaded (OpenBLAS-OpenMP in a region) */
    int done = 0, todo = 0;
    for (int m = 0; m < N_METHODS; m++) todo += o->use[m] ? seeds : 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < runs; i++) {
        int m = i / seeds, s = i % seeds;
        if (!o->use[m]) continue;
        sm_error e2;
        gr_layer tr = {0};
        uint64_t sd = (uint64_t)(s + o->seed_offset);
        if (gr_layer_make(&tr, &kMethods[m], &o->sc, &o->to, sd, &e2) == SM_OK &&
            gr_layer_train(&tr, &tasks[s], &o->to, 1000003 + sd, &e2) == SM_OK) {
            gr_layer_eval(&tr, &tasks[s], &o->to, 2000003 + sd, &R->res[i]);
            R->ok[i] = 1;
        } else {
#pragma omp critical
            fprintf(stderr, "specmoe: bench routing: %s seed %d: %s\n", kMethods[m].label, s, e2.msg);
        }
        gr_progress("routing", &done, todo, kMethods[m].label, (int)sd, R->ok[i] ? &R->res[i] : NULL, t0);
        gr_layer_free(&tr);
    }
    R->seconds = sm_time_now() - t0;
    for (int s = 0; s < seeds; s++) R->mean_overlap += tasks[s].overlap / seeds;
    for (int s = 0; s < seeds; s++) sm_synth_free(&tasks[s]);
    free(tasks);
    return SM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* report */

/* The table on stdout and in OUT/routing_<setting>.md, every number in .json; the exit code. */
static int report(const routing_settings *o, const routing_results *R) {
    const int seeds = o->seeds;
    const sm_synth_config sc = o->sc;
    char md[16384];
    int n = snprintf(md, sizeof md,
                     "Synthetic routing (%s: N=%d, d=%d, k_r=%d, rho*=%.2f (achieved %.3f), sigma^2=%.2f), %d seeds, "
                     "%d steps x %d tokens, %.0f s on %d threads\n\n"
                     "| Method | Assign. acc. %% (95%% CI) | CV | Collapse | Entropy (per token) | Entropy (load) | Test MSE |\n"
                     "|---|---|---|---|---|---|---|\n",
                     o->setting, sc.N, sc.d, sc.kr, sc.rho, R->mean_overlap, sc.sigma2, seeds, o->to.steps, o->to.batch,
                     R->seconds, o->threads);
    char json[65536];
    int j = snprintf(json, sizeof json, "{\"setting\":\"%s\",\"seeds\":%d,\"steps\":%d,\"batch\":%d,\"seconds\":%.1f,"
                                        "\"achieved_overlap\":%.4f,\"methods\":[",
                     o->setting, seeds, o->to.steps, o->to.batch, R->seconds, R->mean_overlap);
    int first = 1;
    for (int m = 0; m < N_METHODS; m++) {
        if (!o->use[m]) continue;
        double *acc = malloc(sizeof(double) * seeds), *cv = malloc(sizeof(double) * seeds);
        double *ent = malloc(sizeof(double) * seeds), *lent = malloc(sizeof(double) * seeds), *mse = malloc(sizeof(double) * seeds);
        int cnt = 0, coll = 0;
        for (int s = 0; s < seeds; s++) {
            const gr_metrics *r = &R->res[m * seeds + s];
            if (!R->ok[m * seeds + s]) continue;
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
    mkdir(o->out_dir, 0755);
    snprintf(path, sizeof path, "%s/routing_%s.md", o->out_dir, o->setting);
    int w1 = cli_write_text(path, md);
    snprintf(path, sizeof path, "%s/routing_%s.json", o->out_dir, o->setting);
    int w2 = cli_write_text(path, json);
    if (w1 || w2) fprintf(stderr, "specmoe: %s: cannot write results\n", o->out_dir);
    else printf("\nwrote %s/routing_%s.md and .json\n", o->out_dir, o->setting);
    return (w1 || w2) ? CLI_EXIT_RUNTIME : 0;
}

/* ---------------------------------------------------------------------------------------------- */

int exp_grmoe_routing(int argc, char **argv) {
    routing_settings o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    routing_results R;
    sm_error err;
    if (run(&o, &R, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    rc = report(&o, &R);
    free(R.res);
    free(R.ok);
    return rc;
}
