/* PPO (include/specmoe/rl/ppo.h): CleanRL's ppo.py and ppo_continuous_action.py in C.
 *
 * Letters: N environments, T steps per rollout, D observation values, A actions (discrete count or
 * box dimension), Bt = T * N the batch, B = Bt / num_minibatches a minibatch. Rollout arrays are
 * indexed t * N + i.
 *
 * One update: the rollout (act with the current policy, step the vector, normalise observations
 * and scale rewards, bootstrap truncated episodes from their final observation), GAE, then
 * update_epochs passes over random minibatches, each one Adam step of actor, critic and log-std
 * under a common gradient-norm clip. Runs stop, checkpoint and resume at update boundaries only, so
 * a checkpoint holds no half-filled rollout.
 *
 * Under mpirun (run->dist of P > 1 ranks): synchronous data parallel, the simplest design that
 * scales. Rank r steps environments rN .. rN+N-1 of the seed's vector with its own action stream,
 * keeps its own T x N rollout and splits it into the same num_minibatches; a global minibatch is
 * the P ranks' minibatches together. Per minibatch, the losses, statistics and every rank's
 * finiteness flag are summed first (the NaN guard names the rank; the target-KL stop reads the
 * mean approx_kl, so every rank leaves the epochs alike), then the gradients of actor, critic and
 * log-std are averaged with one allreduce (sm_dist_grad_mean_sets) before the clip and the Adam
 * step. The advantage mean and std are those of the global minibatch, and the observation and
 * reward normalisers take every rank's rows each step (per-rank moments merged exactly,
 * sm_dist_moments_merge), so the ranks' parameters and normalisers never diverge. Frames, the
 * learning-rate anneal and the budget count every rank. Rank 0 logs (every rank's episodes,
 * allgathered) and writes checkpoints holding every rank's run state (run_state_r<r>), so a run
 * resumes exactly on as many ranks. SPHERE is refused (its coefficient needs the whole
 * minibatch's gradient norms).
 */
#include "specmoe/rl/ppo.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/optim.h"
#include "specmoe/dist/dist.h"
#include "specmoe/io/checkpoint.h"
#include "specmoe/methods/sphere/baselines.h"
#include "specmoe/methods/sphere/sphere.h"
#include "specmoe/nn/routers.h"
#include "specmoe/rl/rl_log.h"

/* ---- settings -------------------------------------------------------------------------------- */

#define ROW(key, type, field, def, help) SM_OPT_ROW(sm_ppo_config, key, type, field, def, help)
static const sm_opt kOpts[] = {
    ROW("learning_rate", SM_OPT_NUM, learning_rate, "2.5e-4", "Adam learning rate"),
    ROW("num_envs", SM_OPT_INT, num_envs, "4", "parallel environments"),
    ROW("num_steps", SM_OPT_INT, num_steps, "128", "steps per environment per rollout"),
    ROW("anneal_lr", SM_OPT_BOOL, anneal_lr, "1", "anneal the learning rate linearly to 0"),
    ROW("gamma", SM_OPT_NUM, gamma, "0.99", "discount"),
    ROW("gae_lambda", SM_OPT_NUM, gae_lambda, "0.95", "GAE lambda"),
    ROW("num_minibatches", SM_OPT_INT, num_minibatches, "4", "minibatches per epoch"),
    ROW("update_epochs", SM_OPT_INT, update_epochs, "4", "epochs over each rollout"),
    ROW("norm_adv", SM_OPT_BOOL, norm_adv, "1", "normalise advantages per minibatch"),
    ROW("clip_coef", SM_OPT_NUM, clip_coef, "0.2", "surrogate clipping coefficient"),
    ROW("clip_vloss", SM_OPT_BOOL, clip_vloss, "1", "clip the value loss"),
    ROW("ent_coef", SM_OPT_NUM, ent_coef, "0.01", "entropy bonus coefficient"),
    ROW("vf_coef", SM_OPT_NUM, vf_coef, "0.5", "value loss coefficient"),
    ROW("max_grad_norm", SM_OPT_NUM, max_grad_norm, "0.5", "global gradient-norm clip (0: off)"),
    ROW("target_kl", SM_OPT_NUM, target_kl, "0", "stop the epochs when approx_kl exceeds it (0: off)"),
    ROW("norm_obs", SM_OPT_BOOL, norm_obs, "0", "running observation normalisation (clipped at 10)"),
    ROW("norm_reward", SM_OPT_BOOL, norm_reward, "0", "scale rewards by the std of the discounted return (clipped at 10)"),
    SM_OPT_STR_ROW(sm_ppo_config, "arch", arch, "dense:64,dense:64", "hidden layers of actor and critic"),
    SM_OPT_STR_ROW(sm_ppo_config, "act", act, "tanh", "activation of the hidden layers"),
    SM_OPT_STR_ROW(sm_ppo_config, "actor", actor, "mlp",
                   "actor: mlp (arch), mlp10x (arch widened to 10x the parameters), moe / dense-moe / ds-moe (experts "
                   "that are each the arch MLP, a gate MLP of the same shape; SPHERE Sec. 5.1)"),
    ROW("total_timesteps", SM_OPT_U64, total_timesteps, "0", "horizon of the learning-rate anneal (0: the frame budget)"),
    ROW("checkpoint_every", SM_OPT_INT, checkpoint_every, "0", "updates between checkpoints (0: at the end only)"),
    ROW("sphere_rho", SM_OPT_NUM, sphere_rho, "0", "SPHERE on the actor's expert features: the ratio rho (0: off; paper 0.001 grad, 0.05 loss)"),
    SM_OPT_STR_ROW(sm_ppo_config, "sphere_mode", sphere_mode, "grad",
                   "SPHERE coefficient: grad (s = rho |g_base| / |grad L|), loss (rho |L_base| / L) or fixed (rho: L_base + rho L directly, Table 24's large-E runs)"),
    ROW("sphere_all_layers", SM_OPT_BOOL, sphere_all_layers, "0", "SPHERE ablation: every hidden expert layer, not only the last"),
    ROW("sphere_per_expert", SM_OPT_BOOL, sphere_per_expert, "0", "SPHERE ablation: a sum of per-expert penalties (no cross-expert terms)"),
    ROW("sphere_unweighted", SM_OPT_BOOL, sphere_unweighted, "0", "SPHERE ablation: features h_e without the routing weight p_e"),
    SM_OPT_STR_ROW(sm_ppo_config, "sphere_gram", sphere_gram, "feature",
                   "SPHERE ablation: feature (Eq. 19) or gradient (Eq. 20: the last hidden expert layer's backprop vectors "
                   "of u^T mean; ReLU moe actor only)"),
    /* the plasticity baselines (SPHERE Sec. 5.1, App. J.2) with their sources' settings */
    ROW("layernorm", SM_OPT_BOOL, layernorm, "0",
        "LN baseline: LayerNorm in the actor's hidden layers, Linear -> LayerNorm -> act (the moe actors' gate and experts too)"),
    ROW("pw", SM_OPT_BOOL, pw, "0", "PW baseline: Parseval regularisation of the actor's hidden weight matrices (Chung et al. 2024)"),
    ROW("pw_coef", SM_OPT_NUM, pw_coef, "1e-3", "PW: coefficient lambda of sum_W ||W W^T - s I||_F^2"),
    ROW("pw_scale", SM_OPT_NUM, pw_scale, "1", "PW: the target scale s"),
    ROW("redo", SM_OPT_BOOL, redo, "0", "ReDo baseline: reset the actor's tau-dormant hidden units (Sokar et al. 2023)"),
    ROW("redo_every", SM_OPT_INT, redo_every, "1000", "ReDo: gradient steps between resets"),
    ROW("redo_tau", SM_OPT_NUM, redo_tau, "0.1", "ReDo: dormancy threshold tau"),
    ROW("cbp", SM_OPT_BOOL, cbp, "0", "CBP baseline: continual backprop on the actor's hidden units (Dohare et al. 2024)"),
    ROW("cbp_rate", SM_OPT_NUM, cbp_rate, "1e-4", "CBP: replacement rate (fraction of mature units per step)"),
    ROW("cbp_decay", SM_OPT_NUM, cbp_decay, "0.99", "CBP: decay of the running utility"),
    ROW("cbp_maturity", SM_OPT_INT, cbp_maturity, "10000", "CBP: maturity threshold (steps before a unit may be replaced; Dohare et al.'s PPO: 10000)"),
    ROW("sn", SM_OPT_BOOL, sn, "0", "SN baseline: spectral normalisation of the actor's hidden weight matrices (Miyato et al. 2018)"),
    ROW("specreg", SM_OPT_NUM, specreg, "0",
        "SR baseline: lambda of sum_W (sigma_max(W)^k - 1)^2 over every weight matrix of the actor (Lewandowski et al. 2025; 0: off)"),
    ROW("specreg_k", SM_OPT_NUM, specreg_k, "2", "SR: the exponent k"),
    ROW("cchain", SM_OPT_BOOL, cchain, "0", "C-CHAIN baseline: reduce the actor's churn on a reference batch (Tang et al. 2025)"),
    ROW("cchain_ratio", SM_OPT_NUM, cchain_ratio, "0.05", "C-CHAIN: beta of the coefficient beta mean |L_policy| / mean L_churn (100 for the first 50 updates)"),
    ROW("diag_every", SM_OPT_INT, diag_every, "0",
        "updates between diagnostics on a held-out batch (diag/: eNTK and feature effective ranks, feature norm, dormant ratio; 0: off)"),
    ROW("diag_states", SM_OPT_INT, diag_states, "32", "states in the held-out batch of the diagnostics (at most the minibatch)"),
    ROW("diag_slq", SM_OPT_INT, diag_slq, "0",
        "also estimate the eNTK rank by stochastic Lanczos quadrature with this many probes (0: off; Eqs. 28-29), logged "
        "with its relative error against the exact rank"),
};
#undef ROW

/* Both presets name the same keys, so either one fully replaces the other (env_defaults applies the
 * continuous one to box-action environments). */
#define PRESET_DISCRETE \
    "learning_rate=2.5e-4;num_envs=4;num_steps=128;num_minibatches=4;update_epochs=4;ent_coef=0.01;norm_obs=0;norm_reward=0"
#define PRESET_CONTINUOUS \
    "learning_rate=3e-4;num_envs=1;num_steps=2048;num_minibatches=32;update_epochs=10;ent_coef=0;norm_obs=1;norm_reward=1"
static const char *const kPresets[] = {"cleanrl-discrete", PRESET_DISCRETE, "cleanrl-continuous", PRESET_CONTINUOUS, NULL};

/* Default budgets of CleanRL's scripts (total_timesteps) when neither the run nor the settings give one. */
#define DEFAULT_STEPS_DISCRETE 500000L
#define DEFAULT_STEPS_CONTINUOUS 1000000L

static const char *ppo_compatible(const sm_env_spec *env) {
    if (env->act_n < 1) return "ppo needs at least one action";
    /* vector observations, and images too: a dense layer flattens them, conv layers keep them */
    return NULL;
}

static void ppo_env_defaults(void *cfg, const sm_env_spec *env, int (*given)(const void *user, const char *key),
                             const void *user) {
    if (env->act_kind != SM_SPACE_BOX) return;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", PRESET_CONTINUOUS);
    for (char *save = NULL, *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        *eq = 0;
        if (given && given(user, kv)) continue;
        for (int i = 0; i < (int)SM_LEN(kOpts); i++)
            if (!strcmp(kOpts[i].key, kv)) sm_opt_set(&kOpts[i], cfg, eq + 1);
    }
}

/* Parameters of a dense stack D -> W (L layers) -> A with biases. */
static double mlp_params(double D, double W, int L, double A) { return D * W + W + (L - 1) * (W * W + W) + W * A + A; }

/* The width W' of the same stack with `factor` times its parameters: the positive root of
 * mlp_params(D, W', L, A) = factor mlp_params(D, W, L, A), rounded. */
static int width_for_params(double D, int W, int L, double A, double factor) {
    const double a = L - 1, b = D + 1 + (L - 1) + A, c = A - factor * mlp_params(D, W, L, A);
    const double w = a > 0 ? (-b + sqrt(b * b - 4 * a * c)) / (2 * a) : -c / b;
    return (int)lround(w);
}

