/* Environments: the contract of PufferLib's C "ocean" environments.
 *
 *   sm_vecenv v;
 *   sm_vecenv_init(&v, "minatar/breakout", 8, seed, NULL, &err);    // 8 copies, own RNG each
 *   float obs[8 * sm_env_obs_numel(v.spec)]; int act[8]; float rew[8]; unsigned char term[8], trunc[8];
 *   sm_vecenv_bind(&v, obs, act, NULL, rew, term, trunc, NULL);     // caller-owned buffers
 *   sm_vecenv_reset(&v);                                            // obs filled
 *   for (;;) { choose act from obs; sm_vecenv_step(&v); }          // auto-reset at episode end
 *   sm_env_log log = sm_vecenv_log_take(&v);                        // finished episodes since last take
 *
 * One environment is a spec (spaces, sizes, functions) plus an opaque state of spec->state_bytes
 * that the vector allocates once (no allocation after init; an environment may allocate at init what
 * its state points to, e.g. a MuJoCo mjData, and free it in the optional close hook). The environment owns its dynamics and
 * its termination; the vector owns everything common: the time limit (truncation at max_steps),
 * auto-reset, the episode statistics, and the threads.
 *
 * Buffers, per environment i (row-major over environments):
 *   obs        (N, c*h*w) float; an image is c x h x w stored CHW, binary 0/1 for MinAtar
 *   act_disc   (N) int     discrete actions in [0, n)          (NULL for box-action envs)
 *   act_box    (N, n) float box actions, clipped to the bounds by the env (NULL for discrete)
 *   rewards    (N) float
 *   terminals  (N) 0/1     the episode ended in a terminal state (no bootstrap)
 *   truncations(N) 0/1     the episode was cut by the time limit (bootstrap from final_obs)
 *   final_obs  (N, c*h*w) optional: when an episode ends at this step, its last observation (before
 *              the auto-reset overwrote obs with the first observation of the next episode)
 * Auto-reset follows gym's classic vector convention: after a step that ends an episode, obs holds
 * the next episode's first observation and the flags say how the previous one ended.
 *
 * Determinism: environment i is seeded from (seed, i) and has its own RNG, so results do not depend
 * on the thread count.
 */
#ifndef SPECMOE_ENV_H
#define SPECMOE_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SM_SPACE_DISCRETE = 0, SM_SPACE_BOX = 1 } sm_space_kind;

/* Options an environment family may read; a negative value keeps the environment's default. */
typedef struct {
    double sticky;  /* MinAtar: probability of repeating the previous action (default 0.1) */
    int ramping;    /* MinAtar: difficulty ramping (default 1) */
    int max_steps;  /* time limit override (default: the spec's) */
} sm_env_opts;
static inline sm_env_opts sm_env_opts_default(void) {
    sm_env_opts o = {-1.0, -1, -1};
    return o;
}

typedef struct sm_env_spec {
    const char *name;   /* "family/task", e.g. "classic/cartpole", "minatar/breakout" */
    const char *about;  /* one line: what it is and its reference */
    int obs_c, obs_h, obs_w; /* a vector observation is c values (h = w = 1) */
    int obs_binary;          /* image of 0/1 values */
    const float *obs_low, *obs_high; /* bounds of a vector observation (obs_c values each), or NULL */
    sm_space_kind act_kind;
    int act_n;                       /* discrete: number of actions; box: dimension */
    const float *act_low, *act_high; /* box bounds (act_n values each) */
    int max_steps;                   /* time limit: truncation after this many steps (0: none) */
    int has_success;                 /* the episode log reports success (0/1 per episode) */
    size_t state_bytes;              /* one environment's state */
    /* Optional (NULL: nothing to prepare): called once by sm_vecenv_init before any init, for what
     * every state shares and that can fail, e.g. loading a MuJoCo model file (envs/mujoco/). A
     * failure is reported through sm_vecenv_init's status and message. */
    sm_status (*prepare)(sm_error *err);
    /* Optional (NULL: nothing to release): frees what init allocated outside the state (a MuJoCo
     * mjData); called once per state by sm_vecenv_free, also on a state whose init never ran (all
     * zero bytes). */
    void (*close)(void *st);
    /* Seeds the state and applies options (called once; opts never NULL). */
    void (*init)(void *st, uint64_t seed, const sm_env_opts *opts);
    /* Starts an episode: writes the first observation. */
    void (*reset)(void *st, float *obs);
    /* One step: reads the action (a_disc or a_box per act_kind), writes obs, *reward, *terminal.
     * Does not reset and does not apply the time limit (the vector does both). */
    void (*step)(void *st, const int *a_disc, const float *a_box, float *obs, float *reward,
                 unsigned char *terminal);
    /* Optional (NULL: step once per environment): n steps of the environments whose states lie
     * one after the other in states (state_bytes each, as the vector stores them), with their
     * actions a_disc (n) or a_box (n, act_n) and their outputs obs (n, obs numel), reward (n),
     * terminal (n). The same as n calls of step, bit for bit: results do not depend on how the
     * vector groups its environments. For environments whose one step is a chain of dependent
     * arithmetic, so that several environments side by side keep a core busy (Acrobot: four in
     * the lanes of a vector, envs/classic/acrobot.c). */
    void (*step_batch)(void *states, int n, const int *a_disc, const float *a_box, float *obs, float *reward,
                       unsigned char *terminal);
    /* Score and success of the episode that just ended (NULL: score = return, success = 0).
     * Called before reset. */
    void (*episode_end)(const void *st, float *score, float *success);
    /* Draws the current state into rgb (h x w x 3 bytes, row-major) for `rl render`; NULL if the
     * env has no picture of its own (images are then drawn from the observation). */
    void (*render)(const void *st, unsigned char *rgb, int h, int w);
    /* Exact resume of a state that holds pointers (a MuJoCo mjData): save writes save_size(spec, st)
     * bytes that load turns back into the same state in an environment made by init. NULL: the
     * state is plain data and its state_bytes are copied as they are. */
    size_t (*save_size)(const struct sm_env_spec *s, const void *st);
    void (*save)(const struct sm_env_spec *s, const void *st, void *buf);
    void (*load)(const struct sm_env_spec *s, void *st, const void *buf);
} sm_env_spec;

