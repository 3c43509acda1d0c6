# C interface of gpc._site_rule: the one Gaussian-site update that every schedule calls.

from gpc._likelihoods cimport LikelihoodSpec

# The codes are exported to Python by gpc._site_rule (cpdef), the rules and policies also by name
# in its RULES and ON_NEGATIVE (gpc.inference.rules).

cpdef enum:
    # rule: how a site is refitted
    RULE_EP = 0             # moment matching against the cavity (R&W eq. (3.56)-(3.59))
    RULE_PL = 1             # statistical linear regression against the marginal (PL eq. (15)-(16))

cpdef enum:
    # on_negative: what an EP update with a negative cavity or site variance does.  RAISE, KEEP and
    # KEEP_SKIP keep negative site precisions (EP's own fixed point) and differ where EP cannot update
    # (no positive cavity); CLIP, SKIP and PL replace every negative site update (all tau >= 0)
    NEG_RAISE = 0
    NEG_CLIP = 1
    NEG_SKIP = 2
    NEG_PL = 3
    NEG_KEEP = 4
    NEG_KEEP_SKIP = 5

cpdef enum:
    # what site_update returns
    SITE_UPDATED = 0            # tau, nu hold the new site
    SITE_NEGATIVE_CAVITY = 1    # on_negative = "raise" and the cavity is not a distribution
    SITE_LIKELIHOOD_FAILED = 2  # the likelihood's moments could not be evaluated
    SITE_KEPT = 3               # the policy kept the old site (tau, nu unchanged)
    SITE_FIXED = 4              # the policy replaced a negative EP update (tau, nu hold it)

# Refit one site from the marginal N(mean, var) of g (tau, nu: the old site on entry, the new one on
# return); s is the variance the label's f = g + e adds to g (the sparse engine's FITC variance,
# SEP eq. (1); 0 in the dense engine).
cdef int site_update(const LikelihoodSpec* spec, int rule, int on_negative, double damping,
                     double y, double mean, double var, double s, double* tau, double* nu,
                     double* cavity_var, long* n_fixed) noexcept nogil

# The evidence's per-site quantities against the cavity N(cmean, cvar) of g: log Z of the
# likelihood widened by s, and the derivatives d1, d2 in cmean of the log normaliser of what the
# site stands for (EP: the likelihood; PL: its linearisation).  Returns the likelihood's status.
cdef int site_log_z(const LikelihoodSpec* spec, int rule, double y, double cmean, double cvar,
                    double s, double tau, double nu, double* log_z, double* d1,
                    double* d2) noexcept nogil

# ValueError unless rule and on_negative are codes above (the entry check of every caller).
cdef int check_codes(int rule, int on_negative) except -1
