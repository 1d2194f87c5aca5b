/* Training-loop guarantees: determinism (same seed, one thread -> identical bits), exact resume
 * (interrupted + resumed == uninterrupted, also after a stop request), the NaN/Inf guard naming step
 * and tensor with the last good checkpoint intact, the best checkpoint beside the last, and that
 * training actually learns a separable problem. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "specmoe.h"
#include "testutil.h"

enum { N = 600, D = 12, K = 4 };

/* Gaussian clusters, one per class: learnable to high accuracy by a small MLP. */
static void make_data(sm_dataset *ds, uint64_t seed) {
    sm_rng r;
    sm_rng_seed(&r, seed);
    ds->n = N;
    ds->dim = D;
    ds->n_classes = K;
    ds->x = malloc(sizeof(float) * N * D);
    ds->y = malloc(sizeof(int) * N);
    float centers[K][D];
    for (int c = 0; c < K; c++)
        for (int j = 0; j < D; j++) centers[c][j] = (float)(2 * sm_rng_normal(&r));
    for (int i = 0; i < N; i++) {
        int c = (int)sm_rng_below(&r, K);
        ds->y[i] = c;
        for (int j = 0; j < D; j++) ds->x[i * D + j] = centers[c][j] + (float)sm_rng_normal(&r);
    }
}

static sm_model *make_model(uint64_t seed) {
    sm_model_config mc;
    sm_model_config_default(&mc);
    sm_error err;
    cr_assert_eq(sm_model_parse_arch(&mc, "dense:16,moe:12", &err), SM_OK);
    mc.in_dim = D;
    mc.n_classes = K;
    mc.moe.router.E = 4;
    mc.moe.router.k = 2;
    mc.moe.router.noisy = 1; /* exercises the training RNG, which resume must restore */
    mc.moe.router.capacity = 1.25;
    sm_rng r;
    sm_rng_seed(&r, seed);
    sm_model *m = sm_model_create(&mc, 32, &r, &err);
    cr_assert(m, "%s", err.msg);
    return m;
}

static void config(sm_train_config *tc, const char *out) {
    sm_train_config_default(tc);
    tc->epochs = 3;
    tc->batch = 32;
    tc->opt.lr = 3e-3;
    tc->warmup = 5;
    tc->seed = 42;
    tc->out_dir = out;
    tc->log_every = 7;
    tc->ckpt_every = 0;
}

static sm_model *train_run(const sm_dataset *ds, const char *out, long stop_after, const char *resume,
                           sm_status *st_out, sm_error *err) {
    sm_model *m = make_model(7);
    sm_train_config tc;
    config(&tc, out);
    tc.stop_after = stop_after;
    tc.resume = resume;
    sm_train_result res;
    *st_out = sm_train(m, ds, NULL, &tc, NULL, NULL, &res, err);
    return m;
}

/* how many parameters of two models of one config differ (bit for bit) */
static size_t params_differ(const sm_model *a, const sm_model *b) {
    size_t diff = 0;
    for (size_t i = 0; i < a->params.total; i++) diff += a->params.data[i] != b->params.data[i];
    return diff;
}

Test(train, same_seed_one_thread_is_bit_identical) {
    omp_set_num_threads(1);
    sm_dataset ds;
    make_data(&ds, 1);
    sm_error err;
    sm_status st;
    sm_model *a = train_run(&ds, tu_tmpdir(), 0, NULL, &st, &err);
    cr_assert_eq(st, SM_OK, "%s", err.msg);
    sm_model *b = train_run(&ds, tu_tmpdir(), 0, NULL, &st, &err);
    cr_assert_eq(st, SM_OK, "%s", err.msg);
    cr_expect_eq(memcmp(a->params.data, b->params.data, sizeof(sm_real) * a->params.total), 0,
                 "two runs with the same seed differ");
    /* and a different seed gives a different model (the comparison can fail) */
    sm_model *c = make_model(8);
    cr_expect_neq(memcmp(a->params.data, c->params.data, sizeof(sm_real) * a->params.total), 0);
    sm_model_free(a);
    sm_model_free(b);
    sm_model_free(c);
    sm_dataset_free(&ds);
}

