"""The Dask engine: shards persisted on the workers once, pure step tasks chained by their sites.

Where things live
-----------------
* Each shard's rows are a chunk of a persisted Dask array.  A NumPy input becomes
  ``da.from_array(x, chunks=(sizes, -1))`` with one chunk per worker (the scheduler then holds the source
  array inside the graph); a Dask input keeps its row chunks (its columns are gathered into one chunk).
  The rows are sent to a worker once and never again per step.
* A step of shard k is one task ``step(*rows_k, q_state, theta, sites_k)``: q and θ go out with it (O(m²)),
  its result (new sites, partial, row count, worker address) stays on the worker as a future; a second,
  small task on the same worker returns the partial, so only O(m²) numbers come back.  The next step of
  shard k takes that future as its sites: the sites never leave the worker.
* The master adds the partials in shard order (`add_partials`), so the sum equals the in-process sum.

Resilience
----------
The step tasks are pure and each keeps its inputs' keys, so the chain
``rows_k → step₁ → step₂ → … → step_t`` is the lineage of shard k's current sites.  If a worker dies,
the scheduler reruns that chain on a surviving worker: the rows from the persisted array's graph (from the
source array), then every earlier step from the q and θ it was given.  The sites therefore come back
*recovered exactly*, not reset: a disturbed fit equals an undisturbed one to rounding.  The price is a
replay of t steps of that shard, and the scheduler keeps every step's q and θ (O(K m² t) memory), which
suits EP's tens of iterations.  The engine logs (``logging.getLogger("gpc.distributed")``, WARNING)
each step at which a shard ran on another worker than before because its worker left the cluster.

Every wait is bounded (``timeout``).  A closed client, a scheduler that does not answer within the timeout,
or a reset connection (after which the scheduler has cancelled the client's tasks, shards and sites
included) raises `DistributedError`: the engine does not try to rebuild a fit the scheduler forgot.
"""

import logging
import math

import numpy as np

from ._engine import add_partials, check_arrays, shard_bounds

logger = logging.getLogger("gpc.distributed")

INSTALL_HINT = 'the Dask engine needs dask.distributed: pip install "gpc[distributed]"'


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


def _run_step(step, sites_or_result, q_state, theta, first_step, *rows):
    """The task of one shard: the previous task's result (or the first sites) → this step's result."""
    from distributed import get_worker

    sites = sites_or_result if first_step else sites_or_result[0]
    new_sites, partial = step(*rows, q_state, theta, sites)
    try:
        address = get_worker().address
    except ValueError:  # run outside a worker (e.g. by the scheduler's local executor)
        address = None
    return new_sites, partial, int(rows[0].shape[0]), address


def _report(result):
    """What comes back to the master: the partial, the rows counted and the worker's address."""
    return result[1:]


def _sites_of(result):
    return result[0]


