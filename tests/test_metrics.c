/* The routing-collapse rule (src/nn/metrics.c): an expert is collapsed when its share of the tokens
 * is below min(1%, 0.1 / E) - GrMoE's 1% for E <= 10, a tenth of the fair share for more experts.
 * Routes are built by hand (top-1, one-hot probabilities) and go through sm_routing_stats_add. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "specmoe.h"

/* Summary of T top-1 tokens where expert e receives count[e] of them (sum count = T). */
static void summarize_top1(const int *count, int E, sm_routing_summary *out) {
    int T = 0;
    for (int e = 0; e < E; e++) T += count[e];
    sm_real *probs = calloc((size_t)T * E, sizeof *probs);
    int *load = malloc(sizeof(int) * (size_t)E);
    cr_assert(probs && load);
    for (int e = 0, t = 0; e < E; e++) {
        load[e] = count[e];
        for (int j = 0; j < count[e]; j++, t++) probs[(size_t)t * E + e] = 1;
    }
    sm_route r = {.kind = SM_ROUTE_SPARSE, .T = T, .E = E, .n_assign = T, .probs = probs, .load = load};
    sm_routing_stats s;
    sm_routing_stats_reset(&s, E, 1);
    sm_routing_stats_add(&s, &r);
    sm_routing_summarize(&s, out);
    free(probs);
    free(load);
}

Test(metrics, threshold_is_min_of_1pct_and_tenth_of_fair_share) {
    cr_assert_float_eq(sm_collapse_threshold(2), 0.01, 1e-15);
    cr_assert_float_eq(sm_collapse_threshold(8), 0.01, 1e-15);
    cr_assert_float_eq(sm_collapse_threshold(10), 0.01, 1e-15);
    cr_assert_float_eq(sm_collapse_threshold(128), 0.1 / 128, 1e-15);
}

/* uniform routing over 128 experts: 0.78% each, under 1%, yet perfectly balanced */
Test(metrics, uniform_over_128_experts_is_not_collapsed) {
    enum { E = 128 };
    int count[E];
    for (int e = 0; e < E; e++) count[e] = 50;
    sm_routing_summary s;
    summarize_top1(count, E, &s);
    cr_assert_eq(s.collapsed, 0, "uniform routing over %d experts flagged as collapsed", E);
    cr_assert_eq(s.n_collapsed, 0);
    cr_assert_float_eq(s.min_share, 1.0 / E, 1e-12);
}

/* 8 experts, expert 3 gets 5 of 10000 tokens (0.05%) */
Test(metrics, one_starved_expert_of_8_is_collapsed) {
    int count[8] = {1430, 1430, 1430, 5, 1430, 1425, 1425, 1425};
    sm_routing_summary s;
    summarize_top1(count, 8, &s);
    cr_assert_eq(s.collapsed, 1);
    cr_assert_eq(s.n_collapsed, 1);
    cr_assert_eq(s.min_expert, 3);
    cr_assert_float_eq(s.min_share, 0.0005, 1e-12);
}

/* small E keeps the absolute 1%: 0.9% is collapsed, 1.1% is not */
Test(metrics, small_e_uses_1pct) {
    int low[4] = {90, 3310, 3300, 3300}, ok[4] = {110, 3300, 3290, 3300};
    sm_routing_summary s;
    summarize_top1(low, 4, &s);
    cr_assert_eq(s.collapsed, 1);
    summarize_top1(ok, 4, &s);
    cr_assert_eq(s.collapsed, 0);
    cr_assert_eq(s.min_expert, 0);
}

/* large E still catches a starved expert: 128 experts, one at 0.05% (< 0.078%) */
Test(metrics, starved_expert_of_128_is_collapsed) {
    enum { E = 128 };
    int count[E];
    for (int e = 0; e < E; e++) count[e] = 100;
    count[77] = 6; /* 6 / 12706 = 0.047% */
    sm_routing_summary s;
    summarize_top1(count, E, &s);
    cr_assert_eq(s.collapsed, 1);
    cr_assert_eq(s.n_collapsed, 1);
    cr_assert_eq(s.min_expert, 77);
}

/* Dormant neurons (Sokar et al. 2023): unit scores by hand. h (N=2, H=4): mean |h| per unit
 * 1, 3, 0, 0.2; layer mean 1.05; scores 0.952, 2.857, 0, 0.190: at tau 0.1 one unit (the silent one)
 * is dormant, at tau 0.25 two, at tau 1 three. */