/* The actor kinds of SPHERE's baselines (Sec. 5.1, App. A.4), built from the hidden stack arch = L dense
 * layers of width W (the paper: 3 x 256):
 *   mlp10x     the stack widened to W' with about ten times the parameters (the positive root of
 *              mlp_params(W') = 10 mlp_params(W))
 *   moe        moehead:W:L:W - E experts, each the full MLP obs -> W (L layers) -> action mean, and a gate
 *              MLP of the same shape in front of the router (its top-k, temperature, renorm are the
 *              router flags: --experts --topk --temperature --renorm)
 *   dense-moe  the same with every expert weighted (k = E)
 * The critic always keeps arch. */
static sm_status actor_kind(sm_model_config *mc, const sm_ppo_config *c, sm_error *err) {
    if (!strcmp(c->actor, "mlp")) return SM_OK;
    const int L = mc->n_layers, W = mc->layers[0].width;
    for (int i = 0; i < L; i++)
        if (mc->layers[i].kind != SM_LAYER_DENSE || mc->layers[i].width != W)
            return sm_fail(err, SM_ERR_ARG, "ppo: actor %s builds its networks from arch, which must then be dense:W repeated "
                           "(got '%s')", c->actor, c->arch);
    if (!strcmp(c->actor, "mlp10x")) {
        const int w = width_for_params(mc->in_dim, W, L, mc->n_classes, 10);
        for (int i = 0; i < L; i++) mc->layers[i].width = w;
        return SM_OK;
    }
    const int ds = !strcmp(c->actor, "ds-moe");
    if (strcmp(c->actor, "moe") && strcmp(c->actor, "dense-moe") && !ds)
        return sm_fail(err, SM_ERR_ARG, "ppo: unknown actor '%s' (mlp, mlp10x, moe, dense-moe, ds-moe)", c->actor);
    if (L > 8) return sm_fail(err, SM_ERR_ARG, "ppo: actor %s: at most 8 hidden layers (arch '%s')", c->actor, c->arch);
    mc->n_layers = 1;
    mc->layers[0] = (sm_layer_spec){.kind = SM_LAYER_MOEHEAD, .width = W, .k = L, .s = W};
    mc->moe.depth = L;
    if (!strcmp(c->actor, "dense-moe")) mc->moe.router.k = mc->moe.router.E;
    if (ds) {
        /* DeepSeekMoE's fine-grained split (Dai et al. 2024) at factor 2: each of the E experts becomes two
         * with half its parameters (2E in all); the two halves of one are shared (every state, weight 1)
         * and the 2k - 2 others a state uses are routed among the remaining 2E - 2 by the ds router. As
         * DeepSeekMoE's segmentation, this keeps the experts' total and active parameters: its experts
         * are one-hidden-layer FFNs, split by halving the hidden width; ours have L hidden layers, whose
         * W x W matrices a halved width would quarter (W/2 gave 55% of Top-k's parameters), so the
         * half-expert's width is the root of mlp_params(W') = mlp_params(W) / 2 (64 -> 44 on the cheetah,
         * 256 -> 180 at the paper's width). */
        sm_router_config *rc = &mc->moe.router;
        const int E = rc->E, k = rc->k;
        if (k < 2 || W < 2)
            return sm_fail(err, SM_ERR_ARG, "ppo: actor ds-moe splits each expert in two and shares two halves: it needs "
                           "topk >= 2 and a width >= 2 (got topk %d, arch '%s')", k, c->arch);
        sm_status st = sm_router_config_set(rc, "ds", err);
        if (st != SM_OK) return st;
        rc->E = 2 * E, rc->k = 2 * k - 2;
        sm_ds_opts(rc)->ds_shared = 2;
        mc->layers[0].width = width_for_params(mc->in_dim, W, L, mc->n_classes, 0.5);
        if (mc->layers[0].width < 1) mc->layers[0].width = 1;
    }
    return SM_OK;
}

/* The actor's network (as_actor; else the critic's, before its width is set to 1): the template net
 * (the CLI's model config: MoE and router settings; NULL for the defaults) with the hidden stack
 * cfg->arch and activation cfg->act, as the DQN family does, then the actor kind; input and output
 * widths come from the environment. */
static sm_status actor_config(sm_model_config *mc, const sm_ppo_config *c, const sm_model_config *net,
                              const sm_env_spec *env, int as_actor, sm_error *err) {
    if (net) *mc = *net;
    else sm_model_config_default(mc);
    if (sm_act_parse(c->act, &mc->act)) return sm_fail(err, SM_ERR_ARG, "ppo: unknown activation '%s' (act)", c->act);
    sm_error e;
    if (sm_model_parse_arch(mc, c->arch, &e) != SM_OK) return sm_fail(err, SM_ERR_ARG, "ppo: arch: %s", e.msg);
    mc->in_dim = sm_env_obs_numel(env);
    mc->in_c = env->obs_c;
    mc->in_h = env->obs_h;
    mc->in_w = env->obs_w;
    mc->n_classes = env->act_n;
    if (as_actor) mc->hidden_ln = c->layernorm;
    return as_actor ? actor_kind(mc, c, err) : SM_OK;
}

static sm_status ppo_check(const void *vcfg, const sm_env_spec *env, sm_error *err) {
    const sm_ppo_config *c = vcfg;
    if (c->num_envs < 1) return sm_fail(err, SM_ERR_ARG, "ppo: num_envs must be >= 1 (got %d)", c->num_envs);
    if (c->num_steps < 1) return sm_fail(err, SM_ERR_ARG, "ppo: num_steps must be >= 1 (got %d)", c->num_steps);
    if (c->num_minibatches < 1) return sm_fail(err, SM_ERR_ARG, "ppo: num_minibatches must be >= 1 (got %d)", c->num_minibatches);
    long batch = (long)c->num_envs * c->num_steps;
    if (batch > (1L << 28)) return sm_fail(err, SM_ERR_ARG, "ppo: batch num_envs * num_steps = %ld is too large", batch);
    if (batch % c->num_minibatches)
        return sm_fail(err, SM_ERR_ARG, "ppo: the batch num_envs * num_steps = %d * %d = %ld is not divisible by num_minibatches = %d",
                       c->num_envs, c->num_steps, batch, c->num_minibatches);
    if (c->update_epochs < 1) return sm_fail(err, SM_ERR_ARG, "ppo: update_epochs must be >= 1 (got %d)", c->update_epochs);
    if (!(c->learning_rate > 0)) return sm_fail(err, SM_ERR_ARG, "ppo: learning_rate must be > 0 (got %g)", c->learning_rate);
    if (!(c->gamma >= 0 && c->gamma <= 1)) return sm_fail(err, SM_ERR_ARG, "ppo: gamma must be in [0, 1] (got %g)", c->gamma);
    if (!(c->gae_lambda >= 0 && c->gae_lambda <= 1))
        return sm_fail(err, SM_ERR_ARG, "ppo: gae_lambda must be in [0, 1] (got %g)", c->gae_lambda);
    if (!(c->clip_coef > 0)) return sm_fail(err, SM_ERR_ARG, "ppo: clip_coef must be > 0 (got %g)", c->clip_coef);
    if (!(c->vf_coef >= 0)) return sm_fail(err, SM_ERR_ARG, "ppo: vf_coef must be >= 0 (got %g)", c->vf_coef);
    if (!(c->ent_coef >= 0)) return sm_fail(err, SM_ERR_ARG, "ppo: ent_coef must be >= 0 (got %g)", c->ent_coef);
    if (!(c->max_grad_norm >= 0)) return sm_fail(err, SM_ERR_ARG, "ppo: max_grad_norm must be >= 0 (got %g)", c->max_grad_norm);
    if (!(c->target_kl >= 0)) return sm_fail(err, SM_ERR_ARG, "ppo: target_kl must be >= 0 (got %g)", c->target_kl);
    if (c->checkpoint_every < 0) return sm_fail(err, SM_ERR_ARG, "ppo: checkpoint_every must be >= 0 (got %d)", c->checkpoint_every);
    sm_sphere_mode mode;
    if (c->diag_every < 0) return sm_fail(err, SM_ERR_ARG, "ppo: diag_every must be >= 0 (got %d)", c->diag_every);
    if (c->diag_slq < 0) return sm_fail(err, SM_ERR_ARG, "ppo: diag_slq must be >= 0 (got %d)", c->diag_slq);
    if (c->diag_states < 1 || c->diag_states > batch / c->num_minibatches)
        return sm_fail(err, SM_ERR_ARG, "ppo: diag_states must be in [1, the minibatch %ld] (got %d)", batch / c->num_minibatches,
                       c->diag_states);
    if (!(c->sphere_rho >= 0)) return sm_fail(err, SM_ERR_ARG, "ppo: sphere_rho must be >= 0 (got %g)", c->sphere_rho);
    if (!(c->pw_coef >= 0 && isfinite(c->pw_coef)))
        return sm_fail(err, SM_ERR_ARG, "ppo: pw_coef must be a number >= 0 (got %g)", c->pw_coef);
    if (!isfinite(c->pw_scale)) return sm_fail(err, SM_ERR_ARG, "ppo: pw_scale must be finite (got %g)", c->pw_scale);
    if (c->redo_every < 1) return sm_fail(err, SM_ERR_ARG, "ppo: redo_every must be >= 1 gradient step (got %d)", c->redo_every);
    if (!(c->redo_tau >= 0)) return sm_fail(err, SM_ERR_ARG, "ppo: redo_tau must be >= 0 (got %g)", c->redo_tau);
    if (!(c->cbp_rate >= 0 && c->cbp_rate <= 1))
        return sm_fail(err, SM_ERR_ARG, "ppo: cbp_rate must be in [0, 1] (got %g)", c->cbp_rate);
    if (!(c->cbp_decay >= 0 && c->cbp_decay < 1))
        return sm_fail(err, SM_ERR_ARG, "ppo: cbp_decay must be in [0, 1) (got %g)", c->cbp_decay);
    if (!(c->cchain_ratio >= 0 && isfinite(c->cchain_ratio)))
        return sm_fail(err, SM_ERR_ARG, "ppo: cchain_ratio must be a number >= 0 (got %g)", c->cchain_ratio);
    if (!(c->specreg >= 0 && isfinite(c->specreg)))
        return sm_fail(err, SM_ERR_ARG, "ppo: specreg must be a number >= 0, the lambda of spectral regularisation (got %g)", c->specreg);
    if (!(c->specreg_k >= 1 && isfinite(c->specreg_k)))
        return sm_fail(err, SM_ERR_ARG, "ppo: specreg_k must be a number >= 1, the exponent of sigma_max (got %g)", c->specreg_k);
    if (c->specreg > 0 && c->sn)
        return sm_fail(err, SM_ERR_ARG, "ppo: specreg with sn: spectral normalisation divides the hidden matrices by their sigma_max, where "
                       "spectral regularisation's term and gradient are zero: two alternatives for the same matrices; use one of them");
    if (c->cbp_maturity < 0) return sm_fail(err, SM_ERR_ARG, "ppo: cbp_maturity must be >= 0 (got %d)", c->cbp_maturity);
    if (sm_sphere_mode_parse(c->sphere_mode, &mode))
        return sm_fail(err, SM_ERR_ARG, "ppo: sphere_mode must be grad, loss or fixed (got '%s')", c->sphere_mode);
    sm_sphere_gram gram;
    if (sm_sphere_gram_parse(c->sphere_gram, &gram))
        return sm_fail(err, SM_ERR_ARG, "ppo: sphere_gram must be feature or gradient (got '%s')", c->sphere_gram);
    if (env) {
        const char *why = ppo_compatible(env);
        if (why) return sm_fail(err, SM_ERR_ARG, "%s", why);
        sm_model_config mc;
        sm_status st = actor_config(&mc, c, NULL, env, 1, err);
        if (st != SM_OK) return st;
        int n_moe = 0;
        for (int i = 0; i < mc.n_layers; i++) n_moe += mc.layers[i].kind == SM_LAYER_MOE || mc.layers[i].kind == SM_LAYER_MOEHEAD;
        if (c->sphere_rho > 0 && n_moe == 0)
            return sm_fail(err, SM_ERR_ARG, "ppo: sphere_rho %g needs an MoE actor (SPHERE regularises the experts' features); "
                           "the actor '%s' has no moe layer", c->sphere_rho, c->arch);
        const sm_sphere_config sc = {.all_layers = c->sphere_all_layers, .gram = gram};
        const char *no_gram = c->sphere_rho > 0 ? sm_sphere_gram_refusal(&sc, &mc) : NULL;
        if (no_gram) return sm_fail(err, SM_ERR_ARG, "ppo: sphere_gram %s: %s", c->sphere_gram, no_gram);
    }
    return SM_OK;
}

/* ---- losses ---------------------------------------------------------------------------------- */

