/* Sparse upcycling (Komatsuzaki et al. 2023; CLIP-MoE's construction, SSMoE Sec. 4.3 / Table 7): an
 * MoE model made from a trained dense one by copying each FFN layer into every expert of an MoE layer
 * of the same hidden width. See include/specmoe/methods/ssmoe/ssmoe.h.
 *
 * Why the output is unchanged right after upcycling: with renormalised top-k weights (sum_e w_{t,e} =
 * 1) and identical experts, out_t = sum_{e in top-k} w_{t,e} FFN(x_t) = FFN(x_t), whatever the router.
 * The same identity makes the router's gradient vanish at the start of fine-tuning (dL/dw_{t,e} is
 * the same for every chosen e, and the renormalised weights' derivatives sum to zero), so a brief
 * fine-tune leaves the router close to its random initialisation: the learned routing is weak and
 * experts differ little - the regime the SSMoE paper says its method is for.
 *
 * Letters: E experts, H hidden width, F layer width.
 */
#include <stdio.h>
#include <string.h>

#include "specmoe/methods/ssmoe/ssmoe.h"

sm_model *sm_model_upcycle(const sm_model *dense, const sm_moe_config *moe, sm_rng *rng, sm_error *err) {
    const sm_model_config *dc = &dense->cfg;
    if (moe->n_shared != 0 || !moe->expert_bias || moe->depth > 1 || moe->out_dim != 0 || moe->act != dc->act ||
        !moe->router.renorm || moe->router.k < 1 || moe->router.k > moe->router.E) {
        sm_fail(err, SM_ERR_ARG, "upcycle: experts must be two-layer MLPs with biases, the dense model's activation, no "
                                 "shared experts, and renormalised top-k weights (1 <= k <= E)");
        return NULL;
    }
    sm_model_config mc = *dc;
    mc.moe = *moe;
    int n_ffn = 0;
    for (int i = 0; i < mc.n_layers; i++)
        if (mc.layers[i].kind == SM_LAYER_FFN) mc.layers[i].kind = SM_LAYER_MOE, n_ffn++;
        else if (mc.layers[i].kind == SM_LAYER_MOE) n_ffn = -1000;
    if (n_ffn < 1) {
        sm_fail(err, SM_ERR_ARG, "upcycle: the dense model needs at least one ffn layer and no moe layer");
        return NULL;
    }
    sm_model *m = sm_model_create(&mc, dense->max_T, rng, err); /* the routers' initialisation comes from rng */
    if (!m) return NULL;
    const int E = moe->router.E;
    for (int i = 0; i < m->params.n; i++) {
        const sm_param *q = &m->params.p[i];
        const char *ex = strstr(q->name, ".experts.");
        if (strstr(q->name, ".router.")) continue; /* no dense counterpart: keeps its random init */
        char src[SM_NAME_MAX + 8];
        if (ex) /* layers.<i>.experts.<w1|b1|w2|b2> (E, ...) <- layers.<i>.<w1|b1|w2|b2> */
            snprintf(src, sizeof src, "%.*s.%s", (int)(ex - q->name), q->name, ex + strlen(".experts."));
        else
            snprintf(src, sizeof src, "%s", q->name);
        int j = sm_params_find(&dense->params, src);
        size_t per = ex ? q->numel / (size_t)E : q->numel;
        if (j < 0 || dense->params.p[j].numel != per) {
            sm_fail(err, SM_ERR_MISMATCH, "upcycle: tensor '%s' has no dense counterpart '%s' of %zu values", q->name,
                    src, per);
            sm_model_free(m);
            return NULL;
        }
        sm_real *dst = sm_params_data(&m->params, i);
        for (int e = 0; e < (ex ? E : 1); e++)
            memcpy(dst + (size_t)e * per, sm_params_data(&dense->params, j), sizeof(sm_real) * per);
    }
    return m;
}
