/* Checkpoints: a safetensors file holding the model's parameters under their table names, and,
 * for training checkpoints, the optimiser moments ("optim.m.<name>", "optim.v.<name>") and the
 * training position in the header's __metadata__:
 *
 *   "format": "specmoe", "version": "1", "model": <model config JSON>,
 *   "train": {"step", "epoch", "pos", "optim_step", "rng": [4 x u64 as decimal strings]},
 *   "settings": <the caller's settings JSON, when it gave one>
 *
 * Written atomically (temporary file, fsync, rename): a crash never leaves a torn file.
 */
#ifndef SPECMOE_CHECKPOINT_H
#define SPECMOE_CHECKPOINT_H

#include "specmoe/nn/model.h"
#include "specmoe/core/optim.h"
#include "specmoe/io/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    long step;       /* optimiser steps done */
    int epoch, pos;  /* data position: next example index within epoch */
    sm_rng rng;      /* training RNG (noisy gating, ...) */
    char classes[128]; /* class subset trained on, as numbers in label order ("0,1,7,8"); "" = all.
                        * Optional in the file: checkpoints without it load with "" */
    long best_step;    /* the step of the best checkpoint so far (<out>/best.safetensors); -1 = none */
    double best_score; /* its score: validation accuracy, or minus the epoch's mean training loss */
    const char *settings; /* the caller's record of the run's settings (JSON text, opaque to the
                           * library), stored as __metadata__.settings so a resume can restore them;
                           * NULL = none. sm_checkpoint_load sets it to NULL: read it with
                           * sm_checkpoint_read_meta */
} sm_train_state;

/* The generic layer, for any network (an RL agent's actor, critic and target network, ...): named
 * parameter sets, each with optional optimiser moments, stored under "<prefix><tensor>" and
 * "<prefix>optim.m.<tensor>" / "<prefix>optim.v.<tensor>", plus key/value metadata (a classifier
 * stores its model and epoch/position there; an RL run its own counters). */
typedef struct {
    const char *prefix;   /* "" for the main set, e.g. "critic." or "target." for others */
    const sm_params *ps;
    sm_optim *opt;        /* NULL: no optimiser state */
} sm_ckpt_set;

sm_status sm_checkpoint_write(const char *path, const sm_ckpt_set *sets, int n_sets, const sm_st_meta *meta, int n_meta,
                              sm_error *err);
/* Raw state stored beside the parameters as a U8 tensor (an agent's replay buffer, environment
 * states, counters): exact resume of runs whose state is more than parameters. */
typedef struct {
    const char *name;
    const void *data;
    size_t bytes;
} sm_ckpt_blob;
sm_status sm_checkpoint_write_blobs(const char *path, const sm_ckpt_set *sets, int n_sets, const sm_st_meta *meta,
                                    int n_meta, const sm_ckpt_blob *blobs, int n_blobs, sm_error *err);
/* Reads blob `name` of exactly `bytes` bytes into out (SM_ERR_FORMAT naming the file and blob if it
 * is missing, not U8 or of another size). */
sm_status sm_checkpoint_read_blob(const sm_safetensors *st, const char *path, const char *name, void *out, size_t bytes,
                                  sm_error *err);
/* Loads every set from an opened file (sm_safetensors_load): names and shapes must match (else
 * SM_ERR_MISMATCH naming the tensor); nothing is copied unless everything matches. skip (may be
 * NULL) leaves tensors out by name. Metadata: sm_safetensors_meta. */
sm_status sm_checkpoint_read_sets(const sm_safetensors *st, const char *path, const sm_ckpt_set *sets, int n_sets,
                                  int (*skip)(const char *name), sm_error *err);

/* The classifier's checkpoint. opt and ts may be NULL (an inference checkpoint). */
sm_status sm_checkpoint_save(const char *path, const sm_model *m, const sm_optim *opt, const sm_train_state *ts,
                             sm_error *err);
/* Reads only the class subset the checkpoint was trained on (sm_train_state.classes) into buf
 * (n bytes); "" when it holds none (all classes, or a checkpoint written before it was stored). */
sm_status sm_checkpoint_read_classes(const char *path, char *buf, size_t n, sm_error *err);
/* Reads one __metadata__ value: *value gets a copy (free it) or NULL when the file has no such key. */
sm_status sm_checkpoint_read_meta(const char *path, const char *key, char **value, sm_error *err);
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
