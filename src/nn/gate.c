/* The softmax gate of token-choice routers (see gate.h). */
#include "nn/gate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/ops.h"

sm_status sm_gate_init(sm_gate *g, const sm_router_config *c, int max_T, sm_error *err) {
    memset(g, 0, sizeof *g);
    g->cfg = c;
    g->E = c->E;
    g->k = c->k;
    g->max_T = max_T;
    size_t T = (size_t)max_T, E = (size_t)c->E, k = (size_t)c->k;
    size_t sizes[] = {T * k, T * E, T, T * E};
    sm_real **ptrs[] = {&g->wsel, &g->dp, &g->lse, &g->zprob};
    size_t isizes[] = {T * k, E};
    int **iptrs[] = {&g->choice, &g->count};
    size_t dsizes[] = {E};
    double **dptrs[] = {&g->frac};
    g->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router %s gate (%d tokens)", c->name, max_T);
    g->iblock = sm_carve_int(iptrs, isizes, SM_LEN(isizes), err, "router %s gate (%d tokens)", c->name, max_T);
    g->dblock = sm_carve_double(dptrs, dsizes, SM_LEN(dsizes), err, "router %s gate (%d tokens)", c->name, max_T);
    if (!g->block || !g->iblock || !g->dblock) {
        sm_gate_free(g);
        return SM_ERR_NOMEM;
    }
    return SM_OK;
}

void sm_gate_free(sm_gate *g) {
    free(g->block);
    free(g->iblock);
    free(g->dblock);
    memset(g, 0, sizeof *g);
}

void sm_gate_topk(int *idx, const sm_real *p, int E, int k) {
    for (int j = 0; j < k; j++) idx[j] = -1;
    for (int e = 0; e < E; e++) {
        int pos = k;
        while (pos > 0 && (idx[pos - 1] < 0 || p[e] > p[idx[pos - 1]])) pos--;
        if (pos >= k) continue;
        for (int j = k - 1; j > pos; j--) idx[j] = idx[j - 1];
        idx[pos] = e;
    }
}

void sm_gate_forward(sm_gate *g, sm_route *route, const sm_real *logits, int T) {
    const int E = g->E, k = g->k;
    sm_softmax_forward(route->probs, logits, (sm_real)g->cfg->temperature, T, E);
    for (int t = 0; t < T; t++) {
        const sm_real *p = route->probs + (size_t)t * E;
        int *ch = g->choice + (size_t)t * k;
        sm_real *w = g->wsel + (size_t)t * k;
        sm_gate_topk(ch, p, E, k);
        sm_real sum = 0;
        for (int j = 0; j < k; j++) sum += p[ch[j]];
        for (int j = 0; j < k; j++) w[j] = g->cfg->renorm ? p[ch[j]] / sum : p[ch[j]];
    }
    double aux = 0;
    if (g->cfg->balance_coef > 0) {
        memset(g->frac, 0, sizeof(double) * (size_t)E);
        for (int i = 0; i < T * k; i++) g->frac[g->choice[i]] += 1.0 / ((double)T * k);
        for (int e = 0; e < E; e++) {
            double P = 0;
            for (int t = 0; t < T; t++) P += route->probs[(size_t)t * E + e];
            aux += g->cfg->balance_coef * E * g->frac[e] * P / T;
        }
    }
    if (g->cfg->zloss_coef > 0) {
        sm_softmax_forward(g->zprob, logits, 1, T, E);
        double z = 0;
        for (int t = 0; t < T; t++) {
            const sm_real *l = logits + (size_t)t * E;
            sm_real mx = l[0];
            for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
            double s = 0;
            for (int e = 0; e < E; e++) s += exp((double)(l[e] - mx));
            g->lse[t] = (sm_real)(mx + log(s));
            z += (double)g->lse[t] * g->lse[t];
        }
        aux += g->cfg->zloss_coef * z / T;
    }
    route->dropped = 0;
    if (g->cfg->capacity > 0) {
        const int m = g->group > 0 ? g->group : T;
        int cap = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++) {
                if (t % m == 0 && j == 0) { /* a new group: its own capacity, counters from zero */
                    int mg = T - t < m ? T - t : m;
                    cap = (int)ceil(g->cfg->capacity * (double)mg * k / E);
                    memset(g->count, 0, sizeof(int) * (size_t)E);
                }
                int *e = &g->choice[(size_t)t * k + j];
                if (g->count[*e] >= cap) {
                    *e = -1 - *e; /* dropped: remembered as -1-e for the backward */
                    route->dropped++;
                } else {
                    g->count[*e]++;
                }
            }
    }
    sm_route_group(route, g->choice, g->wsel, T, k); /* skips the dropped (negative) choices */
    route->aux_loss = aux;
}

void sm_gate_backward(sm_gate *g, sm_real *dlogits, const sm_route *route, int T) {
    const int E = g->E, k = g->k;
    /* dw (T,k): dropped choices produced no output, so their dw is 0 */
    sm_real *dw = g->wsel;
    memset(dw, 0, sizeof(sm_real) * (size_t)T * k);
    for (int a = 0; a < route->n_assign; a++) dw[(size_t)route->token[a] * k + route->slot[a]] = route->dweight[a];
    sm_real *dp = g->dp;
    memset(dp, 0, sizeof(sm_real) * (size_t)T * E);
    for (int t = 0; t < T; t++) {
        const sm_real *p = route->probs + (size_t)t * E;
        const int *ch = g->choice + (size_t)t * k;
        const sm_real *gw = dw + (size_t)t * k;
        sm_real *dpt = dp + (size_t)t * E;
        for (int e = 0; e < E; e++) dpt[e] = route->dprobs[(size_t)t * E + e]; /* outside losses on p */
        if (g->cfg->renorm) {
            /* w_j = p_j / S with S over all k chosen (dropped included):
             * dL/dp_i = (dw_i - sum_j dw_j w_j) / S */
            sm_real S = 0, dot = 0;
            for (int j = 0; j < k; j++) S += p[sm_gate_expert(ch[j])];
            for (int j = 0; j < k; j++) dot += gw[j] * p[sm_gate_expert(ch[j])] / S;
            for (int j = 0; j < k; j++) dpt[sm_gate_expert(ch[j])] += (gw[j] - dot) / S;
        } else {
            for (int j = 0; j < k; j++) dpt[sm_gate_expert(ch[j])] += gw[j];
        }
        if (g->cfg->balance_coef > 0) /* d/dp_te of coef * E * sum_e f_e mean_t p_te */
            for (int e = 0; e < E; e++) dpt[e] += (sm_real)(g->cfg->balance_coef * E * g->frac[e] / T);
    }
    memset(dlogits, 0, sizeof(sm_real) * (size_t)T * E);
    sm_softmax_backward(dlogits, dp, route->probs, (sm_real)g->cfg->temperature, T, E);
    if (g->cfg->zloss_coef > 0) /* d/dl_te of coef * mean_t lse_t^2 = coef * 2 lse_t softmax(l_t)_e / T */
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++)
                dlogits[(size_t)t * E + e] +=
                    (sm_real)(g->cfg->zloss_coef * 2 * g->lse[t] * g->zprob[(size_t)t * E + e] / T);
}
