/* Aggregate scores over games x runs with stratified-bootstrap confidence intervals: the "rliable"
 * protocol of Agarwal et al. 2021 ("Deep RL at the Edge of the Statistical Precipice"), which the
 * SoftMoE-in-RL paper reports its results with.
 *
 * Scores are normalised per game, s = (raw - random) / (reference - random) (sm_rliable_normalise),
 * and laid out as a (R, G) matrix: R runs (seeds) of each of G games, score[r * G + g]. The four
 * aggregates, as rliable defines them:
 *   mean     the mean of all R*G scores;
 *   median   the median over games of each game's mean score over runs;
 *   IQM      the interquartile mean of all R*G scores: sorted, floor(0.25 N) dropped at each end
 *            (scipy.stats.trim_mean(scores, 0.25, axis=None)), the rest averaged;
 *   opt gap  the optimality gap 1 - mean(min(s, 1)): how far below the reference the runs fall.
 * Confidence intervals: the stratified bootstrap resamples, for each game separately, R runs with
 * replacement from that game's R runs, computes the aggregate, and repeats `reps` times; the
 * interval is the percentile interval of those replicates (rliable's default method), e.g. the 2.5th
 * and 97.5th percentiles (linear interpolation between order statistics, numpy's default).
 */
#ifndef SPECMOE_RLIABLE_H
#define SPECMOE_RLIABLE_H

#include <stdint.h>

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SM_AGG_MEDIAN = 0, SM_AGG_IQM, SM_AGG_MEAN, SM_AGG_OPTGAP, SM_AGG_N } sm_aggregate_kind;

/* "Median", "IQM", "Mean", "Optimality gap" */
const char *sm_aggregate_name(sm_aggregate_kind k);

typedef struct {
    double point;  /* the aggregate of the scores as given */
    double lo, hi; /* the percentile bootstrap interval */
} sm_interval;

/* (raw - random) / (reference - random); NaN when reference == random. */
double sm_rliable_normalise(double raw, double random, double reference);

/* The aggregate k of scores (R, G); scratch holds R*G + G doubles. */
double sm_aggregate(sm_aggregate_kind k, const double *scores, int R, int G, double *scratch);

/* Point estimates and stratified-bootstrap intervals of all four aggregates: out[SM_AGG_N]. conf is
 * the interval's coverage (0.95); reps >= 1 bootstrap replicates; seed drives the resampling.
 * Refused: R < 1, G < 1, a non-finite score, conf outside (0, 1). */
sm_status sm_rliable(const double *scores, int R, int G, int reps, double conf, uint64_t seed, sm_interval out[SM_AGG_N],
                     sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
