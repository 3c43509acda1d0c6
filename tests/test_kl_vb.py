"""KL minimisation and variational bounds (issue 4; NR eq. (14)-(21)).

Tolerances: exact ln Z from Genz's orthant algorithm (abseps 1e-12) or an 80-point-per-axis
Gauss-Hermite tensor rule (smooth integrands: error far below 1e-8); bounds are compared with a 1e-9
slack for the rounding of O(10)-term sums.  Gradients against central differences with step 1e-5 in
log θ: truncation O(h²) ~ 1e-10, rounding ~ 1e-16/1e-5 × |ln Z| ~ 1e-10, and the iterations stop at
tol 1e-12, so 1e-6 relative (plus 1e-6 absolute) has a wide margin.
"""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.gaussian_process.kernels import RBF, ConstantKernel

from gpc.exceptions import ConvergenceWarning
from gpc.inference import infer
from gpc.inference.vb import quadratic_bound
from gpc.likelihoods import get_likelihood

from _approx_reference import (exact_log_z_probit, exact_log_z_quadrature, kl_bound_explicit,
                               logit_log_lik, probit_log_lik, rbf, vb_logit_explicit)

LOG_LIK = {"probit": probit_log_lik, "logit": logit_log_lik}


def _small_problem(n, seed, amplitude=2.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    K = rbf(X, amplitude=amplitude) + 1e-10 * np.eye(n)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return K, y


@pytest.mark.parametrize("lik", ["probit", "logit"])
@pytest.mark.parametrize("n,seed,amp", [(2, 0, 2.0), (2, 1, 6.0), (3, 2, 2.0), (3, 3, 6.0)])
def test_bound_ordering_against_exact_evidence(lik, n, seed, amp):
    """NR eq. (21): ln Z_VB ≤ ln Z_KL ≤ ln Z, and KL within 0.1 of ln Z on tiny problems."""
    K, y = _small_problem(n, seed, amp)
    log_z = exact_log_z_quadrature(K, y, LOG_LIK[lik])
    if lik == "probit":  # two independent exact computations must agree
        assert log_z == pytest.approx(exact_log_z_probit(K, y), abs=1e-7)
    kl = infer(K, y, lik, "kl", tol=1e-12).log_evidence
    vb = infer(K, y, lik, "vb", tol=1e-12).log_evidence
    assert vb <= kl + 1e-9
    assert kl <= log_z + 1e-9
    assert log_z - kl < 0.1


@pytest.mark.parametrize("lik", ["probit", "logit"])
def test_kl_bound_equals_explicit_formula(lik):
    """The factored ln Z_B(α, w) equals E_q ln p − KL(q‖prior) computed with explicit inverses."""
    K, y = _small_problem(6, 4)
    res = infer(K, y, lik, "kl", tol=1e-12)
    explicit = kl_bound_explicit(K, y, res.mean, res.cov, LOG_LIK[lik])
    assert res.log_evidence == pytest.approx(explicit, abs=1e-7)   # both GH rules: ~1e-9 apart


def test_kl_is_a_stationary_maximum():
    """No nearby Gaussian of the family (K⁻¹ + W)⁻¹, m = Kα has a larger bound: at the optimum W = −2Λ
    and α = ∂E/∂m (NR eq. (17)), checked through the stored (α, w) and random perturbations."""
    K, y = _small_problem(5, 5)
    lik = get_likelihood("logit")
    res = infer(K, y, lik, "kl", tol=1e-13)
    a, w = res.info["alpha"], res.info["w"]
    _, gm, gv = lik.expected_log_prob(y, res.mean, np.diag(res.cov))
    np.testing.assert_allclose(gm, a, atol=1e-6)
    np.testing.assert_allclose(-2 * gv, w, atol=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(5):
        da, dw = 1e-3 * rng.normal(size=5), 1e-3 * rng.normal(size=5)
        W = np.diag(w + dw)
        V = np.linalg.inv(np.linalg.inv(K) + W)
        assert kl_bound_explicit(K, y, K @ (a + da), V, logit_log_lik) < res.log_evidence


def test_vb_logit_matches_explicit_em():
    K, y = _small_problem(7, 6)
    res = infer(K, y, "logit", "vb", tol=1e-13)
    ref, xi = vb_logit_explicit(K, y)
    assert res.log_evidence == pytest.approx(ref, abs=1e-8)
    np.testing.assert_allclose(np.abs(res.info["xi"]), xi, atol=1e-5)


def test_vb_probit_newton_shortcut_equals_em():
    """Probit VB is solved through the MAP (the EM fixed point); the plain EM ς ← y ∘ m reaches it."""
    from gpc.inference.vb import _evaluate
    K, y = _small_problem(6, 7)
    res = infer(K, y, "probit", "vb", tol=1e-12)
    xi = np.zeros(6)
    last = -np.inf
    for _ in range(3000):
        post, lz = _evaluate(K, y, "probit", np.zeros(6), xi)
        assert lz >= last - 1e-10        # EM never decreases the bound
        last = lz
        xi = y * post.mean
    assert res.log_evidence == pytest.approx(last, abs=1e-8)


@pytest.mark.parametrize("name", ["logit", "probit"])
def test_quadratic_bounds_are_lower_bounds_and_tight(name):
    t = np.linspace(-30, 30, 2001)
    for xi in (-4.0, -0.3, 0.0, 0.7, 3.0, 12.0):
        a, b, c = quadratic_bound(name, np.array([xi]))
        q = a * t ** 2 + b * t + c
        assert np.all(q <= LOG_LIK[name](t) + 1e-12)
        touch = xi if name == "probit" else abs(xi)
        qt = a * touch ** 2 + b * touch + c
        assert qt == pytest.approx(LOG_LIK[name](np.array([touch]))[0], abs=1e-12)


@pytest.mark.parametrize("lik", ["heaviside", "noisy_threshold"])
def test_unsupported_likelihoods_raise(lik):
    K, y = _small_problem(3, 0)
    with pytest.raises(ValueError, match="quadratic lower bound"):
        infer(K, y, lik, "vb")
    with pytest.raises(ValueError, match="log-concave"):
        infer(K, y, lik, "kl")


def _fd_gradient_check(method, lik, n=15, seed=3, **opts):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    kernel = ConstantKernel(2.0) * RBF(length_scale=1.3)
    theta = kernel.theta.copy()
    K, dK = kernel(X, eval_gradient=True)
    res = infer(K, y, lik, method, tol=1e-12, **opts)
    grad = np.einsum("ij,ijk->k", res.gradient_matrix(), dK)
    h = 1e-5
    fd = np.empty_like(theta)
    for k in range(len(theta)):
        vals = []
        for sgn in (1, -1):
            th = theta.copy()
            th[k] += sgn * h
            vals.append(infer(kernel.clone_with_theta(th)(X), y, lik, method, tol=1e-12,
                              **opts).log_evidence)
        fd[k] = (vals[0] - vals[1]) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lik", ["probit", "logit"])
@pytest.mark.parametrize("method", ["kl", "vb"])
def test_gradient_matches_finite_differences(method, lik):
    _fd_gradient_check(method, lik)


def test_kl_gradient_with_prior_mean():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(10, 2))
    y = np.where(X[:, 1] > 0, 1.0, -1.0)
    kernel = ConstantKernel(1.5) * RBF(0.8)
    K, dK = kernel(X, eval_gradient=True)
    m0 = 0.3 * np.ones(10)
    res = infer(K, y, "logit", "kl", prior_mean=m0, tol=1e-12)
    g = np.einsum("ij,ijk->k", res.gradient_matrix(), dK)
    h = 1e-5
    for k in range(2):
        th = kernel.theta.copy()
        th[k] += h
        up = infer(kernel.clone_with_theta(th)(X), y, "logit", "kl", prior_mean=m0, tol=1e-12).log_evidence
        th[k] -= 2 * h
        dn = infer(kernel.clone_with_theta(th)(X), y, "logit", "kl", prior_mean=m0, tol=1e-12).log_evidence
        assert g[k] == pytest.approx((up - dn) / (2 * h), rel=1e-6, abs=1e-6)


@pytest.fixture(scope="module")
def breast_cancer():
    X, t = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    K = rbf(X, amplitude=4.0, length=np.sqrt(30.0))
    return K, 2.0 * t - 1.0


@pytest.mark.parametrize("lik", ["probit", "logit"])
def test_convergence_on_breast_cancer(breast_cancer, lik):
    K, y = breast_cancer
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        kl = infer(K, y, lik, "kl")
        vb = infer(K, y, lik, "vb")
    assert kl.converged and vb.converged
    lap = infer(K, y, lik, "laplace")
    assert vb.log_evidence <= kl.log_evidence
    assert abs(kl.log_evidence - lap.log_evidence) < 5.0   # close on an easy, near-Gaussian posterior
    assert np.mean(np.sign(kl.mean) == y) > 0.95
