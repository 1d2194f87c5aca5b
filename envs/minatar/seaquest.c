/* MinAtar Seaquest (Young & Tian 2019, arXiv 1903.03176, game description "Seaquest").
 *
 * The player's submarine (a front and a back cell, giving its direction) shoots enemy fish and
 * submarines (+1 each), picks up divers, and must surface for oxygen. Channels: sub_front,
 * sub_back, friendly_bullet, trail, enemy_bullet, enemy_fish, enemy_sub, oxygen_guage, diver_guage,
 * diver.
 *
 * Rules of the reference implementation (github.com/kenjyoung/MinAtar, seaquest.py), as facts:
 * - The submarine starts on the surface (row 0), column 5, facing left, with 200 oxygen and no
 *   diver. Left / right move it one column (clamped) and turn it that way; up / down move it one
 *   row within rows 0-8; fire, when the shot cooldown is 0, launches a bullet from the front cell
 *   in the facing direction (the submarine does not move that frame) and starts a cooldown of 5
 *   (one shot every 5 frames). Contact is with the front cell; the back cell is behind it.
 * - Bullets (the player's and the enemies') move one cell a frame along their row, starting on the
 *   frame they are fired, and leave at the edges.
 * - Enemies: a spawn timer of S (20 at first) counts down at the end of each frame and an enemy
 *   spawns when it is 0 (first on frame S + 1, then every S frames): a row uniform in 1-8, column 0
 *   heading right or column 9 heading left (equally likely), a submarine with probability 1/3,
 *   else a fish. The spawn is dropped when an enemy in that row heads the other way; rows may
 *   hold several enemies. Each enemy has its own move timer of M (5 at first): it moves when the
 *   timer is 0 (the timer then restarts at the current M) and counts down otherwise, so once every
 *   M + 1 frames. A submarine's shot timer works the same way with 10: it fires every 11 frames, a
 *   bullet on its own cell heading its way.
 * - Divers: one spawns every 30 frames (first on frame 31) on a row uniform in 1-8 (no other
 *   restriction), at an edge heading inwards, and moves once every 6 frames (timer of 5, as the
 *   enemies'). The submarine's front on a diver's cell picks it up when fewer than 6 are aboard.
 * - Order within a frame: spawns (enemy, diver), the action, the player's bullets (each moves,
 *   then strikes a fish on its cell, else a submarine: both removed, +1), divers (picked up, or
 *   moved and then picked up), enemy submarines (each: touching the front is terminal; moves when
 *   due, then touching is terminal or a player's bullet on its cell strikes it; shoots when due,
 *   even if just struck), enemy bullets (touching the front before or after moving is terminal),
 *   fish (as submarines, without shooting); the timers count down; oxygen. Lists are visited newest
 *   first. A terminal step still runs the whole frame.
 * - Oxygen: if it is 0 or less at the end of a frame the step is terminal (so 200 frames under
 *   water are survived and the 201st ends the episode); under water it then drops by one. It is
 *   not used on the surface. Surfacing (reaching row 0 from below): with no diver aboard it is
 *   terminal; otherwise oxygen refills to 200, and with 6 divers aboard the boat is emptied and
 *   the reward is oxygen * 10 / 200 rounded down; then the diver count drops by one in every case,
 *   so after a full boat it is -1: the gauge shows nothing, a pickup brings it to 0, and surfacing
 *   at -1 is not terminal (the count goes on down).
 * - Ramping (on by default), at each such surfacing: while S > 1 or M > 2, S drops by one (down to
 *   1) and M by one (down to 2) on every second surfacing (the 2nd, 4th, ...).
 * - Gauges on row 9: oxygen lights columns 0 .. oxygen * 10 / 200 - 1 (rounded down); divers light
 *   the columns just left of column 9: 9 - count .. 8.
 * Where the README and the reference disagree we follow the reference (the published curves come
 * from it): the README says "when surfacing with 6, all divers are removed" (the code leaves -1
 * divers aboard, see above) and that "oxygen degrades over time" (only under water).
 */
#include "minatar.h"

