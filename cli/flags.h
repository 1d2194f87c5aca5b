/* Table-driven command-line flags: every flag has a type, a default (as text, parsed like user
 * input) and a help line; --help prints the table. Unknown flags and bad values are usage errors
 * (the CLI exits with status 2). */
#ifndef SPECMOE_CLI_FLAGS_H
#define SPECMOE_CLI_FLAGS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { FL_INT, FL_LONG, FL_U64, FL_DOUBLE, FL_STRING, FL_BOOL } fl_type;

typedef struct {
    const char *name;  /* without the leading "--" */
    fl_type type;
    void *dst;         /* int*, long*, uint64_t*, double*, const char**, int* (bool) */
    const char *def;   /* default as text; NULL for "unset" strings */
    const char *help;
    int set;           /* given on the command line */
} fl_flag;

/* Applies defaults, then parses argv[first..argc). Positional arguments are collected into pos
 * (at most max_pos). Returns 0 on success, 1 if --help was printed, 2 on a usage error (message
 * printed to stderr). */
int fl_parse(fl_flag *fl, int n, int argc, char **argv, int first, const char *cmd, const char *usage,
             const char **pos, int max_pos, int *n_pos);
void fl_print_help(const fl_flag *fl, int n, const char *cmd, const char *usage);
const fl_flag *fl_find(const fl_flag *fl, int n, const char *name);

#endif
