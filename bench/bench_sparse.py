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

from gpc import _lapack, _sparse
from gpc.kernels import RBF, ConstantKernel
from gpc.likelihoods import get_likelihood
from gpc.sparse.core.passes import as_block, block_ranges
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


def sep_steps(state, X, y, steps=STEPS, first=0):
    lik = get_likelihood("probit")
    for k in range(first, first + steps):
        start = (k * B) % (len(y) - B + 1)
        Xb, yb = as_block(X, start, start + B), y[start:start + B]
        if state.tied:
            tied_minibatch_step(state, lik, Xb, yb, 0.5)
        else:
            minibatch_step(state, lik, Xb, yb, slice(start, start + B), len(y), 0.5)


class Floor:
    """What any method must do per minibatch: the kernel block K_bm (the same routine the step
    uses) and one b x m x m product (scipy's dgemm, the step's BLAS): an epoch is n/b of these."""

    def __init__(self):
        self.W = np.random.default_rng(1).standard_normal((B, M))
        self.out = np.empty((M, M))

    def steps(self, state, X, steps=STEPS, first=0):
        factor = state.factor
        for k in range(first, first + steps):
            start = (k * B) % (len(X) - B + 1)
            Kbm = factor.cross(as_block(X, start, start + B))
            _lapack.transpose_times(Kbm, self.W, self.out)


class StepBLAS:
    """The BLAS and LAPACK calls of one minibatch step (rows seen before), with its shapes, and
    nothing else: the sequence of :func:`gpc.sparse._train.minibatch_step` (docs/sparse.md, "One
    minibatch step").  Timing it alone gives the step's BLAS time; the rest of a step is the
    site algebra, the likelihood, the kernel's exp and Python."""

    def __init__(self):
        rng = np.random.default_rng(2)
        self.K = np.ascontiguousarray(rng.random((B, M)))
        self.W = np.empty((2 * B, M))
        self.Bm, self.Bo, self.Y, self.work = (np.empty((B, M)) for _ in range(4))
        self.scaled = np.empty((2 * B, M))
        S = rng.standard_normal((M, M))
        self.P0 = S @ S.T / M + np.eye(M)
        self.L = np.linalg.cholesky(self.P0)
        self.Li = np.linalg.inv(self.L)
        self.P, self.R, self.S, self.T, self.C = (np.empty((M, M)) for _ in range(5))
        self.w = np.concatenate([rng.random(B), -rng.random(B)])
        self.h, self.v, self.mb, self.mb2 = np.zeros(M), np.empty(M), np.empty(B), np.empty(2 * B)
        self.Xs, self.Zs = rng.standard_normal((B, D)), rng.standard_normal((M, D))

    def steps(self, steps=STEPS):
        for _ in range(steps):
            self.one()

    def _posterior(self, R):
        _lapack.cholesky_in_place(R)
        _lapack.lower_inverse_in_place(R)
        _lapack.rows_dot(R, self.h, self.v)
        _lapack.add_transpose_dot(R, self.v, self.h)

    def one(self):
        W, Bm, Bo, Y, P, R, S, T, Li, L = (self.W, self.Bm, self.Bo, self.Y, self.P, self.R,
                                           self.S, self.T, self.Li, self.L)
        A, A_old = W[:B], W[B:]
        self.Xs @ self.Zs.T                                  # K_bu's Gram part
        np.copyto(A, self.K)
        _lapack.multiply_triangular_rows(Li, A, False)   # whitening, a = L⁻¹k
        np.copyto(A_old, self.K)
        _lapack.multiply_triangular_rows(L, A_old, True)   # the sites' directions a' = Lᵀv
        np.copyto(Bm, A)
        _lapack.multiply_triangular_rows(Li, Bm, False)   # cavity marginals: R⁻¹a
        np.copyto(Bo, A_old)
        _lapack.multiply_triangular_rows(Li, Bo, False)   # and R⁻¹a'
        _lapack.rows_dot(A, self.h, self.mb)
        _lapack.rows_dot(A_old, self.h, self.mb)
        np.copyto(P, self.P0)
        _lapack.add_weighted_gram(P, W, self.w, self.scaled)  # swap the sites: two dsyrk
        _lapack.add_transpose_dot(W, self.w, self.h)
        np.copyto(R, self.P0)
        self._posterior(R)                                   # the new q
        np.copyto(Y, A)
        _lapack.multiply_triangular_rows(Li, Y, True)   # the new directions v = L⁻ᵀa
        np.copyto(Bm, A)
        _lapack.multiply_triangular_rows(Li, Bm, False)   # marginals at the new q
        _lapack.rows_dot(A, self.h, self.mb)
        _lapack.multiply_triangular_rows(Li, Bm, True)   # A Σ
        _lapack.transpose_times(Y, A, S)                     # Yᵀ A
        _lapack.multiply_triangular_rows(Li, Bm, True)   # G L⁻¹
        Bm @ self.Zs, Bm.T @ self.Xs                         # its contraction's products
        _lapack.lower_gram(Li, self.C)                       # Σ for the prior term
        _lapack.congruence(Li, S)                            # L⁻ᵀ G L⁻¹
        S @ self.Zs, S.T @ self.Zs                           # its contraction's products
        self.Zs @ self.Zs.T                                  # K_uu's Gram part
        np.copyto(T, self.P0)
        _lapack.cholesky_in_place(T)                         # K_uu's factor
        _lapack.lower_inverse_in_place(T)                    # and its inverse
        np.copyto(T, L)
        _sparse.lower_times(Li, T)                           # M = L⁻¹ L'
        np.copyto(S, P)
        _lapack.congruence(T, S)                             # Mᵀ (P - I) M
        _lapack.rows_dot(T, self.h, self.v)                  # Mᵀ h
        np.copyto(R, self.P0)
        self._posterior(R)                                   # the moved q


