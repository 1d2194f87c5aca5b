/* Image ops on NCHW tensors for SR-MoE's convolutional stem: 2-D convolution, max pooling, average
 * pooling, adaptive average pooling. Hand-written forward/backward pairs in the style of llm.c.
 *
 * SR-MoE (../shared/papers/004_881e46c1c0506c83.txt, Sec. 3.1.1 "Convolutional Feature Extraction"):
 * "sequential layers of strided convolutions, non-linear activations, and max-pooling ... An adaptive
 * average pooling layer followed by a linear projection maps these features into a latent embedding
 * z_0 in R^d". This header gives those pieces; the activations are sm_act_forward/backward (ops.h)
 * applied element-wise to the contiguous buffer, and the projection is sm_linear_forward/backward.
 *
 * A usage example (one conv -> ReLU -> 2x2 max-pool -> global average pool -> linear):
 *
 *   int OH, OW, PH, PW;                                                 // sizes checked once, when
 *   if (sm_conv2d_shape(H, W, 3, 3, 2, 1, &OH, &OW, &err) != SM_OK ||    // the stem is built; err.msg
 *       sm_conv2d_shape(OH, OW, 2, 2, 2, 0, &PH, &PW, &err) != SM_OK)    // names the sizes refused
 *       return SM_ERR_ARG;                                              // (pooling: pad 0)
 *   sm_real *col = malloc(sizeof(sm_real) * B * sm_conv2d_col_size(C, H, W, 3, 3, 2, 1));
 *   sm_real *tmp = malloc(sizeof(sm_real) * B * OC * OH * OW);         // kept for the backward: col
 *   sm_conv2d_forward(a, col, tmp, x, w, b, B, C, H, W, OC, 3, 3, 2, 1); // a (B,OC,OH,OW)
 *   sm_act_forward(h, a, (size_t)B * OC * OH * OW, SM_ACT_RELU);       // a kept for the backward
 *   sm_maxpool2d_forward(p, idx, h, B, OC, OH, OW, 2, 2);                // p (B,OC,PH,PW)
 *   sm_adaptive_avgpool2d_forward(g, p, B, OC, PH, PW, 1, 1);            // g (B,OC,1,1) = (B,OC)
 *   sm_linear_forward(z0, g, proj_w, proj_b, B, OC, d);                  // z0 (B,d)
 *
 * Layout and letters: every image tensor is a contiguous row-major (B, C, H, W) buffer - B images,
 * C channels, H rows, W columns; element (b,c,h,w) sits at ((b*C + c)*H + h)*W + w. The output of a
 * layer is (B, OC, OH, OW) for a convolution and (B, C, OH, OW) for a pooling. A convolution weight
 * is (OC, C, KH, KW) and its bias (OC), as in torch.nn.Conv2d; K is a square pooling window and S
 * its stride.
 *
 * Flatten needs no function: a contiguous (B, C, H, W) buffer IS the (B, C*H*W) matrix that
 * torch.flatten(x, 1) gives, row b being image b in (c, h, w) order, so the same pointer is passed
 * to sm_linear_forward with T = B and C_in = C*H*W (and its gradient buffer likewise).
 *
 * Conventions (ops.h): outputs first, then inputs, then dimensions; every backward ACCUMULATES (+=)
 * into the gradients it writes; a gradient pointer documented "may be NULL" is skipped. The
 * forward/backward functions do not check sizes: validate them once with sm_conv2d_shape (pooling
 * uses it too, with KH = KW = K, stride = S, pad = 0) when the layer is built. Every pointer must
 * be non-NULL unless documented otherwise, and no output may alias an input.
 */
#ifndef SPECMOE_CONV_H
#define SPECMOE_CONV_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Output size of a convolution or pooling window: OH = floor((H + 2 pad - KH) / stride) + 1, the
 * same for OW (torch.nn.Conv2d / MaxPool2d with dilation 1 and ceil_mode False). Refuses with
 * SM_ERR_ARG and a message naming the sizes: KH or KW < 1, stride < 1, pad < 0, a kernel larger than
 * the padded input (KH > H + 2 pad or KW > W + 2 pad), H or W < 1, or an output too large for int.
 * OH and OW are written only on success. */
