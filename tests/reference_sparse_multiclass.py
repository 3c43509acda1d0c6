"""Sparse multi-class EP (RMGPC's model on m inducing points per class): a slow NumPy reference.

The maths is docs/derivations-sparse-multiclass.md ("derivation §N" below is its section N).
Everything here is dense, per class, in plain loops: q(w_k) is rebuilt from all its sites after
every site update, inverses are explicit, and quadrature replaces nothing that has a closed form.
It is a specification to test a compiled engine against, not an engine.

Model (RMGPC eq. (2)-(5) with the FITC conditional of SEP eq. (1) per class): u_k = f_k(Z_k) ~
N(0, K_uu^k) = L_k N(0, I) (w_k whitened), f_k(x_i) | u_k ~ N(a_ikᵀ w_k, s_ik) with a_ik =
L_k⁻¹ k_k(Z_k, x_i) and s_ik = κ_k(x_i) − |a_ik|²; per point i and class k ≠ yᵢ the factor

    φ_ik(w, z_i) = c^{z_i} Φ((a_iyᵀw_y − a_ikᵀw_k) / √(s_iy + s_ik))^{1 − z_i},   c = C^{−1/(C−1)}

(RMGPC eq. (10)'s ψ_ik with the FITC noise integrated out pair by pair); zᵢ ~ Bern(ρ) with either
ρ ~ Beta(a₀, b₀) (RMGPC eq. (3)-(4), ``noise="beta"``) or ρ = Cε/(C − 1) fixed (``noise="fixed"``,
the likelihood (1 − ε)pᵢ + ε/(C − 1)(1 − pᵢ) of the scalable multi-class EP paper).

Sites (RMGPC eq. (14)-(15) in u-space): ψ̃_ik = exp(−½ τᵗ (a_iyᵀw_y)² + ηᵗ a_iyᵀw_y) ·
exp(−½ τᵒ (a_ikᵀw_k)² + ηᵒ a_ikᵀw_k) · σ(λ_ik)^z σ(−λ_ik)^{1−z} (times s̃_ik), and ψ̃_i =
ρ^{αᵢ}(1 − ρ)^{βᵢ} σ(λᵢ)^z σ(−λᵢ)^{1−z} (times s̃ᵢ) for the Beta treatment; with ρ fixed ψᵢ is
itself a Bernoulli factor and is kept exactly (λᵢ = logit ρ).  q(w_k) ∝ N(w_k | 0, I) Π sites,
natural parameters P_k = I + Σ_r Λ_r a_r a_rᵀ, h_k = Σ_r v_r a_r over the rows r of class k.
"""

from dataclasses import dataclass, field

import numpy as np
from scipy.integrate import quad
from scipy.special import betaln, digamma, expit, log_ndtr, ndtr, polygamma

LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


# -- kernel -------------------------------------------------------------------------------------------

class SEKernel:
    """k(x, z) = c · exp(−½ Σ_d (x_d − z_d)²/ℓ_d²), θ = (log c, log ℓ_1, …, log ℓ_D) (ARD).

    Its derivatives are written out (no gpc.kernels), so that the reference's gradient does not
    lean on the code it checks.
    """

    def __init__(self, theta):
        self.theta = np.array(theta, dtype=float)

    @property
    def c(self):
        return float(np.exp(self.theta[0]))

    @property
    def ls(self):
        return np.exp(self.theta[1:])

    def with_theta(self, theta):
        return SEKernel(theta)

    def __call__(self, X, Z):
        D = (X[:, None, :] - Z[None, :, :]) / self.ls
        return self.c * np.exp(-0.5 * np.sum(D * D, axis=2))

    def diag(self, X):
        return np.full(X.shape[0], self.c)

    def d_theta(self, X, Z):
        """∂K(X, Z)/∂θ_p, shape (p, n_X, n_Z): K itself for log c, K (x_d − z_d)²/ℓ_d² for log ℓ_d."""
        K = self(X, Z)
        D2 = ((X[:, None, :] - Z[None, :, :]) / self.ls) ** 2
        return np.concatenate([K[None], np.moveaxis(K[:, :, None] * D2, 2, 0)])

    def d_diag_theta(self, X):
        """∂κ(x_i)/∂θ_p, shape (p, n): c for log c, 0 for the length-scales."""
        out = np.zeros((self.theta.size, X.shape[0]))
        out[0] = self.c
        return out

    def d_second(self, X, Z):
        """∂K(x_i, z_j)/∂z_jd, shape (n_X, n_Z, D): K (x_id − z_jd)/ℓ_d²."""
        return self(X, Z)[:, :, None] * (X[:, None, :] - Z[None, :, :]) / self.ls ** 2


# -- geometry of one class ------------------------------------------------------------------------------

@dataclass
class ClassGeometry:
    """K_uu = L Lᵀ (plus ``jitter`` I, a constant), the whitened rows A (n × m, rows a_i = L⁻¹k_i)
    and the FITC variances s_i = κ_i − |a_i|² (clipped at 0: rounding), SEP eq. (1)-(2)."""
    kernel: SEKernel
    Z: np.ndarray
    Kuu: np.ndarray
    L: np.ndarray
    Kxu: np.ndarray
    A: np.ndarray
    s: np.ndarray
    kappa: np.ndarray

    @classmethod
    def build(cls, kernel, Z, X, jitter=0.0):
        Z = np.array(Z, dtype=float)
        Kuu = kernel(Z, Z) + jitter * np.eye(len(Z))
        L = np.linalg.cholesky(Kuu)
        Kxu = kernel(X, Z)
        A = np.linalg.solve(L, Kxu.T).T
        kappa = kernel.diag(X)
        s = np.maximum(kappa - np.sum(A * A, axis=1), 0.0)
        return cls(kernel, Z, Kuu, L, Kxu, A, s, kappa)

    def whiten(self, X):
        """(A_*, s_*) of new rows."""
        A = np.linalg.solve(self.L, self.kernel(X, self.Z).T).T
        return A, np.maximum(self.kernel.diag(X) - np.sum(A * A, axis=1), 0.0)


# -- sites and q ------------------------------------------------------------------------------------------

