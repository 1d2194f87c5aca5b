/* SPHERE (papers/000; REFERENCE-NOTES "SPHERE"): a Parseval-style penalty on the routing-weighted
 * expert features that keeps the spectrum of an MoE policy's features - and with it the eNTK's
 * effective rank - wide through continual RL.
 *
 * The features of T samples at one expert layer: phi (T, D), row t = concat_e p_e(x_t) h_e(x_t), with
 * h_e the expert's hidden activations (H of them, D = E H) and p_e the sparse top-k routing weight
 * (0 for unselected experts). With A the Gram matrix of phi scaled by 1/T - in feature space
 * phi^T phi / T (D x D) or in sample space phi phi^T / T (T x T), whichever is smaller; the two share
 * their non-zero eigenvalues, so every quantity below is the same either way -
 *
 *   L = ||A||_F^2 - tr(A)^2 / D                                  (SPHERE Eq. 26, App. A.2)
 *
 * is D times the variance of A's D eigenvalues (the T x T branch pads with zeros): zero exactly when
 * the spectrum is flat, a Parseval frame up to scale. Its gradient, with K the T x T Gram:
 *
 *   dL/dphi = (4/T) K phi - (4 tr(K) / (T D)) phi     (sample space)
 *           = (4/T) phi A - (4 tr(A) / (T D)) phi     (feature space)
 *
 * (d||K||^2 = 2 <K, dK> and dK = (dphi phi^T + phi dphi^T) / T give (4/T) K phi; tr K = ||phi||^2 / T
 * gives the second term), checked against finite differences in double precision by
 * tests/test_grad_sphere.c. */
#ifndef SPECMOE_SPHERE_H
#define SPECMOE_SPHERE_H

#include <stddef.h>
#include <stdint.h>

#include "specmoe/core/core.h"
#include "specmoe/nn/model.h"
#include "specmoe/nn/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Values of scratch sm_sphere_penalty needs for T samples of width D: the smaller Gram and a (T, D) product. */
size_t sm_sphere_work_values(int T, int D);

/* L of Eq. 26 for phi (T, D); when dphi (T, D) is given, dphi += scale * dL/dphi. work holds
 * sm_sphere_work_values(T, D) values. T, D >= 1. */
double sm_sphere_penalty(const sm_real *phi, int T, int D, sm_real *dphi, sm_real scale, sm_real *work);

/* SPHERE's features of an MoE layer after its forward (sparse routes; its experts the built-in MLPs):
 * phi (T, E H), row t = concat_e p_e(x_t) h_e(x_t), h_e the last hidden layer of expert e (after the
 * activation) and p_e the combine weight of the assignment (t, e), 0 where e was not selected.
 * Refused for soft routes and factory experts not laid out as moe.h's feat_seq says (LayerNorm's
 * experts are: Linear -> LayerNorm -> act blocks, then the output layer). */
sm_status sm_sphere_features(sm_moe *m, sm_real *phi, sm_error *err);
/* Its backward before the layer's: dphi (T, E H) -> the features' gradient (sm_moe_features' dfeat,
 * which the layer's backward adds in) and the combine weights' (route.dweight, which the router's
 * backward consumes). */
void sm_sphere_features_backward(sm_moe *m, const sm_real *dphi);

/* The same at hidden layer j of the experts (0 <= j < L; L-1 gives sm_sphere_features), with
 * weighted = 0 for the "unweighted features" ablation (Table 1): row t = concat_e [e selected] h_e,
 * whose backward leaves the combine weights alone. */
sm_status sm_sphere_features_at(sm_moe *m, int j, int weighted, sm_real *phi, sm_error *err);
/* Eq. 26 on those features without forming phi (src/methods/sphere/features.c): over the pairs of
 * assignments that share an expert, in sample space; per_expert: the sum of each expert's own
 * penalty. The layer must have built-in experts and a sparse route. work holds
 * sm_sphere_routed_work_values(T, H) values; the forward returns L and leaves the (T, T) Gram in work,
 * which its backward reads: scale * dL/dphi into layer j's feature and (weighted) combine-weight
 * gradients, as sm_sphere_features_at + sm_sphere_penalty + sm_sphere_features_at_backward do. */
