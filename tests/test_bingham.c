/* Bingham normalising constant: closed forms, exact identities of the saddle point, shift
 * equivariance, the exact two-level formula, Monte Carlo, GrMoE's validation (Sec. 6.4.4) and input
 * rejection. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "specmoe/core/bingham.h"

#define PI 3.14159265358979323846

/* I0(x) by its power series (x small here). */
static double bessel_i0(double x) {
    double s = 1, t = 1, q = 0.25 * x * x;
    for (int k = 1; k < 200; k++) {
        t *= q / ((double)k * k);
        s += t;
        if (t < 1e-18 * s) break;
    }
    return s;
}

/* log of c for p = 2: 2 pi exp(-(l1 + l2)/2) I0((l1 - l2)/2) (the integral over the circle). */
static double logc_p2(double l1, double l2) { return log(2 * PI) - 0.5 * (l1 + l2) + log(bessel_i0(0.5 * (l1 - l2))); }

static void expect_close(double got, double want, double tol, const char *what) {
    cr_expect(fabs(got - want) <= tol, "%s: got %.15g, want %.15g (|diff| %.3g > %.3g)", what, got, want,
              fabs(got - want), tol);
}

Test(bingham, sphere_area) {
    expect_close(sm_sphere_log_area(1), log(2.0), 1e-15, "|S^0|");
    expect_close(sm_sphere_log_area(2), log(2 * PI), 1e-15, "|S^1|");
    expect_close(sm_sphere_log_area(3), log(4 * PI), 1e-15, "|S^2|");
    expect_close(sm_sphere_log_area(4), log(2 * PI * PI), 1e-14, "|S^3|");
    expect_close(sm_sphere_log_area(5), log(8 * PI * PI / 3), 1e-14, "|S^4|");
    cr_expect(isnan(sm_sphere_log_area(0)));
}

/* For lambda = (a, ..., a) the saddle point has a closed form: with z = p/2, t = a - z, K'' = 2/p,
 * c1 / c = Gamma(z) / (sqrt(2 pi) z^{z - 1/2} e^{-z}) (Stirling's formula for Gamma), and T = -1/(6p).
 * Checks the whole formula (constants, root, cumulants) to rounding for p from 1 to 10^5. */
Test(bingham, saddle_equal_lambda_identities) {
    int ps[] = {1, 2, 3, 4, 5, 16, 33, 100, 1000, 100000};
    double as[] = {0, 2.5, -3, 1e4};
    static double lam[100000];
    for (size_t ip = 0; ip < sizeof ps / sizeof ps[0]; ip++) {
        for (size_t ia = 0; ia < sizeof as / sizeof as[0]; ia++) {
            int p = ps[ip];
            for (int i = 0; i < p; i++) lam[i] = as[ia];
            double lc[3];
            sm_error err = {0};
            cr_assert_eq(sm_bingham_logc_saddle(lam, p, lc, &err), SM_OK, "%s", err.msg);
            double z = 0.5 * p, exact = sm_sphere_log_area(p) - as[ia];
            double stirling_gap = lgamma(z) - (0.5 * log(2 * PI) + (z - 0.5) * log(z) - z);
            double tol = 1e-13 * (1 + fabs(exact) + fabs(lc[0]));
            char what[96];
            snprintf(what, sizeof what, "p %d a %g first order", p, as[ia]);
            expect_close(lc[0] - exact, stirling_gap, tol, what);
            /* differences of two logs of size |lc|: rounding ~ |lc| eps */
            double dtol = 1e-14 + 8 * DBL_EPSILON * fabs(lc[0]);
            snprintf(what, sizeof what, "p %d a %g second order", p, as[ia]);
            expect_close(lc[1] - lc[0], log1p(-1.0 / (6.0 * p)), dtol, what);
            snprintf(what, sizeof what, "p %d a %g third order", p, as[ia]);
            expect_close(lc[2] - lc[0], -1.0 / (6.0 * p), dtol, what);
        }
    }
}

Test(bingham, saddle_shift_equivariance) {
    sm_rng rng;
    sm_rng_seed(&rng, 42);
    double shifts[] = {-1000, -7.5, -1, 0.3, 1, 12, 1e4};
    for (int trial = 0; trial < 20; trial++) {
        int p = 1 + (int)sm_rng_below(&rng, 40);
        double lam[40], sh[40], base[3], moved[3];
        for (int i = 0; i < p; i++) lam[i] = 20 * sm_rng_uniform(&rng) - 10;
        cr_assert_eq(sm_bingham_logc_saddle(lam, p, base, NULL), SM_OK);
        for (size_t k = 0; k < sizeof shifts / sizeof shifts[0]; k++) {
            for (int i = 0; i < p; i++) sh[i] = lam[i] + shifts[k];
            cr_assert_eq(sm_bingham_logc_saddle(sh, p, moved, NULL), SM_OK);
            for (int o = 0; o < 3; o++) /* c(lambda + s) = exp(-s) c(lambda), to rounding of lambda + s */
                cr_expect(fabs(moved[o] - (base[o] - shifts[k])) <= 1e-12 * (1 + fabs(shifts[k])),
                          "p %d shift %g order %d: %.15g vs %.15g", p, shifts[k], o + 1, moved[o],
                          base[o] - shifts[k]);
        }
    }
}

