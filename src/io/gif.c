/* Animated GIF writer (include/specmoe/io/gif.h), from the GIF89a specification: header, global
 * colour table, NETSCAPE2.0 looping extension, per frame a graphic control extension (delay) and an
 * image whose pixels are LZW-coded with variable code width (9..12 bits, LSB first, sub-blocks of at
 * most 255 bytes). */
#include "specmoe/io/gif.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void put_bytes(sm_gif *g, const void *p, size_t n) {
    if (fwrite(p, 1, n, g->f) != n) g->failed = 1;
}

static void put_u16(sm_gif *g, int v) {
    uint8_t b[2] = {(uint8_t)(v & 255), (uint8_t)(v >> 8)};
    put_bytes(g, b, 2);
}

static void flush_block(sm_gif *g) {
    if (!g->nblock) return;
    uint8_t n = (uint8_t)g->nblock;
    put_bytes(g, &n, 1);
    put_bytes(g, g->block, (size_t)g->nblock);
    g->nblock = 0;
}

static void put_code(sm_gif *g, int code, int size) {
    g->bits |= (uint32_t)code << g->nbits;
    g->nbits += size;
    while (g->nbits >= 8) {
        g->block[g->nblock++] = (uint8_t)(g->bits & 255);
        g->bits >>= 8;
        g->nbits -= 8;
        if (g->nblock == 255) flush_block(g);
    }
}

