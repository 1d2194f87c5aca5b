/* The three products of a linear layer at reinforcement-learning sizes (T = 2-256 rows, widths
 * 64-1024), packed the BLIS way onto a register tile: 6 x 16 with AVX2 (the tile of gemm_tiny.c,
 * written here for a packed B), 12 x 16 or 12 x 32 (two panels at once) with AVX-512:
 *
 *   forward  out (T,OC) = inp (T,C) @ weight (OC,C)^T + bias
 *   dinp     dinp (T,C) += dout (T,OC) @ weight (OC,C)
 *   dweight  dweight (OC,C) += dout (T,OC)^T @ inp (T,C)
 *
 * Why not OpenBLAS: an sgemm call at 32 rows repacks the whole weight (512 KB for the MinAtar DQN's
 * 1024 -> 128 layer) on every call, though each packed weight then meets only 32 rows, plus argument
 * checks and a zeroing pass for beta = 0 (BENCHMARKS.md, "DQN on MinAtar"). Why not the unpacked
 * kernel alone: sm_gemm_tiny reads B's rows where they lie, and rows 4 KB apart (a 1024-wide matrix)
 * fall in one L1 set, so a tile's 32-128 rows of B evict each other and the rate collapses (an earlier
 * unpacked attempt ran dinp at 0.40x and dweight at 0.22x OpenBLAS's rate).
 *
 * So B, the operand read as vectors, is packed into panels of 16 columns, [k][16], contiguous (but
 * for the backward's whole pairs of panels with AVX-512, read where they lie: direct_pairs below),
 * and A, the operand broadcast one value at a time, is read where it lies (a tile's rows at a time,
 * 6 with AVX2 and 12 with AVX-512, each walked in order, so only that many lines are live):
 *
 *   forward  computed transposed, out^T (OC,T) = weight (OC,C) @ inp^T (C,T): A = the weight as
 *            stored (never packed: this is where OpenBLAS loses its time), B = inp^T in panels of 16
 *            rows of inp (8 x 8 register transposes), the result transposed back into out with the
 *            bias added; a tile's weight rows meet every panel (with AVX-512 two panels at once)
 *            before the next rows are read;
 *   dinp     A = dout as stored, B = the weight in 16-column panels (one pass over it, eight rows at
 *            a time; with AVX-512 its rows in place), each panel's (or pair's) tiles of rows run while
 *            it is in L1;
 *   dweight  A = dout^T (ars = 1, acs = OC), B = inp in 16-column panels (with AVX-512 its rows in
 *            place); dweight is walked a tile's rows at a time from left to right.
 * The tile prefetches the weight rows it streams (forward) and the C it will accumulate into.
 *
 * Sums run over k in order in every tile, so a result does not depend on the call's history: same
 * inputs, same bits. They differ from OpenBLAS's (another summation order, FMA) in the last bits.
 * Where the CPU lacks AVX2 + FMA, and in the double build, sm_gemm_tiny's plain loops run the same
 * packed products. sm_linear_small_use is the rule that picks this path over OpenBLAS by shape and
 * product (measured: BENCHMARKS.md, "DQN on MinAtar", "The packed small GEMM"). */
#include <stdatomic.h>
#include <string.h>

#include "specmoe/core/ops.h"
#include "tile.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(SPECMOE_DOUBLE)
#define SM_LS_X86 1
#include <cblas.h> /* openblas_get_corename */
#include <immintrin.h>
#endif

#define NR 16 /* the tile's columns: one packed panel's width */
#define MR 6  /* the tile's rows */

static int round16(int n) { return (n + NR - 1) / NR * NR; }

#ifdef SM_LS_X86
#define SM_TARGET __attribute__((target("avx2,fma")))
#define SM_INLINE static inline __attribute__((always_inline))

/* C (mr x 16, first n columns) = [C +] sum_k a(r, k) Bp[k][:], Bp a packed panel [K][16], and
 * a(r, k) = A[(k / 16) * akc + r * ars + (k % 16) * acs]: A is walked in chunks of 16 k, akc apart
 * (akc = 16 acs for a plain strided A; the convolution's im2col panels put each chunk of 16 pixels
 * CKK x 16 apart, src/core/conv.c). mr and full (n == 16) are constants in every caller, so the 12 accumulators,
 * the two B vectors and the broadcast live in 15 of the 16 registers. pf (A read along rows,
 * acs = 1, from L2 or beyond): each row's line 4 ahead is prefetched every 16 k, since rows 4 KB
 * apart cross a page per row and the hardware prefetcher restarts at every page. */
/* C's rows, read after the k loop by a tile that accumulates: ask for their lines now, so they arrive
 * during the loop (lines lines of each row: 2 for a row of 16 floats that may straddle two) */
SM_INLINE void prefetch_c(int mr, const float *C, ptrdiff_t ldc, int lines) {
    _Pragma("GCC unroll 16")
    for (int r = 0; r < mr; r++)
        for (int l = 0; l < lines; l++) _mm_prefetch((const char *)(C + r * ldc + l * (NR - 1)), _MM_HINT_T0);
}

/* each of the mr rows of A (ars apart) at the line 4 ahead of a */
SM_INLINE void prefetch_a(int mr, const float *a, ptrdiff_t ars) {
    _Pragma("GCC unroll 16")
    for (int r = 0; r < mr; r++) _mm_prefetch((const char *)(a + r * ars + 4 * NR), _MM_HINT_T0);
}

