# cython: language_level=3
"""Sparse multi-class EP's per-block passes over the pair factors (docs/derivations-sparse-multiclass.md).

A block of b points has, per class k, the marginals N(μ_ik, σ²_ik) of t_ik = a_ikᵀw_k under q(w_k)
(computed by BLAS from the whitened rows, :mod:`gpc.multiclass.sparse`) and the FITC variances s_ik.
Everything else of an EP step is scalar work per point, done here in typed loops with the GIL
released, over a range of points [start, stop) so that the caller can share a block's points out
among threads (each range writes its own rows only; nothing is summed across points here):

* :func:`refine_block`: the cavities and the damped refinement of every pair site ψ̃ᵢₖ (RMGPC
  eq. (14) with the FITC variances in the step, derivation §3-§4).  The pair loop is the exact
  engine's (``refine_pair_rows`` of gpc._multiclass, cimported); sites that q holds along earlier
  directions (a minibatch's kept sites) first have their cavity moved by Sherman–Morrison.
* :func:`evidence_block`: each point's share ℓᵢ of log Z (derivation §5) and, per (point, class)
  row, the coefficients of the evidence gradient (derivation §6).
* :func:`local_ep_block`: tied sites (stochastic EP, derivation §7): each point's pair sites fitted
  by a local EP against the tied cavity, its local evidence and the derivatives the gradient needs.
* :func:`argmax_quadrature`: the variational baseline's Pᵢ = P(yᵢ is the argmax) under q's
  marginals and its derivatives, by one Gauss–Hermite rule (derivation §11;
  :func:`gpc.multiclass.sparse_vi.argmax_probability`).

Array conventions (the exact engine's ``_Sites``): (n, l) arrays indexed [i, k], the pair (i, k) of
a class k ≠ yᵢ stores its site on t_iyᵢ in tau_t/eta_t[i, k], on t_ik in tau_o/eta_o[i, k], and the
log-odds of its Bernoulli factor in lam[i, k]; others[i, j] is the j-th class k ≠ yᵢ.
"""

from libc.math cimport exp, log, sqrt, INFINITY
from scipy.special.cython_special cimport betaln

from gpc._multiclass cimport PairMoments, argmax_pair_moments_s, pair_cavity, refine_pair_rows
from gpc._special cimport LOG_SQRT_2PI, SQRT2, log_norm_cdf, log_sigmoid, logaddexp


cdef int _check(const Py_ssize_t[::1] y, const Py_ssize_t[:, ::1] others, Py_ssize_t l,
                tuple shapes, tuple lengths, Py_ssize_t start, Py_ssize_t stop) except -1:
    """Entry checks: the (n, l) arrays' ``shapes`` and the (n,) vectors' ``lengths`` match y,
    labels and others are valid on the range start:stop, the range lies inside 0:n."""
    cdef Py_ssize_t n = y.shape[0], i, j
    if l < 2:
        raise ValueError(f"sparse multi-class EP needs at least 2 classes, got {l}")
    for shape in shapes:
        if shape != (n, l):
            raise ValueError(f"the (n, l) arrays must be ({n}, {l}), got {shape}")
    for length in lengths:
        if length != n:
            raise ValueError(f"the per-point vectors must have length {n}, got {length}")
    if others.shape[0] != n or others.shape[1] != l - 1:
        raise ValueError(f"others must be ({n}, {l - 1}), got ({others.shape[0]}, "
                         f"{others.shape[1]})")
    if not 0 <= start <= stop <= n:
        raise ValueError(f"rows {start}:{stop} are not within 0:{n}")
    for i in range(start, stop):
        if not 0 <= y[i] < l:
            raise ValueError(f"label {y[i]} of point {i} is not a class index 0..{l - 1}")
        for j in range(l - 1):
            if not 0 <= others[i, j] < l or others[i, j] == y[i]:
                raise ValueError("others[i] must list the classes other than y[i]")
    return 0


cdef inline tuple _shape(const double[:, ::1] a):
    return (a.shape[0], a.shape[1])


cdef inline double _site_mass(double tau, double eta, double m, double v) noexcept nogil:
    """log ∫ exp(−½ τ t² + η t) N(t | m, v) dt (needs 1 + τ v > 0):
    −½ log(1 + τv) + (m + ηv)²/(2v(1 + τv)) − m²/(2v), its two m²/(2v) terms cancelled,
    = −½ log(1 + τv) + (2mη + η²v − τm²)/(2(1 + τv)), which is finite at v = 0 (the point mass
    at m: the site's value there)."""
    cdef double s = 1.0 + tau * v
    return -0.5 * log(s) + (2.0 * m * eta + eta * eta * v - tau * m * m) / (2.0 * s)


