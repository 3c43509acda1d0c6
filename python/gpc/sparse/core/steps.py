"""The sparse core's step loop, written once for every sparse model (SEP §2.3).

A model is a state (:class:`SparseState`: θ, Z, the sites' q, the optimiser) and rows
(:class:`gpc.sparse.core.rows.Rows`); the binary model (gpc.sparse._train) and the multi-class one
(gpc.multiclass.sparse) are two tenants.  Each step updates sites first, then q, and then moves
the free log hyperparameters and Z (and whatever else the state learns) along the gradient of
log Z_q (eq. (4); for a minibatch M its stochastic form eq. (6), data terms scaled by the rows q
holds over |M|) with Adadelta (or :class:`AdaptiveRates`):

* :func:`iteration`: all n rows (a parallel pass, q rebuilt from the new sites) or a minibatch
  (its sites swapped in q along their kept directions), then :func:`_inner_step`;
* :func:`tied_iteration`: one tied average site (stochastic EP), then :func:`_inner_step`;
* :func:`run_ep`: parallel passes at fixed hyperparameters until the sites settle.

Batch passes at fixed parameters (a state that learns nothing, on rows whose sites are the
state's: ``Rows.accelerable``) are Anderson-accelerated (:class:`SiteAnderson`): the damped
parallel pass G is a fixed-point iteration x ← G(x) on the sites whose slowest mode contracts by
about 0.99 a pass on new-thyroid and glass (the damping is not what holds it back: no pass
oscillates, and undamped passes would contract by about 0.98), so plain passes need thousands
to settle; Anderson's extrapolation of the last few passes reaches the fixed point in tens.

The failure rule, one for every model:

* a site update after which q (any class's q_k) has no factor is dropped: the old sites and q stay,
  the state counts it (``skipped_passes``) and halves the damping of the updates that follow
  (``damping_scale``);
* so is, on rows that can undo it (``Rows.undoable``: the multi-class rows in process), a pass
  over all n rows whose log Z is not finite and ≤ 0 (the log probability of the labels: a larger
  value is a state no EP fixed point has, reached by a parallel pass that overshot), with no
  inner step after it; when the damping would fall below ``MIN_DAMPING_SCALE`` it raises a
  DivergenceError.  The binary rows do not undo: under PL their log Z is a density's and may
  exceed 0;
* a parameter step (Adadelta or AdaptiveRates) that leaves q without a factor or a non-finite
  value is undone and the learning rate halved (``reverted``).
"""

import numpy as np

from ... import _pages, _parallel
from ...exceptions import DivergenceError, NotPositiveDefiniteError, NumericalError
from ...inference import _LOG_EVIDENCE_SLACK
from .natural import NaturalPosterior, times_lower_rows, whitened_sums
from .passes import as_block, block_ranges

#: a dropped batch pass (log Z not ≤ 0) raises once the damping scale would fall below this
MIN_DAMPING_SCALE = 2.0 ** -10
#: Anderson acceleration of batch passes at fixed parameters: the past passes it combines, and the
#: growth of a pass's mismatch over the smallest one since the last restart that restarts it
ANDERSON_MEMORY, ANDERSON_GROWTH = 5, 4.0
#: ... and the mismatch below which it starts (Anderson is a local method: near the fixed point,
#: where the passes are close to linear; the early passes are plain)
ANDERSON_FROM = 1e-2


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


class AdaptiveRates:
    """Gradient ascent with one adaptive rate per parameter (Tollenaere's SuperSAB, Neural
    Networks 3 (1990), as the batch code of Villacampa-Calvo & Hernández-Lobato, ICML 2017, moves
    its hyperparameters and inducing inputs): Δ_j = η_j g_j, where η_j starts at ``rate`` and,
    from the second step on, is multiplied by ``up`` (at most ``max_rate``) when g_j has the sign
    of the previous step's and by ``down`` when it has not; ``lr`` scales every step.  Unlike
    Adadelta's, the steps scale with the gradient, a sum over the rows in batch."""

    def __init__(self, size, lr=1.0, rate=1e-2, up=1.02, down=0.5, max_rate=1.0):
        self.lr, self.up, self.down, self.max_rate = lr, up, down, max_rate
        self.rates = np.full(size, rate)
        self.signs = None

    def step(self, grad):
        signs = np.sign(grad)
        if self.signs is not None:
            self.rates = np.where(signs == self.signs, np.minimum(self.up * self.rates,
                                                                  self.max_rate),
                                  self.down * self.rates)
        self.signs = signs
        return self.lr * self.rates * grad


#: the parameter steps a SparseState can take (its ``step_rule``)
STEP_RULES = {"adadelta": Adadelta, "adaptive": AdaptiveRates}


