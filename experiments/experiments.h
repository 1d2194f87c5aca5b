/* The benchmarks and paper studies under experiments/, as `specmoe bench ...` (cli/cmd_bench.c) runs
 * them. Each entry point takes the whole command line
 * like a command (cli/common.h: cli_command) and returns the exit code; inside, each benchmark is
 * parse (flags -> settings), run (settings -> results) and report (results -> text), see docs/CLI.md.
 *
 * experiments/<paper>/ holds one paper's studies; experiments/engine/ the engine's own benchmarks. */
#ifndef SPECMOE_EXPERIMENTS_H
#define SPECMOE_EXPERIMENTS_H

/* engine: forward + backward + Adam of one MoE layer against plain sgemm and the measured peak */
int exp_engine_layer(int argc, char **argv);

#endif
