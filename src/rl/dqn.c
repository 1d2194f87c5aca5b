/* The DQN family (include/specmoe/rl/dqn.h): one config, one loop, three agent kinds.
 *
 * Per vector step: epsilon-greedy actions from the online network, one environment step, the
 * transition into the replay (rows x environments, replay.h); every train_freq vector steps after
 * learning_starts frames, one update on a sampled batch:
 *   y = G + gamma^m * Q_target(s', a*),  a* = argmax Q_online(s') (double) or argmax Q_target(s')
 *   loss = mean_b w_b huber(Q(s, a) - y)                          (DQN, Mnih et al. 2015)
 *   C51: loss = mean_b w_b CE(Phi(G + gamma^m z, p_target(s', a*)), p(s, a))   (Bellemare et al. 2017)
 * and every target_update frames the target network moves to the online one (tau = 1: a copy).
 * Networks are specmoe models: --arch may hold MoE layers with any router.
 *
 * Under mpirun (run->dist of P > 1 ranks) the learner is synchronous data parallel with per-rank
 * actors, the simplest design that scales: every rank steps its own num_envs environments (rank r
 * holds environments rN .. rN+N-1 of the seed's vector), fills its own replay of buffer_size / P
 * transitions, and at each update samples its share batch_size / P of the global batch from it; the
 * gradients are averaged over the ranks with one allreduce before the clip and the optimiser step,
 * so every rank holds the same online and target networks (the target sync is by global frames,
 * identical everywhere). Frames count every rank (P N per vector step), so epsilon, learning_starts,
 * target_update and the budget follow global frames, and -np P with num_envs N / P takes updates
 * at the frames and batch of one process with N environments. Prioritised replay keeps each rank's
 * priorities; the importance weights are renormalised by the largest over the ranks. Rank 0 writes
 * the logs (episodes summed over the ranks each step) and checkpoint.safetensors; rank r > 0 writes
 * its environments, counters and replay beside it (checkpoint.rank<r>.safetensors), so a run resumes
 * exactly on as many ranks. No experience crosses ranks: only gradients (one block per update) and a
 * few statistics do.
 */
#include "specmoe/rl/dqn.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/dist/dist.h"
#include "specmoe/io/checkpoint.h"
#include "specmoe/methods/softmoe_rl/reset.h"
#include "specmoe/rl/replay.h"
#include "specmoe/rl/rl_log.h"

/* ---- losses ---- */

double sm_dqn_td_loss(sm_real *dq, sm_real *td, const sm_real *q, const int *act, const sm_real *y,
                      const float *w, int B, int A, int huber) {
    double L = 0;
    memset(dq, 0, sizeof(sm_real) * (size_t)B * A);
    for (int b = 0; b < B; b++) {
        double d = (double)q[(size_t)b * A + act[b]] - (double)y[b], wb = w ? w[b] : 1.0, l, g;
        if (huber) {
            double ad = fabs(d);
            l = ad < 1 ? 0.5 * d * d : ad - 0.5;
            g = ad < 1 ? d : (d > 0 ? 1 : -1);
        } else {
            l = d * d;
            g = 2 * d;
        }
        L += wb * l;
        dq[(size_t)b * A + act[b]] = (sm_real)(wb * g / B);
        td[b] = (sm_real)d;
    }
    return L / B;
}

void sm_c51_project(sm_real *m, const sm_real *p_next, const float *ret, const float *disc, int B, int K,
                    double v_min, double v_max) {
    const double dz = (v_max - v_min) / (K - 1);
    memset(m, 0, sizeof(sm_real) * (size_t)B * K);
    for (int b = 0; b < B; b++) {
        sm_real *mb = m + (size_t)b * K;
        const sm_real *pb = p_next + (size_t)b * K;
        for (int j = 0; j < K; j++) {
            double tz = ret[b] + disc[b] * (v_min + j * dz);
            tz = tz < v_min ? v_min : tz > v_max ? v_max : tz;
            double pos = (tz - v_min) / dz;
            int l = (int)floor(pos), u = (int)ceil(pos);
            if (l < 0) l = 0;
            if (u > K - 1) u = K - 1;
            if (l == u) {
                mb[l] += pb[j];
            } else {
                mb[l] += (sm_real)(pb[j] * (u - pos));
                mb[u] += (sm_real)(pb[j] * (pos - l));
            }
        }
    }
}

double sm_c51_loss(sm_real *dlogits, sm_real *ce, const sm_real *logits, const int *act, const sm_real *m,
                   const float *w, int B, int A, int K) {
    double L = 0;
    memset(dlogits, 0, sizeof(sm_real) * (size_t)B * A * K);
    for (int b = 0; b < B; b++) {
        const sm_real *z = logits + ((size_t)b * A + act[b]) * K;
        const sm_real *mb = m + (size_t)b * K;
        double mx = z[0], s = 0;
        for (int j = 1; j < K; j++) mx = z[j] > mx ? z[j] : mx;
        for (int j = 0; j < K; j++) s += exp(z[j] - mx);
        double lse = mx + log(s), c = 0, wb = w ? w[b] : 1.0;
        sm_real *d = dlogits + ((size_t)b * A + act[b]) * K;
        for (int j = 0; j < K; j++) {
            c -= mb[j] * (z[j] - lse);
            d[j] = (sm_real)(wb * (exp(z[j] - lse) - mb[j]) / B);
        }
        ce[b] = (sm_real)c;
        L += wb * c;
    }
    return L / B;
}

/* ---- options ---- */

#define ROW(key, type, field, def, help) SM_OPT_ROW(sm_dqn_config, key, type, field, def, help)
#define SROW(key, field, def, help) SM_OPT_STR_ROW(sm_dqn_config, key, field, def, help)
static const sm_opt kOpts[] = {
    SROW("arch", arch, "", "Q-network hidden stack (--arch syntax; empty: conv:16:3:1:0,dense:128 on images, dense:120,dense:84 on vectors)"),
    SROW("act", act, "relu", "activation"),
    ROW("num_envs", SM_OPT_INT, num_envs, "1", "environments stepped together"),
    ROW("total_frames", SM_OPT_INT, total_frames, "0", "frames of the run (0: 5M on images, 500k on vectors; --frames overrides)"),
    ROW("buffer_size", SM_OPT_INT, buffer_size, "0", "replay capacity (0: 100k on images, 10k on vectors)"),
    ROW("batch_size", SM_OPT_INT, batch_size, "0", "transitions per update (0: 32 on images, 128 on vectors)"),
    ROW("learning_starts", SM_OPT_INT, learning_starts, "-1", "frames of random play before learning (-1: 5000 on images, 10000 on vectors)"),
    ROW("train_freq", SM_OPT_INT, train_freq, "0", "vector steps between updates (0: 1 on images, 10 on vectors)"),
    ROW("target_update", SM_OPT_INT, target_update, "0", "frames between target updates (0: 1000 on images, 500 on vectors)"),
    ROW("tau", SM_OPT_NUM, tau, "1", "target update rate (1: copy)"),
    ROW("gamma", SM_OPT_NUM, gamma, "0.99", "discount"),
    SROW("optimizer", optimizer, "", "adam | rmsprop (empty: rmsprop on images as MinAtar, adam on vectors)"),
    ROW("lr", SM_OPT_NUM, lr, "2.5e-4", "learning rate"),
    ROW("adam_eps", SM_OPT_NUM, adam_eps, "1e-8", "Adam epsilon"),
    ROW("rms_alpha", SM_OPT_NUM, rms_alpha, "0.95", "RMSprop smoothing (MinAtar: squared-gradient momentum 0.95)"),
    ROW("rms_eps", SM_OPT_NUM, rms_eps, "0.01", "RMSprop epsilon (MinAtar: minimum squared gradient 0.01)"),
    ROW("rms_centered", SM_OPT_BOOL, rms_centered, "1", "centered RMSprop"),
    ROW("eps_start", SM_OPT_NUM, eps_start, "1", "initial exploration rate"),
    ROW("eps_end", SM_OPT_NUM, eps_end, "-1", "final exploration rate (-1: 0.1 on images, 0.05 on vectors)"),
    ROW("eps_frames", SM_OPT_INT, eps_frames, "0", "frames of linear decay after learning_starts (0: 100k on images, half the run on vectors)"),
    SROW("loss", loss, "", "huber | mse (empty: huber on images, mse on vectors)"),
    ROW("double_q", SM_OPT_BOOL, double_q, "0", "double Q-learning: the online network picks the bootstrap action"),
    ROW("n_step", SM_OPT_INT, n_step, "1", "n-step returns"),
    ROW("atoms", SM_OPT_INT, atoms, "1", "return distribution atoms (1: expected Q; 51: C51)"),
    ROW("v_min", SM_OPT_NUM, v_min, "-10", "C51 support minimum"),
    ROW("v_max", SM_OPT_NUM, v_max, "10", "C51 support maximum"),
    ROW("prioritized", SM_OPT_BOOL, prioritized, "0", "prioritised replay (proportional)"),
    ROW("per_alpha", SM_OPT_NUM, per_alpha, "0.5", "priority exponent"),
    ROW("per_beta", SM_OPT_NUM, per_beta, "0.4", "initial importance-sampling exponent"),
    ROW("per_beta_end", SM_OPT_NUM, per_beta_end, "1", "final importance-sampling exponent (linear from per_beta over the run; Dopamine: fixed 0.5)"),
    ROW("per_eps", SM_OPT_NUM, per_eps, "1e-6", "added to |TD error| priorities"),
    ROW("max_grad_norm", SM_OPT_NUM, max_grad_norm, "0", "global gradient-norm clip (0: none)"),
    ROW("log_every", SM_OPT_INT, log_every, "1000", "frames between loss records in metrics.jsonl"),
    ROW("reset_every", SM_OPT_INT, reset_every, "0", "frames between resets / shrink-and-perturb of the experts (0: never)"),
    ROW("reset_experts", SM_OPT_INT, reset_experts, "0", "experts per MoE layer to reset: 0 all, K the K most dormant"),
    ROW("reset_router", SM_OPT_BOOL, reset_router, "0", "reset the routers too"),
    ROW("reset_shrink", SM_OPT_NUM, reset_shrink, "0", "theta <- shrink theta + perturb phi (reset 0 1, S&P 0.5 0.5)"),
    ROW("reset_perturb", SM_OPT_NUM, reset_perturb, "1", "the weight of the fresh draw phi"),
    ROW("prune_experts", SM_OPT_INT, prune_experts, "0", "experts per MoE layer pruned during the run (soft router; Fig. 19)"),
    ROW("prune_from", SM_OPT_INT, prune_from, "0", "frame of the first pruning"),
    ROW("prune_to", SM_OPT_INT, prune_to, "0", "frame of the last (pruned one at a time, evenly spaced from prune_from)"),
    ROW("dormant_tau", SM_OPT_NUM, dormant_tau, "0.1",
        "dormant-neuron threshold: the fraction of tau-dormant units of each layer and expert on the last batch is logged (dormant/...); < 0: off"),
    ROW("ckpt_every", SM_OPT_INT, ckpt_every, "0", "frames between checkpoints (0: at the end)"),
    ROW("save_replay", SM_OPT_BOOL, save_replay, "1", "checkpoints hold the replay and environments, so --resume continues exactly"),
};
#undef ROW
#undef SROW

