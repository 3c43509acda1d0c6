# gpc._site_rule: the site rule of EP and PL, written once.  The sequential sweep (gpc._sweeps)
# calls site_update after each rank-one refresh of the marginal; the parallel schedule calls it
# through parallel_update for every site against one posterior.
#
# A site t_i(f) = exp(-tau_i f^2 / 2 + nu_i f) is refitted from the marginal N(mean, var) of f_i:
#   EP: cavity tau_c = 1/var - tau_i, nu_c = mean/var - nu_i                        (R&W eq. (3.56))
#       tilted moments (m_hat, v_hat) of p(y|f) N(f | nu_c/tau_c, 1/tau_c); new site
#       tau = 1/v_hat - tau_c, nu = m_hat/v_hat - nu_c                               (R&W eq. (3.59))
#   PL: A = Cov[f, E(y|f)] / var, b = E[E(y|f)] - A mean, Omega = Var[y] - A^2 var; new site
#       tau = A^2 / Omega, nu = A (y - b) / Omega                             (PL eq. (9)-(16))
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

#: site precision that "clip" puts in place of a negative one
cdef double CLIP_PRECISION = 1e-8
#: floor of PL's Omega, where the linear fit is exact to rounding
cdef double OMEGA_FLOOR = 1e-300


cdef int slr_site(const LikelihoodSpec* spec, double y, double mean, double var,
                  double* tau, double* nu) noexcept nogil:
    cdef double mu_y, cov_fy, var_y, A, b, omega
    if slr_moments(spec, mean, var, &mu_y, &cov_fy, &var_y) != 0:
        return SITE_LIKELIHOOD_FAILED
    A = cov_fy / var
    b = mu_y - A * mean
    omega = var_y - A * A * var
    if not (omega > 0.0):
        omega = OMEGA_FLOOR
    tau[0] = A * A / omega
    nu[0] = A * (y - b) / omega
    return SITE_UPDATED


cdef int site_update(const LikelihoodSpec* spec, int rule, int on_negative, double damping,
                     double y, double mean, double var, double* tau, double* nu,
                     double* cavity_var, long* n_fixed) noexcept nogil:
    """Refit one site from the marginal N(mean, var); tau, nu hold the old site on entry.

    Counts in ``n_fixed`` the updates that the on_negative policy handled (SITE_KEPT, SITE_FIXED).
    """
    cdef int status = refit(spec, rule, on_negative, damping, y, mean, var, tau, nu, cavity_var)
    if status == SITE_KEPT or status == SITE_FIXED:
        n_fixed[0] += 1
    return status


cdef int refit(const LikelihoodSpec* spec, int rule, int on_negative, double damping,
               double y, double mean, double var, double* tau, double* nu,
               double* cavity_var) noexcept nogil:
    cdef double tau_cav = 0.0, nu_cav, cav_var, lz, m_hat, v_hat, tau_new, nu_new
    cdef int status = SITE_UPDATED
    if rule == RULE_PL:
        status = slr_site(spec, y, mean, var, &tau_new, &nu_new)
        if status != SITE_UPDATED:
            return status
    else:
        tau_cav = 1.0 / var - tau[0]
        nu_cav = mean / var - nu[0]
        if not (tau_cav > 0.0):
            if on_negative == NEG_RAISE:
                cavity_var[0] = 1.0 / tau_cav if tau_cav != 0.0 else -1e308
                return SITE_NEGATIVE_CAVITY
            if on_negative != NEG_PL and on_negative != NEG_KEEP:
                return SITE_KEPT                  # keep-skip, clip, skip: no moments without a cavity
            status = SITE_FIXED
            if slr_site(spec, y, mean, var, &tau_new, &nu_new) != SITE_UPDATED:
                return SITE_LIKELIHOOD_FAILED
        else:
            cav_var = 1.0 / tau_cav
            if tilted_moments(spec, y, nu_cav * cav_var, cav_var, &lz, &m_hat, &v_hat) != 0:
                return SITE_LIKELIHOOD_FAILED
            tau_new = 1.0 / v_hat - tau_cav
            nu_new = m_hat / v_hat - nu_cav
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
            if slr_site(spec, y, mean, var, &tau_new, &nu_new) != SITE_UPDATED:
                return SITE_LIKELIHOOD_FAILED
            tau_new = damping * tau_new + (1.0 - damping) * tau[0]
            nu_new = damping * nu_new + (1.0 - damping) * nu[0]
        status = SITE_FIXED
    tau[0] = tau_new
    nu[0] = nu_new
    return status


def parallel_update(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                    object py_likelihood, int rule, int on_negative, double damping,
                    const double[::1] y, const double[::1] mean, const double[::1] var,
                    double[::1] tau, double[::1] nu):
    """Every site against one posterior (marginals ``mean``, ``var``); ``tau``, ``nu`` in place.

    Returns (status, index, value, n_fixed) as gpc._sweeps.sequential_sweep does: status 0 done,
    1 a negative cavity variance ``value`` at site ``index`` (on_negative="raise"), 2 the likelihood
    could not be evaluated at site ``index``.  Sites before ``index`` are updated.  ``n_fixed``
    counts the updates the on_negative policy handled (SITE_KEPT, SITE_FIXED).
    """
    cdef LikelihoodSpec spec
    cdef Py_ssize_t n = y.shape[0], i
    cdef int status = 0, s
    cdef long n_fixed = 0
    cdef double bad_value = 0.0
    cdef Py_ssize_t bad_index = -1
    if mean.shape[0] != n or var.shape[0] != n or tau.shape[0] != n or nu.shape[0] != n:
        raise ValueError("parallel_update: inconsistent array sizes")
    if not (0.0 < damping <= 1.0):
        raise ValueError("damping must be in (0, 1]")
    if rule < RULE_EP or rule > RULE_PL or on_negative < NEG_RAISE or on_negative > NEG_KEEP_SKIP:
        raise ValueError("unknown rule or on_negative code")
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, py_likelihood)
    with nogil:
        for i in range(n):
            s = site_update(&spec, rule, on_negative, damping, y[i], mean[i], var[i],
                            &tau[i], &nu[i], &bad_value, &n_fixed)
            if s == SITE_NEGATIVE_CAVITY or s == SITE_LIKELIHOOD_FAILED:
                status = s
                bad_index = i
                break
    return status, bad_index, bad_value, n_fixed
