/* specmoe train: a classifier on Fashion-MNIST (an MLP from --arch, or the SR-MoE network), with
 * any router, optimiser and schedule; writes metrics.jsonl and checkpoints to the run directory. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/dist/dist.h"
#include "specmoe/dist/ep.h"
#include "specmoe/methods/sphere/sphere.h"

/* every train flag but the router options (router_flags below) */
typedef struct {
    cli_data_opts d;
    const char *arch, *act, *router, *expert_act, *out, *resume, *optim, *schedule;
    int residual, shared, expert_bias, epochs;
    int log_every, val_size;
    long warmup, ckpt_every, stop_after, fault_nan_step, fault_kill_step, dist_check;
    int fault_rank, expert_parallel;
    double lr, final_lr, momentum, beta1, beta2, eps, weight_decay, clip;
    int stages, width;
    double spectral_alpha, sigma_t, rho_t, diversity_beta, sphere_rho;
    const char *model, *stem, *penalty_target, *sphere_mode, *sphere_gram;
    uint64_t seed;
} opts;

/* sm_train's after_backward for `--sphere-rho`: SPHERE's gradient added with its App. A.3 coefficient */
static sm_status sphere_after_backward(sm_model *m, double loss, int T, void *user, sm_error *err) {
    (void)m, (void)err;
    sm_sphere_stats s;
    sm_sphere_step(user, NULL, 0, loss, T, &s);
    return SM_OK;
}

/* The router flags, generated from the option tables (sm_router_opt) of the routers that can be
 * trained: the shared options, then each router's own, one flag per name; the help line names the
 * routers that list the flag ("[vmf, grassmann] initial concentration kappa"). The values are parsed
 * into val[] and copied into an sm_router_config by router_flags_apply. */
#define MAX_ROUTER_FLAGS 64
typedef struct {
    int n, n_shared;                      /* flags; the first n_shared are the shared options */
    const sm_router_opt *opt[MAX_ROUTER_FLAGS]; /* the first option with this flag */
    int owns_key[MAX_ROUTER_FLAGS];       /* no earlier flag sets the same field (tau does: temperature) */
    union {
        int i;
        double d;
        uint64_t u;
    } val[MAX_ROUTER_FLAGS];
    char name[MAX_ROUTER_FLAGS][32], users[MAX_ROUTER_FLAGS][96], help[MAX_ROUTER_FLAGS][192];
    const fl_flag *row[MAX_ROUTER_FLAGS]; /* its row in the parsed table, after router_flags_bind */
} router_flags;

static int rf_find(const router_flags *rf, const char *name) {
    for (int i = 0; i < rf->n; i++)
        if (!strcmp(rf->name[i], name)) return i;
    return -1;
}

static void rf_add(router_flags *rf, const sm_router_opt *o, const char *router) {
    char name[32];
    sm_router_opt_flag(o, name, sizeof name);
    int i = rf_find(rf, name);
    if (i < 0) {
        if (rf->n == MAX_ROUTER_FLAGS) abort(); /* raise MAX_ROUTER_FLAGS */
        i = rf->n++;
        rf->opt[i] = o;
        strcpy(rf->name[i], name);
        rf->users[i][0] = 0;
        rf->owns_key[i] = 1;
        for (int j = 0; j < i; j++)
            if (!strcmp(rf->opt[j]->key, o->key)) rf->owns_key[i] = 0;
    }
    if (router && i >= rf->n_shared) {
        size_t at = strlen(rf->users[i]);
        snprintf(rf->users[i] + at, sizeof rf->users[i] - at, "%s%s", at ? ", " : "", router);
    }
}

/* Writes the router flag rows into fl (room for MAX_ROUTER_FLAGS); returns their number. */
static int router_flags_rows(router_flags *rf, fl_flag *fl) {
    int n;
    const sm_router_opt *shared = sm_router_shared_opts(&n);
    rf->n = rf->n_shared = 0;
    for (int i = 0; i < n; i++) rf_add(rf, &shared[i], NULL);
    rf->n_shared = rf->n;
    for (int r = 0; r < sm_router_count(); r++) {
        const sm_router_ops *ops = sm_router_at(r);
        if (ops->built_from) continue; /* not trained: its options belong to the command that builds it */
        for (int i = 0; i < ops->n_opts; i++) rf_add(rf, &ops->opts[i], ops->name);
    }
    for (int i = 0; i < rf->n; i++) {
        const sm_router_opt *o = rf->opt[i];
        if (rf->users[i][0]) snprintf(rf->help[i], sizeof rf->help[i], "[%s] %s", rf->users[i], o->help);
        else snprintf(rf->help[i], sizeof rf->help[i], "%s", o->help);
        fl_type t = o->type == SM_OPT_NUM ? FL_DOUBLE : o->type == SM_OPT_BOOL ? FL_BOOL
                    : o->type == SM_OPT_U64 ? FL_U64 : FL_INT;
        fl[i] = (fl_flag){rf->name[i], t, &rf->val[i], o->def, rf->help[i], 0};
    }
    return rf->n;
}

/* After parsing: the row of each router flag (rows were copied into the table fl_parse filled). */
static void router_flags_bind(router_flags *rf, const fl_flag *fl, int nfl) {
    for (int i = 0; i < rf->n; i++) rf->row[i] = fl_find(fl, nfl, rf->name[i]);
}

static void rf_copy(const router_flags *rf, int i, const sm_router_opt *o, sm_router_config *c) {
    char *f = (char *)c + o->offset;
    if (o->type == SM_OPT_NUM) *(double *)f = rf->val[i].d;
    else if (o->type == SM_OPT_U64) *(uint64_t *)f = rf->val[i].u;
    else *(int *)f = rf->val[i].i;
}

/* the flag that sets key for router ops: its own option with that key, else the flag owning the key */
static int rf_for_key(const router_flags *rf, const sm_router_ops *ops, const char *key) {
    char name[32];
    for (int i = 0; i < ops->n_opts; i++)
        if (!strcmp(ops->opts[i].key, key)) return rf_find(rf, sm_router_opt_flag(&ops->opts[i], name, sizeof name));
    for (int i = 0; i < rf->n; i++)
        if (rf->owns_key[i] && !strcmp(rf->opt[i]->key, key)) return i;
    return -1;
}

