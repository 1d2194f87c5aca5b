/* Hungarian assignment against brute force, and the matched-label accuracy. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/hungarian.h"

/* Minimum over all n! permutations (Heap's algorithm); n <= 8. */
static double brute_min(const double *c, int n) {
    int perm[8], cnt[8] = {0};
    for (int i = 0; i < n; i++) perm[i] = i;
    double best = 0;
    for (int r = 0; r < n; r++) best += c[r * n + perm[r]];
    int i = 1;
    while (i < n) {
        if (cnt[i] < i) {
            int k = (i % 2) ? cnt[i] : 0, t = perm[k];
            perm[k] = perm[i];
            perm[i] = t;
            double s = 0;
            for (int r = 0; r < n; r++) s += c[r * n + perm[r]];
            if (s < best) best = s;
            cnt[i]++;
            i = 1;
        } else {
            cnt[i++] = 0;
        }
    }
    return best;
}

static void expect_permutation(const int *a, int n) {
    int seen[64] = {0};
    for (int r = 0; r < n; r++) {
        cr_assert(a[r] >= 0 && a[r] < n, "assign[%d] = %d out of range", r, a[r]);
        cr_assert(!seen[a[r]], "column %d assigned twice", a[r]);
        seen[a[r]] = 1;
    }
}

Test(hungarian, random_matrices_match_brute_force) {
    sm_rng rng;
    sm_rng_seed(&rng, 7);
    for (int n = 1; n <= 7; n++) {
        for (int trial = 0; trial < 60; trial++) {
            double c[49];
            /* alternate continuous costs with small integers (many ties) and negative values */
            for (int k = 0; k < n * n; k++)
                c[k] = trial % 3 == 0 ? (double)sm_rng_below(&rng, 4)
                     : trial % 3 == 1 ? 100 * sm_rng_uniform(&rng) - 50
                                      : 1e6 * sm_rng_uniform(&rng);
            int a[7];
            double total = NAN;
            sm_error err = {0};
            cr_assert_eq(sm_hungarian_min(c, n, a, &total, &err), SM_OK, "%s", err.msg);
            expect_permutation(a, n);
            double s = 0;
            for (int r = 0; r < n; r++) s += c[r * n + a[r]];
            cr_expect_eq(s, total, "total %.17g is not the cost %.17g of the returned assignment", total, s);
            double bf = brute_min(c, n);
            cr_expect(fabs(total - bf) <= 1e-9 * (1 + fabs(bf)), "n %d trial %d: hungarian %.17g, brute force %.17g",
                      n, trial, total, bf);
        }
    }
}

Test(hungarian, hand_example) {
    /* a 3x3 example worked by hand */
    double c[9] = {4, 1, 3,
                   2, 0, 5,
                   3, 2, 2};
    /* permutations: (0,1,2) 4+0+2=6, (0,2,1) 4+5+2=11, (1,0,2) 1+2+2=5, (1,2,0) 1+5+3=9,
     * (2,0,1) 3+2+2=7, (2,1,0) 3+0+3=6: the unique optimum is 0->1, 1->0, 2->2 with cost 5 */
    int a[3];
    double total;
    cr_assert_eq(sm_hungarian_min(c, 3, a, &total, NULL), SM_OK);
    cr_expect_eq(a[0], 1);
    cr_expect_eq(a[1], 0);
    cr_expect_eq(a[2], 2);
    cr_expect_eq(total, 5.0);
    /* 1x1 */
    double one = -3.5;
    cr_assert_eq(sm_hungarian_min(&one, 1, a, &total, NULL), SM_OK);
    cr_expect_eq(a[0], 0);
    cr_expect_eq(total, -3.5);
}

Test(hungarian, larger_n_is_a_permutation_and_beats_identity) {
    sm_rng rng;
    sm_rng_seed(&rng, 3);
    int n = 60;
    double *c = malloc(sizeof(double) * n * n);
    int *a = malloc(sizeof(int) * n);
    for (int k = 0; k < n * n; k++) c[k] = sm_rng_uniform(&rng);
    /* plant a perfect zero-cost permutation: the optimum must find cost 0 */
    int *planted = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) planted[i] = i;
    sm_rng_shuffle(&rng, planted, n);
    for (int r = 0; r < n; r++) c[r * n + planted[r]] = 0;
    double total;
    cr_assert_eq(sm_hungarian_min(c, n, a, &total, NULL), SM_OK);
    expect_permutation(a, n);
    cr_expect_eq(total, 0.0);
    for (int r = 0; r < n; r++) cr_expect_eq(a[r], planted[r]);
    free(c);
    free(a);
    free(planted);
}

Test(hungarian, rejects_bad_input) {
    double c[4] = {1, 2, NAN, 4};
    int a[2];
    sm_error err = {0};
    cr_expect_eq(sm_hungarian_min(c, 2, a, NULL, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "cost[1][0]") != NULL, "%s", err.msg);
    c[2] = INFINITY;
    cr_expect_eq(sm_hungarian_min(c, 2, a, NULL, &err), SM_ERR_ARG);
    c[2] = 1e300;
    cr_expect_eq(sm_hungarian_min(c, 2, a, NULL, &err), SM_ERR_ARG);
    c[2] = 3;
    cr_expect_eq(sm_hungarian_min(c, 0, a, NULL, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "n = 0") != NULL, "%s", err.msg);
    cr_expect_eq(sm_hungarian_min(NULL, 2, a, NULL, &err), SM_ERR_ARG);
    cr_expect_eq(sm_hungarian_min(c, 2, NULL, NULL, &err), SM_ERR_ARG);
}

