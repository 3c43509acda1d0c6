"""EP's negative site variances: the default policy keeps EP's own fixed point.

With a non-log-concave likelihood (the noisy threshold) EP's site precisions can be negative while
every cavity and the posterior stay positive definite.  The default ``on_negative="keep"``
(gpc.inference.ep.DEFAULT_ON_NEGATIVE) keeps them and falls back only where EP cannot update;
``"clip"`` (the PL paper's §IV, for its Table I) clips every negative site and moves the fixed point.
References: the exact evidence for n ≤ 3 (orthant probabilities), EP's fixed-point equations
checked site by site with an independent 1-D quadrature, and annealed importance sampling
(gpc.experiments._ais) on 80 rows of crabs (docs/guide/negative_variances.rst records the figures).
"""

import itertools
import warnings

import numpy as np
import pytest
from scipy import integrate, stats

from gpc import datasets, infer
from gpc.exceptions import DivergenceError
from gpc.experiments import pl_table1
from gpc.experiments._ais import ais_log_z
from gpc.experiments._common import whiten
from gpc.inference._sites import NegativeSitesWarning
from gpc.inference.ep import DEFAULT_ON_NEGATIVE
from gpc.kernels import RBF, ConstantKernel, WhiteKernel
from gpc.likelihoods import NoisyThreshold

from helpers import rbf

#: AIS of ln Z on the crabs problem below (64 chains, 20,000 temperatures, ESS, seed 0:
#: ``ais_log_z(K, y, NoisyThreshold(eps), n_temps=20000, n_chains=64, seed=0, jitter=1e-10)``;
#: docs/guide/negative_variances.rst): (estimate, standard error)
AIS_CRABS = {0.05: (-23.896, 0.180), 0.2: (-35.227, 0.072)}


