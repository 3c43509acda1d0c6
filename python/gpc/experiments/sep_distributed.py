"""``gpc sep-distributed``: SEP on Dask against the number of workers (SEP §2.3, Fig. 3 right).

    gpc sep-distributed [--dask-workers N [N ...] | --scheduler ADDRESS]
                        [--data NAME | --synthetic N | --fashion-mnist DIR [--subsample N]]
                        [--n-inducing M] [--max-iter K] [--batch-size B] [--seed S]
                        [--out FILE.json] [--plots DIR] [--quiet]

Fits ``SparseGaussianProcessClassifier(method="ep", client=...)`` on a training split, once in
process and once per cluster, and prints the seconds per iteration (median of iterations 2, 3, ...),
the speedup over the in-process fit, the test error and NLL, and log Z_q.  ``--dask-workers N``
starts a ``LocalCluster`` of N worker processes x 1 thread on 127.0.0.1 (several counts give several
rows); ``--scheduler`` connects to a running cluster instead.  ``--batch-size B`` trains on
minibatches of B rows (each worker takes its share of every minibatch, so a cluster's minibatches
differ from the in-process fit's: the figures agree in distribution, not digit for digit).
``--fashion-mnist DIR`` takes the MNIST-size stand-in of ``gpc reproduce sep-mnist`` (60,000
training and 10,000 test images, odd against even class codes; SEP Fig. 3 right is on MNIST).
``--out`` writes the records as JSON, ``--plots DIR`` draws seconds per iteration and speedup
against the number of workers (``sep-distributed.png``).  A progress line goes to stderr as each fit
starts (``--quiet`` leaves them out, as in ``gpc compare``).  The cluster comes from
:func:`gpc.distributed.open_client`.
"""

import sys
import time

import numpy as np

from ..distributed import open_client
from ..sparse import SparseGaussianProcessClassifier

DEFAULT_WORKERS = (1, 2)


def add_parser(sub):
    """Add ``sep-distributed`` to an argparse sub-parser set."""
    p = sub.add_parser("sep-distributed", help="sparse EP on Dask against the number of workers",
                       description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--dask-workers", type=int, nargs="+", metavar="N",
                       help=f"LocalCluster sizes on 127.0.0.1 (default {' '.join(map(str, DEFAULT_WORKERS))})")
    where.add_argument("--scheduler", metavar="ADDRESS", help="a running scheduler, e.g. tcp://host:8786")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--data", default="banana", help="a bundled binary data set (default banana)")
    data.add_argument("--synthetic", type=int, metavar="N",
                      help="N rows of a synthetic 8-feature problem instead (the bench's)")
    data.add_argument("--fashion-mnist", metavar="DIR",
                      help="the directory of the four Fashion-MNIST IDX files (the MNIST-size stand-in)")
    p.add_argument("--subsample", type=int, default=None, metavar="N",
                   help="with --fashion-mnist: N training rows drawn at random (default all 60,000)")
    p.add_argument("--n-inducing", type=int, default=50)
    p.add_argument("--max-iter", type=int, default=10, help="iterations or epochs (default 10)")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="minibatches of B rows (default: batch SEP)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="FILE", help="write the records as JSON")
    p.add_argument("--plots", metavar="DIR", help="draw time and speedup against workers into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress lines (one per fit, on stderr)")
    return p


