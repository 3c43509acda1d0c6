"""Sparse GP training on a distributed engine (SEP §2.3, Fig. 1 right): rows and sites on the workers.

The master (the estimator) holds θ, Z and q (or SVI's q(u) = N(μ, L_q L_qᵀ)); :mod:`gpc.distributed`
holds the shards.  Every shard task is a pure function of the shard's rows and sites that calls the same
per-block functions as the in-process fit (:mod:`gpc.sparse._passes`, :mod:`gpc.sparse._train`,
:mod:`gpc.sparse.ep`, :func:`gpc.sparse.baselines.svi_parts`) and returns sums over its rows only (O(m²)):

* SEP, one iteration (:func:`gpc.sparse.core.steps.iteration`) is two rounds.  A batch iteration:
  :func:`site_task` refines every site of the shard against q and returns their sums with the current
  factor (q is rebuilt from them).  A minibatch: :func:`swap_task` refines the shard's share of the
  minibatch along SEP eq. (6) and returns the change its sites make to q, each old site removed along
  the direction it was added with (:func:`gpc.sparse._train.swap_block_sites`).  Then
  :func:`evidence_task` returns the shard's parts of log Z_q (eq. (3)) and of its gradient (eq. (4),
  (6)) at the new q, in the form the step names ("sites" or "cavity").
* The sites' directions V (minibatch SEP: m float32 per row) live with their rows: each shard keeps
  those of its own rows in its sites (:class:`ShardSites`), so nothing of size n x m crosses the
  network per step.  When a fit starts minibatches on sites that have no directions (``partial_fit``
  after a batch fit), :func:`directions_task` makes them and the sums that rebuild q
  (:meth:`DistributedFit.start_minibatches`, the shards' ``SEPState.start_minibatches``).
* Tied sites (one shared average site, beyond the SEP paper): :func:`tied_task` matches the
  shard's rows of the minibatch against the tied cavity and returns their sums; the evidence round is
  SEP's.  The shards keep those rows' matched sites between the two rounds.
* SVI: :func:`svi_task` returns the shard's parts of the bound (8) and of its gradient, for batch
  L-BFGS-B (all rows) or a minibatch Adadelta step (its share of the minibatch, scaled by n/|M|).

The master adds the parts in shard order and updates its state exactly as in process, so a distributed
fit equals the in-process one up to the order of the sums.

Minibatches (:func:`minibatch_plan`): each epoch, shard k of n_k rows draws a permutation of its rows
and cuts it into slices of ⌈b n_k / n⌉ rows, and minibatch j is slice j of every shard (its rows
sorted), so each worker refines its share of every minibatch and every minibatch is a random subset of
the rows whatever their order.  With one shard these are the in-process minibatches (the same
permutation drawn from the same generator, slices of b rows).

One engine serves every one-vs-rest problem: the shards hold X, the K columns of ±1 labels and the
K columns of first sites (zeros, or those of an earlier fit for ``partial_fit``); a shard's sites are
one :class:`ShardSites` per problem, and a task works on the column its problem names.  A lost
worker's shard gets its sites, directions included, back exactly from the engine's replay log
(:mod:`gpc.distributed._dask`); a checkpoint of that log brings them to the master.
"""

import numpy as np

from .. import _pages
from ..exceptions import NotPositiveDefiniteError
from ._passes import block_parts, evidence_parts, site_pass
from ._train import rows_named, swap_block_sites, tied_block_sites
from .baselines import svi_parts
from .core.natural import NaturalPosterior
from .core.rows import Rows
from .core.shards import light, sites_home
from .core.steps import random_batches, site_directions, take_rows


