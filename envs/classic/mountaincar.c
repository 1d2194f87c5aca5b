/* MountainCar-v0 (Moore 1990; Sutton & Barto's mountain car; gymnasium's classic_control/mountain_car):
 * an under-powered car in a valley must rock back and forth to reach the flag on the right hill.
 * Actions 0, 1, 2 push left, not at all, right.
 *
 * Rules (gymnasium's documentation), with the hill's height sin(3 x):
 *   velocity += (action - 1) * 0.001 - 0.0025 cos(3 position), then clipped to [-0.07, 0.07];
 *   position += velocity, then clipped to [-1.2, 0.6]; at the left wall (position = -1.2) a
 *   negative velocity becomes 0 (an inelastic collision);
 *   terminal when position >= 0.5 and velocity >= 0; reward -1 on every step, the last included;
 *   time limit 200 steps; start position uniform in [-0.6, -0.4], velocity 0;
 *   observation (position, velocity). */
#include <math.h>

#include "classic.h"
#include "draw.h"

#define MC_MIN_POS (-1.2)
#define MC_MAX_POS 0.6
#define MC_MAX_SPEED 0.07
#define MC_GOAL_POS 0.5
#define MC_GOAL_VEL 0.0
#define MC_FORCE 0.001
#define MC_GRAVITY 0.0025

typedef struct {
    sm_rng rng; /* first: classic_init seeds it */
    double pos, vel;
} mountaincar;

static void mc_obs(const mountaincar *e, float *obs) {
    obs[0] = (float)e->pos;
    obs[1] = (float)e->vel;
}

static void mc_reset(void *st, float *obs) {
    mountaincar *e = st;
    e->pos = -0.6 + 0.2 * sm_rng_uniform(&e->rng);
    e->vel = 0.0;
    mc_obs(e, obs);
}

static void mc_step(void *st, const int *a, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    mountaincar *e = st;
    double vel = e->vel + (*a - 1) * MC_FORCE + cos(3 * e->pos) * (-MC_GRAVITY);
    vel = classic_clip(vel, -MC_MAX_SPEED, MC_MAX_SPEED);
    double pos = classic_clip(e->pos + vel, MC_MIN_POS, MC_MAX_POS);
    if (pos == MC_MIN_POS && vel < 0) vel = 0;
    e->pos = pos;
    e->vel = vel;
    *terminal = pos >= MC_GOAL_POS && vel >= MC_GOAL_VEL;
    *reward = -1.0f;
    mc_obs(e, obs);
}

/* The hill 0.45 sin(3 x) + 0.55 (gymnasium's picture), the flag at the goal, the car on the slope. */
static double mc_height(double x) { return 0.45 * sin(3 * x) + 0.55; }

static void mc_render(const void *st, unsigned char *rgb, int h, int w) {
    const mountaincar *e = st;
    const double span = MC_MAX_POS - MC_MIN_POS;
    draw_view v = draw_begin(rgb, h, w, MC_MIN_POS, MC_MAX_POS, 0.0, 1.2, kDrawWhite);
    const int n = w > 1 ? w : 2;
    for (int i = 0; i < n; i++) {
        double xa = MC_MIN_POS + span * i / n, xb = MC_MIN_POS + span * (i + 1) / n;
        draw_line(&v, xa, mc_height(xa), xb, mc_height(xb), 0.015, kDrawBlack);
    }
    double fy = mc_height(MC_GOAL_POS);
    draw_line(&v, MC_GOAL_POS, fy, MC_GOAL_POS, fy + 0.1, 0.01, kDrawBlack);
    draw_rect(&v, MC_GOAL_POS + 0.025, fy + 0.085, 0.05, 0.03, kDrawGreen);
    draw_disc(&v, e->pos, mc_height(e->pos) + 0.04, 0.04, kDrawRed);
}

static const float mc_low[2] = {(float)MC_MIN_POS, -(float)MC_MAX_SPEED};
static const float mc_high[2] = {(float)MC_MAX_POS, (float)MC_MAX_SPEED};

const sm_env_spec sm_env_mountaincar = {
    .name = "classic/mountaincar",
    .about = "MountainCar-v0: drive an under-powered car up a hill; -1 per step, 200-step limit",
    .obs_c = 2, .obs_h = 1, .obs_w = 1,
    .obs_low = mc_low, .obs_high = mc_high,
    .act_kind = SM_SPACE_DISCRETE, .act_n = 3,
    .max_steps = 200,
    .state_bytes = sizeof(mountaincar),
    .init = classic_init, .reset = mc_reset, .step = mc_step,
    .render = mc_render,
};
