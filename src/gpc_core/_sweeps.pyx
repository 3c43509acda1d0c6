# Sequential site sweeps over a dense Gaussian posterior: after each site's refit by the site rule
# (gpc._site_rule: EP's moment matching or PL's statistical linear regression) the posterior takes
# the site's rank-one update.
#
# The posterior N(mu, Sigma) of the latent values is updated after each site by the rank-one change
#     Sigma <- Sigma - c s s^T,  s = Sigma e_i,  c = dtau / (1 + dtau Sigma_ii)
#     mu    <- mu + s (dnu - dtau mu_i) / (1 + dtau Sigma_ii)                (R&W §3.6, Alg. 3.5)
# Applied one at a time these are memory-bound BLAS-2 updates.  Here they are deferred: the pending
# updates of the current block are kept as rows p_k with weights c_k, the column needed for site i is
#     s = Sigma_0 e_i - sum_k c_k p_k[i] p_k                         (a loop over the block's rows)
# and each full block is applied to Sigma_0 as two rank-b updates (dsyrk, the positive and the
# negative weights separately).  Block size 1 is the plain rank-one sweep.
#
# Sigma is held in its lower triangle (C order); Fortran BLAS sees the transpose, so 'U' below
# addresses that lower triangle.

from gpc._blas cimport signed_gram
from gpc._likelihoods cimport LikelihoodSpec, make_spec
from gpc._site_rule cimport (site_update, SITE_UPDATED, SITE_NEGATIVE_CAVITY, SITE_LIKELIHOOD_FAILED,
                             SITE_KEPT, NEG_KEEP, NEG_KEEP_SKIP, check_codes)

cpdef enum:
    # sequential_sweep's status beside the site rule's SITE_UPDATED (0), SITE_NEGATIVE_CAVITY (1)
    # and SITE_LIKELIHOOD_FAILED (2): an update would make the posterior indefinite
    SWEEP_INDEFINITE = 3


cdef void column(const double* S, Py_ssize_t n, Py_ssize_t i, const double* P, const double* c,
                 Py_ssize_t nb, double* s) noexcept nogil:
    """s = (Sigma_0 - sum_k c_k p_k p_k^T) e_i from the lower triangle of Sigma_0 and the block.

    A plain loop, not dgemv: this product (nb x n, at most 64 x n) is made once per site, and a
    multi-threaded BLAS pays its threads' hand-off on every call, which a per-site call cannot
    amortise."""
    cdef Py_ssize_t j, k
    cdef double wk
    cdef const double* p
    for j in range(i + 1):
        s[j] = S[i * n + j]
    for j in range(i + 1, n):
        s[j] = S[j * n + i]
    for k in range(nb):
        p = P + k * n
        wk = c[k] * p[i]
        for j in range(n):
            s[j] -= wk * p[j]


cdef inline void flush(double* S, Py_ssize_t n, const double* P, const double* c, Py_ssize_t nb,
                       double* Q) noexcept nogil:
    """Sigma_0 -= sum_k c_k p_k p_k^T in the lower triangle: two rank-b updates (dsyrk), the
    positive weights first (gpc/_blas.pxd's signed_gram, Q its scratch of nb x n, one sign at a
    time)."""
    signed_gram(S, P, c, Q, <int> nb, <int> n, -1.0, 1.0, False)