typedef struct {
    const router_flags *rf;
    const sm_router_ops *ops;
} rf_given_ctx;

static int rf_given(const void *user, const char *key) {
    const rf_given_ctx *g = user;
    int i = rf_for_key(g->rf, g->ops, key);
    return i >= 0 && g->rf->row[i] && g->rf->row[i]->set;
}

/* Fills c (naming router ops, its own options at their defaults) from the flags: the shared flags,
 * then the router's own flags that were given (so --tau, not --temperature, sets a prototype
 * router's temperature), then the router's defaults for what was not given. A flag given for an
 * option of other routers only is refused, naming them. */
static sm_status router_flags_apply(const router_flags *rf, const sm_router_ops *ops, int batch, sm_router_config *c,
                                    sm_error *err) {
    for (int i = 0; i < rf->n_shared; i++) rf_copy(rf, i, rf->opt[i], c);
    char name[32];
    for (int i = rf->n_shared; i < rf->n; i++) {
        int mine = 0;
        for (int j = 0; j < ops->n_opts && !mine; j++) mine = !strcmp(sm_router_opt_flag(&ops->opts[j], name, sizeof name), rf->name[i]);
        if (!mine && rf->row[i] && rf->row[i]->set)
            return sm_fail(err, SM_ERR_ARG, "--%s is an option of the %s router%s, not of %s", rf->name[i], rf->users[i],
                           strchr(rf->users[i], ',') ? "s" : "", ops->name);
    }
    for (int i = 0; i < ops->n_opts; i++) {
        int j = rf_find(rf, sm_router_opt_flag(&ops->opts[i], name, sizeof name));
        if (j >= 0 && (rf->row[j]->set || ops->opts[i].offset < offsetof(sm_router_config, own))) rf_copy(rf, j, &ops->opts[i], c);
    }
    rf_given_ctx ctx = {rf, ops};
    sm_router_given g = {rf_given, &ctx, batch};
    if (ops->defaults) ops->defaults(c, &g);
    return SM_OK;
}

/* progress: a bar on a terminal, plain lines otherwise */
typedef struct {
    int tty;
    long last_plain;
} log_ctx;

static void on_log(const sm_log_record *r, void *user) {
    log_ctx *c = user;
    if (r->final == -1) { /* validation at an epoch end */
        if (c->tty) fprintf(stderr, "\n");
        fprintf(stderr, "epoch %d: validation loss %.4f accuracy %.4f\n", r->epoch, r->loss, r->acc);
        return;
    }
    char moe[160] = "";
    if (r->n_moe)
        snprintf(moe, sizeof moe, " | H %.2f CV %.2f drop %ld", r->routing[0].entropy, r->routing[0].cv, r->dropped[0]);
    double frac = r->total_steps ? (double)r->step / r->total_steps : 1;
    double eta = frac > 0 ? r->elapsed_s * (1 - frac) / frac : 0;
    if (c->tty) {
        char bar[31];
        int filled = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < filled ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r[%s] %ld/%ld loss %.4f acc %.3f lr %.2e %.0f tok/s ETA %.0fs%s\033[K", bar, r->step,
                r->total_steps, r->loss, r->acc, r->lr, r->tokens_per_s, eta, moe);
        if (r->final) fprintf(stderr, "\n");
    } else {
        fprintf(stderr, "step %ld/%ld epoch %d loss %.4f acc %.4f lr %.3e gnorm %.3f %.0f tok/s %.1fs%s\n", r->step,
                r->total_steps, r->epoch, r->loss, r->acc, r->lr, r->grad_norm, r->tokens_per_s, r->elapsed_s, moe);
    }
}

static int flag_set(const fl_flag *fl, int n, const char *name) {
    const fl_flag *f = fl_find(fl, n, name);
    return f && f->set;
}

/* Router options from the flags, with the router-dependent defaults; validated by creating it. */
static int build_router_config(const opts *o, const router_flags *rf, int d, sm_router_config *r, sm_error *err) {
    sm_router_config_default(r);
    const sm_router_ops *ops = sm_router_find(o->router);
    if (ops && ops->built_from)
        return sm_fail(err, SM_ERR_ARG, "--router %s is built from %s, not trained: specmoe eval CHECKPOINT --router %s",
                       ops->name, ops->built_from, ops->name);
    sm_status st = sm_router_config_set(r, o->router, err); /* an unknown name: the known ones listed */
    if (st != SM_OK) return st;
    int cap = rf_find(rf, "capacity");
    if (rf->row[cap]->set && !(rf->val[cap].d > 0))
        return sm_fail(err, SM_ERR_ARG, "--capacity: the capacity factor must be > 0 (leave the flag out for no limit)");
    st = router_flags_apply(rf, ops, o->d.batch, r, err);
    if (st != SM_OK) return st;
    /* validate now, before any data is read */
    sm_router *probe = sm_router_create(r, d, err);
    if (!probe) return SM_ERR_ARG;
    sm_router_free(probe);
    return SM_OK;
}

/* the rows the model's activations are reserved for: the training batch, and at least 1000 so that
 * evaluation runs in large batches */
static int train_rows(int batch) { return batch < 1000 ? 1000 : batch; }

