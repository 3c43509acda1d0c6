# Stationary covariance functions k = f(r), r^2 = |u_i - u_j|^2 on inputs already divided by their
# length scales: the kernel matrix and the gradient contraction, each one pass over the lower
# triangle (half the exponentials; the upper triangle is a blocked mirror).  The Gram matrix
# G = U U^T comes from BLAS (dsyrk/dgemm in Python), so wide inputs cost a matrix product, not a
# scalar loop.  With W(r) = -f'(r)/r (gpc.kernels):
#
#   d k / d log l = W r^2 (isotropic),   d k / d log l_d = W (u_d - u'_d)^2 (ARD).
#
# Kinds: 0 squared exponential, 1 Matern 1/2, 2 Matern 3/2, 3 Matern 5/2.
#
# Every pass takes the rows [start, stop) it covers (stop < 0: to the end), so that
# gpc._parallel.over_rows can share it out among threads; passes that sum return their range's sum.

from libc.math cimport exp, sqrt

import numpy as np

from gpc._tiles cimport range_stop, mirror_lower_rows

cdef enum:
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
    cdef Py_ssize_t n = K.shape[0], tile = 64, i0, j0, i, j, i1, j1
    cdef double v, factor = scale if scale_lower else 1.0    # x * 1.0 is x exactly
    if K.shape[1] != n:
        raise ValueError("finish_kernel: K must be square")
    stop = range_stop(start, stop, n)
    i0 = start
    with nogil:
        while i0 < stop:
            i1 = min(i0 + tile, stop)
            j0 = 0
            while j0 < i1 - 1:
                j1 = j0 + tile
                for i in range(i0, i1):
                    for j in range(j0, min(j1, i)):
                        v = factor * K[i, j]
                        K[i, j] = v
                        K[j, i] = v
                j0 += tile
            i0 += tile
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


cdef double check_contract(Py_ssize_t n, const double[:, ::1] M, const double[:, ::1] K,
                           double scale) except -1.0:
    # shapes of a contraction's arguments; returns 1 / scale when K is given, else 0
    if M.shape[0] != n or M.shape[1] != n:
        raise ValueError(f"M must be {n} x {n}, got {M.shape[0]} x {M.shape[1]}")
    if K is None:
        return 0.0
    if K.shape[0] != n or K.shape[1] != n:
        raise ValueError(f"K must be {n} x {n} like M, got {K.shape[0]} x {K.shape[1]}")
    if not (scale > 0.0 and scale < 1e308):
        raise ValueError(f"the scale of K must be positive and finite, got {scale}")
    return 1.0 / scale


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
    check_kind(kind)
    if G.shape[1] != n or su.shape[0] != n:
        raise ValueError("contract: G must be n x n and su of length n")
    inv_scale = check_contract(n, M, K, scale)
    stop = range_stop(start, stop, n)
    work = np.empty((2, max(n, 1)))
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
    check_kind(kind)
    inv_scale = check_contract(n, M, K, scale)
    stop = range_stop(start, stop, n)
    work = np.empty((2, max(n, 1)))
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

