"""gpc as a drop-in for scikit-learn's GaussianProcessClassifier.

Each test is code written for ``sklearn.gaussian_process.GaussianProcessClassifier``; it runs with
scikit-learn's class and with gpc's (``GPC`` below is the only thing that changes, as the import
would) and asserts the same behaviour of both.  Where numbers are compared, gpc is also given
scikit-learn's model (Laplace, logit) through its own extra keywords.
"""

import inspect
import warnings
from functools import partial

import numpy as np
import pytest
import scipy.optimize
from sklearn.base import clone
from sklearn.datasets import load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessClassifier as SkGPC
from sklearn.gaussian_process.kernels import (RBF, CompoundKernel, ConstantKernel, GenericKernelMixin,
                                              Hyperparameter, Kernel, Matern)

import gpc.classifier
from gpc import GaussianProcessClassifier

# scikit-learn's model in gpc: Laplace's approximation with the logistic likelihood
GpcLaplace = partial(GaussianProcessClassifier, method="laplace", likelihood="logit")
BOTH = pytest.mark.parametrize("GPC", [SkGPC, GaussianProcessClassifier], ids=["sklearn", "gpc"])


def two_moons(n=80, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] + 0.6 * np.sin(2 * X[:, 1]) + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X, y


def test_constructor_has_every_sklearn_parameter_with_its_default():
    theirs = inspect.signature(SkGPC.__init__).parameters
    ours = inspect.signature(GaussianProcessClassifier.__init__).parameters
    for name, p in theirs.items():
        if name == "self":
            continue
        assert name in ours, name
        assert ours[name].default == p.default, name


@BOTH
def test_fitted_attributes_and_return_types(GPC):
    X, y = two_moons()
    clf = GPC(kernel=1.0 * RBF(1.0)).fit(X, y)
    assert isinstance(clf.kernel_, Kernel) and type(clf.kernel_).__module__.startswith("sklearn")
    assert list(clf.classes_) == [0, 1] and clf.n_classes_ == 2
    assert isinstance(clf.log_marginal_likelihood_value_, np.float64)
    value = clf.log_marginal_likelihood(clf.kernel_.theta)
    assert isinstance(value, np.float64)
    value, grad = clf.log_marginal_likelihood(clf.kernel_.theta, eval_gradient=True)
    assert isinstance(value, np.float64) and grad.dtype == np.float64 and grad.shape == (2,)
    # the fitted kernel is a refitted copy: the user's object keeps its θ; repr, get_params and
    # clone behave as scikit-learn's
    assert clf.kernel.theta.tolist() == [0.0, 0.0] and clf.kernel_.theta.tolist() != [0.0, 0.0]
    assert "RBF(length_scale=" in repr(clf.kernel_)
    assert clone(clf.kernel_).get_params()["k2__length_scale"] == clf.kernel_.get_params()["k2__length_scale"]
    assert hasattr(clf.base_estimator_, "X_train_") and hasattr(clf.base_estimator_, "kernel_")
    with pytest.raises(ValueError, match="Gradient can only be evaluated for theta!=None"):
        clf.log_marginal_likelihood(None, eval_gradient=True)


@BOTH
def test_callable_optimizer_protocol(GPC):
    X, y = two_moons()
    calls = []

    def optimizer(obj_func, initial_theta, bounds):
        calls.append((initial_theta.copy(), np.asarray(bounds).copy()))
        # the objective is the negative evidence with its gradient, or alone without it
        value, grad = obj_func(initial_theta)
        assert obj_func(initial_theta, eval_gradient=False) == pytest.approx(value, rel=1e-9)
        h = 1e-5   # central differences: error O(h²) relative to the gradient's scale
        fd = [(obj_func(initial_theta + e, eval_gradient=False)
               - obj_func(initial_theta - e, eval_gradient=False)) / (2 * h) for e in h * np.eye(2)]
        np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6)
        res = scipy.optimize.minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds)
        return res.x, res.fun

    kernel = ConstantKernel(1.0, (1e-3, 1e3)) * RBF(1.0, (1e-2, 1e2))
    clf = GPC(kernel=kernel, optimizer=optimizer).fit(X, y)
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0][0], kernel.theta)
    np.testing.assert_array_equal(calls[0][1], kernel.bounds)
    # the optimum found by the callable is the one kept (L-BFGS-B's tolerance: 1e-4 in log θ)
    assert clf.log_marginal_likelihood_value_ >= clf.log_marginal_likelihood(kernel.theta)


