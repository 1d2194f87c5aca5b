/* rliable aggregates (include/specmoe/rl/rliable.h): point estimates against values worked by hand,
 * the stratification of the bootstrap, and the coverage of its intervals. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "specmoe/rl/rliable.h"

/* 4 runs x 3 games. By hand: all 12 sorted -0.5 0.1 0.2 0.3 0.4 0.5 0.7 0.9 1.1 1.5 2.0 3.0 (sum 10.2);
 * game means 0.25, 0.8, 1.5; IQM drops 3 at each end: (0.3+0.4+0.5+0.7+0.9+1.1)/6 = 0.65;
 * min(s, 1) sums to 6.6. */
static const double kS[12] = {0.1, 0.5, 2.0, 0.3, 0.9, 1.5, 0.2, 0.7, -0.5, 0.4, 1.1, 3.0};

Test(rliable, aggregates_match_the_definitions) {
    double scratch[12 + 3];
    cr_expect_float_eq(sm_aggregate(SM_AGG_MEAN, kS, 4, 3, scratch), 0.85, 1e-12);
    cr_expect_float_eq(sm_aggregate(SM_AGG_MEDIAN, kS, 4, 3, scratch), 0.8, 1e-12);
    cr_expect_float_eq(sm_aggregate(SM_AGG_IQM, kS, 4, 3, scratch), 0.65, 1e-12);
    cr_expect_float_eq(sm_aggregate(SM_AGG_OPTGAP, kS, 4, 3, scratch), 0.45, 1e-12);
    /* an even number of games: the median is the mean of the middle two game means */
    double two[4] = {0, 1, 2, 5}; /* 2 runs x 2 games: game means 1 and 3 */
    cr_expect_float_eq(sm_aggregate(SM_AGG_MEDIAN, two, 2, 2, scratch), 2.0, 1e-12);
    cr_expect_float_eq(sm_rliable_normalise(15, 5, 25), 0.5, 1e-15);
    cr_expect(isnan(sm_rliable_normalise(1, 2, 2)));
}

Test(rliable, intervals_hold_the_point_and_bootstrap_within_games) {
    sm_interval out[SM_AGG_N];
    sm_error err = {0};
    cr_assert_eq(sm_rliable(kS, 4, 3, 2000, 0.95, 7, out, &err), SM_OK, "%s", err.msg);
    for (int k = 0; k < SM_AGG_N; k++) {
        cr_expect(out[k].lo <= out[k].point && out[k].point <= out[k].hi, "%s: %g not in [%g, %g]",
                  sm_aggregate_name((sm_aggregate_kind)k), out[k].point, out[k].lo, out[k].hi);
        cr_expect(out[k].hi > out[k].lo, "%s: an empty interval on spread data", sm_aggregate_name((sm_aggregate_kind)k));
    }
    /* every run of a game scores the same: a stratified bootstrap (runs resampled within each game)
     * reproduces the matrix, so every interval is a point, although the games differ */
    double flat[4 * 3];
    for (int r = 0; r < 4; r++)
        for (int g = 0; g < 3; g++) flat[r * 3 + g] = 0.3 * g * g - 0.2;
    cr_assert_eq(sm_rliable(flat, 4, 3, 500, 0.95, 1, out, &err), SM_OK);
    for (int k = 0; k < SM_AGG_N; k++)
        cr_expect(out[k].lo == out[k].point && out[k].hi == out[k].point, "%s: [%g, %g] around %g",
                  sm_aggregate_name((sm_aggregate_kind)k), out[k].lo, out[k].hi, out[k].point);
    double bad[2] = {0, NAN};
    cr_expect_eq(sm_rliable(bad, 1, 2, 10, 0.95, 1, out, &err), SM_ERR_ARG);
    cr_expect_eq(sm_rliable(kS, 4, 3, 0, 0.95, 1, out, &err), SM_ERR_ARG);
    cr_expect_eq(sm_rliable(kS, 4, 3, 10, 1.0, 1, out, &err), SM_ERR_ARG);
}

/* Coverage: scores of 10 runs x 5 games drawn around a known mean; the 95% interval of the mean
 * must contain it in about 95% of 300 trials (bootstrap percentile intervals run a little narrow at
 * 10 runs: the binomial spread at 300 trials is +-2.5 points). */
Test(rliable, mean_interval_covers_the_truth) {
    sm_rng rng;
    sm_rng_seed(&rng, 42);
    int cover = 0, trials = 300;
    for (int t = 0; t < trials; t++) {
        double s[50];
        for (int i = 0; i < 50; i++) {
            /* a sum of uniforms: mean 0.5 per game offset, spread ~0.29 */
            double u = 0;
            for (int j = 0; j < 3; j++) u += sm_rng_uniform(&rng);
            s[i] = u / 3 + 0.1 * (i % 5);
        }
        sm_interval out[SM_AGG_N];
        sm_error err;
        cr_assert_eq(sm_rliable(s, 10, 5, 400, 0.95, 1000 + (uint64_t)t, out, &err), SM_OK);
        double truth = 0.5 + 0.1 * 2; /* mean of the game offsets 0..0.4 */
        cover += out[SM_AGG_MEAN].lo <= truth && truth <= out[SM_AGG_MEAN].hi;
    }
    cr_expect(cover >= (int)(0.88 * trials) && cover <= (int)(0.99 * trials), "coverage %d / %d", cover, trials);
}

