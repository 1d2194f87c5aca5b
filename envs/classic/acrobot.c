/* Acrobot-v1 (Sutton 1996; Sutton & Barto, "Reinforcement Learning: An Introduction", the "book"
 * dynamics of gymnasium's classic_control/acrobot): two links hanging from a pivot, the joint
 * between them driven by a torque of -1, 0 or +1 (actions 0, 1, 2).
 *
 * Rules (gymnasium's documentation):
 *   - state (t1, t2, dt1, dt2): t1 the first link's angle from straight down, t2 the second link's
 *     angle relative to the first; links of length 1 and mass 1, centres of mass at 0.5, moments of
 *     inertia 1, g = 9.8;
 *   - one step integrates the equations of motion over dt = 0.2 s with a single classical
 *     Runge-Kutta (RK4) step, the torque held constant; then t1, t2 are wrapped into [-pi, pi] and
 *     dt1, dt2 clipped to [-4 pi, 4 pi] and [-9 pi, 9 pi];
 *   - terminal when the free end is more than one link above the pivot: -cos(t1) - cos(t2 + t1) > 1;
 *   - reward -1 per step, 0 on the terminal step; time limit 500 steps;
 *   - observation (cos t1, sin t1, cos t2, sin t2, dt1, dt2); start state uniform in [-0.1, 0.1]^4.
 *
 * Equations of motion (the book version), with the torque a on the second joint:
 *   d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos t2) + I1 + I2
 *   d2 = m2 (lc2^2 + l1 lc2 cos t2) + I2
 *   phi2 = m2 lc2 g cos(t1 + t2 - pi/2)
 *   phi1 = -m2 l1 lc2 dt2^2 sin t2 - 2 m2 l1 lc2 dt2 dt1 sin t2 + (m1 lc1 + m2 l1) g cos(t1 - pi/2) + phi2
 *   ddt2 = (a + d2/d1 phi1 - m2 l1 lc2 dt1^2 sin t2 - phi2) / (m2 lc2^2 + I2 - d2^2/d1)
 *   ddt1 = -(d2 ddt2 + phi1) / d1
 *
 * Speed (BENCHMARKS.md, "Environments"):
 *   - each stage evaluates only sin/cos of t1 and t2, through exact identities: cos(t1 - pi/2) =
 *     sin t1 and cos(t1 + t2 - pi/2) = sin(t1 + t2) = sin t1 cos t2 + cos t1 sin t2. The first stage
 *     reuses the values the previous step computed for the observation (kept in the state), and the
 *     terminal test -cos t1 - cos(t1 + t2) = -cos t1 - (cos t1 cos t2 - sin t1 sin t2) needs none of
 *     its own: 4 evaluations of the pair (t1, t2) a step instead of 15 sin/cos calls;
 *   - the pair goes through sm_sincos2 (src/core/sincos.h): both angles in the two lanes of one
 *     vector, within 1 ulp of glibc's sin and cos;
 *   - the two accelerations are the solution of the 2x2 system the book eliminates, (d1 d2; d2 d3)
 *     (ddt1, ddt2) = (-phi1, b2) with d3 = m2 lc2^2 + I2 and b2 = a - m2 l1 lc2 dt1^2 sin t2 - phi2,
 *     by Cramer's rule with one reciprocal of det = d1 d3 - d2^2 (see ab_deriv): one division a
 *     stage instead of three in a row.
 *   - the vector steps its environments through step_batch (ab_step_batch), four at a time in the
 *     lanes of vectors: one environment's step is a chain of about 210 cycles of dependent
 *     arithmetic, and four independent chains side by side keep the core busy where one leaves it
 *     waiting (see "Batched step" below).
 * The results differ from the formulas as written only by double rounding (about 1e-16 relative),
 * far below the float observation's resolution. */
#include <math.h>

#include "classic.h"
#include "core/sincos.h"
#include "draw.h"

