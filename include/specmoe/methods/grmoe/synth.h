/* The synthetic routing task of GrMoE (Sec. 6.1, Table 1): N ground-truth subspaces P_e of rank k_r
 * in R^d with mean pairwise overlap ||U_e^T U_e'||_F^2 / k_r = rho*, tokens
 *   x ~ sum_e pi_e N(mu_e, P_e + sigma^2 (I - P_e))        (uniform pi; the paper: mu_e = 0)
 * and, because the paper does not say what the experts learn, a fixed random teacher per component,
 * y = W*_e x (d -> out), so every method trains the same experts on the same regression and the
 * routers differ only in routing (documented in BENCHMARKS.md).
 *
 *   sm_synth_config c; sm_synth_setting(&c, "hard", &err); c.kr = 32;
 *   sm_synth s; sm_synth_create(&s, &c, &rng, &err);
 *   sm_synth_sample(&s, x, y, comp, T, &rng);           // x (T,d), y (T,O), comp (T)
 *   sm_synth_bayes(&s, x, T, pred);                     // the Bayes ceiling's picks (T)
 *   sm_synth_free(&s);
 *
 * What the paper leaves open is a field of the config (bench routing exposes each as a flag):
 *  - kr, the ground-truth rank. The paper gives the routing rank's heuristic k_r ~ d/N = 16 only.
 *  - overlap, the construction of the subspaces:
 *    SM_SYNTH_OVERLAP_TILT: private frames Q_e (mutually orthogonal blocks of a Haar orthogonal
 *      matrix when N k_r <= d, independent Haar frames otherwise) tilted toward one shared Haar
 *      frame S: U_e = orth(cos(theta) Q_e + sin(theta) S); theta is found by bisection so that the
 *      mean pairwise overlap equals rho* (theta = 0 gives the private frames' overlap, pi/2 gives 1).
 *      Every principal angle between two subspaces is about the same.
 *    SM_SYNTH_OVERLAP_SHARED: every U_e holds one common core of m = round(rho* k_r) orthonormal
 *      rows plus k_r - m private rows orthogonal to the core (mutually orthogonal when they fit in
 *      d, else independent): m principal angles are 0 and the rest near 90 degrees.
 *  - mean, a per-component mean offset: mu_e = mean * (a random unit vector in span U_e), so a gate
 *    linear in x can separate the components; 0 is the paper's zero-mean mixture.
 *  - vocab, the token-identity reading: V > 0 discrete token ids, id v belongs to component v mod N
 *    and always has the same embedding, drawn once from its component's distribution; a token is a
 *    uniform component, then a uniform id of that component. Content-blind routing (hash) can then
 *    keep every copy of a token together.
 *
 * Ceilings on the assignment accuracy any router can reach on this data:
 *  - sm_synth_bayes: the Bayes rule of the continuous mixture with the true subspaces and means,
 *    argmax_e (1/sigma^2 - 1) ||P_e x||^2 + 2 mu_e^T x - ||mu_e||^2 (equal priors, equal
 *    determinants), which is argmax_e ||P_e x||^2 when mu = 0. (With a vocabulary, a lookup of the
 *    token id is exact; this rule still scores what the subspaces alone tell.)
 *  - sm_synth_probe: a supervised classifier trained on the true components (a linear softmax
 *    classifier, or a two-layer ReLU MLP), built from the library's MLP module, cross-entropy loss
 *    and Adam: what a gate of that form could learn if it were told the answer.
 *
 * Letters: N components, d width, R = k_r, O = out width, T tokens, V vocabulary, H probe hidden.
 */
#ifndef SPECMOE_SYNTH_H
#define SPECMOE_SYNTH_H

#include "specmoe/core/core.h"
#include "specmoe/core/params.h"
#include "specmoe/nn/module.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SM_SYNTH_OVERLAP_TILT = 0, SM_SYNTH_OVERLAP_SHARED } sm_synth_overlap;

typedef struct {
    int N, d, kr, out;
    double rho;     /* target mean pairwise overlap / k_r */
    double sigma2;  /* noise variance outside the component's subspace */
    int overlap;    /* sm_synth_overlap: how the subspaces are built */
    double mean;    /* norm of the per-component mean mu_e (0: zero-mean, the paper) */
    int vocab;      /* 0: continuous tokens (the paper); V >= N: token-identity variant */
} sm_synth_config;

