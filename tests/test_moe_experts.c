/* An MoE layer whose experts come from a module factory (sm_moe_module_experts), here deeper MLPs
 * with their own output width behind a gate network: written to a checkpoint with its description,
 * the network rebuilt from that description loads the checkpoint and gives the same outputs, bit
 * for bit (float build, as a trained network would be saved and evaluated). And the built-in
 * experts' small-GEMM path against OpenBLAS (below). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "specmoe/io/checkpoint.h"
#include "specmoe/io/safetensors.h"
#include "specmoe/nn/module.h"
#include "specmoe/nn/moe.h"
#include "specmoe/nn/routers.h"
#include "testutil.h"

enum { B = 5, R = 4, D = 6 };

/* d -> 7 -> 5 -> 3 with GELU: not the built-in expert (depth and output width of its own) */
static sm_module *deep_expert(void *user, int e, sm_error *err) {
    (void)user, (void)e;
    int w[2] = {7, 5};
    return sm_mlp_module("", w, 2, 3, SM_ACT_GELU, err);
}

static sm_module *network(const char *router, sm_error *err) {
    sm_moe_config mc;
    sm_moe_config_default(&mc);
    sm_router_config_set(&mc.router, router, NULL);
    mc.router.E = 4;
    mc.router.k = 2;
    if (!strcmp(router, "soft")) sm_soft_opts(&mc.router)->slots = 2;
    sm_module *ch[3] = {
        sm_moe_module_experts("", &mc, deep_expert, NULL, sm_dense_module("", 4, SM_ACT_TANH, err), err),
        sm_flatten_module("", err), sm_dense_module("", 2, SM_ACT_NONE, err)};
    return sm_seq_module("net", ch, 3, err);
}