Test(bingham, two_level_closed_forms) {
    double lc, lam[64];
    sm_error err = {0};
    /* lambda = 0: the sphere area; all equal a: exp(-a) area */
    for (int p = 1; p <= 64; p *= 2) {
        for (int i = 0; i < p; i++) lam[i] = 0;
        cr_assert_eq(sm_bingham_logc_two_level(lam, p, &lc, &err), SM_OK, "%s", err.msg);
        expect_close(lc, sm_sphere_log_area(p), 1e-13, "lambda = 0");
        for (int i = 0; i < p; i++) lam[i] = -2.75;
        cr_assert_eq(sm_bingham_logc_two_level(lam, p, &lc, &err), SM_OK, "%s", err.msg);
        expect_close(lc, sm_sphere_log_area(p) + 2.75, 1e-13, "lambda = a");
    }
    /* p = 1: S^0 = {-1, +1}, c = 2 exp(-lambda) */
    lam[0] = 3.25;
    cr_assert_eq(sm_bingham_logc_two_level(lam, 1, &lc, &err), SM_OK);
    expect_close(lc, log(2.0) - 3.25, 1e-14, "p = 1");
    /* p = 2: the Bessel closed form */
    double pairs[][2] = {{0, 1}, {1, 0}, {-3, 3}, {0, 20}, {2.5, -7}, {-40, 0}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        cr_assert_eq(sm_bingham_logc_two_level(pairs[k], 2, &lc, &err), SM_OK, "%s", err.msg);
        expect_close(lc, logc_p2(pairs[k][0], pairs[k][1]), 1e-12 * (1 + fabs(lc)), "p = 2 Bessel");
    }
    /* p = 3, lambda = (0, 0, b): c = 2 pi integral_{-1}^{1} exp(-b u^2) du = 2 pi^{3/2} erf(sqrt b) / sqrt b */
    double l3[3] = {0, 0, 4};
    cr_assert_eq(sm_bingham_logc_two_level(l3, 3, &lc, &err), SM_OK);
    expect_close(lc, log(2 * pow(PI, 1.5) * erf(2.0) / 2.0), 1e-13, "p = 3 erf");
    /* a large spread: the rescaled series must not overflow; compare with the p = 2 asymptotics
     * I0(x) ~ e^x / sqrt(2 pi x) (1 + 1/(8x)) */
    double big[2] = {-2e5, 0};
    cr_assert_eq(sm_bingham_logc_two_level(big, 2, &lc, &err), SM_OK, "%s", err.msg);
    double x = 1e5, asym = log(2 * PI) + 1e5 + x - 0.5 * log(2 * PI * x) + log1p(1 / (8 * x) + 9 / (128 * x * x));
    cr_expect(fabs(lc - asym) <= 1e-9 * fabs(asym), "large spread: %.15g vs %.15g", lc, asym);
}

Test(bingham, saddle_vs_closed_forms_small_p) {
    /* p = 2 is the hardest case for a saddle point (Kume & Wood's error decays with p); record that the
     * refinements help and stay within a few percent */
    double pairs[][2] = {{0, 1}, {-3, 3}, {0, 5}, {0, 20}, {-10, 0}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        double lc[3], exact = logc_p2(pairs[k][0], pairs[k][1]);
        cr_assert_eq(sm_bingham_logc_saddle(pairs[k], 2, lc, NULL), SM_OK);
        double e1 = fabs(expm1(lc[0] - exact)), e3 = fabs(expm1(lc[2] - exact));
        cr_expect(e3 < 0.03 && e3 < e1, "p = 2 lambda (%g, %g): first order %.3f%%, third order %.3f%%", pairs[k][0],
                  pairs[k][1], 100 * e1, 100 * e3);
    }
    /* large p: GrMoE-like lambda with d = 2000, k_r = 500 against the exact two-level value */
    static double lam[2000];
    sm_error err = {0};
    double kappas[] = {0.4, 4.2, 50};
    for (size_t k = 0; k < 3; k++) {
        cr_assert_eq(sm_bingham_grmoe_lambda(lam, 2000, 500, kappas[k], &err), SM_OK, "%s", err.msg);
        double lc[3], ex;
        cr_assert_eq(sm_bingham_logc_saddle(lam, 2000, lc, &err), SM_OK, "%s", err.msg);
        cr_assert_eq(sm_bingham_logc_two_level(lam, 2000, &ex, &err), SM_OK, "%s", err.msg);
        cr_expect(fabs(expm1(lc[2] - ex)) < 1e-5, "d 2000 kappa %g: third order %.3g relative error", kappas[k],
                  expm1(lc[2] - ex));
    }
}

