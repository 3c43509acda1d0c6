# gpc._site_rule: the site rule of EP and PL, written once.  The sequential sweep (gpc._sweeps)
# calls site_update after each rank-one refresh of the marginal; the parallel schedule calls it
# through parallel_update for every site against one posterior.
#
# A site t_i(g) = exp(-tau_i g^2 / 2 + nu_i g) is refitted from the marginal N(mean, var) of g_i.
# In the dense engine g_i = f_i.  In the sparse engine g_i = a_i^T w and the label sees
# f_i = g_i + e_i with e_i ~ N(0, s) independent (the FITC variance s_i, SEP eq. (1)): the site
# approximates phi_i(g) = Int p(y|f) N(f | g, s) df.  The dense engine passes s = 0.
#   EP: cavity N(c, v) with 1/v = 1/var - tau_i, c/v = mean/var - nu_i              (R&W eq. (3.56))
#       Z = Int p(y|f) N(f | c, v + s) df with tilted moments (m_f, v_f) of f; the matched site
#       on g, tau = -d2 / (1 + d2 v), nu = (d1 - c d2) / (1 + d2 v) with d1, d2 the derivatives
#       of log Z in c (R&W eq. (3.58)-(3.59) in derivative form), written with w = v + s as
#       tau = (w - v_f) / (s w + v v_f), nu = (m_f w - c v_f) / (s w + v v_f): for s = 0 this is
#       1/v_f - 1/v, m_f/v_f - c/v, and for v = 0 (a point-mass cavity, s > 0) it stays finite
#   PL: A = Cov[f, E(y|f)] / (var + s), b = E[E(y|f)] - A mean, Omega = Var[y] - A^2 var under
#       f ~ N(mean, var + s); new site tau = A^2 / Omega, nu = A (y - b) / Omega   (PL eq. (9)-(16))
#       (the SLR of y on g: Cov[g, E(y|f)] = var/(var + s) Cov[f, E(y|f)], docs/derivations-ep-pl.md)
# then damped on the natural parameters, new <- damping new + (1 - damping) old     (RMGPC §3).
#
# EP's negative variances (non-log-concave likelihoods, PL supplement) follow on_negative.  A negative
# site precision is part of EP (the tilted distribution is wider than the cavity); what EP cannot do
# is update a site whose cavity tau_c = 1/var - tau_i is not positive (no distribution to match):
#   keep:      negative sites are kept; a site without a cavity takes PL's SLR update against its
#              marginal (PL eq. (15)-(16)) where that keeps its marginal precision tau_c + tau
#              positive, and keeps its old value otherwise (the default: DEFAULT_ON_NEGATIVE of
#              gpc.inference.ep);
#   keep-skip: negative sites are kept; a site without a cavity keeps its old value this sweep;
#   raise:     negative sites are kept; a site without a cavity stops the run;
#   clip:      every negative site precision becomes CLIP_PRECISION with its site mean kept (PL §IV,
#              after Vehtari et al.: the paper's Table I runs); no cavity: the old site is kept;
#   skip:      every update that would be negative keeps the old site; no cavity: likewise;
#   pl:        every update that would be negative, and every site without a cavity, takes PL's
#              SLR update instead, which is never negative (PL §III-D).
# keep, keep-skip and raise leave the fixed point EP's own; clip, skip and pl move it wherever they
# act in the final sweep.

from gpc._likelihoods cimport LikelihoodSpec, make_spec, tilted_moments, slr_moments

import numpy as np

#: the site rules and on_negative policies by name (gpc.inference.rules), codes of _site_rule.pxd
RULES = {"ep": RULE_EP, "pl": RULE_PL}
ON_NEGATIVE = {"raise": NEG_RAISE, "clip": NEG_CLIP, "skip": NEG_SKIP, "pl": NEG_PL,
               "keep": NEG_KEEP, "keep-skip": NEG_KEEP_SKIP}

#: site precision that "clip" puts in place of a negative one
cdef double CLIP_PRECISION = 1e-8
#: floor of PL's Omega, where the linear fit is exact to rounding
cdef double OMEGA_FLOOR = 1e-300


