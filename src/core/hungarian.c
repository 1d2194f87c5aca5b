/* Kuhn-Munkres (Hungarian) assignment in O(n^3), and the matched-label accuracy (see hungarian.h).
 *
 * The shortest-augmenting-path form with potentials (Jonker-Volgenant style, as in the classic
 * e-maxx write-up): rows are added one at a time; for each, a Dijkstra-like search over columns with
 * reduced costs cost[i][j] - u[i] - v[j] >= 0 finds the cheapest augmenting path, the potentials are
 * updated so reduced costs stay non-negative and are 0 along the matching, and the path is flipped.
 * Each row costs O(n^2), so O(n^3) in all. Arrays below are 1-based: column 0 is a virtual column
 * that holds the row being inserted.
 */
#include "specmoe/core/hungarian.h"

#include <math.h>
#include <stdlib.h>

#define COST_MAX 1e100

sm_status sm_hungarian_min(const double *cost, int n, int *assign, double *total, sm_error *err) {
    if (n < 1) return sm_fail(err, SM_ERR_ARG, "hungarian: matrix size n = %d, need n >= 1", n);
    if (!cost || !assign) return sm_fail(err, SM_ERR_ARG, "hungarian: cost and assign must not be NULL");
    for (long k = 0; k < (long)n * n; k++)
        if (!isfinite(cost[k]) || fabs(cost[k]) > COST_MAX)
            return sm_fail(err, SM_ERR_ARG, "hungarian: cost[%ld][%ld] = %g, need a finite value with |cost| <= %g",
                           k / n, k % n, cost[k], COST_MAX);

    size_t m = (size_t)n + 1;
    double *u = malloc(3 * m * sizeof *u); /* row potentials u, column potentials v, minv: (n+1) each */
    int *iw = malloc(3 * m * sizeof *iw);  /* p (row matched to column j), way (previous column), used */
    if (!u || !iw) {
        free(u);
        free(iw);
        return sm_fail(err, SM_ERR_NOMEM, "hungarian: out of memory for n = %d", n);
    }
    double *v = u + m, *minv = v + m;
    int *p = iw, *way = p + m, *used = way + m;
    for (size_t j = 0; j < m; j++) {
        u[j] = v[j] = 0;
        p[j] = way[j] = 0;
    }

    for (int i = 1; i <= n; i++) {
        p[0] = i;
        int j0 = 0;
        for (int j = 0; j <= n; j++) {
            minv[j] = INFINITY;
            used[j] = 0;
        }
        do { /* grow the shortest-path tree by one column per pass until a free column is reached */
            used[j0] = 1;
            int i0 = p[j0], j1 = 0;
            double delta = INFINITY;
            const double *row = cost + (size_t)(i0 - 1) * n;
            for (int j = 1; j <= n; j++) {
                if (used[j]) continue;
                double cur = row[j - 1] - u[i0] - v[j];
                if (cur < minv[j]) {
                    minv[j] = cur;
                    way[j] = j0;
                }
                if (minv[j] < delta) {
                    delta = minv[j];
                    j1 = j;
                }
            }
            for (int j = 0; j <= n; j++) {
                if (used[j]) {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
        } while (p[j0] != 0);
        do { /* flip the augmenting path back to the virtual column */
            int j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
        } while (j0);
    }

    double sum = 0;
    for (int j = 1; j <= n; j++) assign[p[j] - 1] = j - 1;
    for (int r = 0; r < n; r++) sum += cost[(size_t)r * n + assign[r]];
    if (total) *total = sum;
    free(u);
    free(iw);
    return SM_OK;
}

double sm_assignment_accuracy(const int *pred, const int *truth, int n_items, int n_pred, int n_truth) {
    if (!pred || !truth || n_items < 1 || n_pred < 1 || n_truth < 1) return NAN;
    int n = n_pred > n_truth ? n_pred : n_truth;
    double *neg = calloc((size_t)n * n, sizeof *neg); /* -counts, padded with zero rows / columns */
    int *assign = malloc((size_t)n * sizeof *assign);
    double acc = NAN;
    if (!neg || !assign) goto done;
    for (int i = 0; i < n_items; i++) {
        if (truth[i] < 0 || truth[i] >= n_truth || pred[i] >= n_pred) goto done;
        if (pred[i] >= 0) neg[(size_t)pred[i] * n + truth[i]] -= 1.0;
    }
    double total;
    if (sm_hungarian_min(neg, n, assign, &total, NULL) != SM_OK) goto done;
    acc = (0.0 - total) / n_items; /* padded cells are 0, so -total is the matched count (0.0 - : no -0) */
done:
    free(neg);
    free(assign);
    return acc;
}
