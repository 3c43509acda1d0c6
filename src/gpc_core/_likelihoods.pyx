# Python entry points of the likelihood integrals in _moments.pxi (see gpc.likelihoods).

include "_moments.pxi"


# ----------------------------------------------------------------------------- vectorised entry points

cdef int _make_spec(LikelihoodSpec* spec, int kind, double eps,
                    const double[::1] gh_nodes, const double[::1] gh_weights) except -1:
    if kind < LIK_PROBIT or kind > LIK_HEAVISIDE:
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
    return 0


cdef _check_len(Py_ssize_t n, tuple arrays):
    for a in arrays:
        if a.shape[0] != n:
            raise ValueError(f"input arrays must have equal lengths, got {a.shape[0]} and {n}")


def log_prob_vec(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                 const double[::1] y, const double[::1] f):
    """log p(y_i | f_i) for every i.  Returns a float array."""
    cdef LikelihoodSpec spec
    _make_spec(&spec, kind, eps, gh_nodes, gh_weights)
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
    _make_spec(&spec, kind, eps, gh_nodes, gh_weights)
    cdef Py_ssize_t n = y.shape[0], i, bad = -1
    _check_len(n, (f,))
    a0 = np.empty(n); a1 = np.empty(n); a2 = np.empty(n); a3 = np.empty(n)
    cdef double[::1] o0 = a0, o1 = a1, o2 = a2, o3 = a3
    with nogil:
        for i in range(n):
            if log_prob_derivatives(&spec, y[i], f[i], &o0[i], &o1[i], &o2[i], &o3[i]) != 0 and bad < 0:
                bad = i
    return a0, a1, a2, a3, bad


def tilted_moments_vec(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                       const double[::1] y, const double[::1] cav_mean, const double[::1] cav_var):
    """(log Z, mean, var, first failing index or -1)."""
    cdef LikelihoodSpec spec
    _make_spec(&spec, kind, eps, gh_nodes, gh_weights)
    cdef Py_ssize_t n = y.shape[0], i, bad = -1
    _check_len(n, (cav_mean, cav_var))
    a0 = np.empty(n); a1 = np.empty(n); a2 = np.empty(n)
    cdef double[::1] o0 = a0, o1 = a1, o2 = a2
    with nogil:
        for i in range(n):
            if tilted_moments(&spec, y[i], cav_mean[i], cav_var[i], &o0[i], &o1[i], &o2[i]) != 0 and bad < 0:
                bad = i
    return a0, a1, a2, bad


def slr_moments_vec(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                    const double[::1] mean, const double[::1] var):
    """(mu_y, cov_fy, var_y, first failing index or -1)."""
    cdef LikelihoodSpec spec
    _make_spec(&spec, kind, eps, gh_nodes, gh_weights)
    cdef Py_ssize_t n = mean.shape[0], i, bad = -1
    _check_len(n, (var,))
    a0 = np.empty(n); a1 = np.empty(n); a2 = np.empty(n)
    cdef double[::1] o0 = a0, o1 = a1, o2 = a2
    with nogil:
        for i in range(n):
            if slr_moments(&spec, mean[i], var[i], &o0[i], &o1[i], &o2[i]) != 0 and bad < 0:
                bad = i
    return a0, a1, a2, bad


def expected_log_prob_vec(int kind, double eps, const double[::1] gh_nodes,
                          const double[::1] gh_weights, const double[::1] y,
                          const double[::1] mean, const double[::1] var):
    """(E log p, d/dmean, d/dvar, first failing index or -1)."""
    cdef LikelihoodSpec spec
    _make_spec(&spec, kind, eps, gh_nodes, gh_weights)
    cdef Py_ssize_t n = y.shape[0], i, bad = -1
    _check_len(n, (mean, var))
    a0 = np.empty(n); a1 = np.empty(n); a2 = np.empty(n)
    cdef double[::1] o0 = a0, o1 = a1, o2 = a2
    with nogil:
        for i in range(n):
            if expected_log_prob(&spec, y[i], mean[i], var[i], &o0[i], &o1[i], &o2[i]) != 0 and bad < 0:
                bad = i
    return a0, a1, a2, bad


def predictive_probability_vec(int kind, double eps, const double[::1] gh_nodes,
                               const double[::1] gh_weights, const double[::1] mean,
                               const double[::1] var):
    """(P(y=+1), first failing index or -1)."""
    cdef LikelihoodSpec spec
    _make_spec(&spec, kind, eps, gh_nodes, gh_weights)
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
