/* The register tiles of src/core/linear_small.c, shared with the convolution's packed path
 * (src/core/conv.c). Internal: not part of the installed headers.
 *
 *   AVX2 + FMA   6 rows x 16 columns: 12 ymm accumulators (two per row), two B vectors;
 *   AVX-512F     SM_TILE_MRZ rows x 16 columns: one zmm accumulator per row, one B vector - the
 *                same packed panels, twice the FMA width (a Zen 5 or Skylake-X core runs two
 *                512-bit FMAs a cycle: the AVX2 tile reaches at most half its peak there).
 * Both sum over k in order with one FMA per lane and step, then add radd and C the same way, so the
 * two give the same bits. Exist only where SM_TILE_AVX2 is defined (x86-64, GCC or Clang, the float
 * build); may be called only when sm_gemm_tiny_simd() says the CPU has AVX2 and FMA. */
#ifndef SPECMOE_CORE_TILE_H
#define SPECMOE_CORE_TILE_H

#include <stddef.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(SPECMOE_DOUBLE)
#define SM_TILE_AVX2 1

/* The AVX-512 tile's rows: SM_TILE_MRZ where A's rows lie far apart (a layer's weight rows, 4 KB
 * apart: more would not share the 12-way L1) and for the two-panel tile (24 accumulators), up to
 * SM_TILE_MR_MAX for one panel whose A is a small contiguous block (the convolution's weight, 16
 * output channels x C K K: one tile a panel instead of 12 + 4 rows). AVX2: 6. */
enum { SM_TILE_MRZ = 12, SM_TILE_MR_MAX = 16 };

/* rows of the tile of instruction set isa (SM_ISA_AVX2 or above; sm_gemm_tiny_isa() read once per
 * call by the caller, which passes the same isa to sm_tile16): 6 (AVX2) or SM_TILE_MRZ (AVX-512);
 * sm_tile_rows_max: the most rows sm_tile16 takes, 6 or SM_TILE_MR_MAX */
int sm_tile_rows(int isa);
int sm_tile_rows_max(int isa);

/* C (mr rows ldc apart, first n <= 16 columns) = [C +] (A (mr, K) @ Bp (K, 16) [+ radd[r] on row r]),
 * 1 <= mr <= sm_tile_rows_max(isa), K >= 1, with
 *   Bp   a packed panel [K][16], contiguous;
 *   A    a(r, k) = A[(k / 16) * akc + r * ars + (k % 16) * acs] (akc = 16 acs: plain strides);
 *   radd NULL, or one value per row added after the whole sum (a bias);
 *   acc  1: C += the result, 0: C = the result.
 * The sum over k runs in order (k = 0, 1, ...), one FMA chain per output. */
void sm_tile16(int isa, int mr, int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, ptrdiff_t akc, const float *Bp,
               const float *radd, float *C, ptrdiff_t ldc, int n, int acc);

/* sm_tile16 with A in 16-wide panels, a(r, k) = A[(k / 16) * akc + r * 16 + k % 16] (ars = 16, acs =
 * 1: the convolution's im2col panels, read as rows by its weight gradient), C = the result (acc 0,
 * n = 16, no radd). The constant row stride keeps the mr row addresses out of the general
 * registers (sm_tile16 spilled them and ran the MinAtar conv's weight gradient at half its rate). */
void sm_tile16_panels(int isa, int mr, int K, const float *A, ptrdiff_t akc, const float *Bp, float *C, ptrdiff_t ldc);

/* sm_tile16 for a small A packed k-major, Ap[k * mr + r] = a(r, k) (the convolution's weight, conv.c:
 * one line of broadcasts per k at constant offsets; 16 row pointers would not fit the 16 general
 * registers), all 16 columns written, mr <= sm_tile_rows_max(isa). B is either
 *   packed (boff NULL): a panel [K][16] at B, as in sm_tile16, or
 *   gathered: row k is B[boff[k] + 0..7] followed by B[boff[k] + bw + 0..7], read where it lies -
 *   two output rows of 8 pixels (bw = the input's row length) or one of 16 (bw = 8), the
 *   convolution's direct forward.
 * Per output the same FMA chain as sm_tile16 over the same values: the same bits.
 * C2 NULL, or a second output (ldc apart as C) that takes the ReLU of the result, x > 0 ? x : 0 (a
 * NaN gives 0, as sm_act_forward): the convolution's activation in its epilogue instead of a pass
 * of its own; with C2 given C may be NULL (acc 0), and only the ReLU is written. */
void sm_tile16_wp(int isa, int mr, int K, const float *Ap, const float *B, const int *boff, ptrdiff_t bw, const float *radd,
                  float *C, ptrdiff_t ldc, int acc, float *C2);

/* dst[k * 16 + i] = src[i * ld + k] for i, k in [0, 8): an 8 x 8 block transposed in registers into
 * rows 16 floats apart (a panel's layout). */
void sm_transpose8x8(float *restrict dst, const float *restrict src, ptrdiff_t ld);
#endif

#endif
