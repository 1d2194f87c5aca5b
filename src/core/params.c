/* Parameter table: one block for values, one for gradients. */
#include "specmoe/core/params.h"

#include "specmoe/core/stiefel.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void sm_params_init_table(sm_params *ps) { memset(ps, 0, sizeof *ps); }

int sm_params_add(sm_params *ps, const char *name, int ndim, const int64_t *shape, sm_init init,
                  int fan_in, double scale, unsigned flags, sm_error *err) {
    if (ps->data) {
        sm_fail(err, SM_ERR_ARG, "%s: parameters already allocated", name);
        return -1;
    }
    if (ndim < 1 || ndim > SM_MAX_DIMS || strlen(name) >= SM_NAME_MAX) {
        sm_fail(err, SM_ERR_ARG, "%s: bad tensor rank %d or name length", name, ndim);
        return -1;
    }
    if (sm_params_find(ps, name) >= 0) {
        sm_fail(err, SM_ERR_ARG, "%s: duplicate parameter name", name);
        return -1;
    }
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || shape[i] > (int64_t)1 << 40) {
            sm_fail(err, SM_ERR_ARG, "%s: dimension %d is %lld", name, i, (long long)shape[i]);
            return -1;
        }
        /* sizes come from outside data (checkpoint configs): refuse anything that overflows */
        if ((size_t)shape[i] > ((size_t)1 << 40) / numel) {
            sm_fail(err, SM_ERR_ARG, "%s: tensor too large (more than 2^40 values)", name);
            return -1;
        }
        numel *= (size_t)shape[i];
    }
    if (ps->total > ((size_t)1 << 40) - numel) {
        sm_fail(err, SM_ERR_ARG, "%s: parameters exceed 2^40 values in total", name);
        return -1;
    }
    if (ps->n == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 16;
        sm_param *p = realloc(ps->p, sizeof *p * (size_t)cap);
        if (!p) {
            sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", name);
            return -1;
        }
        ps->p = p;
        ps->cap = cap;
    }
    sm_param *q = &ps->p[ps->n];
    memset(q, 0, sizeof *q);
    strcpy(q->name, name);
    q->ndim = ndim;
    for (int i = 0; i < ndim; i++) q->shape[i] = shape[i];
    q->numel = numel;
    q->offset = ps->total;
    q->init = init;
    q->fan_in = fan_in;
    q->scale = scale;
    q->flags = flags;
    ps->total += numel;
    return ps->n++;
}

sm_status sm_params_alloc(sm_params *ps, sm_error *err) {
    size_t n = ps->total ? ps->total : 1;
    ps->data = calloc(n, sizeof(sm_real));
    ps->grad = calloc(n, sizeof(sm_real));
    if (!ps->data || !ps->grad) {
        free(ps->data);
        free(ps->grad);
        ps->data = ps->grad = NULL;
        return sm_fail(err, SM_ERR_NOMEM, "parameters: cannot allocate %zu values", ps->total);
    }
    return SM_OK;
}

void sm_params_free(sm_params *ps) {
    free(ps->p);
    free(ps->data);
    free(ps->grad);
    memset(ps, 0, sizeof *ps);
}

void sm_params_init_draw(const sm_params *ps, int i, sm_real *x, sm_rng *rng) {
    const sm_param *q = &ps->p[i];
    if (q->init == SM_INIT_STIEFEL) {
        /* frames are the trailing (r, d) blocks; r <= d is checked by the declaring module */
        int r = (int)q->shape[q->ndim - 2], d = (int)q->shape[q->ndim - 1];
        for (size_t f = 0; f < q->numel / ((size_t)r * d); f++) sm_stiefel_haar(x + f * (size_t)r * d, r, d, rng, NULL);
        return;
    }
    sm_params_init_draw_n(ps, i, q->numel, x, rng);
}

