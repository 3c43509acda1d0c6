"""The one thread policy (gpc._threads): what every public entry point runs with.

Each estimator is fitted with a kernel that records BLAS's threads whenever the engine evaluates
it, under a caller's limit of two BLAS threads: the policy promises one thread inside every call
of the default size and the caller's limit back afterwards.  Two fits in threads run one after
the other with the bits of serial fits; a dense fit gives the same bits under any caller's limit;
``import gpc`` without threadpoolctl names the missing dependency.
"""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import threadpoolctl
from sklearn.gaussian_process.kernels import RationalQuadratic

import gpc
from gpc import _threads

_SEEN = []


def _blas_threads():
    return {info["num_threads"] for info in threadpoolctl.threadpool_info()
            if info["user_api"] == "blas"}


class RecordingKernel(RationalQuadratic):
    """scikit-learn's RationalQuadratic (not translated: gpc calls it) that records, on every
    evaluation, the calling thread and BLAS's threads at that moment."""

    def __call__(self, X, Y=None, eval_gradient=False):
        _SEEN.append((threading.get_ident(), frozenset(_blas_threads())))
        return super().__call__(X, Y, eval_gradient=eval_gradient)


def _data(n=60, classes=2, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    X = rng.normal(size=(n, 2)) + 2.0 * np.stack([np.cos(y), np.sin(y)], axis=1)
    return X, y


ESTIMATORS = {
    "dense": lambda: gpc.GaussianProcessClassifier(kernel=RecordingKernel(), optimizer=None),
    "multiclass-robust": lambda: gpc.MultiClassGPC(kernel=RecordingKernel(), optimizer=None),
    "multiclass-htpc": lambda: gpc.MultiClassGPC(kernel=RecordingKernel(), optimizer=None,
                                                 model="heavy-tailed"),
    "sparse": lambda: gpc.SparseGaussianProcessClassifier(
        kernel=RecordingKernel(), n_inducing=10, optimize_inducing=False, max_iter=3,
        progress=False, random_state=0),
    "sparse-multiclass": lambda: gpc.SparseMultiClassGPC(
        kernel=RecordingKernel(), n_inducing=6, optimize_inducing=False, max_iter=3,
        progress=False, random_state=0),
}


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_runs_blas_on_the_thread_the_policy_promises(name):
    X, y = _data(classes=3 if "multiclass" in name else 2)
    _SEEN.clear()
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        caller = _blas_threads()
        clf = ESTIMATORS[name]().fit(X, y)
        during_fit = len(_SEEN)
        clf.predict_proba(X[:7])
        clf.score(X, y)
        assert _blas_threads() == caller          # the caller's limit is back after each call
    assert during_fit > 0 and len(_SEEN) > during_fit
    assert {threads for _, threads in _SEEN} == {frozenset({1})}


def test_infer_runs_under_the_policy():
    X, y = _data(n=20)
    K = RationalQuadratic()(X)
    seen = []

    class Spy(gpc.likelihoods.Likelihood):
        """A user's likelihood (quadrature from log_prob) that records BLAS's threads."""

        def log_prob(self, y, f):
            seen.append(frozenset(_blas_threads()))
            return gpc.likelihoods.Probit().log_prob(y, f)

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        gpc.infer(K, 2.0 * y - 1.0, likelihood=Spy(), method="ep", max_iter=3)
        assert _blas_threads() == {2}
    assert seen and set(seen) == {frozenset({1})}


def test_the_dense_engine_takes_the_workers_from_its_size(monkeypatch):
    monkeypatch.setitem(_threads.RULES, "dense", 50)
    X, y = _data(n=60)
    for n_jobs, want in ((2, {2}), (1, {1})):
        _SEEN.clear()
        with threadpoolctl.threadpool_limits(1, user_api="blas"):
            gpc.GaussianProcessClassifier(kernel=RecordingKernel(), optimizer=None,
                                          n_jobs=n_jobs).fit(X, y)
        assert {threads for _, threads in _SEEN} == {frozenset(want)}
    # below the rule's size: one thread whatever n_jobs asks
    monkeypatch.setitem(_threads.RULES, "dense", 61)
    _SEEN.clear()
    gpc.GaussianProcessClassifier(kernel=RecordingKernel(), optimizer=None, n_jobs=2).fit(X, y)
    assert {threads for _, threads in _SEEN} == {frozenset({1})}


def test_concurrent_fits_in_threads_are_pinned_and_give_serial_bits():
    """Two fits started together in two threads: each runs on one BLAS thread (threadpoolctl lets
    only one thread set OpenBLAS's limit, and a fit in a second thread ran on unpinned BLAS
    before) and gives the bits of the same fit made alone in the main thread."""
    X, y = _data(n=80)
    make = ESTIMATORS["sparse"]
    serial = make().fit(X, y).predict_proba(X)
    results, errors = {}, []
    start = threading.Barrier(2)

    def fit(k):
        try:
            start.wait()
            results[k] = make().fit(X, y).predict_proba(X)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    _SEEN.clear()
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        threads = [threading.Thread(target=fit, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors and len(results) == 2
    for out in results.values():
        np.testing.assert_array_equal(out, serial)
    assert _SEEN and {threads for _, threads in _SEEN} == {frozenset({1})}


def test_a_call_waits_while_another_thread_s_call_runs():
    """One public call at a time per process: while a call holds the policy in one thread, a fit
    started in another evaluates nothing; it runs once that call returns."""
    X, y = _data(n=40)
    holding, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold():
        with _threads.entry(1):
            holding.set()
            release.wait(60)

    def fit():
        ESTIMATORS["sparse"]().fit(X, y)
        done.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)
    _SEEN.clear()
    fitter = threading.Thread(target=fit)
    fitter.start()
    fitter.join(1.0)               # the fit, were it not waiting, would evaluate its kernel by now
    assert not _SEEN and not done.is_set()
    release.set()
    holder.join(60)
    fitter.join(120)
    assert done.is_set() and _SEEN


def test_a_public_call_inside_a_call_passes_the_lock():
    """Nested public calls (score calls predict; one-vs-rest problems call infer in the fit's
    worker threads) run inside the outer call's policy instead of waiting for it."""
    X, y = _data(n=45, classes=3)
    clf = gpc.GaussianProcessClassifier(n_jobs=3, optimizer=None).fit(X, y)
    assert clf.score(X, y) > 0.5
    with _threads.entry(2) as outer:
        with _threads.entry(1) as inner:
            assert inner is outer and _threads.resolve_n_jobs(None) == 2


def test_dense_fits_give_the_same_bits_under_any_callers_blas_limit():
    X, y = _data(n=150)
    fits = []
    for limit in (1, 2):
        with threadpoolctl.threadpool_limits(limit, user_api="blas"):
            clf = gpc.GaussianProcessClassifier(method="ep").fit(X, y)
            fits.append((clf.log_marginal_likelihood_value_, clf.predict_proba(X)))
    assert fits[0][0] == fits[1][0]
    np.testing.assert_array_equal(fits[0][1], fits[1][1])


def test_without_threadpoolctl_import_names_the_missing_dependency():
    code = textwrap.dedent("""
        import sys
        sys.modules["threadpoolctl"] = None
        try:
            import gpc
        except ImportError as exc:
            print("ImportError:", exc)
        else:
            print("imported")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ImportError" in out.stdout and "threadpoolctl" in out.stdout
    assert "pip install threadpoolctl" in out.stdout
