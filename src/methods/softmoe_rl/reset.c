/* Resets and shrink-and-perturb of experts (include/specmoe/methods/softmoe_rl/reset.h). */
#include "specmoe/methods/softmoe_rl/reset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tensor i is "layers.<l>.<part>.*" of an MoE layer l: returns l, or -1 */
static int moe_tensor(const sm_model *m, const char *name, const char *part) {
    int l;
    char rest[SM_NAME_MAX];
    if (sscanf(name, "layers.%d.%95s", &l, rest) != 2 || l < 0 || l >= m->n_layers || !m->layers[l].moe) return -1;
    size_t n = strlen(part);
    return !strncmp(rest, part, n) && rest[n] == '.' ? l : -1;
}

size_t sm_moe_shrink_perturb(sm_model *m, sm_optim *opt, int layer, const int *experts, int n, int router,
                             double shrink, double perturb, sm_rng *rng) {
    sm_params *ps = &m->params;
    size_t changed = 0;
    for (int i = 0; i < ps->n; i++) {
        const sm_param *q = &ps->p[i];
        int le = moe_tensor(m, q->name, "experts"), lr = router ? moe_tensor(m, q->name, "router") : -1;
        if ((le < 0 && lr < 0) || (layer >= 0 && (le >= 0 ? le : lr) != layer)) continue;
        sm_real *fresh = malloc(sizeof(sm_real) * q->numel);
        if (!fresh) continue;
        sm_params_init_draw(ps, i, fresh, rng); /* the whole tensor: the same draw whatever is kept */
        sm_real *x = sm_params_data(ps, i);
        const int E = m->layers[le >= 0 ? le : lr].moe->E;
        /* expert tensors are (E, ...): expert e is the e-th block; router tensors change whole */
        const size_t block = le >= 0 ? q->numel / (size_t)E : q->numel;
        const int count = le >= 0 ? (experts ? n : E) : 1;
        for (int j = 0; j < count; j++) {
            const int e = le >= 0 ? (experts ? experts[j] : j) : 0;
            if (e < 0 || e >= (le >= 0 ? E : 1)) continue;
            const size_t from = (size_t)e * block;
            for (size_t k = from; k < from + block; k++) x[k] = (sm_real)(shrink * x[k] + perturb * fresh[k]);
            if (opt) {
                if (opt->m) memset(opt->m + q->offset + from, 0, sizeof(sm_real) * block);
                if (opt->v) memset(opt->v + q->offset + from, 0, sizeof(sm_real) * block);
            }
            changed += block;
        }
        free(fresh);
    }
    return changed;
}

int sm_moe_most_dormant(const sm_dormant_entry *e, int n, int l, int k, int *out) {
    int got = 0;
    /* the expert entries of layer l, picked by fraction (ties to the lower index) */
    for (; got < k; got++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            if (e[i].layer != l || e[i].expert < 0) continue;
            int taken = 0;
            for (int j = 0; j < got && !taken; j++) taken = out[j] == e[i].expert;
            if (!taken && (best < 0 || e[i].fraction > e[best].fraction)) best = i;
        }
        if (best < 0) break;
        out[got] = e[best].expert;
    }
    return got;
}

sm_status sm_model_prune_last(sm_model *m, int n, sm_error *err) {
    int found = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const sm_moe *q = m->layers[l].moe;
        if (!q) continue;
        found = 1;
        if (n > 0 && !q->router->ops->set_active)
            return sm_fail(err, SM_ERR_ARG, "prune: the %s router of layer %d cannot prune experts (soft can)",
                           q->router->ops->name, l);
        if (n < 0 || n >= q->E)
            return sm_fail(err, SM_ERR_ARG, "prune: %d of %d experts in layer %d (at least one must stay)", n, q->E, l);
    }
    if (!found && n > 0) return sm_fail(err, SM_ERR_ARG, "prune: the network has no MoE layer");
    for (int l = 0; l < m->n_layers; l++) {
        sm_moe *q = m->layers[l].moe;
        if (!q || !q->router->ops->set_active) continue;
        unsigned char on[1024];
        if (q->E > 1024) return sm_fail(err, SM_ERR_ARG, "prune: at most 1024 experts per layer");
        for (int e = 0; e < q->E; e++) on[e] = e < q->E - n;
        if (q->router->ops->set_active(q->router, on)) return sm_fail(err, SM_ERR_NOMEM, "prune: out of memory");
    }
    return SM_OK;
}

int sm_prune_count(int n, long from, long to, long f) {
    if (n <= 0 || f < from) return 0;
    if (n == 1 || to <= from) return n;
    /* k pruned when f >= from + (k - 1) (to - from) / (n - 1) */
    long k = 1 + (long)((double)(f - from) * (n - 1) / (double)(to - from));
    return k > n ? n : (int)k;
}
