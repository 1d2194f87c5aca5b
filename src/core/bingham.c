/* The Bingham normalising constant c(lambda) on S^{p-1}: Kume-Wood saddle points, Monte Carlo, and
 * the exact two-level value (see bingham.h).
 *
 * Saddle points (Kume & Wood 2005, GrMoE App. B). For lambda_i > 0 let y_i ~ N(0, 1/(2 lambda_i))
 * independently and r = sum_i y_i^2. Writing y in polar form gives
 *     c(lambda) = 2 pi^{p/2} prod_i lambda_i^{-1/2} f_r(1),
 * with f_r the density of r. r has cumulant generating function
 *     K(t) = -1/2 sum_i log(1 - t / lambda_i),   t < min lambda,
 *     K^{(j)}(t) = (j-1)!/2 sum_i (lambda_i - t)^{-j},
 * and the saddle-point density f_r(1) ~ (2 pi K''(t))^{-1/2} exp(K(t) - t) at the root t of K'(t) = 1
 * gives the first-order approximation
 *     c1 = 2^{1/2} pi^{(p-1)/2} K''(t)^{-1/2} prod_i (lambda_i - t)^{-1/2} exp(-t),
 * refined by T = rho4/8 - 5 rho3^2/24, rho_j = K^{(j)}(t) / K''(t)^{j/2}:
 *     c2 = c1 (1 + T),   c3 = c1 exp(T).
 *
 * The derivation needs lambda > 0, so lambda is first shifted: c(lambda) = exp(s) c(lambda + s) holds
 * exactly (x^T x = 1 on the sphere), and we take s = 1 - min lambda so the shifted minimum is 1. Any
 * s giving a positive minimum would do: every quantity above depends on lambda_i - t only, and the
 * root t moves with the shift, so c1, c2, c3 are exactly shift-equivariant like c itself; the choice
 * of s only fixes where the arithmetic happens. Hence also the approximations for GrMoE's negative
 * lambda = -kappa are well defined.
 *
 * Everything is accumulated as a log: for p in the hundreds c over- or underflows a double.
 */
#include "specmoe/core/bingham.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#define LOG_PI 1.1447298858494002 /* log(pi) */
#define LOG_2 0.6931471805599453
/* |lambda_i| above this is refused: differences lambda_i - lambda_j must stay finite. */
#define LAMBDA_MAX 1e100

double sm_sphere_log_area(int p) {
    if (p < 1) return NAN;
    return LOG_2 + 0.5 * p * LOG_PI - lgamma(0.5 * p);
}

