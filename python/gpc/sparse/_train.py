"""The binary sparse model on the sparse core: its state and its rows (SEP §2.3).

:class:`SEPState` holds θ, Z, one binary problem's sites (τ_i, ν_i) and q;
:class:`LocalRows` (all rows) and :class:`LocalBatch` (a minibatch, or a block of rows matched
against the tied site) refine the sites by the binary site rule (gpc.sparse.ep) and give the
evidence's parts.  The step loop that drives them is the core's (gpc.sparse.core.steps:
``iteration``, ``tied_iteration``, ``run_ep``); :class:`InProcessRows` and :class:`EngineRows`
hand the core's trainers these rows (or the shards' twins, gpc.sparse._distributed).  With
batch_size = n a minibatch step is the batch step (same sites, same q, same gradient): tested.

A minibatch step of b rows (m inducing points) costs the kernel blocks K_bm and K_uu and about
twenty BLAS-3 and LAPACK calls of b x m x m or m x m x m size, 6.3 (first epoch) to 7.8 products'
worth at b = m = 200 (docs/sparse.md, "One minibatch step").
"""

from contextlib import contextmanager
from functools import partial

import numpy as np

from .. import _lapack, _pages, _parallel, _sparse
from .._parallel import BLOCK_ROWS
from ..exceptions import NegativeVarianceError, NotPositiveDefiniteError
from ..inference.rules import DEFAULT_ON_NEGATIVE, EP, Rule
from ._passes import block_parts, evidence_parts, finish_evidence, site_pass
from .core import steps
from .core.inducing import InducingFactor
from .core.natural import (NaturalPosterior, add_blocks, add_vectors, as_vector, like_rows,
                           partials, row_blocks, rows_of, transform_natural, whitened_sums)
from .core.passes import as_block, block_ranges
from .core.rows import Rows
from .core.steps import (SparseState, batch_index, iteration, site_directions, take_rows,
                         tied_cavity, tied_iteration)
from .core.trainers import LocalTrainingRows, TrainingRows
from .ep import check_filled, check_refined, update_sites


#: the precisions of a minibatch's rows (:class:`SEPState`)
PRECISIONS = ("float64", "mixed")


