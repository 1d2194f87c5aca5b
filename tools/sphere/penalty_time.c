/* CPU time of SPHERE's penalty (Eq. 26) with its gradient, the dense path against the routed one
 * (src/methods/sphere/features.c), on the paper's actor size: one minibatch of T = 64 states, the
 * last hidden expert layer of 10 experts of width 256, top-2 (issue 15, Table 24's overhead).
 *
 *   cc -O3 -march=x86-64-v2 -mtune=native -fopenmp -Iinclude -I. tools/sphere/penalty_time.c build/libspecmoe.a \
 *      -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -llapacke -lcjson -lmujoco -lz -lm $(mpicc --showme:link) -o build/penalty_time
 *   OMP_NUM_THREADS=1 build/penalty_time [REPS]
 *
 * dense: sm_sphere_features_at + sm_sphere_penalty (64 x 64 Gram of the 64 x 2560 features) +
 * sm_sphere_features_at_backward; routed: sm_sphere_penalty_routed + its backward. Both on the same
 * forward; the two L must agree. Prints the median over REPS (default 500) of each. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/methods/sphere/sphere.h"
#include "specmoe/nn/model.h"
#include "tools/sphere/cpu_time.h"


int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 500;
    if (reps < 1) {
        fprintf(stderr, "penalty_time: REPS must be a positive integer\n");
        return 2;
    }
    omp_set_num_threads(1);
    enum { T = 64 };
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_error err = {0};
    if (sm_model_parse_arch(&cfg, "moe:256", &err) != SM_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    cfg.in_dim = 17, cfg.n_classes = 6, cfg.moe.router.E = 10, cfg.moe.router.k = 2;
    sm_rng r;
    sm_rng_seed(&r, 1);
    sm_model *m = sm_model_create(&cfg, T, &r, &err);
    if (!m) return fprintf(stderr, "%s\n", err.msg), 1;
    float x[T * 17];
    for (int i = 0; i < T * 17; i++) x[i] = (float)sm_rng_normal(&r);
    sm_model_forward(m, x, T, NULL, 1);
    sm_moe *moe = sm_model_moe(m, 0);
    const int D = moe->E * moe->H, j = moe->L - 1;
    sm_real *phi = calloc((size_t)T * D, sizeof(sm_real)), *dphi = calloc((size_t)T * D, sizeof(sm_real));
    sm_real *work = calloc(sm_sphere_work_values(T, D), sizeof(sm_real));
    sm_real *rwork = calloc(sm_sphere_routed_work_values(T, moe->H), sizeof(sm_real));
    double *td = malloc(sizeof(double) * reps), *tr = malloc(sizeof(double) * reps), Ld = 0, Lr = 0;
    if (!phi || !dphi || !work || !rwork || !td || !tr) return fprintf(stderr, "penalty_time: out of memory\n"), 1;
    for (int it = 0; it < reps; it++) { /* alternated, so drift in the machine's speed hits both */
        double t0 = cpu_now();
        (void)sm_sphere_features_at(moe, j, 1, phi, NULL);
        memset(dphi, 0, sizeof(sm_real) * (size_t)T * D);
        Ld = sm_sphere_penalty(phi, T, D, dphi, 1, work);
        sm_sphere_features_at_backward(moe, j, 1, dphi);
        td[it] = cpu_now() - t0;
        t0 = cpu_now();
        Lr = sm_sphere_penalty_routed(moe, j, 1, 0, rwork);
        sm_sphere_penalty_routed_backward(moe, j, 1, 0, 1, rwork);
        tr[it] = cpu_now() - t0;
    }
    const double md = median(td, reps), mr = median(tr, reps);
    printf("sphere-penalty T=%d E=%d H=%d k=%d dense_us=%.1f routed_us=%.1f speedup=%.2f L_dense=%.6g L_routed=%.6g\n", T,
           moe->E, moe->H, cfg.moe.router.k, 1e6 * md, 1e6 * mr, md / mr, Ld, Lr);
    free(phi), free(dphi), free(work), free(rwork), free(td), free(tr);
    sm_model_free(m);
    return 0;
}
