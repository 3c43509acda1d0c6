"""SEP trainers: batch passes and minibatches, both with "inner" hyperparameter steps (SEP §2.3).

Each step updates sites first, then q, and then moves the free log hyperparameters and Z along
the gradient of log Z_q (eq. (4); for a minibatch M its stochastic form eq. (6), data terms scaled
by the rows q holds over |M|) with Adadelta.  A step that leaves q without a factor or a
non-finite value is reverted, and the learning rate is halved; the trainer records it.  With
batch_size = n a minibatch step is the batch step (same sites, same q, same gradient): tested.

A minibatch step of b rows (m inducing points) costs the kernel blocks K_bm and K_uu and about
twenty BLAS-3 and LAPACK calls of b x m x m or m x m x m size, 6.3 (first epoch) to 7.8 products'
worth at b = m = 200 (docs/sparse.md, "One minibatch step").
"""

from contextlib import contextmanager
from functools import partial

import numpy as np

from .. import _pages, _parallel, _sparse
from ..exceptions import NegativeVarianceError, NotPositiveDefiniteError, NumericalError
from ._inducing import InducingFactor
from ._passes import as_block, block_parts, block_ranges, evidence_parts, finish_evidence, site_pass
from .ep import (DEFAULT_ON_NEGATIVE, EP, NaturalPosterior, Rule, _rows, _vector, add_blocks,
                 add_vectors, check_filled, check_refined, partials, row_blocks, times_lower_rows,
                 transform_natural, update_sites, whitened_sums)


class Adadelta:
    """Adadelta (Zeiler 2012) for ascent: Δ = √(E[Δ²] + ε) / √(E[g²] + ε) · g, scaled by ``lr``."""

    def __init__(self, size, lr=1.0, rho=0.9, eps=1e-5):
        self.lr, self.rho, self.eps = lr, rho, eps
        self.g2 = np.zeros(size)
        self.d2 = np.zeros(size)

    def step(self, grad):
        self.g2 = self.rho * self.g2 + (1 - self.rho) * grad ** 2
        delta = np.sqrt(self.d2 + self.eps) / np.sqrt(self.g2 + self.eps) * grad
        self.d2 = self.rho * self.d2 + (1 - self.rho) * delta ** 2
        return self.lr * delta


