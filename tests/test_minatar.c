/* The MinAtar games (envs/minatar/): rules that cannot hold by luck, observed through the
 * observation channels only. Determinism across threads is covered by test_env for every game. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/rl/env.h"

enum { NOOP = 0, LEFT, UP, RIGHT, DOWN, FIRE };

/* the games and their channel counts (Young & Tian 2019, Table 1 / the game documentation) */
static const struct {
    const char *name;
    int channels;
} kGames[] = {
    {"minatar/breakout", 4},
    {"minatar/asterix", 4},
    {"minatar/freeway", 7},
    {"minatar/seaquest", 10},
    {"minatar/space_invaders", 6},
};
#define NGAMES ((int)(sizeof kGames / sizeof kGames[0]))

/* N environments of one game with their buffers, the observations before the last step, and an
 * RNG for random policies */
typedef struct {
    sm_vecenv v;
    int N, D;
    float *obs, *fin, *before, *rew; /* (N, D) x 3 and (N), one block */
    int act[16];
    unsigned char term[16], trunc[16];
    sm_rng rng;
} rig;

static void rig_init_opts(rig *r, const char *name, int n, uint64_t seed, const sm_env_opts *o) {
    sm_error err = {0};
    cr_assert_leq(n, 16);
    cr_assert_eq(sm_vecenv_init(&r->v, name, n, seed, o, &err), SM_OK, "%s", err.msg);
    r->N = n;
    r->D = sm_env_obs_numel(r->v.spec);
    r->obs = calloc((size_t)n * (3 * r->D + 1), sizeof(float));
    r->fin = r->obs + (size_t)n * r->D;
    r->before = r->fin + (size_t)n * r->D;
    r->rew = r->before + (size_t)n * r->D;
    sm_rng_seed(&r->rng, seed + 1000);
    sm_vecenv_bind(&r->v, r->obs, r->act, NULL, r->rew, r->term, r->trunc, r->fin);
    sm_vecenv_reset(&r->v);
}

static void rig_init(rig *r, const char *name, int n, uint64_t seed, double sticky) {
    sm_env_opts o = sm_env_opts_default();
    o.sticky = sticky;
    rig_init_opts(r, name, n, seed, &o);
}

static void rig_free(rig *r) {
    sm_vecenv_free(&r->v);
    free(r->obs);
}

/* One step of the actions in r->act; r->before keeps the observations it started from. */
static void rig_step(rig *r) {
    memcpy(r->before, r->obs, sizeof(float) * (size_t)r->N * r->D);
    sm_vecenv_step(&r->v);
}

/* One step of uniformly random actions (fire on top of that half the time when fire_half). */
static void rig_step_random(rig *r, int fire_half) {
    for (int i = 0; i < r->N; i++)
        r->act[i] = fire_half && sm_rng_below(&r->rng, 2) ? FIRE : (int)sm_rng_below(&r->rng, 6);
    rig_step(r);
}

/* Environment i's observation at the end of the last step: the final one if its episode ended. */
static const float *rig_ended(const rig *r, int i) { return (r->term[i] ? r->fin : r->obs) + (size_t)i * r->D; }
static const float *rig_before(const rig *r, int i) { return r->before + (size_t)i * r->D; }

/* the first lit cell of a channel of one observation as y * 10 + x, or -1 */
static int find_cell(const float *obs, int channel) {
    for (int k = 0; k < 100; k++)
        if (obs[channel * 100 + k] != 0.0f) return k;
    return -1;
}

static int count_cells(const float *obs, int channel) {
    int n = 0;
    for (int k = 0; k < 100; k++) n += obs[channel * 100 + k] != 0.0f;
    return n;
}

/* the column of the first lit cell of row y in a channel, or -1 */
static int row_cell(const float *obs, int channel, int y) {
    for (int x = 0; x < 10; x++)
        if (obs[channel * 100 + y * 10 + x] != 0.0f) return x;
    return -1;
}

/* A paddle move for Breakout that follows the ball's column. */
static int follow_ball(const float *obs) {
    int paddle = find_cell(obs, 0) % 10, ball = find_cell(obs, 1) % 10;
    return ball < paddle ? LEFT : ball > paddle ? RIGHT : NOOP;
}

/* Every game: the spec (10 x 10 x C binary, 6 actions); under a uniform random policy every value
 * is 0 or 1, every channel lights up at some point, and every environment finishes episodes. */
Test(minatar, binary_observations_channels_and_random_episodes_end) {
    for (int g = 0; g < NGAMES; g++) {
        const sm_env_spec *s = sm_env_find(kGames[g].name);
        cr_assert_not_null(s, "%s is registered", kGames[g].name);
        cr_assert_eq(s->obs_c, kGames[g].channels, "%s", s->name);
        cr_assert_eq(s->obs_h, 10);
        cr_assert_eq(s->obs_w, 10);
        cr_assert(s->obs_binary);
        cr_assert_eq(s->act_kind, SM_SPACE_DISCRETE);
        cr_assert_eq(s->act_n, 6);
        const int N = 8, T = 30000;
        rig r;
        rig_init(&r, s->name, N, 3 + (uint64_t)g, -1.0);
        int lit[16] = {0}, episodes[8] = {0};
        for (int t = 0; t < T; t++) {
            rig_step_random(&r, 0);
            for (int i = 0; i < N; i++) {
                episodes[i] += r.term[i] || r.trunc[i];
                cr_assert_eq(r.trunc[i], 0, "%s: MinAtar ends episodes itself", s->name);
            }
            for (int k = 0; k < N * r.D; k++) {
                float x = r.obs[k];
                if (x != 0.0f && x != 1.0f) cr_assert_fail("%s: obs[%d] = %g is not 0/1", s->name, k, x);
                if (x != 0.0f) lit[(k % r.D) / 100] = 1;
            }
        }
        for (int c = 0; c < s->obs_c; c++) cr_expect(lit[c], "%s: channel %d never lit", s->name, c);
        for (int i = 0; i < N; i++) cr_assert_gt(episodes[i], 0, "%s env %d: a random episode ends", s->name, i);
        rig_free(&r);
    }
}