sm_status sm_conv2d_shape(int H, int W, int KH, int KW, int stride, int pad, int *OH, int *OW, sm_error *err);

/* Number of sm_real in the im2col matrix of ONE image, (C*KH*KW, OH*OW): the size of the backward's
 * scratch dcol; the forward's columns col take B times as many. 0 if the sizes are refused by
 * sm_conv2d_shape. */
size_t sm_conv2d_col_size(int C, int H, int W, int KH, int KW, int stride, int pad);

/* 2-D convolution (cross-correlation, as torch.nn.functional.conv2d), dilation 1, one group, zero
 * padding `pad` on all four sides, the same `stride` along H and W:
 *   out[b,o,i,j] = bias[o] + sum_{c,p,q} weight[o,c,p,q] * inp[b,c, i*stride - pad + p, j*stride - pad + q]
 * computed as one im2col over the batch and one GEMM: col (C*KH*KW, B*OH*OW) holds every image's
 * receptive fields side by side, tmp (OC, B*OH*OW) = weight (OC, C*KH*KW) @ col, and out is tmp with
 * its first two axes swapped, plus the bias. The GEMM is threaded by OpenBLAS.
 *   out    (B, OC, OH, OW)    written (not accumulated)
 *   col    (C*KH*KW, B*OH*OW) written: B * sm_conv2d_col_size(...) values, read again by the backward
 *                             (in the packed path the same values in 16-pixel panels: treat col as
 *                             private to this forward/backward pair)
 *   tmp    (OC, B*OH*OW)      scratch, as many values as out (unused by the packed path)
 * Where sm_conv2d_packed(OC, OH, OW) says so, the GEMMs run on the register tile (AVX2 or AVX-512) of the packed
 * small GEMM (src/core/conv.c, "The packed path") instead of OpenBLAS: the same products, summed in
 * another order, so the last bits differ.
 *   inp    (B, C, H, W)
 *   weight (OC, C, KH, KW)
 *   bias   (OC) or NULL */
void sm_conv2d_forward(sm_real *out, sm_real *col, sm_real *tmp, const sm_real *inp, const sm_real *weight,
                       const sm_real *bias, int B, int C, int H, int W, int OC, int KH, int KW, int stride,
                       int pad);

/* 1 when sm_conv2d_forward / sm_conv2d_backward take the packed path for these sizes: an AVX2 + FMA
 * CPU (sm_gemm_tiny_simd), the float build, OC and OH*OW multiples of 16. */
int sm_conv2d_packed(int OC, int OH, int OW);

/* The direct forward, stride 1 and no padding: out exactly as sm_conv2d_forward computes it (the
 * same bits), without the columns - the register tile reads each 16-pixel block of B straight from
 * inp. For a forward no backward follows (a target network, an agent acting), one whose backward is
 * preceded by sm_conv2d_columns, or one whose backward is sm_conv2d_backward_direct (which needs no
 * columns). Fast where sm_conv2d_direct(C, H, W, OC, KH, KW, 1, 0) says so: the packed path's sizes
 * with OW = 8 or 16, C*KH*KW <= 4096 and OC*C*KH*KW <= 16384 (MinAtar's 3 x 3 convolution on 10 x 10
 * inputs); on any other stride-1, unpadded shape it computes the same outputs
 * by plain loops (slow, and not the packed path's bits). */
int sm_conv2d_direct(int C, int H, int W, int OC, int KH, int KW, int stride, int pad);
void sm_conv2d_forward_direct(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int B, int C,
                              int H, int W, int OC, int KH, int KW);

