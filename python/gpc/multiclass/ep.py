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
can widen a marginal), so each class block splits them into non-negative ones, held through the
Cholesky factor of B = I + S K S as in the binary engine, and a Woodbury correction of rank the
number of negative sites (:mod:`gpc.multiclass._block`): Σ_k is positive definite exactly when the
correction's small matrix is, and a failed Cholesky of it halves the damping (recorded in
``damping_history``).

``robust=False`` is SMGPC (b₀ → ∞, RMGPC §4): ρ = 0, no z and no Beta; the sites are then plain
Gaussians.
"""

import contextlib
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from scipy.special import betaln, expit, log_ndtr

from .._linalg import anderson_correction
from .._multiclass import refine_outlier_prior, refine_pairs
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from ._block import ClassBlock

LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


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
        Outer iterations run (each refactors the l class blocks), and whether the tolerance was met.
    n_location_sweeps : int
        Sweeps of the inner loop (site locations at fixed precisions, O(n²) per class each).
    n_refactorisations : int
        Factorisations of the l class blocks, including those of rejected accelerated trials (the
        O(n³) cost of the run).
    rejected_steps : list
        The iterations whose Anderson-accelerated trial was dropped (it did not factor, or did not
        lower the moment mismatch) in favour of the plain damped step.
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
    n_location_sweeps: int = 0
    n_refactorisations: int = 0       # factorisations of the l class blocks (accepted or not)
    rejected_steps: list = field(default_factory=list)   # iterations whose accelerated step was dropped
    damping_history: list = field(default_factory=list)   # (iteration, new damping) at each halving
    robust: bool = True
    sites: object = None      # the converged site parameters (_Sites), for checks and warm starts

    @property
    def rho_mean(self):
        """ρ̄ = a / (a + b) of RMGPC eq. (20); 0 without outliers."""
        return self.a / (self.a + self.b) if self.robust else 0.0

    def gradient_matrices(self):
        """M_k of RMGPC eq. (18) for every class (BLAS on one thread, as in EP)."""
        with _one_blas_thread():
            return [c.gradient_matrix() for c in self.classes]


def _log_gauss_site_mass(tau, eta, m, v):
    """log ∫ exp(−½ τ f² + η f) N(f | m, v) df (needs 1 + τ v > 0)."""
    s = 1.0 + tau * v
    return -0.5 * np.log(s) + (m + eta * v) ** 2 / (2.0 * v * s) - m * m / (2.0 * v)


class _Sites:
    """All site parameters; arrays (n, l) are zero where k = yᵢ."""

    ARRAYS = ("tau_o", "eta_o", "tau_t", "eta_t", "lam", "lam_i", "alpha", "beta")

    def __init__(self, y, l):
        n = y.shape[0]
        self.y, self.l, self.n = y, l, n
        self.other = np.ones((n, l), dtype=bool)
        self.other[np.arange(n), y] = False
        # column j of ``others``: the j-th class k ≠ yᵢ of each point (the pair refined j-th)
        self.others = np.ascontiguousarray(np.nonzero(self.other)[1].reshape(n, l - 1))
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

    def copy(self):
        new = _Sites.__new__(_Sites)
        new.__dict__.update(self.__dict__)
        for name in self.ARRAYS:
            setattr(new, name, getattr(self, name).copy())
        return new

    def locations(self):
        """The parameters the inner loop moves (everything but the Gaussian precisions), flat."""
        o = self.other
        return np.concatenate([self.eta_t[o], self.eta_o[o], self.lam[o], self.alpha, self.beta,
                               self.lam_i])

    def with_locations(self, x):
        """A copy with :meth:`locations` replaced by ``x``."""
        new, o, q, n = self.copy(), self.other, int(self.other.sum()), self.n
        new.eta_t[o], new.eta_o[o], new.lam[o] = x[:q], x[q:2 * q], x[2 * q:3 * q]
        new.alpha, new.beta, new.lam_i = x[3 * q:3 * q + n], x[3 * q + n:3 * q + 2 * n], x[3 * q + 2 * n:]
        return new

    def vector(self):
        """Every site parameter the outer loop moves: the Gaussian precisions, then
        :meth:`locations`, flat."""
        o = self.other
        return np.concatenate([self.tau_t[o], self.tau_o[o], self.locations()])

    def with_vector(self, x):
        """A copy with :meth:`vector` replaced by ``x``."""
        q = int(self.other.sum())
        new = self.with_locations(x[2 * q:])
        new.tau_t[self.other], new.tau_o[self.other] = x[:q], x[q:2 * q]
        return new

    def z_log_odds(self):
        """log-odds of Q's P(zᵢ = 1): ψ̃ᵢ's factor plus the ψ̃ᵢₖ's."""
        return self.lam_i + self.lam.sum(axis=1)


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


