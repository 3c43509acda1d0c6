"""Sparse posterior linearisation (method="pl" of gpc.sparse): the SLR site on a_iᵀw, its
evidence (PL eq. (18) for the sparse model) and the gradient of the linearised model's evidence
(docs/derivations-ep-pl.md, "Sparse PL")."""

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from scipy import stats

import gpc
from gpc import SparseGaussianProcessClassifier
from gpc.datasets import load, load_banana
from gpc.distributed import InProcessEngine
from gpc.kernels import RBF, ConstantKernel
from gpc.likelihoods import get_likelihood
from gpc.sparse._passes import evidence, linearisation_of, linearised_evidence
from gpc.sparse._train import SEPState, batch_step, minibatch_step, run_ep
from gpc.sparse.core.inducing import InducingFactor
from gpc.inference.rules import Rule
from gpc.sparse.ep import linearised_sites
from test_sparse_ep import assert_central_differences, off_data_problem

PL = Rule("pl")


def _standardised(name):
    X, y = load(name, return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    return X, np.where(y == np.unique(y)[1], 1.0, -1.0)


def _pl(lik, X, y, factor, init=None, tol=1e-11):
    n = len(y)
    tau, nu = (np.zeros(n), np.zeros(n)) if init is None else init
    tau, nu, q, _, converged, n_fixed = run_ep(lik, X, y, factor, tau, nu, damping=0.5,
                                               max_iter=2000, tol=tol, block_rows=64, rule=PL)
    assert converged and n_fixed == 0           # PL's sites are never negative
    return tau, nu, q


@pytest.mark.parametrize("likelihood", ["probit", "logit"])
def test_inducing_at_data_equals_exact_pl(likelihood):
    # With Z = X (no jitter) K_uu = K and s_i = k_ii - |a_i|² is rounding: sparse PL is the exact
    # PL, whose fixed point does not depend on the schedule (parallel or sequential).  The
    # evidence: the sparse one is PL eq. (18) with its correction integrals exact (the EP form
    # of log Z_q at the PL sites), the exact engine's by Gauss-Hermite of order 32 (its default;
    # the integrands are smooth, and order 100 moves it by < 1e-12 here).
    X, y = _standardised("crabs")
    kernel = ConstantKernel(2.0) * RBF(2.0)
    lik = get_likelihood(likelihood)
    factor = InducingFactor(kernel, X, jitter=0.0)
    A, s = factor.whiten(X)
    assert np.max(np.abs(s)) < 1e-10
    tau, nu, q = _pl(lik, X, y, factor)
    log_z, _, _, n_bad = evidence(lik, X, y, factor, q, tau, nu, block_rows=64, gradient=False,
                                  rule=PL)
    assert n_bad == 0
    mean, var = q.marginals(A)
    for schedule in ("parallel", "sequential"):
        exact = gpc.infer(kernel(X), y, likelihood=lik, method="pl", schedule=schedule,
                          tol=1e-11, max_iter=2000)
        assert exact.converged
        # both stop at changes below 1e-11; K's condition number (~1e10 for crabs) magnifies the
        # rounding of the triangular solves to ~1e-10 at most (measured 6e-12)
        np.testing.assert_allclose(mean, exact.mean, rtol=0, atol=1e-6)
        np.testing.assert_allclose(var + s, np.diag(exact.cov), rtol=0, atol=1e-6)
        assert abs(log_z - exact.log_evidence) < 1e-6


@pytest.mark.parametrize("likelihood", ["probit", "logit", "noisy_threshold"])
def test_compiled_pl_rule_is_the_slr_on_g(likelihood):
    # gpc._sparse.refine_rows with rule "pl" and s > 0 against NumPy: the exact engine's SLR
    # (gpc.inference.pl.slr) of f ~ N(μ, σ² + s) gives (A, b, Ω_f), and the site on g is
    # τ = A²/(Ω_f + A² s), ν = A (y - b)/(Ω_f + A² s) (docs/derivations-ep-pl.md), damped with
    # the old sites (PL reads nothing else of them).  O(1) values: 1e-10 is rounding.
    from gpc.inference.pl import slr
    from gpc.sparse.ep import refine_rows
    rng = np.random.default_rng(7)
    b = 12
    lik = get_likelihood(likelihood)
    y = np.where(rng.random(b) < 0.5, -1.0, 1.0)
    mean, var, s = rng.normal(size=b), rng.uniform(0.1, 2.0, b), rng.uniform(0.0, 1.0, b)
    tau, nu = rng.uniform(0.0, 0.5, b), rng.normal(size=b)
    t_new, n_new, failed, fixed = refine_rows(lik, y, mean, var, s, tau, nu, 0.6, PL)
    assert failed == 0 and fixed == 0
    slope, intercept, omega_f = slr(lik, mean, var + s)
    omega = omega_f + slope ** 2 * s
    np.testing.assert_allclose(t_new, 0.6 * slope ** 2 / omega + 0.4 * tau, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(n_new, 0.6 * slope * (y - intercept) / omega + 0.4 * nu, rtol=1e-10,
                               atol=1e-12)
    t_lin, n_lin, _ = linearised_sites(y, s, slope, intercept, omega_f)
    np.testing.assert_allclose(t_new, 0.6 * t_lin + 0.4 * tau, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(n_new, 0.6 * n_lin + 0.4 * nu, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("likelihood, white, held", [
    ("probit", True, "sites"), ("logit", False, "sites"), ("probit", False, "cavity"),
    ("logit", True, "cavity")])
def test_gradient_is_that_of_the_linearised_evidence(likelihood, white, held):
    # What sparse PL's gradient differentiates (its analogue of PL's claim for the exact engine):
    # log p̂(D) = log N(y; b, Ã (Q + diag s) Ã + Ω) with the linearisation (A, b, Ω) held at its
    # value at the PL fixed point, as a function of θ and Z through Q and the FITC variances s.
    # ``linearised_evidence`` is the sparse code's own evaluation of it (through q); checked
    # first against a dense multivariate normal, then differenced.  Both forms of the gradient
    # (sites following their rows; cavities held, as minibatches use) must give it at the fixed
    # point.  m = 12 inducing points off the data, so s_i > 0 matters.
    X, y, Z, kernel, lik = off_data_problem(likelihood, white)
    factor = InducingFactor(kernel, Z, jitter=1e-8)
    tau, nu, q = _pl(lik, X, y, factor)
    _, g_theta, g_Z, n_bad = evidence(lik, X, y, factor, q, tau, nu, block_rows=64, held=held,
                                      rule=PL)
    assert n_bad == 0
    lin = linearisation_of(lik, X, y, factor, q, block_rows=64)
    # at the fixed point the sites are those of the linearisation (PL's rule is the SLR)
    t_lin, n_lin, _ = linearised_sites(y, factor.whiten(X)[1], *lin)
    np.testing.assert_allclose(tau, t_lin, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(nu, n_lin, rtol=1e-8, atol=1e-10)

    def value(theta, Zp):
        return linearised_evidence(X, y, InducingFactor(kernel.clone_with_theta(theta), Zp, 1e-8),
                                   *lin, block_rows=64)

    slope, intercept, omega = lin
    A, s = factor.whiten(X)
    cov = slope[:, None] * (A @ A.T + np.diag(s)) * slope[None, :] + np.diag(omega)
    dense = stats.multivariate_normal(intercept, cov, allow_singular=False).logpdf(y)
    # an O(100) log density of a 200-dimensional Gaussian: 1e-8 relative is rounding
    assert value(kernel.theta, Z) == pytest.approx(dense, rel=1e-8)
    # central differences (h = 1e-5) of a smooth function with nothing re-converged: O(h²)
    # truncation (~1e-9) and rounding of O(100) values over 2h (~1e-9); the gradients are
    # O(1)-O(10), and PL stopped at site changes below 1e-11
    assert_central_differences(value, kernel.theta, Z, g_theta, g_Z, 1e-6)


def test_evidence_is_eq18_for_the_sparse_model():
    # log Z_q at the PL sites (what sparse PL reports) = log p̂(D) + Σ_i log ∫ φ_i(g)
    # N(g; μ_i, σ_i²) / N(y_i; A_i g + b_i, Ω'_i) dg, PL eq. (18) with φ_i(g) = Φ(y_i g/√(1 + s_i))
    # (probit) and the label seen from g = a_iᵀw, Ω' = Ω + A² s_i.  The correction integrals here
    # by Gauss-Hermite of order 100 in g (an independent evaluation; its integrands are smooth
    # and grow like exp(½ τσ² x²) with τσ² < 1): 1e-8 is quadrature and rounding over 200 rows.
    X, y, Z, kernel, lik = off_data_problem("probit", white=False)
    factor = InducingFactor(kernel, Z, jitter=1e-8)
    tau, nu, q = _pl(lik, X, y, factor)
    log_z = evidence(lik, X, y, factor, q, tau, nu, block_rows=64, gradient=False, rule=PL)[0]
    lin = linearisation_of(lik, X, y, factor, q, block_rows=64)
    log_p_hat = linearised_evidence(X, y, factor, *lin, block_rows=64)
    A, s = factor.whiten(X)
    mean, var = q.marginals(A)
    slope, intercept, omega = lin
    omega_g = omega + slope ** 2 * s
    assert np.max(tau * var) < 1.0
    x, w = hermegauss(100)
    g = mean[:, None] + np.sqrt(var)[:, None] * x[None, :]
    log_phi = stats.norm.logcdf(y[:, None] * g / np.sqrt(1.0 + s[:, None]))
    log_lin = stats.norm.logpdf(y[:, None], slope[:, None] * g + intercept[:, None],
                                np.sqrt(omega_g)[:, None])
    terms = np.log(w / w.sum())[None, :] + log_phi - log_lin
    correction = np.sum(np.logaddexp.reduce(terms, axis=1))
    assert abs(log_z - (log_p_hat + correction)) < 1e-8
    assert abs(correction) > 1e-3                      # the identity is not 0 = 0


def test_minibatch_of_all_rows_takes_the_batch_steps():
    # SEPState(method="pl"): the same operations in the same order as a batch step (see the EP
    # version in test_sparse_estimator); relative 1e-10 leaves room for the sums' rounding
    X, y = _standardised("australian")
    n = len(y)
    lik = get_likelihood("logit")
    kernel = ConstantKernel(1.0) * RBF(np.full(X.shape[1], 3.0))
    Z = X[:15].copy()
    a = SEPState(kernel, Z, n, 1e-8, True, 1.0, method="pl")
    b = SEPState(kernel, Z, n, 1e-8, True, 1.0, method="pl")
    for _ in range(5):
        va = batch_step(a, lik, X, y, 0.5, block_rows=n)
        vb = minibatch_step(b, lik, X, y, slice(0, n), n, 0.5)
        assert va == pytest.approx(vb, rel=1e-10)
    np.testing.assert_allclose(a.kernel.theta, b.kernel.theta, rtol=1e-10)
    np.testing.assert_allclose(a.tau, b.tau, rtol=1e-9, atol=1e-12)
    assert np.all(a.tau >= 0)
    assert not np.array_equal(a.kernel.theta, kernel.theta)


@pytest.mark.parametrize("batch_size", [None, 100])
def test_estimator_learns_and_shards_give_the_same_fit(batch_size):
    # method="pl" trains as "ep" does (batch passes or minibatches with inner Adadelta steps): the
    # evidence rises, it predicts well, and on an in-process engine the same fit is reproduced
    # (the site rule travels with the shard tasks): batch on 2 shards, to the order of the
    # shards' sums (rounding, amplified by 8 Adadelta steps); minibatches on 1 shard, which cuts
    # the same blocks as in process
    X, y = load_banana(return_X_y=True)
    X, y = X[:400], y[:400]
    common = dict(n_inducing=16, method="pl", max_iter=8, random_state=0, progress=False,
                  batch_size=batch_size)
    clf = SparseGaussianProcessClassifier(**common).fit(X, y)
    objective = [h["objective"] for h in clf.history_]
    assert objective[-1] > objective[0]
    assert clf.score(X, y) > 0.8
    state = clf._problems[0][0].state
    assert state.rule == Rule("pl") and np.all(state.tau >= 0) and state.n_fixed == 0
    shards = 2 if batch_size is None else 1
    sharded = SparseGaussianProcessClassifier(client=InProcessEngine(shards), **common).fit(X, y)
    assert sharded.log_marginal_likelihood_value_ == pytest.approx(
        clf.log_marginal_likelihood_value_, rel=1e-8)
    np.testing.assert_allclose(sharded.predict_proba(X), clf.predict_proba(X), rtol=1e-6,
                               atol=1e-8)


def test_pl_takes_no_tied_sites():
    with pytest.raises(ValueError, match="tied_sites"):
        SparseGaussianProcessClassifier(method="pl", tied_sites=True).fit(np.eye(4),
                                                                          [0, 1, 0, 1])
