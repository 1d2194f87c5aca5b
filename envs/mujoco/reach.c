/* A reaching arm: a 2-link planar arm in the horizontal x-y plane (the project's own MJCF, below,
 * after DeepMind Control's reacher: links of 0.12 m, an unlimited shoulder and an elbow limited to
 * +-160 degrees, torque motors, no gravity in the plane). Tasks "mujoco/reach-K", K = 0..3, are a
 * sequence of fixed targets at radius 0.17 m and angles 45 + 90 K degrees, scored like MetaWorld
 * (Yu et al. 2019) by a success rate.
 *
 *   timestep 0.01 s, frame skip 2: one step is dt = 0.02 s; 200 steps (4 s), then truncation
 *   actions: box [-1, 1]^2, shoulder and elbow torques (gear 0.05 N m)
 *   observation (10): cos q1, sin q1, cos q2, sin q2, q1', q2', fingertip x, y, target x, y
 *   start: q = U(-0.1, 0.1) per joint, q' = 0.1 N(0, 1): the arm stretched along +x
 *   reward: -|fingertip - target| (m) per step, dense; control cost: none
 *   termination: none; success (the episode log): the fingertip within 0.05 m of the target at the
 *   last step of the episode (MetaWorld's success is likewise a distance threshold, checked at the
 *   end of an evaluation episode)
 * The four tasks share the model, the spaces and the start distribution. */
#include <math.h>

#include "mjenv.h"

#define RE_FRAME_SKIP 2
#define RE_STEPS 200
#define RE_TARGET_RADIUS 0.17
#define RE_SUCCESS_DIST 0.05
#define RE_OBS 10
#define RE_ACT 2

static const char kReachXml[] =
    "<mujoco model='specmoe-reach'>\n"
    "  <compiler angle='degree'/>\n"
    "  <option timestep='0.01' gravity='0 0 0'/>\n"
    "  <default>\n"
    "    <joint type='hinge' axis='0 0 1' damping='0.01' armature='0.0005'/>\n"
    "    <geom type='capsule' size='0.01' contype='0' conaffinity='0'/>\n"
    "    <motor ctrllimited='true' ctrlrange='-1 1' gear='0.05'/>\n"
    "  </default>\n"
    "  <worldbody>\n"
    "    <body name='upper' pos='0 0 0'>\n"
    "      <joint name='shoulder' limited='false'/>\n"
    "      <geom fromto='0 0 0 0.12 0 0'/>\n"
    "      <body name='lower' pos='0.12 0 0'>\n"
    "        <joint name='elbow' limited='true' range='-160 160'/>\n"
    "        <geom fromto='0 0 0 0.11 0 0'/>\n"
    "        <site name='fingertip' pos='0.12 0 0' size='0.01'/>\n"
    "      </body>\n"
    "    </body>\n"
    "  </worldbody>\n"
    "  <actuator>\n"
    "    <motor joint='shoulder'/>\n"
    "    <motor joint='elbow'/>\n"
    "  </actuator>\n"
    "</mujoco>\n";

/* mjData sizes: 36 stack values, one constraint row (the elbow limit), no contacts */
static mjenv_model g_model = {"reach.xml", kReachXml, 10000, 50, 10, NULL};

typedef struct {
    mjenv_base b; /* first (mjenv.h) */
    double target[2];
} reach;

static sm_status re_prepare(sm_error *err) { return mjenv_load(&g_model, err); }

static void re_init(int k, void *st, uint64_t seed) {
    reach *e = st;
    mjenv_init(&e->b, &g_model, RE_FRAME_SKIP, seed);
    double angle = M_PI / 4 + k * M_PI / 2;
    e->target[0] = RE_TARGET_RADIUS * cos(angle);
    e->target[1] = RE_TARGET_RADIUS * sin(angle);
}

static double re_dist(const reach *e) {
    const double *tip = e->b.d->site_xpos; /* site 0: the fingertip */
    return hypot(tip[0] - e->target[0], tip[1] - e->target[1]);
}

static void re_obs(const reach *e, float *obs) {
    const mjData *d = e->b.d;
    obs[0] = (float)cos(d->qpos[0]);
    obs[1] = (float)sin(d->qpos[0]);
    obs[2] = (float)cos(d->qpos[1]);
    obs[3] = (float)sin(d->qpos[1]);
    obs[4] = (float)d->qvel[0];
    obs[5] = (float)d->qvel[1];
    obs[6] = (float)d->site_xpos[0];
    obs[7] = (float)d->site_xpos[1];
    obs[8] = (float)e->target[0];
    obs[9] = (float)e->target[1];
}

static void re_reset(void *st, float *obs) {
    reach *e = st;
    mjenv_reset(&e->b, 0.1, 0.1);
    re_obs(e, obs);
}

static void re_step(void *st, const int *a_disc, const float *a, float *obs, float *reward, unsigned char *terminal) {
    (void)a_disc;
    reach *e = st;
    mjenv_advance(&e->b, a);
    *reward = (float)-re_dist(e);
    *terminal = 0;
    re_obs(e, obs);
}

static void re_episode_end(const void *st, float *score, float *success) {
    (void)score; /* the return */
    *success = re_dist(st) < RE_SUCCESS_DIST ? 1.0f : 0.0f;
}

/* seen from above (y up), the target drawn as its success disc */
static void re_render(const void *st, unsigned char *rgb, int h, int w) {
    const reach *e = st;
    mjenv_render(&e->b, rgb, h, w, 1, 0, 0, 0.6, e->target[0], e->target[1], RE_SUCCESS_DIST);
}

#define RE_INIT(k)                                                                                                     \
    static void re_init_##k(void *st, uint64_t seed, const sm_env_opts *opts) {                                        \
        (void)opts;                                                                                                    \
        re_init(k, st, seed);                                                                                          \
    }
RE_INIT(0)
RE_INIT(1)
RE_INIT(2)
RE_INIT(3)

static const float re_act_low[RE_ACT] = {-1, -1}, re_act_high[RE_ACT] = {1, 1};

#define RE_SPEC(k, angle)                                                                                              \
    {                                                                                                                  \
        MJENV_SPEC_FIELDS("reach-" #k,                                                                                 \
                          "2-link arm (MuJoCo): reach the target at 0.17 m, " angle " degrees; reward -distance, "    \
                          "success within 0.05 m at the end; 200 steps",                                               \
                          RE_OBS, RE_ACT, re_act_low, re_act_high, RE_STEPS, reach, re_prepare, re_init_##k, re_reset, \
                          re_step, re_render),                                                                         \
        .has_success = 1, .episode_end = re_episode_end,                                                               \
    }

const sm_env_spec sm_env_reach_0 = RE_SPEC(0, "45");
const sm_env_spec sm_env_reach_1 = RE_SPEC(1, "135");
const sm_env_spec sm_env_reach_2 = RE_SPEC(2, "225");
const sm_env_spec sm_env_reach_3 = RE_SPEC(3, "315");
