"""GFITC and SVI beside SEP (python/gpc/sparse/baselines.py)."""

import numpy as np
import pytest

import gpc
from gpc import SparseGaussianProcessClassifier
from gpc.datasets import load
from gpc.exceptions import NumericalError
from gpc.kernels import RBF, ConstantKernel, WhiteKernel
from gpc.likelihoods import get_likelihood
from gpc.sparse.baselines import GFITCState, SVIState
from gpc.sparse.core.inducing import InducingFactor
from gpc.sparse.core.trainers import LBFGSTrainer
from gpc.sparse.core.variational import LBFGSState as _LBFGSState


@pytest.fixture(scope="module")
def crabs():
    X, y = load("crabs", return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    rng = np.random.default_rng(0)
    Z = X[rng.choice(len(y), 8, replace=False)] + 0.1
    return X, np.where(y == np.unique(y)[1], 1.0, -1.0), Z


KERNEL = ConstantKernel(2.0) * RBF(np.full(6, 2.0)) + WhiteKernel(0.05)


@pytest.mark.parametrize("likelihood", ["probit", "logit"])
def test_gfitc_evidence_is_exact_ep_on_the_fitc_prior(crabs, likelihood):
    X, y, Z = crabs
    state = GFITCState(KERNEL, Z, len(y), 1e-8, True, 0.7, tol=1e-12, max_passes=3000)
    lik = get_likelihood(likelihood)
    log_z, _ = state.objective(lik, X, y, state.params(), 64)
    A, s = InducingFactor(KERNEL, Z, 1e-8).whiten(X)
    exact = gpc.infer(A @ A.T + np.diag(s), y, likelihood=likelihood, method="ep", tol=1e-12,
                      max_iter=2000)
    # the same EP fixed point reached from two parametrisations, both to site changes < 1e-12
    assert abs(log_z - exact.log_evidence) < 1e-8


def _central(fun, p, idx, h):
    out = []
    for i in idx:
        e = np.zeros_like(p)
        e[i] = h
        out.append((fun(p + e) - fun(p - e)) / (2 * h))
    return np.array(out)


def test_gfitc_gradient_matches_finite_differences(crabs):
    X, y, Z = crabs
    lik = get_likelihood("probit")
    state = GFITCState(KERNEL, Z, len(y), 1e-8, True, 0.7, tol=1e-11, max_passes=3000)
    p = state.params()
    _, grad = state.objective(lik, X, y, p, 64)
    idx = list(range(len(KERNEL.theta))) + [len(KERNEL.theta) + 5, len(p) - 1]
    fd = _central(lambda q: state.objective(lik, X, y, q, 64)[0], p, idx, 1e-5)
    # EP re-converged (warm) to 1e-11 at each point: ~1e-6 over 2h; O(h²) truncation ~1e-9
    np.testing.assert_allclose(grad[idx], fd, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("likelihood", ["probit", "logit"])
def test_svi_gradient_matches_finite_differences(crabs, likelihood):
    X, y, Z = crabs
    lik = get_likelihood(likelihood)
    state = SVIState(KERNEL, Z, len(y), 1e-8, True)
    rng = np.random.default_rng(1)
    p = state.params() + 0.1 * rng.standard_normal(len(state.params()))
    _, grad = state.objective(lik, X, y, p, 64)
    # every θ, a spread of Z entries, μ and L_q entries
    idx = list(range(len(KERNEL.theta))) + list(rng.choice(np.arange(8, len(p)), 20, replace=False))
    fd = _central(lambda q: state.objective(lik, X, y, q, 64)[0], p, idx, 1e-6)
    # the bound is a smooth deterministic function (fixed Gauss–Hermite rule): central
    # differences at h = 1e-6 carry ~1e-10 · |F| / h ≈ 1e-6 rounding on gradients of size 1-100
    np.testing.assert_allclose(grad[idx], fd, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("method, batch_size", [("gfitc", None), ("svi", None), ("svi", 50)])
def test_estimator_runs_the_baselines(method, batch_size):
    X, y = load("australian", return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    clf = SparseGaussianProcessClassifier(method=method, n_inducing=10, max_iter=10,
                                          batch_size=batch_size, random_state=0)
    clf.fit(X[:300], y[:300])
    # majority class 0.56; SEP Table 1 puts these methods near 0.85 accuracy
    assert clf.score(X[300:], y[300:]) > 0.75
    assert np.isfinite(clf.log_marginal_likelihood_value_)


def test_gfitc_refuses_minibatches():
    X, y = load("crabs", return_X_y=True)
    with pytest.raises(ValueError, match="batch"):
        SparseGaussianProcessClassifier(method="gfitc", batch_size=10).fit(X, y)


def test_gfitc_rows_far_from_every_inducing_point_add_log_half(crabs):
    # A row whose k(x_i, Z) underflows to 0 (far, against the length-scales, from every inducing
    # point: L-BFGS-B's long steps visited such points on australian and breast, SEP Table 1) has
    # a_i = 0 and marginal variance 0.  Its cavity is the point mass at 0, not 0/0: under FITC its
    # f_i ~ N(0, s_i) is independent of u, so it adds log ∫Φ(y f) N(f | 0, s_i) df = log ½ to the
    # evidence and nothing to q or to the gradient (s_i = c + σ₀² moves with c, but ∂ log Z_i/∂s_i
    # is 0 at a zero mean).  The engine used to call such a point improper: a crash ("cav_mean
    # contains NaN"), then a rejected point (-inf) that L-BFGS-B had to back off from.
    X, y, Z = crabs
    lik = get_likelihood("probit")
    far = X[:20] + 50.0          # k = c exp(-6 · 50² / (2 · 2²)) = c e^-1875: 0 in double precision
    X_all, y_all = np.vstack([X, far]), np.concatenate([y, y[:20]])
    A_far, _ = InducingFactor(KERNEL, Z, 1e-8).whiten(far)
    assert not np.any(A_far)
    near = GFITCState(KERNEL, Z, len(y), 1e-8, True, 0.7, tol=1e-11, max_passes=3000)
    both = GFITCState(KERNEL, Z, len(y_all), 1e-8, True, 0.7, tol=1e-11, max_passes=3000)
    value_near, grad_near = near.objective(lik, X, y, near.params(), 64)
    value, grad = both.objective(lik, X_all, y_all, both.params(), 64)
    assert both.reverted == 0 and both.failure is None
    # both EPs converged to site changes < 1e-11 from the same start; the near rows' fixed point
    # is the same (the far rows' sites add τ a_i a_iᵀ = 0 to q), so they agree to ~1e-9
    np.testing.assert_allclose(value, value_near + 20 * np.log(0.5), rtol=0, atol=1e-8)
    np.testing.assert_allclose(grad, grad_near, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(both.tau[:len(y)] != 0, True)
    assert np.all(np.isfinite(both.tau)) and np.all(np.isfinite(both.nu))


class _Quadratic(_LBFGSState):
    """-(p - 3)² that cannot be evaluated beyond p = 2: the optimum of the feasible part is p = 2."""

    name = "quadratic"
    _model = ("p", "log_z")

    def __init__(self, nan_gradient=False):
        self.p = np.zeros(1)
        self.log_z = np.nan
        self.calls = []
        self.nan_gradient = nan_gradient

    def params(self):
        return self.p.copy()

    def bounds(self):
        return [(None, None)]

    def objective(self, likelihood, X, y, p, block_rows):
        self.calls.append(float(p[0]))
        if p[0] > 2.0 and self.nan_gradient:    # a finite value, a NaN gradient, the state moved
            self.p, self.log_z = p.copy(), -float((p[0] - 3.0) ** 2)
            return self.log_z, np.full_like(p, np.nan)
        if p[0] > 2.0:
            return -np.inf, np.zeros_like(p)
        self.p, self.log_z = p.copy(), -float((p[0] - 3.0) ** 2)
        return self.log_z, -2.0 * (p - 3.0)


class _NoRows:
    """The rows of an objective that needs none."""

    def objective_rows(self, k, likelihood):
        return None, None


def _lbfgs(state, evaluations, recorded):
    ticks = []
    LBFGSTrainer([state], None, None).train(_NoRows(), evaluations, lambda: ticks.append(1),
                                            recorded.append)
    return len(ticks)


@pytest.mark.parametrize("nan_gradient", [False, True])
def test_lbfgs_backtracks_from_a_point_it_cannot_evaluate(nan_gradient):
    state = _Quadratic(nan_gradient)
    recorded = []
    _lbfgs(state, 40, recorded)
    # an infinite value ended L-BFGS-B at its first infeasible trial (after 2 evaluations);
    # the finite penalty makes its line search come back, and it closes in on the edge p = 2
    assert any(c > 2.0 for c in state.calls) and len(recorded) > 4
    assert state.log_z > -1.0 - 1e-3                       # -(2 - 3)² = -1 at the edge
    assert max(recorded) == state.log_z
    # no point beyond the edge was taken (its value, -(p - 3)² > -1, would be the best recorded),
    # and the state ends inside, not where it was last moved
    assert state.p[0] <= 2.0


def test_lbfgs_refuses_a_start_it_cannot_evaluate():
    state = _Quadratic()
    state.p = np.array([2.5])
    with pytest.raises(gpc.exceptions.NumericalError, match="initial"):
        _lbfgs(state, 10, [])


# -- cases that tests/test_fuzz.py found --------------------------------------------------------

def _fit_in_policy(model, X, y):
    """Fit with every warning recorded: no warning but ConvergenceWarning, and either a usable
    model (finite probabilities in [0, 1] summing to 1; returns None) or a NumericalError
    (returned)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.fit(X, y)
        except NumericalError as exc:
            error, proba = exc, None
        else:
            error, proba = None, model.predict_proba(X)
    stray = [f"{w.category.__name__}: {w.message}" for w in caught
             if not issubclass(w.category, gpc.exceptions.ConvergenceWarning)]
    assert not stray
    if proba is not None:
        assert np.all(np.isfinite(proba)) and np.all((proba >= 0.0) & (proba <= 1.0))
        np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)   # two terms: rounding
    return error


@pytest.mark.parametrize("optimize_inducing", [False, True])
def test_gfitc_sites_that_diverge_are_a_numerical_error(optimize_inducing):
    X, y = np.zeros((10, 1)), np.arange(10) % 2
    model = SparseGaussianProcessClassifier(method="gfitc", likelihood="noisy_threshold",
                                            n_inducing=1, jitter=0.0, max_iter=3, progress=False,
                                            optimize_inducing=optimize_inducing, random_state=0)
    # the noisy threshold on one value with both labels and FITC variance 0: against a cavity
    # N(0, v) the matched site precision is c/v with c > 1, so EP has no fixed point and its
    # site precisions grow geometrically (to ~1e161, where the gradient overflowed to NaN and
    # L-BFGS-B stepped to θ = NaN: "theta must be finite", a ValueError on valid input)
    error = _fit_in_policy(model, X, y)
    assert isinstance(error, NumericalError) and "initial" in str(error)
    assert isinstance(error.__cause__, gpc.exceptions.DivergenceError)
    assert "sites diverge" in str(error.__cause__) and error.__cause__.value > 2.0 ** 52


@pytest.mark.parametrize("jitter", [0.0, 1e-8])
def test_svi_step_onto_a_singular_lq_is_a_failed_evaluation(jitter):
    # balanced labels on equal rows: the bound's gradient points along L_q's diagonal only, and
    # L-BFGS-B's first (unit) step lands on L_q = 0 exactly, where the bound is -inf (log|S|)
    X, y = np.zeros((4, 1)), np.array([0, 1, 1, 0])
    model = SparseGaussianProcessClassifier(kernel=ConstantKernel(1.0, "fixed") * RBF(1.0, "fixed"),
                                            method="svi", n_inducing=1, jitter=jitter,
                                            batch_size=None, max_iter=2, optimize_inducing=False,
                                            progress=False, random_state=0)
    assert _fit_in_policy(model, X, y) is None
    state = model._trainer.states[0]
    assert state.reverted == 1 and "singular" in str(state.failure)
    assert np.all(np.diag(state.Lq) != 0.0) and np.isfinite(state.log_z)


def test_svi_objective_at_a_singular_lq_leaves_the_state():
    import warnings

    X, y = np.zeros((4, 1)), np.array([-1.0, 1.0, 1.0, -1.0])
    kernel = ConstantKernel(1.0, "fixed") * RBF(1.0, "fixed")
    state = SVIState(kernel, np.zeros((1, 1)), 4, 0.0, False)
    lik = get_likelihood("probit")
    value, grad = state.objective(lik, X, y, state.params(), 4)
    p = state.params()
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # no "divide by zero" on the way
        for lq in (0.0, 1e-320):              # L_q = 0, and 1/L_q overflowing
            bad, g = state.objective(lik, X, y, np.array([0.0, lq]), 4)
            assert bad == -np.inf and np.all(g == 0.0)
    assert np.array_equal(state.params(), p) and state.log_z == value and state.reverted == 2
