"""Posterior linearisation (García-Fernández, Tronarp & Särkkä; PL paper eq. (9)-(18), supplement).

Iterated statistical linear regression: each label's conditional mean E(y_i|f_i) is replaced by its
best affine fit A_i f_i + b_i under the current posterior marginal N(ū_i, W_i), with the fit's mean
square error Ω_i as noise (PL eq. (15)-(16)):

    A_i = Cov[f_i, E(y_i|f_i)] / W_i,   b_i = E[E(y_i|f_i)] − A_i ū_i,   Ω_i = Var[y_i] − A_i² W_i,

where Var[y_i] = 1 − E[y_i]² for labels ±1 (docs/derivations.md).  The Gaussian pseudo-likelihood
N(y_i; A_i f_i + b_i, Ω_i) is a site with τ_i = A_i²/Ω_i ≥ 0 and ν_i = A_i (y_i − b_i)/Ω_i: no cavity,
so no negative variance ever (PL §III-D).  Sequential and parallel schedules from ``_sites.py``;
convergence on the posterior means and variances.

Evidence, PL eq. (17)-(18): log p̂(D) + Σ_i log ∫ p(y_i|f)/p̂(y_i|f) N(f; ū_i, W_i) df with
p̂(D) = N(y; b + A m0, A K A + Ω), the one-dimensional correction integrals by Gauss–Hermite (order
``correction_order``, in log space).

Gradient (what is differentiated, exactly): ∂/∂θ of log p̂(D; θ) = log N(y; b + A m0, A K A + Ω) with
the linearisation (A, b, Ω) held fixed; the correction factor of eq. (18) is treated as constant.
With S = A Ω^-½ this is the Gaussian-site gradient M = ½ (α αᵀ − R), R = S B⁻¹ S, α as in EP.  The
optimiser uses this gradient; tests check it against finite differences of log p̂(D) at fixed (A, b, Ω).
"""

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from ..exceptions import DivergenceError
from ..posterior import SitePosterior
from ._result import InferenceResult
from ._damping import DEFAULT_MIN_DAMPING, check_min_damping
from ._sites import check_options, run_schedule, visiting_order

DEFAULT_MAX_ITER = 100
DEFAULT_TOL = 1e-6
DEFAULT_CORRECTION_ORDER = 32


#: default damping per schedule: undamped parallel PL oscillates once the prior amplitude is large
#: (crabs, σ² = e⁶: no convergence in 200 sweeps; damped 0.5: 65 sweeps to the sequential fixed point)
DEFAULT_DAMPING = {"sequential": 1.0, "parallel": 0.5}


#: why PL can diverge: for a step-like likelihood (Heaviside, noisy threshold with small
#: ε) the SLR against a marginal N(ū_i, W_i) centred on the step has A_i ≈ 2(1 − 2ε) φ(0)/√W_i, so
#: τ_i = A_i²/Ω_i ≈ 1.6/W_i (PL eq. (15)-(16)): the new site alone is more precise than the marginal
#: it came from, the next marginal is narrower still, and τ_i grows geometrically.  Labels that a
#: smooth kernel cannot separate put marginals on the step and trigger it; there is no fixed point.
_COLLAPSE = ("Site precisions grow without bound when a step-like likelihood is linearised against a "
             "marginal centred on its step (labels the kernel cannot separate); use method='ep', a "
             "larger noise level ε, or a shorter length scale")


