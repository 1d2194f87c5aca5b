/* Optimisers, clipping, schedules (see include/specmoe/optim.h). */
#include "specmoe/core/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/stiefel.h"

#ifdef SPECMOE_DOUBLE
#define R_SQRT sqrt
#else
#define R_SQRT sqrtf
#endif

void sm_optim_config_default(sm_optim_config *c) {
    memset(c, 0, sizeof *c);
    c->kind = SM_OPT_ADAMW;
    c->lr = 1e-3;
    c->momentum = 0.9;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->weight_decay = 0;
    c->alpha = 0.99;
    c->centered = 0;
}

const char *sm_opt_name(sm_opt_kind k) {
    return k == SM_OPT_SGD ? "sgd" : k == SM_OPT_ADAM ? "adam" : k == SM_OPT_ADAMW ? "adamw" : "rmsprop";
}

int sm_opt_parse(const char *s, sm_opt_kind *out) {
    for (int k = SM_OPT_SGD; k <= SM_OPT_RMSPROP; k++)
        if (strcmp(s, sm_opt_name((sm_opt_kind)k)) == 0) {
            *out = (sm_opt_kind)k;
            return 0;
        }
    return -1;
}

sm_status sm_optim_init(sm_optim *o, const sm_optim_config *cfg, const sm_params *ps, sm_error *err) {
    memset(o, 0, sizeof *o);
    if (!(cfg->lr >= 0) || !(cfg->eps > 0) || !(cfg->beta1 >= 0 && cfg->beta1 < 1) ||
        !(cfg->beta2 >= 0 && cfg->beta2 < 1) || !(cfg->weight_decay >= 0) || !(cfg->momentum >= 0) ||
        !(cfg->alpha >= 0 && cfg->alpha < 1))
        return sm_fail(err, SM_ERR_ARG, "optimiser: lr, eps, betas and alpha in [0,1), weight decay and momentum must be valid");
    /* the Riemannian update of a Stiefel tensor needs, per frame, the projected gradient (r*d), the
     * point before retraction (r*d, kept for the Gram-Schmidt fallback) and the projection / QR
     * workspace; one block sized for the largest frame serves every tensor */
    size_t scratch = 0;
    for (int i = 0; i < ps->n; i++) {
        const sm_param *q = &ps->p[i];
        if (!(q->flags & SM_PARAM_STIEFEL)) continue;
        int E, r, d;
        if (cfg->kind == SM_OPT_RMSPROP)
            return sm_fail(err, SM_ERR_ARG, "optimiser: rmsprop has no Riemannian form; tensor '%s' lives on a Stiefel manifold (use adam or sgd)", q->name);
        if (sm_stiefel_shape(q->ndim, q->shape, &E, &r, &d) != 0)
            return sm_fail(err, SM_ERR_ARG, "optimiser: Stiefel tensor '%s' must have shape (E, r, d) or (r, d) "
                           "with r <= d", q->name);
        size_t need = 2 * (size_t)r * d + SM_STIEFEL_WORK(r);
        if (need > scratch) scratch = need;
    }
    o->cfg = *cfg;
    o->n = ps->total;
    o->m = calloc(o->n ? o->n : 1, sizeof(sm_real));
    o->v = calloc(o->n ? o->n : 1, sizeof(sm_real));
    if (scratch) {
        o->scratch = malloc(sizeof(sm_real) * scratch);
        o->scratch_n = scratch;
    }
    if (!o->m || !o->v || (scratch && !o->scratch)) {
        sm_optim_free(o);
        return sm_fail(err, SM_ERR_NOMEM, "optimiser: out of memory for %zu values", ps->total);
    }
    return SM_OK;
}

void sm_optim_free(sm_optim *o) {
    free(o->m);
    free(o->v);
    free(o->scratch);
    o->m = o->v = o->scratch = NULL;
    o->scratch_n = 0;
}

/* One Riemannian step of a Stiefel tensor (E frames of (r, d)), geoopt's RiemannianAdam /
 * RiemannianSGD on the Euclidean-metric Stiefel manifold (REFERENCE-NOTES, GrMoE). Frames are small
 * (r*d values, two r x r x d products and one thin QR each) and few, so they run serially: that keeps
 * one scratch block and bit-for-bit reproducibility without per-thread buffers. */
