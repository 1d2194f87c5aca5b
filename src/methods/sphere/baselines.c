/* The plasticity baselines of SPHERE's comparison (include/specmoe/methods/sphere/baselines.h):
 * Parseval regularisation (PW), ReDo and continual backprop (CBP) on a model's hidden layers, C-CHAIN,
 * spectral normalisation (SN) and spectral regularisation (SR), the last two over one power-iteration
 * set of matrices (pow_set).
 *
 * Letters: r x c one weight matrix (rows are output units), H hidden units of a layer, In its fan-in,
 * O the width of the layer after it, N rows of the last forward. */
#include "specmoe/methods/sphere/baselines.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/ops.h"
#include "specmoe/nn/metrics.h"
#include "specmoe/nn/moe.h"
#include "specmoe/nn/module.h"
#include "specmoe/nn/router.h"

#define NO_BIAS ((size_t)-1)
#define MAX_UNIT_LAYERS 256

/* ---- PW: Parseval regularisation (Chung et al. 2024, Eq. 1: ||W W^T - s I||_F^2 per layer) -------- */

static int ends_with(const char *s, const char *t) {
    size_t n = strlen(s), k = strlen(t);
    return n >= k && !strcmp(s + n - k, t);
}

int sm_parseval_tensor(const sm_params *ps, int i) {
    const sm_param *q = &ps->p[i];
    if (ends_with(q->name, ".experts.w1") || ends_with(q->name, ".experts.wh") || ends_with(q->name, ".shared.w1"))
        return q->ndim >= 3;
    /* LayerNorm's factory experts (sm_model_config.hidden_ln): hidden layers are containers
     * experts.<e>.<j>.0.weight, the output layer a plain experts.<e>.<L>.weight */
    const char *x = strstr(q->name, ".experts.");
    int e, j;
    char rest[8];
    if (x && sscanf(x, ".experts.%d.%d.%7s", &e, &j, rest) == 3 && !strcmp(rest, "weight")) return 0;
    return q->ndim == 2 && ends_with(q->name, ".weight") && strncmp(q->name, "head.", 5) && !strstr(q->name, ".router.");
}

size_t sm_parseval_work_values(const sm_params *ps) {
    size_t most = 1;
    for (int i = 0; i < ps->n; i++) {
        if (!sm_parseval_tensor(ps, i)) continue;
        const sm_param *q = &ps->p[i];
        size_t r = (size_t)q->shape[q->ndim - 2], c = (size_t)q->shape[q->ndim - 1];
        if (r * r + r * c > most) most = r * r + r * c;
    }
    return most;
}

double sm_parseval_penalty(const sm_params *ps, sm_real *grad, double s, double coef, sm_real *work) {
    double total = 0;
    for (int i = 0; i < ps->n; i++) {
        if (!sm_parseval_tensor(ps, i)) continue;
        const sm_param *q = &ps->p[i];
        const int r = (int)q->shape[q->ndim - 2], c = (int)q->shape[q->ndim - 1];
        const size_t per = (size_t)r * c, count = q->numel / per;
        sm_real *M = work, *G = work + (size_t)r * r; /* M (r, r) = W W^T - s I; G (r, c) = M W */
        for (size_t k = 0; k < count; k++) {
            const sm_real *W = ps->data + q->offset + k * per;
            sm_gemm(0, 1, r, r, c, 1, W, c, W, c, 0, M, r);
            double f = 0;
            for (int a = 0; a < r; a++) {
                M[(size_t)a * r + a] -= (sm_real)s;
                for (int b = 0; b < r; b++) f += (double)M[(size_t)a * r + b] * M[(size_t)a * r + b];
            }
            total += f;
            if (!grad) continue;
            /* d ||M||^2 = 2 <M, dW W^T + W dW^T> = 4 <M W, dW> (M symmetric) */
            sm_gemm(0, 0, r, c, r, 1, M, r, W, c, 0, G, c);
            sm_real *g = grad + q->offset + k * per;
            for (size_t j = 0; j < per; j++) g[j] += (sm_real)(4 * coef * G[j]);
        }
    }
    return total;
}

/* ---- hidden units ----------------------------------------------------------------------------- */