enum {
    SQ_FRONT = 0, SQ_BACK, SQ_FBULLET, SQ_TRAIL, SQ_EBULLET, SQ_FISH, SQ_ESUB, SQ_OXYGEN, SQ_DIVERS, SQ_DIVER,
    SQ_CHANNELS
};
#define SQ_GAUGE_ROW (MA_N - 1)
#define SQ_MAX_Y 8
#define SQ_OXYGEN_MAX 200
#define SQ_MAX_DIVERS 6
#define SQ_SHOT_COOLDOWN 5
#define SQ_FULL_ROW 0x3FFu
#define SQ_SPAWN0 20
#define SQ_MOVE0 5
#define SQ_MOVE_MIN 2
#define SQ_ESHOT_INTERVAL 10
#define SQ_DIVER_SPAWN 30
#define SQ_DIVER_MOVE 5
/* Room for the enemies of each kind: one lives at most 10 moves of M + 1 frames (<= 61 frames, or
 * 31 once M = 2, which it is from the 6th rise on, when S = 14), and one spawns every S frames, so
 * about 32 are the most alive at once. A spawn with no room is dropped (never seen). Divers: one
 * per 30 frames, living <= 61 frames. */
#define SQ_MAX_ENEMIES 64
#define SQ_MAX_IN_WATER 8

/* an enemy or a diver, moving along its row */
typedef struct {
    signed char x, y, dir; /* dir: +1 right, -1 left */
    signed char timer;     /* moves when 0 */
    signed char shot;      /* submarines: fires when 0 */
} sq_mover;

typedef struct {
    ma_common c;
    int x, y, dir;       /* the front cell and the facing (+1 right, -1 left) */
    int oxygen, divers, shot_cooldown, surfaced;
    int spawn_interval, spawn_timer, diver_timer, move_interval, ramp_index;
    int done;
    int n_sub, n_fish, n_diver; /* in spawn order */
    sq_mover sub[SQ_MAX_ENEMIES], fish[SQ_MAX_ENEMIES], diver[SQ_MAX_IN_WATER];
    /* bullets, the player's (fb) and the enemies' (eb): bit x of [d][y] is a bullet at (y, x) moving
     * left (d = 0) or right (d = 1) */
    unsigned fb[2][MA_N], eb[2][MA_N];
} seaquest;

static void sq_draw_movers(const sq_mover *m, int n, int channel, float *obs) {
    for (int i = 0; i < n; i++) {
        ma_set(obs, channel, m[i].y, m[i].x);
        int back = m[i].x - m[i].dir;
        if (back >= 0 && back < MA_N) ma_set(obs, SQ_TRAIL, m[i].y, back);
    }
}

static void sq_draw(const seaquest *e, float *obs) {
    ma_clear(obs, SQ_CHANNELS);
    ma_set(obs, SQ_FRONT, e->y, e->x);
    int bx = e->x - e->dir;
    if (bx >= 0 && bx < MA_N) ma_set(obs, SQ_BACK, e->y, bx);
    for (int y = 0; y <= SQ_MAX_Y; y++) {
        ma_set_row(obs, SQ_FBULLET, y, e->fb[0][y] | e->fb[1][y]);
        ma_set_row(obs, SQ_EBULLET, y, e->eb[0][y] | e->eb[1][y]);
    }
    sq_draw_movers(e->fish, e->n_fish, SQ_FISH, obs);
    sq_draw_movers(e->sub, e->n_sub, SQ_ESUB, obs);
    sq_draw_movers(e->diver, e->n_diver, SQ_DIVER, obs);
    int oxygen = e->oxygen > 0 ? e->oxygen : 0;
    ma_set_bar(obs, SQ_OXYGEN, SQ_GAUGE_ROW, oxygen * 10 / SQ_OXYGEN_MAX);
    for (int x = MA_N - 1 - e->divers; x < MA_N - 1; x++) ma_set(obs, SQ_DIVERS, SQ_GAUGE_ROW, x);
}

static void sq_reset(void *st, float *obs) {
    seaquest *e = st;
    e->x = 5;
    e->y = 0;
    e->dir = -1;
    e->oxygen = SQ_OXYGEN_MAX;
    e->divers = 0;
    e->shot_cooldown = 0;
    e->surfaced = 1;
    e->spawn_interval = e->spawn_timer = SQ_SPAWN0;
    e->diver_timer = SQ_DIVER_SPAWN;
    e->move_interval = SQ_MOVE0;
    e->ramp_index = 0;
    e->done = 0;
    e->n_sub = e->n_fish = e->n_diver = 0;
    memset(e->fb, 0, sizeof e->fb);
    memset(e->eb, 0, sizeof e->eb);
    sq_draw(e, obs);
}