#: the class blocks are factored in single precision (half the time) while the largest moment
#: mismatch is above this; float32 marginals (~1e-4 relative) steer the early iterations well enough
SINGLE_ABOVE = 1e-2
#: the inner loop (locations at fixed precisions): at most MAX_LOCATION_SWEEPS per refactorisation,
#: stopped once its mismatch is below LOCATION_FRACTION × the outer mismatch (or below tol)
MAX_LOCATION_SWEEPS, LOCATION_FRACTION = 30, 0.1
#: Anderson acceleration of the inner loop: the number of past steps it combines
ANDERSON_MEMORY = 5
#: Anderson acceleration of the outer loop (the damped refinements of all sites, one per
#: refactorisation): the number of past steps it combines, and the number of plain damped steps
#: taken after a rejected accelerated one before accelerating again (doubled after each further
#: rejection without an accepted step between, so that where EP does not converge the trials cost
#: a few refactorisations, not one per iteration)
OUTER_MEMORY, OUTER_PAUSE = 5, 2


def rmgpc_ep(Ks, y, n_classes, a0=1.0, b0=9.0, robust=True, max_iter=500, tol=1e-6, damping=0.5,
             min_damping=1e-6, init=None, n_threads=1, accelerate=True):
    """Run RMGPC's EP (§3) to a fixed point.

    Each outer iteration refines every ψ̃ᵢₖ from the current marginals (all points at once; the
    l − 1 pairs of a point one after another, its target marginal moved by each, as a local
    sequential schedule) and then the ψ̃ᵢ sequentially (RMGPC §3.2), damped by ε, and refactors the l
    class blocks (one Cholesky and one triangular inverse each, :class:`~gpc.multiclass._block.ClassBlock`).
    Between refactorisations an inner loop moves only the site locations (η, the Bernoulli and Beta
    factors) at fixed site precisions: the class covariances do not change, so each sweep costs
    O(n²) per class, and Anderson acceleration of those sweeps makes the means settle in a few of
    them.  The fixed point is EP's: every tilted moment equals Q's marginal.

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
    max_iter : int
        Outer iterations (refactorisations).
    tol : float
        Stop when the undamped refinement would move no marginal by more than ``tol``: the largest
        mismatch between a tilted distribution's mean (variance) and Q's, in units of the prior
        standard deviation (variance) of that latent value, and between the tilted and Q's P(zᵢ = 1).
        It is checked on a double-precision factorisation.
    damping : float
        ε of RMGPC §3 (new site = ε · refined + (1 − ε) · old; the paper's 0.5), halved whenever a
        class covariance would stop being positive definite (recorded in ``damping_history``).
    min_damping : float, default 1e-6
        Halving below this raises NotPositiveDefiniteError.
    init : MultiClassEPResult, optional
        Warm start from a previous result on the same labels (the optimiser's previous θ).
    n_threads : int, default 1
        Threads over the l class blocks (their LAPACK calls release the GIL; the blocks are
        independent given the sites).  The result does not depend on it.  BLAS itself runs on one
        thread during EP (:func:`_one_blas_thread`).
    accelerate : bool, default True
        Anderson acceleration of the outer iteration (``OUTER_MEMORY`` past damped steps).  False
        gives the plain damped iteration; both stop at the same fixed point, the accelerated one
        after fewer refactorisations on most problems (bench/RESULTS.md, issue 15).

    Returns
    -------
    MultiClassEPResult
    """
    y = np.ascontiguousarray(y, dtype=np.intp)
    l = int(n_classes)
    blocks = [ClassBlock(np.ascontiguousarray(K, dtype=np.float64)) for K in Ks]
    pool = ThreadPoolExecutor(max_workers=int(n_threads)) if n_threads > 1 and l > 1 else None
    try:
        with _one_blas_thread():
            return _run(blocks, y, l, a0, b0, robust, max_iter, tol, damping, min_damping, init, pool,
                        OUTER_MEMORY if accelerate else 0)
    finally:
        if pool is not None:
            pool.shutdown()


