/* Animated GIF (GIF89a) writer: 256-colour frames, LZW-compressed, looping - for `specmoe rl render`.
 *
 *   sm_gif g;
 *   sm_gif_open(&g, "episode.gif", w, h, palette, 5, &err);   // palette: 256 x RGB, delay 5/100 s
 *   sm_gif_frame(&g, pixels, &err);                            // (h, w) palette indices
 *   sm_gif_close(&g, &err);                                    // written atomically (tmp + rename)
 */
#ifndef SPECMOE_GIF_H
#define SPECMOE_GIF_H

#include <stdint.h>
#include <stdio.h>

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    FILE *f;
    char *path, *tmp;
    int w, h, delay;
    int16_t *dict; /* (4096, 256) LZW children: code of (prefix, byte) or -1 */
    uint8_t block[255];
    int nblock;
    uint32_t bits;
    int nbits;
    int failed;
} sm_gif;

sm_status sm_gif_open(sm_gif *g, const char *path, int w, int h, const uint8_t palette[256 * 3], int delay_cs,
                      sm_error *err);
sm_status sm_gif_frame(sm_gif *g, const uint8_t *pixels, sm_error *err);
sm_status sm_gif_close(sm_gif *g, sm_error *err);
/* Drops a half-written file. */
void sm_gif_abort(sm_gif *g);

/* The palette used for RGB pictures: a 6x6x6 colour cube (indices 0..215) and 40 greys, and the
 * index of the nearest entry to an RGB colour. */
void sm_gif_palette_rgb(uint8_t palette[256 * 3]);
uint8_t sm_gif_rgb_index(uint8_t r, uint8_t g, uint8_t b);

#ifdef __cplusplus
}
#endif
#endif
