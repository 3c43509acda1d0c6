"""Laplace approximation (Rasmussen & Williams 2006, Algorithms 3.1 and 5.1; NR slides eq. (9)-(10)).

q(f) = N(f̂, (K⁻¹ + W)⁻¹) at the mode f̂ of the log posterior
Ψ(f) = log p(y|f) − ½ (f − m0)ᵀ K⁻¹ (f − m0), with W = −∇∇ log p(y|f̂).  As a site posterior its sites
are τ = W and ν = W f̂ + ∇ log p(y|f̂) (a Newton step at the mode, DESIGN.md).

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
from scipy.linalg import blas, lapack

from .._linalg import cho_inverse_lower, cholesky_lower
from ..exceptions import ConvergenceWarning
from ..posterior import SitePosterior
from ._result import InferenceResult

DEFAULT_MAX_ITER = 100
DEFAULT_TOL = 1e-10
MAX_HALVINGS = 30
#: refactor the Newton matrix when the gradient norm fell by less than this factor in a step
REFACTOR_RATE = 0.1


def _factor(K, W):
    """W^½ and the float64 Cholesky factor of B = I + W^½ K W^½."""
    sW = np.sqrt(W)
    B = K * sW[:, None]
    B *= sW
    B.flat[:: K.shape[0] + 1] += 1.0
    L, _ = cholesky_lower(B, name="B = I + W^1/2 K W^1/2", overwrite=True)
    return sW, L


class _NewtonMatrix:
    """Solves with B = I + W^½ K W^½ for the Newton steps, factored in single precision.

    The Newton steps only need B⁻¹ to a few digits: the residual that drives each step is formed in
    double precision, so a single-precision factor (half the cost of dpotrf) changes the rate of
    convergence, not the fixed point (mixed-precision iterative refinement).  Falls back to double
    precision when B is too ill-conditioned to factor in single.
    """

    def __init__(self, K, K32, W):
        self.W = W
        self.sW = np.sqrt(W)
        s32 = self.sW.astype(np.float32)
        B = K32 * s32[:, None]
        B *= s32
        B.flat[:: K.shape[0] + 1] += 1.0
        c, info = lapack.spotrf(B.T, lower=False, clean=False, overwrite_a=True)
        if info == 0:
            self.c, self.potrs = c, lapack.spotrs
        else:
            _, L = _factor(K, W)
            self.c, self.potrs = L.T, lapack.dpotrs

    def step(self, K, r):
        """Newton step δa = (I + W K)⁻¹ r = r − W^½ B⁻¹ W^½ K r for the gradient r = ∇ log p − a.

        (R&W Alg. 3.1 lines 4-8 written as a correction, so that the single-precision error of the
        solve shrinks with r instead of limiting the accuracy of a.)
        """
        rhs = self.sW * (K @ r)
        x, info = self.potrs(self.c, rhs.astype(self.c.dtype), lower=False)
        if info != 0:  # pragma: no cover
            raise RuntimeError(f"potrs failed with info={info}")
        return r - self.sW * x


def run(K, y, likelihood, prior_mean, *, schedule=None, max_iter=None, tol=None, init=None):
    """Newton's method for the mode of Ψ, with step halving when Ψ does not increase.

    The Newton matrix is factored in single precision and kept while the gradient of Ψ keeps falling
    fast (a chord step); the mode is then refined in double precision, and B is factored once more in
    double precision at the mode for the evidence and its gradient.  Convergence: a step from a fresh
    factor changes Ψ by less than ``tol``, or a chord step does and the bound ½ λ_max(K) ‖∇Ψ‖² on
    what a further Newton step could gain is below ``tol`` too.

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
    m0 = prior_mean
    K32 = K.astype(np.float32)
    lam_max = float(np.trace(K))  # λ_max(K) ≤ tr K for a positive semi-definite K

    a = np.zeros(n)
    if init is not None and init.method == "laplace" and init.info["a"].shape == (n,):
        a = init.info["a"].copy()
    f = m0 + K @ a
    lp, d1, d2, d3 = likelihood.log_prob_derivatives(y, f)
    psi = -0.5 * a @ (f - m0) + lp.sum()
    grad_norm = np.linalg.norm(d1 - a)
    newton = None
    converged = False
    n_iter = 0
    change = np.inf
    for n_iter in range(1, max_iter + 1):
        fresh = newton is None
        if fresh:
            newton = _NewtonMatrix(K, K32, -d2)
        step = newton.step(K, d1 - a)
        for _ in range(MAX_HALVINGS + 1):
            a_try = a + step
            f_try = m0 + K @ a_try
            lp_t, d1_t, d2_t, d3_t = likelihood.log_prob_derivatives(y, f_try)
            psi_try = -0.5 * a_try @ (f_try - m0) + lp_t.sum()
            if psi_try >= psi - 1e-12 * abs(psi):
                break
            step *= 0.5
        change = psi_try - psi
        a, f, psi = a_try, f_try, psi_try
        lp, d1, d2, d3 = lp_t, d1_t, d2_t, d3_t
        new_norm = np.linalg.norm(d1 - a)   # ∇Ψ = ∇ log p − K⁻¹(f − m0)
        # a step from a fresh factor that gains < tol is a converged Newton iteration (as in
        # scikit-learn); after a chord step the bound ½ λ_max(K) ‖∇Ψ‖² must also be below tol
        if abs(change) < tol and (fresh or 0.5 * lam_max * new_norm**2 < tol):
            converged = True
            break
        if new_norm > REFACTOR_RATE * grad_norm or abs(change) < tol:
            newton = None
        grad_norm = new_norm
    if not converged:
        warnings.warn(f"Laplace: Newton's method did not converge in {max_iter} iterations "
                      f"(last change of Ψ {change:.3g} > tol {tol:g})", ConvergenceWarning, stacklevel=3)

    W = -d2
    sW, L = _factor(K, W)
    log_evidence = psi - float(np.sum(np.log(np.diag(L))))
    posterior = _LaplacePosterior(K, W, W * f + d1, m0, sW, L, a, f)

    gradient_matrix = functools.partial(_gradient_matrix, K, W, sW, L, a, d1, d3)
    return InferenceResult("laplace", None, likelihood, posterior, log_evidence, n_iter, converged,
                           gradient_matrix, info={"a": a, "f": f})


class _LaplacePosterior(SitePosterior):
    """SitePosterior whose factor, α and mean come from the Newton iteration instead of a refactor."""

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


def _gradient_matrix(K, W, sW, L, a, g, d3):
    """M of the module docstring; O(n³) through one dpotri, no n x n x p tensor."""
    n = K.shape[0]
    Binv = cho_inverse_lower(L)
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
        RKc = sW[:, None] * (Binv @ (sW[:, None] * Kc))
        diag_sigma[idx] = K[idx, idx] - np.einsum("ij,ij->j", Kc, RKc)
    s2 = 0.5 * diag_sigma * d3
    M = Binv                       # becomes R, then M, in place
    M *= sW[:, None]
    M *= sW
    u = s2 - M @ (K @ s2)          # (I − R K) s2
    M *= -0.5
    Mt = M.T                       # Fortran view of the same memory for BLAS rank-one updates
    for x, z in ((a, a), (u, g), (g, u)):
        Mt = blas.dger(0.5, x, z, a=Mt, overwrite_a=True)
    return Mt.T
