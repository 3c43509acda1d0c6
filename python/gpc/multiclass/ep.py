"""Expectation propagation for the robust multi-class GP classifier (RMGPC paper, §3).

The model (RMGPC eq. (2)-(5)): l latent functions f_k ~ GP(0, K_k), labels
yᵢ = argmax_k f_k(xᵢ) unless the outlier indicator zᵢ = 1, in which case yᵢ is uniform; zᵢ ~ Bern(ρ),
ρ ~ Beta(a₀, b₀).  The posterior is approximated by the factorised Q of eq. (13),

    Q(f, z, ρ) = Bern(z | p) Beta(ρ | a, b) Π_k N(f_k | μ_k, Σ_k).

Sites, in natural parameters (the paper's ψ̃ᵢₖ of eq. (14) and ψ̃ᵢ of eq. (15)):

* ψ̃ᵢₖ (k ≠ yᵢ): exp(−½ τᵢₖ f_k(xᵢ)² + ηᵢₖ f_k(xᵢ)) · exp(−½ τᵗᵢₖ f_yᵢ(xᵢ)² + ηᵗᵢₖ f_yᵢ(xᵢ)) times a
  Bernoulli factor in zᵢ of log-odds λᵢₖ; the paper's ν̃ᵢₖ = 1/τᵢₖ, μ̃ᵢₖ = ηᵢₖ/τᵢₖ, p̃ᵢₖ = σ(λᵢₖ).
* ψ̃ᵢ: ρ^{αᵢ} (1 − ρ)^{βᵢ} (αᵢ = ãᵢ − 1, βᵢ = b̃ᵢ − 1) times a Bernoulli factor of log-odds λᵢ.

Class k's Gaussian collects, at xᵢ, Λᵏᵢ = τᵢₖ when k ≠ yᵢ and Σ_{k'≠yᵢ} τᵗᵢₖ' when k = yᵢ (the
paper's Λᵏ of eq. (17)), and likewise vᵏ from the η.  The ψ̃ᵢₖ are refined in parallel, then the ψ̃ᵢ
sequentially, as RMGPC §3.2 prescribes.  Sites may have negative precision (the outlier mixture
can widen a marginal), so each class posterior is held as Σ_k = L (I + Lᵀ Λ L)⁻¹ Lᵀ with
K_k = L Lᵀ: the middle matrix is positive definite exactly when Σ_k is, and a failed Cholesky of it
halves the damping (recorded in ``damping_history``).

``robust=False`` is SMGPC (b₀ → ∞, RMGPC §4): ρ = 0, no z and no Beta; the sites are then plain
Gaussians.
"""

import copy
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import betaln, expit, log_ndtr

from .._linalg import cholesky_lower
from .._multiclass import refine_outlier_prior
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError

LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


@dataclass
class ClassPosterior:
    """N(f_k | μ_k, Σ_k) for one class, with Σ_k = W Wᵀ, and what prediction and gradients need.

    ``b`` is K_k⁻¹ μ_k (= vᵏ − Λᵏ μ_k) and ``site_precision`` the diagonal Λᵏ.
    """
    mean: np.ndarray
    W: np.ndarray
    site_precision: np.ndarray
    site_location: np.ndarray
    b: np.ndarray
    logdet: float           # log |I + Λᵏ K_k| = log |M_k| of RMGPC eq. (16)

    @property
    def var(self):
        return np.einsum("ij,ij->i", self.W, self.W)

    def gradient_matrix(self):
        """M with ∂ log Z/∂θ = Σ_ij M_ij ∂(K_k)_ij/∂θ: RMGPC eq. (18) written as
        ½ (b bᵀ − (Λ − Λ Σ Λ)), since M_k⁻¹ vᵏ = K_k⁻¹ μ_k = b and M_k⁻¹ Λ = Λ − Λ Σ_k Λ (Woodbury)."""
        LW = self.site_precision[:, None] * self.W
        return 0.5 * (np.outer(self.b, self.b) - np.diag(self.site_precision) + LW @ LW.T)


