"""The compiled core's O(n²) element passes on every core that BLAS uses.

A pass over an n × n matrix (the kernel matrix, B = I + S K S, the evidence gradient's M, the
kernel's gradient contraction) is a compiled loop over rows with the GIL released; ``over_rows``
splits its rows into fixed ranges and runs them in a pool of Python threads, as many as scipy's
BLAS is allowed to use at the time of the call (threadpoolctl's limits and OMP_NUM_THREADS /
OPENBLAS_NUM_THREADS are followed).

Why Python threads and not OpenMP: an idle OpenMP worker spins for milliseconds after its
parallel loop, and these passes sit between LAPACK calls whose own threads need the same cores
(two-thread parallel EP was slower than one-thread with OpenMP passes before a Cholesky).  A pool
thread waiting for work sleeps on a lock instead.

The ranges depend on n only, and a reduction adds its ranges' partial results in range order, so
a pass gives the same bits whatever the number of threads.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

#: below this many rows a pass is one call (dispatching a range costs tens of microseconds)
MIN_ROWS = 512
#: the number of row ranges of a pass from MIN_ROWS rows up
N_RANGES = 8

_pool = None
_pool_lock = threading.Lock()


def row_ranges(n, cost="lower"):
    """Fixed ranges [a, b) covering range(n) with equal work: ``cost`` "rows" (every row alike),
    "lower" (row i of a lower triangle costs ~i: the k-th boundary at n √(k / N_RANGES)) or "upper"
    (index i costs ~n - i: column i of a lower triangle)."""
    if n < MIN_ROWS:
        return [(0, n)]
    k = np.arange(N_RANGES + 1) / N_RANGES
    if cost == "rows":
        edges = n * k
    elif cost == "lower":
        edges = n * np.sqrt(k)
    elif cost == "upper":
        edges = n - n * np.sqrt(k[::-1])
    else:
        raise ValueError(f"cost must be 'rows', 'lower' or 'upper', got {cost!r}")
    edges = np.round(edges).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


@lru_cache(maxsize=1)
def _blas_controller():
    # scipy's BLAS library under threadpoolctl (installed with scikit-learn); None without it
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    import scipy.linalg  # noqa: F401  (its BLAS must be loaded to be found)
    blas = [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
    scipy_blas = [lib for lib in blas if "scipy" in os.path.basename(lib.filepath)]
    return (scipy_blas or blas or [None])[0]


def _environment_threads():
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return min(cores, int(value))
    return cores


def blas_threads():
    """The number of threads scipy's BLAS would use for a call now (1 inside a thread other than
    the main one: that thread is itself one of several working in parallel, e.g. ``n_jobs``)."""
    if threading.current_thread() is not threading.main_thread():
        return 1
    controller = _blas_controller()
    if controller is not None:
        return max(1, int(controller.num_threads))
    return _environment_threads()


def _executor():
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, min(N_RANGES, os.cpu_count() or 1)),
                                       thread_name_prefix="gpc-rows")
        return _pool


def over_rows(fn, n, *args, cost="lower"):
    """``[fn(*args, start=a, stop=b) for (a, b) in row_ranges(n, cost)]``, the ranges shared
    out among ``blas_threads()`` threads (``fn`` releases the GIL and writes disjoint rows).
    Returns the results in range order."""
    ranges = row_ranges(n, cost)
    threads = min(blas_threads(), len(ranges))
    if threads <= 1:
        return [fn(*args, start=a, stop=b) for a, b in ranges]

    def run(group):
        return [fn(*args, start=a, stop=b) for a, b in group]

    groups = [ranges[k::threads] for k in range(threads)]
    # the calling thread takes one group itself while the pool runs the others
    futures = [_executor().submit(run, group) for group in groups[1:]]
    results = [run(groups[0])] + [f.result() for f in futures]
    return [results[k % threads][k // threads] for k in range(len(ranges))]
