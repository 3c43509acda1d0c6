"""Mean-field approximations of Csató, Fokoué, Opper, Schottky & Winther (MF paper, §3-§4).

The paper's likelihood is the noise-free step Θ(y a) (MF eq. (1)).  Probit is reduced to it by moving
the noise into the prior (MF §1): with a = f + ε, ε ~ N(0, 1), Θ(y a) integrates to Φ(y f), so the
probit model for f is the step model for a under the prior covariance K + I.  Other likelihoods raise
ValueError.

Ensemble learning (``method="mf-ensemble"``, MF eq. (4)-(7)): q(a) = Π_j q_j(a_j) minimising KL(q‖p);
q_j ∝ Θ(y_j a) N(a | m_j, λ_j) with λ_j = 1/[K⁻¹]_jj, m_j = −λ_j Σ_{i≠j} [K⁻¹]_ji ⟨a_i⟩ (eq. (5)).
Solved by sequential coordinate descent (each q_j set to its optimum given the others), which lowers
the free energy monotonically; at the fixed point K⁻¹⟨a⟩ = y ∘ α and eq. (6) holds.  The evidence is
−F with the variational free energy of the q found,

    F = Σ_j [−ln Φ(z_j) − ½ ln λ_j − (⟨a_j⟩ − m_j)²/(2λ_j)] + ½ ln|K| + ½ ⟨a⟩ᵀK⁻¹⟨a⟩,  z_j = y_j m_j/√λ_j,

an upper bound on −ln P(D) for any q of the family, equal to the paper's eq. (7) at the fixed point
(derivation: docs/derivations-approx.md §3; ``info["free_energy_eq7"]`` holds eq. (7) itself).
Gradient (F is stationary in every q_j): ∂(−F)/∂K = −½K⁻¹ + ½ γγᵀ + ½ K⁻¹ diag(Var_q) K⁻¹, γ = K⁻¹⟨a⟩.
This method inverts K (the paper says so); it is O(n³) once plus O(n²) per sweep.

Naive mean field (``method="mf-naive"``, MF eq. (8)-(9)): λ_j replaced by K_jj; no inversion, no
determinant; m_j = Σ_{i≠j} K_ji y_i α_i, α_j = N(z_j)/(√K_jj Φ(z_j)).  Its free energy (after eq. (9))

    F_naive = −Σ_j ln Φ(z_j) + ½ Σ_ij y_i α_i (K_ij − δ_ij K_ii) y_j α_j

is not a bound.  It is stationary in y ∘ α at the fixed point, which gives its gradient:
∂(−F_naive)/∂K_ij = ½ u_i u_j (i ≠ j), −½ u_j m_j / K_jj (i = j), u = y ∘ α.  The sweep can oscillate
for strongly coupled data: the default damping halves η whenever a sweep changes the state more than
the previous one did.  Both methods switch from the paper's sweeps to Newton's method on the same
fixed-point equations once the sweeps have done the rough work (``newton_after``).

With a prior mean m0 every cavity mean m_j gets m0_j added (a is shifted by m0).

Prediction.  The latent predictive mean is the paper's eq. (3): m0(x) + Σ_j k(x, x_j) y_j α_j.  The
factorised q has no cross-covariances, so for the latent predictive *variance* we use the Gaussian
sites that turn each cavity N(m_j, λ_j) into a Gaussian with the variance of the mean-field marginal
q_j: τ_j = 1/Var_q(a_j) − 1/λ_j ≥ 0 (a truncation never increases variance), and predict
k** − k*ᵀ (K + T⁻¹)⁻¹ k* as a SitePosterior does.  For probit the sites act on a = f + ε and are mapped
to f by adding the unit noise variance to the site variance: τ_f = τ/(1 + τ).  The site locations are
chosen so that the SitePosterior's mean and α equal the mean-field ones exactly.
"""

import functools
import warnings

import numpy as np

