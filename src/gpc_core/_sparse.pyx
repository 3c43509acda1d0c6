# One step of scalable EP with inducing points (SEP paper §2.2-§2.3) in compiled form: the passes
# over a block of rows, their BLAS products (gpc/_blas.pxd) with the GIL released, the per-row
# site update (the one site rule of gpc._site_rule) and evidence terms in one pass each.
#
# Layout (as in gpc/_blas.pxd): a C-ordered (k, m) array is the Fortran (m, k) matrix of its
# transpose, so its rows are Fortran columns; a C-ordered lower-triangular (m, m) matrix L is the
# Fortran upper-triangular matrix U = L^T ('U', lda = m).  Every product below is written for the
# C-ordered meaning and translated in a comment.  Shapes are checked at the entry points; nothing
# past the checks trusts the caller.
#
# Precision: the block functions (whiten_block, refine_block, evidence_block) take a block's rows
# and the m x m factors they multiply as ``real`` (gpc/_blas.pxd): double, or float for the opt-in
# mixed precision of minibatch SEP (gpc.sparse.estimator, ``precision="mixed"``), in which the
# b x m x m products of SEP §2.3's minibatch step (eq. (6)) run in single precision while the
# per-row marginals, sites and evidence terms, and the m x m sums, are double.

from libc.math cimport isfinite, log1p, sqrt
from libc.string cimport memcpy, memset

from gpc._blas cimport (check_columns, check_square, cross_rows, gemv_rows, real, row_dot,
                        signed_gram, times_lower)
from gpc._likelihoods cimport LikelihoodSpec, make_spec
from gpc._site_rule cimport (site_update, site_log_z, check_codes, RULE_PL, SITE_NEGATIVE_CAVITY,
                             SITE_LIKELIHOOD_FAILED)

import numpy as np

cdef int _check_factor(Py_ssize_t rows, Py_ssize_t cols, str name, Py_ssize_t m) except -1:
    """An m x m factor (or m x m sums) beside a block A of m columns: square, and A's columns."""
    check_square(rows, cols, name)
    return check_columns(m, rows, "A")


# -- the per-row site update and evidence terms (SEP §2.2, eq. (1)-(3)), through the site rule ---


cdef int _check_rows(Py_ssize_t b, tuple lengths) except -1:
    for length in lengths:
        if length != b:
            raise ValueError(f"row arrays must have {b} entries, got {length}")
    return 0


cdef inline bint _cavity(double mean, double var, double tau, double nu, double* cmean,
                         double* cvar, double* ratio) noexcept nogil:
    """The cavity N(cmean, cvar) of a_i^T w, q / site, in variance form,

        v = σ² / (1 - τσ²),   c = (μ - σ²ν) / (1 - τσ²),   ratio = v/σ² = 1 / (1 - τσ²),

    from the marginal N(μ, σ²) of a_i^T w and the row's site (τ, ν).  False when the cavity has
    no positive precision (1 - τσ² ≤ 0, i.e. 1/σ² - τ ≤ 0) or is not finite.  σ² = 0 (a row
    whose a_i underflows to 0: far, against the length-scales, from every inducing point) is a
    proper cavity, the point mass at c = μ (infinite precision), where the precision form
    1/σ² - τ is 0/0."""
    cdef double keep = 1.0 - tau * var
    if not (var >= 0.0 and isfinite(var) and isfinite(mean) and keep > 0.0 and isfinite(keep)):
        return False
    ratio[0] = 1.0 / keep
    cvar[0] = var * ratio[0]
    cmean[0] = (mean - var * nu) * ratio[0]
    return isfinite(cmean[0]) and isfinite(cvar[0])


cdef int _refine_loop(const LikelihoodSpec* spec, int rule, int on_negative, double damping,
                      Py_ssize_t b, const double* y, const double* mean, const double* var,
                      const double* s, const double* tau, const double* nu, double* tau_out,
                      double* nu_out, const double* mean_old, const double* var_old,
                      const double* cross, Py_ssize_t* index, double* value, long* n_fixed,
                      int* failed) noexcept nogil:
    """The loop of :func:`refine_rows` over b rows (``mean_old`` NULL: sites along a_i).  Returns
    the status; ``index`` and ``value`` say where a cavity that is not a distribution stopped it."""
    cdef Py_ssize_t i
    cdef double t, v, m_in, v_in, keep, cmean, cvar, back
    cdef int st
    for i in range(b):
        t = tau[i]
        v = nu[i]
        m_in = mean[i]
        v_in = var[i]
        if mean_old != NULL and rule != RULE_PL:
            keep = 1.0 - t * var_old[i]
            if keep > 0.0:
                cvar = var[i] + t * cross[i] * cross[i] / keep
                cmean = mean[i] + cross[i] * (t * mean_old[i] - v) / keep
                back = 1.0 + t * cvar
                v_in = cvar / back
                m_in = (cmean + cvar * v) / back
            else:
                m_in = mean_old[i]
                v_in = var_old[i]
        st = site_update(spec, rule, on_negative, damping, y[i], m_in, v_in, s[i], &t, &v, value,
                         n_fixed)
        if st == SITE_NEGATIVE_CAVITY:
            index[0] = i
            return st
        if st == SITE_LIKELIHOOD_FAILED or not (isfinite(t) and isfinite(v)):
            t = tau[i]
            v = nu[i]
            failed[0] += 1
        tau_out[i] = t
        nu_out[i] = v
    return 0


