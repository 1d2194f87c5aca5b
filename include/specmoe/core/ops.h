/* Elementary modules: hand-written forward/backward pairs in the style of llm.c.
 *
 * Argument order: outputs, then inputs, then dimensions. Backward functions ACCUMULATE (+=) into
 * every gradient they write, so callers zero gradients explicitly once per step.
 *
 * Letters: T rows (tokens / batch), C input width, OC output width, V classes, N = T*C elements.
 * Weights are stored row-major as (OC, C), like torch.nn.Linear.
 */
#ifndef SPECMOE_OPS_H
#define SPECMOE_OPS_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C(M,N) = alpha * op(A) op(B) + beta * C, row-major; the one place BLAS is called. */
void sm_gemm(int transA, int transB, int M, int N, int K, sm_real alpha, const sm_real *A, int lda,
             const sm_real *B, int ldb, sm_real beta, sm_real *C, int ldc);

/* C (M,N) = alpha op(A) @ B (K,N) + beta C with op(A)(i,k) = A[i*ars + k*acs] (ars = lda, acs = 1:
 * A as stored; ars = 1, acs = lda: A^T), for matrices of a few dozen rows called inside loops: no
 * packing, no threads, AVX2 kernels where the CPU has them (src/core/gemm_tiny.c). With beta = 0, C
 * is not read. */
void sm_gemm_tiny(int M, int N, int K, sm_real alpha, const sm_real *A, ptrdiff_t ars, ptrdiff_t acs, const sm_real *B,
                  ptrdiff_t ldb, sm_real beta, sm_real *C, ptrdiff_t ldc);
int sm_gemm_tiny_simd(void); /* 1 if sm_gemm_tiny runs SIMD kernels (AVX2 or AVX-512) on this CPU */
/* The instruction set the register tiles use (sm_gemm_tiny and the packed products below): */
enum { SM_ISA_NONE = 0, SM_ISA_AVX2 = 1, SM_ISA_AVX512 = 2 };
int sm_gemm_tiny_isa(void);     /* the CPU's best, capped by sm_gemm_tiny_set_isa */
int sm_gemm_tiny_cpu_isa(void); /* the CPU's best, whatever the cap */
/* Tests and benchmarks only: cap the instruction set at max_isa (SM_ISA_NONE: the portable loops on
 * this CPU too; SM_ISA_AVX2: the AVX2 tile on an AVX-512 CPU); sm_gemm_tiny_set_simd(0 / 1) is
 * set_isa(SM_ISA_NONE / SM_ISA_AVX512), 1 restoring the CPU's choice. Not for use while other
 * threads run. */
void sm_gemm_tiny_set_isa(int max_isa);
void sm_gemm_tiny_set_simd(int simd);

/* One row: out (OC) = weight (OC,C) @ inp (C) + bias, through gemv (an agent acting on one
 * observation); the rounding may differ from sm_linear_forward's in the last bit. */
void sm_linear_forward_row(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int C, int OC);
/* out (T,OC) = inp (T,C) @ weight(OC,C)^T + bias(OC); bias may be NULL. */
void sm_linear_forward(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias,
                       int T, int C, int OC);
/* dinp (T,C), dweight (OC,C), dbias (OC) += ...; any of dinp/dbias may be NULL. */
void sm_linear_backward(sm_real *dinp, sm_real *dweight, sm_real *dbias, const sm_real *dout,
                        const sm_real *inp, const sm_real *weight, int T, int C, int OC);

/* The same two with a workspace of sm_linear_small_ws(T, C, OC) reals: for each of the three
 * products that sm_linear_small_use picks, the packed small-matrix kernel of
 * src/core/linear_small.c runs instead of OpenBLAS (an AVX2 CPU, a few dozen rows: no weight
 * repacking per call, no BLAS call overhead). ws = NULL: OpenBLAS always. */
void sm_linear_forward_ws(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int T, int C,
                          int OC, sm_real *ws);
void sm_linear_backward_ws(sm_real *dinp, sm_real *dweight, sm_real *dbias, const sm_real *dout, const sm_real *inp,
                           const sm_real *weight, int T, int C, int OC, sm_real *ws);
