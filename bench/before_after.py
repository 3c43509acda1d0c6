"""gpc's fits under two (or more) gpc builds, alternated on the same data.

    python bench/before_after.py PYTHON [PYTHON ...] [--n N] [--m M] [--rounds R] [--fits NAME ...]

Each PYTHON is an interpreter whose environment has a gpc build installed, e.g. one virtual
environment per source tree (``python -m venv /tmp/a && /tmp/a/bin/pip install
--no-build-isolation /path/to/tree``); ``this`` stands for the interpreter running the script.
Every fit runs in a fresh process of its interpreter through the public API only, so any two
builds compare, whatever their internals.  The fits (``--fits``, default all):

* the exact binary classifier, ``GaussianProcessClassifier(ConstantKernel(1) * RBF(1))`` with
  type-II ML on the first 1,000 rows of banana: ``laplace`` (method="laplace", logit) and ``ep``
  (method="ep", probit, its default schedule);
* the exact multi-class classifier, ``MultiClassGPC(kernel=RBF(1))`` with type-II ML on glass,
  standardised: ``rmgpc`` (model="robust");
* the sparse classifier on n rows (default 20,000) of ``bench_sparse.py``'s problem (d = 8,
  y = sign(sin x₀ + x₁x₂ - x₃/2 + 0.3 ε)), m (``--m``, default 100) inducing points from the same
  random rows:
  ``sep-minibatch`` (minibatches of 200 rows, 2 epochs), ``sep-minibatch-2000`` (minibatches
  of 2,000 rows, the estimator's default, 4 epochs), ``sep-tied`` (tied sites, 200 rows, 2 epochs),
  ``sep-batch`` (5 passes), ``svi-minibatch`` (minibatches of 200 rows, 2 epochs), ``gfitc``
  (10 L-BFGS-B evaluations);
* the sparse multi-class classifier, ``SparseMultiClassGPC(kernel=RBF(1, 1, 1, 1))`` (the robust
  model) on n/4 rows of a 3-class problem (d = 4, y = argmax of (x₀, x₁, x₀x₁) + 0.5 ε), m/2
  inducing points from the same random rows: ``smgpc-batch`` (5 passes), ``smgpc-minibatch``
  (minibatches of 500 rows, 2 epochs), ``smgpc-tied`` (tied sites, fixed label noise 0.05, 500 rows, 2 epochs),

BLAS pinned to one thread.  The interpreters take turns, ``--rounds`` times (default 3), and the
minimum CPU time (``time.process_time`` of the fit) of each fit and build is printed with the
ratio to the first build, and the fit's last log evidence (equal builds give equal numbers).  The
minimum of alternated rounds keeps a burst of load on a shared machine from favouring either
build.
"""

import argparse
import json
import os
import subprocess
import sys

FITS = {
    "laplace": dict(model="exact", method="laplace", likelihood="logit"),
    "ep": dict(model="exact", method="ep", likelihood="probit"),
    "rmgpc": dict(model="multiclass"),
    "sep-minibatch": dict(method="ep", batch_size=200, max_iter=2),
    "sep-minibatch-2000": dict(method="ep", batch_size=2000, max_iter=4),
    "sep-tied": dict(method="ep", batch_size=200, max_iter=2, tied_sites=True),
    "sep-batch": dict(method="ep", batch_size=None, max_iter=5),
    "svi-minibatch": dict(method="svi", batch_size=200, max_iter=2),
    "gfitc": dict(method="gfitc", batch_size=None, max_iter=10),
    "smgpc-batch": dict(model="smgpc", batch_size=None, max_iter=5),
    "smgpc-minibatch": dict(model="smgpc", batch_size=500, max_iter=2),
    "smgpc-tied": dict(model="smgpc", batch_size=500, max_iter=2, tied_sites=True,
                       label_noise=0.05),
}

#: what each process runs: one fit, its CPU seconds and log evidence as JSON on the last line
CHILD = r"""
import json, sys, time
import numpy as np
try:
    from threadpoolctl import threadpool_limits
    limit = threadpool_limits(1)
except ImportError:
    limit = None
from gpc.kernels import RBF, ConstantKernel
n, params, m = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
model = params.pop("model", "sparse")
if model == "exact":
    from gpc import GaussianProcessClassifier, datasets
    X, y = datasets.load_banana(return_X_y=True)
    X, y = X[:1000], y[:1000]
    clf = GaussianProcessClassifier(ConstantKernel(1.0) * RBF(1.0), **params)
elif model == "multiclass":
    from gpc import datasets
    from gpc.multiclass import MultiClassGPC
    d = datasets.load_glass(binary=False)
    X, y = (d.X - d.X.mean(axis=0)) / d.X.std(axis=0), d.y
    clf = MultiClassGPC(kernel=RBF(1.0))
elif model == "smgpc":
    from gpc.multiclass import SparseMultiClassGPC
    rng = np.random.default_rng(0)
    n = n // 4
    X = rng.standard_normal((n, 4))
    f = np.stack([X[:, 0], X[:, 1], X[:, 0] * X[:, 1]], axis=1)
    y = np.argmax(f + 0.5 * rng.standard_normal(f.shape), axis=1)
    Z = X[np.sort(np.random.default_rng(1).choice(n, m // 2, replace=False))]
    clf = SparseMultiClassGPC(kernel=RBF(np.full(4, 1.0)), n_inducing=m // 2, inducing_points=Z,
                              random_state=0, progress=False, **params)
else:
    from gpc import SparseGaussianProcessClassifier
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 8))
    f = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    Z = X[np.sort(np.random.default_rng(1).choice(n, m, replace=False))]
    clf = SparseGaussianProcessClassifier(kernel=ConstantKernel(1.0) * RBF(np.full(8, 2.0)),
                                          n_inducing=m, inducing_points=Z, random_state=0,
                                          progress=False, **params)
start = time.process_time()
clf.fit(X, y)
seconds = time.process_time() - start
log_z = clf.log_marginal_likelihood_value_
print(json.dumps({"seconds": seconds, "log_z": float(np.sum(log_z))}))
"""


def run(python, n, params, m=100):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([python, "-c", CHILD, str(n), json.dumps(params), str(m)],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{python} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pythons", nargs="+", metavar="PYTHON",
                        help="interpreters with a gpc build each ('this': the one running this)")
    parser.add_argument("--n", type=int, default=20_000, help="training rows (default 20,000)")
    parser.add_argument("--m", type=int, default=100, help="inducing points (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations (default 3)")
    parser.add_argument("--fits", nargs="+", choices=sorted(FITS), default=list(FITS))
    args = parser.parse_args(argv)
    pythons = [sys.executable if p == "this" else p for p in args.pythons]
    print(f"sparse: n = {args.n}, m = {args.m}; BLAS 1 thread, {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    for name in args.fits:
        best = [None] * len(pythons)
        for _ in range(args.rounds):
            for k, python in enumerate(pythons):
                result = run(python, args.n, FITS[name], args.m)
                if best[k] is None or result["seconds"] < best[k]["seconds"]:
                    best[k] = result
        cells = [f"{r['seconds']:.2f} s ({r['seconds'] / best[0]['seconds']:.3f}x, "
                 f"log Z {r['log_z']:.6g})" for r in best]
        print(f"{name:<14} " + " | ".join(cells))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
