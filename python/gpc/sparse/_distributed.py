"""Batch SEP on a distributed engine (SEP §2.3, Fig. 1 right): rows and sites on the workers.

The master (the estimator) holds θ, Z and q; :mod:`gpc.distributed` holds the shards.  One batch
iteration (:func:`gpc.sparse._train.batch_iteration`) is two rounds of pure shard tasks:

1. :func:`site_task` refines the shard's sites against q (SEP §2.2) and returns their change to
   q's natural parameters, (Σ Δτ a aᵀ, Σ Δν a), O(m²);
2. :func:`evidence_task` returns the shard's parts of log Z_q (eq. (3)) and of its gradient
   (eq. (4)), O(m² + p).

The master adds the parts in shard order, updates q (or, when the sites' q has no factor, reverts
the shards' sites with the engine) and takes the Adadelta step, exactly as in process: the shard
tasks are the in-process passes (:mod:`gpc.sparse._passes`) run on a shard's rows, so a
distributed fit equals the in-process one up to the order of the sums.

One engine serves every one-vs-rest problem: the shards hold X, the K columns of ±1 labels and the
K columns of sites; a task works on the column its problem names.  The first sites (zeros, or
those of an earlier fit for ``partial_fit``) are sharded with the rows.
"""

import copy

import numpy as np

from ._passes import evidence_parts, site_pass


def _no_sites(n_rows):
    """The engine's first sites: None, meaning the sharded initial columns T0, N0."""
    return None


def _columns(T0, N0, sites):
    return (T0, N0) if sites is None else sites


def site_task(X, Y, T0, N0, q, theta, sites):
    """Round 1 of an iteration on one shard: new sites for column k and (dP, dh, skipped)."""
    column, likelihood, factor, damping, block_rows = theta
    T, N = _columns(T0, N0, sites)
    tau, nu, dP, dh, skipped = site_pass(likelihood, X, Y[:, column], factor, q, T[:, column],
                                         N[:, column], damping, block_rows)
    T, N = T.copy(), N.copy()
    T[:, column], N[:, column] = tau, nu
    return (T, N), (dP, dh, skipped)


def evidence_task(X, Y, T0, N0, q, theta, sites):
    """Round 2 on one shard: its parts of log Z_q and of the gradient; the sites unchanged."""
    column, likelihood, factor, gradient, block_rows = theta
    T, N = _columns(T0, N0, sites)
    parts = evidence_parts(likelihood, X, Y[:, column], factor, q, T[:, column], N[:, column],
                           block_rows, gradient)
    if not gradient:                      # no None leaves: the engine adds every leaf
        parts = (parts[0], parts[4])
    return (T, N), parts


def _light(q, factor):
    """q and the factor without what the shards do not read (P, K_uu): less to send per step."""
    q, factor = copy.copy(q), copy.copy(factor)
    q.P, factor.Kuu = None, None
    return q, factor


class ShardedRows:
    """The rows of problem ``column`` on an engine; the interface of ``_train.LocalRows``.

    Parameters
    ----------
    engine : gpc.distributed.InProcessEngine or DaskEngine, loaded by :class:`DistributedFit`
    column : int, the one-vs-rest problem
    likelihood : gpc.likelihoods.Likelihood
    block_rows : int, rows per block inside a shard task
    """

    def __init__(self, engine, column, likelihood, block_rows):
        self.engine, self.column, self.likelihood, self.block_rows = (
            engine, column, likelihood, block_rows)

    def update_sites(self, factor, q, damping):
        q, factor = _light(q, factor)
        dP, dh, _ = self.engine.step(site_task, q, (self.column, self.likelihood, factor,
                                                    damping, self.block_rows))
        return dP, dh

    def commit(self):
        """The new sites are already the shards' current ones."""

    def revert(self):
        self.engine.revert()

    def evidence_parts(self, factor, q, gradient):
        q, factor = _light(q, factor)
        parts = self.engine.step(evidence_task, q, (self.column, self.likelihood, factor,
                                                    bool(gradient), self.block_rows))
        return parts if gradient else (parts[0], None, None, None, parts[1])


class DistributedFit:
    """The shards of one fit: X, the problems' labels and sites, loaded once on ``client``.

    Parameters
    ----------
    client : dask.distributed.Client
    X : (n, d) NumPy, memmap or Dask array
    targets : list of (n,) ±1 label vectors, one per one-vs-rest problem
    states : list of ``_train.SEPState``, whose per-row sites start the shards
    timeout : float, seconds any wait on the cluster may take
    """

    def __init__(self, client, X, targets, states, timeout=300.0):
        from ..distributed import make_engine

        self.engine = make_engine(client, timeout=timeout)
        Y = np.column_stack(targets)
        T0 = np.column_stack([s.tau for s in states])
        N0 = np.column_stack([s.nu for s in states])
        self.engine.load((X, Y, T0, N0), _no_sites)

    def rows(self, column, likelihood, block_rows):
        return ShardedRows(self.engine, column, likelihood, block_rows)

    def finish(self, states):
        """Bring the sites home into ``states`` (O(n), once, so that the model can be continued
        in process or on another cluster) and release the shards."""
        try:
            shards = self.engine.sites()
            if all(s is not None for s in shards):
                T = np.concatenate([s[0] for s in shards])
                N = np.concatenate([s[1] for s in shards])
                for k, state in enumerate(states):
                    state.tau, state.nu = T[:, k].copy(), N[:, k].copy()
        finally:
            self.engine.close()
