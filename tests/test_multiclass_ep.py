"""RMGPC's EP (gpc.multiclass.ep): fixed-point conditions checked by independent quadrature, and the
evidence gradient (RMGPC eq. (18)) against central differences of the evidence (16)."""

import sys

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import digamma, expit

from gpc.kernels import RBF
from gpc.multiclass.ep import rmgpc_ep

# Gauss–Legendre on [0, d_max] for the half-line part of the tilted distribution: its integrand is a
# smooth Gaussian there, so 200 nodes are exact to rounding.
GL_X, GL_W = np.polynomial.legendre.leggauss(200)


def _problem(n=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.arange(n) % 3
    y[0] = 1                  # a point inside class 0's cluster labelled 1: a likely outlier
    return X, y


def _tilted_pair(m_t, v_t, m_o, v_o, p, l, with_mass=False):
    """Moments of [p c + (1 − p) Θ(f_t − f_o)] N(f_t|m_t,v_t) N(f_o|m_o,v_o), c = l^(−1/(l−1))
    (and, ``with_mass``, its mass Z last).

    d = f_t − f_o and u = v_o f_t + v_t f_o are independent Gaussians; Θ acts on d only, so the
    moments come from 1-D Gauss–Legendre quadrature over d ≥ 0 (no closed form used).
    """
    c = l ** (-1.0 / (l - 1))
    md, vd = m_t - m_o, v_t + v_o
    mu, vu = v_o * m_t + v_t * m_o, v_o ** 2 * v_t + v_t ** 2 * v_o
    hi = max(md, 0.0) + 12 * np.sqrt(vd)
    d = 0.5 * hi * (GL_X + 1)
    w = 0.5 * hi * GL_W * np.exp(-0.5 * (d - md) ** 2 / vd) / np.sqrt(2 * np.pi * vd)
    half = [np.sum(w), np.sum(w * d), np.sum(w * d * d)]             # ∫_{d≥0} dᵏ N(d)
    full = [1.0, md, vd + md * md]
    mom = [p * c * f + (1 - p) * h for f, h in zip(full, half)]
    z = mom[0]
    ed, ed2 = mom[1] / z, mom[2] / z
    vard = ed2 - ed * ed
    s = vd   # f_t = (u + v_t d)/s, f_o = (u − v_o d)/s
    mean_t, mean_o = (mu + v_t * ed) / s, (mu - v_o * ed) / s
    var_t, var_o = (vu + v_t ** 2 * vard) / s ** 2, (vu + v_o ** 2 * vard) / s ** 2
    return (mean_t, var_t, mean_o, var_o, p * c / z) + ((z,) if with_mass else ())


# (m_t, v_t, m_o, v_o): the label's latent well ahead, behind, far behind (α ≈ −9.5 and −30, where
# α + r(α) cancels), a narrow cavity against a wide one
PAIRS = [(0.3, 1.2, -0.4, 0.7), (-2.0, 0.5, 1.5, 0.9), (4.0, 2.0, -1.0, 0.1), (-0.1, 1e-3, 0.2, 2.0),
         (-6.0, 0.3, 3.0, 0.6), (-18.0, 0.2, 12.0, 0.8)]


@pytest.mark.parametrize("p", [0.0, 0.05, 0.6])
def test_pair_moments_match_quadrature(p):
    """gpc._multiclass.pair_moments (the one implementation of the pair factor, RMGPC eq. (10))
    against Gauss–Legendre quadrature of the tilted distribution; p = 0 is the factor without
    outliers (lz_cav = −inf).  The sites of pair_sites times the cavity give back the moments."""
    from gpc._multiclass import pair_moments, pair_sites

    l = 4
    log_c = -np.log(l) / (l - 1)
    m_t, v_t, m_o, v_o = (np.array(c) for c in zip(*PAIRS))
    lz = np.full(len(PAIRS), np.log(p) - np.log1p(-p) if p > 0 else -np.inf)
    mom, bad = pair_moments(m_t, v_t, m_o, v_o, lz, log_c)
    assert bad == -1
    for j, pair in enumerate(PAIRS):
        want = _tilted_pair(*pair, p, l, with_mass=True)
        got = [mom[name][j] for name in ("mean_t", "var_t", "mean_o", "var_o", "p_outlier")]
        # the quadrature is exact to rounding; the moments' own rounding is ~1e-15 relative
        np.testing.assert_allclose(got, want[:5], rtol=1e-10, atol=1e-14)
        assert mom["log_z"][j] == pytest.approx(np.log(want[5]), rel=1e-10)
    if p > 0:       # the site's Bernoulli log-odds: tilted log-odds of z minus the cavity's
        post = mom["p_outlier"]
        some = post < 0.99          # (where the outlier explains the label, 1 − post rounds away)
        assert np.sum(some) >= 3
        post, cav = post[some], lz[some]
        np.testing.assert_allclose(mom["site_log_odds"][some],
                                   np.log(post) - np.log1p(-post) - cav, rtol=1e-9)
    tau_t, eta_t, tau_o, eta_o, odds, log_z, bad = pair_sites(m_t, v_t, m_o, v_o, lz, log_c)
    assert bad == -1
    for tau, eta, m, v, name in ((tau_t, eta_t, m_t, v_t, "_t"), (tau_o, eta_o, m_o, v_o, "_o")):
        prec = 1.0 / v + tau                    # cavity × site in natural parameters
        np.testing.assert_allclose(1.0 / prec, mom["var" + name], rtol=1e-12)
        np.testing.assert_allclose((m / v + eta) / prec, mom["mean" + name], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(log_z, mom["log_z"])
    # invalid cavities are reported, not returned as numbers
    mom, bad = pair_moments(np.zeros(3), np.array([1.0, -1.0, 1.0]), np.zeros(3), np.ones(3),
                            np.zeros(3), log_c)
    assert bad == 1 and np.isnan(mom["g"][1]) and np.isfinite(mom["g"][0])


def test_pair_sites_at_a_cavity_of_variance_zero_are_the_limit():
    """A cavity N(m, 0) (a sparse row far from every inducing point, a = 0) is a point mass: its
    moments stay put and its site is the limit v → 0 of tilted / cavity, -h and g - m h; the
    variance form gives it where 1/var_t - 1/v_t was 0/0."""
    from gpc._multiclass import pair_moments, pair_sites

    log_c = -np.log(3) / 2
    m_t, m_o, v_o, lz = np.array([0.3]), np.array([-0.2]), np.array([0.7]), np.array([-2.0])
    at_zero = pair_sites(m_t, np.zeros(1), m_o, v_o, lz, log_c)
    near = pair_sites(m_t, np.full(1, 1e-9), m_o, v_o, lz, log_c)
    assert at_zero[-1] == -1
    # the sites are smooth in v_t with O(1) slopes: 1e-9 away they differ by ~1e-9 (tolerance
    # 1e-7 relative / 1e-8 absolute: a hundredfold margin)
    np.testing.assert_allclose(np.concatenate(at_zero[:-1]), np.concatenate(near[:-1]),
                               rtol=1e-7, atol=1e-8)
    mom, bad = pair_moments(m_t, np.zeros(1), m_o, v_o, lz, log_c)
    assert bad == -1 and mom["mean_t"][0] == m_t[0] and mom["var_t"][0] == 0.0
    np.testing.assert_allclose(at_zero[0], -mom["h"], rtol=1e-15)
    np.testing.assert_allclose(at_zero[1], mom["g"] - m_t * mom["h"], rtol=1e-14)
    # both cavities point masses and no FITC variance: the step has no width, no moments
    assert pair_moments(m_t, np.zeros(1), m_o, np.zeros(1), lz, log_c)[1] == 0


@pytest.mark.parametrize("robust", [True, False])
def test_fixed_point_matches_tilted_moments(robust):
    X, y = _problem()
    l, n = 3, len(y)
    res = rmgpc_ep([RBF(1.0)(X)] * l, y, l, robust=robust, tol=1e-11, max_iter=5000)
    assert res.converged
    s = res.sites
    means = np.column_stack([c.mean for c in res.classes])
    varis = np.column_stack([c.diag_cov() for c in res.classes])
    lz = s.lam_i + s.lam.sum(axis=1)
    for i in range(n):
        t = y[i]
        for k in range(l):
            if k == t:
                continue
            v_t = 1 / (1 / varis[i, t] - s.tau_t[i, k])
            m_t = v_t * (means[i, t] / varis[i, t] - s.eta_t[i, k])
            v_o = 1 / (1 / varis[i, k] - s.tau_o[i, k])
            m_o = v_o * (means[i, k] / varis[i, k] - s.eta_o[i, k])
            p_cav = expit(lz[i] - s.lam[i, k]) if robust else 0.0
            got = _tilted_pair(m_t, v_t, m_o, v_o, p_cav, l)
            want = (means[i, t], varis[i, t], means[i, k], varis[i, k],
                    res.outlier_probability[i])
            # EP stopped at a step below 1e-11; quadrature is exact to rounding: 1e-7 leaves room
            # for the conditioning of the cavity division
            np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-8)
    if robust:
        # ψ̃ᵢ: the tilted E[log ρ], E[log(1−ρ)] and P(zᵢ = 1) equal Q's (adaptive quadrature in ρ;
        # the log singularities at 0 and 1 are integrable and quad handles them to ~1e-10)
        for i in range(n):
            a_c, b_c = res.a - s.alpha[i], res.b - s.beta[i]
            p_c = expit(s.lam.sum(axis=1)[i])

            def mix(r, g):
                return g(r) * (p_c * r + (1 - p_c) * (1 - r)) * r ** (a_c - 1) * (1 - r) ** (b_c - 1)

            z = quad(mix, 0, 1, args=(lambda r: 1.0,), epsabs=1e-13)[0]
            e_log = quad(mix, 0, 1, args=(np.log,), epsabs=1e-13)[0] / z
            e_log1m = quad(mix, 0, 1, args=(lambda r: np.log1p(-r),),
                           epsabs=1e-13)[0] / z
            pz = quad(lambda r: p_c * r ** a_c * (1 - r) ** (b_c - 1), 0, 1, epsabs=1e-13)[0] / z
            np.testing.assert_allclose(
                [e_log, e_log1m, pz],
                [digamma(res.a) - digamma(res.a + res.b), digamma(res.b) - digamma(res.a + res.b),
                 res.outlier_probability[i]], rtol=1e-7)


@pytest.mark.parametrize("robust", [True, False])
def test_gradient_matches_finite_differences_per_class_kernels(robust):
    X, y = _problem(seed=1)
    l = 3
    ells = np.array([0.7, 1.0, 1.6])

    # SMGPC carries latent noise on K's diagonal (RMGPC §4); 0.1 here
    noise = 0.0 if robust else 0.1

    def evidence(log_ells):
        Ks = [RBF(np.exp(t))(X) + noise * np.eye(len(y)) for t in log_ells]
        res = rmgpc_ep(Ks, y, l, robust=robust, tol=1e-12, max_iter=5000)
        assert res.converged
        return res

    res = evidence(np.log(ells))
    grad = [RBF(e).gradient_contract(X, M) [0] for e, M in zip(ells, res.gradient_matrices())]
    h = 1e-4
    fd = []
    for k in range(l):
        e = np.zeros(l)
        e[k] = h
        fd.append((evidence(np.log(ells) + e).log_evidence
                   - evidence(np.log(ells) - e).log_evidence) / (2 * h))
    # central differences: O(h²) ≈ 1e-8 truncation, plus EP's 1e-12 stop amplified by 1/h: 1e-8
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-5)


