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
 * --mj-bare adds, for a MuJoCo environment (envs/mujoco/), the reference the speed target
 * names: bare mj_step at the environment's frame skip on the same model, timed the same way (one
 * mjData per environment, copied from the environment's states after reset, ctrl from the same
 * action table, mj_resetData at the time limit, nothing else; the two take turns over 20 slices of
 * the steps) and the ratio of the two rates:
 *
 *   bench-env-mj env=NAME threads=T frame_skip=K bare_steps_per_s=X bare_steps_per_cpu_s=Y ratio_cpu=R
 *
 * R = steps_per_cpu_s / bare_steps_per_cpu_s (1 = no overhead over the physics).
 *
 * Parse (flags -> env_bench_settings), run (one environment -> env_bench_result) and report (the
 * line) are separate; each line is printed as soon as its environment is measured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/common.h"
#include "envs/mujoco/mjenv.h"
#include "cli/flags.h"
#include "experiments/experiments.h"
#include "specmoe/rl/env.h"

#define ACTION_ROWS 256

typedef struct {
    const char *env; /* NULL: every environment */
    int threads, envs;
    long steps;
    int steps_given; /* --steps on the command line; else 200k for a MuJoCo environment (~100x slower per step) */
    uint64_t seed;
    int mj_bare; /* also time bare mj_step (MuJoCo environments) */
} env_bench_settings;

typedef struct {
    const char *name;
    int threads;
    long steps;     /* environment steps timed (a multiple of the vector's size) */
    double seconds;     /* their wall time */
    double cpu_seconds; /* the CPU time of the process (every thread) meanwhile */
    int frame_skip;           /* --mj-bare on a MuJoCo environment (0: not measured) */
    double bare_seconds, bare_cpu_seconds; /* the same steps of bare mj_step */
} env_bench_result;

/* ---------------------------------------------------------------------------------------------- */
/* parse */

static int parse(env_bench_settings *o, int argc, char **argv) {
    fl_flag fl[] = {
        {"env", FL_STRING, &o->env, NULL, "one environment (default: every one; specmoe rl envs lists them)", 0},
        {"threads", FL_INT, &o->threads, "1", "OpenMP threads stepping the vector", 0},
        {"steps", FL_LONG, &o->steps, "20000000", "environment steps timed per environment (default for mujoco/: 200000)", 0},
        {"envs", FL_INT, &o->envs, "256", "environments in the vector", 0},
        {"seed", FL_U64, &o->seed, "1", "seed of the environments and of the action table", 0},
        {"mj-bare", FL_BOOL, &o->mj_bare, "0", "MuJoCo environments: also time bare mj_step at the same frame skip", 0},
    };
    const char *pos[1];
    int npos;
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 3, "bench env", "[flags]", pos, 0, &npos);
    if (rc) return rc;
    o->steps_given = fl_find(fl, (int)(sizeof fl / sizeof fl[0]), "steps")->set;
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

/* Bare mj_step on the model of a MuJoCo vector: sm_vecenv_step's loop with the environment taken
 * out (ctrl from the action table, frame_skip mj_step calls, mj_resetData at the time limit), over
 * copies of the vector's states. */
typedef struct {
    const mjModel *m;
    mjData **d; /* (N) */
    int *len;   /* (N) steps since the last reset */
    int n, frame_skip, max_steps, act_n, threads;
} mj_bare;

static sm_status mj_bare_open(mj_bare *b, const sm_vecenv *v, sm_error *err) {
    const mjenv_base *head = (const mjenv_base *)v->states;
    *b = (mj_bare){head->m, calloc((size_t)v->num_envs, sizeof *b->d), calloc((size_t)v->num_envs, sizeof *b->len),
                   v->num_envs, head->frame_skip, v->max_steps, v->spec->act_n, v->threads};
    int ok = b->d && b->len;
    for (int i = 0; ok && i < b->n; i++) {
        ok = (b->d[i] = mj_makeData(b->m)) != NULL;
        if (ok) mj_copyData(b->d[i], b->m, ((const mjenv_base *)(v->states + (size_t)i * v->spec->state_bytes))->d);
    }
    return ok ? SM_OK : sm_fail(err, SM_ERR_NOMEM, "out of memory for %d bare mjData of '%s'", b->n, v->spec->name);
}