/* The backward of a direct forward without its columns (stride 1, no padding):
 *   dweight (OC, C, KH, KW) += the weight gradient (may be NULL), by a kernel that reads inp where it
 *                             lies (lanes over 16 output pixels; src/core/conv.c, "The direct weight
 *                             gradient") where sm_conv2d_dweight_direct(C, H, W, OC, KH, KW, 1, 0) says
 *                             so - the direct forward's shapes with the instruction set
 *                             (sm_gemm_tiny_isa) at AVX-512 - else by plain loops (slow); the same sums
 *                             as sm_conv2d_backward's in another order (the last bits differ)
 *   dbias, dinp, dcol       as sm_conv2d_backward's (dinp and dbias may be NULL; dcol is unused when
 *                             dinp is NULL)
 * No columns and no tmp: a training forward that is direct needs neither. */
int sm_conv2d_dweight_direct(int C, int H, int W, int OC, int KH, int KW, int stride, int pad);
void sm_conv2d_backward_direct(sm_real *dinp, sm_real *dweight, sm_real *dbias, sm_real *dcol, const sm_real *dout,
                               const sm_real *inp, const sm_real *weight, int B, int C, int H, int W, int OC, int KH, int KW);

/* Zero skipping in the direct forward and weight gradient, on by default: on an AVX-512 CPU, for
 * small kernels (C*KH*KW <= 1024, OC*C*KH*KW <= 4096), the products of input rows that hold only
 * zeros are left out when at least half the rows of the batch's first image are zero (binary
 * observations such as MinAtar's). The same bits, except that a sum underflowing to -0 with no bias
 * stays -0, and that a non-finite weight or output gradient times a skipped zero no longer makes a
 * NaN (src/core/conv.c, "Zero skipping"). 0 turns it off for the whole process (tests and A/B
 * timings; not while another thread runs a convolution). */
void sm_conv2d_set_zero_skip(int on);

/* The two forwards with a ReLU after them, for a layer whose activation is ReLU: relu_out (B, OC, OH,
 * OW), when not NULL, is written with out's ReLU, x > 0 ? x : 0 (sm_act_forward's values). Where the
 * register tiles run (the packed and direct paths, with the weight packed: OC*C*KH*KW <= 16384) they
 * store it from their registers as they store out - one pass over the layer's output fewer
 * (BENCHMARKS.md, "DQN on MinAtar"); elsewhere it is a pass after the forward. relu_out must not be
 * out. sm_conv2d_forward_ex needs out; the direct forward takes out = NULL when relu_out is given (a
 * forward no backward follows needs no pre-activation), but not both NULL. */
void sm_conv2d_forward_ex(sm_real *out, sm_real *relu_out, sm_real *col, sm_real *tmp, const sm_real *inp,
                          const sm_real *weight, const sm_real *bias, int B, int C, int H, int W, int OC, int KH, int KW,
                          int stride, int pad);
void sm_conv2d_forward_direct_ex(sm_real *out, sm_real *relu_out, const sm_real *inp, const sm_real *weight,
                                 const sm_real *bias, int B, int C, int H, int W, int OC, int KH, int KW);

/* col <- the columns sm_conv2d_forward writes for inp, in its layout (packed or not): what
 * sm_conv2d_backward reads after a direct forward. col: B * sm_conv2d_col_size(...) values. */
void sm_conv2d_columns(sm_real *col, const sm_real *inp, int B, int C, int H, int W, int OC, int KH, int KW, int stride,
                       int pad);

/* Backward of sm_conv2d_forward for loss L with dout = dL/dout:
 *   dweight (OC, C*KH*KW) += dout (OC, B*OH*OW) @ col^T    (one GEMM over the batch; dout's first
 *                                                            two axes swapped into tmp first)
 *   dbias   (OC)          += sum over (b,i,j) of dout
 *   dinp_b                += col2im(weight^T (C*KH*KW, OC) @ dout_b)   per image b
 * col2im adds every column entry back onto the input pixel it was copied from (entries that came
 * from the zero padding are dropped). The weight gradient sums over the batch in one GEMM, so its
 * rounding differs from a sum of per-image GEMMs (tests/test_golden.c).
 *   dinp    (B, C, H, W)      may be NULL (e.g. the first layer, whose input is the data)
 *   dweight (OC, C, KH, KW)   may be NULL (a frozen stem)
 *   dbias   (OC)              may be NULL (no bias)
 *   dcol    (C*KH*KW, OH*OW)  scratch, sm_conv2d_col_size(...) values (unused when dinp is NULL)
 *   tmp     (OC, B*OH*OW)     scratch, as in the forward (unused when dweight is NULL); the packed
 *                             path's dout^T panels
 *   dout    (B, OC, OH, OW)
 *   col     (C*KH*KW, B*OH*OW) the columns the forward wrote for this batch (unused when dweight is NULL)
 *   weight  (OC, C, KH, KW) */