class SEPState:
    """Everything a fit carries between steps: θ, Z, the sites, q, the optimiser.

    ``tau``/``nu`` hold two scalars per training row; q holds their sums as its natural
    parameters (P, h) in the current whitened coordinates (:class:`ep.NaturalPosterior`).  A
    site is fixed in u-space (SEP §2.3, q is "reconstructed" after a θ or Z step), along
    v_i = K_uu⁻¹k_i at its last refinement; minibatch training keeps these directions, ``V``
    (n x m, float32, SEP §2.3: "m + 1 parameters per approximate factor"), so that a refined
    site is swapped out of q along the direction it was added with (on an engine each shard
    keeps the directions of its own rows and ``V`` stays None here:
    :mod:`gpc.sparse._distributed`).  With ``tied`` there are no
    per-row sites: (P - I, h) are n times one shared average site (stochastic EP, Li,
    Hernández-Lobato & Turner 2015), so the state is O(m²) whatever n is.

    ``method`` ("ep" or "pl") and ``on_negative`` choose the site rule (:class:`ep.Rule`) that
    refits the sites; ``n_fixed`` counts the updates its on_negative policy handled.
    """

    def __init__(self, kernel, Z, n, jitter, optimize_inducing, lr, tied=False, method="ep",
                 on_negative=DEFAULT_ON_NEGATIVE):
        self.kernel, self.Z, self.jitter = kernel, np.array(Z, dtype=np.float64), jitter
        self.optimize_inducing = optimize_inducing
        self.tied, self.n = tied, n
        self.rule = Rule(method, on_negative)
        self.n_fixed = 0
        self.tau, self.nu = (None, None) if tied else (np.zeros(n), np.zeros(n))
        self.V = None               # the sites' u-space directions (minibatch training)
        self.n_sited = 0            # rows whose site q holds
        m = self.Z.shape[0]
        self.factor = InducingFactor(kernel, self.Z, jitter)
        self.q = NaturalPosterior(np.eye(m), np.zeros(m))
        self._theta, self._bounds = kernel.theta, kernel.bounds
        self.n_params = len(self._theta) + (self.Z.size if optimize_inducing else 0)
        self.optimizer = Adadelta(self.n_params, lr=lr)
        self.log_z = np.nan
        self.reverted = 0          # parameter steps undone (rate halved)
        self.skipped_passes = 0    # site updates dropped because q lost its factor
        self._work = {}
        self._later = []           # side tasks of the step under way (gpc._parallel.defer)

    def workspace(self, name, shape, dtype=np.float64):
        """A scratch array kept between steps under ``name`` (a fresh b x m array every step would
        be mapped and paged in again each time)."""
        buf = self._work.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self._work[name] = np.empty(shape, dtype=dtype)
        return buf

    def later(self, fn):
        """Run ``fn()`` as a side task beside the step's next pass of blocks
        (gpc._parallel.defer); :meth:`settle`, at the end of the step, waits for it."""
        self._later.append(_parallel.defer(fn))

    def settle(self):
        """Finish the step's side tasks (:meth:`later`), raising the first one's error."""
        later, self._later = self._later, []
        for task in later:
            task.result()

    def start_minibatches(self, X, block_rows):
        """Get ready for minibatch steps on the rows of X: the sites' directions V, and q rebuilt
        from the sites with the current factor when they are not zero (one pass over X, when a
        batch fit or a distributed one left sites but no directions)."""
        if self.tied or self.V is not None:
            return
        self.V = _pages.zeros((self.n, self.factor.m), dtype=np.float32)
        sited = (self.tau != 0.0) | (self.nu != 0.0)
        self.n_sited = int(np.count_nonzero(sited))
        if not self.n_sited:
            return
        m = self.factor.m
        P, h = np.eye(m), np.zeros(m)
        self.V = site_directions(X, self.factor, self.tau, self.nu, block_rows, P, h)
        try:
            self.q = NaturalPosterior(P, h)
        except NotPositiveDefiniteError:
            self.skipped_passes += 1

    @property
    def learns(self):
        return self.n_params > 0

    def _params(self):
        z = self.Z.ravel() if self.optimize_inducing else np.empty(0)
        return np.concatenate([self._theta, z])

    def _set_params(self, p):
        k = len(self._theta)
        bounds = self._bounds
        theta = np.clip(p[:k], bounds[:, 0], bounds[:, 1]) if k else p[:k]
        # Kernel._with_theta: shallow copies without a full clone's checks (θ is this kernel's own,
        # moved by a step and clipped to its bounds)
        kernel = self.kernel._with_theta(theta) if k else self.kernel
        Z = p[k:].reshape(self.Z.shape) if self.optimize_inducing else self.Z
        factor = InducingFactor(kernel, Z, self.jitter, invert=False)
        q = NaturalPosterior(*transform_natural(self.q.P, self.q.h, self.factor.Li, factor.L,
                                                beside=(factor.invert,)))
        self.kernel, self.Z, self.factor, self.q = kernel, np.array(Z), factor, q
        self._theta = theta

    def add_sites(self, dP, dh, shrink=1.0):
        """q with the sites' change (dP, dh) added (after ``shrink`` scales the old sites, for the
        tied site); False and q unchanged if that q has no factor (negative sites)."""
        m = self.factor.m
        P = self.q.P.copy()
        if shrink != 1.0:
            P.flat[:: m + 1] -= 1.0
            P *= shrink
            P.flat[:: m + 1] += 1.0
        P += dP
        try:
            self.q = NaturalPosterior(0.5 * (P + P.T), shrink * self.q.h + dh)
            if shrink == 0.0:                # a rebuild with the current factor: no directions
                self.V = None
        except NotPositiveDefiniteError:     # negative sites made q improper: keep the old sites
            self.skipped_passes += 1
            return False
        return True

    def gradient_step(self, g_theta, g_Z):
        """One Adadelta ascent step on (log θ, Z); reverted with the rate halved if it fails."""
        if not self.learns:
            return True
        grad = np.concatenate([g_theta, g_Z.ravel() if self.optimize_inducing else np.empty(0)])
        if not np.isfinite(grad).all():
            self.optimizer.lr *= 0.5
            self.reverted += 1
            return False
        old = self._params()
        try:
            self._set_params(old + self.optimizer.step(grad))
        except (NotPositiveDefiniteError, NumericalError, FloatingPointError, ValueError):
            self.optimizer.lr *= 0.5
            self.reverted += 1
            return False
        return True


