# Per-datum likelihood integrals, included (textually) by every Cython module that needs them:
# gpc._likelihoods wraps them for Python, gpc._sweeps calls them inside its site loops.  (A cimport
# across modules would need the .pxd under the package name; an include keeps one source.)
#
# A likelihood is described to C code by a LikelihoodSpec: its kind, its parameter (eps of the
# noisy threshold, PL eq. (3)) and, for integrals without closed forms, probabilists' Gauss-Hermite
# nodes x_k and weights w_k normalised so that sum_k w_k = 1, i.e. E[g(f)] ~ sum_k w_k g(m + sqrt(v) x_k)
# for f ~ N(m, v).  Labels y are -1.0 or +1.0.  The int functions return 0 on success and a
# non-zero status when the result is not representable.

cdef enum:
    LIK_PROBIT = 0
    LIK_LOGIT = 1
    LIK_NOISY_THRESHOLD = 2
    LIK_HEAVISIDE = 3

ctypedef struct LikelihoodSpec:
    int kind
    double eps
    int gh_order
    const double* gh_nodes
    const double* gh_weights

## p(y|f), y in {-1, +1}:
#   probit           Phi(y f)                                   (PL eq. (1), NR eq. (1))
#   logit            1 / (1 + exp(-y f))                         (PL eq. (2))
#   noisy threshold  eps + (1 - 2 eps) H(y f)                    (PL eq. (3))
#   Heaviside        H(y f)  (eps = 0; MF paper)
# Closed forms where they exist; Gauss-Hermite (probabilists' nodes, weights summing to one)
# otherwise.  Everything is evaluated in log space where a ratio or a tail could under/overflow:
# phi(z)/Phi(z) = sqrt(2/pi) / erfcx(-z/sqrt(2)) is finite for every finite z.

from libc.math cimport exp, log, log1p, sqrt, fabs, INFINITY, M_PI
from scipy.special.cython_special cimport log_ndtr, ndtr, erfcx

cdef double SQRT2 = 1.4142135623730951
cdef double LOG_SQRT_2PI = 0.9189385332046727

# Gauss-Legendre rule on [-1, 1] for the logit correction integrals (filled at import).
DEF GL_ORDER = 12
cdef double GL_X[GL_ORDER]
cdef double GL_W[GL_ORDER]
import numpy as _np
_glx, _glw = _np.polynomial.legendre.leggauss(GL_ORDER)
for _k in range(GL_ORDER):
    GL_X[_k] = _glx[_k]
    GL_W[_k] = _glw[_k]
# Panels [a, b] of |u| for the correction c(u) = sigma(u) - H(u), which decays like e^-|u|;
# beyond 40, |c| < 5e-18.
DEF N_PANELS = 7
cdef double PANEL_EDGES[N_PANELS + 1]
for _k, _e in enumerate((0.0, 1.0, 2.0, 4.0, 8.0, 14.0, 24.0, 40.0)):
    PANEL_EDGES[_k] = _e
#: cavity variance above which the logit tilted moments use the step + correction split
cdef double LOGIT_SPLIT_VAR = 1.0


cdef inline double inv_mills(double z) noexcept nogil:
    """phi(z) / Phi(z), stable for all z (erfcx(x) = exp(x^2) erfc(x))."""
    return sqrt(2.0 / M_PI) / erfcx(-z / SQRT2)


cdef inline double log_phi(double z) noexcept nogil:
    return -0.5 * z * z - LOG_SQRT_2PI


cdef inline double log_sigmoid(double z) noexcept nogil:
    """log(1 / (1 + exp(-z))) without overflow."""
    if z >= 0:
        return -log1p(exp(-z))
    return z - log1p(exp(z))


cdef inline double sigmoid(double z) noexcept nogil:
    cdef double e
    if z >= 0:
        return 1.0 / (1.0 + exp(-z))
    e = exp(z)
    return e / (1.0 + e)


