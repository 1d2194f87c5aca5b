/* The helpers shared by the specmoe commands (cli/cmd_*.c) and the benchmarks under experiments/:
 * error printing, report text, threads, the Fashion-MNIST data flags and routing printout.
 *
 * Dependency rule (docs/CLI.md): command files and experiments include this header (and flags.h);
 * common.c includes no command file and no experiment, and no command calls another command's
 * functions. A helper two commands need lives here. */
#ifndef SPECMOE_CLI_COMMON_H
#define SPECMOE_CLI_COMMON_H

#include "specmoe.h"
#include "flags.h"

/* The one definition of the version: `specmoe --version` prints it, and the Makefile reads it from
 * this line for the pkg-config file. */
#define CLI_VERSION "0.1.0"

/* Exit codes: 0 ok, 1 runtime failure (I/O, NaN, ...), 2 usage error. */
#define CLI_EXIT_RUNTIME 1
#define CLI_EXIT_USAGE 2

/* One row of a command table: the word on the command line, one line of help, and the function that
 * runs it. The function gets the whole command line (argv[1] is the command, argv[2] a
 * subcommand) and returns the exit code. */
typedef struct {
    const char *name, *summary;
    int (*run)(int argc, char **argv);
} cli_command;

/* A command table: main.c's commands, cmd_bench.c's benchmarks. */
typedef struct {
    const char *prog;   /* what comes before the word: "specmoe", "specmoe bench" */
    const char *kind;   /* what a row is, singular: "command", "benchmark" */
    const char *footer; /* a line printed after the rows, or NULL */
    const cli_command *rows;
    int n;
} cli_table;

/* Runs the row named argv[at]. With "--help", "-h" or "help" there, prints the table on stdout and
 * returns 0; with nothing there, prints it and returns CLI_EXIT_USAGE; an unknown word is a usage
 * error whose message names every row. The help text and that message come from the table only. */
int cli_dispatch(const cli_table *t, int argc, char **argv, int at);

/* Prints "specmoe: <message>" and returns the exit code for st. */
int cli_fail(sm_status st, const sm_error *err);
/* Writes text to path; 0 on success (the write and the close both checked); -1 for NULL text. */
int cli_write_text(const char *path, const char *text);
/* Writes a gnuplot script (text; NULL: out of memory) to script_path and runs gnuplot on it, which
 * draws out. 0 on success; else prints "specmoe <who>: ..." naming the script and out, and returns
 * CLI_EXIT_RUNTIME. */
int cli_gnuplot(const char *who, const char *script_path, const char *text, const char *out);
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
/* The studies that run `specmoe` commands as child processes (bench tokenize, bench sphere). */
/* A study's flags (`specmoe bench NAME [flags]`, no positional arguments) with a --tier flag that
 * must be quick or full: fl_parse's 0 / 1 (after --help) / 2 (usage error, printed), and *full. */
int cli_parse_study(fl_flag *fl, int n, int argc, char **argv, const char *name, const char *const *tier, int *full);
/* 1 if item is an element of the comma list (exactly) */
int cli_in_list(const char *list, const char *item);
/* The first element of the comma list that is not in the comma list known (copied into buf), or NULL. */
const char *cli_list_unknown(const char *list, const char *known, char *buf, size_t n);
/* 1 if path exists */
int cli_file_exists(const char *path);
/* mkdir -p; 0 on success */
int cli_mkdirs(const char *path);
/* A child's command line: up to CLI_ARGV_MAX arguments copied into one buffer, argv NULL-terminated. */
#define CLI_ARGV_MAX 94
#define CLI_ARGV_BUF 4096 /* bytes of one command line, and of its fingerprint */
typedef struct {
    char *argv[CLI_ARGV_MAX + 2];
    char buf[CLI_ARGV_BUF];
    int argc;
    size_t used;
} cli_argv;
/* Appends one argument; -1 when the line is full (the line is then unusable). */
int cli_argv_push(cli_argv *a, const char *arg);
/* Appends every space-separated word of words. */
int cli_argv_words(cli_argv *a, const char *words);
/* A study's run directories remember the plan they ran (DIR/command), so that a finished run left by
 * an earlier plan - other flags under the same variant name - is refused instead of tabulated.
 * The fingerprint is the command line without argv[0] (the binary: a new build keeps a study's runs)
 * and without --out and its value (a copied run keeps its source's), with the study's out directory
 * written OUT at the start of an --init-from path (another spelling of --out keeps the runs). It
 * covers the flags, not the defaults a binary gives the flags left out: BENCHMARKS.md says which
 * builds a study may mix. 0, or -1 if it does not fit in n bytes. */