static void stiefel_step(sm_optim *o, const sm_param *q, sm_real *w, const sm_real *g, sm_real *m, sm_real *v,
                         double lr, double bc1, double bc2) {
    const sm_optim_config *c = &o->cfg;
    int E, r, d;
    (void)sm_stiefel_shape(q->ndim, q->shape, &E, &r, &d); /* checked in sm_optim_init */
    const size_t n = (size_t)r * d;
    sm_real *rg = o->scratch, *x = o->scratch + n, *work = o->scratch + 2 * n;
    for (int e = 0; e < E; e++) {
        sm_real *we = w + e * n, *me = m + e * n;
        /* Riemannian gradient: the tangent projection of the Euclidean one (the gradient itself is
         * left untouched, as the Euclidean optimisers do) */
        memcpy(rg, g + e * n, sizeof(sm_real) * n);
        sm_stiefel_project(rg, we, r, d, work);
        if (c->kind == SM_OPT_SGD) {
            const sm_real *dir = rg;
            if (c->momentum > 0) {
                /* torch's momentum convention (buf = g on the first step), on tangent vectors */
                const sm_real mu = (sm_real)c->momentum;
                for (size_t j = 0; j < n; j++) me[j] = o->step == 1 ? rg[j] : mu * me[j] + rg[j];
                dir = me;
            }
            for (size_t j = 0; j < n; j++) x[j] = (sm_real)(we[j] - lr * dir[j]);
        } else {
            /* RiemannianAdam: the second moment is the scalar <rg, rg> per frame, so the step is
             * m_hat scaled by one number and stays tangent (an element-wise v would not) */
            const sm_real b1 = (sm_real)c->beta1;
            double sq = 0;
            for (size_t j = 0; j < n; j++) {
                me[j] = b1 * me[j] + (1 - b1) * rg[j];
                sq += (double)rg[j] * rg[j];
            }
            const double vf = c->beta2 * v[e * n] + (1 - c->beta2) * sq;
            v[e * n] = (sm_real)vf;
            const double denom = sqrt((double)v[e * n] / bc2) + c->eps;
            const sm_real step_size = (sm_real)(lr / bc1 / denom);
            for (size_t j = 0; j < n; j++) x[j] = we[j] - step_size * me[j];
        }
        /* back onto the manifold: R <- qf(R + step). The QR cannot fail on finite input; if it ever
         * does, Gram-Schmidt on the same point gives the same frame. A NaN/Inf point is left as it is
         * for the training loop's finiteness check to report. */
        memcpy(we, x, sizeof(sm_real) * n);
        if (sm_stiefel_retract_qr(we, r, d, work, NULL) != SM_OK) {
            memcpy(we, x, sizeof(sm_real) * n);
            (void)sm_stiefel_orthonormalize_gs(we, r, d);
        }
        /* vector transport by projection: the moment becomes a tangent vector at the new point */
        if (c->kind != SM_OPT_SGD || c->momentum > 0) sm_stiefel_project(me, we, r, d, work);
    }
}

/* Adam's element update on one span (torch semantics: denom = sqrt(v) / sqrt(bc2) + eps;
 * w -= lr/bc1 * m / denom). Built for AVX-512, AVX2 and the baseline ISA, chosen at load time:
 * the operations are element-wise multiplies, adds, one sqrt and one divide, never contracted
 * into FMAs (-std=c11 sets -ffp-contract=off), so every version gives the same bits. */
typedef struct {
    sm_real b1, b2, eps, step_size, isbc2, decay, l2;
} adam_coef;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void adam_span(sm_real *restrict w, const sm_real *restrict g, sm_real *restrict m, sm_real *restrict v,
                      size_t n, adam_coef c) {
#pragma omp simd
    for (size_t j = 0; j < n; j++) {
        sm_real gj = g[j] + c.l2 * w[j];
        sm_real wj = w[j] * c.decay;
        sm_real mj = c.b1 * m[j] + (1 - c.b1) * gj;
        sm_real vj = c.b2 * v[j] + (1 - c.b2) * gj * gj;
        m[j] = mj;
        v[j] = vj;
        w[j] = wj - c.step_size * mj / (R_SQRT(vj) * c.isbc2 + c.eps);
    }
}

