/* Replay buffer and sum tree: property tests of the tree against brute force, sampling frequencies,
 * n-step targets against a hand computation, truncation vs termination, wrap-around. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/rl/replay.h"

Test(sumtree, sums_and_find_match_brute_force) {
    sm_rng g;
    sm_rng_seed(&g, 3);
    for (int n = 1; n <= 37; n += 4) {
        sm_sumtree s;
        cr_assert_eq(sm_sumtree_init(&s, n, NULL), SM_OK);
        double *p = calloc((size_t)n, sizeof *p);
        for (int it = 0; it < 400; it++) {
            int i = (int)sm_rng_below(&g, (uint32_t)n);
            p[i] = sm_rng_uniform(&g) < 0.2 ? 0.0 : sm_rng_uniform(&g) * 5;
            sm_sumtree_set(&s, i, p[i]);
            double tot = 0;
            for (int k = 0; k < n; k++) tot += p[k];
            cr_assert(fabs(sm_sumtree_total(&s) - tot) <= 1e-9 * (1 + tot), "total");
            if (tot == 0) continue;
            double u = sm_rng_uniform(&g) * tot;
            long leaf = sm_sumtree_find(&s, u);
            /* brute force: the leaf whose prefix interval holds u */
            double pre = 0;
            int want = -1;
            for (int k = 0; k < n; k++) {
                if (p[k] > 0 && u >= pre && u < pre + p[k]) want = k;
                pre += p[k];
            }
            if (want >= 0) cr_assert_eq(leaf, want, "u=%g", u);
            cr_assert_gt(p[leaf], 0, "never a zero leaf");
        }
        /* the very end of the range (rounding) still lands on a non-zero leaf */
        double tot = sm_sumtree_total(&s);
        if (tot > 0) cr_assert_gt(p[sm_sumtree_find(&s, tot)], 0);
        free(p);
        sm_sumtree_free(&s);
    }
}

Test(sumtree, sampling_frequency_is_proportional) {
    sm_sumtree s;
    const int n = 5;
    const double p[5] = {1, 0, 3, 0.5, 5.5};
    cr_assert_eq(sm_sumtree_init(&s, n, NULL), SM_OK);
    for (int i = 0; i < n; i++) sm_sumtree_set(&s, i, p[i]);
    sm_rng g;
    sm_rng_seed(&g, 9);
    long cnt[5] = {0};
    const long M = 200000;
    for (long m = 0; m < M; m++) cnt[sm_sumtree_find(&s, sm_rng_uniform(&g) * 10.0)]++;
    for (int i = 0; i < n; i++) {
        double q = p[i] / 10.0, sd = sqrt(M * q * (1 - q));
        cr_assert(fabs(cnt[i] - M * q) <= 5 * sd + 1e-9, "leaf %d: %ld draws, expected %g", i, cnt[i], M * q);
    }
    sm_sumtree_free(&s);
}

/* One environment, scalar observations o_t = t, rewards r_t = t + 1. */
static void add_steps(sm_replay *r, int from, int to, int end_at, int term) {
    for (int t = from; t < to; t++) {
        float o = (float)t, nx = (float)(t + 1), rew = (float)(t + 1);
        int a = t % 3;
        uint8_t te = (t == end_at) && term, tr = (t == end_at) && !term;
        sm_replay_add(r, &o, &a, &rew, &te, &tr, &nx);
    }
}

static void sample_row(sm_replay *r, int B, sm_replay_batch *b, float *buf) {
    b->obs = buf;
    b->next = buf + B;
    b->ret = buf + 2 * B;
    b->disc = buf + 3 * B;
    b->weight = buf + 4 * B;
    sm_rng g;
    sm_rng_seed(&g, 1);
    cr_assert_eq(sm_replay_sample(r, B, &g, 0.4, b), 0);
}

Test(replay, nstep_targets_termination_and_truncation) {
    const double gamma = 0.5;
    for (int term = 0; term <= 1; term++) {
        sm_replay r;
        cr_assert_eq(sm_replay_init(&r, 64, 1, 1, 0, 3, gamma, 0, 0, NULL), SM_OK);
        add_steps(&r, 0, 10, 4, term); /* the episode ends at t = 4 */
        cr_assert_eq(sm_replay_size(&r), 8, "10 rows, the last n-1 = 2 wait for their look-ahead");
        enum { B = 256 };
        float buf[5 * B];
        int act[B];
        long idx[B];
        sm_replay_batch b = {.act = act, .idx = idx};
        sample_row(&r, B, &b, buf);
        for (int k = 0; k < B; k++) {
            int t = (int)b.obs[k];
            cr_assert_lt(t, 8);
            cr_assert_eq(b.act[k], t % 3);
            int m = 3;
            if (t <= 4 && t + 2 >= 4) m = 4 - t + 1; /* stops at the episode's end */
            double G = 0;
            for (int j = 0; j < m; j++) G += pow(gamma, j) * (t + j + 1);
            cr_assert_float_eq(b.ret[k], G, 1e-5, "t=%d", t);
            cr_assert_float_eq(b.next[k], (float)(t + m), 1e-6, "bootstrap from next obs of t+m-1");
            double want = (term && t + m - 1 == 4) ? 0.0 : pow(gamma, m);
            cr_assert_float_eq(b.disc[k], want, 1e-6, "t=%d term=%d", t, term);
        }
        sm_replay_free(&r);
    }
}

