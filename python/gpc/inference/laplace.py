"""Laplace approximation (Rasmussen & Williams 2006, Algorithms 3.1 and 5.1; NR slides eq. (9)-(10)).

q(f) = N(f̂, (K⁻¹ + W)⁻¹) at the mode f̂ of the log posterior
Ψ(f) = log p(y|f) − ½ (f − m0)ᵀ K⁻¹ (f − m0), with W = −∇∇ log p(y|f̂).  As a site posterior its sites
are τ = W and ν = W f̂ + ∇ log p(y|f̂) (a Newton step at the mode, docs/architecture.md).

Evidence (R&W eq. (3.32)):  log q(y|X,θ) = −½ aᵀ(f̂ − m0) + log p(y|f̂) − ½ log|B|,  B = I + W^½ K W^½,
f̂ = m0 + K a.  Its gradient (R&W Alg. 5.1, eq. (5.22)-(5.23)) has an explicit part and an implicit part
through f̂(θ); both contract against ∂K/∂θ_k:

    ∂ log q / ∂θ_k = Σ_ij M_ij ∂K_ij/∂θ_k,
    M = ½ (a aᵀ − R) + ½ (u gᵀ + g uᵀ),   R = W^½ B⁻¹ W^½,  g = ∇ log p(y|f̂),
    u = (I − R K) s2,   s2 = ½ diag(Σ) ∇³ log p(y|f̂),   Σ = (K⁻¹ + W)⁻¹.

(s2 is ∂(−½ log|B|)/∂f̂ = ½ Σ_ii ∂³ log p_i: ∂W_ii/∂f_i = −∂³ log p_i.  Some printings of Alg. 5.1 carry
the opposite sign; the finite-difference tests decide.)
"""

import functools
import warnings

import numpy as np
from scipy.linalg import blas

from .. import _dense, _lapack
from .._parallel import over_rows
from .._linalg import anderson_correction, cho_solve_lower, cholesky_lower
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from ..posterior import SitePosterior
from ._result import InferenceResult

DEFAULT_MAX_ITER = 100
DEFAULT_TOL = 1e-10
MAX_HALVINGS = 30
#: refactor the Newton matrix when the gradient norm fell by less than this factor in a step.  A
#: chord step costs O(n²), a refactorisation O(n³): below REFACTOR_LARGE_N a refactorisation costs
#: a few chord steps and Newton refactors unless a step gained 10x; above it, chord steps continue
#: while they gain 2x (n = 2000: 2 float32 factorisations instead of 4, measured).
REFACTOR_RATE = 0.1
REFACTOR_RATE_LARGE = 0.5
REFACTOR_LARGE_N = 1000
#: a cold start at n >= SUBSET_MIN_N begins from the mode on every SUBSET_STRIDE-th point
SUBSET_MIN_N = 1000
SUBSET_STRIDE = 4
#: at n >= REFACTOR_LARGE_N, chord steps of one factor are Anderson-accelerated over this many
#: previous steps (n = 2000, before the Nyström matrix: one float32 factorisation instead of two).
#: Below, Newton refactors nearly every step and ends quadratically, past tol.
ANDERSON_WINDOW = 5
#: at n >= REFACTOR_LARGE_N the first Newton matrix is a Nyström approximation on every
#: NYSTROM_STRIDE-th point (costs 3/stride² of a dpotrf); Newton moves to the factored B when its
#: steps stop gaining REFACTOR_RATE_LARGE
NYSTROM_STRIDE = 8


def _factor(K, W):
    """W^½ and the float64 Cholesky factor of B = I + W^½ K W^½ (lower, zero upper triangle)."""
    sW = np.sqrt(W)

    def build():
        B = np.empty_like(K)
        over_rows(_dense.fill_b, len(sW), K, sW, B)
        return B

    L, _ = cholesky_lower(build(), name="B = I + W^1/2 K W^1/2", overwrite=True, rebuild=build)
    return sW, L


class _NewtonMatrix:
    """Solves with B = I + W^½ K W^½ for the Newton steps, factored in single precision.

    The Newton steps only need B⁻¹ to a few digits: the residual that drives each step is formed in
    double precision, so a single-precision factor (half the cost of dpotrf) changes the rate of
    convergence, not the fixed point (mixed-precision iterative refinement).  B is written into
    ``buffer`` (float32, reused across refactorisations) by one pass over K; falls back to double
    precision when B is too ill-conditioned to factor in single.
    """

    def __init__(self, K, W, buffer):
        self.W = W
        self.sW = np.sqrt(W)
        over_rows(_dense.fill_b, len(W), K, self.sW, buffer)
        info = _lapack.cholesky_in_place(buffer)
        self.L = buffer if info == 0 else _factor(K, W)[1]

    def step(self, r, Kr):
        """Newton step δa = (I + W K)⁻¹ r = r − W^½ B⁻¹ W^½ K r for the gradient r = ∇ log p − a.

        (R&W Alg. 3.1 lines 4-8 written as a correction, so that the single-precision error of the
        solve shrinks with r instead of limiting the accuracy of a.)  ``Kr`` is K r.
        """
        x = (self.sW * Kr).astype(self.L.dtype)
        _lapack.cholesky_solve_in_place(self.L, x)
        return r - self.sW * x