void sm_ppo_gae(sm_real *adv, sm_real *ret, const sm_real *rew, const sm_real *val, const sm_real *next_value,
                const unsigned char *done, const sm_real *boot, int T, int N, double gamma, double lambda) {
    for (int i = 0; i < N; i++) {
        double last = 0;
        for (int t = T - 1; t >= 0; t--) {
            size_t k = (size_t)t * N + i;
            double next = done[k] ? (double)boot[k] : t == T - 1 ? (double)next_value[i] : (double)val[k + N];
            double delta = rew[k] + gamma * next - val[k];
            last = delta + gamma * lambda * (done[k] ? 0.0 : last);
            adv[k] = (sm_real)last;
            ret[k] = (sm_real)(last + val[k]);
        }
    }
}

#define LOG_SQRT_2PI 0.91893853320467274178

double sm_gaussian_logprob(sm_real *dmean, sm_real *dlogstd, double g, const sm_real *x, const sm_real *mean,
                           const sm_real *logstd, int A) {
    double lp = 0;
    for (int j = 0; j < A; j++) {
        double z = ((double)x[j] - mean[j]) * exp(-(double)logstd[j]);
        lp += -0.5 * z * z - logstd[j] - LOG_SQRT_2PI;
        /* d/dmean = z / sigma, d/dlogstd = z^2 - 1 */
        if (dmean) dmean[j] += (sm_real)(g * z * exp(-(double)logstd[j]));
        if (dlogstd) dlogstd[j] += (sm_real)(g * (z * z - 1));
    }
    return lp;
}

/* log sum_j exp(z_j) of one row, in double */
static double log_sum_exp(const sm_real *z, int A) {
    double mx = z[0], sum = 0;
    for (int j = 1; j < A; j++) mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < A; j++) sum += exp(z[j] - mx);
    return mx + log(sum);
}

/* The surrogate of one row from its new log-probability: returns max(-adv r, -adv clip(r)) and
 * sets *dlogp, the derivative w.r.t. the new log-probability (zero where the clipped term is
 * strictly larger: it does not depend on r there). */
static double surrogate(double *dlogp, sm_ppo_stats *s, double logp, double old_logp, double adv, double clip) {
    double logratio = logp - old_logp, ratio = exp(logratio);
    double rc = ratio < 1 - clip ? 1 - clip : ratio > 1 + clip ? 1 + clip : ratio;
    double l1 = -adv * ratio, l2 = -adv * rc;
    *dlogp = l1 >= l2 ? -adv * ratio : 0.0;
    s->old_approx_kl += -logratio;
    s->approx_kl += (ratio - 1) - logratio;
    s->clipfrac += fabs(ratio - 1) > clip;
    return l1 >= l2 ? l1 : l2;
}

static void stats_mean(sm_ppo_stats *s, sm_ppo_stats *out, double pg, double ent, int B) {
    s->pg_loss = pg / B;
    s->entropy = ent / B;
    s->old_approx_kl /= B;
    s->approx_kl /= B;
    s->clipfrac /= B;
    if (out) {
        double v = out->v_loss;
        *out = *s;
        out->v_loss = v;
    }
}

double sm_ppo_policy_loss_discrete(sm_real *dlogits, sm_ppo_stats *out, const sm_real *logits, const int *act_disc,
                                   const sm_real *old_logp, const sm_real *adv, int B, int A, double clip_coef,
                                   double ent_coef) {
    sm_ppo_stats s = {0};
    double pg = 0, ent = 0;
    for (int b = 0; b < B; b++) {
        const sm_real *z = logits + (size_t)b * A;
        sm_real *dz = dlogits + (size_t)b * A;
        double lse = log_sum_exp(z, A), h = 0;
        for (int j = 0; j < A; j++) {
            double lp = z[j] - lse;
            h -= exp(lp) * lp;
        }
        double dlogp;
        pg += surrogate(&dlogp, &s, z[act_disc[b]] - lse, old_logp[b], adv[b], clip_coef);
        ent += h;
        /* d logp_a / dz_j = [j = a] - p_j;  d H / dz_j = -p_j (log p_j + H) */
        for (int j = 0; j < A; j++) {
            double lp = z[j] - lse, p = exp(lp);
            double g = dlogp * ((j == act_disc[b]) - p) - ent_coef * (-p * (lp + h));
            dz[j] = (sm_real)(g / B);
        }
    }
    stats_mean(&s, out, pg, ent, B);
    return (pg - ent_coef * ent) / B;
}

double sm_ppo_policy_loss_gaussian(sm_real *dmean, sm_real *dlogstd, sm_ppo_stats *out, const sm_real *mean,
                                   const sm_real *logstd, const sm_real *act_box, const sm_real *old_logp,
                                   const sm_real *adv, int B, int A, double clip_coef, double ent_coef) {
    sm_ppo_stats s = {0};
    double pg = 0, h = 0;
    /* the entropy of a diagonal Gaussian does not depend on the mean: sum_j (1/2 + log sqrt(2 pi) + logstd_j) */
    for (int j = 0; j < A; j++) {
        h += 0.5 + LOG_SQRT_2PI + logstd[j];
        dlogstd[j] = (sm_real)(-ent_coef);
    }
    for (int b = 0; b < B; b++) {
        const sm_real *x = act_box + (size_t)b * A, *m = mean + (size_t)b * A;
        double lp = sm_gaussian_logprob(NULL, NULL, 0, x, m, logstd, A), dlogp;
        pg += surrogate(&dlogp, &s, lp, old_logp[b], adv[b], clip_coef);
        for (int j = 0; j < A; j++) dmean[(size_t)b * A + j] = 0;
        sm_gaussian_logprob(dmean + (size_t)b * A, dlogstd, dlogp / B, x, m, logstd, A);
    }
    stats_mean(&s, out, pg, h * B, B);
    return pg / B - ent_coef * h;
}

double sm_ppo_value_loss(sm_real *dval, sm_ppo_stats *s, const sm_real *val, const sm_real *old_val,
                         const sm_real *ret, int B, double clip_coef, int clip_vloss, double vf_coef) {
    double sum = 0;
    for (int b = 0; b < B; b++) {
        double e = (double)val[b] - ret[b], l = e * e, g = 2 * e;
        if (clip_vloss) {
            double d = (double)val[b] - old_val[b];
            double dc = d < -clip_coef ? -clip_coef : d > clip_coef ? clip_coef : d;
            double ec = (double)old_val[b] + dc - ret[b], lc = ec * ec;
            /* the clipped term moves with v only inside the clip range */
            if (lc > l) l = lc, g = dc == d ? 2 * ec : 0.0;
        }
        sum += l;
        dval[b] = (sm_real)(vf_coef * 0.5 * g / B);
    }
    double v = 0.5 * sum / B;
    if (s) s->v_loss = v;
    return vf_coef * v;
}

/* ---- running statistics (gym's RunningMeanStd: mean 0, var 1, count 1e-4 at the start) --------- */

typedef struct {
    double count;
    double *mean, *var; /* (n) */
    int n;
} rms;

static void rms_reset(rms *r) {
    r->count = 1e-4;
    for (int j = 0; j < r->n; j++) r->mean[j] = 0, r->var[j] = 1;
}

/* The moments of rows x (m, n) (float or double through a stride-1 reader): mean bm (n) and sum of
 * squared deviations bm2 (n), two passes. */
static void rms_moments(const rms *r, const float *xf, const double *xd, int m, double *bm, double *bm2) {
    for (int j = 0; j < r->n; j++) {
        double mu = 0, v = 0;
        for (int i = 0; i < m; i++) mu += xf ? xf[(size_t)i * r->n + j] : xd[(size_t)i * r->n + j];
        mu /= m;
        for (int i = 0; i < m; i++) {
            double d = (xf ? xf[(size_t)i * r->n + j] : xd[(size_t)i * r->n + j]) - mu;
            v += d * d;
        }
        bm[j] = mu, bm2[j] = v;
    }
}

/* Adds a batch of cnt rows with those moments by Chan et al.'s parallel update. */
static void rms_apply(rms *r, double cnt, const double *bm, const double *bm2) {
    double tot = r->count + cnt;
    for (int j = 0; j < r->n; j++) {
        double bv = bm2[j] / cnt, delta = bm[j] - r->mean[j];
        r->mean[j] += delta * cnt / tot;
        double m2 = r->var[j] * r->count + bv * cnt + delta * delta * r->count * cnt / tot;
        r->var[j] = m2 / tot;
    }
    r->count = tot;
}

/* (x - mean) / sqrt(var + 1e-8), clipped at +-10 (NormalizeObservation + the clip of CleanRL). */
static void obs_normalize(float *out, const float *x, int m, const rms *r, int on) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < r->n; j++) {
            size_t k = (size_t)i * r->n + j;
            if (!on) {
                out[k] = x[k];
                continue;
            }
            double v = (x[k] - r->mean[j]) / sqrt(r->var[j] + 1e-8);
            out[k] = (float)(v < -10 ? -10 : v > 10 ? 10 : v);
        }
}

/* ---- the agent's state ----------------------------------------------------------------------- */

typedef struct {
    sm_ppo_config c;
    const sm_env_spec *env;
    int N, T, D, A, Bt, B, box;
    sm_dist *dist;                /* under mpirun: the ranks; else solo */
    sm_dist solo;                 /* one process (size 1: every sm_dist call returns at once) */
    int P, rank;                  /* rank count (1 without MPI) and this rank */
    sm_model_config actor_cfg;
    sm_model *actor, *critic;
    sm_params ls;                 /* log_std (A), box actions only (an empty table otherwise) */
    sm_optim opt[3];              /* actor, critic, log_std */
    sm_sphere_reg *sphere;        /* SPHERE on the actor, or NULL */
    int sphere_inject;            /* loss mode: in the actor's backward (sm_sphere_inject), not a second one */
    sm_baselines *base;           /* PW, SN, SR, ReDo, CBP, C-CHAIN on the actor, or NULL */
    double sph_pen, sph_coef, sph_gb, sph_gp; /* their sums over the update's minibatches */
    long sph_n;
    double aux_sum;               /* the actor routers' auxiliary losses (load balancing) over the update's minibatches */
    double gn_sum;                /* global gradient norms (before clipping) over the update's minibatches */
    long gn_n;
    /* diagnostics (diag_every): a held-out batch drawn from the session's first rollout */
    float *diag_x;                /* (diag_states, D) normalised observations */
    int diag_n;                   /* 0 until drawn */
    sm_real *diag_u;              /* (A) the unit direction of the eNTK's scalar output */
    int n_sets;
    sm_rng rng;
    sm_vecenv v;
    /* environment buffers */
    float *obs_raw;               /* (N, D) the vector's observations */
    float *final_obs;             /* (N, D) */
    float *x;                     /* (N, D) normalised rows for a forward */
    int *act;                     /* (N) */
    float *act_box;               /* (N, A) */
    float *rew;                   /* (N) */
    unsigned char *term, *trunc;  /* (N) */
    int *rows;                    /* (N) rows of truncated environments */
    /* rollout */
    float *b_obs;                 /* (Bt, D) normalised */
    int *b_act;                   /* (Bt) */
    sm_real *b_box;               /* (Bt, A) */
    sm_real *b_logp, *b_val, *b_rew, *b_boot, *b_adv, *b_ret; /* (Bt) */
    unsigned char *b_done;        /* (Bt) */
    sm_real *next_value;          /* (N) */
    /* minibatch */
    int *perm;                    /* (Bt) */
    float *m_obs;                 /* (B, D) */
    float *ref_obs;               /* (B, D) C-CHAIN's reference rows */
    int *m_act;                   /* (B) */
    sm_real *m_box;               /* (B, A) */
    sm_real *m_logp, *m_adv, *m_val, *m_ret; /* (B) */
    /* normalisers */
    rms obs_rms, ret_rms;         /* (D) and (1) */
    double *ret_acc;              /* (N) discounted return per environment (reward scaling) */
    double *rms_block;
    double *mom;                  /* (2 D + 2) a step's moments: means of obs (D) and return (1), then their m2 */
    /* the episodes finished in a rollout: 4 values each (global step, position, return, length),
     * this rank's (ep: Bt of them at most) and every rank's (ep_all: P Bt) */
    double *ep, *ep_all;
    int ep_n;
    double *red;                  /* (8 + P) a minibatch's statistics and every rank's finiteness flag */
    int poison;                   /* testing aid (sm_rl_run.fault_nan_update): this update's loss is NaN */
    /* counters */
    long global_step, updates, num_updates, episodes;
    long horizon;                 /* frame budget of the run: the learning-rate anneal spans it */
    uint64_t seed;                /* the run's seed (a resumed run keeps its first session's) */
    double tail_sum;              /* returns of episodes finished in the last 10% of this run's */
    long tail_n;                  /* frames (not part of the run state) */
} ppo;