/* Breakout: a paddle that follows the ball returns it; the trail is always the ball's cell before
 * the step; a brick the ball hits gives +1 and exactly that brick disappears, and the ball stays in
 * its row but moves on sideways (into the brick's column); no step without reward removes a brick. */
Test(minatar, breakout_brick_gives_one_and_disappears) {
    rig r;
    rig_init(&r, "minatar/breakout", 1, 21, 0.0);
    int hits = 0;
    for (int t = 0; t < 3000 && hits < 5; t++) {
        r.act[0] = follow_ball(r.obs);
        rig_step(&r);
        const float *before = r.before;
        if (r.term[0]) continue;
        cr_assert_eq(find_cell(r.obs, 2), find_cell(before, 1), "step %d: the trail is the ball's last cell", t);
        int removed = 0, added = 0, where = -1;
        for (int k = 0; k < 100; k++) {
            removed += before[300 + k] == 1.0f && r.obs[300 + k] == 0.0f;
            added += before[300 + k] == 0.0f && r.obs[300 + k] == 1.0f;
            if (before[300 + k] == 1.0f && r.obs[300 + k] == 0.0f) where = k;
        }
        if (r.rew[0] == 0.0f) {
            cr_assert_eq(removed + added, 0, "step %d: bricks change without a reward", t);
            continue;
        }
        cr_assert_eq(r.rew[0], 1.0f);
        if (count_cells(before, 3) == 1) continue; /* the last brick: a new set appears */
        cr_assert_eq(removed, 1, "step %d: one brick goes", t);
        cr_assert_eq(added, 0);
        int b = find_cell(r.obs, 1), b0 = find_cell(before, 1);
        cr_assert_eq(b / 10, b0 / 10, "the ball stays in its row");
        cr_assert_eq(abs(where / 10 - b0 / 10), 1, "the brick broken is in the next row");
        cr_assert_eq(b % 10, where % 10, "the ball moves into the brick's column");
        hits++;
    }
    cr_assert_eq(hits, 5, "a ball-following paddle breaks bricks");
    rig_free(&r);
}

/* A lookahead player for rules that only good play reaches: it tries each action on copies of
 * environment 0's state (the vector exposes the states), continues each with `rollouts` runs of
 * `policy` for up to `horizon` steps, and picks the action of the best mean score (rewards, earlier
 * ones worth more, minus 100 for an episode's end). */
typedef int (*rollout_policy)(const float *obs, sm_rng *rng);

static int lookahead(rig *r, int horizon, int rollouts, rollout_policy policy) {
    const sm_env_spec *s = r->v.spec;
    unsigned char scratch[2048];
    float sim_obs[1000];
    cr_assert_leq(s->state_bytes, sizeof scratch);
    double best_score = -1e300;
    int best = NOOP;
    for (int a0 = 0; a0 < 6; a0++) {
        double score = 0;
        for (int k = 0; k < rollouts; k++) {
            memcpy(scratch, r->v.states, s->state_bytes);
            memcpy(sim_obs, r->obs, sizeof(float) * r->D);
            for (int j = 0; j < horizon; j++) {
                int a = j ? policy(sim_obs, &r->rng) : a0;
                float rew;
                unsigned char term = 0;
                s->step(scratch, &a, NULL, sim_obs, &rew, &term);
                score += rew * (1.0 - (double)j / horizon) - (term ? 100.0 : 0.0);
                if (term) break;
            }
        }
        if (score > best_score) best_score = score, best = a0;
    }
    return best;
}

static int follow_policy(const float *obs, sm_rng *rng) {
    (void)rng;
    return follow_ball(obs);
}

static int random_policy(const float *obs, sm_rng *rng) {
    (void)obs;
    return (int)sm_rng_below(rng, 6);
}

/* Space Invaders: fire when an alien is in the cannon's column, else move towards the nearest
 * column holding one. */
static int aim_policy(const float *obs, sm_rng *rng) {
    (void)rng;
    int c = find_cell(obs, 0) % 10, best = -1;
    for (int x = 0; x < 10; x++) {
        int any = 0;
        for (int y = 0; y < 10; y++) any |= obs[100 + y * 10 + x] != 0.0f;
        if (any && (best < 0 || abs(x - c) < abs(best - c))) best = x;
    }
    return best < 0 || best == c ? FIRE : best < c ? LEFT : RIGHT;
}

/* Breakout: a lookahead player clears the wall; the 30th brick gives +1 like the others; the grid
 * then stays empty until the ball next heads into the bottom row, when a full wall of three rows
 * appears (the reference's rule; the README says "when all bricks are cleared"). */