def test_outlier_probability_flags_the_mislabelled_point():
    # two tight clusters far apart; one point of cluster 0 labelled as class 1
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(-3, 0.3, size=(10, 1)), rng.normal(3, 0.3, size=(10, 1)),
                   rng.normal(0, 0.3, size=(10, 1)) + 9])
    y = np.repeat([0, 1, 2], 10)
    y[2] = 1
    res = rmgpc_ep([RBF(1.0)(X)] * 3, y, 3)
    assert np.argmax(res.outlier_probability) == 2
    assert res.outlier_probability[2] > 0.5 > np.max(np.delete(res.outlier_probability, 2))


def test_typed_beta_projection_matches_the_log_moments():
    """gpc._multiclass's ψ̃ᵢ projection: ψ(a) − ψ(a + b) and ψ(b) − ψ(a + b) of the result equal
    E log ρ and E log(1 − ρ) of the mixture w₁ Beta(a_c + 1, b_c) + (1 − w₁) Beta(a_c, b_c + 1),
    computed here by scipy's digamma; Newton stops at a 1e-12 relative step, so 1e-9 is loose."""
    from scipy.special import zeta
    from gpc._multiclass import beta_projection_py, trigamma_py
    for a_c, b_c, w1 in [(1.0, 9.0, 0.05), (2.5, 40.0, 0.9), (0.3, 0.7, 0.5), (30.0, 200.0, 0.0)]:
        a, b = beta_projection_py(a_c, b_c, w1)
        s = a_c + b_c
        e_log_rho = digamma(a_c) + w1 / a_c - digamma(s + 1)
        e_log_1m = digamma(b_c) + (1 - w1) / b_c - digamma(s + 1)
        assert digamma(a) - digamma(a + b) == pytest.approx(e_log_rho, abs=1e-9)
        assert digamma(b) - digamma(a + b) == pytest.approx(e_log_1m, abs=1e-9)
    # its trigamma against scipy's ζ(2, x): the asymptotic series' truncation is below 3e-14
    xs = np.geomspace(1e-4, 1e7, 200)
    np.testing.assert_allclose([trigamma_py(x) for x in xs], zeta(2.0, xs), rtol=1e-12)
    with pytest.raises(ValueError, match="a_c > 0"):
        beta_projection_py(-1.0, 1.0, 0.5)


