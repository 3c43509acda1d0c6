# Python entry points of the likelihood integrals in _moments.pxi (see gpc.likelihoods).

include "_moments.pxi"


# --- Python entry points: check lengths, build the spec, loop without the GIL ------------------

cdef LikelihoodSpec make_spec(int kind, double eps, const double[::1] nodes,
                              const double[::1] weights) except *:
    cdef LikelihoodSpec spec
    if kind < 0 or kind > 3:
        raise ValueError(f"unknown likelihood kind {kind}")
    if nodes.shape[0] != weights.shape[0] or nodes.shape[0] < 1:
        raise ValueError("Gauss-Hermite nodes and weights must be non-empty and of equal length")
    spec.kind = kind
    spec.eps = eps
    spec.gh_order = <int> nodes.shape[0]
    spec.gh_nodes = &nodes[0]
    spec.gh_weights = &weights[0]
    return spec


cdef void check_lengths(Py_ssize_t n, tuple arrays) except *:
    for a in arrays:
        if a.shape[0] != n:
            raise ValueError(f"all arrays must have length {n}, got {a.shape[0]}")


def log_prob_derivatives_into(int kind, const double[::1] y, const double[::1] f, double[::1] lp,
                              double[::1] d1, double[::1] d2, double[::1] d3):
    """Fill log p(y|f) and its first three f-derivatives (probit and logit only)."""
    cdef Py_ssize_t i, n = y.shape[0]
    cdef int status = 0
    check_lengths(n, (f, lp, d1, d2, d3))
    if kind != LIK_PROBIT and kind != LIK_LOGIT:
        raise ValueError("derivatives exist only for probit and logit")
    with nogil:
        for i in range(n):
            status |= log_prob_derivs(kind, y[i], f[i], &lp[i], &d1[i], &d2[i], &d3[i])
    return status


def tilted_moments_into(int kind, double eps, const double[::1] nodes, const double[::1] weights,
                        const double[::1] y, const double[::1] cav_mean, const double[::1] cav_var,
                        double[::1] log_z, double[::1] mean, double[::1] var):
    """Fill the tilted moments; returns the index of the first failure or -1."""
    cdef LikelihoodSpec spec = make_spec(kind, eps, nodes, weights)
    cdef Py_ssize_t i, n = y.shape[0], bad = -1
    check_lengths(n, (cav_mean, cav_var, log_z, mean, var))
    with nogil:
        for i in range(n):
            if tilted_moments(&spec, y[i], cav_mean[i], cav_var[i], &log_z[i], &mean[i], &var[i]) != 0:
                if bad < 0:
                    bad = i
    return bad


def slr_moments_into(int kind, double eps, const double[::1] nodes, const double[::1] weights,
                     const double[::1] mean, const double[::1] var, double[::1] mu_y,
                     double[::1] cov_fy, double[::1] var_y):
    """Fill the SLR moments; returns the index of the first failure or -1."""
    cdef LikelihoodSpec spec = make_spec(kind, eps, nodes, weights)
    cdef Py_ssize_t i, n = mean.shape[0], bad = -1
    check_lengths(n, (var, mu_y, cov_fy, var_y))
    with nogil:
        for i in range(n):
            if slr_moments(&spec, mean[i], var[i], &mu_y[i], &cov_fy[i], &var_y[i]) != 0:
                if bad < 0:
                    bad = i
    return bad


def expected_log_prob_into(int kind, double eps, const double[::1] nodes, const double[::1] weights,
                           const double[::1] y, const double[::1] m, const double[::1] v,
                           double[::1] e, double[::1] de_dm, double[::1] de_dv):
    """Fill E[log p(y|f)] under N(m, v) and its m- and v-derivatives; first failure or -1."""
    cdef LikelihoodSpec spec = make_spec(kind, eps, nodes, weights)
    cdef Py_ssize_t i, n = y.shape[0], bad = -1
    check_lengths(n, (m, v, e, de_dm, de_dv))
    with nogil:
        for i in range(n):
            if expected_log_prob(&spec, y[i], m[i], v[i], &e[i], &de_dm[i], &de_dv[i]) != 0:
                if bad < 0:
                    bad = i
    return bad


def predictive_positive_into(int kind, double eps, const double[::1] nodes,
                             const double[::1] weights, const double[::1] m, const double[::1] v,
                             double[::1] out):
    """Fill P(y = +1) = integral of p(+1|f) N(f | m, v) df."""
    cdef LikelihoodSpec spec = make_spec(kind, eps, nodes, weights)
    cdef Py_ssize_t i, n = m.shape[0]
    check_lengths(n, (v, out))
    with nogil:
        for i in range(n):
            out[i] = predictive_positive(&spec, m[i], v[i])