Test(minatar, breakout_cleared_wall_is_replaced_when_the_ball_reaches_the_bottom) {
    rig r;
    rig_init(&r, "minatar/breakout", 1, 21, 0.0);
    double episode_return = 0;
    int cleared = 0, replaced = 0;
    for (int t = 0; t < 5000 && !replaced; t++) {
        r.act[0] = lookahead(&r, 300, 1, follow_policy);
        rig_step(&r);
        episode_return = r.term[0] ? 0.0 : episode_return + r.rew[0];
        if (r.term[0]) {
            cleared = 0;
            continue;
        }
        if (r.rew[0] > 0.0f && count_cells(r.before, 3) == 1) {
            cr_assert_eq(r.rew[0], 1.0f);
            cr_assert_eq(count_cells(r.obs, 3), 0, "no wall until the ball comes down");
            cr_assert_eq(episode_return, 30.0, "one point per brick");
            cleared = 1;
        } else if (cleared) {
            int down = find_cell(r.before, 1) / 10 == 8 && find_cell(r.before, 2) / 10 == 7;
            if (count_cells(r.obs, 3) == 0) {
                cr_assert(!down, "step %d: the ball went for the bottom row and no wall came", t);
            } else {
                cr_assert(down, "step %d: a wall came without the ball heading into the bottom row", t);
                cr_assert_eq(count_cells(r.obs, 3), 30, "a full wall");
                replaced = 1;
            }
        }
    }
    cr_assert(replaced, "the wall was cleared and replaced");
    rig_free(&r);
}

/* Seaquest: a lookahead player fills the boat; the diver gauge lights the six cells left of column
 * 9 (columns 3-8); surfacing with 6 divers empties it, refills the oxygen and scores one point per
 * lit oxygen cell at that moment. The reference then takes one more diver off (the count is -1, the
 * gauge empty), so diving and surfacing again at once does not end the episode. */
Test(minatar, seaquest_six_divers_score_the_oxygen_left) {
    rig r;
    rig_init(&r, "minatar/seaquest", 1, 1, 0.0);
    int full = 0;
    for (int t = 0; t < 20000 && !full; t++) {
        r.act[0] = lookahead(&r, 40, 8, random_policy);
        rig_step(&r);
        if (!r.term[0] && count_cells(r.before, 8) == 6 && find_cell(r.obs, 0) / 10 == 0) {
            for (int x = 3; x <= 8; x++) cr_assert_eq(r.before[800 + 90 + x], 1.0f, "gauge cell %d", x);
            cr_assert_eq(count_cells(r.obs, 8), 0, "the boat is emptied");
            cr_assert_eq(count_cells(r.obs, 7), 10, "oxygen refilled");
            cr_assert_eq(r.rew[0], (float)count_cells(r.before, 7), "one point per oxygen cell");
            full = 1;
            r.act[0] = DOWN;
            sm_vecenv_step(&r.v);
            cr_assert_eq(r.term[0], 0);
            r.act[0] = UP;
            sm_vecenv_step(&r.v);
            cr_assert_eq(find_cell(r.obs, 0) / 10, 0, "back on the surface");
            cr_assert_eq(r.term[0], 0, "surfacing at -1 divers does not end the episode");
        }
    }
    cr_assert(full, "the boat was filled and brought up");
    rig_free(&r);
}

/* Breakout: a paddle that runs away from the ball misses it; the episode ends (terminal, not
 * truncated) with the ball in the bottom row, and the next episode starts with the full wall. */
Test(minatar, breakout_ball_past_paddle_is_terminal) {
    rig r;
    rig_init(&r, "minatar/breakout", 1, 5, 0.0);
    int ended = 0;
    for (int ep = 0; ep < 4; ep++) {
        int ball = find_cell(r.obs, 1) % 10, t;
        cr_assert_eq(count_cells(r.obs, 3), 30, "three rows of ten bricks");
        cr_assert_eq(find_cell(r.obs, 1) / 10, 3, "the ball starts in row 3, on a brick");
        cr_assert(ball == 0 || ball == 9);
        cr_assert_eq(find_cell(r.obs, 0), 94, "the paddle starts in column 4");
        for (t = 0; t < 100; t++) {
            r.act[0] = ball < 5 ? RIGHT : LEFT; /* away from where the ball comes down */
            sm_vecenv_step(&r.v);
            if (r.term[0]) break;
        }
        cr_assert_eq(r.term[0], 1);
        cr_assert_eq(r.trunc[0], 0);
        cr_assert_eq(find_cell(r.fin, 1) / 10, 9, "the ball reached the bottom row");
        cr_assert_neq(find_cell(r.fin, 1) % 10, find_cell(r.fin, 0) % 10, "past the paddle");
        ended++;
    }
    cr_assert_eq(ended, 4);
    rig_free(&r);
}

/* Sticky actions, seen through Breakout's paddle: choosing left and right in turn, a step whose
 * executed action (the paddle's move) differs from the chosen one must repeat the previous executed
 * action, and does so with frequency p among steps where the two differ. Tolerance: 5 standard
 * deviations of the estimate. */
static void sticky_frequency(double p, double *freq, long *eligible) {
    rig r;
    rig_init(&r, "minatar/breakout", 4, 77, p);
    long n = 0, stuck = 0;
    int prev[4] = {NOOP, NOOP, NOOP, NOOP};
    for (int t = 0; t < 100000; t++) {
        int before[4];
        for (int i = 0; i < 4; i++) {
            before[i] = find_cell(r.obs + i * r.D, 0) % 10;
            r.act[i] = (t + i) % 2 ? LEFT : RIGHT;
        }
        sm_vecenv_step(&r.v);
        for (int i = 0; i < 4; i++) {
            if (r.term[i]) { /* auto-reset: the last executed action carries over, unseen here */
                prev[i] = -1;
                continue;
            }
            if (before[i] == 0 || before[i] == 9) { /* a wall hides the executed action */
                prev[i] = -1;
                continue;
            }
            int d = find_cell(r.obs + i * r.D, 0) % 10 - before[i];
            int exec = d < 0 ? LEFT : d > 0 ? RIGHT : NOOP;
            if (prev[i] >= 0 && prev[i] != r.act[i]) {
                cr_assert(exec == r.act[i] || exec == prev[i], "executed %d: neither chosen %d nor previous %d", exec,
                          r.act[i], prev[i]);
                n++;
                stuck += exec != r.act[i];
            } else if (prev[i] >= 0) {
                cr_assert_eq(exec, r.act[i]);
            }
            prev[i] = exec;
        }
    }
    rig_free(&r);
    *freq = (double)stuck / (double)n;
    *eligible = n;
}

