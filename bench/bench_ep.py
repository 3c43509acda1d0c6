"""EP: one sequential sweep (blocked and plain) and a converged parallel EP, against one dpotrf.

Data: the first n rows of the bundled banana set, kernel 2.0 * RBF(0.7), probit.  Timed: the
inference itself (``check_kernel=False``: the PD check of K is one extra dpotrf that a caller
evaluating a checked kernel skips).  Run: ``python -m pytest bench/bench_ep.py``.
"""

import numpy as np
import pytest
from scipy.linalg import lapack

from gpc.datasets import load_banana
from gpc.inference import infer
from gpc.kernels import ConstantKernel, RBF

SIZES = [1000, 2000, 4000]


def problem(n):
    X, y = load_banana(return_X_y=True)
    X, y = X[:n], y[:n]
    return (ConstantKernel(2.0) * RBF(0.7))(X), np.where(y == np.unique(y)[1], 1.0, -1.0)


@pytest.mark.parametrize("n", SIZES)
def bench_dpotrf(n, record, benchmark):
    benchmark.group = f"ep n={n}"
    K, _ = problem(n)
    K.flat[:: n + 1] += 1e-8
    A = np.empty_like(K, order="F")

    def chol():
        A[...] = K
        lapack.dpotrf(A, lower=True, overwrite_a=True)

    record("lapack dpotrf", chol, rounds=5)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block", [64, 1])
def bench_one_sequential_sweep(n, block, record, benchmark):
    benchmark.group = f"ep n={n}"
    K, y = problem(n)
    label = "gpc EP 1 sequential sweep, " + ("blocked (64)" if block > 1 else "plain rank-one")
    record(label, lambda: infer(K, y, likelihood="probit", method="ep", max_iter=1, block=block,
                                tol=1e-300, check_kernel=False), rounds=3 if n < 4000 else 1)


@pytest.mark.parametrize("n", SIZES)
def bench_parallel_converged(n, record, benchmark):
    benchmark.group = f"ep n={n}"
    K, y = problem(n)
    record("gpc EP parallel, converged to 1e-6",
           lambda: infer(K, y, likelihood="probit", method="ep", schedule="parallel", tol=1e-6,
                         check_kernel=False), rounds=3 if n < 4000 else 1)
