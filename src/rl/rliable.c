/* Aggregates and stratified-bootstrap intervals (include/specmoe/rl/rliable.h). */
#include "specmoe/rl/rliable.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sm_aggregate_name(sm_aggregate_kind k) {
    static const char *const names[SM_AGG_N] = {"Median", "IQM", "Mean", "Optimality gap"};
    return k >= 0 && k < SM_AGG_N ? names[k] : "?";
}

double sm_rliable_normalise(double raw, double random, double reference) {
    return reference == random ? NAN : (raw - random) / (reference - random);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median of v (n), sorting it */
static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double sm_aggregate(sm_aggregate_kind k, const double *s, int R, int G, double *scratch) {
    const int N = R * G;
    double acc = 0;
    switch (k) {
    case SM_AGG_MEAN:
        for (int i = 0; i < N; i++) acc += s[i];
        return acc / N;
    case SM_AGG_OPTGAP: /* gamma = 1: the reference score */
        for (int i = 0; i < N; i++) acc += s[i] < 1 ? s[i] : 1;
        return 1 - acc / N;
    case SM_AGG_MEDIAN: {
        double *m = scratch; /* (G) per-game means over runs */
        for (int g = 0; g < G; g++) {
            double t = 0;
            for (int r = 0; r < R; r++) t += s[(size_t)r * G + g];
            m[g] = t / R;
        }
        return median_of(m, G);
    }
    case SM_AGG_IQM: {
        double *v = scratch;
        memcpy(v, s, sizeof(double) * (size_t)N);
        qsort(v, (size_t)N, sizeof *v, cmp_double);
        int cut = (int)(0.25 * N); /* scipy's trim_mean: floor(proportion * n) from each end */
        for (int i = cut; i < N - cut; i++) acc += v[i];
        return acc / (N - 2 * cut);
    }
    default: return NAN;
    }
}

/* the q-quantile (0..1) of sorted v (n) with linear interpolation between order statistics */
static double quantile_sorted(const double *v, int n, double q) {
    double pos = q * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) return v[n - 1];
    return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

/* one stratified resample of m (R, G) into res: each game's runs drawn among that game's runs */
static void resample(const double *m, int R, int G, sm_rng *rng, double *res) {
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++) res[(size_t)r * G + g] = m[(size_t)sm_rng_below(rng, (uint32_t)R) * G + g];
}

/* the checks both interval functions make: reps, coverage and finite scores (m: R x G, named who) */
static sm_status check_args(const double *m, int R, int G, const char *who, int reps, double conf, sm_error *err) {
    if (reps < 1) return sm_fail(err, SM_ERR_ARG, "rliable: bootstrap replicates must be >= 1 (got %d)", reps);
    if (!(conf > 0 && conf < 1)) return sm_fail(err, SM_ERR_ARG, "rliable: the interval's coverage must be in (0, 1)");
    for (int i = 0; i < R * G; i++)
        if (!isfinite(m[i])) return sm_fail(err, SM_ERR_ARG, "rliable: score of run %d, game %d%s is not finite", i / G, i % G, who);
    return SM_OK;
}

sm_status sm_rliable(const double *scores, int R, int G, int reps, double conf, uint64_t seed, sm_interval out[SM_AGG_N],
                     sm_error *err) {
    if (R < 1 || G < 1) return sm_fail(err, SM_ERR_ARG, "rliable: need at least one run of one game (got %d x %d)", R, G);
    sm_status st = check_args(scores, R, G, "", reps, conf, err);
    if (st != SM_OK) return st;
    const size_t N = (size_t)R * G;
    /* one allocation: a resampled matrix, the scratch of sm_aggregate, the replicates per aggregate */
    double *block = malloc(sizeof(double) * (N + N + G + (size_t)reps * SM_AGG_N));
    if (!block) return sm_fail(err, SM_ERR_NOMEM, "rliable: out of memory (%d replicates)", reps);
    double *res = block, *scratch = res + N, *rep = scratch + N + G;
    for (int k = 0; k < SM_AGG_N; k++) out[k].point = sm_aggregate((sm_aggregate_kind)k, scores, R, G, scratch);
    sm_rng rng;
    sm_rng_seed(&rng, seed);
    for (int b = 0; b < reps; b++) {
        resample(scores, R, G, &rng, res);
        for (int k = 0; k < SM_AGG_N; k++) rep[(size_t)k * reps + b] = sm_aggregate((sm_aggregate_kind)k, res, R, G, scratch);
    }
    for (int k = 0; k < SM_AGG_N; k++) {
        double *v = rep + (size_t)k * reps;
        qsort(v, (size_t)reps, sizeof *v, cmp_double);
        out[k].lo = quantile_sorted(v, reps, (1 - conf) / 2);
        out[k].hi = quantile_sorted(v, reps, 1 - (1 - conf) / 2);
    }
    free(block);
    return SM_OK;
}

/* P(X > Y) of one resampled pair: the mean over games of the Mann-Whitney statistic */
static double prob_improvement(const double *x, int Rx, const double *y, int Ry, int G) {
    double acc = 0;
    for (int g = 0; g < G; g++) {
        double s = 0;
        for (int i = 0; i < Rx; i++)
            for (int j = 0; j < Ry; j++) {
                const double a = x[(size_t)i * G + g], b = y[(size_t)j * G + g];
                s += a > b ? 1 : a == b ? 0.5 : 0;
            }
        acc += s / ((double)Rx * Ry);
    }
    return acc / G;
}

