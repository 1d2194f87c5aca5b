/* sm_gemm_tiny: C (M,N) = alpha op(A) (M,K) @ B (K,N) + beta C for matrices of a few dozen rows,
 * called many times inside a loop - SoftMoE's dispatch and combine, per observation and per expert
 * ((16 slots x 64 tokens) x 16 wide for a MinAtar frame's PerConv tokens). At that size an OpenBLAS
 * call costs more than its arithmetic (argument checks, packing both operands; BENCHMARKS.md,
 * "SoftMoE in the DQN update"). Here nothing is packed or allocated and nothing runs on other
 * threads:
 *
 *   a 6 x 16 tile of C lives in 12 AVX2 registers (an 8 x 16 tile in 8 zmm registers on an AVX-512
 *   CPU: the same bits); per k, one row of B (2 vector loads, contiguous)
 *   and 6 broadcasts of op(A)(i, k) = A[i * ars + k * acs], so A may be read transposed (acs = 1,
 *   ars = lda: C = A^T B) or not (ars = lda, acs = 1). Edges in M use the same code with fewer rows
 *   (a compile-time constant in each of the 6 versions), edges in N masked loads and stores, so no
 *   matrix is read or written past its end.
 *
 * The AVX2 + FMA kernel is compiled with target attributes (the build targets x86-64-v2) and used
 * when the CPU has both, checked once; elsewhere, and in the double-precision build that the
 * gradient checks use, plain loops compute the same products. Sums run over k in order in both, but
 * the kernel fuses each multiply-add (FMA) and the loops do not, so the two differ in the last bits;
 * tests/test_gemm_tiny.c holds both to a double-precision reference. Not for large matrices: without
 * packing, B's rows at a power-of-two stride alias in L1 and the rate falls far below OpenBLAS's
 * (see `specmoe bench gemm`). */
#include "specmoe/core/ops.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(SPECMOE_DOUBLE)
#define SM_TINY_X86 1
#include <immintrin.h>
#endif

/* the portable version, and the double build's */
static void gemm_loops(int M, int N, int K, sm_real alpha, const sm_real *A, ptrdiff_t ars, ptrdiff_t acs,
                       const sm_real *B, ptrdiff_t ldb, sm_real beta, sm_real *C, ptrdiff_t ldc) {
    for (int i = 0; i < M; i++) {
        sm_real *c = C + i * ldc;
        if (beta == 0) memset(c, 0, sizeof(sm_real) * (size_t)N);
        else if (beta != 1)
            for (int j = 0; j < N; j++) c[j] *= beta;
        for (int k = 0; k < K; k++) {
            const sm_real a = alpha * A[i * ars + k * acs];
            const sm_real *b = B + k * ldb;
            for (int j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}

#ifdef SM_TINY_X86
#define SM_TARGET __attribute__((target("avx2,fma")))
#define SM_INLINE static inline __attribute__((always_inline))

/* lane mask of the first n (0..8) lanes */
SM_TARGET SM_INLINE __m256i mask_first(int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

/* C (mr x 16, columns masked by m0/m1) = alpha * sum_k a(i, k) B[k, :] + beta * C, for k in [0, kc).
 * mr is a constant in every caller, so the loops over it unroll and the accumulators live in registers. */
SM_TARGET SM_INLINE void rows_tile(int mr, int kc, float alpha, const float *A, ptrdiff_t ars, ptrdiff_t acs,
                                   const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc, int full,
                                   __m256i m0, __m256i m1) {
    __m256 c0[6], c1[6];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < mr; r++) c0[r] = c1[r] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) { /* full is a constant here too: the loads' choice folds away */
        const float *b = B + k * ldb, *a = A + k * acs;
        const __m256 b0 = full ? _mm256_loadu_ps(b) : _mm256_maskload_ps(b, m0),
                     b1 = full ? _mm256_loadu_ps(b + 8) : _mm256_maskload_ps(b + 8, m1);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < mr; r++) {
            const __m256 av = _mm256_broadcast_ss(a + r * ars);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    _Pragma("GCC unroll 8")
    for (int r = 0; r < mr; r++) {
        float *c = C + r * ldc;
        __m256 x0 = _mm256_mul_ps(va, c0[r]), x1 = _mm256_mul_ps(va, c1[r]);
        if (full) {
            if (beta != 0) {
                x0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c), x0);
                x1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + 8), x1);
            }
            _mm256_storeu_ps(c, x0);
            _mm256_storeu_ps(c + 8, x1);
        } else {
            if (beta != 0) {
                x0 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(c, m0), x0);
                x1 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(c + 8, m1), x1);
            }
            _mm256_maskstore_ps(c, m0, x0);
            _mm256_maskstore_ps(c + 8, m1, x1);
        }
    }
}