cdef int slr_site(const LikelihoodSpec* spec, double y, double mean, double var, double s,
                  double* tau, double* nu) noexcept nogil:
    cdef double mu_y, cov_fy, var_y, A, b, omega
    if slr_moments(spec, mean, var + s, &mu_y, &cov_fy, &var_y) != 0:
        return SITE_LIKELIHOOD_FAILED
    A = cov_fy / (var + s)
    b = mu_y - A * mean
    omega = var_y - A * A * var
    if not (omega > 0.0):
        omega = OMEGA_FLOOR
    tau[0] = A * A / omega
    nu[0] = A * (y - b) / omega
    return SITE_UPDATED


cdef int matched_site(const LikelihoodSpec* spec, double y, double mean, double var, double s,
                      double tau, double nu, double* tau_new, double* nu_new) noexcept nogil:
    """EP's matched site on g (module comment) against the cavity of the marginal N(mean, var)
    and the site (tau, nu), which the caller has found proper (1/var - tau > 0).  The cavity in
    variance form, v = var/(1 - tau var), c = (mean - var nu)/(1 - tau var), is the point mass at
    the mean for var = 0.  Returns 0 or the likelihood's status."""
    cdef double keep = 1.0 - tau * var, v, c, w, m_f, v_f, lz, denom
    cdef int status
    v = var / keep
    c = (mean - var * nu) / keep
    w = v + s
    status = tilted_moments(spec, y, c, w, &lz, &m_f, &v_f)
    if status != 0:
        return status
    denom = s * w + v * v_f
    tau_new[0] = (w - v_f) / denom
    nu_new[0] = (m_f * w - c * v_f) / denom
    return 0


cdef int matched_log_z(const LikelihoodSpec* spec, double y, double cmean, double cvar,
                       double s, double* log_z, double* d1, double* d2) noexcept nogil:
    """log Z = log Int p(y|f) N(f | cmean, cvar + s) df and its first two derivatives in cmean
    (SEP eq. (1): the f-integral widens the cavity by s).  Returns the likelihood's status."""
    cdef double w = cvar + s, m_f, v_f
    cdef int status = tilted_moments(spec, y, cmean, w, log_z, &m_f, &v_f)
    if status != 0:
        return status
    d1[0] = (m_f - cmean) / w
    d2[0] = (v_f - w) / (w * w)
    return 0


cdef int site_log_z(const LikelihoodSpec* spec, int rule, double y, double cmean, double cvar,
                    double s, double tau, double nu, double* log_z, double* d1,
                    double* d2) noexcept nogil:
    """What the evidence needs of a site (tau, nu) whose cavity on g is N(cmean, cvar).

    log_z is the likelihood's log Z of :func:`matched_log_z` under either rule.  d1, d2 are the
    derivatives in cmean of the log normaliser of the likelihood the site stands for: EP's is
    phi_i itself (:func:`matched_log_z`); PL's is its linearisation, the Gaussian
    pseudo-likelihood N(nu/tau | g, 1/tau) up to a constant, whose normaliser against the cavity
    is N(nu/tau | cmean, cvar + 1/tau): d1 = (nu - tau cmean)/(1 + tau cvar),
    d2 = -tau/(1 + tau cvar) (finite at tau = 0).  Returns the likelihood's status."""
    cdef int status = matched_log_z(spec, y, cmean, cvar, s, log_z, d1, d2)
    if status != 0 or rule != RULE_PL:
        return status
    d1[0] = (nu - tau * cmean) / (1.0 + tau * cvar)
    d2[0] = -tau / (1.0 + tau * cvar)
    return 0


cdef int site_update(const LikelihoodSpec* spec, int rule, int on_negative, double damping,
                     double y, double mean, double var, double s, double* tau, double* nu,
                     double* cavity_var, long* n_fixed) noexcept nogil:
    """Refit one site from the marginal N(mean, var) of g; tau, nu hold the old site on entry.
    ``s`` is the variance the label's f adds to g (0 in the dense engine).

    Counts in ``n_fixed`` the updates that the on_negative policy handled (SITE_KEPT, SITE_FIXED).
    """
    cdef int status = refit(spec, rule, on_negative, damping, y, mean, var, s, tau, nu,
                            cavity_var)
    if status == SITE_KEPT or status == SITE_FIXED:
        n_fixed[0] += 1
    return status