SM_TARGET SM_INLINE void tile(int mr, int full, int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, ptrdiff_t akc,
                              const float *restrict Bp, const float *radd, float *C, ptrdiff_t ldc, int n, int acc,
                              int pf, const int *boff, ptrdiff_t bw, float *C2) {
    __m256 c0[MR], c1[MR];
    const float *const B0 = Bp; /* gathered rows are found from here */
    _Pragma("GCC unroll 8")
    for (int r = 0; r < mr; r++) c0[r] = c1[r] = _mm256_setzero_ps();
    if (acc) prefetch_c(mr, C, ldc, 2);
    for (int k0 = 0; k0 < K; k0 += NR) {
        const float *a = A + (k0 / NR) * akc;
        if (pf) prefetch_a(mr, a, ars);
        const int k1 = K - k0 < NR ? K - k0 : NR;
        for (int k = 0; k < k1; k++, a += acs, Bp += NR) {
            /* gathered (boff): row k's two halves at Bp + boff[k] and bw further; packed: Bp's next 16 */
            const float *bk = boff ? B0 + boff[k0 + k] : Bp;
            __m256 b0 = _mm256_loadu_ps(bk), b1 = _mm256_loadu_ps(bk + (boff ? bw : 8));
            /* keep both in registers: GCC otherwise folds b1's load into every FMA (13 loads per 12 FMAs) */
            __asm__("" : "+x"(b0), "+x"(b1));
            _Pragma("GCC unroll 8")
            for (int r = 0; r < mr; r++) {
                const __m256 av = _mm256_broadcast_ss(a + r * ars);
                c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
                c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
            }
        }
    }
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx),
                  m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), idx);
    if (radd) /* + radd[r] after the whole sum: the bits of (sum) + radd[r] */
        _Pragma("GCC unroll 8")
        for (int r = 0; r < mr; r++) {
            const __m256 v = _mm256_broadcast_ss(radd + r);
            c0[r] = _mm256_add_ps(c0[r], v), c1[r] = _mm256_add_ps(c1[r], v);
        }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < mr; r++) {
        float *c = C ? C + r * ldc : NULL; /* C is NULL only with C2 given (and acc 0) */
        if (full) {
            if (acc) c0[r] = _mm256_add_ps(_mm256_loadu_ps(c), c0[r]), c1[r] = _mm256_add_ps(_mm256_loadu_ps(c + 8), c1[r]);
            if (C2) { /* the ReLU's output too: x > 0 ? x : 0 (max returns its second operand, 0, for a NaN) */
                _mm256_storeu_ps(C2 + r * ldc, _mm256_max_ps(c0[r], _mm256_setzero_ps()));
                _mm256_storeu_ps(C2 + r * ldc + 8, _mm256_max_ps(c1[r], _mm256_setzero_ps()));
                if (!C) continue;
            }
            _mm256_storeu_ps(c, c0[r]);
            _mm256_storeu_ps(c + 8, c1[r]);
        } else {
            if (acc)
                c0[r] = _mm256_add_ps(_mm256_maskload_ps(c, m0), c0[r]),
                c1[r] = _mm256_add_ps(_mm256_maskload_ps(c + 8, m1), c1[r]);
            _mm256_maskstore_ps(c, m0, c0[r]);
            _mm256_maskstore_ps(c + 8, m1, c1[r]);
        }
    }
}

#define TILE_FN(R)                                                                                                \
    SM_TARGET __attribute__((noinline)) static void tile_##R(int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, \
                                                             ptrdiff_t akc, const float *Bp, const float *radd,   \
                                                             float *C, ptrdiff_t ldc, int n, int acc, int pf) {   \
        if (n == NR) tile(R, 1, K, A, ars, acs, akc, Bp, radd, C, ldc, n, acc, pf, NULL, 0, NULL);               \
        else tile(R, 0, K, A, ars, acs, akc, Bp, radd, C, ldc, n, acc, pf, NULL, 0, NULL);                       \
    }                                                                                                             \
    SM_TARGET __attribute__((noinline)) static void tilex_##R(int K, const float *Ap, const float *B, const int *boff, \
                                                              ptrdiff_t bw, const float *radd, float *C, ptrdiff_t ldc, \
                                                              int acc, float *C2) {                                   \
        if (boff) tile(R, 1, K, Ap, 1, R, NR * R, B, radd, C, ldc, NR, acc, 0, boff, bw, C2);                       \
        else tile(R, 1, K, Ap, 1, R, NR * R, B, radd, C, ldc, NR, acc, 0, NULL, 0, C2);                             \
    }                                                                                                             \
    SM_TARGET __attribute__((noinline)) static void tilec_##R(int K, const float *A, ptrdiff_t akc, const float *Bp,  \
                                                              float *C, ptrdiff_t ldc) {                             \
        tile(R, 1, K, A, NR, 1, akc, Bp, NULL, C, ldc, NR, 0, 0, NULL, 0, NULL);                                  \
    }
TILE_FN(1)
TILE_FN(2)
TILE_FN(3)
TILE_FN(4)
TILE_FN(5)
TILE_FN(6)
typedef void (*tile_fn)(int, const float *, ptrdiff_t, ptrdiff_t, ptrdiff_t, const float *, const float *, float *,
                        ptrdiff_t, int, int, int);
static const tile_fn k_tile[MR + 1] = {0, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};
typedef void (*tilex_fn)(int, const float *, const float *, const int *, ptrdiff_t, const float *, float *, ptrdiff_t, int,
                         float *);
static const tilex_fn k_tilex[MR + 1] = {0, tilex_1, tilex_2, tilex_3, tilex_4, tilex_5, tilex_6};
typedef void (*tilec_fn)(int, const float *, ptrdiff_t, const float *, float *, ptrdiff_t);
static const tilec_fn k_tilec[MR + 1] = {0, tilec_1, tilec_2, tilec_3, tilec_4, tilec_5, tilec_6};

/* The AVX-512 tile: the same contract as tile() above on the same packed panels (a panel's 16
 * columns are one zmm), SM_TILE_MRZ rows (up to SM_TILE_MR_MAX for one panel whose A is small and
 * contiguous, the convolution's): one accumulator per row and panel, one B load per panel
 * and mr broadcasts per k. np = 2 runs two panels at once, Bp and Bp + ps (C's 32 columns, both
 * full; no radd): each value of A is then read once for 32 columns (the forward's weight rows: once
 * per 32 batch rows instead of 16; 12 rows of 4 KB fill L1, so a second one-panel pass read them from
 * L2 again). 12 rows, not more, where A's rows lie 4 KB apart (a 1024-wide weight): all of
 * them and their prefetched next lines share one set of the 12-way L1 (measured: BENCHMARKS.md, "DQN
 * on MinAtar", the AVX-512 tiles). Per lane the same FMA chain over k as the AVX2 tile, then + radd,
 * then + C: the same bits. mr and np are constants in every caller. */