Test(accuracy, permuted_labelling_is_exactly_one) {
    sm_rng rng;
    sm_rng_seed(&rng, 11);
    enum { N = 500, K = 6 };
    int truth[N], pred[N], perm[K];
    for (int k = 0; k < K; k++) perm[k] = k;
    sm_rng_shuffle(&rng, perm, K);
    for (int i = 0; i < N; i++) {
        truth[i] = (int)sm_rng_below(&rng, K);
        pred[i] = perm[truth[i]];
    }
    cr_expect_eq(sm_assignment_accuracy(pred, truth, N, K, K), 1.0);
    /* the same labelling with more expert labels than components is still perfect */
    for (int i = 0; i < N; i++) pred[i] = 2 * perm[truth[i]] + 1;
    cr_expect_eq(sm_assignment_accuracy(pred, truth, N, 2 * K + 1, K), 1.0);
}

Test(accuracy, hand_example_and_dropped_items) {
    /* 8 items, 3 expert labels, 3 component labels.
     *            truth: 0 0 0 1 1 2 2 2
     *            pred:  2 2 1 0 0 1 1 -1   (last item dropped)
     * confusion (pred rows, truth cols): p0: [0 2 0], p1: [1 0 2], p2: [2 0 0]
     * best matching p2->t0 (2), p0->t1 (2), p1->t2 (2) = 6 of 8 */
    int truth[8] = {0, 0, 0, 1, 1, 2, 2, 2};
    int pred[8] = {2, 2, 1, 0, 0, 1, 1, -1};
    cr_expect_eq(sm_assignment_accuracy(pred, truth, 8, 3, 3), 6.0 / 8.0);
    /* every item dropped: nothing matched */
    int none[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    double z = sm_assignment_accuracy(none, truth, 8, 3, 3);
    cr_expect(z == 0.0 && !signbit(z), "all dropped: %g", z);
}

Test(accuracy, rectangular) {
    /* 2 experts, 3 components: at most two components can be matched.
     * truth: 0 0 0 1 1 2 2 2 2 ; pred: 0 0 0 1 1 1 1 1 1
     * confusion p0: [3 0 0], p1: [0 2 4]: best p0->t0 (3) + p1->t2 (4) = 7 of 9 */
    int truth[9] = {0, 0, 0, 1, 1, 2, 2, 2, 2};
    int pred[9] = {0, 0, 0, 1, 1, 1, 1, 1, 1};
    cr_expect_eq(sm_assignment_accuracy(pred, truth, 9, 2, 3), 7.0 / 9.0);
    /* 4 experts, 2 components: experts 2 and 3 stay unmatched
     * truth: 0 0 0 1 1 1 ; pred: 0 2 2 1 3 3 ; p0:[1 0] p1:[0 1] p2:[2 0] p3:[0 2] -> p2->t0, p3->t1 = 4 of 6 */
    int truth2[6] = {0, 0, 0, 1, 1, 1};
    int pred2[6] = {0, 2, 2, 1, 3, 3};
    cr_expect_eq(sm_assignment_accuracy(pred2, truth2, 6, 4, 2), 4.0 / 6.0);
}

Test(accuracy, random_rectangular_matches_brute_force) {
    /* accuracy = max over injective maps of the confusion matrix, checked by brute force on the padded square */
    sm_rng rng;
    sm_rng_seed(&rng, 5);
    for (int trial = 0; trial < 200; trial++) {
        int np = 1 + (int)sm_rng_below(&rng, 5), nt = 1 + (int)sm_rng_below(&rng, 5), n = np > nt ? np : nt;
        int N = 1 + (int)sm_rng_below(&rng, 40), pred[40], truth[40];
        double negc[25] = {0};
        for (int i = 0; i < N; i++) {
            truth[i] = (int)sm_rng_below(&rng, (uint32_t)nt);
            pred[i] = (int)sm_rng_below(&rng, (uint32_t)(np + 1)) - 1; /* -1 = dropped */
            if (pred[i] >= 0) negc[pred[i] * n + truth[i]] -= 1;
        }
        double want = -brute_min(negc, n) / N;
        double got = sm_assignment_accuracy(pred, truth, N, np, nt);
        cr_expect(fabs(got - want) < 1e-15, "trial %d (%d x %d, %d items): %g, brute force %g", trial, np, nt, N, got,
                  want);
    }
}

Test(accuracy, rejects_bad_input) {
    int truth[3] = {0, 1, 1}, pred[3] = {0, 1, 0};
    cr_expect(isnan(sm_assignment_accuracy(pred, truth, 0, 2, 2)));
    cr_expect(isnan(sm_assignment_accuracy(pred, truth, 3, 0, 2)));
    cr_expect(isnan(sm_assignment_accuracy(pred, truth, 3, 2, 0)));
    cr_expect(isnan(sm_assignment_accuracy(NULL, truth, 3, 2, 2)));
    truth[2] = 2; /* outside [0, n_truth) */
    cr_expect(isnan(sm_assignment_accuracy(pred, truth, 3, 2, 2)));
    truth[2] = -1;
    cr_expect(isnan(sm_assignment_accuracy(pred, truth, 3, 2, 2)));
    truth[2] = 1;
    pred[2] = 2; /* pred >= n_pred */
    cr_expect(isnan(sm_assignment_accuracy(pred, truth, 3, 2, 2)));
    pred[2] = 0;
    cr_expect_eq(sm_assignment_accuracy(pred, truth, 3, 2, 2), 2.0 / 3.0);
}
