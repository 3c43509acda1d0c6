"""Helpers shared by the reproductions: whitening, progress bars, data paths."""

import contextlib
import json
import os
import warnings
from importlib import resources

import numpy as np

from .._estimator import available_cores
from ..exceptions import ConvergenceWarning

def data_path(filename):
    """Path of a CSV shipped inside the package (works from a wheel and an editable install)."""
    return str(resources.files("gpc.datasets") / "data" / filename)


def whiten(X_train, X_test):
    """Zero mean and identity covariance from the training part (PL §IV, after Kuss & Rasmussen).

    ZCA whitening W = Σ^{-1/2} (eigh of the training covariance); directions with eigenvalue below
    1e-10 × the largest are dropped (a constant column would otherwise make W singular).
    """
    mu = X_train.mean(axis=0)
    Xc = X_train - mu
    cov = Xc.T @ Xc / max(len(X_train) - 1, 1)
    evals, evecs = np.linalg.eigh(cov)
    keep = evals > 1e-10 * evals.max()
    W = evecs[:, keep] / np.sqrt(evals[keep])
    return Xc @ W, (X_test - mu) @ W


def standardise(X_train, X_test):
    """Zero mean and unit standard deviation per feature, from the training part."""
    mu, sd = X_train.mean(axis=0), X_train.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    return (X_train - mu) / sd, (X_test - mu) / sd


def progress(iterable, total=None, desc=None, enabled=True):
    """tqdm around ``iterable`` when ``enabled`` and tqdm is installed (to stderr, left behind)."""
    if enabled:
        try:
            from tqdm import tqdm
            return tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True)
        except ImportError:  # pragma: no cover
            pass
    return iterable


@contextlib.contextmanager
def count_convergence_warnings():
    """Collect ConvergenceWarnings (the papers cap EP/PL at 10 iterations on purpose); yields a list."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        yield caught


def multiclass_scores(proba, classes, y):
    """(error, mean negative log predictive probability) of class probabilities ``proba``
    (columns in the order of the sorted ``classes``) against labels ``y``."""
    classes = np.asarray(classes)
    p_true = np.clip(proba[np.arange(len(y)), np.searchsorted(classes, y)], 1e-300, 1.0)
    return float(np.mean(classes[np.argmax(proba, axis=1)] != y)), float(-np.mean(np.log(p_true)))


def mean_se(values):
    """Mean and standard error (ddof=1) of a 1-D sequence; se is 0 for one value."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return float("nan"), float("nan")
    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
    return float(v.mean()), se


def _share_cores(jobs):
    """Pool initializer: give each of ``jobs`` workers its share of the cores for BLAS threads.

    Without it every worker's OpenBLAS starts one thread per core, and ``jobs`` workers on as many
    cores spin against each other (measured: 2 workers on 2 cores ran PL Table I fits 3-5x slower
    than one process).
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(max(1, available_cores() // jobs))


class TaskCache:
    """Results of finished tasks in a JSON-lines file, one ``{"key": ..., "result": ...}`` per
    line, appended as each task finishes: a run that is interrupted keeps them, and a run with the
    same file skips the tasks whose key it holds.

    A result must survive a JSON round trip (numbers, strings, None, lists, dicts); floats do so
    exactly.  A last line cut short by the interrupt is ignored.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self.done = {}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read()
            for line in text.splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:   # the line being written when the run stopped
                    continue
                self.done[entry["key"]] = entry["result"]
            if text and not text.endswith("\n"):
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write("\n")

    def add(self, key, result):
        """Record one finished task (written and flushed at once)."""
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": key, "result": result}) + "\n")
        self.done[key] = result


def map_tasks(fn, tasks, jobs=1, desc=None, show=True, cache=None, cache_keys=None):
    """fn over tasks, in a process pool when jobs > 1, with a progress bar; results in task order.

    With ``cache`` (a :class:`TaskCache`) and ``cache_keys`` (one string per task), the tasks
    whose key the cache holds take their result from it, and every other task's result is added
    to it as soon as that task finishes.
    """
    results = [None] * len(tasks)
    todo = list(range(len(tasks)))
    if cache is not None:
        todo = [i for i in todo if cache_keys[i] not in cache.done]
        for i in set(range(len(tasks))) - set(todo):
            results[i] = cache.done[cache_keys[i]]

    def finish(i, result):
        results[i] = result
        if cache is not None:
            cache.add(cache_keys[i], result)

    if jobs > 1 and len(todo) > 1:
        from concurrent.futures import ProcessPoolExecutor, as_completed
        pool = ProcessPoolExecutor(max_workers=jobs, initializer=_share_cores, initargs=(jobs,))
        try:
            futures = {pool.submit(fn, tasks[i]): i for i in todo}
            for future in progress(as_completed(futures), total=len(todo), desc=desc, enabled=show):
                finish(futures[future], future.result())
        finally:
            # an interrupt cancels the tasks that have not started instead of waiting for them
            pool.shutdown(wait=True, cancel_futures=True)
    else:
        for i in progress(todo, total=len(todo), desc=desc, enabled=show):
            finish(i, fn(tasks[i]))
    return results


def check_names(names, allowed, kind, experiment):
    """Raise ``ValueError("unknown KIND 'x' for EXPERIMENT; choose from …")`` for the first of
    ``names`` that is not in ``allowed`` (listed in its order)."""
    for name in names:
        if name not in allowed:
            raise ValueError(f"unknown {kind} {name!r} for {experiment}; choose from "
                             f"{', '.join(allowed)}")


def map_cells(fn, tasks, keys, jobs=1, desc=None, show=True, cost=None, cache=None,
              cache_keys=None):
    """fn over tasks (:func:`map_tasks`, with its ``cache`` and ``cache_keys``), the results grouped
    by their task's key: {key: [results in task order]}, keys in the order they first occur.  With
    ``cost`` (a function of a task) the costliest tasks start first, so that a pool's last tasks are
    short; the grouping does not depend on the order."""
    order = list(range(len(tasks)))
    if cost is not None:
        order.sort(key=lambda i: -cost(tasks[i]))
    done = map_tasks(fn, [tasks[i] for i in order], jobs=jobs, desc=desc, show=show, cache=cache,
                     cache_keys=None if cache_keys is None else [cache_keys[i] for i in order])
    results = [None] * len(tasks)
    for i, r in zip(order, done):
        results[i] = r
    grouped = {}
    for key, r in zip(keys, results):
        grouped.setdefault(key, []).append(r)
    return grouped
