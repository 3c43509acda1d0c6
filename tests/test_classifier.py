"""The estimator: scikit-learn compatibility, agreement with scikit-learn's Laplace GPC, bad input."""

import pickle

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")  # the test group installs it; gpc itself does not need it
from sklearn.base import clone
from sklearn.gaussian_process import GaussianProcessClassifier as SkGPC
from sklearn.gaussian_process.kernels import RBF as SkRBF, ConstantKernel as SkC
from sklearn.utils.estimator_checks import check_estimator

from gpc import GaussianProcessClassifier
from gpc.datasets import load_breast_cancer_wisconsin_original, load_glass
from gpc.kernels import RBF, ConstantKernel


def standardised(X):
    return (X - X.mean(0)) / X.std(0)


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer_wisconsin_original(return_X_y=True)
    return standardised(X), y


def test_laplace_logit_equals_scikit_learn_on_real_data(cancer):
    # Same model, same θ, same algorithm family: the log marginal likelihood and its gradient must
    # agree to 1e-6 relative (both converge Newton to |ΔΨ| < 1e-10; the rest is rounding).
    X, y = cancer
    kernel = SkC(2.0) * SkRBF(3.0)           # a scikit-learn kernel, passed in unchanged
    ours = GaussianProcessClassifier(kernel=kernel, likelihood="logit", method="laplace",
                                     optimizer=None).fit(X, y)
    theirs = SkGPC(kernel=kernel, optimizer=None).fit(X, y)
    for theta in (kernel.theta, kernel.theta + np.array([0.7, -0.4])):
        v_ours, g_ours = ours.log_marginal_likelihood(theta, eval_gradient=True)
        v_theirs, g_theirs = theirs.log_marginal_likelihood(theta, eval_gradient=True)
        assert abs(v_ours - v_theirs) <= 1e-6 * abs(v_theirs)
        np.testing.assert_allclose(g_ours, g_theirs, rtol=1e-6)
    assert abs(ours.log_marginal_likelihood_value_ - theirs.log_marginal_likelihood_value_) \
        <= 1e-6 * abs(theirs.log_marginal_likelihood_value_)


@pytest.mark.parametrize("method, likelihood", [
    ("laplace", "logit"), ("ep", "probit"), ("pl", "probit"), ("kl", "logit"), ("vb", "logit"),
    ("mf-ensemble", "probit"), ("mf-naive", "probit")])
def test_evidence_gradient_reuses_K_and_reads_half_of_M(cancer, method, likelihood):
    # log_marginal_likelihood hands the kernel its K and the promise that M is symmetric (only the
    # lower triangle is read).  Both must hold for every method: M symmetric to rounding, and the
    # gradient equal to the plain contraction of the full M against the gradient tensor (1e-10
    # relative: the two sum the same terms in another order).
    X, y = cancer
    X, y = X[:120], y[:120]
    kernel = ConstantKernel(2.0) * RBF(3.0)
    clf = GaussianProcessClassifier(kernel=kernel, likelihood=likelihood, method=method,
                                    optimizer=None).fit(X, y)
    binary = clf.base_estimators_[0]
    theta = kernel.theta + np.array([0.3, -0.2])
    _, grad, result = binary._evidence(binary._kernel.clone_with_theta(theta), True)
    M = result.gradient_matrix()
    assert np.max(np.abs(M - M.T)) <= 1e-13 * np.max(np.abs(M))
    _, dK = kernel.clone_with_theta(theta)(X, eval_gradient=True)
    np.testing.assert_allclose(grad, np.einsum("ij,ijk->k", M, dK), rtol=1e-10)


