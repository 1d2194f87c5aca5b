/* specmoe bench tokenize: the study of "Don't Flatten, Tokenize!" (papers/003; issue 14) on the five
 * MinAtar games. Each figure of the paper is a set of network variants; every (variant, game, seed)
 * is one `specmoe rl train` run in its own directory, and every figure ends with `specmoe report`
 * over its runs: IQM, median, mean and optimality gap of the final returns, normalised per game by
 * the random policy (0) and the agent's best finished run under --out (1), with stratified-bootstrap
 * 95% intervals (Agarwal et al. 2021, the paper's protocol), and the interval plot as a PNG; the full
 * tier adds the IQM over training (`report --curves`), the form of the paper's figures.
 *
 * The networks (the paper's shapes at MinAtar scale; with the default encoder, MinAtar's conv 3x3x16,
 * a frame's encoder output is 8 x 8 x 16 and PerConv gives 64 tokens of width 16; --encoder
 * nature / impala below):
 *   baseline         conv -> flatten -> dense 128 -> Q           (the paper's penultimate layer: 128)
 *   baseline-x4      the penultimate layer 4x wider (512)
 *   softmoe-4        conv -> PerConv tokens -> SoftMoE, 4 experts of 16 -> 128 -> 16, slots per expert
 *                    p = ceil(64 / 4) = 16 (capacity factor 1) -> flatten -> Q
 *   softmoe-1-x4     one expert, its hidden layer 4x wider (512), p = 64 slots
 *   softmoe-1        one expert of the standard width (Fig. 7's "standard")
 *   *-perfeat, *-perpatch, *-shuffled: the same with PerFeat (16 tokens of 64), PerPatch (2x2
 *                    average-pooled patches: 16 tokens of 16) or Shuffled (a fixed random
 *                    permutation before PerConv) tokens
 *   tok-sum, tok-mean  the tokenised baseline of Fig. 5: PerConv tokens through the baseline's
 *                    dense 128 one token at a time, then summed / averaged over the tokens before the
 *                    final linear layer (Sec. 4.3: "prior to the final linear layer, we either sum ...
 *                    or take their average"; pooling before the dense layer would be Fig. 15's gap)
 *   *-x4             the same with the penultimate layer 4x wider (512): Fig. 5's and Fig. 15's
 *                    scaled rows; *-perfeat-* the tokenised baseline on PerFeat tokens (Fig. 5 runs
 *                    PerConv and PerFeat, unscaled and scaled)
 *   gap              global average pooling instead of flattening (Fig. 15)
 *   softmoe-1-x4-slots10, softmoe-1-x4-slot1  Fig. 8: SoftMoE-1 with its expert scaled 4x, with 10% of
 *                    its 64 slots (p = 6) and with a single slot; expert-choice-1-x4 and its 10%
 *                    (capacity 0.1: ceil(6.4) = 7 of 64 tokens), the paper's ExpertChoice-1 beside them
 *   expert-choice-4, token-choice-4  4 experts of 128 under expert choice (each picks within an
 *                    observation) and token-choice top-1 with capacity factor 1 per observation (16 of
 *                    its 64 tokens per expert, the first kept) and the raw softmax weight (a top-1
 *                    renormalised weight is 1 and gives the router no gradient) (Fig. 12)
 *   *-reset, *-sp    SoftMoE-4 with all experts reset, or shrink-and-perturbed (0.5, 0.5);
 *   *-reset-2, *-sp-2  the same on the 2 experts with the most dormant units (Fig. 11: all experts or
 *                    the most dormant subset). The period is the paper's share of the run: every 10%
 *                    for Rainbow-lite and DQN (20M of 200M frames), every 0.4% for DER (200K of 50M)
 *   *-prune-once, *-prune-gradual  SoftMoE-4 with two experts pruned during training: both at half
 *                    the run, or one at 1/5 and one at 4/5 of it (Fig. 19; sm_model_prune_last)
 *   Fig. 10 runs baseline, softmoe-4 and softmoe-1-x4 under DQN and DER.
 *   softmoe-4-t0.1, softmoe-1-x4-t0.1  figure "sharp", our ablation (not a paper figure): the same
 *                    networks with the router temperature 0.1, so the normalised logits start within
 *                    +-10 instead of +-1. At MinAtar's budget the learned scale only reaches 1.5-2.4
 *                    in 1M frames (245k Adam steps of at most lr = 6.25e-5 each), the dispatch and combine
 *                    weights stay near uniform, and every output token is nearly the average of the
 *                    slots: the figure measures how much of SoftMoE's deficit here is that (BENCHMARKS.md,
 *                    "Routing sharpness, and the ablation `sharp`"). One value, 0.1, chosen before any run
 *                    with it and not tuned.
 *
 * Agents: the paper runs every figure but Figs. 10 and 11 on Rainbow, so the full tier does too.
 * DQN and Rainbow-lite run the paper's Table 1 (`rl train --preset dopamine`: Adam 6.25e-5 / 1.5e-4,
 * batch 32, an update every 4 steps, target every 8000, learning after 20000, epsilon 1 -> 0.01
 * over 250k, MSE, no double Q; Rainbow-lite adds C51, 3-step returns and prioritised replay);
 * DER its own column (`der`'s defaults: Adam 1e-4, an update per step, 10-step returns, learning
 * after 1600; no sticky actions, as Table 1 and the Atari 100k protocol). Fig. 10 runs DQN and DER,
 * Fig. 11 DER and Rainbow-lite, as in the paper. The quick tier's 10k frames end before Rainbow's
 * first update, so it runs DER; a figure's own agent that would not learn within --frames is left
 * out with a note. `--agent` overrides the main agent.
 *
 * DER's frames. The paper trains DER for 50M frames and Rainbow and DQN for 200M (Sec. 4.3, Sec. 3):
 * with DER's update per agent step against Rainbow's every 4 steps, both make the same 12.5M
 * updates. The full tier keeps that ratio: DER runs a quarter of --frames (250k at the tier's 1M,
 * 250k updates, as Rainbow's 1M frames at an update every 4), which is --der-frames's default;
 * the quick tier, whose main agent is DER, gives DER --frames. A DER run's checkpoints, resets and
 * prunings are placed in its own frames.
 *
 * Tiers. --tier quick (the default) is a smoke test of the whole pipeline that finishes within 30
 * minutes on 2 cores: Figs. 1 and 5, games breakout and asterix, one seed, 10k frames; its tables
 * decide nothing and say so. --tier full runs every figure on the five games with 3 seeds and 1M
 * frames per run (DER 250k); its time is in BENCHMARKS.md. Either tier's settings can be overridden by flag.
 * --variants runs only some of the selected figures' variants (e.g. the cheap ones of every game
 * and seed first); the reports still take every finished run.
 * Runs are resumable: a run directory with a `done` file is skipped, one with a checkpoint resumes
 * it (`rl train --resume`, exact), so an interrupted study continues where it stopped. Each run
 * records its fresh command (DIR/command, cli_run_fingerprint); a finished or resumable run that
 * recorded another command than the plan's is refused before any work (exit 2). A run is held while
 * it trains (DIR/lock, cli_run_lock): several benches may share one --out, e.g. one queue per core
 * over the same figures, and each skips, as status=busy, a run another is training.
 *
 * Output: a line per run (bench-tokenize-run ...), then per figure a header line and the report's
 * table; run directories, train logs and figure PNGs under --out. A figure's table takes the (game,
 * seed) pairs whose runs of every variant of the figure finished, and names the pairs it leaves out,
 * so that its variants are compared on the same games and seeds while the tier is partial.
 * --report-only runs nothing and prints the reports over what has finished under --out (e.g. the runs
 * kept in the repository, restored by tools/softmoe_rl/runs_archive.sh). Each report's rows are named by
 * variant (`report --labels dir`), and every figure of one agent shares one normalisation: per game,
 * the best finished run of that agent anywhere under --out (`report --reference-runs`, the file
 * <agent>-<encoder>/reference-runs.txt), so that the same runs score alike in every figure. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/common.h"
#include "cli/flags.h"
#include "experiments/experiments.h"
#include "specmoe/rl/rliable.h"

typedef struct {
    const char *name;
    const char *args; /* rl train flags of the network, space-separated */
    int reset;        /* 1: add --reset-every, the paper's share of the run (reset_period) */
    int prune;        /* 1: prune 2 experts at half the run; 2: one at 1/5, one at 4/5 of the run */
} tk_variant;

