/* The Stiefel manifold St(r, d) = { U in R^(d x r) : U^T U = I_r }, r <= d: Haar sampling, tangent
 * projection and the QR retraction used by the Riemannian optimisers (GrMoE frames, geoopt's
 * EuclideanStiefel).
 *
 *     sm_real R[8 * 32], work[SM_STIEFEL_WORK(8)];   // one frame, r = 8, d = 32
 *     sm_stiefel_haar(R, 8, 32, &rng, &err);          // R R^T = I_8
 *     sm_stiefel_project(G, R, 8, 32, work);          // G is now a tangent vector at R
 *     for (j...) R[j] -= lr * G[j];                   // leave the manifold ...
 *     sm_stiefel_retract_qr(R, 8, 32, work, &err);    // ... and come back to it
 *
 * Layout. A frame is stored as R (r, d) row-major with U = R^T, so the ROWS of R are orthonormal
 * (R R^T = I_r). Read column-major with leading dimension d, the same memory is U (d, r), which is
 * what LAPACK's QR wants, so the retraction runs in place with no transposition. A parameter tensor
 * flagged SM_PARAM_STIEFEL has shape (E, r, d) (E frames, one per expert) or (r, d) (one frame).
 *
 * Letters: r frame rank (rows of R), d ambient dimension, E frames per tensor.
 */
#ifndef SPECMOE_STIEFEL_H
#define SPECMOE_STIEFEL_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LAPACK workspace (in sm_real values) the QR retraction passes to geqrf/orgqr per column: enough for
 * the blocked algorithms' usual block size, so the factorisation runs at full speed. */
#define SM_STIEFEL_QR_NB 32
/* Scratch (in sm_real values) that sm_stiefel_project and sm_stiefel_retract_qr need for an (r, d)
 * frame: r*r for the symmetric part in the projection; tau (r), the diagonal signs (r) and the LAPACK
 * workspace (SM_STIEFEL_QR_NB * r) in the retraction. Independent of d. */
#define SM_STIEFEL_WORK(r) ((size_t)(r) * (size_t)(r) + (size_t)(r) * (2 + SM_STIEFEL_QR_NB))

/* R (r, d) <- a Haar-distributed frame: Q of the thin QR of a d x r standard Gaussian matrix, with
 * column j of Q multiplied by sign(R_jj) so the distribution is exactly Haar (Mezzadri 2007; without
 * the fix the column signs are biased by LAPACK's conventions). Draws r*d normals from rng.
 * Fails with SM_ERR_ARG unless 1 <= r <= d, SM_ERR_NOMEM if the small scratch cannot be allocated. */
sm_status sm_stiefel_haar(sm_real *R, int r, int d, sm_rng *rng, sm_error *err);

/* R (r, d) <- the sign-fixed Q factor of the thin QR of R^T (d x r): the QR retraction
 * retr_X(xi) = qf(X + xi) when called on X + xi. Q is unique (Q = the Gram-Schmidt orthonormalisation
 * of the rows of R, in order) whenever R has full row rank. work holds SM_STIEFEL_WORK(r) values.
 * Fails, leaving R unchanged, with SM_ERR_ARG unless 1 <= r <= d, with SM_ERR_NUMERIC if R holds a
 * NaN/Inf or LAPACK reports an error. */
sm_status sm_stiefel_retract_qr(sm_real *R, int r, int d, sm_real *work, sm_error *err);

/* Fallback retraction without LAPACK: orthonormalises the rows of R (r, d) in place by modified
 * Gram-Schmidt, run twice ("twice is enough", Giraud et al. 2005) for orthogonality to working
 * precision. Returns the same Q as sm_stiefel_retract_qr for a full-rank R. A row that is (numerically)
 * in the span of the previous rows is replaced by the first standard basis vector orthogonal to them,
 * so the result is always a frame. Returns 0, or -1 if R holds a NaN/Inf (then R is left unchanged). */
int sm_stiefel_orthonormalize_gs(sm_real *R, int r, int d);

/* Tangent projection at R of a Euclidean gradient G (r, d), in place:
 *     G <- G - sym(R G^T) R,   sym(A) = (A + A^T) / 2,
 * which is u - U sym(U^T u) (U = R^T, u = G^T) written for the row layout; afterwards
 * R G^T + G R^T = 0. work holds r*r values (SM_STIEFEL_WORK(r) is enough). R must be a frame. */
void sm_stiefel_project(sm_real *G, const sm_real *R, int r, int d, sm_real *work);

/* max_ij |(R R^T - I)_ij|, accumulated in double so it measures R, not this function's rounding. */
double sm_stiefel_orth_error(const sm_real *R, int r, int d);

/* Frame shape of a Stiefel tensor: (E, r, d) or (r, d) (E = 1). Returns 0 and fills E, r, d, or -1 if
 * the rank is not 2 or 3 or r > d. */
int sm_stiefel_shape(int ndim, const int64_t *shape, int *E, int *r, int *d);

#ifdef __cplusplus
}
#endif
#endif
