/* specmoe info CHECKPOINT: the model configuration, training state and tensor table of a
 * safetensors file. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "flags.h"

int cmd_info(int argc, char **argv) {
    int dummy;
    fl_flag fl[] = {{"verbose", FL_BOOL, &dummy, "0", "also print every metadata entry", 0}};
    int npos;
    const char *pos[1];
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 2, "info", "CHECKPOINT", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos != 1) {
        fprintf(stderr, "specmoe info: expected one checkpoint path (see specmoe info --help)\n");
        return CLI_EXIT_USAGE;
    }
    sm_error err;
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, pos[0], &err);
    if (s != SM_OK) return cli_fail(s, &err);
    printf("file: %s (%zu bytes, header %zu bytes, %d tensors)\n", pos[0], st.size, st.header_len, st.n_tensors);
    const char *model = sm_safetensors_meta(&st, "model");
    if (model) {
        sm_model_config mc;
        if (sm_model_config_from_json(&mc, model, &err) == SM_OK) {
            char arch[512];
            sm_model_format_arch(&mc, arch, sizeof arch);
            const sm_router_config *r = &mc.moe.router;
            printf("model: in %d -> %s -> %d classes, act %s, residual %d\n", mc.in_dim, arch, mc.n_classes,
                   sm_act_name(mc.act), mc.residual);
            printf("moe: router %s, %d experts, top-%d, temperature %g, noisy %d, renorm %d, capacity %g, shared %d, "
                   "expert act %s, expert bias %d\n",
                   r->name, r->E, r->k, r->temperature, r->noisy, r->renorm, r->capacity, mc.moe.n_shared,
                   sm_act_name(mc.moe.act), mc.moe.expert_bias);
        } else {
            printf("model: (unreadable: %s)\n", err.msg);
        }
    } else {
        printf("model: none (not a specmoe checkpoint)\n");
    }
    const char *train = sm_safetensors_meta(&st, "train");
    if (train) printf("training state: %s\n", train);
    if (dummy)
        for (int i = 0; i < st.n_meta; i++) printf("metadata %s = %s\n", st.meta[i].key, st.meta[i].value);
    printf("%-48s %-5s %-20s %12s\n", "tensor", "dtype", "shape", "values");
    size_t total = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const sm_st_tensor *t = &st.tensors[i];
        char shape[64] = "[";
        for (int d = 0; d < t->ndim; d++) {
            char b[24];
            snprintf(b, sizeof b, "%s%lld", d ? "," : "", (long long)t->shape[d]);
            strncat(shape, b, sizeof shape - strlen(shape) - 2);
        }
        strcat(shape, "]");
        printf("%-48s %-5s %-20s %12zu\n", t->name, sm_dtype_name(t->dtype), shape, t->numel);
        if (strncmp(t->name, "optim.", 6) != 0) total += t->numel;
    }
    printf("model parameters: %zu\n", total);
    sm_safetensors_free(&st);
    return 0;
}