#define SM_TARGETZ __attribute__((target("avx512f,avx2,fma")))
SM_TARGETZ SM_INLINE void tilez(int mr, int np, int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, ptrdiff_t akc,
                               const float *restrict Bp, ptrdiff_t ps, const float *radd, float *C, ptrdiff_t ldc,
                               int n, int acc, int pf, const int *boff, ptrdiff_t bw, ptrdiff_t bs, float *C2,
                               const float *cadd) {
    __m512 c[2][SM_TILE_MR_MAX];
    const float *const B0 = Bp; /* gathered rows are found from here */
    _Pragma("GCC unroll 16")
    for (int r = 0; r < mr; r++) c[0][r] = c[1][r] = _mm512_setzero_ps();
    if (acc) prefetch_c(mr, C, ldc, 2 * np - 1);
    for (int k0 = 0; k0 < K; k0 += NR) {
        const float *a = A + (k0 / NR) * akc;
        if (pf) prefetch_a(mr, a, ars);
        const int k1 = K - k0 < NR ? K - k0 : NR;
        for (int k = 0; k < k1; k++, a += acs, Bp += bs) {
            __m512 b0;
            if (boff) { /* gathered: row k's halves at B0 + boff[k] and bw further (AVX-512F's 64-bit insert) */
                const float *bk = B0 + boff[k0 + k];
                b0 = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(bk))),
                                                         _mm256_castps_pd(_mm256_loadu_ps(bk + bw)), 1));
            } else
                b0 = _mm512_loadu_ps(Bp);
            const __m512 b1 = np == 2 ? _mm512_loadu_ps(Bp + ps) : b0;
            _Pragma("GCC unroll 16")
            for (int r = 0; r < mr; r++) {
                const __m512 av = _mm512_set1_ps(a[r * ars]);
                c[0][r] = _mm512_fmadd_ps(av, b0, c[0][r]);
                if (np == 2) c[1][r] = _mm512_fmadd_ps(av, b1, c[1][r]);
            }
        }
    }
    const __mmask16 m = n >= NR ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    if (radd)
        _Pragma("GCC unroll 16")
        for (int r = 0; r < mr; r++) c[0][r] = _mm512_add_ps(c[0][r], _mm512_set1_ps(radd[r]));
    if (cadd) /* + cadd[column] after the whole sum (a bias along the columns: the forward by rows) */
        _Pragma("GCC unroll 2")
        for (int q = 0; q < np; q++) {
            const __m512 v = _mm512_maskz_loadu_ps(m, cadd + q * NR);
            _Pragma("GCC unroll 16")
            for (int r = 0; r < mr; r++) c[q][r] = _mm512_add_ps(c[q][r], v);
        }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < np; q++) {
            float *cr = C ? C + r * ldc + q * NR : NULL; /* C is NULL only with C2 given (and acc 0) */
            if (acc) c[q][r] = _mm512_add_ps(_mm512_maskz_loadu_ps(m, cr), c[q][r]);
            if (C2) { /* the ReLU's output too: x > 0 ? x : 0 (max returns its second operand, 0, for a NaN) */
                _mm512_mask_storeu_ps(C2 + r * ldc + q * NR, m, _mm512_max_ps(c[q][r], _mm512_setzero_ps()));
                if (!C) continue;
            }
            _mm512_mask_storeu_ps(cr, m, c[q][r]);
        }
}

/* tilez_R: one panel, any n; tilez2_R: two full panels */
typedef void (*tile2_fn)(int, const float *, ptrdiff_t, ptrdiff_t, const float *, ptrdiff_t, float *, ptrdiff_t, int,
                         int);
#define TILEZ_FN(R)                                                                                                  \
    SM_TARGETZ __attribute__((noinline)) static void tilez_##R(int K, const float *A, ptrdiff_t ars, ptrdiff_t acs,   \
                                                               ptrdiff_t akc, const float *Bp, const float *radd,     \
                                                               float *C, ptrdiff_t ldc, int n, int acc, int pf) {     \
        tilez(R, 1, K, A, ars, acs, akc, Bp, 0, radd, C, ldc, n, acc, pf, NULL, 0, NR, NULL, NULL);                  \
    }                                                                                                                \
    SM_TARGETZ __attribute__((noinline)) static void tilezx_##R(int K, const float *Ap, const float *B,              \
                                                                const int *boff, ptrdiff_t bw, const float *radd,      \
                                                                float *C, ptrdiff_t ldc, int acc, float *C2) {         \
        if (boff) tilez(R, 1, K, Ap, 1, R, NR * R, B, 0, radd, C, ldc, NR, acc, 0, boff, bw, NR, C2, NULL);         \
        else tilez(R, 1, K, Ap, 1, R, NR * R, B, 0, radd, C, ldc, NR, acc, 0, NULL, 0, NR, C2, NULL);               \
    }                                                                                                                \
    SM_TARGETZ __attribute__((noinline)) static void tilezc_##R(int K, const float *A, ptrdiff_t akc, const float *Bp, \
                                                                float *C, ptrdiff_t ldc) {                             \
        tilez(R, 1, K, A, NR, 1, akc, Bp, 0, NULL, C, ldc, NR, 0, 0, NULL, 0, NR, NULL, NULL);                       \
    }
/* tilezb_R / tilezb2_R: the forward by rows (sm_linear_forward_small_ex), one panel of any n or two full
 * panels, C = the result + cadd (a bias per column), C2 its ReLU (either may be NULL, not both) */
typedef void (*tileb_fn)(int, const float *, ptrdiff_t, const float *, ptrdiff_t, const float *, float *, ptrdiff_t, int,
                         float *);
#define TILEZB_FN(R)                                                                                                 \
    SM_TARGETZ __attribute__((noinline)) static void tilezb_##R(int K, const float *A, ptrdiff_t ars, const float *Bp,  \
                                                                ptrdiff_t ps, const float *cadd, float *C,             \
                                                                ptrdiff_t ldc, int n, float *C2) {                     \
        (void)ps;                                                                                                    \
        tilez(R, 1, K, A, ars, 1, NR, Bp, 0, NULL, C, ldc, n, 0, 0, NULL, 0, NR, C2, cadd);                          \
    }                                                                                                                \
    SM_TARGETZ __attribute__((noinline)) static void tilezb2_##R(int K, const float *A, ptrdiff_t ars, const float *Bp, \
                                                                 ptrdiff_t ps, const float *cadd, float *C,            \
                                                                 ptrdiff_t ldc, int n, float *C2) {                    \
        (void)n;                                                                                                     \
        tilez(R, 2, K, A, ars, 1, NR, Bp, ps, NULL, C, ldc, NR, 0, 0, NULL, 0, NR, C2, cadd);                        \
    }