double sm_sphere_penalty_routed(sm_moe *m, int j, int weighted, int per_expert, sm_real *work);
void sm_sphere_penalty_routed_backward(sm_moe *m, int j, int weighted, int per_expert, sm_real scale, sm_real *work);
size_t sm_sphere_routed_work_values(int T, int H);
void sm_sphere_features_at_backward(sm_moe *m, int j, int weighted, const sm_real *dphi);

/* The gradient Gram's rows (Prop. 4.2, Eq. 20; src/methods/sphere/gradgram.c has the derivation and
 * the choices): psi (T, E H), row t = concat_e psi_{t,e} with
 *   psi_{t,e} = d(u^T out_t) / d z_{t,e} = p_e(x_t) relu'(z_{t,e}) (W2_e^T u)     (0 if e not selected)
 * z_{t,e} (H) the pre-activation of expert e's last hidden layer, W2_e (O, H) its output layer, u (O)
 * the scalar output's direction, out_t the layer's output; weighted = 0 drops p_e. Exact only when
 * the layer's output is the network's (a moehead layer: nothing after it) and the experts are ReLU;
 * SM_ERR_ARG otherwise (and for soft routes or factory experts). */
sm_status sm_sphere_grad_features(sm_moe *m, const sm_real *u, int weighted, sm_real *psi, sm_error *err);
/* Its backward: dpsi (T, E H) -> dw2 (E, O, H) += (the output weights' gradient) and the combine
 * weights' gradient route.dweight += (weighted; the router's backward consumes it). The ReLU masks are
 * piecewise constant: nothing flows into the hidden layers. */
void sm_sphere_grad_features_backward(sm_moe *m, const sm_real *u, int weighted, const sm_real *dpsi, sm_real *dw2);

/* ---- SPHERE in training (App. A.3) ------------------------------------------------------------
 * The penalty's gradient is kept apart from the base loss's and combined per minibatch:
 *   "grad":  g = g_base + s grad L,       s      = rho ||g_base|| / (||grad L|| + 1e-8)
 *   "loss":  g = g_base + lambda grad L,  lambda = rho |L_base| / (L + 1e-8)
 *   "fixed": g = g_base + rho grad L      (L_base + rho L optimised directly: App. J.12's footnote,
 *                                          the large-E runs of the paper's Table 24)
 * with s and lambda constants (no gradient flows through them) and the norms global over every
 * parameter the step updates (grad L is zero outside the regularised network). */
typedef enum { SM_SPHERE_GRAD = 0, SM_SPHERE_LOSS, SM_SPHERE_FIXED } sm_sphere_mode;
/* Which Gram Eq. 26 shapes: the routing-weighted features' (Eq. 19, SPHERE itself) or, for Table 1's
 * "gradient-Gram" ablation, the concatenated expert backprop vectors' (Eq. 20; defined at
 * sm_sphere_grad_features below) with the feature Gram left alone. */
typedef enum { SM_SPHERE_GRAM_FEATURE = 0, SM_SPHERE_GRAM_GRADIENT } sm_sphere_gram;

typedef struct {
    double rho;          /* the ratio; 0 turns SPHERE off */
    sm_sphere_mode mode;
    int all_layers;      /* ablation: every hidden expert layer, not only the last (Table 1) */
    int per_expert;      /* ablation: sum over experts of each expert's own Eq. 26 (no cross-expert terms) */
    int unweighted;      /* ablation: h_e in place of p_e h_e (gradient Gram: psi_e without its p_e) */
    sm_sphere_gram gram; /* ablation: SM_SPHERE_GRAM_GRADIENT regularises Eq. 20's Gram instead */
    uint64_t seed;       /* gradient Gram: the scalar output's direction u (sm_sphere_direction) */
} sm_sphere_config;

/* "feature" or "gradient" into *gram; -1 for anything else */
int sm_sphere_gram_parse(const char *s, sm_sphere_gram *gram);
/* Why c cannot regularise a model of config mc with the gradient Gram (the MoE layer not the
 * network's output, experts not ReLU, all_layers), or NULL; always NULL for the feature Gram. For a
 * front end to refuse before any work; sm_sphere_reg_create checks it too. */
const char *sm_sphere_gram_refusal(const sm_sphere_config *c, const sm_model_config *mc);
/* The fixed unit direction u (n) of the scalar output u^T f(x) that SPHERE's eNTK diagnostics and
 * the gradient Gram use (f: the actor's action means, or a classifier's logits): n standard normal
 * draws from an RNG of its own seeded with seed ^ 0x5350484552 ("SPHER"), normalised. */