void sm_conv2d_backward(sm_real *dinp, sm_real *dweight, sm_real *dbias, sm_real *dcol, sm_real *tmp,
                        const sm_real *dout, const sm_real *col, const sm_real *weight, int B, int C, int H,
                        int W, int OC, int KH, int KW, int stride, int pad);

/* Max pooling, K x K window, stride S, no padding (torch.nn.functional.max_pool2d(x, K, S)):
 *   out[b,c,i,j] = max over p,q < K of inp[b,c, i*S + p, j*S + q],  OH = (H - K) / S + 1.
 * The window is scanned row by row and only a strictly larger value replaces the current maximum,
 * so a tie goes to the first index in row-major order. A NaN wins over every number (the first NaN of
 * the window is kept), so a NaN propagates as in PyTorch instead of disappearing silently.
 *   out (B, C, OH, OW)  written
 *   idx (B, C, OH, OW)  written: the argmax as a flat index h*W + w into its own (H, W) input plane,
 *                        as max_pool2d(..., return_indices=True) gives it
 *   inp (B, C, H, W) */
void sm_maxpool2d_forward(sm_real *out, int *idx, const sm_real *inp, int B, int C, int H, int W, int K, int S);
/* dinp[b,c, idx[b,c,i,j]] += dout[b,c,i,j] (the gradient goes to the argmax only; overlapping windows,
 * S < K, may route several outputs to one pixel and those add up).
 *   dinp (B, C, H, W)  dout (B, C, OH, OW)  idx (B, C, OH, OW) from the forward */
void sm_maxpool2d_backward(sm_real *dinp, const sm_real *dout, const int *idx, int B, int C, int H, int W, int K,
                           int S);

/* Average pooling, K x K window, stride S, no padding (torch.nn.functional.avg_pool2d(x, K, S)):
 *   out[b,c,i,j] = (1 / K^2) * sum over p,q < K of inp[b,c, i*S + p, j*S + q].
 *   out (B, C, OH, OW) written;  inp (B, C, H, W) */
void sm_avgpool2d_forward(sm_real *out, const sm_real *inp, int B, int C, int H, int W, int K, int S);
/* dinp[b,c, i*S + p, j*S + q] += dout[b,c,i,j] / K^2 for every p,q < K.
 *   dinp (B, C, H, W)  dout (B, C, OH, OW) */
void sm_avgpool2d_backward(sm_real *dinp, const sm_real *dout, int B, int C, int H, int W, int K, int S);

/* Adaptive average pooling to a fixed (OH, OW) (torch.nn.functional.adaptive_avg_pool2d), with
 * PyTorch's bins: output row i averages input rows [floor(i H / OH), ceil((i+1) H / OH)), columns
 * likewise. The bins cover the input; when OH does not divide H neighbouring bins may share a row and
 * have different sizes, and OH > H is allowed (rows are repeated). OH = OW = 1 is global average
 * pooling, whose (B, C, 1, 1) output is the (B, C) matrix a linear head takes.
 *   out (B, C, OH, OW) written;  inp (B, C, H, W);  OH, OW >= 1 */
void sm_adaptive_avgpool2d_forward(sm_real *out, const sm_real *inp, int B, int C, int H, int W, int OH, int OW);
/* dinp += dout[b,c,i,j] / (bin size) over every pixel of bin (i,j).
 *   dinp (B, C, H, W)  dout (B, C, OH, OW) */
void sm_adaptive_avgpool2d_backward(sm_real *dinp, const sm_real *dout, int B, int C, int H, int W, int OH,
                                    int OW);

#ifdef __cplusplus
}
#endif
#endif
