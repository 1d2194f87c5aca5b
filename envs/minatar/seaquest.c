/* MinAtar Seaquest (Young & Tian 2019, arXiv 1903.03176, game description "Seaquest").
 *
 * Rules from the paper: the player's submarine has a front and a back cell (its direction) and
 * fires bullets from the front; enemies are submarines, which shoot bullets, and fish, which do not;
 * +1 for each enemy struck by the player's bullet, and the enemy is removed; divers picked up by
 * moving onto them fill a diver bar; oxygen, shown as a bar, degrades over time and is replenished
 * when the player surfaces with at least one diver on board; at most 6 divers are carried; surfacing
 * with fewer than 6 removes one diver, surfacing with 6 removes all and gives +1 for each lit cell
 * of the oxygen bar; each surfacing increases the enemies' spawn rate and speed; the episode
 * terminates when the player is hit by a fish, a submarine or a bullet, when oxygen runs out, or
 * when the player surfaces with no diver. Enemies and divers leave a trail on their previous cell.
 * Channels (MinAtar's game documentation): sub_front, sub_back, friendly_bullet, trail,
 * enemy_bullet, enemy_fish, enemy_sub, oxygen_guage, diver_guage, diver.
 *
 * Choices where the paper is silent (ours):
 * - Water is rows 1-8 and the surface row 0; row 9 holds the two gauges (oxygen, divers, each a bar
 *   from column 0). The submarine starts on the surface at column 5 facing right, with full oxygen
 *   and no diver, and moves one cell per step; left/right also turn it. Contact (enemies, enemy
 *   bullets, divers) is with the front cell; the back cell (behind the front, not drawn when that
 *   is off the grid) shows the direction.
 * - Oxygen: 200 frames' worth, one used every frame (on the surface too, so waiting there is no
 *   refuge), refilled at once by a surfacing that keeps a diver on board or empties a full boat.
 *   The oxygen bar lights ceil(oxygen / 20) cells, so the bonus for surfacing with 6 divers is
 *   1 to 10. "Surfacing" is moving from row 1 to row 0.
 * - Fire: a bullet leaves from the front cell and travels one cell per frame in the facing
 *   direction; one shot every 5 frames. Two bullets in one cell strike as one.
 * - Enemies: at most one per water row; one spawns every `spawn_interval` frames (20 at first) on
 *   a uniformly chosen free row, at the left or right edge (equally likely) heading inwards, a
 *   submarine with probability 1/3, else a fish. All enemies move one cell every `move_interval`
 *   frames (5 at first) and leave at the far edge. A submarine shoots every 10 frames (first shot
 *   10 frames after it appears): a bullet in its direction, one cell per frame.
 * - Divers: at most one per water row; one appears every 30 frames on a free row, at an edge,
 *   moving one cell every 5 frames. A diver met with a full boat stays in the water.
 * - Ramping, at each surfacing that refills oxygen: move_interval drops by 1 (down to 1) and
 *   spawn_interval by 2 (down to 6). Off: they keep their first values.
 * - Hits are checked after each mover (player, bullets, enemies, divers), so nothing passes through.
 */
#include "minatar.h"

enum {
    SQ_FRONT = 0, SQ_BACK, SQ_FBULLET, SQ_TRAIL, SQ_EBULLET, SQ_FISH, SQ_ESUB, SQ_OXYGEN, SQ_DIVERS, SQ_DIVER,
    SQ_CHANNELS
};
#define SQ_ROWS 8 /* water rows 1..8 */
#define SQ_GAUGE_ROW (MA_N - 1)
#define SQ_OXYGEN_MAX 200
#define SQ_OXYGEN_PER_CELL 20
#define SQ_MAX_DIVERS 6
#define SQ_SHOT_COOLDOWN 5
#define SQ_FULL_ROW 0x3FFu
#define SQ_SPAWN0 20
#define SQ_SPAWN_MIN 6
#define SQ_SPAWN_STEP 2
#define SQ_MOVE0 5
#define SQ_MOVE_MIN 1
#define SQ_ESHOT_EVERY 10
#define SQ_DIVER_SPAWN 30
#define SQ_DIVER_MOVE 5

/* an enemy or a diver, moving along its row */
typedef struct {
    signed char active, x, y, dir, tx; /* tx: previous column (trail), == x when just spawned */
    signed char sub, timer;            /* enemies: submarine?, frames to its next shot */
} sq_mover;

typedef struct {
    ma_common c;
    int x, y, facing;
    int oxygen, divers, shot_cooldown;
    int spawn_interval, move_interval, spawn_timer, move_timer, diver_spawn_timer, diver_move_timer;
    int done;
    sq_mover enemy[SQ_ROWS], diver[SQ_ROWS]; /* the one on water row 1 + r */
    /* bullets, the player's (fb) and the enemies' (eb): bit x of [d][y] is a bullet at (y, x) moving
     * left (d = 0) or right (d = 1) */
    unsigned fb[2][MA_N], eb[2][MA_N];
} seaquest;

