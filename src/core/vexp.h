/* sm_expf_v: exp of a float written so that a loop of calls vectorises (no libm call, no branch, no
 * float-to-int conversion): the softmaxes of the SoftMoE router take an exp per logit, two logit
 * matrices of (tokens x slots) per forward, and glibc's scalar expf was a quarter of a SoftMoE DQN
 * update (BENCHMARKS.md, "SoftMoE in the DQN update"). A private header of the core layer ("core/vexp.h").
 *
 * Domain: x <= 88.7 (the softmaxes call it on logits minus a maximum, x <= 0). Below -87.33 the
 * result is 0 where expf gives a subnormal (an absolute difference under 1.2e-38); NaN gives NaN.
 * Accuracy, measured by tests/test_vexp.c against glibc's expf (correctly rounded in practice) over
 * [-87.3, 88.7]: at most 2 ulp apart (the test holds that bound and prints the largest difference).
 *
 * How: x = n ln2 + r with n = round(x / ln2) (the 1.5 2^23 rounding trick, whose low mantissa bits
 * give n) and r = x - n ln2 in two steps, ln2 = L1 + L2 with L1 = 0.693359375 (9 significant bits,
 * so n L1 is exact for |n| <= 2^15: Cody and Waite's split); |r| <= ln2 / 2 + tiny. Then
 * exp(r) = 1 + r + r^2/2! + ... + r^7/7! by Horner's rule: the first omitted term is at most
 * 0.347^8 / 8! = 5.6e-9 relative, a tenth of an ulp. Last, exp(x) = 2^n exp(r) by adding n to the
 * exponent field (2^n built from its bits, -126 <= n <= 127 after the clamp). Every operation is a
 * separate IEEE multiply or add (the build has -ffp-contract=off under -std=c11), so the result is
 * the same in the scalar loop and in every vector width. */
#ifndef SPECMOE_CORE_VEXP_H
#define SPECMOE_CORE_VEXP_H

#include <stdint.h>
#include <string.h>

static inline float sm_expf_v(float x) {
    const float lo = -87.33654f, hi = 88.37f;
    const float xc = x < lo ? lo : (x > hi ? hi : x);
    const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer in the low bits */
    const float t = xc * 1.44269504088896341f + shift;
    const float n = t - shift;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440054690583e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, 4);
    /* t's mantissa holds 2^22 + n in its low bits: n + 127 is the biased exponent of 2^n */
    const uint32_t eb = (tb - 0x4B400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &eb, 4);
    const float y = p * scale;
    return x < lo ? 0.0f : y;
}

#endif
