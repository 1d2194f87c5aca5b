/* Acrobot-v1 (Sutton 1996; Sutton & Barto, "Reinforcement Learning: An Introduction", the "book"
 * dynamics of gymnasium's classic_control/acrobot): two links hanging from a pivot, the joint
 * between them driven by a torque of -1, 0 or +1 (actions 0, 1, 2).
 *
 * Rules (gymnasium's documentation):
 *   - state (t1, t2, dt1, dt2): t1 the first link's angle from straight down, t2 the second link's
 *     angle relative to the first; links of length 1 and mass 1, centres of mass at 0.5, moments of
 *     inertia 1, g = 9.8;
 *   - one step integrates the equations of motion over dt = 0.2 s with a single classical
 *     Runge-Kutta (RK4) step, the torque held constant; then t1, t2 are wrapped into [-pi, pi] and
 *     dt1, dt2 clipped to [-4 pi, 4 pi] and [-9 pi, 9 pi];
 *   - terminal when the free end is more than one link above the pivot: -cos(t1) - cos(t2 + t1) > 1;
 *   - reward -1 per step, 0 on the terminal step; time limit 500 steps;
 *   - observation (cos t1, sin t1, cos t2, sin t2, dt1, dt2); start state uniform in [-0.1, 0.1]^4.
 *
 * Equations of motion (the book version), with the torque a on the second joint:
 *   d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos t2) + I1 + I2
 *   d2 = m2 (lc2^2 + l1 lc2 cos t2) + I2
 *   phi2 = m2 lc2 g cos(t1 + t2 - pi/2)
 *   phi1 = -m2 l1 lc2 dt2^2 sin t2 - 2 m2 l1 lc2 dt2 dt1 sin t2 + (m1 lc1 + m2 l1) g cos(t1 - pi/2) + phi2
 *   ddt2 = (a + d2/d1 phi1 - m2 l1 lc2 dt1^2 sin t2 - phi2) / (m2 lc2^2 + I2 - d2^2/d1)
 *   ddt1 = -(d2 ddt2 + phi1) / d1
 *
 * Speed: the sines and cosines are most of a step's time, so each stage evaluates only sin/cos of t1
 * and t2 (one sincos each), through exact identities: cos(t1 - pi/2) = sin t1 and
 * cos(t1 + t2 - pi/2) = sin(t1 + t2) = sin t1 cos t2 + cos t1 sin t2. The first stage reuses the
 * values the previous step computed for the observation (kept in the state), and the terminal test
 * -cos t1 - cos(t1 + t2) = -cos t1 - (cos t1 cos t2 - sin t1 sin t2) needs none of its own: 8 sincos
 * calls a step instead of 15 sin/cos calls. The results differ from the formulas as written only by
 * double rounding (about 1e-16 relative), far below the float observation's resolution. */
#include <math.h>

#include "classic.h"
#include "draw.h"

#define AB_L1 1.0
#define AB_L2 1.0
#define AB_M1 1.0
#define AB_M2 1.0
#define AB_LC1 0.5
#define AB_LC2 0.5
#define AB_I1 1.0
#define AB_I2 1.0
#define AB_G 9.8
#define AB_DT 0.2
#define AB_MAX_VEL1 (4 * M_PI)
#define AB_MAX_VEL2 (9 * M_PI)

typedef struct {
    sm_rng rng; /* first: classic_init seeds it */
    double s[4]; /* t1, t2, dt1, dt2 */
    double c1, s1, c2, s2; /* cos t1, sin t1, cos t2, sin t2 of s */
} acrobot;

/* the time derivative of (t1, t2, dt1, dt2) under torque a, given c1 = cos t1, s1 = sin t1,
 * c2 = cos t2, s2 = sin t2 */
static void ab_deriv(const double s[4], double c1, double s1, double c2, double s2, double a, double ds[4]) {
    const double dt1 = s[2], dt2 = s[3];
    double d1 = AB_M1 * AB_LC1 * AB_LC1 + AB_M2 * (AB_L1 * AB_L1 + AB_LC2 * AB_LC2 + 2 * AB_L1 * AB_LC2 * c2) + AB_I1 + AB_I2;
    double d2 = AB_M2 * (AB_LC2 * AB_LC2 + AB_L1 * AB_LC2 * c2) + AB_I2;
    double phi2 = AB_M2 * AB_LC2 * AB_G * (s1 * c2 + c1 * s2); /* cos(t1 + t2 - pi/2) */
    double phi1 = -AB_M2 * AB_L1 * AB_LC2 * dt2 * dt2 * s2 - 2 * AB_M2 * AB_L1 * AB_LC2 * dt2 * dt1 * s2 +
                  (AB_M1 * AB_LC1 + AB_M2 * AB_L1) * AB_G * s1 /* cos(t1 - pi/2) */ + phi2;
    double ddt2 = (a + d2 / d1 * phi1 - AB_M2 * AB_L1 * AB_LC2 * dt1 * dt1 * s2 - phi2) /
                  (AB_M2 * AB_LC2 * AB_LC2 + AB_I2 - d2 * d2 / d1);
    double ddt1 = -(d2 * ddt2 + phi1) / d1;
    ds[0] = dt1;
    ds[1] = dt2;
    ds[2] = ddt1;
    ds[3] = ddt2;
}

