/* SSMoE eigenvector descriptors: the SVD path against the brute-force eigenvectors of W^T W under the
 * documented sign convention, the signed (not absolute) alignment with the router row, and input checks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "specmoe.h"
#include "specmoe/methods/ssmoe/ssmoe.h"

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

#include "testutil.h"

/* 6 -> dense 12 -> MoE (4 experts d -> 10 -> d, top-2, renormalised) -> 3 classes, seeded; r is left
 * ready for drawing inputs. */
static sm_model *small_topk_model(sm_model_config *cfg, sm_rng *r, uint64_t seed, int max_T) {
    sm_model_config_default(cfg);
    sm_error err;
    cr_assert_eq(sm_model_parse_arch(cfg, "dense:12,moe:10", &err), SM_OK);
    cfg->in_dim = 6;
    cfg->n_classes = 3;
    cfg->moe.router.E = 4;
    cfg->moe.router.k = 2;
    sm_rng_seed(r, seed);
    sm_model *m = sm_model_create(cfg, max_T, r, &err);
    cr_assert(m, "%s", err.msg);
    return m;
}

/* A top-k model converted to the ev router: alpha = 0 reproduces the model exactly, the stored
 * descriptors are those of sm_ev_descriptor on W1 and W2^T, and alpha > 0 changes the routing. */
