/* specmoe core types: the real type, status codes, error messages, explicit RNG state.
 *
 * The library never exits and keeps no global state: every function that can fail returns an
 * sm_status and fills an sm_error the caller owns; every function that needs randomness takes an
 * sm_rng the caller owns.
 *
 * sm_real is float in the library proper. The same sources are compiled a second time with
 * -DSPECMOE_DOUBLE (build/libspecmoe_f64.a) so the gradient checks run the very same forward and
 * backward code in double precision (ENGINEERING.md, "Gradient checks ... in double precision").
 */
#ifndef SPECMOE_CORE_H
#define SPECMOE_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* below this many values touched, a loop is not worth an OpenMP parallel region */
#define SM_PAR_MIN 65536

/* f(arg, lo, hi) over [0, n): one contiguous slice per thread (threads: how many, 0 for OpenMP's
 * default), or one call on the calling thread, without entering OpenMP, when that is one thread, when
 * n < 2, or inside an active parallel region already. An OpenMP region entered with a single thread
 * (an `if` clause that is false, or OMP_NUM_THREADS=1) still pays libgomp's team set-up and a futex
 * wake at its end: about 1.3 us on the 2-core VMs, and a MinAtar DQN learning frame entered four (the
 * environment step, two convolution forwards, the weight gradient; BENCHMARKS.md "DQN on MinAtar").
 * The loops handed to it write disjoint outputs, so how they are sliced never changes a result. */
typedef void (*sm_range_fn)(void *arg, long lo, long hi);
void sm_par_for(int threads, long n, sm_range_fn f, void *arg);
/* sm_par_for for uneven items (an MoE layer's experts): f(arg, i, i + 1) for each i < n, handed out
 * one at a time to whichever thread is free (schedule(dynamic, 1)); inline under the same rule */
void sm_par_each(int threads, long n, sm_range_fn f, void *arg);
/* sm_par_for's thread count for a loop touching `work` values: 1 up to SM_PAR_MIN, else 0 (all) */
static inline int sm_par_threads(size_t work) { return work > SM_PAR_MIN ? 0 : 1; }

#ifdef SPECMOE_DOUBLE
typedef double sm_real;
#else
typedef float sm_real;
#endif

typedef enum {
    SM_OK = 0,
    SM_ERR_ARG,     /* a caller-supplied value is impossible (k > E, lr < 0, ...) */
    SM_ERR_IO,      /* open/read/write/rename failed */
    SM_ERR_FORMAT,  /* outside data is malformed (truncated, bad magic, bad JSON, ...) */
    SM_ERR_NOMEM,   /* allocation failed */
    SM_ERR_NUMERIC, /* a loss or gradient became NaN/Inf */
    SM_ERR_MISMATCH /* a checkpoint does not match the requested model */
} sm_status;

/* The last failure, owned by the caller: its status code (so a caller that only got NULL back still
 * knows whether it was a bad argument, out of memory, ...) and a message a person can act on. */
typedef struct {
    char msg[512];
    sm_status code;
} sm_error;

/* Sets err->msg (printf-style) and returns code; err may be NULL. */
sm_status sm_fail(sm_error *err, sm_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
const char *sm_status_name(sm_status s);

/* xoshiro256** generator: explicit state, same seed -> same stream on every platform. */
typedef struct {
    uint64_t s[4];
} sm_rng;

void sm_rng_seed(sm_rng *r, uint64_t seed);
uint64_t sm_rng_u64(sm_rng *r);
uint32_t sm_rng_below(sm_rng *r, uint32_t n); /* uniform in [0, n), unbiased */
double sm_rng_uniform(sm_rng *r);             /* uniform in [0, 1) with 53 random bits */
double sm_rng_normal(sm_rng *r);              /* standard normal (Box-Muller, no cached pair) */
void sm_rng_shuffle(sm_rng *r, int *a, int n); /* Fisher-Yates */

/* Opens path for reading only if it is a regular file, without ever blocking on a FIFO or device
 * (outside data may name one); *size gets its size. NULL with err set otherwise. */
FILE *sm_open_regular(const char *path, size_t *size, sm_error *err);

/* Peak resident set size of this process in bytes (getrusage). */
size_t sm_peak_rss_bytes(void);
/* Memory this machine can give a new allocation now, in bytes: MemAvailable of /proc/meminfo, else
 * the free physical pages (sysconf); 0 if neither is known. */
size_t sm_available_memory_bytes(void);
/* Monotonic wall clock in seconds. */
double sm_time_now(void);

#ifdef __cplusplus
}
#endif
#endif
