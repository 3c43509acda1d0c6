"""Pieces shared by the SEP paper's experiments (``sep-table1``, ``sep-banana``, ``sep-image``, …).

The SEP paper (Hernández-Lobato & Hernández-Lobato 2016) §4 compares its scalable EP ("SEP",
``method="ep"`` of :class:`gpc.SparseGaussianProcessClassifier`) with GFITC and SVI on the same
inducing geometry: "all hyper-parameters (including the inducing points) are set to the same initial
values in each method", the kernel is a squared exponential with automatic relevance determination,
an amplitude and an additive noise, and the initial inducing points are random training rows.
"""

import time

import numpy as np

from ..kernels import RBF, ConstantKernel, WhiteKernel
from ..sparse.estimator import SparseGaussianProcessClassifier
# the docs' tables, for the SEP experiments that import them from here
from .publish import (add_doc_arguments, markdown_table, publish_doc_tables,  # noqa: F401
                      read_records, replace_blocks)

#: the paper's method labels -> the estimator's ``method``
METHODS = {"gfitc": "gfitc", "sep": "ep", "svi": "svi"}

#: initial amplitude σ², noise σ₀² and length-scale factor (ℓ_j = factor · √d on standardised inputs);
#: the paper gives no values, only that every method starts from the same ones
AMPLITUDE0, NOISE0, LENGTH_FACTOR0 = 1.0, 0.01, 1.0


def ard_kernel(d, length_scale=None):
    """σ² exp(−½ Σ_j (x_j − x'_j)²/ℓ_j²) + σ₀² δ (SEP §4.1), from σ² = 1, σ₀² = 0.01 and every ℓ_j
    = ``length_scale`` (default √d, the typical distance of standardised inputs)."""
    ell = LENGTH_FACTOR0 * np.sqrt(d) if length_scale is None else float(length_scale)
    return (ConstantKernel(AMPLITUDE0, (1e-3, 1e3))
            * RBF(np.full(d, ell), (1e-2, 1e3))
            + WhiteKernel(NOISE0, (1e-6, 1e1)))


def random_rows(n, m, seed):
    """m distinct row indices, seeded: the common initial inducing points of all methods."""
    return np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False))


def make_classifier(method, Z, max_iter, seed, batch_size=None, validation_data=None, kernel=None):
    """The sparse classifier of the paper's ``method`` ("gfitc", "sep" or "svi") from inducing
    points Z, ARD kernel (unless ``kernel`` is given), probit likelihood."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return SparseGaussianProcessClassifier(
        kernel=ard_kernel(Z.shape[1]) if kernel is None else kernel, n_inducing=len(Z),
        inducing_points=Z, method=METHODS[method], likelihood="probit", batch_size=batch_size,
        max_iter=max_iter, validation_data=validation_data, progress=False, random_state=seed)


def predictive_scores(proba_positive, y_pm1):
    """(error, mean negative log-likelihood) of P(y = +1) against ±1 labels."""
    p_true = np.clip(np.where(y_pm1 > 0, proba_positive, 1.0 - proba_positive), 1e-300, 1.0)
    error = float(np.mean(np.where(proba_positive > 0.5, 1.0, -1.0) != y_pm1))
    return error, float(-np.mean(np.log(p_true)))


def trivial_nll(y_train, y_test):
    """Test NLL of the constant predictor P(y = +1) = the training fraction of +1 (a floor that
    any classifier worth its fit must beat)."""
    p = np.clip(np.mean(y_train > 0), 1e-3, 1 - 1e-3)
    return predictive_scores(np.full(len(y_test), p), y_test)[1]


def timed_fit(clf, X, y):
    """Fit; returns (CPU seconds, wall seconds).

    The CPU time (``time.process_time``: this process, one BLAS thread in the experiments) is what
    the fit costs, however busy the machine; the wall time also counts the waits for a core."""
    cpu, wall = time.process_time(), time.perf_counter()
    clf.fit(X, y)
    return time.process_time() - cpu, time.perf_counter() - wall


#: the divergence guard: an epoch whose log Z_q rises by more than JUMP_FACTOR times the largest rise
#: of the previous JUMP_WINDOW epochs (and by more than 1 nat) is a breakdown, not progress
JUMP_FACTOR, JUMP_WINDOW = 5.0, 10


def broken(objectives):
    """Whether the last of the per-epoch log Z_q values marks a breakdown of SEP's EP state: not
    finite, above 0 (the evidence of binary labels is a probability), or a jump (JUMP_FACTOR)."""
    last = objectives[-1]
    if not (np.isfinite(last) and last <= 0.0):
        return True
    if len(objectives) <= JUMP_WINDOW + 1:
        return False
    rises = np.diff(objectives[-JUMP_WINDOW - 2:])
    return bool(rises[-1] > max(1.0, JUMP_FACTOR * np.max(np.abs(rises[:-1]))))


def first_breakdown(objectives):
    """The 1-based epoch of the first breakdown (:func:`broken` on the epochs up to it), or None."""
    for k in range(1, len(objectives) + 1):
        if broken(objectives[:k]):
            return k
    return None


def fit_with_divergence_guard(clf, X, y, iterations):
    """Batch SEP for ``iterations`` epochs, and if its log Z_q broke down (:func:`broken`) at epoch
    k, fit again for the k - 1 epochs before it; returns (classifier, CPU seconds, wall seconds,
    k or None).

    Batch SEP is deterministic (every pass sees all rows in order, Z is given), so the second fit
    retraces the first k - 1 epochs exactly; its times are the ones returned.  Why the guard: an EP
    state that breaks down shows as log Z_q (SEP eq. (3)) jumping and turning positive while the
    posterior mean runs away (docs/reproduction.md, SEP section); the guard stops the fit before
    that epoch, and the records count it.
    """
    clf.set_params(max_iter=iterations)
    cpu, wall = timed_fit(clf, X, y)
    k = first_breakdown([h["objective"] for h in clf.history_])
    if k is None:
        return clf, cpu, wall, None
    if k == 1:
        raise ArithmeticError(f"SEP's log Z_q is {clf.history_[0]['objective']} after its first "
                              "epoch")
    clf.set_params(max_iter=k - 1)
    cpu, wall = timed_fit(clf, X, y)
    return clf, cpu, wall, k


def train(method, clf, X, y, iterations):
    """Fit ``clf`` (made by :func:`make_classifier`): batch SEP under the divergence guard, GFITC
    and SVI by one ``fit``; returns (classifier, CPU seconds, wall seconds, epoch SEP broke down
    or None)."""
    if method == "sep" and clf.batch_size is None:
        return fit_with_divergence_guard(clf, X, y, iterations)
    return (clf, *timed_fit(clf, X, y), None)
