/* specmoe rl SUBCOMMAND: reinforcement learning (issue 13). The subcommands are rows of kRl below,
 * dispatched at argv[2] like the benchmarks of `specmoe bench` (cli_dispatch), so `specmoe rl --help`
 * and the unknown-subcommand message come from the table.
 *
 *   rl envs                         every environment with its spaces and time limit
 *   rl eval --env NAME --policy random --episodes N --seed S [--threads T]
 *                                   mean and spread of a uniform random policy's episodic return
 *
 * Still to come (issue 13), each a row of kRl and a function here or in its own cli/cmd_rl_*.c:
 * `rl train` (agents of src/rl/), `rl eval CKPT` (the checkpoint branch of rl_eval, which now
 * refuses), `rl render CKPT --out episode.gif` (the environments' `render`). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/methods/softmoe_rl/reset.h"
#include "specmoe/nn/metrics.h"
#include "specmoe/nn/model.h"
#include "specmoe/rl/agent.h"

/* ---------------------------------------------------------------------------------------------- */
/* rl envs */

/* "4" for a vector observation, "4x10x10 binary" (c x h x w) for an image */
static void obs_shape(const sm_env_spec *s, char *buf, size_t n) {
    if (s->obs_h == 1 && s->obs_w == 1) snprintf(buf, n, "%d", s->obs_c);
    else snprintf(buf, n, "%dx%dx%d%s", s->obs_c, s->obs_h, s->obs_w, s->obs_binary ? " binary" : "");
}

/* "discrete 2", or "box 1 in [-2, 2]" (one interval per dimension, or one for all when they agree) */
static void act_space(const sm_env_spec *s, char *buf, size_t n) {
    if (s->act_kind == SM_SPACE_DISCRETE) {
        snprintf(buf, n, "discrete %d", s->act_n);
        return;
    }
    int same = 1;
    for (int j = 1; j < s->act_n; j++) same &= s->act_low[j] == s->act_low[0] && s->act_high[j] == s->act_high[0];
    size_t used = (size_t)snprintf(buf, n, "box %d in ", s->act_n);
    for (int j = 0; j < (same ? 1 : s->act_n) && used < n; j++)
        used += (size_t)snprintf(buf + used, n - used, "%s[%g, %g]", j ? " x " : "", s->act_low[j], s->act_high[j]);
}

