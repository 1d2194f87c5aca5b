/* The packed small-matrix products of a linear layer (src/core/linear_small.c) against a
 * double-precision reference, on the AVX-512 tile (12 x 16 and its two-panel 12 x 32 form), the AVX2
 * tile (sm_gemm_tiny_set_isa(SM_ISA_AVX2)) and the portable loops (sm_gemm_tiny_set_simd(0)):
 *   forward  out = inp @ weight^T + bias (with and without bias; out fully overwritten)
 *   dinp     dinp += dout @ weight        (accumulates into what is there)
 *   dweight  dweight += dout^T @ inp
 * over shapes that are and are not multiples of the tiles in every dimension, T = 1, C = 1,
 * OC = 1, and the DQN's 32 x 1024 -> 128 and 32 x 128 -> 6. The workspace is surrounded by canaries
 * (nothing written past sm_linear_small_ws), and the results are the same bits when run twice, and
 * the same bits on the AVX2 and the AVX-512 tile (one FMA chain over k in order in both). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "specmoe.h"

/* |got - ref| <= tol * sum |terms|: float sums of K products, reassociated (FMA, another order) */
static void expect_close(const char *what, int T, int C, int OC, int i, double got, double ref, double mag, int K) {
    const double tol = 4e-7 * (K + 4);
    cr_assert(fabs(got - ref) <= tol * mag + 1e-30, "%s T=%d C=%d OC=%d: [%d] = %.9g, reference %.9g", what, T, C, OC,
              i, got, ref);
}

static float *randv(size_t n, sm_rng *g) {
    float *v = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = (float)sm_rng_normal(g);
    return v;
}