Test(minatar, sticky_actions_repeat_with_probability_p) {
    double f;
    long n;
    sticky_frequency(-1.0, &f, &n); /* the default, 0.1 */
    double sd = sqrt(0.1 * 0.9 / (double)n);
    cr_assert_gt(n, 200000);
    cr_assert(fabs(f - 0.1) < 5 * sd, "repeat frequency %.4f over %ld steps (expected 0.1 +- %.4f)", f, n, 5 * sd);
    sticky_frequency(0.3, &f, &n);
    sd = sqrt(0.3 * 0.7 / (double)n);
    cr_assert(fabs(f - 0.3) < 5 * sd, "repeat frequency %.4f over %ld steps (expected 0.3 +- %.4f)", f, n, 5 * sd);
    sticky_frequency(0.0, &f, &n);
    cr_assert_eq(f, 0.0, "sticky 0: the chosen action always runs (%.5f)", f);
}

/* Freeway: every episode is exactly 2501 frames (the reference's counter of 2500 ends the episode
 * when it goes below 0; the README says 2500) and ends as a terminal (not a truncation). */
Test(minatar, freeway_ends_at_2501_frames_as_terminal) {
    rig r;
    rig_init(&r, "minatar/freeway", 2, 8, -1.0);
    for (int ep = 0; ep < 3; ep++)
        for (int t = 1; t <= 2501; t++) {
            rig_step_random(&r, 0);
            for (int i = 0; i < 2; i++) {
                cr_assert_eq(r.term[i], t == 2501, "episode %d frame %d env %d", ep, t, i);
                cr_assert_eq(r.trunc[i], 0);
            }
        }
    sm_env_log l = sm_vecenv_log_take(&r.v);
    cr_assert_eq(l.n, 6);
    cr_assert_eq(l.episode_length, 6 * 2501.0);
    rig_free(&r);
}

/* Freeway: a chicken that always goes up climbs at most one row every 3 frames, never moves
 * sideways, scores +1 exactly when it steps from row 1 onto the top, and is then back in row 9. */
Test(minatar, freeway_crossing_scores_and_returns_to_the_bottom) {
    rig r;
    rig_init(&r, "minatar/freeway", 1, 4, 0.0);
    r.act[0] = UP;
    int last_climb = -100, crossings = 0;
    for (int t = 0; t < 2500; t++) {
        int before = find_cell(r.obs, 0);
        sm_vecenv_step(&r.v);
        int after = find_cell(r.obs, 0);
        cr_assert_eq(after % 10, before % 10, "the chicken keeps its column");
        cr_assert_eq(count_cells(r.obs, 0), 1);
        cr_assert_eq(count_cells(r.obs, 1), 8, "one car a lane");
        if (r.rew[0] != 0.0f) {
            cr_assert_eq(r.rew[0], 1.0f);
            cr_assert_eq(before / 10, 1, "scored from row 1");
            cr_assert_eq(after / 10, 9, "back at the bottom");
            crossings++;
        }
        if (r.rew[0] != 0.0f || after / 10 == before / 10 - 1) {
            cr_assert_geq(t - last_climb, 3, "frame %d: one move every 3 frames", t);
            last_climb = t;
        } else {
            cr_assert(after / 10 == before / 10 || after / 10 == 9, "frame %d: only a car sends it down", t);
        }
    }
    cr_assert_gt(crossings, 0, "an always-up chicken gets across");
    rig_free(&r);
}

/* Asterix under a random policy: an enemy on the player's cell ends the episode, and a step that
 * ends it has an enemy on the player's cell or one that just left it (contact is checked before the
 * objects move too, and the frame runs on); +1 only when gold was on (or next to, and moving onto)
 * the player's new cell, or entered at the edge this step, and that gold is gone. */
Test(minatar, asterix_gold_scores_and_enemies_end_the_episode) {
    const int N = 4;
    rig r;
    rig_init(&r, "minatar/asterix", N, 6, -1.0);
    int golds = 0, deaths = 0;
    for (int t = 0; t < 20000; t++) {
        rig_step_random(&r, 0);
        for (int i = 0; i < N; i++) {
            const float *o = rig_ended(&r, i), *b = rig_before(&r, i);
            int p = find_cell(o, 0);
            int on = o[100 + p] == 1.0f;
            int left_it = b[100 + p] == 1.0f || /* the player stepped onto it; it may have left the grid */
                          (o[200 + p] == 1.0f && ((p % 10 > 0 && o[100 + p - 1] == 1.0f) || (p % 10 < 9 && o[100 + p + 1] == 1.0f)));
            if (on) cr_assert(r.term[i], "an enemy on the player ends the episode");
            if (r.term[i]) cr_assert(on || left_it, "an episode ends on an enemy's contact");
            if (r.rew[i] != 0.0f) {
                cr_assert_eq(r.rew[i], 1.0f);
                int near = b[300 + p] == 1.0f || (p % 10 > 0 && b[300 + p - 1] == 1.0f) ||
                           (p % 10 < 9 && b[300 + p + 1] == 1.0f);
                int entered = p % 10 <= 1 || p % 10 >= 8; /* gold spawned at the edge (and moved) this step */
                cr_assert(near || entered, "gold was at the player's cell or moving onto it");
                cr_assert_eq(o[300 + p], 0.0f, "collected gold vanishes");
                golds++;
            }
            deaths += r.term[i];
        }
    }
    cr_assert_gt(golds, 20);
    cr_assert_gt(deaths, 20);
    rig_free(&r);
}

