/* Gradient checks of PPO's losses (src/rl/ppo.c) in double precision: the clipped surrogate with
 * the entropy bonus w.r.t. logits (categorical) and means / log-std (Gaussian), the value loss with
 * and without clipping, and the Gaussian log-likelihood. Old log-probabilities are drawn away from
 * the new ones so that some ratios fall outside [1 - c, 1 + c] and every branch is exercised. */
#include "gradcheck.h"

#include "specmoe/rl/ppo.h"

enum { B = 12, A = 3 };

typedef struct {
    sm_real logits[B * A], mean[B * A], logstd[A], box[B * A];
    int act[B];
    sm_real old_logp[B], adv[B];
    sm_real val[B], old_val[B], ret[B];
    double clip, ent;
    int clip_vloss;
    sm_real g1[B * A], g2[B * A]; /* scratch gradients */
} fixture;

static void make(fixture *f, uint64_t seed) {
    sm_rng r;
    sm_rng_seed(&r, seed);
    gc_fill_normal(f->logits, B * A, 1.0, &r);
    gc_fill_normal(f->mean, B * A, 1.0, &r);
    gc_fill_normal(f->logstd, A, 0.3, &r);
    gc_fill_normal(f->box, B * A, 1.0, &r);
    gc_fill_normal(f->adv, B, 1.0, &r);
    gc_fill_normal(f->val, B, 1.0, &r);
    gc_fill_normal(f->old_val, B, 1.0, &r);
    gc_fill_normal(f->ret, B, 1.0, &r);
    for (int b = 0; b < B; b++) f->act[b] = (int)sm_rng_below(&r, A);
    f->clip = 0.2, f->ent = 0.05, f->clip_vloss = 1;
}

/* old log-probabilities = new ones shifted by up to +-0.4: ratios from 0.67 to 1.5 */
static void shift_old(fixture *f, const sm_real *logp_new, sm_rng *r) {
    for (int b = 0; b < B; b++) f->old_logp[b] = (sm_real)(logp_new[b] + 0.8 * (sm_rng_uniform(r) - 0.5));
}

static double disc_loss(void *ctx) {
    fixture *f = ctx;
    return sm_ppo_policy_loss_discrete(f->g1, NULL, f->logits, f->act, f->old_logp, f->adv, B, A, f->clip, f->ent);
}

static double gauss_loss(void *ctx) {
    fixture *f = ctx;
    sm_real dls[A];
    return sm_ppo_policy_loss_gaussian(f->g1, dls, NULL, f->mean, f->logstd, f->box, f->old_logp, f->adv, B, A, f->clip, f->ent);
}

static double value_loss(void *ctx) {
    fixture *f = ctx;
    return sm_ppo_value_loss(f->g1, NULL, f->val, f->old_val, f->ret, B, f->clip, f->clip_vloss, 0.5);
}

/* A fixture whose old log-probabilities lie away from the new ones (categorical or Gaussian), with
 * some ratios clipped and some not. */
static void prepare(fixture *f, uint64_t seed, int gaussian, sm_rng *r) {
    make(f, seed);
    sm_rng_seed(r, 100 * (gaussian + 1) + seed);
    sm_real logp[B];
    for (int b = 0; b < B; b++) {
        if (gaussian) {
            logp[b] = (sm_real)sm_gaussian_logprob(NULL, NULL, 0, f->box + b * A, f->mean + b * A, f->logstd, A);
            continue;
        }
        double mx = -1e300, s = 0;
        for (int j = 0; j < A; j++) mx = f->logits[b * A + j] > mx ? f->logits[b * A + j] : mx;
        for (int j = 0; j < A; j++) s += exp(f->logits[b * A + j] - mx);
        logp[b] = (sm_real)(f->logits[b * A + f->act[b]] - mx - log(s));
    }
    shift_old(f, logp, r);
}

/* categorical: w.r.t. the logits; Gaussian: w.r.t. the means and the log-std */
Test(grad_ppo, clipped_surrogate_and_entropy) {
    for (int gaussian = 0; gaussian <= 1; gaussian++)
        for (uint64_t seed = 1; seed <= 3; seed++) {
            fixture f;
            sm_rng r;
            prepare(&f, seed, gaussian, &r);
            sm_ppo_stats st;
            sm_real g[B * A], gl[A];
            if (gaussian) sm_ppo_policy_loss_gaussian(g, gl, &st, f.mean, f.logstd, f.box, f.old_logp, f.adv, B, A, f.clip, f.ent);
            else sm_ppo_policy_loss_discrete(g, &st, f.logits, f.act, f.old_logp, f.adv, B, A, f.clip, f.ent);
            cr_assert(st.clipfrac > 0 && st.clipfrac < 1, "some ratios clipped, some not (clipfrac %g)", st.clipfrac);
            cr_assert(st.entropy > 0, "entropy %g", st.entropy);
            if (gaussian) {
                gc_check("dmean", f.mean, g, B * A, gauss_loss, &f, &r, B * A);
                gc_check("dlogstd", f.logstd, gl, A, gauss_loss, &f, &r, A);
            } else {
                cr_assert_lt(st.entropy, log(A) + 1e-12);
                gc_check("dlogits", f.logits, g, B * A, disc_loss, &f, &r, B * A);
            }
        }
}

Test(grad_ppo, value_loss_clipped_and_not) {
    for (int clip = 0; clip <= 1; clip++)
        for (uint64_t seed = 1; seed <= 3; seed++) {
            fixture f;
            make(&f, seed);
            f.clip_vloss = clip;
            sm_rng r;
            sm_rng_seed(&r, 300 + seed);
            sm_real g[B];
            sm_ppo_stats st;
            double l = sm_ppo_value_loss(g, &st, f.val, f.old_val, f.ret, B, f.clip, clip, 0.5);
            cr_assert_float_eq(l, 0.5 * st.v_loss, 1e-15);
            gc_check(clip ? "dval (clipped)" : "dval", f.val, g, B, value_loss, &f, &r, B);
        }
}

typedef struct {
    sm_real x[A], mean[A], logstd[A];
} lp_ctx;

static double lp_loss(void *ctx) {
    lp_ctx *c = ctx;
    return sm_gaussian_logprob(NULL, NULL, 0, c->x, c->mean, c->logstd, A);
}

Test(grad_ppo, gaussian_log_likelihood) {
    sm_rng r;
    sm_rng_seed(&r, 7);
    for (int rep = 0; rep < 5; rep++) {
        lp_ctx c;
        gc_fill_normal(c.x, A, 1.0, &r);
        gc_fill_normal(c.mean, A, 1.0, &r);
        gc_fill_normal(c.logstd, A, 0.5, &r);
        sm_real gm[A] = {0}, gl[A] = {0};
        double lp = sm_gaussian_logprob(gm, gl, 1.0, c.x, c.mean, c.logstd, A);
        /* the closed form, written out */
        double want = 0;
        for (int j = 0; j < A; j++) {
            double s = exp(c.logstd[j]);
            want += -0.5 * pow((c.x[j] - c.mean[j]) / s, 2) - log(s) - 0.5 * log(2 * M_PI);
        }
        cr_assert_float_eq(lp, want, 1e-12);
        gc_check("dmean", c.mean, gm, A, lp_loss, &c, &r, A);
        gc_check("dlogstd", c.logstd, gl, A, lp_loss, &c, &r, A);
    }
}
