# The Python entry points of gpc's compiled linear algebra: LAPACK/BLAS on C-ordered
# lower-triangular matrices and on blocks of rows, with the GIL released, over the kernels of
# gpc/_blas.pxd (which the other compiled modules cimport directly).
#
# scipy's Python-level wrappers hold the GIL for the whole call, so threads (one-vs-rest problems
# under n_jobs, several estimators in one process, the sparse engine's row blocks) could not overlap
# their work.  These entry points call scipy's cython_lapack / cython_blas inside `nogil`.
#
# Layout: an n x n C-ordered array is its transpose in Fortran order, so the lower triangle we hold
# is LAPACK's 'U' triangle (lda = n).  A factor L (A = L L^T) is therefore LAPACK's U = L^T.
# Right-hand sides are given as rows: a C-ordered (k, n) array is a Fortran (n, k) matrix of k
# columns.  Shapes are checked here; nothing past these checks trusts the caller.

from libc.string cimport memset

from gpc._blas cimport (check_columns, check_square, congruence_columns, dgemm, dgemv, dlauum,
                        dpotrf, dpotri, dsyrk, dtrmm, dtrsm, dtrsv, dtrtri, gemv_rows, lower_lower,
                        mirror_lower_rows, signed_gram, spotrf, strmm, strsm, strsv, strtri,
                        upper_inverse)

from functools import partial

import numpy as np

from gpc import _parallel

ctypedef fused real:
    float
    double


