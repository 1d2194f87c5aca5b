/* Two-layer MLP expert (see include/specmoe/mlp.h). */
#include "specmoe/nn/mlp.h"

#include <string.h>

void sm_mlp_forward(sm_real *out, sm_real *hpre, sm_real *h, const sm_real *inp, sm_mlp_weights w,
                    sm_act act, int T, int C, int H, int OC) {
    sm_linear_forward(hpre, inp, w.w1, w.b1, T, C, H);
    sm_act_forward(h, hpre, (size_t)T * H, act);
    sm_linear_forward(out, h, w.w2, w.b2, T, H, OC);
}

void sm_mlp_backward(sm_real *dinp, sm_mlp_grads g, sm_real *dh, const sm_real *dout,
                     const sm_real *hpre, const sm_real *h, const sm_real *inp, sm_mlp_weights w,
                     sm_act act, int T, int C, int H, int OC) {
    /* dh (T,H) = dout @ W2, then through the activation in place: dhpre = dh * act'(hpre) */
    sm_gemm(0, 0, T, H, OC, 1, dout, OC, w.w2, H, 0, dh, H);
    sm_linear_backward(NULL, g.dw2, g.db2, dout, h, w.w2, T, H, OC);
    sm_act_backward_inplace(dh, hpre, (size_t)T * H, act);
    sm_linear_backward(dinp, g.dw1, g.db1, dh, inp, w.w1, T, C, H);
}
