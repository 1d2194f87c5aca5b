/* GrMoE's synthetic benchmarks (bench routing, Table 1; bench alpha, Fig. 1 / Table 3) on the task
 * of include/specmoe/methods/grmoe/synth.h.
 *
 * Every method trains the same MoE layer (experts d -> H -> out, ReLU, biases) with the same Adam,
 * steps, batch and data stream on MSE to the teacher outputs; only the router differs. Metrics on
 * held-out tokens: assignment accuracy (top-1 expert vs ground-truth component after the best
 * one-to-one matching, Hungarian), load CV, collapse (an expert with < 1% of the tokens), merge
 * (two ground-truth components have the same plurality expert), mean per-token routing entropy,
 * entropy of the load distribution, and test MSE.
 *
 * This header is what the two benchmarks share: a method, the training flags, one layer's
 * build/train/evaluate (synth_layer.c). */
#ifndef SPECMOE_EXPERIMENTS_GRMOE_SYNTH_LAYER_H
#define SPECMOE_EXPERIMENTS_GRMOE_SYNTH_LAYER_H

#include "specmoe.h"
#include "specmoe/methods/grmoe/synth.h"

/* a router and its settings */
typedef struct {
    const char *label, *router;
    int k;          /* 0 = all experts (dense) */
    int renorm;
    double balance; /* Switch loss */
    double capacity;
    int amortize;
} gr_method;

typedef struct {
    int steps, batch, hidden, test_tokens;
    double lr;
} gr_train_opts;

/* The training flags both synthetic benchmarks share; the defaults were chosen on seeds 500-503. */
#define GR_TRAIN_FLAGS(to)                                                                          \
    {"steps", FL_INT, &to.steps, "1500", "training steps per model", 0},                           \
    {"batch", FL_INT, &to.batch, "256", "tokens per step", 0},                                     \
    {"hidden", FL_INT, &to.hidden, "64", "expert hidden width", 0},                                \
    {"lr", FL_DOUBLE, &to.lr, "1e-2", "Adam learning rate (cosine decay)", 0},                     \
    {"test-tokens", FL_INT, &to.test_tokens, "4096", "held-out tokens per evaluation", 0}

/* The shared checks of those flags; 0 if they are valid. */
static inline int gr_train_opts_bad(const gr_train_opts *to, const sm_synth_config *sc) {
    return to->steps < 1 || to->batch < sc->N || to->hidden < 1 || to->test_tokens < 1 || !(to->lr > 0);
}

/* the metrics of one evaluation */
typedef struct {
    double acc, cv, entropy, load_entropy, mse, eff;
    int collapsed; /* some expert gets < 1% of the tokens */
    int merged;    /* two components send most of their tokens to one expert (GrMoE's failure mode) */
} gr_metrics;

/* One trained layer and what it needs to be evaluated again (bench alpha). */
typedef struct {
    sm_moe *moe;
    sm_params ps;
} gr_layer;

/* Router settings a benchmark can change from the defaults (GrMoE's sensitivity study). */
typedef struct {
    int kr;            /* routing rank of grassmann (0: the ground-truth rank) */
    double kappa_init; /* initial kappa of grassmann (0: the router's default) */
    double rho0;       /* grassmann's rho0: the overlap threshold is rho0 * k_r (Eq. 12); < 0: default */
} gr_router_opts;

/* Builds the layer of method me for the task sc, initialised from seed; ro may be NULL (defaults). */
sm_status gr_layer_make(gr_layer *tr, const gr_method *me, const sm_synth_config *sc, const gr_train_opts *to,
                        const gr_router_opts *ro, uint64_t seed, sm_error *err);
void gr_layer_free(gr_layer *tr);
/* Trains on a fresh stream of batches drawn from the task with data_seed (the same for every method). */
sm_status gr_layer_train(gr_layer *tr, const sm_synth *task, const gr_train_opts *to, uint64_t data_seed, sm_error *err);
/* Evaluates on to->test_tokens held-out tokens drawn with test_seed (in batches of the training batch). */
void gr_layer_eval(gr_layer *tr, const sm_synth *task, const gr_train_opts *to, uint64_t test_seed, gr_metrics *res);

/* One progress line on stderr per finished run, so a long benchmark shows it is alive:
 * "bench routing: [12/400] GrMoE seed 3 done: acc 91.2%, load CV 0.08 (41 s)". Thread-safe; *done
 * counts the runs finished so far (shared by the threads); g is NULL for a failed run. */
void gr_progress(const char *bench, int *done, int total, const char *label, int seed, const gr_metrics *g, double t0);

#endif
