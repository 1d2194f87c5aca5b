/* What the MuJoCo environments (envs/mujoco/<family>.c) share: the model of a family, loaded once per
 * process and read by every state; the state's common head (RNG, model, one mjData); the step of the
 * physics; dm_control's reward tolerance; and a 2-D picture of the bodies.
 *
 * Model: a family has one static mjenv_model, filled on first use under a process-wide mutex (so
 * vectors built at once from several threads load it once) and never freed: it is read-only and
 * shared by every state of every vector. Its spec's `prepare` hook loads it, so that a missing or
 * invalid model file is reported by sm_vecenv_init instead of failing inside init.
 *
 * Physics step: dm_control's order, mj_step2 then mj_step1 per substep (after reset, mj_forward), so
 * that after a step every derived quantity (body positions, site positions, subtree velocities) is
 * the one of the new state, at the cost of exactly one mj_step per substep.
 *
 * Tests and benchmarks reach the mjData of a state through its head: every MuJoCo state struct
 * starts with an mjenv_base, and sm_vecenv's states are (N, state_bytes). */
#ifndef SPECMOE_ENVS_MUJOCO_MJENV_H
#define SPECMOE_ENVS_MUJOCO_MJENV_H

#include <mujoco/mujoco.h>

#include "specmoe/rl/env.h"

typedef struct {
    const char *file; /* the name in messages: a path, or the family's embedded MJCF's name */
    const char *xml;  /* embedded MJCF text (loaded through MuJoCo's virtual file system), or NULL: load `file` */
    int nstack, njmax, nconmax; /* the sizes of each state's mjData (mjtNum values of stack, constraint
                                 * rows, contacts); see mjenv_load */
    mjModel *model;   /* NULL until loaded */
} mjenv_model;

/* The head of every MuJoCo environment state (first member). */
typedef struct {
    sm_rng rng;
    const mjModel *m;
    mjData *d; /* owned: made at init, deleted by mjenv_close */
    int frame_skip;
} mjenv_base;

/* Loads mm once (thread-safe); on failure, the reason with the file name. The model's nstack,
 * njmax and nconmax are then set to mm's: MuJoCo 2.2's defaults (a stack of about 1.3M values and
 * 500 constraint rows, whose njmax^2 matrix alone is 2 MB: 13 MB per mjData) would make a vector of
 * 256 environments take gigabytes, while these models use a few thousand stack values and a few
 * dozen rows at most (the family files give the measured peaks). Running out of stack would abort
 * in mj_stackAlloc, and out of rows would drop constraints with a warning, so each family keeps a
 * wide margin. */
sm_status mjenv_load(mjenv_model *mm, sm_error *err);
/* Seeds the RNG and makes the mjData of the (already loaded) model. */
void mjenv_init(mjenv_base *b, mjenv_model *mm, int frame_skip, uint64_t seed);
/* The spec's close hook (any state starting with an mjenv_base; a zeroed one is fine). */
void mjenv_close(void *st);
/* Exact resume: the state struct followed by the mjData values the future depends on (time, qpos,
 * qvel, act, qacc_warmstart); load keeps the destination's model and mjData pointers, copies the
 * values in and recomputes the derived quantities with mj_forward. */
size_t mjenv_save_size(const sm_env_spec *s, const void *st);
void mjenv_save(const sm_env_spec *s, const void *st, void *buf);
void mjenv_load_state(const sm_env_spec *s, void *st, const void *buf);
/* mj_resetData, then qpos = qpos0 + U(-qpos_noise, qpos_noise), qvel = qvel_noise * N(0, 1), then
 * mj_forward. Free joints keep qpos0 (a perturbed quaternion would not be unit). */
void mjenv_reset(mjenv_base *b, double qpos_noise, double qvel_noise);
/* ctrl = a clipped to [-1, 1] (the box every family exposes), then frame_skip substeps. */
void mjenv_advance(mjenv_base *b, const float *a);
/* mean over the actuators of a^2, the control cost's usual form (a already in [-1, 1]) */
double mjenv_ctrl_sq(const mjenv_base *b);

typedef enum { MJENV_GAUSSIAN, MJENV_LINEAR, MJENV_QUADRATIC } mjenv_sigmoid;
/* dm_control's rewards.tolerance: 1 inside [lo, hi], falling outside to value_at_margin at
 * distance `margin` from the nearer bound, with the sigmoid's shape (margin 0: 0 outside). */
double mjenv_tolerance(double x, double lo, double hi, double margin, mjenv_sigmoid s, double value_at_margin);

/* A side view of the geoms: world axis `up` (1: y, 2: z) drawn upwards against x, centred on
 * x = cx, spanning `width` world units; the ground (z = 0 plane) as a line when up = 2; optional
 * extra disc (a target) at (tx, ty) when tr > 0. */
void mjenv_render(const mjenv_base *b, unsigned char *rgb, int h, int w, int up, double cx, double cy,
                  double width, double tx, double ty, double tr);

/* The step function of one task of a family: fn calls impl(task, st, a_box, obs, reward, terminal). */
#define MJENV_TASK_STEP(fn, impl, task)                                                                                \
    static void fn(void *st, const int *a_disc, const float *a, float *obs, float *reward, unsigned char *terminal) { \
        (void)a_disc;                                                                                                  \
        impl(task, st, a, obs, reward, terminal);                                                                      \
    }

/* The fields every MuJoCo spec sets: a vector observation of n_obs values, box actions of n_act
 * values within low/high, the time limit, the state type, the functions, and mjenv_close. */
#define MJENV_SPEC_FIELDS(task_name, about_text, n_obs, n_act, low, high, steps, state_type, prepare_fn, init_fn,     \
                          reset_fn, step_fn, render_fn)                                                                \
    .name = "mujoco/" task_name, .about = about_text, .obs_c = n_obs, .obs_h = 1, .obs_w = 1,                          \
    .act_kind = SM_SPACE_BOX, .act_n = n_act, .act_low = low, .act_high = high, .max_steps = steps,                    \
    .state_bytes = sizeof(state_type), .prepare = prepare_fn, .close = mjenv_close, .init = init_fn, \
    .save_size = mjenv_save_size, .save = mjenv_save, .load = mjenv_load_state,                   \
    .reset = reset_fn, .step = step_fn, .render = render_fn

#endif