/* Seaquest: no oxygen is used on the surface (a submarine waiting there for 300 frames keeps a full
 * gauge and lives; diving and coming straight back up with no diver ends the episode). Under water
 * it drops by one a frame, the gauge lighting oxygen * 10 / 200 cells (rounded down): a submarine
 * that dives on frame 1 and stays in row 1 sees 9 cells after frame 1 and 0 after frame 181, and,
 * unless something hits it first, its episode ends on frame 201. */
Test(minatar, seaquest_oxygen_lasts_200_frames_under_water_and_none_on_the_surface) {
    rig r;
    rig_init(&r, "minatar/seaquest", 1, 12, 0.0);
    cr_assert_eq(count_cells(r.obs, 7), 10, "full oxygen");
    cr_assert_eq(count_cells(r.obs, 8), 0, "no diver");
    cr_assert_eq(find_cell(r.obs, 0), 5, "the front at row 0, column 5");
    cr_assert_eq(find_cell(r.obs, 1), 6, "facing left: the back to its right");
    for (int t = 1; t <= 300; t++) {
        r.act[0] = NOOP;
        sm_vecenv_step(&r.v);
        cr_assert_eq(r.term[0], 0, "frame %d on the surface", t);
        cr_assert_eq(count_cells(r.obs, 7), 10, "frame %d", t);
    }
    r.act[0] = DOWN;
    sm_vecenv_step(&r.v);
    cr_assert_eq(find_cell(r.obs, 0) / 10, 1);
    cr_assert_eq(r.term[0], 0);
    r.act[0] = UP;
    sm_vecenv_step(&r.v);
    cr_assert_eq(r.term[0], 1, "surfacing with no diver ends the episode");
    cr_assert_eq(find_cell(r.fin, 0) / 10, 0);
    cr_assert_eq(count_cells(r.fin, 7), 9, "with oxygen to spare");
    int survived = 0;
    for (int ep = 0; ep < 60 && survived < 3; ep++) {
        int t;
        for (t = 1; t <= 300; t++) {
            r.act[0] = t == 1 ? DOWN : NOOP;
            sm_vecenv_step(&r.v);
            if (r.term[0]) break;
            cr_assert_eq(count_cells(r.obs, 7), (200 - t) / 20, "frame %d", t);
        }
        cr_assert_leq(t, 201, "oxygen lasts 200 frames under water");
        survived += t == 201;
    }
    cr_assert_geq(survived, 3, "some dives were left alone until the oxygen ran out");
    rig_free(&r);
}

/* Seaquest: a submarine that chases divers and then surfaces. Every surfacing with k = 1..5 divers
 * keeps k - 1 and refills the oxygen; with 6 it gives one point per lit oxygen cell and empties the
 * boat (to -1 divers: until a diver shows again the gauge cannot tell 0 from -1). The oxygen gauge
 * follows a count kept here: down one a frame under water, refilled on surfacing. A fish, a
 * submarine or an enemy bullet on the front ends the episode, as do oxygen out (at 0 or below at
 * the end of a frame) and surfacing empty; a terminal step shows one of these or an enemy (or
 * bullet) that was on the front's cell before it moved; any other reward is +1 per enemy shot,
 * each costing a bullet. */
Test(minatar, seaquest_divers_surfacing_and_hits) {
    rig r;
    rig_init(&r, "minatar/seaquest", 1, 3, 0.0);
    int surfacings = 0, pickups = 0, shots = 0, deaths = 0, oxygen = 200, debt = 0;
    const float *before = r.before;
    for (int t = 0; t < 200000; t++) {
        int f = find_cell(r.obs, 0), divers = count_cells(r.obs, 8), d = find_cell(r.obs, 9);
        if (divers > 0 && sm_rng_below(&r.rng, 4)) r.act[0] = UP;
        else if (d >= 0 && sm_rng_below(&r.rng, 4)) /* towards the diver: row first */
            r.act[0] = d / 10 < f / 10 ? UP : d / 10 > f / 10 ? DOWN : d % 10 < f % 10 ? LEFT : RIGHT;
        else r.act[0] = (int)sm_rng_below(&r.rng, 6);
        rig_step(&r);
        const float *o = rig_ended(&r, 0);
        int g = find_cell(o, 0);
        int surfaced = f / 10 == 1 && g / 10 == 0;
        int hit = o[400 + g] != 0.0f || o[500 + g] != 0.0f || o[600 + g] != 0.0f;
        int was_hit = before[400 + g] != 0.0f || before[500 + g] != 0.0f || before[600 + g] != 0.0f || o[300 + g] != 0.0f;
        int out = oxygen <= 0;
        if (g / 10 > 0) oxygen--;
        else if (surfaced && (divers > 0 || !r.term[0])) oxygen = 200; /* no refill when surfacing empty */
        int unsure = surfaced && divers == 0 && debt && r.term[0]; /* -1 and hit, or 0 divers? */
        if (!unsure) cr_assert_eq(count_cells(o, 7), (oxygen > 0 ? oxygen : 0) / 20, "step %d: oxygen gauge", t);
        if (hit || out || (surfaced && divers == 0 && !debt)) cr_assert(r.term[0], "step %d", t);
        if (r.term[0]) cr_assert(hit || was_hit || out || (surfaced && divers == 0), "step %d", t);
        deaths += r.term[0];
        pickups += count_cells(o, 8) > divers;
        if (count_cells(o, 8) > 0) debt = 0;
        float bonus = 0.0f;
        if (surfaced && divers > 0) {
            surfacings++;
            cr_assert_eq(count_cells(o, 8), divers == 6 ? 0 : divers - 1);
            cr_assert_eq(count_cells(o, 7), 10, "oxygen refilled");
            if (divers == 6) bonus = (float)count_cells(before, 7), debt = 1;
        }
        if (r.term[0]) oxygen = 200, debt = 0;
        float kills = r.rew[0] - bonus;
        cr_assert(kills >= 0.0f && kills == (float)(int)kills, "reward %g", r.rew[0]);
        if (kills > 0.0f) {
            shots += (int)kills;
            cr_assert_leq(count_cells(o, 2), count_cells(before, 2) + 1 - (int)kills, "each hit uses a bullet");
        }
    }
    cr_assert_gt(pickups, 5);
    cr_assert_gt(surfacings, 3);
    cr_assert_gt(shots, 20);
    cr_assert_gt(deaths, 20);
    rig_free(&r);
}

