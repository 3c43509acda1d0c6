# The compiled linear-algebra layer: scipy's cython_blas / cython_lapack, re-exported for every
# module (`from gpc._blas cimport dsyrk, signed_gram, ...`), and the `cdef inline` kernels that more
# than one module needs.  No module state, so there is no gpc._blas module to import at run time;
# the Python entry points over these kernels are gpc._lapack's.
#
# Layout: a C-ordered (k, m) array is the Fortran (m, k) matrix of its transpose, so its rows are
# Fortran columns; a C-ordered lower-triangular (m, m) matrix L is the Fortran upper-triangular
# matrix U = L^T ('U', lda = m).  Every product below is written for the C-ordered meaning and
# translated in a comment.
#
# Precision: the kernels over a block of rows below take the rows as ``real``, float or double.
# The double ones are the plain BLAS calls; the float ones (the sparse models' opt-in mixed
# precision, gpc.sparse) run the b x m x m products in single precision (sgemm, ssyrk, strmm)
# and return what is summed over the rows (m x m products, vectors) in double: an m x m product
# is formed in a float scratch over the block's rows and added in double, a product with a
# vector is accumulated in double.

from libc.math cimport sqrt
from libc.string cimport memcpy, memset
from scipy.linalg.cython_blas cimport (dgemm, dgemv, dsymv, dsyr, dsyrk, dtrmm, dtrsm, dtrsv,
                                       sgemm, ssyrk, strmm, strsm, strsv)
from scipy.linalg.cython_lapack cimport dlauum, dpotrf, dpotri, dtrti2, dtrtri, spotrf, strtri


ctypedef fused real:
    float
    double


# -- entry checks --------------------------------------------------------------------------------

cdef inline int check_square(Py_ssize_t rows, Py_ssize_t cols, str name) except -1:
    if rows != cols or rows < 1:
        raise ValueError(f"{name} must be a non-empty square matrix, got {rows} x {cols}")
    return 0


cdef inline int check_columns(Py_ssize_t cols, Py_ssize_t m, str name) except -1:
    if cols != m:
        raise ValueError(f"{name} has {cols} columns, the triangular factor is {m} x {m}")
    return 0


cdef inline Py_ssize_t range_stop(Py_ssize_t start, Py_ssize_t stop, Py_ssize_t n) except -1:
    """``stop`` of a row range [start, stop) of n rows (stop < 0: n), checked."""
    if stop < 0:
        stop = n
    if start < 0 or start > stop or stop > n:
        raise ValueError(f"row range [{start}, {stop}) is not within [0, {n}]")
    return stop


# -- square matrices -----------------------------------------------------------------------------

cdef inline void mirror_lower_rows(double[:, ::1] A, Py_ssize_t start, Py_ssize_t stop,
                                   double factor=1.0, Py_ssize_t tile=64) noexcept nogil:
    """A[i, j] := factor * A[i, j] and A[j, i] := A[i, j] for j < i, start <= i < stop, in
    ``tile`` x ``tile`` tiles: the strict lower triangle's rows start..stop-1 scaled (factor 1
    leaves them exactly as they are) and mirrored into the strict upper triangle's columns
    start..stop-1, which no other row range writes or reads."""
    cdef Py_ssize_t i0 = start, j0, i, j, i1, j1
    cdef double v
    while i0 < stop:
        i1 = min(i0 + tile, stop)
        j0 = 0
        while j0 < i1 - 1:
            j1 = j0 + tile
            for i in range(i0, i1):
                for j in range(j0, min(j1, i)):
                    v = factor * A[i, j]
                    A[i, j] = v
                    A[j, i] = v
            j0 += tile
        i0 += tile


cdef inline int upper_inverse(double* U, int n, int lda) noexcept nogil:
    """U (Fortran upper triangular, n x n, leading dimension lda) := U^-1 in place, recursively:
    inv([[U11, U12], [0, U22]]) = [[U11^-1, -U11^-1 U12 U22^-1], [0, U22^-1]], the off-diagonal
    block by two dtrmm, the blocks of n <= 16 by LAPACK's unblocked dtrti2 (dtrtri's blocks of 64
    leave most of an m ~ 200 inverse to that kernel).  Returns LAPACK's info."""
    cdef int info = 0, h, r
    cdef char uplo = b'U', diag = b'N', left = b'L', right = b'R', notrans = b'N'
    cdef double one = 1.0, minus_one = -1.0
    if n <= 16:
        dtrti2(&uplo, &diag, &n, U, &lda, &info)
        return info
    h = n // 2
    r = n - h
    info = upper_inverse(U, h, lda)
    if info != 0:
        return info
    info = upper_inverse(U + h + <Py_ssize_t> h * lda, r, lda)
    if info != 0:
        return info + h
    # U12 (h x r, at column h) := U11^-1 U12, then := -U12 U22^-1
    dtrmm(&left, &uplo, &notrans, &diag, &h, &r, &one, U, &lda, U + <Py_ssize_t> h * lda, &lda)
    dtrmm(&right, &uplo, &notrans, &diag, &h, &r, &minus_one, U + h + <Py_ssize_t> h * lda, &lda,
          U + <Py_ssize_t> h * lda, &lda)
    return 0


