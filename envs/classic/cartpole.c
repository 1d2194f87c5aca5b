/* CartPole-v1 (Barto, Sutton & Anderson 1983; gymnasium's classic_control/cartpole): a pole on a
 * cart, pushed left (0) or right (1) with force 10. Explicit Euler with tau = 0.02 s. Reward +1 per
 * step including the last; terminal when |x| > 2.4 or |theta| > 12 degrees; time limit 500 steps.
 * Start state uniform in [-0.05, 0.05]^4. Observation (x, x_dot, theta, theta_dot). */
#include <math.h>

#include "classic.h"
#include "draw.h"

#define CP_GRAVITY 9.8
#define CP_MASSCART 1.0
#define CP_MASSPOLE 0.1
#define CP_LENGTH 0.5 /* half the pole's length */
#define CP_FORCE 10.0
#define CP_TAU 0.02
#define CP_THETA_LIMIT (12.0 * 2.0 * M_PI / 360.0)
#define CP_X_LIMIT 2.4

typedef struct {
    sm_rng rng; /* first: classic_init seeds it */
    double x, x_dot, theta, theta_dot;
} cartpole;

static void cp_obs(const cartpole *e, float *obs) {
    obs[0] = (float)e->x;
    obs[1] = (float)e->x_dot;
    obs[2] = (float)e->theta;
    obs[3] = (float)e->theta_dot;
}

static void cp_reset(void *st, float *obs) {
    cartpole *e = st;
    e->x = 0.1 * sm_rng_uniform(&e->rng) - 0.05;
    e->x_dot = 0.1 * sm_rng_uniform(&e->rng) - 0.05;
    e->theta = 0.1 * sm_rng_uniform(&e->rng) - 0.05;
    e->theta_dot = 0.1 * sm_rng_uniform(&e->rng) - 0.05;
    cp_obs(e, obs);
}

/* One step of the cart-pole equations of motion (Florian 2007's correction is not used, as in gym). */
static void cp_dynamics(double s[4], int action) {
    const double total_mass = CP_MASSCART + CP_MASSPOLE, polemass_length = CP_MASSPOLE * CP_LENGTH;
    double force = action == 1 ? CP_FORCE : -CP_FORCE;
    double costh = cos(s[2]), sinth = sin(s[2]);
    double temp = (force + polemass_length * s[3] * s[3] * sinth) / total_mass;
    double thetaacc = (CP_GRAVITY * sinth - costh * temp) /
                      (CP_LENGTH * (4.0 / 3.0 - CP_MASSPOLE * costh * costh / total_mass));
    double xacc = temp - polemass_length * thetaacc * costh / total_mass;
    s[0] += CP_TAU * s[1];
    s[1] += CP_TAU * xacc;
    s[2] += CP_TAU * s[3];
    s[3] += CP_TAU * thetaacc;
}

static void cp_step(void *st, const int *a, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    cartpole *e = st;
    double s[4] = {e->x, e->x_dot, e->theta, e->theta_dot};
    cp_dynamics(s, *a == 1);
    e->x = s[0];
    e->x_dot = s[1];
    e->theta = s[2];
    e->theta_dot = s[3];
    *terminal = e->x < -CP_X_LIMIT || e->x > CP_X_LIMIT || e->theta < -CP_THETA_LIMIT || e->theta > CP_THETA_LIMIT;
    *reward = 1.0f;
    cp_obs(e, obs);
}

/* The track, the cart at x and the pole at theta; the picture spans the track's limits, as gym's. */
static void cp_render(const void *st, unsigned char *rgb, int h, int w) {
    const cartpole *e = st;
    draw_view v = draw_begin(rgb, h, w, -CP_X_LIMIT, CP_X_LIMIT, -0.6, 1.4, kDrawWhite);
    draw_line(&v, -CP_X_LIMIT, 0, CP_X_LIMIT, 0, 0.02, kDrawBlack);
    draw_rect(&v, e->x, 0.1, 0.5, 0.3, kDrawBlack);
    draw_line(&v, e->x, 0.15, e->x + 2 * CP_LENGTH * sin(e->theta), 0.15 + 2 * CP_LENGTH * cos(e->theta), 0.1, kDrawBrown);
    draw_disc(&v, e->x, 0.15, 0.05, kDrawBlue);
}

/* gym's observation_space bounds: twice the termination limits for x and theta, unbounded speeds */
static const float cp_low[4] = {-4.8f, -INFINITY, -0.41887903f, -INFINITY};
static const float cp_high[4] = {4.8f, INFINITY, 0.41887903f, INFINITY};

const sm_env_spec sm_env_cartpole = {
    .name = "classic/cartpole",
    .about = "CartPole-v1: balance a pole on a cart; +1 per step, 500-step limit",
    .obs_c = 4, .obs_h = 1, .obs_w = 1,
    .obs_low = cp_low, .obs_high = cp_high,
    .act_kind = SM_SPACE_DISCRETE, .act_n = 2,
    .max_steps = 500,
    .state_bytes = sizeof(cartpole),
    .init = classic_init, .reset = cp_reset, .step = cp_step,
    .render = cp_render,
};
