/* The router option tables (sm_router_opt, router.h) agree with each other and give the defaults
 * the hand-written sm_router_config_default gave before them. */
#include <criterion/criterion.h>
#include <string.h>

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

Test(router_opts, a_key_means_one_field_type_and_default_everywhere) {
    any_opt a[128];
    int n = all_opts(a, 128);
    cr_assert_lt(n, 128);
    for (int i = 0; i < n; i++) {
        cr_expect_leq(a[i].o->offset + (a[i].o->type == SM_OPT_INT || a[i].o->type == SM_OPT_BOOL ? sizeof(int) : 8),
                      sizeof(sm_router_config), "%s", a[i].o->key);
        cr_expect(a[i].o->help && a[i].o->def, "%s", a[i].o->key);
        sm_router_config scratch;
        memset(&scratch, 0, sizeof scratch);
        cr_expect_eq(sm_router_opt_set(a[i].o, &scratch, a[i].o->def), 0, "%s: the default '%s' does not parse", a[i].o->key,
                     a[i].o->def);
        for (int j = 0; j < i; j++) {
            char fi[32], fj[32];
            sm_router_opt_flag(a[i].o, fi, sizeof fi);
            sm_router_opt_flag(a[j].o, fj, sizeof fj);
            if (!strcmp(fi, fj) && a[i].o != a[j].o)
                cr_expect(!strcmp(a[i].o->key, a[j].o->key) && a[i].owner && a[j].owner,
                          "flag --%s: %s and %s set different fields, or shadow a shared one", fi, a[i].o->key, a[j].o->key);
            if (strcmp(a[i].o->key, a[j].o->key)) continue;
            cr_expect(a[i].o->offset == a[j].o->offset && a[i].o->type == a[j].o->type &&
                          !strcmp(a[i].o->def, a[j].o->def) && a[i].o->required == a[j].o->required,
                      "key %s: %s and %s disagree", a[i].o->key, a[i].owner ? a[i].owner : "shared",
                      a[j].owner ? a[j].owner : "shared");
        }
    }
}

Test(router_opts, defaults_are_those_of_the_first_checkpoints) {
    sm_router_config c;
    sm_router_config_default(&c);
    cr_expect_str_eq(c.name, "topk");
    cr_expect(c.E == 8 && c.k == 2 && c.temperature == 1.0 && c.noisy == 0 && c.renorm == 1 && c.capacity == 0);
    cr_expect(c.balance_coef == 0 && c.zloss_coef == 0 && c.kappa_init == 1.0 && c.alpha == 1.0 && c.kr == 16);
    cr_expect(c.amortize == 0 && c.amort_hidden == 32 && c.subspace_beta == 0.01 && c.rho0 == 0.3 && c.pairs == 0);
    cr_expect(c.slots == 0 && c.soft_group == 0 && c.soft_norm == 1 && c.seed == 1 && c.proto_sq == 0);
    cr_expect(c.ev_c == 5 && c.ev_avg == 0);
}

Test(router_opts, names_come_from_the_registry_and_defaults_pass_every_check) {
    const char *names = sm_router_names();
    for (int r = 0; r < sm_router_count(); r++) {
        const sm_router_ops *ops = sm_router_at(r);
        cr_expect(strstr(names, ops->name), "%s not in %s", ops->name, names);
        cr_expect_eq(sm_router_find(ops->name), ops);
        sm_router_config c;
        sm_router_config_default(&c);
        strcpy(c.name, ops->name);
        sm_error err = {0};
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
    any_opt a[128];
    int n = all_opts(a, 128);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sm_router_config c;
        sm_router_config_default(&c);
        strcpy(c.name, cases[i].router);
        int found = 0;
        for (int j = 0; j < n && !found; j++)
            if (!strcmp(a[j].o->key, cases[i].key)) found = !sm_router_opt_set(a[j].o, &c, cases[i].value);
        cr_assert(found, "%s", cases[i].key);
        sm_error err = {0};
        cr_expect_null(sm_router_create(&c, 16, &err), "%s %s=%s accepted", cases[i].router, cases[i].key, cases[i].value);
        cr_expect(strstr(err.msg, cases[i].msg), "%s", err.msg);
    }
}
