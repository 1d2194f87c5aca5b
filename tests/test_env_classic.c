/* The classic-control rules of Acrobot-v1, MountainCar-v0 and Pendulum-v1 (envs/classic/), and what
 * every registered environment owes the contract (include/specmoe/rl/env.h): its time limit, its
 * observation bounds over random rollouts, and a picture from `render`.
 *
 * Each step is compared with an update written out here from gymnasium's published equations, in
 * a form of its own (Acrobot: the manipulator equation's mass matrix, Coriolis and gravity terms,
 * and glibc's sin/cos where the environment uses the book's terms, sm_sincos2 and identities; the
 * 2x2 system is solved by Cramer's rule here as in the environment. Pendulum: the angle normalised
 * through atan2), from the state the environment's float observation reveals. The environments keep
 * doubles, so they agree up to float rounding of that observation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/sincos.h"
#include "specmoe/rl/env.h"

/* One environment of `name` with its buffers; a_box has room for any action dimension here. */
typedef struct {
    sm_vecenv v;
    float obs[16], fin[16], a_box[4], rew;
    int act;
    unsigned char term, trunc;
} one_env;

static void one_env_open(one_env *e, const char *name, uint64_t seed) {
    memset(e, 0, sizeof *e);
    sm_error err = {0};
    cr_assert_eq(sm_vecenv_init(&e->v, name, 1, seed, NULL, &err), SM_OK, "%s", err.msg);
    cr_assert_leq(sm_env_obs_numel(e->v.spec), 16);
    sm_vecenv_bind(&e->v, e->obs, &e->act, e->a_box, &e->rew, &e->term, &e->trunc, e->fin);
    sm_vecenv_reset(&e->v);
}

/* ---------------------------------------------------------------------------------------------- */
/* Acrobot-v1 */

/* The book dynamics as the manipulator equation M(q) q'' + h(q, q') + phi(q) = (0, a):
 *   M = [[m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos t2) + I1 + I2,  m2 (lc2^2 + l1 lc2 cos t2) + I2],
 *        [m2 (lc2^2 + l1 lc2 cos t2) + I2,                             m2 lc2^2 + I2]]
 *   h = (-m2 l1 lc2 sin t2 (dt2^2 + 2 dt1 dt2),  m2 l1 lc2 sin t2 dt1^2)
 *   phi = ((m1 lc1 + m2 l1) g sin t1 + m2 lc2 g sin(t1 + t2),  m2 lc2 g sin(t1 + t2))
 * (all masses, lengths and inertias 1, centres of mass 0.5, g = 9.8), solved by Cramer's rule. */
static void acrobot_deriv(const double s[4], double a, double ds[4]) {
    const double m = 1, l = 1, lc = 0.5, I = 1, g = 9.8;
    double c2 = cos(s[1]), s2 = sin(s[1]);
    double M11 = m * lc * lc + m * (l * l + lc * lc + 2 * l * lc * c2) + 2 * I;
    double M12 = m * (lc * lc + l * lc * c2) + I, M22 = m * lc * lc + I;
    double h1 = -m * l * lc * s2 * (s[3] * s[3] + 2 * s[2] * s[3]), h2 = m * l * lc * s2 * s[2] * s[2];
    double p2 = m * lc * g * sin(s[0] + s[1]), p1 = (m * lc + m * l) * g * sin(s[0]) + p2;
    double b1 = -h1 - p1, b2 = a - h2 - p2, det = M11 * M22 - M12 * M12;
    ds[0] = s[2];
    ds[1] = s[3];
    ds[2] = (b1 * M22 - M12 * b2) / det;
    ds[3] = (M11 * b2 - M12 * b1) / det;
}

