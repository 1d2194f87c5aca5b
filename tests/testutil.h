/* Shared helpers for the Criterion tests. */
#ifndef SPECMOE_TESTUTIL_H
#define SPECMOE_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A fresh temporary directory per call (mkdtemp), never removed on failure so it can be inspected. */
static inline const char *tu_tmpdir(void) {
    static char buf[8][64];
    static int i = 0;
    char *b = buf[i++ % 8];
    snprintf(b, 64, "/tmp/specmoe-test-XXXXXX");
    if (!mkdtemp(b)) return "/tmp";
    return b;
}

/* Writes n bytes to path; returns 0 on success. */
static inline int tu_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

/* Reads a whole file into a malloc'd buffer; *n its size. NULL on failure. */
static inline unsigned char *tu_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(sz > 0 ? (size_t)sz : 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (n) *n = (size_t)sz;
    return b;
}

#endif