class ShardSites:
    """One problem's sites on one shard: τ and ν of its n_k rows and, for minibatch SEP, their
    directions V (n_k x m, float32; None before minibatches start).

    A step's new values for its rows wait in ``pending`` = (rows, τ, ν, V or None), ``rows`` the
    shard's sorted local row indices, and are written into the arrays, in place, by the next step
    that changes the sites (:meth:`settled`).
    By then the engine can no longer go back to the sites before them (it reverts one step only), and
    every ShardSites a step returned still reads as the sites after that step; so no step copies the
    shard's arrays (V alone is 800 MB at n_k = 10⁶, m = 200), and the engine's revert and replay
    (steps as pure functions of the sites they are given) hold as they are.
    """

    def __init__(self, tau, nu, V=None, pending=None):
        self.tau, self.nu, self.V, self.pending = tau, nu, V, pending

    def settled(self):
        """These sites with the pending rows written into the arrays: a new ShardSites, no pending."""
        if self.pending is not None:
            rows, tau, nu, V = self.pending
            self.tau[rows], self.nu[rows] = tau, nu
            if V is not None:
                self.V[rows] = V
        return ShardSites(self.tau, self.nu, self.V)

    def rows(self, index=None):
        """(τ, ν) of the rows ``index`` (a sorted index array; all of them by default) as they
        stand after the last step."""
        everything = np.arange(len(self.tau)) if index is None else index
        tau, nu = self.tau[everything], self.nu[everything]   # copies
        if self.pending is not None:
            rows, p_tau, p_nu, _ = self.pending
            _, at, of = np.intersect1d(everything, rows, assume_unique=True, return_indices=True)
            tau[at], nu[at] = p_tau[of], p_nu[of]
        return tau, nu


def _no_sites(n_rows):
    """The engine's first sites: None, meaning the sharded initial columns T0, N0."""
    return None


def _columns(T0, N0, sites):
    """The shard's sites: one :class:`ShardSites` per problem (the first ones copied from the
    persisted columns, which the shard's recovery reads and no step may change)."""
    if sites is None:
        return [ShardSites(T0[:, k].copy(), N0[:, k].copy()) for k in range(T0.shape[1])]
    return sites


def _with(columns, column, sites):
    """``columns`` with problem ``column``'s sites replaced: a new list, the others shared."""
    columns = list(columns)
    columns[column] = sites
    return columns


def _share(theta):
    """(θ, rows of the shard): all of them (None) or the shard's sorted local row indices of a
    minibatch."""
    return theta if isinstance(theta[0], tuple) else (theta, None)


def _scratch(name, shape, dtype=np.float64):
    return np.empty(shape, dtype=dtype)


def _home(sites):
    """The (τ, ν) pairs of a shard's sites, what :meth:`DistributedFit.finish` brings home (not V)."""
    return None if sites is None else [column.rows() for column in sites]


def site_task(X, Y, T0, N0, q, theta, sites):
    """Round 1 of a batch iteration on one shard: new sites for all its rows (or its share of a
    minibatch of all n rows, which is all of them) and their sums (P - I, h) with the current factor
    (SEP §2.2; q is rebuilt from them, so the sites follow their rows and have no kept directions)."""
    (column, likelihood, factor, damping, block_rows, rule), rows = _share(theta)
    columns = _columns(T0, N0, sites)
    tau, nu = columns[column].rows()
    if rows is not None and len(rows) != len(tau):
        raise ValueError(f"a batch step covers every row of a shard, got {len(rows)} rows of "
                         f"{len(tau)}")
    tau, nu, dP, dh, _, n_fixed = site_pass(likelihood, X, Y[:, column], factor, q, tau, nu,
                                            damping, block_rows, rule)
    return _with(columns, column, ShardSites(tau, nu)), (dP, dh, n_fixed)


def swap_task(X, Y, T0, N0, q, theta, sites):
    """Round 1 of a minibatch step on one shard: its share of the minibatch refined along SEP eq. (6)
    (:func:`gpc.sparse._train.swap_block_sites`) and (ΔP, Δh, rows that had no site), the change
    their sites make to q (and the updates the site rule's on_negative policy handled).  The new
    sites and directions stay pending in the shard's sites."""
    (column, likelihood, factor, damping, rule), rows = theta
    m = factor.m
    if not len(rows):
        return sites, (np.zeros((m, m)), np.zeros(m), 0, 0)
    columns = _columns(T0, N0, sites)
    current = columns[column].settled()
    if current.V is None:
        if np.any(current.tau) or np.any(current.nu):
            raise RuntimeError("minibatch steps on sites without their directions: call "
                               "DistributedFit.start_minibatches first")
        current.V = _pages.zeros((len(current.tau), m), dtype=np.float32)
    A, s = factor.whiten(take_rows(X, rows))
    dP, dh = np.zeros((m, m)), np.zeros(m)
    with rows_named(rows):
        tau, nu, V, n_fresh, n_fixed = swap_block_sites(
            likelihood, Y[rows, column], A, s, q, current.tau[rows], current.nu[rows],
            current.V[rows], factor, damping, dP, dh, _scratch, rule)
    current.pending = (rows, tau, nu, V.astype(np.float32))
    return _with(columns, column, current), (dP, dh, n_fresh, n_fixed)


