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
Gaussians.  ``rate=ρ`` fixes the outlier rate instead of giving it a Beta posterior: the likelihood
(1 − ε) Π Θ + ε/(l − 1) (1 − Π Θ) with fixed label noise ε = ρ (l − 1)/l (the scalable multi-class
EP paper of Villacampa-Calvo and Hernández-Lobato keeps this likelihood); the prior Bern(zᵢ | ρ) is
then in Q's family and kept exactly, so there is no ψ̃ᵢ (docs/derivations-rmgpc.md, "Fixed label
noise").

EP's state has a domain: Q's Beta must be proper (a, b > 0, so ρ̄ ∈ (0, 1)), so must every ψ̃ᵢ's
cavity Beta, and every site finite.  A step that leaves it (an Anderson extrapolation can, and a
damped step can take a cavity Beta past zero) is treated like one whose Σ_k is not positive
definite: an accelerated trial is dropped, a damped step is retried with half the damping.  Only
the inner loop's sweeps at fixed precisions may pass through states with an improper ψ̃ᵢ cavity (a
full-step sequential ψ̃ᵢ sweep can move Q's Beta past an earlier point's site; that point's
refinement waits until its cavity is proper again); they keep Q's Beta proper and the sites
finite, and the loop hands on the best state it saw inside the domain.  The state a run ends in,
converged or not, must also have a finite log evidence (16) ≤ 0: EP approximates the probability
of discrete labels, and a positive value (seen on warm starts that end far from a fixed point, with
a small fixed label noise) marks a diverged state.  A warm start from a state that does not fit
the new covariances, or a run that still ends outside the domain, is restarted cold; only if that
fails too is a :class:`~gpc.exceptions.DivergenceError` raised, so no invalid state is returned or
carried into the next warm start.
"""

import warnings
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy.special import betaln, expit

from .. import _threads
from .._linalg import anderson_correction
from .._multiclass import pair_moments, refine_outlier_prior, refine_pairs
from .._special import softplus
from ..exceptions import ConvergenceWarning, DivergenceError, NotPositiveDefiniteError
from ..inference import _LOG_EVIDENCE_SLACK
from ._block import ClassBlock


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
        The Beta posterior of the outlier rate ρ (RMGPC eq. (20)); the prior's when the rate is fixed
        or there are no outliers.
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
    rate : float or None
        The fixed outlier rate ρ (``rmgpc_ep(rate=...)``), or None when ρ has the Beta posterior.
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
    rate: Optional[float] = None   # a fixed outlier rate ρ; None: ρ ~ Beta(a, b)
    sites: object = None      # the converged site parameters (_Sites), for checks and warm starts

    @property
    def rho_mean(self):
        """ρ̄ = a / (a + b) of RMGPC eq. (20); the fixed rate if there is one; 0 without outliers."""
        if not self.robust:
            return 0.0
        return self.rate if self.rate is not None else self.a / (self.a + self.b)

    def rate_gradient(self):
        """∂ log Z/∂ρ of a fixed outlier rate: Σᵢ (pᵢ − ρ)/(ρ (1 − ρ)), pᵢ = Q(zᵢ = 1)
        (docs/derivations-rmgpc.md, "Fixed label noise"); None unless the rate is fixed."""
        if not self.robust or self.rate is None:
            return None
        rho = self.rate
        return float(np.sum(self.outlier_probability - rho)) / (rho * (1.0 - rho))

    def gradient_matrices(self):
        """M_k of RMGPC eq. (18) for every class (BLAS on one thread, as in EP)."""
        with _threads.blas("blocks"):
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

    @staticmethod
    def split_beta(x, n):
        """The ψ̃ᵢ's exponents (α, β) within a vector of :meth:`locations` of n points."""
        q = (x.shape[0] - 3 * n) // 3          # 3q + 3n entries, q = n (l − 1)
        return x[3 * q:3 * q + n], x[3 * q + n:3 * q + 2 * n]

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
             min_damping=1e-6, init=None, n_threads=1, accelerate=True, rate=None, warn=True):
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
        class covariance would stop being positive definite or a step would leave EP's domain
        (module docstring; recorded in ``damping_history``).
    min_damping : float, default 1e-6
        Halving below this gives up (a cold restart after a warm start, else DivergenceError).
    init : MultiClassEPResult, optional
        Warm start from a previous result on the same labels (the optimiser's previous θ).  Sites
        that do not fit the new covariances, or a run from them that fails, fall back to a cold start.
    n_threads : int, default 1
        Threads over the l class blocks (their LAPACK calls release the GIL; the blocks are
        independent given the sites).  The result does not depend on it.  BLAS itself runs on one
        thread during EP (the "blocks" rule of gpc._threads).
    accelerate : bool, default True
        Anderson acceleration of the outer iteration (``OUTER_MEMORY`` past damped steps).  False
        gives the plain damped iteration; both stop at the same fixed point, the accelerated one
        after fewer refactorisations on most problems (bench/RESULTS.md).
    rate : float in (0, 1), optional
        A fixed outlier rate ρ: zᵢ ~ Bern(ρ) with no Beta posterior (``a0``, ``b0`` unused), i.e. the
        label noise ε = ρ (l − 1)/l of the likelihood (1 − ε) Π Θ + ε/(l − 1)(1 − Π Θ).  Needs
        ``robust=True``.
    warn : bool, default True
        Warn (ConvergenceWarning) when ``max_iter`` is reached first; the result's ``converged``
        says it either way (the estimator's optimiser checks it and warns only for the fitted θ).

    Returns
    -------
    MultiClassEPResult

    Raises
    ------
    DivergenceError
        When neither the warm start nor a cold start reaches a state inside EP's domain (proper
        class covariances, a proper Beta, finite sites, a finite log evidence ≤ 0).
    """
    y = np.ascontiguousarray(y, dtype=np.intp)
    l = int(n_classes)
    model = _Model(l, float(a0), float(b0), bool(robust), None if rate is None else float(rate))
    blocks = [ClassBlock(np.ascontiguousarray(K, dtype=np.float64)) for K in Ks]
    pool = ThreadPoolExecutor(max_workers=int(n_threads)) if n_threads > 1 and l > 1 else None
    memory = OUTER_MEMORY if accelerate else 0
    try:
        with _threads.blas("blocks"):
            if init is not None and init.sites is not None and np.array_equal(init.sites.y, y):
                try:
                    return _checked(_run(blocks, y, model, max_iter, tol, damping, min_damping,
                                         init.sites, pool, memory, warn), model)
                except (_OutsideDomain, NotPositiveDefiniteError):
                    pass                      # the warm start failed: start cold
            try:
                return _checked(_run(blocks, y, model, max_iter, tol, damping, min_damping, None,
                                     pool, memory, warn), model)
            except (_OutsideDomain, NotPositiveDefiniteError) as err:
                raise DivergenceError(f"RMGPC EP found no valid state: {err}",
                                      method="rmgpc ep") from err
    finally:
        if pool is not None:
            pool.shutdown()


class _OutsideDomain(ArithmeticError):
    """A state of EP outside its domain (module docstring); rmgpc_ep falls back on it."""


class _Model:
    """What EP approximates: l classes and the outlier indicators, which are absent (SMGPC), have a
    Beta-distributed rate (RMGPC) or a fixed rate ρ."""

    def __init__(self, l, a0, b0, robust, rate):
        if l < 2:
            raise ValueError(f"n_classes must be at least 2, got {l}")
        if rate is not None and not (robust and 0.0 < rate < 1.0):
            raise ValueError(f"rate must lie in (0, 1) and needs robust=True, got {rate!r}")
        self.l, self.a0, self.b0, self.robust, self.rate = l, a0, b0, robust, rate
        self.beta = robust and rate is None        # ρ ~ Beta: the ψ̃ᵢ exist
        self.log_c = -np.log(l) / (l - 1)          # c = l^(−1/(l−1)), RMGPC eq. (10)

    def beta_posterior(self, sites):
        """Q's Beta(a, b) of ρ: the prior times the ψ̃ᵢ's ρ^{αᵢ}(1 − ρ)^{βᵢ}."""
        return self._beta(sites.alpha, sites.beta)

    def _beta(self, alpha, beta):
        return self.a0 + float(np.sum(alpha)), self.b0 + float(np.sum(beta))

    def domain_error(self, sites):
        """Why ``sites`` lie outside EP's domain (module docstring), or None."""
        for name in _Sites.ARRAYS:
            if not np.all(np.isfinite(getattr(sites, name))):
                return f"the sites' {name} are not finite"
        return self.beta_error(sites.alpha, sites.beta)

    def beta_error(self, alpha, beta, cavities=True):
        """Why the ψ̃ᵢ's exponents ``alpha``, ``beta`` make Q's Beta of ρ improper, or with
        ``cavities`` a ψ̃ᵢ's cavity Beta (a − αᵢ, b − βᵢ), or None (always None without a Beta)."""
        if not self.beta:
            return None
        a, b = self._beta(alpha, beta)
        if not (a > 0 and b > 0):
            return f"Q's Beta(a, b) of the outlier rate is improper (a = {a:.6g}, b = {b:.6g})"
        if cavities and not (np.max(alpha) < a and np.max(beta) < b):
            i = int(np.flatnonzero((a - alpha <= 0) | (b - beta <= 0))[0])
            return (f"the cavity Beta of point {i}'s outlier-prior site is improper "
                    f"(a = {a - alpha[i]:.6g}, b = {b - beta[i]:.6g})")
        return None

    def locations_error(self, x, n):
        """Why a vector of :meth:`_Sites.locations` (n points) is no working state of the inner
        loop, or None: every entry finite and Q's Beta proper; a ψ̃ᵢ's cavity may be improper
        (:func:`_location_sweeps`)."""
        if not np.all(np.isfinite(x)):
            return "a site location is not finite"
        alpha, beta = _Sites.split_beta(x, n)
        return self.beta_error(alpha, beta, cavities=False)

    def start(self, y):
        """Cold sites: zero Gaussian sites; the outlier prior's log-odds from the prior alone."""
        sites = _Sites(y, self.l)
        if self.beta:     # ψ̃ᵢ from the prior alone, so that the first cavities see P(z = 1) = ρ̄
            _refine_outlier_prior(sites, self.a0, self.b0, 1.0)
        elif self.robust:     # the exact prior Bern(zᵢ | ρ)
            sites.lam_i[:] = np.log(self.rate) - np.log1p(-self.rate)
        return sites


def _map(pool, fn, items):
    """[fn(x) for x in items], in ``pool``'s threads when there is one.  Every call has ended before
    the first failure (in item order) is raised: a class block still factoring in one thread while
    EP retries with half the damping would have a second thread write the same buffers."""
    if pool is None:
        return [fn(x) for x in items]
    futures = [pool.submit(fn, x) for x in items]
    wait(futures)
    return [f.result() for f in futures]


def _refactor(blocks, sites, single, pool):
    """Every class's marginal means and variances (n, l) at ``sites``; raises
    NotPositiveDefiniteError when a class covariance would not be positive definite."""
    tau, eta = sites.class_sites()
    out = _map(pool, lambda k: blocks[k].marginals(tau[:, k], eta[:, k], single), range(len(blocks)))
    return np.column_stack([m for m, _ in out]), np.column_stack([v for _, v in out])


def _refactor_valid(blocks, sites, single, pool, model):
    """:func:`_refactor` of a state inside EP's domain; NotPositiveDefiniteError otherwise."""
    why = model.domain_error(sites)
    if why is not None:
        raise NotPositiveDefiniteError(why)
    return _refactor(blocks, sites, single, pool)


def _remean(blocks, sites, pool):
    """Means for new site locations at the precisions of the last refactorisation (O(n²) each)."""
    _, eta = sites.class_sites()
    return np.column_stack(_map(pool, lambda k: blocks[k].mean(eta[:, k]), range(len(blocks))))


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


def _refine(sites, means, varis, prior_sd, damping, model, fixed_precisions):
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
                            new.lam_i, means, varis, prior_sd, float(damping), model.robust,
                            float(model.log_c), bool(fixed_precisions))     # the ψ̃ᵢₖ, typed loop
    if model.beta:
        e = damping
        before = expit(new.z_log_odds())
        a, b = model.beta_posterior(new)
        _refine_outlier_prior(new, a, b, e)
        # the ψ̃ᵢ's undamped step in P(zᵢ = 1)
        mismatch = max(mismatch, float(np.max(np.abs(expit(new.z_log_odds()) - before))) / e)
    return new, mismatch


