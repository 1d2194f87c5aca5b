/* SPHERE's routing-weighted expert features (Eq. 26's phi; include/specmoe/methods/sphere/sphere.h):
 * gathered from the MoE layer's assignments, which hold each selected (token, expert) pair's
 * combine weight and the expert's hidden activations of that token. */
#include "specmoe/methods/sphere/sphere.h"

#include <string.h>

#include "specmoe/core/ops.h"

sm_status sm_sphere_features_at(sm_moe *m, int j, int weighted, sm_real *phi, sm_error *err) {
    const sm_route *r = &m->route;
    if (r->kind != SM_ROUTE_SPARSE) return sm_fail(err, SM_ERR_ARG, "sphere: needs a top-k (sparse) route, not a soft one");
    sm_real *dfeat = NULL;
    const sm_real *h = sm_moe_features_at(m, j, &dfeat);
    if (!h)
        return sm_fail(err, SM_ERR_ARG, "sphere: needs built-in MLP experts, or factory experts that are containers of hidden "
                       "blocks (moe.h, feat_seq) (hidden layer %d of %d)", j, m->L);
    const int E = m->E, H = m->H, T = r->T;
    memset(dfeat, 0, sizeof(sm_real) * (size_t)r->n_assign * H); /* the backward below adds into it */
    memset(phi, 0, sizeof(sm_real) * (size_t)T * E * H);
    for (int e = 0; e < E; e++)
        for (int a = r->offset[e]; a < r->offset[e + 1]; a++) {
            sm_real *row = phi + (size_t)r->token[a] * E * H + (size_t)e * H;
            const sm_real w = weighted ? r->weight[a] : 1, *ha = h + (size_t)a * H;
            for (int i = 0; i < H; i++) row[i] = w * ha[i];
        }
    return SM_OK;
}

void sm_sphere_features_at_backward(sm_moe *m, int j, int weighted, const sm_real *dphi) {
    sm_route *r = &m->route;
    sm_real *dfeat = NULL;
    const sm_real *h = sm_moe_features_at(m, j, &dfeat);
    const int E = m->E, H = m->H;
    for (int e = 0; e < E; e++)
        for (int a = r->offset[e]; a < r->offset[e + 1]; a++) {
            const sm_real *g = dphi + (size_t)r->token[a] * E * H + (size_t)e * H, *ha = h + (size_t)a * H;
            sm_real *dh = dfeat + (size_t)a * H, dot = 0;
            const sm_real w = weighted ? r->weight[a] : 1;
            for (int i = 0; i < H; i++) {
                dh[i] += w * g[i];
                dot += g[i] * ha[i];
            }
            if (weighted) r->dweight[a] += dot; /* d phi / d p_e = h_e */
        }
}

sm_status sm_sphere_features(sm_moe *m, sm_real *phi, sm_error *err) {
    return sm_sphere_features_at(m, m->L - 1, 1, phi, err);
}

void sm_sphere_features_backward(sm_moe *m, const sm_real *dphi) { sm_sphere_features_at_backward(m, m->L - 1, 1, dphi); }

/* Eq. 26 without the dense phi (the routed path of include/specmoe/methods/sphere/sphere.h): a state's
 * phi has one block per selected expert and zeros elsewhere, so A = phi phi^T / T only gathers
 * products of assignments that share an expert,
 *   A[t, u] = (1/T) sum_e w_a w_b <h_a, h_b>   (a: t's assignment to e, b: u's),
 * and dL/dphi = (4/T)(A - tr(A)/D I) phi is nonzero only on the selected blocks:
 *   dL/d(w_a h_a) = (4/T) (sum_{b in e} A[t_a, t_b] w_b h_b - tr(A)/D w_a h_a).
 * Expert e's assignments are contiguous rows h_e (n_e, H), so both sums are GEMMs on them:
 * K_e = h_e h_e^T (n_e, n_e), and (M_e h_e) with M_e[a, b] = A[t_a, t_b] w_b - c w_a [a = b]. That is
 * 2 sum_e n_e^2 H multiply-adds, about (2k / E) of the dense T^2 E H each (k of E experts per row).
 * per_expert: the sum over e of Eq. 26 on expert e's own block (D = H, A_e over its assignments). */
size_t sm_sphere_routed_work_values(int T, int H) { return 2 * (size_t)T * T + (size_t)T * H; }