Test(bingham, saddle_root_converges_everywhere) {
    /* extreme spreads and sizes: all three orders finite */
    static double lam[200000];
    sm_error err = {0};
    double lc[3];
    int p = 200000;
    for (int i = 0; i < p; i++) lam[i] = (i % 3 == 0) ? -1e6 : (i % 3 == 1 ? 0 : 1e8);
    cr_expect_eq(sm_bingham_logc_saddle(lam, p, lc, &err), SM_OK, "%s", err.msg);
    cr_expect(isfinite(lc[0]) && isfinite(lc[1]) && isfinite(lc[2]));
    double one[2][4] = {{1e99, -1e99, 0, 0}, {1e-300, 0, -1e-300, 5e-324}};
    for (int k = 0; k < 2; k++) {
        cr_expect_eq(sm_bingham_logc_saddle(one[k], 4, lc, &err), SM_OK, "%s", err.msg);
        cr_expect(isfinite(lc[0]) && isfinite(lc[1]) && isfinite(lc[2]), "case %d: %g %g %g", k, lc[0], lc[1], lc[2]);
    }
}

Test(bingham, monte_carlo_closed_forms) {
    sm_rng rng;
    sm_rng_seed(&rng, 9);
    double lam[8] = {0}, lc, se;
    sm_error err = {0};
    /* lambda = 0 and all-equal lambda: every weight is the same, so the estimate is exact */
    cr_assert_eq(sm_bingham_logc_mc(lam, 8, 1000, &rng, &lc, &se, &err), SM_OK, "%s", err.msg);
    expect_close(lc, sm_sphere_log_area(8), 1e-13, "MC lambda = 0");
    cr_expect_eq(se, 0.0);
    for (int i = 0; i < 7; i++) lam[i] = 1.5;
    cr_assert_eq(sm_bingham_logc_mc(lam, 7, 1000, &rng, &lc, &se, &err), SM_OK);
    expect_close(lc, sm_sphere_log_area(7) - 1.5, 1e-12, "MC lambda = a");
    cr_expect(se < 1e-12);
    lam[0] = -700; /* p = 1: x = +-1 */
    cr_assert_eq(sm_bingham_logc_mc(lam, 1, 10, &rng, &lc, &se, &err), SM_OK);
    expect_close(lc, log(2.0) + 700, 1e-12, "MC p = 1");
    /* p = 2 Bessel form: within 4.5 standard errors */
    double pairs[][2] = {{0, 3}, {-2, 1}, {-800, -805}};
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(sm_bingham_logc_mc(pairs[k], 2, 200000, &rng, &lc, &se, &err), SM_OK);
        double exact = logc_p2(pairs[k][0], pairs[k][1]), rel = expm1(lc - exact);
        cr_expect(fabs(rel) < 4.5 * se, "p = 2 (%g, %g): MC off by %.4f%% with rel. s.e. %.4f%%", pairs[k][0],
                  pairs[k][1], 100 * rel, 100 * se);
    }
    /* one sample: unknown spread */
    cr_assert_eq(sm_bingham_logc_mc(pairs[0], 2, 1, &rng, &lc, &se, &err), SM_OK);
    cr_expect(isinf(se));
    /* same seed, same bits */
    sm_rng a, b;
    sm_rng_seed(&a, 123);
    sm_rng_seed(&b, 123);
    double la, lb;
    sm_bingham_logc_mc(pairs[1], 2, 1000, &a, &la, NULL, NULL);
    sm_bingham_logc_mc(pairs[1], 2, 1000, &b, &lb, NULL, NULL);
    cr_expect(memcmp(&la, &lb, sizeof la) == 0);
}

/* GrMoE Sec. 6.4.4: at the learned concentrations kappa in [0.4, 4.2] the saddle-point Z is within 1.5%
 * of a 10^6-sample Monte Carlo estimate. Checked for d = 16, k_r = 4 (10^6 samples) and d = 32,
 * k_r = 8 (4 10^5 samples), where the MC relative standard error stays below 0.1%. The Monte Carlo
 * itself is checked against the exact two-level value (within 4.5 standard errors). Measured third-
 * order errors are below 0.1% (see `specmoe bingham-z`). */