def _location_sweeps(blocks, sites, means, varis, prior_sd, model, tol, outer, pool):
    """The inner loop: Anderson-accelerated refinements at fixed site precisions (O(n²) per class
    each).  Returns (sites, means, number of sweeps); the variances do not change.

    The sweeps may pass through states where a ψ̃ᵢ's cavity Beta is improper: the sequential ψ̃ᵢ
    refinement at full step can move Q's Beta past an earlier point's site, and that point's
    refinement then waits until its cavity is proper again.  They must keep every site finite and
    Q's Beta proper: an accelerated step that does not is replaced by the plain one, and the loop
    stops if that does not either.  The state returned, the best one seen, lies in EP's domain (the
    state the loop starts from does)."""
    accel, best, keep, sweeps, n = _Anderson(ANDERSON_MEMORY), np.inf, None, 0, sites.n
    for _ in range(MAX_LOCATION_SWEEPS):
        new, res = _refine(sites, means, varis, prior_sd, 1.0, model, True)
        if keep is None or (res < keep[0] and model.beta_error(sites.alpha, sites.beta) is None):
            keep = (res, sites, means)
        if res < max(tol, LOCATION_FRACTION * outer) or res > 10.0 * keep[0]:
            break
        if res > 2.0 * best:           # the iteration left Anderson's linear regime: start afresh
            accel.reset()
        best = min(best, res)
        plain = new.locations()
        step = accel.step(sites.locations(), plain, _location_weights(sites, varis, prior_sd, model))
        if model.locations_error(step, n) is not None:
            accel.reset()
            if model.locations_error(plain, n) is not None:
                break
            step = plain
        sites = sites.with_locations(step)
        means = _remean(blocks, sites, pool)
        sweeps += 1
    else:
        res = _refine(sites, means, varis, prior_sd, 1.0, model, True)[1]
        if res < keep[0] and model.beta_error(sites.alpha, sites.beta) is None:
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


