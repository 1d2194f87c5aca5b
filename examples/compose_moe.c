/* A network composed by hand through the module API: conv -> max-pool -> tokens -> MoE over the
 * tokens -> flatten -> linear head, trained for a few steps with AdamW on synthetic images (a bright
 * quadrant marks the class). Prints the loss as it goes. Compile with
 *   cc compose_moe.c $(pkg-config --cflags --libs specmoe) -o compose_moe
 * Shapes per example: (1,8,8) image -> (1,6,8,8) -> (1,6,4,4) -> 16 tokens of 6 -> 16 tokens of 6 ->
 * (1, 96) -> 4 logits. */
#include <specmoe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 32, S = 8, K = 4, STEPS = 80 };

static void make_batch(float *x, int *y, sm_rng *rng) {
    for (int b = 0; b < B; b++) {
        y[b] = (int)sm_rng_below(rng, K);
        for (int i = 0; i < S; i++)
            for (int j = 0; j < S; j++) {
                int q = (i >= S / 2) * 2 + (j >= S / 2);
                x[(b * S + i) * S + j] = (float)(0.5 * sm_rng_normal(rng) + (q == y[b]));
            }
    }
}

int main(void) {
    sm_error err;
    sm_rng rng;
    sm_rng_seed(&rng, 7);
    sm_moe_config mc;
    sm_moe_config_default(&mc);
    mc.router.E = 4; /* token-choice top-2 over each image's 16 tokens */
    mc.router.k = 2;
    mc.H = 12;
    sm_module *layers[] = {
        sm_conv2d_module("", 6, 3, 1, 1, SM_ACT_RELU, &err),
        sm_maxpool_module("", 2, 2, &err),
        sm_tokens_module("", &err),
        sm_moe_module("", &mc, &err),
        sm_flatten_module("", &err),
        sm_dense_module("", K, SM_ACT_NONE, &err),
    };
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
        if (!layers[i]) return fprintf(stderr, "%s\n", err.msg), 1;
    layers[3]->residual = 1; /* tokens + MoE(tokens) */
    sm_module *net = sm_seq_module("net", layers, 6, &err);
    sm_params ps;
    sm_params_init_table(&ps);
    if (!net || sm_module_declare(net, &ps, sm_shape_image(1, S, S), &err) != SM_OK ||
        sm_params_alloc(&ps, &err) != SM_OK)
        return fprintf(stderr, "%s\n", err.msg), 1;
    sm_params_initialize(&ps, &rng);
    if (sm_module_reserve(net, B, &err) != SM_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.lr = 3e-3;
    sm_optim opt;
    if (sm_optim_init(&opt, &oc, &ps, &err) != SM_OK) return fprintf(stderr, "%s\n", err.msg), 1;

    float x[B * S * S];
    int y[B];
    sm_real in[B * S * S], logits[B * K], dlogits[B * K], probs[B * K], losses[B];
    sm_ctx ctx = sm_ctx_make(&ps, &rng, 1);
    double first = 0, last = 0;
    for (int step = 0; step <= STEPS; step++) {
        make_batch(x, y, &rng);
        for (int i = 0; i < B * S * S; i++) in[i] = x[i];
        sm_module_forward(net, logits, in, B, &ctx);
        /* the loss lives outside the network and writes the gradient the backward starts from */
        double loss = sm_loss_crossentropy(dlogits, probs, losses, logits, y, NULL, B, K, 1);
        sm_params_zero_grad(&ps);
        sm_module_backward(net, NULL, dlogits, in, B, &ctx);
        sm_optim_step(&opt, &ps, oc.lr);
        if (step == 0) first = loss;
        last = loss;
        if (step % 20 == 0) printf("step %3d  loss %.4f\n", step, loss);
    }
    printf("compose_moe: %d parameters, loss %.4f -> %.4f\n", (int)ps.total, first, last);
    sm_optim_free(&opt);
    sm_module_free(net);
    sm_params_free(&ps);
    return last < 0.5 * first ? 0 : 1; /* a run that does not learn is a failure */
}
