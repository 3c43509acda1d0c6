# gpc._likelihoods: the per-datum likelihood integrals (formulas in docs/derivations.md, "Likelihood
# moments") as `nogil` C functions declared in gpc/_likelihoods.pxd, which the site rule and the
# sweeps cimport, and their vectorised Python entry points (wrapped by gpc.likelihoods).  The module
# state (the Gauss-Laguerre tables, the logit split variance) exists here only.
#
# A likelihood of kind LIK_PYTHON (a user's subclass of gpc.likelihoods.Likelihood) is evaluated by
# its own Python methods, called with the GIL, so every engine that takes a LikelihoodSpec takes it.

from libc.math cimport exp, log, log1p, sqrt, isfinite, INFINITY, NAN
from gpc._special cimport (LOG_SQRT_2PI, inv_mills, z_plus_inv_mills, log_sigmoid, sigmoid,
                          logaddexp, norm_pdf, norm_cdf, log_norm_cdf)

import numpy as np

# Logit with a wide Gaussian: Gauss-Hermite cannot resolve the unit-scale transition of sigma(t)
# when sqrt(v) >> 1 (poles of sigma at +-i pi are pi/sqrt(v) from the real axis in GH's variable).
# Above LOGIT_SPLIT_VAR we write sigma(t) = H(t) + d(t): the step part is closed form and the
# remainder d (odd, |d| ~ e^-|t|) is integrated by Gauss-Laguerre (docs/derivations.md).
# Measured max error vs quad (means in [-5, 5]): 48 nodes 1.4e-9 at v = 1, 64 nodes 5e-11,
# 96 nodes 7e-14 (quad level) for every v >= 1, so 96.
cdef enum:
    LAG_N = 96
cdef double LAG_X[LAG_N]
cdef double LAG_W[LAG_N]
cdef double LOGIT_SPLIT_VAR = 1.0

def _init_laguerre():
    x, w = np.polynomial.laguerre.laggauss(LAG_N)
    for i in range(LAG_N):
        LAG_X[i] = x[i]
        LAG_W[i] = w[i]

_init_laguerre()


# ----------------------------------------------------------------------------- scalar helpers

cdef inline bint bad_var(double v) noexcept nogil:
    return not (v > 0.0 and isfinite(v))


cdef inline double gauss_pdf(double t, double a, double v, double sd) noexcept nogil:
    return exp(-0.5 * (t - a) * (t - a) / v - LOG_SQRT_2PI) / sd


cdef void logit_split_direct(double a, double v, double* j0, double* j1, double* j2) noexcept nogil:
    # J_k = int sigma(t) (t - a)^k N(t | a, v) dt, k = 0, 1, 2, via sigma = H + d:
    #   step part: Phi(z), s phi(z), v (Phi(z) - z phi(z)), z = a / s;
    #   remainder: int_0^inf sigma(-t) [g(-t) - g(t)] dt = sum_j W_j [g(-t_j) - g(t_j)] / (1 + e^-t_j)
    #   (Gauss-Laguerre: e^t sigma(-t) = 1 / (1 + e^-t)).
    # Accurate where the Gaussian reaches the transition at t = 0 (|a| <= v/2 with v > 1): far out, a
    # narrow Gaussian falls between the Laguerre nodes, so logit_tilted() uses it only there.
    cdef double sd = sqrt(v), z = a / sd, ph = norm_pdf(z), cdf = norm_cdf(z)
    cdef double t, wg, gm, gp, dm, dp
    cdef int j
    j0[0] = cdf
    j1[0] = sd * ph
    j2[0] = v * (cdf - z * ph)
    for j in range(LAG_N):
        t = LAG_X[j]
        wg = LAG_W[j] / (1.0 + exp(-t))
        gm = gauss_pdf(-t, a, v, sd)
        gp = gauss_pdf(t, a, v, sd)
        dm = -t - a
        dp = t - a
        j0[0] += wg * (gm - gp)
        j1[0] += wg * (dm * gm - dp * gp)
        j2[0] += wg * (dm * dm * gm - dp * dp * gp)


