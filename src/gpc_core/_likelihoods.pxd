# Contract between the likelihood kernels and the site sweeps (gpc._sweeps cimports this).
#
# A likelihood is described to C code by a LikelihoodSpec: its kind, its parameter (eps of the
# noisy threshold, PL eq. (3)) and, for kinds without closed forms, probabilists' Gauss-Hermite
# nodes x_k and weights w_k normalised so that sum_k w_k = 1, i.e. E[g(f)] ~ sum_k w_k g(m + sqrt(v) x_k)
# for f ~ N(m, v).  Labels y are -1.0 or +1.0.  Every function returns 0 on success and a non-zero
# status when the result is not representable (e.g. Z underflows to 0 for a noise-free step).

cdef enum:
    LIK_PROBIT = 0
    LIK_LOGIT = 1
    LIK_NOISY_THRESHOLD = 2
    LIK_HEAVISIDE = 3

cdef struct LikelihoodSpec:
    int kind
    double eps
    int gh_order
    const double* gh_nodes
    const double* gh_weights

# EP / ADF: Z = int p(y|f) N(f | cav_mean, cav_var) df, and mean and variance of p(y|f) N(f|.) / Z.
cdef int tilted_moments(const LikelihoodSpec* spec, double y, double cav_mean, double cav_var,
                        double* log_z, double* mean, double* var) noexcept nogil

# PL (supplement): for f ~ N(mean, var), the moments of the label: mu_y = E[E(y|f)],
# cov_fy = Cov[f, E(y|f)], var_y = Var[y] = 1 - mu_y^2 for labels in {-1, +1}.
cdef int slr_moments(const LikelihoodSpec* spec, double mean, double var,
                     double* mu_y, double* cov_fy, double* var_y) noexcept nogil

# ---- added declarations (issue 2): per-element kernels used by the vectorised entry points ----
# log p(y|f) and its first three derivatives in f (probit, logit only: Laplace, R&W Alg. 3.1 / 5.1).
cdef int log_prob_derivatives(const LikelihoodSpec* spec, double y, double f,
                              double* lp, double* d1, double* d2, double* d3) noexcept nogil

# log p(y|f) for every kind (-inf allowed for the noise-free step on the wrong side).
cdef double log_prob(const LikelihoodSpec* spec, double y, double f) noexcept nogil

# KL / SVI: E_q[log p(y|f)] and its derivatives in the mean and the variance of q = N(mean, var).
cdef int expected_log_prob(const LikelihoodSpec* spec, double y, double mean, double var,
                           double* e, double* de_dmean, double* de_dvar) noexcept nogil

# P(y = +1) = int p(+1|f) N(f | mean, var) df.
cdef int predictive_probability(const LikelihoodSpec* spec, double mean, double var,
                                double* p) noexcept nogil