def bench_sparse_sep_steps(benchmark, record):
    X, y = make_data()
    state = new_state(X)
    benchmark.group = "sparse"
    record("sep minibatch steps", lambda: sep_steps(state, X, y), rounds=3)


def bench_sparse_blas_floor(benchmark, record):
    X, _ = make_data()
    state = new_state(X)
    floor = Floor()
    benchmark.group = "sparse"
    record("blas floor (K_bm + b m^2 product)", lambda: floor.steps(state, X), rounds=3)


def measure(X, y, tied=False, repeats=5, steps=STEPS):
    """Seconds per step of SEP, of the floor and of the step's BLAS calls alone, alternating in
    chunks of ``steps`` steps ``repeats`` times: (min of each, median of the per-round ratios
    step/floor and step/BLAS).  The state keeps training across rounds."""
    state = new_state(X, tied=tied)
    floor, blas = Floor(), StepBLAS()
    # a first pass over the rows to be timed: the timed steps meet sites q already holds, as
    # every epoch after the first does (the first skips removing old sites)
    sep_steps(state, X, y, 5 + repeats * steps)
    sep_steps(state, X, y, 5)                                 # warm up
    floor.steps(state, X, 5)
    blas.steps(5)
    times = {"sep": [], "floor": [], "blas": [], "sep_cpu": [], "floor_cpu": []}
    for r in range(repeats):
        first = 5 + r * steps
        c, t = time.process_time(), time.perf_counter()
        sep_steps(state, X, y, steps, first)
        times["sep"].append(time.perf_counter() - t)
        times["sep_cpu"].append(time.process_time() - c)
        c, t = time.process_time(), time.perf_counter()
        floor.steps(state, X, steps, first)
        times["floor"].append(time.perf_counter() - t)
        times["floor_cpu"].append(time.process_time() - c)
        t = time.perf_counter()
        blas.steps(steps)
        times["blas"].append(time.perf_counter() - t)
    per = {k: min(v) / steps for k, v in times.items()}
    ratios = {"floor": float(np.median(np.array(times["sep"]) / np.array(times["floor"]))),
              "blas": float(np.median(np.array(times["sep"]) / np.array(times["blas"]))),
              "floor_cpu": float(np.median(np.array(times["sep_cpu"])
                                           / np.array(times["floor_cpu"])))}
    return per, ratios


