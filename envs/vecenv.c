/* The vector of environments (include/specmoe/rl/env.h): one allocation per role at init, then
 * reset/step over caller-owned buffers with auto-reset, the time limit and the episode log. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/rl/env.h"

uint64_t sm_env_seed(uint64_t seed, int i) {
    /* splitmix64 over seed and index: nearby seeds and indices give unrelated streams */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

const sm_env_spec *sm_env_find(const char *name) {
    int n;
    const sm_env_spec *const *all = sm_env_list(&n);
    for (int i = 0; i < n; i++)
        if (name && strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}

const char *sm_env_names(void) {
    static char buf[2048];
    if (buf[0]) return buf;
    int n;
    const sm_env_spec *const *all = sm_env_list(&n);
    size_t used = 0;
    for (int i = 0; i < n && used + 1 < sizeof buf; i++) {
        int k = snprintf(buf + used, sizeof buf - used, "%s%s", i ? ", " : "", all[i]->name);
        if (k < 0) break;
        used += (size_t)k;
    }
    return buf;
}

void sm_env_random_actions(const sm_env_spec *s, sm_rng *rng, int n, int *act_disc, float *act_box) {
    for (int i = 0; i < n; i++) {
        if (s->act_kind == SM_SPACE_DISCRETE) act_disc[i] = (int)sm_rng_below(rng, (uint32_t)s->act_n);
        else
            for (int j = 0; j < s->act_n; j++)
                act_box[(size_t)i * s->act_n + j] = s->act_low[j] + (float)sm_rng_uniform(rng) * (s->act_high[j] - s->act_low[j]);
    }
}

static void *env_state(const sm_vecenv *v, int i) { return v->states + (size_t)i * v->spec->state_bytes; }

sm_status sm_vecenv_init(sm_vecenv *v, const char *name, int num_envs, uint64_t seed, const sm_env_opts *opts,
                         sm_error *err) {
    return sm_vecenv_init_at(v, name, num_envs, seed, 0, opts, err);
}

sm_status sm_vecenv_init_at(sm_vecenv *v, const char *name, int num_envs, uint64_t seed, int first,
                            const sm_env_opts *opts, sm_error *err) {
    memset(v, 0, sizeof *v);
    const sm_env_spec *s = sm_env_find(name);
    if (!s) return sm_fail(err, SM_ERR_ARG, "unknown environment '%s' (one of: %s)", name ? name : "", sm_env_names());
    if (num_envs < 1) return sm_fail(err, SM_ERR_ARG, "number of environments must be >= 1 (got %d)", num_envs);
    if (s->prepare) {
        sm_status st = s->prepare(err);
        if (st != SM_OK) return st;
    }
    v->spec = s;
    v->opts = opts ? *opts : sm_env_opts_default();
    if (v->opts.sticky > 1.0) return sm_fail(err, SM_ERR_ARG, "sticky-action probability must be in [0, 1] (got %g)", v->opts.sticky);
    v->num_envs = num_envs;
    v->threads = 1;
    v->max_steps = v->opts.max_steps >= 0 ? v->opts.max_steps : s->max_steps;
    v->states = calloc((size_t)num_envs, s->state_bytes ? s->state_bytes : 1);
    v->ep_return = calloc((size_t)num_envs, sizeof *v->ep_return);
    v->ep_length = calloc((size_t)num_envs, sizeof *v->ep_length);
    v->logs = calloc((size_t)num_envs, sizeof *v->logs);
    if (!v->states || !v->ep_return || !v->ep_length || !v->logs) {
        sm_vecenv_free(v);
        return sm_fail(err, SM_ERR_NOMEM, "out of memory for %d environments '%s'", num_envs, name);
    }
    for (int i = 0; i < num_envs; i++) s->init(env_state(v, i), sm_env_seed(seed, first + i), &v->opts);
    return SM_OK;
}

void sm_vecenv_bind(sm_vecenv *v, float *obs, int *act_disc, float *act_box, float *rewards,
                    unsigned char *terminals, unsigned char *truncations, float *final_obs) {
    v->obs = obs;
    v->act_disc = act_disc;
    v->act_box = act_box;
    v->rewards = rewards;
    v->terminals = terminals;
    v->truncations = truncations;
    v->final_obs = final_obs;
}

void sm_vecenv_set_threads(sm_vecenv *v, int threads) { v->threads = threads < 1 ? 1 : threads; }

void sm_vecenv_reset(sm_vecenv *v) {
    const int D = sm_env_obs_numel(v->spec);
#pragma omp parallel for num_threads(v->threads) if (v->threads > 1) schedule(static)
    for (int i = 0; i < v->num_envs; i++) {
        v->spec->reset(env_state(v, i), v->obs + (size_t)i * D);
        v->ep_return[i] = 0;
        v->ep_length[i] = 0;
        if (v->rewards) v->rewards[i] = 0;
        if (v->terminals) v->terminals[i] = 0;
        if (v->truncations) v->truncations[i] = 0;
    }
}

/* What follows environment i's step with reward r and terminal flag term: the rewards and flags,
 * the running episode, the time limit, and at an episode's end its log entry and the auto-reset.
 * s, st (i's state), obs (i's observation) and D (its size) come from the caller, which has them in
 * registers: reloading them after the step's indirect call cost CartPole about 8%. */
static inline __attribute__((always_inline)) void step_done(sm_vecenv *v, const sm_env_spec *s, int i, void *st,
                                                            float *obs, int D, float r, unsigned char term) {
    v->rewards[i] = r;
    v->ep_return[i] += r;
    v->ep_length[i]++;
    unsigned char trunc = !term && v->max_steps > 0 && v->ep_length[i] >= v->max_steps;
    v->terminals[i] = term;
    if (v->truncations) v->truncations[i] = trunc;
    if (term || trunc) {
        float score = (float)v->ep_return[i], success = 0;
        if (s->episode_end) s->episode_end(st, &score, &success);
        sm_env_log *l = &v->logs[i];
        l->episode_return += v->ep_return[i];
        l->return_sq += v->ep_return[i] * v->ep_return[i];
        l->episode_length += v->ep_length[i];
        l->score += score;
        l->success += success;
        l->n++;
        if (v->final_obs) memcpy(v->final_obs + (size_t)i * D, obs, (size_t)D * sizeof *obs);
        s->reset(st, obs);
        v->ep_return[i] = 0;
        v->ep_length[i] = 0;
    }
}

/* environments per step_batch call: blocks of consecutive environments, the unit the threads share
 * (small enough that the block's states, observations and flags stay in L1 between the batched step
 * and step_done) */
#define STEP_BLOCK 32

/* environments [i0, i1) with the spec's batched step (blocks [b0, b1) of STEP_BLOCK) or one at a time:
 * which thread takes which block or environment does not matter, as step_batch equals per-environment
 * steps and each environment is its own */
static void step_blocks(void *arg, long b0, long b1) {
    sm_vecenv *v = arg;
    const sm_env_spec *s = v->spec;
    const int D = sm_env_obs_numel(s), A = s->act_n;
    for (long b = b0; b < b1; b++) {
        const int i0 = (int)b * STEP_BLOCK, n = v->num_envs - i0 < STEP_BLOCK ? v->num_envs - i0 : STEP_BLOCK;
        s->step_batch(env_state(v, i0), n, s->act_kind == SM_SPACE_DISCRETE ? v->act_disc + i0 : NULL,
                      s->act_kind == SM_SPACE_BOX ? v->act_box + (size_t)i0 * A : NULL, v->obs + (size_t)i0 * D,
                      v->rewards + i0, v->terminals + i0);
        for (int i = i0; i < i0 + n; i++)
            step_done(v, s, i, env_state(v, i), v->obs + (size_t)i * D, D, v->rewards[i], v->terminals[i]);
    }
}

static void step_envs(void *arg, long i0, long i1) {
    sm_vecenv *v = arg;
    const sm_env_spec *s = v->spec;
    const int D = sm_env_obs_numel(s), A = s->act_n;
    for (int i = (int)i0; i < (int)i1; i++) {
        void *st = env_state(v, i);
        float *obs = v->obs + (size_t)i * D;
        unsigned char term = 0;
        float r = 0;
        s->step(st, s->act_kind == SM_SPACE_DISCRETE ? v->act_disc + i : NULL,
                s->act_kind == SM_SPACE_BOX ? v->act_box + (size_t)i * A : NULL, obs, &r, &term);
        step_done(v, s, i, st, obs, D, r, term);
    }
}

/* over v->threads threads; with one, no OpenMP region at all (sm_par_for: a one-thread region still
 * costs about 1.3 us, a fifth of a MinAtar step's whole cost at one environment) */
void sm_vecenv_step(sm_vecenv *v) {
    const int threads = v->threads > 1 ? v->threads : 1;
    if (v->spec->step_batch) sm_par_for(threads, (v->num_envs + STEP_BLOCK - 1) / STEP_BLOCK, step_blocks, v);
    else sm_par_for(threads, v->num_envs, step_envs, v);
}

/* every state of a vector has the same saved size (one model per family) */
static size_t one_state(const sm_vecenv *v) {
    return v->spec->save ? v->spec->save_size(v->spec, v->states) : v->spec->state_bytes;
}

size_t sm_vecenv_state_size(const sm_vecenv *v) {
    const size_t N = (size_t)v->num_envs;
    return N * (one_state(v) + sizeof *v->ep_return + sizeof *v->ep_length + sizeof *v->logs);
}

void sm_vecenv_save(const sm_vecenv *v, void *buf) {
    unsigned char *p = buf;
    const size_t N = (size_t)v->num_envs, one = one_state(v);
    for (int i = 0; i < v->num_envs; i++, p += one) {
        if (v->spec->save) v->spec->save(v->spec, env_state(v, i), p);
        else memcpy(p, env_state(v, i), one);
    }
    memcpy(p, v->ep_return, N * sizeof *v->ep_return);
    p += N * sizeof *v->ep_return;
    memcpy(p, v->ep_length, N * sizeof *v->ep_length);
    p += N * sizeof *v->ep_length;
    memcpy(p, v->logs, N * sizeof *v->logs);
}

void sm_vecenv_load(sm_vecenv *v, const void *buf) {
    const unsigned char *p = buf;
    const size_t N = (size_t)v->num_envs, one = one_state(v);
    for (int i = 0; i < v->num_envs; i++, p += one) {
        if (v->spec->load) v->spec->load(v->spec, env_state(v, i), p);
        else memcpy(env_state(v, i), p, one);
    }
    memcpy(v->ep_return, p, N * sizeof *v->ep_return);
    p += N * sizeof *v->ep_return;
    memcpy(v->ep_length, p, N * sizeof *v->ep_length);
    p += N * sizeof *v->ep_length;
    memcpy(v->logs, p, N * sizeof *v->logs);
}

sm_env_log sm_vecenv_log_take(sm_vecenv *v) {
    sm_env_log t = {0};
    for (int i = 0; i < v->num_envs; i++) {
        sm_env_log *l = &v->logs[i];
        t.episode_return += l->episode_return;
        t.return_sq += l->return_sq;
        t.episode_length += l->episode_length;
        t.score += l->score;
        t.success += l->success;
        t.n += l->n;
        memset(l, 0, sizeof *l);
    }
    return t;
}

void sm_vecenv_free(sm_vecenv *v) {
    if (v->spec && v->spec->close && v->states)
        for (int i = 0; i < v->num_envs; i++) v->spec->close(env_state(v, i));
    free(v->states);
    free(v->ep_return);
    free(v->ep_length);
    free(v->logs);
    memset(v, 0, sizeof *v);
}
