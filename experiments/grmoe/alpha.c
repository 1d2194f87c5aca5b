/* specmoe bench alpha: GrMoE's post-hoc sparsity (Fig. 1, Table 3). One GrMoE and one softmax-gated
 * (dense) model per seed (synth_layer.h), then the dial swept without retraining. GrMoE's dial is
 * alpha (logits alpha * h * kappa * affinity); the softmax model's dial is its inverse temperature
 * beta = 1/T, which like alpha multiplies the logits (beta = 0: uniform).
 *
 * parse (flags -> alpha_settings), run (settings -> alpha_results: every model evaluated at every
 * dial), report (results -> table on stdout, .md, .json, .dat and the gnuplot PNG). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"
#include "experiments/grmoe/synth_layer.h"

#define MAX_DIALS 32

static const gr_method kGrMoE = {"GrMoE", "grassmann", 0, 1, 0, 0, 0}, kSoftmax = {"Softmax (dense)", "topk", 0, 1, 0, 0, 0};
static const gr_method *const kModels[2] = {&kGrMoE, &kSoftmax};

typedef struct {
    const char *setting, *out_dir;
    int seeds, threads, n_dials;
    double dials[MAX_DIALS]; /* increasing */
    gr_train_opts to;
    sm_synth_config sc;
} alpha_settings;

typedef struct {
    gr_metrics *res; /* res[(model * seeds + seed) * n_dials + i] */
    int *ok;         /* (2, seeds): the model trained */
    double seconds;
} alpha_results;

/* ---------------------------------------------------------------------------------------------- */
/* parse */

/* flags -> settings; returns 0, 1 after --help, 2 after a usage error (printed), like fl_parse */
static int parse(alpha_settings *o, int argc, char **argv) {
    const char *dials_s;
    fl_flag fl[] = {
        {"setting", FL_STRING, &o->setting, "easy", "easy or hard synthetic setting", 0},
        {"seeds", FL_INT, &o->seeds, "5", "seeds (one GrMoE and one softmax model each)", 0},
        {"dials", FL_STRING, &dials_s, "0,0.25,0.5,1,2,5,10", "alpha / inverse-temperature values", 0},
        GR_TRAIN_FLAGS(o->to),
        {"threads", FL_INT, &o->threads, "2", "models trained in parallel", 0},
        {"out", FL_STRING, &o->out_dir, "runs/bench-alpha", "directory for the table, JSON, data and PNG", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "bench alpha", "[flags]", pos, 0, &npos);
    if (rc) return rc;
    sm_error err;
    if (sm_synth_setting(&o->sc, o->setting, &err) != SM_OK) {
        cli_fail(SM_ERR_ARG, &err);
        return 2;
    }
    int nd = 0;
    for (const char *p = dials_s; *p && nd < MAX_DIALS;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v >= 0) || !isfinite(v)) { nd = -1; break; }
        o->dials[nd++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') { nd = -1; break; }
    }
    o->n_dials = nd;
    if (nd < 2 || o->seeds < 1 || gr_train_opts_bad(&o->to, &o->sc) || o->threads < 1) {
        fprintf(stderr, "specmoe bench alpha: --dials needs >= 2 values >= 0 in increasing order; --seeds, --steps, "
                        "--hidden, --test-tokens, --threads >= 1; --batch >= %d; --lr > 0\n", o->sc.N);
        return 2;
    }
    for (int i = 1; i < nd; i++)
        if (o->dials[i] <= o->dials[i - 1]) {
            fprintf(stderr, "specmoe bench alpha: --dials must increase\n");
            return 2;
        }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* run */

static void run(const alpha_settings *o, alpha_results *R) {
    const int seeds = o->seeds, nd = o->n_dials;
    R->res = calloc((size_t)2 * seeds * nd, sizeof(gr_metrics));
    R->ok = calloc((size_t)2 * seeds, sizeof(int));
    double t0 = sm_time_now();
    omp_set_num_threads(o->threads);
    int done = 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < 2 * seeds; i++) {
        int m = i / seeds, s = i % seeds;
        sm_error e2;
        sm_synth task;
        sm_rng r;
        sm_rng_seed(&r, 1000 + (uint64_t)s);
        gr_layer tr = {0};
        if (sm_synth_create(&task, &o->sc, &r, &e2) == SM_OK &&
            gr_layer_make(&tr, kModels[m], &o->sc, &o->to, NULL, (uint64_t)s, &e2) == SM_OK &&
            gr_layer_train(&tr, &task, &o->to, 1000003 + (uint64_t)s, &e2) == SM_OK) {
            for (int k = 0; k < nd; k++) {
                sm_router_config *rc2 = &tr.moe->router->cfg;
                if (m == 0) sm_grmoe_opts(rc2)->alpha = o->dials[k];
                else rc2->temperature = o->dials[k] > 0 ? 1.0 / o->dials[k] : 1e300; /* beta = 0: uniform */
                gr_layer_eval(&tr, &task, &o->to, 2000003 + (uint64_t)s, &R->res[(size_t)i * nd + k]);
            }
            R->ok[i] = 1;
        } else {
#pragma omp critical
            fprintf(stderr, "specmoe: bench alpha: %s seed %d: %s\n", kModels[m]->label, s, e2.msg);
        }
        /* the metrics at the first dial: the sweep itself is in the report */
        gr_progress("alpha", &done, 2 * seeds, kModels[m]->label, s, R->ok[i] ? &R->res[(size_t)i * nd] : NULL, t0);
        gr_layer_free(&tr);
        sm_synth_free(&task);
    }
    R->seconds = sm_time_now() - t0;
}