def test_threaded_class_blocks_give_the_same_fixed_point():
    """The l class blocks are independent given the sites, so running them in threads changes only
    the order in which they finish: the same iterates bit for bit (BLAS pinned to one thread)."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(30, 2))
    y = np.arange(30) % 4
    K = RBF(1.0)(X)
    one = rmgpc_ep([K] * 4, y, 4, max_iter=40, tol=1e-8)
    two = rmgpc_ep([K] * 4, y, 4, max_iter=40, tol=1e-8, n_threads=2)
    assert one.n_iter == two.n_iter
    assert one.log_evidence == two.log_evidence
    np.testing.assert_array_equal(one.outlier_probability, two.outlier_probability)
    for c1, c2 in zip(one.classes, two.classes):
        np.testing.assert_array_equal(c1.mean, c2.mean)


def _four_classes(robust, n=80, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.argmax(X @ rng.normal(size=(2, 4)) + 0.5 * rng.normal(size=(n, 4)), axis=1)
    K = RBF(1.5)(X) + (0.0 if robust else 0.1 * np.eye(n))   # SMGPC with latent noise ϑ² = 0.1
    return K, y


@pytest.mark.parametrize("robust", [True, False])
def test_accelerated_ep_stops_at_the_damped_iterations_fixed_point(robust):
    """Anderson acceleration of the outer loop changes EP's path, not its fixed point."""
    K, y = _four_classes(robust)
    fast, plain = (rmgpc_ep([K] * 4, y, 4, robust=robust, tol=1e-8, max_iter=500, accelerate=a)
                   for a in (True, False))
    assert fast.converged and plain.converged
    # Run to a mismatch below 1e-8 the two agree to rounding in the evidence (which is stationary
    # in the sites: measured 7e-13 and 2e-12) and to ~1e-6 in the means (measured 2e-7, 8e-7).
    assert fast.log_evidence == pytest.approx(plain.log_evidence, abs=1e-8)
    np.testing.assert_allclose(fast.outlier_probability, plain.outlier_probability, atol=1e-6)
    for c, d in zip(fast.classes, plain.classes):
        np.testing.assert_allclose(c.mean, d.mean, atol=1e-5)
        np.testing.assert_allclose(c.diag_cov(), d.diag_cov(), atol=1e-5)
    # At MultiClassGPC's tolerance (1e-4 on the local mismatch) the accelerated EP refactors the
    # blocks less often (12 against 17 robust, 8 against 13 standard) and agrees with the plain one
    # as two runs at that tolerance can: measured 2e-7 / 3e-5 in log Z and 2e-4 in P(z = 1); the
    # bounds allow the ×10 that separates a local mismatch from the global error on the n = 1000
    # benchmark problem (bench/RESULTS.md, issue 15).
    fast, plain = (rmgpc_ep([K] * 4, y, 4, robust=robust, tol=1e-4, accelerate=a)
                   for a in (True, False))
    assert fast.n_refactorisations < plain.n_refactorisations
    assert fast.log_evidence == pytest.approx(plain.log_evidence, abs=1e-3)
    np.testing.assert_allclose(fast.outlier_probability, plain.outlier_probability, atol=1e-3)


