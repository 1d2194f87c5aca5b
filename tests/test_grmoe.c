/* GrMoE properties checked numerically on random inputs (GrMoE Sec. 4):
 *  Theorem 1   H(alpha, x) >= log N - alpha * Delta_kappa(x)                      (Eq. 6)
 *              H(alpha, x) <= log N - alpha^2/2 * Gamma_kappa(x) * exp(-alpha delta_kappa(x))  (Eq. 7)
 *  Corollary 1 G_k(alpha, x) >= 1 - (N - k) exp(-alpha * delta_k(x))              (Eq. 8)
 *  alpha = 0 gives uniform routing; large alpha gives top-1 routing;
 *  entropy is non-increasing in alpha (dH/dalpha = -alpha Var <= 0, App. A.1);
 * plus the synthetic task's construction (target overlap reached, frames orthonormal). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "specmoe.h"
#include "specmoe/methods/grmoe/synth.h"

enum { N = 8, D = 24, KR = 4, T = 64 };

typedef struct {
    sm_moe *moe;
    sm_params ps;
    sm_real x[T * D], out[T * D];
} grm;

static void setup(grm *g, uint64_t seed) {
    sm_moe_config c;
    sm_moe_config_default(&c);
    sm_router_config_set(&c.router, "grassmann", NULL);
    c.router.E = N;
    c.router.k = N;
    sm_grmoe_opts(&c.router)->kr = KR;
    c.H = 4;
    sm_error err;
    sm_params_init_table(&g->ps);
    g->moe = sm_moe_create(&c, D, &err);
    cr_assert(g->moe, "%s", err.msg);
    cr_assert_eq(sm_moe_declare(g->moe, &g->ps, "m", &err), SM_OK);
    cr_assert_eq(sm_params_alloc(&g->ps, &err), SM_OK);
    sm_rng r;
    sm_rng_seed(&r, seed);
    sm_params_initialize(&g->ps, &r);
    /* heterogeneous concentrations, as learned models have (GrMoE Sec. 6.3: kappa in 0.4 .. 4.2) */
    int ik = sm_params_find(&g->ps, "m.router.log_kappa");
    for (int e = 0; e < N; e++) sm_params_data(&g->ps, ik)[e] = (sm_real)log(0.4 + 3.8 * sm_rng_uniform(&r));
    sm_moe_bind(g->moe, &g->ps);
    cr_assert_eq(sm_moe_reserve(g->moe, T, &err), SM_OK);
    for (int i = 0; i < T * D; i++) g->x[i] = (sm_real)(sm_rng_normal(&r) / sqrt((double)D) * 2);
}

/* kappa_e ||U_e^T x_t||^2 computed here independently of the router */
static void concentrated(const grm *g, int t, double *kt) {
    const sm_real *U = sm_params_data(&g->ps, sm_params_find(&g->ps, "m.router.frames"));
    const sm_real *lk = sm_params_data(&g->ps, sm_params_find(&g->ps, "m.router.log_kappa"));
    for (int e = 0; e < N; e++) {
        double a = 0;
        for (int j = 0; j < KR; j++) {
            double p = 0;
            for (int i = 0; i < D; i++) p += U[((size_t)e * KR + j) * D + i] * g->x[t * D + i];
            a += p * p;
        }
        kt[e] = exp(lk[e]) * a;
    }
}

static void route_at(grm *g, double alpha) {
    sm_grmoe_opts(&g->moe->router->cfg)->alpha = alpha;
    sm_moe_forward(g->moe, g->out, g->x, T, NULL, 0);
}

Test(grmoe, theorem1_and_corollary1_bounds_hold_on_random_inputs) {
    const double alphas[] = {0.1, 0.5, 1, 2, 5, 20};
    int checked = 0;
    for (uint64_t seed = 1; seed <= 5; seed++) {
        grm g;
        setup(&g, seed);
        for (size_t a = 0; a < sizeof alphas / sizeof alphas[0]; a++) {
            double alpha = alphas[a];
            route_at(&g, alpha);
            for (int t = 0; t < T; t++) {
                const sm_real *p = g.moe->route.probs + (size_t)t * N;
                double kt[N], mx = -INFINITY, mn = INFINITY, mean = 0, var = 0;
                concentrated(&g, t, kt);
                for (int e = 0; e < N; e++) {
                    mx = fmax(mx, kt[e]);
                    mn = fmin(mn, kt[e]);
                    mean += kt[e] / N;
                }
                for (int e = 0; e < N; e++) var += (kt[e] - mean) * (kt[e] - mean) / N;
                double H = sm_entropy(p, N), tol = 1e-5;
                cr_expect(H >= log(N) - alpha * (mx - mean) - tol, "Thm 1 lower: H %.6f < %.6f (alpha %g)", H,
                          log(N) - alpha * (mx - mean), alpha);
                cr_expect(H <= log(N) - alpha * alpha / 2 * var * exp(-alpha * (mx - mn)) + tol,
                          "Thm 1 upper: H %.6f > %.6f (alpha %g)", H, log(N) - alpha * alpha / 2 * var * exp(-alpha * (mx - mn)),
                          alpha);
                /* Corollary 1 for every k, with the sorted concentrated affinities */
                double sorted[N];
                memcpy(sorted, kt, sizeof sorted);
                for (int i = 0; i < N; i++)
                    for (int j = i + 1; j < N; j++)
                        if (sorted[j] > sorted[i]) {
                            double tmp = sorted[i];
                            sorted[i] = sorted[j];
                            sorted[j] = tmp;
                        }
                for (int k = 1; k < N; k++) {
                    double Gk = sm_topk_mass(p, N, k), dk = sorted[k - 1] - sorted[k];
                    cr_expect(Gk >= 1 - (N - k) * exp(-alpha * dk) - tol, "Cor 1: G_%d %.6f < bound (alpha %g)", k, Gk, alpha);
                    checked++;
                }
            }
        }
        sm_moe_free(g.moe);
        sm_params_free(&g.ps);
    }
    cr_expect_eq(checked, 5 * 6 * T * (N - 1));
}