class _NystromMatrix:
    """Newton steps with K replaced by its Nyström approximation K̃ = K_nS K_SS⁻¹ K_Sn on the subset
    S = every NYSTROM_STRIDE-th point (Williams & Seeger 2001), by the Woodbury identity

        (I + W K̃)⁻¹ r = r − W K_nS (K_SS + K_Sn W K_nS)⁻¹ K_Sn r,

    an m × m factor for m = n / stride.  Like the single-precision factor, it only sets the rate of
    the chord iteration: the residual r is exact, so the fixed point is the mode of the full problem.
    For smooth kernels the rate matches the exact factor's (n = 2000, ℓ = 3: 9-10 steps against 9)
    at 3/stride² of a dpotrf instead of half of one.
    """

    def __init__(self, K, W):
        S = np.arange(0, K.shape[0], NYSTROM_STRIDE)
        self.W = W
        self.K_Sn = K[S]                                   # m × n rows of K: K_Sn = K_nSᵀ
        # K_Sn W K_nS (upper triangle), from the Fortran-ordered view of K_Sn W^½: no copy
        C = blas.dsyrk(1.0, (self.K_Sn * np.sqrt(W)).T, trans=1)
        C = C.T + K[np.ix_(S, S)]                          # its lower triangle, + K_SS
        self.L = cholesky_lower(C, name="K_SS + K_Sn W K_nS")[0]       # jittered if need be

    def step(self, r, Kr):
        """The chord step (I + W K̃)⁻¹ r (``Kr`` is not needed).  Both products by scipy's dgemv on
        the Fortran-ordered view of K_Sn: numpy's ``@`` would wake numpy's own OpenBLAS threads,
        which then spin against scipy's (bench/RESULTS.md measures the difference)."""
        t = cho_solve_lower(self.L, blas.dgemv(1.0, self.K_Sn.T, r, trans=1))
        return r - self.W * blas.dgemv(1.0, self.K_Sn.T, t)


def _newton_matrix(K, W, nystrom, buffer):
    """(Newton matrix, float32 buffer): the Nyström matrix if ``nystrom`` and K_SS + K_Sn W K_nS
    factors (with jitter if need be), else B in single precision in ``buffer`` (allocated on first
    use)."""
    if nystrom:
        try:
            return _NystromMatrix(K, W), buffer
        except NotPositiveDefiniteError:
            pass
    if buffer is None:
        buffer = np.empty(K.shape, dtype=np.float32)
    return _NewtonMatrix(K, W, buffer), buffer


def run(K, y, likelihood, prior_mean, *, schedule=None, max_iter=None, tol=None, init=None):
    """Newton's method for the mode of Ψ, with step halving when Ψ does not increase.

    The Newton matrix is factored in single precision and kept while the gradient of Ψ keeps falling
    fast (a chord step); at n >= REFACTOR_LARGE_N the first one is the Nyström matrix instead
    (``_NystromMatrix``, no O(n³) factor).  The residuals are exact, so the mode is that of the full
    problem, and B is factored once more in double precision at the mode for the evidence and its
    gradient.  Convergence: the last step
    changed Ψ by less than ``tol``, and so would a further Newton step: its gain on the quadratic
    model, ½ rᵀ(K⁻¹ + W)⁻¹r with r = ∇Ψ, is at most ½ rᵀ K r (W ≥ 0), which costs nothing because
    the step needs K r anyway.

    Parameters
    ----------
    init : InferenceResult, optional
        A previous Laplace result (e.g. at nearby hyperparameters): Newton starts from its
        a = K⁻¹(f̂ − m0), i.e. from f = m0 + K a with the new K.

    Returns
    -------
    InferenceResult with ``info["a"]`` (= K⁻¹(f̂ − m0)) and ``info["f"]`` (the mode).
    """
    if not getattr(likelihood, "differentiable", True):
        raise ValueError(
            f"the Laplace approximation needs a likelihood with a useful gradient; the {likelihood.name} "
            "likelihood has zero gradient almost everywhere (PL paper, §I): use method='ep' or 'pl'")
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    tol = DEFAULT_TOL if tol is None else tol
    n = K.shape[0]
    a = None
    if init is not None and init.method == "laplace" and init.info["a"].shape == (n,):
        a = init.info["a"].copy()
    m0 = prior_mean
    a, f, psi, (lp, d1, d2, d3), n_iter, converged = _mode(K, y, likelihood, m0, a, max_iter, tol,
                                                          cold=init is None)
    W = -d2
    sW, L = _factor(K, W)
    log_evidence = psi - float(np.sum(np.log(np.diag(L))))
    posterior = _LaplacePosterior(K, W, W * f + d1, m0, sW, L, a, f)

    gradient_matrix = functools.partial(_gradient_matrix, posterior, d1, d3)
    return InferenceResult("laplace", None, likelihood, posterior, log_evidence, n_iter, converged,
                           gradient_matrix, info={"a": a, "f": f},
                           lower_gradient_matrix=functools.partial(gradient_matrix, lower=True))


