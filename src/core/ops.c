/* Elementary modules (see include/specmoe/ops.h for shapes and conventions). */
#include "specmoe/core/ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void sm_gemm(int transA, int transB, int M, int N, int K, sm_real alpha, const sm_real *A, int lda,
             const sm_real *B, int ldb, sm_real beta, sm_real *C, int ldc) {
    if (M == 0 || N == 0) return;
#ifdef SPECMOE_DOUBLE
    cblas_dgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

/* ---------------------------------------------------------------------------------------------- */
/* linear */

void sm_linear_forward(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias,
                       int T, int C, int OC) {
    sm_linear_forward_ws(out, inp, weight, bias, T, C, OC, NULL);
}

void sm_linear_forward_ws(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int T, int C,
                          int OC, sm_real *ws) {
    if (ws && (sm_linear_small_use(T, C, OC) & SM_LINEAR_SMALL_FWD)) {
        sm_linear_forward_small(out, inp, weight, bias, T, C, OC, ws);
        return;
    }
    if (bias) {
        for (int t = 0; t < T; t++) memcpy(out + (size_t)t * OC, bias, sizeof(sm_real) * OC);
    }
    /* out (T,OC) (+)= inp (T,C) @ weight^T (C,OC) */
    sm_gemm(0, 1, T, OC, C, 1, inp, C, weight, C, bias ? 1 : 0, out, OC);
}

void sm_linear_forward_act_ws(sm_real *out, sm_real *act_out, const sm_real *inp, const sm_real *weight,
                              const sm_real *bias, int T, int C, int OC, sm_real *ws, sm_act act) {
    if (act == SM_ACT_RELU && ws && (sm_linear_small_use(T, C, OC) & SM_LINEAR_SMALL_FWD)) {
        sm_linear_forward_small_ex(out, act_out, inp, weight, bias, T, C, OC, ws);
        return;
    }
    sm_real *dst = out ? out : act_out; /* no out (the ReLU): the activation in place over the product */
    sm_linear_forward_ws(dst, inp, weight, bias, T, C, OC, ws);
    sm_act_forward(act_out, dst, (size_t)T * OC, act);
}

void sm_linear_forward_row(sm_real *out, const sm_real *inp, const sm_real *weight, const sm_real *bias, int C, int OC) {
    /* out (OC) = weight (OC,C) @ inp (C) (+ bias): gemv reads the weight once, where sgemm with one
     * row packs it into panels first (`specmoe bench gemm`: 5-7x slower at RL sizes) */
    if (bias) memcpy(out, bias, sizeof(sm_real) * OC);
#ifdef SPECMOE_DOUBLE
    cblas_dgemv(CblasRowMajor, CblasNoTrans, OC, C, 1, weight, C, inp, 1, bias ? 1 : 0, out, 1);
#else
    cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, C, 1, weight, C, inp, 1, bias ? 1 : 0, out, 1);
#endif
}

void sm_linear_backward(sm_real *dinp, sm_real *dweight, sm_real *dbias, const sm_real *dout,
                        const sm_real *inp, const sm_real *weight, int T, int C, int OC) {
    sm_linear_backward_ws(dinp, dweight, dbias, dout, inp, weight, T, C, OC, NULL);
}

void sm_linear_backward_ws(sm_real *dinp, sm_real *dweight, sm_real *dbias, const sm_real *dout, const sm_real *inp,
                           const sm_real *weight, int T, int C, int OC, sm_real *ws) {
    sm_linear_backward_ex(dinp, dweight, dbias, dout, inp, weight, T, C, OC, ws, 0);
}

