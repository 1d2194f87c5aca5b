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
        c.moe.router.seed = seeds[i];
        char *json = sm_model_config_to_json(&c);
        sm_error err = {0};
        cr_assert_eq(sm_model_config_from_json(&back, json, &err), SM_OK, "%s: %s", json, err.msg);
        cr_expect_eq(back.moe.router.seed, seeds[i], "seed %llu came back as %llu", (unsigned long long)seeds[i],
                     (unsigned long long)back.moe.router.seed);
        free(json);
    }
}

Test(model_config, impossible_numbers_are_refused_by_field) {
    sm_model_config c;
    sm_model_config_default(&c);
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
