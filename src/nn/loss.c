/* Losses that write the output gradient (include/specmoe/nn/loss.h). */
#include "specmoe/nn/loss.h"

#include <math.h>
#include <string.h>

#include "specmoe/core/ops.h"

double sm_loss_crossentropy(sm_real *dlogits, sm_real *probs, sm_real *losses, const sm_real *logits, const int *y,
                            const unsigned char *mask, int N, int V, sm_real scale) {
    double l = sm_crossentropy_forward(losses, probs, logits, y, mask, N, V);
    memset(dlogits, 0, sizeof(sm_real) * (size_t)N * V);
    sm_crossentropy_backward(dlogits, probs, y, scale, N, V);
    return l;
}

double sm_loss_mse(sm_real *dpred, const sm_real *pred, const sm_real *target, int N, int F, sm_real scale) {
    size_t n = (size_t)N * F;
    memset(dpred, 0, sizeof(sm_real) * n);
    sm_mse_backward(dpred, pred, target, scale, n);
    return sm_mse_forward(pred, target, n);
}

double sm_loss_huber(sm_real *dpred, const sm_real *pred, const sm_real *target, int N, int F, double delta,
                     sm_real scale) {
    size_t n = (size_t)N * F;
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)pred[i] - (double)target[i], a = fabs(d);
        s += a <= delta ? 0.5 * d * d : delta * (a - 0.5 * delta);
        double g = a <= delta ? d : (d > 0 ? delta : -delta);
        dpred[i] = (sm_real)(scale * g / (double)n);
    }
    return n ? s / (double)n : 0;
}
