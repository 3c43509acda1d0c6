"""Minibatch SEP before and after a change, in one process (issue 12's speed work).

``python bench/sparse_before_after.py [REV]`` (default REV ``main``) extracts ``python/gpc/sparse`` at REV
with ``git show`` into a temporary package (its relative imports pointed at the installed ``gpc``), then
alternates REV's trainer, this tree's trainer and the BLAS floor of ``bench_sparse.py`` (its ``Floor``:
K_bm by the same routine as the step, and one b x m x m dgemm) four times on the same data (n, steps
from ``GPC_BENCH_SPARSE_N`` / ``GPC_BENCH_SPARSE_STEPS``), BLAS pinned to 1 thread, and prints the
minimum CPU time (``process_time``) of each: a burst of load on a shared machine then hits all three
alike.  Both trainers take the first steps of a fit (fresh rows, damping 0.5 as before).
"""

import importlib
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_sparse as bs  # noqa: E402

from gpc.likelihoods import get_likelihood  # noqa: E402
from gpc.sparse import _train as this_train  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("__init__.py", "_inducing.py", "_passes.py", "_train.py", "baselines.py", "ep.py", "estimator.py")


def trainer_at(rev, where):
    """``_train`` of python/gpc/sparse at ``rev``, importable as ``sparse_at_rev._train``."""
    package = os.path.join(where, "sparse_at_rev")
    os.makedirs(package)
    for name in FILES:
        source = subprocess.run(["git", "show", f"{rev}:python/gpc/sparse/{name}"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
        source = re.sub(r"^from \.\. import", "from gpc import", source, flags=re.M)
        source = re.sub(r"^from \.\.", "from gpc.", source, flags=re.M)
        with open(os.path.join(package, name), "w") as fh:
            fh.write(source)
    sys.path.insert(0, where)
    return importlib.import_module("sparse_at_rev._train")


def steps(module, X, y, tied, lik):
    state = bs.new_state(X, tied=tied) if module is this_train else module.SEPState(
        *_state_args(X), tied=tied)
    start = time.process_time()
    for k in range(bs.STEPS):
        s0 = k * bs.B
        Xb, yb = bs.as_block(X, s0, s0 + bs.B), y[s0:s0 + bs.B]
        if tied:
            module.tied_minibatch_step(state, lik, Xb, yb, 0.5)
        else:
            module.minibatch_step(state, lik, Xb, yb, slice(s0, s0 + bs.B), bs.N, 0.5)
    return time.process_time() - start, state


def _state_args(X):
    from gpc.kernels import RBF, ConstantKernel
    kernel = ConstantKernel(1.0) * RBF(np.full(bs.D, 2.0))
    return kernel, X[:: max(1, bs.N // bs.M)][:bs.M].copy(), bs.N, 1e-8, True, 1.0


def main(rev="main", rounds=4):
    X, y = bs.make_data()
    lik = get_likelihood("probit")
    with tempfile.TemporaryDirectory() as where, threadpool_limits(1):
        before = trainer_at(rev, where)
        print(f"n={bs.N} m={bs.M} b={bs.B} steps={bs.STEPS} BLAS threads=1 ({rev} against this tree); "
              f"load average {os.getloadavg()[0]:.1f}")
        for tied in (False, True):
            times = {"before": [], "after": [], "floor": []}
            floor = bs.Floor()
            for _ in range(rounds):
                times["before"].append(steps(before, X, y, tied, lik)[0])
                seconds, state = steps(this_train, X, y, tied, lik)
                times["after"].append(seconds)
                start = time.process_time()
                floor.steps(state, X)
                times["floor"].append(time.process_time() - start)
            ms = {k: min(v) / bs.STEPS * 1e3 for k, v in times.items()}
            print(f"[{'tied sites' if tied else 'per-row sites'}] {rev} {ms['before']:.2f} ms/step "
                  f"({ms['before'] / ms['floor']:.1f}x floor), this tree {ms['after']:.2f} ms/step "
                  f"({ms['after'] / ms['floor']:.1f}x floor), floor {ms['floor']:.2f} ms; this / {rev} "
                  f"{ms['after'] / ms['before']:.3f}")
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
