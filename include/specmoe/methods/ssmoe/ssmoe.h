/* SSMoE (papers/001): training-free eigenvector (EV) descriptors of experts.
 *
 * For an expert weight matrix W laid out (nrow, d) - two-layer experts: the first layer as stored, the
 * second transposed; SwiGLU: gate and up as stored, down transposed - take the right singular
 * vectors v_1..v_r of W (LAPACKE gesdd, ordered by singular value), score each by the SIGNED dot
 * product with the expert's learned router row r_e (no absolute value), keep the top-c and average
 * them (no renormalisation): one descriptor per matrix (SSMoE Alg. 1; REFERENCE-NOTES). The
 * router-free "averaged EV" variant averages the top-c by singular value instead.
 *
 * Sign convention: a singular vector is only defined up to sign and LAPACK implementations differ,
 * so every right singular vector is canonicalised to make its largest-magnitude component positive
 * (ties: the first). This makes the signed scores, and so the descriptors, reproducible; the same
 * convention applied to the eigenvectors of W^T W gives the same descriptors (tests/test_ssmoe.c).
 *
 * Letters: nrow rows (not I: complex.h defines I), d columns (token width), c vectors kept.
 */
#ifndef SPECMOE_SSMOE_H
#define SPECMOE_SSMOE_H

#include "specmoe/core/core.h"
#include "specmoe/nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The own options of the "ev" router (src/methods/ssmoe/router_ev.c):
 *   P = alpha softmax(EV logits) + (1 - alpha) softmax(router logits)  (SSMoE Eq. 4) */
typedef struct {
    double alpha; /* weight of the EV router in the mix, in [0, 1] */
    int ev_c;     /* right singular vectors kept per descriptor (top-c by signed alignment) */
    int ev_avg;   /* router-free "averaged EV": top-c by singular value */
} sm_ev_router_opts;
/* sm_ev_opts(cfg): the accessor (cfg must name this router) */
SM_ROUTER_OWN_ACCESSOR(sm_ev_router_opts, sm_ev_opts)

/* out (d) = descriptor of W (nrow, d) row-major; router_row (d) or NULL for the averaged-EV variant;
 * 1 <= c; c is clipped to min(nrow, d). */
sm_status sm_ev_descriptor(double *out, const float *W, int nrow, int d, const float *router_row, int c, sm_error *err);

/* The same descriptor computed the slow way, from the eigenvectors of W^T W (LAPACKE dsyev): the
 * brute-force reference of the tests. */
sm_status sm_ev_descriptor_eig(double *out, const float *W, int nrow, int d, const float *router_row, int c,
                               sm_error *err);

/* Fills the descriptors of every "ev" router of m from its experts (W1 as stored, W2 transposed) and
 * its learned router rows, with the router's ev_c and ev_avg. Run once after loading a trained model. */
sm_status sm_model_build_ev(sm_model *m, sm_error *err);

/* The "ev" twin of a trained topk model m: the same parameters (copied by name) under the ev router
 * with the given mix weight alpha, c and variant, descriptors built. NULL with err on failure. */
sm_model *sm_ssmoe_twin(const sm_model *m, double alpha, int c, int avg, sm_error *err);

/* Router-collapse diagnostics (SSMoE Fig. 1/6, App. D.6; the exact metric is UNCONFIRMED, this is
 * the natural reading): the mean absolute off-diagonal Pearson correlation between the rows of V
 * (E, d) - the learned router's expert embeddings, or the mean EV descriptors. High values mean the
 * experts' embeddings have collapsed onto a common direction. */
double sm_mean_abs_offdiag_corr(const sm_real *V, int E, int d);

/* SSMoE App. D.6 for an "ev" router: the fraction of the experts picked by top-k on the mixed P that
 * the learned router's own top-k also picks, over every token routed since the last call (which
 * resets the count). NaN for other routers or before any token. */
double sm_ev_router_take_overlap(sm_router *r);

typedef enum { SM_RANK_RANDOM = 0, SM_RANK_ROUTER, SM_RANK_SSMOE } sm_expert_rank;

/* Expert importance per MoE layer on calibration inputs x (n, in_dim), written to score (n_moe, E):
 *   router: mean learned-router probability softmax(x W_r^T / T) per expert;
 *   ssmoe:  mean mixed probability P = alpha p_ev + (1 - alpha) p_r (descriptors built with c, avg);
 *   random: a seeded random score.
 * m must use the topk router. */
sm_status sm_expert_scores(sm_model *m, const float *x, int n, sm_expert_rank rank, double alpha, int c, int avg,
                           uint64_t seed, double *score, sm_error *err);
/* A copy of m with only the experts keep (n_moe, E_keep) of each MoE layer (physically removed:
 * expert tensors and router rows shrink to E_keep, k = min(k, E_keep)). */
sm_model *sm_model_prune_experts(const sm_model *m, const int *keep, int E_keep, sm_error *err);

/* SSMoE's router-collapse diagnostic for MoE layer l of a model with the ev router: the mean
 * |off-diagonal correlation| of the learned router's expert embeddings and of the EV descriptors (the
 * mean of each expert's two). */
