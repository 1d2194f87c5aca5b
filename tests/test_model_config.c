/* Model descriptions (the JSON a checkpoint stores) read back exactly what was written, and refuse
 * what could not be written back: non-finite numbers, seeds outside 64 bits. Found by fuzz_model_config. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe.h"

Test(model_config, every_u64_seed_round_trips) {
    const uint64_t seeds[] = {0, 1, (1ull << 53) + 1, 18446744073709551615ull};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        sm_model_config c, back;
        sm_model_config_default(&c);
        cr_assert_eq(sm_router_config_set(&c.moe.router, "random", NULL), SM_OK);
        sm_random_opts(&c.moe.router)->seed = seeds[i];
        char *json = sm_model_config_to_json(&c);
        sm_error err = {0};
        cr_assert_eq(sm_model_config_from_json(&back, json, &err), SM_OK, "%s: %s", json, err.msg);
        cr_expect_eq(sm_random_opts(&back.moe.router)->seed, seeds[i], "seed %llu came back as %llu", (unsigned long long)seeds[i],
                     (unsigned long long)sm_random_opts(&back.moe.router)->seed);
        free(json);
    }
}

Test(model_config, impossible_numbers_are_refused_by_field) {
    sm_model_config c;
    sm_model_config_default(&c);
    cr_assert_eq(sm_router_config_set(&c.moe.router, "random", NULL), SM_OK); /* whose own option is the seed */
    char *json = sm_model_config_to_json(&c);
    struct {
        const char *from, *to, *field;
    } cases[] = {{"\"temperature\":1", "\"temperature\":1e999", "temperature"},
                 {"\"seed\":1", "\"seed\":-1", "seed"},
                 {"\"seed\":1", "\"seed\":1e30", "seed"},
                 {"\"seed\":1", "\"seed\":\"12x\"", "seed"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *at = strstr(json, cases[i].from), buf[4096];
        cr_assert(at, "no %s in %s", cases[i].from, json);
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - json), json, cases[i].to, at + strlen(cases[i].from));
        sm_model_config back;
        sm_error err = {0};
        cr_expect_eq(sm_model_config_from_json(&back, buf, &err), SM_ERR_FORMAT, "%s accepted", cases[i].to);
        cr_expect(strstr(err.msg, cases[i].field), "%s: %s", cases[i].to, err.msg);
    }
    free(json);
}

/* The memory estimate counts, before any allocation, exactly the parameters sm_model_create then
 * allocates, and activations that grow with the batch. */
Test(model_config, memory_estimate_counts_the_model_it_describes) {
    const char *archs[] = {"dense:32,moe:16", "conv:4:3:2:1,dense:16,moe:8,moe:8"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        sm_model_config c;
        sm_model_config_default(&c);
        sm_error err = {0};
        cr_assert_eq(sm_model_parse_arch(&c, archs[i], &err), SM_OK, "%s: %s", archs[i], err.msg);
        c.in_dim = 784, c.in_c = 1, c.in_h = c.in_w = 28, c.n_classes = 10;
        sm_model_memory small, large;
        cr_assert_eq(sm_model_estimate_memory(&c, 10, &small, &err), SM_OK, "%s", err.msg);
        cr_assert_eq(sm_model_estimate_memory(&c, 1000, &large, &err), SM_OK, "%s", err.msg);
        sm_model *m = sm_model_create(&c, 10, NULL, &err);
        cr_assert(m, "%s", err.msg);
        cr_expect_eq(small.params, m->params.total, "%s: estimated %zu parameters, the model has %zu", archs[i],
                     small.params, m->params.total);
        cr_expect_eq(small.param_bytes, m->params.total * sizeof(sm_real));
        cr_expect(large.act_bytes > 50 * small.act_bytes, "%s: activations %zu for 10 rows, %zu for 1000", archs[i],
                  small.act_bytes, large.act_bytes);
        cr_expect(small.train_bytes >= 4 * small.param_bytes + small.act_bytes);
        sm_model_free(m);
    }
}

static sm_model *macs_model(const char *arch, const char *router, int E, int k, int c, int hw, int in_dim, int classes) {
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&cfg, arch, &err), SM_OK, "%s", err.msg);
    cfg.in_c = c, cfg.in_h = cfg.in_w = hw, cfg.in_dim = in_dim, cfg.n_classes = classes;
    if (router) cr_assert_eq(sm_router_config_set(&cfg.moe.router, router, NULL), SM_OK);
    cfg.moe.router.E = E, cfg.moe.router.k = k;
    sm_rng r;
    sm_rng_seed(&r, 1);
    sm_model *m = sm_model_create(&cfg, 8, &r, &err);
    cr_assert(m, "%s: %s", arch, err.msg);
    return m;
}

/* sm_model_macs against multiply-adds counted by hand: MinAtar's DQN network, a tokenised SoftMoE-4
 * (64 PerConv tokens of 16 features, 16 slots per expert), a token-choice top-2 MoE, an Impala
 * residual block, and the update count (two forwards, then both operands' gradients except the
 * first layer's input gradient). */
Test(model_config, multiply_adds_match_a_hand_count) {
    sm_model *m = macs_model("conv:16:3:1:0,dense:128", NULL, 4, 2, 4, 10, 400, 6);
    const double conv = 16.0 * 8 * 8 * 4 * 9, dense = 1024.0 * 128, head = 128.0 * 6;
    cr_expect_float_eq(sm_model_macs(m), conv + dense + head, 1e-9);
    cr_expect_float_eq(sm_model_update_macs(m, 32, 2), 32 * (4 * (conv + dense + head) - conv), 1e-6);
    sm_model_free(m);

    m = macs_model("conv:16:3:1:0,tokens,moe:64,flatten", "soft", 4, 1, 4, 10, 400, 6);
    /* 64 tokens, S = 4 x 16 slots: logits 64 x 64 x 16, dispatch 64 x 64 x 16, combine 64 x 64 x 16;
     * experts on 64 slots 16 -> 64 -> 16; the head reads 64 x 16 */
    const double soft = 3.0 * 64 * 64 * 16 + 64.0 * (16 * 64 + 64 * 16) + 1024.0 * 6;
    cr_expect_float_eq(sm_model_macs(m), conv + soft, 1e-9, "soft: %.0f, hand %.0f", sm_model_macs(m), conv + soft);
    sm_model_free(m);

    m = macs_model("dense:12,moe:10", "topk", 4, 2, 6, 1, 6, 3);
    cr_expect_float_eq(sm_model_macs(m), 6.0 * 12 + 12 * 4 + 2 * (12 * 10 + 10 * 12) + 12 * 3, 1e-9);
    cr_expect_float_eq(sm_model_update_macs(m, 5, 1), 5 * (3 * sm_model_macs(m) - 6.0 * 12), 1e-9);
    sm_model_free(m);

    m = macs_model("conv:8:3:1:1,res:8,flatten", NULL, 4, 2, 2, 5, 50, 3);
    const double c0 = 8.0 * 25 * 2 * 9, res = 2 * 8.0 * 25 * 8 * 9;
    cr_expect_float_eq(sm_model_macs(m), c0 + res + 200.0 * 3, 1e-9);
    sm_model_free(m);
}