cdef inline double log_add_exp(double a, double b) noexcept nogil:
    if a == -INFINITY:
        return b
    if b == -INFINITY:
        return a
    if a > b:
        return a + log1p(exp(b - a))
    return b + log1p(exp(a - b))


# --- Laplace: log p and its first three derivatives in f (R&W §3.4, Alg. 5.1) ------------------

cdef int log_prob_derivs(int kind, double y, double f, double* lp, double* d1, double* d2,
                         double* d3) noexcept nogil:
    cdef double z = y * f, r, s, w
    if kind == LIK_PROBIT:
        # g(z) = log Phi(z): g' = r, g'' = -r (z + r), g''' = r (z^2 + 3 z r + 2 r^2 - 1)
        r = inv_mills(z)
        lp[0] = log_ndtr(z)
        d1[0] = y * r
        d2[0] = -r * (z + r)
        d3[0] = y * r * (z * z + 3.0 * z * r + 2.0 * r * r - 1.0)
        return 0
    if kind == LIK_LOGIT:
        # g(z) = log sigma(z): g' = sigma(-z), g'' = -sigma(z) sigma(-z), g''' = g'' (1 - 2 sigma(z))
        s = sigmoid(z)
        w = s * sigmoid(-z)
        lp[0] = log_sigmoid(z)
        d1[0] = y * sigmoid(-z)
        d2[0] = -w
        d3[0] = -y * w * (1.0 - 2.0 * s)
        return 0
    return -1


# --- EP / ADF: tilted moments against a Gaussian cavity ----------------------------------------

cdef int tilted_moments(const LikelihoodSpec* spec, double y, double cav_mean, double cav_var,
                        double* log_z, double* mean, double* var) noexcept nogil:
    cdef double z, r, a, s, lz, lzk, m1, m2, fk, pk, lmax
    cdef int k
    if not (cav_var > 0.0):
        return 1
    if spec.kind == LIK_PROBIT:
        # Z = Phi(z), z = y m / sqrt(1 + v)  (R&W eq. (3.58)); moments from d log Z / d m
        s = sqrt(1.0 + cav_var)
        z = y * cav_mean / s
        r = inv_mills(z)
        log_z[0] = log_ndtr(z)
        mean[0] = cav_mean + y * cav_var * r / s
        var[0] = cav_var - cav_var * cav_var * r * (z + r) / (1.0 + cav_var)
        return 0
    if spec.kind == LIK_NOISY_THRESHOLD or spec.kind == LIK_HEAVISIDE:
        # Z = eps + (1 - 2 eps) Phi(z), z = y m / sqrt(v); a = (1 - 2 eps) phi(z) / Z
        s = sqrt(cav_var)
        z = y * cav_mean / s
        if spec.kind == LIK_HEAVISIDE or spec.eps == 0.0:
            lz = log_ndtr(z)
            a = inv_mills(z)
        else:
            lz = log_add_exp(log(spec.eps), log1p(-2.0 * spec.eps) + log_ndtr(z))
            a = exp(log1p(-2.0 * spec.eps) + log_phi(z) - lz)
        if lz == -INFINITY:
            return 2
        log_z[0] = lz
        mean[0] = cav_mean + y * s * a
        var[0] = cav_var * (1.0 - a * (z + a))
        if var[0] <= 0.0:   # rounding in the far tail, where the tilted variance is ~ v / z^2
            var[0] = cav_var / (z * z + 2.0) if z < 0 else cav_var
        return 0
    if spec.kind == LIK_LOGIT:
        if cav_var > LOGIT_SPLIT_VAR and y * cav_mean + cav_var > -30.0:
            return logit_tilted_split(y, cav_mean, cav_var, log_z, mean, var)
        # Gauss-Hermite in log space: p_k ∝ w_k sigma(y f_k), f_k = m + sqrt(v) x_k.  For a
        # cavity variance <= 4 the integrand is smooth on the scale of the nodes.
        s = sqrt(cav_var)
        lmax = -INFINITY
        for k in range(spec.gh_order):
            lzk = log(spec.gh_weights[k]) + log_sigmoid(y * (cav_mean + s * spec.gh_nodes[k]))
            if lzk > lmax:
                lmax = lzk
        lz = 0.0
        m1 = 0.0
        m2 = 0.0
        for k in range(spec.gh_order):
            fk = s * spec.gh_nodes[k]           # centred at the cavity mean for accuracy
            pk = exp(log(spec.gh_weights[k]) + log_sigmoid(y * (cav_mean + fk)) - lmax)
            lz += pk
            m1 += pk * fk
            m2 += pk * fk * fk
        m1 /= lz
        m2 /= lz
        log_z[0] = lmax + log(lz)
        mean[0] = cav_mean + m1
        var[0] = m2 - m1 * m1
        if not (var[0] > 0.0):
            return 3
        return 0
    return -1