#define TILEZ2_FN(R)                                                                                                 \
    TILEZ_FN(R)                                                                                                      \
    TILEZB_FN(R)                                                                                                     \
    SM_TARGETZ __attribute__((noinline)) static void tilez2_##R(int K, const float *A, ptrdiff_t ars, ptrdiff_t acs,  \
                                                                const float *Bp, ptrdiff_t ps, float *C, ptrdiff_t ldc, \
                                                                int acc, int pf) {                                     \
        tilez(R, 2, K, A, ars, acs, NR * acs, Bp, ps, NULL, C, ldc, NR, acc, pf, NULL, 0, NR, NULL, NULL);           \
    }                                                                                                                \
    SM_TARGETZ __attribute__((noinline)) static void tilezr2_##R(int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, \
                                                                 const float *B, ptrdiff_t bs, float *C, ptrdiff_t ldc, \
                                                                 int acc) {                                             \
        if (acc) tilez(R, 2, K, A, ars, acs, NR * acs, B, NR, NULL, C, ldc, NR, 1, 0, NULL, 0, bs, NULL, NULL);        \
        else tilez(R, 2, K, A, ars, acs, NR * acs, B, NR, NULL, C, ldc, NR, 0, 0, NULL, 0, bs, NULL, NULL);            \
    }
TILEZ2_FN(1)
TILEZ2_FN(2)
TILEZ2_FN(3)
TILEZ2_FN(4)
TILEZ2_FN(5)
TILEZ2_FN(6)
TILEZ2_FN(7)
TILEZ2_FN(8)
TILEZ2_FN(9)
TILEZ2_FN(10)
TILEZ2_FN(11)
TILEZ2_FN(12)
TILEZ_FN(13)
TILEZ_FN(14)
TILEZ_FN(15)
TILEZ_FN(16)
_Static_assert(SM_TILE_MRZ == 12 && SM_TILE_MR_MAX == 16,
               "tilez2_R per row count up to SM_TILE_MRZ, tilez_R and tilezx_R up to SM_TILE_MR_MAX");
static const tile_fn k_tilez[SM_TILE_MR_MAX + 1] = {0,        tilez_1,  tilez_2,  tilez_3,  tilez_4,  tilez_5,
                                                    tilez_6,  tilez_7,  tilez_8,  tilez_9,  tilez_10, tilez_11,
                                                    tilez_12, tilez_13, tilez_14, tilez_15, tilez_16};
static const tilec_fn k_tilezc[SM_TILE_MR_MAX + 1] = {0,         tilezc_1,  tilezc_2,  tilezc_3,  tilezc_4,  tilezc_5,
                                                      tilezc_6,  tilezc_7,  tilezc_8,  tilezc_9,  tilezc_10, tilezc_11,
                                                      tilezc_12, tilezc_13, tilezc_14, tilezc_15, tilezc_16};
static const tilex_fn k_tilezx[SM_TILE_MR_MAX + 1] = {0,         tilezx_1,  tilezx_2,  tilezx_3,  tilezx_4,  tilezx_5,
                                                      tilezx_6,  tilezx_7,  tilezx_8,  tilezx_9,  tilezx_10, tilezx_11,
                                                      tilezx_12, tilezx_13, tilezx_14, tilezx_15, tilezx_16};
typedef void (*tiler2_fn)(int, const float *, ptrdiff_t, ptrdiff_t, const float *, ptrdiff_t, float *, ptrdiff_t, int);
static const tiler2_fn k_tilezr2[SM_TILE_MRZ + 1] = {0,         tilezr2_1, tilezr2_2, tilezr2_3,  tilezr2_4,  tilezr2_5, tilezr2_6,
                                                     tilezr2_7, tilezr2_8, tilezr2_9, tilezr2_10, tilezr2_11, tilezr2_12};
static const tile2_fn k_tilez2[SM_TILE_MRZ + 1] = {0,        tilez2_1, tilez2_2, tilez2_3,  tilez2_4,  tilez2_5, tilez2_6,
                                                   tilez2_7, tilez2_8, tilez2_9, tilez2_10, tilez2_11, tilez2_12};

static const tileb_fn k_tilezb[SM_TILE_MRZ + 1] = {0,         tilezb_1, tilezb_2, tilezb_3,  tilezb_4,  tilezb_5, tilezb_6,
                                                   tilezb_7,  tilezb_8, tilezb_9, tilezb_10, tilezb_11, tilezb_12};
static const tileb_fn k_tilezb2[SM_TILE_MRZ + 1] = {0,          tilezb2_1, tilezb2_2, tilezb2_3,  tilezb2_4,  tilezb2_5, tilezb2_6,
                                                    tilezb2_7,  tilezb2_8, tilezb2_9, tilezb2_10, tilezb2_11, tilezb2_12};

int sm_tile_rows(int isa) { return isa >= SM_ISA_AVX512 ? SM_TILE_MRZ : MR; }
int sm_tile_rows_max(int isa) { return isa >= SM_ISA_AVX512 ? SM_TILE_MR_MAX : MR; }

/* the tile of instruction set isa (>= SM_ISA_AVX2) for mr <= sm_tile_rows_max(isa) rows. The callers
 * read the ISA once per call and pass it down, so a row step and its tiles always agree. */
static tile_fn pick_tile(int isa, int mr) { return isa >= SM_ISA_AVX512 ? k_tilez[mr] : k_tile[mr]; }

void sm_tile16(int isa, int mr, int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, ptrdiff_t akc, const float *Bp,
               const float *radd, float *C, ptrdiff_t ldc, int n, int acc) {
    if (K > 0) pick_tile(isa, mr)(K, A, ars, acs, akc, Bp, radd, C, ldc, n, acc, 0);
}

