/* Option tables: a configuration struct described by rows {JSON key, flag, type, field offset,
 * default, help}. From one table come the defaults, the JSON fields a checkpoint stores and the
 * command-line flags, so an option is added in one place (routers: nn/router.h; RL agents:
 * rl/agent.h). */
#ifndef SPECMOE_OPT_H
#define SPECMOE_OPT_H

#include <stddef.h>

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;

typedef enum { SM_OPT_INT, SM_OPT_NUM, SM_OPT_BOOL, SM_OPT_U64, SM_OPT_STR } sm_opt_type;

typedef struct {
    const char *key;  /* JSON key */
    const char *flag; /* flag name without "--"; NULL: the key with '_' -> '-' (sm_opt_flag) */
    sm_opt_type type; /* INT, BOOL: int field; NUM: double; U64: uint64_t; STR: char[size] */
    size_t offset;    /* of the field in the configuration struct */
    const char *def;  /* default as text, parsed like a flag value */
    const char *help; /* one line */
    int required;     /* must be present in JSON */
    size_t size;      /* STR: the field's capacity in bytes (with the terminating 0) */
} sm_opt;

#define SM_OPT_ROW(T, key, type, field, def, help) {key, NULL, type, offsetof(T, field), def, help, 0, 0}
#define SM_OPT_STR_ROW(T, key, field, def, help) \
    {key, NULL, SM_OPT_STR, offsetof(T, field), def, help, 0, sizeof(((T *)0)->field)}

/* The flag name of o (without "--") in buf. */
const char *sm_opt_flag(const sm_opt *o, char *buf, size_t n);
/* Parses text into the field of cfg: decimal integers, finite numbers, 0/1 for BOOL, a string that
 * fits. Returns 0, or -1 if text is not a valid value (cfg unchanged). */
int sm_opt_set(const sm_opt *o, void *cfg, const char *text);
/* Sets every option of the table to its default; returns -1 naming nothing if a built-in default
 * does not parse (a bug the tests catch), else 0. */
int sm_opt_defaults(const sm_opt *opts, int n, void *cfg);
/* The field as JSON under o->key; and back (absent optional keys keep the field). */
void sm_opt_to_json(const sm_opt *o, const void *cfg, struct cJSON *out);
sm_status sm_opt_from_json(const sm_opt *o, void *cfg, const struct cJSON *in, const char *what, sm_error *err);
/* Copies the option's field from the configuration src to dst. */
void sm_opt_copy(const sm_opt *o, void *dst, const void *src);
/* The field's value as text (for settings files and help). */
void sm_opt_format(const sm_opt *o, const void *cfg, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