/* one specialisation per row count: the compiler sees mr and full as constants */
#define ROWS_FN(MR)                                                                                              \
    SM_TARGET __attribute__((noinline)) static void rows_tile_##MR(int kc, float alpha, const float *A,          \
                                                                   ptrdiff_t ars, ptrdiff_t acs, const float *B, \
                                                                   ptrdiff_t ldb, float beta, float *C,          \
                                                                   ptrdiff_t ldc, int n) {                       \
        if (n == 16)                                                                                             \
            rows_tile(MR, kc, alpha, A, ars, acs, B, ldb, beta, C, ldc, 1, _mm256_setzero_si256(),               \
                      _mm256_setzero_si256());                                                                   \
        else                                                                                                     \
            rows_tile(MR, kc, alpha, A, ars, acs, B, ldb, beta, C, ldc, 0, mask_first(n < 8 ? n : 8),            \
                      mask_first(n > 8 ? n - 8 : 0));                                                            \
    }
ROWS_FN(1)
ROWS_FN(2)
ROWS_FN(3)
ROWS_FN(4)
ROWS_FN(5)
ROWS_FN(6)

typedef void (*rows_fn)(int, float, const float *, ptrdiff_t, ptrdiff_t, const float *, ptrdiff_t, float, float *,
                        ptrdiff_t, int);
static const rows_fn k_rows[7] = {0, rows_tile_1, rows_tile_2, rows_tile_3, rows_tile_4, rows_tile_5, rows_tile_6};

/* C (M,N) = alpha * op(A) (M,K) @ B (K,N) + beta * C; op(A)(i,k) = A[i*ars + k*acs] */
static void gemm_rows(int M, int N, int K, float alpha, const float *A, ptrdiff_t ars, ptrdiff_t acs,
                      const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc) {
    for (int j = 0; j < N; j += 16) {
        const int n = N - j < 16 ? N - j : 16;
        for (int i = 0; i < M; i += 6) {
            const int mr = M - i < 6 ? M - i : 6;
            k_rows[mr](K, alpha, A + i * ars, ars, acs, B + j, ldb, beta, C + i * ldc + j, ldc, n);
        }
    }
}


/* The AVX-512 form: 8 rows x 16 columns, one zmm accumulator per row and one (masked) B load per k;
 * per lane the same operations as rows_tile (FMA chain over k in order, then alpha *, then
 * + beta * C by FMA), so the same bits. 8 rows: 16 and 64 (SoftMoE's slot and token counts) split
 * evenly, and 8 independent chains cover the FMA latency at two a cycle. */
#define SM_TARGETZ __attribute__((target("avx512f,avx2,fma")))
enum { MRZ = 8 };
SM_TARGETZ SM_INLINE void rows_tilez(int mr, int np, int kc, float alpha, const float *A, ptrdiff_t ars, ptrdiff_t acs,
                                    const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc, __mmask16 m) {
    __m512 c[2][MRZ];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < mr; r++) c[0][r] = c[1][r] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_maskz_loadu_ps(m, B + k * ldb);
        const __m512 b1 = np == 2 ? _mm512_loadu_ps(B + k * ldb + 16) : b0;
        const float *a = A + k * acs;
        _Pragma("GCC unroll 8")
        for (int r = 0; r < mr; r++) {
            const __m512 av = _mm512_set1_ps(a[r * ars]);
            c[0][r] = _mm512_fmadd_ps(av, b0, c[0][r]);
            if (np == 2) c[1][r] = _mm512_fmadd_ps(av, b1, c[1][r]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    _Pragma("GCC unroll 8")
    for (int r = 0; r < mr; r++)
        _Pragma("GCC unroll 2")
        for (int q = 0; q < np; q++) {
            float *cr = C + r * ldc + q * 16;
            __m512 x = _mm512_mul_ps(va, c[q][r]);
            if (beta != 0) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cr), x);
            _mm512_mask_storeu_ps(cr, m, x);
        }
}

#define ROWSZ_FN(MR)                                                                                             \
    SM_TARGETZ __attribute__((noinline)) static void rows_tilez_##MR(int kc, float alpha, const float *A,        \
                                                                     ptrdiff_t ars, ptrdiff_t acs, const float *B, \
                                                                     ptrdiff_t ldb, float beta, float *C,          \
                                                                     ptrdiff_t ldc, int n) {                       \
        rows_tilez(MR, 1, kc, alpha, A, ars, acs, B, ldb, beta, C, ldc,                                          \
                   n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1));                                   \
    }                                                                                                            \
    SM_TARGETZ __attribute__((noinline)) static void rows_tilez2_##MR(int kc, float alpha, const float *A,       \
                                                                      ptrdiff_t ars, ptrdiff_t acs, const float *B, \
                                                                      ptrdiff_t ldb, float beta, float *C,          \
                                                                      ptrdiff_t ldc, int n) {                       \
        (void)n;                                                                                                 \
        rows_tilez(MR, 2, kc, alpha, A, ars, acs, B, ldb, beta, C, ldc, (__mmask16)0xFFFF);                      \
    }
