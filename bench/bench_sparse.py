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


def main(repeats=3):
    """Times SEP and the floor alternately ``repeats`` times (the minimum of each is reported, so
    a burst of load on a shared machine hits both sides alike), then measures peak memory in a
    separate run: tracemalloc slows every allocation, so it must not be on while timing."""
    X, y = make_data()
    epoch = N / B / STEPS
    print(f"n={N} d={D} m={M} b={B} BLAS threads={THREADS} steps timed={STEPS} "
          f"(min of {repeats} alternating runs)")
    with threadpool_limits(THREADS):
        for tied in (False, True):
            state = new_state(X, tied=tied)
            sep_steps(state, X, y, 5)                    # warm up
            sep, floor = [], []
            for _ in range(repeats):
                state = new_state(X, tied=tied)
                t = time.perf_counter()
                sep_steps(state, X, y)
                sep.append(time.perf_counter() - t)
                t = time.perf_counter()
                blas_floor(state, X)
                floor.append(time.perf_counter() - t)
            sep, floor = min(sep), min(floor)
            tracemalloc.start()
            state = new_state(X, tied=tied)
            sep_steps(state, X, y)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            name = "tied sites" if tied else "per-row sites"
            print(f"[{name}] sep: {sep / STEPS * 1e3:.2f} ms/step, epoch (extrapolated) "
                  f"{sep * epoch:.1f} s; floor: {floor / STEPS * 1e3:.2f} ms/step, epoch "
                  f"{floor * epoch:.1f} s; ratio {sep / floor:.2f}; peak memory beyond the data "
                  f"(tracemalloc) {peak / 2**20:.1f} MiB (data {X.nbytes / 2**20:.0f} MiB)")


def peer(n=20_000, n_test=5_000, epochs=3):
    """SEP against GPyTorch's SVGP (whitened variational strategy, probit Bernoulli likelihood,
    Adam lr 0.01) at equal m, minibatch and epochs; both start from the same k-means Z and
    kernel.  Returns the seconds and test NLL of each.  GPyTorch is a bench-only peer."""
    import torch
    import gpytorch

    from gpc import SparseGaussianProcessClassifier
    from gpc.sparse.estimator import initial_inducing, median_length_scale

    torch.set_num_threads(THREADS)
    X, y = make_data(n + n_test, seed=2)
    Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
    rng = np.random.default_rng(0)
    Z0 = initial_inducing(Xtr, M, "kmeans", rng)
    ell = median_length_scale(Xtr, rng)
    out = {}
    with threadpool_limits(THREADS):
        clf = SparseGaussianProcessClassifier(
            kernel=ConstantKernel(1.0) * RBF(np.full(D, ell)), n_inducing=M, inducing_points=Z0,
            batch_size=B, max_iter=epochs, progress=False, random_state=0)
        t = time.perf_counter()
        clf.fit(Xtr, ytr)
        p = clf.predict_proba(Xte)[:, 1]
        out["sep"] = (time.perf_counter() - t, _nll(p, yte))

        class SVGP(gpytorch.models.ApproximateGP):
            def __init__(self, Z):
                dist = gpytorch.variational.CholeskyVariationalDistribution(Z.shape[0])
                strat = gpytorch.variational.VariationalStrategy(self, Z, dist,
                                                                 learn_inducing_locations=True)
                super().__init__(strat)
                self.mean_module = gpytorch.means.ZeroMean()
                self.covar_module = gpytorch.kernels.ScaleKernel(
                    gpytorch.kernels.RBFKernel(ard_num_dims=D))
                self.covar_module.base_kernel.lengthscale = ell

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                                 self.covar_module(x))

        Xt = torch.tensor(Xtr)
        yt = torch.tensor((ytr > 0).astype(np.float64))
        model = SVGP(torch.tensor(Z0)).double()
        lik = gpytorch.likelihoods.BernoulliLikelihood().double()
        opt = torch.optim.Adam(list(model.parameters()) + list(lik.parameters()), lr=0.01)
        mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
        t = time.perf_counter()
        model.train()
        lik.train()
        order = np.random.default_rng(0)
        for _ in range(epochs):
            for k in order.permutation(n // B):
                sl = slice(k * B, (k + 1) * B)
                opt.zero_grad()
                loss = -mll(model(Xt[sl]), yt[sl])
                loss.backward()
                opt.step()
        model.eval()
        lik.eval()
        with torch.no_grad():
            p = lik(model(torch.tensor(Xte))).mean.numpy()
        out["gpytorch"] = (time.perf_counter() - t, _nll(p, yte))
    return out


def _nll(p, y):
    p = np.clip(np.where(y > 0, p, 1.0 - p), 1e-300, 1.0)
    return float(-np.mean(np.log(p)))


if __name__ == "__main__":
    import sys
    if "--peer" in sys.argv:
        res = peer()
        for k, (sec, nll) in res.items():
            print(f"{k}: {sec:.1f} s, test NLL {nll:.4f}")
        print(f"time ratio sep / gpytorch = {res['sep'][0] / res['gpytorch'][0]:.2f} "
              f"(n = 20,000, m = {M}, b = {B}, 3 epochs, threads = {THREADS})")
    else:
        main()
