/* The GIF writer against a decoder written here from the GIF89a specification: every frame decodes
 * to the pixels written (random, flat and long images that fill the 4096-entry LZW table). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specmoe/io/gif.h"

typedef struct {
    const uint8_t *p;
    size_t n, at;
} rd;

static int byte(rd *r) { return r->at < r->n ? r->p[r->at++] : -1; }

/* Decodes the LZW stream of one image (sub-blocks concatenated first) into out (n pixels). */
static int lzw_decode(const uint8_t *data, size_t len, int min_code, uint8_t *out, size_t n) {
    int size = min_code + 1, clear = 1 << min_code, eoi = clear + 1, avail = clear + 2, old = -1;
    static int prefix[4096], suffix[4096], length[4096];
    for (int i = 0; i < clear; i++) prefix[i] = -1, suffix[i] = i, length[i] = 1;
    size_t pos = 0, bitpos = 0;
    uint8_t stack[4096];
    while (bitpos + size <= len * 8) {
        int code = 0;
        for (int b = 0; b < size; b++, bitpos++) code |= ((data[bitpos / 8] >> (bitpos % 8)) & 1) << b;
        if (code == clear) {
            size = min_code + 1;
            avail = clear + 2;
            old = -1;
            continue;
        }
        if (code == eoi) return pos == n ? 0 : -1;
        if (code > avail || (code == avail && old < 0)) return -2;
        int c = code == avail ? old : code, first;
        int k = 0;
        for (int x = c; x >= 0; x = prefix[x]) stack[k++] = (uint8_t)suffix[x];
        first = stack[k - 1];
        if (code == avail) { /* KwKwK: old's string plus its own first byte */
            memmove(stack + 1, stack, (size_t)k);
            stack[0] = (uint8_t)first;
            k++;
        }
        while (k > 0) {
            if (pos >= n) return -3;
            out[pos++] = stack[--k];
        }
        if (old >= 0 && avail < 4096) {
            prefix[avail] = old;
            suffix[avail] = first;
            length[avail] = length[old] + 1;
            avail++;
            if (avail == (1 << size) && size < 12) size++;
        }
        old = code;
    }
    return -4;
}

static void check_roundtrip(int w, int h, int frames, int kind) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/specmoe_test_%d.gif", (int)getpid());
    uint8_t pal[768];
    sm_gif_palette_rgb(pal);
    sm_gif g;
    sm_error err = {0};
    cr_assert_eq(sm_gif_open(&g, path, w, h, pal, 7, &err), SM_OK, "%s", err.msg);
    uint8_t *px = malloc((size_t)frames * w * h);
    sm_rng rng;
    sm_rng_seed(&rng, (uint64_t)(w * 31 + h + kind));
    for (int f = 0; f < frames; f++)
        for (int i = 0; i < w * h; i++)
            px[(size_t)f * w * h + i] = kind == 0 ? (uint8_t)sm_rng_below(&rng, 256)
                                        : kind == 1 ? (uint8_t)(f * 7)
                                                    : (uint8_t)((i / 3 + f) % 5 == 0 ? sm_rng_below(&rng, 4) : 9);
    for (int f = 0; f < frames; f++) cr_assert_eq(sm_gif_frame(&g, px + (size_t)f * w * h, &err), SM_OK);
    cr_assert_eq(sm_gif_close(&g, &err), SM_OK, "%s", err.msg);
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp);
    static uint8_t file[1 << 22];
    size_t len = fread(file, 1, sizeof file, fp);
    fclose(fp);
    remove(path);
    rd r = {file, len, 0};
    cr_assert_eq(memcmp(file, "GIF89a", 6), 0);
    cr_assert_eq(file[6] | file[7] << 8, w);
    cr_assert_eq(file[8] | file[9] << 8, h);
    cr_assert_eq(memcmp(file + 13, pal, 768), 0, "global colour table");
    r.at = 13 + 768;
    int got = 0;
    uint8_t *out = malloc((size_t)w * h), *data = malloc(len);
    for (;;) {
        int b = byte(&r);
        cr_assert_neq(b, -1, "truncated file");
        if (b == 0x3B) break;
        if (b == 0x21) { /* extension: label, then sub-blocks */
            byte(&r);
            for (int s; (s = byte(&r)) > 0;) r.at += (size_t)s;
            continue;
        }
        cr_assert_eq(b, 0x2C, "image descriptor expected, got 0x%02x", b);
        r.at += 8;
        cr_assert_eq(byte(&r), 0, "no local colour table");
        int min_code = byte(&r);
        size_t dl = 0;
        for (int s; (s = byte(&r)) > 0;) {
            memcpy(data + dl, r.p + r.at, (size_t)s);
            dl += (size_t)s;
            r.at += (size_t)s;
        }
        cr_assert_eq(lzw_decode(data, dl, min_code, out, (size_t)w * h), 0, "frame %d decodes", got);
        cr_assert_eq(memcmp(out, px + (size_t)got * w * h, (size_t)w * h), 0, "frame %d pixels", got);
        got++;
    }
    cr_assert_eq(got, frames);
    free(out);
    free(data);
    free(px);
}

Test(gif, random_pixels_roundtrip) { check_roundtrip(97, 61, 3, 0); }
Test(gif, flat_frames_roundtrip) { check_roundtrip(160, 160, 4, 1); }
Test(gif, long_runs_fill_the_table_roundtrip) { check_roundtrip(640, 480, 2, 2); }

Test(gif, palette_index_is_nearest_cube_colour) {
    uint8_t pal[768];
    sm_gif_palette_rgb(pal);
    cr_assert_eq(sm_gif_rgb_index(255, 0, 0), 5 * 36);
    uint8_t i = sm_gif_rgb_index(10, 200, 97);
    cr_assert_eq(pal[3 * i], 0);
    cr_assert_eq(pal[3 * i + 1], 204);
    cr_assert_eq(pal[3 * i + 2], 102);
}