cdef inline void lower_lower(const double* A, double* B, int n, int ld,
                             double* work) noexcept nogil:
    """B := A B for lower-triangular A and B (n x n blocks, C-ordered, leading dimension ld; B's
    strict upper triangle zero and left so), recursively: with h = n/2,
    [[A11, 0], [A21, A22]] [[B11, 0], [B21, B22]] = [[A11 B11, 0], [A21 B11 + A22 B21, A22 B22]],
    the off-diagonal block by two dtrmm of h x h x h/2 each: n³/6 multiply-adds in all, where
    one dtrmm of A with B treated as a full matrix takes n³/2.  ``work`` holds (n/2 + 1)² doubles."""
    cdef int h, r, i, j
    cdef char left = b'L', right = b'R', uplo = b'U', notrans = b'N', diag = b'N'
    cdef double one = 1.0
    if n <= 32:
        # Fortran: (A B)^T = B^T A^T: B^T := B^T U from the right
        dtrmm(&right, &uplo, &notrans, &diag, &n, &n, &one, <double*> A, &ld, B, &ld)
        return
    h = n // 2
    r = n - h
    # B21 (r x h) := A22 B21: Fortran B21^T := B21^T A22^T, from the right (h x r by r x r)
    dtrmm(&right, &uplo, &notrans, &diag, &h, &r, &one, <double*> (A + h * ld + h), &ld,
          B + h * ld, &ld)
    # work (r x h, leading dimension h) := A21 B11: Fortran work^T := B11^T A21^T, from the left
    for i in range(r):
        memcpy(work + i * h, A + (h + i) * ld, <size_t> h * sizeof(double))
    dtrmm(&left, &uplo, &notrans, &diag, &h, &r, &one, B, &ld, work, &h)
    for i in range(r):
        for j in range(h):
            B[(h + i) * ld + j] += work[i * h + j]
    lower_lower(A, B, h, ld, work)
    lower_lower(A + h * ld + h, B + h * ld + h, r, ld, work)


cdef inline void congruence_columns(const double* M, const double* S, double* X, int m, int start,
                                    int stop) noexcept nogil:
    """X[start:, start:stop] := (M^T S M)[start:, start:stop], and X[start:stop, start:] := its
    transpose, for lower-triangular M and S (m x m,
    C-ordered), reading M's lower triangle and S[start:, start:] only.  M's rows above ``start``
    are zero in these columns, so with r = m - start the panel is M22^T (S22 M[start:, start:stop]),
    M22 = M[start:, start:], S22 = S[start:, start:]: the product S22 M[start:, start:stop] as a
    triangular multiply by its diagonal block and a general product by the rows below it, then a
    triangular multiply by M22^T; 3/2 r^2 (stop - start) multiply-adds."""
    cdef int r = m - start, w = stop - start, below = m - stop, i, j
    cdef char left = b'L', right = b'R', uplo = b'U', trans = b'T', notrans = b'N', diag = b'N'
    cdef double one = 1.0
    cdef double* P = X + <Py_ssize_t> start * m + start               # the panel, r x w
    cdef const double* Md = M + <Py_ssize_t> start * m + start        # M22 and its first block
    if w <= 0:
        return
    for i in range(r):                                                 # P := S22[:, :w]
        memcpy(P + <Py_ssize_t> i * m, S + <Py_ssize_t> (start + i) * m + start,
               <size_t> w * sizeof(double))
    # Fortran holds P^T (w x r, leading dimension m) and sees the lower triangles as upper ones:
    # P := P Md (Md = M[start:stop, start:stop], lower): P^T := Md^T P^T ('L', 'N')
    dtrmm(&left, &uplo, &notrans, &diag, &w, &r, &one, <double*> Md, &m, P, &m)
    if below > 0:
        # P += S[start:, stop:] M[stop:, start:stop]: P^T += M[stop:, start:stop]^T S[start:, stop:]^T
        dgemm(&notrans, &notrans, &w, &r, &below, &one, <double*> (M + <Py_ssize_t> stop * m + start),
              &m, <double*> (S + <Py_ssize_t> start * m + stop), &m, &one, P, &m)
    # P := M22^T P: P^T := P^T M22 = P^T (M22^T)^T, M22^T upper in Fortran ('R', 'T')
    dtrmm(&right, &uplo, &trans, &diag, &w, &r, &one, <double*> Md, &m, P, &m)
    # the mirror image: X[start:stop, stop:] := the panel's rows below its diagonal block,
    # transposed, and the diagonal block's strict upper triangle := its strict lower one
    for i in range(r):
        for j in range(w if i >= w else i):
            X[<Py_ssize_t> (start + j) * m + start + i] = P[<Py_ssize_t> i * m + j]