/* Comparisons: the point estimates by hand, the probability of improvement's extremes, and the
 * bootstrap's resampling within games of each variant separately. */
Test(rliable, compare_points_and_extremes) {
    sm_error err = {0};
    sm_comparison c;
    /* X against itself: no difference, P(X > X) = 1/2 (ties count half) */
    cr_assert_eq(sm_rliable_compare(kS, 4, kS, 4, 3, SM_AGG_IQM, 500, 0.95, 3, &c, &err), SM_OK, "%s", err.msg);
    cr_expect_float_eq(c.diff.point, 0, 1e-15);
    cr_expect_float_eq(c.poi.point, 0.5, 1e-15);
    cr_expect(c.diff.lo < 0 && c.diff.hi > 0, "X - X: [%g, %g] should straddle 0 on spread data", c.diff.lo, c.diff.hi);
    /* Y = X + 10 in every run: every y beats every x of its game, whatever the resample */
    double y[12];
    for (int i = 0; i < 12; i++) y[i] = kS[i] + 10;
    cr_assert_eq(sm_rliable_compare(kS, 4, y, 4, 3, SM_AGG_MEAN, 500, 0.95, 3, &c, &err), SM_OK);
    cr_expect_float_eq(c.diff.point, -10, 1e-12);
    cr_expect(c.poi.point == 0 && c.poi.lo == 0 && c.poi.hi == 0, "P(X > X + 10) = %g [%g, %g]", c.poi.point, c.poi.lo, c.poi.hi);
    /* unequal run counts, by hand: game 0 of X {0, 1}, of Y {0.5}: S = 0 + 1 -> 1/2; game 1 of X
     * {2, 2}, of Y {2}: two ties -> 1/2; P = 1/2. Means: X 1.25, Y 1.25. */
    double x2[4] = {0, 2, 1, 2}, y1[2] = {0.5, 2};
    cr_assert_eq(sm_rliable_compare(x2, 2, y1, 1, 2, SM_AGG_MEAN, 200, 0.95, 1, &c, &err), SM_OK);
    cr_expect_float_eq(c.poi.point, 0.5, 1e-15);
    cr_expect_float_eq(c.diff.point, 0, 1e-15);
    /* stratified: constant runs within each game give point intervals although the games differ */
    double fx[6] = {0, 5, 0, 5, 0, 5}, fy[6] = {1, 3, 1, 3, 1, 3};
    cr_assert_eq(sm_rliable_compare(fx, 3, fy, 3, 2, SM_AGG_IQM, 300, 0.95, 9, &c, &err), SM_OK);
    cr_expect(c.diff.lo == c.diff.point && c.diff.hi == c.diff.point, "[%g, %g] around %g", c.diff.lo, c.diff.hi, c.diff.point);
    cr_expect(c.poi.point == 0.5 && c.poi.lo == 0.5 && c.poi.hi == 0.5);
    double bad[2] = {0, INFINITY};
    cr_expect_eq(sm_rliable_compare(kS, 4, bad, 1, 2, SM_AGG_IQM, 10, 0.95, 1, &c, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "of Y") != NULL, "%s", err.msg);
    cr_expect_eq(sm_rliable_compare(kS, 0, kS, 4, 3, SM_AGG_IQM, 10, 0.95, 1, &c, &err), SM_ERR_ARG);
    cr_expect_eq(sm_rliable_compare(kS, 4, kS, 4, 3, SM_AGG_N, 10, 0.95, 1, &c, &err), SM_ERR_ARG);
}

/* Power: X is Y shifted up by 0.3 with noise of spread ~0.1; with 5 runs x 5 games the interval of
 * the IQM difference excludes 0 and holds 0.3, and P(X > Y) is near 1. */
