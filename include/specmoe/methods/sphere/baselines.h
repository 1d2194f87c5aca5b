/* The plasticity baselines SPHERE compares against (papers/000 Sec. 5.1 and App. J.2), on any
 * sm_model, for PPO's actor (src/rl/ppo.c's --pw, --redo, --cbp):
 *
 *   PW    Parseval regularisation (Chung et al. 2024): lambda * sum_W ||W W^T - s I||_F^2 over the
 *         hidden weight matrices, a penalty whose exact gradient 4 lambda (W W^T - s I) W is added
 *         to the parameter gradient.
 *   ReDo  recycling dormant neurons (Sokar et al. 2023): every F gradient steps, the tau-dormant
 *         hidden units of the last forward get fresh incoming weights, zero outgoing weights and
 *         cleared Adam moments.
 *   CBP   continual backprop (Dohare et al. 2024): after every gradient step, a running
 *         contribution utility per hidden unit; a fraction rho of the mature units (age > m) with
 *         the lowest utility is reinitialised (as ReDo, plus the next layer's bias absorbing the
 *         unit's mean contribution).
 *   SN    spectral normalisation (Miyato et al. 2018, Bjorck et al. 2021) of the same matrices as PW:
 *         W / sigma_max(W), sigma from one power iteration per step, its gradient as torch's.
 *   SR    spectral regularisation (Lewandowski et al. 2025): lambda * sum_W (sigma_max(W)^k - 1)^2 over
 *         every weight matrix (output layers and routers too), sigma from one power iteration per
 *         step, its gradient 2 lambda (sigma^k - 1) k sigma^(k-1) u v^T added to the parameter gradient.
 *   C-CHAIN  churn reduction (Tang et al. 2025): lambda * L_churn, the mean squared change of the
 *         outputs on a reference batch between the current parameters and those before the last
 *         optimiser step (no gradient through lambda). lambda follows the authors' PPO code
 *         (bluecontra/C-CHAIN, crl_dmc): 100 for the first 50 updates of a launch (each task of a
 *         continual sequence is one), then after every update beta * mean |L_main| / (mean L_churn
 *         + 1e-8) * frac over the last 100 updates' final minibatches, frac the learning rate's
 *         annealing fraction (1 without annealing), beta 0.05 (their target_rel_loss_scale).
 *
 *   sm_baselines_config bc = {.pw = 1, .pw_coef = 1e-3, .pw_scale = 1};
 *   sm_baselines *b = sm_baselines_create(&bc, actor, &err);
 *   ... forward, backward of the actor into actor->params.grad ...
 *   sm_baselines_grad(b, actor);                       // adds the penalties' gradients
 *   sm_optim_step(&opt, &actor->params, lr);
 *   sm_baselines_after_step(b, actor, &opt, rows, &rng); // resets, from the activations of that forward
 *
 * Hidden units are those of the dense layers followed by a dense layer or the head (units of
 * `layers.<i>`) and those of each built-in MLP expert's hidden layers (`experts.w1`, `experts.wh`);
 * a gate MLP, a router, factory experts, shared experts and conv layers are left alone.
 */
#ifndef SPECMOE_METHODS_SPHERE_BASELINES_H
#define SPECMOE_METHODS_SPHERE_BASELINES_H

#include "specmoe/core/optim.h"
#include "specmoe/nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- PW ------------------------------------------------------------------------------------- */

/* 1 if tensor i of ps is a hidden weight matrix PW regularises: a 2-D `.weight` that is not the head's
 * nor a router's, or an MLP expert block `experts.w1` / `experts.wh` / `shared.w1` (each (.., r, c)
 * slice one matrix). The output layers (`head.weight`, `experts.w2`, a LayerNorm expert's last
 * `experts.<e>.<L>.weight`) are left out, as in Chung et al. */
int sm_parseval_tensor(const sm_params *ps, int i);

/* sum over the selected matrices W (r x c, rows = output units) of ||W W^T - s I_r||_F^2; adds
 * coef * its gradient 4 (W W^T - s I) W into grad (laid out as ps->data; NULL: value only).
 * work holds r*r + r*c values for the largest matrix (sm_parseval_work_values). */
double sm_parseval_penalty(const sm_params *ps, sm_real *grad, double s, double coef, sm_real *work);
size_t sm_parseval_work_values(const sm_params *ps);

/* ---- hidden units --------------------------------------------------------------------------- */

/* One layer of H hidden units: unit u's incoming weights are row u of the (H, In) block at w_in (+ its
 * bias b_in[u]), its outgoing weights column u of the (O, H) block at w_out (b_out: the next layer's
 * bias, O values, or NULL); its activations in the last forward are column u of h (rows, H). Offsets
 * are element offsets into the parameter block (for the optimiser's moments). */