void sm_sphere_direction(uint64_t seed, sm_real *u, int n);

/* "grad", "loss" or "fixed" into *mode; -1 for anything else */
int sm_sphere_mode_parse(const char *s, sm_sphere_mode *mode);
/* The coefficient of grad L above: s from the two global gradient norms (mode grad), lambda
 * from the two losses (mode loss), or rho itself (mode fixed). */
double sm_sphere_coef(const sm_sphere_config *c, double gnorm_base, double gnorm_pen, double loss_base,
                      double loss_pen);

/* The penalty on a model: its sites are the last hidden layer of the experts of the model's last
 * MoE layer (all_layers: every hidden layer of every MoE layer). Each needs built-in MLP experts and
 * a sparse (top-k) router; the model must carry no penalties of its own (SR-MoE's would enter the
 * penalty's backward). The gradient Gram (gram = SM_SPHERE_GRAM_GRADIENT) further needs the MoE layer
 * to be the network's output (a last moehead layer), ReLU experts and all_layers = 0; its direction u
 * is sm_sphere_direction(c->seed, u, n_classes). NULL with the reason in err otherwise. */
typedef struct sm_sphere_reg sm_sphere_reg;
sm_sphere_reg *sm_sphere_reg_create(const sm_sphere_config *c, sm_model *m, sm_error *err);
void sm_sphere_reg_free(sm_sphere_reg *r);
/* After m's forward of T rows (T <= m->max_T) and after the base loss's backward: returns L (summed
 * over sites; per_expert: over experts too) and ADDS its gradient over m's parameters into pv->grad
 * (the gradient Gram: the experts' output weights' part directly, the routing's through the backward below)
 * (pv a view of m->params: sm_params_view), by one more backward of m with a zero output gradient,
 * the routers' auxiliary-loss weights (balance, z-loss) set to 0 for that pass, and the penalty's
 * gradient on the features and combine weights as the only source. Overwrites m->dlogits. */
double sm_sphere_reg_grad(sm_sphere_reg *r, const sm_params *pv, int T);

/* One minibatch of App. A.3, after the base backward: the regularised model's parameter gradients
 * (m->params.grad) and those of the other parameter sets the step updates (others, e.g. a critic
 * and a log-std; n_others may be 0) hold g_base, loss_base is the base loss. Computes grad L
 * (sm_sphere_reg_grad, into a buffer of its own), the coefficient from the global norms (over m
 * and others) or the losses, and adds coef * grad L into m->params.grad. */
typedef struct {
    double penalty;    /* L */
    double coef;       /* s (grad mode) or lambda (loss mode) */
    double gnorm_base; /* ||g_base|| over every set */
    double gnorm_pen;  /* ||grad L|| */
} sm_sphere_stats;
void sm_sphere_step(sm_sphere_reg *r, sm_params *const *others, int n_others, double loss_base, int T,
                    sm_sphere_stats *out);
/* "loss" mode in the base backward itself: called after the forward on T rows and before the
 * backward, with the base loss, it computes L and lambda = rho |L_base| / (L + 1e-8) (held fixed) and
 * adds lambda dL/dphi to the experts' feature and combine-weight gradients, which the model's next
 * backward carries with the base loss's (the gradient Gram: its output-weight part goes straight into
 * m->params.grad, which the caller has zeroed before the forward): one backward instead of sm_sphere_step's second one, the
 * same gradient up to rounding. out (may be NULL): penalty and coef; the two norms NaN (not
 * computed). Returns L. Loss mode only (the grad mode's coefficient needs ||grad L|| apart). */
double sm_sphere_inject(sm_sphere_reg *r, double loss_base, int T, sm_sphere_stats *out);

/* The eNTK effective rank of SPHERE Eq. 7, exactly, for a few hundred states: f_i = u^T logits(x_i)
 * (u (V): the scalar projection of the output; SPHERE's actor mean projected on a fixed direction),
 * J (N, P) its per-sample gradients over every parameter of m, K = J J^T (N, N), and
 *   srank = exp(-sum_i p_i log p_i),  p_i = max(lambda_i, 0) / sum_j max(lambda_j, 0)
 * over K's eigenvalues (LAPACKE dsyev). Each row of J is one backward of the forward on x_i in
 * evaluation mode with d logits = u, minus the backward with d logits = 0, so the routers' auxiliary
 * losses and the model's penalties, which add the same gradient to both, drop out exactly. x holds N
 * inputs of m->cfg.in_dim floats; m->max_T >= 1. eig (N), if given, receives K's eigenvalues in
 * descending order. The parameter gradients of m are left zeroed. */
