/* Reinforcement-learning agents: one interface for every agent (DQN family, PPO), so the command
 * line, the run directory and the evaluation are written once.
 *
 * An agent kind is a name, a configuration struct described by an option table (core/opt.h: the
 * defaults, the JSON stored in checkpoints and the flags of `specmoe rl train` all come from it),
 * named presets, a compatibility check against an environment, a consistency check of the settings,
 * and `train`. Networks are specmoe models (nn/model.h): any layer may be an MoE layer with any
 * router, so `--arch` and the router flags carry over from supervised training.
 *
 * Every agent writes, under run->out_dir: metrics.jsonl (CleanRL's vocabulary: global_step,
 * episodic_return, episodic_length, SPS, losses/...), settings.json (every option), and
 * checkpoints (model.safetensors, the last; resumable exactly).
 */
#ifndef SPECMOE_AGENT_H
#define SPECMOE_AGENT_H

#include <signal.h>
#include <stdio.h>

#include "specmoe/core/opt.h"
#include "specmoe/nn/model.h"
#include "specmoe/rl/env.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sm_dist; /* include/specmoe/dist/dist.h */

/* What the caller decides about a run (not part of the agent's settings). */
typedef struct {
    const char *env;        /* environment name (rl/env.h) */
    sm_env_opts env_opts;
    const char *out_dir;    /* NULL: nothing written */
    uint64_t seed;
    int threads;            /* OpenMP threads for environment stepping and the network (the agent sets
                             * omp_set_num_threads to it; 0 leaves OpenMP as it is) */
    long frames;            /* budget in environment frames, summed over the vector; 0: the agent's default */
    const char *resume;     /* checkpoint to continue from, or NULL */
    const char *init_from;  /* continual RL (SPHERE Sec. 5.1, CRL): a checkpoint of the same agent and
                             * settings on another task of the family, whose network parameters and
                             * observation normaliser this run starts from; the optimiser's moments,
                             * the learning-rate schedule, the reward normaliser, the counters and the
                             * environments start fresh, as a new training launch that loads the
                             * previous weights. Ignored on resume (the run's own checkpoint holds
                             * all of it). NULL: a fresh start. */
    volatile sig_atomic_t *stop; /* set asynchronously (Ctrl-C): the agent checkpoints and returns */
    long stop_after;        /* > 0: stop the same way once this many frames are done (a run split
                             * into sessions; --resume continues it exactly) */
    FILE *progress;         /* a progress line every few seconds; NULL: quiet */
    double progress_every;  /* seconds between progress lines (0: 5 s) */
    struct sm_dist *dist;   /* under mpirun: the ranks, each running this call with its own environments
                             * (synchronous data parallel; see the agent's file); NULL: one process */
    long dist_check;        /* > 0: compare a hash of the parameters over the ranks every this many updates */
    /* testing aids: at update fault_nan_update (> 0) rank fault_rank (-1: every rank) poisons its loss;
     * under mpirun (PPO) at update fault_kill_update (> 0) rank fault_rank (-1: the last) kills itself */
    long fault_nan_update, fault_kill_update;
    int fault_rank;
} sm_rl_run;

/* What a run measured. */
typedef struct {
    long frames;            /* environment frames done (including a resumed run's earlier ones) */
    long frames_start;      /* frames already done when this process started (resume) */
    long updates;           /* gradient steps */
    double seconds;         /* wall time of this process's part */
    long episodes;          /* finished episodes */
    double last_return;     /* mean return of the episodes finished in the last 10% of the frames */
    int stopped;            /* 1: run->stop ended it early, 2: run->stop_after did (a checkpoint was written) */
} sm_rl_result;

/* A trained policy, for evaluation and rendering: acts on a batch of observations. */
typedef struct sm_policy sm_policy;
struct sm_policy {
    const sm_env_spec *env;
    /* greedy (deterministic) actions for N observations (N <= max_N): discrete into a_disc, box into a_box */
    void (*act)(sm_policy *p, const float *obs, int N, int *a_disc, float *a_box);
    void (*destroy)(sm_policy *p);
    int max_N;
    void *impl;
    sm_model *net; /* the network it acts with (the DQN family's Q-network, PPO's actor), for pruning
                    * and diagnostics; NULL if none */
    /* The rows net sees for N observations (N <= max_N; e.g. PPO's normalised observations), owned
     * by the policy and valid until its next call; NULL when net reads observations as they are. */
    const float *(*inputs)(sm_policy *p, const float *obs, int N);
    /* Called by sm_rl_evaluate after each act, when set by the caller (NULL from load_policy): it
     * may read the last forward of net (e.g. `rl eval --routing`, its routes) */
    void (*observe)(void *ctx, sm_policy *p, int N);
    void *observe_ctx;
};

typedef struct sm_agent_kind {
    const char *name;       /* "dqn", "c51", "der", "ppo" */
    const char *about;      /* one line with the reference */
    size_t cfg_bytes;
    const sm_opt *opts;
    int n_opts;
    /* Named presets: pairs {name, "key=value;key=value"} (";" since values such as arch hold commas),
     * ended by NULL (e.g. "minatar"). */
    const char *const *presets;
    /* NULL if the agent can act in env, else the reason (e.g. "dqn needs discrete actions"). */
    const char *(*compatible)(const sm_env_spec *env);
    /* Defaults that depend on the environment (the network for images vs vectors), applied to the
     * options the user did not give (given(user, key) says which). May be NULL. */
    void (*env_defaults)(void *cfg, const sm_env_spec *env, int (*given)(const void *user, const char *key),
                         const void *user);
    /* Settings that cannot work together (batch above the buffer, n-step < 1, ...), refused before
     * any work. May be NULL. */
    sm_status (*check)(const void *cfg, const sm_env_spec *env, sm_error *err);
    sm_status (*train)(const void *cfg, const sm_model_config *net, const sm_rl_run *run, sm_rl_result *res,
                       sm_error *err);
    /* The greedy policy of a checkpoint this agent wrote. */
    sm_policy *(*load_policy)(const char *path, int max_N, sm_error *err);
} sm_agent_kind;

/* The registry (src/rl/agent.c). */
const sm_agent_kind *const *sm_agent_list(int *n);
const sm_agent_kind *sm_agent_find(const char *name);
const char *sm_agent_names(void);
/* The agent that wrote a checkpoint (its "agent" metadata). */
const sm_agent_kind *sm_agent_of_checkpoint(const char *path, sm_error *err);

/* Applies a preset ("minatar") of kind k to cfg; SM_ERR_ARG naming the valid presets if unknown. */
sm_status sm_agent_apply_preset(const sm_agent_kind *k, void *cfg, const char *preset, sm_error *err);

/* Runs `episodes` episodes of policy p (or of a uniform random policy when p is NULL) in env with
 * N environments, and fills the log (sums; rl/env.h). env may be another task than the policy's if
 * its observation and action spaces are the same (a task family); else SM_ERR_MISMATCH. */
sm_status sm_rl_evaluate(sm_policy *p, const char *env, const sm_env_opts *opts, int episodes, int N, uint64_t seed,
                         int threads, sm_env_log *log, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