/* declares, allocates and reserves m for tokens of shape (R, D) */
static void build(sm_module *m, sm_params *ps) {
    sm_error err = {0};
    sm_shape toks = {R, D, 1, 1};
    cr_assert(m, "%s", err.msg);
    sm_params_init_table(ps);
    cr_assert_eq(sm_module_declare(m, ps, toks, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_params_alloc(ps, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_module_reserve(m, B, &err), SM_OK, "%s", err.msg);
}

static void round_trip_through_a_checkpoint(const char *router) {
    sm_error err = {0};
    sm_rng rng;
    sm_rng_seed(&rng, 3);
    sm_module *m = network(router, &err);
    sm_params ps;
    build(m, &ps);
    sm_params_initialize(&ps, &rng);
    const char *dir = tu_tmpdir();
    char path[128], *json = sm_module_to_json(m);
    snprintf(path, sizeof path, "%s/net.safetensors", dir);
    sm_ckpt_set set = {"", &ps, NULL};
    sm_st_meta meta = {"module", json};
    cr_assert_eq(sm_checkpoint_write(path, &set, 1, &meta, 1, &err), SM_OK, "%s", err.msg);

    sm_safetensors st;
    cr_assert_eq(sm_safetensors_load(&st, path, &err), SM_OK, "%s", err.msg);
    const char *desc = sm_safetensors_meta(&st, "module");
    cr_assert(desc);
    sm_module *m2 = sm_module_from_json(desc, &err);
    sm_params ps2;
    build(m2, &ps2);
    cr_assert_eq(ps2.n, ps.n);
    sm_ckpt_set set2 = {"", &ps2, NULL};
    cr_assert_eq(sm_checkpoint_read_sets(&st, path, &set2, 1, NULL, &err), SM_OK, "%s", err.msg);
    sm_safetensors_free(&st);
    remove(path), rmdir(dir);

    sm_real x[B * R * D], o1[B * 2], o2[B * 2];
    for (int i = 0; i < B * R * D; i++) x[i] = (sm_real)sm_rng_normal(&rng);
    sm_ctx c1 = sm_ctx_make(&ps, NULL, 0), c2 = sm_ctx_make(&ps2, NULL, 0);
    sm_module_forward(m, o1, x, B, &c1);
    sm_module_forward(m2, o2, x, B, &c2);
    for (int i = 0; i < B * 2; i++) cr_expect_eq(o2[i], o1[i], "%s: out[%d] %g != %g", router, i, o2[i], o1[i]);
    sm_moe *moe = sm_moe_of(sm_seq_child(m2, 0));
    cr_assert(moe);
    cr_expect_eq(moe->O, 3);
    cr_expect_null(sm_moe_features(moe, NULL));
    free(json);
    sm_module_free(m), sm_module_free(m2);
    sm_params_free(&ps), sm_params_free(&ps2);
}

Test(moe_experts, factory_network_loads_its_checkpoint) {
    round_trip_through_a_checkpoint("topk");
    round_trip_through_a_checkpoint("soft");
}

/* The built-in experts' linear maps run on the packed small GEMM at 2-256 rows per expert (the
 * layer's per-thread workspaces, lin_ws) and by gemv at one row; the output, the input gradient and
 * every parameter gradient agree with OpenBLAS (lin_rows = 0) to float rounding: T tokens over 8
 * experts, top-2, so about T / 4 rows per expert (1 to over 256), depth 1 and 3, one and two threads
 * (with two, the experts run one per thread, each on its own workspace). */
/* A built-in MoE layer d = 17 -> H = 64 (ReLU, depth hidden layers) -> 6 under router (E experts, top
 * k), its parameters drawn from r, reserved for T tokens */
static sm_moe *relu_layer(const char *router, int E, int k, int depth, int T, sm_params *ps, sm_rng *r) {
    sm_moe_config c;
    sm_moe_config_default(&c);
    sm_router_config_set(&c.router, router, NULL);
    c.router.E = E, c.router.k = k, c.H = 64, c.depth = depth, c.out_dim = 6, c.act = SM_ACT_RELU;
    sm_error err = {0};
    sm_moe *m = sm_moe_create(&c, 17, &err);
    cr_assert(m, "%s", err.msg);
    sm_params_init_table(ps);
    cr_assert_eq(sm_moe_declare(m, ps, "moe", &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_params_alloc(ps, &err), SM_OK, "%s", err.msg);
    sm_params_initialize(ps, r);
    sm_moe_bind(m, ps);
    cr_assert_eq(sm_moe_reserve(m, T, &err), SM_OK, "%s", err.msg);
    return m;
}

static void small_path_case(int depth, int T, int threads) {
    const int d = 17, O = 6;
#ifdef _OPENMP /* before the reserve, which sizes a workspace per thread */
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
#else
    (void)threads;
#endif
    sm_params ps;
    sm_rng r;
    sm_rng_seed(&r, 11 + (uint64_t)T);
    sm_moe *m = relu_layer("topk", 8, 2, depth, T, &ps, &r);
    cr_assert_gt(m->lin_rows, 0, "no small-GEMM workspace for %d x %d -> %d experts", d, m->H, O);
    sm_real *x = malloc(sizeof(sm_real) * T * d), *dout = malloc(sizeof(sm_real) * T * O);
    for (int i = 0; i < T * d; i++) x[i] = (sm_real)sm_rng_normal(&r);
    for (int i = 0; i < T * O; i++) dout[i] = (sm_real)sm_rng_normal(&r);
    sm_real *out[2], *dx[2], *g[2];
    const int lin_rows = m->lin_rows;
    for (int v = 0; v < 2; v++) {
        m->lin_rows = v ? 0 : lin_rows; /* v = 1: every product through OpenBLAS */
        out[v] = malloc(sizeof(sm_real) * T * O), dx[v] = calloc((size_t)T * d, sizeof(sm_real));
        g[v] = malloc(sizeof(sm_real) * ps.total);
        sm_params_zero_grad(&ps);
        sm_moe_forward(m, out[v], x, T, NULL, 0);
        sm_moe_backward(m, dx[v], dout, x, T);
        memcpy(g[v], ps.grad, sizeof(sm_real) * ps.total);
    }
#ifdef _OPENMP
    omp_set_num_threads(saved);
#endif
    for (int i = 0; i < T * O; i++)
        cr_assert(fabs(out[0][i] - out[1][i]) <= 1e-4 * (1 + fabs(out[1][i])), "depth %d T %d: out[%d] %g, OpenBLAS %g",
                  depth, T, i, out[0][i], out[1][i]);
    for (int i = 0; i < T * d; i++)
        cr_assert(fabs(dx[0][i] - dx[1][i]) <= 1e-4 * (1 + fabs(dx[1][i])), "depth %d T %d: dx[%d] %g, OpenBLAS %g", depth,
                  T, i, dx[0][i], dx[1][i]);
    for (int p = 0; p < ps.n; p++)
        for (size_t j = 0; j < ps.p[p].numel; j++) {
            const size_t i = ps.p[p].offset + j;
            cr_assert(fabs(g[0][i] - g[1][i]) <= 1e-4 * (1 + fabs(g[1][i])), "depth %d T %d threads %d: %s[%zu] %g, OpenBLAS %g",
                      depth, T, threads, ps.p[p].name, j, g[0][i], g[1][i]);
        }
    for (int v = 0; v < 2; v++) free(out[v]), free(dx[v]), free(g[v]);
    free(x), free(dout);
    sm_moe_free(m);
    sm_params_free(&ps);
}

Test(moe_experts, small_gemm_path_matches_openblas) {
    static const int Ts[] = {1, 3, 40, 64, 300, 1400};
    for (int depth = 1; depth <= 3; depth += 2)
        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
            for (int threads = 1; threads <= 2; threads++) small_path_case(depth, Ts[t], threads);
}

/* whether the rule takes every forward product of relu_layer's experts (17 -> 64 [-> 64] -> 6) at n rows */
static int all_packed(int n, int depth) {
    return (sm_linear_small_use(n, 17, 64) & SM_LINEAR_SMALL_FWD) && (sm_linear_small_use(n, 64, 6) & SM_LINEAR_SMALL_FWD) &&
           (depth < 2 || (sm_linear_small_use(n, 64, 64) & SM_LINEAR_SMALL_FWD));
}

/* An expert's rows beyond 128 run 128 at a time on the packed product (moe.c, EXPERT_CHUNK), not
 * through OpenBLAS in one piece. With the hash router (no gate product, whose bits could depend on
 * the call's size) the first 100 tokens give the same bits alone (about 25 rows per expert) as within
 * a call of 1400 tokens (about 350 rows per expert, three chunks). */
Test(moe_experts, rows_beyond_the_chunk_take_the_packed_product) {
    for (int depth = 1; depth <= 3; depth += 2) {
        const int d = 17, O = 6, T = 1400, T1 = 100;
        sm_params ps;
        sm_rng r;
        sm_rng_seed(&r, 5);
        sm_moe *m = relu_layer("hash", 4, 1, depth, T, &ps, &r);
        if (m->lin_rows < 128) { /* no packed product here (no AVX2): nothing is chunked */
            fprintf(stderr, "moe_experts: no packed product on this CPU\n");
            sm_moe_free(m), sm_params_free(&ps);
            return;
        }
        sm_real *x = malloc(sizeof(sm_real) * T * d), *out = malloc(sizeof(sm_real) * T * O),
                *out1 = malloc(sizeof(sm_real) * T1 * O);
        for (int i = 0; i < T * d; i++) x[i] = (sm_real)sm_rng_normal(&r);
        sm_moe_forward(m, out, x, T, NULL, 0);
        /* the bits agree only where every product of both calls takes the packed forward (on an AVX-512
         * core: from 8 rows; under the AVX2 rule OpenBLAS takes 128-row chunks of these shapes): the
         * chunks of the long call, and each expert's rows in the short one */
        int most = 0, packed = 1;
        for (int e = 0; e < 4; e++) {
            const int n = m->route.offset[e + 1] - m->route.offset[e];
            most = n > most ? n : most;
            for (int c = 0; c < n; c += 128) packed &= all_packed(n - c < 128 ? n - c : 128, depth);
        }
        cr_assert_gt(most, 256, "depth %d: at most %d rows per expert; the case needs more than 256", depth, most);
        sm_moe_forward(m, out1, x, T1, NULL, 0);
        for (int e = 0; e < 4; e++) packed &= all_packed(m->route.offset[e + 1] - m->route.offset[e], depth);
        if (!packed) {
            fprintf(stderr, "moe_experts: OpenBLAS takes some of these products on this CPU: no bits to compare\n");
            free(x), free(out), free(out1), sm_moe_free(m), sm_params_free(&ps);
            return;
        }
        for (int i = 0; i < T1 * O; i++)
            cr_assert(out1[i] == out[i], "depth %d: out[%d] = %.9g within %d tokens, %.9g in a call of its own", depth, i,
                      out[i], T, out1[i]);
        free(x), free(out), free(out1);
        sm_moe_free(m);
        sm_params_free(&ps);
    }
}
