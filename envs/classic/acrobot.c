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
 * Speed (BENCHMARKS.md, "Environments"):
 *   - each stage evaluates only sin/cos of t1 and t2, through exact identities: cos(t1 - pi/2) =
 *     sin t1 and cos(t1 + t2 - pi/2) = sin(t1 + t2) = sin t1 cos t2 + cos t1 sin t2. The first stage
 *     reuses the values the previous step computed for the observation (kept in the state), and the
 *     terminal test -cos t1 - cos(t1 + t2) = -cos t1 - (cos t1 cos t2 - sin t1 sin t2) needs none of
 *     its own: 4 evaluations of the pair (t1, t2) a step instead of 15 sin/cos calls;
 *   - the pair goes through sm_sincos2 (src/core/sincos.h): both angles in the two lanes of one
 *     vector, within 1 ulp of glibc's sin and cos;
 *   - the two accelerations are the solution of the 2x2 system the book eliminates, (d1 d2; d2 d3)
 *     (ddt1, ddt2) = (-phi1, b2) with d3 = m2 lc2^2 + I2 and b2 = a - m2 l1 lc2 dt1^2 sin t2 - phi2,
 *     by Cramer's rule with one reciprocal of det = d1 d3 - d2^2 (see ab_deriv): one division a
 *     stage instead of three in a row.
 * The results differ from the formulas as written only by double rounding (about 1e-16 relative),
 * far below the float observation's resolution. */
#include <math.h>

#include "classic.h"
#include "core/sincos.h"
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
static inline __attribute__((always_inline)) void ab_deriv(const double s[4], double c1, double s1, double c2, double s2, double a, double ds[4]) {
    const double dt1 = s[2], dt2 = s[3];
    double d1 = AB_M1 * AB_LC1 * AB_LC1 + AB_M2 * (AB_L1 * AB_L1 + AB_LC2 * AB_LC2 + 2 * AB_L1 * AB_LC2 * c2) + AB_I1 + AB_I2;
    double d2 = AB_M2 * (AB_LC2 * AB_LC2 + AB_L1 * AB_LC2 * c2) + AB_I2;
    double phi2 = AB_M2 * AB_LC2 * AB_G * (s1 * c2 + c1 * s2); /* cos(t1 + t2 - pi/2) */
    double phi1 = -AB_M2 * AB_L1 * AB_LC2 * dt2 * dt2 * s2 - 2 * AB_M2 * AB_L1 * AB_LC2 * dt2 * dt1 * s2 +
                  (AB_M1 * AB_LC1 + AB_M2 * AB_L1) * AB_G * s1 /* cos(t1 - pi/2) */ + phi2;
    /* The book's ddt2 multiplied through by d1, and ddt1 = -(d2 ddt2 + phi1)/d1 with that ddt2
     * substituted, are Cramer's rule for (d1 d2; d2 d3) (ddt1, ddt2) = (-phi1, b2):
     *   ddt2 = (d1 b2 + d2 phi1) / det,  ddt1 = -(d3 phi1 + d2 b2) / det,  det = d1 d3 - d2^2.
     * One division, taken as soon as cos t2 is known, replaces three dependent ones (d2/d1, then the
     * quotient for ddt2, then the one for ddt1); the two accelerations no longer wait on each
     * other. Accuracy: the matrix is symmetric positive definite with a condition number of at
     * most 10.8 (eigenvalues 5.26 and 0.49 at cos t2 = 1, the worst case), and det does not cancel
     * (d1 d3 = 1.25 (3.5 + cos t2) is in [3.125, 5.625], d2^2 in [0.5625, 3.0625], det = 2.8125 -
     * cos^2 t2 / 4 in [2.5625, 2.8125]), so Cramer's rule is forward stable, as the book's
     * elimination (pivot d1 >= 2.5) is: both land within about the condition number times a few
     * ulps of the exact (ddt1, ddt2), relative to its norm - around 1e-15, against the 6e-8 of the
     * float observation. */
    const double d3 = AB_M2 * AB_LC2 * AB_LC2 + AB_I2;
    double inv_det = 1.0 / (d1 * d3 - d2 * d2);
    double b2 = a - AB_M2 * AB_L1 * AB_LC2 * dt1 * dt1 * s2 - phi2;
    double ddt2 = (d1 * b2 + d2 * phi1) * inv_det;
    double ddt1 = -(d3 * phi1 + d2 * b2) * inv_det;
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
static inline __attribute__((always_inline)) void ab_deriv_at(const double y[4], double a, double ds[4]) {
    double sn[2], cs[2];
    sm_sincos2(y, sn, cs);
    ab_deriv(y, cs[0], sn[0], cs[1], sn[1], a, ds);
}

/* Takes the sines and cosines of the new state's angles (for the observation and the next step's
 * first stage) and writes the observation. */
static void ab_obs(acrobot *e, float *obs) {
    double sn[2], cs[2];
    sm_sincos2(e->s, sn, cs);
    e->c1 = cs[0];
    e->s1 = sn[0];
    e->c2 = cs[1];
    e->s2 = sn[1];
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
