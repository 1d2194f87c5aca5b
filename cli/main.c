/* specmoe command-line tool: main and the command table. Every command lives in its own
 * cli/cmd_*.c; the top-level help and the "unknown command" message are generated from the table
 * (cli_dispatch), so a command exists exactly when it has a row here (docs/CLI.md). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "common.h"

static const cli_command kCommands[] = {
    {"train", "train a classifier on Fashion-MNIST", cmd_train},
    {"eval", "CHECKPOINT: evaluate a checkpoint (accuracy, routing statistics, other dials)", cmd_eval},
    {"info", "CHECKPOINT: print the model and tensor table of a checkpoint", cmd_info},
    {"analyze", "CHECKPOINT: spectral norm, stable rank, effective rank of every weight matrix", cmd_analyze},
    {"ssmoe", "SSMoE expert dropping and EV routers: prune CHECKPOINT, build --hf DIR, prune --hf DIR", cmd_ssmoe},
    {"bench", "benchmarks of the engine and of the papers (specmoe bench --help lists them)", cmd_bench},
    {"bingham-z", "Kume-Wood saddle-point Bingham normaliser vs Monte Carlo (GrMoE Sec. 6.4.4)", cmd_bingham_z},
};

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("specmoe %s\n", CLI_VERSION);
        return 0;
    }
    const cli_table t = {"specmoe", "command", "specmoe --version prints the version.", kCommands,
                         (int)(sizeof kCommands / sizeof kCommands[0])};
    return cli_dispatch(&t, argc, argv, 1);
}