static const tk_variant kVariants[] = {
    {"baseline", "--arch ENC,dense:128", 0, 0},
    {"baseline-x4", "--arch ENC,dense:512", 0, 0},
    {"softmoe-4", "--arch ENC,tokens,moe:128,flatten --router soft --experts 4", 0, 0},
    {"softmoe-1-x4", "--arch ENC,tokens,moe:512,flatten --router soft --experts 1", 0, 0},
    {"softmoe-4-t0.1", "--arch ENC,tokens,moe:128,flatten --router soft --experts 4 --temperature 0.1", 0, 0},
    {"softmoe-1-x4-t0.1", "--arch ENC,tokens,moe:512,flatten --router soft --experts 1 --temperature 0.1", 0, 0},
    {"softmoe-1", "--arch ENC,tokens,moe:128,flatten --router soft --experts 1", 0, 0},
    {"softmoe-1-perfeat", "--arch ENC,perfeat,moe:128,flatten --router soft --experts 1", 0, 0},
    {"softmoe-1-perpatch", "--arch ENC,avgpool:2:2,tokens,moe:128,flatten --router soft --experts 1", 0, 0},
    {"softmoe-1-shuffled", "--arch ENC,shuffle:7,tokens,moe:128,flatten --router soft --experts 1", 0, 0},
    {"softmoe-1-x4-perfeat", "--arch ENC,perfeat,moe:512,flatten --router soft --experts 1", 0, 0},
    {"softmoe-1-x4-perpatch", "--arch ENC,avgpool:2:2,tokens,moe:512,flatten --router soft --experts 1", 0, 0},
    {"softmoe-1-x4-shuffled", "--arch ENC,shuffle:7,tokens,moe:512,flatten --router soft --experts 1", 0, 0},
    {"tok-sum", "--arch ENC,tokens,dense:128,toksum", 0, 0},
    {"tok-mean", "--arch ENC,tokens,dense:128,tokmean", 0, 0},
    {"tok-sum-x4", "--arch ENC,tokens,dense:512,toksum", 0, 0},
    {"tok-mean-x4", "--arch ENC,tokens,dense:512,tokmean", 0, 0},
    {"tok-perfeat-sum", "--arch ENC,perfeat,dense:128,toksum", 0, 0},
    {"tok-perfeat-mean", "--arch ENC,perfeat,dense:128,tokmean", 0, 0},
    {"tok-perfeat-sum-x4", "--arch ENC,perfeat,dense:512,toksum", 0, 0},
    {"tok-perfeat-mean-x4", "--arch ENC,perfeat,dense:512,tokmean", 0, 0},
    {"gap", "--arch ENC,gap,dense:128", 0, 0},
    {"gap-x4", "--arch ENC,gap,dense:512", 0, 0},
    {"softmoe-1-x4-slots10", "--arch ENC,tokens,moe:512,flatten --router soft --experts 1 --slots 6", 0, 0},
    {"softmoe-1-x4-slot1", "--arch ENC,tokens,moe:512,flatten --router soft --experts 1 --slots 1", 0, 0},
    {"expert-choice-1-x4", "--arch ENC,tokens,moe:512,flatten --router expert-choice --experts 1", 0, 0},
    {"expert-choice-1-x4-slots10", "--arch ENC,tokens,moe:512,flatten --router expert-choice --experts 1 --capacity 0.1", 0, 0},
    {"expert-choice-4", "--arch ENC,tokens,moe:128,flatten --router expert-choice --experts 4", 0, 0},
    {"token-choice-4", "--arch ENC,tokens,moe:128,flatten --router topk --experts 4 --topk 1 --renorm 0 --capacity 1", 0, 0},
    {"softmoe-4-reset", "--arch ENC,tokens,moe:128,flatten --router soft --experts 4 --reset-experts 0", 1, 0},
    {"softmoe-4-sp",
     "--arch ENC,tokens,moe:128,flatten --router soft --experts 4 --reset-shrink 0.5 --reset-perturb 0.5", 1, 0},
    {"softmoe-4-reset-2", "--arch ENC,tokens,moe:128,flatten --router soft --experts 4 --reset-experts 2", 1, 0},
    {"softmoe-4-sp-2",
     "--arch ENC,tokens,moe:128,flatten --router soft --experts 4 --reset-experts 2 --reset-shrink 0.5 --reset-perturb 0.5", 1, 0},
    {"softmoe-4-prune-once", "--arch ENC,tokens,moe:128,flatten --router soft --experts 4 --prune-experts 2", 0, 1},
    {"softmoe-4-prune-gradual", "--arch ENC,tokens,moe:128,flatten --router soft --experts 4 --prune-experts 2", 0, 2},
};
#define N_VARIANTS ((int)(sizeof kVariants / sizeof kVariants[0]))