Test(rliable, compare_detects_a_shift) {
    sm_rng rng;
    sm_rng_seed(&rng, 5);
    double x[25], y[25];
    for (int i = 0; i < 25; i++) {
        y[i] = 0.2 * (i % 5) + 0.35 * (sm_rng_uniform(&rng) - 0.5);
        x[i] = 0.2 * (i % 5) + 0.3 + 0.35 * (sm_rng_uniform(&rng) - 0.5);
    }
    sm_comparison c;
    sm_error err = {0};
    cr_assert_eq(sm_rliable_compare(x, 5, y, 5, 5, SM_AGG_IQM, 2000, 0.95, 11, &c, &err), SM_OK);
    cr_expect(c.diff.lo > 0 && c.diff.lo < 0.3 && c.diff.hi > 0.3, "IQM difference %g [%g, %g]", c.diff.point, c.diff.lo, c.diff.hi);
    cr_expect(c.poi.point > 0.85 && c.poi.lo > 0.5, "P(X > Y) = %g [%g, %g]", c.poi.point, c.poi.lo, c.poi.hi);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, c.diff, 0.1), SM_VERDICT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_EQUIVALENT, c.diff, 0.1), SM_VERDICT_NOT_REPRODUCED);
}

/* The verdict rule of rliable.h, branch by branch, at margin 0.1 */
Test(rliable, claim_verdicts) {
#define IV(l, h) ((sm_interval){.point = 0.5 * ((l) + (h)), .lo = (l), .hi = (h)})
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, IV(0.01, 0.3), 0.1), SM_VERDICT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, IV(0.01, 0.05), 0.1), SM_VERDICT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, IV(-0.2, 0.09), 0.1), SM_VERDICT_NOT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, IV(-0.3, -0.1), 0.1), SM_VERDICT_NOT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, IV(-0.05, 0.2), 0.1), SM_VERDICT_UNDECIDED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, IV(0, 0.2), 0.1), SM_VERDICT_UNDECIDED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_NOT_GREATER, IV(0.01, 0.05), 0.1), SM_VERDICT_NOT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_NOT_GREATER, IV(-0.9, -0.5), 0.1), SM_VERDICT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_NOT_GREATER, IV(-0.2, 0.09), 0.1), SM_VERDICT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_NOT_GREATER, IV(-0.05, 0.2), 0.1), SM_VERDICT_UNDECIDED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_EQUIVALENT, IV(-0.1, 0.1), 0.1), SM_VERDICT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_EQUIVALENT, IV(-0.05, 0.12), 0.1), SM_VERDICT_UNDECIDED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_EQUIVALENT, IV(0.11, 0.4), 0.1), SM_VERDICT_NOT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_EQUIVALENT, IV(-0.4, -0.11), 0.1), SM_VERDICT_NOT_REPRODUCED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_EQUIVALENT, IV(-0.4, 0.4), 0.1), SM_VERDICT_UNDECIDED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, IV(NAN, 0.3), 0.1), SM_VERDICT_UNDECIDED);
    cr_expect_eq(sm_claim_verdict(SM_CLAIM_GREATER, IV(0.2, 0.3), 0), SM_VERDICT_UNDECIDED);
    cr_expect_str_eq(sm_verdict_name(SM_VERDICT_NOT_REPRODUCED), "not reproduced");
#undef IV
}

/* The claim syntax the report and the bench share (sm_claims_parse): every operator, the sides of
 * < and !< swapped, spaces dropped, names with commas and colons, and each malformed form refused */
Test(rliable, claims_parse) {
    sm_claim c[4];
    cr_assert_eq(sm_claims_parse("a>b; x , y:1 < z ;A!<B;p~q;", c, 4), 4);
    cr_expect_str_eq(c[0].a, "a");
    cr_expect_str_eq(c[0].b, "b");
    cr_expect_eq(c[0].kind, SM_CLAIM_GREATER);
    cr_expect_str_eq(c[1].a, "z");
    cr_expect_str_eq(c[1].b, "x , y:1");
    cr_expect_eq(c[1].kind, SM_CLAIM_GREATER);
    cr_expect_str_eq(c[2].a, "B");
    cr_expect_str_eq(c[2].b, "A");
    cr_expect_eq(c[2].kind, SM_CLAIM_NOT_GREATER);
    cr_expect_eq(c[3].kind, SM_CLAIM_EQUIVALENT);
    cr_expect_str_eq(sm_claim_op(c[2].kind), "!>");
    cr_expect_eq(sm_claims_parse("", c, 4), 0);
    const char *bad[] = {"a>b>c", "a;b", ">b", "a>", "a!>", "!>b", "a>b;;c>d", " >b", "a~<b", "a!~b", "a>b;c>d;e>f;g>h;i>j"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(sm_claims_parse(bad[i], c, 4), -1, "'%s' was accepted", bad[i]);
    char longname[SM_CLAIM_NAME + 8];
    memset(longname, 'n', SM_CLAIM_NAME - 1);
    strcpy(longname + SM_CLAIM_NAME - 1, ">b");
    cr_expect_eq(sm_claims_parse(longname, c, 4), 1, "a name of %d characters fits", SM_CLAIM_NAME - 1);
    memset(longname, 'n', SM_CLAIM_NAME);
    strcpy(longname + SM_CLAIM_NAME, ">b");
    cr_expect_eq(sm_claims_parse(longname, c, 4), -1, "a name of %d characters does not", SM_CLAIM_NAME);
}