#define AB_L1 1.0
#define AB_L2 1.0
#define AB_M1 1.0
#define AB_M2 1.0
#define AB_LC1 0.5
#define AB_LC2 0.5
#define AB_I1 1.0
#define AB_I2 1.0
#define AB_G 9.8
#define AB_DT 0.2
#define AB_MAX_VEL1 (4 * M_PI)
#define AB_MAX_VEL2 (9 * M_PI)

typedef struct {
    sm_rng rng; /* first: classic_init seeds it */
    double s[4]; /* t1, t2, dt1, dt2 */
    double cs[4]; /* cos t1, sin t1, cos t2, sin t2 of s */
} acrobot;

/* AB_DEFINE_DERIV(NAME, T) defines NAME(s, cs, a, ds): the time derivative ds of the state
 * s = (t1, t2, dt1, dt2) under torque *a, given cs = (cos t1, sin t1, cos t2, sin t2), over a type T
 * that is double or a vector of doubles with one environment per lane (GCC's vector extensions,
 * where a scalar constant applies to every lane). The one text serves both, so the one-environment
 * step (T = double) and the batched one (T = sm_v4d_) evaluate the same operations in the same
 * order and agree bit for bit. Vectors go by pointer (GCC warns about 32-byte vectors passed by
 * value without AVX).
 *
 * The book's ddt2 multiplied through by d1, and ddt1 = -(d2 ddt2 + phi1)/d1 with that ddt2
 * substituted, are Cramer's rule for (d1 d2; d2 d3) (ddt1, ddt2) = (-phi1, b2):
 *   ddt2 = (d1 b2 + d2 phi1) / det,  ddt1 = -(d3 phi1 + d2 b2) / det,  det = d1 d3 - d2^2.
 * One division, taken as soon as cos t2 is known, replaces three dependent ones (d2/d1, then the
 * quotient for ddt2, then the one for ddt1); the two accelerations no longer wait on each
 * other. Accuracy: the matrix is symmetric positive definite with a condition number of at
 * most 10.8 (eigenvalues 5.26 and 0.49 at cos t2 = 1, the worst case), and det does not cancel
 * (d1 d3 = 1.25 (3.5 + cos t2) is in [3.125, 5.625], d2^2 in [0.5625, 3.0625], det = 2.8125 -
 * cos^2 t2 / 4 in [2.5625, 2.8125]), so Cramer's rule is forward stable, as the book's
 * elimination (pivot d1 >= 2.5) is: both land within about the condition number times a few
 * ulps of the exact (ddt1, ddt2), relative to its norm - around 1e-15, against the 6e-8 of the
 * float observation. */
#define AB_DEFINE_DERIV(NAME, T)                                                                                   \
    static inline __attribute__((always_inline)) void NAME(const T s[4], const T cs[4], const T *a, T ds[4]) {   \
        const T dt1 = s[2], dt2 = s[3], c1 = cs[0], s1 = cs[1], c2 = cs[2], s2 = cs[3];                           \
        T d1 = AB_M1 * AB_LC1 * AB_LC1 + AB_M2 * (AB_L1 * AB_L1 + AB_LC2 * AB_LC2 + 2 * AB_L1 * AB_LC2 * c2) +    \
               AB_I1 + AB_I2;                                                                                      \
        T d2 = AB_M2 * (AB_LC2 * AB_LC2 + AB_L1 * AB_LC2 * c2) + AB_I2;                                           \
        T phi2 = AB_M2 * AB_LC2 * AB_G * (s1 * c2 + c1 * s2); /* cos(t1 + t2 - pi/2) */                           \
        T phi1 = -AB_M2 * AB_L1 * AB_LC2 * dt2 * dt2 * s2 - 2 * AB_M2 * AB_L1 * AB_LC2 * dt2 * dt1 * s2 +          \
                 (AB_M1 * AB_LC1 + AB_M2 * AB_L1) * AB_G * s1 /* cos(t1 - pi/2) */ + phi2;                        \
        const double d3 = AB_M2 * AB_LC2 * AB_LC2 + AB_I2;                                                        \
        T inv_det = 1.0 / (d1 * d3 - d2 * d2);                                                                    \
        T b2 = *a - AB_M2 * AB_L1 * AB_LC2 * dt1 * dt1 * s2 - phi2;                                               \
        T ddt2 = (d1 * b2 + d2 * phi1) * inv_det;                                                                 \
        T ddt1 = -(d3 * phi1 + d2 * b2) * inv_det;                                                                \
        ds[0] = dt1;                                                                                              \
        ds[1] = dt2;                                                                                              \
        ds[2] = ddt1;                                                                                             \
        ds[3] = ddt2;                                                                                             \
    }