sm_status sm_rliable_compare(const double *x, int Rx, const double *y, int Ry, int G, sm_aggregate_kind k, int reps,
                             double conf, uint64_t seed, sm_comparison *out, sm_error *err) {
    if (Rx < 1 || Ry < 1 || G < 1)
        return sm_fail(err, SM_ERR_ARG, "rliable: need at least one run of each variant on one game (got %d and %d x %d)", Rx, Ry, G);
    if (k < 0 || k >= SM_AGG_N) return sm_fail(err, SM_ERR_ARG, "rliable: unknown aggregate %d", (int)k);
    sm_status st = check_args(x, Rx, G, " of X", reps, conf, err);
    if (st == SM_OK) st = check_args(y, Ry, G, " of Y", reps, conf, err);
    if (st != SM_OK) return st;
    const size_t Nx = (size_t)Rx * G, Ny = (size_t)Ry * G, Nmax = Nx > Ny ? Nx : Ny;
    /* one allocation: the two resampled matrices, sm_aggregate's scratch, the replicates of d and P */
    double *block = malloc(sizeof(double) * (Nx + Ny + Nmax + G + 2 * (size_t)reps));
    if (!block) return sm_fail(err, SM_ERR_NOMEM, "rliable: out of memory (%d replicates)", reps);
    double *rx = block, *ry = rx + Nx, *scratch = ry + Ny, *rep_d = scratch + Nmax + G, *rep_p = rep_d + reps;
    out->diff.point = sm_aggregate(k, x, Rx, G, scratch) - sm_aggregate(k, y, Ry, G, scratch);
    out->poi.point = prob_improvement(x, Rx, y, Ry, G);
    sm_rng rng;
    sm_rng_seed(&rng, seed);
    for (int b = 0; b < reps; b++) {
        resample(x, Rx, G, &rng, rx);
        resample(y, Ry, G, &rng, ry);
        rep_d[b] = sm_aggregate(k, rx, Rx, G, scratch) - sm_aggregate(k, ry, Ry, G, scratch);
        rep_p[b] = prob_improvement(rx, Rx, ry, Ry, G);
    }
    sm_interval *iv[2] = {&out->diff, &out->poi};
    double *reps_of[2] = {rep_d, rep_p};
    for (int i = 0; i < 2; i++) {
        qsort(reps_of[i], (size_t)reps, sizeof(double), cmp_double);
        iv[i]->lo = quantile_sorted(reps_of[i], reps, (1 - conf) / 2);
        iv[i]->hi = quantile_sorted(reps_of[i], reps, 1 - (1 - conf) / 2);
    }
    free(block);
    return SM_OK;
}

sm_verdict sm_claim_verdict(sm_claim_kind kind, sm_interval d, double m) {
    if (isnan(d.lo) || isnan(d.hi) || !(m > 0)) return SM_VERDICT_UNDECIDED;
    if (kind == SM_CLAIM_GREATER || kind == SM_CLAIM_NOT_GREATER) {
        const int neg = kind == SM_CLAIM_NOT_GREATER;
        if (d.lo > 0) return neg ? SM_VERDICT_NOT_REPRODUCED : SM_VERDICT_REPRODUCED;
        if (d.hi < m) return neg ? SM_VERDICT_REPRODUCED : SM_VERDICT_NOT_REPRODUCED;
        return SM_VERDICT_UNDECIDED;
    }
    if (d.lo >= -m && d.hi <= m) return SM_VERDICT_REPRODUCED;
    if (d.lo > m || d.hi < -m) return SM_VERDICT_NOT_REPRODUCED;
    return SM_VERDICT_UNDECIDED;
}

const char *sm_verdict_name(sm_verdict v) {
    static const char *const names[] = {"reproduced", "not reproduced", "not decidable"};
    return v >= 0 && v <= SM_VERDICT_UNDECIDED ? names[v] : "?";
}

/* one name of a claim, spaces around it dropped; 0 if empty or too long */
static int claim_name(const char *p, const char *end, char out[SM_CLAIM_NAME]) {
    while (p < end && *p == ' ') p++;
    while (end > p && end[-1] == ' ') end--;
    if (p == end || end - p >= SM_CLAIM_NAME) return 0;
    snprintf(out, SM_CLAIM_NAME, "%.*s", (int)(end - p), p);
    return 1;
}

int sm_claim_parse(const char *p, const char *end, sm_claim *out) {
    const char *op = NULL;
    int nops = 0;
    for (const char *q = p; q < end; q++)
        if (*q == '>' || *q == '<' || *q == '~') op = q, nops++;
    if (nops != 1 || (*op == '~' && op > p && op[-1] == '!')) return -1; /* "!~" means nothing */
    const int less = *op == '<', neg = op > p && op[-1] == '!' && *op != '~';
    out->kind = *op == '~' ? SM_CLAIM_EQUIVALENT : neg ? SM_CLAIM_NOT_GREATER : SM_CLAIM_GREATER;
    if (!claim_name(p, op - neg, less ? out->b : out->a) || !claim_name(op + 1, end, less ? out->a : out->b)) return -1;
    return 0;
}

int sm_claims_parse(const char *list, sm_claim *out, int max) {
    int n = 0;
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ';');
        if (!end) end = p + strlen(p);
        if (n == max || sm_claim_parse(p, end, &out[n])) return -1;
        n++;
        p = *end ? end + 1 : end;
    }
    return n;
}

const char *sm_claim_op(sm_claim_kind kind) {
    return kind == SM_CLAIM_GREATER ? ">" : kind == SM_CLAIM_NOT_GREATER ? "!>" : "~";
}
