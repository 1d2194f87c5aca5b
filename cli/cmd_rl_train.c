/* specmoe rl train / rl eval CKPT: an agent (src/rl/) on an environment (envs/).
 *
 * The flags of an agent come from its option table (rl/agent.h, core/opt.h), so every option of
 * every agent is a flag with its default and help; the network's MoE settings come from the router
 * option tables the same way. Order in which settings apply:
 *   option defaults -> --preset -> the agent's environment-dependent defaults (for what the user
 *   and the preset left alone) -> the flags the user typed.
 * Without --out a new directory runs/rl-<env>-<agent>-<n> is made, so runs never overwrite each
 * other. Ctrl-C stops at the next step boundary, writes the checkpoint and prints how to resume.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include <cjson/cJSON.h>

#include "specmoe/dist/dist.h"
#include "specmoe/io/safetensors.h"
#include "specmoe/rl/agent.h"
#include "specmoe/rl/rl_log.h"

#define RL_MAX_FLAGS 160

static volatile sig_atomic_t g_stop = 0;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* The value of --NAME VALUE / --NAME=VALUE in argv, before flags are parsed (NULL if absent). */
static const char *find_arg(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 3; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) || strncmp(argv[i] + 2, name, n)) continue;
        if (argv[i][2 + n] == 0 && i + 1 < argc) return argv[i + 1];
        if (argv[i][2 + n] == '=') return argv[i] + 3 + n;
    }
    return NULL;
}

/* What a checkpoint says about its run (resume takes the run's settings from it). */
typedef struct {
    sm_safetensors st;
    int open;
    const char *agent, *env, *settings, *model, *frames_total, *seed, *sticky;
} ckpt_meta;