def _site_weights(sites, varis, prior_sd, model):
    """Scales of :meth:`_Sites.vector`: a precision change Δτ moves its marginal variance by v² Δτ
    (over the prior variance), and the locations are scaled as in :func:`_location_weights`."""
    o, rows = sites.other, np.arange(sites.n)
    rel = (varis / prior_sd) ** 2
    v_y = np.broadcast_to(rel[rows, sites.y][:, None], o.shape)[o]
    return np.concatenate([v_y, rel[o], _location_weights(sites, varis, prior_sd, model)])


def _location_weights(sites, varis, prior_sd, model):
    """Scales of :meth:`_Sites.locations` that make a unit change of each a comparable change of Q:
    a location moves its marginal mean by v (over the prior sd), a log-odds moves P(z) by p(1 − p),
    the Beta exponents move Q's Beta by 1/(a + b)."""
    o, rows = sites.other, np.arange(sites.n)
    v_y = np.broadcast_to((varis[rows, sites.y] / prior_sd[rows, sites.y])[:, None], o.shape)[o]
    v_k = (varis / prior_sd)[o]
    p = expit(sites.z_log_odds())
    pq = p * (1.0 - p)
    a, b = model.beta_posterior(sites)
    beta_w = np.full(sites.n, 1.0 / (a + b))
    return np.concatenate([v_y, v_k, np.broadcast_to(pq[:, None], o.shape)[o], beta_w, beta_w, pq])