int sm_unit_layers(sm_model *m, int T, sm_unit_layer *out, int max) {
    const sm_params *ps = &m->params;
    int n = 0;
    char name[SM_NAME_MAX];
    for (int l = 0; l < m->n_layers && n < max; l++) {
        const sm_layer *L = &m->layers[l];
        if (L->kind == SM_LAYER_DENSE && m->cfg.act != SM_ACT_NONE) {
            /* the next layer must read these units directly: a dense layer or the head */
            int last = l == m->n_layers - 1;
            if (!last && m->layers[l + 1].kind != SM_LAYER_DENSE) continue;
            snprintf(name, sizeof name, "layers.%d.weight", l);
            int wi = sm_params_find(ps, name);
            snprintf(name, sizeof name, "layers.%d.bias", l);
            int bi = sm_params_find(ps, name);
            if (last) snprintf(name, sizeof name, "head.weight");
            else snprintf(name, sizeof name, "layers.%d.weight", l + 1);
            int wo = sm_params_find(ps, name);
            if (last) snprintf(name, sizeof name, "head.bias");
            else snprintf(name, sizeof name, "layers.%d.bias", l + 1);
            int bo = sm_params_find(ps, name);
            if (wi < 0 || wo < 0 || ps->p[wi].ndim != 2 || ps->p[wo].ndim != 2) continue;
            out[n++] = (sm_unit_layer){.layer = l, .expert = -1, .depth = 0, .H = (int)ps->p[wi].shape[0],
                                       .In = (int)ps->p[wi].shape[1], .O = (int)ps->p[wo].shape[0], .rows = T > 0 ? T : 0, .t_in = wi,
                                       .in_off = ps->p[wi].offset, .bin_off = bi >= 0 ? ps->p[bi].offset : NO_BIAS,
                                       .out_off = ps->p[wo].offset, .bout_off = bo >= 0 ? ps->p[bo].offset : NO_BIAS,
                                       .h = sm_seq_output(m->body, l)};
        } else if (L->moe && !L->moe->experts && L->moe->route.kind == SM_ROUTE_SPARSE) {
            /* built-in MLP experts: hidden layer j of expert e reads w1[e] (j = 0) or wh[e, j-1] and is
             * read by wh[e, j] or w2[e] (j = L-1); its rows are the expert's assignments */
            sm_moe *q = L->moe;
            const int E = q->E, H = q->H, d = q->d, Ld = q->L, O = q->O;
            const sm_route *r = &q->route;
            for (int j = 0; j < Ld && n < max; j++) {
                /* T = 0: the layout only, before any forward has routed anything */
                const sm_real *h = T > 0 ? sm_moe_features_at(q, j, NULL) : NULL;
                for (int e = 0; e < E && n < max; e++) {
                    sm_unit_layer u = {.layer = l, .expert = e, .depth = j, .H = H};
                    if (h) u.rows = r->offset[e + 1] - r->offset[e], u.h = h + (size_t)r->offset[e] * H;
                    if (j == 0) {
                        u.t_in = q->ip[0], u.In = d;
                        u.in_off = ps->p[q->ip[0]].offset + (size_t)e * H * d;
                        u.bin_off = q->ip[1] >= 0 ? ps->p[q->ip[1]].offset + (size_t)e * H : NO_BIAS;
                    } else {
                        u.t_in = q->ip[8], u.In = H;
                        u.in_off = ps->p[q->ip[8]].offset + ((size_t)e * (Ld - 1) + j - 1) * H * H;
                        u.bin_off = q->ip[9] >= 0 ? ps->p[q->ip[9]].offset + ((size_t)e * (Ld - 1) + j - 1) * H : NO_BIAS;
                    }
                    if (j < Ld - 1) {
                        u.O = H;
                        u.out_off = ps->p[q->ip[8]].offset + ((size_t)e * (Ld - 1) + j) * H * H;
                        u.bout_off = q->ip[9] >= 0 ? ps->p[q->ip[9]].offset + ((size_t)e * (Ld - 1) + j) * H : NO_BIAS;
                    } else {
                        u.O = O;
                        u.out_off = ps->p[q->ip[2]].offset + (size_t)e * O * H;
                        u.bout_off = q->ip[3] >= 0 ? ps->p[q->ip[3]].offset + (size_t)e * O : NO_BIAS;
                    }
                    out[n++] = u;
                }
            }
        }
    }
    return n;
}

/* clears Adam's moments of n values from offset off on, every stride-th */
static void clear_moments(sm_optim *opt, size_t off, size_t n, size_t stride) {
    if (!opt) return;
    for (size_t k = 0; k < n; k++) {
        if (opt->m) opt->m[off + k * stride] = 0;
        if (opt->v) opt->v[off + k * stride] = 0;
    }
}

void sm_unit_reinit(sm_model *m, sm_optim *opt, const sm_unit_layer *L, const int *units, int n, sm_rng *rng) {
    if (n <= 0) return;
    sm_params *ps = &m->params;
    const sm_param *t = &ps->p[L->t_in];
    /* fresh rows of the incoming tensor's initialiser, drawn row by row (the values of an element-wise
     * initialiser are independent); a Stiefel tensor's frames only come whole: a whole draw then */
    sm_real *fresh = NULL;
    if (t->init == SM_INIT_STIEFEL) {
        if (!(fresh = malloc(sizeof(sm_real) * t->numel))) return;
        sm_params_init_draw(ps, L->t_in, fresh, rng);
    }
    const size_t block = L->in_off - t->offset;
    for (int k = 0; k < n; k++) {
        const int u = units[k];
        sm_real *w = ps->data + L->in_off + (size_t)u * L->In;
        if (fresh) memcpy(w, fresh + block + (size_t)u * L->In, sizeof(sm_real) * L->In);
        else sm_params_init_draw_n(ps, L->t_in, (size_t)L->In, w, rng);
        clear_moments(opt, L->in_off + (size_t)u * L->In, L->In, 1);
        if (L->bin_off != NO_BIAS) {
            ps->data[L->bin_off + u] = 0;
            clear_moments(opt, L->bin_off + u, 1, 1);
        }
        for (int o = 0; o < L->O; o++) ps->data[L->out_off + (size_t)o * L->H + u] = 0;
        clear_moments(opt, L->out_off + u, L->O, L->H);
    }
    free(fresh);
}

/* ---- ReDo (Sokar et al. 2023, Sec. 4: s_i = E|h_i| / (1/H sum_k E|h_k|), dormant when s_i <= tau) -- */

