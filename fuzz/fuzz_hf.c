/* libFuzzer target for the Hugging Face directory parsers of hf_config.c: the same bytes as
 * config.json (sm_hf_config_parse) and as model.safetensors.index.json (sm_hf_index_parse).
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/hf/, dictionary fuzz/hf.dict)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/io/hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sm_error err;
    sm_hf_config c;
    if (sm_hf_config_parse(&c, (const char *)data, size, "<fuzz>", &err) == SM_OK) {
        /* a parsed config must be internally consistent: the layer flags cover every layer */
        volatile int moe = 0;
        for (int l = 0; l < c.n_layers; l++) moe += c.is_moe[l];
        if (c.k < 1 || c.k > c.E || c.d < 1 || c.inter < 1 || moe > c.n_layers) abort();
        sm_hf_config_free(&c);
    }
    char **names, **files;
    int n;
    if (sm_hf_index_parse((const char *)data, size, "<fuzz>", &names, &files, &n, &err) == SM_OK) {
        for (int i = 0; i < n; i++)
            if (!names[i][0] || strchr(files[i], '/')) abort(); /* the parser's promises */
        sm_hf_index_free(names, files, n);
    }
    return 0;
}
