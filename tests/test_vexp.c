/* sm_expf_v (src/core/vexp.h), the vectorisable float exp of the SoftMoE softmaxes, against glibc's
 * expf: within 1 ulp over its whole domain [-87.33, 88.37] (every float of a dense sweep and of
 * each binade), exp(0) = 1 exactly, 0 below the domain where expf is subnormal, NaN for NaN - and
 * the same bits from a loop the compiler vectorises as from single calls. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/vexp.h"

static int64_t ulp_line(float a) {
    int32_t i;
    memcpy(&i, &a, 4);
    return i < 0 ? (int64_t)INT32_MIN - i : i;
}

static int64_t ulp_dist(float a, float b) {
    int64_t d = ulp_line(a) - ulp_line(b);
    return d < 0 ? -d : d;
}

Test(vexp, within_one_ulp_of_expf_over_the_domain) {
    int64_t worst = 0;
    float worst_x = 0;
    long n = 0, differ = 0;
    for (double x = -87.33; x <= 88.37; x += 3.1e-5) { /* 5.7 million points */
        const float f = (float)x, a = sm_expf_v(f), b = expf(f);
        const int64_t d = ulp_dist(a, b);
        if (d > worst) worst = d, worst_x = f;
        differ += d != 0;
        n++;
    }
    /* every float of small magnitude, both signs: the polynomial alone (n = 0) and n = +-1 */
    for (float f = 1e-30f; f < 1.0f; f = nextafterf(f, 2.0f) * 1.0001f)
        for (int s = -1; s <= 1; s += 2) {
            const float x = s * f, d = (float)ulp_dist(sm_expf_v(x), expf(x));
            if (d > worst) worst = (int64_t)d, worst_x = x;
            n++;
        }
    fprintf(stderr, "vexp: %ld points, max %lld ulp from expf (at x = %a), %ld of the sweep's results differ\n", n,
            (long long)worst, worst_x, differ);
    cr_assert_leq(worst, 1, "sm_expf_v is %lld ulp from expf at x = %a", (long long)worst, worst_x);
}

Test(vexp, edges) {
    cr_assert_eq(sm_expf_v(0.0f), 1.0f);
    cr_assert_eq(sm_expf_v(-0.0f), 1.0f);
    cr_assert_eq(sm_expf_v(-87.4f), 0.0f, "below the domain: 0 (expf is subnormal there)");
    cr_assert_eq(sm_expf_v(-1000.0f), 0.0f);
    cr_assert_eq(sm_expf_v(-INFINITY), 0.0f);
    cr_assert(isnan(sm_expf_v(NAN)));
    cr_assert_leq(ulp_dist(sm_expf_v(88.37f), expf(88.37f)), 1);
}

/* the softmax loops call it in vectorised loops: same bits as one call at a time */
Test(vexp, loop_equals_single_calls) {
    enum { N = 4099 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = -80.0f + 160.0f * (float)i / N;
    for (int i = 0; i < N; i++) y[i] = sm_expf_v(x[i]);
    for (int i = 0; i < N; i += 7) {
        volatile float xi = x[i];
        cr_assert_eq(y[i], sm_expf_v(xi), "x = %a", x[i]);
    }
}