@dataclass
class Sites:
    """All site parameters; (n, C) arrays are zero where k = yᵢ (derivation §2)."""
    tau_t: np.ndarray      # on a_iyᵀw_y, from the pair (i, k)
    eta_t: np.ndarray
    tau_o: np.ndarray      # on a_ikᵀw_k
    eta_o: np.ndarray
    lam: np.ndarray        # log-odds of ψ̃_ik's Bernoulli factor
    lam_i: np.ndarray      # log-odds of ψ̃_i (logit ρ, fixed, in the fixed-ε treatment)
    alpha: np.ndarray      # ψ̃_i's exponents of ρ and 1 − ρ (Beta treatment)
    beta: np.ndarray

    @classmethod
    def zeros(cls, n, C):
        z2, z1 = (lambda: np.zeros((n, C))), (lambda: np.zeros(n))
        return cls(z2(), z2(), z2(), z2(), z2(), z1(), z1(), z1())

    def copy(self):
        return Sites(*(np.array(getattr(self, f)) for f in self.__dataclass_fields__))

    def row_sites(self, y, k):
        """(Λ, v) of class k's n rows: τᵒ_ik where k ≠ yᵢ, Σ_j τᵗ_ij where k = yᵢ (RMGPC eq. (17))."""
        own = y == k
        tau = np.where(own, self.tau_t.sum(axis=1), self.tau_o[:, k])
        eta = np.where(own, self.eta_t.sum(axis=1), self.eta_o[:, k])
        return tau, eta


@dataclass
class ClassQ:
    """q(w_k) = N(mean, cov) from its natural parameters P = I + Aᵀ diag(Λ) A, h = Aᵀ v."""
    P: np.ndarray
    h: np.ndarray
    cov: np.ndarray
    mean: np.ndarray

    @classmethod
    def from_sites(cls, A, tau, eta):
        P = np.eye(A.shape[1]) + A.T @ (tau[:, None] * A)
        P = 0.5 * (P + P.T)
        h = A.T @ eta
        np.linalg.cholesky(P)          # raises LinAlgError when q is not a Gaussian
        cov = np.linalg.inv(P)
        cov = 0.5 * (cov + cov.T)
        return cls(P, h, cov, cov @ h)

    def marginal(self, a):
        """Mean and variance of aᵀw."""
        return float(a @ self.mean), float(a @ self.cov @ a)


# -- the pair factor's tilted moments ---------------------------------------------------------------------

def pair_moments(m_t, v_t, m_o, v_o, s_sum, log_p, log_1mp, log_c):
    """Tilted moments of [p c + (1 − p) Φ((t_y − t_k)/√s_sum)] N(t_y|m_t,v_t) N(t_k|m_o,v_o).

    Derivation §4: with S² = v_t + v_o + s_sum and α = (m_t − m_o)/S,
    Z = p c + (1 − p) Φ(α); g = ∂ log Z/∂m_t = −∂ log Z/∂m_o = w φ(α)/(Φ(α) S), w = (1 − p)Φ(α)/Z;
    d2 = ∂² log Z/∂m_t² = −g (α/S + g); g_s = ∂ log Z/∂S² = −g α/(2S) = ½ (g² + d2); the refined
    z-site has log-odds log c − log Φ(α) (RMGPC's rule with the FITC variances added to S², as
    derivations-rmgpc.md "ψ̃ᵢₖ: the tilted distribution" for s_sum = 0).  ``log_p`` None: no outliers.
    Returns (log Z, g, d2, g_s, λ_new).
    """
    S = np.sqrt(v_t + v_o + s_sum)
    alpha = (m_t - m_o) / S
    log_cdf = float(log_ndtr(alpha))
    if log_p is None:
        log_z, log_w = log_cdf, 0.0
    else:
        log_z = float(np.logaddexp(log_p + log_c, log_1mp + log_cdf))
        log_w = log_1mp + log_cdf - log_z
    g = np.exp(log_w - 0.5 * alpha * alpha - LOG_SQRT_2PI - log_cdf) / S
    d2 = -g * (alpha / S + g)
    g_s = -g * alpha / (2.0 * S)
    return log_z, g, d2, g_s, log_c - log_cdf


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


# -- the Beta part (RMGPC's ψ̃ᵢ) ---------------------------------------------------------------------------

def beta_projection(a_c, b_c, w1, iters=30):
    """(a, b) with E log ρ, E log(1 − ρ) equal to those of w₁ Beta(a_c + 1, b_c) + (1 − w₁) Beta(a_c, b_c + 1)
    (derivations-rmgpc.md "ψ̃ᵢ"): Newton's method on ψ(a) − ψ(a + b) = t₁, ψ(b) − ψ(a + b) = t₂."""
    s = a_c + b_c
    t1 = digamma(a_c) + w1 / a_c - digamma(s + 1.0)
    t2 = digamma(b_c) + (1.0 - w1) / b_c - digamma(s + 1.0)
    m1 = (a_c + w1) / (s + 1.0)                                  # start: the E ρ, E ρ² match
    m2 = (a_c + 1.0) * (a_c + 2.0 * w1) / ((s + 1.0) * (s + 2.0))
    tot = (m1 - m2) / (m2 - m1 * m1)
    a, b = m1 * tot, (1.0 - m1) * tot
    for _ in range(iters):
        r = np.array([digamma(a) - digamma(a + b) - t1, digamma(b) - digamma(a + b) - t2])
        ta, tb, tab = polygamma(1, a), polygamma(1, b), polygamma(1, a + b)
        J = np.array([[ta - tab, -tab], [-tab, tb - tab]])
        da, db = np.linalg.solve(J, r)
        step = 1.0
        while a - step * da <= 0 or b - step * db <= 0:
            step *= 0.5
        a, b = a - step * da, b - step * db
        if abs(da) < 1e-13 * a and abs(db) < 1e-13 * b:
            break
    return a, b


# -- the fit ------------------------------------------------------------------------------------------------

