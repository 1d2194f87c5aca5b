/* The MoE layer and the Adam / AdamW optimisers against PyTorch (llm.c test_gpt2.c style).
 *
 * tests/data/moe_reference.safetensors is written by tools/reference/moe_reference.py, an
 * independent HF-Mixtral-style implementation computed in float64 with autograd. For each case it
 * holds the config (metadata "caseN.config", JSON), the input x (T,d), every parameter under
 * "caseN.layer.*", an upstream gradient G (T,d), and for loss = sum(out * G): out (T,d), dx (T,d),
 * every parameter gradient ("<param>.grad"), the routing probabilities (T,E), the per-expert loads
 * (E) and the dropped count (1). Cases with "caseN.optim" also hold the parameters after each of
 * 3 optimiser steps ("caseN.<kind>_step<s>.<param>").
 *
 * Tolerance: this library computes in float32, the reference in float64 from the same float32
 * inputs, so a tensor matches when max|ours - ref| <= RTOL * (1 + max|ref|) with RTOL = 1e-4
 * (float32 carries ~6e-8 relative error per operation; sums here have <= 48 terms, so honest
 * results sit near 1e-6 and a wrong formula lands at 1e-2 or more). The script only accepts inputs
 * that keep the comparison well posed: no top-k near-ties, no ReLU kinks, no tiny gradients before
 * an Adam step. Loads and the dropped count are integers and must match exactly.
 *
 * Run from the repo root: make build/tests/test_reference && build/tests/test_reference
 * Regenerate the data:    /usr/bin/python3 tools/reference/moe_reference.py
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/nn/moe.h"
#include "specmoe/core/optim.h"
#include "specmoe/io/safetensors.h"
#include "reference.h"

#define REF_PATH "tests/data/moe_reference.safetensors"
#define RTOL 1e-4
#define SHOW 5 /* values printed on a mismatch */

/* ------------------------------------------------------------------------------ reading the file */

static void ref_open(sm_safetensors *st) { ref_open_file(st, REF_PATH, "tools/reference/moe_reference.py"); }

/* Tensor name as sm_real[numel]; checks the element count. Caller frees. */
static sm_real *ref_get(const sm_safetensors *st, const char *name, size_t numel) {
    const sm_st_tensor *t = sm_safetensors_find(st, name);
    cr_assert(t, "%s: tensor '%s' missing", REF_PATH, name);
    cr_assert_eq(t->numel, numel, "%s: tensor '%s' has %zu values, expected %zu", REF_PATH, name, t->numel,
                 numel);
    return ref_tensor_to_real(t, REF_PATH);
}

static double json_num(const cJSON *o, const char *key, const char *what) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsNumber(v), "%s: %s has no number '%s'", REF_PATH, what, key);
    return v->valuedouble;
}

static cJSON *meta_json(const sm_safetensors *st, const char *key) {
    const char *s = sm_safetensors_meta(st, key);
    cr_assert(s, "%s: metadata '%s' missing", REF_PATH, key);
    cJSON *j = cJSON_Parse(s);
    cr_assert(j && cJSON_IsObject(j), "%s: metadata '%s' is not a JSON object", REF_PATH, key);
    return j;
}

/* ------------------------------------------------------------------------------------- comparing */

static ref_stats g_stats; /* worst max|diff| / tol seen in this test, for the summary line */


static int compare_ref(const sm_safetensors *st, const char *name, const sm_real *got, size_t n) {
    sm_real *ref = ref_get(st, name, n);
    int ok = ref_compare(&g_stats, name, got, ref, n, RTOL, SHOW);
    free(ref);
    return ok;
}

/* ------------------------------------------------------------------------------ building a case */

typedef struct {
    char name[16], prefix[32];
    int T, d, H, E, k;
    sm_moe *m;
    sm_params ps;
    sm_real *x, *G, *out, *dx; /* (T,d) */
} ref_case;