sm_status sm_ssmoe_collapse(const sm_model *m, int l, double *router_corr, double *ev_corr, sm_error *err);

/* Sparse upcycling (CLIP-MoE's construction; src/methods/ssmoe/upcycle.c): an MoE model whose layers
 * are those of the trained dense model, every ffn:H layer replaced by an moe:H layer under the MoE
 * config moe (two-layer experts with biases and the dense activation, no shared experts, renormalised
 * top-k) whose E experts are all copies of that FFN (w1 (H,F), b1 (H), w2 (F,H), b2 (F) into each
 * expert's slice). Every other tensor is copied by name; the routers are initialised from rng. Right
 * after upcycling the model computes exactly what the dense model does (the renormalised weights of
 * identical experts sum to 1). NULL with err when dense has no ffn layer, has an moe layer, or moe is
 * not of that form. */
sm_model *sm_model_upcycle(const sm_model *dense, const sm_moe_config *moe, sm_rng *rng, sm_error *err);

/* Expert collapse (representation collapse in the sense of Chi et al. 2022 and SimSMoE, which SSMoE
 * Sec. 2 cites): sim (n_moe) = per MoE layer, the mean over tokens of x (n, in_dim) and over pairs of
 * experts e < f of cos(E_e(h), E_f(h)), h the layer's input in m's own forward. 1 when every expert
 * computes the same function (an upcycled model before fine-tuning); near 0 for independent random
 * experts in high dimension. Built-in two-layer experts d -> H -> d only. */
sm_status sm_ssmoe_expert_similarity(sm_model *m, const float *x, int n, double *sim, sm_error *err);

/* Router collapse as SSMoE's Lemma 3.1 states it: on the logits, not on the router's rows. For MoE
 * layer l of an "ev" model (sm_ssmoe_twin), over the tokens of x (n, in_dim) in m's own forward, with
 *   s = h W_r^T (learned logits), f = h Dbar^T (EV logits), V = alpha f + (1 - alpha) s (the Lemma's
 *   mix, in logit space; the router itself mixes probabilities), r = h R^T for R (E, d) standard
 *   normal rows drawn from seed (the level the layer's inputs alone give),
 * each field is the mean over pairs i != j of |C_ij| / sqrt(C_ii C_jj): uncentred with C = E[z z^T]
 * (the Lemma's E[s_i s_j]), and centred (Pearson over tokens) with C = Cov(z). ev_learned is the mean
 * over all (i, j) of the uncentred |E[f_i s_j]| / sqrt(E[f_i^2] E[s_j^2]): the Lemma's assumption 2
 * (EV-learned independence) holds when it is 0; its assumption 1 (EV orthogonality) when ev is 0. */
typedef struct {
    double learned, ev, mixed, random;         /* uncentred */
    double learned_c, ev_c, mixed_c, random_c; /* centred */
    double ev_learned;
} sm_logit_collapse;
/* out (n_moe); m must use the ev router in every MoE layer. */
sm_status sm_ssmoe_logit_collapse(sm_model *m, const float *x, int n, double alpha, uint64_t seed, sm_logit_collapse *out,
                                  sm_error *err);

/* MoEE-style routing embedding (Li and Zhou 2025; SSMoE Sec. 4.2, Table 6): emb (n, sum_l E_l) = the
 * routing probabilities of every MoE layer, concatenated, from m's forward of x (n, in_dim): softmax of
 * the learned router for topk, the mixture P = alpha p_ev + (1 - alpha) p_r for ev (alpha 0: the
 * learned router's, alpha 1: the EV router's). *overlap (may be NULL) gets the App. D.6 overlap on
 * these inputs, averaged over layers (NaN for the learned router). */
sm_status sm_ssmoe_routing_embed(sm_model *m, const float *x, int n, float *emb, double *overlap, sm_error *err);
/* sum over MoE layers of E: the width of that embedding */
int sm_ssmoe_embed_width(const sm_model *m);

/* Ridge linear probe (a least-squares classifier on one-hot targets, as scikit-learn's
 * RidgeClassifier): features standardised with the training mean and std, a bias, and
 *   W = argmin ||Z W - Y||^2 + lambda n ||W_features||^2   (closed form, LAPACKE_dposv)
 * Deterministic and training-free, so a probe's accuracy depends only on the embedding and lambda. */
typedef struct {
    int D, C;
    double *mu, *sd; /* (D) standardisation */
    double *W;       /* (D + 1, C) the last row is the bias */
} sm_ridge_probe;
sm_status sm_ridge_probe_fit(sm_ridge_probe *p, const float *X, const int *y, int n, int D, int C, double lambda,
                             sm_error *err);
int sm_ridge_probe_predict(const sm_ridge_probe *p, const float *x);
double sm_ridge_probe_accuracy(const sm_ridge_probe *p, const float *X, const int *y, int n);
void sm_ridge_probe_free(sm_ridge_probe *p);

#ifdef __cplusplus
}
#endif
#endif
