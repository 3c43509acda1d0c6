"""Sparse GP training on a distributed engine (SEP §2.3, Fig. 1 right): rows and sites on the workers.

The master (the estimator) holds θ, Z and q (or SVI's q(u) = N(μ, L_q L_qᵀ)); :mod:`gpc.distributed`
holds the shards.  Every shard task is a pure function of the shard's rows that calls the same per-block
functions as the in-process fit (:mod:`gpc.sparse._passes`, :mod:`gpc.sparse.ep`,
:func:`gpc.sparse.baselines.svi_parts`) and returns sums over its rows only (O(m²)):

* SEP, one iteration (:func:`gpc.sparse._train.iteration`, batch or minibatch) is two rounds:
  :func:`site_task` refines the sites of the shard's rows of the step (all of them, or its share of
  the minibatch) against q and returns their sums, then :func:`evidence_task` returns the shard's
  parts of log Z_q (eq. (3)) and of its gradient (eq. (4)) at the new q.  A minibatch step scales the
  data terms by n/|M| (eq. (6)); at the end of a minibatch epoch :func:`sums_task` rebuilds q from
  every site with the current factor, as the in-process epoch does.
* Tied sites (one shared average site, beyond the SEP paper): :func:`tied_task` matches the
  shard's rows of the minibatch against the tied cavity and returns their sums; the evidence round is
  SEP's.  The shards keep those rows' matched sites between the two rounds.
* SVI: :func:`svi_task` returns the shard's parts of the bound (8) and of its gradient, for batch
  L-BFGS-B (all rows) or a minibatch Adadelta step (its share of the minibatch, scaled by n/|M|).

The master adds the parts in shard order and updates its state exactly as in process, so a distributed
fit equals the in-process one up to the order of the sums.

Minibatches (:func:`minibatch_plan`): shard k of n_k rows is cut into blocks of ⌈b n_k / n⌉ rows, and
minibatch j is block j of every shard, so each worker refines its share of every minibatch.  With one
shard these are the in-process minibatches (blocks of b rows, in the same random order).

One engine serves every one-vs-rest problem: the shards hold X, the K columns of ±1 labels and the
K columns of first sites (zeros, or those of an earlier fit for ``partial_fit``); a shard's sites are
one (τ, ν) pair per problem, and a task works on the column its problem names.
"""

import copy

import numpy as np

from ..exceptions import NotPositiveDefiniteError
from ._passes import as_block, block_parts, block_ranges, evidence_parts, site_pass
from ._train import tied_block_sites
from .baselines import svi_parts
from .ep import NaturalPosterior, update_sites, whitened_sums


def _no_sites(n_rows):
    """The engine's first sites: None, meaning the sharded initial columns T0, N0."""
    return None


def _columns(T0, N0, sites):
    """The shard's sites: one (τ, ν) pair per problem."""
    return [(T0[:, k], N0[:, k]) for k in range(T0.shape[1])] if sites is None else sites


def _share(theta):
    """(θ, rows of the shard): all of them (None) or a local (start, stop) of a minibatch."""
    return theta if isinstance(theta[0], tuple) else (theta, None)


def site_task(X, Y, T0, N0, q, theta, sites):
    """Round 1 on one shard: new sites for its rows of the step and their sums (SEP §2.2).

    All rows: (P - I, h) of the new sites with the current factor (q is rebuilt from them).  A share
    of a minibatch: the change its sites make to (P, h) ("change" sums); an empty share changes
    nothing and returns its sites as they are.
    """
    (column, likelihood, factor, damping, block_rows, sums), rows = _share(theta)
    columns = _columns(T0, N0, sites)
    tau, nu = columns[column]
    if rows is None:
        tau, nu, dP, dh, _ = site_pass(likelihood, X, Y[:, column], factor, q, tau, nu, damping,
                                       block_rows)
    else:
        start, stop = rows
        if start == stop:
            return sites, (np.zeros((factor.m, factor.m)), np.zeros(factor.m))
        A, s = factor.whiten(as_block(X, start, stop))
        up = update_sites(likelihood, Y[start:stop, column], A, s, q, tau[start:stop],
                          nu[start:stop], damping, sums=sums)
        tau, nu, dP, dh = tau.copy(), nu.copy(), up.dP, up.dh
        tau[start:stop], nu[start:stop] = up.tau, up.nu
    columns = list(columns)
    columns[column] = (tau, nu)
    return columns, (dP, dh)


