"""Type-II maximum likelihood: the optimiser's steps and the final refit after it."""

import numpy as np
import pytest

import gpc.classifier
from gpc import GaussianProcessClassifier
from gpc.datasets import load_breast_cancer_wisconsin_original
from gpc.kernels import ConstantKernel, RBF
from gpc.optimize import lbfgsb


def test_first_step_is_one_unit_of_log_theta_and_the_optimum_is_still_found():
    # A steep concave objective: gradient norm ~100 at the start.  Plain L-BFGS-B steps the whole
    # gradient first (|Δθ| = 100, to the bounds); with the scaling its first trial moves θ by 1
    # (± the projection on the bounds), and it still ends at the optimum (to L-BFGS-B's pgtol).
    target = np.array([3.0, -2.0])
    seen = []

    def f(theta):
        seen.append(np.array(theta))
        d = theta - target
        return 10.0 * d @ d + 0.5 * d[0] ** 4, 20.0 * d + np.array([2.0 * d[0] ** 3, 0.0])

    theta0 = np.array([-2.0, 2.0])
    bounds = np.array([[-20.0, 20.0], [-20.0, 20.0]])
    theta, value = lbfgsb(f, theta0, bounds)
    first_step = np.linalg.norm(seen[1] - theta0)
    assert 0.5 < first_step <= 1.0 + 1e-9
    np.testing.assert_allclose(theta, target, atol=1e-4)
    assert value < 1e-7


def test_bounds_are_respected_after_scaling():
    # optimum outside the box: the answer is the box corner, in the original θ units
    f = lambda t: (float(np.sum((t - 5.0) ** 2)), 2.0 * (t - 5.0))
    theta, _ = lbfgsb(f, np.zeros(2), np.array([[-1.0, 1.0], [-2.0, 2.0]]))
    np.testing.assert_allclose(theta, [1.0, 2.0], atol=1e-8)


def test_the_final_posterior_continues_from_the_optimisers_last_sites(monkeypatch):
    # Every evaluation during the fit starts from the previous one's sites (as GPML's infEP); the
    # final posterior at the optimum must too (a cold restart can end elsewhere: undamped parallel
    # EP diverged from zero sites on breast cancer where the warm-started evaluations converged).
    X, y = load_breast_cancer_wisconsin_original(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    calls = []
    real = gpc.classifier.infer

    def recording(K, y, **kw):
        calls.append(kw.get("init"))
        return real(K, y, **kw)

    monkeypatch.setattr(gpc.classifier, "infer", recording)
    clf = GaussianProcessClassifier(kernel=ConstantKernel(1.0) * RBF(3.0), method="ep",
                                    schedule="parallel").fit(X[:150], y[:150])
    assert len(calls) > 3 and calls[0] is None         # the first fit of the start is cold
    assert calls[-1] is not None and calls[-1].method == "ep"
    assert calls[-1] is not clf.base_estimators_[0].result_


def test_a_failed_line_search_says_what_happened_and_what_to_try():
    # a gradient that points the wrong way: L-BFGS-B's line search cannot lower the objective,
    # and scipy's message is "ABNORMAL: " with the reason left empty
    from gpc.exceptions import ConvergenceWarning

    def wrong(theta):
        return float(theta @ theta), -2.0 * theta + 1.0

    with pytest.warns(ConvergenceWarning) as caught:
        lbfgsb(wrong, np.array([1.0, -2.0]), np.array([[-5.0, 5.0], [-5.0, 5.0]]))
    message = str(caught[0].message)
    assert "line search" in message and "gradient" in message
    assert "Try:" in message and "max_iter" in message
    assert not message.rstrip().endswith(":")


def test_the_sparse_lbfgs_fit_says_so_too():
    # the same failure in the sparse L-BFGS-B fits (GFITC, batch SVI)
    from gpc.exceptions import ConvergenceWarning
    from gpc.sparse.core.trainers import LBFGSTrainer
    from gpc.sparse.core.variational import LBFGSState as _LBFGSState

    class Wrong(_LBFGSState):
        name = "test"
        _model = ("p", "log_z")

        def __init__(self):
            self.p, self.log_z = np.array([1.0, -2.0]), np.nan

        def params(self):
            return self.p.copy()

        def bounds(self):
            return [(-5.0, 5.0)] * 2

        def objective(self, likelihood, X, y, p, block_rows):
            self.p, self.log_z = p.copy(), -float(p @ p)
            return self.log_z, 2.0 * p - 1.0          # the gradient of -|p|² is -2p

    class NoRows:
        def objective_rows(self, k, likelihood):
            return None, None

    with pytest.warns(ConvergenceWarning, match="line search.*Try:"):
        LBFGSTrainer([Wrong()], None, None).train(NoRows(), 50, lambda: None, lambda v: None)