static void ppo_free(ppo *p) {
    sm_model_free(p->actor);
    sm_model_free(p->critic);
    sm_sphere_reg_free(p->sphere);
    sm_baselines_free(p->base);
    for (int k = 0; k < 3; k++) sm_optim_free(&p->opt[k]);
    sm_params_free(&p->ls);
    sm_vecenv_free(&p->v);
    void *blocks[] = {p->obs_raw, p->final_obs, p->x, p->act, p->act_box, p->rew, p->term, p->trunc, p->rows,
                      p->b_obs, p->b_act, p->b_box, p->b_logp, p->b_val, p->b_rew, p->b_boot, p->b_adv, p->b_ret,
                      p->b_done, p->next_value, p->perm, p->m_obs, p->m_act, p->m_box, p->m_logp, p->m_adv,
                      p->m_val, p->m_ret, p->ret_acc, p->rms_block, p->mom, p->ep, p->ep_all, p->red, p->diag_x, p->diag_u,
                      p->ref_obs};
    for (size_t i = 0; i < SM_LEN(blocks); i++) free(blocks[i]);
}

/* CleanRL's layer_init: orthogonal weights with gain sqrt(2) in the hidden layers and head_gain in
 * the head, zero biases. Other tensors (MoE experts and routers, LayerNorm) keep their own init. */
static sm_status init_orthogonal(sm_model *m, double head_gain, sm_rng *rng, sm_error *err) {
    sm_params *ps = &m->params;
    for (int i = 0; i < ps->n; i++) {
        const char *name = ps->p[i].name;
        size_t n = strlen(name);
        int is_head = !strncmp(name, "head.", 5);
        if (n > 5 && !strcmp(name + n - 5, ".bias") && (is_head || strstr(name, ".experts.") == NULL)) {
            memset(sm_params_data(ps, i), 0, sizeof(sm_real) * ps->p[i].numel);
        } else if (n > 7 && !strcmp(name + n - 7, ".weight") && ps->p[i].ndim >= 2) {
            sm_status st = sm_params_init_orthogonal(ps, i, is_head ? head_gain : sqrt(2.0), rng, err);
            if (st != SM_OK) return st;
        }
    }
    return SM_OK;
}

static void *alloc0(size_t n, size_t size, int *bad) {
    void *p = calloc(n ? n : 1, size);
    if (!p) *bad = 1;
    return p;
}

/* The running normalisers of observations (obs) and of the discounted return (ret) take this step's
 * N rows. Under MPI each rank's moments of both are merged over the ranks in one exact collective
 * (sm_dist_moments_merge), so every rank's normalisers are those of the union of all ranks' rows and
 * the ranks stay identical. */
static sm_status normalisers_update(ppo *p, int obs, int ret, sm_error *err) {
    if (!obs && !ret) return SM_OK;
    const int D = p->D;
    double *mean = p->mom, *m2 = p->mom + D + 1, cnt = p->N;
    memset(p->mom, 0, sizeof(double) * (2 * (size_t)D + 2));
    if (obs) rms_moments(&p->obs_rms, p->obs_raw, NULL, p->N, mean, m2);
    if (ret) rms_moments(&p->ret_rms, NULL, p->ret_acc, p->N, mean + D, m2 + D);
    sm_status st = sm_dist_moments_merge(p->dist, &cnt, mean, m2, D + 1, err);
    if (st != SM_OK) return st;
    if (obs) rms_apply(&p->obs_rms, cnt, mean, m2);
    if (ret) rms_apply(&p->ret_rms, cnt, mean + D, m2 + D);
    return SM_OK;
}

/* The mitigation baselines on the actor as it is now (none switched on: p->base stays NULL): at
 * set-up, and again after --init-from has loaded the previous task's actor, so that SN's and SR's
 * power iterations start from the loaded weights, not the fresh network's (a new launch: CBP's,
 * ReDo's and C-CHAIN's state start fresh either way). */
static sm_status baselines_make(ppo *p, sm_error *err) {
    const sm_ppo_config *c = &p->c;
    sm_baselines_free(p->base);
    p->base = NULL;
    if (!(c->pw || c->redo || c->cbp || c->cchain || c->sn || c->specreg > 0)) return SM_OK;
    sm_baselines_config bc = {.pw = c->pw, .pw_coef = c->pw_coef, .pw_scale = c->pw_scale, .redo = c->redo,
                              .redo_every = c->redo_every, .redo_tau = c->redo_tau, .cbp = c->cbp,
                              .cbp_rate = c->cbp_rate, .cbp_decay = c->cbp_decay, .cbp_maturity = c->cbp_maturity,
                              .cchain = c->cchain, .cchain_ratio = c->cchain_ratio, .sn = c->sn,
                              .specreg = c->specreg, .specreg_k = c->specreg_k};
    sm_error e;
    if (!(p->base = sm_baselines_create(&bc, p->actor, &p->rng, &e))) return sm_fail(err, e.code, "ppo: actor %s: %s", c->actor, e.msg);
    return SM_OK;
}

static sm_status ppo_create(ppo *p, const sm_ppo_config *c, const sm_model_config *net, const sm_rl_run *run,
                            sm_error *err) {
    memset(p, 0, sizeof *p);
    p->c = *c;
    p->solo.size = 1;
    p->dist = run->dist && run->dist->size > 1 ? run->dist : &p->solo;
    p->P = p->dist->size, p->rank = p->dist->rank;
    /* SPHERE's coefficient comes from the minibatch's own gradient norms, which a rank does not
     * have before the allreduce: refused rather than computed from a shard */
    if (p->P > 1 && c->sphere_rho > 0)
        return sm_fail(err, SM_ERR_ARG, "ppo: sphere_rho is not supported under mpirun (its coefficient needs the whole "
                       "minibatch's gradient norms); run it in one process");
    /* ReDo and CBP pick the units to reset from this rank's own activations: the ranks would reset
     * different units and their parameters part ways */
    if (p->P > 1 && (c->redo || c->cbp))
        return sm_fail(err, SM_ERR_ARG, "ppo: %s is not supported under mpirun (each rank would reset other units from its "
                       "own data); run it in one process", c->redo ? "redo" : "cbp");
    /* rank r steps environments r N .. r N + N - 1 of the one vector the seed defines */
    sm_status st = sm_vecenv_init_at(&p->v, run->env, c->num_envs, run->seed, p->rank * c->num_envs, &run->env_opts, err);
    if (st != SM_OK) return st;
    sm_vecenv_set_threads(&p->v, run->threads);
    /* the run's thread count applies to the networks too (OpenBLAS runs on OpenMP's threads): at
     * these sizes one thread is fastest, and more cost more than they save */
    if (run->threads > 0) omp_set_num_threads(run->threads);
    p->env = p->v.spec;
    if ((st = ppo_check(c, p->env, err)) != SM_OK) return st;
    p->N = c->num_envs, p->T = c->num_steps, p->D = sm_env_obs_numel(p->env), p->A = p->env->act_n;
    p->Bt = p->N * p->T, p->B = p->Bt / c->num_minibatches, p->box = p->env->act_kind == SM_SPACE_BOX;
    if ((st = actor_config(&p->actor_cfg, c, net, p->env, 1, err)) != SM_OK) return st;
    sm_rng_seed(&p->rng, run->seed);
    p->seed = run->seed;
    int maxT = p->B > p->N ? p->B : p->N;
    sm_model_config cc;
    if ((st = actor_config(&cc, c, net, p->env, 0, err)) != SM_OK) return st;
    cc.n_classes = 1;
    if (!(p->actor = sm_model_create(&p->actor_cfg, maxT, &p->rng, err))) return err ? err->code : SM_ERR_ARG;
    if (!(p->critic = sm_model_create(&cc, maxT, &p->rng, err))) return err ? err->code : SM_ERR_ARG;
    if ((st = init_orthogonal(p->actor, 0.01, &p->rng, err)) != SM_OK) return st;
    if ((st = init_orthogonal(p->critic, 1.0, &p->rng, err)) != SM_OK) return st;
    if (p->actor_cfg.layers[p->actor_cfg.n_layers - 1].kind == SM_LAYER_MOEHEAD) {
        /* the experts' output layers give the action means: scaled to 0.01 of their init, as the
         * policy head's gain 0.01 above, so the first policy is near the zero mean */
        sm_params *ps = &p->actor->params;
        for (int i = 0; i < ps->n; i++) {
            const char *nm = ps->p[i].name;
            size_t n = strlen(nm);
            int e, j, last = 0; /* LayerNorm's factory experts: layers.<i>.experts.<e>.<depth> is the output layer */
            char rest[16];
            if (c->layernorm && sscanf(nm, "layers.%*d.experts.%d.%d.%15s", &e, &j, rest) == 3)
                last = j == p->actor_cfg.moe.depth && (!strcmp(rest, "weight") || !strcmp(rest, "bias"));
            if (last || (n > 11 && (!strcmp(nm + n - 11, ".experts.w2") || !strcmp(nm + n - 11, ".experts.b2"))))
                for (size_t j = 0; j < ps->p[i].numel; j++) sm_params_data(ps, i)[j] *= (sm_real)0.01;
        }
    }
    if (c->sphere_rho > 0) {
        sm_sphere_config sc = {.rho = c->sphere_rho, .all_layers = c->sphere_all_layers, .per_expert = c->sphere_per_expert,
                               .unweighted = c->sphere_unweighted};
        sm_sphere_mode_parse(c->sphere_mode, &sc.mode); /* checked by ppo_check */
        sm_sphere_gram_parse(c->sphere_gram, &sc.gram);
        sc.seed = p->seed; /* the gradient Gram's u is the eNTK diagnostics' (diagnose) */
        sm_error e;
        if (!(p->sphere = sm_sphere_reg_create(&sc, p->actor, &e)))
            return sm_fail(err, e.code, "ppo: sphere_rho %g: %s", c->sphere_rho, e.msg);
        p->sphere_inject = sc.mode != SM_SPHERE_GRAD; /* loss and fixed: the coefficient is known before the backward */
    }
    if ((st = baselines_make(p, err)) != SM_OK) return st;
    /* the log-std parameter: zeros at the start (CleanRL's actor_logstd) */
    sm_params_init_table(&p->ls);
    int64_t sh[1] = {p->A};
    if (p->box && sm_params_add(&p->ls, "log_std", 1, sh, SM_INIT_ZERO, 0, 0, SM_PARAM_NO_DECAY, err) < 0) return SM_ERR_ARG;
    if ((st = sm_params_alloc(&p->ls, err)) != SM_OK) return st;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = SM_OPT_ADAM;
    oc.lr = c->learning_rate;
    oc.eps = 1e-5; /* CleanRL: optim.Adam(..., eps=1e-5) */
    sm_params *sets[3] = {&p->actor->params, &p->critic->params, &p->ls};
    p->n_sets = p->box ? 3 : 2;
    for (int k = 0; k < p->n_sets; k++)
        if ((st = sm_optim_init(&p->opt[k], &oc, sets[k], err)) != SM_OK) return st;

    const size_t N = (size_t)p->N, D = (size_t)p->D, A = (size_t)p->A, Bt = (size_t)p->Bt, B = (size_t)p->B;
    int bad = 0;
    p->obs_raw = alloc0(N * D, sizeof(float), &bad);
    p->final_obs = alloc0(N * D, sizeof(float), &bad);
    p->x = alloc0(N * D, sizeof(float), &bad);
    p->act = alloc0(N, sizeof(int), &bad);
    p->act_box = alloc0(N * A, sizeof(float), &bad);
    p->rew = alloc0(N, sizeof(float), &bad);
    p->term = alloc0(N, 1, &bad);
    p->trunc = alloc0(N, 1, &bad);
    p->rows = alloc0(N, sizeof(int), &bad);
    p->b_obs = alloc0(Bt * D, sizeof(float), &bad);
    p->b_act = alloc0(Bt, sizeof(int), &bad);
    p->b_box = alloc0(Bt * A, sizeof(sm_real), &bad);
    sm_real **reals[] = {&p->b_logp, &p->b_val, &p->b_rew, &p->b_boot, &p->b_adv, &p->b_ret};
    for (size_t i = 0; i < SM_LEN(reals); i++) *reals[i] = alloc0(Bt, sizeof(sm_real), &bad);
    p->b_done = alloc0(Bt, 1, &bad);
    p->next_value = alloc0(N, sizeof(sm_real), &bad);
    p->perm = alloc0(Bt, sizeof(int), &bad);
    p->m_obs = alloc0(B * D, sizeof(float), &bad);
    if (c->cchain) p->ref_obs = alloc0(B * D, sizeof(float), &bad);
    p->m_act = alloc0(B, sizeof(int), &bad);
    p->m_box = alloc0(B * A, sizeof(sm_real), &bad);
    sm_real **mreals[] = {&p->m_logp, &p->m_adv, &p->m_val, &p->m_ret};
    for (size_t i = 0; i < SM_LEN(mreals); i++) *mreals[i] = alloc0(B, sizeof(sm_real), &bad);
    p->ret_acc = alloc0(N, sizeof(double), &bad);
    p->rms_block = alloc0(2 * D + 2, sizeof(double), &bad);
    p->diag_x = alloc0((size_t)c->diag_states * D, sizeof(float), &bad);
    p->diag_u = alloc0(A, sizeof(sm_real), &bad);
    p->mom = alloc0(2 * D + 2, sizeof(double), &bad);
    p->ep = alloc0(4 * Bt, sizeof(double), &bad);
    p->ep_all = alloc0(4 * Bt * p->P, sizeof(double), &bad);
    p->red = alloc0(8 + (size_t)p->P, sizeof(double), &bad);
    if (bad) return sm_fail(err, SM_ERR_NOMEM, "ppo: out of memory for %d x %d rollouts of %s", p->N, p->T, run->env);
    p->obs_rms = (rms){0, p->rms_block, p->rms_block + D, p->D};
    p->ret_rms = (rms){0, p->rms_block + 2 * D, p->rms_block + 2 * D + 1, 1};
    rms_reset(&p->obs_rms);
    rms_reset(&p->ret_rms);
    sm_vecenv_bind(&p->v, p->obs_raw, p->act, p->act_box, p->rew, p->term, p->trunc, p->final_obs);
    sm_vecenv_reset(&p->v);
    /* the networks came from the shared seed and are the same on every rank; from here each rank
     * draws its own actions (rank 0 keeps the one-process stream) */
    if (p->rank > 0) sm_rng_seed(&p->rng, sm_env_seed(run->seed ^ 0x52414E4BULL, p->rank));
    return normalisers_update(p, c->norm_obs, 0, err);
}