cdef void logit_tilted_right(double a, double v, double* log_z, double* e1, double* var) noexcept nogil:
    # logit_tilted() for a >= -v/2.  Beyond a > v/2 the complement sigma(t) = 1 - sigma(-t) with
    #   sigma(-t) N(t | a, v) = eps sigma(t) N(t | c, v),   eps = e^(v/2 - a),  c = a - v
    # gives, with A_k = J_k(c):  Z = 1 - eps A_0,  E[t - a] = -eps B / Z,  B = A_1 - v A_0,
    #   v - Var[t] = eps (C - v A_0) / Z + E[t - a]^2,  C = A_2 - 2 v A_1 + v^2 A_0,
    # so the (tiny) variance reduction, which EP turns into a site precision, has no cancellation.
    # The A_k only need relative accuracy, which the direct split has for every c >= -v/2.
    cdef double j0, j1, j2, eps, z, b, c
    if a <= 0.5 * v:
        logit_split_direct(a, v, &j0, &j1, &j2)
        log_z[0] = log(j0)
        e1[0] = j1 / j0
        var[0] = j2 / j0 - e1[0] * e1[0]
        return
    logit_split_direct(a - v, v, &j0, &j1, &j2)
    eps = exp(0.5 * v - a)
    z = 1.0 - eps * j0
    b = j1 - v * j0
    c = j2 - 2.0 * v * j1 + v * v * j0
    log_z[0] = log1p(-eps * j0)
    e1[0] = -eps * b / z
    var[0] = v - (eps * (c - v * j0) / z + e1[0] * e1[0])


cdef void logit_tilted(double a, double v, double* log_z, double* e1, double* var) noexcept nogil:
    # Tilted moments of sigma(t) N(t | a, v) for v > LOGIT_SPLIT_VAR: log Z, E[t] - a and Var[t],
    # accurate for every a (docs/derivations.md, "logit far from the transition").  For a < -v/2
    # the reflection sigma(t) N(t | a, v) = e^(a + v/2) sigma(-t) N(t | a + v, v) turns the problem
    # into the mirror image at a' = -(a + v) > -v/2, and log Z is carried in log space (no underflow).
    cdef double lz, m
    if a >= -0.5 * v:
        logit_tilted_right(a, v, log_z, e1, var)
        return
    logit_tilted_right(-(a + v), v, &lz, &m, var)
    log_z[0] = a + 0.5 * v + lz
    e1[0] = v - m


cdef double logit_split_elog(double a, double v) noexcept nogil:
    # E[log sigma(t)], t ~ N(a, v), via log sigma(t) = min(t, 0) - log1p(e^-|t|):
    #   E[min(t, 0)] = a Phi(-z) - s phi(z);  the even remainder by Gauss-Laguerre on [0, inf).
    cdef double sd = sqrt(v), z = a / sd, acc, t
    cdef int j
    acc = a * norm_cdf(-z) - sd * norm_pdf(z)
    for j in range(LAG_N):
        t = LAG_X[j]
        acc -= LAG_W[j] * exp(t) * log1p(exp(-t)) * (gauss_pdf(t, a, v, sd) + gauss_pdf(-t, a, v, sd))
    return acc


# ----------------------------------------------------------------------------- Python likelihoods

# The methods of a Python Likelihood that C code calls, by index; each is called with 1-element
# arrays and returns n_out arrays (predictive_probability: one array).
cdef tuple PY_METHODS = ("log_prob", "log_prob_derivatives", "tilted_moments", "slr_moments",
                         "expected_log_prob", "predictive_probability")
cdef enum:
    PY_LOG_PROB = 0
    PY_DERIVATIVES = 1
    PY_TILTED = 2
    PY_SLR = 3
    PY_EXPECTED = 4
    PY_PREDICTIVE = 5


cdef int py_call(const LikelihoodSpec* spec, int method, bint labelled, double y, double a,
                 double b, int n_args, int n_out, double* out) noexcept nogil:
    """One datum through a method of a Python Likelihood: arguments (y,) a[, b], results in out[:n_out].

    Any exception of the user's code becomes status 2 (the caller names the site).
    """
    cdef int k
    with gil:
        try:
            args = [np.array([a]), np.array([b])][:n_args]
            if labelled:
                args.insert(0, np.array([y]))
            res = getattr(<object> spec.py_likelihood, PY_METHODS[method])(*args)
            if n_out == 1 and method != PY_LOG_PROB and method != PY_PREDICTIVE:
                res = res[0]
            if n_out == 1:
                out[0] = float(np.asarray(res, dtype=float).ravel()[0])
            else:
                for k in range(n_out):
                    out[k] = float(np.asarray(res[k], dtype=float).ravel()[0])
        except Exception:
            return 2
    return 0


