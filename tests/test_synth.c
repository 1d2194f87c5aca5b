/* GrMoE's synthetic routing task beyond the paper's description (bench routing, issue 16):
 * the Bayes ceiling on a constructed case and on generated data, the shared-core overlap
 * construction, per-component means, the token-identity variant, the merge statistic, and the
 * supervised probes (a linear probe separates components that have means, and cannot when the
 * components are zero-mean). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/methods/grmoe/synth.h"

static sm_error err;

/* a task by hand: N = 2 lines in R^3 (U_0 = e1, U_1 = e2), sigma^2 = 0.5, optional means */
static void line_task(sm_synth *s, sm_real *U, sm_real *mu, double mean) {
    memset(s, 0, sizeof *s);
    s->cfg.N = 2, s->cfg.d = 3, s->cfg.kr = 1, s->cfg.out = 1, s->cfg.sigma2 = 0.5, s->cfg.mean = mean;
    memset(U, 0, sizeof(sm_real) * 6);
    U[0] = 1, U[3 + 1] = 1;
    s->U = U;
    s->mu = mu;
}

Test(synth, bayes_rule_on_a_constructed_case) {
    sm_synth s;
    sm_real U[6], mu[6] = {0};
    line_task(&s, U, mu, 0);
    /* zero mean: argmax ||P_e x||^2 - the energy along e1 against the energy along e2, sign-blind */
    const float x[4 * 3] = {2, 0.1f, 0, -2, 0.1f, 5, 0.1f, -2, 1, 1.0f, 1.2f, 0};
    int pred[4];
    sm_synth_bayes(&s, x, 4, pred);
    cr_expect_eq(pred[0], 0);
    cr_expect_eq(pred[1], 0, "the sign of x must not matter");
    cr_expect_eq(pred[2], 1);
    cr_expect_eq(pred[3], 1, "1.2^2 > 1^2");
    /* with means mu_0 = e1, mu_1 = -e2 (sigma^2 = 0.5: weight 1/sigma^2 - 1 = 1) the last token's scores
     * are 1 + 2 - 1 = 2 for e = 0 and 1.44 - 2.4 - 1 = -1.96 for e = 1: the means decide */
    mu[0] = 1, mu[3 + 1] = -1;
    line_task(&s, U, mu, 1);
    sm_synth_bayes(&s, x + 9, 1, pred);
    cr_expect_eq(pred[0], 0, "the means must enter the Bayes rule");
}

/* the task of c drawn with seed, and the rng left after it (for sampling) */
typedef struct {
    sm_synth s;
    sm_rng r;
} task;

static task make_task(const sm_synth_config *c, uint64_t seed) {
    task k;
    sm_rng_seed(&k.r, seed);
    cr_assert_eq(sm_synth_create(&k.s, c, &k.r, &err), SM_OK, "%s", err.msg);
    return k;
}

/* M tokens of a new task: x (M,d) and comp (M) malloc'ed for the caller */
static sm_synth sampled(const sm_synth_config *c, uint64_t seed, int M, float **x, int **comp) {
    task k = make_task(c, seed);
    float *y = malloc(sizeof(float) * (size_t)M * c->out);
    *x = malloc(sizeof(float) * (size_t)M * c->d);
    *comp = malloc(sizeof(int) * M);
    sm_synth_sample(&k.s, *x, y, *comp, M, &k.r);
    free(y);
    return k.s;
}

static double bayes_accuracy(const sm_synth_config *c, uint64_t seed, int n) {
    task tk = make_task(c, seed);
    sm_synth s = tk.s;
    sm_rng r = tk.r;
    float *x = malloc(sizeof(float) * (size_t)n * c->d), *y = malloc(sizeof(float) * (size_t)n * c->out);
    int *comp = malloc(sizeof(int) * n), *pred = malloc(sizeof(int) * n), right = 0;
    sm_synth_sample(&s, x, y, comp, n, &r);
    sm_synth_bayes(&s, x, n, pred);
    for (int t = 0; t < n; t++) right += pred[t] == comp[t];
    free(x), free(y), free(comp), free(pred);
    sm_synth_free(&s);
    return (double)right / n;
}

