/* The smallest program against the installed library: build an MoE classifier, train it for a few
 * steps on synthetic clusters, print the accuracy. Compile with
 *   cc hello_moe.c $(pkg-config --cflags --libs specmoe) -o hello_moe */
#include <specmoe.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    enum { N = 256, D = 8, K = 3 };
    sm_error err;
    sm_rng rng;
    sm_rng_seed(&rng, 1);
    sm_dataset ds = {.n = N, .dim = D, .n_classes = K};
    ds.x = malloc(sizeof(float) * N * D);
    ds.y = malloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) {
        ds.y[i] = i % K;
        for (int j = 0; j < D; j++) ds.x[i * D + j] = (float)(sm_rng_normal(&rng) + 3.0 * (j % K == ds.y[i]));
    }
    sm_model_config cfg;
    sm_model_config_default(&cfg);
    sm_model_parse_arch(&cfg, "dense:16,moe:16", &err);
    cfg.in_dim = D;
    cfg.n_classes = K;
    cfg.moe.router.E = 4;
    cfg.moe.router.k = 2;
    sm_model *m = sm_model_create(&cfg, 32, &rng, &err);
    if (!m) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    sm_train_config tc;
    sm_train_config_default(&tc);
    tc.epochs = 5;
    tc.batch = 32;
    tc.warmup = 0;
    tc.opt.lr = 1e-2;
    sm_train_result res;
    sm_eval_result ev;
    if (sm_train(m, &ds, NULL, &tc, NULL, NULL, &res, &err) != SM_OK || sm_evaluate(m, &ds, 32, &ev, &err) != SM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("hello_moe: %ld steps, accuracy %.3f\n", res.steps, ev.acc);
    sm_model_free(m);
    free(ds.x);
    free(ds.y);
    return ev.acc > 0.9 ? 0 : 1;
}