Test(replay, wraps_around_and_keeps_the_newest) {
    sm_replay r;
    cr_assert_eq(sm_replay_init(&r, 8, 1, 1, 0, 2, 0.9, 0, 0, NULL), SM_OK);
    add_steps(&r, 0, 30, -1, 0);
    enum { B = 512 };
    float buf[5 * B];
    int act[B];
    long idx[B];
    sm_replay_batch b = {.act = act, .idx = idx};
    sample_row(&r, B, &b, buf);
    int seen[30] = {0};
    for (int k = 0; k < B; k++) {
        int t = (int)b.obs[k];
        cr_assert(t >= 22 && t <= 28, "only the 8 newest rows minus the last one: got %d", t);
        seen[t] = 1;
        cr_assert_float_eq(b.ret[k], (t + 1) + 0.9 * (t + 2), 1e-4);
    }
    for (int t = 22; t <= 28; t++) cr_assert(seen[t], "row %d sampled", t);
    sm_replay_free(&r);
}

Test(replay, binary_observations_round_trip_and_columns_stay_apart) {
    sm_replay r;
    const int N = 3, D = 4;
    cr_assert_eq(sm_replay_init(&r, 30, N, D, 1, 2, 0.99, 1, 0.6, NULL), SM_OK);
    for (int t = 0; t < 6; t++) {
        float o[12], nx[12], rew[3];
        int a[3];
        uint8_t te[3] = {0}, tr[3] = {0};
        for (int i = 0; i < N; i++) {
            for (int k = 0; k < D; k++) {
                o[i * D + k] = (float)(((t + i) >> (k % 2)) & 1);
                nx[i * D + k] = (float)(((t + 1 + i) >> (k % 2)) & 1);
            }
            rew[i] = (float)(100 * i + t);
            a[i] = i;
        }
        sm_replay_add(&r, o, a, rew, te, tr, nx);
    }
    enum { B = 64 };
    float obs[B * 4], next[B * 4], ret[B], disc[B], w[B];
    int act[B];
    long idx[B];
    sm_replay_batch b = {obs, act, ret, next, disc, idx, w, 0};
    sm_rng g;
    sm_rng_seed(&g, 2);
    cr_assert_eq(sm_replay_sample(&r, B, &g, 0.4, &b), 0);
    for (int k = 0; k < B; k++) {
        int i = act[k], t = (int)(idx[k] / N);
        cr_assert_eq(idx[k] % N, i, "column");
        cr_assert_float_eq(ret[k], (100 * i + t) + 0.99 * (100 * i + t + 1), 1e-3, "n-step stays in its column");
        for (int q = 0; q < D; q++) cr_assert_eq(obs[k * D + q], (float)(((t + i) >> (q % 2)) & 1));
        cr_assert(w[k] > 0 && w[k] <= 1.0f);
    }
    /* priorities steer sampling: one transition far above the rest is drawn most */
    float pr[1] = {1000};
    long one[1] = {idx[0]};
    sm_replay_update(&r, one, pr, 1, 1e-6);
    cr_assert_eq(sm_replay_sample(&r, B, &g, 0.4, &b), 0);
    int hits = 0;
    for (int k = 0; k < B; k++) hits += idx[k] == one[0];
    cr_assert_gt(hits, B / 2, "a priority of 1000 against ~1 takes most draws (%d of %d)", hits, B);
    sm_replay_free(&r);
}

/* Binary observations are kept as bits (obs_bytes = ceil(D / 8) per observation): every value of
 * every sampled observation and next observation comes back, for a D that is not a multiple of 8,
 * through the uniform sampler; and sm_replay_pack_bytes (old checkpoints' one byte per value) gives
 * the same bits as adding the observations. */
