/* SR-MoE's surgical one-shot update (include/specmoe/methods/srmoe/srmoe.h; paper Sec. 4.3, Fig. 1):
 * the active expert chain of a sample and the gradient mask that keeps only that chain's experts.
 *
 * Letters: E experts per MoE layer, H expert hidden width, d input width, O output width,
 * L hidden layers per expert (the built-in expert blocks are [E, ...] contiguous, moe.h). */
#include "specmoe/methods/srmoe/srmoe.h"

#include <stdlib.h>
#include <string.h>

#include "specmoe/nn/moe.h"

int sm_srmoe_active_chain(const sm_model *m, int t, int *path) {
    const int n = sm_model_n_moe(m);
    for (int i = 0; i < n; i++) {
        const sm_moe *moe = sm_model_moe(m, i);
        path[i] = sm_argmax(moe->route.probs + (size_t)t * moe->E, moe->E); /* probs (T,E) */
    }
    return n;
}

/* one kept range [off, off + len) of the gradient block */
typedef struct {
    size_t off, len;
} keep_range;

static int cmp_range(const void *a, const void *b) {
    size_t x = ((const keep_range *)a)->off, y = ((const keep_range *)b)->off;
    return (x > y) - (x < y);
}

sm_status sm_srmoe_surgical_mask(sm_model *m, const int *path, sm_error *err) {
    /* an expert's tensors are 6 slices at most: w1, b1, wh, bh, w2, b2 */
    keep_range keep[6 * SM_MAX_LAYERS];
    int nk = 0;
    sm_real *g = m->params.grad;
    const int n = sm_model_n_moe(m);
    for (int i = 0; i < n; i++) {
        const sm_moe *moe = sm_model_moe(m, i);
        if (moe->experts) return sm_fail(err, SM_ERR_ARG, "srmoe surgical: MoE layer %d has factory experts (not supported)", i);
        const int e = path[i];
        if (e < 0 || e >= moe->E)
            return sm_fail(err, SM_ERR_ARG, "srmoe surgical: expert %d of MoE layer %d is out of range (E = %d)", e, i, moe->E);
        const size_t H = (size_t)moe->H, hid = moe->L > 1 ? (size_t)(moe->L - 1) : 0;
        /* per expert: w1 (H,d), b1 (H), wh (L-1,H,H), bh (L-1,H), w2 (O,H), b2 (O) */
        const struct {
            const sm_real *base;
            size_t per;
        } t[6] = {{moe->dw1, H * moe->d}, {moe->db1, H}, {moe->dwh, hid * H * H}, {moe->dbh, hid * H},
                  {moe->dw2, (size_t)moe->O * H}, {moe->db2, (size_t)moe->O}};
        for (int k = 0; k < 6; k++)
            if (t[k].base && t[k].per) keep[nk++] = (keep_range){(size_t)(t[k].base - g) + (size_t)e * t[k].per, t[k].per};
    }
    qsort(keep, (size_t)nk, sizeof keep[0], cmp_range);
    /* zero the complement of the kept ranges (they never overlap: distinct tensors or slices) */
    size_t at = 0;
    for (int k = 0; k < nk; k++) {
        if (keep[k].off > at) memset(g + at, 0, sizeof(sm_real) * (keep[k].off - at));
        at = keep[k].off + keep[k].len;
    }
    if (m->params.total > at) memset(g + at, 0, sizeof(sm_real) * (m->params.total - at));
    return SM_OK;
}
