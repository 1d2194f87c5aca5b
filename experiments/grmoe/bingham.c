/* specmoe bingham-z: GrMoE's validation of the Bingham normaliser (Sec. 6.4.4). For each kappa, the
 * Kume-Wood saddle-point log c of first, second and third order, a Monte Carlo estimate with its
 * relative standard error, and the relative error of c (not of log c) of each order against the
 * Monte Carlo. GrMoE's expert density exp(+kappa ||U^T x||^2) on S^{d-1} with a rank-k_r frame is
 * lambda = (-kappa x k_r, 0 x (d - k_r)); for lambda with at most two distinct values the exact c
 * (a Kummer function) is printed too. --lambda takes an explicit lambda instead.
 *
 * parse (flags -> bingham_settings), run (settings -> bingham_results: one row per lambda), report
 * (results -> the header and one line per row). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"
#include "specmoe/core/bingham.h"

typedef struct {
    long samples;
    uint64_t seed;
    /* --lambda: one explicit lambda of p entries; NULL for the kappa sweep */
    double *lambda;
    int p, lambda_overrides; /* --d/--kr/--kappa were given too (and are ignored) */
    /* the kappa sweep: lambda = (-kappa x kr, 0 x (d - kr)) for each kappa */
    int d, kr, n_kappa;
    double *kappa;
} bingham_settings;

typedef struct {
    char label[96];
    double sp[3];       /* saddle-point log c of first, second, third order */
    double mc, se;      /* Monte Carlo log c and its relative standard error */
    double exact;       /* the exact log c, when has_exact */
    int has_exact;
} bingham_row;

typedef struct {
    int n;              /* rows computed */
    bingham_row *rows;
    sm_status st;       /* not SM_OK: the run stopped after n rows with err */
    sm_error err;
} bingham_results;

/* ---------------------------------------------------------------------------------------------- */
/* parse */

/* Parses a comma-separated list of finite numbers into a malloc'd array; returns the count, or -1
 * after printing what is wrong. */
static int parse_list(const char *flag, const char *s, double **out) {
    int n = 1;
    for (const char *c = s; *c; c++) n += *c == ',';
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        fprintf(stderr, "specmoe bingham-z: --%s: out of memory\n", flag);
        return -1;
    }
    const char *p = s;
    for (int i = 0; i < n; i++) {
        char *end;
        v[i] = strtod(p, &end);
        if (end == p || (*end != ',' && *end != 0) || !isfinite(v[i])) {
            fprintf(stderr, "specmoe bingham-z: --%s: entry %d of '%s' is not a finite number\n", flag, i + 1, s);
            free(v);
            return -1;
        }
        p = end + (*end == ',');
    }
    *out = v;
    return n;
}

/* flags -> settings; returns 0, 1 after --help, 2 after a usage error (printed), like fl_parse. On 0
 * the caller frees o->lambda and o->kappa. */
