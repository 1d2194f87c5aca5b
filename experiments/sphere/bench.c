/* specmoe bench sphere: the study of SPHERE (papers/000; issue 15) on this project's task families,
 * under the paper's two protocols (Sec. 5.1, App. J.8):
 *
 *   RL   every task of the sequence trained from scratch, scored right after its training;
 *   CRL  one agent trained through the sequence, each task starting from the previous task's final
 *        network and observation normaliser (`rl train --init-from`; Adam's moments, the learning-rate
 *        schedule and the reward normaliser start fresh, as a new launch that loads the previous
 *        weights); each task scored right after its training, and the final policy scored on every
 *        task of the sequence (their average: Table 17's summary, App. J.8.1).
 *   A CRL chain's first task and the RL run of that task are the same `rl train` command but --out:
 *   when a method runs under both, it trains once and the other directory takes its files (`done`
 *   says "copy of ..."; --dry-run prints "# copy of SRC: DST").
 *
 * Scores: the greedy policy's mean episodic return (cheetah) or success rate (reach) over
 * --episodes episodes. Observation and reward normalisation as the paper's settings (App. A.4):
 * the cheetah with them (HumanoidBench's VecNormalize), the reach family without (MetaWorld). Spectral plasticity (Eq. 7): the exact eNTK effective rank of the actor mean
 * projected on a fixed unit direction, on a fixed held-out batch of --states observations of a task
 * left out of the sequence, reused across checkpoints and methods: on the cheetah collected by the
 * greedy policy of dense PPO trained from scratch on that task (the paper's "Stair" policy), on the
 * reach by uniformly random actions (sp_family.heldout: that policy's reach states are one state);
 * each policy sees them through its own observation normaliser. The effective rank of SPHERE's feature Gram (Fig. 7) is kept beside it.
 *
 * Families (the sequences share the model and spaces and differ in reward):
 *   cheetah  mujoco/cheetah-run, -run-backward, -jump; held out: -flip          score: return
 *   reach    mujoco/reach-0, reach-1, reach-2;          held out: reach-3        score: success
 * Methods (the paper's actor shape at --width, ReLU, 3 layers; --experts experts, top-2, temperature
 * 1, subset softmax, no balance loss; CleanRL's continuous PPO settings):
 *   ppo, topk (MoE actor), dense-moe, ds-moe, sphere (topk + SPHERE, grad mode, --rho: by default the
 *   family's, kFamilies), the Table 1
 *   ablations sphere-all-layers, sphere-per-expert, sphere-unweighted, sphere-gradient-gram (Eq. 26 on
 *   the backprop vectors' Gram of Eq. 20, src/methods/sphere/gradgram.c), sphere-rho=R for the
 *   Fig. 10 sweep (--rhos), and the mitigation baselines on the Top-k actor at their flags' defaults:
 *   ppo10x, ln, pw, cchain, cbp, sn, redo, specreg (1e-3), balance (0.01); sphere-ln (SPHERE on the
 *   LN actor's experts, Table 11).
 * Figures (--figures): 2 (RL vs CRL: ppo, topk, dense-moe, ds-moe), 3 (eNTK rank after each CRL task:
 *   those and sphere), 13 (per task under CRL, Tables 13-16's columns: ppo, ppo10x, topk, ln, dense-moe,
 *   ds-moe, sphere, pw, cchain, cbp), 6 (Table 6's sn, redo, specreg and Table 4's load balancing,
 *   beside topk and sphere, under CRL), 1 (ablations), 10 (rho sweep), 11 (SPHERE with LayerNorm,
 *   beside topk, ln and sphere, under CRL), fmnist (the supervised
 *   continual sequences of sphere_sl.c).
 *
 * Tiers: --tier quick (the default) is a smoke test of the whole pipeline within 30 minutes on 2
 * cores: the reach family, 2 seeds, 20480 frames per task; its tables decide no claim and say so.
 * --tier full: both families, 5 seeds, 1M frames per task, Table 1 and Tables 4 and 6 on the cheetah
 * alone (fig_sel; its time: BENCHMARKS.md). Flags override either. Resumable: a run directory with a
 * `done` file is not run again and an `eval.json` made with the same --episodes and --states is not
 * evaluated again (another --states takes only the eNTK rank again), so an interrupted study continues
 * with what is missing (a run cut short is started again from its beginning). Each run records its
 * command (DIR/command, cli_run_fingerprint); a finished run that recorded another command than the
 * plan's is refused before any work (exit 2), as it would otherwise be tabulated under this plan.
 *
 * Output under --out: the run directories (train.log, metrics.jsonl, checkpoint, done, eval.json),
 * runs.jsonl (one record per evaluated run), summary.json (every table's numbers, mean and sample
 * std over seeds) and summary.md (the printed tables). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"
#include "experiments/sphere/sphere_sl.h"
#include "specmoe/methods/sphere/sphere.h"
#include "specmoe/rl/agent.h"

#define SEQ 3 /* tasks in a sequence; the family's fourth task is held out */

typedef struct {
    const char *name;
    const char *tasks[SEQ + 1]; /* the sequence, then the held-out task */
    int success;                /* 1: scored by success rate, 0: by return */
    const char *args;           /* the family's own rl train flags */
    double rho;                 /* SPHERE's ratio (grad mode) in the paper's benchmark this family stands in for */
    const char *rhos;           /* Fig. 10's other ratios around it */
    const char *heldout;        /* how the held-out states are collected (collect_states): "greedy" or "random" */
} sp_family;

/* Observation normalisation as the paper's two settings (App. A.4): HumanoidBench, which the cheetah
 * stands in for, runs VecNormalize (the preset's running observation and reward normalisers);
 * MetaWorld, which the reaching arm stands in for, none. The reach observation ends with the
 * target's position, constant within a task: a normaliser carried into the next task would see its
 * variance near 0 and feed the new target as an input clipped at +-10 for much of the task. */
/* The held-out batch (Eq. 7's states): on the cheetah, the greedy held-out policy's states through
 * its first episode, as the paper's Stair policy. On the reach that policy parks the arm on its
 * target within the first steps, so its states were near copies of one another and every method's
 * rank read 1.0000-1.0004 (2026-11-28, 197 runs): the reach takes uniformly random actions instead,
 * which sweep the arm over its workspace - a fixed batch of the held-out task's states all the same. */
/* SPHERE's ratio as the paper's two settings: HumanoidBench rho = 0.001 (REFERENCE-NOTES, grad mode),
 * MetaWorld "two orders of magnitude" larger (App. J.10.3: the HumanoidBench ratio on MetaWorld is
 * "two orders of magnitude smaller than our default MetaWorld setting in Table 2"), so 0.1. Fig. 10's
 * sweep (on HumanoidBench in the paper) spans a decade either side of the cheetah's; on the reach it
 * is the paper's cross-benchmark check, HumanoidBench's ratio on MetaWorld. */