@dataclass
class MultiClassEPResult:
    """The converged Q of RMGPC eq. (13) and the evidence (16).

    Attributes
    ----------
    classes : list
        One Gaussian posterior per class latent.
    outlier_probability : ndarray
        p of RMGPC eq. (21), one per training point (zeros when not robust).
    a, b : float
        The Beta posterior of the outlier rate ρ (RMGPC eq. (20)).
    log_evidence : float
        RMGPC eq. (16).
    n_iter, converged : int, bool
        Iterations run, and whether the tolerance was met.
    damping, damping_history : float, list
        The final damping, and (iteration, new damping) at each halving.
    robust : bool
        False for SMGPC (no outlier indicators).
    sites : object
        The converged site parameters, for checks and warm starts.
    """
    classes: list
    outlier_probability: np.ndarray   # p of eq. (21), one per training point (zeros when not robust)
    a: float
    b: float
    log_evidence: float
    n_iter: int
    converged: bool
    damping: float
    damping_history: list = field(default_factory=list)   # (iteration, new damping) at each halving
    robust: bool = True
    sites: object = None      # the converged site parameters (_Sites), for checks and warm starts

    @property
    def rho_mean(self):
        """ρ̄ = a / (a + b) of RMGPC eq. (20); 0 without outliers."""
        return self.a / (self.a + self.b) if self.robust else 0.0

    def gradient_matrices(self):
        return [c.gradient_matrix() for c in self.classes]


def _log_gauss_site_mass(tau, eta, m, v):
    """log ∫ exp(−½ τ f² + η f) N(f | m, v) df (needs 1 + τ v > 0)."""
    s = 1.0 + tau * v
    return -0.5 * np.log(s) + (m + eta * v) ** 2 / (2.0 * v * s) - m * m / (2.0 * v)


def _class_posterior(L, tau, eta):
    """Σ = L (I + Lᵀ Λ L)⁻¹ Lᵀ, μ = Σ η; raises NotPositiveDefiniteError when Σ would not be PD."""
    n = L.shape[0]
    C = L.T @ (tau[:, None] * L)
    C.flat[:: n + 1] += 1.0
    try:
        R = np.linalg.cholesky(C)
    except np.linalg.LinAlgError:
        raise NotPositiveDefiniteError("a class covariance would not be positive definite") from None
    W = solve_triangular(R, L.T, lower=True).T          # W = L R⁻ᵀ, Σ = W Wᵀ
    mean = W @ (W.T @ eta)
    return ClassPosterior(mean=mean, W=W, site_precision=tau.copy(), site_location=eta.copy(),
                          b=eta - tau * mean, logdet=2.0 * float(np.sum(np.log(np.diag(R)))))


class _Sites:
    """All site parameters; arrays (n, l) are zero where k = yᵢ."""

    def __init__(self, y, l):
        n = y.shape[0]
        self.y, self.l, self.n = y, l, n
        self.other = np.ones((n, l), dtype=bool)
        self.other[np.arange(n), y] = False
        self.tau_o = np.zeros((n, l))     # on f_k(xᵢ), k ≠ yᵢ
        self.eta_o = np.zeros((n, l))
        self.tau_t = np.zeros((n, l))     # on f_yᵢ(xᵢ), one per k ≠ yᵢ
        self.eta_t = np.zeros((n, l))
        self.lam = np.zeros((n, l))       # log-odds of ψ̃ᵢₖ's Bernoulli factor
        self.lam_i = np.zeros(n)          # log-odds of ψ̃ᵢ's Bernoulli factor
        self.alpha = np.zeros(n)          # ψ̃ᵢ's exponents of ρ and 1 − ρ
        self.beta = np.zeros(n)

    def class_sites(self):
        """(Λ, v) of every class, shape (n, l): eq. (17)'s Λᵏ and eq. (18)'s vᵏ."""
        rows = np.arange(self.n)
        tau, eta = self.tau_o.copy(), self.eta_o.copy()
        tau[rows, self.y] = self.tau_t.sum(axis=1)
        eta[rows, self.y] = self.eta_t.sum(axis=1)
        return tau, eta

    def copy_gaussian(self):
        return self.tau_o.copy(), self.eta_o.copy(), self.tau_t.copy(), self.eta_t.copy(), self.lam.copy()