from .. import _meanfield
from .._linalg import cho_inverse_lower, cholesky_lower, log_det_from_cholesky
from ..exceptions import ConvergenceWarning
from ..posterior import SitePosterior
from ._result import InferenceResult

DEFAULT_MAX_ITER = 2000
DEFAULT_TOL = 1e-10
MIN_DAMPING = 1e-3


class MeanFieldPosterior(SitePosterior):
    """Posterior of a mean-field method presented with the SitePosterior interface.

    ``mean`` and ``alpha`` are the mean-field ones (MF eq. (3)); ``cov()``, ``diag_cov()`` and the
    predictive variance come from the Gaussian sites τ_j = 1/Var_q(a_j) − 1/λ_j (see the module
    docstring): the factorised q itself has no cross-covariances.  ``marginal_mean`` and
    ``marginal_var`` hold the moments of the non-Gaussian mean-field marginals q_j of a (for probit,
    a = f + ε).
    """

    def __init__(self, K, tau, u, prior_mean, marginal_mean, marginal_var):
        nu = tau * prior_mean + u + tau * (K @ u)      # so that α = (I + T K)⁻¹(ν − T m0) = u
        super().__init__(K, tau, nu, prior_mean)
        self.alpha = u
        self.mean = prior_mean + K @ u
        self.marginal_mean = marginal_mean
        self.marginal_var = marginal_var


def _reduce(K, likelihood, method):
    name = likelihood.name
    if name == "heaviside":
        return K, False
    if name == "probit":
        Keff = K.copy()
        Keff.flat[:: K.shape[0] + 1] += 1.0     # MF §1: probit noise moved into the prior
        return Keff, True
    raise ValueError(f"method {method!r} supports the 'heaviside' likelihood (MF eq. (1)) and 'probit' "
                     f"(by moving its noise into the kernel, K + I); got {name!r}")


def _fixed_point_map(P, lam, y, m0, naive, s):
    """T(s) of the sweep (all coordinates at once) and its derivative pieces: T'(s) = diag(d) J."""
    g = P @ s
    if naive:
        m = m0 + g - lam * s                       # MF eq. (9)
    else:
        m = m0 + s - lam * g                       # MF eq. (5)
    log_z, mean, var = _moments(y, m, lam)
    if naive:
        T = (mean - m) / lam                       # y_j α_j = (⟨a_j⟩ − m_j)/λ_j
        d = (var / lam - 1.0) / lam                # ∂T/∂m
    else:
        T = mean - m0
        d = var / lam                              # ∂⟨a⟩/∂m = Var/λ
    return T, d


def _newton(P, lam, y, m0, naive, s, tol, max_steps):
    """Newton's method on G(s) = T(s) − s = 0 with backtracking on max|G|; O(n³) per step.

    Returns (s, steps, ok).  Jacobian: T'(s) = diag(d) J, J = P − Λ (naive) or I − Λ P (ensemble).
    """
    n = y.shape[0]
    if naive:
        J = P.copy()
        J.flat[:: n + 1] -= lam
    else:
        J = -lam[:, None] * P
        J.flat[:: n + 1] += 1.0
    T, d = _fixed_point_map(P, lam, y, m0, naive, s)
    G = T - s
    err = np.max(np.abs(G))
    steps = 0
    while err >= tol and steps < max_steps:
        steps += 1
        A = d[:, None] * J
        A.flat[:: n + 1] -= 1.0                    # ∂G/∂s = diag(d) J − I
        try:
            step = -np.linalg.solve(A, G)
        except np.linalg.LinAlgError:
            return s, steps, False
        t = 1.0
        for _ in range(30):
            s_try = s + t * step
            T, d_try = _fixed_point_map(P, lam, y, m0, naive, s_try)
            G_try = T - s_try
            err_try = np.max(np.abs(G_try))
            if err_try < err:
                break
            t *= 0.5
        else:
            return s, steps, False
        s, d, G, err = s_try, d_try, G_try, err_try
    return s, steps, err < tol