cdef int py_call3(const LikelihoodSpec* spec, int method, bint labelled, double y, double a,
                  double b, double* o1, double* o2, double* o3) noexcept nogil:
    """py_call for the methods with three results."""
    cdef double out[3]
    if py_call(spec, method, labelled, y, a, b, 2, 3, out) != 0:
        return 2
    o1[0], o2[0], o3[0] = out[0], out[1], out[2]
    return 0


# ----------------------------------------------------------------------------- log p and derivatives

cdef double log_prob(const LikelihoodSpec* spec, double y, double f) noexcept nogil:
    cdef double t = y * f
    cdef double out = NAN
    if spec.kind == LIK_PYTHON:
        py_call(spec, PY_LOG_PROB, True, y, f, 0.0, 1, 1, &out)
        return out
    if spec.kind == LIK_PROBIT:
        return log_norm_cdf(t)                                 # PL eq. (1)
    if spec.kind == LIK_LOGIT:
        return log_sigmoid(t)                              # PL eq. (2)
    # PL eq. (3), with H(0) = 1/2 so that p(+1|0) + p(-1|0) = 1.
    if t > 0.0:
        return log(1.0 - spec.eps) if spec.kind == LIK_NOISY_THRESHOLD else 0.0
    if t < 0.0:
        return log(spec.eps) if spec.kind == LIK_NOISY_THRESHOLD else -INFINITY
    return log(0.5)


cdef int log_prob_derivatives(const LikelihoodSpec* spec, double y, double f,
                              double* lp, double* d1, double* d2, double* d3) noexcept nogil:
    # d^k/df^k g(y f) = y^k g^(k)(t), t = y f, y^2 = 1.
    cdef double t = y * f, r, zr, s, sm
    if not isfinite(f):
        return 1
    cdef double out[4]
    if spec.kind == LIK_PYTHON:
        if py_call(spec, PY_DERIVATIVES, True, y, f, 0.0, 1, 4, out) != 0:
            return 2
        lp[0], d1[0], d2[0], d3[0] = out[0], out[1], out[2], out[3]
        return 0
    if spec.kind == LIK_PROBIT:
        # g = log Phi, g' = r, g'' = -r (t + r), g''' = r [(t + r)(t + 2 r) - 1]   (R&W eq. (3.16))
        r = inv_mills(t)
        zr = z_plus_inv_mills(t)
        lp[0] = log_norm_cdf(t)
        d1[0] = y * r
        d2[0] = -r * zr
        d3[0] = y * r * (zr * (zr + r) - 1.0)
        return 0
    if spec.kind == LIK_LOGIT:
        # g = log sigma, g' = sigma(-t), g'' = -sigma(t) sigma(-t), g''' = g'' (1 - 2 sigma(t))
        s = sigmoid(t)
        sm = sigmoid(-t)
        lp[0] = log_sigmoid(t)
        d1[0] = y * sm
        d2[0] = -s * sm
        d3[0] = -y * s * sm * (sm - s)
        return 0
    return 1    # steps: gradient zero almost everywhere (PL Sec. I)


# ----------------------------------------------------------------------------- tilted moments (EP / ADF)

