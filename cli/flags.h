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
/* Sets f from text as if typed on the command line (f->set is left alone); 0, or 2 after printing
 * why the value is bad. A string flag keeps the pointer v. */
int fl_set(fl_flag *f, const char *v, const char *cmd);
/* f's value as the text that fl_set reads back to the same value ("" for an unset string); returns buf. */
const char *fl_format(const fl_flag *f, char *buf, size_t n);
/* Every flag's value as a JSON object: name -> number, boolean, string, or null for an unset string.
 * A U64 beyond 2^53 (not exact as a JSON number) is a decimal string. */
struct cJSON *fl_to_json(const fl_flag *fl, int n);
/* The text fl_set reads for a value of fl_to_json's object into buf; NULL for null (an unset string)
 * or a value of another type than the flag's. */
const char *fl_json_text(const fl_flag *f, const struct cJSON *v, char *buf, size_t n);

#endif
