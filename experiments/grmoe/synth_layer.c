/* One MoE layer on GrMoE's synthetic task (include/specmoe/methods/grmoe/synth.h): built for a
 * method, trained, evaluated: the run part bench routing and bench alpha share (synth_layer.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/grmoe/synth_layer.h"

sm_status gr_layer_make(gr_layer *tr, const gr_method *me, const sm_synth_config *sc, const gr_train_opts *to,
                        const gr_router_opts *ro, uint64_t seed, sm_error *err) {
    sm_moe_config mc;
    sm_moe_config_default(&mc);
    sm_router_config *r = &mc.router;
    sm_status st = sm_router_config_set(r, me->router, err);
    if (st != SM_OK) return st;
    r->E = sc->N;
    r->k = me->k > 0 ? me->k : sc->N;
    r->renorm = me->renorm;
    r->balance_coef = me->balance;
    r->capacity = me->capacity;
    if (!strcmp(r->name, "grassmann") || !strcmp(r->name, "vmf")) {
        sm_grmoe_opts(r)->amortize = me->amortize;
        sm_grmoe_opts(r)->kr = ro && ro->kr > 0 ? ro->kr : sc->kr;
    }
    if (ro && !strcmp(r->name, "grassmann")) {
        if (ro->kappa_init > 0) sm_grmoe_opts(r)->kappa_init = ro->kappa_init;
        if (ro->rho0 >= 0) sm_grmoe_opts(r)->rho0 = ro->rho0;
    }
    if (!strcmp(r->name, "soft")) sm_soft_opts(r)->slots = (to->batch + sc->N - 1) / sc->N; /* as many slots as tokens */
    mc.H = to->hidden;
    mc.out_dim = sc->out;
    sm_params_init_table(&tr->ps);
    tr->moe = sm_moe_create(&mc, sc->d, err);
    if (!tr->moe) return SM_ERR_ARG;
    st = sm_moe_declare(tr->moe, &tr->ps, "moe", err);
    if (st == SM_OK) st = sm_params_alloc(&tr->ps, err);
    if (st != SM_OK) return st;
    sm_rng init;
    sm_rng_seed(&init, seed * 7919 + 17);
    sm_params_initialize(&tr->ps, &init);
    sm_moe_bind(tr->moe, &tr->ps);
    return sm_moe_reserve(tr->moe, to->batch, err);
}

void gr_layer_free(gr_layer *tr) {
    sm_moe_free(tr->moe);
    sm_params_free(&tr->ps);
}

/* Trains on a fresh stream of batches drawn from the task with data_seed (the same for every method). */
sm_status gr_layer_train(gr_layer *tr, const sm_synth *task, const gr_train_opts *to, uint64_t data_seed, sm_error *err) {
    const int d = task->cfg.d, O = task->cfg.out, B = to->batch;
    sm_optim_config oc;
    sm_optim_config_default(&oc);
    oc.kind = SM_OPT_ADAM;
    oc.lr = to->lr;
    sm_optim opt;
    sm_status st = sm_optim_init(&opt, &oc, &tr->ps, err);
    if (st != SM_OK) return st;
    float *x = malloc(sizeof(float) * B * d), *y = malloc(sizeof(float) * B * O);
    int *comp = malloc(sizeof(int) * B);
    sm_real *xr = malloc(sizeof(sm_real) * B * d), *out = malloc(sizeof(sm_real) * B * O);
    sm_real *dout = malloc(sizeof(sm_real) * B * O), *dx = malloc(sizeof(sm_real) * B * d);
    sm_rng data, noise;
    sm_rng_seed(&data, data_seed);
    sm_rng_seed(&noise, data_seed ^ 0xabcdefULL);
    for (int step = 0; step < to->steps && st == SM_OK; step++) {
        sm_synth_sample(task, x, y, comp, B, &data);
        for (int i = 0; i < B * d; i++) xr[i] = x[i];
        sm_params_zero_grad(&tr->ps);
        sm_moe_forward(tr->moe, out, xr, B, &noise, 1);
        for (int i = 0; i < B * O; i++) dout[i] = (sm_real)(2.0 * (out[i] - y[i]) / (B * O));
        memset(dx, 0, sizeof(sm_real) * B * d);
        sm_moe_backward(tr->moe, dx, dout, xr, B);
        if (!sm_all_finite(tr->ps.grad, tr->ps.total))
            st = sm_fail(err, SM_ERR_NUMERIC, "bench routing: non-finite gradient at step %d", step);
        /* cosine decay to 0 over the run */
        double lr = 0.5 * to->lr * (1 + cos(3.141592653589793 * step / to->steps));
        sm_optim_step(&opt, &tr->ps, lr);
    }
    free(x); free(y); free(comp); free(xr); free(out); free(dout); free(dx);
    sm_optim_free(&opt);
    return st;
}

/* Evaluates on test_tokens held-out tokens (in batches of the training batch size). */
void gr_layer_eval(gr_layer *tr, const sm_synth *task, const gr_train_opts *to, uint64_t test_seed, gr_metrics *res) {
    const int d = task->cfg.d, O = task->cfg.out, B = to->batch, N = task->cfg.N, n = to->test_tokens;
    float *x = malloc(sizeof(float) * B * d), *y = malloc(sizeof(float) * B * O);
    int *comp = malloc(sizeof(int) * n), *pred = malloc(sizeof(int) * n);
    sm_real *xr = malloc(sizeof(sm_real) * B * d), *out = malloc(sizeof(sm_real) * B * O);
    sm_rng data;
    sm_rng_seed(&data, test_seed);
    sm_routing_stats st;
    sm_routing_stats_reset(&st, N, tr->moe->cfg.router.k);
    double se = 0;
    int done = 0;
    while (done < n) {
        int b = n - done < B ? n - done : B;
        sm_synth_sample(task, x, y, comp + done, b, &data);
        for (int i = 0; i < b * d; i++) xr[i] = x[i];
        sm_moe_forward(tr->moe, out, xr, b, NULL, 0);
        for (int i = 0; i < b * O; i++) se += ((double)out[i] - y[i]) * ((double)out[i] - y[i]);
        sm_route_argmax(pred + done, &tr->moe->route);
        sm_routing_stats_add(&st, &tr->moe->route);
        done += b;
    }
    sm_routing_summary s;
    sm_routing_summarize(&st, &s);
    res->acc = sm_assignment_accuracy(pred, comp, n, N, N);
    res->cv = s.cv;
    res->entropy = s.entropy;
    res->eff = s.eff_experts;
    res->collapsed = s.collapsed;
    res->merged = sm_synth_merged(pred, comp, n, N, N);
    res->mse = se / ((double)n * O);
    double h = 0;
    for (int e = 0; e < N; e++)
        if (s.load_frac[e] > 0) h -= s.load_frac[e] * log(s.load_frac[e]);
    res->load_entropy = h;
    free(x); free(y); free(comp); free(pred); free(xr); free(out);
}

void gr_progress(const char *bench, int *done, int total, const char *label, int seed, const gr_metrics *g, double t0) {
#pragma omp critical(gr_progress)
    {
        ++*done;
        if (g)
            fprintf(stderr, "bench %s: [%d/%d] %s seed %d done: acc %.1f%%, load CV %.2f (%.0f s)\n", bench, *done, total,
                    label, seed, 100 * g->acc, g->cv, sm_time_now() - t0);
        else
            fprintf(stderr, "bench %s: [%d/%d] %s seed %d failed (%.0f s)\n", bench, *done, total, label, seed,
                    sm_time_now() - t0);
        fflush(stderr);
    }
}
