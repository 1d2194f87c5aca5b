/* Checkpoints: a safetensors file holding the model's parameters under their table names, and,
 * for training checkpoints, the optimiser moments ("optim.m.<name>", "optim.v.<name>") and the
 * training position in the header's __metadata__:
 *
 *   "format": "specmoe", "version": "1", "model": <model config JSON>,
 *   "train": {"step", "epoch", "pos", "optim_step", "rng": [4 x u64 as decimal strings]}
 *
 * Written atomically (temporary file, fsync, rename): a crash never leaves a torn file.
 */
#ifndef SPECMOE_CHECKPOINT_H
#define SPECMOE_CHECKPOINT_H

#include "specmoe/nn/model.h"
#include "specmoe/core/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    long step;       /* optimiser steps done */
    int epoch, pos;  /* data position: next example index within epoch */
    sm_rng rng;      /* training RNG (noisy gating, ...) */
} sm_train_state;

/* opt and ts may be NULL (an inference checkpoint). */
sm_status sm_checkpoint_save(const char *path, const sm_model *m, const sm_optim *opt, const sm_train_state *ts,
                             sm_error *err);
/* Reads only the model description. */
sm_status sm_checkpoint_read_config(const char *path, sm_model_config *cfg, sm_error *err);
/* Loads parameters into m (names and shapes must match exactly, else SM_ERR_MISMATCH naming the
 * tensor), and optimiser state / training position when opt / ts are non-NULL (then they must be
 * present in the file). F32, F16 and BF16 tensors are accepted. */
sm_status sm_checkpoint_load(const char *path, sm_model *m, sm_optim *opt, sm_train_state *ts, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
