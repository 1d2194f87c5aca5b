/* metrics.jsonl reader (include/specmoe/io/runlog.h). */
#include "specmoe/io/runlog.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int push(sm_series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx) return -1;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny) return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

sm_status sm_runlog_parse(sm_series *s, const char *text, size_t len, const char *what, const char *xkey,
                          const char *ykey, const char *kind, sm_error *err) {
    size_t line = 0, at = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    sm_status st = SM_OK;
    while (at < len && st == SM_OK) {
        line++;
        const char *e = memchr(text + at, '\n', len - at);
        size_t n = e ? (size_t)(e - (text + at)) : len - at;
        if (n + 1 > bufcap) {
            char *nb = realloc(buf, n + 1);
            if (!nb) {
                st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", what);
                break;
            }
            buf = nb;
            bufcap = n + 1;
        }
        memcpy(buf, text + at, n);
        buf[n] = 0;
        at += n + 1;
        size_t k = 0;
        while (k < n && (buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r')) k++;
        if (k == n) continue; /* blank line */
        if (memchr(buf, 0, n)) {
            st = sm_fail(err, SM_ERR_FORMAT, "%s:%zu: a NUL byte inside a line", what, line);
            break;
        }
        cJSON *o = cJSON_ParseWithLength(buf, n);
        if (!o || !cJSON_IsObject(o)) {
            cJSON_Delete(o);
            st = sm_fail(err, SM_ERR_FORMAT, "%s:%zu: not a JSON object", what, line);
            break;
        }
        const cJSON *xv = cJSON_GetObjectItemCaseSensitive(o, xkey), *yv = cJSON_GetObjectItemCaseSensitive(o, ykey);
        const cJSON *kv = kind ? cJSON_GetObjectItemCaseSensitive(o, "kind") : NULL;
        int keep = cJSON_IsNumber(xv) && cJSON_IsNumber(yv) && isfinite(xv->valuedouble) && isfinite(yv->valuedouble) &&
                   (!kind || (cJSON_IsString(kv) && !strcmp(kv->valuestring, kind)));
        if (keep && push(s, xv->valuedouble, yv->valuedouble)) st = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", what);
        cJSON_Delete(o);
    }
    free(buf);
    return st;
}

sm_status sm_runlog_read(sm_series *s, const char *path, const char *xkey, const char *ykey, const char *kind,
                         sm_error *err) {
    size_t size;
    FILE *f = sm_open_regular(path, &size, err);
    if (!f) return err ? err->code : SM_ERR_IO;
    char *text = malloc(size + 1);
    if (!text) {
        fclose(f);
        return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, size);
    }
    size_t got = fread(text, 1, size, f);
    fclose(f);
    if (got != size) {
        free(text);
        return sm_fail(err, SM_ERR_IO, "%s: read %zu of %zu bytes", path, got, size);
    }
    sm_status st = sm_runlog_parse(s, text, size, path, xkey, ykey, kind, err);
    free(text);
    return st;
}

void sm_series_free(sm_series *s) {
    free(s->x);
    free(s->y);
    memset(s, 0, sizeof *s);
}