class SEPState(SparseState):
    """Everything a binary fit carries between steps: θ, Z, the sites, q, the optimiser.

    ``tau``/``nu`` hold two scalars per training row; q holds their sums as its natural
    parameters (P, h) in the current whitened coordinates (:class:`core.natural.NaturalPosterior`).
    A site is fixed in u-space (SEP §2.3, q is "reconstructed" after a θ or Z step), along
    v_i = K_uu⁻¹k_i at its last refinement; minibatch training keeps these directions, ``V``
    (n x m, float32, SEP §2.3: "m + 1 parameters per approximate factor"), so that a refined
    site is swapped out of q along the direction it was added with (on an engine each shard
    keeps the directions of its own rows and ``V`` stays None here:
    :mod:`gpc.sparse._distributed`).  With ``tied`` there are no
    per-row sites: (P - I, h) are n times one shared average site (stochastic EP, Li,
    Hernández-Lobato & Turner 2015), so the state is O(m²) whatever n is.

    ``method`` ("ep" or "pl") and ``on_negative`` choose the site rule (:class:`ep.Rule`) that
    refits the sites; ``n_fixed`` counts the updates its on_negative policy handled.
    ``precision`` "mixed" runs a minibatch's site swap and evidence (:meth:`LocalBatch.swap_sites`)
    on float32 rows (``dtype``; :func:`swap_block_sites`); "float64", the default, in double.
    Adadelta's steps are ``lr`` times its normalised gradient for θ and ``lr * z_rate`` for Z.
    ``factor``:
    K_uu's factor when the caller has it (else made from ``kernel``, ``Z`` and ``jitter``).
    The counters, the optimiser and the failure rule are the core's
    (:class:`gpc.sparse.core.steps.SparseState`).
    """

    def __init__(self, kernel, Z, n, jitter, optimize_inducing, lr, tied=False, method="ep",
                 on_negative=DEFAULT_ON_NEGATIVE, factor=None, precision="float64", z_rate=1.0):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.dtype = np.float32 if precision == "mixed" else np.float64
        self.kernel, self.Z, self.jitter = kernel, np.array(Z, dtype=np.float64), jitter
        self.optimize_inducing = optimize_inducing
        self.tied = tied
        self.rule = Rule(method, on_negative)
        self.n_fixed = 0
        self.tau, self.nu = (None, None) if tied else (np.zeros(n), np.zeros(n))
        m = self.Z.shape[0]
        self.factor = InducingFactor(kernel, self.Z, jitter) if factor is None else factor
        self.q = NaturalPosterior(np.eye(m), np.zeros(m))
        self._theta, self._bounds = kernel.theta, kernel.bounds
        n_z = self.Z.size if optimize_inducing else 0
        if z_rate != 1.0 and n_z:
            lr = np.concatenate([np.full(len(self._theta), lr), np.full(n_z, lr * z_rate)])
        super().__init__(n, len(self._theta) + n_z, lr)
        self._work = {}

    def workspace(self, name, shape, dtype=np.float64):
        """A scratch array kept between steps under ``name`` (a fresh b x m array every step would
        be mapped and paged in again each time)."""
        buf = self._work.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self._work[name] = np.empty(shape, dtype=dtype)
        return buf

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
            self.drop_update()

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

    # -- what the core's step loop asks of a state (gpc.sparse.core.steps.SparseState) ----------
    def rebuild(self, sums):
        """q from a batch pass's sums (P - I, h) with the current factor (no kept directions)."""
        if not self.add_tied(sums, 1.0, 0.0):
            return False
        self.V = None
        return True

    def swap(self, naturals, u_space):
        """q from a minibatch's swapped (P, h); with a gradient to come, the prior term's parts as
        side tasks beside the evidence's blocks: Σ_w, or with the rows' directions (``u_space``)
        its u-space L⁻ᵀΣ_wL⁻¹ and K_uu⁻¹ (core.natural.prior_term_u)."""
        try:
            self.q = NaturalPosterior(*naturals)
        except NotPositiveDefiniteError:     # negative sites made q improper
            return False
        if self.learns:
            if u_space:
                self.q.prefetch_cov(self.factor.Li)
                self.factor.prefetch_inverse()
            else:
                self.q.prefetch_cov()
        return True

    def tied_cavity(self):
        return tied_cavity(self.q, self.n)

    def add_tied(self, sums, damping, shrink):
        """q with its sites scaled by ``shrink`` and ``damping`` times the sums (dP, dh) added; False
        and q unchanged if that q has no factor (negative sites)."""
        dP, dh = sums
        m = self.factor.m
        P = self.q.P.copy()
        if shrink != 1.0:
            P.flat[:: m + 1] -= 1.0
            P *= shrink
            P.flat[:: m + 1] += 1.0
        P += damping * dP
        try:
            self.q = NaturalPosterior(0.5 * (P + P.T), shrink * self.q.h + damping * dh)
        except NotPositiveDefiniteError:     # negative sites made q improper
            return False
        return True

    def site_vector(self):
        """The sites (τ, ν) as one vector (the core's batch acceleration)."""
        return np.concatenate([self.tau, self.nu])

    def set_site_vector(self, x):
        """The sites from :meth:`site_vector`'s form; always taken."""
        self.tau, self.nu = x[:self.n].copy(), x[self.n:].copy()
        return True

    def log_normaliser(self):
        return self.q.log_normaliser_ratio()

    def data_terms(self, parts):
        return parts[0], parts[4]

    def gradient(self, parts, scale, held, u_space):
        """log Z_q's gradient in (log θ, Z) from the rows' parts (core.passes.finish_evidence)."""
        _, g_theta, g_Z, _ = finish_evidence(self.factor, self.q, parts, scale=scale, held=held,
                                             u_space=u_space)
        return np.concatenate([g_theta, g_Z.ravel() if self.optimize_inducing else np.empty(0)])


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


class LocalRows(Rows):
    """The training rows of one binary problem in this process, their sites in ``state``: the
    core's rows (:class:`gpc.sparse.core.rows.Rows`) for a batch iteration, every refit and
    evidence by the state's site rule (:class:`ep.Rule`).  ``n_fixed``: the updates of the last
    refit that the rule's on_negative policy handled, added to the state's on commit.  The
    distributed twin is :class:`gpc.sparse._distributed.ShardedRows`.
    """

    accelerable = True

    def __init__(self, state, likelihood, X, y, block_rows):
        self.state, self.likelihood, self.X, self.y, self.block_rows = (
            state, likelihood, X, y, block_rows)
        self.size = len(y)
        self._pending = None
        self.n_fixed = 0

    def update_sites(self, damping):
        """Refine every site from q (SEP §2.2); returns their sums (P - I, h) with the current
        factor (q is rebuilt from them), the new sites pending until commit.  The state's
        ``mismatch`` becomes the largest change of a site's τ or ν."""
        st = self.state
        tau, nu, dP, dh, _, self.n_fixed = site_pass(self.likelihood, self.X, self.y, st.factor,
                                                     st.q, st.tau, st.nu, damping,
                                                     self.block_rows, st.rule)
        st.mismatch = max(np.max(np.abs(tau - st.tau)), np.max(np.abs(nu - st.nu)))
        self._pending = tau, nu
        return dP, dh

    def commit(self):
        self.state.tau, self.state.nu = self._pending
        self.state.n_fixed += self.n_fixed
        self._pending = None

    def revert(self):
        self._pending = None

    def evidence_parts(self, gradient, held):
        st = self.state
        return evidence_parts(self.likelihood, self.X, self.y, st.factor, st.q, st.tau, st.nu,
                              self.block_rows, gradient, held, st.rule)


