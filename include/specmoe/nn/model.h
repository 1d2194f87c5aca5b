/* Models: input -> [dense | ffn | moe] layers -> linear head, described by a config that is also
 * what a checkpoint stores (as JSON in the safetensors __metadata__).
 *
 *   dense:W  linear in -> W, then the activation
 *   ffn:H    two-layer MLP width -> H -> width (the dense baseline of an MoE layer with k*H active
 *            hidden units), optional residual
 *   moe:H    MoE layer width -> width with experts width -> H -> width (moe.h), optional residual
 *
 * All parameters live in one sm_params block; all activations in one arena sized for max_T rows.
 * Letters: T batch rows, D input width, W layer width, V classes.
 */
#ifndef SPECMOE_MODEL_H
#define SPECMOE_MODEL_H

#include "specmoe/nn/moe.h"
#include "specmoe/core/params.h"
#include "specmoe/nn/module.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SM_MAX_LAYERS 24

typedef enum {
    SM_LAYER_DENSE = 0, /* dense:W          linear (flattening its input) then the activation */
    SM_LAYER_FFN,       /* ffn:H            two-layer MLP F -> H -> F */
    SM_LAYER_MOE,       /* moe:H            MoE layer F -> F, experts F -> H -> F */
    SM_LAYER_LN,        /* ln               LayerNorm over the F features */
    SM_LAYER_CONV,      /* conv:OC:K:S:P    2-D convolution (K x K, stride S, padding P) then the activation */
    SM_LAYER_MAXPOOL,   /* maxpool:K:S */
    SM_LAYER_AVGPOOL,   /* avgpool:K:S */
    SM_LAYER_GAP,       /* gap              adaptive average pooling to 1 x 1 */
    /* tokens and back ("Don't Flatten, Tokenize!"; src/nn/tokenize.c): rows change from one image
     * to several tokens per example; a moe layer after them mixes each example's tokens (a soft
     * router groups them per example); the layers must end with one row per example */
    SM_LAYER_TOKENS,    /* tokens           PerConv: (c, h, w) -> h*w tokens of c */
    SM_LAYER_PERFEAT,   /* perfeat          PerFeat: (c, h, w) -> c tokens of h*w */
    SM_LAYER_SHUFFLE,   /* shuffle:SEED     a fixed permutation of an image's values (Shuffled, with tokens) */
    SM_LAYER_FLATTEN,   /* flatten          every token of an example into one row */
    SM_LAYER_TOKMEAN,   /* tokmean          the mean of an example's tokens */
    SM_LAYER_TOKSUM,    /* toksum           their sum */
    /* encoders (README, "Encoders"): the Impala ResNet's residual block, and the activation alone */
    SM_LAYER_RES,       /* res:C            x + conv3x3(act(conv3x3(act(x)))), C channels in and out (Impala) */
    SM_LAYER_ACT,       /* act              the activation (--act) alone */
    /* an MoE layer that ends the network (SPHERE's MoE actor): experts are full MLPs F -> H (moe.depth
     * hidden layers) -> V, the classes (action means, logits); optionally a gate MLP of G hidden layers
     * of width GW (each with the activation) in front of the router; no linear head after it */
    SM_LAYER_MOEHEAD    /* moehead:H or moehead:H:G:GW; the last layer */
} sm_layer_kind;

typedef struct {
    sm_layer_kind kind;
    int width;   /* dense: output width; ffn / moe: hidden width of the MLP / of each expert; conv: OC */
    int k, s, p; /* conv / pool: kernel, stride, padding; moehead: gate layers (k) and width (s) */
} sm_layer_spec;