@BOTH
def test_structured_inputs_with_a_non_vector_kernel(GPC):
    # strings compared by their letter counts: a kernel with requires_vector_input = False
    class LetterKernel(GenericKernelMixin, Kernel):
        def __init__(self, length_scale=1.0, length_scale_bounds=(1e-2, 1e2)):
            self.length_scale = length_scale
            self.length_scale_bounds = length_scale_bounds

        @property
        def hyperparameter_length_scale(self):
            return Hyperparameter("length_scale", "numeric", self.length_scale_bounds)

        @staticmethod
        def _counts(X):
            return np.array([[s.count(c) for c in "ab"] for s in X], dtype=float)

        def __call__(self, X, Y=None, eval_gradient=False):
            A = self._counts(X)
            B = A if Y is None else self._counts(Y)
            D = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1) / self.length_scale ** 2
            K = np.exp(-0.5 * D)
            if eval_gradient:
                return K, (K * D)[:, :, None]
            return K

        def diag(self, X):
            return np.ones(len(X))

        def is_stationary(self):
            return True

    assert not LetterKernel().requires_vector_input
    rng = np.random.default_rng(1)
    words = ["".join(rng.choice(list("ab"), size=rng.integers(2, 8))) for _ in range(60)]
    y = np.array([w.count("a") > w.count("b") for w in words], dtype=int)
    clf = GPC(kernel=LetterKernel(1.0)).fit(words[:40], y[:40])
    # the label is a function of the counts, so a smooth kernel of them learns it: at most 3 of the
    # 20 held-out words wrong (those with nearly equal counts)
    assert np.sum(clf.predict(words[40:]) != y[40:]) <= 3
    proba = clf.predict_proba(words[40:])
    assert proba.shape == (20, 2) and np.allclose(proba.sum(axis=1), 1.0)
    mean, var = clf.latent_mean_and_variance(words[40:])
    assert mean.shape == var.shape == (20,) and np.all(var > 0)


@BOTH
def test_latent_mean_and_variance(GPC):
    X, y = two_moons()
    clf = GPC(kernel=1.0 * RBF(1.0)).fit(X, y)
    mean, var = clf.latent_mean_and_variance(X[:10])
    assert mean.shape == var.shape == (10,)
    # the latent mean has the sign of the predicted class where the model is confident
    proba = clf.predict_proba(X[:10])[:, 1]
    sure = np.abs(proba - 0.5) > 0.1
    assert np.all((mean[sure] > 0) == (proba[sure] > 0.5))
    iris = load_iris()
    three = GPC(kernel=1.0 * RBF(1.0), optimizer=None).fit(iris.data[::3], iris.target[::3])
    with pytest.raises(ValueError, match="only supported for binary classification, received 3 classes"):
        three.latent_mean_and_variance(iris.data[:2])


def test_latent_mean_and_variance_equal_sklearn_for_the_same_model():
    # Laplace + logit is scikit-learn's model: both find the same mode (Newton to tolerance
    # 1e-10 on the evidence here vs scikit-learn's 1e-10): latent moments agree to 1e-5 relative
    X, y = two_moons()
    kernel = ConstantKernel(2.0) * RBF(0.8)
    ours = GpcLaplace(kernel=kernel, optimizer=None, tol=1e-10).fit(X, y)
    theirs = SkGPC(kernel=kernel, optimizer=None).fit(X, y)
    for a, b in zip(ours.latent_mean_and_variance(X[:15]), theirs.latent_mean_and_variance(X[:15])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ours.log_marginal_likelihood_value_, theirs.log_marginal_likelihood_value_,
                               rtol=1e-8)


@BOTH
def test_hyperparameter_at_its_bound_warns(GPC):
    X, y = two_moons()
    # the evidence wants a length scale near 1; the upper bound 0.05 stops it there
    kernel = ConstantKernel(1.0, "fixed") * RBF(0.02, (1e-3, 0.05))
    with pytest.warns(ConvergenceWarning, match="close to the specified upper bound"):
        GPC(kernel=kernel).fit(X, y)


THREE = pytest.mark.parametrize("GPC", [SkGPC, GaussianProcessClassifier, GpcLaplace],
                                ids=["sklearn", "gpc", "gpc-laplace"])


