/* The router option tables (sm_router_opt, router.h) agree with each other and give the defaults
 * the hand-written sm_router_config_default gave before them. */
#include <criterion/criterion.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <stddef.h>

#include "specmoe.h"

/* every option of every table, with the table's owner (NULL: shared) */
typedef struct {
    const sm_router_opt *o;
    const char *owner;
} any_opt;

static int all_opts(any_opt *out, int max) {
    int n = 0, ns;
    const sm_router_opt *shared = sm_router_shared_opts(&ns);
    for (int i = 0; i < ns && n < max; i++) out[n++] = (any_opt){&shared[i], NULL};
    for (int r = 0; r < sm_router_count(); r++)
        for (int i = 0; i < sm_router_at(r)->n_opts && n < max; i++)
            out[n++] = (any_opt){&sm_router_at(r)->opts[i], sm_router_at(r)->name};
    return n;
}

Test(router_opts, a_key_means_one_type_and_a_flag_one_key_everywhere) {
    any_opt a[128];
    int n = all_opts(a, 128);
    cr_assert_lt(n, 128);
    const size_t own = offsetof(sm_router_config, own);
    for (int i = 0; i < n; i++) {
        size_t size = a[i].o->type == SM_OPT_INT || a[i].o->type == SM_OPT_BOOL ? sizeof(int) : 8;
        /* shared options are shared fields; a router's own are in `own` (or a shared field: tau) */
        if (!a[i].owner) cr_expect_leq(a[i].o->offset + size, own, "%s", a[i].o->key);
        cr_expect_leq(a[i].o->offset + size, sizeof(sm_router_config), "%s", a[i].o->key);
        cr_expect(a[i].o->help && a[i].o->def, "%s", a[i].o->key);
        sm_router_config scratch;
        memset(&scratch, 0, sizeof scratch);
        cr_expect_eq(sm_router_opt_set(a[i].o, &scratch, a[i].o->def), 0, "%s: the default '%s' does not parse", a[i].o->key,
                     a[i].o->def);
        for (int j = 0; j < i; j++) {
            char fi[32], fj[32];
            sm_router_opt_flag(a[i].o, fi, sizeof fi);
            sm_router_opt_flag(a[j].o, fj, sizeof fj);
            if (!strcmp(fi, fj))
                cr_expect(!strcmp(a[i].o->key, a[j].o->key), "flag --%s: keys %s and %s", fi, a[i].o->key, a[j].o->key);
            if (!strcmp(a[i].o->key, a[j].o->key))
                cr_expect(a[i].o->type == a[j].o->type, "key %s: %s and %s disagree on the type", a[i].o->key,
                          a[i].owner ? a[i].owner : "shared", a[j].owner ? a[j].owner : "shared");
            /* an own option may not take a shared option's flag (it would shadow it), except by
             * setting the same field (prototype's tau is the temperature) */
            if (!strcmp(fi, fj) && !a[j].owner) cr_expect_eq(a[i].o->offset, a[j].o->offset, "--%s shadows a shared flag", fi);
        }
    }
}

Test(router_opts, defaults_are_those_of_the_first_checkpoints) {
    sm_router_config c;
    sm_router_config_default(&c);
    cr_expect_str_eq(c.name, "topk");
    cr_expect(c.E == 8 && c.k == 2 && c.temperature == 1.0 && c.noisy == 0 && c.renorm == 1 && c.capacity == 0);
    cr_expect(c.balance_coef == 0 && c.zloss_coef == 0);
    cr_assert_eq(sm_router_config_set(&c, "grassmann", NULL), SM_OK);
    const sm_grmoe_router_opts *g = sm_grmoe_opts(&c);
    cr_expect(g->kappa_init == 1.0 && g->alpha == 1.0 && g->kr == 16);
    cr_expect(g->amortize == 0 && g->amort_hidden == 32 && g->subspace_beta == 0.01 && g->rho0 == 0.3 && g->pairs == 0);
    cr_expect(c.E == 8 && c.k == 2, "switching router keeps the shared fields");
    cr_assert_eq(sm_router_config_set(&c, "vmf", NULL), SM_OK);
    cr_expect(sm_grmoe_opts(&c)->kappa_init == 1.0);
    cr_assert_eq(sm_router_config_set(&c, "soft", NULL), SM_OK);
    cr_expect(sm_soft_opts(&c)->slots == 0 && sm_soft_opts(&c)->soft_group == 0 && sm_soft_opts(&c)->soft_norm == 1);
    cr_assert_eq(sm_router_config_set(&c, "random", NULL), SM_OK);
    cr_expect(sm_random_opts(&c)->seed == 1);
    cr_assert_eq(sm_router_config_set(&c, "prototype", NULL), SM_OK);
    cr_expect(sm_proto_opts(&c)->proto_sq == 0);
    cr_assert_eq(sm_router_config_set(&c, "ev", NULL), SM_OK);
    cr_expect(sm_ev_opts(&c)->ev_c == 5 && sm_ev_opts(&c)->ev_avg == 0 && sm_ev_opts(&c)->alpha == 0.5);
    sm_error err = {0};
    cr_expect_eq(sm_router_config_set(&c, "nope", &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "unknown router 'nope'") && strstr(err.msg, "grassmann"), "%s", err.msg);
}

/* A model's JSON holds the shared options and its own router's, nothing of the others; a document
 * of the first checkpoints (every router's keys in every model) still reads, the foreign keys
 * ignored. */