static const sp_family kFamilies[] = {
    {"cheetah", {"mujoco/cheetah-run", "mujoco/cheetah-run-backward", "mujoco/cheetah-jump", "mujoco/cheetah-flip"}, 0, "",
     0.001, "0.0001,0.01", "greedy"},
    {"reach", {"mujoco/reach-0", "mujoco/reach-1", "mujoco/reach-2", "mujoco/reach-3"}, 1, "--norm-obs 0 --norm-reward 0",
     0.1, "0.001", "random"},
};
#define N_FAMILIES ((int)(sizeof kFamilies / sizeof kFamilies[0]))

#define MAX_METHODS 40
typedef struct {
    char name[40];
    char args[160]; /* rl train flags of the method */
    double rho;     /* SPHERE's ratio: 0 off, < 0 the family's (method_rho) */
    unsigned fams;  /* the families it runs on (bit f: kFamilies[f]) */
} sp_method;

typedef struct {
    const char *tier, *figures, *families, *rhos, *out, *methods;
    int seeds, jobs, episodes, states, width, experts, dry_run, train;
    long frames;
    double rho; /* 0: each family's */
    sp_sl_opts sl;
    sp_method m[MAX_METHODS];
    int n_methods;
} sp_opts;

enum { P_RL = 0, P_CRL = 1, P_HELD = 2 };
static const char *const kProto[] = {"rl", "crl", "heldout"};

typedef struct {
    char dir[512], log[560];
    cli_argv cmd;
    char fp[CLI_ARGV_BUF]; /* the plan's fingerprint (cli_run_fingerprint), kept in DIR/command */
    int fam, meth, proto, task, seed;
    int dep;   /* run that must end first (CRL's previous task; -1: none) */
    int copy_of; /* a run of the same command but --out whose files this one takes (-1: none) */
    int state; /* 0 to run, 1 running, 2 ok, 3 failed */
    int pid;
    double t0;
} sp_run;


static int method_index(const sp_opts *o, const char *name) {
    for (int i = 0; i < o->n_methods; i++)
        if (!strcmp(o->m[i].name, name)) return i;
    return -1;
}

#define ALL_FAMILIES ((1u << N_FAMILIES) - 1)
static void add_method(sp_opts *o, const char *name, const char *args, double rho, unsigned fams) {
    const int have = method_index(o, name);
    if (have >= 0) { /* a sweep ratio two families share */
        o->m[have].fams |= fams;
        return;
    }
    if (o->n_methods >= MAX_METHODS) return;
    sp_method *m = &o->m[o->n_methods++];
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->args, sizeof m->args, "%s", args);
    m->rho = rho;
    m->fams = fams;
}

/* SPHERE's ratio of method m on family f (0: no SPHERE) */
static double method_rho(const sp_opts *o, const sp_method *m, int f) {
    return m->rho >= 0 ? m->rho : o->rho > 0 ? o->rho : kFamilies[f].rho;
}

/* 1 if method i runs on family f: its families, and a sweep ratio is not the family's own (that is
 * the row `sphere`) */
static int method_on_family(const sp_opts *o, int i, int f) {
    const sp_method *m = &o->m[i];
    if (!(m->fams >> f & 1u)) return 0;
    return strncmp(m->name, "sphere-rho=", 11) || method_rho(o, m, f) != method_rho(o, &o->m[method_index(o, "sphere")], f);
}

/* The figures' methods (the order of the tables' rows). */
static const char *const kFig2[] = {"ppo", "topk", "dense-moe", "ds-moe", NULL};
static const char *const kFig3[] = {"ppo", "topk", "dense-moe", "ds-moe", "sphere", NULL};
/* Tables 13-16's columns (App. J.8: PPO, PPO(10x), Top-k, LN, Dense-MoE, DS-MoE, SPHERE, PW, C-CHAIN,
 * CBP); Table 6's spectral and plasticity baselines (App. J.2.1) with Table 4's load balancing */
static const char *const kT13[] = {"ppo", "ppo10x", "topk", "ln", "dense-moe", "ds-moe", "sphere", "pw", "cchain", "cbp", NULL};
static const char *const kT6[] = {"topk", "sn", "redo", "specreg", "balance", "sphere", NULL};
/* Table 11 (App. J.6.1): SPHERE with LayerNorm, beside each alone */
static const char *const kT11[] = {"topk", "ln", "sphere", "sphere-ln", NULL};
static const char *const kT1[] = {"topk",           "sphere", "sphere-all-layers", "sphere-per-expert", "sphere-unweighted",
                                  "sphere-gradient-gram", NULL};