Test(grmoe, alpha_zero_is_uniform_and_large_alpha_is_top1) {
    grm g;
    setup(&g, 9);
    route_at(&g, 0);
    for (int i = 0; i < T * N; i++) cr_expect_float_eq(g.moe->route.probs[i], 1.0 / N, 1e-6);
    route_at(&g, 1e4);
    for (int t = 0; t < T; t++) {
        double kt[N];
        concentrated(&g, t, kt);
        int best = 0;
        for (int e = 1; e < N; e++)
            if (kt[e] > kt[best]) best = e;
        cr_expect_float_eq(g.moe->route.probs[(size_t)t * N + best], 1.0, 1e-4, "token %d: top-1 mass %.6f", t,
                           (double)g.moe->route.probs[(size_t)t * N + best]);
    }
    sm_moe_free(g.moe);
    sm_params_free(&g.ps);
}

Test(grmoe, entropy_is_monotone_in_alpha) {
    grm g;
    setup(&g, 10);
    double prev[T];
    for (int i = 0; i <= 40; i++) {
        route_at(&g, 0.25 * i);
        for (int t = 0; t < T; t++) {
            double H = sm_entropy(g.moe->route.probs + (size_t)t * N, N);
            if (i > 0) cr_expect(H <= prev[t] + 1e-6, "token %d: entropy rises at alpha %.2f", t, 0.25 * i);
            prev[t] = H;
        }
    }
    sm_moe_free(g.moe);
    sm_params_free(&g.ps);
}

Test(grmoe, synthetic_task_reaches_the_target_overlap) {
    const char *names[] = {"easy", "hard"};
    for (int i = 0; i < 2; i++) {
        sm_synth_config c;
        sm_error err;
        cr_assert_eq(sm_synth_setting(&c, names[i], &err), SM_OK);
        sm_rng r;
        sm_rng_seed(&r, 3);
        sm_synth s;
        cr_assert_eq(sm_synth_create(&s, &c, &r, &err), SM_OK, "%s", err.msg);
        cr_expect(fabs(s.overlap - c.rho) < 1e-3, "%s: overlap %.4f vs %.2f", names[i], s.overlap, c.rho);
        for (int e = 0; e < c.N; e++)
            cr_expect(sm_stiefel_orth_error(s.U + (size_t)e * c.kr * c.d, c.kr, c.d) < 1e-5);
        /* tokens of component e carry ~k_r of energy in its subspace and ~sigma^2 per other dimension */
        enum { M = 4000 };
        static float x[M * 128], y[M * 16];
        static int comp[M];
        sm_synth_sample(&s, x, y, comp, M, &r);
        double in = 0, outside = 0;
        for (int t = 0; t < M; t++) {
            const sm_real *U = s.U + (size_t)comp[t] * c.kr * c.d;
            double a = 0, tot = 0;
            for (int j = 0; j < c.kr; j++) {
                double p = 0;
                for (int k = 0; k < c.d; k++) p += U[(size_t)j * c.d + k] * x[t * c.d + k];
                a += p * p;
            }
            for (int k = 0; k < c.d; k++) tot += (double)x[t * c.d + k] * x[t * c.d + k];
            in += a / M;
            outside += (tot - a) / M;
        }
        cr_expect(fabs(in - c.kr) < 0.05 * c.kr, "%s: in-subspace energy %.2f", names[i], in);
        cr_expect(fabs(outside - c.sigma2 * (c.d - c.kr)) < 0.05 * c.sigma2 * (c.d - c.kr), "%s: outside energy %.2f",
                  names[i], outside);
        sm_synth_free(&s);
    }
}
