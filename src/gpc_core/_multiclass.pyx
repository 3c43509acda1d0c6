# cython: language_level=3
"""RMGPC's EP site refinements (RMGPC §3.2, eqs. (14)-(15)) as typed loops, and a class block's mean.

The ψ̃ᵢ factors of the outlier prior must be refined one after another (each changes the Beta
posterior the next cavity is taken from), so that loop cannot be vectorised: here it is one typed
loop, where each step in Python would be a dozen scalar scipy calls.  The maths is the one in
``gpc.multiclass.ep._refine_outlier_prior`` (docs/derivations-rmgpc.md, "ψ̃ᵢ").  The ψ̃ᵢₖ
refinement (:func:`refine_pairs`) runs once per location sweep, one pass over the points per class
pair (in NumPy, some twenty array passes).

Both refinements rest on the argmax likelihood's pair factor (``argmax_pair_moments`` and
``argmax_pair_site``, declared with their formulas in gpc/_multiclass.pxd for any engine to cimport;
:func:`pair_moments` and :func:`pair_sites` are their vectorised Python entry points).
"""

from libc.math cimport exp, log, fabs, sqrt, isfinite, isnan, INFINITY, NAN
from scipy.special.cython_special cimport psi

import numpy as np

from gpc._blas cimport dsymv, dtrsv, strsv
from gpc._special cimport (inv_mills, z_plus_inv_mills, log_norm_cdf, log1pexp, logaddexp,
                          sigmoid)

ctypedef fused real:
    float
    double


cdef double trigamma(double x) noexcept nogil:
    """ψ′(x) for x > 0: the recurrence ψ′(x) = ψ′(x + 1) + 1/x² up to x ≥ 10, then the asymptotic
    series 1/x + 1/(2x²) + 1/(6x³) − 1/(30x⁵) + 1/(42x⁷) − 1/(30x⁹) + 5/(66x¹¹) (the first omitted
    term, 691/(2730x¹³), is below 3e-14 at x ≥ 10)."""
    cdef double acc = 0.0, x2, ix
    while x < 10.0:
        acc += 1.0 / (x * x)
        x += 1.0
    ix = 1.0 / x
    x2 = ix * ix
    return acc + ix + 0.5 * x2 + ix * x2 * (1.0 / 6.0 - x2 * (1.0 / 30.0 - x2 * (1.0 / 42.0 - x2 * (1.0 / 30.0 - x2 * 5.0 / 66.0))))


def trigamma_py(double x):
    """ψ′(x), for the tests (compared with scipy's ζ(2, x))."""
    if not x > 0:
        raise ValueError("trigamma needs x > 0")
    return trigamma(x)


cdef void beta_projection(double a_c, double b_c, double w1, double* a_out, double* b_out) noexcept nogil:
    """KL projection of w₁ Beta(a_c + 1, b_c) + (1 − w₁) Beta(a_c, b_c + 1) onto a Beta: match
    E log ρ and E log(1 − ρ) by Newton's method from the E ρ, E ρ² match."""
    cdef double s = a_c + b_c
    cdef double t1 = psi(a_c) + w1 / a_c - psi(s + 1.0)
    cdef double t2 = psi(b_c) + (1.0 - w1) / b_c - psi(s + 1.0)
    cdef double m1 = (a_c + w1) / (s + 1.0)
    cdef double m2 = (a_c + 1.0) * (a_c + 2.0 * w1) / ((s + 1.0) * (s + 2.0))
    cdef double s_new = (m1 - m2) / (m2 - m1 * m1)
    cdef double a = m1 * s_new, b = (1.0 - m1) * s_new
    cdef double dab, r1, r2, ta, tb, tab, det, da, db, step
    cdef int it
    for it in range(8):
        dab = psi(a + b)
        r1 = psi(a) - dab - t1
        r2 = psi(b) - dab - t2
        ta = trigamma(a)
        tb = trigamma(b)
        tab = trigamma(a + b)
        det = (ta - tab) * (tb - tab) - tab * tab
        da = ((tb - tab) * r1 + tab * r2) / det
        db = (tab * r1 + (ta - tab) * r2) / det
        step = 1.0
        while a - step * da <= 0 or b - step * db <= 0:
            step *= 0.5
        a -= step * da
        b -= step * db
        if fabs(da) < 1e-12 * a and fabs(db) < 1e-12 * b:
            break
    a_out[0] = a
    b_out[0] = b