void sm_tile16_panels(int isa, int mr, int K, const float *A, ptrdiff_t akc, const float *Bp, float *C, ptrdiff_t ldc) {
    if (K > 0) (isa >= SM_ISA_AVX512 ? k_tilezc : k_tilec)[mr](K, A, akc, Bp, C, ldc);
}

void sm_tile16_wp(int isa, int mr, int K, const float *Ap, const float *B, const int *boff, ptrdiff_t bw, const float *radd,
                  float *C, ptrdiff_t ldc, int acc, float *C2) {
    if (K > 0) (isa >= SM_ISA_AVX512 ? k_tilezx : k_tilex)[mr](K, Ap, B, boff, bw, radd, C, ldc, acc, C2);
}
#endif

/* rows of one tile of instruction set isa (sm_gemm_tiny's loops, without SIMD, take any count: 6) */
static int tile_rows(int isa) {
#ifdef SM_LS_X86
    if (isa >= SM_ISA_AVX2) return sm_tile_rows(isa);
#endif
    (void)isa;
    return MR;
}

/* C (mr rows, n columns, ldc apart) = [C +] op(A) (mr,K) @ Bp (K,16), one register tile: isa's tile
 * above, else (SM_ISA_NONE) sm_gemm_tiny's portable loops. */
static void run_tile(int isa, int mr, int K, const sm_real *A, ptrdiff_t ars, ptrdiff_t acs, const sm_real *Bp,
                     sm_real *C, ptrdiff_t ldc, int n, int acc, int pf) {
#ifdef SM_LS_X86
    if (isa >= SM_ISA_AVX2 && K > 0) {
        pick_tile(isa, mr)(K, A, ars, acs, NR * acs, Bp, NULL, C, ldc, n, acc, pf);
        return;
    }
#endif
    (void)isa, (void)pf;
    sm_gemm_tiny(mr, n, K, 1, A, ars, acs, Bp, NR, acc ? 1 : 0, C, ldc);
}

/* C (mr rows, 32 columns) = [C +] op(A) @ [Bp | Bp + ps], two full panels: one AVX-512 tile over
 * both, else one tile per panel (the same sums either way) */
static void run_tile2(int isa, int mr, int K, const sm_real *A, ptrdiff_t ars, ptrdiff_t acs, const sm_real *Bp,
                      ptrdiff_t ps, sm_real *C, ptrdiff_t ldc, int acc, int pf) {
#ifdef SM_LS_X86
    if (isa >= SM_ISA_AVX512 && K > 0) {
        k_tilez2[mr](K, A, ars, acs, Bp, ps, C, ldc, acc, pf);
        return;
    }
#endif
    run_tile(isa, mr, K, A, ars, acs, Bp, C, ldc, NR, acc, pf);
    run_tile(isa, mr, K, A, ars, acs, Bp + ps, C + NR, ldc, NR, acc, 0);
}

/* C (mr rows, 32 columns) = [C +] op(A) @ B (K, 32), B's rows bs apart read where they lie: the
 * AVX-512 two-panel tile (isa >= SM_ISA_AVX512 only; see direct_pairs) */
static void run_tile2_rows(int isa, int mr, int K, const sm_real *A, ptrdiff_t ars, ptrdiff_t acs, const sm_real *B,
                           ptrdiff_t bs, sm_real *C, ptrdiff_t ldc, int acc) {
#ifdef SM_LS_X86
    if (isa >= SM_ISA_AVX512 && K > 0) {
        k_tilezr2[mr](K, A, ars, acs, B, bs, C, ldc, acc);
        return;
    }
#endif
    (void)isa; /* never reached below AVX-512 (direct_pairs), but correct there too */
    sm_gemm_tiny(mr, 2 * NR, K, 1, A, ars, acs, B, bs, acc ? 1 : 0, C, ldc);
}

/* The backward's B (the weight for dinp, the input for dweight), read where it lies instead of
 * packed: the columns [0, direct_pairs(isa, cw)) of a window of cw, its whole pairs of 16-column
 * panels with AVX-512 (none with AVX2). Each k then reads two lines of a row, rows 4 KB apart for a
 * 1024-wide layer - the L1 set conflicts that sank an unpacked AVX2 tile (0.40x OpenBLAS) - but the
 * two-panel AVX-512 tile spends 24 FMAs (12 cycles) on those two lines, which L2 serves in time, and
 * packing's copy of the weight (512 KB per DQN update) is gone: the MinAtar DQN's 32 x 1024 -> 128
 * backward took 124 us instead of 139 (dinp 129, dweight 134 alone; BENCHMARKS.md, "DQN on
 * MinAtar"). The same values in the same order: the same bits. */
static int direct_pairs(int isa, int cw) { return isa >= SM_ISA_AVX512 ? cw / 32 * 32 : 0; }

/* the forward by rows or transposed (sm_linear_forward_small_ex, where the rule is explained) */
static int forward_by_rows(int isa, int T, int C, int OC) {
#ifdef SM_LS_X86
    return isa >= SM_ISA_AVX512 && (C <= T || (OC % NR == 0 && OC <= T));
#else
    (void)isa, (void)T, (void)C, (void)OC;
    return 0;
#endif
}

/* the backward packs its operands one window of CW columns at a time, so its workspace does not
 * grow with the layer's width (a window's rows are still read in long contiguous runs) */
#define CW 256

size_t sm_linear_small_ws_for(int T, int C, int OC, int use) {
    const size_t Tp = (size_t)round16(T), Cw = (size_t)(round16(C) < CW ? round16(C) : CW);
    /* inp^T panels and out^T, or (by rows) the weight's panels */
    const size_t fwd_t = Tp * (size_t)C + (size_t)OC * Tp;
    /* the CPU's own ISA: an ISA cap set later only turns the form by rows off */
    const size_t fwd_r = forward_by_rows(sm_gemm_tiny_cpu_isa(), T, C, OC) ? (size_t)round16(OC) * (size_t)C : 0;
    const size_t fwd = use & SM_LINEAR_SMALL_FWD ? (fwd_t > fwd_r ? fwd_t : fwd_r) : 0;
    const size_t dinp = use & SM_LINEAR_SMALL_DINP ? (size_t)OC * Cw : 0; /* a window of weight panels */
    const size_t dw = use & SM_LINEAR_SMALL_DWEIGHT ? (size_t)T * Cw : 0;  /* a window of inp panels */
    const size_t bwd = dinp > dw ? dinp : dw; /* one after the other in the same space */
    return fwd > bwd ? fwd : bwd;
}