class SparseState:
    """What the step loop keeps of a fit between steps, whatever the model: the counters, the
    optimiser over the packed parameters, and the step's side tasks.

    A model's state sets its own q, sites and parameters, then calls this ``__init__`` with the
    number of parameters the optimiser moves (``step_rule``: a key of STEP_RULES, Adadelta by
    default, or a callable (n_params, lr=lr) that makes the optimiser), and gives the loop:

    * ``_params()`` / ``_set_params(p)``: the packed parameters, and the move to p (q carried over
      in u-space, SEP §2.3), raising when a factor or q has none;
    * ``rebuild(sums)``, ``swap(naturals, u_space)``, ``add_tied(sums, damping, shrink)``: q from a
      batch pass's sums, from a minibatch's swapped natural parameters, or from the tied site
      scaled by ``shrink`` plus ``damping`` times the rows' matched sums; each False, q unchanged,
      where a q has no factor; ``tied_cavity()``, the cavity a tied step matches against;
    * for rows that are ``undoable``, ``snapshot()`` / ``restore(before)`` of the sites, q and
      directions a batch pass replaces;
    * ``log_normaliser()``, the terms of log Z that come from q; ``data_terms(parts)``, the rows'
      evidence parts' (Σ log terms, pairs or rows left out); ``gradient(parts, scale, held,
      u_space)``, log Z's gradient in ``_params()``' order, data terms scaled by ``scale``.
    """

    def __init__(self, n, n_params, lr, step_rule="adadelta"):
        self.n = n
        self.n_params = n_params
        make = STEP_RULES[step_rule] if isinstance(step_rule, str) else step_rule
        self.optimizer = make(n_params, lr=lr)
        self.V = None               # the sites' u-space directions (minibatch training)
        self.n_sited = 0            # rows whose sites q holds
        self.log_z = np.nan
        self.mismatch = np.inf      # the last site pass's largest change (run_ep's stopping rule)
        self.reverted = 0           # parameter steps undone (rate halved)
        self.skipped_passes = 0     # site updates dropped (the failure rule)
        self.damping_scale = 1.0    # halved after every dropped site update
        self.n_bad = 0              # pairs or rows left out of the last evidence
        self.accelerator = None     # batch passes at fixed parameters (:class:`SiteAnderson`)
        self._later = []            # side tasks of the step under way (gpc._parallel.defer)

    @property
    def learns(self):
        return self.n_params > 0

    def drop_update(self):
        """The failure rule for a dropped site update: count it and halve the damping after it."""
        self.skipped_passes += 1
        self.damping_scale *= 0.5

    def later(self, fn):
        """Run ``fn()`` as a side task beside the step's next pass of blocks
        (gpc._parallel.defer); :meth:`settle`, at the end of the step, waits for it."""
        self._later.append(_parallel.defer(fn))

    def settle(self):
        """Finish the step's side tasks (:meth:`later`), raising the first one's error."""
        later, self._later = self._later, []
        for task in later:
            task.result()

    def gradient_step(self, grad):
        """One ascent step of the optimiser on the packed parameters; reverted with the rate
        halved if the gradient is not finite or the new point has no factor."""
        if not self.learns:
            return True
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


class SiteAnderson:
    """Anderson acceleration (type II, Walker & Ni, SIAM J. Numer. Anal. 49 (2011), with mixing
    parameter 1) of batch site passes at fixed parameters.

    A pass maps the sites x_j to G(x_j), and q to the one rebuilt from the sums S(G(x_j)) =
    (Σ τ a aᵀ, Σ ν a) of the new sites.  From the last ``memory`` + 1 passes, with residuals
    f_j = G(x_j) − x_j weighted by 1/(1 + |G(x_j)|) (the scale of the dense engine's damping
    test, gpc.inference._damping), the next sites are

        x = G(x_k) − ΔG γ,   γ = argmin ‖W (f_k − ΔF γ)‖,

    a combination of the passes' outputs; at fixed factors the sums are linear in the sites, so
    q's sums are the same combination of the passes' sums, S(x) = S(G(x_k)) − ΔS γ, and no pass
    over the rows is needed to rebuild q.  The history restarts when a pass's mismatch grows to
    ``ANDERSON_GROWTH`` times the smallest since the last restart (the extrapolation left its
    linear regime), and on every dropped pass.  The fixed points are G's: an extrapolation only
    changes the path.  It starts once a pass's mismatch is below ``ANDERSON_FROM``.  ``memory``
    None: ``ANDERSON_MEMORY``; 0 keeps the plain passes.  It keeps ``memory`` + 1 copies of the sites and of the sums (C m² each).
    """

    def __init__(self, memory=None):
        self.memory = ANDERSON_MEMORY if memory is None else memory
        self.reset()

    def reset(self):
        self.xs, self.gs, self.sums, self.best = [], [], [], np.inf

    def step(self, x, g, sums, mismatch):
        """Record the pass x → g = G(x) with q's ``sums`` of g and its ``mismatch``; returns
        the extrapolated (sites, sums), or None to keep the pass as it is."""
        if mismatch > ANDERSON_GROWTH * self.best or not mismatch < ANDERSON_FROM:
            self.reset()
            if not mismatch < ANDERSON_FROM:
                return None
        self.best = min(self.best, mismatch)
        self.xs.append(x)
        self.gs.append(g)
        self.sums.append(sums)
        if len(self.xs) > self.memory + 1:
            del self.xs[0], self.gs[0], self.sums[0]
        if len(self.xs) < 2:
            return None
        F = np.column_stack(self.gs) - np.column_stack(self.xs)
        w = 1.0 / (1.0 + np.abs(g))
        gamma = np.linalg.lstsq(w[:, None] * np.diff(F, axis=1), w * F[:, -1], rcond=1e-10)[0]
        if not np.all(np.isfinite(gamma)):
            self.reset()
            return None
        x_new = g - np.diff(np.column_stack(self.gs), axis=1) @ gamma
        return x_new, _combine(self.sums, gamma)