cdef int tilted_moments(const LikelihoodSpec* spec, double y, double cav_mean, double cav_var,
                        double* log_z, double* mean, double* var) noexcept nogil:
    cdef double z, r, zr, s, sd, lw, lmax, acc, pk, fk, m1, m2, la, a, lz
    cdef int k
    if bad_var(cav_var) or not isfinite(cav_mean):
        return 1
    if spec.kind == LIK_PYTHON:
        return py_call3(spec, PY_TILTED, True, y, cav_mean, cav_var, log_z, mean, var)
    if spec.kind == LIK_PROBIT:
        # R&W eq. (3.58): z = y m / sqrt(1 + v)
        s = sqrt(1.0 + cav_var)
        z = y * cav_mean / s
        r = inv_mills(z)
        log_z[0] = log_norm_cdf(z)
        mean[0] = cav_mean + y * cav_var * r / s
        var[0] = cav_var - cav_var * cav_var * r * z_plus_inv_mills(z) / (1.0 + cav_var)
    elif spec.kind == LIK_NOISY_THRESHOLD or spec.kind == LIK_HEAVISIDE:
        # PL eq. (3) under N(m, v); u = (f - m)/sqrt v, z = y m / sqrt v.
        # Z = eps + (1-2eps) Phi(z); E[u] = y a; Var[u] = 1 - a (z + a),
        # a = (1-2eps) phi(z) / Z (in log space).  eps = 0: a = r(z).
        sd = sqrt(cav_var)
        z = y * cav_mean / sd
        if spec.kind == LIK_HEAVISIDE:
            lz = log_norm_cdf(z)
            a = inv_mills(z)
            zr = z_plus_inv_mills(z)
        else:
            lz = logaddexp(log(spec.eps), log1p(-2.0 * spec.eps) + log_norm_cdf(z))
            la = log1p(-2.0 * spec.eps) - 0.5 * z * z - LOG_SQRT_2PI - lz
            a = exp(la)
            zr = z + a
        if lz == -INFINITY:
            return 2
        log_z[0] = lz
        mean[0] = cav_mean + sd * y * a
        var[0] = cav_var * (1.0 - a * zr)
    elif spec.kind == LIK_LOGIT and cav_var > LOGIT_SPLIT_VAR:
        # t = y f ~ N(y m, v): E[f] = m + y E[t - y m], Var[f] = Var[t]
        logit_tilted(y * cav_mean, cav_var, log_z, &a, var)
        mean[0] = cav_mean + y * a
    elif spec.kind == LIK_LOGIT:
        # Gauss-Hermite in log space: l_k = log w_k + log sigma(y f_k), f_k = m + sqrt(v) x_k.
        sd = sqrt(cav_var)
        lmax = -INFINITY
        for k in range(spec.gh_order):
            if spec.gh_weights[k] > 0.0:
                lw = log(spec.gh_weights[k]) + log_sigmoid(y * (cav_mean + sd * spec.gh_nodes[k]))
                if lw > lmax:
                    lmax = lw
        if lmax == -INFINITY:
            return 2
        acc = 0.0
        m1 = 0.0
        for k in range(spec.gh_order):
            if spec.gh_weights[k] > 0.0:
                pk = exp(log(spec.gh_weights[k]) + log_sigmoid(y * (cav_mean + sd * spec.gh_nodes[k])) - lmax)
                acc += pk
                m1 += pk * spec.gh_nodes[k]
        m1 /= acc
        m2 = 0.0
        for k in range(spec.gh_order):
            if spec.gh_weights[k] > 0.0:
                pk = exp(log(spec.gh_weights[k]) + log_sigmoid(y * (cav_mean + sd * spec.gh_nodes[k])) - lmax)
                m2 += pk * (spec.gh_nodes[k] - m1) * (spec.gh_nodes[k] - m1)
        m2 /= acc
        log_z[0] = lmax + log(acc)
        mean[0] = cav_mean + sd * m1
        var[0] = cav_var * m2
    else:
        return 1
    if not (isfinite(log_z[0]) and isfinite(mean[0]) and isfinite(var[0])) or var[0] < 0.0:
        return 2
    return 0


# ----------------------------------------------------------------------------- SLR moments (PL)

