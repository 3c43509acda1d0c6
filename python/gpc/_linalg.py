"""Dense linear algebra the methods share: a jittered Cholesky, solves with its factor, and the
least-squares correction of Anderson acceleration.

The O(n³) calls go through gpc._lapack (scipy's cython_lapack with the GIL released, so that
threads overlap); O(n²) solves with a vector through scipy.linalg.lapack.  Matrices are C-ordered
and only their lower triangle is read: LAPACK's column-major view of it is the 'U' triangle of the
transpose, so no n x n matrix is copied to change its order.
"""

import numpy as np
from scipy.linalg import lapack

from . import _lapack
from ._lapack import mirror_lower
from .exceptions import NotPositiveDefiniteError

#: relative jitters tried, in turn, when a matrix that should be positive definite fails to factor
JITTERS = (0.0, 1e-10, 1e-8, 1e-6)


def cholesky_lower(A, name="matrix", overwrite=False, rebuild=None):
    """Lower Cholesky factor L (A = L Lᵀ) of a symmetric positive definite A.

    Only the lower triangle of A is read.  Tries the jitters of ``JITTERS`` (relative to the mean
    diagonal) in turn and raises :class:`NotPositiveDefiniteError` naming ``name`` when none works.
    Returns (L, jitter) with L C-contiguous and lower triangular (the strict upper triangle is
    zeroed).  With ``overwrite`` the first attempt factors A in place; a failed attempt leaves A
    half factored, so the jittered retries start from ``rebuild()`` (a fresh A), or there are none.
    """
    A = np.ascontiguousarray(A, dtype=np.float64)
    n = A.shape[0]
    scale = float(np.trace(A)) / max(n, 1)
    for jitter in JITTERS:
        if jitter == 0.0:
            work = A if overwrite else A.copy()
        else:
            if overwrite:
                if rebuild is None:
                    break
                A, overwrite = np.asarray(rebuild(), dtype=np.float64), False
            work = A.copy()
            work.flat[:: n + 1] += jitter * scale
        info = _lapack.cholesky_in_place(work)          # lower triangle; upper zeroed
        if info == 0:
            return work, jitter * scale
        if info < 0:  # pragma: no cover - argument error, a bug
            raise RuntimeError(f"dpotrf argument {-info} invalid")
    if overwrite:
        raise NotPositiveDefiniteError(f"{name} is not positive definite")
    raise NotPositiveDefiniteError(
        f"{name} is not positive definite even after adding {JITTERS[-1]:g} x mean diagonal jitter")


def cho_solve_lower(L, b):
    """Solve (L Lᵀ) x = b for a lower Cholesky factor L (C-contiguous)."""
    return cho_solve_upper_f(L.T, b)


def cho_solve_upper_f(U, b):
    """Solve (Uᵀ U) x = b for an upper factor U in Fortran order (float32 or float64).

    Two triangular solves (?trtrs), not ?potrs: scipy's ?potrs wrapper costs several times the two
    ?trtrs calls it consists of (it handles the factor differently; bench/RESULTS.md).
    """
    trtrs = lapack.strtrs if U.dtype == np.float32 else lapack.dtrtrs
    z, info = trtrs(U, b, lower=False, trans=1)
    if info == 0:
        z, info = trtrs(U, z, lower=False, trans=0, overwrite_b=True)
    if info != 0:  # pragma: no cover - a factor with a zero diagonal entry
        raise RuntimeError(f"triangular solve failed with info={info}")
    return z


def solve_lower(L, b, trans=False):
    """Solve L x = b (or Lᵀ x = b with ``trans``) for a lower triangular C-contiguous L."""
    # L in C order is Lᵀ (upper) in Fortran order.
    x, info = lapack.dtrtrs(L.T, b, lower=False, trans=0 if trans else 1)
    if info != 0:  # pragma: no cover
        raise RuntimeError(f"dtrtrs failed with info={info}")
    return x


def cho_inverse_lower(L):
    """(L Lᵀ)⁻¹ as a full symmetric C-contiguous matrix, from the lower factor (LAPACK dpotri)."""
    out = np.array(L, dtype=np.float64, order="C")
    info = _lapack.cholesky_inverse_in_place(out)
    if info != 0:  # pragma: no cover
        raise RuntimeError(f"dpotri failed with info={info}")
    return mirror_lower(out)


def log_det_from_cholesky(L):
    """log |L Lᵀ| = 2 Σ log L_ii."""
    return 2.0 * float(np.sum(np.log(np.diag(L))))


def anderson_correction(xs, fs, weights=None):
    """The correction of type-II Anderson acceleration (Walker & Ni, SIAM J. Numer. Anal. 49 (2011)).

    For a fixed-point iteration x ↦ g(x) with iterates ``xs`` and residuals ``fs`` (fⱼ = g(xⱼ) − xⱼ,
    oldest first, at least two), the accelerated next iterate is g(x) − (ΔX + ΔF) γ, with γ the
    least-squares fit of the last residual by the residual differences ΔF (its rows scaled by
    ``weights`` when given).  Returns (ΔX + ΔF) γ.
    """
    dX = np.diff(np.column_stack(xs), axis=1)
    dF = np.diff(np.column_stack(fs), axis=1)
    if weights is None:
        gamma = np.linalg.lstsq(dF, fs[-1], rcond=1e-10)[0]
    else:
        gamma = np.linalg.lstsq(weights[:, None] * dF, weights * fs[-1], rcond=1e-10)[0]
    return (dX + dF) @ gamma