static void sq_draw(const seaquest *e, float *obs) {
    ma_clear(obs, SQ_CHANNELS);
    ma_set(obs, SQ_FRONT, e->y, e->x);
    int bx = e->x - e->facing;
    if (bx >= 0 && bx < MA_N) ma_set(obs, SQ_BACK, e->y, bx);
    for (int r = 0; r < SQ_ROWS; r++) {
        const sq_mover *m = &e->enemy[r], *d = &e->diver[r];
        if (m->active) {
            ma_set(obs, m->sub ? SQ_ESUB : SQ_FISH, m->y, m->x);
            if (m->tx != m->x) ma_set(obs, SQ_TRAIL, m->y, m->tx);
        }
        if (d->active) {
            ma_set(obs, SQ_DIVER, d->y, d->x);
            if (d->tx != d->x) ma_set(obs, SQ_TRAIL, d->y, d->tx);
        }
    }
    for (int y = 0; y <= SQ_ROWS; y++) {
        ma_set_row(obs, SQ_FBULLET, y, e->fb[0][y] | e->fb[1][y]);
        ma_set_row(obs, SQ_EBULLET, y, e->eb[0][y] | e->eb[1][y]);
    }
    ma_set_bar(obs, SQ_OXYGEN, SQ_GAUGE_ROW, (e->oxygen + SQ_OXYGEN_PER_CELL - 1) / SQ_OXYGEN_PER_CELL);
    ma_set_bar(obs, SQ_DIVERS, SQ_GAUGE_ROW, e->divers);
}

static void sq_reset(void *st, float *obs) {
    seaquest *e = st;
    ma_reset(&e->c);
    e->x = 5;
    e->y = 0;
    e->facing = 1;
    e->oxygen = SQ_OXYGEN_MAX;
    e->divers = 0;
    e->shot_cooldown = 0;
    e->spawn_interval = e->spawn_timer = SQ_SPAWN0;
    e->move_interval = e->move_timer = SQ_MOVE0;
    e->diver_spawn_timer = SQ_DIVER_SPAWN;
    e->diver_move_timer = SQ_DIVER_MOVE;
    e->done = 0;
    memset(e->enemy, 0, sizeof e->enemy);
    memset(e->diver, 0, sizeof e->diver);
    memset(e->fb, 0, sizeof e->fb);
    memset(e->eb, 0, sizeof e->eb);
    sq_draw(e, obs);
}

/* Moves m one cell along its row; it leaves at the grid's edge. */
static void sq_advance(sq_mover *m) {
    m->tx = m->x;
    m->x = (signed char)(m->x + m->dir);
    if (m->x < 0 || m->x >= MA_N) m->active = 0;
}

/* Bullets move one cell along their rows and leave at the edges. */
static void sq_shift(unsigned b[2][MA_N]) {
    for (int y = 0; y <= SQ_ROWS; y++) {
        b[0][y] >>= 1;
        b[1][y] = (b[1][y] << 1) & SQ_FULL_ROW;
    }
}

static void sq_launch(sq_mover *m, int x, int y, int dir) {
    memset(m, 0, sizeof *m);
    m->active = 1;
    m->x = m->tx = (signed char)x;
    m->y = (signed char)y;
    m->dir = (signed char)dir;
}

/* An enemy or a diver entering a uniformly chosen free row from either edge; NULL if none is free. */
static sq_mover *sq_enter(seaquest *e, sq_mover *rows) {
    int free_rows[SQ_ROWS], n = 0;
    for (int r = 0; r < SQ_ROWS; r++)
        if (!rows[r].active) free_rows[n++] = r;
    if (!n) return NULL;
    int r = free_rows[ma_below(&e->c, n)], left = ma_below(&e->c, 2) == 0;
    sq_launch(&rows[r], left ? 0 : MA_N - 1, 1 + r, left ? 1 : -1);
    return &rows[r];
}

/* The front cell meeting an enemy or an enemy bullet ends the episode; meeting a diver picks it up. */
static void sq_contact(seaquest *e) {
    if (e->y >= 1) {
        const sq_mover *m = &e->enemy[e->y - 1];
        if (m->active && m->x == e->x) e->done = 1;
        sq_mover *d = &e->diver[e->y - 1];
        if (d->active && d->x == e->x && e->divers < SQ_MAX_DIVERS) {
            d->active = 0;
            e->divers++;
        }
    }
    if ((e->eb[0][e->y] | e->eb[1][e->y]) >> e->x & 1u) e->done = 1;
}