static int build_model_config(opts *o, router_flags *rf, const fl_flag *fl, int nfl, sm_model_config *mc, sm_error *err) {
    sm_model_config_default(mc);
    sm_status st;
    if (!strcmp(o->model, "srmoe")) {
        int stem[4], n = 0;
        for (const char *p = o->stem; *p;) {
            char *end;
            if (n == 4) return sm_fail(err, SM_ERR_ARG, "--stem: at most 4 stem convolutions ('%s' has more)", o->stem);
            long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > 4096 || (*end && *end != ',')) return sm_fail(err, SM_ERR_ARG, "--stem: '%s' is not a list of channel counts", o->stem);
            stem[n++] = (int)v;
            p = *end ? end + 1 : end;
        }
        st = sm_model_arch_srmoe(mc, o->stages, o->width, stem, n, err);
        /* SR-MoE's defaults: prototype routing over 4 experts, dense mixture */
        if (!flag_set(fl, nfl, "router")) o->router = "prototype";
        if (!flag_set(fl, nfl, "experts")) rf->val[rf_find(rf, "experts")].i = 4;
        mc->in_c = 1;
        mc->in_h = mc->in_w = 28;
    } else if (!strcmp(o->model, "mlp")) {
        st = sm_model_parse_arch(mc, o->arch, err);
    } else {
        return sm_fail(err, SM_ERR_ARG, "--model: unknown model '%s' (mlp|srmoe)", o->model);
    }
    if (st != SM_OK) return st;
    mc->spectral_alpha = o->spectral_alpha;
    mc->sigma_t = o->sigma_t;
    mc->rho_t = o->rho_t;
    mc->diversity_beta = o->diversity_beta;
    if (strcmp(o->penalty_target, "gate") && strcmp(o->penalty_target, "prototypes"))
        return sm_fail(err, SM_ERR_ARG, "--penalty-target: '%s' is not gate or prototypes", o->penalty_target);
    mc->penalty_on_prototypes = !strcmp(o->penalty_target, "prototypes");
    if (o->spectral_alpha < 0 || o->diversity_beta < 0 || o->sigma_t < 0 || o->rho_t < 0 || o->sphere_rho < 0)
        return sm_fail(err, SM_ERR_ARG, "--spectral-alpha, --diversity-beta, --sigma-t, --rho-t and --sphere-rho must be >= 0");
    sm_sphere_mode sm;
    if (sm_sphere_mode_parse(o->sphere_mode, &sm))
        return sm_fail(err, SM_ERR_ARG, "--sphere-mode: '%s' is not grad, loss or fixed", o->sphere_mode);
    sm_sphere_gram sg;
    if (sm_sphere_gram_parse(o->sphere_gram, &sg))
        return sm_fail(err, SM_ERR_ARG, "--sphere-gram: '%s' is not feature or gradient", o->sphere_gram);
    if (sm_act_parse(o->act, &mc->act) || sm_act_parse(o->expert_act, &mc->moe.act))
        return sm_fail(err, SM_ERR_ARG, "--act/--expert-act: unknown activation (none|relu|gelu|tanh|silu)");
    mc->residual = o->residual;
    /* the width each MoE layer sees, for the k_r <= d check */
    int w = mc->in_dim, dmin = 1 << 30;
    for (int i = 0; i < mc->n_layers; i++) {
        if (mc->layers[i].kind == SM_LAYER_DENSE) w = mc->layers[i].width;
        else if (mc->layers[i].kind == SM_LAYER_MOE && w < dmin) dmin = w;
    }
    st = build_router_config(o, rf, dmin < (1 << 30) ? dmin : w, &mc->moe.router, err);
    if (st != SM_OK) return st;
    mc->moe.n_shared = o->shared;
    mc->moe.expert_bias = o->expert_bias;
    if (o->shared < 0) return sm_fail(err, SM_ERR_ARG, "--shared: must be >= 0");
    /* shapes that do not fit (a kernel larger than its input, ...) are refused here, before any data
     * is read: build the model once on a 1-row batch for Fashion-MNIST's 1 x 28 x 28 input */
    sm_model_config probe = *mc;
    probe.in_dim = 784;
    if (probe.in_c == 0) probe.in_c = 1, probe.in_h = probe.in_w = 28;
    /* a model far larger than memory is refused with the figure before anything large is allocated
     * (the probe below allocates the parameters): it would be killed by the OOM killer a few steps in */
    sm_model_memory mem;
    if ((st = sm_model_estimate_memory(&probe, train_rows(o->d.batch), &mem, err)) != SM_OK) return st;
    size_t avail = sm_available_memory_bytes();
    if (avail && mem.train_bytes > avail) {
        const double gib = 1024.0 * 1024 * 1024;
        return sm_fail(err, SM_ERR_NOMEM, "the model needs about %.1f GiB to train (%zu parameters: %.1f GiB x 4 with "
                       "gradients and optimiser moments, x 3 more while a checkpoint is written; activations %.1f GiB "
                       "for a batch of %d) but this machine has %.1f GiB available", mem.train_bytes / gib, mem.params,
                       mem.param_bytes / gib, mem.act_bytes / gib, train_rows(o->d.batch), avail / gib);
    }
    sm_model *pm = sm_model_create(&probe, 1, NULL, err);
    if (!pm) return SM_ERR_ARG;
    sm_model_free(pm);
    return SM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* the run's settings: saved beside the metrics and in every checkpoint, restored on resume */

/* What a resumed run may change: its length (the schedule then spans the new length), where the
 * data are, the threads, and how often it logs and saves. Every other saved setting is the run's:
 * typed again with another value, it is refused. */
static const char *const kResumeMayChange[] = {"epochs", "data", "threads", "log-every", "ckpt-every"};
/* Never taken from the checkpoint: where to resume from and where to write, and the one-off stops. */
static const char *const kResumeNotSaved[] = {"resume",         "out",        "stop-after", "fault-nan-step",
                                               "fault-kill-step", "fault-rank", "dist-check", "expert-parallel"};

static int name_in(const char *name, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, list[i])) return 1;
    return 0;
}

/* What cmd_train frees on every return: the restored settings (string flags point into it) and the
 * settings text the checkpoints store. */
typedef struct {
    cJSON *saved;
    char *settings;
    char made[4096]; /* the run directory new_run_dir made, while training has not started ("" after) */
} train_keep;

/* --resume: takes every saved setting the user did not type, refuses a typed one that differs
 * (exit 2, naming it), and marks the flags the original run was given as given, so that defaults
 * which depend on whether a flag was given (a router's balance coefficient) come out the same.
 * A checkpoint written before settings were saved restores nothing: the flags describe its run. */