/* ---- checkpoints ------------------------------------------------------------------------------
 * Tensors: "actor.*", "critic.*" and "log_std" with their Adam moments (sm_checkpoint_write).
 * Metadata: agent, env, agent_settings, network (the actor's config), counters, and two byte
 * strings written as lowercase hex (the machine's byte order; a checkpoint resumes on the same
 * kind of machine): "obs_rms" = count, mean (D), var (D) as doubles; "run_state" = the RNG, the
 * counters, the Adam step counts, the reward normaliser, the vector's observations and the
 * environments' states, so a resumed run continues bit for bit. */

typedef struct {
    unsigned char *b;
    size_t n, cap, pos;
    int bad;
} blob;

static void put(blob *s, const void *x, size_t n) {
    if (s->n + n > s->cap) {
        size_t cap = (s->n + n) * 2;
        unsigned char *b = realloc(s->b, cap);
        if (!b) {
            s->bad = 1;
            return;
        }
        s->b = b, s->cap = cap;
    }
    memcpy(s->b + s->n, x, n);
    s->n += n;
}

static void get(blob *s, void *x, size_t n) {
    if (s->bad || s->pos + n > s->n) {
        s->bad = 1;
        return;
    }
    memcpy(x, s->b + s->pos, n);
    s->pos += n;
}

static void put_mut(blob *s, void *x, size_t n) { put(s, x, n); }

static char *to_hex(const blob *s) {
    char *h = malloc(2 * s->n + 1);
    if (!h) return NULL;
    for (size_t i = 0; i < s->n; i++) snprintf(h + 2 * i, 3, "%02x", s->b[i]);
    h[2 * s->n] = 0;
    return h;
}

static int from_hex(blob *s, const char *h) {
    memset(s, 0, sizeof *s);
    size_t n = h ? strlen(h) : 1;
    if (n % 2) return -1;
    if (!(s->b = malloc(n / 2 + 1))) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) return -1;
        s->b[i] = (unsigned char)v;
    }
    s->n = n / 2;
    return 0;
}

static void rms_put(blob *s, const rms *r) {
    put(s, &r->count, sizeof r->count);
    put(s, r->mean, sizeof(double) * r->n);
    put(s, r->var, sizeof(double) * r->n);
}
static void rms_get(blob *s, rms *r) {
    get(s, &r->count, sizeof r->count);
    get(s, r->mean, sizeof(double) * r->n);
    get(s, r->var, sizeof(double) * r->n);
}

#define STATE_MAGIC "specmoe-ppo-1"

/* The run state, in one order for both directions (dir 0 writes, 1 reads). */
static void run_state_io(ppo *p, blob *s, int dir) {
    void (*io)(blob *, void *, size_t) = dir ? get : put_mut;
    const size_t N = (size_t)p->N;
    char magic[sizeof STATE_MAGIC];
    memcpy(magic, STATE_MAGIC, sizeof magic);
    io(s, magic, sizeof magic);
    if (dir && memcmp(magic, STATE_MAGIC, sizeof magic)) s->bad = 1;
    io(s, &p->rng, sizeof p->rng);
    io(s, &p->global_step, sizeof p->global_step);
    io(s, &p->updates, sizeof p->updates);
    io(s, &p->num_updates, sizeof p->num_updates);
    io(s, &p->horizon, sizeof p->horizon);
    io(s, &p->seed, sizeof p->seed);
    io(s, &p->episodes, sizeof p->episodes);
    for (int k = 0; k < 3; k++) io(s, &p->opt[k].step, sizeof p->opt[k].step);
    io(s, &p->ret_rms.count, sizeof(double));
    io(s, p->ret_rms.mean, sizeof(double));
    io(s, p->ret_rms.var, sizeof(double));
    io(s, p->ret_acc, sizeof(double) * N);
    io(s, p->obs_raw, sizeof(float) * N * p->D);
    /* the environments through the vector's own save/load: a MuJoCo state holds an mjData pointer */
    const size_t vb = sm_vecenv_state_size(&p->v);
    void *venv = malloc(vb ? vb : 1);
    if (!venv) {
        s->bad = 1;
        return;
    }
    if (!dir) sm_vecenv_save(&p->v, venv);
    io(s, venv, vb);
    if (dir && !s->bad) sm_vecenv_load(&p->v, venv);
    free(venv);
    /* the baselines' own state (CBP's utilities, SN's and SR's power iterations, C-CHAIN's previous parameters):
     * only when one is on, so the state of every other run is as before */
    const size_t bb = sm_baselines_state_bytes(p->base);
    void *base = bb ? malloc(bb) : NULL;
    if (bb && !base) {
        s->bad = 1;
        return;
    }
    if (bb && !dir) sm_baselines_state_save(p->base, base);
    if (bb) io(s, base, bb);
    if (bb && dir && !s->bad) sm_baselines_state_load(p->base, base);
    free(base);
}

static int sets_of(ppo *p, sm_ckpt_set *sets) {
    sets[0] = (sm_ckpt_set){"actor.", &p->actor->params, &p->opt[0]};
    sets[1] = (sm_ckpt_set){"critic.", &p->critic->params, &p->opt[1]};
    sets[2] = (sm_ckpt_set){"", &p->ls, &p->opt[2]};
    return p->n_sets;
}

static char *settings_json(const sm_ppo_config *c) {
    cJSON *o = sm_agent_config_to_json(&sm_agent_ppo, c);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* The metadata key of rank r's run state: "run_state" for rank 0 (and one process), "run_state_rR" */
static void run_state_key(char *key, size_t n, int r) {
    if (r == 0) snprintf(key, n, "run_state");
    else snprintf(key, n, "run_state_r%d", r);
}

/* Collective under MPI: every rank's run state (its environments, RNG stream and reward
 * accumulators; the parameters are the same on every rank) goes to rank 0, which writes the
 * checkpoint with them under run_state_key and "ranks" = P. Every rank returns rank 0's status. */
static sm_status ppo_save(ppo *p, const char *path, const sm_rl_run *run, sm_error *err) {
    blob rs = {0}, ob = {0};
    run_state_io(p, &rs, 0);
    double agree[2] = {rs.bad, (double)rs.n}; /* every rank's state must have been written, all of one size */
    sm_status st = sm_dist_sum(p->dist, agree, 2, err);
    if (st == SM_OK && (agree[0] > 0 || agree[1] != (double)rs.n * p->P)) st = sm_fail(err, SM_ERR_NOMEM, "%s: a rank could not serialise its run state", path);
    unsigned char *all = st == SM_OK && p->rank == 0 ? malloc(rs.n * p->P + 1) : NULL;
    if (st == SM_OK) st = sm_dist_gather_bytes(p->dist, rs.b, rs.n, all ? all : rs.b, 0, err);
    if (st != SM_OK || p->rank != 0) {
        free(rs.b), free(all);
        return st;
    }
    if (!all) {
        free(rs.b);
        return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    }
    rms_put(&ob, &p->obs_rms);
    char *settings = settings_json(&p->c), *network = sm_model_config_to_json(&p->actor_cfg);
    char *rs_hex = rs.bad ? NULL : to_hex(&rs), *ob_hex = ob.bad ? NULL : to_hex(&ob);
    char gs[32], up[32], total[32], seed[32], ranks[16];
    snprintf(ranks, sizeof ranks, "%d", p->P);
    /* the other ranks' states and their keys */
    char **hex = calloc((size_t)p->P, sizeof *hex), (*keys)[24] = calloc((size_t)p->P, sizeof *keys);
    int bad_hex = !hex || !keys;
    for (int r = 1; r < p->P && !bad_hex; r++) {
        blob b = {all + (size_t)r * rs.n, rs.n, rs.n, 0, 0};
        run_state_key(keys[r], sizeof keys[r], r);
        bad_hex = !(hex[r] = to_hex(&b));
    }
    snprintf(gs, sizeof gs, "%ld", p->global_step);
    snprintf(up, sizeof up, "%ld", p->updates);
    snprintf(total, sizeof total, "%ld", p->horizon);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    char sticky[32];
    snprintf(sticky, sizeof sticky, "%.17g", run->env_opts.sticky);
    enum { N_META = 11 };
    sm_st_meta *meta = malloc(sizeof *meta * (size_t)(N_META + p->P));
    if (!settings || !network || !rs_hex || !ob_hex || bad_hex || !meta) {
        st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    } else {
        /* what `rl train --resume` reads: agent, env, agent_settings, network, frames_total, seed, sticky */
        const sm_st_meta base[N_META] = {{"agent", "ppo"},     {"env", (char *)run->env}, {"agent_settings", settings},
                                         {"network", network}, {"frames_total", total},   {"seed", seed},
                                         {"global_step", gs},  {"updates", up},           {"obs_rms", ob_hex},
                                         {"run_state", rs_hex}, {"sticky", sticky}};
        memcpy(meta, base, sizeof base);
        int n_meta = N_META;
        if (p->P > 1) meta[n_meta++] = (sm_st_meta){"ranks", ranks}; /* absent: one process */
        for (int r = 1; r < p->P; r++) meta[n_meta++] = (sm_st_meta){keys[r], hex[r]};
        sm_ckpt_set sets[3];
        st = sm_checkpoint_write(path, sets, sets_of(p, sets), meta, n_meta, err);
    }
    for (int r = 1; hex && r < p->P; r++) free(hex[r]);
    free(hex), free(keys), free(meta), free(all);
    free(rs.b), free(ob.b), free(settings), free(network), free(rs_hex), free(ob_hex);
    return st;
}

/* A checkpoint's agent settings as this build writes them: options added since it was written (the
 * actor kind, SPHERE's) take their defaults, which are the behaviour it was trained with. NULL if
 * they do not parse. */
static char *canonical_settings(const char *s) {
    sm_ppo_config c;
    sm_opt_defaults(kOpts, (int)SM_LEN(kOpts), &c);
    cJSON *o = s ? cJSON_Parse(s) : NULL;
    sm_error e;
    sm_status st = o ? sm_agent_config_from_json(&sm_agent_ppo, &c, o, "agent_settings", &e) : SM_ERR_FORMAT;
    cJSON_Delete(o);
    return st == SM_OK ? settings_json(&c) : NULL;
}

/* Checks the agent, env, settings and network metadata of a PPO checkpoint against what is asked. */
static sm_status check_meta(const sm_safetensors *st, const char *path, const char *env, const char *settings,
                            const char *network, sm_error *err) {
    const char *a = sm_safetensors_meta(st, "agent"), *e = sm_safetensors_meta(st, "env");
    const char *s = sm_safetensors_meta(st, "agent_settings"), *n = sm_safetensors_meta(st, "network");
    if (!a || strcmp(a, "ppo")) return sm_fail(err, SM_ERR_MISMATCH, "%s: not a ppo checkpoint (agent '%s')", path, a ? a : "none");
    if (env && (!e || strcmp(e, env)))
        return sm_fail(err, SM_ERR_MISMATCH, "%s: trained on env %s, not %s", path, e ? e : "(none)", env);
    if (settings) {
        char *cs = canonical_settings(s);
        const int differ = !cs || strcmp(cs, settings);
        free(cs);
        if (differ)
            return sm_fail(err, SM_ERR_MISMATCH, "%s: its agent settings %s differ from this run's %s", path, s ? s : "(none)", settings);
    }
    if (network && (!n || strcmp(n, network)))
        return sm_fail(err, SM_ERR_MISMATCH, "%s: its network %s differs from this run's %s", path, n ? n : "(none)", network);
    return SM_OK;
}

static sm_status read_rms(const sm_safetensors *st, const char *path, rms *r, sm_error *err) {
    blob b;
    int bad = from_hex(&b, sm_safetensors_meta(st, "obs_rms"));
    if (!bad) rms_get(&b, r);
    bad = bad || b.bad || b.pos != b.n;
    free(b.b);
    return bad ? sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.obs_rms is not %d normaliser values", path, 2 * r->n + 1) : SM_OK;
}

/* Reads a checkpoint of this run's settings and network into p. exact (--resume): every set with its
 * Adam moments, the observation normaliser and the run state, from a checkpoint of env. Otherwise
 * (continual RL, SPHERE Sec. 5.1, sm_rl_run.init_from): the next task starts from the previous
 * task's actor, critic, log-std and observation normaliser; the checkpoint may be of any env (a
 * family shares its spaces; the network check catches the rest) and Adam's moments are not read:
 * they start at zero as in a new launch (agent.h). */
static sm_status ppo_load(ppo *p, const char *path, const char *env, int exact, sm_error *err) {
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, path, err);
    if (s != SM_OK) return s;
    char *settings = settings_json(&p->c), *network = sm_model_config_to_json(&p->actor_cfg);
    s = check_meta(&st, path, env, settings, network, err);
    sm_ckpt_set sets[3];
    const int n = sets_of(p, sets);
    for (int k = 0; k < n && !exact; k++) sets[k].opt = NULL;
    if (s == SM_OK) s = sm_checkpoint_read_sets(&st, path, sets, n, NULL, err);
    if (s == SM_OK) s = read_rms(&st, path, &p->obs_rms, err);
    /* the environments' states are per rank: a run resumes on as many ranks as wrote it (init_from
     * reads no run state: any rank count starts from the same network) */
    const char *ranks = sm_safetensors_meta(&st, "ranks");
    const int written_by = ranks ? atoi(ranks) : 1;
    if (s == SM_OK && exact && written_by != p->P)
        s = sm_fail(err, SM_ERR_MISMATCH, "%s: written by a run on %d rank(s), resumed on %d: each rank's environments are in "
                    "the checkpoint, so resume it on %d (mpirun -np %d; 1: without mpirun)", path, written_by, p->P, written_by,
                    written_by);
    if (s == SM_OK && exact) {
        blob b;
        char key[24];
        run_state_key(key, sizeof key, p->rank);
        int bad = from_hex(&b, sm_safetensors_meta(&st, key));
        if (!bad) run_state_io(p, &b, 1);
        if (bad || b.bad || b.pos != b.n) s = sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__.run_state is malformed or of another vector size", path);
        free(b.b);
    }
    free(settings), free(network);
    sm_safetensors_free(&st);
    return s;
}

