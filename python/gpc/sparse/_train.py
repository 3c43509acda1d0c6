"""SEP trainers: batch passes and minibatches, both with "inner" hyperparameter steps (SEP §2.3).

Each step updates sites first, then q, and then moves the free log hyperparameters and Z along
the gradient of log Z_q (eq. (4); for a minibatch M its stochastic form eq. (6), data terms scaled
by n/|M|) with Adadelta.  A step that leaves q without a factor or a non-finite value is reverted,
and the learning rate is halved; the trainer records it.  With batch_size = n a minibatch step is
the batch step (same sites, same q, same gradient): tested.

Cost of a minibatch step of b rows (m inducing points): the kernel block K_bm, five b x m x m
triangular solves or products (whitening, the cavity marginals, the site sums, the marginals and
A Σ_w at the new q), one b x m x m product for the K_uu part of the gradient, and O(m³) for the
new q (one Cholesky factor) and for moving q to the new θ and Z (:func:`ep.transform_natural`).
"""

import numpy as np

from ..exceptions import NotPositiveDefiniteError, NumericalError
from ._inducing import InducingFactor
from ._passes import block_parts, evidence_parts, finish_evidence, natural_sums, site_pass
from .ep import NaturalPosterior, matched_site, transform_natural, update_sites, whitened_sums


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
    parameters (P, h) in the current whitened coordinates (:class:`ep.NaturalPosterior`).  With
    ``tied`` there are no per-row sites: (P - I, h) are n times one shared average site
    (stochastic EP, Li, Hernández-Lobato & Turner 2015), so the state is O(m²) whatever n is.
    """

    def __init__(self, kernel, Z, n, jitter, optimize_inducing, lr, tied=False):
        self.kernel, self.Z, self.jitter = kernel, np.array(Z, dtype=np.float64), jitter
        self.optimize_inducing = optimize_inducing
        self.tied, self.n = tied, n
        self.tau, self.nu = (None, None) if tied else (np.zeros(n), np.zeros(n))
        m = self.Z.shape[0]
        self.factor = InducingFactor(kernel, self.Z, jitter)
        self.q = NaturalPosterior(np.eye(m), np.zeros(m))
        self._theta, self._bounds = kernel.theta, kernel.bounds
        self.n_params = len(self._theta) + (self.Z.size if optimize_inducing else 0)
        self.optimizer = Adadelta(self.n_params, lr=lr)
        self.log_z = np.nan
        self.reverted = 0          # parameter steps undone (rate halved)
        self.skipped_passes = 0    # site updates dropped because q lost its factor

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
        if not k:
            kernel = self.kernel
        elif self.factor.fast is not None:
            kernel = self.factor.fast.with_theta(self.kernel, theta)
        else:
            kernel = self.kernel.clone_with_theta(theta)
        Z = p[k:].reshape(self.Z.shape) if self.optimize_inducing else self.Z
        factor = InducingFactor(kernel, Z, self.jitter)
        q = NaturalPosterior(*transform_natural(self.q.P, self.q.h, self.factor.L, factor.L))
        if not (np.all(np.isfinite(q.mean)) and np.isfinite(q.logdet)):
            raise NotPositiveDefiniteError("q is not finite")
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
        except NotPositiveDefiniteError:     # negative sites made q improper: keep the old sites
            self.skipped_passes += 1
            return False
        return True

    def gradient_step(self, g_theta, g_Z):
        """One Adadelta ascent step on (log θ, Z); reverted with the rate halved if it fails."""
        if not self.learns:
            return True
        grad = np.concatenate([g_theta, g_Z.ravel() if self.optimize_inducing else np.empty(0)])
        if not np.all(np.isfinite(grad)):
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


class LocalRows:
    """The training rows of one binary problem in this process, their sites in ``state``.

    The interface an iteration needs (:func:`iteration`): ``size``, ``update_sites``, ``commit``,
    ``revert``, ``evidence_parts``; the distributed twin is
    :class:`gpc.sparse._distributed.ShardedRows`.
    """

    def __init__(self, state, likelihood, X, y, block_rows):
        self.state, self.likelihood, self.X, self.y, self.block_rows = (
            state, likelihood, X, y, block_rows)
        self.size = len(y)
        self._pending = None

    def update_sites(self, factor, q, damping, sums):
        """Refine every site from q (SEP §2.2); returns (dP, dh), kept pending until commit.
        All rows are covered, so ``sums`` is "new" (:func:`ep.update_sites`)."""
        tau, nu, dP, dh, _ = site_pass(self.likelihood, self.X, self.y, factor, q, self.state.tau,
                                       self.state.nu, damping, self.block_rows)
        self._pending = tau, nu
        return dP, dh

    def commit(self):
        self.state.tau, self.state.nu = self._pending
        self._pending = None

    def revert(self):
        self._pending = None

    def evidence_parts(self, factor, q, gradient):
        return evidence_parts(self.likelihood, self.X, self.y, factor, q, self.state.tau,
                              self.state.nu, self.block_rows, gradient)


class LocalBatch:
    """Rows ``rows`` (a slice) of one binary problem in this process, as one block: a minibatch.

    The interface of :class:`LocalRows`; the whitened block is kept between the site update and
    the evidence parts.  With tied sites (``rows`` None) :meth:`match_sites` replaces
    :meth:`update_sites` and the evidence uses the rows' matched sites."""

    def __init__(self, state, likelihood, Xb, yb, rows):
        self.state, self.likelihood, self.Xb, self.yb, self.rows = state, likelihood, Xb, yb, rows
        self.size = len(yb)
        self._pending = self._matched = None

    def match_sites(self, factor, cavity):
        """Each row's site matched against the tied cavity; their sums (Σ τ a aᵀ, Σ ν a)."""
        self._whitened = factor.whiten(self.Xb, keep_cross=True)
        A, s, _ = self._whitened
        self._matched = tied_block_sites(self.likelihood, self.yb, A, s, cavity)
        return whitened_sums(A, *self._matched)

    def update_sites(self, factor, q, damping, sums):
        self._whitened = factor.whiten(self.Xb, keep_cross=True)
        A, s, _ = self._whitened
        up = update_sites(self.likelihood, self.yb, A, s, q, self.state.tau[self.rows],
                          self.state.nu[self.rows], damping, sums=sums)
        self._pending = up.tau, up.nu
        return up.dP, up.dh

    def commit(self):
        self.state.tau[self.rows], self.state.nu[self.rows] = self._pending
        self._pending = None

    def revert(self):
        self._pending = None

    def evidence_parts(self, factor, q, gradient):
        A, s, Kbu = self._whitened
        tau, nu = (self._matched if self._matched is not None
                   else (self.state.tau[self.rows], self.state.nu[self.rows]))
        return block_parts(self.likelihood, self.Xb, self.yb, A, s, factor, q, tau, nu, gradient,
                           Kbu)


