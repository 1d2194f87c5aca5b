/* specmoe analyze CHECKPOINT: spectral diagnostics of every weight matrix (SR-MoE Sec. 3.3):
 * spectral norm sigma_max, stable rank ||W||_F^2 / sigma_max^2, and the spectral-entropy effective
 * rank exp(H(sigma / sum sigma)) from LAPACKE's SVD. Stacked expert tensors (E, a, b) are analysed
 * per expert; conv kernels (OC, C, k, k) as (OC, C k k) matrices; vectors and bias stacks are skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "flags.h"

static int analyze_matrix(const char *name, const float *w, int m, int n) {
    int k = m < n ? m : n;
    double *sv = malloc(sizeof(double) * (size_t)k);
    sm_real *W = malloc(sizeof(sm_real) * (size_t)m * n);
    if (!sv || !W) {
        free(sv);
        free(W);
        fprintf(stderr, "specmoe: analyze: out of memory\n");
        return CLI_EXIT_RUNTIME;
    }
    for (size_t i = 0; i < (size_t)m * n; i++) W[i] = w[i];
    sm_error err;
    sm_status st = sm_singular_values(W, m, n, sv, &err);
    if (st == SM_OK) {
        double fro = 0;
        for (int i = 0; i < k; i++) fro += sv[i] * sv[i];
        printf("%-44s %5d x %-5d %12.5f %12.4f %12.4f\n", name, m, n, sv[0], sv[0] > 0 ? fro / (sv[0] * sv[0]) : 0,
               sm_effective_rank(sv, k));
    }
    free(sv);
    free(W);
    return st == SM_OK ? 0 : cli_fail(st, &err);
}

int cmd_analyze(int argc, char **argv) {
    int optim;
    fl_flag fl[] = {{"optim", FL_BOOL, &optim, "0", "also analyse optimiser moments (optim.*)", 0}};
    int npos;
    const char *pos[1];
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 2, "analyze", "CHECKPOINT", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos != 1) {
        fprintf(stderr, "specmoe analyze: expected one checkpoint path (see specmoe analyze --help)\n");
        return CLI_EXIT_USAGE;
    }
    sm_error err;
    sm_safetensors st;
    sm_status s = sm_safetensors_load(&st, pos[0], &err);
    if (s != SM_OK) return cli_fail(s, &err);
    printf("%-44s %13s %12s %12s %12s\n", "matrix", "shape", "sigma_max", "stable_rank", "eff_rank");
    int code = 0;
    for (int i = 0; i < st.n_tensors && !code; i++) {
        const sm_st_tensor *t = &st.tensors[i];
        size_t len = strlen(t->name);
        int is_bias = (len >= 2 && (!strcmp(t->name + len - 2, "b1") || !strcmp(t->name + len - 2, "b2"))) ||
                      (len >= 4 && !strcmp(t->name + len - 4, "bias"));
        if (t->ndim < 2 || is_bias || (!optim && !strncmp(t->name, "optim.", 6))) continue;
        float *w = malloc(sizeof(float) * (t->numel ? t->numel : 1));
        if (!w || sm_st_tensor_to_f32(t, w, t->numel, &err) != SM_OK) {
            free(w);
            code = cli_fail(SM_ERR_FORMAT, &err);
            break;
        }
        if (t->ndim == 3) { /* stacked experts (E, a, b): one matrix per expert */
            int E = (int)t->shape[0], a = (int)t->shape[1], b = (int)t->shape[2];
            for (int e = 0; e < E && !code; e++) {
                char name[160];
                snprintf(name, sizeof name, "%s[%d]", t->name, e);
                code = analyze_matrix(name, w + (size_t)e * a * b, a, b);
            }
        } else {
            int m = (int)t->shape[0];
            code = m > 0 ? analyze_matrix(t->name, w, m, (int)(t->numel / (size_t)m)) : 0;
        }
        free(w);
    }
    sm_safetensors_free(&st);
    return code;
}