def refine_rows(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                object py_likelihood, int rule, int on_negative, double damping,
                const double[::1] y, const double[::1] mean, const double[::1] var,
                const double[::1] s, const double[::1] tau, const double[::1] nu,
                double[::1] tau_out, double[::1] nu_out, const double[::1] mean_old=None,
                const double[::1] var_old=None, const double[::1] cross=None):
    """Each row's site refitted by the site rule (gpc._site_rule.site_update, rule ``rule``,
    policy ``on_negative``, ``damping``) on g = a_i^T w, whose label sees f = g + e with the FITC
    variance s_i (SEP eq. (1)-(2), §2.2); (mean, var) are the marginals of a_i^T w under q and the
    likelihood is given by its ``compiled_spec()``.  The new sites go to ``tau_out``, ``nu_out``.

    With ``mean_old``, ``var_old``, ``cross`` the sites are held by q along earlier directions
    a'_i (a minibatch's kept sites): the EP cavity q / exp(-½ τ (a'^T w)² + ν a'^T w) seen along
    a_i is, by Sherman-Morrison,

        v = σ² + τ ξ² / (1 - τ σ'²),   c = μ + ξ (τ μ' - ν) / (1 - τ σ'²),

    from the marginals (μ, σ²) of a^T w, (μ', σ'²) of a'^T w and ξ = a^T Σ a', and the rule gets
    the marginal that this cavity and the old site along a_i make, N((c + vν)/(1 + τv),
    v/(1 + τv)), whose cavity is N(c, v).  1 - τσ'² ≤ 0 (q less the old site has no positive
    precision along a') hands the rule the marginal along a', whose cavity is then not proper.
    PL's rule linearises against q's own marginal along a_i.  The refined site lies along a_i.

    Returns (status, index, value, n_fixed, n_failed): status SITE_NEGATIVE_CAVITY (1) when the
    rule stopped at row ``index`` on a cavity that is not a distribution (``value`` its variance;
    the rows after it are not refined), else 0; ``n_fixed`` counts the updates the on_negative
    policy handled; ``n_failed`` the rows whose likelihood integral failed or whose new site is
    not finite, which keep their sites.
    """
    cdef LikelihoodSpec spec
    cdef Py_ssize_t b = y.shape[0], index = -1
    cdef bint moved = mean_old is not None or var_old is not None or cross is not None
    _check_rows(b, (mean.shape[0], var.shape[0], s.shape[0], tau.shape[0], nu.shape[0],
                    tau_out.shape[0], nu_out.shape[0]))
    if moved:
        if mean_old is None or var_old is None or cross is None:
            raise ValueError("mean_old, var_old and cross go together")
        _check_rows(b, (mean_old.shape[0], var_old.shape[0], cross.shape[0]))
    if not (0.0 < damping <= 1.0):
        raise ValueError(f"damping must be in (0, 1], got {damping}")
    check_codes(rule, on_negative)
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, py_likelihood)
    if b == 0:
        return 0, -1, 0.0, 0, 0
    cdef double value = 0.0
    cdef long n_fixed = 0
    cdef int status, failed = 0
    with nogil:
        status = _refine_loop(&spec, rule, on_negative, damping, b, &y[0], &mean[0], &var[0],
                              &s[0], &tau[0], &nu[0], &tau_out[0], &nu_out[0],
                              &mean_old[0] if moved else NULL, &var_old[0] if moved else NULL,
                              &cross[0] if moved else NULL, &index, &value, &n_fixed, &failed)
    return status, index, value, n_fixed, failed


