/* MinAtar Space Invaders (Young & Tian 2019, arXiv 1903.03176, game description "Space Invaders").
 *
 * Rules from the paper: the player's cannon on the bottom row moves left and right and shoots
 * upwards at a block of aliens; the aliens move sideways until one reaches the edge, then all move
 * down one row and reverse; their direction is shown by two channels (alien_left, alien_right),
 * one lit on every alien; +1 for each alien shot, and it is removed; the aliens shoot back; when
 * few aliens are left they speed up, a lone alien moving every frame; a cleared wave is followed
 * by a new one, slightly faster than the last; the episode terminates when an alien or an alien
 * bullet hits the cannon. Channels (MinAtar's game documentation): cannon, alien, alien_left,
 * alien_right, friendly_bullet, enemy_bullet.
 *
 * Choices where the paper is silent (ours):
 * - A wave is 4 rows of 6 aliens, rows 0-3, columns 2-7, first moving left. The block moves once
 *   every min(wave_interval, aliens left) frames: wave_interval is 12 for the first wave and one
 *   less for each following wave (down to 1) when ramping is on; with ramping off every wave has
 *   12. An alien reaching the bottom row (the cannon's) ends the episode.
 * - The cannon starts in column 5 and moves one cell per step. "Fire" puts a bullet in the cell
 *   above the cannon; at most one shot every 5 frames; bullets travel one cell per frame.
 * - Every 10 frames the alien lowest in the column nearest the cannon (the left one on a tie)
 *   drops a bullet just below itself; alien bullets fall one cell per frame.
 * - Each frame: the cannon moves (and fires), bullets move, then the block moves when due; hits
 *   are checked after each of them, so nothing passes through.
 */
#include <stdlib.h>

#include "minatar.h"

enum { SI_CANNON = 0, SI_ALIEN, SI_ALIEN_LEFT, SI_ALIEN_RIGHT, SI_FBULLET, SI_EBULLET, SI_CHANNELS };
#define SI_WAVE_ROWS 4
#define SI_WAVE_MASK 0xFCu /* columns 2..7 */
#define SI_INTERVAL0 12
#define SI_SHOT_COOLDOWN 5
#define SI_ALIEN_SHOT_EVERY 10
#define SI_LEFT_EDGE 0x001u
#define SI_RIGHT_EDGE 0x200u
#define SI_BOTTOM (MA_N - 1)

typedef struct {
    ma_common c;
    int x;                     /* cannon column (bottom row) */
    unsigned alien[MA_N];      /* bit x of row y: an alien at (y, x) */
    unsigned fb[MA_N], eb[MA_N]; /* the player's and the aliens' bullets, same layout */
    int dir;                   /* the block's direction: -1 left, +1 right */
    int wave_interval, move_timer, shot_cooldown, alien_shot_timer;
    int done;
} space_invaders;

static void si_wave(space_invaders *e) {
    memset(e->alien, 0, sizeof e->alien);
    for (int y = 0; y < SI_WAVE_ROWS; y++) e->alien[y] = SI_WAVE_MASK;
    e->dir = -1;
    e->move_timer = e->wave_interval;
}

static void si_draw(const space_invaders *e, float *obs) {
    ma_clear(obs, SI_CHANNELS);
    ma_set(obs, SI_CANNON, SI_BOTTOM, e->x);
    int dir_channel = e->dir < 0 ? SI_ALIEN_LEFT : SI_ALIEN_RIGHT;
    for (int y = 0; y < MA_N; y++) {
        ma_set_row(obs, SI_ALIEN, y, e->alien[y]);
        ma_set_row(obs, dir_channel, y, e->alien[y]);
        ma_set_row(obs, SI_FBULLET, y, e->fb[y]);
        ma_set_row(obs, SI_EBULLET, y, e->eb[y]);
    }
}

static void si_reset(void *st, float *obs) {
    space_invaders *e = st;
    ma_reset(&e->c);
    e->x = 5;
    memset(e->fb, 0, sizeof e->fb);
    memset(e->eb, 0, sizeof e->eb);
    e->wave_interval = SI_INTERVAL0;
    e->shot_cooldown = 0;
    e->alien_shot_timer = SI_ALIEN_SHOT_EVERY;
    e->done = 0;
    si_wave(e);
    si_draw(e, obs);
}

static int si_count(const space_invaders *e) {
    int n = 0;
    for (int y = 0; y < MA_N; y++) n += __builtin_popcount(e->alien[y]);
    return n;
}

