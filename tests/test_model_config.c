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
