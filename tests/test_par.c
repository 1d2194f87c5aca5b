/* sm_par_for (core.h): f(arg, lo, hi) over [0, n) in one contiguous slice per thread, or once on the
 * calling thread without entering OpenMP - with one thread, with n < 2, inside a parallel region -
 * since a one-thread OpenMP region still costs libgomp's team set-up and a futex wake (about 1.3 us
 * on the 2-core VMs; four per MinAtar DQN learning frame before).
 *
 * sm_par_each: the same rule, one index per call, handed out dynamically.
 *
 * Run from the repo root: make build/tests/test_par && build/tests/test_par
 */
#include <criterion/criterion.h>
#include <omp.h>
#include <string.h>

#include "specmoe/core/core.h"

enum { N_MAX = 1000, CALLS_MAX = 64 };

typedef struct {
    int hits[N_MAX];    /* how often each index was visited */
    int calls;          /* how many slices f got */
    int level[CALLS_MAX]; /* omp_get_level() inside each call: 0 when no region was entered */
    int threads[CALLS_MAX];
} visit;

static void count(void *arg, long lo, long hi) {
    visit *v = arg;
    int c;
#pragma omp atomic capture
    c = v->calls++;
    if (c < CALLS_MAX) {
        v->level[c] = omp_get_level();
        v->threads[c] = omp_get_num_threads();
    }
    for (long i = lo; i < hi; i++) {
#pragma omp atomic
        v->hits[i]++;
    }
}

static void each_index_once(const visit *v, long n) {
    for (long i = 0; i < n; i++) cr_assert_eq(v->hits[i], 1, "index %ld visited %d times", i, v->hits[i]);
    for (long i = n; i < N_MAX; i++) cr_assert_eq(v->hits[i], 0, "index %ld past n visited", i);
}

Test(par, one_thread_runs_inline_without_an_openmp_region) {
    static visit v;
    memset(&v, 0, sizeof v);
    sm_par_for(1, 100, count, &v);
    cr_assert_eq(v.calls, 1);
    /* an OpenMP region, even an inactive one (an `if` clause that is false), would make this 1 */
    cr_assert_eq(v.level[0], 0, "the one-thread loop entered an OpenMP region (level %d)", v.level[0]);
    each_index_once(&v, 100);
}

/* threads 0: OpenMP's default, one thread (inline, level 0) or two (a slice each, level 1) */
Test(par, default_threads_follow_what_openmp_has) {
    const int saved = omp_get_max_threads();
    for (int avail = 1; avail <= 2; avail++) {
        static visit v;
        memset(&v, 0, sizeof v);
        omp_set_num_threads(avail);
        sm_par_for(0, 100, count, &v);
        each_index_once(&v, 100);
        cr_assert_eq(v.calls, avail);
        for (int c = 0; c < avail; c++)
            cr_assert(v.level[c] == avail - 1 && v.threads[c] == avail, "%d available, call %d: level %d, team %d", avail,
                      c, v.level[c], v.threads[c]);
    }
    omp_set_num_threads(saved);
}

Test(par, threads_get_disjoint_slices_that_cover_the_range) {
    for (int t = 2; t <= 3; t++)
        for (long n = 1; n <= 9; n++) {
            static visit v;
            memset(&v, 0, sizeof v);
            sm_par_for(t, n, count, &v);
            each_index_once(&v, n);
            const int want = n < 2 ? 1 : (n < t ? (int)n : t); /* no empty slices */
            cr_assert_eq(v.calls, want, "threads %d, n %ld: %d slices", t, n, v.calls);
            if (n >= 2)
                for (int c = 0; c < v.calls; c++) cr_assert_eq(v.threads[c], want, "threads %d, n %ld", t, n);
        }
}

Test(par, nothing_to_do_calls_nothing) {
    static visit v;
    memset(&v, 0, sizeof v);
    sm_par_for(2, 0, count, &v);
    sm_par_for(1, -3, count, &v);
    cr_assert_eq(v.calls, 0);
}

Test(par, inside_a_parallel_region_runs_inline) {
    static visit v;
    memset(&v, 0, sizeof v);
#pragma omp parallel num_threads(2)
    {
#pragma omp single
        sm_par_for(2, 50, count, &v);
    }
    cr_assert_eq(v.calls, 1);
    /* inline keeps the outer region's level; a nested region (inactive, one thread) would be 2 */
    cr_assert_eq(v.level[0], 1, "level %d inside the outer region", v.level[0]);
    each_index_once(&v, 50);
}

Test(par, each_calls_every_index_alone_inline_or_over_threads) {
    for (int t = 1; t <= 2; t++) {
        static visit v;
        memset(&v, 0, sizeof v);
        sm_par_each(t, 7, count, &v);
        each_index_once(&v, 7);
        cr_assert_eq(v.calls, 7, "threads %d: %d calls for 7 items", t, v.calls);
        for (int c = 0; c < v.calls; c++)
            if (t == 1) cr_assert_eq(v.level[c], 0, "the one-thread loop entered an OpenMP region");
            else cr_assert(v.level[c] == 1 && v.threads[c] == 2, "call %d: level %d, team %d", c, v.level[c], v.threads[c]);
    }
}
