/* sm_sincos and both lanes of sm_sincos2 (src/core/sincos.h) against glibc's sin and cos: at most
 * 1 ulp apart over millions of points in the ranges the environments use and up to the 2^20 bound,
 * near multiples of pi/2 where the argument reduction cancels, and bit for bit glibc's own results
 * outside the fast range (0, -0, tiny, huge, inf, NaN). Each range prints its largest difference
 * and how many results differ at all. The four-lane fast path (sm_sincos4_fast, Acrobot's batched
 * step), compiled without and with AVX2, gives every lane the two-lane one's bits and mask. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/sincos.h"
#include "specmoe/core/core.h"

/* distance in units in the last place: the bit patterns as a monotone integer line */
static uint64_t ulp_dist(double a, double b) {
    int64_t i, j;
    memcpy(&i, &a, 8);
    memcpy(&j, &b, 8);
    if (i < 0) i = INT64_MIN - i;
    if (j < 0) j = INT64_MIN - j;
    return i > j ? (uint64_t)i - (uint64_t)j : (uint64_t)j - (uint64_t)i;
}

typedef struct {
    uint64_t max_ulp, n_diff, n;
    double worst_x;
} stats;

static void check_lane(stats *st, double x, double s, double c) {
    double gs = sin(x), gc = cos(x);
    uint64_t ds = ulp_dist(s, gs), dc = ulp_dist(c, gc);
    uint64_t d = ds > dc ? ds : dc;
    st->n++;
    st->n_diff += (ds != 0) + (dc != 0);
    if (d > st->max_ulp) {
        st->max_ulp = d;
        st->worst_x = x;
    }
}

/* x through sm_sincos, and through both lanes of sm_sincos2 next to the previous point (so a lane
 * in the fast range may sit next to one that falls back to libm) */
static void check_one(stats *st, double x) {
    static double prev = 0.5;
    double s, c, xs[2] = {x, prev}, ss[2], cc[2];
    sm_sincos(x, &s, &c);
    check_lane(st, x, s, c);
    sm_sincos2(xs, ss, cc);
    for (int i = 0; i < 2; i++) check_lane(st, xs[i], ss[i], cc[i]);
    prev = x;
}

static void report(const char *what, const stats *st) {
    fprintf(stderr, "sincos %-34s %8llu evaluations: max %llu ulp (at x = %a), %llu of %llu results differ\n", what,
            (unsigned long long)st->n, (unsigned long long)st->max_ulp, st->worst_x, (unsigned long long)st->n_diff,
            (unsigned long long)(2 * st->n));
    cr_assert_leq(st->max_ulp, 1, "%s: %llu ulp from glibc at x = %a", what, (unsigned long long)st->max_ulp, st->worst_x);
}

enum { kPoints = 1000000 };

/* uniform in [-r, r] */
static void check_uniform(const char *what, double r, uint64_t seed) {
    sm_rng g;
    sm_rng_seed(&g, seed);
    stats st = {0};
    for (int i = 0; i < kPoints; i++) check_one(&st, r * (2 * sm_rng_uniform(&g) - 1));
    report(what, &st);
}

Test(sincos, uniform_ranges_within_1ulp_of_glibc) {
    check_uniform("[-pi/4, pi/4]", M_PI / 4, 1);
    check_uniform("[-pi, pi] (pendulum, acrobot)", M_PI, 2);
    check_uniform("[-4 pi, 4 pi] (acrobot's RK4 stages)", 4 * M_PI, 3);
    check_uniform("[-100, 100] (pendulum's angle)", 100, 4);
    check_uniform("[-2^20, 2^20]", 0x1p20, 5);
}

/* magnitudes log-uniform over 2^-30 .. 2^20, both signs: every binade, including the tiny ones
 * that fall back to libm */
Test(sincos, every_binade_within_1ulp_of_glibc) {
    sm_rng g;
    sm_rng_seed(&g, 6);
    stats st = {0};
    for (int i = 0; i < kPoints; i++) {
        double x = exp2(-30 + 50 * sm_rng_uniform(&g));
        check_one(&st, sm_rng_below(&g, 2) ? x : -x);
    }
    report("|x| log-uniform in [2^-30, 2^20]", &st);
}