/* One RK4 step of 0.2 s, angles wrapped into [-pi, pi], speeds clipped to 4 pi and 9 pi. */
static void acrobot_closed_form(const double s[4], int action, double o[4]) {
    const double h = 0.2, a = action - 1.0;
    double k[4][4], y[4];
    acrobot_deriv(s, a, k[0]);
    for (int j = 1; j < 4; j++) {
        double f = j == 3 ? h : h / 2;
        for (int i = 0; i < 4; i++) y[i] = s[i] + f * k[j - 1][i];
        acrobot_deriv(y, a, k[j]);
    }
    for (int i = 0; i < 4; i++) o[i] = s[i] + h * (k[0][i] + 2 * k[1][i] + 2 * k[2][i] + k[3][i]) / 6;
    for (int i = 0; i < 2; i++) o[i] = remainder(o[i], 2 * M_PI); /* |o| < 3 pi after one step */
    o[2] = fmin(fmax(o[2], -4 * M_PI), 4 * M_PI);
    o[3] = fmin(fmax(o[3], -9 * M_PI), 9 * M_PI);
}

static void acrobot_state(const float *obs, double s[4]) {
    s[0] = atan2(obs[1], obs[0]);
    s[1] = atan2(obs[3], obs[2]);
    s[2] = obs[4];
    s[3] = obs[5];
}

Test(env_classic, acrobot_start_state) {
    for (uint64_t seed = 1; seed <= 20; seed++) {
        one_env e;
        one_env_open(&e, "classic/acrobot", seed);
        double s[4];
        acrobot_state(e.obs, s);
        for (int i = 0; i < 4; i++) cr_assert(fabs(s[i]) <= 0.1 + 1e-6, "seed %d coord %d: %g", (int)seed, i, s[i]);
        sm_vecenv_free(&e.v);
    }
}

Test(env_classic, acrobot_step_is_the_closed_form_update) {
    one_env e;
    one_env_open(&e, "classic/acrobot", 5);
    sm_rng g;
    sm_rng_seed(&g, 9);
    int fast = 0;
    for (int t = 0; t < 300 && !e.term; t++) {
        double s[4], o[4], n[4];
        acrobot_state(e.obs, s);
        /* pump energy (torque along dt2) with some random steps so the links swing through wrap-around */
        e.act = sm_rng_below(&g, 4) == 0 ? (int)sm_rng_below(&g, 3) : (e.obs[5] > 0 ? 2 : 0);
        acrobot_closed_form(s, e.act, o);
        sm_vecenv_step(&e.v);
        if (e.term) break;
        acrobot_state(e.obs, n);
        cr_assert_eq(e.rew, -1.0f);
        for (int i = 0; i < 4; i++) {
            double d = fabs(n[i] - o[i]);
            if (i < 2) d = fmin(d, 2 * M_PI - d); /* angles agree modulo a turn at the wrap point */
            /* one RK4 step of 0.2 s amplifies the float rounding of the observed state */
            cr_assert(d < 1e-5 * (1 + fabs(o[i])), "step %d coord %d: %.9g vs %.9g", t, i, n[i], o[i]);
        }
        fast |= fabs(s[2]) > 3;
    }
    cr_assert(fast, "the test reached high speeds");
    sm_vecenv_free(&e.v);
}

/* Opens `name` with seed and runs the policy until the episode ends, which must be in a terminal state:
 * every step before the last gives `reward`, the last `last`, and the log holds the episode. */
static void run_to_terminal(one_env *e, const char *name, uint64_t seed, int (*policy)(const float *obs), float reward,
                            float last) {
    one_env_open(e, name, seed);
    int t = 0;
    while (!e->term && !e->trunc) {
        e->act = policy(e->obs);
        sm_vecenv_step(&e->v);
        t++;
        if (!e->term && !e->trunc) cr_assert_eq(e->rew, reward, "%s seed %d step %d", name, (int)seed, t);
    }
    cr_assert_eq(e->term, 1, "%s seed %d: terminal within the time limit", name, (int)seed);
    cr_assert_eq(e->rew, last, "%s: reward of the terminal step", name);
    sm_env_log l = sm_vecenv_log_take(&e->v);
    cr_assert_eq(l.n, 1);
    cr_assert_float_eq(l.episode_return, (double)reward * (t - 1) + last, 1e-9);
    cr_assert_float_eq(l.episode_length, (double)t, 1e-9);
}