static void build_methods(sp_opts *o) {
    o->n_methods = 0;
    const unsigned A = ALL_FAMILIES;
    add_method(o, "ppo", "--actor mlp", 0, A);
    add_method(o, "topk", "--actor moe", 0, A);
    add_method(o, "dense-moe", "--actor dense-moe", 0, A);
    add_method(o, "ds-moe", "--actor ds-moe", 0, A);
    add_method(o, "sphere", "--actor moe", -1, A);
    add_method(o, "sphere-all-layers", "--actor moe --sphere-all-layers 1", -1, A);
    add_method(o, "sphere-per-expert", "--actor moe --sphere-per-expert 1", -1, A);
    add_method(o, "sphere-unweighted", "--actor moe --sphere-unweighted 1", -1, A);
    add_method(o, "sphere-gradient-gram", "--actor moe --sphere-gram gradient", -1, A);
    add_method(o, "sphere-ln", "--actor moe --layernorm 1", -1, A); /* LN's factory experts: moe.h feat_seq */
    /* the mitigation baselines on the same Top-k actor, each at its flag's default (README,
     * "Baselines"); spectral regularisation has no default: 1e-3, as the README's example; load
     * balancing at the top-k router's 0.01 (the later --balance wins over the plan's --balance 0) */
    add_method(o, "ppo10x", "--actor mlp10x", 0, A);
    add_method(o, "ln", "--actor moe --layernorm 1", 0, A);
    add_method(o, "pw", "--actor moe --pw 1", 0, A);
    add_method(o, "cchain", "--actor moe --cchain 1", 0, A);
    add_method(o, "cbp", "--actor moe --cbp 1", 0, A);
    add_method(o, "sn", "--actor moe --sn 1", 0, A);
    add_method(o, "redo", "--actor moe --redo 1", 0, A);
    add_method(o, "specreg", "--actor moe --specreg 1e-3", 0, A);
    add_method(o, "balance", "--actor moe --balance 0.01", 0, A);
    for (int f = 0; f < N_FAMILIES; f++) { /* Fig. 10's sweep: --rhos on every family, or each family's own */
        char b[256];
        snprintf(b, sizeof b, "%s", o->rhos ? o->rhos : kFamilies[f].rhos);
        for (char *save = NULL, *t = strtok_r(b, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            char name[40];
            snprintf(name, sizeof name, "sphere-rho=%g", atof(t));
            add_method(o, name, "--actor moe", atof(t), 1u << f);
        }
    }
}

/* 1 if figure id is selected and runs on family f. The full tier runs Table 1 and Tables 4 and 6
 * where the paper does, on HumanoidBench alone (Sec. 5.3: "We ablate key design choices of SPHERE on
 * HumanoidBench under CRL"; App. J.2.1), which the cheetah stands in for; the quick tier, a smoke test
 * on the reach, runs every figure there. Fig. 10 runs on both: its sweep on the cheetah, and on the
 * reach the paper's cross-benchmark check (J.10.3: HumanoidBench's ratio on MetaWorld). */
static int fig_sel(const sp_opts *o, const char *id, int f) {
    if (!cli_in_list(o->figures, id)) return 0;
    if (!strcmp(o->tier, "full") && (!strcmp(id, "1") || !strcmp(id, "6"))) return !strcmp(kFamilies[f].name, "cheetah");
    return 1;
}

/* Which protocols method i runs on family f under the selected figures: bit 0 RL, bit 1 CRL (0: it
 * does not run there). */
static int method_protocols(const sp_opts *o, int i, int f) {
    const char *n = o->m[i].name;
    int p = 0;
    if ((o->methods && !cli_in_list(o->methods, n)) || !method_on_family(o, i, f)) return 0;
    for (int k = 0; kFig2[k]; k++)
        if (fig_sel(o, "2", f) && !strcmp(kFig2[k], n)) p |= 3;
    for (int k = 0; kFig3[k]; k++)
        if (fig_sel(o, "3", f) && !strcmp(kFig3[k], n)) p |= 2;
    for (int k = 0; kT13[k]; k++) /* Top-k and SPHERE also from scratch (RL); the others under CRL only */
        if (fig_sel(o, "13", f) && !strcmp(kT13[k], n)) p |= !strcmp(n, "topk") || !strcmp(n, "sphere") ? 3 : 2;
    for (int k = 0; kT6[k]; k++)
        if (fig_sel(o, "6", f) && !strcmp(kT6[k], n)) p |= 2;
    for (int k = 0; kT1[k]; k++)
        if (fig_sel(o, "1", f) && !strcmp(kT1[k], n)) p |= 2;
    for (int k = 0; kT11[k]; k++)
        if (fig_sel(o, "11", f) && !strcmp(kT11[k], n)) p |= 2;
    if (fig_sel(o, "10", f) && (!strncmp(n, "sphere-rho=", 11) || !strcmp(n, "sphere") || !strcmp(n, "topk"))) p |= 2;
    return p;
}

/* the run's `rl train` command line */
static int plan_run(sp_run *r, const sp_opts *o, const char *self, const sp_run *runs) {
    cli_argv *a = &r->cmd;
    memset(a, 0, sizeof *a);
    const sp_family *F = &kFamilies[r->fam];
    char b[600];
    int bad = cli_argv_push(a, self) | cli_argv_words(a, "rl train --agent ppo --preset cleanrl-continuous --act relu");
    snprintf(b, sizeof b,
             "--arch dense:%d,dense:%d,dense:%d --experts %d --topk 2 --temperature 1 --renorm 1 --balance 0 --threads 1 "
             "--progress-every 600 --frames %ld --seed %d --env %s",
             o->width, o->width, o->width, o->experts, o->frames, r->seed, F->tasks[r->task]);
    bad |= cli_argv_words(a, b) | cli_argv_words(a, F->args) | cli_argv_push(a, "--out") | cli_argv_push(a, r->dir);
    const sp_method *m = &o->m[r->meth];
    bad |= cli_argv_words(a, m->args);
    const double rho = method_rho(o, m, r->fam);
    if (rho > 0) {
        snprintf(b, sizeof b, "--sphere-rho %g --sphere-mode grad", rho);
        bad |= cli_argv_words(a, b);
    }
    if (r->proto == P_CRL && r->dep >= 0) {
        snprintf(b, sizeof b, "%s/checkpoint.safetensors", runs[r->dep].dir);
        bad |= cli_argv_push(a, "--init-from") | cli_argv_push(a, b);
    }
    return bad;
}

static int add_run(sp_run *runs, int *n, const sp_opts *o, const char *self, int fam, int meth, int proto, int task,
                   int seed, int dep) {
    sp_run *r = &runs[*n];
    memset(r, 0, sizeof *r);
    r->fam = fam, r->meth = meth, r->proto = proto, r->task = task, r->seed = seed, r->dep = dep, r->copy_of = -1;
    const char *tn = strchr(kFamilies[fam].tasks[task], '/') + 1;
    if (proto == P_CRL)
        snprintf(r->dir, sizeof r->dir, "%s/%s/crl/%s/s%d/%d-%s", o->out, kFamilies[fam].name, o->m[meth].name, seed, task, tn);
    else
        snprintf(r->dir, sizeof r->dir, "%s/%s/%s/%s/%s/s%d", o->out, kFamilies[fam].name, kProto[proto], o->m[meth].name,
                 tn, seed);
    snprintf(r->log, sizeof r->log, "%s/train.log", r->dir);
    char done[600];
    snprintf(done, sizeof done, "%s/done", r->dir);
    r->state = cli_file_exists(done) ? 2 : 0;
    if (plan_run(r, o, self, runs) || cli_run_fingerprint(&r->cmd, o->out, r->fp, sizeof r->fp)) return -1;
    (*n)++;
    return 0;
}

/* ---- running --------------------------------------------------------------------------------- */

/* A run's files into dst (its `done` last): the checkpoint, metrics, log and settings, and its
 * recorded plan if it has one (the fingerprint leaves --out out, so it is the copy's plan too). */
static int copy_run(const char *src, const char *dst) {
    static const char *const kFiles[] = {"checkpoint.safetensors", "metrics.jsonl", "train.log", "settings.json", "command"};
    if (cli_mkdirs(dst)) return -1;
    for (size_t i = 0; i < sizeof kFiles / sizeof kFiles[0]; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/%s", src, kFiles[i]);
        snprintf(b, sizeof b, "%s/%s", dst, kFiles[i]);
        if (!strcmp(kFiles[i], "command") && !cli_file_exists(a)) { /* a run from before fingerprints: no record either */
            if (remove(b) && errno != ENOENT) return -1;
            continue;
        }
        FILE *in = fopen(a, "rb"), *out = in ? fopen(b, "wb") : NULL;
        int bad = !in || !out;
        char buf[1 << 16];
        for (size_t k; !bad && (k = fread(buf, 1, sizeof buf, in)) > 0;) bad = fwrite(buf, 1, k, out) != k;
        bad |= in && ferror(in);
        if (in) fclose(in);
        if (out && fclose(out)) bad = 1;
        if (bad) return -1;
    }
    char done[600], text[600];
    snprintf(done, sizeof done, "%s/done", dst);
    snprintf(text, sizeof text, "copy of %s\n", src);
    return cli_write_text(done, text);
}

static int run_all(sp_run *runs, int n, int jobs) {
    int running = 0, failed = 0;
    const double t_start = sm_time_now();
    for (;;) {
        for (int i = 0; i < n && running < jobs; i++) {
            sp_run *r = &runs[i];
            if (r->state) continue;
            if (r->dep >= 0 && runs[r->dep].state == 3) { /* the previous task failed */
                r->state = 3, failed++;
                continue;
            }
            if (r->dep >= 0 && runs[r->dep].state != 2) continue;
            if (r->copy_of >= 0) { /* the same training ran under the other protocol: its files */
                const int ok = copy_run(runs[r->copy_of].dir, r->dir) == 0;
                r->state = ok ? 2 : 3;
                failed += !ok;
                printf("bench-sphere-run dir=%s status=%s copy_of=%s\n", r->dir, ok ? "copied" : "failed", runs[r->copy_of].dir);
                fflush(stdout);
                continue;
            }
            if (cli_mkdirs(r->dir) || cli_run_plan_write(r->dir, r->fp) || (r->pid = cli_spawn(&r->cmd, r->log)) < 0) {
                fprintf(stderr, "specmoe bench sphere: cannot start %s\n", r->dir);
                r->state = 3, failed++;
                continue;
            }
            r->t0 = sm_time_now(), r->state = 1, running++;
        }
        if (!running) break;
        int status;
        int pid = (int)waitpid(-1, &status, 0);
        if (pid < 0) break;
        for (int i = 0; i < n; i++) {
            sp_run *r = &runs[i];
            if (r->state != 1 || r->pid != pid) continue;
            running--;
            int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            char done[600], text[64];
            snprintf(done, sizeof done, "%s/done", r->dir);
            snprintf(text, sizeof text, "seconds %.1f\n", sm_time_now() - r->t0);
            ok = ok && cli_write_text(done, text) == 0;
            r->state = ok ? 2 : 3;
            failed += !ok;
            printf("bench-sphere-run dir=%s status=%s seconds=%.0f\n", r->dir, ok ? "ok" : "failed", sm_time_now() - r->t0);
            fflush(stdout);
        }
    }
    printf("bench-sphere-train runs=%d failed=%d seconds=%.0f\n", n, failed, sm_time_now() - t_start);
    return failed;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

/* N states of the held-out task env, written to states (N, D): 8 environments (seed 77) stepped
 * through their first episode, every `stride` steps recorded (spread evenly over it). Actions: the
 * greedy policy of checkpoint ckpt, or with random = 1 uniform in the action box (a fixed RNG
 * stream; ckpt unused). */
static sm_status collect_states(const char *ckpt, int random, const char *env, int N, float *states, sm_error *err) {
    sm_policy *p = NULL;
    if (!random) {
        const sm_agent_kind *k = sm_agent_of_checkpoint(ckpt, err);
        if (!k) return SM_ERR_FORMAT;
        p = k->load_policy(ckpt, 8, err);
        if (!p) return err->code ? err->code : SM_ERR_FORMAT;
    }
    sm_vecenv v;
    sm_status st = sm_vecenv_init(&v, env, 8, 77, NULL, err);
    if (st != SM_OK) {
        if (p) p->destroy(p);
        return st;
    }
    const int D = sm_env_obs_numel(v.spec), A = v.spec->act_n;
    if (random && !v.spec->act_low) {
        sm_vecenv_free(&v);
        return sm_fail(err, SM_ERR_ARG, "held-out states: %s has no action box for random actions", env);
    }
    float *obs = malloc(sizeof(float) * 8 * (size_t)(D + A + 3));
    if (!obs) {
        if (p) p->destroy(p);
        sm_vecenv_free(&v);
        return sm_fail(err, SM_ERR_NOMEM, "held-out states: out of memory");
    }
    float *act = obs + 8 * D, *rew = act + 8 * A;
    unsigned char term[8], trunc[8];
    sm_vecenv_bind(&v, obs, NULL, act, rew, term, trunc, NULL);
    sm_vecenv_reset(&v);
    sm_rng rng;
    sm_rng_seed(&rng, 0x48454c44ULL); /* "HELD" */
    const int per_env = (N + 7) / 8, limit = v.spec->max_steps > 0 ? v.spec->max_steps : 1000;
    /* per_env + 1 intervals: the last record stays inside the first episode (at the time limit the
     * vector has already reset the environment) */
    const int stride = limit / (per_env + 1) > 1 ? limit / (per_env + 1) : 1;
    int got = 0;
    for (int t = 1; got < N; t++) {
        if (p) p->act(p, obs, 8, NULL, act);
        else
            for (int i = 0; i < 8 * A; i++) {
                const float lo = v.spec->act_low[i % A], hi = v.spec->act_high[i % A];
                act[i] = lo + (hi - lo) * (float)sm_rng_uniform(&rng);
            }
        sm_vecenv_step(&v);
        if (t % stride) continue;
        for (int e = 0; e < 8 && got < N; e++) memcpy(states + (size_t)got++ * D, obs + (size_t)e * D, sizeof(float) * D);
    }
    free(obs);
    sm_vecenv_free(&v);
    if (p) p->destroy(p);
    return SM_OK;
}

typedef struct {
    double ret, success, score, entk, fsrank;
    double final[SEQ]; /* CRL's last task: the final policy on every task; NAN otherwise */
} sp_eval;

static double score_of(const sp_family *F, double ret, double success) { return F->success ? success : ret; }

static sm_status eval_policy_on(const char *ckpt, const char *env, int episodes, int seed, double *ret, double *success,
                                sm_error *err) {
    const sm_agent_kind *k = sm_agent_of_checkpoint(ckpt, err);
    if (!k) return SM_ERR_FORMAT;
    sm_policy *p = k->load_policy(ckpt, 16, err);
    if (!p) return err->code ? err->code : SM_ERR_FORMAT;
    sm_env_log log;
    sm_status st = sm_rl_evaluate(p, env, NULL, episodes, 16, (uint64_t)(1000 + seed), 1, &log, err);
    p->destroy(p);
    if (st != SM_OK) return st;
    *ret = log.episode_return / (double)log.n;
    *success = log.success / (double)log.n;
    return SM_OK;
}

static sm_status eval_entk(const char *ckpt, const float *states, int N, double *entk, double *fsrank, sm_error *err) {
    const sm_agent_kind *k = sm_agent_of_checkpoint(ckpt, err);
    if (!k) return SM_ERR_FORMAT;
    sm_policy *p = k->load_policy(ckpt, N, err);
    if (!p) return err->code ? err->code : SM_ERR_FORMAT;
    sm_status st = SM_OK;
    if (!p->net || !p->inputs) st = sm_fail(err, SM_ERR_ARG, "%s: the policy exposes no network", ckpt);
    const int A = p->env->act_n;
    sm_real u[64];
    sm_rng r;
    sm_rng_seed(&r, 0x5350484552ULL); /* one direction for every method and checkpoint */
    double n2 = 0;
    for (int j = 0; j < A && j < 64; j++) u[j] = (sm_real)sm_rng_normal(&r), n2 += (double)u[j] * u[j];
    for (int j = 0; j < A && j < 64; j++) u[j] = (sm_real)(u[j] / sqrt(n2));
    sm_sphere_diag dg;
    if (st == SM_OK) st = sm_sphere_diagnose(p->net, p->inputs(p, states, N), N, u, &dg, err);
    if (st == SM_OK) *entk = dg.entk_srank, *fsrank = dg.have_features ? dg.feature_srank : NAN;
    p->destroy(p);
    return st;
}

static void put_num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}
static double get_num(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static cJSON *eval_json(const sp_opts *o, const sp_run *r, const sp_eval *e) {
    const sp_family *F = &kFamilies[r->fam];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "family", F->name);
    cJSON_AddStringToObject(j, "protocol", kProto[r->proto]);
    cJSON_AddStringToObject(j, "method", o->m[r->meth].name);
    cJSON_AddStringToObject(j, "task", F->tasks[r->task]);
    cJSON_AddNumberToObject(j, "task_index", r->task);
    cJSON_AddNumberToObject(j, "seed", r->seed);
    cJSON_AddStringToObject(j, "dir", r->dir);
    put_num(j, "return", e->ret), put_num(j, "success", e->success), put_num(j, "score", e->score);
    put_num(j, "entk_srank", e->entk), put_num(j, "feature_srank", e->fsrank);
    cJSON_AddNumberToObject(j, "entk_states", o->states);
    cJSON_AddStringToObject(j, "entk_batch", F->heldout);
    cJSON_AddNumberToObject(j, "episodes", o->episodes);
    if (isfinite(e->final[0])) {
        cJSON *f = cJSON_AddArrayToObject(j, "final_scores");
        for (int t = 0; t < SEQ; t++) cJSON_AddItemToArray(f, cJSON_CreateNumber(e->final[t]));
    }
    return j;
}

/* Evaluates run r, or reads its eval.json from an earlier session when that was made with the same
 * settings: a file of another --episodes is evaluated again, and one whose eNTK rank was taken on
 * another number of held-out states (or does not say: files written before 2026-11-24), or on
 * another kind of held-out batch (entk_batch; files written before 2026-11-28 used the greedy one)
 * keeps its scores and has only the rank taken again, which costs N backward passes, not episodes. */
static sm_status evaluate_run(const sp_opts *o, const sp_run *r, const float *states, sp_eval *e, cJSON **out,
                              sm_error *err) {
    const sp_family *F = &kFamilies[r->fam];
    char path[600], ckpt[600];
    snprintf(path, sizeof path, "%s/eval.json", r->dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", r->dir);
    for (int t = 0; t < SEQ; t++) e->final[t] = NAN;
    int scored = 0; /* the scores came from the file */
    FILE *f = fopen(path, "rb");
    if (f) {
        char buf[4096];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        cJSON *j = cJSON_Parse(buf);
        const double episodes = get_num(j, "episodes"); /* NAN before 2026-11-24: every run used the default, 16 */
        if (j && (isnan(episodes) ? o->episodes == 16 : episodes == o->episodes)) {
            e->ret = get_num(j, "return"), e->success = get_num(j, "success"), e->score = get_num(j, "score");
            e->entk = get_num(j, "entk_srank"), e->fsrank = get_num(j, "feature_srank");
            const cJSON *fs = cJSON_GetObjectItemCaseSensitive(j, "final_scores");
            for (int t = 0; t < SEQ && cJSON_GetArrayItem(fs, t); t++) e->final[t] = cJSON_GetArrayItem(fs, t)->valuedouble;
            const cJSON *batch = cJSON_GetObjectItemCaseSensitive(j, "entk_batch"); /* absent before 2026-11-28: greedy */
            const char *bname = cJSON_IsString(batch) ? batch->valuestring : "greedy";
            if (get_num(j, "entk_states") == o->states && !isnan(episodes) && !strcmp(bname, F->heldout)) {
                *out = j;
                return SM_OK;
            }
            scored = 1;
        }
        cJSON_Delete(j);
    }
    sm_status st = SM_OK;
    if (!scored) {
        st = eval_policy_on(ckpt, F->tasks[r->task], o->episodes, r->seed, &e->ret, &e->success, err);
        if (st == SM_OK) e->score = score_of(F, e->ret, e->success);
    }
    if (st == SM_OK) st = eval_entk(ckpt, states, o->states, &e->entk, &e->fsrank, err);
    for (int t = 0; !scored && st == SM_OK && r->proto == P_CRL && r->task == SEQ - 1 && t < SEQ; t++) {
        double ret, suc;
        st = eval_policy_on(ckpt, F->tasks[t], o->episodes, r->seed, &ret, &suc, err);
        e->final[t] = score_of(F, ret, suc);
    }
    if (st != SM_OK) return st;
    *out = eval_json(o, r, e);
    char *text = cJSON_Print(*out);
    if (!text || cli_write_text(path, text)) {
        st = sm_fail(err, SM_ERR_IO, "%s: cannot write", path);
        cJSON_Delete(*out);
        *out = NULL;
    }
    free(text);
    return st;
}

/* ---- tables ---------------------------------------------------------------------------------- */

/* mean and sample standard deviation of the finite values */
static void mean_std(const double *x, int n, double *mean, double *sd, int *k) {
    double s = 0, q = 0;
    *k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) s += x[i], (*k)++;
    *mean = *k ? s / *k : NAN;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) q += (x[i] - *mean) * (x[i] - *mean);
    *sd = *k > 1 ? sqrt(q / (*k - 1)) : 0;
}