# (accelerate, which refactorisation fails, damping_history, rejected_steps): the first
# refactorisation is always the plain damped step of iteration 1; with acceleration the second is
# iteration 2's extrapolated trial (Anderson extrapolates from two damped steps on)
@pytest.mark.parametrize("accelerate, fail, halvings, rejected", [
    (False, 1, [(1, 0.25)], []), (False, 2, [(2, 0.25)], []),
    (True, 1, [(1, 0.25)], []), (True, 2, [], [2])])
def test_damping_halves_when_a_class_covariance_is_not_positive(monkeypatch, accelerate, fail,
                                                                 halvings, rejected):
    """RMGPC §3's rule: a damped step whose Σ_k is not positive definite is retried with half the
    damping, and the halving is recorded.  An accelerated trial that does not factor is dropped
    (recorded in ``rejected_steps``) without touching the damping."""
    from gpc.exceptions import NotPositiveDefiniteError
    from gpc.multiclass import ep

    K, y = _four_classes(True)
    calls, refactor = [], ep._refactor

    def failing_once(blocks, sites, single, pool):
        calls.append(sites)
        if len(calls) == fail:
            raise NotPositiveDefiniteError("injected")
        return refactor(blocks, sites, single, pool)

    monkeypatch.setattr(ep, "_refactor", failing_once)
    res = rmgpc_ep([K] * 4, y, 4, tol=1e-4, accelerate=accelerate)
    assert res.converged
    assert res.damping_history == halvings
    assert res.damping == (0.25 if halvings else 0.5)
    assert res.rejected_steps[:len(rejected)] == rejected     # (later trials may be dropped too)
    assert res.n_refactorisations == len(calls)


def _refine_pairs_vectorised(sites, means, varis, prior_sd, e, robust, log_c, fixed_precisions):
    """The ψ̃ᵢₖ refinement written over all points at once in NumPy, from the vectorised pair
    moments (gpc._multiclass.pair_moments, checked against quadrature in
    test_pair_moments_match_quadrature): the reference for refine_pairs's loop."""
    from gpc._multiclass import pair_moments

    new = sites.copy()
    rows, y = np.arange(sites.n), sites.y
    m_y, v_y = means[rows, y].copy(), varis[rows, y].copy()
    sd_y = prior_sd[rows, y]
    lz = new.z_log_odds()
    mismatch = 0.0
    for j in range(sites.l - 1):
        k = sites.others[:, j]
        tt0, et0 = new.tau_t[rows, k], new.eta_t[rows, k]
        to0, eo0 = new.tau_o[rows, k], new.eta_o[rows, k]
        lam0 = new.lam[rows, k]
        m_k, v_k, sd_k = means[rows, k], varis[rows, k], prior_sd[rows, k]
        prec_t, prec_o = 1.0 / v_y - tt0, 1.0 / v_k - to0
        ok = (prec_t > 0) & (prec_o > 0)
        v_t, v_o = 1.0 / np.where(ok, prec_t, 1.0), 1.0 / np.where(ok, prec_o, 1.0)
        m_t, m_o = v_t * (m_y / v_y - et0), v_o * (m_k / v_k - eo0)
        lz_cav = lz - lam0
        mom, _ = pair_moments(m_t, v_t, m_o, v_o, lz_cav if robust else np.full(len(k), -np.inf),
                              log_c)
        g, d2, lam_new = mom["g"], mom["h"], mom["site_log_odds"]
        var_t, var_o = v_t + v_t * v_t * d2, v_o + v_o * v_o * d2
        ok &= (var_t > 0) & (var_o > 0)
        var_t, var_o = np.where(ok, var_t, 1.0), np.where(ok, var_o, 1.0)
        mean_t, mean_o = m_t + v_t * g, m_o - v_o * g
        gap = np.maximum(np.abs(mean_t - m_y) / sd_y, np.abs(mean_o - m_k) / sd_k)
        if not fixed_precisions:
            gap = np.maximum.reduce([gap, np.abs(var_t - v_y) / sd_y ** 2,
                                     np.abs(var_o - v_k) / sd_k ** 2])
        if robust:
            gap = np.maximum(gap, np.abs(expit(lz_cav + lam_new) - expit(lz)))
        mismatch = max(mismatch, float(np.max(gap, where=ok, initial=0.0)))
        if fixed_precisions:
            tt, to = tt0, to0
            et, eo = et0 + e * (mean_t - m_y) / v_y, eo0 + e * (mean_o - m_k) / v_k
        else:
            tt = e * (1.0 / var_t - 1.0 / v_t) + (1 - e) * tt0
            et = e * (mean_t / var_t - m_t / v_t) + (1 - e) * et0
            to = e * (1.0 / var_o - 1.0 / v_o) + (1 - e) * to0
            eo = e * (mean_o / var_o - m_o / v_o) + (1 - e) * eo0
        tt, et = np.where(ok, tt, tt0), np.where(ok, et, et0)
        to, eo = np.where(ok, to, to0), np.where(ok, eo, eo0)
        prec = 1.0 / v_y + tt - tt0
        m_y, v_y = (m_y / v_y + et - et0) / prec, 1.0 / prec
        new.tau_t[rows, k], new.eta_t[rows, k], new.tau_o[rows, k], new.eta_o[rows, k] = tt, et, to, eo
        if robust:
            lam = np.where(ok, e * lam_new + (1 - e) * lam0, lam0)
            lz = lz + lam - lam0
            new.lam[rows, k] = lam
    return new, mismatch