static sm_status check_lambda(const char *fn, const double *lambda, int p, sm_error *err) {
    if (p < 1) return sm_fail(err, SM_ERR_ARG, "%s: dimension p = %d, need p >= 1", fn, p);
    if (!lambda) return sm_fail(err, SM_ERR_ARG, "%s: lambda is NULL", fn);
    for (int i = 0; i < p; i++)
        if (!isfinite(lambda[i]) || fabs(lambda[i]) > LAMBDA_MAX)
            return sm_fail(err, SM_ERR_ARG, "%s: lambda[%d] = %g, need a finite value with |lambda| <= %g", fn, i,
                           lambda[i], LAMBDA_MAX);
    return SM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Kume-Wood saddle point */

/* K'(t) and K''(t) for the shifted lambda (lambda_i - t = lam[i] - t > 0). */
static void cgf_12(const double *lam, int p, double t, double *k1, double *k2) {
    double s1 = 0, s2 = 0;
    for (int i = 0; i < p; i++) {
        double a = 1.0 / (lam[i] - t);
        s1 += a;
        s2 += a * a;
    }
    *k1 = 0.5 * s1;
    *k2 = 0.5 * s2;
}

/* The root t < min lam of K'(t) = sum_i 1 / (2 (lam_i - t)) = 1, for min lam = 1.
 *
 * The root lies in [1 - p/2, 1/2]: K'(t) >= 1 / (2 (1 - t)) is >= 1 at t = 1/2, and K'(t) <= p / (2 (1 - t))
 * is <= 1 at t = 1 - p/2. Newton is run on phi(t) = 1/K'(t) - 1 rather than on K'(t) - 1: 1/K'(t) is
 * (twice) the harmonic mean of the lam_i - t, which is concave in t, so Newton from the right end
 * t = 1/2 (the starting point of the reference notes) decreases monotonically onto the root without
 * overshooting, and is exact in one step when all lam_i are equal (where K'(t) - 1 would need
 * ~log2(p) steps to get going). A bracket and a bisection fallback guard against rounding. */
static double saddle_root(const double *lam, int p) {
    double lo = 1.0 - 0.5 * p, hi = 0.5, t = hi;
    for (int it = 0; it < 200; it++) {
        double k1, k2;
        cgf_12(lam, p, t, &k1, &k2);
        /* done once K'(t) - 1 is at the rounding level of the sum K'(t) itself (p eps, relative):
         * closer is noise, and Newton would only cycle between neighbouring doubles */
        if (fabs(k1 - 1.0) <= p * DBL_EPSILON) return t;
        if (k1 > 1.0) hi = t;
        else lo = t;
        double tn = t + k1 * (1.0 - k1) / k2; /* Newton step on phi: t - phi / phi', phi' = -K''/K'^2 */
        if (!(tn >= lo && tn <= hi)) tn = 0.5 * (lo + hi);
        double tol = 4 * DBL_EPSILON * fmax(1.0, fabs(t));
        if (fabs(tn - t) <= tol || hi - lo <= tol) return tn;
        t = tn;
    }
    return t; /* not reached: the bracket [1 - p/2, 1/2] alone would be below tol long before */
}

sm_status sm_bingham_logc_saddle(const double *lambda, int p, double out_logc[3], sm_error *err) {
    sm_status st = check_lambda("bingham saddle point", lambda, p, err);
    if (st != SM_OK) return st;
    if (!out_logc) return sm_fail(err, SM_ERR_ARG, "bingham saddle point: out_logc is NULL");
    double lmin = lambda[0];
    for (int i = 1; i < p; i++) lmin = fmin(lmin, lambda[i]);
    double *lam = malloc((size_t)p * sizeof *lam); /* shifted lambda, min 1 */
    if (!lam) return sm_fail(err, SM_ERR_NOMEM, "bingham saddle point: out of memory for p = %d", p);
    double shift = 1.0 - lmin; /* c(lambda) = exp(shift) c(lambda + shift) */
    for (int i = 0; i < p; i++) lam[i] = 1.0 + (lambda[i] - lmin);

    double t = saddle_root(lam, p);
    /* cumulant derivatives at the root: K^{(j)}(t) = (j-1)!/2 sum_i u_i^{-j}, u_i = lam_i - t */
    double sum_log_u = 0, s2 = 0, s3 = 0, s4 = 0;
    for (int i = 0; i < p; i++) {
        double u = lam[i] - t, a = 1.0 / u, a2 = a * a;
        sum_log_u += log(u);
        s2 += a2;
        s3 += a2 * a;
        s4 += a2 * a2;
    }
    free(lam);
    double k2 = 0.5 * s2, k3 = s3, k4 = 3.0 * s4;
    double rho3 = k3 / pow(k2, 1.5), rho4 = k4 / (k2 * k2);
    /* T >= -1/6 always (Cauchy-Schwarz gives rho3^2 <= 2 rho4 / 3 and rho4 <= 12), so 1 + T > 0 */
    double T = rho4 / 8.0 - 5.0 * rho3 * rho3 / 24.0;
    double log_c1 = 0.5 * LOG_2 + 0.5 * (p - 1) * LOG_PI - 0.5 * log(k2) - 0.5 * sum_log_u - t + shift;
    out_logc[0] = log_c1;
    out_logc[1] = log_c1 + log1p(T);
    out_logc[2] = log_c1 + T;
    if (!isfinite(out_logc[0]) || !isfinite(out_logc[1]) || !isfinite(out_logc[2]))
        return sm_fail(err, SM_ERR_NUMERIC, "bingham saddle point: non-finite result (log c1 = %g, T = %g)", log_c1,
                       T);
    return SM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Monte Carlo */

sm_status sm_bingham_logc_mc(const double *lambda, int p, long samples, sm_rng *rng, double *logc, double *rel_se,
                             sm_error *err) {
    sm_status st = check_lambda("bingham monte carlo", lambda, p, err);
    if (st != SM_OK) return st;
    if (samples < 1) return sm_fail(err, SM_ERR_ARG, "bingham monte carlo: samples = %ld, need >= 1", samples);
    if (!rng || !logc) return sm_fail(err, SM_ERR_ARG, "bingham monte carlo: rng and logc must not be NULL");
    /* w = exp(f), f = -x^T diag(lambda) x. The running mean and sum of squared deviations of w
     * (Welford's update, which keeps the variance accurate when all w are nearly equal) are kept in
     * units of exp(fbig), fbig the largest f seen so far, and rescaled when fbig grows: log-sum-exp
     * in streaming form, so neither large nor small exponents over- or underflow. */
    double fbig = -INFINITY, mean = 0, m2 = 0;
    for (long n = 0; n < samples; n++) {
        double r2 = 0, q = 0;
        /* x = g / |g| with g standard normal is uniform on the sphere. The normals come in pairs
         * from Marsaglia's polar method (no trigonometry, both halves used): the draws dominate the
         * cost of this loop. */
        for (int i = 0; i < p; i += 2) {
            double a, b, s2;
            do {
                a = 2.0 * sm_rng_uniform(rng) - 1.0;
                b = 2.0 * sm_rng_uniform(rng) - 1.0;
                s2 = a * a + b * b;
            } while (s2 >= 1.0 || s2 == 0.0);
            double m = sqrt(-2.0 * log(s2) / s2), g0 = a * m, g1 = b * m;
            r2 += g0 * g0;
            q += lambda[i] * g0 * g0;
            if (i + 1 < p) {
                r2 += g1 * g1;
                q += lambda[i + 1] * g1 * g1;
            }
        }
        if (r2 == 0) { /* probability ~0; a direction is undefined, draw again */
            n--;
            continue;
        }
        double f = -q / r2;
        if (f > fbig) {
            double sc = exp(fbig - f); /* 0 on the first sample */
            mean *= sc;
            m2 *= sc * sc;
            fbig = f;
        }
        double w = exp(f - fbig), delta = w - mean;
        mean += delta / (double)(n + 1);
        m2 += delta * (w - mean);
    }
    *logc = sm_sphere_log_area(p) + fbig + log(mean);
    if (rel_se) {
        double nn = (double)samples;
        /* standard error of the mean of w over the mean: sample variance m2 / (n - 1) */
        *rel_se = samples < 2 ? INFINITY : sqrt(fmax(m2, 0.0) / (nn - 1.0) / nn) / mean;
    }
    return SM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* exact, lambda with at most two distinct values */

/* log 1F1(a; b; z) for 0 < a <= b and z >= 0 from Kummer's series sum_n (a)_n / (b)_n z^n / n!. All terms
 * are positive; the running sum is rescaled by 1e-280 whenever it passes 1e280 so large z cannot
 * overflow. The term ratio (a+n) z / ((b+n)(n+1)) <= z / (n+1), so the series turns down after
 * n ~ z and stops once the geometric bound on the tail is below 1e-17 of the sum. */
static double log_kummer_1f1(double a, double b, double z) {
    double sum = 1, term = 1, log_scale = 0;
    for (long n = 0;; n++) {
        double r = (a + n) * z / ((b + n) * (n + 1));
        term *= r;
        sum += term;
        if (sum > 1e280) {
            sum *= 1e-280;
            term *= 1e-280;
            log_scale += 280 * 2.302585092994046;
        }
        if (r < 1 && term * r / (1 - r) <= 1e-17 * sum) break;
        if (term == 0) break;
    }
    return log_scale + log(sum);
}

sm_status sm_bingham_logc_two_level(const double *lambda, int p, double *logc, sm_error *err) {
    sm_status st = check_lambda("bingham two-level", lambda, p, err);
    if (st != SM_OK) return st;
    if (!logc) return sm_fail(err, SM_ERR_ARG, "bingham two-level: logc is NULL");
    double lo = lambda[0], hi = lambda[0];
    for (int i = 1; i < p; i++) {
        lo = fmin(lo, lambda[i]);
        hi = fmax(hi, lambda[i]);
    }
    int k_lo = 0;
    for (int i = 0; i < p; i++) {
        if (lambda[i] == lo) k_lo++;
        else if (lambda[i] != hi)
            return sm_fail(err, SM_ERR_ARG,
                           "bingham two-level: lambda[%d] = %g is a third distinct value (besides %g and %g); the "
                           "exact formula needs at most two",
                           i, lambda[i], lo, hi);
    }
    double z = hi - lo;
    if (z > 1e7)
        return sm_fail(err, SM_ERR_ARG, "bingham two-level: spread max - min lambda = %g is above 1e7 (series too long)",
                       z);
    /* sum_{lambda_i = lo} x_i^2 = B ~ Beta(k_lo/2, (p-k_lo)/2) for x uniform on the sphere, and
     * x^T diag(lambda) x = hi - z B, so c = |S| exp(-hi) E exp(z B) = |S| exp(-hi) 1F1(k_lo/2; p/2; z). */
    double l1f1 = z > 0 ? log_kummer_1f1(0.5 * k_lo, 0.5 * p, z) : 0.0;
    *logc = sm_sphere_log_area(p) - hi + l1f1;
    return SM_OK;
}

sm_status sm_bingham_grmoe_lambda(double *lambda, int d, int k_r, double kappa, sm_error *err) {
    if (d < 1 || k_r < 1 || k_r > d)
        return sm_fail(err, SM_ERR_ARG, "bingham grmoe lambda: need 1 <= k_r <= d, got d = %d, k_r = %d", d, k_r);
    if (!isfinite(kappa) || fabs(kappa) > LAMBDA_MAX)
        return sm_fail(err, SM_ERR_ARG, "bingham grmoe lambda: kappa = %g, need a finite value with |kappa| <= %g", kappa,
                       LAMBDA_MAX);
    if (!lambda) return sm_fail(err, SM_ERR_ARG, "bingham grmoe lambda: lambda is NULL");
    for (int i = 0; i < d; i++) lambda[i] = i < k_r ? -kappa : 0.0;
    return SM_OK;
}