def _likelihood_moments(m_t, v_t, m_o, v_o, log_p_cav, log_c):
    """Tilted moments of ψᵢₖ Q^{∖ψ̃ᵢₖ} for the pairs (target yᵢ, other k).

    ψᵢₖ = Θ(f_y − f_k)^{1−z} c^{z} with c = l^{−1/(l−1)} (RMGPC eq. (10)).  With s² = v_t + v_o and
    α = (m_t − m_o)/s, Z = p c + (1 − p) Φ(α) for the cavity outlier probability p; then
    ∂ log Z/∂m_t = −∂ log Z/∂m_o = g = w φ(α)/(Φ(α) s), w = (1 − p)Φ(α)/Z, and the second derivative
    is −g (α/s + g) for both.  Returns log Z, g, the second derivative, and the new z log-odds
    log c − log Φ(α) of the site (None when log_p_cav is None, i.e. no outliers).
    """
    s = np.sqrt(v_t + v_o)
    alpha = (m_t - m_o) / s
    log_phi_cdf = log_ndtr(alpha)
    if log_p_cav is None:
        log_z = log_phi_cdf
        w_log = 0.0
    else:
        log_p, log_1mp = log_p_cav
        log_z = np.logaddexp(log_p + log_c, log_1mp + log_phi_cdf)
        w_log = log_1mp + log_phi_cdf - log_z
    mills = np.exp(-0.5 * alpha * alpha - LOG_SQRT_2PI - log_phi_cdf)   # φ(α)/Φ(α)
    g = np.exp(w_log) * mills / s
    d2 = -g * (alpha / s + g)
    lam_new = None if log_p_cav is None else log_c - log_phi_cdf
    return log_z, g, d2, lam_new


def rmgpc_ep(Ks, y, n_classes, a0=1.0, b0=9.0, robust=True, max_iter=500, tol=1e-6, damping=0.5,
             anneal=0.99, anneal_floor=0.05, min_damping=1e-6, init=None, n_threads=1):
    """Run RMGPC's EP (§3) to a fixed point.

    Parameters
    ----------
    Ks : list of l arrays (n, n)
        The class covariances K_k (the same object l times for a shared kernel, RMGPC eq. (22)).
    y : int array (n,)
        Class indices 0 … l−1.
    n_classes : int
        l ≥ 2.
    a0, b0 : float
        Beta prior of the outlier rate ρ (RMGPC eq. (4); the paper suggests a₀ = 1, b₀ = 9).
    robust : bool
        False gives SMGPC (b₀ → ∞): no outlier indicators.
    max_iter, tol : iterations of (parallel ψ̃ᵢₖ, sequential ψ̃ᵢ) and the stopping tolerance on the
        largest change of a marginal mean or variance divided by the damping ε (so that a small ε does
        not fake convergence).
    damping : float
        Initial damping ε (new site = ε · refined + (1 − ε) · old), halved whenever a class covariance
        would stop being positive definite, and multiplied by ``anneal`` after every iteration until it reaches ``anneal_floor``.
    anneal : float, default 0.99
        Factor on the damping after every iteration.
    anneal_floor : float, default 0.05
        The annealing stops at this damping.
    min_damping : float, default 1e-6
        Halving below this raises NotPositiveDefiniteError.
    init : MultiClassEPResult, optional
        Warm start from a previous result on the same labels (the optimiser's previous θ).
    n_threads : int, default 1
        Threads over the l class blocks (each block's Cholesky, triangular solve and products run in
        LAPACK/BLAS with the GIL released; the blocks are independent given the sites).  The result
        does not depend on it.

    Returns
    -------
    MultiClassEPResult
    """
    y = np.asarray(y, dtype=np.intp)
    n, l = y.shape[0], int(n_classes)
    Ls, factors = [], {}
    for K in Ks:                      # a shared kernel is factored once
        key = id(K)
        if key not in factors:
            factors[key] = cholesky_lower(K, name="K")[0]
        Ls.append(factors[key])
    pool = ThreadPoolExecutor(max_workers=int(n_threads)) if n_threads > 1 and l > 1 else None
    try:
        return _run(Ls, y, n, l, a0, b0, robust, max_iter, tol, damping, anneal, anneal_floor,
                    min_damping, init, pool)
    finally:
        if pool is not None:
            pool.shutdown()