static int acrobot_pump(const float *obs) { return obs[5] > 0 ? 2 : 0; }

/* Torque along the second joint's velocity swings the tip above the line within a few hundred steps:
 * the terminal step gives 0, every step before it -1, and the final observation is past the line. */
Test(env_classic, acrobot_terminates_with_reward_zero) {
    for (uint64_t seed = 1; seed <= 5; seed++) {
        one_env e;
        run_to_terminal(&e, "classic/acrobot", seed, acrobot_pump, -1.0f, 0.0f);
        /* height of the tip: -cos t1 - cos(t1 + t2) = -c1 - (c1 c2 - s1 s2) */
        const float *f = e.fin;
        double height = -f[0] - (f[0] * f[2] - f[1] * f[3]);
        cr_assert_gt(height, 1.0 - 1e-5, "seed %d: tip height %g", (int)seed, height);
        sm_vecenv_free(&e.v);
    }
}

/* envs/classic/acrobot.c: how its step_batch steps (-1 by the CPU, 0 ab_step per environment, 1 the
 * AVX2 kernel), and the layout of its state */
extern int sm_acrobot_batch_avx2;
typedef struct {
    sm_rng rng;
    double s[4];  /* t1, t2, dt1, dt2 */
    double cs[4]; /* cos t1, sin t1, cos t2, sin t2 of s */
} acrobot_mirror;

/* The vector steps Acrobot through step_batch, four environments in the lanes of vectors; that must
 * equal stepping each environment by itself bit for bit: observations, rewards, flags, final
 * observations, the states themselves (angles, speeds, the kept sines and cosines, the RNGs) and the
 * episode logs, over thousands of steps with terminals and time limits (auto-resets at staggered
 * times). The reference is a second vector whose spec lacks step_batch, so it steps one environment
 * per call. 39 environments: a block of 32 and one of 7, so groups of four and leftovers. Both ways
 * step_batch has: the AVX2 kernel (where the CPU has it) and ab_step per environment (without). */
