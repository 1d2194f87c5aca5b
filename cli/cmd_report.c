/* specmoe report RUN_DIR...: aggregate RL results over games and seeds with confidence intervals
 * (the rliable protocol, include/specmoe/rl/rliable.h), as the SoftMoE-in-RL paper reports them.
 *
 * Each run directory of `specmoe rl train` gives one score: the mean episodic return of the episodes
 * that ended in the last 10% of its frames (the `last_return` of the run's summary), read back from
 * metrics.jsonl. Runs are grouped into variants by settings.json without the seed, the bookkeeping
 * options and the environment (cli_run_group_key); the environment is the game. Scores are
 * normalised per game, (score - random) / (reference - random):
 *   random     the mean return of a uniform random policy over --random-episodes episodes (seed 1),
 *              measured here with the same environments;
 *   reference  --reference GAME=SCORE,... (GAME as in `specmoe rl envs`, or its part after '/'); for
 *              a game not listed, the best run score of that game among the runs of --reference-runs
 *              FILE (a directory per line: e.g. every run of one agent in a study, so that all its
 *              figures share one scale), or else in this report (so the best run there scores 1: the
 *              table then compares the variants with each other, not with an outside standard - the
 *              report says which games were normalised that way). A reference equal to the random
 *              policy's score is refused (no scale); one below it (every run worse than random play,
 *              e.g. in a smoke test) would invert the game's order, so that game is scaled by
 *              |reference - random| instead (its scores are then below 0) and the report says so.
 * Variants are labelled by the settings that differ between them (top level, agent settings and the
 * network's, its MoE layer's included), or with --labels dir by their runs' parent directory
 * (`bench tokenize`'s layout: .../<variant>/<game>-s<seed>).
 * A variant needs the same number of runs R of every game (rliable's (R, G) matrix); with unequal
 * counts the first R of each game (in the order given) are used and the report says so.
 *
 * Output: a Markdown table of Median, IQM, Mean and optimality gap with stratified-bootstrap 95%
 * intervals per variant, the raw mean score per game, and with --out a PNG of the intervals (gnuplot).
 *
 * --curves PNG: the IQM over training, as the paper's figures draw it (normalised IQM against frames,
 * a band of --conf coverage per variant). Point b of a run is the mean return of the episodes ending
 * in frames (b E, (b+1) E], E = --curve-every (50,000 by default); an archived run of `bench
 * tokenize` (tools/softmoe_rl/runs_archive.sh) keeps exactly these points at E = 50,000 as its
 * curve_return records, which are read as they are (and refused at another E). Each point is normalised by the same random policy and reference as the
 * final score, and aggregated over games x runs with the same stratified bootstrap, so a curve's
 * last point differs from the table's IQM only by its window (the last E frames, not the last 10%).
 * A point where some run had no episode ending is left out of its variant's curve.
 *
 * --claims "A>B;C~D;E<F" tests claims about the variants (A, B: their labels as printed): for each,
 * the interval of IQM(A) - IQM(B) and of the probability of improvement P(A > B)
 * (sm_rliable_compare), and a verdict by sm_claim_verdict's rule with --margin (the smallest IQM
 * difference that matters, in normalised score; 0.1 by default: a tenth of the way from random
 * play to the reference). A claim whose variants have fewer than --min-runs runs per game (3 by
 * default) is not decidable whatever its interval: a bootstrap over one or two runs a game has no
 * spread to speak of (with one, every interval is a point).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/io/runlog.h"
#include "specmoe/nn/model.h"
#include "specmoe/rl/agent.h"
#include "specmoe/rl/rliable.h"

#define REPORT_MAX_RUNS 512
#define REPORT_MAX_GAMES 32
#define REPORT_MAX_POINTS 1000
/* the step of an archived run's curve_return records (tools/softmoe_rl/runs_archive.sh) */
#define REPORT_ARCHIVE_CURVE_STEP 50000

typedef struct {
    const char *dir;
    char env[64];
    double score;
    double *curve; /* (npoints) the learning curve at --curve-every frames (NAN: no episode ended there) */
    int npoints;
    int variant, game;
} run_score;

/* The run's curve at `every` frames: from its curve_return records (an archived run) when it has
 * them, else from its episodes s (x: the frame an episode ended, y: its return). An archived curve
 * is kept every REPORT_ARCHIVE_CURVE_STEP frames, so only that --curve-every reads it. */