/* Player bullets on aliens: +1 each, both removed. */
static float si_hits(space_invaders *e) {
    int n = 0;
    for (int y = 0; y < MA_N; y++) {
        unsigned h = e->fb[y] & e->alien[y];
        if (!h) continue;
        n += __builtin_popcount(h);
        e->fb[y] &= ~h;
        e->alien[y] &= ~h;
    }
    return (float)n;
}

/* An alien bullet or an alien on the cannon, or an alien in the bottom row, ends the episode. */
static void si_cannon_hit(space_invaders *e) {
    if ((e->eb[SI_BOTTOM] >> e->x & 1u) || e->alien[SI_BOTTOM]) e->done = 1;
}

/* The block moves sideways, or down and about when an alien is at the edge it is heading to. */
static void si_move_block(space_invaders *e) {
    unsigned any = 0;
    for (int y = 0; y < MA_N; y++) any |= e->alien[y];
    if (any & (e->dir < 0 ? SI_LEFT_EDGE : SI_RIGHT_EDGE)) {
        memmove(e->alien + 1, e->alien, sizeof(unsigned) * (MA_N - 1));
        e->alien[0] = 0;
        e->dir = -e->dir;
    } else {
        for (int y = 0; y < MA_N; y++) e->alien[y] = e->dir < 0 ? e->alien[y] >> 1 : e->alien[y] << 1;
    }
}

/* The lowest alien in the column nearest the cannon drops a bullet below itself. */
static void si_alien_shot(space_invaders *e) {
    unsigned any = 0;
    for (int y = 0; y < MA_N; y++) any |= e->alien[y];
    if (!any) return;
    int best = -1;
    for (int x = 0; x < MA_N; x++)
        if ((any >> x & 1u) && (best < 0 || abs(x - e->x) < abs(best - e->x))) best = x;
    for (int y = MA_N - 2; y >= 0; y--)
        if (e->alien[y] >> best & 1u) {
            e->eb[y + 1] |= 1u << best;
            return;
        }
}

/* Bullets, the block and the aliens' shot, stopping at the first hit on the cannon (the final
 * picture shows what hit it); returns the aliens shot. */
static float si_world(space_invaders *e, int fire) {
    /* bullets: the player's rise (and leave at the top), the aliens' fall (and leave at the bottom) */
    memmove(e->fb, e->fb + 1, sizeof(unsigned) * (MA_N - 1));
    e->fb[MA_N - 1] = 0;
    memmove(e->eb + 1, e->eb, sizeof(unsigned) * (MA_N - 1));
    e->eb[0] = 0;
    if (e->shot_cooldown > 0) e->shot_cooldown--;
    if (fire && e->shot_cooldown == 0) {
        e->fb[SI_BOTTOM - 1] |= 1u << e->x;
        e->shot_cooldown = SI_SHOT_COOLDOWN;
    }
    float r = si_hits(e);
    si_cannon_hit(e);
    if (e->done) return r;
    int left = si_count(e);
    if (e->move_timer > left) e->move_timer = left; /* few aliens left: they speed up at once */
    if (left && --e->move_timer <= 0) {
        si_move_block(e);
        r += si_hits(e);
        left = si_count(e);
        e->move_timer = left < e->wave_interval ? left : e->wave_interval;
        si_cannon_hit(e);
        if (e->done) return r;
    }
    if (--e->alien_shot_timer <= 0) {
        si_alien_shot(e);
        e->alien_shot_timer = SI_ALIEN_SHOT_EVERY;
        si_cannon_hit(e);
    }
    if (!left) { /* wave cleared: the next one, faster */
        if (e->c.ramping && e->wave_interval > 1) e->wave_interval--;
        si_wave(e);
    }
    return r;
}

static void si_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    space_invaders *e = st;
    int a = ma_action(&e->c, *act);
    e->x = ma_clamp(e->x + ma_dx(a), 0, MA_N - 1);
    si_cannon_hit(e);
    *reward = e->done ? 0.0f : si_world(e, a == MA_FIRE);
    *terminal = (unsigned char)e->done;
    si_draw(e, obs);
}

MA_SPEC(space_invaders, SI_CHANNELS, "MinAtar Space Invaders (Young & Tian 2019): shoot the aliens (+1 each), waves speed up",
        space_invaders, si_reset, si_step);