cdef int slr_moments(const LikelihoodSpec* spec, double mean, double var,
                     double* mu_y, double* cov_fy, double* var_y) noexcept nogil:
    # PL eq. (15)-(16) and supplement.  E(y|f) = 2 p(+1|f) - 1.  var_y = Var[y] = 1 - mu_y^2
    # = 4 P (1 - P) with P = P(y = +1), computed from P and 1 - P separately (no cancellation).
    cdef double z, s, sd, c, p, q, fk, sk, smk, e1
    cdef int k
    if bad_var(var) or not isfinite(mean):
        return 1
    if spec.kind == LIK_PYTHON:
        return py_call3(spec, PY_SLR, False, 0.0, mean, var, mu_y, cov_fy, var_y)
    if spec.kind == LIK_PROBIT:
        # P = Phi(z), z = m / sqrt(1 + v);  cov = 2 v / sqrt(1 + v) phi(z)   (R&W eq. (3.84))
        s = sqrt(1.0 + var)
        z = mean / s
        p = norm_cdf(z)
        q = norm_cdf(-z)
        mu_y[0] = p - q
        cov_fy[0] = 2.0 * var / s * norm_pdf(z)
        var_y[0] = 4.0 * p * q
    elif spec.kind == LIK_NOISY_THRESHOLD or spec.kind == LIK_HEAVISIDE:
        # E(y|f) = (1 - 2 eps) sign f.  P = eps + (1-2eps) Phi(z), z = m / sqrt v;
        # cov = 2 (1 - 2 eps) sqrt(v) phi(z)   (PL supplement, beta = P)
        sd = sqrt(var)
        z = mean / sd
        c = 1.0 - 2.0 * spec.eps if spec.kind == LIK_NOISY_THRESHOLD else 1.0
        e1 = spec.eps if spec.kind == LIK_NOISY_THRESHOLD else 0.0
        p = e1 + c * norm_cdf(z)
        q = e1 + c * norm_cdf(-z)
        mu_y[0] = c * (norm_cdf(z) - norm_cdf(-z))
        cov_fy[0] = 2.0 * c * sd * norm_pdf(z)
        var_y[0] = 4.0 * p * q
    elif spec.kind == LIK_LOGIT and var > LOGIT_SPLIT_VAR:
        # P = Z(m), 1 - P = Z(-m) (each accurate, also the tiny one), and
        # Cov[f, tanh(f/2)] = Cov[f, sigma(f)] + Cov[-f, sigma(-f)] = P E_P[f - m] + Q E_Q[-f + m]
        logit_tilted(mean, var, &p, &c, &fk)
        logit_tilted(-mean, var, &q, &sk, &fk)
        p = exp(p)
        q = exp(q)
        mu_y[0] = p - q
        cov_fy[0] = p * c + q * sk
        var_y[0] = 4.0 * p * q
    elif spec.kind == LIK_LOGIT:
        # E(y|f) = tanh(f/2) = sigma(f) - sigma(-f), by Gauss-Hermite (PL supplement).  The covariance
        # by Stein, Cov[f, tanh(f/2)] = v E[2 sigma(f) sigma(-f)]: a sum of positive terms, where the
        # direct sqrt(v) sum_k w_k x_k tanh(f_k/2) cancels to ~1e-17 around a true value that can be
        # e^-4000 (undamped parallel PL swings means that far; A^2/Omega then overflowed).
        sd = sqrt(var)
        p = 0.0
        q = 0.0
        c = 0.0
        for k in range(spec.gh_order):
            fk = mean + sd * spec.gh_nodes[k]
            sk = sigmoid(fk)
            smk = sigmoid(-fk)
            p += spec.gh_weights[k] * sk
            q += spec.gh_weights[k] * smk
            c += spec.gh_weights[k] * sk * smk
        mu_y[0] = p - q
        cov_fy[0] = 2.0 * var * c
        var_y[0] = 4.0 * p * q
    else:
        return 1
    if not (isfinite(mu_y[0]) and isfinite(cov_fy[0]) and isfinite(var_y[0])):
        return 2
    return 0


# ----------------------------------------------------------------------------- expected log-likelihood

cdef int expected_log_prob(const LikelihoodSpec* spec, double y, double mean, double var,
                           double* e, double* de_dmean, double* de_dvar) noexcept nogil:
    # d/dm E[g] = E[g'], d/dv E[g] = E[g''] / 2 (Bonnet / Price theorems).
    cdef double sd, z, t, r, s, sm, a, b, ph, l1, l0
    cdef int k
    if bad_var(var) or not isfinite(mean):
        return 1
    if spec.kind == LIK_PYTHON:
        return py_call3(spec, PY_EXPECTED, True, y, mean, var, e, de_dmean, de_dvar)
    sd = sqrt(var)
    if spec.kind == LIK_NOISY_THRESHOLD:
        # E = log(1-eps) Phi(z) + log(eps) Phi(-z), z = y m / sqrt v
        z = y * mean / sd
        l1 = log1p(-spec.eps)
        l0 = log(spec.eps)
        ph = norm_pdf(z)
        e[0] = l1 * norm_cdf(z) + l0 * norm_cdf(-z)
        de_dmean[0] = (l1 - l0) * ph * y / sd
        de_dvar[0] = -(l1 - l0) * ph * z / (2.0 * var)
        return 0
    if spec.kind != LIK_PROBIT and spec.kind != LIK_LOGIT:
        return 1
    if spec.kind == LIK_LOGIT and var > LOGIT_SPLIT_VAR:
        # split form; dE/dm = y E[sigma(-t)] = y Z(-a); dE/dv = -E[sigma'(t)]/2 = -J1(a) / (2 v)
        # with J1(a) = Z(a) E_Z[t - a] (Stein: Cov[t, sigma(t)] = v E[sigma'(t)])
        a = y * mean
        e[0] = logit_split_elog(a, var)
        logit_tilted(-a, var, &b, &r, &t)
        de_dmean[0] = y * exp(b)
        logit_tilted(a, var, &b, &r, &t)
        de_dvar[0] = -0.5 * exp(b) * r / var
        return 0 if (isfinite(e[0]) and isfinite(de_dmean[0]) and isfinite(de_dvar[0])) else 2
    a = 0.0
    b = 0.0
    s = 0.0
    for k in range(spec.gh_order):
        t = y * (mean + sd * spec.gh_nodes[k])
        if spec.kind == LIK_PROBIT:
            r = inv_mills(t)
            a += spec.gh_weights[k] * log_norm_cdf(t)
            b += spec.gh_weights[k] * r
            s += spec.gh_weights[k] * (-r * z_plus_inv_mills(t))
        else:
            sm = sigmoid(-t)
            a += spec.gh_weights[k] * log_sigmoid(t)
            b += spec.gh_weights[k] * sm
            s += spec.gh_weights[k] * (-sigmoid(t) * sm)
    e[0] = a
    de_dmean[0] = y * b
    de_dvar[0] = 0.5 * s
    if not (isfinite(a) and isfinite(b) and isfinite(s)):
        return 2
    return 0


