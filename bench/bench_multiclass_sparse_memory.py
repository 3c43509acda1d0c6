"""Peak memory of a sparse multi-class fit beyond its data, against n.

With tied sites (stochastic EP) ``SparseMultiClassGPC`` keeps one average site per class, O(C m²)
numbers whatever n; ``method="vi"`` keeps q(u_k) per class and nothing per row either.  This bench
fits both on synthetic data (n rows of d = 5 standard normal features, C classes by a noisy argmax
of linear scores) at n = 10⁴, 10⁵ and 10⁶, m = 50 inducing points per class, minibatches of 200,
and measures with tracemalloc (NumPy's allocations are traced) the peak of everything allocated
after the data were made, from the start of ``fit`` to its end: the peak beyond the data.

A full epoch at n = 10⁶ is 5,000 minibatch steps per class block; ``--steps`` ends the fit after
that many steps (the estimator's own interruption path: the model keeps its last step), which is
enough for the peak, since no step allocates more than the one before it (the per-step arrays are
b x m).  Everything before the first step (checks, label coding, the k-means start on a
subsample, the state) runs in full.

Known O(n) transients during ``fit``: the labels recoded to class indices (8 bytes per row, 8 MB at
n = 10⁶, held while training, as the compiled passes read np.intp) and ``np.unique(y)``'s sorted
copy at the start (8 MB at 10⁶); the fitted model keeps no array of the rows' length (asserted in
tests/test_sparse_multiclass_vi.py).

    python bench/bench_multiclass_sparse_memory.py            # C = 3 and 10, 200 steps each
    python bench/bench_multiclass_sparse_memory.py --quick    # C = 3, 20 steps: under 2 min
"""

import argparse
import os
import time
import tracemalloc
import warnings

import numpy as np

from gpc import SparseMultiClassGPC

LIMIT_MB = 100.0


class _StopAfter:
    """A progress bar that ends the fit after ``steps`` steps (``fit`` treats it as an interruption
    and keeps the model of the last step)."""

    def __init__(self, steps):
        self.steps, self.done = steps, 0

    def update(self, *_):
        self.done += 1
        if self.steps and self.done >= self.steps:
            raise KeyboardInterrupt

    def close(self):
        pass


def make_data(n, C, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W = rng.standard_normal((d, C))
    y = np.argmax(X @ W + 0.5 * rng.standard_normal((n, C)), axis=1)
    return X, y


def measure(method, X, y, m, batch, steps):
    """(peak MB beyond the data, steps run, seconds) of one fit."""
    kw = dict(tied_sites=True) if method == "ep" else dict(method="vi")
    clf = SparseMultiClassGPC(n_inducing=m, label_noise=0.05, batch_size=batch, max_iter=1,
                              random_state=0, progress=False, n_jobs=1, **kw)
    bar = _StopAfter(steps)
    clf._progress_bar = lambda epochs, per_epoch: bar
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)    # "fit interrupted" after --steps
            clf.fit(X, y)
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 1e6, bar.done, seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="C = 3 only, 20 steps per fit")
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--classes", type=int, nargs="+", default=None, help="default 3 and 10")
    ap.add_argument("--d", type=int, default=5)
    ap.add_argument("--m", type=int, default=50)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--steps", type=int, default=None,
                    help="minibatch steps per fit (0: a whole epoch; default 200, quick 20)")
    ap.add_argument("--methods", nargs="+", default=["ep", "vi"], choices=["ep", "vi"])
    args = ap.parse_args(argv)
    classes = args.classes or ([3] if args.quick else [3, 10])
    steps = args.steps if args.steps is not None else (20 if args.quick else 200)

    print(f"# Peak traced memory beyond the data during fit: d = {args.d}, m = {args.m}, minibatch "
          f"{args.batch}, {'a whole epoch' if steps == 0 else f'{steps} steps'} per fit; "
          f"{os.cpu_count()} cores, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("| n | C | method | data MB | peak beyond data MB | steps | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for C in classes:
        for n in args.n:
            X, y = make_data(n, C, args.d)
            data_mb = (X.nbytes + y.nbytes) / 1e6
            for method in args.methods:
                peak, done, seconds = measure(method, X, y, args.m, args.batch, steps)
                worst = max(worst, peak)
                label = "ep, tied sites" if method == "ep" else "vi"
                print(f"| {n} | {C} | {label} | {data_mb:.1f} | {peak:.1f} | {done} | "
                      f"{seconds:.1f} |", flush=True)
            del X, y
    print(f"\nlargest peak beyond the data: {worst:.1f} MB "
          f"({'under' if worst < LIMIT_MB else 'OVER'} the {LIMIT_MB:.0f} MB goal)")


if __name__ == "__main__":
    main()
