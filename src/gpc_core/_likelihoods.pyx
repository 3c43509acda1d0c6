# Likelihood kernels: see _likelihoods.pxd for the contract.  (Implementation lands with issue 2.)

cdef int tilted_moments(const LikelihoodSpec* spec, double y, double cav_mean, double cav_var,
                        double* log_z, double* mean, double* var) noexcept nogil:
    return -1

cdef int slr_moments(const LikelihoodSpec* spec, double mean, double var,
                     double* mu_y, double* cov_fy, double* var_y) noexcept nogil:
    return -1
