"""The drop-in path: the public ``log_marginal_likelihood(theta, eval_gradient=True)`` of gpc's
estimator with scikit-learn kernel objects passed in, against scikit-learn's estimator and one
LAPACK dpotrf of the same K (issue 16).

Both estimators run Laplace with the logistic likelihood (scikit-learn's model); cold evaluations
(scikit-learn starts Newton from f = 0, gpc from the mode on every 4th point).  Data: n = 2000
points with 10 standard-normal features and labels from a smooth function of them plus noise
(seeded).  Kernels: an isotropic ``ConstantKernel * RBF`` and an ARD ``RBF`` over the 10 features.
Run: ``python -m pytest bench/bench_dropin.py`` from the repository root; ``GPC_BENCH_THREADS``
sets the BLAS threads of every side (bench/conftest.py, threadpoolctl).
"""

import numpy as np
import pytest
from bench_laplace import record_dpotrf

from gpc import GaussianProcessClassifier

pytest.importorskip("sklearn")
from sklearn.gaussian_process import GaussianProcessClassifier as SkGPC  # noqa: E402
from sklearn.gaussian_process.kernels import RBF, ConstantKernel  # noqa: E402

N = 2000
KERNELS = {
    "iso C*RBF": lambda: ConstantKernel(2.0) * RBF(3.0),
    "ARD RBF d=10": lambda: RBF(np.linspace(2.0, 5.0, 10)),
}


def data(n=N, d=10, seed=16):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    f = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] - 0.3 * X[:, 3:].sum(axis=1)
    y = (f + 0.5 * rng.normal(size=n) > 0).astype(int)
    return X, y


@pytest.mark.parametrize("name", sorted(KERNELS))
def bench_gpc_public_lml(name, record, benchmark):
    benchmark.group = f"dropin {name} n={N}"
    X, y = data()
    kernel = KERNELS[name]()
    ours = GaussianProcessClassifier(kernel=kernel, likelihood="logit", method="laplace",
                                     optimizer=None).fit(X, y)
    record("gpc log_marginal_likelihood(theta, True)",
           lambda: ours.log_marginal_likelihood(kernel.theta, eval_gradient=True))


@pytest.mark.parametrize("name", sorted(KERNELS))
def bench_sklearn_public_lml(name, record, benchmark):
    benchmark.group = f"dropin {name} n={N}"
    X, y = data()
    kernel = KERNELS[name]()
    theirs = SkGPC(kernel=kernel, optimizer=None).fit(X, y)
    record("sklearn log_marginal_likelihood(theta, True)",
           lambda: theirs.log_marginal_likelihood(kernel.theta, eval_gradient=True), rounds=3)


@pytest.mark.parametrize("name", sorted(KERNELS))
def bench_cholesky_baseline(name, record, benchmark):
    benchmark.group = f"dropin {name} n={N}"
    X, _ = data()
    record_dpotrf(record, KERNELS[name]()(X))