size_t sm_linear_small_ws(int T, int C, int OC) {
    return sm_linear_small_ws_for(T, C, OC, SM_LINEAR_SMALL_FWD | SM_LINEAR_SMALL_DINP | SM_LINEAR_SMALL_DWEIGHT);
}

size_t sm_linear_small_ws_upto(int maxT, int C, int OC, int *rows) {
    size_t n = 0;
    *rows = 0;
    for (int T = 2; T <= (maxT < 256 ? maxT : 256); T++) {
        const int use = sm_linear_small_use_max(T, C, OC); /* whatever ISA cap runs later */
        const size_t k = sm_linear_small_ws_for(T, C, OC, use);
        if (use) *rows = T;
        n = k > n ? k : n;
    }
    return n;
}

#ifdef SM_LS_X86
/* 1 when OpenBLAS runs AVX-512 kernels here (its core name: SkylakeX, Cooperlake, SapphireRapids):
 * then the AVX-512 tile meets its equal, and the rule measured between equals (the AVX2 one) holds */
static int blas_avx512(void) {
    static atomic_int have = -1; /* threads racing here store the same value */
    int h = atomic_load(&have);
    if (h < 0) {
        const char *n = openblas_get_corename();
        h = n && (strstr(n, "kylakex") || strstr(n, "KYLAKEX") || strstr(n, "ooperlake") || strstr(n, "OOPERLAKE") ||
                  strstr(n, "apphire") || strstr(n, "APPHIRE"));
        atomic_store(&have, h);
    }
    return h;
}
#endif

/* the rule for instruction set isa (below) */
static int use_rule(int isa, int T, int C, int OC);

int sm_linear_small_use(int T, int C, int OC) { return use_rule(sm_gemm_tiny_isa(), T, C, OC); }

/* what the CPU's own ISA picks, whatever cap sm_gemm_tiny_set_isa sets: on an AVX-512 CPU its rule
 * takes every product the AVX2 rule takes and more, so a workspace sized by it serves any cap */
int sm_linear_small_use_max(int T, int C, int OC) { return use_rule(sm_gemm_tiny_cpu_isa(), T, C, OC); }

static int use_rule(int isa, int T, int C, int OC) {
    /* Measured (BENCHMARKS.md, "The packed small GEMM": `specmoe bench gemm`, the fastest of
     * alternated batches of each, rows 2-256, widths 64-512 square, 1024 -> 128 and 128 -> 6, one
     * Zen 3 core under load), as the ratio OpenBLAS time / packed time:
     *   forward  1.0-1.27x at 16-48 rows (32 x 1024 -> 128: 1.24x) - the weight is never packed;
     *            1.7-2.1x for narrow outputs (OC <= 16, a Q head) from 16 rows; 0.66-0.98x at 64+
     *            rows of square layers (the input panels outgrow L1) and at 2-8 rows;
     *   dinp     1.4-1.7x at 2 rows; 0.95-1.06x at 8-32 rows (a few % behind once the weight
     *            exceeds 256 KB: the packed kernel copies it into panels too, as OpenBLAS does);
     *            0.75-1.2x above;
     *   dweight  1.0-1.1x at 8-32 rows of layers up to 128 x 128 and 1.3-1.8x for narrow outputs,
     *            0.88-0.99x for larger layers at 32 rows, 0.7-0.8x at 2 rows and at 64+ rows.
     * So: the forward from 16 to 48 rows or with OC <= 16; dinp at up to 4 rows, or up to 32 rows
     * of at most 64k weights; dweight from 8 rows, up to 32 rows of at most 64k weights or with
     * OC <= 16. The bounds on C and OC keep a call's workspace within 16 M reals. */
    if (isa < SM_ISA_AVX2 || T < 2 || T > 256 || C < 1 || OC < 1 || C > 4096 || OC > 4096) return 0;
    const int small_w = (long)C * OC <= 65536;
    int use = 0;
#ifdef SM_LS_X86
    if (isa >= SM_ISA_AVX512 && !blas_avx512()) {
        /* The AVX-512 tile against OpenBLAS's AVX2 kernels (BENCHMARKS.md, "DQN on MinAtar", the
         * AVX-512 tile: `specmoe bench gemm` on a Zen 5 core, where OpenBLAS 0.3.21 runs its Haswell
         * kernels), OpenBLAS time / packed time: forward 1.0-1.8x from 8 rows (0.9x once, 128 x 64
         * -> 64), 1.8-2.3x for a Q head; dinp 1.2-1.8x at every row count except narrow outputs at
         * 64+ rows (0.8-0.9x); dweight 1.2-1.8x from 32 rows, 0.9-1.1x at 8 rows, 0.6-0.9x at 2. */
        if (T >= 8) use |= SM_LINEAR_SMALL_FWD;
        if (T <= 32 || OC > 16) use |= SM_LINEAR_SMALL_DINP;
        if (T >= 32 || (T >= 8 && (small_w || OC <= 16))) use |= SM_LINEAR_SMALL_DWEIGHT;
        return use;
    }
#endif
    if (T >= 16 && (T <= 48 || OC <= 16)) use |= SM_LINEAR_SMALL_FWD;
    if (T <= 4 || (T <= 32 && small_w)) use |= SM_LINEAR_SMALL_DINP;
    if (T >= 8 && ((T <= 32 && small_w) || OC <= 16)) use |= SM_LINEAR_SMALL_DWEIGHT;
    return use;
}

/* dst [k][16] (K rows) = src's first n (<= 16) columns of K rows ld apart, zero padded so the
 * tile's vector loads read defined values. */
static void pack_cols(sm_real *restrict dst, const sm_real *restrict src, ptrdiff_t ld, int K, int n) {
    for (int k = 0; k < K; k++) {
        sm_real *d = dst + (size_t)k * NR;
        const sm_real *s = src + k * ld;
        if (n == NR) memcpy(d, s, sizeof(sm_real) * NR);
        else
            for (int c = 0; c < NR; c++) d[c] = c < n ? s[c] : 0;
    }
}

