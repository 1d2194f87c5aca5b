/* specmoe ssmoe prune CHECKPOINT: SSMoE expert dropping on a specmoe checkpoint (papers/001).
 * Experts are ranked on a calibration set (the first --calib training images) by one of
 *   router  mean learned-router probability per expert ("Router drop"),
 *   ssmoe   mean mixed EV/router probability per expert ("SSMoE drop"),
 *   random  a seeded random order ("RandDrop"),
 * and the top round(keep * E) of each MoE layer are kept; the pruned model, with the other experts
 * physically removed, is written as a new checkpoint. UNCONFIRMED in the paper's code: how experts
 * are ranked for dropping (REFERENCE-NOTES); this is the natural reading, documented in the README. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flags.h"

int cmd_ssmoe(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "prune") != 0) {
        fprintf(stderr, "specmoe ssmoe: expected 'prune' (usage: specmoe ssmoe prune CHECKPOINT [flags])\n");
        return (argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) ? 0 : CLI_EXIT_USAGE;
    }
    const char *rank_s, *out, *data;
    double keep, alpha;
    int calib, c, avg;
    uint64_t seed;
    fl_flag fl[] = {
        {"keep", FL_DOUBLE, &keep, "0.75", "fraction of experts kept per MoE layer", 0},
        {"rank", FL_STRING, &rank_s, "ssmoe", "ranking: router | ssmoe | random", 0},
        {"calib", FL_INT, &calib, "1000", "calibration images (the first ones of the training split)", 0},
        {"alpha", FL_DOUBLE, &alpha, "0.5", "ssmoe ranking: weight of the EV router in the mix", 0},
        {"ev-c", FL_INT, &c, "5", "ssmoe ranking: singular vectors per descriptor", 0},
        {"ev-avg", FL_BOOL, &avg, "0", "ssmoe ranking: averaged-EV descriptors", 0},
        {"seed", FL_U64, &seed, "1", "random ranking: seed", 0},
        {"data", FL_STRING, &data, SM_FASHION_MNIST_DIR, "directory with the Fashion-MNIST IDX .gz files", 0},
        {"out", FL_STRING, &out, NULL, "path of the pruned checkpoint (required)", 0},
    };
    int nfl = (int)(sizeof fl / sizeof fl[0]), npos;
    const char *pos[1];
    int rc = fl_parse(fl, nfl, argc, argv, 3, "ssmoe prune", "CHECKPOINT --out PATH [flags]", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    sm_expert_rank rank;
    if (!strcmp(rank_s, "router")) rank = SM_RANK_ROUTER;
    else if (!strcmp(rank_s, "ssmoe")) rank = SM_RANK_SSMOE;
    else if (!strcmp(rank_s, "random")) rank = SM_RANK_RANDOM;
    else {
        fprintf(stderr, "specmoe ssmoe prune: --rank: '%s' is not router, ssmoe or random\n", rank_s);
        return CLI_EXIT_USAGE;
    }
    if (npos != 1 || !out || !(keep > 0 && keep <= 1) || calib < 1 || c < 1 || !(alpha >= 0 && alpha <= 1)) {
        fprintf(stderr, "specmoe ssmoe prune: need CHECKPOINT and --out, --keep in (0, 1], --calib and --ev-c >= 1, "
                        "--alpha in [0, 1]\n");
        return CLI_EXIT_USAGE;
    }
    sm_error err;
    sm_model_config mc;
    sm_status st = sm_checkpoint_read_config(pos[0], &mc, &err);
    if (st != SM_OK) return cli_fail(st, &err);
    if (strcmp(mc.moe.router.name, "topk") != 0) {
        fprintf(stderr, "specmoe ssmoe prune: %s: the router is '%s'; pruning ranks the experts of topk models\n", pos[0],
                mc.moe.router.name);
        return CLI_EXIT_USAGE;
    }
    sm_model *m = sm_model_create(&mc, 500, NULL, &err);
    if (!m) return cli_fail(SM_ERR_FORMAT, &err);
    st = sm_checkpoint_load(pos[0], m, NULL, NULL, &err);
    sm_dataset ds = {0};
    if (st == SM_OK) st = sm_dataset_load_fashion(&ds, data, "train", &err);
    if (st != SM_OK) {
        sm_model_free(m);
        return cli_fail(st, &err);
    }
    if (calib > ds.n) calib = ds.n;
    const int E = mc.moe.router.E, L = sm_model_n_moe(m);
    int E_keep = (int)lround(keep * E);
    if (E_keep < 1) E_keep = 1;
    double *score = malloc(sizeof(double) * (size_t)L * E);
    int *kept = malloc(sizeof(int) * (size_t)L * E_keep);
    sm_model *p = NULL;
    st = sm_expert_scores(m, ds.x, calib, rank, alpha, c, avg, seed, score, &err);
    if (st == SM_OK) {
        for (int l = 0; l < L; l++) { /* the E_keep highest scores, then in expert order */
            int *k = kept + l * E_keep;
            for (int j = 0; j < E_keep; j++) {
                int best = -1;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int q = 0; q < j; q++) taken |= k[q] == e;
                    if (!taken && (best < 0 || score[l * E + e] > score[l * E + best])) best = e;
                }
                k[j] = best;
            }
            for (int a = 1; a < E_keep; a++)
                for (int b = a; b > 0 && k[b] < k[b - 1]; b--) {
                    int t = k[b];
                    k[b] = k[b - 1];
                    k[b - 1] = t;
                }
            printf("moe layer %d (%s ranking): kept", l, rank_s);
            for (int j = 0; j < E_keep; j++) printf(" %d", k[j]);
            printf(" of %d; scores", E);
            for (int e = 0; e < E; e++) printf(" %.4f", score[l * E + e]);
            printf("\n");
        }
        p = sm_model_prune_experts(m, kept, E_keep, &err);
        if (!p) st = SM_ERR_ARG;
    }
    if (st == SM_OK) st = sm_checkpoint_save(out, p, NULL, NULL, &err);
    if (st == SM_OK) printf("wrote %s: %d of %d experts per MoE layer (%zu parameters, was %zu)\n", out, E_keep, E,
                            p->params.total, m->params.total);
    free(score);
    free(kept);
    sm_model_free(p);
    sm_model_free(m);
    sm_dataset_free(&ds);
    return st == SM_OK ? 0 : cli_fail(st, &err);
}
