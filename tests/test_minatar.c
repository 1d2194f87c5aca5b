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

/* Breakout: a paddle that follows the ball returns it; the first brick the ball hits gives +1 and
 * exactly that brick (next to the ball) disappears; no step without reward removes a brick. */
Test(minatar, breakout_brick_gives_one_and_disappears) {
    rig r;
    rig_init(&r, "minatar/breakout", 1, 21, 0.0);
    int hits = 0;
    for (int t = 0; t < 3000 && hits < 5; t++) {
        r.act[0] = follow_ball(r.obs);
        rig_step(&r);
        const float *before = r.before;
        if (r.term[0]) continue;
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
        int b = find_cell(r.obs, 1);
        cr_assert_leq(abs(b / 10 - where / 10), 1, "the brick broken is next to the ball");
        cr_assert_leq(abs(b % 10 - where % 10), 1, "the brick broken is next to the ball");
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

/* Breakout: a lookahead player clears the wall; the 30th brick gives +1 like the others and a new
 * wall of three rows appears at once. */
Test(minatar, breakout_cleared_wall_is_replaced) {
    rig r;
    rig_init(&r, "minatar/breakout", 1, 21, 0.0);
    double episode_return = 0;
    int replaced = 0;
    for (int t = 0; t < 5000 && !replaced; t++) {
        r.act[0] = lookahead(&r, 300, 1, follow_policy);
        rig_step(&r);
        episode_return = r.term[0] ? 0.0 : episode_return + r.rew[0];
        if (!r.term[0] && r.rew[0] > 0.0f && count_cells(r.before, 3) == 1) {
            cr_assert_eq(r.rew[0], 1.0f);
            cr_assert_geq(count_cells(r.obs, 3), 29, "a new wall (less the ball's cell)");
            cr_assert_eq(episode_return, 30.0, "one point per brick");
            replaced = 1;
        }
    }
    cr_assert(replaced, "the wall was cleared and replaced");
    rig_free(&r);
}

/* Seaquest: a lookahead player fills the boat; surfacing with 6 divers empties it, refills the
 * oxygen and scores one point per lit oxygen cell at that moment. */
Test(minatar, seaquest_six_divers_score_the_oxygen_left) {
    rig r;
    rig_init(&r, "minatar/seaquest", 1, 1, 0.0);
    int full = 0;
    for (int t = 0; t < 20000 && !full; t++) {
        r.act[0] = lookahead(&r, 40, 8, random_policy);
        rig_step(&r);
        if (!r.term[0] && count_cells(r.before, 8) == 6 && find_cell(r.obs, 0) / 10 == 0) {
            cr_assert_eq(count_cells(r.obs, 8), 0, "the boat is emptied");
            cr_assert_eq(count_cells(r.obs, 7), 10, "oxygen refilled");
            cr_assert_eq(r.rew[0], (float)count_cells(r.before, 7), "one point per oxygen cell");
            full = 1;
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
            if (r.term[i]) { /* auto-reset: the next episode starts from a no-op */
                prev[i] = NOOP;
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

/* Freeway: every episode is exactly 2500 frames and ends as a terminal (not a truncation). */
Test(minatar, freeway_ends_at_2500_frames_as_terminal) {
    rig r;
    rig_init(&r, "minatar/freeway", 2, 8, -1.0);
    for (int ep = 0; ep < 3; ep++)
        for (int t = 1; t <= 2500; t++) {
            rig_step_random(&r, 0);
            for (int i = 0; i < 2; i++) {
                cr_assert_eq(r.term[i], t == 2500, "episode %d frame %d env %d", ep, t, i);
                cr_assert_eq(r.trunc[i], 0);
            }
        }
    sm_env_log l = sm_vecenv_log_take(&r.v);
    cr_assert_eq(l.n, 6);
    cr_assert_eq(l.episode_length, 6 * 2500.0);
    rig_free(&r);
}

/* Freeway: a chicken that always goes up climbs at most one row every 3 frames, never moves
 * sideways, scores +1 exactly when it steps from row 1 onto the top, and is then back in row 9. */
Test(minatar, freeway_crossing_scores_and_returns_to_the_bottom) {
    rig r;
    rig_init(&r, "minatar/freeway", 1, 4, 0.0);
    r.act[0] = UP;
    int last_climb = -100, crossings = 0;
    for (int t = 0; t < 2499; t++) {
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

/* Asterix under a random policy: a step ends the episode exactly when an enemy is on the player's
 * cell; +1 only when gold was on (or next to, and moving onto) the player's new cell, or entered at
 * the edge this step, and that gold is gone. */
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
            cr_assert_eq(r.term[i], o[100 + p] == 1.0f, "terminal iff an enemy is on the player");
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

/* Seaquest: oxygen runs down one unit a frame, on the surface too: a submarine that waits there
 * sees its gauge (10 cells, ceil(oxygen / 20)) fall and the episode end at frame 200; diving and
 * coming straight back up with no diver ends it at once. */
Test(minatar, seaquest_oxygen_runs_out_and_surfacing_empty_ends) {
    rig r;
    rig_init(&r, "minatar/seaquest", 1, 12, 0.0);
    cr_assert_eq(count_cells(r.obs, 7), 10, "full oxygen");
    cr_assert_eq(count_cells(r.obs, 8), 0, "no diver");
    int t;
    for (t = 1; t <= 300; t++) {
        int before = count_cells(r.obs, 7);
        r.act[0] = NOOP;
        sm_vecenv_step(&r.v);
        if (r.term[0]) break;
        cr_assert_eq(count_cells(r.obs, 7), (200 - t + 19) / 20, "frame %d", t);
        cr_assert_leq(count_cells(r.obs, 7), before);
    }
    cr_assert_eq(t, 200, "oxygen lasts 200 frames");
    cr_assert_eq(count_cells(r.fin, 7), 0);
    r.act[0] = DOWN;
    sm_vecenv_step(&r.v);
    cr_assert_eq(find_cell(r.obs, 0) / 10, 1);
    cr_assert_eq(r.term[0], 0);
    r.act[0] = UP;
    sm_vecenv_step(&r.v);
    cr_assert_eq(r.term[0], 1, "surfacing with no diver ends the episode");
    cr_assert_eq(find_cell(r.fin, 0) / 10, 0);
    cr_assert_eq(count_cells(r.fin, 7), 10, "with oxygen to spare");
    rig_free(&r);
}

/* Seaquest: a submarine that chases divers and then surfaces. Every surfacing with k = 1..5 divers
 * keeps k - 1 and refills the oxygen; with 6 it gives one point per lit oxygen cell and empties the
 * boat. Every step: terminal iff the front meets a fish, a submarine or an enemy bullet, the oxygen
 * is out, or the boat surfaced empty; any other reward is +1 per enemy shot, each costing a bullet. */
Test(minatar, seaquest_divers_surfacing_and_hits) {
    rig r;
    rig_init(&r, "minatar/seaquest", 1, 3, 0.0);
    int surfacings = 0, pickups = 0, shots = 0, deaths = 0;
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
        int out = count_cells(o, 7) == 0;
        cr_assert_eq(r.term[0], hit || out || (surfaced && divers == 0), "step %d", t);
        deaths += r.term[0];
        pickups += count_cells(o, 8) > divers;
        float bonus = 0.0f;
        if (surfaced && divers > 0) {
            surfacings++;
            cr_assert_eq(count_cells(o, 8), divers == 6 ? 0 : divers - 1);
            cr_assert_eq(count_cells(o, 7), 10, "oxygen refilled");
            if (divers == 6) bonus = (float)count_cells(before, 7);
        }
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
 * wave, which comes back whole: 4 rows of 6); terminal iff an enemy bullet is on the cannon or an
 * alien has reached the bottom row. */
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
            int hit = o[500 + c] != 0.0f, landed = 0;
            for (int x = 0; x < 10; x++) landed |= o[100 + 90 + x] != 0.0f;
            cr_assert_eq(r.term[i], hit || landed, "terminal iff shot or landed");
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

/* Asterix difficulty ramping, seen through the trail channel (a new trail cell appears exactly when
 * an object moves): with ramping off, objects move only on every 5th frame of an episode; with it
 * on, the interval shrinks after 100 frames, so moves come on other frames too. */
static long asterix_off_beat_moves(int ramping, long *moves) {
    sm_env_opts o = sm_env_opts_default();
    o.ramping = ramping;
    rig r;
    rig_init_opts(&r, "minatar/asterix", 8, 31, &o);
    int frame[8] = {0};
    long off = 0;
    *moves = 0;
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
            off += moved && frame[i] % 5 != 0;
        }
    }
    rig_free(&r);
    return off;
}

Test(minatar, asterix_ramping_speeds_objects_up) {
    long moves;
    cr_assert_eq(asterix_off_beat_moves(0, &moves), 0, "without ramping objects move every 5 frames");
    cr_assert_gt(moves, 1000);
    cr_assert_gt(asterix_off_beat_moves(1, &moves), 100, "with ramping they speed up");
}

/* Space Invaders ramping: a lookahead player clears a wave; the next wave's block first moves 11
 * frames after it appears with ramping (one frame faster than the 12 of the first wave), 12 without. */
static int si_second_wave_first_move(int ramping) {
    sm_env_opts o = sm_env_opts_default();
    o.sticky = 0.0;
    o.ramping = ramping;
    rig r;
    rig_init_opts(&r, "minatar/space_invaders", 1, 3, &o);
    int since = -1;
    for (int t = 0; t < 20000; t++) {
        r.act[0] = lookahead(&r, 30, 8, random_policy);
        rig_step(&r);
        if (r.term[0]) {
            since = -1;
            continue;
        }
        int before = count_cells(r.before, 1), k = (int)r.rew[0];
        if (since < 0) {
            if (k > 0 && before == k) since = 0; /* the wave was cleared: a new one stands */
            continue;
        }
        since++;
        int moved = 0;
        for (int c = 0; c < 100; c++) moved |= r.obs[100 + c] != 0.0f && r.before[100 + c] == 0.0f;
        if (moved) {
            rig_free(&r);
            return since;
        }
    }
    rig_free(&r);
    return -1;
}

Test(minatar, space_invaders_waves_speed_up_with_ramping) {
    cr_assert_eq(si_second_wave_first_move(1), 11);
    cr_assert_eq(si_second_wave_first_move(0), 12);
}