/* RMSprop's element update (torch semantics, see optim.h), element-wise in sm_real so it
 * vectorises: the DQN updates of small networks spend most of their optimiser time here. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void rmsprop_span(sm_real *restrict w, const sm_real *restrict g, sm_real *restrict m, sm_real *restrict v,
                         size_t n, sm_real al, sm_real eps, sm_real lr, sm_real wd, int centered) {
    /* In blocks of 64, each block first asking for the lines RMS_AHEAD elements ahead in its read
     * streams (w, g, v, and m when centered). The step reads its 132k-parameter state from L3 in a
     * DQN update (the update's other work evicts it from L2), and the hardware prefetcher alone left
     * the loads stalling: optim 59.3 -> 36.7 us of a MinAtar DQN update with 1024 ahead (256-2048
     * did about as well; `dqn_update`, BENCHMARKS.md "DQN on MinAtar"). Element-wise: the same bits. */
    enum { BLK = 64, RMS_AHEAD = 1024, LINE = 64 / sizeof(sm_real) };
    for (size_t j0 = 0; j0 < n; j0 += BLK) {
        const size_t j1 = j0 + BLK < n ? j0 + BLK : n;
        for (size_t t = j0 + RMS_AHEAD; t < j1 + RMS_AHEAD && t < n; t += LINE) {
            __builtin_prefetch(w + t), __builtin_prefetch(g + t), __builtin_prefetch(v + t);
            if (centered) __builtin_prefetch(m + t);
        }
        if (centered) {
#pragma omp simd
            for (size_t j = j0; j < j1; j++) {
                sm_real gj = g[j] + wd * w[j];
                sm_real sq = al * v[j] + (1 - al) * gj * gj, ga = al * m[j] + (1 - al) * gj;
                v[j] = sq;
                m[j] = ga;
                sm_real var = sq - ga * ga;
                var = var > 0 ? var : 0;
                w[j] = w[j] - lr * gj / (R_SQRT(var) + eps);
            }
        } else {
#pragma omp simd
            for (size_t j = j0; j < j1; j++) {
                sm_real gj = g[j] + wd * w[j];
                sm_real sq = al * v[j] + (1 - al) * gj * gj;
                v[j] = sq;
                w[j] = w[j] - lr * gj / (R_SQRT(sq) + eps);
            }
        }
    }
}

/* adam_all's arguments for its slices */
typedef struct {
    const sm_optim *o;
    sm_params *ps;
    double lr;
    adam_coef base;
} adam_job;

/* the parts of the tensors inside elements [lo, hi) */
static void adam_slice(void *arg, long lo, long hi) {
    const adam_job *j = arg;
    const sm_optim_config *c = &j->o->cfg;
    const sm_params *ps = j->ps;
    const int decoupled = c->kind == SM_OPT_ADAMW;
    for (int i = 0; i < ps->n; i++) {
        const sm_param *q = &ps->p[i];
        if (q->flags & (SM_PARAM_FROZEN | SM_PARAM_STIEFEL)) continue;
        size_t a = q->offset > (size_t)lo ? q->offset : (size_t)lo,
               b = q->offset + q->numel < (size_t)hi ? q->offset + q->numel : (size_t)hi;
        if (a >= b) continue;
        /* torch applies weight decay to every parameter by default; NO_DECAY flags are honoured
         * only for AdamW, where the decay is a separate, explicit regulariser */
        double wd = c->weight_decay;
        if (decoupled && (q->flags & SM_PARAM_NO_DECAY)) wd = 0;
        adam_coef k = j->base;
        k.decay = (sm_real)(decoupled ? 1 - j->lr * wd : 1);
        k.l2 = (sm_real)(decoupled ? 0 : wd);
        adam_span(ps->data + a, ps->grad + a, j->o->m + a, j->o->v + a, b - a, k);
    }
}

/* Adam / AdamW over every plain (not frozen, not Stiefel) tensor. The tensors lie in one block,
 * so the element range [0, ps->total) is cut into one contiguous slice per thread (sm_par_for; none,
 * and no OpenMP region, below 64k elements: a PPO minibatch step of a small actor entered three) and
 * each thread updates the parts of the tensors inside its slice: many small tensors (an MoE layer's
 * experts) are spread over the threads instead of each running alone. Element-wise, so the bits do
 * not depend on the thread count. */
static void adam_all(const sm_optim *o, sm_params *ps, double lr, double bc1, double bc2) {
    const sm_optim_config *c = &o->cfg;
    adam_job j = {o, ps, lr,
                  {(sm_real)c->beta1, (sm_real)c->beta2, (sm_real)c->eps, (sm_real)(lr / bc1), (sm_real)(1 / sqrt(bc2)), 1, 0}};
    sm_par_for(sm_par_threads(ps->total), (long)ps->total, adam_slice, &j);
}

