# Dense helpers for the site posterior (R&W §3.6): B = I + S K S written in place into a reusable
# buffer, and diag B^-1 from the inverse of its Cholesky factor.  One pass each, GIL released, over
# the rows (or columns) [start, stop) given, so that gpc._parallel.over_rows can share a pass out
# among threads; LAPACK itself is called through gpc._lapack on these buffers (no copies).
#
# Matrices are C-ordered and only their lower triangle is meaningful; Fortran LAPACK sees the
# transpose, so uplo='U' there addresses this lower triangle.

from gpc._blas cimport range_stop, mirror_lower_rows

ctypedef fused real:
    float
    double


def fill_b(const double[:, ::1] K, const double[::1] s, real[:, ::1] out, *,
           Py_ssize_t start=0, Py_ssize_t stop=-1):
    """out's lower triangle := that of I + diag(s) K diag(s); the strict upper triangle is not written.

    ``out`` may be float64 or float32 (the single-precision factor of the early parallel sweeps);
    the products are formed in double precision and rounded once.  Cholesky reads the lower
    triangle only, and gpc._lapack.cholesky_in_place zeroes the strict upper one of the factor it
    leaves, so writing zeros here as well would be a second pass over half of ``out``.

    Rows start..stop-1 only (stop < 0: to the end).
    """
    cdef Py_ssize_t n = K.shape[0], i, j
    cdef double si
    if K.shape[1] != n or s.shape[0] != n or out.shape[0] != n or out.shape[1] != n:
        raise ValueError("fill_b: K must be n x n, s of length n and out n x n")
    stop = range_stop(start, stop, n)
    with nogil:
        for i in range(start, stop):
            si = s[i]
            for j in range(i):
                out[i, j] = <real> (si * K[i, j] * s[j])
            out[i, i] = <real> (1.0 + si * K[i, i] * si)


def column_sq_sums_lower(const real[:, ::1] T, double[::1] out, *, Py_ssize_t start=0,
                         Py_ssize_t stop=-1):
    """out[j] := sum_{i >= j} T[i, j]^2 for a lower-triangular T (accumulated in double, i
    ascending), for the columns j = start..stop-1 (stop < 0: to the end).

    With T = L^-1 and B = L L^T this is diag B^-1 = diag(L^-T L^-1).
    """
    cdef Py_ssize_t n = T.shape[0], i, j
    cdef double t
    if T.shape[1] != n or out.shape[0] != n:
        raise ValueError("column_sq_sums_lower: T must be n x n and out of length n")
    stop = range_stop(start, stop, n)
    with nogil:
        for j in range(start, stop):
            out[j] = 0.0
        for i in range(start, n):
            for j in range(start, min(i + 1, stop)):
                t = T[i, j]
                out[j] += t * t


def gaussian_site_gradient_matrix(double[:, ::1] B_inv, const double[::1] s, const double[::1] a,
                                  const double[::1] u, const double[::1] g, bint mirror=True, *,
                                  Py_ssize_t start=0, Py_ssize_t stop=-1):
    """B_inv (lower triangle: B^-1) := M = 1/2 (a a^T - S B^-1 S + u g^T + g u^T), full and symmetric
    (``mirror=False``: its lower triangle only, for a contraction that reads no more).

    The matrix of the evidence gradient of a Gaussian-site posterior (R&W Alg. 5.1 / 5.2,
    dlog Z/dtheta_k = sum_ij M_ij dK_ij/dtheta_k) in one pass over rows start..stop-1 (stop < 0:
    to the end; the mirror writes those rows' columns of the upper triangle); u = g = 0 gives EP's
    1/2 (a a^T - R), R = S B^-1 S.
    """
    cdef Py_ssize_t n = B_inv.shape[0], i, j
    if B_inv.shape[1] != n or s.shape[0] != n or a.shape[0] != n or u.shape[0] != n \
            or g.shape[0] != n:
        raise ValueError("gaussian_site_gradient_matrix: B_inv must be n x n, vectors of length n")
    stop = range_stop(start, stop, n)
    with nogil:
        for i in range(start, stop):
            for j in range(i + 1):
                B_inv[i, j] = 0.5 * (a[i] * a[j] - s[i] * B_inv[i, j] * s[j] + u[i] * g[j] + g[i] * u[j])
        if mirror:
            mirror_lower_rows(B_inv, start, stop)
