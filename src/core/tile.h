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

enum { SM_TILE_MRZ = 12, SM_TILE_MR_MAX = SM_TILE_MRZ }; /* the AVX-512 tile's rows, the most of any tile (AVX2: 6) */

/* rows of the tile of instruction set isa (SM_ISA_AVX2 or above; sm_gemm_tiny_isa() read once per
 * call by the caller, which passes the same isa to sm_tile16): 6 (AVX2) or SM_TILE_MRZ (AVX-512) */
int sm_tile_rows(int isa);

/* C (mr rows ldc apart, first n <= 16 columns) = [C +] (A (mr, K) @ Bp (K, 16) [+ radd[r] on row r]),
 * 1 <= mr <= sm_tile_rows(isa), K >= 1, with
 *   Bp   a packed panel [K][16], contiguous;
 *   A    a(r, k) = A[(k / 16) * akc + r * ars + (k % 16) * acs] (akc = 16 acs: plain strides);
 *   radd NULL, or one value per row added after the whole sum (a bias);
 *   acc  1: C += the result, 0: C = the result.
 * The sum over k runs in order (k = 0, 1, ...), one FMA chain per output. */
void sm_tile16(int isa, int mr, int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, ptrdiff_t akc, const float *Bp,
               const float *radd, float *C, ptrdiff_t ldc, int n, int acc);

/* dst[k * 16 + i] = src[i * ld + k] for i, k in [0, 8): an 8 x 8 block transposed in registers into
 * rows 16 floats apart (a panel's layout). */
void sm_transpose8x8(float *restrict dst, const float *restrict src, ptrdiff_t ld);
#endif

#endif
