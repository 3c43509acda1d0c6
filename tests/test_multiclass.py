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
    clf.kernels_, clf.noise_, _ = clf._unpack(theta)
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


@pytest.mark.parametrize("params, match", [
    (dict(optimizer="bogus", kernel=RBF(1.0, "fixed")), "optimizer"),
    (dict(random_state="seed", kernel=RBF(1.0), optimizer=None), "random_state"),
])
def test_unused_bad_parameters_raise(params, match):
    # a fixed kernel leaves nothing to optimise, and a given kernel with no optimizer never draws
    # on random_state: the values are still bad, and fit says so (found by tests/test_fuzz.py)
    X, y = _blobs(n_per=3)
    with pytest.raises(ValueError, match=match):
        MultiClassGPC(**params).fit(X, y)


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


# --------------------------------------------------------------------------- issue 32's reproducer

X15 = np.array([[0, 3], [2, 2], [1, -1], [-1, 2], [0, 3], [-1, 0], [0, -1], [-2, -3], [2, 2], [1, -3],
                [3, 2], [-3, 0], [1, -2], [-3, -3], [3, 0]], float)
Y15 = np.array([0, 1, 1, 0, 2, 3, 5, 3, 0, 0, 4, 2, 3, 4, 2])


def test_fit_across_a_large_length_scale_jump_finds_the_better_optimum(monkeypatch):
    """From RBF(150) L-BFGS-B jumps to ℓ ≈ 0.18; the warm-started EP there used to return ρ̄ = 1.16
    and a NaN evidence, every later evaluation inherited that state, and the fit stopped at
    ℓ = 27.8 (log evidence −38.13) although ℓ = 0.2228 gives −31.09.  Every evaluation the
    optimiser sees must now be a valid EP state or a failure, and no RuntimeWarning may leak."""
    import warnings

    seen, real = [], MultiClassGPC._evidence

    def record(self, theta, X, y, eval_gradient=True, init=None):
        out = real(self, theta, X, y, eval_gradient, init)
        res = out[0] if eval_gradient else out
        seen.append((res.log_evidence, res.rho_mean))
        return out

    monkeypatch.setattr(MultiClassGPC, "_evidence", record)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        clf = MultiClassGPC(kernel=RBF(150.0)).fit(X15, Y15)
        fixed = MultiClassGPC(kernel=RBF(0.2228), optimizer=None).fit(X15, Y15)
    assert fixed.log_marginal_likelihood_value_ == pytest.approx(-31.09, abs=0.01)
    assert clf.log_marginal_likelihood_value_ >= -31.1
    assert len(seen) > 3
    assert all(np.isfinite(lz) and 0 < rho < 1 for lz, rho in seen)


def test_unscaled_features_default_kernel_and_advice():
    """The default kernel starts at the median distance between rows, so the default model does not
    depend on the features' common unit; EP's non-convergence warning says what to do (features on
    one scale: not to standardise them)."""
    X, y = _blobs(seed=4)
    a = MultiClassGPC(optimizer=None).fit(X, y)
    b = MultiClassGPC(optimizer=None).fit(1000.0 * X, y)
    from gpc.sparse.estimator import median_length_scale
    assert a.kernels_[0].length_scale == pytest.approx(
        median_length_scale(X, np.random.default_rng(None)), rel=1e-12)
    assert b.kernels_[0].length_scale == pytest.approx(1000.0 * a.kernels_[0].length_scale, rel=1e-12)
    # the same kernel matrix to rounding; EP stops below its tolerance 1e-4 on either, and rounding
    # can change its path by a step: the evidence, stationary in the sites, by ~tol² (measured 4e-9)
    assert b.log_marginal_likelihood_value_ == pytest.approx(a.log_marginal_likelihood_value_, abs=1e-6)
    np.testing.assert_allclose(b.predict_proba(1000.0 * X), a.predict_proba(X), atol=1e-4)
    with pytest.warns(gpc.exceptions.ConvergenceWarning, match="raise max_iter") as caught:
        MultiClassGPC(optimizer=None, max_iter=1).fit(X, y)
    assert "StandardScaler" not in str(caught[0].message)


# ------------------------------------------------------------------ amplitudes the evidence ignores

def _glass(n=60):
    from gpc.datasets import load_glass
    data = load_glass(binary=False)
    rng = np.random.default_rng(0)
    idx = rng.choice(len(data.y), size=n, replace=False)
    X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
    return X[idx], data.y[idx]


@pytest.mark.filterwarnings("ignore::gpc.exceptions.ConvergenceWarning")   # the spy's short EP
@pytest.mark.parametrize("model", ["robust", "standard", "heavy-tailed"])
def test_kernel_amplitude_is_not_identifiable_and_is_held(model):
    """The argmax likelihood is scale-free, so RMGPC's (and the fixed-noise) EP evidence does not
    change with a kernel amplitude c; SMGPC's does not change with c and the noises ϑ_k² scaled
    together; HTPC standardises u/√κ, so its evidence ignores c too.  The estimator holds c at its
    start (out of the optimiser's θ) and learns the rest."""
    from gpc.kernels import ConstantKernel
    X, y = _glass()
    classes, yi = np.unique(y, return_inverse=True)
    clf = MultiClassGPC(kernel=ConstantKernel(1.0) * RBF(1.0), model=model, optimizer=None,
                        tol=1e-9, max_iter=2000).fit(X, y)
    values = []
    for c in (0.1, 1.0, 10.0):
        theta = clf.theta_.copy()
        theta[0] = np.log(c)
        if model == "standard":
            theta[2:] = np.log(0.1 * c)     # ϑ_k² = 0.1 c
        values.append(clf._evidence(theta, X, yi, eval_gradient=False).log_evidence)
    # EP to a mismatch of 1e-9 (Laplace to 1e-9 on û) at each: the evidence agrees to ~1e-9
    np.testing.assert_allclose(values, values[1], atol=1e-7)
    if model == "standard":     # ϑ² alone does matter
        theta = clf.theta_.copy()
        theta[0] = np.log(10.0)
        assert abs(clf._evidence(theta, X, yi, eval_gradient=False).log_evidence - values[1]) > 0.1
    # the fit holds the amplitude and moves the length scale
    starts = []

    def spy(obj_func, initial_theta, bounds):
        starts.append(len(initial_theta))
        return initial_theta + 0.1, obj_func(initial_theta + 0.1, eval_gradient=False)

    fitted = MultiClassGPC(kernel=ConstantKernel(3.0) * RBF(1.0), model=model, optimizer=spy,
                           max_iter=50, tol=1e-3).fit(X, y)
    np.testing.assert_array_equal(fitted.fixed_amplitudes_, [0])
    assert fitted.theta_[0] == np.log(3.0)
    assert fitted.theta_[1] == pytest.approx(0.1)
    assert starts == [clf.theta_.size - 1]


