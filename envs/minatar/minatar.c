/* Sticky actions and options shared by the MinAtar games (envs/minatar/minatar.h). */
#include "minatar.h"

void ma_init(void *st, uint64_t seed, const sm_env_opts *opts) {
    ma_common *c = st;
    sm_rng_seed(&c->rng, seed);
    c->sticky = opts->sticky >= 0 ? opts->sticky : MA_STICKY_DEFAULT;
    c->ramping = opts->ramping >= 0 ? opts->ramping != 0 : 1;
    c->last_action = MA_NOOP;
}

/* Sticky actions (Machado et al. 2018, as MinAtar uses them): with probability p the environment
 * executes the previous action instead of the chosen one. As in the reference wrapper the previous
 * action survives an episode's reset, so the first step of an episode may repeat the last action
 * of the one before (the game's reset does not touch it). No draw when p = 0, so a run without
 * sticky actions spends no RNG state on them (the reference draws anyway; only the streams differ). */
int ma_action(ma_common *c, int a) {
    if (a < 0 || a >= MA_NUM_ACTIONS) a = MA_NOOP;
    if (c->sticky > 0 && ma_chance(c, c->sticky)) a = c->last_action;
    c->last_action = a;
    return a;
}