/* Space Invaders under a policy that fires while drifting randomly: every alien carries exactly
 * one direction channel, the same for all; a reward of k removes exactly k aliens (or clears the
 * wave, which comes back whole: 4 rows of 6); an enemy bullet or an alien on the cannon's cell ends
 * the episode, and a step that ends it shows one of them or an alien in the bottom row (before or
 * after the step: the block may have moved off the cannon, or stepped down from row 9). */
Test(minatar, space_invaders_kills_waves_and_hits) {
    const int N = 4;
    rig r;
    rig_init(&r, "minatar/space_invaders", N, 2, -1.0);
    int kills = 0, deaths = 0;
    for (int t = 0; t < 50000; t++) {
        rig_step_random(&r, 1);
        for (int i = 0; i < N; i++) {
            const float *o = rig_ended(&r, i), *b = rig_before(&r, i);
            int aliens = count_cells(o, 1), left = count_cells(o, 2), right = count_cells(o, 3);
            cr_assert(left == aliens || right == aliens, "one direction for the block");
            cr_assert_eq(left + right, aliens, "one direction channel per alien");
            for (int k = 0; k < 100; k++)
                if (o[100 + k] != 0.0f) cr_assert(o[200 + k] != 0.0f || o[300 + k] != 0.0f);
            int c = find_cell(o, 0);
            cr_assert_eq(c / 10, 9, "the cannon is on the bottom row");
            int hit = o[500 + c] != 0.0f || o[100 + c] != 0.0f, landed = 0;
            for (int x = 0; x < 10; x++) landed |= o[100 + 90 + x] != 0.0f || b[100 + 90 + x] != 0.0f;
            if (hit) cr_assert(r.term[i], "a bullet or an alien on the cannon ends the episode");
            if (r.term[i]) cr_assert(hit || landed, "terminal only when shot or landed");
            deaths += r.term[i];
            int k = (int)r.rew[i];
            cr_assert_eq(r.rew[i], (float)k);
            kills += k;
            if (count_cells(b, 1) - k == 0) {
                cr_assert_eq(aliens, 24, "a new wave of 4 x 6");
            } else {
                cr_assert_eq(aliens, count_cells(b, 1) - k, "a reward of %d removes %d aliens", k, k);
            }
        }
    }
    cr_assert_gt(kills, 100);
    cr_assert_gt(deaths, 20);
    rig_free(&r);
}

/* Asterix difficulty ramping, seen through the trail channel (a new trail cell appears when an
 * object moves): objects move on frames 6, 11, 16, ... of an episode (a move timer of 5 counted
 * down every frame); with ramping off always; with it on the move interval first drops at the
 * second rise (frame 204), so the first move off that beat is on frame 210 and later ones follow.
 * Returns the moves off the beat; *early counts those before frame 210. */
static long asterix_off_beat_moves(int ramping, long *moves, long *early) {
    sm_env_opts o = sm_env_opts_default();
    o.ramping = ramping;
    rig r;
    rig_init_opts(&r, "minatar/asterix", 8, 31, &o);
    int frame[8] = {0};
    long off = 0;
    *moves = 0;
    *early = 0;
    for (int t = 0; t < 20000; t++) {
        rig_step_random(&r, 0);
        for (int i = 0; i < r.N; i++) {
            frame[i]++;
            if (r.term[i]) {
                frame[i] = 0;
                continue;
            }
            const float *o = r.obs + i * r.D, *b = rig_before(&r, i);
            int moved = 0;
            for (int k = 200; k < 300; k++) moved |= o[k] != 0.0f && b[k] == 0.0f;
            *moves += moved;
            off += moved && frame[i] % 5 != 1;
            *early += moved && frame[i] % 5 != 1 && frame[i] < 210;
        }
    }
    rig_free(&r);
    return off;
}

Test(minatar, asterix_ramping_speeds_objects_up) {
    long moves, early;
    cr_assert_eq(asterix_off_beat_moves(0, &moves, &early), 0, "without ramping objects move on frames 6, 11, ...");
    cr_assert_gt(moves, 1000);
    cr_assert_gt(asterix_off_beat_moves(1, &moves, &early), 20, "with ramping they speed up");
    cr_assert_eq(early, 0, "not before frame 210");
}