static int read_ckpt_meta(ckpt_meta *m, const char *path) {
    memset(m, 0, sizeof *m);
    sm_error err = {0};
    if (sm_safetensors_open(&m->st, path, &err) != SM_OK) return cli_fail(err.code ? err.code : SM_ERR_IO, &err);
    m->open = 1;
    m->agent = sm_safetensors_meta(&m->st, "agent");
    m->env = sm_safetensors_meta(&m->st, "env");
    m->settings = sm_safetensors_meta(&m->st, "agent_settings");
    m->model = sm_safetensors_meta(&m->st, "model");
    if (!m->model) m->model = sm_safetensors_meta(&m->st, "network");
    m->frames_total = sm_safetensors_meta(&m->st, "frames_total");
    m->seed = sm_safetensors_meta(&m->st, "seed");
    m->sticky = sm_safetensors_meta(&m->st, "sticky"); /* absent before 2026-11-24: the environment's default */
    if (!m->agent || !m->env || !m->settings) {
        fprintf(stderr, "specmoe: %s: not a checkpoint of specmoe rl train (no agent, env or settings in its metadata)\n", path);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

typedef struct {
    const sm_opt *opt;   /* the option a flag sets */
    int router;          /* 1: a router option (sets the network's router config) */
    const char *text;    /* the value typed */
} opt_flag;

typedef struct {
    opt_flag of[RL_MAX_FLAGS];
    char names[RL_MAX_FLAGS][64];
    int n;
} opt_flags;

static void add_opt_flags(opt_flags *o, fl_flag *fl, int *nfl, const sm_opt *opts, int n, int router) {
    for (int i = 0; i < n && o->n < RL_MAX_FLAGS; i++) {
        char name[64];
        sm_opt_flag(&opts[i], name, sizeof name);
        int dup = 0;
        for (int j = 0; j < *nfl && !dup; j++) dup = !strcmp(fl[j].name, name);
        if (dup) continue;
        opt_flag *f = &o->of[o->n];
        f->opt = &opts[i];
        f->router = router;
        f->text = NULL;
        snprintf(o->names[o->n], sizeof o->names[o->n], "%s", name);
        fl[*nfl] = (fl_flag){o->names[o->n], FL_STRING, &f->text, NULL, opts[i].help, 0};
        (*nfl)++;
        o->n++;
    }
}

static int user_gave(const void *user, const char *key) {
    const opt_flags *o = user;
    for (int i = 0; i < o->n; i++)
        if (!o->of[i].router && o->of[i].text && !strcmp(o->of[i].opt->key, key)) return 1;
    return 0;
}

/* a router option with this JSON key was typed */
static int router_flag_given(const void *user, const char *key) {
    const opt_flags *o = user;
    for (int i = 0; i < o->n; i++)
        if (o->of[i].router && o->of[i].text && !strcmp(o->of[i].opt->key, key)) return 1;
    return 0;
}

/* Keys a preset sets count as given: the agent's environment defaults leave them alone. */
typedef struct {
    const opt_flags *of;
    const char *preset_text;
} given2;

static int user_or_preset_gave(const void *user, const char *key) {
    const given2 *g = user;
    if (user_gave(g->of, key)) return 1;
    if (!g->preset_text) return 0;
    size_t n = strlen(key);
    for (const char *p = g->preset_text; (p = strstr(p, key)); p += n)
        if ((p == g->preset_text || p[-1] == ';') && p[n] == '=') return 1;
    return 0;
}

static void print_agents_help(void) {
    int na, ne;
    const sm_agent_kind *const *all = sm_agent_list(&na);
    const sm_env_spec *const *envs = sm_env_list(&ne);
    printf("\nagents (--agent NAME; the options below are flags: --num-envs 4, --lr 1e-4, ...):\n");
    for (int a = 0; a < na; a++) {
        const sm_agent_kind *k = all[a];
        printf("\n  %s - %s\n", k->name, k->about);
        if (k->presets && k->presets[0]) {
            printf("    presets (--preset):");
            for (const char *const *p = k->presets; p[0]; p += 2) printf(" %s", p[0]);
            printf("\n");
        }
        for (int i = 0; i < k->n_opts; i++) {
            char name[64];
            sm_opt_flag(&k->opts[i], name, sizeof name);
            printf("    --%-18s %s (default %s)\n", name, k->opts[i].help, k->opts[i].def[0] ? k->opts[i].def : "\"\"");
        }
    }
    printf("\nenvironments (--env NAME; specmoe rl envs shows their spaces):\n");
    for (int i = 0; i < ne; i++) {
        printf("  %-22s", envs[i]->name);
        for (int a = 0; a < na; a++) {
            const char *why = all[a]->compatible ? all[a]->compatible(envs[i]) : NULL;
            printf(" %s%s", why ? "-" : "", all[a]->name);
        }
        printf("\n");
    }
    printf("  (a leading '-' marks an agent that cannot run there)\n");
}

/* runs/rl-<env>-<agent>-<n>: the first n that does not exist yet. */
static int fresh_run_dir(char *buf, size_t n, const char *env, const char *agent) {
    char e[64];
    snprintf(e, sizeof e, "%s", env);
    for (char *p = e; *p; p++)
        if (*p == '/') *p = '-';
    for (int i = 1; i < 100000; i++) {
        snprintf(buf, n, "runs/rl-%s-%s-%d", e, agent, i);
        struct stat sb;
        if (stat(buf, &sb) != 0) return 0;
    }
    return -1;
}

/* Loads the agent settings and network of a resumed run; a flag the user typed must agree with the
 * checkpoint (exit 2 naming it otherwise). Returns 0 or an exit code. */
static int resume_settings(const sm_agent_kind *k, const ckpt_meta *cm, void *cfg, sm_model_config *net, const opt_flags *of,
                           const char *path) {
    sm_error err = {0};
    cJSON *o = cJSON_Parse(cm->settings);
    char what[4200];
    snprintf(what, sizeof what, "%s: __metadata__.agent_settings", path);
    sm_status st = o ? sm_agent_config_from_json(k, cfg, o, what, &err) : sm_fail(&err, SM_ERR_FORMAT, "%s is not JSON", what);
    cJSON_Delete(o);
    if (st == SM_OK && cm->model && sm_model_config_from_json(net, cm->model, &err) != SM_OK) st = SM_ERR_FORMAT;
    if (st != SM_OK) return cli_fail(st, &err);
    void *typed = calloc(1, k->cfg_bytes);
    if (!typed) return CLI_EXIT_RUNTIME;
    int code = 0;
    for (int i = 0; i < of->n && !code; i++) {
        if (!of->of[i].text) continue;
        if (of->of[i].router) { /* through the checkpoint's router: another router's flag is refused */
            sm_router_config rc = net->moe.router;
            if (sm_router_config_set_flag(&rc, of->names[i], of->of[i].text, &err) != SM_OK) {
                code = cli_fail(SM_ERR_ARG, &err);
                break;
            }
            char a[300], b[300];
            const sm_router_opt *ro = sm_router_find_opt(sm_router_find(rc.name), of->of[i].opt->key);
            sm_opt_format(ro, &rc, a, sizeof a);
            sm_opt_format(ro, &net->moe.router, b, sizeof b);
            if (strcmp(a, b)) {
                fprintf(stderr, "specmoe rl train: --%s %s conflicts with the checkpoint's %s (resume keeps the run's settings)\n",
                        of->names[i], of->of[i].text, b);
                code = CLI_EXIT_USAGE;
            }
            continue;
        }
        const void *have = cfg;
        memcpy(typed, have, k->cfg_bytes);
        char a[300], b[300];
        if (sm_opt_set(of->of[i].opt, typed, of->of[i].text)) {
            fprintf(stderr, "specmoe rl train: --%s: invalid value '%s'\n", of->names[i], of->of[i].text);
            code = CLI_EXIT_USAGE;
            break;
        }
        sm_opt_format(of->of[i].opt, typed, a, sizeof a);
        sm_opt_format(of->of[i].opt, have, b, sizeof b);
        if (strcmp(a, b)) {
            fprintf(stderr, "specmoe rl train: --%s %s conflicts with the checkpoint's %s (resume keeps the run's settings)\n",
                    of->names[i], of->of[i].text, b);
            code = CLI_EXIT_USAGE;
        }
    }
    free(typed);
    return code;
}

/* SPHERE Fig. 6 (PPO with --diag-every and an MoE actor writes <dir>/fig6.dat): drawn as fig6.png
 * with gnuplot when it is installed; a run without it keeps the data and says so. */
static void draw_fig6(const char *dir) {
    char dat[4200], png[4200], gp[4300];
    if (!dir || strpbrk(dir, "'\"\\\n")) return; /* the path goes into a gnuplot script */
    snprintf(dat, sizeof dat, "%s/fig6.dat", dir);
    snprintf(png, sizeof png, "%s/fig6.png", dir);
    snprintf(gp, sizeof gp, "%s/fig6.gp", dir);
    FILE *f = fopen(dat, "r");
    if (!f) return;
    fclose(f);
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("fig6: %s (gnuplot is not installed: no PNG)\n", dat);
        return;
    }
    if (!(f = fopen(gp, "w"))) return;
    fprintf(f,
            "set terminal pngcairo size 800,600\nset output '%s'\nset title 'SPHERE Fig. 6: routing-weighted features, "
            "held-out states'\nset xlabel 'singular direction 1'\nset ylabel 'singular direction 2'\n"
            "set cblabel 'dominant direction'\nset palette maxcolors 8\nset cbrange [-0.5:7.5]\n"
            "plot '%s' using 1:2:3 with points pt 7 ps 1 palette notitle\n",
            png, dat);
    fclose(f);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>/dev/null", gp);
    if (system(cmd) == 0) printf("fig6: %s\n", png);
}

static int rl_train_main(int argc, char **argv, sm_dist *dist);

/* Under mpirun every rank runs the agent on its own environments (synchronous data parallel: see
 * src/rl/ppo.c and src/rl/dqn.c); rank 0 alone prints, the others' stdout and stderr go to
 * /dev/null (what they would print is rank 0's; an error stops every rank at the same point). */
int cmd_rl_train(int argc, char **argv) {
    sm_dist dist;
    sm_error err;
    if (sm_dist_init(&dist, &argc, &argv, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    if (dist.rank != 0 && (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))) return CLI_EXIT_RUNTIME;
    int rc = rl_train_main(argc, argv, &dist);
    sm_dist_finalize(&dist);
    return rc;
}

static int rl_train_main(int argc, char **argv, sm_dist *dist) {
    /* resume: the run's settings come from its checkpoint */
    static ckpt_meta cm;
    const char *resume_arg = find_arg(argc, argv, "resume");
    if (resume_arg) {
        int rc0 = read_ckpt_meta(&cm, resume_arg);
        if (rc0) return rc0;
    }
    const char *agent_name = find_arg(argc, argv, "agent");
    if (!agent_name) agent_name = resume_arg ? cm.agent : "dqn";
    const sm_agent_kind *k = sm_agent_find(agent_name);
    if (!k) {
        fprintf(stderr, "specmoe rl train: unknown agent '%s' (one of: %s)\n", agent_name, sm_agent_names());
        return CLI_EXIT_USAGE;
    }
    struct {
        const char *env, *agent, *out, *resume, *preset, *router, *init_from;
        uint64_t seed;
        long frames;
        int threads;
        double sticky, progress_every;
        long stop_after, dist_check, fault_nan_update, fault_kill_update;
        int fault_rank;
    } o;
    fl_flag fl[RL_MAX_FLAGS + 16] = {
        {"env", FL_STRING, &o.env, NULL, "environment (specmoe rl envs lists them)", 0},
        {"agent", FL_STRING, &o.agent, "dqn", "agent (listed below)", 0},
        {"stop-after", FL_LONG, &o.stop_after, "0", "checkpoint and stop after this many frames (continue with --resume)", 0},
        {"preset", FL_STRING, &o.preset, NULL, "a named set of the agent's settings (listed below)", 0},
        {"frames", FL_LONG, &o.frames, "0", "environment frames of the run (0: the agent's total_frames)", 0},
        {"seed", FL_U64, &o.seed, "1", "seed of environments, network and exploration", 0},
        {"threads", FL_INT, &o.threads, "1", "OpenMP threads (environments and network); one is often fastest at RL sizes", 0},
        {"out", FL_STRING, &o.out, NULL, "run directory (default: a new runs/rl-<env>-<agent>-<n>)", 0},
        {"resume", FL_STRING, &o.resume, NULL, "continue the run of this checkpoint", 0},
        {"sticky", FL_DOUBLE, &o.sticky, "-1", "MinAtar sticky-action probability (-1: the environment's 0.1)", 0},
        {"progress-every", FL_DOUBLE, &o.progress_every, "5", "seconds between progress lines", 0},
        {"router", FL_STRING, &o.router, "topk", "router of the network's moe layers (specmoe train --help lists them)", 0},
        {"dist-check", FL_LONG, &o.dist_check, "0", "under mpirun: compare a hash of the parameters over the ranks every N updates (0 = never)", 0},
        {"fault-nan-update", FL_LONG, &o.fault_nan_update, "0", "testing aid: poison the loss at this update (0 = never)", 0},
        {"fault-kill-update", FL_LONG, &o.fault_kill_update, "0", "testing aid under mpirun (ppo): rank --fault-rank kills itself (SIGKILL) at this update", 0},
        {"fault-rank", FL_INT, &o.fault_rank, "-1", "testing aid: the rank --fault-nan-update poisons (-1 = every rank) and --fault-kill-update kills (-1 = the last)", 0},
        {"init-from", FL_STRING, &o.init_from, NULL,
         "continual RL: start from this checkpoint's network and observation normaliser (same agent and settings, another "
         "task; ppo only; fresh optimiser moments)", 0},
    };
    int nfl = 17;
    const char *o_router_typed = NULL; /* --router as typed on resume */
    static opt_flags of;
    memset(&of, 0, sizeof of);
    add_opt_flags(&of, fl, &nfl, k->opts, k->n_opts, 0);
    int nr;
    const sm_router_opt *shared = sm_router_shared_opts(&nr);
    add_opt_flags(&of, fl, &nfl, shared, nr, 1);
    for (int r = 0; r < sm_router_count(); r++) {
        const sm_router_ops *ops = sm_router_at(r);
        if (!ops->built_from) add_opt_flags(&of, fl, &nfl, ops->opts, ops->n_opts, 1);
    }
    const char *pos[1];
    int npos;
    int rc = fl_parse(fl, nfl, argc, argv, 3, "rl train", "--env NAME [--agent NAME] [flags]", pos, 0, &npos);
    if (rc == 1) {
        print_agents_help();
        return 0;
    }
    if (rc) return CLI_EXIT_USAGE;
    if (o.resume) {
        if (o.env && strcmp(o.env, cm.env)) {
            fprintf(stderr, "specmoe rl train: --env %s conflicts with the checkpoint's %s (resume keeps the run's settings)\n", o.env, cm.env);
            return CLI_EXIT_USAGE;
        }
        if (strcmp(k->name, cm.agent)) {
            fprintf(stderr, "specmoe rl train: --agent %s conflicts with the checkpoint's %s (resume keeps the run's settings)\n", k->name, cm.agent);
            return CLI_EXIT_USAGE;
        }
        o.env = cm.env;
        const fl_flag *rf = fl_find(fl, nfl, "router");
        if (rf && rf->set) o_router_typed = o.router;
        if (o.preset) {
            fprintf(stderr, "specmoe rl train: --preset cannot change a resumed run (resume keeps the run's settings)\n");
            return CLI_EXIT_USAGE;
        }
    }
    if (o.init_from && (o.resume || strcmp(k->name, "ppo"))) {
        fprintf(stderr, "specmoe rl train: --init-from starts a new ppo run (not with --resume, not for %s)\n", k->name);
        return CLI_EXIT_USAGE;
    }
    if (!o.env) {
        fprintf(stderr, "specmoe rl train: --env is required (one of: %s)\n", sm_env_names());
        return CLI_EXIT_USAGE;
    }
    const sm_env_spec *env = sm_env_find(o.env);
    if (!env) {
        fprintf(stderr, "specmoe rl train: unknown environment '%s' (one of: %s)\n", o.env, sm_env_names());
        return CLI_EXIT_USAGE;
    }
    const char *why = k->compatible ? k->compatible(env) : NULL;
    if (why) {
        fprintf(stderr, "specmoe rl train: --agent %s cannot run on %s: %s\n", k->name, env->name, why);
        return CLI_EXIT_USAGE;
    }
    if (o.threads < 1 || o.frames < 0 || !(o.progress_every > 0) || o.sticky > 1 || o.dist_check < 0) {
        fprintf(stderr, "specmoe rl train: --threads >= 1, --frames >= 0, --progress-every > 0, --sticky <= 1 and --dist-check >= 0 are needed\n");
        return CLI_EXIT_USAGE;
    }
    /* settings: defaults -> preset -> environment defaults -> flags; on resume, the checkpoint's */
    void *cfg = calloc(1, k->cfg_bytes);
    if (!cfg) return CLI_EXIT_RUNTIME;
    sm_error err = {0};
    int code = 0;
    sm_model_config net;
    sm_model_config_default(&net);
    if (o.resume) {
        code = resume_settings(k, &cm, cfg, &net, &of, o.resume);
        if (code) goto out;
        if (o_router_typed && strcmp(o_router_typed, net.moe.router.name)) {
            fprintf(stderr, "specmoe rl train: --router %s conflicts with the checkpoint's %s (resume keeps the run's settings)\n",
                    o_router_typed, net.moe.router.name);
            code = CLI_EXIT_USAGE;
            goto out;
        }
        if (!o.frames && cm.frames_total) o.frames = atol(cm.frames_total);
        if (cm.sticky) o.sticky = atof(cm.sticky); /* settings.json keeps saying what the run uses */
        /* the run's seed (settings.json and the checkpoint name it); a typed one must agree */
        const fl_flag *sf = fl_find(fl, nfl, "seed");
        if (cm.seed) {
            unsigned long long cs = strtoull(cm.seed, NULL, 10);
            if (sf && sf->set && o.seed != cs) {
                fprintf(stderr, "specmoe rl train: --seed %llu conflicts with the checkpoint's %llu (resume keeps the run's settings)\n",
                        (unsigned long long)o.seed, cs);
                code = CLI_EXIT_USAGE;
                goto out;
            }
            o.seed = cs;
        }
        if (!o.out) { /* the run continues in its own directory */
            static char dir[4096];
            snprintf(dir, sizeof dir, "%s", o.resume);
            char *slash = strrchr(dir, '/');
            if (slash) *slash = 0;
            else snprintf(dir, sizeof dir, ".");
            o.out = dir;
        }
        goto settings_done;
    }
    if (sm_opt_defaults(k->opts, k->n_opts, cfg)) {
        fprintf(stderr, "specmoe rl train: agent %s: a built-in default does not parse (a bug)\n", k->name);
        code = CLI_EXIT_RUNTIME;
        goto out;
    }
    const char *preset_text = NULL;
    if (o.preset) {
        if (sm_agent_apply_preset(k, cfg, o.preset, &err) != SM_OK) {
            code = cli_fail(SM_ERR_ARG, &err);
            goto out;
        }
        for (const char *const *p = k->presets; p && p[0]; p += 2)
            if (!strcmp(p[0], o.preset)) preset_text = p[1];
    }
    given2 g = {&of, preset_text};
    if (k->env_defaults) k->env_defaults(cfg, env, user_or_preset_gave, &g);
    /* the router of the network's moe layers: its own options at their defaults, then the flags */
    const sm_router_ops *rops = sm_router_find(o.router);
    if (rops && rops->built_from) {
        fprintf(stderr, "specmoe rl train: --router %s is built from %s, not trained\n", rops->name, rops->built_from);
        code = CLI_EXIT_USAGE;
        goto out;
    }
    if (sm_router_config_set(&net.moe.router, o.router, &err) != SM_OK) {
        code = cli_fail(SM_ERR_ARG, &err);
        goto out;
    }
    for (int i = 0; i < of.n; i++) {
        if (!of.of[i].text) continue;
        if (of.of[i].router ? sm_router_config_set_flag(&net.moe.router, of.names[i], of.of[i].text, &err)
                            : sm_opt_set(of.of[i].opt, cfg, of.of[i].text) ? sm_fail(&err, SM_ERR_ARG, "--%s: invalid value '%s'", of.names[i], of.of[i].text)
                                                                              : SM_OK) {
            code = cli_fail(SM_ERR_ARG, &err);
            goto out;
        }
    }
    if (rops->defaults) { /* router-dependent defaults (topk: load balancing 0.01 unless given) */
        sm_router_given rg = {router_flag_given, &of, 0};
        rops->defaults(&net.moe.router, &rg);
    }
settings_done:
    if (k->check && k->check(cfg, env, &err) != SM_OK) {
        code = cli_fail(SM_ERR_ARG, &err);
        goto out;
    }
    char outbuf[512];
    if (!o.out) {
        /* rank 0 picks the directory (the others would race it) and tells the others */
        outbuf[0] = 0;
        if (dist->rank == 0 && fresh_run_dir(outbuf, sizeof outbuf, env->name, k->name)) outbuf[0] = 0;
        if (sm_dist_bcast(dist, outbuf, sizeof outbuf, 0, &err) != SM_OK || !outbuf[0]) {
            fprintf(stderr, "specmoe rl train: no free run directory under runs/\n");
            code = CLI_EXIT_RUNTIME;
            goto out;
        }
        o.out = outbuf;
    }
    sm_rl_run run = {0};
    run.env = env->name;
    run.env_opts = sm_env_opts_default();
    run.env_opts.sticky = o.sticky;
    run.out_dir = o.out;
    run.seed = o.seed;
    run.threads = o.threads;
    run.frames = o.frames;
    run.resume = o.resume;
    run.init_from = o.init_from;
    run.stop = &g_stop;
    run.stop_after = o.stop_after;
    run.progress = stderr;
    run.progress_every = o.progress_every;
    run.dist = dist;
    run.dist_check = o.dist_check;
    run.fault_nan_update = o.fault_nan_update;
    run.fault_kill_update = o.fault_kill_update;
    run.fault_rank = o.fault_rank;
    printf("specmoe rl train: %s on %s, run directory %s\n", k->name, env->name, o.out);
    if (dist->size > 1)
        printf("specmoe rl train: data parallel over %d ranks (MPI), each with its own environments; frames count all ranks\n",
               dist->size);
    fflush(stdout);
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sm_rl_result res;
    sm_status st = k->train(cfg, &net, &run, &res, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (st != SM_OK) {
        code = cli_fail(st, &err);
        goto out;
    }
    if (res.stopped) {
        fprintf(stderr, "specmoe: %s at frame %ld; checkpoint %s/checkpoint.safetensors; continue with:\n"
                        "  specmoe rl train --resume %s/checkpoint.safetensors\n",
                res.stopped == 1 ? "interrupted" : "stopped as asked (--stop-after)", res.frames, o.out, o.out);
        code = res.stopped == 1 ? 130 : 0;
        goto out;
    }
    /* SPS over this process's frames: a resumed run's earlier frames took no time here */
    const long done = res.frames - res.frames_start;
    printf("rl-train env=%s agent=%s frames=%ld updates=%ld seconds=%.1f SPS=%.0f episodes=%ld final_return=%.3f\n",
           env->name, k->name, res.frames, res.updates, res.seconds, res.seconds > 0 ? done / res.seconds : 0,
           res.episodes, res.last_return);
    if (!dist || dist->rank == 0) draw_fig6(run.out_dir);
out:
    free(cfg);
    if (cm.open) sm_safetensors_free(&cm.st);
    cm.open = 0;
    return code;
}
