/* Two-layer MLP: the expert of every MoE layer, the always-on shared expert, and the dense "ffn"
 * baseline layer.  y = W2 act(W1 x + b1) + b2.
 *
 * Letters: T rows, C input width, H hidden width, OC output width.
 */
#ifndef SPECMOE_MLP_H
#define SPECMOE_MLP_H

#include "specmoe/core/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const sm_real *w1; /* (H,C) */
    const sm_real *b1; /* (H) or NULL */
    const sm_real *w2; /* (OC,H) */
    const sm_real *b2; /* (OC) or NULL */
} sm_mlp_weights;

typedef struct {
    sm_real *dw1, *db1, *dw2, *db2; /* same shapes; db1/db2 NULL when there is no bias */
} sm_mlp_grads;

/* out (T,OC); hpre (T,H) pre-activation and h (T,H) activation are saved for the backward. */
void sm_mlp_forward(sm_real *out, sm_real *hpre, sm_real *h, const sm_real *inp, sm_mlp_weights w,
                    sm_act act, int T, int C, int H, int OC);
/* dinp (T,C) += (may be NULL), grads += ...; dh (T,H) is caller scratch. */
void sm_mlp_backward(sm_real *dinp, sm_mlp_grads g, sm_real *dh, const sm_real *dout,
                     const sm_real *hpre, const sm_real *h, const sm_real *inp, sm_mlp_weights w,
                     sm_act act, int T, int C, int H, int OC);

#ifdef __cplusplus
}
#endif
#endif
