/* Resets and shrink-and-perturb of MoE experts ("Don't Flatten, Tokenize!", Sec. 6 and App. B.5.2):
 * to improve expert utilisation the paper periodically resets experts - all of them, or the ones
 * with the highest fraction of dormant neurons - with or without the router (Fig. 20), or shrinks
 * and perturbs them (Ash & Adams 2020, as D'Oro et al. 2022 and Schwarzer et al. 2023 use it, with
 * (0.5, 0.5)):
 *
 *   theta_e <- shrink * theta_e + perturb * phi_e,   phi a fresh draw of the initialiser
 *
 * (a reset is shrink 0, perturb 1). The optimiser's moments of every value touched are cleared.
 * The pieces used elsewhere: dormant fractions per expert (sm_model_dormant), expert tensors laid out
 * (E, ...) by the MoE layer (include/specmoe/nn/moe.h).
 */
#ifndef SPECMOE_SOFTMOE_RL_RESET_H
#define SPECMOE_SOFTMOE_RL_RESET_H

#include "specmoe/core/optim.h"
#include "specmoe/nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Shrinks and perturbs the experts listed in experts (n of them; NULL: all E) of MoE layer `layer`
 * of m (its index among the layers; -1: every MoE layer) - the slice of each tensor "layers.<i>.experts.*" (shared experts excluded) - and, with router,
 * every tensor "layers.<i>.router.*" whole. opt (may be NULL) gets its moments of those values
 * zeroed. Returns the number of values changed. */
size_t sm_moe_shrink_perturb(sm_model *m, sm_optim *opt, int layer, const int *experts, int n, int router,
                             double shrink, double perturb, sm_rng *rng);

/* The k experts of MoE layer l with the highest fraction of dormant units among the n entries of
 * sm_model_dormant (computed once for every layer), into out (ties: the lower index); returns how
 * many. */
int sm_moe_most_dormant(const sm_dormant_entry *e, int n, int l, int k, int *out);

/* Pruning experts ("Don't Flatten, Tokenize!" App., Fig. 19: two of SoftMoE-4's experts pruned
 * during training, once or gradually, or at evaluation): in every MoE layer of m the last n experts
 * (E - n .. E - 1; experts are exchangeable at initialisation, so which ones does not matter) take no
 * part any more - the router gives them no tokens or slots and they get no gradient; n = 0 restores
 * them all. Their parameters stay, so checkpoints keep their shapes. Refused, with nothing changed,
 * if a layer's router cannot prune (its set_active is NULL: the soft router can) or n >= E. */
sm_status sm_model_prune_last(sm_model *m, int n, sm_error *err);

/* The experts pruned by frame f under the schedule of sm_dqn_config's prune_* options: n experts,
 * the k-th (k = 1..n) at frame from + (k - 1) (to - from) / (n - 1) (all at `from` when n = 1 or
 * from = to); 0 before `from`. */
int sm_prune_count(int n, long from, long to, long f);

#ifdef __cplusplus
}
#endif
#endif