/* ---------------------------------------------------------------------------------------------- */
/* report */

/* The table on stdout and in OUT/alpha_<setting>.md, the mean curves in .dat, every seed's curve in
 * .json, the plot in .png (gnuplot); the exit code. */
static int report(const alpha_settings *o, const alpha_results *R) {
    const int seeds = o->seeds, nd = o->n_dials;
    const char *out_dir = o->out_dir, *setting = o->setting;
    const gr_metrics *res = R->res;
    const int *ok = R->ok;
    mkdir("runs", 0755);
    mkdir(out_dir, 0755);
    char md[16384], path[4096];
    int n = snprintf(md, sizeof md,
                     "Post-hoc sparsity (%s setting, %d seeds, trained at alpha = 1 / temperature 1, %.0f s)\n\n"
                     "| dial | GrMoE entropy | GrMoE eff. experts | GrMoE test MSE | softmax entropy | softmax eff. experts | softmax test MSE |\n"
                     "|---|---|---|---|---|---|---|\n",
                     setting, seeds, R->seconds);
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
                    const gr_metrics *r = &res[(size_t)(m * seeds + s) * nd + k];
                    v[c++] = q == 0 ? r->entropy : q == 1 ? r->eff : r->mse;
                }
                sm_mean_ci95(v, c, &mean[m][q], &half[m][q]);
            }
        n += snprintf(md + n, sizeof md - n, "| %g | %.3f ± %.3f | %.2f | %.4f | %.3f ± %.3f | %.2f | %.4f |\n", o->dials[k],
                      mean[0][0], half[0][0], mean[0][1], mean[0][2], mean[1][0], half[1][0], mean[1][1], mean[1][2]);
        if (dat) fprintf(dat, "%g %.6f %.6f %.6f %.6f\n", o->dials[k], mean[0][0], half[0][0], mean[1][0], half[1][0]);
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
                      kModels[m]->label, mono, cnt, mono == cnt ? " (every seed)." : ".");
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
        for (int k = 0; k < nd; k++) fprintf(js, "%s%g", k ? "," : "", o->dials[k]);
        fprintf(js, "],\"models\":[");
        for (int m = 0; m < 2; m++) {
            fprintf(js, "%s{\"model\":\"%s\",\"runs\":[", m ? "," : "", kModels[m]->label);
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
    return w ? CLI_EXIT_RUNTIME : 0;
}

/* ---------------------------------------------------------------------------------------------- */

int exp_grmoe_alpha(int argc, char **argv) {
    alpha_settings o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    alpha_results R;
    run(&o, &R);
    rc = report(&o, &R);
    free(R.res);
    free(R.ok);
    return rc;
}
