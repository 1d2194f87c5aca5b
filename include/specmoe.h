/* specmoe: Mixture-of-Experts networks with spectral routing and regularisation, in C11.
 *
 * A usage example (error handling shortened):
 *
 *   #include <specmoe.h>
 *
 *   sm_error err;
 *   sm_model_config cfg;
 *   sm_model_config_default(&cfg);                  // 784 -> dense:256 -> moe:256 (8 experts, top-2) -> 10
 *   cfg.moe.router.E = 8; cfg.moe.router.k = 2;
 *   sm_rng rng; sm_rng_seed(&rng, 1);
 *   sm_model *m = sm_model_create(&cfg, 128, &rng, &err);     // parameters in one block
 *
 *   sm_dataset train;
 *   sm_dataset_load_fashion(&train, NULL, "train", &err);      // Debian's dataset-fashion-mnist
 *
 *   sm_train_config tc; sm_train_config_default(&tc);
 *   sm_train_result res;
 *   if (sm_train(m, &train, NULL, &tc, NULL, NULL, &res, &err) != SM_OK) fprintf(stderr, "%s\n", err.msg);
 *   sm_checkpoint_save("model.safetensors", m, NULL, NULL, &err);
 *
 * Modules (include/specmoe/):
 *   core.h        status codes, errors, explicit RNG state
 *   ops.h         linear, activations, layernorm, softmax, cross-entropy, MSE (forward/backward)
 *   conv.h        conv2d (im2col + GEMM), max / average / adaptive average pooling
 *   spectral.h    SR-MoE spectral-norm, stable-rank and diversity penalties; SVD diagnostics
 *   synth.h       GrMoE's synthetic routing task
 *   ssmoe.h       SSMoE eigenvector descriptors of expert weights
 *   hf.h          Hugging Face MoE checkpoints: streamed reads, SSMoE descriptors, expert pruning
 *   mlp.h         the two-layer MLP expert
 *   router.h      the router interface every router implements (router_*.c): topk, switch,
 *                 expert-choice, hash, random, soft (SoftMoE), vmf, grassmann (GrMoE)
 *   stiefel.h     Stiefel-manifold frames (Haar init, tangent projection, QR retraction)
 *   bingham.h     Bingham normalising constant (Kume-Wood saddle point, Monte Carlo)
 *   hungarian.h   optimal one-to-one matching (assignment accuracy)
 *   moe.h         the MoE layer (routed + shared experts)
 *   params.h      one contiguous block of parameters / gradients
 *   model.h       layer stacks built from an "arch" string
 *   optim.h       SGD, Adam, AdamW (Riemannian on Stiefel tensors), clipping, schedules
 *   metrics.h     routing statistics
 *   data.h        IDX / Fashion-MNIST, class subsets, batches
 *   safetensors.h safetensors reader / writer
 *   checkpoint.h  checkpoints with exact resume
 *   train.h       the supervised training loop
 */
#ifndef SPECMOE_H
#define SPECMOE_H

#include "specmoe/core/bingham.h"
#include "specmoe/io/checkpoint.h"
#include "specmoe/core/conv.h"
#include "specmoe/core/core.h"
#include "specmoe/io/data.h"
#include "specmoe/io/hf.h"
#include "specmoe/core/hungarian.h"
#include "specmoe/nn/metrics.h"
#include "specmoe/nn/mlp.h"
#include "specmoe/nn/model.h"
#include "specmoe/nn/moe.h"
#include "specmoe/core/ops.h"
#include "specmoe/core/optim.h"
#include "specmoe/core/params.h"
#include "specmoe/nn/router.h"
#include "specmoe/nn/routers.h"
#include "specmoe/io/safetensors.h"
#include "specmoe/core/spectral.h"
#include "specmoe/methods/srmoe/srmoe.h"
#include "specmoe/methods/ssmoe/ssmoe.h"
#include "specmoe/nn/loss.h"
#include "specmoe/nn/module.h"
#include "specmoe/nn/penalty.h"
#include "specmoe/core/json.h"
#include "specmoe/core/stiefel.h"
#include "specmoe/methods/grmoe/synth.h"
#include "specmoe/methods/grmoe/router.h"
#include "specmoe/methods/softmoe_rl/reset.h"
#include "specmoe/train/train.h"
#include "specmoe/dist/dist.h"
#include "specmoe/rl/env.h"

#endif