def _run(blocks, y, model, max_iter, tol, damping, min_damping, init_sites, pool, memory, warn=True):
    """rmgpc_ep's iteration from ``init_sites`` (None: cold).  Raises NotPositiveDefiniteError when
    it finds no valid state (the warm start's sites do not fit, or the damping runs out)."""
    n, l = y.shape[0], model.l
    prior_sd = np.sqrt(np.column_stack([b.k_diag for b in blocks]))
    history, converged, sweeps, n_factor = [], False, 0, 0
    if init_sites is not None:     # a warm start: refactor its sites in double precision
        sites = init_sites.copy()
        n_factor += 1
        means, varis = _refactor_valid(blocks, sites, False, pool, model)
        single = False
    else:
        sites = model.start(y)
        means, varis, single = np.zeros((n, l)), prior_sd ** 2, True
    factored = not single
    it, rejected, pause, streak, refined, mismatch = 0, [], 0, 0, None, np.inf
    accel = _Anderson(memory)
    for it in range(1, max_iter + 1):
        new, mismatch = refined or _refine(sites, means, varis, prior_sd, damping, model, False)
        refined = None
        if mismatch < tol and factored and not single:
            converged = True
            break
        single = single and mismatch > SINGLE_ABOVE
        if memory and pause == 0:
            # Anderson's extrapolation of the damped steps, kept only if it stays in EP's domain
            # and lowers the mismatch
            step = accel.step(sites.vector(), new.vector(),
                              _site_weights(sites, varis, prior_sd, model))
            if len(accel) > 1:
                n_factor += 1
                try:
                    trial = _try_step(blocks, sites.with_vector(step), single, pool, prior_sd,
                                      damping, model, tol, mismatch)
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
            try:       # definite or the step leaves EP's domain
                n_factor += 1
                means, varis = _refactor_valid(blocks, new, single, pool, model)
                sites, factored = new, True
                break
            except NotPositiveDefiniteError as err:
                damping *= 0.5
                history.append((it, damping))
                accel.reset()
                if damping < min_damping:
                    raise NotPositiveDefiniteError(
                        f"EP could not keep a valid state even with damping {damping:g} ({err})"
                    ) from None
                new, mismatch = _refine(sites, means, varis, prior_sd, damping, model, False)
        sites, means, done = _location_sweeps(blocks, sites, means, varis, prior_sd, model, tol,
                                              mismatch, pool)
        sweeps += done
    if not converged:
        if warn:
            warnings.warn(f"RMGPC EP did not converge in {max_iter} iterations (largest moment "
                          f"mismatch {mismatch:.3g} > tol {tol:g}); features on very different "
                          f"scales are a common cause: standardise X (e.g. scikit-learn's "
                          f"StandardScaler) or give the kernel one length scale per feature",
                          ConvergenceWarning, stacklevel=4)
        if single or not factored:
            n_factor += 1
            means, varis = _refactor(blocks, sites, False, pool)
    tau, eta = sites.class_sites()
    post = [blk.posterior(eta[:, k]) for k, blk in enumerate(blocks)]
    means = np.column_stack([p.mean for p in post])
    a, b = model.beta_posterior(sites) if model.beta else (model.a0, model.b0)
    log_z = _log_evidence(sites, post, means, varis, a, b, model)
    p_out = expit(sites.z_log_odds()) if model.robust else np.zeros(n)
    return MultiClassEPResult(classes=post, outlier_probability=p_out, a=a, b=b, log_evidence=log_z,
                              n_iter=it, converged=converged, damping=damping,
                              n_location_sweeps=sweeps, damping_history=history,
                              robust=model.robust, rate=model.rate, sites=sites,
                              n_refactorisations=n_factor, rejected_steps=rejected)