/* ---- acting ---------------------------------------------------------------------------------- */

/* Samples actions for the N rows of p->x (normalised), storing them at rollout step t. */
static void act_sample(ppo *p, int t) {
    const int N = p->N, A = p->A;
    const sm_real *out = sm_model_forward(p->actor, p->x, N, &p->rng, 0);
    for (int i = 0; i < N; i++) {
        size_t k = (size_t)t * N + i;
        const sm_real *z = out + (size_t)i * A;
        if (p->box) {
            const sm_real *ls = p->ls.data;
            sm_real *a = p->b_box + k * A;
            for (int j = 0; j < A; j++) {
                a[j] = (sm_real)(z[j] + exp((double)ls[j]) * sm_rng_normal(&p->rng));
                p->act_box[(size_t)i * A + j] = (float)a[j];
            }
            p->b_logp[k] = (sm_real)sm_gaussian_logprob(NULL, NULL, 0, a, z, ls, A);
        } else {
            /* inverse-CDF sampling of the categorical distribution */
            double lse = log_sum_exp(z, A), u = sm_rng_uniform(&p->rng), c = 0;
            int a = A - 1;
            for (int j = 0; j < A; j++)
                if ((c += exp(z[j] - lse)) > u) {
                    a = j;
                    break;
                }
            p->act[i] = p->b_act[k] = a;
            p->b_logp[k] = (sm_real)(z[a] - lse);
        }
    }
}

/* Values of n rows of x into out. */
static void values(ppo *p, sm_real *out, const float *x, int n) {
    const sm_real *v = sm_model_forward(p->critic, x, n, &p->rng, 0);
    for (int i = 0; i < n; i++) out[i] = v[i];
}

/* One rollout of T steps; finished episodes are kept in p->ep (episodes_log logs them). */
static sm_status rollout(ppo *p, sm_error *err) {
    const int N = p->N, D = p->D;
    sm_status st = SM_OK;
    p->ep_n = 0;
    for (int t = 0; t < p->T; t++) {
        float *x = p->b_obs + (size_t)t * N * D;
        obs_normalize(x, p->obs_raw, N, &p->obs_rms, p->c.norm_obs);
        memcpy(p->x, x, sizeof(float) * (size_t)N * D);
        act_sample(p, t);
        values(p, p->b_val + (size_t)t * N, p->x, N);
        sm_vecenv_step(&p->v);
        p->global_step += (long)N * p->P; /* frames of every rank */
        /* NormalizeReward: scale by the std of the running discounted return, then clip */
        if (p->c.norm_reward)
            for (int i = 0; i < N; i++) p->ret_acc[i] = p->ret_acc[i] * p->c.gamma + p->rew[i];
        if ((st = normalisers_update(p, p->c.norm_obs, p->c.norm_reward, err)) != SM_OK) return st;
        int n_trunc = 0;
        for (int i = 0; i < N; i++) {
            size_t k = (size_t)t * N + i;
            double r = p->rew[i];
            if (p->c.norm_reward) {
                r /= sqrt(p->ret_rms.var[0] + 1e-8);
                r = r < -10 ? -10 : r > 10 ? 10 : r;
            }
            p->b_rew[k] = (sm_real)r;
            p->b_done[k] = p->term[i] || p->trunc[i];
            p->b_boot[k] = 0;
            if (p->trunc[i] && !p->term[i]) p->rows[n_trunc++] = i;
            if (!p->b_done[k]) continue;
            p->ret_acc[i] = 0;
            sm_env_log one = p->v.logs[i];
            memset(&p->v.logs[i], 0, sizeof p->v.logs[i]);
            double *e = p->ep + 4 * (size_t)p->ep_n;
            e[0] = (double)p->global_step, e[1] = (double)p->rank * p->Bt + p->ep_n;
            e[2] = one.episode_return, e[3] = one.episode_length;
            p->ep_n++;
        }
        /* truncated episodes bootstrap from the value of their final observation */
        if (n_trunc) {
            for (int r = 0; r < n_trunc; r++)
                obs_normalize(p->x + (size_t)r * D, p->final_obs + (size_t)p->rows[r] * D, 1, &p->obs_rms, p->c.norm_obs);
            sm_real *boot = p->next_value; /* scratch until the end of the rollout */
            values(p, boot, p->x, n_trunc);
            for (int r = 0; r < n_trunc; r++) p->b_boot[(size_t)t * N + p->rows[r]] = boot[r];
        }
    }
    obs_normalize(p->x, p->obs_raw, N, &p->obs_rms, p->c.norm_obs);
    values(p, p->next_value, p->x, N);
    return SM_OK;
}

/* by global step, then by rank and order within the rank */
static int episode_cmp(const void *a, const void *b) {
    const double *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : x[1] < y[1] ? -1 : x[1] > y[1];
}

/* The rollout's finished episodes of every rank (allgathered: every rank keeps the same counts) into
 * the log (rank 0's; the others have none) in the order of their global step, and into the sums. */
static sm_status episodes_log(ppo *p, sm_rl_log *log, double *ret_sum, long *ret_n, long tail_from, sm_error *err) {
    static const char *const kEp[] = {"episodic_return", "episodic_length"};
    int n = 0;
    sm_status st = sm_dist_allgather(p->dist, p->ep, 4 * p->ep_n, p->ep_all, 4 * p->Bt * p->P, &n, err);
    if (st != SM_OK) return st;
    n /= 4;
    if (p->P > 1) qsort(p->ep_all, (size_t)n, 4 * sizeof(double), episode_cmp);
    for (int k = 0; k < n && st == SM_OK; k++) {
        const double *e = p->ep_all + 4 * (size_t)k;
        st = sm_rl_log_record(log, (long)e[0], kEp, e + 2, 2, err);
        p->episodes++;
        *ret_sum += e[2], (*ret_n)++;
        if ((long)e[0] > tail_from) p->tail_sum += e[2], p->tail_n++;
    }
    return st;
}

/* ---- learning -------------------------------------------------------------------------------- */

/* 1 when every gradient of the n tables is finite */
static int grads_finite(sm_params *const *sets, int n) {
    for (int s = 0; s < n; s++)
        for (size_t i = 0; i < sets[s]->total; i++)
            if (!isfinite(sets[s]->grad[i])) return 0;
    return 1;
}