# -- rows: products of a C-ordered (k, m) block of rows ------------------------------------------

cdef inline void gram_into(double* P, real* W, int m, int count, double alpha, double beta,
                           float* P32) noexcept nogil:
    """P := alpha W W^T + beta P in its lower triangle (C-ordered, m x m) for the rows of W
    (count x m, C-ordered): dsyrk, or for float rows ssyrk into ``P32`` (m x m floats) and added
    to P in double.  beta 0 writes P's lower triangle without reading it."""
    # Fortran: the rows are columns of an (m x count) matrix W; P^T = P, 'U' is our lower
    # triangle: P := alpha W W^T + beta P ('N')
    cdef char uplo = b'U', trans = b'N'
    cdef float alpha32 = <float> alpha, zero32 = 0.0
    cdef int i, j
    if real is double:
        dsyrk(&uplo, &trans, &m, &count, &alpha, W, &m, &beta, P, &m)
    else:
        ssyrk(&uplo, &trans, &m, &count, &alpha32, W, &m, &zero32, P32, &m)
        for i in range(m):
            for j in range(i + 1):
                if beta == 0.0:
                    P[i * m + j] = P32[i * m + j]
                else:
                    P[i * m + j] = beta * P[i * m + j] + P32[i * m + j]


cdef inline int signed_gram(double* P, const real* A, const double* w, real* work, int k,
                            int m, double sign=1.0, double beta=1.0,
                            bint one_pass=True, float* P32=NULL) noexcept nogil:
    """P := beta P + sign A^T diag(w) A in its lower triangle, for rows A (k x m, C-ordered) and
    weights w of either sign: two dsyrk, first over the rows with w > 0 scaled by sqrt(w) (alpha =
    sign), then over those with w < 0 scaled by sqrt(-w) (alpha = -sign), k m^2 / 2 multiply-adds
    in all, half a general product; rows with w = 0 are skipped.  beta 0 writes P's lower triangle
    without reading it.  Returns the rows used.

    ``work`` (at least k x m) holds the scaled rows: with ``one_pass`` both signs' rows are scaled
    in one pass over A, the positive ones into work's top and the negative ones into its bottom;
    without, each sign's rows into work's top in turn, the negative ones after the first dsyrk.
    The two give the same products in exact arithmetic but not always the same bits from
    OpenBLAS's dsyrk, so each caller keeps the placement its results were established with: the
    sparse passes one pass, gpc._sweeps one sign at a time.  Float rows need ``P32`` (m x m
    floats, :func:`gram_into`)."""
    cdef int n_pos = 0, n_neg = 0, i, j
    cdef double root, alpha
    cdef real* neg
    for i in range(k):
        if w[i] > 0:
            root = sqrt(w[i])
            for j in range(m):
                work[n_pos * m + j] = root * A[i * m + j]
            n_pos += 1
        elif one_pass and w[i] < 0:
            root = sqrt(-w[i])
            n_neg += 1
            for j in range(m):
                work[(k - n_neg) * m + j] = root * A[i * m + j]
    if n_pos > 0:
        alpha = sign
        gram_into(P, work, m, n_pos, alpha, beta, P32)
        beta = 1.0
    if one_pass:
        neg = work + (k - n_neg) * m
    else:
        neg = work
        for i in range(k):
            if w[i] < 0:
                root = sqrt(-w[i])
                for j in range(m):
                    work[n_neg * m + j] = root * A[i * m + j]
                n_neg += 1
    if n_neg > 0:
        alpha = -sign
        gram_into(P, neg, m, n_neg, alpha, beta, P32)
        beta = 1.0
    if beta == 0.0:
        for i in range(m):
            memset(P + i * m, 0, <size_t> (i + 1) * sizeof(double))
    return n_pos + n_neg