static int is_image(const sm_env_spec *e) { return e->obs_h > 1 || e->obs_w > 1; }

static const char *dqn_compatible(const sm_env_spec *env) {
    return env->act_kind == SM_SPACE_DISCRETE ? NULL : "the DQN family needs discrete actions (use ppo for box actions)";
}

/* Fills the zero/empty "pick by environment" settings: MinAtar's DQN (Young & Tian 2019, Sec. 4)
 * on images, CleanRL's dqn.py on vectors. Only options still at their "auto" value change, so
 * what the user or a preset set stays. */
static void fill_auto(sm_dqn_config *c, const sm_env_spec *env) {
    int img = is_image(env);
    if (!c->arch[0]) strcpy(c->arch, img ? "conv:16:3:1:0,dense:128" : "dense:120,dense:84");
    if (!c->total_frames) c->total_frames = img ? 5000000 : 500000;
    if (!c->buffer_size) c->buffer_size = img ? 100000 : 10000;
    if (!c->batch_size) c->batch_size = img ? 32 : 128;
    if (c->learning_starts < 0) c->learning_starts = img ? 5000 : 10000;
    if (!c->train_freq) c->train_freq = img ? 1 : 10;
    if (!c->target_update) c->target_update = img ? 1000 : 500;
    if (!c->optimizer[0]) strcpy(c->optimizer, img ? "rmsprop" : "adam");
    if (c->eps_end < 0) c->eps_end = img ? 0.1 : 0.05;
    if (!c->eps_frames) c->eps_frames = img ? 100000 : c->total_frames / 2;
    if (!c->loss[0]) strcpy(c->loss, img ? "huber" : "mse");
}

/* Sets each "key=value" of a ';'-separated list (a preset's syntax) unless the user gave the key. */
static void kind_defaults(void *cfg, const char *list, int (*given)(const void *, const char *), const void *user) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = 0;
        for (size_t i = 0; i < SM_LEN(kOpts); i++)
            if (!strcmp(kOpts[i].key, kv) && !(given && given(user, kv))) (void)sm_opt_set(&kOpts[i], cfg, eq + 1);
    }
}

/* Dopamine's schedule of DQN and Rainbow (the SoftMoE-in-RL paper's Table 1) in agent steps:
 * Rainbow-lite's image defaults and part of `--preset dopamine`, so the two cannot drift apart. */
#define DOPAMINE_SCHEDULE "learning_starts=20000;train_freq=4;target_update=8000;eps_start=1;eps_end=0.01;eps_frames=250000"

/* Dopamine's C51 on MinAtar: the importance exponent fixed at 0.5 (its prioritised replay weights
 * are 1 / sqrt(P), over the batch maximum) and the support [-100, 100] of its MinAtar Rainbow
 * configurations (labs/environments/minatar/rainbow_*.gin: vmax 100, the rewards unclipped; its
 * Atari vmax 10 assumes rewards clipped to [-1, 1]). Rainbow-lite's and DER's image defaults and
 * `--preset dopamine`. */
#define DOPAMINE_C51 "per_beta=0.5;per_beta_end=0.5;v_min=-100;v_max=100"

static void dqn_env_defaults(void *cfg, const sm_env_spec *env, int (*given)(const void *, const char *), const void *user) {
    (void)given;
    (void)user;
    fill_auto(cfg, env);
}

/* Rainbow-lite (Hessel et al. 2018 without noisy nets and dueling): C51 with 51 atoms, 3-step
 * returns, prioritised replay (alpha 0.5, beta 0.4 -> 1), double Q, Adam (lr 6.25e-5, eps 1.5e-4).
 * On images also Dopamine's rainbow.gin schedule (the SoftMoE-in-RL paper's Table 1; Hessel et al.
 * explore by noisy nets, not epsilon), counted in agent steps, which are MinAtar's frames (no frame
 * skip): an update every 4 steps, the target every 8000, learning after 20000 random steps, epsilon
 * 1 -> 0.01 over 250k; and Dopamine's C51 on MinAtar (DOPAMINE_C51: beta fixed at 0.5, support
 * [-100, 100]). The replay stays MinAtar's 100k (Rainbow's 1M is sized for 200M Atari frames).
 * Unlike Dopamine, double Q; `--preset dopamine` turns it off. On vectors the schedule is CleanRL's. */
static void rainbow_env_defaults(void *cfg, const sm_env_spec *env, int (*given)(const void *, const char *),
                                 const void *user) {
    kind_defaults(cfg, "atoms=51;n_step=3;prioritized=1;double_q=1;optimizer=adam;lr=6.25e-5;adam_eps=1.5e-4", given, user);
    if (is_image(env)) kind_defaults(cfg, DOPAMINE_SCHEDULE ";" DOPAMINE_C51, given, user);
    fill_auto(cfg, env);
}

/* Data-efficient Rainbow (van Hasselt et al. 2019; Dopamine's DER settings as used by the
 * SoftMoE-in-RL paper): 10-step returns, one update per step, learning after 1600 frames, target
 * update every 2000, epsilon 1 -> 0.01 over 2000 frames, Adam lr 1e-4 eps 1.5e-4, C51, prioritised,
 * double Q; on images Dopamine's C51 on MinAtar (DOPAMINE_C51). Here exploration is epsilon-greedy:
 * no noisy nets and no dueling head. */
static void der_env_defaults(void *cfg, const sm_env_spec *env, int (*given)(const void *, const char *), const void *user) {
    kind_defaults(cfg,
                  "atoms=51;n_step=10;prioritized=1;double_q=1;optimizer=adam;lr=1e-4;adam_eps=1.5e-4;learning_starts=1600;"
                  "train_freq=1;target_update=2000;eps_end=0.01;eps_frames=2000",
                  given, user);
    if (is_image(env)) kind_defaults(cfg, DOPAMINE_C51, given, user);
    fill_auto(cfg, env);
}

