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
#include "specmoe/rl/env.h"

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
    int threads;
} eval_settings;

typedef struct {
    double return_mean, return_std, length_mean;
    long episodes;
} eval_result;

/* The vector's size: episodes are shared out in fixed quotas, so which episodes count does not
 * depend on which environment finishes first (taking the first N to end favours short ones). */
#define EVAL_MAX_ENVS 16

/* A uniform random policy for o->episodes episodes. The actions are drawn in one stream on the
 * calling thread, and each environment has its own seed, so the result does not depend on --threads. */
static sm_status eval_random(const eval_settings *o, eval_result *R, sm_error *err) {
    const int E = o->episodes < EVAL_MAX_ENVS ? (int)o->episodes : EVAL_MAX_ENVS;
    sm_vecenv v;
    sm_status st = sm_vecenv_init(&v, o->env, E, o->seed, NULL, err);
    if (st != SM_OK) return st;
    sm_vecenv_set_threads(&v, o->threads);
    const sm_env_spec *s = v.spec;
    const int D = sm_env_obs_numel(s);
    float *obs = malloc(sizeof(float) * (size_t)E * D), *box = malloc(sizeof(float) * (size_t)E * s->act_n);
    float *rew = malloc(sizeof(float) * E);
    int *act = malloc(sizeof(int) * E);
    unsigned char *term = malloc(E), *trunc = malloc(E);
    double *ret = calloc((size_t)E, sizeof(double));
    long *len = calloc((size_t)E, sizeof(long)), *left = malloc(sizeof(long) * E);
    if (!obs || !box || !rew || !act || !term || !trunc || !ret || !len || !left) {
        st = sm_fail(err, SM_ERR_NOMEM, "out of memory for %d environments '%s'", E, o->env);
    } else {
        sm_vecenv_bind(&v, obs, act, box, rew, term, trunc, NULL);
        sm_vecenv_reset(&v);
        sm_rng g;
        sm_rng_seed(&g, o->seed);
        for (int i = 0; i < E; i++) left[i] = o->episodes / E + (i < o->episodes % E);
        double sum = 0, sum_sq = 0, sum_len = 0;
        for (long remaining = o->episodes; remaining > 0;) {
            sm_env_random_actions(s, &g, E, act, box);
            sm_vecenv_step(&v);
            for (int i = 0; i < E; i++) {
                ret[i] += rew[i];
                len[i]++;
                if (!term[i] && !trunc[i]) continue;
                if (left[i] > 0) {
                    sum += ret[i];
                    sum_sq += ret[i] * ret[i];
                    sum_len += (double)len[i];
                    left[i]--;
                    remaining--;
                }
                ret[i] = 0;
                len[i] = 0;
            }
        }
        const double n = (double)o->episodes, mean = sum / n;
        R->episodes = o->episodes;
        R->return_mean = mean;
        R->return_std = sqrt(fmax(sum_sq / n - mean * mean, 0.0)); /* over episodes (numpy's np.std) */
        R->length_mean = sum_len / n;
    }
    free(obs);
    free(box);
    free(rew);
    free(act);
    free(term);
    free(trunc);
    free(ret);
    free(len);
    free(left);
    sm_vecenv_free(&v);
    return st;
}

static int rl_eval(int argc, char **argv) {
    eval_settings o;
    fl_flag fl[] = {
        {"env", FL_STRING, &o.env, NULL, "environment (specmoe rl envs lists them)", 0},
        {"policy", FL_STRING, &o.policy, NULL, "random: a uniform random policy (the reference point of normalised scores)", 0},
        {"episodes", FL_LONG, &o.episodes, "100", "episodes to average over", 0},
        {"seed", FL_U64, &o.seed, "1", "seed of the environments and of the policy", 0},
        {"threads", FL_INT, &o.threads, "1", "OpenMP threads stepping the environments (the result does not depend on it)", 0},
    };
    const int nfl = (int)(sizeof fl / sizeof fl[0]);
    const char *pos[1];
    int npos;
    int rc = fl_parse(fl, nfl, argc, argv, 3, "rl eval", "[CHECKPOINT] --env NAME --policy random [flags]", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos == 1) {
        /* the place for `rl eval CKPT`: load the agent, run its greedy policy, print the same line */
        fprintf(stderr, "specmoe rl eval: %s: evaluating a checkpoint is not built yet (it comes with rl train); "
                        "--policy random is\n", pos[0]);
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
    if (o.episodes < 1 || o.threads < 1) {
        fprintf(stderr, "specmoe rl eval: --episodes and --threads must be >= 1\n");
        return CLI_EXIT_USAGE;
    }
    eval_result R = {0};
    sm_error err = {0};
    sm_status st = eval_random(&o, &R, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    printf("rl-eval env=%s policy=%s episodes=%ld seed=%llu episodic_return_mean=%.4f episodic_return_std=%.4f "
           "episodic_length_mean=%.2f\n",
           o.env, o.policy, R.episodes, (unsigned long long)o.seed, R.return_mean, R.return_std, R.length_mean);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */

static const cli_command kRl[] = {
    {"envs", "list every environment: observation shape, action space, time limit", rl_envs},
    {"eval", "--env NAME --policy random: mean and std of the episodic return and mean length", rl_eval},
    /* rl train, rl render: rows to add here (see the top of this file) */
};

int cmd_rl(int argc, char **argv) {
    const cli_table t = {"specmoe rl", "subcommand", NULL, kRl, (int)(sizeof kRl / sizeof kRl[0])};
    return cli_dispatch(&t, argc, argv, 2);
}
