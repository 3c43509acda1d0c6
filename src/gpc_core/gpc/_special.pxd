# The special functions of the Gaussian and logistic integrals, once, as `cdef inline` functions
# that every compiled module cimports (`from gpc._special cimport inv_mills, ...`); gpc._special
# (src/gpc_core/_special.pyx) gives the Python layers vectorised entry points to the same code.
#
# All are `noexcept nogil` and finite for every finite argument unless stated:
#   norm_pdf(z)          φ(z) = exp(−z²/2)/√(2π)
#   norm_cdf(z)          Φ(z) (scipy's ndtr)
#   log_norm_cdf(z)      log Φ(z) (scipy's log_ndtr: an asymptotic series below z = −20, no underflow)
#   inv_mills(z)         r(z) = φ(z)/Φ(z), the inverse Mills ratio: √(2/π)/erfcx(−z/√2), which has
#                        no 0/0 and no cancellation anywhere (erfcx(x) = e^{x²} erfc(x) is evaluated
#                        by scipy's Faddeeva code, a continued fraction for large x); r ≈ −z − 1/z
#                        for z ≪ 0, and r = 0 above z ≈ 37.5 (true value < 1e-300)
#   z_plus_inv_mills(z)  z + r(z) > 0: below z = −5 the two terms cancel (a loss of log10 z² digits),
#                        so there it is Laplace's continued fraction for the Mills ratio,
#                        z + r(z) = 1/(t + 1/(t + 2/(t + 3/(t + ...)))), t = −z, evaluated backwards
#                        from depth 80
#   log1pexp(x)          log(1 + eˣ) = softplus(x), no overflow
#   log_sigmoid(x)       log σ(x) = −log1pexp(−x)
#   sigmoid(x)           σ(x) = 1/(1 + e⁻ˣ), no overflow
#   logaddexp(a, b)      log(eᵃ + eᵇ), with −inf arguments allowed
#
# The constants are C macros (a .pxd cannot hold initialised module variables), so each module
# compiles in the same values.

from libc.math cimport exp, log1p, isinf
from scipy.special.cython_special cimport erfcx, log_ndtr, ndtr

cdef extern from *:
    """
    #define GPC_SQRT2 1.4142135623730950488
    #define GPC_SQRT_2_OVER_PI 0.79788456080286535588
    #define GPC_LOG_SQRT_2PI 0.91893853320467274178
    #define GPC_INV_SQRT_2PI 0.39894228040143267794
    #define GPC_CF_SWITCH (-5.0)
    #define GPC_CF_DEPTH 80
    """
    const double SQRT2 "GPC_SQRT2"                    # √2
    const double SQRT_2_OVER_PI "GPC_SQRT_2_OVER_PI"  # √(2/π)
    const double LOG_SQRT_2PI "GPC_LOG_SQRT_2PI"      # ½ log 2π
    const double INV_SQRT_2PI "GPC_INV_SQRT_2PI"      # 1/√(2π)
    const double CF_SWITCH "GPC_CF_SWITCH"            # below it, z + r(z) by the continued fraction
    const int CF_DEPTH "GPC_CF_DEPTH"


cdef inline double norm_pdf(double z) noexcept nogil:
    return exp(-0.5 * z * z - LOG_SQRT_2PI)


cdef inline double norm_cdf(double z) noexcept nogil:
    return ndtr(z)


cdef inline double log_norm_cdf(double z) noexcept nogil:
    return log_ndtr(z)


cdef inline double inv_mills(double z) noexcept nogil:
    return SQRT_2_OVER_PI / erfcx(-z / SQRT2)


cdef inline double z_plus_inv_mills(double z) noexcept nogil:
    cdef double t, k = 0.0
    cdef int j
    if z >= CF_SWITCH:
        return z + inv_mills(z)
    t = -z
    for j in range(CF_DEPTH, 1, -1):
        k = j / (t + k)
    return 1.0 / (t + k)


cdef inline double log1pexp(double x) noexcept nogil:
    if x > 0.0:
        return x + log1p(exp(-x))
    return log1p(exp(x))


cdef inline double log_sigmoid(double x) noexcept nogil:
    return -log1pexp(-x)


cdef inline double sigmoid(double x) noexcept nogil:
    cdef double e
    if x >= 0.0:
        return 1.0 / (1.0 + exp(-x))
    e = exp(x)
    return e / (1.0 + e)


cdef inline double logaddexp(double a, double b) noexcept nogil:
    if isinf(a) and a < 0:
        return b
    if isinf(b) and b < 0:
        return a
    if a > b:
        return a + log1p(exp(b - a))
    return b + log1p(exp(a - b))