static sm_status dqn_check(const void *cfgv, const sm_env_spec *env, sm_error *err) {
    const sm_dqn_config *c = cfgv;
    (void)env;
    if (c->num_envs < 1) return sm_fail(err, SM_ERR_ARG, "num_envs must be >= 1 (got %d)", c->num_envs);
    if (c->batch_size < 1) return sm_fail(err, SM_ERR_ARG, "batch_size must be >= 1 (got %d)", c->batch_size);
    if (c->n_step < 1) return sm_fail(err, SM_ERR_ARG, "n_step must be >= 1 (got %d)", c->n_step);
    if (c->buffer_size < c->batch_size)
        return sm_fail(err, SM_ERR_ARG, "batch_size %d is larger than the replay buffer_size %d", c->batch_size, c->buffer_size);
    if (c->buffer_size / c->num_envs < c->n_step + 1)
        return sm_fail(err, SM_ERR_ARG, "buffer_size %d over %d environments is too small for %d-step returns", c->buffer_size,
                       c->num_envs, c->n_step);
    if (c->train_freq < 1 || c->target_update < 1)
        return sm_fail(err, SM_ERR_ARG, "train_freq and target_update must be >= 1");
    if (c->learning_starts < 0) return sm_fail(err, SM_ERR_ARG, "learning_starts must be >= 0");
    if (!(c->gamma >= 0 && c->gamma <= 1)) return sm_fail(err, SM_ERR_ARG, "gamma must be in [0, 1] (got %g)", c->gamma);
    if (!(c->tau > 0 && c->tau <= 1)) return sm_fail(err, SM_ERR_ARG, "tau must be in (0, 1] (got %g)", c->tau);
    if (!(c->lr > 0)) return sm_fail(err, SM_ERR_ARG, "lr must be > 0 (got %g)", c->lr);
    if (!(c->eps_start >= 0 && c->eps_start <= 1 && c->eps_end >= 0 && c->eps_end <= 1))
        return sm_fail(err, SM_ERR_ARG, "eps_start and eps_end must be in [0, 1]");
    if (c->eps_frames < 0) return sm_fail(err, SM_ERR_ARG, "eps_frames must be >= 0");
    if (c->atoms < 1) return sm_fail(err, SM_ERR_ARG, "atoms must be >= 1");
    if (c->atoms > 1 && !(c->v_max > c->v_min)) return sm_fail(err, SM_ERR_ARG, "v_max must exceed v_min (got %g, %g)", c->v_min, c->v_max);
    if (strcmp(c->optimizer, "adam") && strcmp(c->optimizer, "rmsprop"))
        return sm_fail(err, SM_ERR_ARG, "optimizer must be adam or rmsprop (got '%s')", c->optimizer);
    if (strcmp(c->loss, "huber") && strcmp(c->loss, "mse"))
        return sm_fail(err, SM_ERR_ARG, "loss must be huber or mse (got '%s')", c->loss);
    if (c->prioritized &&
        !(c->per_alpha >= 0 && c->per_beta >= 0 && c->per_beta <= 1 && c->per_beta_end >= 0 && c->per_beta_end <= 1 && c->per_eps > 0))
        return sm_fail(err, SM_ERR_ARG, "per_alpha >= 0, per_beta and per_beta_end in [0, 1] and per_eps > 0 are needed");
    if (c->log_every < 1 || c->ckpt_every < 0) return sm_fail(err, SM_ERR_ARG, "log_every must be >= 1 and ckpt_every >= 0");
    if (c->reset_every < 0 || c->reset_experts < 0 || !isfinite(c->reset_shrink) || !isfinite(c->reset_perturb))
        return sm_fail(err, SM_ERR_ARG, "reset_every and reset_experts must be >= 0, reset_shrink and reset_perturb finite");
    if (c->prune_experts < 0 || c->prune_from < 0 || c->prune_to < c->prune_from)
        return sm_fail(err, SM_ERR_ARG, "prune_experts and prune_from must be >= 0 and prune_to >= prune_from");
    sm_act a;
    if (sm_act_parse(c->act, &a)) return sm_fail(err, SM_ERR_ARG, "unknown activation '%s'", c->act);
    return SM_OK;
}

/* MinAtar's DQN exactly (Young & Tian 2019: Sec. 4 and their Table of hyper-parameters). */
static const char *const kPresets[] = {
    "minatar",
    "arch=conv:16:3:1:0,dense:128;act=relu;num_envs=1;total_frames=5000000;buffer_size=100000;batch_size=32;"
    "learning_starts=5000;train_freq=1;target_update=1000;tau=1;gamma=0.99;optimizer=rmsprop;lr=0.00025;rms_alpha=0.95;"
    "rms_eps=0.01;rms_centered=1;eps_start=1;eps_end=0.1;eps_frames=100000;loss=huber;double_q=0;n_step=1;atoms=1;prioritized=0",
    "cleanrl",
    "arch=dense:120,dense:84;act=relu;num_envs=1;total_frames=500000;buffer_size=10000;batch_size=128;learning_starts=10000;"
    "train_freq=10;target_update=500;tau=1;gamma=0.99;optimizer=adam;lr=0.00025;eps_start=1;eps_end=0.05;eps_frames=250000;"
    "loss=mse;double_q=0;n_step=1;atoms=1;prioritized=0",
    /* The SoftMoE-in-RL paper's Table 1 (papers/003, App. A; Dopamine's dqn.gin and rainbow.gin),
     * counted in agent steps, which are MinAtar's frames: Adam 6.25e-5 / 1.5e-4, batch 32, an update
     * every 4 steps, target every 8000, learning after 20000, epsilon 1 -> 0.01 over 250k, MSE (the
     * paper's change from DQN's Huber), no double Q (its Rainbow-lite is C51, n-step and prioritised
     * replay only), and for C51 Dopamine's MinAtar choices (DOPAMINE_C51: importance exponent fixed
     * at 0.5, support [-100, 100]). Three deviations: the replay stays MinAtar's 100k (Table 1: 1M,
     * sized for 200M Atari frames); rewards are not clipped (Table 1: clipped; MinAtar's rewards are
     * small, but a Seaquest surfacing pays up to 10; Dopamine's own MinAtar configurations do not clip
     * either, hence their support of 100); sticky actions stay MinAtar's 0.1 (Dopamine's 0.25). The
     * network, n-step, atoms and prioritised replay are left to the agent: with `dqn` this is the
     * paper's DQN, with `rainbow` its Rainbow-lite; DER has its own column, `der`'s defaults. */
    "dopamine",
    "num_envs=1;buffer_size=100000;batch_size=32;tau=1;gamma=0.99;optimizer=adam;lr=6.25e-5;adam_eps=1.5e-4;loss=mse;double_q=0;"
    DOPAMINE_SCHEDULE ";" DOPAMINE_C51,
    NULL};

/* ---- the agent ---- */

typedef struct {
    sm_dqn_config c;
    const sm_env_spec *env;
    int A, K, D, out;     /* actions, atoms, observation values, network outputs A*K */
    double dz;
    sm_model *q, *qt;     /* online and target networks */
    sm_real *support;     /* (K) atoms z_j */
    int poison;           /* testing aid (sm_rl_run.fault_nan_update): this update's loss is NaN */
} dqn_nets;

static sm_status build_nets(dqn_nets *n, const sm_dqn_config *c, const sm_env_spec *env, const sm_model_config *tmpl,
                            int max_T, sm_rng *rng, sm_error *err) {
    memset(n, 0, sizeof *n);
    n->c = *c;
    n->env = env;
    n->A = env->act_n;
    n->K = c->atoms > 1 ? c->atoms : 1;
    n->D = sm_env_obs_numel(env);
    n->out = n->A * n->K;
    sm_model_config mc;
    if (tmpl) mc = *tmpl;
    else sm_model_config_default(&mc);
    sm_status st = sm_model_parse_arch(&mc, c->arch, err);
    if (st != SM_OK) return st;
    (void)sm_act_parse(c->act, &mc.act);
    mc.in_c = env->obs_c;
    mc.in_h = env->obs_h;
    mc.in_w = env->obs_w;
    mc.in_dim = n->D;
    mc.n_classes = n->out;
    if (!(n->q = sm_model_create(&mc, max_T, rng, err))) return err ? err->code : SM_ERR_ARG;
    if (!(n->qt = sm_model_create(&mc, c->batch_size, NULL, err))) return err ? err->code : SM_ERR_ARG;
    memcpy(n->qt->params.data, n->q->params.data, sizeof(sm_real) * n->q->params.total);
    n->support = calloc((size_t)n->K, sizeof(sm_real));
    if (!n->support) return sm_fail(err, SM_ERR_NOMEM, "out of memory");
    n->dz = n->K > 1 ? (c->v_max - c->v_min) / (n->K - 1) : 0;
    for (int j = 0; j < n->K; j++) n->support[j] = (sm_real)(n->K > 1 ? c->v_min + j * n->dz : 0);
    return SM_OK;
}

static void free_nets(dqn_nets *n) {
    sm_model_free(n->q);
    sm_model_free(n->qt);
    free(n->support);
}

/* The mean of one action's atom distribution: p (K) = softmax(z), returned sum_j p_j support_j. */
static sm_real atom_mean(const dqn_nets *n, const sm_real *z, sm_real *p) {
    const int K = n->K;
    double mx = z[0], s = 0, e = 0;
    for (int j = 1; j < K; j++) mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < K; j++) s += (p[j] = (sm_real)exp(z[j] - mx));
    for (int j = 0; j < K; j++) {
        p[j] = (sm_real)(p[j] / s);
        e += p[j] * n->support[j];
    }
    return (sm_real)e;
}

