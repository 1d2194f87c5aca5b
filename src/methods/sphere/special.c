/* Expert-specialisation metrics of SPHERE App. J.11 (include/specmoe/methods/sphere/sphere.h), on a
 * held-out batch, at the model's last MoE layer with a sparse (top-k) route and built-in MLP experts:
 *   overlap        mean cosine between the last hidden features h_e(x) of the experts selected for the
 *                  same state (every pair of a state's selected experts);
 *   orthogonality  mean of 1 - |cos| over the same pairs;
 *   silhouette     of the gate embeddings labelled by each state's top-1 expert (Euclidean; a point
 *                  alone in its cluster scores 0; NaN with fewer than two clusters). The gate
 *                  embedding is the gate network's output when the layer has one (SPHERE's MoE actor),
 *                  else the layer's input, which the router reads;
 *   knn_jaccard    mean Jaccard similarity |S_t ^ S_n| / |S_t v S_n| of the selected-expert sets of
 *                  each state t and its knn nearest neighbours n in the gate-embedding space;
 *   max_vio        max_e |n_e - T k / E| / (T k / E), n_e the assignments of expert e;
 *   active_ratio   the share of experts with at least one assignment;
 *   entropy        the mean routing entropy H(p_t) over log E (1: uniform routing).
 * The paper does not say which space its nearest neighbours live in; the gate embedding is our
 * choice (README, "SPHERE"). */
#include "specmoe/methods/sphere/sphere.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double dist2(const sm_real *a, const sm_real *b, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return s;
}

/* selected experts of token t from the route's assignments, in sel[t * E ..], count in nsel[t] */
static void selections(const sm_route *r, int *sel, int *nsel) { /* up to E per token (shared experts too) */
    for (int t = 0; t < r->T; t++) nsel[t] = 0;
    for (int e = 0; e < r->E; e++)
        for (int a = r->offset[e]; a < r->offset[e + 1]; a++) {
            const int t = r->token[a];
            sel[t * r->E + nsel[t]++] = e;
        }
}