static int run_curve_of(run_score *r, const char *path, const sm_series *s, long every, sm_error *err) {
    sm_series c = {0};
    if (sm_runlog_read(&c, path, "global_step", "curve_return", NULL, err) != SM_OK) {
        sm_series_free(&c);
        return -1;
    }
    if (c.n && every != REPORT_ARCHIVE_CURVE_STEP) {
        sm_series_free(&c);
        sm_fail(err, SM_ERR_FORMAT, "%s: an archived curve (curve_return records, kept every %d frames) cannot be read "
                                    "at --curve-every %ld; use --curve-every %d", path, REPORT_ARCHIVE_CURVE_STEP, every,
                REPORT_ARCHIVE_CURVE_STEP);
        return -1;
    }
    const sm_series *src = c.n ? &c : s;
    double xmax = 0;
    for (size_t i = 0; i < src->n; i++) xmax = src->x[i] > xmax ? src->x[i] : xmax;
    const double nb = xmax < 1 ? 1 : ceil(xmax / (double)every);
    if (nb > REPORT_MAX_POINTS) {
        sm_series_free(&c);
        sm_fail(err, SM_ERR_ARG, "%s: %.0f frames make more than %d points of --curve-every %ld", path, xmax,
                REPORT_MAX_POINTS, every);
        return -1;
    }
    r->npoints = (int)nb;
    r->curve = calloc((size_t)r->npoints, sizeof *r->curve);
    long *cnt = calloc((size_t)r->npoints, sizeof *cnt);
    int rc = r->curve && cnt ? 0 : -1;
    if (rc) sm_fail(err, SM_ERR_NOMEM, "report: out of memory");
    for (size_t i = 0; !rc && i < src->n; i++) {
        /* an episode ending at frame x is in (b E, (b+1) E]; a curve_return record stands at (b+1) E */
        const double x = src->x[i];
        const long b = x < 1 ? 0 : (long)((x - 1) / (double)every);
        if (c.n && fmod(x, (double)every) != 0) {
            sm_fail(err, SM_ERR_FORMAT, "%s: a curve_return record at frame %.0f, not a multiple of %ld", path, x, every);
            rc = -1;
        } else if (b < r->npoints) {
            r->curve[b] += src->y[i], cnt[b]++;
        }
    }
    for (int b = 0; !rc && b < r->npoints; b++) r->curve[b] = cnt[b] ? r->curve[b] / (double)cnt[b] : NAN;
    free(cnt);
    sm_series_free(&c);
    return rc;
}

/* The run's score: mean episodic_return of the episodes ending in the last 10% of its frames; with
 * every > 0 also its learning curve (run_curve_of). */
static int run_score_of(run_score *r, long every, sm_error *err) {
    cJSON *o = cli_run_settings(r->dir);
    const cJSON *env = o ? cJSON_GetObjectItemCaseSensitive(o, "env") : NULL;
    if (!cJSON_IsString(env)) {
        cJSON_Delete(o);
        sm_fail(err, SM_ERR_FORMAT, "%s: no settings.json with an \"env\" (not a run of specmoe rl train?)", r->dir);
        return -1;
    }
    snprintf(r->env, sizeof r->env, "%s", env->valuestring);
    cJSON_Delete(o);
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->dir);
    sm_series s = {0};
    if (sm_runlog_read(&s, path, "global_step", "episodic_return", NULL, err) != SM_OK) {
        sm_series_free(&s);
        return -1;
    }
    double xmax = 0, sum = 0;
    long n = 0;
    for (size_t i = 0; i < s.n; i++) xmax = s.x[i] > xmax ? s.x[i] : xmax;
    for (size_t i = 0; i < s.n; i++)
        if (s.x[i] >= 0.9 * xmax) sum += s.y[i], n++;
    const int rc = n && every > 0 ? run_curve_of(r, path, &s, every, err) : 0;
    sm_series_free(&s);
    if (!n) {
        sm_fail(err, SM_ERR_FORMAT, "%s: no finished episodes", path);
        return -1;
    }
    r->score = sum / n;
    return rc;
}

/* --reference GAME=SCORE,...: the score for env, or NAN */
static double reference_of(const char *list, const char *env) {
    const char *slash = strrchr(env, '/'), *game = slash ? slash + 1 : env;
    for (const char *p = list; p && *p;) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        if (eq && eq < end) {
            size_t k = (size_t)(eq - p);
            if ((k == strlen(env) && !strncmp(p, env, k)) || (k == strlen(game) && !strncmp(p, game, k))) return atof(eq + 1);
        }
        p = *end ? end + 1 : end;
    }
    return NAN;
}

/* checks --reference's syntax: GAME=NUMBER pairs separated by commas */
static int reference_ok(const char *list) {
    for (const char *p = list; p && *p;) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        if (!eq || eq > end || eq == p) return 0;
        char *stop;
        double v = strtod(eq + 1, &stop);
        if (stop != end || !isfinite(v)) return 0;
        p = *end ? end + 1 : end;
    }
    return 1;
}

/* Whether a run's network has an MoE layer: a network's settings hold the router's options ("moe")
 * whether or not its --arch uses them. Without an arch to read, it may. */
static int network_has_moe(const cJSON *net) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(net, "arch");
    if (!cJSON_IsString(a) || !a->valuestring[0]) return 1;
    sm_model_config c;
    sm_model_config_default(&c);
    sm_error e;
    if (sm_model_parse_arch(&c, a->valuestring, &e) != SM_OK) return 1;
    for (int i = 0; i < c.n_layers; i++)
        if (c.layers[i].kind == SM_LAYER_MOE || c.layers[i].kind == SM_LAYER_MOEHEAD) return 1;
    return 0;
}

/* level k of a run's settings: the top level, agent_settings, network, network.moe (NULL for a
 * network without an MoE layer: its router options are defaults it does not use) */
static const cJSON *settings_level(const cJSON *o, int level) {
    if (!o || level == 0) return o;
    if (level == 1) return cJSON_GetObjectItemCaseSensitive(o, "agent_settings");
    const cJSON *net = cJSON_GetObjectItemCaseSensitive(o, "network");
    if (level == 2) return net;
    return net && network_has_moe(net) ? cJSON_GetObjectItemCaseSensitive(net, "moe") : NULL;
}

/* whether the space-separated words of s include w */
static int has_word(const char *s, const char *w) {
    const size_t n = strlen(w);
    for (const char *p = s; (p = strstr(p, w)) != NULL; p++)
        if ((p == s || p[-1] == ' ') && (p[n] == ' ' || !p[n])) return 1;
    return 0;
}

