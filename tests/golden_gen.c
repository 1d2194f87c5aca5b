/* Writes tests/data/golden_v0.safetensors: for every case of tests/golden_cases.h, the input, labels,
 * parameters, logits (train and eval forward), loss and every parameter gradient of one step, with
 * the model JSON in the metadata. Run once, at commit 007f635 (before the module refactor), with one
 * thread:  build/tests/golden_gen tests/data/golden_v0.safetensors
 * tests/test_golden.c is the reader. Rerunning it on later code rewrites the file from that code, so
 * only do that on purpose (a deliberate change of numerics), and say so in the commit. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_cases.h"

static char *names[4096];
static int n_names;
static const char *keep(const char *fmt, const char *a, const char *b) {
    char buf[256];
    snprintf(buf, sizeof buf, fmt, a, b);
    return names[n_names++] = strdup(buf);
}

static void die(const char *what, const sm_error *err) {
    fprintf(stderr, "golden_gen: %s: %s\n", what, err->msg);
    exit(1);
}

/* sm_real buffers copied to float (the library may be built in double) */
static float *to_f32(const sm_real *x, size_t n) {
    float *f = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: golden_gen OUT.safetensors\n");
        return 2;
    }
    omp_set_num_threads(1);
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err;
    char cases[2048] = "";
    for (size_t ci = 0; ci < N_GOLDEN; ci++) {
        const golden_case *c = &kGoldenCases[ci];
        sm_model_config cfg;
        if (golden_config(c, &cfg, &err)) die(c->name, &err);
        sm_rng init;
        sm_rng_seed(&init, GOLDEN_SEED + ci);
        sm_model *m = sm_model_create(&cfg, GOLDEN_T, &init, &err);
        if (!m) die(c->name, &err);
        if (!strcmp(c->router, "ev") && sm_model_build_ev(m, &err) != SM_OK) die(c->name, &err);
        const int T = GOLDEN_T, D = cfg.in_dim, V = cfg.n_classes;
        float *x = malloc(sizeof(float) * (size_t)T * D), *yf = malloc(sizeof(float) * T);
        int y[GOLDEN_T];
        for (int i = 0; i < T * D; i++) x[i] = (float)sm_rng_normal(&init);
        for (int t = 0; t < T; t++) y[t] = (int)sm_rng_below(&init, (uint32_t)V), yf[t] = (float)y[t];
        sm_rng fr;
        sm_rng_seed(&fr, GOLDEN_SEED * 3 + ci);
        sm_params_zero_grad(&m->params);
        float *logits = to_f32(sm_model_forward(m, x, T, &fr, 1), (size_t)T * V);
        double loss = sm_model_loss(m, y, NULL, T);
        sm_model_backward(m, T);
        float *eval = to_f32(sm_model_forward(m, x, T, NULL, 0), (size_t)T * V);
        int64_t sx[2] = {T, D}, sy[1] = {T}, sl[2] = {T, V};
        sm_st_writer_add(&w, keep("%s.%s", c->name, "x"), 2, sx, x, &err);
        sm_st_writer_add(&w, keep("%s.%s", c->name, "y"), 1, sy, yf, &err);
        sm_st_writer_add(&w, keep("%s.%s", c->name, "logits"), 2, sl, logits, &err);
        sm_st_writer_add(&w, keep("%s.%s", c->name, "logits_eval"), 2, sl, eval, &err);
        for (int i = 0; i < m->params.n; i++) {
            const sm_param *p = &m->params.p[i];
            sm_st_writer_add(&w, keep("%s.p.%s", c->name, p->name), p->ndim, p->shape,
                             to_f32(sm_params_data(&m->params, i), p->numel), &err);
            sm_st_writer_add(&w, keep("%s.g.%s", c->name, p->name), p->ndim, p->shape,
                             to_f32(sm_params_grad(&m->params, i), p->numel), &err);
        }
        char *json = sm_model_config_to_json(&cfg), lbuf[64];
        snprintf(lbuf, sizeof lbuf, "%.17g", loss);
        if (sm_st_writer_meta(&w, keep("%s.%s", c->name, "model"), json, &err) != SM_OK ||
            sm_st_writer_meta(&w, keep("%s.%s", c->name, "loss"), lbuf, &err) != SM_OK)
            die(c->name, &err);
        free(json);
        strcat(cases, ci ? "," : "");
        strcat(cases, c->name);
        printf("%-14s loss %.9g  params %d\n", c->name, loss, m->params.n);
        sm_model_free(m);
    }
    if (sm_st_writer_meta(&w, "magic", "specmoe-golden", &err) != SM_OK ||
        sm_st_writer_meta(&w, "version", "1", &err) != SM_OK || sm_st_writer_meta(&w, "cases", cases, &err) != SM_OK ||
        sm_st_writer_meta(&w, "commit", "007f635", &err) != SM_OK)
        die("meta", &err);
    if (sm_st_writer_write(&w, argv[1], &err) != SM_OK) die(argv[1], &err);
    return 0;
}
