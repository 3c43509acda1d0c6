# Stationary covariance functions k = f(r), r^2 = |u_i - u_j|^2 on inputs already divided by their
# length scales: the kernel matrix and the gradient contraction, each one pass over the lower
# triangle (half the exponentials; the upper triangle is a blocked mirror).  The Gram matrix
# G = U U^T comes from BLAS (dsyrk/dgemm in Python), so wide inputs cost a matrix product, not a
# scalar loop.  With W(r) = -f'(r)/r (kernels.py):
#
#   d k / d log l = W r^2 (isotropic),   d k / d log l_d = W (u_d - u'_d)^2 (ARD).
#
# Kinds: 0 squared exponential, 1 Matern 1/2, 2 Matern 3/2, 3 Matern 5/2.

from libc.math cimport exp, sqrt

include "_tiles.pxi"

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
        return (1.0 + r) * exp(-r)
    r = SQRT5 * r
    return (1.0 + r + r * r / 3.0) * exp(-r)


cdef inline double value_and_weight(int kind, double r2, double* w, double* wr2) noexcept nogil:
    # f, W and W r^2 from one exponential
    cdef double r, s, e
    if kind == RBF:
        e = exp(-0.5 * r2)
        w[0] = e
        wr2[0] = e * r2
        return e
    r = sqrt(r2)
    if kind == MATERN12:
        e = exp(-r)
        w[0] = e / r if r > 0.0 else 0.0
        wr2[0] = r * e
        return e
    if kind == MATERN32:
        s = SQRT3 * r
        e = exp(-s)
        w[0] = 3.0 * e
        wr2[0] = w[0] * r2
        return (1.0 + s) * e
    s = SQRT5 * r
    e = exp(-s)
    w[0] = (5.0 / 3.0) * (1.0 + s) * e
    wr2[0] = w[0] * r2
    return (1.0 + s + s * s / 3.0) * e