/* update_epochs passes of minibatch Adam steps; fills the CleanRL statistics. */
static sm_status learn(ppo *p, double lr, sm_ppo_stats *last, double *clipfrac, sm_error *err) {
    const int B = p->B, D = p->D, A = p->A;
    sm_params *sets[3] = {&p->actor->params, &p->critic->params, &p->ls};
    double cf = 0;
    long n_mb = 0;
    for (int i = 0; i < p->Bt; i++) p->perm[i] = i;
    for (int epoch = 0; epoch < p->c.update_epochs; epoch++) {
        sm_rng_shuffle(&p->rng, p->perm, p->Bt);
        for (int start = 0; start < p->Bt; start += B) {
            const int *idx = p->perm + start;
            double mean = 0, var = 0;
            for (int b = 0; b < B; b++) {
                int k = idx[b];
                memcpy(p->m_obs + (size_t)b * D, p->b_obs + (size_t)k * D, sizeof(float) * D);
                if (p->box) memcpy(p->m_box + (size_t)b * A, p->b_box + (size_t)k * A, sizeof(sm_real) * A);
                else p->m_act[b] = p->b_act[k];
                p->m_logp[b] = p->b_logp[k], p->m_adv[b] = p->b_adv[k];
                p->m_val[b] = p->b_val[k], p->m_ret[b] = p->b_ret[k];
                mean += p->m_adv[b];
            }
            /* advantage normalisation with torch's unbiased std, over the global minibatch (every
             * rank's B rows: their moments merged over the ranks, so all ranks scale alike) */
            if (p->c.norm_adv && (double)B * p->P > 1) {
                mean /= B;
                for (int b = 0; b < B; b++) var += (p->m_adv[b] - mean) * (p->m_adv[b] - mean);
                double cnt = B; /* the ranks' moments merged exactly: one collective */
                sm_status ds = sm_dist_moments_merge(p->dist, &cnt, &mean, &var, 1, err);
                if (ds != SM_OK) return ds;
                double sd = sqrt(var / (cnt - 1));
                for (int b = 0; b < B; b++) p->m_adv[b] = (sm_real)((p->m_adv[b] - mean) / (sd + 1e-8));
            }
            if (p->ref_obs) { /* C-CHAIN: the churn on rows drawn uniformly from the whole rollout (a draw of its own, not the minibatch) */
                for (int b = 0; b < B; b++)
                    memcpy(p->ref_obs + (size_t)b * D, p->b_obs + (size_t)sm_rng_below(&p->rng, (uint32_t)p->Bt) * D, sizeof(float) * D);
                sm_baselines_churn(p->base, p->actor, p->ref_obs, B);
            }
            for (int s = 0; s < p->n_sets; s++) sm_params_zero_grad(sets[s]);
            sm_ppo_stats st = {0};
            const sm_real *out = sm_model_forward(p->actor, p->m_obs, B, &p->rng, 1);
            double lp = p->box ? sm_ppo_policy_loss_gaussian(p->actor->dlogits, p->ls.grad, &st, out, p->ls.data, p->m_box,
                                                             p->m_logp, p->m_adv, B, A, p->c.clip_coef, p->c.ent_coef)
                               : sm_ppo_policy_loss_discrete(p->actor->dlogits, &st, out, p->m_act, p->m_logp, p->m_adv, B, A,
                                                             p->c.clip_coef, p->c.ent_coef);
            /* the critic's forward and loss before the actor's backward: SPHERE's loss mode needs
             * L_base = L_policy + L_value there (the two networks are independent) */
            const sm_real *v = sm_model_forward(p->critic, p->m_obs, B, &p->rng, 1);
            double lv = sm_ppo_value_loss(p->critic->dlogits, &st, v, p->m_val, p->m_ret, B, p->c.clip_coef, p->c.clip_vloss,
                                          p->c.vf_coef);
            sm_sphere_stats ss_in = {0};
            if (p->sphere && p->sphere_inject) /* loss mode: lambda grad L rides in the actor's backward */
                sm_sphere_inject(p->sphere, lp + lv, B, &ss_in);
            sm_model_backward_into(p->actor, &p->actor->params, B);
            p->aux_sum += p->actor->aux_loss;
            sm_model_backward_into(p->critic, &p->critic->params, B);
            sm_baselines_grad(p->base, p->actor, lp); /* PW's and SR's exact gradients, C-CHAIN's scaled by |L_policy| */
            if (p->poison) lp = NAN;
            if (p->P > 1) {
                /* data parallel: the losses and statistics are averaged over the ranks, with every
                 * rank's finiteness flag, before the gradients (the mean of the ranks' gradients is
                 * the gradient of the global minibatch's mean loss: every rank has B rows); so the
                 * NaN guard names the rank, and it and the target-KL stop decide alike everywhere */
                double *r = p->red;
                const double s8[8] = {lp, lv, st.pg_loss, st.v_loss, st.entropy, st.old_approx_kl, st.approx_kl, st.clipfrac};
                memcpy(r, s8, sizeof s8);
                memset(r + 8, 0, sizeof(double) * p->P);
                r[8 + p->rank] = !isfinite(lp) || !isfinite(lv) || !grads_finite(sets, p->n_sets);
                sm_status ds = sm_dist_sum(p->dist, r, 8 + p->P, err);
                if (ds != SM_OK) return ds;
                for (int q = 0; q < p->P; q++)
                    if (r[8 + q] > 0)
                        return sm_fail(err, SM_ERR_NUMERIC, "ppo: update %ld (global step %ld): rank %d: a loss or gradient is "
                                       "not finite", p->updates + 1, p->global_step, q);
                if ((ds = sm_dist_grad_mean_sets(p->dist, sets, p->n_sets, err)) != SM_OK) return ds;
                for (int k = 0; k < 8; k++) r[k] /= p->P;
                lp = r[0], lv = r[1], st.pg_loss = r[2], st.v_loss = r[3], st.entropy = r[4];
                st.old_approx_kl = r[5], st.approx_kl = r[6], st.clipfrac = r[7];
            }
            if (p->sphere) { /* App. A.3: g_actor += coef * grad L, coef from this minibatch's norms or losses */
                sm_params *others[2] = {&p->critic->params, &p->ls};
                sm_sphere_stats ss = ss_in;
                if (!p->sphere_inject) sm_sphere_step(p->sphere, others, p->n_sets - 1, lp + lv, B, &ss);
                if (!isfinite(ss.penalty) || !isfinite(ss.coef))
                    return sm_fail(err, SM_ERR_NUMERIC, "ppo: update %ld (global step %ld): the SPHERE %s is %g", p->updates + 1,
                                   p->global_step, isfinite(ss.penalty) ? "coefficient" : "penalty",
                                   isfinite(ss.penalty) ? ss.coef : ss.penalty);
                p->sph_pen += ss.penalty, p->sph_coef += ss.coef, p->sph_n++;
                p->sph_gb += ss.gnorm_base, p->sph_gp += ss.gnorm_pen;
            }
            sm_baselines_before_step(p->base, p->actor); /* SN: the raw weights and their gradient */
            double gn = sm_clip_grad_norm_sets(sets, p->n_sets, p->c.max_grad_norm);
            if (!isfinite(lp) || !isfinite(lv) || !isfinite(gn))
                return sm_fail(err, SM_ERR_NUMERIC, "ppo: update %ld (global step %ld): %s is %g", p->updates + 1,
                               p->global_step, !isfinite(lp) ? "the policy loss" : !isfinite(lv) ? "the value loss" : "the gradient norm",
                               !isfinite(lp) ? lp : !isfinite(lv) ? lv : gn);
            for (int s = 0; s < p->n_sets; s++) sm_optim_step(&p->opt[s], sets[s], lr);
            sm_baselines_after_step(p->base, p->actor, &p->opt[0], B, &p->rng); /* ReDo, CBP: this minibatch's activations */
            p->gn_sum += gn, p->gn_n++;
            cf += st.clipfrac, n_mb++;
            *last = st;
        }
        if (p->c.target_kl > 0 && last->approx_kl > p->c.target_kl) break;
    }
    *clipfrac = cf / (double)n_mb;
    return SM_OK;
}

static double explained_variance(const sm_real *pred, const sm_real *y, int n) {
    double my = 0, md = 0, vy = 0, vd = 0;
    for (int i = 0; i < n; i++) my += y[i], md += y[i] - pred[i];
    my /= n, md /= n;
    for (int i = 0; i < n; i++) {
        double a = y[i] - my, d = y[i] - pred[i] - md;
        vy += a * a, vd += d * d;
    }
    return vy == 0 ? NAN : 1 - vd / vy;
}

/* The diagnostics of SPHERE's Sec. 5 / App. A.5 on the held-out batch (drawn from the first rollout
 * of the session, rows spread evenly over it, with a fixed unit direction u of the action means for
 * the eNTK's scalar output, from the run's seed): the eNTK effective rank, the effective rank and
 * mean norm of the routing-weighted features and L on it (MoE actors), the dormant ratio of the
 * actor's last layer (tau 0.1), and the mean global gradient norm of the update's minibatches. None
 * of it changes the training. */
static sm_status diagnose(ppo *p, sm_rl_log *log, sm_error *err) {
    const int Nd = p->c.diag_states, D = p->D, A = p->A;
    if (!p->diag_n) {
        for (int i = 0; i < Nd; i++)
            memcpy(p->diag_x + (size_t)i * D, p->b_obs + (size_t)((long)i * p->Bt / Nd) * D, sizeof(float) * D);
        sm_sphere_direction(p->seed, p->diag_u, A); /* its own stream: the training's RNG is untouched */
        p->diag_n = Nd;
    }
    sm_sphere_diag dg;
    sm_status st = sm_sphere_diagnose(p->actor, p->diag_x, Nd, p->diag_u, &dg, err);
    if (st != SM_OK) return st;
    sm_model_forward(p->actor, p->diag_x, Nd, NULL, 0);
    enum { MAX_ENTRIES = 1024 };
    static sm_dormant_entry e[MAX_ENTRIES];
    int k = sm_model_dormant(p->actor, Nd, 0.1, e, MAX_ENTRIES);
    double dormant = NAN;
    for (int i = 0; i < k; i++)
        if (e[i].expert < 0) dormant = e[i].fraction; /* the last layer's */
    /* App. J.11's specialisation metrics (MoE actors) after the feature diagnostics */
    static const char *const kDiag[] = {"diag/entk_srank",    "diag/dormant",     "diag/grad_norm",       "diag/feature_srank",
                                        "diag/feature_norm",  "diag/penalty",     "diag/overlap",         "diag/orthogonality",
                                        "diag/silhouette",    "diag/knn_jaccard", "diag/max_vio",         "diag/active_ratio",
                                        "diag/routing_entropy"};
    const sm_sphere_spec *sp = &dg.spec;
    if (p->c.diag_slq > 0) { /* SLQ beside the exact rank (at most 30 Lanczos steps), its own RNG stream */
        sm_rng r;
        sm_rng_seed(&r, p->seed ^ 0x534c51ULL ^ (uint64_t)p->updates);
        double slq = NAN, se = NAN;
        if ((st = sm_entk_rank_slq(p->actor, p->diag_x, Nd, p->diag_u, p->c.diag_slq, Nd < 30 ? Nd : 30, &r, &slq, &se, err)) != SM_OK)
            return st;
        static const char *const kSlq[] = {"diag/entk_srank_slq", "diag/entk_slq_se", "diag/entk_slq_rel_error"};
        const double sv[] = {slq, se, fabs(slq - dg.entk_srank) / dg.entk_srank};
        if ((st = sm_rl_log_record(log, p->global_step, kSlq, sv, 3, err)) != SM_OK) return st;
    }
    double vals[] = {dg.entk_srank, dormant,          p->gn_n ? p->gn_sum / p->gn_n : NAN, dg.feature_srank, dg.feature_norm,
                     dg.penalty,    sp->overlap,      sp->orthogonality, sp->silhouette, sp->knn_jaccard, sp->max_vio,
                     sp->active_ratio, sp->entropy};
    return sm_rl_log_record(log, p->global_step, kDiag, vals, dg.have_features ? (int)SM_LEN(vals) : 3, err);
}

/* SPHERE Fig. 6's data for the final actor (MoE actors with built-in experts and a sparse route):
 * <dir>/fig6.dat, one held-out state per line, "x y direction" (sm_sphere_fig6, 8 directions);
 * `specmoe rl train` draws it as fig6.png. Nothing is written for other actors. */
static sm_status write_fig6(ppo *p, const char *dir, sm_error *err) {
    const int n_moe = sm_model_n_moe(p->actor), N = p->diag_n;
    sm_moe *moe = n_moe ? sm_model_moe(p->actor, n_moe - 1) : NULL;
    if (!moe || moe->experts || moe->router->ops->kind != SM_ROUTE_SPARSE || N < 2) return SM_OK;
    sm_model_forward(p->actor, p->diag_x, N, NULL, 0);
    const int D = moe->E * moe->H;
    sm_real *phi = malloc(sizeof(sm_real) * (size_t)N * D);
    double *xy = malloc(sizeof(double) * 2 * (size_t)N);
    int *col = malloc(sizeof(int) * (size_t)N);
    sm_status st = !phi || !xy || !col ? sm_fail(err, SM_ERR_NOMEM, "ppo: out of memory for the fig6 features") : SM_OK;
    if (st == SM_OK) st = sm_sphere_features(moe, phi, err);
    if (st == SM_OK) st = sm_sphere_fig6(phi, N, D, 8, xy, col, NULL, err);
    char path[4200];
    snprintf(path, sizeof path, "%s/fig6.dat", dir);
    FILE *f = st == SM_OK ? fopen(path, "w") : NULL;
    if (st == SM_OK && !f) st = sm_fail(err, SM_ERR_IO, "%s: %s", path, strerror(errno));
    if (f) {
        fprintf(f, "# SPHERE Fig. 6: held-out states in the plane of the two leading singular directions of the\n"
                   "# routing-weighted features, and each state's dominant direction (of 8); step %ld\n# x y direction\n",
                p->global_step);
        for (int t = 0; t < N; t++) fprintf(f, "%.6g %.6g %d\n", xy[2 * t], xy[2 * t + 1], col[t]);
        if (fclose(f) != 0) st = sm_fail(err, SM_ERR_IO, "%s: %s", path, strerror(errno));
    }
    free(phi), free(xy), free(col);
    return st;
}

/* --dist-check: the same parameters (actor, critic, log-std) on every rank */
static sm_status check_same(ppo *p, sm_error *err) {
    sm_params *sets[3] = {&p->actor->params, &p->critic->params, &p->ls};
    sm_status st = SM_OK;
    for (int k = 0; k < p->n_sets && st == SM_OK; k++) st = sm_dist_check_same(p->dist, sets[k], p->updates, err);
    return st;
}

