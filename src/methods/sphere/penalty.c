/* SPHERE's penalty, Eq. 26 (include/specmoe/methods/sphere/sphere.h has the formula, its gradient
 * and where they come from). The Gram is formed in whichever space is smaller: T D min(T, D)
 * multiply-adds, never an eigendecomposition. */
#include "specmoe/methods/sphere/sphere.h"

#include "specmoe/core/ops.h"

size_t sm_sphere_work_values(int T, int D) {
    const size_t n = (size_t)(T < D ? T : D);
    return n * n + (size_t)T * D;
}

double sm_sphere_penalty(const sm_real *phi, int T, int D, sm_real *dphi, sm_real scale, sm_real *work) {
    const int sample = T < D; /* the T x T Gram is the smaller one */
    const int n = sample ? T : D;
    sm_real *G = work, *P = work + (size_t)n * n;
    const sm_real inv_t = (sm_real)1 / T;
    /* G = phi phi^T / T (T x T) or phi^T phi / T (D x D) */
    if (sample) sm_gemm(0, 1, T, T, D, inv_t, phi, D, phi, D, 0, G, T);
    else sm_gemm(1, 0, D, D, T, inv_t, phi, D, phi, D, 0, G, D);
    double fro = 0, tr = 0;
    for (int i = 0; i < n; i++) {
        tr += G[(size_t)i * n + i];
        for (int j = 0; j < n; j++) fro += (double)G[(size_t)i * n + j] * G[(size_t)i * n + j];
    }
    const double L = fro - tr * tr / D;
    if (dphi) {
        /* P = G phi (sample space) or phi G (feature space), (T, D) */
        if (sample) sm_gemm(0, 0, T, D, T, 1, G, T, phi, D, 0, P, D);
        else sm_gemm(0, 0, T, D, D, 1, phi, D, G, D, 0, P, D);
        const sm_real a = (sm_real)(4.0 * scale / T), b = (sm_real)(4.0 * scale * tr / ((double)T * D));
        for (size_t i = 0; i < (size_t)T * D; i++) dphi[i] += a * P[i] - b * phi[i];
    }
    return L;
}
