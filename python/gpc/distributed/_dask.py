"""The Dask engine: shards persisted on the workers once, one actor per shard holding its rows and sites.

Where things live
-----------------
* Each shard's rows are a chunk of a persisted Dask array.  A NumPy input becomes
  ``da.from_array(x, chunks=(sizes, -1))`` with one chunk per worker (the scheduler then holds the source
  array inside the graph); a Dask input keeps its row chunks (its columns are gathered into one chunk).
  The rows are sent to a worker once and never again per step.
* One *actor* per shard (:class:`ShardActor`, shard k on worker k in turn) keeps a reference to the
  rows and the shard's sites.  A step is one call per shard to its actor, relayed by the scheduler:
  ``step``, q and θ go out pickled once per round (O(m²)); the partial, the row count and a flag saying
  whether the sites changed come back (O(m²)).  The sites never leave the worker.  A call bypasses the
  scheduler's task machinery, which would add a step task and a report task per shard and round.
* The master adds the partials in shard order (`add_partials`), so the sum equals the in-process sum.

Resilience
----------
The step functions are pure, so a shard's sites are a function of its rows and of the steps it was given.
The master keeps that recipe: a *replay log* of the steps that changed the sites (a step that returns the
sites object it was given changes nothing and is not logged), each with its q and θ.  When a call fails
because the shard's worker is lost (killed, crashed, unreachable), the engine creates a new actor from the
shard's persisted rows (the scheduler recomputes lost chunks from their lineage) and replays the log on
it, then retries the call.  The sites are therefore **recovered exactly, not reset**: a disturbed fit
equals an undisturbed one to rounding.  Each recovery is logged (``logging.getLogger("gpc.distributed")``,
WARNING): the lost worker, the shard, where it was rebuilt and how many steps were replayed.

The log holds each logged step's pickled (step, q, θ), the bytes that were sent anyway.  When its size
passes ``replay_budget`` bytes (and the sites' size), the engine takes a checkpoint: every shard's sites come to
the master once (O(n)) and the log restarts from them, so recovery memory stays bounded for long
minibatch fits.

Every wait is bounded (``timeout``).  A closed client, a call that does not finish within the timeout,
or a reset connection (after which the scheduler has released the client's actors, shards and sites with
them) raises `DistributedError`: the engine does not try to rebuild a fit the scheduler forgot.
"""

import contextlib
import logging
import math

import numpy as np

from ._engine import add_partials, check_arrays, shard_bounds

logger = logging.getLogger("gpc.distributed")

INSTALL_HINT = 'the Dask engine needs dask.distributed: pip install "gpc[distributed]"'

#: bytes of q and θ the replay log may hold before a checkpoint brings the sites home (at m = 200 a
#: round's q and θ are about 0.7 MB, so about 90 site-changing steps)
REPLAY_BUDGET = 64 * 2 ** 20


class DistributedError(RuntimeError):
    """The Dask cluster cannot finish a step: the client is closed, the scheduler is gone, or a wait timed out."""


def import_distributed():
    """``(dask.array, distributed)``, or an ImportError that names the extra to install."""
    try:
        import dask.array as da
        import distributed
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return da, distributed


#: glibc's mmap threshold for the workers.  Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536, which
#: also freezes glibc's adaptive mmap threshold at 128 KiB: every block of a shard task (BLOCK_ROWS
#: rows x m doubles, 6.5 MB at m = 200) is then a fresh mmap whose pages are faulted in anew, CPU a
#: plain process does not spend.  A 16 MiB threshold serves those blocks from the heap again.
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


