/* The 6 x 16 AVX2 + FMA register tile of src/core/linear_small.c, shared with the convolution's
 * packed path (src/core/conv.c). Internal: not part of the installed headers.
 *
 * Both exist only where SM_TILE_AVX2 is defined (x86-64, GCC or Clang, the float build), and may be
 * called only when sm_gemm_tiny_simd() says the CPU has AVX2 and FMA. */
#ifndef SPECMOE_CORE_TILE_H
#define SPECMOE_CORE_TILE_H

#include <stddef.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(SPECMOE_DOUBLE)
#define SM_TILE_AVX2 1

/* C (mr rows ldc apart, first n <= 16 columns) = [C +] (A (mr, K) @ Bp (K, 16) [+ radd[r] on row r]),
 * 1 <= mr <= 6, K >= 1, with
 *   Bp   a packed panel [K][16], contiguous;
 *   A    a(r, k) = A[(k / 16) * akc + r * ars + (k % 16) * acs] (akc = 16 acs: plain strides);
 *   radd NULL, or one value per row added after the whole sum (a bias);
 *   acc  1: C += the result, 0: C = the result.
 * The sum over k runs in order (k = 0, 1, ...), one FMA chain per output. */
void sm_tile6x16(int mr, int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, ptrdiff_t akc, const float *Bp,
                 const float *radd, float *C, ptrdiff_t ldc, int n, int acc);

/* dst[k * 16 + i] = src[i * ld + k] for i, k in [0, 8): an 8 x 8 block transposed in registers into
 * rows 16 floats apart (a panel's layout). */
void sm_transpose8x8(float *restrict dst, const float *restrict src, ptrdiff_t ld);
#endif

#endif