/* Removes element i of a list, keeping the order of the others. */
static void sq_remove(sq_mover *m, int *n, int i) {
    memmove(m + i, m + i + 1, sizeof *m * (size_t)(*n - i - 1));
    (*n)--;
}

static int sq_at_front(const seaquest *e, const sq_mover *m) { return m->x == e->x && m->y == e->y; }

/* A player's bullet on the cell of an enemy: removes the bullet and returns 1. */
static int sq_take_bullet(seaquest *e, int y, int x) {
    unsigned bit = 1u << x;
    if (!((e->fb[0][y] | e->fb[1][y]) & bit)) return 0;
    e->fb[0][y] &= ~bit;
    e->fb[1][y] &= ~bit;
    return 1;
}

static void sq_spawn_enemy(seaquest *e) {
    int right = ma_chance(&e->c, 0.5), sub = ma_chance(&e->c, 1.0 / 3.0), y = 1 + ma_below(&e->c, 8);
    int dir = right ? 1 : -1;
    for (int i = 0; i < e->n_sub; i++)
        if (e->sub[i].y == y && e->sub[i].dir != dir) return;
    for (int i = 0; i < e->n_fish; i++)
        if (e->fish[i].y == y && e->fish[i].dir != dir) return;
    sq_mover *list = sub ? e->sub : e->fish;
    int *n = sub ? &e->n_sub : &e->n_fish;
    if (*n == SQ_MAX_ENEMIES) return;
    list[(*n)++] = (sq_mover){(signed char)(right ? 0 : MA_N - 1), (signed char)y, (signed char)dir,
                              (signed char)e->move_interval, SQ_ESHOT_INTERVAL};
}

static void sq_spawn_diver(seaquest *e) {
    int right = ma_chance(&e->c, 0.5), y = 1 + ma_below(&e->c, 8);
    if (e->n_diver == SQ_MAX_IN_WATER) return;
    e->diver[e->n_diver++] = (sq_mover){(signed char)(right ? 0 : MA_N - 1), (signed char)y,
                                        (signed char)(right ? 1 : -1), SQ_DIVER_MOVE, 0};
}

/* The player's bullets move; each strikes a fish on its new cell, else a submarine (oldest first). */
static float sq_player_bullets(seaquest *e) {
    for (int y = 0; y <= SQ_MAX_Y; y++) {
        e->fb[0][y] >>= 1;
        e->fb[1][y] = (e->fb[1][y] << 1) & SQ_FULL_ROW;
    }
    float r = 0.0f;
    for (int i = 0; i < e->n_fish; i++)
        if (sq_take_bullet(e, e->fish[i].y, e->fish[i].x)) sq_remove(e->fish, &e->n_fish, i--), r += 1.0f;
    for (int i = 0; i < e->n_sub; i++)
        if (sq_take_bullet(e, e->sub[i].y, e->sub[i].x)) sq_remove(e->sub, &e->n_sub, i--), r += 1.0f;
    return r;
}

static void sq_divers(seaquest *e) {
    for (int i = e->n_diver - 1; i >= 0; i--) {
        sq_mover *d = &e->diver[i];
        if (!(sq_at_front(e, d) && e->divers < SQ_MAX_DIVERS)) {
            if (d->timer > 0) {
                d->timer--;
                continue;
            }
            d->timer = SQ_DIVER_MOVE;
            d->x = (signed char)(d->x + d->dir);
            if (d->x < 0 || d->x >= MA_N) {
                sq_remove(e->diver, &e->n_diver, i);
                continue;
            }
            if (!(sq_at_front(e, d) && e->divers < SQ_MAX_DIVERS)) continue;
        }
        sq_remove(e->diver, &e->n_diver, i);
        e->divers++;
    }
}

/* Enemies of one kind, newest first: contact, move when due, contact or a bullet strike; then
 * submarines shoot when due (a struck one too, from the cell it was struck on). */
