/* The MuJoCo environments (envs/mujoco/): spaces shared within a family, the physics clock, the
 * rewards recomputed here from mjData by their published formulas, the humanoid's fall, the reach
 * task's success, a missing model file, and the picture. Determinism across thread counts is
 * tests/test_env.c's deterministic_across_threads (it covers every registered environment).
 *
 * The mjData of a state is reached through its head (envs/mujoco/mjenv.h: every MuJoCo state starts
 * with an mjenv_base), which is how a test places the arm or reads the torso. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "../envs/mujoco/mjenv.h"
#include "specmoe/rl/env.h"

/* one environment with its buffers (the largest family: 57 observations, 21 actions) */
typedef struct {
    sm_vecenv v;
    float obs[64], fin[64], act[32], rew;
    unsigned char term, trunc;
} one_env;

static mjenv_base *one_open(one_env *e, const char *name, int max_steps) {
    memset(e, 0, sizeof *e);
    sm_error err = {0};
    sm_env_opts o = sm_env_opts_default();
    o.max_steps = max_steps;
    cr_assert_eq(sm_vecenv_init(&e->v, name, 1, 3, &o, &err), SM_OK, "%s: %s", name, err.msg);
    cr_assert_leq(sm_env_obs_numel(e->v.spec), 64);
    cr_assert_leq(e->v.spec->act_n, 32);
    sm_vecenv_bind(&e->v, e->obs, NULL, e->act, &e->rew, &e->term, &e->trunc, e->fin);
    sm_vecenv_reset(&e->v);
    return (mjenv_base *)e->v.states;
}

static const char *const kFamilies[3][4] = {
    {"mujoco/cheetah-run", "mujoco/cheetah-run-backward", "mujoco/cheetah-jump", "mujoco/cheetah-flip"},
    {"mujoco/reach-0", "mujoco/reach-1", "mujoco/reach-2", "mujoco/reach-3"},
    {"mujoco/humanoid-stand", "mujoco/humanoid-walk", "mujoco/humanoid-run", NULL},
};

Test(env_mujoco, families_share_spaces_and_limits) {
    const int obs_n[3] = {17, 10, 57}, act_n[3] = {6, 2, 21};
    for (int f = 0; f < 3; f++)
        for (int k = 0; k < 4 && kFamilies[f][k]; k++) {
            const sm_env_spec *s = sm_env_find(kFamilies[f][k]), *s0 = sm_env_find(kFamilies[f][0]);
            cr_assert_not_null(s, "%s is registered", kFamilies[f][k]);
            cr_assert_eq(sm_env_obs_numel(s), obs_n[f], "%s", s->name);
            cr_assert_eq(s->act_kind, SM_SPACE_BOX);
            cr_assert_eq(s->act_n, act_n[f], "%s", s->name);
            cr_assert_eq(s->max_steps, s0->max_steps, "%s", s->name);
            for (int j = 0; j < s->act_n; j++) cr_assert(s->act_low[j] == -1 && s->act_high[j] == 1, "%s", s->name);
        }
}

Test(env_mujoco, a_step_advances_frame_skip_timesteps) {
    const int skip[3] = {5, 2, 5};
    for (int f = 0; f < 3; f++) {
        one_env e;
        mjenv_base *b = one_open(&e, kFamilies[f][0], -1);
        cr_assert_eq(b->frame_skip, skip[f]);
        cr_assert_leq(b->m->nstack, 100000, "%s: a small mjData, not MuJoCo's 13 MB default", kFamilies[f][0]);
        cr_assert_leq(b->m->njmax, 300, "%s", kFamilies[f][0]);
        double t0 = b->d->time;
        sm_vecenv_step(&e.v);
        cr_assert_float_eq(b->d->time - t0, skip[f] * b->m->opt.timestep, 1e-12, "%s", kFamilies[f][0]);
        sm_vecenv_free(&e.v);
    }
}

static double ramp(double x, double target) { return fmin(fmax(x / target, 0), 1); }

