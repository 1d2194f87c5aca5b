/* Gradient checks (double precision) of the DQN-family losses (src/rl/dqn.c): the TD loss (Huber
 * and MSE, with importance weights) w.r.t. the Q-values, and the C51 cross-entropy w.r.t. the atom
 * logits; plus the C51 projection's invariants against a hand computation. */
#include <criterion/criterion.h>
#include <string.h>

#include "gradcheck.h"
#include "specmoe/rl/dqn.h"

enum { B = 5, A = 3, K = 7 };

typedef struct {
    sm_real q[B * A], y[B], scratch[B * A], td[B];
    int act[B];
    float w[B];
    int huber;
} td_ctx;

static double td_loss(void *p) {
    td_ctx *c = p;
    return sm_dqn_td_loss(c->scratch, c->td, c->q, c->act, c->y, c->w, B, A, c->huber);
}

Test(grad_dqn, td_loss_huber_and_mse) {
    sm_rng rng;
    sm_rng_seed(&rng, 4);
    for (int huber = 0; huber <= 1; huber++) {
        td_ctx c;
        c.huber = huber;
        /* differences both inside and outside Huber's quadratic zone, away from |d| = 1 */
        gc_fill_normal(c.q, B * A, 1.5, &rng);
        for (int b = 0; b < B; b++) {
            c.act[b] = (int)sm_rng_below(&rng, A);
            c.y[b] = c.q[b * A + c.act[b]] + (sm_real)((b % 2 ? 0.4 : 2.5) * (b % 3 ? 1 : -1));
            c.w[b] = (float)(0.2 + 0.8 * sm_rng_uniform(&rng));
        }
        sm_real g[B * A];
        sm_dqn_td_loss(g, c.td, c.q, c.act, c.y, c.w, B, A, huber);
        gc_check(huber ? "huber dq" : "mse dq", c.q, g, B * A, td_loss, &c, &rng, B * A);
        for (int b = 0; b < B; b++)
            for (int a = 0; a < A; a++)
                if (a != c.act[b]) cr_assert_eq(g[b * A + a], 0, "only chosen actions get gradient");
    }
}

typedef struct {
    sm_real logits[B * A * K], m[B * K], scratch[B * A * K], ce[B];
    int act[B];
    float w[B];
} c51_ctx;

static double c51_loss(void *p) {
    c51_ctx *c = p;
    return sm_c51_loss(c->scratch, c->ce, c->logits, c->act, c->m, c->w, B, A, K);
}

Test(grad_dqn, c51_cross_entropy) {
    sm_rng rng;
    sm_rng_seed(&rng, 8);
    c51_ctx c;
    gc_fill_normal(c.logits, B * A * K, 1.0, &rng);
    sm_real pn[B * K];
    float ret[B], disc[B];
    for (int b = 0; b < B; b++) {
        double s = 0;
        for (int j = 0; j < K; j++) s += pn[b * K + j] = (sm_real)sm_rng_uniform(&rng);
        for (int j = 0; j < K; j++) pn[b * K + j] /= s;
        ret[b] = (float)(2 * sm_rng_normal(&rng));
        disc[b] = b == 0 ? 0.0f : 0.9f;
        c.act[b] = (int)sm_rng_below(&rng, A);
        c.w[b] = (float)(0.5 + sm_rng_uniform(&rng));
    }
    sm_c51_project(c.m, pn, ret, disc, B, K, -3, 3);
    sm_real g[B * A * K];
    sm_c51_loss(g, c.ce, c.logits, c.act, c.m, c.w, B, A, K);
    gc_check("c51 dlogits", c.logits, g, B * A * K, c51_loss, &c, &rng, B * A * K);
}

/* The projection keeps mass 1 and the mean of the shifted distribution when it stays in range;
 * a terminal (disc 0) puts everything on the two atoms around the reward. */
Test(grad_dqn, c51_projection_invariants) {
    sm_real pn[K], m[K];
    const double vmin = -3, vmax = 3, dz = (vmax - vmin) / (K - 1);
    for (int j = 0; j < K; j++) pn[j] = (j == 2 || j == 3) ? 0.5 : 0;
    float ret = 0.25f, disc = 0.5f;
    sm_c51_project(m, pn, &ret, &disc, 1, K, vmin, vmax);
    double mass = 0, mean = 0, want = 0;
    for (int j = 0; j < K; j++) {
        mass += m[j];
        mean += m[j] * (vmin + j * dz);
        want += pn[j] * (ret + disc * (vmin + j * dz));
    }
    cr_assert_float_eq(mass, 1.0, 1e-12);
    cr_assert_float_eq(mean, want, 1e-12);
    float r2 = 1.5f, d0 = 0;
    sm_c51_project(m, pn, &r2, &d0, 1, K, vmin, vmax);
    /* 1.5 lies between atoms 1.0 (j=4) and 2.0 (j=5), halfway */
    cr_assert_float_eq(m[4], 0.5, 1e-12);
    cr_assert_float_eq(m[5], 0.5, 1e-12);
    float r3 = 100.0f;
    sm_c51_project(m, pn, &r3, &disc, 1, K, vmin, vmax);
    cr_assert_float_eq(m[K - 1], 1.0, 1e-12, "clipped to v_max");
}
