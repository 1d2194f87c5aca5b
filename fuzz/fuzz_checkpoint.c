/* libFuzzer target for checkpoint metadata, through the public API only: the input is written to a
 * file and read as a checkpoint. sm_checkpoint_read_config parses the safetensors header and
 * __metadata__.model; when that describes a small model, the model is created and sm_checkpoint_load
 * runs with an optimiser and a training state, which reaches the parser of __metadata__.train (static
 * in src/io/checkpoint.c) once every tensor matches - the seeds are small training checkpoints, so
 * mutations of their metadata get there.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/checkpoint/, dictionary fuzz/checkpoint.dict)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specmoe/core/optim.h"
#include "specmoe/io/checkpoint.h"
#include "specmoe/io/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

static void remove_file(void) { unlink(path); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(path, sizeof path, "/tmp/specmoe-fuzz-ckpt-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) abort();
    close(fd);
    atexit(remove_file);
    return 0;
}

/* Every size a description can name stays small, so a mutated one cannot ask for gigabytes. */
static int small(const sm_model_config *c) {
    const sm_router_config *r = &c->moe.router;
    if (c->in_dim < 1 || c->in_dim > 256 || c->n_classes < 1 || c->n_classes > 64 || c->n_layers > SM_MAX_LAYERS) return 0;
    for (int i = 0; i < c->n_layers; i++) {
        const sm_layer_spec *l = &c->layers[i];
        if (l->width > 64 || l->k > 8 || l->s > 8 || l->p > 8) return 0;
    }
    return r->E <= 16 && r->k <= 16 && r->kr <= 16 && r->amort_hidden <= 64 && r->slots <= 8 && r->soft_group <= 64 &&
           r->pairs <= 64 && r->ev_c <= 16 && c->moe.n_shared <= 4;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f) != 0) abort();
    sm_model_config cfg;
    sm_error err;
    if (sm_checkpoint_read_config(path, &cfg, &err) != SM_OK || !small(&cfg)) return 0;
    sm_model *m = sm_model_create(&cfg, 1, NULL, &err);
    if (!m) return 0;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    sm_optim opt;
    if (sm_optim_init(&opt, &oc, &m->params, &err) == SM_OK) {
        sm_train_state ts;
        if (sm_checkpoint_load(path, m, &opt, &ts, &err) == SM_OK && (ts.step < 0 || ts.epoch < 0 || ts.pos < 0 || opt.step < 0))
            abort(); /* the parser's promises */
        sm_optim_free(&opt);
    }
    (void)sm_checkpoint_load(path, m, NULL, NULL, &err); /* an inference load */
    sm_model_free(m);
    return 0;
}
