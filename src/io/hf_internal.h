/* Internal: message helpers shared by the Hugging Face readers (src/io/hf.c, src/io/hf_calib.c). */
#ifndef SPECMOE_HF_INTERNAL_H
#define SPECMOE_HF_INTERNAL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* A name fit for a message: at most 100 characters, control bytes shown as '?'. */
static inline const char *sm_hf_shown(char out[112], const char *s) {
    size_t i = 0;
    for (; s && s[i] && i < 100; i++) out[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    if (s && s[i]) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
    return out;
}

/* "[2, 16]" */
static inline void sm_hf_shape_str(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t at = 0;
    at += (size_t)snprintf(out + at, n - at, "[");
    for (int i = 0; i < ndim && at < n; i++) at += (size_t)snprintf(out + at, n - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at < n) snprintf(out + at, n - at, "]");
}

#endif