static int restore_settings(fl_flag *fl, int nfl, const char *path, train_keep *keep) {
    sm_error err;
    char *text;
    sm_status st = sm_checkpoint_read_meta(path, "settings", &text, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    if (!text) {
        fprintf(stderr, "specmoe train: note: %s stores no settings (an older checkpoint): the flags must describe its run\n",
                path);
        return 0;
    }
    cJSON *root = keep->saved = cJSON_Parse(text);
    free(text);
    const cJSON *flags = cJSON_GetObjectItemCaseSensitive(root, "flags"), *given = cJSON_GetObjectItemCaseSensitive(root, "given");
    if (!cJSON_IsObject(flags) || !cJSON_IsArray(given)) {
        fprintf(stderr, "specmoe: %s: __metadata__.settings is malformed\n", path);
        return CLI_EXIT_RUNTIME;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, flags) {
        fl_flag *f = (fl_flag *)fl_find(fl, nfl, item->string);
        if (!f || name_in(f->name, kResumeNotSaved, SM_LEN(kResumeNotSaved))) continue; /* unknown: a newer version's */
        char buf[64], mine[4200];
        const char *v = fl_json_text(f, item, buf, sizeof buf);
        if (!v && !cJSON_IsNull(item)) {
            fprintf(stderr, "specmoe: %s: __metadata__.settings: --%s has a value of the wrong type\n", path, f->name);
            return CLI_EXIT_RUNTIME;
        }
        if (f->set) {
            if (name_in(f->name, kResumeMayChange, SM_LEN(kResumeMayChange))) continue;
            if (strcmp(fl_format(f, mine, sizeof mine), v ? v : "")) {
                fprintf(stderr, "specmoe: --%s %s conflicts with the checkpoint's %s (resume keeps the run's settings)\n",
                        f->name, mine, v ? v : "(unset)");
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        if (!v) *(const char **)f->dst = NULL;
        else if (fl_set(f, v, "train")) return CLI_EXIT_RUNTIME;
    }
    cJSON_ArrayForEach(item, given) {
        fl_flag *f = cJSON_IsString(item) ? (fl_flag *)fl_find(fl, nfl, item->valuestring) : NULL;
        if (f && !name_in(f->name, kResumeNotSaved, SM_LEN(kResumeNotSaved))) f->set = 1;
    }
    return 0;
}

/* Every flag's value (defaults included) and the names typed on the command line, as JSON:
 * formatted for OUT/settings.json, and on one line (*line) for the checkpoints. */
static char *settings_json(const fl_flag *fl, int nfl, char **line) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "command", "train");
    cJSON_AddStringToObject(o, "version", CLI_VERSION);
    cJSON_AddItemToObject(o, "flags", fl_to_json(fl, nfl));
    cJSON *given = cJSON_AddArrayToObject(o, "given");
    for (int i = 0; i < nfl; i++)
        if (fl[i].set) cJSON_AddItemToArray(given, cJSON_CreateString(fl[i].name));
    char *pretty = cJSON_Print(o);
    *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return pretty;
}

/* A new run directory, never an earlier run's: runs/train-YYYYmmdd-HHMMSS, or with -2, -3, ... when
 * that exists (mkdir is atomic, so two runs started in the same second get two directories). */
static sm_status new_run_dir(char *buf, size_t n, sm_error *err) {
    time_t t = time(NULL);
    struct tm tm;
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime_r(&t, &tm));
    if (mkdir("runs", 0755) != 0 && errno != EEXIST) return sm_fail(err, SM_ERR_IO, "runs: cannot create: %s", strerror(errno));
    for (int k = 1; k < 1000; k++) {
        if (k == 1) snprintf(buf, n, "runs/train-%s", stamp);
        else snprintf(buf, n, "runs/train-%s-%d", stamp, k);
        if (mkdir(buf, 0755) == 0) return SM_OK;
        if (errno != EEXIST) return sm_fail(err, SM_ERR_IO, "%s: cannot create: %s", buf, strerror(errno));
    }
    return sm_fail(err, SM_ERR_IO, "runs/train-%s: 999 run directories of that second exist", stamp);
}

static int train_main(int argc, char **argv, train_keep *keep);

/* Ctrl-C (SIGINT) or SIGTERM during training: the handler only sets the flag sm_train polls after
 * every step (it then saves a checkpoint and returns). SA_RESETHAND: a second Ctrl-C kills at once. */
static volatile sig_atomic_t g_stop;
/* Under mpirun (more than one rank): the ranks (g_dist), the step the loop is in (written by sm_train)
 * and the descriptor of the real stderr (ranks other than 0 silence stdout and stderr: they would
 * print what rank 0 prints). */
static sm_dist g_dist = {.size = 1};
static volatile long g_step = -1;
static int g_err_fd = 2;

/* the decimal digits of v into b (async-signal-safe: used by the handler), returns the length */
static int fmt_long(char *b, long v) {
    char t[24];
    int n = 0, len = 0;
    if (v < 0) b[len++] = '-', v = -v;
    do t[n++] = (char)('0' + v % 10), v /= 10;
    while (v && n < 22);
    while (n) b[len++] = t[--n];
    return len;
}

static void on_stop_signal(int sig) {
    g_stop = sig;
    if (g_dist.size > 1) {
        /* mpirun sends SIGTERM to every rank when one dies or exits with an error (it names that
         * rank); a rank blocked in a collective never reaches the next step, so say where it was */
        char msg[160];
        int n = 0;
        const char *a = "specmoe: rank ", *b = ": stopped by SIGTERM in step ",
                   *c = " (when a rank dies, mpirun stops the job and names it); the last checkpoint is intact\n";
        for (const char *p = a; *p; p++) msg[n++] = *p;
        n += fmt_long(msg + n, g_dist.rank);
        for (const char *p = b; *p; p++) msg[n++] = *p;
        n += fmt_long(msg + n, g_step);
        for (const char *p = c; *p && n < (int)sizeof msg - 1; p++) msg[n++] = *p;
        ssize_t w = write(g_err_fd, msg, (size_t)n);
        (void)w;
    }
}
static void catch_stop_signals(int on) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on ? on_stop_signal : SIG_DFL;
    sa.sa_flags = on ? SA_RESETHAND : 0;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* 1 on every rank when any rank failed (failed != 0) at this point */
static int dist_any(int failed) {
    double x = failed != 0;
    sm_error e;
    if (sm_dist_max(&g_dist, &x, 1, &e) != SM_OK) return 1;
    return x > 0;
}

