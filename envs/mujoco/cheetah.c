/* A planar cheetah-like runner (the model is the project's own MJCF, below; the tasks follow
 * DeepMind Control's cheetah, Tassa et al. 2018, and the cheetah variants of URLB, Laskin et al. 2021,
 * used as task sequences in continual RL). A torso with a back and a front leg (thigh, shin, foot:
 * 6 hinge joints, motors with gears 120/90/60 and 120/60/30) moves in the x-z plane through the
 * root joints rootx (slide), rootz (slide) and rooty (hinge).
 *
 *   timestep 0.01 s, frame skip 5: one step is dt = 0.05 s; 1000 steps (50 s), then truncation
 *   actions: box [-1, 1]^6, one per motor (clipped)
 *   observation (17): qpos without rootx (rootz, rooty, 6 joint angles) then qvel (9)
 *   start: qpos0 + U(-0.1, 0.1) per coordinate, qvel = 0.1 N(0, 1) (gymnasium's HalfCheetah)
 *   termination: none (as dm_control)
 *   control cost: none (dm_control's and URLB's cheetah rewards have none); every reward is in [0, 1]
 *
 * Rewards, with v = qvel[rootx] (forward speed, m/s), z = torso height (m), w = qvel[rooty] (angular
 * velocity about +y, rad/s; positive pitches the head down, a front flip). dm_control's
 * tolerance(x, bounds=(target, inf), margin=target, sigmoid='linear', value_at_margin=0) is the ramp
 * min(max(x / target, 0), 1):
 *   cheetah-run           min(max(v / 10, 0), 1)          (dm_control cheetah run, speed 10)
 *   cheetah-run-backward  min(max(-v / 10, 0), 1)         (URLB run_backward)
 *   cheetah-jump          min(max((z - 0.6) / 0.6, 0), 1) (torso 0.6 m above its standing height
 *                         of about 0.6 m earns the full reward; the project's choice)
 *   cheetah-flip          min(max(w / 5, 0), 1)           (URLB flip, spin speed 5; URLB reads the
 *                         torso's subtree angular momentum, here its angular velocity)
 * The four tasks share the model, the spaces and the start distribution, so an agent can be trained
 * through them in sequence. */
#include <math.h>

#include "mjenv.h"

#define CH_FRAME_SKIP 5
#define CH_STEPS 1000
#define CH_RUN_SPEED 10.0
#define CH_SPIN_SPEED 5.0
#define CH_STAND_Z 0.6 /* torso height standing (measured: tests/test_env_mujoco.c) */
#define CH_JUMP_HEIGHT 0.6
#define CH_OBS 17
#define CH_ACT 6

/* Proportions: a 1 m torso 0.7 m above the ground at qpos0, legs of about 0.65 m. Only the body
 * touches the ground (contype 1 / conaffinity 0 against the floor's conaffinity 1). */
static const char kCheetahXml[] =
    "<mujoco model='specmoe-cheetah'>\n"
    "  <compiler angle='degree'/>\n"
    "  <option timestep='0.01'/>\n"
    "  <default>\n"
    "    <joint type='hinge' axis='0 1 0' limited='true' armature='0.1' damping='3' stiffness='10'/>\n"
    "    <geom type='capsule' size='0.046' condim='3' friction='0.8 0.1 0.1' contype='1' conaffinity='0'/>\n"
    "    <motor ctrllimited='true' ctrlrange='-1 1'/>\n"
    "  </default>\n"
    "  <worldbody>\n"
    "    <geom name='floor' type='plane' size='0 0 1' conaffinity='1'/>\n"
    "    <body name='torso' pos='0 0 0.7'>\n"
    "      <joint name='rootx' type='slide' axis='1 0 0' limited='false' armature='0' damping='0' stiffness='0'/>\n"
    "      <joint name='rootz' type='slide' axis='0 0 1' limited='false' armature='0' damping='0' stiffness='0'/>\n"
    "      <joint name='rooty' type='hinge' axis='0 1 0' limited='false' armature='0' damping='0' stiffness='0'/>\n"
    "      <geom name='torso' fromto='-0.5 0 0 0.5 0 0'/>\n"
    "      <geom name='head' fromto='0.5 0 0 0.68 0 0.16' size='0.042'/>\n"
    "      <body name='bthigh' pos='-0.5 0 0'>\n"
    "        <joint name='bthigh' range='-30 60' stiffness='240' damping='6'/>\n"
    "        <geom fromto='0 0 0 0.1 0 -0.26'/>\n"
    "        <body name='bshin' pos='0.1 0 -0.26'>\n"
    "          <joint name='bshin' range='-45 45' stiffness='180' damping='4.5'/>\n"
    "          <geom fromto='0 0 0 -0.28 0 -0.15'/>\n"
    "          <body name='bfoot' pos='-0.28 0 -0.15'>\n"
    "            <joint name='bfoot' range='-25 45' stiffness='120' damping='3'/>\n"
    "            <geom fromto='0 0 0 0.04 0 -0.2'/>\n"
    "          </body>\n"
    "        </body>\n"
    "      </body>\n"
    "      <body name='fthigh' pos='0.5 0 0'>\n"
    "        <joint name='fthigh' range='-60 40' stiffness='180' damping='4.5'/>\n"
    "        <geom fromto='0 0 0 -0.13 0 -0.23'/>\n"
    "        <body name='fshin' pos='-0.13 0 -0.23'>\n"
    "          <joint name='fshin' range='-70 50' stiffness='120' damping='3'/>\n"
    "          <geom fromto='0 0 0 0.12 0 -0.21'/>\n"
    "          <body name='ffoot' pos='0.12 0 -0.21'>\n"
    "            <joint name='ffoot' range='-30 30' stiffness='60' damping='1.5'/>\n"
    "            <geom fromto='0 0 0 0.05 0 -0.14'/>\n"
    "          </body>\n"
    "        </body>\n"
    "      </body>\n"
    "    </body>\n"
    "  </worldbody>\n"
    "  <actuator>\n"
    "    <motor joint='bthigh' gear='120'/>\n"
    "    <motor joint='bshin' gear='90'/>\n"
    "    <motor joint='bfoot' gear='60'/>\n"
    "    <motor joint='fthigh' gear='120'/>\n"
    "    <motor joint='fshin' gear='60'/>\n"
    "    <motor joint='ffoot' gear='30'/>\n"
    "  </actuator>\n"
    "</mujoco>\n";

