"""SEP's site algebra and evidence (python/gpc/sparse/ep.py): exactness at Z = X and gradients."""

import numpy as np
import pytest

import gpc
from gpc.datasets import load
from gpc.kernels import RBF, ConstantKernel, WhiteKernel
from gpc.likelihoods import get_likelihood
from gpc.sparse._inducing import InducingFactor
from gpc.sparse._passes import evidence, run_ep


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
    tau, nu, q, _, converged = run_ep(lik, X, y, factor, np.zeros(len(y)), np.zeros(len(y)),
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
    tau, nu, q, _, converged = run_ep(lik, X, y, factor, tau, nu, damping=0.7, max_iter=2000,
                                      tol=1e-11)
    assert converged
    return factor, q, tau, nu


@pytest.mark.parametrize("likelihood, white, held", [
    ("probit", True, "sites"), ("logit", True, "sites"), ("probit", False, "sites"),
    ("probit", True, "cavity"), ("logit", False, "cavity")])
def test_evidence_gradient_matches_finite_differences(likelihood, white, held):
    # The gradient is eq. (4) at an EP fixed point, in either of its forms (sites following
    # their rows, batch; or fixed in u-space with the cavities held, minibatches); the finite
    # differences re-converge EP (warm started) at θ ± h, so they see the total derivative of
    # the converged log Z_q.  With the white-noise term the sum's contractions run; without it,
    # the squared exponential's compiled b x m path (gpc.kernels.RBF._cross_gradient).
    X, y = _standardised("crabs")
    rng = np.random.default_rng(0)
    Z = X[rng.choice(len(y), 12, replace=False)] + 0.1 * rng.standard_normal((12, X.shape[1]))
    kernel = ConstantKernel(2.0) * RBF(np.full(X.shape[1], 2.0))
    if white:
        kernel = kernel + WhiteKernel(0.1)
    lik = get_likelihood(likelihood)
    factor, q, tau, nu = _converged(lik, X, y, kernel, Z)
    log_z, g_theta, g_Z, n_bad = evidence(lik, X, y, factor, q, tau, nu, block_rows=64, held=held)
    assert n_bad == 0

    def value(theta, Zp):
        f, qq, t, v = _converged(lik, X, y, kernel.clone_with_theta(theta), Zp, init=(tau, nu))
        return evidence(lik, X, y, f, qq, t, v, block_rows=64, gradient=False)[0]

    h = 1e-5
    theta = kernel.theta
    fd = [(value(theta + h * e, Z) - value(theta - h * e, Z)) / (2 * h) for e in np.eye(len(theta))]
    # central differences: O(h²) truncation ~1e-9 plus EP stopped at 1e-11 over 2h (~1e-6 at
    # worst); the gradients are O(1)-O(10)
    np.testing.assert_allclose(g_theta, fd, rtol=1e-5, atol=1e-5)
    for i, d in [(0, 0), (3, 2), (11, 5)]:
        E = np.zeros_like(Z)
        E[i, d] = h
        fd_z = (value(theta, Z + E) - value(theta, Z - E)) / (2 * h)
        assert abs(g_Z[i, d] - fd_z) < 1e-5 * max(1.0, abs(fd_z))


@pytest.mark.parametrize("likelihood", ["probit", "logit"])
def test_compiled_site_rule_matches_the_dense_cavity(likelihood):
    # gpc._sparse.SiteRule.refine_moved: the cavity of a site that q holds along an old direction
    # a', seen along the current a, by Sherman-Morrison from three marginals, then the matched
    # site (ep.matched_site's algebra).  Against the same cavity formed densely: P - τ a'a'ᵀ
    # inverted, and matched_site on its marginal of a.  O(1) quantities of a 6 x 6 problem:
    # agreement to 1e-10 is rounding.
    from gpc._sparse import SiteRule
    from gpc.sparse.ep import NaturalPosterior, matched_site
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
    t_new, n_new = np.empty(b), np.empty(b)
    skipped = SiteRule(lik).refine_moved(y, mean, var, mean_old, var_old, cross, s, tau, nu, 0.7,
                                         t_new, n_new)
    assert skipped == 0
    for i in range(b):
        P_cav = P - tau[i] * np.outer(A_old[i], A_old[i])
        C = np.linalg.inv(P_cav)
        cmean, cvar = A[i] @ C @ (h - nu[i] * A_old[i]), A[i] @ C @ A[i]
        _, t, v, _ = matched_site(lik, y[i:i + 1], np.array([cmean]), np.array([cvar]), s[i:i + 1])
        np.testing.assert_allclose([t_new[i], n_new[i]],
                                   [0.7 * t[0] + 0.3 * tau[i], 0.7 * v[0] + 0.3 * nu[i]],
                                   rtol=1e-10, atol=1e-12)
    # with a' = a it is the usual cavity (refine), and a row without a proper cavity keeps its site
    t2, n2 = np.empty(b), np.empty(b)
    tau_big = tau.copy()
    tau_big[0] = 2.0 / var[0]                       # cavity precision 1/σ² - τ < 0
    skipped = SiteRule(lik).refine(y, mean, var, s, tau_big, nu, 1.0, t2, n2)
    assert skipped == 1 and t2[0] == tau_big[0] and n2[0] == nu[0]
    for i in range(1, b):
        prec = 1.0 / var[i] - tau[i]
        cvar = 1.0 / prec
        cmean = cvar * (mean[i] / var[i] - nu[i])
        _, t, v, _ = matched_site(lik, y[i:i + 1], np.array([cmean]), np.array([cvar]), s[i:i + 1])
        np.testing.assert_allclose([t2[i], n2[i]], [t[0], v[0]], rtol=1e-10, atol=1e-12)


def test_compiled_step_checks_its_inputs():
    from gpc import _lapack, _sparse
    L, B = np.eye(4), np.ones((3, 5))
    with pytest.raises(ValueError, match="rows have length 5"):      # the step's triangular products
        _lapack.multiply_triangular_rows(L, B, False)
    with pytest.raises(ValueError, match="square"):
        _sparse.congruence(np.ones((4, 3)), np.eye(4))
    with pytest.raises(ValueError, match="work"):
        _sparse.add_weighted_gram(np.eye(5), B, np.ones(3), np.ones((2, 5)))
    with pytest.raises(ValueError, match="entries"):
        _sparse.SiteRule(get_likelihood("probit")).refine(
            np.ones(3), np.ones(3), np.ones(2), np.ones(3), np.zeros(3), np.zeros(3), 1.0,
            np.empty(3), np.empty(3))
    with pytest.raises(ValueError, match="damping"):
        _sparse.SiteRule(get_likelihood("probit")).refine(
            *(np.ones(3) for _ in range(4)), np.zeros(3), np.zeros(3), 1.5, np.empty(3),
            np.empty(3))