static sm_status ppo_train(const void *vcfg, const sm_model_config *net, const sm_rl_run *run, sm_rl_result *res,
                           sm_error *err) {
    const sm_ppo_config *c = vcfg;
    memset(res, 0, sizeof *res);
    ppo p;
    sm_rl_log log;
    memset(&log, 0, sizeof log);
    sm_status st = ppo_create(&p, c, net, run, err);
    /* the global rollout: every rank's num_envs x num_steps (frames, the anneal and the budget count it) */
    const long batch = (long)c->num_envs * c->num_steps * p.P;
    if (st == SM_OK) {
        long horizon = p.horizon = c->total_timesteps > 0 ? (long)c->total_timesteps
                       : run->frames > 0     ? run->frames
                       : p.box               ? DEFAULT_STEPS_CONTINUOUS
                                             : DEFAULT_STEPS_DISCRETE;
        p.num_updates = horizon / batch;
        if (p.num_updates < 1)
            st = sm_fail(err, SM_ERR_ARG, "ppo: a budget of %ld steps is less than one rollout of %ld", horizon, batch);
    }
    if (st == SM_OK && (run->resume || run->init_from))
        st = run->resume ? ppo_load(&p, run->resume, run->env, 1, err) : ppo_load(&p, run->init_from, NULL, 0, err);
    if (st == SM_OK && run->init_from && !run->resume && p.base) st = baselines_make(&p, err);
    /* rank 0 alone writes settings.json and metrics.jsonl and prints progress */
    sm_rl_run lrun = *run;
    if (p.rank != 0) lrun.out_dir = NULL, lrun.progress = NULL;
    if (st == SM_OK) st = sm_rl_log_open(&log, &lrun, &sm_agent_ppo, c, &p.actor_cfg, p.global_step, err);
    /* this run ends at the frame budget (a resumed run counts earlier frames) or at the horizon */
    long end = p.num_updates;
    if (run->frames > 0 && run->frames / batch < end) end = run->frames / batch;
    const long tail_from = (long)(0.9 * (double)(end * batch));
    char ckpt[4200] = "";
    if (run->out_dir) snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", run->out_dir);
    long saved_at = run->resume ? p.updates : -1;
    res->frames_start = p.global_step;
    const char *saved_path = run->resume;
    double t0 = sm_time_now();
    static const char *const kKeys[] = {"charts/learning_rate", "losses/value_loss", "losses/policy_loss",
                                        "losses/entropy",       "losses/old_approx_kl", "losses/approx_kl",
                                        "losses/clipfrac",      "losses/explained_variance", "SPS",
                                        "sphere/penalty",       "sphere/coef",          "sphere/grad_norm_base",
                                        "sphere/grad_norm_penalty"};
    while (st == SM_OK && p.updates < end) {
        double frac = 1.0 - (double)p.updates / (double)p.num_updates;
        double lr = c->anneal_lr ? frac * c->learning_rate : c->learning_rate;
        double ret_sum = 0;
        long ret_n = 0;
        if ((st = rollout(&p, err)) != SM_OK || (st = episodes_log(&p, &log, &ret_sum, &ret_n, tail_from, err)) != SM_OK) break;
        sm_ppo_gae(p.b_adv, p.b_ret, p.b_rew, p.b_val, p.next_value, p.b_done, p.b_boot, p.T, p.N, c->gamma, c->gae_lambda);
        sm_ppo_stats s = {0};
        double clipfrac = 0;
        /* the fault tests' aids: this update's loss is NaN on a rank, or a rank dies */
        const int fault_me = run->fault_rank < 0 || run->fault_rank == p.rank;
        p.poison = run->fault_nan_update > 0 && p.updates + 1 == run->fault_nan_update && fault_me;
        if (run->fault_kill_update > 0 && p.updates + 1 == run->fault_kill_update &&
            p.rank == (run->fault_rank >= 0 ? run->fault_rank : p.P - 1))
            raise(SIGKILL);
        if ((st = learn(&p, lr, &s, &clipfrac, err)) != SM_OK) {
            /* the NaN guard names the last good checkpoint */
            if (st == SM_ERR_NUMERIC && err) {
                char why[sizeof err->msg];
                snprintf(why, sizeof why, "%s", err->msg);
                if (saved_at >= 0) sm_fail(err, st, "%s; the last good checkpoint is %s (update %ld)", why, saved_path, saved_at);
                else sm_fail(err, st, "%s; no checkpoint was written", why);
            }
            break;
        }
        p.updates++;
        sm_baselines_end_update(p.base, c->anneal_lr ? frac : 1.0); /* C-CHAIN's coefficient for the next update */
        double vals[] = {lr, s.v_loss, s.pg_loss, s.entropy, s.old_approx_kl, s.approx_kl, clipfrac,
                         explained_variance(p.b_val, p.b_ret, p.Bt), sm_rl_log_sps(&log, p.global_step),
                         p.sph_n ? p.sph_pen / p.sph_n : 0, p.sph_n ? p.sph_coef / p.sph_n : 0,
                         p.sph_n ? p.sph_gb / p.sph_n : 0, p.sph_n ? p.sph_gp / p.sph_n : 0};
        /* the SPHERE means over this update's minibatches, when it is on */
        if ((st = sm_rl_log_record(&log, p.global_step, kKeys, vals, (int)SM_LEN(vals) - (p.sphere ? 0 : 4), err)) != SM_OK) break;
        const char *bk[SM_BASELINES_STATS + 1];
        double bv[SM_BASELINES_STATS + 1];
        int nb = sm_baselines_stats(p.base, bk, bv);
        /* the load-balancing baseline: the routers' weighted auxiliary losses, mean over the minibatches */
        if (sm_model_n_moe(p.actor)) bk[nb] = "losses/router_aux", bv[nb++] = p.gn_n ? p.aux_sum / p.gn_n : 0;
        p.aux_sum = 0;
        if (nb && (st = sm_rl_log_record(&log, p.global_step, bk, bv, nb, err)) != SM_OK) break;
        if (c->diag_every > 0 && p.updates % c->diag_every == 0 && p.rank == 0 && (st = diagnose(&p, &log, err)) != SM_OK) break;
        if (run->dist_check > 0 && p.updates % run->dist_check == 0 && (st = check_same(&p, err)) != SM_OK) break;
        p.sph_pen = p.sph_coef = p.sph_gb = p.sph_gp = 0, p.sph_n = 0;
        p.gn_sum = 0, p.gn_n = 0;
        char extra[96];
        snprintf(extra, sizeof extra, "update %ld/%ld  approx_kl %.4f", p.updates, p.num_updates, s.approx_kl);
        sm_rl_log_progress(&log, p.global_step, end * batch, ret_n ? ret_sum / ret_n : NAN, extra);
        /* Ctrl-C, or a run split into sessions (stop_after): checkpoint and return */
        int stop = run->stop && *run->stop ? 1 : run->stop_after > 0 && p.global_step >= run->stop_after ? 2 : 0;
        if (p.P > 1) { /* a signal may reach the ranks at different times: stop where any rank asks */
            double x = stop;
            if ((st = sm_dist_max(p.dist, &x, 1, err)) != SM_OK) break;
            stop = (int)x;
        }
        int due = c->checkpoint_every > 0 && p.updates % c->checkpoint_every == 0;
        if (ckpt[0] && (stop || due || p.updates == end) && (st = ppo_save(&p, ckpt, run, err)) == SM_OK)
            saved_at = p.updates, saved_path = ckpt;
        if (stop) {
            res->stopped = stop;
            break;
        }
    }
    if (st == SM_OK && c->diag_every > 0 && p.diag_n && run->out_dir) st = write_fig6(&p, run->out_dir, err);
    sm_status cs = sm_rl_log_close(&log, err);
    if (st == SM_OK) st = cs;
    res->frames = p.global_step;
    res->updates = p.updates;
    res->episodes = p.episodes;
    res->seconds = sm_time_now() - t0;
    res->last_return = p.tail_n ? p.tail_sum / (double)p.tail_n : NAN;
    ppo_free(&p);
    return st;
}

/* ---- the greedy policy of a checkpoint ------------------------------------------------------- */

typedef struct {
    sm_model *actor;
    rms obs;
    int norm_obs;
    float *x; /* (max_N, D) */
} greedy;

static void greedy_act(sm_policy *pol, const float *obs, int n, int *a_disc, float *a_box) {
    greedy *g = pol->impl;
    const int A = pol->env->act_n;
    obs_normalize(g->x, obs, n, &g->obs, g->norm_obs);
    const sm_real *z = sm_model_forward(g->actor, g->x, n, NULL, 0);
    for (int i = 0; i < n; i++) {
        const sm_real *r = z + (size_t)i * A;
        if (pol->env->act_kind == SM_SPACE_BOX) {
            for (int j = 0; j < A; j++) a_box[(size_t)i * A + j] = (float)r[j];
        } else {
            int best = 0;
            for (int j = 1; j < A; j++) best = r[j] > r[best] ? j : best;
            a_disc[i] = best;
        }
    }
}

static const float *greedy_inputs(sm_policy *pol, const float *obs, int n) {
    greedy *g = pol->impl;
    obs_normalize(g->x, obs, n, &g->obs, g->norm_obs);
    return g->x;
}

static void greedy_destroy(sm_policy *pol) {
    if (!pol) return;
    greedy *g = pol->impl;
    if (g) {
        sm_model_free(g->actor);
        free(g->obs.mean);
        free(g->x);
        free(g);
    }
    free(pol);
}

static sm_policy *ppo_load_policy(const char *path, int max_N, sm_error *err) {
    sm_safetensors st;
    if (sm_safetensors_load(&st, path, err) != SM_OK) return NULL;
    sm_policy *pol = calloc(1, sizeof *pol);
    greedy *g = calloc(1, sizeof *g);
    sm_status s = pol && g ? check_meta(&st, path, NULL, NULL, NULL, err) : sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    if (pol) pol->impl = g, pol->act = greedy_act, pol->destroy = greedy_destroy, pol->max_N = max_N;
    const char *env = sm_safetensors_meta(&st, "env"), *net = sm_safetensors_meta(&st, "network");
    const char *settings = sm_safetensors_meta(&st, "agent_settings");
    if (s == SM_OK && (!env || !(pol->env = sm_env_find(env))))
        s = sm_fail(err, SM_ERR_FORMAT, "%s: unknown env '%s' (one of: %s)", path, env ? env : "(none)", sm_env_names());
    sm_model_config mc;
    if (s == SM_OK && (!net || sm_model_config_from_json(&mc, net, err) != SM_OK))
        s = net ? SM_ERR_FORMAT : sm_fail(err, SM_ERR_FORMAT, "%s: no network in the metadata", path);
    if (s == SM_OK) {
        cJSON *o = settings ? cJSON_Parse(settings) : NULL;
        const cJSON *no = cJSON_GetObjectItemCaseSensitive(o, "norm_obs");
        g->norm_obs = cJSON_IsNumber(no) ? no->valueint : cJSON_IsTrue(no);
        cJSON_Delete(o);
        int D = sm_env_obs_numel(pol->env);
        g->obs.n = D;
        g->obs.mean = calloc((size_t)2 * D, sizeof(double));
        g->x = calloc((size_t)max_N * D, sizeof(float));
        if (!g->obs.mean || !g->x) s = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
        else g->obs.var = g->obs.mean + D;
    }
    if (s == SM_OK && (mc.in_dim != sm_env_obs_numel(pol->env) || mc.n_classes != pol->env->act_n))
        s = sm_fail(err, SM_ERR_MISMATCH, "%s: the network (%d inputs, %d outputs) does not fit env %s", path, mc.in_dim,
                    mc.n_classes, env);
    if (s == SM_OK) s = read_rms(&st, path, &g->obs, err);
    if (s == SM_OK && !(g->actor = sm_model_create(&mc, max_N, NULL, err))) s = SM_ERR_ARG;
    if (s == SM_OK) {
        sm_ckpt_set set = {"actor.", &g->actor->params, NULL};
        s = sm_checkpoint_read_sets(&st, path, &set, 1, NULL, err);
    }
    if (s == SM_OK) pol->net = g->actor, pol->inputs = greedy_inputs;
    sm_safetensors_free(&st);
    if (s != SM_OK) {
        greedy_destroy(pol);
        return NULL;
    }
    return pol;
}

const sm_agent_kind sm_agent_ppo = {
    .name = "ppo",
    .about = "PPO with clipped surrogate and GAE, categorical or Gaussian head (Schulman et al. 2017; CleanRL ppo.py, "
             "ppo_continuous_action.py)",
    .cfg_bytes = sizeof(sm_ppo_config),
    .opts = kOpts,
    .n_opts = (int)SM_LEN(kOpts),
    .presets = kPresets,
    .compatible = ppo_compatible,
    .env_defaults = ppo_env_defaults,
    .check = ppo_check,
    .train = ppo_train,
    .load_policy = ppo_load_policy,
};