/* The variants' labels: the settings that differ between them ("agent=dqn arch=..."), or the agent
 * when there is one variant. A level is compared among the variants that have it (network.moe is
 * absent without an MoE layer); a key=value already in the label (the arch, kept by the agent and
 * the network alike) is not repeated. */
static void variant_labels(char *const *keys, int nv, char labels[][96]) {
    cJSON *o[REPORT_MAX_RUNS];
    const cJSON *lv[REPORT_MAX_RUNS][4]; /* each variant's levels (settings_level), NULL where absent */
    for (int v = 0; v < nv; v++) {
        o[v] = keys[v] ? cJSON_Parse(keys[v]) : NULL;
        for (int level = 0; level < 4; level++) lv[v][level] = settings_level(o[v], level);
        labels[v][0] = 0;
    }
    for (int v = 0; v < nv; v++) {
        size_t at = 0;
        /* top-level, agent_settings, network and network.moe leaves */
        for (int level = 0; level < 4; level++) {
            const cJSON *obj = lv[v][level];
            for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next) {
                if (cJSON_IsObject(it)) continue;
                /* a key every variant has, with another value in one of them (the agent always, when
                 * it differs or there is one variant); keys of one agent only follow from the agent */
                int differs = !strcmp(it->string, "agent") && nv == 1, everywhere = 1, other_value = 0;
                for (int u = 0; u < nv && !differs; u++) {
                    if (!lv[u][level]) continue;
                    const cJSON *w = cJSON_GetObjectItemCaseSensitive(lv[u][level], it->string);
                    everywhere &= w != NULL;
                    other_value |= w && !cJSON_Compare(it, w, 1);
                }
                differs |= everywhere && other_value;
                if (!differs || at >= 90) continue;
                char *val = cJSON_PrintUnformatted(it);
                if (val) {
                    char *q = val, kv[96];
                    if (*q == '"') q++, q[strlen(q) - (q[strlen(q) - 1] == '"')] = 0;
                    snprintf(kv, sizeof kv, "%s=%s", it->string, q);
                    if (!has_word(labels[v], kv))
                        at += (size_t)snprintf(labels[v] + at, 96 - at, "%s%s", at ? " " : "", kv);
                    free(val);
                }
            }
        }
        if (!labels[v][0]) snprintf(labels[v], 96, "variant %d", v + 1);
        for (char *p = labels[v]; *p; p++)
            if (*p == '"' || *p == '\\' || *p == '\'') *p = '_';
    }
    for (int v = 0; v < nv; v++) cJSON_Delete(o[v]);
}

/* --labels dir: each variant by the parent directory of its first run (.../<variant>/<game>-s<seed>) */
static void dir_labels(const run_score *runs, int n, int nv, char labels[][96]) {
    for (int v = 0; v < nv; v++) {
        snprintf(labels[v], 96, "variant %d", v + 1);
        for (int r = 0; r < n; r++) {
            if (runs[r].variant != v) continue;
            char d[4096];
            snprintf(d, sizeof d, "%s", runs[r].dir);
            size_t k = strlen(d);
            while (k > 1 && d[k - 1] == '/') d[--k] = 0;
            char *slash = strrchr(d, '/');
            if (slash) {
                *slash = 0;
                const char *base = strrchr(d, '/') ? strrchr(d, '/') + 1 : d;
                if (*base) snprintf(labels[v], 96, "%.95s", base);
            }
            break;
        }
        for (char *p = labels[v]; *p; p++)
            if (*p == '"' || *p == '\\' || *p == '\'') *p = '_';
    }
}

/* --reference-runs FILE: per game of the report, the best score among the runs listed (NAN: none) */
static int reference_pool(const char *file, char games[][64], int ng, double *best, sm_error *err) {
    FILE *f = fopen(file, "r");
    if (!f) {
        sm_fail(err, SM_ERR_IO, "--reference-runs %s: %s", file, strerror(errno));
        return -1;
    }
    char line[4200];
    int rc = 0;
    for (long n = 1; !rc && fgets(line, sizeof line, f); n++) {
        size_t k = strlen(line);
        while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ')) line[--k] = 0;
        if (!k) continue;
        run_score r = {.dir = line};
        if (run_score_of(&r, 0, err)) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            sm_fail(err, SM_ERR_FORMAT, "--reference-runs %s:%ld: %s", file, n, why);
            rc = -1;
            break;
        }
        for (int g = 0; g < ng; g++)
            if (!strcmp(games[g], r.env) && (isnan(best[g]) || r.score > best[g])) best[g] = r.score;
    }
    fclose(f);
    return rc;
}

#define REPORT_MAX_CLAIMS 32

