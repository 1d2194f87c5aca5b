/* sm_sincos, sm_sincos2: the sine and cosine of one double, or of two in the lanes of one vector,
 * inlined, for the hot loops of the environments (Acrobot takes two angles' sines and cosines four
 * times a step). sm_sincos2_fast, sm_sincos4_fast: the fast path alone on two or four lanes, with a
 * mask of the lanes the caller must hand to libm (Acrobot's batched step, four environments in the
 * lanes of an AVX vector). A private header of the core layer: envs (core only) and the tests
 * include it as "core/sincos.h".
 *
 * Accuracy, measured by tests/test_sincos.c against glibc's sin and cos over 3 x 10^6 evaluations
 * in each of [-pi/4, pi/4], [-pi, pi], [-4 pi, 4 pi], [-100, 100], [-2^20, 2^20], log-uniform
 * magnitudes 2^-30 .. 2^20, and at and next to the doubles nearest k pi/2: never more than 1 ulp
 * apart; about 3% of the results differ by 1 ulp and the rest are bit-identical (glibc's results
 * are correctly rounded in all but rare cases, fdlibm's kernels stay below 1 ulp). Where the fast
 * path does not apply the result is glibc's own sin(x) and cos(x), bit for bit: |x| below 2^-26
 * (0 and -0 included) or above 2^20, inf and NaN, and the rare arguments within |n| 2^-24 of a
 * multiple n pi/2.
 *
 * How (fdlibm's scheme, without branches on the fast path):
 *   1. n = the integer nearest x 2/pi (the 1.5 2^52 rounding trick, whose low mantissa bits give
 *      n mod 4), and r = x - n pi/2 as a pair y0 + y1 with pi/2 = P1 + P1T + 2^-87.9 (fdlibm's
 *      pio2_1, the first 33 bits of pi/2, and pio2_1t): n P1 is exact for |n| < 2^20 and so is x - n P1 (Sterbenz),
 *      and y0 + y1 = (x - n P1) - n P1T exactly (Fast2Sum). What is left is |n| 2^-86.3 at most
 *      (the constant's error and the rounding of n P1T). Where |r| >= |n| 2^-24 that is below
 *      2^-62 |r|, under a three-hundredth of an ulp; closer to a multiple of pi/2 (|x| below 2^20 comes
 *      as close as 2^-60.5, at x = 0x1.6c6cbc45dc8dep+5 = 29 pi/2) the call goes to libm.
 *   2. sin and cos of y0 + y1 on [-pi/4, pi/4] by fdlibm's kernels (k_sin.c, k_cos.c: polynomials
 *      of degree 13 and 14, within 2^-58 of the functions relative to them, with a first-order
 *      correction for the tail y1, and k_cos's exact split of 1 - z/2).
 *   3. the quadrant n mod 4 swaps and negates the pair through bit masks.
 *
 * The polynomial coefficients and the split of pi/2 are fdlibm's:
 *   Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
 *   Developed at SunSoft, a Sun Microsystems, Inc. business.
 *   Permission to use, copy, modify, and distribute this software is freely granted, provided
 *   that this notice is preserved.
 */
#ifndef SPECMOE_CORE_SINCOS_H
#define SPECMOE_CORE_SINCOS_H

#include <math.h>
#include <stdint.h>

/* two doubles in one SSE2 / NEON register, or four in one AVX register (GCC's vector extensions,
 * also understood by clang), their bits, and the masks their comparisons give (-1 or 0 per lane).
 * Without AVX a four-lane vector is two two-lane ones. */
typedef double sm_v2d_ __attribute__((vector_size(16)));
typedef uint64_t sm_v2u_ __attribute__((vector_size(16)));
typedef int64_t sm_v2i_ __attribute__((vector_size(16)));
typedef double sm_v4d_ __attribute__((vector_size(32)));
typedef uint64_t sm_v4u_ __attribute__((vector_size(32)));
typedef int64_t sm_v4i_ __attribute__((vector_size(32)));

/* SM_SINCOS_FAST_(NAME, VD, VU, VI) defines NAME(x, s, c, fast): the fast path on every lane of a
 * vector type VD (with VU, VI its unsigned and signed 64-bit twins): *s and *c the sine and cosine
 * of each lane of *x, and *fast -1 in the lanes where they are valid, 0 where the caller must take
 * libm's instead. One definition for every width, so that a lane's result does not depend on the
 * width (Acrobot's batched step relies on that to match its one-environment step bit for bit). The
 * vectors go by pointer: GCC warns (-Wpsabi) about 32-byte vectors passed by value without AVX. */