/* Q-values (T, A) from network outputs (T, A*K): identity, or the mean of the atom distribution.
 * probs (T, A*K) receives the per-action softmax when K > 1. */
static void q_values(const dqn_nets *n, const sm_real *out, int T, sm_real *q, sm_real *probs) {
    const int A = n->A, K = n->K;
    if (K == 1) {
        memcpy(q, out, sizeof(sm_real) * (size_t)T * A);
        return;
    }
    for (int t = 0; t < T * A; t++) q[t] = atom_mean(n, out + (size_t)t * K, probs + (size_t)t * K);
}

static int argmax(const sm_real *q, int A) {
    int best = 0;
    for (int a = 1; a < A; a++)
        if (q[a] > q[best]) best = a;
    return best;
}

/* The greedy policy of a checkpoint. */
typedef struct {
    dqn_nets nets;
    sm_real *q, *probs;
} dqn_policy;

static void policy_act(sm_policy *p, const float *obs, int N, int *a_disc, float *a_box) {
    (void)a_box;
    dqn_policy *d = p->impl;
    const sm_real *out = sm_model_forward(d->nets.q, obs, N, NULL, 0);
    q_values(&d->nets, out, N, d->q, d->probs);
    for (int i = 0; i < N; i++) a_disc[i] = argmax(d->q + (size_t)i * d->nets.A, d->nets.A);
}

static void policy_destroy(sm_policy *p) {
    dqn_policy *d = p->impl;
    free_nets(&d->nets);
    free(d->q);
    free(d->probs);
    free(d);
    free(p);
}

static const sm_agent_kind *kind_named(const char *name);

/* Reads the agent settings, env and network of a checkpoint written by write_ckpt. */
static sm_status read_header(const sm_safetensors *st, const char *path, sm_dqn_config *c, const sm_env_spec **env,
                             sm_model_config *mc, sm_error *err) {
    const char *agent = sm_safetensors_meta(st, "agent"), *envn = sm_safetensors_meta(st, "env"),
               *set = sm_safetensors_meta(st, "agent_settings"), *net = sm_safetensors_meta(st, "model");
    const sm_agent_kind *k = agent ? kind_named(agent) : NULL;
    if (!k || !envn || !set || !net) return sm_fail(err, SM_ERR_FORMAT, "%s: not a DQN-family checkpoint", path);
    if (!(*env = sm_env_find(envn)))
        return sm_fail(err, SM_ERR_FORMAT, "%s: environment '%s' is unknown to this build (one of: %s)", path, envn, sm_env_names());
    cJSON *o = cJSON_Parse(set);
    if (!o) return sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.agent_settings is not JSON", path);
    char what[600];
    snprintf(what, sizeof what, "%s: __metadata__.agent_settings", path);
    sm_status s = sm_agent_config_from_json(k, c, o, what, err);
    cJSON_Delete(o);
    if (s != SM_OK) return s;
    sm_error e2 = {0};
    if (sm_model_config_from_json(mc, net, &e2) != SM_OK) return sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.model: %s", path, e2.msg);
    return SM_OK;
}

static sm_policy *dqn_load_policy(const char *path, int max_N, sm_error *err) {
    sm_safetensors st;
    if (sm_safetensors_load(&st, path, err) != SM_OK) return NULL;
    sm_dqn_config c;
    const sm_env_spec *env = NULL;
    sm_model_config mc;
    sm_policy *p = calloc(1, sizeof *p);
    dqn_policy *d = calloc(1, sizeof *d);
    sm_status s = !p || !d ? sm_fail(err, SM_ERR_NOMEM, "out of memory") : read_header(&st, path, &c, &env, &mc, err);
    if (s == SM_OK) {
        c.batch_size = 1; /* the target network is not used */
        s = build_nets(&d->nets, &c, env, &mc, max_N, NULL, err);
    }
    if (s == SM_OK) {
        sm_ckpt_set set = {"", &d->nets.q->params, NULL};
        s = sm_checkpoint_read_sets(&st, path, &set, 1, NULL, err);
    }
    if (s == SM_OK) {
        d->q = calloc((size_t)max_N * d->nets.A, sizeof(sm_real));
        d->probs = calloc((size_t)max_N * d->nets.out, sizeof(sm_real));
        if (!d->q || !d->probs) s = sm_fail(err, SM_ERR_NOMEM, "out of memory");
    }
    sm_safetensors_free(&st);
    if (s != SM_OK) {
        if (d) {
            free_nets(&d->nets);
            free(d->q);
            free(d->probs);
        }
        free(d);
        free(p);
        return NULL;
    }
    p->env = env;
    p->act = policy_act;
    p->destroy = policy_destroy;
    p->max_N = max_N;
    p->impl = d;
    p->net = d->nets.q;
    return p;
}

/* ---- training ---- */

/* Everything of the loop besides networks, optimiser, replay and environments: plain data, saved
 * as one blob for exact resume. */
typedef struct {
    long frames, updates, vsteps, episodes;
    sm_rng rng;
    long optim_step;
    double loss_sum, q_sum, recent, tail_sum;
    long loss_n, tail_n, next_log, next_ckpt, next_target;
    long replay_written;
    int replay_head;
    double replay_max_prio;
} dqn_counters;

/* The replay's arrays and the vector's state as blobs (exact resume); n_out of at most 9. */
static int state_blobs(const sm_replay *rb, const sm_vecenv *v, const float *obs, void *venv, const dqn_counters *ct,
                       sm_ckpt_blob *bl) {
    const size_t T = (size_t)rb->rows * rb->N,
                 OD = T * (rb->binary ? (size_t)rb->obs_bytes : (size_t)rb->D * sizeof(float));
    int n = 0;
    bl[n++] = (sm_ckpt_blob){"state.counters", ct, sizeof *ct};
    bl[n++] = (sm_ckpt_blob){"state.envs", venv, sm_vecenv_state_size(v)};
    bl[n++] = (sm_ckpt_blob){"state.obs", obs, sizeof(float) * (size_t)v->num_envs * sm_env_obs_numel(v->spec)};
    /* binary observations as bits under their own names (replays of older checkpoints, one byte per
     * value under replay.obs / replay.next, are read by read_ckpt) */
    bl[n++] = rb->binary ? (sm_ckpt_blob){"replay.obs_bits", rb->obsbits, OD} : (sm_ckpt_blob){"replay.obs", rb->obsf, OD};
    bl[n++] = rb->binary ? (sm_ckpt_blob){"replay.next_bits", rb->nextbits, OD} : (sm_ckpt_blob){"replay.next", rb->nextf, OD};
    bl[n++] = (sm_ckpt_blob){"replay.act", rb->act, T * sizeof *rb->act};
    bl[n++] = (sm_ckpt_blob){"replay.rew", rb->rew, T * sizeof *rb->rew};
    bl[n++] = (sm_ckpt_blob){"replay.flags", rb->term, T}; /* term, then end below */
    bl[n++] = (sm_ckpt_blob){"replay.end", rb->end, T};
    return n;
}

/* The checkpoint of rank r of a data-parallel run: the run's own path for rank 0, and beside it
 * <name>.rank<r>.safetensors for the others (the same networks, that rank's environments, counters
 * and replay). */
static void rank_path(char *out, size_t n, const char *path, int rank) {
    size_t len = strlen(path), ext = strlen(".safetensors");
    if (rank == 0) snprintf(out, n, "%s", path);
    else if (len > ext && !strcmp(path + len - ext, ".safetensors")) snprintf(out, n, "%.*s.rank%d.safetensors", (int)(len - ext), path, rank);
    else snprintf(out, n, "%s.rank%d", path, rank);
}

