"""Fitted states are never invalid (docs/reliability.md, "Fitted states and interrupts").

Short fits, partial fits, distributed fits and interrupted fits of the sparse estimators end in a
state whose attributes are valid (ρ ∈ [0, 1], a proper Beta, a finite log evidence ≤ 0 for EP on
labels, probabilities that sum to one) or absent (an unfitted estimator), never in between.
Interrupts are injected deterministically: a KeyboardInterrupt raised by a hook at a chosen call.
"""

import itertools
import threading
import types
import warnings

import numpy as np
import pytest

from helpers import local_client

from gpc import SparseGaussianProcessClassifier, SparseMultiClassGPC, _parallel
from gpc.distributed import InProcessEngine
from gpc._estimator import NotFittedError


# -- an interrupted pass returns once its running blocks end (issue 40, item 7a) ------------------
def test_an_interrupt_that_takes_a_block_index_from_the_caller_does_not_wait_for_it(monkeypatch):
    # a Ctrl-C that lands in the caller right after it claimed a block (before it could run or
    # settle it) left that block unsettled, and the pass waited _STOP_WAIT for it; the claim
    # below advances and then raises, which is that interrupt made certain
    caller, running, ended = [], [0], []

    class Claim:
        def __init__(self, start=0):
            self.inner, self.start = itertools.count(start), start

        def __next__(self):
            value = next(self.inner)
            if self.start == 0 and threading.current_thread() is caller[0] and value == 0:
                raise KeyboardInterrupt
            return value

    monkeypatch.setattr(_parallel, "itertools", types.SimpleNamespace(count=Claim))
    monkeypatch.setattr(_parallel, "_STOP_WAIT", 3600.0)
    helper_started = threading.Event()

    def fn(j):
        running[0] += 1
        helper_started.set()
        threading.Event().wait(0.05)        # a running block: the pass must wait for its end
        running[0] -= 1
        ended.append(j)
        return j

    outcome = []

    def run():
        caller.append(threading.current_thread())
        with _parallel.block_threads(2) as threads:
            outcome.append(threads)
            try:
                _parallel.over_blocks(fn, 8)
                outcome.append("returned")
            except KeyboardInterrupt:
                outcome.append(("interrupted", running[0]))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120.0)       # a hang guard, not a timing: the old pass waited 3600 s here
    assert not thread.is_alive(), "the interrupted pass waited for a block nobody runs"
    assert outcome[0] in (1, 2)
    if outcome[0] == 2:      # BLAS pinned: a helper ran blocks beside the caller
        assert outcome[1] == ("interrupted", 0)       # no block still running after the raise
    else:                    # one thread: the caller's interrupt ends the pass at once
        assert outcome[1] == ("interrupted", 0) and ended == []


# -- an interrupt before the first completed step (issue 40, items 5 and 7b) ----------------------
def _binary_data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    return X, np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1, 0)


