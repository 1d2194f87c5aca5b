/* libFuzzer target for the outside-data parsers of data.c: sm_idx_parse on the raw bytes, and
 * sm_parse_class_list (the --classes argument) on the same bytes as a string.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/idx/)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/io/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sm_idx x;
    sm_error err;
    if (sm_idx_parse(&x, data, size, "<fuzz>", &err) == SM_OK) {
        /* touch both ends of the copy so ASan checks the allocation matches count */
        volatile uint8_t s = (uint8_t)(x.data[0] + x.data[x.count - 1]);
        (void)s;
        sm_idx_free(&x);
    }
    if (size < 4096) {
        char *str = malloc(size + 1);
        if (!str) return 0;
        memcpy(str, data, size);
        str[size] = '\0';
        int classes[16];
        (void)sm_parse_class_list(str, classes, 16, 10, &err);
        free(str);
    }
    return 0;
}
