/* specmoe eval CHECKPOINT: test (or training) accuracy and routing statistics of a checkpoint, at
 * other dials (GrMoE alpha, temperature) without retraining; --router ev builds SSMoE's eigenvector
 * router from a top-k checkpoint's own experts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/methods/ssmoe/ssmoe.h"

/* The dial flags: every router's dials (sm_router_ops.dials) and the shared temperature, one flag per
 * name, help naming the routers it applies to. Values stay text until the checkpoint's router is
 * known, then its own option parses them. */
#define MAX_DIALS 16
#define MAX_USERS 8
typedef struct {
    int n;
    const char *key[MAX_DIALS], *val[MAX_DIALS];
    const char *shared_help[MAX_DIALS];                     /* a shared dial's help (NULL: routers') */
    const char *who[MAX_DIALS][MAX_USERS], *what[MAX_DIALS][MAX_USERS]; /* router, its help */
    int nu[MAX_DIALS];
    char flag[MAX_DIALS][32], users[MAX_DIALS][128], help[MAX_DIALS][512];
} dial_flags;

/* the flag row of option o in df (added if new); ops names a router it applies to (NULL: all) */
static void dials_add(dial_flags *df, const sm_router_opt *o, const sm_router_ops *ops) {
    char flag[32];
    sm_router_opt_flag(o, flag, sizeof flag);
    int j = 0;
    while (j < df->n && strcmp(df->flag[j], flag)) j++;
    if (j == df->n) {
        if (df->n == MAX_DIALS) abort(); /* raise MAX_DIALS */
        df->n++;
        df->key[j] = o->key;
        snprintf(df->flag[j], sizeof df->flag[j], "%s", flag);
        df->shared_help[j] = ops ? NULL : o->help;
        df->nu[j] = 0;
    }
    if (ops && df->nu[j] < MAX_USERS) {
        df->who[j][df->nu[j]] = ops->name;
        df->what[j][df->nu[j]++] = o->help;
    }
}

/* "[grassmann, ev] grassmann: sparsity dial; ev: mix weight (default: as trained)": the routers
 * that read the key, each with its own help where they differ */
static void dials_help(dial_flags *df, int j) {
    char *h = df->help[j], *u = df->users[j];
    size_t n = sizeof df->help[j], at = 0, ua = 0;
    u[0] = 0;
    if (df->shared_help[j]) {
        snprintf(h, n, "%s (any router; default: as trained)", df->shared_help[j]);
        return;
    }
    int same = 1;
    for (int i = 1; i < df->nu[j]; i++) same &= !strcmp(df->what[j][i], df->what[j][0]);
    for (int i = 0; i < df->nu[j] && ua < sizeof df->users[j]; i++)
        ua += (size_t)snprintf(u + ua, sizeof df->users[j] - ua, "%s%s", i ? ", " : "", df->who[j][i]);
    at += (size_t)snprintf(h, n, "[%s] ", u);
    for (int i = 0; i < (same ? 1 : df->nu[j]) && at < n; i++)
        at += same ? (size_t)snprintf(h + at, n - at, "%s", df->what[j][i])
                   : (size_t)snprintf(h + at, n - at, "%s%s: %s", i ? "; " : "", df->who[j][i], df->what[j][i]);
    if (at < n) snprintf(h + at, n - at, " (default: as trained)");
}

static int dials_rows(dial_flags *df, fl_flag *fl) {
    df->n = 0;
    int n;
    const sm_router_opt *shared = sm_router_shared_opts(&n);
    for (int i = 0; i < n; i++)
        if (sm_router_is_dial(NULL, shared[i].key)) dials_add(df, &shared[i], NULL);
    for (int r = 0; r < sm_router_count(); r++) {
        const sm_router_ops *ops = sm_router_at(r);
        for (int i = 0; ops->dials && ops->dials[i]; i++) {
            const sm_router_opt *o = sm_router_find_opt(ops, ops->dials[i]);
            if (o && strcmp(o->key, "temperature")) dials_add(df, o, ops); /* prototype's --tau: the shared dial */
        }
    }
    for (int j = 0; j < df->n; j++) {
        dials_help(df, j);
        fl[j] = (fl_flag){df->flag[j], FL_STRING, &df->val[j], NULL, df->help[j], 0};
    }
    return df->n;
}