def site_directions(X, factor, tau, nu, block_rows, P, h):
    """The directions v_i = L⁻ᵀa_i (n x m, float32) of the sites of X's rows with the current
    factor; their sums Σ τ_i a_i a_iᵀ, Σ ν_i a_i are added to (P, h) in place.  One pass over X:
    the start of minibatch training on sites that a batch or distributed fit left without
    directions (:meth:`SEPState.start_minibatches`, and a shard's share of it)."""
    V = _pages.zeros((len(tau), factor.m), dtype=np.float32)
    for start, stop in block_ranges(len(tau), block_rows):
        A, _ = factor.whiten(as_block(X, start, stop))
        dP, dh = whitened_sums(A, tau[start:stop], nu[start:stop])
        P += dP
        h += dh
        V[start:stop] = times_lower_rows(factor.Li, A, True)   # v_i = L⁻ᵀ a_i
    return V


def random_batches(n, size, rng=None):
    """One epoch's minibatches of n rows: a permutation of the rows drawn from ``rng`` (a NumPy
    Generator) cut into consecutive slices of ``size`` rows (the last one shorter), each minibatch
    the rows of its slice in row order, as a sorted np.intp index array.  Every row is in exactly
    one minibatch, and a minibatch is a uniformly random subset of the rows whatever their order
    in X (class-sorted rows included).  Sorted, its rows are read from X with one fancy index in
    row order (:func:`take_rows`), and its sites and directions gathered and scattered by row.
    With ``rng`` None the rows in order (consecutive ranges)."""
    order = np.arange(n, dtype=np.intp) if rng is None else rng.permutation(n).astype(np.intp)
    return [np.sort(order[a:b]) for a, b in block_ranges(n, size)]


def batch_index(batch):
    """A minibatch's rows as an index into the rows: a (start, stop) pair or a slice as a slice,
    anything else as an np.intp index array (sorted: :func:`random_batches`)."""
    if isinstance(batch, slice):
        return batch
    if isinstance(batch, tuple):
        return slice(*batch)
    return np.asarray(batch, dtype=np.intp)


def take_rows(X, rows):
    """Rows ``rows`` (a slice, or a sorted index array) of any row-indexable X (NumPy,
    ``np.memmap``, Dask) as a C-contiguous float64 array: a slice read as one block, an index
    array with one fancy index; NaN or inf raise a ValueError naming the row."""
    if isinstance(rows, slice):
        return as_block(X, rows.start or 0, rows.stop)
    block = X[rows]
    if hasattr(block, "compute"):      # a Dask array
        block = block.compute()
    block = np.ascontiguousarray(block, dtype=np.float64)
    finite = np.isfinite(block)
    if not finite.all():
        bad = int(rows[np.flatnonzero(~finite.all(axis=1))[0]])
        raise ValueError(f"X contains NaN or inf (in row {bad})")
    return block


def _put_rows(dest, rows, values):
    """dest[rows] = values (rows a slice or an index array)."""
    dest[rows] = values


@contextmanager
def rows_named(rows):
    """A NegativeVarianceError raised for the i-th row of a minibatch of rows ``rows`` (an index
    array) re-raised naming the data's row, rows[i]."""
    try:
        yield
    except NegativeVarianceError as exc:
        if not isinstance(rows, np.ndarray) or exc.index is None or not 0 <= exc.index < len(rows):
            raise
        raise NegativeVarianceError(int(rows[exc.index]), exc.cavity_variance, exc.site_variance,
                                    method=exc.method) from None