def refine_block(const Py_ssize_t[::1] y, const Py_ssize_t[:, ::1] others,
                 double[:, ::1] tau_t, double[:, ::1] eta_t, double[:, ::1] tau_o,
                 double[:, ::1] eta_o, double[:, ::1] lam, const double[::1] lam_i,
                 double[:, ::1] means, double[:, ::1] varis, const double[:, ::1] s,
                 const double[:, ::1] prior_sd, double damping, bint robust, double log_c,
                 Py_ssize_t start, Py_ssize_t stop, const double[:, ::1] row_tau=None,
                 const double[:, ::1] row_eta=None, const double[:, ::1] mean_old=None,
                 const double[:, ::1] var_old=None, const double[:, ::1] cross=None):
    """One damped refinement of the pair sites of points start:stop, in place; returns the
    largest undamped moment mismatch (in units of ``prior_sd``, its square, and P(zᵢ = 1)).

    ``means``, ``varis`` (n, l): the marginals of t_ik = a_ikᵀw_k under q; ``s`` the FITC variances,
    which widen each pair's argmax step (S² = v_t + v_o + s_iy + s_ik, derivation §4).  The pair
    loop is ``refine_pair_rows`` of gpc._multiclass (the exact engine's).

    With ``row_tau``, ``row_eta`` (the rows' site totals Λ, v: derivation §2), ``mean_old``,
    ``var_old`` and ``cross``, q holds each row's sites along an earlier direction a'_ik (a
    minibatch's kept sites, SEP §2.3): the cavity of the row, q less its sites along a', is seen
    along the current a_ik by Sherman–Morrison (gpc._sparse.refine_rows' formulas with the row's
    total site), v = σ² + Λ ξ²/(1 − Λσ'²), c = μ + ξ (Λμ' − v_r)/(1 − Λσ'²) with (μ', σ'²) the
    marginal of a'ᵀw and ξ = aᵀΣa', and the pair loop starts from the marginal that this cavity and
    the row's sites along a make, N((c + v v_r)/(1 + Λv), v/(1 + Λv)).  ``means`` and ``varis`` are
    overwritten with these marginals on the range.  A row whose q less its sites has no positive
    precision along a' (1 − Λσ'² ≤ 0) keeps the marginal along a'.
    """
    cdef bint moved = row_tau is not None
    shapes = (_shape(tau_t), _shape(eta_t), _shape(tau_o), _shape(eta_o), _shape(lam),
              _shape(means), _shape(varis), _shape(s), _shape(prior_sd))
    if moved:
        if row_eta is None or mean_old is None or var_old is None or cross is None:
            raise ValueError("row_tau, row_eta, mean_old, var_old and cross go together")
        shapes += (_shape(row_tau), _shape(row_eta), _shape(mean_old), _shape(var_old),
                   _shape(cross))
    _check(y, others, tau_t.shape[1], shapes, (lam_i.shape[0],), start, stop)
    if not (0.0 < damping <= 1.0):
        raise ValueError(f"damping must be in (0, 1], got {damping}")
    cdef Py_ssize_t l = tau_t.shape[1], i, k
    cdef double t, v, keep, cvar, cmean, back, mismatch
    with nogil:
        if moved:
            for i in range(start, stop):
                for k in range(l):
                    t = row_tau[i, k]
                    v = row_eta[i, k]
                    keep = 1.0 - t * var_old[i, k]
                    if keep > 0.0:
                        cvar = varis[i, k] + t * cross[i, k] * cross[i, k] / keep
                        cmean = means[i, k] + cross[i, k] * (t * mean_old[i, k] - v) / keep
                        back = 1.0 + t * cvar
                        varis[i, k] = cvar / back
                        means[i, k] = (cmean + cvar * v) / back
                    else:
                        means[i, k] = mean_old[i, k]
                        varis[i, k] = var_old[i, k]
        mismatch = refine_pair_rows(start, stop, y, others, tau_t, eta_t, tau_o, eta_o, lam,
                                    lam_i, means, varis, s, True, prior_sd, damping, robust, log_c,
                                    False)
    return mismatch


