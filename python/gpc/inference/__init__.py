"""Approximate inference for binary GP classification under one entry point, :func:`infer`.

Each method is a function ``run(K, y, likelihood, prior_mean, *, schedule, max_iter, tol, **options)``
returning an :class:`InferenceResult`, registered below in ``METHODS`` as a typed :class:`Method`;
this module validates the inputs once and dispatches.  Adding a method: write its module, import it
here and add one ``Method`` entry.
"""

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from .. import _threads
from .._linalg import cholesky_lower
from ..exceptions import DivergenceError, NumericalError
from .._validation import (check_kernel_matrix, check_positive_float, check_positive_int,
                           check_prior_mean, check_signed_labels)
from ..likelihoods import Likelihood, get_likelihood
from . import ep, kl, laplace, meanfield, online, pl, vb
from ._result import InferenceResult


@dataclass(frozen=True)
class Method:
    """An inference method as :func:`infer` dispatches it.

    Attributes
    ----------
    run : callable
        ``run(K, y, likelihood, prior_mean, *, schedule, max_iter, tol, **options)``.
    schedules : tuple
        The schedules it accepts (``(None,)``: it has none).
    default_schedule : str or None
    warm_start : bool
        ``run`` takes ``init=``, a previous InferenceResult of the same method.
    has_gradient : bool
        Its results carry ``gradient_matrix`` (else the optimiser takes finite differences).
    """

    run: Callable
    schedules: tuple
    default_schedule: Optional[str]
    warm_start: bool
    has_gradient: bool


_SITES = ("sequential", "parallel")
METHODS = {
    "laplace": Method(laplace.run, (None,), None, warm_start=True, has_gradient=True),
    "ep": Method(ep.run, _SITES, "sequential", warm_start=True, has_gradient=True),
    "pl": Method(pl.run, _SITES, "sequential", warm_start=True, has_gradient=True),
    "kl": Method(kl.run, (None,), None, warm_start=True, has_gradient=True),
    "vb": Method(vb.run, (None,), None, warm_start=True, has_gradient=True),
    "mf-ensemble": Method(meanfield.run_ensemble, ("sequential",), "sequential", warm_start=False,
                          has_gradient=True),
    "mf-naive": Method(meanfield.run_naive, ("sequential",), "sequential", warm_start=False,
                       has_gradient=True),
    "online": Method(online.run, (None,), None, warm_start=False, has_gradient=False),
}


def available_methods():
    """Names accepted by ``infer(method=...)``."""
    return sorted(METHODS)


