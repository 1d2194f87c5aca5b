/* Parameter table: every trainable tensor of a model lives in ONE contiguous block (and its gradient
 * in one more), carved into named tensors from a table of sizes (llm.c malloc_and_point_parameters).
 *
 * Modules declare their tensors (name, shape, initialiser) with sm_params_add, the owner allocates
 * once with sm_params_alloc, and each module then takes its pointers with sm_params_data/grad.
 * Optimiser moments are allocated by the optimiser with the same total size, so per-tensor offsets
 * carry over.
 */
#ifndef SPECMOE_PARAMS_H
#define SPECMOE_PARAMS_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SM_PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define SM_PRINTF_LIKE(fmt, args)
#endif

#define SM_MAX_DIMS 4
#define SM_NAME_MAX 96

typedef enum {
    SM_INIT_ZERO = 0,
    SM_INIT_ONE,
    SM_INIT_UNIFORM_FANIN, /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)): torch.nn.Linear's default */
    SM_INIT_NORMAL,        /* N(0, scale^2) */
    SM_INIT_CONST,         /* every value = scale */
    SM_INIT_STIEFEL        /* (..., r, d) blocks with orthonormal rows, Haar-distributed (stiefel.h) */
} sm_init;

enum {
    SM_PARAM_NO_DECAY = 1u << 0, /* excluded from weight decay */
    SM_PARAM_STIEFEL = 1u << 1,  /* lives on a Stiefel manifold (Riemannian optimiser) */
    SM_PARAM_FROZEN = 1u << 2,   /* not updated by the optimiser */
    /* this rank's part of a tensor split over the ranks of an MPI run (expert parallel: E/P of the
     * experts, include/specmoe/dist/ep.h): its gradient is complete on this rank, so the
     * data-parallel allreduce leaves it out, and the ranks' values differ */
    SM_PARAM_LOCAL = 1u << 3,
    /* every write to its gradient in a backward goes through the call's context (sm_ctx's fresh
     * flags): the dense layer's weight and bias. sm_model_backward_set leaves such a gradient
     * unzeroed and lets its module write it with = (module.h) */
    SM_PARAM_GRAD_CTX = 1u << 4
};

typedef struct {
    char name[SM_NAME_MAX];
    int ndim;
    int64_t shape[SM_MAX_DIMS];
    size_t numel;
    size_t offset; /* into the data / grad blocks */
    sm_init init;
    int fan_in;
    double scale;
    unsigned flags;
} sm_param;

typedef struct {
    int n, cap;
    sm_param *p;
    size_t total;  /* sum of numel */
    sm_real *data; /* (total) */
    sm_real *grad; /* (total) */
} sm_params;

void sm_params_init_table(sm_params *ps);
/* Declares a tensor; returns its index or -1 (err filled) on a bad shape or duplicate name. */
int sm_params_add(sm_params *ps, const char *name, int ndim, const int64_t *shape, sm_init init,
                  int fan_in, double scale, unsigned flags, sm_error *err);
sm_status sm_params_alloc(sm_params *ps, sm_error *err);
void sm_params_free(sm_params *ps);
/* Fills every tensor from its initialiser, in table order, from rng. */
void sm_params_initialize(sm_params *ps, sm_rng *rng);
/* A fresh draw of tensor i's initialiser into out (numel values), the table left alone. */
void sm_params_init_draw(const sm_params *ps, int i, sm_real *out, sm_rng *rng);
/* n values of tensor i's element-wise initialiser (its values are independent, so any n of them are
 * a part of a fresh draw: e.g. one row to reinitialise); -1 for a Stiefel tensor, whose frames are
 * drawn whole. sm_params_init_draw is this with n = numel for element-wise initialisers. */
int sm_params_init_draw_n(const sm_params *ps, int i, size_t n, sm_real *out, sm_rng *rng);
/* Orthogonal initialisation of tensor i (Saxe et al. 2014; torch.nn.init.orthogonal_): viewed as a
 * (shape[0], numel / shape[0]) matrix, it becomes gain times a Haar-distributed matrix with
 * orthonormal rows (rows <= columns) or orthonormal columns (rows > columns), from a QR
 * factorisation of a Gaussian matrix (LAPACKE, sign-fixed). RL agents use it with gains sqrt(2),
 * 0.01 and 1 (CleanRL's layer_init). */
sm_status sm_params_init_orthogonal(sm_params *ps, int i, double gain, sm_rng *rng, sm_error *err);
void sm_params_zero_grad(sm_params *ps);
int sm_params_find(const sm_params *ps, const char *name);
static inline sm_real *sm_params_data(const sm_params *ps, int i) { return ps->data + ps->p[i].offset; }
static inline sm_real *sm_params_grad(const sm_params *ps, int i) { return ps->grad + ps->p[i].offset; }

/* The same rule for scratch and activations: n arrays of sizes[i] elements carved, in table order,
 * from ONE zero-filled block, *ptrs[i] pointing at array i (llm.c malloc_and_point_parameters):
 *
 *     size_t sizes[] = {T * E, T};
 *     sm_real **ptrs[] = {&s->logits, &s->lse};
 *     s->block = sm_carve(ptrs, sizes, SM_LEN(sizes), err, "router %s (%d tokens)", name, max_T);
 *
 * Returns the block, the only pointer to free, or NULL with err set to SM_ERR_NOMEM: "<who>: out of
 * memory (<size> MiB)", who formatted printf-style. A block holds one element type, so there is one
 * function per type (int and double buffers get a block of their own). */
sm_real *sm_carve(sm_real **const ptrs[], const size_t sizes[], size_t n, sm_error *err, const char *who, ...)
    SM_PRINTF_LIKE(5, 6);
int *sm_carve_int(int **const ptrs[], const size_t sizes[], size_t n, sm_error *err, const char *who, ...)
    SM_PRINTF_LIKE(5, 6);
double *sm_carve_double(double **const ptrs[], const size_t sizes[], size_t n, sm_error *err, const char *who, ...)
    SM_PRINTF_LIKE(5, 6);
#define SM_LEN(a) (sizeof(a) / sizeof((a)[0]))

#ifdef __cplusplus
}
#endif
#endif
