# C interface of gpc._site_rule: the one Gaussian-site update that every schedule calls.

from gpc._likelihoods cimport LikelihoodSpec

cdef enum:
    # rule: how a site is refitted
    RULE_EP = 0             # moment matching against the cavity (R&W eq. (3.56)-(3.59))
    RULE_PL = 1             # statistical linear regression against the marginal (PL eq. (15)-(16))

cdef enum:
    # on_negative: what an EP update with a negative cavity or site variance does.  RAISE, KEEP and
    # KEEP_SKIP keep negative site precisions (EP's own fixed point) and differ where EP cannot update
    # (no positive cavity); CLIP, SKIP and PL replace every negative site update (all tau >= 0)
    NEG_RAISE = 0
    NEG_CLIP = 1
    NEG_SKIP = 2
    NEG_PL = 3
    NEG_KEEP = 4
    NEG_KEEP_SKIP = 5

cdef enum:
    # what site_update returns
    SITE_UPDATED = 0            # tau, nu hold the new site
    SITE_NEGATIVE_CAVITY = 1    # on_negative = "raise" and the cavity is not a distribution
    SITE_LIKELIHOOD_FAILED = 2  # the likelihood's moments could not be evaluated
    SITE_KEPT = 3               # the policy kept the old site (tau, nu unchanged)
    SITE_FIXED = 4              # the policy replaced a negative EP update (tau, nu hold it)

cdef int site_update(const LikelihoodSpec* spec, int rule, int on_negative, double damping,
                     double y, double mean, double var, double* tau, double* nu,
                     double* cavity_var, long* n_fixed) noexcept nogil
