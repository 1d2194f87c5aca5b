/* Helper of tests/mpi_tests.sh.
 *   mpi_check diff A.safetensors B.safetensors TOL
 *       the largest |a - b| over the model tensors both files hold (optimiser moments optim.* are
 *       skipped); prints it with the tensor and the largest |a|, exits 0 when it is <= TOL, 1 if not.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe.h"

static int cmd_diff(const char *pa, const char *pb, double tol) {
    sm_safetensors a, b;
    sm_error err;
    if (sm_safetensors_load(&a, pa, &err) != SM_OK || sm_safetensors_load(&b, pb, &err) != SM_OK) {
        fprintf(stderr, "mpi_check: %s\n", err.msg);
        return 2;
    }
    double worst = 0, amax = 0;
    const char *where = "(none)";
    int compared = 0;
    for (int i = 0; i < a.n_tensors; i++) {
        const sm_st_tensor *ta = &a.tensors[i], *tb = sm_safetensors_find(&b, ta->name);
        if (!strncmp(ta->name, "optim.", 6) || ta->dtype != SM_DT_F32) continue;
        if (!tb || tb->numel != ta->numel) {
            fprintf(stderr, "mpi_check: %s: tensor %s missing or of another size in %s\n", pa, ta->name, pb);
            return 1;
        }
        float *x = malloc(sizeof(float) * ta->numel), *y = malloc(sizeof(float) * ta->numel);
        if (!x || !y || sm_st_tensor_to_f32(ta, x, ta->numel, &err) != SM_OK ||
            sm_st_tensor_to_f32(tb, y, tb->numel, &err) != SM_OK) {
            fprintf(stderr, "mpi_check: cannot read %s\n", ta->name);
            return 2;
        }
        for (size_t j = 0; j < ta->numel; j++) {
            double d = fabs((double)x[j] - y[j]);
            if (!(d <= worst)) worst = d, where = ta->name;
            if (fabs(x[j]) > amax) amax = fabs(x[j]);
        }
        free(x);
        free(y);
        compared++;
    }
    printf("max |a-b| = %.3g (tensor %s) over %d tensors, max |a| = %.3g, tolerance %.3g\n", worst, where, compared, amax,
           tol);
    sm_safetensors_free(&a);
    sm_safetensors_free(&b);
    return compared > 0 && worst <= tol ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "diff")) return cmd_diff(argv[2], argv[3], atof(argv[4]));
    fprintf(stderr, "usage: mpi_check diff A B TOL\n");
    return 2;
}