def refine_outlier_prior(const double[::1] lam_rest, double[::1] alpha, double[::1] beta,
                         double[::1] lam_i, double a, double b, double damping):
    """One sequential pass over the ψ̃ᵢ; updates alpha, beta, lam_i in place, returns the new (a, b).

    Cavity Beta(a − αᵢ, b − βᵢ) and Bernoulli of log-odds ``lam_rest[i]`` (Σ_k λᵢₖ); the refined
    Bernoulli factor is logit(ρ̄_c) exactly, the Beta part is :c:func:`beta_projection`'s; every new
    site is damped, ε · refined + (1 − ε) · old.
    """
    cdef Py_ssize_t i, n = lam_rest.shape[0]
    cdef double a_c, b_c, rbar, p_c, w1, a_new = 0.0, b_new = 0.0, e = damping
    if alpha.shape[0] != n or beta.shape[0] != n or lam_i.shape[0] != n:
        raise ValueError("lam_rest, alpha, beta and lam_i must have the same length")
    with nogil:
        for i in range(n):
            a_c = a - alpha[i]
            b_c = b - beta[i]
            if a_c <= 0 or b_c <= 0:
                continue
            rbar = a_c / (a_c + b_c)
            p_c = sigmoid(lam_rest[i])
            w1 = p_c * rbar / (p_c * rbar + (1.0 - p_c) * (1.0 - rbar))
            beta_projection(a_c, b_c, w1, &a_new, &b_new)
            alpha[i] = e * (a_new - a_c) + (1.0 - e) * alpha[i]
            beta[i] = e * (b_new - b_c) + (1.0 - e) * beta[i]
            lam_i[i] = e * (log(rbar) - log(1.0 - rbar)) + (1.0 - e) * lam_i[i]
            a = a_c + alpha[i]
            b = b_c + beta[i]
    return a, b


def beta_projection_py(double a_c, double b_c, double w1):
    """(a, b) of :c:func:`beta_projection`, for the tests."""
    cdef double a = 0.0, b = 0.0
    if not (a_c > 0 and b_c > 0 and 0.0 <= w1 <= 1.0):
        raise ValueError("beta_projection needs a_c > 0, b_c > 0 and 0 <= w1 <= 1")
    beta_projection(a_c, b_c, w1, &a, &b)
    return a, b


def prime_mean(const double[:, ::1] K, const real[:, ::1] L, const double[::1] s,
               const double[::1] eta, double[::1] work, real[::1] x, double[::1] out):
    """out := K (v − S B⁻¹ S K v), v = ``eta``, B = I + S K S = L Lᵀ (R&W eq. (3.67) with m₀ = 0):
    the mean Σ' v of one RMGPC class block (gpc.multiclass._block), in one call with the GIL
    released (two dsymv and two triangular solves, ``L`` in single or double precision).
    ``work`` (double) and ``x`` (L's precision) are scratch vectors of length n."""
    cdef int n = <int> K.shape[0], one = 1
    cdef Py_ssize_t i
    cdef double d_one = 1.0, d_zero = 0.0
    cdef char uplo = b'U', no = b'N', tr = b'T', nonunit = b'N'
    if (K.shape[1] != n or L.shape[0] != n or L.shape[1] != n or s.shape[0] != n
            or eta.shape[0] != n or work.shape[0] != n or x.shape[0] != n or out.shape[0] != n):
        raise ValueError("prime_mean: K and L must be n x n and the vectors of length n")
    if n == 0:
        return
    with nogil:
        # K is symmetric and C-ordered: Fortran's 'U' triangle is our lower one
        dsymv(&uplo, &n, &d_one, <double*> &K[0, 0], &n, <double*> &eta[0], &one, &d_zero,
              &work[0], &one)
        for i in range(n):
            x[i] = <real> (s[i] * work[i])
        # Fortran sees U = Lᵀ: L z = b is Uᵀ z = b ('T'), Lᵀ z = b is U z = b ('N')
        if real is double:
            dtrsv(&uplo, &tr, &nonunit, &n, <double*> &L[0, 0], &n, &x[0], &one)
            dtrsv(&uplo, &no, &nonunit, &n, <double*> &L[0, 0], &n, &x[0], &one)
        else:
            strsv(&uplo, &tr, &nonunit, &n, <float*> &L[0, 0], &n, &x[0], &one)
            strsv(&uplo, &no, &nonunit, &n, <float*> &L[0, 0], &n, &x[0], &one)
        for i in range(n):
            work[i] = eta[i] - s[i] * x[i]
        dsymv(&uplo, &n, &d_one, <double*> &K[0, 0], &n, &work[0], &one, &d_zero, &out[0], &one)


