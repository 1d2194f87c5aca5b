/* Experience replay and the sum tree (include/specmoe/rl/replay.h). */
#include "specmoe/rl/replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

sm_status sm_sumtree_init(sm_sumtree *s, long n, sm_error *err) {
    memset(s, 0, sizeof *s);
    if (n < 1) return sm_fail(err, SM_ERR_ARG, "sum tree: need at least one leaf");
    long L = 1;
    while (L < n) L <<= 1;
    s->n = n;
    s->L = L;
    s->t = calloc((size_t)(2 * L), sizeof *s->t);
    if (!s->t) return sm_fail(err, SM_ERR_NOMEM, "sum tree of %ld leaves: out of memory", n);
    return SM_OK;
}

void sm_sumtree_free(sm_sumtree *s) {
    free(s->t);
    memset(s, 0, sizeof *s);
}

void sm_sumtree_set(sm_sumtree *s, long i, double p) {
    long j = s->L + i;
    s->t[j] = p;
    /* recompute parents from their children (not by adding deltas): no drift over millions of updates */
    for (j >>= 1; j >= 1; j >>= 1) s->t[j] = s->t[2 * j] + s->t[2 * j + 1];
}

long sm_sumtree_find(const sm_sumtree *s, double u) {
    long j = 1;
    while (j < s->L) {
        double left = s->t[2 * j];
        /* go right only if u is past the left sum and the right side has mass (rounding can leave
         * u >= total with an empty right subtree) */
        if (u >= left && s->t[2 * j + 1] > 0) {
            u -= left;
            j = 2 * j + 1;
        } else if (left > 0) {
            j = 2 * j;
        } else {
            j = 2 * j + 1;
        }
    }
    return j - s->L;
}

sm_status sm_replay_init(sm_replay *r, long capacity, int N, int D, int binary, int n_step, double gamma,
                         int prioritized, double alpha, sm_error *err) {
    memset(r, 0, sizeof *r);
    if (N < 1 || D < 1) return sm_fail(err, SM_ERR_ARG, "replay: need N >= 1 environments and D >= 1 values");
    if (n_step < 1) return sm_fail(err, SM_ERR_ARG, "replay: n-step must be >= 1 (got %d)", n_step);
    long rows = capacity / N;
    if (rows < n_step + 1 || rows > (1L << 30))
        return sm_fail(err, SM_ERR_ARG, "replay: capacity %ld holds %ld rows of %d environments; need at least n-step + 1 = %d",
                       capacity, rows, N, n_step + 1);
    r->N = N;
    r->rows = (int)rows;
    r->D = D;
    r->binary = binary;
    r->n_step = n_step;
    r->gamma = gamma;
    r->obs_bytes = (D + 7) / 8;
    size_t T = (size_t)rows * N, obs = T * (size_t)D;
    /* zeroed: a checkpoint saves the whole buffer, written rows or not, and must not depend on
     * whatever the allocator left there */
    if (binary) {
        r->obsbits = calloc(T, (size_t)r->obs_bytes);
        r->nextbits = calloc(T, (size_t)r->obs_bytes);
    } else {
        r->obsf = calloc(obs, sizeof(float));
        r->nextf = calloc(obs, sizeof(float));
    }
    r->act = calloc(T, sizeof *r->act);
    r->rew = calloc(T, sizeof *r->rew);
    r->term = calloc(T, 1);
    r->end = calloc(T, 1);
    if (!(binary ? r->obsbits && r->nextbits : r->obsf && r->nextf) || !r->act || !r->rew || !r->term || !r->end) {
        sm_replay_free(r);
        return sm_fail(err, SM_ERR_NOMEM, "replay of %ld transitions x %d values: out of memory (%.1f MiB)", (long)T, D,
                       (binary ? 2.0 * (double)T * r->obs_bytes : 8.0 * (double)obs) / 1048576.0);
    }
    if (prioritized) {
        sm_status st = sm_sumtree_init(&r->tree, (long)T, err);
        if (st != SM_OK) {
            sm_replay_free(r);
            return st;
        }
        r->alpha = alpha;
        r->max_prio = 1.0;
    }
    return SM_OK;
}

void sm_replay_free(sm_replay *r) {
    free(r->obsbits);
    free(r->nextbits);
    free(r->obsf);
    free(r->nextf);
    free(r->act);
    free(r->rew);
    free(r->term);
    free(r->end);
    sm_sumtree_free(&r->tree);
    memset(r, 0, sizeof *r);
}

