"""The two baselines of SEP §3, on the same inducing geometry: GFITC and SVI.

GFITC (Naish-Guzman & Holden 2008) runs EP on the FITC prior N(0, Q + diag s) with sites on f_i,
and fits θ and Z by L-BFGS-B on its converged EP evidence.  A site on f_i seen through
f_i = a_iᵀw + ε_i, ε_i ~ N(0, s_i), is a Gaussian site on a_iᵀw with τ' = τ/(1 + τ s_i); its update
from the moments of the cavity widened by s_i is then exactly SEP's (:func:`ep.matched_site`), and
so are the fixed point and the evidence (tested against exact EP on Q + diag s).  What differs is
the schedule: GFITC runs EP to convergence for every θ (the "outer" scheme of SEP Fig. 1), where
SEP steps θ after every pass.  The gradient is eq. (4) at that fixed point.

SVI (Hensman, Matthews & Ghahramani 2015) maximises the bound of SEP eq. (8) with the whitened
q(w) = N(μ, L_q L_qᵀ) (u = L w):

    F = Σ_i E_{N(f | a_iᵀμ, s_i + |L_qᵀ a_i|²)}[log p(y_i | f)] - KL[q(w) || N(0, I)],

KL = ½ (tr S + μᵀμ - m - log|S|), the expectations by the likelihood's 1-D Gauss–Hermite rule
(``expected_log_prob``).  Batch training uses L-BFGS-B, minibatches Adadelta with the data terms
scaled by n/|M|.
"""

import numpy as np

from ..exceptions import DivergenceError, NotPositiveDefiniteError, NumericalError
from ..inference.rules import DEFAULT_ON_NEGATIVE, Rule
from ._passes import block_parts
from .core.inducing import InducingFactor
from .core.natural import NaturalPosterior, Posterior, whitened_sums
from .core.passes import add_parts, as_block, block_ranges, finish_evidence
from .core.variational import LBFGSState, VariationalState, svi_block, svi_finish
from .ep import update_sites


def _pack(kernel, Z, optimize_inducing, extra=()):
    z = Z.ravel() if optimize_inducing else np.empty(0)
    return np.concatenate([kernel.theta, z, *extra])


def _bounds(kernel, Z, optimize_inducing, n_extra):
    b = [tuple(r) for r in kernel.bounds] if len(kernel.theta) else []
    return b + [(None, None)] * ((Z.size if optimize_inducing else 0) + n_extra)


def _unpack_kernel(state, p):
    k = len(state.kernel.theta)
    kernel = state.kernel.clone_with_theta(p[:k]) if k else state.kernel
    nz = state.Z.size if state.optimize_inducing else 0
    Z = p[k:k + nz].reshape(state.Z.shape) if nz else state.Z
    return kernel, Z, p[k + nz:]