/* Asterix without ramping, a player standing still: nothing for 10 frames, the first object on
 * frame 11, and new objects only on frames 11, 21, 31, ... (a spawn timer of 10 counted down every
 * frame). The player starts at row 5, column 5. */
Test(minatar, asterix_spawns_on_frames_11_21_31) {
    sm_env_opts o = sm_env_opts_default();
    o.sticky = 0.0;
    o.ramping = 0;
    rig r;
    rig_init_opts(&r, "minatar/asterix", 8, 41, &o);
    for (int i = 0; i < r.N; i++) cr_assert_eq(find_cell(r.obs + i * r.D, 0), 55);
    int frame[8] = {0};
    long spawns = 0, firsts = 0;
    for (int t = 0; t < 5000; t++) {
        for (int i = 0; i < r.N; i++) r.act[i] = NOOP;
        rig_step(&r);
        for (int i = 0; i < r.N; i++) {
            frame[i]++;
            const float *o = rig_ended(&r, i), *b = rig_before(&r, i);
            int now = count_cells(o, 1) + count_cells(o, 3), was = count_cells(b, 1) + count_cells(b, 3);
            if (frame[i] <= 10) cr_assert_eq(now, 0, "frame %d: nothing yet", frame[i]);
            if (frame[i] == 11) {
                cr_assert_eq(now, 1, "the first object on frame 11");
                firsts++;
            }
            if (now > was) {
                cr_assert_eq(frame[i] % 10, 1, "an object appeared on frame %d", frame[i]);
                spawns++;
            }
            if (r.term[i]) frame[i] = 0;
        }
    }
    cr_assert_gt(firsts, 20);
    cr_assert_gt(spawns, 100);
    rig_free(&r);
}

/* Space Invaders, the block's pace: between two moves of the block there are min(aliens at the
 * first move, I) frames, where I is 12 for the first wave and, with ramping, one less for each wave
 * cleared in the episode (down to 6); without ramping always 12. A lookahead player clears waves;
 * the block keeps its direction and its move timer across a new wave. Returns the gaps checked in
 * the second wave or later with at least I aliens (a gap of exactly I). */
static int si_block_pace(int ramping) {
    sm_env_opts o = sm_env_opts_default();
    o.sticky = 0.0;
    o.ramping = ramping;
    rig r;
    rig_init_opts(&r, "minatar/space_invaders", 1, 3, &o);
    int frame = 0, wave = 1, last_move = -1, last_pace = 0, full_gaps = 0;
    for (int t = 0; t < 20000 && full_gaps < 3; t++) {
        r.act[0] = lookahead(&r, 40, 1, aim_policy);
        rig_step(&r);
        frame++;
        if (r.term[0]) {
            frame = 0, wave = 1, last_move = -1;
            continue;
        }
        int before = count_cells(r.before, 1), k = (int)r.rew[0];
        int interval = ramping ? (12 - (wave - 1) > 6 ? 12 - (wave - 1) : 6) : 12;
        if (k > 0 && before == k) { /* cleared: a new wave stands; a move this frame is not seen */
            wave++;
            last_move = -1;
            cr_assert_eq(count_cells(r.obs, 1), 24);
            int dir_kept = (r.before[200 + find_cell(r.before, 1)] != 0.0f) == (r.obs[200 + find_cell(r.obs, 1)] != 0.0f);
            cr_assert(dir_kept, "the new wave keeps the block's direction");
            continue;
        }
        int moved = 0;
        for (int c = 0; c < 100; c++) moved |= r.obs[100 + c] != 0.0f && r.before[100 + c] == 0.0f;
        if (!moved) continue;
        if (last_move >= 0) {
            cr_assert_eq(frame - last_move, last_pace, "wave %d frame %d: moves %d frames apart", wave, frame, last_pace);
            full_gaps += wave >= 2 && last_pace == interval;
        }
        last_move = frame;
        last_pace = before < interval ? before : interval;
    }
    rig_free(&r);
    return full_gaps;
}

Test(minatar, space_invaders_waves_speed_up_with_ramping) {
    cr_assert_geq(si_block_pace(1), 3);
    cr_assert_geq(si_block_pace(0), 3);
}

/* Space Invaders from reset, the cannon standing still in column 5: the block (4 x 6, rows 0-3,
 * columns 2-7, heading left) first moves on frame 13; the aliens' first shot comes on frame 11,
 * from the lowest alien of the nearest column (row 3, column 5), and the bullet starts on that
 * alien's cell, falling one row a frame from then on. */
Test(minatar, space_invaders_first_move_on_frame_13_first_shot_on_frame_11) {
    rig r;
    rig_init(&r, "minatar/space_invaders", 1, 5, 0.0);
    cr_assert_eq(count_cells(r.obs, 1), 24);
    cr_assert_eq(count_cells(r.obs, 2), 24, "heading left");
    cr_assert_eq(find_cell(r.obs, 1), 2);
    cr_assert_eq(find_cell(r.obs, 0), 95);
    for (int t = 1; t <= 14; t++) {
        r.act[0] = NOOP;
        rig_step(&r);
        cr_assert_eq(r.term[0], 0);
        int moved = memcmp(r.obs + 100, r.before + 100, sizeof(float) * 100) != 0;
        cr_assert_eq(moved, t == 13, "frame %d", t);
        int shot = find_cell(r.obs, 5);
        cr_assert_eq(count_cells(r.obs, 5), t >= 11, "frame %d", t);
        if (t >= 11) cr_assert_eq(shot, 35 + 10 * (t - 11), "frame %d: the bullet at %d", t, shot);
    }
    cr_assert_eq(find_cell(r.obs, 1), 1, "the block moved left");
    rig_free(&r);
}

