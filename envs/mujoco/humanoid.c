/* The humanoid of MuJoCo's samples (/usr/share/mujoco/model/humanoid/humanoid.xml, Debian's
 * libmujoco-samples: 27 degrees of freedom, 21 motors; the DeepMind Control humanoid's gains) with
 * DeepMind Control's humanoid rewards (Tassa et al. 2018, suite/humanoid.py), an analogue of
 * HumanoidBench's H1 stand/walk/run family. The model file is read at run time; when it is missing
 * the spec's prepare hook makes sm_vecenv_init fail with the path and the package to install.
 *
 *   timestep 0.005 s (the file's), frame skip 5: one step is dt = 0.025 s (dm_control's control
 *   timestep); 1000 steps (25 s), then truncation
 *   actions: box [-1, 1]^21, one per motor (clipped)
 *   observation (57): qpos without the root's x and y (26: torso height, orientation quaternion,
 *   21 joint angles), qvel (27), head height (1), centre-of-mass velocity of the body (3)
 *   start: qpos0 (standing, feet 0.2 m above the floor) + U(-0.01, 0.01) on the hinge joints,
 *   qvel = 0.01 N(0, 1)
 *   termination: torso (root) height below 1.0 m, gymnasium Humanoid's healthy range (dm_control
 *   has none); a fallen humanoid would otherwise spend the rest of a long run on the floor
 *   control cost: dm_control's multiplicative small_control = (4 + mean_i(1 - a_i^2)) / 5, in [0.8, 1]
 *
 * Reward = small_control * standing * upright * move, with tol = dm_control's rewards.tolerance:
 *   standing = tol(head height, bounds (1.4, inf), margin 0.35, gaussian, value 0.1 at the margin)
 *   upright  = tol(torso z-axis . world z, bounds (0.9, inf), margin 1.9, linear, value 0)
 *   stand (speed 0): move = mean over the two horizontal components c of tol(c, (0, 0), margin 2)
 *   walk (1 m/s), run (10 m/s): move = (5 tol(|c_xy|, (speed, inf), margin speed, linear, 0) + 1) / 6
 * where c is the centre-of-mass velocity (subtree_linvel of the torso). */
#include <math.h>

#include "mjenv.h"

#define HU_FILE "/usr/share/mujoco/model/humanoid/humanoid.xml"
#define HU_FRAME_SKIP 5
#define HU_STEPS 1000
#define HU_STAND_HEIGHT 1.4
#define HU_FALL_HEIGHT 1.0
#define HU_OBS 57
#define HU_ACT 21

/* mjData sizes: at most 2,664 stack values, 39 constraint rows and 10 contacts were used in 20k steps
 * of random and bang-bang actions */
static mjenv_model g_model = {HU_FILE, NULL, 100000, 300, 60, NULL};

typedef struct {
    mjenv_base b; /* first (mjenv.h) */
    int head;     /* body id of the head */
} humanoid;

static sm_status hu_prepare(sm_error *err) {
    sm_status st = mjenv_load(&g_model, err);
    if (st != SM_OK) return st;
    const mjModel *m = g_model.model;
    if (m->nu != HU_ACT || m->nq != 28 || m->nv != 27 || mj_name2id(m, mjOBJ_BODY, "head") < 0)
        return sm_fail(err, SM_ERR_FORMAT, "%s: not the sample humanoid (need 21 motors, nq 28, nv 27, a body 'head'; got %d, %d, %d)",
                       HU_FILE, m->nu, m->nq, m->nv);
    return SM_OK;
}

static void hu_init(void *st, uint64_t seed, const sm_env_opts *opts) {
    (void)opts;
    humanoid *e = st;
    mjenv_init(&e->b, &g_model, HU_FRAME_SKIP, seed);
    e->head = mj_name2id(e->b.m, mjOBJ_BODY, "head");
}

/* after the physics: the centre-of-mass velocity (not computed by mj_step1 without a sensor) */
static void hu_derive(humanoid *e) { mj_subtreeVel(e->b.m, e->b.d); }

