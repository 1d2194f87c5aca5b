/* specmoe command-line tool: train, eval, info, bench. */
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "flags.h"

int cli_fail(sm_status st, const sm_error *err) {
    fprintf(stderr, "specmoe: %s\n", err->msg);
    return st == SM_ERR_ARG ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
}

int cli_write_text(const char *path, const char *text) {
    if (!text) return -1;
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int bad = fputs(text, f) < 0;
    return (fclose(f) != 0 || bad) ? -1 : 0;
}

void cli_bprintf(cli_buf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->failed = 1;
            return;
        }
        if (b->s && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = b->cap ? 2 * b->cap : 65536;
        while (cap < b->n + (size_t)w + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

void cli_bench_train_config(sm_train_config *tc, int epochs, int batch, double lr, double wd, uint64_t seed) {
    sm_train_config_default(tc);
    tc->epochs = epochs;
    tc->batch = batch;
    tc->opt.kind = SM_OPT_ADAMW;
    tc->opt.lr = lr;
    tc->opt.weight_decay = wd;
    tc->seed = seed;
    tc->log_every = 1 << 30; /* silent: the benchmark prints its own summary */
}

void cli_set_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}

/* ---------------------------------------------------------------------------------------------- */
/* options shared by train and eval */

typedef struct {
    const char *data, *classes, *arch, *act, *router, *expert_act, *out, *resume, *optim, *schedule;
    int per_class, residual, experts, topk, noisy, renorm, shared, expert_bias, epochs, batch, threads;
    int log_every, val_size;
    long warmup, ckpt_every, stop_after, fault_nan_step;
    double temperature, capacity, lr, final_lr, momentum, beta1, beta2, eps, weight_decay, clip;
    double balance, zloss, kappa_init, alpha, subspace_beta, rho0;
    int kr, amortize, amort_hidden, pairs, slots, soft_group, soft_norm, proto_sq, stages, width;
    double tau, spectral_alpha, sigma_t, rho_t, diversity_beta;
    const char *model, *stem, *penalty_target;
    uint64_t seed, router_seed;
} opts;

/* Router flags shared by train (and the routing benchmarks). Defaults that depend on the router
 * (switch: k = 1 and balance 0.01; grassmann: dense, k = E; soft: k = 1, slots = batch / E) are
 * applied in build_model_config when the flag was not given. */
#define ROUTER_FLAGS(o)                                                                                        \
    {"router", FL_STRING, &o.router, "topk", "router: topk|switch|expert-choice|hash|random|soft|vmf|grassmann", 0}, \
    {"experts", FL_INT, &o.experts, "8", "experts per MoE layer", 0},                                           \
    {"topk", FL_INT, &o.topk, "2", "experts per token (= experts: dense mixture; grassmann default: all)", 0},    \
    {"temperature", FL_DOUBLE, &o.temperature, "1", "router softmax temperature", 0},                            \
    {"noisy", FL_BOOL, &o.noisy, "0", "noisy top-k gating (Shazeer 2017) during training", 0},                  \
    {"renorm", FL_BOOL, &o.renorm, "1", "renormalise the k selected routing weights", 0},                        \
    {"capacity", FL_DOUBLE, &o.capacity, "0", "capacity factor (0 = unlimited; expert-choice: tokens per expert = cf*T/E)", 0}, \
    {"balance", FL_DOUBLE, &o.balance, "0", "Switch load-balancing loss weight (switch default 0.01)", 0},       \
    {"zloss", FL_DOUBLE, &o.zloss, "0", "router z-loss weight", 0},                                              \
    {"kappa-init", FL_DOUBLE, &o.kappa_init, "1", "vmf/grassmann initial concentration kappa", 0},               \
    {"alpha", FL_DOUBLE, &o.alpha, "1", "grassmann sparsity dial alpha (changeable at eval)", 0},                 \
    {"kr", FL_INT, &o.kr, "16", "grassmann routing rank k_r", 0},                                                \
    {"amortize", FL_BOOL, &o.amortize, "0", "grassmann amortiser h(x) = E softmax(MLP(x))", 0},                  \
    {"amort-hidden", FL_INT, &o.amort_hidden, "32", "amortiser hidden width", 0},                                \
    {"subspace-beta", FL_DOUBLE, &o.subspace_beta, "0.01", "grassmann subspace-overlap regulariser weight", 0},  \
    {"rho0", FL_DOUBLE, &o.rho0, "0.3", "grassmann overlap threshold rho0", 0},                                  \
    {"pairs", FL_INT, &o.pairs, "0", "grassmann sampled pairs per step (0 = 4E, -1 = all)", 0},                  \
    {"slots", FL_INT, &o.slots, "0", "soft: slots per expert (0 = group / E, or batch / E)", 0},                 \
    {"soft-group", FL_INT, &o.soft_group, "0", "soft: tokens per SoftMoE group (0 = the whole batch)", 0},       \
    {"soft-norm", FL_BOOL, &o.soft_norm, "1", "soft: normalise tokens and slot parameters, learned scale", 0},    \
    {"router-seed", FL_U64, &o.router_seed, "1", "seed of the random router at evaluation", 0},                 \
    {"tau", FL_DOUBLE, &o.tau, "1", "prototype router temperature tau (SR-MoE Eq. 2)", 0},                       \
    {"proto-sq", FL_BOOL, &o.proto_sq, "0", "prototype router: squared Euclidean distance", 0}

#define DATA_FLAGS(o)                                                                                         \
    {"data", FL_STRING, &o.data, SM_FASHION_MNIST_DIR, "directory with the Fashion-MNIST IDX .gz files", 0},   \
    {"classes", FL_STRING, &o.classes, "all", "class subset, e.g. 0,1,7,8", 0},                               \
    {"per-class", FL_INT, &o.per_class, "0", "keep at most this many training examples per class (0 = all)", 0}, \
    {"batch", FL_INT, &o.batch, "128", "minibatch size", 0},                                                   \
    {"threads", FL_INT, &o.threads, "2", "OpenMP / OpenBLAS threads", 0}

static void print_routing(const char *title, const sm_eval_result *ev) {
    for (int l = 0; l < ev->n_moe; l++) {
        sm_routing_summary s;
        sm_routing_summarize(&ev->routing[l], &s);
        printf("%s moe layer %d: routing entropy %.3f nats (%.2f effective experts), load CV %.3f, MaxVio %.3f, "
               "active experts %.0f%%, dropped %ld (%.2f%%)\n",
               title, l, s.entropy, s.eff_experts, s.cv, s.max_vio, 100 * s.active_ratio, ev->routing[l].dropped,
               100 * s.drop_frac);
        /* the collapse verdict: which expert, its share of the tokens, the threshold, and why it matters */
        double thr = 100 * sm_collapse_threshold(s.E), min = 100 * s.min_share;
        if (s.n_collapsed > 1)
            printf("%s moe layer %d: COLLAPSED: %d experts get < %.2g%% of tokens (least: expert %d, %.2g%%): they are "
                   "barely trained and waste capacity\n", title, l, s.n_collapsed, thr, s.min_expert, min);
        else if (s.collapsed)
            printf("%s moe layer %d: COLLAPSED: expert %d gets %.2g%% of tokens (< %.2g%%): it is barely trained and "
                   "wastes capacity\n", title, l, s.min_expert, min, thr);
        else
            printf("%s moe layer %d: routing healthy: every expert gets >= %.2g%% of tokens (min %.3g%%, expert %d)\n",
                   title, l, thr, min, s.min_expert);
        printf("%s moe layer %d: load per expert:", title, l);
        for (int e = 0; e < s.E; e++) printf(" %.3f", s.load_frac[e]);
        printf("\n");
    }
}

static sm_status load_split(sm_dataset *ds, const opts *o, const char *split, int train_subset, sm_error *err) {
    sm_status st = sm_dataset_load_fashion(ds, o->data, split, err);
    if (st != SM_OK) return st;
    int classes[64];
    int n = sm_parse_class_list(o->classes, classes, 64, ds->n_classes, err);
    if (n < 0) {
        sm_dataset_free(ds);
        return SM_ERR_ARG;
    }
    if (n < ds->n_classes || (train_subset && o->per_class > 0)) {
        st = sm_dataset_select(ds, classes, n, train_subset ? o->per_class : 0, 0, err);
        if (st != SM_OK) sm_dataset_free(ds);
    }
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* train */

typedef struct {
    int tty;
    long last_plain;
} log_ctx;

static void on_log(const sm_log_record *r, void *user) {
    log_ctx *c = user;
    if (r->final == -1) { /* validation at an epoch end */
        if (c->tty) fprintf(stderr, "\n");
        fprintf(stderr, "epoch %d: validation loss %.4f accuracy %.4f\n", r->epoch, r->loss, r->acc);
        return;
    }
    char moe[160] = "";
    if (r->n_moe)
        snprintf(moe, sizeof moe, " | H %.2f CV %.2f drop %ld", r->routing[0].entropy, r->routing[0].cv, r->dropped[0]);
    double frac = r->total_steps ? (double)r->step / r->total_steps : 1;
    double eta = frac > 0 ? r->elapsed_s * (1 - frac) / frac : 0;
    if (c->tty) {
        char bar[31];
        int filled = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < filled ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r[%s] %ld/%ld loss %.4f acc %.3f lr %.2e %.0f tok/s ETA %.0fs%s\033[K", bar, r->step,
                r->total_steps, r->loss, r->acc, r->lr, r->tokens_per_s, eta, moe);
        if (r->final) fprintf(stderr, "\n");
    } else {
        fprintf(stderr, "step %ld/%ld epoch %d loss %.4f acc %.4f lr %.3e gnorm %.3f %.0f tok/s %.1fs%s\n", r->step,
                r->total_steps, r->epoch, r->loss, r->acc, r->lr, r->grad_norm, r->tokens_per_s, r->elapsed_s, moe);
    }
}

static int flag_set(const fl_flag *fl, int n, const char *name) {
    const fl_flag *f = fl_find(fl, n, name);
    return f && f->set;
}

/* Router options from the flags, with the router-dependent defaults; validated by creating it. */
static int build_router_config(const opts *o, const fl_flag *fl, int nfl, int d, sm_router_config *r, sm_error *err) {
    sm_router_config_default(r);
    if (!strcmp(o->router, "ev"))
        return sm_fail(err, SM_ERR_ARG, "--router ev is built from a trained topk model, not trained: "
                                        "specmoe eval CHECKPOINT --router ev");
    if (strlen(o->router) >= sizeof r->name) return sm_fail(err, SM_ERR_ARG, "--router: unknown router '%s'", o->router);
    strcpy(r->name, o->router);
    r->E = o->experts;
    r->k = o->topk;
    if (!flag_set(fl, nfl, "topk")) {
        if (!strcmp(o->router, "grassmann") || !strcmp(o->router, "prototype"))
            r->k = o->experts; /* GrMoE and SR-MoE: dense mixtures by default */
        if (!strcmp(o->router, "switch") || !strcmp(o->router, "soft") || !strcmp(o->router, "expert-choice"))
            r->k = 1;
    }
    r->temperature = o->temperature;
    r->noisy = o->noisy;
    r->renorm = o->renorm;
    r->capacity = o->capacity;
    if (flag_set(fl, nfl, "capacity") && !(o->capacity > 0))
        return sm_fail(err, SM_ERR_ARG, "--capacity: the capacity factor must be > 0 (leave the flag out for no limit)");
    r->balance_coef = o->balance;
    if (!strcmp(o->router, "switch") && !flag_set(fl, nfl, "balance")) r->balance_coef = 0.01;
    r->zloss_coef = o->zloss;
    r->kappa_init = o->kappa_init;
    r->alpha = o->alpha;
    r->kr = o->kr;
    r->amortize = o->amortize;
    r->amort_hidden = o->amort_hidden;
    r->subspace_beta = o->subspace_beta;
    r->rho0 = o->rho0;
    r->pairs = o->pairs;
    r->slots = o->slots;
    r->soft_group = o->soft_group;
    r->soft_norm = o->soft_norm;
    r->seed = o->router_seed;
    r->proto_sq = o->proto_sq;
    if (!strcmp(o->router, "prototype")) r->temperature = o->tau; /* tau is the prototype gate's temperature */
    if (!strcmp(o->router, "soft") && r->slots == 0 && r->soft_group == 0)
        r->slots = (o->batch + o->experts - 1) / (o->experts > 0 ? o->experts : 1);
    /* validate now, before any data is read */
    sm_router *probe = sm_router_create(r, d, err);
    if (!probe) return SM_ERR_ARG;
    sm_router_free(probe);
    return SM_OK;
}

static int build_model_config(opts *o, const fl_flag *fl, int nfl, sm_model_config *mc, sm_error *err) {
    sm_model_config_default(mc);
    sm_status st;
    if (!strcmp(o->model, "srmoe")) {
        int stem[4], n = 0;
        for (const char *p = o->stem; *p && n < 4;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > 4096 || (*end && *end != ',')) return sm_fail(err, SM_ERR_ARG, "--stem: '%s' is not a list of channel counts", o->stem);
            stem[n++] = (int)v;
            p = *end ? end + 1 : end;
        }
        st = sm_model_arch_srmoe(mc, o->stages, o->width, stem, n, err);
        /* SR-MoE's defaults: prototype routing over 4 experts, dense mixture */
        if (!flag_set(fl, nfl, "router")) o->router = "prototype";
        if (!flag_set(fl, nfl, "experts")) o->experts = 4;
        mc->in_c = 1;
        mc->in_h = mc->in_w = 28;
    } else if (!strcmp(o->model, "mlp")) {
        st = sm_model_parse_arch(mc, o->arch, err);
    } else {
        return sm_fail(err, SM_ERR_ARG, "--model: unknown model '%s' (mlp|srmoe)", o->model);
    }
    if (st != SM_OK) return st;
    mc->spectral_alpha = o->spectral_alpha;
    mc->sigma_t = o->sigma_t;
    mc->rho_t = o->rho_t;
    mc->diversity_beta = o->diversity_beta;
    if (strcmp(o->penalty_target, "gate") && strcmp(o->penalty_target, "prototypes"))
        return sm_fail(err, SM_ERR_ARG, "--penalty-target: '%s' is not gate or prototypes", o->penalty_target);
    mc->penalty_on_prototypes = !strcmp(o->penalty_target, "prototypes");
    if (o->spectral_alpha < 0 || o->diversity_beta < 0 || o->sigma_t < 0 || o->rho_t < 0)
        return sm_fail(err, SM_ERR_ARG, "--spectral-alpha, --diversity-beta, --sigma-t and --rho-t must be >= 0");
    if (sm_act_parse(o->act, &mc->act) || sm_act_parse(o->expert_act, &mc->moe.act))
        return sm_fail(err, SM_ERR_ARG, "--act/--expert-act: unknown activation (none|relu|gelu|tanh|silu)");
    mc->residual = o->residual;
    /* the width each MoE layer sees, for the k_r <= d check */
    int w = mc->in_dim, dmin = 1 << 30;
    for (int i = 0; i < mc->n_layers; i++) {
        if (mc->layers[i].kind == SM_LAYER_DENSE) w = mc->layers[i].width;
        else if (mc->layers[i].kind == SM_LAYER_MOE && w < dmin) dmin = w;
    }
    st = build_router_config(o, fl, nfl, dmin < (1 << 30) ? dmin : w, &mc->moe.router, err);
    if (st != SM_OK) return st;
    mc->moe.n_shared = o->shared;
    mc->moe.expert_bias = o->expert_bias;
    if (o->shared < 0) return sm_fail(err, SM_ERR_ARG, "--shared: must be >= 0");
    /* shapes that do not fit (a kernel larger than its input, ...) are refused here, before any data
     * is read: build the model once on a 1-row batch for Fashion-MNIST's 1 x 28 x 28 input */
    sm_model_config probe = *mc;
    probe.in_dim = 784;
    if (probe.in_c == 0) probe.in_c = 1, probe.in_h = probe.in_w = 28;
    sm_model *pm = sm_model_create(&probe, 1, NULL, err);
    if (!pm) return SM_ERR_ARG;
    sm_model_free(pm);
    return SM_OK;
}

int cmd_train(int argc, char **argv) {
    opts o;
    fl_flag fl[] = {
        DATA_FLAGS(o),
        {"val-size", FL_INT, &o.val_size, "0", "hold out the last N training examples for per-epoch validation", 0},
        {"arch", FL_STRING, &o.arch, "dense:256,moe:256", "layers: dense:W | ffn:H | moe:H, comma-separated", 0},
        {"act", FL_STRING, &o.act, "relu", "activation of dense layers and ffn (none|relu|gelu|tanh|silu)", 0},
        {"residual", FL_BOOL, &o.residual, "0", "ffn/moe layers add their input to their output", 0},
        ROUTER_FLAGS(o),
        {"shared", FL_INT, &o.shared, "0", "always-on shared experts per MoE layer", 0},
        {"expert-act", FL_STRING, &o.expert_act, "relu", "expert activation", 0},
        {"expert-bias", FL_BOOL, &o.expert_bias, "1", "experts have biases", 0},
        {"model", FL_STRING, &o.model, "mlp", "mlp (layers from --arch) or srmoe (conv stem + stages)", 0},
        {"stages", FL_INT, &o.stages, "2", "srmoe: stacked MoE stages", 0},
        {"width", FL_INT, &o.width, "64", "srmoe: stage width d", 0},
        {"stem", FL_STRING, &o.stem, "16,32", "srmoe: channels of the 3x3 stride-2 stem convolutions", 0},
        {"spectral-alpha", FL_DOUBLE, &o.spectral_alpha, "0", "weight alpha of the spectral-norm + stable-rank penalties", 0},
        {"sigma-t", FL_DOUBLE, &o.sigma_t, "1", "target spectral norm sigma_t", 0},
        {"rho-t", FL_DOUBLE, &o.rho_t, "2", "target stable rank rho_t", 0},
        {"diversity-beta", FL_DOUBLE, &o.diversity_beta, "0", "weight beta of the CV^2 diversity loss", 0},
        {"penalty-target", FL_STRING, &o.penalty_target, "gate", "gate (linear map feeding the router) or prototypes", 0},
        {"epochs", FL_INT, &o.epochs, "12", "training epochs", 0},
        {"optim", FL_STRING, &o.optim, "adamw", "optimiser (sgd|adam|adamw)", 0},
        {"lr", FL_DOUBLE, &o.lr, "1e-3", "peak learning rate", 0},
        {"schedule", FL_STRING, &o.schedule, "cosine", "learning-rate schedule (constant|linear|cosine)", 0},
        {"warmup", FL_LONG, &o.warmup, "200", "linear warm-up steps", 0},
        {"final-lr", FL_DOUBLE, &o.final_lr, "0", "learning rate at the end of linear/cosine schedules", 0},
        {"momentum", FL_DOUBLE, &o.momentum, "0.9", "SGD momentum", 0},
        {"beta1", FL_DOUBLE, &o.beta1, "0.9", "Adam beta1", 0},
        {"beta2", FL_DOUBLE, &o.beta2, "0.999", "Adam beta2", 0},
        {"eps", FL_DOUBLE, &o.eps, "1e-8", "Adam epsilon", 0},
        {"weight-decay", FL_DOUBLE, &o.weight_decay, "0.0001", "weight decay (decoupled for adamw)", 0},
        {"clip", FL_DOUBLE, &o.clip, "0", "global gradient-norm clipping (0 = off)", 0},
        {"seed", FL_U64, &o.seed, "1", "seed of initialisation, data order and noise", 0},
        {"out", FL_STRING, &o.out, "runs/default", "run directory (metrics.jsonl, checkpoint.safetensors)", 0},
        {"log-every", FL_INT, &o.log_every, "100", "steps between log lines / metrics records", 0},
        {"ckpt-every", FL_LONG, &o.ckpt_every, "0", "steps between checkpoints (0 = every epoch end)", 0},
        {"resume", FL_STRING, &o.resume, NULL, "continue from this checkpoint (model flags must match it)", 0},
        {"stop-after", FL_LONG, &o.stop_after, "0", "stop after this many steps in total (0 = all epochs)", 0},
        {"fault-nan-step", FL_LONG, &o.fault_nan_step, "-1", "testing aid: poison a gradient at this step", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 2, "train", "[flags]", pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;

    sm_error err;
    sm_model_config mc;
    sm_train_config tc;
    sm_train_config_default(&tc);
    sm_status st = build_model_config(&o, fl, nfl, &mc, &err);
    if (st != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    if (sm_opt_parse(o.optim, &tc.opt.kind)) {
        fprintf(stderr, "specmoe train: --optim: unknown optimiser '%s' (sgd|adam|adamw)\n", o.optim);
        return CLI_EXIT_USAGE;
    }
    if (sm_sched_parse(o.schedule, &tc.sched)) {
        fprintf(stderr, "specmoe train: --schedule: unknown schedule '%s' (constant|linear|cosine)\n", o.schedule);
        return CLI_EXIT_USAGE;
    }
    if (o.epochs < 1 || o.batch < 1 || o.batch > 65536 || o.lr < 0 || o.warmup < 0 || o.clip < 0 || o.log_every < 1 ||
        o.val_size < 0 || o.per_class < 0 || o.threads < 0) {
        fprintf(stderr, "specmoe train: --epochs, --batch (<= 65536) and --log-every must be >= 1; --lr, --warmup, "
                        "--clip, --val-size, --per-class, --threads must be >= 0\n");
        return CLI_EXIT_USAGE;
    }
    tc.epochs = o.epochs;
    tc.batch = o.batch;
    tc.opt.lr = o.lr;
    tc.opt.momentum = o.momentum;
    tc.opt.beta1 = o.beta1;
    tc.opt.beta2 = o.beta2;
    tc.opt.eps = o.eps;
    tc.opt.weight_decay = o.weight_decay;
    tc.final_lr = o.final_lr;
    tc.warmup = o.warmup;
    tc.clip = o.clip;
    tc.seed = o.seed;
    tc.out_dir = o.out;
    tc.log_every = o.log_every;
    tc.ckpt_every = o.ckpt_every;
    tc.resume = o.resume;
    tc.stop_after = o.stop_after;
    tc.inject_nan_step = o.fault_nan_step;
    sm_optim probe;
    sm_params none;
    sm_params_init_table(&none);
    if (sm_optim_init(&probe, &tc.opt, &none, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    sm_optim_free(&probe);
    cli_set_threads(o.threads);

    /* on resume, sm_train refuses a checkpoint whose model differs from the one the flags describe */
    sm_dataset train, test, val = {0};
    st = load_split(&train, &o, "train", 1, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    st = load_split(&test, &o, "test", 0, &err);
    if (st != SM_OK) {
        sm_dataset_free(&train);
        return cli_fail(st, &err);
    }
    if (o.val_size > 0) {
        if (o.val_size >= train.n) {
            fprintf(stderr, "specmoe train: --val-size %d leaves no training data (%d examples)\n", o.val_size, train.n);
            return CLI_EXIT_USAGE;
        }
        /* the last val_size examples (file order) become the validation set */
        val.n = o.val_size;
        val.dim = train.dim;
        val.n_classes = train.n_classes;
        val.x = train.x + (size_t)(train.n - o.val_size) * train.dim;
        val.y = train.y + (train.n - o.val_size);
        train.n -= o.val_size;
    }
    mc.in_dim = train.dim;
    mc.n_classes = train.n_classes;
    if (train.dim == 784 && mc.in_c == 0) mc.in_c = 1, mc.in_h = mc.in_w = 28; /* Fashion-MNIST images */
    sm_rng rng;
    sm_rng_seed(&rng, o.seed);
    sm_model *m = sm_model_create(&mc, o.batch < 1000 ? 1000 : o.batch, &rng, &err);
    if (!m) return cli_fail(SM_ERR_ARG, &err);
    char arch[512];
    sm_model_format_arch(&mc, arch, sizeof arch);
    printf("specmoe train: %s, %d train / %d test examples, %zu parameters (%zu active per token), %d threads\n", arch,
           train.n, test.n, m->params.total, sm_model_active_params(m), omp_get_max_threads());
    fflush(stdout);
    log_ctx lc = {isatty(2), 0};
    sm_train_result res;
    st = sm_train(m, &train, val.n ? &val : NULL, &tc, on_log, &lc, &res, &err);
    int code = 0;
    if (st != SM_OK) {
        code = cli_fail(st, &err);
    } else {
        sm_eval_result ev;
        /* evaluated in batches of --batch, like `specmoe eval` by default: capacity limits depend
         * on the batch, so the two then report the same number */
        st = sm_evaluate(m, &test, o.batch, &ev, &err);
        if (st != SM_OK) {
            code = cli_fail(st, &err);
        } else {
            printf("trained %ld steps in %.1f s (%.0f examples/s)\n", res.steps, res.seconds,
                   res.seconds > 0 ? (double)res.steps * o.batch / res.seconds : 0);
            print_routing("test", &ev);
            printf("checkpoint: %s/checkpoint.safetensors\n", o.out);
            printf("final test accuracy: %.4f (loss %.4f, %ld examples)\n", ev.acc, ev.loss, ev.n);
        }
    }
    printf("peak memory: %.1f MiB\n", (double)sm_peak_rss_bytes() / (1 << 20));
    sm_model_free(m);
    if (o.val_size > 0) train.n += o.val_size;
    sm_dataset_free(&train);
    sm_dataset_free(&test);
    return code;
}

/* ---------------------------------------------------------------------------------------------- */
/* eval */

int cmd_eval(int argc, char **argv) {
    opts o;
    const char *split, *router;
    double alpha, temperature;
    int ev_c, ev_avg;
    fl_flag fl[] = {
        DATA_FLAGS(o),
        {"split", FL_STRING, &split, "test", "which split to evaluate (train|test)", 0},
        {"router", FL_STRING, &router, NULL, "refuse the checkpoint unless its router is this one; 'ev' on a topk "
                                             "checkpoint builds the SSMoE eigenvector router", 0},
        {"alpha", FL_DOUBLE, &alpha, "-1", "grassmann: sparsity dial; ev: weight of the EV router in the mix (default 0.5)", 0},
        {"ev-c", FL_INT, &ev_c, "5", "ev: right singular vectors averaged per descriptor", 0},
        {"ev-avg", FL_BOOL, &ev_avg, "0", "ev: router-free averaged-EV descriptors", 0},
        {"temperature", FL_DOUBLE, &temperature, "-1", "evaluate at this softmax temperature (-1 = as trained)", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 2, "eval", "CHECKPOINT [flags]", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos != 1) {
        fprintf(stderr, "specmoe eval: expected one checkpoint path (see specmoe eval --help)\n");
        return CLI_EXIT_USAGE;
    }
    if (strcmp(split, "train") && strcmp(split, "test")) {
        fprintf(stderr, "specmoe eval: --split: '%s' is not train or test\n", split);
        return CLI_EXIT_USAGE;
    }
    if (o.batch < 1 || o.per_class < 0) {
        fprintf(stderr, "specmoe eval: --batch must be >= 1 and --per-class >= 0\n");
        return CLI_EXIT_USAGE;
    }
    cli_set_threads(o.threads);
    sm_error err;
    sm_model_config mc;
    sm_status st = sm_checkpoint_read_config(pos[0], &mc, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    /* SSMoE: a top-k checkpoint evaluated with the eigenvector router built from its own experts */
    int build_ev = router && !strcmp(router, "ev") && !strcmp(mc.moe.router.name, "topk");
    if (build_ev || (router && !strcmp(router, "ev") && !strcmp(mc.moe.router.name, "ev"))) {
        strcpy(mc.moe.router.name, "ev");
        mc.moe.router.alpha = fl_find(fl, nfl, "alpha")->set ? alpha : (build_ev ? 0.5 : mc.moe.router.alpha);
        if (build_ev || fl_find(fl, nfl, "ev-c")->set) mc.moe.router.ev_c = ev_c;
        if (build_ev || fl_find(fl, nfl, "ev-avg")->set) mc.moe.router.ev_avg = ev_avg;
        build_ev = 1; /* (re)build the descriptors: they depend on c and the variant */
        if (!(mc.moe.router.alpha >= 0 && mc.moe.router.alpha <= 1) || ev_c < 1) {
            fprintf(stderr, "specmoe eval: ev needs --alpha in [0, 1] and --ev-c >= 1\n");
            return CLI_EXIT_USAGE;
        }
        alpha = -1; /* already applied */
    } else if (router && strcmp(router, mc.moe.router.name) != 0) {
        fprintf(stderr, "specmoe eval: %s: the checkpoint's router is '%s', not '%s'\n", pos[0], mc.moe.router.name, router);
        return CLI_EXIT_USAGE;
    }
    if (alpha >= 0 && fl_find(fl, nfl, "alpha")->set && strcmp(mc.moe.router.name, "grassmann") != 0) {
        fprintf(stderr, "specmoe eval: --alpha applies to grassmann and ev routers (this one: %s)\n", mc.moe.router.name);
        return CLI_EXIT_USAGE;
    }
    if (fl_find(fl, nfl, "alpha")->set && !strcmp(mc.moe.router.name, "grassmann") && alpha < 0) {
        fprintf(stderr, "specmoe eval: --alpha must be >= 0 and applies to grassmann routers (this one: %s)\n",
                mc.moe.router.name);
        return CLI_EXIT_USAGE;
    }
    if (fl_find(fl, nfl, "temperature")->set && !(temperature > 0)) {
        fprintf(stderr, "specmoe eval: --temperature must be > 0\n");
        return CLI_EXIT_USAGE;
    }
    sm_model *m = sm_model_create(&mc, o.batch, NULL, &err);
    if (!m) return cli_fail(SM_ERR_FORMAT, &err);
    sm_model_set_dials(m, alpha, temperature);
    st = sm_checkpoint_load(pos[0], m, NULL, NULL, &err);
    if (st == SM_OK && build_ev) {
        double t0 = sm_time_now();
        st = sm_model_build_ev(m, &err);
        if (st == SM_OK)
            printf("ev router: descriptors built from the experts in %.2f s (c = %d%s, alpha = %g)\n", sm_time_now() - t0,
                   mc.moe.router.ev_c, mc.moe.router.ev_avg ? ", averaged EV" : "", mc.moe.router.alpha);
        /* router-collapse diagnostics per MoE layer: correlation of the learned router's expert
         * embeddings vs of the EV descriptors (mean of each expert's two) */
        for (int l = 0; st == SM_OK && l < sm_model_n_moe(m); l++) {
            const sm_moe *moe = sm_model_moe(m, l);
            char name[64];
            int li = 0;
            for (int t = 0, k = 0; t < m->n_layers; t++)
                if (m->layers[t].kind == SM_LAYER_MOE && k++ == l) li = t;
            snprintf(name, sizeof name, "layers.%d.router.weight", li);
            const sm_real *w = sm_params_data(&m->params, sm_params_find(&m->params, name));
            snprintf(name, sizeof name, "layers.%d.router.ev", li);
            const sm_real *ev = sm_params_data(&m->params, sm_params_find(&m->params, name));
            sm_real *mean = malloc(sizeof(sm_real) * (size_t)moe->E * moe->d);
            for (int e = 0; mean && e < moe->E; e++)
                for (int i = 0; i < moe->d; i++)
                    mean[(size_t)e * moe->d + i] = (ev[((size_t)e * 2) * moe->d + i] + ev[((size_t)e * 2 + 1) * moe->d + i]) / 2;
            if (mean)
                printf("moe layer %d collapse: mean |off-diagonal correlation| of router embeddings %.4f, of EV descriptors %.4f\n",
                       l, sm_mean_abs_offdiag_corr(w, moe->E, moe->d), sm_mean_abs_offdiag_corr(mean, moe->E, moe->d));
            free(mean);
        }
    }
    sm_dataset ds;
    if (st == SM_OK) st = load_split(&ds, &o, split, !strcmp(split, "train"), &err);
    if (st != SM_OK) {
        sm_model_free(m);
        return cli_fail(st, &err);
    }
    sm_eval_result ev;
    st = sm_evaluate(m, &ds, o.batch, &ev, &err);
    int code = 0;
    if (st != SM_OK) {
        code = cli_fail(st, &err);
    } else {
        print_routing(split, &ev);
        for (int l = 0; l < sm_model_n_moe(m); l++) { /* SSMoE App. D.6, ev routers only */
            double ov = sm_ev_router_take_overlap(sm_model_moe(m, l)->router);
            if (ov == ov)
                printf("moe layer %d: %.4f of the experts picked under the mix are also the learned router's top-%d\n", l,
                       ov, mc.moe.router.k);
        }
        printf("%s accuracy: %.4f (loss %.4f, %ld examples)\n", split, ev.acc, ev.loss, ev.n);
    }
    sm_dataset_free(&ds);
    sm_model_free(m);
    return code;
}

/* ---------------------------------------------------------------------------------------------- */
/* info */

int cmd_info(int argc, char **argv) {
    int dummy;
    fl_flag fl[] = {{"verbose", FL_BOOL, &dummy, "0", "also print every metadata entry", 0}};
    int npos;
    const char *pos[1];
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 2, "info", "CHECKPOINT", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos != 1) {
        fprintf(stderr, "specmoe info: expected one checkpoint path (see specmoe info --help)\n");
        return CLI_EXIT_USAGE;
    }
    sm_error err;
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, pos[0], &err);
    if (s != SM_OK) return cli_fail(s, &err);
    printf("file: %s (%zu bytes, header %zu bytes, %d tensors)\n", pos[0], st.size, st.header_len, st.n_tensors);
    const char *model = sm_safetensors_meta(&st, "model");
    if (model) {
        sm_model_config mc;
        if (sm_model_config_from_json(&mc, model, &err) == SM_OK) {
            char arch[512];
            sm_model_format_arch(&mc, arch, sizeof arch);
            const sm_router_config *r = &mc.moe.router;
            printf("model: in %d -> %s -> %d classes, act %s, residual %d\n", mc.in_dim, arch, mc.n_classes,
                   sm_act_name(mc.act), mc.residual);
            printf("moe: router %s, %d experts, top-%d, temperature %g, noisy %d, renorm %d, capacity %g, shared %d, "
                   "expert act %s, expert bias %d\n",
                   r->name, r->E, r->k, r->temperature, r->noisy, r->renorm, r->capacity, mc.moe.n_shared,
                   sm_act_name(mc.moe.act), mc.moe.expert_bias);
        } else {
            printf("model: (unreadable: %s)\n", err.msg);
        }
    } else {
        printf("model: none (not a specmoe checkpoint)\n");
    }
    const char *train = sm_safetensors_meta(&st, "train");
    if (train) printf("training state: %s\n", train);
    if (dummy)
        for (int i = 0; i < st.n_meta; i++) printf("metadata %s = %s\n", st.meta[i].key, st.meta[i].value);
    printf("%-48s %-5s %-20s %12s\n", "tensor", "dtype", "shape", "values");
    size_t total = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const sm_st_tensor *t = &st.tensors[i];
        char shape[64] = "[";
        for (int d = 0; d < t->ndim; d++) {
            char b[24];
            snprintf(b, sizeof b, "%s%lld", d ? "," : "", (long long)t->shape[d]);
            strncat(shape, b, sizeof shape - strlen(shape) - 2);
        }
        strcat(shape, "]");
        printf("%-48s %-5s %-20s %12zu\n", t->name, sm_dtype_name(t->dtype), shape, t->numel);
        if (strncmp(t->name, "optim.", 6) != 0) total += t->numel;
    }
    printf("model parameters: %zu\n", total);
    sm_safetensors_free(&st);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */

static void usage(void) {
    printf("usage: specmoe COMMAND [flags]\n\n"
           "commands:\n"
           "  train            train a classifier on Fashion-MNIST (specmoe train --help)\n"
           "  eval CHECKPOINT  evaluate a checkpoint\n"
           "  info CHECKPOINT  print the model and tensor table of a checkpoint\n"
           "  analyze CHECKPOINT  spectral norm, stable rank, effective rank of every weight matrix\n"
           "  ssmoe prune CHECKPOINT  SSMoE expert dropping (router / ssmoe / random ranking)\n"
           "  ssmoe build --hf DIR    EV router + collapse report of a Hugging Face MoE model\n"
           "  ssmoe prune --hf DIR    expert dropping on a Hugging Face MoE model (streamed)\n"
           "  bench layer      time forward+backward+Adam of one MoE layer against plain sgemm\n"
           "  bench routing    GrMoE's synthetic routing benchmark (Table 1)\n"
           "  bench alpha      post-hoc sparsity: entropy vs alpha / inverse temperature\n"
           "  bench oneshot    SR-MoE one-shot interference (Tables 1-2)\n"
           "  bench ssmoe      SSMoE eigenvector routing and expert dropping (Tables 1, 6)\n"
           "  bench ssmoe-build  time of building the EV router of one SwiGLU MoE layer\n"
           "  bingham-z        Kume-Wood saddle-point Bingham normaliser vs Monte Carlo (GrMoE Sec. 6.4.4)\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage();
        return argc < 2 ? CLI_EXIT_USAGE : 0;
    }
    if (!strcmp(argv[1], "train")) return cmd_train(argc, argv);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc, argv);
    if (!strcmp(argv[1], "info")) return cmd_info(argc, argv);
    if (!strcmp(argv[1], "analyze")) return cmd_analyze(argc, argv);
    if (!strcmp(argv[1], "ssmoe")) return cmd_ssmoe(argc, argv);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc, argv);
    if (!strcmp(argv[1], "bingham-z")) return cmd_bingham_z(argc, argv);
    fprintf(stderr, "specmoe: unknown command '%s' (see specmoe --help)\n", argv[1]);
    return CLI_EXIT_USAGE;
}
