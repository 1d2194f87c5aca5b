/* The own options of the generic routers in src/nn (router.h: sm_router_config.own). Routers of a
 * paper keep theirs beside the method (GrMoE: methods/grmoe/router.h, SR-MoE: methods/srmoe/srmoe.h,
 * SSMoE: methods/ssmoe/ssmoe.h). */
#ifndef SPECMOE_ROUTERS_H
#define SPECMOE_ROUTERS_H

#include <stdint.h>

#include "specmoe/nn/router.h"

#ifdef __cplusplus
extern "C" {
#endif

/* soft (SoftMoE, src/nn/router_soft.c) */
typedef struct {
    int slots;      /* slots per expert p; 0 = ceil(group / E) */
    int soft_group; /* tokens per SoftMoE group (one observation); 0 = the whole batch */
    int soft_norm;  /* normalise x and Phi along d, with a learned scale */
} sm_soft_router_opts;
/* sm_soft_opts(cfg): the accessor (cfg must name this router) */
SM_ROUTER_OWN_ACCESSOR(sm_soft_router_opts, sm_soft_opts)

/* topk and switch (src/nn/router_topk.c) */
typedef struct {
    int group; /* tokens per capacity group (one observation's); 0 = the whole batch */
} sm_topk_router_opts;
/* sm_topk_opts(cfg): the accessor (cfg must name topk or switch) */
SM_ROUTER_OWN_ACCESSOR(sm_topk_router_opts, sm_topk_opts)

/* expert-choice (src/nn/router_assign.c) */
typedef struct {
    int group; /* tokens per group: each expert picks its tokens within each group; 0 = the whole batch */
} sm_ec_router_opts;
/* sm_ec_opts(cfg): the accessor (cfg must name expert-choice) */
SM_ROUTER_OWN_ACCESSOR(sm_ec_router_opts, sm_ec_opts)

/* random (src/nn/router_assign.c) */
typedef struct {
    uint64_t seed; /* seed of the parameter-free stochastic router */
} sm_random_router_opts;
/* sm_random_opts(cfg): the accessor (cfg must name this router) */
SM_ROUTER_OWN_ACCESSOR(sm_random_router_opts, sm_random_opts)

#ifdef __cplusplus
}
#endif
#endif
