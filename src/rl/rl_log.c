/* The run directory of an RL agent (include/specmoe/rl/rl_log.h). */
#include "specmoe/rl/rl_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/train/train.h"

cJSON *sm_agent_config_to_json(const sm_agent_kind *k, const void *cfg) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    for (int i = 0; i < k->n_opts; i++) sm_opt_to_json(&k->opts[i], cfg, o);
    return o;
}

sm_status sm_agent_config_from_json(const sm_agent_kind *k, void *cfg, const cJSON *o, const char *what,
                                    sm_error *err) {
    if (sm_opt_defaults(k->opts, k->n_opts, cfg)) return sm_fail(err, SM_ERR_ARG, "agent %s: a built-in default does not parse", k->name);
    for (int i = 0; i < k->n_opts; i++) {
        sm_status st = sm_opt_from_json(&k->opts[i], cfg, o, what, err);
        if (st != SM_OK) return st;
    }
    return SM_OK;
}

char *sm_agent_settings_canonical(const sm_agent_kind *k, const char *json) {
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    void *cfg = o ? calloc(1, k->cfg_bytes) : NULL;
    sm_error e = {0};
    char *out = NULL;
    if (cfg && sm_agent_config_from_json(k, cfg, o, "agent_settings", &e) == SM_OK) {
        cJSON *c = sm_agent_config_to_json(k, cfg);
        out = c ? cJSON_PrintUnformatted(c) : NULL;
        cJSON_Delete(c);
    }
    free(cfg);
    cJSON_Delete(o);
    return out;
}

/* A resumed run appends to metrics.jsonl from its checkpoint's frame: records written after that
 * frame by the run that stopped (killed before it could checkpoint again) are dropped, and so is a
 * last line cut off mid-write, so that no episode is counted twice. */
static sm_status keep_records_to(const char *path, long frames0, sm_error *err) {
    FILE *in = fopen(path, "r");
    if (!in) return SM_OK; /* nothing logged yet */
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.resume", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fclose(in);
        return sm_fail(err, SM_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    }
    static const char kStep[] = "{\"global_step\": ";
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int bad = 0;
    while (!bad && (n = getline(&line, &cap, in)) > 0) {
        char *end = NULL;
        if (line[n - 1] != '\n' || strncmp(line, kStep, sizeof kStep - 1)) continue; /* cut off, or not a record */
        const long step = strtol(line + sizeof kStep - 1, &end, 10);
        if (end != line + sizeof kStep - 1 && step <= frames0) bad = fputs(line, out) == EOF;
    }
    free(line);
    bad |= ferror(in) != 0;
    fclose(in);
    if (fclose(out) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) {
        remove(tmp);
        return sm_fail(err, SM_ERR_IO, "%s: cannot rewrite it from frame %ld: %s", path, frames0, strerror(errno));
    }
    return SM_OK;
}

sm_status sm_rl_log_open(sm_rl_log *l, const sm_rl_run *run, const sm_agent_kind *k, const void *cfg,
                         const sm_model_config *net, long frames0, sm_error *err) {
    memset(l, 0, sizeof *l);
    l->progress = run->progress;
    l->every = run->progress_every > 0 ? run->progress_every : 5.0;
    l->t0 = l->last = sm_time_now();
    l->frames0 = frames0;
    if (!run->out_dir) return SM_OK;
    sm_status st = sm_train_check_out(run->out_dir, err);
    if (st != SM_OK) return st;
    /* settings.json: everything needed to repeat the run */
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "env", run->env);
    cJSON_AddStringToObject(s, "agent", k->name);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)run->seed);
    cJSON_AddStringToObject(s, "seed", seed);
    cJSON_AddNumberToObject(s, "frames", (double)run->frames);
    cJSON_AddNumberToObject(s, "threads", run->threads);
    cJSON_AddNumberToObject(s, "sticky", run->env_opts.sticky);
    cJSON_AddItemToObject(s, "agent_settings", sm_agent_config_to_json(k, cfg));
    if (net) {
        char *nj = sm_model_config_to_json(net);
        cJSON *n = nj ? cJSON_Parse(nj) : NULL;
        free(nj);
        if (n) cJSON_AddItemToObject(s, "network", n);
    }
    char *text = cJSON_Print(s);
    cJSON_Delete(s);
    char path[4200];
    snprintf(path, sizeof path, "%s/settings.json", run->out_dir);
    FILE *f = fopen(path, "w");
    int bad = !f || !text || fputs(text, f) < 0 || fputc('\n', f) == EOF;
    if (f && fclose(f) != 0) bad = 1;
    free(text);
    if (bad) return sm_fail(err, SM_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    snprintf(l->path, sizeof l->path, "%s/metrics.jsonl", run->out_dir);
    if (run->resume && (st = keep_records_to(l->path, frames0, err)) != SM_OK) return st;
    l->metrics = fopen(l->path, run->resume ? "a" : "w");
    if (!l->metrics) return sm_fail(err, SM_ERR_IO, "%s: cannot open: %s", l->path, strerror(errno));
    return SM_OK;
}

sm_status sm_rl_log_record(sm_rl_log *l, long step, const char *const *keys, const double *vals, int n, sm_error *err) {
    if (!l->metrics) return SM_OK;
    int bad = fprintf(l->metrics, "{\"global_step\": %ld", step) < 0;
    for (int i = 0; i < n && !bad; i++)
        if (isfinite(vals[i])) bad = fprintf(l->metrics, ", \"%s\": %.9g", keys[i], vals[i]) < 0;
    if (!bad) bad = fputs("}\n", l->metrics) == EOF || fflush(l->metrics) != 0;
    if (bad) return sm_fail(err, SM_ERR_IO, "%s: cannot write: %s", l->path, strerror(errno));
    return SM_OK;
}

double sm_rl_log_sps(const sm_rl_log *l, long frames) {
    double dt = sm_time_now() - l->t0;
    return dt > 0 ? (double)(frames - l->frames0) / dt : 0;
}

void sm_rl_log_progress(sm_rl_log *l, long frames, long total, double ret, const char *extra) {
    if (!l->progress) return;
    double now = sm_time_now();
    if (now - l->last < l->every && frames < total) return;
    l->last = now;
    fprintf(l->progress, "frames %ld/%ld  return %s%.2f  SPS %.0f  %s\n", frames, total, isfinite(ret) ? "" : "(none yet) ",
            isfinite(ret) ? ret : 0.0, sm_rl_log_sps(l, frames), extra ? extra : "");
    fflush(l->progress);
}

sm_status sm_rl_log_close(sm_rl_log *l, sm_error *err) {
    sm_status st = SM_OK;
    if (l->metrics && fclose(l->metrics) != 0) st = sm_fail(err, SM_ERR_IO, "%s: cannot write: %s", l->path, strerror(errno));
    l->metrics = NULL;
    return st;
}
