/* Calibration inputs for the Hugging Face commands (see include/specmoe/io/hf.h): the (T, d) inputs
 * of one MoE block from a safetensors file. Outside data: checked for name, shape, dtype and values
 * before use, and fuzzed (fuzz/fuzz_calib.c). Kept apart from src/io/hf.c so the fuzz build needs
 * only the safetensors reader. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "hf_internal.h"
#include "specmoe/io/hf.h"

sm_status sm_hf_calib_from_safetensors(const sm_safetensors *f, const char *what, const char *block, int d, float **x,
                                       int *T, sm_error *err) {
    *x = NULL;
    *T = 0;
    if (!f || !block) return sm_fail(err, SM_ERR_ARG, "sm_hf_calib_from_safetensors: NULL argument");
    if (!what) what = f->path ? f->path : "<calibration>";
    sm_status rc;
    const sm_st_tensor *t = sm_safetensors_find(f, block);
    if (!t) t = sm_safetensors_find(f, "hidden_states");
    char nb[112];
    if (!t) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: no tensor named '%s' or 'hidden_states' (the MoE block's input, (T, %d))",
                     what, block, d);
    } else if (t->ndim != 2 || t->shape[1] != d || t->shape[0] < 1 || t->shape[0] > (1 << 24)) {
        char s[96];
        sm_hf_shape_str(s, sizeof s, t->ndim, t->shape);
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' has shape %s; calibration inputs must be (T, %d), 1 <= T <= 2^24",
                     what, sm_hf_shown(nb, t->name), s, d);
    } else if (t->dtype != SM_DT_F32 && t->dtype != SM_DT_F16 && t->dtype != SM_DT_BF16) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' is %s; calibration inputs must be F32, F16 or BF16", what,
                     sm_hf_shown(nb, t->name), sm_dtype_name(t->dtype));
    } else if (!(*x = malloc(sizeof(float) * t->numel))) {
        rc = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for %zu values", what, t->numel);
    } else {
        rc = sm_st_read_f32(f, t, 0, t->numel, *x, err);
        for (size_t i = 0; rc == SM_OK && i < t->numel; i++) {
            const float v = (*x)[i];
            if (isfinite(v) && fabsf(v) <= SM_HF_CALIB_MAX) continue;
            char val[32];
            snprintf(val, sizeof val, isfinite(v) ? "%g" : "a non-finite value (%g)", (double)v);
            rc = sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' holds %s at row %zu, column %zu; calibration inputs must be "
                         "finite and within +-%g (router logits computed from larger ones overflow)", what,
                         sm_hf_shown(nb, t->name), val, i / (size_t)d, i % (size_t)d, SM_HF_CALIB_MAX);
        }
        if (rc == SM_OK) *T = (int)t->shape[0];
    }
    if (rc != SM_OK) {
        free(*x);
        *x = NULL;
    }
    return rc;
}

sm_status sm_hf_read_calib(const char *path, const char *block, int d, float **x, int *T, sm_error *err) {
    *x = NULL;
    *T = 0;
    sm_safetensors f;
    sm_status rc = sm_safetensors_open(&f, path, err);
    if (rc != SM_OK) return rc;
    rc = sm_hf_calib_from_safetensors(&f, path, block, d, x, T, err);
    sm_safetensors_free(&f);
    return rc;
}