@pytest.mark.parametrize("robust", [True, False])
@pytest.mark.parametrize("fixed_precisions", [True, False])
def test_typed_pair_refinement_matches_the_vectorised_rule(robust, fixed_precisions):
    """gpc._multiclass.refine_pairs against the same rule written over all points in NumPy, from a
    state three iterations into EP (sites of both signs, outlier log-odds away from 0).  The two
    differ only in the order of a few floating-point sums (the z log-odds), so to ~1e-12."""
    import warnings

    from gpc._multiclass import refine_pairs
    from gpc.exceptions import ConvergenceWarning

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 2))
    y = np.argmax(X @ rng.normal(size=(2, 4)) + rng.normal(size=(40, 4)), axis=1)
    K = RBF(1.0)(X) + 1e-8 * np.eye(40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        res = rmgpc_ep([K] * 4, y, 4, robust=robust, max_iter=3)
    sites = res.sites
    means = np.column_stack([c.mean for c in res.classes])
    varis = np.column_stack([c.diag_cov() for c in res.classes])
    prior_sd = np.sqrt(np.column_stack([np.diag(K)] * 4))
    log_c = -np.log(4) / 3
    ref, ref_mismatch = _refine_pairs_vectorised(sites, means, varis, prior_sd, 0.5, robust, log_c,
                                                 fixed_precisions)
    new = sites.copy()
    mismatch = refine_pairs(sites.y, sites.others, new.tau_t, new.eta_t, new.tau_o, new.eta_o,
                            new.lam, new.lam_i, means, varis, prior_sd, 0.5, robust, log_c,
                            fixed_precisions)
    assert ref_mismatch > 1e-4          # a state that still moves
    assert mismatch == pytest.approx(ref_mismatch, rel=1e-10)
    for name in ("tau_t", "eta_t", "tau_o", "eta_o", "lam"):
        np.testing.assert_allclose(getattr(new, name), getattr(ref, name), rtol=1e-10, atol=1e-12)
    assert np.array_equal(new.tau_t, sites.tau_t) == fixed_precisions
    with pytest.raises(ValueError, match="others"):
        bad = sites.others.copy()
        bad[0, 0] = sites.y[0]
        refine_pairs(sites.y, bad, new.tau_t, new.eta_t, new.tau_o, new.eta_o, new.lam,
                     new.lam_i, means, varis, prior_sd, 0.5, robust, log_c, fixed_precisions)
    with pytest.raises(ValueError, match="match"):
        refine_pairs(sites.y, sites.others, new.tau_t[:-1], new.eta_t, new.tau_o, new.eta_o,
                     new.lam, new.lam_i, means, varis, prior_sd, 0.5, robust, log_c,
                     fixed_precisions)


# Fifteen points, six classes (issue 32's reproducer): warm starts from long length scales jumped
# to short ones used to end outside EP's domain (ρ̄ > 1, NaN evidence) on 4 of 120 grid points
X15 = np.array([[0, 3], [2, 2], [1, -1], [-1, 2], [0, 3], [-1, 0], [0, -1], [-2, -3], [2, 2], [1, -3],
                [3, 2], [-3, 0], [1, -2], [-3, -3], [3, 0]], float)
Y15 = np.array([0, 1, 1, 0, 2, 3, 5, 3, 0, 0, 4, 2, 3, 4, 2])


def test_warm_start_across_a_length_scale_jump_stays_in_the_domain():
    """A warm start from the state at a long length scale, at a much shorter one, ends at the cold
    start's fixed point, inside the domain, with no floating-point warning (the grid holds the
    jumps 27.8 → 0.274 and 50, 150 → 0.274, 0.364 that ended at ρ̄ = 1.2-1.9 and a NaN evidence)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for big in (27.8, 50.0, 150.0):
            start = rmgpc_ep([RBF(big)(X15)] * 6, Y15, 6, tol=1e-4)
            for ell in (0.1769, 0.2228, 0.2744, 0.3644):
                Ks = [RBF(ell)(X15)] * 6
                warm = rmgpc_ep(Ks, Y15, 6, tol=1e-4, init=start)
                cold = rmgpc_ep(Ks, Y15, 6, tol=1e-4)
                assert 0.0 < warm.rho_mean < 1.0 and np.isfinite(warm.log_evidence)
                # both stop at a mismatch below 1e-4 and the evidence is stationary in the sites:
                # measured 1.2e-7 apart; another fixed point would be far more
                assert warm.log_evidence == pytest.approx(cold.log_evidence, abs=1e-4)


def test_domain_errors_are_detected():
    """The checks of EP's state: Q's Beta and every ψ̃ᵢ's cavity Beta proper, every site finite;
    and of a result: finite evidence, ρ̄ in (0, 1)."""
    from gpc.multiclass import ep

    res = rmgpc_ep([RBF(1.0)(X15)] * 6, Y15, 6, tol=1e-4)
    model = ep._Model(6, 1.0, 9.0, True, None)
    assert model.domain_error(res.sites) is None
    a, b = model.beta_posterior(res.sites)
    bad = res.sites.copy()
    bad.beta[3] -= b + 1.0                   # Q's b < 0: ρ̄ > 1
    assert "improper" in model.domain_error(bad) and "Beta(a, b)" in model.domain_error(bad)
    bad = res.sites.copy()
    bad.alpha[2] = a + 0.5                   # a proper Q, but point 2's cavity Beta has a_c < 0
    bad.alpha[5] -= a + 0.5 - res.sites.alpha[2] - 0.1 * a
    assert "point 2" in model.domain_error(bad)
    bad_cavity = bad
    # the inner loop's working states: an improper cavity is allowed, Q's Beta and finiteness not
    n = res.sites.n
    assert model.locations_error(bad_cavity.locations(), n) is None
    x = bad_cavity.locations()
    ep._Sites.split_beta(x, n)[1][3] -= b + 1.0
    assert "Beta(a, b)" in model.locations_error(x, n)
    x[0] = np.inf
    assert "not finite" in model.locations_error(x, n)
    bad = res.sites.copy()
    bad.eta_t[0, 1] = np.nan
    assert "eta_t" in model.domain_error(bad)
    # SMGPC and a fixed rate have no Beta to check
    assert ep._Model(6, 1.0, 9.0, False, None).domain_error(bad) is not None
    assert ep._Model(6, 1.0, 9.0, True, 0.1).domain_error(res.sites.copy()) is None
    import dataclasses
    with pytest.raises(ep._OutsideDomain, match="outlier rate"):
        ep._checked(dataclasses.replace(res, b=-3.0))
    with pytest.raises(ep._OutsideDomain, match="evidence"):
        ep._checked(dataclasses.replace(res, log_evidence=np.nan))
    # a result whose sites leave a cavity Beta improper is refused, with the point named
    with pytest.raises(ep._OutsideDomain, match="point 2"):
        ep._checked(dataclasses.replace(res, sites=bad_cavity), model)
    assert ep._checked(res, model) is res


def test_a_damped_step_outside_the_domain_halves_the_damping(monkeypatch):
    """A damped step that would make Q's Beta improper is retried with half the damping, like one
    whose class covariance is not positive definite (RMGPC §3's rule, extended to the Beta)."""
    from gpc.multiclass import ep

    calls, refine = [], ep._refine

    def corrupt_second_damped_step(sites, means, varis, prior_sd, damping, model, fixed):
        new, mismatch = refine(sites, means, varis, prior_sd, damping, model, fixed)
        if not fixed:
            calls.append(damping)
            if len(calls) == 2:
                new.beta[0] -= model.beta_posterior(new)[1] + 1.0
        return new, mismatch

    monkeypatch.setattr(ep, "_refine", corrupt_second_damped_step)
    res = rmgpc_ep([RBF(1.0)(X15)] * 6, Y15, 6, tol=1e-4, accelerate=False)
    assert res.converged and 0 < res.rho_mean < 1
    assert res.damping_history == [(2, 0.25)]
    assert calls[:3] == [0.5, 0.5, 0.25]


def test_inner_sweeps_pass_improper_cavities_and_hand_on_a_state_in_the_domain(monkeypatch):
    """The inner loop may sweep through states whose ψ̃ᵢ cavity Beta is improper (on glass at ℓ = 1
    the first full-step ψ̃ᵢ sweep of a cold start leaves one), but every state it hands on, and so
    every outer iterate, lies in EP's domain; no damped step is halved for it, and the run stops at
    the fixed point of the plain damped iteration."""
    from gpc.datasets import load_glass
    from gpc.multiclass import ep

    d = load_glass(binary=False)
    X = (d.X - d.X.mean(axis=0)) / d.X.std(axis=0)
    Ks = [RBF(1.0)(X)] * 6
    passed, handed, refine, sweeps = [], [], ep._refine, ep._location_sweeps

    def record_refine(sites, means, varis, prior_sd, damping, model, fixed):
        if fixed:
            passed.append(model.domain_error(sites) is not None)
        return refine(sites, means, varis, prior_sd, damping, model, fixed)

    def record_sweeps(blocks, sites, means, varis, prior_sd, model, *args):
        out = sweeps(blocks, sites, means, varis, prior_sd, model, *args)
        handed.append(model.domain_error(out[0]))
        return out

    monkeypatch.setattr(ep, "_refine", record_refine)
    monkeypatch.setattr(ep, "_location_sweeps", record_sweeps)
    y = np.unique(d.y, return_inverse=True)[1]
    res = rmgpc_ep(Ks, y, 6, tol=1e-6)
    assert any(passed)                          # the loop did pass an improper cavity
    assert handed and all(why is None for why in handed)
    assert res.converged and res.damping_history == []
    monkeypatch.undo()
    plain = rmgpc_ep(Ks, y, 6, tol=1e-6, accelerate=False)
    # both stop at an undamped mismatch below 1e-6, where the evidence is stationary in the sites
    assert res.log_evidence == pytest.approx(plain.log_evidence, abs=1e-6)


def test_failed_warm_start_falls_back_to_a_cold_start(monkeypatch):
    """rmgpc_ep runs cold when the warm run fails, and raises the policy's DivergenceError (a
    NumericalError) only when the cold run fails too."""
    from gpc.exceptions import DivergenceError, NumericalError
    from gpc.multiclass import ep

    Ks = [RBF(0.3)(X15)] * 6
    start = rmgpc_ep([RBF(30.0)(X15)] * 6, Y15, 6, tol=1e-4)
    cold = rmgpc_ep(Ks, Y15, 6, tol=1e-4)
    runs, real = [], ep._run

    def warm_fails(blocks, y, model, max_iter, tol, damping, min_damping, init_sites, *rest):
        runs.append(init_sites is not None)
        if init_sites is not None:
            raise ep._OutsideDomain("injected")
        return real(blocks, y, model, max_iter, tol, damping, min_damping, init_sites, *rest)

    monkeypatch.setattr(ep, "_run", warm_fails)
    res = rmgpc_ep(Ks, Y15, 6, tol=1e-4, init=start)
    assert runs == [True, False]
    assert res.log_evidence == cold.log_evidence

    def always_fails(*args):
        raise NotPositiveDefiniteError("injected")

    from gpc.exceptions import NotPositiveDefiniteError
    monkeypatch.setattr(ep, "_run", always_fails)
    with pytest.raises(DivergenceError, match="no valid state") as err:
        rmgpc_ep(Ks, Y15, 6, tol=1e-4, init=start)
    assert isinstance(err.value, NumericalError)


# ---------------------------------------------------------------------------- fixed label noise

@pytest.mark.parametrize("rate", [0.05, 0.4])
def test_fixed_rate_fixed_point_matches_tilted_moments(rate):
    """With a fixed outlier rate ρ the prior Bern(zᵢ | ρ) is kept exactly (λᵢ = logit ρ, no ψ̃ᵢ, no
    Beta) and every pair's tilted moments still equal Q's marginals (quadrature, as above)."""
    X, y = _problem()
    l, n = 3, len(y)
    res = rmgpc_ep([RBF(1.0)(X)] * l, y, l, rate=rate, tol=1e-11, max_iter=5000)
    assert res.converged and res.rate == rate and res.rho_mean == rate
    s = res.sites
    np.testing.assert_array_equal(s.lam_i, np.log(rate / (1 - rate)))
    assert not np.any(s.alpha) and not np.any(s.beta)
    means = np.column_stack([c.mean for c in res.classes])
    varis = np.column_stack([c.diag_cov() for c in res.classes])
    lz = s.lam_i + s.lam.sum(axis=1)
    for i in range(n):
        for k in set(range(l)) - {y[i]}:
            t = y[i]
            v_t = 1 / (1 / varis[i, t] - s.tau_t[i, k])
            m_t = v_t * (means[i, t] / varis[i, t] - s.eta_t[i, k])
            v_o = 1 / (1 / varis[i, k] - s.tau_o[i, k])
            m_o = v_o * (means[i, k] / varis[i, k] - s.eta_o[i, k])
            got = _tilted_pair(m_t, v_t, m_o, v_o, expit(lz[i] - s.lam[i, k]), l)
            want = (means[i, t], varis[i, t], means[i, k], varis[i, k], res.outlier_probability[i])
            np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-8)     # as above


def test_fixed_rate_gradients_match_finite_differences():
    """∂ log Z/∂ρ = Σᵢ (pᵢ − ρ)/(ρ(1 − ρ)) at the fixed point (docs/derivations-rmgpc.md, "Fixed label
    noise") and the kernel gradient (18), against central differences of the evidence."""
    X, y = _problem(seed=2)
    l, rho, ell = 3, 0.2, 0.9

    def evidence(rate, log_ell):
        res = rmgpc_ep([RBF(np.exp(log_ell))(X)] * l, y, l, rate=rate, tol=1e-12, max_iter=5000)
        assert res.converged
        return res

    res = evidence(rho, np.log(ell))
    h = 1e-5
    fd_rho = (evidence(rho + h, np.log(ell)).log_evidence
              - evidence(rho - h, np.log(ell)).log_evidence) / (2 * h)
    fd_ell = (evidence(rho, np.log(ell) + h).log_evidence
              - evidence(rho, np.log(ell) - h).log_evidence) / (2 * h)
    grad_ell = RBF(ell).gradient_contract(X, sum(res.gradient_matrices()))[0]
    # central differences: O(h²) ~ 1e-10 truncation, EP's 1e-12 stop amplified by 1/h: 1e-7
    assert res.rate_gradient() == pytest.approx(fd_rho, rel=1e-5, abs=1e-6)
    assert grad_ell == pytest.approx(fd_ell, rel=1e-5, abs=1e-6)
    assert abs(fd_rho) > 0.1                        # away from the optimum: not vacuous


def _brute_force_ep_evidence(res, K_diag, rate, l):
    """log of ∫ Σ_z N(f | 0, diag K) Bern(z | ρ) Π_k s̃ₖ ψ̃ₖ(f, z) df for one point (n = 1): EP's
    evidence computed from its sites by quadrature alone.  Each scale s̃ₖ = Zₖ / ∫ cavityₖ ψ̃ₖ has
    Zₖ from the Gauss–Legendre tilted mass and the denominator by scipy's quad."""
    s = res.sites
    y = s.y[0]
    others = [k for k in range(l) if k != y]
    means = np.array([c.mean[0] for c in res.classes])
    varis = np.array([c.diag_cov()[0] for c in res.classes])
    lz = s.lam_i[0] + s.lam[0].sum()

    def gauss_mass(tau, eta, m, v):       # ∫ exp(−½ τ f² + η f) N(f | m, v) df
        f = lambda x: np.exp(-0.5 * tau * x * x + eta * x - 0.5 * (x - m) ** 2 / v) / np.sqrt(2 * np.pi * v)
        sd = np.sqrt(v)
        return quad(f, m - 40 * sd, m + 40 * sd, epsabs=0, epsrel=1e-13, limit=200)[0]

    log_scale = 0.0
    for k in others:
        tt, et, to, eo, lam = s.tau_t[0, k], s.eta_t[0, k], s.tau_o[0, k], s.eta_o[0, k], s.lam[0, k]
        v_t = 1 / (1 / varis[y] - tt)
        m_t = v_t * (means[y] / varis[y] - et)
        v_o = 1 / (1 / varis[k] - to)
        m_o = v_o * (means[k] / varis[k] - eo)
        p = expit(lz - lam)
        z_k = _tilted_pair(m_t, v_t, m_o, v_o, p, l, with_mass=True)[5]
        site_mass = gauss_mass(tt, et, m_t, v_t) * gauss_mass(to, eo, m_o, v_o) * (
            p * expit(lam) + (1 - p) * expit(-lam))
        log_scale += np.log(z_k) - np.log(site_mass)
    # the sites times the prior: Gaussian integrals per latent, a sum over z
    f_part = gauss_mass(s.tau_t[0].sum(), s.eta_t[0].sum(), 0.0, K_diag[y])
    for k in others:
        f_part *= gauss_mass(s.tau_o[0, k], s.eta_o[0, k], 0.0, K_diag[k])
    z_part = (rate * np.prod([expit(s.lam[0, k]) for k in others])
              + (1 - rate) * np.prod([expit(-s.lam[0, k]) for k in others]))
    return log_scale + np.log(f_part) + np.log(z_part)


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.3])
def test_fixed_label_noise_evidence_on_one_point_by_quadrature(eps):
    """One point, three classes with per-class prior variances: EP's evidence equals the integral of
    its own scaled sites computed by quadrature alone, and the true evidence
    log[(1 − ε) P(argmax = y) + ε/2 · P(argmax ≠ y)] (1-D quadrature) up to EP's approximation
    error.  With two classes a point has one site, EP is exact, and the evidence is log ½."""
    from scipy.stats import norm

    l, y = 3, np.array([0])
    v = np.array([1.0, 0.3, 2.0])
    rate = eps * l / (l - 1)
    res = rmgpc_ep([np.array([[vk]]) for vk in v], y, l, rate=rate, tol=1e-12, max_iter=5000)
    assert res.converged
    # EP stopped at a step below 1e-12, the quadratures are good to ~1e-12 relative
    assert res.log_evidence == pytest.approx(_brute_force_ep_evidence(res, v, rate, l), abs=1e-8)
    p_argmax = quad(lambda u: norm.pdf(u, scale=np.sqrt(v[0])) * norm.cdf(u / np.sqrt(v[1]))
                    * norm.cdf(u / np.sqrt(v[2])), -np.inf, np.inf, epsabs=1e-14)[0]
    true = np.log((1 - eps) * p_argmax + eps / (l - 1) * (1 - p_argmax))
    # EP's Q factorises f and z and splits the argmax into pairs: measured gaps 0.0055, 0.035,
    # 0.071 (SMGPC's own gap on this point: 0.0018)
    assert abs(res.log_evidence - true) < 0.1
    two = rmgpc_ep([np.array([[0.5]]), np.array([[2.0]])], y, 2, rate=2 * eps, tol=1e-12)
    assert two.log_evidence == pytest.approx(np.log(0.5), abs=1e-12)   # one site: exact