ROWSZ_FN(1)
ROWSZ_FN(2)
ROWSZ_FN(3)
ROWSZ_FN(4)
ROWSZ_FN(5)
ROWSZ_FN(6)
ROWSZ_FN(7)
ROWSZ_FN(8)
static const rows_fn k_rowsz[MRZ + 1] = {0,           rows_tilez_1, rows_tilez_2, rows_tilez_3, rows_tilez_4,
                                        rows_tilez_5, rows_tilez_6, rows_tilez_7, rows_tilez_8};
static const rows_fn k_rowsz2[MRZ + 1] = {0,            rows_tilez2_1, rows_tilez2_2, rows_tilez2_3, rows_tilez2_4,
                                         rows_tilez2_5, rows_tilez2_6, rows_tilez2_7, rows_tilez2_8};

/* C (M,N) = alpha * op(A) (M,K) @ B (K,N) + beta * C on the AVX-512 tile: 32 columns at a time while
 * they last (each broadcast of A then feeds two FMAs: SoftMoE's 64 x 64 logits and their gradients,
 * K = 16, where a tile's start and end weigh as much as its 16 steps), then 16 */
static void gemm_rowsz(int M, int N, int K, float alpha, const float *A, ptrdiff_t ars, ptrdiff_t acs,
                       const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc) {
    for (int j = 0; j < N;) {
        const int n = N - j < 16 ? N - j : 16, two = N - j >= 32;
        for (int i = 0; i < M; i += MRZ) {
            const int mr = M - i < MRZ ? M - i : MRZ;
            (two ? k_rowsz2 : k_rowsz)[mr](K, alpha, A + i * ars, ars, acs, B + j, ldb, beta, C + i * ldc + j, ldc, n);
        }
        j += two ? 32 : 16;
    }
}

static atomic_int g_max_isa = SM_ISA_AVX512; /* sm_gemm_tiny_set_isa: the tests' switch */

/* what the CPU has, checked once: AVX2 + FMA, and AVX-512F on top */
static int cpu_isa(void) {
    static atomic_int have = -1;
    int h = atomic_load(&have);
    if (h < 0) {
        __builtin_cpu_init();
        h = !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? SM_ISA_NONE
            : __builtin_cpu_supports("avx512f")                                ? SM_ISA_AVX512
                                                                               : SM_ISA_AVX2;
        atomic_store(&have, h);
    }
    return h;
}

int sm_gemm_tiny_isa(void) {
    const int h = cpu_isa(), m = atomic_load(&g_max_isa);
    return h < m ? h : m;
}

int sm_gemm_tiny_cpu_isa(void) { return cpu_isa(); }

int sm_gemm_tiny_simd(void) { return sm_gemm_tiny_isa() >= SM_ISA_AVX2; }

void sm_gemm_tiny_set_isa(int max_isa) { atomic_store(&g_max_isa, max_isa); }
void sm_gemm_tiny_set_simd(int simd) { sm_gemm_tiny_set_isa(simd ? SM_ISA_AVX512 : SM_ISA_NONE); }
#else
int sm_gemm_tiny_isa(void) { return SM_ISA_NONE; }
int sm_gemm_tiny_cpu_isa(void) { return SM_ISA_NONE; }
int sm_gemm_tiny_simd(void) { return 0; }
void sm_gemm_tiny_set_isa(int max_isa) { (void)max_isa; }
void sm_gemm_tiny_set_simd(int simd) { (void)simd; }
#endif

void sm_gemm_tiny(int M, int N, int K, sm_real alpha, const sm_real *A, ptrdiff_t ars, ptrdiff_t acs, const sm_real *B,
                  ptrdiff_t ldb, sm_real beta, sm_real *C, ptrdiff_t ldc) {
    if (M <= 0 || N <= 0) return;
#ifdef SM_TINY_X86
    const int isa = sm_gemm_tiny_isa();
    if (K > 0 && isa >= SM_ISA_AVX2) {
        if (isa >= SM_ISA_AVX512) gemm_rowsz(M, N, K, alpha, A, ars, acs, B, ldb, beta, C, ldc);
        else gemm_rows(M, N, K, alpha, A, ars, acs, B, ldb, beta, C, ldc);
        return;
    }
#endif
    gemm_loops(M, N, K, alpha, A, ars, acs, B, ldb, beta, C, ldc);
}
