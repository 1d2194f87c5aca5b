/* Shared by the tests that compare against PyTorch reference files (tests/data/ (.safetensors),
 * written by tools/reference/ (Python scripts) with __metadata__ magic "specmoe-reference", version "1"). */
#ifndef SPECMOE_TESTS_REFERENCE_H
#define SPECMOE_TESTS_REFERENCE_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/io/safetensors.h"

/* Opens path and checks its magic and version; script names the generator for the message. */
static inline void ref_open_file(sm_safetensors *st, const char *path, const char *script) {
    sm_error err = {0};
    sm_status s = sm_safetensors_load(st, path, &err);
    cr_assert_eq(s, SM_OK, "%s (run from the repo root; regenerate with /usr/bin/python3 %s)", err.msg, script);
    const char *magic = sm_safetensors_meta(st, "magic"), *version = sm_safetensors_meta(st, "version");
    cr_assert(magic && strcmp(magic, "specmoe-reference") == 0, "%s: bad magic '%s'", path, magic ? magic : "(none)");
    cr_assert(version && strcmp(version, "1") == 0, "%s: unsupported version '%s'", path, version ? version : "(none)");
}

/* Tensor t (F32/F16/BF16) as a malloc'd sm_real[t->numel]; path names the file in messages. */
static inline sm_real *ref_tensor_to_real(const sm_st_tensor *t, const char *path) {
    size_t n = t->numel;
    float *f = malloc(sizeof(float) * (n ? n : 1));
    sm_real *r = malloc(sizeof(sm_real) * (n ? n : 1));
    cr_assert(f && r, "%s: out of memory", path);
    sm_error err = {0};
    cr_assert_eq(sm_st_tensor_to_f32(t, f, n, &err), SM_OK, "%s", err.msg);
    for (size_t i = 0; i < n; i++) r[i] = (sm_real)f[i];
    free(f);
    return r;
}

/* The worst max|diff| / tol seen, per test and over the run, with where it came from. */
typedef struct {
    double worst;          /* since the caller last reset it (one test) */
    double worst_all;      /* over the whole run */
    double worst_diff;     /* max|diff| of that tensor */
    char worst_name[64];
} ref_stats;

/* max|got - ref| <= rtol (1 + max|ref|); on a mismatch prints the first `show` values of both. */
static inline int ref_compare(ref_stats *s, const char *name, const sm_real *got, const sm_real *ref, size_t n,
                              double rtol, size_t show) {
    double maxdiff = 0, maxref = 0;
    size_t at = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!isfinite((double)got[i])) finite = 0;
        if (d > maxdiff) maxdiff = d, at = i;
        if (fabs((double)ref[i]) > maxref) maxref = fabs((double)ref[i]);
    }
    double tol = rtol * (1 + maxref);
    if (maxdiff / tol > s->worst) s->worst = maxdiff / tol;
    if (maxdiff / tol > s->worst_all) {
        s->worst_all = maxdiff / tol;
        s->worst_diff = maxdiff;
        snprintf(s->worst_name, sizeof s->worst_name, "%s", name);
    }
    int ok = finite && maxdiff <= tol;
    if (!ok) {
        fprintf(stderr, "MISMATCH %s: max|diff| %.3e at [%zu] > tol %.3e%s\n", name, maxdiff, at, tol,
                finite ? "" : " (non-finite values)");
        for (size_t i = 0; i < n && i < show; i++)
            fprintf(stderr, "  [%zu] specmoe % .8f  torch % .8f\n", i, (double)got[i], (double)ref[i]);
        fprintf(stderr, "  [%zu] specmoe % .8f  torch % .8f  (worst)\n", at, (double)got[at], (double)ref[at]);
    }
    return ok;
}

#endif
