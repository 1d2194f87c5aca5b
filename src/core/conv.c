/* Image ops on NCHW tensors: conv2d (im2col + GEMM), max / average / adaptive average pooling.
 * Shapes and conventions: include/specmoe/conv.h. Letters: B images, C input channels, OC output
 * channels, H x W input, OH x OW output, KH x KW kernel, K x K pooling window, S pooling stride,
 * P = OH*OW output pixels per plane, CKK = C*KH*KW rows of the im2col matrix.
 *
 * Threading: the convolution GEMMs are threaded by OpenBLAS; the loops here split over (image,
 * channel) planes or over input channels, which write disjoint memory, so results do not depend on
 * the thread count. Small problems stay serial (the `if` clauses): a parallel region costs more than
 * a few thousand multiply-adds.
 * The forward and the weight gradient are one GEMM over the whole batch (im2col writes the batch's
 * columns side by side); the input gradient stays one GEMM per image, whose columns are scattered back
 * by col2im. Those per-image GEMMs are small (e.g. 288 x 49 x 64 for a 32 -> 64 channel 3x3 layer on
 * 7x7 outputs). On a machine whose cores are busy with another process, OpenBLAS's OpenMP workers spin-waiting
 * between them made one such backward 50-100x slower (0.4-1 s instead of 8 ms, measured with 2
 * threads next to a 2-core benchmark); OMP_WAIT_POLICY=passive removes that, as BENCHMARKS.md already
 * recommends for the PyTorch peer.
 */
#include "specmoe/core/conv.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "specmoe/core/ops.h"
#include "tile.h"

#ifdef SM_TILE_AVX2
#include <immintrin.h>
#endif

/* zero skipping in the direct forward and weight gradient ("Zero skipping" below): on unless a test
 * or an A/B timing turns it off */
static _Atomic int zero_skip_on = 1;
void sm_conv2d_set_zero_skip(int on) { zero_skip_on = on != 0; }


sm_status sm_conv2d_shape(int H, int W, int KH, int KW, int stride, int pad, int *OH, int *OW, sm_error *err) {
    if (H < 1 || W < 1)
        return sm_fail(err, SM_ERR_ARG, "conv2d: input is %d x %d, need at least 1 x 1", H, W);
    if (KH < 1 || KW < 1)
        return sm_fail(err, SM_ERR_ARG, "conv2d: kernel is %d x %d, need at least 1 x 1", KH, KW);
    if (stride < 1) return sm_fail(err, SM_ERR_ARG, "conv2d: stride %d, need stride >= 1", stride);
    if (pad < 0) return sm_fail(err, SM_ERR_ARG, "conv2d: padding %d, need padding >= 0", pad);
    /* in long long: H + 2 pad may not fit an int */
    long long ph = (long long)H + 2LL * pad, pw = (long long)W + 2LL * pad;
    if (KH > ph || KW > pw)
        return sm_fail(err, SM_ERR_ARG,
                       "conv2d: kernel %d x %d is larger than the %d x %d input padded by %d on each side "
                       "(%lld x %lld)",
                       KH, KW, H, W, pad, ph, pw);
    long long oh = (ph - KH) / stride + 1, ow = (pw - KW) / stride + 1;
    if (oh * ow > INT_MAX)
        return sm_fail(err, SM_ERR_ARG, "conv2d: output %lld x %lld from a %d x %d input has more than %d pixels",
                       oh, ow, H, W, INT_MAX);
    if (OH) *OH = (int)oh;
    if (OW) *OW = (int)ow;
    return SM_OK;
}

size_t sm_conv2d_col_size(int C, int H, int W, int KH, int KW, int stride, int pad) {
    int OH = 0, OW = 0;
    if (C < 1 || sm_conv2d_shape(H, W, KH, KW, stride, pad, &OH, &OW, NULL) != SM_OK) return 0;
    /* the GEMMs take int dimensions: refuse what they cannot index */
    if ((long long)C * KH * KW > INT_MAX) return 0;
    return (size_t)C * KH * KW * (size_t)OH * OW;
}

/* ---------------------------------------------------------------------------------------------- */
/* im2col over the batch, col2im for one image */

/* The output columns j whose input column j*stride - pad + q lies inside [0, W): [*lo, *hi). */
static void valid_range(int *lo, int *hi, int OW, int W, int stride, int pad, int q) {
    int a = 0, b = OW;
    while (a < b && a * stride - pad + q < 0) a++;
    while (b > a && (b - 1) * stride - pad + q >= W) b--;
    *lo = a;
    *hi = b;
}

/* dst (n, OW) <- the first OW values of n rows of src, W apart. Inlined, so a call with a constant OW
 * gets a copy GCC unrolls into whole vector moves: for 8-value rows that made im2col 2-3x faster
 * than the same loop with OW known only at run time (which GCC wraps in trip-count and remainder
 * handling larger than the copy). */
static inline __attribute__((always_inline)) void copy_rows(sm_real *restrict dst, const sm_real *restrict src, int n,
                                                            int W, int OW) {
    for (int i = 0; i < n; i++, src += W, dst += OW)
        for (int j = 0; j < OW; j++) dst[j] = src[j];
}

/* col (CKK, B*P): row (c, p, q) holds inp[b, c, i*stride - pad + p, j*stride - pad + q] at column
 * b*P + i*OW + j, 0 where that falls in the padding.  inp (B, C, H, W).
 * Each row of col is written by one iteration of the parallel loop, so the result does not depend on
 * the thread count. The copies are plain loops over restrict pointers, the padding's rows and columns
 * found once per row of col: RL's rows are 8-10 floats, where a memcpy call, or the aliasing checks
 * GCC adds without restrict, cost more than the copy (BENCHMARKS.md, "DQN on MinAtar"). */
/* im2col's and col2im_add's arguments, for sm_par_for (dst the array written, src the one read) */
typedef struct {
    sm_real *dst;
    const sm_real *src;
    int B, C, H, W, KH, KW, stride, pad, OH, OW;
} col_job;

static void im2col_rows(void *arg, long r0, long r1) {
    const col_job *jb = arg;
    sm_real *restrict col = jb->dst;
    const sm_real *restrict inp = jb->src;
    const int B = jb->B, C = jb->C, H = jb->H, W = jb->W, KH = jb->KH, KW = jb->KW, stride = jb->stride, pad = jb->pad,
              OH = jb->OH, OW = jb->OW;
    const size_t P = (size_t)OH * OW, BP = (size_t)B * P, img = (size_t)C * H * W;
    for (int r = (int)r0; r < (int)r1; r++) {
        const int c = r / (KH * KW), p = (r / KW) % KH, q = r % KW;
        int lo, hi;
        valid_range(&lo, &hi, OW, W, stride, pad, q);
        const int off = q - pad; /* input column of output column j is j*stride + off */
        int ilo = 0, ihi = OH; /* output rows whose input row lies inside [0, H) */
        while (ilo < OH && ilo * stride - pad + p < 0) ilo++;
        while (ihi > ilo && (ihi - 1) * stride - pad + p >= H) ihi--;
        for (int b = 0; b < B; b++) {
            sm_real *restrict row = col + (size_t)r * BP + (size_t)b * P;
            const sm_real *restrict plane = inp + (size_t)b * img + (size_t)c * H * W;
            for (size_t t = 0; t < (size_t)ilo * OW; t++) row[t] = 0;
            if (stride == 1 && lo == 0 && hi == OW) {
                /* no padding along the row: OW values straight from the input row */
                const sm_real *src = plane + (size_t)(ilo - pad + p) * W + off;
                sm_real *dst = row + (size_t)ilo * OW;
                if (OW == 8) /* MinAtar: 10 x 10 inputs, 3 x 3 kernel */
                    copy_rows(dst, src, ihi - ilo, W, 8);
                else
                    copy_rows(dst, src, ihi - ilo, W, OW);
            } else {
                for (int i = ilo; i < ihi; i++) {
                    const sm_real *restrict src = plane + (size_t)(i * stride - pad + p) * W;
                    sm_real *restrict dst = row + (size_t)i * OW;
                    for (int j = 0; j < lo; j++) dst[j] = 0;
                    for (int j = lo; j < hi; j++) dst[j] = src[j * stride + off];
                    for (int j = hi; j < OW; j++) dst[j] = 0;
                }
            }
            for (size_t t = (size_t)ihi * OW; t < P; t++) row[t] = 0;
        }
    }
}