static sm_status write_ckpt_file(const char *dir, const sm_agent_kind *k, const sm_dqn_config *c, const sm_rl_run *run,
                                 const dqn_nets *n, const sm_optim *opt, dqn_counters *ct, const sm_replay *rb,
                                 const sm_vecenv *v, const float *obs, int save_replay, const sm_dist *dist, sm_error *err) {
    char main_path[4200], path[4300];
    snprintf(main_path, sizeof main_path, "%s/checkpoint.safetensors", dir);
    rank_path(path, sizeof path, main_path, dist->rank);
    cJSON *set = sm_agent_config_to_json(k, c);
    char *set_s = set ? cJSON_PrintUnformatted(set) : NULL, *net_s = sm_model_config_to_json(&n->q->cfg);
    cJSON_Delete(set);
    char frames[32], seed[32], total[32], ranks[16], sticky[32];
    snprintf(ranks, sizeof ranks, "%d", dist->size);
    snprintf(sticky, sizeof sticky, "%.17g", run->env_opts.sticky);
    snprintf(frames, sizeof frames, "%ld", ct->frames);
    snprintf(total, sizeof total, "%ld", run->frames > 0 ? run->frames : (long)c->total_frames);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)run->seed);
    sm_st_meta meta[] = {{"format", "specmoe"}, {"agent", (char *)k->name}, {"env", (char *)run->env},
                         {"agent_settings", set_s}, {"model", net_s},        {"frames", frames},
                         {"seed", seed},            {"frames_total", total},     {"sticky", sticky},
                         {"ranks", ranks}};
    const int n_meta = (int)SM_LEN(meta) - (dist->size > 1 ? 0 : 1); /* "ranks" only when more than one */
    sm_ckpt_set sets[] = {{"", &n->q->params, (sm_optim *)opt}, {"target.", &n->qt->params, NULL}};
    ct->optim_step = opt->step;
    ct->replay_written = rb->written;
    ct->replay_head = rb->head;
    ct->replay_max_prio = rb->max_prio;
    sm_ckpt_blob bl[12];
    /* the environments' state is only needed when the run's state is saved */
    void *venv = save_replay ? malloc(sm_vecenv_state_size(v)) : NULL;
    int nb = save_replay ? state_blobs(rb, v, obs, venv, ct, bl) : 0;
    double *leaves = NULL;
    if (save_replay && rb->tree.t) { /* the priorities: the tree's leaves */
        leaves = malloc(sizeof(double) * (size_t)rb->tree.n);
        if (leaves) for (long i = 0; i < rb->tree.n; i++) leaves[i] = sm_sumtree_get(&rb->tree, i);
        bl[nb++] = (sm_ckpt_blob){"replay.priority", leaves, sizeof(double) * (size_t)rb->tree.n};
    }
    if (venv) sm_vecenv_save(v, venv);
    sm_status st = !set_s || !net_s || (save_replay && !venv) || (rb->tree.t && save_replay && !leaves)
                       ? sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path)
                       : sm_checkpoint_write_blobs(path, sets, 2, meta, n_meta, bl, nb, err);
    free(set_s);
    free(net_s);
    free(venv);
    free(leaves);
    return st;
}

/* This rank's checkpoint file (rank_path); the other ranks' files only carry their run state, so
 * they are written only when it is saved. Collective under mpirun: every rank stops if any rank
 * could not write its file. */
static sm_status write_ckpt(const char *dir, const sm_agent_kind *k, const sm_dqn_config *c, const sm_rl_run *run,
                            const dqn_nets *n, const sm_optim *opt, dqn_counters *ct, const sm_replay *rb,
                            const sm_vecenv *v, const float *obs, int save_replay, sm_dist *dist, sm_error *err) {
    if (!dir) return SM_OK;
    sm_status st = dist->rank > 0 && !save_replay ? SM_OK
                                                  : write_ckpt_file(dir, k, c, run, n, opt, ct, rb, v, obs, save_replay, dist, err);
    if (dist->size > 1) {
        double failed = st != SM_OK;
        if (sm_dist_max(dist, &failed, 1, NULL) != SM_OK || (failed > 0 && st == SM_OK))
            st = sm_fail(err, SM_ERR_IO, "%s: another rank could not write its checkpoint", dir);
    }
    return st;
}

/* Restores a run written by write_ckpt: the settings and network must be the ones of this run
 * (resume takes them from the checkpoint; the CLI does not retype them). */
static sm_status read_ckpt(const char *main_path, const sm_agent_kind *k, const sm_dqn_config *c, const sm_rl_run *run,
                           dqn_nets *n, sm_optim *opt, dqn_counters *ct, sm_replay *rb, sm_vecenv *v, float *obs,
                           const sm_dist *dist, sm_error *err) {
    char path[4300];
    rank_path(path, sizeof path, main_path, dist->rank);
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, path, err);
    if (s != SM_OK) return s;
    /* each rank's environments and replay are in its own file: a run resumes on as many ranks */
    const char *ranks = sm_safetensors_meta(&st, "ranks");
    const int written_by = ranks ? atoi(ranks) : 1;
    if (written_by != dist->size) {
        sm_safetensors_free(&st);
        return sm_fail(err, SM_ERR_MISMATCH, "%s: written by a run on %d rank(s), resumed on %d: each rank's environments and "
                       "replay are in its own file, so resume it on %d (mpirun -np %d; 1: without mpirun)", path, written_by,
                       dist->size, written_by, written_by);
    }
    const char *agent = sm_safetensors_meta(&st, "agent"), *env = sm_safetensors_meta(&st, "env"),
               *set = sm_safetensors_meta(&st, "agent_settings"), *net = sm_safetensors_meta(&st, "model");
    cJSON *mine = sm_agent_config_to_json(k, c);
    char *mine_s = mine ? cJSON_PrintUnformatted(mine) : NULL, *net_s = sm_model_config_to_json(&n->q->cfg);
    char *theirs = sm_agent_settings_canonical(k, set); /* a checkpoint older than an option: its default */
    cJSON_Delete(mine);
    if (!agent || strcmp(agent, k->name)) s = sm_fail(err, SM_ERR_MISMATCH, "%s: written by agent '%s', not %s", path, agent ? agent : "none", k->name);
    else if (!env || strcmp(env, run->env)) s = sm_fail(err, SM_ERR_MISMATCH, "%s: trained on %s, not %s", path, env ? env : "none", run->env);
    else if (!theirs || !mine_s || strcmp(theirs, mine_s)) s = sm_fail(err, SM_ERR_MISMATCH, "%s: its agent settings differ from this run's (%s vs %s)", path, set ? set : "none", mine_s ? mine_s : "?");
    else if (!net || !net_s || strcmp(net, net_s)) s = sm_fail(err, SM_ERR_MISMATCH, "%s: its network differs from this run's", path);
    free(mine_s);
    free(theirs);
    free(net_s);
    sm_ckpt_set sets[] = {{"", &n->q->params, opt}, {"target.", &n->qt->params, NULL}};
    if (s == SM_OK) s = sm_checkpoint_read_sets(&st, path, sets, 2, NULL, err);
    sm_ckpt_blob bl[12];
    void *venv = malloc(sm_vecenv_state_size(v));
    int nb = state_blobs(rb, v, obs, venv, ct, bl);
    if (!venv && s == SM_OK) s = sm_fail(err, SM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nb && s == SM_OK; i++) {
        if (rb->binary && !strncmp(bl[i].name, "replay.", 7) && strstr(bl[i].name, "_bits") &&
            !sm_safetensors_find(&st, bl[i].name)) {
            /* a checkpoint written before the replay held bits: one byte per value, packed here */
            const size_t T = (size_t)rb->rows * rb->N;
            const char *old = !strcmp(bl[i].name, "replay.obs_bits") ? "replay.obs" : "replay.next";
            uint8_t *bytes = malloc(T * (size_t)rb->D);
            if (!bytes) s = sm_fail(err, SM_ERR_NOMEM, "out of memory");
            else if ((s = sm_checkpoint_read_blob(&st, path, old, bytes, T * (size_t)rb->D, err)) == SM_OK)
                sm_replay_pack_bytes(rb, (uint8_t *)bl[i].data, bytes, T);
            free(bytes);
            continue;
        }
        s = sm_checkpoint_read_blob(&st, path, bl[i].name, (void *)bl[i].data, bl[i].bytes, err);
    }
    if (s == SM_OK) {
        sm_vecenv_load(v, venv);
        opt->step = ct->optim_step;
        rb->written = ct->replay_written;
        rb->head = ct->replay_head;
        rb->max_prio = ct->replay_max_prio;
        if (rb->tree.t) {
            double *leaves = malloc(sizeof(double) * (size_t)rb->tree.n);
            if (!leaves) s = sm_fail(err, SM_ERR_NOMEM, "out of memory");
            else s = sm_checkpoint_read_blob(&st, path, "replay.priority", leaves, sizeof(double) * (size_t)rb->tree.n, err);
            for (long i = 0; s == SM_OK && i < rb->tree.n; i++) sm_sumtree_set(&rb->tree, i, leaves[i]);
            free(leaves);
        }
    }
    free(venv);
    sm_safetensors_free(&st);
    return s;
}

static double epsilon_at(const sm_dqn_config *c, long frames) {
    if (frames < c->learning_starts) return 1.0; /* random play fills the replay */
    if (c->eps_frames <= 0) return c->eps_end;
    double f = (double)(frames - c->learning_starts) / c->eps_frames;
    if (f > 1) f = 1;
    return c->eps_start + f * (c->eps_end - c->eps_start);
}

/* Buffers of one run: one allocation per role. */
typedef struct {
    float *obs, *prev, *fin, *rew;
    int *act;
    unsigned char *term, *trunc;
    sm_real *qa;            /* (max(N, B), A) Q-values */
    sm_real *pa;            /* (max(N, B), A*K) action distributions */
    sm_real *qo, *po;       /* (B, A), (B, A*K) the online network's on s' (double Q) */
    sm_real *pt;            /* (B, K) target distribution of a* */
    sm_real *y, *td, *m;    /* (B), (B), (B, K) */
    int *astar;             /* (B) */
    sm_real *tout;          /* (B, A*K) a copy of the target network's outputs */
    double *red;            /* (2 + P) an update's loss, mean Q and every rank's finiteness flag */
    sm_replay_batch batch;
} dqn_bufs;