class GFITCState(LBFGSState):
    """GFITC: EP to convergence at each (θ, Z), warm started from the last sites.

    At one (θ, Z) the EP passes all see the same whitened rows, so :meth:`objective` whitens the
    data once (A_b, s_b and K_bu per block, n x m numbers twice: the O(n m) memory SEP also needs)
    and runs every pass and the evidence on them (:func:`_whitened_blocks`).

    EP stops when no site moves more than ``tol`` (1e-4, the GFITC code of the SEP paper's
    authors stops there too); on pima with m = 173, 1e-6 took 15 passes per evaluation and 1e-4
    took 6, and the fitted models' test NLL differed by < 0.007.

    ``on_negative`` is EP's policy for negative variances (:class:`ep.Rule`).
    """

    name = "GFITC"
    _model = ("kernel", "Z", "factor", "q", "tau", "nu", "log_z")

    def __init__(self, kernel, Z, n, jitter, optimize_inducing, damping, tol=1e-4, max_passes=200,
                 on_negative=DEFAULT_ON_NEGATIVE):
        self.rule = Rule("ep", on_negative)
        self.kernel, self.Z, self.jitter = kernel, np.array(Z, dtype=np.float64), jitter
        self.optimize_inducing, self.damping, self.tol, self.max_passes = (
            optimize_inducing, damping, tol, max_passes)
        self.n = n
        self.tau, self.nu = np.zeros(n), np.zeros(n)
        self.factor = InducingFactor(kernel, self.Z, jitter)
        self.q = None
        self.log_z = np.nan
        self.reverted = 0
        self.failure = None        # the error behind the last rejected point
        self.passes = 0            # EP passes over the data, all evaluations together

    def params(self):
        return _pack(self.kernel, self.Z, self.optimize_inducing)

    def bounds(self):
        return _bounds(self.kernel, self.Z, self.optimize_inducing, 0)

    def objective(self, likelihood, X, y, p, block_rows):
        """Converged EP evidence (SEP eq. (3) = GFITC's) and its gradient (eq. (4)) at p.

        -inf (``reverted`` counts it, ``failure`` keeps the error) where K_uu or q has no factor,
        or where a row has no proper cavity at the end of EP (1 - τ_i σ_i² ≤ 0, or its
        likelihood integral fails); L-BFGS-B backtracks from such a point.  A row whose marginal
        variance σ_i² underflows to 0 (a_i = 0: the length-scales are tiny against its distance
        to every inducing point, where L-BFGS-B's long steps do go) is not one of them: its
        cavity is the point mass at a_iᵀμ (:func:`gpc._sparse.evidence_rows`), and the row adds its
        log Z_i to the evidence.
        """
        kernel, Z, _ = _unpack_kernel(self, p)
        try:
            factor = InducingFactor(kernel, Z, self.jitter)
        except NotPositiveDefiniteError as exc:
            self.reverted += 1
            self.failure = exc
            return -np.inf, np.zeros_like(p)
        blocks = _whitened_blocks(X, factor, block_rows)
        try:
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                tau, nu, q = self._run_ep(likelihood, y, blocks)
                parts = None
                for start, stop, Xb, A, s, Kbu in blocks:
                    parts = add_parts(parts, block_parts(likelihood, Xb, y[start:stop], A, s, factor,
                                                         q, tau[start:stop], nu[start:stop], True,
                                                         Kbu, rule=self.rule))
                log_z, g_theta, g_Z, n_bad = finish_evidence(factor, q, parts)
            if not (np.isfinite(log_z) and np.all(np.isfinite(g_theta))
                    and np.all(np.isfinite(g_Z))):
                # eq. (4) is rounded away where the sites are huge: L-BFGS-B must not step on it
                raise DivergenceError("GFITC: the EP evidence or its gradient is not finite at "
                                      "this (θ, Z)", method="gfitc")
            if n_bad:
                # the site rule keeps such rows' sites and the evidence leaves their terms out,
                # which would make a degenerate point look better than any proper one
                raise NumericalError(f"GFITC: {n_bad} rows have no proper cavity at this (θ, Z) "
                                     "(1 - τ σ² ≤ 0, or the likelihood integral failed)",
                                     method="gfitc", value=n_bad)
        except (NotPositiveDefiniteError, NumericalError) as exc:
            self.reverted += 1
            self.failure = exc
            return -np.inf, np.zeros_like(p)
        self.kernel, self.Z, self.factor, self.q, self.tau, self.nu = kernel, Z, factor, q, tau, nu
        self.log_z = log_z
        return log_z, _pack_grad(g_theta, g_Z, self.optimize_inducing)

    def _run_ep(self, likelihood, y, blocks):
        """Parallel damped EP (SEP §2.2's site update) on the whitened blocks, from the current
        sites, until no site moves more than ``tol``; q is rebuilt from the new sites at every
        pass.  Returns (tau, nu, q)."""
        m = blocks[0][3].shape[1]
        tau, nu = self.tau, self.nu
        a2 = np.concatenate([np.einsum("ij,ij->i", A, A) for _, _, _, A, _, _ in blocks])
        P, h = np.eye(m), np.zeros(m)
        for start, stop, _, A, _, _ in blocks:
            dP, dh = whitened_sums(A, tau[start:stop], nu[start:stop])
            P += dP
            h += dh
        q = NaturalPosterior(0.5 * (P + P.T), h)
        for _ in range(self.max_passes):
            new_tau, new_nu = tau.copy(), nu.copy()
            P, h = np.eye(m), np.zeros(m)
            for start, stop, _, A, s, _ in blocks:
                up = update_sites(likelihood, y[start:stop], A, s, q, tau[start:stop],
                                  nu[start:stop], self.damping, sums="new", rule=self.rule,
                                  first_row=start)
                new_tau[start:stop], new_nu[start:stop] = up.tau, up.nu
                P += up.dP
                h += up.dh
            change = max(np.max(np.abs(new_tau - tau)), np.max(np.abs(new_nu - nu)))
            tau, nu = new_tau, new_nu
            _check_sites(tau, nu, a2)
            q = NaturalPosterior(0.5 * (P + P.T), h)
            self.passes += 1
            if change < self.tol:
                break
        return tau, nu, q


