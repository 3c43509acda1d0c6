"""SEP trainers: batch passes and minibatches, both with "inner" hyperparameter steps (SEP §2.3).

Each step updates sites first, rebuilds q, and then moves the free log hyperparameters and Z along
the gradient of log Z_q (eq. (4); for a minibatch M its stochastic form eq. (6), data terms scaled
by n/|M|) with Adadelta.  A step that leaves q without a factor or a non-finite value is reverted,
and the learning rate is halved; the trainer records it.  With batch_size = n a minibatch step is
the batch step (same sites, same q, same gradient): tested.
"""

import numpy as np

from ..exceptions import NotPositiveDefiniteError
from ._inducing import InducingFactor
from ._passes import (add_parts, as_block, block_parts, block_ranges, finish_evidence, site_pass)
from .ep import build_posterior, matched_site, update_sites


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
    """Everything a fit carries between steps: θ, Z, the sites and their sums, q, the optimiser.

    ``tau``/``nu`` hold two scalars per training row; S2/S1 are their u-space sums.  With
    ``tied`` there are no per-row sites: S2/S1 are n times one shared average site (stochastic
    EP, Li, Hernández-Lobato & Turner 2015), so the state is O(m²) whatever n is.
    """

    def __init__(self, kernel, Z, n, jitter, optimize_inducing, lr, tied=False):
        self.kernel, self.Z, self.jitter = kernel, np.array(Z, dtype=np.float64), jitter
        self.optimize_inducing = optimize_inducing
        self.tied, self.n = tied, n
        self.tau, self.nu = (None, None) if tied else (np.zeros(n), np.zeros(n))
        m = self.Z.shape[0]
        self.S2, self.S1 = np.zeros((m, m)), np.zeros(m)
        self.factor = InducingFactor(kernel, self.Z, jitter)
        self.q = build_posterior(self.factor.L, self.S2, self.S1)
        self.n_params = len(kernel.theta) + (self.Z.size if optimize_inducing else 0)
        self.optimizer = Adadelta(self.n_params, lr=lr)
        self.log_z = np.nan
        self.reverted = 0          # parameter steps undone (rate halved)
        self.skipped_passes = 0    # site updates dropped because q lost its factor

    @property
    def learns(self):
        return self.n_params > 0

    def _params(self):
        z = self.Z.ravel() if self.optimize_inducing else np.empty(0)
        return np.concatenate([self.kernel.theta, z])

    def _set_params(self, p):
        k = len(self.kernel.theta)
        bounds = self.kernel.bounds
        theta = np.clip(p[:k], bounds[:, 0], bounds[:, 1]) if k else p[:k]
        kernel = self.kernel.clone_with_theta(theta) if k else self.kernel
        Z = p[k:].reshape(self.Z.shape) if self.optimize_inducing else self.Z
        factor = InducingFactor(kernel, Z, self.jitter)
        q = build_posterior(factor.L, self.S2, self.S1)
        if not (np.all(np.isfinite(q.mean)) and np.isfinite(q.logdet)):
            raise NotPositiveDefiniteError("q is not finite")
        self.kernel, self.Z, self.factor, self.q = kernel, np.array(Z), factor, q

    def set_sites(self, S2, S1):
        """Adopt new sums (after a site pass); raises NotPositiveDefiniteError if q has no factor."""
        q = build_posterior(self.factor.L, S2, S1)
        self.S2, self.S1, self.q = S2, S1, q

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
        except (NotPositiveDefiniteError, FloatingPointError, ValueError):
            self._set_params(old)
            self.optimizer.lr *= 0.5
            self.reverted += 1
            return False
        return True


def _swap_sites(state, S2_new, S1_new, S2_old, S1_old):
    """Replace the rows' old contribution to the sums by the new one, both made with the current
    v_i: the sums stay in u-space across θ and Z steps (SEP §2.3), without an m x n matrix."""
    S2 = state.S2 + (S2_new - S2_old)
    try:
        state.set_sites(0.5 * (S2 + S2.T), state.S1 + (S1_new - S1_old))
    except NotPositiveDefiniteError:     # negative sites made q improper: keep the old sites
        state.skipped_passes += 1
        return False
    return True


