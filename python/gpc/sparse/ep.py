"""Scalable EP with inducing points: the site algebra in u-space (SEP §2.2-§2.3).

Model (SEP eq. (1)): q(u) ∝ p(u | Z) Π_i φ̃_i(u) with rank-one sites, SEP eq. (2),

    φ̃_i(u) ∝ exp(-½ τ_i (v_iᵀu)² + ν_i v_iᵀu),    v_i = K_uu⁻¹ k_i,

approximating φ_i(u) = ∫ p(y_i | f) N(f | v_iᵀu, s_i) df (Φ(y_i v_iᵀu / √(1 + s_i)) for probit).
SEP's (ν̃_i, μ̃_i) are our (τ_i, ν_i).  Per datum only the two scalars are kept.

Everything is computed whitened: u = L w with K_uu = L Lᵀ, so p(w) = N(0, I), v_iᵀu = a_iᵀw with
a_i = L⁻¹ k_i, and q(w) ∝ exp(-½ wᵀPw + hᵀw) with the natural parameters

    P = I + Σ_i τ_i a_i a_iᵀ,    h = Σ_i ν_i a_i

(the u-space sums S2 = Σ τ_i v_i v_iᵀ = L⁻ᵀ(P - I)L⁻¹ and S1 = L⁻ᵀh that q needs, seen through
the current factor).  q is held by the Cholesky factor of P ⪰ I alone (never K_uu⁻¹, never P⁻¹):
refining a block of sites adds Aᵀ diag(Δτ) A and Aᵀ Δν to (P, h), an O(b m²) product, and a step
of θ or Z from L to L' keeps the sites (SEP §2.3: q is "reconstructed") by
:func:`transform_natural`, P' = I + Mᵀ(P - I)M with M = L⁻¹L', O(m³).

The functions below are pure: a block of rows, the posterior q, the factor of K_uu and the rows'
sites in; new sites, their sums, and the block's log Z and gradient parts out (sums taken in row
order), so that a distributed engine can call them per shard and add the parts.
"""

from dataclasses import dataclass

import numpy as np
from scipy.linalg import blas, lapack

from ..exceptions import NotPositiveDefiniteError


@dataclass
class Posterior:
    """q(w) = N(mean, cov) held by its covariance (SVI's q(w) = N(μ, L_q L_qᵀ)).

    Attributes
    ----------
    mean : (m,) the mean of w
    cov : (m, m) its covariance
    """

    mean: np.ndarray
    cov: np.ndarray

    def marginals(self, A):
        """Mean and variance of a_iᵀw for the rows a_i of A."""
        return A @ self.mean, np.einsum("ij,ij->i", A @ self.cov, A)


class NaturalPosterior:
    """q(w) ∝ exp(-½ wᵀPw + hᵀw) from its natural parameters, held by P = R Rᵀ (R lower).

    Raises NotPositiveDefiniteError when P (negative sites) has no Cholesky factor or the
    parameters are not finite.

    Parameters
    ----------
    P : (m, m) symmetric precision I + Σ τ_i a_i a_iᵀ
    h : (m,) linear natural parameter Σ ν_i a_i
    """

    def __init__(self, P, h):
        if not (np.all(np.isfinite(P)) and np.all(np.isfinite(h))):
            raise NotPositiveDefiniteError("the site sums are not finite")
        R, info = lapack.dpotrf(P, lower=True, clean=True)
        if info != 0:
            raise NotPositiveDefiniteError("q(u)'s precision I + Σ τ_i a_i a_iᵀ is not positive "
                                           "definite")
        self.P, self.h, self.R = P, h, R
        self.mean, _ = lapack.dpotrs(R, h, lower=True)
        self.logdet = 2.0 * float(np.sum(np.log(np.diag(R))))

    def solve_rows(self, A):
        """B = R⁻¹Aᵀ (m x b), so that |B[:, i]|² = a_iᵀ P⁻¹ a_i."""
        return blas.dtrsm(1.0, self.R, A.T, lower=1)

    def marginals(self, A):
        """Mean and variance of a_iᵀw for the rows a_i of A (one triangular solve)."""
        B = self.solve_rows(A)
        return A @ self.mean, np.einsum("ij,ij->j", B, B)

    def moments(self, A):
        """(marginal means, variances, A Σ_w) for the rows of A: two triangular solves."""
        B = self.solve_rows(A)
        return A @ self.mean, np.einsum("ij,ij->j", B, B), blas.dtrsm(1.0, self.R, B, lower=1,
                                                                       trans_a=1).T

    @property
    def cov(self):
        """Σ_w = P⁻¹ (formed on demand; training never needs it)."""
        C, _ = lapack.dpotri(self.R, lower=True)
        return np.tril(C) + np.tril(C, -1).T

    def log_normaliser_ratio(self):
        """g(θ) - g(θ_prior) of SEP eq. (3): ½ hᵀ P⁻¹ h - ½ log|P| (in w, where g(θ_prior) is that
        of N(0, I); the whitening's Jacobian cancels in the difference)."""
        return 0.5 * float(self.h @ self.mean) - 0.5 * self.logdet


