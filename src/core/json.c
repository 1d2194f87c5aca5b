/* Typed JSON field readers (include/specmoe/core/json.h). */
#include "specmoe/core/json.h"

#include <math.h>
#include <string.h>

sm_status sm_json_num(const cJSON *o, const char *key, int optional, double *out, const char *what, sm_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v && optional) return SM_OK;
    if (!cJSON_IsNumber(v)) return sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' missing or not a number", what, key);
    /* cJSON reads 1e999 as inf; it would be written back as null, so a file could not be read again */
    if (!isfinite(v->valuedouble)) return sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' is not finite", what, key);
    *out = v->valuedouble;
    return SM_OK;
}

sm_status sm_json_int(const cJSON *o, const char *key, int optional, int *out, const char *what, sm_error *err) {
    double d = 0;
    if (!cJSON_GetObjectItemCaseSensitive(o, key) && optional) return SM_OK;
    sm_status st = sm_json_num(o, key, 0, &d, what, err);
    if (st != SM_OK) return st;
    if (!(d >= -2147483647.0 && d <= 2147483647.0) || d != (double)(int)d)
        return sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' is not an integer in range", what, key);
    *out = (int)d;
    return SM_OK;
}

sm_status sm_json_str(const cJSON *o, const char *key, char *out, size_t n, const char *what, sm_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n)
        return sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' missing or not a short string", what, key);
    strcpy(out, v->valuestring);
    return SM_OK;
}
