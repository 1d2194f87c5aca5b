/* SSMoE eigenvector descriptors: the SVD path against the brute-force eigenvectors of W^T W under the
 * documented sign convention, the signed (not absolute) alignment with the router row, and input checks. */
#include <criterion/criterion.h>
#include <math.h>

#include "specmoe.h"
#include "specmoe/ssmoe.h"

static void fill(float *x, int n, sm_rng *r) {
    for (int i = 0; i < n; i++) x[i] = (float)sm_rng_normal(r);
}

Test(ssmoe, svd_descriptor_equals_eigenvector_bruteforce) {
    const int shapes[][3] = {{16, 8, 3}, {8, 16, 5}, {32, 12, 12}, {5, 5, 1}};
    for (int s = 0; s < 4; s++) {
        int I = shapes[s][0], d = shapes[s][1], c = shapes[s][2];
        sm_rng r;
        sm_rng_seed(&r, 10 + s);
        float *W = malloc(sizeof(float) * I * d), row[64];
        fill(W, I * d, &r);
        fill(row, d, &r);
        double a[64], b[64];
        sm_error err;
        for (int variant = 0; variant < 2; variant++) {
            const float *rr = variant ? NULL : row;
            cr_assert_eq(sm_ev_descriptor(a, W, I, d, rr, c, &err), SM_OK, "%s", err.msg);
            cr_assert_eq(sm_ev_descriptor_eig(b, W, I, d, rr, c, &err), SM_OK, "%s", err.msg);
            double diff = 0, norm = 0;
            for (int i = 0; i < d; i++) {
                diff = fmax(diff, fabs(a[i] - b[i]));
                norm = fmax(norm, fabs(a[i]));
            }
            cr_expect(diff < 1e-8, "%dx%d c=%d %s: max diff %.3g", I, d, c, variant ? "averaged" : "router", diff);
            cr_expect(norm > 0);
        }
        free(W);
    }
}

Test(ssmoe, alignment_is_signed_not_absolute) {
    /* W = diag(3, 2, 1): right singular vectors e1, e2, e3 (canonical sign +). A router row along -e1
     * scores e1 at -1: with c = 1 the signed rule picks e2 or e3 (score 0), never e1. */
    float W[9] = {3, 0, 0, 0, 2, 0, 0, 0, 1}, row[3] = {-1, 0, 0};
    double out[3];
    sm_error err;
    cr_assert_eq(sm_ev_descriptor(out, W, 3, 3, row, 1, &err), SM_OK);
    cr_expect(fabs(out[0]) < 1e-12, "picked e1 despite its negative score: %g %g %g", out[0], out[1], out[2]);
    cr_expect(fabs(out[1] - 1) < 1e-12, "ties go to the larger singular value (e2)");
    /* c = 3 averages all three */
    cr_assert_eq(sm_ev_descriptor(out, W, 3, 3, row, 3, &err), SM_OK);
    for (int i = 0; i < 3; i++) cr_expect(fabs(out[i] - 1.0 / 3) < 1e-12);
}

Test(ssmoe, bad_input_refused) {
    float W[4] = {1, 2, 3, NAN};
    double out[2];
    sm_error err;
    cr_expect_eq(sm_ev_descriptor(out, W, 2, 2, NULL, 1, &err), SM_ERR_NUMERIC);
    cr_expect_eq(sm_ev_descriptor(out, W, 0, 2, NULL, 1, &err), SM_ERR_ARG);
    cr_expect_eq(sm_ev_descriptor(out, W, 2, 2, NULL, 0, &err), SM_ERR_ARG);
}