void sm_optim_step(sm_optim *o, sm_params *ps, double lr) {
    const sm_optim_config *c = &o->cfg;
    o->step++;
    const double bc1 = 1 - pow(c->beta1, (double)o->step), bc2 = 1 - pow(c->beta2, (double)o->step);
    for (int i = 0; i < ps->n; i++) {
        const sm_param *q = &ps->p[i];
        if (q->flags & SM_PARAM_FROZEN) continue;
        sm_real *restrict w = ps->data + q->offset, *restrict g = ps->grad + q->offset;
        sm_real *restrict m = o->m + q->offset, *restrict v = o->v + q->offset;
        const size_t n = q->numel;
        if (q->flags & SM_PARAM_STIEFEL) { /* o->scratch was sized from this table by sm_optim_init */
            stiefel_step(o, q, w, g, m, v, lr, bc1, bc2);
            continue;
        }
        if (c->kind == SM_OPT_RMSPROP) {
            rmsprop_span(w, g, m, v, n, (sm_real)c->alpha, (sm_real)c->eps, (sm_real)lr, (sm_real)c->weight_decay,
                         c->centered);
            continue;
        }
        if (c->kind != SM_OPT_SGD) continue; /* Adam / AdamW: all tensors at once below */
        for (size_t j = 0; j < n; j++) {
            double gj = (double)g[j] + c->weight_decay * w[j];
            if (c->momentum > 0) {
                /* torch: buf = g on the first step, then buf = mu*buf + g */
                m[j] = (sm_real)(o->step == 1 ? gj : c->momentum * m[j] + gj);
                gj = m[j];
            }
            w[j] = (sm_real)(w[j] - lr * gj);
        }
    }
    if (c->kind == SM_OPT_ADAM || c->kind == SM_OPT_ADAMW) adam_all(o, ps, lr, bc1, bc2);
}

/* sum of g[j]^2 in double, in eight interleaved partial sums (lane l takes j = l mod 8), added
 * pairwise at the end (a single running sum is a chain of dependent adds: for PPO's 1.7M-parameter
 * MoE actor it took a fifth of the update). Built per ISA as the spans above: each lane's additions
 * keep their order in every version, so all give the same bits; the baseline build's SSE2 loop took
 * 4.6% of a PPO run on the reach. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static double sum_sq(const sm_real *restrict g, size_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)g[j + l] * g[j + l];
    for (int l = 0; j < n; j++, l++) acc[l] += (double)g[j] * g[j];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

double sm_clip_grad_norm_sets(sm_params *const *sets, int n, double max_norm) {
    double sq = 0;
    for (int k = 0; k < n; k++) {
        const sm_params *ps = sets[k];
        for (int i = 0; i < ps->n; i++) {
            if (ps->p[i].flags & SM_PARAM_FROZEN) continue;
            sq += sum_sq(ps->grad + ps->p[i].offset, ps->p[i].numel);
        }
    }
    double norm = sqrt(sq);
    sm_clip_grad_to(sets, n, norm, max_norm);
    return norm;
}

double sm_grad_sq_sum(const sm_params *ps, unsigned mask, unsigned want) {
    double sq = 0;
    for (int i = 0; i < ps->n; i++)
        if (!(ps->p[i].flags & SM_PARAM_FROZEN) && (ps->p[i].flags & mask) == want)
            sq += sum_sq(ps->grad + ps->p[i].offset, ps->p[i].numel);
    return sq;
}

void sm_clip_grad_to(sm_params *const *sets, int n, double norm, double max_norm) {
    if (!(max_norm > 0 && norm > max_norm)) return;
    sm_real s = (sm_real)(max_norm / (norm + 1e-6));
    for (int k = 0; k < n; k++)
        for (size_t j = 0; j < sets[k]->total; j++) sets[k]->grad[j] *= s;
}

double sm_clip_grad_norm(sm_params *ps, double max_norm) { return sm_clip_grad_norm_sets(&ps, 1, max_norm); }

const char *sm_sched_name(sm_sched_kind k) {
    return k == SM_SCHED_CONSTANT ? "constant" : k == SM_SCHED_LINEAR ? "linear" : "cosine";
}

int sm_sched_parse(const char *s, sm_sched_kind *out) {
    for (int k = SM_SCHED_CONSTANT; k <= SM_SCHED_COSINE; k++)
        if (strcmp(s, sm_sched_name((sm_sched_kind)k)) == 0) {
            *out = (sm_sched_kind)k;
            return 0;
        }
    return -1;
}

double sm_schedule_lr(const sm_schedule *s, long step) {
    if (s->warmup > 0 && step < s->warmup) return s->base_lr * (double)(step + 1) / (double)s->warmup;
    if (s->kind == SM_SCHED_CONSTANT || s->total_steps <= s->warmup) return s->base_lr;
    double frac = (double)(step - s->warmup) / (double)(s->total_steps - s->warmup);
    if (frac > 1) frac = 1;
    if (s->kind == SM_SCHED_LINEAR) return s->base_lr + (s->final_lr - s->base_lr) * frac;
    return s->final_lr + 0.5 * (s->base_lr - s->final_lr) * (1 + cos(3.14159265358979323846 * frac));
}