int sm_redo(sm_model *m, sm_optim *opt, int T, double tau, sm_rng *rng) {
    sm_unit_layer L[MAX_UNIT_LAYERS];
    const int nl = sm_unit_layers(m, T, L, MAX_UNIT_LAYERS);
    int total = 0;
    /* deepest layer first: a unit's fresh incoming row would otherwise bring back the outgoing
     * weights of a dormant unit of the layer below it, which must stay zero */
    for (int i = nl - 1; i >= 0; i--) {
        if (L[i].rows < 1) continue;
        double *score = malloc(sizeof(double) * L[i].H);
        int *units = malloc(sizeof(int) * L[i].H), n = 0;
        if (score && units) {
            sm_dormant_fraction(L[i].h, L[i].rows, L[i].H, tau, score);
            for (int u = 0; u < L[i].H; u++)
                if (score[u] <= tau) units[n++] = u;
            sm_unit_reinit(m, opt, &L[i], units, n, rng);
            total += n;
        }
        free(score), free(units);
    }
    return total;
}

/* ---- CBP (Dohare et al. 2024, Methods "Continual backpropagation"; their GnT with its defaults) ---- */

struct sm_cbp {
    double rate, decay;
    int maturity, n_layers;
    int off[MAX_UNIT_LAYERS + 1]; /* unit u of layer i is entry off[i] + u of the arrays below */
    double *util, *mean;          /* (units) running utility and mean activation */
    long *age;                    /* (units) */
};

sm_cbp *sm_cbp_create(sm_model *m, double rate, double decay, int maturity, sm_error *err) {
    if (!(rate >= 0 && rate <= 1) || !(decay >= 0 && decay < 1) || maturity < 0) {
        sm_fail(err, SM_ERR_ARG, "cbp: replacement rate %g must be in [0, 1], decay %g in [0, 1), maturity %d >= 0", rate,
                decay, maturity);
        return NULL;
    }
    sm_unit_layer L[MAX_UNIT_LAYERS];
    /* the layers are known before any forward: their shapes do not depend on T */
    const int nl = sm_unit_layers(m, 0, L, MAX_UNIT_LAYERS);
    if (nl == 0) {
        sm_fail(err, SM_ERR_ARG, "cbp: the network has no hidden units it can replace (dense layers with an activation "
                "followed by a dense layer or the head, or built-in MLP experts)");
        return NULL;
    }
    sm_cbp *c = calloc(1, sizeof *c);
    if (!c) {
        sm_fail(err, SM_ERR_NOMEM, "cbp: out of memory");
        return NULL;
    }
    c->rate = rate, c->decay = decay, c->maturity = maturity, c->n_layers = nl;
    for (int i = 0; i < nl; i++) c->off[i + 1] = c->off[i] + L[i].H;
    const int U = c->off[nl];
    c->util = calloc((size_t)U, sizeof(double));
    c->mean = calloc((size_t)U, sizeof(double));
    c->age = calloc((size_t)U, sizeof(long));
    if (!c->util || !c->mean || !c->age) {
        sm_cbp_free(c);
        sm_fail(err, SM_ERR_NOMEM, "cbp: out of memory for %d units", U);
        return NULL;
    }
    return c;
}

void sm_cbp_free(sm_cbp *c) {
    if (!c) return;
    free(c->util), free(c->mean), free(c->age), free(c);
}

int sm_cbp_step(sm_cbp *c, sm_model *m, sm_optim *opt, int T, sm_rng *rng) {
    sm_unit_layer L[MAX_UNIT_LAYERS];
    const int nl = sm_unit_layers(m, T, L, MAX_UNIT_LAYERS);
    if (nl != c->n_layers) return 0;
    sm_real *P = m->params.data;
    int total = 0;
    /* deepest layer first, as ReDo: every replaced unit ends with zero outgoing weights */
    for (int i = nl - 1; i >= 0; i--) {
        const sm_unit_layer *l = &L[i];
        double *util = c->util + c->off[i], *mean = c->mean + c->off[i];
        long *age = c->age + c->off[i];
        int mature = 0;
        for (int u = 0; u < l->H; u++) {
            age[u]++;
            /* an expert no example chose this step contributes no activations: its statistics wait */
            if (l->rows > 0) {
                double a = 0, f = 0, w = 0;
                for (int t = 0; t < l->rows; t++) {
                    double x = l->h[(size_t)t * l->H + u];
                    a += fabs(x), f += x;
                }
                a /= l->rows, f /= l->rows;
                for (int o = 0; o < l->O; o++) w += fabs((double)P[l->out_off + (size_t)o * l->H + u]);
                util[u] = c->decay * util[u] + (1 - c->decay) * a * w;
                mean[u] = c->decay * mean[u] + (1 - c->decay) * f;
            }
            mature += age[u] > c->maturity;
        }
        if (!mature) continue;
        /* GnT's default (accumulate off): n = rate * mature; below 1 it is 1 with probability n */
        double want = c->rate * mature;
        int k = (int)want;
        if (k == 0 && want > 0 && sm_rng_uniform(rng) <= want) k = 1;
        if (k == 0) continue;
        int *pick = malloc(sizeof(int) * (size_t)k);
        if (!pick) continue;
        /* the k mature units with the lowest bias-corrected utility (ties: the lower index) */
        int got = 0;
        for (; got < k; got++) {
            int best = -1;
            double bu = 0;
            for (int u = 0; u < l->H; u++) {
                if (age[u] <= c->maturity) continue;
                int taken = 0;
                for (int j = 0; j < got && !taken; j++) taken = pick[j] == u;
                if (taken) continue;
                double cu = util[u] / (1 - pow(c->decay, (double)age[u]));
                if (best < 0 || cu < bu) best = u, bu = cu;
            }
            if (best < 0) break;
            pick[got] = best;
        }
        /* the next layer's bias takes the replaced unit's mean contribution, so the output changes
         * little (GnT's bias correction), before its outgoing weights are zeroed */
        for (int j = 0; j < got; j++) {
            const int u = pick[j];
            const double f = mean[u] / (1 - pow(c->decay, (double)age[u]));
            if (l->bout_off != NO_BIAS)
                for (int o = 0; o < l->O; o++) P[l->bout_off + o] += (sm_real)(P[l->out_off + (size_t)o * l->H + u] * f);
            util[u] = mean[u] = 0, age[u] = 0;
        }
        sm_unit_reinit(m, opt, l, pick, got, rng);
        total += got;
        free(pick);
    }
    return total;
}