cdef int _evidence_loop(const LikelihoodSpec* spec, int rule, Py_ssize_t b, const double* y,
                        const double* mean, const double* var, const double* s, const double* tau,
                        const double* nu, double* g_s, double* d1, double* e,
                        double* total) noexcept nogil:
    """The loop of :func:`evidence_rows`: adds Σ log Z̃_i to ``total`` in row order and returns the
    rows left out."""
    cdef Py_ssize_t i
    cdef double cmean, cvar, ratio, log_z, a1, a2, gs
    cdef int bad = 0
    for i in range(b):
        if (_cavity(mean[i], var[i], tau[i], nu[i], &cmean, &cvar, &ratio)
                and site_log_z(spec, rule, y[i], cmean, cvar, s[i], tau[i], nu[i], &log_z,
                               &a1, &a2) == 0):
            # ½ log(1 + τv) = -½ log(1 - τσ²) and ½ (c²/v - μ²/σ²) = ½ (τμ² - 2μν + σ²ν²)
            # / (1 - τσ²): the same terms without dividing by σ² (finite at σ² = 0)
            total[0] += (log_z - 0.5 * log1p(-tau[i] * var[i])
                         + 0.5 * (tau[i] * mean[i] * mean[i] - 2.0 * mean[i] * nu[i]
                                  + var[i] * nu[i] * nu[i]) * ratio)
            gs = 0.5 * (a1 * a1 + a2)
            g_s[i] = gs
            d1[i] = a1
            e[i] = (a1 * (tau[i] * mean[i] - nu[i]) + 2.0 * gs) * ratio
        else:
            g_s[i] = 0.0
            d1[i] = 0.0
            e[i] = 0.0
            bad += 1
    return bad


def evidence_rows(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                  object py_likelihood, int rule, const double[::1] y, const double[::1] mean,
                  const double[::1] var, const double[::1] s, const double[::1] tau,
                  const double[::1] nu, double[::1] g_s, double[::1] d1, double[::1] e):
    """Σ log Z̃_i of SEP eq. (3) over the rows and the row weights of its gradient, eq. (4);
    returns (total, rows left out).

    log Z̃_i = log Z_i + ½ log(1 + τ v) + ½ c²/v - ½ μ²/σ² for the cavity N(c, v) and the
    marginal N(μ, σ²) of a_i^T w, log Z_i the likelihood's (gpc._site_rule.site_log_z).  Per
    row: d1 = ∂ log Z_i/∂c, g_s = ∂ log Z_i/∂s_i = ½(d1² + d2) and e = (d1 (τ μ - ν) + 2 g_s)
    v/σ², the weight of Σ_w a_i in the row's gradient (:func:`gpc.sparse.ep.block_evidence`), of
    the likelihood the site stands for under ``rule`` (PL: its linearisation).  A row without a
    proper cavity, or whose likelihood integral fails, is left out: its terms and weights are 0.
    """
    cdef LikelihoodSpec spec
    cdef Py_ssize_t b = y.shape[0]
    _check_rows(b, (mean.shape[0], var.shape[0], s.shape[0], tau.shape[0], nu.shape[0],
                    g_s.shape[0], d1.shape[0], e.shape[0]))
    check_codes(rule, 0)
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, py_likelihood)
    cdef double total = 0.0
    cdef int bad = 0
    if b == 0:
        return total, bad
    with nogil:
        bad = _evidence_loop(&spec, rule, b, &y[0], &mean[0], &var[0], &s[0], &tau[0], &nu[0],
                             &g_s[0], &d1[0], &e[0], &total)
    return total, bad


# -- elementwise passes over a block ------------------------------------------------------------

def row_dots(const double[:, ::1] A, const double[:, ::1] B, double[::1] out):
    """out_i := a_i^T b_i for the rows of A and B (k x m); with B = A, |a_i|²."""
    if out.shape[0] != A.shape[0] or B.shape[0] != A.shape[0] or B.shape[1] != A.shape[1]:
        raise ValueError(f"A is {A.shape[0]} x {A.shape[1]}, B {B.shape[0]} x {B.shape[1]}, out "
                         f"{out.shape[0]}")
    cdef Py_ssize_t k = A.shape[0], m = A.shape[1], i, j
    cdef double acc
    with nogil:
        for i in range(k):
            acc = 0.0
            for j in range(m):
                acc = acc + A[i, j] * B[i, j]
            out[i] = acc


