/* specmoe bench env: environment steps per second (PufferLib's ocean benchmark): a vector of
 * environments stepped with random actions and auto-reset, for each registered environment or the
 * one --env names. One machine-readable line per environment:
 *
 *   bench-env env=NAME threads=T steps_per_s=X steps_per_cpu_s=Y
 *
 * X is over wall time. Y is over the CPU time the process used (all its threads): on a shared machine
 * where other processes hold the cores, X falls with the load while Y stays the rate of one busy
 * core, which is what the "steps/s per core" asks (with --threads 1 the two agree on an idle
 * machine).
 *
 * What is timed is sm_vecenv_step alone. The random actions come from a table drawn before the
 * clock starts (ACTION_ROWS rows of one action per environment; step t binds row t mod ACTION_ROWS),
 * so no random number is drawn in the timed loop. A row holds the actions of all the vector's
 * environments, so each environment still sees a varied sequence; its period of ACTION_ROWS steps
 * is longer than most episodes of a random policy.
 *
 * Parse (flags -> env_bench_settings), run (one environment -> env_bench_result) and report (the
 * line) are separate; each line is printed as soon as its environment is measured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"
#include "specmoe/rl/env.h"

#define ACTION_ROWS 256

typedef struct {
    const char *env; /* NULL: every environment */
    int threads, envs;
    long steps;
    uint64_t seed;
} env_bench_settings;

typedef struct {
    const char *name;
    int threads;
    long steps;     /* environment steps timed (a multiple of the vector's size) */
    double seconds;     /* their wall time */
    double cpu_seconds; /* the CPU time of the process (every thread) meanwhile */
} env_bench_result;

/* ---------------------------------------------------------------------------------------------- */
/* parse */

static int parse(env_bench_settings *o, int argc, char **argv) {
    fl_flag fl[] = {
        {"env", FL_STRING, &o->env, NULL, "one environment (default: every one; specmoe rl envs lists them)", 0},
        {"threads", FL_INT, &o->threads, "1", "OpenMP threads stepping the vector", 0},
        {"steps", FL_LONG, &o->steps, "20000000", "environment steps timed per environment", 0},
        {"envs", FL_INT, &o->envs, "256", "environments in the vector", 0},
        {"seed", FL_U64, &o->seed, "1", "seed of the environments and of the action table", 0},
    };
    const char *pos[1];
    int npos;
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 3, "bench env", "[flags]", pos, 0, &npos);
    if (rc) return rc;
    if (o->threads < 1 || o->envs < 1 || o->steps < 1) {
        fprintf(stderr, "specmoe bench env: --threads, --envs and --steps must be >= 1\n");
        return 2;
    }
    if (o->envs > 65536) { /* the action table holds ACTION_ROWS actions per environment */
        fprintf(stderr, "specmoe bench env: --envs must be <= 65536 (got %d)\n", o->envs);
        return 2;
    }
    if (o->env && !sm_env_find(o->env)) {
        fprintf(stderr, "specmoe bench env: unknown environment '%s' (one of: %s)\n", o->env, sm_env_names());
        return 2;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* run */

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static sm_status run(const env_bench_settings *o, const sm_env_spec *s, env_bench_result *r, sm_error *err) {
    const int N = o->envs, D = sm_env_obs_numel(s), A = s->act_kind == SM_SPACE_BOX ? s->act_n : 1;
    sm_vecenv v;
    sm_status st = sm_vecenv_init(&v, s->name, N, o->seed, NULL, err);
    if (st != SM_OK) return st;
    sm_vecenv_set_threads(&v, o->threads);
    const size_t rows = (size_t)ACTION_ROWS * N;
    float *obs = malloc(sizeof(float) * (size_t)N * D), *rew = malloc(sizeof(float) * N);
    unsigned char *term = malloc(N), *trunc = malloc(N);
    int *act = s->act_kind == SM_SPACE_DISCRETE ? malloc(sizeof(int) * rows) : NULL;
    float *box = s->act_kind == SM_SPACE_BOX ? malloc(sizeof(float) * rows * A) : NULL;
    if (!obs || !rew || !term || !trunc || (!act && !box)) {
        st = sm_fail(err, SM_ERR_NOMEM, "out of memory for %d environments '%s'", N, s->name);
    } else {
        sm_rng g;
        sm_rng_seed(&g, o->seed);
        sm_env_random_actions(s, &g, (int)rows, act, box);
        sm_vecenv_bind(&v, obs, act, box, rew, term, trunc, NULL);
        sm_vecenv_reset(&v);
        const long iters = (o->steps + N - 1) / N;
        for (long t = -ACTION_ROWS; t < iters; t++) { /* one untimed pass over the table warms up */
            if (t == 0) {
                r->seconds = sm_time_now();
                r->cpu_seconds = cpu_now();
            }
            const size_t row = (size_t)(t + ACTION_ROWS) % ACTION_ROWS * N;
            sm_vecenv_bind(&v, obs, act ? act + row : NULL, box ? box + row * A : NULL, rew, term, trunc, NULL);
            sm_vecenv_step(&v);
        }
        r->seconds = sm_time_now() - r->seconds;
        r->cpu_seconds = cpu_now() - r->cpu_seconds;
        r->name = s->name;
        r->threads = o->threads;
        r->steps = iters * N;
    }
    free(obs);
    free(rew);
    free(term);
    free(trunc);
    free(act);
    free(box);
    sm_vecenv_free(&v);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* report */

static void report(const env_bench_result *r) {
    printf("bench-env env=%s threads=%d steps_per_s=%.0f steps_per_cpu_s=%.0f\n", r->name, r->threads, r->steps / r->seconds,
           r->steps / r->cpu_seconds);
    fflush(stdout);
}

int exp_engine_env(int argc, char **argv) {
    env_bench_settings o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    int n;
    const sm_env_spec *const *all = sm_env_list(&n);
    for (int i = 0; i < n; i++) {
        if (o.env && strcmp(o.env, all[i]->name) != 0) continue;
        env_bench_result r = {0};
        sm_error err = {0};
        sm_status st = run(&o, all[i], &r, &err);
        if (st != SM_OK) return cli_fail(st, &err);
        report(&r);
    }
    return 0;
}