/* x wrapped into [lo, hi] by whole periods (gymnasium's wrap) */
static double ab_wrap(double x, double lo, double hi) {
    const double period = hi - lo;
    while (x > hi) x -= period;
    while (x < lo) x += period;
    return x;
}

/* ab_deriv at a stage point y, with the sines and cosines of its angles */
static void ab_deriv_at(const double y[4], double a, double ds[4]) {
    ab_deriv(y, cos(y[0]), sin(y[0]), cos(y[1]), sin(y[1]), a, ds);
}

/* Takes the sines and cosines of the new state's angles (for the observation and the next step's
 * first stage) and writes the observation. */
static void ab_obs(acrobot *e, float *obs) {
    e->c1 = cos(e->s[0]);
    e->s1 = sin(e->s[0]);
    e->c2 = cos(e->s[1]);
    e->s2 = sin(e->s[1]);
    obs[0] = (float)e->c1;
    obs[1] = (float)e->s1;
    obs[2] = (float)e->c2;
    obs[3] = (float)e->s2;
    obs[4] = (float)e->s[2];
    obs[5] = (float)e->s[3];
}

static void ab_reset(void *st, float *obs) {
    acrobot *e = st;
    for (int i = 0; i < 4; i++) e->s[i] = 0.2 * sm_rng_uniform(&e->rng) - 0.1;
    ab_obs(e, obs);
}

static void ab_step(void *st, const int *a, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    acrobot *e = st;
    const double torque = (double)(*a - 1); /* actions 0, 1, 2: torques -1, 0, +1 */
    /* one RK4 step of length dt */
    double k1[4], k2[4], k3[4], k4[4], y[4];
    ab_deriv(e->s, e->c1, e->s1, e->c2, e->s2, torque, k1);
    for (int i = 0; i < 4; i++) y[i] = e->s[i] + AB_DT / 2 * k1[i];
    ab_deriv_at(y, torque, k2);
    for (int i = 0; i < 4; i++) y[i] = e->s[i] + AB_DT / 2 * k2[i];
    ab_deriv_at(y, torque, k3);
    for (int i = 0; i < 4; i++) y[i] = e->s[i] + AB_DT * k3[i];
    ab_deriv_at(y, torque, k4);
    for (int i = 0; i < 4; i++) y[i] = e->s[i] + AB_DT / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
    e->s[0] = ab_wrap(y[0], -M_PI, M_PI);
    e->s[1] = ab_wrap(y[1], -M_PI, M_PI);
    e->s[2] = classic_clip(y[2], -AB_MAX_VEL1, AB_MAX_VEL1);
    e->s[3] = classic_clip(y[3], -AB_MAX_VEL2, AB_MAX_VEL2);
    ab_obs(e, obs);
    /* -cos t1 - cos(t2 + t1) > 1, with cos(t1 + t2) = cos t1 cos t2 - sin t1 sin t2 */
    *terminal = -e->c1 - (e->c1 * e->c2 - e->s1 * e->s2) > 1.0;
    *reward = *terminal ? 0.0f : -1.0f;
}

/* The pivot in the middle, the two links, and the line the free end must rise above. */
static void ab_render(const void *st, unsigned char *rgb, int h, int w) {
    const acrobot *e = st;
    const double bound = AB_L1 + AB_L2 + 0.2;
    draw_view v = draw_begin(rgb, h, w, -bound, bound, -bound, bound, kDrawWhite);
    double x1 = AB_L1 * sin(e->s[0]), y1 = -AB_L1 * cos(e->s[0]);
    double x2 = x1 + AB_L2 * sin(e->s[0] + e->s[1]), y2 = y1 - AB_L2 * cos(e->s[0] + e->s[1]);
    draw_line(&v, -bound, 1.0, bound, 1.0, 0.02, kDrawBlack);
    draw_line(&v, 0, 0, x1, y1, 0.12, kDrawBlue);
    draw_line(&v, x1, y1, x2, y2, 0.12, kDrawBlue);
    draw_disc(&v, 0, 0, 0.08, kDrawBrown);
    draw_disc(&v, x1, y1, 0.08, kDrawBrown);
}

/* gymnasium's observation_space */
static const float ab_high[6] = {1.0f, 1.0f, 1.0f, 1.0f, (float)AB_MAX_VEL1, (float)AB_MAX_VEL2};
static const float ab_low[6] = {-1.0f, -1.0f, -1.0f, -1.0f, -(float)AB_MAX_VEL1, -(float)AB_MAX_VEL2};

const sm_env_spec sm_env_acrobot = {
    .name = "classic/acrobot",
    .about = "Acrobot-v1: swing the end of a two-link chain above a line; -1 per step, 500-step limit",
    .obs_c = 6, .obs_h = 1, .obs_w = 1,
    .obs_low = ab_low, .obs_high = ab_high,
    .act_kind = SM_SPACE_DISCRETE, .act_n = 3,
    .max_steps = 500,
    .state_bytes = sizeof(acrobot),
    .init = classic_init, .reset = ab_reset, .step = ab_step,
    .render = ab_render,
};
