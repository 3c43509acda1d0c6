"""MultiClassGPC: predictions, the two-class mapping to binary EP, input errors, scikit-learn checks."""

import numpy as np
import pytest

import gpc
from gpc import MultiClassGPC
from gpc.kernels import RBF


def _blobs(n_per=12, l=3, seed=0):
    rng = np.random.default_rng(seed)
    centres = 3.0 * np.column_stack([np.cos(2 * np.pi * np.arange(l) / l), np.sin(2 * np.pi * np.arange(l) / l)])
    X = np.vstack([c + rng.normal(size=(n_per, 2)) for c in centres])
    y = np.repeat(np.arange(l), n_per)
    return X, y


@pytest.mark.parametrize("model", ["robust", "standard"])
def test_predict_proba_rows_sum_to_one_and_classify_blobs(model):
    X, y = _blobs()
    clf = MultiClassGPC(model=model, optimizer=None).fit(X, y)
    P = clf.predict_proba(X + 0.1)
    assert P.shape == (len(y), 3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)   # rounding only
    assert np.all(P > 0)
    assert np.mean(clf.predict(X) == y) > 0.9
    assert clf.outlier_probability_.shape == (len(y),)
    if model == "standard":
        assert np.all(clf.outlier_probability_ == 0)


def test_outlier_probability_is_in_fit_order():
    X, y = _blobs(seed=1)
    y = y.copy()
    y[5] = 2                         # a class-0 point labelled 2
    perm = np.random.default_rng(0).permutation(len(y))
    a = MultiClassGPC(optimizer=None).fit(X, y).outlier_probability_
    b = MultiClassGPC(optimizer=None).fit(X[perm], y[perm]).outlier_probability_
    # the same model on permuted rows: the same fixed point up to EP's tolerance (1e-4 on the step)
    np.testing.assert_allclose(b, a[perm], atol=1e-3)
    assert np.argmax(a) == 5 and a[5] > 0.5


def test_two_classes_agree_with_binary_ep():
    """l = 2, no outliers: f₁ − f₂ ~ GP(0, 2K) and Θ(f₁ + ε₁ − f₂ − ε₂) = Φ((f₁ − f₂)/√(2ϑ²)), i.e.
    binary EP with the probit likelihood on the kernel 2K/(2ϑ²) = K/ϑ² (docs/derivations-rmgpc.md).
    The multi-class EP keeps f₁, f₂ independent in Q, so the two agree closely, not exactly."""
    X, y = _blobs(n_per=15, l=2, seed=2)
    noise = 0.5
    clf = MultiClassGPC(model="standard", optimizer=None).fit(X, y)
    # fix ϑ² = 0.5 on both classes and refit EP at that θ
    theta = np.concatenate([RBF(1.0).theta, np.log([noise, noise])])
    clf.ep_result_ = clf._evidence(theta, X, y, eval_gradient=False)
    clf.kernels_, clf.noise_ = clf._unpack(theta)
    Xs = np.random.default_rng(5).uniform(-4, 4, size=(40, 2))
    p_multi = clf.predict_proba(Xs)[:, 0]
    K = RBF(1.0)(X) / noise
    res = gpc.infer(K, np.where(y == 0, 1.0, -1.0), likelihood="probit", method="ep")
    mean, var = res.posterior.predict(RBF(1.0)(X, Xs) / noise, np.full(len(Xs), 1.0 / noise),
                                      np.zeros(len(Xs)))
    from scipy.special import ndtr
    p_bin = ndtr(mean / np.sqrt(1.0 + var))
    # factorised vs joint Q: measured gap below 0.03 on this problem; 0.05 leaves room
    np.testing.assert_allclose(p_multi, p_bin, atol=0.05)
    assert np.mean((p_multi > 0.5) == (p_bin > 0.5)) >= 0.95


@pytest.mark.parametrize("bad, err", [
    (dict(y=np.zeros(9)), "only one class"),
    (dict(y=np.array([0, 1, 2, 0, 1, 2, 0, 1, 0.5])), "continuous"),
    (dict(X=np.full((9, 2), np.nan)), "NaN"),
])
def test_bad_input_raises(bad, err):
    X, y = _blobs(n_per=3)
    args = dict(X=X, y=y)
    args.update(bad)
    with pytest.raises(ValueError, match=err):
        MultiClassGPC(optimizer=None).fit(args["X"], args["y"])


def test_bad_parameters_raise():
    X, y = _blobs(n_per=3)
    with pytest.raises(ValueError, match="model"):
        MultiClassGPC(model="nope").fit(X, y)
    with pytest.raises(ValueError, match="b0"):
        MultiClassGPC(b0=-1.0).fit(X, y)
    with pytest.raises(ValueError, match="shared_kernel"):
        MultiClassGPC(model="heavy-tailed", shared_kernel=False).fit(X, y)
    with pytest.raises(ValueError, match="n_jobs"):
        MultiClassGPC(n_jobs=0).fit(X, y)


def test_type2_ml_raises_the_evidence():
    X, y = _blobs(n_per=10, seed=3)
    fixed = MultiClassGPC(optimizer=None, kernel=RBF(0.2)).fit(X, y)
    fitted = MultiClassGPC(kernel=RBF(0.2)).fit(X, y)
    assert fitted.log_marginal_likelihood_value_ > fixed.log_marginal_likelihood_value_ + 1.0


# HTPC's checks take ~10 s CPU (Laplace on 300-point sets), so they run with the slow tests
@pytest.mark.parametrize("model", ["robust", pytest.param("heavy-tailed", marks=pytest.mark.slow)])
def test_check_estimator(model):
    sklearn = pytest.importorskip("sklearn")
    from sklearn.utils.estimator_checks import check_estimator
    check_estimator(MultiClassGPC(model=model, optimizer=None, max_iter=50))


def test_final_state_reuses_the_optimum_or_falls_back_to_a_cold_start(monkeypatch):
    """After type-II ML the estimator keeps the optimiser's own EP result at the chosen θ; at any
    other θ it re-runs EP warm-started, and when that fails (as it did once on glass) cold."""
    X, y = _blobs(n_per=6)
    clf = MultiClassGPC(optimizer=None).fit(X, y)
    theta = clf.theta_
    res = clf.ep_result_
    assert clf._final_state(theta, X, y, {"best": (0.0, theta.copy(), res)}) is res
    calls = []
    real = clf._evidence

    def warm_fails(t, X_, y_, eval_gradient=True, init=None):
        calls.append(init is not None)
        if init is not None:
            raise gpc.exceptions.NotPositiveDefiniteError("a cavity variance is not positive")
        return real(t, X_, y_, eval_gradient, init)
    monkeypatch.setattr(clf, "_evidence", warm_fails)
    out = clf._final_state(theta, X, y, {"res": res, "best": (0.0, theta + 1.0, res)})
    assert calls == [True, False]
    np.testing.assert_allclose(out.outlier_probability, res.outlier_probability, atol=1e-3)
