"""The sparse classifier with its defaults on 50,000 rows: how long, how good.

    python bench/bench_sparse_defaults.py [--n N] [--test N] [--seed S] [--also KEY=VALUE ...]

Fits ``SparseGaussianProcessClassifier()`` (every parameter at its default but ``progress``) on n
rows (default 50,000) of ``bench_sparse.py``'s problem (d = 8, y = sign(sin x₀ + x₁x₂ - x₃/2 +
0.3 ε)) and scores it on as many fresh rows of the same problem (``--test``, default 10,000):
wall and CPU seconds of the fit, epochs, minibatch size, test error and mean test NLL, and the NLL
of the noise alone (the Bayes classifier's, estimated from the generator's known latent function:
no model can beat it).  ``--also`` fits a variant next to the defaults, e.g. ``--also
batch_size=None max_iter=100`` (the batch fit) or ``--also max_iter=30 n_inducing=200``.

BLAS uses the threads it is given (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS); the figures are for
the machine that runs it, so run it on a quiet one.
"""

import argparse
import ast
import os
import sys
import time

import numpy as np
from scipy.special import log_ndtr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sparse import make_data  # noqa: E402

from gpc import SparseGaussianProcessClassifier  # noqa: E402

#: the generator's label noise: y = sign(f + NOISE ε), ε ~ N(0, 1)
NOISE = 0.3


def bayes_nll(X, y):
    """Mean NLL of the true P(y | x) = Φ(y f(x) / NOISE) of the generator."""
    f = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    return float(-np.mean(log_ndtr(y * f / NOISE)))


def score(clf, X, y):
    proba = clf.predict_proba(X)
    p = proba[np.arange(len(y)), np.searchsorted(clf.classes_, y)]
    return float(np.mean(clf.predict(X) != y)), float(-np.mean(np.log(np.maximum(p, 1e-300))))


def fit_and_score(params, X, y, X_te, y_te):
    clf = SparseGaussianProcessClassifier(progress=False, **params)
    wall, cpu = time.perf_counter(), time.process_time()
    clf.fit(X, y)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    error, nll = score(clf, X_te, y_te)
    return {"wall": wall, "cpu": cpu, "epochs": clf.n_iter_, "batch": clf._batch,
            "error": error, "nll": nll}


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000, help="training rows (default 50,000)")
    parser.add_argument("--test", type=int, default=10_000, help="test rows (default 10,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--also", nargs="+", default=[], metavar="KEY=VALUE",
                        help="parameters of a second fit beside the defaults")
    args = parser.parse_args(argv)
    X, y = make_data(args.n, seed=args.seed)
    X_te, y_te = make_data(args.test, seed=args.seed + 1)
    runs = [("defaults", {})]
    if args.also:
        runs.append((" ".join(args.also), {k: _value(v) for k, v in
                                           (item.split("=", 1) for item in args.also)}))
    print(f"n = {args.n} (d = 8), {args.test} test rows; load average {os.getloadavg()[0]:.1f}; "
          f"Bayes NLL {bayes_nll(X_te, y_te):.4f}")
    print(f"{'fit':<32} {'wall s':>8} {'CPU s':>8} {'epochs':>7} {'batch':>6} {'error':>7} {'NLL':>7}")
    for name, params in runs:
        r = fit_and_score(params, X, y, X_te, y_te)
        print(f"{name:<32} {r['wall']:>8.1f} {r['cpu']:>8.1f} {r['epochs']:>7} "
              f"{str(r['batch']):>6} {r['error']:>7.4f} {r['nll']:>7.4f}")


if __name__ == "__main__":
    main()
