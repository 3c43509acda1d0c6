"""KL minimisation (Opper & Archambeau 2009; NR slides eq. (14)-(17)).

The Gaussian q(f) = N(m, V) closest to the posterior in KL(q‖p) maximises the lower bound (NR eq. (9))

    ln Z_B = Σ_i E_q[ln p(y_i|f_i)] − KL(q ‖ N(m0, K)) ≤ ln Z.

At its stationary point (NR eq. (16)-(17)) the O(n²) parameters (m, V) collapse to O(n) ones:

    m = m0 + K α,      V = (K⁻¹ + W)⁻¹,   W = −2Λ = diag(w),                 NR eq. (14)
    α = ∂E/∂m,         Λ = ∂E/∂V  (diagonal: Λ_ii = ∂E_i/∂V_ii),            NR eq. (17)

with E = Σ_i E_i(m_i, V_ii), E_i = E_{N(m_i, V_ii)}[ln p(y_i|f_i)].  We optimise the bound over
(α, w) directly.  With S = W^½ and B = I + S K S (R&W §3.6, never K⁻¹):

    KL(q ‖ prior) = ½ [αᵀKα − wᵀv + ln|B|],   v = diag V           (tr(K⁻¹V) = n − wᵀv)
    ln Z_B(α, w) = Σ_i E_i(m_i, v_i) − ½ αᵀKα + ½ wᵀv − ½ ln|B|.

Scheme (docs/derivations-approx.md §1): from the current (m, v) take the fixed-point target
w* = −2 ∂E/∂v (≥ 0 for log-concave likelihoods) and the Newton step for α at curvature W* (since
∂²E_i/∂m_i² = 2 ∂E_i/∂v_i, this is the exact Newton step of the α-block, a Laplace-like step with the
expected derivatives).  Both parts are ascent directions (the w-gradient is ½ (V∘V)(w* − w), V∘V
positive definite), so a backtracking line search on ln Z_B along (α* − α, w* − w) increases the bound
monotonically; this converges where a plain fixed-point iteration may oscillate.

Gradient (derivations §1): the bound is stationary in (α, w), so d ln Z_B/dθ is its partial derivative
at fixed (α, w):

    M = ½ (g αᵀ + α gᵀ) − ½ ααᵀ − ½ R + Aᵀ diag(δ) A,
    R = S B⁻¹ S,  A = I − K R = (I + K W)⁻¹,  g = ∂E/∂m,  δ = ∂E/∂v + ½ w   (δ → 0, g → α at the optimum)
"""

import functools
import warnings

import numpy as np

from .._linalg import cho_inverse_lower, cho_solve_lower, cholesky_lower, log_det_from_cholesky, solve_lower
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError, NumericalError
from ..posterior import SitePosterior
from ._result import InferenceResult

DEFAULT_MAX_ITER = 200
DEFAULT_TOL = 1e-9
MAX_HALVINGS = 40


def _check_likelihood(likelihood, method):
    if not getattr(likelihood, "differentiable", True) or not getattr(likelihood, "log_concave", True):
        raise ValueError(
            f"method {method!r} needs a log-concave likelihood with finite expected log-likelihood "
            f"(probit, logit); the {likelihood.name} likelihood has E_q[ln p] = -inf (heaviside) or is "
            "not log-concave (noisy threshold): use method='ep', 'pl' or 'online'")


class _State:
    """Everything the bound needs at one (α, w)."""

    __slots__ = ("alpha", "w", "sW", "L", "m", "v", "E", "gm", "gv", "bound")

    def __init__(self, K, y, likelihood, m0, alpha, w):
        self.alpha, self.w = alpha, w
        self.sW = sW = np.sqrt(w)
        B = K * sW[:, None]
        B *= sW
        B.flat[:: K.shape[0] + 1] += 1.0
        self.L, _ = cholesky_lower(B, name="B = I + W^1/2 K W^1/2", overwrite=True)
        Vh = solve_lower(self.L, sW[:, None] * K)          # L⁻¹ S K: V = K − Vhᵀ Vh
        self.v = np.maximum(np.diag(K) - np.einsum("ij,ij->j", Vh, Vh), 1e-300)
        self.m = m0 + K @ alpha
        E, self.gm, self.gv = likelihood.expected_log_prob(y, self.m, self.v)
        self.E = float(np.sum(E))
        # ln Z_B(α, w) of the module docstring
        self.bound = (self.E - 0.5 * alpha @ (self.m - m0) + 0.5 * w @ self.v
                      - 0.5 * log_det_from_cholesky(self.L))


