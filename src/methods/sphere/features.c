/* SPHERE's routing-weighted expert features (Eq. 26's phi; include/specmoe/methods/sphere/sphere.h):
 * gathered from the MoE layer's assignments, which hold each selected (token, expert) pair's
 * combine weight and the expert's hidden activations of that token. */
#include "specmoe/methods/sphere/sphere.h"

#include <string.h>

sm_status sm_sphere_features_at(sm_moe *m, int j, int weighted, sm_real *phi, sm_error *err) {
    const sm_route *r = &m->route;
    if (r->kind != SM_ROUTE_SPARSE) return sm_fail(err, SM_ERR_ARG, "sphere: needs a top-k (sparse) route, not a soft one");
    sm_real *dfeat = NULL;
    const sm_real *h = sm_moe_features_at(m, j, &dfeat);
    if (!h) return sm_fail(err, SM_ERR_ARG, "sphere: needs the layer's built-in MLP experts (hidden layer %d of %d)", j, m->L);
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