# ----------------------------------------------------------------------------- the pair factor

cdef int argmax_pair_moments(double m_t, double v_t, double m_o, double v_o, double lz_cav,
                             double log_c, PairMoments* out) noexcept nogil:
    """Tilted moments of the pair factor (formulas in gpc/_multiclass.pxd; RMGPC eq. (10), (14))."""
    return argmax_pair_moments_s(m_t, v_t, m_o, v_o, 0.0, lz_cav, log_c, out)


cdef int argmax_pair_moments_s(double m_t, double v_t, double m_o, double v_o, double s_extra,
                               double lz_cav, double log_c, PairMoments* out) noexcept nogil:
    """Tilted moments of the pair factor whose step is widened by the extra variance ``s_extra``
    (the FITC variances s_y + s_k of a sparse model; formulas in gpc/_multiclass.pxd).  With
    s_extra = 0 this is argmax_pair_moments, bit for bit."""
    cdef double s, alpha, log_cdf, log_p, log_1mp, w, r
    # a cavity of variance 0 (a sparse row far from every inducing point) is a point mass: its
    # moments stay put, and the step needs only v_t + v_o + s_extra > 0
    if not (v_t >= 0 and v_o >= 0 and s_extra >= 0 and v_t + v_o + s_extra > 0
            and isfinite(v_t) and isfinite(v_o) and isfinite(s_extra) and isfinite(m_t)
            and isfinite(m_o)) or isnan(lz_cav):
        return 1
    s = sqrt(v_t + v_o + s_extra)
    alpha = (m_t - m_o) / s
    log_cdf = log_norm_cdf(alpha)
    log_p = -log1pexp(-lz_cav)            # log P(z = 1) of the cavity: -inf without outliers
    log_1mp = -log1pexp(lz_cav)
    out.log_z = logaddexp(log_p + log_c, log_1mp + log_cdf)
    if not isfinite(out.log_z):
        return 2
    w = exp(log_1mp + log_cdf - out.log_z)
    r = inv_mills(alpha)
    out.g = w * r / s
    # alpha + w r = (alpha + r) - (1 - w) r: alpha + r by the continued fraction where it cancels
    out.h = -out.g * (z_plus_inv_mills(alpha) - (1.0 - w) * r) / s
    out.mean_t = m_t + v_t * out.g
    out.var_t = v_t + v_t * v_t * out.h
    out.mean_o = m_o - v_o * out.g
    out.var_o = v_o + v_o * v_o * out.h
    out.p_outlier = exp(log_p + log_c - out.log_z)
    out.site_log_odds = log_c - log_cdf
    if not (isfinite(out.g) and isfinite(out.h) and isfinite(out.site_log_odds)):
        return 2
    return 0


cdef int argmax_pair_site(double m_t, double v_t, double m_o, double v_o, double lz_cav,
                          double log_c, PairMoments* mom, double* tau_t, double* eta_t,
                          double* tau_o, double* eta_o) noexcept nogil:
    """The undamped site tilted / cavity of the pair factor, in natural parameters."""
    return argmax_pair_site_s(m_t, v_t, m_o, v_o, 0.0, lz_cav, log_c, mom, tau_t, eta_t, tau_o,
                              eta_o)