def directions_task(X, Y, T0, N0, q, theta, sites):
    """The shard's sites' directions with the current factor (kept in its sites) and (Σ τ a aᵀ, Σ ν a,
    rows with a site) for q: :func:`gpc.sparse.core.steps.site_directions` on the shard's rows."""
    column, factor, block_rows = theta
    m = factor.m
    columns = _columns(T0, N0, sites)
    current = columns[column].settled()
    dP, dh = np.zeros((m, m)), np.zeros(m)
    current.V = site_directions(X, factor, current.tau, current.nu, block_rows, dP, dh)
    n_sited = int(np.count_nonzero((current.tau != 0.0) | (current.nu != 0.0)))
    return _with(columns, column, current), (dP, dh, n_sited)


def evidence_task(X, Y, T0, N0, q, theta, sites):
    """Round 2 on one shard: its parts of log Z_q and of the gradient (eq. (3)-(4)) over its rows of
    the step, in the form ``held`` (:func:`gpc.sparse.ep.block_evidence`); the sites are returned as
    they are (the same object: nothing to log for recovery)."""
    (column, likelihood, factor, gradient, block_rows, held, rule), rows = _share(theta)
    current = _columns(T0, N0, sites)[column]
    if rows is None:
        tau, nu = current.rows()
        parts = evidence_parts(likelihood, X, Y[:, column], factor, q, tau, nu, block_rows, gradient,
                               held, rule)
    elif not len(rows):
        m, Z = factor.m, factor.Z
        parts = (0.0, np.zeros(len(factor.kernel.theta)), np.zeros_like(Z), np.zeros((m, m)), 0)
    else:
        Xb = take_rows(X, rows)
        A, s, Kbu = factor.whiten(Xb, keep_cross=True)
        tau, nu = current.rows(rows)
        parts = block_parts(likelihood, Xb, Y[rows, column], A, s, factor, q, tau, nu, gradient,
                            Kbu, held, rule)
    if not gradient:                      # no None leaves: the engine adds every leaf
        parts = (parts[0], parts[4])
    return sites, parts


def tied_task(X, Y, T0, N0, q, theta, sites):
    """Round 1 of a tied-site step on one shard: its rows of the minibatch matched against the tied
    cavity ``q`` (:func:`gpc.sparse._train.tied_block_sites`) and their sums.  The matched sites wait
    in the shard's sites, where round 2 (:func:`evidence_task`) reads them."""
    (column, likelihood, factor, rule), rows = theta
    if not len(rows):
        return sites, (np.zeros((factor.m, factor.m)), np.zeros(factor.m))
    A, s = factor.whiten(take_rows(X, rows))
    tau, nu, dP, dh = tied_block_sites(likelihood, Y[rows, column], A, s, q, rule)
    columns = _columns(T0, N0, sites)
    current = columns[column].settled()
    current.pending = (rows, tau, nu, None)
    return _with(columns, column, current), (dP, dh)


def svi_task(X, Y, T0, N0, q, theta, sites):
    """The shard's parts of SVI's bound (8) and its gradient, over all its rows or its share of a
    minibatch (:func:`gpc.sparse.baselines.svi_parts`); ``q`` is (μ, L_q)."""
    (column, likelihood, factor, block_rows), rows = _share(theta)
    mean, Lq = q
    if rows is None:
        return sites, svi_parts(likelihood, X, Y[:, column], factor, mean, Lq, block_rows)
    if not len(rows):
        m = factor.m
        return sites, (0.0, np.zeros(len(factor.kernel.theta)), np.zeros_like(factor.Z),
                       np.zeros((m, m)), np.zeros(m), np.zeros((m, m)))
    return sites, svi_parts(likelihood, take_rows(X, rows), Y[rows, column], factor, mean, Lq,
                            len(rows))