def sequential_sweep(double[:, ::1] Sigma, double[::1] mu, double[::1] tau, double[::1] nu,
                     const double[::1] y, const Py_ssize_t[::1] order, int rule, int kind,
                     double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                     object py_likelihood, double damping, int on_negative, Py_ssize_t block,
                     double[:, ::1] work):
    """One sequential sweep of the site rule ``rule`` (gpc._site_rule) over the sites in ``order``.

    Updates Sigma (lower triangle), mu, tau and nu in place.  ``work`` is scratch of shape (2 * block + 3, n).  Returns (status, index, value, n_fixed):
    status SITE_UPDATED (0) = done; SITE_NEGATIVE_CAVITY = a negative cavity variance at site ``index``
    under on_negative="raise" (value = the cavity variance); SITE_LIKELIHOOD_FAILED = the likelihood
    could not be evaluated at site ``index``; SWEEP_INDEFINITE = an update
    would make the posterior indefinite (1 + dtau Sigma_ii <= 0; under on_negative "keep" and
    "keep-skip" such an update is not an error but leaves the site as it was).  Updates handled by
    the on_negative policy are counted in n_fixed.
    """
    cdef Py_ssize_t n = Sigma.shape[0], t, i, nb = 0, k
    cdef Py_ssize_t bad_index = -1
    cdef int status = 0, site_status
    cdef long n_fixed = 0
    cdef double sii, mui, tau_new, nu_new, dtau, dnu, denom, ck, g, bad_value = 0.0
    cdef LikelihoodSpec spec
    if Sigma.shape[1] != n or mu.shape[0] != n or tau.shape[0] != n or nu.shape[0] != n \
            or y.shape[0] != n or order.shape[0] > n:
        raise ValueError("sequential_sweep: inconsistent array sizes")
    if block < 1:
        raise ValueError("block must be >= 1")
    if block > n or work.shape[0] < 2 * block + 3 or work.shape[1] != n:
        raise ValueError("block must be <= n and work of shape (2 * block + 3, n)")
    if not (0.0 < damping <= 1.0):
        raise ValueError("damping must be in (0, 1]")
    check_codes(rule, on_negative)
    for t in range(order.shape[0]):
        if order[t] < 0 or order[t] >= n:
            raise ValueError("order holds an index out of range")
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, py_likelihood)
    cdef double* P = &work[0, 0]                 # block rows p_k
    cdef double* Q = &work[block, 0]             # scaled copies for dsyrk
    cdef double* s = &work[2 * block, 0]         # current column
    cdef double* cw = &work[2 * block + 1, 0]    # weights c_k
    with nogil:
        for t in range(order.shape[0]):
            i = order[t]
            column(&Sigma[0, 0], n, i, P, cw, nb, s)
            sii = s[i]
            mui = mu[i]
            tau_new = tau[i]
            nu_new = nu[i]
            site_status = site_update(&spec, rule, on_negative, damping, y[i], mui, sii, 0.0,
                                      &tau_new, &nu_new, &bad_value, &n_fixed)
            if site_status == SITE_NEGATIVE_CAVITY or site_status == SITE_LIKELIHOOD_FAILED:
                status = site_status
                bad_index = i
                break
            if site_status == SITE_KEPT:
                continue
            dtau = tau_new - tau[i]
            dnu = nu_new - nu[i]
            denom = 1.0 + dtau * sii
            if not (denom > 0.0):                  # the new posterior would not be positive definite
                if on_negative == NEG_KEEP or on_negative == NEG_KEEP_SKIP:
                    if site_status == SITE_UPDATED:
                        n_fixed += 1               # (a policy's own update is counted already)
                    continue                       # the fallback: the site keeps its old value
                tau[i] = tau_new
                nu[i] = nu_new
                status = SWEEP_INDEFINITE
                bad_index = i
                bad_value = denom
                break
            tau[i] = tau_new
            nu[i] = nu_new
            # mu += s (dnu - dtau mu_i) / (1 + dtau Sigma_ii); the Sigma update joins the block
            g = (dnu - dtau * mui) / denom
            for k in range(n):
                mu[k] += g * s[k]
            ck = dtau / denom
            for k in range(n):
                P[nb * n + k] = s[k]
            cw[nb] = ck
            nb += 1
            if nb == block:
                flush(&Sigma[0, 0], n, P, cw, nb, Q)
                nb = 0
        if nb > 0:
            flush(&Sigma[0, 0], n, P, cw, nb, Q)
    return status, bad_index, bad_value, n_fixed