@_threads.dense_call
def infer(K: ArrayLike, y: ArrayLike, likelihood: Union[str, Likelihood] = "probit",
          method: str = "laplace", schedule: Optional[str] = None,
          prior_mean: Optional[ArrayLike] = None, max_iter: Optional[int] = None,
          tol: Optional[float] = None, check_kernel: bool = True,
          **options: Any) -> InferenceResult:
    """Gaussian approximation of the posterior of a GP classifier's latent values.

    Parameters
    ----------
    K : array-like (n, n)
        Prior covariance of the latent values at the training inputs.
    y : array-like (n,)
        Labels in {-1, +1}.
    likelihood : str or Likelihood
        "probit", "logit", "noisy_threshold", "heaviside" or an instance.
    method : str, default "laplace"
        One of :func:`available_methods`.  The default is Laplace's approximation (R&W §3.4),
        where :class:`gpc.GaussianProcessClassifier` defaults to EP.  ``infer`` is the low-level
        entry point, and its default is the method with no schedule, no damping and no negative
        sites: a Newton iteration to the unique mode of any log-concave likelihood, whose result
        depends on nothing but K, y and the likelihood (and which callers of ``infer`` rely on:
        another default would change their results).  The estimator picks EP because its
        predictive probabilities and evidence are the more accurate (NR's experiments: Laplace's
        evidence is too low and its probabilities too confident), what a classifier is judged
        by.  Pass ``method="ep"`` for the estimator's posterior.
    schedule : str or None
        "sequential" or "parallel" for the site methods; None picks the method's default.
    prior_mean : float or array-like (n,), optional
        m0, the prior mean of the latent values (zero by default).
    max_iter : int, optional
        Iteration limit (Newton steps or sweeps); each method has its default.
    tol : float, optional
        Convergence tolerance; each method has its default.
    check_kernel : bool, default True
        Check that K is finite, symmetric and positive definite (a Cholesky factorisation, with
        jitter if needed; one O(n³/3) step) and raise ValueError (``NotPositiveDefiniteError`` for
        the last) if not.  When K factors only with jitter (it is singular to rounding), the method
        runs on K + jitter·I, the matrix that passed, and ``result.info["jitter"]`` records it.  The methods only factor well-conditioned matrices such as I + S K S,
        which can hide an indefinite K; callers that evaluate many nearby K of one checked kernel
        (an optimiser) may skip the checks.
    **options
        Method-specific options (see each method's ``run``).  ``init``, a previous
        :class:`InferenceResult`, is passed on to the methods that can warm start from it.

    Returns
    -------
    InferenceResult
        Finite, with a log evidence ≤ 0.

    Raises
    ------
    ValueError, TypeError
        Bad input, named in the message (including a K that is not positive definite:
        ``NotPositiveDefiniteError``, a ValueError).
    gpc.exceptions.NumericalError
        A numerical failure the method meets by its nature on valid input, naming the method, the site
        and the value: ``NegativeVarianceError`` (EP with a non-log-concave likelihood and
        ``on_negative="raise"``), ``DivergenceError`` (an iteration that left the finite region or
        reached an impossible evidence).  No FloatingPointError or LinAlgError escapes.

    Warns
    -----
    gpc.exceptions.ConvergenceWarning
        The iteration limit was reached first; the last iterate is returned (it passed the checks
        above).
    """
    jitter = 0.0
    if check_kernel:
        K = check_kernel_matrix(K)
        # [1]: the factor itself is dropped at once (held as ``_`` it would stay alive through the
        # whole method, one n x n buffer more at the peak)
        jitter = cholesky_lower(K, name="the kernel matrix K")[1]
        if jitter:
            # K is positive definite only to rounding: the check accepted K + jitter·I, and that is
            # the K the method runs on (on the unjittered K, methods meet variances that are zero or
            # negative to rounding)
            jittered = np.array(K, dtype=np.float64)
            jittered.flat[:: jittered.shape[0] + 1] += jitter
            K = jittered
    else:  # the caller vouches for K (e.g. the optimiser, with K from a checked kernel): shape only
        K = np.ascontiguousarray(K, dtype=np.float64)
        if K.ndim != 2 or K.shape[0] != K.shape[1] or K.shape[0] == 0:
            raise ValueError(f"K must be a non-empty square matrix, got shape {K.shape}")
    n = np.shape(K)[0]
    y = check_signed_labels(y, n)
    m0 = check_prior_mean(prior_mean, n)
    lik = get_likelihood(likelihood)
    key = str(method).lower()
    if key not in METHODS:
        raise ValueError(f"unknown method {method!r}; available: {', '.join(available_methods())}")
    entry = METHODS[key]
    if schedule is None:
        schedule = entry.default_schedule
    if schedule not in entry.schedules:
        allowed = ", ".join(repr(s) for s in entry.schedules)
        raise ValueError(f"method {key!r} takes schedule in ({allowed}), got {schedule!r}")
    if max_iter is not None:
        max_iter = check_positive_int(max_iter, "max_iter")
    if tol is not None:
        tol = check_positive_float(tol, "tol")
    # ``init`` (a previous result, for warm starts) goes to the methods that can use it
    init = options.pop("init", None)
    if init is not None and not isinstance(init, InferenceResult):
        raise TypeError(f"init must be an InferenceResult (a previous result), got {type(init).__name__}")
    if init is not None and entry.warm_start:
        options["init"] = init
    try:
        # overflow on the way is handled by the methods (a failed step, a clipped site); what
        # matters is the result, which _check_result below vets
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            result = entry.run(K, y, lik, m0, schedule=schedule, max_iter=max_iter, tol=tol, **options)
    except (NumericalError, ValueError, TypeError):
        raise
    except (ArithmeticError, np.linalg.LinAlgError) as exc:
        # the policy of gpc.exceptions: a bare numerical failure leaves as a NumericalError
        raise DivergenceError(f"{key}: {exc}", method=key) from exc
    if jitter:
        result.info["jitter"] = jitter
    return _check_result(result, key)


#: a log evidence above this is impossible for a probability of discrete labels (≤ 0); the
#: margin covers rounding of sums over n ≤ 1e6 terms of size ≤ 1e3 (1e-16 · 1e9 ≈ 1e-7)
_LOG_EVIDENCE_SLACK = 1e-6


def _check_result(result, method):
    """Never hand out an impossible value (gpc.exceptions policy): a non-finite mean or log
    evidence, or a log evidence above 0 (every method's evidence approximates or bounds the
    probability of the labels, so ln Z ≤ 0)."""
    evidence = float(result.log_evidence)
    if not np.isfinite(evidence) or evidence > _LOG_EVIDENCE_SLACK:
        raise DivergenceError(f"{method}: impossible log evidence {evidence:.6g} (a log probability of "
                              "the labels is finite and ≤ 0); the iteration diverged", method=method,
                              value=evidence)
    bad = np.flatnonzero(~np.isfinite(result.posterior.mean))
    if bad.size:
        raise DivergenceError(f"{method}: non-finite posterior mean at site {bad[0]}", method=method,
                              index=bad[0], value=result.posterior.mean[bad[0]])
    return result


__all__ = ["infer", "available_methods", "InferenceResult", "Method", "METHODS"]