typedef struct {
    int in_dim;             /* D = in_c * in_h * in_w */
    int in_c, in_h, in_w;   /* input image shape (features only: D x 1 x 1) */
    int n_classes;          /* V */
    int n_layers;
    sm_layer_spec layers[SM_MAX_LAYERS];
    sm_act act;             /* activation of dense, conv layers and MLPs */
    int residual;           /* ffn / moe layers add their input to their output */
    sm_moe_config moe;      /* shared by every moe layer (H comes from the layer spec) */
    /* SR-MoE penalties on every MoE stage (Eq. 3-6), 0 = off */
    double spectral_alpha;  /* weight of (sigma_max - sigma_t)^2 + (srank - rho_t)^2 */
    double sigma_t, rho_t;  /* targets */
    double diversity_beta;  /* weight of the CV^2 of batch-mean routing weights */
    int penalty_on_prototypes; /* penalise the router's prototype matrix instead of the linear map feeding it */
    int hidden_ln;          /* LayerNorm in the hidden layers: each dense layer (and a moehead's gate layers and
                             * expert hidden layers, then factory experts) is Linear -> LayerNorm -> act, a
                             * sequential container whose children are named 0, 1, 2 (SPHERE's LN baseline) */
} sm_model_config;

void sm_model_config_default(sm_model_config *c);
/* Parses "dense:256,moe:256" into c->layers. */
sm_status sm_model_parse_arch(sm_model_config *c, const char *arch, sm_error *err);
/* SR-MoE (Sec. 3): conv stem (3x3 stride-2 convs with the given channels, ReLU, 2x2 max-pool,
 * adaptive average pool, linear projection to width d) -> `stages` stages, each a local processor
 * z' = LayerNorm(ReLU(Linear(z))) and an MoE layer over K = moe.router.E experts d -> d -> d.
 * Sets c->layers / n_layers; the router and penalties are the caller's (prototype router, dense). */
sm_status sm_model_arch_srmoe(sm_model_config *c, int stages, int width, const int *stem, int n_stem, sm_error *err);
/* Writes the arch string back ("dense:256,moe:256"). */
void sm_model_format_arch(const sm_model_config *c, char *buf, size_t n);
/* Config <-> JSON text (malloc'd string / strict parse naming the bad field). */
char *sm_model_config_to_json(const sm_model_config *c);
sm_status sm_model_config_from_json(sm_model_config *c, const char *json, sm_error *err);

/* One layer of the stack as the rest of the code sees it; the work is done by its module. */
typedef struct {
    sm_layer_kind kind;
    int in, out, hidden;   /* feature counts (in = ic*ih*iw, out = oc*oh*ow); hidden: ffn / moe H */
    sm_module *mod;        /* the layer's module (child of the model's body) */
    sm_moe *moe;           /* moe layers: the layer inside the module */
} sm_layer;

typedef struct sm_penalty sm_penalty;

/* A classifier: body (a sequential container of the --arch layers, parameters layers.<i>.*) ->
 * head (linear, head.*) -> cross-entropy, plus the penalties the config asks for (penalty.h). */
typedef struct {
    sm_model_config cfg;
    int max_T;
    sm_params params;
    int n_layers;
    sm_layer layers[SM_MAX_LAYERS];
    sm_module *body;        /* seq "layers" */
    sm_module *head;        /* dense "head", no activation (after a moehead layer: the identity) */
    sm_real *arena;         /* the buffers below, one allocation */
    sm_real *input;         /* (T,D) */
    sm_real *logits;        /* (T,V) */
    sm_real *probs;         /* (T,V) */
    sm_real *losses;        /* (T) */
    sm_real *dlogits;       /* (T,V) */
    sm_real *dtop;          /* (T,W) gradient w.r.t. the body's output */
    double aux_loss;        /* sum of routers' auxiliary losses in the last forward */
    double penalty;         /* penalties of the last sm_model_loss */
    int n_penalties;
    sm_penalty *penalties[4];
    unsigned char *fresh;   /* (params.n) sm_model_backward_set's flags (sm_ctx.fresh) */
} sm_model;

/* Builds the model, declares and allocates parameters, and reserves activations for max_T rows.
 * Parameters are initialised from rng (pass NULL to leave them zero, e.g. before loading). */
sm_model *sm_model_create(const sm_model_config *cfg, int max_T, sm_rng *rng, sm_error *err);
void sm_model_free(sm_model *m);
/* What training the model of cfg on batches of up to max_T rows would take, measured on the
 * declared network before anything large is allocated (so a model far larger than memory can be
 * refused with the figure instead of being killed by the OOM killer). */
