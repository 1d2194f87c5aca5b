/* Status messages, RNG, clocks. */
#define _POSIX_C_SOURCE 200809L
#include "specmoe/core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

FILE *sm_open_regular(const char *path, size_t *size, sm_error *err) {
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        sm_fail(err, SM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        sm_fail(err, SM_ERR_IO, "%s: not a regular file", path);
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl != -1) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        sm_fail(err, SM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (size) *size = (size_t)sb.st_size;
    return f;
}

sm_status sm_fail(sm_error *err, sm_status code, const char *fmt, ...) {
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

const char *sm_status_name(sm_status s) {
    switch (s) {
    case SM_OK: return "ok";
    case SM_ERR_ARG: return "invalid argument";
    case SM_ERR_IO: return "i/o error";
    case SM_ERR_FORMAT: return "malformed input";
    case SM_ERR_NOMEM: return "out of memory";
    case SM_ERR_NUMERIC: return "non-finite value";
    case SM_ERR_MISMATCH: return "mismatch";
    }
    return "unknown";
}

/* splitmix64 expands the seed into xoshiro state (Vigna's recommendation). */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void sm_rng_seed(sm_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sm_rng_u64(sm_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint32_t sm_rng_below(sm_rng *r, uint32_t n) {
    if (n == 0) return 0; /* no range to draw from */
    /* Lemire's multiply-shift with rejection: unbiased. */
    uint64_t m = (uint64_t)(uint32_t)(sm_rng_u64(r) >> 32) * n;
    uint32_t l = (uint32_t)m;
    if (l < n) {
        uint32_t t = (uint32_t)(-n) % n;
        while (l < t) {
            m = (uint64_t)(uint32_t)(sm_rng_u64(r) >> 32) * n;
            l = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

double sm_rng_uniform(sm_rng *r) { return (double)(sm_rng_u64(r) >> 11) * 0x1.0p-53; }

double sm_rng_normal(sm_rng *r) {
    double u1 = sm_rng_uniform(r), u2 = sm_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void sm_rng_shuffle(sm_rng *r, int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)sm_rng_below(r, (uint32_t)(i + 1));
        int t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

size_t sm_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

size_t sm_available_memory_bytes(void) {
    /* MemAvailable counts the page cache the kernel can drop, which free pages do not */
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                fclose(f);
                return (size_t)kb * 1024;
            }
        fclose(f);
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

double sm_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the thread count a parallel loop of n items would get, or 1 when it should run inline */
static long par_threads(int threads, long n) {
#ifdef _OPENMP
    const long nt = threads > 0 ? threads : omp_get_max_threads();
    return nt > 1 && n > 1 && !omp_in_parallel() ? (nt < n ? nt : n) : 1;
#else
    (void)threads, (void)n;
    return 1;
#endif
}

void sm_par_for(int threads, long n, sm_range_fn f, void *arg) {
    if (n <= 0) return;
    const long nt = par_threads(threads, n);
    if (nt == 1) {
        f(arg, 0, n);
        return;
    }
#pragma omp parallel num_threads((int)nt)
    {
#ifdef _OPENMP
        const long k = omp_get_num_threads(), i = omp_get_thread_num();
#else
        const long k = 1, i = 0;
#endif
        /* slice i: n / k items, one more for the first n % k (no product that could overflow) */
        const long q = n / k, r = n % k, lo = i * q + (i < r ? i : r), hi = lo + q + (i < r);
        if (lo < hi) f(arg, lo, hi);
    }
}

void sm_par_each(int threads, long n, sm_range_fn f, void *arg) {
    if (n <= 0) return;
    const long nt = par_threads(threads, n);
    if (nt == 1) {
        for (long i = 0; i < n; i++) f(arg, i, i + 1);
        return;
    }
#pragma omp parallel for num_threads((int)nt) schedule(dynamic, 1)
    for (long i = 0; i < n; i++) f(arg, i, i + 1);
}