def _mode(K, y, likelihood, m0, a, max_iter, tol, cold):
    """Newton's method for the mode of Ψ from a = K⁻¹(f − m0) (None: a cold start), as ``run``
    describes.  Returns (a, f, Ψ, log p(y|f) and its three derivatives, steps, converged); the
    single-precision Newton buffer is gone when it returns."""
    n = K.shape[0]
    buffer = None
    refactor_rate = REFACTOR_RATE_LARGE if n >= REFACTOR_LARGE_N else REFACTOR_RATE
    window = ANDERSON_WINDOW if n >= REFACTOR_LARGE_N else 0

    if a is None:
        a = _subset_start(K, y, likelihood, m0) if n >= SUBSET_MIN_N else np.zeros(n)
    f = m0 + _symv(K, a)
    lp, d1, d2, d3 = likelihood.log_prob_derivatives(y, f)
    psi = -0.5 * a @ (f - m0) + lp.sum()
    if cold and np.any(a):
        lp0 = likelihood.log_prob_derivatives(y, m0)
        if lp0[0].sum() > psi:                     # the subset's start is worse than f = m0
            a, f, psi = np.zeros(n), m0.copy(), lp0[0].sum()
            lp, d1, d2, d3 = lp0
    r = d1 - a                                 # ∇Ψ = ∇ log p − K⁻¹(f − m0)
    grad_norm = np.linalg.norm(r)
    newton = None
    tried_nystrom = False
    converged = False
    change = np.inf
    for n_iter in range(max_iter + 1):          # n_iter: the Newton steps taken so far
        Kr = _symv(K, r)
        if abs(change) < tol and 0.5 * (r @ Kr) < tol:
            converged = True
            break
        if n_iter == max_iter:
            break
        if newton is None:
            newton, buffer = _newton_matrix(K, -d2, window > 0 and not tried_nystrom, buffer)
            tried_nystrom = True
            history = []
        step = newton.step(r, Kr)
        history = (history + [(a, step)])[-(window + 1):]
        # the accelerated step first; if Ψ does not increase, the plain step, then halvings of it
        tries = [_anderson(history, step)] if len(history) > 1 else []
        tries += [step * 0.5 ** h for h in range(MAX_HALVINGS + 1)]
        for k, step_try in enumerate(tries):
            a_try = a + step_try
            f_try = m0 + _symv(K, a_try)
            lp_t, d1_t, d2_t, d3_t = likelihood.log_prob_derivatives(y, f_try)
            psi_try = -0.5 * a_try @ (f_try - m0) + lp_t.sum()
            if psi_try >= psi - 1e-12 * abs(psi):
                break
        if k >= len(tries) - MAX_HALVINGS:          # a halved step: start the history afresh
            history = []
        change = psi_try - psi
        a, f, psi = a_try, f_try, psi_try
        lp, d1, d2, d3 = lp_t, d1_t, d2_t, d3_t
        r = d1 - a
        new_norm = np.linalg.norm(r)
        if new_norm > refactor_rate * grad_norm or abs(change) < tol:
            newton = None
        grad_norm = new_norm
    if not converged:
        warnings.warn(f"Laplace: Newton's method did not converge in {max_iter} iterations "
                      f"(last change of Ψ {change:.3g} > tol {tol:g})", ConvergenceWarning, stacklevel=4)

    return a, f, psi, (lp, d1, d2, d3), n_iter, converged


def _symv(K, v):
    """K v for a symmetric K through dsymv, which reads one triangle: half the memory traffic of
    K @ v, and twice as fast at n = 2000 (these matrix-vector products are memory-bound)."""
    if K.flags.c_contiguous and K.dtype == np.float64:
        return blas.dsymv(1.0, K.T, v, lower=0)      # the F-ordered view of K: no copy
    return K @ v