static void im2col(sm_real *restrict col, const sm_real *restrict inp, int B, int C, int H, int W, int KH, int KW,
                   int stride, int pad, int OH, int OW) {
    const int CKK = C * KH * KW;
    col_job j = {col, inp, B, C, H, W, KH, KW, stride, pad, OH, OW};
    sm_par_for(sm_par_threads((size_t)CKK * B * OH * OW), CKK, im2col_rows, &j);
}

/* The adjoint of im2col for one image: img (C, H, W) += every entry of col (CKK, P) added back onto
 * the pixel it was copied from; padding entries are dropped. Each channel is its own plane of img, so
 * the channel loop can run in parallel; within a channel the (p, q) rows overlap and stay serial. */
static void col2im_channels(void *arg, long c0, long c1) {
    const col_job *jb = arg;
    sm_real *img = jb->dst;
    const sm_real *col = jb->src;
    const int H = jb->H, W = jb->W, KH = jb->KH, KW = jb->KW, stride = jb->stride, pad = jb->pad, OH = jb->OH, OW = jb->OW;
    const size_t P = (size_t)OH * OW;
    for (int c = (int)c0; c < (int)c1; c++) {
        for (int p = 0; p < KH; p++) {
            for (int q = 0; q < KW; q++) {
                const sm_real *row = col + ((size_t)(c * KH + p) * KW + q) * P;
                int lo, hi;
                valid_range(&lo, &hi, OW, W, stride, pad, q);
                const int off = q - pad;
                for (int i = 0; i < OH; i++) {
                    const int ih = i * stride - pad + p;
                    if (ih < 0 || ih >= H) continue;
                    const sm_real *src = row + (size_t)i * OW;
                    sm_real *dst = img + ((size_t)c * H + ih) * W;
                    for (int j = lo; j < hi; j++) dst[j * stride + off] += src[j];
                }
            }
        }
    }
}

static void col2im_add(sm_real *img, const sm_real *col, int C, int H, int W, int KH, int KW, int stride, int pad,
                       int OH, int OW) {
    col_job j = {img, col, 1, C, H, W, KH, KW, stride, pad, OH, OW};
    sm_par_for(sm_par_threads((size_t)C * KH * KW * OH * OW), C, col2im_channels, &j);
}

/* The sum of d[0:n] in eight interleaved partial sums (lane t % 8 takes d[t]), added pairwise at the
 * end: one vector of adds per 8 values. A single running sum is a chain of dependent adds, and for
 * the bias gradient of the MinAtar DQN's conv (32 x 16 rows of 64) it took a tenth of the update's
 * backward. */
static sm_real sum8(const sm_real *restrict d, int n) {
    sm_real acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int t = 0;
    for (; t + 8 <= n; t += 8)
        for (int l = 0; l < 8; l++) acc[l] += d[t + l];
    for (int l = 0; t < n; t++, l++) acc[l] += d[t];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* ---------------------------------------------------------------------------------------------- */
/* The packed path: im2col straight into 16-pixel panels, the GEMMs on the register tile of
 * linear_small.c (src/core/tile.h).
 *
 * Why: at RL sizes the convolution's GEMMs are short and wide - the MinAtar DQN's is
 * (16 x 36) @ (36 x 2048) - and OpenBLAS spent its time on packing col, zeroing tmp (beta = 0) and
 * its edge cases: 13% of a DQN update for the two forwards and 9% for the backward, about 30
 * GFLOP/s where the tile runs at 80-90 (BENCHMARKS.md, "DQN on MinAtar"). Here:
 *   colp  (B*P/16, CKK, 16): panel t holds the im2col columns of pixels n = 16t .. 16t+15 (n = b*P +
 *         i*OW + j), each of the CKK rows 16 floats, so a panel is the tile's packed B as written;
 *   forward  out[b, o, p0:p0+16] = weight (OC, CKK) @ colp[t] (CKK, 16), the weight packed k-major
 *         (pack_weight below), 6 (AVX2) or 16 (AVX-512) weight rows per tile, the result written
 *         straight into out (P % 16 == 0: a panel never straddles two images), plus the bias: no tmp,
 *         no transpose pass; out of training the direct forward below skips colp altogether;
 *   dweight  dweight^T (CKK, OC) += col (CKK, B*P) @ dout^T (B*P, OC): A = colp read by rows in
 *         chunks of 16 pixels (akc = CKK*16, sm_tile16_panels), B = dout^T packed into [n][16] panels
 *         of 16 channels in tmp by 8 x 8 register transposes; each tile (6 or 12 rows x 16) is added
 *         transposed into dweight.
 * Every output is one FMA chain over k in order, on one thread, so results do not depend on the
 * thread count; they differ from OpenBLAS's in the last bits (another order). The input gradient
 * does not read col and keeps its per-image GEMM. Taken when sm_conv2d_packed says so: an AVX2 + FMA
 * CPU, the float build, P and OC multiples of 16 (the MinAtar, Nature-CNN and Impala shapes at
 * 10 x 10 except the last 1 x 1 / 2 x 2 maps); otherwise the OpenBLAS path above. */
int sm_conv2d_packed(int OC, int OH, int OW) {
#ifdef SM_TILE_AVX2
    return sm_gemm_tiny_simd() && OC > 0 && OC % 16 == 0 && OH > 0 && OW > 0 && (OH * OW) % 16 == 0;
#else
    (void)OC, (void)OH, (void)OW;
    return 0;
#endif
}

#ifdef SM_TILE_AVX2
/* colp (B*P/16, CKK, 16) as above: entry (r, n) at colp[(n/16)*CKK*16 + r*16 + n%16], r = (c, p, q),
 * n = b*P + i*OW + j, holding inp[b, c, i*stride - pad + p, j*stride - pad + q] (0 in the padding).
 *
 * When 16 % OW == 0 a panel holds R = 16 / OW whole output rows (P % 16 == 0: every image starts a
 * panel). Then panels are filled one at a time, front to back (each image in the parallel loop: the
 * writes are disjoint), every r's 16 values in turn: R rows of OW from the input, one copy where
 * the rows miss the padding (MinAtar: two rows of 8, unrolled). Each r's padding bounds are worked
 * out once per call into `rows` (walking pixels with those bounds recomputed per row took 3.5x
 * im2col's time; filling r by r, panels 9 KB apart for MinAtar, 1.7x). Otherwise (rows straddle
 * panels) pixel by pixel. */
typedef struct {
    int lo, hi, ilo, ihi; /* output columns / rows whose input lies inside the image */
    ptrdiff_t src;        /* offset of (c, -pad + p, -pad + q) in an image: "input" of output pixel (0, 0) */
} col_row;

enum { COL_ROWS = 256 }; /* rows of colp described at once (6 KB of stack) */

/* rows [0, nr) of one panel (dst at its row r0) from image x: R output rows from i0 */
static void fill_panel(sm_real *restrict dst, const sm_real *restrict x, const col_row *rw, int nr, int i0, int R, int W,
                       int OW, int stride) {
    for (int r = 0; r < nr; r++, dst += 16) {
        const col_row *m = &rw[r];
        const ptrdiff_t at = m->src + (ptrdiff_t)i0 * stride * W;
        if (stride == 1 && m->lo == 0 && m->hi == OW && i0 >= m->ilo && i0 + R <= m->ihi) {
            if (OW == 8) copy_rows(dst, x + at, 2, W, 8);
            else copy_rows(dst, x + at, R, W, OW);
            continue;
        }
        for (int i = 0; i < R; i++)
            for (int j = 0; j < OW; j++)
                dst[i * OW + j] = i0 + i >= m->ilo && i0 + i < m->ihi && j >= m->lo && j < m->hi
                                      ? x[at + (ptrdiff_t)i * stride * W + (ptrdiff_t)j * stride]
                                      : 0;
    }
}

/* im2col_panels' arguments for one block of nr rows from r0, for sm_par_for over the images */
typedef struct {
    sm_real *colp;
    const sm_real *inp;
    const col_row *rw;
    int nr, r0, C, H, W, KH, KW, stride, OH, OW;
} panels_job;

static void panels_images(void *arg, long b0, long b1) {
    const panels_job *jb = arg;
    const int nr = jb->nr, W = jb->W, OH = jb->OH, OW = jb->OW, stride = jb->stride;
    const size_t P = (size_t)OH * OW, img = (size_t)jb->C * jb->H * W, pstride = (size_t)jb->C * jb->KH * jb->KW * 16;
    const int R = 16 % OW == 0 ? 16 / OW : 0;
    const col_row *rw = jb->rw;
    for (long b = b0; b < b1; b++) {
        const sm_real *restrict x = jb->inp + (size_t)b * img;
        sm_real *restrict base = jb->colp + (size_t)b * (P / 16) * pstride + (size_t)jb->r0 * 16;
        if (R) {
            for (int i0 = 0; i0 < OH; i0 += R) fill_panel(base + (size_t)(i0 / R) * pstride, x, rw, nr, i0, R, W, OW, stride);
            continue;
        }
        for (int k = 0; k < nr; k++) { /* rows straddle panels: pixel by pixel */
            const col_row *m = &rw[k];
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    const size_t n = (size_t)i * OW + (size_t)j;
                    base[(n / 16) * pstride + (size_t)k * 16 + n % 16] =
                        i >= m->ilo && i < m->ihi && j >= m->lo && j < m->hi
                            ? x[m->src + (ptrdiff_t)i * stride * W + (ptrdiff_t)j * stride]
                            : 0;
                }
        }
    }
}

