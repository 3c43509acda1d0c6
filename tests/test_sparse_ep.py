"""SEP's site algebra and evidence (python/gpc/sparse/ep.py): exactness at Z = X and gradients."""

import numpy as np
import pytest

import gpc
from gpc.datasets import load
from gpc.kernels import RBF, ConstantKernel, WhiteKernel
from gpc.likelihoods import get_likelihood
from gpc.sparse._passes import evidence
from gpc.sparse._train import run_ep
from gpc.sparse.core.inducing import InducingFactor


def _standardised(name, n=None):
    X, y = load(name, return_X_y=True)
    if n is not None:
        X, y = X[:n], y[:n]
    X = (X - X.mean(0)) / X.std(0)
    return X, np.where(y == np.unique(y)[1], 1.0, -1.0)


@pytest.mark.parametrize("name, likelihood, n", [("crabs", "probit", None), ("pima", "logit", 150)])
def test_inducing_at_data_equals_exact_ep(name, likelihood, n):
    # With Z = X, K_uu = K, v_i = e_i and s_i = 0: SEP's model is the exact GP and its EP has the
    # same fixed point as gpc's exact EP.
    X, y = _standardised(name, n)
    kernel = ConstantKernel(2.0) * RBF(2.0)
    exact = gpc.infer(kernel(X), y, likelihood=likelihood, method="ep", tol=1e-12, max_iter=1000)
    assert exact.converged
    factor = InducingFactor(kernel, X, jitter=0.0)
    lik = get_likelihood(likelihood)
    tau, nu, q, _, converged, _ = run_ep(lik, X, y, factor, np.zeros(len(y)), np.zeros(len(y)),
                                         damping=0.7, max_iter=1000, tol=1e-12)
    assert converged
    log_z = evidence(lik, X, y, factor, q, tau, nu, block_rows=64, gradient=False)[0]
    mean, var = q.marginals(factor.whiten(X)[0])
    # 1e-6 is the bar; both runs stop at site changes below 1e-12, and K's condition
    # number (~1e10 for crabs) magnifies rounding in the triangular solves to ~1e-10 at most.
    assert abs(log_z - exact.log_evidence) < 1e-6
    np.testing.assert_allclose(mean, exact.mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(var, np.diag(exact.cov), rtol=0, atol=1e-6)


def _converged(lik, X, y, kernel, Z, init=None):
    factor = InducingFactor(kernel, Z, jitter=1e-8)
    n = len(y)
    tau, nu = (np.zeros(n), np.zeros(n)) if init is None else init
    tau, nu, q, _, converged, _ = run_ep(lik, X, y, factor, tau, nu, damping=0.7, max_iter=2000,
                                         tol=1e-11)
    assert converged
    return factor, q, tau, nu


def off_data_problem(likelihood, white=True):
    """crabs (standardised), 12 inducing points near 12 of its rows, an ARD squared exponential
    (with white noise: the kernel's general contractions; without: the b x m fast path)."""
    X, y = _standardised("crabs")
    rng = np.random.default_rng(0)
    Z = X[rng.choice(len(y), 12, replace=False)] + 0.1 * rng.standard_normal((12, X.shape[1]))
    kernel = ConstantKernel(2.0) * RBF(np.full(X.shape[1], 2.0))
    if white:
        kernel = kernel + WhiteKernel(0.1)
    return X, y, Z, kernel, get_likelihood(likelihood)


def assert_central_differences(value, theta, Z, g_theta, g_Z, tol, h=1e-5):
    """g_theta and three entries of g_Z against central differences of value(θ, Z) (step h),
    relative ``tol`` (absolute below 1)."""
    fd = [(value(theta + h * e, Z) - value(theta - h * e, Z)) / (2 * h) for e in np.eye(len(theta))]
    np.testing.assert_allclose(g_theta, fd, rtol=tol, atol=tol)
    for i, d in [(0, 0), (3, 2), (11, 5)]:
        E = np.zeros_like(Z)
        E[i, d] = h
        fd_z = (value(theta, Z + E) - value(theta, Z - E)) / (2 * h)
        assert abs(g_Z[i, d] - fd_z) < tol * max(1.0, abs(fd_z))


@pytest.mark.parametrize("likelihood, white, held", [
    ("probit", True, "sites"), ("logit", True, "sites"), ("probit", False, "sites"),
    ("probit", True, "cavity"), ("logit", False, "cavity")])
def test_evidence_gradient_matches_finite_differences(likelihood, white, held):
    # The gradient is eq. (4) at an EP fixed point, in either of its forms (sites following
    # their rows, batch; or fixed in u-space with the cavities held, minibatches); the finite
    # differences re-converge EP (warm started) at θ ± h, so they see the total derivative of
    # the converged log Z_q.  With the white-noise term the sum's contractions run; without it,
    # the squared exponential's compiled b x m path (gpc.kernels.RBF._cross_gradient).
    X, y, Z, kernel, lik = off_data_problem(likelihood, white)
    factor, q, tau, nu = _converged(lik, X, y, kernel, Z)
    log_z, g_theta, g_Z, n_bad = evidence(lik, X, y, factor, q, tau, nu, block_rows=64, held=held)
    assert n_bad == 0

    def value(theta, Zp):
        f, qq, t, v = _converged(lik, X, y, kernel.clone_with_theta(theta), Zp, init=(tau, nu))
        return evidence(lik, X, y, f, qq, t, v, block_rows=64, gradient=False)[0]

    # central differences (h = 1e-5): O(h²) truncation ~1e-9 plus EP stopped at 1e-11 over 2h
    # (~1e-6 at worst); the gradients are O(1)-O(10)
    assert_central_differences(value, kernel.theta, Z, g_theta, g_Z, 1e-5)


def _refine(lik, y, mean, var, s, tau, nu, damping, moved=None, rule=None):
    """gpc._sparse.refine_rows with EP's "skip" policy unless told: (τ, ν, n_failed, n_fixed)."""
    from gpc.inference.rules import Rule
    from gpc.sparse.ep import refine_rows
    rule = Rule("ep", "skip") if rule is None else rule
    return refine_rows(lik, y, mean, var, s, tau, nu, damping, rule, moved=moved)


@pytest.mark.parametrize("likelihood", ["probit", "logit"])
def test_compiled_site_rule_matches_the_dense_cavity(likelihood):
    # gpc._sparse.refine_rows with old directions: the cavity of a site that q holds along an old
    # direction a', seen along the current a, by Sherman-Morrison from three marginals, then the
    # site rule's matched site (ep.matched_site's algebra).  Against the same cavity formed
    # densely: P - τ a'a'ᵀ inverted, and matched_site on its marginal of a.  O(1) quantities of a
    # 6 x 6 problem: agreement to 1e-10 is rounding.
    from gpc.sparse.core.natural import NaturalPosterior
    from gpc.sparse.ep import matched_site
    rng = np.random.default_rng(3)
    m, b = 6, 5
    lik = get_likelihood(likelihood)
    S = rng.normal(size=(m, 3 * m))
    P, h = np.eye(m) + S @ S.T / m, rng.normal(size=m)
    q = NaturalPosterior(P, h)
    A, A_old = rng.normal(size=(b, m)), rng.normal(size=(b, m))
    tau, nu = rng.uniform(0.05, 0.3, b), rng.normal(size=b)
    y, s = np.where(rng.random(b) < 0.5, -1.0, 1.0), rng.uniform(0.0, 0.5, b)
    mean, var = q.marginals(A)
    mean_old, var_old = q.marginals(A_old)
    cross = np.einsum("ij,jk,ik->i", A, q.cov, A_old)
    t_new, n_new, failed, fixed = _refine(lik, y, mean, var, s, tau, nu, 0.7,
                                          moved=(mean_old, var_old, cross))
    assert failed == 0 and fixed == 0
    for i in range(b):
        P_cav = P - tau[i] * np.outer(A_old[i], A_old[i])
        C = np.linalg.inv(P_cav)
        cmean, cvar = A[i] @ C @ (h - nu[i] * A_old[i]), A[i] @ C @ A[i]
        _, t, v, _ = matched_site(lik, y[i:i + 1], np.array([cmean]), np.array([cvar]), s[i:i + 1])
        np.testing.assert_allclose([t_new[i], n_new[i]],
                                   [0.7 * t[0] + 0.3 * tau[i], 0.7 * v[0] + 0.3 * nu[i]],
                                   rtol=1e-10, atol=1e-12)
    # with a' = a it is the usual cavity, and a row without a proper cavity is left to the
    # policy: "skip" keeps its site (counted as handled)
    tau_big = tau.copy()
    tau_big[0] = 2.0 / var[0]                       # cavity precision 1/σ² - τ < 0
    t2, n2, failed, fixed = _refine(lik, y, mean, var, s, tau_big, nu, 1.0)
    assert failed == 0 and fixed == 1 and t2[0] == tau_big[0] and n2[0] == nu[0]
    for i in range(1, b):
        prec = 1.0 / var[i] - tau[i]
        cvar = 1.0 / prec
        cmean = cvar * (mean[i] / var[i] - nu[i])
        _, t, v, _ = matched_site(lik, y[i:i + 1], np.array([cmean]), np.array([cvar]), s[i:i + 1])
        np.testing.assert_allclose([t2[i], n2[i]], [t[0], v[0]], rtol=1e-10, atol=1e-12)


def test_site_rule_takes_a_zero_marginal_variance_as_the_limit():
    # σ² = 0 (a_i = 0 after underflow) against σ² = 1e-13: the cavity (v, c) = (σ², μ - σ²ν)/(1 -
    # τσ²) and every term of the evidence move by O(σ²) ~ 1e-13 at O(1) values, so 1e-10 is a
    # wide margin.  The site update at σ² = 0 is the matched site of the cavity N(μ, 0)
    # (ep.matched_site), not a skipped row.
    from gpc import _sparse
    from gpc.sparse.ep import matched_site
    lik = get_likelihood("probit")
    y, mean = np.array([1.0, -1.0, 1.0]), np.array([0.0, 0.3, -1.2])
    s, tau, nu = np.array([0.5, 1.0, 2.0]), np.array([0.0, 0.4, 1.5]), np.array([0.0, -0.2, 0.7])
    out = {}
    for var in (0.0, 1e-13):
        v = np.full(3, var)
        g_s, d1, e = np.empty(3), np.empty(3), np.empty(3)
        total, bad = _sparse.evidence_rows(*lik.compiled_spec(), 0, y, mean, v, s, tau, nu, g_s,
                                           d1, e)
        t_new, n_new, failed, fixed = _refine(lik, y, mean, v, s, tau, nu, 1.0)
        assert bad == 0 and failed == 0 and fixed == 0 and np.isfinite(total)
        out[var] = np.concatenate([[total], g_s, d1, e, t_new, n_new])
    np.testing.assert_allclose(out[0.0], out[1e-13], rtol=1e-10, atol=1e-10)
    log_z, t, v, _ = matched_site(lik, y, mean, np.zeros(3), s)
    np.testing.assert_allclose(out[0.0][-6:], np.concatenate([t, v]), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out[0.0][0], np.sum(log_z + 0.5 * (tau * mean ** 2 - 2 * mean * nu)),
                               rtol=1e-12)


def test_compiled_step_checks_its_inputs():
    from gpc import _lapack, _sparse
    L, B = np.eye(4), np.ones((3, 5))
    with pytest.raises(ValueError, match="rows have length 5"):      # the step's triangular products
        _lapack.multiply_triangular_rows(L, B, False)
    with pytest.raises(ValueError, match="square"):
        _lapack.congruence(np.ones((4, 3)), np.eye(4))
    with pytest.raises(ValueError, match="work"):
        _lapack.add_weighted_gram(np.eye(5), B, np.ones(3), np.ones((2, 5)))
    spec = get_likelihood("probit").compiled_spec()
    with pytest.raises(ValueError, match="entries"):
        _sparse.refine_rows(*spec, 0, 1, 1.0, np.ones(3), np.ones(3), np.ones(2), np.ones(3),
                            np.zeros(3), np.zeros(3), np.empty(3), np.empty(3))
    with pytest.raises(ValueError, match="damping"):
        _sparse.refine_rows(*spec, 0, 1, 1.5, *(np.ones(3) for _ in range(4)), np.zeros(3),
                            np.zeros(3), np.empty(3), np.empty(3))
    with pytest.raises(ValueError, match="code"):
        _sparse.refine_rows(*spec, 0, 9, 1.0, *(np.ones(3) for _ in range(4)), np.zeros(3),
                            np.zeros(3), np.empty(3), np.empty(3))
    with pytest.raises(ValueError, match="code"):
        _sparse.evidence_rows(*spec, 7, *(np.ones(3) for _ in range(4)), np.zeros(3),
                              np.zeros(3), np.empty(3), np.empty(3), np.empty(3))
    with pytest.raises(ValueError, match="together"):
        _sparse.refine_rows(*spec, 0, 1, 1.0, *(np.ones(3) for _ in range(4)), np.zeros(3),
                            np.zeros(3), np.empty(3), np.empty(3), mean_old=np.ones(3))


@pytest.mark.parametrize("m", [1, 7, 32, 33, 64, 200, 257])
def test_product_of_two_lower_triangles(m):
    # the recursive product M = L_old⁻¹ L_new (transform_natural) against NumPy; B's strict upper
    # triangle is not read and comes out exactly zero.  Sums of at most m terms of size ~3:
    # rounding below 1e-12.
    from gpc import _lapack

    rng = np.random.default_rng(m)
    A = np.tril(rng.standard_normal((m, m))) + 3 * np.eye(m)
    B = np.tril(rng.standard_normal((m, m))) + 3 * np.eye(m)
    C = B + np.triu(rng.standard_normal((m, m)), 1)
    _lapack.lower_lower_times(A, C)
    np.testing.assert_allclose(C, A @ B, rtol=0, atol=1e-12 * m)
    assert not np.any(np.triu(C, 1))
    with pytest.raises(ValueError, match="B has 3 columns"):
        _lapack.lower_lower_times(np.eye(4), np.eye(3))