typedef struct {
    const sp_opts *o;
    const sp_run *runs;
    const sp_eval *ev;
    int n;
    cli_buf *md;
    cJSON *json;
} sp_report;

/* what a cell shows, per seed */
enum { Q_SCORE, Q_FINAL, Q_ENTK, Q_FSRANK };

/* The value of one seed: quantity q of (family, method, protocol) at task t (t < 0: the mean over the
 * sequence). NAN when the run is missing (t < 0: when any task's run is). */
static double seed_value(const sp_report *R, int fam, int meth, int proto, int t, int seed, int q) {
    double s = 0;
    int k = 0;
    for (int i = 0; i < R->n; i++) {
        const sp_run *r = &R->runs[i];
        if (r->fam != fam || r->meth != meth || r->proto != proto || r->seed != seed || r->state != 2) continue;
        if (r->task >= SEQ || (t >= 0 && r->task != t)) continue;
        const sp_eval *e = &R->ev[i];
        if (q == Q_FINAL) {
            if (r->task != SEQ - 1) continue;
            for (int u = 0; u < SEQ; u++) s += e->final[u], k++;
            continue;
        }
        s += q == Q_SCORE ? e->score : q == Q_ENTK ? e->entk : e->fsrank;
        k++;
    }
    if (t < 0 && q != Q_FINAL && k < SEQ) return NAN; /* a mean over the sequence needs every task */
    return k ? s / k : NAN;
}

