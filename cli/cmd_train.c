/* specmoe train: a classifier on Fashion-MNIST (an MLP from --arch, or the SR-MoE network), with
 * any router, optimiser and schedule; writes metrics.jsonl and checkpoints to the run directory. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "common.h"
#include "flags.h"

/* every train flag */
typedef struct {
    cli_data_opts d;
    const char *arch, *act, *router, *expert_act, *out, *resume, *optim, *schedule;
    int residual, experts, topk, noisy, renorm, shared, expert_bias, epochs;
    int log_every, val_size;
    long warmup, ckpt_every, stop_after, fault_nan_step;
    double temperature, capacity, lr, final_lr, momentum, beta1, beta2, eps, weight_decay, clip;
    double balance, zloss, kappa_init, alpha, subspace_beta, rho0;
    int kr, amortize, amort_hidden, pairs, slots, soft_group, soft_norm, proto_sq, stages, width;
    double tau, spectral_alpha, sigma_t, rho_t, diversity_beta;
    const char *model, *stem, *penalty_target;
    uint64_t seed, router_seed;
} opts;

/* The router flags. Defaults that depend on the router (switch: k = 1; topk and switch: balance 0.01; grassmann:
 * dense, k = E; soft: k = 1, slots = batch / E) are applied in build_router_config when the flag was
 * not given. */
#define ROUTER_FLAGS(o, router_help)                                                                           \
    {"router", FL_STRING, &o.router, "topk", router_help, 0},                                                   \
    {"experts", FL_INT, &o.experts, "8", "experts per MoE layer", 0},                                           \
    {"topk", FL_INT, &o.topk, "2", "experts per token (= experts: dense mixture; grassmann default: all)", 0},    \
    {"temperature", FL_DOUBLE, &o.temperature, "1", "router softmax temperature", 0},                            \
    {"noisy", FL_BOOL, &o.noisy, "0", "noisy top-k gating (Shazeer 2017) during training", 0},                  \
    {"renorm", FL_BOOL, &o.renorm, "1", "renormalise the k selected routing weights", 0},                        \
    {"capacity", FL_DOUBLE, &o.capacity, "0", "capacity factor (0 = unlimited; expert-choice: tokens per expert = cf*T/E)", 0}, \
    {"balance", FL_DOUBLE, &o.balance, "0", "load-balancing loss weight (topk and switch default 0.01)", 0},       \
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

/* progress: a bar on a terminal, plain lines otherwise */
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
    /* the Switch / Mixtral load-balancing loss is on by default for token-choice softmax routers: without
     * it the default run starves 4 of 8 experts (< 0.01% of tokens). 0.01 is Switch's value; on the
     * validation split it kept every expert above 8% at the same accuracy (BENCHMARKS.md) */
    if ((!strcmp(o->router, "switch") || !strcmp(o->router, "topk")) && !flag_set(fl, nfl, "balance"))
        r->balance_coef = 0.01;
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
        r->slots = (o->d.batch + o->experts - 1) / (o->experts > 0 ? o->experts : 1);
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
        for (const char *p = o->stem; *p;) {
            char *end;
            if (n == 4) return sm_fail(err, SM_ERR_ARG, "--stem: at most 4 stem convolutions ('%s' has more)", o->stem);
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
    char router_help[512];
    cli_router_help(router_help, sizeof router_help, "router: ",
                    " (ev is built from a trained topk model: specmoe eval CHECKPOINT --router ev)");
    fl_flag fl[] = {
        CLI_DATA_FLAGS(o.d),
        {"val-size", FL_INT, &o.val_size, "0", "hold out the last N training examples for per-epoch validation", 0},
        {"arch", FL_STRING, &o.arch, "dense:256,moe:256", "layers: dense:W | ffn:H | moe:H, comma-separated", 0},
        {"act", FL_STRING, &o.act, "relu", "activation of dense layers and ffn (none|relu|gelu|tanh|silu)", 0},
        {"residual", FL_BOOL, &o.residual, "0", "ffn/moe layers add their input to their output", 0},
        ROUTER_FLAGS(o, router_help),
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
    if (o.epochs < 1 || o.d.batch < 1 || o.d.batch > 65536 || o.lr < 0 || o.warmup < 0 || o.clip < 0 || o.log_every < 1 ||
        o.val_size < 0 || o.d.per_class < 0) {
        fprintf(stderr, "specmoe train: --epochs, --batch (<= 65536) and --log-every must be >= 1; --lr, --warmup, "
                        "--clip, --val-size, --per-class must be >= 0\n");
        return CLI_EXIT_USAGE;
    }
    if (o.d.threads < 1) {
        fprintf(stderr, "specmoe train: --threads must be >= 1 (got %d)\n", o.d.threads);
        return CLI_EXIT_USAGE;
    }
    /* the schedule decays from --lr to --final-lr: a negative end trains by gradient ascent, and an end
     * above the peak makes the schedule rise */
    if (o.final_lr < 0) {
        fprintf(stderr, "specmoe train: --final-lr must be >= 0 (got %g)\n", o.final_lr);
        return CLI_EXIT_USAGE;
    }
    if (o.final_lr > o.lr) {
        fprintf(stderr, "specmoe train: --final-lr (%g) must not exceed --lr (%g)\n", o.final_lr, o.lr);
        return CLI_EXIT_USAGE;
    }
    tc.epochs = o.epochs;
    tc.batch = o.d.batch;
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
    /* the class subset goes into the checkpoint (as numbers, in label order), so eval uses it */
    char classes[128] = "";
    {
        int cl[64];
        int n = sm_parse_class_list(o.d.classes, cl, 64, 10 /* Fashion-MNIST */, &err);
        if (n < 0) return cli_fail(SM_ERR_ARG, &err);
        for (int i = 0, used = 0; n < 10 /* Fashion-MNIST */ && i < n; i++)
            used += snprintf(classes + used, sizeof classes - (size_t)used, "%s%d", i ? "," : "", cl[i]);
        tc.classes = classes;
    }
    tc.stop_after = o.stop_after;
    tc.inject_nan_step = o.fault_nan_step;
    sm_optim probe;
    sm_params none;
    sm_params_init_table(&none);
    if (sm_optim_init(&probe, &tc.opt, &none, &err) != SM_OK) return cli_fail(SM_ERR_ARG, &err);
    sm_optim_free(&probe);
    cli_set_threads(o.d.threads);
    /* the run directory is checked before the data are loaded, not at the first checkpoint */
    if (!*o.out) {
        fprintf(stderr, "specmoe train: --out: the path is empty\n");
        return CLI_EXIT_USAGE;
    }
    if ((st = sm_train_check_out(o.out, &err)) != SM_OK) return cli_fail(st, &err);

    /* on resume, sm_train refuses a checkpoint whose model differs from the one the flags describe */
    sm_dataset train, test, val = {0};
    st = cli_load_split(&train, &o.d, "train", 1, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    st = cli_load_split(&test, &o.d, "test", 0, &err);
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
    sm_model *m = sm_model_create(&mc, o.d.batch < 1000 ? 1000 : o.d.batch, &rng, &err);
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
        st = sm_evaluate(m, &test, o.d.batch, &ev, &err);
        if (st != SM_OK) {
            code = cli_fail(st, &err);
        } else {
            printf("trained %ld steps in %.1f s (%.0f examples/s)\n", res.steps, res.seconds,
                   res.seconds > 0 ? (double)res.steps * o.d.batch / res.seconds : 0);
            cli_print_routing("test", &ev);
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