class SharedLetters(GenericKernelMixin, Kernel):
    """k(s, t) = c · (pairs of equal letters) / (|s| |t|) on strings, c fixed: no θ."""

    def __init__(self, c=1.0, c_bounds="fixed"):
        self.c = c
        self.c_bounds = c_bounds

    @property
    def hyperparameter_c(self):
        return Hyperparameter("c", "numeric", self.c_bounds)

    def _k(self, s, t):
        return self.c * sum(a == b for a in s for b in t) / (len(s) * len(t))

    def __call__(self, X, Y=None, eval_gradient=False):
        K = np.array([[self._k(s, t) for t in (X if Y is None else Y)] for s in X])
        return (K, np.empty(K.shape + (0,))) if eval_gradient else K

    def diag(self, X):
        return np.array([self._k(s, s) for s in X])

    def is_stationary(self):
        return False


@THREE
def test_a_tie_goes_to_the_first_class_in_predict_and_predict_proba(GPC):
    # "TTT" shares no letter with the training strings: its latent mean is exactly 0, a tie.
    # scikit-learn predicts classes_[1] for a latent mean above 0 only, and its probability
    # there is a little below 1/2: predict and predict_proba[:, 1] >= 0.5 both give classes_[0]
    X, y = ["AAA", "CCC", "GGG"], [True, False, True]
    T = ["AAA", "TTT", "CCC"]
    clf = GPC(kernel=SharedLetters()).fit(X, y)
    p = clf.predict_proba(T)
    assert clf.predict(T).tolist() == [True, False, False]
    assert clf.predict(T).tolist() == clf.classes_[(p[:, 1] >= 0.5).astype(int)].tolist()
    assert clf.predict(T).tolist() == clf.classes_[np.argmax(p, axis=1)].tolist()
    # the tie's probabilities are 1/2 to within 1e-8 (scikit-learn's erf expansion: 5e-9)
    np.testing.assert_allclose(p[1], 0.5, rtol=0, atol=1e-8)


@THREE
@pytest.mark.parametrize("strings", [False, True])
def test_compound_kernel_is_refused(GPC, strings):
    # refused before X is looked at, whatever the method and inputs (on strings an RBF compound
    # kernel would otherwise fail on X first)
    X, y = (["AAA", "CCC", "GGG"], [True, False, True]) if strings else two_moons()
    with pytest.raises(ValueError, match="kernel cannot be a CompoundKernel"):
        GPC(kernel=CompoundKernel([RBF(1.0), RBF(2.0)])).fit(X, y)