static void cell(const sp_report *R, cJSON *row, const char *key, int fam, int meth, int proto, int t, int q) {
    double v[100];
    int ns = R->o->seeds < 100 ? R->o->seeds : 100, k;
    for (int s = 0; s < ns; s++) v[s] = seed_value(R, fam, meth, proto, t, s + 1, q);
    double mean, sd;
    mean_std(v, ns, &mean, &sd, &k);
    if (k && k < ns) cli_bprintf(R->md, " %.3g +- %.2g (n=%d) |", mean, sd, k); /* a study still running */
    else if (k) cli_bprintf(R->md, " %.3g +- %.2g |", mean, sd);
    else cli_bprintf(R->md, " - |");
    cJSON *c = cJSON_AddObjectToObject(row, key);
    put_num(c, "mean", mean), put_num(c, "std", sd);
    cJSON_AddNumberToObject(c, "n", k);
}

static void table(const sp_report *R, int fam, const char *id, const char *title, const char *const *methods, int fig) {
    const sp_opts *o = R->o;
    const sp_family *F = &kFamilies[fam];
    const char *what = fig == 3 ? "effective rank" : F->success ? "success rate" : "return";
    cli_bprintf(R->md, "\n### %s: %s, %s family (%s; mean +- sample std over %d seeds)%s\n\n", id, title, F->name, what,
                o->seeds, strcmp(o->tier, "full") ? " [quick tier: a smoke test, decides nothing]" : "");
    cJSON *tab = cJSON_CreateObject();
    cJSON_AddStringToObject(tab, "id", id);
    cJSON_AddStringToObject(tab, "family", F->name);
    cJSON_AddStringToObject(tab, "metric", what);
    cJSON *rows = cJSON_AddArrayToObject(tab, "rows");
    if (fig == 2) cli_bprintf(R->md, "| method | RL: mean over tasks | CRL: each task after its training | CRL: final policy on all tasks |\n|---|---|---|---|\n");
    else if (fig == 3) {
        cli_bprintf(R->md, "| method |");
        for (int u = 0; u < SEQ; u++) cli_bprintf(R->md, " eNTK srank after %s |", strchr(F->tasks[u], '/') + 1);
        cli_bprintf(R->md, " feature srank after the last |\n|---|");
        for (int u = 0; u <= SEQ; u++) cli_bprintf(R->md, "---|");
        cli_bprintf(R->md, "\n");
    } else {
        cli_bprintf(R->md, "| method |");
        for (int u = 0; u < SEQ; u++) cli_bprintf(R->md, " CRL %s |", strchr(F->tasks[u], '/') + 1);
        cli_bprintf(R->md, " CRL mean | CRL final on all | eNTK srank at the end (%d states) |\n|---|", o->states);
        for (int u = 0; u < SEQ + 3; u++) cli_bprintf(R->md, "---|");
        cli_bprintf(R->md, "\n");
    }
    int rows_m[MAX_METHODS], nr = 0; /* the rows: the figure's methods, or Fig. 10's topk, sphere and the sweep */
    for (int i = 0; i < o->n_methods; i++) {
        const char *n = o->m[i].name;
        if (fig == 10 && method_protocols(o, i, fam) && (!strncmp(n, "sphere-rho=", 11) || !strcmp(n, "sphere") || !strcmp(n, "topk")))
            rows_m[nr++] = i;
    }
    for (int i = 0; fig != 10 && methods[i]; i++) {
        const int mi = method_index(o, methods[i]);
        if (mi >= 0 && method_protocols(o, mi, fam)) rows_m[nr++] = mi;
    }
    for (int i = 0; i < nr; i++) {
        const int m = rows_m[i];
        cJSON *row = cJSON_CreateObject();
        cJSON_AddStringToObject(row, "method", o->m[m].name);
        put_num(row, "rho", method_rho(o, &o->m[m], fam));
        cli_bprintf(R->md, "| %s |", o->m[m].name);
        char key[48];
        if (fig == 2) {
            cell(R, row, "rl_mean", fam, m, P_RL, -1, Q_SCORE);
            cell(R, row, "crl_mean", fam, m, P_CRL, -1, Q_SCORE);
            cell(R, row, "crl_final", fam, m, P_CRL, -1, Q_FINAL);
        } else if (fig == 3) {
            for (int u = 0; u < SEQ; u++) {
                snprintf(key, sizeof key, "entk_after_%d", u);
                cell(R, row, key, fam, m, P_CRL, u, Q_ENTK);
            }
            cell(R, row, "feature_srank_last", fam, m, P_CRL, SEQ - 1, Q_FSRANK);
        } else {
            for (int u = 0; u < SEQ; u++) {
                snprintf(key, sizeof key, "crl_task_%d", u);
                cell(R, row, key, fam, m, P_CRL, u, Q_SCORE);
            }
            cell(R, row, "crl_mean", fam, m, P_CRL, -1, Q_SCORE);
            cell(R, row, "crl_final", fam, m, P_CRL, -1, Q_FINAL);
            cell(R, row, "entk_last", fam, m, P_CRL, SEQ - 1, Q_ENTK);
        }
        cli_bprintf(R->md, "\n");
        cJSON_AddItemToArray(rows, row);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(R->json, "tables"), tab);
}