Test(env_classic, acrobot_batched_step_is_the_one_environment_step) {
    enum { N = 39, D = 6, T = 3000 };
    const sm_env_spec *batched = sm_env_find("classic/acrobot");
    cr_assert(batched->step_batch != NULL);
    cr_assert_eq(batched->state_bytes, sizeof(acrobot_mirror));
    enum { kOdd = 12 };
    static const int kOddEnvs[kOdd] = {0, 1, 2, 3, 5, 10, 15, 20, 32, 33, 34, 35};
    double odd_t1[kOdd];
    for (int k = 0, j = 0; k < kOdd; j++) {
        sm_v2d_ x = {0.3 + 0.001 * j, 1.0}, sn, cn;
        sm_v2i_ fast;
        sm_sincos2_fast(&x, &sn, &cn, &fast);
        if (fast[0] && sn[0] != sin(x[0])) odd_t1[k++] = x[0];
    }
    sm_env_spec one = *batched;
    one.step_batch = NULL;
    for (int kernel = 0; kernel < 2; kernel++) {
#if defined(__x86_64__)
        if (kernel == 1 && !__builtin_cpu_supports("avx2")) continue;
#else
        if (kernel == 1) continue; /* the AVX2 kernel is x86-64's */
#endif
        sm_acrobot_batch_avx2 = kernel;
        sm_vecenv v[2];
        static float obs[2][N * D], fin[2][N * D];
        float rew[2][N];
        int act[2][N];
        unsigned char term[2][N], trunc[2][N];
        sm_error err = {0};
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(sm_vecenv_init(&v[r], "classic/acrobot", N, 17, NULL, &err), SM_OK, "%s", err.msg);
            if (r) v[r].spec = &one;
            sm_vecenv_bind(&v[r], obs[r], act[r], NULL, rew[r], term[r], trunc[r], fin[r]);
            sm_vecenv_reset(&v[r]);
            /* Some environments start at rest with t2 where sm_sincos2 hands the pair to libm (0,
             * tiny, or the double nearest a multiple of pi/2: no fast path), in different lanes, so
             * that the first step's second stage (at the same angles) takes the batched kernel's
             * per-lane fallback. t1 is an angle whose sine the fast path rounds 1 ulp away from
             * glibc's (odd_t1), so that a batch taking t1 from the fast path would differ. */
            const double slow[] = {0.0, M_PI_2, -M_PI, 1e-300};
            for (int k = 0; k < kOdd; k++) {
                acrobot_mirror *e = (acrobot_mirror *)(v[r].states + kOddEnvs[k] * sizeof *e);
                e->s[0] = odd_t1[k];
                e->s[1] = slow[k % 4];
                e->s[2] = e->s[3] = 0;
                e->cs[0] = cos(e->s[0]);
                e->cs[1] = sin(e->s[0]);
                e->cs[2] = cos(e->s[1]);
                e->cs[3] = sin(e->s[1]);
            }
        }
        sm_rng g;
        sm_rng_seed(&g, 3);
        long terminals = 0, truncations = 0;
        for (int t = 0; t < T; t++) {
            /* every third environment mostly idles (time limit), the others pump with random steps */
            for (int i = 0; i < N; i++) {
                int random = sm_rng_below(&g, 4) == 0;
                act[0][i] = random ? (int)sm_rng_below(&g, 3) : i % 3 == 0 ? 1 : acrobot_pump(obs[0] + i * D);
            }
            memcpy(act[1], act[0], sizeof act[0]);
            sm_vecenv_step(&v[0]);
            sm_vecenv_step(&v[1]);
            cr_assert(memcmp(obs[0], obs[1], sizeof obs[0]) == 0, "kernel %d step %d: observations", kernel, t);
            cr_assert(memcmp(rew[0], rew[1], sizeof rew[0]) == 0, "kernel %d step %d: rewards", kernel, t);
            cr_assert(memcmp(term[0], term[1], sizeof term[0]) == 0, "kernel %d step %d: terminals", kernel, t);
            cr_assert(memcmp(trunc[0], trunc[1], sizeof trunc[0]) == 0, "kernel %d step %d: truncations", kernel, t);
            cr_assert(memcmp(v[0].states, v[1].states, N * batched->state_bytes) == 0, "kernel %d step %d: states", kernel, t);
            for (int i = 0; i < N; i++) {
                if (term[0][i] || trunc[0][i])
                    cr_assert(memcmp(fin[0] + i * D, fin[1] + i * D, D * sizeof(float)) == 0, "kernel %d step %d env %d: final observation", kernel, t, i);
                terminals += term[0][i];
                truncations += trunc[0][i];
            }
        }
        sm_env_log l[2] = {sm_vecenv_log_take(&v[0]), sm_vecenv_log_take(&v[1])};
        cr_assert(memcmp(&l[0], &l[1], sizeof l[0]) == 0, "kernel %d: episode logs", kernel);
        cr_assert_eq(l[0].n, terminals + truncations);
        cr_assert_gt(terminals, 100, "kernel %d: %ld terminal steps", kernel, terminals);
        cr_assert_gt(truncations, 10, "kernel %d: %ld truncations", kernel, truncations);
        for (int r = 0; r < 2; r++) sm_vecenv_free(&v[r]);
    }
    sm_acrobot_batch_avx2 = -1;
}

/* ---------------------------------------------------------------------------------------------- */
/* MountainCar-v0 */

static void mountaincar_closed_form(const double s[2], int action, double o[2]) {
    double v = s[1] + 0.001 * (action - 1) - 0.0025 * cos(3 * s[0]);
    v = fmin(fmax(v, -0.07), 0.07);
    double x = fmin(fmax(s[0] + v, -1.2), 0.6);
    if (x <= -1.2 && v < 0) v = 0; /* inelastic left wall */
    o[0] = x;
    o[1] = v;
}

