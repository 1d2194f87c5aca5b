/* MinAtar Asterix (Young & Tian 2019, arXiv 1903.03176, game description "Asterix").
 *
 * The player moves in four directions; enemies and gold enter from the sides and cross
 * horizontally; +1 for picking up gold, touching an enemy ends the episode. Channels: player,
 * enemy, trail (the cell behind each object, giving its direction; not drawn off the grid), gold.
 *
 * Rules of the reference implementation (github.com/kenjyoung/MinAtar, asterix.py), as facts:
 * - The player starts at row 5, column 5, and moves one cell per frame, kept to rows 1-8 and
 *   columns 0-9; fire and no-op do nothing.
 * - Objects live on rows 1-8, at most one per row. A spawn enters a uniformly chosen free row
 *   (none when all eight are taken) at column 0 heading right or column 9 heading left (equally
 *   likely); it is gold with probability 1/3, else an enemy.
 * - Spawn and move timers count down once at the end of every frame (the frame they fire on
 *   included) and fire when 0 at the start of a frame: with a spawn interval S the first spawn
 *   comes on frame S + 1 and the next ones every S frames; likewise all objects move together one
 *   cell every M frames (first on frame M + 1) and leave at the far edge. S starts at 10, M at 5.
 * - Order within a frame: spawn (if due), the player moves, contact with the object on the
 *   player's cell, then the objects move (if due) with contact again. Gold touched is collected
 *   (+1, it vanishes); an enemy touched makes the step terminal, but the rest of the frame still
 *   runs (gold met later in the same frame still scores).
 * - Ramping (on by default): a ramp counter starts at 100 and drops by one at the end of each
 *   frame while it is >= 0; on the frame after it reaches -1 the difficulty rises and the counter
 *   restarts at 100, so rises come on frames 102, 204, 306, ... Each rise lowers S by one (down to
 *   1), and M by one (down to 1) on every second rise (the 2nd, 4th, ...). Rising stops once both
 *   are 1. With ramping off S and M keep their first values.
 * Where the README and the reference disagree we follow the reference (the published curves come
 * from it): the README only says difficulty increases "periodically"; the schedule above is the
 * code's.
 */
#include "minatar.h"

enum { AX_PLAYER = 0, AX_ENEMY, AX_TRAIL, AX_GOLD, AX_CHANNELS };
#define AX_ROW0 1 /* objects and player on rows 1..8 */
#define AX_ROWS 8
#define AX_SPAWN0 10
#define AX_MOVE0 5
#define AX_RAMP_INTERVAL 100

typedef struct {
    signed char active, x, dir, gold;
} ax_object;

typedef struct {
    ma_common c;
    int px, py;
    ax_object obj[AX_ROWS]; /* the object on row AX_ROW0 + r */
    int spawn_interval, move_interval, spawn_timer, move_timer, ramp_timer, ramp_index;
    int done;
} asterix;

static void ax_draw(const asterix *e, float *obs) {
    ma_clear(obs, AX_CHANNELS);
    ma_set(obs, AX_PLAYER, e->py, e->px);
    for (int r = 0; r < AX_ROWS; r++) {
        const ax_object *o = &e->obj[r];
        if (!o->active) continue;
        ma_set(obs, o->gold ? AX_GOLD : AX_ENEMY, AX_ROW0 + r, o->x);
        int back = o->x - o->dir;
        if (back >= 0 && back < MA_N) ma_set(obs, AX_TRAIL, AX_ROW0 + r, back);
    }
}

static void ax_reset(void *st, float *obs) {
    asterix *e = st;
    e->px = 5;
    e->py = 5;
    memset(e->obj, 0, sizeof e->obj);
    e->spawn_interval = e->spawn_timer = AX_SPAWN0;
    e->move_interval = e->move_timer = AX_MOVE0;
    e->ramp_timer = AX_RAMP_INTERVAL;
    e->ramp_index = 0;
    e->done = 0;
    ax_draw(e, obs);
}

/* The player touching the object on its row: gold is collected, an enemy ends the episode. */
static float ax_contact(asterix *e) {
    ax_object *o = &e->obj[e->py - AX_ROW0];
    if (!o->active || o->x != e->px) return 0.0f;
    if (!o->gold) {
        e->done = 1;
        return 0.0f;
    }
    o->active = 0;
    return 1.0f;
}

static void ax_spawn(asterix *e) {
    int right = ma_chance(&e->c, 0.5), gold = ma_chance(&e->c, 1.0 / 3.0);
    int free_rows[AX_ROWS], n = 0;
    for (int r = 0; r < AX_ROWS; r++)
        if (!e->obj[r].active) free_rows[n++] = r;
    if (!n) return;
    ax_object *o = &e->obj[free_rows[ma_below(&e->c, n)]];
    o->active = 1;
    o->x = (signed char)(right ? 0 : MA_N - 1);
    o->dir = (signed char)(right ? 1 : -1);
    o->gold = (signed char)gold;
}

static void ax_move(asterix *e) {
    for (int r = 0; r < AX_ROWS; r++) {
        ax_object *o = &e->obj[r];
        if (!o->active) continue;
        o->x = (signed char)(o->x + o->dir);
        if (o->x < 0 || o->x >= MA_N) o->active = 0;
    }
}

/* Ramping: S down by one at every rise, M on every second one (see the header). */
static void ax_ramp(asterix *e) {
    if (e->spawn_interval <= 1 && e->move_interval <= 1) return;
    if (e->ramp_timer >= 0) {
        e->ramp_timer--;
        return;
    }
    if (e->move_interval > 1 && e->ramp_index % 2) e->move_interval--;
    if (e->spawn_interval > 1) e->spawn_interval--;
    e->ramp_index++;
    e->ramp_timer = AX_RAMP_INTERVAL;
}

static void ax_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    asterix *e = st;
    int a = ma_action(&e->c, *act);
    if (e->spawn_timer == 0) {
        ax_spawn(e);
        e->spawn_timer = e->spawn_interval;
    }
    e->px = ma_clamp(e->px + ma_dx(a), 0, MA_N - 1);
    e->py = ma_clamp(e->py + ma_dy(a), AX_ROW0, AX_ROW0 + AX_ROWS - 1);
    float r = ax_contact(e);
    if (e->move_timer == 0) {
        e->move_timer = e->move_interval;
        ax_move(e);
        r += ax_contact(e);
    }
    e->spawn_timer--;
    e->move_timer--;
    if (e->c.ramping) ax_ramp(e);
    *reward = r;
    *terminal = (unsigned char)e->done;
    ax_draw(e, obs);
}

MA_SPEC(asterix, AX_CHANNELS, "MinAtar Asterix (Young & Tian 2019): collect gold (+1), avoid enemies; speeds ramp up",
        asterix, ax_reset, ax_step);