/* the four cheetah rewards of envs/mujoco/cheetah.c's top comment, on the state after each step */
Test(env_mujoco, cheetah_rewards_follow_their_formulas) {
    for (int k = 0; k < 4; k++) {
        one_env e;
        mjenv_base *b = one_open(&e, kFamilies[0][k], -1);
        sm_rng g;
        sm_rng_seed(&g, 9);
        double sum = 0;
        for (int t = 0; t < 200; t++) {
            if (t == 100) b->d->qvel[k == 1 ? 0 : k == 3 ? 2 : 1] = k == 1 ? -4.0 : 3.0; /* a kick to earn reward */
            sm_env_random_actions(e.v.spec, &g, 1, NULL, e.act);
            sm_vecenv_step(&e.v);
            const mjData *d = b->d;
            double v = d->qvel[0], z = d->xpos[3 + 2], w = d->qvel[2];
            double want = k == 0 ? ramp(v, 10) : k == 1 ? ramp(-v, 10) : k == 2 ? ramp(z - 0.6, 0.6) : ramp(w, 5);
            cr_assert(fabs(e.rew - want) < 1e-6, "%s step %d: reward %g, formula %g", e.v.spec->name, t, e.rew, want);
            sum += e.rew;
            /* observation: qpos without rootx, then qvel */
            for (int i = 0; i < 8; i++) cr_assert_eq(e.obs[i], (float)d->qpos[i + 1]);
            for (int i = 0; i < 9; i++) cr_assert_eq(e.obs[8 + i], (float)d->qvel[i]);
        }
        cr_assert_gt(sum, 0, "%s earned some reward", e.v.spec->name);
        sm_vecenv_free(&e.v);
    }
}

/* dm_control rewards.tolerance outside the bounds, gaussian with value 0.1 at the margin */
static double tol_gauss(double d, double margin) { return exp(-0.5 * (d / margin) * (d / margin) * -2 * log(0.1)); }

/* dm_control humanoid's reward at move speed `speed`, for a zero action (small_control = 1) */
static double humanoid_formula(const mjenv_base *b, double speed) {
    const mjData *d = b->d;
    double hz = d->xpos[3 * mj_name2id(b->m, mjOBJ_BODY, "head") + 2], up = d->xmat[9 + 8];
    double standing = hz >= 1.4 ? 1 : tol_gauss(1.4 - hz, 0.35);
    double upright = up >= 0.9 ? 1 : fmax(0, 1 - (0.9 - up) / 1.9);
    const double *c = d->subtree_linvel + 3; /* the torso's subtree: the whole body */
    double move = speed == 0 ? (tol_gauss(fabs(c[0]), 2) + tol_gauss(fabs(c[1]), 2)) / 2
                             : (5 * fmin(hypot(c[0], c[1]) / speed, 1) + 1) / 6;
    return standing * upright * move;
}

Test(env_mujoco, humanoid_rewards_and_fall) {
    const double speed[3] = {0, 1, 10};
    for (int k = 2; k >= 0; k--) { /* stand last: its episode goes on to the fall */
        one_env e;
        mjenv_base *b = one_open(&e, kFamilies[2][k], -1);
        if (k) b->d->qvel[0] = 0.5; /* moving forward: the move term is between its floor and 1 */
        sm_vecenv_step(&e.v); /* zero action */
        double want = humanoid_formula(b, speed[k]);
        cr_assert(fabs(e.rew - want) < 1e-5, "%s reward %g, formula %g", kFamilies[2][k], e.rew, want);
        cr_assert_gt(e.rew, k ? 0.1 : 0.5, "%s", kFamilies[2][k]);
        cr_assert_float_eq(e.obs[53], b->d->xpos[3 * mj_name2id(b->m, mjOBJ_BODY, "head") + 2], 1e-5, "head height observed");
        if (k) sm_vecenv_free(&e.v);
        else {
            /* with zero action the humanoid collapses: the episode ends when the torso is below 1 m */
            int steps = 1;
            while (!e.term && steps < 400) {
                sm_vecenv_step(&e.v);
                steps++;
            }
            cr_assert_eq(e.term, 1, "fell and terminated");
            cr_assert_lt(steps, 200, "fell within 5 s (took %d steps)", steps);
            cr_assert_lt(e.fin[0], 1.0f, "final torso height %g below 1 m", e.fin[0]);
            cr_assert_gt(e.obs[0], 1.3f, "the next episode starts standing");
            sm_vecenv_free(&e.v);
        }
    }
}