int cli_run_fingerprint(const cli_argv *a, const char *out, char *buf, size_t n);
/* dir's recorded plan against fp: 0 the same, 1 none recorded (a run from before fingerprints),
 * -1 another (its first line in other, n bytes). */
int cli_run_plan_check(const char *dir, const char *fp, char *other, size_t n);
/* A study's check of one finished (or resumed) run against its plan: counts a run of another plan in
 * *stale (printing the first five to stderr, "specmoe bench STUDY: DIR ran another command ...") and
 * a run with none recorded in *unrecorded. */
void cli_run_plan_verify(const char *study, const char *dir, const char *fp, int *stale, int *unrecorded);
/* Records fp as dir's plan (DIR/command); 0 or -1. */
int cli_run_plan_write(const char *dir, const char *fp);
/* A run directory held by one process at a time, so that two benches on the same --out (two queues
 * of a study, one per core) never run one run twice at once: an exclusive flock(2) on DIR/lock. The
 * lock belongs to the open file, which a child started after it inherits: a bench takes the lock and
 * spawns the run's training (cli_spawn), and the run stays held while any holder lives - the
 * training, even if the bench is killed, and the bench until it closes its copy (after writing the
 * run's `done`; it marks its copy close-on-exec so that no later child inherits it). The kernel
 * drops the lock when the last holder closes it or exits, however it exits. The file stays
 * (removing it would let a third process lock an unlinked copy). The descriptor (>= 3, so that a
 * child's dup2 onto stdout or stderr never closes it) when taken, -2 when another process holds it,
 * -1 on an I/O error. */
int cli_run_lock(const char *dir);
/* Starts argv[0] with stdout and stderr appended to log; the child's pid, or -1. */
int cli_spawn(const cli_argv *a, const char *log);
/* The path of the running specmoe executable (/proc/self/exe) into buf; -1 if unknown. */
int cli_self_exe(char *buf, size_t n);
/* Sets the OpenMP (and so OpenBLAS-OpenMP) thread count; <= 0 leaves the default. */
void cli_set_threads(int n);

/* The Fashion-MNIST data flags of train and eval. */
typedef struct {
    const char *data, *classes;
    int per_class, batch, threads;
} cli_data_opts;

#define CLI_DATA_FLAGS(o)                                                                                     \
    {"data", FL_STRING, &o.data, SM_FASHION_MNIST_DIR, "directory with the Fashion-MNIST IDX .gz files", 0},   \
    {"classes", FL_STRING, &o.classes, "all", "class subset, e.g. 0,1,7,8", 0},                               \
    {"per-class", FL_INT, &o.per_class, "0", "keep at most this many examples per class (train: of the training split; 0 = all)", 0}, \
    {"batch", FL_INT, &o.batch, "128", "minibatch size", 0},                                                   \
    {"threads", FL_INT, &o.threads, "2", "OpenMP / OpenBLAS threads", 0}

/* Loads one split ("train" or "test") of the data the flags name, keeping the --classes subset; the
 * training split (train_subset) also keeps at most --per-class examples per class. */
sm_status cli_load_split(sm_dataset *ds, const cli_data_opts *o, const char *split, int train_subset, sm_error *err);
/* 1 if the model description has a MoE layer (a dense checkpoint has none). */
int cli_config_has_moe(const sm_model_config *mc);
/* The help text of a --router flag: before, the routers the library knows (sm_router_names), after;
 * written to buf (n bytes), which is returned. Built at run time so a new router shows up in every
 * command's help without editing it. */
const char *cli_router_help(char *buf, size_t n, const char *before, const char *after);
/* Run directories (of `train` and `rl train`), for plot and report. */
struct cJSON;
/* The run's settings.json, parsed (cJSON_Delete it); NULL if absent or unreadable. */
struct cJSON *cli_run_settings(const char *dir);
/* settings.json without the keys that do not change what is learned (seed, threads, out, resume, an
 * agent's checkpoint and log periods): runs with equal keys are seeds of one setting. With drop_env
 * also the environment and the network sizes that follow from it: a variant's key across games.
 * malloc'd text; NULL without a readable settings.json. */
char *cli_run_group_key(const char *dir, int drop_env);
/* The directory's last path component without a trailing seed ("-s3", "-3"), quotes and backslashes
 * replaced: a label for plots. */
void cli_run_label(const char *dir, char *buf, size_t n);
/* Per MoE layer: entropy, load CV, MaxVio, active experts, drops and the load per expert, each line
 * starting with title. */
void cli_print_routing(const char *title, const sm_eval_result *ev);

#endif
