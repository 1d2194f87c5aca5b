/* specmoe command-line tool: the dispatcher. Every command lives in its own cli/cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "common.h"

static void usage(void) {
    printf("usage: specmoe COMMAND [flags]\n\n"
           "commands:\n"
           "  train            train a classifier on Fashion-MNIST (specmoe train --help)\n"
           "  eval CHECKPOINT  evaluate a checkpoint\n"
           "  info CHECKPOINT  print the model and tensor table of a checkpoint\n"
           "  analyze CHECKPOINT  spectral norm, stable rank, effective rank of every weight matrix\n"
           "  ssmoe prune CHECKPOINT  SSMoE expert dropping (router / ssmoe / random ranking)\n"
           "  ssmoe build --hf DIR    EV router + collapse report of a Hugging Face MoE model\n"
           "  ssmoe prune --hf DIR    expert dropping on a Hugging Face MoE model (streamed)\n"
           "  bench layer      time forward+backward+Adam of one MoE layer against plain sgemm\n"
           "  bench routing    GrMoE's synthetic routing benchmark (Table 1)\n"
           "  bench alpha      post-hoc sparsity: entropy vs alpha / inverse temperature\n"
           "  bench oneshot    SR-MoE one-shot interference (Tables 1-2)\n"
           "  bench ssmoe      SSMoE eigenvector routing and expert dropping (Tables 1, 6)\n"
           "  bench ssmoe-build  time of building the EV router of one SwiGLU MoE layer\n"
           "  bingham-z        Kume-Wood saddle-point Bingham normaliser vs Monte Carlo (GrMoE Sec. 6.4.4)\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage();
        return argc < 2 ? CLI_EXIT_USAGE : 0;
    }
    if (!strcmp(argv[1], "train")) return cmd_train(argc, argv);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc, argv);
    if (!strcmp(argv[1], "info")) return cmd_info(argc, argv);
    if (!strcmp(argv[1], "analyze")) return cmd_analyze(argc, argv);
    if (!strcmp(argv[1], "ssmoe")) return cmd_ssmoe(argc, argv);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc, argv);
    if (!strcmp(argv[1], "bingham-z")) return cmd_bingham_z(argc, argv);
    fprintf(stderr, "specmoe: unknown command '%s' (see specmoe --help)\n", argv[1]);
    return CLI_EXIT_USAGE;
}