@dataclass
class Fit:
    """A converged (or not) sparse multi-class EP: geometry, sites, q, and the Beta of ρ."""
    X: np.ndarray
    y: np.ndarray
    C: int
    geoms: list
    sites: Sites
    qs: list
    noise: str
    a0: float
    b0: float
    rho: float                 # fixed ρ (fixed-ε treatment), else nan
    a: float = np.nan
    b: float = np.nan
    converged: bool = False
    n_sweeps: int = 0
    mismatch: float = np.inf
    history: list = field(default_factory=list)

    @property
    def log_c(self):
        return -np.log(self.C) / (self.C - 1)

    @property
    def rho_mean(self):
        """ρ̄ of RMGPC eq. (19): a/(a + b), or the fixed ρ."""
        return self.rho if self.noise == "fixed" else self.a / (self.a + self.b)

    @property
    def eps(self):
        """ε of the fixed treatment: ρ = Cε/(C − 1)."""
        return self.rho * (self.C - 1) / self.C

    def rebuild(self, ks=None):
        for k in range(self.C) if ks is None else ks:
            tau, eta = self.sites.row_sites(self.y, k)
            self.qs[k] = ClassQ.from_sites(self.geoms[k].A, tau, eta)

    def marginal(self, i, k):
        return self.qs[k].marginal(self.geoms[k].A[i])

    def z_log_odds(self):
        """Q's log-odds of zᵢ = 1: λᵢ + Σ_k λ_ik."""
        return self.sites.lam_i + self.sites.lam.sum(axis=1)

    def outlier_probability(self):
        """pᵢ = Q(zᵢ = 1), RMGPC eq. (21)."""
        return expit(self.z_log_odds())

    def latent_marginals(self):
        """(n, C) means and variances of f_k(x_i) under q: a_ikᵀμ_w and a_ikᵀΣ_w a_ik + s_ik."""
        n = len(self.y)
        M, V = np.empty((n, self.C)), np.empty((n, self.C))
        for k in range(self.C):
            g, q = self.geoms[k], self.qs[k]
            for i in range(n):
                M[i, k], v = q.marginal(g.A[i])
                V[i, k] = v + g.s[i]
        return M, V

    def pair_cavity(self, i, k):
        """Cavity moments of the pair (i, k): (m_t, v_t, m_o, v_o, z log-odds), or None when a
        cavity variance is not positive (derivation §3)."""
        sites, yi = self.sites, self.y[i]
        m_y, v_y = self.marginal(i, yi)
        m_k, v_k = self.marginal(i, k)
        prec_t = 1.0 / v_y - sites.tau_t[i, k]
        prec_o = 1.0 / v_k - sites.tau_o[i, k]
        if not (prec_t > 0 and prec_o > 0):
            return None
        v_t, v_o = 1.0 / prec_t, 1.0 / prec_o
        m_t = v_t * (m_y / v_y - sites.eta_t[i, k])
        m_o = v_o * (m_k / v_k - sites.eta_o[i, k])
        lz_cav = self.z_log_odds()[i] - sites.lam[i, k]
        return m_t, v_t, m_o, v_o, lz_cav

    def pair_tilted(self, i, k, cav=None):
        """:func:`pair_moments` at the pair's cavity; also returns the cavity."""
        cav = self.pair_cavity(i, k) if cav is None else cav
        m_t, v_t, m_o, v_o, lz_cav = cav
        s_sum = self.geoms[self.y[i]].s[i] + self.geoms[k].s[i]
        log_p = None if self.noise == "none" else (float(_log_sigmoid(lz_cav)), float(_log_sigmoid(-lz_cav)))
        if log_p is None:
            out = pair_moments(m_t, v_t, m_o, v_o, s_sum, None, None, self.log_c)
        else:
            out = pair_moments(m_t, v_t, m_o, v_o, s_sum, log_p[0], log_p[1], self.log_c)
        return out, cav


def _outlier_prior_update(fit, i, a, b, damping):
    """One ψ̃ᵢ refinement (RMGPC §3.2, sequential); returns Q's new (a, b) and the change in Q(zᵢ = 1)."""
    s = fit.sites
    before = expit(fit.z_log_odds()[i])
    a_c, b_c = a - s.alpha[i], b - s.beta[i]
    if a_c <= 0 or b_c <= 0:
        return a, b, 0.0
    rbar = a_c / (a_c + b_c)
    p_c = expit(s.lam[i].sum())
    w1 = p_c * rbar / (p_c * rbar + (1.0 - p_c) * (1.0 - rbar))
    a_new, b_new = beta_projection(a_c, b_c, w1)
    s.alpha[i] = damping * (a_new - a_c) + (1 - damping) * s.alpha[i]
    s.beta[i] = damping * (b_new - b_c) + (1 - damping) * s.beta[i]
    s.lam_i[i] = damping * np.log(rbar / (1.0 - rbar)) + (1 - damping) * s.lam_i[i]
    change = abs(expit(fit.z_log_odds()[i]) - before)
    return a_c + s.alpha[i], b_c + s.beta[i], change


def _pair_update(fit, i, k, damping):
    """One ψ̃_ik refinement (RMGPC eq. (14) in u-space, derivation §4), damped, with q_y
    and q_k rebuilt; returns the undamped moment mismatch (in prior sd / variance units, and in
    Q(zᵢ = 1)) or None when the cavity is not a Gaussian."""
    s, yi = fit.sites, fit.y[i]
    cav = fit.pair_cavity(i, k)
    if cav is None:
        return None
    (log_z, g, d2, g_s, lam_new), _ = fit.pair_tilted(i, k, cav)
    m_t, v_t, m_o, v_o, lz_cav = cav
    mean_t, var_t = m_t + v_t * g, v_t + v_t * v_t * d2         # tilted moments of a_iyᵀw_y
    mean_o, var_o = m_o - v_o * g, v_o + v_o * v_o * d2         # and of a_ikᵀw_k
    if not (var_t > 0 and var_o > 0):
        return None
    m_y, v_y = fit.marginal(i, yi)
    m_k, v_k = fit.marginal(i, k)
    sd_y, sd_k = np.sqrt(fit.geoms[yi].kappa[i]), np.sqrt(fit.geoms[k].kappa[i])
    gap = max(abs(mean_t - m_y) / sd_y, abs(mean_o - m_k) / sd_k,
              abs(var_t - v_y) / sd_y ** 2, abs(var_o - v_k) / sd_k ** 2)
    if fit.noise != "none":
        gap = max(gap, abs(expit(lz_cav + lam_new) - expit(lz_cav + s.lam[i, k])))
    old = (s.tau_t[i, k], s.eta_t[i, k], s.tau_o[i, k], s.eta_o[i, k], s.lam[i, k])
    new = (1.0 / var_t - 1.0 / v_t, mean_t / var_t - m_t / v_t,
           1.0 / var_o - 1.0 / v_o, mean_o / var_o - m_o / v_o, lam_new)
    e = damping
    while True:
        s.tau_t[i, k], s.eta_t[i, k], s.tau_o[i, k], s.eta_o[i, k], lam = (
            e * nw + (1 - e) * od for nw, od in zip(new, old))
        if fit.noise != "none":
            s.lam[i, k] = lam
        try:
            fit.rebuild([yi, k])
            return gap
        except np.linalg.LinAlgError:        # q is not Gaussian with this step: take a shorter one
            e *= 0.5
            if e < 1e-8:
                s.tau_t[i, k], s.eta_t[i, k], s.tau_o[i, k], s.eta_o[i, k], s.lam[i, k] = old
                fit.rebuild([yi, k])
                return None


