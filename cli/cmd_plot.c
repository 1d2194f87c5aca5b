/* specmoe plot RUN_DIR... --out curve.png: learning curves of RL and supervised runs with gnuplot.
 *
 * Each run directory's metrics.jsonl is read as (x, y) points (src/io/runlog.c). Runs whose
 * settings.json agree except for the seed (and the thread count, the output directory, resume) are
 * one group: the group's curve is the mean over its runs and a band from the lowest to the highest
 * run, on a common grid of --bins points along x (each run's value in a bin is the mean of its points
 * there, carried forward through empty bins). Defaults: episodic_return against global_step for RL
 * runs, the training loss against the step for supervised ones. Curves are named by the group's
 * first run (cli_run_label), or with --labels dir by that run's parent directory (`bench
 * tokenize`'s layout .../<variant>/<game>-s<seed>, where the variant names the curve). A line per
 * curve is printed (plot-curve label=... runs=N).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/io/runlog.h"

#define PLOT_MAX_RUNS 256

/* Per bin the mean of the run's points in it, carried forward through empty bins (NaN before the
 * first point). */
static void bin_series(const sm_series *s, double xmax, int B, double *out) {
    double *sum = calloc((size_t)B, sizeof *sum), *cnt = calloc((size_t)B, sizeof *cnt);
    for (size_t i = 0; sum && cnt && i < s->n; i++) {
        int b = xmax > 0 ? (int)(s->x[i] / xmax * B) : 0;
        b = b < 0 ? 0 : b >= B ? B - 1 : b;
        sum[b] += s->y[i];
        cnt[b]++;
    }
    double last = NAN, xlast = -INFINITY;
    for (size_t i = 0; i < s->n; i++) xlast = s->x[i] > xlast ? s->x[i] : xlast;
    for (int b = 0; b < B; b++) {
        if (sum && cnt && cnt[b] > 0) last = sum[b] / cnt[b];
        /* not past the run's last point: a shorter run ends where it ended */
        out[b] = xmax > 0 && b * xmax / B > xlast ? NAN : last;
    }
    free(sum);
    free(cnt);
}