cdef int argmax_pair_site_s(double m_t, double v_t, double m_o, double v_o, double s_extra,
                            double lz_cav, double log_c, PairMoments* mom, double* tau_t,
                            double* eta_t, double* tau_o, double* eta_o) noexcept nogil:
    """argmax_pair_site with the step widened by ``s_extra`` (argmax_pair_moments_s)."""
    cdef int status = argmax_pair_moments_s(m_t, v_t, m_o, v_o, s_extra, lz_cav, log_c, mom)
    if status != 0:
        return status
    # tilted / cavity with mean_t = m_t + v_t g, var_t = v_t (1 + v_t h) (and the competitor's
    # with -g): tau_t = 1/var_t - 1/v_t = -h/(1 + v_t h), eta_t = (g - m_t h)/(1 + v_t h), finite
    # at v_t = 0 (its limit there); var_t > 0 iff 1 + v_t h > 0
    cdef double d_t = 1.0 + v_t * mom.h, d_o = 1.0 + v_o * mom.h
    if not (d_t > 0 and d_o > 0):
        return 2
    tau_t[0] = -mom.h / d_t
    eta_t[0] = (mom.g - m_t * mom.h) / d_t
    tau_o[0] = -mom.h / d_o
    eta_o[0] = (-mom.g - m_o * mom.h) / d_o
    return 0


cdef tuple _same_length(tuple arrays):
    flat = [np.ascontiguousarray(a, dtype=np.float64).reshape(-1) for a in arrays]
    shape = np.shape(arrays[0])
    for a, f in zip(arrays, flat):
        if np.shape(a) != shape:
            raise ValueError(f"the arrays must have one shape, got {np.shape(a)} and {shape}")
    return shape, flat


PAIR_FIELDS = ("log_z", "g", "h", "mean_t", "var_t", "mean_o", "var_o", "p_outlier",
               "site_log_odds")


def pair_moments(m_t, v_t, m_o, v_o, lz_cav, double log_c):
    """Tilted moments of the argmax pair factor elementwise (gpc/_multiclass.pxd,
    ``argmax_pair_moments``).

    Parameters
    ----------
    m_t, v_t, m_o, v_o : array_like, one shape
        Cavity means and variances of the label's latent f_y(xᵢ) and of a competing f_k(xᵢ).
    lz_cav : array_like, that shape
        Cavity log-odds of the outlier indicator zᵢ; −inf for no outliers.
    log_c : float
        log c = −log(C)/(C − 1) for C classes (RMGPC eq. (10)).

    Returns
    -------
    moments : dict of ndarray
        The fields of ``PairMoments``: log_z, g (∂ log Z/∂m_t), h (∂² log Z/∂m_t²), mean_t, var_t,
        mean_o, var_o, p_outlier (tilted P(zᵢ = 1)), site_log_odds.  NaN where the status is not 0.
    bad : int
        The first (flat) index whose moments could not be formed, or −1.
    """
    shape, (a, b, c, d, e) = _same_length((m_t, v_t, m_o, v_o, lz_cav))
    cdef const double[::1] mt = a, vt = b, mo = c, vo = d, lz = e
    cdef Py_ssize_t n = mt.shape[0], i, bad = -1
    out = np.full((len(PAIR_FIELDS), n), np.nan)
    cdef double[:, ::1] o = out
    cdef PairMoments mom
    with nogil:
        for i in range(n):
            if argmax_pair_moments(mt[i], vt[i], mo[i], vo[i], lz[i], log_c, &mom) != 0:
                if bad < 0:
                    bad = i
                continue
            o[0, i], o[1, i], o[2, i] = mom.log_z, mom.g, mom.h
            o[3, i], o[4, i], o[5, i], o[6, i] = mom.mean_t, mom.var_t, mom.mean_o, mom.var_o
            o[7, i], o[8, i] = mom.p_outlier, mom.site_log_odds
    return {name: out[j].reshape(shape) for j, name in enumerate(PAIR_FIELDS)}, bad


def pair_sites(m_t, v_t, m_o, v_o, lz_cav, double log_c):
    """The undamped EP sites of the argmax pair factor elementwise (gpc/_multiclass.pxd,
    ``argmax_pair_site``): site = tilted / cavity on each latent.

    Parameters
    ----------
    m_t, v_t, m_o, v_o, lz_cav, log_c
        As for :func:`pair_moments`.

    Returns
    -------
    tau_t, eta_t, tau_o, eta_o : ndarray
        Natural parameters (precision, precision × mean) of the Gaussian sites on f_y(xᵢ) and
        f_k(xᵢ); NaN where the status is not 0.
    site_log_odds, log_z : ndarray
        The site's Bernoulli log-odds in zᵢ and log Z of the tilted distribution.
    bad : int
        The first (flat) index without a site (no moments, or a tilted variance ≤ 0), or −1.
    """
    shape, (a, b, c, d, e) = _same_length((m_t, v_t, m_o, v_o, lz_cav))
    cdef const double[::1] mt = a, vt = b, mo = c, vo = d, lz = e
    cdef Py_ssize_t n = mt.shape[0], i, bad = -1
    out = np.full((6, n), np.nan)
    cdef double[:, ::1] o = out
    cdef PairMoments mom
    with nogil:
        for i in range(n):
            if argmax_pair_site(mt[i], vt[i], mo[i], vo[i], lz[i], log_c, &mom, &o[0, i], &o[1, i],
                                &o[2, i], &o[3, i]) != 0:
                o[0, i] = o[1, i] = o[2, i] = o[3, i] = NAN
                if bad < 0:
                    bad = i
                continue
            o[4, i], o[5, i] = mom.site_log_odds, mom.log_z
    res = [out[j].reshape(shape) for j in range(6)]
    return res[0], res[1], res[2], res[3], res[4], res[5], bad


