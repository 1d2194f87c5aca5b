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

/* topk, switch (src/nn/router_topk.c) and expert-choice (src/nn/router_assign.c): one option, the
 * group of tokens that compete together - for capacity (token choice) or for each expert's picks
 * (expert choice); one observation's tokens when an MoE module sets it (sm_router_ops.group_key) */
typedef struct {
    int group; /* tokens per group; 0 = the whole batch */
} sm_group_router_opts;
/* sm_group_opts(cfg): the accessor (cfg must name topk, switch or expert-choice) */
SM_ROUTER_OWN_ACCESSOR(sm_group_router_opts, sm_group_opts)
/* their option table's row and their check */
#define SM_GROUP_ROUTER_OPT                                                                              \
    SM_ROUTER_OWN_OPT(sm_group_router_opts, "group", NULL, SM_OPT_INT, group, "0",                         \
                      "tokens per group (0: the batch; a token input sets one observation)")
static inline const char *sm_group_router_check(const sm_router_config *c, int d, char *buf, size_t n) {
    (void)d, (void)buf, (void)n;
    return sm_group_opts(c)->group < 0 ? "the group size must be >= 0" : NULL;
}

/* random (src/nn/router_assign.c) */
typedef struct {
    uint64_t seed; /* seed of the parameter-free stochastic router */
} sm_random_router_opts;
/* sm_random_opts(cfg): the accessor (cfg must name this router) */
SM_ROUTER_OWN_ACCESSOR(sm_random_router_opts, sm_random_opts)

/* ds (DeepSeekMoE's shared-expert routing, src/nn/router_shared.c) */
typedef struct {
    int ds_shared; /* the first ds_shared experts take every token with weight 1 */
} sm_ds_router_opts;
/* sm_ds_opts(cfg): the accessor (cfg must name this router) */
SM_ROUTER_OWN_ACCESSOR(sm_ds_router_opts, sm_ds_opts)

#ifdef __cplusplus
}
#endif
#endif
