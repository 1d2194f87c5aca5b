/* Checks shared by the readers of outside JSON (Hugging Face config.json and index, ...). */
#ifndef SPECMOE_JSON_UTIL_H
#define SPECMOE_JSON_UTIL_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;

/* Refuses a parsed JSON value in which an object holds the same key twice, at any depth. cJSON keeps
 * both entries and its lookups return the first, Python's json module keeps the last, so two readers
 * of the same file would see different values. what names the source in the message, which names the
 * key and where it sits, e.g.
 *   DIR/config.json: key "type" appears more than once in rope_scaling
 * SM_OK, SM_ERR_FORMAT (a duplicate) or SM_ERR_NOMEM. A NULL json is SM_OK (nothing to check). */
sm_status sm_json_check_unique_keys(const struct cJSON *json, const char *what, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