sm_status sm_sphere_specialisation(sm_model *m, const float *x, int N, int knn, sm_sphere_spec *out, sm_error *err) {
    memset(out, 0, sizeof *out);
    if (N < 2 || N > m->max_T) return sm_fail(err, SM_ERR_ARG, "specialisation: %d states, the model takes 2 to %d", N, m->max_T);
    if (knn < 1 || knn >= N) return sm_fail(err, SM_ERR_ARG, "specialisation: knn must be in [1, %d] (got %d)", N - 1, knn);
    int li = -1;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].moe) li = l;
    sm_moe *moe = li >= 0 ? m->layers[li].moe : NULL;
    if (!moe || !sm_moe_has_features(moe) || moe->router->ops->kind != SM_ROUTE_SPARSE)
        return sm_fail(err, SM_ERR_ARG, "specialisation: needs an MoE layer whose expert features it can read (built-in MLP "
                       "experts, or factory experts laid out as moe.h's feat_seq) and a top-k route");
    sm_model_forward(m, x, N, NULL, 0);
    const sm_route *r = &moe->route;
    const int E = moe->E, H = moe->H;
    int dg = m->layers[li].in;
    const sm_real *g = sm_moe_gate_out(m->layers[li].mod, &dg);
    if (!g) g = li > 0 ? sm_seq_output(m->body, li - 1) : m->input;
    sm_real *phi = malloc(sizeof(sm_real) * (size_t)N * E * H);
    int *sel = malloc(sizeof(int) * (size_t)N * E), *nsel = malloc(sizeof(int) * N), *top = malloc(sizeof(int) * N);
    double *D2 = malloc(sizeof(double) * (size_t)N * N);
    int *nb = malloc(sizeof(int) * (size_t)knn);
    sm_status st = SM_OK;
    if (!phi || !sel || !nsel || !top || !D2 || !nb) {
        st = sm_fail(err, SM_ERR_NOMEM, "specialisation: out of memory for %d states", N);
        goto done;
    }
    if ((st = sm_sphere_features_at(moe, moe->L - 1, 0, phi, err)) != SM_OK) goto done; /* h_e, unweighted */
    selections(r, sel, nsel);
    /* overlap and orthogonality over each state's pairs of selected experts */
    double cs = 0, orth = 0;
    long pairs = 0;
    for (int t = 0; t < N; t++)
        for (int i = 0; i < nsel[t]; i++)
            for (int j = i + 1; j < nsel[t]; j++) {
                const sm_real *a = phi + ((size_t)t * E + sel[t * E + i]) * H, *b = phi + ((size_t)t * E + sel[t * E + j]) * H;
                double ab = 0, aa = 0, bb = 0;
                for (int h = 0; h < H; h++) ab += (double)a[h] * b[h], aa += (double)a[h] * a[h], bb += (double)b[h] * b[h];
                if (aa <= 0 || bb <= 0) continue; /* an all-zero (dead) feature vector has no direction */
                const double c = ab / sqrt(aa * bb);
                cs += c, orth += 1 - fabs(c), pairs++;
            }
    out->pairs = pairs;
    out->overlap = pairs ? cs / pairs : NAN;
    out->orthogonality = pairs ? orth / pairs : NAN;
    /* load: MaxVio and the active ratio */
    const double fair = (double)r->n_assign / E;
    int active = 0;
    double vio = 0;
    for (int e = 0; e < E; e++) {
        const int ne = r->offset[e + 1] - r->offset[e];
        active += ne > 0;
        if (fair > 0) vio = fmax(vio, fabs(ne - fair) / fair);
    }
    out->max_vio = vio;
    out->active_ratio = (double)active / E;
    /* normalised routing entropy */
    double ent = 0;
    for (int t = 0; t < N; t++) {
        double h = 0;
        for (int e = 0; e < E; e++) {
            const double p = r->probs[(size_t)t * E + e];
            if (p > 0) h -= p * log(p);
        }
        ent += E > 1 ? h / log(E) : 0;
    }
    out->entropy = ent / N;
    /* silhouette by top-1 expert (the highest routing probability) and kNN Jaccard, on the gate embedding */
    for (int t = 0; t < N; t++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            if (r->probs[(size_t)t * E + e] > r->probs[(size_t)t * E + best]) best = e;
        top[t] = best;
    }
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++) D2[(size_t)a * N + b] = a == b ? 0 : dist2(g + (size_t)a * dg, g + (size_t)b * dg, dg);
    int clusters = 0;
    for (int e = 0; e < E; e++) {
        int any = 0;
        for (int t = 0; t < N && !any; t++) any = top[t] == e;
        clusters += any;
    }
    if (clusters < 2) {
        out->silhouette = NAN;
    } else {
        double sil = 0;
        for (int t = 0; t < N; t++) {
            double sum_in = 0, best_out = INFINITY;
            int n_in = 0;
            for (int e = 0; e < E; e++) {
                double s = 0;
                int n = 0;
                for (int u = 0; u < N; u++)
                    if (u != t && top[u] == e) s += sqrt(D2[(size_t)t * N + u]), n++;
                if (e == top[t]) sum_in = s, n_in = n;
                else if (n > 0) best_out = fmin(best_out, s / n);
            }
            if (n_in == 0) continue; /* alone in its cluster: 0 */
            const double a = sum_in / n_in, den = fmax(a, best_out);
            sil += den > 0 ? (best_out - a) / den : 0;
        }
        out->silhouette = sil / N;
    }
    double jac = 0;
    for (int t = 0; t < N; t++) {
        /* the knn nearest others by insertion into a sorted list */
        int have = 0;
        for (int u = 0; u < N; u++) {
            if (u == t) continue;
            const double d = D2[(size_t)t * N + u];
            int pos = have;
            while (pos > 0 && D2[(size_t)t * N + nb[pos - 1]] > d) pos--;
            if (pos >= knn) continue;
            for (int q = (have < knn ? have : knn - 1); q > pos; q--) nb[q] = nb[q - 1];
            nb[pos] = u;
            if (have < knn) have++;
        }
        double js = 0;
        for (int q = 0; q < have; q++) {
            const int u = nb[q];
            int inter = 0;
            for (int i = 0; i < nsel[t]; i++)
                for (int j = 0; j < nsel[u]; j++) inter += sel[t * E + i] == sel[u * E + j];
            const int uni = nsel[t] + nsel[u] - inter;
            js += uni > 0 ? (double)inter / uni : 1;
        }
        jac += js / have;
    }
    out->knn_jaccard = jac / N;
done:
    free(phi), free(sel), free(nsel), free(top), free(D2), free(nb);
    return st;
}