typedef struct {
    const char *id, *what;
    const char *variants[12]; /* NULL-terminated */
    const char *agents;       /* NULL: the bench's agent; else a comma list run for every variant */
    /* The paper's claims for `report --claims` ("A>B;C~D;E!>F", see cli/cmd_report.c), from its text,
     * not from our runs (fixed 2026-11-29, with 26 of the full tier's 675 runs in; the ablation
     * sharp's are ours, see below); "agent:" before a claim limits it to that agent's report. NULL:
     * none. */
    const char *claims;
} tk_figure;

/* The claims, from the paper's text (../shared/papers/003_*.txt):
 *  1   softmoe-4 > baseline: the premise (Obando Ceron et al. 2024; Fig. 1); baseline > baseline-x4:
 *      "the performance degradation observed in the baseline, even when increasing its width"
 *      (Fig. 4); softmoe-1-x4 ~ softmoe-4: "A single scaled expert matches the performance of
 *      multiple experts" (Fig. 1); expert-choice-1-x4 ~ softmoe-4: "even with a single expert the
 *      performance is comparable to that of SoftMoE with multiple experts" (Fig. 6).
 *  7   "PerConv performs best, and in particular outperforms PerFeat ... Shuffled is the worst":
 *      PerConv above PerFeat and Shuffled, standard and scaled (PerPatch "is close": no claim).
 *  5   "Tokenization with a scaled representation can yield significant performance gains": the
 *      scaled PerConv sum and mean above the scaled flattened baseline.
 *  8   "with only 10% of the default number of slots ..., and even with a single slot, achieves a
 *      comparable performance"; "the reduced performance of ExpertChoice-1" at 10% of the slots.
 *  12  "expert choice routing consistently outperforms token choice routing".
 *  15  "global average pooling improves the performance of the baseline and enables scaling".
 *  10  DQN: "SoftMoE-1 does not appear to offer significant improvements over the baseline" (!>);
 *      DER: "SoftMoE-4 achieves a superior performance over the baseline, SoftMoE-1 is able to
 *      offer the same gains".
 *  11  "Resets and S&P seem to benefit DER, but degrade performance for Rainbow" (all experts).
 *  19  "pruning these experts does not change the performance of the agent".
 *  sharp  ours, not the paper's: the hypothesis the ablation was planned to test (BENCHMARKS.md, the
 *      routing sharpness: near-uniform routing is SoftMoE's deficit here), as claims - sharpening
 *      helps both networks - and Fig. 1's first and third claims again with sharpened routing.
 *      Added 2026-11-29 (sixth session), when 9 of the ablation's 30 sharpened runs had finished
 *      (seed 1 of four games, Asterix s2); the other 21 decided them (BENCHMARKS.md, "Routing sharpness"). */
static const tk_figure kFigures[] = {
    {"1", "Figs. 1/6: scaling the penultimate layer vs SoftMoE, and a single scaled expert under expert choice (Fig. 6)",
     {"baseline", "baseline-x4", "softmoe-4", "softmoe-1-x4", "expert-choice-1-x4"}, NULL,
     "softmoe-4>baseline;baseline>baseline-x4;softmoe-1-x4~softmoe-4;expert-choice-1-x4~softmoe-4"},
    {"7", "Fig. 7: tokenisation for SoftMoE-1, standard and scaled",
     {"softmoe-1", "softmoe-1-perfeat", "softmoe-1-perpatch", "softmoe-1-shuffled", "softmoe-1-x4", "softmoe-1-x4-perfeat",
      "softmoe-1-x4-perpatch", "softmoe-1-x4-shuffled"},
     NULL,
     "softmoe-1>softmoe-1-perfeat;softmoe-1>softmoe-1-shuffled;softmoe-1-x4>softmoe-1-x4-perfeat;"
     "softmoe-1-x4>softmoe-1-x4-shuffled"},
    {"5", "Fig. 5: tokenised baseline without experts (PerConv and PerFeat, sum and mean, unscaled and scaled)",
     {"baseline", "tok-sum", "tok-mean", "tok-perfeat-sum", "tok-perfeat-mean", "baseline-x4", "tok-sum-x4", "tok-mean-x4",
      "tok-perfeat-sum-x4", "tok-perfeat-mean-x4"},
     NULL, "tok-sum-x4>baseline-x4;tok-mean-x4>baseline-x4"},
    {"8", "Fig. 8: fewer slots with a single scaled expert, SoftMoE and expert choice",
     {"softmoe-1-x4", "softmoe-1-x4-slots10", "softmoe-1-x4-slot1", "expert-choice-1-x4", "expert-choice-1-x4-slots10"}, NULL,
     "softmoe-1-x4-slots10~softmoe-1-x4;softmoe-1-x4-slot1~softmoe-1-x4;softmoe-1-x4-slots10>expert-choice-1-x4-slots10"},
    {"12", "Fig. 12: expert choice vs token choice", {"softmoe-4", "expert-choice-4", "token-choice-4"}, NULL,
     "expert-choice-4>token-choice-4"},
    {"15", "Fig. 15: global average pooling, unscaled and scaled", {"baseline", "gap", "baseline-x4", "gap-x4", "softmoe-4"}, NULL,
     "gap>baseline;gap-x4>baseline-x4"},
    {"10", "Fig. 10: other agents (DQN, DER)", {"baseline", "softmoe-4", "softmoe-1-x4"}, "dqn,der",
     "dqn:softmoe-1-x4!>baseline;der:softmoe-4>baseline;der:softmoe-1-x4~softmoe-4"},
    {"11", "Fig. 11: resets and shrink-and-perturb of all experts or the 2 most dormant",
     {"softmoe-4", "softmoe-4-reset", "softmoe-4-sp", "softmoe-4-reset-2", "softmoe-4-sp-2"}, "der,rainbow",
     "rainbow:softmoe-4>softmoe-4-reset;rainbow:softmoe-4>softmoe-4-sp;der:softmoe-4-reset>softmoe-4;der:softmoe-4-sp>softmoe-4"},
    {"sharp", "Ablation, not a paper figure: SoftMoE-4 and SoftMoE-1 x4 with their routing sharpened (temperature 0.1)",
     {"baseline", "softmoe-4", "softmoe-4-t0.1", "softmoe-1-x4", "softmoe-1-x4-t0.1"}, NULL,
     "softmoe-4-t0.1>softmoe-4;softmoe-1-x4-t0.1>softmoe-1-x4;softmoe-4-t0.1>baseline;softmoe-1-x4-t0.1~softmoe-4-t0.1"},
    {"19", "Fig. 19: two of SoftMoE-4's experts pruned during training, once or gradually",
     {"softmoe-4", "softmoe-4-prune-once", "softmoe-4-prune-gradual"}, NULL,
     "softmoe-4-prune-once~softmoe-4;softmoe-4-prune-gradual~softmoe-4"},
};
#define N_FIGURES ((int)(sizeof kFigures / sizeof kFigures[0]))

