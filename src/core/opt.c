/* Option tables (include/specmoe/core/opt.h). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/json.h"
#include "specmoe/core/opt.h"

const char *sm_opt_flag(const sm_opt *o, char *buf, size_t n) {
    snprintf(buf, n, "%s", o->flag ? o->flag : o->key);
    for (char *p = buf; *p; p++)
        if (*p == '_') *p = '-';
    return buf;
}

int sm_opt_set(const sm_opt *o, void *cfg, const char *text) {
    char *f = (char *)cfg + o->offset, *end = NULL;
    errno = 0;
    if (o->type == SM_OPT_INT || o->type == SM_OPT_BOOL) {
        long v = strtol(text, &end, 10);
        if (!*text || *end || errno || v < -2147483647L || v > 2147483647L) return -1;
        if (o->type == SM_OPT_BOOL && v != 0 && v != 1) return -1;
        *(int *)f = (int)v;
    } else if (o->type == SM_OPT_NUM) {
        double v = strtod(text, &end);
        if (!*text || *end || errno || !isfinite(v)) return -1;
        *(double *)f = v;
    } else if (o->type == SM_OPT_U64) {
        unsigned long long v = strtoull(text, &end, 10);
        if (!*text || *end || errno || *text == '-') return -1;
        *(uint64_t *)f = (uint64_t)v;
    } else {
        if (strlen(text) >= o->size) return -1;
        memcpy(f, text, strlen(text) + 1);
    }
    return 0;
}

int sm_opt_defaults(const sm_opt *opts, int n, void *cfg) {
    for (int i = 0; i < n; i++)
        if (sm_opt_set(&opts[i], cfg, opts[i].def)) return -1;
    return 0;
}

void sm_opt_to_json(const sm_opt *o, const void *cfg, cJSON *out) {
    const char *f = (const char *)cfg + o->offset;
    if (o->type == SM_OPT_STR) {
        cJSON_AddStringToObject(out, o->key, f);
        return;
    }
    if (o->type == SM_OPT_U64 && *(const uint64_t *)f > (1ull << 53)) {
        /* beyond 2^53 a JSON number loses bits: the exact decimal string instead */
        char b[32];
        snprintf(b, sizeof b, "%llu", (unsigned long long)*(const uint64_t *)f);
        cJSON_AddStringToObject(out, o->key, b);
        return;
    }
    double v = o->type == SM_OPT_NUM ? *(const double *)f
               : o->type == SM_OPT_U64 ? (double)*(const uint64_t *)f : *(const int *)f;
    cJSON_AddNumberToObject(out, o->key, v);
}

sm_status sm_opt_from_json(const sm_opt *o, void *cfg, const cJSON *in, const char *what, sm_error *err) {
    char *f = (char *)cfg + o->offset;
    int opt = !o->required;
    if (o->type == SM_OPT_INT || o->type == SM_OPT_BOOL) return sm_json_int(in, o->key, opt, (int *)f, what, err);
    if (o->type == SM_OPT_NUM) return sm_json_num(in, o->key, opt, (double *)f, what, err);
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(in, o->key);
    if (o->type == SM_OPT_STR) {
        if (!j) return opt ? SM_OK : sm_fail(err, SM_ERR_FORMAT, "%s: missing field '%s'", what, o->key);
        if (!cJSON_IsString(j) || strlen(j->valuestring) >= o->size)
            return sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' is not a string of at most %zu bytes", what, o->key,
                           o->size - 1);
        memcpy(f, j->valuestring, strlen(j->valuestring) + 1);
        return SM_OK;
    }
    /* U64: a number up to 2^53, or the exact decimal string */
    if (cJSON_IsString(j)) {
        char *end = NULL;
        errno = 0;
        unsigned long long u = strtoull(j->valuestring, &end, 10);
        if (!*j->valuestring || *end || errno || j->valuestring[0] == '-')
            return sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' is not an unsigned 64-bit integer", what, o->key);
        *(uint64_t *)f = (uint64_t)u;
        return SM_OK;
    }
    double v = (double)*(uint64_t *)f;
    sm_status st = sm_json_num(in, o->key, opt, &v, what, err);
    /* files written before seeds above 2^53 became strings hold them as (rounded) numbers */
    if (st == SM_OK && !(v >= 0 && v < 18446744073709551616.0 && v == floor(v)))
        return sm_fail(err, SM_ERR_FORMAT, "%s: field '%s' is not an unsigned 64-bit integer", what, o->key);
    if (st == SM_OK) *(uint64_t *)f = (uint64_t)v;
    return st;
}

void sm_opt_format(const sm_opt *o, const void *cfg, char *buf, size_t n) {
    const char *f = (const char *)cfg + o->offset;
    switch (o->type) {
    case SM_OPT_INT:
    case SM_OPT_BOOL: snprintf(buf, n, "%d", *(const int *)f); break;
    case SM_OPT_NUM: { /* the shortest text that reads back as the same double */
        double v = *(const double *)f;
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
        break;
    }
    case SM_OPT_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)f); break;
    case SM_OPT_STR: snprintf(buf, n, "%s", f); break;
    }
}

void sm_opt_copy(const sm_opt *o, void *dst, const void *src) {
    size_t n = o->type == SM_OPT_NUM ? sizeof(double) : o->type == SM_OPT_U64 ? sizeof(uint64_t)
               : o->type == SM_OPT_STR ? o->size : sizeof(int);
    memcpy((char *)dst + o->offset, (const char *)src + o->offset, n);
}