/* A stop request (the CLI's Ctrl-C) stands in for the signal: the hook raises the flag during step `at`. */
typedef struct {
    volatile sig_atomic_t *flag;
    int calls, at;
} stop_hook_ctx;
static sm_status raise_stop(sm_params *ps, void *user, sm_error *err) {
    (void)ps, (void)err;
    stop_hook_ctx *c = user;
    if (++c->calls == c->at) *c->flag = 1;
    return SM_OK;
}

Test(train, resume_equals_uninterrupted) {
    omp_set_num_threads(1);
    sm_dataset ds;
    make_data(&ds, 2);
    sm_error err;
    sm_status st;
    sm_model *full = train_run(&ds, tu_tmpdir(), 0, NULL, &st, &err);
    cr_assert_eq(st, SM_OK, "%s", err.msg);
    /* stop mid-epoch (step 23 of 57), then resume from the checkpoint written at the stop */
    const char *dir = tu_tmpdir();
    sm_model *part = train_run(&ds, dir, 23, NULL, &st, &err);
    cr_assert_eq(st, SM_OK, "%s", err.msg);
    char ck[256];
    snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", dir);
    cr_expect_neq(memcmp(full->params.data, part->params.data, sizeof(sm_real) * full->params.total), 0);
    sm_model *resumed = train_run(&ds, tu_tmpdir(), 0, ck, &st, &err);
    cr_assert_eq(st, SM_OK, "%s", err.msg);
    size_t diff = params_differ(full, resumed);
    cr_expect_eq(diff, 0, "%zu of %zu parameters differ after resume", diff, full->params.total);
    sm_model_free(resumed);
    /* a stop request ends training after the current step (17) with a checkpoint of it, and resuming
     * from there is exact too */
    dir = tu_tmpdir();
    sm_train_config tc;
    config(&tc, dir);
    volatile sig_atomic_t flag = 0;
    stop_hook_ctx ctx = {&flag, 0, 17};
    tc.hook = (sm_step_hook){raise_stop, &ctx};
    tc.stop = &flag;
    sm_train_result res;
    sm_model *stopped = make_model(7);
    cr_assert_eq(sm_train(stopped, &ds, NULL, &tc, NULL, NULL, &res, &err), SM_OK, "%s", err.msg);
    cr_expect(res.interrupted);
    cr_expect_eq(res.step, 17, "stopped at step %ld", res.step);
    snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", dir);
    resumed = train_run(&ds, tu_tmpdir(), 0, ck, &st, &err);
    cr_assert_eq(st, SM_OK, "%s", err.msg);
    diff = params_differ(full, resumed);
    cr_expect_eq(diff, 0, "%zu of %zu parameters differ after the stopped run was resumed", diff, full->params.total);
    sm_model_free(full);
    sm_model_free(part);
    sm_model_free(stopped);
    sm_model_free(resumed);
    sm_dataset_free(&ds);
}