def _combine(sums, gamma):
    """S_k − Σ_j γ_j (S_{j+1} − S_j) over nested tuples and lists of arrays (the passes' sums)."""
    last = sums[-1]
    if isinstance(last, (tuple, list)):
        return type(last)(_combine([s[i] for s in sums], gamma) for i in range(len(last)))
    out = np.array(last, dtype=np.float64)
    for j, c in enumerate(gamma):
        out -= c * (sums[j + 1] - sums[j])
    return out


def tied_cavity(q, n):
    """A row's cavity under one tied site: q less one of the n shares of its average site,
    (P, h) → (1 − 1/n)(P − I) + I, (1 − 1/n) h."""
    keep = 1.0 - 1.0 / n
    P = keep * q.P
    P.flat[:: P.shape[0] + 1] += 1.0 - keep
    return NaturalPosterior(P, keep * q.h)


def site_directions(X, factor, tau, nu, block_rows, P, h):
    """The directions v_i = L⁻ᵀa_i (n x m, float32) of the sites of X's rows with the current
    factor; their sums Σ τ_i a_i a_iᵀ, Σ ν_i a_i are added to (P, h) in place.  One pass over X:
    the start of minibatch training on sites that a batch or distributed fit left without
    directions (a state's ``start_minibatches``, and a shard's share of it)."""
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


def iteration(state, rows, damping):
    """One step on the rows that ``rows`` covers, SEP §2.3 in its order: their sites refined
    against their cavities, q updated, then one "inner" step of the parameters (eq. (4) or (6))
    after which q is reconstructed for the new factors.

    All n rows (a batch iteration): a parallel pass, q rebuilt from the new sites, each site
    following its row (the gradient's "sites" form).

    A minibatch M of fewer rows (SEP eq. (6) literally): a site held by q lies along its direction
    at its last refinement, a'_i = Lᵀv_i with the current factor L (v_i kept in ``state.V``, or on
    the shards); the cavity removes it along a'_i, and q swaps it for the refined site along the
    current a_i: P + Σ τ_new a aᵀ - Σ τ_old a'a'ᵀ.  q therefore stays the sum of its sites.  The
    gradient takes the "cavity" form, its data terms scaled by (rows q holds) / |M|: during the
    first pass q holds only the rows seen so far, and the prior term of eq. (4), computed from q,
    is that of those rows (scaled by n / |M| from the first step, the data terms outweighed the
    prior term and the amplitude grew without bound).

    The damping is ``damping`` times the state's ``damping_scale``; a failed update follows the
    module's failure rule.  Returns log Z_q (eq. (3)), or for a minibatch its estimate over all n
    rows (data terms scaled by n / |M|).
    """
    damping = damping * state.damping_scale
    try:
        if rows.size == state.n:
            before = state.snapshot() if rows.undoable else None
            if not _accelerated_pass(state, rows, damping):
                before = None
            return _inner_step(state, rows, state.n, "sites", before)
        _refine_minibatch(state, rows, damping)
        return _inner_step(state, rows, max(state.n_sited, rows.size), "cavity")
    finally:
        state.settle()


def _pass(state, rows, damping):
    """A parallel pass over all n rows: q rebuilt from the new sites, which are kept if it has a
    factor (else dropped under the failure rule); q's sums of the kept sites, else None."""
    sums = rows.update_sites(damping)
    if state.rebuild(sums):
        rows.commit()
        state.n_sited = state.n
        return sums
    rows.revert()
    state.drop_update()
    return None