def _one_blas_thread():
    """BLAS and OpenMP pinned to one thread while EP runs (threadpoolctl, when installed).

    EP makes many small calls that alternate between NumPy's OpenBLAS, SciPy's OpenBLAS (gpc._lapack)
    and OpenMP loops (gpc._dense); with more than one thread each, their idle workers spin against
    each other: on a busy 2-core machine an RMGPC fit on new-thyroid took 23.5 s instead of 0.22 s.
    The class blocks are parallelised by ``n_threads`` instead.  The limit is process-wide while it
    lasts (as scikit-learn's own uses of threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()
    return threadpool_limits(1)


def _map(pool, fn, items):
    return [fn(x) for x in items] if pool is None else list(pool.map(fn, items))


def _refactor(blocks, sites, single, pool):
    """Every class's marginal means and variances (n, l) at ``sites``; raises
    NotPositiveDefiniteError when a class covariance would not be positive definite."""
    tau, eta = sites.class_sites()
    out = _map(pool, lambda k: blocks[k].marginals(tau[:, k], eta[:, k], single), range(len(blocks)))
    return np.column_stack([m for m, _ in out]), np.column_stack([v for _, v in out])


def _remean(blocks, sites, pool):
    """Means for new site locations at the precisions of the last refactorisation (O(n²) each)."""
    _, eta = sites.class_sites()
    return np.column_stack(_map(pool, lambda k: blocks[k].mean(eta[:, k]), range(len(blocks))))


def _beta_posterior(sites, a0, b0):
    """Q's Beta(a, b) of ρ: the prior times the ψ̃ᵢ's ρ^{αᵢ}(1 − ρ)^{βᵢ}."""
    return float(a0) + float(np.sum(sites.alpha)), float(b0) + float(np.sum(sites.beta))


def _cavities(sites, means, varis):
    """Cavity moments of every pair (i, k ≠ yᵢ) in (n, l) arrays; ``ok`` masks out k = yᵢ and the
    pairs whose cavity variance would not be positive."""
    y, rows = sites.y, np.arange(sites.n)
    m_y, v_y = means[rows, y][:, None], varis[rows, y][:, None]
    prec_t = 1.0 / v_y - sites.tau_t
    prec_o = 1.0 / varis - sites.tau_o
    ok = sites.other & (prec_t > 0) & (prec_o > 0)
    v_t, v_o = 1.0 / np.where(ok, prec_t, 1.0), 1.0 / np.where(ok, prec_o, 1.0)
    m_t = v_t * (m_y / v_y - sites.eta_t)
    m_o = v_o * (means / varis - sites.eta_o)
    return ok, m_t, v_t, m_o, v_o


def _log_p_cavity(lz_cav):
    """(log p, log(1 − p)) for cavity z log-odds."""
    return -np.logaddexp(0.0, -lz_cav), -np.logaddexp(0.0, lz_cav)


def _refine(sites, means, varis, prior_sd, damping, robust, a0, b0, log_c, fixed_precisions):
    """One refinement of every ψ̃ᵢₖ (RMGPC eq. (14)) and then of every ψ̃ᵢ (eq. (15)).

    All points at once; the l − 1 pairs of point i one after another, each moving the target
    marginal f_yᵢ(xᵢ) (and the z log-odds) by its own change, so that the next pair's cavity sees
    it.  With ``fixed_precisions`` the Gaussian sites keep their precisions and their locations move
    the marginal mean to the tilted mean (the inner loop).  Returns the new sites (a copy) and the
    largest mismatch between the tilted moments and Q's (the undamped step, in units of
    ``prior_sd`` and its square; for z a probability); with ``fixed_precisions`` the variances'
    mismatch, which the inner loop cannot change, is left out.
    """
    new = sites.copy()
    means, varis, prior_sd = (np.ascontiguousarray(a, dtype=np.float64) for a in (means, varis, prior_sd))
    y, others = (np.ascontiguousarray(a, dtype=np.intp) for a in (sites.y, sites.others))
    mismatch = refine_pairs(y, others, new.tau_t, new.eta_t, new.tau_o, new.eta_o, new.lam,
                            new.lam_i, means, varis, prior_sd, float(damping), bool(robust),
                            float(log_c), bool(fixed_precisions))        # the ψ̃ᵢₖ, typed loop
    e = damping
    if robust:
        before = expit(new.z_log_odds())
        a, b = _beta_posterior(new, a0, b0)
        _refine_outlier_prior(new, a, b, e)
        # the ψ̃ᵢ's undamped step in P(zᵢ = 1)
        mismatch = max(mismatch, float(np.max(np.abs(expit(new.z_log_odds()) - before))) / e)
    return new, mismatch


def _location_sweeps(blocks, sites, means, varis, prior_sd, robust, a0, b0, log_c, tol, outer,
                     pool):
    """The inner loop: Anderson-accelerated refinements at fixed site precisions (O(n²) per class
    each).  Returns (sites, means, number of sweeps); the variances do not change."""
    accel, best, keep, sweeps = _Anderson(ANDERSON_MEMORY), np.inf, None, 0
    for _ in range(MAX_LOCATION_SWEEPS):
        new, res = _refine(sites, means, varis, prior_sd, 1.0, robust, a0, b0, log_c, True)
        if keep is None or res < keep[0]:
            keep = (res, sites, means)
        if res < max(tol, LOCATION_FRACTION * outer) or res > 10.0 * keep[0]:
            break
        if res > 2.0 * best:           # the iteration left Anderson's linear regime: start afresh
            accel.reset()
        best = min(best, res)
        step = accel.step(sites.locations(), new.locations(),
                          _location_weights(sites, varis, prior_sd, a0, b0))
        sites = sites.with_locations(step)
        means = _remean(blocks, sites, pool)
        sweeps += 1
    else:
        res = _refine(sites, means, varis, prior_sd, 1.0, robust, a0, b0, log_c, True)[1]
        if res < keep[0]:
            keep = (res, sites, means)
    return keep[1], keep[2], sweeps


class _Anderson:
    """Anderson acceleration (type II) of a fixed-point iteration x ↦ g(x).

    From the last m + 1 pairs (xⱼ, g(xⱼ)) with residuals fⱼ = g(xⱼ) − xⱼ, the next iterate is
    g(x) − (ΔX + ΔF) γ with γ the weighted least-squares fit of f by the residual differences ΔF
    (gpc._linalg.anderson_correction, mixing parameter 1).
    With one pair it is the plain step g(x).  The inner loop and the outer loop each use one.
    """

    def __init__(self, memory):
        self.memory = memory
        self.xs, self.fs = [], []

    def reset(self):
        self.xs, self.fs = [], []

    def __len__(self):
        return len(self.xs)

    def step(self, x, gx, weights):
        """Record (x, g(x)) and return the accelerated next iterate; ``weights`` scale the residual
        components to comparable units."""
        self.xs.append(x)
        self.fs.append(gx - x)
        if len(self.xs) > self.memory + 1:
            self.xs.pop(0)
            self.fs.pop(0)
        if len(self.xs) == 1:
            return gx
        return gx - anderson_correction(self.xs, self.fs, weights)


def _site_weights(sites, varis, prior_sd, a0, b0):
    """Scales of :meth:`_Sites.vector`: a precision change Δτ moves its marginal variance by v² Δτ
    (over the prior variance), and the locations are scaled as in :func:`_location_weights`."""
    o, rows = sites.other, np.arange(sites.n)
    rel = (varis / prior_sd) ** 2
    v_y = np.broadcast_to(rel[rows, sites.y][:, None], o.shape)[o]
    return np.concatenate([v_y, rel[o], _location_weights(sites, varis, prior_sd, a0, b0)])


def _location_weights(sites, varis, prior_sd, a0, b0):
    """Scales of :meth:`_Sites.locations` that make a unit change of each a comparable change of Q:
    a location moves its marginal mean by v (over the prior sd), a log-odds moves P(z) by p(1 − p),
    the Beta exponents move Q's Beta by 1/(a + b)."""
    o, rows = sites.other, np.arange(sites.n)
    v_y = np.broadcast_to((varis[rows, sites.y] / prior_sd[rows, sites.y])[:, None], o.shape)[o]
    v_k = (varis / prior_sd)[o]
    p = expit(sites.z_log_odds())
    pq = p * (1.0 - p)
    a, b = _beta_posterior(sites, a0, b0)
    beta_w = np.full(sites.n, 1.0 / (a + b))
    return np.concatenate([v_y, v_k, np.broadcast_to(pq[:, None], o.shape)[o], beta_w, beta_w, pq])