def run_ep(X, y, C, kernels, Zs, noise="beta", a0=1.0, b0=9.0, eps=None, jitter=0.0, damping=1.0,
           tol=1e-11, max_sweeps=2000, init=None):
    """Sequential EP (RMGPC §3 with every site refined in turn) to a fixed point.

    Each sweep visits the points in order; for point i its C − 1 pair sites in class order, each
    followed by the rebuild of q_y and q_k, then (Beta treatment) its ψ̃ᵢ.  The fixed point is the
    one of RMGPC's parallel schedule (every tilted moment equal to q's).  Stops when a sweep's
    largest undamped moment mismatch is below ``tol``.

    Parameters
    ----------
    kernels, Zs : one SEKernel and one (m_k, D) array of inducing inputs per class
    noise : "beta" (ρ ~ Beta(a0, b0)), "fixed" (ρ = Cε/(C − 1) for the given ``eps``) or "none"
        (SMGPC's ρ = 0, no z)
    init : a previous Fit (same X, y): warm start from its sites
    """
    X, y = np.asarray(X, dtype=float), np.asarray(y)
    n = len(y)
    if noise not in ("beta", "fixed", "none"):
        raise ValueError(f"noise must be 'beta', 'fixed' or 'none', got {noise!r}")
    geoms = [ClassGeometry.build(kern, Z, X, jitter) for kern, Z in zip(kernels, Zs)]
    rho = np.nan
    if noise == "fixed":
        rho = C * eps / (C - 1)
        if not 0 < rho < 1:
            raise ValueError("eps must be in (0, (C − 1)/C)")
    sites = init.sites.copy() if init is not None else Sites.zeros(n, C)
    fit = Fit(X, y, C, geoms, sites, [None] * C, noise, a0, b0, rho)
    if noise == "fixed":
        sites.lam_i[:] = np.log(rho / (1 - rho))        # ψᵢ is a Bernoulli factor: kept exactly
    fit.rebuild()
    a, b = a0 + sites.alpha.sum(), b0 + sites.beta.sum()
    if noise == "beta" and init is None:
        for i in range(n):                 # ψ̃ᵢ from the prior, as the exact engine starts
            a, b, _ = _outlier_prior_update(fit, i, a, b, 1.0)
    for sweep in range(1, max_sweeps + 1):
        worst = 0.0
        for i in range(n):
            for k in range(C):
                if k == y[i]:
                    continue
                gap = _pair_update(fit, i, k, damping)
                worst = max(worst, np.inf if gap is None else gap)
            if noise == "beta":
                a, b, change = _outlier_prior_update(fit, i, a, b, damping)
                worst = max(worst, change / damping)
        fit.history.append(worst)
        fit.n_sweeps, fit.mismatch = sweep, worst
        if worst < tol:
            fit.converged = True
            break
    if noise == "beta":
        fit.a, fit.b = a0 + sites.alpha.sum(), b0 + sites.beta.sum()
    return fit


# -- evidence ------------------------------------------------------------------------------------------------

def _log_gauss_site_mass(tau, eta, m, v):
    """log ∫ exp(−½ τ t² + η t) N(t | m, v) dt (1 + τ v > 0)."""
    s = 1.0 + tau * v
    return -0.5 * np.log(s) + (m + eta * v) ** 2 / (2.0 * v * s) - m * m / (2.0 * v)


def log_evidence(fit):
    """log Z of the sparse model (derivation §5; RMGPC eq. (16)-(17) in u-space):

        Σ_k [½ h_kᵀ P_k⁻¹ h_k − ½ log|P_k|] + Σ_i ℓ_i  (+ log B(a, b) − log B(a₀, b₀) for Beta-ρ),
        ℓ_i = log Dᵢ + Σ_{k≠yᵢ} log s̃_ik + log s̃ᵢ,

    each log s̃ the log tilted mass less the log mass of the site times its cavity."""
    total = sum(_gauss_log_normaliser(q.P, q.h) for q in fit.qs)
    for i in range(len(fit.y)):
        total += datum_log_term(fit, i)
    if fit.noise == "beta":
        total += betaln(fit.a, fit.b) - betaln(fit.a0, fit.b0)
    return total