def test_fitted_hyperparameters_agree_with_scikit_learn(cancer):
    # Both maximise the same evidence with L-BFGS-B from the same start; optima agree to the
    # optimiser's tolerance (evidence to 1e-4 relative).
    X, y = cancer
    X, y = X[:300], y[:300]
    ours = GaussianProcessClassifier(kernel=SkC(1.0) * SkRBF(1.0), likelihood="logit",
                                     method="laplace").fit(X, y)
    theirs = SkGPC(kernel=SkC(1.0) * SkRBF(1.0)).fit(X, y)
    assert abs(ours.log_marginal_likelihood_value_ - theirs.log_marginal_likelihood_value_) \
        <= 1e-4 * abs(theirs.log_marginal_likelihood_value_)
    assert np.mean(ours.predict(X) == theirs.predict(X)) > 0.99


@pytest.mark.parametrize("estimator", [
    GaussianProcessClassifier(method="laplace", likelihood="logit"),
    GaussianProcessClassifier(),
], ids=["laplace-logit", "default"])
def test_check_estimator(estimator):
    check_estimator(estimator)


def test_clone_pickle_and_params(cancer):
    X, y = cancer
    clf = GaussianProcessClassifier(kernel=ConstantKernel(1.0) * RBF(2.0), likelihood="logit",
                                    method="laplace", optimizer=None).fit(X[:100], y[:100])
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(again.predict_proba(X[100:150]), clf.predict_proba(X[100:150]))
    c = clone(clf)
    assert c.get_params()["likelihood"] == "logit" and not hasattr(c, "classes_")
    c.set_params(kernel__k2__length_scale=5.0)
    assert c.kernel.k2.length_scale == 5.0


def test_predict_proba_is_more_exact_than_the_probit_approximation(cancer):
    # For logit, P(y=1) = ∫ σ(f) N(f|μ, s²) df; gpc integrates it by quadrature, so it must equal a
    # brute-force integral to 1e-8 (scikit-learn's erf-mixture approximation is within ~1e-3).
    from scipy import integrate
    X, y = cancer
    clf = GaussianProcessClassifier(kernel=ConstantKernel(4.0) * RBF(3.0), likelihood="logit",
                                    method="laplace", optimizer=None).fit(X[:200], y[:200])
    mean, var = clf.predict_latent(X[200:205])
    p = clf.predict_proba(X[200:205])[:, 1]
    for m, v, pi in zip(mean, var, p):
        exact = integrate.quad(lambda f: np.exp(-0.5 * (f - m) ** 2 / v) / np.sqrt(2 * np.pi * v)
                               / (1 + np.exp(-f)), m - 12 * np.sqrt(v), m + 12 * np.sqrt(v), epsabs=1e-13)[0]
        assert abs(pi - exact) < 1e-8


@pytest.mark.parametrize("multi_class", ["one_vs_rest", "one_vs_one"])
def test_multi_class(multi_class):
    ds = load_glass(binary=False)
    X = standardised(ds.X)
    clf = GaussianProcessClassifier(kernel=ConstantKernel(2.0) * RBF(2.0), likelihood="logit",
                                    method="laplace", optimizer=None, multi_class=multi_class).fit(X, ds.y)
    P = clf.predict_proba(X)
    assert P.shape == (len(ds.y), 6)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    n_problems = 6 if multi_class == "one_vs_rest" else 15
    assert len(clf.base_estimators_) == n_problems
    assert clf.score(X, ds.y) > 0.7   # training accuracy of a smooth fit on 214 points
    mean, var = clf.predict_latent(X[:4])
    assert mean.shape == var.shape == (4, n_problems)


@pytest.mark.parametrize("X, y, match", [
    (np.array([[0.0, np.nan], [1.0, 2.0]]), [0, 1], "NaN"),
    (np.array([[0.0, np.inf], [1.0, 2.0]]), [0, 1], "inf"),
    (np.ones((4, 2)), [1, 1, 1, 1], "requires 2 or more distinct classes"),
    (np.ones((4, 2)), [0, 1, 0], "samples"),
    (np.ones(4), [0, 1, 0, 1], "2D"),
    (np.ones((4, 2)), [0.5, 1.5, 0.2, 1.0], "continuous"),
])
def test_bad_input_raises_value_error(X, y, match):
    with pytest.raises(ValueError, match=match):
        GaussianProcessClassifier(method="laplace", likelihood="logit").fit(X, y)