def _run(blocks, y, l, a0, b0, robust, max_iter, tol, damping, min_damping, init, pool, memory):
    """rmgpc_ep's iteration."""
    n = y.shape[0]
    log_c = -np.log(l) / (l - 1)
    prior_sd = np.sqrt(np.column_stack([b.k_diag for b in blocks]))
    history, converged, sweeps, n_factor = [], False, 0, 0
    sites, means, varis, single = None, None, None, True
    if init is not None and init.sites is not None and np.array_equal(init.sites.y, y):
        try:           # a warm start: refactor its sites in double precision
            sites = init.sites.copy()
            n_factor += 1
            means, varis = _refactor(blocks, sites, False, pool)
            single = False
        except NotPositiveDefiniteError:     # sites that do not fit these K: start cold
            sites = None
    if sites is None:
        sites = _Sites(y, l)
        means, varis = np.zeros((n, l)), prior_sd ** 2
        if robust:     # ψ̃ᵢ from the prior alone, so that the first cavities see P(z = 1) = ρ̄
            _refine_outlier_prior(sites, a0, b0, 1.0)
    factored = not single
    it, rejected, pause, streak, refined = 0, [], 0, 0, None
    accel = _Anderson(memory)
    for it in range(1, max_iter + 1):
        new, mismatch = refined or _refine(sites, means, varis, prior_sd, damping, robust, a0, b0,
                                           log_c, False)
        refined = None
        if mismatch < tol and factored and not single:
            converged = True
            break
        single = single and mismatch > SINGLE_ABOVE
        if memory and pause == 0:
            # Anderson's extrapolation of the damped steps, kept only if it lowers the mismatch
            step = accel.step(sites.vector(), new.vector(),
                              _site_weights(sites, varis, prior_sd, a0, b0))
            if len(accel) > 1:
                n_factor += 1
                try:
                    trial = _try_step(blocks, sites.with_vector(step), single, pool, prior_sd,
                                      damping, robust, a0, b0, log_c, tol, mismatch)
                    sweeps += trial[3]
                except NotPositiveDefiniteError:
                    trial = None
                if trial is not None and trial[4][1] < mismatch:
                    sites, means, varis, _, refined = trial
                    factored, streak = True, 0
                    continue
                rejected.append(it)
                accel.reset()
                pause = OUTER_PAUSE << min(streak, 3)    # 2, 4, 8, 16 plain steps after each miss
                streak += 1
        else:
            pause = max(pause - 1, 0)
        while True:    # the paper's damped step (RMGPC §3), halving ε if a Σ_k is not positive
            try:
                n_factor += 1
                means, varis = _refactor(blocks, new, single, pool)
                sites, factored = new, True
                break
            except NotPositiveDefiniteError:
                damping *= 0.5
                history.append((it, damping))
                accel.reset()
                if damping < min_damping:
                    raise NotPositiveDefiniteError(
                        f"EP could not keep the class covariances positive definite even with "
                        f"damping {damping:g}") from None
                new, mismatch = _refine(sites, means, varis, prior_sd, damping, robust, a0, b0,
                                        log_c, False)
        sites, means, done = _location_sweeps(blocks, sites, means, varis, prior_sd, robust, a0, b0,
                                              log_c, tol, mismatch, pool)
        sweeps += done
    if not converged:
        warnings.warn(f"RMGPC EP did not converge in {max_iter} iterations", ConvergenceWarning,
                      stacklevel=3)
        if single or not factored:
            n_factor += 1
            means, varis = _refactor(blocks, sites, False, pool)
    tau, eta = sites.class_sites()
    post = [blk.posterior(eta[:, k]) for k, blk in enumerate(blocks)]
    means = np.column_stack([p.mean for p in post])
    a, b = _beta_posterior(sites, a0, b0) if robust else (float(a0), float(b0))
    log_z = _log_evidence(sites, post, means, varis, a, b, a0, b0, robust, log_c)
    p_out = expit(sites.z_log_odds()) if robust else np.zeros(n)
    return MultiClassEPResult(classes=post, outlier_probability=p_out, a=a, b=b, log_evidence=log_z,
                              n_iter=it, converged=converged, damping=damping,
                              n_location_sweeps=sweeps, damping_history=history, robust=robust,
                              sites=sites, n_refactorisations=n_factor, rejected_steps=rejected)


def _try_step(blocks, sites, single, pool, prior_sd, damping, robust, a0, b0, log_c, tol, outer):
    """Refactor at ``sites``, settle the locations, and refine: (sites, means, varis, sweeps,
    (refined sites, mismatch)).  Raises NotPositiveDefiniteError when ``sites`` give no Gaussian."""
    means, varis = _refactor(blocks, sites, single, pool)
    sites, means, done = _location_sweeps(blocks, sites, means, varis, prior_sd, robust, a0, b0,
                                          log_c, tol, outer, pool)
    refined = _refine(sites, means, varis, prior_sd, damping, robust, a0, b0, log_c, False)
    return sites, means, varis, done, refined


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


def _log_evidence(sites, post, means, varis, a, b, a0, b0, robust, log_c):
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
    ok, m_t, v_t, m_o, v_o = _cavities(sites, means, varis)
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