static void grmoe_case(int d, int k_r, long samples, uint64_t seed) {
    double kappas[] = {0.4, 1, 2, 3, 4.2};
    double lam[64];
    sm_rng rng;
    sm_rng_seed(&rng, seed);
    sm_error err = {0};
    for (int k = 0; k < 5; k++) {
        cr_assert_eq(sm_bingham_grmoe_lambda(lam, d, k_r, kappas[k], &err), SM_OK, "%s", err.msg);
        double sp[3], mc, se, ex;
        cr_assert_eq(sm_bingham_logc_saddle(lam, d, sp, &err), SM_OK, "%s", err.msg);
        cr_assert_eq(sm_bingham_logc_mc(lam, d, samples, &rng, &mc, &se, &err), SM_OK, "%s", err.msg);
        cr_assert_eq(sm_bingham_logc_two_level(lam, d, &ex, &err), SM_OK, "%s", err.msg);
        double rel3 = expm1(sp[2] - mc), rel_mc = expm1(mc - ex);
        cr_expect(se < 0.002, "d %d k_r %d kappa %g: MC relative s.e. %.4f%%", d, k_r, kappas[k], 100 * se);
        cr_expect(fabs(rel3) < 0.015, "d %d k_r %d kappa %g: third order vs MC %.4f%% (bar 1.5%%)", d, k_r, kappas[k],
                  100 * rel3);
        cr_expect(fabs(rel_mc) < 4.5 * se, "d %d k_r %d kappa %g: MC vs exact %.4f%%, s.e. %.4f%%", d, k_r, kappas[k],
                  100 * rel_mc, 100 * se);
        cr_expect(fabs(expm1(sp[2] - ex)) < 0.015, "d %d k_r %d kappa %g: third order vs exact %.4f%%", d, k_r,
                  kappas[k], 100 * expm1(sp[2] - ex));
    }
}

Test(bingham, grmoe_validation_d16_kr4, .timeout = 60) { grmoe_case(16, 4, 1000000, 1); }
Test(bingham, grmoe_validation_d32_kr8, .timeout = 60) { grmoe_case(32, 8, 400000, 2); }

Test(bingham, rejects_bad_input) {
    double lam[4] = {0, 1, 2, 3}, lc3[3], lc, se;
    sm_rng rng;
    sm_rng_seed(&rng, 1);
    sm_error err = {0};
    cr_expect_eq(sm_bingham_logc_saddle(lam, 0, lc3, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "p = 0") != NULL, "%s", err.msg);
    cr_expect_eq(sm_bingham_logc_saddle(NULL, 4, lc3, &err), SM_ERR_ARG);
    cr_expect_eq(sm_bingham_logc_saddle(lam, 4, NULL, &err), SM_ERR_ARG);
    lam[2] = NAN;
    cr_expect_eq(sm_bingham_logc_saddle(lam, 4, lc3, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "lambda[2]") != NULL, "%s", err.msg);
    cr_expect_eq(sm_bingham_logc_mc(lam, 4, 10, &rng, &lc, &se, &err), SM_ERR_ARG);
    cr_expect_eq(sm_bingham_logc_two_level(lam, 4, &lc, &err), SM_ERR_ARG);
    lam[2] = -INFINITY;
    cr_expect_eq(sm_bingham_logc_saddle(lam, 4, lc3, &err), SM_ERR_ARG);
    lam[2] = 1e200;
    cr_expect_eq(sm_bingham_logc_saddle(lam, 4, lc3, &err), SM_ERR_ARG);
    lam[2] = 2;
    cr_expect_eq(sm_bingham_logc_mc(lam, 4, 0, &rng, &lc, &se, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "samples = 0") != NULL, "%s", err.msg);
    cr_expect_eq(sm_bingham_logc_mc(lam, 4, -5, &rng, &lc, &se, &err), SM_ERR_ARG);
    cr_expect_eq(sm_bingham_logc_mc(lam, 4, 10, NULL, &lc, &se, &err), SM_ERR_ARG);
    cr_expect_eq(sm_bingham_logc_mc(lam, -1, 10, &rng, &lc, &se, &err), SM_ERR_ARG);
    /* three distinct values have no two-level formula */
    cr_expect_eq(sm_bingham_logc_two_level(lam, 4, &lc, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "third distinct value") != NULL, "%s", err.msg);
    double wide[2] = {0, 2e7};
    cr_expect_eq(sm_bingham_logc_two_level(wide, 2, &lc, &err), SM_ERR_ARG);
    double g[8];
    cr_expect_eq(sm_bingham_grmoe_lambda(g, 8, 0, 1, &err), SM_ERR_ARG);
    cr_expect_eq(sm_bingham_grmoe_lambda(g, 8, 9, 1, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "k_r") != NULL, "%s", err.msg);
    cr_expect_eq(sm_bingham_grmoe_lambda(g, 8, 2, NAN, &err), SM_ERR_ARG);
    cr_expect_eq(sm_bingham_grmoe_lambda(g, 8, 2, 1.5, &err), SM_OK);
    cr_expect(g[0] == -1.5 && g[1] == -1.5 && g[2] == 0 && g[7] == 0);
}
