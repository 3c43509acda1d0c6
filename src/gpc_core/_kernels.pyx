# Stationary covariance functions k = f(r), r^2 = |u_i - u_j|^2 on inputs already divided by their
# length scales: the kernel matrix and the gradient contraction, each one pass over the lower
# triangle (half the exponentials; the upper triangle is a blocked mirror).  The Gram matrix
# G = U U^T comes from BLAS (dsyrk/dgemm in Python), so wide inputs cost a matrix product, not a
# scalar loop.  With W(r) = -f'(r)/r (gpc.kernels):
#
#   d k / d log l = W r^2 (isotropic),   d k / d log l_d = W (u_d - u'_d)^2 (ARD).
#
# Kinds (the enum below, by name in Python): RBF the squared exponential, MATERN12, MATERN32,
# MATERN52 the Matern kernels of nu = 1/2, 3/2, 5/2.
#
# Every pass takes the rows [start, stop) it covers (stop < 0: to the end), so that
# gpc._parallel.over_rows can share it out among threads; passes that sum return their range's sum.

from libc.math cimport exp, sqrt
from libc.stdlib cimport free, malloc

from gpc._blas cimport gemm, mirror_lower_rows, range_stop, real

import numpy as np

cpdef enum:
    # the kinds, exported to gpc.kernels by these names
    RBF = 0
    MATERN12 = 1
    MATERN32 = 2
    MATERN52 = 3

cdef double SQRT3 = 1.7320508075688772
cdef double SQRT5 = 2.23606797749979


cdef inline double kernel_value(int kind, double r2) noexcept nogil:
    cdef double r
    if kind == RBF:
        return exp(-0.5 * r2)
    r = sqrt(r2)
    if kind == MATERN12:
        return exp(-r)
    if kind == MATERN32:
        r = SQRT3 * r
        return matern_product(1.0 + r, exp(-r))
    r = SQRT5 * r
    return matern_product(1.0 + r + r * r / 3.0, exp(-r))


cdef inline double matern_product(double poly, double e) noexcept nogil:
    # poly(r) e^{-r} -> 0 as r -> inf; at r = inf (inputs of size ~1e155 and more) it is inf * 0,
    # which IEEE makes NaN: the limit instead
    return 0.0 if e == 0.0 else poly * e


cdef inline double value_and_weight(int kind, double r2, double* w) noexcept nogil:
    # f and W from one exponential (W r^2 is W * r2 for every kind; Matern 1/2 takes W = 0 at
    # r = 0, where every W r^2 and W (u_d - u'_d)^2 term is 0 in the limit)
    cdef double r, s, e
    if kind == RBF:
        e = exp(-0.5 * r2)
        w[0] = e
        return e
    r = sqrt(r2)
    if kind == MATERN12:
        e = exp(-r)
        w[0] = e / r if r > 0.0 else 0.0
        return e
    if kind == MATERN32:
        s = SQRT3 * r
        e = exp(-s)
        w[0] = 3.0 * e
        return matern_product(1.0 + s, e)
    s = SQRT5 * r
    e = exp(-s)
    w[0] = matern_product((5.0 / 3.0) * (1.0 + s), e)
    return matern_product(1.0 + s + s * s / 3.0, e)


cdef inline double weight_from_value(int kind, double r2, double f) noexcept nogil:
    # W from a value f = f(r^2) already computed (a kernel matrix the caller holds): no
    # exponential, the identities of value_and_weight solved for e
    cdef double r, s
    if kind == RBF:
        return f
    r = sqrt(r2)
    if kind == MATERN12:
        return f / r if r > 0.0 else 0.0
    if f == 0.0:                # also at r = inf, where the ratios below are inf / inf
        return 0.0
    if kind == MATERN32:
        s = SQRT3 * r
        return 3.0 * f / (1.0 + s)
    s = SQRT5 * r
    return (5.0 / 3.0) * (1.0 + s) * f / (1.0 + s + s * s / 3.0)