#define W(a) (weighted ? (double)r->weight[a] : 1.0)
double sm_sphere_penalty_routed(sm_moe *m, int j, int weighted, int per_expert, sm_real *work) {
    const sm_route *r = &m->route;
    const sm_real *h = sm_moe_features_at(m, j, NULL);
    const int E = m->E, H = m->H, T = r->T;
    sm_real *G = work, *K = G + (size_t)T * T; /* A (T, T); K_e (n_e, n_e) */
    const double D = per_expert ? (double)H : (double)E * H, inv_t = 1.0 / T;
    /* K_e's entries scaled into A: A's (t, u) entries (shared) or A_e (per expert, in K itself) */
    double L = 0, tr = 0;
    if (!per_expert) memset(G, 0, sizeof(sm_real) * (size_t)T * T);
    for (int e = 0; e < E; e++) {
        const int a0 = r->offset[e], n = r->offset[e + 1] - a0;
        if (n == 0) continue;
        const sm_real *he = h + (size_t)a0 * H;
        sm_gemm(0, 1, n, n, H, 1, he, H, he, H, 0, K, n);
        double fro_e = 0, tr_e = 0;
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++) {
                const double v = W(a0 + a) * W(a0 + b) * K[(size_t)a * n + b] * inv_t;
                if (per_expert) {
                    fro_e += v * v;
                    if (a == b) tr_e += v;
                } else {
                    G[(size_t)r->token[a0 + a] * T + r->token[a0 + b]] += (sm_real)v;
                }
            }
        if (per_expert) L += fro_e - tr_e * tr_e / D;
    }
    if (!per_expert) {
        double fro = 0;
        for (int t = 0; t < T; t++) {
            tr += G[(size_t)t * T + t];
            for (int u = 0; u < T; u++) fro += (double)G[(size_t)t * T + u] * G[(size_t)t * T + u];
        }
        L = fro - tr * tr / D;
    }
    return L;
}

void sm_sphere_penalty_routed_backward(sm_moe *m, int j, int weighted, int per_expert, sm_real scale, sm_real *work) {
    sm_route *r = &m->route;
    sm_real *dfeat = NULL;
    const sm_real *h = sm_moe_features_at(m, j, &dfeat);
    const int E = m->E, H = m->H, T = r->T;
    sm_real *G = work, *K = G + (size_t)T * T, *P = K + (size_t)T * T; /* A (T, T); M_e (n_e, n_e); (n_e, H) */
    memset(dfeat, 0, sizeof(sm_real) * (size_t)r->n_assign * H); /* as sm_sphere_features_at */
    const double D = per_expert ? (double)H : (double)E * H, inv_t = 1.0 / T;
    double tr = 0;
    if (!per_expert)
        for (int t = 0; t < T; t++) tr += G[(size_t)t * T + t];
    const sm_real s4 = (sm_real)(4.0 * scale * inv_t);
    for (int e = 0; e < E; e++) {
        const int a0 = r->offset[e], n = r->offset[e + 1] - a0;
        if (n == 0) continue;
        const sm_real *he = h + (size_t)a0 * H;
        double c = tr / D;
        if (per_expert) { /* A_e again, and its trace */
            sm_gemm(0, 1, n, n, H, 1, he, H, he, H, 0, K, n);
            double tr_e = 0;
            for (int a = 0; a < n; a++) tr_e += W(a0 + a) * W(a0 + a) * K[(size_t)a * n + a] * inv_t;
            c = tr_e / D;
            for (int a = 0; a < n; a++)
                for (int b = 0; b < n; b++) K[(size_t)a * n + b] = (sm_real)(W(a0 + a) * W(a0 + b) * K[(size_t)a * n + b] * inv_t * W(a0 + b));
        } else {
            for (int a = 0; a < n; a++)
                for (int b = 0; b < n; b++) K[(size_t)a * n + b] = (sm_real)(G[(size_t)r->token[a0 + a] * T + r->token[a0 + b]] * W(a0 + b));
        }
        for (int a = 0; a < n; a++) K[(size_t)a * n + a] -= (sm_real)(c * W(a0 + a));
        /* P = (4 scale / T) M_e h_e: dL/dphi on e's blocks; then as sm_sphere_features_at_backward */
        sm_gemm(0, 0, n, H, n, s4, K, n, he, H, 0, P, H);
        for (int a = 0; a < n; a++) {
            const sm_real *g = P + (size_t)a * H, *ha = he + (size_t)a * H, wa = (sm_real)W(a0 + a);
            sm_real *dh = dfeat + (size_t)(a0 + a) * H, dot = 0;
            for (int i = 0; i < H; i++) {
                dh[i] += wa * g[i];
                dot += g[i] * ha[i];
            }
            if (weighted) r->dweight[a0 + a] += dot;
        }
    }
}
#undef W
