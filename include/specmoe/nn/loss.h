/* Losses computed outside the network: each returns its value and WRITES (=, not +=) the gradient
 * with respect to the network's output, scaled by `scale` (1 for a plain loss; a weight when a
 * caller mixes several). The network's backward then starts from that gradient
 * (sm_module_backward). Reinforcement-learning losses (TD / C51 targets, PPO's clipped surrogate,
 * Gaussian log-likelihood) follow the same contract.
 *
 * Letters: N rows, V classes, F outputs per row.
 */
#ifndef SPECMOE_LOSS_H
#define SPECMOE_LOSS_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mean cross-entropy of logits (N,V) against y (N); mask (V) or NULL excludes classes from the
 * softmax (task-incremental class masking). probs (N,V) and losses (N) are outputs too. */
double sm_loss_crossentropy(sm_real *dlogits, sm_real *probs, sm_real *losses, const sm_real *logits, const int *y,
                            const unsigned char *mask, int N, int V, sm_real scale);
/* Mean over the N*F elements of (pred - target)^2. */
double sm_loss_mse(sm_real *dpred, const sm_real *pred, const sm_real *target, int N, int F, sm_real scale);
/* Mean over the N*F elements of the Huber loss with threshold delta (torch.nn.HuberLoss):
 * 0.5 d^2 for |d| <= delta, delta (|d| - delta / 2) beyond, d = pred - target. */
double sm_loss_huber(sm_real *dpred, const sm_real *pred, const sm_real *target, int N, int F, double delta,
                     sm_real scale);

#ifdef __cplusplus
}
#endif
#endif