class LocalRows:
    """The training rows of one binary problem in this process, their sites in ``state``.

    The interface a batch iteration needs (:func:`iteration` with all n rows): ``size``,
    ``update_sites``, ``commit``, ``revert``, ``evidence_parts`` (each refit or evidence by the
    site rule it is given, :class:`ep.Rule`), and ``n_fixed``, the updates of the last refit that
    the rule's on_negative policy handled, and ``u_space``, whether ``evidence_parts`` gives the
    K_uu part in u-space (:func:`ep.block_evidence`); the distributed twin is
    :class:`gpc.sparse._distributed.ShardedRows`.
    """

    u_space = False

    def __init__(self, state, likelihood, X, y, block_rows):
        self.state, self.likelihood, self.X, self.y, self.block_rows = (
            state, likelihood, X, y, block_rows)
        self.size = len(y)
        self._pending = None
        self.n_fixed = 0

    def update_sites(self, factor, q, damping, rule=EP):
        """Refine every site from q (SEP §2.2); returns their sums (P - I, h) with the current
        factor (q is rebuilt from them), the new sites pending until commit."""
        tau, nu, dP, dh, _, self.n_fixed = site_pass(self.likelihood, self.X, self.y, factor, q,
                                                     self.state.tau, self.state.nu, damping,
                                                     self.block_rows, rule)
        self._pending = tau, nu
        return dP, dh

    def commit(self):
        self.state.tau, self.state.nu = self._pending
        self._pending = None

    def revert(self):
        self._pending = None

    def evidence_parts(self, factor, q, gradient, held, rule=EP):
        return evidence_parts(self.likelihood, self.X, self.y, factor, q, self.state.tau,
                              self.state.nu, self.block_rows, gradient, held, rule)


class LocalBatch:
    """Rows ``rows`` of one binary problem in this process, as one block: a minibatch.

    ``rows`` is a slice or a sorted index array (:func:`random_batches`); ``Xb`` and ``yb`` are
    those rows, whose sites and directions are gathered from the state's per-row arrays and
    scattered back by row.  The interface of :class:`LocalRows`, and for fewer than n rows
    :meth:`swap_sites` in place of ``update_sites``; the whitened block is kept between the site
    update and the evidence parts.  With tied sites (``rows`` None) :meth:`match_sites` replaces
    both and the evidence uses the rows' matched sites."""

    def __init__(self, state, likelihood, Xb, yb, rows):
        self.state, self.likelihood, self.Xb, self.yb, self.rows = state, likelihood, Xb, yb, rows
        self.size = len(yb)
        self._pending = self._matched = self._directions = None
        self.n_fixed = 0

    def _whiten(self, factor):
        self._whitened = factor.whiten(self.Xb, keep_cross=True, out=self.state.workspace(
            "whitened", (self.size, factor.m)))
        return self._whitened

    def _whiten_blocks(self, factor):
        """:meth:`_whiten` as per-block tasks (InducingFactor.whiten_blocks) for the caller's
        own pass to run first in each of its blocks; the result kept as :meth:`_whiten` keeps it."""
        block, _, self._whitened = factor.whiten_blocks(
            self.Xb, keep_cross=True, out=self.state.workspace("whitened", (self.size, factor.m)))
        return block

    def _first_row(self):
        """The first row of a slice of rows (index arrays name theirs by :func:`rows_named`)."""
        return self.rows.start or 0 if isinstance(self.rows, slice) else 0

    def match_sites(self, factor, cavity, rule=EP):
        """Each row's site matched against the tied cavity; their sums (Σ τ a aᵀ, Σ ν a).  Each
        block of rows is whitened right before its match, in one pass."""
        whiten = self._whiten_blocks(factor)
        A, s, _ = self._whitened
        tau, nu, dP, dh = tied_block_sites(self.likelihood, self.yb, A, s, cavity, rule,
                                           before=whiten)
        self._matched = tau, nu
        return dP, dh

    def update_sites(self, factor, q, damping, rule=EP):
        """All n rows: :meth:`LocalRows.update_sites` on one block."""
        A, s, _ = self._whiten(factor)
        with rows_named(self.rows):
            up = update_sites(self.likelihood, self.yb, A, s, q, self.state.tau[self.rows],
                              self.state.nu[self.rows], damping, sums="new", rule=rule,
                              first_row=self._first_row())
        self._pending = up.tau, up.nu, None
        self.n_fixed = up.n_fixed
        return up.dP, up.dh

    def swap_sites(self, factor, q, damping, rule=EP):
        """Refine the rows' sites and swap them in q (:func:`swap_block_sites`): returns q's new
        natural parameters (P, h) and the rows that had no site; the sites and their new
        directions pending until commit."""
        state = self.state
        if state.V is None:
            if np.any(state.tau) or np.any(state.nu):
                raise RuntimeError("minibatch steps on sites without their directions: call "
                                   "SEPState.start_minibatches first")
            state.V = _pages.zeros((state.n, factor.m), dtype=np.float32)
        whiten = self._whiten_blocks(factor)   # each block whitened right before its swap
        A, s, _ = self._whitened
        P, h = q.P.copy(), q.h.copy()
        with rows_named(self.rows):
            t_new, n_new, V_new, n_fresh, self.n_fixed = swap_block_sites(
                self.likelihood, self.yb, A, s, q, state.tau[self.rows], state.nu[self.rows],
                state.V[self.rows], factor, damping, P, h, state.workspace, rule,
                self._first_row(), before=whiten)
        self._pending = t_new, n_new, V_new
        self._directions = V_new
        return P, h, n_fresh

    def commit(self):
        """Keep the pending sites; their directions are stored in ``state.V`` (float32) beside the
        step's next pass of blocks (:meth:`SEPState.later`: nothing reads those rows of V before
        the step ends; the evidence's pass reads the full-precision directions, which nothing
        writes before the step ends either)."""
        tau, nu, V = self._pending
        self.state.tau[self.rows], self.state.nu[self.rows] = tau, nu
        if V is not None:
            self.state.later(partial(_put_rows, self.state.V, self.rows, V))
        self._pending = None

    def revert(self):
        self._pending = None

    @property
    def u_space(self):
        """Whether :meth:`evidence_parts` gives the K_uu part in u-space: after a site swap, whose
        directions v_i = L⁻ᵀa_i the cavity form's gradient takes (:func:`ep.block_evidence`)."""
        return self._directions is not None

    def evidence_parts(self, factor, q, gradient, held, rule=EP):
        A, s, Kbu = self._whitened
        tau, nu = (self._matched if self._matched is not None
                   else (self.state.tau[self.rows], self.state.nu[self.rows]))
        # the K_bu part's kernel contraction beside the K_uu part (_inner_step's finish_evidence)
        return block_parts(self.likelihood, self.Xb, self.yb, A, s, factor, q, tau, nu, gradient,
                           Kbu, held, rule, later=True, directions=self._directions)