/* sm_linear_backward_ws with set = 1: dweight and dbias are SET (=), not accumulated, so they need no
 * zeroing first (dinp still accumulates). The gradient of a network's own tensor written by one
 * backward call saves the zeroing pass and the read of the old values: sm_model_backward_set. */
void sm_linear_backward_ex(sm_real *dinp, sm_real *dweight, sm_real *dbias, const sm_real *dout, const sm_real *inp,
                           const sm_real *weight, int T, int C, int OC, sm_real *ws, int set);
size_t sm_linear_small_ws(int T, int C, int OC); /* for all three products */
size_t sm_linear_small_ws_for(int T, int C, int OC, int use); /* for those in use (SM_LINEAR_SMALL_* bits) */
/* for the products sm_linear_small_use_max picks at any row count up to min(maxT, 256), with *rows
 * the most rows at which it picks one (0: none, and no workspace is needed) */
size_t sm_linear_small_ws_upto(int maxT, int C, int OC, int *rows);
enum { SM_LINEAR_SMALL_FWD = 1, SM_LINEAR_SMALL_DINP = 2, SM_LINEAR_SMALL_DWEIGHT = 4 };
/* Rows per call when a caller splits a product longer than the packed kernel's reach into pieces
 * it takes (an expert's rows, moe.c; a dense layer's tokens, modules.c): 128 rows of a 512-wide
 * activation (256 KB) stay in L2; 64 and 256 measured slower (BENCHMARKS.md, "SoftMoE in the DQN
 * update"). Callers split only where the rule picks a product at this many rows. */
enum { SM_LINEAR_SMALL_CHUNK = 128 };
/* the shape rule (measured; linear_small.c): which products (SM_LINEAR_SMALL_* bits) take the packed
 * kernel at T rows of C -> OC; 0 without AVX2 (and in the double build) */
int sm_linear_small_use(int T, int C, int OC);
/* the same rule for the CPU's own ISA, whatever sm_gemm_tiny_set_isa's cap: it picks every product
 * any capped rule picks, so a workspace sized by it (the dense module's) is never too small */
int sm_linear_small_use_max(int T, int C, int OC);
/* The packed products themselves, whatever the rule says (the tests call them on every shape):
 * out = inp @ weight^T + bias (bias may be NULL); dinp += dout @ weight, dweight += dout^T @ inp
 * (either may be NULL). ws: sm_linear_small_ws(T, C, OC) reals. */
void sm_linear_forward_small(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int T, int C,
                             int OC, sm_real *ws);
/* the same, and relu (T,OC) = its ReLU, x > 0 ? x : 0 (a NaN gives 0), written with it; either of
 * out and relu may be NULL */
void sm_linear_forward_small_ex(sm_real *out, sm_real *relu, const sm_real *inp, const sm_real *weight,
                                const sm_real *bias, int T, int C, int OC, sm_real *ws);
void sm_linear_backward_small(sm_real *dinp, sm_real *dweight, const sm_real *dout, const sm_real *inp,
                              const sm_real *weight, int T, int C, int OC, sm_real *ws);
/* the same with dweight = (set & SM_LINEAR_SET_DWEIGHT, i.e. set = 1) or += (set = 0), and dinp = (set &
 * SM_LINEAR_SET_DINP) or += */
enum { SM_LINEAR_SET_DWEIGHT = 1, SM_LINEAR_SET_DINP = 2 };
void sm_linear_backward_small_ex(sm_real *dinp, sm_real *dweight, const sm_real *dout, const sm_real *inp,
                                 const sm_real *weight, int T, int C, int OC, sm_real *ws, int set);

typedef enum { SM_ACT_NONE = 0, SM_ACT_RELU, SM_ACT_GELU, SM_ACT_TANH, SM_ACT_SILU } sm_act;
const char *sm_act_name(sm_act a);
int sm_act_parse(const char *s, sm_act *out); /* 0 on success */

/* Element-wise activations over N values. out may alias inp in the forward. The backward takes the
 * forward INPUT (pre-activation) and accumulates dinp += dout * f'(inp). GELU is the exact erf form
 * (torch.nn.GELU default). */