def _class_posteriors(Ls, tau, eta, pool):
    """Every class's posterior; in ``pool``'s threads when given (a failure is raised either way)."""
    blocks = range(len(Ls))
    if pool is None:
        return [_class_posterior(Ls[k], tau[:, k], eta[:, k]) for k in blocks]
    return list(pool.map(lambda k: _class_posterior(Ls[k], tau[:, k], eta[:, k]), blocks))


def _run(Ls, y, n, l, a0, b0, robust, max_iter, tol, damping, anneal, anneal_floor, min_damping,
         init, pool):
    """rmgpc_ep's iteration, with the class factors ``Ls`` computed."""
    sites = _Sites(y, l)
    a, b = float(a0), float(b0)
    if init is not None and init.sites is not None and np.array_equal(init.sites.y, y):
        sites = copy.deepcopy(init.sites)
        if robust:
            a, b = a + float(np.sum(sites.alpha)), b + float(np.sum(sites.beta))
    rows = np.arange(n)
    other = sites.other
    log_c = -np.log(l) / (l - 1)
    history, converged = [], False
    tau, eta = sites.class_sites()
    try:
        post = _class_posteriors(Ls, tau, eta, pool)
    except NotPositiveDefiniteError:     # a warm start that does not fit these K: start cold
        sites, a, b = _Sites(y, l), float(a0), float(b0)
        tau, eta = sites.class_sites()
        post = _class_posteriors(Ls, tau, eta, pool)
    means = np.column_stack([p.mean for p in post])
    varis = np.column_stack([p.var for p in post])

    def cavities(means, varis):
        """Cavity moments of every pair (i, k ≠ yᵢ); invalid (non-positive variance) pairs masked."""
        m_y, v_y = means[rows, y][:, None], varis[rows, y][:, None]
        prec_t = 1.0 / v_y - sites.tau_t
        prec_o = 1.0 / varis - sites.tau_o
        ok = other & (prec_t > 0) & (prec_o > 0)
        safe_t = np.where(ok, prec_t, 1.0)
        safe_o = np.where(ok, prec_o, 1.0)
        v_t, v_o = 1.0 / safe_t, 1.0 / safe_o
        m_t = v_t * (m_y / v_y - sites.eta_t)
        m_o = v_o * (means / varis - sites.eta_o)
        return ok, m_t, v_t, m_o, v_o

    def z_log_odds():
        return sites.lam_i + sites.lam.sum(axis=1)

    it = 0
    for it in range(1, max_iter + 1):
        # -- ψ̃ᵢₖ in parallel (RMGPC §3.2) --
        ok, m_t, v_t, m_o, v_o = cavities(means, varis)
        if robust:
            lz_cav = z_log_odds()[:, None] - sites.lam
            log_p_cav = (-np.logaddexp(0.0, -lz_cav), -np.logaddexp(0.0, lz_cav))
        else:
            log_p_cav = None
        _, g, d2, lam_new = _likelihood_moments(m_t, v_t, m_o, v_o, log_p_cav, log_c)
        new_t = v_t + v_t * v_t * d2
        new_o = v_o + v_o * v_o * d2
        ok &= (new_t > 0) & (new_o > 0)
        new_t, new_o = np.where(ok, new_t, 1.0), np.where(ok, new_o, 1.0)
        tau_t = 1.0 / new_t - 1.0 / v_t
        eta_t = (m_t + v_t * g) / new_t - m_t / v_t
        tau_o = 1.0 / new_o - 1.0 / v_o
        eta_o = (m_o - v_o * g) / new_o - m_o / v_o
        old = sites.copy_gaussian()
        while True:
            e = damping
            sites.tau_t = np.where(ok, e * tau_t + (1 - e) * old[2], old[2])
            sites.eta_t = np.where(ok, e * eta_t + (1 - e) * old[3], old[3])
            sites.tau_o = np.where(ok, e * tau_o + (1 - e) * old[0], old[0])
            sites.eta_o = np.where(ok, e * eta_o + (1 - e) * old[1], old[1])
            if robust:
                sites.lam = np.where(ok, e * lam_new + (1 - e) * old[4], old[4])
            tau, eta = sites.class_sites()
            try:
                post = _class_posteriors(Ls, tau, eta, pool)
                break
            except NotPositiveDefiniteError:
                damping *= 0.5
                history.append((it, damping))
                if damping < min_damping:
                    sites.tau_o, sites.eta_o, sites.tau_t, sites.eta_t, sites.lam = old
                    raise NotPositiveDefiniteError(
                        f"EP could not keep the class covariances positive definite even with damping "
                        f"{damping:g}") from None
        # -- ψ̃ᵢ sequentially (standard EP) --
        if robust:
            a, b = _refine_outlier_prior(sites, a, b, damping)
        new_means = np.column_stack([p.mean for p in post])
        new_varis = np.column_stack([p.var for p in post])
        change = max(np.max(np.abs(new_means - means)), np.max(np.abs(new_varis - varis)))
        means, varis = new_means, new_varis
        if change < tol * damping:   # the undamped step, change/ε, is below tol
            converged = True
            break
        # annealing: sites whose tilted distributions are bimodal (likely outliers) can make
        # parallel EP wander; shrinking ε slowly forces the iteration to settle (it changes the
        # path, not the fixed-point conditions, which the tests check)
        damping = max(damping * anneal, min(damping, anneal_floor))
    if not converged:
        warnings.warn(f"RMGPC EP did not converge in {max_iter} iterations", ConvergenceWarning,
                      stacklevel=3)
    log_z = _log_evidence(sites, post, means, varis, a, b, a0, b0, robust, log_c, cavities)
    p_out = expit(z_log_odds()) if robust else np.zeros(n)
    return MultiClassEPResult(classes=post, outlier_probability=p_out, a=a, b=b, log_evidence=log_z,
                              n_iter=it, converged=converged, damping=damping,
                              damping_history=history, robust=robust, sites=sites)