/* "easy" (rho 0.1, sigma^2 0.1) or "hard" (rho 0.4, sigma^2 0.5), N = 8, d = 128, k_r = 16, out 16,
 * tilted subspaces, zero mean, continuous tokens. */
sm_status sm_synth_setting(sm_synth_config *c, const char *name, sm_error *err);
/* "tilt" or "shared" into *overlap */
sm_status sm_synth_overlap_parse(const char *name, int *overlap, sm_error *err);

typedef struct {
    sm_synth_config cfg;
    double overlap;  /* achieved mean pairwise overlap / k_r */
    sm_real *U;      /* (N, R, d) frames, rows orthonormal */
    sm_real *W;      /* (N, O, d) teachers */
    sm_real *mu;     /* (N, d) component means (zero unless cfg.mean > 0) */
    sm_real *emb;    /* (V, d) token embeddings (NULL unless cfg.vocab > 0) */
} sm_synth;

sm_status sm_synth_create(sm_synth *s, const sm_synth_config *c, sm_rng *rng, sm_error *err);
void sm_synth_free(sm_synth *s);
/* T tokens: x (T,d), targets y (T,O), ground-truth components comp (T). */
void sm_synth_sample(const sm_synth *s, float *x, float *y, int *comp, int T, sm_rng *rng);
/* Mean over pairs of ||U_a^T U_b||_F^2 / k_r for frames (N, R, d). */
double sm_mean_overlap(const sm_real *U, int N, int R, int d);
/* The Bayes rule's component for each of T tokens x (T,d) into pred (T) (see the top of the file). */
void sm_synth_bayes(const sm_synth *s, const float *x, int T, int *pred);

/* 1 if two of the N components send most of their tokens to the same expert (GrMoE's failure mode:
 * two components merge onto one frame and another expert idles), from the n routed tokens' experts
 * pred (n, in 0..E-1) and true components comp (n, in 0..N-1); ties go to the lower expert. */
int sm_synth_merged(const int *pred, const int *comp, int n, int N, int E);

/* A supervised probe: logits = net(x), net = d -> N (hidden 0, the linear softmax classifier) or
 * d -> H -> ReLU -> N (the two-layer MLP), trained with cross-entropy on the true components. */
typedef struct {
    sm_module *net;
    sm_params ps;
    int N, d, max_T;
    sm_real *block;                   /* one allocation for the buffers below */
    sm_real *logits, *dlogits, *probs, *losses; /* (max_T,N) (max_T,N) (max_T,N) (max_T) */
} sm_synth_probe;

typedef struct {
    int hidden;      /* 0: linear softmax classifier; H >= 1: two-layer MLP with H hidden units */
    int steps, batch;/* Adam steps on fresh batches of the training stream */
    double lr;       /* Adam learning rate, cosine-decayed to 0 */
    int test_tokens; /* held-out tokens the accuracy is measured on */
} sm_synth_probe_opts;

sm_status sm_synth_probe_create(sm_synth_probe *p, int d, int N, int hidden, int max_T, sm_rng *init, sm_error *err);
void sm_synth_probe_free(sm_synth_probe *p);
/* Mean cross-entropy of the probe on x (T,d) against labels (T), T <= max_T; with grad != 0 the
 * gradient of that mean is ACCUMULATED (+=) into p->ps.grad. */
double sm_synth_probe_loss(sm_synth_probe *p, const sm_real *x, const int *labels, int T, int grad);
/* Argmax of the probe's logits for each of T tokens into pred (T). */
void sm_synth_probe_predict(sm_synth_probe *p, const sm_real *x, int T, int *pred);
/* Trains a new probe of o->hidden on o->steps batches drawn from s with train_seed (the training
 * split) and writes its accuracy on o->test_tokens tokens drawn with test_seed (the test split). */
sm_status sm_synth_probe_fit(const sm_synth *s, const sm_synth_probe_opts *o, uint64_t init_seed, uint64_t train_seed,
                             uint64_t test_seed, double *test_acc, sm_error *err);

/* Mean and the half-width of its 95% confidence interval (Student t) of n values. */
void sm_mean_ci95(const double *x, int n, double *mean, double *half);

#ifdef __cplusplus
}
#endif
#endif