Test(router_opts, json_holds_only_the_named_routers_options) {
    sm_router_config c, back;
    sm_router_config_default(&c);
    cr_assert_eq(sm_router_config_set(&c, "grassmann", NULL), SM_OK);
    sm_grmoe_opts(&c)->kr = 7;
    cJSON *o = cJSON_CreateObject();
    sm_router_config_to_json(&c, o);
    cr_expect(cJSON_GetObjectItem(o, "kr") && !cJSON_GetObjectItem(o, "slots") && !cJSON_GetObjectItem(o, "ev_c"));
    sm_error err = {0};
    sm_router_config_default(&back);
    cr_assert_eq(sm_router_config_from_json(&back, o, "test", &err), SM_OK, "%s", err.msg);
    cr_expect_eq(sm_grmoe_opts(&back)->kr, 7);
    cr_expect_eq(memcmp(&back, &c, sizeof c), 0);
    /* the old layout: a soft model that also lists grassmann's and ev's keys */
    cJSON_ReplaceItemInObject(o, "router", cJSON_CreateString("soft"));
    cJSON_AddNumberToObject(o, "slots", 3);
    cJSON_AddNumberToObject(o, "ev_c", 9);
    cr_assert_eq(sm_router_config_from_json(&back, o, "test", &err), SM_OK, "%s", err.msg);
    cr_expect_str_eq(back.name, "soft");
    cr_expect(sm_soft_opts(&back)->slots == 3 && sm_soft_opts(&back)->soft_norm == 1, "kr=7 must not leak into soft's options");
    cJSON_Delete(o);
}

/* Dials change on a built model (no retraining); other options and other routers' dials are refused. */
Test(router_opts, dials_are_set_on_a_model_and_checked) {
    sm_model_config mc;
    sm_model_config_default(&mc);
    mc.in_dim = 12;
    mc.n_classes = 3;
    sm_error err = {0};
    cr_assert_eq(sm_model_parse_arch(&mc, "moe:8", &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_router_config_set(&mc.moe.router, "grassmann", NULL), SM_OK);
    sm_grmoe_opts(&mc.moe.router)->kr = 2;
    mc.moe.router.E = 4;
    mc.moe.router.k = 4;
    sm_model *m = sm_model_create(&mc, 4, NULL, &err);
    cr_assert(m, "%s", err.msg);
    cr_expect_eq(sm_model_set_dial(m, "alpha", "2.5", &err), SM_OK, "%s", err.msg);
    cr_expect_eq(sm_grmoe_opts(&sm_model_moe(m, 0)->router->cfg)->alpha, 2.5);
    cr_expect_eq(sm_model_set_dial(m, "temperature", "0.5", &err), SM_OK, "%s", err.msg);
    cr_expect_eq(sm_model_moe(m, 0)->router->cfg.temperature, 0.5);
    cr_expect_eq(sm_model_set_dial(m, "alpha", "-1", &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "alpha (the sparsity dial) must be >= 0"), "%s", err.msg);
    cr_expect_eq(sm_grmoe_opts(&sm_model_moe(m, 0)->router->cfg)->alpha, 2.5, "a refused dial leaves the model");
    cr_expect_eq(sm_model_set_dial(m, "kr", "1", &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "'kr' is not a dial of the grassmann router"), "%s", err.msg);
    cr_expect_eq(sm_model_set_dial(m, "ev_c", "3", &err), SM_ERR_ARG);
    sm_model_free(m);
}

Test(router_opts, names_come_from_the_registry_and_defaults_pass_every_check) {
    const char *names = sm_router_names();
    for (int r = 0; r < sm_router_count(); r++) {
        const sm_router_ops *ops = sm_router_at(r);
        cr_expect(strstr(names, ops->name), "%s not in %s", ops->name, names);
        cr_expect_eq(sm_router_find(ops->name), ops);
        sm_router_config c;
        sm_router_config_default(&c);
        sm_error err = {0};
        cr_assert_eq(sm_router_config_set(&c, ops->name, &err), SM_OK, "%s", err.msg);
        sm_router *rt = sm_router_create(&c, 16, &err);
        cr_expect(rt, "%s: %s", ops->name, err.msg);
        sm_router_free(rt);
    }
    cr_expect_null(sm_router_find("nope"));
}

Test(router_opts, router_checks_keep_their_messages) {
    struct {
        const char *router, *key, *value, *msg;
    } cases[] = {
        {"grassmann", "kr", "17", "routing rank k_r must be in [1, d=16]"},
        {"grassmann", "alpha", "-1", "alpha (the sparsity dial) must be >= 0"},
        {"vmf", "kappa_init", "0", "initial concentration kappa must be > 0"},
        {"grassmann", "pairs", "-2", "sampled pairs must be >= 1"},
        {"soft", "slots", "-1", "soft slots and group size must be >= 0"},
        {"ev", "ev_c", "0", "ev needs c >= 1"},
        {"topk", "topk", "9", "top-k must be in [1, E]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sm_router_config c;
        sm_router_config_default(&c);
        cr_assert_eq(sm_router_config_set(&c, cases[i].router, NULL), SM_OK);
        const sm_router_opt *o = sm_router_find_opt(sm_router_find(cases[i].router), cases[i].key);
        cr_assert(o && !sm_router_opt_set(o, &c, cases[i].value), "%s", cases[i].key);
        sm_error err = {0};
        cr_expect_null(sm_router_create(&c, 16, &err), "%s %s=%s accepted", cases[i].router, cases[i].key, cases[i].value);
        cr_expect(strstr(err.msg, cases[i].msg), "%s", err.msg);
    }
}
