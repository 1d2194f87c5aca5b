/* Experience replay for off-policy agents: uniform or prioritised (Schaul et al. 2016, proportional
 * variant, over a sum tree), with n-step returns computed at sampling time.
 *
 * Layout: `rows` rows of N columns, one column per environment of the vector, so consecutive rows
 * of a column are consecutive steps of one environment (the n-step look-ahead follows the column).
 * Binary image observations are stored as bits (a 32nd of the memory). Each transition keeps
 * its own next observation, so a truncated episode bootstraps from its real last observation.
 *
 * n-step target of the transition at (row t, column i), m = min(n, steps to the episode's end):
 *   G = sum_{j<m} gamma^j r_{t+j},  bootstrap from next_obs_{t+m-1},  discount gamma^m (0 if the
 *   episode terminated at t+m-1; a truncation keeps it).
 * A row is sampled only once its n-1 successors are written.
 */
#ifndef SPECMOE_REPLAY_H
#define SPECMOE_REPLAY_H

#include <stdint.h>

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sum tree over n leaves (doubles): update a leaf, total, and find the leaf at a prefix sum. */
typedef struct {
    long n, L;   /* leaves, power-of-two width */
    double *t;   /* (2L) node sums; leaf i at L + i */
} sm_sumtree;

sm_status sm_sumtree_init(sm_sumtree *s, long n, sm_error *err);
void sm_sumtree_free(sm_sumtree *s);
void sm_sumtree_set(sm_sumtree *s, long i, double p);
static inline double sm_sumtree_total(const sm_sumtree *s) { return s->t[1]; }
static inline double sm_sumtree_get(const sm_sumtree *s, long i) { return s->t[s->L + i]; }
/* The leaf i with prefix(i) <= u < prefix(i) + p_i, for 0 <= u < total; never a zero leaf (ties at
 * rounding boundaries move to the nearest non-zero leaf). */
long sm_sumtree_find(const sm_sumtree *s, double u);

typedef struct {
    int N, rows, D, binary, n_step;
    int obs_bytes;       /* binary: bytes per observation, ceil(D / 8) */
    double gamma;
    long written;        /* rows written so far */
    int head;            /* next row to write */
    /* binary observations as bits, (rows, N, obs_bytes): value k in bit k % 8 of byte k / 8. MinAtar's
     * 100k-transition replay is then 10 MB instead of 80 MB, within the last-level cache, and a
     * sampled observation is one or two cache lines instead of seven (BENCHMARKS.md, "DQN on
     * MinAtar"). */
    uint8_t *obsbits, *nextbits;
    float *obsf, *nextf;   /* (rows, N, D) otherwise */
    int *act;            /* (rows, N) */
    float *rew;          /* (rows, N) */
    uint8_t *term, *end; /* (rows, N): terminated; episode ended (terminated or truncated) */
    /* prioritised replay (NULL tree.t: uniform) */
    sm_sumtree tree;
    double alpha, max_prio;
} sm_replay;

/* capacity transitions (rounded down to a multiple of N, at least n_step + 1 rows). */
sm_status sm_replay_init(sm_replay *r, long capacity, int N, int D, int binary, int n_step, double gamma,
                         int prioritized, double alpha, sm_error *err);
void sm_replay_free(sm_replay *r);
/* One row: the N environments' transition (obs, act, rew, term, trunc, next_obs). */
void sm_replay_add(sm_replay *r, const float *obs, const int *act, const float *rew, const uint8_t *term,
                   const uint8_t *trunc, const float *next_obs);
/* Transitions that can be sampled now. */
long sm_replay_size(const sm_replay *r);
/* dst (n, obs_bytes) = the n binary observations src (n, D) of one byte per value (nonzero = 1) as
 * bits: the layout of obsbits / nextbits (reading replays saved one byte per value). */
void sm_replay_pack_bytes(const sm_replay *r, uint8_t *dst, const uint8_t *src, size_t n);

typedef struct {
    float *obs;   /* (B, D) */
    int *act;     /* (B) */
    float *ret;   /* (B) n-step return */
    float *next;  /* (B, D) bootstrap observation */
    float *disc;  /* (B) gamma^m, 0 after a terminal */
    long *idx;    /* (B) transition index (priority updates) */
    float *weight;/* (B) importance weights (1 for uniform), normalised by the batch maximum */
    double wmax;  /* that maximum (1 for uniform): a data-parallel learner renormalises by the largest over ranks */
} sm_replay_batch;

/* Samples B transitions (uniform, or proportional to priority^alpha with IS exponent beta). Returns
 * 0, or -1 if fewer than one transition can be sampled. */
int sm_replay_sample(sm_replay *r, int B, sm_rng *rng, double beta, sm_replay_batch *out);
/* New priorities |delta| + eps for sampled transitions (prioritised only). */
void sm_replay_update(sm_replay *r, const long *idx, const float *prio, int B, double eps);

#ifdef __cplusplus
}
#endif
#endif
