/* Routing statistics of an MoE layer, accumulated over batches (one module shared by every
 * experiment): per-expert load, dropped assignments, mean routing entropy and effective experts,
 * coefficient of variation (CV) of load, MaxVio, active-expert ratio, collapse flag.
 *
 * Letters: E experts, k choices per token.
 */
#ifndef SPECMOE_METRICS_H
#define SPECMOE_METRICS_H

#include "specmoe/nn/router.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SM_METRICS_MAX_E 1024

/* Load of an expert: its kept assignments for sparse top-k routes; for dense mixtures (every token
 * to every expert) and SoftMoE, where assignment counts are equal by construction, its probability
 * mass sum_t p_te (the expected load of GrMoE Thm. 2). */
typedef struct {
    int E, k;
    long tokens;                  /* tokens seen */
    long assignments;             /* kept assignments */
    long dropped;                 /* dropped assignments (expert-choice: tokens no expert took) */
    double entropy_sum;           /* sum over tokens of H(p_t) (nats) */
    double topk_mass_sum;         /* sum over tokens of the k largest p_te */
    double load[SM_METRICS_MAX_E];/* per-expert load (see above) */
} sm_routing_stats;

void sm_routing_stats_reset(sm_routing_stats *s, int E, int k);
/* Adds one batch's route (after the forward). */
void sm_routing_stats_add(sm_routing_stats *s, const sm_route *r);

typedef struct {
    int E;
    double load_frac[SM_METRICS_MAX_E]; /* load / assignments */
    double entropy;        /* mean routing entropy, nats */
    double eff_experts;    /* exp(entropy) */
    double topk_mass;      /* mean mass of the k largest routing probabilities */
    double cv;             /* std / mean of per-expert load */
    double max_vio;        /* max_e |load_e - mean| / mean */
    double active_ratio;   /* experts with any load / E */
    double drop_frac;      /* dropped / (assignments + dropped) */
    double min_share;      /* smallest share of the tokens of an expert: load / tokens (top-k: the
                            * shares sum to k, so this is k * the smallest load_frac without drops) */
    int min_expert;        /* the expert with that share (the lowest index on ties) */
    int n_collapsed;       /* experts whose share is below sm_collapse_threshold(E) */
    int collapsed;         /* n_collapsed > 0 */
} sm_routing_summary;

void sm_routing_summarize(const sm_routing_stats *s, sm_routing_summary *out);
/* An expert is collapsed when its share of the tokens is below min(1%, 0.1 / E): GrMoE's 1% for
 * E <= 10, a tenth of the fair share 1/E for more experts (uniform routing is never collapsed). */
double sm_collapse_threshold(int E);

/* Routing entropy (nats) and top-k mass of one probability vector p (E). */
double sm_entropy(const sm_real *p, int E);
double sm_topk_mass(const sm_real *p, int E, int k);
/* SoftMoE's routing sharpness (a SOFT route after the forward): the mean over tokens of the combine
 * weights' entropy over the S slots divided by log S, and the mean over slots and groups of the
 * dispatch weights' entropy over the group's m tokens divided by log m, each added into *_sum with
 * their counts into *_n (accumulate over batches, then divide). 1 is uniform: every slot the mean
 * token, every output token the mean slot output; 0 is one-hot. A sparse route adds nothing; one
 * slot (S = 1) adds no combine term, a one-token group no dispatch term. Every slot counts: with
 * experts pruned (their slots take no combine weight) the combine term cannot reach 1. */
void sm_route_soft_sharpness(const sm_route *r, double *combine_sum, long *combine_n, double *dispatch_sum,
                             long *dispatch_n);
/* Top-1 expert of every token (argmax of probs (T,E), ties to the lower index). */
void sm_route_argmax(int *out, const sm_route *r);

/* Dormant neurons (Sokar et al. 2023, "The Dormant Neuron Phenomenon in Deep RL", Def. 3.1; the
 * measure SoftMoE-in-RL reports per layer and per expert): for activations h (N rows, H units) the
 * score of unit i is s_i = mean_n |h_ni| / ((1/H) sum_k mean_n |h_nk|); the unit is tau-dormant when
 * s_i <= tau. Writes the scores into score (H) when it is non-NULL and returns the fraction of
 * dormant units (0 when N == 0 or H == 0; every unit is dormant when the layer is all zero). */
double sm_dormant_fraction(const sm_real *h, int N, int H, double tau, double *score);

#ifdef __cplusplus
}
#endif
#endif