cdef inline double dist2(const double[::1] su, const double[::1] sv, double g,
                         Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    cdef double r2 = su[i] + sv[j] - 2.0 * g
    return r2 if r2 > 0.0 else 0.0


def check_kind(int kind):
    if kind < RBF or kind > MATERN52:
        raise ValueError(f"unknown stationary kernel kind {kind}")


def gram_to_sqdist(double[:, ::1] G, const double[::1] su, double offset=0.0, double factor=1.0,
                   *, Py_ssize_t start=0, Py_ssize_t stop=-1):
    """G's strict lower triangle (U U^T) := offset + factor * r^2, r^2 = su_i + su_j - 2 G_ij
    clipped at 0 (factor -1/2: the exponent of a squared exponential)."""
    cdef Py_ssize_t n = G.shape[0], i, j
    if G.shape[1] != n or su.shape[0] != n:
        raise ValueError("gram_to_sqdist: G must be n x n and su of length n")
    stop = range_stop(start, stop, n)
    with nogil:
        for i in range(start, stop):
            for j in range(i):
                G[i, j] = offset + factor * dist2(su, su, G[i, j], i, j)


def sqdist_to_kernel(double[:, ::1] R2, int kind, double scale, *, Py_ssize_t start=0,
                     Py_ssize_t stop=-1):
    """R2's strict lower triangle: r^2 := scale * f(r^2), then as ``finish_kernel`` (scale
    already applied): full and symmetric, diagonal ``scale``."""
    cdef Py_ssize_t n = R2.shape[0], i, j
    check_kind(kind)
    if R2.shape[1] != n:
        raise ValueError("sqdist_to_kernel: R2 must be square")
    stop = range_stop(start, stop, n)
    with nogil:
        for i in range(start, stop):
            for j in range(i):
                R2[i, j] = scale * kernel_value(kind, R2[i, j])
    finish_kernel(R2, scale, start=start, stop=stop)


def finish_kernel(double[:, ::1] K, double scale, bint scale_lower=False, *, Py_ssize_t start=0,
                  Py_ssize_t stop=-1):
    """K's diagonal := ``scale`` (f(0) = 1) and its strict upper triangle := the strict lower one,
    which is first multiplied by ``scale`` if ``scale_lower`` (in the same tiled pass); rows
    start..stop-1 of the lower triangle and their columns of the upper one."""
    cdef Py_ssize_t n = K.shape[0], i
    if K.shape[1] != n:
        raise ValueError("finish_kernel: K must be square")
    stop = range_stop(start, stop, n)
    with nogil:
        mirror_lower_rows(K, start, stop, scale if scale_lower else 1.0)
        for i in range(start, stop):
            K[i, i] = scale


def cross_to_kernel(double[:, ::1] G, const double[::1] su, const double[::1] sv, int kind,
                    double scale, *, Py_ssize_t start=0, Py_ssize_t stop=-1):
    """G (U V^T, n x m) := scale * f(r^2) elementwise (the scalar pass; gpc.kernels takes the
    squared exponential's values from cross_sqdist and a vectorised exp instead)."""
    cdef Py_ssize_t n = G.shape[0], m = G.shape[1], i, j
    check_kind(kind)
    if su.shape[0] != n or sv.shape[0] != m:
        raise ValueError("cross_to_kernel: su, sv must match the rows and columns of G")
    stop = range_stop(start, stop, n)
    with nogil:
        for i in range(start, stop):
            for j in range(m):
                G[i, j] = scale * kernel_value(kind, dist2(su, sv, G[i, j], i, j))


def cross_sqdist(double[:, ::1] G, const double[::1] su, const double[::1] sv, double factor, *,
                 Py_ssize_t start=0, Py_ssize_t stop=-1):
    """G (U V^T, n x m) := factor * r^2 elementwise, r^2 = su_i + sv_j - 2 G_ij clipped at 0."""
    cdef Py_ssize_t n = G.shape[0], m = G.shape[1], i, j
    if su.shape[0] != n or sv.shape[0] != m:
        raise ValueError("cross_sqdist: su, sv must match the rows and columns of G")
    stop = range_stop(start, stop, n)
    with nogil:
        for i in range(start, stop):
            for j in range(m):
                G[i, j] = factor * dist2(su, sv, G[i, j], i, j)


cdef double row_terms(int kind, Py_ssize_t i, const double* r2, const double[:, ::1] M,
                      bint symmetric, const double[:, ::1] K, double inv_scale, bint ard,
                      double* q, double* iso) noexcept nogil:
    # Row i of a contraction, j < i: returns sum_j m_j f_ij, and with m_j W_ij either adds
    # sum_j m_j W_ij r2_j to iso or (ard) stores it in q[j].  m_j = M_ij + M_ji (2 M_ij for a
    # symmetric M, whose upper triangle is then not read); f comes from K = scale * f when K is
    # given (inv_scale = 1 / scale > 0), else from exponentials.
    cdef Py_ssize_t j
    cdef double value = 0.0, acc = 0.0, m, f, w
    if symmetric and inv_scale > 0.0 and kind == RBF and not ard:
        # an isotropic squared exponential's evidence gradient (W = f): one plain loop
        for j in range(i):
            m = M[i, j] * K[i, j]
            value += m
            acc += m * r2[j]
        iso[0] += 2.0 * inv_scale * acc
        return 2.0 * inv_scale * value
    for j in range(i):
        m = 2.0 * M[i, j] if symmetric else M[i, j] + M[j, i]
        if inv_scale > 0.0:
            f = K[i, j] * inv_scale
            w = weight_from_value(kind, r2[j], f)
        else:
            f = value_and_weight(kind, r2[j], &w)
        value += m * f
        if ard:
            q[j] = m * w
        else:
            acc += m * w * r2[j]
    iso[0] += acc
    return value


cdef tuple check_contract(int kind, Py_ssize_t n, const double[:, ::1] M,
                          const double[:, ::1] K, double scale, Py_ssize_t start, Py_ssize_t stop):
    """A contraction's checks and scratch: (1 / scale when K is given else 0, the row range's
    checked stop, a 2 x n work array for r^2 and the row's ARD weights)."""
    check_kind(kind)
    if M.shape[0] != n or M.shape[1] != n:
        raise ValueError(f"M must be {n} x {n}, got {M.shape[0]} x {M.shape[1]}")
    cdef double inv_scale = 0.0
    if K is not None:
        if K.shape[0] != n or K.shape[1] != n:
            raise ValueError(f"K must be {n} x {n} like M, got {K.shape[0]} x {K.shape[1]}")
        if not (scale > 0.0 and scale < 1e308):
            raise ValueError(f"the scale of K must be positive and finite, got {scale}")
        inv_scale = 1.0 / scale
    return inv_scale, range_stop(start, stop, n), np.empty((2, max(n, 1)))


def contract(double[:, ::1] G, const double[::1] su, const double[:, ::1] M, int kind, bint ard,
             const double[:, ::1] K=None, double scale=1.0, bint symmetric=False, *,
             Py_ssize_t start=0, Py_ssize_t stop=-1):
    """Contractions of M with f and with the length-scale derivatives, from G = U U^T (lower).

    Returns (sum_ij M_ij f_ij, sum_ij M_ij W_ij r_ij^2).  With ``ard`` the second is 0 and G is
    overwritten by the symmetric S with S_ij = (M_ij + M_ji) W_ij / 2 off the diagonal and 0 on it,
    so that sum_ij M_ij W_ij (u_id - u_jd)^2 = 2 [sum_i u_id^2 (S 1)_i - sum_i u_id (S U)_id], which
    the caller forms with one matrix product.  M need not be symmetric; with ``symmetric`` (a
    promise) only its lower triangle is read.  Given ``K`` = scale * f(r^2) (its strict lower
    triangle is read), f comes from it instead of from exponentials.  Over rows start..stop-1: the
    sums are theirs, and with ``ard`` S is written in those rows and their upper-triangle columns.
    """
    cdef Py_ssize_t n = G.shape[0], i, j
    cdef double value = 0.0, iso = 0.0, inv_scale
    cdef double[:, ::1] work
    cdef double* r2
    cdef double* q
    if G.shape[1] != n or su.shape[0] != n:
        raise ValueError("contract: G must be n x n and su of length n")
    inv_scale, stop, work = check_contract(kind, n, M, K, scale, start, stop)
    r2 = &work[0, 0]
    q = &work[1, 0]
    with nogil:
        for i in range(start, stop):
            value += M[i, i]
            for j in range(i):
                r2[j] = dist2(su, su, G[i, j], i, j)
            value += row_terms(kind, i, r2, M, symmetric, K, inv_scale, ard, q, &iso)
            if ard:
                for j in range(i):
                    G[i, j] = 0.5 * q[j]
                G[i, i] = 0.0
        if ard:
            mirror_lower_rows(G, start, stop)
    return value, iso


# -- direct differences, for few input dimensions ------------------------------------------------
# r^2 = sum_d (u_id - u_jd)^2 accumulated row by row from U^T (d x n, each dimension contiguous), so
# the loop over j vectorises; no n x n Gram matrix is written and read back, and there is no
# cancellation in |u|^2 + |v|^2 - 2 u.v.

cdef void row_dist2(const double[:, ::1] Ut, Py_ssize_t i, Py_ssize_t jmax, double* r2) noexcept nogil:
    """r2[j] = |u_i - u_j|^2 for j < jmax."""
    cdef Py_ssize_t d = Ut.shape[0], k, j
    cdef double ui, t
    for j in range(jmax):
        r2[j] = 0.0
    for k in range(d):
        ui = Ut[k, i]
        for j in range(jmax):
            t = ui - Ut[k, j]
            r2[j] += t * t


def sqdist_direct(const double[:, ::1] Ut, double[:, ::1] out, double offset=0.0,
                  double factor=1.0, *, Py_ssize_t start=0, Py_ssize_t stop=-1):
    """out's strict lower triangle := offset + factor * |u_i - u_j|^2 for the columns u of Ut
    (d x n), as gram_to_sqdist."""
    cdef Py_ssize_t n = Ut.shape[1], i, j
    if out.shape[0] != n or out.shape[1] != n:
        raise ValueError("sqdist_direct: out must be n x n")
    stop = range_stop(start, stop, n)
    with nogil:
        for i in range(start, stop):
            row_dist2(Ut, i, i, &out[i, 0])
            if offset != 0.0 or factor != 1.0:
                for j in range(i):
                    out[i, j] = offset + factor * out[i, j]


def contract_direct(const double[:, ::1] Ut, const double[:, ::1] M, int kind, bint ard,
                    const double[:, ::1] K=None, double scale=1.0, bint symmetric=False, *,
                    Py_ssize_t start=0, Py_ssize_t stop=-1):
    """As ``contract`` from the inputs themselves: (sum M o f, sum M o W r^2, g_ard) with, if
    ``ard``, g_ard[d] = sum_ij M_ij W_ij (u_id - u_jd)^2 (else zeros), each over rows
    start..stop-1; ``K``, ``scale`` and ``symmetric`` as in ``contract``."""
    cdef Py_ssize_t d = Ut.shape[0], n = Ut.shape[1], i, j, k
    cdef double value = 0.0, iso = 0.0, inv_scale, t, acc
    cdef double[:, ::1] work
    cdef double[::1] g_ard = np.zeros(d)
    cdef double* r2
    cdef double* q
    inv_scale, stop, work = check_contract(kind, n, M, K, scale, start, stop)
    r2 = &work[0, 0]
    q = &work[1, 0]
    with nogil:
        for i in range(start, stop):
            value += M[i, i]
            row_dist2(Ut, i, i, r2)
            value += row_terms(kind, i, r2, M, symmetric, K, inv_scale, ard, q, &iso)
            if ard:
                for k in range(d):
                    acc = 0.0
                    for j in range(i):
                        t = Ut[k, i] - Ut[k, j]
                        acc += q[j] * t * t
                    g_ard[k] += acc
    return value, iso, np.asarray(g_ard)



# -- the squared exponential against inducing inputs: one chunk of rows per call ---------------------
#
# c exp(-½ |u - v|²) between rows u = (x - z̄)/ℓ of a chunk and the inducing inputs' v = (z - z̄)/ℓ
# (R&W eq. (4.9), the ARD form of eq. (5.1)), all shifted by the mean z̄ of Z so that the expansion
# |u|² + |v|² - 2uᵀv of the squared distance does not cancel.  The products of b x d x m work are
# gemm calls; a C-ordered (k, d) array is the Fortran (d, k) matrix of its transpose, so with U
# (k x d) and V (m x d) C-ordered, the C-ordered K = U Vᵀ (k x m) is the Fortran Kᵀ = V Uᵀ.  Each
# function checks its shapes, then runs with the GIL released (gpc.kernels.stationary's bound
# object calls them per chunk on the block threads; the exponentials are NumPy's vectorised exp,
# which releases the GIL too).
#
# Precision: V, the block K and the contraction's G are ``real``, float or double together.  In
# float (the sparse models' mixed precision, gpc.sparse) the b x d x m products run in single
# precision (sgemm) on the rows u rounded to float; the exponents' sums, |u|², |v|², the row and
# column sums and everything returned are formed in double.


cdef int _check_scaled(Py_ssize_t width, const double[::1] shift, const double[::1] length_scale,
                       Py_ssize_t m, Py_ssize_t d, const double[::1] vv) except -1:
    if m < 1 or d < 1:
        raise ValueError(f"V must be a non-empty m x d array, got {m} x {d}")
    if width != d:
        raise ValueError(f"X has {width} features but the inducing inputs have {d}")
    if shift.shape[0] != d or length_scale.shape[0] != d:
        raise ValueError(f"shift and length_scale need {d} entries, got {shift.shape[0]} and "
                         f"{length_scale.shape[0]}")
    if vv is not None and vv.shape[0] != m:
        raise ValueError(f"vv needs {m} entries, got {vv.shape[0]}")
    return 0


cdef void _scale_rows(const double[:, ::1] X, const double[::1] shift,
                      const double[::1] length_scale, real* U, double* uu) noexcept nogil:
    """U (k x d, C-ordered) := (X - shift) / ℓ, rounded to U's type, and uu_i := |u_i|² of the
    double values."""
    cdef Py_ssize_t k = X.shape[0], d = X.shape[1], i, c
    cdef double t, acc
    for i in range(k):
        acc = 0.0
        for c in range(d):
            t = (X[i, c] - shift[c]) / length_scale[c]
            U[i * d + c] = <real> t
            acc = acc + t * t
        uu[i] = acc


def scaled_inputs(const double[:, ::1] X, const double[::1] shift, const double[::1] length_scale,
                  double[:, ::1] U, double[::1] uu):
    """U := (X - shift) / ℓ (k x d) and uu_i := |u_i|²: the inducing inputs' V and |v_j|² in the
    rounding that :func:`squared_exponential_exponents` gives a chunk's rows."""
    cdef Py_ssize_t k = X.shape[0], d = X.shape[1]
    if U.shape[0] != k or U.shape[1] != d or uu.shape[0] != k:
        raise ValueError(f"U must be {k} x {d} and uu have {k} entries, got {U.shape[0]} x "
                         f"{U.shape[1]} and {uu.shape[0]}")
    if shift.shape[0] != d or length_scale.shape[0] != d:
        raise ValueError(f"shift and length_scale need {d} entries, got {shift.shape[0]} and "
                         f"{length_scale.shape[0]}")
    if k == 0:
        return
    with nogil:
        _scale_rows(X, shift, length_scale, &U[0, 0], &uu[0])


def squared_exponential_exponents(const double[:, ::1] X, const double[::1] shift,
                                  const double[::1] length_scale, const real[:, ::1] V,
                                  const double[::1] vv not None, double log_scale,
                                  real[:, ::1] K):
    """K (k x m) := log c - ½ |u_i - v_j|², whose exp is c k(x_i, z_j), for the rows x_i of X
    (k x d), u_i = (x_i - z̄)/ℓ, given the inducing inputs' V = (Z - z̄)/ℓ (m x d) and vv_j =
    |v_j|² (:func:`scaled_inputs`, ``shift`` = z̄, ``length_scale`` ℓ of length d).  The squared
    distance |u_i|² + |v_j|² - 2 u_iᵀv_j is clipped at 0 (rounding below a zero distance).  V and
    K float: uᵀv in single precision (see the section's note)."""
    cdef Py_ssize_t k = X.shape[0], m = V.shape[0], d = V.shape[1], i, j
    _check_scaled(X.shape[1], shift, length_scale, m, d, vv)
    if K.shape[0] != k or K.shape[1] != m:
        raise ValueError(f"K must be {k} x {m}, got {K.shape[0]} x {K.shape[1]}")
    if k == 0:
        return
    cdef real* U = <real*> malloc(k * d * sizeof(real))
    cdef double* uu = <double*> malloc(k * sizeof(double))
    if U == NULL or uu == NULL:
        free(U)
        free(uu)
        raise MemoryError()
    cdef int mi = <int> m, ki = <int> k, di = <int> d
    cdef char ta = b'T', tb = b'N'
    cdef double hu, t
    with nogil:
        _scale_rows(X, shift, length_scale, U, uu)
        # Fortran: Kᵀ (m x k) := (V as d x m)ᵀ (U as d x k)
        gemm(&ta, &tb, mi, ki, di, &V[0, 0], di, U, di, &K[0, 0], mi)
        for i in range(k):
            hu = 0.5 * uu[i]
            for j in range(m):
                t = K[i, j] - hu - 0.5 * vv[j]
                K[i, j] = <real> ((t if t < 0.0 else 0.0) + log_scale)
    free(U)
    free(uu)


def squared_exponential_gradient(const double[:, ::1] X, const double[::1] shift,
                                 const double[::1] length_scale, const real[:, ::1] V,
                                 real[:, ::1] G, const real[:, ::1] K not None,
                                 const double[::1] w, double scale, bint length_scales,
                                 double[::1] per_feature, double[:, ::1] g_Z):
    """The b x m contraction of F = Σ_ij G_ij k_ij + c Σ_i w_i for one chunk of rows of the
    squared exponential's block K (k x m, k_ij = c exp(-½ |u_i - v_j|²), u_i = (x_i - z̄)/ℓ, V's
    rows v_j = (z_j - z̄)/ℓ) and its diagonal k(x_i, x_i) = c (``scale``) weighted by w (None:
    no diagonal terms); returns F, which is also its derivative in log c.

    With A = G ∘ K (written into G) and its row and column sums r, s (W = -f'(r)/r = k for the
    squared exponential: gpc.kernels' identity ∂k/∂log ℓ_d = W (x_d - z_d)²/ℓ_d²):

    * per_feature[d] := Σ_ij A_ij (u_id - v_jd)² = rᵀu_d² + sᵀv_d² - 2 u_dᵀ (A V)_d, the
      derivative of F in log ℓ_d (only with ``length_scales``; untouched otherwise),
    * g_Z (m x d) := ∂F/∂z_jd = [(Aᵀ U)_jd - s_j v_jd] / ℓ_d.

    V, G and K float: A and the products Aᵀ U, A V in single precision (the section's note)."""
    cdef Py_ssize_t k = X.shape[0], m = V.shape[0], d = V.shape[1], i, j, c
    _check_scaled(X.shape[1], shift, length_scale, m, d, None)
    if G.shape[0] != k or G.shape[1] != m:
        raise ValueError(f"G must be {k} x {m}, got {G.shape[0]} x {G.shape[1]}")
    if K.shape[0] != k or K.shape[1] != m:
        raise ValueError(f"K must be {k} x {m} like G, got {K.shape[0]} x {K.shape[1]}")
    if g_Z.shape[0] != m or g_Z.shape[1] != d or per_feature.shape[0] != d:
        raise ValueError(f"g_Z must be {m} x {d} and per_feature have {d} entries, got "
                         f"{g_Z.shape[0]} x {g_Z.shape[1]} and {per_feature.shape[0]}")
    cdef bint diagonal = w is not None
    if diagonal and w.shape[0] != k:
        raise ValueError(f"w needs {k} entries, got {w.shape[0]}")
    # scratch: U and A V (k x d each), Aᵀ U (m x d) in G's type; uu, r (k) and s (m) in double
    cdef real* U = <real*> malloc((2 * k * d + m * d) * sizeof(real))
    cdef double* uu = <double*> malloc((2 * k + m) * sizeof(double))
    if U == NULL or uu == NULL:
        free(U)
        free(uu)
        raise MemoryError()
    cdef real* AV = U + k * d
    cdef real* AtU = AV + k * d
    cdef double* rows = uu + k
    cdef double* cols = rows + k
    cdef double value = 0.0, acc, a, t
    cdef int mi = <int> m, ki = <int> k, di = <int> d
    cdef char tn = b'N', tt = b'T'
    with nogil:
        _scale_rows(X, shift, length_scale, U, uu)
        for j in range(m):
            cols[j] = 0.0
        for i in range(k):
            acc = 0.0
            for j in range(m):
                a = <double> G[i, j] * K[i, j]
                G[i, j] = <real> a
                acc = acc + a
                cols[j] += a
            rows[i] = acc
            value += acc
        if diagonal:
            acc = 0.0
            for i in range(k):
                acc = acc + w[i]
            value += scale * acc
        if k > 0:
            # Fortran: (Uᵀ A) (d x m) := (U as d x k)(A as m x k)ᵀ, the C-ordered Aᵀ U
            gemm(&tn, &tt, di, mi, ki, U, di, &G[0, 0], mi, AtU, di)
        else:
            for j in range(m * d):
                AtU[j] = 0.0
        for j in range(m):
            for c in range(d):
                g_Z[j, c] = (AtU[j * d + c] - cols[j] * V[j, c]) / length_scale[c]
        if length_scales:
            for c in range(d):
                acc = 0.0
                for j in range(m):
                    acc = acc + cols[j] * V[j, c] * V[j, c]
                per_feature[c] = acc
            if k > 0:
                # Fortran: (A V)ᵀ (d x k) := (V as d x m)(A as m x k)
                gemm(&tn, &tn, di, ki, mi, &V[0, 0], di, &G[0, 0], mi, AV, di)
            for i in range(k):
                for c in range(d):
                    t = U[i * d + c]
                    per_feature[c] += t * (rows[i] * t - 2.0 * AV[i * d + c])
    free(U)
    free(uu)
    return value