Test(metrics, dormant_neurons_by_definition) {
    const sm_real h[8] = {1, -3, 0, 0.1f, -1, 3, 0, -0.3f};
    double score[4];
    cr_expect_float_eq(sm_dormant_fraction(h, 2, 4, 0.1, score), 0.25, 1e-12);
    cr_expect_float_eq(score[0], 1.0 / 1.05, 1e-6);
    cr_expect_float_eq(score[1], 3.0 / 1.05, 1e-6);
    cr_expect_float_eq(score[2], 0.0, 1e-12);
    cr_expect_float_eq(score[3], 0.2 / 1.05, 1e-6);
    cr_expect_float_eq(sm_dormant_fraction(h, 2, 4, 0.25, NULL), 0.5, 1e-12);
    cr_expect_float_eq(sm_dormant_fraction(h, 2, 4, 1.0, NULL), 0.75, 1e-12);
    const sm_real zero[6] = {0};
    cr_expect_float_eq(sm_dormant_fraction(zero, 2, 3, 0.1, NULL), 1.0, 1e-12);
    cr_expect_float_eq(sm_dormant_fraction(h, 0, 4, 0.1, NULL), 0.0, 1e-12);
}

/* SoftMoE's routing sharpness (sm_route_soft_sharpness): entropies over the support, divided by its
 * log. Two groups of 3 tokens, S = 2 experts x 2 slots = 4 slots, built by hand. */
Test(metrics, soft_sharpness_is_one_when_uniform_and_zero_when_one_hot) {
    enum { T = 6, S = 4, M = 3 };
    sm_real comb[T * S], disp[T * S];
    sm_route r = {.kind = SM_ROUTE_SOFT, .T = T, .E = 2, .groups = 2, .group_size = M, .slots = 2,
                  .combine = comb, .dispatch = disp};
    for (int i = 0; i < T * S; i++) comb[i] = (sm_real)(1.0 / S), disp[i] = (sm_real)(1.0 / M);
    double cs = 0, ds = 0;
    long cn = 0, dn = 0;
    sm_route_soft_sharpness(&r, &cs, &cn, &ds, &dn);
    cr_assert_eq(cn, T);
    cr_assert_eq(dn, 2 * S); /* every slot of each group */
    cr_assert_float_eq(cs / cn, 1.0, 1e-6);
    cr_assert_float_eq(ds / dn, 1.0, 1e-6);
    /* one-hot: token t takes slot t % S, slot s takes the group's token s % M */
    for (int t = 0; t < T; t++)
        for (int s = 0; s < S; s++) {
            comb[t * S + s] = s == t % S;
            disp[t * S + s] = s % M == t % M;
        }
    cs = ds = 0;
    cn = dn = 0;
    sm_route_soft_sharpness(&r, &cs, &cn, &ds, &dn);
    cr_assert_float_eq(cs, 0.0, 1e-12);
    cr_assert_float_eq(ds, 0.0, 1e-12);
    /* half the mass on each of two slots: log 2 / log 4 = 1/2; accumulates onto the sums */
    for (int t = 0; t < T; t++)
        for (int s = 0; s < S; s++) comb[t * S + s] = (sm_real)(s < 2 ? 0.5 : 0);
    sm_route_soft_sharpness(&r, &cs, &cn, &ds, &dn);
    cr_assert_eq(cn, 2 * T);
    cr_assert_float_eq(cs / T, 0.5, 1e-6);
    /* a ragged last group: 5 tokens in groups of 3 and 2, uniform dispatch over each group's own
     * tokens is 1 in both (log 2 for the second, not log 3) */
    r.T = 5;
    for (int i = 0; i < T * S; i++) disp[i] = (sm_real)(i < 3 * S ? 1.0 / 3 : 0.5);
    ds = 0;
    dn = 0;
    sm_route_soft_sharpness(&r, &cs, &cn, &ds, &dn);
    cr_assert_eq(dn, 2 * S);
    cr_assert_float_eq(ds / dn, 1.0, 1e-6);
    /* one slot: no combine term (entropy over one slot is 0 / log 1) */
    r.T = T;
    r.E = 1;
    r.slots = 1;
    long cn0 = cn;
    sm_route_soft_sharpness(&r, &cs, &cn, &ds, &dn);
    cr_assert_eq(cn, cn0);
    r.E = 2;
    r.slots = 2;
    /* a sparse route adds nothing */
    r.kind = SM_ROUTE_SPARSE;
    cn0 = cn;
    long dn0 = dn;
    sm_route_soft_sharpness(&r, &cs, &cn, &ds, &dn);
    cr_assert_eq(cn, cn0);
    cr_assert_eq(dn, dn0);
}
