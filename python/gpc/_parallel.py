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
runs on one thread per call (:func:`pinned_blas`): the threads are the engine's, which sleep when
idle, and no BLAS thread spins on a core that another process or another block needs.
"""

import ctypes
import itertools
import os
import queue
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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


#: threadpoolctl's controller of the loaded BLAS and OpenMP libraries, and len(sys.modules) when it
#: was made (:func:`_threadpool_controller`)
_controller = (None, -1)


def _threadpool_controller():
    """A ThreadpoolController, or None without threadpoolctl (installed with scikit-learn).  Making
    one scans every loaded shared object (milliseconds, against microseconds for a limit through
    it), so it is kept, and made again only after modules were imported: a new extension module
    can bring a new library."""
    global _controller
    controller, n_modules = _controller
    if controller is None or n_modules != len(sys.modules):
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            return None
        import scipy.linalg  # noqa: F401  (its BLAS must be loaded to be found)
        controller = ThreadpoolController()
        _controller = (controller, len(sys.modules))
    return controller


def _blas_controller():
    # scipy's BLAS library under threadpoolctl; None without it
    controller = _threadpool_controller()
    if controller is None:
        return None
    blas = [lib for lib in controller.lib_controllers if lib.user_api == "blas"]
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


def blas_cores():
    """The threads scipy's BLAS may use: threadpoolctl's limit when threadpoolctl is installed, else
    OMP_NUM_THREADS or OPENBLAS_NUM_THREADS, else every available core."""
    controller = _blas_controller()
    if controller is not None:
        return max(1, int(controller.num_threads))
    return _environment_threads()


def blas_threads():
    """The number of threads scipy's BLAS would use for a call now (1 inside a thread other than
    the main one: that thread is itself one of several working in parallel, e.g. ``n_jobs``)."""
    if threading.current_thread() is not threading.main_thread():
        return 1
    return blas_cores()


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

_local = threading.local()
_pin_lock = threading.Lock()
_pin_depth = 0
_pin_state = (None, False)


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


def threads_now():
    """The threads :func:`over_blocks` uses in this thread now: the innermost
    :func:`block_threads` context's, 1 outside one (and inside a block)."""
    if getattr(_local, "in_block", False):
        return 1
    return getattr(_local, "threads", 1)


@contextmanager
def block_threads(n_threads):
    """While this lasts, :func:`over_blocks` called from this thread runs its blocks on
    ``n_threads`` threads (the caller and a pool), and every BLAS library runs on one thread per
    call (:func:`pinned_blas`).  Where BLAS cannot be pinned the blocks run in the calling thread
    alone and BLAS keeps its own threads.  Yields the number of threads in use."""
    n = max(1, int(n_threads))
    with pinned_blas() as pinned:
        previous = getattr(_local, "threads", 1)
        _local.threads = n if pinned else 1
        try:
            yield _local.threads
        finally:
            _local.threads = previous


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
    threads = 1 if in_block else min(getattr(_local, "threads", 1), total)
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


# -- BLAS on one thread per call ----------------------------------------------------------------
def _openblas_calls():
    """(set_num_threads, get_num_threads) of every OpenBLAS library loaded in this process, found
    without threadpoolctl: the shared objects that /proc/self/maps lists (Linux) and that export
    OpenBLAS's threading calls, under its own names or scipy's and NumPy's builds' (prefix
    scipy_, suffix 64_ for the 64-bit interface)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if "openblas" in os.path.basename(line.split()[-1]).lower()})
    except (OSError, IndexError):
        return []
    calls = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("openblas", "scipy_openblas"):
            for suffix in ("", "64_"):
                setter = getattr(lib, f"{name}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{name}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    setter.argtypes, setter.restype = [ctypes.c_int], None
                    getter.restype = ctypes.c_int
                    calls.append((setter, getter))
                    break
            else:
                continue
            break
    return calls


def _blas_libraries():
    """How BLAS is pinned here: ("threadpoolctl", controller) when threadpoolctl is installed,
    else ("openblas", calls) for the OpenBLAS libraries found by :func:`_openblas_calls`, else
    (None, None)."""
    controller = _threadpool_controller()
    if controller is not None:
        return "threadpoolctl", controller
    return _openblas_libraries()


@lru_cache(maxsize=1)
def _openblas_libraries():
    calls = _openblas_calls()
    return ("openblas", calls) if calls else (None, None)


def _single_threaded_by_environment():
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(name, "").split(",")[0].strip() == "1":
            return True
    return False


def _pin():
    """Every BLAS library to one thread per call: (undo, pinned)."""
    how, what = _blas_libraries()
    if how == "threadpoolctl":
        limiter = what.limit(limits=1, user_api="blas")
        return limiter.restore_original_limits, True
    if how == "openblas":
        before = [getter() for _, getter in what]
        for setter, _ in what:
            setter(1)

        def undo():
            for (setter, _), n in zip(what, before):
                setter(n)
        return undo, True
    return (lambda: None), _single_threaded_by_environment()


@contextmanager
def pinned_blas():
    """BLAS on one thread per call while this lasts, process-wide (nested uses share one pin; the
    outermost restores what was there): threadpoolctl's limit when threadpoolctl is installed,
    else OpenBLAS's own ``openblas_set_num_threads`` by ctypes on the OpenBLAS libraries this
    process has loaded (scipy's and NumPy's wheels bundle OpenBLAS).  Yields whether BLAS is known
    to run on one thread: False with another BLAS (MKL, Accelerate) and no threadpoolctl, unless
    OPENBLAS_NUM_THREADS, OMP_NUM_THREADS or MKL_NUM_THREADS is 1."""
    global _pin_depth, _pin_state
    with _pin_lock:
        if _pin_depth == 0:
            _pin_state = _pin()
        _pin_depth += 1
        pinned = _pin_state[1]
    try:
        yield pinned
    finally:
        with _pin_lock:
            _pin_depth -= 1
            if _pin_depth == 0:
                _pin_state[0]()
                _pin_state = (None, False)
