/* Tokenisers of a conv encoder's output and the token pooling of the tokenised baseline: the pieces of
 * "Don't Flatten, Tokenize!" (SoftMoE in deep RL, papers/003, Sec. 3 and 4; Fig. 3, 5, 7). With the
 * modules of modules.c they give every scheme of the paper for an encoder output of (c, h, w) per
 * observation:
 *   PerConv    h*w tokens of width c        tokens                    (modules.c)
 *   PerFeat    c tokens of width h*w        perfeat                   (here: a reshape)
 *   PerPatch   (h/p)*(w/p) tokens of width c avgpool:p:p then tokens; the strided-conv variant:
 *                                            conv with stride p then tokens
 *   Shuffled   PerConv of a fixed permutation of the output: shuffle then tokens (here)
 *   flatten, global average pooling          flatten, gap              (modules.c)
 *   tokenised baseline (Fig. 5)              tokens (or perfeat) then tokpool sum|mean (here)
 *
 * Letters: B observations, C channels, P = h*w positions, R rows (tokens) per observation, F width.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/module_internal.h"

static void plain_destroy(sm_module *m) { free(m); }

/* ---- perfeat: c tokens of width h*w ----------------------------------------------------------- */
/* The CHW layout of one image is already (c rows of h*w): the data is copied as it is. */

static sm_status perfeat_declare(sm_module *m, sm_params *ps, sm_error *err) {
    (void)ps;
    if (sm_module_image_in(m, err) != SM_OK) return SM_ERR_ARG;
    m->out = sm_shape_vec(m->in.h * m->in.w);
    m->out.rows = m->in.c;
    return SM_OK;
}
static const sm_module_ops kPerFeat = {"perfeat", perfeat_declare, sm_module_no_reserve, NULL, sm_module_copy_forward,
                                       sm_module_add_backward, NULL,
                                       plain_destroy, NULL};

sm_module *sm_perfeat_module(const char *name, sm_error *err) { return sm_module_alloc(sizeof(sm_module), &kPerFeat, name, err); }

/* ---- shuffle: a fixed permutation of the encoder output --------------------------------------- */
/* The paper's Shuffled scheme "applies a fixed permutation on the encoder output" before PerConv.
 * The permutation is over all c*h*w values of an observation, not over the h*w positions: a fixed
 * reordering of whole positions would give the same tokens in another order, which SoftMoE treats
 * alike (dispatch and combine are equivariant in the tokens) and which the flattening dense layer
 * after it absorbs into its weights - it could not cost the performance the paper measures (Fig. 7).
 * Mixing channels across positions is what destroys the spatial structure. The output keeps the
 * input's shape: out[b][i] = in[b][perm[i]], perm drawn once from the seed (Fisher-Yates). */

typedef struct {
    sm_module base;
    uint64_t seed;
    int *perm; /* (c*h*w) */
} shuffle_mod;

static sm_status shuffle_declare(sm_module *m, sm_params *ps, sm_error *err) {
    (void)ps;
    shuffle_mod *s = (shuffle_mod *)m;
    if (sm_module_image_in(m, err) != SM_OK) return SM_ERR_ARG;
    m->out = m->in;
    const int n = (int)sm_shape_numel(m->in);
    free(s->perm);
    if (!(s->perm = malloc(sizeof(int) * (size_t)n))) return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", m->name);
    sm_rng rng;
    sm_rng_seed(&rng, s->seed);
    for (int i = 0; i < n; i++) s->perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)sm_rng_below(&rng, (uint32_t)i + 1), t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    return SM_OK;
}
static void shuffle_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    const shuffle_mod *s = (const shuffle_mod *)m;
    const size_t n = sm_shape_numel(m->in);
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < n; i++) out[b * n + i] = in[b * n + (size_t)s->perm[i]];
}
static void shuffle_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx, (void)in;
    if (!din) return;
    const shuffle_mod *s = (const shuffle_mod *)m;
    const size_t n = sm_shape_numel(m->in);
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < n; i++) din[b * n + (size_t)s->perm[i]] += dout[b * n + i];
}
static void shuffle_json(const sm_module *m, cJSON *o) {
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)((const shuffle_mod *)m)->seed);
    cJSON_AddStringToObject(o, "seed", seed); /* text: exact beyond 2^53 */
}
static void shuffle_destroy(sm_module *m) {
    free(((shuffle_mod *)m)->perm);
    free(m);
}
static const sm_module_ops kShuffle = {"shuffle", shuffle_declare, sm_module_no_reserve, NULL, shuffle_forward, shuffle_backward,
                                       shuffle_json, shuffle_destroy, NULL};

sm_module *sm_shuffle_module(const char *name, uint64_t seed, sm_error *err) {
    shuffle_mod *s = (shuffle_mod *)sm_module_alloc(sizeof *s, &kShuffle, name, err);
    if (s) s->seed = seed;
    return &s->base;
}

/* ---- tokpool: the sum or mean over an observation's tokens ------------------------------------ */
/* The tokenised baseline of Fig. 5: (R, F) -> (1, F), out[b] = sum_r in[b][r] (or / R). */

typedef struct {
    sm_module base;
    int mean;
} tokpool_mod;

static sm_status tokpool_declare(sm_module *m, sm_params *ps, sm_error *err) {
    (void)ps;
    if (m->in.rows < 1) return sm_fail(err, SM_ERR_ARG, "%s: no tokens", m->name);
    m->out = sm_shape_vec(sm_shape_width(m->in));
    return SM_OK;
}
static void tokpool_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx;
    const int R = m->in.rows, F = sm_shape_width(m->in);
    const sm_real scale = ((const tokpool_mod *)m)->mean ? (sm_real)1 / (sm_real)R : 1;
    for (int b = 0; b < B; b++) {
        sm_real *o = out + (size_t)b * F;
        memset(o, 0, sizeof(sm_real) * (size_t)F);
        for (int r = 0; r < R; r++) {
            const sm_real *x = in + ((size_t)b * R + r) * F;
            for (int f = 0; f < F; f++) o[f] += x[f];
        }
        for (int f = 0; f < F; f++) o[f] *= scale;
    }
}
static void tokpool_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    (void)ctx, (void)in;
    if (!din) return;
    const int R = m->in.rows, F = sm_shape_width(m->in);
    const sm_real scale = ((const tokpool_mod *)m)->mean ? (sm_real)1 / (sm_real)R : 1;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < R; r++) {
            sm_real *d = din + ((size_t)b * R + r) * F;
            const sm_real *g = dout + (size_t)b * F;
            for (int f = 0; f < F; f++) d[f] += scale * g[f];
        }
}
static void tokpool_json(const sm_module *m, cJSON *o) {
    cJSON_AddStringToObject(o, "pool", ((const tokpool_mod *)m)->mean ? "mean" : "sum");
}
static const sm_module_ops kTokPool = {"tokpool", tokpool_declare, sm_module_no_reserve, NULL, tokpool_forward, tokpool_backward,
                                       tokpool_json, plain_destroy, NULL};

sm_module *sm_tokpool_module(const char *name, int mean, sm_error *err) {
    tokpool_mod *t = (tokpool_mod *)sm_module_alloc(sizeof *t, &kTokPool, name, err);
    if (t) t->mean = mean != 0;
    return &t->base;
}