cdef int _point_evidence(Py_ssize_t i, const Py_ssize_t[::1] y, const Py_ssize_t[:, ::1] others,
                         const double[:, ::1] tau_t, const double[:, ::1] eta_t,
                         const double[:, ::1] tau_o, const double[:, ::1] eta_o,
                         const double[:, ::1] lam, double lam_i, const double[:, ::1] means,
                         const double[:, ::1] varis, const double[:, ::1] s, bint robust,
                         double log_c, double* log_terms, double[:, ::1] d1, double[:, ::1] e,
                         double[:, ::1] g_s) noexcept nogil:
    """Point i's pair terms of log Z and its rows' gradient coefficients (derivation §5-§6):
    Σ_k log s̃_ik + log Dᵢ into ``log_terms``, and on row (i, k) d1 = Σ_j ∂ log Z_j/∂(row mean),
    e = Σ_j [d_j (τ_j μ − η_j) + 2 g_s,j] v_j/σ², g_s = Σ_j ∂ log Z_j/∂s (added to the arrays,
    which the caller zeroes).  Returns the number of pairs left out (no proper cavity, or no
    finite tilted mass); their terms are 0."""
    cdef Py_ssize_t l = tau_t.shape[1], j, k, t = y[i]
    cdef double m_y = means[i, t], v_y = varis[i, t], lz = lam_i, total = 0.0
    cdef double m_k, v_k, v_t = 0.0, v_o = 0.0, m_t = 0.0, m_o = 0.0, lz_cav, ls, gs, g, lam_k
    cdef double sum1 = 0.0, sum0 = 0.0
    cdef int bad = 0
    cdef PairMoments mom
    for k in range(l):
        lz += lam[i, k]
    for j in range(l - 1):
        k = others[i, j]
        m_k = means[i, k]
        v_k = varis[i, k]
        if not pair_cavity(m_y, v_y, tau_t[i, k], eta_t[i, k], m_k, v_k, tau_o[i, k], eta_o[i, k],
                           &m_t, &v_t, &m_o, &v_o):
            bad += 1
            continue
        lz_cav = lz - lam[i, k] if robust else -INFINITY
        if argmax_pair_moments_s(m_t, v_t, m_o, v_o, s[i, t] + s[i, k], lz_cav, log_c, &mom) != 0:
            bad += 1
            continue
        ls = (mom.log_z - _site_mass(tau_t[i, k], eta_t[i, k], m_t, v_t)
              - _site_mass(tau_o[i, k], eta_o[i, k], m_o, v_o))
        if robust:      # the Bernoulli site against the cavity's P(zᵢ = 1)
            lam_k = lam[i, k]
            ls -= logaddexp(log_sigmoid(lam_k) + log_sigmoid(lz_cav),
                            log_sigmoid(-lam_k) + log_sigmoid(-lz_cav))
        total += ls
        g = mom.g
        gs = 0.5 * (g * g + mom.h)           # ∂ log Z/∂S² = ½ (g² + h)
        d1[i, t] += g
        # v_t/v_y = 1/(1 − τ_t v_y) (pair_cavity), which is 1 at v_y = 0
        e[i, t] += (g * (tau_t[i, k] * m_y - eta_t[i, k]) + 2.0 * gs) / (1.0 - tau_t[i, k] * v_y)
        g_s[i, t] += gs
        d1[i, k] -= g
        e[i, k] += (-g * (tau_o[i, k] * m_k - eta_o[i, k]) + 2.0 * gs) / (1.0 - tau_o[i, k] * v_k)
        g_s[i, k] += gs
    if robust:          # log Dᵢ: the point's Bernoulli factors summed over zᵢ (RMGPC eq. (17))
        for j in range(l - 1):
            k = others[i, j]
            sum1 += log_sigmoid(lam[i, k])
            sum0 += log_sigmoid(-lam[i, k])
        total += logaddexp(log_sigmoid(lam_i) + sum1, log_sigmoid(-lam_i) + sum0)
    log_terms[0] = total
    return bad