static void case_open(ref_case *c, const sm_safetensors *st, const char *name) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->prefix, sizeof c->prefix, "%s.layer", name);
    char key[64];
    snprintf(key, sizeof key, "%s.config", name);
    cJSON *j = meta_json(st, key);
    c->T = (int)json_num(j, "T", key);
    c->d = (int)json_num(j, "d", key);
    c->H = (int)json_num(j, "H", key);
    c->E = (int)json_num(j, "E", key);
    c->k = (int)json_num(j, "k", key);

    sm_moe_config mc;
    sm_moe_config_default(&mc);
    snprintf(mc.router.name, sizeof mc.router.name, "topk");
    mc.router.E = c->E;
    mc.router.k = c->k;
    mc.router.temperature = json_num(j, "temperature", key);
    mc.router.renorm = (int)json_num(j, "renorm", key);
    mc.router.capacity = json_num(j, "capacity", key);
    mc.router.noisy = 0;
    mc.H = c->H;
    mc.n_shared = (int)json_num(j, "shared", key);
    mc.expert_bias = 1;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "act");
    cr_assert(cJSON_IsString(act) && sm_act_parse(act->valuestring, &mc.act) == 0, "%s: bad 'act'", key);
    cJSON_Delete(j);

    sm_error err = {0};
    c->m = sm_moe_create(&mc, c->d, &err);
    cr_assert(c->m, "%s: %s", name, err.msg);
    sm_params_init_table(&c->ps);
    cr_assert_eq(sm_moe_declare(c->m, &c->ps, c->prefix, &err), SM_OK, "%s: %s", name, err.msg);
    cr_assert_eq(sm_params_alloc(&c->ps, &err), SM_OK, "%s: %s", name, err.msg);
    sm_moe_bind(c->m, &c->ps);
    cr_assert_eq(sm_moe_reserve(c->m, c->T, &err), SM_OK, "%s: %s", name, err.msg);

    /* parameters in by name; every tensor we declared must be in the file with the same shape ... */
    for (int i = 0; i < c->ps.n; i++) {
        const sm_param *q = &c->ps.p[i];
        const sm_st_tensor *t = sm_safetensors_find(st, q->name);
        cr_assert(t, "%s: parameter '%s' missing from the reference", REF_PATH, q->name);
        int same = t->ndim == q->ndim;
        for (int a = 0; same && a < q->ndim; a++) same = t->shape[a] == q->shape[a];
        cr_assert(same, "%s: parameter '%s' has another shape in the reference", REF_PATH, q->name);
        sm_real *v = ref_get(st, q->name, q->numel);
        memcpy(sm_params_data(&c->ps, i), v, sizeof(sm_real) * q->numel);
        free(v);
    }
    /* ... and every parameter of the reference must be one we declared (no silently ignored tensor) */
    size_t plen = strlen(c->prefix);
    for (int i = 0; i < st->n_tensors; i++) {
        const char *n = st->tensors[i].name;
        size_t len = strlen(n);
        if (strncmp(n, c->prefix, plen) != 0 || n[plen] != '.') continue;
        if (len > 5 && strcmp(n + len - 5, ".grad") == 0) continue;
        cr_assert(sm_params_find(&c->ps, n) >= 0, "%s: reference parameter '%s' was not declared by specmoe",
                  REF_PATH, n);
    }
    size_t Td = (size_t)c->T * c->d;
    snprintf(key, sizeof key, "%s.x", name);
    c->x = ref_get(st, key, Td);
    snprintf(key, sizeof key, "%s.G", name);
    c->G = ref_get(st, key, Td);
    c->out = calloc(Td, sizeof(sm_real));
    c->dx = calloc(Td, sizeof(sm_real));
    cr_assert(c->out && c->dx);
}

static void case_close(ref_case *c) {
    sm_moe_free(c->m);
    sm_params_free(&c->ps);
    free(c->x);
    free(c->G);
    free(c->out);
    free(c->dx);
}

/* zero_grad, forward (train = 0: no noise), backward of loss = sum(out * G). */
static void case_step(ref_case *c) {
    sm_params_zero_grad(&c->ps);
    memset(c->dx, 0, sizeof(sm_real) * (size_t)c->T * c->d);
    sm_moe_forward(c->m, c->out, c->x, c->T, NULL, 0);
    sm_moe_backward(c->m, c->dx, c->G, c->x, c->T);
}

/* ---------------------------------------------------------------------------------------- tests */

static void check_forward_backward(const char *name) {
    sm_safetensors st;
    ref_open(&st);
    ref_case c;
    case_open(&c, &st, name);
    case_step(&c);
    g_stats.worst = 0;
    int bad = 0, n = 0;
    char key[SM_NAME_MAX + 32];
    size_t Td = (size_t)c.T * c.d;
    snprintf(key, sizeof key, "%s.out", name);
    bad += !compare_ref(&st, key, c.out, Td);
    n++;
    snprintf(key, sizeof key, "%s.dx", name);
    bad += !compare_ref(&st, key, c.dx, Td);
    n++;
    snprintf(key, sizeof key, "%s.probs", name);
    bad += !compare_ref(&st, key, c.m->route.probs, (size_t)c.T * c.E);
    n++;
    for (int i = 0; i < c.ps.n; i++, n++) {
        snprintf(key, sizeof key, "%s.grad", c.ps.p[i].name);
        bad += !compare_ref(&st, key, sm_params_grad(&c.ps, i), c.ps.p[i].numel);
    }
    /* routing statistics are integers: exact */
    snprintf(key, sizeof key, "%s.load", name);
    sm_real *load = ref_get(&st, key, (size_t)c.E);
    for (int e = 0; e < c.E; e++)
        if (c.m->route.load[e] != (int)load[e]) {
            fprintf(stderr, "MISMATCH %s[%d]: specmoe %d  torch %d\n", key, e, c.m->route.load[e], (int)load[e]);
            bad++;
        }
    free(load);
    snprintf(key, sizeof key, "%s.dropped", name);
    sm_real *dropped = ref_get(&st, key, 1);
    if (c.m->route.dropped != (long)dropped[0]) {
        fprintf(stderr, "MISMATCH %s: specmoe %ld  torch %ld\n", key, c.m->route.dropped, (long)dropped[0]);
        bad++;
    }
    n += 2;
    printf("reference %s forward/backward: %d tensors, %d mismatched, dropped %ld, worst max|diff|/tol %.3g\n",
           name, n, bad, c.m->route.dropped, g_stats.worst);
    free(dropped);
    case_close(&c);
    sm_safetensors_free(&st);
    cr_expect_eq(bad, 0, "%s: %d of %d reference tensors mismatched (see MISMATCH lines)", name, bad, n);
}