/* the numbers issue 16 rests on: the easy task is separable, the hard one at k_r = 16 is not */
Test(synth, bayes_ceiling_easy_is_near_100_and_hard_at_rank_16_near_58) {
    sm_synth_config c;
    cr_assert_eq(sm_synth_setting(&c, "easy", &err), SM_OK);
    double easy = bayes_accuracy(&c, 1, 2000);
    cr_expect(easy > 0.99, "easy Bayes %.3f", easy);
    cr_assert_eq(sm_synth_setting(&c, "hard", &err), SM_OK);
    double hard16 = bayes_accuracy(&c, 1, 2000);
    cr_expect(hard16 > 0.52 && hard16 < 0.64, "hard k_r=16 Bayes %.3f", hard16);
    c.kr = 40;
    double hard40 = bayes_accuracy(&c, 1, 2000);
    cr_expect(hard40 > 0.78, "hard k_r=40 Bayes %.3f (must exceed the paper's 78.3%%)", hard40);
}

static void expect_frames(const sm_synth *s) {
    const int N = s->cfg.N, R = s->cfg.kr, d = s->cfg.d;
    for (int e = 0; e < N; e++)
        for (int a = 0; a < R; a++)
            for (int b = 0; b < R; b++) {
                double g = 0;
                for (int i = 0; i < d; i++) g += s->U[((size_t)e * R + a) * d + i] * s->U[((size_t)e * R + b) * d + i];
                cr_expect(fabs(g - (a == b)) < 1e-4, "frame %d not orthonormal (%d,%d): %g", e, a, b, g);
            }
}

Test(synth, shared_core_construction_has_the_overlap_of_its_core) {
    sm_synth_config c = {.N = 4, .d = 32, .kr = 4, .out = 2, .rho = 0.5, .sigma2 = 0.1, .overlap = SM_SYNTH_OVERLAP_SHARED};
    task tk = make_task(&c, 3);
    sm_synth s = tk.s;
    sm_rng r = tk.r;
    /* m = 2 common rows of 4, private rows mutually orthogonal (2 + 4 * 2 <= 32): overlap exactly 2/4 */
    cr_expect(fabs(s.overlap - 0.5) < 1e-5, "overlap %g", s.overlap);
    expect_frames(&s);
    sm_synth_free(&s);
    /* when the private rows do not fit side by side they are random but still orthogonal to the core */
    c.d = 8;
    cr_assert_eq(sm_synth_create(&s, &c, &r, &err), SM_OK, "%s", err.msg);
    cr_expect(s.overlap >= 0.5 - 1e-5, "overlap %g", s.overlap);
    expect_frames(&s);
    sm_synth_free(&s);
    int ov;
    cr_expect_eq(sm_synth_overlap_parse("shared", &ov, &err), SM_OK);
    cr_expect_eq(ov, SM_SYNTH_OVERLAP_SHARED);
    cr_expect_eq(sm_synth_overlap_parse("bogus", &ov, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "tilt|shared"), "%s", err.msg);
}

Test(synth, means_lie_in_their_subspace_and_shift_the_tokens) {
    sm_synth_config c = {.N = 3, .d = 16, .kr = 3, .out = 2, .rho = 0.1, .sigma2 = 0.1, .mean = 3};
    enum { M = 6000 };
    float *x;
    int *comp;
    sm_synth s = sampled(&c, 4, M, &x, &comp);
    for (int e = 0; e < 3; e++) {
        const sm_real *mu = s.mu + e * 16;
        double nrm = 0, inside = 0, avg[16] = {0};
        int cnt = 0;
        for (int i = 0; i < 16; i++) nrm += mu[i] * mu[i];
        for (int j = 0; j < 3; j++) {
            double p = 0;
            for (int i = 0; i < 16; i++) p += s.U[(e * 3 + j) * 16 + i] * mu[i];
            inside += p * p;
        }
        cr_expect(fabs(sqrt(nrm) - 3) < 1e-4 && fabs(inside - nrm) < 1e-3, "mu_%d: norm %g, in subspace %g", e, sqrt(nrm), inside);
        for (int t = 0; t < M; t++)
            if (comp[t] == e) {
                for (int i = 0; i < 16; i++) avg[i] += x[t * 16 + i];
                cnt++;
            }
        for (int i = 0; i < 16; i++) cr_expect(fabs(avg[i] / cnt - mu[i]) < 0.15, "mean of component %d, coordinate %d", e, i);
    }
    free(x), free(comp);
    sm_synth_free(&s);
}

