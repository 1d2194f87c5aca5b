/* MinAtar Breakout (Young & Tian 2019, arXiv 1903.03176, game description "Breakout").
 *
 * Rules from the paper: the player controls a paddle on the bottom row and bounces a ball to break
 * three rows of bricks along the top; +1 for each brick broken, and the brick disappears; when all
 * bricks are cleared another three rows are added; the ball travels only along diagonals, is
 * reflected by walls and bricks, and off the paddle it goes left or right depending on the side of
 * the paddle it hits; the episode terminates when the ball reaches the bottom row past the paddle.
 * Channels (MinAtar's game documentation): paddle, ball, trail (the ball's previous cell), brick.
 *
 * Choices where the paper is silent (ours):
 * - Bricks fill rows 1-3; row 0 is free, so a ball that gets above the bricks bounces between them
 *   and the top wall. The paddle is one cell wide, starts in column 4, moves one cell per step.
 * - The ball starts in row 4, in column 0 or 9 (equally likely), moving down towards the centre.
 * - Each step the paddle moves first, then the ball tries to move one cell diagonally.
 * - The walls stand just outside the grid: a ball that would cross a side wall bounces back into
 *   its own column (this step it moves only vertically, its horizontal direction flipped); one that
 *   would cross the top stays in row 0 (it moves only sideways, now heading down). These half-moves
 *   switch the ball between the two diagonal lattices (x + y even or odd), so every brick can be hit.
 * - If the target cell holds a brick, the brick goes, +1, the vertical direction flips and the ball
 *   stays where it is this step.
 * - If the target is in the bottom row and the paddle is there, the ball stays and goes back up the
 *   way it came (it hit the paddle's near side); if the paddle is right below the ball, it goes up
 *   keeping its horizontal direction (it hit the far side). Otherwise reaching the bottom row is
 *   terminal.
 * - New bricks appear as soon as the last one is broken (the cell the ball is in stays empty).
 * - No difficulty ramping (the paper describes none for Breakout).
 * Actions: left and right move the paddle; the others do nothing.
 */
#include "minatar.h"

enum { BO_PADDLE = 0, BO_BALL, BO_TRAIL, BO_BRICK, BO_CHANNELS };
#define BO_BRICK_ROW0 1 /* bricks in rows 1..3 */
#define BO_BRICK_ROWS 3
#define BO_FULL_ROW 0x3FFu /* ten bits: a full row of bricks */

typedef struct {
    ma_common c;
    int paddle;          /* column of the paddle (bottom row) */
    int bx, by, dx, dy;  /* ball cell and direction (+-1 each) */
    int tx, ty;          /* trail: the ball's previous cell */
    unsigned bricks[BO_BRICK_ROWS]; /* bit x of row r: a brick at (BO_BRICK_ROW0 + r, x) */
    int done;            /* the ball reached the bottom */
} breakout;

static int bo_is_brick(const breakout *e, int y, int x) {
    int r = y - BO_BRICK_ROW0;
    return r >= 0 && r < BO_BRICK_ROWS && (e->bricks[r] >> x & 1u);
}

static void bo_fill_bricks(breakout *e) {
    for (int r = 0; r < BO_BRICK_ROWS; r++) e->bricks[r] = BO_FULL_ROW;
    int r = e->by - BO_BRICK_ROW0;
    if (r >= 0 && r < BO_BRICK_ROWS) e->bricks[r] &= ~(1u << e->bx);
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
    ma_reset(&e->c);
    e->paddle = 4;
    int left = ma_below(&e->c, 2) == 0;
    e->bx = left ? 0 : MA_N - 1;
    e->by = 4;
    e->dx = left ? 1 : -1;
    e->dy = 1;
    e->tx = e->bx;
    e->ty = e->by;
    e->done = 0;
    bo_fill_bricks(e);
    bo_draw(e, obs);
}

/* Moves the ball one step; returns the reward. */
static float bo_ball(breakout *e) {
    int nx = e->bx + e->dx, ny = e->by + e->dy;
    if (nx < 0 || nx >= MA_N) { /* off a side wall: back into its own column */
        e->dx = -e->dx;
        nx = e->bx;
    }
    if (ny < 0) { /* off the top wall: along row 0 */
        e->dy = 1;
        ny = e->by;
    }
    if (bo_is_brick(e, ny, nx)) {
        int r = ny - BO_BRICK_ROW0;
        e->bricks[r] &= ~(1u << nx);
        e->dy = -e->dy;
        if ((e->bricks[0] | e->bricks[1] | e->bricks[2]) == 0) bo_fill_bricks(e);
        return 1.0f;
    }
    if (ny == MA_N - 1) {
        if (e->paddle == nx || e->paddle == e->bx) {
            if (e->paddle == nx) e->dx = -e->dx; /* near side: back the way it came */
            e->dy = -1;
            return 0.0f;
        }
        e->done = 1;
    }
    e->tx = e->bx;
    e->ty = e->by;
    e->bx = nx;
    e->by = ny;
    return 0.0f;
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
