/* MinAtar Space Invaders (Young & Tian 2019, arXiv 1903.03176, game description "Space Invaders").
 *
 * The player's cannon on the bottom row moves left and right and shoots upwards at a block of
 * aliens, which move sideways, step down and turn at the edges, and shoot back; +1 for each alien
 * shot. Channels: cannon, alien, alien_left, alien_right (the block's direction, lit on every
 * alien), friendly_bullet, enemy_bullet.
 *
 * Rules of the reference implementation (github.com/kenjyoung/MinAtar, space_invaders.py), as
 * facts:
 * - The cannon starts in column 5. Fire (when the shot cooldown is 0) puts a bullet on the
 *   cannon's cell and starts a cooldown of 5, counted down at the end of every frame: one shot
 *   every 5 frames. Left / right move the cannon one column (clamped); the others do nothing.
 * - A wave is 4 rows of 6 aliens, rows 0-3, columns 2-7. The first wave heads left.
 * - Order within a frame: the action; the player's bullets rise one row (leaving at the top), so a
 *   new bullet is seen in row 8; the aliens' bullets fall one row (leaving at the bottom) and one
 *   on the cannon's cell is terminal; an alien on the cannon's cell is terminal; the block moves
 *   if its move timer is 0; the aliens shoot if their shot timer is 0; aliens and player bullets
 *   on the same cell remove each other, +1 each (checked once, after all moves); the timers count
 *   down; a cleared wave is replaced. A terminal step still runs the whole frame.
 * - The block's move: when an alien is in the edge column it is heading to, the block turns and
 *   steps down one row (terminal if an alien was already in row 9), else it shifts one column.
 *   After the move an alien on the cannon's cell is terminal. An alien in row 9 elsewhere is not.
 * - The move timer starts at 12 and counts down every frame; when it fires it is set to
 *   min(aliens left, I), where I is 12 for the first wave: the block first moves on frame 13, and
 *   then every min(aliens, I) frames, the count taken at the move (one alien: every frame).
 * - The aliens' shot timer starts at 10 and counts down every frame: first shot on frame 11, then
 *   every 10 frames. The shooter is the lowest alien in the column nearest the cannon (the left
 *   one on a tie); its bullet starts on the alien's own cell and falls from the next frame on.
 * - A cleared wave is replaced at once by a new one of the same shape; the block keeps its
 *   direction and its move timer. With ramping (on by default) I drops by one per cleared wave
 *   while it is above 6; with ramping off it stays 12.
 * Where the README and the reference disagree we follow the reference (the published curves come
 * from it): the README says each new wave "moves at a slightly faster speed than the last"; in the
 * code that stops at an interval of 6.
 */
#include <stdlib.h>

#include "minatar.h"

enum { SI_CANNON = 0, SI_ALIEN, SI_ALIEN_LEFT, SI_ALIEN_RIGHT, SI_FBULLET, SI_EBULLET, SI_CHANNELS };
#define SI_WAVE_ROWS 4
#define SI_WAVE_MASK 0xFCu /* columns 2..7 */
#define SI_INTERVAL0 12
#define SI_INTERVAL_MIN 6 /* ramping stops here */
#define SI_SHOT_COOLDOWN 5
#define SI_ALIEN_SHOT_INTERVAL 10
#define SI_LEFT_EDGE 0x001u
#define SI_RIGHT_EDGE 0x200u
#define SI_BOTTOM (MA_N - 1)

typedef struct {
    ma_common c;
    int x;                     /* cannon column (bottom row) */
    unsigned alien[MA_N];      /* bit x of row y: an alien at (y, x) */
    unsigned fb[MA_N], eb[MA_N]; /* the player's and the aliens' bullets, same layout */
    int dir;                   /* the block's direction: -1 left, +1 right */
    int interval, move_timer, shot_cooldown, alien_shot_timer;
    int done;
} space_invaders;

static void si_wave(space_invaders *e) {
    memset(e->alien, 0, sizeof e->alien);
    for (int y = 0; y < SI_WAVE_ROWS; y++) e->alien[y] = SI_WAVE_MASK;
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
    e->x = 5;
    memset(e->fb, 0, sizeof e->fb);
    memset(e->eb, 0, sizeof e->eb);
    e->interval = e->move_timer = SI_INTERVAL0;
    e->dir = -1;
    e->shot_cooldown = 0;
    e->alien_shot_timer = SI_ALIEN_SHOT_INTERVAL;
    e->done = 0;
    si_wave(e);
    si_draw(e, obs);
}

