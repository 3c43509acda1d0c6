"""Type-II maximum likelihood: the optimiser's steps and the final refit after it."""

import numpy as np
import pytest

import gpc.classifier
from gpc import GaussianProcessClassifier
from gpc.datasets import load_breast_cancer
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
    X, y = load_breast_cancer(return_X_y=True)
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