def _refine_outlier_prior(sites, a, b, damping):
    """Sequential EP updates of the ψ̃ᵢ (RMGPC eq. (15)); returns the new (a, b) of Q.

    Cavity Beta(a − αᵢ, b − βᵢ) and Bernoulli of log-odds Σ_k λᵢₖ; the tilted distribution is
    ρ^{z}(1 − ρ)^{1−z} times them.  Its Beta part w₁ Beta(a_c + 1, b_c) + (1 − w₁) Beta(a_c, b_c + 1)
    is projected by matching the sufficient statistics E log ρ and E log(1 − ρ) (RMGPC §3:
    "matching sufficient statistics"; matching E ρ, E ρ² instead leaves the evidence (16) not
    stationary in the sites and its gradient (18) 0.4 % off), by Newton's method; the refined
    Bernoulli factor is exactly p̃ᵢ = a_c/(a_c + b_c).  The loop is sequential by nature and runs in
    the typed ``gpc._multiclass.refine_outlier_prior`` (docs/derivations-rmgpc.md).
    """
    return refine_outlier_prior(sites.lam.sum(axis=1), sites.alpha, sites.beta, sites.lam_i,
                                float(a), float(b), float(damping))


def _log_evidence(sites, post, means, varis, a, b, a0, b0, robust, log_c, cavities):
    """log Z of RMGPC eq. (16)-(17), from the converged sites.

    log Z = Σ_k [½ vᵏᵀ μ_k − ½ log|I + Λᵏ K_k|] + Σ log s̃ᵢₖ + Σ log s̃ᵢ
            + log B(a, b) − log B(a₀, b₀) + Σᵢ log Dᵢ,
    with Dᵢ = Π σ(λ) + Π σ(−λ) over ψ̃ᵢ's and the ψ̃ᵢₖ's Bernoulli factors, and each log s̃ the log
    tilted mass minus the log mass of the site times its cavity (so that Z is the integral of the
    product of the scaled sites).  The paper's C_k − Σ τ terms are the same Gaussian masses written
    with unnormalised site Gaussians.
    """
    y, other = sites.y, sites.other
    log_z = sum(0.5 * float(p.site_location @ p.mean) - 0.5 * p.logdet for p in post)
    ok, m_t, v_t, m_o, v_o = cavities(means, varis)
    if not np.all(ok == other):
        raise NotPositiveDefiniteError("a cavity variance is not positive at the EP fixed point")
    if robust:
        lz_all = sites.lam_i + sites.lam.sum(axis=1)
        lz_cav = lz_all[:, None] - sites.lam
        log_p_cav = (-np.logaddexp(0.0, -lz_cav), -np.logaddexp(0.0, lz_cav))
    else:
        log_p_cav = None
    log_tilted = _likelihood_moments(m_t, v_t, m_o, v_o, log_p_cav, log_c)[0]
    log_site = (_log_gauss_site_mass(sites.tau_t, sites.eta_t, m_t, v_t)
                + _log_gauss_site_mass(sites.tau_o, sites.eta_o, m_o, v_o))
    if robust:
        # Bernoulli site times Bernoulli cavity: σ(λ)p + σ(−λ)(1 − p), in logs
        log_site = log_site + np.logaddexp(-np.logaddexp(0, -sites.lam) + log_p_cav[0],
                                           -np.logaddexp(0, sites.lam) + log_p_cav[1])
    log_z += float(np.sum(np.where(other, log_tilted - log_site, 0.0)))
    if robust:
        log_z += betaln(a, b) - betaln(a0, b0)
        # log Dᵢ: the Bernoulli factors' product summed over zᵢ (no factor at k = yᵢ)
        log_s1 = np.sum(np.where(other, -np.logaddexp(0, -sites.lam), 0.0), axis=1)
        log_s0 = np.sum(np.where(other, -np.logaddexp(0, sites.lam), 0.0), axis=1)
        log_d = np.logaddexp(log_s1 - np.logaddexp(0, -sites.lam_i), log_s0 - np.logaddexp(0, sites.lam_i))
        log_z += float(np.sum(log_d))
        lam_cav_i = sites.lam.sum(axis=1)
        lp1, lp0 = -np.logaddexp(0, -lam_cav_i), -np.logaddexp(0, lam_cav_i)
        a_c, b_c = a - sites.alpha, b - sites.beta
        rbar = a_c / (a_c + b_c)
        log_zi = np.logaddexp(lp1 + np.log(rbar), lp0 + np.log1p(-rbar))
        log_site_i = (betaln(a, b) - betaln(a_c, b_c)
                      + np.logaddexp(-np.logaddexp(0, -sites.lam_i) + lp1,
                                     -np.logaddexp(0, sites.lam_i) + lp0))
        log_z += float(np.sum(log_zi - log_site_i))
    return log_z