AB_DEFINE_DERIV(ab_deriv, double)
AB_DEFINE_DERIV(ab_deriv4, sm_v4d_)

/* x wrapped into [lo, hi] by whole periods (gymnasium's wrap) */
static double ab_wrap(double x, double lo, double hi) {
    const double period = hi - lo;
    while (x > hi) x -= period;
    while (x < lo) x += period;
    return x;
}

/* cs = (cos t1, sin t1, cos t2, sin t2) of the angles (t1, t2) = y[0], y[1], in the two lanes of
 * one vector */
static inline __attribute__((always_inline)) void ab_trig(const double y[4], double cs[4]) {
    double sn[2], cn[2];
    sm_sincos2(y, sn, cn);
    cs[0] = cn[0];
    cs[1] = sn[0];
    cs[2] = cn[1];
    cs[3] = sn[1];
}

/* AB_DEFINE_RK4(NAME, T, DERIV, TRIG) defines NAME(s, cs, a, y): one classical RK4 step of length
 * dt from the state s (cs its sines and cosines, from the previous step) under the torque *a,
 * into y, before the wrap and the clip; TRIG(y, cs) gives the sines and cosines of a stage point's
 * angles. One text for double and for the vector of four environments, as AB_DEFINE_DERIV. */
#define AB_DEFINE_RK4(NAME, T, DERIV, TRIG)                                                                  \
    static inline __attribute__((always_inline)) void NAME(const T s[4], const T cs[4], const T *a, T y[4]) { \
        T k1[4], k2[4], k3[4], k4[4], c[4];                                                                    \
        DERIV(s, cs, a, k1);                                                                                   \
        for (int i = 0; i < 4; i++) y[i] = s[i] + AB_DT / 2 * k1[i];                                           \
        TRIG(y, c);                                                                                            \
        DERIV(y, c, a, k2);                                                                                    \
        for (int i = 0; i < 4; i++) y[i] = s[i] + AB_DT / 2 * k2[i];                                           \
        TRIG(y, c);                                                                                            \
        DERIV(y, c, a, k3);                                                                                    \
        for (int i = 0; i < 4; i++) y[i] = s[i] + AB_DT * k3[i];                                               \
        TRIG(y, c);                                                                                            \
        DERIV(y, c, a, k4);                                                                                    \
        for (int i = 0; i < 4; i++) y[i] = s[i] + AB_DT / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);       \
    }
AB_DEFINE_RK4(ab_rk4, double, ab_deriv, ab_trig)

/* Takes the sines and cosines of the new state's angles (for the observation and the next step's
 * first stage) and writes the observation. */
static void ab_obs(acrobot *e, float *obs) {
    ab_trig(e->s, e->cs);
    for (int i = 0; i < 4; i++) obs[i] = (float)e->cs[i];
    obs[4] = (float)e->s[2];
    obs[5] = (float)e->s[3];
}

static void ab_reset(void *st, float *obs) {
    acrobot *e = st;
    for (int i = 0; i < 4; i++) e->s[i] = 0.2 * sm_rng_uniform(&e->rng) - 0.1;
    ab_obs(e, obs);
}

/* -cos t1 - cos(t2 + t1) > 1, with cos(t1 + t2) = cos t1 cos t2 - sin t1 sin t2 */
#define AB_HEIGHT(cs) (-(cs)[0] - ((cs)[0] * (cs)[2] - (cs)[1] * (cs)[3]))