int cmd_plot(int argc, char **argv) {
    struct {
        const char *out, *x, *y, *kind, *title, *labels;
        int bins;
    } o;
    fl_flag fl[] = {
        {"out", FL_STRING, &o.out, "curve.png", "the PNG to write", 0},
        {"y", FL_STRING, &o.y, NULL, "metric on the y axis (default: episodic_return for RL runs, loss for supervised)", 0},
        {"x", FL_STRING, &o.x, NULL, "metric on the x axis (default: global_step for RL runs, step for supervised)", 0},
        {"kind", FL_STRING, &o.kind, NULL, "supervised records of this kind only: train, val, test (default train)", 0},
        {"bins", FL_INT, &o.bins, "100", "points along x of each curve", 0},
        {"title", FL_STRING, &o.title, "", "plot title", 0},
        {"labels", FL_STRING, &o.labels, NULL, "dir: name each curve by its first run's parent directory (bench tokenize: the variant)", 0},
    };
    const char *pos[PLOT_MAX_RUNS];
    int npos;
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 2, "plot", "RUN_DIR... [--out curve.png]", pos,
                      PLOT_MAX_RUNS, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos < 1) {
        fprintf(stderr, "specmoe plot: give one or more run directories (each with a metrics.jsonl)\n");
        return CLI_EXIT_USAGE;
    }
    if (o.bins < 2 || o.bins > 100000) {
        fprintf(stderr, "specmoe plot: --bins must be in [2, 100000] (got %d)\n", o.bins);
        return CLI_EXIT_USAGE;
    }
    if (o.labels && strcmp(o.labels, "dir")) {
        fprintf(stderr, "specmoe plot: --labels must be dir (got '%s')\n", o.labels);
        return CLI_EXIT_USAGE;
    }
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "specmoe plot: gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)\n");
        return CLI_EXIT_RUNTIME;
    }
    static sm_series runs[PLOT_MAX_RUNS];
    static char *keys[PLOT_MAX_RUNS];
    int code = 0;
    const char *xk = o.x, *yk = o.y, *kind = o.kind;
    double xmax = 0;
    char xlab[64] = "", ylab[64] = "";
    for (int r = 0; r < npos && !code; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/metrics.jsonl", pos[r]);
        sm_error err = {0};
        memset(&runs[r], 0, sizeof runs[r]);
        /* RL first: episodic_return against global_step; else supervised loss against step */
        int rl = !yk || !strcmp(yk, "episodic_return");
        const char *xa = xk ? xk : rl ? "global_step" : "step", *ya = yk ? yk : "episodic_return";
        sm_status st = sm_runlog_read(&runs[r], path, xa, ya, kind, &err);
        if (st == SM_OK && runs[r].n == 0 && !yk && !xk) {
            xa = "step";
            ya = "loss";
            st = sm_runlog_read(&runs[r], path, xa, ya, kind ? kind : "train", &err);
        }
        if (r == 0) {
            snprintf(xlab, sizeof xlab, "%s", xa);
            snprintf(ylab, sizeof ylab, "%s", ya);
        }
        if (st != SM_OK) code = cli_fail(st, &err);
        else if (runs[r].n == 0) {
            fprintf(stderr, "specmoe: %s: no records with the metrics asked for (--x %s --y %s%s%s)\n", path,
                    xk ? xk : "global_step/step", yk ? yk : "episodic_return/loss", kind ? " --kind " : "", kind ? kind : "");
            code = CLI_EXIT_RUNTIME;
        }
        for (size_t i = 0; !code && i < runs[r].n; i++) xmax = runs[r].x[i] > xmax ? runs[r].x[i] : xmax;
        /* one metric against another (SPHERE Fig. 7: diag/feature_srank against diag/entk_srank): their
         * Pearson correlation over the run's records */
        if (!code && xk && strcmp(xk, "global_step") && strcmp(xk, "step") && runs[r].n >= 2) {
            const size_t n = runs[r].n;
            double mx = 0, my = 0, sxx = 0, syy = 0, sxy = 0;
            for (size_t i = 0; i < n; i++) mx += runs[r].x[i] / n, my += runs[r].y[i] / n;
            for (size_t i = 0; i < n; i++) {
                const double dx = runs[r].x[i] - mx, dy = runs[r].y[i] - my;
                sxx += dx * dx, syy += dy * dy, sxy += dx * dy;
            }
            printf("plot: %s: Pearson r(%s, %s) = %.4f over %zu records\n", pos[r], xk, yk ? yk : "episodic_return",
                   sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : NAN, n);
        }
        keys[r] = cli_run_group_key(pos[r], 0);
    }
    /* the output path and title go into a gnuplot script: no quotes, backslashes or newlines */
    if (!code && (strpbrk(o.out, "'\"\\\n") || strpbrk(o.title, "\"\\\n"))) {
        fprintf(stderr, "specmoe plot: --out and --title may not contain quotes, backslashes or newlines\n");
        code = CLI_EXIT_USAGE;
    }
    char dir[] = "/tmp/specmoe-plot-XXXXXX";
    int have_dir = 0;
    if (!code && !(have_dir = mkdtemp(dir) != NULL)) {
        fprintf(stderr, "specmoe plot: cannot make a scratch directory: %s\n", strerror(errno));
        code = CLI_EXIT_RUNTIME;
    }
    /* groups: runs with equal settings (or, without settings.json, each run alone) */
    int group[PLOT_MAX_RUNS], ng = 0, first[PLOT_MAX_RUNS];
    for (int r = 0; r < npos && !code; r++) {
        group[r] = -1;
        for (int q = 0; q < r && group[r] < 0; q++)
            if (keys[r] && keys[q] && !strcmp(keys[r], keys[q])) group[r] = group[q];
        if (group[r] < 0) {
            first[ng] = r;
            group[r] = ng++;
        }
    }
    const int B = o.bins;
    double *vals = code ? NULL : malloc(sizeof(double) * (size_t)B * npos);
    cli_buf script = {0};
    if (!code && vals) {
        cli_bprintf(&script, "set terminal pngcairo size 900,560 enhanced\nset output '%s'\n", o.out);
        cli_bprintf(&script, "set title \"%s\" noenhanced\nset xlabel \"%s\" noenhanced\nset ylabel \"%s\" noenhanced\n", o.title,
                    xlab, ylab);
        cli_bprintf(&script, "set key top left noenhanced\nset grid\nset style fill transparent solid 0.2 noborder\nplot ");
        for (int r = 0; r < npos; r++) bin_series(&runs[r], xmax, B, vals + (size_t)r * B);
        for (int g = 0; g < ng && !code; g++) {
            char data[4200], label[256];
            snprintf(data, sizeof data, "%s/g%d.dat", dir, g);
            FILE *f = fopen(data, "w");
            if (!f) {
                code = CLI_EXIT_RUNTIME;
                break;
            }
            int members = 0;
            for (int r = 0; r < npos; r++) members += group[r] == g;
            for (int b = 0; b < B; b++) {
                double sum = 0, lo = INFINITY, hi = -INFINITY;
                int n = 0;
                for (int r = 0; r < npos; r++) {
                    double v = vals[(size_t)r * B + b];
                    if (group[r] != g || !isfinite(v)) continue;
                    sum += v;
                    n++;
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                if (n) fprintf(f, "%.9g %.9g %.9g %.9g\n", (b + 0.5) * xmax / B, sum / n, lo, hi);
            }
            if (fclose(f) != 0) code = CLI_EXIT_RUNTIME;
            char full[PATH_MAX];
            if (o.labels && realpath(pos[first[g]], full)) { /* the parent directory's name */
                char *slash = strrchr(full, '/');
                if (slash && slash != full) *slash = 0;
                slash = strrchr(full, '/');
                snprintf(label, sizeof label, "%s", slash && slash[1] ? slash + 1 : "/");
            } else {
                cli_run_label(pos[first[g]], label, sizeof label);
            }
            printf("plot-curve label=%s runs=%d\n", label, members);
            cli_bprintf(&script, "%s'%s' using 1:3:4 with filledcurves lc %d notitle, '%s' using 1:2 with lines lw 2 lc %d title \"%s (%d run%s)\"",
                        g ? ", " : "", data, g + 1, data, g + 1, label, members, members == 1 ? "" : "s");
        }
        cli_bprintf(&script, "\n");
    }
    if (!code && (!vals || script.failed)) code = CLI_EXIT_RUNTIME;
    if (!code) {
        char sp[4200];
        snprintf(sp, sizeof sp, "%s/plot.gp", dir);
        code = cli_gnuplot("plot", sp, script.s, o.out);
    }
    if (!code) printf("plot: %d run%s in %d group%s -> %s\n", npos, npos == 1 ? "" : "s", ng, ng == 1 ? "" : "s", o.out);
    /* scratch files */
    for (int g = 0; g < ng && have_dir; g++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/g%d.dat", dir, g);
        remove(p);
    }
    if (have_dir) {
        char p[4200];
        snprintf(p, sizeof p, "%s/plot.gp", dir);
        remove(p);
        rmdir(dir);
    }
    free(script.s);
    free(vals);
    for (int r = 0; r < npos; r++) {
        sm_series_free(&runs[r]);
        free(keys[r]);
        keys[r] = NULL;
    }
    return code;
}
