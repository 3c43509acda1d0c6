"""SparseGaussianProcessClassifier keeps what its docstring promises: epochs, evaluations, classes,
checks that name the argument, and no numerical warnings on valid input."""

import warnings

import numpy as np
import pytest

from gpc import SparseGaussianProcessClassifier
from gpc.datasets import load


def _crabs(scale=1.0):
    X, y = load("crabs", return_X_y=True)
    return (X - X.mean(0)) / X.std(0) * scale, y


def _fit(X, y, **kw):
    kw = {"n_inducing": 8, "random_state": 0, "progress": False, **kw}
    return SparseGaussianProcessClassifier(**kw).fit(X, y)


class _Bar:
    """A progress hook that counts: the total it was given and the steps it saw."""

    def __init__(self, total):
        self.total, self.steps = total, 0

    def update(self, k=1):
        self.steps += k

    def close(self):
        pass


class _Counted(SparseGaussianProcessClassifier):
    def _progress_bar(self, epochs, steps_per_epoch):
        self.bars_ = getattr(self, "bars_", []) + [_Bar(epochs * steps_per_epoch)]
        return self.bars_[-1]


# -- partial_fit and max_iter ------------------------------------------------------------------------
def test_minibatch_svi_partial_fit_runs_one_epoch():
    X, y = _crabs()
    clf = _fit(X, y, method="svi", batch_size=50, max_iter=3)
    assert clf.n_iter_ == 3
    clf.partial_fit(X, y)
    assert clf.n_iter_ == 4                       # "one more epoch" (it ran two)


