/* libFuzzer target for the metrics.jsonl reader (src/io/runlog.c) that `specmoe plot` uses on the
 * run directories a user names: any bytes, read for RL and supervised keys.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/runlog/)
 */
#include <stdint.h>
#include <stdlib.h>

#include "specmoe/io/runlog.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sm_series s = {0};
    sm_error err;
    if (sm_runlog_parse(&s, (const char *)data, size, "<fuzz>", "global_step", "episodic_return", NULL, &err) == SM_OK &&
        s.n) {
        volatile double t = s.x[s.n - 1] + s.y[0];
        (void)t;
    }
    sm_series_free(&s);
    (void)sm_runlog_parse(&s, (const char *)data, size, "<fuzz>", "step", "loss", "train", &err);
    sm_series_free(&s);
    return 0;
}