class ShardActor:
    """One shard on its worker: its rows, its sites and the sites before the last step (for a revert).

    Parameters
    ----------
    init_sites : callable, ``init_sites(n_rows)`` → the shard's first sites
    *rows : the shard's arrays (resolved from the persisted chunks on this worker, not copied)
    """

    def __init__(self, init_sites, *rows):
        from distributed import get_worker

        self.rows = rows
        self.sites = init_sites(int(rows[0].shape[0]))
        self.previous = None
        self.address = get_worker().address

    def run(self, payload, shard_arg, revert):
        """One step: ``payload`` pickles (step, q, θ) once for every shard; ``shard_arg`` is this shard's
        own argument or None (`DaskEngine.step`).  ``revert`` first gives the sites back their value
        before the last step.  Returns (partial, rows, address, changed)."""
        from distributed.protocol.pickle import loads

        if revert:
            self.sites, self.previous = self.previous, None
        new_sites, partial = _apply(loads(payload), shard_arg, self.rows, self.sites)
        changed = new_sites is not self.sites
        self.previous, self.sites = self.sites, new_sites
        return partial, int(self.rows[0].shape[0]), self.address, changed

    def restore(self, sites, log):
        """After a lost worker: start from ``sites`` (None: the first sites) and replay the logged steps,
        ``log`` a list of (payload, this shard's argument)."""
        from distributed.protocol.pickle import loads

        if sites is not None:
            self.sites = sites
        for payload, shard_arg in log:
            self.previous = self.sites
            self.sites, _ = _apply(loads(payload), shard_arg, self.rows, self.sites)
        return self.address

    def get_sites(self, which, select, revert):
        """The current sites, or those before the last step (``which="previous"``); ``select``, when
        given, picks what of them to send (`DaskEngine.sites`).  ``revert`` first gives the sites back
        their value before the last step, as in `run`."""
        if revert:
            self.sites, self.previous = self.previous, None
        sites = self.previous if which == "previous" else self.sites
        return sites if select is None else select(sites)


def _apply(call, shard_arg, rows, sites):
    step, q_state, theta = call
    return step(*rows, q_state, theta if shard_arg is None else (theta, shard_arg), sites)