static void im2col_panels(sm_real *restrict colp, const sm_real *restrict inp, int B, int C, int H, int W, int KH,
                          int KW, int stride, int pad, int OH, int OW) {
    const size_t P = (size_t)OH * OW;
    const int CKK = C * KH * KW;
    col_row rw[COL_ROWS];
    for (int r0 = 0; r0 < CKK; r0 += COL_ROWS) {
        const int nr = CKK - r0 < COL_ROWS ? CKK - r0 : COL_ROWS;
        for (int k = 0; k < nr; k++) {
            const int r = r0 + k, c = r / (KH * KW), p = (r / KW) % KH, q = r % KW;
            col_row *m = &rw[k];
            valid_range(&m->lo, &m->hi, OW, W, stride, pad, q);
            m->ilo = 0, m->ihi = OH;
            while (m->ilo < OH && m->ilo * stride - pad + p < 0) m->ilo++;
            while (m->ihi > m->ilo && (m->ihi - 1) * stride - pad + p >= H) m->ihi--;
            m->src = (ptrdiff_t)c * H * W + (ptrdiff_t)(p - pad) * W + (q - pad);
        }
        panels_job j = {colp, inp, rw, nr, r0, C, H, W, KH, KW, stride, OH, OW};
        sm_par_for(sm_par_threads((size_t)nr * B * P), B, panels_images, &j);
    }
}

/* The forwards' A, the weight (OC, CKK), k-major in blocks of mr rows (sm_tile16_wp): block o .. o+n
 * (n = mr, or what is left) at wp + o CKK, wp[o CKK + k n + r] = weight[o + r][k]. Read as stored, a
 * tile's mr broadcasts per k come from mr rows CKK apart, and 16 row addresses do not fit the 16
 * general registers: their spills held the MinAtar conv's 16-row tile at 40% of the FMA peak. The
 * same values in the same order: the same bits. At most WP_MAX reals (on the stack): a larger weight
 * is read as stored (and never takes the direct forward). */
enum { WP_MAX = 16384 };

static void pack_weight(sm_real *restrict wp, const sm_real *restrict weight, int OC, int CKK, int mr) {
    for (int o = 0; o < OC; o += mr) {
        const int n = OC - o < mr ? OC - o : mr;
        sm_real *d = wp + (size_t)o * CKK;
        for (int r = 0; r < n; r++)
            for (int k = 0; k < CKK; k++) d[(size_t)k * n + r] = weight[(size_t)(o + r) * CKK + k];
    }
}

/* One forward's panels, for sm_par_for: panel t is output pixels 16 t .. 16 t + 15 of the batch
 * (cols: the packed path's im2col panels; x, boff, bw: the direct path's input where it lies). */
typedef struct {
    sm_real *out, *relu_out;
    const sm_real *cols, *x, *weight, *wp, *bias;
    const int *boff;
    ptrdiff_t bw;
    int isa, mrt, packw, C, H, W, OC, OW, P, CKK;
    int skip, KH, KW; /* the direct forward: zero skipping (direct_panels) */
} fwd_job;

static void packed_panels(void *arg, long t0, long t1) {
    const fwd_job *j = arg;
    const int OC = j->OC, P = j->P, CKK = j->CKK, mrt = j->mrt, isa = j->isa;
    const sm_real *bias = j->bias;
    for (long t = t0; t < t1; t++) {
        const long n0 = t * 16, b = n0 / P, p0 = n0 % P;
        const size_t y0 = (size_t)b * OC * P + p0; /* (OC, 16) at out + y0, rows P apart */
        sm_real *y = j->out + y0, *yr = j->relu_out ? j->relu_out + y0 : NULL;
        const sm_real *Bp = j->cols + (size_t)t * CKK * 16;
        for (int o = 0; o < OC; o += mrt) {
            const int mr = OC - o < mrt ? OC - o : mrt;
            if (j->packw)
                sm_tile16_wp(isa, mr, CKK, j->wp + (size_t)o * CKK, Bp, NULL, 0, bias ? bias + o : NULL, y + (size_t)o * P, P, 0,
                             yr ? yr + (size_t)o * P : NULL);
            else
                sm_tile16(isa, mr, CKK, j->weight + (size_t)o * CKK, CKK, 1, 16, Bp, bias ? bias + o : NULL, y + (size_t)o * P,
                          P, 16, 0);
        }
        for (int o = 0; yr && !j->packw && o < OC; o++) /* the wide weight's tiles have no ReLU output */
            for (int i = 0; i < 16; i++) yr[(size_t)o * P + i] = y[(size_t)o * P + i] > 0 ? y[(size_t)o * P + i] : 0;
    }
}

static void conv_forward_packed(sm_real *out, sm_real *relu_out, sm_real *colp, const sm_real *inp, const sm_real *weight,
                                const sm_real *bias, int B, int C, int H, int W, int OC, int KH, int KW, int stride,
                                int pad, int OH, int OW) {
    im2col_panels(colp, inp, B, C, H, W, KH, KW, stride, pad, OH, OW);
    const int P = OH * OW, CKK = C * KH * KW;
    const long NP = (long)B * P / 16;
    /* the weight is a small block: packed, one tile of up to 16 rows a panel (AVX-512) */
    const int isa = sm_gemm_tiny_isa(); /* read once: every tile of the call agrees */
    int mrt = sm_tile_rows_max(isa);
    sm_real wp[WP_MAX];
    const int packw = (long)OC * CKK <= WP_MAX; /* else the weight as stored, 6 or 12 rows a tile */
    if (packw) pack_weight(wp, weight, OC, CKK, mrt);
    else mrt = sm_tile_rows(isa);
    fwd_job j = {.out = out, .relu_out = relu_out, .cols = colp, .weight = weight, .wp = wp, .bias = bias,
                 .isa = isa, .mrt = mrt, .packw = packw, .OC = OC, .P = P, .CKK = CKK};
    sm_par_for(sm_par_threads((size_t)NP * 16 * CKK * OC), NP, packed_panels, &j);
}

/* The direct forward: conv_forward_packed's products with B read where it lies. With stride 1 and
 * no padding the panel of pixels n0 .. n0+15 of image b is R = 16 / OW output rows from i0, and
 * row r = (c, p, q) of its im2col block is x[c, i0 + p + i, q + j] for i < R, j < OW: for OW = 8 two
 * runs of 8 input values W apart, for OW = 16 one run of 16. sm_tile16_wp loads those runs
 * (boff[r] = c H W + p W + q from the panel's first input row), so nothing is written for B: the
 * target network's forward and the agent's greedy step skip im2col (5% of a MinAtar DQN learning
 * frame; BENCHMARKS.md, "DQN on MinAtar"). The same B values in the same order: the packed path's
 * bits. */
enum { DIRECT_CKK_MAX = 4096 }; /* boff on the stack: 16 KB */

/* the sizes (stride 1, no padding) the direct forward's tiles and stack buffers take, ISA aside */
static int direct_shape(int C, int H, int W, int OC, int KH, int KW) {
    const int OH = H - KH + 1, OW = W - KW + 1;
    return OH >= 1 && (OW == 8 || OW == 16) && (OH * OW) % 16 == 0 && OC > 0 && OC % 16 == 0 &&
           (long)C * KH * KW <= DIRECT_CKK_MAX && (long)OC * C * KH * KW <= WP_MAX;
}

