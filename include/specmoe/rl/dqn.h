/* The DQN family (src/rl/dqn.c): DQN (Mnih et al. 2015), double Q (van Hasselt et al. 2016), n-step
 * returns, prioritised replay (Schaul et al. 2016), the C51 distributional head (Bellemare et al.
 * 2017). Three agent kinds share one config and one loop and differ in their defaults:
 *   dqn      DQN; MinAtar's settings on image observations (Young & Tian 2019), CleanRL's dqn.py on
 *            vectors
 *   rainbow  "Rainbow-lite": C51 + n-step 3 + prioritised replay + double Q (no noisy nets, no dueling)
 *   der      data-efficient Rainbow (van Hasselt et al. 2019): n-step 10, one update per step, ... */
#ifndef SPECMOE_DQN_H
#define SPECMOE_DQN_H

#include "specmoe/rl/agent.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char arch[256];        /* Q-network hidden stack (--arch syntax); the head outputs A (x atoms) */
    char act[16];          /* activation */
    int num_envs;
    int total_frames;      /* the run's length unless run->frames says otherwise */
    int buffer_size;       /* replay capacity (transitions) */
    int batch_size;
    int learning_starts;   /* frames of random play before the first update */
    int train_freq;        /* vector steps between updates */
    int target_update;     /* frames between target-network updates */
    double tau;            /* target update: theta_t <- tau theta + (1 - tau) theta_t */
    double gamma;
    char optimizer[16];    /* adam | rmsprop */
    double lr, adam_eps, rms_alpha, rms_eps;
    int rms_centered;
    double eps_start, eps_end;
    int eps_frames;        /* linear decay after learning_starts */
    char loss[8];          /* huber | mse */
    int double_q, n_step;
    int atoms;             /* 1: expected Q; >= 2: C51 with `atoms` atoms on [v_min, v_max] */
    double v_min, v_max;
    int prioritized;
    double per_alpha, per_beta, per_eps; /* the importance exponent: per_beta -> per_beta_end, linear over the run */
    double per_beta_end;
    double max_grad_norm;  /* 0: no clipping */
    int log_every;         /* frames between loss records */
    /* resets / shrink-and-perturb of the network's experts (SoftMoE-in-RL Sec. 6; methods/softmoe_rl/reset.h) */
    int reset_every;       /* frames between them; 0 = never */
    int reset_experts;     /* per MoE layer: 0 = every expert, K = the K with the most dormant units */
    int reset_router;      /* the routers too */
    double reset_shrink, reset_perturb; /* theta <- shrink theta + perturb phi (a reset: 0, 1; S&P: 0.5, 0.5) */
    /* pruning of the network's experts during training (SoftMoE-in-RL Fig. 19; sm_model_prune_last):
     * prune_experts of each MoE layer, one at a time at evenly spaced frames from prune_from to
     * prune_to (all at prune_from when the two are equal) */
    int prune_experts;
    int prune_from, prune_to;
    double dormant_tau;    /* threshold of the dormant-neuron fractions logged with them (Sokar et al. 2023); < 0: none */
    int ckpt_every;        /* frames between checkpoints (0: at the end only) */
    int save_replay;       /* checkpoints hold the replay, environments and counters (exact resume) */
} sm_dqn_config;

extern const sm_agent_kind sm_agent_dqn, sm_agent_rainbow, sm_agent_der;

/* ---- losses (exported for the gradient checks) ---- */
/* TD loss on chosen Q-values: q (B, A) network outputs, act (B), y (B) targets, w (B) weights.
 * huber: 0.5 d^2 if |d| < 1 else |d| - 0.5 (smooth L1); mse: d^2. Returns sum_b w_b l(d_b) / B;
 * dq (B, A) gets w_b l'(d_b) / B at the chosen actions (zero elsewhere); td (B) gets d = q - y. */
double sm_dqn_td_loss(sm_real *dq, sm_real *td, const sm_real *q, const int *act, const sm_real *y,
                      const float *w, int B, int A, int huber);
/* C51 target: m (B, K) = projection of the distribution p_next (B, K) shifted by ret + disc * z onto
 * the support z_j = v_min + j (v_max - v_min) / (K - 1) (Bellemare et al. Alg. 1). */
void sm_c51_project(sm_real *m, const sm_real *p_next, const float *ret, const float *disc, int B, int K,
                    double v_min, double v_max);
/* C51 loss: logits (B, A, K), the chosen action's distribution against m: sum_b w_b CE_b / B;
 * dlogits (B, A, K) = w_b (softmax - m) / B at the chosen action; ce (B) per-sample cross-entropy. */
double sm_c51_loss(sm_real *dlogits, sm_real *ce, const sm_real *logits, const int *act, const sm_real *m,
                   const float *w, int B, int A, int K);

#ifdef __cplusplus
}
#endif
#endif