# ----------------------------------------------------------------------------- predictive probability

cdef int predictive_probability(const LikelihoodSpec* spec, double mean, double var,
                                double* p) noexcept nogil:
    cdef double sd, acc
    cdef int k
    if bad_var(var) or not isfinite(mean):
        return 1
    if spec.kind == LIK_PYTHON:
        return py_call(spec, PY_PREDICTIVE, False, 0.0, mean, var, 2, 1, p)
    if spec.kind == LIK_PROBIT:
        p[0] = norm_cdf(mean / sqrt(1.0 + var))                  # R&W eq. (3.82)
    elif spec.kind == LIK_NOISY_THRESHOLD:
        p[0] = spec.eps + (1.0 - 2.0 * spec.eps) * norm_cdf(mean / sqrt(var))
    elif spec.kind == LIK_HEAVISIDE:
        p[0] = norm_cdf(mean / sqrt(var))
    elif spec.kind == LIK_LOGIT and var > LOGIT_SPLIT_VAR:
        logit_tilted(mean, var, &acc, &sd, &sd)
        p[0] = exp(acc)
    elif spec.kind == LIK_LOGIT:
        sd = sqrt(var)
        acc = 0.0
        for k in range(spec.gh_order):
            acc += spec.gh_weights[k] * sigmoid(mean + sd * spec.gh_nodes[k])
        p[0] = acc
    else:
        return 1
    return 0




# ----------------------------------------------------------------------------- vectorised entry points

cdef int make_spec(LikelihoodSpec* spec, int kind, double eps, const double[::1] gh_nodes,
                   const double[::1] gh_weights, object py_likelihood) except -1:
    """Fill ``spec``; ``py_likelihood`` (kept alive by the caller) is used for LIK_PYTHON only."""
    if kind < LIK_PROBIT or kind > LIK_PYTHON:
        raise ValueError(f"unknown likelihood kind {kind}")
    if gh_nodes.shape[0] != gh_weights.shape[0] or gh_nodes.shape[0] < 1:
        raise ValueError("gh_nodes and gh_weights must be non-empty and of equal length")
    if kind == LIK_NOISY_THRESHOLD and not (0.0 < eps < 0.5):
        raise ValueError(f"eps must lie in (0, 0.5), got {eps}")
    spec.kind = kind
    spec.eps = eps
    spec.gh_order = <int> gh_nodes.shape[0]
    spec.gh_nodes = &gh_nodes[0]
    spec.gh_weights = &gh_weights[0]
    if kind == LIK_PYTHON and py_likelihood is None:
        raise ValueError("a Python likelihood needs its Likelihood object")
    spec.py_likelihood = <void*> py_likelihood
    return 0


cdef _check_len(Py_ssize_t n, tuple arrays):
    for a in arrays:
        if a.shape[0] != n:
            raise ValueError(f"input arrays must have equal lengths, got {a.shape[0]} and {n}")


