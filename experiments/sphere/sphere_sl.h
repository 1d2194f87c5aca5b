/* bench sphere's supervised continual sequences on Fashion-MNIST (sphere_sl.c). */
#ifndef SPECMOE_EXP_SPHERE_SL_H
#define SPECMOE_EXP_SPHERE_SL_H

#include <cjson/cJSON.h>

#include "cli/common.h"

typedef struct {
    const char *protocols; /* comma list: split, permuted */
    int epochs;            /* per task */
    int per_class;         /* training examples per class (0: all) */
    int n_permuted;        /* permuted-input tasks */
    int seeds;
    double rho;            /* SPHERE's ratio (grad mode) */
} sp_sl_opts;

/* Runs (or reads back from dir) Top-k MoE and Top-k MoE + SPHERE through each protocol for every
 * seed, and appends their tables to md and json ("tables"). quick marks the tables as a smoke test. */
sm_status sp_fmnist(const sp_sl_opts *o, const char *dir, int quick, cli_buf *md, cJSON *json, sm_error *err);

#endif
