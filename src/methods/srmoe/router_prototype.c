/* Prototype router of SR-MoE (Eq. 2): w_i = softmax_i(-dist(z, mu_i) / tau) with learnable prototypes
 * mu_i, dist Euclidean ||z - mu|| or, by flag (--proto-sq), squared ||z - mu||^2 (REFERENCE-NOTES: a
 * secondary summary says squared). tau is the gate temperature. Dense mixture over all K experts by
 * default (k = E), top-1 with k = 1; the shared softmax gate (gate.h) does the rest.
 *
 *   dist^2_te = ||z_t||^2 - 2 z_t . mu_e + ||mu_e||^2   (one GEMM)
 *
 * Letters: T tokens, d width, E experts (K in the paper).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/gate.h"
#include "specmoe/methods/srmoe/srmoe.h"
#include "specmoe/core/ops.h"

typedef struct {
    int imu;
    sm_real *mu, *dmu; /* (E,d) */
    sm_gate gate;
    sm_real *logits;   /* (T,E) -dist; reused for dlogits */
    sm_real *dist;     /* (T,E) dist (Euclidean) or dist^2 (squared) */
    sm_real *a;        /* (T,E) scratch */
    sm_real *zz;       /* (T) ||z||^2 */
    sm_real *mm;       /* (E) ||mu||^2 */
    sm_real *block;    /* the allocation the arrays above are carved from */
} proto_state;

static sm_status proto_declare(sm_router *r, sm_params *ps, const char *prefix, sm_error *err) {
    proto_state *s = calloc(1, sizeof *s);
    if (!s) return sm_fail(err, SM_ERR_NOMEM, "router: out of memory");
    r->state = s;
    char name[SM_NAME_MAX];
    int64_t shape[2] = {r->cfg.E, r->d};
    snprintf(name, sizeof name, "%s.prototypes", prefix);
    /* N(0,1): the router sees LayerNorm outputs, which have unit scale per feature */
    s->imu = sm_params_add(ps, name, 2, shape, SM_INIT_NORMAL, r->d, 1.0, SM_PARAM_NO_DECAY, err);
    return s->imu < 0 ? SM_ERR_ARG : SM_OK;
}

static void proto_bind(sm_router *r, const sm_params *ps) {
    proto_state *s = r->state;
    s->mu = sm_params_data(ps, s->imu);
    s->dmu = sm_params_grad(ps, s->imu);
}

static int proto_max_assign(const sm_router *r, int T) { return T * r->cfg.k; }

static sm_status proto_reserve(sm_router *r, int max_T, sm_error *err) {
    proto_state *s = r->state;
    size_t n = (size_t)max_T * r->cfg.E;
    size_t sizes[] = {n, n, n, (size_t)max_T, (size_t)r->cfg.E};
    sm_real **ptrs[] = {&s->logits, &s->dist, &s->a, &s->zz, &s->mm};
    s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router prototype (%d tokens)", max_T);
    if (!s->block) return SM_ERR_NOMEM;
    return sm_gate_init(&s->gate, &r->cfg, max_T, err);
}

static void proto_forward(sm_router *r, sm_route *route, const sm_real *z, int T, sm_rng *rng, int train) {
    (void)rng;
    (void)train;
    proto_state *s = r->state;
    const int E = r->cfg.E, d = r->d;
    for (int t = 0; t < T; t++) s->zz[t] = (sm_real)sm_sumsq(z + (size_t)t * d, (size_t)d);
    for (int e = 0; e < E; e++) s->mm[e] = (sm_real)sm_sumsq(s->mu + (size_t)e * d, (size_t)d);
    sm_gemm(0, 1, T, E, d, -2, z, d, s->mu, d, 0, s->dist, E); /* -2 z.mu */
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            size_t i = (size_t)t * E + e;
            sm_real d2 = s->dist[i] + s->zz[t] + s->mm[e];
            d2 = d2 > 0 ? d2 : 0; /* round-off can make a tiny distance negative */
            s->dist[i] = sm_proto_opts(&r->cfg)->proto_sq ? d2 : (sm_real)sqrt((double)d2 + 1e-12);
            s->logits[i] = -s->dist[i];
        }
    sm_gate_forward(&s->gate, route, s->logits, T);
}

static void proto_backward(sm_router *r, sm_real *dz, const sm_route *route, const sm_real *z, int T) {
    proto_state *s = r->state;
    const int E = r->cfg.E, d = r->d;
    sm_real *dl = s->logits;
    sm_gate_backward(&s->gate, dl, route, T);
    /* logit = -dist;  squared: d dist/dz = 2 (z - mu);  Euclidean: (z - mu) / dist.  With
     * a_te = -dl_te * c_te:  dz_t += (sum_e a_te) z_t - sum_e a_te mu_e;  dmu_e += (sum_t a_te) mu_e - sum_t a_te z_t */
    for (size_t i = 0; i < (size_t)T * E; i++) s->a[i] = -dl[i] * (sm_proto_opts(&r->cfg)->proto_sq ? 2 : 1 / s->dist[i]);
    for (int t = 0; t < T; t++) {
        sm_real rs = 0;
        for (int e = 0; e < E; e++) rs += s->a[(size_t)t * E + e];
        for (int j = 0; j < d; j++) dz[(size_t)t * d + j] += rs * z[(size_t)t * d + j];
    }
    sm_gemm(0, 0, T, d, E, -1, s->a, E, s->mu, d, 1, dz, d);
    for (int e = 0; e < E; e++) {
        sm_real cs = 0;
        for (int t = 0; t < T; t++) cs += s->a[(size_t)t * E + e];
        for (int j = 0; j < d; j++) s->dmu[(size_t)e * d + j] += cs * s->mu[(size_t)e * d + j];
    }
    sm_gemm(1, 0, E, d, T, -1, s->a, E, z, d, 1, s->dmu, d);
}

static void proto_destroy(sm_router *r) {
    proto_state *s = r->state;
    if (!s) return;
    sm_gate_free(&s->gate);
    free(s->block);
    free(s);
    r->state = NULL;
}

/* tau is the prototype gate's temperature: its flag --tau sets the shared temperature field (and
 * --temperature does not apply to this router) */
static const sm_router_opt kProtoOpts[] = {
    SM_ROUTER_OPT("temperature", "tau", SM_OPT_NUM, temperature, "1", "temperature tau (SR-MoE Eq. 2)", 1),
    SM_ROUTER_OWN_OPT(sm_proto_router_opts, "proto_sq", NULL, SM_OPT_BOOL, proto_sq, "0", "squared Euclidean distance"),
};

/* SR-MoE: a dense mixture by default */
static void proto_defaults(sm_router_config *c, const sm_router_given *g) {
    if (!g->given(g->user, "topk")) c->k = c->E;
}

const sm_router_ops sm_router_prototype_ops = {
    .name = "prototype", .kind = SM_ROUTE_SPARSE, .declare = proto_declare, .bind = proto_bind,
    .max_assign = proto_max_assign, .reserve = proto_reserve, .forward = proto_forward,
    .backward = proto_backward, .destroy = proto_destroy, .opts = kProtoOpts, .n_opts = SM_LEN(kProtoOpts),
    .defaults = proto_defaults,
};