sm_status sm_gif_open(sm_gif *g, const char *path, int w, int h, const uint8_t palette[256 * 3], int delay_cs,
                      sm_error *err) {
    memset(g, 0, sizeof *g);
    if (w < 1 || h < 1 || w > 65535 || h > 65535) return sm_fail(err, SM_ERR_ARG, "%s: bad image size %dx%d", path, w, h);
    g->w = w;
    g->h = h;
    g->delay = delay_cs;
    size_t n = strlen(path);
    g->path = malloc(n + 1);
    g->tmp = malloc(n + 5);
    g->dict = malloc(sizeof(int16_t) * 4096 * 256);
    if (!g->path || !g->tmp || !g->dict) {
        sm_gif_abort(g);
        return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(g->path, path, n + 1);
    snprintf(g->tmp, n + 5, "%s.tmp", path);
    if (!(g->f = fopen(g->tmp, "wb"))) {
        sm_status st = sm_fail(err, SM_ERR_IO, "%s: cannot create: %s", g->tmp, strerror(errno));
        sm_gif_abort(g);
        return st;
    }
    put_bytes(g, "GIF89a", 6);
    put_u16(g, w);
    put_u16(g, h);
    const uint8_t lsd[3] = {0xF7, 0, 0}; /* global colour table of 2^(7+1) = 256 entries */
    put_bytes(g, lsd, 3);
    put_bytes(g, palette, 256 * 3);
    const uint8_t loop[19] = {0x21, 0xFF, 11, 'N', 'E', 'T', 'S', 'C', 'A', 'P', 'E', '2', '.', '0', 3, 1, 0, 0, 0};
    put_bytes(g, loop, sizeof loop);
    return SM_OK;
}

sm_status sm_gif_frame(sm_gif *g, const uint8_t *px, sm_error *err) {
    const uint8_t gce[4] = {0x21, 0xF9, 4, 0x04}; /* disposal: leave in place */
    put_bytes(g, gce, 4);
    put_u16(g, g->delay);
    const uint8_t gce_end[2] = {0, 0};
    put_bytes(g, gce_end, 2);
    const uint8_t desc = 0x2C;
    put_bytes(g, &desc, 1);
    put_u16(g, 0);
    put_u16(g, 0);
    put_u16(g, g->w);
    put_u16(g, g->h);
    const uint8_t flags = 0, min_code = 8;
    put_bytes(g, &flags, 1);
    put_bytes(g, &min_code, 1);
    /* LZW: codes 0..255 the bytes, 256 clear, 257 end; the table grows from 258 and the code width
     * from 9 bits, widening when a new entry's index reaches 2^width (the decoder, one entry behind,
     * widens at the same code); at 4096 entries a clear code restarts it */
    const int CLEAR = 256, EOI = 257;
    int size = 9, next = 258;
    memset(g->dict, 0xFF, sizeof(int16_t) * 4096 * 256);
    g->bits = 0;
    g->nbits = 0;
    g->nblock = 0;
    put_code(g, CLEAR, size);
    const size_t n = (size_t)g->w * g->h;
    int prefix = px[0];
    for (size_t i = 1; i < n; i++) {
        int k = px[i];
        int16_t child = g->dict[prefix * 256 + k];
        if (child >= 0) {
            prefix = child;
            continue;
        }
        put_code(g, prefix, size);
        if (next < 4096) {
            g->dict[prefix * 256 + k] = (int16_t)next;
            if (next == (1 << size) && size < 12) size++;
            next++;
        } else {
            put_code(g, CLEAR, size);
            memset(g->dict, 0xFF, sizeof(int16_t) * 4096 * 256);
            size = 9;
            next = 258;
        }
        prefix = k;
    }
    put_code(g, prefix, size);
    put_code(g, EOI, size);
    if (g->nbits > 0) put_code(g, 0, 8 - g->nbits);
    flush_block(g);
    const uint8_t end = 0;
    put_bytes(g, &end, 1);
    if (g->failed) return sm_fail(err, SM_ERR_IO, "%s: cannot write: %s", g->tmp, strerror(errno));
    return SM_OK;
}

sm_status sm_gif_close(sm_gif *g, sm_error *err) {
    const uint8_t trailer = 0x3B;
    put_bytes(g, &trailer, 1);
    int bad = g->failed || fflush(g->f) != 0;
    if (fclose(g->f) != 0) bad = 1;
    g->f = NULL;
    sm_status st = SM_OK;
    if (bad) st = sm_fail(err, SM_ERR_IO, "%s: cannot write: %s", g->tmp, strerror(errno));
    else if (rename(g->tmp, g->path) != 0) st = sm_fail(err, SM_ERR_IO, "%s: cannot rename into place: %s", g->path, strerror(errno));
    if (st != SM_OK) remove(g->tmp);
    free(g->path);
    free(g->tmp);
    free(g->dict);
    memset(g, 0, sizeof *g);
    return st;
}

void sm_gif_abort(sm_gif *g) {
    if (g->f) {
        fclose(g->f);
        remove(g->tmp);
    }
    free(g->path);
    free(g->tmp);
    free(g->dict);
    memset(g, 0, sizeof *g);
}

static const uint8_t kLevels[6] = {0, 51, 102, 153, 204, 255};

void sm_gif_palette_rgb(uint8_t p[256 * 3]) {
    for (int i = 0; i < 216; i++) {
        p[3 * i] = kLevels[i / 36];
        p[3 * i + 1] = kLevels[(i / 6) % 6];
        p[3 * i + 2] = kLevels[i % 6];
    }
    for (int i = 216; i < 256; i++) {
        uint8_t v = (uint8_t)((i - 216) * 255 / 39);
        p[3 * i] = p[3 * i + 1] = p[3 * i + 2] = v;
    }
}

uint8_t sm_gif_rgb_index(uint8_t r, uint8_t g, uint8_t b) {
    int ri = (r + 25) / 51, gi = (g + 25) / 51, bi = (b + 25) / 51;
    int cube = ri * 36 + gi * 6 + bi;
    /* a grey is closer on the grey ramp when the channels agree */
    if (r == g && g == b) {
        int gi2 = (r * 39 + 127) / 255;
        int dc = abs(kLevels[ri] - r), dg = abs(gi2 * 255 / 39 - r);
        if (dg < dc) return (uint8_t)(216 + gi2);
    }
    return (uint8_t)cube;
}