cdef int logit_tilted_split(double y, double cav_mean, double cav_var, double* log_z,
                            double* mean, double* var) noexcept nogil:
    """Logit tilted moments for a wide cavity: sigma(u) = H(u) + c(u), u = y f ~ N(m, v).

    The step part has closed-form truncated-normal moments; c(u) = sigma(u) - H(u) is concentrated
    within |u| < 40, where N(u | m, v) is smooth on the scale sqrt(v) > 2, so composite
    Gauss-Legendre on panels of |u| integrates it to rounding.  Moments are taken about m:
    M_k = E[(u - m)^k sigma(u)].
    """
    cdef double m = y * cav_mean, s = sqrt(cav_var), z = m / s
    cdef double Phi = ndtr(z), phi = exp(log_phi(z))
    cdef double Z = Phi, M1 = s * phi, M2 = cav_var * (Phi - z * phi)
    cdef double a, b, half, mid, u, c, w, d
    cdef int p, k, side
    for side in range(2):
        for p in range(N_PANELS):
            a = PANEL_EDGES[p]
            b = PANEL_EDGES[p + 1]
            half = 0.5 * (b - a)
            mid = 0.5 * (a + b)
            for k in range(GL_ORDER):
                u = mid + half * GL_X[k]
                if side == 0:
                    c = -sigmoid(-u)         # u > 0: sigma(u) - 1
                else:
                    u = -u
                    c = sigmoid(u)           # u < 0: sigma(u) - 0
                d = u - m
                w = half * GL_W[k] * c * exp(log_phi(d / s)) / s
                Z += w
                M1 += w * d
                M2 += w * d * d
    if not (Z > 0.0):
        return 2
    log_z[0] = log(Z)
    mean[0] = cav_mean + y * M1 / Z
    var[0] = M2 / Z - (M1 / Z) * (M1 / Z)
    if not (var[0] > 0.0):
        return 3
    return 0


# --- PL: statistical linear regression moments (PL eq. (15)-(16), supplement) ------------------