typedef struct {
    size_t params;      /* parameter values */
    size_t param_bytes; /* one copy of them (sm_real) */
    size_t act_bytes;   /* activations for max_T rows (the router's own small buffers excluded) */
    size_t train_bytes; /* training: values, gradients, two optimiser moments, the float copies a
                         * checkpoint write makes (values and moments), and the activations */
} sm_model_memory;
sm_status sm_model_estimate_memory(const sm_model_config *cfg, int max_T, sm_model_memory *out, sm_error *err);
/* Forward of x (T,D) floats; returns logits (T,V) (owned by the model). */
const sm_real *sm_model_forward(sm_model *m, const float *x, int T, sm_rng *rng, int train);
/* Forward from layer `first` on: h (T, layers[first].in) is that layer's input, e.g. features cached
 * from an earlier full forward when only later layers changed. Returns logits (T,V). A backward
 * after it reads the model's input as the last full forward left it (a layer's backward may read its
 * input again, e.g. a convolution after a train = 0 forward): run it after a full forward only. */
const sm_real *sm_model_forward_from(sm_model *m, int first, const sm_real *h, int T, sm_rng *rng, int train);
/* Mean cross-entropy of the last forward against y (T), plus router aux losses; fills probs.
 * mask (V) optional class mask (task-incremental). */
double sm_model_loss(sm_model *m, const int *y, const unsigned char *mask, int T);
/* Backward of the loss: gradients accumulate into m->params.grad (zero them first). */
void sm_model_backward(sm_model *m, int T);
/* The same into the gradient view pv (sm_params_view of m->params): e.g. a penalty's gradient kept
 * apart from the loss's. */
void sm_model_backward_into(sm_model *m, const sm_params *pv, int T);
/* The gradients SET to the backward's, as sm_params_zero_grad + sm_model_backward give (the same
 * values; only a zero's sign may differ), without zeroing first what the backward overwrites: the dense layers' weights and biases
 * (SM_PARAM_GRAD_CTX) are written with = by their products, the rest zeroed as before. A DQN update
 * on MinAtar: its 1024 -> 128 layer's 512 KB gradient is neither zeroed nor read back. With
 * penalties (which add to gradients before the backward) it is the plain zero + backward. */
void sm_model_backward_set(sm_model *m, int T);
/* Sets an inference-time dial (sm_router_ops.dials: GrMoE's alpha, ev's mix weight, the softmax
 * temperature of any router) of every MoE router to value (text, parsed as a flag value). No
 * retraining: the parameters are untouched. Refused, leaving m unchanged, when key is not a dial of
 * the model's router or the value is invalid for it (the router's own check). */
sm_status sm_model_set_dial(sm_model *m, const char *key, const char *value, sm_error *err);
/* Dormant neurons (sm_dormant_fraction, Sokar et al. 2023) in the last forward of m over T examples:
 * an entry per layer with an activation - dense (its units), conv (a unit is a channel, averaged
 * over positions too) - and per MoE layer one entry per expert (the units of its last hidden layer,
 * over the rows routed to it; built-in MLP experts; each unit scored against the whole layer's mean,
 * so an expert weak throughout is dormant) plus the layer's (expert -1, all experts' units
 * together). Entries go to out (at most max); returns their number. */
typedef struct {
    int layer, expert; /* expert -1: the whole layer */
    double fraction;   /* of its units that are tau-dormant */
} sm_dormant_entry;
int sm_model_dormant(sm_model *m, int T, double tau, sm_dormant_entry *out, int max);
/* Number of MoE layers and access to the i-th. */
int sm_model_n_moe(const sm_model *m);
sm_moe *sm_model_moe(const sm_model *m, int i);
/* Active parameters per token (experts counted k times, not E) - for "same active size" baselines. */
size_t sm_model_active_params(const sm_model *m);
/* Multiply-adds of one example's forward through the layers and the head (sm_module_macs), and of
 * one training step on a batch of B: two forwards (target and online, as the DQN family does) or one,
 * plus the backward - both operands' gradients of every product, except the input gradient of the
 * first layer. */
double sm_model_macs(const sm_model *m);
double sm_model_update_macs(const sm_model *m, int B, int forwards);

#ifdef __cplusplus
}
#endif
#endif
