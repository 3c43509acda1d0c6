"""Fit time of every method at n = 1000 next to Laplace, EP and a LAPACK Cholesky of the same K.

BLAS pinned to one thread for every side (threadpoolctl; bench/RESULTS.md says why).  Run with
``pytest bench/bench_approx.py`` (``--benchmark-disable`` for a smoke run).  "fit" = one call of
gpc.inference.infer at fixed hyperparameters (the inner loop of type-II maximum likelihood), plus, for
the methods with a gradient, one gradient_matrix() evaluation in a separate benchmark.
"""

import numpy as np
import pytest
from scipy.linalg import lapack
from threadpoolctl import threadpool_limits

from gpc.inference import infer

N = 1000

CASES = [
    ("laplace", "probit"), ("laplace", "logit"),
    ("ep", "probit"), ("ep", "logit"), ("ep:parallel", "probit"),
    ("pl", "probit"), ("pl:parallel", "probit"),
    ("kl", "probit"), ("kl", "logit"),
    ("vb", "probit"), ("vb", "logit"),
    ("mf-ensemble", "probit"), ("mf-naive", "probit"),
    ("online", "probit"), ("online", "logit"),
]


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 5))
    f = np.sin(X[:, 0]) + X[:, 1] - 0.5 * X[:, 2] * X[:, 3]
    y = np.where(f + 0.3 * rng.normal(size=N) > 0, 1.0, -1.0)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    K = 2.0 * np.exp(-0.5 * d2 / 2.0 ** 2) + 1e-8 * np.eye(N)
    return K, y


@pytest.fixture(autouse=True)
def one_thread():
    with threadpool_limits(limits=1):
        yield


def _run(K, y, method, lik):
    name, _, schedule = method.partition(":")
    return infer(K, y, lik, name, schedule=schedule or None)


def test_cholesky_baseline(benchmark, problem, record):
    K, _ = problem
    benchmark.group = f"methods n={N}"
    benchmark.extra_info["threads"] = 1
    record("lapack dpotrf", lambda: lapack.dpotrf(K, lower=True), rounds=5)


@pytest.mark.parametrize("method,lik", CASES)
def test_fit(benchmark, problem, method, lik, record):
    K, y = problem
    benchmark.group = f"methods n={N}"
    benchmark.extra_info.update(threads=1, n=N, method=method, likelihood=lik)
    res = record(f"fit {method} {lik}", lambda: _run(K, y, method, lik), rounds=3)
    benchmark.extra_info.update(n_iter=res.n_iter, converged=res.converged,
                                log_evidence=float(res.log_evidence))


@pytest.mark.parametrize("method,lik", [c for c in CASES if c[0] != "online"])
def test_gradient_matrix(benchmark, problem, method, lik):
    K, y = problem
    res = _run(K, y, method, lik)
    benchmark.group = f"gradient_matrix n={N}"
    benchmark.extra_info.update(threads=1, n=N)
    benchmark.pedantic(res.gradient_matrix, rounds=3, iterations=1)