typedef struct {
    int layer, expert, depth; /* model layer, expert (-1 for a dense layer), hidden layer of the expert */
    int H, In, O, rows;       /* units, their fan-in, the next layer's width, rows of the forward */
    int t_in;                 /* the incoming weight tensor (its init redraws fresh rows) */
    size_t in_off, bin_off, out_off, bout_off; /* bin_off / bout_off: (size_t)-1 without bias */
    const sm_real *h;
} sm_unit_layer;

/* The hidden-unit layers of m after a forward of T examples, into out (at most max); returns how many. */
int sm_unit_layers(sm_model *m, int T, sm_unit_layer *out, int max);

/* Reinitialises the listed units of L: fresh incoming weights (new draws of the tensor's
 * initialiser), zero incoming bias, zero outgoing weights, and the Adam moments of all of them cleared. */
void sm_unit_reinit(sm_model *m, sm_optim *opt, const sm_unit_layer *L, const int *units, int n, sm_rng *rng);

/* ReDo on every unit layer: reinitialises the units whose score mean_n |h| / layer mean is <= tau
 * (sm_dormant_fraction); a layer with no rows (an expert no example chose) is skipped. Returns the
 * number of units reset. */
int sm_redo(sm_model *m, sm_optim *opt, int T, double tau, sm_rng *rng);

/* ---- CBP ------------------------------------------------------------------------------------ */

typedef struct sm_cbp sm_cbp;
sm_cbp *sm_cbp_create(sm_model *m, double rate, double decay, int maturity, sm_error *err);
void sm_cbp_free(sm_cbp *c);
/* One generate-and-test step after an optimiser step whose forward had T examples: ages + 1,
 * utility u = decay u + (1 - decay) mean_n|h| sum_k |w_out[k]|, and per layer n = rate * (#mature)
 * units replaced (a fraction below 1 by a Bernoulli draw, as GnT's default); the mature ones with
 * the lowest bias-corrected utility u / (1 - decay^age) are reinitialised, the next layer's bias
 * takes their mean contribution w_out f / (1 - decay^age), their age, utility and mean are zeroed.
 * Returns the number of units replaced. */
int sm_cbp_step(sm_cbp *c, sm_model *m, sm_optim *opt, int T, sm_rng *rng);

/* ---- C-CHAIN -------------------------------------------------------------------------------- */

/* The churn of n reference rows: L = (1/n) sum_t sum_j (out_tj - target_tj)^2, its gradient w.r.t.
 * out written into dout (n, A) (may be NULL). */
double sm_churn_loss(sm_real *dout, const sm_real *out, const sm_real *target, int n, int A);

/* ---- SN ------------------------------------------------------------------------------------- */

/* Spectral normalisation (Miyato et al. 2018; Bjorck et al. 2021) of the hidden weight matrices PW
 * selects (sm_parseval_tensor), as torch.nn.utils.parametrizations.spectral_norm does it: the table
 * holds W_sn = W / sigma with sigma = u^T W v from a power iteration whose u, v are constants for
 * the gradient; the raw W = sigma W_sn lives only between sm_sn_to_raw and sm_sn_from_raw. */
typedef struct sm_sn sm_sn;
/* Draws u, runs 15 power iterations per matrix (torch's start) and normalises m's table in place. */
sm_sn *sm_sn_create(sm_model *m, sm_rng *rng, sm_error *err);
void sm_sn_free(sm_sn *s);
/* Before the optimiser step: the gradient G w.r.t. W_sn becomes the raw one (G - <G, W_sn> u v^T) / sigma
 * and the table holds the raw W, which the step then updates. */
void sm_sn_to_raw(sm_sn *s, sm_model *m);
/* After it: one power iteration on the raw W (u, v, sigma), and the table back to W / sigma. */
void sm_sn_from_raw(sm_sn *s, sm_model *m);
/* The largest sigma (the last power iteration's) over the matrices. */
double sm_sn_sigma_max(const sm_sn *s);
/* The raw gradient of one r x c matrix (exported for the gradient check): dW = (G - <G, Wsn> u v^T) / sigma. */
void sm_sn_backward(sm_real *dW, const sm_real *G, const sm_real *Wsn, const sm_real *u, const sm_real *v, double sigma, int r,
                    int c);

/* ---- SR ------------------------------------------------------------------------------------- */

/* Spectral regularisation (Lewandowski et al. 2025): lambda * sum_W (sigma_max(W)^k - 1)^2 keeps the
 * largest singular value of every layer near 1 (its value at a well-scaled initialisation). The
 * matrices are every weight matrix of the network, the output layers and routers too (the paper
 * regularises every layer): each 2-D `.weight` and each (.., r, c) slice of an MLP expert block
 * `experts.w1` / `wh` / `w2`, `shared.w1` / `w2` (one matrix per expert). Biases, 1-D gains and conv
 * kernels get no term. sigma_max by power iteration with persistent u, v per matrix (15 iterations at
 * the start, 1 per step, as SN), its gradient d sigma / dW = u v^T with u, v constants. */