static sm_status bufs_alloc(dqn_bufs *b, int N, int B, int P, const dqn_nets *n, sm_error *err) {
    memset(b, 0, sizeof *b);
    const size_t D = (size_t)n->D, A = (size_t)n->A, O = (size_t)n->out, M = (size_t)(N > B ? N : B);
    b->obs = calloc((size_t)N * D, sizeof(float));
    b->prev = calloc((size_t)N * D, sizeof(float));
    b->fin = calloc((size_t)N * D, sizeof(float));
    b->rew = calloc((size_t)N, sizeof(float));
    b->act = calloc((size_t)N, sizeof(int));
    b->term = calloc((size_t)N, 1);
    b->trunc = calloc((size_t)N, 1);
    sm_real **rp[] = {&b->qa, &b->pa, &b->qo, &b->po, &b->pt, &b->y, &b->td, &b->m, &b->tout};
    size_t rs[] = {M * A, M * O, (size_t)B * A, (size_t)B * O, (size_t)B * n->K, (size_t)B, (size_t)B, (size_t)B * n->K, (size_t)B * O};
    sm_real *blk = sm_carve(rp, rs, SM_LEN(rs), err, "DQN buffers (batch %d)", B);
    b->astar = calloc((size_t)B, sizeof(int));
    b->batch.obs = calloc((size_t)B * D, sizeof(float));
    b->batch.next = calloc((size_t)B * D, sizeof(float));
    b->batch.act = calloc((size_t)B, sizeof(int));
    b->batch.ret = calloc((size_t)B, sizeof(float));
    b->batch.disc = calloc((size_t)B, sizeof(float));
    b->batch.idx = calloc((size_t)B, sizeof(long));
    b->batch.weight = calloc((size_t)B, sizeof(float));
    b->red = calloc(2 + (size_t)P, sizeof(double));
    if (!blk || !b->red || !b->obs || !b->prev || !b->fin || !b->rew || !b->act || !b->term || !b->trunc || !b->astar ||
        !b->batch.obs || !b->batch.next || !b->batch.act || !b->batch.ret || !b->batch.disc || !b->batch.idx ||
        !b->batch.weight)
        return sm_fail(err, SM_ERR_NOMEM, "DQN buffers: out of memory");
    return SM_OK;
}

static void bufs_free(dqn_bufs *b) {
    free(b->red);
    free(b->obs);
    free(b->prev);
    free(b->fin);
    free(b->rew);
    free(b->act);
    free(b->term);
    free(b->trunc);
    free(b->qa); /* the carved block starts at qa */
    free(b->astar);
    free(b->batch.obs);
    free(b->batch.next);
    free(b->batch.act);
    free(b->batch.ret);
    free(b->batch.disc);
    free(b->batch.idx);
    free(b->batch.weight);
}

/* The dormant neurons (sm_model_dormant) of the online network on the last update's batch, as
 * "dormant/layers.<i>" and "dormant/layers.<i>.expert<e>" records. */
static sm_status log_dormant(sm_rl_log *log, dqn_nets *n, dqn_bufs *b, long frames, double tau, sm_error *err) {
    enum { MAX_ENTRIES = 64 };
    sm_model_forward(n->q, b->batch.obs, n->c.batch_size, NULL, 0);
    sm_dormant_entry e[MAX_ENTRIES];
    int k = sm_model_dormant(n->q, n->c.batch_size, tau, e, MAX_ENTRIES);
    static char names[MAX_ENTRIES][48];
    const char *keys[MAX_ENTRIES];
    double vals[MAX_ENTRIES];
    for (int i = 0; i < k; i++) {
        if (e[i].expert < 0) snprintf(names[i], sizeof names[i], "dormant/layers.%d", e[i].layer);
        else snprintf(names[i], sizeof names[i], "dormant/layers.%d.expert%d", e[i].layer, e[i].expert);
        keys[i] = names[i];
        vals[i] = e[i].fraction;
    }
    return k ? sm_rl_log_record(log, frames, keys, vals, k, err) : SM_OK;
}

/* Resets or shrinks-and-perturbs the online network's experts (reset_*): in each MoE layer all of
 * them, or the reset_experts with the most dormant units on the last batch. */
static void reset_experts(dqn_nets *n, sm_optim *opt, dqn_bufs *b, sm_rng *rng) {
    const sm_dqn_config *c = &n->c;
    sm_model *q = n->q;
    enum { MAX_ENTRIES = 1024 };
    sm_dormant_entry e[MAX_ENTRIES];
    int ne = 0;
    if (c->reset_experts > 0) { /* the dormant units of every layer on the last batch, once */
        sm_model_forward(q, b->batch.obs, c->batch_size, NULL, 0);
        ne = sm_model_dormant(q, c->batch_size, c->dormant_tau >= 0 ? c->dormant_tau : 0.1, e, MAX_ENTRIES);
    }
    for (int l = 0; l < q->n_layers; l++) {
        if (!q->layers[l].moe) continue;
        int pick[MAX_ENTRIES], k = 0;
        if (c->reset_experts > 0)
            k = sm_moe_most_dormant(e, ne, l, c->reset_experts < MAX_ENTRIES ? c->reset_experts : MAX_ENTRIES, pick);
        sm_moe_shrink_perturb(q, opt, l, c->reset_experts > 0 ? pick : NULL, k, c->reset_router, c->reset_shrink,
                              c->reset_perturb, rng);
    }
}

/* One gradient step on a sampled batch: the loss into *loss and the mean Q of the chosen actions
 * into *mean_q. Data parallel (dist of more than one rank): this rank's share of the batch
 * (n->c.batch_size rows) from its own replay, importance weights renormalised by the largest over
 * the ranks, the gradients averaged over the ranks before the clip and the optimiser step, and the
 * loss and mean Q averaged too (every rank then decides alike on a non-finite loss). */
static sm_status update(dqn_nets *n, sm_optim *opt, sm_replay *rb, dqn_bufs *b, sm_rng *rng, double beta, sm_dist *dist,
                        double *loss, double *mean_q, sm_error *err) {
    const sm_dqn_config *c = &n->c;
    const int B = c->batch_size, A = n->A, K = n->K;
    sm_replay_batch *s = &b->batch;
    sm_replay_sample(rb, B, rng, beta, s);
    sm_status st = SM_OK;
    if (c->prioritized && dist->size > 1) {
        double gmax = s->wmax;
        if ((st = sm_dist_max(dist, &gmax, 1, err)) != SM_OK) return st;
        for (int i = 0; i < B; i++) s->weight[i] = (float)(s->weight[i] * (s->wmax / gmax));
    }
    /* 1. target network on s': Q_target(s') in qa, its atom distributions in pa */
    const sm_real *tout = sm_model_forward(n->qt, s->next, B, rng, 0);
    memcpy(b->tout, tout, sizeof(sm_real) * (size_t)B * n->out);
    q_values(n, b->tout, B, b->qa, b->pa);
    /* 2. a* = argmax of Q_online(s') (double Q, van Hasselt et al. 2016) or of Q_target(s'); the
     * online forward on s' comes before the one that is backpropagated */
    const sm_real *qsel = b->qa;
    if (c->double_q) {
        const sm_real *on = sm_model_forward(n->q, s->next, B, rng, 0);
        q_values(n, on, B, b->qo, b->po);
        qsel = b->qo;
    }
    for (int i = 0; i < B; i++) b->astar[i] = argmax(qsel + (size_t)i * A, A);
    if (K == 1) {
        for (int i = 0; i < B; i++) b->y[i] = (sm_real)(s->ret[i] + s->disc[i] * b->qa[(size_t)i * A + b->astar[i]]);
    } else {
        for (int i = 0; i < B; i++) memcpy(b->pt + (size_t)i * K, b->pa + ((size_t)i * A + b->astar[i]) * K, sizeof(sm_real) * K);
        sm_c51_project(b->m, b->pt, s->ret, s->disc, B, K, c->v_min, c->v_max);
    }
    /* 3. online network on s, loss, backward from the output gradient */
    sm_model *q = n->q;
    const sm_real *out = sm_model_forward(q, s->obs, B, rng, 1);
    double L;
    if (K == 1) {
        L = sm_dqn_td_loss(q->dlogits, b->td, out, s->act, b->y, c->prioritized ? s->weight : NULL, B, A,
                           !strcmp(c->loss, "huber"));
        double mq = 0;
        for (int i = 0; i < B; i++) mq += out[(size_t)i * A + s->act[i]];
        *mean_q = mq / B;
    } else {
        L = sm_c51_loss(q->dlogits, b->td, out, s->act, b->m, c->prioritized ? s->weight : NULL, B, A, K);
        /* the logged mean Q of the chosen actions: their distributions only (A times fewer exps) */
        double mq = 0;
        for (int i = 0; i < B; i++) mq += atom_mean(n, out + ((size_t)i * A + s->act[i]) * K, b->pa);
        *mean_q = mq / B;
    }
    sm_model_backward_set(q, B); /* zero_grad + backward, without zeroing what the backward overwrites */
    double *lq = b->red;
    lq[0] = n->poison ? NAN : L + q->aux_loss, lq[1] = *mean_q;
    if (dist->size > 1) {
        /* the loss, mean Q and every rank's finiteness flag first, so a NaN stops every rank here,
         * named, before the gradients are summed */
        memset(lq + 2, 0, sizeof(double) * dist->size);
        int finite = isfinite(lq[0]);
        for (size_t i = 0; finite && i < q->params.total; i++) finite = isfinite(q->params.grad[i]);
        lq[2 + dist->rank] = !finite;
        if ((st = sm_dist_sum(dist, lq, 2 + dist->size, err)) != SM_OK) return st;
        for (int r = 0; r < dist->size; r++)
            if (lq[2 + r] > 0) return sm_fail(err, SM_ERR_NUMERIC, "rank %d: the loss or a gradient is not finite", r);
        if ((st = sm_dist_grad_mean(dist, &q->params, err)) != SM_OK) return st;
        lq[0] /= dist->size, lq[1] /= dist->size;
    }
    *loss = lq[0], *mean_q = lq[1];
    if (c->max_grad_norm > 0) sm_clip_grad_norm(&q->params, c->max_grad_norm);
    sm_optim_step(opt, &q->params, c->lr);
    if (c->prioritized) {
        float pr[4096];
        for (int i0 = 0; i0 < B; i0 += 4096) {
            int m = B - i0 < 4096 ? B - i0 : 4096;
            for (int i = 0; i < m; i++) pr[i] = (float)fabs((double)b->td[i0 + i]);
            sm_replay_update(rb, s->idx + i0, pr, m, c->per_eps);
        }
    }
    return SM_OK;
}

