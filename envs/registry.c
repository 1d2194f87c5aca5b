/* Every environment, by its exported spec (one line per environment; the spec lives in
 * envs/<family>/<task>.c). Names are "family/task". */
#include "specmoe/rl/env.h"

extern const sm_env_spec sm_env_cartpole;
extern const sm_env_spec sm_env_acrobot;
extern const sm_env_spec sm_env_mountaincar;
extern const sm_env_spec sm_env_pendulum;
extern const sm_env_spec sm_env_minatar_asterix;
extern const sm_env_spec sm_env_minatar_breakout;
extern const sm_env_spec sm_env_minatar_freeway;
extern const sm_env_spec sm_env_minatar_seaquest;
extern const sm_env_spec sm_env_minatar_space_invaders;
extern const sm_env_spec sm_env_cheetah_run;
extern const sm_env_spec sm_env_cheetah_run_backward;
extern const sm_env_spec sm_env_cheetah_jump;
extern const sm_env_spec sm_env_cheetah_flip;
extern const sm_env_spec sm_env_reach_0;
extern const sm_env_spec sm_env_reach_1;
extern const sm_env_spec sm_env_reach_2;
extern const sm_env_spec sm_env_reach_3;
extern const sm_env_spec sm_env_humanoid_stand;
extern const sm_env_spec sm_env_humanoid_walk;
extern const sm_env_spec sm_env_humanoid_run;

static const sm_env_spec *const kEnvs[] = {
    &sm_env_cartpole,
    &sm_env_acrobot,
    &sm_env_mountaincar,
    &sm_env_pendulum,
    &sm_env_minatar_asterix,
    &sm_env_minatar_breakout,
    &sm_env_minatar_freeway,
    &sm_env_minatar_seaquest,
    &sm_env_minatar_space_invaders,
    &sm_env_cheetah_run,
    &sm_env_cheetah_run_backward,
    &sm_env_cheetah_jump,
    &sm_env_cheetah_flip,
    &sm_env_reach_0,
    &sm_env_reach_1,
    &sm_env_reach_2,
    &sm_env_reach_3,
    &sm_env_humanoid_stand,
    &sm_env_humanoid_walk,
    &sm_env_humanoid_run,
};

const sm_env_spec *const *sm_env_list(int *n) {
    *n = (int)(sizeof kEnvs / sizeof kEnvs[0]);
    return kEnvs;
}
