/* MinAtar Asterix (Young & Tian 2019, arXiv 1903.03176, game description "Asterix").
 *
 * Rules from the paper: the player moves freely in the four directions; enemies and treasure
 * spawn from the sides and move horizontally; +1 for picking up treasure; the episode terminates
 * when the player touches an enemy; difficulty rises periodically, enemies and treasure moving and
 * spawning faster. Channels (MinAtar's game documentation): player, enemy, trail (each object's
 * previous cell, giving its direction), gold.
 *
 * Choices where the paper is silent (ours):
 * - Objects live on rows 1-8, at most one per row; the player is kept to rows 1-8 too (rows 0 and 9
 *   are the border) and starts at row 5, column 4. The player moves one cell per step.
 * - A spawn comes every `spawn_interval` steps (10 at first) on a uniformly chosen free row, from
 *   the left or the right edge with equal probability, moving towards the other side; it is gold
 *   with probability 1/3, else an enemy. Nothing spawns when all eight rows are taken.
 * - All objects move one cell every `move_interval` steps (5 at first) and leave at the far edge.
 * - Ramping: every 100 steps move_interval drops by one (down to 1) and spawn_interval by one
 *   (down to 3). With ramping off they keep their first values.
 * - Contact is checked after the player moves and again after the objects move, so nothing passes
 *   through the player; gold touched is collected (+1) and vanishes.
 */
#include "minatar.h"

enum { AX_PLAYER = 0, AX_ENEMY, AX_TRAIL, AX_GOLD, AX_CHANNELS };
#define AX_ROW0 1 /* objects and player on rows 1..8 */
#define AX_ROWS 8
#define AX_SPAWN0 10
#define AX_SPAWN_MIN 3
#define AX_MOVE0 5
#define AX_MOVE_MIN 1
#define AX_RAMP_EVERY 100

typedef struct {
    signed char active, x, dir, tx, gold; /* tx: previous column (== x right after spawning) */
} ax_object;

typedef struct {
    ma_common c;
    int px, py;
    ax_object obj[AX_ROWS]; /* the object on row AX_ROW0 + r */
    int spawn_interval, move_interval, spawn_timer, move_timer, ramp_timer;
    int done;
} asterix;

static void ax_draw(const asterix *e, float *obs) {
    ma_clear(obs, AX_CHANNELS);
    ma_set(obs, AX_PLAYER, e->py, e->px);
    for (int r = 0; r < AX_ROWS; r++) {
        const ax_object *o = &e->obj[r];
        if (!o->active) continue;
        ma_set(obs, o->gold ? AX_GOLD : AX_ENEMY, AX_ROW0 + r, o->x);
        if (o->tx != o->x) ma_set(obs, AX_TRAIL, AX_ROW0 + r, o->tx);
    }
}

static void ax_reset(void *st, float *obs) {
    asterix *e = st;
    ma_reset(&e->c);
    e->px = 4;
    e->py = 5;
    memset(e->obj, 0, sizeof e->obj);
    e->spawn_interval = e->spawn_timer = AX_SPAWN0;
    e->move_interval = e->move_timer = AX_MOVE0;
    e->ramp_timer = AX_RAMP_EVERY;
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
    int free_rows[AX_ROWS], n = 0;
    for (int r = 0; r < AX_ROWS; r++)
        if (!e->obj[r].active) free_rows[n++] = r;
    if (!n) return;
    ax_object *o = &e->obj[free_rows[ma_below(&e->c, n)]];
    int left = ma_below(&e->c, 2) == 0;
    o->active = 1;
    o->x = o->tx = (signed char)(left ? 0 : MA_N - 1);
    o->dir = (signed char)(left ? 1 : -1);
    o->gold = (signed char)(ma_below(&e->c, 3) == 0);
}

static void ax_move(asterix *e) {
    for (int r = 0; r < AX_ROWS; r++) {
        ax_object *o = &e->obj[r];
        if (!o->active) continue;
        o->tx = o->x;
        o->x = (signed char)(o->x + o->dir);
        if (o->x < 0 || o->x >= MA_N) o->active = 0;
    }
}

static void ax_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    asterix *e = st;
    int a = ma_action(&e->c, *act);
    e->px = ma_clamp(e->px + ma_dx(a), 0, MA_N - 1);
    e->py = ma_clamp(e->py + ma_dy(a), AX_ROW0, AX_ROW0 + AX_ROWS - 1);
    float r = ax_contact(e);
    if (!e->done) { /* the world moves on unless the player was caught */
        if (--e->spawn_timer <= 0) {
            ax_spawn(e);
            e->spawn_timer = e->spawn_interval;
        }
        if (--e->move_timer <= 0) {
            ax_move(e);
            e->move_timer = e->move_interval;
        }
        r += ax_contact(e);
    }
    if (e->c.ramping && --e->ramp_timer <= 0) {
        if (e->move_interval > AX_MOVE_MIN) e->move_interval--;
        if (e->spawn_interval > AX_SPAWN_MIN) e->spawn_interval--;
        e->ramp_timer = AX_RAMP_EVERY;
    }
    *reward = r;
    *terminal = (unsigned char)e->done;
    ax_draw(e, obs);
}

MA_SPEC(asterix, AX_CHANNELS, "MinAtar Asterix (Young & Tian 2019): collect gold (+1), avoid enemies; speeds ramp up",
        asterix, ax_reset, ax_step);
