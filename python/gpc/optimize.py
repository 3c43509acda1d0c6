"""Type-II maximum likelihood: maximise a method's log evidence over log-hyperparameters.

L-BFGS-B (scipy.optimize) over θ = log of the kernel's hyperparameters, within the kernel's bounds,
with the analytic gradient each method provides; restarts from points drawn uniformly in the (log)
bounds, as scikit-learn does.
"""

import sys
import warnings

import numpy as np
from scipy.optimize import minimize

from .exceptions import ConvergenceWarning

#: L-BFGS-B's relative stopping tolerance on the objective (scipy's default ftol = factr · eps,
#: factr = 1e7): a step that changes it by less ends the search
LBFGSB_FTOL = 1e7 * np.finfo(float).eps
#: the farthest from a bound (in log θ, i.e. 0.1 % of the value) that a hyperparameter may be and
#: still be reported at it by :func:`bound_check_theta`
NEAR_BOUND = 1e-3


def lbfgsb(obj_func, initial_theta, bounds, maxiter=200, maxfun=1000):
    """Minimise ``obj_func(theta) -> (value, gradient)`` with L-BFGS-B; returns (theta, value).

    L-BFGS-B's first step is the whole gradient (its initial Hessian guess is the identity): with
    |∂ log Z / ∂ log ℓ| = 81 it jumped from ℓ = 1 to the bound 1e4, where ten sweeps of parallel EP
    diverge, and the curvature pair it brought back stalled the search for thousands of evaluations
    (breast cancer, PL Table I).  Optimising φ = c θ with c = √‖g₀‖ makes that first step one unit of
    log θ along the gradient, as GPML's ``minimize`` and Matlab's ``fminunc`` start; from the second
    step on L-BFGS-B scales itself.  ``maxfun`` bounds the evaluations a failing line search can take.
    """
    theta0 = np.asarray(initial_theta, dtype=np.float64)
    f0, g0 = obj_func(theta0)
    c = max(1.0, float(np.sqrt(np.linalg.norm(g0)))) if np.isfinite(f0) else 1.0
    memo = {theta0.tobytes(): (f0, np.asarray(g0, dtype=np.float64))}

    def scaled(phi):
        theta = phi / c
        hit = memo.pop(theta.tobytes(), None)
        f, g = hit if hit is not None else obj_func(theta)
        return f, np.asarray(g, dtype=np.float64) / c

    res = minimize(scaled, theta0 * c, method="L-BFGS-B", jac=True, bounds=np.asarray(bounds) * c,
                   options={"maxiter": maxiter, "maxfun": maxfun})
    if not res.success:
        warnings.warn(stop_message(res, "of the evidence in log θ",
                                   "raise the inference's max_iter or lower its tol (a gradient "
                                   "of an unconverged posterior misleads the line search), "
                                   "standardise X, or try n_restarts_optimizer > 0"),
                      ConvergenceWarning, stacklevel=2)
    return res.x / c, res.fun


def stop_message(res, what, advice):
    """What a ConvergenceWarning says when L-BFGS-B stops short of convergence: its reason in words
    (scipy's ``status``; its message leaves the reason empty for a failed line search), ``what``
    it optimised, and ``advice``."""
    if res.status == 1:
        reason = (f"it reached its limit of {res.nit} iterations / {res.nfev} evaluations before "
                  "the gradient vanished")
    elif res.status == 2:
        reason = ("its line search found no point that improves the objective along the "
                  "direction it chose, usually because the gradient does not match the values "
                  "(they are computed inexactly) or the objective is flat or not smooth there")
    else:
        reason = str(res.message).strip() or f"status {res.status}"
    return f"L-BFGS-B stopped without convergence {what}: {reason}. Try: {advice}."


def _say(line):
    print(line, file=sys.stderr, flush=True)