def iteration(state, rows, damping):
    """One step on the rows that ``rows`` covers, SEP §2.3 in its order: their sites refined
    against their cavities, q updated, then one "inner" step of θ and Z (eq. (4) or (6)) after
    which q is reconstructed for the new factor.  ``rows`` is a :class:`LocalRows` or
    :class:`LocalBatch` in process, a :class:`gpc.sparse._distributed.ShardedRows` on an engine.

    All n rows (a batch iteration): a parallel pass, q rebuilt from the new sites, each site
    following its row (the gradient's "sites" form, :func:`ep.block_evidence`).

    A minibatch M of fewer rows (SEP eq. (6) literally): a site held by q lies along its
    direction at its last refinement, a'_i = Lᵀv_i with the current factor L (v_i kept in
    ``state.V``, or on the shards); the cavity removes it along a'_i, and q swaps it for the
    refined site along the current a_i: P + Σ τ_new a aᵀ - Σ τ_old a'a'ᵀ
    (:func:`swap_block_sites`).  q therefore stays the sum of its sites.  The gradient takes the
    "cavity" form, its data terms scaled by (rows q holds) / |M|: during the first pass q holds
    only the rows seen so far, and the prior term of eq. (4), computed from q, is that of those
    rows (scaled by n / |M| from the first step, the data terms outweighed the prior term and the
    amplitude grew without bound).

    The sites are refitted by the state's site rule (``state.rule``: EP with its on_negative
    policy, or PL); a cavity that is not a distribution under on_negative="raise" raises
    NegativeVarianceError.

    Returns log Z_q (eq. (3)), or for a minibatch its estimate over all n rows (data terms
    scaled by n / |M|).
    """
    try:
        if rows.size == state.n:
            dP, dh = rows.update_sites(state.factor, state.q, damping, state.rule)
            if state.add_sites(dP, dh, shrink=0.0):        # q rebuilt from the new sites
                rows.commit()
                state.n_sited = state.n
                state.n_fixed += rows.n_fixed
            else:
                rows.revert()
            return _inner_step(state, rows, state.n, "sites")
        _refine_minibatch(state, rows, damping)
        return _inner_step(state, rows, max(state.n_sited, rows.size), "cavity")
    finally:
        state.settle()