static int parse(bingham_settings *o, int argc, char **argv) {
    const char *kappas_s, *lambda_s;
    memset(o, 0, sizeof *o);
    fl_flag fl[] = {
        {"d", FL_INT, &o->d, "16", "sphere S^{d-1} in R^d", 0},
        {"kr", FL_INT, &o->kr, "4", "routing rank k_r: lambda = (-kappa x k_r, 0 x (d - k_r))", 0},
        {"kappa", FL_STRING, &kappas_s, "0.4,1,2,3,4.2", "concentrations, comma-separated (GrMoE's learned range)", 0},
        {"samples", FL_LONG, &o->samples, "1000000", "Monte Carlo points on the sphere per line", 0},
        {"seed", FL_U64, &o->seed, "1", "Monte Carlo seed (the same stream for every line)", 0},
        {"lambda", FL_STRING, &lambda_s, NULL, "explicit comma-separated lambda (overrides --d/--kr/--kappa)", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 2, "bingham-z", "[flags]", pos, 0, &npos);
    if (rc) return rc;
    if (o->samples < 1) {
        fprintf(stderr, "specmoe bingham-z: --samples: %ld, need >= 1\n", o->samples);
        return 2;
    }
    if (lambda_s) {
        o->p = parse_list("lambda", lambda_s, &o->lambda);
        o->lambda_overrides = fl[0].set || fl[1].set || fl[2].set;
        return o->p < 0 ? 2 : 0;
    }
    if (o->d < 1 || o->kr < 1 || o->kr > o->d) {
        fprintf(stderr, "specmoe bingham-z: need 1 <= --kr <= --d, got --d %d --kr %d\n", o->d, o->kr);
        return 2;
    }
    o->n_kappa = parse_list("kappa", kappas_s, &o->kappa);
    return o->n_kappa < 0 ? 2 : 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* run */

/* One row: saddle points, Monte Carlo, and the exact value when there is one. */
static sm_status run_row(bingham_row *r, const char *label, const double *lambda, int p, long samples, uint64_t seed,
                         sm_error *err) {
    snprintf(r->label, sizeof r->label, "%s", label);
    sm_status st = sm_bingham_logc_saddle(lambda, p, r->sp, err);
    if (st != SM_OK) return st;
    sm_rng rng;
    sm_rng_seed(&rng, seed); /* the same stream for every line: each line is reproducible on its own */
    st = sm_bingham_logc_mc(lambda, p, samples, &rng, &r->mc, &r->se, err);
    if (st != SM_OK) return st;
    r->has_exact = sm_bingham_logc_two_level(lambda, p, &r->exact, NULL) == SM_OK;
    return SM_OK;
}

/* Every row, until the first failure (R->st, R->err); the caller frees R->rows (NULL if out of
 * memory before the first row). */
static void run(const bingham_settings *o, bingham_results *R) {
    memset(R, 0, sizeof *R);
    int rows = o->lambda ? 1 : o->n_kappa;
    double *lam = o->lambda ? NULL : malloc((size_t)o->d * sizeof *lam);
    R->rows = calloc((size_t)rows, sizeof *R->rows);
    if (!R->rows || (!o->lambda && !lam)) {
        free(lam);
        free(R->rows);
        R->rows = NULL;
        R->st = sm_fail(&R->err, SM_ERR_NOMEM, "bingham-z: out of memory for d = %d", o->d);
        return;
    }
    if (o->lambda) {
        R->st = run_row(&R->rows[0], "lambda", o->lambda, o->p, o->samples, o->seed, &R->err);
        R->n = R->st == SM_OK;
        return;
    }
    for (int i = 0; i < o->n_kappa; i++) {
        R->st = sm_bingham_grmoe_lambda(lam, o->d, o->kr, o->kappa[i], &R->err);
        char label[96];
        snprintf(label, sizeof label, "kappa %g d %d k_r %d", o->kappa[i], o->d, o->kr);
        if (R->st == SM_OK) R->st = run_row(&R->rows[i], label, lam, o->d, o->samples, o->seed, &R->err);
        if (R->st != SM_OK) break;
        R->n++;
    }
    free(lam);
}

/* ---------------------------------------------------------------------------------------------- */
/* report */

static void report(const bingham_settings *o, const bingham_results *R) {
    if (o->lambda)
        printf("Bingham normalising constant c(lambda) = int_{S^%d} exp(-x^T diag(lambda) x) dS, p = %d; Monte Carlo "
               "%ld samples, seed %llu%s\n",
               o->p - 1, o->p, o->samples, (unsigned long long)o->seed,
               o->lambda_overrides ? " (--lambda given: --d/--kr/--kappa ignored)" : "");
    else
        printf("Bingham normaliser of GrMoE's exp(+kappa ||U^T x||^2) on S^%d: lambda = (-kappa x %d, 0 x %d); log c and "
               "relative errors of c; Monte Carlo %ld samples, seed %llu\n",
               o->d - 1, o->kr, o->d - o->kr, o->samples, (unsigned long long)o->seed);
    for (int i = 0; i < R->n; i++) {
        const bingham_row *r = &R->rows[i];
        const double *sp = r->sp, mc = r->mc;
        printf("%s: log_c saddle1 %.6f saddle2 %.6f saddle3 %.6f mc %.6f mc_rel_se %.4f%% | rel_err_vs_mc 1st %+.4f%% "
               "2nd %+.4f%% 3rd %+.4f%%",
               r->label, sp[0], sp[1], sp[2], mc, 100 * r->se, 100 * expm1(sp[0] - mc), 100 * expm1(sp[1] - mc),
               100 * expm1(sp[2] - mc));
        if (r->has_exact)
            printf(" | exact %.6f rel_err_vs_exact 1st %+.4f%% 2nd %+.4f%% 3rd %+.4f%% mc %+.4f%%", r->exact,
                   100 * expm1(sp[0] - r->exact), 100 * expm1(sp[1] - r->exact), 100 * expm1(sp[2] - r->exact),
                   100 * expm1(mc - r->exact));
        printf("\n");
    }
}

/* ---------------------------------------------------------------------------------------------- */

int exp_grmoe_bingham(int argc, char **argv) {
    bingham_settings o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    bingham_results R;
    run(&o, &R);
    /* the rows computed before a failure are reported too, then the failure */
    if (R.rows) report(&o, &R);
    rc = R.st == SM_OK ? 0 : cli_fail(R.st, &R.err);
    free(R.rows);
    free(o.lambda);
    free(o.kappa);
    return rc;
}
