/* SR-MoE (Spectral regularisation of stacked prototype-routed MoE stages).
 *
 *   router       src/methods/srmoe/router_prototype.c: w_i = softmax(-dist(z', mu_i) / tau) (Eq. 2)
 *   penalties    src/methods/srmoe/srmoe.c: on each MoE stage's gate matrix W (the linear map feeding
 *                the router, or the prototype matrix) alpha [(sigma_max(W) - sigma_t)^2 +
 *                (srank(W) - rho_t)^2] (Eq. 3-5) and beta CV^2 of the batch-mean routing weights (Eq. 6),
 *                attached to a classifier whose config sets spectral_alpha / diversity_beta
 *   the stack    sm_model_arch_srmoe (model.h): conv stem -> stages of dense, LayerNorm, MoE
 *   surgical     src/methods/srmoe/surgical.c: the one-shot "surgical" update (Sec. 4.3, Fig. 1) keeps
 *                only the gradient of the experts on a sample's active chain
 *
 * A surgical one-shot update (what `specmoe bench oneshot` does per novel image):
 *
 *   sm_params_zero_grad(&m->params);
 *   sm_model_forward(m, x, B, rng, 1);          // row 0: the novel image, rows 1..B-1: anchors
 *   sm_model_loss(m, y, NULL, B);                // Eq. 7: CE + the penalties m was built with
 *   sm_model_backward(m, B);
 *   int path[SM_MAX_LAYERS];
 *   sm_srmoe_active_chain(m, 0, path);           // per stage the top-1 expert of row 0
 *   sm_srmoe_surgical_mask(m, path, &err);       // every other gradient entry := 0
 *   sm_optim_step(&opt, &m->params, lr);         // SGD: nothing outside the chain moves
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

/* The active expert chain of row t of the last forward of m (SR-MoE Fig. 1's blue path): for the
 * i-th MoE layer, path[i] = argmax_e of its routing probabilities (route.probs row t; a top-k
 * router's largest pick). path has sm_model_n_moe(m) entries; returns that number. */
int sm_srmoe_active_chain(const sm_model *m, int t, int *path);

/* The surgical gradient (SR-MoE Sec. 4.3: "backpropagating only through the active expert chain"):
 * in m->params.grad keeps the slices of expert path[i] of the i-th MoE layer (w1, b1, the deeper
 * hidden layers wh, bh, w2, b2) and sets every other entry to zero - routers, prototypes, local
 * processors, stem, head, shared experts and the other experts. What remains is the exact partial
 * derivative of the loss with respect to the chain's expert parameters (the backward still passes
 * through every expert to reach earlier stages, as autograd does with the other parameters frozen).
 * A plain SGD step (no momentum, no weight decay) on the masked gradient then leaves every parameter
 * outside the chain bit for bit unchanged. Refused (SM_ERR_ARG) for factory experts, whose parameter
 * layout is the module's, or a path entry out of range. */
sm_status sm_srmoe_surgical_mask(sm_model *m, const int *path, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
