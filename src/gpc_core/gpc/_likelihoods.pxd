# C interface of gpc._likelihoods: the per-datum likelihood integrals, cimported by the site rule
# (gpc._site_rule) and by any engine that needs likelihood moments inside `nogil` loops.
#
# A LikelihoodSpec describes a likelihood to C code: its kind, its parameter (eps of the noisy
# threshold, PL eq. (3)), probabilists' Gauss-Hermite nodes x_k and weights w_k normalised so that
# sum_k w_k = 1 (E[g(f)] ~ sum_k w_k g(m + sqrt(v) x_k) for f ~ N(m, v)), and for LIK_PYTHON the
# Likelihood object whose Python methods are called (with the GIL) instead.  Labels are -1.0 or +1.0.
#
# Status codes of the per-element functions: 0 success; 1 invalid input (variance <= 0, non-finite
# argument, kind not supported); 2 result not representable (Z underflows to 0, a non-finite moment).

cpdef enum:
    # the kinds, exported to Python by gpc._likelihoods under these names (gpc.likelihoods)
    LIK_PROBIT = 0
    LIK_LOGIT = 1
    LIK_NOISY_THRESHOLD = 2
    LIK_HEAVISIDE = 3
    LIK_PYTHON = 4

ctypedef struct LikelihoodSpec:
    int kind
    double eps
    int gh_order
    const double* gh_nodes
    const double* gh_weights
    void* py_likelihood

cdef int make_spec(LikelihoodSpec* spec, int kind, double eps, const double[::1] gh_nodes,
                   const double[::1] gh_weights, object py_likelihood) except -1

cdef double log_prob(const LikelihoodSpec* spec, double y, double f) noexcept nogil
cdef int log_prob_derivatives(const LikelihoodSpec* spec, double y, double f,
                              double* lp, double* d1, double* d2, double* d3) noexcept nogil
cdef int tilted_moments(const LikelihoodSpec* spec, double y, double cav_mean, double cav_var,
                        double* log_z, double* mean, double* var) noexcept nogil
cdef int slr_moments(const LikelihoodSpec* spec, double mean, double var,
                     double* mu_y, double* cov_fy, double* var_y) noexcept nogil
cdef int expected_log_prob(const LikelihoodSpec* spec, double y, double mean, double var,
                           double* e, double* de_dmean, double* de_dvar) noexcept nogil
cdef int predictive_probability(const LikelihoodSpec* spec, double mean, double var,
                                double* p) noexcept nogil
