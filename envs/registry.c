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
};

const sm_env_spec *const *sm_env_list(int *n) {
    *n = (int)(sizeof kEnvs / sizeof kEnvs[0]);
    return kEnvs;
}