/* ---- C-CHAIN (Tang et al. 2025; CHAIN, Tang & Berseth 2024: churn on a reference batch) ---------- */
/* The coefficient's schedule of the authors' PPO code (baselines.h) */
#define CCHAIN_INIT 100.0 /* lambda of a launch's first updates */
#define CCHAIN_WARMUP 50  /* updates before the adaptive lambda */

double sm_churn_loss(sm_real *dout, const sm_real *out, const sm_real *target, int n, int A) {
    double L = 0;
    for (size_t i = 0; i < (size_t)n * A; i++) {
        const double d = (double)out[i] - target[i];
        L += d * d;
        if (dout) dout[i] = (sm_real)(2 * d / n);
    }
    return n > 0 ? L / n : 0;
}

/* The backward of m from the output gradient already in m->dlogits into the view pv, with the
 * routers' auxiliary losses left out (the base backward counts them once). */
static void backward_without_aux(sm_model *m, const sm_params *pv, int T) {
    const int n_moe = sm_model_n_moe(m);
    double aux[16][2];
    for (int i = 0; i < n_moe && i < 16; i++) {
        sm_router_config *rc = &sm_model_moe(m, i)->router->cfg;
        aux[i][0] = rc->balance_coef, aux[i][1] = rc->zloss_coef;
        rc->balance_coef = rc->zloss_coef = 0;
    }
    sm_model_backward_into(m, pv, T);
    for (int i = 0; i < n_moe && i < 16; i++) {
        sm_router_config *rc = &sm_model_moe(m, i)->router->cfg;
        rc->balance_coef = aux[i][0], rc->zloss_coef = aux[i][1];
    }
}

/* ---- power iteration on a set of matrices (shared by SN and SR) --------------------------------- */

/* The matrices a baseline selects (every (.., r, c) slice of a selected tensor is one), each with
 * persistent power-iteration vectors u (r), v (c) and its last sigma = u^T W v. */
typedef struct {
    int n;            /* matrices */
    int *tensor;      /* (n) their tensor and slice */
    size_t *slice;
    int *rows, *cols;
    sm_real *u, *v;   /* the n matrices' u (r) and v (c), one block each */
    size_t *uoff, *voff;
    double *sigma;    /* (n) */
} pow_set;

static void sn_normalize(sm_real *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    s = sqrt(s) + 1e-12; /* torch's eps */
    for (int i = 0; i < n; i++) x[i] = (sm_real)(x[i] / s);
}

/* iters power iterations on W (r, c): v = W^T u / |.|, u = W v / |.|; returns sigma = u^T W v */
static double sn_power(const sm_real *W, sm_real *u, sm_real *v, int r, int c, int iters) {
    for (int it = 0; it < iters; it++) {
        sm_gemm(1, 0, c, 1, r, 1, W, c, u, 1, 0, v, 1);
        sn_normalize(v, c);
        sm_gemm(0, 0, r, 1, c, 1, W, c, v, 1, 0, u, 1);
        sn_normalize(u, r);
    }
    double s = 0;
    for (int i = 0; i < r; i++) {
        double wv = 0;
        for (int j = 0; j < c; j++) wv += (double)W[(size_t)i * c + j] * v[j];
        s += u[i] * wv;
    }
    return s;
}

static void pow_set_free(pow_set *s) {
    free(s->tensor), free(s->slice), free(s->rows), free(s->cols), free(s->u), free(s->v), free(s->uoff), free(s->voff);
    free(s->sigma);
    memset(s, 0, sizeof *s);
}

/* The matrices of the tensors select picks, u drawn from rng and 15 power iterations on each (torch's
 * start); 0, or -1 with err set (who names the baseline). */