/* Sets the given dials in the checkpoint's router config r; a dial its router lacks is refused with
 * the routers it applies to. */
static int dials_apply(const dial_flags *df, const fl_flag *fl, int nfl, sm_router_config *r) {
    const sm_router_ops *ops = sm_router_find(r->name);
    for (int j = 0; j < df->n; j++) {
        if (!fl_find(fl, nfl, df->flag[j])->set) continue;
        if (!sm_router_is_dial(ops, df->key[j])) {
            fprintf(stderr, "specmoe eval: --%s applies to %s routers (this checkpoint's: %s)\n", df->flag[j],
                    df->users[j], r->name);
            return CLI_EXIT_USAGE;
        }
        if (sm_opt_set(sm_router_find_opt(ops, df->key[j]), r, df->val[j])) {
            fprintf(stderr, "specmoe eval: --%s: '%s' is not a valid value\n", df->flag[j], df->val[j]);
            return CLI_EXIT_USAGE;
        }
    }
    return 0;
}

int cmd_eval(int argc, char **argv) {
    cli_data_opts o;
    const char *split, *router;
    int spread;
    char router_help[512];
    cli_router_help(router_help, sizeof router_help, "refuse the checkpoint unless its router is this one (",
                    "); 'ev' on a topk checkpoint builds the SSMoE eigenvector router");
    static dial_flags df;
    fl_flag fl[8 + MAX_DIALS + 16] = {
        CLI_DATA_FLAGS(o),
        {"split", FL_STRING, &split, "test", "which split to evaluate (train|test)", 0},
        {"router", FL_STRING, &router, NULL, router_help, 0},
        {"spread", FL_BOOL, &spread, "0",
         "also print, per layer, its output's spread across the examples (mean std of a feature) and its constant features: "
         "representation collapse",
         0},
    };
    int nfl = 0;
    while (fl[nfl].name) nfl++;
    nfl += dials_rows(&df, fl + nfl);
    int npos;
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
    /* SSMoE: a top-k checkpoint evaluated with the eigenvector router built from its own experts (the
     * ev router's defaults: alpha 0.5, c 5), and an ev checkpoint with its descriptors rebuilt (they
     * depend on the dials c and the variant) */
    int build_ev = router && !strcmp(router, "ev") && !strcmp(mc.moe.router.name, "topk");
    if (build_ev) (void)sm_router_config_set(&mc.moe.router, "ev", NULL);
    if (router && strcmp(router, mc.moe.router.name) != 0) {
        fprintf(stderr, "specmoe eval: %s: the checkpoint's router is '%s', not '%s'\n", pos[0], mc.moe.router.name, router);
        return CLI_EXIT_USAGE;
    }
    build_ev = cli_config_has_moe(&mc) && !strcmp(mc.moe.router.name, "ev");
    rc = dials_apply(&df, fl, nfl, &mc.moe.router);
    if (rc) return rc;
    sm_model *m = sm_model_create(&mc, o.batch, NULL, &err); /* refuses dials out of the router's range */
    if (!m) return cli_fail(SM_ERR_ARG, &err);
    st = sm_checkpoint_load(pos[0], m, NULL, NULL, &err);
    if (st == SM_OK && build_ev) {
        double t0 = sm_time_now();
        st = sm_model_build_ev(m, &err);
        const sm_ev_router_opts *eo = sm_ev_opts(&mc.moe.router);
        if (st == SM_OK)
            printf("ev router: descriptors built from the experts in %.2f s (c = %d%s, alpha = %g)\n", sm_time_now() - t0,
                   eo->ev_c, eo->ev_avg ? ", averaged EV" : "", eo->alpha);
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
        double sp[SM_MAX_LAYERS];
        int cst[SM_MAX_LAYERS];
        if (spread && (st = sm_layer_spread(m, &ds, o.batch, sp, cst, &err)) != SM_OK) code = cli_fail(st, &err);
        for (int l = 0; spread && st == SM_OK && l < m->n_layers; l++)
            printf("layer %d (%s, %d features): spread across examples %.4g, constant features %d\n", l,
                   m->layers[l].mod->ops->kind, m->layers[l].out, sp[l], cst[l]);
    }
    sm_dataset_free(&ds);
    sm_model_free(m);
    return code;
}