def evidence_task(X, Y, T0, N0, q, theta, sites):
    """Round 2 on one shard: its parts of log Z_q and of the gradient (eq. (3)-(4)) over its rows of
    the step; the sites are returned as they are (the same object: nothing to log for recovery)."""
    (column, likelihood, factor, gradient, block_rows), rows = _share(theta)
    tau, nu = _columns(T0, N0, sites)[column]
    if rows is None:
        parts = evidence_parts(likelihood, X, Y[:, column], factor, q, tau, nu, block_rows, gradient)
    elif rows[0] == rows[1]:
        m, Z = factor.m, factor.Z
        parts = (0.0, np.zeros(len(factor.kernel.theta)), np.zeros_like(Z), np.zeros((m, m)), 0)
    else:
        start, stop = rows
        Xb = as_block(X, start, stop)
        A, s, Kbu = factor.whiten(Xb, keep_cross=True)
        parts = block_parts(likelihood, Xb, Y[start:stop, column], A, s, factor, q, tau[start:stop],
                            nu[start:stop], gradient, Kbu)
    if not gradient:                      # no None leaves: the engine adds every leaf
        parts = (parts[0], parts[4])
    return sites, parts


def tied_task(X, Y, T0, N0, q, theta, sites):
    """Round 1 of a tied-site step on one shard: its rows of the minibatch matched against the tied
    cavity ``q`` (:func:`gpc.sparse._train.tied_block_sites`) and their sums.  The matched sites are
    written into the shard's site column, where round 2 (:func:`evidence_task`) reads them."""
    (column, likelihood, factor), (start, stop) = theta
    if start == stop:
        return sites, (np.zeros((factor.m, factor.m)), np.zeros(factor.m))
    A, s = factor.whiten(as_block(X, start, stop))
    matched = tied_block_sites(likelihood, Y[start:stop, column], A, s, q)
    columns = list(_columns(T0, N0, sites))
    tau, nu = (c.copy() for c in columns[column])
    tau[start:stop], nu[start:stop] = matched
    columns[column] = (tau, nu)
    return columns, whitened_sums(A, *matched)


def sums_task(X, Y, T0, N0, q, theta, sites):
    """Σ (τ_i a_i a_iᵀ, ν_i a_i) of the shard's sites with the current factor (q rebuilt at the end of
    a minibatch epoch, :func:`gpc.sparse._train.rebuild_q`)."""
    column, factor, block_rows = theta
    tau, nu = _columns(T0, N0, sites)[column]
    dP, dh = np.zeros((factor.m, factor.m)), np.zeros(factor.m)
    for start, stop in block_ranges(len(tau), block_rows):
        A, _ = factor.whiten(as_block(X, start, stop))
        bP, bh = whitened_sums(A, tau[start:stop], nu[start:stop])
        dP += bP
        dh += bh
    return sites, (dP, dh)


def svi_task(X, Y, T0, N0, q, theta, sites):
    """The shard's parts of SVI's bound (8) and its gradient, over all its rows or its share of a
    minibatch (:func:`gpc.sparse.baselines.svi_parts`); ``q`` is (μ, L_q)."""
    (column, likelihood, factor, block_rows), rows = _share(theta)
    mean, Lq = q
    start, stop = (0, X.shape[0]) if rows is None else rows
    if start == stop:
        m = factor.m
        return sites, (0.0, np.zeros(len(factor.kernel.theta)), np.zeros_like(factor.Z),
                       np.zeros((m, m)), np.zeros(m), np.zeros((m, m)))
    return sites, svi_parts(likelihood, X[start:stop], Y[start:stop, column], factor, mean, Lq,
                            block_rows if rows is None else stop - start)


def _light(q, factor):
    """q and the factor without what the shards do not read (P, K_uu): less to send per step."""
    q, factor = copy.copy(q), copy.copy(factor)
    if q is not None:
        q.P = None
    factor.Kuu = None
    return q, factor