static void check_shape(int T, int C, int OC, sm_rng *g) {
    float *x = randv((size_t)T * C, g), *w = randv((size_t)OC * C, g), *b = randv((size_t)OC, g);
    float *dy = randv((size_t)T * OC, g), *dx0 = randv((size_t)T * C, g), *dw0 = randv((size_t)OC * C, g);
    float *y = malloc(sizeof(float) * T * OC), *y2 = malloc(sizeof(float) * T * OC);
    const size_t cpad = 32; /* canaries after the accumulated outputs: a tile's column mask must hold */
    float *dxb = malloc(sizeof(float) * ((size_t)T * C + cpad)), *dwb = malloc(sizeof(float) * ((size_t)OC * C + cpad));
    float *dx = dxb, *dw = dwb;
    for (size_t i = 0; i < cpad; i++) dx[(size_t)T * C + i] = dw[(size_t)OC * C + i] = -777.f;
    float *dx2 = malloc(sizeof(float) * T * C), *dw2 = malloc(sizeof(float) * OC * C);
    const size_t nws = sm_linear_small_ws(T, C, OC), pad = 64;
    float *wsb = malloc(sizeof(float) * (nws + 2 * pad)), *ws = wsb + pad;
    for (size_t i = 0; i < nws + 2 * pad; i++) wsb[i] = 12345.f;
    for (int withb = 0; withb < 2; withb++) {
        for (int i = 0; i < T * OC; i++) y[i] = NAN; /* the forward writes every entry */
        sm_linear_forward_small(y, x, w, withb ? b : NULL, T, C, OC, ws);
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OC; o++) {
                double ref = withb ? b[o] : 0, mag = fabs(ref);
                for (int c = 0; c < C; c++) ref += (double)x[t * C + c] * w[o * C + c], mag += fabs((double)x[t * C + c] * w[o * C + c]);
                expect_close("forward", T, C, OC, t * OC + o, y[t * OC + o], ref, mag, C);
            }
    }
    memcpy(dx, dx0, sizeof(float) * T * C);
    memcpy(dw, dw0, sizeof(float) * OC * C);
    sm_linear_backward_small(dx, dw, dy, x, w, T, C, OC, ws);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double ref = dx0[t * C + c], mag = fabs(ref);
            for (int o = 0; o < OC; o++) ref += (double)dy[t * OC + o] * w[o * C + c], mag += fabs((double)dy[t * OC + o] * w[o * C + c]);
            expect_close("dinp (+=)", T, C, OC, t * C + c, dx[t * C + c], ref, mag, OC);
        }
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            double ref = dw0[o * C + c], mag = fabs(ref);
            for (int t = 0; t < T; t++) ref += (double)dy[t * OC + o] * x[t * C + c], mag += fabs((double)dy[t * OC + o] * x[t * C + c]);
            expect_close("dweight (+=)", T, C, OC, o * C + c, dw[o * C + c], ref, mag, T);
        }
    for (size_t i = 0; i < pad; i++)
        cr_assert(wsb[i] == 12345.f && wsb[pad + nws + i] == 12345.f, "T=%d C=%d OC=%d: written outside the workspace", T,
                  C, OC);
    for (size_t i = 0; i < cpad; i++)
        cr_assert(dx[(size_t)T * C + i] == -777.f && dw[(size_t)OC * C + i] == -777.f,
                  "T=%d C=%d OC=%d: written past dinp or dweight", T, C, OC);
    /* one product at a time (the other NULL), and the same bits on a second run */
    memcpy(dx2, dx0, sizeof(float) * T * C);
    memcpy(dw2, dw0, sizeof(float) * OC * C);
    sm_linear_backward_small(dx2, NULL, dy, x, w, T, C, OC, ws);
    sm_linear_backward_small(NULL, dw2, dy, x, w, T, C, OC, ws);
    sm_linear_forward_small(y2, x, w, b, T, C, OC, ws);
    cr_assert(!memcmp(dx, dx2, sizeof(float) * T * C) && !memcmp(dw, dw2, sizeof(float) * OC * C) &&
                  !memcmp(y, y2, sizeof(float) * T * OC),
              "T=%d C=%d OC=%d: not the same bits on a second run", T, C, OC);
    /* set = 1 writes dweight (=) over garbage: the values of += into zeros (a zero's sign aside, so
     * compared with ==; NaN never passes), through the packed kernel and through OpenBLAS (ws NULL),
     * with the bias gradient of sm_linear_backward_ex set alike */
    float *dws = malloc(sizeof(float) * OC * C), *dwz = calloc((size_t)OC * C, sizeof(float));
    float *dbs = malloc(sizeof(float) * OC), *dbz = calloc((size_t)OC, sizeof(float));
    sm_linear_backward_small(NULL, dwz, dy, x, w, T, C, OC, ws);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < OC * C; i++) dws[i] = NAN;
        for (int i = 0; i < OC; i++) dbs[i] = NAN;
        if (pass == 0) sm_linear_backward_small_ex(NULL, dws, dy, x, w, T, C, OC, ws, 1);
        else {
            sm_linear_backward_ex(NULL, dws, dbs, dy, x, w, T, C, OC, NULL, 1);
            memset(dbz, 0, sizeof(float) * OC);
            for (int t = 0; t < T; t++)
                for (int o = 0; o < OC; o++) dbz[o] += dy[t * OC + o];
            for (int o = 0; o < OC; o++)
                cr_assert(dbs[o] == dbz[o], "dbias (set) T=%d C=%d OC=%d: [%d] = %g, += into zeros %g", T, C, OC, o,
                          dbs[o], dbz[o]);
        }
        for (int i = 0; i < OC * C; i++)
            if (pass == 0) cr_assert(dws[i] == dwz[i], "dweight (set) T=%d C=%d OC=%d: [%d] = %g, += into zeros %g", T,
                                     C, OC, i, dws[i], dwz[i]);
            else { /* OpenBLAS: another summation order than the tile's */
                double mag = 0;
                for (int t = 0; t < T; t++) mag += fabs((double)dy[t * OC + i / C] * x[t * C + i % C]);
                expect_close("dweight (set, OpenBLAS)", T, C, OC, i, dws[i], dwz[i], 2 * mag, T);
            }
    }
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(y), free(y2), free(dxb), free(dwb), free(dx2),
        free(dw2), free(wsb), free(dws), free(dwz), free(dbs), free(dbz);
}

static void sweep(unsigned seed) {
    sm_rng g;
    sm_rng_seed(&g, seed);
    static const int Ts[] = {1, 2, 5, 6, 7, 12, 15, 16, 17, 31, 32, 33}, Cs[] = {1, 3, 15, 16, 17, 33, 64},
                     OCs[] = {1, 5, 6, 7, 13, 18};
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (size_t b = 0; b < sizeof Cs / sizeof Cs[0]; b++)
            for (size_t c = 0; c < sizeof OCs / sizeof OCs[0]; c++) check_shape(Ts[a], Cs[b], OCs[c], &g);
    check_shape(32, 1024, 128, &g); /* the MinAtar DQN's dense layer */
    check_shape(32, 128, 6, &g);    /* and its head */
    check_shape(70, 200, 37, &g);
}

static const char *isa_name(int isa) {
    return isa >= SM_ISA_AVX512 ? "AVX-512 tile" : isa == SM_ISA_AVX2 ? "AVX2 tile" : "portable loops";
}

Test(linear_small, cpu_tile_against_a_double_reference) {
    fprintf(stderr, "linear_small: %s\n", isa_name(sm_gemm_tiny_isa()));
    sweep(11);
}

Test(linear_small, avx2_tile_against_a_double_reference) {
    sm_gemm_tiny_set_isa(SM_ISA_AVX2);
    fprintf(stderr, "linear_small capped at AVX2: %s\n", isa_name(sm_gemm_tiny_isa()));
    cr_assert(sm_gemm_tiny_isa() <= SM_ISA_AVX2);
    sweep(14);
    sm_gemm_tiny_set_simd(1);
}