int sm_conv2d_direct(int C, int H, int W, int OC, int KH, int KW, int stride, int pad) {
    return stride == 1 && pad == 0 && direct_shape(C, H, W, OC, KH, KW) && sm_gemm_tiny_simd();
}

int sm_conv2d_dweight_direct(int C, int H, int W, int OC, int KH, int KW, int stride, int pad) {
    return sm_conv2d_direct(C, H, W, OC, KH, KW, stride, pad) && sm_gemm_tiny_isa() >= SM_ISA_AVX512;
}

/* boff[r] = the offset in an image of row r = (c, p, q) of a panel's im2col block from the panel's
 * first input pixel: (c H + p) W + q (the direct forward's and weight gradient's gathered rows) */
static void direct_offsets(int *boff, int C, int H, int W, int KH, int KW) {
    for (int r = 0; r < C * KH * KW; r++) {
        const int c = r / (KH * KW), p = (r / KW) % KH, q = r % KW;
        boff[r] = (c * H + p) * W + q;
    }
}

/* Zero skipping (AVX-512 only, the shapes zero_skip_shape takes). A panel's im2col row r = (c, p, q)
 * gathers input rows i0 + p .. i0 + p + R - 1 of channel c (R = 16 / OW output rows a panel); when
 * those rows hold only zeros, every product of row r is a zero, and an FMA that adds a zero product
 * leaves a nonzero or +0 sum as it was (the sums start at +0): the tiles may leave row r out and give
 * the same bits, but for the two cases below. Binary observations are
 * mostly zero rows - a MinAtar Breakout frame under a random policy has 85% of its 40 rows (4
 * channels of 10) all zero, and a panel of the MinAtar DQN keeps 24.5% of its 36 rows on average -
 * so the direct forward and weight gradient of an agent's first convolution leave most of their
 * products out:
 *   forward  per panel, the kept rows' (c, p) groups from the image's row bits; at most 3/4 of the
 *            rows kept, their packed weights and input offsets are gathered and the tile runs over
 *            them alone (else over all: gathering would cost more than it saves);
 *   dweight  per block of DW_TR rows, the list of panels where one of its rows is kept, in order.
 * Measured (BENCHMARKS.md, "DQN on MinAtar", zero skipping): on Breakout frames the forward of 32
 * takes 11.5 us instead of 16.3 and the weight gradient 10.8 instead of 19.
 * A call skips only when at least half the rows of its first image are zero (mostly_zero_rows): a
 * deeper layer's activations, or random 10%-dense images, pay that test alone. A NaN or an infinity
 * is in a row that is kept (the test is != 0, unordered). The outputs are the dense path's bits but
 * for two cases: a sum that underflows to -0 with no bias after it stays -0 where the skipped +0
 * products would have made it +0 (the ReLU's output is +0 either way); and a non-finite weight
 * (forward) or output gradient (weight gradient) that meets a skipped zero, which gave NaN and now
 * leaves the sum as it was. Training runs are the same (an 8,000-frame DQN run's checkpoint, byte for
 * byte; tests/test_conv_packed.c). sm_conv2d_set_zero_skip(0) turns it off (tests, A/B timings). */
enum { SKIP_CKK_MAX = 1024, SKIP_WK_MAX = 4096, SKIP_LIST_MAX = 16384 };

/* the shapes zero skipping takes: a panel's (c, p) groups and an image's rows within 64 bits, the
 * gathered weights within its stack buffer */
static int zero_skip_shape(int isa, int C, int H, int OC, int KH, int KW) {
    return isa >= SM_ISA_AVX512 && C * KH <= 64 && H <= 64 && (long)C * KH * KW <= SKIP_CKK_MAX &&
           (long)OC * C * KH * KW <= SKIP_WK_MAX;
}

#define SM_TARGETZ __attribute__((target("avx512f,avx2,fma")))
/* rb[c] bit i: row i of channel c of image x (C, H, W) holds a value != 0 (or a NaN) */
SM_TARGETZ static void image_rows(uint64_t *rb, const sm_real *x, int C, int H, int W) {
    const __m512 zero = _mm512_setzero_ps();
    if (W <= 16) { /* a row is one masked vector (MinAtar's 10) */
        const __mmask16 m = (__mmask16)((1u << W) - 1);
        for (int c = 0; c < C; c++) {
            uint64_t bits = 0;
            const sm_real *row = x + (size_t)c * H * W;
            for (int i = 0; i < H; i++, row += W)
                bits |= (uint64_t)(_mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, row), zero, _CMP_NEQ_UQ) != 0) << i;
            rb[c] = bits;
        }
        return;
    }
    for (int c = 0; c < C; c++) {
        uint64_t bits = 0;
        for (int i = 0; i < H; i++) {
            const sm_real *row = x + ((size_t)c * H + i) * W;
            __mmask16 nz = 0;
            for (int w0 = 0; w0 < W; w0 += 16) {
                const __mmask16 m = W - w0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (W - w0)) - 1);
                nz |= _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, row + w0), zero, _CMP_NEQ_UQ);
            }
            bits |= (uint64_t)(nz != 0) << i;
        }
        rb[c] = bits;
    }
}

/* d[i] (16 values) = src[kl[i]] (16 values), i < K: a packed weight's rows that are kept */
SM_TARGETZ static void gather_rows16(sm_real *restrict d, const sm_real *restrict src, const int *kl, int K) {
    for (int i = 0; i < K; i++) _mm512_storeu_ps(d + (size_t)i * 16, _mm512_loadu_ps(src + (size_t)kl[i] * 16));
}
#undef SM_TARGETZ

/* 1 when at least half the rows of image x (C, H, W) hold only zeros: the inputs zero skipping
 * is for, judged on the batch's first image (a deeper layer's activations almost never have a zero
 * row, and then the call skips nothing and pays nothing but this test) */
static int mostly_zero_rows(const sm_real *x, int C, int H, int W) {
    uint64_t rb[64];
    image_rows(rb, x, C, H, W);
    int nz = 0;
    for (int c = 0; c < C; c++) nz += __builtin_popcountll(rb[c]);
    return 2 * nz <= C * H;
}

/* 1 when a call on inp (B, C, H, W) skips zero rows: on, the shape taken, and the batch's first image
 * mostly zero rows (the forward and the weight gradient decide alike) */
static int zero_skip_call(int isa, const sm_real *inp, int B, int C, int H, int W, int OC, int KH, int KW) {
    return zero_skip_on && zero_skip_shape(isa, C, H, OC, KH, KW) && B > 0 && mostly_zero_rows(inp, C, H, W);
}

/* The (c, p) groups of a panel (output rows i0 .. i0 + R - 1) that may hold a nonzero, bit c KH + p:
 * input rows i0 + p .. i0 + p + R - 1 of channel c not all zero in the image's row bits rb. Its rows
 * r = (c, p, q), q < KW, are KW in a row from (c KH + p) KW. */
static uint64_t panel_groups(const uint64_t *rb, int C, int KH, int R, int i0) {
    const uint64_t pm = KH == 64 ? ~(uint64_t)0 : ((uint64_t)1 << KH) - 1;
    uint64_t g = 0;
    for (int c = 0; c < C; c++) {
        const uint64_t band = rb[c] >> i0;
        uint64_t any = 0; /* bit p: a row of p .. p + R - 1 */
        for (int i = 0; i < R; i++) any |= band >> i;
        g |= (any & pm) << (c * KH);
    }
    return g;
}

/* a bit string of bits lo .. hi (hi - lo < 64) */
static inline uint64_t bit_range(int lo, int hi) {
    return (hi - lo == 63 ? ~(uint64_t)0 : ((uint64_t)1 << (hi - lo + 1)) - 1) << lo;
}

