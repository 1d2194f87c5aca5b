/* libFuzzer target: sm_safetensors_parse on arbitrary bytes must refuse or accept cleanly, never crash,
 * leak or read outside the buffer. An accepted file is also decoded, so every tensor's data pointer
 * and byte range is exercised under ASan.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/safetensors/)
 */
#include <stdint.h>
#include <stdlib.h>

#include "specmoe/io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sm_safetensors st;
    sm_error err;
    if (sm_safetensors_parse(&st, data, size, "<fuzz>", &err) != SM_OK) return 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const sm_st_tensor *t = &st.tensors[i];
        if (t->dtype != SM_DT_F32 && t->dtype != SM_DT_F16 && t->dtype != SM_DT_BF16) continue;
        float *out = malloc((t->numel ? t->numel : 1) * sizeof *out);
        if (out) (void)sm_st_tensor_to_f32(t, out, t->numel, &err);
        free(out);
    }
    (void)sm_safetensors_meta(&st, "format");
    if (st.n_tensors > 0) (void)sm_safetensors_find(&st, st.tensors[st.n_tensors - 1].name);
    sm_safetensors_free(&st);
    return 0;
}