def _iterate(P, lam, y, m0, naive, max_iter, tol, damping, method, newton_after):
    """Sequential sweeps (MF paper) until the change is small or ``newton_after`` sweeps, then Newton
    on the same fixed-point equations (quadratic convergence where the sweeps crawl); back to damped
    sweeps if Newton stalls."""
    n = y.shape[0]
    s = np.zeros(n)
    g = np.zeros(n)
    eta = 1.0 if damping is None else float(damping)
    if not 0.0 < eta <= 1.0:
        raise ValueError(f"damping must be in (0, 1], got {damping!r}")
    adaptive = damping is None and naive
    prev = np.inf
    converged = False
    n_iter = 0
    change = np.inf
    tried_newton = newton_after is None
    while n_iter < max_iter:
        n_iter += 1
        change = _meanfield.mf_sweep(P, lam, y, m0, s, g, naive, eta)
        if n_iter % 20 == 0:
            g = P @ s                       # remove the drift of the incremental refresh
        if change < tol:
            converged = True
            break
        if adaptive and change > prev and eta > MIN_DAMPING:
            eta = max(0.5 * eta, MIN_DAMPING)
        prev = change
        if not tried_newton and (n_iter >= newton_after or change < 1e-4):
            tried_newton = True
            s_new, steps, ok = _newton(P, lam, y, m0, naive, s.copy(), tol, max_iter - n_iter)
            n_iter += steps
            if ok:
                s, converged = s_new, True
                break
            if np.all(np.isfinite(s_new)):
                s = s_new
            g = P @ s
            if damping is None:
                eta = min(eta, 0.5)
    if not converged:
        warnings.warn(f"{method}: the mean-field iteration did not converge in {max_iter} iterations "
                      f"(last change {change:.3g} > tol {tol:g}, damping {eta:g})",
                      ConvergenceWarning, stacklevel=4)
    g = P @ s
    return s, g, n_iter, converged, eta


def _moments(y, m, lam):
    n = y.shape[0]
    log_z, mean, var = np.empty(n), np.empty(n), np.empty(n)
    _meanfield.heaviside_moments(y, m, lam, log_z, mean, var)
    return log_z, mean, var


def _site_precision(lam, var, probit):
    # τ = 1/Var − 1/λ = ρ / (λ (1 − ρ)), ρ = 1 − Var/λ = r (z + r) ∈ [0, 1)
    rho = np.clip(1.0 - var / lam, 0.0, 1.0 - 1e-16)
    tau = rho / (lam * (1.0 - rho))
    return tau / (1.0 + tau) if probit else tau