static void direct_panels(void *arg, long t0, long t1) {
    const fwd_job *j = arg;
    const int OC = j->OC, P = j->P, CKK = j->CKK, mrt = j->mrt, OW = j->OW, W = j->W;
    int kl[SKIP_CKK_MAX], bok[SKIP_CKK_MAX];
    sm_real wpk[SKIP_WK_MAX];
    uint64_t rb[64];
    long rbb = -1; /* the image rb describes */
    for (long t = t0; t < t1; t++) {
        const long n0 = t * 16, b = n0 / P, p0 = n0 % P, i0 = p0 / OW;
        const size_t y0 = (size_t)b * OC * P + p0; /* (OC, 16) at out + y0, rows P apart */
        sm_real *y = j->out ? j->out + y0 : NULL, *yr = j->relu_out ? j->relu_out + y0 : NULL;
        const sm_real *img = j->x + (size_t)b * j->C * j->H * W, *x = img + (size_t)i0 * W;
        const sm_real *wp = j->wp;
        const int *boff = j->boff;
        int K = CKK;
        if (j->skip) { /* the rows that may hold a nonzero, their weights gathered block by block */
            if (b != rbb) image_rows(rb, img, j->C, j->H, W), rbb = b;
            uint64_t g = panel_groups(rb, j->C, j->KH, 16 / OW, (int)i0);
            const int KW = j->KW;
            K = __builtin_popcountll(g) * KW;
            if (K == 0) g = 1, K = KW; /* an all-zero panel: zero rows make the sum +0 */
            if (K <= CKK * 3 / 4) {    /* else gathering the weights costs more than the rows left out */
                int n = 0;
                for (; g; g &= g - 1)
                    for (int q = 0, r = __builtin_ctzll(g) * KW; q < KW; q++) kl[n++] = r + q;
                for (int i = 0; i < K; i++) bok[i] = boff[kl[i]];
                /* blocks of 16 output channels (OC % 16 == 0, AVX-512 tiles of 16 rows): a weight row
                 * of a block is one vector */
                for (int o = 0; o < OC; o += mrt) gather_rows16(wpk + (size_t)o * K, wp + (size_t)o * CKK, kl, K);
                wp = wpk, boff = bok;
            } else
                K = CKK;
        }
        for (int o = 0; o < OC; o += mrt)
            sm_tile16_wp(j->isa, OC - o < mrt ? OC - o : mrt, K, wp + (size_t)o * K, x, boff, j->bw,
                         j->bias ? j->bias + o : NULL, y ? y + (size_t)o * P : NULL, P, 0, yr ? yr + (size_t)o * P : NULL);
    }
}

static void conv_forward_direct(sm_real *out, sm_real *relu_out, const sm_real *inp, const sm_real *weight,
                                const sm_real *bias, int B, int C, int H, int W, int OC, int KH, int KW) {
    const int OH = H - KH + 1, OW = W - KW + 1, P = OH * OW, CKK = C * KH * KW;
    int boff[DIRECT_CKK_MAX];
    direct_offsets(boff, C, H, W, KH, KW);
    const long NP = (long)B * P / 16;
    const int isa = sm_gemm_tiny_isa(), mrt = sm_tile_rows_max(isa); /* read once: every tile of the call agrees */
    sm_real wp[WP_MAX];
    pack_weight(wp, weight, OC, CKK, mrt);
    fwd_job j = {.out = out, .relu_out = relu_out, .x = inp, .wp = wp, .bias = bias, .boff = boff,
                 .bw = OW == 8 ? W : 8, /* the second run of a B row: the next input row, or 8 further */
                 .isa = isa, .mrt = mrt, .C = C, .H = H, .W = W, .OC = OC, .OW = OW, .P = P, .CKK = CKK,
                 .skip = zero_skip_call(isa, inp, B, C, H, W, OC, KH, KW), .KH = KH, .KW = KW};
    sm_par_for(sm_par_threads((size_t)NP * 16 * CKK * OC), NP, direct_panels, &j);
}

/* The direct weight gradient: dweight (OC, CKK) += dout (OC, B*P) @ col^T without the columns, for
 * the direct forward's shapes on an AVX-512 CPU (sm_conv2d_dweight_direct says when). Its lanes run
 * over 16 output pixels, not over output channels: for a block of DW_TO output channels and DW_TR
 * rows r = (c, p, q), each of the DW_TO x DW_TR accumulators gathers dout[b, o, p0:p0+16] times row
 * r of the 16-pixel panel's im2col block, read where it lies in the input as the direct forward
 * reads it (two runs of 8 values W apart, or one of 16), and after the last panel the 16 lanes are
 * added up (_mm512_reduce_add_ps). No columns and no transposes of dout: measured on the MinAtar DQN
 * (`dqn_update`), the im2col and the packed weight gradient it replaces took about 9 and 15 us of an
 * update. Each output is one thread's, in a fixed order: the bits do not depend on the thread count,
 * and they differ from the packed path's (another order of the same sums). */
enum { DW_TO = 4, DW_TR = 6 }; /* 24 accumulators: 4 dout vectors and 6 gathered rows per 24 FMAs */

#define SM_TARGETZ __attribute__((target("avx512f,avx2,fma")))
SM_TARGETZ static inline __attribute__((always_inline)) void dw_block(sm_real *dweight, const sm_real *dout,
                                                                      const sm_real *inp, const int *boff, int nr, int o0,
                                                                      int r0, int B, int img, int W, int OC, int CKK, int P,
                                                                      int OW, const int *tl, int nt) {
    const ptrdiff_t bw = OW == 8 ? W : 8; /* the panel's second run: the next input row, or 8 further */
    __m512 acc[DW_TO][DW_TR];
    for (int t = 0; t < DW_TO; t++)
        for (int r = 0; r < nr; r++) acc[t][r] = _mm512_setzero_ps();
    const int np = tl ? nt : B * (P / 16);
    for (int i = 0, b = 0, p0 = 0; i < np; i++) { /* the panels in order, or those tl lists (zero skipping) */
        if (tl)
            b = tl[i] >> 16, p0 = tl[i] & 0xFFFF;
        else if (i > 0 && (p0 += 16) == P)
            b++, p0 = 0;
        const sm_real *x = inp + (size_t)b * img + (size_t)(p0 / OW) * W;
        const sm_real *dy = dout + ((size_t)b * OC + o0) * P + p0;
        __m512 d[DW_TO];
        for (int t = 0; t < DW_TO; t++) d[t] = _mm512_loadu_ps(dy + (size_t)t * P);
        for (int r = 0; r < nr; r++) {
            const sm_real *xr = x + boff[r0 + r];
            const __m512 xv = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(xr))),
                                                                  _mm256_castps_pd(_mm256_loadu_ps(xr + bw)), 1));
            for (int t = 0; t < DW_TO; t++) acc[t][r] = _mm512_fmadd_ps(d[t], xv, acc[t][r]);
        }
    }
    for (int t = 0; t < DW_TO; t++)
        for (int r = 0; r < nr; r++) dweight[(size_t)(o0 + t) * CKK + r0 + r] += _mm512_reduce_add_ps(acc[t][r]);
}
SM_TARGETZ __attribute__((noinline)) static void dw_block6(sm_real *dweight, const sm_real *dout, const sm_real *inp,
                                                           const int *boff, int o0, int r0, int B, int img, int W, int OC,
                                                           int CKK, int P, int OW, const int *tl, int nt) {
    dw_block(dweight, dout, inp, boff, DW_TR, o0, r0, B, img, W, OC, CKK, P, OW, tl, nt);
}
SM_TARGETZ __attribute__((noinline)) static void dw_block1(sm_real *dweight, const sm_real *dout, const sm_real *inp,
                                                           const int *boff, int o0, int r0, int B, int img, int W, int OC,
                                                           int CKK, int P, int OW, const int *tl, int nt) {
    dw_block(dweight, dout, inp, boff, 1, o0, r0, B, img, W, OC, CKK, P, OW, tl, nt);
}
#undef SM_TARGETZ

typedef struct {
    sm_real *dweight;
    const sm_real *dout, *inp;
    const int *boff;
    int nrb, B, img, W, OC, CKK, P, OW;
    const int *tl, *nt; /* NULL, or (zero skipping) the panels of block row rbk = r0 / DW_TR, as b << 16 | p0:
                         * nt[rbk] of them at tl + rbk NP */
    long NP;
} dw_job;