def minibatch_plan(bounds, batch_size):
    """Each shard's local rows of each minibatch: ``plan[j][k] = (start, stop)`` (maybe empty).

    Shard k of n_k rows is cut into blocks of ⌈b n_k / n⌉ rows (b = ``batch_size``); minibatch j is
    block j of every shard.  One shard gives the in-process blocks of b rows."""
    sizes = np.diff(np.asarray(bounds)).astype(int)
    n = int(sizes.sum())
    blocks = [block_ranges(int(n_k), max(1, -(-batch_size * int(n_k) // n))) for n_k in sizes]
    n_batches = max(len(b) for b in blocks)
    return [[b[j] if j < len(b) else (0, 0) for b in blocks] for j in range(n_batches)]


class ShardedRows:
    """The rows of problem ``column`` covered by one step on an engine: all of them, or one minibatch
    (``batch``, a row of :func:`minibatch_plan`).  The interface of ``_train.LocalRows``.

    Parameters
    ----------
    engine : gpc.distributed.InProcessEngine or DaskEngine, loaded by :class:`DistributedFit`
    column : int, the one-vs-rest problem
    likelihood : gpc.likelihoods.Likelihood
    block_rows : int, rows per block inside a shard task
    batch : list of (start, stop) per shard, or None for every row
    """

    def __init__(self, engine, column, likelihood, block_rows, batch=None):
        self.engine, self.column, self.likelihood, self.block_rows, self.batch = (
            engine, column, likelihood, block_rows, batch)
        self.size = engine.n_rows if batch is None else sum(stop - start for start, stop in batch)

    def update_sites(self, factor, q, damping, sums):
        q, factor = _light(q, factor)
        return self.engine.step(site_task, q, (self.column, self.likelihood, factor, damping,
                                               self.block_rows, sums), self.batch)

    def match_sites(self, factor, cavity):
        """Tied sites: each row of the minibatch matched against the cavity, their sums."""
        cavity, factor = _light(cavity, factor)
        return self.engine.step(tied_task, cavity, (self.column, self.likelihood, factor), self.batch)

    def commit(self):
        """The new sites are already the shards' current ones."""

    def revert(self):
        self.engine.revert()

    def evidence_parts(self, factor, q, gradient):
        q, factor = _light(q, factor)
        parts = self.engine.step(evidence_task, q, (self.column, self.likelihood, factor,
                                                    bool(gradient), self.block_rows), self.batch)
        return parts if gradient else (parts[0], None, None, None, parts[1])

    def svi_parts(self, factor, mean, Lq):
        """SVI's summed parts over these rows (the rows object ``SVIState.objective`` accepts)."""
        _, factor = _light(None, factor)
        return self.engine.step(svi_task, (mean, Lq), (self.column, self.likelihood, factor,
                                                       self.block_rows), self.batch)


class DistributedFit:
    """The shards of one fit: X, the problems' labels and sites, loaded once on ``client``.

    Parameters
    ----------
    client : dask.distributed.Client, or an engine of :mod:`gpc.distributed`
    X : (n, d) NumPy, memmap or Dask array
    targets : list of (n,) ±1 label vectors, one per one-vs-rest problem
    states : list of states; ``SEPState`` sites (``tau``, ``nu``) start the shards
    timeout : float, seconds any wait on the cluster may take
    """

    def __init__(self, client, X, targets, states, timeout=300.0):
        from ..distributed import make_engine

        self.engine = make_engine(client, timeout=timeout)
        Y = np.column_stack(targets)
        n = Y.shape[0]
        T0 = np.column_stack([getattr(s, "tau", None) if getattr(s, "tau", None) is not None
                              else np.zeros(n) for s in states])
        N0 = np.column_stack([getattr(s, "nu", None) if getattr(s, "nu", None) is not None
                              else np.zeros(n) for s in states])
        self.engine.load((X, Y, T0, N0), _no_sites)
        self.targets = targets

    def rows(self, column, likelihood, block_rows, batch=None):
        return ShardedRows(self.engine, column, likelihood, block_rows, batch)

    def plan(self, batch_size):
        return minibatch_plan(self.engine.bounds, batch_size)

    def batch_labels(self, column, batch):
        """The ±1 labels of a minibatch's rows, shard by shard (for SVI's ``len(yb)``)."""
        y, bounds = self.targets[column], self.engine.bounds
        return np.concatenate([y[bounds[k] + a:bounds[k] + b] for k, (a, b) in enumerate(batch)])

    def rebuild_q(self, state, column, block_rows):
        """q from every site of problem ``column`` with the current factor (the engine's
        :func:`gpc.sparse._train.rebuild_q`); kept if the rebuilt q has no factor."""
        _, factor = _light(None, state.factor)
        dP, dh = self.engine.step(sums_task, None, (column, factor, block_rows))
        dP.flat[:: factor.m + 1] += 1.0
        try:
            state.q = NaturalPosterior(dP, dh)
        except NotPositiveDefiniteError:
            state.skipped_passes += 1

    def finish(self, states):
        """Bring the sites home into ``states`` (O(n), once, so that the model can be continued
        in process or on another cluster) and release the shards."""
        try:
            with_sites = [k for k, state in enumerate(states) if getattr(state, "tau", None) is not None]
            shards = self.engine.sites() if with_sites else []     # SVI and tied sites have none
            bounds = self.engine.bounds
            for k in with_sites:
                state = states[k]
                # a shard that never changed its sites (None) still has the ones it was given
                parts = [(state.tau[lo:hi], state.nu[lo:hi]) if s is None else s[k]
                         for s, lo, hi in zip(shards, bounds[:-1], bounds[1:])]
                state.tau = np.concatenate([tau for tau, _ in parts])
                state.nu = np.concatenate([nu for _, nu in parts])
        finally:
            self.engine.close()