/* Near k pi/2 the reduction cancels most of x: the double nearest to k pi/2 (k pi/2 rounded from
 * its double-double value) and its neighbours a few ulps either side, and points a small random
 * distance away, for k up to the 2^20 bound. */
Test(sincos, near_multiples_of_pi_over_2_within_1ulp_of_glibc) {
    const double pio2_hi = 0x1.921fb54442d18p+0, pio2_lo = 0x1.1a62633145c07p-54; /* pi/2 */
    sm_rng g;
    sm_rng_seed(&g, 7);
    stats st = {0};
    const int kmax = (int)(0x1p20 / M_PI * 2);
    for (int i = 0; i < kPoints / 20; i++) {
        int k = i < 2000 ? i - 1000 : (int)sm_rng_below(&g, 2 * (uint64_t)kmax + 1) - kmax;
        double x0 = k * pio2_hi + k * pio2_lo;
        if (fabs(x0) > 0x1p20) continue;
        double x = x0;
        for (int j = 0; j < 8; j++) x = nextafter(x, INFINITY);
        for (int j = 0; j < 16; j++, x = nextafter(x, -INFINITY)) check_one(&st, x);
        for (int j = 0; j < 4; j++) check_one(&st, x0 + ldexp(2 * sm_rng_uniform(&g) - 1, -(int)sm_rng_below(&g, 40)));
    }
    report("near k pi/2, |k| < 2^20 2/pi", &st);
}

/* outside [2^-26, 2^20] in magnitude the result is glibc's own, bit for bit (NaN for inf and NaN) */
Test(sincos, special_and_out_of_range_inputs_are_glibcs) {
    const double xs[] = {0.0, -0.0, 0x1p-1074, -0x1p-1074, 0x1p-1022, 1e-300, 0x1p-27, -0x1.fffffffffffffp-27,
                         0x1.0000000000001p20, -0x1p21, 1e6 * M_PI, 1e22, -1e300, 0x1.fffffffffffffp1023,
                         INFINITY, -INFINITY, NAN, -NAN};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        double x = xs[i], s, c, gs = sin(x), gc = cos(x), pair[2] = {1.0, x}, ss[2], cc[2];
        sm_sincos(x, &s, &c);
        sm_sincos2(pair, ss, cc);
        cr_assert(memcmp(&s, &ss[1], 8) == 0 && memcmp(&c, &cc[1], 8) == 0, "sm_sincos2's lane 1 at %a", x);
        if (isnan(gs)) cr_assert(isnan(s), "sin(%a)", x);
        else cr_assert(memcmp(&s, &gs, 8) == 0, "sin(%a): %a vs glibc %a", x, s, gs);
        if (isnan(gc)) cr_assert(isnan(c), "cos(%a)", x);
        else cr_assert(memcmp(&c, &gc, 8) == 0, "cos(%a): %a vs glibc %a", x, c, gc);
    }
    /* the edges of the fast range are inside it, and still within 1 ulp; so is the double below 2^20
     * nearest a multiple of pi/2 (29 pi/2, 2^-60.5 away), and its neighbours */
    stats st = {0};
    const double edges[] = {0x1p-26, -0x1p-26, 0x1.0000000000001p-26, 0x1p20, -0x1p20, 0x1.fffffffffffffp19,
                            0x1.6c6cbc45dc8dep+5, 0x1.6c6cbc45dc8ddp+5, 0x1.6c6cbc45dc8dfp+5, -0x1.6c6cbc45dc8dep+5};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) check_one(&st, edges[i]);
    report("edges of the fast range", &st);
}

/* sm_sincos4_fast on x[0..3]: the results and the fast-path mask per lane; compiled for the test's
 * target (x86-64-v2: a four-lane vector is two SSE2 registers) and, where the CPU has it, for AVX2,
 * as envs/classic/acrobot.c compiles its batched step */
