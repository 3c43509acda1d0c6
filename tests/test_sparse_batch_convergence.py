"""Batch EP at fixed parameters reaches its fixed point: at Z = X the exact model's.

With Z = X, no jitter and a fixed kernel the sparse model is the exact one (multi-class:
docs/derivations-sparse-multiclass.md §1; binary: SEP §2 with Q = K), so a batch fit that has
converged predicts as ``MultiClassGPC(optimizer=None)`` / the exact EP classifier.  Plain damped
passes need thousands of passes here (their slowest mode contracts by ~0.99 a pass); the
Anderson-accelerated passes (gpc.sparse.core.steps.SiteAnderson) must get there within 200.
"""

import numpy as np
import pytest

from gpc import GaussianProcessClassifier, MultiClassGPC, SparseGaussianProcessClassifier
from gpc import SparseMultiClassGPC
from gpc.datasets import smgpc_split
from gpc.kernels import RBF
from gpc.sparse import base
from gpc.sparse.core import steps

#: the agreement asked of predictive probabilities, and the passes allowed to reach it
MATCH, PASSES = 1e-6, 200
#: training rows kept of split 0 (the first ones; X standardised by them), and each set's RBF ℓ
SETS = {"glass": (60, 1.0), "new-thyroid": (80, 1.7)}


def _split(name, n):
    Xtr, ytr, Xte, _ = smgpc_split(name, 0)
    Xtr, ytr = Xtr[:n], ytr[:n]
    mu, sd = Xtr.mean(axis=0), Xtr.std(axis=0)
    return (Xtr - mu) / sd, ytr, (Xte - mu) / sd


def _sparse_multiclass(X, ell, max_iter):
    return SparseMultiClassGPC(kernel=RBF(ell, "fixed"), n_inducing=len(X), inducing_points=X,
                               optimize_inducing=False, jitter=0.0, batch_size=None,
                               max_iter=max_iter, progress=False)


@pytest.mark.parametrize("name", sorted(SETS))
def test_batch_ep_at_z_equals_x_reaches_the_exact_robust_model(name):
    n, ell = SETS[name]
    X, y, Xs = _split(name, n)
    exact = MultiClassGPC(kernel=RBF(ell), optimizer=None, tol=1e-10, max_iter=5000).fit(X, y)
    sparse = _sparse_multiclass(X, ell, PASSES).fit(X, y)
    diff = np.max(np.abs(sparse.predict_proba(Xs) - exact.predict_proba(Xs)))
    assert diff <= MATCH
    assert abs(sparse.log_marginal_likelihood_value_
               - exact.log_marginal_likelihood_value_) <= MATCH
    # max_iter="auto" stops on its own once the sites settle, within the passes above, there
    auto = _sparse_multiclass(X, ell, "auto").fit(X, y)
    assert auto.n_iter_ < PASSES
    assert np.max(np.abs(auto.predict_proba(Xs) - exact.predict_proba(Xs))) <= MATCH
    assert auto._state.mismatch < base.AUTO_SITE_TOL


def test_plain_passes_have_not_converged_in_as_many(monkeypatch):
    """The check above can fail: the plain damped passes, as many as the accelerated fit ran to
    settle, end far from the exact model."""
    n, ell = SETS["new-thyroid"]
    X, y, Xs = _split("new-thyroid", n)
    exact = MultiClassGPC(kernel=RBF(ell), optimizer=None, tol=1e-10, max_iter=5000).fit(X, y)
    passes = _sparse_multiclass(X, ell, "auto").fit(X, y).n_iter_
    monkeypatch.setattr(steps, "ANDERSON_MEMORY", 0)
    sparse = _sparse_multiclass(X, ell, passes).fit(X, y)
    assert np.max(np.abs(sparse.predict_proba(Xs) - exact.predict_proba(Xs))) > 10 * MATCH


def test_binary_batch_ep_at_z_equals_x_reaches_the_exact_model():
    """The binary model goes through the same core: at Z = X, a fixed kernel, its batch fit is
    the exact EP classifier's posterior."""
    X, y, Xs = _split("new-thyroid", 80)
    y = (y == np.unique(y)[-1]).astype(int)      # one class against the others
    exact = GaussianProcessClassifier(kernel=RBF(1.7), optimizer=None, tol=1e-12,
                                      max_iter=5000).fit(X, y)
    sparse = SparseGaussianProcessClassifier(kernel=RBF(1.7, "fixed"), n_inducing=len(X),
                                             inducing_points=X, optimize_inducing=False,
                                             jitter=0.0, batch_size=None, max_iter="auto",
                                             progress=False).fit(X, y)
    assert sparse.n_iter_ < PASSES
    np.testing.assert_allclose(sparse.predict_proba(Xs), exact.predict_proba(Xs), rtol=0,
                               atol=MATCH)