cdef void _site_rows_gradient(real* G, const real* A, const double* beta, const double* mu,
                             const double* tau, const double* g_s, Py_ssize_t k,
                             Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef double bi, ti, gi
    for i in range(k):
        bi = beta[i]
        ti = tau[i]
        gi = 2.0 * g_s[i]
        for j in range(m):
            G[i * m + j] = bi * mu[j] - ti * G[i * m + j] - gi * A[i * m + j]


def site_rows_gradient(double[:, ::1] G, const double[:, ::1] A, const double[::1] beta,
                       const double[::1] mu, const double[::1] tau, const double[::1] g_s):
    """G (k x m, holding A Σ_w on entry) := β μ^T - diag(τ) A Σ_w - 2 diag(g_s) A, one pass:
    ∂ log Z_q/∂A for sites that follow their rows (R&W eq. (5.27) in whitened coordinates, see
    :func:`gpc.sparse.ep.block_evidence`)."""
    cdef Py_ssize_t k = G.shape[0], m = G.shape[1]
    if A.shape[0] != k or A.shape[1] != m:
        raise ValueError(f"A is {A.shape[0]} x {A.shape[1]}, G is {k} x {m}")
    if beta.shape[0] != k or tau.shape[0] != k or g_s.shape[0] != k or mu.shape[0] != m:
        raise ValueError("beta, tau, g_s need one entry per row and mu one per column")
    if k == 0 or m == 0:
        return
    with nogil:
        _site_rows_gradient(&G[0, 0], &A[0, 0], &beta[0], &mu[0], &tau[0], &g_s[0], k, m)


cdef void _cavity_rows_gradient(real* G, real* Y, const real* A, const double* d1,
                                const double* mu, const double* e, const double* g_s,
                                Py_ssize_t k, Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef double di, ei, gi, v
    for i in range(k):
        di = d1[i]
        ei = e[i]
        gi = g_s[i]
        for j in range(m):
            v = di * mu[j] + ei * G[i * m + j] - 2.0 * gi * A[i * m + j]
            G[i * m + j] = v
            Y[i * m + j] = v + gi * A[i * m + j]


def cavity_rows_gradient(double[:, ::1] G, double[:, ::1] Y, const double[:, ::1] A,
                           const double[::1] d1, const double[::1] mu, const double[::1] e,
                           const double[::1] g_s):
    """The rows' derivatives of SEP eq. (4), from A Σ_w (held in G on entry), one pass:

    G := d1 μ^T + diag(e) A Σ_w - 2 diag(g_s) A   (∂ log Z_i/∂a_i with the cavity held), and
    Y := G + diag(g_s) A                           (whose Y^T A is the rows' K_uu part).

    See :func:`gpc.sparse.ep.block_evidence`.
    """
    cdef Py_ssize_t k = G.shape[0], m = G.shape[1]
    if A.shape[0] != k or A.shape[1] != m or Y.shape[0] != k or Y.shape[1] != m:
        raise ValueError(f"G, Y and A must have the same shape, got {k} x {m}, {Y.shape[0]} x "
                         f"{Y.shape[1]}, {A.shape[0]} x {A.shape[1]}")
    if d1.shape[0] != k or e.shape[0] != k or g_s.shape[0] != k or mu.shape[0] != m:
        raise ValueError("d1, e, g_s need one entry per row and mu one per column")
    if k == 0 or m == 0:
        return
    with nogil:
        _cavity_rows_gradient(&G[0, 0], &Y[0, 0], &A[0, 0], &d1[0], &mu[0], &e[0], &g_s[0], k, m)


def symmetric_from_upper(const double[:, ::1] X, double[:, ::1] out, double scale):
    """out (m x m) := scale · X's upper triangle (diagonal included) mirrored: out_ij =
    scale · X_min(i,j),max(i,j).  With scale = -½ and X = A^T G this is sym(Φ) of the Cholesky
    reverse rule, Φ = the lower triangle of -X^T with its diagonal halved (gpc.sparse.core.inducing)."""
    check_square(X.shape[0], X.shape[1], "X")
    check_square(out.shape[0], out.shape[1], "out")
    if out.shape[0] != X.shape[0]:
        raise ValueError(f"out is {out.shape[0]} x {out.shape[0]}, X {X.shape[0]} x {X.shape[0]}")
    cdef Py_ssize_t m = X.shape[0], i, j
    cdef double v
    with nogil:
        for i in range(m):
            out[i, i] = scale * X[i, i]
            for j in range(i + 1, m):
                v = scale * X[i, j]
                out[i, j] = v
                out[j, i] = v


# -- one block of a step's rows ------------------------------------------------------------------
#
# A step's rows are cut into fixed blocks (gpc._parallel.row_blocks); each function below does one
# block's work with the GIL released after its entry checks, so that gpc._parallel.over_blocks runs
# blocks in threads.  A block writes its own rows of the step's arrays and its own m x m partial
# sums, which sum_blocks adds in block order: the bits do not depend on how the blocks are shared
# out among threads.

cpdef enum:
    # refine_block's ``sums``: what its partial sums (dP, dh) of q's natural parameters hold
    SUMS_NEW = 0          # the new sites along a_i: Σ τ_new a aᵀ, Σ ν_new a
    SUMS_CHANGE = 1       # their change along a_i: Σ (τ_new - τ) a aᵀ, Σ (ν_new - ν) a
    SUMS_SWAP = 2         # the new along a_i less the old along a'_i (sites kept in u-space)


cdef void _marginals(const real* Ri, const double* mu, const real* A, real* B, double* mean,
                     double* var, int k, int m) noexcept nogil:
    """B := rows R^-1 a_i of A, mean = A μ, var_i = |R^-1 a_i|² (the marginals of a_i^T w under
    q = N(μ, R^-T R^-1)); mean and var accumulated in double."""
    cdef Py_ssize_t i
    memcpy(B, A, <size_t> k * m * sizeof(real))
    times_lower(Ri, B, k, m, False)
    gemv_rows(A, mu, mean, k, m, False, 0.0)
    for i in range(k):
        var[i] = row_dot(B + i * m, B + i * m, m)


cdef int _check_block(Py_ssize_t k, Py_ssize_t m, str name, Py_ssize_t rows,
                      Py_ssize_t cols) except -1:
    if rows != k or cols != m:
        raise ValueError(f"{name} is {rows} x {cols}, the block is {k} x {m}")
    return 0


def whiten_block(const real[:, ::1] Li, const real[:, ::1] K, real[:, ::1] A,
                 const double[::1] kdiag, double[::1] s):
    """A (k x m) := rows L^-1 k_i of K (A may be K itself) and s_i := max(kdiag_i - |a_i|², 0):
    the whitened rows and FITC variances of SEP eq. (1) (gpc.sparse.core.inducing).  Float Li, K
    and A: the product in single precision, |a_i|² summed in double."""
    check_square(Li.shape[0], Li.shape[1], "Li")
    cdef Py_ssize_t k = K.shape[0], m = Li.shape[0], i
    _check_block(k, m, "K", K.shape[0], K.shape[1])
    _check_block(k, m, "A", A.shape[0], A.shape[1])
    _check_rows(k, (kdiag.shape[0], s.shape[0]))
    if k == 0:
        return
    cdef double acc
    with nogil:
        if &A[0, 0] != &K[0, 0]:
            memcpy(&A[0, 0], &K[0, 0], <size_t> k * m * sizeof(real))
        times_lower(&Li[0, 0], &A[0, 0], <int> k, <int> m, False)
        for i in range(k):
            acc = kdiag[i] - row_dot(&A[i, 0], &A[i, 0], <int> m)
            s[i] = acc if acc > 0.0 else 0.0


def marginal_block(const double[:, ::1] Ri, const double[::1] mu, const double[:, ::1] A,
                   double[:, ::1] B, double[::1] mean, double[::1] var, bint covariance=False):
    """Marginals of a_i^T w under q = N(μ, R^-T R^-1) for the rows of A (k x m): B := rows
    R^-1 a_i, mean = A μ, var_i = |R^-1 a_i|²; with ``covariance`` B then := rows Σ_w a_i."""
    check_square(Ri.shape[0], Ri.shape[1], "Ri")
    cdef Py_ssize_t k = A.shape[0], m = Ri.shape[0]
    _check_block(k, m, "A", A.shape[0], A.shape[1])
    _check_block(k, m, "B", B.shape[0], B.shape[1])
    _check_rows(k, (mean.shape[0], var.shape[0]))
    if mu.shape[0] != m:
        raise ValueError(f"mu has {mu.shape[0]} entries, q is {m}-dimensional")
    if k == 0:
        return
    with nogil:
        _marginals(&Ri[0, 0], &mu[0], &A[0, 0], &B[0, 0], &mean[0], &var[0], <int> k, <int> m)
        if covariance:
            times_lower(&Ri[0, 0], &B[0, 0], <int> k, <int> m, True)


def weighted_sums_block(const double[:, ::1] A, const double[::1] tau, const double[::1] nu,
                        double[:, ::1] dP, double[::1] dh):
    """A block's sums: dP (m x m, its lower triangle; the strict upper one is not written) :=
    A^T diag(τ) A and dh := A^T ν, for weights of either sign (two dsyrk: gpc/_blas.pxd's
    signed_gram)."""
    cdef Py_ssize_t k = A.shape[0], m = A.shape[1]
    _check_rows(k, (tau.shape[0], nu.shape[0]))
    _check_factor(dP.shape[0], dP.shape[1], "dP", m)
    _check_rows(m, (dh.shape[0],))
    cdef double[:, ::1] work = np.empty((max(k, 1), m))
    with nogil:
        memset(&dh[0], 0, <size_t> m * sizeof(double))
        signed_gram(&dP[0, 0], &A[0, 0], &tau[0] if k > 0 else NULL, &work[0, 0], <int> k,
                    <int> m, 1.0, 0.0)
        if k > 0:
            gemv_rows(&A[0, 0], &nu[0], &dh[0], <int> k, <int> m, True, 1.0)


def refine_block(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                 object py_likelihood, int rule, int on_negative, double damping, int sums,
                 const double[::1] y, const real[:, ::1] A, const double[::1] s,
                 const real[:, ::1] Ri, const double[::1] mu, const double[::1] tau,
                 const double[::1] nu, double[::1] tau_out, double[::1] nu_out,
                 double[:, ::1] dP, double[::1] dh, const float[:, ::1] V_old=None,
                 const real[:, ::1] L=None, const real[:, ::1] Li=None,
                 real[:, ::1] V_out=None):
    """One block's sites refined against q = N(μ, R^-T R^-1) (SEP §2.2; ``rule``, ``on_negative``,
    ``damping`` as in :func:`refine_rows`) and the block's sums of q's natural parameters.

    The marginals of a_i^T w come from one triangular product with R^-1 (``Ri``).  ``sums`` says
    what dP (m x m, its lower triangle; the strict upper one is not written) and dh hold: SUMS_NEW Σ τ_new a aᵀ and Σ ν_new a,
    SUMS_CHANGE Σ (τ_new - τ) a aᵀ and Σ (ν_new - ν) a, SUMS_SWAP the new sites less the old ones,
    which q holds along the rows' kept u-space directions v_i (``V_old``, float32; zero rows for
    rows without a site): a'_i = L^T v_i, their cavities by Sherman-Morrison (:func:`refine_rows`),
    Σ τ_new a aᵀ - Σ τ a' a'ᵀ and Σ ν_new a - Σ ν a'.  A block without old sites skips a'.  With
    ``Li`` and ``V_out`` the rows' new directions v_i = L^-T a_i go to V_out (in full precision: the
    gradient's pass uses them before they are stored in float32, :func:`evidence_block`).

    A, Ri, L, Li and V_out are all double or all float (the mixed precision: the rows' products
    with the factors and their Gram products in single precision; the marginals, the sites and
    the sums dP, dh in double, :func:`gpc._blas.signed_gram`).

    Returns (status, index, value, n_fixed, n_failed) as :func:`refine_rows`; dP and dh are not
    written when status is not 0.
    """
    cdef LikelihoodSpec spec
    cdef Py_ssize_t k = y.shape[0], m = A.shape[1], i, j, index = -1
    cdef bint swap = sums == SUMS_SWAP, change = sums == SUMS_CHANGE, moved = False
    cdef bint directions = V_out is not None
    if sums not in (SUMS_NEW, SUMS_CHANGE, SUMS_SWAP):
        raise ValueError(f"sums must be SUMS_NEW, SUMS_CHANGE or SUMS_SWAP, got {sums}")
    _check_factor(Ri.shape[0], Ri.shape[1], "Ri", m)
    _check_block(k, m, "A", A.shape[0], A.shape[1])
    _check_rows(k, (s.shape[0], tau.shape[0], nu.shape[0], tau_out.shape[0], nu_out.shape[0]))
    _check_factor(dP.shape[0], dP.shape[1], "dP", m)
    _check_rows(m, (mu.shape[0], dh.shape[0]))
    if swap:
        if V_old is None or L is None:
            raise ValueError("SUMS_SWAP needs V_old and L")
        _check_factor(L.shape[0], L.shape[1], "L", m)
        _check_block(k, m, "V_old", V_old.shape[0], V_old.shape[1])
    if (Li is None) != (V_out is None):
        raise ValueError("Li and V_out go together")
    if directions:
        _check_factor(Li.shape[0], Li.shape[1], "Li", m)
        _check_block(k, m, "V_out", V_out.shape[0], V_out.shape[1])
    if not (0.0 < damping <= 1.0):
        raise ValueError(f"damping must be in (0, 1], got {damping}")
    check_codes(rule, on_negative)
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, py_likelihood)
    cdef int kk = <int> k, mm = <int> m
    dtype = np.float32 if real is float else np.float64
    cdef real[:, ::1] B = np.empty((max(k, 1), m), dtype)
    cdef real[:, ::1] A_old = np.empty((max(k, 1), m), dtype) if swap else None
    cdef real[:, ::1] B_old = np.empty((max(k, 1), m), dtype) if swap else None
    cdef real[:, ::1] work = np.empty((max(k, 1), m), dtype)
    cdef float[:, ::1] gram32                              # float rows' m x m products
    cdef float* p32 = NULL
    if real is float:
        gram32 = np.empty((m, m), np.float32)
        p32 = &gram32[0, 0]
    cdef double[:, ::1] rows = np.empty((6, max(k, 1)))   # mean, var, mean', var', ξ; weights
    cdef double value = 0.0, w
    cdef long n_fixed = 0
    cdef int status = 0, failed = 0
    with nogil:
        if k > 0:
            _marginals(&Ri[0, 0], &mu[0], &A[0, 0], &B[0, 0], &rows[0, 0], &rows[1, 0], kk, mm)
        if swap:
            for i in range(k):
                if tau[i] != 0.0 or nu[i] != 0.0:
                    moved = True
                    break
        if moved:
            for i in range(k):
                for j in range(m):
                    A_old[i, j] = V_old[i, j]
            times_lower(&L[0, 0], &A_old[0, 0], kk, mm, True)                 # a' = L^T v
            _marginals(&Ri[0, 0], &mu[0], &A_old[0, 0], &B_old[0, 0], &rows[2, 0], &rows[3, 0],
                       kk, mm)
            for i in range(k):
                rows[4, i] = row_dot(&B[i, 0], &B_old[i, 0], mm)                # a^T Σ a'
        if k > 0:
            status = _refine_loop(&spec, rule, on_negative, damping, k, &y[0], &rows[0, 0],
                                  &rows[1, 0], &s[0], &tau[0], &nu[0], &tau_out[0], &nu_out[0],
                                  &rows[2, 0] if moved else NULL, &rows[3, 0] if moved else NULL,
                                  &rows[4, 0] if moved else NULL, &index, &value, &n_fixed,
                                  &failed)
        if status == 0:
            memset(&dh[0], 0, <size_t> m * sizeof(double))
            for i in range(k):                       # the new sites (or their change) along a
                rows[5, i] = tau_out[i] - tau[i] if change else tau_out[i]
                rows[2, i] = nu_out[i] - nu[i] if change else nu_out[i]
            signed_gram(&dP[0, 0], &A[0, 0] if k > 0 else NULL, &rows[5, 0], &work[0, 0], kk,
                        mm, 1.0, 0.0, True, p32)
            if k > 0:
                gemv_rows(&A[0, 0], &rows[2, 0], &dh[0], kk, mm, True, 1.0)
            if moved:                                # less the old ones along a'
                for i in range(k):
                    rows[5, i] = -tau[i]
                    rows[2, i] = -nu[i]
                signed_gram(&dP[0, 0], &A_old[0, 0], &rows[5, 0], &work[0, 0], kk, mm, 1.0, 1.0,
                            True, p32)
                gemv_rows(&A_old[0, 0], &rows[2, 0], &dh[0], kk, mm, True, 1.0)
            if directions and k > 0:
                memcpy(&V_out[0, 0], &A[0, 0], <size_t> k * m * sizeof(real))
                times_lower(&Li[0, 0], &V_out[0, 0], kk, mm, True)            # v = L^-T a
    return status, index, value, n_fixed, failed


def evidence_block(int kind, double eps, const double[::1] gh_nodes, const double[::1] gh_weights,
                   object py_likelihood, int rule, bint cavity, const double[::1] y,
                   const real[:, ::1] A, const double[::1] s, const real[:, ::1] Ri,
                   const double[::1] mu, const double[::1] tau, const double[::1] nu,
                   double[::1] g_s, real[:, ::1] G=None, double[:, ::1] AtG=None,
                   const real[:, ::1] Li=None, const real[:, ::1] RiLi=None,
                   const real[:, ::1] V=None):
    """One block's Σ log Z̃_i (SEP eq. (3), :func:`evidence_rows`) at q = N(μ, R^-T R^-1), with
    g_s = ∂ log Z_i/∂s_i; returns (total, rows left out).

    With G (k x m) and AtG (m x m) also the rows' gradient parts (:func:`gpc.sparse.ep.block_evidence`),
    in w-space: G := ∂F/∂A, in the form with the sites following their rows (``cavity`` False:
    β μ^T - diag(τ) A Σ_w - 2 diag(g_s) A, :func:`site_rows_gradient`; AtG := A^T G) or with the
    cavities held (:func:`cavity_rows_gradient`; AtG := -Y^T A); with ``Li``, G := G L^-1
    afterwards, the K_bu part ∂F/∂K_bu.

    With the cavities held and ``V``, the rows' directions v_i = L^-T a_i (k x m; ``Li`` and
    ``RiLi`` = R^-1 L^-1 needed), both parts in u-space instead: G := ∂F/∂K_bu = L^-T(d1 μ +
    e Σ_w a_i - 2 g_s a_i) row by row = d1 L^-T μ + e (RiLi)^T (R^-1 a_i) - 2 g_s v_i, and AtG :=
    -Σ (G_i + g_s v_i) v_i^T = L^-T (the w-space AtG) L^-1, the rows' ∂F/∂K_uu before
    symmetrising: one triangular product of the rows fewer than the w-space form with ``Li``.

    A, Ri, G, Li, RiLi and V are all double or all float (the mixed precision: the rows'
    products in single precision, the evidence terms and AtG in double).
    """
    cdef LikelihoodSpec spec
    cdef Py_ssize_t k = y.shape[0], m = A.shape[1], i
    cdef bint gradient = G is not None, to_kernel = Li is not None
    cdef bint u_space = gradient and cavity and V is not None
    _check_factor(Ri.shape[0], Ri.shape[1], "Ri", m)
    _check_block(k, m, "A", A.shape[0], A.shape[1])
    _check_rows(k, (s.shape[0], tau.shape[0], nu.shape[0], g_s.shape[0]))
    _check_rows(m, (mu.shape[0],))
    if (AtG is None) != (G is None):
        raise ValueError("G and AtG go together")
    if gradient:
        _check_block(k, m, "G", G.shape[0], G.shape[1])
        _check_factor(AtG.shape[0], AtG.shape[1], "AtG", m)
    if to_kernel:
        _check_factor(Li.shape[0], Li.shape[1], "Li", m)
    if u_space:
        if Li is None or RiLi is None:
            raise ValueError("the u-space cavity gradient (V given) needs Li and RiLi")
        _check_factor(RiLi.shape[0], RiLi.shape[1], "RiLi", m)
        _check_block(k, m, "V", V.shape[0], V.shape[1])
    check_codes(rule, 0)
    make_spec(&spec, kind, eps, gh_nodes, gh_weights, py_likelihood)
    cdef double total = 0.0
    cdef int bad = 0, kk = <int> k, mm = <int> m
    dtype = np.float32 if real is float else np.float64
    cdef real[:, ::1] B = G if gradient and k > 0 else np.empty((max(k, 1), m), dtype)
    cdef real[:, ::1] Y = np.empty((max(k, 1), m), dtype) if gradient and cavity else None
    cdef double[::1] mu_u = np.empty(m) if u_space else None
    cdef double[:, ::1] rows = np.empty((4, max(k, 1)))    # mean, var, d1, e
    cdef float[:, ::1] cross32                             # float rows' m x m product
    cdef float* c32 = NULL
    if real is float and gradient:
        cross32 = np.empty((m, m), np.float32)
        c32 = &cross32[0, 0]
    with nogil:
        if k > 0:
            _marginals(&Ri[0, 0], &mu[0], &A[0, 0], &B[0, 0], &rows[0, 0], &rows[1, 0], kk, mm)
            bad = _evidence_loop(&spec, rule, k, &y[0], &rows[0, 0], &rows[1, 0], &s[0], &tau[0],
                                 &nu[0], &g_s[0], &rows[2, 0], &rows[3, 0], &total)
        if gradient and k == 0:
            memset(&AtG[0, 0], 0, <size_t> m * m * sizeof(double))
        elif u_space:
            gemv_rows(&Li[0, 0], &mu[0], &mu_u[0], mm, mm, True, 0.0)           # L^-T μ
            times_lower(&RiLi[0, 0], &B[0, 0], kk, mm, True)               # rows L^-T Σ_w a_i
            _cavity_rows_gradient(&G[0, 0], &Y[0, 0], &V[0, 0], &rows[2, 0], &mu_u[0],
                                  &rows[3, 0], &g_s[0], k, m)
            cross_rows(&AtG[0, 0], &V[0, 0], &Y[0, 0], kk, mm, -1.0, c32)     # -Y^T V
        elif gradient:
            times_lower(&Ri[0, 0], &B[0, 0], kk, mm, True)                 # rows Σ_w a_i
            if cavity:
                _cavity_rows_gradient(&G[0, 0], &Y[0, 0], &A[0, 0], &rows[2, 0], &mu[0],
                                      &rows[3, 0], &g_s[0], k, m)
                cross_rows(&AtG[0, 0], &A[0, 0], &Y[0, 0], kk, mm, -1.0, c32)  # -Y^T A
            else:
                for i in range(k):                                           # β = ν - T μ
                    rows[2, i] = nu[i] - tau[i] * rows[0, i]
                _site_rows_gradient(&G[0, 0], &A[0, 0], &rows[2, 0], &mu[0], &tau[0], &g_s[0],
                                    k, m)
                cross_rows(&AtG[0, 0], &G[0, 0], &A[0, 0], kk, mm, 1.0, c32)  # A^T G
            if to_kernel:
                times_lower(&Li[0, 0], &G[0, 0], kk, mm, True)             # G L^-1
    return total, bad


def sum_blocks(const double[:, :, ::1] parts, double[:, ::1] out, Py_ssize_t start,
               Py_ssize_t stop, bint lower=False):
    """Rows start:stop of out (m x m) += Σ_j parts[j] in block order j = 0, 1, ... (with ``lower``
    only their lower triangle, the diagonal included): one stripe of the blocks' m x m sums."""
    check_square(out.shape[0], out.shape[1], "out")
    cdef Py_ssize_t nb = parts.shape[0], m = out.shape[0], i, j, c, width
    if parts.shape[1] != m or parts.shape[2] != m:
        raise ValueError(f"parts are {parts.shape[1]} x {parts.shape[2]}, out is {m} x {m}")
    if not (0 <= start <= stop <= m):
        raise ValueError(f"rows {start}:{stop} are not inside 0:{m}")
    with nogil:
        for i in range(start, stop):
            width = i + 1 if lower else m
            for j in range(nb):
                for c in range(width):
                    out[i, c] += parts[j, i, c]


def scale_rows(const double[:, ::1] A, const double[::1] w, double[:, ::1] S):
    """S (k x m) := diag(w) A."""
    cdef Py_ssize_t k = A.shape[0], m = A.shape[1], i, j
    _check_block(k, m, "S", S.shape[0], S.shape[1])
    _check_rows(k, (w.shape[0],))
    cdef double wi
    with nogil:
        for i in range(k):
            wi = w[i]
            for j in range(m):
                S[i, j] = wi * A[i, j]
