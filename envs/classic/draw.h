/* Drawing for the classic-control `render` functions (include/specmoe/rl/env.h): an h x w x 3 RGB
 * image, row-major, row 0 at the top. The pictures are simple on purpose (filled shapes and thick
 * lines, no antialiasing), enough to see what an agent does in `rl render`.
 *
 * A world is mapped to pixels by a view: pixel column = x0 + scale * x, pixel row = y0 - scale * y
 * (world y points up). Everything is clipped to the image, so any state draws safely. */
#ifndef SPECMOE_ENVS_CLASSIC_DRAW_H
#define SPECMOE_ENVS_CLASSIC_DRAW_H

#include <math.h>
#include <string.h>

typedef struct {
    unsigned char *rgb;
    int h, w;
    double x0, y0, scale; /* pixel of world (0, 0), pixels per world unit */
} draw_view;

typedef struct {
    unsigned char r, g, b;
} draw_color;

static const draw_color kDrawWhite = {255, 255, 255}, kDrawBlack = {0, 0, 0}, kDrawGrey = {128, 128, 128},
                        kDrawBlue = {70, 110, 200}, kDrawBrown = {200, 140, 80}, kDrawGreen = {60, 160, 60},
                        kDrawRed = {200, 60, 60};

/* Fills the image with the background and returns the view that shows the world box [xmin, xmax] x
 * [ymin, ymax] as large as the image allows, centred, with the same scale on both axes. */
static inline draw_view draw_begin(unsigned char *rgb, int h, int w, double xmin, double xmax, double ymin, double ymax,
                                   draw_color background) {
    draw_view v = {rgb, h, w, 0, 0, fmin(w / (xmax - xmin), h / (ymax - ymin))};
    v.x0 = w / 2.0 - v.scale * (xmin + xmax) / 2;
    v.y0 = h / 2.0 + v.scale * (ymin + ymax) / 2;
    for (int i = 0; i < h * w; i++) {
        rgb[3 * i] = background.r;
        rgb[3 * i + 1] = background.g;
        rgb[3 * i + 2] = background.b;
    }
    return v;
}

static inline void draw_pixel(const draw_view *v, int row, int col, draw_color c) {
    if (row < 0 || row >= v->h || col < 0 || col >= v->w) return;
    unsigned char *p = v->rgb + 3 * ((size_t)row * v->w + col);
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
}

static inline double draw_col(const draw_view *v, double x) { return v->x0 + v->scale * x; }
static inline double draw_row(const draw_view *v, double y) { return v->y0 - v->scale * y; }

/* A filled disc of world radius r at world (x, y) (at least one pixel). */
static inline void draw_disc(const draw_view *v, double x, double y, double r, draw_color c) {
    double cc = draw_col(v, x), cr = draw_row(v, y), rp = fmax(v->scale * r, 0.5);
    if (!(fabs(cc) < 1e6 && fabs(cr) < 1e6)) return; /* far outside (or not finite): nothing to draw */
    for (int row = (int)floor(cr - rp); row <= (int)ceil(cr + rp); row++)
        for (int col = (int)floor(cc - rp); col <= (int)ceil(cc + rp); col++)
            if ((row + 0.5 - cr) * (row + 0.5 - cr) + (col + 0.5 - cc) * (col + 0.5 - cc) <= rp * rp) draw_pixel(v, row, col, c);
}

/* A segment of world thickness t from (xa, ya) to (xb, yb): discs along it. */
static inline void draw_line(const draw_view *v, double xa, double ya, double xb, double yb, double t, draw_color c) {
    double len = v->scale * hypot(xb - xa, yb - ya);
    if (!(len < 1e5)) return;
    int n = (int)ceil(len) + 1;
    for (int i = 0; i <= n; i++) draw_disc(v, xa + (xb - xa) * i / n, ya + (yb - ya) * i / n, t / 2, c);
}

/* A filled axis-aligned rectangle centred at world (x, y), world size (sw, sh). */
static inline void draw_rect(const draw_view *v, double x, double y, double sw, double sh, draw_color c) {
    double c0 = draw_col(v, x - sw / 2), c1 = draw_col(v, x + sw / 2);
    double r0 = draw_row(v, y + sh / 2), r1 = draw_row(v, y - sh / 2);
    if (!(fabs(c0) < 1e6 && fabs(c1) < 1e6 && fabs(r0) < 1e6 && fabs(r1) < 1e6)) return;
    for (int row = (int)floor(r0); row < (int)ceil(r1); row++)
        for (int col = (int)floor(c0); col < (int)ceil(c1); col++) draw_pixel(v, row, col, c);
}

#endif