cdef inline double dist2(const double[::1] su, const double[::1] sv, double g,
                         Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    cdef double r2 = su[i] + sv[j] - 2.0 * g
    return r2 if r2 > 0.0 else 0.0


def check_kind(int kind):
    if kind < RBF or kind > MATERN52:
        raise ValueError(f"unknown stationary kernel kind {kind}")


def gram_to_kernel(double[:, ::1] G, const double[::1] su, int kind, double scale):
    """G (lower triangle: U U^T) := scale * f(r^2), symmetric, with the diagonal exactly ``scale``."""
    cdef Py_ssize_t n = G.shape[0], i, j
    check_kind(kind)
    if G.shape[1] != n or su.shape[0] != n:
        raise ValueError("gram_to_kernel: G must be n x n and su of length n")
    with nogil:
        for i in range(n):
            for j in range(i):
                G[i, j] = scale * kernel_value(kind, dist2(su, su, G[i, j], i, j))
            G[i, i] = scale
        mirror_lower(G)


def cross_to_kernel(double[:, ::1] G, const double[::1] su, const double[::1] sv, int kind,
                    double scale):
    """G (U V^T, n x m) := scale * f(r^2) elementwise."""
    cdef Py_ssize_t n = G.shape[0], m = G.shape[1], i, j
    check_kind(kind)
    if su.shape[0] != n or sv.shape[0] != m:
        raise ValueError("cross_to_kernel: su, sv must match the rows and columns of G")
    with nogil:
        for i in range(n):
            for j in range(m):
                G[i, j] = scale * kernel_value(kind, dist2(su, sv, G[i, j], i, j))


def contract(double[:, ::1] G, const double[::1] su, const double[:, ::1] M, int kind, bint ard):
    """Contractions of M with f and with the length-scale derivatives, from G = U U^T (lower).

    Returns (sum_ij M_ij f_ij, sum_ij M_ij W_ij r_ij^2).  With ``ard`` the second is 0 and G is
    overwritten by the symmetric S with S_ij = (M_ij + M_ji) W_ij / 2 off the diagonal and 0 on it,
    so that sum_ij M_ij W_ij (u_id - u_jd)^2 = 2 [sum_i u_id^2 (S 1)_i - sum_i u_id (S U)_id], which
    the caller forms with one matrix product.  M need not be symmetric; it is read tile by tile so
    that M[j, i] stays in cache.
    """
    cdef Py_ssize_t n = G.shape[0], tile = 64, i0 = 0, j0, i, j, i1, j1
    cdef double value = 0.0, iso = 0.0, r2, m, f, w, wr2
    check_kind(kind)
    if G.shape[1] != n or su.shape[0] != n or M.shape[0] != n or M.shape[1] != n:
        raise ValueError("contract: G and M must be n x n and su of length n")
    with nogil:
        for i in range(n):
            value += M[i, i]
        while i0 < n:
            i1 = min(i0 + tile, n)
            j0 = 0
            while j0 <= i0:
                j1 = min(j0 + tile, n)
                for i in range(i0, i1):
                    for j in range(j0, min(j1, i)):
                        r2 = dist2(su, su, G[i, j], i, j)
                        m = M[i, j] + M[j, i]
                        f = value_and_weight(kind, r2, &w, &wr2)
                        value += m * f
                        if ard:
                            G[i, j] = 0.5 * m * w
                        else:
                            iso += m * wr2
                j0 += tile
            i0 += tile
        if ard:
            for i in range(n):
                G[i, i] = 0.0
            mirror_lower(G)
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


def gram_direct(const double[:, ::1] Ut, int kind, double scale, double[:, ::1] out,
                double[::1] work):
    """out := scale * f(|u_i - u_j|^2) for the columns u of Ut (d x n); ``work`` is n scratch."""
    cdef Py_ssize_t n = Ut.shape[1], i, j
    check_kind(kind)
    if out.shape[0] != n or out.shape[1] != n or work.shape[0] < n:
        raise ValueError("gram_direct: out must be n x n and work of length n")
    with nogil:
        for i in range(n):
            row_dist2(Ut, i, i, &work[0])
            for j in range(i):
                out[i, j] = scale * kernel_value(kind, work[j])
            out[i, i] = scale
        mirror_lower(out)


def contract_direct(const double[:, ::1] Ut, const double[:, ::1] M, int kind, bint ard,
                    double[::1] g_ard, double[:, ::1] work):
    """As ``contract`` from the inputs themselves: (sum M o f, sum M o W r^2), and with ``ard``
    g_ard[d] += sum_ij M_ij W_ij (u_id - u_jd)^2.  ``work`` is (n_tile_rows = 64) x n scratch."""
    cdef Py_ssize_t d = Ut.shape[0], n = Ut.shape[1], tile = 64, i0 = 0, j0, i, j, k, i1, j1
    cdef double value = 0.0, iso = 0.0, m, f, w, wr2, t
    check_kind(kind)
    if M.shape[0] != n or M.shape[1] != n or (ard and g_ard.shape[0] != d) \
            or work.shape[0] < tile or work.shape[1] < n:
        raise ValueError("contract_direct: M must be n x n, g_ard of length d, work 64 x n")
    with nogil:
        for i in range(n):
            value += M[i, i]
        while i0 < n:
            i1 = min(i0 + tile, n)
            for i in range(i0, i1):              # distances of this tile's rows to every j < i
                row_dist2(Ut, i, i, &work[i - i0, 0])
            j0 = 0
            while j0 <= i0:
                j1 = min(j0 + tile, n)
                for i in range(i0, i1):
                    for j in range(j0, min(j1, i)):
                        m = M[i, j] + M[j, i]
                        f = value_and_weight(kind, work[i - i0, j], &w, &wr2)
                        value += m * f
                        if ard:
                            w = m * w
                            for k in range(d):
                                t = Ut[k, i] - Ut[k, j]
                                g_ard[k] += w * t * t
                        else:
                            iso += m * wr2
                j0 += tile
            i0 += tile
    return value, iso