def synthetic(n, seed=0, d=8):
    """n rows of the bench's synthetic problem: y = sign(sin x₀ + x₁x₂ - x₃/2 + 0.3 ε)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    f = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    return X, np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)


def _data(args):
    if getattr(args, "fashion_mnist", None) is not None:
        from ..datasets._idx import load_fashion_mnist
        Xtr, ytr = load_fashion_mnist(args.fashion_mnist, "train", option="--fashion-mnist")
        Xte, yte = load_fashion_mnist(args.fashion_mnist, "test", option="--fashion-mnist")
        if args.subsample is not None:
            if not 10 <= args.subsample <= len(ytr):
                raise ValueError(f"--subsample must be between 10 and {len(ytr)}")
            rows = np.sort(np.random.default_rng(args.seed).choice(len(ytr), args.subsample,
                                                                   replace=False))
            Xtr, ytr = Xtr[rows], ytr[rows]
        return "Fashion-MNIST (odd vs even)", Xtr, ytr, Xte, yte
    if args.synthetic is not None:
        if args.synthetic < 10:
            raise ValueError("--synthetic needs at least 10 rows")
        X, y = synthetic(args.synthetic, args.seed)
        name = f"synthetic n={args.synthetic}"
    else:
        from ..datasets import load
        X, y = load(args.data, return_X_y=True)
        X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
        name = args.data
    order = np.random.default_rng(args.seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return name, X[order[:cut]], y[order[:cut]], X[order[cut:]], y[order[cut:]]


def _fit(client, args, Xtr, ytr, Xte, yte):
    clf = SparseGaussianProcessClassifier(n_inducing=args.n_inducing, max_iter=args.max_iter,
                                          batch_size=args.batch_size, random_state=args.seed,
                                          progress=False, client=client)
    start = time.perf_counter()
    clf.fit(Xtr, ytr)
    seconds = time.perf_counter() - start
    # iterations 2, 3, ...: the first also loads the shards onto the workers (and the rows into
    # the in-process fit's blocks), which is not what the number of workers changes
    t = [0.0] + [h["seconds"] for h in clf.history_]
    per_iter = float(np.median(np.diff(t)[1:] if len(t) > 2 else np.diff(t)))
    proba = clf.predict_proba(Xte)
    index = np.searchsorted(clf.classes_, yte)
    nll = float(-np.mean(np.log(np.maximum(proba[np.arange(len(yte)), index], 1e-300))))
    return {"seconds": seconds, "seconds_per_iteration": per_iter,
            "test_error": float(np.mean(clf.predict(Xte) != yte)), "test_nll": nll,
            "log_z": clf.log_marginal_likelihood_value_}


def _progress(text, quiet):
    """A progress line on stderr, flushed at once, unless ``quiet``; the table goes to stdout."""
    if not quiet:
        print(f"sep-distributed: {text}", file=sys.stderr, flush=True)


def main(args):
    """Run the fits and print one row each; returns the records."""
    if args.n_inducing < 1 or args.max_iter < 1 or (args.batch_size is not None and args.batch_size < 1):
        raise ValueError("--n-inducing, --max-iter and --batch-size must be at least 1")
    workers = args.dask_workers or ([] if args.scheduler else list(DEFAULT_WORKERS))
    if any(w < 1 for w in workers):
        raise ValueError("--dask-workers must be at least 1")
    name, Xtr, ytr, Xte, yte = _data(args)
    how = "batch SEP" if args.batch_size is None else f"SEP, minibatches of {args.batch_size}"
    print(f"{how} on {name}: {len(ytr)} training rows, {len(yte)} test rows, m = {args.n_inducing}, "
          f"{args.max_iter} iterations")
    quiet = getattr(args, "quiet", False)
    _progress("fitting in process", quiet)
    records = [dict(where="in process", **_fit(None, args, Xtr, ytr, Xte, yte))]
    runs = [("scheduler " + args.scheduler, dict(scheduler=args.scheduler))] if args.scheduler else \
        [(f"{w} worker{'s' * (w > 1)}", dict(dask_workers=w)) for w in workers]
    for label, how in runs:
        _progress(f"fitting on {label}", quiet)
        with open_client(**how) as client:
            records.append(dict(where=label, **_fit(client, args, Xtr, ytr, Xte, yte)))
    base = records[0]["seconds_per_iteration"]
    print(f"{'where':<24} {'s/iteration':>12} {'speedup':>8} {'test error':>10} {'test NLL':>9} {'log Z':>12}")
    for r in records:
        r["speedup"] = base / r["seconds_per_iteration"]
        print(f"{r['where']:<24} {r['seconds_per_iteration']:>12.3f} {r['speedup']:>8.2f} "
              f"{r['test_error']:>10.4f} {r['test_nll']:>9.4f} {r['log_z']:>12.3f}")
    for r in records:
        r.update(data=name, n_train=len(ytr), n_inducing=args.n_inducing, max_iter=args.max_iter,
                 batch_size=args.batch_size)
    if getattr(args, "out", None):
        import json
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(records, fh, indent=1)
        print("wrote", args.out)
    if getattr(args, "plots", None):
        print("wrote", plot_workers(records, args.plots))
    return records


def plot_workers(records, directory):
    """Seconds per iteration and speedup over the in-process fit against the number of workers
    (SEP Fig. 3 right); returns the PNG's path."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in records if r["where"].split()[0].isdigit()]
    workers = [int(r["where"].split()[0]) for r in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(workers, [r["seconds_per_iteration"] for r in runs], "o-", label="Dask workers")
    left.axhline(records[0]["seconds_per_iteration"], color="gray", ls="--", label="in process")
    left.set(xlabel="workers", ylabel="seconds per iteration", xticks=workers)
    left.legend()
    right.plot(workers, [r["speedup"] for r in runs], "o-", label="measured")
    right.plot(workers, workers, color="gray", ls=":", label="linear")
    right.set(xlabel="workers", ylabel="speedup over one process", xticks=workers)
    right.legend()
    fig.suptitle(f"SEP on Dask: {records[0]['data']}, n = {records[0]['n_train']}, "
                 f"m = {records[0]['n_inducing']}")
    fig.tight_layout()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "sep-distributed.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
