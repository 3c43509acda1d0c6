"""The compiled core's O(n²) element passes, and the sparse engine's blocks, on every core.

A pass over an n × n matrix (the kernel matrix, B = I + S K S, the evidence gradient's M, the
kernel's gradient contraction) is a compiled loop over rows with the GIL released; ``over_rows``
splits its rows into fixed ranges and runs them in a pool of Python threads, as many as scipy's
BLAS is allowed to use at the time of the call (threadpoolctl's limits and OMP_NUM_THREADS /
OPENBLAS_NUM_THREADS are followed).

The threads are Python threads, not OpenMP's: an idle OpenMP worker spins for milliseconds after
its parallel loop, and these passes sit between LAPACK calls whose own threads need the same
cores, while a pool thread waiting for work sleeps on a lock.

The ranges depend on n only, and a reduction adds its ranges' partial results in range order, so
a pass gives the same bits whatever the number of threads.

The sparse engine (gpc.sparse) works on blocks of b rows against m inducing points: its per-row
passes and b x m x m products are cut into fixed blocks of rows (:func:`row_blocks`) that depend on
b and m only, each a compiled call that releases the GIL, which :func:`over_blocks` runs on the
threads of the innermost :func:`block_threads` context.  A block writes its own rows and its own
m x m partial sums, which are added in block order (by fixed row stripes, :func:`row_stripes`), so
these passes too give the same bits whatever the number of threads.  Inside such a context BLAS
runs on one thread per call: the threads are the engine's, which sleep when idle, and no BLAS
thread spins on a core that another process or another block needs.  How many threads a pass
gets is the thread policy's decision (gpc._threads); this module only runs the passes.
"""

import itertools
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from ._threads import _local, blas_now, block_threads, threads_now

#: rows read at a time by a pass over the data (checking a lazily read X, a sparse fit's blocks
#: outside minibatches, prediction, a shard task's blocks)
BLOCK_ROWS = 4096

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


def _executor():
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, min(N_RANGES, os.cpu_count() or 1)),
                                       thread_name_prefix="gpc-rows")
        return _pool


