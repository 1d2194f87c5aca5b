/* specmoe command-line tool: main and the command table. Every command lives in its own
 * cli/cmd_*.c; the top-level help and the "unknown command" message are generated from the table
 * (cli_dispatch), so a command exists exactly when it has a row here (docs/CLI.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "common.h"

static const cli_command kCommands[] = {
    {"train", "train a classifier on Fashion-MNIST", cmd_train},
    {"eval", "CHECKPOINT: evaluate a checkpoint (accuracy, routing statistics, other dials)", cmd_eval},
    {"info", "CHECKPOINT: print the model and tensor table of a checkpoint", cmd_info},
    {"analyze", "CHECKPOINT: spectral norm, stable rank, effective rank of every weight matrix", cmd_analyze},
    {"ssmoe", "SSMoE expert dropping and EV routers: prune CHECKPOINT, build --hf DIR, prune --hf DIR", cmd_ssmoe},
    {"rl", "reinforcement learning: environments, random-policy reference (specmoe rl --help lists the subcommands)", cmd_rl},
    {"plot", "learning curves of RL and supervised runs (mean and spread over seeds) with gnuplot", cmd_plot},
    {"report", "RUN_DIR...: RL scores over games and seeds: median, IQM, mean, optimality gap with bootstrap intervals", cmd_report},
    {"bench", "benchmarks of the engine and of the papers (specmoe bench --help lists them)", cmd_bench},
    {"bingham-z", "Kume-Wood saddle-point Bingham normaliser vs Monte Carlo (GrMoE Sec. 6.4.4)", cmd_bingham_z},
};

/* OpenMP workers that spin while waiting make a 2-thread run 4.4x slower than 1 thread when another
 * process holds a core (19.7 s vs 4.4 s for one epoch on 2,000 images per class), and passive waiting
 * costs nothing on an idle machine (2.17 s vs 2.34 s; BENCHMARKS.md). libgomp reads OMP_WAIT_POLICY
 * once, when it is loaded - before main - so the tool re-executes itself once with the variable set,
 * unless the user chose a policy. */
static void passive_openmp(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("SPECMOE_NO_REEXEC")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("SPECMOE_NO_REEXEC", "1", 1); /* never loop, even if /proc/self/exe is not this program */
    execv("/proc/self/exe", argv);
    /* exec failed (no /proc): carry on with the active policy */
}

int main(int argc, char **argv) {
    passive_openmp(argv);
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("specmoe %s\n", CLI_VERSION);
        return 0;
    }
    const cli_table t = {"specmoe", "command", "specmoe --version prints the version.", kCommands,
                         (int)(sizeof kCommands / sizeof kCommands[0])};
    return cli_dispatch(&t, argc, argv, 1);
}