@pytest.mark.filterwarnings("ignore::gpc.exceptions.ConvergenceWarning")   # short EP on purpose
def test_amplitudes_with_one_kernel_per_class():
    """One kernel per class: only the common scale is free of the evidence, so the first class's
    amplitude is held and the others are learnt (their ratios matter)."""
    from gpc.kernels import ConstantKernel
    X, y = _glass(40)
    clf = MultiClassGPC(kernel=ConstantKernel(1.0) * RBF(1.0), shared_kernel=False,
                        optimizer=None, max_iter=50, tol=1e-3).fit(X, y)
    np.testing.assert_array_equal(clf.fixed_amplitudes_, [0])
    assert MultiClassGPC(optimizer=None, max_iter=50, tol=1e-3).fit(X, y).fixed_amplitudes_.size == 0


# ----------------------------------------------------------------------------------- label noise

def test_fixed_label_noise_estimator_gradient_and_fit():
    """label_noise=ε: RMGPC's likelihood with the outlier rate fixed at ρ = ε l/(l − 1); θ ends with
    log ε, whose gradient (and the kernel's) match central differences of the evidence."""
    X, y = _blobs(n_per=8, seed=5)
    y = y.copy()
    y[3] = 2
    clf = MultiClassGPC(label_noise=0.05, max_iter=3000, tol=1e-12, optimizer=None).fit(X, y)
    assert clf.label_noise_ == pytest.approx(0.05)
    assert clf.ep_result_.rho_mean == pytest.approx(0.05 * 3 / 2)
    learner = MultiClassGPC(label_noise=0.05, max_iter=3000, tol=1e-12)
    learner.fit(X, y)       # sets up θ's layout: (log ℓ, log ε)
    assert learner.theta_.size == 2
    point = np.array([np.log(1.3), np.log(0.08)])
    _, grad = learner._evidence(point, X, y)
    h = 1e-5
    fd = [(learner._evidence(point + h * e, X, y, eval_gradient=False).log_evidence
           - learner._evidence(point - h * e, X, y, eval_gradient=False).log_evidence) / (2 * h)
          for e in np.eye(2)]
    # EP to 1e-12: central differences good to ~1e-7
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)
    assert 1e-6 <= learner.label_noise_ <= 0.4
    kept = MultiClassGPC(label_noise=0.05, label_noise_bounds="fixed").fit(X, y)
    assert kept.label_noise_ == 0.05 and kept.theta_.size == 1


@pytest.mark.parametrize("params, match", [
    (dict(label_noise="gauss"), "label_noise"),
    (dict(label_noise=-0.1), "label_noise"),
    (dict(label_noise=0.1, model="standard"), "model='robust'"),
    (dict(label_noise=0.7), r"\(l - 1\)/l"),
    (dict(label_noise=0.1, label_noise_bounds=(0.2, 0.1)), "label_noise_bounds"),
    (dict(label_noise=0.1, label_noise_bounds=(1e-3, 0.9)), "upper end"),
])
def test_label_noise_parameters_are_checked(params, match):
    X, y = _blobs(n_per=3)           # three classes: ε must stay below 2/3
    with pytest.raises(ValueError, match=match):
        MultiClassGPC(optimizer=None, **params).fit(X, y)


def test_unconverged_ep_warns_for_the_fitted_theta_only_and_advises_truly():
    """EP stopped by max_iter at the fitted θ warns once, advising to standardise X only when the
    features' scales differ; the optimiser's evaluations do not warn: a search whose first
    evaluations stop at max_iter, but whose warm-started EP converges at the θ it returns, is
    silent about EP."""
    import warnings
    from gpc.exceptions import ConvergenceWarning
    X, y = _blobs()
    X = (X - X.mean(0)) / X.std(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf = MultiClassGPC(kernel=RBF(1.0), max_iter=1).fit(X, y)
    assert clf.ep_result_.converged
    assert not [w for w in caught if "EP did not converge" in str(w.message)]
    with pytest.warns(ConvergenceWarning, match="max_iter=1 iterations at the fitted") as caught:
        clf = MultiClassGPC(kernel=RBF(1.0), optimizer=None, max_iter=1).fit(X, y)
    assert len(caught) == 1 and "standardise" not in str(caught[0].message)
    assert not clf.ep_result_.converged
    scaled = X * np.array([1.0, 100.0])
    with pytest.warns(ConvergenceWarning, match="differ by a factor 100: standardise X"):
        MultiClassGPC(kernel=RBF(1.0), optimizer=None, max_iter=1).fit(scaled, y)