def datum_log_term(fit, i):
    """ℓ_i of :func:`log_evidence`: point i's share of log Z (its cavities held in q)."""
    s, y, C = fit.sites, fit.y, fit.C
    out = 0.0
    for k in range(C):
        if k == y[i]:
            continue
        (log_z, *_), cav = fit.pair_tilted(i, k)
        m_t, v_t, m_o, v_o, lz_cav = cav
        log_site = (_log_gauss_site_mass(s.tau_t[i, k], s.eta_t[i, k], m_t, v_t)
                    + _log_gauss_site_mass(s.tau_o[i, k], s.eta_o[i, k], m_o, v_o))
        if fit.noise != "none":     # the Bernoulli site against the cavity's P(z = 1)
            log_site += np.logaddexp(_log_sigmoid(s.lam[i, k]) + _log_sigmoid(lz_cav),
                                     _log_sigmoid(-s.lam[i, k]) + _log_sigmoid(-lz_cav))
        out += log_z - log_site
    if fit.noise == "none":
        return out
    others = [k for k in range(C) if k != y[i]]
    lam = s.lam[i, others]
    # log Dᵢ: Σ_z of the product of zᵢ's Bernoulli factors (RMGPC eq. (17))
    out += np.logaddexp(_log_sigmoid(s.lam_i[i]) + np.sum(_log_sigmoid(lam)),
                        _log_sigmoid(-s.lam_i[i]) + np.sum(_log_sigmoid(-lam)))
    if fit.noise == "beta":        # log s̃ᵢ of ψ̃ᵢ
        a_c, b_c = fit.a - s.alpha[i], fit.b - s.beta[i]
        rbar = a_c / (a_c + b_c)
        lz = lam.sum()
        log_zi = np.logaddexp(_log_sigmoid(lz) + np.log(rbar), _log_sigmoid(-lz) + np.log1p(-rbar))
        log_site_i = (betaln(fit.a, fit.b) - betaln(a_c, b_c)
                      + np.logaddexp(_log_sigmoid(s.lam_i[i]) + _log_sigmoid(lz),
                                     _log_sigmoid(-s.lam_i[i]) + _log_sigmoid(-lz)))
        out += log_zi - log_site_i
    return out


# -- gradient ------------------------------------------------------------------------------------------------

@dataclass
class MatrixGradient:
    """∂ log Z/∂K_uu (m × m), ∂ log Z/∂K_Xu (n × m) and ∂ log Z/∂κ (n,) of one class."""
    uu: np.ndarray
    xu: np.ndarray
    kappa: np.ndarray


def matrix_gradients(fit, form="cavity"):
    """Per class, the derivative of log Z with respect to K_uu, K_Xu and diag K_XX at fixed sites
    (derivation §6).

    ``form="cavity"``: SEP eq. (4) with each cavity held in u-space: the prior term
    ½ L⁻ᵀ(Σ_w + μ_wμ_wᵀ − I)L⁻¹ plus, per site j on row r (its row's a, its cavity's whitened mean
    μ_c and covariance Σ_c, d_j = ±g, g_s), L⁻ᵀ(g_s a aᵀ − γ aᵀ)L⁻¹ on K_uu, L⁻ᵀ(γ − 2 g_s a) on k_r
    and g_s on κ_r, γ = d_j μ_c + 2 g_s Σ_c a.

    ``form="sites"``: the sites follow their rows (a batch pass): with β = v − Λ A μ_w,
    G_A = β μ_wᵀ − Λ A Σ_w − 2 diag(g_s) A; ∂/∂K_Xu = G_A L⁻¹, ∂/∂K_uu = −½ L⁻ᵀ AᵀG_A L⁻¹,
    ∂/∂κ = g_s (row totals).
    """
    if form not in ("cavity", "sites"):
        raise ValueError(f"form must be 'cavity' or 'sites', got {form!r}")
    n, C, y = len(fit.y), fit.C, fit.y
    # per row (i, class) the list of (site's own precision and location on that row, d, g_s)
    terms = [[[] for _ in range(C)] for _ in range(n)]
    for i in range(n):
        for k in range(C):
            if k == y[i]:
                continue
            (log_z, g, d2, g_s, _), _ = fit.pair_tilted(i, k)
            s = fit.sites
            terms[i][y[i]].append((s.tau_t[i, k], s.eta_t[i, k], g, g_s))
            terms[i][k].append((s.tau_o[i, k], s.eta_o[i, k], -g, g_s))
    out = []
    for k in range(C):
        geo, q = fit.geoms[k], fit.qs[k]
        A, m = geo.A, geo.A.shape[1]
        Li = np.linalg.inv(geo.L)
        g_kappa = np.array([sum(t[3] for t in terms[i][k]) for i in range(n)])
        if form == "cavity":
            G_w = 0.5 * (q.cov + np.outer(q.mean, q.mean) - np.eye(m))     # prior term, w-space
            G_rows = np.zeros((n, m))
            for i in range(n):
                a = A[i]
                for tau, eta, d, g_s in terms[i][k]:
                    # the site's cavity in w: q less exp(−½ τ (aᵀw)² + η aᵀw)
                    P_c, h_c = q.P - tau * np.outer(a, a), q.h - eta * a
                    cov_c = np.linalg.inv(P_c)
                    gamma = d * (cov_c @ h_c) + 2.0 * g_s * (cov_c @ a)
                    G_w += g_s * np.outer(a, a) - np.outer(gamma, a)
                    G_rows[i] += gamma - 2.0 * g_s * a
            uu = Li.T @ G_w @ Li
            xu = G_rows @ Li
        else:
            tau, eta = fit.sites.row_sites(y, k)
            beta = eta - tau * (A @ q.mean)
            G_A = np.outer(beta, q.mean) - (tau[:, None] * A) @ q.cov - 2.0 * g_kappa[:, None] * A
            xu = G_A @ Li
            AtG = A.T @ G_A
            uu = -0.5 * Li.T @ (0.5 * (AtG + AtG.T)) @ Li
        out.append(MatrixGradient(uu, xu, g_kappa))
    return out


def row_coefficients(fit):
    """Per class, the cavity-form gradient's per-row coefficients (d1, e, g_s), shape (n,) each, so
    that row r's γ summed over its sites is d1_r μ_w + e_r Σ_w a_r (derivation §6: the form
    the binary engine's compiled row pass takes).  Site j on row r with marginal N(μ_r, σ²_r), site
    (τ_j, η_j), cavity variance v_j and d_j = ±g_j: its cavity gives Σ_c a = Σ_w a v_j/σ²_r and
    μ_c = μ_w + Σ_w a (τ_j μ_r − η_j) v_j/σ²_r (Sherman–Morrison), so d1_r = Σ_j d_j,
    e_r = Σ_j [d_j (τ_j μ_r − η_j) + 2 g_s,j] v_j/σ²_r and g_s,r = Σ_j g_s,j."""
    n, C, y, s = len(fit.y), fit.C, fit.y, fit.sites
    out = [(np.zeros(n), np.zeros(n), np.zeros(n)) for _ in range(C)]
    for i in range(n):
        for k in range(C):
            if k == y[i]:
                continue
            (_, g, _, g_s, _), (m_t, v_t, m_o, v_o, _) = fit.pair_tilted(i, k)
            for row, d, tau, eta, v_c in ((y[i], g, s.tau_t[i, k], s.eta_t[i, k], v_t),
                                          (k, -g, s.tau_o[i, k], s.eta_o[i, k], v_o)):
                mu, var = fit.marginal(i, row)
                d1, e, gs = out[row]
                d1[i] += d
                e[i] += (d * (tau * mu - eta) + 2.0 * g_s) * v_c / var
                gs[i] += g_s
    return out


