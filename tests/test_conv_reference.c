/* The image ops of include/specmoe/conv.h against PyTorch (llm.c test_gpt2.c style).
 *
 * tests/data/conv_reference.safetensors is written by tools/reference/conv_reference.py with
 * torch.nn.functional.conv2d / max_pool2d / avg_pool2d / adaptive_avg_pool2d in float64 with autograd,
 * from float32-rounded inputs. For each case ("<case>.config" in the metadata: the op and its sizes)
 * it holds the input x, the parameters (conv2d: weight, bias), a fixed upstream gradient G, and for
 * L = sum(out * G): out, dx and the parameter gradients (dweight, dbias), plus the max-pool argmax
 * idx. Every tensor's shape is checked against the one specmoe computes (sm_conv2d_shape for the
 * output), then values are compared.
 *
 * Tolerance: this library computes in float32 and the reference in float64 from the same float32
 * inputs, so a tensor matches when max|ours - ref| <= RTOL * (1 + max|ref|) with RTOL = 1e-4. The
 * longest sum here has 100 terms (a 4-channel 5x5 kernel; dweight sums 2 x 20 pixels), so honest
 * float32 results sit near 1e-6 and a wrong index or scale lands at 1e-2 or more. Max-pool indices
 * are integers and must match exactly (the script refuses inputs with near-ties in a window).
 *
 * Run from the repo root: make build/tests/test_conv_reference && build/tests/test_conv_reference
 * Regenerate the data:    /usr/bin/python3 tools/reference/conv_reference.py
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/conv.h"
#include "specmoe/io/safetensors.h"
#include "reference.h"

#define REF_PATH "tests/data/conv_reference.safetensors"
#define RTOL 1e-4
#define SHOW 5 /* values printed on a mismatch */

/* ------------------------------------------------------------------------------ reading the file */

static void ref_open(sm_safetensors *st) { ref_open_file(st, REF_PATH, "tools/reference/conv_reference.py"); }

/* "<c>.<what>" as sm_real[], after checking it has exactly the 4-d shape (d0,d1,d2,d3) - or the 1-d
 * shape (d0) when d1 < 0. Caller frees. */
static sm_real *ref_get(const sm_safetensors *st, const char *c, const char *what, int d0, int d1, int d2,
                        int d3) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s", c, what);
    const sm_st_tensor *t = sm_safetensors_find(st, name);
    cr_assert(t, "%s: tensor '%s' missing", REF_PATH, name);
    const int64_t want[4] = {d0, d1, d2, d3};
    const int nd = d1 < 0 ? 1 : 4;
    int same = t->ndim == nd;
    for (int a = 0; same && a < nd; a++) same = t->shape[a] == want[a];
    cr_assert(same, "%s: tensor '%s' has shape (%lld%s%lld%s%lld%s%lld) [ndim %d], specmoe expects (%d, %d, %d, %d)",
              REF_PATH, name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
              t->ndim > 1 ? (long long)t->shape[1] : 0LL, t->ndim > 2 ? ", " : "",
              t->ndim > 2 ? (long long)t->shape[2] : 0LL, t->ndim > 3 ? ", " : "",
              t->ndim > 3 ? (long long)t->shape[3] : 0LL, t->ndim, d0, d1, d2, d3);
    return ref_tensor_to_real(t, REF_PATH);
}

static int json_int(const cJSON *o, const char *key, const char *what) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsNumber(v), "%s: %s has no number '%s'", REF_PATH, what, key);
    return v->valueint;
}

/* ------------------------------------------------------------------------------------- comparing */

static ref_stats g_stats; /* worst max|diff| / tol per case and over the run */


/* ---------------------------------------------------------------------------------------- cases */

typedef struct {
    const char *name;
    int B, C, H, W, OH, OW;
    size_t nin, nout;
    sm_real *x, *G, *out, *dx; /* (B,C,H,W), (B,*,OH,OW), (B,*,OH,OW), (B,C,H,W) */
    int bad, n;                /* mismatched / compared tensors */
} ref_case;

static void case_io(ref_case *k, const sm_safetensors *st, int OC) {
    k->nin = (size_t)k->B * k->C * k->H * k->W;
    k->nout = (size_t)k->B * OC * k->OH * k->OW;
    k->x = ref_get(st, k->name, "x", k->B, k->C, k->H, k->W);
    k->G = ref_get(st, k->name, "G", k->B, OC, k->OH, k->OW);
    k->out = calloc(k->nout, sizeof(sm_real));
    k->dx = calloc(k->nin, sizeof(sm_real));
    cr_assert(k->out && k->dx);
}