/* ---- the entry point ------------------------------------------------------------------------- */

int exp_sphere_bench(int argc, char **argv) {
    sp_opts o;
    memset(&o, 0, sizeof o);
    const char *figures = NULL, *families = NULL;
    long frames = 0;
    int seeds = 0;
    fl_flag fl[] = {
        {"tier", FL_STRING, &o.tier, "quick", "quick (a smoke test, < 30 min on 2 cores) | full", 0},
        {"figures", FL_STRING, &figures, NULL, "comma list of 2,3,13,6,1,10,11,fmnist (default: all)", 0},
        {"families", FL_STRING, &families, NULL, "comma list of cheetah,reach (quick: reach; full: both)", 0},
        {"seeds", FL_INT, &seeds, "0", "seeds (0: the tier's: quick 2, full 5)", 0},
        {"frames", FL_LONG, &frames, "0", "frames per task (0: the tier's: quick 20480, full 1000000)", 0},
        {"episodes", FL_INT, &o.episodes, "16", "evaluation episodes per score", 0},
        {"states", FL_INT, &o.states, "0", "held-out states of the eNTK rank (0: the tier's: quick 32, full 256)", 0},
        {"width", FL_INT, &o.width, "64", "hidden width of the actors' 3 layers (the paper: 256)", 0},
        {"experts", FL_INT, &o.experts, "8", "experts of the MoE actors (the paper: 10)", 0},
        {"rho", FL_DOUBLE, &o.rho, "0", "SPHERE's ratio, grad mode (0: the family's paper setting - cheetah 0.001 as HumanoidBench, reach 0.1 as MetaWorld)", 0},
        {"rhos", FL_STRING, &o.rhos, NULL, "Fig. 10's other ratios (default: the family's - cheetah 0.0001,0.01; reach 0.001)", 0},
        {"jobs", FL_INT, &o.jobs, "2", "runs at once (one thread each)", 0},
        {"out", FL_STRING, &o.out, "runs/bench-sphere", "directory of the runs and tables", 0},
        {"dry-run", FL_BOOL, &o.dry_run, "0", "print the runs' command lines and stop", 0},
        {"methods", FL_STRING, &o.methods, NULL, "comma list: only these RL methods' runs and rows (default: the figures' all; fmnist keeps its two)", 0},
        {"train", FL_BOOL, &o.train, "1", "0: train nothing; evaluate and tabulate the RL runs done so far (cells with fewer seeds say n=; fmnist skipped)", 0},
        {"sl-tasks", FL_STRING, &o.sl.protocols, "split,permuted", "fmnist: split (5 x 2 classes, task-masked CE) and/or permuted", 0},
        {"sl-epochs", FL_INT, &o.sl.epochs, "0", "fmnist: epochs per task (0: the tier's: quick 2, full 5)", 0},
        {"sl-per-class", FL_INT, &o.sl.per_class, "-1", "fmnist: training examples per class (-1: the tier's: quick 1000, full all)", 0},
        {"sl-permuted", FL_INT, &o.sl.n_permuted, "5", "fmnist: permuted-input tasks", 0},
        {"sl-rho", FL_DOUBLE, &o.sl.rho, "0.01", "fmnist: SPHERE's ratio (grad mode)", 0},
    };
    int full;
    int rc = cli_parse_study(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, "sphere", &o.tier, &full);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    o.figures = figures ? figures : "2,3,13,6,1,10,11,fmnist";
    o.families = families ? families : full ? "cheetah,reach" : "reach";
    o.seeds = seeds > 0 ? seeds : full ? 5 : 2;
    o.frames = frames > 0 ? frames : full ? 1000000 : 20480;
    if (o.states == 0) o.states = full ? 256 : 32;
    if (o.sl.epochs <= 0) o.sl.epochs = full ? 5 : 2;
    if (o.sl.per_class < 0) o.sl.per_class = full ? 0 : 1000;
    o.sl.seeds = o.seeds;
    if (o.jobs < 1 || o.jobs > 64 || o.seeds > 100 || seeds < 0 || frames < 0 || o.episodes < 1 || o.states < 2 ||
        o.states > 512 || o.width < 1 || o.experts < 2 || !(o.rho >= 0 && isfinite(o.rho)) || o.sl.n_permuted < 1 || o.sl.n_permuted > 20) {
        fprintf(stderr, "specmoe bench sphere: need --jobs in [1, 64], --seeds in [0, 100], --frames >= 0, --episodes >= 1, "
                        "--states in [2, 512], --width >= 1, --experts >= 2, --rho >= 0, --sl-permuted in [1, 20]\n");
        return CLI_EXIT_USAGE;
    }
    for (int which = 0; which < 2; which++) {
        static const char *const known[2] = {"2,3,13,6,1,10,11,fmnist", "cheetah,reach"};
        char b[64];
        if (cli_list_unknown(which ? o.families : o.figures, known[which], b, sizeof b)) {
            fprintf(stderr, "specmoe bench sphere: unknown %s '%s' (%s)\n", which ? "family" : "figure", b,
                    which ? "cheetah, reach" : "2, 3, 13, 6, 1, 10, 11, fmnist");
            return CLI_EXIT_USAGE;
        }
    }
    build_methods(&o);
    if (o.methods) {
        char list[1024] = "", b[64];
        for (int i = 0, used = 0; i < o.n_methods && used < (int)sizeof list; i++)
            used += snprintf(list + used, sizeof list - (size_t)used, "%s%s", i ? "," : "", o.m[i].name);
        if (cli_list_unknown(o.methods, list, b, sizeof b)) {
            fprintf(stderr, "specmoe bench sphere: unknown method '%s' (%s)\n", b, list);
            return CLI_EXIT_USAGE;
        }
    }
    int n_rhos = 0, room = MAX_METHODS - 1 - method_index(&o, "balance"); /* add_method stops at MAX_METHODS */
    if (o.rhos) { /* each a positive number (a sweep row is SPHERE at that ratio); the families' own fit */
        char b[256], *end;
        snprintf(b, sizeof b, "%s", o.rhos);
        for (char *save = NULL, *t = strtok_r(b, ",", &save); t; t = strtok_r(NULL, ",", &save), n_rhos++) {
            const double r = strtod(t, &end);
            if (end == t || *end || !(r > 0 && isfinite(r))) {
                fprintf(stderr, "specmoe bench sphere: --rhos: '%s' is not a positive ratio\n", t);
                return CLI_EXIT_USAGE;
            }
        }
    }
    if (n_rhos > room) {
        fprintf(stderr, "specmoe bench sphere: --rhos: at most %d ratios, not %d\n", room, n_rhos);
        return CLI_EXIT_USAGE;
    }
    char self[512];
    if (cli_self_exe(self, sizeof self)) {
        fprintf(stderr, "specmoe bench sphere: cannot find the specmoe executable (/proc/self/exe)\n");
        return CLI_EXIT_RUNTIME;
    }

    /* the runs: per family, the held-out policy, then per method and seed its RL runs and CRL chain */
    const int cap = N_FAMILIES * (1 + MAX_METHODS * o.seeds * 2 * SEQ);
    sp_run *runs = calloc((size_t)cap, sizeof *runs);
    sp_eval *ev = calloc((size_t)cap, sizeof *ev);
    int n = 0, bad = !runs || !ev, held[N_FAMILIES];
    for (int f = 0; f < N_FAMILIES && !bad; f++) {
        held[f] = -1;
        if (!cli_in_list(o.families, kFamilies[f].name)) continue;
        int any = 0;
        for (int m = 0; m < o.n_methods; m++) any |= method_protocols(&o, m, f);
        if (!any) continue;
        held[f] = n;
        bad |= add_run(runs, &n, &o, self, f, method_index(&o, "ppo"), P_HELD, SEQ, 1, -1);
        for (int m = 0; m < o.n_methods && !bad; m++) {
            const int p = method_protocols(&o, m, f);
            for (int s = 1; s <= o.seeds && !bad; s++) {
                const int rl0 = n;
                for (int t = 0; t < SEQ && (p & 1); t++) bad |= add_run(runs, &n, &o, self, f, m, P_RL, t, s, -1);
                const int crl0 = n;
                for (int t = 0; t < SEQ && (p & 2); t++) bad |= add_run(runs, &n, &o, self, f, m, P_CRL, t, s, t ? n - 1 : -1);
                /* a CRL chain's first task is its RL run of task 0 (the same command but --out): run
                 * once, the other protocol takes its files */
                if ((p & 3) == 3 && !bad) {
                    sp_run *a = &runs[rl0], *c = &runs[crl0];
                    if (c->state == 2 && a->state != 2) a->copy_of = a->dep = crl0;
                    else if (c->state != 2) c->copy_of = c->dep = rl0;
                }
            }
        }
    }
    if (bad) {
        fprintf(stderr, "specmoe bench sphere: out of memory or a command line too long\n");
        free(runs), free(ev);
        return CLI_EXIT_RUNTIME;
    }
    /* a finished run must have run this plan's command: a directory named by its variant alone would
     * otherwise hand an earlier plan's run (other flags, the same name) to the tables */
    int stale = 0, unrecorded = 0;
    for (int i = 0; i < n; i++)
        if (runs[i].state == 2) cli_run_plan_verify("sphere", runs[i].dir, runs[i].fp, &stale, &unrecorded);
    if (stale) {
        fprintf(stderr, "specmoe bench sphere: %d finished run(s) under %s ran other commands: remove them to run them again, "
                        "or choose another --out\n", stale, o.out);
        free(runs), free(ev);
        return CLI_EXIT_USAGE;
    }
    if (unrecorded)
        printf("bench-sphere: %d finished run(s) have no recorded command (made before fingerprints) and are taken as "
               "planned\n", unrecorded);
    if (full && cli_in_list(o.families, "reach") && (cli_in_list(o.figures, "1") || cli_in_list(o.figures, "6")))
        printf("bench-sphere note: the full tier runs Table 1 and Tables 4 and 6 on the cheetah alone, as the paper on "
               "HumanoidBench alone\n");
    char other[64]; /* a selected figure of RL runs: any but fmnist (the figures are known ones) */
    if (n == 0 && cli_list_unknown(o.figures, "fmnist", other, sizeof other)) {
        fprintf(stderr, "specmoe bench sphere: nothing to run or tabulate: no selected method runs on the selected families "
                        "under figures %s%s\n", o.figures, full ? " (the full tier runs Table 1 and Tables 4 and 6 on the cheetah alone)" : "");
        free(runs), free(ev);
        return CLI_EXIT_USAGE;
    }
    long planned = 0;
    int todo = 0;
    for (int i = 0; i < n; i++) todo += runs[i].state == 0 && runs[i].copy_of < 0;
    planned = (long)todo * o.frames;
    printf("bench-sphere tier=%s%s figures=%s families=%s seeds=%d frames_per_task=%ld runs=%d to_run=%d frames_to_run=%ld "
           "jobs=%d out=%s\n",
           o.tier, full ? "" : " (a smoke test of the pipeline: these tables decide no claim)", o.figures, o.families, o.seeds,
           o.frames, n, todo, planned, o.jobs, o.out);
    if (o.dry_run) {
        for (int i = 0; i < n; i++) {
            if (runs[i].state != 2 && runs[i].copy_of >= 0) {
                printf("# copy of %s: %s\n", runs[runs[i].copy_of].dir, runs[i].dir);
                continue;
            }
            printf("%s", runs[i].state == 2 ? "# done: " : "");
            for (int a = 0; a < runs[i].cmd.argc; a++) printf("%s%s", a ? " " : "", runs[i].cmd.argv[a]);
            printf("\n");
        }
        free(runs), free(ev);
        return 0;
    }
    if (cli_mkdirs(o.out)) {
        fprintf(stderr, "specmoe bench sphere: cannot create %s\n", o.out);
        free(runs), free(ev);
        return CLI_EXIT_RUNTIME;
    }
    int failed = n && o.train ? run_all(runs, n, o.jobs) : 0;

    /* evaluation: the held-out states of each family, then every run */
    cli_buf md = {0};
    cJSON *json = cJSON_CreateObject();
    cJSON_AddStringToObject(json, "tier", o.tier);
    cJSON_AddBoolToObject(json, "smoke_test", !full);
    cJSON_AddNumberToObject(json, "seeds", o.seeds);
    cJSON_AddNumberToObject(json, "frames_per_task", (double)o.frames);
    cJSON_AddArrayToObject(json, "tables");
    cli_buf jl = {0};
    int Dmax = 1; /* the widest observation of the families */
    for (int f = 0; f < N_FAMILIES; f++) {
        const sm_env_spec *e = sm_env_find(kFamilies[f].tasks[SEQ]);
        if (e && sm_env_obs_numel(e) > Dmax) Dmax = sm_env_obs_numel(e);
    }
    float *states = malloc(sizeof(float) * (size_t)o.states * Dmax);
    sm_error err = {0};
    for (int f = 0; f < N_FAMILIES && states; f++) {
        if (held[f] < 0 || runs[held[f]].state != 2) continue;
        char ck[600];
        snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", runs[held[f]].dir);
        if (collect_states(ck, !strcmp(kFamilies[f].heldout, "random"), kFamilies[f].tasks[SEQ], o.states, states, &err) !=
            SM_OK) {
            fprintf(stderr, "specmoe bench sphere: held-out states: %s\n", err.msg);
            failed++;
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (runs[i].fam != f || runs[i].proto == P_HELD || runs[i].state != 2) continue;
            cJSON *j = NULL;
            if (evaluate_run(&o, &runs[i], states, &ev[i], &j, &err) != SM_OK) {
                fprintf(stderr, "specmoe bench sphere: %s: %s\n", runs[i].dir, err.msg);
                runs[i].state = 3, failed++;
                continue;
            }
            char *line = cJSON_PrintUnformatted(j);
            if (line) cli_bprintf(&jl, "%s\n", line);
            free(line);
            cJSON_Delete(j);
        }
        const sp_report R = {&o, runs, ev, n, &md, json};
        if (fig_sel(&o, "2", f)) table(&R, f, "Fig. 2", "RL vs CRL", kFig2, 2);
        char f3[96];
        snprintf(f3, sizeof f3, "eNTK effective rank through CRL (%d held-out states)", o.states);
        if (fig_sel(&o, "3", f)) table(&R, f, "Fig. 3", f3, kFig3, 3);
        if (fig_sel(&o, "13", f)) table(&R, f, "Tables 13-16", "SPHERE vs Top-k and the baselines under CRL", kT13, 13);
        if (fig_sel(&o, "6", f))
            table(&R, f, "Tables 4 and 6", "the spectral and plasticity baselines and load balancing under CRL", kT6, 6);
        if (fig_sel(&o, "1", f)) table(&R, f, "Table 1", "ablations under CRL", kT1, 1);
        if (fig_sel(&o, "11", f)) table(&R, f, "Table 11", "SPHERE with LayerNorm under CRL", kT11, 11);
        if (fig_sel(&o, "10", f)) table(&R, f, "Fig. 10", "SPHERE's ratio rho under CRL", NULL, 10);
    }
    free(states);
    if (cli_in_list(o.figures, "fmnist") && !o.train) /* sp_fmnist trains what is missing */
        cli_bprintf(&md, "\n### Fashion-MNIST: not tabulated with --train 0 (its runs train when missing)\n");
    else if (cli_in_list(o.figures, "fmnist")) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/fmnist", o.out);
        if (sp_fmnist(&o.sl, dir, !full, &md, json, &err) != SM_OK) {
            fprintf(stderr, "specmoe bench sphere: fmnist: %s\n", err.msg);
            failed++;
        }
    }
    char path[600];
    char *js = cJSON_Print(json);
    snprintf(path, sizeof path, "%s/summary.json", o.out);
    if (!js || cli_write_text(path, js)) failed++;
    free(js);
    snprintf(path, sizeof path, "%s/runs.jsonl", o.out);
    if (jl.s && cli_write_text(path, jl.s)) failed++;
    snprintf(path, sizeof path, "%s/summary.md", o.out);
    if (md.s) {
        if (cli_write_text(path, md.s)) failed++;
        printf("%s", md.s);
    }
    printf("\nbench-sphere done: failed=%d tables=%s/summary.md json=%s/summary.json runs=%s/runs.jsonl\n", failed, o.out,
           o.out, o.out);
    free(md.s), free(jl.s);
    cJSON_Delete(json);
    free(runs), free(ev);
    return failed ? CLI_EXIT_RUNTIME : 0;
}