/* transition t's observation into the buffer: bits (value > 0.5) or floats */
static void put_obs(const sm_replay *r, uint8_t *bits, float *df, size_t t, const float *src) {
    if (r->binary) {
        uint8_t *d = bits + t * (size_t)r->obs_bytes;
        memset(d, 0, (size_t)r->obs_bytes);
        for (int k = 0; k < r->D; k++) d[k >> 3] |= (uint8_t)((src[k] > 0.5f) << (k & 7));
    } else {
        memcpy(df + t * (size_t)r->D, src, sizeof(float) * (size_t)r->D);
    }
}

static void get_obs(const sm_replay *r, const uint8_t *bits, const float *sf, size_t t, float *dst) {
    if (r->binary) {
        const uint8_t *s = bits + t * (size_t)r->obs_bytes;
        int k = 0;
#ifdef __SSE2__
        /* a byte to eight floats: the byte in every lane, AND with one bit per lane, compare, AND 1.0f */
        const __m128i lo = _mm_setr_epi32(1, 2, 4, 8), hi = _mm_setr_epi32(16, 32, 64, 128);
        const __m128 one = _mm_set1_ps(1.0f);
        for (; k + 8 <= r->D; k += 8) {
            const __m128i v = _mm_set1_epi32(s[k >> 3]);
            _mm_storeu_ps(dst + k, _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(v, lo), lo)), one));
            _mm_storeu_ps(dst + k + 4, _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(v, hi), hi)), one));
        }
#endif
        for (; k < r->D; k++) dst[k] = (float)((s[k >> 3] >> (k & 7)) & 1);
    } else {
        memcpy(dst, sf + t * (size_t)r->D, sizeof(float) * (size_t)r->D);
    }
}

void sm_replay_pack_bytes(const sm_replay *r, uint8_t *dst, const uint8_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t *d = dst + i * (size_t)r->obs_bytes;
        const uint8_t *s = src + i * (size_t)r->D;
        memset(d, 0, (size_t)r->obs_bytes);
        for (int k = 0; k < r->D; k++) d[k >> 3] |= (uint8_t)((s[k] != 0) << (k & 7));
    }
}

void sm_replay_add(sm_replay *r, const float *obs, const int *act, const float *rew, const uint8_t *term,
                   const uint8_t *trunc, const float *next_obs) {
    const int N = r->N, row = r->head;
    for (int i = 0; i < N; i++) {
        size_t j = (size_t)row * N + i;
        put_obs(r, r->obsbits, r->obsf, j, obs + (size_t)i * r->D);
        put_obs(r, r->nextbits, r->nextf, j, next_obs + (size_t)i * r->D);
        r->act[j] = act[i];
        r->rew[j] = rew[i];
        r->term[j] = term[i] != 0;
        r->end[j] = term[i] || (trunc && trunc[i]);
        /* an overwritten row leaves the tree until its look-ahead is complete again */
        if (r->tree.t) sm_sumtree_set(&r->tree, (long)j, 0.0);
    }
    r->written++;
    r->head = (row + 1) % r->rows;
    /* the row n-1 back now has its whole look-ahead: it becomes sampleable at the maximum priority */
    if (r->tree.t && r->written >= r->n_step) {
        int ready = ((row - (r->n_step - 1)) % r->rows + r->rows) % r->rows;
        double p = pow(r->max_prio, r->alpha);
        for (int i = 0; i < N; i++) sm_sumtree_set(&r->tree, (long)ready * N + i, p);
    }
}

static long filled_rows(const sm_replay *r) { return r->written < r->rows ? r->written : r->rows; }

long sm_replay_size(const sm_replay *r) {
    long v = filled_rows(r) - (r->n_step - 1);
    return v > 0 ? v * r->N : 0;
}

/* Reads one value of every line nstep reads first for transition t (its observations, action, reward,
 * end flags) and returns their sum, which the caller only keeps alive: plain loads, so that the
 * batch's misses overlap in the out-of-order window before the copies start. Software prefetches of
 * the same lines did not help here (sampling 23 us of a MinAtar DQN update with or without them,
 * for any distance ahead 4-16): these loads took it to 9-12 us (BENCHMARKS.md, "DQN on MinAtar"). */
