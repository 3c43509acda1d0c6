"""Laplace: one log-marginal-likelihood + gradient evaluation, gpc vs scikit-learn vs one dpotrf.

Data: the first n rows of the bundled banana set (real data, 2-D), kernel 2.0 * RBF(0.7), logit.
Run: ``python -m pytest bench/bench_laplace.py`` (from the repository root, with `pip install --group bench`).
"""

import numpy as np
import pytest
from scipy.linalg import lapack

from gpc.datasets import load_banana
from gpc import GaussianProcessClassifier
from gpc.kernels import ConstantKernel, RBF

sklearn = pytest.importorskip("sklearn")
from sklearn.gaussian_process import GaussianProcessClassifier as SkGPC
from sklearn.gaussian_process.kernels import RBF as SkRBF, ConstantKernel as SkC

SIZES = [1000, 2000]


def data(n):
    X, y = load_banana(return_X_y=True)
    return X[:n], y[:n]


@pytest.mark.parametrize("n", SIZES)
def bench_laplace_evidence_and_gradient(n, record, benchmark):
    benchmark.group = f"laplace n={n}"
    X, y = data(n)
    kernel = ConstantKernel(2.0) * RBF(0.7)   # gpc's kernel: gradient by contraction, no tensor
    ours = GaussianProcessClassifier(kernel=kernel, likelihood="logit", method="laplace",
                                     optimizer=None).fit(X, y)
    binary = ours.base_estimators_[0]
    theta = kernel.theta
    # the evaluation an optimiser makes: evidence + gradient at θ, cold start, no extra PD check
    record("gpc laplace lml+grad", lambda: binary._evidence(binary._kernel.clone_with_theta(theta), True))


@pytest.mark.parametrize("n", SIZES)
def bench_laplace_public_api(n, record, benchmark):
    benchmark.group = f"laplace n={n}"
    X, y = data(n)
    kernel = SkC(2.0) * SkRBF(0.7)
    ours = GaussianProcessClassifier(kernel=kernel, likelihood="logit", method="laplace",
                                     optimizer=None).fit(X, y)
    # a scikit-learn kernel passed in unchanged: its gradient tensor is contracted with einsum
    record("gpc log_marginal_likelihood(theta, True), sklearn kernel",
           lambda: ours.log_marginal_likelihood(kernel.theta, eval_gradient=True))


@pytest.mark.parametrize("n", SIZES)
def bench_sklearn_laplace(n, record, benchmark):
    benchmark.group = f"laplace n={n}"
    X, y = data(n)
    kernel = SkC(2.0) * SkRBF(0.7)
    theirs = SkGPC(kernel=kernel, optimizer=None).fit(X, y)
    record("sklearn log_marginal_likelihood(theta, True)",
           lambda: theirs.log_marginal_likelihood(kernel.theta, eval_gradient=True), rounds=3)


@pytest.mark.parametrize("n", SIZES)
def bench_cholesky_baseline(n, record, benchmark):
    benchmark.group = f"laplace n={n}"
    X, _ = data(n)
    record_dpotrf(record, (SkC(2.0) * SkRBF(0.7))(X))


def record_dpotrf(record, K):
    """The baseline: one LAPACK dpotrf of K (jitter 1e-8 on the diagonal)."""
    K.flat[:: K.shape[0] + 1] += 1e-8
    A = np.empty_like(K, order="F")

    def chol():  # includes an n² copy of K into A (~1% of the factorisation at these sizes)
        A[...] = K
        lapack.dpotrf(A, lower=True, overwrite_a=True)

    record("lapack dpotrf", chol, rounds=7)


@pytest.mark.parametrize("n", [1000])
def bench_fit_with_optimizer(n, record, benchmark):
    """Whole type-II ML fit (L-BFGS-B from the same θ0): warm starts across evaluations count here."""
    benchmark.group = f"laplace fit n={n}"
    X, y = data(n)
    record("gpc fit", lambda: GaussianProcessClassifier(kernel=ConstantKernel(1.0) * RBF(1.0),
                                                        likelihood="logit", method="laplace").fit(X, y),
           rounds=3)


@pytest.mark.parametrize("n", [1000])
def bench_sklearn_fit(n, record, benchmark):
    benchmark.group = f"laplace fit n={n}"
    X, y = data(n)
    record("sklearn fit", lambda: SkGPC(kernel=SkC(1.0) * SkRBF(1.0)).fit(X, y), rounds=3)