def _checked(res, model=None):
    """``res`` if it lies in EP's domain, else _OutsideDomain: a finite log evidence ≤ 0 (the
    argmax likelihood, with or without outliers, is a probability of the labels, so EP's
    approximation (16) of log p(y) is ≤ 0 up to the rounding ``_LOG_EVIDENCE_SLACK`` of the binary
    engine's check), ρ̄ in (0, 1), outlier probabilities in [0, 1], finite class means, and with
    ``model`` sites in its domain (:meth:`_Model.domain_error`)."""
    why = None if model is None else model.domain_error(res.sites)
    if why is not None:
        raise _OutsideDomain(why)
    if not np.isfinite(res.log_evidence):
        raise _OutsideDomain(f"the log evidence is {res.log_evidence}")
    if res.log_evidence > _LOG_EVIDENCE_SLACK:
        raise _OutsideDomain(f"impossible log evidence {res.log_evidence:.6g} (a log probability of "
                             f"the labels is <= 0, up to rounding {_LOG_EVIDENCE_SLACK:g})")
    rho = res.rho_mean
    if res.robust and not 0.0 < rho < 1.0:
        raise _OutsideDomain(f"the mean outlier rate {rho:.6g} is not in (0, 1)")
    p = res.outlier_probability
    if not np.all((p >= 0.0) & (p <= 1.0)):
        raise _OutsideDomain("an outlier probability is not in [0, 1]")
    if not all(np.all(np.isfinite(c.mean)) for c in res.classes):
        raise _OutsideDomain("a class mean is not finite")
    return res