static const char *const kAgents[3] = {"dqn", "der", "rainbow"};

/* 1 if the variant is one of figure F's */
static int fig_member(const tk_figure *F, const char *variant) {
    for (int vi = 0; F->variants[vi]; vi++)
        if (!strcmp(F->variants[vi], variant)) return 1;
    return 0;
}

/* F's claims for agent's report into buf (the "agent:" prefixes resolved, ';'-separated, "" when
 * none); -1 when a claim names a variant that is not F's (kFigures is checked at every start) */
static int fig_claims(const tk_figure *F, const char *agent, char *buf, size_t cap) {
    buf[0] = 0;
    size_t at = 0;
    for (const char *p = F->claims; p && *p;) {
        const char *end = strchr(p, ';'), *colon = strchr(p, ':');
        if (!end) end = p + strlen(p);
        const char *c = p;
        int mine = 1;
        /* "agent:" only when the text before the first colon is one of kAgents (a variant name may
         * hold a colon) */
        for (int a = 0; colon && colon < end && a < (int)(sizeof kAgents / sizeof kAgents[0]); a++)
            if ((size_t)(colon - p) == strlen(kAgents[a]) && !strncmp(p, kAgents[a], (size_t)(colon - p))) {
                mine = !strcmp(kAgents[a], agent);
                c = colon + 1;
            }
        /* a claim (the report's syntax, sm_claim_parse) between two of F's variants */
        sm_claim cl;
        if (sm_claim_parse(c, end, &cl) || !fig_member(F, cl.a) || !fig_member(F, cl.b)) return -1;
        if (mine) {
            if (at + (size_t)(end - c) + 2 > cap) return -1;
            at += (size_t)snprintf(buf + at, cap - at, "%s%.*s", at ? ";" : "", (int)(end - c), c);
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

static const tk_variant *find_variant(const char *name) {
    for (int i = 0; i < N_VARIANTS; i++)
        if (!strcmp(kVariants[i].name, name)) return &kVariants[i];
    return NULL;
}


/* The encoders, scaled to MinAtar's 10 x 10 frames (ENC in the variants' --arch):
 *   minatar  MinAtar's DQN encoder, conv 3x3x16, stride 1, no padding: 8 x 8 x 16 (64 tokens of 16)
 *   nature   the Nature-CNN's three convolutions with its channels 32-64-64, but 3 x 3 kernels of
 *            stride 1 without padding instead of 8x8/4, 4x4/2, 3x3/1, which a 10 x 10 frame cannot
 *            take (the first alone would leave 1 x 1): 10 -> 8 -> 6 -> 4, so 4 x 4 x 64 (16 tokens of 64)
 *   impala   the Impala ResNet's three stacks (conv 3x3 16/32/32, max-pool, two residual blocks each,
 *            a final activation), pooled 2:2 in the first stack and 2:1 in the second and not in the
 *            third, where Impala pools 3:2 with padding three times (84 -> 11): 10 -> 5 -> 4 -> 4, so
 *            4 x 4 x 32 (16 tokens of 32) */
static const char *const kEncoders[][2] = {
    {"minatar", "conv:16:3:1:0"},
    {"nature", "conv:32:3:1:0,conv:64:3:1:0,conv:64:3:1:0"},
    {"impala", "conv:16:3:1:1,maxpool:2:2,res:16,res:16,conv:32:3:1:1,maxpool:2:1,res:32,res:32,conv:32:3:1:1,res:32,"
               "res:32,act"},
};

typedef struct {
    const char *tier, *figures, *games, *agent, *out, *encoder, *enc_arch, *variants;
    int seeds, jobs, dry_run, report_only, reps;
    long frames, der_frames; /* frames per run: DQN and Rainbow-lite, and DER */
} tk_opts;

typedef struct {
    char dir[512], log[560];
    cli_argv cmd;
    char fp[CLI_ARGV_BUF]; /* the fresh run's fingerprint (cli_run_fingerprint), kept in DIR/command */
    const tk_variant *v;
    char agent[16], game[32];
    int game_i, seed, skip, resume; /* game_i: the game's index in the five games */
    int unselected;                 /* not in --variants: reported, not run */
    pid_t pid;
    int lock; /* the run's lock (cli_run_lock) while it trains, held until its `done` is written */
    double t0;
} tk_run;

/* The frame of an agent's first update: DQN and Rainbow-lite under `--preset dopamine`, DER under
 * its defaults (src/rl/dqn.c). */
static int learning_start(const char *agent) { return strcmp(agent, "der") ? 20000 : 1600; }
/* the frames of one run of the agent */
static long agent_frames(const tk_opts *o, const char *agent) { return strcmp(agent, "der") ? o->frames : o->der_frames; }
static int agent_learns(const tk_opts *o, const char *agent) { return agent_frames(o, agent) > learning_start(agent); }
/* Frames between resets: the paper's share of a run (B.5.2: Rainbow every 20M of 200M frames; DER
 * every 200K of 50M), one frame more, so that the last reset falls before the run's last frame
 * (parts - 1 resets; the final network is not a freshly reset one). */
static long reset_period(const tk_opts *o, const char *agent) {
    const long f = agent_frames(o, agent), parts = strcmp(agent, "der") ? 10 : 250;
    return f / parts + 1;
}

/* 1 if figure F is selected and runs under agent kAgents[a] (its own agents, or the bench's); a
 * figure's own agent whose learning would start after the run's last frame is left out */
static int fig_runs(const tk_figure *F, const tk_opts *o, int a) {
    return cli_in_list(o->figures, F->id) && cli_in_list(F->agents ? F->agents : o->agent, kAgents[a]) &&
           agent_learns(o, kAgents[a]);
}

/* the command line of the run from its start */
static int fresh_command(cli_argv *a, const tk_run *r, const tk_opts *o, const char *self) {
    memset(a, 0, sizeof *a);
    int bad = cli_argv_push(a, self) | cli_argv_push(a, "rl") | cli_argv_push(a, "train");
    char num[48];
    const long frames = agent_frames(o, r->agent);
    snprintf(num, sizeof num, "minatar/%s", r->game);
    bad |= cli_argv_push(a, "--env") | cli_argv_push(a, num) | cli_argv_push(a, "--agent") |
           cli_argv_push(a, r->agent);
    if (strcmp(r->agent, "der")) bad |= cli_argv_push(a, "--preset") | cli_argv_push(a, "dopamine");
    else bad |= cli_argv_push(a, "--sticky") | cli_argv_push(a, "0"); /* Table 1: DER without sticky actions */
    snprintf(num, sizeof num, "%ld", frames);
    bad |= cli_argv_push(a, "--frames") | cli_argv_push(a, num);
    snprintf(num, sizeof num, "%d", r->seed);
    bad |= cli_argv_push(a, "--seed") | cli_argv_push(a, num) | cli_argv_push(a, "--threads") |
           cli_argv_push(a, "1") | cli_argv_push(a, "--out") | cli_argv_push(a, r->dir) |
           cli_argv_push(a, "--progress-every") | cli_argv_push(a, "60");
    snprintf(num, sizeof num, "%ld", frames / 10 > 1000 ? frames / 10 : 1000); /* a checkpoint per tenth */
    bad |= cli_argv_push(a, "--ckpt-every") | cli_argv_push(a, num);
    if (r->v->reset) {
        snprintf(num, sizeof num, "%ld", reset_period(o, r->agent));
        bad |= cli_argv_push(a, "--reset-every") | cli_argv_push(a, num);
    }
    if (r->v->prune) {
        snprintf(num, sizeof num, "%ld", r->v->prune == 1 ? frames / 2 : frames / 5);
        bad |= cli_argv_push(a, "--prune-from") | cli_argv_push(a, num);
        snprintf(num, sizeof num, "%ld", r->v->prune == 1 ? frames / 2 : 4 * frames / 5);
        bad |= cli_argv_push(a, "--prune-to") | cli_argv_push(a, num);
    }
    char args[512];
    snprintf(args, sizeof args, "%s", r->v->args);
    for (char *save = NULL, *t = strtok_r(args, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (!strncmp(t, "ENC,", 4)) { /* the encoder in front of the variant's layers */
            char arch[400];
            snprintf(arch, sizeof arch, "%s,%s", o->enc_arch, t + 4);
            bad |= cli_argv_push(a, arch);
        } else {
            bad |= cli_argv_push(a, t);
        }
    }
    return bad;
}

/* one line of a run's fate: "bench-tokenize-run agent=A variant=V game=G seed=S status=STATUS" */
static void run_line(const tk_run *r, const char *status) {
    printf("bench-tokenize-run agent=%s variant=%s game=%s seed=%d status=%s\n", r->agent, r->v->name, r->game, r->seed,
           status);
    fflush(stdout);
}

/* the run's command line: a fresh run, or the resumption of its checkpoint; either way the fresh
 * command's fingerprint, which a finished or resumed run's directory must have recorded */
static int plan_run(tk_run *r, const tk_opts *o, const char *self) {
    char buf[600];
    snprintf(buf, sizeof buf, "%s/done", r->dir);
    r->skip = cli_file_exists(buf);
    int bad = fresh_command(&r->cmd, r, o, self) || cli_run_fingerprint(&r->cmd, o->out, r->fp, sizeof r->fp);
    snprintf(buf, sizeof buf, "%s/checkpoint.safetensors", r->dir);
    r->resume = cli_file_exists(buf);
    if (r->resume) {
        cli_argv *a = &r->cmd;
        memset(a, 0, sizeof *a);
        bad |= cli_argv_push(a, self) | cli_argv_push(a, "rl") | cli_argv_push(a, "train") | cli_argv_push(a, "--resume") |
               cli_argv_push(a, buf) | cli_argv_push(a, "--threads") | cli_argv_push(a, "1");
    }
    return bad;
}

/* Every finished run of agent a under --out (<agent>-<encoder>/<variant>/<game>-s<seed>/done) into
 * path, one directory per line: the pool whose best run per game is each report's reference. */
static int write_reference_runs(const tk_opts *o, const char *agent, const char *path) {
    char root[600];
    snprintf(root, sizeof root, "%s/%s-%s", o->out, agent, o->encoder);
    struct stat st;
    if (stat(root, &st) != 0) return 0; /* no run of the agent yet (--report-only): no report to normalise */
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    DIR *d = opendir(root);
    for (struct dirent *v; d && (v = readdir(d));) {
        if (v->d_name[0] == '.') continue;
        char vdir[900];
        snprintf(vdir, sizeof vdir, "%s/%s", root, v->d_name);
        DIR *e = opendir(vdir);
        for (struct dirent *g; e && (g = readdir(e));) {
            if (g->d_name[0] == '.') continue;
            char done[1300];
            snprintf(done, sizeof done, "%s/%s/done", vdir, g->d_name);
            if (cli_file_exists(done)) fprintf(f, "%s/%s\n", vdir, g->d_name);
        }
        if (e) closedir(e);
    }
    if (d) closedir(d);
    return fclose(f) ? -1 : 0;
}

static void print_cmd(FILE *f, const tk_run *r) {
    for (int i = 0; i < r->cmd.argc; i++) fprintf(f, "%s%s", i ? " " : "", r->cmd.argv[i]);
    fprintf(f, "\n");
}

int exp_softmoe_tokenize(int argc, char **argv) {
    tk_opts o;
    memset(&o, 0, sizeof o);
    const char *figures = NULL, *games = NULL;
    long frames = 0, der_frames = 0;
    int seeds = 0;
    fl_flag fl[] = {
        {"tier", FL_STRING, &o.tier, "quick", "quick (a smoke test, < 30 min on 2 cores) | full (decides the claims)", 0},
        {"figures", FL_STRING, &figures, NULL, "comma list of figures (1,7,5,8,12,15,10,11,19,sharp; quick: 1,5; full: all)", 0},
        {"games", FL_STRING, &games, NULL, "comma list of MinAtar games (quick: breakout,asterix; full: all five)", 0},
        {"seeds", FL_INT, &seeds, "0", "seeds per variant and game (0: the tier's: quick 1, full 3)", 0},
        {"frames", FL_LONG, &frames, "0", "frames per run of DQN and Rainbow-lite (0: the tier's: quick 10000, full 1000000)", 0},
        {"der-frames", FL_LONG, &der_frames, "0",
         "frames per DER run (0: the tier's: quick --frames, full --frames / 4, the paper's 50M against 200M)", 0},
        {"agent", FL_STRING, &o.agent, NULL, "der | rainbow | dqn: the agent of every figure but Figs. 10 and 11 (quick: der, full: rainbow)", 0},
        {"encoder", FL_STRING, &o.encoder, "minatar", "minatar | nature | impala (scaled to 10 x 10)", 0},
        {"jobs", FL_INT, &o.jobs, "2", "runs at once (one thread each)", 0},
        {"reps", FL_INT, &o.reps, "2000", "bootstrap replicates of the reports", 0},
        {"out", FL_STRING, &o.out, "runs/bench-tokenize", "directory of the runs, logs and figures", 0},
        {"variants", FL_STRING, &o.variants, NULL,
         "comma list: run only these variants of the selected figures (the reports still take every variant's "
         "finished runs; e.g. the cheap ones first)", 0},
        {"dry-run", FL_BOOL, &o.dry_run, "0", "print the runs' command lines and stop", 0},
        {"report-only", FL_BOOL, &o.report_only, "0",
         "run nothing: the figures' reports over the runs already finished under --out (e.g. restored by "
         "tools/softmoe_rl/runs_archive.sh)", 0},
    };
    int full;
    int rc = cli_parse_study(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, "tokenize", &o.tier, &full);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    for (int f = 0; f < N_FIGURES; f++) { /* the claims' names are their figures' variants */
        char buf[1024];
        if (fig_claims(&kFigures[f], "", buf, sizeof buf)) {
            fprintf(stderr, "specmoe bench tokenize: internal error: Fig. %s's claims name a variant it does not run\n",
                    kFigures[f].id);
            return CLI_EXIT_RUNTIME;
        }
    }
    o.figures = figures ? figures : full ? "1,7,5,8,12,15,10,11,19,sharp" : "1,5";
    o.games = games ? games : full ? "breakout,asterix,freeway,seaquest,space_invaders" : "breakout,asterix";
    o.seeds = seeds > 0 ? seeds : full ? 3 : 1;
    o.frames = frames > 0 ? frames : full ? 1000000 : 10000;
    o.der_frames = der_frames > 0 ? der_frames : full ? o.frames / 4 : o.frames;
    if (!o.agent) o.agent = full ? "rainbow" : "der";
    if (o.jobs < 1 || o.jobs > 64 || o.reps < 100 || o.seeds > 100 || seeds < 0 || frames < 0 || der_frames < 0) {
        fprintf(stderr, "specmoe bench tokenize: need --jobs in [1, 64], --reps >= 100, --seeds in [0, 100], --frames and --der-frames >= 0\n");
        return CLI_EXIT_USAGE;
    }
    if (strcmp(o.agent, "der") && strcmp(o.agent, "rainbow") && strcmp(o.agent, "dqn")) {
        fprintf(stderr, "specmoe bench tokenize: --agent must be der, rainbow or dqn (got '%s')\n", o.agent);
        return CLI_EXIT_USAGE;
    }
    int main_used = 0; /* a selected figure runs the main agent */
    for (int f = 0; f < N_FIGURES; f++) main_used |= cli_in_list(o.figures, kFigures[f].id) && !kFigures[f].agents;
    if (main_used && !agent_learns(&o, o.agent)) {
        fprintf(stderr, "specmoe bench tokenize: --agent %s learns after %d frames; --%s %ld ends before\n", o.agent,
                learning_start(o.agent), strcmp(o.agent, "der") ? "frames" : "der-frames", agent_frames(&o, o.agent));
        return CLI_EXIT_USAGE;
    }
    for (int f = 0; f < N_FIGURES; f++)
        for (int a = 0; a < 3 && kFigures[f].agents; a++)
            if (cli_in_list(o.figures, kFigures[f].id) && cli_in_list(kFigures[f].agents, kAgents[a]) &&
                !agent_learns(&o, kAgents[a]))
                printf("bench-tokenize note: Fig. %s leaves out %s, which learns after %d frames (--%s %ld)\n", kFigures[f].id,
                       kAgents[a], learning_start(kAgents[a]), strcmp(kAgents[a], "der") ? "frames" : "der-frames", agent_frames(&o, kAgents[a]));
    o.enc_arch = NULL;
    for (size_t e = 0; e < sizeof kEncoders / sizeof kEncoders[0]; e++)
        if (!strcmp(o.encoder, kEncoders[e][0])) o.enc_arch = kEncoders[e][1];
    if (!o.enc_arch) {
        fprintf(stderr, "specmoe bench tokenize: --encoder must be minatar, nature or impala (got '%s')\n", o.encoder);
        return CLI_EXIT_USAGE;
    }
    static const char *const kGames[] = {"breakout", "asterix", "freeway", "seaquest", "space_invaders"};
    int n_games = 0;
    for (int g = 0; g < 5; g++) n_games += cli_in_list(o.games, kGames[g]);
    int n_figs = 0;
    for (int f = 0; f < N_FIGURES; f++) n_figs += cli_in_list(o.figures, kFigures[f].id);
    /* every element of the lists must be known */
    for (int which = 0; which < 2; which++) {
        char b[256];
        snprintf(b, sizeof b, "%s", which ? o.games : o.figures);
        for (char *save = NULL, *t = strtok_r(b, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int known = 0;
            for (int i = 0; i < (which ? 5 : N_FIGURES); i++) known |= !strcmp(t, which ? kGames[i] : kFigures[i].id);
            if (!known) {
                fprintf(stderr, "specmoe bench tokenize: unknown %s '%s' (%s)\n", which ? "game" : "figure", t,
                        which ? "breakout, asterix, freeway, seaquest, space_invaders" : "1, 7, 5, 8, 12, 15, 10, 11, 19, sharp");
                return CLI_EXIT_USAGE;
            }
        }
    }
    if (!n_games || !n_figs) {
        fprintf(stderr, "specmoe bench tokenize: no figure or no game selected\n");
        return CLI_EXIT_USAGE;
    }
    /* --variants: each a variant of a selected figure */
    if (o.variants) {
        char b[1024];
        snprintf(b, sizeof b, "%s", o.variants);
        for (char *save = NULL, *t = strtok_r(b, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int in_fig = 0;
            for (int f = 0; f < N_FIGURES; f++) in_fig |= cli_in_list(o.figures, kFigures[f].id) && fig_member(&kFigures[f], t);
            if (!in_fig) {
                fprintf(stderr, "specmoe bench tokenize: variant '%s' is %s\n", t,
                        find_variant(t) ? "in none of the selected figures" : "unknown (`--dry-run` lists the plan's)");
                return CLI_EXIT_USAGE;
            }
        }
    }
    char self[512];
    if (cli_self_exe(self, sizeof self)) {
        fprintf(stderr, "specmoe bench tokenize: cannot find the specmoe executable (/proc/self/exe)\n");
        return CLI_EXIT_RUNTIME;
    }

    /* the distinct runs of the selected figures: (agent, variant, game, seed) */
    int cap = N_FIGURES * 12 * 2 * 5 * o.seeds, n = 0;
    tk_run *runs = calloc((size_t)cap, sizeof *runs);
    if (!runs) return CLI_EXIT_RUNTIME;
    for (int f = 0; f < N_FIGURES; f++) {
        const tk_figure *F = &kFigures[f];
        for (int a = 0; a < 3; a++) {
            if (!fig_runs(F, &o, a)) continue;
            for (int vi = 0; F->variants[vi]; vi++)
                for (int g = 0; g < 5; g++) {
                    if (!cli_in_list(o.games, kGames[g])) continue;
                    for (int s = 1; s <= o.seeds; s++) {
                        const tk_variant *v = find_variant(F->variants[vi]);
                        char dir[512];
                        snprintf(dir, sizeof dir, "%s/%s-%s/%s/%s-s%d", o.out, kAgents[a], o.encoder, v->name, kGames[g], s);
                        int dup = 0;
                        for (int i = 0; i < n && !dup; i++) dup = !strcmp(runs[i].dir, dir);
                        if (dup) continue;
                        tk_run *r = &runs[n++];
                        snprintf(r->dir, sizeof r->dir, "%s", dir);
                        snprintf(r->log, sizeof r->log, "%s/train.log", dir);
                        snprintf(r->agent, sizeof r->agent, "%s", kAgents[a]);
                        snprintf(r->game, sizeof r->game, "%s", kGames[g]);
                        r->v = v;
                        r->seed = s;
                        r->game_i = g;
                        r->lock = -1;
                        r->unselected = o.variants && !cli_in_list(o.variants, v->name);
                        if (plan_run(r, &o, self)) {
                            fprintf(stderr, "specmoe bench tokenize: command line of %s too long\n", dir);
                            free(runs);
                            return CLI_EXIT_RUNTIME;
                        }
                    }
                }
        }
    }
    /* a finished or resumed run must have started as this plan's run: a directory named by its
     * variant alone would otherwise hand an earlier plan's run (other flags, the same name) to the
     * reports, or continue it */
    int stale = 0, unrecorded = 0;
    for (int i = 0; i < n; i++)
        if (runs[i].skip || runs[i].resume) cli_run_plan_verify("tokenize", runs[i].dir, runs[i].fp, &stale, &unrecorded);
    if (stale) {
        fprintf(stderr, "specmoe bench tokenize: %d finished or started run(s) under %s ran other commands: remove them to "
                        "run them again, or choose another --out\n", stale, o.out);
        free(runs);
        return CLI_EXIT_USAGE;
    }
    if (unrecorded)
        printf("bench-tokenize: %d finished or started run(s) have no recorded command (made before fingerprints) and are "
               "taken as planned\n", unrecorded);
    printf("bench-tokenize tier=%s%s figures=%s games=%s seeds=%d frames=%ld der_frames=%ld agent=%s encoder=%s runs=%d jobs=%d "
           "out=%s\n",
           o.tier, full ? "" : " (a smoke test of the pipeline: these tables decide no claim)", o.figures, o.games, o.seeds,
           o.frames, o.der_frames, o.agent, o.encoder, n, o.jobs, o.out);
    if (o.dry_run) {
        for (int i = 0; i < n; i++) {
            printf("%s", runs[i].skip ? "# done: " : runs[i].unselected ? "# not in --variants: " : "");
            print_cmd(stdout, &runs[i]);
        }
        free(runs);
        return 0;
    }

    /* run them, o.jobs at a time (none with --report-only) */
    int next = o.report_only ? n : 0, running = 0, failed = 0, busy = 0;
    const double t_start = sm_time_now();
    if (o.report_only) {
        int finished = 0;
        for (int i = 0; i < n; i++) finished += runs[i].skip;
        printf("bench-tokenize report-only: %d of the %d planned runs finished\n", finished, n);
    }
    while (next < n || running > 0) {
        while (running < o.jobs && next < n) {
            tk_run *r = &runs[next++];
            if (r->unselected) continue;
            if (r->skip) {
                run_line(r, "done-before");
                continue;
            }
            /* the run is held while it trains (cli_run_lock): another bench on this --out, e.g. the
             * other core's queue, skips it, and it is planned again under the lock, since that
             * bench may have finished or started it after this one's plan */
            const int lock = cli_mkdirs(r->dir) ? -1 : cli_run_lock(r->dir);
            if (lock == -2) {
                char why[600];
                snprintf(why, sizeof why, "busy (another process holds %s/lock)", r->dir);
                run_line(r, why);
                busy++;
                continue;
            }
            int bad = lock < 0 || plan_run(r, &o, self), stale_now = 0, unrec = 0;
            /* finished or started meanwhile by a bench of another plan (other flags, one --out): left
             * alone, as the check before any work would have; counted as failed (exit 1) */
            if (!bad && (r->skip || r->resume)) cli_run_plan_verify("tokenize", r->dir, r->fp, &stale_now, &unrec);
            if (!bad && !stale_now && r->skip) {
                close(lock);
                run_line(r, "done-before");
                continue;
            }
            if (bad || stale_now || (!r->resume && cli_run_plan_write(r->dir, r->fp))) {
                if (stale_now)
                    fprintf(stderr, "specmoe bench tokenize: %s was finished or started meanwhile by another plan: left alone\n",
                            r->dir);
                else
                    fprintf(stderr, "specmoe bench tokenize: cannot create or lock %s, or write its command file\n", r->dir);
                if (lock >= 0) close(lock);
                failed++;
                continue;
            }
            r->t0 = sm_time_now();
            r->pid = cli_spawn(&r->cmd, r->log); /* the training inherits the lock */
            if (r->pid < 0) {
                close(lock);
                fprintf(stderr, "specmoe bench tokenize: fork failed\n");
                failed++;
                continue;
            }
            /* this bench keeps it too, until `done` is written, but no later training inherits it */
            if (fcntl(lock, F_SETFD, FD_CLOEXEC) != 0)
                fprintf(stderr, "specmoe bench tokenize: %s/lock: cannot mark it close-on-exec\n", r->dir);
            r->lock = lock;
            running++;
        }
        if (!running) break;
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) break;
        for (int i = 0; i < n; i++) {
            tk_run *r = &runs[i];
            if (r->pid != pid) continue;
            running--;
            r->pid = 0;
            int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (ok) {
                char done[600];
                snprintf(done, sizeof done, "%s/done", r->dir);
                ok = cli_write_text(done, "done\n") == 0;
            }
            failed += !ok;
            close(r->lock);
            r->lock = -1;
            char what[700];
            snprintf(what, sizeof what, "%s seconds=%.0f log=%s", ok ? "ok" : "failed", sm_time_now() - r->t0, r->log);
            run_line(r, what);
        }
    }
    int selected = 0;
    for (int i = 0; i < n; i++) selected += !runs[i].unselected;
    if (!o.report_only)
        printf("bench-tokenize runs=%d failed=%d busy=%d seconds=%.0f\n", selected, failed, busy, sm_time_now() - t_start);
    /* the reports still come, over the runs that finished (a failed run's game and seed are left
     * out of its figures, which name them); the exit status says that some failed */

    /* each reporting agent's reference pool, written once (every figure of the agent reads it) */
    char pools[3][700];
    int pool_ok[3] = {0};
    for (int a = 0; a < 3; a++) {
        int used = 0;
        for (int f = 0; f < N_FIGURES; f++) used |= fig_runs(&kFigures[f], &o, a);
        snprintf(pools[a], sizeof pools[a], "%s/%s-%s/reference-runs.txt", o.out, kAgents[a], o.encoder);
        if (used && !(pool_ok[a] = write_reference_runs(&o, kAgents[a], pools[a]) == 0))
            fprintf(stderr, "specmoe bench tokenize: cannot write %s\n", pools[a]);
    }

    /* a report per figure and agent over its runs */
    for (int f = 0; f < N_FIGURES; f++) {
        const tk_figure *F = &kFigures[f];
        for (int a = 0; a < 3; a++) {
            if (!fig_runs(F, &o, a)) continue;
            /* specmoe report RUN_DIR... --out PNG --reps R --labels dir --reference-runs FILE [--claims C]
             * [--curves PNG --curve-every 50000] and NULL: 2 + n + 14 + 1 at most; the directories are the
             * runs' own strings */
            const char **av = calloc((size_t)n + 17, sizeof *av);
            if (!av) {
                failed++;
                continue;
            }
            /* A figure compares its variants on the same games and seeds: only the (game, seed)
             * pairs whose runs of every variant finished enter its report (a partial tier's table,
             * or a failed run, would otherwise set one variant's seeds beside another's). */
            int n_var = 0;
            while (F->variants[n_var]) n_var++;
            int done_in[5][101] = {{0}}, planned[5][101] = {{0}};
            for (int i = 0; i < n; i++) {
                if (strcmp(runs[i].agent, kAgents[a]) || !fig_member(F, runs[i].v->name)) continue;
                const int g = runs[i].game_i;
                char done[600];
                snprintf(done, sizeof done, "%s/done", runs[i].dir);
                planned[g][runs[i].seed] = 1;
                done_in[g][runs[i].seed] += cli_file_exists(done);
            }
            int ac = 0, pairs = 0, pairs_planned = 0;
            char left[1024] = "";
            size_t left_at = 0;
            av[ac++] = self;
            av[ac++] = "report";
            for (int g = 0; g < 5; g++)
                for (int s = 1; s <= o.seeds; s++) {
                    if (!planned[g][s]) continue;
                    pairs_planned++;
                    if (done_in[g][s] == n_var) {
                        pairs++;
                        continue;
                    }
                    if (left_at < sizeof left - 64)
                        left_at += (size_t)snprintf(left + left_at, sizeof left - left_at, " %s-s%d (%d of %d runs)",
                                                    kGames[g], s, done_in[g][s], n_var);
                }
            for (int i = 0; i < n; i++) {
                if (strcmp(runs[i].agent, kAgents[a]) || !fig_member(F, runs[i].v->name)) continue;
                if (done_in[runs[i].game_i][runs[i].seed] == n_var) av[ac++] = runs[i].dir;
            }
            char png[600], reps[32], claims[1024];
            snprintf(png, sizeof png, "%s/fig%s-%s-%s.png", o.out, F->id, kAgents[a], o.encoder);
            snprintf(reps, sizeof reps, "%d", o.reps);
            fig_claims(F, kAgents[a], claims, sizeof claims);
            av[ac++] = "--out";
            av[ac++] = png;
            av[ac++] = "--reps";
            av[ac++] = reps;
            av[ac++] = "--labels";
            av[ac++] = "dir";
            av[ac++] = "--reference-runs";
            av[ac++] = pools[a];
            if (claims[0]) {
                av[ac++] = "--claims";
                av[ac++] = claims;
            }
            /* the full tier also draws the IQM over training, the paper's figures' form, at the
             * archive's curve step (tools/softmoe_rl/runs_archive.sh keeps a run's curve every 50,000
             * frames: 20 points of Rainbow-lite's 1M, 5 of DER's 250k) */
            char curves[600];
            snprintf(curves, sizeof curves, "%s/fig%s-%s-%s-curves.png", o.out, F->id, kAgents[a], o.encoder);
            if (full) {
                av[ac++] = "--curves";
                av[ac++] = curves;
                av[ac++] = "--curve-every";
                av[ac++] = "50000";
            }
            av[ac] = NULL;
            printf("\nbench-tokenize-figure fig=%s agent=%s: %s%s\n", F->id, kAgents[a], F->what,
                   full ? "" : " [quick tier: a smoke test, decides nothing]");
            printf("bench-tokenize-figure fig=%s agent=%s: %d of %d games x seeds complete%s%s\n", F->id, kAgents[a], pairs,
                   pairs_planned, left[0] ? "; left out, not complete:" : "", left);
            if (pairs && pairs < pairs_planned && claims[0])
                printf("bench-tokenize-figure fig=%s agent=%s: its verdicts below are provisional (%d of %d games x seeds)\n",
                       F->id, kAgents[a], pairs, pairs_planned);
            fflush(stdout);
            if (!pairs || !pool_ok[a]) {
                failed += pairs && !pool_ok[a];
                free(av);
                continue;
            }
            pid_t pid = fork();
            if (pid == 0) {
                execv(av[0], (char *const *)av);
                _exit(127);
            }
            free(av);
            int status = 0;
            if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) failed++;
        }
    }
    free(runs);
    return failed ? CLI_EXIT_RUNTIME : 0;
}