sm_status sm_entk_rank_exact(sm_model *m, const float *x, int N, const sm_real *u, double *rank, double *eig,
                             sm_error *err);

/* A symmetric positive semi-definite operator as a matrix-vector product: out (n) = K v (n). */
typedef void (*sm_matvec_fn)(const double *v, double *out, void *user);
/* The spectral-entropy effective rank exp(-sum p_i log p_i), p_i = lambda_i / tr(K), of an n x n PSD
 * operator known only by its products, by stochastic Lanczos quadrature (SPHERE App. A.5, Eqs. 28-29;
 * src/methods/sphere/slq.c): `probes` Gaussian probes, at most `steps` Lanczos steps each (full
 * reorthogonalisation; steps >= n recovers the spectrum up to the probes' sampling error). rank_se
 * (may be NULL) gets the jackknife standard error over the probes. */
sm_status sm_slq_effective_rank(int n, sm_matvec_fn mv, void *user, int probes, int steps, sm_rng *rng, double *rank,
                                double *rank_se, sm_error *err);
/* The eNTK effective rank of sm_entk_rank_exact by SLQ, without the N x P Jacobian: K v = J (J^T v), J^T v
 * by a batched backward, J w by central differences along w (slq.c says why and what that costs).
 * Memory O(P + steps N); time per product one backward pair and two forwards of the N states. m's
 * parameters are restored exactly and its gradients left zeroed. */
sm_status sm_entk_rank_slq(sm_model *m, const float *x, int N, const sm_real *u, int probes, int steps, sm_rng *rng,
                           double *rank, double *rank_se, sm_error *err);

/* The expert-specialisation metrics of SPHERE App. J.11 at the last MoE layer (built-in MLP experts,
 * top-k route) on a held-out batch x (2 <= N <= m->max_T), forward in evaluation mode; definitions in
 * src/methods/sphere/special.c. knn: neighbours per state for the Jaccard similarity (1..N-1). */
typedef struct {
    double overlap, orthogonality; /* over `pairs` pairs of a state's selected experts (NaN: none) */
    long pairs;
    double silhouette;             /* of gate embeddings by top-1 expert (NaN: one cluster) */
    double knn_jaccard;            /* of selected-expert sets with the knn nearest states */
    double max_vio, active_ratio, entropy; /* load imbalance, experts used, routing entropy / log E */
} sm_sphere_spec;
sm_status sm_sphere_specialisation(sm_model *m, const float *x, int N, int knn, sm_sphere_spec *out, sm_error *err);

/* SPHERE Fig. 6's picture of features phi (N, D) (src/methods/sphere/fig6.c): xy (N, 2) the states in the
 * plane of the two leading singular directions, color (N) each state's dominant direction among the
 * first r, sv (min(N, D), may be NULL) the singular values, descending. */
sm_status sm_sphere_fig6(const sm_real *phi, int N, int D, int r, double *xy, int *color, double *sv, sm_error *err);

/* SPHERE's diagnostics on a fixed held-out batch x (N inputs, N <= m->max_T): the exact eNTK effective
 * rank of u^T f (sm_entk_rank_exact), and, when m has an MoE layer with built-in experts and a sparse
 * router (its last one), the routing-weighted features phi (N, D) of Eq. 26 there: the effective rank
 * of A = phi phi^T / N (its eigenvalues by LAPACKE dsyev; the spectral-entropy rank of Fig. 7), the
 * mean feature norm ||phi_t|| and L itself, and the specialisation metrics of App. J.11 (spec). The
 * forward is in evaluation mode; m's gradients are left zeroed. */
typedef struct {
    double entk_srank;
    int have_features;   /* the rest is set only when 1 */
    double feature_srank, feature_norm, penalty;
    sm_sphere_spec spec; /* App. J.11's metrics (sm_sphere_specialisation, knn = min(5, N - 1)), N >= 2 */
} sm_sphere_diag;
sm_status sm_sphere_diagnose(sm_model *m, const float *x, int N, const sm_real *u, sm_sphere_diag *out, sm_error *err);

#ifdef __cplusplus
}
#endif

#endif