class LocalBatch(Rows):
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

    def _whiten_blocks(self, factor, dtype=np.float64):
        """:meth:`_whiten` as per-block tasks (InducingFactor.whiten_blocks) for the caller's
        own pass to run first in each of its blocks; the result kept as :meth:`_whiten` keeps it,
        the rows in ``dtype`` (float32: the state's mixed precision)."""
        block, _, self._whitened = factor.whiten_blocks(
            self.Xb, keep_cross=True,
            out=self.state.workspace("whitened", (self.size, factor.m), dtype))
        return block

    def _first_row(self):
        """The first row of a slice of rows (index arrays name theirs by :func:`rows_named`)."""
        return self.rows.start or 0 if isinstance(self.rows, slice) else 0

    def match_sites(self, cavity):
        """Each row's site matched against the tied cavity; their sums (Σ τ a aᵀ, Σ ν a).  Each
        block of rows is whitened right before its match, in one pass."""
        whiten = self._whiten_blocks(self.state.factor)
        A, s, _ = self._whitened
        tau, nu, dP, dh = tied_block_sites(self.likelihood, self.yb, A, s, cavity,
                                           self.state.rule, before=whiten)
        self._matched = tau, nu
        return dP, dh

    def update_sites(self, damping):
        """All n rows: :meth:`LocalRows.update_sites` on one block."""
        st = self.state
        A, s, _ = self._whiten(st.factor)
        with rows_named(self.rows):
            up = update_sites(self.likelihood, self.yb, A, s, st.q, st.tau[self.rows],
                              st.nu[self.rows], damping, sums="new", rule=st.rule,
                              first_row=self._first_row())
        self._pending = up.tau, up.nu, None
        self.n_fixed = up.n_fixed
        return up.dP, up.dh

    def swap_sites(self, damping):
        """Refine the rows' sites and swap them in q (:func:`swap_block_sites`): returns q's new
        natural parameters (P, h) and the rows that had no site; the sites and their new
        directions pending until commit."""
        state = self.state
        factor, q = state.factor, state.q
        if state.V is None:
            if np.any(state.tau) or np.any(state.nu):
                raise RuntimeError("minibatch steps on sites without their directions: call "
                                   "SEPState.start_minibatches first")
            state.V = _pages.zeros((state.n, factor.m), dtype=np.float32)
        whiten = self._whiten_blocks(factor, state.dtype)   # each block right before its swap
        A, s, _ = self._whitened
        P, h = q.P.copy(), q.h.copy()
        with rows_named(self.rows):
            t_new, n_new, V_new, n_fresh, self.n_fixed = swap_block_sites(
                self.likelihood, self.yb, A, s, q, state.tau[self.rows], state.nu[self.rows],
                state.V, factor, damping, P, h, state.workspace, state.rule,
                self._first_row(), before=whiten, old_rows=self.rows)
        self._pending = t_new, n_new, V_new
        self._directions = V_new
        return (P, h), n_fresh

    def commit(self):
        """Keep the pending sites; their directions are stored in ``state.V`` (float32) beside the
        step's next pass of blocks (:meth:`SEPState.later`: nothing reads those rows of V before
        the step ends; the evidence's pass reads the full-precision directions, which nothing
        writes before the step ends either)."""
        tau, nu, V = self._pending
        self.state.tau[self.rows], self.state.nu[self.rows] = tau, nu
        self.state.n_fixed += self.n_fixed
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

    def evidence_parts(self, gradient, held):
        st = self.state
        A, s, Kbu = self._whitened
        tau, nu = (self._matched if self._matched is not None
                   else (st.tau[self.rows], st.nu[self.rows]))
        # the K_bu part's kernel contraction beside the K_uu part (the state's finish_evidence)
        return block_parts(self.likelihood, self.Xb, self.yb, A, s, st.factor, st.q, tau, nu,
                           gradient, Kbu, held, st.rule, later=True, directions=self._directions)


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


