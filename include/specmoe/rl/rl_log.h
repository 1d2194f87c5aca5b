/* The run directory of an RL agent: settings.json, metrics.jsonl in CleanRL's vocabulary, and the
 * progress line. Shared by every agent (src/rl/rl_log.c). */
#ifndef SPECMOE_RL_LOG_H
#define SPECMOE_RL_LOG_H

#include "specmoe/rl/agent.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    FILE *metrics;        /* NULL: no run directory */
    char path[4096];      /* metrics.jsonl, for messages */
    FILE *progress;
    double every, t0, last;
    long frames0;         /* frames at start (resume) for SPS */
} sm_rl_log;

/* Opens out_dir/metrics.jsonl (appending on resume) and writes out_dir/settings.json with the env,
 * agent, every option of cfg, the network and the run's seed and frame budget. */
sm_status sm_rl_log_open(sm_rl_log *l, const sm_rl_run *run, const sm_agent_kind *k, const void *cfg,
                         const sm_model_config *net, long frames0, sm_error *err);
/* One metrics.jsonl record: {"global_step": step, key: value, ...} (NaN values are left out). */
sm_status sm_rl_log_record(sm_rl_log *l, long step, const char *const *keys, const double *vals, int n, sm_error *err);
/* Steps per second since the start of this process's part. */
double sm_rl_log_sps(const sm_rl_log *l, long frames);
/* The progress line when due: "frames F/T  return R  SPS S  <extra>". */
void sm_rl_log_progress(sm_rl_log *l, long frames, long total, double ret, const char *extra);
sm_status sm_rl_log_close(sm_rl_log *l, sm_error *err);

/* The settings of cfg as a JSON object (every option of kind k); the caller frees it. */
struct cJSON *sm_agent_config_to_json(const sm_agent_kind *k, const void *cfg);
sm_status sm_agent_config_from_json(const sm_agent_kind *k, void *cfg, const struct cJSON *o, const char *what,
                                    sm_error *err);
/* Settings JSON as this build writes it: parsed (an option the text lacks takes its default) and
 * printed again, unformatted; NULL when it does not parse. A checkpoint written before an option
 * existed compares equal to a run that leaves it at its default, which is the old behaviour by the
 * rule that a new option's default keeps what the code did before. The caller frees it. */
char *sm_agent_settings_canonical(const sm_agent_kind *k, const char *json);

#ifdef __cplusplus
}
#endif
#endif
