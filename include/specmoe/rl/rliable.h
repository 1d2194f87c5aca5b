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

/* Two variants X and Y on the same G games (their run counts Rx, Ry need not match; runs are not
 * paired): the difference of aggregate k, k(X) - k(Y), and rliable's probability of improvement
 *   P(X > Y) = 1/G sum_g 1/(Rx Ry) sum_i sum_j S(x_ig, y_jg),  S = 1 if x > y, 1/2 if equal, else 0
 * (Agarwal et al. 2021, "probability of improvement": the Mann-Whitney statistic per game, averaged
 * over games). Both intervals come from the same replicates: each replicate resamples X's and Y's
 * runs independently, within each game (the stratified bootstrap of each variant, as sm_rliable). */
typedef struct {
    sm_interval diff; /* k(X) - k(Y) */
    sm_interval poi;  /* P(X > Y) */
} sm_comparison;

sm_status sm_rliable_compare(const double *x, int Rx, const double *y, int Ry, int G, sm_aggregate_kind k, int reps,
                             double conf, uint64_t seed, sm_comparison *out, sm_error *err);

/* A claim about two variants, decided on the interval of the difference d = k(A) - k(B) and a margin
 * m > 0 (the smallest difference that matters, in normalised score):
 *   A > B  reproduced      lo > 0            (A is better, with the interval's confidence)
 *          not reproduced  hi < m            (any gain of A is below the margin, or A is worse)
 *          not decidable   otherwise         (the interval reaches both 0 and m: more runs needed)
 *   A !> B not reproduced  lo > 0            (A is better: the claim that it is not, refuted)
 *          reproduced      hi < m            (no gain of the margin's size is left)
 *          not decidable   otherwise         (A > B's rule with its outcomes swapped)
 *   A ~ B  reproduced      -m <= lo, hi <= m (equivalent within the margin: two one-sided tests)
 *          not reproduced  lo > m or hi < -m (they differ by more than the margin)
 *          not decidable   otherwise
 * A NaN bound, or m <= 0, is not decidable. "A !> B" states what a paper means by "A offers no
 * significant gain over B", which A ~ B would misjudge when A is far worse. */
typedef enum { SM_CLAIM_GREATER = 0, SM_CLAIM_NOT_GREATER, SM_CLAIM_EQUIVALENT } sm_claim_kind;
typedef enum { SM_VERDICT_REPRODUCED = 0, SM_VERDICT_NOT_REPRODUCED, SM_VERDICT_UNDECIDED } sm_verdict;

sm_verdict sm_claim_verdict(sm_claim_kind kind, sm_interval diff, double margin);
/* "reproduced", "not reproduced", "not decidable" */
const char *sm_verdict_name(sm_verdict v);

/* A claim as written: "A>B", "A<B", "A~B", "A!>B" or "A!<B" between two names (spaces around a name
 * dropped; names may hold commas and colons, as run labels do, but not > < ~ ;). "A < B" is kept as
 * B > A and "A !< B" as B !> A. */
#define SM_CLAIM_NAME 96
typedef struct {
    char a[SM_CLAIM_NAME], b[SM_CLAIM_NAME];
    sm_claim_kind kind;
} sm_claim;

/* One claim from the text [p, end): 0, or -1 when it has no operator or more than one, or a name is
 * empty or SM_CLAIM_NAME characters or longer. */
int sm_claim_parse(const char *p, const char *end, sm_claim *out);
/* The ';'-separated claims of list into out[0..max): their count, or -1 when one is malformed or
 * there are more than max. */
int sm_claims_parse(const char *list, sm_claim *out, int max);
/* ">", "!>" or "~" */
const char *sm_claim_op(sm_claim_kind kind);

#ifdef __cplusplus
}
#endif
#endif