/* compares our buffer with "<case>.<what>" of the given shape */
static void case_cmp(ref_case *k, const sm_safetensors *st, const char *what, const sm_real *got, int d0, int d1,
                     int d2, int d3) {
    sm_real *ref = ref_get(st, k->name, what, d0, d1, d2, d3);
    size_t n = d1 < 0 ? (size_t)d0 : (size_t)d0 * d1 * d2 * d3;
    char name[64];
    snprintf(name, sizeof name, "%s.%s", k->name, what);
    k->bad += !ref_compare(&g_stats, name, got, ref, n, RTOL, SHOW);
    k->n++;
    free(ref);
}

static void run_conv(ref_case *k, const sm_safetensors *st, const cJSON *j, const char *key) {
    const int OC = json_int(j, "OC", key), KH = json_int(j, "KH", key), KW = json_int(j, "KW", key);
    const int stride = json_int(j, "stride", key), pad = json_int(j, "pad", key), bias = json_int(j, "bias", key);
    sm_error err = {0};
    cr_assert_eq(sm_conv2d_shape(k->H, k->W, KH, KW, stride, pad, &k->OH, &k->OW, &err), SM_OK, "%s: %s", key,
                 err.msg);
    case_io(k, st, OC);
    sm_real *w = ref_get(st, k->name, "weight", OC, k->C, KH, KW);
    sm_real *b = bias ? ref_get(st, k->name, "bias", OC, -1, 0, 0) : NULL;
    size_t nw = (size_t)OC * k->C * KH * KW, ncol = sm_conv2d_col_size(k->C, k->H, k->W, KH, KW, stride, pad);
    size_t nout = (size_t)k->B * OC * k->OH * k->OW;
    sm_real *col = malloc(sizeof(sm_real) * k->B * ncol), *dcol = malloc(sizeof(sm_real) * ncol);
    sm_real *tmp = malloc(sizeof(sm_real) * nout);
    sm_real *dw = calloc(nw, sizeof(sm_real)), *db = calloc((size_t)OC, sizeof(sm_real));
    cr_assert(col && dcol && tmp && dw && db);

    sm_conv2d_forward(k->out, col, tmp, k->x, w, b, k->B, k->C, k->H, k->W, OC, KH, KW, stride, pad);
    sm_conv2d_backward(k->dx, dw, bias ? db : NULL, dcol, tmp, k->G, col, w, k->B, k->C, k->H, k->W, OC, KH, KW,
                       stride, pad);
    case_cmp(k, st, "out", k->out, k->B, OC, k->OH, k->OW);
    case_cmp(k, st, "dx", k->dx, k->B, k->C, k->H, k->W);
    case_cmp(k, st, "dweight", dw, OC, k->C, KH, KW);
    if (bias) case_cmp(k, st, "dbias", db, OC, -1, 0, 0);
    free(w);
    free(b);
    free(col);
    free(dcol);
    free(tmp);
    free(dw);
    free(db);
}

static void run_pool(ref_case *k, const sm_safetensors *st, const cJSON *j, const char *key, const char *op) {
    const int is_max = strcmp(op, "max_pool2d") == 0, is_adaptive = strcmp(op, "adaptive_avg_pool2d") == 0;
    int K = 0, S = 0;
    if (is_adaptive) {
        k->OH = json_int(j, "OH", key);
        k->OW = json_int(j, "OW", key);
    } else {
        K = json_int(j, "K", key);
        S = json_int(j, "S", key);
        sm_error err = {0};
        cr_assert_eq(sm_conv2d_shape(k->H, k->W, K, K, S, 0, &k->OH, &k->OW, &err), SM_OK, "%s: %s", key, err.msg);
    }
    case_io(k, st, k->C);
    if (is_max) {
        int *idx = malloc(sizeof(int) * k->nout);
        cr_assert(idx);
        sm_maxpool2d_forward(k->out, idx, k->x, k->B, k->C, k->H, k->W, K, S);
        sm_maxpool2d_backward(k->dx, k->G, idx, k->B, k->C, k->H, k->W, K, S);
        /* argmax indices are integers: exact */
        sm_real *ref = ref_get(st, k->name, "idx", k->B, k->C, k->OH, k->OW);
        int wrong = 0;
        for (size_t i = 0; i < k->nout; i++)
            if (idx[i] != (int)ref[i]) {
                if (wrong++ < SHOW)
                    fprintf(stderr, "MISMATCH %s.idx[%zu]: specmoe %d  torch %d\n", k->name, i, idx[i], (int)ref[i]);
            }
        k->bad += wrong > 0;
        k->n++;
        free(ref);
        free(idx);
    } else if (is_adaptive) {
        sm_adaptive_avgpool2d_forward(k->out, k->x, k->B, k->C, k->H, k->W, k->OH, k->OW);
        sm_adaptive_avgpool2d_backward(k->dx, k->G, k->B, k->C, k->H, k->W, k->OH, k->OW);
    } else {
        sm_avgpool2d_forward(k->out, k->x, k->B, k->C, k->H, k->W, K, S);
        sm_avgpool2d_backward(k->dx, k->G, k->B, k->C, k->H, k->W, K, S);
    }
    case_cmp(k, st, "out", k->out, k->B, k->C, k->OH, k->OW);
    case_cmp(k, st, "dx", k->dx, k->B, k->C, k->H, k->W);
}