void sm_linear_backward_ex(sm_real *dinp, sm_real *dweight, sm_real *dbias, const sm_real *dout, const sm_real *inp,
                           const sm_real *weight, int T, int C, int OC, sm_real *ws, int set) {
    const int use = ws ? sm_linear_small_use(T, C, OC) : 0;
    sm_real *di = use & SM_LINEAR_SMALL_DINP ? dinp : NULL, *dw = use & SM_LINEAR_SMALL_DWEIGHT ? dweight : NULL;
    if (di || dw) sm_linear_backward_small_ex(di, dw, dout, inp, weight, T, C, OC, ws, set);
    /* dinp (T,C) += dout (T,OC) @ weight (OC,C) */
    if (dinp && !di) sm_gemm(0, 0, T, C, OC, 1, dout, OC, weight, C, 1, dinp, C);
    /* dweight (OC,C) [+]= dout^T (OC,T) @ inp (T,C) */
    if (dweight && !dw) sm_gemm(1, 0, OC, C, T, 1, dout, OC, inp, C, set ? 0 : 1, dweight, C);
    if (dbias) {
        if (set) memset(dbias, 0, sizeof(sm_real) * (size_t)OC);
        for (int t = 0; t < T; t++) {
            const sm_real *d = dout + (size_t)t * OC;
            for (int o = 0; o < OC; o++) dbias[o] += d[o];
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* activations */

const char *sm_act_name(sm_act a) {
    switch (a) {
    case SM_ACT_NONE: return "none";
    case SM_ACT_RELU: return "relu";
    case SM_ACT_GELU: return "gelu";
    case SM_ACT_TANH: return "tanh";
    case SM_ACT_SILU: return "silu";
    }
    return "?";
}

int sm_act_parse(const char *s, sm_act *out) {
    static const sm_act all[] = {SM_ACT_NONE, SM_ACT_RELU, SM_ACT_GELU, SM_ACT_TANH, SM_ACT_SILU};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, sm_act_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return -1;
}

#ifdef SPECMOE_DOUBLE
#define R_EXP exp
#define R_TANH tanh
#define R_ERF erf
#define R_SQRT sqrt
#define R_LOG log
#else
/* tanh in float: Eigen's rational approximation (generic_fast_tanh_float, a 13/6 odd/even
 * polynomial ratio clamped at |x| = 7.905): within 4e-7 of the exact value over the whole line, and
 * 2.5x faster than glibc's tanhf, which dominated small tanh networks (PPO's actor and critic spent
 * three quarters of their time in it). The double build keeps libm's tanh for the gradient checks. */
static inline float fast_tanhf(float x) {
    const float lim = 7.90531110763549805f;
    x = x < lim ? x : lim;
    x = x > -lim ? x : -lim;
    const float x2 = x * x;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    return p * x / q; /* near 0 the ratio is x to within an ulp or two */
}
#define R_EXP expf
#define R_TANH fast_tanhf
#define R_ERF erff
#define R_SQRT sqrtf
#define R_LOG logf
#endif

static const double kInvSqrt2 = 0.70710678118654752440;
static const double kInvSqrt2Pi = 0.39894228040143267794;

void sm_act_forward(sm_real *out, const sm_real *inp, size_t N, sm_act a) {
    switch (a) {
    case SM_ACT_NONE:
        if (out != inp) memcpy(out, inp, N * sizeof(sm_real));
        break;
    case SM_ACT_RELU:
        for (size_t i = 0; i < N; i++) out[i] = inp[i] > 0 ? inp[i] : 0;
        break;
    case SM_ACT_GELU: /* x * Phi(x) */
        for (size_t i = 0; i < N; i++) {
            sm_real x = inp[i];
            out[i] = (sm_real)0.5 * x * (1 + R_ERF(x * (sm_real)kInvSqrt2));
        }
        break;
    case SM_ACT_TANH:
        for (size_t i = 0; i < N; i++) out[i] = R_TANH(inp[i]);
        break;
    case SM_ACT_SILU: /* x * sigmoid(x) */
        for (size_t i = 0; i < N; i++) out[i] = inp[i] / (1 + R_EXP(-inp[i]));
        break;
    }
}

/* f'(x) for each activation (used by both backward forms). */
static inline sm_real act_deriv(sm_real x, sm_act a) {
    switch (a) {
    case SM_ACT_NONE: return 1;
    case SM_ACT_RELU: return x > 0 ? 1 : 0;
    case SM_ACT_GELU: { /* d/dx x Phi(x) = Phi(x) + x phi(x) */
        sm_real cdf = (sm_real)0.5 * (1 + R_ERF(x * (sm_real)kInvSqrt2));
        sm_real pdf = (sm_real)kInvSqrt2Pi * R_EXP((sm_real)-0.5 * x * x);
        return cdf + x * pdf;
    }
    case SM_ACT_TANH: {
        sm_real y = R_TANH(x);
        return 1 - y * y;
    }
    case SM_ACT_SILU: {
        sm_real s = 1 / (1 + R_EXP(-x));
        return s * (1 + x * (1 - s));
    }
    }
    return 0;
}

void sm_act_backward(sm_real *dinp, const sm_real *dout, const sm_real *inp, size_t N, sm_act a) {
    for (size_t i = 0; i < N; i++) dinp[i] += dout[i] * act_deriv(inp[i], a);
}

void sm_act_backward_set(sm_real *dinp, const sm_real *dout, const sm_real *inp, size_t N, sm_act a) {
    switch (a) {
    case SM_ACT_NONE:
        if (dinp != dout) memcpy(dinp, dout, N * sizeof(sm_real));
        return;
    case SM_ACT_RELU: /* a loop of its own, without the switch per element, that GCC vectorises */
        for (size_t i = 0; i < N; i++) dinp[i] = dout[i] * (inp[i] > 0 ? (sm_real)1 : (sm_real)0);
        return;
    case SM_ACT_TANH:
        for (size_t i = 0; i < N; i++) {
            sm_real y = R_TANH(inp[i]);
            dinp[i] = dout[i] * (1 - y * y);
        }
        return;
    default:
        for (size_t i = 0; i < N; i++) dinp[i] = dout[i] * act_deriv(inp[i], a);
    }
}

void sm_act_backward_inplace(sm_real *d, const sm_real *inp, size_t N, sm_act a) { sm_act_backward_set(d, d, inp, N, a); }

/* ---------------------------------------------------------------------------------------------- */
/* layernorm (llm.c layernorm_forward / layernorm_backward) */

void sm_layernorm_forward(sm_real *out, sm_real *mean, sm_real *rstd, const sm_real *inp,
                          const sm_real *weight, const sm_real *bias, int T, int C) {
    const sm_real eps = (sm_real)1e-5; /* torch.nn.LayerNorm default */
    for (int t = 0; t < T; t++) {
        const sm_real *x = inp + (size_t)t * C;
        double m = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        double v = 0;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        sm_real s = (sm_real)(1.0 / sqrt(v + eps));
        sm_real *o = out + (size_t)t * C;
        for (int i = 0; i < C; i++) o[i] = (sm_real)((x[i] - m) * s) * weight[i] + bias[i];
        mean[t] = (sm_real)m;
        rstd[t] = s;
    }
}

void sm_layernorm_backward(sm_real *dinp, sm_real *dweight, sm_real *dbias, const sm_real *dout,
                           const sm_real *inp, const sm_real *weight, const sm_real *mean,
                           const sm_real *rstd, int T, int C) {
    for (int t = 0; t < T; t++) {
        const sm_real *d = dout + (size_t)t * C, *x = inp + (size_t)t * C;
        sm_real m = mean[t], s = rstd[t];
        double dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int i = 0; i < C; i++) {
            sm_real n = (x[i] - m) * s;
            sm_real dn = weight[i] * d[i];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * n;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        sm_real *di = dinp + (size_t)t * C;
        for (int i = 0; i < C; i++) {
            sm_real n = (x[i] - m) * s;
            sm_real dn = weight[i] * d[i];
            dbias[i] += d[i];
            dweight[i] += n * d[i];
            di[i] += (sm_real)((dn - dnorm_mean - n * dnorm_norm_mean) * s);
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* softmax */

void sm_softmax_forward(sm_real *probs, const sm_real *inp, sm_real temperature, int T, int V) {
    for (int t = 0; t < T; t++) {
        const sm_real *x = inp + (size_t)t * V;
        sm_real *p = probs + (size_t)t * V;
        sm_real mx = x[0];
        for (int v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
        sm_real sum = 0;
        for (int v = 0; v < V; v++) {
            p[v] = R_EXP((x[v] - mx) / temperature);
            sum += p[v];
        }
        for (int v = 0; v < V; v++) p[v] /= sum;
    }
}

void sm_softmax_backward(sm_real *dinp, const sm_real *dprobs, const sm_real *probs,
                         sm_real temperature, int T, int V) {
    for (int t = 0; t < T; t++) {
        const sm_real *p = probs + (size_t)t * V, *dp = dprobs + (size_t)t * V;
        sm_real dot = 0;
        for (int v = 0; v < V; v++) dot += p[v] * dp[v];
        sm_real *dx = dinp + (size_t)t * V;
        for (int v = 0; v < V; v++) dx[v] += p[v] * (dp[v] - dot) / temperature;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* losses */

double sm_crossentropy_forward(sm_real *losses, sm_real *probs, const sm_real *logits,
                               const int *targets, const unsigned char *mask, int T, int V) {
    double total = 0;
    for (int t = 0; t < T; t++) {
        const sm_real *x = logits + (size_t)t * V;
        sm_real *p = probs + (size_t)t * V;
        sm_real mx = -INFINITY;
        for (int v = 0; v < V; v++)
            if ((!mask || mask[v]) && x[v] > mx) mx = x[v];
        sm_real sum = 0;
        for (int v = 0; v < V; v++) {
            p[v] = (!mask || mask[v]) ? R_EXP(x[v] - mx) : 0;
            sum += p[v];
        }
        for (int v = 0; v < V; v++) p[v] /= sum;
        /* log p_target computed from the logits, not log(p), so it stays finite for tiny p. */
        sm_real l = R_LOG(sum) + mx - x[targets[t]];
        losses[t] = l;
        total += l;
    }
    return total / T;
}

void sm_crossentropy_backward(sm_real *dlogits, const sm_real *probs, const int *targets, sm_real dloss,
                              int T, int V) {
    sm_real scale = dloss / (sm_real)T;
    for (int t = 0; t < T; t++) {
        const sm_real *p = probs + (size_t)t * V;
        sm_real *d = dlogits + (size_t)t * V;
        for (int v = 0; v < V; v++) d[v] += scale * (p[v] - (v == targets[t] ? 1 : 0));
    }
}

double sm_mse_forward(const sm_real *pred, const sm_real *target, size_t N) {
    double s = 0;
    for (size_t i = 0; i < N; i++) {
        double d = (double)pred[i] - (double)target[i];
        s += d * d;
    }
    return s / (double)N;
}

void sm_mse_backward(sm_real *dpred, const sm_real *pred, const sm_real *target, sm_real dloss,
                     size_t N) {
    sm_real scale = 2 * dloss / (sm_real)N;
    for (size_t i = 0; i < N; i++) dpred[i] += scale * (pred[i] - target[i]);
}

/* ---------------------------------------------------------------------------------------------- */
/* row-wise L2 normalisation (SoftMoE's normalised tokens and slots, vMF directions) */

void sm_l2norm_forward(sm_real *out, sm_real *norms, const sm_real *v, int N, int C) {
    for (int i = 0; i < N; i++) {
        const sm_real *vi = v + (size_t)i * C;
        double ss = 0;
        for (int j = 0; j < C; j++) ss += (double)vi[j] * vi[j];
        norms[i] = (sm_real)sqrt(ss > 1e-24 ? ss : 1e-24);
        for (int j = 0; j < C; j++) out[(size_t)i * C + j] = vi[j] / norms[i];
    }
}

void sm_l2norm_backward(sm_real *dv, const sm_real *dout, const sm_real *out, const sm_real *norms, int N, int C) {
    for (int i = 0; i < N; i++) {
        const sm_real *y = out + (size_t)i * C, *g = dout + (size_t)i * C;
        double dot = 0;
        for (int j = 0; j < C; j++) dot += (double)y[j] * g[j];
        for (int j = 0; j < C; j++) dv[(size_t)i * C + j] += (sm_real)((g[j] - y[j] * dot) / norms[i]);
    }
}

int sm_argmax(const sm_real *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

double sm_sumsq(const sm_real *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

/* Runs every step over every gradient: an early-exit isfinite loop does not vectorise, so test the
 * exponent bits (all ones for Inf and NaN) with an OR reduction over blocks, which does. */
int sm_all_finite(const sm_real *x, size_t n) {
#ifdef SPECMOE_DOUBLE
    typedef uint64_t bits_t;
    const bits_t expo = 0x7ff0000000000000ull;
#else
    typedef uint32_t bits_t;
    const bits_t expo = 0x7f800000u;
#endif
    for (size_t i0 = 0; i0 < n; i0 += 4096) {
        size_t m = n - i0 < 4096 ? n - i0 : 4096;
        bits_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            bits_t u;
            memcpy(&u, x + i0 + i, sizeof u);
            bad |= (bits_t)((u & expo) == expo);
        }
        if (bad) return 0;
    }
    return 1;
}
