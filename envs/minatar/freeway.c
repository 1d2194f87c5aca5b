/* MinAtar Freeway (Young & Tian 2019, arXiv 1903.03176, game description "Freeway").
 *
 * The player (a chicken) crosses eight lanes of traffic; +1 for each crossing. Channels: chicken,
 * car, speed1..speed5 (each car's trail, on the cell behind it, in the channel of its speed).
 *
 * Rules of the reference implementation (github.com/kenjyoung/MinAtar, freeway.py), as facts:
 * - The chicken stays in column 4; it starts in row 9 (the bottom). Up and down move it one row
 *   (down is clamped at row 9) and start a move timer of 3; the other actions do nothing. It may
 *   move only while that timer is 0, and the timer counts down once at the end of every frame, so
 *   it moves at most once every 3 frames. The timer starts at 3: no move in an episode's first 3
 *   frames. Pressing down on the bottom row still starts the timer.
 * - Reaching row 0 gives +1, returns the chicken to row 9 and redraws every car's speed and
 *   direction (positions stay).
 * - One car in each of rows 1-8. At reset every car is in column 0, with a speed s uniform in
 *   1..5 and a direction uniform in {-1, +1} (each car its own). A car's timer is set to s; on a
 *   frame where it is 0 the car moves one column (wrapping at the edges) and the timer is set to s
 *   again, on other frames it counts down by one: a car of speed s moves once every s + 1 frames,
 *   first on frame s + 1. Redrawn speeds also reset the timers to the new speed.
 * - Order within a frame: the chicken moves; a crossing scores and sends it down; then each car
 *   in turn: a car on the chicken's cell sends it to row 9, the car moves when due, and a car that
 *   moved onto the chicken sends it to row 9. A hit costs nothing but the way back.
 * - The episode is terminal after 2501 frames: a counter of 2500 drops by one a frame and the
 *   episode ends when it goes below 0. No difficulty ramping.
 * Where the README and the reference disagree we follow the reference (the published curves come
 * from it): the README says cars move "from once every frame to once every 5 frames" (the code:
 * every 2 to every 6 frames) and that the episode ends "after 2500 frames" (the code: 2501).
 */
#include "minatar.h"

enum { FW_CHICKEN = 0, FW_CAR, FW_SPEED1, FW_CHANNELS = FW_SPEED1 + 5 };
#define FW_LANES 8
#define FW_LANE0 1
#define FW_MOVE_TIMER 3   /* the chicken's move timer after a move (and at reset) */
#define FW_TIME_LIMIT 2500 /* the episode ends when this counter, down one a frame, goes below 0 */
#define FW_X 4            /* the chicken's column */

typedef struct {
    signed char x, dir, speed, timer; /* moves when timer is 0, then timer = speed: every speed + 1 frames */
} fw_car;

typedef struct {
    ma_common c;
    int cy;         /* chicken row */
    int move_timer; /* the chicken may move when 0 */
    int time_left;
    fw_car car[FW_LANES];
} freeway;

/* New speed (1..5) and direction (+-1) for every car; its timer restarts at the speed. */
static void fw_speeds(freeway *e) {
    for (int l = 0; l < FW_LANES; l++) {
        fw_car *k = &e->car[l];
        k->speed = k->timer = (signed char)(1 + ma_below(&e->c, 5));
        k->dir = (signed char)(ma_below(&e->c, 2) ? 1 : -1);
    }
}

static void fw_draw(const freeway *e, float *obs) {
    ma_clear(obs, FW_CHANNELS);
    ma_set(obs, FW_CHICKEN, e->cy, FW_X);
    for (int l = 0; l < FW_LANES; l++) {
        const fw_car *k = &e->car[l];
        ma_set(obs, FW_CAR, FW_LANE0 + l, k->x);
        ma_set(obs, FW_SPEED1 + k->speed - 1, FW_LANE0 + l, (k->x - k->dir + MA_N) % MA_N);
    }
}

static void fw_reset(void *st, float *obs) {
    freeway *e = st;
    e->cy = MA_N - 1;
    e->move_timer = FW_MOVE_TIMER;
    e->time_left = FW_TIME_LIMIT;
    for (int l = 0; l < FW_LANES; l++) e->car[l].x = 0;
    fw_speeds(e);
    fw_draw(e, obs);
}

static void fw_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    freeway *e = st;
    int a = ma_action(&e->c, *act);
    float r = 0.0f;
    if ((a == MA_UP || a == MA_DOWN) && e->move_timer == 0) {
        e->move_timer = FW_MOVE_TIMER;
        e->cy = ma_clamp(e->cy + ma_dy(a), 0, MA_N - 1);
    }
    if (e->cy == 0) { /* across: score, back to the start, new speeds and directions */
        r = 1.0f;
        fw_speeds(e);
        e->cy = MA_N - 1;
    }
    for (int l = 0; l < FW_LANES; l++) {
        fw_car *k = &e->car[l];
        int on_lane = e->cy == FW_LANE0 + l;
        if (on_lane && k->x == FW_X) e->cy = MA_N - 1;
        if (k->timer > 0) {
            k->timer--;
            continue;
        }
        k->timer = k->speed;
        k->x = (signed char)((k->x + k->dir + MA_N) % MA_N);
        if (on_lane && k->x == FW_X) e->cy = MA_N - 1;
    }
    if (e->move_timer > 0) e->move_timer--;
    *reward = r;
    *terminal = --e->time_left < 0;
    fw_draw(e, obs);
}

MA_SPEC(freeway, FW_CHANNELS, "MinAtar Freeway (Young & Tian 2019): cross eight lanes of traffic (+1 per crossing), 2501 frames",
        freeway, fw_reset, fw_step);
