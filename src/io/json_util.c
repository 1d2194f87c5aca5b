/* Checks shared by the readers of outside JSON (include/specmoe/io/json_util.h). Kept free of the
 * rest of the library so every fuzz target can link it. */
#include "specmoe/io/json_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Objects with more members than this are checked by sorting their keys instead of pairwise. */
#define PAIRWISE_MAX 16

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A key fit for a message: at most 80 characters, control bytes shown as '?'. */
static void shown_key(char out[88], const char *s) {
    size_t i = 0;
    for (; s[i] && i < 80; i++) out[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (s[i]) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
}

/* The first key of object o (n members) that appears twice, or NULL; *nomem on allocation failure. */
static const char *duplicated_key(const cJSON *o, int n, int *nomem) {
    if (n <= PAIRWISE_MAX) {
        for (const cJSON *a = o->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (strcmp(a->string ? a->string : "", b->string ? b->string : "") == 0) return a->string ? a->string : "";
        return NULL;
    }
    const char **keys = malloc(sizeof *keys * (size_t)n);
    if (!keys) {
        *nomem = 1;
        return NULL;
    }
    int k = 0;
    for (const cJSON *a = o->child; a && k < n; a = a->next) keys[k++] = a->string ? a->string : "";
    qsort(keys, (size_t)k, sizeof *keys, cmp_key);
    const char *dup = NULL;
    for (int i = 1; i < k && !dup; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
    free(keys);
    return dup;
}

/* Checks j and everything below it; path (of capacity cap, currently len long) is where j sits. */
static sm_status check(const cJSON *j, char *path, size_t len, size_t cap, const char *what, sm_error *err) {
    if (!cJSON_IsObject(j) && !cJSON_IsArray(j)) return SM_OK;
    if (cJSON_IsObject(j)) {
        int nomem = 0;
        const char *dup = duplicated_key(j, cJSON_GetArraySize(j), &nomem);
        if (nomem) return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory checking its keys", what);
        if (dup) {
            char k[88];
            shown_key(k, dup);
            return sm_fail(err, SM_ERR_FORMAT, "%s: key \"%s\" appears more than once in %s", what, k,
                           len ? path : "the top-level object");
        }
    }
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
        size_t n = len;
        if (n < cap) { /* extend the path; a path too long for the buffer stays truncated */
            char k[88];
            if (cJSON_IsObject(j)) shown_key(k, c->string ? c->string : "");
            int w = cJSON_IsObject(j) ? snprintf(path + n, cap - n, "%s%s", n ? "." : "", k)
                                      : snprintf(path + n, cap - n, "[%d]", i);
            n = w < 0 ? n : n + (size_t)w < cap ? n + (size_t)w : cap - 1;
        }
        sm_status st = check(c, path, n, cap, what, err);
        path[len] = '\0';
        if (st != SM_OK) return st;
    }
    return SM_OK;
}

sm_status sm_json_check_unique_keys(const struct cJSON *json, const char *what, sm_error *err) {
    char path[256] = "";
    return check(json, path, 0, sizeof path, what ? what : "JSON", err);
}