def contract(kernel, X, Z, G):
    """(∂ log Z/∂θ, ∂ log Z/∂Z) of one class from its :class:`MatrixGradient` by the chain rule
    through K_uu = k(Z, Z) (+ constant jitter), K_Xu = k(X, Z) and κ = k(x, x)."""
    g_theta = (np.einsum("ab,pab->p", G.uu, kernel.d_theta(Z, Z))
               + np.einsum("ra,pra->p", G.xu, kernel.d_theta(X, Z))
               + kernel.d_diag_theta(X) @ G.kappa)
    # K_uu[a, b] depends on z_a through both arguments: ∂k(z_a, z_b)/∂z_a = −∂k(z_a, z_b)/∂z_b
    D_uu = kernel.d_second(Z, Z)                        # ∂k(z_b, z_a)/∂z_a, indexed [b, a, d]
    g_Z = (np.einsum("ba,bad->ad", G.uu + G.uu.T, D_uu)
           + np.einsum("ra,rad->ad", G.xu, kernel.d_second(X, Z)))
    return g_theta, g_Z


def gradient(fit, form="cavity"):
    """∂ log Z/∂θ_k and ∂ log Z/∂Z_k for every class (lists), and ∂ log Z/∂ε (fixed treatment;
    derivation §6: Σᵢ (pᵢ − ρ)/(ρ(1 − ρ)) · C/(C − 1)), else None."""
    mats = matrix_gradients(fit, form)
    g_theta, g_Z = [], []
    for k, G in enumerate(mats):
        t, z = contract(fit.geoms[k].kernel, fit.X, fit.geoms[k].Z, G)
        g_theta.append(t)
        g_Z.append(z)
    g_eps = None
    if fit.noise == "fixed":
        rho = fit.rho
        g_eps = float(np.sum(fit.outlier_probability() - rho)) / (rho * (1 - rho)) * fit.C / (fit.C - 1)
    return g_theta, g_Z, g_eps


# -- prediction ----------------------------------------------------------------------------------------------

def predict_latent(fit, Xs):
    """(n*, C) means a_*ᵀμ_w and variances a_*ᵀΣ_w a_* + s_* of f_k(x*) (derivation §8)."""
    Xs = np.asarray(Xs, dtype=float)
    M, V = np.empty((len(Xs), fit.C)), np.empty((len(Xs), fit.C))
    for k in range(fit.C):
        A, s = fit.geoms[k].whiten(Xs)
        for j in range(len(Xs)):
            M[j, k], v = fit.qs[k].marginal(A[j])
            V[j, k] = v + s[j]
    return M, V


def argmax_probability(means, varis, c):
    """∫ N(u | m_c, v_c) Π_{k≠c} Φ((u − m_k)/√v_k) du (RMGPC eq. (19)) by adaptive quadrature."""
    others = [k for k in range(len(means)) if k != c]

    def f(x):
        u = means[c] + np.sqrt(varis[c]) * x
        return np.exp(-0.5 * x * x - LOG_SQRT_2PI) * np.prod(
            [ndtr((u - means[k]) / np.sqrt(varis[k])) for k in others])

    return quad(f, -40.0, 40.0, epsabs=1e-14, epsrel=1e-12, limit=200, points=[0.0])[0]


def predict_proba(fit, Xs):
    """ρ̄/C + (1 − ρ̄) P(argmax = c), RMGPC eq. (19)-(20) with the sparse latent moments."""
    M, V = predict_latent(fit, Xs)
    rho = 0.0 if fit.noise == "none" else fit.rho_mean
    out = np.empty_like(M)
    for j in range(len(M)):
        for c in range(fit.C):
            out[j, c] = rho / fit.C + (1.0 - rho) * argmax_probability(M[j], V[j], c)
    return out


# -- tied sites (stochastic EP) ---------------------------------------------------------------------------

@dataclass
class LocalEP:
    """A point's pair sites fitted by EP against its cavity (derivation §7): the point's
    C − 1 pair factors share a_iyᵀw_y and zᵢ, so they are refined in turn to their joint fixed point
    with the point's cavity held.  All quantities are scalars per row (class) of the point."""
    site_tau: np.ndarray       # (C,) the point's total site on each of its rows: Σ_j τᵗ_j on yᵢ, τᵒ_k on k
    site_eta: np.ndarray
    log_z: float               # log of the point's local EP evidence against the cavity
    d_m: np.ndarray            # (C,) ∂ log Z_loc/∂(cavity mean of the row)
    d_v: np.ndarray            # (C,) ∂ log Z_loc/∂(cavity variance of the row)
    d_s: np.ndarray            # (C,) ∂ log Z_loc/∂s (the rows' FITC variances)
    sweeps: int


