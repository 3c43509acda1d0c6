"""Time to a test NLL by minibatch size: the measurement behind ``batch_size="auto"``.

Minibatch SEP (``SparseGaussianProcessClassifier``, defaults otherwise) on bench/bench_sparse.py's
problem (d = 8, m = 200, ConstantKernel · ARD RBF from the k-means Z and the median length scale),
n = 200,000 training rows and 10,000 held-out ones, at each batch size for ``--seconds`` of
training (whole epochs: ``fit`` for one, then ``partial_fit``; the last epoch may run past),
scoring the held-out rows after every epoch off the clock.  Prints a markdown table of the machine,
per batch size the held-out NLL after each epoch against the training time, and a markdown table
of the time each batch size first reached each NLL of ``--levels``.  The batch sizes run one after
the other, in the order given, with ``n_jobs`` threads (default: every core that BLAS may use).
About five minutes on a 2-core machine (80 s of training per batch size, plus the scoring):

    python bench/bench_sparse_batch_size.py                 # b = 200, 2000, 20000
    python bench/bench_sparse_batch_size.py --quick         # smoke run: n = 40,000, 10 s each
    python bench/bench_sparse_batch_size.py --n-jobs 1 --seconds 60
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

from bench_sparse import machine_table, peer_problem  # noqa: E402
from gpc import SparseGaussianProcessClassifier  # noqa: E402
from gpc.kernels import RBF, ConstantKernel  # noqa: E402


def _nll(clf, X, y):
    p = clf.predict_proba(X)[:, 1]
    return float(-np.mean(np.log(np.clip(np.where(y > 0, p, 1.0 - p), 1e-300, 1.0))))


def run(Xtr, ytr, Xte, yte, Z0, ell, batch, seconds, n_jobs, learning_rate):
    """[(training seconds, held-out NLL)] after each epoch (``fit``, then ``partial_fit``, timed
    alone; the scoring is off the clock) until ``seconds`` of training have gone."""
    clf = SparseGaussianProcessClassifier(
        kernel=ConstantKernel(1.0) * RBF(np.full(Xtr.shape[1], ell)), n_inducing=len(Z0),
        inducing_points=Z0, batch_size=batch, max_iter=1, progress=False, random_state=0,
        n_jobs=n_jobs, learning_rate=learning_rate)
    spent, out = 0.0, []
    while not out or out[-1][0] < seconds:
        t = time.perf_counter()
        if out:
            clf.partial_fit(Xtr, ytr)
        else:
            clf.fit(Xtr, ytr)
        spent += time.perf_counter() - t
        out.append((spent, _nll(clf, Xte, yte)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--test", type=int, default=10_000)
    ap.add_argument("--batches", type=int, nargs="+", default=[200, 2000, 20000])
    ap.add_argument("--seconds", type=float, default=80.0, help="training time per batch size")
    ap.add_argument("--quick", action="store_true", help="n = 40,000, 10 s per batch size")
    ap.add_argument("--n-jobs", type=int, default=None, help="threads (default: every core)")
    ap.add_argument("--learning-rate", type=float, default=1.0)
    ap.add_argument("--levels", type=float, nargs="+", default=[0.20, 0.19, 0.185, 0.18, 0.178])
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.seconds = 40_000, 10.0
    machine_table(f"time to a held-out NLL by batch size: n = {args.n}, m = 200",
                  **{"n_jobs": str(args.n_jobs), "learning rate": str(args.learning_rate),
                     "training per batch size": f"{args.seconds:g} s"})
    Xtr, ytr, Xte, yte, Z0, ell = peer_problem(args.n, args.test)
    curves = {}
    for b in args.batches:
        curves[b] = run(Xtr, ytr, Xte, yte, Z0, ell, b, args.seconds, args.n_jobs,
                        args.learning_rate)
        print(f"b = {b}: " + ", ".join(f"{t:.1f} s {nll:.4f}" for t, nll in curves[b]) +
              f"; load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    print("\n| batch | " + " | ".join(f"to NLL {level}" for level in args.levels) +
          " | NLL after 1 epoch | best NLL (time) |")
    print("| --- |" + " --- |" * (len(args.levels) + 2))
    for b, curve in curves.items():
        reach = []
        for level in args.levels:
            hit = [t for t, nll in curve if nll <= level]
            reach.append(f"{hit[0]:.1f} s" if hit else "—")
        best = min(curve, key=lambda r: r[1])
        print(f"| {b} | " + " | ".join(reach) +
              f" | {curve[0][1]:.4f} ({curve[0][0]:.1f} s) | {best[1]:.4f} ({best[0]:.1f} s) |")


if __name__ == "__main__":
    main()