#: the largest site precision along a_i, τ_i |a_i|², in units of the prior's (p(w) = N(0, I)):
#: beyond 2⁵² the site pins a_iᵀw below the rounding of its unit prior variance
PINNED = 2.0 ** 52


def _check_sites(tau, nu, a2):
    """DivergenceError for sites that left every EP fixed point: non-finite, or a site precision
    beyond PINNED.  A step-like likelihood (noisy threshold) on rows that the model sees as one
    value with both labels (equal rows at an inducing point, FITC variance s_i = 0) has no fixed
    point: against a cavity N(0, v) the matched site precision is c/v with c > 1, so each pass
    narrows q and multiplies every site precision by about the same factor (≈ 9.5 per damped pass
    on ten such rows), until the evidence is rounding and its gradient overflows."""
    pinned = np.abs(tau) * a2
    if np.all(np.isfinite(tau)) and np.all(np.isfinite(nu)) and not np.any(pinned > PINNED):
        return
    i = int(np.argmax(np.where(np.isfinite(pinned), pinned, np.inf)))
    raise DivergenceError(f"GFITC: EP's sites diverge at this (θ, Z): site {i} has precision "
                          f"{tau[i]:.3g} along a_i (|a_i|² = {a2[i]:.3g}), beyond 2^52 times the "
                          "prior's; a step-like likelihood on rows with both labels that the "
                          "inducing points cannot tell apart has no EP fixed point",
                          method="gfitc", index=i, value=tau[i])


def _whitened_blocks(X, factor, block_rows):
    """[(start, stop, X_b, A_b, s_b, K_bu)] for the row blocks of X at one factor of K_uu."""
    out = []
    for start, stop in block_ranges(X.shape[0], block_rows):
        Xb = as_block(X, start, stop)
        out.append((start, stop, Xb, *factor.whiten(Xb, keep_cross=True)))
    return out


def _pack_grad(g_theta, g_Z, optimize_inducing, extra=()):
    return np.concatenate([g_theta, g_Z.ravel() if optimize_inducing else np.empty(0), *extra])


def svi_parts(likelihood, X, y, factor, mean, Lq, block_rows):
    """The data terms of the bound (8) over the rows of X, summed block by block in row order:
    (Σ e, g_theta, g_Z, Σ AᵀG_A, Σ ∂/∂μ, Σ ∂/∂L_q) before the K_uu part and the KL
    (:func:`svi_finish`).  Sums over rows only, so shards of the data add them (SEP §2.3)."""
    parts = None
    g_theta = np.zeros(len(factor.kernel.theta))
    g_Z = np.zeros_like(factor.Z)
    for start, stop in block_ranges(len(y), block_rows):
        Xb = as_block(X, start, stop)
        A, s = factor.whiten(Xb)
        e, G_A, e_v, AtG, g_m, G_L = svi_block(likelihood, y[start:stop], A, s, mean, Lq)
        gt, gz = factor.block_gradient(Xb, G_A, e_v)
        g_theta += gt
        g_Z += gz
        parts = add_parts(parts, (e, AtG, g_m, G_L))
    e, AtG, g_m, G_L = parts
    return e, g_theta, g_Z, AtG, g_m, G_L


