/* The DQN family end to end: refusals before any work, determinism, and a short learning test on
 * CartPole that a random policy (mean return ~22) cannot pass. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specmoe/io/checkpoint.h"
#include "specmoe/rl/dqn.h"

static sm_dqn_config fast_config(const sm_agent_kind *k, const char *env) {
    sm_dqn_config c;
    cr_assert_eq(sm_opt_defaults(k->opts, k->n_opts, &c), 0);
    c.learning_starts = 1000;
    c.train_freq = 1;
    c.target_update = 500;
    c.eps_frames = 10000;
    c.batch_size = 64;
    c.lr = 1e-3;
    k->env_defaults(&c, sm_env_find(env), NULL, NULL);
    return c;
}

static sm_rl_run make_run(const char *env, long frames, uint64_t seed, const char *out) {
    sm_rl_run r = {0};
    r.env = env;
    r.env_opts = sm_env_opts_default();
    r.seed = seed;
    r.threads = 1;
    r.frames = frames;
    r.out_dir = out;
    return r;
}

Test(dqn, refuses_impossible_settings_before_work) {
    const sm_agent_kind *k = sm_agent_find("dqn");
    cr_assert_not_null(k);
    sm_dqn_config c = fast_config(k, "classic/cartpole");
    sm_error err = {0};
    c.batch_size = 20000;
    cr_assert_neq(k->check(&c, sm_env_find("classic/cartpole"), &err), SM_OK);
    cr_assert(strstr(err.msg, "batch_size"), "%s", err.msg);
    c = fast_config(k, "classic/cartpole");
    c.n_step = 0;
    cr_assert_neq(k->check(&c, sm_env_find("classic/cartpole"), &err), SM_OK);
    cr_assert(strstr(err.msg, "n_step"), "%s", err.msg);
    /* every agent kind: a preset that does not exist is answered with the ones that do */
    cr_assert_neq(sm_agent_apply_preset(k, &c, "nope", &err), SM_OK);
    cr_assert(strstr(err.msg, "minatar"), "%s", err.msg);
}

Test(dqn, same_seed_same_parameters) {
    const sm_agent_kind *k = sm_agent_find("rainbow");
    sm_dqn_config c = fast_config(k, "classic/cartpole");
    c.learning_starts = 200;
    char dir[2][64];
    for (int r = 0; r < 2; r++) {
        snprintf(dir[r], sizeof dir[r], "/tmp/specmoe_test_dqn_%d_%d", (int)getpid(), r);
        sm_rl_run run = make_run("classic/cartpole", 1500, 7, dir[r]);
        sm_rl_result res;
        sm_error err = {0};
        cr_assert_eq(k->train(&c, NULL, &run, &res, &err), SM_OK, "%s", err.msg);
        cr_assert_eq(res.frames, 1500);
        cr_assert_gt(res.updates, 1000);
    }
    char p0[128], p1[128];
    snprintf(p0, sizeof p0, "%s/checkpoint.safetensors", dir[0]);
    snprintf(p1, sizeof p1, "%s/checkpoint.safetensors", dir[1]);
    FILE *f0 = fopen(p0, "rb"), *f1 = fopen(p1, "rb");
    cr_assert(f0 && f1);
    int same = 1, a, b;
    do {
        a = fgetc(f0);
        b = fgetc(f1);
        same &= a == b;
    } while (a != EOF && b != EOF);
    fclose(f0);
    fclose(f1);
    cr_assert(same, "two runs with one seed wrote different checkpoints");
    /* the checkpoint is a policy that acts */
    sm_error err = {0};
    sm_policy *p = k->load_policy(p0, 4, &err);
    cr_assert_not_null(p, "%s", err.msg);
    sm_env_log log;
    cr_assert_eq(sm_rl_evaluate(p, "classic/cartpole", NULL, 3, 2, 1, 1, &log, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(log.n, 3);
    p->destroy(p);
    for (int r = 0; r < 2; r++) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir[r]);
        cr_assert_eq(system(cmd), 0);
    }
}

/* 30k frames of DQN reach a mean return far above a random policy's 22 (measured at 108-133 over
 * seeds 1-3; the bar is 60). About 10 s optimised; the timeout leaves room for -O0 under ASan. */
