/* MPI start-up, reductions and the data-parallel adapter of the training loop (see
 * include/specmoe/dist/dist.h). Without SPECMOE_MPI (make MPI=0) the same functions serve one
 * process. */
#include "specmoe/dist/dist.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#ifdef SPECMOE_MPI
#include <mpi.h>
#endif

int sm_dist_launched_size(void) {
    const char *v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v) v = getenv("PMI_SIZE");
    return v ? atoi(v) : 0;
}

uint64_t sm_params_hash(const sm_params *ps) {
    const unsigned char *b = (const unsigned char *)ps->data;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < ps->total * sizeof(sm_real); i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static sm_status train_sum(double *x, int n, void *user, sm_error *err) { return sm_dist_sum(user, x, n, err); }
static sm_status train_check(const sm_params *ps, long step, void *user, sm_error *err) {
    return sm_dist_check_same(user, ps, step, err);
}
static sm_status train_hook(sm_params *ps, void *user, sm_error *err) { return sm_dist_grad_mean(user, ps, err); }

void sm_dist_train_bind(sm_dist *d, sm_train_dist *td, sm_step_hook *hook) {
    memset(td, 0, sizeof *td);
    td->rank = d->rank;
    td->size = d->size;
    td->sum = train_sum;
    td->check_same = train_check;
    td->user = d;
    td->fault_rank = -1;
    hook->fn = train_hook;
    hook->user = d;
}

#ifdef SPECMOE_MPI

int sm_dist_built(void) { return 1; }

/* MPI's message for code rc as an SM_ERR_IO naming what failed */
static sm_status mpi_fail(sm_error *err, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return sm_fail(err, SM_ERR_IO, "%s: %s", what, msg);
}

sm_status sm_dist_init(sm_dist *d, int *argc, char ***argv, sm_error *err) {
    memset(d, 0, sizeof *d);
    d->size = 1;
    if (sm_dist_launched_size() == 0) return SM_OK; /* a plain start: one process, MPI untouched */
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        /* FUNNELED: only the main thread calls MPI; OpenMP threads work between the calls */
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return sm_fail(err, SM_ERR_IO, "MPI_Init_thread failed (code %d)", rc);
        d->active = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    return SM_OK;
}

void sm_dist_finalize(sm_dist *d) {
    if (d->active) MPI_Finalize();
    d->active = 0;
}

sm_status sm_dist_sum(sm_dist *d, double *x, int n, sm_error *err) {
    if (d->size < 2) return SM_OK;
    int rc = MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    d->bytes_allreduce += (double)n * sizeof(double);
    return rc == MPI_SUCCESS ? SM_OK : mpi_fail(err, rc, "allreduce of statistics");
}

sm_status sm_dist_max(sm_dist *d, double *x, int n, sm_error *err) {
    if (d->size < 2) return SM_OK;
    int rc = MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? SM_OK : mpi_fail(err, rc, "allreduce (max)");
}

sm_status sm_dist_bcast(sm_dist *d, void *buf, size_t n, int root, sm_error *err) {
    if (d->size < 2) return SM_OK;
    if (n > INT_MAX) return sm_fail(err, SM_ERR_ARG, "broadcast of %zu bytes: more than MPI's int count", n);
    int rc = MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? SM_OK : mpi_fail(err, rc, "broadcast");
}

sm_status sm_dist_grad_mean(sm_dist *d, sm_params *ps, sm_error *err) {
    if (d->size < 2) return SM_OK;
    const MPI_Datatype type = sizeof(sm_real) == sizeof(double) ? MPI_DOUBLE : MPI_FLOAT;
    /* one allreduce over the whole block; only a block beyond MPI's int count is cut in pieces */
    for (size_t at = 0; at < ps->total;) {
        size_t n = ps->total - at < (size_t)INT_MAX ? ps->total - at : (size_t)INT_MAX;
        int rc = MPI_Allreduce(MPI_IN_PLACE, ps->grad + at, (int)n, type, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "allreduce of the gradients");
        at += n;
    }
    d->bytes_allreduce += (double)ps->total * sizeof(sm_real);
    /* the mean over ranks; exact when size is a power of two */
    const sm_real inv = (sm_real)(1.0 / d->size);
    for (size_t i = 0; i < ps->total; i++) ps->grad[i] *= inv;
    return SM_OK;
}

sm_status sm_dist_check_same(sm_dist *d, const sm_params *ps, long step, sm_error *err) {
    if (d->size < 2) return SM_OK;
    uint64_t h = sm_params_hash(ps);
    uint64_t *all = malloc(sizeof(uint64_t) * (size_t)d->size);
    if (!all) return sm_fail(err, SM_ERR_NOMEM, "parameter check: out of memory");
    int rc = MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_fail(err, rc, "allgather of parameter hashes");
    }
    int differs = -1;
    for (int r = 1; r < d->size && differs < 0; r++)
        if (all[r] != all[0]) differs = r;
    sm_status st = SM_OK;
    if (differs >= 0)
        st = sm_fail(err, SM_ERR_NUMERIC, "step %ld: rank %d: parameters differ from rank 0's (hash %016llx vs %016llx)",
                     step, differs, (unsigned long long)all[differs], (unsigned long long)all[0]);
    free(all);
    return st;
}

#else /* built without MPI: one process */

int sm_dist_built(void) { return 0; }

sm_status sm_dist_init(sm_dist *d, int *argc, char ***argv, sm_error *err) {
    (void)argc;
    (void)argv;
    memset(d, 0, sizeof *d);
    d->size = 1;
    int n = sm_dist_launched_size();
    if (n > 1)
        return sm_fail(err, SM_ERR_ARG,
                       "started by mpirun with %d ranks, but specmoe was built without MPI: install libopenmpi-dev "
                       "(scripts/setup.sh) and rebuild with make MPI=1",
                       n);
    return SM_OK;
}

void sm_dist_finalize(sm_dist *d) { d->active = 0; }

sm_status sm_dist_sum(sm_dist *d, double *x, int n, sm_error *err) {
    (void)d, (void)x, (void)n, (void)err;
    return SM_OK;
}
sm_status sm_dist_max(sm_dist *d, double *x, int n, sm_error *err) {
    (void)d, (void)x, (void)n, (void)err;
    return SM_OK;
}
sm_status sm_dist_bcast(sm_dist *d, void *buf, size_t n, int root, sm_error *err) {
    (void)d, (void)buf, (void)n, (void)root, (void)err;
    return SM_OK;
}
sm_status sm_dist_grad_mean(sm_dist *d, sm_params *ps, sm_error *err) {
    (void)d, (void)ps, (void)err;
    return SM_OK;
}
sm_status sm_dist_check_same(sm_dist *d, const sm_params *ps, long step, sm_error *err) {
    (void)d, (void)ps, (void)step, (void)err;
    return SM_OK;
}

#endif
