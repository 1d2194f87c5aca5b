/* Writes a small Hugging Face MoE model directory (tests/hf_fixture.h) for the CLI tests and for
 * trying `specmoe ssmoe build/prune --hf` by hand:
 *   hf_gen DIR TYPE STORAGE D I E K LAYERS SHARDS BF16 [CALIB_FILE T]
 * e.g. hf_gen /tmp/mix mixtral split 64 128 8 2 4 2 1 /tmp/mix-calib.safetensors 256 */
#include <sys/stat.h>

#include "hf_fixture.h"

int main(int argc, char **argv) {
    if (argc != 11 && argc != 13) {
        fprintf(stderr, "usage: hf_gen DIR TYPE STORAGE D I E K LAYERS SHARDS BF16 [CALIB_FILE T]\n");
        return 2;
    }
    hf_spec s = {argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), atoi(argv[8]),
                 atoi(argv[9]), atoi(argv[10]), 1, NULL};
    if (s.d < 1 || s.I < 1 || s.E < 1 || s.k < 1 || s.k > s.E || s.layers < 1 || s.shards < 1 || s.shards > s.layers) {
        fprintf(stderr, "hf_gen: bad sizes\n");
        return 2;
    }
    mkdir(argv[1], 0755);
    if (hf_fixture_write(argv[1], &s) != 0) {
        fprintf(stderr, "hf_gen: cannot write %s\n", argv[1]);
        return 1;
    }
    if (argc == 13 && hf_fixture_write_calib(argv[11], &s, atoi(argv[12]), 0) != 0) {
        fprintf(stderr, "hf_gen: cannot write %s\n", argv[11]);
        return 1;
    }
    return 0;
}
