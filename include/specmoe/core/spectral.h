/* Spectral penalties (SR-MoE Eq. 3-6) usable on any weight matrix W (m, n) of any model, and
 * matrix diagnostics.
 *
 *   spectral norm   weight * (sigma_max(W) - sigma_t)^2        sigma_max by power iteration with
 *                   persistent vectors u (m), v (n); d sigma / dW = u v^T (Miyato et al. 2018)
 *   stable rank     weight * (||W||_F^2 / sigma_max^2 - rho_t)^2, exact gradient
 *                   d sr / dW = 2 W / sigma^2 - 2 ||W||_F^2 / sigma^3 u v^T
 *   diversity       weight * (std(P) / mean(P))^2 of the batch-mean routing weights P (E) (Eq. 6),
 *                   gradient into route->dprobs, which every router's backward consumes
 *
 * Letters: m rows, n columns, T tokens, E experts.
 */
#ifndef SPECMOE_SPECTRAL_H
#define SPECMOE_SPECTRAL_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int m, n;
    sm_real *u; /* (m) left singular vector estimate, persistent across steps */
    sm_real *v; /* (n) right */
    sm_real *work; /* (max(m,n)) */
} sm_power_iter;

sm_status sm_power_iter_init(sm_power_iter *p, int m, int n, sm_rng *rng, sm_error *err);
void sm_power_iter_free(sm_power_iter *p);
/* iters rounds of v <- W^T u / ||.||, u <- W v / ||.||; returns sigma = u^T W v. */
double sm_power_iter_run(sm_power_iter *p, const sm_real *W, int iters);

/* Both return the penalty value and accumulate weight * gradient into dW (may be NULL). They run
 * `iters` power iterations first (1 per training step is the usual choice). */
double sm_spectral_norm_penalty(sm_power_iter *p, const sm_real *W, sm_real *dW, double sigma_t, double weight,
                                int iters);
double sm_stable_rank_penalty(sm_power_iter *p, const sm_real *W, sm_real *dW, double rho_t, double weight, int iters);
/* probs (T,E) -> penalty; dprobs (T,E) += weight * gradient (may be NULL). */
double sm_diversity_penalty(const sm_real *probs, sm_real *dprobs, int T, int E, double weight);

/* Singular values of W (m,n) in descending order into sv (min(m,n)), by LAPACKE gesdd. */
sm_status sm_singular_values(const sm_real *W, int m, int n, double *sv, sm_error *err);
/* exp(-sum p_i log p_i) with p_i = s_i / sum s (the spectral-entropy effective rank, Roy & Vetterli). */
double sm_effective_rank(const double *sv, int n);

#ifdef __cplusplus
}
#endif
#endif