Test(env_classic, mountaincar_start_state) {
    for (uint64_t seed = 1; seed <= 20; seed++) {
        one_env e;
        one_env_open(&e, "classic/mountaincar", seed);
        cr_assert(e.obs[0] >= -0.6f && e.obs[0] <= -0.4f, "start position %g", e.obs[0]);
        cr_assert_eq(e.obs[1], 0.0f);
        sm_vecenv_free(&e.v);
    }
}

/* Pushing left while moving left (else not at all) rocks the car into the left wall. */
Test(env_classic, mountaincar_step_is_the_closed_form_update_and_the_wall_stops_the_car) {
    one_env e;
    one_env_open(&e, "classic/mountaincar", 2);
    int walls = 0;
    for (int t = 0; t < 199; t++) {
        double s[2] = {e.obs[0], e.obs[1]}, o[2];
        e.act = e.obs[1] < 0 ? 0 : (t % 5 == 0 ? 2 : 1);
        mountaincar_closed_form(s, e.act, o);
        sm_vecenv_step(&e.v);
        cr_assert_eq(e.rew, -1.0f);
        cr_assert_eq(e.term, 0);
        cr_assert(fabs(e.obs[0] - o[0]) < 1e-6, "step %d position %.9g vs %.9g", t, e.obs[0], o[0]);
        cr_assert(fabs(e.obs[1] - o[1]) < 1e-6, "step %d velocity %.9g vs %.9g", t, e.obs[1], o[1]);
        if (e.obs[0] == -1.2f) {
            cr_assert_eq(e.obs[1], 0.0f, "velocity zeroed at the wall");
            walls++;
        }
    }
    cr_assert_gt(walls, 0, "the car reached the left wall");
    sm_vecenv_free(&e.v);
}

static int mountaincar_pump(const float *obs) { return obs[1] >= 0 ? 2 : 0; }