static int rl_envs(int argc, char **argv) {
    int npos;
    const char *pos[1];
    int rc = fl_parse(NULL, 0, argc, argv, 3, "rl envs", "", pos, 0, &npos); /* no flags but --help */
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    int n;
    const sm_env_spec *const *all = sm_env_list(&n);
    printf("%-22s %-16s %-22s %-10s %s\n", "environment", "observation", "actions", "time limit", "about");
    for (int i = 0; i < n; i++) {
        char obs[64], act[256], limit[16];
        obs_shape(all[i], obs, sizeof obs);
        act_space(all[i], act, sizeof act);
        if (all[i]->max_steps > 0) snprintf(limit, sizeof limit, "%d", all[i]->max_steps);
        else snprintf(limit, sizeof limit, "none");
        printf("%-22s %-16s %-22s %-10s %s\n", all[i]->name, obs, act, limit, all[i]->about);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* rl eval */

typedef struct {
    const char *env, *policy;
    long episodes;
    uint64_t seed;
    int threads, prune, routing;
} eval_settings;

/* rl eval --routing: the sharpness of every soft-routed MoE layer over the states the evaluation
 * acts on (sm_route_soft_sharpness after each act), one accumulator per MoE layer */
typedef struct {
    double comb, disp;
    long nc, nd;
} routing_acc;

typedef struct {
    routing_acc *layer; /* (n) */
    int n;
} routing_obs;

static void routing_observe(void *ctx, sm_policy *p, int N) {
    (void)N;
    routing_obs *o = ctx;
    for (int i = 0; i < o->n; i++) {
        routing_acc *a = &o->layer[i];
        sm_route_soft_sharpness(&sm_model_moe(p->net, i)->route, &a->comb, &a->nc, &a->disp, &a->nd);
    }
}

/* "n/a" where nothing was measured: one slot (S = 1) has no combine entropy, one-token groups no
 * dispatch entropy */
static void print_routing(const routing_obs *o) {
    for (int i = 0; i < o->n; i++) {
        const routing_acc *a = &o->layer[i];
        if (!a->nc && !a->nd) {
            printf("rl-eval-routing moe=%d soft=0\n", i);
            continue;
        }
        char c[32] = "n/a", d[32] = "n/a";
        if (a->nc) snprintf(c, sizeof c, "%.4f", a->comb / (double)a->nc);
        if (a->nd) snprintf(d, sizeof d, "%.4f", a->disp / (double)a->nd);
        printf("rl-eval-routing moe=%d soft=1 combine_entropy=%s dispatch_entropy=%s tokens=%ld slots=%ld "
               "(entropy / log of the support: 1 uniform, 0 one-hot)\n",
               i, c, d, a->nc, a->nd);
    }
}

/* Episodes are shared out in fixed quotas over this many environments (sm_rl_evaluate), so which
 * episodes count does not depend on which environment finishes first. */
#define EVAL_MAX_ENVS 16

/* The result line of rl eval, for the random policy and a checkpoint alike. */
static void print_eval(const char *env, const char *policy, const char *agent, const sm_env_log *log, uint64_t seed) {
    const double n = (double)log->n, mean = log->episode_return / n;
    const double sd = sqrt(fmax(log->return_sq / n - mean * mean, 0.0)); /* over episodes (numpy's np.std) */
    printf("rl-eval env=%s policy=%s%s%s episodes=%ld seed=%llu episodic_return_mean=%.4f episodic_return_std=%.4f "
           "episodic_length_mean=%.2f\n",
           env, policy, agent ? " agent=" : "", agent ? agent : "", log->n, (unsigned long long)seed, mean, sd,
           log->episode_length / n);
}

/* rl eval CKPT: the greedy policy of a checkpoint written by any agent. */
static int eval_checkpoint(const eval_settings *o, const char *path) {
    sm_error err = {0};
    const sm_agent_kind *k = sm_agent_of_checkpoint(path, &err);
    if (!k) return cli_fail(SM_ERR_FORMAT, &err);
    cli_set_threads(o->threads);
    sm_policy *p = k->load_policy(path, EVAL_MAX_ENVS, &err);
    if (!p) return cli_fail(err.code ? err.code : SM_ERR_FORMAT, &err);
    if (o->prune > 0) { /* SoftMoE-in-RL Fig. 19 at evaluation: the last experts of each MoE layer dropped */
        sm_status ps = p->net ? sm_model_prune_last(p->net, o->prune, &err)
                              : sm_fail(&err, SM_ERR_ARG, "prune: the %s agent's policy has no prunable network", k->name);
        if (ps != SM_OK) {
            p->destroy(p);
            fprintf(stderr, "specmoe rl eval: %s: %s\n", path, err.msg);
            return CLI_EXIT_USAGE;
        }
    }
    routing_obs obs = {NULL, o->routing && p->net ? sm_model_n_moe(p->net) : 0};
    if (o->routing && (!obs.n || o->prune > 0)) {
        p->destroy(p);
        /* pruned experts' slots take no combine weight, so the entropies over all S slots would
         * read a uniform route as sharp: measured on unpruned layers only */
        fprintf(stderr, "specmoe rl eval: %s: --routing: %s\n", path,
                obs.n ? "not with --prune-experts (the entropies are over every slot)" : "the policy's network has no MoE layer");
        return CLI_EXIT_USAGE;
    }
    if (obs.n) {
        if (!(obs.layer = calloc((size_t)obs.n, sizeof *obs.layer))) {
            p->destroy(p);
            return cli_fail(sm_fail(&err, SM_ERR_NOMEM, "rl eval: out of memory"), &err);
        }
        p->observe = routing_observe;
        p->observe_ctx = &obs;
    }
    const char *env = o->env ? o->env : p->env->name;
    sm_env_log log;
    sm_status st = sm_rl_evaluate(p, env, NULL, (int)o->episodes, EVAL_MAX_ENVS, o->seed, o->threads, &log, &err);
    p->destroy(p);
    if (st == SM_OK) {
        print_eval(env, path, k->name, &log, o->seed);
        print_routing(&obs);
    }
    free(obs.layer);
    return st == SM_OK ? 0 : cli_fail(st, &err);
}

static int rl_eval(int argc, char **argv) {
    eval_settings o;
    fl_flag fl[] = {
        {"env", FL_STRING, &o.env, NULL, "environment (specmoe rl envs lists them)", 0},
        {"policy", FL_STRING, &o.policy, NULL, "random: a uniform random policy (the reference point of normalised scores)", 0},
        {"episodes", FL_LONG, &o.episodes, "100", "episodes to average over", 0},
        {"seed", FL_U64, &o.seed, "1", "seed of the environments and of the policy", 0},
        {"threads", FL_INT, &o.threads, "1", "OpenMP threads stepping the environments (the result does not depend on it)", 0},
        {"prune-experts", FL_INT, &o.prune, "0", "a checkpoint's policy with the last N experts of each MoE layer pruned (soft router)", 0},
        {"routing", FL_BOOL, &o.routing, "0",
         "also print each soft-routed MoE layer's routing sharpness over every state the evaluation acts on: mean "
         "combine and dispatch entropy / log of their support (1 uniform; not with --prune-experts)", 0},
    };
    const int nfl = (int)(sizeof fl / sizeof fl[0]);
    const char *pos[1];
    int npos;
    int rc = fl_parse(fl, nfl, argc, argv, 3, "rl eval", "[CHECKPOINT] --env NAME --policy random [flags]", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos == 1) {
        if (o.policy) {
            fprintf(stderr, "specmoe rl eval: give a checkpoint or --policy random, not both\n");
            return CLI_EXIT_USAGE;
        }
        if (o.episodes < 1 || o.episodes > 1000000000 || o.threads < 1 || o.prune < 0) {
            fprintf(stderr, "specmoe rl eval: --episodes must be in [1, 1e9], --threads >= 1 and --prune-experts >= 0\n");
            return CLI_EXIT_USAGE;
        }
        return eval_checkpoint(&o, pos[0]);
    }
    if (o.routing && o.policy) {
        fprintf(stderr, "specmoe rl eval: --routing reads a checkpoint's MoE layers; the random policy has none\n");
        return CLI_EXIT_USAGE;
    }
    if (!o.policy || strcmp(o.policy, "random") != 0) {
        if (o.policy) fprintf(stderr, "specmoe rl eval: unknown policy '%s' (one of: random)\n", o.policy);
        else fprintf(stderr, "specmoe rl eval: give --policy random (see specmoe rl eval --help)\n");
        return CLI_EXIT_USAGE;
    }
    if (!o.env) {
        fprintf(stderr, "specmoe rl eval: --env is required (one of: %s)\n", sm_env_names());
        return CLI_EXIT_USAGE;
    }
    if (o.episodes < 1 || o.episodes > 1000000000 || o.threads < 1) {
        fprintf(stderr, "specmoe rl eval: --episodes must be in [1, 1e9] and --threads >= 1\n");
        return CLI_EXIT_USAGE;
    }
    sm_env_log log;
    sm_error err = {0};
    sm_status st = sm_rl_evaluate(NULL, o.env, NULL, (int)o.episodes, EVAL_MAX_ENVS, o.seed, o.threads, &log, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    print_eval(o.env, o.policy, NULL, &log, o.seed);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */

static const cli_command kRl[] = {
    {"envs", "list every environment: observation shape, action space, time limit", rl_envs},
    {"train", "--env NAME --agent NAME: train an agent (rl train --help lists agents, options and presets)", cmd_rl_train},
    {"eval", "CHECKPOINT | --env NAME --policy random: mean and std of the episodic return and mean length", rl_eval},
    {"render", "CHECKPOINT --out episode.gif: an animated picture of one episode of the trained policy", cmd_rl_render},
};

int cmd_rl(int argc, char **argv) {
    const cli_table t = {"specmoe rl", "subcommand", NULL, kRl, (int)(sizeof kRl / sizeof kRl[0])};
    return cli_dispatch(&t, argc, argv, 2);
}