static inline __attribute__((always_inline)) void four_lanes_(const double x[4], double s[4], double c[4], int64_t f[4]) {
    sm_v4d_ xv, sv, cv;
    sm_v4i_ fv;
    memcpy(&xv, x, sizeof xv);
    sm_sincos4_fast(&xv, &sv, &cv, &fv);
    memcpy(s, &sv, sizeof sv);
    memcpy(c, &cv, sizeof cv);
    memcpy(f, &fv, sizeof fv);
}
static void four_lanes_base(const double x[4], double s[4], double c[4], int64_t f[4]) { four_lanes_(x, s, c, f); }
#if defined(__x86_64__) && !defined(__AVX2__)
__attribute__((target("avx2"))) static void four_lanes_avx2(const double x[4], double s[4], double c[4], int64_t f[4]) {
    four_lanes_(x, s, c, f);
}
#endif

/* the four lanes of x against sm_sincos2_fast on (x0, x1) and (x2, x3): the same mask, and where
 * the fast path applies the same bits; returns the lanes on the fast path */
static int check_four(void (*four)(const double *, double *, double *, int64_t *), const double x[4]) {
    double s[4], c[4];
    int64_t f[4];
    four(x, s, c, f);
    int n = 0;
    for (int h = 0; h < 2; h++) {
        sm_v2d_ xv = {x[2 * h], x[2 * h + 1]}, sv, cv;
        sm_v2i_ fv;
        sm_sincos2_fast(&xv, &sv, &cv, &fv);
        double s2[2], c2[2];
        memcpy(s2, &sv, sizeof sv);
        memcpy(c2, &cv, sizeof cv);
        for (int j = 0; j < 2; j++) {
            const int l = 2 * h + j;
            cr_assert_eq(f[l], fv[j], "fast-path mask at %a", x[l]);
            if (!fv[j]) continue;
            n++;
            cr_assert(memcmp(&s[l], &s2[j], 8) == 0 && memcmp(&c[l], &c2[j], 8) == 0, "lane %d at %a: %a %a vs %a %a",
                      l, x[l], s[l], c[l], s2[j], c2[j]);
        }
    }
    return n;
}

Test(sincos, four_lanes_are_two_lanes_bit_for_bit) {
    void (*kernels[2])(const double *, double *, double *, int64_t *) = {four_lanes_base, NULL};
#if defined(__x86_64__) && !defined(__AVX2__)
    if (__builtin_cpu_supports("avx2")) kernels[1] = four_lanes_avx2;
#endif
    const double pio2_hi = 0x1.921fb54442d18p+0;
    const double special[] = {0.0, -0.0, 0x1p-27, 0x1p-26, 0x1p20, 0x1.0000000000001p20, INFINITY, NAN,
                              0x1.6c6cbc45dc8dep+5, 29 * pio2_hi, -3 * pio2_hi, 1.0};
    for (int k = 0; k < 2; k++) {
        if (!kernels[k]) continue;
        sm_rng g;
        sm_rng_seed(&g, 21);
        long fast = 0, n = 0;
        for (int i = 0; i < kPoints / 4; i++, n += 4) {
            double x[4];
            for (int l = 0; l < 4; l++) {
                switch (sm_rng_below(&g, 4)) {
                case 0: x[l] = 4 * M_PI * (2 * sm_rng_uniform(&g) - 1); break; /* acrobot's stages */
                case 1: x[l] = ldexp(2 * sm_rng_uniform(&g) - 1, (int)sm_rng_below(&g, 51) - 30); break;
                case 2: x[l] = (int)sm_rng_below(&g, 2001) - 1000; x[l] = x[l] * pio2_hi + ldexp(sm_rng_uniform(&g) - 0.5, -(int)sm_rng_below(&g, 60)); break;
                default: x[l] = special[sm_rng_below(&g, sizeof special / sizeof special[0])]; break;
                }
            }
            fast += check_four(kernels[k], x);
        }
        fprintf(stderr, "sincos four lanes (%s): %ld of %ld lanes on the fast path, all equal to two lanes\n",
                k ? "AVX2" : "base", fast, n);
        cr_assert_gt(fast, n / 2);
        cr_assert_lt(fast, n);
    }
}