/* blocks w of DW_TO output channels x DW_TR rows, (w / nrb, w % nrb) */
static void dw_blocks(void *arg, long w0, long w1) {
    const dw_job *j = arg;
    for (long w = w0; w < w1; w++) {
        const long rbk = w % j->nrb; /* the block's row block */
        const int o0 = (int)(w / j->nrb) * DW_TO, r0 = (int)rbk * DW_TR;
        const int *tl = j->tl ? j->tl + rbk * j->NP : NULL, nt = j->tl ? j->nt[rbk] : 0;
        if (r0 + DW_TR <= j->CKK)
            dw_block6(j->dweight, j->dout, j->inp, j->boff, o0, r0, j->B, j->img, j->W, j->OC, j->CKK, j->P, j->OW, tl, nt);
        else
            for (int r = r0; r < j->CKK; r++)
                dw_block1(j->dweight, j->dout, j->inp, j->boff, o0, r, j->B, j->img, j->W, j->OC, j->CKK, j->P, j->OW, tl, nt);
    }
}

static void conv_dweight_direct(sm_real *dweight, const sm_real *dout, const sm_real *inp, int B, int C, int H, int W, int OC,
                                int KH, int KW) {
    const int OH = H - KH + 1, OW = W - KW + 1, P = OH * OW, CKK = C * KH * KW;
    int boff[DIRECT_CKK_MAX];
    direct_offsets(boff, C, H, W, KH, KW);
    const int nrb = (CKK + DW_TR - 1) / DW_TR, nob = OC / DW_TO;
    const long NP = (long)B * P / 16;
    dw_job j = {dweight, dout, inp, boff, nrb, B, C * H * W, W, OC, CKK, P, OW, NULL, NULL, NP};
    /* zero skipping: for each block of rows, the panels where one of its rows may hold a nonzero (in
     * order: the same sums) */
    int tl[SKIP_LIST_MAX], nt[SKIP_CKK_MAX];
    if (NP * nrb <= SKIP_LIST_MAX && P <= 0xFFFF && B <= 0x7FFF &&
        zero_skip_call(sm_gemm_tiny_isa(), inp, B, C, H, W, OC, KH, KW)) {
        uint64_t rb[64], bg[SKIP_CKK_MAX]; /* bg: the (c, p) groups of block rbk's rows */
        for (int rbk = 0; rbk < nrb; rbk++) {
            const int r0 = rbk * DW_TR, r1 = (r0 + DW_TR < CKK ? r0 + DW_TR : CKK) - 1;
            bg[rbk] = bit_range(r0 / KW, r1 / KW);
            nt[rbk] = 0;
        }
        long kept = 0;
        for (long t = 0; t < NP; t++) {
            const long b = t * 16 / P, i0 = t * 16 % P / OW;
            if (t * 16 % P == 0) image_rows(rb, inp + (size_t)b * C * H * W, C, H, W);
            const uint64_t g = panel_groups(rb, C, KH, 16 / OW, (int)i0);
            for (int rbk = 0; rbk < nrb; rbk++)
                if (g & bg[rbk]) tl[(long)rbk * NP + nt[rbk]++] = (int)(b << 16 | (t * 16 % P));
            kept += __builtin_popcountll(g);
        }
        if (kept * KW <= NP * CKK * 3 / 4) j.tl = tl, j.nt = nt; /* else all of them: no list to walk */
    }
    sm_par_for(sm_par_threads((size_t)B * P * CKK * OC), (long)nob * nrb, dw_blocks, &j);
}

/* conv_dweight_packed's arguments, for sm_par_for */
typedef struct {
    sm_real *dweight, *dtp;
    const sm_real *dout, *colp;
    int OC, CKK, P, isa, mrt, nr;
    size_t BP;
} dwp_job;

/* images [b0, b1): dtp[j][n][0:16] = dout[b, 16j : 16j+16, p], n = b*P + p, 8 x 8 blocks transposed */
static void dwp_transpose(void *arg, long b0, long b1) {
    const dwp_job *jb = arg;
    const int P = jb->P, OC = jb->OC;
    for (long b = b0; b < b1; b++)
        for (int j = 0; j < OC / 16; j++)
            for (int p0 = 0; p0 < P; p0 += 8)
                for (int c8 = 0; c8 < 16; c8 += 8)
                    sm_transpose8x8(jb->dtp + ((size_t)j * jb->BP + (size_t)b * P + p0) * 16 + c8,
                                    jb->dout + ((size_t)b * OC + (size_t)j * 16 + c8) * P + p0, P);
}

/* tiles w (panel w / nr, rows (w % nr) mrt ..) of dweight^T */
static void dwp_tiles(void *arg, long w0, long w1) {
    const dwp_job *jb = arg;
    const int nr = jb->nr, mrt = jb->mrt, CKK = jb->CKK;
    for (long w = w0; w < w1; w++) {
        const int j = (int)(w / nr), r0 = (int)(w % nr) * mrt, mr = CKK - r0 < mrt ? CKK - r0 : mrt;
        sm_real acc[SM_TILE_MR_MAX * 16]; /* dweight^T rows r0 .. r0+mr, columns 16j .. 16j+15 */
        sm_tile16_panels(jb->isa, mr, (int)jb->BP, jb->colp + (size_t)r0 * 16, (ptrdiff_t)CKK * 16,
                         jb->dtp + (size_t)j * jb->BP * 16, acc, 16);
        for (int r = 0; r < mr; r++)
            for (int c = 0; c < 16; c++) jb->dweight[(size_t)(j * 16 + c) * CKK + r0 + r] += acc[r * 16 + c];
    }
}

/* dweight (OC, CKK) += dout (OC, B*P) @ col^T, col as panels; dtp (OC/16, B*P, 16) scratch */
static void conv_dweight_packed(sm_real *dweight, sm_real *dtp, const sm_real *dout, const sm_real *colp, int B, int OC,
                                int CKK, int P) {
    const size_t BP = (size_t)B * P;
    const int isa = sm_gemm_tiny_isa(), mrt = sm_tile_rows(isa), nr = (CKK + mrt - 1) / mrt;
    dwp_job j = {dweight, dtp, dout, colp, OC, CKK, P, isa, mrt, nr, BP};
    sm_par_for(sm_par_threads((size_t)OC * BP), B, dwp_transpose, &j);
    sm_par_for(sm_par_threads((size_t)OC * BP * CKK), (long)(OC / 16) * nr, dwp_tiles, &j);
}
#endif

/* ---------------------------------------------------------------------------------------------- */
/* conv2d */

/* The batched GEMM's layout (OC, B, P) and the layers' (B, OC, P), for sm_par_for: dst, src, the bias
 * (or NULL), OC, P, B */
typedef struct {
    sm_real *dst;
    const sm_real *src, *bias;
    int OC, P, B;
} unbatch_job;

/* images [b0, b1): dst (B, OC, P) <- src (OC, B, P) plus the bias */
static void unbatch_images(void *arg, long b0, long b1) {
    const unbatch_job *jb = arg;
    const int OC = jb->OC, P = jb->P;
    const size_t BP = (size_t)jb->B * P;
    for (long b = b0; b < b1; b++)
        for (int o = 0; o < OC; o++) {
            const sm_real *restrict s = jb->src + (size_t)o * BP + (size_t)b * P;
            sm_real *restrict y = jb->dst + ((size_t)b * OC + o) * P;
            if (jb->bias) {
                const sm_real bo = jb->bias[o];
                for (int t = 0; t < P; t++) y[t] = s[t] + bo;
            } else {
                for (int t = 0; t < P; t++) y[t] = s[t];
            }
        }
}

/* channels [o0, o1): dst (OC, B, P) <- src (B, OC, P) */
static void batch_channels(void *arg, long o0, long o1) {
    const unbatch_job *jb = arg;
    const int OC = jb->OC, P = jb->P, B = jb->B;
    const size_t BP = (size_t)B * P;
    for (long o = o0; o < o1; o++)
        for (int b = 0; b < B; b++) {
            const sm_real *restrict s = jb->src + ((size_t)b * OC + o) * P;
            sm_real *restrict d = jb->dst + (size_t)o * BP + (size_t)b * P;
            for (int t = 0; t < P; t++) d[t] = s[t];
        }
}