/* The interval plot: one panel per aggregate, a row per variant. */
static int draw(const char *out, const sm_interval (*ci)[SM_AGG_N], char labels[][96], int nv) {
    char dir[] = "/tmp/specmoe-report-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "specmoe report: cannot make a scratch directory: %s\n", strerror(errno));
        return CLI_EXIT_RUNTIME;
    }
    char data[4200], sp[4200];
    snprintf(data, sizeof data, "%s/ci.dat", dir);
    snprintf(sp, sizeof sp, "%s/report.gp", dir);
    FILE *f = fopen(data, "w");
    int code = f ? 0 : CLI_EXIT_RUNTIME;
    for (int k = 0; f && k < SM_AGG_N; k++) {
        for (int v = 0; v < nv; v++) fprintf(f, "%d %.9g %.9g %.9g\n", v, ci[v][k].point, ci[v][k].lo, ci[v][k].hi);
        fprintf(f, "\n\n"); /* one gnuplot index per aggregate */
    }
    if (f && fclose(f) != 0) code = CLI_EXIT_RUNTIME;
    cli_buf s = {0};
    /* the labels (at most 48 characters) left of the first panel, the four panels side by side; the
     * labels' margin is sized to the longest (about 7 pixels a character at 10 points on 1400) */
    size_t longest = 1;
    for (int v = 0; v < nv; v++) {
        const size_t n = strlen(labels[v]);
        if (n > longest) longest = n < 48 ? n : 48;
    }
    const double left = 0.03 + 0.0055 * (double)longest, w = (1 - left) / SM_AGG_N; /* at most 0.294 */
    cli_bprintf(&s, "set terminal pngcairo size 1400,%d enhanced font ',10'\nset output '%s'\n", 160 + 36 * nv, out);
    cli_bprintf(&s, "set multiplot\nset grid xtics\nset offsets 0,0,0.5,0.5\nunset key\nset xtics nomirror font ',8'\nset format x '%%.3g'\n");
    cli_bprintf(&s, "set yrange [-0.5:%d.5]\nset ytics (", nv - 1);
    for (int v = 0; v < nv; v++) cli_bprintf(&s, "%s\"%.48s\" %d", v ? ", " : "", labels[v], v);
    cli_bprintf(&s, ") noenhanced\nset bmargin 4\n");
    for (int k = 0; k < SM_AGG_N; k++) {
        if (k == 1) cli_bprintf(&s, "unset ytics\n");
        cli_bprintf(&s, "set lmargin at screen %.4f\nset rmargin at screen %.4f\n", left + k * w + (k ? 0.01 : 0),
                    left + (k + 1) * w - 0.01);
        cli_bprintf(&s, "set title \"%s\"\nplot '%s' index %d using 2:1:3:4 with xerrorbars pt 7 lw 2\n",
                    sm_aggregate_name((sm_aggregate_kind)k), data, k);
    }
    cli_bprintf(&s, "unset multiplot\n");
    if (!code) code = cli_gnuplot("report", sp, s.failed ? NULL : s.s, out);
    free(s.s);
    remove(data);
    remove(sp);
    rmdir(dir);
    return code;
}

/* (raw - random) / (reference - random); a reference below random play scales by |reference - random|,
 * not inverting the game's order */
static double normalised(double raw, double random, double reference) {
    return sm_rliable_normalise(raw, random, reference < random ? 2 * random - reference : reference);
}

/* --curves: per variant and point b, the IQM of its runs' normalised curve points over games x runs
 * (the same runs as the table: the first R of each game), with its interval; printed as a table, one
 * row per point, and drawn into out as lines with their bands. */