#define SM_SINCOS_FAST_(NAME, VD, VU, VI)                                                                    \
    static inline __attribute__((always_inline)) void NAME(const VD *x, VD *s, VD *c, VI *fast) {           \
        const double inv_pio2 = 0x1.45f306dc9c883p-1; /* 2/pi */                                             \
        /* pi/2 = P1 + P1T + 2^-87.9 */                                                                      \
        const double P1 = 0x1.921fb54400000p+0, P1T = 0x1.0b4611a626331p-34;                                 \
        const double shift = 0x1.8p52; /* adding it rounds to an integer (|x 2/pi| < 2^51) */                \
        const uint64_t abs_mask = INT64_MAX;                                                                 \
        const VD xv = *x;                                                                                    \
        VD t = xv * inv_pio2 + shift;                                                                        \
        VU n = (VU)t; /* the low mantissa bits of t: n mod 4 in two's complement */                          \
        VD fn = t - shift;                                                                                   \
        VD a = xv - fn * P1, w = fn * P1T; /* a exact */                                                     \
        VD y0 = a - w, y1 = (a - y0) - w;  /* y0 + y1 = a - w exactly (Fast2Sum, |w| < |a|) */               \
        /* the fast range: |x| in [2^-26, 2^20] (false for NaN too; below 2^-26 sin x rounds to x and     \
         * cos x to 1, which libm gets exactly, signed zeros included), and no deep cancellation          \
         * (|r| >= |n| 2^-24) */                                                                             \
        VD ax = (VD)((VU)xv & abs_mask), ay0 = (VD)((VU)y0 & abs_mask);                                      \
        VD afn = (VD)((VU)fn & abs_mask);                                                                    \
        *fast = (ax >= 0x1p-26) & (ax <= 0x1p20) & (ay0 >= afn * 0x1p-24);                                   \
                                                                                                             \
        /* fdlibm's kernels on [-pi/4, pi/4] */                                                              \
        const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,                      \
                     S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,                      \
                     S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;                      \
        const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,                      \
                     C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,                      \
                     C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;                      \
        VD z = y0 * y0, z2 = z * z, v = z * y0;                                                              \
        VD rs = S2 + z * (S3 + z * S4) + z * z2 * (S5 + z * S6);                                             \
        VD ks = y0 - ((z * (0.5 * y1 - v * rs) - y1) - v * S1);                                              \
        VD rc = z * (C1 + z * (C2 + z * C3)) + z2 * z2 * (C4 + z * (C5 + z * C6));                           \
        VD hz = 0.5 * z, w1 = 1.0 - hz;                                                                      \
        VD kc = w1 + (((1.0 - w1) - hz) + (z * rc - y0 * y1));                                               \
                                                                                                             \
        /* quadrant n mod 4: sin x = (ks, kc, -ks, -kc)[q], cos x = (kc, -ks, -kc, ks)[q], by bit masks */ \
        VU swap = -(n & 1), iks = (VU)ks, ikc = (VU)kc;                                                      \
        *s = (VD)(((iks & ~swap) | (ikc & swap)) ^ ((n & 2) << 62));                                         \
        *c = (VD)(((ikc & ~swap) | (iks & swap)) ^ (((n + 1) & 2) << 62));                                   \
    }
SM_SINCOS_FAST_(sm_sincos2_fast, sm_v2d_, sm_v2u_, sm_v2i_)
SM_SINCOS_FAST_(sm_sincos4_fast, sm_v4d_, sm_v4u_, sm_v4i_)

/* s[i] = sin(x[i]), c[i] = cos(x[i]) for i = 0, 1, both lanes at the cost of one; where either lane
 * is outside the fast path, both are libm's */
static inline void sm_sincos2(const double x[2], double s[2], double c[2]) {
    sm_v2d_ xv = {x[0], x[1]}, sv, cv;
    sm_v2i_ fast;
    sm_sincos2_fast(&xv, &sv, &cv, &fast);
    if (__builtin_expect(!(fast[0] & fast[1]), 0)) {
        for (int i = 0; i < 2; i++) {
            s[i] = sin(x[i]);
            c[i] = cos(x[i]);
        }
        return;
    }
    s[0] = sv[0];
    s[1] = sv[1];
    c[0] = cv[0];
    c[1] = cv[1];
}

/* *s = sin(x), *c = cos(x): sm_sincos2 with one lane used (a packed operation costs what a scalar one does) */
static inline void sm_sincos(double x, double *s, double *c) {
    const double xs[2] = {x, x};
    double ss[2], cc[2];
    sm_sincos2(xs, ss, cc);
    *s = ss[0];
    *c = cc[0];
}

#endif