cdef void _zero_upper(real* a, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, j
    for i in range(n):
        for j in range(i + 1, n):
            a[i * n + j] = 0


def cholesky_in_place(real[:, ::1] A):
    """A (lower triangle) := L with A = L L^T; strict upper triangle zeroed.  Returns LAPACK's info
    (0 on success, k > 0 when the leading minor of order k is not positive definite)."""
    check_square(A.shape[0], A.shape[1], "A")
    cdef int n = <int> A.shape[0], info = 0
    cdef char uplo = b'U'
    with nogil:
        if real is double:
            dpotrf(&uplo, &n, &A[0, 0], &n, &info)
        else:
            spotrf(&uplo, &n, &A[0, 0], &n, &info)
        if info == 0:
            _zero_upper(&A[0, 0], n)
    return info


def triangular_inverse_in_place(real[:, ::1] L):
    """L (lower triangular, non-unit) := L^-1.  Returns LAPACK's info."""
    check_square(L.shape[0], L.shape[1], "L")
    cdef int n = <int> L.shape[0], info = 0
    cdef char uplo = b'U', diag = b'N'
    with nogil:
        if real is double:
            dtrtri(&uplo, &diag, &n, &L[0, 0], &n, &info)
        else:
            strtri(&uplo, &diag, &n, &L[0, 0], &n, &info)
    return info


def cholesky_inverse_in_place(double[:, ::1] L):
    """L (a lower Cholesky factor of B) := the lower triangle of B^-1 (dpotri).  Returns info."""
    check_square(L.shape[0], L.shape[1], "L")
    cdef int n = <int> L.shape[0], info = 0
    cdef char uplo = b'U'
    with nogil:
        dpotri(&uplo, &n, &L[0, 0], &n, &info)
    return info


def inverse_factor_gram_in_place(double[:, ::1] T):
    """T (lower triangular) := the lower triangle of T^T T (dlauum).

    With T = L^-1 for B = L L^T this is B^-1: the second half of dpotri, whose first half (the
    triangular inverse) the caller already holds.  Returns LAPACK's info."""
    check_square(T.shape[0], T.shape[1], "T")
    cdef int n = <int> T.shape[0], info = 0
    cdef char uplo = b'U'            # Fortran sees U = T^T and forms U U^T = T^T T
    with nogil:
        dlauum(&uplo, &n, &T[0, 0], &n, &info)
    return info


def multiply_triangular_rows(const real[:, ::1] T, real[:, ::1] B, bint transpose):
    """Each row b of B (k x n) := T b, or T^T b with ``transpose`` (T lower, n x n; ?trmm)."""
    _triangular_rows(T, B, transpose, False, "T", "rows", "triangle")


def solve_triangular_rows(const real[:, ::1] L, real[:, ::1] B, bint transpose):
    """Each row b of B (k x n) := L^-1 b, or L^-T b with ``transpose`` (L lower, n x n; ?trsm)."""
    _triangular_rows(L, B, transpose, True, "L", "right-hand sides", "factor")


cdef _triangular_rows(const real[:, ::1] T, real[:, ::1] B, bint transpose, bint solve,
                      str name, str rows, str what):
    """The rows b of B (k x n) := T b / T^T b (?trmm), or T^-1 b / T^-T b with ``solve`` (?trsm),
    for lower-triangular T; ``name``, ``rows`` and ``what`` name T, B's rows and T's role in the
    shape errors."""
    check_square(T.shape[0], T.shape[1], name)
    if B.shape[1] != T.shape[0]:
        raise ValueError(f"{rows} have length {B.shape[1]}, the {what} is {T.shape[0]} x "
                         f"{T.shape[0]}")
    if B.shape[0] == 0:
        return
    cdef int n = <int> T.shape[0], k = <int> B.shape[0]
    # Fortran sees U = T^T: T b is U^T b ('T'), T^T b is U b ('N'); the same for the solves
    cdef char side = b'L', uplo = b'U', diag = b'N'
    cdef char trans = b'N' if transpose else b'T'
    cdef real one = 1
    with nogil:
        if real is double:
            if solve:
                dtrsm(&side, &uplo, &trans, &diag, &n, &k, &one, <double*> &T[0, 0], &n, &B[0, 0], &n)
            else:
                dtrmm(&side, &uplo, &trans, &diag, &n, &k, &one, <double*> &T[0, 0], &n, &B[0, 0], &n)
        else:
            if solve:
                strsm(&side, &uplo, &trans, &diag, &n, &k, &one, <float*> &T[0, 0], &n, &B[0, 0], &n)
            else:
                strmm(&side, &uplo, &trans, &diag, &n, &k, &one, <float*> &T[0, 0], &n, &B[0, 0], &n)


cdef int _row_gram(const double[:, ::1] B, double[:, ::1] C, double alpha, double beta) except -1:
    # C (k x k, lower triangle) := alpha B B^T + beta C for B (k x n): <row a, row b> (dsyrk)
    check_square(C.shape[0], C.shape[1], "C")
    if B.shape[0] != C.shape[0]:
        raise ValueError(f"B has {B.shape[0]} rows, C is {C.shape[0]} x {C.shape[0]}")
    cdef int k = <int> B.shape[0], n = <int> B.shape[1]
    # Fortran sees W = B^T (n x k, lda n) and C's lower triangle as 'U': C := alpha W^T W + beta C
    cdef char uplo = b'U', trans = b'T'
    with nogil:
        dsyrk(&uplo, &trans, &k, &n, &alpha, <double*> &B[0, 0], &n, &beta, &C[0, 0], &k)
    return 0


def subtract_row_gram_lower(const double[:, ::1] B, double[:, ::1] C):
    """C (k x k, lower triangle) -= B B^T for B (k x n): C_ab -= <row a, row b> (dsyrk)."""
    if B.shape[1] == 0:
        check_square(C.shape[0], C.shape[1], "C")
        return
    _row_gram(B, C, -1.0, 1.0)


def row_gram_lower(const double[:, ::1] B, double[:, ::1] C):
    """C (k x k, lower triangle) := B B^T for B (k x n), C's other entries untouched (dsyrk with
    beta = 0: C need not be initialised, unlike scipy's wrapper, which zero-fills a new array)."""
    if B.shape[1] == 0:
        check_square(C.shape[0], C.shape[1], "C")
        for a in range(C.shape[0]):
            for b in range(a + 1):
                C[a, b] = 0.0
        return
    _row_gram(B, C, 1.0, 0.0)


def matvec(const double[:, ::1] A, const double[::1] x, double[::1] out):
    """out := A x for a C-ordered (m, n) A (dgemv).

    The same BLAS as the factorisations (scipy's), not NumPy's: two BLAS libraries that take turns in
    one loop each keep their worker threads spinning on the cores the other one needs."""
    if x.shape[0] != A.shape[1] or out.shape[0] != A.shape[0]:
        raise ValueError(f"matvec: A is {A.shape[0]} x {A.shape[1]}, x has length {x.shape[0]} and "
                         f"out {out.shape[0]}")
    if A.shape[0] == 0:
        return
    if A.shape[1] == 0:
        out[:] = 0
        return
    cdef int m = <int> A.shape[0], n = <int> A.shape[1], inc = 1
    # Fortran sees A^T (n x m, lda n): A x = (A^T)^T x
    cdef char trans = b'T'
    cdef double one = 1.0, zero = 0.0
    with nogil:
        dgemv(&trans, &n, &m, &one, <double*> &A[0, 0], &n, <double*> &x[0], &inc, &zero, &out[0], &inc)


def cholesky_solve_in_place(const real[:, ::1] L, real[::1] b):
    """b := (L L^T)^-1 b for a lower Cholesky factor L (two ?trsv)."""
    check_square(L.shape[0], L.shape[1], "L")
    if b.shape[0] != L.shape[0]:
        raise ValueError(f"b has length {b.shape[0]}, the factor is {L.shape[0]} x {L.shape[0]}")
    cdef int n = <int> L.shape[0], inc = 1
    # Fortran sees U = L^T: L z = b is U^T z = b ('T'), then L^T x = z is U x = z ('N')
    cdef char uplo = b'U', diag = b'N', t = b'T', nt = b'N'
    with nogil:
        if real is double:
            dtrsv(&uplo, &t, &diag, &n, <double*> &L[0, 0], &n, &b[0], &inc)
            dtrsv(&uplo, &nt, &diag, &n, <double*> &L[0, 0], &n, &b[0], &inc)
        else:
            strsv(&uplo, &t, &diag, &n, <float*> &L[0, 0], &n, &b[0], &inc)
            strsv(&uplo, &nt, &diag, &n, <float*> &L[0, 0], &n, &b[0], &inc)


def mirror_lower(A, Py_ssize_t block=64):
    """A's strict upper triangle := its strict lower triangle's transpose, in place, in ``block`` x
    ``block`` tiles (A square, C-ordered float64).  Returns A."""
    cdef double[:, ::1] view = A
    check_square(view.shape[0], view.shape[1], "A")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    with nogil:
        mirror_lower_rows(view, 0, view.shape[0], 1.0, block)
    return A


def lower_inverse_in_place(double[:, ::1] L):
    """L (lower triangular, m x m, non-singular) := L^-1; the strict upper triangle is not read
    and stays as it was.  Returns LAPACK's info (k > 0: the k-th diagonal entry is zero)."""
    check_square(L.shape[0], L.shape[1], "L")
    cdef int m = <int> L.shape[0], info
    # Fortran sees U = L^T; (L^-1)^T = U^-1
    with nogil:
        info = upper_inverse(&L[0, 0], m, m)
    return info


def lower_gram(const double[:, ::1] L, double[:, ::1] out):
    """out (m x m, both triangles) := L^T L for lower-triangular L (dlauum, m^3/6 multiply-adds):
    Σ = R^-T R^-1 from R^-1.  Returns LAPACK's info."""
    check_square(L.shape[0], L.shape[1], "L")
    check_square(out.shape[0], out.shape[1], "out")
    if out.shape[0] != L.shape[0]:
        raise ValueError(f"out is {out.shape[0]} x {out.shape[0]}, L {L.shape[0]} x {L.shape[0]}")
    cdef int m = <int> L.shape[0], info = 0
    cdef Py_ssize_t i, j
    cdef char uplo = b'U'
    with nogil:
        for i in range(m):
            for j in range(i + 1):
                out[i, j] = L[i, j]
        # Fortran sees U = L^T in 'U' and returns U U^T = L^T L there, our lower triangle
        dlauum(&uplo, &m, &out[0, 0], &m, &info)
        for i in range(m):
            for j in range(i):
                out[j, i] = out[i, j]
    return info


def lower_lower_times(const double[:, ::1] L, double[:, ::1] B):
    """B (m x m) := L B for lower-triangular L and B (B's strict upper triangle is not read: it is
    zeroed): M = L_old^-1 L_new in place, m³/6 multiply-adds (one dtrmm that treats L_new as
    full takes m³/2)."""
    check_square(L.shape[0], L.shape[1], "L")
    check_square(B.shape[0], B.shape[1], "B")
    check_columns(B.shape[1], L.shape[0], "B")
    cdef int m = <int> L.shape[0], i
    cdef double[::1] work = np.empty((m // 2 + 1) ** 2)
    with nogil:
        for i in range(m - 1):
            memset(&B[i, i + 1], 0, <size_t> (m - 1 - i) * sizeof(double))
        lower_lower(&L[0, 0], &B[0, 0], m, m, &work[0])


def congruence_panel(const double[:, ::1] M, const double[:, ::1] S, double[:, ::1] X,
                     Py_ssize_t start, Py_ssize_t stop):
    """One column panel of :func:`congruence`: X[start:, start:stop] := (M^T S M)[start:,
    start:stop] and X[start:stop, start:] its transpose, for lower-triangular M (its lower
    triangle is read) and symmetric S (S[start:, start:] is read, both triangles)."""
    check_square(M.shape[0], M.shape[1], "M")
    check_square(S.shape[0], S.shape[1], "S")
    check_columns(S.shape[1], M.shape[0], "S")
    check_square(X.shape[0], X.shape[1], "X")
    check_columns(X.shape[1], M.shape[0], "X")
    cdef int m = <int> M.shape[0]
    if not (0 <= start <= stop <= m):
        raise ValueError(f"columns {start}:{stop} are not inside 0:{m}")
    if &X[0, 0] == &S[0, 0]:
        raise ValueError("X must not be S")
    with nogil:
        congruence_columns(&M[0, 0], &S[0, 0], &X[0, 0], m, <int> start, <int> stop)


def congruence(const double[:, ::1] M, double[:, ::1] S, double[:, ::1] out=None):
    """out (m x m) := M^T S M for lower-triangular M (its strict upper triangle is not read) and
    symmetric S (both triangles are read); without ``out``, S := M^T S M.  The result is exactly
    symmetric: its lower triangle and that triangle's mirror image.  Returns the result.

    By fixed column panels (gpc._parallel.column_panels, fixed by m: :func:`congruence_panel`,
    about m^3/2 multiply-adds in all where two triangular multiplies take m^3), run by
    gpc._parallel.over_blocks on the threads of the caller's gpc._parallel.block_threads
    context; each panel writes its own columns and their mirror image, so the bits do not depend
    on the threads.
    """
    check_square(M.shape[0], M.shape[1], "M")
    check_square(S.shape[0], S.shape[1], "S")
    check_columns(S.shape[1], M.shape[0], "S")
    cdef Py_ssize_t m = M.shape[0]
    if out is not None:
        check_square(out.shape[0], out.shape[1], "out")
        check_columns(out.shape[1], m, "out")
    X = np.empty((m, m)) if out is None else np.asarray(out)
    panels = _parallel.column_panels(m, m * m * m / 2.0)
    _parallel.over_blocks(partial(_panel_of, M, S, X, panels), len(panels))
    if out is None:
        np.copyto(np.asarray(S), X)
        return np.asarray(S)
    return X


def _panel_of(M, S, X, panels, j):
    return congruence_panel(M, S, X, *panels[j])


def transpose_times(const double[:, ::1] A, const double[:, ::1] G, double[:, ::1] out):
    """out (m x m) := A^T G for A, G (k x m) (dgemm)."""
    if A.shape[0] != G.shape[0] or A.shape[1] != G.shape[1]:
        raise ValueError(f"A is {A.shape[0]} x {A.shape[1]}, G is {G.shape[0]} x {G.shape[1]}")
    check_square(out.shape[0], out.shape[1], "out")
    check_columns(out.shape[1], A.shape[1], "out")
    cdef int m = <int> A.shape[1], k = <int> A.shape[0]
    cdef char notrans = b'N', trans = b'T'
    cdef double one = 1.0, zero = 0.0
    if k == 0:
        out[:, :] = 0.0
        return
    # Fortran: out^T = G^T A, with G^T, A^T held as (m x k): out^T := G_F A_F^T
    with nogil:
        dgemm(&notrans, &trans, &m, &m, &k, &one, <double*> &G[0, 0], &m, <double*> &A[0, 0], &m,
              &zero, &out[0, 0], &m)


def add_weighted_gram(double[:, ::1] P, const double[:, ::1] A, const double[::1] w,
                      double[:, ::1] work):
    """P (m x m, lower triangle) += A^T diag(w) A for A (k x m) and weights w of either sign
    (two dsyrk, gpc/_blas.pxd's signed_gram).  ``work`` (at least k x m) holds the scaled rows.
    Returns the number of rows used (those with w != 0)."""
    check_square(P.shape[0], P.shape[1], "P")
    check_columns(A.shape[1], P.shape[0], "A")
    if w.shape[0] != A.shape[0]:
        raise ValueError(f"w has {w.shape[0]} entries, A has {A.shape[0]} rows")
    if work.shape[0] < A.shape[0] or work.shape[1] != A.shape[1]:
        raise ValueError(f"work must be at least {A.shape[0]} x {A.shape[1]}, got "
                         f"{work.shape[0]} x {work.shape[1]}")
    cdef int m = <int> A.shape[1], k = <int> A.shape[0], used
    if k == 0:
        return 0
    with nogil:
        used = signed_gram(&P[0, 0], &A[0, 0], &w[0], &work[0, 0], k, m)
    return used


cdef int _check_gemv(const double[:, ::1] A, Py_ssize_t x_len, Py_ssize_t out_len,
                     bint transpose) except -1:
    if (A.shape[0] if transpose else A.shape[1]) != x_len or \
            out_len != (A.shape[1] if transpose else A.shape[0]):
        raise ValueError(f"A is {A.shape[0]} x {A.shape[1]}, {'v' if transpose else 'x'} has "
                         f"{x_len} entries, out {out_len}")
    return 0


def rows_dot(const double[:, ::1] A, const double[::1] x, double[::1] out):
    """out (k,) := A x for A (k x m) (dgemv)."""
    _check_gemv(A, x.shape[0], out.shape[0], False)
    if A.shape[0] > 0:
        with nogil:
            gemv_rows(&A[0, 0], &x[0], &out[0], <int> A.shape[0], <int> A.shape[1], False, 0.0)


def add_transpose_dot(const double[:, ::1] A, const double[::1] v, double[::1] out):
    """out (m,) += A^T v for A (k x m) (dgemv)."""
    _check_gemv(A, v.shape[0], out.shape[0], True)
    if A.shape[0] > 0:
        with nogil:
            gemv_rows(&A[0, 0], &v[0], &out[0], <int> A.shape[0], <int> A.shape[1], True, 1.0)


def natural_factor(double[:, ::1] R, const double[::1] h, double[::1] diag, double[::1] work,
                   double[::1] mean):
    """A Gaussian's moments from its natural parameters (P, h) in one call: R (P on entry, m x m)
    := R⁻¹ with P = R Rᵀ (R lower, dpotrf; its strict upper triangle zeroed, then dtrtri), ``diag``
    := diag R (before the inverse: log|P| = 2 Σ log Rᵢᵢ) and ``mean`` := P⁻¹h = R⁻ᵀ(R⁻¹h) (two
    dgemv, ``work`` holding R⁻¹h).  The calls are those of cholesky_in_place,
    lower_inverse_in_place, rows_dot and add_transpose_dot in turn.  Returns dpotrf's info; when
    it is not 0 only R has been written."""
    check_square(R.shape[0], R.shape[1], "R")
    cdef Py_ssize_t i, m = R.shape[0]
    if h.shape[0] != m or diag.shape[0] != m or work.shape[0] != m or mean.shape[0] != m:
        raise ValueError(f"h, diag, work and mean must have {m} entries")
    cdef int n = <int> m, info = 0
    cdef char uplo = b'U'
    if m == 0:
        return 0
    with nogil:
        dpotrf(&uplo, &n, &R[0, 0], &n, &info)
        if info == 0:
            _zero_upper(&R[0, 0], n)
            for i in range(m):
                diag[i] = R[i, i]
            upper_inverse(&R[0, 0], n, n)       # L has a positive diagonal: never singular
            gemv_rows(&R[0, 0], &h[0], &work[0], n, n, False, 0.0)
            memset(&mean[0], 0, m * sizeof(double))
            gemv_rows(&R[0, 0], &work[0], &mean[0], n, n, True, 1.0)
    return info