def natural_sums(X, factor, tau, nu, block_rows):
    """(P, h) = (I + Σ τ_i a_i a_iᵀ, Σ ν_i a_i) of given sites with the current factor."""
    m = factor.m
    P, h = np.eye(m), np.zeros(m)
    if not (np.any(tau) or np.any(nu)):
        return P, h
    for start, stop in block_ranges(len(tau), block_rows):
        A, _ = factor.whiten(as_block(X, start, stop))
        dP, dh = whitened_sums(A, tau[start:stop], nu[start:stop])
        P += dP
        h += dh
    return P, h


def run_ep(likelihood, X, y, factor, tau, nu, damping=0.5, max_iter=200, tol=1e-9,
           block_rows=4096, rule=EP):
    """Parallel damped passes of the site rule ``rule`` (EP by default) at fixed θ and Z, from the
    sites (tau, nu), until the sites move less than ``tol`` (max abs): the core's run_ep
    (gpc.sparse.core.steps) on a :class:`SEPState` at ``factor`` and its :class:`LocalRows`.

    Returns (tau, nu, q, passes, converged, n_fixed), n_fixed the updates the rule's on_negative
    policy handled over all passes.  A pass whose sites give q no factor (negative sites kept by
    on_negative="keep") is dropped under the core's failure rule (the damping halved).
    """
    state = SEPState(factor.kernel, factor.Z, len(y), None, False, 0.0, method=rule.method,
                     on_negative=rule.on_negative, factor=factor)
    state.tau, state.nu = tau, nu
    state.q = NaturalPosterior(*natural_sums(X, factor, tau, nu, block_rows))
    passes, converged = steps.run_ep(state, LocalRows(state, likelihood, X, y, block_rows),
                                     damping, tol, max_iter)
    return state.tau, state.nu, state.q, passes, converged, state.n_fixed


