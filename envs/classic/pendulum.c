/* Pendulum-v1 (gymnasium's classic_control/pendulum): swing a frictionless pendulum up and hold it
 * upright with a bounded torque. One box action, the torque u, clipped to [-2, 2].
 *
 * Rules (gymnasium's documentation), with th the angle from upright (0 = up) and thdot its rate,
 * g = 10, m = 1, l = 1, dt = 0.05:
 *   reward = -(angle_normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2), from the state before the step,
 *     where angle_normalize(x) = ((x + pi) mod 2 pi) - pi lies in [-pi, pi);
 *   thdot += (3 g / (2 l) sin th + 3 / (m l^2) u) dt, then clipped to [-8, 8];
 *   th += thdot dt (semi-implicit Euler: the new rate moves the angle);
 *   never terminal; time limit 200 steps; start th uniform in [-pi, pi], thdot in [-1, 1];
 *   observation (cos th, sin th, thdot). */
#include <math.h>

#include "classic.h"
#include "core/sincos.h"
#include "draw.h"

#define PD_G 10.0
#define PD_M 1.0
#define PD_L 1.0
#define PD_DT 0.05
#define PD_MAX_SPEED 8.0
#define PD_MAX_TORQUE 2.0

typedef struct {
    sm_rng rng; /* first: classic_init seeds it */
    double th, thdot;
    double cos_th, sin_th; /* of th: taken once for the observation, reused by the next step */
} pendulum;

static void pd_obs(pendulum *e, float *obs) {
    sm_sincos(e->th, &e->sin_th, &e->cos_th);
    obs[0] = (float)e->cos_th;
    obs[1] = (float)e->sin_th;
    obs[2] = (float)e->thdot;
}

static void pd_reset(void *st, float *obs) {
    pendulum *e = st;
    e->th = -M_PI + 2 * M_PI * sm_rng_uniform(&e->rng);
    e->thdot = -1.0 + 2.0 * sm_rng_uniform(&e->rng);
    pd_obs(e, obs);
}

/* ((x + pi) mod 2 pi) - pi with the modulo's result in [0, 2 pi), as Python's % gives it */
static double pd_angle_normalize(double x) {
    double r = fmod(x + M_PI, 2 * M_PI);
    if (r < 0) r += 2 * M_PI;
    return r - M_PI;
}

static void pd_step(void *st, const int *a_disc, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_disc;
    pendulum *e = st;
    double u = classic_clip(a_box[0], -PD_MAX_TORQUE, PD_MAX_TORQUE);
    double an = pd_angle_normalize(e->th);
    double cost = an * an + 0.1 * e->thdot * e->thdot + 0.001 * (u * u);
    double thdot = e->thdot + (3 * PD_G / (2 * PD_L) * e->sin_th + 3.0 / (PD_M * PD_L * PD_L) * u) * PD_DT;
    thdot = classic_clip(thdot, -PD_MAX_SPEED, PD_MAX_SPEED);
    e->th = e->th + thdot * PD_DT;
    e->thdot = thdot;
    *reward = (float)-cost;
    *terminal = 0;
    pd_obs(e, obs);
}

/* The rod from the pivot in the middle, upright when th = 0, and the pivot. */
static void pd_render(const void *st, unsigned char *rgb, int h, int w) {
    const pendulum *e = st;
    const double bound = 1.2 * PD_L;
    draw_view v = draw_begin(rgb, h, w, -bound, bound, -bound, bound, kDrawWhite);
    draw_line(&v, 0, 0, PD_L * sin(e->th), PD_L * cos(e->th), 0.2, kDrawRed);
    draw_disc(&v, 0, 0, 0.05, kDrawBlack);
}

static const float pd_low[3] = {-1.0f, -1.0f, -(float)PD_MAX_SPEED};
static const float pd_high[3] = {1.0f, 1.0f, (float)PD_MAX_SPEED};
static const float pd_act_low[1] = {-(float)PD_MAX_TORQUE};
static const float pd_act_high[1] = {(float)PD_MAX_TORQUE};

const sm_env_spec sm_env_pendulum = {
    .name = "classic/pendulum",
    .about = "Pendulum-v1: swing a pendulum up and keep it upright; reward -(angle^2 + 0.1 rate^2 + 0.001 torque^2), 200-step limit",
    .obs_c = 3, .obs_h = 1, .obs_w = 1,
    .obs_low = pd_low, .obs_high = pd_high,
    .act_kind = SM_SPACE_BOX, .act_n = 1,
    .act_low = pd_act_low, .act_high = pd_act_high,
    .max_steps = 200,
    .state_bytes = sizeof(pendulum),
    .init = classic_init, .reset = pd_reset, .step = pd_step,
    .render = pd_render,
};
