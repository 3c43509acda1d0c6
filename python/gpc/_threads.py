"""The one thread policy: how many threads a gpc call uses, and how BLAS runs inside it.

Every public entry point (the estimators' ``fit``, ``partial_fit``, ``predict*``, ``score``,
``decision_function``, ``log_marginal_likelihood`` …, and :func:`gpc.infer`) runs inside
:func:`entry`, taken once by the estimator base (``gpc._estimator``) and by ``infer``.  The engines
do not pin BLAS themselves: they say which engine runs and how large its matrices are
(:func:`blas`), or ask for their own worker threads (:func:`block_threads`), and this module
decides.

The policy:

- **Workers.** A call's workers are ``n_jobs`` resolved with joblib's convention
  (:func:`resolve_n_jobs`); ``None`` is the number of threads BLAS may use when the call starts
  (threadpoolctl's limit as the caller set it, else ``OMP_NUM_THREADS`` /
  ``OPENBLAS_NUM_THREADS``, else every available core) for a call from the main thread, and one
  for a call from another thread (joblib's threading backend, a web server's request threads:
  the caller's threads already work side by side, and the engines' helper threads handing the
  GIL to and fro with a second thread of the caller's made a small sparse fit twenty times
  slower).
- **BLAS on one thread by default.**  For the whole call every BLAS library in the process runs
  on one thread per call (threadpoolctl), and the caller's limits are restored when the call
  ends.  gpc's engines make many small BLAS calls that alternate with NumPy's and with compiled
  passes; with more BLAS threads than free cores their idle workers spin against each other
  and a fit can take ten to a hundred times as long on a busy machine.
- **BLAS threads where the matrices are large** (:data:`RULES`): the dense engine from
  ``n = DENSE_BLAS_FROM`` rows and HTPC from ``n·l = HTPC_BLAS_FROM`` run BLAS on the call's
  workers; below that size a factorisation takes a few milliseconds, too little to share.  The
  O(n²) element passes (``gpc._parallel.over_rows``) use as many threads as BLAS may then.
- **Engine threads** (:func:`block_threads`, :func:`engine_threads`): the sparse engines and the
  multi-class EP keep BLAS on one thread and run their own blocks of work on the workers, in a
  fixed order, so their results do not depend on the number of threads; they do so from a size
  of work where the threads gain (``BLOCK_THREADS_FROM``, ``CLASS_THREADS_FROM``), on one
  thread below it.
- **One call at a time per process.**  A public call that starts while another runs in another
  thread waits for it (a process-wide lock; nested calls in the same thread and in gpc's own
  worker threads pass).  Each call then owns the process's BLAS settings and all its workers, so
  concurrent calls neither change each other's bits nor slow each other down: two fits in
  threads take what the two take one after the other.  Interleaved in threads, the engines'
  frequent GIL hand-offs made each of two small fits tens of times slower.  For fits in parallel
  use processes (joblib's default "loky" backend), each with ``n_jobs=1``.

Bits: the sparse engines and the multi-class EP give the same bits for every ``n_jobs`` and
every BLAS limit of the caller; the dense engine and HTPC give the same bits for every caller's
limit below their size rule, and above it for a given ``n_jobs`` (multi-threaded LAPACK adds in
an order that depends on its threads).

BLAS libraries: any that threadpoolctl controls (OpenBLAS, as bundled by NumPy's and SciPy's
wheels, MKL, BLIS, FlexiBLAS); threadpoolctl is a run-time dependency.
"""

import functools
import numbers
import os
import sys
import threading
from contextlib import contextmanager

import numpy as np

try:
    from threadpoolctl import ThreadpoolController
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("gpc needs threadpoolctl (a run-time dependency, like numpy and scipy) to "
                      "control the threads of BLAS: pip install threadpoolctl") from exc
try:
    from threadpoolctl import OpenBLASController as _OpenBLASController
except ImportError:  # pragma: no cover - threadpoolctl < 3.5 has no such class (nor the rule)
    _OpenBLASController = None

__all__: list[str] = []

#: rows from which the dense engine's BLAS calls run on the call's workers
DENSE_BLAS_FROM = 2048
#: n·l from which HTPC's BLAS calls run on the call's workers (an (n l)³/3 Cholesky of 1.2e9
#: multiply-adds and up: tens of milliseconds per call, where threads pay for their start)
HTPC_BLAS_FROM = 1536
#: multiply-adds of one problem's (one class's) pass over a step's rows, rows · m², from which
#: the sparse engines' own threads run: two of gpc._parallel's blocks (BLOCK_WORK = 2**21), so a
#: pass has blocks to share; below it waking the helpers and handing them the GIL costs more than
#: they save (glass's six classes of 149 rows at m = 100: 1.2x the time of one thread)
BLOCK_THREADS_FROM = 2 ** 22
#: rows from which the multi-class EP factors its class blocks in threads (at 150 rows the
#: threads made glass's fits 1.4-1.7x slower; at 1000 they factor 1.9x faster)
CLASS_THREADS_FROM = 512
#: per engine, the size from which its BLAS runs on the call's workers (None: always one thread,
#: the engine's own threads take its blocks)
RULES = {"dense": DENSE_BLAS_FROM, "htpc": HTPC_BLAS_FROM, "blocks": None}

