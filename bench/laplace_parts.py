"""Where one Laplace evidence + gradient evaluation spends its time, in units of one dpotrf.

Run: ``python bench/laplace_parts.py [n]`` (from the repository root; default n = 2000).  Each part
is timed on its own (median of 7) in one process with BLAS on one thread, on the data and kernel of
bench_laplace.py; bench/RESULTS.md quotes the table.  Not collected by pytest.
"""

import sys
import time

import numpy as np
from scipy.linalg import lapack
from threadpoolctl import threadpool_limits

from gpc.datasets import load_banana
from gpc.inference import laplace
from gpc.kernels import ConstantKernel, RBF
from gpc.likelihoods import Logit


def median_time(fn, rounds=7):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(n):
    X, y = load_banana(return_X_y=True)
    X, y = X[:n], np.where(y[:n] == y.max(), 1.0, -1.0)
    kernel = ConstantKernel(2.0) * RBF(0.7)
    K = kernel(X)
    likelihood, m0 = Logit(), np.zeros(n)
    A = np.asfortranarray(K + 1e-8 * np.eye(n))
    unit = median_time(lambda: lapack.dpotrf(A.copy(order="F"), lower=True, overwrite_a=True))
    result = laplace.run(K, y, likelihood, m0)
    W = result.posterior.site_precision
    buffer = np.empty((n, n), dtype=np.float32)

    def gradient_matrix():
        result.posterior.L = laplace._factor(K, W)[1]     # a fresh factor for each round
        return result.gradient_matrix()

    M = gradient_matrix()
    factor = median_time(lambda: laplace._factor(K, W))
    parts = {
        "kernel K": median_time(lambda: kernel(X)),
        "subset start": median_time(lambda: laplace._subset_start(K, y, likelihood, m0)),
        "Nystrom Newton matrix (every 8th point)": median_time(lambda: laplace._NystromMatrix(K, W)),
        "float32 factor of B (when Nystrom stops gaining)": median_time(
            lambda: laplace._NewtonMatrix(K, W, buffer)),
        "Newton in all (mode + float64 factor)": median_time(lambda: laplace.run(K, y, likelihood, m0)),
        "float64 factor of B at the mode": factor,
        "gradient matrix (dpotri in place + M pass)": median_time(gradient_matrix) - factor,
        "contraction from K, lower triangle of M": median_time(
            lambda: kernel.gradient_contract(X, M, K=K, symmetric=True)),
    }
    print(f"n = {n}, one dpotrf = {unit * 1e3:.1f} ms")
    for name, seconds in parts.items():
        print(f"  {name:<50} {seconds / unit:5.2f} x dpotrf")


if __name__ == "__main__":
    with threadpool_limits(1):
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
