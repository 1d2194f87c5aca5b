/* What the classic-control environments share: a state that starts with its RNG (so one init seeds
 * them all) and the clipping of gymnasium's np.clip. */
#ifndef SPECMOE_ENVS_CLASSIC_CLASSIC_H
#define SPECMOE_ENVS_CLASSIC_CLASSIC_H

#include "specmoe/rl/env.h"

/* init of every classic state struct, whose first member is its sm_rng (no options to read) */
static inline void classic_init(void *st, uint64_t seed, const sm_env_opts *opts) {
    (void)opts;
    sm_rng_seed((sm_rng *)st, seed);
}

/* x clipped to [lo, hi] (a NaN stays NaN, as with np.clip) */
static inline double classic_clip(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

#endif
