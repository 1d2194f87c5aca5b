/* The Bingham normalising constant on the unit sphere S^{p-1} (GrMoE Sec. 2.3, App. B, Sec. 6.4.4):
 *
 *     c(lambda) = integral over S^{p-1} of exp(-sum_i lambda_i x_i^2) dS(x)
 *
 * with dS the surface measure, so c(0) = |S^{p-1}| = 2 pi^{p/2} / Gamma(p/2). Everything is returned
 * as log c: for p in the hundreds c itself overflows a double.
 *
 * Three estimators:
 *   - the Kume & Wood (2005) saddle-point approximations of first, second and third order
 *     (sm_bingham_logc_saddle), the one GrMoE uses;
 *   - Monte Carlo over uniform points on the sphere, with its relative standard error
 *     (sm_bingham_logc_mc), GrMoE's validation (Sec. 6.4.4: 10^6 samples);
 *   - the exact value when lambda takes at most two distinct values (sm_bingham_logc_two_level), a
 *     Kummer function 1F1 evaluated by its positive series. GrMoE's expert densities are of this
 *     form: exp(+kappa ||U^T x||^2) with a rank-k_r frame U is lambda = (-kappa x k_r, 0 x (d - k_r)).
 *
 * Example (GrMoE, d = 16, k_r = 4, kappa = 2):
 *
 *   double lambda[16], logc[3], exact;
 *   sm_error err;
 *   sm_bingham_grmoe_lambda(lambda, 16, 4, 2.0, &err);
 *   sm_bingham_logc_saddle(lambda, 16, logc, &err);          // logc[2]: third order
 *   sm_bingham_logc_two_level(lambda, 16, &exact, &err);     // exact for this lambda
 */
#ifndef SPECMOE_BINGHAM_H
#define SPECMOE_BINGHAM_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* log |S^{p-1}| = log(2 pi^{p/2} / Gamma(p/2)), the log surface area of the unit sphere in R^p. */
double sm_sphere_log_area(int p);

/* Every function below refuses (SM_ERR_ARG, with a message naming the entry) p < 1, a NULL pointer,
 * and a lambda_i that is not finite or has |lambda_i| > 1e100 (differences of lambdas must stay finite). */

/* Kume-Wood saddle-point approximations of log c(lambda): out_logc[0] first order, [1] second order
 * (c1 (1 + T)), [2] third order (c1 exp(T)). Any lambda (negative entries included) and any p >= 1;
 * cost O(p) per Newton step, a handful of steps. The approximations are exactly shift-equivariant,
 * c(lambda + s) = exp(-s) c(lambda), as the true constant is. 1 + T >= 5/6 always, so the second
 * order is always defined. SM_ERR_NOMEM if the p-double scratch cannot be allocated. */
sm_status sm_bingham_logc_saddle(const double *lambda, int p, double out_logc[3], sm_error *err);

/* Monte Carlo estimate of log c(lambda) from `samples` uniform points on S^{p-1} (normalised
 * Gaussian vectors drawn from rng): log(|S^{p-1}| * mean exp(-x^T diag(lambda) x)). *rel_se is the
 * relative standard error of the estimate of c (not of log c); rel_se may be NULL. The mean is
 * accumulated relative to a running maximum of the exponent, so nothing overflows. */
sm_status sm_bingham_logc_mc(const double *lambda, int p, long samples, sm_rng *rng, double *logc, double *rel_se,
                             sm_error *err);

/* Exact log c(lambda) when lambda takes at most two distinct values (an all-equal lambda is
 * accepted too): with lo < hi of multiplicities k_lo, k_hi,
 *     c = |S^{p-1}| exp(-hi) 1F1(k_lo/2; p/2; hi - lo),
 * because sum_{i in lo} x_i^2 is Beta(k_lo/2, k_hi/2) on the sphere and E exp(z B) = 1F1(a; a+b; z).
 * The series has positive terms only. SM_ERR_ARG if lambda has three or more distinct values, is
 * not finite, or hi - lo > 1e7 (the series would need too many terms). */
sm_status sm_bingham_logc_two_level(const double *lambda, int p, double *logc, sm_error *err);

/* GrMoE's expert density exp(+kappa ||U^T x||^2) on S^{d-1}, U a d x k_r orthonormal frame, as a
 * Bingham lambda in the eigenbasis of U U^T: lambda = (-kappa repeated k_r times, 0 repeated
 * d - k_r times). lambda has d entries. SM_ERR_ARG unless 1 <= k_r <= d and kappa is finite. */
sm_status sm_bingham_grmoe_lambda(double *lambda, int d, int k_r, double kappa, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
