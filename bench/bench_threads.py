"""Threads that really overlap: one-vs-rest with ``n_jobs=2`` against ``n_jobs=1`` (issue 16).

The binary problems of a one-vs-rest fit are independent; with the O(n³) LAPACK calls made with
the GIL released (gpc._lapack), two threads should take about half the time of one on two free
cores, BLAS pinned to one thread per call so that the threads, not BLAS, use the cores.

Data: bench_dropin's n x 10 inputs with four classes (quartiles of the latent function), the
public path ``GaussianProcessClassifier(kernel, method=..., optimizer=None, n_jobs=...)``.
Run: ``python bench/bench_threads.py [n] [--methods laplace ep]``; prints the minimum of
``--repeats`` cold fits per setting and the ratio n_jobs=2 / n_jobs=1.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from bench_dropin import data  # noqa: E402
from gpc import GaussianProcessClassifier  # noqa: E402
from gpc.kernels import RBF, ConstantKernel  # noqa: E402


def four_classes(n):
    X, _ = data(n)
    f = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] - 0.3 * X[:, 3:].sum(axis=1)
    return X, np.searchsorted(np.quantile(f, [0.25, 0.5, 0.75]), f)


def best_fit_seconds(X, y, method, n_jobs, repeats):
    times = []
    for _ in range(repeats):
        est = GaussianProcessClassifier(kernel=ConstantKernel(2.0) * RBF(3.0), method=method,
                                        optimizer=None, n_jobs=n_jobs)
        t0 = time.perf_counter()
        est.fit(X, y)
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=1500)
    ap.add_argument("--methods", nargs="+", default=["laplace", "ep"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    X, y = four_classes(args.n)
    print(f"n = {args.n}, 4 classes one-vs-rest, BLAS threads per call = 1, cores = {os.cpu_count()}")
    with threadpool_limits(1):
        for method in args.methods:
            one = best_fit_seconds(X, y, method, 1, args.repeats)
            two = best_fit_seconds(X, y, method, 2, args.repeats)
            print(f"{method:<8} n_jobs=1 {one:7.2f} s   n_jobs=2 {two:7.2f} s   ratio {two / one:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