def main(repeats=5):
    """Times SEP, the floor and the step's BLAS alone alternately ``repeats`` times, then measures
    peak memory in a separate run: tracemalloc slows every allocation, so it must not be on while
    timing."""
    X, y = make_data()
    epoch = N / B
    print(f"n={N} d={D} m={M} b={B} BLAS threads={THREADS} steps timed={STEPS} x {repeats} "
          f"alternating rounds; load average {os.getloadavg()[0]:.1f}")
    with threadpool_limits(THREADS):
        for tied in (False, True):
            per, ratios = measure(X, y, tied, repeats)
            tracemalloc.start()
            state = new_state(X, tied=tied)
            sep_steps(state, X, y)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            name = "tied sites" if tied else "per-row sites"
            print(f"[{name}] step {per['sep'] * 1e3:.2f} ms (epoch {per['sep'] * epoch:.0f} s), "
                  f"floor {per['floor'] * 1e3:.2f} ms, the step's BLAS alone "
                  f"{per['blas'] * 1e3:.2f} ms; (a) step / floor {ratios['floor']:.2f} "
                  f"(CPU time {ratios['floor_cpu']:.2f}), (b) step / its BLAS "
                  f"{ratios['blas']:.2f}; peak memory beyond the data (tracemalloc) "
                  f"{peak / 2**20:.1f} MiB (data {X.nbytes / 2**20:.0f} MiB)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def peer_problem(n=1_000_000, n_test=10_000):
    """The peer comparison's data: (Xtr, ytr, Xte, yte, Z0, ell), n training and n_test held-out
    rows of :func:`make_data` (seed 2), Z0 by k-means and ell the median heuristic, both from the
    training rows with the estimator's own routines (seed 0)."""
    from gpc.sparse.estimator import initial_inducing, median_length_scale

    X, y = make_data(n + n_test, seed=2)
    Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
    rng = np.random.default_rng(0)
    Z0 = initial_inducing(Xtr, M, "kmeans", rng)
    ell = median_length_scale(Xtr, rng)
    return Xtr, ytr, Xte, yte, Z0, ell


def sep_fit(Xtr, ytr, Z0, ell, batch, epochs=1, n_jobs=1, **options):
    """SparseGaussianProcessClassifier (defaults: Adadelta, ρ 0.9, ε 1e-5, per SEP §3) from Z0 and
    the ARD kernel ConstantKernel(1) · RBF(ell), minibatches of ``batch`` rows, ``epochs``
    epochs, ``n_jobs`` threads: (fitted estimator, wall seconds, CPU seconds) of ``fit``."""
    from gpc import SparseGaussianProcessClassifier

    clf = SparseGaussianProcessClassifier(
        kernel=ConstantKernel(1.0) * RBF(np.full(Xtr.shape[1], ell)), n_inducing=len(Z0),
        inducing_points=Z0, batch_size=batch, max_iter=epochs, progress=False, random_state=0,
        n_jobs=n_jobs, **options)
    c, t = time.process_time(), time.perf_counter()
    clf.fit(Xtr, ytr)
    return clf, time.perf_counter() - t, time.process_time() - c


def svgp_model(Z, ell, natural=False):
    """GPyTorch's SVGP on inducing inputs Z (a torch tensor): the whitened ``VariationalStrategy``
    (Z learnt) over a ``CholeskyVariationalDistribution``, or a ``NaturalVariationalDistribution``
    for natural-gradient training, zero mean, ``ScaleKernel(RBFKernel(ARD))`` at length scale
    ``ell``."""
    import gpytorch

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            m, d = Z.shape
            dist = (gpytorch.variational.NaturalVariationalDistribution(m) if natural else
                    gpytorch.variational.CholeskyVariationalDistribution(m))
            super().__init__(gpytorch.variational.VariationalStrategy(
                self, Z, dist, learn_inducing_locations=True))
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=d))
            self.covar_module.base_kernel.lengthscale = ell

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                             self.covar_module(x))

    return SVGP()


def gpytorch_fit(Xtr, ytr, Xte, Z0, ell, batch, epochs=1, threads=1, device="cpu",
                 dtype="float64"):
    """GPyTorch's SVGP classifier (a bench-only peer, never a dependency of gpc):
    ``ApproximateGP`` with the whitened ``VariationalStrategy``, a
    ``CholeskyVariationalDistribution``, ``ScaleKernel(RBFKernel(ARD))``, the probit
    ``BernoulliLikelihood``, ``VariationalELBO`` and Adam (lr 0.01, its examples' choice), from
    Z0 and ell, minibatches of ``batch`` rows in the estimator's order (seed 0), on ``device``
    ("cpu" with ``threads`` threads, or "cuda") in ``dtype``.  Returns (test probabilities,
    training wall seconds, training CPU seconds): the clock starts after one untimed forward and
    backward pass (start-up) and, on CUDA, stops after a final synchronisation."""
    import torch
    import gpytorch

    torch.set_num_threads(threads)
    tdtype = getattr(torch, dtype)
    n = Xtr.shape[0]

    Xt = torch.tensor(Xtr, dtype=tdtype, device=device)
    yt = torch.tensor((ytr > 0).astype(np.float64), dtype=tdtype, device=device)
    model = svgp_model(torch.tensor(Z0, dtype=tdtype), ell).to(device=device, dtype=tdtype)
    lik = gpytorch.likelihoods.BernoulliLikelihood().to(device=device, dtype=tdtype)
    opt = torch.optim.Adam(list(model.parameters()) + list(lik.parameters()), lr=0.01)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
    blocks = len(block_ranges(n, batch))
    order = np.random.default_rng(0)          # the estimator's minibatch order (same seed)
    model.train()
    lik.train()
    # one forward and backward pass before the clock starts (library and device start-up; no
    # optimiser step, so the run itself is unchanged)
    (-mll(model(Xt[:batch]), yt[:batch])).backward()
    opt.zero_grad()
    if device != "cpu":
        torch.cuda.synchronize()
    c, t = time.process_time(), time.perf_counter()
    for _ in range(epochs):
        for k in order.permutation(blocks):
            sl = slice(k * batch, min((k + 1) * batch, n))
            opt.zero_grad()
            loss = -mll(model(Xt[sl]), yt[sl])
            loss.backward()
            opt.step()
    if device != "cpu":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    model.eval()
    lik.eval()
    with torch.no_grad():
        p = lik(model(torch.tensor(Xte, dtype=tdtype, device=device))).mean.cpu().numpy()
    return p.astype(np.float64), wall, cpu