def local_ep(y_i, C, m_c, v_c, s, noise, log_odds_prior, log_c, tol=1e-14, max_sweeps=500):
    """EP over one point's pair sites with the cavity marginals N(m_c[k], v_c[k]) of its C rows held.

    ``log_odds_prior``: zᵢ's exact factor (logit ρ) or None without outliers.  Sequential, undamped
    pair refinements until no marginal moves by more than ``tol``.  The local evidence is
    Σ_rows log ∫ site_row N(cavity) + Σ_j log s̃_j + log Dᵢ, stationary in the local sites, so its
    derivatives in the cavity mean and variance of a row are those of a Gaussian prior under EP:
    d_m = (μ_Q − m_c)/v_c, d_v = ½ (d_m² + (σ²_Q − v_c)/v_c²), and in s the pairs' g_s."""
    others = [k for k in range(C) if k != y_i]
    tt, et, to, eo, lam = (dict.fromkeys(others, 0.0) for _ in range(5))
    robust = noise != "none"
    lz0 = log_odds_prior if robust else 0.0

    def marg(k):
        if k == y_i:
            prec = 1.0 / v_c[k] + sum(tt.values())
            return (m_c[k] / v_c[k] + sum(et.values())) / prec, 1.0 / prec
        prec = 1.0 / v_c[k] + to[k]
        return (m_c[k] / v_c[k] + eo[k]) / prec, 1.0 / prec

    def pair(k):
        """Pair k's local cavity (m_t, v_t, m_o, v_o, z log-odds) and its pair_moments."""
        m_y, v_y = marg(y_i)
        m_k, v_k = marg(k)
        v_t, v_o = 1.0 / (1.0 / v_y - tt[k]), 1.0 / (1.0 / v_k - to[k])
        m_t, m_o = v_t * (m_y / v_y - et[k]), v_o * (m_k / v_k - eo[k])
        lz_cav = lz0 + sum(lam.values()) - lam[k]
        lp = (float(_log_sigmoid(lz_cav)), float(_log_sigmoid(-lz_cav))) if robust else (None, None)
        cav = (m_t, v_t, m_o, v_o, lz_cav)
        return cav, pair_moments(m_t, v_t, m_o, v_o, s[y_i] + s[k], *lp, log_c)

    sweeps = 0
    for sweeps in range(1, max_sweeps + 1):
        worst = 0.0
        for k in others:
            m_y, v_y = marg(y_i)
            m_k, v_k = marg(k)
            (m_t, v_t, m_o, v_o, _), (_, g, d2, _, lam_new) = pair(k)
            mean_t, var_t = m_t + v_t * g, v_t + v_t * v_t * d2
            mean_o, var_o = m_o - v_o * g, v_o + v_o * v_o * d2
            worst = max(worst, abs(mean_t - m_y), abs(mean_o - m_k), abs(var_t - v_y), abs(var_o - v_k))
            tt[k], et[k] = 1.0 / var_t - 1.0 / v_t, mean_t / var_t - m_t / v_t
            to[k], eo[k] = 1.0 / var_o - 1.0 / v_o, mean_o / var_o - m_o / v_o
            if robust:
                lam[k] = lam_new
        if worst < tol:
            break
    site_tau, site_eta = np.zeros(C), np.zeros(C)
    site_tau[y_i], site_eta[y_i] = sum(tt.values()), sum(et.values())
    for k in others:
        site_tau[k], site_eta[k] = to[k], eo[k]
    log_z = sum(_log_gauss_site_mass(site_tau[k], site_eta[k], m_c[k], v_c[k]) for k in range(C))
    d_s = np.zeros(C)
    for k in others:                       # log s̃ of each pair against its local cavity
        (m_t, v_t, m_o, v_o, lz_cav), (lzj, _, _, g_s, _) = pair(k)
        log_z += (lzj - _log_gauss_site_mass(tt[k], et[k], m_t, v_t)
                  - _log_gauss_site_mass(to[k], eo[k], m_o, v_o))
        if robust:
            log_z -= np.logaddexp(_log_sigmoid(lam[k]) + _log_sigmoid(lz_cav),
                                  _log_sigmoid(-lam[k]) + _log_sigmoid(-lz_cav))
        d_s[y_i] += g_s
        d_s[k] += g_s
    if robust:
        lams = np.array([lam[k] for k in others])
        log_z += np.logaddexp(_log_sigmoid(lz0) + np.sum(_log_sigmoid(lams)),
                              _log_sigmoid(-lz0) + np.sum(_log_sigmoid(-lams)))
    d_m, d_v = np.zeros(C), np.zeros(C)
    for k in range(C):
        mu, var = marg(k)
        d_m[k] = (mu - m_c[k]) / v_c[k]
        d_v[k] = 0.5 * (d_m[k] ** 2 + (var - v_c[k]) / v_c[k] ** 2)
    return LocalEP(site_tau, site_eta, float(log_z), d_m, d_v, d_s, sweeps)


def _gauss_log_normaliser(P, h):
    """½ hᵀP⁻¹h − ½ log|P|: log ∫ N(w | 0, I) exp(−½ wᵀ(P − I)w + hᵀw) dw."""
    return 0.5 * float(h @ np.linalg.solve(P, h)) - 0.5 * np.linalg.slogdet(P)[1]


@dataclass
class TiedFit:
    """Stochastic EP with one tied site per class: q(w_k) ∝ N(w_k | 0, I) exp(−½ wᵀT_k w + g_kᵀw),
    T_k and g_k the n-fold average site; each point's cavity removes 1/n of them from every class."""
    X: np.ndarray
    y: np.ndarray
    C: int
    geoms: list
    T: list
    g: list
    noise: str
    rho: float
    converged: bool = False
    n_iter: int = 0

    @property
    def log_c(self):
        return -np.log(self.C) / (self.C - 1)

    @property
    def qs(self):
        out = []
        for T, g in zip(self.T, self.g):
            P = np.eye(len(g)) + T
            cov = np.linalg.inv(P)
            out.append(ClassQ(P, g, 0.5 * (cov + cov.T), np.linalg.solve(P, g)))
        return out

    @property
    def rho_mean(self):
        return self.rho

    def cavity(self, k):
        """(P, h) of every point's cavity in class k: I + (1 − 1/n) T_k, (1 − 1/n) g_k."""
        keep = 1.0 - 1.0 / len(self.y)
        return np.eye(len(self.g[k])) + keep * self.T[k], keep * self.g[k]

    def local(self, i, cavities=None):
        """Point i's :class:`LocalEP` against its cavity."""
        cavities = cavities or [self.cavity(k) for k in range(self.C)]
        m_c, v_c, s = np.empty(self.C), np.empty(self.C), np.empty(self.C)
        for k, (P, h) in enumerate(cavities):
            a = self.geoms[k].A[i]
            m_c[k] = a @ np.linalg.solve(P, h)
            v_c[k] = a @ np.linalg.solve(P, a)
            s[k] = self.geoms[k].s[i]
        lo = None if self.noise == "none" else float(np.log(self.rho / (1 - self.rho)))
        return local_ep(self.y[i], self.C, m_c, v_c, s, self.noise, lo, self.log_c)