def run_ensemble(K, y, likelihood, prior_mean, *, schedule="sequential", max_iter=None, tol=None,
                 damping=None, newton_after=50):
    """Mean field I, ensemble learning (MF eq. (4)-(7)).

    Parameters
    ----------
    K, y, likelihood, prior_mean, schedule, max_iter, tol
        As for :func:`gpc.inference.infer`; ``likelihood`` is heaviside or probit.  ``max_iter``
        (default 2000) counts sweeps; ``tol`` (default 1e-10) bounds the largest change of ⟨a_j⟩.
    damping : float in (0, 1], optional
        Fixed damping of the coordinate updates; by default none (exact coordinate descent).
    newton_after : int or None
        Switch from sweeps to Newton's method on the same fixed-point equations after this many
        sweeps (or once a sweep changes the state by < 1e-4); None: sweeps only (the paper's scheme).

    Returns
    -------
    InferenceResult
        ``log_evidence`` = −F (a lower bound on ln P(D)); ``info``: ``alpha`` (the paper's α_j),
        ``free_energy``, ``free_energy_eq7``, ``lambda``, ``cavity_mean``.
    """
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    tol = DEFAULT_TOL if tol is None else tol
    Keff, probit = _reduce(K, likelihood, "mf-ensemble")
    m0 = prior_mean
    Lk, _ = cholesky_lower(Keff, name="K (mf-ensemble inverts it, MF §3)")
    Kinv = cho_inverse_lower(Lk)
    lam = 1.0 / np.diag(Kinv)                                   # MF eq. (5)
    s, g, n_iter, converged, eta = _iterate(Kinv, lam, y, m0, False, max_iter, tol, damping,
                                            "mf-ensemble", newton_after)
    m = m0 + s - lam * g                                        # cavity means, MF eq. (5)
    log_z, a_mean, a_var = _moments(y, m, lam)
    logdet = log_det_from_cholesky(Lk)
    F = (np.sum(-log_z - 0.5 * np.log(lam) - (a_mean - m) ** 2 / (2.0 * lam))
         + 0.5 * logdet + 0.5 * s @ g)
    # MF eq. (7) with y_j α_j = g_j (= [K⁻¹(⟨a⟩ − m0)]_j, exact at the fixed point)
    F7 = float(np.sum(-log_z) + 0.5 * s @ g - 0.5 * np.sum(lam * g * g) + 0.5 * logdet
               - 0.5 * np.sum(np.log(lam)))
    tau = _site_precision(lam, a_var, probit)
    posterior = MeanFieldPosterior(K, tau, g, m0, a_mean, a_var)

    return InferenceResult("mf-ensemble", schedule, likelihood, posterior, float(-F), n_iter, converged,
                           functools.partial(_ensemble_gradient_matrix, Kinv, a_var, g),
                           info={"alpha": y * g, "free_energy": float(F), "free_energy_eq7": F7,
                                 "lambda": lam, "cavity_mean": m, "damping": eta})


def run_naive(K, y, likelihood, prior_mean, *, schedule="sequential", max_iter=None, tol=None,
              damping=None, newton_after=50):
    """Mean field II, the 'naive' approach (MF eq. (8)-(9)).

    Parameters
    ----------
    K, y, likelihood, prior_mean, schedule, max_iter, tol
        As for :func:`run_ensemble`.
    damping : float in (0, 1], optional
        Fixed damping; by default adaptive (starts at 1, halves when a sweep's change grows).
    newton_after : int or None
        As for :func:`run_ensemble`.

    Returns
    -------
    InferenceResult
        ``log_evidence`` = −F_naive (an approximation, not a bound); ``info``: ``alpha``,
        ``free_energy``, ``cavity_mean``, ``damping``.
    """
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    tol = DEFAULT_TOL if tol is None else tol
    Keff, probit = _reduce(K, likelihood, "mf-naive")
    m0 = prior_mean
    lam = np.diag(Keff).copy()                                  # MF eq. (9): λ_j → K_jj
    s, g, n_iter, converged, eta = _iterate(Keff, lam, y, m0, True, max_iter, tol, damping,
                                            "mf-naive", newton_after)
    m = m0 + g - lam * s                                        # m_j = Σ_{i≠j} K_ji y_i α_i (+ m0_j)
    log_z, a_mean, a_var = _moments(y, m, lam)
    F = float(np.sum(-log_z) + 0.5 * s @ g - 0.5 * np.sum(lam * s * s))   # free energy after eq. (9)
    tau = _site_precision(lam, a_var, probit)
    posterior = MeanFieldPosterior(K, tau, s, m0, a_mean, a_var)


    return InferenceResult("mf-naive", schedule, likelihood, posterior, -F, n_iter, converged,
                           functools.partial(_naive_gradient_matrix, s, m, lam),
                           info={"alpha": y * s, "free_energy": F, "cavity_mean": m, "damping": eta})


# module functions (not closures) so that results pickle with their gradient
def _ensemble_gradient_matrix(Kinv, a_var, g):
    M = (Kinv * a_var) @ Kinv
    M -= Kinv
    M += np.outer(g, g)
    M *= 0.5
    return 0.5 * (M + M.T)


def _naive_gradient_matrix(s, m, lam):
    M = 0.5 * np.outer(s, s)
    M.flat[:: len(s) + 1] = -0.5 * s * m / lam
    return M
