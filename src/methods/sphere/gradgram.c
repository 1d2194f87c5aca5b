/* SPHERE's gradient-Gram ablation (Table 1 "Gradient-Gram Regularization"; Prop. 4.2, Eq. 20;
 * include/specmoe/methods/sphere/sphere.h): Eq. 26 on the Gram of the concatenated expert backprop
 * vectors in place of the routing-weighted features' Gram.
 *
 * Letters: T tokens, E experts, H expert hidden width, O output width, L hidden layers per expert;
 * a = (t, e) an assignment of the route, p_a its combine weight. For built-in experts
 *   z_a = W_e h^{(L-2)}_a + b_e       (H)  the pre-activation of the expert's last hidden layer
 *   h_a = relu(z_a)                   (H)  SPHERE's feature there (Eq. 18 gathers p_a h_a)
 *   y_a = W2_e h_a + b2_e             (O)  the expert's output, W2_e (O, H)
 *   out_t = sum_{a of t} p_a y_a (+ the shared experts)
 *
 * The backprop vector (our reading of Eq. 20, which lost its formula): the network's output reduced
 * to a scalar f_t = u^T out_t with the eNTK diagnostics' fixed unit direction u (sm_sphere_direction:
 * the same u, from the run's seed), and g_{t,e} the gradient of f_t with respect to the pre-activation
 * of the regularised hidden layer - the layer whose outputs phi gathers:
 *
 *   psi_{t,e} = d f_t / d z_a = p_a relu'(z_a) (W2_e^T u)      (H), 0 for an unselected e      (1)
 *   Psi (T, E H), row t = concat_e psi_{t,e};  Eq. 26 on A = Psi Psi^T / T (or Psi^T Psi / T).
 *
 * Choices, and why:
 * - The gate weight p_a enters once, as the chain rule puts it there (the expert's output is scaled
 *   by p_a in the combine): psi is exactly what a backward pass of f computes, the text of Prop. 4.2
 *   weights only the features ("expert feature terms weighted by their corresponding Top-k gating",
 *   Eq. 18) and calls Eq. 20's terms "the corresponding pre-activation backprop vector", naming no
 *   further weight. `unweighted` (the features' ablation flag) drops it here too: relu'(z_a) W2_e^T u.
 * - The layer: the regularised hidden layer's own pre-activation. Strictly, the Kronecker partner of
 *   phi = p h (the input of W2) in Eq. 21 is W2's output backprop vector, which for an actor head is
 *   u itself - a constant with nothing to regularise - so the hidden layer's is the reading with
 *   content.
 * - Exactness: (1) holds when out_t is the network's output (a moehead layer: SPHERE's actor, whose
 *   experts end at the action means) - anything after the layer would put its own Jacobian into
 *   psi - and the experts are ReLU, whose relu' is piecewise constant. sm_sphere_reg_create refuses
 *   other placements; this file refuses other activations (tanh, GELU, SiLU: their second derivative
 *   would carry the penalty's gradient through every hidden layer, not implemented).
 *
 * The second-order backward, with G = dL/dPsi (T, E H) from Eq. 26 (sm_sphere_penalty), m_a =
 * relu'(z_a) and v_e = W2_e^T u (H, the same for every token of e):
 *   dL/dp_a   = <G_a, m_a v_e>                         -> route.dweight (the router's backward)
 *   dL/dv_e   = q_e = sum_{a in e} p_a m_a G_a         (H)
 *   dL/dW2_e  = u q_e^T                                (O, H)  (v_e[i] = sum_o W2_e[o, i] u_o)
 *   dL/dz_a   = 0 almost everywhere (m_a is piecewise constant): nothing reaches W_e, the earlier
 *               hidden layers, the biases or the experts' input; u is fixed, b2 does not appear.
 * checked against finite differences in double precision by tests/test_grad_sphere.c. */
#include "specmoe/methods/sphere/sphere.h"

#include <string.h>

#include "specmoe/core/ops.h"

sm_status sm_sphere_grad_features(sm_moe *m, const sm_real *u, int weighted, sm_real *psi, sm_error *err) {
    const sm_route *r = &m->route;
    if (r->kind != SM_ROUTE_SPARSE) return sm_fail(err, SM_ERR_ARG, "sphere: needs a top-k (sparse) route, not a soft one");
    sm_real *dfeat = NULL;
    const sm_real *h = m->experts ? NULL : sm_moe_features_at(m, m->L - 1, &dfeat); /* it reads w2 below */
    if (!h) return sm_fail(err, SM_ERR_ARG, "sphere: the gradient Gram needs the layer's built-in MLP experts (their output weights)");
    if (m->cfg.act != SM_ACT_RELU)
        return sm_fail(err, SM_ERR_ARG, "sphere: the gradient Gram is exact for ReLU experts only (relu' piecewise constant); "
                       "the experts' activation is %s", sm_act_name(m->cfg.act));
    const int E = m->E, H = m->H, O = m->O, T = r->T;
    /* the features carry no gradient of this penalty: clear what an earlier penalty may have left */
    memset(dfeat, 0, sizeof(sm_real) * (size_t)r->n_assign * H);
    memset(psi, 0, sizeof(sm_real) * (size_t)T * E * H);
    for (int e = 0; e < E; e++) {
        const sm_real *w2 = m->w2 + (size_t)e * O * H; /* (O, H) */
        for (int a = r->offset[e]; a < r->offset[e + 1]; a++) {
            sm_real *row = psi + (size_t)r->token[a] * E * H + (size_t)e * H;
            const sm_real p = weighted ? r->weight[a] : 1, *ha = h + (size_t)a * H;
            for (int o = 0; o < O; o++) { /* row = p relu'(z) W2_e^T u; relu'(z) = [h > 0] */
                const sm_real pu = p * u[o], *wo = w2 + (size_t)o * H;
                for (int i = 0; i < H; i++) row[i] += ha[i] > 0 ? pu * wo[i] : 0;
            }
        }
    }
    return SM_OK;
}

void sm_sphere_grad_features_backward(sm_moe *m, const sm_real *u, int weighted, const sm_real *dpsi, sm_real *dw2) {
    sm_route *r = &m->route;
    const sm_real *h = sm_moe_features_at(m, m->L - 1, NULL);
    const int E = m->E, H = m->H, O = m->O;
    for (int e = 0; e < E; e++) {
        const sm_real *w2 = m->w2 + (size_t)e * O * H;
        sm_real *dw = dw2 + (size_t)e * O * H;
        for (int a = r->offset[e]; a < r->offset[e + 1]; a++) {
            const sm_real *g = dpsi + (size_t)r->token[a] * E * H + (size_t)e * H, *ha = h + (size_t)a * H;
            const sm_real p = weighted ? r->weight[a] : 1;
            /* dL/dW2_e[o, i] += u_o p m_i g_i (the a-th term of u q_e^T); dL/dp_a = sum_o u_o <W2_e[o], m g> */
            double dp = 0;
            for (int o = 0; o < O; o++) {
                const sm_real *wo = w2 + (size_t)o * H, pu = p * u[o];
                sm_real *dwo = dw + (size_t)o * H, dot = 0;
                for (int i = 0; i < H; i++) {
                    const sm_real mg = ha[i] > 0 ? g[i] : 0;
                    dwo[i] += pu * mg;
                    dot += wo[i] * mg;
                }
                dp += (double)u[o] * dot;
            }
            if (weighted) r->dweight[a] += (sm_real)dp;
        }
    }
}