/* Freeway at reset: all eight cars in column 0 (one per lane, rows 1-8); the chicken in row 9,
 * column 4, cannot move during an episode's first 3 frames and climbs on the 4th. */
Test(minatar, freeway_cars_start_in_column_0_and_the_chicken_waits_3_frames) {
    rig r;
    rig_init(&r, "minatar/freeway", 1, 9, 0.0);
    for (int ep = 0; ep < 3; ep++) {
        for (int y = 1; y <= 8; y++) cr_assert_eq(row_cell(r.obs, 1, y), 0, "episode %d: the car of row %d", ep, y);
        cr_assert_eq(count_cells(r.obs, 1), 8);
        cr_assert_eq(find_cell(r.obs, 0), 94);
        r.act[0] = UP;
        for (int t = 1; t <= 3; t++) {
            sm_vecenv_step(&r.v);
            cr_assert_eq(find_cell(r.obs, 0), 94, "frame %d: no move yet", t);
        }
        sm_vecenv_step(&r.v);
        cr_assert_eq(find_cell(r.obs, 0), 84, "the first move on frame 4");
        r.act[0] = NOOP;
        for (int t = 5; t <= 2501; t++) {
            sm_vecenv_step(&r.v);
            cr_assert_eq(r.term[0], t == 2501);
        }
    }
    rig_free(&r);
}

/* Freeway: a car whose trail is in channel speed s moves one column once every s + 1 frames, on
 * frames s + 1, 2 (s + 1), ... of an episode (a chicken that never moves keeps the speeds), in its
 * own direction (the trail is behind it): over 16 episodes every lane is seen going both ways. */
Test(minatar, freeway_car_of_speed_s_moves_every_s_plus_1_frames) {
    rig r;
    rig_init(&r, "minatar/freeway", 1, 10, 0.0);
    int seen[8][2] = {{0}}, speeds[6] = {0};
    for (int ep = 0; ep < 16; ep++) {
        int speed[8], dir[8];
        for (int l = 0; l < 8; l++) {
            int y = l + 1, trail = -1;
            speed[l] = 0;
            for (int s = 1; s <= 5; s++)
                if ((trail = row_cell(r.obs, 1 + s, y)) >= 0) {
                    speed[l] = s;
                    break;
                }
            cr_assert_gt(speed[l], 0, "a trail in one speed channel");
            dir[l] = trail == 9 ? 1 : -1; /* the car is in column 0: the trail is at 9 or at 1 */
            seen[l][dir[l] > 0]++;
            speeds[speed[l]]++;
        }
        r.act[0] = NOOP;
        for (int t = 1; t <= 2501; t++) {
            rig_step(&r);
            const float *o = rig_ended(&r, 0);
            for (int l = 0; l < 8; l++) {
                int x0 = row_cell(r.before, 1, l + 1), x1 = row_cell(o, 1, l + 1);
                int due = t % (speed[l] + 1) == 0;
                cr_assert_eq(x1, due ? (x0 + dir[l] + 10) % 10 : x0, "episode %d frame %d lane %d speed %d", ep, t, l, speed[l]);
            }
            cr_assert_eq(r.term[0], t == 2501);
        }
    }
    for (int l = 0; l < 8; l++) cr_assert(seen[l][0] && seen[l][1], "lane %d goes both ways", l);
    for (int s = 1; s <= 5; s++) cr_assert_gt(speeds[s], 0, "speed %d drawn", s);
    rig_free(&r);
}

/* Sticky actions carry over an episode's reset (the reference wrapper keeps its last action): in
 * Breakout with p = 0.5, choosing no-op on an episode's first step, the paddle (column 4) moves in
 * about half the episodes, always the way the previous episode's last executed action went. */
Test(minatar, sticky_action_carries_over_the_reset) {
    rig r;
    rig_init(&r, "minatar/breakout", 4, 13, 0.5);
    int first[4] = {0, 0, 0, 0}, last_exec[4] = {-1, -1, -1, -1};
    long n = 0, repeated = 0;
    for (int t = 0; t < 40000; t++) {
        for (int i = 0; i < 4; i++) r.act[i] = first[i] ? NOOP : sm_rng_below(&r.rng, 2) ? LEFT : RIGHT;
        rig_step(&r);
        for (int i = 0; i < 4; i++) {
            const float *b = rig_before(&r, i), *o = rig_ended(&r, i);
            int p0 = find_cell(b, 0) % 10, d = find_cell(o, 0) % 10 - p0;
            if (first[i] && last_exec[i] >= 0) {
                cr_assert(d == 0 || (d < 0 ? LEFT : RIGHT) == last_exec[i], "the first step repeats the last action");
                n++;
                repeated += d != 0;
            }
            first[i] = r.term[i];
            if (r.term[i]) /* the executed action of the episode's last step, if the walls show it */
                last_exec[i] = p0 > 0 && p0 < 9 && d != 0 ? (d < 0 ? LEFT : RIGHT) : -1;
        }
    }
    cr_assert_gt(n, 1000);
    double f = (double)repeated / (double)n, sd = sqrt(0.25 / (double)n);
    cr_assert(fabs(f - 0.5) < 5 * sd, "repeat frequency %.4f over %ld first steps", f, n);
    rig_free(&r);
}