static int report_curves(const char *out, const run_score *runs, int npos, int nv, int ng, const double *rnd,
                         const double *ref, const int *Rv, char labels[][96], long every, int reps, double conf,
                         uint64_t seed) {
    int bmax = 0, code = 0;
    sm_interval *iqm = calloc((size_t)nv * REPORT_MAX_POINTS, sizeof *iqm); /* (nv, REPORT_MAX_POINTS) */
    int *nb = calloc((size_t)nv, sizeof *nb);
    double *m = malloc(sizeof(double) * (size_t)npos * ng);
    const run_score **sel = malloc(sizeof *sel * (size_t)npos); /* the variant's runs, (R, G) */
    sm_error err = {0};
    if (!iqm || !nb || !m || !sel) code = cli_fail(sm_fail(&err, SM_ERR_NOMEM, "report: out of memory"), &err);
    for (int v = 0; v < nv && !code; v++) {
        const int R = Rv[v];
        if (R == 0) continue;
        int taken[REPORT_MAX_GAMES] = {0};
        nb[v] = REPORT_MAX_POINTS;
        for (int r = 0; r < npos; r++) {
            const run_score *x = &runs[r];
            if (x->variant != v || taken[x->game] >= R) continue;
            sel[(size_t)taken[x->game]++ * ng + x->game] = x;
            nb[v] = x->npoints < nb[v] ? x->npoints : nb[v];
        }
        bmax = nb[v] > bmax ? nb[v] : bmax;
        for (int b = 0; b < nb[v] && !code; b++) {
            int ok = 1;
            for (int i = 0; i < R * ng; i++) {
                const run_score *x = sel[i];
                m[i] = normalised(x->curve[b], rnd[x->game], ref[x->game]);
                ok &= isfinite(m[i]) != 0;
            }
            sm_interval agg[SM_AGG_N];
            if (!ok) {
                iqm[(size_t)v * REPORT_MAX_POINTS + b] = (sm_interval){NAN, NAN, NAN};
                continue;
            }
            sm_status st = sm_rliable(m, R, ng, reps, conf, seed, agg, &err);
            if (st != SM_OK) code = cli_fail(st, &err);
            else iqm[(size_t)v * REPORT_MAX_POINTS + b] = agg[SM_AGG_IQM];
        }
    }
    if (!code) {
        printf("\nIQM over training (--curves): point b = the episodes ending in frames (b E, (b+1) E], E = %ld, "
               "normalised as above; %.0f%% intervals; - where a run had no episode end there, or the variant has no "
               "runs of every game or none that long. The last point is labelled (b+1) E even when the runs end before.\n\n| frames |",
               every, 100 * conf);
        for (int v = 0; v < nv; v++) printf(" %s |", labels[v]);
        printf("\n|---|");
        for (int v = 0; v < nv; v++) printf("---|");
        printf("\n");
        for (int b = 0; b < bmax; b++) {
            printf("| %ld |", (long)(b + 1) * every);
            for (int v = 0; v < nv; v++) {
                const sm_interval q = iqm[(size_t)v * REPORT_MAX_POINTS + b];
                if (b < nb[v] && isfinite(q.point)) printf(" %.3f [%.3f, %.3f] |", q.point, q.lo, q.hi);
                else printf(" - |");
            }
            printf("\n");
        }
    }
    /* the picture: a data file per variant (a blank line between the runs of finite points: gnuplot
     * breaks the line there), a band and a line with points for each variant with a finite point */
    char dir[] = "/tmp/specmoe-curves-XXXXXX";
    int made = 0;
    if (!code && !(made = mkdtemp(dir) != NULL)) {
        fprintf(stderr, "specmoe report: cannot make a scratch directory: %s\n", strerror(errno));
        code = CLI_EXIT_RUNTIME;
    }
    static const char *const colour[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    cli_buf g = {0};
    if (!code) {
        cli_bprintf(&g, "set terminal pngcairo size 900,600 enhanced font ',10'\nset output '%s'\n", out);
        cli_bprintf(&g, "set xlabel 'frames (millions)'\nset ylabel 'IQM normalised score (%.0f%% interval)'\nset grid\n"
                        "set key top left noenhanced\nset style fill transparent solid 0.2 noborder\nplot ", 100 * conf);
    }
    int drawn = 0;
    for (int v = 0; !code && v < nv; v++) {
        char data[4200];
        snprintf(data, sizeof data, "%s/v%d.dat", dir, v);
        FILE *f = fopen(data, "w");
        if (!f) {
            code = CLI_EXIT_RUNTIME;
            break;
        }
        int points = 0, gap = 0;
        for (int b = 0; b < nb[v]; b++) {
            const sm_interval q = iqm[(size_t)v * REPORT_MAX_POINTS + b];
            if (!isfinite(q.point)) {
                gap = points > 0;
                continue;
            }
            if (gap) fprintf(f, "\n"); /* one blank line: a break in the line, not a new data set */
            gap = 0;
            fprintf(f, "%.9g %.9g %.9g %.9g\n", (double)(b + 1) * (double)every / 1e6, q.point, q.lo, q.hi);
            points++;
        }
        if (fclose(f) != 0) code = CLI_EXIT_RUNTIME;
        if (!points) continue;
        const char *c = colour[v % 10];
        cli_bprintf(&g, "%s'%s' using 1:3:4 with filledcurves lc rgb '%s' notitle, '' using 1:2 with linespoints "
                        "lc rgb '%s' lw 2 pt 7 ps 0.6 title \"%s\"", drawn ? ", " : "", data, c, c, labels[v]);
        drawn++;
    }
    if (!code && !drawn) printf("report: no point of any variant to draw; %s not written\n", out);
    if (!code && drawn) {
        char sp[4200];
        snprintf(sp, sizeof sp, "%s/curves.gp", dir);
        cli_bprintf(&g, "\n");
        code = cli_gnuplot("report", sp, g.failed ? NULL : g.s, out);
        remove(sp);
        if (!code) printf("report: IQM over training -> %s\n", out);
    }
    free(g.s);
    for (int v = 0; made && v < nv; v++) {
        char data[4200];
        snprintf(data, sizeof data, "%s/v%d.dat", dir, v);
        remove(data);
    }
    if (made) rmdir(dir);
    free(iqm), free(nb), free(m), free(sel);
    return code;
}

/* Mean normalised score of variant matrix m (R, G) on game g */
static double game_mean(const double *m, int R, int G, int g) {
    double sum = 0;
    for (int r = 0; r < R; r++) sum += m[(size_t)r * G + g];
    return sum / R;
}

/* The claims' table: per claim, IQM(A) - IQM(B) and P(A > B) with their intervals, and the verdict. */
static int print_claims(const sm_claim *claims, int nclaims, int (*cv)[2], double *const *mats, const int *Rv,
                        char (*games)[64], int ng, double margin, int min_runs, int reps, double conf, uint64_t seed) {
    printf("\nClaims, on the normalised scores: IQM(A) - IQM(B) and the probability of improvement P(A > B), %.0f%% "
           "stratified-bootstrap intervals (each variant's runs resampled within games). Margin %g. A > B: reproduced "
           "when the difference's interval lies above 0, not reproduced when it lies below the margin, else not decidable "
           "(A !> B, A offers no gain: the same with the outcomes swapped). "
           "A ~ B: reproduced when it lies within +-margin, not reproduced when it lies beyond it, else not decidable. "
           "Fewer than %d runs per game: not decidable. A reproduced A ~ B or A !> B names the games where both "
           "variants' mean normalised scores are below the margin: there both are at random play, and alike only in "
           "failing.\n\n| claim | runs x games | IQM(A) - IQM(B) | P(A > B) | verdict |\n"
           "|---|---|---|---|---|\n",
           100 * conf, margin, min_runs);
    for (int c = 0; c < nclaims; c++) {
        const int a = cv[c][0], b = cv[c][1];
        const char *op = sm_claim_op(claims[c].kind);
        if (!mats[a] || !mats[b]) {
            printf("| %s %s %s | - | - | - | not decidable (a variant lacks a game) |\n", claims[c].a, op, claims[c].b);
            continue;
        }
        sm_comparison cmp;
        sm_error err = {0};
        sm_status st = sm_rliable_compare(mats[a], Rv[a], mats[b], Rv[b], ng, SM_AGG_IQM, reps, conf, seed, &cmp, &err);
        if (st != SM_OK) return cli_fail(st, &err);
        const int few = Rv[a] < min_runs || Rv[b] < min_runs;
        char runs[48];
        if (Rv[a] == Rv[b]) snprintf(runs, sizeof runs, "%d x %d", Rv[a], ng);
        else snprintf(runs, sizeof runs, "%d and %d x %d", Rv[a], Rv[b], ng);
        printf("| %s %s %s | %s | %.3f [%.3f, %.3f] | %.3f [%.3f, %.3f] | ", claims[c].a, op, claims[c].b, runs, cmp.diff.point,
               cmp.diff.lo, cmp.diff.hi, cmp.poi.point, cmp.poi.lo, cmp.poi.hi);
        if (few) {
            const int r = Rv[a] < Rv[b] ? Rv[a] : Rv[b];
            printf("not decidable (%d run%s per game; %d needed) |\n", r, r == 1 ? "" : "s", min_runs);
        } else {
            const sm_verdict v = sm_claim_verdict(claims[c].kind, cmp.diff, margin);
            printf("%s", sm_verdict_name(v));
            /* equal, or no gain, where neither learns: say so beside the verdict */
            const int alike = v == SM_VERDICT_REPRODUCED && claims[c].kind != SM_CLAIM_GREATER;
            int nrandom = 0;
            for (int g = 0; alike && g < ng; g++)
                if (game_mean(mats[a], Rv[a], ng, g) < margin && game_mean(mats[b], Rv[b], ng, g) < margin)
                    printf("%s%s", nrandom++ ? ", " : " (both at random play, within the margin, on ", games[g]);
            printf("%s |\n", nrandom ? nrandom == ng ? ": every game, so the claim is untested)" : ")" : "");
        }
    }
    return 0;
}

int cmd_report(int argc, char **argv) {
    struct {
        const char *reference, *reference_runs, *labels, *out, *claims, *curves;
        int reps, random_episodes, min_runs;
        long curve_every;
        double conf, margin;
        uint64_t seed;
    } o;
    fl_flag fl[] = {
        {"reference", FL_STRING, &o.reference, NULL,
         "reference scores GAME=SCORE,... (score 1); a game not listed: its best run in --reference-runs, or in this report", 0},
        {"reference-runs", FL_STRING, &o.reference_runs, NULL,
         "a file of run directories, one per line, whose best score per game is the reference of a game not in --reference", 0},
        {"labels", FL_STRING, &o.labels, "settings", "settings (what differs between the variants) | dir (their runs' parent directory)", 0},
        {"random-episodes", FL_INT, &o.random_episodes, "1000", "episodes of the uniform random policy (score 0) per game", 0},
        {"reps", FL_INT, &o.reps, "2000", "stratified-bootstrap replicates", 0},
        {"conf", FL_DOUBLE, &o.conf, "0.95", "coverage of the intervals", 0},
        {"seed", FL_U64, &o.seed, "1", "seed of the bootstrap", 0},
        {"out", FL_STRING, &o.out, NULL, "also draw the intervals into this PNG (gnuplot)", 0},
        {"claims", FL_STRING, &o.claims, NULL,
         "claims to test, \"A>B;C~D;E!>F\" (variant labels; > better, ~ comparable, !> no gain): the IQM difference, "
         "P(A > B) and a verdict", 0},
        {"margin", FL_DOUBLE, &o.margin, "0.1", "the smallest IQM difference a claim counts (normalised score)", 0},
        {"min-runs", FL_INT, &o.min_runs, "3", "runs per game a claim's variants need for a verdict", 0},
        {"curves", FL_STRING, &o.curves, NULL,
         "also the IQM over training: a table, and its lines with their intervals drawn into this PNG (gnuplot)", 0},
        {"curve-every", FL_LONG, &o.curve_every, "50000",
         "frames per point of --curves (an archived run of bench tokenize keeps its curve every 50000)", 0},
    };
    const char *pos[REPORT_MAX_RUNS];
    int npos;
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 2, "report", "RUN_DIR... [flags]", pos,
                      REPORT_MAX_RUNS, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos < 1) {
        fprintf(stderr, "specmoe report: give the run directories of specmoe rl train (one per game and seed)\n");
        return CLI_EXIT_USAGE;
    }
    if (o.reps < 1 || o.reps > 10000000 || o.random_episodes < 1 || o.random_episodes > 1000000 || !(o.conf > 0 && o.conf < 1)) {
        fprintf(stderr, "specmoe report: --reps must be in [1, 1e7], --random-episodes in [1, 1e6], --conf in (0, 1)\n");
        return CLI_EXIT_USAGE;
    }
    if (o.reference && !reference_ok(o.reference)) {
        fprintf(stderr, "specmoe report: --reference: '%s' is not GAME=SCORE,GAME=SCORE,...\n", o.reference);
        return CLI_EXIT_USAGE;
    }
    static sm_claim claims[REPORT_MAX_CLAIMS];
    const int nclaims = o.claims ? sm_claims_parse(o.claims, claims, REPORT_MAX_CLAIMS) : 0;
    if (nclaims < 0) {
        fprintf(stderr, "specmoe report: --claims: '%s' is not \"A>B;C~D;...\" (at most %d claims, each two variant labels "
                        "around one of > < ~ !> !<)\n", o.claims, REPORT_MAX_CLAIMS);
        return CLI_EXIT_USAGE;
    }
    if (!(o.margin > 0 && o.margin < 1e6) || o.min_runs < 1) {
        fprintf(stderr, "specmoe report: --margin must be > 0 and --min-runs >= 1\n");
        return CLI_EXIT_USAGE;
    }
    if (strcmp(o.labels, "settings") && strcmp(o.labels, "dir")) {
        fprintf(stderr, "specmoe report: --labels must be settings or dir (got '%s')\n", o.labels);
        return CLI_EXIT_USAGE;
    }
    if ((o.out && strpbrk(o.out, "'\"\\\n")) || (o.curves && strpbrk(o.curves, "'\"\\\n"))) {
        fprintf(stderr, "specmoe report: --out and --curves may not contain quotes, backslashes or newlines\n");
        return CLI_EXIT_USAGE;
    }
    if (o.curve_every < 1 || o.curve_every > 1000000000L) {
        fprintf(stderr, "specmoe report: --curve-every must be in [1, 1e9] frames\n");
        return CLI_EXIT_USAGE;
    }
    if ((o.out || o.curves) && system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "specmoe report: gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)\n");
        return CLI_EXIT_RUNTIME;
    }
    static run_score runs[REPORT_MAX_RUNS];
    static char *keys[REPORT_MAX_RUNS];
    static char labels[REPORT_MAX_RUNS][96];
    char games[REPORT_MAX_GAMES][64];
    int nv = 0, ng = 0, code = 0;
    sm_error err = {0};
    for (int r = 0; r < npos && !code; r++) {
        runs[r] = (run_score){.dir = pos[r]};
        if (run_score_of(&runs[r], o.curves ? o.curve_every : 0, &err)) {
            code = cli_fail(SM_ERR_FORMAT, &err);
            break;
        }
        char *key = cli_run_group_key(pos[r], 1);
        runs[r].variant = -1;
        for (int v = 0; v < nv && runs[r].variant < 0; v++)
            if (key && keys[v] && !strcmp(key, keys[v])) runs[r].variant = v;
        if (runs[r].variant < 0) {
            keys[nv] = key;
            runs[r].variant = nv++;
        } else {
            free(key);
        }
        runs[r].game = -1;
        for (int g = 0; g < ng && runs[r].game < 0; g++)
            if (!strcmp(games[g], runs[r].env)) runs[r].game = g;
        if (runs[r].game < 0) {
            if (ng == REPORT_MAX_GAMES) {
                fprintf(stderr, "specmoe report: more than %d games\n", REPORT_MAX_GAMES);
                code = CLI_EXIT_USAGE;
                break;
            }
            snprintf(games[ng], sizeof games[ng], "%s", runs[r].env);
            runs[r].game = ng++;
        }
    }
    /* per game: the best score among --reference-runs (NAN: none there) */
    double pool[REPORT_MAX_GAMES];
    for (int g = 0; g < REPORT_MAX_GAMES; g++) pool[g] = NAN;
    if (!code && o.reference_runs && reference_pool(o.reference_runs, games, ng, pool, &err)) code = cli_fail(SM_ERR_FORMAT, &err);
    /* per game: the random policy's mean return and the reference */
    double rnd[REPORT_MAX_GAMES], ref[REPORT_MAX_GAMES];
    int ref_best[REPORT_MAX_GAMES];
    for (int g = 0; g < ng && !code; g++) {
        sm_env_log log;
        sm_status st = sm_rl_evaluate(NULL, games[g], NULL, o.random_episodes, 16, 1, 1, &log, &err);
        if (st != SM_OK) {
            code = cli_fail(st, &err);
            break;
        }
        rnd[g] = log.episode_return / (double)log.n;
        ref[g] = reference_of(o.reference, games[g]);
        ref_best[g] = isnan(ref[g]) ? (isnan(pool[g]) ? 1 : 2) : 0;
        if (ref_best[g] == 2) ref[g] = pool[g];
        for (int r = 0; ref_best[g] == 1 && r < npos; r++)
            if (runs[r].game == g && (isnan(ref[g]) || runs[r].score > ref[g])) ref[g] = runs[r].score;
        if (ref[g] == rnd[g] || !isfinite(ref[g])) {
            fprintf(stderr, "specmoe report: %s: the reference score %g equals the random policy's; no scale to normalise by\n",
                    games[g], ref[g]);
            code = CLI_EXIT_USAGE;
        }
    }
    sm_interval(*ci)[SM_AGG_N] = code ? NULL : calloc((size_t)nv, sizeof *ci);
    static double *mats[REPORT_MAX_RUNS]; /* per variant: its (R, G) normalised scores, R = Rv[v] */
    static int Rv[REPORT_MAX_RUNS];
    int cv[REPORT_MAX_CLAIMS][2]; /* each claim's two variants */
    if (!code && !ci) code = cli_fail(sm_fail(&err, SM_ERR_NOMEM, "report: out of memory"), &err);
    if (!code) {
        if (!strcmp(o.labels, "dir")) dir_labels(runs, npos, nv, labels);
        else variant_labels(keys, nv, labels);
        for (int c = 0; c < nclaims && !code; c++)
            for (int side = 0; side < 2 && !code; side++) {
                const char *name = side ? claims[c].b : claims[c].a;
                cv[c][side] = -1;
                for (int v = 0; v < nv; v++)
                    if (!strcmp(labels[v], name)) cv[c][side] = v;
                if (cv[c][side] < 0) {
                    fprintf(stderr, "specmoe report: --claims: no variant is labelled '%s'; the labels:", name);
                    for (int v = 0; v < nv; v++) fprintf(stderr, "%s '%s'", v ? "," : "", labels[v]);
                    fprintf(stderr, "\n");
                    code = CLI_EXIT_USAGE;
                }
            }
    }
    if (!code) {
        printf("report: %d run%s, %d variant%s x %d game%s; score = mean episodic return over the last 10%% of frames, "
               "normalised (score - random) / (reference - random)\n",
               npos, npos == 1 ? "" : "s", nv, nv == 1 ? "" : "s", ng, ng == 1 ? "" : "s");
        for (int g = 0; g < ng; g++)
            printf("  %s: random %.4f (%d episodes), reference %.4f%s%s\n", games[g], rnd[g], o.random_episodes, ref[g],
                   ref_best[g] == 1 ? " (the best run in this report)" : ref_best[g] == 2 ? " (the best run of --reference-runs)" : "",
                   ref[g] < rnd[g] ? "; below random play, so scaled by |reference - random| to keep the order (scores < 0)" : "");
        printf("\n| variant | runs x games | Median | IQM | Mean | Optimality gap |\n|---|---|---|---|---|---|\n");
    }
    for (int v = 0; v < nv && !code; v++) {
        int cnt[REPORT_MAX_GAMES] = {0}, R = 1 << 30;
        for (int r = 0; r < npos; r++)
            if (runs[r].variant == v) cnt[runs[r].game]++;
        for (int g = 0; g < ng; g++) R = cnt[g] < R ? cnt[g] : R;
        if (R == 0) {
            printf("| %s | - | a game without runs: no aggregate (each variant needs runs of every game) | | | |\n", labels[v]);
            for (int k = 0; k < SM_AGG_N; k++) ci[v][k] = (sm_interval){NAN, NAN, NAN};
            mats[v] = NULL, Rv[v] = 0;
            continue;
        }
        double *s = malloc(sizeof(double) * (size_t)R * ng);
        int taken[REPORT_MAX_GAMES] = {0}, unequal = 0;
        for (int g = 0; g < ng; g++) unequal |= cnt[g] != R;
        for (int r = 0; s && r < npos; r++) {
            const run_score *x = &runs[r];
            if (x->variant != v || taken[x->game] >= R) continue;
            s[(size_t)taken[x->game]++ * ng + x->game] = normalised(x->score, rnd[x->game], ref[x->game]);
        }
        sm_status st = s ? sm_rliable(s, R, ng, o.reps, o.conf, o.seed, ci[v], &err) : sm_fail(&err, SM_ERR_NOMEM, "report: out of memory");
        mats[v] = s, Rv[v] = R;
        if (st != SM_OK) {
            code = cli_fail(st, &err);
            break;
        }
        printf("| %s | %d x %d%s |", labels[v], R, ng, unequal ? " (first runs of each game: unequal counts)" : "");
        for (int k = 0; k < SM_AGG_N; k++) printf(" %.3f [%.3f, %.3f] |", ci[v][k].point, ci[v][k].lo, ci[v][k].hi);
        printf("\n");
    }
    if (!code) { /* raw scores per game */
        printf("\nMean raw score per game (runs):\n\n| variant |");
        for (int g = 0; g < ng; g++) printf(" %s |", games[g]);
        printf("\n|---|");
        for (int g = 0; g < ng; g++) printf("---|");
        printf("\n");
        for (int v = 0; v < nv; v++) {
            printf("| %s |", labels[v]);
            for (int g = 0; g < ng; g++) {
                double sum = 0;
                int n = 0;
                for (int r = 0; r < npos; r++)
                    if (runs[r].variant == v && runs[r].game == g) sum += runs[r].score, n++;
                if (n) printf(" %.3f (%d) |", sum / n, n);
                else printf(" - |");
            }
            printf("\n");
        }
        printf("\nIntervals: %.0f%% stratified-bootstrap percentile intervals, %d replicates (Agarwal et al. 2021).\n",
               100 * o.conf, o.reps);
    }
    if (!code && nclaims) code = print_claims(claims, nclaims, cv, mats, Rv, games, ng, o.margin, o.min_runs, o.reps, o.conf, o.seed);
    if (!code && o.out) {
        code = draw(o.out, (const sm_interval(*)[SM_AGG_N])ci, labels, nv);
        if (!code) printf("report: intervals -> %s\n", o.out);
    }
    if (!code && o.curves)
        code = report_curves(o.curves, runs, npos, nv, ng, rnd, ref, Rv, labels, o.curve_every, o.reps, o.conf, o.seed);
    for (int r = 0; r < npos; r++) free(runs[r].curve), runs[r].curve = NULL;
    free(ci);
    for (int v = 0; v < nv; v++) free(keys[v]), free(mats[v]), mats[v] = NULL;
    return code;
}