def _nbytes(obj, depth=3):
    """Bytes of the arrays inside ``obj`` (containers and object attributes, ``depth`` levels down)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if depth == 0:
        return 0
    if isinstance(obj, dict):
        return sum(_nbytes(v, depth - 1) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(v, depth - 1) for v in obj)
    return sum(_nbytes(v, depth - 1) for v in getattr(obj, "__dict__", {}).values())


class DaskEngine:
    """Run the shards' steps on a ``dask.distributed.Client``, one actor per shard.

    Parameters
    ----------
    client : distributed.Client
        A connected client.
    n_shards : int, optional
        Shards a NumPy input is split into; default the number of workers when `load` is called.
    timeout : float
        Seconds any one wait on the cluster may take (a step, loading the shards); default 300.
    replay_budget : int
        Bytes of logged q and θ kept for recovery before a checkpoint (default 64 MiB).
    """

    def __init__(self, client, n_shards=None, timeout=300.0, replay_budget=REPLAY_BUDGET):
        _, distributed = import_distributed()
        if not isinstance(client, distributed.Client):
            raise TypeError(f"client must be a dask.distributed.Client, got {type(client).__name__}")
        if n_shards is not None and int(n_shards) < 1:
            raise ValueError(f"n_shards must be at least 1, got {n_shards}")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.client = client
        self.n_shards = None if n_shards is None else int(n_shards)
        self.timeout = float(timeout)
        self.replay_budget = int(replay_budget)
        self._actors = None
        self.n_steps = 0
        self.recoveries = 0

    # -- connection -----------------------------------------------------------------------------------
    def _check_client(self):
        if self.client.status not in ("running", "connecting", "newly-created"):
            raise DistributedError(
                f"the Dask client is {self.client.status}: its connection to the scheduler "
                f"{self.client.scheduler.address if self.client.scheduler else '(none)'} is closed; "
                "connect a new Client and fit again")

    def _check_futures(self, what):
        """The scheduler cancels a client's futures when its connection is reset: the actors are gone."""
        if any(f.status == "cancelled" for f in self._futures):
            raise DistributedError(f"{what}: the scheduler cancelled this fit's actors, which happens when the "
                                   "client's connection to it is lost; the shards and sites on the cluster "
                                   "are gone, so fit again")

    def _result(self, future, what):
        """The result of a task future or an actor call, within the timeout."""
        try:
            return future.result(timeout=self.timeout)
        except TimeoutError as exc:     # distributed's timeouts are TimeoutErrors
            self._check_futures(what)
            raise DistributedError(f"{what} did not finish within {self.timeout:g} s on the Dask cluster; "
                                   "is the scheduler still reachable?") from exc

    # -- data -----------------------------------------------------------------------------------------
    def load(self, arrays, init_sites):
        """Persist the rows of ``arrays`` in shards on the workers and start one actor per shard.

        ``init_sites(n_rows_k)`` runs on the worker; it must be a pure function.
        """
        da, _ = import_distributed()
        self._check_client()
        n_rows = check_arrays(arrays)
        dask_input = [a for a in arrays if isinstance(a, da.Array)]
        workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])
        if dask_input:
            row_chunks = dask_input[0].chunks[0]
        else:
            n_shards = self.n_shards or max(len(workers), 1)
            bounds = shard_bounds(n_rows, n_shards)
            row_chunks = tuple(int(s) for s in np.diff(bounds))
        pieces = []
        for array in arrays:
            if not isinstance(array, da.Array):
                array = da.from_array(np.asarray(array), chunks=(row_chunks,) + (-1,) * (np.ndim(array) - 1))
            else:
                array = array.rechunk((row_chunks,) + (-1,) * (array.ndim - 1))
            pieces.append(self.client.persist(array))
        # one future per row chunk of each array, in chunk order
        keyed = [{f.key: f for f in self.client.futures_of(p)} for p in pieces]
        self._rows = [[keyed[j][p.__dask_keys__()[k] if p.ndim == 1 else p.__dask_keys__()[k][0]]
                       for j, p in enumerate(pieces)] for k in range(len(row_chunks))]
        self._arrays = pieces  # holds the persisted chunks (and their lineage) for the engine's life
        self._init_sites = init_sites
        self._futures = [None] * len(row_chunks)
        self._actors = [None] * len(row_chunks)
        self._addresses = [None] * len(row_chunks)
        for k in range(len(row_chunks)):    # shard k on worker k (round robin), its chunk moved there once
            self._start_actor(k, workers[k % len(workers)] if workers else None)
        for k in range(len(row_chunks)):
            self._actor(k, "loading the shards")
        self._log, self._checkpoint, self._log_bytes = [], None, 0
        self._can_revert = self._revert_pending = self._last_logged = False
        self.n_rows = n_rows
        self.bounds = np.concatenate([[0], np.cumsum(row_chunks)]).astype(int)
        self.rows_counted = 0
        return self

    def _start_actor(self, k, worker=None):
        self._futures[k] = self.client.submit(ShardActor, self._init_sites, *self._rows[k], actor=True,
                                              pure=False, workers=None if worker is None else [worker],
                                              allow_other_workers=worker is not None)
        self._actors[k] = None

    def _actor(self, k, what):
        if self._actors[k] is None:
            self._actors[k] = self._result(self._futures[k], what)
            self._addresses[k] = self._actors[k]._address
        return self._actors[k]

    # -- one iteration --------------------------------------------------------------------------------
    def step(self, step, q_state, theta, shard_args=None):
        """One step of every shard on the workers; the partials added in shard order.

        ``shard_args``, when given, holds one small object per shard: shard k's step then gets
        ``theta = (theta, shard_args[k])`` (e.g. its rows of a minibatch)."""
        from distributed.protocol.pickle import dumps

        if self._actors is None:
            raise RuntimeError("call load() before step()")
        self._check_client()
        what = f"step {self.n_steps + 1}"
        self._check_futures(what)
        payload = dumps((step, q_state, theta))     # q and θ serialised once per round
        revert, self._revert_pending = self._revert_pending, False
        args = shard_args if shard_args is not None else [None] * len(self._actors)
        if len(args) != len(self._actors):
            raise ValueError(f"shard_args has {len(args)} entries for {len(self._actors)} shards")
        calls = [self._call(k, "run", what, payload, args[k], revert) for k in range(len(self._actors))]
        reports = [self._finish(k, call, what, "run", payload, args[k], revert)
                   for k, call in enumerate(calls)]
        self._check_futures(what)
        self.n_steps += 1
        partials = [report[0] for report in reports]
        self.rows_counted = sum(report[1] for report in reports)
        if self.rows_counted != self.n_rows:  # cannot happen unless a shard's rows went missing
            raise DistributedError(f"step {self.n_steps} counted {self.rows_counted} of {self.n_rows} rows")
        changed = any(report[3] for report in reports)
        self._last_logged = changed
        if changed:
            self._log.append((payload, shard_args))
            self._log_bytes += len(payload)
            if self._log_bytes > max(self.replay_budget, self._sites_bytes()):
                self._take_checkpoint(what)
        self._can_revert = True
        return add_partials(partials)

    def _call(self, k, method, what, *args):
        """Start a call on shard k's actor; a lost actor shows when its result is read (`_finish`)."""
        try:
            return getattr(self._actor(k, what), method)(*args)
        except (OSError, RuntimeError) as exc:
            if not self._lost(k, exc):
                raise
            return exc

    def _finish(self, k, call, what, method, *args, timeout=None, recover=True):
        """The result of shard k's call; after a lost worker, the shard rebuilt and the call made again
        (with ``recover=False`` a lost worker raises a DistributedError instead).  ``timeout``
        overrides the engine's for this wait."""
        timeout = self.timeout if timeout is None else timeout
        for _ in range(3):
            if not isinstance(call, Exception):
                try:
                    return call.result(timeout=timeout)
                except TimeoutError as exc:
                    self._check_futures(what)
                    raise DistributedError(f"{what} did not finish within {timeout:g} s on the Dask "
                                           "cluster; is the scheduler still reachable?") from exc
                except (OSError, RuntimeError, KeyError) as exc:
                    if not self._lost(k, exc):
                        raise
                    call = exc
            if not recover:
                raise DistributedError(f"{what}: the worker of shard {k} is gone ({call})")
            self._check_client()
            self._check_futures(what)
            self._recover(k, what, call)
            args = args[:-1] + (False,)     # the rebuilt shard's sites already follow the log: no revert
            call = self._call(k, method, what, *args)
        raise DistributedError(f"{what}: shard {k} was lost three times in a row ({call})")

    def _lost(self, k, exc):
        """Does ``exc`` say that shard k's actor is gone (rather than an error of the step itself)?"""
        if isinstance(exc, OSError):           # no connection to its worker (CommClosedError included)
            return True
        if isinstance(exc, KeyError):          # its worker no longer knows the actor
            return str(self._futures[k].key) in str(exc)
        return "Actor" in str(exc)             # "Worker holding Actor was lost"

    def _recover(self, k, what, cause):
        """Shard k's worker is lost: a new actor from the persisted rows, the replay log applied."""
        lost = self._addresses[k]
        self.client.cancel([self._futures[k]])       # the old actor, if its worker still lives
        self._start_actor(k)
        actor = self._actor(k, f"{what}: rebuilding shard {k}")
        sites = None if self._checkpoint is None else self._checkpoint[k]
        log = [(payload, None if args is None else args[k]) for payload, args in self._log]
        address = self._result(actor.restore(sites, log), f"{what}: replaying shard {k}")
        self._addresses[k] = address
        self.recoveries += 1
        logger.warning("%s: the worker %s of shard %d (%d rows) was lost (%s: %s); the shard was rebuilt on "
                       "%s from its rows and %d replayed steps (sites recovered exactly, not reset)",
                       what, lost, k, self.bounds[k + 1] - self.bounds[k], type(cause).__name__, cause,
                       address, len(self._log))

    def _sites_bytes(self):
        return 0 if self._checkpoint is None else _nbytes(self._checkpoint)

    def _take_checkpoint(self, what):
        """Bring every shard's sites before the last step home and keep only the last step in the log
        (so that a revert still has its target): recovery memory stays bounded."""
        sites = self._gather_sites("previous", f"{what}: checkpoint")
        self._checkpoint = sites
        self._log = self._log[-1:]
        self._log_bytes = len(self._log[0][0])

    def _gather_sites(self, which, what, select=None, timeout=None, recover=True):
        revert, self._revert_pending = self._revert_pending, False
        calls = [self._call(k, "get_sites", what, which, select, revert) for k in range(len(self._actors))]
        return [self._finish(k, call, what, "get_sites", which, select, revert, timeout=timeout,
                             recover=recover)
                for k, call in enumerate(calls)]

    def revert(self):
        """Give every shard back the sites it had before the last step (one step back).  The actors apply
        it with the next call, so a revert moves no data."""
        if self._actors is None or not self._can_revert:
            raise RuntimeError("revert() needs a step() since load() or the last revert()")
        self._can_revert = False
        self._revert_pending = True
        if self._last_logged:      # after a checkpoint, that holds the sites before the reverted step
            self._log_bytes -= len(self._log.pop()[0])
        self._last_logged = False

    def sites(self, select=None, timeout=None, recover=True):
        """Every shard's sites, gathered to the master in shard order (O(n) data: for results only).
        ``select(sites)``, a pure function, runs on each worker first and picks what to send.
        ``timeout`` overrides the engine's for these waits; ``recover=False`` gives up on a lost
        worker (a DistributedError) instead of rebuilding its shard, for a fit that is being
        abandoned (an interrupted one, whose workers may have died with it)."""
        if self._actors is None:
            raise RuntimeError("call load() before sites()")
        self._check_client()
        self._check_futures("gathering the sites")
        return self._gather_sites("current", "gathering the sites", select, timeout, recover)

    def close(self):
        """Release the shards and sites on the cluster (the client stays open)."""
        self._actors = self._futures = self._rows = self._arrays = None
        self._log, self._checkpoint = [], None
