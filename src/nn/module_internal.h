/* Internal to src/nn: JSON of modules as cJSON objects (module.c, modules.c, moe_module.c). */
#ifndef SPECMOE_NN_MODULE_INTERNAL_H
#define SPECMOE_NN_MODULE_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "specmoe/nn/module.h"

cJSON *sm_module_json_object(const sm_module *m);
/* {"kind": ..., "name": ..., "residual": 0|1, args...} -> module (every kind of the registry) */
sm_module *sm_module_from_json_object(const cJSON *o, sm_error *err);
sm_module *sm_seq_from_json(const cJSON *o, const char *name, sm_error *err);
sm_module *sm_moe_from_json(const cJSON *o, const char *name, sm_error *err);

/* Shared pieces of leaf modules (modules.c): no activations to reserve; a forward that copies the
 * input (a reshape: flatten, perfeat) and its backward (din += dout); the check that the input is
 * one image per example. */
void sm_module_no_reserve(sm_module *m, int B, sm_arena *a);
void sm_module_copy_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx);
void sm_module_add_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx);
sm_status sm_module_image_in(const sm_module *m, sm_error *err);
/* A zeroed module struct of `bytes` (>= sizeof(sm_module), the struct starting with sm_module) with
 * ops and name set; NULL with err when out of memory. */
sm_module *sm_module_alloc(size_t bytes, const sm_module_ops *ops, const char *name, sm_error *err);

/* "<prefix>.<what>" into buf (SM_NAME_MAX); nonzero when it does not fit */
static inline int sm_param_name(char *buf, const char *prefix, const char *what) {
    return snprintf(buf, SM_NAME_MAX, "%s.%s", prefix, what) >= SM_NAME_MAX;
}

/* the parameter values / gradient of tensor i in the call's view (NULL for i < 0 or no gradient) */
static inline sm_real *sm_ctx_data(const sm_ctx *c, int i) { return i >= 0 ? sm_params_data(c->pv, i) : NULL; }
/* (a fresh gradient, see sm_ctx.fresh, is zeroed first: the caller may accumulate into it) */
static inline sm_real *sm_ctx_grad(const sm_ctx *c, int i) {
    if (i < 0 || !c->pv->grad) return NULL;
    sm_real *g = sm_params_grad(c->pv, i);
    if (c->fresh && c->fresh[i]) {
        memset(g, 0, sizeof(sm_real) * c->pv->p[i].numel);
        c->fresh[i] = 0;
    }
    return g;
}
/* the gradient of tensor i, *set = 1 when the caller must write every value of it with = (it was
 * fresh: garbage, nothing of this backward in it yet), 0 when it accumulates as usual */
static inline sm_real *sm_ctx_grad_take(const sm_ctx *c, int i, int *set) {
    *set = 0;
    if (i < 0 || !c->pv->grad) return NULL;
    if (c->fresh && c->fresh[i]) *set = 1, c->fresh[i] = 0;
    return sm_params_grad(c->pv, i);
}

#endif