/* dst (Cp/16, K, 16) = every 16-column panel of src (K rows of C, ld apart), zero padded. Eight rows
 * at a time, panel by panel: the eight rows are read front to back (eight streams the hardware
 * prefetcher follows; one panel at a time would jump a page per row, and its 4 KB-apart lines all
 * fall in one L1 set) and each panel gets 512 contiguous bytes. */
static void pack_panels(sm_real *restrict dst, const sm_real *restrict src, ptrdiff_t ld, int K, int C) {
    enum { RB = 8 };
    for (int k0 = 0; k0 < K; k0 += RB) {
        const int kb = K - k0 < RB ? K - k0 : RB;
        for (int j = 0; j < C; j += NR)
            pack_cols(dst + (size_t)j * K + (size_t)k0 * NR, src + k0 * ld + j, ld, kb, C - j < NR ? C - j : NR);
    }
}

#ifdef SM_LS_X86
/* dst[k][0:8] for k in [0, 8): the 8 x 8 block of 8 rows of src (ld apart) at columns 0-7, transposed
 * in registers (unpack pairs, then quads, then the 128-bit halves) */
SM_TARGET void sm_transpose8x8(float *restrict dst, const float *restrict src, ptrdiff_t ld) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * ld);
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44), r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44), r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * NR, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * NR, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#endif

/* dst [k][16] (K columns of src) = rows [0, n) of src transposed (rows ld apart), zero padded.
 * Blocked over k so the 64 destination lines of a block stay in L1 while the 16 rows fill them;
 * with AVX2, full 8 x 8 blocks are transposed in registers. */
static void pack_rows_t(sm_real *restrict dst, const sm_real *restrict src, ptrdiff_t ld, int K, int n, int simd) {
    enum { KB = 64 };
    int k8 = 0; /* columns [0, k8) done by the 8 x 8 blocks */
#ifdef SM_LS_X86
    if (simd && n == NR) {
        k8 = K / 8 * 8;
        for (int k = 0; k < k8; k += 8) {
            sm_transpose8x8(dst + (size_t)k * NR, src + k, ld);
            sm_transpose8x8(dst + (size_t)k * NR + 8, src + 8 * ld + k, ld);
        }
    }
#endif
    (void)simd;
    for (int k0 = k8; k0 < K; k0 += KB) {
        const int k1 = k0 + KB < K ? k0 + KB : K;
        for (int c = 0; c < NR; c++) {
            if (c < n) {
                const sm_real *s = src + c * ld;
                for (int k = k0; k < k1; k++) dst[(size_t)k * NR + c] = s[k];
            } else
                for (int k = k0; k < k1; k++) dst[(size_t)k * NR + c] = 0;
        }
    }
}

/* The forward by rows, with AVX-512: out (T,OC) = inp (T,C) @ weight^T + bias with the weight packed
 * transposed into 16-output panels [C][16] (ws: round16(OC) C reals), A = inp's rows where they lie
 * (12 at a time, two panels a tile), the bias added per column and the ReLU written in the tile's
 * epilogue: no out^T to transpose back, no pass of its own for the activation. Packing the weight
 * costs C OC copies; the transposed form packs T C and transposes T OC back, one scalar at a time (an
 * expert's 16 -> 512 map over 128 slot rows spent more in that transpose than in its FMAs:
 * BENCHMARKS.md, "SoftMoE in the DQN update"). So: by rows when C <= T, or when OC <= T fills whole
 * panels (an expert's 512 -> 16 map over 128 rows: its forward 1595 -> 1430 us a DQN update); not
 * for the dense layer's 32 x 1024 -> 128, whose weight is never packed in the transposed form, nor
 * for a narrow head (6 outputs would use 6 of a panel's 16 lanes). Per element the same FMA chain over
 * k in order, then + bias: the same bits as the transposed form. */

void sm_linear_forward_small(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int T, int C,
                             int OC, sm_real *ws) {
    sm_linear_forward_small_ex(out, NULL, inp, weight, bias, T, C, OC, ws);
}

void sm_linear_forward_small_ex(sm_real *out, sm_real *relu, const sm_real *inp, const sm_real *weight,
                                const sm_real *bias, int T, int C, int OC, sm_real *ws) {
    if (T <= 0 || OC <= 0 || (!out && !relu)) return;
    const int isa = sm_gemm_tiny_isa(), simd = isa >= SM_ISA_AVX2, Tp = round16(T), mrt = tile_rows(isa);
#ifdef SM_LS_X86
    if (forward_by_rows(isa, T, C, OC) && C > 0) {
        for (int o = 0; o < OC; o += NR) /* ws (OCp/16, C, 16): panel o/16 = weight rows o .. o+15 transposed */
            pack_rows_t(ws + (size_t)o * C, weight + (size_t)o * C, C, C, OC - o < NR ? OC - o : NR, simd);
        for (int i = 0; i < T; i += mrt) {
            const int mr = T - i < mrt ? T - i : mrt;
            const sm_real *a = inp + (size_t)i * C;
            sm_real *c = out ? out + (size_t)i * OC : NULL, *c2 = relu ? relu + (size_t)i * OC : NULL;
            int o = 0;
            for (; o + 2 * NR <= OC; o += 2 * NR)
                k_tilezb2[mr](C, a, C, ws + (size_t)o * C, (ptrdiff_t)NR * C, bias ? bias + o : NULL, c ? c + o : NULL, OC,
                              NR, c2 ? c2 + o : NULL);
            for (; o < OC; o += NR)
                k_tilezb[mr](C, a, C, ws + (size_t)o * C, 0, bias ? bias + o : NULL, c ? c + o : NULL, OC,
                             OC - o < NR ? OC - o : NR, c2 ? c2 + o : NULL);
        }
        return;
    }
#endif
    sm_real *xp = ws;                          /* (Tp/16, C, 16) inp^T in panels */
    sm_real *yt = ws + (size_t)Tp * (size_t)C; /* (OC, Tp) out^T */
    for (int p = 0; p < Tp; p += NR) pack_rows_t(xp + (size_t)p * C, inp + (size_t)p * C, C, C, T - p < NR ? T - p : NR, simd);
    /* out^T (OC,Tp) = weight (OC,C) @ inp^T (C,Tp): 6 weight rows at a time against every panel, so
     * the rows are read from memory once and from L1 for the other panels */
    for (int o = 0; o < OC; o += mrt) {
        const int mr = OC - o < mrt ? OC - o : mrt;
        int p = 0;
        for (; p + 2 * NR <= Tp; p += 2 * NR) /* two panels a tile (yt is Tp wide: padding columns too) */
            run_tile2(isa, mr, C, weight + (size_t)o * C, C, 1, xp + (size_t)p * C, (ptrdiff_t)NR * C,
                      yt + (size_t)o * Tp + p, Tp, 0, p == 0);
        for (; p < Tp; p += NR)
            run_tile(isa, mr, C, weight + (size_t)o * C, C, 1, xp + (size_t)p * C, yt + (size_t)o * Tp + p, Tp, NR, 0,
                     p == 0);
    }
    /* out (T,OC) = out^T^T + bias, in 16-row strips so the strip's out lines stay in L1 (into relu when
     * out is not wanted) */
    sm_real *dst = out ? out : relu;
    for (int t0 = 0; t0 < T; t0 += NR) {
        const int t1 = t0 + NR < T ? t0 + NR : T;
        for (int o = 0; o < OC; o++) {
            const sm_real b = bias ? bias[o] : 0, *y = yt + (size_t)o * Tp;
            for (int t = t0; t < t1; t++) dst[(size_t)t * OC + o] = y[t] + b;
        }
    }
    /* the ReLU, x > 0 ? x : 0 (a NaN gives 0, as sm_act_forward), in a contiguous pass that vectorises
     * (beside the strided stores above, a second strided one made the MinAtar DQN's 32 x 1024 -> 512
     * forward slower than sm_act_forward after it) */
    if (relu)
        for (size_t i = 0; i < (size_t)T * OC; i++) relu[i] = dst[i] > 0 ? dst[i] : 0;
}