Test(train, nan_stops_with_step_tensor_and_intact_checkpoint) {
    omp_set_num_threads(1);
    sm_dataset ds;
    make_data(&ds, 3);
    const char *dir = tu_tmpdir();
    sm_model *m = make_model(7);
    sm_train_config tc;
    config(&tc, dir);
    tc.ckpt_every = 4;
    tc.inject_nan_step = 10;
    sm_train_result res;
    sm_error err;
    sm_status st = sm_train(m, &ds, NULL, &tc, NULL, NULL, &res, &err);
    cr_assert_eq(st, SM_ERR_NUMERIC);
    cr_expect(strstr(err.msg, "step 10") != NULL, "message: %s", err.msg);
    cr_expect(strstr(err.msg, "gradient of tensor '") != NULL, "message: %s", err.msg);
    cr_expect(strstr(err.msg, "checkpoint.safetensors (step 8)") != NULL, "message: %s", err.msg);
    /* the last good checkpoint loads and holds step 8 */
    char ck[256];
    snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", dir);
    sm_model *m2 = make_model(99);
    sm_optim opt;
    sm_optim_init(&opt, &tc.opt, &m2->params, &err);
    sm_train_state ts;
    cr_assert_eq(sm_checkpoint_load(ck, m2, &opt, &ts, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(ts.step, 8);
    cr_expect(sm_all_finite(m2->params.data, m2->params.total));
    sm_optim_free(&opt);
    sm_model_free(m);
    sm_model_free(m2);
    sm_dataset_free(&ds);
}

Test(train, nan_loss_from_a_diverging_learning_rate) {
    omp_set_num_threads(1);
    sm_dataset ds;
    make_data(&ds, 4);
    sm_model *m = make_model(7);
    sm_train_config tc;
    config(&tc, NULL);
    tc.opt.kind = SM_OPT_SGD;
    tc.opt.lr = 1e30; /* diverges within a few steps */
    tc.warmup = 0;
    tc.sched = SM_SCHED_CONSTANT;
    sm_train_result res;
    sm_error err;
    sm_status st = sm_train(m, &ds, NULL, &tc, NULL, NULL, &res, &err);
    cr_assert_eq(st, SM_ERR_NUMERIC);
    cr_expect(strstr(err.msg, "step ") && strstr(err.msg, "no checkpoint"), "message: %s", err.msg);
    sm_model_free(m);
    sm_dataset_free(&ds);
}

Test(train, learns_clusters_and_writes_metrics) {
    omp_set_num_threads(1);
    sm_dataset ds;
    make_data(&ds, 5);
    const char *dir = tu_tmpdir();
    sm_error err;
    sm_status st;
    sm_model *m = train_run(&ds, dir, 0, NULL, &st, &err);
    cr_assert_eq(st, SM_OK, "%s", err.msg);
    sm_eval_result ev;
    cr_assert_eq(sm_evaluate(m, &ds, 32, &ev, &err), SM_OK);
    cr_expect(ev.acc > 0.9, "train accuracy %.3f", ev.acc);
    cr_expect_eq(ev.n_moe, 1);
    /* metrics.jsonl: one JSON object per line with the promised fields */
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    size_t n;
    char *text = (char *)tu_read_file(path, &n);
    cr_assert(text);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    cr_expect_geq(lines, 57 / 7);
    const char *fields[] = {"\"loss\"", "\"accuracy\"", "\"lr\"", "\"grad_norm\"", "\"load\"", "\"routing_entropy\"",
                            "\"dropped_tokens\"", "\"tokens_per_s\""};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        cr_expect(strstr(text, fields[i]), "metrics.jsonl lacks %s", fields[i]);
    free(text);
    sm_model_free(m);
    sm_dataset_free(&ds);
}

/* an --arch string with an empty layer (a leading, trailing or doubled comma) is a usage error, not
 * read as if the comma were not there */
Test(train, arch_with_an_empty_layer_refused) {
    const char *bad[] = {"dense:256,", ",dense:8", "dense:8,,moe:8"};
    for (int i = 0; i < 3; i++) {
        sm_model_config mc;
        sm_model_config_default(&mc);
        sm_error err;
        cr_assert_eq(sm_model_parse_arch(&mc, bad[i], &err), SM_ERR_ARG, "'%s' accepted", bad[i]);
        cr_assert(strstr(err.msg, "empty layer"), "'%s': %s", bad[i], err.msg);
    }
}

/* best.safetensors: written at an epoch end, by validation accuracy; its training state names that
 * step and score, and the result reports the same. */
Test(train, the_best_checkpoint_is_kept_beside_the_last) {
    omp_set_num_threads(1);
    sm_dataset ds, val;
    make_data(&ds, 6);
    /* the last 120 examples validate (the clusters are the training data's) */
    val = ds;
    val.n = 120;
    val.x += (size_t)(N - 120) * D;
    val.y += N - 120;
    ds.n = N - 120;
    const char *dir = tu_tmpdir();
    sm_model *m = make_model(7);
    sm_train_config tc;
    config(&tc, dir);
    sm_train_result res;
    sm_error err;
    cr_assert_eq(sm_train(m, &ds, &val, &tc, NULL, NULL, &res, &err), SM_OK, "%s", err.msg);
    const long per_epoch = (N - 120 + 31) / 32;
    cr_expect(res.best_step > 0 && res.best_step % per_epoch == 0, "best at step %ld", res.best_step);
    cr_expect(res.best_score > 0.5 && res.best_score <= 1, "best validation accuracy %g", res.best_score);
    char ck[256];
    snprintf(ck, sizeof ck, "%s/best.safetensors", dir);
    sm_model *b = make_model(99);
    sm_train_state ts;
    cr_assert_eq(sm_checkpoint_load(ck, b, NULL, &ts, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(ts.step, res.best_step);
    cr_expect_eq(ts.best_step, res.best_step);
    cr_expect_eq(ts.best_score, res.best_score);
    sm_eval_result ev;
    cr_assert_eq(sm_evaluate(b, &val, 32, &ev, &err), SM_OK, "%s", err.msg);
    cr_expect(fabs(ev.acc - res.best_score) < 1e-12, "best.safetensors evaluates to %g, recorded %g", ev.acc, res.best_score);
    sm_model_free(m);
    sm_model_free(b);
    ds.n = N;
    sm_dataset_free(&ds);
}

/* sm_layer_spread: each layer's mean over features of the std over the examples, the same for any
 * batch size and equal to a two-pass computation over the stored outputs; a model whose parameters
 * are all 0 has every feature constant. */
Test(train, layer_spread_matches_a_direct_computation) {
    sm_dataset ds;
    make_data(&ds, 11);
    sm_error err;
    sm_model_config mc; /* make_model's, without capacity: dropped tokens would depend on the batch */
    sm_model_config_default(&mc);
    cr_assert_eq(sm_model_parse_arch(&mc, "dense:16,moe:12", &err), SM_OK);
    mc.in_dim = D;
    mc.n_classes = K;
    mc.moe.router.E = 4;
    mc.moe.router.k = 2;
    sm_rng r;
    sm_rng_seed(&r, 3);
    sm_model *m = sm_model_create(&mc, 32, &r, &err);
    cr_assert(m, "%s", err.msg);
    double sp7[SM_MAX_LAYERS], sp32[SM_MAX_LAYERS];
    int c7[SM_MAX_LAYERS], c32[SM_MAX_LAYERS];
    cr_assert_eq(sm_layer_spread(m, &ds, 7, sp7, c7, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_layer_spread(m, &ds, 32, sp32, c32, &err), SM_OK, "%s", err.msg);
    /* the batch size must not matter beyond the float rounding of the layer's outputs: a GEMM's sums may
     * run in another order at another batch size (OpenBLAS's generic Prescott kernels do; measured
     * 3.8e-9 relative on layer 0 on an Intel Xeon, family 6 model 207, 2026-12-08), while a sample
     * lost or counted twice moves the spread by far more than 1e-6 */
    for (int l = 0; l < m->n_layers; l++) {
        cr_assert_float_eq(sp7[l], sp32[l], 1e-6 * (1 + sp32[l]), "layer %d: batch 7 %.12g, batch 32 %.12g", l, sp7[l], sp32[l]);
        cr_assert_eq(c7[l], c32[l]);
        cr_assert_gt(sp32[l], 0.01, "layer %d of a random model varies with its input", l);
    }
    /* two passes over layer 0's outputs, kept batch by batch */
    const int W = m->layers[0].out;
    double *o = malloc(sizeof(double) * N * W);
    for (int i = 0; i < N; i += 32) {
        const int B = N - i < 32 ? N - i : 32;
        sm_model_forward(m, ds.x + (size_t)i * D, B, NULL, 0);
        const sm_real *y = sm_seq_output(m->body, 0);
        for (int k = 0; k < B * W; k++) o[(size_t)i * W + k] = y[k];
    }
    double want = 0;
    for (int j = 0; j < W; j++) {
        double mu = 0, v = 0;
        for (int t = 0; t < N; t++) mu += o[(size_t)t * W + j];
        mu /= N;
        for (int t = 0; t < N; t++) v += (o[(size_t)t * W + j] - mu) * (o[(size_t)t * W + j] - mu);
        want += sqrt(v / N);
    }
    want /= W;
    cr_assert_float_eq(sp32[0], want, 1e-9 * want, "layer 0 spread %.12g, two-pass %.12g", sp32[0], want);
    free(o);
    memset(m->params.data, 0, sizeof(sm_real) * m->params.total);
    cr_assert_eq(sm_layer_spread(m, &ds, 32, sp32, c32, &err), SM_OK, "%s", err.msg);
    for (int l = 0; l < m->n_layers; l++) {
        cr_assert_eq(c32[l], m->layers[l].out, "layer %d: %d of %d features constant", l, c32[l], m->layers[l].out);
        cr_assert_eq(sp32[l], 0.0);
    }
    sm_model_free(m);
    sm_dataset_free(&ds);
}
