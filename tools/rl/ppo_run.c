/* A PPO run from the library, for measurements until `specmoe rl train --agent ppo` exists:
 *
 *   cc -Iinclude -O2 -fopenmp tools/rl/ppo_run.c build/libspecmoe.a \
 *      -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -llapacke -lcjson -lz -lm -o build/ppo_run
 *   build/ppo_run ENV FRAMES SEED OUT_DIR [preset=NAME] [key=value ...]
 *
 * trains one thread, then prints the frames, the wall-clock and per-CPU-second steps/s, the mean
 * training return of the last 10% of the frames and the greedy policy's mean return over 20
 * episodes (seed 12345). The settings are the option table's (sm_agent_ppo.opts), the environment
 * defaults (box actions: cleanrl-continuous), then a preset, then key=value pairs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "specmoe/rl/ppo.h"

static int given_any(const void *user, const char *key) {
    const char *const *argv = user;
    for (int i = 0; argv[i]; i++)
        if (!strncmp(argv[i], key, strlen(key)) && argv[i][strlen(key)] == '=') return 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s ENV FRAMES SEED OUT_DIR [preset=NAME] [key=value ...]\n", argv[0]);
        return 2;
    }
    const sm_agent_kind *k = &sm_agent_ppo;
    sm_ppo_config c;
    sm_error err = {0};
    const sm_env_spec *env = sm_env_find(argv[1]);
    if (!env || sm_opt_defaults(k->opts, k->n_opts, &c)) {
        fprintf(stderr, "unknown environment %s (one of: %s)\n", argv[1], sm_env_names());
        return 2;
    }
    k->env_defaults(&c, env, given_any, (const void *)(argv + 5));
    for (int i = 5; i < argc; i++) {
        char b[256];
        snprintf(b, sizeof b, "%s", argv[i]);
        char *e = strchr(b, '=');
        int ok = e != NULL;
        if (ok) *e = 0;
        if (ok && !strcmp(b, "preset")) ok = sm_agent_apply_preset(k, &c, e + 1, &err) == SM_OK;
        else
            for (int j = 0, found = 0; ok && j < k->n_opts && !found; j++)
                if (!strcmp(k->opts[j].key, b)) found = 1, ok = !sm_opt_set(&k->opts[j], &c, e + 1);
        if (!ok) {
            fprintf(stderr, "bad setting %s %s\n", argv[i], err.msg);
            return 2;
        }
    }
    sm_rl_run run = {0};
    run.env = argv[1];
    run.env_opts = sm_env_opts_default();
    run.frames = atol(argv[2]);
    run.seed = strtoull(argv[3], NULL, 10);
    run.out_dir = argv[4];
    run.threads = 1;
    run.progress = stderr;
    sm_rl_result res;
    if (k->train(&c, NULL, &run, &res, &err) != SM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    double cpu = (double)clock() / CLOCKS_PER_SEC;
    char path[4200];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", argv[4]);
    sm_policy *pol = k->load_policy(path, 16, &err);
    sm_env_log log;
    if (!pol || sm_rl_evaluate(pol, run.env, &run.env_opts, 20, 16, 12345, 1, &log, &err) != SM_OK) {
        fprintf(stderr, "evaluation: %s\n", err.msg);
        return 1;
    }
    pol->destroy(pol);
    printf("env=%s seed=%s frames=%ld updates=%ld wall_s=%.2f sps=%.0f cpu_s=%.2f sps_per_cpu_s=%.0f "
           "train_return_last10pct=%.1f greedy_return=%.1f\n",
           run.env, argv[3], res.frames, res.updates, res.seconds, res.frames / res.seconds, cpu, res.frames / cpu,
           res.last_return, log.episode_return / (double)log.n);
    return 0;
}