cdef inline double row_dot(const real* a, const real* b, int m) noexcept nogil:
    """a^T b in double: for double rows one running sum in index order; for float rows four
    interleaved partial sums (independent additions, which the processor overlaps), added at
    the end."""
    cdef double acc = 0.0, acc1 = 0.0, acc2 = 0.0, acc3 = 0.0
    cdef int j = 0
    if real is double:
        for j in range(m):
            acc = acc + a[j] * b[j]
    else:
        while j + 4 <= m:
            acc = acc + <double> a[j] * b[j]
            acc1 = acc1 + <double> a[j + 1] * b[j + 1]
            acc2 = acc2 + <double> a[j + 2] * b[j + 2]
            acc3 = acc3 + <double> a[j + 3] * b[j + 3]
            j += 4
        while j < m:
            acc = acc + <double> a[j] * b[j]
            j += 1
        acc = (acc + acc1) + (acc2 + acc3)
    return acc


cdef inline void gemv_rows(const real* A, const double* x, double* out, int k, int m,
                           bint transpose, double beta) noexcept nogil:
    """out (k,) := A x + beta out, or with ``transpose`` out (m,) := A^T x + beta out, for A
    (k x m, C-ordered; dgemv, or for float rows loops accumulating in double)."""
    # Fortran sees A^T (m x k): A x = (A^T)^T x ('T'), A^T x ('N')
    cdef char trans = b'N' if transpose else b'T'
    cdef int inc = 1, i, j
    cdef double one = 1.0, acc, acc1, xi
    if k <= 0:
        return
    if real is double:
        dgemv(&trans, &m, &k, &one, <double*> A, &m, <double*> x, &inc, &beta, out, &inc)
    elif transpose:
        for j in range(m):
            out[j] = beta * out[j] if beta != 0.0 else 0.0
        for i in range(k):
            xi = x[i]
            for j in range(m):
                out[j] += xi * A[i * m + j]
    else:
        for i in range(k):
            acc = acc1 = 0.0                     # two running sums (see row_dot)
            j = 0
            while j + 2 <= m:
                acc = acc + A[i * m + j] * x[j]
                acc1 = acc1 + A[i * m + j + 1] * x[j + 1]
                j += 2
            if j < m:
                acc = acc + A[i * m + j] * x[j]
            acc = acc + acc1
            out[i] = acc + beta * out[i] if beta != 0.0 else acc


cdef inline void times_lower(const real* T, real* B, int k, int m,
                             bint transpose) noexcept nogil:
    """Each row b of B (k x m, C-ordered) := T b, or T^T b with ``transpose`` (T lower, m x m;
    dtrmm, strmm)."""
    # Fortran sees U = T^T and B as the (m x k) matrix of the rows: T b = U^T b, T^T b = U b
    cdef char side = b'L', uplo = b'U', diag = b'N'
    cdef char trans = b'N' if transpose else b'T'
    cdef double one = 1.0
    cdef float one32 = 1.0
    if k <= 0:
        return
    if real is double:
        dtrmm(&side, &uplo, &trans, &diag, &m, &k, &one, <double*> T, &m, B, &m)
    else:
        strmm(&side, &uplo, &trans, &diag, &m, &k, &one32, <float*> T, &m, B, &m)


cdef inline void cross_rows(double* C, const real* X, const real* Y, int k, int m, double alpha,
                            float* C32) noexcept nogil:
    """C (m x m) := alpha Y^T X for rows X, Y (k x m, C-ordered): dgemm, or for float rows sgemm
    into ``C32`` (m x m floats) and C := C32 in double."""
    # Fortran holds X^T (m x k) for each (k x m) X: the Fortran product X_F Y_F^T = X^T Y, whose
    # C-ordered reading is its transpose, Y^T X ('N', 'T')
    cdef char notrans = b'N', trans = b'T'
    cdef double zero = 0.0
    cdef float alpha32 = <float> alpha, zero32 = 0.0
    cdef Py_ssize_t i
    if real is double:
        dgemm(&notrans, &trans, &m, &m, &k, &alpha, <double*> X, &m, <double*> Y, &m, &zero, C,
              &m)
    else:
        sgemm(&notrans, &trans, &m, &m, &k, &alpha32, <float*> X, &m, <float*> Y, &m, &zero32,
              C32, &m)
        for i in range(<Py_ssize_t> m * m):
            C[i] = C32[i]


cdef inline void gemm(char* transa, char* transb, int m, int n, int k, const real* A, int lda,
                      const real* B, int ldb, real* C, int ldc) noexcept nogil:
    """The Fortran C := op(A) op(B) (m x n; dgemm, or sgemm for float arrays), alpha 1, beta 0."""
    cdef double one = 1.0, zero = 0.0
    cdef float one32 = 1.0, zero32 = 0.0
    if real is double:
        dgemm(transa, transb, &m, &n, &k, &one, <double*> A, &lda, <double*> B, &ldb, &zero, C,
              &ldc)
    else:
        sgemm(transa, transb, &m, &n, &k, &one32, <float*> A, &lda, <float*> B, &ldb, &zero32, C,
              &ldc)