def _refine_minibatch(state, rows, damping):
    """The site update of :func:`iteration` for a minibatch: the rows' sites refined and swapped
    in q (``rows.swap_sites``), kept if that q has a factor."""
    P, h, n_fresh = rows.swap_sites(state.factor, state.q, damping, state.rule)
    try:
        state.q = NaturalPosterior(P, h)
    except NotPositiveDefiniteError:         # negative sites made q improper: keep the old sites
        state.skipped_passes += 1
        rows.revert()
    else:
        if state.learns:
            # the prior term's parts as side tasks beside the evidence's blocks: Σ_w, or with
            # the rows' directions its u-space L⁻ᵀΣ_wL⁻¹ and K_uu⁻¹ (ep.prior_term_u)
            if rows.u_space:
                state.q.prefetch_cov(state.factor.Li)
                state.factor.prefetch_inverse()
            else:
                state.q.prefetch_cov()
        rows.commit()
        state.n_sited = min(state.n, state.n_sited + n_fresh)
        state.n_fixed += rows.n_fixed


def _inner_step(state, rows, n_held, held):
    """The "inner" step after a site update: log Z_q's parts over the rows at the new q, then one
    Adadelta step on its gradient, data terms scaled by ``n_held`` / |M| (eq. (4), (6)); ``held``
    as in :func:`ep.block_evidence`.  Returns the estimate of log Z_q over all n rows."""
    b = rows.size
    parts = rows.evidence_parts(state.factor, state.q, state.learns, held, state.rule)
    _, g_theta, g_Z, _ = finish_evidence(state.factor, state.q, parts, scale=n_held / b,
                                         held=held, u_space=rows.u_space)
    log_z = state.q.log_normaliser_ratio() + state.n / b * parts[0]
    state.log_z = log_z
    if state.learns:
        state.gradient_step(g_theta, g_Z)
    return log_z


def batch_step(state, likelihood, X, y, damping, block_rows):
    """:func:`iteration` over all the rows of X in this process."""
    return iteration(state, LocalRows(state, likelihood, X, y, block_rows), damping)


def minibatch_step(state, likelihood, Xb, yb, rows, n, damping):
    """Refine the sites of rows ``rows`` (a slice or a sorted index array; ``Xb``, ``yb`` those
    rows), update q, then a stochastic step (eq. (6)): :func:`iteration` on a
    :class:`LocalBatch`; ``n`` must be the state's.

    A minibatch of all n rows is a batch pass (q rebuilt from its sites); a smaller one swaps
    its rows' sites in q along their kept directions.  The kernel block K_bu is computed once and
    serves the whitening and the gradient.
    """
    if n != state.n:
        raise ValueError(f"n = {n} is not the state's number of rows, {state.n}")
    return iteration(state, LocalBatch(state, likelihood, Xb, yb, rows), damping)


