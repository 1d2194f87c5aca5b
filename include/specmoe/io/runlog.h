/* Reading a run's metrics.jsonl (written by `specmoe train` and `specmoe rl train`) back as (x, y)
 * series, for `specmoe plot`. Every line must be a JSON object; a malformed line is refused naming
 * the file and line. */
#ifndef SPECMOE_RUNLOG_H
#define SPECMOE_RUNLOG_H

#include <stddef.h>

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double *x, *y;
    size_t n, cap;
} sm_series;

/* Appends to s the records of text (len bytes, the file's contents; what names it in messages) that
 * have numbers under xkey and ykey and, when kind is non-NULL, "kind": kind. Lines without the keys
 * are skipped; a line that is not a JSON object is an error (SM_ERR_FORMAT, "what:line: ..."). */
sm_status sm_runlog_parse(sm_series *s, const char *text, size_t len, const char *what, const char *xkey,
                          const char *ykey, const char *kind, sm_error *err);
/* The same from a file. */
sm_status sm_runlog_read(sm_series *s, const char *path, const char *xkey, const char *ykey, const char *kind,
                         sm_error *err);
void sm_series_free(sm_series *s);

#ifdef __cplusplus
}
#endif
#endif