void sm_act_forward(sm_real *out, const sm_real *inp, size_t N, sm_act a);
void sm_act_backward(sm_real *dinp, const sm_real *dout, const sm_real *inp, size_t N, sm_act a);
/* dinp (N) = dout * f'(inp), written (no accumulation): the copy of the output gradient and its mask
 * in one pass. dinp may alias dout. */
void sm_act_backward_set(sm_real *dinp, const sm_real *dout, const sm_real *inp, size_t N, sm_act a);
/* d (N) *= f'(inp): the backward written over its own input gradient (no accumulation). */
void sm_act_backward_inplace(sm_real *d, const sm_real *inp, size_t N, sm_act a);

/* sm_linear_forward_ws, then act_out (T,OC) = act(out) (sm_act_forward; act_out != out). The ReLU
 * is written by the packed forward's tiles when they run (no pass of its own): the same values. For
 * the ReLU out may be NULL: the pre-activation is then not kept (its derivative is read off the
 * output, x > 0 iff relu(x) > 0, a NaN included: sm_act_backward_inplace(d, act_out, ...) gives the
 * same as with the pre-activation), and act_out is all that is written. */
void sm_linear_forward_act_ws(sm_real *out, sm_real *act_out, const sm_real *inp, const sm_real *weight,
                              const sm_real *bias, int T, int C, int OC, sm_real *ws, sm_act act);

/* LayerNorm over the last dim C: out = (x - mean) * rstd * weight + bias.
 * mean (T), rstd (T) are saved for the backward. */
void sm_layernorm_forward(sm_real *out, sm_real *mean, sm_real *rstd, const sm_real *inp,
                          const sm_real *weight, const sm_real *bias, int T, int C);
void sm_layernorm_backward(sm_real *dinp, sm_real *dweight, sm_real *dbias, const sm_real *dout,
                           const sm_real *inp, const sm_real *weight, const sm_real *mean,
                           const sm_real *rstd, int T, int C);

/* Row softmax of inp (T,V) / temperature into probs (T,V). */
void sm_softmax_forward(sm_real *probs, const sm_real *inp, sm_real temperature, int T, int V);
/* dinp += J^T dout with J the softmax Jacobian (including the 1/temperature). */
void sm_softmax_backward(sm_real *dinp, const sm_real *dprobs, const sm_real *probs,
                         sm_real temperature, int T, int V);

/* Cross-entropy of logits (T,V) against integer targets (T).
 * mask (V) may be NULL; where given, classes with mask[v] == 0 are excluded from the softmax
 * (their logits treated as -inf) - the task-incremental "class masking".
 * probs (T,V) saved for the backward; losses (T) per row; returns the mean loss.
 * The backward accumulates dlogits += (probs - onehot) * dloss / T for the mean loss. */
double sm_crossentropy_forward(sm_real *losses, sm_real *probs, const sm_real *logits,
                               const int *targets, const unsigned char *mask, int T, int V);
void sm_crossentropy_backward(sm_real *dlogits, const sm_real *probs, const int *targets, sm_real dloss,
                              int T, int V);

/* Mean squared error: mean over all N = T*C elements of (pred - target)^2. */
double sm_mse_forward(const sm_real *pred, const sm_real *target, size_t N);
void sm_mse_backward(sm_real *dpred, const sm_real *pred, const sm_real *target, sm_real dloss,
                     size_t N);

/* Row-wise L2 normalisation: out (N,C) = v / ||v|| per row, norms (N) kept (floored at 1e-12).
 * The backward accumulates dv += (dout - out <out, dout>) / ||v||. */
void sm_l2norm_forward(sm_real *out, sm_real *norms, const sm_real *v, int N, int C);
void sm_l2norm_backward(sm_real *dv, const sm_real *dout, const sm_real *out, const sm_real *norms, int N, int C);

/* Index of the largest of x (n), ties to the lower index. */
int sm_argmax(const sm_real *x, int n);

/* Sum of squares and finiteness of a buffer. */
double sm_sumsq(const sm_real *x, size_t n);
int sm_all_finite(const sm_real *x, size_t n);

#ifdef __cplusplus
}
#endif
#endif