def swap_block_sites(likelihood, yb, A, s, q, tau, nu, V_old, factor, damping, P, h, workspace,
                     rule=EP, first_row=0, before=None):
    """A minibatch block's sites refined along SEP eq. (6) and swapped into (P, h), in place.

    ``A`` (b x m) holds the rows' current directions a_i = L⁻¹k_i, ``V_old`` their kept u-space
    directions v_i (float32, zero rows for rows without a site).  The old site lies along
    a'_i = Lᵀv_i; the cavity removes it there (:func:`gpc._sparse.refine_rows` with the old
    directions' marginals; a block without old sites refines against q itself), the site rule
    ``rule`` refits it, and (P, h) gains Σ τ_new a aᵀ - Σ τ_old a'a'ᵀ, Σ ν_new a - Σ ν_old a'
    (P's lower triangle mirrored).  ``workspace(name, shape)`` gives scratch arrays
    (:meth:`SEPState.workspace`).  The same code serves the in-process step (P, h a copy of q's)
    and a shard's share of a minibatch ((P, h) zero: the shard's sums).  ``first_row``: the
    block's first row, for the error of a cavity that is not a distribution under
    on_negative="raise".

    The rows run by fixed sub-blocks (gpc._sparse.refine_block: marginals, old directions, the
    site rule, the sub-block's sums and new directions) on the caller's threads, the sub-blocks'
    sums added in block order (:func:`ep.add_blocks`).  ``before(j)``, when given, runs in
    sub-block j first and fills its rows of ``A`` and ``s`` (the whitening's blocks,
    :meth:`InducingFactor.whiten_blocks`: one pass instead of two).

    Returns (τ_new, ν_new, V_new, n_fresh, n_fixed): V_new (b x m, float64, a workspace) holds
    the rows' new directions v_i = L⁻ᵀa_i (stored in float32 by the caller; the gradient's pass
    reads them first, :func:`ep.block_evidence`), n_fresh the rows that had no site, n_fixed
    the updates the rule's on_negative policy handled.
    """
    b, m = A.shape
    if before is not None:
        check_filled(A, s)
    yb, s, tau, nu = _vector(yb), _vector(s), _vector(tau), _vector(nu)
    V_old = np.ascontiguousarray(V_old, dtype=np.float32)
    n_fresh = int(np.count_nonzero((tau == 0.0) & (nu == 0.0)))
    t_new, n_new = np.empty(b), np.empty(b)
    V_new = workspace("directions", (b, m))
    spec, codes = likelihood.compiled_spec(), rule.codes
    blocks = row_blocks(b, m)
    dPs, dhs = partials("sums", len(blocks), m), np.empty((len(blocks), m))

    def block(j):
        if before is not None:
            before(j)
        return _sparse.refine_block(*spec, *codes, float(damping), _sparse.SUMS_SWAP,
                                    *_rows(blocks[j], yb, A, s), q.Ri, q.mean,
                                    *_rows(blocks[j], tau, nu, t_new, n_new), dPs[j], dhs[j],
                                    _rows(blocks[j], V_old)[0], factor.L, factor.Li,
                                    _rows(blocks[j], V_new)[0])
    results = _parallel.over_blocks(block, len(blocks))
    _, n_fixed = check_refined(results, blocks, first_row)
    # P + Σ τ_new a aᵀ - Σ τ_old a'a'ᵀ, h + Σ ν_new a - Σ ν_old a'
    add_blocks(dPs, P, lower=True)
    _sparse.mirror_lower(P)
    add_vectors(dhs, h)
    return t_new, n_new, V_new, n_fresh, n_fixed


def tied_block_sites(likelihood, y, A, s, cavity, rule=EP, before=None):
    """The sites (τ, ν) of a block's rows matched against the tied cavity, and their sums
    (Σ τ a aᵀ, Σ ν a): a refinement from zero sites by ``rule``, undamped (rows whose likelihood
    integral fails keep the zero site), by fixed sub-blocks (:func:`ep.update_sites`; ``before``
    as there)."""
    zero = np.zeros(len(y))
    up = update_sites(likelihood, y, A, s, cavity, zero, zero, 1.0, sums="new", rule=rule,
                      before=before)
    return up.tau, up.nu, up.dP, up.dh


def tied_iteration(state, rows, damping):
    """Minibatch step with one tied site (stochastic EP; beyond the SEP paper).

    Each row's cavity removes one average site, q^{\\i} ∝ p(u) f̄^{n-1}: in the natural
    parameters, (1 - 1/n)(P - I, h).  Every row of M matches its rank-one site t_i against that
    cavity and replaces its 1/n share, damped: S ← (1 - δ|M|/n) S + δ Σ_M t_i.  The stochastic
    gradient step (eq. (6)) then uses the rows' matched sites in place of stored ones, in the
    "cavity" form as the untied minibatch step.  ``rows`` has the interface of
    :class:`LocalBatch` (``match_sites``, ``evidence_parts``, ``size``).  Returns the minibatch
    estimate of log Z_q.
    """
    n, m = state.n, state.factor.m
    keep = 1.0 - 1.0 / n
    P_cav = keep * state.q.P
    P_cav.flat[:: m + 1] += 1.0 - keep
    dP, dh = rows.match_sites(state.factor, NaturalPosterior(P_cav, keep * state.q.h), state.rule)
    state.add_sites(damping * dP, damping * dh, shrink=1.0 - damping * rows.size / n)
    return _inner_step(state, rows, n, "cavity")


def tied_minibatch_step(state, likelihood, Xb, yb, damping):
    """:func:`tied_iteration` on the rows of Xb in this process."""
    return tied_iteration(state, LocalBatch(state, likelihood, Xb, yb, None), damping)