static void ab_step(void *st, const int *a, const float *a_box, float *obs, float *reward, unsigned char *terminal) {
    (void)a_box;
    acrobot *e = st;
    const double torque = (double)(*a - 1); /* actions 0, 1, 2: torques -1, 0, +1 */
    double y[4];
    ab_rk4(e->s, e->cs, &torque, y);
    e->s[0] = ab_wrap(y[0], -M_PI, M_PI);
    e->s[1] = ab_wrap(y[1], -M_PI, M_PI);
    e->s[2] = classic_clip(y[2], -AB_MAX_VEL1, AB_MAX_VEL1);
    e->s[3] = classic_clip(y[3], -AB_MAX_VEL2, AB_MAX_VEL2);
    ab_obs(e, obs);
    *terminal = AB_HEIGHT(e->cs) > 1.0;
    *reward = *terminal ? 0.0f : -1.0f;
}

/* ---------------------------------------------------------------------------------------------- */
/* Batched step: four environments in the lanes of vectors of four doubles.
 *
 * One environment's step is latency bound (BENCHMARKS.md, "Environments"): stage 4's angles wait on
 * stage 2's accelerations, those on a sine/cosine and a division, and so on, about 210 cycles in a
 * row, while the core could issue several times the work. Four environments, one per lane of AVX
 * registers (four doubles each), make four independent chains of the same length for little more
 * than the instructions of one. The environments' states stay where the vector keeps them (one
 * struct each); each group of four is gathered into vectors, stepped, and scattered back.
 *
 * Every lane runs the one-environment step's arithmetic: the same AB_DEFINE_DERIV and AB_DEFINE_RK4
 * text, the sine/cosine kernel of the same SM_SINCOS_FAST_ (src/core/sincos.h), and the wrap, clip
 * and terminal test done with masks that select the same values the scalar branches do. Where
 * sm_sincos2 would hand an environment's pair of angles to libm (an angle outside the fast path),
 * the lane takes sm_sincos2's result itself. So the batch equals n calls of ab_step bit for bit
 * (tests/test_env_classic.c checks it over thousands of steps and resets), and results
 * do not depend on how the vector groups its environments or on the CPU's instruction set. The
 * compiler must not contract a * b + c into a fused multiply-add, which rounds once instead of
 * twice: the Makefile's -std=c11 implies -ffp-contract=off, and the AVX2 kernel is compiled for
 * "avx2" without "fma". */

/* cs = (cos t1, sin t1, cos t2, sin t2) of the angles y[0], y[1] of four environments; an
 * environment whose pair sm_sincos2 would not take on its fast path gets sm_sincos2's answer */
static inline __attribute__((always_inline)) void ab_trig4(const sm_v4d_ y[4], sm_v4d_ cs[4]) {
    sm_v4i_ f1, f2;
    sm_sincos4_fast(&y[0], &cs[1], &cs[0], &f1);
    sm_sincos4_fast(&y[1], &cs[3], &cs[2], &f2);
    sm_v4i_ f = f1 & f2;
    if (__builtin_expect(!(f[0] & f[1] & f[2] & f[3]), 0)) {
        for (int j = 0; j < 4; j++) {
            if (f[j]) continue;
            double yj[4] = {y[0][j], y[1][j]}, c[4];
            ab_trig(yj, c);
            for (int i = 0; i < 4; i++) cs[i][j] = c[i];
        }
    }
}
AB_DEFINE_RK4(ab_rk4_4, sm_v4d_, ab_deriv4, ab_trig4)

/* x (a vector lvalue) with the lanes where mask is set replaced by those of r: a select on bits,
 * no arithmetic, so x's other values, -0 included, pass unchanged (a macro: 32-byte vectors do not
 * go by value, see AB_DEFINE_DERIV) */
#define AB_SELECT4(x, mask, r) ((x) = (sm_v4d_)(((sm_v4i_)(x) & ~(mask)) | ((sm_v4i_)(r) & (mask))))
/* member f of the four environments e[0..3], one per lane */
#define AB_LANES(f) ((sm_v4d_){e[0].f, e[1].f, e[2].f, e[3].f})