cdef int slr_moments(const LikelihoodSpec* spec, double mean, double var,
                     double* mu_y, double* cov_fy, double* var_y) noexcept nogil:
    cdef double s, z, c, e1, e2, fk, sk
    cdef int k
    if not (var > 0.0):
        return 1
    if spec.kind == LIK_PROBIT:
        # E(y|f) = 2 Phi(f) - 1; E[Phi(f)] = Phi(m / sqrt(1 + v)); Cov[f, g(f)] = v E[g'(f)] (Stein)
        s = sqrt(1.0 + var)
        z = mean / s
        mu_y[0] = 2.0 * ndtr(z) - 1.0
        cov_fy[0] = 2.0 * var * exp(log_phi(z)) / s
    elif spec.kind == LIK_NOISY_THRESHOLD or spec.kind == LIK_HEAVISIDE:
        # E(y|f) = (1 - 2 eps) sign(f); Cov[f, sign f] = 2 v N(0 | m, v)
        c = 1.0 if spec.kind == LIK_HEAVISIDE else 1.0 - 2.0 * spec.eps
        s = sqrt(var)
        z = mean / s
        mu_y[0] = c * (2.0 * ndtr(z) - 1.0)
        cov_fy[0] = 2.0 * c * s * exp(log_phi(z))
    elif spec.kind == LIK_LOGIT:
        # E(y|f) = 2 sigma(f) - 1; its derivative is 2 sigma(f) sigma(-f)
        s = sqrt(var)
        e1 = 0.0
        e2 = 0.0
        for k in range(spec.gh_order):
            fk = mean + s * spec.gh_nodes[k]
            sk = sigmoid(fk)
            e1 += spec.gh_weights[k] * (2.0 * sk - 1.0)
            e2 += spec.gh_weights[k] * 2.0 * sk * sigmoid(-fk)
        mu_y[0] = e1
        cov_fy[0] = var * e2
    else:
        return -1
    # a label in {-1, +1} has y^2 = 1, so Var[y] = 1 - E[y]^2 (docs/derivations.md)
    var_y[0] = 1.0 - mu_y[0] * mu_y[0]
    return 0


# --- KL / VB / SVI: expected log-likelihood under N(m, v) and its derivatives ------------------

cdef int expected_log_prob(const LikelihoodSpec* spec, double y, double m, double v,
                           double* e, double* de_dm, double* de_dv) noexcept nogil:
    cdef double s, z, lp, d1, d2, d3, fk, diff
    cdef int k
    if not (v > 0.0):
        return 1
    if spec.kind == LIK_NOISY_THRESHOLD:
        # E = log(1-eps) Phi(z) + log(eps) Phi(-z), z = y m / sqrt(v)
        s = sqrt(v)
        z = y * m / s
        diff = log1p(-spec.eps) - log(spec.eps)
        e[0] = log(spec.eps) + diff * ndtr(z)
        de_dm[0] = diff * exp(log_phi(z)) * y / s
        de_dv[0] = -diff * exp(log_phi(z)) * z / (2.0 * v)
        return 0
    if spec.kind != LIK_PROBIT and spec.kind != LIK_LOGIT:
        return -1
    # Gauss-Hermite; d/dm E[g] = E[g'], d/dv E[g] = E[g''] / 2 (Bonnet's and Price's theorems)
    s = sqrt(v)
    e[0] = 0.0
    de_dm[0] = 0.0
    de_dv[0] = 0.0
    for k in range(spec.gh_order):
        fk = m + s * spec.gh_nodes[k]
        log_prob_derivs(spec.kind, y, fk, &lp, &d1, &d2, &d3)
        e[0] += spec.gh_weights[k] * lp
        de_dm[0] += spec.gh_weights[k] * d1
        de_dv[0] += spec.gh_weights[k] * 0.5 * d2
    return 0


# --- prediction: P(y = +1) = integral of p(+1|f) N(f | m, v) ---------------------------------

cdef double predictive_positive(const LikelihoodSpec* spec, double m, double v) noexcept nogil:
    cdef double s, acc
    cdef int k
    if spec.kind == LIK_PROBIT:
        return ndtr(m / sqrt(1.0 + v))
    if spec.kind == LIK_NOISY_THRESHOLD or spec.kind == LIK_HEAVISIDE:
        if v <= 0.0:
            acc = 1.0 if m > 0 else 0.0
        else:
            acc = ndtr(m / sqrt(v))
        if spec.kind == LIK_HEAVISIDE:
            return acc
        return spec.eps + (1.0 - 2.0 * spec.eps) * acc
    s = sqrt(v) if v > 0 else 0.0
    acc = 0.0
    for k in range(spec.gh_order):
        acc += spec.gh_weights[k] * sigmoid(m + s * spec.gh_nodes[k])
    return acc