static inline int sm_env_obs_numel(const sm_env_spec *s) { return s->obs_c * s->obs_h * s->obs_w; }

/* Sums over finished episodes (divide by n for means). */
typedef struct {
    double episode_return, episode_length, score, success;
    double return_sq; /* sum of squared returns (standard deviation) */
    long n;
} sm_env_log;

typedef struct {
    const sm_env_spec *spec;
    sm_env_opts opts;
    int num_envs, threads;
    int max_steps;         /* effective time limit */
    unsigned char *states; /* (N, state_bytes), owned */
    double *ep_return;     /* (N) running episode return, owned */
    int *ep_length;        /* (N) owned */
    sm_env_log *logs;      /* (N) per environment (no sharing between threads), owned */
    /* caller-owned buffers (sm_vecenv_bind) */
    float *obs;
    int *act_disc;
    float *act_box;
    float *rewards;
    unsigned char *terminals, *truncations;
    float *final_obs;
} sm_vecenv;

/* Every registered environment (envs/registry.c) and lookup by name. */
const sm_env_spec *const *sm_env_list(int *n);
const sm_env_spec *sm_env_find(const char *name);
/* "name1, name2, ..." of every environment (static storage). */
const char *sm_env_names(void);

/* N environments of `name`, seeded from seed; opts NULL: defaults. Unknown names are answered with
 * the list of valid ones. */
sm_status sm_vecenv_init(sm_vecenv *v, const char *name, int num_envs, uint64_t seed, const sm_env_opts *opts,
                         sm_error *err);
/* The same with environment i seeded as environment first + i of a vector of that seed: the ranks of a
 * data-parallel run hold disjoint slices of one large vector. */
sm_status sm_vecenv_init_at(sm_vecenv *v, const char *name, int num_envs, uint64_t seed, int first,
                            const sm_env_opts *opts, sm_error *err);
void sm_vecenv_bind(sm_vecenv *v, float *obs, int *act_disc, float *act_box, float *rewards,
                    unsigned char *terminals, unsigned char *truncations, float *final_obs);
/* OpenMP threads used by reset/step (1: no parallel region). */
void sm_vecenv_set_threads(sm_vecenv *v, int threads);
void sm_vecenv_reset(sm_vecenv *v);
void sm_vecenv_step(sm_vecenv *v);
/* The vector's whole state (every environment, running episode returns and lengths, logs) as bytes,
 * for exact resume: sm_vecenv_state_size bytes written by save and read back by load into a vector
 * made by sm_vecenv_init with the same name and count. */
size_t sm_vecenv_state_size(const sm_vecenv *v);
void sm_vecenv_save(const sm_vecenv *v, void *buf);
void sm_vecenv_load(sm_vecenv *v, const void *buf);
/* The finished episodes since the last take, summed over environments; clears them. */
sm_env_log sm_vecenv_log_take(sm_vecenv *v);
void sm_vecenv_free(sm_vecenv *v);

/* n actions of a uniform random policy: discrete ones in [0, act_n) into act_disc (n), or box ones
 * uniform within the bounds into act_box (n, act_n); the pointer of the other kind may be NULL. */
void sm_env_random_actions(const sm_env_spec *s, sm_rng *rng, int n, int *act_disc, float *act_box);

/* Seed of environment i from the vector's seed (splitmix64 of both): independent streams. */
uint64_t sm_env_seed(uint64_t seed, int i);

#ifdef __cplusplus
}
#endif
#endif
