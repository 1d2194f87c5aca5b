/* specmoe bench oneshot: SR-MoE's one-shot interference experiment (paper 004, Sec. 4, Tables 1-2,
 * Figs. 2-4 and 6) on four Fashion-MNIST classes.
 *
 * For every (data phase, depth, model, seed) one SR-MoE network (conv stem -> `stages` stages of
 * Linear-ReLU-LayerNorm + a dense MoE over E experts -> head) is trained with AdamW. The three models
 * differ only in routing:
 *   Baseline    linear softmax gate (router "topk" with k = E: the dense mixture), no penalties
 *   Clustering  prototype router (Eq. 2), dense, no penalties
 *   Spectral    prototype router + spectral-norm and stable-rank penalties (Eq. 3-5) + diversity (Eq. 6)
 * Then, for every held-out novel image x_new (never trained on), starting each time from the pristine
 * trained parameters: ONE optimiser step on the batch [x_new ; anchor batch drawn from the training
 * subset] (the paper's Anchor-Batch update), and the accuracy on the whole 4-class test split is
 * measured again. Delta = accuracy after - accuracy before (the interference delta). Two variants:
 *   standard  every parameter receives its gradient
 *   surgical  only the experts on x_new's top-1 path (per stage the argmax of its routing
 *             probabilities) keep their gradient slices; everything else is zeroed before the step
 *             (Fig. 1's "blue path").
 * Reported over seeds: mean and 95% interval of initial accuracy, per-class and mean deltas, path
 * diversity of the test set (distinct top-1 expert chains, dominant chain per class) and the
 * per-expert gradient norm of the standard update ("gradient vitality", Fig. 6).
 *
 * Design notes (the paper leaves these open):
 *  - Labels are relabelled 0..C-1 (n_classes = C): the head predicts only the studied classes.
 *  - The one-shot step uses the task cross-entropy only, for all three models (the penalties shape
 *    training; the update is the same plain gradient step for everybody). The updated copy is
 *    created with the penalties off, which keeps the parameter layout identical.
 *  - The standard and surgical variants share one gradient computation (both start from the same
 *    pristine parameters and batch); the surgical one only masks it.
 *  - Runs are independent: OpenMP over (phase, depth, model, seed), each run single-threaded.
 *  - The network is sm_model_arch_srmoe's layout without its separate projection after the pooling
 *    (stage 1's Linear does that job): with it, 2 stem convs + 4 stages need 17 > SM_MAX_LAYERS
 *    layers and the 4 x 4 model cannot be built. --stem-proj 1 keeps it (at most 3 stages).
 *  - Penalty settings (alpha 0.01, sigma_t 1, rho_t 16 = d/4, beta 0.1) are our choice; the paper
 *    gives none. One-shot SGD lr 1e-3: the standard-update delta grows steeply with it (2e-3 already
 *    costs tens of points on the 4 x 4 models).
 *
 * The benchmark is split in three files around this header:
 *   oneshot.c         parse: flags -> oneshot_settings (every check before any work), and the entry
 *   oneshot_run.c     run: data, training, the one-shot updates -> oneshot_results (progress on stderr)
 *   oneshot_report.c  report: oneshot_results -> Markdown, JSON, gnuplot data and PNGs
 *
 * Letters: C classes (4), S stages, E experts per stage, P = E^S expert paths.
 */
#ifndef SPECMOE_EXPERIMENTS_SRMOE_ONESHOT_H
#define SPECMOE_EXPERIMENTS_SRMOE_ONESHOT_H

#include "specmoe.h"

#define MAX_C 10
#define MAX_PHASES 4
#define MAX_DEPTHS 4
#define MAX_S 8
#define MAX_E 16
#define MAX_PATHS 4096
#define N_MODELS 3

/* "Baseline", "Clustering", "Spectral" */
extern const char *const oneshot_model_names[N_MODELS];

typedef struct {
    int C, classes[MAX_C];
    int n_phases, phases[MAX_PHASES];   /* training images per class */
    int n_depths, stages[MAX_DEPTHS], experts[MAX_DEPTHS];
    int novel, seeds, seed_offset, width, stem[4], n_stem, eval_batch, anchor;
    int epochs, batch, proto_sq, threads, update_kind;
    double lr, wd, tau, alpha, sigma_t, rho_t, beta, update_lr;
    int on_prototypes, stem_proj;
    const char *data_dir, *out_dir;
    const char *update_optim, *penalty_target; /* as given: sgd|adam, gate|prototypes */
} oneshot_settings;

/* Per-run results. */
typedef struct {
    int ok;
    char err[512];
    double acc0;                        /* initial test accuracy (fraction) */
    double delta[2][MAX_C];             /* [standard, surgical][class]: mean over the class's novel images */
    double delta_mean[2];               /* mean over all novel images */
    int n_paths, n_paths1;              /* distinct top-1 paths on the test set; those with >= 1% of it */
    int dom_path[MAX_C];                /* most frequent path per class (test set) */
    double dom_frac[MAX_C];             /* its share of the class */
    double usage[MAX_C][MAX_S][MAX_E];  /* share of the class's test images whose top-1 at stage s is e */
    double gnorm[MAX_S][MAX_E];         /* mean over novel images of ||grad of expert e at stage s||_2 (standard) */
    double novel_same_path;             /* share of novel images whose path is their class's dominant path */
    double train_s, shot_s;
} oneshot_run_result;

/* Every run: res[((phase * n_depths + depth) * N_MODELS + model) * seeds + seed]. */
typedef struct {
    oneshot_run_result *res;
    int nruns, failed;
    int test_n;           /* images in the test split of the C classes */
    double t_start;       /* sm_time_now() when the run began */
    double seconds;       /* wall time of loading, training and the one-shot updates */
} oneshot_results;

/* The network of (depth, model) (model 0 Baseline, 1 Clustering, 2 Spectral); penalties 0 leaves the
 * Spectral model's penalties off (the copy the one-shot update runs on). */
sm_status oneshot_make_config(sm_model_config *mc, const oneshot_settings *o, int depth, int model, int penalties,
                              sm_error *err);
/* Loads the data and runs every (phase, depth, model, seed); a run that fails is recorded in its
 * result (ok 0) and reported on stderr; only the data loading fails the whole run. The caller frees
 * R->res. */
sm_status oneshot_run(const oneshot_settings *o, oneshot_results *R, sm_error *err);
/* Markdown on stdout and in OUT/oneshot.md, oneshot.json, the plot data and PNGs; returns the exit
 * code (1 if a file cannot be written or a run failed). */
int oneshot_report(const oneshot_settings *o, const oneshot_results *R);

#endif
