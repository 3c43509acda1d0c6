"""Hot loops of the mean-field methods and of online ADF (MF paper, Csató et al.).

* ``heaviside_moments``: the tilted moments of the Heaviside likelihood, from gpc._likelihoods.
* ``mf_sweep``: one sequential (Gauss-Seidel) sweep of the mean-field equations, MF eq. (5)-(6)
  (ensemble) or eq. (9) (naive), for the Heaviside likelihood Θ(y a), with an O(n) rank-one refresh of
  the auxiliary vector after each coordinate: O(n²) per sweep, no Python objects inside.
* ``symv_lower`` / ``syr_lower``: the BLAS-2 products of the ADF update, MF eq. (12), on the leading
  a × a block of a C-ordered n × n matrix whose lower triangle is kept (Fortran 'U' addresses the C
  lower triangle), so the first sweep touches only the rows seen so far.
"""

from libc.math cimport sqrt, fabs, NAN

import numpy as np

from gpc._blas cimport dsymv, dsyr
from gpc._likelihoods cimport LIK_HEAVISIDE, LikelihoodSpec, make_spec, tilted_moments
from gpc._special cimport inv_mills

# the Heaviside likelihood needs no quadrature; make_spec wants a rule all the same
cdef double[::1] _NO_NODES = np.zeros(1), _NO_WEIGHTS = np.ones(1)


def heaviside_moments(const double[::1] y, const double[::1] m, const double[::1] lam,
                      double[::1] log_z, double[::1] mean, double[::1] var):
    """Moments of q(a) ∝ Θ(y a) N(a | m, λ), elementwise (MF eq. (5)-(6)): gpc._likelihoods'
    ``tilted_moments`` of the Heaviside likelihood, in one nogil loop.

    With z = y m / √λ and r = N(z)/Φ(z): ln Z = ln Φ(z), mean = m + y √λ r, var = λ (1 − r (z + r)).

    Returns
    -------
    int
        The first index whose moments could not be formed (a non-positive λ or a non-finite m), or
        −1; such entries are NaN, which the callers' finiteness checks reject.
    """
    cdef Py_ssize_t i, bad = -1, n = y.shape[0]
    cdef LikelihoodSpec spec
    if not (m.shape[0] == n and lam.shape[0] == n and log_z.shape[0] == n and mean.shape[0] == n
            and var.shape[0] == n):
        raise ValueError("heaviside_moments: every array must have the length of y")
    make_spec(&spec, LIK_HEAVISIDE, 0.0, _NO_NODES, _NO_WEIGHTS, None)
    with nogil:
        for i in range(n):
            if tilted_moments(&spec, y[i], m[i], lam[i], &log_z[i], &mean[i], &var[i]) != 0:
                log_z[i] = mean[i] = var[i] = NAN
                if bad < 0:
                    bad = i
    return bad


def mf_sweep(const double[:, ::1] P, const double[::1] lam, const double[::1] y,
             const double[::1] m0, double[::1] s, double[::1] g, bint naive, double eta):
    """One sequential sweep of the mean-field equations in the natural order, in place.

    Parameters
    ----------
    P : (n, n) symmetric
        Ensemble: K⁻¹.  Naive: K.
    lam : (n,)
        λ_j: ensemble 1/[K⁻¹]_jj (MF eq. (5)); naive K_jj (MF eq. (9)).
    y, m0 : (n,)
        Labels ±1 and the prior mean.
    s, g : (n,)
        State, updated in place, with the invariant g = P s.
        Ensemble: s = ⟨a⟩ − m0 and the cavity mean is m_j = m0_j + s_j − λ_j g_j
        (MF eq. (5): m_j = −λ_j Σ_{i≠j} [K⁻¹]_ji ⟨a_i⟩); the update sets s_j to the mean of
        q_j ∝ Θ(y_j a) N(a | m_j, λ_j) − m0_j: exact coordinate descent of the free energy (7).
        Naive: s = y ∘ α, g = K s and m_j = m0_j + g_j − K_jj s_j = m0_j + Σ_{i≠j} K_ji y_i α_i;
        the update sets s_j = y_j α_j with α_j = r(z_j)/√K_jj, z_j = y_j m_j/√K_jj (MF eq. (9)).
    naive : bool
    eta : float
        Damping: s_j ← s_j + eta (s_j^new − s_j).

    Returns
    -------
    float
        max_j |change of s_j| in this sweep.
    """
    cdef Py_ssize_t i, j, n = s.shape[0]
    cdef double m, sd, z, r, target, ds, biggest = 0.0
    with nogil:
        for j in range(n):
            sd = sqrt(lam[j])
            if naive:
                m = m0[j] + g[j] - lam[j] * s[j]
            else:
                m = m0[j] + s[j] - lam[j] * g[j]
            z = y[j] * m / sd
            r = inv_mills(z)
            if naive:
                target = y[j] * r / sd
            else:
                target = m + y[j] * sd * r - m0[j]
            ds = eta * (target - s[j])
            if ds != 0.0:
                s[j] += ds
                for i in range(n):
                    g[i] += P[j, i] * ds
            if fabs(ds) > biggest:
                biggest = fabs(ds)
    return biggest


def symv_lower(const double[:, ::1] C, const double[::1] x, double[::1] out, int a):
    """out[:a] = C[:a, :a] x[:a] from the lower triangle of C (C order)."""
    cdef int n = C.shape[1], inc = 1
    cdef char uplo = b'U'
    cdef double one = 1.0, zero = 0.0
    if a <= 0:
        return
    with nogil:
        dsymv(&uplo, &a, &one, <double*> &C[0, 0], &n, <double*> &x[0], &inc, &zero, &out[0], &inc)


def syr_lower(double[:, ::1] C, const double[::1] x, double k, int a):
    """C[:a, :a] += k x[:a] x[:a]ᵀ on the lower triangle of C (C order)."""
    cdef int n = C.shape[1], inc = 1
    cdef char uplo = b'U'
    if a <= 0:
        return
    with nogil:
        dsyr(&uplo, &a, &k, <double*> &x[0], &inc, &C[0, 0], &n)