static void target_update(dqn_nets *n) {
    const size_t P = n->q->params.total;
    sm_real *t = n->qt->params.data;
    const sm_real *o = n->q->params.data;
    if (n->c.tau >= 1) {
        memcpy(t, o, sizeof(sm_real) * P);
        return;
    }
    const sm_real tau = (sm_real)n->c.tau;
    for (size_t i = 0; i < P; i++) t[i] = tau * o[i] + (1 - tau) * t[i];
}

static sm_status dqn_train_kind(const sm_agent_kind *k, const void *cfgv, const sm_model_config *net, const sm_rl_run *run,
                                sm_rl_result *res, sm_error *err) {
    sm_dqn_config c = *(const sm_dqn_config *)cfgv;
    memset(res, 0, sizeof *res);
    const sm_env_spec *env = sm_env_find(run->env);
    if (!env) return sm_fail(err, SM_ERR_ARG, "unknown environment '%s' (one of: %s)", run->env, sm_env_names());
    const char *why = dqn_compatible(env);
    if (why) return sm_fail(err, SM_ERR_ARG, "%s on %s: %s", k->name, env->name, why);
    fill_auto(&c, env);
    sm_status st = dqn_check(&c, env, err);
    if (st != SM_OK) return st;
    /* data parallel under mpirun (see the file's head): this rank's share of the batch and replay */
    sm_dist solo = {.size = 1};
    sm_dist *dist = run->dist && run->dist->size > 1 ? run->dist : &solo;
    const int P = dist->size, rank = dist->rank;
    if (P > 1 && (c.batch_size % P || c.buffer_size / P < c.batch_size / P))
        return sm_fail(err, SM_ERR_ARG, "%s under mpirun: batch_size %d must be a multiple of the %d ranks (each samples its "
                       "share from its own replay of buffer_size / %d)", k->name, c.batch_size, P, P);
    if (P > 1 && (c.reset_every > 0 || c.prune_experts > 0))
        return sm_fail(err, SM_ERR_ARG, "%s under mpirun: reset_every and prune_experts choose experts from one rank's "
                       "batch, which the ranks do not share; run them in one process", k->name);
    /* the network's OpenMP regions use the run's thread count too (at RL sizes one thread is often
     * fastest: the matrices are small and threads cost more than they save) */
    if (run->threads > 0) omp_set_num_threads(run->threads);
    const long total = run->frames > 0 ? run->frames : c.total_frames;
    const int N = c.num_envs, B = c.batch_size / P;

    dqn_counters ct;
    memset(&ct, 0, sizeof ct); /* padding too: the struct is saved as bytes */
    sm_rng_seed(&ct.rng, run->seed);
    dqn_nets n;
    sm_vecenv v;
    memset(&v, 0, sizeof v);
    sm_replay rb;
    memset(&rb, 0, sizeof rb);
    dqn_bufs b;
    memset(&b, 0, sizeof b);
    sm_optim opt;
    memset(&opt, 0, sizeof opt);
    sm_rl_log log;
    memset(&log, 0, sizeof log);
    int have_nets = 0;
    if ((st = build_nets(&n, &c, env, net, N > B ? N : B, &ct.rng, err)) != SM_OK) goto done;
    have_nets = 1;
    n.c.batch_size = B; /* this rank's share (the settings keep the global batch) */
    /* the networks came from the shared seed; each rank then acts and samples with its own stream */
    if (rank > 0) sm_rng_seed(&ct.rng, sm_env_seed(run->seed ^ 0x52414E4BULL, rank));
    /* a pruning the network cannot take is refused before any work */
    if (c.prune_experts > 0 &&
        ((st = sm_model_prune_last(n.q, c.prune_experts, err)) != SM_OK || (st = sm_model_prune_last(n.q, 0, err)) != SM_OK))
        goto done;
    int pruned = 0;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.lr = c.lr;
    if (!strcmp(c.optimizer, "rmsprop")) {
        oc.kind = SM_OPT_RMSPROP;
        oc.alpha = c.rms_alpha;
        oc.eps = c.rms_eps;
        oc.centered = c.rms_centered;
    } else {
        oc.kind = SM_OPT_ADAM;
        oc.eps = c.adam_eps;
    }
    if ((st = sm_optim_init(&opt, &oc, &n.q->params, err)) != SM_OK) goto done;
    if ((st = sm_vecenv_init_at(&v, run->env, N, run->seed, rank * N, &run->env_opts, err)) != SM_OK) goto done;
    sm_vecenv_set_threads(&v, run->threads);
    if ((st = sm_replay_init(&rb, c.buffer_size / P, N, n.D, env->obs_binary, c.n_step, c.gamma, c.prioritized, c.per_alpha,
                             err)) != SM_OK)
        goto done;
    if ((st = bufs_alloc(&b, N, B, P, &n, err)) != SM_OK) goto done;
    const int save_replay = c.save_replay;

    sm_vecenv_bind(&v, b.obs, b.act, NULL, b.rew, b.term, b.trunc, b.fin);
    sm_vecenv_reset(&v);
    ct.recent = NAN;
    ct.next_log = c.log_every;
    ct.next_ckpt = c.ckpt_every > 0 ? c.ckpt_every : -1;
    ct.next_target = c.target_update;
    if (run->resume && (st = read_ckpt(run->resume, k, &c, run, &n, &opt, &ct, &rb, &v, b.obs, dist, err)) != SM_OK) goto done;
    /* the log opens at the checkpoint's frame: a resumed run keeps the records up to it (rl_log.c) */
    sm_rl_run lrun = *run; /* rank 0 alone writes settings.json and metrics.jsonl and prints */
    if (rank != 0) lrun.out_dir = NULL, lrun.progress = NULL;
    if ((st = sm_rl_log_open(&log, &lrun, k, &c, &n.q->cfg, ct.frames, err)) != SM_OK) goto done;
    const long frames0 = ct.frames, tail_from = total - total / 10;
    /* the NaN guard names the last good checkpoint: the one resumed from, then each one written */
    char last_ckpt[4200] = "";
    if (run->resume) snprintf(last_ckpt, sizeof last_ckpt, "%s", run->resume);
    log.frames0 = frames0;
    double t0 = sm_time_now();
    static const char *const kEp[] = {"episodic_return", "episodic_length", "epsilon"};
    static const char *const kLoss[] = {"losses/td_loss", "q_values", "SPS", "updates"};
    int stop_asked = 0; /* under mpirun: a rank's Ctrl-C, summed over the ranks at the last step */
    while (ct.frames < total) {
        if (P > 1 ? stop_asked : run->stop && *run->stop) {
            res->stopped = 1;
            break;
        }
        if (run->stop_after > 0 && ct.frames >= run->stop_after) {
            res->stopped = 2;
            break;
        }
        /* the experts pruned by now (a resumed run gets its count back here too), in both networks */
        const int want = sm_prune_count(c.prune_experts, c.prune_from, c.prune_to, ct.frames);
        if (want != pruned) {
            if ((st = sm_model_prune_last(n.q, want, err)) != SM_OK || (st = sm_model_prune_last(n.qt, want, err)) != SM_OK)
                goto done;
            pruned = want;
        }
        /* act: epsilon-greedy over the N environments */
        double eps = epsilon_at(&c, ct.frames);
        int greedy_needed = 0;
        for (int i = 0; i < N; i++) {
            if (sm_rng_uniform(&ct.rng) < eps) b.act[i] = (int)sm_rng_below(&ct.rng, (uint32_t)n.A);
            else b.act[i] = -1, greedy_needed = 1;
        }
        if (greedy_needed) {
            const sm_real *out = sm_model_forward(n.q, b.obs, N, &ct.rng, 0);
            q_values(&n, out, N, b.qa, b.pa);
            for (int i = 0; i < N; i++)
                if (b.act[i] < 0) b.act[i] = argmax(b.qa + (size_t)i * n.A, n.A);
        }
        memcpy(b.prev, b.obs, sizeof(float) * (size_t)N * n.D);
        sm_vecenv_step(&v);
        /* the next observation of an ended episode is its final one, not the reset's */
        for (int i = 0; i < N; i++)
            if (!(b.term[i] || b.trunc[i])) memcpy(b.fin + (size_t)i * n.D, b.obs + (size_t)i * n.D, sizeof(float) * n.D);
        sm_replay_add(&rb, b.prev, b.act, b.rew, b.term, b.trunc, b.fin);
        ct.frames += (long)N * P; /* frames of every rank: epsilon, learning_starts, targets and the budget count them */
        ct.vsteps++;
        sm_env_log el = sm_vecenv_log_take(&v);
        if (P > 1) { /* the step's finished episodes of every rank, and any rank's stop request */
            double r[4] = {(double)el.n, el.episode_return, el.episode_length, run->stop && *run->stop};
            if ((st = sm_dist_sum(dist, r, 4, err)) != SM_OK) goto done;
            el.n = (long)r[0], el.episode_return = r[1], el.episode_length = r[2], stop_asked = r[3] > 0;
        }
        if (el.n > 0) {
            ct.recent = el.episode_return / el.n;
            ct.episodes += el.n;
            if (ct.frames > tail_from) {
                ct.tail_sum += el.episode_return;
                ct.tail_n += el.n;
            }
            double vals[] = {ct.recent, el.episode_length / el.n, eps};
            if ((st = sm_rl_log_record(&log, ct.frames, kEp, vals, 3, err)) != SM_OK) goto done;
        }
        if (ct.frames >= c.learning_starts && ct.vsteps % c.train_freq == 0 && sm_replay_size(&rb) > 0) {
            double beta = c.per_beta + (c.per_beta_end - c.per_beta) * fmin(1.0, (double)ct.frames / (double)total), mq;
            double L = NAN;
            n.poison = run->fault_nan_update > 0 && ct.updates + 1 == run->fault_nan_update &&
                       (run->fault_rank < 0 || run->fault_rank == rank);
            if ((st = update(&n, &opt, &rb, &b, &ct.rng, beta, dist, &L, &mq, err)) != SM_OK) {
                if (st == SM_ERR_NUMERIC && err) { /* a rank's NaN: where, and the last good checkpoint */
                    char why[sizeof err->msg];
                    snprintf(why, sizeof why, "%s", err->msg);
                    sm_fail(err, st, "%s: %s at frame %ld (update %ld); last good checkpoint: %s%s", k->name, why, ct.frames,
                            ct.updates + 1, last_ckpt[0] ? last_ckpt : "none", last_ckpt[0] ? "" : " (none written yet)");
                }
                goto done;
            }
            if (!isfinite(L)) {
                st = sm_fail(err, SM_ERR_NUMERIC, "%s: loss became %g at frame %ld (update %ld); last good checkpoint: %s%s",
                             k->name, L, ct.frames, ct.updates, last_ckpt[0] ? last_ckpt : "none",
                             last_ckpt[0] ? "" : " (none written yet)");
                goto done;
            }
            ct.updates++;
            ct.loss_sum += L;
            ct.q_sum += mq;
            ct.loss_n++;
            if (run->dist_check > 0 && ct.updates % run->dist_check == 0 &&
                (st = sm_dist_check_same(dist, &n.q->params, ct.updates, err)) != SM_OK)
                goto done;
        }
        if (ct.frames >= ct.next_target) {
            target_update(&n);
            ct.next_target += c.target_update;
        }
        if (c.reset_every > 0 && ct.updates > 0 && ct.frames / c.reset_every != (ct.frames - N) / c.reset_every)
            reset_experts(&n, &opt, &b, &ct.rng);
        if (ct.frames >= ct.next_log) {
            ct.next_log += c.log_every;
            if (ct.loss_n) {
                double vals[] = {ct.loss_sum / ct.loss_n, ct.q_sum / ct.loss_n, sm_rl_log_sps(&log, ct.frames), (double)ct.updates};
                if ((st = sm_rl_log_record(&log, ct.frames, kLoss, vals, 4, err)) != SM_OK) goto done;
                ct.loss_sum = ct.q_sum = 0;
                ct.loss_n = 0;
                if (c.dormant_tau >= 0 && rank == 0 && (st = log_dormant(&log, &n, &b, ct.frames, c.dormant_tau, err)) != SM_OK) goto done;
            }
            char extra[96];
            snprintf(extra, sizeof extra, "eps %.3f  updates %ld", eps, ct.updates);
            sm_rl_log_progress(&log, ct.frames, total, ct.recent, extra);
        }
        if (ct.next_ckpt > 0 && ct.frames >= ct.next_ckpt) {
            ct.next_ckpt += c.ckpt_every;
            if ((st = write_ckpt(run->out_dir, k, &c, run, &n, &opt, &ct, &rb, &v, b.obs, save_replay, dist, err)) != SM_OK) goto done;
            snprintf(last_ckpt, sizeof last_ckpt, "%s/checkpoint.safetensors", run->out_dir);
        }
    }
    if ((st = write_ckpt(run->out_dir, k, &c, run, &n, &opt, &ct, &rb, &v, b.obs, save_replay || res->stopped, dist, err)) != SM_OK)
        goto done;
    res->frames = ct.frames;
    res->frames_start = frames0;
    res->updates = ct.updates;
    res->episodes = ct.episodes;
    res->seconds = sm_time_now() - t0;
    res->last_return = ct.tail_n ? ct.tail_sum / ct.tail_n : NAN;
done:
    if (st == SM_OK) st = sm_rl_log_close(&log, err);
    else sm_rl_log_close(&log, NULL);
    bufs_free(&b);
    sm_replay_free(&rb);
    sm_vecenv_free(&v);
    sm_optim_free(&opt);
    if (have_nets) free_nets(&n);
    return st;
}