def _three_classes(n=150, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    X = rng.normal(size=(n, 2)) + 3.0 * np.array([[0, 0], [1, 0], [0, 1]])[y]
    return X, y


def _interrupt_at(monkeypatch, owner, name, call):
    """Make ``owner.name`` raise a KeyboardInterrupt at its ``call``-th call (1-based)."""
    real = getattr(owner, name)
    count = [0]

    def hooked(*args, **kw):
        count[0] += 1
        if count[0] == call:
            raise KeyboardInterrupt
        return real(*args, **kw)
    monkeypatch.setattr(owner, name, staticmethod(hooked) if isinstance(
        owner.__dict__.get(name), staticmethod) else hooked)
    return count


def _assert_unfitted(clf, X):
    for attribute in ("log_marginal_likelihood_value_", "n_iter_"):
        with pytest.raises(NotFittedError):
            getattr(clf, attribute)
    with pytest.raises(NotFittedError):
        clf.predict_proba(X)


def _assert_usable(clf, X):
    assert np.isfinite(clf.log_marginal_likelihood_value_)
    P = clf.predict_proba(X)
    assert np.all((P >= 0) & (P <= 1)) and np.allclose(P.sum(axis=1), 1.0, atol=1e-12)


def _binary_hooks():
    from gpc.sparse import baselines
    from gpc.sparse.core import trainers as _trainer
    return {
        # GFITC and batch SVI: L-BFGS-B's first evaluation; SVI minibatches: the first step;
        # SEP (one-vs-rest minibatches): the first step of the second problem
        "gfitc": (dict(method="gfitc"), baselines.GFITCState, "objective", 1),
        "svi-batch": (dict(method="svi"), baselines.SVIState, "objective", 1),
        "svi-minibatch": (dict(method="svi", batch_size=40), baselines.SVIState,
                          "minibatch_step", 1),
        "ep-ovr-minibatch": (dict(batch_size=50), _trainer.SEPMinibatch, "iterate", 4),
    }


@pytest.mark.parametrize("case", ["gfitc", "svi-batch", "svi-minibatch", "ep-ovr-minibatch"])
def test_binary_interrupted_before_its_first_step_is_unfitted_and_raises(monkeypatch, case):
    params, owner, name, call = _binary_hooks()[case]
    X, y = _three_classes() if case == "ep-ovr-minibatch" else _binary_data()
    _interrupt_at(monkeypatch, owner, name, call)
    clf = SparseGaussianProcessClassifier(n_inducing=8, max_iter=3, random_state=0,
                                          progress=False, **params)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # no "keeps its last step" claim
        with pytest.raises(KeyboardInterrupt):
            clf.fit(X, y)
    _assert_unfitted(clf, X)
    monkeypatch.undo()
    clf.partial_fit(X, y)              # an unfitted estimator starts afresh
    _assert_usable(clf, X)


@pytest.mark.parametrize("case", ["gfitc", "svi-batch", "svi-minibatch", "ep-ovr-minibatch"])
def test_binary_interrupted_after_its_first_step_keeps_a_usable_model(monkeypatch, case):
    params, owner, name, call = _binary_hooks()[case]
    X, y = _three_classes() if case == "ep-ovr-minibatch" else _binary_data()
    later = 2 * call if case == "ep-ovr-minibatch" else call + 2   # every problem has a step
    _interrupt_at(monkeypatch, owner, name, later + (3 if case == "ep-ovr-minibatch" else 0))
    clf = SparseGaussianProcessClassifier(n_inducing=8, max_iter=3, random_state=0,
                                          progress=False, **params)
    with pytest.warns(RuntimeWarning, match="last completed step"):
        clf.fit(X, y)
    _assert_usable(clf, X)


def _multiclass_hooks():
    from gpc.multiclass import sparse_vi
    from gpc.sparse.core import steps as sparse
    from gpc.sparse import baselines  # noqa: F401
    return {
        # EP: inside the first step, after its sites are committed and before its evidence
        "ep-batch": (dict(), sparse, "_inner_step", 1),
        "ep-minibatch": (dict(batch_size=50), sparse, "_inner_step", 1),
        "vi-batch": (dict(method="vi", label_noise=0.05), sparse_vi.SparseMultiClassVIState,
                     "objective", 1),
        "vi-minibatch": (dict(method="vi", label_noise=0.05, batch_size=50),
                         sparse_vi.SparseMultiClassVIState, "minibatch_step", 1),
    }


@pytest.mark.parametrize("case", ["ep-batch", "ep-minibatch", "vi-batch", "vi-minibatch"])
def test_multiclass_interrupted_before_its_first_step_is_unfitted_and_raises(monkeypatch, case):
    params, owner, name, call = _multiclass_hooks()[case]
    if not hasattr(owner, name):
        pytest.fail(f"{owner} has no {name} to hook")
    X, y = _three_classes()
    _interrupt_at(monkeypatch, owner, name, call)
    clf = SparseMultiClassGPC(n_inducing=8, max_iter=3, random_state=0, progress=False, **params)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(KeyboardInterrupt):
            clf.fit(X, y)
    _assert_unfitted(clf, X)
    monkeypatch.undo()
    clf.fit(X, y)
    _assert_usable(clf, X)


# -- short fits on clean data (issue 40, item 3) -----------------------------------------------------
def _ordered_classes(n, seed=0):
    """Three ordered classes cut from a linear score of four features: clean data, on which RMGPC's
    outlier rate belongs near 0."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    t = X @ np.array([1.0, 0.5, -0.5, 0.25])
    return X, np.digitize(t, np.quantile(t, [1 / 3, 2 / 3]))


def _assert_valid_multiclass(clf, X, y):
    state = clf._state
    log_z = clf.log_marginal_likelihood_value_
    assert np.isfinite(log_z) and log_z <= 1e-6            # the log probability of the labels
    assert 0.0 <= clf.outlier_rate_ <= 1.0
    if state.model.beta:
        a, b = state.beta_posterior()
        assert a > 0 and b > 0
    P = clf.predict_proba(X)
    assert np.all((P >= 0) & (P <= 1)) and np.allclose(P.sum(axis=1), 1.0, atol=1e-12)


@pytest.fixture(scope="module")
def clean_5000():
    return _ordered_classes(5000)


@pytest.mark.parametrize("max_iter", range(1, 11))
def test_short_batch_fits_on_clean_data_are_valid_and_do_not_swing(clean_5000, max_iter):
    # n = 5000, d = 4, 3 ordered classes, m = 30, the default Beta treatment: the first pass's
    # ψ̃ sweep from the prior q took ρ̄ to 0.99 (Beta(139, 0.97)), the next to 0.0003, and short
    # fits swung between accuracy 0.45 and 0.93 with log Z up to +1e6.  Now every short fit is a
    # valid state, ρ̄ stays below 1/3 (the data are clean: at max_iter = 100 it is 3e-4) and no
    # fit loses most of what the first pass learnt (accuracy 0.94 after one pass; the damped
    # parallel passes still overshoot a little before they settle, measured minimum 0.78)
    X, y = clean_5000
    clf = SparseMultiClassGPC(n_inducing=30, max_iter=max_iter, random_state=0,
                              progress=False).fit(X, y)
    _assert_valid_multiclass(clf, X, y)
    assert clf.outlier_rate_ < 1 / 3
    assert clf.score(X, y) > 0.7


def test_partial_fit_steps_on_clean_data_are_each_valid(clean_5000):
    X, y = clean_5000
    clf = SparseMultiClassGPC(n_inducing=30, random_state=0, progress=False)
    for _ in range(10):
        clf.partial_fit(X, y)
        _assert_valid_multiclass(clf, X, y)
    assert clf.n_iter_ == 10 and clf.score(X, y) > 0.9


def test_a_batch_pass_that_leaves_a_log_probability_is_dropped():
    # at fixed hyperparameters and fixed label noise ε = 0.05 the third damped parallel pass
    # overshot to log Z = +7.8e4 (accuracy 0.65); such a pass is dropped (the state stays at
    # the last valid one) and the damping halved, after which the passes settle
    from gpc.kernels import RBF, ConstantKernel
    X, y = _ordered_classes(5000)
    clf = SparseMultiClassGPC(kernel=ConstantKernel(1.0, "fixed") * RBF(2.57, "fixed"),
                              optimize_inducing=False, label_noise=0.05,
                              label_noise_bounds="fixed", n_inducing=30, max_iter=1,
                              random_state=0, progress=False)
    for _ in range(8):
        clf.partial_fit(X, y)
        _assert_valid_multiclass(clf, X, y)
    assert clf._state.skipped_passes >= 1 and clf._state.damping_scale < 1.0
    assert clf.score(X, y) > 0.95


# -- client= with shards (issue 40, item 4) ---------------------------------------------------------
@pytest.fixture(scope="module")
def clean_900():
    return _ordered_classes(900)


@pytest.mark.parametrize("noise", [dict(), dict(label_noise=0.05), dict(model="standard")],
                         ids=["beta", "fixed", "none"])
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sharded_fits_are_valid_for_every_noise_treatment(clean_900, shards, noise):
    X, y = clean_900
    clf = SparseMultiClassGPC(n_inducing=20, max_iter=8, random_state=0, progress=False,
                              client=InProcessEngine(n_shards=shards), **noise).fit(X, y)
    _assert_valid_multiclass(clf, X, y)
    assert clf.score(X, y) > 0.95
    if shards == 1:     # one shard is the in-process schedule
        local = SparseMultiClassGPC(n_inducing=20, max_iter=8, random_state=0, progress=False,
                                    **noise).fit(X, y)
        assert clf.log_marginal_likelihood_value_ == pytest.approx(
            local.log_marginal_likelihood_value_, rel=1e-9)


def test_shards_share_out_their_outlier_changes_so_the_beta_stays_proper(clean_900):
    # each of K shards sweeps its ψ̃ᵢ from the master's Beta; from the prior q every point looks
    # a little like an outlier and each shard alone takes b from 9 towards 0: K full changes
    # added make b negative (the Beta(53.5, −7.01)), their mean (share 1/K) cannot
    from gpc.multiclass import sparse as S
    from gpc.multiclass._sparse_distributed import pack, site_task, unpack
    from gpc.sparse.core.shards import light as _light
    X, y = clean_900
    clf = SparseMultiClassGPC(n_inducing=20, max_iter=1, random_state=0, progress=False)
    clf.partial_fit(X, y)            # a model; its state is put back to the prior below
    st = S.SparseMultiClassState(clf._state.kernels, clf._state.Zs, clf._state.y, len(y),
                                 clf._state.model, clf.jitter, False, 1.0)
    light = [_light(q, f) for q, f in zip(st.qs, st.factors)]
    qs, factors = [q for q, _ in light], [f for _, f in light]
    for K in (2, 3):
        bounds = np.linspace(0, len(y), K + 1).astype(int)
        sums = {}
        for share in (1.0, 1.0 / K):
            a = b = 0.0
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                S0 = pack(st.sites)[lo:hi]
                theta = (st.model, factors, 0.5, 4096, st.beta_posterior(), None, share, True)
                new, (_, a_sum, b_sum, _) = site_task(X[lo:hi], st.y[lo:hi], S0, qs, theta,
                                                      unpack(S0, st.y[lo:hi], st.C))
                a, b = a + a_sum, b + b_sum
            sums[share] = (st.model.a0 + a, st.model.b0 + b)
        assert min(sums[1.0]) <= 0                  # the test can fail: K full changes
        assert min(sums[1.0 / K]) > 0


def test_a_failed_sharded_fit_is_unfitted_or_at_its_last_valid_step(monkeypatch, clean_900):
    from gpc.multiclass import _sparse_distributed as D
    X, y = clean_900
    real, calls = D.evidence_task, [0]

    def failing(*args):
        calls[0] += 1
        if calls[0] == failing.at:
            raise ValueError("a shard failed")
        return real(*args)
    monkeypatch.setattr(D, "evidence_task", failing)
    for at, fitted in ((1, False), (3, True)):
        calls[0], failing.at = 0, at
        clf = SparseMultiClassGPC(n_inducing=20, max_iter=5, random_state=0, progress=False,
                                  client=InProcessEngine(n_shards=2))
        with pytest.raises(ValueError, match="a shard failed"):
            clf.fit(X, y)
        if fitted:
            _assert_valid_multiclass(clf, X, y)
        else:
            _assert_unfitted(clf, X)


def test_a_beta_fit_on_a_local_cluster_equals_two_shards_in_process(clean_900):
    # the shards' share of the ψ̃ change runs on the workers as in process (2 worker processes,
    # loopback; every wait bounded by 300 s on a loaded machine)
    pytest.importorskip("distributed")
    X, y = clean_900
    kw = dict(n_inducing=20, max_iter=4, random_state=0, progress=False)
    local = SparseMultiClassGPC(client=InProcessEngine(n_shards=2), **kw).fit(X, y)
    with local_client() as client:
        remote = SparseMultiClassGPC(client=client, **kw).fit(X, y)
    _assert_valid_multiclass(remote, X, y)
    assert remote.log_marginal_likelihood_value_ == pytest.approx(
        local.log_marginal_likelihood_value_, rel=1e-10)


def test_a_dropped_first_pass_leaves_the_log_z_of_the_state_it_keeps(monkeypatch, clean_900):
    # a first pass dropped for its log Z (made +1e6 here) leaves the prior's sites; the estimator
    # still reports a valid log Z, that of the state it keeps, not the NaN of no step
    from gpc.multiclass import sparse as S
    X, y = clean_900
    real, calls = S.LocalClassRows.evidence_parts, [0]

    def first_too_high(self, gradient, held):
        calls[0] += 1
        parts = real(self, gradient, held)
        if calls[0] == 1:
            parts.log_terms += 1e6
        return parts
    monkeypatch.setattr(S.LocalClassRows, "evidence_parts", first_too_high)
    clf = SparseMultiClassGPC(n_inducing=20, max_iter=1, random_state=0, progress=False).fit(X, y)
    assert clf._state.skipped_passes == 1 and calls[0] == 2
    assert not np.any(clf._state.sites.tau_t) and not np.any(clf._state.sites.tau_o)
    _assert_valid_multiclass(clf, X, y)


@pytest.mark.parametrize("multiclass", [False, True], ids=["binary", "multiclass"])
def test_an_interrupt_during_the_set_up_leaves_the_estimator_unfitted(monkeypatch, multiclass):
    """A Ctrl-C in the fit's set-up (Z, the kernels, the first factors), before training starts,
    leaves no classes_, n_features_in_ or history_ behind: the estimator is unfitted."""
    from sklearn.exceptions import NotFittedError

    import gpc
    cls = gpc.SparseMultiClassGPC if multiclass else gpc.SparseGaussianProcessClassifier
    rng = np.random.default_rng(0)
    y = np.arange(90) % (3 if multiclass else 2)
    X = rng.normal(size=(90, 2)) + y[:, None]
    real = cls._start_fit

    def interrupted(self, *args):
        real(self, *args)
        raise KeyboardInterrupt
    monkeypatch.setattr(cls, "_start_fit", interrupted)
    clf = cls(n_inducing=8, max_iter=2, progress=False, random_state=0)
    for start in (clf.fit, clf.partial_fit):
        with pytest.raises(KeyboardInterrupt):
            start(X, y, classes=np.unique(y)) if start == clf.partial_fit else start(X, y)
        for name in ("classes_", "n_features_in_", "history_"):
            assert not hasattr(clf, name), name
        with pytest.raises(NotFittedError):
            clf.predict(X)


def test_a_minibatch_evidence_estimate_above_zero_warns(monkeypatch):
    """A minibatch fit reports the mean of its last epoch's minibatch estimates of log Z; where
    their noise makes it positive (no probability of the labels can be), the fit says so."""
    from gpc.exceptions import ConvergenceWarning

    rng = np.random.default_rng(0)
    y = np.arange(120) % 2
    X = rng.normal(size=(120, 2)) + 2.0 * y[:, None]
    clf = SparseGaussianProcessClassifier(n_inducing=8, batch_size=40, max_iter=2, progress=False,
                                          random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf.fit(X, y)                          # a negative estimate: no warning
    assert clf.log_marginal_likelihood_value_ < 0
    # the estimate as the slow fuzz met it (+10 after epoch 2 of 400 rows in minibatches of 60)
    monkeypatch.setattr(SparseGaussianProcessClassifier, "log_marginal_likelihood_value_",
                        property(lambda self: 10.0))
    with pytest.warns(ConvergenceWarning, match="above 0"):
        clf.fit(X, y)
    with warnings.catch_warnings():            # batch training reports no estimate of this kind
        warnings.simplefilter("error", ConvergenceWarning)
        clf.set_params(batch_size=None, max_iter=2).fit(X, y)
