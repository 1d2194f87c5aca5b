/* What the five MinAtar games share (Young & Tian 2019, "MinAtar: An Atari-Inspired Testbed for
 * Thorough and Reproducible Reinforcement Learning Experiments", arXiv 1903.03176): the 10 x 10
 * grid, the full action set of 6, sticky actions, difficulty ramping as an option, and the RNG draws.
 *
 * The rules follow the reference implementation's behaviour (MinAtar, github.com/kenjyoung/MinAtar,
 * the games in minatar/environments/ and the wrapper minatar/environment.py), read for its facts:
 * timings, spawn rules, rewards, terminations and channels. Its code (GPL-3.0) is not copied; each
 * game's header lists the rules as facts and says where the README text and the reference differ
 * (we follow the reference, so results compare with the published curves).
 *
 * Conventions shared with the reference: a timer "of n" that is reset to n when it fires and
 * counted down only on the frames it does not fire fires once every n + 1 frames; one counted
 * down on every frame (its own included) fires once every n frames. Each game says which it is.
 *
 * A game's state struct starts with `ma_common` so that `ma_init` serves as every game's init.
 * Observations are C x 10 x 10 floats (CHW), 0 or 1: a step clears the grid and draws every object
 * (400 to 1000 floats: a memset is cheaper than tracking what changed).
 */
#ifndef SPECMOE_ENVS_MINATAR_H
#define SPECMOE_ENVS_MINATAR_H

#include <string.h>

#include "specmoe/rl/env.h"

#define MA_N 10 /* the grid is MA_N x MA_N */

/* The full action set, in MinAtar's order. */
enum { MA_NOOP = 0, MA_LEFT, MA_UP, MA_RIGHT, MA_DOWN, MA_FIRE, MA_NUM_ACTIONS };

#define MA_STICKY_DEFAULT 0.1 /* the paper's sticky-action probability */

typedef struct {
    sm_rng rng;
    double sticky;   /* probability of repeating the previous action */
    int ramping;     /* difficulty ramping on (1) or off (0) */
    int last_action; /* the action executed at the previous step: a no-op before the first step, and
                      * kept across episodes (the reference wrapper does not clear it on reset) */
} ma_common;

/* Seeds the RNG and reads opts (sticky, ramping); the spec's init for every game. */
void ma_init(void *st, uint64_t seed, const sm_env_opts *opts);
/* The action executed this step: with probability `sticky` the previous one instead of a. An
 * action outside [0, 6) counts as a no-op. */
int ma_action(ma_common *c, int a);

/* RNG draws: uniform integer in [0, n), and an event of probability p. */
static inline int ma_below(ma_common *c, int n) { return (int)sm_rng_below(&c->rng, (uint32_t)n); }
static inline int ma_chance(ma_common *c, double p) { return sm_rng_uniform(&c->rng) < p; }

/* The observation grid: clear C channels, set cell (channel, row y, column x). */
static inline void ma_clear(float *obs, int channels) { memset(obs, 0, sizeof(float) * (size_t)channels * MA_N * MA_N); }
static inline void ma_set(float *obs, int channel, int y, int x) { obs[(channel * MA_N + y) * MA_N + x] = 1.0f; }
/* Sets the cells of row y whose bits are set in mask (bit x = column x). */
static inline void ma_set_row(float *obs, int channel, int y, unsigned mask) {
    float *row = obs + (channel * MA_N + y) * MA_N;
    for (; mask; mask &= mask - 1) row[__builtin_ctz(mask)] = 1.0f;
}
/* Cells 0..n-1 of row y: a gauge (Seaquest's oxygen and divers). */
static inline void ma_set_bar(float *obs, int channel, int y, int n) {
    for (int x = 0; x < n && x < MA_N; x++) ma_set(obs, channel, y, x);
}

static inline int ma_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
/* Horizontal and vertical moves of an action (left -1 / right +1; up -1 / down +1). */
static inline int ma_dx(int a) { return a == MA_LEFT ? -1 : a == MA_RIGHT ? 1 : 0; }
static inline int ma_dy(int a) { return a == MA_UP ? -1 : a == MA_DOWN ? 1 : 0; }

/* The spec of a game: name "minatar/<task>", `channels` x 10 x 10 binary observation, 6 actions,
 * the game's own termination (no time limit unless opts.max_steps sets one; MinAtar has none). */
#define MA_SPEC(task, channels, about_text, state_type, reset_fn, step_fn)                          \
    const sm_env_spec sm_env_minatar_##task = {                                                    \
        .name = "minatar/" #task, .about = about_text, .obs_c = channels, .obs_h = MA_N,            \
        .obs_w = MA_N, .obs_binary = 1, .act_kind = SM_SPACE_DISCRETE, .act_n = MA_NUM_ACTIONS,     \
        .max_steps = 0, .state_bytes = sizeof(state_type), .init = ma_init, .reset = reset_fn,      \
        .step = step_fn,                                                                           \
    }

#endif
