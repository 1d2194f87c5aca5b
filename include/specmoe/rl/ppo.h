/* PPO (Schulman et al. 2017), following CleanRL's ppo.py (categorical head) and
 * ppo_continuous_action.py (Gaussian head with a state-independent log-std):
 *
 *   const sm_agent_kind *k = sm_agent_find("ppo");          // or &sm_agent_ppo
 *   sm_ppo_config cfg;  sm_opt_defaults(k->opts, k->n_opts, &cfg);
 *   sm_agent_apply_preset(k, &cfg, "cleanrl-continuous", &err);   // optional
 *   k->train(&cfg, NULL, &run, &res, &err);  // net (here NULL): a model-config template whose MoE and
 *                                            // router settings the networks take; layers: cfg.arch, cfg.act
 *
 * Separate actor and critic networks (specmoe models with the same hidden stack; the actor's head
 * gives logits or action means, the critic's one value), orthogonal initialisation (gain sqrt(2)
 * hidden, 0.01 policy head, 1 value head, zero biases), num_envs x num_steps rollouts, GAE, the
 * clipped surrogate with an entropy bonus and an optionally clipped value loss, minibatches x
 * epochs of Adam (eps 1e-5) under one global gradient-norm clip over actor + critic + log-std,
 * target-KL early stop, linear learning-rate anneal, running observation normalisation and reward
 * scaling (gym's NormalizeObservation / NormalizeReward, each clipped at 10).
 *
 * The loss pieces are exported for the gradient checks (tests/test_grad_ppo.c). Letters: B minibatch
 * rows, A actions (discrete: number of actions; box: dimension), T steps, N environments.
 */
#ifndef SPECMOE_PPO_H
#define SPECMOE_PPO_H

#include "specmoe/rl/agent.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const sm_agent_kind sm_agent_ppo;

/* The settings (option table: sm_agent_ppo.opts; presets "cleanrl-discrete", "cleanrl-continuous"). */
typedef struct {
    double learning_rate;
    int num_envs, num_steps;     /* rollout: batch = num_envs * num_steps */
    int anneal_lr;
    double gamma, gae_lambda;
    int num_minibatches, update_epochs;
    int norm_adv;
    double clip_coef;
    int clip_vloss;
    double ent_coef, vf_coef, max_grad_norm;
    double target_kl;            /* 0: no early stop */
    int norm_obs, norm_reward;
    char arch[256];              /* hidden stack of actor and critic */
    char actor[16];              /* mlp | mlp10x | moe | dense-moe | ds-moe: the actor built from arch (SPHERE Sec. 5.1) */
    char act[16];                /* its activation */
    uint64_t total_timesteps;    /* horizon of the learning-rate anneal; 0: the run's frame budget */
    int checkpoint_every;        /* updates between checkpoints (0: only at the end / on stop) */
    /* SPHERE on the actor (include/specmoe/methods/sphere/sphere.h, App. A.3): rho 0 is off */
    double sphere_rho;
    char sphere_mode[8];         /* grad | loss | fixed */
    int sphere_all_layers, sphere_per_expert, sphere_unweighted; /* Table 1's ablations */
    char sphere_gram[12];        /* feature | gradient (Table 1's gradient-Gram ablation) */
    /* the plasticity baselines of SPHERE's comparison on the actor (methods/sphere/baselines.h) */
    int layernorm;               /* LayerNorm in the actor's hidden layers (sm_model_config.hidden_ln) */
    int pw;                      /* Parseval regularisation (Chung et al. 2024) */
    double pw_coef, pw_scale;
    int redo, redo_every;        /* ReDo (Sokar et al. 2023): period in gradient steps */
    double redo_tau;
    int cbp;                     /* continual backprop (Dohare et al. 2024) */
    double cbp_rate, cbp_decay;
    int cbp_maturity;
    int sn;                      /* spectral normalisation (Miyato et al. 2018) */
    double specreg, specreg_k;   /* spectral regularisation (Lewandowski et al. 2025): lambda (0: off), k */
    int cchain;                  /* C-CHAIN churn reduction (Tang et al. 2025) */
    double cchain_ratio;
    int diag_every;              /* updates between diagnostics on a held-out batch (0: off) */
    int diag_states;             /* its size */
    int diag_slq;                /* SLQ probes for the eNTK rank beside the exact one (0: off) */
} sm_ppo_config;

/* Statistics of one minibatch's loss (CleanRL's names). */
typedef struct {
    double pg_loss, v_loss, entropy, approx_kl, old_approx_kl, clipfrac;
} sm_ppo_stats;

/* Generalised advantage estimation (Schulman et al. 2016, Eq. 16) over a (T, N) rollout:
 *   delta_t = r_t + gamma * (done_t ? boot_t : V_{t+1}) - V_t,   V_T = next_value
 *   A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},   returns = A + V
 * done_t: the episode ended at step t (terminal or truncated); boot_t: the value it is bootstrapped
 * with, 0 for a terminal and V(final observation) for a truncation. */
void sm_ppo_gae(sm_real *adv, sm_real *ret, const sm_real *rew, const sm_real *val, const sm_real *next_value,
                const unsigned char *done, const sm_real *boot, int T, int N, double gamma, double lambda);

/* log N(x; mean, exp(logstd)^2) summed over the A dimensions of one row; adds its gradients w.r.t.
 * mean and logstd into dmean / dlogstd scaled by g (either may be NULL). */
double sm_gaussian_logprob(sm_real *dmean, sm_real *dlogstd, double g, const sm_real *x, const sm_real *mean,
                           const sm_real *logstd, int A);

/* Clipped surrogate minus the entropy bonus, mean over B rows:
 *   L = mean_b max(-adv r, -adv clip(r, 1-c, 1+c)) - ent_coef * mean_b H_b,  r = exp(logp - old_logp).
 * Categorical: logits (B, A), actions act_disc (B); gradient written into dlogits (B, A).
 * Gaussian: mean (B, A), logstd (A), actions act_box (B, A); gradients written into dmean (B, A)
 * and dlogstd (A). Statistics into s (may be NULL). Returns L. */
double sm_ppo_policy_loss_discrete(sm_real *dlogits, sm_ppo_stats *s, const sm_real *logits, const int *act_disc,
                                   const sm_real *old_logp, const sm_real *adv, int B, int A, double clip_coef,
                                   double ent_coef);
double sm_ppo_policy_loss_gaussian(sm_real *dmean, sm_real *dlogstd, sm_ppo_stats *s, const sm_real *mean,
                                   const sm_real *logstd, const sm_real *act_box, const sm_real *old_logp,
                                   const sm_real *adv, int B, int A, double clip_coef, double ent_coef);
/* vf_coef * 0.5 * mean_b of (v - ret)^2, or with clip_vloss of
 * max((v - ret)^2, (old_v + clip(v - old_v, -c, c) - ret)^2); gradient written into dval (B). */
double sm_ppo_value_loss(sm_real *dval, sm_ppo_stats *s, const sm_real *val, const sm_real *old_val,
                         const sm_real *ret, int B, double clip_coef, int clip_vloss, double vf_coef);

#ifdef __cplusplus
}
#endif
#endif