/* The gradient allreduce between backward and optimiser, and the kill test's fault: rank
 * --fault-rank (the last by default) kills itself at step --fault-kill-step, before the allreduce. */
typedef struct {
    long kill_step;
    int kill_rank;
} dist_hook_ctx;
/* The routed experts' parameters this process holds (all E of every moe layer, or E/P of them when
 * expert parallel has split the model's table), with the bytes of values, gradients and the
 * optimiser's two moments: the memory the split divides by the rank count. */
static void print_expert_memory(const sm_model *m) {
    size_t n = 0;
    for (int i = 0; i < sm_model_n_moe(m); i++) {
        const sm_moe *moe = sm_model_moe(m, i);
        const int routed[] = {moe->ip[0], moe->ip[1], moe->ip[2], moe->ip[3], moe->ip[8], moe->ip[9]};
        for (int k = 0; k < (int)SM_LEN(routed); k++)
            if (routed[k] >= 0) n += m->params.p[routed[k]].numel;
    }
    if (n == 0) return;
    const double mib = (double)n * sizeof(sm_real) / (1 << 20);
    printf("specmoe train: expert parameters per rank: %zu values, %zu bytes (%.2f MiB; %.2f MiB with gradients and "
           "2 optimiser moments)\n", n, n * sizeof(sm_real), mib, 4 * mib);
}

static sm_status dist_step_hook(sm_params *ps, void *user, sm_error *err) {
    const dist_hook_ctx *h = user;
    if (h->kill_step >= 0 && g_step == h->kill_step && g_dist.rank == h->kill_rank) raise(SIGKILL);
    return sm_dist_grad_mean(&g_dist, ps, err);
}