static int pow_set_init(pow_set *s, const sm_params *ps, int (*select)(const sm_params *, int), sm_rng *rng, const char *who,
                        const char *what, sm_error *err) {
    int n = 0;
    size_t nu = 0, nv = 0;
    memset(s, 0, sizeof *s);
    for (int i = 0; i < ps->n; i++) {
        if (!select(ps, i)) continue;
        const sm_param *q = &ps->p[i];
        const size_t r = (size_t)q->shape[q->ndim - 2], c = (size_t)q->shape[q->ndim - 1], k = q->numel / (r * c);
        n += (int)k, nu += k * r, nv += k * c;
    }
    if (n == 0) {
        sm_fail(err, SM_ERR_ARG, "%s: the network has no %s", who, what);
        return -1;
    }
    s->tensor = malloc(sizeof(int) * n), s->slice = malloc(sizeof(size_t) * n), s->rows = malloc(sizeof(int) * n);
    s->cols = malloc(sizeof(int) * n), s->u = malloc(sizeof(sm_real) * nu), s->v = malloc(sizeof(sm_real) * nv);
    s->uoff = malloc(sizeof(size_t) * n), s->voff = malloc(sizeof(size_t) * n), s->sigma = malloc(sizeof(double) * n);
    if (!s->tensor || !s->slice || !s->rows || !s->cols || !s->u || !s->v || !s->uoff || !s->voff || !s->sigma) {
        pow_set_free(s);
        sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", who);
        return -1;
    }
    nu = nv = 0;
    for (int i = 0; i < ps->n; i++) {
        if (!select(ps, i)) continue;
        const sm_param *q = &ps->p[i];
        const int r = (int)q->shape[q->ndim - 2], c = (int)q->shape[q->ndim - 1];
        const size_t k = q->numel / ((size_t)r * c);
        for (size_t j = 0; j < k; j++, s->n++) {
            const int t = s->n;
            s->tensor[t] = i, s->slice[t] = j, s->rows[t] = r, s->cols[t] = c, s->uoff[t] = nu, s->voff[t] = nv;
            sm_real *u = s->u + nu;
            for (int a = 0; a < r; a++) u[a] = (sm_real)sm_rng_normal(rng);
            sn_normalize(u, r);
            s->sigma[t] = sn_power(ps->data + q->offset + j * r * c, u, s->v + nv, r, c, 15);
            nu += r, nv += c;
        }
    }
    return 0;
}

/* A baseline's object of size bytes whose first member is its pow_set, that set initialised over the
 * tensors select picks (pow_set_init); NULL with err set. */
static void *pow_owner_create(size_t bytes, const sm_params *ps, int (*select)(const sm_params *, int), sm_rng *rng,
                              const char *who, const char *what, sm_error *err) {
    pow_set *s = calloc(1, bytes);
    if (!s) {
        sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", who);
        return NULL;
    }
    if (pow_set_init(s, ps, select, rng, who, what, err)) {
        free(s);
        return NULL;
    }
    return s;
}

/* matrix t of the set in a block laid out as the parameters (data or grad) */
static sm_real *pow_matrix(const pow_set *s, const sm_params *ps, sm_real *base, int t) {
    return base + ps->p[s->tensor[t]].offset + s->slice[t] * (size_t)s->rows[t] * s->cols[t];
}

static double pow_sigma_max(const pow_set *s) {
    double mx = 0;
    for (int t = 0; t < s->n; t++) mx = s->sigma[t] > mx ? s->sigma[t] : mx;
    return mx;
}

/* the state a resume needs (u, v, sigma) as (pointer, bytes) pairs from ptr[n]; returns the new n */
static int pow_parts(const pow_set *s, void **ptr, size_t *len, int n) {
    const size_t nu = s->uoff[s->n - 1] + (size_t)s->rows[s->n - 1], nv = s->voff[s->n - 1] + (size_t)s->cols[s->n - 1];
    ptr[n] = s->u, len[n++] = sizeof(sm_real) * nu;
    ptr[n] = s->v, len[n++] = sizeof(sm_real) * nv;
    ptr[n] = s->sigma, len[n++] = sizeof(double) * (size_t)s->n;
    return n;
}

/* ---- SN: spectral normalisation (Miyato et al. 2018, Eq. 20 and Algorithm 1) ---------------------- */

struct sm_sn {
    pow_set m; /* first: pow_owner_create */
};

void sm_sn_backward(sm_real *dW, const sm_real *G, const sm_real *Wsn, const sm_real *u, const sm_real *v, double sigma, int r,
                    int c) {
    double gw = 0;
    for (size_t i = 0; i < (size_t)r * c; i++) gw += (double)G[i] * Wsn[i];
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) {
            const size_t k = (size_t)i * c + j;
            dW[k] = (sm_real)((G[k] - gw * u[i] * v[j]) / sigma);
        }
}

void sm_sn_free(sm_sn *s) {
    if (!s) return;
    pow_set_free(&s->m);
    free(s);
}

sm_sn *sm_sn_create(sm_model *m, sm_rng *rng, sm_error *err) {
    sm_sn *s = pow_owner_create(sizeof *s, &m->params, sm_parseval_tensor, rng, "sn", "hidden weight matrix to normalise", err);
    if (!s) return NULL;
    for (int t = 0; t < s->m.n; t++) {
        sm_real *W = pow_matrix(&s->m, &m->params, m->params.data, t);
        for (size_t e = 0; e < (size_t)s->m.rows[t] * s->m.cols[t]; e++) W[e] = (sm_real)(W[e] / s->m.sigma[t]);
    }
    return s;
}

void sm_sn_to_raw(sm_sn *s, sm_model *m) {
    const sm_params *ps = &m->params;
    const pow_set *p = &s->m;
    for (int t = 0; t < p->n; t++) {
        const size_t rc = (size_t)p->rows[t] * p->cols[t];
        sm_real *W = pow_matrix(p, ps, ps->data, t), *G = pow_matrix(p, ps, ps->grad, t);
        /* dW overwrites G in place: sm_sn_backward reads G[k] before writing dW[k], after the <G, Wsn> sum */
        sm_sn_backward(G, G, W, p->u + p->uoff[t], p->v + p->voff[t], p->sigma[t], p->rows[t], p->cols[t]);
        for (size_t e = 0; e < rc; e++) W[e] = (sm_real)(W[e] * p->sigma[t]);
    }
}

