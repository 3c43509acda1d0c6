# LAPACK/BLAS on gpc's C-ordered lower-triangular matrices, with the GIL released.
#
# scipy's Python-level wrappers hold the GIL for the whole call, so threads (one-vs-rest problems
# under n_jobs, several estimators in one process) could not overlap their O(n^3) work.  These
# entry points call scipy's cython_lapack / cython_blas inside `nogil`.
#
# Layout: an n x n C-ordered array is its transpose in Fortran order, so the lower triangle we hold
# is LAPACK's 'U' triangle (lda = n).  A factor L (A = L L^T) is therefore LAPACK's U = L^T.
# Right-hand sides are given as rows: a C-ordered (k, n) array is a Fortran (n, k) matrix of k
# columns.  Shapes are checked here; nothing past these checks trusts the caller.

from scipy.linalg.cython_blas cimport dgemv, dsyrk, dtrmm, dtrsm, dtrsv, strmm, strsm, strsv
from scipy.linalg.cython_lapack cimport dlauum, dpotrf, dpotri, dtrtri, spotrf, strtri

ctypedef fused real:
    float
    double


cdef int _check_square(Py_ssize_t rows, Py_ssize_t cols, str name) except -1:
    if rows != cols or rows < 1:
        raise ValueError(f"{name} must be a non-empty square matrix, got {rows} x {cols}")
    return 0


cdef void _zero_upper(real* a, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, j
    for i in range(n):
        for j in range(i + 1, n):
            a[i * n + j] = 0


def cholesky_in_place(real[:, ::1] A):
    """A (lower triangle) := L with A = L L^T; strict upper triangle zeroed.  Returns LAPACK's info
    (0 on success, k > 0 when the leading minor of order k is not positive definite)."""
    _check_square(A.shape[0], A.shape[1], "A")
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
    _check_square(L.shape[0], L.shape[1], "L")
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
    _check_square(L.shape[0], L.shape[1], "L")
    cdef int n = <int> L.shape[0], info = 0
    cdef char uplo = b'U'
    with nogil:
        dpotri(&uplo, &n, &L[0, 0], &n, &info)
    return info


def inverse_factor_gram_in_place(double[:, ::1] T):
    """T (lower triangular) := the lower triangle of T^T T (dlauum).

    With T = L^-1 for B = L L^T this is B^-1: the second half of dpotri, whose first half (the
    triangular inverse) the caller already holds.  Returns LAPACK's info."""
    _check_square(T.shape[0], T.shape[1], "T")
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
    _check_square(T.shape[0], T.shape[1], name)
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
    _check_square(C.shape[0], C.shape[1], "C")
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
        _check_square(C.shape[0], C.shape[1], "C")
        return
    _row_gram(B, C, -1.0, 1.0)


def row_gram_lower(const double[:, ::1] B, double[:, ::1] C):
    """C (k x k, lower triangle) := B B^T for B (k x n), C's other entries untouched (dsyrk with
    beta = 0: C need not be initialised, unlike scipy's wrapper, which zero-fills a new array)."""
    if B.shape[1] == 0:
        _check_square(C.shape[0], C.shape[1], "C")
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
    _check_square(L.shape[0], L.shape[1], "L")
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