static sm_status dqn_train(const void *c, const sm_model_config *net, const sm_rl_run *run, sm_rl_result *res, sm_error *err) {
    return dqn_train_kind(&sm_agent_dqn, c, net, run, res, err);
}
static sm_status rainbow_train(const void *c, const sm_model_config *net, const sm_rl_run *run, sm_rl_result *res,
                               sm_error *err) {
    return dqn_train_kind(&sm_agent_rainbow, c, net, run, res, err);
}
static sm_status der_train(const void *c, const sm_model_config *net, const sm_rl_run *run, sm_rl_result *res, sm_error *err) {
    return dqn_train_kind(&sm_agent_der, c, net, run, res, err);
}

const sm_agent_kind sm_agent_dqn = {
    "dqn", "DQN (Mnih et al. 2015): MinAtar's settings on images, CleanRL's on vectors", sizeof(sm_dqn_config), kOpts,
    (int)SM_LEN(kOpts), kPresets, dqn_compatible, dqn_env_defaults, dqn_check, dqn_train, dqn_load_policy};
const sm_agent_kind sm_agent_rainbow = {
    "rainbow",
    "Rainbow-lite: C51 + 3-step + prioritised replay + double Q (no noisy nets, no dueling); on images Dopamine's "
    "schedule: an update every 4 steps, target every 8000, learning after 20000, epsilon 1 -> 0.01 over 250k",
    sizeof(sm_dqn_config), kOpts, (int)SM_LEN(kOpts), kPresets, dqn_compatible, rainbow_env_defaults, dqn_check,
    rainbow_train, dqn_load_policy};
const sm_agent_kind sm_agent_der = {
    "der", "data-efficient Rainbow (van Hasselt et al. 2019): 10-step, an update per step (epsilon-greedy, no noisy nets)",
    sizeof(sm_dqn_config), kOpts, (int)SM_LEN(kOpts), kPresets, dqn_compatible, der_env_defaults, dqn_check, der_train,
    dqn_load_policy};

static const sm_agent_kind *kind_named(const char *name) {
    const sm_agent_kind *all[] = {&sm_agent_dqn, &sm_agent_rainbow, &sm_agent_der};
    for (size_t i = 0; i < SM_LEN(all); i++)
        if (!strcmp(all[i]->name, name)) return all[i];
    return NULL;
}