def test_rate_needs_the_robust_model():
    with pytest.raises(ValueError, match="rate"):
        rmgpc_ep([np.eye(3)] * 3, np.array([0, 1, 2]), 3, robust=False, rate=0.1)
    with pytest.raises(ValueError, match="rate"):
        rmgpc_ep([np.eye(3)] * 3, np.array([0, 1, 2]), 3, rate=1.0)


def test_ep_pins_blas_to_one_thread_and_restores_it(tmp_path, monkeypatch):
    """EP runs under the thread policy's "blocks" rule: every BLAS library threadpoolctl finds at
    one thread, each restored on exit (a nested grant restores the outer one); the controller
    behind it is kept between calls and made again after an import (which can load a new
    library)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from gpc import _threads
    from gpc.multiclass import ep

    def threads():
        return [info["num_threads"] for info in threadpoolctl.threadpool_info()
                if info["user_api"] == "blas"]

    before = threads()
    seen = []
    real = ep._run

    def spy(*args):
        seen.append(set(threads()))
        return real(*args)
    monkeypatch.setattr(ep, "_run", spy)
    K = np.exp(-0.5 * np.subtract.outer(np.arange(12.0), np.arange(12.0)) ** 2 / 4)
    y = np.arange(12) % 3
    rmgpc_ep([K] * 3, y, 3, max_iter=5)
    assert seen and all(s == {1} for s in seen)
    assert threads() == before
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        with _threads.blas("blocks"):
            assert set(threads()) == {1}
            with _threads.blas("dense", 10 ** 6) as n:
                assert n == 2 and set(threads()) == {2}
            assert set(threads()) == {1}
        assert set(threads()) == {2}
    first = _threads.controller()
    assert _threads.controller() is first
    (tmp_path / "fresh_module_for_the_controller.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fresh_module_for_the_controller  # noqa: F401
    try:
        assert _threads.controller() is not first
    finally:
        del sys.modules["fresh_module_for_the_controller"]


def test_threaded_class_block_calls_all_end_before_a_failure_is_raised():
    """With the class blocks in threads, a failing block's error reaches EP only once every other
    block's call has ended, so that the retry with half the damping never has two threads in one
    block's buffers (which left negative diagonals in a Cholesky factor under n_jobs=-1)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from gpc.exceptions import NotPositiveDefiniteError
    from gpc.multiclass import ep

    ended = threading.Event()

    def block(k):
        if k == 0:
            raise NotPositiveDefiniteError("block 0")
        time.sleep(0.2)              # still factoring when block 0 fails
        ended.set()
        return k

    with ThreadPoolExecutor(max_workers=2) as pool:
        with pytest.raises(NotPositiveDefiniteError, match="block 0"):
            ep._map(pool, block, range(2))
        assert ended.is_set()
        assert ep._map(pool, lambda k: 2 * k, range(3)) == [0, 2, 4]