static int si_count(const space_invaders *e) {
    int n = 0;
    for (int y = 0; y < MA_N; y++) n += __builtin_popcount(e->alien[y]);
    return n;
}

/* An alien on the cannon's cell ends the episode. */
static void si_alien_on_cannon(space_invaders *e) {
    if (e->alien[SI_BOTTOM] >> e->x & 1u) e->done = 1;
}

/* The block moves sideways, or turns and steps down when an alien is at the edge it is heading to
 * (terminal if one is already in the bottom row; the grid wraps, as in the reference, so that alien
 * shows in row 0 of the final picture). */
static void si_move_block(space_invaders *e) {
    unsigned any = 0;
    for (int y = 0; y < MA_N; y++) any |= e->alien[y];
    if (any & (e->dir < 0 ? SI_LEFT_EDGE : SI_RIGHT_EDGE)) {
        e->dir = -e->dir;
        unsigned bottom = e->alien[SI_BOTTOM];
        if (bottom) e->done = 1;
        memmove(e->alien + 1, e->alien, sizeof(unsigned) * (MA_N - 1));
        e->alien[0] = bottom;
    } else {
        for (int y = 0; y < MA_N; y++) e->alien[y] = e->dir < 0 ? e->alien[y] >> 1 : e->alien[y] << 1;
    }
}

/* The lowest alien in the column nearest the cannon (the left one on a tie) drops a bullet on its
 * own cell. */
static void si_alien_shot(space_invaders *e) {
    unsigned any = 0;
    for (int y = 0; y < MA_N; y++) any |= e->alien[y];
    if (!any) return;
    int best = -1;
    for (int x = 0; x < MA_N; x++)
        if ((any >> x & 1u) && (best < 0 || abs(x - e->x) < abs(best - e->x))) best = x;
    for (int y = MA_N - 1; y >= 0; y--)
        if (e->alien[y] >> best & 1u) {
            e->eb[y] |= 1u << best;
            return;
        }
}

static void si_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    space_invaders *e = st;
    int a = ma_action(&e->c, *act);
    if (a == MA_FIRE && e->shot_cooldown == 0) {
        e->fb[SI_BOTTOM] |= 1u << e->x;
        e->shot_cooldown = SI_SHOT_COOLDOWN;
    } else {
        e->x = ma_clamp(e->x + ma_dx(a), 0, MA_N - 1);
    }
    /* bullets: the player's rise (and leave at the top), the aliens' fall (and leave at the bottom) */
    memmove(e->fb, e->fb + 1, sizeof(unsigned) * (MA_N - 1));
    e->fb[MA_N - 1] = 0;
    memmove(e->eb + 1, e->eb, sizeof(unsigned) * (MA_N - 1));
    e->eb[0] = 0;
    if (e->eb[SI_BOTTOM] >> e->x & 1u) e->done = 1;
    si_alien_on_cannon(e);
    if (e->move_timer == 0) {
        int left = si_count(e);
        e->move_timer = left < e->interval ? left : e->interval;
        si_move_block(e);
        si_alien_on_cannon(e);
    }
    if (e->alien_shot_timer == 0) {
        e->alien_shot_timer = SI_ALIEN_SHOT_INTERVAL;
        si_alien_shot(e);
    }
    int kills = 0;
    for (int y = 0; y < MA_N; y++) {
        unsigned h = e->fb[y] & e->alien[y];
        if (!h) continue;
        kills += __builtin_popcount(h);
        e->fb[y] &= ~h;
        e->alien[y] &= ~h;
    }
    if (e->shot_cooldown > 0) e->shot_cooldown--;
    e->move_timer--;
    e->alien_shot_timer--;
    if (si_count(e) == 0) { /* wave cleared: the next one, faster with ramping */
        if (e->c.ramping && e->interval > SI_INTERVAL_MIN) e->interval--;
        si_wave(e);
    }
    *reward = (float)kills;
    *terminal = (unsigned char)e->done;
    si_draw(e, obs);
}

MA_SPEC(space_invaders, SI_CHANNELS, "MinAtar Space Invaders (Young & Tian 2019): shoot the aliens (+1 each), waves speed up",
        space_invaders, si_reset, si_step);
