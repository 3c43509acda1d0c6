"""Variational bounds (Gibbs & MacKay 2000; NR slides eq. (18)-(21)).

Each likelihood term is bounded below by an exponentiated quadratic with a variational parameter ς_i,

    p(y_i | f_i) ≥ exp(a_i f_i² + b_i y_i f_i + c_i)   for all f_i,                NR eq. (20)

so Z ≥ Z_VB = ∫ N(f | m0, K) Π_i exp(a_i f_i² + b_i y_i f_i + c_i) df, a Gaussian integral: sites with
τ = W = −2A_ς and ν = y ∘ b_ς (NR eq. (18)).  With t = ν − T m0, B = I + T^½ K T^½ and
α = (I + T K)⁻¹ t (the SitePosterior's α),

    ln Z_VB = Σ_i c_i + νᵀm0 − ½ m0ᵀ T m0 + ½ tᵀ K α − ½ ln|B|                   NR eq. (19), m0 = 0

Which likelihoods admit such a bound (derivations in docs/derivations-approx.md §2):

* logit — the Jaakkola–Jordan bound, ln σ(t) ≥ ln σ(ς) + (t − ς)/2 − λ(ς)(t² − ς²), λ(ς) = tanh(ς/2)/(4ς):
  a = −λ(ς), b = ½, c = ln σ(ς) − ς/2 + λ(ς) ς².  Optimal ς given q: ς_i² = E_q[f_i²] = m_i² + V_ii.
* probit — (ln Φ)'' ∈ (−1, 0), so ln Φ(t) + t²/2 is convex and lies above its tangents:
  ln Φ(t) ≥ ln Φ(ς) + r(ς)(t − ς) − ½ (t − ς)²,  r = N/Φ, i.e. a = −½, b = ς + r(ς),
  c = ln Φ(ς) − ς r(ς) − ς²/2.  Optimal ς given q: ς_i = y_i m_i.  The EM fixed point is
  K⁻¹(m − m0) = ∇ ln p(y|m): the MAP (Laplace mode), found by Newton; then ς = y ∘ f̂.
* heaviside — no: exp(quadratic) > 0 cannot lie under Θ(y f), which vanishes on a half-line.
* noisy threshold — a constant ln ε is a (useless) bound; no tangent family is implemented.
Those two raise ValueError.

ς is optimised by EM (given ς: q = the Gaussian posterior of the sites; given q: the ς maximising
E_q[quadratic], which is the closed form above).  EM increases ln Z_VB monotonically; its fixed point is
a stationary point of ln Z_VB(ς), so the gradient in θ is the partial derivative at fixed sites:

    M = ½ (α αᵀ − R),   R = T^½ B⁻¹ T^½.
"""

import functools
import warnings

import numpy as np
from scipy.special import log_expit, log_ndtr

from .._special import inverse_mills
from ..exceptions import ConvergenceWarning
from ..posterior import SitePosterior
from ._result import InferenceResult

DEFAULT_MAX_ITER = 1000
DEFAULT_TOL = 1e-10

def quadratic_bound(name, xi):
    """Coefficients (a, b, c) of ln p(y|f) ≥ a f² + b y f + c touching at y f = ς (see module docstring).

    Parameters
    ----------
    name : str
        "logit" or "probit".
    xi : ndarray
        Variational parameters ς.
    """
    xi = np.asarray(xi, dtype=np.float64)
    if name == "logit":
        ax = np.abs(xi)
        small = ax < 1e-6
        safe = np.where(small, 1.0, ax)
        lam = np.where(small, 0.125 - ax * ax / 96.0, np.tanh(0.5 * safe) / (4.0 * safe))
        return -lam, np.full_like(xi, 0.5), log_expit(ax) - 0.5 * ax + lam * ax * ax
    if name == "probit":
        r = inverse_mills(xi)
        return np.full_like(xi, -0.5), xi + r, log_ndtr(xi) - xi * r - 0.5 * xi * xi
    raise ValueError(
        f"the variational bound (method='vb') needs a quadratic lower bound on ln p(y|f): it is "
        f"implemented for 'logit' (Jaakkola-Jordan) and 'probit' (curvature bound); {name!r} admits none "
        "that is useful (heaviside: none at all, exp(quadratic) > 0 cannot lie under a step; noisy "
        "threshold: only the constant ln eps). Use method='ep', 'pl' or 'online'.")


def _evaluate(K, y, name, m0, xi):
    a, b, c = quadratic_bound(name, xi)
    tau = -2.0 * a                       # NR eq. (18): W = −2 A_ς
    nu = y * b                           #              site location y ∘ b_ς
    post = SitePosterior(K, tau, nu, m0)
    t = nu - tau * m0
    log_z = (np.sum(c) + nu @ m0 - 0.5 * m0 @ (tau * m0) + 0.5 * t @ (post.mean - m0)
             - 0.5 * post.log_det_B)    # NR eq. (19) with a prior mean
    return post, float(log_z)


def run(K, y, likelihood, prior_mean, *, schedule=None, max_iter=None, tol=None, xi_init=None,
        init=None):
    """Maximise ln Z_VB over the variational parameters ς.

    Parameters
    ----------
    K, y, likelihood, prior_mean, schedule, max_iter, tol
        As for :func:`gpc.inference.infer`; ``max_iter`` (default 1000) counts EM steps (logit) or
        Newton steps for the mode (probit); ``tol`` (default 1e-10) applies to the change of ln Z_VB.
    xi_init : ndarray (n,), optional
        Starting ς for the logit EM (default: ς² = prior second moments, m0² + K_ii).
    init : InferenceResult, optional
        A previous VB result (the optimiser passes it): its ς starts the logit EM.

    Returns
    -------
    InferenceResult
        ``log_evidence`` is ln Z_VB ≤ ln Z_KL ≤ ln Z; ``info["xi"]`` holds ς.
    """
    name = likelihood.name
    if init is not None and init.method == "vb" and xi_init is None:
        xi_init = init.info["xi"]
    quadratic_bound(name, np.zeros(1))           # raises the clear ValueError for other likelihoods
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    tol = DEFAULT_TOL if tol is None else tol
    m0 = prior_mean
    converged = False
    if name == "probit":
        # The EM fixed point is the MAP (module docstring): solve it by Newton instead of the slow
        # (linearly convergent, rate → 1 for confident points) EM iteration.
        from . import laplace
        with warnings.catch_warnings(record=True):       # VB reports its own convergence
            warnings.simplefilter("always", ConvergenceWarning)
            lap = laplace.run(K, y, likelihood, m0, max_iter=max_iter, tol=tol)
        converged, n_iter = lap.converged, lap.n_iter
        xi = y * lap.info["f"]
        post, log_z = _evaluate(K, y, name, m0, xi)
    else:
        xi = (np.sqrt(m0 ** 2 + np.diag(K)) if xi_init is None
              else np.array(xi_init, dtype=np.float64))
        post, log_z = _evaluate(K, y, name, m0, xi)
        n_iter = 0
        for n_iter in range(1, max_iter + 1):
            xi = np.sqrt(post.mean ** 2 + post.diag_cov())     # EM: ς² = E_q[f²]
            post, new = _evaluate(K, y, name, m0, xi)
            change, log_z = new - log_z, new
            if abs(change) < tol:
                converged = True
                break
    if not converged:
        warnings.warn(f"VB: the bound did not converge in {max_iter} iterations (tol {tol:g})",
                      ConvergenceWarning, stacklevel=3)

    return InferenceResult("vb", None, likelihood, post, log_z, n_iter, converged, post.gradient_matrix,
                           info={"xi": xi})