void sm_conv2d_forward_ex(sm_real *out, sm_real *relu_out, sm_real *col, sm_real *tmp, const sm_real *inp,
                          const sm_real *weight, const sm_real *bias, int B, int C, int H, int W, int OC, int KH, int KW,
                          int stride, int pad) {
    const int OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
    const int P = OH * OW, CKK = C * KH * KW, BP = B * P;
#ifdef SM_TILE_AVX2
    if (sm_conv2d_packed(OC, OH, OW)) {
        (void)tmp;
        conv_forward_packed(out, relu_out, col, inp, weight, bias, B, C, H, W, OC, KH, KW, stride, pad, OH, OW);
        return;
    }
#endif
    im2col(col, inp, B, C, H, W, KH, KW, stride, pad, OH, OW);
    /* tmp (OC, B*P) = weight (OC, CKK) @ col (CKK, B*P): one GEMM for the batch. Each output is the
     * same sum over CKK as a GEMM per image gives; the bias is added after it, as beta = 1 did. */
    sm_gemm(0, 0, OC, BP, CKK, 1, weight, CKK, col, BP, 0, tmp, BP);
    /* out (B, OC, P) <- tmp (OC, B, P) plus the bias */
    const size_t n = (size_t)OC * BP;
    sm_par_for(sm_par_threads(n), B, unbatch_images, &(unbatch_job){out, tmp, bias, OC, P, B});
    if (relu_out) sm_act_forward(relu_out, out, n, SM_ACT_RELU);
}

void sm_conv2d_forward(sm_real *out, sm_real *col, sm_real *tmp, const sm_real *inp, const sm_real *weight,
                       const sm_real *bias, int B, int C, int H, int W, int OC, int KH, int KW, int stride,
                       int pad) {
    sm_conv2d_forward_ex(out, NULL, col, tmp, inp, weight, bias, B, C, H, W, OC, KH, KW, stride, pad);
}

#ifndef SM_TILE_AVX2
int sm_conv2d_direct(int C, int H, int W, int OC, int KH, int KW, int stride, int pad) {
    (void)C, (void)H, (void)W, (void)OC, (void)KH, (void)KW, (void)stride, (void)pad;
    return 0;
}
int sm_conv2d_dweight_direct(int C, int H, int W, int OC, int KH, int KW, int stride, int pad) {
    (void)C, (void)H, (void)W, (void)OC, (void)KH, (void)KW, (void)stride, (void)pad;
    return 0;
}
#endif

/* out = conv(inp) + bias one output at a time, no buffers: sm_conv2d_forward_direct on a stride-1,
 * unpadded shape its tiles do not take (plain multiply-adds: not the tiles' FMA bits) */
static void conv_forward_loops(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int B, int C,
                               int H, int W, int OC, int KH, int KW) {
    const int OH = H - KH + 1, OW = W - KW + 1;
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    sm_real acc = 0;
                    for (int c = 0; c < C; c++)
                        for (int p = 0; p < KH; p++)
                            for (int q = 0; q < KW; q++)
                                acc += weight[((size_t)o * C + c) * KH * KW + (size_t)p * KW + q] *
                                       inp[(((size_t)b * C + c) * H + i + p) * W + j + q];
                    out[(((size_t)b * OC + o) * OH + i) * OW + j] = acc + (bias ? bias[o] : 0);
                }
}

void sm_conv2d_forward_direct_ex(sm_real *out, sm_real *relu_out, const sm_real *inp, const sm_real *weight,
                                 const sm_real *bias, int B, int C, int H, int W, int OC, int KH, int KW) {
#ifdef SM_TILE_AVX2
    /* checked again here: the tiles' stack buffers and in-place reads need the shape (a lowered ISA
     * cap since sm_conv2d_direct is harmless: the AVX2 tile gives the same bits) */
    if (direct_shape(C, H, W, OC, KH, KW) && sm_gemm_tiny_simd()) {
        conv_forward_direct(out, relu_out, inp, weight, bias, B, C, H, W, OC, KH, KW);
        return;
    }
#endif
    const size_t n = (size_t)B * OC * (H - KH + 1) * (W - KW + 1);
    if (out) {
        conv_forward_loops(out, inp, weight, bias, B, C, H, W, OC, KH, KW);
        if (relu_out) sm_act_forward(relu_out, out, n, SM_ACT_RELU);
    } else { /* the ReLU's output alone: the loops write there, then the ReLU in place */
        conv_forward_loops(relu_out, inp, weight, bias, B, C, H, W, OC, KH, KW);
        sm_act_forward(relu_out, relu_out, n, SM_ACT_RELU);
    }
}

void sm_conv2d_forward_direct(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int B, int C,
                              int H, int W, int OC, int KH, int KW) {
    sm_conv2d_forward_direct_ex(out, NULL, inp, weight, bias, B, C, H, W, OC, KH, KW);
}

void sm_conv2d_columns(sm_real *col, const sm_real *inp, int B, int C, int H, int W, int OC, int KH, int KW, int stride,
                       int pad) {
    const int OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
#ifdef SM_TILE_AVX2
    if (sm_conv2d_packed(OC, OH, OW)) {
        im2col_panels(col, inp, B, C, H, W, KH, KW, stride, pad, OH, OW);
        return;
    }
#endif
    (void)OC;
    im2col(col, inp, B, C, H, W, KH, KW, stride, pad, OH, OW);
}

void sm_conv2d_backward(sm_real *dinp, sm_real *dweight, sm_real *dbias, sm_real *dcol, sm_real *tmp,
                        const sm_real *dout, const sm_real *col, const sm_real *weight, int B, int C, int H,
                        int W, int OC, int KH, int KW, int stride, int pad) {
    const int OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
    const int P = OH * OW, CKK = C * KH * KW, BP = B * P;
#ifdef SM_TILE_AVX2
    if (dweight && sm_conv2d_packed(OC, OH, OW)) {
        conv_dweight_packed(dweight, tmp, dout, col, B, OC, CKK, P);
        dweight = NULL; /* done */
    }
#endif
    if (dweight) {
        /* tmp (OC, B, P) <- dout (B, OC, P), then one GEMM over the whole batch:
         * dweight (OC, CKK) += tmp (OC, B*P) @ col^T (B*P, CKK), col being the forward's columns */
        sm_par_for(sm_par_threads((size_t)OC * BP), OC, batch_channels, &(unbatch_job){tmp, dout, NULL, OC, P, B});
        sm_gemm(0, 1, OC, CKK, BP, 1, tmp, BP, col, BP, 1, dweight, CKK);
    }
    for (int b = 0; b < B; b++) {
        const sm_real *dy = dout + (size_t)b * OC * P; /* (OC, P) */
        if (dbias) {
            for (int o = 0; o < OC; o++) dbias[o] += sum8(dy + (size_t)o * P, P);
        }
        if (dinp) {
            /* dcol (CKK,P) = weight^T (CKK,OC) @ dy (OC,P), then scattered back onto the image */
            sm_gemm(1, 0, CKK, P, OC, 1, weight, CKK, dy, P, 0, dcol, P);
            col2im_add(dinp + (size_t)b * C * H * W, dcol, C, H, W, KH, KW, stride, pad, OH, OW);
        }
    }
}

void sm_conv2d_backward_direct(sm_real *dinp, sm_real *dweight, sm_real *dbias, sm_real *dcol, const sm_real *dout,
                               const sm_real *inp, const sm_real *weight, int B, int C, int H, int W, int OC, int KH, int KW) {
#ifdef SM_TILE_AVX2
    if (dweight && sm_conv2d_dweight_direct(C, H, W, OC, KH, KW, 1, 0)) {
        conv_dweight_direct(dweight, dout, inp, B, C, H, W, OC, KH, KW);
        dweight = NULL; /* done */
    }
#endif
    if (dweight) { /* no direct kernel here: plain loops (slow, and not the kernel's bits) */
        const int OH = H - KH + 1, OW = W - KW + 1, CKK = C * KH * KW;
        for (int o = 0; o < OC; o++)
            for (int r = 0; r < CKK; r++) {
                const int c = r / (KH * KW), p = (r / KW) % KH, q = r % KW;
                double acc = 0;
                for (int b = 0; b < B; b++)
                    for (int i = 0; i < OH; i++)
                        for (int j = 0; j < OW; j++)
                            acc += (double)dout[(((size_t)b * OC + o) * OH + i) * OW + j] *
                                   inp[(((size_t)b * C + c) * H + i + p) * W + j + q];
                dweight[(size_t)o * CKK + r] += (sm_real)acc;
            }
    }
    sm_conv2d_backward(dinp, NULL, dbias, dcol, NULL, dout, NULL, weight, B, C, H, W, OC, KH, KW, 1, 0);
}