def evidence_block(const Py_ssize_t[::1] y, const Py_ssize_t[:, ::1] others,
                   const double[:, ::1] tau_t, const double[:, ::1] eta_t,
                   const double[:, ::1] tau_o, const double[:, ::1] eta_o,
                   const double[:, ::1] lam, const double[::1] lam_i, const double[::1] alpha,
                   const double[::1] beta, const double[:, ::1] means, const double[:, ::1] varis,
                   const double[:, ::1] s, bint robust, bint beta_prior, double a, double b,
                   double log_c, double[::1] log_terms, double[:, ::1] d1, double[:, ::1] e,
                   double[:, ::1] g_s, Py_ssize_t start, Py_ssize_t stop):
    """Each point's share ℓᵢ of log Z (derivation §5) into ``log_terms[i]``, and the gradient
    coefficients (d1, e, g_s) of its rows (derivation §6), for the points start:stop; returns the
    number of pairs left out (their terms and coefficients are 0).

    ℓᵢ = Σ_{k≠yᵢ} log s̃_ik + log Dᵢ (+ log s̃ᵢ with ``beta_prior``), each log s̃ the log tilted mass
    less the log mass of the site times its cavity; the cavities come from q's marginals ``means``,
    ``varis`` (sites along the current rows).  log s̃ᵢ (RMGPC's ψ̃ᵢ, Q's Beta(a, b)) is
    log[ρ̄_c p + (1 − ρ̄_c)(1 − p)] − log B(a, b) + log B(a_c, b_c) − log[σ(λᵢ)p + σ(−λᵢ)(1 − p)]
    with the cavity Beta(a_c, b_c) = Beta(a − αᵢ, b − βᵢ) and p = σ(Σ_k λ_ik).  Without ``robust``
    (no outliers) there are no Bernoulli factors.  d1, e, g_s are overwritten on the range.
    """
    _check(y, others, tau_t.shape[1],
           (_shape(tau_t), _shape(eta_t), _shape(tau_o), _shape(eta_o), _shape(lam),
            _shape(means), _shape(varis), _shape(s), _shape(d1), _shape(e), _shape(g_s)),
           (lam_i.shape[0], alpha.shape[0], beta.shape[0], log_terms.shape[0]), start, stop)
    if beta_prior and not (robust and a > 0 and b > 0):
        raise ValueError(f"the outlier rate's Beta({a}, {b}) must be proper (and robust=True)")
    cdef Py_ssize_t l = tau_t.shape[1], i, k
    cdef double total, lz, lp1, lp0, a_c, b_c, log_zi, log_site_i, bab = 0.0
    cdef int bad = 0
    if beta_prior:
        bab = betaln(a, b)
    with nogil:
        for i in range(start, stop):
            for k in range(l):
                d1[i, k] = 0.0
                e[i, k] = 0.0
                g_s[i, k] = 0.0
            bad += _point_evidence(i, y, others, tau_t, eta_t, tau_o, eta_o, lam, lam_i[i], means,
                                   varis, s, robust, log_c, &total, d1, e, g_s)
            if beta_prior:
                lz = 0.0
                for k in range(l):
                    lz += lam[i, k]
                lp1 = log_sigmoid(lz)
                lp0 = log_sigmoid(-lz)
                a_c = a - alpha[i]
                b_c = b - beta[i]
                if a_c > 0 and b_c > 0:
                    log_zi = logaddexp(lp1 + log(a_c), lp0 + log(b_c)) - log(a_c + b_c)
                    log_site_i = (bab - betaln(a_c, b_c)
                                  + logaddexp(log_sigmoid(lam_i[i]) + lp1,
                                              log_sigmoid(-lam_i[i]) + lp0))
                    total += log_zi - log_site_i
                else:
                    bad += 1
            log_terms[i] = total
    return bad