Test(replay, binary_observations_are_bits_and_come_back_exactly) {
    sm_replay r, r2;
    const int N = 2, D = 13, rows = 40;
    cr_assert_eq(sm_replay_init(&r, (long)rows * N, N, D, 1, 1, 0.99, 0, 0, NULL), SM_OK);
    cr_assert_eq(sm_replay_init(&r2, (long)rows * N, N, D, 1, 1, 0.99, 0, 0, NULL), SM_OK);
    cr_assert_eq(r.obs_bytes, 2);
    static float all[40][2][13], alln[40][2][13];
    static uint8_t bytes[40][2][13];
    sm_rng g;
    sm_rng_seed(&g, 5);
    for (int t = 0; t < rows; t++) {
        float rew[2] = {(float)t, (float)(1000 + t)};
        int a[2] = {0, 1};
        uint8_t te[2] = {0}, tr[2] = {0};
        for (int i = 0; i < N; i++)
            for (int k = 0; k < D; k++) {
                all[t][i][k] = sm_rng_uniform(&g) < 0.3 ? 1.0f : 0.0f;
                alln[t][i][k] = sm_rng_uniform(&g) < 0.3 ? 1.0f : 0.0f;
                bytes[t][i][k] = (uint8_t)all[t][i][k];
            }
        sm_replay_add(&r, &all[t][0][0], a, rew, te, tr, &alln[t][0][0]);
    }
    sm_replay_pack_bytes(&r2, r2.obsbits, &bytes[0][0][0], (size_t)rows * N);
    cr_assert(!memcmp(r.obsbits, r2.obsbits, (size_t)rows * N * r.obs_bytes), "packing bytes gives the stored bits");
    enum { B = 256 };
    static float obs[B * 13], next[B * 13];
    float ret[B], disc[B], w[B];
    int act[B];
    long idx[B];
    sm_replay_batch b = {obs, act, ret, next, disc, idx, w, 0};
    cr_assert_eq(sm_replay_sample(&r, B, &g, 0, &b), 0);
    for (int s = 0; s < B; s++) {
        const int t = (int)(idx[s] / N), i = (int)(idx[s] % N);
        cr_assert_eq(act[s], i);
        cr_assert_float_eq(ret[s], (float)(1000 * i + t), 1e-6);
        for (int k = 0; k < D; k++) {
            cr_assert_eq(obs[s * D + k], all[t][i][k], "obs value %d of transition (%d, %d)", k, t, i);
            cr_assert_eq(next[s * D + k], alln[t][i][k], "next value %d of transition (%d, %d)", k, t, i);
        }
    }
    sm_replay_free(&r);
    sm_replay_free(&r2);
}

/* Prioritised replay over a ring that has wrapped (8 rows, 3-step returns, 30 rows written):
 *  - only rows with their whole look-ahead written are sampled (the 8 newest minus the last 2);
 *  - importance weights are (size P)^-beta over the batch maximum (Schaul et al. Sec. 3.4);
 *  - a row that becomes sampleable enters at the largest priority seen so far. */
Test(replay, prioritised_wraps_weights_and_new_rows_at_max_priority) {
    const double alpha = 0.5, beta = 0.5;
    sm_replay r;
    cr_assert_eq(sm_replay_init(&r, 8, 1, 1, 0, 3, 0.9, 1, alpha, NULL), SM_OK);
    add_steps(&r, 0, 30, -1, 0);
    cr_assert_eq(sm_replay_size(&r), 6);
    /* known priorities for the six sampleable rows (observations 22..27 sit at rows 22 % 8 ..) */
    long idx[6];
    float prio[6];
    for (int k = 0; k < 6; k++) idx[k] = (22 + k) % 8, prio[k] = (float)(k + 1);
    sm_replay_update(&r, idx, prio, 6, 0);
    double total = 0;
    for (int k = 0; k < 6; k++) total += pow(k + 1, alpha);
    cr_assert_float_eq(sm_sumtree_total(&r.tree), total, 1e-9, "the two rows still waiting hold no mass");
    enum { B = 256 };
    float buf[5 * B];
    int act[B];
    long bidx[B];
    sm_replay_batch b = {.act = act, .idx = bidx, .obs = buf, .next = buf + B, .ret = buf + 2 * B, .disc = buf + 3 * B,
                         .weight = buf + 4 * B};
    sm_rng g;
    sm_rng_seed(&g, 3);
    cr_assert_eq(sm_replay_sample(&r, B, &g, beta, &b), 0);
    /* the smallest priority gives the largest weight: (6 P_min)^-beta is the batch maximum when sampled */
    double wmax = 0;
    for (int k = 0; k < B; k++) {
        int t = (int)b.obs[k];
        cr_assert(t >= 22 && t <= 27, "row of observation %d sampled: its look-ahead is not written", t);
        cr_assert_float_eq(b.ret[k], (t + 1) + 0.9 * (t + 2) + 0.81 * (t + 3), 1e-3);
        double w = pow(6 * pow(t - 21, alpha) / total, -beta);
        wmax = w > wmax ? w : wmax;
    }
    for (int k = 0; k < B; k++) {
        int t = (int)b.obs[k];
        double w = pow(6 * pow(t - 21, alpha) / total, -beta) / wmax;
        cr_assert_float_eq(b.weight[k], w, 1e-5, "weight of observation %d", t);
    }
    cr_assert_float_eq(b.wmax, wmax, 1e-6 * wmax);
    /* one more row: the row of observation 28 gets its look-ahead and enters at the maximum priority 6 */
    add_steps(&r, 30, 31, -1, 0);
    cr_assert_float_eq(sm_sumtree_get(&r.tree, 28 % 8), pow(6, alpha), 1e-9);
    cr_assert_float_eq(sm_sumtree_get(&r.tree, 22 % 8), 0, 0, "the overwritten row of observation 22 left the tree");
    sm_replay_free(&r);
}
