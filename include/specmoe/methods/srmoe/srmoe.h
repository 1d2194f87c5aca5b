/* SR-MoE (Spectral regularisation of stacked prototype-routed MoE stages).
 *
 *   router       src/methods/srmoe/router_prototype.c: w_i = softmax(-dist(z', mu_i) / tau) (Eq. 2)
 *   penalties    src/methods/srmoe/srmoe.c: on each MoE stage's gate matrix W (the linear map feeding
 *                the router, or the prototype matrix) alpha [(sigma_max(W) - sigma_t)^2 +
 *                (srank(W) - rho_t)^2] (Eq. 3-5) and beta CV^2 of the batch-mean routing weights (Eq. 6),
 *                attached to a classifier whose config sets spectral_alpha / diversity_beta
 *   the stack    sm_model_arch_srmoe (model.h): conv stem -> stages of dense, LayerNorm, MoE
 * The penalty kernels themselves are generic (include/specmoe/core/spectral.h).
 */
#ifndef SPECMOE_SRMOE_H
#define SPECMOE_SRMOE_H

#include "specmoe/nn/penalty.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The own options of the "prototype" router (SR-MoE Eq. 2; src/methods/srmoe/router_prototype.c):
 * logits -dist(z, mu_e), gate temperature tau (the shared temperature field, flag --tau). */
typedef struct {
    int proto_sq; /* squared Euclidean distance instead of Euclidean */
} sm_proto_router_opts;
/* sm_proto_opts(cfg): the accessor (cfg must name this router) */
SM_ROUTER_OWN_ACCESSOR(sm_proto_router_opts, sm_proto_opts)

/* power iterations per step of the SR-MoE penalty attached to m (1 by default; the gradient checks
 * converge them); no effect when m has none */
void sm_srmoe_set_power_iters(sm_model *m, int iters);

#ifdef __cplusplus
}
#endif
#endif
