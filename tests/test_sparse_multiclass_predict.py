"""SparseMultiClassGPC.predict_proba in row blocks: the same probabilities, bounded memory.

RMGPC eq. (19)'s Gauss–Hermite rule holds two (rows, C, C, 64) float64 arrays; for all rows at
once that was 2.5 MB a row at C = 50 (25 GB for 10,000 rows).  The estimator predicts blocks of
rows sized to gpc.multiclass.sparse_estimator.PREDICT_BYTES.
"""

import tracemalloc

import numpy as np

import gpc.multiclass.sparse_estimator as E
from gpc import SparseMultiClassGPC
from gpc.multiclass.predict import argmax_probabilities


def _fit(C, n_per_class=30, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2, (C, 3))
    y = np.repeat(np.arange(C), n_per_class)
    X = centres[y] + rng.normal(size=(len(y), 3))
    clf = SparseMultiClassGPC(n_inducing=6, max_iter=3, label_noise=0.02, random_state=0,
                              progress=False).fit(X, y)
    return clf, lambda n: centres[rng.integers(0, C, n)] + rng.normal(size=(n, 3))


def _unblocked(clf, X):
    rho, C = clf.outlier_rate_, len(clf.classes_)
    return rho / C + (1.0 - rho) * argmax_probabilities(*clf.predict_latent(X))


def test_blocked_predictions_equal_the_unblocked_ones(monkeypatch):
    """The argmax integrals in blocks of 7 rows equal one call over all 500 rows bit for bit (each
    row's rule is its own elementwise arithmetic), and so does the default blocking at C = 6.
    With blocks of a few rows for the latent moments too (PREDICT_BYTES of 20 kB: 17 rows), the
    probabilities agree to 1e-13: the whitening's BLAS products of another shape round
    differently (measured: a few 1e-15 in the means and the probabilities)."""
    clf, draw = _fit(6)
    X = draw(500)
    whole = _unblocked(clf, X)
    np.testing.assert_array_equal(clf.predict_proba(X), whole)
    with monkeypatch.context() as patch:
        patch.setattr(E, "proba_block_rows", lambda C: 7)
        np.testing.assert_array_equal(clf.predict_proba(X), whole)
    with monkeypatch.context() as patch:
        patch.setattr(E, "PREDICT_BYTES", 20_000)
        assert E.latent_block_rows(clf._state) == 17 and E.proba_block_rows(6) == 1
        np.testing.assert_allclose(clf.predict_proba(X), whole, rtol=1e-13, atol=1e-15)


def test_predict_proba_temporaries_stay_within_the_block_budget(monkeypatch):
    """At C = 12 on 800 rows the unblocked rule held two (800, 12, 12, 64) arrays, 2 x 56 MiB
    (tracemalloc peak 127 MiB).  With a budget of 4 MiB per block the peak of everything
    predict_proba allocates stays below 2 budgets + 1 MiB: the latent block and the rule's
    block are each sized to the budget (the per-row sizes are upper estimates) and overlap only
    by the block's (rows, C) moments; the (800, 12) result is 75 kB."""
    clf, draw = _fit(12, n_per_class=15)
    X = draw(800)
    budget = 4 * 2 ** 20
    monkeypatch.setattr(E, "PREDICT_BYTES", budget, raising=False)
    clf.predict_proba(X[:10])              # imports and first-call caches outside the count
    tracemalloc.start()
    try:
        proba = clf.predict_proba(X)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert proba.shape == (800, 12)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert peak < 2 * budget + 2 ** 20, peak / 2 ** 20
