"""Minibatch SEP at n = 1,000,000, d = 8, m = 200, minibatch 200 (issue 12).

Measured in one process, BLAS pinned to ``GPC_BENCH_THREADS`` threads (default 1, threadpoolctl):

* ``sep steps``: ``STEPS`` minibatch steps of SparseGaussianProcessClassifier's trainer (site
  refinement, q rebuilt, the eq. (6) gradient and an Adadelta step on θ and Z);
* ``blas floor``: for the same minibatches, what any method must do: the kernel block K_bm and one
  b x m x m product (the n·m² of an epoch);

the ratio of the two is the cost of an epoch over its floor (an epoch is n/b such steps).  Peak
memory beyond the data is tracemalloc's peak while the state is made and the steps run.

``python bench/bench_sparse.py`` prints the figures for bench/RESULTS.md; under pytest the two
timings are pytest-benchmark entries of the group "sparse".  ``GPC_BENCH_SPARSE_N`` and
``GPC_BENCH_SPARSE_STEPS`` shrink the run (defaults 1,000,000 and 100).
"""

import os
import time
import tracemalloc

import numpy as np
from threadpoolctl import threadpool_limits

from gpc.kernels import RBF, ConstantKernel
from gpc.likelihoods import get_likelihood
from gpc.sparse._passes import as_block
from gpc.sparse._train import SEPState, minibatch_step, tied_minibatch_step

N = int(os.environ.get("GPC_BENCH_SPARSE_N", "1000000"))
STEPS = int(os.environ.get("GPC_BENCH_SPARSE_STEPS", "100"))
D, M, B = 8, 200, 200
THREADS = int(os.environ.get("GPC_BENCH_THREADS", "1"))


def make_data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, D))
    f = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def new_state(X, n=N, tied=False):
    kernel = ConstantKernel(1.0) * RBF(np.full(D, 2.0))
    return SEPState(kernel, X[:: max(1, n // M)][:M].copy(), n, 1e-8, True, 1.0, tied=tied)


def sep_steps(state, X, y, steps=STEPS):
    lik = get_likelihood("probit")
    for k in range(steps):
        start = k * B
        Xb, yb = as_block(X, start, start + B), y[start:start + B]
        if state.tied:
            tied_minibatch_step(state, lik, Xb, yb, 0.5)
        else:
            minibatch_step(state, lik, Xb, yb, slice(start, start + B), len(y), 0.5)


def blas_floor(state, X, steps=STEPS):
    kernel, Z = state.kernel, state.Z
    W = np.random.default_rng(1).standard_normal((M, M))
    for k in range(steps):
        Kbm = kernel(np.ascontiguousarray(X[k * B:(k + 1) * B]), Z)
        Kbm @ W


def bench_sparse_sep_steps(benchmark, record):
    X, y = make_data()
    state = new_state(X)
    benchmark.group = "sparse"
    record("sep minibatch steps", lambda: sep_steps(state, X, y), rounds=3)


def bench_sparse_blas_floor(benchmark, record):
    X, _ = make_data()
    state = new_state(X)
    benchmark.group = "sparse"
    record("blas floor (K_bm + b m^2 product)", lambda: blas_floor(state, X), rounds=3)


def main():
    X, y = make_data()
    epoch = N / B / STEPS
    print(f"n={N} d={D} m={M} b={B} BLAS threads={THREADS} steps timed={STEPS}")
    with threadpool_limits(THREADS):
        for tied in (False, True):
            tracemalloc.start()
            state = new_state(X, tied=tied)
            sep_steps(state, X, y, 5)                    # warm up
            t = time.perf_counter()
            sep_steps(state, X, y)
            sep = time.perf_counter() - t
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            t = time.perf_counter()
            blas_floor(state, X)
            floor = time.perf_counter() - t
            name = "tied sites" if tied else "per-row sites"
            print(f"[{name}] sep: {sep / STEPS * 1e3:.2f} ms/step, epoch (extrapolated) "
                  f"{sep * epoch:.1f} s; floor: {floor / STEPS * 1e3:.2f} ms/step, epoch "
                  f"{floor * epoch:.1f} s; ratio {sep / floor:.2f}; peak memory beyond the data "
                  f"(tracemalloc) {peak / 2**20:.1f} MiB (data {X.nbytes / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
