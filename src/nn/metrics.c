/* Routing statistics (see include/specmoe/metrics.h). */
#include "specmoe/nn/metrics.h"

#include "specmoe/core/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sm_routing_stats_reset(sm_routing_stats *s, int E, int k) {
    memset(s, 0, sizeof *s);
    s->E = E < SM_METRICS_MAX_E ? E : SM_METRICS_MAX_E;
    s->k = k;
}

double sm_entropy(const sm_real *p, int E) {
    double h = 0;
    for (int e = 0; e < E; e++)
        if (p[e] > 0) h -= (double)p[e] * log((double)p[e]);
    return h;
}

void sm_route_soft_sharpness(const sm_route *r, double *combine_sum, long *combine_n, double *dispatch_sum,
                             long *dispatch_n) {
    if (r->kind != SM_ROUTE_SOFT || r->T < 1 || r->group_size < 1) return;
    const int S = r->E * r->slots, m = r->group_size;
    if (S > 1) /* combine: each token's row over the S slots */
        for (int t = 0; t < r->T; t++) {
            *combine_sum += sm_entropy(r->combine + (size_t)t * S, S) / log((double)S);
            ++*combine_n;
        }
    for (int g = 0; g < r->groups; g++) { /* dispatch: each slot's column over the group's tokens */
        const int t0 = g * m, mg = r->T - t0 < m ? r->T - t0 : m;
        if (mg < 2) continue;
        for (int s = 0; s < S; s++) {
            double h = 0;
            for (int t = t0; t < t0 + mg; t++) {
                const double w = r->dispatch[(size_t)t * S + s];
                if (w > 0) h -= w * log(w);
            }
            *dispatch_sum += h / log((double)mg);
            ++*dispatch_n;
        }
    }
}

double sm_topk_mass(const sm_real *p, int E, int k) {
    /* sum of the k largest: k passes, each taking the largest not yet taken (k is small) */
    double mass = 0, prev = INFINITY;
    int prev_idx = -1;
    for (int j = 0; j < k && j < E; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int after = p[e] < prev || (p[e] == prev && e > prev_idx);
            if (after && (best < 0 || p[e] > p[best])) best = e;
        }
        if (best < 0) break;
        mass += p[best];
        prev = p[best];
        prev_idx = best;
    }
    return mass;
}

void sm_route_argmax(int *out, const sm_route *r) {
    for (int t = 0; t < r->T; t++) out[t] = sm_argmax(r->probs + (size_t)t * r->E, r->E);
}

void sm_routing_stats_add(sm_routing_stats *s, const sm_route *r) {
    s->tokens += r->T;
    s->assignments += r->n_assign;
    s->dropped += r->dropped;
    int by_mass = r->kind == SM_ROUTE_SOFT || r->n_assign == r->T * r->E;
    if (!by_mass)
        for (int e = 0; e < s->E; e++) s->load[e] += r->load[e];
    for (int t = 0; t < r->T; t++) {
        const sm_real *p = r->probs + (size_t)t * r->E;
        s->entropy_sum += sm_entropy(p, r->E);
        s->topk_mass_sum += sm_topk_mass(p, r->E, s->k);
        if (by_mass)
            for (int e = 0; e < s->E; e++) s->load[e] += p[e];
    }
}

/* Collapse (GrMoE Sec. 6.1 uses a fixed 1%): an expert is collapsed when its share of the tokens is
 * below min(1%, 0.1 / E). For E <= 10 that is GrMoE's 1%; for more experts it is a tenth of the fair
 * share 1/E, so that near-uniform routing over many experts (E = 128: 0.78% each) is not flagged. */
double sm_collapse_threshold(int E) {
    double rel = E > 0 ? 0.1 / E : 0.01;
    return rel < 0.01 ? rel : 0.01;
}

void sm_routing_summarize(const sm_routing_stats *s, sm_routing_summary *o) {
    memset(o, 0, sizeof *o);
    int E = s->E;
    o->E = E;
    if (E == 0) return;
    double total = 0;
    for (int e = 0; e < E; e++) total += s->load[e];
    double mean = total / E, var = 0, vio = 0;
    int active = 0;
    const double thr = sm_collapse_threshold(E);
    o->min_expert = 0;
    o->min_share = s->tokens > 0 ? s->load[0] / (double)s->tokens : 0;
    for (int e = 0; e < E; e++) {
        double l = s->load[e];
        o->load_frac[e] = total > 0 ? l / total : 0;
        var += (l - mean) * (l - mean);
        if (mean > 0 && fabs(l - mean) / mean > vio) vio = fabs(l - mean) / mean;
        active += s->load[e] > 0;
        /* an expert's share of the tokens: its load (a token count, or for mass-based loads a
         * token-equivalent, since each token's mass sums to 1) over the tokens seen */
        double share = s->tokens > 0 ? l / (double)s->tokens : 0;
        if (share < o->min_share) o->min_share = share, o->min_expert = e;
        if (s->tokens > 0 && share < thr) o->n_collapsed++;
    }
    o->collapsed = o->n_collapsed > 0;
    o->cv = mean > 0 ? sqrt(var / E) / mean : 0;
    o->max_vio = vio;
    o->active_ratio = (double)active / E;
    o->entropy = s->tokens ? s->entropy_sum / (double)s->tokens : 0;
    o->eff_experts = exp(o->entropy);
    o->topk_mass = s->tokens ? s->topk_mass_sum / (double)s->tokens : 0;
    double tot_a = (double)s->assignments;
    o->drop_frac = (tot_a + (double)s->dropped) > 0 ? (double)s->dropped / (tot_a + (double)s->dropped) : 0;
}

double sm_dormant_fraction(const sm_real *h, int N, int H, double tau, double *score) {
    if (N <= 0 || H <= 0) return 0;
    double *mean = score ? score : malloc(sizeof(double) * (size_t)H), total = 0;
    if (!mean) return NAN;
    for (int i = 0; i < H; i++) mean[i] = 0;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < H; i++) mean[i] += fabs((double)h[(size_t)n * H + i]);
    for (int i = 0; i < H; i++) total += mean[i] /= N;
    const double layer = total / H; /* the layer's mean activation magnitude */
    int dormant = 0;
    for (int i = 0; i < H; i++) {
        mean[i] = layer > 0 ? mean[i] / layer : 0;
        dormant += mean[i] <= tau;
    }
    if (!score) free(mean);
    return (double)dormant / H;
}
