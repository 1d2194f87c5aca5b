/* The network-agnostic pieces of training: one optimisation step with a hook between backward and
 * optimiser (sm_train_step), and checkpoints of named parameter sets with key/value metadata. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "specmoe.h"
#include "testutil.h"

/* two small networks standing for an actor and a critic */
typedef struct {
    sm_module *m;
    sm_params ps;
    sm_optim opt;
} net;

static void net_init(net *n, int width, uint64_t seed) {
    sm_error err = {0};
    sm_rng r;
    sm_rng_seed(&r, seed);
    int h[1] = {5};
    n->m = sm_mlp_module("mlp", h, 1, width, SM_ACT_TANH, &err);
    sm_params_init_table(&n->ps);
    cr_assert_eq(sm_module_declare(n->m, &n->ps, sm_shape_vec(4), &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_params_alloc(&n->ps, &err), SM_OK);
    sm_params_initialize(&n->ps, &r);
    cr_assert_eq(sm_module_reserve(n->m, 8, &err), SM_OK);
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    cr_assert_eq(sm_optim_init(&n->opt, &oc, &n->ps, &err), SM_OK);
}

static void net_free(net *n) {
    sm_optim_free(&n->opt);
    sm_module_free(n->m);
    sm_params_free(&n->ps);
}

/* forward + MSE + backward on a fixed batch */
static void net_grad(net *n) {
    sm_real x[8 * 4], y[8 * 3], out[8 * 3], d[8 * 3];
    for (int i = 0; i < 32; i++) x[i] = (sm_real)sin(i);
    for (int i = 0; i < 24; i++) y[i] = (sm_real)cos(i);
    sm_ctx ctx = sm_ctx_make(&n->ps, NULL, 1);
    sm_module_forward(n->m, out, x, 8, &ctx);
    sm_loss_mse(d, out, y, 8, 3, 1);
    sm_params_zero_grad(&n->ps);
    sm_module_backward(n->m, NULL, d, x, 8, &ctx);
}

static int hook_calls;
static sm_status halve(sm_params *ps, void *user, sm_error *err) {
    (void)err;
    hook_calls += *(int *)user;
    for (size_t i = 0; i < ps->total; i++) ps->grad[i] *= 0.5f;
    return SM_OK;
}
static sm_status refuse(sm_params *ps, void *user, sm_error *err) {
    (void)ps, (void)user;
    return sm_fail(err, SM_ERR_IO, "reduction failed");
}

Test(step, the_hook_sees_the_gradients_before_the_optimiser) {
    net a, b;
    net_init(&a, 3, 1);
    net_init(&b, 3, 1);
    sm_error err = {0};
    int one = 1;
    sm_step_hook h = {halve, &one};
    hook_calls = 0;
    double gna, gnb;
    for (int s = 0; s < 3; s++) {
        net_grad(&a);
        net_grad(&b);
        for (size_t i = 0; i < b.ps.total; i++) b.ps.grad[i] *= 0.5f; /* what the hook does, by hand */
        cr_assert_eq(sm_train_step(&a.opt, &a.ps, 1e-2, 0, &h, &gna, &err), SM_OK, "%s", err.msg);
        cr_assert_eq(sm_train_step(&b.opt, &b.ps, 1e-2, 0, NULL, &gnb, &err), SM_OK);
        cr_expect_eq(gna, gnb);
    }
    cr_expect_eq(hook_calls, 3);
    cr_expect_eq(memcmp(a.ps.data, b.ps.data, sizeof(sm_real) * a.ps.total), 0, "the hook's scaling was not applied");
    /* a failing hook stops the step with its message, before the parameters move */
    sm_real before = a.ps.data[0];
    sm_step_hook bad = {refuse, NULL};
    net_grad(&a);
    cr_expect_eq(sm_train_step(&a.opt, &a.ps, 1e-2, 0, &bad, NULL, &err), SM_ERR_IO);
    cr_expect(strstr(err.msg, "reduction failed"));
    cr_expect_eq(a.ps.data[0], before);
    /* a non-finite gradient is refused by name */
    net_grad(&a);
    a.ps.grad[a.ps.p[2].offset] = NAN;
    cr_expect_eq(sm_train_step(&a.opt, &a.ps, 1e-2, 0, NULL, NULL, &err), SM_ERR_NUMERIC);
    cr_expect(strstr(err.msg, a.ps.p[2].name), "%s", err.msg);
    net_free(&a);
    net_free(&b);
}

Test(step, checkpoints_hold_named_sets_and_metadata) {
    net actor, critic, a2, c2;
    net_init(&actor, 3, 1);
    net_init(&critic, 1, 2);
    net_init(&a2, 3, 3);
    net_init(&c2, 1, 4);
    sm_error err = {0};
    net_grad(&actor);
    sm_train_step(&actor.opt, &actor.ps, 1e-2, 0, NULL, NULL, &err);
    char path[512];
    snprintf(path, sizeof path, "%s/agent.safetensors", tu_tmpdir());
    sm_ckpt_set sets[2] = {{"actor.", &actor.ps, &actor.opt}, {"critic.", &critic.ps, NULL}};
    sm_st_meta meta[2] = {{"format", "specmoe-agent"}, {"env_steps", "12345"}};
    cr_assert_eq(sm_checkpoint_write(path, sets, 2, meta, 2, &err), SM_OK, "%s", err.msg);
    sm_safetensors st;
    cr_assert_eq(sm_safetensors_load(&st, path, &err), SM_OK, "%s", err.msg);
    cr_expect_str_eq(sm_safetensors_meta(&st, "env_steps"), "12345");
    cr_expect(sm_safetensors_find(&st, "critic.mlp.0.weight"));
    cr_expect(sm_safetensors_find(&st, "actor.optim.m.mlp.1.bias"));
    cr_expect_null(sm_safetensors_find(&st, "critic.optim.m.mlp.0.weight"));
    /* a set whose shapes differ is refused by name and nothing is copied */
    sm_real keep = a2.ps.data[0];
    sm_ckpt_set wrong[2] = {{"actor.", &a2.ps, &a2.opt}, {"critic.", &a2.ps, NULL}};
    cr_expect_eq(sm_checkpoint_read_sets(&st, path, wrong, 2, NULL, &err), SM_ERR_MISMATCH);
    cr_expect(strstr(err.msg, "critic.mlp"), "%s", err.msg);
    cr_expect_eq(a2.ps.data[0], keep);
    sm_ckpt_set back[2] = {{"actor.", &a2.ps, &a2.opt}, {"critic.", &c2.ps, NULL}};
    cr_assert_eq(sm_checkpoint_read_sets(&st, path, back, 2, NULL, &err), SM_OK, "%s", err.msg);
    for (size_t i = 0; i < actor.ps.total; i++) {
        cr_expect_eq(a2.ps.data[i], actor.ps.data[i]);
        cr_expect_eq(a2.opt.m[i], actor.opt.m[i]);
        cr_expect_eq(a2.opt.v[i], actor.opt.v[i]);
    }
    cr_expect_eq(memcmp(c2.ps.data, critic.ps.data, sizeof(sm_real) * critic.ps.total), 0);
    sm_safetensors_free(&st);
    net_free(&actor), net_free(&critic), net_free(&a2), net_free(&c2);
}

/* a checkpoint holding a NaN or Inf parameter is refused naming the tensor, and nothing is copied */
Test(step, non_finite_parameters_are_refused) {
    net a, b;
    net_init(&a, 3, 5);
    net_init(&b, 3, 6);
    sm_error err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/nan.safetensors", tu_tmpdir());
    a.ps.data[a.ps.p[1].offset + 2] = INFINITY;
    sm_ckpt_set set = {"", &a.ps, NULL};
    cr_assert_eq(sm_checkpoint_write(path, &set, 1, NULL, 0, &err), SM_OK, "%s", err.msg);
    sm_safetensors st;
    cr_assert_eq(sm_safetensors_load(&st, path, &err), SM_OK);
    sm_real keep = b.ps.data[0];
    sm_ckpt_set back = {"", &b.ps, NULL};
    cr_expect_eq(sm_checkpoint_read_sets(&st, path, &back, 1, NULL, &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, a.ps.p[1].name) && strstr(err.msg, "non-finite"), "%s", err.msg);
    cr_expect_eq(b.ps.data[0], keep);
    sm_safetensors_free(&st);
    net_free(&a), net_free(&b);
}