static void check_optimiser(const char *name) {
    sm_safetensors st;
    ref_open(&st);
    ref_case c;
    case_open(&c, &st, name);
    char key[SM_NAME_MAX + 48];
    snprintf(key, sizeof key, "%s.optim", name);
    cJSON *j = meta_json(&st, key);
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    cr_assert(cJSON_IsString(kind) && sm_opt_parse(kind->valuestring, &oc.kind) == 0, "%s: bad 'kind'", key);
    oc.lr = json_num(j, "lr", key);
    oc.eps = json_num(j, "eps", key);
    oc.weight_decay = json_num(j, "weight_decay", key);
    const cJSON *betas = cJSON_GetObjectItemCaseSensitive(j, "betas");
    cr_assert(cJSON_GetArraySize(betas) == 2, "%s: bad 'betas'", key);
    oc.beta1 = cJSON_GetArrayItem(betas, 0)->valuedouble;
    oc.beta2 = cJSON_GetArrayItem(betas, 1)->valuedouble;
    int steps = (int)json_num(j, "steps", key);
    /* the reference excludes these tensor kinds from AdamW's decay with a second parameter group;
     * specmoe does it with SM_PARAM_NO_DECAY: check both sides agree before comparing numbers */
    const cJSON *nd = cJSON_GetObjectItemCaseSensitive(j, "no_decay");
    for (int i = 0; i < c.ps.n; i++) {
        const char *leaf = strrchr(c.ps.p[i].name, '.') + 1;
        int listed = 0;
        for (int a = 0; nd && a < cJSON_GetArraySize(nd); a++)
            listed |= strcmp(cJSON_GetArrayItem(nd, a)->valuestring, leaf) == 0;
        if (oc.kind == SM_OPT_ADAMW)
            cr_assert_eq(listed, !!(c.ps.p[i].flags & SM_PARAM_NO_DECAY),
                         "%s: weight-decay exclusion of '%s' differs from the reference", name, c.ps.p[i].name);
    }
    cJSON_Delete(j);

    sm_optim o;
    sm_error err = {0};
    cr_assert_eq(sm_optim_init(&o, &oc, &c.ps, &err), SM_OK, "%s", err.msg);
    g_stats.worst = 0;
    int bad = 0, n = 0;
    for (int s = 1; s <= steps; s++) {
        case_step(&c);
        sm_optim_step(&o, &c.ps, oc.lr);
        for (int i = 0; i < c.ps.n; i++, n++) {
            snprintf(key, sizeof key, "%s.%s_step%d.%s", name, sm_opt_name(oc.kind), s, c.ps.p[i].name);
            bad += !compare_ref(&st, key, sm_params_data(&c.ps, i), c.ps.p[i].numel);
        }
    }
    printf("reference %s %s x%d: %d tensors, %d mismatched, worst max|diff|/tol %.3g\n", name,
           sm_opt_name(oc.kind), steps, n, bad, g_stats.worst);
    sm_optim_free(&o);
    case_close(&c);
    sm_safetensors_free(&st);
    cr_expect_eq(bad, 0, "%s: %d of %d parameter tensors mismatched after %s steps", name, bad, n,
                 sm_opt_name(oc.kind));
}

Test(reference, file_header) {
    sm_safetensors st;
    ref_open(&st);
    const char *cases = sm_safetensors_meta(&st, "cases");
    cr_assert(cases && strcmp(cases, "case0,case1,case2") == 0, "%s: unexpected case list '%s'", REF_PATH,
              cases ? cases : "(none)");
    sm_safetensors_free(&st);
}

/* top-2 of 6, renormalised, no capacity limit, ReLU */
Test(reference, case0_forward_backward) { check_forward_backward("case0"); }
/* top-2 of 6 at temperature 0.7, not renormalised, capacity factor 1 (drops), 1 shared expert, GELU */
Test(reference, case1_forward_backward) { check_forward_backward("case1"); }
/* dense mixture k = E = 4 at temperature 1.5, renormalised, tanh */
Test(reference, case2_forward_backward) { check_forward_backward("case2"); }
/* 3 Adam steps (torch.optim.Adam, lr 1e-2) */
Test(reference, case0_adam) { check_optimiser("case0"); }
/* 3 AdamW steps (lr 1e-2, weight decay 0.1, biases excluded) through routing with drops */
Test(reference, case1_adamw) { check_optimiser("case1"); }