def local_ep_block(const Py_ssize_t[::1] y, const Py_ssize_t[:, ::1] others,
                   const double[:, ::1] m_c, const double[:, ::1] v_c, const double[:, ::1] s,
                   const double[:, ::1] prior_sd, const double[::1] lam_i, bint robust,
                   double log_c, double tol, int max_sweeps, double[:, ::1] tau_t,
                   double[:, ::1] eta_t, double[:, ::1] tau_o, double[:, ::1] eta_o,
                   double[:, ::1] lam, double[:, ::1] means, double[:, ::1] varis,
                   double[:, ::1] site_tau, double[:, ::1] site_eta, double[::1] log_z,
                   double[:, ::1] d_m, double[:, ::1] d_v, double[:, ::1] d_s,
                   Py_ssize_t start, Py_ssize_t stop):
    """Tied sites (derivation §7): each point's C − 1 pair sites fitted by EP against its cavity
    N(m_c, v_c) on each of its rows, held; for the points start:stop.  Returns (pairs left out of
    the evidence, points whose local EP did not reach ``tol`` in ``max_sweeps`` sweeps).

    The local EP starts from zero sites (tau_t … lam are overwritten on the range) and repeats the
    undamped pair loop (``refine_pair_rows``, the exact engine's, with the FITC variances ``s``)
    on the marginals cavity × sites, refreshed after every sweep, until its moment mismatch (in
    units of ``prior_sd``) is below ``tol``.  ``lam_i``: the log-odds of zᵢ's exact factor
    (logit ρ of a fixed outlier rate; unused without ``robust``).  Outputs per row: the point's
    total site (``site_tau``, ``site_eta``: Σ_j τᵗ_j on yᵢ's row, τᵒ_k on row k), the local
    posterior's marginals (``means``, ``varis``), and the derivatives of the local evidence in the
    row's cavity mean and variance and in its FITC variance,

        d_m = (μ − m_c)/v_c,   d_v = ½ (d_m² + (σ² − v_c)/v_c²),   d_s = Σ_j g_s,j

    (the local EP is stationary in its sites, so these are those of a Gaussian prior under EP);
    per point ``log_z``, the local evidence Σ_rows log ∫ site_row N(t | m_c, v_c) dt + Σ_j log s̃_j
    + log Dᵢ.
    """
    _check(y, others, tau_t.shape[1],
           (_shape(m_c), _shape(v_c), _shape(s), _shape(prior_sd), _shape(tau_t), _shape(eta_t),
            _shape(tau_o), _shape(eta_o), _shape(lam), _shape(means), _shape(varis),
            _shape(site_tau), _shape(site_eta), _shape(d_m), _shape(d_v), _shape(d_s)),
           (lam_i.shape[0], log_z.shape[0]), start, stop)
    if not (tol > 0 and max_sweeps >= 1):
        raise ValueError("local EP needs tol > 0 and max_sweeps >= 1")
    cdef Py_ssize_t l = tau_t.shape[1], i, j, k, t
    cdef double prec, loc, total, change, dm
    cdef int sweep, bad = 0, unconverged = 0
    with nogil:
        for i in range(start, stop):
            t = y[i]
            for k in range(l):
                tau_t[i, k] = eta_t[i, k] = tau_o[i, k] = eta_o[i, k] = lam[i, k] = 0.0
                means[i, k] = m_c[i, k]
                varis[i, k] = v_c[i, k]
            change = INFINITY
            for sweep in range(max_sweeps):
                change = refine_pair_rows(i, i + 1, y, others, tau_t, eta_t, tau_o, eta_o, lam,
                                          lam_i, means, varis, s, True, prior_sd, 1.0, robust,
                                          log_c, False)
                # the marginals of the point's rows: cavity times its sites
                for k in range(l):
                    if k == t:
                        prec = 0.0
                        loc = 0.0
                        for j in range(l - 1):
                            prec += tau_t[i, others[i, j]]
                            loc += eta_t[i, others[i, j]]
                    else:
                        prec = tau_o[i, k]
                        loc = eta_o[i, k]
                    site_tau[i, k] = prec
                    site_eta[i, k] = loc
                    # cavity × site in variance form (the point mass m_c stays at v_c = 0)
                    prec = 1.0 + prec * v_c[i, k]
                    varis[i, k] = v_c[i, k] / prec
                    means[i, k] = (m_c[i, k] + loc * v_c[i, k]) / prec
                if change < tol:
                    break
            if not change < tol:
                unconverged += 1
            for k in range(l):
                d_m[i, k] = 0.0
                d_v[i, k] = 0.0
                d_s[i, k] = 0.0
            bad += _point_evidence(i, y, others, tau_t, eta_t, tau_o, eta_o, lam, lam_i[i], means,
                                   varis, s, robust, log_c, &total, d_m, d_v, d_s)
            for k in range(l):
                total += _site_mass(site_tau[i, k], site_eta[i, k], m_c[i, k], v_c[i, k])
                # (μ − m_c)/v_c = (η − τ m_c)/(1 + τ v_c) and (σ² − v_c)/v_c² = −τ/(1 + τ v_c)
                # for μ, σ² above: finite at v_c = 0 and where v_c² underflows
                prec = 1.0 + site_tau[i, k] * v_c[i, k]
                dm = (site_eta[i, k] - site_tau[i, k] * m_c[i, k]) / prec
                d_m[i, k] = dm
                d_v[i, k] = 0.5 * (dm * dm - site_tau[i, k] / prec)
            log_z[i] = total
    return bad, unconverged