int sm_specreg_tensor(const sm_params *ps, int i);
/* One matrix W (r, c): with sigma = u^T W v (u, v held), returns (sigma^k - 1)^2 and, when dW is not
 * NULL, adds coef * 2 (sigma^k - 1) k sigma^(k-1) u v^T into dW; sigma written to *sigma (may be NULL). */
double sm_specreg_term(sm_real *dW, const sm_real *W, const sm_real *u, const sm_real *v, int r, int c, double k, double coef,
                       double *sigma);
typedef struct sm_specreg sm_specreg;
/* Draws u and runs 15 power iterations per matrix; NULL with err set for lambda < 0, k < 1, or a
 * network without a weight matrix. */
sm_specreg *sm_specreg_create(sm_model *m, double coef, double k, sm_rng *rng, sm_error *err);
void sm_specreg_free(sm_specreg *s);
/* One power iteration per matrix on m's weights, then the penalty's gradient (lambda included) added
 * to m->params.grad; returns sum_W (sigma^k - 1)^2 without lambda. */
double sm_specreg_grad(sm_specreg *s, sm_model *m);
/* The largest sigma over the matrices (the last power iteration's). */
double sm_specreg_sigma_max(const sm_specreg *s);

/* ---- together, for an agent ----------------------------------------------------------------- */

typedef struct {
    int pw;                /* Parseval regularisation on */
    double pw_coef, pw_scale;
    int redo;              /* ReDo on */
    int redo_every;        /* gradient steps between resets */
    double redo_tau;
    int cbp;               /* continual backprop on */
    double cbp_rate, cbp_decay;
    int cbp_maturity;
    int sn;                /* spectral normalisation of the hidden weight matrices */
    double specreg;        /* spectral regularisation's lambda (0: off) */
    double specreg_k;      /* its exponent k */
    int cchain;            /* C-CHAIN churn reduction on */
    double cchain_ratio;   /* beta of lambda = beta mean |L_main| / mean L_churn */
} sm_baselines_config;

typedef struct sm_baselines sm_baselines;
/* NULL with err set when nothing in m can carry a switched-on baseline (no hidden weight matrices,
 * no hidden units). Returns a valid object with nothing on when the config switches nothing on. */
sm_baselines *sm_baselines_create(const sm_baselines_config *c, sm_model *m, sm_rng *rng, sm_error *err);
void sm_baselines_free(sm_baselines *b);
/* C-CHAIN's churn on n reference rows x (n <= m->max_T; call before the minibatch's own forward):
 * the outputs of m against those of the parameters before the last optimiser step, its gradient kept
 * aside (nothing the first time: there is no previous step yet). */
void sm_baselines_churn(sm_baselines *b, sm_model *m, const float *x, int n);
/* Adds the penalties' gradients (PW, SR, C-CHAIN) to m->params.grad (call after the base backward, before clipping,
 * with the main loss L_main that sets C-CHAIN's coefficient), and keeps the parameters the coming
 * optimiser step starts from (C-CHAIN's previous iterate). */
void sm_baselines_grad(sm_baselines *b, sm_model *m, double loss_main);
/* After an update's last minibatch (PPO: a rollout's epochs): C-CHAIN's coefficient for the next
 * update, from the windows of the updates' last |L_main| and L_churn; frac scales it as the
 * learning rate's annealing does (1 without annealing). */
void sm_baselines_end_update(sm_baselines *b, double frac);
/* Right before clipping and the optimiser step, after every gradient has been added: SN's raw
 * gradient and weights (sm_sn_to_raw). */
void sm_baselines_before_step(sm_baselines *b, sm_model *m);
/* After an optimiser step: SN's normalised weights back (sm_sn_from_raw), then the resets, from the
 * activations of the step's forward of T examples. */
void sm_baselines_after_step(sm_baselines *b, sm_model *m, sm_optim *opt, int T, sm_rng *rng);
/* The state a resumed run needs to continue bit for bit (the step count, CBP's utilities, means and
 * ages, SN's and SR's u, v and sigma, C-CHAIN's previous parameters, coefficient and windows), as bytes of this build: its size, and
 * a copy out of b or into it (the network's shapes must be those it was taken from). */
size_t sm_baselines_state_bytes(const sm_baselines *b);
void sm_baselines_state_save(const sm_baselines *b, void *out);
void sm_baselines_state_load(sm_baselines *b, const void *in);
/* The metrics since the last call (pw/penalty: sum_W ||W W^T - s I||^2 without
 * the coefficient, and cchain/churn, cchain/coef: means over steps; redo/reset_count, cbp/replaced:
 * sums; sn/sigma_max: the largest sigma now; specreg/penalty: sum_W (sigma^k - 1)^2 without lambda, a mean
 * over steps, specreg/sigma_max: the largest sigma now), into keys / vals (room for SM_BASELINES_STATS);
 * returns how many, and starts the next period. */
#define SM_BASELINES_STATS 8
int sm_baselines_stats(sm_baselines *b, const char **keys, double *vals);

#ifdef __cplusplus
}
#endif
#endif
