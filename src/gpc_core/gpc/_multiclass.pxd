# C interface of gpc._multiclass: the factor of the argmax likelihood between the label's latent
# f_t = f_y(x_i) and one competing latent f_o = f_k(x_i), k != y, with the outlier mixture of RMGPC
# eq. (10):
#
#     psi(f_t, f_o, z) = Theta(f_t - f_o)^(1 - z) c^z,    c = C^(-1/(C - 1))
#
# (so that the C - 1 factors of a point multiply to 1/C when z = 1: a uniformly random label),
# under the cavity N(f_t | m_t, v_t) N(f_o | m_o, v_o) Bern(z | sigmoid(lz_cav)).  This is what any
# multi-class EP engine over these factors needs per data point and competing class: the exact
# engine (gpc.multiclass.ep, RMGPC eq. (14)) and a sparse one on inducing points alike.  Pass
# lz_cav = -inf for no outliers (SMGPC, RMGPC section 4): psi = Theta(f_t - f_o).  A fixed label-noise
# rate (every z_i ~ Bern(rho) a priori) and RMGPC's Beta posterior over rho differ only in lz_cav.
#
# With s = sqrt(v_t + v_o), alpha = (m_t - m_o)/s, p = sigmoid(lz_cav) and r = phi/Phi:
#
#     Z = p c + (1 - p) Phi(alpha),           w = (1 - p) Phi(alpha) / Z,
#     g  = d log Z/d m_t  = -d log Z/d m_o    = w r(alpha) / s,
#     h  = d2 log Z/d m_t2 = d2 log Z/d m_o2  = -d2 log Z/d m_t d m_o = -g (alpha + w r(alpha)) / s,
#     (d log Z/d v = (g^2 + h)/2 for either latent),
#     tilted E f_t = m_t + v_t g, Var f_t = v_t + v_t^2 h;  E f_o = m_o - v_o g, Var f_o = v_o + v_o^2 h,
#     tilted P(z = 1) = p c / Z, and the site's Bernoulli factor has log-odds log c - log Phi(alpha)
#
# (docs/derivations-rmgpc.md, "The pair factor").  Status codes: 0 success; 1 invalid input (a
# variance <= 0 or a non-finite mean); 2 a result not representable (Z underflows, a non-finite
# moment, or for argmax_pair_site a tilted variance <= 0, which no Gaussian site can match).

ctypedef struct PairMoments:
    double log_z            # log Z of the tilted distribution
    double g                # d log Z / d m_t
    double h                # d2 log Z / d m_t2
    double mean_t, var_t    # tilted moments of f_t
    double mean_o, var_o    # tilted moments of f_o
    double p_outlier        # tilted P(z = 1)
    double site_log_odds    # log-odds of the site's Bernoulli factor in z: log c - log Phi(alpha)

cdef int argmax_pair_moments(double m_t, double v_t, double m_o, double v_o, double lz_cav,
                             double log_c, PairMoments* out) noexcept nogil

# The undamped EP site of the pair: tilted / cavity for each latent, in natural parameters
# (precision tau, location eta = mean * precision); tau may be negative (the mixture can widen a
# marginal).  Returns argmax_pair_moments' status.
cdef int argmax_pair_site(double m_t, double v_t, double m_o, double v_o, double lz_cav,
                          double log_c, PairMoments* mom, double* tau_t, double* eta_t,
                          double* tau_o, double* eta_o) noexcept nogil

# The same with the argmax step widened by an extra variance s_extra >= 0 (a sparse model's FITC
# variances s_y + s_k, docs/derivations-sparse-multiclass.md section 4): S^2 = v_t + v_o + s_extra in
# place of v_t + v_o above; g and h are then derivatives at that S, and the tilted moments of f_t and
# f_o are still m_t + v_t g, v_t + v_t^2 h and m_o - v_o g, v_o + v_o^2 h (the site's latent values
# have variances v_t, v_o; s_extra belongs to the factor).  s_extra = 0 gives the functions above,
# bit for bit (they call these).
cdef int argmax_pair_moments_s(double m_t, double v_t, double m_o, double v_o, double s_extra,
                               double lz_cav, double log_c, PairMoments* out) noexcept nogil
cdef int argmax_pair_site_s(double m_t, double v_t, double m_o, double v_o, double s_extra,
                            double lz_cav, double log_c, PairMoments* mom, double* tau_t,
                            double* eta_t, double* tau_o, double* eta_o) noexcept nogil

# One damped refinement of the pair sites of the points start:stop (refine_pairs' loop, RMGPC
# eq. (14)), unchecked: arrays (n, l) indexed [i, k], others[i, j] the j-th class k != y[i]; means and
# varis the marginals of every latent value (the target's moved by each pair of its point in turn);
# fitc (read only if has_fitc) the extra variances s of argmax_pair_moments_s; prior_sd the scales
# of the returned mismatch.  A caller checks shapes, labels and the row range first.
cdef double refine_pair_rows(Py_ssize_t start, Py_ssize_t stop, const Py_ssize_t[::1] y,
                             const Py_ssize_t[:, ::1] others, double[:, ::1] tau_t,
                             double[:, ::1] eta_t, double[:, ::1] tau_o, double[:, ::1] eta_o,
                             double[:, ::1] lam, const double[::1] lam_i,
                             const double[:, ::1] means, const double[:, ::1] varis,
                             const double[:, ::1] fitc, bint has_fitc,
                             const double[:, ::1] prior_sd, double damping, bint robust,
                             double log_c, bint fixed_precisions) noexcept nogil

# The cavity of the pair site (i, k) (docs/derivations-sparse-multiclass.md section 3): the marginal
# N(m_y, v_y) of the label's latent value less the site's factor exp(-tau_t f^2/2 + eta_t f) on it,
# and N(m_k, v_k) of the competitor's less exp(-tau_o f^2/2 + eta_o f); False (outputs unset) when a
# cavity precision is not positive.  The exact engine's pair loop and the sparse engine's evidence
# pass take their cavities here.  In variance form, v_t = v_y/(1 - tau_t v_y) and
# m_t = (m_y - eta_t v_y)/(1 - tau_t v_y) (1/v_y - tau_t > 0 iff 1 - tau_t v_y > 0 for v_y > 0): a
# marginal of variance 0 (a sparse row whose a_ik underflows to 0) is then its own cavity, the
# point mass at m_y, where the precision form made it 0/0.
cdef inline bint pair_cavity(double m_y, double v_y, double tau_t, double eta_t, double m_k,
                             double v_k, double tau_o, double eta_o, double* m_t, double* v_t,
                             double* m_o, double* v_o) noexcept nogil:
    cdef double d_t = 1.0 - tau_t * v_y, d_o = 1.0 - tau_o * v_k
    if not (d_t > 0 and d_o > 0):
        return False
    v_t[0] = v_y / d_t
    v_o[0] = v_k / d_o
    m_t[0] = (m_y - eta_t * v_y) / d_t
    m_o[0] = (m_k - eta_o * v_k) / d_o
    return True