Test(dqn, learns_cartpole, .timeout = 900) {
    const sm_agent_kind *k = sm_agent_find("dqn");
    sm_dqn_config c = fast_config(k, "classic/cartpole");
    sm_rl_run run = make_run("classic/cartpole", 30000, 1, NULL);
    sm_rl_result res;
    sm_error err = {0};
    cr_assert_eq(k->train(&c, NULL, &run, &res, &err), SM_OK, "%s", err.msg);
    cr_log_info("DQN CartPole 30k frames: mean return over the last 10%% = %.1f", res.last_return);
    cr_assert_gt(res.last_return, 60.0, "mean return %.1f", res.last_return);
}

/* A run stopped half-way and resumed from its checkpoint ends in the same bytes as one run straight
 * through: parameters, optimiser moments, target network, replay, environments and counters. */
static void resume_equals_straight(const char *agent) {
    const sm_agent_kind *k = sm_agent_find(agent);
    sm_dqn_config c = fast_config(k, "classic/cartpole");
    c.learning_starts = 300;
    c.buffer_size = 1000; /* wraps around before the end */
    char d1[96], d2[96];
    snprintf(d1, sizeof d1, "/tmp/specmoe_test_resume_%d_%s_a", (int)getpid(), agent);
    snprintf(d2, sizeof d2, "/tmp/specmoe_test_resume_%d_%s_b", (int)getpid(), agent);
    sm_rl_result res;
    sm_error err = {0};
    sm_rl_run run = make_run("classic/cartpole", 2500, 3, d1);
    cr_assert_eq(k->train(&c, NULL, &run, &res, &err), SM_OK, "%s", err.msg);
    run = make_run("classic/cartpole", 2500, 3, d2);
    run.stop_after = 1100;
    cr_assert_eq(k->train(&c, NULL, &run, &res, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(res.stopped, 2, "stopped by stop_after");
    cr_assert_eq(res.frames, 1100);
    char ck[128];
    snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", d2);
    run = make_run("classic/cartpole", 2500, 3, d2);
    run.resume = ck;
    cr_assert_eq(k->train(&c, NULL, &run, &res, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(res.frames, 2500);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cmp -s %s/checkpoint.safetensors %s/checkpoint.safetensors", d1, d2);
    int same = system(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", d1, d2);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(same, 0, "%s: the resumed run's checkpoint differs from the straight run's", agent);
}

Test(dqn, resume_equals_straight_run) { resume_equals_straight("dqn"); }
Test(dqn, resume_equals_straight_run_prioritized_c51) { resume_equals_straight("rainbow"); }

/* A checkpoint of another run's settings is refused, naming what differs. */
Test(dqn, resume_refuses_other_settings) {
    const sm_agent_kind *k = sm_agent_find("dqn");
    sm_dqn_config c = fast_config(k, "classic/cartpole");
    char d[96], ck[140];
    snprintf(d, sizeof d, "/tmp/specmoe_test_resume_other_%d", (int)getpid());
    snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", d);
    sm_rl_result res;
    sm_error err = {0};
    sm_rl_run run = make_run("classic/cartpole", 600, 3, d);
    cr_assert_eq(k->train(&c, NULL, &run, &res, &err), SM_OK, "%s", err.msg);
    c.batch_size = 32;
    run.resume = ck;
    cr_assert_eq(k->train(&c, NULL, &run, &res, &err), SM_ERR_MISMATCH);
    cr_assert(strstr(err.msg, "agent settings differ"), "%s", err.msg);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    cr_assert_eq(system(cmd), 0);
}

/* Every agent kind's defaults parse and each of its presets applies (a bad built-in default or
 * preset would otherwise surface only when a user picks it). */
Test(agents, defaults_and_presets_parse) {
    int n;
    const sm_agent_kind *const *all = sm_agent_list(&n);
    cr_assert_gt(n, 0);
    for (int a = 0; a < n; a++) {
        const sm_agent_kind *k = all[a];
        void *cfg = calloc(1, k->cfg_bytes);
        cr_assert_eq(sm_opt_defaults(k->opts, k->n_opts, cfg), 0, "%s: a default does not parse", k->name);
        for (const char *const *p = k->presets; p && p[0]; p += 2) {
            sm_error err = {0};
            cr_assert_eq(sm_agent_apply_preset(k, cfg, p[0], &err), SM_OK, "%s preset %s: %s", k->name, p[0], err.msg);
        }
        free(cfg);
    }
}

static int gave_train_freq(const void *user, const char *key) {
    (void)user;
    return !strcmp(key, "train_freq");
}

/* Rainbow-lite on images runs Dopamine's schedule in agent steps (the SoftMoE-in-RL paper's
 * "update periods": an update every 4 steps, target every 8000, learning after 20000, epsilon to
 * 0.01 over 250k); DQN keeps MinAtar's (an update per frame); a setting the user gave stays. */
/* kind k's defaults on env, none given by the user */
static void defaults_on(const sm_agent_kind *k, const sm_env_spec *env, sm_dqn_config *c) {
    cr_assert_eq(sm_opt_defaults(k->opts, k->n_opts, c), 0);
    k->env_defaults(c, env, NULL, NULL);
}

/* Dopamine's C51 on MinAtar: the importance exponent fixed at 0.5, the support [-100, 100] */
static void assert_dopamine_c51(const sm_dqn_config *c) {
    cr_assert_float_eq(c->per_beta, 0.5, 1e-12);
    cr_assert_float_eq(c->per_beta_end, 0.5, 1e-12);
    cr_assert_float_eq(c->v_min, -100, 1e-12);
    cr_assert_float_eq(c->v_max, 100, 1e-12);
}

/* DER's column of the SoftMoE-in-RL paper's Table 1 (every key of its defaults list applies: a
 * misspelt key would be skipped silently), with Dopamine's C51 on MinAtar images only */
Test(agents, der_runs_its_own_settings) {
    const sm_env_spec *img = sm_env_find("minatar/breakout"), *vec = sm_env_find("classic/cartpole");
    cr_assert(img && vec);
    const sm_agent_kind *der = sm_agent_find("der");
    cr_assert(der);
    sm_dqn_config c;
    defaults_on(der, img, &c);
    cr_assert_eq(c.atoms, 51);
    cr_assert_eq(c.n_step, 10);
    cr_assert_eq(c.prioritized, 1);
    cr_assert_eq(c.double_q, 1);
    cr_assert_str_eq(c.optimizer, "adam");
    cr_assert_float_eq(c.lr, 1e-4, 1e-15);
    cr_assert_float_eq(c.adam_eps, 1.5e-4, 1e-15);
    cr_assert_eq(c.learning_starts, 1600);
    cr_assert_eq(c.train_freq, 1);
    cr_assert_eq(c.target_update, 2000);
    cr_assert_float_eq(c.eps_end, 0.01, 1e-12);
    cr_assert_eq(c.eps_frames, 2000);
    assert_dopamine_c51(&c);
    defaults_on(der, vec, &c);
    cr_assert_eq(c.n_step, 10);
    cr_assert_float_eq(c.per_beta_end, 1, 1e-12);
    cr_assert_float_eq(c.v_max, 10, 1e-12);
}

Test(agents, rainbow_runs_its_own_schedule_on_images) {
    const sm_env_spec *img = sm_env_find("minatar/breakout"), *vec = sm_env_find("classic/cartpole");
    cr_assert(img && vec);
    const sm_agent_kind *rb = sm_agent_find("rainbow"), *dqn = sm_agent_find("dqn");
    sm_dqn_config c;
    defaults_on(rb, img, &c);
    cr_assert_eq(c.train_freq, 4);
    cr_assert_eq(c.target_update, 8000);
    cr_assert_eq(c.learning_starts, 20000);
    cr_assert_eq(c.eps_frames, 250000);
    cr_assert_float_eq(c.eps_end, 0.01, 1e-12);
    cr_assert_eq(c.n_step, 3);
    cr_assert_eq(c.atoms, 51);
    assert_dopamine_c51(&c);
    cr_assert_eq(sm_opt_defaults(rb->opts, rb->n_opts, &c), 0);
    c.train_freq = 2;
    rb->env_defaults(&c, img, gave_train_freq, NULL);
    cr_assert_eq(c.train_freq, 2, "a given train_freq was overwritten");
    cr_assert_eq(c.target_update, 8000);
    defaults_on(rb, vec, &c);
    cr_assert_eq(c.train_freq, 10); /* vectors: CleanRL's, as for DQN */
    cr_assert_eq(c.learning_starts, 10000);
    cr_assert_float_eq(c.per_beta_end, 1, 1e-12); /* vectors: the annealed exponent and the support of 10 */
    cr_assert_float_eq(c.v_max, 10, 1e-12);
    defaults_on(dqn, img, &c);
    cr_assert_eq(c.train_freq, 1);
    cr_assert_eq(c.target_update, 1000);
}

/* sm_model_backward_set (the DQN update's backward): from gradients full of NaN it gives the
 * gradients of sm_params_zero_grad + sm_model_backward (compared with ==: a zero's sign may differ,
 * nothing else), on the MinAtar DQN network, a top-k MoE and a SoftMoE one, and with a penalty (its
 * fallback); a plain backward after it accumulates onto them as after the plain pair. Two models
 * from one seed take the same calls (a penalty keeps state from call to call). Fails when the dense
 * layer accumulates into the gradient it was told to overwrite, or a fresh gradient is left unzeroed. */
static void check_backward_set(const char *arch, const char *router, double spectral) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, arch, &err), SM_OK, "%s: %s", arch, err.msg);
    cfg.in_c = 4, cfg.in_h = cfg.in_w = 10, cfg.in_dim = 400, cfg.n_classes = 6;
    if (router) {
        sm_router_config_set(&cfg.moe.router, router, NULL);
        cfg.moe.router.E = 4;
        cfg.moe.router.k = 2;
    }
    cfg.spectral_alpha = spectral;
    const int T = 32;
    sm_model *m[2];
    for (int v = 0; v < 2; v++) {
        sm_rng r;
        sm_rng_seed(&r, 21);
        m[v] = sm_model_create(&cfg, T, &r, &err);
        cr_assert_not_null(m[v], "%s: %s", arch, err.msg);
    }
    if (spectral > 0) cr_assert_gt(m[0]->n_penalties, 0, "%s: no penalty attached", arch);
    sm_rng r;
    sm_rng_seed(&r, 22);
    float *x = malloc(sizeof(float) * T * 400);
    int y[32];
    for (int i = 0; i < T * 400; i++) x[i] = sm_rng_uniform(&r) < 0.1 ? 1.0f : 0.0f;
    for (int i = 0; i < T; i++) y[i] = (int)sm_rng_below(&r, 6);
    const size_t P = m[0]->params.total;
    for (int step = 0; step < 2; step++) {
        for (int v = 0; v < 2; v++) {
            sm_rng rv;
            sm_rng_seed(&rv, 23 + (uint64_t)step);
            sm_model_forward(m[v], x, T, &rv, 1);
            sm_model_loss(m[v], y, NULL, T);
            if (step == 1) sm_model_backward(m[v], T); /* accumulates in both */
            else if (v == 0) {
                sm_params_zero_grad(&m[v]->params);
                sm_model_backward(m[v], T);
            } else {
                for (size_t i = 0; i < P; i++) m[v]->params.grad[i] = NAN;
                sm_model_backward_set(m[v], T);
            }
        }
        for (int i = 0; i < m[0]->params.n; i++) {
            const sm_param *q = &m[0]->params.p[i];
            const sm_real *g0 = m[0]->params.grad + q->offset, *g1 = m[1]->params.grad + q->offset;
            for (size_t j = 0; j < q->numel; j++)
                cr_assert(g1[j] == g0[j], "%s, %s backward: %s[%zu] = %g, zero_grad + backward %g", arch,
                          step ? "a second" : "the set", q->name, j, g1[j], g0[j]);
        }
    }
    free(x);
    sm_model_free(m[0]), sm_model_free(m[1]);
}

Test(dqn, backward_set_gives_zero_grad_and_backward) {
    check_backward_set("conv:16:3:1:0,dense:128", NULL, 0); /* MinAtar's DQN */
    check_backward_set("conv:8:3:1:0,dense:32,dense:16", NULL, 0);
    check_backward_set("conv:8:3:1:0,dense:32,moe:16", "topk", 0);
    check_backward_set("conv:8:3:1:0,tokens,moe:16,flatten", "soft", 0);
    check_backward_set("dense:32,moe:16", "topk", 0.05);
}