def whitened_sums(A, tau, nu):
    """(Aᵀ diag(τ) A, Aᵀ ν): a block's share of (P - I, h)."""
    return (A.T * tau) @ A, A.T @ nu


def transform_natural(P, h, L_old, L_new):
    """(P', h') for the same sites seen from a new factor L' of K_uu (after a θ or Z step).

    The sites are fixed in u-space (S2 = L⁻ᵀ(P - I)L⁻¹, S1 = L⁻ᵀh), so with M = L⁻¹L'
    (lower triangular) P' = I + Mᵀ(P - I)M and h' = Mᵀh: one triangular solve and two
    triangular products, O(m³), no inverse.
    """
    m = P.shape[0]
    M = blas.dtrsm(1.0, L_old, L_new, lower=1)
    S = P.copy()
    S.flat[:: m + 1] -= 1.0
    S = blas.dtrmm(1.0, M, blas.dtrmm(1.0, M, S, side=1, lower=1), side=0, lower=1, trans_a=1)
    S = 0.5 * (S + S.T)
    S.flat[:: m + 1] += 1.0
    return S, M.T @ h


def cavity(mean, var, tau, nu):
    """Cavity of x_i = a_iᵀw: q / φ̃_i; returns (mean, var, ok) with ok where its precision is > 0."""
    prec = 1.0 / var - tau
    ok = prec > 0
    safe = np.where(ok, prec, 1.0)
    cvar = 1.0 / safe
    cmean = cvar * (mean / var - nu)
    return cmean, cvar, ok


def matched_site(likelihood, y, cmean, cvar, s):
    """Moment matching for φ_i (SEP eq. (1)): the f-integral widens the cavity by s_i.

    With Z_i = ∫ p(y|f) N(f | c, v + s) df, d1 = ∂ log Z_i/∂c and d2 = ∂² log Z_i/∂c², the new
    site is τ = -d2 / (1 + d2 v), ν = (d1 - c d2) / (1 + d2 v) (R&W eq. (3.58)-(3.59) in
    derivative form).  Also returns g_s = ∂ log Z_i/∂s = ½ (d1² + d2), the derivative the
    evidence gradient needs.
    """
    vf = cvar + s
    log_z, tmean, tvar = likelihood.tilted_moments(y, cmean, vf)
    d1 = (tmean - cmean) / vf
    d2 = (tvar - vf) / vf ** 2
    denom = 1.0 + d2 * cvar
    return log_z, -d2 / denom, (d1 - cmean * d2) / denom, 0.5 * (d1 * d1 + d2)


@dataclass
class SiteUpdate:
    """What :func:`update_sites` returns for a block of rows."""

    tau: np.ndarray          # the rows' new (damped) site precisions
    nu: np.ndarray           # and locations
    dP: np.ndarray           # Aᵀ diag(τ_new - τ_old) A (m x m): the change of P
    dh: np.ndarray           # Aᵀ (ν_new - ν_old): the change of h
    n_skipped: int           # rows whose cavity had no positive precision (left unchanged)


