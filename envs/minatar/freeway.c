/* MinAtar Freeway (Young & Tian 2019, arXiv 1903.03176, game description "Freeway").
 *
 * Rules from the paper: the player (a chicken) starts at the bottom and can only move up or down,
 * at most once every 3 frames; +1 on reaching the top, after which the chicken returns to the
 * bottom and the cars' speeds are randomised; cars travel horizontally and wrap around at the
 * edges; a car hitting the chicken sends it back to the bottom; the episode terminates after 2500
 * frames. Channels (MinAtar's game documentation): chicken, car, speed1..speed5: each car has a
 * trail on the cell behind it (its direction) in the channel of its speed, speedk for a car that
 * moves once every k frames.
 *
 * Choices where the paper is silent (ours):
 * - One car on each of the eight lanes, rows 1-8; rows 1-4 drive left, rows 5-8 right (as in the
 *   Atari game, the two halves of the road go opposite ways). A car moves once every k frames, k
 *   uniform in 1..5 per lane, drawn at the start of an episode and again at each crossing; cars
 *   start in uniformly drawn columns.
 * - The chicken starts in column 4 of row 9; "up" and "down" move it one row (rows 0-9) and then
 *   it cannot move for the next 2 frames. Reaching row 0 scores.
 * - A hit is checked after the chicken moves and again after the cars move (a car cannot pass
 *   through the chicken). A hit costs nothing but the way back.
 * - No difficulty ramping (the randomised speeds are the game's variation).
 */
#include "minatar.h"

enum { FW_CHICKEN = 0, FW_CAR, FW_SPEED1, FW_CHANNELS = FW_SPEED1 + 5 };
#define FW_LANES 8
#define FW_LANE0 1
#define FW_MOVE_EVERY 3  /* the chicken moves at most once every 3 frames */
#define FW_FRAMES 2500   /* episode length (terminal) */
#define FW_START_X 4

typedef struct {
    signed char x, dir, period, timer; /* moves once every `period` frames; timer counts down */
} fw_car;

typedef struct {
    ma_common c;
    int cx, cy;     /* chicken */
    int cooldown;   /* frames until the chicken may move again */
    int t;          /* frames elapsed */
    fw_car car[FW_LANES];
} freeway;

static void fw_speeds(freeway *e) {
    for (int l = 0; l < FW_LANES; l++) {
        fw_car *k = &e->car[l];
        k->period = (signed char)(1 + ma_below(&e->c, 5));
        if (k->timer > k->period) k->timer = k->period;
    }
}

static void fw_draw(const freeway *e, float *obs) {
    ma_clear(obs, FW_CHANNELS);
    ma_set(obs, FW_CHICKEN, e->cy, e->cx);
    for (int l = 0; l < FW_LANES; l++) {
        const fw_car *k = &e->car[l];
        ma_set(obs, FW_CAR, FW_LANE0 + l, k->x);
        ma_set(obs, FW_SPEED1 + k->period - 1, FW_LANE0 + l, (k->x - k->dir + MA_N) % MA_N);
    }
}

static void fw_reset(void *st, float *obs) {
    freeway *e = st;
    ma_reset(&e->c);
    e->cx = FW_START_X;
    e->cy = MA_N - 1;
    e->cooldown = 0;
    e->t = 0;
    for (int l = 0; l < FW_LANES; l++) {
        fw_car *k = &e->car[l];
        k->x = (signed char)ma_below(&e->c, MA_N);
        k->dir = (signed char)(l < FW_LANES / 2 ? -1 : 1);
        k->timer = 5;
    }
    fw_speeds(e);
    fw_draw(e, obs);
}

/* A car on the chicken's cell sends it back to the bottom row. */
static void fw_hit(freeway *e) {
    int l = e->cy - FW_LANE0;
    if (l >= 0 && l < FW_LANES && e->car[l].x == e->cx) e->cy = MA_N - 1;
}

static void fw_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    freeway *e = st;
    int a = ma_action(&e->c, *act);
    float r = 0.0f;
    if (e->cooldown > 0) e->cooldown--;
    int dy = ma_dy(a), ny = ma_clamp(e->cy + dy, 0, MA_N - 1);
    if (dy && e->cooldown == 0 && ny != e->cy) {
        e->cy = ny;
        e->cooldown = FW_MOVE_EVERY;
    }
    if (e->cy == 0) { /* across: score, back to the start, new speeds */
        r = 1.0f;
        e->cy = MA_N - 1;
        fw_speeds(e);
    }
    fw_hit(e);
    for (int l = 0; l < FW_LANES; l++) {
        fw_car *k = &e->car[l];
        if (--k->timer > 0) continue;
        k->timer = k->period;
        k->x = (signed char)((k->x + k->dir + MA_N) % MA_N);
    }
    fw_hit(e);
    *reward = r;
    *terminal = ++e->t >= FW_FRAMES;
    fw_draw(e, obs);
}

MA_SPEC(freeway, FW_CHANNELS, "MinAtar Freeway (Young & Tian 2019): cross eight lanes of traffic (+1 per crossing), 2500 frames",
        freeway, fw_reset, fw_step);