def maximise_evidence(objective, theta0, bounds, optimizer="fmin_l_bfgs_b", n_restarts=0,
                      random_state=None, return_gradient=False, verbose=0, label="fit"):
    """Maximise a log evidence over θ.

    Parameters
    ----------
    objective : callable
        ``objective(theta) -> (log_evidence, gradient)``.
    theta0 : ndarray
        Starting point (log space).
    bounds : ndarray (p, 2)
        Log-space bounds.
    optimizer : "fmin_l_bfgs_b", "L-BFGS-B" or callable
        A callable has scikit-learn's signature ``optimizer(obj_func, initial_theta, bounds)`` (bounds
        passed by keyword) returning ``(theta_opt, func_min)``, where ``obj_func(theta,
        eval_gradient=True)`` returns the *negative* evidence and its gradient, or the negative
        evidence alone with ``eval_gradient=False``.
    n_restarts : int
        Further starts drawn uniformly within ``bounds`` (which must then be finite).
    random_state : numpy Generator or RandomState
    return_gradient : bool, default False
        Also return the evidence gradient at the point returned (None if the optimiser returned a
        point it never evaluated).
    verbose : int, default 0
        1: one line on stderr per start (its best log evidence and the evaluations it took);
        2: also one line per evaluation (its log evidence and log θ).  Lines begin with ``label``.

    Returns
    -------
    theta, log_evidence : the best point found and its log evidence.
    gradient : ndarray or None
        Only with ``return_gradient``.
    """
    gradients = {}    # θ's bytes -> the evidence gradient there, for return_gradient
    count = [0]       # evaluations of the current start

    def neg(theta, eval_gradient=True):
        # scikit-learn's obj_func protocol: (value, gradient), or the value alone without the gradient
        value, grad = objective(theta)
        count[0] += 1
        if verbose >= 2:
            _say(f"{label}: evaluation {count[0]}: log evidence {float(value):.6g} at log θ "
                 f"{np.array2string(np.asarray(theta), precision=4, separator=', ')}")
        if not np.isfinite(value):
            # a point where the method broke down: make it unattractive, not fatal
            value, grad = -np.inf, np.zeros_like(theta)
        if return_gradient:
            gradients[np.asarray(theta, dtype=np.float64).tobytes()] = np.array(grad, dtype=np.float64)
        return (-value, -np.asarray(grad)) if eval_gradient else -value

    if optimizer in ("fmin_l_bfgs_b", "L-BFGS-B", "lbfgsb"):
        run = lbfgsb
    elif callable(optimizer):
        run = optimizer
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}: use 'fmin_l_bfgs_b', a callable or None")

    starts = [np.asarray(theta0, dtype=np.float64)]
    if n_restarts > 0:
        if not np.all(np.isfinite(bounds)):
            raise ValueError("n_restarts_optimizer > 0 needs finite hyperparameter bounds")
        for _ in range(n_restarts):
            starts.append(random_state.uniform(bounds[:, 0], bounds[:, 1]))
    best_theta, best_value = None, np.inf
    for k, start in enumerate(starts):
        count[0] = 0
        theta, value = run(neg, start, bounds=bounds)   # bounds by keyword, as scikit-learn calls
        if verbose >= 1:
            _say(f"{label}: start {k + 1} of {len(starts)}: log evidence {-float(value):.6g} "
                 f"after {count[0]} evaluations")
        if best_theta is None or value < best_value:
            best_theta, best_value = np.asarray(theta, dtype=np.float64), value
    if not return_gradient:
        return best_theta, -best_value
    return best_theta, -best_value, gradients.get(best_theta.tobytes())


def bound_check_theta(theta, bounds, log_evidence, gradient):
    """θ for a kernel's bound warning (``_check_bounds_params``): each hyperparameter that the
    optimiser cannot tell from a bound moved onto that bound; the fitted θ itself is not changed.

    L-BFGS-B stops when a step changes the objective by less than ``LBFGSB_FTOL`` (relative).  On
    a flat evidence it can stop one such step away from a bound it started at, e.g. a length scale
    whose initial value lies below its bounds is clipped to the lower bound, and the first step
    (the gradient, 1e-4 in log ℓ) ends the search at ℓ = 1.0001 × the bound: scikit-learn's check
    (``np.isclose`` of log values, relative 1e-5) then misses it.  A hyperparameter counts as at a
    bound b when it is within ``NEAR_BOUND`` of it and moving it there changes the log evidence,
    to first order, by less than the optimiser's own tolerance: |g_k (θ_k − b)| ≤ LBFGSB_FTOL ·
    max(|log evidence|, 1).

    Parameters
    ----------
    theta : ndarray (p,)
        The optimiser's θ (log space).
    bounds : ndarray (p, 2)
        Its log-space bounds.
    log_evidence : float
        The log evidence at ``theta``.
    gradient : ndarray (p,) or None
        Its gradient at ``theta``; None: ``theta`` is returned as it is.

    Returns
    -------
    ndarray (p,)
    """
    theta = np.array(theta, dtype=np.float64)
    if gradient is None:
        return theta
    bounds = np.asarray(bounds, dtype=np.float64).reshape(-1, 2)
    gradient = np.asarray(gradient, dtype=np.float64)
    slack = LBFGSB_FTOL * max(abs(float(log_evidence)), 1.0)
    for k in range(theta.size):
        for b in bounds[k]:
            gap = abs(theta[k] - b)
            if np.isfinite(b) and gap <= NEAR_BOUND and abs(gradient[k]) * gap <= slack:
                theta[k] = b
                break
    return theta