def run(K, y, likelihood, prior_mean, *, schedule=None, max_iter=None, tol=None, alpha_init=None,
        w_init=None, init=None):
    """Maximise the KL lower bound ln Z_B over (α, w) by line-searched Newton / fixed-point steps.

    Parameters
    ----------
    K, y, likelihood, prior_mean, schedule, max_iter, tol
        As for :func:`gpc.inference.infer`.  ``max_iter`` (default 200) counts outer steps; ``tol``
        (default 1e-9) applies to the increase of ln Z_B and to the step in (α, w).
    alpha_init, w_init : ndarray (n,), optional
        Warm start (e.g. the previous optimum when θ changes a little).  By default α = 0 and w is the
        fixed-point target at the prior marginals.
    init : InferenceResult, optional
        A previous KL result (the optimiser passes it): its (α, w) start the iteration.

    Returns
    -------
    InferenceResult
        ``log_evidence`` is ln Z_B (a lower bound on ln Z); ``posterior`` is the SitePosterior with
        τ = w, ν = w ∘ m + α (so that its mean is m = m0 + Kα); ``info`` holds ``alpha``, ``w``.
    """
    _check_likelihood(likelihood, "kl")
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    tol = DEFAULT_TOL if tol is None else tol
    n = K.shape[0]
    m0 = prior_mean
    if init is not None and init.method == "kl" and alpha_init is None and w_init is None:
        alpha_init, w_init = init.info["alpha"], init.info["w"]
    alpha = np.zeros(n) if alpha_init is None else np.array(alpha_init, dtype=np.float64)
    if w_init is None:
        _, _, gv0 = likelihood.expected_log_prob(y, m0 + K @ alpha, np.diag(K).copy())
        w = np.maximum(-2.0 * gv0, 0.0)
    else:
        w = np.maximum(np.array(w_init, dtype=np.float64), 0.0)
    st = _State(K, y, likelihood, m0, alpha, w)
    converged = False
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        # NR eq. (17): fixed-point target W* = −2Λ, Λ = ∂E/∂V
        w_star = np.maximum(-2.0 * st.gv, 0.0)
        # Newton step of the α-block at curvature W* (Laplace-like step with expected derivatives)
        sWs = np.sqrt(w_star)
        Bs = K * sWs[:, None]
        Bs *= sWs
        Bs.flat[:: n + 1] += 1.0
        Ls, _ = cholesky_lower(Bs, name="B* = I + W*^1/2 K W*^1/2", overwrite=True)
        b = w_star * (st.m - m0) + st.gm
        alpha_star = b - sWs * cho_solve_lower(Ls, sWs * (K @ b))
        d_alpha = alpha_star - st.alpha
        d_w = w_star - st.w
        step = 1.0
        for _ in range(MAX_HALVINGS + 1):
            trial = _trial_state(K, y, likelihood, m0, st.alpha + step * d_alpha, st.w + step * d_w)
            if trial is not None and trial.bound >= st.bound - 1e-13 * abs(st.bound):
                break
            step *= 0.5
        else:
            trial = st  # no ascent along the direction: we are at the optimum to rounding
        change = trial.bound - st.bound
        move = step * max(np.max(np.abs(d_alpha)), np.max(np.abs(d_w)))
        st = trial
        if abs(change) < tol and move < np.sqrt(tol):
            converged = True
            break
    if not converged:
        warnings.warn(f"KL: the bound did not converge in {max_iter} iterations (last change "
                      f"{change:.3g}, step {move:.3g}; tol {tol:g})", ConvergenceWarning, stacklevel=3)

    # As a site posterior: τ = w and ν chosen so that the mean is m0 + Kα: ν − τ m0 = (I + T K) α.
    tau = st.w
    nu = tau * st.m + st.alpha
    posterior = SitePosterior(K, tau, nu, m0)

    return InferenceResult("kl", None, likelihood, posterior, float(st.bound), n_iter, converged,
                           functools.partial(_gradient_matrix, K, st),
                           info={"alpha": st.alpha, "w": st.w, "E": st.E})


def _trial_state(K, y, likelihood, m0, alpha, w):
    """The state at a trial step, or None where the step left the region in which the bound is
    finite (an expected log-likelihood that underflows, a B that cannot be factored): such a step
    has failed like one that lowers the bound, and the line search halves it."""
    try:
        trial = _State(K, y, likelihood, m0, alpha, w)
    except (NumericalError, NotPositiveDefiniteError):
        return None
    return trial if np.isfinite(trial.bound) else None


def _gradient_matrix(K, st):
    """M of the module docstring (partial derivative of ln Z_B in K at fixed (α, w)); O(n³)."""
    n = K.shape[0]
    sW = st.sW
    R = cho_inverse_lower(st.L)
    R *= sW[:, None]
    R *= sW
    a, g = st.alpha, st.gm
    M = -0.5 * R
    M += 0.5 * (np.outer(g, a) + np.outer(a, g)) - 0.5 * np.outer(a, a)
    delta = st.gv + 0.5 * st.w
    if np.any(delta != 0.0):
        At = -(R @ K)                      # Aᵀ = I − R K
        At.flat[:: n + 1] += 1.0
        M += (At * delta) @ At.T
    return 0.5 * (M + M.T)
