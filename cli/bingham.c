/* specmoe bingham-z: GrMoE's validation of the Bingham normaliser (Sec. 6.4.4). For each kappa, the
 * Kume-Wood saddle-point log c of first, second and third order, a Monte Carlo estimate with its
 * relative standard error, and the relative error of c (not of log c) of each order against the
 * Monte Carlo. GrMoE's expert density exp(+kappa ||U^T x||^2) on S^{d-1} with a rank-k_r frame is
 * lambda = (-kappa x k_r, 0 x (d - k_r)); for lambda with at most two distinct values the exact c
 * (a Kummer function) is printed too. --lambda takes an explicit lambda instead. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/core/bingham.h"

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

/* One output line: saddle points, Monte Carlo, errors, and the exact value when there is one. */
static int report(const char *label, const double *lambda, int p, long samples, uint64_t seed) {
    sm_error err;
    double sp[3], mc, se, exact;
    sm_status st = sm_bingham_logc_saddle(lambda, p, sp, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    sm_rng rng;
    sm_rng_seed(&rng, seed); /* the same stream for every line: each line is reproducible on its own */
    st = sm_bingham_logc_mc(lambda, p, samples, &rng, &mc, &se, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    printf("%s: log_c saddle1 %.6f saddle2 %.6f saddle3 %.6f mc %.6f mc_rel_se %.4f%% | rel_err_vs_mc 1st %+.4f%% "
           "2nd %+.4f%% 3rd %+.4f%%",
           label, sp[0], sp[1], sp[2], mc, 100 * se, 100 * expm1(sp[0] - mc), 100 * expm1(sp[1] - mc),
           100 * expm1(sp[2] - mc));
    if (sm_bingham_logc_two_level(lambda, p, &exact, NULL) == SM_OK)
        printf(" | exact %.6f rel_err_vs_exact 1st %+.4f%% 2nd %+.4f%% 3rd %+.4f%% mc %+.4f%%", exact,
               100 * expm1(sp[0] - exact), 100 * expm1(sp[1] - exact), 100 * expm1(sp[2] - exact),
               100 * expm1(mc - exact));
    printf("\n");
    return 0;
}

int cmd_bingham_z(int argc, char **argv) {
    int d, kr;
    long samples;
    uint64_t seed;
    const char *kappas_s, *lambda_s;
    fl_flag fl[] = {
        {"d", FL_INT, &d, "16", "sphere S^{d-1} in R^d", 0},
        {"kr", FL_INT, &kr, "4", "routing rank k_r: lambda = (-kappa x k_r, 0 x (d - k_r))", 0},
        {"kappa", FL_STRING, &kappas_s, "0.4,1,2,3,4.2", "concentrations, comma-separated (GrMoE's learned range)", 0},
        {"samples", FL_LONG, &samples, "1000000", "Monte Carlo points on the sphere per line", 0},
        {"seed", FL_U64, &seed, "1", "Monte Carlo seed (the same stream for every line)", 0},
        {"lambda", FL_STRING, &lambda_s, NULL, "explicit comma-separated lambda (overrides --d/--kr/--kappa)", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 2, "bingham-z", "[flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (samples < 1) {
        fprintf(stderr, "specmoe bingham-z: --samples: %ld, need >= 1\n", samples);
        return CLI_EXIT_USAGE;
    }

    if (lambda_s) {
        double *lam;
        int p = parse_list("lambda", lambda_s, &lam);
        if (p < 0) return CLI_EXIT_USAGE;
        printf("Bingham normalising constant c(lambda) = int_{S^%d} exp(-x^T diag(lambda) x) dS, p = %d; Monte Carlo "
               "%ld samples, seed %llu%s\n",
               p - 1, p, samples, (unsigned long long)seed,
               (fl[0].set || fl[1].set || fl[2].set) ? " (--lambda given: --d/--kr/--kappa ignored)" : "");
        rc = report("lambda", lam, p, samples, seed);
        free(lam);
        return rc;
    }

    if (d < 1 || kr < 1 || kr > d) {
        fprintf(stderr, "specmoe bingham-z: need 1 <= --kr <= --d, got --d %d --kr %d\n", d, kr);
        return CLI_EXIT_USAGE;
    }
    double *kap;
    int nk = parse_list("kappa", kappas_s, &kap);
    if (nk < 0) return CLI_EXIT_USAGE;
    double *lam = malloc((size_t)d * sizeof *lam);
    if (!lam) {
        free(kap);
        fprintf(stderr, "specmoe bingham-z: out of memory for d = %d\n", d);
        return CLI_EXIT_RUNTIME;
    }
    printf("Bingham normaliser of GrMoE's exp(+kappa ||U^T x||^2) on S^%d: lambda = (-kappa x %d, 0 x %d); log c and "
           "relative errors of c; Monte Carlo %ld samples, seed %llu\n",
           d - 1, kr, d - kr, samples, (unsigned long long)seed);
    rc = 0;
    for (int i = 0; i < nk && !rc; i++) {
        sm_error err;
        sm_status st = sm_bingham_grmoe_lambda(lam, d, kr, kap[i], &err);
        if (st != SM_OK) {
            rc = cli_fail(st, &err);
            break;
        }
        char label[96];
        snprintf(label, sizeof label, "kappa %g d %d k_r %d", kap[i], d, kr);
        rc = report(label, lam, d, samples, seed);
    }
    free(lam);
    free(kap);
    return rc;
}
