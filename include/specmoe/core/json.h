/* Typed field readers for the JSON the library stores (model configs, module descriptions, router
 * options): every refusal names the document (`what`) and the field. */
#ifndef SPECMOE_JSON_H
#define SPECMOE_JSON_H

#include <cjson/cJSON.h>

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A number field; optional fields leave *out unchanged when absent. */
sm_status sm_json_num(const cJSON *o, const char *key, int optional, double *out, const char *what, sm_error *err);
/* An integer field in int range. */
sm_status sm_json_int(const cJSON *o, const char *key, int optional, int *out, const char *what, sm_error *err);
/* A required string field shorter than n. */
sm_status sm_json_str(const cJSON *o, const char *key, char *out, size_t n, const char *what, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
