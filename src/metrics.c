/* Routing statistics (see include/specmoe/metrics.h). */
#include "specmoe/metrics.h"

#include <math.h>
#include <string.h>

void sm_routing_stats_reset(sm_routing_stats *s, int E, int k) {
    memset(s, 0, sizeof *s);
    s->E = E < SM_METRICS_MAX_E ? E : SM_METRICS_MAX_E;
    s->k = k;
}

void sm_routing_stats_add(sm_routing_stats *s, const sm_route *r) {
    s->tokens += r->T;
    s->assignments += r->n_assign;
    s->dropped += r->dropped;
    for (int e = 0; e < s->E; e++) s->load[e] += r->load[e];
    for (int t = 0; t < r->T; t++) {
        const sm_real *p = r->probs + (size_t)t * r->E;
        double h = 0;
        for (int e = 0; e < r->E; e++)
            if (p[e] > 0) h -= (double)p[e] * log((double)p[e]);
        s->entropy_sum += h;
    }
}

void sm_routing_summarize(const sm_routing_stats *s, sm_routing_summary *o) {
    memset(o, 0, sizeof *o);
    int E = s->E;
    o->E = E;
    if (E == 0) return;
    double total = (double)s->assignments, mean = total / E, var = 0, vio = 0;
    int active = 0;
    o->collapsed = 0;
    for (int e = 0; e < E; e++) {
        double l = (double)s->load[e];
        o->load_frac[e] = total > 0 ? l / total : 0;
        var += (l - mean) * (l - mean);
        if (mean > 0 && fabs(l - mean) / mean > vio) vio = fabs(l - mean) / mean;
        active += s->load[e] > 0;
        /* collapse: an expert gets < 1% of the tokens */
        if (s->tokens > 0 && l < 0.01 * (double)s->tokens) o->collapsed = 1;
    }
    o->cv = mean > 0 ? sqrt(var / E) / mean : 0;
    o->max_vio = vio;
    o->active_ratio = (double)active / E;
    o->entropy = s->tokens ? s->entropy_sum / (double)s->tokens : 0;
    o->eff_experts = exp(o->entropy);
    o->drop_frac = (total + (double)s->dropped) > 0 ? (double)s->dropped / (total + (double)s->dropped) : 0;
}