void sm_linear_backward_small(sm_real *dinp, sm_real *dweight, const sm_real *dout, const sm_real *inp,
                              const sm_real *weight, int T, int C, int OC, sm_real *ws) {
    sm_linear_backward_small_ex(dinp, dweight, dout, inp, weight, T, C, OC, ws, 0);
}

void sm_linear_backward_small_ex(sm_real *dinp, sm_real *dweight, const sm_real *dout, const sm_real *inp,
                                 const sm_real *weight, int T, int C, int OC, sm_real *ws, int set) {
    if (T <= 0 || OC <= 0) return;
    /* dweight's tiles: += (0: =, each element written once, no zeroing pass first); dinp's likewise */
    const int dacc = !(set & SM_LINEAR_SET_DWEIGHT), iacc = !(set & SM_LINEAR_SET_DINP);
    const int isa = sm_gemm_tiny_isa(), mrt = tile_rows(isa);
    if (dinp) /* dinp[:, j:j+16] (T,16) += dout (T,OC) @ weight[:, j:j+16] (OC,16), a window of columns
               * at a time: with AVX-512 its whole pairs of panels read where they lie, the rest (and
               * everything with AVX2) packed first, then each panel's (or pair's) tiles of rows while
               * it is in L1 */
        for (int j0 = 0; j0 < C; j0 += CW) {
            const int cw = C - j0 < CW ? C - j0 : CW, jp = direct_pairs(isa, cw);
            for (int j = 0; j < jp; j += 2 * NR)
                for (int i = 0; i < T; i += mrt)
                    run_tile2_rows(isa, T - i < mrt ? T - i : mrt, OC, dout + (size_t)i * OC, OC, 1, weight + j0 + j, C,
                                   dinp + (size_t)i * C + j0 + j, C, iacc);
            if (jp == cw) continue;
            const int jr = j0 + jp, cr = cw - jp; /* the packed rest: columns jr .. jr + cr */
            pack_panels(ws, weight + jr, C, OC, cr);
            int j = 0;
            for (; j + 2 * NR <= cr; j += 2 * NR)
                for (int i = 0; i < T; i += mrt)
                    run_tile2(isa, T - i < mrt ? T - i : mrt, OC, dout + (size_t)i * OC, OC, 1, ws + (size_t)j * OC,
                              (ptrdiff_t)NR * OC, dinp + (size_t)i * C + jr + j, C, iacc, 0);
            for (; j < cr; j += NR)
                for (int i = 0; i < T; i += mrt)
                    run_tile(isa, T - i < mrt ? T - i : mrt, OC, dout + (size_t)i * OC, OC, 1, ws + (size_t)j * OC,
                             dinp + (size_t)i * C + jr + j, C, cr - j < NR ? cr - j : NR, iacc, 0);
        }
    if (dweight) /* dweight (OC,C) [+]= dout^T (OC,T) @ inp (T,C): a window of inp at a time (its pairs of
                  * panels read where they lie with AVX-512, the rest packed), dweight's window walked a
                  * tile of rows (6, or 12 with AVX-512) at a time from left to right; each element is
                  * one tile's, so `set` overwrites every one */
        for (int j0 = 0; j0 < C; j0 += CW) {
            const int cw = C - j0 < CW ? C - j0 : CW, jp = direct_pairs(isa, cw);
            const int jr = j0 + jp, cr = cw - jp;
            if (cr) pack_panels(ws, inp + jr, C, T, cr);
            for (int o = 0; o < OC; o += mrt) {
                const int mr = OC - o < mrt ? OC - o : mrt;
                for (int j = 0; j < jp; j += 2 * NR)
                    run_tile2_rows(isa, mr, T, dout + o, 1, OC, inp + j0 + j, C, dweight + (size_t)o * C + j0 + j, C,
                                   dacc);
                int j = 0;
                for (; j + 2 * NR <= cr; j += 2 * NR)
                    run_tile2(isa, mr, T, dout + o, 1, OC, ws + (size_t)j * T, (ptrdiff_t)NR * T,
                              dweight + (size_t)o * C + jr + j, C, dacc, 0);
                for (; j < cr; j += NR)
                    run_tile(isa, mr, T, dout + o, 1, OC, ws + (size_t)j * T, dweight + (size_t)o * C + jr + j, C,
                             cr - j < NR ? cr - j : NR, dacc, 0);
            }
        }
}