Test(synth, token_ids_repeat_their_embedding_and_belong_to_one_component) {
    sm_synth_config c = {.N = 4, .d = 8, .kr = 2, .out = 2, .rho = 0.1, .sigma2 = 0.1, .vocab = 10};
    enum { M = 500 };
    float *x;
    int *comp, seen[10] = {0};
    sm_synth s = sampled(&c, 5, M, &x, &comp);
    for (int t = 0; t < M; t++) {
        int v = -1;
        for (int w = 0; w < 10 && v < 0; w++) {
            int same = 1;
            for (int i = 0; i < 8; i++) same &= x[t * 8 + i] == (float)s.emb[w * 8 + i];
            if (same) v = w;
        }
        cr_assert(v >= 0, "token %d is not one of the 10 embeddings", t);
        cr_expect_eq(v % 4, comp[t], "id %d belongs to component %d, not %d", v, v % 4, comp[t]);
        seen[v] = 1;
    }
    for (int v = 0; v < 10; v++) cr_expect(seen[v], "id %d never drawn", v);
    sm_synth_free(&s);
    free(x), free(comp);
    c.vocab = 3; /* fewer ids than components */
    sm_rng r;
    sm_rng_seed(&r, 5);
    cr_expect_eq(sm_synth_create(&s, &c, &r, &err), SM_ERR_ARG);
}

Test(synth, merge_flags_two_components_on_one_expert) {
    const int comp[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    const int apart[8] = {2, 2, 0, 0, 1, 3, 3, 3};  /* 0->2, 1->0, 2->1 (tie, lower), 3->3 */
    const int merged[8] = {2, 2, 2, 2, 1, 1, 3, 3}; /* components 0 and 1 both on expert 2, expert 0 idle */
    cr_expect_eq(sm_synth_merged(apart, comp, 8, 4, 4), 0);
    cr_expect_eq(sm_synth_merged(merged, comp, 8, 4, 4), 1);
}

/* The linear ceiling is low because the components are zero-mean, not because the probe is weak:
 * with means it separates them. */
Test(synth, linear_probe_needs_means_and_the_mlp_does_not) {
    sm_synth_config c = {.N = 4, .d = 16, .kr = 4, .out = 2, .rho = 0.1, .sigma2 = 0.1};
    sm_synth_probe_opts po = {.hidden = 0, .steps = 300, .batch = 64, .lr = 1e-2, .test_tokens = 1000};
    double acc[3];
    for (int k = 0; k < 3; k++) {
        c.mean = k == 1 ? 4 : 0;
        po.hidden = k == 2 ? 32 : 0;
        task tk = make_task(&c, 6);
        cr_assert_eq(sm_synth_probe_fit(&tk.s, &po, 1, 2, 3, &acc[k], &err), SM_OK, "%s", err.msg);
        sm_synth_free(&tk.s);
    }
    cr_expect(acc[0] < 0.45, "linear probe on zero-mean components: %.3f (chance 0.25)", acc[0]);
    cr_expect(acc[1] > 0.9, "linear probe with means: %.3f", acc[1]);
    cr_expect(acc[2] > 0.8, "MLP probe on zero-mean components: %.3f", acc[2]);
    po.lr = 0;
    cr_expect_eq(sm_synth_probe_fit(NULL, &po, 1, 2, 3, &acc[0], &err), SM_ERR_ARG);
}