def _anderson(history, step):
    """Anderson-accelerated chord step from the last (a, step) pairs of one factor (type II).

    The chord iteration a ← a + step(a) converges linearly; with the differences ΔA, ΔS of the last
    iterates and steps, γ = argmin ‖step − ΔS γ‖ and the step becomes step − (ΔA + ΔS) γ.  Falls back
    to the plain step when the least-squares problem is degenerate; the line search still checks Ψ.
    """
    accelerated = step - anderson_correction([a for a, _ in history], [s for _, s in history])
    return accelerated if np.all(np.isfinite(accelerated)) else step


def _subset_start(K, y, likelihood, m0):
    """a₀ for a cold start: the Laplace mode on the subset S = every SUBSET_STRIDE-th point, padded.

    With a₀ = a_S on S and 0 elsewhere, f₀ = m0 + K a₀ = m0 + K[:, S] a_S: the subset's mode where it
    has data, its predictive mean elsewhere.  The subset costs (1/stride)³ of a factorisation per
    Newton step (recursively, so large n gets a cascade of starts), and Newton from f₀ needs fewer
    full-size factorisations than from f = m0 (measured at n = 2000: 3 instead of 5).  Only the
    starting point changes: the mode and everything computed at it are those of the full problem.
    """
    S = np.arange(0, K.shape[0], SUBSET_STRIDE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # the subset's mode only: no factor, evidence or posterior of it
        a_S = _mode(K[np.ix_(S, S)], y[S], likelihood, m0[S], None, DEFAULT_MAX_ITER, 1e-6,
                    cold=True)[0]
    a = np.zeros(K.shape[0])
    a[S] = a_S
    return a


class _LaplacePosterior(SitePosterior):
    """SitePosterior whose factor, α and mean come from the Newton iteration instead of a refactor.

    The evidence gradient inverts the factor in place (saving an n x n copy); ``L`` is then
    recomputed on first use, e.g. when a prediction follows a gradient evaluation.
    """

    def __init__(self, K, W, nu, m0, sW, L, a, f):
        self.K = K
        self.site_precision = W
        self.site_location = nu
        self.prior_mean = m0
        self.sqrt_tau = sW
        self.L = L
        self.alpha = a
        self.mean = f
        self._diag_cov = None
        self._cov = None
        self._B_inv = None

    @property
    def L(self):
        if self._L is None:
            self._L = _factor(self.K, self.site_precision)[1]
        return self._L

    @L.setter
    def L(self, value):
        self._L = value

    def take_factor(self):
        """The Cholesky factor of B, for the caller to overwrite; ``L`` is refactored if needed."""
        L, self._L = self.L, None
        return L


def _gradient_matrix(posterior, g, d3, lower=False):
    """M of the module docstring; O(n³) through one dpotri in place on the posterior's factor,
    no n x n x p tensor.  ``g``, ``d3``: ∇ log p(y|f̂) and ∇³ log p(y|f̂); ``lower``: only M's
    lower triangle is set."""
    K, W, sW, a = posterior.K, posterior.site_precision, posterior.sqrt_tau, posterior.alpha
    n = K.shape[0]
    Binv = posterior.take_factor()  # lower triangle: L, then B⁻¹ (LAPACK 'U' on the Fortran view)
    info = _lapack.cholesky_inverse_in_place(Binv)
    if info != 0:  # pragma: no cover - L is a Cholesky factor
        raise RuntimeError(f"dpotri failed with info={info}")
    diag_Binv = np.diag(Binv).copy()
    # diag Σ = (1 − diag B⁻¹)/W where W is not tiny (Σ = W^-½ (I − B⁻¹) W^-½); the rounding error of
    # 1 − [B⁻¹]_ii is ~1e-13, and it is multiplied by ∂³ log p_i which is O(W_i) for these likelihoods.
    diag_sigma = np.empty(n)
    ok = W > 1e-8
    diag_sigma[ok] = (1.0 - diag_Binv[ok]) / W[ok]
    if not np.all(ok):
        # exact for the few saturated points: Σ e_i = K e_i − K R K e_i
        idx = np.flatnonzero(~ok)
        Kc = K[:, idx]
        RKc = sW[:, None] * blas.dsymm(1.0, Binv.T, sW[:, None] * Kc, side=0, lower=0)
        diag_sigma[idx] = K[idx, idx] - np.einsum("ij,ij->j", Kc, RKc)
    s2 = 0.5 * diag_sigma * d3
    u = s2 - sW * blas.dsymv(1.0, Binv.T, sW * _symv(K, s2), lower=0)      # (I − R K) s2
    over_rows(_dense.gaussian_site_gradient_matrix, n, Binv, sW, a, u, g, not lower)
    return Binv
