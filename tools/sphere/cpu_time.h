/* The timing helpers of the tools in this directory: CPU time of the process, and the median. */
#ifndef TOOLS_SPHERE_CPU_TIME_H
#define TOOLS_SPHERE_CPU_TIME_H

#include <stdlib.h>
#include <time.h>

static inline double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* sorts v (n) in place */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

#endif
