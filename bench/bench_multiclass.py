"""MultiClassGPC's fit against scikit-learn's one-vs-rest GaussianProcessClassifier, and where the
time of an RMGPC fit goes (issue 15).

Both estimators fit an RBF kernel's length scale by type-II ML (L-BFGS-B, one start) on the same
standardised data: glass (n = 214, l = 6) and new-thyroid (n = 215, l = 3), all rows.  scikit-learn
fits l binary Laplace classifiers (one-vs-rest); MultiClassGPC fits one l-latent model by EP
(RMGPC, SMGPC) or Laplace (HTPC).  The sides alternate in one process, ``--repeats`` times each, and
the report gives each side's minimum CPU time and its ratio to scikit-learn's, with the BLAS
threads pinned (``--threads``, default 1, threadpoolctl).  CPU time (``time.process_time``) rather
than wall time, because the machine may be shared; with 1 BLAS thread the two agree on a quiet one.

Then one RMGPC fit per data set under cProfile, its internal time split into: the class blocks
(``gpc.multiclass._block``: per class a Cholesky and a triangular inverse of I + S K S, and the
O(n²) means of the location sweeps), the
sequential ψ̃ᵢ sweep (``refine_outlier_prior``, typed Cython), the vectorised ψ̃ᵢₖ moments and
cavities, the kernel and its gradient contraction, and the rest (Python, numpy glue, optimiser).

Last, the class blocks in threads: ``--block-n`` points, 6 classes, 10 EP iterations at a fixed
θ, ``rmgpc_ep(n_threads=1)`` against ``n_threads=2`` (wall time, min of ``--repeats``; BLAS still
pinned to one thread per call).

Run from the repository root::

    python bench/bench_multiclass.py [--repeats 3] [--threads 1] [--models robust standard]
"""

import argparse
import cProfile
import pstats
import time
import warnings

import numpy as np

from gpc import datasets
from gpc.kernels import RBF
from gpc.multiclass import MultiClassGPC

DATA = {"glass": datasets.load_glass, "new-thyroid": datasets.load_thyroid}
#: cProfile function names -> the part of an RMGPC fit they belong to
PARTS = {
    "class blocks (Cholesky, inverse, means)": ("_marginals", "_prime_mean_k",
                                                "_correct_mean", "prime_mean", "fill_b"),
    "sequential psi_i sweep (Cython)": ("refine_outlier_prior", "_refine_outlier_prior"),
    "psi_ik moments and cavities": ("_likelihood_moments", "_cavities", "class_sites", "_refine",
                                    "_log_p_cavity", "_location_weights", "lstsq"),
    "kernel and gradient contraction": ("gradient_contract", "__call__", "_gram", "rbf"),
    "evidence and gradient matrices": ("_log_evidence", "gradient_matrix", "gradient_matrices"),
}


def load(name):
    d = DATA[name](binary=False)
    sd = d.X.std(axis=0)
    return (d.X - d.X.mean(axis=0)) / np.where(sd > 0, sd, 1.0), d.y


def cpu_time(fn):
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def compare(name, models, repeats, max_iter=500, tol=1e-4):
    from sklearn.gaussian_process import GaussianProcessClassifier as SkGPC
    from sklearn.gaussian_process.kernels import RBF as SkRBF
    X, y = load(name)
    times = {m: [] for m in ("sklearn",) + tuple(models)}
    for _ in range(repeats):
        times["sklearn"].append(cpu_time(lambda: SkGPC(kernel=SkRBF(1.0)).fit(X, y))[0])
        for m in models:
            times[m].append(cpu_time(lambda: MultiClassGPC(model=m, kernel=RBF(1.0), max_iter=max_iter,
                                                           tol=tol).fit(X, y))[0])
    base = min(times["sklearn"])
    print(f"\n[{name}: n = {len(y)}, l = {len(np.unique(y))}] fit CPU time, min of {repeats} "
          f"(MultiClassGPC max_iter={max_iter}, tol={tol:g})")
    for m, ts in times.items():
        print(f"  {m:<14s} {min(ts):8.2f} s   {min(ts) / base:6.2f} x sklearn")


def profile(name, max_iter=500, tol=1e-4):
    X, y = load(name)
    prof = cProfile.Profile()
    prof.enable()
    clf = MultiClassGPC(model="robust", kernel=RBF(1.0), max_iter=max_iter, tol=tol).fit(X, y)
    prof.disable()
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values())          # internal time of every function
    share = {part: 0.0 for part in PARTS}
    for (_, _, func), v in stats.items():
        for part, names in PARTS.items():
            if func in names:
                share[part] += v[2]
                break
    print(f"\n[{name}] one RMGPC fit under cProfile: {total:.2f} s internal time, "
          f"{clf.ep_result_.n_iter} EP iterations in the final run")
    for part, t in share.items():
        print(f"  {part:<40s} {t:7.2f} s  {100 * t / total:5.1f} %")
    rest = total - sum(share.values())
    print(f"  {'the rest':<40s} {rest:7.2f} s  {100 * rest / total:5.1f} %")


def threads(n, repeats):
    from gpc.multiclass import rmgpc_ep
    rng = np.random.default_rng(15)
    X = rng.normal(size=(n, 4))
    y = np.argmax(X @ rng.normal(size=(4, 6)) + rng.normal(size=(n, 6)), axis=1)
    K = RBF(2.0)(X)
    wall = {1: [], 2: []}
    for _ in range(repeats):
        for t in (1, 2):
            t0 = time.perf_counter()
            rmgpc_ep([K] * 6, y, 6, max_iter=10, tol=1e-12, n_threads=t)
            wall[t].append(time.perf_counter() - t0)
    print(f"\n[class blocks in threads: n = {n}, l = 6, 10 EP iterations] wall time, min of {repeats}")
    print(f"  1 thread  {min(wall[1]):7.2f} s\n  2 threads {min(wall[2]):7.2f} s   "
          f"speed-up {min(wall[1]) / min(wall[2]):.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", nargs="+", default=["robust", "standard", "heavy-tailed"])
    parser.add_argument("--datasets", nargs="+", default=list(DATA))
    parser.add_argument("--block-n", type=int, default=400)
    parser.add_argument("--max-iter", type=int, default=500, help="MultiClassGPC's max_iter")
    parser.add_argument("--tol", type=float, default=1e-4, help="MultiClassGPC's tol")
    parser.add_argument("--skip-fits", action="store_true", help="only the threads measurement")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits
    warnings.simplefilter("ignore")
    with threadpool_limits(args.threads):
        print(f"BLAS threads: {args.threads}")
        if not args.skip_fits:
            for name in args.datasets:
                compare(name, args.models, args.repeats, args.max_iter, args.tol)
            for name in args.datasets:
                profile(name, args.max_iter, args.tol)
        threads(args.block_n, args.repeats)


if __name__ == "__main__":
    main()