def run(K, y, likelihood, prior_mean, *, schedule="sequential", max_iter=None, tol=None,
        damping=None, order=None, random_state=None, block=None, init=None,
        correction_order=DEFAULT_CORRECTION_ORDER, min_damping=DEFAULT_MIN_DAMPING):
    """Iterated posterior linearisation.

    Parameters
    ----------
    schedule : "sequential" or "parallel"
    max_iter : int, default 100
    tol : float, default 1e-6
        On the largest change of a posterior mean, or of a variance relative to itself, in a sweep.
    damping : float in (0, 1], default 1 (sequential) or 0.5 (parallel)
        Undamped parallel PL can oscillate (``DEFAULT_DAMPING``); the PL paper's parallel runs are
        undamped, pass ``damping=1`` for them.  The parallel schedule starts from this value and
        halves it whenever its updates oscillate or fail (gpc.inference._damping), recording the
        final value in ``info["damping"]`` and each halving in ``info["damping_halved_at"]``.  A
        ``tol`` below the rounding level of the updates ends there, converged, with
        ``info["rounding_floor"]`` (sweep, residual, rounding level).
    order, random_state, block, init
        As for EP.
    correction_order : int, default 32
        Gauss–Hermite order of the correction integrals of eq. (18).
    min_damping : float or None, default 2⁻¹⁰
        The parallel schedule stops with a DivergenceError rather than halve the damping below this.
        None keeps the damping fixed (the plain parallel schedule of the paper).
    """
    if damping is None:
        damping = DEFAULT_DAMPING.get(schedule, 1.0)
    check_options(damping, "clip", schedule)
    min_damping = check_min_damping(min_damping, damping)
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    tol = DEFAULT_TOL if tol is None else tol
    m0 = prior_mean
    visiting_order(len(y), order, random_state)       # bad options raise here, before the sweeps
    if block is not None and int(block) < 1:
        raise ValueError("block must be a positive integer")
    try:
        post, tau, nu, n_iter, converged, _, _, damping_info = run_schedule(
            K, y, likelihood, m0, rule="pl", schedule=schedule, max_iter=max_iter, tol=tol,
            damping=damping, on_negative="clip", order=order, random_state=random_state,
            block=block, init=init, converged_by="moments", min_damping=min_damping)
    except DivergenceError as exc:     # the parallel schedule's damping reached its floor
        raise DivergenceError(f"{exc}. Or: {_COLLAPSE}", method="pl", index=exc.index,
                              value=exc.value) from exc
    except (ValueError, ArithmeticError) as exc:
        raise DivergenceError(f"PL ({schedule}): the posterior marginals collapsed ({exc}). {_COLLAPSE}",
                              method="pl") from exc
    log_evidence, linearisation = pl_log_evidence(K, post, y, likelihood, m0, correction_order)
    if not (np.isfinite(log_evidence) and log_evidence <= 0.0):
        i = int(np.argmax(tau))
        raise DivergenceError(f"PL ({schedule}): impossible log evidence {log_evidence:.6g} after "
                              f"{n_iter} sweeps (no fixed point reached: undamped parallel sweeps oscillate, or the "
                              f"marginals collapse; site {i} has precision {tau[i]:.3g}). {_COLLAPSE}",
                              method="pl", index=i, value=tau[i])
    return InferenceResult("pl", schedule, likelihood, post, log_evidence, n_iter, converged,
                           linearisation["posterior"].gradient_matrix,
                           info={**linearisation, **damping_info})


def slr(likelihood, mean, var):
    """(A, b, Ω) of PL eq. (15)-(16) for marginals N(mean, var)."""
    mu_y, cov_fy, var_y = likelihood.slr_moments(mean, var)
    A = cov_fy / var
    b = mu_y - A * mean
    omega = np.maximum(var_y - A * A * var, 1e-300)
    return A, b, omega


def pl_log_evidence(K, post, y, likelihood, m0, correction_order=DEFAULT_CORRECTION_ORDER):
    """PL eq. (18) at the posterior ``post``: log p̂(D) plus the 1-D correction integrals."""
    mu, var = post.mean, post.diag_cov()
    A, b, omega = slr(likelihood, mu, var)
    # p̂(D) = N(y; b + A m0, A K A + Ω) = N(r; 0, Ω^½ B Ω^½) with B = I + S K S, S = A Ω^-½, r = y − b − A m0
    lin = SitePosterior(K, A * A / omega, A * (y - b) / omega, m0)
    r = y - b - A * m0
    u = r / np.sqrt(omega)
    from .._linalg import cho_solve_lower
    quad = u @ cho_solve_lower(lin.L, u)
    n = len(y)
    log_p_hat = -0.5 * (quad + lin.log_det_B + np.sum(np.log(omega)) + n * np.log(2 * np.pi))
    # Σ_i log E_{N(ū_i, W_i)}[p(y_i|f) / N(y_i; A_i f + b_i, Ω_i)] by Gauss–Hermite, in log space
    x, w = hermegauss(correction_order)
    w = w / w.sum()
    f = mu[:, None] + np.sqrt(var)[:, None] * x[None, :]
    yy = np.broadcast_to(y[:, None], f.shape)
    log_p = likelihood.log_prob(yy.ravel(), f.ravel()).reshape(f.shape)
    resid = y[:, None] - A[:, None] * f - b[:, None]
    log_q = -0.5 * (resid ** 2 / omega[:, None] + np.log(2 * np.pi * omega)[:, None])
    terms = np.log(w)[None, :] + log_p - log_q
    top = np.max(terms, axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    correction = np.log(np.sum(np.exp(terms - top), axis=1)) + top[:, 0]
    value = float(log_p_hat + np.sum(correction))
    return value, {"A": A, "b": b, "omega": omega, "log_p_hat": float(log_p_hat),
                   "posterior": lin}