def swap_block_sites(likelihood, yb, A, s, q, tau, nu, V_old, factor, damping, P, h, workspace,
                     rule=EP, first_row=0, before=None, old_rows=None):
    """A minibatch block's sites refined along SEP eq. (6) and swapped into (P, h), in place.

    ``A`` (b x m) holds the rows' current directions a_i = L⁻¹k_i, ``V_old`` their kept u-space
    directions v_i (float32, zero rows for rows without a site); with ``old_rows`` (a slice or an
    index array) ``V_old`` holds every row's and the block's are ``V_old[old_rows]``, gathered
    by each sub-block on the threads (a sub-block whose rows have no site yet, as in a first
    epoch, reads none: refine_block skips a block without old sites, and V's pages stay untouched
    until the rows' directions are written).  The old site lies along
    a'_i = Lᵀv_i; the cavity removes it there (:func:`gpc._sparse.refine_rows` with the old
    directions' marginals; a block without old sites refines against q itself), the site rule
    ``rule`` refits it, and (P, h) gains Σ τ_new a aᵀ - Σ τ_old a'a'ᵀ, Σ ν_new a - Σ ν_old a'
    (P's lower triangle mirrored).  ``workspace(name, shape)`` gives float64 scratch arrays
    (:meth:`SEPState.workspace`; with ``dtype=`` float32 ones, for float32 rows).  The same code
    serves the in-process step (P, h a copy of q's) and a shard's share of a minibatch ((P, h)
    zero: the shard's sums).  ``first_row``: the
    block's first row, for the error of a cavity that is not a distribution under
    on_negative="raise".

    The rows run by fixed sub-blocks (gpc._sparse.refine_block: marginals, old directions, the
    site rule, the sub-block's sums and new directions) on the caller's threads, the sub-blocks'
    sums added in block order (:func:`core.natural.add_blocks`).  ``before(j)``, when given, runs in
    sub-block j first and fills its rows of ``A`` and ``s`` (the whitening's blocks,
    :meth:`InducingFactor.whiten_blocks`: one pass instead of two).

    Float32 rows ``A`` (the mixed precision, ``SEPState(precision="mixed")``) run the rows'
    products (marginals, old directions, Gram sums, new directions) in single precision with
    float32 copies of R⁻¹, L and L⁻¹; the marginals, the sites and (P, h) stay float64.

    Returns (τ_new, ν_new, V_new, n_fresh, n_fixed): V_new (b x m, A's dtype, a workspace) holds
    the rows' new directions v_i = L⁻ᵀa_i (stored in float32 by the caller; the gradient's pass
    reads them first, :func:`ep.block_evidence`), n_fresh the rows that had no site, n_fixed
    the updates the rule's on_negative policy handled.
    """
    b, m = A.shape
    if before is not None:
        check_filled(A, s, single=True)
    yb, s, tau, nu = as_vector(yb), as_vector(s), as_vector(tau), as_vector(nu)
    V_old = np.ascontiguousarray(V_old, dtype=np.float32)
    if isinstance(old_rows, slice):
        V_old, old_rows = V_old[old_rows], None
    n_fresh = int(np.count_nonzero((tau == 0.0) & (nu == 0.0)))
    t_new, n_new = np.empty(b), np.empty(b)
    V_new = (workspace("directions", (b, m)) if A.dtype == np.float64
             else workspace("directions", (b, m), dtype=A.dtype))
    Ri, L, Li = like_rows(A, q.Ri, factor.L, factor.Li)
    spec, codes = likelihood.compiled_spec(), rule.codes
    blocks = row_blocks(b, m)
    dPs, dhs = partials("sums", len(blocks), m), np.empty((len(blocks), m))
    gathered = (None if old_rows is None
                else workspace("old directions", (b, m), dtype=np.float32))
    sited = None if old_rows is None else (tau != 0.0) | (nu != 0.0)

    def block(j):
        if before is not None:
            before(j)
        if gathered is None:
            old = rows_of(blocks[j], V_old)[0]
        else:
            a, c = blocks[j]
            old = gathered[a:c]
            if sited[a:c].any():        # else refine_block skips a' (no old site): V unread
                np.take(V_old, old_rows[a:c], axis=0, out=old)
        return _sparse.refine_block(*spec, *codes, float(damping), _sparse.SUMS_SWAP,
                                    *rows_of(blocks[j], yb, A, s), Ri, q.mean,
                                    *rows_of(blocks[j], tau, nu, t_new, n_new), dPs[j], dhs[j],
                                    old, L, Li, rows_of(blocks[j], V_new)[0])
    results = _parallel.over_blocks(block, len(blocks))
    _, n_fixed = check_refined(results, blocks, first_row)
    # P + Σ τ_new a aᵀ - Σ τ_old a'a'ᵀ, h + Σ ν_new a - Σ ν_old a'
    add_blocks(dPs, P, lower=True)
    _lapack.mirror_lower(P)
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


def tied_minibatch_step(state, likelihood, Xb, yb, damping):
    """:func:`tied_iteration` on the rows of Xb in this process."""
    return tied_iteration(state, LocalBatch(state, likelihood, Xb, yb, None), damping)


class InProcessRows(LocalTrainingRows):
    """The rows of a binary fit in this process (one ±1 label vector per problem)."""

    def all_rows(self, k, state, likelihood):
        return LocalRows(state, likelihood, self.X, self.targets[k], BLOCK_ROWS)

    def batch_rows(self, k, state, likelihood, batch, sites=True):
        rows = batch_index(batch)
        return LocalBatch(state, likelihood, take_rows(self.X, rows), self.targets[k][rows],
                          rows if sites else None)


class EngineRows(TrainingRows):
    """The rows on a distributed engine's shards (:class:`gpc.sparse._distributed.DistributedFit`):
    each worker takes its share of every minibatch."""

    def __init__(self, fit):
        self.fit, self.n = fit, fit.engine.n_rows

    def batches(self, size, rng=None):
        return self.fit.plan(size, rng)

    def all_rows(self, k, state, likelihood):
        return self.fit.rows(k, likelihood, BLOCK_ROWS)

    def batch_rows(self, k, state, likelihood, batch, sites=True):
        return self.fit.rows(k, likelihood, BLOCK_ROWS, batch)

    def svi_rows(self, k, likelihood, batch):
        return self.fit.rows(k, likelihood, BLOCK_ROWS, batch), self.fit.batch_labels(k, batch)

    def objective_rows(self, k, likelihood):
        return self.fit.rows(k, likelihood, BLOCK_ROWS), self.fit.targets[k]

    def start_minibatches(self, k, state):
        self.fit.start_minibatches(state, k, BLOCK_ROWS)

    def close(self, states, interrupted=False):
        """The sites come home (``partial_fit`` can continue in process) and the shards are
        released; after an interruption the cluster may be gone with them (False)."""
        return self.fit.finish(states, interrupted)