def peer(n=1_000_000, n_test=10_000, epochs=1):
    """SEP against GPyTorch's SVGP classifier at equal m, minibatch and epochs (both 1 thread).

    Both start from the same k-means Z and median-heuristic length scale, see the same
    minibatches in the same order, and are scored on the same held-out rows
    (:func:`peer_problem`, :func:`sep_fit`, :func:`gpytorch_fit`).  Returns {name: (training
    seconds, training CPU seconds, test NLL, test error)}."""
    Xtr, ytr, Xte, yte, Z0, ell = peer_problem(n, n_test)
    out = {}
    with threadpool_limits(THREADS):
        clf, wall, cpu = sep_fit(Xtr, ytr, Z0, ell, B, epochs, n_jobs=THREADS)
        p = clf.predict_proba(Xte)[:, 1]
        out["sep"] = (wall, cpu, _nll(p, yte), float(np.mean((p > 0.5) != (yte > 0))))
        print(f"sep: {wall:.1f} s ({cpu:.1f} s CPU), test NLL {out['sep'][2]:.4f}, kernel "
              f"{clf.kernel_}", flush=True)
        p, wall, cpu = gpytorch_fit(Xtr, ytr, Xte, Z0, ell, B, epochs, threads=THREADS)
        out["gpytorch"] = (wall, cpu, _nll(p, yte), float(np.mean((p > 0.5) != (yte > 0))))
        print(f"gpytorch: {wall:.1f} s ({cpu:.1f} s CPU), test NLL {out['gpytorch'][2]:.4f}",
              flush=True)
    return out


def _nll(p, y):
    p = np.clip(np.where(y > 0, p, 1.0 - p), 1e-300, 1.0)
    return float(-np.mean(np.log(p)))


def cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_table(title, **extra):
    """Print a markdown table of the machine a bench runs on: its CPU, cores, load average (1, 5,
    15 minutes), the BLAS libraries loaded (threadpoolctl), NumPy and gpc's commit, plus
    ``extra`` rows (name: value)."""
    import platform
    import subprocess

    import threadpoolctl

    import gpc

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    blas = "; ".join(f"{lib['internal_api']} {lib.get('version')} ({lib.get('architecture')}, "
                     f"{lib['num_threads']} threads, {os.path.basename(lib['filepath'])})"
                     for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "?"
    rows = {"CPU": cpu, "cores (affinity)": f"{cores()} of {os.cpu_count()}",
            "load average (1, 5, 15 min)": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
            "BLAS (threadpoolctl)": blas or "none found",
            "Python, NumPy": f"{platform.python_version()}, {np.__version__}",
            "gpc": f"{getattr(gpc, '__version__', '?')} at {commit}", **extra}
    print(f"\n### {title}\n\n| machine | |\n| --- | --- |")
    for name, value in rows.items():
        print(f"| {name} | {value} |")
    print(flush=True)


if __name__ == "__main__":
    import sys
    if "--peer" in sys.argv:
        args = [a for a in sys.argv[1:] if a != "--peer"]
        n_peer = int(args[0]) if args else 1_000_000
        epochs = int(args[1]) if len(args) > 1 else 1
        print(f"n = {n_peer}, m = {M}, b = {B}, {epochs} epoch(s), threads = {THREADS}; load "
              f"average {os.getloadavg()[0]:.1f}", flush=True)
        res = peer(n_peer, epochs=epochs)
        for k, (wall, cpu, nll, err) in res.items():
            print(f"{k}: {wall:.1f} s ({cpu:.1f} s CPU), test NLL {nll:.4f}, error {err:.4f}")
        print(f"time ratio sep / gpytorch = {res['sep'][0] / res['gpytorch'][0]:.2f} (CPU "
              f"{res['sep'][1] / res['gpytorch'][1]:.2f}); load average after "
              f"{os.getloadavg()[0]:.1f}")
    else:
        main()