int sm_params_init_draw_n(const sm_params *ps, int i, size_t n, sm_real *x, sm_rng *rng) {
    const sm_param *q = &ps->p[i];
    if (q->init == SM_INIT_STIEFEL) return -1;
    double a = q->fan_in > 0 ? 1.0 / sqrt((double)q->fan_in) : 0.0;
    for (size_t j = 0; j < n; j++) {
        switch (q->init) {
        case SM_INIT_ZERO: x[j] = 0; break;
        case SM_INIT_ONE: x[j] = 1; break;
        case SM_INIT_UNIFORM_FANIN: x[j] = (sm_real)(a * (2 * sm_rng_uniform(rng) - 1)); break;
        case SM_INIT_NORMAL: x[j] = (sm_real)(q->scale * sm_rng_normal(rng)); break;
        case SM_INIT_CONST: x[j] = (sm_real)q->scale; break;
        case SM_INIT_STIEFEL: break;
        }
    }
    return 0;
}

void sm_params_initialize(sm_params *ps, sm_rng *rng) {
    for (int i = 0; i < ps->n; i++) sm_params_init_draw(ps, i, ps->data + ps->p[i].offset, rng);
}

sm_status sm_params_init_orthogonal(sm_params *ps, int i, double gain, sm_rng *rng, sm_error *err) {
    if (i < 0 || i >= ps->n || !ps->data) return sm_fail(err, SM_ERR_ARG, "orthogonal init: no tensor %d", i);
    const sm_param *q = &ps->p[i];
    size_t rows = (size_t)q->shape[0], cols = q->numel / rows;
    if (rows > INT32_MAX || cols > INT32_MAX) return sm_fail(err, SM_ERR_ARG, "%s: too large for an orthogonal init", q->name);
    sm_real *x = ps->data + q->offset;
    if (rows <= cols) {
        sm_status st = sm_stiefel_haar(x, (int)rows, (int)cols, rng, err);
        if (st != SM_OK) return st;
    } else {
        /* orthonormal columns: a (cols, rows) frame, transposed */
        sm_real *t = malloc(sizeof(sm_real) * q->numel);
        if (!t) return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for an orthogonal init", q->name);
        sm_status st = sm_stiefel_haar(t, (int)cols, (int)rows, rng, err);
        for (size_t r = 0; r < rows && st == SM_OK; r++)
            for (size_t c = 0; c < cols; c++) x[r * cols + c] = t[c * rows + r];
        free(t);
        if (st != SM_OK) return st;
    }
    for (size_t j = 0; j < q->numel; j++) x[j] = (sm_real)(gain * x[j]);
    return SM_OK;
}

void sm_params_zero_grad(sm_params *ps) { memset(ps->grad, 0, sizeof(sm_real) * ps->total); }

int sm_params_find(const sm_params *ps, const char *name) {
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->p[i].name, name) == 0) return i;
    return -1;
}

/* The block behind sm_carve*: the sum of the sizes (refused if it overflows) in one zero-filled
 * allocation; zero-filled because the separate callocs it replaces were. */
static void *carve_block(size_t elem, const size_t sizes[], size_t n, sm_error *err, const char *who, va_list ap) {
    size_t total = 0;
    int overflow = 0;
    double mib = 0;
    for (size_t i = 0; i < n; i++) {
        mib += (double)sizes[i] * (double)elem / (1024.0 * 1024.0);
        if (sizes[i] > SIZE_MAX / elem - total) overflow = 1;
        else total += sizes[i];
    }
    void *block = overflow ? NULL : calloc(total ? total : 1, elem);
    if (!block) {
        char owner[256];
        vsnprintf(owner, sizeof owner, who, ap);
        sm_fail(err, SM_ERR_NOMEM, "%s: out of memory (%.1f MiB)", owner, mib);
    }
    return block;
}

/* sm_carve, sm_carve_int, sm_carve_double: the same few lines for each element type */
#define CARVE(name, type)                                                                                 \
    type *name(type **const ptrs[], const size_t sizes[], size_t n, sm_error *err, const char *who, ...) { \
        va_list ap;                                                                                       \
        va_start(ap, who);                                                                                \
        type *block = carve_block(sizeof *block, sizes, n, err, who, ap);                                 \
        va_end(ap);                                                                                       \
        for (size_t i = 0, off = 0; block && i < n; off += sizes[i++]) *ptrs[i] = block + off;            \
        return block;                                                                                     \
    }
CARVE(sm_carve, sm_real)
CARVE(sm_carve_int, int)
CARVE(sm_carve_double, double)
#undef CARVE