/* the AVX-512 tile and the AVX2 tile: the same bits for all three products (each output one FMA chain
 * over k in order, then + bias, then + C, in both); shapes with one and two full panels, edges. With
 * C <= T the AVX-512 forward runs by rows (the bias per column, the ReLU in the tile), the AVX2 one
 * transposed: the same bits too, and the ReLU written beside the output is x > 0 ? x : 0 of it. */
Test(linear_small, avx512_and_avx2_tiles_give_the_same_bits) {
    if (sm_gemm_tiny_isa() < SM_ISA_AVX512) {
        fprintf(stderr, "linear_small: no AVX-512 on this CPU (%s): nothing to compare\n", isa_name(sm_gemm_tiny_isa()));
        return;
    }
    /* C = 300: a second 256-column window with pairs read in place and a packed rest */
    static const int shapes[][3] = {{32, 1024, 128}, {32, 128, 6}, {33, 70, 37}, {12, 48, 25}, {70, 200, 13}, {5, 31, 12},
                                    {17, 300, 29}, {128, 16, 512}, {70, 33, 37}, {40, 17, 48}, {13, 13, 17}, {25, 1, 3},
                                    {128, 512, 16}, {40, 100, 32}};
    sm_rng g;
    sm_rng_seed(&g, 15);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int T = shapes[k][0], C = shapes[k][1], OC = shapes[k][2];
        float *x = randv((size_t)T * C, &g), *w = randv((size_t)OC * C, &g), *b = randv(OC, &g),
              *dy = randv((size_t)T * OC, &g), *dx0 = randv((size_t)T * C, &g), *dw0 = randv((size_t)OC * C, &g);
        float *ws = malloc(sizeof(float) * sm_linear_small_ws(T, C, OC));
        float *out[2][3], *relu[2];
        for (int v = 0; v < 2; v++) {
            sm_gemm_tiny_set_isa(v ? SM_ISA_AVX512 : SM_ISA_AVX2);
            out[v][0] = malloc(sizeof(float) * T * OC), out[v][1] = malloc(sizeof(float) * T * C),
            out[v][2] = malloc(sizeof(float) * OC * C);
            memcpy(out[v][1], dx0, sizeof(float) * T * C);
            memcpy(out[v][2], dw0, sizeof(float) * OC * C);
            relu[v] = malloc(sizeof(float) * T * OC);
            for (int i = 0; i < T * OC; i++) relu[v][i] = NAN; /* every entry written */
            sm_linear_forward_small_ex(out[v][0], relu[v], x, w, b, T, C, OC, ws);
            for (int i = 0; i < T * OC; i++)
                cr_assert(relu[v][i] == (out[v][0][i] > 0 ? out[v][0][i] : 0) && !signbit(relu[v][i]),
                          "relu T=%d C=%d OC=%d [%d]: %g of %g", T, C, OC, i, relu[v][i], out[v][0][i]);
            float *only = malloc(sizeof(float) * T * OC); /* the ReLU alone, without the output */
            for (int i = 0; i < T * OC; i++) only[i] = NAN;
            sm_linear_forward_small_ex(NULL, only, x, w, b, T, C, OC, ws);
            cr_assert(!memcmp(only, relu[v], sizeof(float) * T * OC), "relu alone T=%d C=%d OC=%d differs", T, C, OC);
            free(only);
            sm_linear_backward_small(out[v][1], out[v][2], dy, x, w, T, C, OC, ws);
            /* SM_LINEAR_SET_DINP: dinp overwritten (over NaN), as accumulated into zeros */
            float *dset = malloc(sizeof(float) * T * C), *dzero = calloc((size_t)T * C, sizeof(float));
            for (int i = 0; i < T * C; i++) dset[i] = NAN;
            sm_linear_backward_small_ex(dset, NULL, dy, x, w, T, C, OC, ws, SM_LINEAR_SET_DINP);
            sm_linear_backward_small_ex(dzero, NULL, dy, x, w, T, C, OC, ws, 0);
            for (int i = 0; i < T * C; i++)
                cr_assert(dset[i] == dzero[i], "dinp set T=%d C=%d OC=%d [%d]: %g, accumulated into zeros %g", T, C, OC, i,
                          dset[i], dzero[i]);
            free(dset), free(dzero);
        }
        sm_gemm_tiny_set_simd(1);
        cr_assert(!memcmp(relu[0], relu[1], sizeof(float) * T * OC), "relu T=%d C=%d OC=%d: AVX2 and AVX-512 differ", T,
                  C, OC);
        free(relu[0]), free(relu[1]);
        const size_t n[3] = {(size_t)T * OC, (size_t)T * C, (size_t)OC * C};
        static const char *what[3] = {"forward", "dinp", "dweight"};
        for (int p = 0; p < 3; p++) {
            cr_assert(!memcmp(out[0][p], out[1][p], sizeof(float) * n[p]), "%s T=%d C=%d OC=%d: AVX2 and AVX-512 differ",
                      what[p], T, C, OC);
            free(out[0][p]), free(out[1][p]);
        }
        free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(ws);
    }
}