/* GCC 12 says s "may be used uninitialized" in the AVX2 kernel (after scalar replacement of
 * aggregates splits the array; gone with -fno-tree-sra): a false positive, every element is set
 * where s is declared. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* ab_step on the four environments e[0..3] */
static inline __attribute__((always_inline)) void ab_step4(acrobot *e, const int *a, float *obs, float *reward,
                                                           unsigned char *terminal) {
    const sm_v4d_ s[4] = {AB_LANES(s[0]), AB_LANES(s[1]), AB_LANES(s[2]), AB_LANES(s[3])};
    sm_v4d_ cs[4] = {AB_LANES(cs[0]), AB_LANES(cs[1]), AB_LANES(cs[2]), AB_LANES(cs[3])}, y[4];
    const sm_v4d_ torque = {(double)(a[0] - 1), (double)(a[1] - 1), (double)(a[2] - 1), (double)(a[3] - 1)};
    ab_rk4_4(s, cs, &torque, y);
    /* ab_wrap: one period off where an angle left [-pi, pi], as ab_wrap's first pass through its
     * loops, then ab_wrap itself on any lane still outside (only when a step turned an angle by more
     * than a period), which continues the same sequence of additions or subtractions */
    const sm_v4d_ zero = {0, 0, 0, 0};
    for (int i = 0; i < 2; i++) {
        AB_SELECT4(y[i], y[i] > M_PI, y[i] - (M_PI - -M_PI));
        AB_SELECT4(y[i], y[i] < -M_PI, y[i] + (M_PI - -M_PI));
        sm_v4i_ out = (y[i] > M_PI) | (y[i] < -M_PI);
        if (__builtin_expect(out[0] | out[1] | out[2] | out[3], 0))
            for (int j = 0; j < 4; j++) y[i][j] = ab_wrap(y[i][j], -M_PI, M_PI);
    }
    /* classic_clip: x < lo ? lo : x > hi ? hi : x */
    AB_SELECT4(y[2], y[2] > AB_MAX_VEL1, zero + AB_MAX_VEL1);
    AB_SELECT4(y[2], y[2] < -AB_MAX_VEL1, zero - AB_MAX_VEL1);
    AB_SELECT4(y[3], y[3] > AB_MAX_VEL2, zero + AB_MAX_VEL2);
    AB_SELECT4(y[3], y[3] < -AB_MAX_VEL2, zero - AB_MAX_VEL2);
    ab_trig4(y, cs);
    sm_v4i_ term = AB_HEIGHT(cs) > 1.0;
    for (int j = 0; j < 4; j++) {
        for (int i = 0; i < 4; i++) {
            e[j].s[i] = y[i][j];
            e[j].cs[i] = cs[i][j];
            obs[6 * j + i] = (float)cs[i][j];
        }
        obs[6 * j + 4] = (float)y[2][j];
        obs[6 * j + 5] = (float)y[3][j];
        terminal[j] = term[j] != 0;
        reward[j] = term[j] ? 0.0f : -1.0f;
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* n environments: groups of four through ab_step4, the rest through ab_step */
static inline __attribute__((always_inline)) void ab_step_lanes(void *states, int n, const int *a, float *obs,
                                                                float *reward, unsigned char *terminal) {
    acrobot *e = states;
    int i = 0;
    for (; i + 4 <= n; i += 4) ab_step4(e + i, a + i, obs + 6 * i, reward + i, terminal + i);
    for (; i < n; i++) ab_step(e + i, a + i, NULL, obs + 6 * i, reward + i, terminal + i);
}

/* The kernel needs AVX2: four doubles a register, and 256-bit integer operations for the masks.
 * The Makefile builds for x86-64-v2 (SSE4.2, no AVX), so it is the same code compiled for "avx2"
 * (not "fma": see above) and chosen at run time. Without AVX2 each environment takes ab_step: the
 * same kernel on SSE2 (a four-lane vector as two registers, which spill) measured slower than one
 * environment at a time, 6.9M against 8.3M steps per CPU second (BENCHMARKS.md). */
#if defined(__AVX2__)
#define AB_AVX2_KERNEL 1
#define AB_CPU_HAS_AVX2() 1
static void ab_step_batch_avx2(void *states, int n, const int *a, float *obs, float *reward, unsigned char *terminal) {
    ab_step_lanes(states, n, a, obs, reward, terminal);
}
#elif defined(__x86_64__) && defined(__GNUC__)
#define AB_AVX2_KERNEL 1
#define AB_CPU_HAS_AVX2() __builtin_cpu_supports("avx2")
__attribute__((target("avx2"))) static void ab_step_batch_avx2(void *states, int n, const int *a, float *obs,
                                                              float *reward, unsigned char *terminal) {
    ab_step_lanes(states, n, a, obs, reward, terminal);
}
#endif

/* Which way ab_step_batch steps: -1 (the default) the AVX2 kernel if the CPU has AVX2, else ab_step
 * per environment; 0 ab_step per environment; 1 the AVX2 kernel (the caller checked the CPU). For
 * the tests (tests/test_env_classic.c), which compare both with the vector's per-environment path;
 * in no header. */
int sm_acrobot_batch_avx2 = -1;

static void ab_step_batch(void *states, int n, const int *a, const float *a_box, float *obs, float *reward,
                          unsigned char *terminal) {
    (void)a_box;
#ifdef AB_AVX2_KERNEL
    int avx2 = sm_acrobot_batch_avx2;
    if (avx2 < 0) avx2 = AB_CPU_HAS_AVX2();
    if (avx2) {
        ab_step_batch_avx2(states, n, a, obs, reward, terminal);
        return;
    }
#endif
    acrobot *e = states;
    for (int i = 0; i < n; i++) ab_step(e + i, a + i, NULL, obs + 6 * i, reward + i, terminal + i);
}

/* The pivot in the middle, the two links, and the line the free end must rise above. */
static void ab_render(const void *st, unsigned char *rgb, int h, int w) {
    const acrobot *e = st;
    const double bound = AB_L1 + AB_L2 + 0.2;
    draw_view v = draw_begin(rgb, h, w, -bound, bound, -bound, bound, kDrawWhite);
    double x1 = AB_L1 * sin(e->s[0]), y1 = -AB_L1 * cos(e->s[0]);
    double x2 = x1 + AB_L2 * sin(e->s[0] + e->s[1]), y2 = y1 - AB_L2 * cos(e->s[0] + e->s[1]);
    draw_line(&v, -bound, 1.0, bound, 1.0, 0.02, kDrawBlack);
    draw_line(&v, 0, 0, x1, y1, 0.12, kDrawBlue);
    draw_line(&v, x1, y1, x2, y2, 0.12, kDrawBlue);
    draw_disc(&v, 0, 0, 0.08, kDrawBrown);
    draw_disc(&v, x1, y1, 0.08, kDrawBrown);
}

/* gymnasium's observation_space */
static const float ab_high[6] = {1.0f, 1.0f, 1.0f, 1.0f, (float)AB_MAX_VEL1, (float)AB_MAX_VEL2};
static const float ab_low[6] = {-1.0f, -1.0f, -1.0f, -1.0f, -(float)AB_MAX_VEL1, -(float)AB_MAX_VEL2};

const sm_env_spec sm_env_acrobot = {
    .name = "classic/acrobot",
    .about = "Acrobot-v1: swing the end of a two-link chain above a line; -1 per step, 500-step limit",
    .obs_c = 6, .obs_h = 1, .obs_w = 1,
    .obs_low = ab_low, .obs_high = ab_high,
    .act_kind = SM_SPACE_DISCRETE, .act_n = 3,
    .max_steps = 500,
    .state_bytes = sizeof(acrobot),
    .init = classic_init, .reset = ab_reset, .step = ab_step, .step_batch = ab_step_batch,
    .render = ab_render,
};