def run_tied_ep(X, y, C, kernels, Zs, noise="fixed", eps=None, jitter=0.0, damping=0.5, tol=1e-11,
                max_iter=2000, init=None):
    """Tied-site EP to its fixed point (derivation §7), in batch: every point's local EP
    against the common cavity, then T_k ← (1 − δ) T_k + δ Σᵢ τ_ik a_ik a_ikᵀ (and g_k likewise).

    Fixed ε or no outliers (``noise`` "fixed" or "none"): zᵢ is local to its point, so nothing of
    size n is kept between iterations.  Stops when no training row's q-marginal moves by more than
    ``tol`` in an iteration.  ``init``: a TiedFit whose (T, g), taken as fixed in u-space, start the
    iteration (moved to the new factor as the trainers do with q)."""
    X, y = np.asarray(X, dtype=float), np.asarray(y)
    if noise not in ("fixed", "none"):
        raise ValueError("tied sites here take noise='fixed' or 'none'")
    n = len(y)
    geoms = [ClassGeometry.build(kern, Z, X, jitter) for kern, Z in zip(kernels, Zs)]
    rho = C * eps / (C - 1) if noise == "fixed" else np.nan
    if init is None:
        T = [np.zeros((g.A.shape[1],) * 2) for g in geoms]
        gs = [np.zeros(g.A.shape[1]) for g in geoms]
    else:
        T, gs = transform_tied(init, geoms)
    fit = TiedFit(X, y, C, geoms, T, gs, noise, rho)

    def row_marginals():
        return np.concatenate([[q.marginal(a) for a in geo.A] for q, geo in zip(fit.qs, geoms)])

    before = row_marginals()
    for it in range(1, max_iter + 1):
        cavities = [fit.cavity(k) for k in range(C)]
        T_new = [np.zeros_like(t) for t in fit.T]
        g_new = [np.zeros_like(v) for v in fit.g]
        for i in range(n):
            loc = fit.local(i, cavities)
            for k in range(C):
                a = geoms[k].A[i]
                T_new[k] += loc.site_tau[k] * np.outer(a, a)
                g_new[k] += loc.site_eta[k] * a
        fit.T = [(1 - damping) * t + damping * tn for t, tn in zip(fit.T, T_new)]
        fit.g = [(1 - damping) * v + damping * vn for v, vn in zip(fit.g, g_new)]
        after = row_marginals()
        fit.n_iter = it
        if np.max(np.abs(after - before)) < tol * damping:
            fit.converged = True
            break
        before = after
    return fit


def transform_tied(fit, geoms):
    """The tied sums of ``fit`` held in u-space, seen through the factors of ``geoms``:
    T' = Mᵀ T M, g' = Mᵀ g with M = L⁻¹L' (sparse.ep.transform_natural's algebra)."""
    T, g = [], []
    for old, new, t, v in zip(fit.geoms, geoms, fit.T, fit.g):
        M = np.linalg.solve(old.L, new.L)
        T.append(M.T @ t @ M)
        g.append(M.T @ v)
    return T, g


def tied_log_evidence(fit):
    """log Z with tied sites (derivation §7; SEP eq. (3)):

        Σ_k G_k(q) + Σᵢ [log Z_loc,i + Σ_k (G_k(cavity) − G_k(q))],   G(P, h) = ½ hᵀP⁻¹h − ½ log|P|,

    log Z_loc,i from :func:`local_ep`.  With n = 1 it is the untied evidence."""
    qs = fit.qs
    G_q = [_gauss_log_normaliser(q.P, q.h) for q in qs]
    cavities = [fit.cavity(k) for k in range(fit.C)]
    G_c = [_gauss_log_normaliser(P, h) for P, h in cavities]
    total = sum(G_q)
    for i in range(len(fit.y)):
        total += fit.local(i, cavities).log_z + sum(G_c) - sum(G_q)
    return total


def tied_gradient(fit, with_average_term=True):
    """∂ log Z/∂θ_k and ∂ log Z/∂Z_k with the tied sites held in u-space (derivation §7).

    Per class: the prior term ½ L⁻ᵀ(Σ_w + μμᵀ − I)L⁻¹, each point's cavity-held terms (γ = d_m μ_c
    + 2 d_v Σ_c a on its row, s through d_s, from :func:`local_ep`), and, with
    ``with_average_term``, ½ L⁻ᵀ Σᵢ (E_i[wwᵀ] − E_q[wwᵀ]) L⁻¹ over the points' local posteriors
    q_i = cavity × the point's sites: at a tied fixed point q is the natural-parameter average of
    the q_i, not their moment average, so this term is not zero for n > 1.  Without it, the
    gradient is SEP eq. (4)/(6) as the trainers apply it."""
    n, C = len(fit.y), fit.C
    qs = fit.qs
    cavities = [fit.cavity(k) for k in range(C)]
    locs = [fit.local(i, cavities) for i in range(n)]
    g_theta, g_Z = [], []
    for k in range(C):
        geo, q = fit.geoms[k], qs[k]
        A, m = geo.A, geo.A.shape[1]
        Li = np.linalg.inv(geo.L)
        second_q = q.cov + np.outer(q.mean, q.mean)
        G_w = 0.5 * (second_q - np.eye(m))
        P_c, h_c = cavities[k]
        cov_c = np.linalg.inv(P_c)
        mu_c = cov_c @ h_c
        G_rows, g_kappa = np.zeros((n, m)), np.zeros(n)
        for i, loc in enumerate(locs):
            a = A[i]
            gamma = loc.d_m[k] * mu_c + 2.0 * loc.d_v[k] * (cov_c @ a)
            G_w += loc.d_s[k] * np.outer(a, a) - np.outer(gamma, a)
            G_rows[i] = gamma - 2.0 * loc.d_s[k] * a
            g_kappa[i] = loc.d_s[k]
            if with_average_term:
                P_i = P_c + loc.site_tau[k] * np.outer(a, a)
                cov_i = np.linalg.inv(P_i)
                mu_i = cov_i @ (h_c + loc.site_eta[k] * a)
                G_w += 0.5 * (cov_i + np.outer(mu_i, mu_i) - second_q)
        G = MatrixGradient(Li.T @ G_w @ Li, G_rows @ Li, g_kappa)
        t, z = contract(geo.kernel, fit.X, geo.Z, G)
        g_theta.append(t)
        g_Z.append(z)
    return g_theta, g_Z