/* ---------------------------------------------------------------------------------------------- */
/* max pooling */

/* a pooling loop's arguments, for sm_par_for over its (B*C) planes: dst the array written (out or
 * dinp), src the one read, the argmax indices written (idx, forward) or read (cidx, backward) */
typedef struct {
    sm_real *dst;
    const sm_real *src;
    int *idx;
    const int *cidx;
    int H, W, K, S, OH, OW;
    sm_real inv;
    int backward; /* avgpool_planes, adaptive_planes: the backward (dst += from src) */
} pool_job;

static void maxpool_planes(void *arg, long pl0, long pl1) {
    const pool_job *jb = arg;
    sm_real *out = jb->dst;
    const sm_real *inp = jb->src;
    int *idx = jb->idx;
    const int H = jb->H, W = jb->W, OH = jb->OH, OW = jb->OW, K = jb->K, S = jb->S;
    for (long pl = pl0; pl < pl1; pl++) {
        const sm_real *x = inp + (size_t)pl * H * W;
        sm_real *y = out + (size_t)pl * OH * OW;
        int *ix = idx + (size_t)pl * OH * OW;
        for (int i = 0; i < OH; i++) {
            for (int j = 0; j < OW; j++) {
                int best = i * S * W + j * S;
                sm_real m = x[best];
                for (int p = 0; p < K; p++) {
                    for (int q = 0; q < K; q++) {
                        const int at = (i * S + p) * W + j * S + q;
                        const sm_real v = x[at];
                        /* strictly larger: ties keep the first index; a NaN beats any number once */
                        if (v > m || (isnan(v) && !isnan(m))) {
                            m = v;
                            best = at;
                        }
                    }
                }
                y[i * OW + j] = m;
                ix[i * OW + j] = best;
            }
        }
    }
}

void sm_maxpool2d_forward(sm_real *out, int *idx, const sm_real *inp, int B, int C, int H, int W, int K, int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const long planes = (long)B * C;
    sm_par_for(sm_par_threads((size_t)planes * H * W), planes, maxpool_planes,
               &(pool_job){out, inp, idx, NULL, H, W, K, S, OH, OW, 0, 0});
}

static void maxpool_planes_backward(void *arg, long pl0, long pl1) {
    const pool_job *jb = arg;
    sm_real *dinp = jb->dst;
    const sm_real *dout = jb->src;
    const int *idx = jb->cidx;
    const int H = jb->H, W = jb->W, OH = jb->OH, OW = jb->OW, P = OH * OW;
    for (long pl = pl0; pl < pl1; pl++) {
        sm_real *dx = dinp + (size_t)pl * H * W;
        const sm_real *dy = dout + (size_t)pl * P;
        const int *ix = idx + (size_t)pl * P;
        for (int t = 0; t < P; t++) dx[ix[t]] += dy[t];
    }
}

void sm_maxpool2d_backward(sm_real *dinp, const sm_real *dout, const int *idx, int B, int C, int H, int W, int K,
                           int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1, P = OH * OW;
    const long planes = (long)B * C;
    sm_par_for(sm_par_threads((size_t)planes * P), planes, maxpool_planes_backward,
               &(pool_job){dinp, dout, NULL, idx, H, W, K, S, OH, OW, 0, 1});
}

/* ---------------------------------------------------------------------------------------------- */
/* average pooling */

/* planes [pl0, pl1): out = each window's mean, or (backward) dinp += dout / K^2 over each window */
static void avgpool_planes(void *arg, long pl0, long pl1) {
    const pool_job *jb = arg;
    const int H = jb->H, W = jb->W, OH = jb->OH, OW = jb->OW, K = jb->K, S = jb->S;
    const sm_real inv = jb->inv;
    for (long pl = pl0; pl < pl1; pl++) {
        sm_real *y = jb->dst + (size_t)pl * (jb->backward ? (size_t)H * W : (size_t)OH * OW);
        const sm_real *x = jb->src + (size_t)pl * (jb->backward ? (size_t)OH * OW : (size_t)H * W);
        for (int i = 0; i < OH; i++)
            for (int j = 0; j < OW; j++) {
                if (jb->backward) { /* x = dy, y = dx */
                    const sm_real g = x[i * OW + j] * inv;
                    for (int p = 0; p < K; p++) {
                        sm_real *r = y + (size_t)(i * S + p) * W + j * S;
                        for (int q = 0; q < K; q++) r[q] += g;
                    }
                    continue;
                }
                sm_real sum = 0;
                for (int p = 0; p < K; p++) {
                    const sm_real *r = x + (size_t)(i * S + p) * W + j * S;
                    for (int q = 0; q < K; q++) sum += r[q];
                }
                y[i * OW + j] = sum * inv;
            }
    }
}

/* the forward (dst out, src inp) or the backward (dst dinp, src dout) over the B*C planes */
static void avgpool(sm_real *dst, const sm_real *src, int B, int C, int H, int W, int K, int S, int backward) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const sm_real inv = (sm_real)1 / ((sm_real)K * K);
    const long planes = (long)B * C;
    sm_par_for(sm_par_threads((size_t)planes * H * W), planes, avgpool_planes,
               &(pool_job){dst, src, NULL, NULL, H, W, K, S, OH, OW, inv, backward});
}

void sm_avgpool2d_forward(sm_real *out, const sm_real *inp, int B, int C, int H, int W, int K, int S) {
    avgpool(out, inp, B, C, H, W, K, S, 0);
}

void sm_avgpool2d_backward(sm_real *dinp, const sm_real *dout, int B, int C, int H, int W, int K, int S) {
    avgpool(dinp, dout, B, C, H, W, K, S, 1);
}

/* ---------------------------------------------------------------------------------------------- */
/* adaptive average pooling */

/* PyTorch's bins (aten/src/ATen/native/AdaptiveAveragePooling.cpp, start_index / end_index):
 * bin i of n over a length L covers [floor(i L / n), ceil((i+1) L / n)). */
static int bin_start(int i, int n, int L) { return (int)(((long long)i * L) / n); }
static int bin_end(int i, int n, int L) { return (int)(((long long)(i + 1) * L + n - 1) / n); }

/* planes [pl0, pl1): out = each bin's mean, or (backward) dinp += dout / its size over each bin */
static void adaptive_planes(void *arg, long pl0, long pl1) {
    const pool_job *jb = arg;
    const int H = jb->H, W = jb->W, OH = jb->OH, OW = jb->OW;
    for (long pl = pl0; pl < pl1; pl++) {
        sm_real *y = jb->dst + (size_t)pl * (jb->backward ? (size_t)H * W : (size_t)OH * OW);
        const sm_real *x = jb->src + (size_t)pl * (jb->backward ? (size_t)OH * OW : (size_t)H * W);
        for (int i = 0; i < OH; i++) {
            const int h0 = bin_start(i, OH, H), h1 = bin_end(i, OH, H);
            for (int j = 0; j < OW; j++) {
                const int w0 = bin_start(j, OW, W), w1 = bin_end(j, OW, W);
                const sm_real n = (sm_real)((h1 - h0) * (w1 - w0));
                if (jb->backward) { /* x = dy, y = dx */
                    const sm_real g = x[i * OW + j] / n;
                    for (int h = h0; h < h1; h++)
                        for (int w = w0; w < w1; w++) y[(size_t)h * W + w] += g;
                    continue;
                }
                sm_real sum = 0;
                for (int h = h0; h < h1; h++)
                    for (int w = w0; w < w1; w++) sum += x[(size_t)h * W + w];
                y[i * OW + j] = sum / n;
            }
        }
    }
}

void sm_adaptive_avgpool2d_forward(sm_real *out, const sm_real *inp, int B, int C, int H, int W, int OH, int OW) {
    const long planes = (long)B * C;
    sm_par_for(sm_par_threads((size_t)planes * H * W), planes, adaptive_planes,
               &(pool_job){out, inp, NULL, NULL, H, W, 0, 0, OH, OW, 0, 0});
}

void sm_adaptive_avgpool2d_backward(sm_real *dinp, const sm_real *dout, int B, int C, int H, int W, int OH,
                                    int OW) {
    const long planes = (long)B * C;
    sm_par_for(sm_par_threads((size_t)planes * H * W), planes, adaptive_planes,
               &(pool_job){dinp, dout, NULL, NULL, H, W, 0, 0, OH, OW, 0, 1});
}
