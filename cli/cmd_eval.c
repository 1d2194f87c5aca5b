/* specmoe eval CHECKPOINT: test (or training) accuracy and routing statistics of a checkpoint, at
 * other dials (GrMoE alpha, temperature) without retraining; --router ev builds SSMoE's eigenvector
 * router from a top-k checkpoint's own experts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "flags.h"

int cmd_eval(int argc, char **argv) {
    cli_data_opts o;
    const char *split, *router;
    double alpha, temperature;
    int ev_c, ev_avg;
    char router_help[512];
    cli_router_help(router_help, sizeof router_help, "refuse the checkpoint unless its router is this one (",
                    "); 'ev' on a topk checkpoint builds the SSMoE eigenvector router");
    fl_flag fl[] = {
        CLI_DATA_FLAGS(o),
        {"split", FL_STRING, &split, "test", "which split to evaluate (train|test)", 0},
        {"router", FL_STRING, &router, NULL, router_help, 0},
        {"alpha", FL_DOUBLE, &alpha, "-1", "grassmann: sparsity dial; ev: weight of the EV router in the mix (default 0.5)", 0},
        {"ev-c", FL_INT, &ev_c, "5", "ev: right singular vectors averaged per descriptor", 0},
        {"ev-avg", FL_BOOL, &ev_avg, "0", "ev: router-free averaged-EV descriptors", 0},
        {"temperature", FL_DOUBLE, &temperature, "-1", "evaluate at this softmax temperature (-1 = as trained)", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 2, "eval", "CHECKPOINT [flags]", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos != 1) {
        fprintf(stderr, "specmoe eval: expected one checkpoint path (see specmoe eval --help)\n");
        return CLI_EXIT_USAGE;
    }
    if (strcmp(split, "train") && strcmp(split, "test")) {
        fprintf(stderr, "specmoe eval: --split: '%s' is not train or test\n", split);
        return CLI_EXIT_USAGE;
    }
    if (o.batch < 1 || o.per_class < 0 || o.threads < 1) {
        fprintf(stderr, "specmoe eval: --batch and --threads must be >= 1 and --per-class >= 0\n");
        return CLI_EXIT_USAGE;
    }
    cli_set_threads(o.threads);
    sm_error err;
    sm_model_config mc;
    sm_status st = sm_checkpoint_read_config(pos[0], &mc, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    if (router && !strcmp(router, "ev") && !cli_config_has_moe(&mc)) {
        fprintf(stderr, "specmoe eval: %s: the checkpoint has no MoE layer; --router ev needs one\n", pos[0]);
        return CLI_EXIT_USAGE;
    }
    /* SSMoE: a top-k checkpoint evaluated with the eigenvector router built from its own experts */
    int build_ev = router && !strcmp(router, "ev") && !strcmp(mc.moe.router.name, "topk");
    if (build_ev || (router && !strcmp(router, "ev") && !strcmp(mc.moe.router.name, "ev"))) {
        strcpy(mc.moe.router.name, "ev");
        mc.moe.router.alpha = fl_find(fl, nfl, "alpha")->set ? alpha : (build_ev ? 0.5 : mc.moe.router.alpha);
        if (build_ev || fl_find(fl, nfl, "ev-c")->set) mc.moe.router.ev_c = ev_c;
        if (build_ev || fl_find(fl, nfl, "ev-avg")->set) mc.moe.router.ev_avg = ev_avg;
        build_ev = 1; /* (re)build the descriptors: they depend on c and the variant */
        if (!(mc.moe.router.alpha >= 0 && mc.moe.router.alpha <= 1) || ev_c < 1) {
            fprintf(stderr, "specmoe eval: ev needs --alpha in [0, 1] and --ev-c >= 1\n");
            return CLI_EXIT_USAGE;
        }
        alpha = -1; /* already applied */
    } else if (router && strcmp(router, mc.moe.router.name) != 0) {
        fprintf(stderr, "specmoe eval: %s: the checkpoint's router is '%s', not '%s'\n", pos[0], mc.moe.router.name, router);
        return CLI_EXIT_USAGE;
    }
    if (alpha >= 0 && fl_find(fl, nfl, "alpha")->set && strcmp(mc.moe.router.name, "grassmann") != 0) {
        fprintf(stderr, "specmoe eval: --alpha applies to grassmann and ev routers (this one: %s)\n", mc.moe.router.name);
        return CLI_EXIT_USAGE;
    }
    if (fl_find(fl, nfl, "alpha")->set && !strcmp(mc.moe.router.name, "grassmann") && alpha < 0) {
        fprintf(stderr, "specmoe eval: --alpha must be >= 0 and applies to grassmann routers (this one: %s)\n",
                mc.moe.router.name);
        return CLI_EXIT_USAGE;
    }
    if (fl_find(fl, nfl, "temperature")->set && !(temperature > 0)) {
        fprintf(stderr, "specmoe eval: --temperature must be > 0\n");
        return CLI_EXIT_USAGE;
    }
    sm_model *m = sm_model_create(&mc, o.batch, NULL, &err);
    if (!m) return cli_fail(SM_ERR_FORMAT, &err);
    sm_model_set_dials(m, alpha, temperature);
    st = sm_checkpoint_load(pos[0], m, NULL, NULL, &err);
    if (st == SM_OK && build_ev) {
        double t0 = sm_time_now();
        st = sm_model_build_ev(m, &err);
        if (st == SM_OK)
            printf("ev router: descriptors built from the experts in %.2f s (c = %d%s, alpha = %g)\n", sm_time_now() - t0,
                   mc.moe.router.ev_c, mc.moe.router.ev_avg ? ", averaged EV" : "", mc.moe.router.alpha);
        /* router-collapse diagnostics per MoE layer: correlation of the learned router's expert
         * embeddings vs of the EV descriptors (mean of each expert's two) */
        for (int l = 0; st == SM_OK && l < sm_model_n_moe(m); l++) {
            double rc = 0, ec = 0;
            st = sm_ssmoe_collapse(m, l, &rc, &ec, &err);
            if (st == SM_OK)
                printf("moe layer %d collapse: mean |off-diagonal correlation| of router embeddings %.4f, of EV descriptors %.4f\n",
                       l, rc, ec);
        }
    }
    /* a model trained on a class subset is evaluated on that subset unless --classes says otherwise */
    char classes[128] = "";
    if (st == SM_OK && !fl_find(fl, nfl, "classes")->set) {
        st = sm_checkpoint_read_classes(pos[0], classes, sizeof classes, &err);
        if (st == SM_OK && classes[0]) {
            o.classes = classes;
            printf("classes: %s (the checkpoint's training subset)\n", classes);
        }
    }
    sm_dataset ds;
    if (st == SM_OK) st = cli_load_split(&ds, &o, split, 1, &err); /* --per-class on either split */
    if (st != SM_OK) {
        sm_model_free(m);
        return cli_fail(st, &err);
    }
    sm_eval_result ev;
    st = sm_evaluate(m, &ds, o.batch, &ev, &err);
    int code = 0;
    if (st != SM_OK) {
        code = cli_fail(st, &err);
    } else {
        cli_print_routing(split, &ev);
        for (int l = 0; l < sm_model_n_moe(m); l++) { /* SSMoE App. D.6, ev routers only */
            double ov = sm_ev_router_take_overlap(sm_model_moe(m, l)->router);
            if (ov == ov)
                printf("moe layer %d: %.4f of the experts picked under the mix are also the learned router's top-%d\n", l,
                       ov, mc.moe.router.k);
        }
        printf("%s accuracy: %.4f (loss %.4f, %ld examples)\n", split, ev.acc, ev.loss, ev.n);
    }
    sm_dataset_free(&ds);
    sm_model_free(m);
    return code;
}