def refine_pairs(const Py_ssize_t[::1] y, const Py_ssize_t[:, ::1] others,
                 double[:, ::1] tau_t, double[:, ::1] eta_t, double[:, ::1] tau_o,
                 double[:, ::1] eta_o, double[:, ::1] lam, const double[::1] lam_i,
                 const double[:, ::1] means, const double[:, ::1] varis,
                 const double[:, ::1] prior_sd, double damping, bint robust, double log_c,
                 bint fixed_precisions, const double[:, ::1] s=None, Py_ssize_t start=0,
                 stop=None):
    """One refinement of every ψ̃ᵢₖ (RMGPC eq. (14)) in place; returns the largest moment mismatch.

    The loop of ``gpc.multiclass.ep._refine`` (whose docstring gives the rule), point by point: the
    l − 1 pairs of point i one after another, each moving the target marginal f_yᵢ(xᵢ) and the z
    log-odds by its own change.  Arrays (n, l) are indexed [i, k]; ``others[i, j]`` is the j-th
    class k ≠ yᵢ.  With ``fixed_precisions`` only the locations move (and the variances' mismatch is
    left out).  A pair whose cavity or tilted variance would not be positive keeps its site.

    ``s`` (n, l), optional: an extra variance of each latent value that widens the argmax step
    (the FITC variances of a sparse model, docs/derivations-sparse-multiclass.md §4: S² = v_t + v_o
    + s_iy + s_ik); None is zeros, the exact model.  ``start``, ``stop``: refine the points
    start:stop only (the rows of a thread's range; the others are not read or written).
    """
    cdef Py_ssize_t n = y.shape[0], l = tau_t.shape[1], i, j, last
    rows = (tau_t.shape[0], eta_t.shape[0], tau_o.shape[0], eta_o.shape[0], lam.shape[0],
            means.shape[0], varis.shape[0], prior_sd.shape[0])
    cols = (tau_t.shape[1], eta_t.shape[1], tau_o.shape[1], eta_o.shape[1], lam.shape[1],
            means.shape[1], varis.shape[1], prior_sd.shape[1])
    if s is not None:
        rows += (s.shape[0],)
        cols += (s.shape[1],)
    for shape in zip(rows, cols):
        if shape != (n, l):
            raise ValueError("refine_pairs: the (n, l) arrays must match y and each other")
    if lam_i.shape[0] != n or others.shape[0] != n or others.shape[1] != l - 1 or l < 2:
        raise ValueError("refine_pairs: lam_i must have length n and others shape (n, l - 1)")
    last = n if stop is None else <Py_ssize_t> stop
    if not 0 <= start <= last <= n:
        raise ValueError(f"refine_pairs: rows {start}:{last} are not within 0:{n}")
    for i in range(start, last):
        if not 0 <= y[i] < l:
            raise ValueError("refine_pairs: a label is not a class index")
        for j in range(l - 1):
            if not 0 <= others[i, j] < l or others[i, j] == y[i]:
                raise ValueError("refine_pairs: others[i] must list the classes other than y[i]")
    cdef double mismatch
    with nogil:
        mismatch = refine_pair_rows(start, last, y, others, tau_t, eta_t, tau_o, eta_o, lam, lam_i,
                                    means, varis, means if s is None else s, s is not None,
                                    prior_sd, damping, robust, log_c, fixed_precisions)
    return mismatch