def test_bad_hyperparameters_and_kernels():
    X = np.random.default_rng(0).normal(size=(20, 2))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match="length_scale"):
        GaussianProcessClassifier(kernel=RBF(-1.0), method="laplace", likelihood="logit").fit(X, y)
    clf = GaussianProcessClassifier(kernel=RBF(1.0), method="laplace", likelihood="logit",
                                    optimizer=None).fit(X, y)
    with pytest.raises(ValueError, match="theta"):
        clf.log_marginal_likelihood(np.array([np.nan]))

    class Indefinite(SkRBF):  # a kernel whose matrix has a negative eigenvalue
        def __call__(self, X, Y=None, eval_gradient=False):
            K = super().__call__(X, Y, eval_gradient)
            return (K[0] - 2 * np.eye(len(X)), K[1]) if eval_gradient else K - (2 * np.eye(len(X)) if Y is None else 0)
    with pytest.raises(ValueError, match="not positive definite"):
        GaussianProcessClassifier(kernel=Indefinite(1.0), method="laplace", likelihood="logit").fit(X, y)
    with pytest.raises(ValueError, match="multi_class"):
        GaussianProcessClassifier(multi_class="all", method="laplace").fit(X, y)
    with pytest.raises(ValueError, match="method"):
        GaussianProcessClassifier(method="nope").fit(X, y)


def test_predict_checks_feature_count(cancer):
    X, y = cancer
    clf = GaussianProcessClassifier(method="laplace", likelihood="logit", optimizer=None).fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:5, :3])


def test_partial_fit_streams_like_one_online_pass(cancer):
    # ADF absorbs points one at a time, so feeding the data in three batches must give the same
    # posterior as one pass over all of them (same order, same arithmetic up to rounding: 1e-10).
    X, y = cancer
    X, y = X[:150], y[:150]
    kernel = ConstantKernel(2.0) * RBF(3.0)
    # fit presents the data in a seeded random order by default; the stream sees file order
    whole = GaussianProcessClassifier(kernel=kernel, method="online", optimizer=None,
                                      method_options={"order": None}).fit(X, y)
    stream = GaussianProcessClassifier(kernel=kernel, method="online", optimizer=None)
    for rows in np.array_split(np.arange(150), 3):
        stream.partial_fit(X[rows], y[rows], classes=np.unique(y))
    np.testing.assert_allclose(stream.predict_proba(X), whole.predict_proba(X), atol=1e-10)
    assert abs(stream.log_marginal_likelihood_value_ - whole.log_marginal_likelihood_value_) < 1e-9
    assert not hasattr(GaussianProcessClassifier(method="laplace"), "partial_fit")
    with pytest.raises(AttributeError, match="online"):
        GaussianProcessClassifier(method="laplace").partial_fit(X, y)


def test_methods_without_gradient_fall_back_to_finite_differences(cancer):
    # online ADF has no analytic evidence gradient: the estimator differentiates numerically
    # (central differences, step 1e-4: error O(h²) ~ 1e-8 relative); check against our own
    # finite differences with another step, to 1e-4 relative.
    X, y = cancer
    X, y = X[:80], y[:80]
    clf = GaussianProcessClassifier(kernel=ConstantKernel(2.0) * RBF(3.0), method="online",
                                    optimizer=None).fit(X, y)
    theta = clf.kernel_.theta
    value, grad = clf.log_marginal_likelihood(theta, eval_gradient=True)
    h = 1e-3
    for k in range(2):
        e = np.zeros(2)
        e[k] = h
        fd = (clf.log_marginal_likelihood(theta + e) - clf.log_marginal_likelihood(theta - e)) / (2 * h)
        assert abs(grad[k] - fd) <= 1e-4 * abs(fd) + 1e-8
    fitted = GaussianProcessClassifier(kernel=ConstantKernel(2.0) * RBF(3.0), method="online").fit(X, y)
    assert fitted.log_marginal_likelihood_value_ >= value - 1e-9