int cmd_train(int argc, char **argv) {
    train_keep keep = {NULL, NULL, ""};
    sm_error err;
    if (sm_dist_init(&g_dist, &argc, &argv, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    if (g_dist.rank != 0) {
        /* rank 0 alone prints; the others keep the real stderr for the signal handler's message */
        g_err_fd = dup(2);
        if (g_err_fd < 0) g_err_fd = 2;
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) g_err_fd = 2;
    }
    int rc = train_main(argc, argv, &keep);
    if (rc != 0 && keep.made[0] && g_dist.rank == 0) {
        /* refused before training (no data, ...): the new directory holds only what the checks and
         * settings.json put there; leave no empty run behind */
        char path[4200];
        snprintf(path, sizeof path, "%s/settings.json", keep.made);
        remove(path);
        snprintf(path, sizeof path, "%s/metrics.jsonl", keep.made);
        struct stat sb;
        if (stat(path, &sb) == 0 && sb.st_size == 0) remove(path);
        rmdir(keep.made);
    }
    cJSON_Delete(keep.saved);
    free(keep.settings);
    sm_dist_finalize(&g_dist);
    return rc;
}

static int train_main(int argc, char **argv, train_keep *keep) {
    opts o;
    char router_help[512], built[256] = "";
    for (int r = 0; r < sm_router_count(); r++) { /* routers made by another command (ev: by eval) */
        const sm_router_ops *ops = sm_router_at(r);
        size_t at = strlen(built);
        if (ops->built_from)
            snprintf(built + at, sizeof built - at, " (%s is built from %s: specmoe eval CHECKPOINT --router %s)", ops->name,
                     ops->built_from, ops->name);
    }
    cli_router_help(router_help, sizeof router_help, "router: ", built);
    static router_flags rf;
    fl_flag head[] = {
        CLI_DATA_FLAGS(o.d),
        {"val-size", FL_INT, &o.val_size, "0", "hold out the last N training examples for per-epoch validation", 0},
        {"arch", FL_STRING, &o.arch, "dense:256,moe:256", "layers: dense:W | ffn:H | moe:H, comma-separated", 0},
        {"act", FL_STRING, &o.act, "relu", "activation of dense layers and ffn (none|relu|gelu|tanh|silu)", 0},
        {"residual", FL_BOOL, &o.residual, "0", "ffn/moe layers add their input to their output", 0},
        {"router", FL_STRING, &o.router, "topk", router_help, 0},
    }, tail[] = {
        {"shared", FL_INT, &o.shared, "0", "always-on shared experts per MoE layer", 0},
        {"expert-act", FL_STRING, &o.expert_act, "relu", "expert activation", 0},
        {"expert-bias", FL_BOOL, &o.expert_bias, "1", "experts have biases", 0},
        {"model", FL_STRING, &o.model, "mlp", "mlp (layers from --arch) or srmoe (conv stem + stages)", 0},
        {"stages", FL_INT, &o.stages, "2", "srmoe: stacked MoE stages", 0},
        {"width", FL_INT, &o.width, "64", "srmoe: stage width d", 0},
        {"stem", FL_STRING, &o.stem, "16,32", "srmoe: channels of the 3x3 stride-2 stem convolutions", 0},
        {"spectral-alpha", FL_DOUBLE, &o.spectral_alpha, "0", "weight alpha of the spectral-norm + stable-rank penalties", 0},
        {"sigma-t", FL_DOUBLE, &o.sigma_t, "1", "target spectral norm sigma_t", 0},
        {"rho-t", FL_DOUBLE, &o.rho_t, "2", "target stable rank rho_t", 0},
        {"diversity-beta", FL_DOUBLE, &o.diversity_beta, "0", "weight beta of the CV^2 diversity loss", 0},
        {"penalty-target", FL_STRING, &o.penalty_target, "gate", "gate (linear map feeding the router) or prototypes", 0},
        {"sphere-rho", FL_DOUBLE, &o.sphere_rho, "0",
         "SPHERE (Eq. 26, App. A.3): ratio rho of the penalty on the last MoE layer's routing-weighted expert features; 0 = off", 0},
        {"sphere-mode", FL_STRING, &o.sphere_mode, "grad", "SPHERE's coefficient: grad (rho ||g|| / ||grad L||), loss (rho |L| / L_sphere) or fixed (rho)", 0},
        {"sphere-gram", FL_STRING, &o.sphere_gram, "feature",
         "SPHERE's Gram: feature (Eq. 19) or gradient (Table 1's ablation, Eq. 20: the last hidden expert layer's backprop vectors of "
         "u^T logits, u a fixed unit direction from --seed; needs a last moehead layer with relu experts)", 0},
        {"epochs", FL_INT, &o.epochs, "12", "training epochs", 0},
        {"optim", FL_STRING, &o.optim, "adamw", "optimiser (sgd|adam|adamw)", 0},
        {"lr", FL_DOUBLE, &o.lr, "1e-3", "peak learning rate", 0},
        {"schedule", FL_STRING, &o.schedule, "cosine", "learning-rate schedule (constant|linear|cosine)", 0},
        {"warmup", FL_LONG, &o.warmup, "200", "linear warm-up steps", 0},
        {"final-lr", FL_DOUBLE, &o.final_lr, "0", "learning rate at the end of linear/cosine schedules", 0},
        {"momentum", FL_DOUBLE, &o.momentum, "0.9", "SGD momentum", 0},
        {"beta1", FL_DOUBLE, &o.beta1, "0.9", "Adam beta1", 0},
        {"beta2", FL_DOUBLE, &o.beta2, "0.999", "Adam beta2", 0},
        {"eps", FL_DOUBLE, &o.eps, "1e-8", "Adam epsilon", 0},
        {"weight-decay", FL_DOUBLE, &o.weight_decay, "0.0001", "weight decay (decoupled for adamw)", 0},
        {"clip", FL_DOUBLE, &o.clip, "0", "global gradient-norm clipping (0 = off)", 0},
        {"seed", FL_U64, &o.seed, "1", "seed of initialisation, data order and noise", 0},
        {"out", FL_STRING, &o.out, NULL, "run directory (settings.json, metrics.jsonl, checkpoint.safetensors); unset: a new runs/train-DATE-TIME, or the resumed checkpoint's directory", 0},
        {"log-every", FL_INT, &o.log_every, "100", "steps between log lines / metrics records", 0},
        {"ckpt-every", FL_LONG, &o.ckpt_every, "0", "steps between checkpoints (0 = every epoch end)", 0},
        {"resume", FL_STRING, &o.resume, NULL, "continue from this checkpoint with its run's settings (a typed flag must agree, but --epochs, --data, --threads, --log-every, --ckpt-every)", 0},
        {"stop-after", FL_LONG, &o.stop_after, "0", "stop after this many steps in total (0 = all epochs)", 0},
        {"fault-nan-step", FL_LONG, &o.fault_nan_step, "-1", "testing aid: poison a gradient at this step", 0},
        {"fault-rank", FL_INT, &o.fault_rank, "-1", "testing aid under mpirun: the rank --fault-nan-step poisons (-1 = every rank) and --fault-kill-step kills (-1 = the last)", 0},
        {"fault-kill-step", FL_LONG, &o.fault_kill_step, "-1", "testing aid under mpirun: rank --fault-rank kills itself (SIGKILL) at this step", 0},
        {"dist-check", FL_LONG, &o.dist_check, "0", "under mpirun: compare a hash of the parameters over the ranks every N steps (0 = never)", 0},
        {"expert-parallel", FL_INT, &o.expert_parallel, "0", "under mpirun: 1 splits the experts of every moe layer over the ranks (tokens travel by all-to-all)", 0},
    };
    /* head, the router flags, tail */
    fl_flag fl[SM_LEN(head) + MAX_ROUTER_FLAGS + SM_LEN(tail)];
    int nfl = (int)SM_LEN(head), npos;
    memcpy(fl, head, sizeof head);
    nfl += router_flags_rows(&rf, fl + nfl);
    memcpy(fl + nfl, tail, sizeof tail);
    nfl += (int)SM_LEN(tail);
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 2, "train", "[flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    router_flags_bind(&rf, fl, nfl);
    if (o.resume && (rc = restore_settings(fl, nfl, o.resume, keep)) != 0) return rc;

    sm_error err;
    sm_model_config mc;
    sm_train_config tc;
    sm_train_config_default(&tc);
    sm_status st = build_model_config(&o, &rf, fl, nfl, &mc, &err);
    if (st != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    if (sm_opt_parse(o.optim, &tc.opt.kind)) {
        fprintf(stderr, "specmoe train: --optim: unknown optimiser '%s' (sgd|adam|adamw)\n", o.optim);
        return CLI_EXIT_USAGE;
    }
    if (sm_sched_parse(o.schedule, &tc.sched)) {
        fprintf(stderr, "specmoe train: --schedule: unknown schedule '%s' (constant|linear|cosine)\n", o.schedule);
        return CLI_EXIT_USAGE;
    }
    if (o.epochs < 1 || o.d.batch < 1 || o.d.batch > 65536 || o.lr < 0 || o.warmup < 0 || o.clip < 0 || o.log_every < 1 ||
        o.val_size < 0 || o.d.per_class < 0) {
        fprintf(stderr, "specmoe train: --epochs, --batch (<= 65536) and --log-every must be >= 1; --lr, --warmup, "
                        "--clip, --val-size, --per-class must be >= 0\n");
        return CLI_EXIT_USAGE;
    }
    if (o.d.threads < 1) {
        fprintf(stderr, "specmoe train: --threads must be >= 1 (got %d)\n", o.d.threads);
        return CLI_EXIT_USAGE;
    }
    /* the schedule decays from --lr to --final-lr: a negative end trains by gradient ascent, and an end
     * above the peak makes the schedule rise */
    if (o.final_lr < 0) {
        fprintf(stderr, "specmoe train: --final-lr must be >= 0 (got %g)\n", o.final_lr);
        return CLI_EXIT_USAGE;
    }
    if (o.final_lr > o.lr) {
        fprintf(stderr, "specmoe train: --final-lr (%g) must not exceed --lr (%g)\n", o.final_lr, o.lr);
        return CLI_EXIT_USAGE;
    }
    tc.epochs = o.epochs;
    tc.batch = o.d.batch;
    tc.opt.lr = o.lr;
    tc.opt.momentum = o.momentum;
    tc.opt.beta1 = o.beta1;
    tc.opt.beta2 = o.beta2;
    tc.opt.eps = o.eps;
    tc.opt.weight_decay = o.weight_decay;
    tc.final_lr = o.final_lr;
    tc.warmup = o.warmup;
    tc.clip = o.clip;
    tc.seed = o.seed;
    tc.log_every = o.log_every;
    tc.ckpt_every = o.ckpt_every;
    tc.resume = o.resume;
    /* the class subset goes into the checkpoint (as numbers, in label order), so eval uses it */
    char classes[128] = "";
    {
        int cl[64];
        int n = sm_parse_class_list(o.d.classes, cl, 64, 10 /* Fashion-MNIST */, &err);
        if (n < 0) return cli_fail(SM_ERR_ARG, &err);
        for (int i = 0, used = 0; n < 10 /* Fashion-MNIST */ && i < n; i++)
            used += snprintf(classes + used, sizeof classes - (size_t)used, "%s%d", i ? "," : "", cl[i]);
        tc.classes = classes;
    }
    tc.stop_after = o.stop_after;
    tc.inject_nan_step = o.fault_nan_step;
    sm_optim probe;
    sm_params none;
    sm_params_init_table(&none);
    if (sm_optim_init(&probe, &tc.opt, &none, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    sm_optim_free(&probe);
    cli_set_threads(o.d.threads);
    /* the run directory is checked before the data are loaded, not at the first checkpoint. Without
     * --out: a resumed run goes on in its checkpoint's directory, a new run gets a new directory */
    char out_dir[4096];
    if (o.out && !*o.out) {
        fprintf(stderr, "specmoe train: --out: the path is empty\n");
        return CLI_EXIT_USAGE;
    }
    if (!o.out && o.resume) {
        const char *slash = strrchr(o.resume, '/');
        snprintf(out_dir, sizeof out_dir, "%.*s", slash ? (int)(slash - o.resume) : 1, slash ? o.resume : ".");
        if (!out_dir[0]) strcpy(out_dir, "/");
        o.out = out_dir;
    } else if (!o.out) {
        /* under mpirun rank 0 names the new directory and tells the others */
        st = g_dist.rank == 0 ? new_run_dir(out_dir, sizeof out_dir, &err) : SM_OK;
        if (dist_any(st != SM_OK)) return st != SM_OK ? cli_fail(st, &err) : CLI_EXIT_RUNTIME;
        if ((st = sm_dist_bcast(&g_dist, out_dir, sizeof out_dir, 0, &err)) != SM_OK) return cli_fail(st, &err);
        if (g_dist.rank == 0) snprintf(keep->made, sizeof keep->made, "%s", out_dir);
        o.out = out_dir;
    }
    tc.out_dir = o.out;
    /* rank 0 writes the run directory; every rank learns whether it could */
    st = g_dist.rank == 0 ? sm_train_check_out(o.out, &err) : SM_OK;
    if (dist_any(st != SM_OK)) return st != SM_OK ? cli_fail(st, &err) : CLI_EXIT_RUNTIME;
    /* the full settings beside the metrics, and in every checkpoint for a resume */
    char path[4200];
    snprintf(path, sizeof path, "%s/settings.json", o.out);
    char *pretty = settings_json(fl, nfl, &keep->settings);
    errno = 0;
    int bad_settings = g_dist.rank == 0 && cli_write_text(path, pretty) != 0;
    free(pretty);
    tc.settings = keep->settings;
    if (dist_any(bad_settings || !tc.settings)) {
        if (bad_settings || !tc.settings)
            fprintf(stderr, "specmoe: %s: cannot write: %s\n", path, errno ? strerror(errno) : "out of memory");
        return CLI_EXIT_RUNTIME;
    }
    printf("specmoe train: run directory %s (settings.json, metrics.jsonl, checkpoint.safetensors)\n", o.out);

    /* on resume, sm_train refuses a checkpoint whose model differs from the one the flags describe */
    sm_dataset train, test, val = {0};
    st = cli_load_split(&train, &o.d, "train", 1, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    st = cli_load_split(&test, &o.d, "test", 0, &err);
    if (st != SM_OK) {
        sm_dataset_free(&train);
        return cli_fail(st, &err);
    }
    if (o.val_size > 0) {
        if (o.val_size >= train.n) {
            fprintf(stderr, "specmoe train: --val-size %d leaves no training data (%d examples)\n", o.val_size, train.n);
            return CLI_EXIT_USAGE;
        }
        /* the last val_size examples (file order) become the validation set */
        val.n = o.val_size;
        val.dim = train.dim;
        val.n_classes = train.n_classes;
        val.x = train.x + (size_t)(train.n - o.val_size) * train.dim;
        val.y = train.y + (train.n - o.val_size);
        train.n -= o.val_size;
    }
    mc.in_dim = train.dim;
    mc.n_classes = train.n_classes;
    if (train.dim == 784 && mc.in_c == 0) mc.in_c = 1, mc.in_h = mc.in_w = 28; /* Fashion-MNIST images */
    sm_rng rng;
    sm_rng_seed(&rng, o.seed);
    sm_model *m = sm_model_create(&mc, train_rows(o.d.batch), &rng, &err);
    if (!m) return cli_fail(SM_ERR_ARG, &err);
    /* SPHERE: its penalty's gradient joins each step's right after the base backward */
    sm_sphere_config sc = {.rho = o.sphere_rho, .seed = o.seed};
    sm_sphere_reg *sphere = NULL;
    sm_sphere_mode_parse(o.sphere_mode, &sc.mode);
    sm_sphere_gram_parse(o.sphere_gram, &sc.gram);
    if (o.sphere_rho > 0) {
        if (!(sphere = sm_sphere_reg_create(&sc, m, &err))) {
            sm_model_free(m);
            sm_dataset_free(&train);
            sm_dataset_free(&test);
            return cli_fail(SM_ERR_ARG, &err);
        }
        tc.after_backward.fn = sphere_after_backward;
        tc.after_backward.user = sphere;
    }
    char arch[512];
    sm_model_format_arch(&mc, arch, sizeof arch);
    printf("specmoe train: %s, %d train / %d test examples, %zu parameters (%zu active per token), %d threads\n", arch,
           train.n, test.n, m->params.total, sm_model_active_params(m), omp_get_max_threads());
    /* data parallel under mpirun: every rank trains on its shard of each batch (sm_train_dist) */
    sm_train_dist td;
    dist_hook_ctx hctx = {o.fault_kill_step, o.fault_rank >= 0 ? o.fault_rank : g_dist.size - 1};
    if (g_dist.size > 1) {
        if (o.d.batch < g_dist.size) {
            fprintf(stderr, "specmoe train: --batch %d is smaller than the %d ranks (each needs an example)\n", o.d.batch,
                    g_dist.size);
            sm_model_free(m);
            sm_dataset_free(&train);
            sm_dataset_free(&test);
            return CLI_EXIT_USAGE;
        }
        sm_dist_train_bind(&g_dist, &td, &tc.hook);
        tc.hook.fn = dist_step_hook;
        tc.hook.user = &hctx;
        td.check_every = o.dist_check;
        td.fault_rank = o.fault_rank;
        td.current_step = &g_step;
        tc.dist = &td;
        printf("specmoe train: data parallel over %d ranks (MPI), %d examples per rank per batch of %d\n", g_dist.size,
               o.d.batch / g_dist.size, o.d.batch);
    }
    /* expert parallel: the experts of every moe layer split over the ranks, on top of the data
     * parallelism above (include/specmoe/dist/ep.h, sm_ep_model_attach) */
    sm_ep_model *epm = NULL;
    if (o.expert_parallel) {
        if (o.expert_parallel != 1 || g_dist.size < 2 || sphere || !(epm = sm_ep_model_attach(&g_dist, m, &err))) {
            if (o.expert_parallel != 1) fprintf(stderr, "specmoe train: --expert-parallel is 0 or 1 (got %d)\n", o.expert_parallel);
            else if (sphere) fprintf(stderr, "specmoe train: --expert-parallel 1: --sphere-rho reads the whole parameter "
                                             "vector, which split experts do not give a rank; train SPHERE data parallel\n");
            else if (g_dist.size < 2) fprintf(stderr, "specmoe train: --expert-parallel 1 needs 2 or more ranks: start it with mpirun -np N\n");
            else fprintf(stderr, "specmoe train: --expert-parallel 1: %s\n", err.msg);
            sm_sphere_reg_free(sphere);
            sm_model_free(m);
            sm_dataset_free(&train);
            sm_dataset_free(&test);
            return CLI_EXIT_USAGE;
        }
        sm_ep_model_bind_train(epm, &td);
        printf("specmoe train: expert parallel: each rank runs and holds %d of the experts of every moe layer "
               "(%zu parameter values on this rank)\n", mc.moe.router.E / g_dist.size, m->params.total);
    }
    print_expert_memory(m);
    {
        /* a warm-up longer than the run means the learning rate never reaches --lr */
        long steps = (long)((train.n + tc.batch - 1) / tc.batch) * tc.epochs;
        if (tc.stop_after > 0 && tc.stop_after < steps) steps = tc.stop_after;
        if (tc.warmup > steps)
            fprintf(stderr, "specmoe train: warning: --warmup %ld is longer than the run (%ld steps): the learning rate "
                            "never reaches --lr %g\n", tc.warmup, steps, tc.opt.lr);
    }
    fflush(stdout);
    log_ctx lc = {isatty(2), 0};
    sm_train_result res;
    g_stop = 0;
    tc.stop = &g_stop;
    catch_stop_signals(1);
    keep->made[0] = 0; /* from here on the directory holds a run */
    st = sm_train(m, &train, val.n ? &val : NULL, &tc, on_log, &lc, &res, &err);
    catch_stop_signals(0);
    if (st == SM_ERR_NUMERIC && sm_ep_model_error(epm)) /* the NaN came from a failed exchange: say so */
        st = sm_fail(&err, SM_ERR_IO, "%s", sm_ep_model_error(epm));
    int code = 0;
    if (st == SM_OK && res.interrupted) {
        if (lc.tty) fprintf(stderr, "\n");
        fprintf(stderr, "specmoe: interrupted at step %ld; resume with: specmoe train --resume %s/checkpoint.safetensors\n",
                res.step, o.out);
        code = 128 + (int)g_stop; /* the shell's code for death by that signal: 130 for SIGINT */
    } else if (st != SM_OK) {
        code = cli_fail(st, &err);
        /* the checkpoint holds another model than the flags describe: a usage error like any other
         * conflict with the resumed run */
        if (st == SM_ERR_MISMATCH && o.resume) code = CLI_EXIT_USAGE;
    } else {
        sm_eval_result ev;
        /* evaluated in batches of --batch, like `specmoe eval` by default: capacity limits depend
         * on the batch, so the two then report the same number */
        st = sm_evaluate_dist(m, &test, o.d.batch, tc.dist, &ev, &err);
        if (st != SM_OK) {
            code = cli_fail(st, &err);
        } else {
            printf("trained %ld steps in %.1f s (%.0f examples/s)\n", res.steps, res.seconds,
                   res.seconds > 0 ? (double)res.steps * o.d.batch / res.seconds : 0);
            cli_print_routing("test", &ev);
            printf("checkpoint: %s/checkpoint.safetensors\n", o.out);
            if (res.best_step >= 0)
                printf("best checkpoint: %s/best.safetensors (step %ld, %s %.4f)\n", o.out, res.best_step,
                       o.val_size > 0 ? "validation accuracy" : "epoch mean training loss",
                       o.val_size > 0 ? res.best_score : -res.best_score);
            printf("final test accuracy: %.4f (loss %.4f, %ld examples)\n", ev.acc, ev.loss, ev.n);
            /* the test accuracy goes into metrics.jsonl too, as the run's last record */
            if (g_dist.rank == 0 && (st = sm_train_log_eval(o.out, "test", res.step, res.epoch, &ev, &err)) != SM_OK)
                code = cli_fail(st, &err);
        }
    }
    printf("peak memory: %.1f MiB\n", (double)sm_peak_rss_bytes() / (1 << 20));
    sm_ep_model_detach(epm);
    sm_sphere_reg_free(sphere);
    sm_model_free(m);
    if (o.val_size > 0) train.n += o.val_size;
    sm_dataset_free(&train);
    sm_dataset_free(&test);
    return code;
}
