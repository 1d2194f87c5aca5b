/* libFuzzer target for the calibration reader of `ssmoe build/prune --hf --calib` (src/io/hf_calib.c):
 * arbitrary bytes are parsed as a safetensors file in memory and read as the (T, d) inputs of an MoE
 * block, once under the block's own name and once with d taken from a tensor in the file (so well-
 * formed inputs reach the dtype and value checks). A refusal must leave nothing allocated; an
 * accepted matrix must be what the reader promises: T >= 1 rows of d finite values within
 * +-SM_HF_CALIB_MAX.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/calib/, dictionary fuzz/calib.dict)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "specmoe/io/hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_one(const sm_safetensors *f, const char *block, int d) {
    float *x = (float *)1;
    int T = -1;
    sm_error err;
    if (sm_hf_calib_from_safetensors(f, "<fuzz>", block, d, &x, &T, &err) != SM_OK) {
        if (x || T) abort(); /* a refusal leaves nothing behind */
        return;
    }
    if (!x || T < 1 || T > (1 << 24)) abort();
    for (size_t i = 0; i < (size_t)T * (size_t)d; i++)
        if (!isfinite(x[i]) || fabsf(x[i]) > SM_HF_CALIB_MAX) abort();
    free(x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sm_safetensors f;
    sm_error err;
    if (sm_safetensors_parse(&f, data, size, "<fuzz>", &err) != SM_OK) return 0;
    read_one(&f, "model.layers.0.mlp", 4);
    for (int i = 0; i < f.n_tensors && i < 4; i++) /* the width each tensor would need, as a caller's d */
        if (f.tensors[i].ndim == 2 && f.tensors[i].shape[1] >= 1 && f.tensors[i].shape[1] <= 4096)
            read_one(&f, f.tensors[i].name, (int)f.tensors[i].shape[1]);
    sm_safetensors_free(&f);
    return 0;
}