/* The arm is put on the target (inverse kinematics of the two links, read from the model), then
 * one step with zero action ends the episode (max_steps 1): the log reports success. From the
 * start pose (stretched along +x, 0.17 m from every target) it does not. */
Test(env_mujoco, reach_success_is_reported_on_target) {
    for (int k = 0; k < 4; k++)
        for (int place = 0; place < 2; place++) {
            one_env e;
            mjenv_base *b = one_open(&e, kFamilies[1][k], 1);
            const mjModel *m = b->m;
            mjData *d = b->d;
            double tx = e.obs[8], ty = e.obs[9];
            cr_assert_float_eq(hypot(tx, ty), 0.17, 1e-6);
            if (place) {
                double l1 = m->body_pos[3 * 2], l2 = m->site_pos[0]; /* body 2: the lower link; site 0: fingertip */
                double c2 = (tx * tx + ty * ty - l1 * l1 - l2 * l2) / (2 * l1 * l2), q2 = acos(c2);
                d->qpos[0] = atan2(ty, tx) - atan2(l2 * sin(q2), l1 + l2 * c2);
                d->qpos[1] = q2;
                d->qvel[0] = d->qvel[1] = 0;
                mj_forward(m, d);
                cr_assert(hypot(d->site_xpos[0] - tx, d->site_xpos[1] - ty) < 1e-9, "IK places the fingertip");
            }
            sm_vecenv_step(&e.v);
            cr_assert_eq(e.trunc, 1);
            double dist = hypot(e.fin[6] - tx, e.fin[7] - ty);
            cr_assert(fabs(e.rew + dist) < 1e-5, "reward = -distance: %g vs %g", e.rew, -dist);
            sm_env_log l = sm_vecenv_log_take(&e.v);
            cr_assert_eq(l.n, 1);
            cr_assert_eq(l.success, place ? 1.0 : 0.0, "%s placed=%d dist %g", e.v.spec->name, place, dist);
            sm_vecenv_free(&e.v);
        }
    cr_assert_eq(sm_env_find("mujoco/reach-0")->has_success, 1);
}

Test(env_mujoco, a_missing_model_file_is_an_error_not_a_crash) {
    mjenv_model mm = {"/nonexistent/specmoe/humanoid.xml", NULL, 0, 0, 0, NULL};
    sm_error err = {0};
    cr_assert_eq(mjenv_load(&mm, &err), SM_ERR_IO);
    cr_assert(strstr(err.msg, "/nonexistent/specmoe/humanoid.xml"), "names the file: %s", err.msg);
    cr_assert_null(mm.model);
    mjenv_model bad = {"bad.xml", "<mujoco><worldbody><body><joint type='nope'/></body></worldbody></mujoco>", 0, 0, 0, NULL};
    cr_assert_eq(mjenv_load(&bad, &err), SM_ERR_IO);
    cr_assert(strstr(err.msg, "bad.xml"), "%s", err.msg);
}

Test(env_mujoco, render_draws_the_bodies) {
    for (int f = 0; f < 3; f++) {
        one_env e;
        one_open(&e, kFamilies[f][0], -1);
        static unsigned char rgb[48 * 64 * 3];
        e.v.spec->render(e.v.states, rgb, 48, 64);
        int ink = 0;
        for (int i = 0; i < 48 * 64; i++) ink += rgb[3 * i] != 255 || rgb[3 * i + 1] != 255 || rgb[3 * i + 2] != 255;
        cr_assert_gt(ink, 20, "%s: %d pixels drawn", e.v.spec->name, ink);
        sm_vecenv_free(&e.v);
    }
}