static unsigned touch_transition(const sm_replay *r, size_t t) {
    unsigned acc = (unsigned)r->act[t] + r->end[t] + r->term[t] + (r->rew[t] != 0);
    if (r->binary) {
        const uint8_t *o = r->obsbits + t * (size_t)r->obs_bytes, *x = r->nextbits + t * (size_t)r->obs_bytes;
        for (int k = 0; k < r->obs_bytes; k += 64) acc += (unsigned)o[k] + x[k];
        acc += (unsigned)o[r->obs_bytes - 1] + x[r->obs_bytes - 1];
    } else {
        const float *o = r->obsf + t * (size_t)r->D, *x = r->nextf + t * (size_t)r->D;
        for (int k = 0; k < r->D; k += 16) acc += (o[k] != 0) + (x[k] != 0);
        acc += (o[r->D - 1] != 0) + (x[r->D - 1] != 0);
    }
    return acc;
}

/* The n-step target of transition (row, col) into batch slot b. */
static void nstep(const sm_replay *r, int row, int col, sm_replay_batch *out, int b) {
    const int N = r->N;
    double G = 0, g = 1;
    int last = row;
    for (int j = 0; j < r->n_step; j++) {
        int rj = (row + j) % r->rows;
        size_t t = (size_t)rj * N + col;
        G += g * r->rew[t];
        g *= r->gamma;
        last = rj;
        if (r->end[t]) break;
    }
    size_t t = (size_t)last * N + col, t0 = (size_t)row * N + col;
    get_obs(r, r->obsbits, r->obsf, t0, out->obs + (size_t)b * r->D);
    get_obs(r, r->nextbits, r->nextf, t, out->next + (size_t)b * r->D);
    out->act[b] = r->act[t0];
    out->ret[b] = (float)G;
    out->disc[b] = r->term[t] ? 0.0f : (float)g;
    out->idx[b] = (long)t0;
}

int sm_replay_sample(sm_replay *r, int B, sm_rng *rng, double beta, sm_replay_batch *out) {
    long size = sm_replay_size(r);
    if (size < 1) return -1;
    const int N = r->N;
    if (!r->tree.t) {
        long valid_rows = size / N, first = ((long)r->head - filled_rows(r) + r->rows) % r->rows;
        /* all draws first (the same draws in the same order as one at a time), each transition's
         * lines read, then the copies: the misses overlap instead of queueing one by one */
        unsigned touched = 0;
        for (int b = 0; b < B; b++) {
            long k = (long)sm_rng_below(rng, (uint32_t)valid_rows);
            int col = (int)sm_rng_below(rng, (uint32_t)N);
            out->idx[b] = ((first + k) % r->rows) * N + col;
            touched += touch_transition(r, (size_t)out->idx[b]);
        }
#if defined(__GNUC__) || defined(__clang__)
        __asm__ volatile("" : : "r"(touched)); /* the loads stay */
#else
        (void)touched;
#endif
        for (int b = 0; b < B; b++) {
            nstep(r, (int)(out->idx[b] / N), (int)(out->idx[b] % N), out, b);
            out->weight[b] = 1.0f;
        }
        out->wmax = 1;
        return 0;
    }
    /* proportional prioritisation, stratified: one draw per equal segment of the total mass */
    double total = sm_sumtree_total(&r->tree), wmax = 0;
    for (int b = 0; b < B; b++) {
        double u = (b + sm_rng_uniform(rng)) * total / B;
        long leaf = sm_sumtree_find(&r->tree, u);
        double p = sm_sumtree_get(&r->tree, leaf) / total;
        /* w = (size * P)^-beta (Schaul et al. Sec. 3.4), normalised by the batch maximum below */
        double w = pow((double)size * p, -beta);
        out->weight[b] = (float)w;
        if (w > wmax) wmax = w;
        nstep(r, (int)(leaf / N), (int)(leaf % N), out, b);
    }
    for (int b = 0; b < B; b++) out->weight[b] = (float)(out->weight[b] / wmax);
    out->wmax = wmax;
    return 0;
}

void sm_replay_update(sm_replay *r, const long *idx, const float *prio, int B, double eps) {
    if (!r->tree.t) return;
    for (int b = 0; b < B; b++) {
        double p = fabs((double)prio[b]) + eps;
        if (p > r->max_prio) r->max_prio = p;
        /* a transition overwritten since it was sampled (priority 0 now) stays out */
        if (sm_sumtree_get(&r->tree, idx[b]) > 0) sm_sumtree_set(&r->tree, idx[b], pow(p, r->alpha));
    }
}
