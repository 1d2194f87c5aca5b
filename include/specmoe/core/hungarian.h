/* Minimum-cost perfect matching of an n x n cost matrix (Kuhn-Munkres, the O(n^3) shortest-augmenting-
 * path form with row and column potentials), and the clustering accuracy built on it: "assignment
 * accuracy after the best one-to-one matching of experts to components".
 *
 * Example: which expert is which mixture component?
 *
 *   int pred[N], truth[N];   // pred[i] = expert of item i (-1 = dropped), truth[i] = its component
 *   double acc = sm_assignment_accuracy(pred, truth, N, E, C);   // in [0, 1]
 */
#ifndef SPECMOE_HUNGARIAN_H
#define SPECMOE_HUNGARIAN_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Solves min over permutations sigma of sum_r cost[r * n + sigma(r)] for a row-major n x n matrix.
 * assign[r] = the column given to row r (a permutation of 0..n-1); *total = the minimum cost (total
 * may be NULL). Ties are broken deterministically. SM_ERR_ARG on n < 1, NULL pointers, or an entry
 * that is not finite or exceeds 1e100 in magnitude (sums of costs and potentials must stay finite);
 * SM_ERR_NOMEM if the O(n) scratch cannot be allocated. */
sm_status sm_hungarian_min(const double *cost, int n, int *assign, double *total, sm_error *err);

/* The fraction of the n_items items whose label survives the best one-to-one relabelling: the
 * n_pred x n_truth confusion matrix counts[a][b] = #{i : pred[i] = a, truth[i] = b} is padded to a
 * square, the matching of predicted to true labels with the largest matched count is found
 * (sm_hungarian_min on the negated counts), and the matched count is divided by n_items. With
 * n_pred != n_truth the surplus labels stay unmatched and their items count as errors. Items with
 * pred[i] < 0 (dropped tokens) are never matched but stay in the denominator. Returns NaN on
 * impossible input (n_items, n_pred or n_truth < 1, truth[i] outside [0, n_truth), pred[i] >= n_pred)
 * or if memory runs out (the padded matrix has max(n_pred, n_truth)^2 doubles). */
double sm_assignment_accuracy(const int *pred, const int *truth, int n_items, int n_pred, int n_truth);

#ifdef __cplusplus
}
#endif
#endif