def iteration(state, rows, damping):
    """One step on the rows ``rows`` covers: a parallel site pass over them, q updated, one inner
    step (SEP §2.3).

    All n rows (a batch iteration): q is rebuilt from the new sites.  A minibatch M: q gets the
    change its sites make, and the stochastic step scales the data terms by n/|M| (eq. (6)).
    Returns log Z_q (eq. (3)), or its minibatch estimate.
    """
    every_row = rows.size == state.n
    dP, dh = rows.update_sites(state.factor, state.q, damping, "new" if every_row else "change")
    if state.add_sites(dP, dh, shrink=0.0 if every_row else 1.0):
        rows.commit()
    else:
        rows.revert()
    return _inner_step(state, rows)


def _inner_step(state, rows):
    """The "inner" step after a site update: log Z_q's parts over the rows at the new q, then one
    Adadelta step on its gradient (eq. (4); eq. (6) with the data terms scaled by n/|M|)."""
    parts = rows.evidence_parts(state.factor, state.q, state.learns)
    log_z, g_theta, g_Z, _ = finish_evidence(state.factor, state.q, parts,
                                             scale=state.n / rows.size)
    state.log_z = log_z
    if state.learns:
        state.gradient_step(g_theta, g_Z)
    return log_z


def batch_step(state, likelihood, X, y, damping, block_rows):
    """:func:`iteration` over the rows of X in this process."""
    return iteration(state, LocalRows(state, likelihood, X, y, block_rows), damping)


def rebuild_q(state, X, block_rows):
    """q from every row's site with the current factor (one O(n m²) pass).

    A minibatch step refreshes only its rows' share of q, so after θ and Z have moved the other
    rows' shares are the ones made with earlier factors; rebuilding once per epoch bounds that
    drift to one epoch.  q is kept if the rebuilt one has no factor."""
    try:
        state.q = NaturalPosterior(*natural_sums(X, state.factor, state.tau, state.nu, block_rows))
    except NotPositiveDefiniteError:
        state.skipped_passes += 1


def minibatch_step(state, likelihood, Xb, yb, rows, n, damping):
    """Refine the sites of rows ``rows`` (a slice), update q, then a stochastic step (eq. (6)).

    Returns the minibatch estimate of log Z_q (data terms scaled by n/|M|).  A minibatch of all
    n rows rebuilds q from its sites, as a batch pass does; a smaller one swaps its rows' shares,
    and the epoch's end rebuilds q (:func:`rebuild_q`).  :func:`iteration` on a
    :class:`LocalBatch`; ``n`` must be the state's.
    """
    if n != state.n:
        raise ValueError(f"n = {n} is not the state's number of rows, {state.n}")
    return iteration(state, LocalBatch(state, likelihood, Xb, yb, rows), damping)


def tied_block_sites(likelihood, y, A, s, cavity):
    """The sites (τ, ν) of a block's rows matched against the tied cavity (rows whose match is not
    finite get a zero site)."""
    cmean, cvar = cavity.marginals(A)
    _, tau, nu, _ = matched_site(likelihood, y, cmean, cvar, s)
    good = np.isfinite(tau) & np.isfinite(nu)
    return np.where(good, tau, 0.0), np.where(good, nu, 0.0)


def tied_iteration(state, rows, damping):
    """Minibatch step with one tied site (stochastic EP; beyond the SEP paper).

    Each row's cavity removes one average site, q^{\\i} ∝ p(u) f̄^{n-1}: in the natural
    parameters, (1 - 1/n)(P - I, h).  Every row of M matches its rank-one site t_i against that
    cavity and replaces its 1/n share, damped: S ← (1 - δ|M|/n) S + δ Σ_M t_i.  The stochastic
    gradient step (eq. (6)) then uses the rows' matched sites in place of stored ones, the same
    "inner" approximation as the untied step.  ``rows`` has the interface of :class:`LocalBatch`
    (``match_sites``, ``evidence_parts``, ``size``).  Returns the minibatch estimate of log Z_q.
    """
    n, m = state.n, state.factor.m
    keep = 1.0 - 1.0 / n
    P_cav = keep * state.q.P
    P_cav.flat[:: m + 1] += 1.0 - keep
    dP, dh = rows.match_sites(state.factor, NaturalPosterior(P_cav, keep * state.q.h))
    state.add_sites(damping * dP, damping * dh, shrink=1.0 - damping * rows.size / n)
    return _inner_step(state, rows)


def tied_minibatch_step(state, likelihood, Xb, yb, damping):
    """:func:`tied_iteration` on the rows of Xb in this process."""
    return tied_iteration(state, LocalBatch(state, likelihood, Xb, yb, None), damping)
