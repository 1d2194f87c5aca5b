/* The synthetic routing task of GrMoE (Sec. 6.1, Table 1): N ground-truth subspaces P_e of rank k_r
 * in R^d with mean pairwise overlap ||U_e^T U_e'||_F^2 / k_r = rho*, tokens
 *   x ~ sum_e pi_e N(0, P_e + sigma^2 (I - P_e))        (uniform pi)
 * and, because the paper does not say what the experts learn, a fixed random teacher per component,
 * y = W*_e x (d -> out), so every method trains the same experts on the same regression and the
 * routers differ only in routing (documented in BENCHMARKS.md).
 *
 * Construction of the subspaces: private frames Q_e (mutually orthogonal blocks of a Haar
 * orthogonal matrix when N k_r <= d, independent Haar frames otherwise) are tilted toward one shared
 * Haar frame S: U_e = orth(cos(theta) Q_e + sin(theta) S); theta is found by bisection so that the
 * mean pairwise overlap equals rho* (theta = 0 gives the private frames' overlap, pi/2 gives 1).
 *
 * Letters: N components, d width, R = k_r, O = out width, T tokens.
 */
#ifndef SPECMOE_SYNTH_H
#define SPECMOE_SYNTH_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int N, d, kr, out;
    double rho;     /* target mean pairwise overlap / k_r */
    double sigma2;  /* noise variance outside the component's subspace */
} sm_synth_config;

/* "easy" (rho 0.1, sigma^2 0.1) or "hard" (rho 0.4, sigma^2 0.5), N = 8, d = 128, k_r = 16, out 16. */
sm_status sm_synth_setting(sm_synth_config *c, const char *name, sm_error *err);

typedef struct {
    sm_synth_config cfg;
    double overlap;  /* achieved mean pairwise overlap / k_r */
    sm_real *U;      /* (N, R, d) frames, rows orthonormal */
    sm_real *W;      /* (N, O, d) teachers */
} sm_synth;

sm_status sm_synth_create(sm_synth *s, const sm_synth_config *c, sm_rng *rng, sm_error *err);
void sm_synth_free(sm_synth *s);
/* T tokens: x (T,d), targets y (T,O), ground-truth components comp (T). */
void sm_synth_sample(const sm_synth *s, float *x, float *y, int *comp, int T, sm_rng *rng);
/* Mean over pairs of ||U_a^T U_b||_F^2 / k_r for frames (N, R, d). */
double sm_mean_overlap(const sm_real *U, int N, int R, int d);

/* Mean and the half-width of its 95% confidence interval (Student t) of n values. */
void sm_mean_ci95(const double *x, int n, double *mean, double *half);

#ifdef __cplusplus
}
#endif
#endif
