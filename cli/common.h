/* Shared pieces of the specmoe command-line tool. */
#ifndef SPECMOE_CLI_H
#define SPECMOE_CLI_H

#include "specmoe.h"

/* Exit codes: 0 ok, 1 runtime failure (I/O, NaN, ...), 2 usage error. */
#define CLI_EXIT_RUNTIME 1
#define CLI_EXIT_USAGE 2

/* Prints "specmoe: <message>" and returns the exit code for st. */
int cli_fail(sm_status st, const sm_error *err);
/* Writes text to path; 0 on success (the write and the close both checked); -1 for NULL text. */
int cli_write_text(const char *path, const char *text);
/* A growing text buffer for the benchmarks' Markdown and JSON reports. cli_bprintf appends; s stays
 * NUL-terminated (NULL before the first append). If memory runs out, failed is set, the append is
 * dropped and later appends are ignored, so the caller checks failed once before using s. */
typedef struct {
    char *s;
    size_t n, cap;
    int failed;
} cli_buf;
void cli_bprintf(cli_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The benchmarks' training setup: AdamW (lr, decoupled weight decay wd), the default cosine schedule,
 * no logging; the caller keeps everything else of sm_train_config_default. */
void cli_bench_train_config(sm_train_config *tc, int epochs, int batch, double lr, double wd, uint64_t seed);
/* Sets the OpenMP (and so OpenBLAS-OpenMP) thread count; <= 0 leaves the default. */
void cli_set_threads(int n);
/* The machine's fp32 multiply-add peak in GFLOP/s, measured (cli/bench_peak.c): the rate of one
 * thread, of `threads` threads, and the bound max(all, threads x one) that no fp32 computation
 * on this machine beats; *isa names the vector instructions used. */
double cli_fma_peak(int threads, double *one_thread, double *all_threads, const char **isa);

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_ssmoe(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_routing(int argc, char **argv);
int cmd_bench_alpha(int argc, char **argv);
int cmd_bench_oneshot(int argc, char **argv);
int cmd_bench_ssmoe(int argc, char **argv);
int cmd_bench_ssmoe_build(int argc, char **argv);
int cmd_bingham_z(int argc, char **argv);

#endif
