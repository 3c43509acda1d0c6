"""``gpc sep-distributed``: SEP on Dask against the number of workers (SEP §2.3, Fig. 3 right).

    gpc sep-distributed [--dask-workers N [N ...] | --scheduler ADDRESS] [--data NAME | --synthetic N]
                        [--n-inducing M] [--max-iter K] [--batch-size B] [--seed S]

Fits ``SparseGaussianProcessClassifier(method="ep", client=...)`` on a training split, once in process
and once per cluster, and prints the seconds per iteration, the speedup over the in-process fit, the
test error and NLL, and log Z_q.  ``--dask-workers N`` starts a ``LocalCluster`` of N worker processes
x 1 thread on 127.0.0.1 (several counts give several rows); ``--scheduler`` connects to a running
cluster instead.  ``--batch-size B`` trains on minibatches of B rows (each worker takes its share of
every minibatch, so a cluster's minibatches differ from the in-process fit's: the figures agree in
distribution, not digit for digit).  :func:`open_client` is the same choice for any other command.
"""

import contextlib
import logging
import time

import numpy as np

__all__ = ["open_client", "local_cluster"]

DEFAULT_WORKERS = (1, 2)

#: glibc's mmap threshold for the workers.  Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536, which
#: also freezes glibc's adaptive mmap threshold at 128 KiB: every block of a shard task (4096 rows x m
#: doubles, 6.5 MB at m = 200) is then a fresh mmap with its pages faulted in, 15-20 % more CPU per row
#: than in a plain process (measured).  A 16 MiB threshold serves those blocks from the heap again.
WORKER_ENVIRON = {"distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_": 16 * 2 ** 20}


@contextlib.contextmanager
def local_cluster(n_workers):
    """A ``LocalCluster`` of ``n_workers`` processes x 1 thread on 127.0.0.1 with :data:`WORKER_ENVIRON`.

    Parameters
    ----------
    n_workers : int
        Worker processes to start.

    Yields
    ------
    distributed.LocalCluster
    """
    import dask

    from ._dask import import_distributed

    _, distributed = import_distributed()
    with dask.config.set(WORKER_ENVIRON), \
            distributed.LocalCluster(n_workers=int(n_workers), threads_per_worker=1, processes=True,
                                     host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                     silence_logs=logging.ERROR) as cluster:
        yield cluster


@contextlib.contextmanager
def open_client(dask_workers=None, scheduler=None):
    """A ``dask.distributed.Client``: on a new loopback LocalCluster or on a running scheduler.

    Parameters
    ----------
    dask_workers : int or None
        Start a ``LocalCluster`` of this many worker processes x 1 thread bound to 127.0.0.1.
    scheduler : str or None
        The address of a running scheduler (``tcp://host:8786``); used when given.

    Yields
    ------
    distributed.Client or None
        None when neither is given (train in process).

    Notes
    -----
    A new LocalCluster's workers get :data:`WORKER_ENVIRON` (see :func:`local_cluster`).
    """
    from ._dask import import_distributed

    if scheduler is None and not dask_workers:
        yield None
        return
    _, distributed = import_distributed()
    if scheduler is not None:
        with distributed.Client(scheduler, timeout=60) as client:
            yield client
        return
    with local_cluster(dask_workers) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(int(dask_workers), timeout=300)
        yield client


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
    p.add_argument("--n-inducing", type=int, default=50)
    p.add_argument("--max-iter", type=int, default=10, help="iterations or epochs (default 10)")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="minibatches of B rows (default: batch SEP)")
    p.add_argument("--seed", type=int, default=0)
    return p


def synthetic(n, seed=0, d=8):
    """n rows of the bench's synthetic problem: y = sign(sin x₀ + x₁x₂ - x₃/2 + 0.3 ε)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    f = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    return X, np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)


def _data(args):
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
    from ..sparse import SparseGaussianProcessClassifier

    clf = SparseGaussianProcessClassifier(n_inducing=args.n_inducing, max_iter=args.max_iter,
                                          batch_size=args.batch_size, random_state=args.seed,
                                          progress=False, client=client)
    start = time.perf_counter()
    clf.fit(Xtr, ytr)
    seconds = time.perf_counter() - start
    per_iter = float(np.median(np.diff([0.0] + [h["seconds"] for h in clf.history_])))
    proba = clf.predict_proba(Xte)
    index = np.searchsorted(clf.classes_, yte)
    nll = float(-np.mean(np.log(np.maximum(proba[np.arange(len(yte)), index], 1e-300))))
    return {"seconds": seconds, "seconds_per_iteration": per_iter,
            "test_error": float(np.mean(clf.predict(Xte) != yte)), "test_nll": nll,
            "log_z": clf.log_marginal_likelihood_value_}


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
    records = [dict(where="in process", **_fit(None, args, Xtr, ytr, Xte, yte))]
    runs = [("scheduler " + args.scheduler, dict(scheduler=args.scheduler))] if args.scheduler else \
        [(f"{w} worker{'s' * (w > 1)}", dict(dask_workers=w)) for w in workers]
    for label, how in runs:
        with open_client(**how) as client:
            records.append(dict(where=label, **_fit(client, args, Xtr, ytr, Xte, yte)))
    base = records[0]["seconds_per_iteration"]
    print(f"{'where':<24} {'s/iteration':>12} {'speedup':>8} {'test error':>10} {'test NLL':>9} {'log Z':>12}")
    for r in records:
        r["speedup"] = base / r["seconds_per_iteration"]
        print(f"{r['where']:<24} {r['seconds_per_iteration']:>12.3f} {r['speedup']:>8.2f} "
              f"{r['test_error']:>10.4f} {r['test_nll']:>9.4f} {r['log_z']:>12.3f}")
    return records