Test(linear_small, portable_loops_against_a_double_reference) {
    sm_gemm_tiny_set_simd(0);
    cr_assert(!sm_gemm_tiny_simd());
    sweep(12);
    sm_gemm_tiny_set_simd(1);
}

/* the dense module sizes its workspace by sm_linear_small_use_max: it must cover what the rule picks
 * under every ISA cap (a cap raised after a model was built would otherwise overrun the workspace) */
Test(linear_small, the_max_rule_covers_every_cap) {
    static const int Ts[] = {2, 4, 8, 12, 16, 32, 48, 64, 128, 256}, Ws[][2] = {{64, 64}, {128, 6}, {1024, 128}, {512, 512}, {128, 16}, {100, 17}};
    for (int isa = SM_ISA_NONE; isa <= SM_ISA_AVX512; isa++) {
        sm_gemm_tiny_set_isa(isa);
        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
            for (size_t w = 0; w < sizeof Ws / sizeof Ws[0]; w++) {
                const int T = Ts[t], C = Ws[w][0], OC = Ws[w][1];
                const int use = sm_linear_small_use(T, C, OC), max = sm_linear_small_use_max(T, C, OC);
                cr_assert(!(use & ~max), "cap %d, T=%d C=%d OC=%d: rule %d outside the max rule %d", isa, T, C, OC, use, max);
                cr_assert(sm_linear_small_ws_for(T, C, OC, use) <= sm_linear_small_ws_for(T, C, OC, max));
            }
    }
    sm_gemm_tiny_set_simd(1);
}

/* the dense module takes this path when the rule says so; its result is OpenBLAS's within rounding */
Test(linear_small, rule_and_openblas_agree) {
    sm_rng g;
    sm_rng_seed(&g, 13);
    const int T = 32, C = 1024, OC = 128;
    const int all = SM_LINEAR_SMALL_FWD | SM_LINEAR_SMALL_DINP | SM_LINEAR_SMALL_DWEIGHT;
    /* the DQN's dense layer: with AVX2 the forward only (its backward is at par with OpenBLAS's); with
     * the AVX-512 tile against OpenBLAS's AVX2 kernels all three (1.3-2.3x, BENCHMARKS.md); its head: all */
    const char *core = openblas_get_corename();
    const int blas512 = core && (strstr(core, "kylakex") || strstr(core, "KYLAKEX") || strstr(core, "ooperlake") ||
                                 strstr(core, "OOPERLAKE") || strstr(core, "apphire") || strstr(core, "APPHIRE"));
    const int want = !sm_gemm_tiny_simd() ? 0 : sm_gemm_tiny_isa() >= SM_ISA_AVX512 && !blas512 ? all : SM_LINEAR_SMALL_FWD;
    cr_assert(sm_linear_small_use(T, C, OC) == want, "OpenBLAS core %s, tile %s: rule %d", core ? core : "?",
              isa_name(sm_gemm_tiny_isa()), sm_linear_small_use(T, C, OC));
    cr_assert(sm_linear_small_use(T, 128, 6) == (sm_gemm_tiny_simd() ? all : 0));
    sm_gemm_tiny_set_isa(SM_ISA_AVX2); /* the AVX2 rule, whatever the CPU */
    cr_assert(sm_linear_small_use(T, C, OC) == (sm_gemm_tiny_simd() ? SM_LINEAR_SMALL_FWD : 0));
    sm_gemm_tiny_set_simd(1);
    cr_assert(!sm_linear_small_use(1, C, OC) && !sm_linear_small_use(512, C, OC));
    float *x = randv((size_t)T * C, &g), *w = randv((size_t)OC * C, &g), *b = randv(OC, &g);
    float *y1 = malloc(sizeof(float) * T * OC), *y2 = malloc(sizeof(float) * T * OC);
    float *ws = malloc(sizeof(float) * sm_linear_small_ws(T, C, OC));
    sm_linear_forward(y1, x, w, b, T, C, OC);
    sm_linear_forward_ws(y2, x, w, b, T, C, OC, ws);
    for (int i = 0; i < T * OC; i++) cr_assert(fabs(y1[i] - y2[i]) <= 1e-4 * (1 + fabs(y1[i])), "[%d] %g vs %g", i, y1[i], y2[i]);
    free(x), free(w), free(b), free(y1), free(y2), free(ws);
}
