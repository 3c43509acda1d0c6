"""The engine interface and its in-process implementation (SEP §2.3, Fig. 1 right).

A *step* is a pure function

    step(*shard_arrays, q_state, theta, sites) -> (new_sites, partial)

run once per shard per iteration.  ``shard_arrays`` are the shard's rows (e.g. ``X_k, y_k``), ``q_state`` and
``theta`` are what the master node holds (the posterior q over the inducing values and the hyperparameters),
``sites`` the shard's own sites.  ``partial`` is a number, an array or a dict / tuple of them of O(m²)
size (Σ η₂ v vᵀ, Σ η₁ v, gradient parts, log Z parts): the master adds the shards' partials in shard
order, so that every engine returns the same sum to rounding (SEP §2.3: "node k updates each φ̃_j with
j ∈ D_k and returns Π_{i ∈ D_k} φ̃_i to the master node").
"""

import numpy as np


def shard_bounds(n_rows, n_shards):
    """Row boundaries of ``n_shards`` contiguous shards of nearly equal size (as ``np.array_split``).

    Parameters
    ----------
    n_rows : int
        Number of rows to split.
    n_shards : int
        Number of shards, at least 1 and at most ``n_rows``.

    Returns
    -------
    ndarray of int, shape (n_shards + 1,)
        Shard k holds rows ``bounds[k]:bounds[k + 1]``.
    """
    n_rows, n_shards = int(n_rows), int(n_shards)
    if n_shards < 1:
        raise ValueError(f"n_shards must be at least 1, got {n_shards}")
    if n_rows < n_shards:
        raise ValueError(f"cannot split {n_rows} rows into {n_shards} non-empty shards")
    size, extra = divmod(n_rows, n_shards)
    sizes = [size + 1] * extra + [size] * (n_shards - extra)
    return np.concatenate([[0], np.cumsum(sizes)]).astype(int)


def add_partials(partials):
    """Sum a sequence of partial results in the order given (shard order), leaf by leaf.

    Parameters
    ----------
    partials : iterable
        The shards' partial results, in shard order. Leaves are numbers or arrays; containers are
        dicts (same keys), tuples or lists (same length).

    Returns
    -------
    The sum, with the structure of one partial.
    """
    partials = list(partials)
    if not partials:
        raise ValueError("no partial results to add")
    total = partials[0]
    for part in partials[1:]:
        total = _add(total, part)
    return total


def _add(a, b):
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            raise TypeError("partial results of the shards do not have the same keys")
        return {key: _add(a[key], b[key]) for key in a}
    if isinstance(a, (tuple, list)):
        if not isinstance(b, (tuple, list)) or len(a) != len(b):
            raise TypeError("partial results of the shards do not have the same structure")
        return type(a)(_add(x, y) for x, y in zip(a, b))
    return np.add(a, b)


def _row_blocks(array, bounds):
    """The shards of one array: NumPy rows between ``bounds``, or a Dask array's row chunks computed."""
    if hasattr(array, "chunks") and hasattr(array, "blocks"):  # a Dask array keeps its own chunks
        return [np.asarray(array.blocks[i].compute()) for i in range(array.numblocks[0])]
    array = np.asarray(array)
    return [array[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]


def check_arrays(arrays):
    """The arrays a fit is given: a non-empty tuple with the same number of rows each; returns n."""
    if not isinstance(arrays, (tuple, list)) or not arrays:
        raise TypeError("arrays must be a non-empty tuple of arrays with the same number of rows")
    n_rows = {int(a.shape[0]) for a in arrays}
    if len(n_rows) != 1:
        raise ValueError(f"arrays must have the same number of rows, got {sorted(n_rows)}")
    chunks = {tuple(a.chunks[0]) for a in arrays if hasattr(a, "chunks") and hasattr(a, "blocks")}
    if len(chunks) > 1:
        raise ValueError("Dask arrays must have the same row chunks")
    return n_rows.pop()


class InProcessEngine:
    """Shards in a list, steps run one after another in this process (the default engine).

    Parameters
    ----------
    n_shards : int
        Number of shards a NumPy array is split into (a Dask array keeps its row chunks instead).
        Use the number of workers of the distributed run it should reproduce.
    """

    def __init__(self, n_shards=1):
        self.n_shards = int(n_shards)
        self._shards = None

    def load(self, arrays, init_sites):
        """Split ``arrays`` into shards and make each shard's first sites, ``init_sites(n_rows_k)``."""
        n_rows = check_arrays(arrays)
        dask_chunks = [a.chunks[0] for a in arrays if hasattr(a, "chunks") and hasattr(a, "blocks")]
        if dask_chunks:
            bounds = np.concatenate([[0], np.cumsum(dask_chunks[0])]).astype(int)
        else:
            bounds = shard_bounds(n_rows, self.n_shards)
        blocks = [_row_blocks(a, bounds) for a in arrays]
        self._shards = [tuple(block[k] for block in blocks) for k in range(len(bounds) - 1)]
        self._sites = [init_sites(int(stop - start)) for start, stop in zip(bounds[:-1], bounds[1:])]
        self.n_rows = n_rows
        self.bounds = bounds
        self.rows_counted = 0
        self._previous = None
        return self

    def step(self, step, q_state, theta, shard_args=None):
        """Run ``step`` on every shard, keep the new sites, return the partials added in shard order.

        ``shard_args``, when given, holds one small object per shard: shard k's step then gets
        ``theta = (theta, shard_args[k])`` (e.g. its rows of a minibatch)."""
        if self._shards is None:
            raise RuntimeError("call load() before step()")
        if shard_args is not None and len(shard_args) != len(self._shards):
            raise ValueError(f"shard_args has {len(shard_args)} entries for {len(self._shards)} shards")
        partials, new_sites = [], []
        for k, (shard, sites) in enumerate(zip(self._shards, self._sites)):
            sites, partial = step(*shard, q_state, theta if shard_args is None else (theta, shard_args[k]),
                                  sites)
            new_sites.append(sites)
            partials.append(partial)
        self._previous, self._sites = self._sites, new_sites
        self.rows_counted = sum(int(shard[0].shape[0]) for shard in self._shards)
        return add_partials(partials)

    def revert(self):
        """Give every shard back the sites it had before the last step (the master rejected that step's q,
        e.g. an improper posterior).  Only one step back."""
        if getattr(self, "_previous", None) is None:
            raise RuntimeError("revert() needs a step() since load() or the last revert()")
        self._sites, self._previous = self._previous, None

    def sites(self, select=None, timeout=None, recover=True):
        """Every shard's sites, in shard order; ``select(sites)``, when given, picks what to return
        of each shard's sites.  ``timeout`` and ``recover`` are the Dask engine's; in process there
        is nothing to wait for."""
        return [s if select is None else select(s) for s in self._sites]

    def close(self):
        self._shards = self._sites = None