def _quiet(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return infer(**kwargs)


@pytest.fixture(scope="module")
def crabs80():
    # the reported problem: crabs standardised over its 200 rows, the first 80 rows (one species,
    # labels by sex), C·RBF(1.5) with C = 2 held fixed
    X, _ = datasets.load("crabs", return_X_y=True)
    X = np.asarray(X, dtype=float)
    X = ((X - X.mean(0)) / X.std(0))[:80]
    y = datasets.load("crabs").y_pm1()[:80]
    return (ConstantKernel(2.0) * RBF(1.5))(X), y


def test_the_default_is_keep():
    assert DEFAULT_ON_NEGATIVE == "keep"


@pytest.mark.parametrize("eps", [0.05, 0.2])
def test_default_schedules_agree_and_lie_near_ais_on_crabs(crabs80, eps):
    K, y = crabs80
    res = {}
    for schedule in ("sequential", "parallel"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", NegativeSitesWarning)   # an EP fixed point: no warning
            r = infer(K, y, NoisyThreshold(eps), method="ep", schedule=schedule, tol=1e-12,
                      max_iter=2000)
        assert r.converged and r.info["ep_fixed_point"] and r.info["n_fallback"] == 0
        # EP's fixed point here has a negative site precision (min -1.33 at eps 0.05, -0.43 at 0.2)
        # that every cavity tolerates: the case the default must keep, where "clip" moved it
        assert r.info["n_negative_sites"] >= 1 and np.min(r.site_precision) < -0.1
        res[schedule] = r.log_evidence
    # the issue asks for 1 nat; both schedules reach the same fixed point to tol 1e-12, so their
    # evidences agree to rounding (clip: -86.98 sequential against -24.49 parallel at eps 0.05)
    assert abs(res["sequential"] - res["parallel"]) < 1e-6
    # EP is not exact: it is 0.69 (eps 0.05) and 0.50 (eps 0.2) below AIS here, against AIS
    # standard errors of 0.18 and 0.07; 1 nat bounds that, where "clip" is 63 and 25 nats off
    ais, _ = AIS_CRABS[eps]
    assert abs(res["sequential"] - ais) < 1.0


@pytest.mark.parametrize("eps", [0.05, 0.2])
def test_clip_moves_the_fixed_point_and_says_so(crabs80, eps):
    # the paper's rule stays available: it clips sites in its final sweep, so its result is no EP
    # fixed point, the result says so, and a NegativeSitesWarning is raised
    K, y = crabs80
    with pytest.warns(NegativeSitesWarning, match="not an EP fixed point"):
        r = infer(K, y, NoisyThreshold(eps), method="ep", on_negative="clip", tol=1e-12, max_iter=2000)
    assert r.info["n_fallback"] > 0 and not r.info["ep_fixed_point"]
    assert np.all(r.site_precision >= 0)
    keep = _quiet(K=K, y=y, likelihood=NoisyThreshold(eps), method="ep", tol=1e-12, max_iter=2000)
    assert keep.log_evidence - r.log_evidence > 10.0       # 62 and 25 nats measured


def test_the_gradient_at_a_fixed_point_with_negative_sites_is_the_total_derivative(crabs80):
    # EP's evidence is stationary in the sites at any EP fixed point, negative sites included, so
    # R&W Alg. 5.2's explicit gradient (here from the signed posterior) is the total derivative.
    # Central differences on log θ (h = 1e-5, EP to tol 1e-12 at each point: ~1e-7 rounding over 2h,
    # O(h²) truncation ~1e-9): 1e-5 relative, 1e-6 absolute.  Under "clip" the evidence is not stationary in the
    # clipped sites and this identity does not hold.
    K, y = crabs80
    X, _ = datasets.load("crabs", return_X_y=True)
    X = np.asarray(X, dtype=float)
    X = ((X - X.mean(0)) / X.std(0))[:80]
    kernel = ConstantKernel(2.0) * RBF(1.5)
    lik = NoisyThreshold(0.05)
    r = _quiet(K=K, y=y, likelihood=lik, method="ep", tol=1e-12, max_iter=2000)
    assert r.info["n_negative_sites"] >= 1 and r.info["ep_fixed_point"]
    g = r.log_evidence_gradient(lambda M: kernel.gradient_contract(X, M))
    g_lower = r.log_evidence_gradient(lambda M: kernel.gradient_contract(X, M, K=K, symmetric=True),
                                      lower=True)
    h = 1e-5
    fd = []
    for e in np.eye(len(kernel.theta)):
        up = _quiet(K=kernel.clone_with_theta(kernel.theta + h * e)(X), y=y, likelihood=lik,
                    method="ep", tol=1e-12, max_iter=2000, init=r)
        dn = _quiet(K=kernel.clone_with_theta(kernel.theta - h * e)(X), y=y, likelihood=lik,
                    method="ep", tol=1e-12, max_iter=2000, init=r)
        fd.append((up.log_evidence - dn.log_evidence) / (2 * h))
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_lower, g, rtol=1e-10, atol=1e-12)
    # and exactly: the noisy threshold depends on f only through its sign, so the evidence does not
    # depend on the amplitude C (f → √C f), nor does EP's (its sites scale with it): ∂/∂log C = 0
    assert abs(g[0]) < 1e-9 and abs(g[1]) > 1.0


def _tilted_site(y, m, v, eps):
    """The EP site (τ, ν) matching N(m, v) × p(y|f) for the noisy threshold, by 1-D quadrature
    split at the step (independent of gpc's closed forms)."""
    def lik(f):
        return eps + (1.0 - 2.0 * eps) * (y * f > 0)

    def moment(k):
        g = lambda f: f ** k * lik(f) * stats.norm.pdf(f, m, np.sqrt(v))
        lo, hi = m - 40 * np.sqrt(v), m + 40 * np.sqrt(v)
        parts = [(lo, min(0.0, hi)), (max(0.0, lo), hi)]
        return sum(integrate.quad(g, a, b, epsabs=0, epsrel=1e-13, limit=200)[0]
                   for a, b in parts if b > a)

    z, m1, m2 = moment(0), moment(1), moment(2)
    mean, var = m1 / z, m2 / z - (m1 / z) ** 2
    return 1.0 / var - 1.0 / v, mean / var - m / v


def test_the_default_result_satisfies_eps_fixed_point_equations(crabs80):
    # every site equals its own EP update (R&W eq. (3.56)-(3.59)) computed here from the result's
    # marginals with scipy quadrature: 1e-6 relative (tol 1e-12 on the sites; quadrature ~1e-10;
    # the marginals' rounding is amplified by var² ~ 1e2 in τ = 1/var − ...)
    K, y = crabs80
    eps = 0.05
    r = _quiet(K=K, y=y, likelihood=NoisyThreshold(eps), method="ep", tol=1e-12, max_iter=2000)
    tau, nu = r.site_precision, r.site_location
    mu, var = r.mean, np.diag(r.cov)
    idx = np.argsort(tau)[:12]                    # the negative site and its neighbours in τ
    for i in idx:
        cav_v = 1.0 / (1.0 / var[i] - tau[i])
        cav_m = cav_v * (mu[i] / var[i] - nu[i])
        t_new, n_new = _tilted_site(y[i], cav_m, cav_v, eps)
        assert abs(t_new - tau[i]) < 1e-6 * (1 + abs(tau[i]))
        assert abs(n_new - nu[i]) < 1e-6 * (1 + abs(nu[i]))
    assert tau[idx[0]] < 0


def _exact_log_z(K, m0, y, eps):
    """ln ∫ Π_i (ε + (1 − 2ε) H(y_i f_i)) N(f | m0, K) df, exactly: expanding the product,
    Z = Σ_S ε^(n−|S|) (1 − 2ε)^|S| P(y_i f_i > 0 for i ∈ S), an orthant probability per subset
    (closed form for |S| = 1, Genz's algorithm in scipy, accurate to ~1e-8, for |S| = 2, 3)."""
    n = len(y)
    D = np.diag(y)
    total = 0.0
    for k in range(n + 1):
        for S in itertools.combinations(range(n), k):
            S = list(S)
            if not S:
                p = 1.0
            elif len(S) == 1:
                i = S[0]
                p = stats.norm.cdf(y[i] * m0[i] / np.sqrt(K[i, i]))
            else:
                C = (D @ K @ D)[np.ix_(S, S)]
                p = stats.multivariate_normal(np.zeros(len(S)), C, abseps=1e-11,
                                              releps=1e-11).cdf((y * m0)[S])
            total += eps ** (n - k) * (1.0 - 2.0 * eps) ** k * p
    return float(np.log(total))


@pytest.mark.parametrize("sf2,eps,m", [(1.0, 0.1, -1.7), (4.0, 0.3, 0.8), (16.0, 0.05, 0.3)])
def test_one_site_ep_is_exact(sf2, eps, m):
    # with one datum EP's site matches the exact posterior's moments, and Z_EP = Z, with or without
    # a negative site precision (the first case has one: -0.39).  "clip" gets the evidence right
    # too (with one site, Z_EP is the tilted normaliser of the prior whatever the site), but not
    # the posterior: its clipped site leaves the prior's variance, 1.0 against the exact 1.6.
    K = np.array([[sf2]])
    y = np.array([1.0])
    m0 = np.array([m])
    exact = _exact_log_z(K, m0, y, eps)
    t, v = _tilted_site(1.0, m, sf2, eps)
    post_var = 1.0 / (1.0 / sf2 + t)
    for schedule in ("sequential", "parallel"):
        r = _quiet(K=K, y=y, likelihood=NoisyThreshold(eps), method="ep", schedule=schedule,
                   prior_mean=m0, tol=1e-12)
        assert abs(r.log_evidence - exact) < 1e-10        # closed forms on both sides
        # quadrature to ~1e-12 relative in the moments, differenced in τ = 1/v̂ − 1/v
        assert abs(r.site_precision[0] - t) < 1e-8 and abs(r.site_location[0] - v) < 1e-8
        assert abs(r.cov[0, 0] - post_var) < 1e-8
    if sf2 == 1.0:
        assert r.site_precision[0] < 0
        clip = _quiet(K=K, y=y, likelihood=NoisyThreshold(eps), method="ep", on_negative="clip",
                      prior_mean=m0, tol=1e-12)
        assert abs(clip.cov[0, 0] - post_var) > 0.1


def _small_problem(n, seed, sf2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    K = rbf(X, 1.0, sf2)
    return K, rng.normal(size=n), np.where(rng.random(n) < 0.5, 1.0, -1.0)


# (n, seed, sf2, eps): problems whose EP fixed point has negative site precisions (1, 3, 2, 1 of them)
SMALL = [(2, 7, 4.0, 0.3), (3, 0, 4.0, 0.3), (3, 1, 4.0, 0.3), (3, 3, 16.0, 0.3)]


@pytest.mark.parametrize("n,seed,sf2,eps", SMALL)
def test_small_problems_against_the_exact_evidence(n, seed, sf2, eps):
    # EP is not exact for n ≥ 2; on these problems its evidence is within 0.015 of the exact one
    # (measured 0.0007, 0.008, 0.014, 0.004); 0.05 is the bound asserted (EP's error grows with the
    # posterior's departure from a Gaussian: 0.09 on seed 1 at ε = 0.05, not asserted)
    K, m0, y = _small_problem(n, seed, sf2)
    exact = _exact_log_z(K, m0, y, eps)
    ev = []
    for schedule in ("sequential", "parallel"):
        r = _quiet(K=K, y=y, likelihood=NoisyThreshold(eps), method="ep", schedule=schedule,
                   prior_mean=m0, tol=1e-12, max_iter=1000)
        assert r.info["ep_fixed_point"] and r.info["n_negative_sites"] >= 1
        ev.append(r.log_evidence)
    assert abs(ev[0] - ev[1]) < 1e-9                   # one fixed point, to tol
    assert abs(ev[0] - exact) < 0.05


def test_supplement_example_reaches_eps_own_fixed_point():
    # PL supplement: plain EP in the order (1, 2) meets a negative cavity at site 1 in sweep 2
    # (tests/test_ep.py); in the order (2, 1) it converges, with a negative site.  The default
    # refits the cavity-less site by PL's update once, and every schedule and order then reaches
    # that same fixed point (1e-8: tol 1e-10 on the sites).  Its evidence is within 0.04 of the
    # exact one (measured 0.031); clipping's is 0.12 off.
    K = np.array([[1.0, 0.8], [0.8, 1.0]])
    m0 = np.array([-0.5, -3.0])
    y = np.array([1.0, 1.0])
    lik = NoisyThreshold(0.01)
    exact = _exact_log_z(K, m0, y, 0.01)
    ref = _quiet(K=K, y=y, likelihood=lik, method="ep", prior_mean=m0, order=[1, 0],
                 on_negative="raise", tol=1e-10, max_iter=500)
    for schedule, order in (("sequential", None), ("sequential", [1, 0]), ("parallel", None)):
        r = _quiet(K=K, y=y, likelihood=lik, method="ep", schedule=schedule, order=order,
                   prior_mean=m0, tol=1e-10, max_iter=500)
        assert r.info["ep_fixed_point"] and np.any(r.site_precision < 0)
        np.testing.assert_allclose(r.mean, ref.mean, atol=1e-8)
        assert abs(r.log_evidence - exact) < 0.04
    clip = _quiet(K=K, y=y, likelihood=lik, method="ep", prior_mean=m0, on_negative="clip",
                  tol=1e-10)
    assert abs(clip.log_evidence - exact) > 0.1


def test_keep_skip_that_ends_without_a_cavity_names_the_site():
    # the old-site fallback can settle with the old site making its own cavity negative (the
    # supplement's example in natural order): no EP fixed point, no EP evidence, a clear error
    K = np.array([[1.0, 0.8], [0.8, 1.0]])
    m0 = np.array([-0.5, -3.0])
    y = np.array([1.0, 1.0])
    with pytest.raises(DivergenceError, match="without a cavity") as err:
        _quiet(K=K, y=y, likelihood=NoisyThreshold(0.01), method="ep", prior_mean=m0,
               on_negative="keep-skip", tol=1e-10)
    assert err.value.index == 0


def _table1_problem(name, n=100):
    X, y = pl_table1.load(name)
    idx = np.random.default_rng(0).permutation(len(y))[:n]
    X, _ = whiten(X[idx], X[idx][:1])
    return X, y[idx]


@pytest.mark.parametrize("name", pl_table1.DATASETS)
def test_default_schedules_agree_on_the_table1_noisy_threshold_cells(name):
    # PL Table I's sets, whitening and kernel (σ₁² RBF(ℓ) + 0.1 δ) with the noisy threshold at the
    # project's ε, 100 rows each, at the protocol's start θ = (10, 1) and at a large amplitude
    # (1e4, 3) that the optimiser visits, where the fixed points of thyroid and housing have negative
    # sites.  The issue asks for 1 nat; one fixed point reached to tol 1e-9 agrees to ~1e-8.
    X, y = _table1_problem(name)
    for sf2, ell in ((10.0, 1.0), (1e4, 3.0)):
        K = (ConstantKernel(sf2) * RBF(ell) + WhiteKernel(pl_table1.SIGMA2_NOISE))(X)
        ev = []
        for schedule in ("sequential", "parallel"):
            r = _quiet(K=K, y=y, likelihood=NoisyThreshold(), method="ep", schedule=schedule,
                       tol=1e-9, max_iter=1000)
            assert r.converged and r.info["ep_fixed_point"]
            ev.append(r.log_evidence)
        assert abs(ev[0] - ev[1]) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("eps", [0.05, 0.2])
def test_ais_reference_on_crabs_is_reproduced(crabs80, eps):
    # the recorded AIS figures against a fresh run with another seed: the two estimates differ by
    # less than 4 combined standard errors; and the default EP evidence lies within 1 nat of it.
    # Prints the fresh figures (run with -s to see them).
    K, y = crabs80
    lz, se, _ = ais_log_z(K, y, NoisyThreshold(eps), n_temps=20000, n_chains=64, seed=1,
                          jitter=1e-10)
    print(f"AIS crabs80 eps={eps}: {lz:.3f} ± {se:.3f}")
    ais, ais_se = AIS_CRABS[eps]
    assert abs(lz - ais) < 4.0 * np.hypot(se, ais_se)
    r = _quiet(K=K, y=y, likelihood=NoisyThreshold(eps), method="ep", tol=1e-10, max_iter=2000)
    assert abs(r.log_evidence - lz) < 1.0

def _signed_problem(seed, n=40, scale=0.2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    K = rbf(X, np.sqrt(1.5), 2.0) + 0.1 * np.eye(n)
    tau = rng.uniform(0.0, 2.0, n)
    tau[rng.choice(n, 5, replace=False)] *= -scale
    tau[1] = 0.0
    Xs = rng.normal(size=(6, 2))                       # test inputs: k(X, Xs) of the same kernel
    Ks = 2.0 * np.exp(-0.5 * ((X[:, None] - Xs[None]) ** 2).sum(-1) / 1.5)
    return K, tau, rng.normal(size=n), 0.3 * rng.normal(size=n), Ks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_signed_posterior_equals_explicit_inverses(seed):
    # Σ = (K⁻¹ + T)⁻¹, μ = Σ (K⁻¹ m0 + ν), α = K⁻¹ (μ − m0), R = K⁻¹ − K⁻¹ Σ K⁻¹ with some τ < 0,
    # against explicit inverses of a K with eigenvalues ≥ 0.1 (cond(K) ~ 1e3: their rounding is
    # ~1e-12); the Woodbury form over the non-negative split must give the same to 1e-10
    from gpc.posterior import SignedSitePosterior, site_posterior
    K, tau, nu, m0, Ks = _signed_problem(seed)
    post = site_posterior(K, tau, nu, m0)
    assert isinstance(post, SignedSitePosterior)
    Kinv = np.linalg.inv(K)
    Sigma = np.linalg.inv(Kinv + np.diag(tau))
    mu = Sigma @ (Kinv @ m0 + nu)
    alpha = Kinv @ (mu - m0)
    R = Kinv - Kinv @ Sigma @ Kinv
    M = 0.5 * (np.outer(alpha, alpha) - R)
    np.testing.assert_allclose(post.mean, mu, atol=1e-10)
    np.testing.assert_allclose(post.diag_cov(), np.diag(Sigma), atol=1e-10)
    np.testing.assert_allclose(np.tril(post.lower_cov()), np.tril(Sigma), atol=1e-10)
    np.testing.assert_allclose(post.cov(), Sigma, atol=1e-10)
    np.testing.assert_allclose(post.alpha, alpha, atol=1e-10)
    np.testing.assert_allclose(post.R(), R, atol=1e-10)
    np.testing.assert_allclose(post.gradient_matrix(), M, atol=1e-10)
    np.testing.assert_allclose(np.tril(post.gradient_matrix(lower=True)), np.tril(M), atol=1e-10)
    assert abs(post.log_det_B - np.linalg.slogdet(np.eye(len(tau)) + np.diag(tau) @ K)[1]) < 1e-10
    kd = np.full(Ks.shape[1], 2.0)
    mean, var = post.predict(Ks, kd, 0.2)
    np.testing.assert_allclose(mean, 0.2 + Ks.T @ alpha, atol=1e-10)
    np.testing.assert_allclose(var, kd - np.einsum("ij,ij->j", Ks, R @ Ks), atol=1e-10)


def test_signed_posterior_refuses_sites_that_define_no_distribution():
    from gpc.exceptions import NotPositiveDefiniteError
    from gpc.posterior import site_posterior
    K, tau, nu, m0, _ = _signed_problem(0, scale=50.0)
    assert np.min(np.linalg.eigvalsh(np.linalg.inv(K) + np.diag(tau))) < 0
    with pytest.raises(NotPositiveDefiniteError, match="indefinite"):
        site_posterior(K, tau, nu, m0)
