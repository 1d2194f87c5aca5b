/* specmoe bench BENCHMARK: the table of benchmarks. Each row runs an entry point of experiments/
 * (experiments/experiments.h); `specmoe bench --help` and the unknown-benchmark message are
 * generated from the table (cli_dispatch), like the top-level command table in main.c. */
#include "commands.h"
#include "common.h"
#include "experiments/experiments.h"

static const cli_command kBenchmarks[] = {
    {"layer", "engine: time forward+backward+Adam of one MoE layer against plain sgemm and the machine's peak",
     exp_engine_layer},
    {"env", "environments: steps per second of a vector of environments with random actions and auto-reset", exp_engine_env},
    {"gemm", "engine: sgemm at RL network sizes (batch 1-256, width 64-1024) against the one-thread FMA peak", exp_engine_gemm},
    {"dist", "engine: one MoE layer data- and expert-parallel over MPI ranks (under mpirun): time and bytes per step, cost model",
     exp_engine_dist},
    {"routing", "GrMoE's synthetic routing benchmark (Table 1)", exp_grmoe_routing},
    {"alpha", "GrMoE post-hoc sparsity: entropy vs alpha / inverse temperature (Fig. 1, Table 3)", exp_grmoe_alpha},
    {"oneshot", "SR-MoE one-shot interference (Tables 1-2)", exp_srmoe_oneshot},
    {"ssmoe", "SSMoE eigenvector routing and expert dropping (Tables 1, 6)", exp_ssmoe_bench},
    {"tokenize", "SoftMoE in RL: tokenisation, experts, slots, resets on MinAtar (Don't Flatten, Tokenize! Figs. 1-15)",
     exp_softmoe_tokenize},
    {"sphere", "SPHERE: RL vs CRL, eNTK rank, SPHERE vs Top-k, ablations, rho sweep on the cheetah / reach families, and "
               "continual Fashion-MNIST (Figs. 2, 3, 10; Tables 1, 13-16)",
     exp_sphere_bench},
    {"ssmoe-build", "SSMoE: time of building the EV router of one SwiGLU MoE layer", exp_ssmoe_build},
};

int cmd_bench(int argc, char **argv) {
    const cli_table t = {"specmoe bench", "benchmark", NULL, kBenchmarks, (int)(sizeof kBenchmarks / sizeof kBenchmarks[0])};
    return cli_dispatch(&t, argc, argv, 2);
}