@pytest.mark.parametrize("GPC", [GaussianProcessClassifier], ids=["gpc"])   # scikit-learn's
def test_n_jobs_threads_give_the_same_fit(GPC):                           # processes take 10 s to start
    iris = load_iris()
    X, y = iris.data[::5], iris.target[::5]
    kernel = ConstantKernel(1.0, (1e-2, 1e2)) * RBF(1.0, (1e-2, 1e2))
    serial = GPC(kernel=kernel, n_jobs=1).fit(X, y)
    threads = GPC(kernel=kernel, n_jobs=2).fit(X, y)
    assert len(threads.base_estimator_.estimators_) == 3
    assert isinstance(threads.kernel_, CompoundKernel)
    # each binary problem is the same computation in either thread: equal to rounding (1e-9
    # relative leaves room for a multithreaded BLAS summing in another order)
    np.testing.assert_allclose(threads.predict_proba(X), serial.predict_proba(X), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(threads.kernel_.theta, serial.kernel_.theta, rtol=1e-7)
    # one θ for all problems, or the CompoundKernel's θ (one per problem); wrong sizes are named
    one = threads.log_marginal_likelihood(threads.base_estimator_.estimators_[0].kernel_.theta)
    assert isinstance(one, np.float64)
    assert isinstance(threads.log_marginal_likelihood(threads.kernel_.theta), np.float64)
    with pytest.raises(ValueError, match="Shape of theta must be either 2 or 6"):
        threads.log_marginal_likelihood(np.zeros(3))


def test_warm_start_continues_from_the_previous_posterior(monkeypatch):
    X, y = two_moons()
    real = gpc.classifier.infer
    calls = []

    def recording(K, y, **kw):
        calls.append(kw.get("init"))
        return real(K, y, **kw)

    monkeypatch.setattr(gpc.classifier, "infer", recording)
    kernel = ConstantKernel(2.0) * RBF(0.8)
    clf = GaussianProcessClassifier(kernel=kernel, optimizer=None, warm_start=True).fit(X, y)
    assert calls[-1] is None
    first = clf.base_estimator_.result_
    clf.fit(X, y)
    assert calls[-1] is first
    clf.log_marginal_likelihood(kernel.theta + 0.1)
    assert calls[-1] is clf.base_estimator_.result_
    cold = GaussianProcessClassifier(kernel=kernel, optimizer=None, warm_start=False).fit(X, y)
    cold.fit(X, y)
    assert calls[-1] is None
    cold.log_marginal_likelihood(kernel.theta + 0.1)
    assert calls[-1] is None
    # a warm start changes the path, not the fixed point: evidences agree to EP's tolerance
    np.testing.assert_allclose(clf.log_marginal_likelihood_value_, cold.log_marginal_likelihood_value_,
                               rtol=1e-5)


@BOTH
@pytest.mark.parametrize("name, bad", [("warm_start", "yes"), ("copy_X_train", 1), ("n_jobs", 1.5),
                                       ("max_iter_predict", 0), ("n_restarts_optimizer", -1)])
def test_bad_parameters_raise_value_error_naming_them(GPC, name, bad):
    X, y = two_moons()
    with pytest.raises(ValueError, match=name):
        GPC(**{name: bad}).fit(X, y)


@BOTH
def test_copy_X_train(GPC):
    X, y = two_moons()
    kernel = 1.0 * RBF(1.0)
    copied = GPC(kernel=kernel, optimizer=None, copy_X_train=True).fit(X, y)
    kept = GPC(kernel=kernel, optimizer=None, copy_X_train=False).fit(X, y)
    assert not np.shares_memory(copied.base_estimator_.X_train_, X)
    assert np.shares_memory(kept.base_estimator_.X_train_, X)
    query = X[:5].copy()
    before = copied.predict_proba(query)
    X[:] += 1.0   # the caller changes its array: the copy's model does not move
    np.testing.assert_array_equal(copied.predict_proba(query), before)


@BOTH
def test_clone_kernel_false_sets_theta_on_the_fitted_kernel(GPC):
    X, y = two_moons()
    clf = GPC(kernel=ConstantKernel(2.0) * RBF(0.8), optimizer=None).fit(X, y)
    theta = clf.kernel_.theta + 0.25
    clf.log_marginal_likelihood(theta, clone_kernel=True)
    assert not np.allclose(clf.kernel_.theta, theta)
    clf.log_marginal_likelihood(theta, clone_kernel=False)
    np.testing.assert_allclose(clf.kernel_.theta, theta, rtol=1e-15)


def test_max_iter_predict_bounds_laplace_newton():
    X, y = two_moons()
    kernel = ConstantKernel(20.0) * RBF(0.5)
    full = GpcLaplace(kernel=kernel, optimizer=None).fit(X, y)
    with pytest.warns(UserWarning, match="did not converge in 1 iterations"):
        short = GpcLaplace(kernel=kernel, optimizer=None, max_iter_predict=1).fit(X, y)
    assert short.log_marginal_likelihood_value_ != full.log_marginal_likelihood_value_
    with pytest.raises(ValueError, match="max_iter_predict"):
        GpcLaplace(max_iter_predict=0).fit(X, y)


def test_unknown_sklearn_kernels_keep_working():
    # Matern with ν = 0.7 has no gpc twin: it takes the generic path, same evidence and gradient as
    # the same model in scikit-learn (Laplace to tolerance: 1e-6 relative)
    X, y = two_moons()
    kernel = 1.0 * Matern(0.8, nu=0.7)
    ours = GpcLaplace(kernel=kernel, optimizer=None, tol=1e-10).fit(X, y)
    theirs = SkGPC(kernel=kernel, optimizer=None).fit(X, y)
    a = ours.log_marginal_likelihood(kernel.theta, eval_gradient=True)
    b = theirs.log_marginal_likelihood(kernel.theta, eval_gradient=True)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-8)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-6)


def test_public_evidence_repeats_no_check_that_fit_made(monkeypatch):
    # fit checks K for positive definiteness once; the public evaluation, like the optimiser's,
    # hands K on unchecked (check_kernel=False) and never forms scikit-learn's gradient tensor
    X, y = two_moons()
    kernel = ConstantKernel(2.0) * RBF(0.8)
    clf = GpcLaplace(kernel=kernel, optimizer=None).fit(X, y)
    real = gpc.classifier.infer
    checks = []

    def recording(K, y, **kw):
        checks.append(kw["check_kernel"])
        return real(K, y, **kw)

    monkeypatch.setattr(gpc.classifier, "infer", recording)
    monkeypatch.setattr(type(kernel), "__call__", lambda *a, **k: pytest.fail("scikit-learn kernel called"))
    value, grad = clf.log_marginal_likelihood(kernel.theta + 0.1, eval_gradient=True)
    assert checks == [False] and np.all(np.isfinite(grad))