def argmax_quadrature(const double[:, ::1] means, const double[:, ::1] varis,
                      const Py_ssize_t[::1] y, const double[::1] x, const double[::1] w,
                      double min_variance, double[::1] P, double[:, ::1] d_mean,
                      double[:, ::1] d_var, double[:, ::1] log_cdf):
    """Pᵢ = P(yᵢ is the argmax) under independent N(μ_ik, σ²_ik) and its derivatives in every μ_ik
    and σ²_ik, by the rule of nodes ``x`` and weights ``w`` (Gauss–Hermite's, the weights divided
    by √π), for every row of ``means`` and ``varis`` (b, C) into P (b,), d_mean and d_var (b, C).

    With σ_ik = √max(σ²_ik, ``min_variance``), the nodes f_j = μ_iy + √2 σ_iy x_j,
    z_jk = (f_j − μ_ik)/σ_ik and R_jk = φ(z_jk) Π_{l≠y,k} Φ(z_jl) (derivation §11):

        Pᵢ = Σ_j w_j Π_{k≠y} Φ(z_jk),
        ∂Pᵢ/∂μ_ik  = −Σ_j w_j R_jk / σ_ik,                  k ≠ y,
        ∂Pᵢ/∂σ²_ik = −Σ_j w_j R_jk z_jk / (2 σ²_ik),        k ≠ y,
        ∂Pᵢ/∂μ_iy  = −Σ_{k≠y} ∂Pᵢ/∂μ_ik,
        ∂Pᵢ/∂σ²_iy = Σ_j w_j (x_j / (√2 σ_iy)) Σ_{k≠y} R_jk / σ_ik,

    the derivatives of the rule's value (its nodes move with μ_iy and σ_iy); ∂Pᵢ/∂σ²_ik is 0 where
    σ²_ik < ``min_variance`` (the floor holds the value there).  R_jk is formed as
    exp(Σ_{l≠y} log Φ(z_jl) − log Φ(z_jk) + log φ(z_jk)), finite where Φ(z_jk) underflows.
    ``log_cdf`` is scratch of at least C entries per node row, (J, C).
    """
    cdef Py_ssize_t b = means.shape[0], C = means.shape[1], J = x.shape[0], i, j, k, yi
    if (varis.shape[0] != b or varis.shape[1] != C or y.shape[0] != b or P.shape[0] != b
            or d_mean.shape[0] != b or d_mean.shape[1] != C or d_var.shape[0] != b
            or d_var.shape[1] != C):
        raise ValueError(f"means, varis, d_mean and d_var must be ({b}, {C}), y and P ({b},)")
    if w.shape[0] != J or log_cdf.shape[0] < J or log_cdf.shape[1] < C:
        raise ValueError(f"the rule has {J} nodes but {w.shape[0]} weights, or log_cdf is smaller "
                         f"than ({J}, {C})")
    for i in range(b):
        if not 0 <= y[i] < C:
            raise ValueError(f"label {y[i]} of row {i} is not a class index 0..{C - 1}")
    cdef double sd_y, mu_y, f, z, log_prod, r, r_sum, p, gm, gv, gy, sd_k
    with nogil:
        for i in range(b):
            yi = y[i]
            mu_y = means[i, yi]
            sd_y = sqrt(max(varis[i, yi], min_variance))
            for j in range(J):
                f = mu_y + SQRT2 * sd_y * x[j]
                log_prod = 0.0
                for k in range(C):
                    if k != yi:
                        z = (f - means[i, k]) / sqrt(max(varis[i, k], min_variance))
                        log_cdf[j, k] = log_norm_cdf(z)
                        log_prod += log_cdf[j, k]
                log_cdf[j, yi] = log_prod
            p = 0.0
            for j in range(J):
                p += w[j] * exp(log_cdf[j, yi])
            P[i] = p
            gy = 0.0
            for k in range(C):
                if k == yi:
                    continue
                sd_k = sqrt(max(varis[i, k], min_variance))
                gm = 0.0
                gv = 0.0
                for j in range(J):
                    z = (mu_y + SQRT2 * sd_y * x[j] - means[i, k]) / sd_k
                    r = exp(log_cdf[j, yi] - log_cdf[j, k] - 0.5 * z * z - LOG_SQRT_2PI) / sd_k
                    gm += w[j] * r
                    gv += w[j] * r * z
                    gy += w[j] * x[j] * r
                d_mean[i, k] = -gm
                d_var[i, k] = 0.0 if varis[i, k] < min_variance else -gv / (2.0 * sd_k)
            r_sum = 0.0
            for k in range(C):
                if k != yi:
                    r_sum += d_mean[i, k]
            d_mean[i, yi] = -r_sum
            d_var[i, yi] = 0.0 if varis[i, yi] < min_variance else gy / (SQRT2 * sd_y)
    return 0