cdef double refine_pair_rows(Py_ssize_t start, Py_ssize_t stop, const Py_ssize_t[::1] y,
                             const Py_ssize_t[:, ::1] others, double[:, ::1] tau_t,
                             double[:, ::1] eta_t, double[:, ::1] tau_o, double[:, ::1] eta_o,
                             double[:, ::1] lam, const double[::1] lam_i,
                             const double[:, ::1] means, const double[:, ::1] varis,
                             const double[:, ::1] fitc, bint has_fitc,
                             const double[:, ::1] prior_sd, double damping, bint robust,
                             double log_c, bint fixed_precisions) noexcept nogil:
    """The loop of :func:`refine_pairs` over the points start:stop, unchecked (declared in
    gpc/_multiclass.pxd for the sparse engine, which checks its own entry points)."""
    cdef Py_ssize_t l = tau_t.shape[1], i, j, k
    cdef double e = damping, m_y, v_y, sd_y, lz, mismatch = 0.0, s_pair = 0.0
    cdef double tt0, et0, to0, eo0, lam0, m_k, v_k, sd_k, v_t = 0.0, v_o = 0.0, m_t = 0.0, m_o = 0.0
    cdef double lz_cav, gap, tt, et, to, eo, lam_k, prec
    cdef PairMoments mom
    for i in range(start, stop):
        m_y = means[i, y[i]]
        v_y = varis[i, y[i]]
        sd_y = prior_sd[i, y[i]]
        lz = lam_i[i]
        for k in range(l):
            lz += lam[i, k]
        for j in range(l - 1):
            k = others[i, j]
            tt0 = tau_t[i, k]
            et0 = eta_t[i, k]
            to0 = tau_o[i, k]
            eo0 = eta_o[i, k]
            lam0 = lam[i, k]
            m_k = means[i, k]
            v_k = varis[i, k]
            sd_k = prior_sd[i, k]
            if not pair_cavity(m_y, v_y, tt0, et0, m_k, v_k, to0, eo0, &m_t, &v_t, &m_o, &v_o):
                continue
            lz_cav = lz - lam0 if robust else -INFINITY
            if has_fitc:
                s_pair = fitc[i, y[i]] + fitc[i, k]
            # the undamped site; none when the tilted variance is not positive
            if argmax_pair_site_s(m_t, v_t, m_o, v_o, s_pair, lz_cav, log_c, &mom, &tt, &et, &to,
                                  &eo) != 0:
                continue
            gap = max(fabs(mom.mean_t - m_y) / sd_y, fabs(mom.mean_o - m_k) / sd_k)
            if not fixed_precisions:
                gap = max(gap, max(fabs(mom.var_t - v_y) / (sd_y * sd_y),
                                   fabs(mom.var_o - v_k) / (sd_k * sd_k)))
            if robust:
                gap = max(gap, fabs(sigmoid(lz_cav + mom.site_log_odds) - sigmoid(lz)))
            if gap > mismatch:
                mismatch = gap
            if fixed_precisions:    # Δη = Δm / v moves the marginal mean to the tilted mean
                # (mean_t - m_y)/v_y = (tt0 m_y - et0 + g)/(1 - tt0 v_y) by pair_cavity's v_t, m_t
                tt = tt0
                to = to0
                et = et0 + e * (tt0 * m_y - et0 + mom.g) / (1.0 - tt0 * v_y)
                eo = eo0 + e * (to0 * m_k - eo0 - mom.g) / (1.0 - to0 * v_k)
            else:                   # site = tilted / cavity, damped
                tt = e * tt + (1 - e) * tt0
                et = e * et + (1 - e) * et0
                to = e * to + (1 - e) * to0
                eo = e * eo + (1 - e) * eo0
            # the target marginal moves with its site: precision 1/v_y + tt - tt0, in variance
            # form (finite at v_y = 0, where it stays the point mass)
            prec = 1.0 + (tt - tt0) * v_y
            m_y = (m_y + (et - et0) * v_y) / prec
            v_y = v_y / prec
            tau_t[i, k] = tt
            eta_t[i, k] = et
            tau_o[i, k] = to
            eta_o[i, k] = eo
            if robust:
                lam_k = e * mom.site_log_odds + (1 - e) * lam0
                lz += lam_k - lam0
                lam[i, k] = lam_k
    return mismatch
