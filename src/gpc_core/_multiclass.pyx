# cython: language_level=3
"""RMGPC's sequential ψ̃ᵢ sweep (RMGPC §3.2, eq. (15)) as one typed loop.

The ψ̃ᵢ factors of the outlier prior must be refined one after another (each changes the Beta
posterior the next cavity is taken from), so the loop cannot be vectorised.  In Python each step
costs a dozen scalar scipy calls; profiled on new-thyroid it was 60 % of an RMGPC fit.  The maths is
the one in ``gpc.multiclass.ep._beta_projection`` (docs/derivations-rmgpc.md, "ψ̃ᵢ").
"""

from libc.math cimport exp, log, fabs
from scipy.special.cython_special cimport psi


cdef double trigamma(double x) noexcept nogil:
    """ψ′(x) for x > 0: the recurrence ψ′(x) = ψ′(x + 1) + 1/x² up to x ≥ 10, then the asymptotic
    series 1/x + 1/(2x²) + 1/(6x³) − 1/(30x⁵) + 1/(42x⁷) − 1/(30x⁹) + 5/(66x¹¹) (the first omitted
    term, 691/(2730x¹³), is below 3e-14 at x ≥ 10)."""
    cdef double acc = 0.0, x2, ix
    while x < 10.0:
        acc += 1.0 / (x * x)
        x += 1.0
    ix = 1.0 / x
    x2 = ix * ix
    return acc + ix + 0.5 * x2 + ix * x2 * (1.0 / 6.0 - x2 * (1.0 / 30.0 - x2 * (1.0 / 42.0 - x2 * (1.0 / 30.0 - x2 * 5.0 / 66.0))))


def trigamma_py(double x):
    """ψ′(x), for the tests (compared with scipy's ζ(2, x))."""
    if not x > 0:
        raise ValueError("trigamma needs x > 0")
    return trigamma(x)


cdef void beta_projection(double a_c, double b_c, double w1, double* a_out, double* b_out) noexcept nogil:
    """KL projection of w₁ Beta(a_c + 1, b_c) + (1 − w₁) Beta(a_c, b_c + 1) onto a Beta: match
    E log ρ and E log(1 − ρ) by Newton's method from the E ρ, E ρ² match."""
    cdef double s = a_c + b_c
    cdef double t1 = psi(a_c) + w1 / a_c - psi(s + 1.0)
    cdef double t2 = psi(b_c) + (1.0 - w1) / b_c - psi(s + 1.0)
    cdef double m1 = (a_c + w1) / (s + 1.0)
    cdef double m2 = (a_c + 1.0) * (a_c + 2.0 * w1) / ((s + 1.0) * (s + 2.0))
    cdef double s_new = (m1 - m2) / (m2 - m1 * m1)
    cdef double a = m1 * s_new, b = (1.0 - m1) * s_new
    cdef double dab, r1, r2, ta, tb, tab, det, da, db, step
    cdef int it
    for it in range(8):
        dab = psi(a + b)
        r1 = psi(a) - dab - t1
        r2 = psi(b) - dab - t2
        ta = trigamma(a)
        tb = trigamma(b)
        tab = trigamma(a + b)
        det = (ta - tab) * (tb - tab) - tab * tab
        da = ((tb - tab) * r1 + tab * r2) / det
        db = (tab * r1 + (ta - tab) * r2) / det
        step = 1.0
        while a - step * da <= 0 or b - step * db <= 0:
            step *= 0.5
        a -= step * da
        b -= step * db
        if fabs(da) < 1e-12 * a and fabs(db) < 1e-12 * b:
            break
    a_out[0] = a
    b_out[0] = b


def refine_outlier_prior(const double[::1] lam_rest, double[::1] alpha, double[::1] beta,
                         double[::1] lam_i, double a, double b, double damping):
    """One sequential pass over the ψ̃ᵢ; updates alpha, beta, lam_i in place, returns the new (a, b).

    Cavity Beta(a − αᵢ, b − βᵢ) and Bernoulli of log-odds ``lam_rest[i]`` (Σ_k λᵢₖ); the refined
    Bernoulli factor is logit(ρ̄_c) exactly, the Beta part is :c:func:`beta_projection`'s; every new
    site is damped, ε · refined + (1 − ε) · old.
    """
    cdef Py_ssize_t i, n = lam_rest.shape[0]
    cdef double a_c, b_c, rbar, p_c, w1, a_new = 0.0, b_new = 0.0, e = damping
    if alpha.shape[0] != n or beta.shape[0] != n or lam_i.shape[0] != n:
        raise ValueError("lam_rest, alpha, beta and lam_i must have the same length")
    with nogil:
        for i in range(n):
            a_c = a - alpha[i]
            b_c = b - beta[i]
            if a_c <= 0 or b_c <= 0:
                continue
            rbar = a_c / (a_c + b_c)
            p_c = 1.0 / (1.0 + exp(-lam_rest[i]))
            w1 = p_c * rbar / (p_c * rbar + (1.0 - p_c) * (1.0 - rbar))
            beta_projection(a_c, b_c, w1, &a_new, &b_new)
            alpha[i] = e * (a_new - a_c) + (1.0 - e) * alpha[i]
            beta[i] = e * (b_new - b_c) + (1.0 - e) * beta[i]
            lam_i[i] = e * (log(rbar) - log(1.0 - rbar)) + (1.0 - e) * lam_i[i]
            a = a_c + alpha[i]
            b = b_c + beta[i]
    return a, b


def beta_projection_py(double a_c, double b_c, double w1):
    """(a, b) of :c:func:`beta_projection`, for the tests."""
    cdef double a = 0.0, b = 0.0
    if not (a_c > 0 and b_c > 0 and 0.0 <= w1 <= 1.0):
        raise ValueError("beta_projection needs a_c > 0, b_c > 0 and 0 <= w1 <= 1")
    beta_projection(a_c, b_c, w1, &a, &b)
    return a, b
