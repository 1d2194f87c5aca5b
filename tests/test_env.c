/* The environment contract (include/specmoe/rl/env.h) and the classic-control rules: a step equals
 * the closed-form update written out here from the published equations, auto-reset, time limits,
 * the episode log, determinism across thread counts. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "specmoe/rl/env.h"

Test(env, registry_lists_and_finds) {
    int n;
    const sm_env_spec *const *all = sm_env_list(&n);
    cr_assert_gt(n, 0);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(sm_env_find(all[i]->name), all[i]);
        cr_assert_gt(sm_env_obs_numel(all[i]), 0, "%s", all[i]->name);
        cr_assert_gt(all[i]->act_n, 0, "%s", all[i]->name);
    }
    cr_assert_null(sm_env_find("classic/nope"));
    sm_vecenv v;
    sm_error err = {0};
    cr_assert_neq(sm_vecenv_init(&v, "classic/nope", 2, 1, NULL, &err), SM_OK);
    cr_assert(strstr(err.msg, "classic/cartpole"), "unknown name answered with the list: %s", err.msg);
}

/* CartPole-v1 (gymnasium): the Euler update of Barto, Sutton & Anderson's equations, tau = 0.02 */
static void cartpole_closed_form(const double s[4], int a, double o[4]) {
    const double g = 9.8, mc = 1.0, mp = 0.1, l = 0.5, f = a ? 10.0 : -10.0, tau = 0.02;
    double c = cos(s[2]), sn = sin(s[2]);
    double tmp = (f + mp * l * s[3] * s[3] * sn) / (mc + mp);
    double th_acc = (g * sn - c * tmp) / (l * (4.0 / 3.0 - mp * c * c / (mc + mp)));
    double x_acc = tmp - mp * l * th_acc * c / (mc + mp);
    o[0] = s[0] + tau * s[1];
    o[1] = s[1] + tau * x_acc;
    o[2] = s[2] + tau * s[3];
    o[3] = s[3] + tau * th_acc;
}

Test(env, cartpole_step_is_the_closed_form_update) {
    sm_vecenv v;
    sm_error err = {0};
    cr_assert_eq(sm_vecenv_init(&v, "classic/cartpole", 1, 7, NULL, &err), SM_OK, "%s", err.msg);
    float obs[4], rew;
    int act;
    unsigned char term, trunc;
    sm_vecenv_bind(&v, obs, &act, NULL, &rew, &term, &trunc, NULL);
    sm_vecenv_reset(&v);
    for (int i = 0; i < 4; i++) cr_assert(fabsf(obs[i]) <= 0.05f, "start state in [-0.05, 0.05]");
    for (int t = 0; t < 8; t++) {
        double s[4] = {obs[0], obs[1], obs[2], obs[3]}, o[4];
        act = t % 3 == 0;
        /* the env keeps doubles; its float observation differs from them by float rounding */
        cartpole_closed_form(s, act, o);
        sm_vecenv_step(&v);
        cr_assert_eq(rew, 1.0f);
        cr_assert_eq(term, 0);
        for (int i = 0; i < 4; i++) cr_assert(fabs(obs[i] - o[i]) < 1e-5, "step %d coord %d: %g vs %g", t, i, obs[i], o[i]);
    }
    sm_vecenv_free(&v);
}

Test(env, cartpole_terminates_auto_resets_and_logs) {
    sm_vecenv v;
    sm_error err = {0};
    cr_assert_eq(sm_vecenv_init(&v, "classic/cartpole", 1, 3, NULL, &err), SM_OK);
    float obs[4], fin[4], rew;
    int act = 1;
    unsigned char term = 0, trunc = 0;
    sm_vecenv_bind(&v, obs, &act, NULL, &rew, &term, &trunc, fin);
    sm_vecenv_reset(&v);
    int steps = 0;
    while (!term && steps < 1000) {
        sm_vecenv_step(&v);
        steps++;
    }
    /* always pushing right tips the pole within a few dozen steps */
    cr_assert_eq(term, 1);
    cr_assert_lt(steps, 100);
    cr_assert(fabsf(fin[2]) > 0.2094f || fabsf(fin[0]) > 2.4f, "final obs is past a limit");
    for (int i = 0; i < 4; i++) cr_assert(fabsf(obs[i]) <= 0.05f, "obs is the next episode's start");
    sm_env_log l = sm_vecenv_log_take(&v);
    cr_assert_eq(l.n, 1);
    cr_assert_float_eq(l.episode_return, (double)steps, 1e-9);
    cr_assert_float_eq(l.episode_length, (double)steps, 1e-9);
    cr_assert_eq(sm_vecenv_log_take(&v).n, 0, "take clears the log");
    sm_vecenv_free(&v);
}

Test(env, time_limit_truncates) {
    sm_vecenv v;
    sm_error err = {0};
    sm_env_opts o = sm_env_opts_default();
    o.max_steps = 5;
    cr_assert_eq(sm_vecenv_init(&v, "classic/cartpole", 1, 3, &o, &err), SM_OK);
    float obs[4], rew;
    int act = 0;
    unsigned char term, trunc;
    sm_vecenv_bind(&v, obs, &act, NULL, &rew, &term, &trunc, NULL);
    sm_vecenv_reset(&v);
    for (int t = 0; t < 5; t++) {
        act = t % 2;
        sm_vecenv_step(&v);
    }
    cr_assert_eq(trunc, 1);
    cr_assert_eq(term, 0);
    cr_assert_eq(sm_vecenv_log_take(&v).episode_length, 5.0);
    sm_vecenv_free(&v);
}

/* Same seed -> same trajectories whatever the thread count (each env has its own RNG). */
Test(env, deterministic_across_threads) {
    int n;
    const sm_env_spec *const *all = sm_env_list(&n);
    for (int k = 0; k < n; k++) {
        const sm_env_spec *s = all[k];
        const int N = 6, D = sm_env_obs_numel(s), T = 300;
        float *obs[2];
        double sum[2] = {0, 0};
        for (int r = 0; r < 2; r++) {
            sm_vecenv v;
            sm_error err = {0};
            cr_assert_eq(sm_vecenv_init(&v, s->name, N, 11, NULL, &err), SM_OK);
            sm_vecenv_set_threads(&v, r ? 2 : 1);
            obs[r] = calloc((size_t)N * D, sizeof(float));
            int act[6];
            float box[6 * 32], rew[6];
            unsigned char term[6], trunc[6];
            sm_vecenv_bind(&v, obs[r], act, box, rew, term, trunc, NULL);
            sm_vecenv_reset(&v);
            sm_rng g;
            sm_rng_seed(&g, 5);
            for (int t = 0; t < T; t++) {
                sm_env_random_actions(s, &g, N, act, box);
                sm_vecenv_step(&v);
                for (int i = 0; i < N; i++) sum[r] += rew[i];
            }
            sm_vecenv_free(&v);
        }
        cr_assert_eq(memcmp(obs[0], obs[1], (size_t)N * D * sizeof(float)), 0, "%s", s->name);
        cr_assert_eq(sum[0], sum[1], "%s", s->name);
        free(obs[0]);
        free(obs[1]);
    }
}