/* mjData sizes: at most 460 stack values, 22 constraint rows and 5 contacts were used in 20k steps of
 * random and bang-bang actions */
static mjenv_model g_model = {"cheetah.xml", kCheetahXml, 50000, 200, 50, NULL};

typedef enum { CH_RUN, CH_RUN_BACKWARD, CH_JUMP, CH_FLIP } cheetah_task;

typedef struct {
    mjenv_base b; /* first (mjenv.h) */
} cheetah;

static sm_status ch_prepare(sm_error *err) { return mjenv_load(&g_model, err); }

static void ch_init(void *st, uint64_t seed, const sm_env_opts *opts) {
    (void)opts;
    mjenv_init(st, &g_model, CH_FRAME_SKIP, seed);
}

static void ch_obs(const cheetah *e, float *obs) {
    const mjData *d = e->b.d;
    for (int i = 1; i < 9; i++) obs[i - 1] = (float)d->qpos[i];
    for (int i = 0; i < 9; i++) obs[8 + i] = (float)d->qvel[i];
}

static void ch_reset(void *st, float *obs) {
    cheetah *e = st;
    mjenv_reset(&e->b, 0.1, 0.1);
    ch_obs(e, obs);
}

static double ramp(double x, double target) { return mjenv_tolerance(x, target, INFINITY, target, MJENV_LINEAR, 0.0); }

/* The task's reward on the current state (the formulas of the top comment). */
static double ch_reward(const cheetah *e, cheetah_task task) {
    const mjData *d = e->b.d;
    switch (task) {
    case CH_RUN: return ramp(d->qvel[0], CH_RUN_SPEED);
    case CH_RUN_BACKWARD: return ramp(-d->qvel[0], CH_RUN_SPEED);
    case CH_JUMP: return ramp(d->xpos[3 + 2] - CH_STAND_Z, CH_JUMP_HEIGHT); /* body 1 is the torso */
    case CH_FLIP: return ramp(d->qvel[2], CH_SPIN_SPEED);
    }
    return 0.0;
}

static void ch_step(cheetah_task task, void *st, const float *a, float *obs, float *reward, unsigned char *terminal) {
    cheetah *e = st;
    mjenv_advance(&e->b, a);
    *reward = (float)ch_reward(e, task);
    *terminal = 0;
    ch_obs(e, obs);
}

MJENV_TASK_STEP(ch_step_run, ch_step, CH_RUN)
MJENV_TASK_STEP(ch_step_run_backward, ch_step, CH_RUN_BACKWARD)
MJENV_TASK_STEP(ch_step_jump, ch_step, CH_JUMP)
MJENV_TASK_STEP(ch_step_flip, ch_step, CH_FLIP)

/* following the torso, 4 m wide, ground a little below the middle */
static void ch_render(const void *st, unsigned char *rgb, int h, int w) {
    const mjenv_base *b = st;
    mjenv_render(b, rgb, h, w, 2, b->d->xpos[3], 0.5, 4.0, 0, 0, 0);
}

static const float ch_act_low[CH_ACT] = {-1, -1, -1, -1, -1, -1}, ch_act_high[CH_ACT] = {1, 1, 1, 1, 1, 1};

#define CH_SPEC(task_name, about_text, step_fn)                                                                        \
    {MJENV_SPEC_FIELDS(task_name, about_text, CH_OBS, CH_ACT, ch_act_low, ch_act_high, CH_STEPS, cheetah, ch_prepare,         \
                       ch_init, ch_reset, step_fn, ch_render)}

const sm_env_spec sm_env_cheetah_run =
    CH_SPEC("cheetah-run", "planar cheetah (MuJoCo): run forward, reward min(v/10, 1) as dm_control; 1000 steps", ch_step_run);
const sm_env_spec sm_env_cheetah_run_backward =
    CH_SPEC("cheetah-run-backward", "planar cheetah (MuJoCo): run backward, reward min(-v/10, 1) as URLB; 1000 steps",
            ch_step_run_backward);
const sm_env_spec sm_env_cheetah_jump =
    CH_SPEC("cheetah-jump", "planar cheetah (MuJoCo): jump, reward for torso height above standing; 1000 steps", ch_step_jump);
const sm_env_spec sm_env_cheetah_flip =
    CH_SPEC("cheetah-flip", "planar cheetah (MuJoCo): flip, reward min(w/5, 1) for pitch rate as URLB; 1000 steps", ch_step_flip);