static void check_case(const char *name, const char *expect_op) {
    sm_safetensors st;
    ref_open(&st);
    char key[64];
    snprintf(key, sizeof key, "%s.config", name);
    const char *s = sm_safetensors_meta(&st, key);
    cr_assert(s, "%s: metadata '%s' missing", REF_PATH, key);
    cJSON *j = cJSON_Parse(s);
    cr_assert(j && cJSON_IsObject(j), "%s: metadata '%s' is not a JSON object", REF_PATH, key);
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(j, "op");
    cr_assert(cJSON_IsString(op) && strcmp(op->valuestring, expect_op) == 0, "%s: '%s' is not a %s case", REF_PATH,
              key, expect_op);

    ref_case k;
    memset(&k, 0, sizeof k);
    k.name = name;
    k.B = json_int(j, "B", key);
    k.C = json_int(j, "C", key);
    k.H = json_int(j, "H", key);
    k.W = json_int(j, "W", key);
    g_stats.worst = 0;
    if (strcmp(expect_op, "conv2d") == 0)
        run_conv(&k, &st, j, key);
    else
        run_pool(&k, &st, j, key, expect_op);
    printf("reference %-9s %-19s (%d,%d,%d,%d) -> (%d,%d): %d tensors, %d mismatched, worst max|diff|/tol %.3g\n",
           name, expect_op, k.B, k.C, k.H, k.W, k.OH, k.OW, k.n, k.bad, g_stats.worst);
    fflush(stdout);
    cJSON_Delete(j);
    free(k.x);
    free(k.G);
    free(k.out);
    free(k.dx);
    sm_safetensors_free(&st);
    cr_expect_eq(k.bad, 0, "%s: %d of %d reference tensors mismatched (see MISMATCH lines)", name, k.bad, k.n);
}

/* ---------------------------------------------------------------------------------------- tests */

Test(conv_reference, file_header) {
    sm_safetensors st;
    ref_open(&st);
    const char *cases = sm_safetensors_meta(&st, "cases");
    cr_assert(cases && strcmp(cases, "conv0,conv1,conv2,maxpool0,maxpool1,avgpool0,avgpool1,adaptive0,adaptive1,"
                                     "adaptive2") == 0,
              "%s: unexpected case list '%s'", REF_PATH, cases ? cases : "(none)");
    /* conv1 has no bias: the file must not carry one the test would silently ignore */
    cr_expect(!sm_safetensors_find(&st, "conv1.bias") && !sm_safetensors_find(&st, "conv1.dbias"));
    sm_safetensors_free(&st);
}

/* Criterion runs the tests of one suite in one process, so the cases run in a single test and the
 * worst match over the whole file is printed at the end. */
Test(conv_reference, all_cases) {
    static const char *cases[][2] = {
        {"conv0", "conv2d"},            /* 3x3, stride 2, padding 1, bias */
        {"conv1", "conv2d"},            /* 2x4 kernel, stride 1, no padding, no bias */
        {"conv2", "conv2d"},            /* 5x5, stride 2, padding 2, 4 -> 8 channels */
        {"maxpool0", "max_pool2d"},     /* 3x3 / 2, overlapping */
        {"maxpool1", "max_pool2d"},     /* 2x2 / 2, last column unseen */
        {"avgpool0", "avg_pool2d"},     /* 3x3 / 2 */
        {"avgpool1", "avg_pool2d"},     /* 2x2 / 2 */
        {"adaptive0", "adaptive_avg_pool2d"}, /* 7x5 -> 3x2 */
        {"adaptive1", "adaptive_avg_pool2d"}, /* 6x6 -> 1x1 */
        {"adaptive2", "adaptive_avg_pool2d"}, /* 3x4 -> 5x6 */
    };
    g_stats.worst_all = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i][0], cases[i][1]);
    printf("reference conv: worst max|diff|/tol over all tensors %.3g (%s, max|diff| %.3g; tol = %g (1 + max|ref|))\n",
           g_stats.worst_all, g_stats.worst_name, g_stats.worst_diff, RTOL);
}