def over_rows(fn, n, *args, cost="lower"):
    """``[fn(*args, start=a, stop=b) for (a, b) in row_ranges(n, cost)]``, the ranges shared
    out among as many threads as BLAS may use now (``gpc._threads.blas_now``: the thread policy's
    grant; ``fn`` releases the GIL and writes disjoint rows).
    Returns the results in range order."""
    ranges = row_ranges(n, cost)
    threads = min(blas_now(), len(ranges))
    if threads <= 1:
        return [fn(*args, start=a, stop=b) for a, b in ranges]

    def run(group):
        return [fn(*args, start=a, stop=b) for a, b in group]

    groups = [ranges[k::threads] for k in range(threads)]
    # the calling thread takes one group itself while the pool runs the others
    futures = [_executor().submit(run, group) for group in groups[1:]]
    results = [run(groups[0])] + [f.result() for f in futures]
    return [results[k % threads][k // threads] for k in range(len(ranges))]


# -- the sparse engine's blocks -------------------------------------------------------------------
#: multiply-adds of BLAS work that make a block of rows or a column panel worth one task
BLOCK_WORK = 2 ** 21
#: multiply-adds that make one column panel of an m x m product worth one task (a panel is one or
#: two BLAS calls, a block of rows several passes: panels are cut finer, for the threads' balance)
PANEL_WORK = 2 ** 20
#: the most blocks of one pass (each block's m x m partial sums cost memory traffic)
MAX_BLOCKS = 16
#: additions (over memory) that make one stripe of a sum of blocks' m x m parts worth one task
STRIPE_WORK = 2 ** 16



@lru_cache(maxsize=512)
def row_blocks(n, row_work, max_blocks=MAX_BLOCKS):
    """Fixed ranges [a, b) covering range(n), of nearly equal size: about n · row_work /
    BLOCK_WORK of them (``row_work``: a row's multiply-adds), at least 1 and at most
    ``max_blocks``.  They depend on n and row_work only, never on the threads (a tuple, cached:
    a step asks for the same blocks many times)."""
    if n <= 0:
        return ()
    count = max(1, min(int(round(n * row_work / BLOCK_WORK)), max_blocks, n))
    edges = (np.arange(count + 1) * n) // count
    return tuple(zip(edges[:-1].tolist(), edges[1:].tolist()))


@lru_cache(maxsize=512)
def row_stripes(m, work, lower=False):
    """Fixed row ranges [a, b) of an m x m sum of ``work`` additions (the blocks' partial sums
    added in block order), of equal work, about work / STRIPE_WORK of them (at most MAX_BLOCKS);
    with ``lower`` the sum fills a lower triangle, whose row i costs i + 1.  They depend on m and
    work only (a tuple, cached)."""
    if m <= 0:
        return ()
    count = max(1, min(int(round(work / STRIPE_WORK)), MAX_BLOCKS, m))
    k = np.arange(count + 1) / count
    edges = np.unique(np.round(m * np.sqrt(k) if lower else m * k).astype(int))
    return tuple(zip(edges[:-1].tolist(), edges[1:].tolist()))


@lru_cache(maxsize=512)
def column_panels(m, work):
    """Fixed column panels [a, b) of an m x m product whose column j costs ~(m - j)² (a
    triangular factor's trailing part: M^T S M for lower M), of equal work: about work /
    PANEL_WORK of them (``work``: the product's multiply-adds), at least 1 and at most
    MAX_BLOCKS; the k-th boundary of N at m - m (1 - k/N)^(1/3).  They depend on m and work
    only (a tuple, cached)."""
    if m <= 0:
        return ()
    count = max(1, min(int(round(work / PANEL_WORK)), MAX_BLOCKS, m))
    k = np.arange(count + 1) / count
    edges = np.unique(np.round(m - m * np.cbrt(1.0 - k)).astype(int))
    return tuple(zip(edges[:-1].tolist(), edges[1:].tolist()))


class _BlockWorkers:
    """The sleeping threads that take :func:`over_blocks`' passes: each waits on one shared queue
    (a lock: it sleeps), takes a pass's ``work`` and runs blocks of it until none is left.  A pass
    posts one ``work`` per helper it wants; a helper that takes it after the pass ended finds no
    block left and returns at once, so no pass waits for a helper to wake."""

    def __init__(self):
        self.queue = queue.SimpleQueue()
        self.started = 0
        self.pid = os.getpid()

    def post(self, work, helpers):
        with _pool_lock:
            while self.started < helpers:
                self.started += 1
                threading.Thread(target=self._serve, daemon=True,
                                 name=f"gpc-blocks-{self.started}").start()
        for _ in range(helpers):
            self.queue.put(work)

    def _serve(self):
        get = self.queue.get
        while True:
            get()()             # a pass's work: its blocks' errors go to the pass's caller


_block_workers = None
#: an interrupted pass waits for the blocks its helpers are running (one block's work, each a
#: short nogil call), not for a count of blocks; this only bounds a block that never ends
_STOP_WAIT = 30.0


def _workers():
    """The process's :class:`_BlockWorkers` (made anew in a child process after ``fork``, whose
    copy of the parent's threads does not exist)."""
    global _block_workers
    workers = _block_workers
    if workers is None or workers.pid != os.getpid():
        with _pool_lock:
            if _block_workers is None or _block_workers.pid != os.getpid():
                _block_workers = _BlockWorkers()
            workers = _block_workers
    return workers


class Deferred:
    """A side task of the block threads (:func:`defer`): ``result()`` runs it now unless an
    :func:`over_blocks` call of its thread ran it already, and returns its value or raises its
    error."""

    __slots__ = ("fn", "done", "value", "error")

    def __init__(self, fn):
        self.fn, self.done, self.value, self.error = fn, False, None, None

    def run(self):
        if self.done:
            return
        try:
            self.value = self.fn()
        except Exception as exc:  # noqa: BLE001 - raised by result()
            self.error = exc
        self.done = True
        self.fn = None

    def result(self):
        pending = getattr(_local, "pending", None)
        if pending and self in pending:
            pending.remove(self)
        self.run()
        if self.error is not None:
            raise self.error
        return self.value


def defer(fn):
    """``fn()`` as a side task: the next :func:`over_blocks` call of this thread runs it beside its
    blocks (first, on whichever thread is free), and :func:`flush` or the returned
    :class:`Deferred`'s ``result()`` runs it if none has.  ``fn`` must be independent of all that
    runs between this call and its result: it reads and writes memory nothing else in between
    touches, so its bits and everything else's are those of running it at once, whatever the
    threads.  This is how independent once-per-step pieces of the sparse engine overlap with its
    blocks of rows."""
    task = Deferred(fn)
    if not hasattr(_local, "pending"):
        _local.pending = []
    _local.pending.append(task)
    return task


def flush():
    """Run the side tasks still pending in this thread (:func:`defer`), in their order; raises
    the first one's error, if any."""
    pending = getattr(_local, "pending", None)
    while pending:
        pending[0].result()


def over_blocks(fn, n_blocks):
    """``[fn(j) for j in range(n_blocks)]``, the blocks shared out among :func:`threads_now`
    threads, each taking the next block when it is done with one (``fn`` releases the GIL for its
    work and writes its own block's memory).  Returns the results in block order; if blocks
    raise, the error of the first such block is raised once every block has run.  Side tasks
    pending in this thread (:func:`defer`) run first, beside the blocks.

    The caller runs blocks itself and wakes ``threads - 1`` sleeping helpers
    (:class:`_BlockWorkers`); it returns when every block has finished, without waiting for a
    helper that woke too late to take one."""
    in_block = getattr(_local, "in_block", False)
    side = getattr(_local, "pending", None)
    if side and not in_block:
        _local.pending = []
    else:
        side = []
    total = len(side) + n_blocks
    # one block is below BLOCK_WORK (row_blocks): it and the side tasks beside it take less than
    # waking a helper and handing the GIL back and forth
    threads = 1 if in_block or n_blocks <= 1 else min(getattr(_local, "threads", 1), total)
    if threads <= 1:
        for task in side:
            task.run()
        return [fn(j) for j in range(n_blocks)]
    results = [None] * n_blocks
    errors = {}
    stop = []
    claim = itertools.count().__next__          # atomic under the GIL: each index taken once
    settled = itertools.count(1).__next__
    finished = threading.Event()
    first_block = len(side)
    helpers_idle = threading.Condition()
    busy = [0]                                  # helpers inside work (they are never interrupted)

    def work(caller=False):
        # every index taken is settled once, run or (after a stop) skipped; the last sets finished
        if not caller:
            with helpers_idle:
                busy[0] += 1
        _local.in_block = True
        try:
            while True:
                k = total
                try:
                    k = claim()
                    if k >= total:
                        return
                    if stop:
                        pass
                    elif k < first_block:
                        side[k].run()
                    else:
                        try:
                            results[k - first_block] = fn(k - first_block)
                        except Exception as exc:  # noqa: BLE001 - raised below, in block order
                            errors[k - first_block] = exc
                        except BaseException as exc:    # a helper's goes to the caller too
                            if caller:
                                raise
                            errors[k - first_block] = exc
                finally:
                    if k < total and settled() == total:
                        finished.set()
        finally:
            _local.in_block = False
            if not caller:
                with helpers_idle:
                    busy[0] -= 1
                    helpers_idle.notify_all()

    _workers().post(work, threads - 1)
    try:
        work(caller=True)
        finished.wait()
    except BaseException:           # KeyboardInterrupt: the blocks not started are skipped and
        stop.append(True)           # the caller returns once the helpers' running blocks end;
        with helpers_idle:          # an index the interrupt took from the caller is not awaited
            helpers_idle.wait_for(lambda: busy[0] == 0, _STOP_WAIT)
        raise
    if errors:
        raise errors[min(errors)]
    return results


def over_calls(calls):
    """``[call() for call in calls]`` through :func:`over_blocks`: independent blocks of work,
    possibly from several passes at once, on the threads of the caller's context."""
    return over_blocks(lambda j: calls[j](), len(calls))
