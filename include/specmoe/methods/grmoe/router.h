/* The own options of GrMoE's routers, "vmf" and "grassmann" (src/methods/grmoe/router_geometric.c;
 * the shared ones are in nn/router.h). vmf reads kappa_init only. */
#ifndef SPECMOE_GRMOE_ROUTER_H
#define SPECMOE_GRMOE_ROUTER_H

#include "specmoe/nn/router.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double kappa_init;   /* initial concentration kappa_e (learned, > 0) */
    double alpha;        /* the sparsity dial: logits = alpha * h(x) * kappa_e * ||U_e^T x||^2 (Eq. 5) */
    int kr;              /* routing rank k_r (frames in St(k_r, d)) */
    int amortize;        /* amortiser h(x) = E * softmax(MLP(x)) (Sec. 5.2) */
    int amort_hidden;    /* its hidden width */
    double subspace_beta;/* weight of the subspace-overlap regulariser (Eq. 12) */
    double rho0;         /* overlap threshold: max(0, ||U_e^T U_e'||_F^2 - rho0 * k_r) */
    int pairs;           /* sampled pairs per step; 0 = 4E (the paper's default), -1 = all pairs */
} sm_grmoe_router_opts;
/* sm_grmoe_opts(cfg): the accessor (cfg must name this router) */
SM_ROUTER_OWN_ACCESSOR(sm_grmoe_router_opts, sm_grmoe_opts)

#ifdef __cplusplus
}
#endif
#endif
