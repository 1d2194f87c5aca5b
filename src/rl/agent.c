/* The agent registry, presets and evaluation (include/specmoe/rl/agent.h). One line per agent
 * kind: the kind lives in src/rl/<agent>.c. */
#include "specmoe/rl/agent.h"

#include <stdlib.h>
#include <string.h>

#include "specmoe/io/safetensors.h"
#include "specmoe/rl/ppo.h"

extern const sm_agent_kind sm_agent_dqn, sm_agent_rainbow, sm_agent_der;

/* NULL-terminated */
static const sm_agent_kind *const kAgents[] = {
    &sm_agent_dqn,
    &sm_agent_rainbow,
    &sm_agent_der,
    &sm_agent_ppo,
    NULL,
};
static const int N_AGENTS = (int)SM_LEN(kAgents) - 1;

const sm_agent_kind *const *sm_agent_list(int *n) {
    *n = (int)N_AGENTS;
    return kAgents;
}

const sm_agent_kind *sm_agent_find(const char *name) {
    for (int i = 0; i < N_AGENTS; i++)
        if (name && strcmp(kAgents[i]->name, name) == 0) return kAgents[i];
    return NULL;
}

const char *sm_agent_names(void) {
    static char buf[256];
    if (buf[0]) return buf;
    size_t used = 0;
    for (int i = 0; i < N_AGENTS && used + 1 < sizeof buf; i++) {
        int k = snprintf(buf + used, sizeof buf - used, "%s%s", i ? ", " : "", kAgents[i]->name);
        if (k < 0) break;
        used += (size_t)k;
    }
    return buf;
}

const sm_agent_kind *sm_agent_of_checkpoint(const char *path, sm_error *err) {
    sm_safetensors st;
    if (sm_safetensors_open(&st, path, err) != SM_OK) return NULL;
    const char *name = sm_safetensors_meta(&st, "agent");
    const sm_agent_kind *k = name ? sm_agent_find(name) : NULL;
    if (!name) sm_fail(err, SM_ERR_FORMAT, "%s: not an RL checkpoint (no 'agent' in its metadata)", path);
    else if (!k) sm_fail(err, SM_ERR_FORMAT, "%s: written by agent '%s', which this build does not have (one of: %s)", path, name, sm_agent_names());
    sm_safetensors_free(&st);
    return k;
}

sm_status sm_agent_apply_preset(const sm_agent_kind *k, void *cfg, const char *preset, sm_error *err) {
    char names[256] = "";
    for (const char *const *p = k->presets; p && p[0]; p += 2) {
        if (strcmp(p[0], preset) != 0) {
            size_t u = strlen(names);
            snprintf(names + u, sizeof names - u, "%s%s", u ? ", " : "", p[0]);
            continue;
        }
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", p[1]);
        for (char *save = NULL, *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
            char *eq = strchr(kv, '=');
            int found = 0;
            if (eq) *eq = 0;
            for (int i = 0; eq && i < k->n_opts && !found; i++)
                if (!strcmp(k->opts[i].key, kv)) found = !sm_opt_set(&k->opts[i], cfg, eq + 1) ? 1 : -1;
            if (found != 1) return sm_fail(err, SM_ERR_ARG, "preset %s of agent %s: bad setting '%s' (a bug)", preset, k->name, kv);
        }
        return SM_OK;
    }
    return sm_fail(err, SM_ERR_ARG, "agent %s has no preset '%s' (%s%s)", k->name, preset, names[0] ? "presets: " : "it has none",
                   names);
}

sm_status sm_rl_evaluate(sm_policy *p, const char *env, const sm_env_opts *opts, int episodes, int N, uint64_t seed,
                         int threads, sm_env_log *log, sm_error *err) {
    memset(log, 0, sizeof *log);
    if (episodes < 1) return sm_fail(err, SM_ERR_ARG, "episodes must be >= 1 (got %d)", episodes);
    if (N < 1) N = 1;
    if (p && N > p->max_N) N = p->max_N;
    if (N > episodes) N = episodes;
    sm_vecenv v;
    sm_status st = sm_vecenv_init(&v, env, N, seed, opts, err);
    if (st != SM_OK) return st;
    /* another task of the same spaces is fine (a family's tasks differ only in reward: continual RL
     * scores the final policy on every task of its sequence) */
    const sm_env_spec *q = v.spec;
    if (p && p->env != q &&
        (p->env->obs_c != q->obs_c || p->env->obs_h != q->obs_h || p->env->obs_w != q->obs_w ||
         p->env->act_kind != q->act_kind || p->env->act_n != q->act_n)) {
        sm_vecenv_free(&v);
        return sm_fail(err, SM_ERR_MISMATCH, "the policy was trained on %s, whose spaces differ from %s's", p->env->name, env);
    }
    sm_vecenv_set_threads(&v, threads);
    const sm_env_spec *s = v.spec;
    const int D = sm_env_obs_numel(s), A = s->act_n;
    float *obs = malloc(sizeof(float) * (size_t)N * D), *box = malloc(sizeof(float) * (size_t)N * A),
          *rew = malloc(sizeof(float) * (size_t)N);
    int *act = malloc(sizeof(int) * (size_t)N);
    long *left = malloc(sizeof(long) * (size_t)N);
    unsigned char *term = malloc((size_t)N), *trunc = malloc((size_t)N);
    if (!obs || !box || !rew || !act || !left || !term || !trunc) {
        st = sm_fail(err, SM_ERR_NOMEM, "evaluation of %s: out of memory", env);
    } else {
        sm_vecenv_bind(&v, obs, act, box, rew, term, trunc, NULL);
        sm_vecenv_reset(&v);
        sm_rng rng;
        sm_rng_seed(&rng, seed);
        /* fixed quotas of episodes per environment: counting the first episodes to finish would
         * favour short ones, and the result would depend on the order in which environments end */
        for (int i = 0; i < N; i++) left[i] = episodes / N + (i < episodes % N);
        for (long remaining = episodes; remaining > 0;) {
            if (p) {
                p->act(p, obs, N, act, box);
                if (p->observe) p->observe(p->observe_ctx, p, N);
            } else sm_env_random_actions(s, &rng, N, act, box);
            sm_vecenv_step(&v);
            for (int i = 0; i < N; i++) {
                if (!(term[i] || trunc[i])) continue;
                sm_env_log one = v.logs[i];
                memset(&v.logs[i], 0, sizeof v.logs[i]);
                if (left[i] <= 0) continue;
                left[i]--;
                remaining--;
                log->episode_return += one.episode_return;
                log->return_sq += one.return_sq;
                log->episode_length += one.episode_length;
                log->score += one.score;
                log->success += one.success;
                log->n += one.n;
            }
        }
    }
    free(obs);
    free(box);
    free(rew);
    free(act);
    free(left);
    free(term);
    free(trunc);
    sm_vecenv_free(&v);
    return st;
}
