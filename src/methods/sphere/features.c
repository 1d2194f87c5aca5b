/* SPHERE's routing-weighted expert features (Eq. 26's phi; include/specmoe/methods/sphere/sphere.h):
 * gathered from the MoE layer's assignments, which hold each selected (token, expert) pair's
 * combine weight and the expert's hidden activations of that token. */
#include "specmoe/methods/sphere/sphere.h"

#include <string.h>

sm_status sm_sphere_features(sm_moe *m, sm_real *phi, sm_error *err) {
    const sm_route *r = &m->route;
    if (r->kind != SM_ROUTE_SPARSE) return sm_fail(err, SM_ERR_ARG, "sphere: needs a top-k (sparse) route, not a soft one");
    sm_real *dfeat = NULL;
    const sm_real *h = sm_moe_features(m, &dfeat);
    if (!h) return sm_fail(err, SM_ERR_ARG, "sphere: needs the layer's built-in MLP experts");
    const int E = m->E, H = m->H, T = r->T;
    memset(dfeat, 0, sizeof(sm_real) * (size_t)r->n_assign * H); /* sm_sphere_features_backward adds into it */
    memset(phi, 0, sizeof(sm_real) * (size_t)T * E * H);
    for (int e = 0; e < E; e++)
        for (int a = r->offset[e]; a < r->offset[e + 1]; a++) {
            sm_real *row = phi + (size_t)r->token[a] * E * H + (size_t)e * H;
            const sm_real w = r->weight[a], *ha = h + (size_t)a * H;
            for (int j = 0; j < H; j++) row[j] = w * ha[j];
        }
    return SM_OK;
}

void sm_sphere_features_backward(sm_moe *m, const sm_real *dphi) {
    sm_route *r = &m->route;
    sm_real *dfeat = NULL;
    const sm_real *h = sm_moe_features(m, &dfeat);
    const int E = m->E, H = m->H;
    for (int e = 0; e < E; e++)
        for (int a = r->offset[e]; a < r->offset[e + 1]; a++) {
            const sm_real *g = dphi + (size_t)r->token[a] * E * H + (size_t)e * H, *ha = h + (size_t)a * H;
            sm_real *dh = dfeat + (size_t)a * H, dot = 0;
            for (int j = 0; j < H; j++) {
                dh[j] += r->weight[a] * g[j];
                dot += g[j] * ha[j];
            }
            r->dweight[a] += dot;
        }
}
