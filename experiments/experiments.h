/* The benchmarks and paper studies under experiments/, as `specmoe bench ...` (cli/cmd_bench.c) and
 * `specmoe bingham-z` (cli/cmd_bingham.c) run them. Each entry point takes the whole command line
 * like a command (cli/common.h: cli_command) and returns the exit code; inside, each benchmark is
 * parse (flags -> settings), run (settings -> results) and report (results -> text), see docs/CLI.md.
 *
 * experiments/<paper>/ holds one paper's studies; experiments/engine/ the engine's own benchmarks. */
#ifndef SPECMOE_EXPERIMENTS_H
#define SPECMOE_EXPERIMENTS_H

/* engine: forward + backward + Adam of one MoE layer against plain sgemm and the measured peak */
int exp_engine_layer(int argc, char **argv);
/* engine: environment steps per second with random actions and auto-reset (include/specmoe/rl/env.h) */
int exp_engine_env(int argc, char **argv);
int exp_engine_gemm(int argc, char **argv);
/* engine: one MoE layer data parallel and expert parallel over the ranks of an MPI run, with a cost model */
int exp_engine_dist(int argc, char **argv);

/* grmoe: the synthetic routing benchmark (Table 1), post-hoc sparsity (Fig. 1, Table 3), the Bingham
 * normaliser against Monte Carlo (Sec. 6.4.4) */
int exp_grmoe_routing(int argc, char **argv);
int exp_grmoe_alpha(int argc, char **argv);
int exp_grmoe_bingham(int argc, char **argv);

/* srmoe: one-shot interference (Tables 1-2) */
int exp_srmoe_oneshot(int argc, char **argv);

/* ssmoe: eigenvector routing and expert dropping (Tables 1, 6); the EV router's build time */
int exp_ssmoe_bench(int argc, char **argv);
int exp_ssmoe_build(int argc, char **argv);

/* softmoe_rl: the study of "Don't Flatten, Tokenize!" on MinAtar (its figures, as rl train runs and reports) */
int exp_softmoe_tokenize(int argc, char **argv);
int exp_sphere_bench(int argc, char **argv);

#endif
