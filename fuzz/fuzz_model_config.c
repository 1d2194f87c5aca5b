/* libFuzzer target for the model description a checkpoint stores (__metadata__.model): arbitrary bytes
 * as JSON text into sm_model_config_from_json. An accepted description must survive the round trip a
 * checkpoint puts it through: written by sm_model_config_to_json, read back, written again - the same
 * text. The seeds known_*.json are two bugs it found (an unchecked 64-bit seed, non-finite
 * numbers), fixed in the JSON readers.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/model_config/, dictionary fuzz/model_config.dict)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/nn/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *json = malloc(size + 1);
    if (!json) return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    sm_model_config c, back;
    sm_error err;
    if (sm_model_config_from_json(&c, json, &err) == SM_OK) {
        char *a = sm_model_config_to_json(&c);
        if (!a || sm_model_config_from_json(&back, a, &err) != SM_OK) abort(); /* what we write, we must read */
        char *b = sm_model_config_to_json(&back);
        if (!b || strcmp(a, b) != 0) abort();
        free(a);
        free(b);
    }
    free(json);
    return 0;
}