/* Pushing along the velocity reaches the flag: the last step is terminal, with reward -1. */
Test(env_classic, mountaincar_terminates_at_the_goal) {
    for (uint64_t seed = 1; seed <= 5; seed++) {
        one_env e;
        run_to_terminal(&e, "classic/mountaincar", seed, mountaincar_pump, -1.0f, -1.0f);
        cr_assert(e.fin[0] >= 0.5f && e.fin[1] >= 0.0f, "final (%g, %g)", e.fin[0], e.fin[1]);
        sm_vecenv_free(&e.v);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Pendulum-v1 */

/* Reward from the state before the step; the angle from upright normalised through atan2. */
static double pendulum_reward(double th, double thdot, double u) {
    double a = atan2(sin(th), cos(th));
    return -(a * a + 0.1 * thdot * thdot + 0.001 * u * u);
}

static void pendulum_closed_form(double th, double thdot, double u, double o[2]) {
    const double g = 10, m = 1, l = 1, dt = 0.05;
    double w = thdot + dt * (1.5 * g / l * sin(th) + 3 * u / (m * l * l));
    w = fmin(fmax(w, -8.0), 8.0);
    o[0] = th + dt * w;
    o[1] = w;
}

Test(env_classic, pendulum_step_and_reward_are_the_closed_form) {
    one_env e;
    one_env_open(&e, "classic/pendulum", 3);
    cr_assert(fabsf(e.obs[2]) <= 1.0f, "start rate in [-1, 1]");
    sm_rng g;
    sm_rng_seed(&g, 4);
    int clipped_u = 0, clipped_w = 0;
    for (int t = 0; t < 199; t++) {
        double th = atan2(e.obs[1], e.obs[0]), thdot = e.obs[2], o[2];
        /* torques beyond the bounds: the env clips them to [-2, 2], in the reward as well; half the
         * steps push along the rate, so the pendulum spins up to the rate limit */
        e.a_box[0] = sm_rng_below(&g, 2) ? (float)(8 * sm_rng_uniform(&g) - 4) : (e.obs[2] >= 0 ? 4.0f : -4.0f);
        double u = fmin(fmax(e.a_box[0], -2.0), 2.0);
        clipped_u += u != e.a_box[0];
        double r = pendulum_reward(th, thdot, u);
        pendulum_closed_form(th, thdot, u, o);
        clipped_w += fabs(o[1]) == 8.0;
        sm_vecenv_step(&e.v);
        cr_assert_eq(e.term, 0);
        cr_assert(fabs(e.rew - r) < 1e-4 * (1 + fabs(r)), "step %d reward %.9g vs %.9g", t, e.rew, r);
        cr_assert(fabs(e.obs[0] - cos(o[0])) < 1e-5 && fabs(e.obs[1] - sin(o[0])) < 1e-5, "step %d angle", t);
        cr_assert(fabs(e.obs[2] - o[1]) < 1e-5, "step %d rate %.9g vs %.9g", t, e.obs[2], o[1]);
    }
    cr_assert_gt(clipped_u, 0);
    cr_assert_gt(clipped_w, 0, "the rate reached its limit");
    sm_vecenv_free(&e.v);
}

/* The reward at chosen states: the extremes of the formula. */
Test(env_classic, pendulum_reward_formula) {
    cr_assert_float_eq(pendulum_reward(0, 0, 0), 0.0, 1e-12);
    cr_assert_float_eq(pendulum_reward(M_PI - 1e-9, 8, 2), -(M_PI * M_PI + 0.1 * 64 + 0.001 * 4), 1e-6);
    cr_assert_float_eq(pendulum_reward(2 * M_PI + 0.5, -1, 1), -(0.25 + 0.1 + 0.001), 1e-9);
    /* the environment's worst step: upside down, at full speed, full torque */
    one_env e;
    one_env_open(&e, "classic/pendulum", 1);
    double worst = 0;
    for (int t = 0; t < 2000; t++) {
        e.a_box[0] = e.obs[2] >= 0 ? 2.0f : -2.0f;
        sm_vecenv_step(&e.v);
        cr_assert_leq(e.rew, 0.0f);
        worst = fmin(worst, e.rew);
    }
    cr_assert_geq(worst, -(M_PI * M_PI + 0.1 * 64 + 0.001 * 4) - 1e-4, "reward bounded below: %g", worst);
    sm_vecenv_free(&e.v);
}

/* ---------------------------------------------------------------------------------------------- */
/* every classic-control environment */

/* The time limits of Acrobot-v1, MountainCar-v0 and Pendulum-v1 (CartPole-v1: 500, too), reached by
 * policies that never end an episode: no torque (the acrobot hangs, the car rocks in the valley), a
 * balancing controller for the cart-pole, and any torque for the pendulum. */
static int hold_action(const char *name, const float *obs) {
    if (!strcmp(name, "classic/cartpole")) return obs[2] + 0.5f * obs[3] + 0.01f * obs[0] + 0.1f * obs[1] > 0;
    return 1;
}

Test(env_classic, time_limits) {
    static const struct {
        const char *name;
        int limit;
    } kLimits[] = {{"classic/cartpole", 500}, {"classic/acrobot", 500}, {"classic/mountaincar", 200}, {"classic/pendulum", 200}};
    for (size_t k = 0; k < sizeof kLimits / sizeof kLimits[0]; k++) {
        one_env e;
        one_env_open(&e, kLimits[k].name, 1);
        cr_assert_eq(e.v.spec->max_steps, kLimits[k].limit, "%s", kLimits[k].name);
        for (int t = 0; t < kLimits[k].limit; t++) {
            cr_assert_eq(e.trunc, 0, "%s: truncated early at step %d", kLimits[k].name, t);
            e.act = hold_action(kLimits[k].name, e.obs);
            e.a_box[0] = 0.5f;
            sm_vecenv_step(&e.v);
            cr_assert_eq(e.term, 0, "%s: step %d", kLimits[k].name, t);
        }
        cr_assert_eq(e.trunc, 1, "%s: truncated at %d", kLimits[k].name, kLimits[k].limit);
        sm_env_log l = sm_vecenv_log_take(&e.v);
        cr_assert_eq(l.n, 1);
        cr_assert_float_eq(l.episode_length, kLimits[k].limit, 1e-9);
        sm_vecenv_free(&e.v);
    }
}

/* Random actions (box actions drawn from twice the bounds, to exercise the clipping) over many
 * episodes: every observation, and every final observation, lies within the declared bounds. */
Test(env_classic, observations_within_bounds_over_random_rollouts) {
    int n;
    const sm_env_spec *const *all = sm_env_list(&n);
    for (int k = 0; k < n; k++) {
        const sm_env_spec *s = all[k];
        if (!s->obs_low) continue;
        const int N = 8, D = sm_env_obs_numel(s), T = 3000;
        sm_vecenv v;
        sm_error err = {0};
        cr_assert_eq(sm_vecenv_init(&v, s->name, N, 21, NULL, &err), SM_OK);
        float *obs = calloc((size_t)N * D, sizeof(float)), *fin = calloc((size_t)N * D, sizeof(float));
        float *box = calloc((size_t)N * s->act_n, sizeof(float)), rew[8];
        int act[8];
        unsigned char term[8], trunc[8];
        sm_vecenv_bind(&v, obs, act, box, rew, term, trunc, fin);
        sm_vecenv_reset(&v);
        sm_rng g;
        sm_rng_seed(&g, 22);
        for (int t = 0; t < T; t++) {
            sm_env_random_actions(s, &g, N, act, box);
            for (int j = 0; j < N * s->act_n && s->act_kind == SM_SPACE_BOX; j++) box[j] *= 2;
            sm_vecenv_step(&v);
            for (int i = 0; i < N; i++)
                for (int j = 0; j < D; j++) {
                    float x = obs[i * D + j], f = fin[i * D + j];
                    cr_assert(x >= s->obs_low[j] && x <= s->obs_high[j], "%s: obs[%d] = %g at step %d", s->name, j, x, t);
                    cr_assert(f >= s->obs_low[j] && f <= s->obs_high[j], "%s: final obs[%d] = %g", s->name, j, f);
                }
        }
        cr_assert_gt(sm_vecenv_log_take(&v).n, 0, "%s: episodes ended", s->name);
        sm_vecenv_free(&v);
        free(obs);
        free(fin);
        free(box);
    }
}

/* render draws a picture (not one colour) inside the buffer, and a different state draws another. */
Test(env_classic, render_draws_inside_the_image) {
    int n;
    const sm_env_spec *const *all = sm_env_list(&n);
    const int H = 60, W = 90, pad = 64;
    for (int k = 0; k < n; k++) {
        const sm_env_spec *s = all[k];
        if (!s->render || strncmp(s->name, "classic/", 8)) continue;
        one_env e;
        one_env_open(&e, s->name, 2);
        unsigned char *buf = malloc((size_t)H * W * 3 + 2 * pad), *img = buf + pad;
        unsigned char *first = malloc((size_t)H * W * 3);
        memset(buf, 0xA5, (size_t)H * W * 3 + 2 * pad);
        s->render(e.v.states, img, H, W);
        for (int i = 0; i < pad; i++) cr_assert(buf[i] == 0xA5 && img[H * W * 3 + i] == 0xA5, "%s: wrote outside", s->name);
        int other = 0;
        for (int i = 3; i < H * W * 3; i++) other |= img[i] != img[i % 3];
        cr_assert(other, "%s: the picture is one colour", s->name);
        memcpy(first, img, (size_t)H * W * 3);
        for (int t = 0; t < 10; t++) {
            e.act = 2 % s->act_n;
            e.a_box[0] = 2.0f;
            sm_vecenv_step(&e.v);
        }
        s->render(e.v.states, img, H, W);
        cr_assert(memcmp(first, img, (size_t)H * W * 3) != 0, "%s: the picture follows the state", s->name);
        free(first);
        free(buf);
        sm_vecenv_free(&e.v);
    }
}