Test(ssmoe, ev_router_from_a_topk_checkpoint) {
    sm_model_config cfg;
    sm_error err;
    sm_rng r;
    sm_model *m = small_topk_model(&cfg, &r, 5, 16);
    char path[256];
    snprintf(path, sizeof path, "%s/topk.safetensors", tu_tmpdir());
    cr_assert_eq(sm_checkpoint_save(path, m, NULL, NULL, &err), SM_OK, "%s", err.msg);
    float x[16 * 6];
    for (int i = 0; i < 16 * 6; i++) x[i] = (float)sm_rng_normal(&r);
    sm_real ref[16 * 3];
    memcpy(ref, sm_model_forward(m, x, 16, NULL, 0), sizeof ref);

    sm_model_config ec = cfg;
    cr_assert_eq(sm_router_config_set(&ec.moe.router, "ev", NULL), SM_OK);
    sm_ev_opts(&ec.moe.router)->alpha = 0;
    sm_ev_opts(&ec.moe.router)->ev_c = 3;
    sm_model *ev = sm_model_create(&ec, 16, NULL, &err);
    cr_assert(ev, "%s", err.msg);
    cr_assert_eq(sm_checkpoint_load(path, ev, NULL, NULL, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_model_build_ev(ev, &err), SM_OK, "%s", err.msg);
    const sm_real *out = sm_model_forward(ev, x, 16, NULL, 0);
    for (int i = 0; i < 16 * 3; i++) cr_expect_float_eq(out[i], ref[i], 1e-5, "alpha 0 differs at %d", i);
    /* descriptors of expert 2: W1 as stored and W2 transposed */
    sm_moe *moe = sm_model_moe(ev, 0);
    const int d = moe->d, H = moe->H, e = 2;
    float w1[10 * 12], w2t[10 * 12], row[12];
    for (int h = 0; h < H; h++)
        for (int k = 0; k < d; k++) {
            w1[h * d + k] = (float)moe->w1[((size_t)e * H + h) * d + k];
            w2t[h * d + k] = (float)moe->w2[((size_t)e * d + k) * H + h];
        }
    const sm_real *rw = sm_params_data(&ev->params, sm_params_find(&ev->params, "layers.1.router.weight"));
    for (int k = 0; k < d; k++) row[k] = (float)rw[e * d + k];
    double d1[12], d2[12];
    cr_assert_eq(sm_ev_descriptor(d1, w1, H, d, row, 3, &err), SM_OK);
    cr_assert_eq(sm_ev_descriptor(d2, w2t, H, d, row, 3, &err), SM_OK);
    const sm_real *evp = sm_params_data(&ev->params, sm_params_find(&ev->params, "layers.1.router.ev"));
    for (int k = 0; k < d; k++) {
        cr_expect_float_eq(evp[(e * 2 + 0) * d + k], d1[k], 1e-6);
        cr_expect_float_eq(evp[(e * 2 + 1) * d + k], d2[k], 1e-6);
    }
    /* the mixture moves the routing away from the learned router's */
    cr_assert_eq(sm_model_set_dial(ev, "alpha", "1", &err), SM_OK, "%s", err.msg);
    sm_model_forward(ev, x, 16, NULL, 0);
    double diff = 0;
    for (int i = 0; i < 16 * 4; i++) diff += fabs((double)moe->route.probs[i] - 0.25);
    cr_expect(diff > 1e-3, "EV routing is uniform: descriptors not used");
    sm_model_free(m);
    sm_model_free(ev);
}

/* Pruning keeps the chosen experts' slices and router rows; with renormalised top-k routing, a token
 * whose chosen experts all survive is routed with the same weights (softmax ratios do not depend on
 * the dropped logits), so its output is unchanged. */
Test(ssmoe, pruned_model_keeps_slices_and_surviving_tokens) {
    sm_model_config cfg;
    sm_error err;
    sm_rng r;
    sm_model *m = small_topk_model(&cfg, &r, 8, 64);
    float x[64 * 6];
    for (int i = 0; i < 64 * 6; i++) x[i] = (float)sm_rng_normal(&r);
    sm_real ref[64 * 3];
    memcpy(ref, sm_model_forward(m, x, 64, NULL, 0), sizeof ref);
    int top[64][2];
    const sm_route *ro = &sm_model_moe(m, 0)->route;
    for (int a = 0; a < ro->n_assign; a++) {
        int e = 0;
        while (ro->offset[e + 1] <= a) e++;
        top[ro->token[a]][ro->slot[a]] = e;
    }
    int keep[2] = {1, 3};
    sm_model *p = sm_model_prune_experts(m, keep, 2, &err);
    cr_assert(p, "%s", err.msg);
    cr_expect_eq(p->cfg.moe.router.E, 2);
    const sm_moe *a = sm_model_moe(m, 0), *b = sm_model_moe(p, 0);
    for (int j = 0; j < 2; j++)
        for (size_t i = 0; i < (size_t)a->H * a->d; i++) cr_expect(b->w1[(size_t)j * a->H * a->d + i] == a->w1[(size_t)keep[j] * a->H * a->d + i]);
    const sm_real *out = sm_model_forward(p, x, 64, NULL, 0);
    int same = 0;
    for (int t = 0; t < 64; t++) {
        int kept = (top[t][0] == 1 || top[t][0] == 3) && (top[t][1] == 1 || top[t][1] == 3);
        if (!kept) continue;
        same++;
        for (int v = 0; v < 3; v++) cr_expect_float_eq(out[t * 3 + v], ref[t * 3 + v], 1e-5, "token %d", t);
    }
    cr_expect(same > 0, "no token had both its experts kept: the check did not run");
    int bad[2] = {1, 7};
    cr_expect_null(sm_model_prune_experts(m, bad, 2, &err));
    sm_model_free(m);
    sm_model_free(p);
}

Test(ssmoe, collapse_correlation) {
    /* identical rows: correlation 1; independent random rows in high dimension: near 0 */
    sm_real same[3 * 50], rnd[3 * 2000];
    sm_rng r;
    sm_rng_seed(&r, 4);
    for (int i = 0; i < 50; i++) same[i] = same[50 + i] = same[100 + i] = (sm_real)sm_rng_normal(&r);
    cr_expect_float_eq(sm_mean_abs_offdiag_corr(same, 3, 50), 1.0, 1e-9);
    for (int i = 0; i < 3 * 2000; i++) rnd[i] = (sm_real)sm_rng_normal(&r);
    cr_expect(sm_mean_abs_offdiag_corr(rnd, 3, 2000) < 0.08);
}

static const char *pname(const char *prefix, const char *leaf) {
    static char buf[4][64];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s.%s", prefix, leaf);
    return buf[i];
}

/* A dense model of arch (in_dim inputs, 3 classes), seeded, and its upcycled twin with E experts, top-2,
 * renormalised; r is left ready for drawing inputs. */
static sm_model *upcycled(const char *arch, int in_dim, int residual, int E, uint64_t seed, int max_T, sm_rng *r,
                          sm_model **dense_out, sm_moe_config *mc) {
    sm_model_config dc;
    sm_error err;
    sm_model_config_default(&dc);
    cr_assert_eq(sm_model_parse_arch(&dc, arch, &err), SM_OK);
    dc.in_dim = in_dim;
    dc.n_classes = 3;
    dc.residual = residual;
    sm_rng_seed(r, seed);
    sm_model *dense = sm_model_create(&dc, max_T, r, &err);
    cr_assert(dense, "%s", err.msg);
    *mc = dc.moe;
    mc->router.E = E;
    mc->router.k = 2;
    mc->router.renorm = 1;
    mc->act = dc.act;
    sm_model *m = sm_model_upcycle(dense, mc, r, &err);
    cr_assert(m, "%s", err.msg);
    *dense_out = dense;
    return m;
}

/* Upcycling: every expert of every MoE layer equals its dense FFN right after upcycling, every other
 * tensor is copied, and the model computes what the dense model computes (renormalised top-k weights
 * of identical experts sum to 1), with and without residual connections. */
Test(ssmoe, upcycled_experts_equal_the_dense_ffn) {
    for (int residual = 0; residual < 2; residual++) {
        sm_error err;
        sm_rng r;
        sm_model *dense;
        sm_moe_config mc;
        sm_model *m = upcycled("dense:12,ffn:10,ffn:7", 6, residual, 5, 21 + residual, 32, &r, &dense, &mc);
        cr_assert_eq(sm_model_n_moe(m), 2);
        const char *ffn[2] = {"layers.1", "layers.2"};
        for (int l = 0; l < 2; l++) {
            const sm_moe *moe = sm_model_moe(m, l);
            const sm_real *w1 = sm_params_data(&dense->params, sm_params_find(&dense->params, pname(ffn[l], "w1")));
            const sm_real *b1 = sm_params_data(&dense->params, sm_params_find(&dense->params, pname(ffn[l], "b1")));
            const sm_real *w2 = sm_params_data(&dense->params, sm_params_find(&dense->params, pname(ffn[l], "w2")));
            const sm_real *b2 = sm_params_data(&dense->params, sm_params_find(&dense->params, pname(ffn[l], "b2")));
            const size_t H = (size_t)moe->H, d = (size_t)moe->d;
            for (int e = 0; e < moe->E; e++) {
                cr_expect_eq(memcmp(moe->w1 + e * H * d, w1, sizeof(sm_real) * H * d), 0, "layer %d expert %d w1", l, e);
                cr_expect_eq(memcmp(moe->b1 + e * H, b1, sizeof(sm_real) * H), 0, "layer %d expert %d b1", l, e);
                cr_expect_eq(memcmp(moe->w2 + e * H * d, w2, sizeof(sm_real) * H * d), 0, "layer %d expert %d w2", l, e);
                cr_expect_eq(memcmp(moe->b2 + e * d, b2, sizeof(sm_real) * d), 0, "layer %d expert %d b2", l, e);
            }
        }
        float x[32 * 6];
        fill(x, 32 * 6, &r);
        sm_real ref[32 * 3];
        memcpy(ref, sm_model_forward(dense, x, 32, NULL, 0), sizeof ref);
        const sm_real *out = sm_model_forward(m, x, 32, NULL, 0);
        for (int i = 0; i < 32 * 3; i++) cr_expect_float_eq(out[i], ref[i], 1e-5, "residual %d: logit %d", residual, i);
        /* the routers are not all alike: the router is what fine-tuning then learns */
        cr_expect(sm_model_moe(m, 0)->route.n_assign == 32 * 2);
        /* refused: shared experts; a model without ffn layers */
        sm_moe_config bad = mc;
        bad.n_shared = 1;
        cr_expect_null(sm_model_upcycle(dense, &bad, &r, &err));
        cr_expect_null(sm_model_upcycle(m, &mc, &r, &err), "an MoE model was upcycled again");
        sm_model_free(m);
        sm_model_free(dense);
    }
}

/* The expert-collapse statistic on a constructed collapsed case (an upcycled model: every expert the
 * same FFN, similarity exactly 1) and a non-collapsed one (independent random experts, d = 64:
 * cosines of order 1/sqrt(d)). */
Test(ssmoe, expert_similarity_collapsed_and_not) {
    sm_error err;
    sm_rng r;
    sm_model *dense;
    sm_moe_config mc;
    sm_model *up = upcycled("dense:64,ffn:64", 8, 0, 6, 31, 64, &r, &dense, &mc);
    float x[100 * 8];
    fill(x, 100 * 8, &r);
    double sim[1];
    cr_assert_eq(sm_ssmoe_expert_similarity(up, x, 100, sim, &err), SM_OK, "%s", err.msg);
    cr_expect_float_eq(sim[0], 1.0, 1e-9, "upcycled experts: similarity %g", sim[0]);
    /* the same shapes, every expert drawn independently */
    sm_model_config sc = dense->cfg;
    sc.layers[1].kind = SM_LAYER_MOE;
    sc.moe = mc;
    sm_model *scratch = sm_model_create(&sc, 64, &r, &err);
    cr_assert(scratch, "%s", err.msg);
    cr_assert_eq(sm_ssmoe_expert_similarity(scratch, x, 100, sim, &err), SM_OK, "%s", err.msg);
    cr_expect(fabs(sim[0]) < 0.3, "independent random experts: similarity %g", sim[0]);
    /* router rows: the Fig. 6 statistic is blind to the upcycling (random router rows) */
    const sm_real *rw = sm_params_data(&up->params, sm_params_find(&up->params, "layers.1.router.weight"));
    cr_expect(sm_mean_abs_offdiag_corr(rw, 6, 64) < 0.3);
    sm_model_free(scratch);
    sm_model_free(up);
    sm_model_free(dense);
}

/* The routing embedding: one probability row per layer (sums to 1), the learned router's at alpha 0
 * (D.6 overlap 1), and a ridge probe that separates linearly separable classes and refuses bad labels. */
Test(ssmoe, routing_embedding_and_ridge_probe) {
    sm_model_config cfg;
    sm_error err;
    sm_rng r;
    sm_model *m = small_topk_model(&cfg, &r, 12, 16);
    float x[40 * 6];
    fill(x, 40 * 6, &r);
    cr_assert_eq(sm_ssmoe_embed_width(m), 4);
    float e0[40 * 4], e1[40 * 4];
    double ov = 0;
    cr_assert_eq(sm_ssmoe_routing_embed(m, x, 40, e0, &ov, &err), SM_OK, "%s", err.msg);
    cr_expect(isnan(ov), "the learned router has no mixture to compare");
    for (int t = 0; t < 40; t++) {
        double s = 0;
        for (int e = 0; e < 4; e++) s += e0[t * 4 + e];
        cr_expect_float_eq(s, 1.0, 1e-5, "row %d sums to %g", t, s);
    }
    sm_model *ev = sm_ssmoe_twin(m, 0, 3, 0, &err);
    cr_assert(ev, "%s", err.msg);
    cr_assert_eq(sm_ssmoe_routing_embed(ev, x, 40, e1, &ov, &err), SM_OK, "%s", err.msg);
    for (int i = 0; i < 40 * 4; i++) cr_expect_float_eq(e1[i], e0[i], 1e-5, "alpha 0 embedding differs at %d", i);
    cr_expect_float_eq(ov, 1.0, 1e-12);
    cr_assert_eq(sm_model_set_dial(ev, "alpha", "1", &err), SM_OK);
    cr_assert_eq(sm_ssmoe_routing_embed(ev, x, 40, e1, &ov, &err), SM_OK);
    cr_expect(ov < 1.0, "the EV router alone picks what the learned router picks everywhere (%g)", ov);
    sm_model_free(ev);
    sm_model_free(m);

    /* three Gaussian blobs in 5-D, 0.3 apart from noise: the probe fits them */
    enum { N = 300, D = 5, C = 3 };
    float X[N * D], Xt[N * D];
    int y[N], yt[N];
    for (int i = 0; i < N; i++) {
        y[i] = yt[i] = i % C;
        for (int j = 0; j < D; j++) {
            X[i * D + j] = (float)((j == y[i] ? 3.0 : 0.0) + 0.3 * sm_rng_normal(&r));
            Xt[i * D + j] = (float)((j == yt[i] ? 3.0 : 0.0) + 0.3 * sm_rng_normal(&r));
        }
    }
    sm_ridge_probe p;
    cr_assert_eq(sm_ridge_probe_fit(&p, X, y, N, D, C, 1e-3, &err), SM_OK, "%s", err.msg);
    cr_expect(sm_ridge_probe_accuracy(&p, Xt, yt, N) > 0.99);
    sm_ridge_probe_free(&p);
    y[7] = C;
    cr_expect_eq(sm_ridge_probe_fit(&p, X, y, N, D, C, 1e-3, &err), SM_ERR_ARG);
    cr_expect_eq(sm_ridge_probe_fit(&p, X, yt, N, D, C, -1, &err), SM_ERR_ARG);
}

/* brute force of one sm_logit_collapse field: mean over pairs i != j (all i, j when cross) of
 * |C_ij| / sqrt(C_ii C_jj), C_ij = mean over rows of u_i v_j (centred: minus the means), u the rows
 * of U (n, E), v those of V (V = U for the within-router statistics) */
static double brute_corr(const double *U, const double *V, int n, int E, int cross, int centred) {
    double mu[8] = {0}, mv[8] = {0}, acc = 0;
    int cnt = 0;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) mu[i] += centred ? U[t * E + i] / n : 0, mv[i] += centred ? V[t * E + i] / n : 0;
    for (int i = 0; i < E; i++)
        for (int j = 0; j < E; j++) {
            if (!cross && i == j) continue;
            double cij = 0, cii = 0, cjj = 0;
            for (int t = 0; t < n; t++) {
                double u = U[t * E + i] - mu[i], v = V[t * E + j] - mv[j];
                cij += u * v, cii += u * u, cjj += v * v;
            }
            acc += fabs(cij) / sqrt(cii * cjj), cnt++;
        }
    return acc / cnt;
}