cdef int refit(const LikelihoodSpec* spec, int rule, int on_negative, double damping,
               double y, double mean, double var, double s, double* tau, double* nu,
               double* cavity_var) noexcept nogil:
    cdef double tau_cav = 0.0, tau_new, nu_new
    cdef int status = SITE_UPDATED
    if rule == RULE_PL:
        status = slr_site(spec, y, mean, var, s, &tau_new, &nu_new)
        if status != SITE_UPDATED:
            return status
    else:
        tau_cav = 1.0 / var - tau[0]
        if not (tau_cav > 0.0):
            if on_negative == NEG_RAISE:
                cavity_var[0] = 1.0 / tau_cav if tau_cav != 0.0 else -1e308
                return SITE_NEGATIVE_CAVITY
            if on_negative != NEG_PL and on_negative != NEG_KEEP:
                return SITE_KEPT                  # keep-skip, clip, skip: no moments without a cavity
            status = SITE_FIXED
            if slr_site(spec, y, mean, var, s, &tau_new, &nu_new) != SITE_UPDATED:
                return SITE_LIKELIHOOD_FAILED
        else:
            if matched_site(spec, y, mean, var, s, tau[0], nu[0], &tau_new, &nu_new) != 0:
                return SITE_LIKELIHOOD_FAILED
    tau_new = damping * tau_new + (1.0 - damping) * tau[0]
    nu_new = damping * nu_new + (1.0 - damping) * nu[0]
    if status == SITE_FIXED and on_negative == NEG_KEEP and not (tau_cav + tau_new > 0.0):
        # the marginal precision 1/var + (tau_new - tau) = tau_cav + tau_new would not be positive
        # (1 + dtau var <= 0: the posterior would lose positive definiteness): keep the old site
        return SITE_KEPT
    if tau_new < 0.0 and (on_negative == NEG_CLIP or on_negative == NEG_SKIP or on_negative == NEG_PL):
        # raise, keep and keep-skip keep a negative site: EP allows it while the cavities stay positive
        if on_negative == NEG_SKIP:
            return SITE_KEPT
        if on_negative == NEG_CLIP:
            nu_new = nu_new * CLIP_PRECISION / tau_new
            tau_new = CLIP_PRECISION
        else:
            if slr_site(spec, y, mean, var, s, &tau_new, &nu_new) != SITE_UPDATED:
                return SITE_LIKELIHOOD_FAILED
            tau_new = damping * tau_new + (1.0 - damping) * tau[0]
            nu_new = damping * nu_new + (1.0 - damping) * nu[0]
        status = SITE_FIXED
    tau[0] = tau_new
    nu[0] = nu_new
    return status


cdef int check_codes(int rule, int on_negative) except -1:
    """ValueError unless ``rule`` and ``on_negative`` are codes of gpc/_site_rule.pxd."""
    if rule < RULE_EP or rule > RULE_PL or on_negative < NEG_RAISE or on_negative > NEG_KEEP_SKIP:
        raise ValueError("unknown rule or on_negative code")
    return 0


def parallel_update(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                    object py_likelihood, int rule, int on_negative, double damping,
                    const double[::1] y, const double[::1] mean, const double[::1] var,
                    double[::1] tau, double[::1] nu):
    """Every site against one posterior (marginals ``mean``, ``var``); ``tau``, ``nu`` in place.

    Returns (status, index, value, n_fixed) as gpc._sweeps.sequential_sweep does: status
    SITE_UPDATED (0) done, SITE_NEGATIVE_CAVITY a negative cavity variance ``value`` at site
    ``index`` (on_negative="raise"), SITE_LIKELIHOOD_FAILED the likelihood could not be evaluated
    at site ``index``.  Sites before ``index`` are updated.  ``n_fixed``
    counts the updates the on_negative policy handled (SITE_KEPT, SITE_FIXED).
    """
    cdef LikelihoodSpec spec
    cdef Py_ssize_t n = y.shape[0], i
    cdef int status = 0, st
    cdef long n_fixed = 0
    cdef double bad_value = 0.0
    cdef Py_ssize_t bad_index = -1
    if mean.shape[0] != n or var.shape[0] != n or tau.shape[0] != n or nu.shape[0] != n:
        raise ValueError("parallel_update: inconsistent array sizes")
    if not (0.0 < damping <= 1.0):
        raise ValueError("damping must be in (0, 1]")
    check_codes(rule, on_negative)
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, py_likelihood)
    with nogil:
        for i in range(n):
            st = site_update(&spec, rule, on_negative, damping, y[i], mean[i], var[i], 0.0,
                             &tau[i], &nu[i], &bad_value, &n_fixed)
            if st == SITE_NEGATIVE_CAVITY or st == SITE_LIKELIHOOD_FAILED:
                status = st
                bad_index = i
                break
    return status, bad_index, bad_value, n_fixed