/* Player bullets on an enemy's cell: +1 each enemy, bullets and enemy removed. */
static float sq_bullet_hits(seaquest *e) {
    float r = 0.0f;
    for (int k = 0; k < SQ_ROWS; k++) {
        sq_mover *m = &e->enemy[k];
        if (!m->active) continue;
        unsigned bit = 1u << m->x;
        if (!((e->fb[0][m->y] | e->fb[1][m->y]) & bit)) continue;
        e->fb[0][m->y] &= ~bit;
        e->fb[1][m->y] &= ~bit;
        m->active = 0;
        r += 1.0f;
    }
    return r;
}

/* Moving from row 1 to the surface: a diver or a full boat refills oxygen (and ramps the
 * difficulty), an empty boat ends the episode. Returns the bonus for a full boat. */
static float sq_surface(seaquest *e) {
    if (e->divers == 0) {
        e->done = 1;
        return 0.0f;
    }
    float bonus = 0.0f;
    if (e->divers == SQ_MAX_DIVERS) {
        bonus = (float)((e->oxygen + SQ_OXYGEN_PER_CELL - 1) / SQ_OXYGEN_PER_CELL);
        e->divers = 0;
    } else {
        e->divers--;
    }
    e->oxygen = SQ_OXYGEN_MAX;
    if (e->c.ramping) {
        if (e->move_interval > SQ_MOVE_MIN) e->move_interval--;
        if (e->spawn_interval - SQ_SPAWN_STEP >= SQ_SPAWN_MIN) e->spawn_interval -= SQ_SPAWN_STEP;
    }
    return bonus;
}

/* The player's move and shot; returns the surfacing bonus. */
static float sq_player(seaquest *e, int a) {
    float r = 0.0f;
    if (e->shot_cooldown > 0) e->shot_cooldown--;
    if (a == MA_FIRE && e->shot_cooldown == 0) {
        e->fb[e->facing > 0][e->y] |= 1u << e->x;
        e->shot_cooldown = SQ_SHOT_COOLDOWN;
    }
    int dx = ma_dx(a);
    if (dx) e->facing = dx;
    int ny = ma_clamp(e->y + ma_dy(a), 0, SQ_ROWS);
    e->x = ma_clamp(e->x + dx, 0, MA_N - 1);
    if (ny == 0 && e->y == 1) r = sq_surface(e);
    e->y = ny;
    return r;
}

/* Enemy submarines shoot every SQ_ESHOT_EVERY frames: a bullet in the cell ahead. */
static void sq_enemy_shots(seaquest *e) {
    for (int r = 0; r < SQ_ROWS; r++) {
        sq_mover *m = &e->enemy[r];
        if (m->active && m->sub && --m->timer <= 0) {
            int x = m->x + m->dir;
            if (x >= 0 && x < MA_N) e->eb[m->dir > 0][m->y] |= 1u << x;
            m->timer = SQ_ESHOT_EVERY;
        }
    }
}

/* Everything but the player, in order, stopping at the first hit on the player (the final picture
 * shows what hit it); returns the points scored. */
static float sq_world(seaquest *e) {
    /* bullets: the player's, then the enemies' */
    sq_shift(e->fb);
    float r = sq_bullet_hits(e);
    sq_shift(e->eb);
    sq_contact(e);
    if (e->done) return r;
    if (--e->move_timer <= 0) {
        for (int m = 0; m < SQ_ROWS; m++)
            if (e->enemy[m].active) sq_advance(&e->enemy[m]);
        e->move_timer = e->move_interval;
        r += sq_bullet_hits(e);
        sq_contact(e);
        if (e->done) return r;
    }
    sq_enemy_shots(e);
    sq_contact(e);
    if (e->done) return r;
    if (--e->diver_move_timer <= 0) {
        for (int d = 0; d < SQ_ROWS; d++)
            if (e->diver[d].active) sq_advance(&e->diver[d]);
        e->diver_move_timer = SQ_DIVER_MOVE;
        sq_contact(e);
    }
    if (--e->spawn_timer <= 0) {
        sq_mover *m = sq_enter(e, e->enemy);
        if (m) {
            m->sub = (signed char)(ma_below(&e->c, 3) == 0);
            m->timer = SQ_ESHOT_EVERY;
        }
        e->spawn_timer = e->spawn_interval;
        r += sq_bullet_hits(e);
        sq_contact(e);
        if (e->done) return r;
    }
    if (--e->diver_spawn_timer <= 0) {
        sq_enter(e, e->diver);
        e->diver_spawn_timer = SQ_DIVER_SPAWN;
        sq_contact(e);
    }
    if (--e->oxygen <= 0) e->done = 1;
    return r;
}

static void sq_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    seaquest *e = st;
    int a = ma_action(&e->c, *act);
    float r = sq_player(e, a);
    sq_contact(e);
    if (!e->done) r += sq_world(e);
    *reward = r;
    *terminal = (unsigned char)e->done;
    sq_draw(e, obs);
}

MA_SPEC(seaquest, SQ_CHANNELS, "MinAtar Seaquest (Young & Tian 2019): shoot enemies (+1), rescue divers, surface for oxygen",
        seaquest, sq_reset, sq_step);