/* SSMoE Lemma 3.1's logit statistic: equal to a direct computation from the layer's inputs (learned,
 * EV, the alpha mix, centred and not, the EV-learned cross term); identical router rows give exactly
 * 1; alpha 0 and 1 reproduce the learned and the EV values; bad alpha refused. */
Test(ssmoe, logit_collapse_matches_direct_computation) {
    sm_model_config cfg;
    sm_error err;
    sm_rng r;
    sm_model *m = small_topk_model(&cfg, &r, 41, 16);
    sm_model *ev = sm_ssmoe_twin(m, 0.5, 3, 0, &err);
    cr_assert(ev, "%s", err.msg);
    enum { N = 40, E = 4, D = 12 };
    float x[N * 6];
    fill(x, N * 6, &r);
    sm_logit_collapse lc[1];
    const double alpha = 0.3;
    cr_assert_eq(sm_ssmoe_logit_collapse(ev, x, N, alpha, 7, lc, &err), SM_OK, "%s", err.msg);
    /* direct, in double: the MoE layer's input is the dense layer's output (forwards of 16 rows) */
    const sm_real *w = sm_params_data(&ev->params, sm_params_find(&ev->params, "layers.1.router.weight"));
    const sm_real *dv = sm_params_data(&ev->params, sm_params_find(&ev->params, "layers.1.router.ev"));
    double S[N * E], F[N * E], V[N * E];
    for (int b = 0; b < N; b += 16) {
        int B = N - b < 16 ? N - b : 16;
        sm_model_forward(ev, x + (size_t)b * 6, B, NULL, 0);
        const sm_real *h = sm_seq_output(ev->body, 0);
        for (int t = 0; t < B; t++)
            for (int e = 0; e < E; e++) {
                double s = 0, f = 0;
                for (int i = 0; i < D; i++) {
                    s += (double)h[t * D + i] * w[e * D + i];
                    f += (double)h[t * D + i] * (dv[(e * 2) * D + i] + dv[(e * 2 + 1) * D + i]) / 2;
                }
                S[(b + t) * E + e] = s, F[(b + t) * E + e] = f, V[(b + t) * E + e] = alpha * f + (1 - alpha) * s;
            }
    }
    for (int c = 0; c < 2; c++) {
        cr_expect_float_eq(c ? lc[0].learned_c : lc[0].learned, brute_corr(S, S, N, E, 0, c), 1e-5, "learned, centred %d", c);
        cr_expect_float_eq(c ? lc[0].ev_c : lc[0].ev, brute_corr(F, F, N, E, 0, c), 1e-5, "ev, centred %d", c);
        cr_expect_float_eq(c ? lc[0].mixed_c : lc[0].mixed, brute_corr(V, V, N, E, 0, c), 1e-5, "mixed, centred %d", c);
    }
    cr_expect_float_eq(lc[0].ev_learned, brute_corr(F, S, N, E, 1, 0), 1e-5);
    cr_expect(lc[0].random > 0 && lc[0].random < 1 && lc[0].random_c >= 0 && lc[0].random_c < 1);
    /* alpha 0 / 1: the mix is the learned / the EV logits */
    sm_logit_collapse a0[1], a1[1];
    cr_assert_eq(sm_ssmoe_logit_collapse(ev, x, N, 0, 7, a0, &err), SM_OK);
    cr_assert_eq(sm_ssmoe_logit_collapse(ev, x, N, 1, 7, a1, &err), SM_OK);
    cr_expect_float_eq(a0[0].mixed, a0[0].learned, 1e-12);
    cr_expect_float_eq(a1[0].mixed_c, a1[0].ev_c, 1e-12);
    cr_expect_float_eq(a0[0].random, lc[0].random, 1e-12, "the random rows depend on the seed only");
    /* a collapsed router: every row the same vector -> every pair of logits identical */
    sm_real *wm = sm_params_data(&ev->params, sm_params_find(&ev->params, "layers.1.router.weight"));
    for (int e = 1; e < E; e++) memcpy(wm + e * D, wm, sizeof(sm_real) * D);
    cr_assert_eq(sm_ssmoe_logit_collapse(ev, x, N, alpha, 7, lc, &err), SM_OK);
    cr_expect_float_eq(lc[0].learned, 1.0, 1e-9);
    cr_expect_float_eq(lc[0].learned_c, 1.0, 1e-9);
    cr_expect(lc[0].mixed < 1.0, "the mix with EV logits decorrelates a collapsed router (%g)", lc[0].mixed);
    cr_expect_eq(sm_ssmoe_logit_collapse(ev, x, N, 1.5, 7, lc, &err), SM_ERR_ARG);
    cr_expect_eq(sm_ssmoe_logit_collapse(m, x, N, 0.5, 7, lc, &err), SM_ERR_ARG, "a topk model has no EV descriptors");
    sm_model_free(ev);
    sm_model_free(m);
}