def minibatch_plan(bounds, batch_size, rng=None):
    """One epoch's minibatches on the shards: ``plan[j][k]``, shard k's sorted local row indices
    (np.intp, maybe empty) of minibatch j.

    Shard k of n_k rows draws a permutation of its rows from ``rng`` (shards in order) and cuts it
    into slices of ⌈b n_k / n⌉ rows (b = ``batch_size``); minibatch j is slice j of every shard
    (:func:`gpc.sparse.core.steps.random_batches` per shard).  Each worker thus takes its share of
    every minibatch, and a minibatch is a random subset of the rows whatever their order.  One
    shard gives the in-process minibatches; ``rng`` None the rows in order."""
    sizes = np.diff(np.asarray(bounds)).astype(int)
    n = int(sizes.sum())
    blocks = [random_batches(int(n_k), max(1, -(-batch_size * int(n_k) // n)), rng)
              for n_k in sizes]
    n_batches = max(len(b) for b in blocks)
    empty = np.empty(0, dtype=np.intp)
    return [[b[j] if j < len(b) else empty for b in blocks] for j in range(n_batches)]


class ShardedRows(Rows):
    """The rows of problem ``column`` covered by one step on an engine: all of them, or one minibatch
    (``batch``, an item of :func:`minibatch_plan`: each shard's local row indices).  The core's rows
    (:class:`gpc.sparse.core.rows.Rows`), as ``_train.LocalRows`` and ``_train.LocalBatch``; the
    state's factor, q and site rule (:class:`gpc.sparse.ep.Rule`) are sent with each task.

    Parameters
    ----------
    engine : gpc.distributed.InProcessEngine or DaskEngine, loaded by :class:`DistributedFit`
    state : the problem's :class:`gpc.sparse._train.SEPState` (the master's θ, Z and q)
    column : int, the one-vs-rest problem
    likelihood : gpc.likelihoods.Likelihood
    block_rows : int, rows per block inside a shard task
    batch : list of local row index arrays, one per shard, or None for every row
    """

    u_space = False          # the shards' evidence parts are w-space (gpc.sparse.ep.block_evidence)

    def __init__(self, engine, state, column, likelihood, block_rows, batch=None):
        self.engine, self.state, self.column, self.likelihood, self.block_rows, self.batch = (
            engine, state, column, likelihood, block_rows, batch)
        self.size = engine.n_rows if batch is None else sum(len(rows) for rows in batch)
        self.n_fixed = 0

    def update_sites(self, damping):
        """All n rows: every site refined, their sums with the current factor (:func:`site_task`)."""
        q, factor = light(self.state.q, self.state.factor)
        dP, dh, n_fixed = self.engine.step(site_task, q, (self.column, self.likelihood, factor,
                                                          damping, self.block_rows,
                                                          self.state.rule), self.batch)
        self.n_fixed = int(n_fixed)
        return dP, dh

    def swap_sites(self, damping):
        """A minibatch: the shards' shares refined and swapped (:func:`swap_task`); q's new natural
        parameters (P, h) and the rows that had no site."""
        q = self.state.q
        sent, factor = light(q, self.state.factor)
        dP, dh, n_fresh, n_fixed = self.engine.step(
            swap_task, sent, (self.column, self.likelihood, factor, damping, self.state.rule),
            self.batch)
        self.n_fixed = int(n_fixed)
        return (q.P + dP, q.h + dh), int(n_fresh)

    def match_sites(self, cavity):
        """Tied sites: each row of the minibatch matched against the cavity, their sums."""
        cavity, factor = light(cavity, self.state.factor)
        return self.engine.step(tied_task, cavity,
                                (self.column, self.likelihood, factor, self.state.rule), self.batch)

    def commit(self):
        """The new sites are already the shards' current ones."""
        self.state.n_fixed += self.n_fixed

    def revert(self):
        self.engine.revert()

    def evidence_parts(self, gradient, held):
        q, factor = light(self.state.q, self.state.factor)
        parts = self.engine.step(evidence_task, q, (self.column, self.likelihood, factor,
                                                    bool(gradient), self.block_rows, held,
                                                    self.state.rule), self.batch)
        return parts if gradient else (parts[0], None, None, None, parts[1])

    def svi_parts(self, factor, mean, Lq):
        """SVI's summed parts over these rows (the rows object ``SVIState.objective`` accepts)."""
        _, factor = light(None, factor)
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
        self._directed = set()      # problems whose shards hold their sites' directions
        Y = np.column_stack(targets)
        n = Y.shape[0]
        T0 = np.column_stack([getattr(s, "tau", None) if getattr(s, "tau", None) is not None
                              else np.zeros(n) for s in states])
        N0 = np.column_stack([getattr(s, "nu", None) if getattr(s, "nu", None) is not None
                              else np.zeros(n) for s in states])
        self.engine.load((X, Y, T0, N0), _no_sites)
        self.targets, self.states = targets, states

    def rows(self, column, likelihood, block_rows, batch=None):
        """Problem ``column``'s rows of a step (all of them, or minibatch ``batch``)."""
        return ShardedRows(self.engine, self.states[column], column, likelihood, block_rows, batch)

    def plan(self, batch_size, rng=None):
        """One epoch's minibatches (:func:`minibatch_plan`)."""
        return minibatch_plan(self.engine.bounds, batch_size, rng)

    def batch_labels(self, column, batch):
        """The ±1 labels of a minibatch's rows, shard by shard (for SVI's ``len(yb)``)."""
        y, bounds = self.targets[column], self.engine.bounds
        return np.concatenate([y[bounds[k] + rows] for k, rows in enumerate(batch)])

    def start_minibatches(self, state, column, block_rows):
        """``SEPState.start_minibatches`` on the shards, once per fit: sites without directions (from
        the state the shards were loaded with) get them on their shards (:func:`directions_task`),
        and q is rebuilt from the sites with the current factor (kept if that q has no factor).  Zero
        sites need nothing: a shard starts their directions at its first minibatch step."""
        if column in self._directed:
            return
        self._directed.add(column)
        state.V = None              # the master keeps no directions: the shards do
        state.n_sited = 0
        if not (np.any(state.tau) or np.any(state.nu)):
            return
        _, factor = light(None, state.factor)
        dP, dh, n_sited = self.engine.step(directions_task, None, (column, factor, block_rows))
        state.n_sited = int(n_sited)
        dP.flat[:: factor.m + 1] += 1.0
        try:
            state.q = NaturalPosterior(dP, dh)
        except NotPositiveDefiniteError:
            state.drop_update()

    def finish(self, states, interrupted=False):
        """Bring the sites home into ``states`` (O(n), once, so that the model can be continued
        in process or on another cluster) and release the shards; returns whether the sites came
        home.  The directions of minibatch SEP stay behind (n x m): a continued minibatch fit makes
        them afresh from the sites (``SEPState.start_minibatches``).

        After an interruption (``interrupted``) the cluster is given INTERRUPTED_WAIT seconds and
        no recovery (:func:`sites_home`); the sites then stay where they were and False is
        returned."""
        try:
            with_sites = [k for k, state in enumerate(states) if getattr(state, "tau", None) is not None]
            if not with_sites:                 # SVI and tied sites keep none per row
                return True
            shards = sites_home(self.engine, _home, interrupted)
            if shards is None:
                return False
            bounds = self.engine.bounds
            for k in with_sites:
                state = states[k]
                # a shard that never changed its sites (None) still has the ones it was given
                parts = [(state.tau[lo:hi], state.nu[lo:hi]) if s is None else s[k]
                         for s, lo, hi in zip(shards, bounds[:-1], bounds[1:])]
                state.tau = np.concatenate([tau for tau, _ in parts])
                state.nu = np.concatenate([nu for _, nu in parts])
                state.V = None
            return True
        finally:
            self.engine.close()
