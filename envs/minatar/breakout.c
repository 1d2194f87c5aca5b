/* MinAtar Breakout (Young & Tian 2019, arXiv 1903.03176, game description "Breakout").
 *
 * The player moves a paddle along the bottom row and bounces a ball to break three rows of bricks;
 * +1 for each brick broken. Channels: paddle, ball, trail (the ball's previous cell), brick.
 *
 * Rules of the reference implementation (github.com/kenjyoung/MinAtar, breakout.py), as facts:
 * - Bricks fill rows 1-3. The paddle is one cell in row 9, starts in column 4 and moves one
 *   column per frame on left / right (clamped); the other actions do nothing.
 * - The ball starts in row 3 (on top of a brick, which stays) at column 0 heading down-right, or
 *   at column 9 heading down-left, equally likely. It moves one cell diagonally every frame.
 * - Order within a frame: the paddle moves, then the ball. The trail is the ball's cell before
 *   this frame's move. The ball's target is its cell plus its direction, then:
 *   - a target past a side wall is clamped back into the grid and the horizontal direction flips;
 *   - a target above row 0 is clamped to row 0 and the vertical direction flips; otherwise
 *   - a brick in the target: if no brick was struck on the previous frame, the brick goes, +1,
 *     the vertical direction flips and the ball stays in its row (it still moves sideways). If a
 *     brick was struck on the previous frame the ball enters the brick's cell and the brick stays
 *     (so it can tunnel through a run of bricks until it reaches an empty cell); otherwise
 *   - a target in row 9: if no brick is left, three full rows appear (rows 1-3); then if the
 *     paddle is under the ball's column the vertical direction flips, if it is at the target
 *     column both directions flip, and in both cases the ball stays in its row (moving sideways);
 *     with the paddle elsewhere the ball enters row 9 and the episode is terminal.
 * - No difficulty ramping.
 * Where the README and the reference disagree we follow the reference (the published curves come
 * from it): the README says another three rows come "when all bricks are cleared"; in the code
 * they come when the ball next reaches the bottom row after that.
 */
#include "minatar.h"

enum { BO_PADDLE = 0, BO_BALL, BO_TRAIL, BO_BRICK, BO_CHANNELS };
#define BO_BRICK_ROW0 1 /* bricks in rows 1..3 */
#define BO_BRICK_ROWS 3
#define BO_BALL_ROW0 3
#define BO_FULL_ROW 0x3FFu /* ten bits: a full row of bricks */

typedef struct {
    ma_common c;
    int paddle;          /* column of the paddle (bottom row) */
    int bx, by, dx, dy;  /* ball cell and direction (+-1 each) */
    int tx, ty;          /* trail: the ball's previous cell */
    unsigned bricks[BO_BRICK_ROWS]; /* bit x of row r: a brick at (BO_BRICK_ROW0 + r, x) */
    int struck;          /* a brick was struck on the previous frame */
    int done;            /* the ball reached the bottom */
} breakout;

static int bo_is_brick(const breakout *e, int y, int x) {
    int r = y - BO_BRICK_ROW0;
    return r >= 0 && r < BO_BRICK_ROWS && (e->bricks[r] >> x & 1u);
}

static void bo_fill_bricks(breakout *e) {
    for (int r = 0; r < BO_BRICK_ROWS; r++) e->bricks[r] = BO_FULL_ROW;
}

static void bo_draw(const breakout *e, float *obs) {
    ma_clear(obs, BO_CHANNELS);
    ma_set(obs, BO_PADDLE, MA_N - 1, e->paddle);
    ma_set(obs, BO_BALL, e->by, e->bx);
    ma_set(obs, BO_TRAIL, e->ty, e->tx);
    for (int r = 0; r < BO_BRICK_ROWS; r++) ma_set_row(obs, BO_BRICK, BO_BRICK_ROW0 + r, e->bricks[r]);
}

static void bo_reset(void *st, float *obs) {
    breakout *e = st;
    e->paddle = 4;
    int left = ma_below(&e->c, 2) == 0;
    e->bx = left ? 0 : MA_N - 1;
    e->by = BO_BALL_ROW0;
    e->dx = left ? 1 : -1;
    e->dy = 1;
    e->tx = e->bx;
    e->ty = e->by;
    e->struck = 0;
    e->done = 0;
    bo_fill_bricks(e);
    bo_draw(e, obs);
}

/* Moves the ball one step; returns the reward. */
static float bo_ball(breakout *e) {
    float r = 0.0f;
    int nx = e->bx + e->dx, ny = e->by + e->dy, strike = 0;
    if (nx < 0 || nx >= MA_N) { /* a side wall: back into the grid */
        nx = ma_clamp(nx, 0, MA_N - 1);
        e->dx = -e->dx;
    }
    if (ny < 0) { /* the top wall */
        ny = 0;
        e->dy = -e->dy;
    } else if (bo_is_brick(e, ny, nx)) {
        strike = 1;
        if (!e->struck) {
            r = 1.0f;
            e->bricks[ny - BO_BRICK_ROW0] &= ~(1u << nx);
            ny = e->by;
            e->dy = -e->dy;
        }
    } else if (ny == MA_N - 1) {
        if ((e->bricks[0] | e->bricks[1] | e->bricks[2]) == 0) bo_fill_bricks(e);
        if (e->paddle == e->bx) { /* under the ball: straight back up */
            e->dy = -e->dy;
            ny = e->by;
        } else if (e->paddle == nx) { /* at the target: back the way it came */
            e->dx = -e->dx;
            e->dy = -e->dy;
            ny = e->by;
        } else {
            e->done = 1;
        }
    }
    e->struck = strike;
    e->tx = e->bx;
    e->ty = e->by;
    e->bx = nx;
    e->by = ny;
    return r;
}

static void bo_step(void *st, const int *act, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    breakout *e = st;
    int a = ma_action(&e->c, *act);
    e->paddle = ma_clamp(e->paddle + ma_dx(a), 0, MA_N - 1);
    *reward = bo_ball(e);
    *terminal = (unsigned char)e->done;
    bo_draw(e, obs);
}

MA_SPEC(breakout, BO_CHANNELS, "MinAtar Breakout (Young & Tian 2019): paddle, ball, three rows of bricks; +1 per brick",
        breakout, bo_reset, bo_step);