class SVIState(VariationalState):
    """SVI: variational parameters (μ, L_q) beside θ and Z, all moved by one optimiser."""

    name = "SVI"
    _model = ("kernel", "Z", "factor", "mean", "Lq", "log_z")

    def __init__(self, kernel, Z, n, jitter, optimize_inducing):
        self.kernel, self.Z, self.jitter = kernel, np.array(Z, dtype=np.float64), jitter
        self.optimize_inducing = optimize_inducing
        self.n = n
        m = self.Z.shape[0]
        self.mean, self.Lq = np.zeros(m), np.eye(m)
        self.factor = InducingFactor(kernel, self.Z, jitter)
        self.log_z = np.nan
        self.reverted = 0
        self._tril = np.tril_indices(m)

    @property
    def q(self):
        return Posterior(mean=self.mean, cov=self.Lq @ self.Lq.T)

    def params(self):
        return _pack(self.kernel, self.Z, self.optimize_inducing, (self.mean, self.Lq[self._tril]))

    def bounds(self):
        return _bounds(self.kernel, self.Z, self.optimize_inducing,
                       len(self.mean) + len(self._tril[0]))

    def _set(self, p):
        kernel, Z, rest = _unpack_kernel(self, p)
        m = len(self.mean)
        Lq = np.zeros((m, m))
        Lq[self._tril] = rest[m:]
        factor = InducingFactor(kernel, Z, self.jitter)
        self.kernel, self.Z, self.factor, self.mean, self.Lq = kernel, Z, factor, rest[:m].copy(), Lq

    def objective(self, likelihood, X, y, p, block_rows, scale=1.0):
        """The bound (8) and its gradient at the packed parameters p (which become the state's).

        X is the rows (any row-sliceable array, with labels y), or rows on a distributed engine
        (an object with ``svi_parts``, :class:`gpc.sparse._distributed.ShardedRows`)."""
        before = self.snapshot()
        try:
            self._set(p)
            # KL = ½ (tr S + μᵀμ - m - log|S|) with log|S| = 2 Σ log|L_q,ii| is +inf, so the bound
            # (8) is -inf, where a diagonal entry of L_q is 0: L-BFGS-B's first step along the
            # diagonal alone (balanced labels on equal rows) lands there exactly.  Such a point,
            # and one where 1/L_q,ii (the KL's gradient, -L_q + diag(1/L_q,ii)) overflows, is a
            # failed evaluation that L-BFGS-B backtracks from and Adadelta steps back from.
            if not np.all(np.abs(np.diag(self.Lq)) > 1.0 / np.finfo(np.float64).max):
                raise DivergenceError("SVI: L_q is singular at this point (a diagonal entry "
                                      "is 0, log|S| = -inf)", method="svi")
            if hasattr(X, "svi_parts"):   # rows on a distributed engine (gpc.sparse._distributed)
                parts = X.svi_parts(self.factor, self.mean, self.Lq)
            else:
                parts = svi_parts(likelihood, X, y, self.factor, self.mean, self.Lq, block_rows)
        except (NotPositiveDefiniteError, NumericalError) as exc:
            self.restore(before)
            self.reverted += 1
            self.failure = exc
            return -np.inf, np.zeros_like(p)
        value, g_theta, g_Z, g_m, G_L = svi_finish(self.factor, self.mean, self.Lq, parts, scale)
        self.log_z = value
        return value, _pack_grad(g_theta, g_Z, self.optimize_inducing, (g_m, G_L[self._tril]))
