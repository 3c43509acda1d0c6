"""Batch EP at Z = X against the exact robust model: passes and seconds to convergence.

On a training split of glass and new-thyroid (``gpc.datasets.smgpc_split``, split 0, X
standardised by the training rows), ``SparseMultiClassGPC(model="robust")`` with Z = X, no jitter
and a fixed RBF kernel is the exact RMGPC model (docs/derivations-sparse-multiclass.md §1), so its
batch EP fixed point is ``MultiClassGPC(optimizer=None, tol=1e-10)``'s.  Each pass is one
``partial_fit`` epoch (a site pass and the evidence); after each the largest difference of the
test rows' predictive probabilities to the exact model's is taken (outside the timing), until it
is below ``--target`` or ``--max-passes`` have run.

Two rules: "plain", the damped parallel passes alone (damping 0.5; ``ANDERSON_MEMORY = 0``), and
"anderson", the passes Anderson-accelerated (gpc.sparse.core.steps.SiteAnderson, the default).
Last, the passes that ``max_iter="auto"`` runs before it stops on its own (sites settled to
``AUTO_SITE_TOL``) and the difference it ends at.

    python bench/bench_batch_convergence.py
"""

import argparse
import time
import warnings

import numpy as np

from gpc import MultiClassGPC, SparseMultiClassGPC
from gpc.datasets import smgpc_split
from gpc.kernels import RBF
from gpc.sparse.core import steps

#: the RBF length-scale of each set (X standardised)
LENGTH_SCALES = {"glass": 1.0, "new-thyroid": 1.7}


def problem(name):
    Xtr, ytr, Xte, _ = smgpc_split(name, 0)
    mu, sd = Xtr.mean(axis=0), Xtr.std(axis=0)
    return (Xtr - mu) / sd, ytr, (Xte - mu) / sd


def sparse_model(X, ell, max_iter):
    return SparseMultiClassGPC(kernel=RBF(ell, "fixed"), n_inducing=len(X), inducing_points=X,
                               optimize_inducing=False, jitter=0.0, batch_size=None,
                               max_iter=max_iter, progress=False)


def passes_to(X, y, Xs, ell, exact, target, max_passes, memory):
    """(passes, seconds) to a largest probability difference below ``target`` (None if not)."""
    saved = steps.ANDERSON_MEMORY
    steps.ANDERSON_MEMORY = memory
    try:
        model, seconds = sparse_model(X, ell, 1), 0.0
        for it in range(1, max_passes + 1):
            start = time.perf_counter()
            model.partial_fit(X, y)
            seconds += time.perf_counter() - start
            if np.max(np.abs(model.predict_proba(Xs) - exact)) <= target:
                return it, seconds
        return None, seconds
    finally:
        steps.ANDERSON_MEMORY = saved


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=float, default=1e-6)
    parser.add_argument("--max-passes", type=int, default=3000)
    parser.add_argument("--sets", nargs="+", default=sorted(LENGTH_SCALES))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"| set | n | rule | passes to {args.target:g} | seconds |")
    print("|---|---|---|---|---|")
    for name in args.sets:
        X, y, Xs = problem(name)
        ell = LENGTH_SCALES[name]
        exact = MultiClassGPC(kernel=RBF(ell), optimizer=None, tol=1e-10,
                              max_iter=5000).fit(X, y).predict_proba(Xs)
        for rule, memory in (("plain", 0), ("anderson", steps.ANDERSON_MEMORY)):
            passes, seconds = passes_to(X, y, Xs, ell, exact, args.target, args.max_passes,
                                        memory)
            shown = passes if passes is not None else f"> {args.max_passes}"
            print(f"| {name} | {len(y)} | {rule} | {shown} | {seconds:.2f} |", flush=True)
        start = time.perf_counter()
        auto = sparse_model(X, ell, "auto").fit(X, y)
        seconds = time.perf_counter() - start
        diff = np.max(np.abs(auto.predict_proba(Xs) - exact))
        print(f"| {name} | {len(y)} | max_iter=\"auto\" (stops by itself) | {auto.n_iter_} "
              f"(difference {diff:.1e}) | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