_local = threading.local()
#: held by the thread whose public call runs (reentrant for its nested calls)
_calls = threading.RLock()
_state_lock = threading.Lock()
#: threadpoolctl's controller and len(sys.modules) when it was made
_controller = (None, -1)
#: the BLAS limit applied now by this module (None: the caller's, untouched)
_applied = None
#: what restores the caller's limits (the first limiter's restore_original_limits)
_restore = None
#: how many :func:`_limit` contexts are open
_depth = 0
#: the threads BLAS could use before the outermost :func:`_limit` (what the caller set)
_caller_threads = None


# -- cores and n_jobs -----------------------------------------------------------------------------
def available_cores():
    """The cores this process may run on (its CPU affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def controller():
    """threadpoolctl's controller of the loaded BLAS and OpenMP libraries.  Making one scans every
    loaded shared object (milliseconds, against microseconds for a limit through it), so it is
    kept, and made again only after modules were imported: a new extension module can bring a new
    library."""
    global _controller
    made, n_modules = _controller
    if made is None or n_modules != len(sys.modules):
        import scipy.linalg  # noqa: F401  (its BLAS must be loaded to be found)

        made = ThreadpoolController()
        _controller = (made, len(sys.modules))
    return made


def _environment_threads():
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return min(available_cores(), int(value))
    return available_cores()


def blas_cores():
    """The threads scipy's BLAS may use as the caller left it: threadpoolctl's limit (outside
    this module's own pin), else OMP_NUM_THREADS or OPENBLAS_NUM_THREADS, else every available
    core."""
    if _applied is not None and _caller_threads is not None:
        return _caller_threads
    blas = [lib for lib in controller().lib_controllers if lib.user_api == "blas"]
    if not blas:
        return _environment_threads()
    scipy_blas = [lib for lib in blas if "scipy" in os.path.basename(lib.filepath)]
    return max(1, int((scipy_blas or blas)[0].num_threads))


def check_n_jobs(n_jobs):
    """``n_jobs`` as given, after checking it: None or a nonzero integer."""
    if n_jobs is None:
        return None
    if not isinstance(n_jobs, numbers.Integral) or isinstance(n_jobs, bool) or n_jobs == 0:
        raise ValueError(f"n_jobs must be None or a nonzero integer (-1: all cores, -2: all but "
                         f"one, k > 0: k), got {n_jobs!r}")
    return int(n_jobs)


def resolve_n_jobs(n_jobs):
    """The number of workers ``n_jobs`` asks for, with joblib's convention.

    None: as many as BLAS may use (:func:`blas_cores`); -1: every available core; -2: all but one
    (generally cores + 1 + n_jobs, at least 1); k > 0: exactly k; 0 is an error.  Inside a public
    call, None is that call's workers.
    """
    n_jobs = check_n_jobs(n_jobs)
    if n_jobs is None:
        policy = getattr(_local, "policy", None)
        return policy.workers if policy is not None else blas_cores()
    if n_jobs < 0:
        return max(1, available_cores() + 1 + n_jobs)
    return n_jobs


# -- BLAS limits ----------------------------------------------------------------------------------
def _take_control():
    """Let this thread set OpenBLAS's process-wide limit: threadpoolctl lets only one living
    thread do so (the first that did; later calls from others are dropped without a word), and
    gpc's calls run one at a time, so the call running now is the one to set it."""
    clear = getattr(_OpenBLASController, "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)


def _give_up_control():
    clear = getattr(_OpenBLASController, "clear_controlling_thread", None)
    if clear is not None:
        clear()


def _apply(n):
    """Every BLAS library on ``n`` threads (process-wide), unless that is in force already."""
    global _applied, _restore
    if _applied == n:
        return
    _take_control()
    limiter = controller().limit(limits=int(n))
    if _restore is None:
        _restore = limiter.restore_original_limits
    _applied = n


@contextmanager
def _limit(n):
    """BLAS on ``n`` threads while this lasts; the previous limit comes back after it, and the
    caller's own limits after the outermost one."""
    global _depth, _applied, _restore, _caller_threads
    with _state_lock:
        previous = _applied
        if _depth == 0:
            _caller_threads = blas_cores()
        _depth += 1
        _apply(n)
    try:
        yield
    finally:
        with _state_lock:
            _depth -= 1
            if _depth == 0:
                if _restore is not None:
                    _take_control()
                    _restore()
                    _give_up_control()
                _applied, _restore, _caller_threads = None, None, None
            elif previous is not None:
                _apply(previous)


class Policy:
    """What a public call runs with: its ``workers`` and, for the stretch of work running now in
    this thread, the threads BLAS may use (``blas``)."""

    __slots__ = ("workers", "blas")

    def __init__(self, workers, blas=1):
        self.workers, self.blas = int(workers), int(blas)


@contextmanager
def entry(n_jobs=None):
    """The thread policy of one public call (module docstring): waits for another thread's call
    to end, resolves ``n_jobs`` to the call's workers and pins BLAS to one thread until the call
    returns.  Nested in a call (the same thread, or a worker thread that :func:`inherit` started)
    it changes nothing.  Yields the :class:`Policy`."""
    outer = getattr(_local, "policy", None)
    if outer is not None:
        yield outer
        return
    check_n_jobs(n_jobs)
    with _calls:
        caller = blas_cores()
        if n_jobs is not None:
            workers = resolve_n_jobs(n_jobs)
        elif threading.current_thread() is threading.main_thread():
            workers = caller
        else:   # a call from a thread of the caller's, one of several working side by side
            workers = 1
        policy = Policy(workers)
        _local.policy = policy
        try:
            with _limit(1):
                yield policy
        finally:
            _local.policy = None


def dense_call(fn):
    """``fn(K, ...)``, a public function of the dense engine (:func:`gpc.infer`), as a public call
    of its own (:func:`entry` with ``n_jobs=None``) whose BLAS follows the "dense" rule on K's
    rows."""
    @functools.wraps(fn)
    def run(K, *args, **kwargs):
        try:
            n = int(np.shape(K)[0])
        except (ValueError, TypeError, IndexError):     # infer's own checks will name it
            n = 0
        with entry(), blas("dense", n):
            return fn(K, *args, **kwargs)
    return run


def inherit(fn):
    """``fn`` wrapped to run in another thread as part of the current call: public calls made in
    it are nested calls, and its BLAS runs on one thread (the call's workers are these threads)."""
    policy = getattr(_local, "policy", None)
    if policy is None:
        return fn
    inner = Policy(1)

    def run(*args, **kwargs):
        saved = getattr(_local, "policy", None)
        _local.policy = inner
        try:
            return fn(*args, **kwargs)
        finally:
            _local.policy = saved
    return run


def blas_now():
    """The threads BLAS may use for a call made now from this thread: the stretch's grant inside
    a public call (:func:`blas`), 1 in a thread of gpc's own, else :func:`blas_cores`."""
    policy = getattr(_local, "policy", None)
    if policy is not None:
        return policy.blas
    if threading.current_thread() is not threading.main_thread():
        return 1
    return blas_cores()


@contextmanager
def blas(engine, size=0):
    """BLAS for a stretch of ``engine``'s work on matrices of ``size`` rows (:data:`RULES`): the
    call's workers from the engine's size on, else one thread.  Outside a public call the
    workers are :func:`blas_cores`.  Yields the number of BLAS threads."""
    if engine not in RULES:
        raise ValueError(f"unknown engine {engine!r}; known: {sorted(RULES)}")
    policy = getattr(_local, "policy", None)
    workers = policy.workers if policy is not None else blas_cores()
    start = RULES[engine]
    n = workers if start is not None and size >= start else 1
    if policy is not None:
        saved, policy.blas = policy.blas, n
    try:
        with _limit(n):
            yield n
    finally:
        if policy is not None:
            policy.blas = saved


# -- the engines' own threads ---------------------------------------------------------------------
def engine_threads(engine, size, n_jobs=None):
    """The threads of an engine's own work (not BLAS's): ``n_jobs`` resolved
    (:func:`resolve_n_jobs`) from the engine's size on, else one.  ``engine`` is "blocks" (the
    sparse engines; ``size`` one problem's pass over a step's rows, rows · m² multiply-adds,
    from ``BLOCK_THREADS_FROM``) or "classes" (the multi-class EP's class blocks; ``size`` the
    rows, from ``CLASS_THREADS_FROM``)."""
    starts = {"blocks": BLOCK_THREADS_FROM, "classes": CLASS_THREADS_FROM}
    if engine not in starts:
        raise ValueError(f"unknown engine {engine!r}; known: {sorted(starts)}")
    workers = resolve_n_jobs(n_jobs)
    return workers if size >= starts[engine] else 1


def threads_now():
    """The threads ``gpc._parallel.over_blocks`` uses in this thread now: the innermost
    :func:`block_threads` context's, 1 outside one (and inside a block)."""
    if getattr(_local, "in_block", False):
        return 1
    return getattr(_local, "threads", 1)


@contextmanager
def block_threads(n_threads):
    """While this lasts, ``gpc._parallel.over_blocks`` called from this thread runs its blocks on
    ``n_threads`` threads (the caller and sleeping helpers) and BLAS runs on one thread per call
    (the "blocks" rule).  Yields the number of threads."""
    n = max(1, int(n_threads))
    with blas("blocks"):
        previous = getattr(_local, "threads", 1)
        _local.threads = n
        try:
            yield n
        finally:
            _local.threads = previous