def _try_step(blocks, sites, single, pool, prior_sd, damping, model, tol, outer):
    """Refactor at ``sites``, settle the locations, and refine: (sites, means, varis, sweeps,
    (refined sites, mismatch)).  Raises NotPositiveDefiniteError when ``sites`` give no Gaussian or
    lie outside EP's domain."""
    means, varis = _refactor_valid(blocks, sites, single, pool, model)
    sites, means, done = _location_sweeps(blocks, sites, means, varis, prior_sd, model, tol, outer,
                                          pool)
    refined = _refine(sites, means, varis, prior_sd, damping, model, False)
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


def _log_sigmoids(lam):
    """(log σ(λ), log σ(−λ)) elementwise."""
    return -softplus(-lam), -softplus(lam)


def _log_evidence(sites, post, means, varis, a, b, model):
    """log Z of RMGPC eq. (16)-(17), from the converged sites.

    log Z = Σ_k [½ vᵏᵀ μ_k − ½ log|I + Λᵏ K_k|] + Σ log s̃ᵢₖ + Σ log s̃ᵢ
            + log B(a, b) − log B(a₀, b₀) + Σᵢ log Dᵢ,
    with Dᵢ = Π σ(λ) + Π σ(−λ) over ψ̃ᵢ's and the ψ̃ᵢₖ's Bernoulli factors, and each log s̃ the log
    tilted mass minus the log mass of the site times its cavity (so that Z is the integral of the
    product of the scaled sites).  The paper's C_k − Σ τ terms are the same Gaussian masses written
    with unnormalised site Gaussians.  With a fixed rate ρ the prior Bern(zᵢ | ρ) takes ψ̃ᵢ's place
    exactly (λᵢ = logit ρ, no scale s̃ᵢ, no Beta terms; docs/derivations-rmgpc.md).  Raises
    NotPositiveDefiniteError or _OutsideDomain when a term has no value.
    """
    other = sites.other
    log_z = sum(0.5 * float(p.site_location @ p.mean) - 0.5 * p.log_det_B for p in post)
    ok, m_t, v_t, m_o, v_o = _cavities(sites, means, varis)
    if not np.all(ok == other):
        raise NotPositiveDefiniteError("a cavity variance is not positive at the EP fixed point")
    m_t, v_t, m_o, v_o, lam = m_t[other], v_t[other], m_o[other], v_o[other], sites.lam[other]
    if model.robust:
        lz_cav = (sites.z_log_odds()[:, None] - sites.lam)[other]
    else:
        lz_cav = np.full(lam.shape, -np.inf)
    mom, bad = pair_moments(m_t, v_t, m_o, v_o, lz_cav, model.log_c)
    if bad >= 0:
        raise _OutsideDomain("a tilted distribution of the argmax likelihood has no finite mass")
    log_site = (_log_gauss_site_mass(sites.tau_t[other], sites.eta_t[other], m_t, v_t)
                + _log_gauss_site_mass(sites.tau_o[other], sites.eta_o[other], m_o, v_o))
    if model.robust:
        # Bernoulli site times Bernoulli cavity: σ(λ)p + σ(−λ)(1 − p), in logs
        (s1, s0), (p1, p0) = _log_sigmoids(lam), _log_sigmoids(lz_cav)
        log_site = log_site + np.logaddexp(s1 + p1, s0 + p0)
    log_z += float(np.sum(mom["log_z"] - log_site))
    if model.robust:
        # log Dᵢ: the Bernoulli factors' product summed over zᵢ (no factor at k = yᵢ)
        s1, s0 = _log_sigmoids(sites.lam)
        log_s1 = np.sum(np.where(other, s1, 0.0), axis=1)
        log_s0 = np.sum(np.where(other, s0, 0.0), axis=1)
        i1, i0 = _log_sigmoids(sites.lam_i)
        log_z += float(np.sum(np.logaddexp(log_s1 + i1, log_s0 + i0)))
    if model.beta:
        log_z += betaln(a, b) - betaln(model.a0, model.b0)
        lp1, lp0 = _log_sigmoids(sites.lam.sum(axis=1))
        a_c, b_c = a - sites.alpha, b - sites.beta
        log_zi = np.logaddexp(lp1 + np.log(a_c), lp0 + np.log(b_c)) - np.log(a_c + b_c)
        i1, i0 = _log_sigmoids(sites.lam_i)
        log_site_i = betaln(a, b) - betaln(a_c, b_c) + np.logaddexp(i1 + lp1, i0 + lp0)
        log_z += float(np.sum(log_zi - log_site_i))
    return log_z