@pytest.mark.parametrize("method", ["gfitc", "svi"])
@pytest.mark.parametrize("max_iter", [1, 2, 3])
def test_lbfgs_fits_run_max_iter_evaluations(method, max_iter, monkeypatch):
    # max_iter is the number of objective evaluations for the L-BFGS-B fits: GFITC ran 5 for
    # 1, 2 or 3, SVI k + 1 or k + 2; the progress bar's total must be what it then counts
    from gpc.sparse import baselines
    state = baselines.GFITCState if method == "gfitc" else baselines.SVIState
    calls = []
    real = state.objective
    monkeypatch.setattr(state, "objective", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    X, y = _crabs()
    clf = _Counted(method=method, n_inducing=8, max_iter=max_iter, random_state=0).fit(X, y)
    assert len(calls) == max_iter
    assert clf.n_iter_ == max_iter
    assert clf.bars_[0].total == clf.bars_[0].steps == max_iter


@pytest.mark.parametrize("kw", [{}, {"batch_size": 50}, {"tied_sites": True, "batch_size": 50}])
def test_progress_total_is_what_the_fit_counts(kw):
    X, y = _crabs()
    clf = _Counted(n_inducing=8, max_iter=3, random_state=0, **kw).fit(X, y)
    assert clf.bars_[0].total == clf.bars_[0].steps > 0


def test_partial_fit_classes_fixes_the_label_set():
    # scikit-learn's meaning: classes on the first call lists every class y may ever hold
    X, y = _crabs()
    labels = np.where(y == y[0], 0, 1)
    clf = SparseGaussianProcessClassifier(n_inducing=8, random_state=0, progress=False)
    clf.partial_fit(X, labels, classes=[0, 1, 2])
    assert clf.classes_.tolist() == [0, 1, 2]
    assert clf.predict_proba(X).shape == (len(y), 3)
    with pytest.raises(ValueError, match="classes"):
        clf.partial_fit(X, labels, classes=[0, 1])


@pytest.mark.parametrize("tied", [False, True])
def test_partial_fit_refuses_labels_fit_never_saw(tied):
    X, y = _crabs()
    labels = np.where(y == y[0], 0, 1)
    kw = {"tied_sites": True, "batch_size": 50} if tied else {}
    clf = _fit(X, labels, max_iter=2, **kw)
    history = len(clf.history_)
    for bad in (np.where(labels == 0, 2, 1), np.where(labels == 0, "x", "1").astype(object)):
        with pytest.raises(ValueError, match="not in classes_"):
            clf.partial_fit(X, bad)
    assert len(clf.history_) == history           # nothing trained on them


# -- errors that name the argument, before any work -----------------------------------------------------
@pytest.mark.parametrize("bad, word", [(np.nan, "NaN"), (np.inf, "inf")])
def test_nan_in_X_is_named_before_any_work(bad, word, monkeypatch):
    def no_kmeans(*args, **kw):
        raise AssertionError("k-means ran on X with NaN")

    monkeypatch.setattr("gpc.sparse.estimator.kmeans2", no_kmeans)
    X, y = _crabs()
    X[7, 2] = bad
    with pytest.raises(ValueError, match=f"X contains {word}"):
        _fit(X, y)


def test_validation_data_of_the_wrong_width_fails_at_the_start(monkeypatch):
    def no_training(*args, **kw):
        raise AssertionError("training started")

    monkeypatch.setattr("gpc.sparse.estimator.initial_inducing", no_training)
    X, y = _crabs()
    with pytest.raises(ValueError, match="validation_data.*features"):
        _fit(X, y, validation_data=(X[:, :3], y))
    with pytest.raises(ValueError, match="validation_data"):
        _fit(X, y, validation_data=(X, y[:5]))


def test_a_kernel_that_starts_outside_its_bounds_is_named():
    from gpc.kernels import RBF
    X, y = _crabs()
    with pytest.raises(ValueError, match="length_scale start outside their bounds"):
        _fit(X, y, kernel=RBF(1e8))


# -- no numerical warnings on valid input --------------------------------------------------------------
def _duplicated_rows():
    X, y = _crabs()
    rows = np.r_[0:10, 190:200]                      # both classes, each row ten times
    return np.repeat(X[rows], 10, axis=0), np.repeat(y[rows], 10)


def _equal_rows():
    return np.ones((200, 6)), np.r_[np.zeros(100), np.ones(100)]


@pytest.mark.parametrize("data", ["duplicated", "equal", "huge"])
@pytest.mark.parametrize("method, batch_size", [("ep", None), ("ep", 50), ("svi", None),
                                                ("svi", 50), ("gfitc", None)])
def test_valid_input_raises_no_numerical_warnings(data, method, batch_size):
    # duplicated rows gave k-means++ 0/0 ("invalid value encountered in divide"), all rows equal
    # the same for SVI, inputs of 1e150 overflowed the median heuristic's squares; SVI on them
    # then failed ("theta must be finite").  Each must fit without a RuntimeWarning, and learn
    # what there is to learn.
    X, y = {"duplicated": _duplicated_rows, "equal": _equal_rows,
            "huge": lambda: _crabs(1e150)}[data]()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        clf = _fit(X, y, method=method, batch_size=batch_size, n_inducing=30, max_iter=10)
        p = clf.predict_proba(X)
    assert np.all(np.isfinite(p)) and np.isfinite(clf.log_marginal_likelihood_value_)
    if data == "equal":        # no information: the two classes are equally likely
        assert clf.inducing_points_.shape == (1, 6)
        np.testing.assert_allclose(p, 0.5, atol=0.05)
    else:                      # separable copies; crabs by sex is ~90 % for these models
        assert clf.score(X, y) > 0.8


# -- the defaults on large data ----------------------------------------------------------------------------
def test_auto_batch_size_and_epochs_follow_n():
    from gpc.sparse import estimator as est
    clf = SparseGaussianProcessClassifier()
    assert clf.get_params()["batch_size"] == "auto" and clf.get_params()["max_iter"] == "auto"
    below, above = est.AUTO_MINIBATCH_FROM - 1, est.AUTO_MINIBATCH_FROM
    assert clf._minibatch_rows(below) is None                      # batch below the threshold
    assert clf._minibatch_rows(above) == est.AUTO_BATCH_SIZE
    assert clf._epochs(below, None) == 100
    # about AUTO_ROWS rows seen: 8 epochs of 50,000 rows, at least 2, at most 100
    assert clf._epochs(50_000, 2000) == 8
    assert clf._epochs(10**6, 2000) == est.AUTO_MIN_EPOCHS == 2
    assert clf._epochs(above, 2000) == 40
    gfitc = SparseGaussianProcessClassifier(method="gfitc")
    assert gfitc._minibatch_rows(10**6) is None                     # GFITC trains in batch
    assert SparseGaussianProcessClassifier(batch_size=500)._minibatch_rows(400) is None
    assert SparseGaussianProcessClassifier(max_iter=7)._epochs(10**6, 2000) == 7


def test_defaults_fit_large_data_on_minibatches():
    # 10,000 rows of bench_sparse.py's problem: minibatches of 2,000 rows for 40 epochs (200
    # steps); m = 20 keeps the test short.  The labels are y = sign(f + 0.3 ε); a GP with 20
    # inducing points on this 8-dimensional f reaches 0.91 accuracy (measured); 0.85 is far
    # above the 0.5 of a coin
    rng = np.random.default_rng(0)
    X = rng.standard_normal((12_000, 8))
    f = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    y = np.where(f + 0.3 * rng.standard_normal(12_000) > 0, 1.0, -1.0)
    clf = _Counted(n_inducing=20, random_state=0).fit(X[:10_000], y[:10_000])
    assert clf._batch == 2000 and clf.n_iter_ == 40
    assert clf.bars_[0].steps == clf.bars_[0].total == 40 * 5
    assert clf.score(X[10_000:], y[10_000:]) > 0.85