static float sq_enemies(seaquest *e, sq_mover *list, int *n, int shoots) {
    float r = 0.0f;
    for (int i = *n - 1; i >= 0; i--) {
        sq_mover m = list[i];
        int gone = 0;
        if (sq_at_front(e, &m)) e->done = 1;
        if (m.timer == 0) {
            m.timer = (signed char)e->move_interval;
            m.x = (signed char)(m.x + m.dir);
            if (m.x < 0 || m.x >= MA_N) gone = 1;
            else if (sq_at_front(e, &m)) e->done = 1;
            else if (sq_take_bullet(e, m.y, m.x)) gone = 1, r += 1.0f;
        } else {
            m.timer--;
        }
        if (shoots) {
            if (m.shot == 0) {
                m.shot = SQ_ESHOT_INTERVAL;
                if (m.x >= 0 && m.x < MA_N) e->eb[m.dir > 0][m.y] |= 1u << m.x;
            } else {
                m.shot--;
            }
        }
        if (gone) sq_remove(list, n, i);
        else list[i] = m;
    }
    return r;
}

/* Enemy bullets: touching the front before or after their move is terminal. */
static void sq_enemy_bullets(seaquest *e) {
    unsigned front = 1u << e->x;
    if ((e->eb[0][e->y] | e->eb[1][e->y]) & front) e->done = 1;
    for (int y = 0; y <= SQ_MAX_Y; y++) {
        e->eb[0][y] >>= 1;
        e->eb[1][y] = (e->eb[1][y] << 1) & SQ_FULL_ROW;
    }
    if ((e->eb[0][e->y] | e->eb[1][e->y]) & front) e->done = 1;
}

/* Reaching the surface with divers aboard (see the header); returns the full-boat bonus. */
static float sq_surface(seaquest *e) {
    float bonus = 0.0f;
    e->surfaced = 1;
    if (e->divers == SQ_MAX_DIVERS) {
        e->divers = 0;
        bonus = (float)(e->oxygen * 10 / SQ_OXYGEN_MAX);
    }
    e->oxygen = SQ_OXYGEN_MAX;
    e->divers--;
    if (e->c.ramping && (e->spawn_interval > 1 || e->move_interval > SQ_MOVE_MIN)) {
        if (e->move_interval > SQ_MOVE_MIN && e->ramp_index % 2) e->move_interval--;
        if (e->spawn_interval > 1) e->spawn_interval--;
        e->ramp_index++;
    }
    return bonus;
}

static void sq_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    seaquest *e = st;
    int a = ma_action(&e->c, *act);
    if (e->spawn_timer == 0) {
        sq_spawn_enemy(e);
        e->spawn_timer = e->spawn_interval;
    }
    if (e->diver_timer == 0) {
        sq_spawn_diver(e);
        e->diver_timer = SQ_DIVER_SPAWN;
    }
    if (a == MA_FIRE && e->shot_cooldown == 0) {
        e->fb[e->dir > 0][e->y] |= 1u << e->x;
        e->shot_cooldown = SQ_SHOT_COOLDOWN;
    } else if (a == MA_LEFT || a == MA_RIGHT) {
        e->dir = ma_dx(a);
        e->x = ma_clamp(e->x + e->dir, 0, MA_N - 1);
    } else {
        e->y = ma_clamp(e->y + ma_dy(a), 0, SQ_MAX_Y);
    }
    float r = sq_player_bullets(e);
    sq_divers(e);
    r += sq_enemies(e, e->sub, &e->n_sub, 1);
    sq_enemy_bullets(e);
    r += sq_enemies(e, e->fish, &e->n_fish, 0);
    if (e->spawn_timer > 0) e->spawn_timer--;
    if (e->diver_timer > 0) e->diver_timer--;
    if (e->shot_cooldown > 0) e->shot_cooldown--;
    if (e->oxygen <= 0) e->done = 1;
    if (e->y > 0) {
        e->oxygen--;
        e->surfaced = 0;
    } else if (!e->surfaced) {
        if (e->divers == 0) e->done = 1;
        else r += sq_surface(e);
    }
    *reward = r;
    *terminal = (unsigned char)e->done;
    sq_draw(e, obs);
}

MA_SPEC(seaquest, SQ_CHANNELS, "MinAtar Seaquest (Young & Tian 2019): shoot enemies (+1), rescue divers, surface for oxygen",
        seaquest, sq_reset, sq_step);