void sm_sn_from_raw(sm_sn *s, sm_model *m) {
    const sm_params *ps = &m->params;
    pow_set *p = &s->m;
    for (int t = 0; t < p->n; t++) {
        const size_t rc = (size_t)p->rows[t] * p->cols[t];
        sm_real *W = pow_matrix(p, ps, ps->data, t);
        p->sigma[t] = sn_power(W, p->u + p->uoff[t], p->v + p->voff[t], p->rows[t], p->cols[t], 1);
        for (size_t e = 0; e < rc; e++) W[e] = (sm_real)(W[e] / p->sigma[t]);
    }
}

double sm_sn_sigma_max(const sm_sn *s) { return pow_sigma_max(&s->m); }

/* ---- SR: spectral regularisation (Lewandowski et al. 2025: lambda sum_l (sigma_max(W_l)^k - 1)^2) ---- */

/* every weight matrix: 2-D `.weight` tensors (dense, gate, router, head, LN experts' layers) and the
 * built-in experts' blocks, one (r, c) matrix per expert and layer */

int sm_specreg_tensor(const sm_params *ps, int i) {
    const sm_param *q = &ps->p[i];
    if (ends_with(q->name, ".experts.w1") || ends_with(q->name, ".experts.wh") || ends_with(q->name, ".experts.w2") ||
        ends_with(q->name, ".shared.w1") || ends_with(q->name, ".shared.w2"))
        return q->ndim >= 3;
    return q->ndim == 2 && ends_with(q->name, ".weight");
}

/* (s^k - 1)^2 of one matrix at sigma = s, and coef times its gradient added into dW (r, c; NULL: value
 * only): d (s^k - 1)^2 / dW = 2 (s^k - 1) k s^(k-1) ds/dW with ds/dW = u v^T, u (r), v (c) constants
 * (s >= 0 from a power iteration, so a non-integer k is defined) */
static double sr_apply(sm_real *dW, const sm_real *u, const sm_real *v, int r, int c, double s, double k, double coef) {
    const double sk = pow(s, k);
    if (dW) sm_gemm(0, 0, r, c, 1, (sm_real)(coef * 2 * (sk - 1) * k * pow(s, k - 1)), u, 1, v, c, 1, dW, c);
    return (sk - 1) * (sk - 1);
}

double sm_specreg_term(sm_real *dW, const sm_real *W, const sm_real *u, const sm_real *v, int r, int c, double k, double coef,
                       double *sigma) {
    double s = 0;
    for (int i = 0; i < r; i++) {
        double wv = 0;
        for (int j = 0; j < c; j++) wv += (double)W[(size_t)i * c + j] * v[j];
        s += u[i] * wv;
    }
    if (sigma) *sigma = s;
    return sr_apply(dW, u, v, r, c, s, k, coef);
}

struct sm_specreg {
    pow_set m; /* first: pow_owner_create */
    double coef, k;
};

sm_specreg *sm_specreg_create(sm_model *m, double coef, double k, sm_rng *rng, sm_error *err) {
    /* k >= 1: sigma^(k-1) in the gradient stays finite at sigma = 0 (a zero matrix) */
    if (!(coef >= 0 && isfinite(coef)) || !(k >= 1 && isfinite(k))) {
        sm_fail(err, SM_ERR_ARG, "specreg: lambda %g must be a number >= 0 and the exponent k %g >= 1", coef, k);
        return NULL;
    }
    sm_specreg *s = pow_owner_create(sizeof *s, &m->params, sm_specreg_tensor, rng, "specreg", "weight matrix to regularise", err);
    if (!s) return NULL;
    s->coef = coef, s->k = k;
    return s;
}

void sm_specreg_free(sm_specreg *s) {
    if (!s) return;
    pow_set_free(&s->m);
    free(s);
}

double sm_specreg_grad(sm_specreg *s, sm_model *m) {
    const sm_params *ps = &m->params;
    pow_set *p = &s->m;
    double total = 0;
    for (int t = 0; t < p->n; t++) {
        const sm_real *W = pow_matrix(p, ps, ps->data, t);
        sm_real *u = p->u + p->uoff[t], *v = p->v + p->voff[t];
        p->sigma[t] = sn_power(W, u, v, p->rows[t], p->cols[t], 1);
        total += sr_apply(pow_matrix(p, ps, ps->grad, t), u, v, p->rows[t], p->cols[t], p->sigma[t], s->k, s->coef);
    }
    return total;
}

double sm_specreg_sigma_max(const sm_specreg *s) { return pow_sigma_max(&s->m); }

/* ---- together --------------------------------------------------------------------------------- */

#define CCHAIN_WINDOW 100 /* C-CHAIN: updates the adaptive lambda averages over */

struct sm_baselines {
    sm_baselines_config c;
    sm_real *work;  /* PW scratch */
    sm_cbp *cbp;
    sm_sn *sn;
    sm_specreg *sr;
    long steps;     /* optimiser steps seen (ReDo's period) */
    double pw_sum, sr_sum;  /* since the last stats */
    long pw_n, redo_n, cbp_n, sr_n;
    /* C-CHAIN */
    sm_model *prev;       /* the parameters before the last optimiser step (same config) */
    int have_prev;
    sm_real *gchurn;      /* (P) the churn's gradient of this step */
    sm_real *target;      /* (max_T, V) prev's outputs on the reference rows */
    double churn;         /* this step's L_churn (NAN: none) */
    double ch_sum, coef_sum;
    long ch_n;
    double coef;          /* lambda of the coming steps */
    double last_main, last_churn; /* the last step's |L_main| and L_churn */
    long updates;         /* updates ended in this launch */
    double win_main[CCHAIN_WINDOW], win_churn[CCHAIN_WINDOW]; /* the last updates' values, a ring */
};