def batch_step(state, likelihood, X, y, damping, block_rows):
    """One batch iteration: a parallel site pass over all rows, q rebuilt, one inner step."""
    tau, nu, S2_new, S1_new, S2_old, S1_old, _ = site_pass(
        likelihood, X, y, state.factor, state.q, state.tau, state.nu, damping, block_rows)
    if _swap_sites(state, S2_new, S1_new, S2_old, S1_old):
        state.tau, state.nu = tau, nu
    parts = None
    for start, stop in block_ranges(len(y), block_rows):
        Xb = as_block(X, start, stop)
        A, s = state.factor.whiten(Xb)
        parts = add_parts(parts, block_parts(likelihood, Xb, y[start:stop], A, s, state.factor,
                                             state.q, tau[start:stop], nu[start:stop],
                                             state.learns))
    log_z, g_theta, g_Z, _ = finish_evidence(state.factor, state.q, parts)
    state.log_z = log_z
    if state.learns:
        state.gradient_step(g_theta, g_Z)
    return log_z


def minibatch_step(state, likelihood, Xb, yb, rows, n, damping):
    """Refine the sites of rows ``rows`` (a slice), update q, then a stochastic step (eq. (6)).

    Returns the minibatch estimate of log Z_q (data terms scaled by n/|M|).
    """
    factor = state.factor
    A, s = factor.whiten(Xb)
    up = update_sites(likelihood, yb, A, s, factor.unwhiten_rows(A), state.q,
                      state.tau[rows], state.nu[rows], damping)
    if _swap_sites(state, up.S2_new, up.S1_new, up.S2_old, up.S1_old):
        state.tau[rows], state.nu[rows] = up.tau, up.nu
    parts = block_parts(likelihood, Xb, yb, A, s, factor, state.q, state.tau[rows],
                        state.nu[rows], state.learns)
    log_z, g_theta, g_Z, _ = finish_evidence(factor, state.q, parts, scale=n / len(yb))
    state.log_z = log_z
    if state.learns:
        state.gradient_step(g_theta, g_Z)
    return log_z


def tied_minibatch_step(state, likelihood, Xb, yb, damping):
    """Minibatch step with one tied site (stochastic EP; beyond the SEP paper).

    Each row's cavity removes one average site, q^{\\i} ∝ p(u) f̄^{n-1}: in the sums,
    (1 - 1/n)(S2, S1).  Every row of M matches its rank-one site t_i against that cavity and
    replaces its 1/n share, damped: S ← (1 - δ|M|/n) S + δ Σ_M t_i.  The stochastic gradient step
    (eq. (6)) then uses the rows' matched sites in place of stored ones, the same "inner"
    approximation as the untied step.  Returns the minibatch estimate of log Z_q.
    """
    factor, n = state.factor, state.n
    A, s = factor.whiten(Xb)
    V = factor.unwhiten_rows(A)
    keep = 1.0 - 1.0 / n
    cav = build_posterior(factor.L, keep * state.S2, keep * state.S1)
    cmean, cvar = cav.marginals(A)
    _, tau, nu, _ = matched_site(likelihood, yb, cmean, cvar, s)
    good = np.isfinite(tau) & np.isfinite(nu)
    tau, nu = np.where(good, tau, 0.0), np.where(good, nu, 0.0)
    shrink = 1.0 - damping * len(yb) / n
    S2 = shrink * state.S2 + damping * ((V.T * tau) @ V)
    try:
        state.set_sites(0.5 * (S2 + S2.T), shrink * state.S1 + damping * (V.T @ nu))
    except NotPositiveDefiniteError:
        state.skipped_passes += 1
    parts = block_parts(likelihood, Xb, yb, A, s, factor, state.q, tau, nu, state.learns)
    log_z, g_theta, g_Z, _ = finish_evidence(factor, state.q, parts, scale=n / len(yb))
    state.log_z = log_z
    if state.learns:
        state.gradient_step(g_theta, g_Z)
    return log_z