def log_prob_vec(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                 const double[::1] y, const double[::1] f):
    """log p(y_i | f_i) for every i.  Returns a float array."""
    cdef LikelihoodSpec spec
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, None)
    cdef Py_ssize_t n = y.shape[0], i
    _check_len(n, (f,))
    out = np.empty(n)
    cdef double[::1] o = out
    with nogil:
        for i in range(n):
            o[i] = log_prob(&spec, y[i], f[i])
    return out


def log_prob_derivatives_vec(int kind, double eps, const double[::1] gh_nodes,
                             const double[::1] gh_weights, const double[::1] y, const double[::1] f):
    """(log p, d/df, d2/df2, d3/df3, first failing index or -1)."""
    cdef LikelihoodSpec spec
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, None)
    cdef Py_ssize_t n = y.shape[0], i, bad = -1
    _check_len(n, (f,))
    a0 = np.empty(n); a1 = np.empty(n); a2 = np.empty(n); a3 = np.empty(n)
    cdef double[::1] o0 = a0, o1 = a1, o2 = a2, o3 = a3
    with nogil:
        for i in range(n):
            if log_prob_derivatives(&spec, y[i], f[i], &o0[i], &o1[i], &o2[i], &o3[i]) != 0 and bad < 0:
                bad = i
    return a0, a1, a2, a3, bad


ctypedef int (*three_moments_fn)(const LikelihoodSpec*, double, double, double,
                                 double*, double*, double*) noexcept nogil


cdef int _slr_moments_ignoring_y(const LikelihoodSpec* spec, double y, double mean, double var,
                                 double* o0, double* o1, double* o2) noexcept nogil:
    return slr_moments(spec, mean, var, o0, o1, o2)


cdef tuple _three_moments_vec(three_moments_fn fn, int kind, double eps, const double[::1] gh_nodes,
                              const double[::1] gh_weights, const double[::1] y,
                              const double[::1] mean, const double[::1] var):
    """``fn`` at every (y_i, mean_i, var_i): three output arrays and the first failing index or -1."""
    cdef LikelihoodSpec spec
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, None)
    cdef Py_ssize_t n = y.shape[0], i, bad = -1
    _check_len(n, (mean, var))
    a0 = np.empty(n); a1 = np.empty(n); a2 = np.empty(n)
    cdef double[::1] o0 = a0, o1 = a1, o2 = a2
    with nogil:
        for i in range(n):
            if fn(&spec, y[i], mean[i], var[i], &o0[i], &o1[i], &o2[i]) != 0 and bad < 0:
                bad = i
    return a0, a1, a2, bad


def tilted_moments_vec(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                       const double[::1] y, const double[::1] cav_mean, const double[::1] cav_var):
    """(log Z, mean, var, first failing index or -1)."""
    return _three_moments_vec(tilted_moments, kind, eps, gh_nodes, gh_weights, y, cav_mean, cav_var)


def slr_moments_vec(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                    const double[::1] mean, const double[::1] var):
    """(mu_y, cov_fy, var_y, first failing index or -1)."""
    return _three_moments_vec(_slr_moments_ignoring_y, kind, eps, gh_nodes, gh_weights,
                              np.ones(mean.shape[0]), mean, var)


def expected_log_prob_vec(int kind, double eps, const double[::1] gh_nodes,
                          const double[::1] gh_weights, const double[::1] y,
                          const double[::1] mean, const double[::1] var):
    """(E log p, d/dmean, d/dvar, first failing index or -1)."""
    return _three_moments_vec(expected_log_prob, kind, eps, gh_nodes, gh_weights, y, mean, var)


def predictive_probability_vec(int kind, double eps, const double[::1] gh_nodes,
                               const double[::1] gh_weights, const double[::1] mean,
                               const double[::1] var):
    """(P(y=+1), first failing index or -1)."""
    cdef LikelihoodSpec spec
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, None)
    cdef Py_ssize_t n = mean.shape[0], i, bad = -1
    _check_len(n, (var,))
    a0 = np.empty(n)
    cdef double[::1] o0 = a0
    with nogil:
        for i in range(n):
            if predictive_probability(&spec, mean[i], var[i], &o0[i]) != 0 and bad < 0:
                bad = i
    return a0, bad


def _set_logit_split_var(double v):
    """Testing hook: the cavity variance above which logit moments use the step + Laguerre split."""
    global LOGIT_SPLIT_VAR
    old = LOGIT_SPLIT_VAR
    LOGIT_SPLIT_VAR = v
    return old