/* one step of every copy, ctrl from row (N, act_n) */
static void mj_bare_step(mj_bare *b, const float *row) {
#pragma omp parallel for num_threads(b->threads) if (b->threads > 1) schedule(static)
    for (int i = 0; i < b->n; i++) {
        mjData *d = b->d[i];
        for (int j = 0; j < b->act_n; j++) d->ctrl[j] = row[(size_t)i * b->act_n + j];
        for (int k = 0; k < b->frame_skip; k++) mj_step(b->m, d);
        if (b->max_steps > 0 && ++b->len[i] >= b->max_steps) {
            mj_resetData(b->m, d);
            b->len[i] = 0;
        }
    }
}

static void mj_bare_close(mj_bare *b) {
    for (int i = 0; b->d && i < b->n; i++)
        if (b->d[i]) mj_deleteData(b->d[i]);
    free(b->d);
    free(b->len);
}

/* With --mj-bare, the environment and bare mj_step take turns over BARE_ROUNDS slices of the timed
 * steps, so that a change of the machine's load meanwhile weighs on both alike. */
#define BARE_ROUNDS 20

static sm_status run(const env_bench_settings *o, const sm_env_spec *s, env_bench_result *r, sm_error *err) {
    const int N = o->envs, D = sm_env_obs_numel(s), A = s->act_kind == SM_SPACE_BOX ? s->act_n : 1;
    const int bare = o->mj_bare && strncmp(s->name, "mujoco/", 7) == 0;
    sm_vecenv v;
    sm_status st = sm_vecenv_init(&v, s->name, N, o->seed, NULL, err);
    if (st != SM_OK) return st;
    sm_vecenv_set_threads(&v, o->threads);
    const size_t rows = (size_t)ACTION_ROWS * N;
    float *obs = malloc(sizeof(float) * (size_t)N * D), *rew = malloc(sizeof(float) * N);
    unsigned char *term = malloc(N), *trunc = malloc(N);
    int *act = s->act_kind == SM_SPACE_DISCRETE ? malloc(sizeof(int) * rows) : NULL;
    float *box = s->act_kind == SM_SPACE_BOX ? malloc(sizeof(float) * rows * A) : NULL;
    mj_bare mb = {0};
    if (!obs || !rew || !term || !trunc || (!act && !box)) {
        st = sm_fail(err, SM_ERR_NOMEM, "out of memory for %d environments '%s'", N, s->name);
    } else {
        sm_rng g;
        sm_rng_seed(&g, o->seed);
        sm_env_random_actions(s, &g, (int)rows, act, box);
        sm_vecenv_bind(&v, obs, act, box, rew, term, trunc, NULL);
        sm_vecenv_reset(&v);
        if (bare) st = mj_bare_open(&mb, &v, err);
        const long steps = !o->steps_given && strncmp(s->name, "mujoco/", 7) == 0 ? 200000 : o->steps;
        const long iters = (steps + N - 1) / N;
        const int rounds = bare ? BARE_ROUNDS : 1;
        /* t < 0: one untimed pass over the table warms up; then the rounds' slices of [0, iters) */
        for (int c = -1; st == SM_OK && c < rounds; c++) {
            const long t0 = c < 0 ? -ACTION_ROWS : iters * c / rounds, t1 = c < 0 ? 0 : iters * (c + 1) / rounds;
            double w = sm_time_now(), u = cpu_now();
            for (long t = t0; t < t1; t++) {
                const size_t row = (size_t)(t + ACTION_ROWS) % ACTION_ROWS * N;
                sm_vecenv_bind(&v, obs, act ? act + row : NULL, box ? box + row * A : NULL, rew, term, trunc, NULL);
                sm_vecenv_step(&v);
            }
            if (c >= 0) {
                r->seconds += sm_time_now() - w;
                r->cpu_seconds += cpu_now() - u;
            }
            if (!bare) continue;
            w = sm_time_now(), u = cpu_now();
            for (long t = t0; t < t1; t++) mj_bare_step(&mb, box + (size_t)(t + ACTION_ROWS) % ACTION_ROWS * N * A);
            if (c >= 0) {
                r->bare_seconds += sm_time_now() - w;
                r->bare_cpu_seconds += cpu_now() - u;
            }
        }
        r->name = s->name;
        r->threads = o->threads;
        r->steps = iters * N;
        r->frame_skip = bare ? mb.frame_skip : 0;
    }
    mj_bare_close(&mb);
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
    if (r->frame_skip)
        printf("bench-env-mj env=%s threads=%d frame_skip=%d bare_steps_per_s=%.0f bare_steps_per_cpu_s=%.0f ratio_cpu=%.3f\n",
               r->name, r->threads, r->frame_skip, r->steps / r->bare_seconds, r->steps / r->bare_cpu_seconds,
               r->bare_cpu_seconds / r->cpu_seconds);
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