static void hu_obs(const humanoid *e, float *obs) {
    const mjData *d = e->b.d;
    for (int i = 2; i < 28; i++) obs[i - 2] = (float)d->qpos[i];
    for (int i = 0; i < 27; i++) obs[26 + i] = (float)d->qvel[i];
    obs[53] = (float)d->xpos[3 * e->head + 2];
    for (int i = 0; i < 3; i++) obs[54 + i] = (float)d->subtree_linvel[3 + i]; /* body 1: the torso */
}

static void hu_reset(void *st, float *obs) {
    humanoid *e = st;
    mjenv_reset(&e->b, 0.01, 0.01);
    hu_derive(e);
    hu_obs(e, obs);
}

/* dm_control humanoid's reward at move speed `speed` (the top comment) */
static double hu_reward(const humanoid *e, double speed) {
    const mjModel *m = e->b.m;
    const mjData *d = e->b.d;
    double standing = mjenv_tolerance(d->xpos[3 * e->head + 2], HU_STAND_HEIGHT, INFINITY, HU_STAND_HEIGHT / 4, MJENV_GAUSSIAN, 0.1);
    double upright = mjenv_tolerance(d->xmat[9 + 8], 0.9, INFINITY, 1.9, MJENV_LINEAR, 0.0);
    double small_control = 0;
    for (int i = 0; i < m->nu; i++) small_control += mjenv_tolerance(d->ctrl[i], 0, 0, 1, MJENV_QUADRATIC, 0.0);
    small_control = (4 + small_control / m->nu) / 5;
    const double *c = d->subtree_linvel + 3;
    double move;
    if (speed == 0) move = (mjenv_tolerance(c[0], 0, 0, 2, MJENV_GAUSSIAN, 0.1) + mjenv_tolerance(c[1], 0, 0, 2, MJENV_GAUSSIAN, 0.1)) / 2;
    else move = (5 * mjenv_tolerance(hypot(c[0], c[1]), speed, INFINITY, speed, MJENV_LINEAR, 0.0) + 1) / 6;
    return small_control * standing * upright * move;
}

static void hu_step(double speed, void *st, const float *a, float *obs, float *reward, unsigned char *terminal) {
    humanoid *e = st;
    mjenv_advance(&e->b, a);
    hu_derive(e);
    *reward = (float)hu_reward(e, speed);
    *terminal = e->b.d->qpos[2] < HU_FALL_HEIGHT;
    hu_obs(e, obs);
}

MJENV_TASK_STEP(hu_step_stand, hu_step, 0.0)
MJENV_TASK_STEP(hu_step_walk, hu_step, 1.0)
MJENV_TASK_STEP(hu_step_run, hu_step, 10.0)

/* side view (x-z) following the torso */
static void hu_render(const void *st, unsigned char *rgb, int h, int w) {
    const mjenv_base *b = st;
    mjenv_render(b, rgb, h, w, 2, b->d->xpos[3], 1.0, 3.0, 0, 0, 0);
}

static const float hu_act_low[HU_ACT] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
                   hu_act_high[HU_ACT] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

#define HU_SPEC(task_name, about_text, step_fn)                                                                        \
    {MJENV_SPEC_FIELDS(task_name, about_text, HU_OBS, HU_ACT, hu_act_low, hu_act_high, HU_STEPS, humanoid, hu_prepare,         \
                       hu_init, hu_reset, step_fn, hu_render)}

const sm_env_spec sm_env_humanoid_stand =
    HU_SPEC("humanoid-stand", "MuJoCo sample humanoid: stand (dm_control reward: head height, upright, still); ends below 1 m; 1000 steps",
            hu_step_stand);
const sm_env_spec sm_env_humanoid_walk =
    HU_SPEC("humanoid-walk", "MuJoCo sample humanoid: walk at 1 m/s (dm_control reward); ends below 1 m; 1000 steps",
            hu_step_walk);
const sm_env_spec sm_env_humanoid_run =
    HU_SPEC("humanoid-run", "MuJoCo sample humanoid: run at 10 m/s (dm_control reward); ends below 1 m; 1000 steps",
            hu_step_run);