def _accelerated_pass(state, rows, damping):
    """:func:`_pass`, then, at fixed parameters on rows whose sites are the state's
    (``rows.accelerable``) and from sites on every row, the state moved to the
    :class:`SiteAnderson` extrapolation of its last passes (kept if q has a factor there and the
    state takes the sites, ``set_site_vector``); whether the pass was kept."""
    accelerate = rows.accelerable and not state.learns and state.n_sited == state.n
    x = state.site_vector() if accelerate else None
    sums = _pass(state, rows, damping)
    if not accelerate or sums is None:
        if state.accelerator is not None:
            state.accelerator.reset()
        return sums is not None
    if state.accelerator is None:
        state.accelerator = SiteAnderson()
    g = state.site_vector()
    trial = state.accelerator.step(x, g, sums, state.mismatch)
    if trial is not None and not (state.set_site_vector(trial[0]) and state.rebuild(trial[1])):
        state.set_site_vector(g)
        state.rebuild(sums)
        state.accelerator.reset()
    return True


def _refine_minibatch(state, rows, damping):
    """The site update of :func:`iteration` for a minibatch: the rows' sites refined and swapped
    in q (``rows.swap_sites``), kept if that q has a factor."""
    naturals, n_fresh = rows.swap_sites(damping)
    if state.swap(naturals, rows.u_space):
        rows.commit()
        state.n_sited = min(state.n, state.n_sited + n_fresh)
    else:
        rows.revert()
        state.drop_update()


def _inner_step(state, rows, n_held, held, before=None):
    """The "inner" step after a site update: log Z_q's parts over the rows at the new q, then one
    Adadelta step on its gradient, data terms scaled by ``n_held`` / |M| (eq. (4), (6)); ``held``
    as in :meth:`Rows.evidence_parts`.  ``before``: the state's snapshot before a batch pass,
    brought back if log Z is not finite and ≤ 0 (the failure rule).  Returns the estimate of
    log Z_q over all n rows."""
    b = rows.size
    parts = rows.evidence_parts(state.learns, held)
    log_terms, n_bad = state.data_terms(parts)
    log_z = state.log_normaliser() + state.n / b * log_terms
    if before is not None and not log_z <= _LOG_EVIDENCE_SLACK:
        state.restore(before)
        state.drop_update()
        if state.accelerator is not None:
            state.accelerator.reset()
        if state.damping_scale < MIN_DAMPING_SCALE:
            raise DivergenceError(f"sparse EP: every site pass at damping down to "
                                  f"{MIN_DAMPING_SCALE:.3g} times the set one reached log Z = "
                                  f"{log_z:.6g}, not a log probability (finite, ≤ 0)",
                                  method="ep", value=log_z)
        if not np.isfinite(state.log_z):        # the first pass: log Z of the state kept
            kept, _ = state.data_terms(rows.evidence_parts(False, held))
            state.log_z = state.log_normaliser() + state.n / b * kept
        return state.log_z
    state.n_bad = n_bad
    state.log_z = log_z
    if state.learns:
        state.gradient_step(state.gradient(parts, n_held / b, held, rows.u_space))
    return log_z


def tied_iteration(state, rows, damping):
    """A minibatch step with one tied site (stochastic EP, Li, Hernández-Lobato & Turner 2015;
    beyond the SEP paper).

    Each row's cavity removes one average site, q^{\\i} ∝ p(u) f̄^{n-1} (:func:`tied_cavity`).
    Every row of M matches its sites against that cavity (``rows.match_sites``) and replaces its
    1/n share, damped: S ← (1 - δ|M|/n) S + δ Σ_M t_i, δ the damping times ``damping_scale``.
    The stochastic gradient step (eq. (6)) then uses the rows' matched sites in place of stored
    ones, in the "cavity" form.  Returns the minibatch estimate of log Z_q.
    """
    damping = damping * state.damping_scale
    sums = rows.match_sites(state.tied_cavity())
    if not state.add_tied(sums, damping, 1.0 - damping * rows.size / state.n):
        state.drop_update()
    return _inner_step(state, rows, state.n, "cavity")


def run_ep(state, rows, damping=0.5, tol=1e-9, max_iter=1000):
    """Parallel damped site passes at fixed parameters (no inner steps) on ``rows``, all n rows,
    until the state's ``mismatch`` after a pass (the rows' measure of how far the sites moved) is
    below ``tol``; returns (passes, converged).  A pass that leaves q without a factor is dropped
    under the failure rule."""
    for it in range(1, max_iter + 1):
        _pass(state, rows, damping * state.damping_scale)
        if state.mismatch < tol:
            return it, True
    return max_iter, False