class DaskEngine:
    """Run the shards' steps as tasks on a ``dask.distributed.Client``.

    Parameters
    ----------
    client : distributed.Client
        A connected client.
    n_shards : int, optional
        Shards a NumPy input is split into; default the number of workers when `load` is called.
    timeout : float
        Seconds any one wait on the cluster may take (a step, loading the shards); default 300.
    """

    def __init__(self, client, n_shards=None, timeout=300.0):
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
        self._results = None
        self.n_steps = 0

    # -- connection -----------------------------------------------------------------------------------
    def _check_client(self):
        if self.client.status not in ("running", "connecting", "newly-created"):
            raise DistributedError(
                f"the Dask client is {self.client.status}: its connection to the scheduler "
                f"{self.client.scheduler.address if self.client.scheduler else '(none)'} is closed; "
                "connect a new Client and fit again")

    def _wait(self, futures, what):
        from concurrent.futures import CancelledError

        from distributed import wait

        try:
            wait(futures, timeout=self.timeout)
            return self.client.gather(futures)
        except CancelledError as exc:  # the scheduler dropped the client's tasks: its connection was reset
            raise DistributedError(f"{what}: the scheduler cancelled this fit's tasks, which happens when the "
                                   "client's connection to it is lost; the shards and sites on the cluster "
                                   "are gone, so fit again") from exc
        except (TimeoutError, OSError) as exc:  # distributed's timeouts and CommClosedError are among these
            raise DistributedError(f"{what} did not finish within {self.timeout:g} s on the Dask cluster "
                                   f"({type(exc).__name__}: {exc}); is the scheduler still reachable?") from exc
        except Exception as exc:
            if self.client.status not in ("running", "connecting"):
                raise DistributedError(f"{what}: the Dask client lost its scheduler "
                                       f"({type(exc).__name__}: {exc})") from exc
            raise

    def _workers(self):
        return set(self.client.scheduler_info(n_workers=-1)["workers"])

    # -- data -----------------------------------------------------------------------------------------
    def load(self, arrays, init_sites):
        """Persist the rows of ``arrays`` in shards on the workers and make each shard's first sites.

        ``init_sites(n_rows_k)`` runs on the worker; it must be a pure function.
        """
        da, _ = import_distributed()
        self._check_client()
        n_rows = check_arrays(arrays)
        dask_input = [a for a in arrays if isinstance(a, da.Array)]
        if dask_input:
            row_chunks = dask_input[0].chunks[0]
        else:
            n_shards = self.n_shards or max(len(self._workers()), 1)
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
        self._wait([f for rows in self._rows for f in rows], "loading the shards")
        self._results = [self.client.submit(init_sites, int(size), pure=False) for size in row_chunks]
        self._first = True
        self._previous = None
        self._addresses = [None] * len(row_chunks)
        self.n_rows = n_rows
        self.bounds = np.concatenate([[0], np.cumsum(row_chunks)]).astype(int)
        self.rows_counted = 0
        return self

    # -- one iteration --------------------------------------------------------------------------------
    def step(self, step, q_state, theta):
        """One step of every shard on the workers; the partials added in shard order."""
        if self._results is None:
            raise RuntimeError("call load() before step()")
        self._check_client()
        submit = self.client.submit
        try:
            results = [submit(_run_step, step, previous, q_state, theta, self._first, *rows, pure=False)
                       for previous, rows in zip(self._results, self._rows)]
            reports = [submit(_report, result, pure=False) for result in results]
        except Exception as exc:
            self._check_client()
            raise DistributedError(f"could not submit the step: {exc}") from exc
        reports = self._wait(reports, f"step {self.n_steps + 1}")
        self._previous = (self._results, self._first)
        self._results, self._first = results, False
        self.n_steps += 1
        partials = [report[0] for report in reports]
        self.rows_counted = sum(report[1] for report in reports)
        if self.rows_counted != self.n_rows:  # cannot happen unless a task's rows went missing
            raise DistributedError(f"step {self.n_steps} counted {self.rows_counted} of {self.n_rows} rows")
        self._log_moves([report[2] for report in reports])
        return add_partials(partials)

    def _log_moves(self, addresses):
        moved = [k for k, (old, new) in enumerate(zip(self._addresses, addresses))
                 if old is not None and new != old]
        if moved:
            alive = self._workers()
            for k in moved:
                old = self._addresses[k]
                if old not in alive:
                    logger.warning("step %d: worker %s left the cluster; shard %d (%d rows) was rerun on %s "
                                   "from its source rows and the %d earlier steps (sites recovered from "
                                   "lineage, not reset)", self.n_steps, old, k,
                                   self.bounds[k + 1] - self.bounds[k], addresses[k], self.n_steps - 1)
        self._addresses = addresses

    def revert(self):
        """Give every shard back the sites it had before the last step (one step back): the next step takes
        the futures of the step before as its sites, which are still on the workers, or in their lineage."""
        if self._previous is None:
            raise RuntimeError("revert() needs a step() since load() or the last revert()")
        (self._results, self._first), self._previous = self._previous, None

    def sites(self):
        """Every shard's sites, gathered to the master in shard order (O(n) data: for results only)."""
        if self._results is None:
            raise RuntimeError("call load() before sites()")
        self._check_client()
        futures = self._results if self._first else [self.client.submit(_sites_of, r, pure=False)
                                                     for r in self._results]
        return list(self._wait(futures, "gathering the sites"))

    def close(self):
        """Release the shards and sites on the cluster (the client stays open)."""
        self._results = self._rows = self._arrays = None