sm_baselines *sm_baselines_create(const sm_baselines_config *c, sm_model *m, sm_rng *rng, sm_error *err) {
    if (c->pw && !(c->pw_coef >= 0 && isfinite(c->pw_scale))) {
        sm_fail(err, SM_ERR_ARG, "pw: coefficient %g must be >= 0 and the scale %g finite", c->pw_coef, c->pw_scale);
        return NULL;
    }
    if (c->redo && (c->redo_every < 1 || !(c->redo_tau >= 0))) {
        sm_fail(err, SM_ERR_ARG, "redo: the period %d must be >= 1 and tau %g >= 0", c->redo_every, c->redo_tau);
        return NULL;
    }
    sm_baselines *b = calloc(1, sizeof *b);
    if (!b) {
        sm_fail(err, SM_ERR_NOMEM, "baselines: out of memory");
        return NULL;
    }
    b->c = *c;
    int any_pw = 0;
    for (int i = 0; i < m->params.n; i++) any_pw |= sm_parseval_tensor(&m->params, i);
    sm_unit_layer L[MAX_UNIT_LAYERS];
    if (c->pw && !any_pw) {
        sm_fail(err, SM_ERR_ARG, "pw: the network has no hidden weight matrix to regularise");
        goto fail;
    }
    if (c->pw && !(b->work = malloc(sizeof(sm_real) * sm_parseval_work_values(&m->params)))) {
        sm_fail(err, SM_ERR_NOMEM, "pw: out of memory");
        goto fail;
    }
    if (c->redo && sm_unit_layers(m, 0, L, MAX_UNIT_LAYERS) == 0) {
        sm_fail(err, SM_ERR_ARG, "redo: the network has no hidden units it can reset (dense layers with an activation "
                "followed by a dense layer or the head, or built-in MLP experts)");
        goto fail;
    }
    if (c->cbp && !(b->cbp = sm_cbp_create(m, c->cbp_rate, c->cbp_decay, c->cbp_maturity, err))) goto fail;
    if (c->sn && !(b->sn = sm_sn_create(m, rng, err))) goto fail;
    if (c->specreg > 0 && !(b->sr = sm_specreg_create(m, c->specreg, c->specreg_k, rng, err))) goto fail;
    b->churn = NAN;
    if (c->cchain) {
        if (!(c->cchain_ratio >= 0)) {
            sm_fail(err, SM_ERR_ARG, "cchain: the ratio %g must be >= 0", c->cchain_ratio);
            goto fail;
        }
        sm_error e;
        if (!(b->prev = sm_model_create(&m->cfg, m->max_T, NULL, &e))) {
            sm_fail(err, e.code, "cchain: the copy of the network: %s", e.msg);
            goto fail;
        }
        b->coef = CCHAIN_INIT;
        b->gchurn = malloc(sizeof(sm_real) * m->params.total);
        b->target = malloc(sizeof(sm_real) * (size_t)m->max_T * m->cfg.n_classes);
        if (!b->gchurn || !b->target) {
            sm_fail(err, SM_ERR_NOMEM, "cchain: out of memory");
            goto fail;
        }
    }
    return b;
fail:
    sm_baselines_free(b);
    return NULL;
}

void sm_baselines_free(sm_baselines *b) {
    if (!b) return;
    sm_cbp_free(b->cbp);
    sm_sn_free(b->sn);
    sm_specreg_free(b->sr);
    sm_model_free(b->prev);
    free(b->gchurn), free(b->target);
    free(b->work), free(b);
}

void sm_baselines_churn(sm_baselines *b, sm_model *m, const float *x, int n) {
    if (!b || !b->prev) return;
    b->churn = NAN;
    if (!b->have_prev || n < 1) return;
    const int V = m->cfg.n_classes;
    memcpy(b->target, sm_model_forward(b->prev, x, n, NULL, 0), sizeof(sm_real) * (size_t)n * V);
    const sm_real *out = sm_model_forward(m, x, n, NULL, 1);
    b->churn = sm_churn_loss(m->dlogits, out, b->target, n, V);
    memset(b->gchurn, 0, sizeof(sm_real) * m->params.total);
    sm_params view = sm_params_view(&m->params, b->gchurn);
    backward_without_aux(m, &view, n);
}

void sm_baselines_grad(sm_baselines *b, sm_model *m, double loss_main) {
    if (!b) return;
    if (b->c.pw) {
        b->pw_sum += sm_parseval_penalty(&m->params, m->params.grad, b->c.pw_scale, b->c.pw_coef, b->work);
        b->pw_n++;
    }
    if (b->sr) {
        b->sr_sum += sm_specreg_grad(b->sr, m);
        b->sr_n++;
    }
    if (!b->prev) return;
    b->last_main = fabs(loss_main), b->last_churn = isnan(b->churn) ? 0 : b->churn;
    if (!isnan(b->churn)) {
        for (size_t i = 0; i < m->params.total; i++) m->params.grad[i] += (sm_real)(b->coef * b->gchurn[i]);
        b->ch_sum += b->churn, b->coef_sum += b->coef, b->ch_n++;
    }
    memcpy(b->prev->params.data, m->params.data, sizeof(sm_real) * m->params.total);
    b->have_prev = 1;
}