def update_sites(likelihood, y, A, s, q, tau, nu, damping, sums="change"):
    """Parallel damped EP update of one block's sites (SEP §2.2).

    Parameters
    ----------
    likelihood : gpc.likelihoods.Likelihood
    y : (b,) labels ±1
    A, s : whitened rows a_i and FITC variances s_i (:meth:`InducingFactor.whiten`)
    q : NaturalPosterior
    tau, nu : (b,) the rows' current sites
    damping : float in (0, 1]; new = damping · matched + (1 - damping) · old
    sums : "change" or "new"
        What ``dP, dh`` hold: the change the block's update makes to q's natural parameters
        (a minibatch step adds it to q), or the block's share of (P - I, h) for its new sites with
        the current factor (a batch pass sums these into q afresh: :func:`_passes.site_pass`).
    """
    mean, var = q.marginals(A)
    cmean, cvar, ok = cavity(mean, var, tau, nu)
    _, t_new, n_new, _ = matched_site(likelihood, y, cmean, cvar, s)
    good = ok & np.isfinite(t_new) & np.isfinite(n_new)
    t_new = np.where(good, damping * t_new + (1.0 - damping) * tau, tau)
    n_new = np.where(good, damping * n_new + (1.0 - damping) * nu, nu)
    if sums == "new":
        dP, dh = whitened_sums(A, t_new, n_new)
    else:
        dP, dh = whitened_sums(A, t_new - tau, n_new - nu)
    return SiteUpdate(tau=t_new, nu=n_new, dP=dP, dh=dh, n_skipped=int(np.count_nonzero(~good)))


@dataclass
class BlockEvidence:
    """A block's parts of log Z_q (SEP eq. (3)) and of its gradient."""

    log_z: float          # Σ_b log Z̃_i
    G_A: np.ndarray       # ∂F/∂A_b (b x m), for InducingFactor.block_gradient
    g_s: np.ndarray       # ∂F/∂s_b
    AtG: np.ndarray       # A_bᵀ G_A (m x m), summed over blocks for InducingFactor.uu_gradient
    n_bad: int            # rows with a non-positive cavity (their terms are left out)


def block_evidence(likelihood, y, A, s, q, tau, nu, gradient=True):
    """Σ_b log Z̃_i of SEP eq. (3) and the block's gradient parts.

    log Z̃_i = log Z_i + g(θ^{\\i}) - g(θ) = log Z_i + ½ log(1 + τ_i v_c) + ½ c²/v_c - ½ μ²/σ²
    for the cavity N(c, v_c) and the marginal N(μ, σ²) of a_iᵀw.

    Gradient.  With Q = A Aᵀ (the Nyström matrix K_fu K_uu⁻¹ K_uf) and sites held fixed, log Z_q is
    exact EP's evidence for the prior N(0, Q) and the likelihoods φ_i, whose noise s_i enters
    through Z_i only.  At an EP fixed point the cavity terms are stationary, so (R&W eq. (5.27))

        dF = tr(M_Q dQ) + Σ_i g_s,i ds_i,   M_Q = ½ (β βᵀ - (Q + T⁻¹)⁻¹),   β = ν - T μ,

    and by Woodbury (Q + T⁻¹)⁻¹ A = T A Σ_w and Aᵀβ = μ_w.  With s_i = k_ii - |a_i|²,

        G_A = ∂F/∂A = β μ_wᵀ - T A Σ_w - 2 diag(g_s) A,

    O(b m²) per block (A Σ_w by two triangular solves with P's factor).  This is SEP eq. (4) at a
    fixed point; during training it is used before convergence, as SEP §2.3 does with eq. (4)
    ("inner" updates).
    """
    if gradient:
        mean, var, A_cov = q.moments(A)
    else:
        mean, var = q.marginals(A)
    cmean, cvar, ok = cavity(mean, var, tau, nu)
    log_z, _, _, g_s = matched_site(likelihood, y, cmean, cvar, s)
    terms = (log_z + 0.5 * np.log1p(tau * cvar) + 0.5 * cmean ** 2 / cvar
             - 0.5 * mean ** 2 / var)
    n_bad = int(np.count_nonzero(~ok))
    total = float(np.sum(terms[ok])) if n_bad else float(np.sum(terms))
    if not gradient:
        return BlockEvidence(total, None, None, None, n_bad)
    g_s = np.where(ok, g_s, 0.0)
    beta = nu - tau * mean
    G_A = np.outer(beta, q.mean) - tau[:, None] * A_cov - 2.0 * g_s[:, None] * A
    return BlockEvidence(total, G_A, g_s, A.T @ G_A, n_bad)


def posterior_predict(A, s, q):
    """Latent predictive mean and variance at rows with whitened A and FITC variance s."""
    mean, var = q.marginals(A)
    return mean, var + s