void sm_baselines_end_update(sm_baselines *b, double frac) {
    if (!b || !b->prev) return;
    const int w = (int)(b->updates % CCHAIN_WINDOW);
    b->win_main[w] = b->last_main, b->win_churn[w] = b->last_churn;
    b->updates++;
    if (b->updates < CCHAIN_WARMUP) return;
    /* the churn term kept at beta times the main loss's size, over the last updates */
    const long n = b->updates < CCHAIN_WINDOW ? b->updates : CCHAIN_WINDOW;
    double sm = 0, sc = 0;
    for (long i = 0; i < n; i++) sm += b->win_main[i], sc += b->win_churn[i];
    b->coef = b->c.cchain_ratio * (sm / n) / (sc / n + 1e-8) * frac;
}

void sm_baselines_before_step(sm_baselines *b, sm_model *m) {
    if (b && b->sn) sm_sn_to_raw(b->sn, m);
}

void sm_baselines_after_step(sm_baselines *b, sm_model *m, sm_optim *opt, int T, sm_rng *rng) {
    if (!b) return;
    if (b->sn) sm_sn_from_raw(b->sn, m);
    b->steps++;
    if (b->cbp) b->cbp_n += sm_cbp_step(b->cbp, m, opt, T, rng);
    if (b->c.redo && b->steps % b->c.redo_every == 0) b->redo_n += sm_redo(m, opt, T, b->c.redo_tau, rng);
}

/* The state's pieces in one order for both directions: (pointer, bytes) pairs into parts (at most
 * STATE_PARTS). */
#define STATE_PARTS 24
static int state_parts(const sm_baselines *b, void **ptr, size_t *len) {
    int n = 0;
    ptr[n] = (void *)&b->steps, len[n++] = sizeof b->steps;
    if (b->cbp) {
        const size_t U = (size_t)b->cbp->off[b->cbp->n_layers];
        ptr[n] = b->cbp->util, len[n++] = sizeof(double) * U;
        ptr[n] = b->cbp->mean, len[n++] = sizeof(double) * U;
        ptr[n] = b->cbp->age, len[n++] = sizeof(long) * U;
    }
    if (b->sn) n = pow_parts(&b->sn->m, ptr, len, n);
    if (b->sr) n = pow_parts(&b->sr->m, ptr, len, n);
    if (b->prev) {
        ptr[n] = (void *)&b->have_prev, len[n++] = sizeof b->have_prev;
        ptr[n] = b->prev->params.data, len[n++] = sizeof(sm_real) * b->prev->params.total;
        ptr[n] = (void *)&b->coef, len[n++] = sizeof b->coef;
        ptr[n] = (void *)&b->updates, len[n++] = sizeof b->updates;
        ptr[n] = (void *)b->win_main, len[n++] = sizeof b->win_main;
        ptr[n] = (void *)b->win_churn, len[n++] = sizeof b->win_churn;
    }
    return n;
}

size_t sm_baselines_state_bytes(const sm_baselines *b) {
    void *ptr[STATE_PARTS];
    size_t len[STATE_PARTS], total = 0;
    const int n = b ? state_parts(b, ptr, len) : 0;
    for (int i = 0; i < n; i++) total += len[i];
    return total;
}

void sm_baselines_state_save(const sm_baselines *b, void *out) {
    void *ptr[STATE_PARTS];
    size_t len[STATE_PARTS];
    const int n = b ? state_parts(b, ptr, len) : 0;
    for (int i = 0; i < n; i++) memcpy(out, ptr[i], len[i]), out = (char *)out + len[i];
}

void sm_baselines_state_load(sm_baselines *b, const void *in) {
    void *ptr[STATE_PARTS];
    size_t len[STATE_PARTS];
    const int n = b ? state_parts(b, ptr, len) : 0;
    for (int i = 0; i < n; i++) memcpy(ptr[i], in, len[i]), in = (const char *)in + len[i];
}

int sm_baselines_stats(sm_baselines *b, const char **keys, double *vals) {
    int n = 0;
    if (!b) return 0;
    if (b->c.pw) keys[n] = "pw/penalty", vals[n++] = b->pw_n ? b->pw_sum / b->pw_n : 0;
    if (b->c.redo) keys[n] = "redo/reset_count", vals[n++] = (double)b->redo_n;
    if (b->cbp) keys[n] = "cbp/replaced", vals[n++] = (double)b->cbp_n;
    if (b->sn) keys[n] = "sn/sigma_max", vals[n++] = sm_sn_sigma_max(b->sn);
    if (b->sr) {
        keys[n] = "specreg/penalty", vals[n++] = b->sr_n ? b->sr_sum / b->sr_n : 0;
        keys[n] = "specreg/sigma_max", vals[n++] = sm_specreg_sigma_max(b->sr);
    }
    if (b->prev) {
        keys[n] = "cchain/churn", vals[n++] = b->ch_n ? b->ch_sum / b->ch_n : 0;
        keys[n] = "cchain/coef", vals[n++] = b->ch_n ? b->coef_sum / b->ch_n : 0;
    }
    b->pw_sum = b->sr_sum = 0, b->pw_n = b->redo_n = b->cbp_n = b->sr_n = 0;
    b->ch_sum = b->coef_sum = 0, b->ch_n = 0;
    return n;
}
