"""What every inference method returns."""

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np


@dataclass(repr=False)
class InferenceResult:
    """A Gaussian approximation q(f) = N(mean, cov) to the posterior of the training latents.

    Attributes
    ----------
    method, schedule : str
        The method and the schedule that produced it.
    likelihood : gpc.likelihoods.Likelihood
    posterior : SitePosterior (or an object with the same ``mean``, ``cov()``, ``diag_cov()``,
        ``predict()``, ``site_precision``, ``site_location``)
    log_evidence : float
        The method's approximation of (or bound on) log p(y | X, θ).
    n_iter : int
        Sweeps or Newton steps taken.
    converged : bool
        Whether the tolerance was met before ``max_iter``.
    gradient_matrix : callable or None
        Returns the symmetric n x n matrix M with ∂ log_evidence / ∂θ_k = Σ_ij M_ij ∂K_ij/∂θ_k, so
        that any kernel's contraction gives the gradient without an n x n x p tensor.  None where the
        method has no gradient.
    info : dict
        Method-specific state, used to warm start the next call (e.g. Laplace's mode ``"f"`` and
        ``"a"``, KL's ``"alpha"`` and ``"w"``), and what the run met.  EP: ``"ep_fixed_point"``
        (True when the run converged and its final sweep needed no negative-variance fallback, so
        the evidence is that of an EP fixed point), ``"n_fallback"`` (the final sweep's updates
        handled by ``on_negative``), ``"n_negative_sites"``, ``"n_negative_handled"`` (over the
        run).  EP and PL, parallel schedule: ``"damping"``, ``"damping_halved_at"`` and, when a
        ``tol`` below the updates' rounding level ended the run, ``"rounding_floor"``.
    lower_gradient_matrix : callable or None
        The same M with only its lower triangle (and diagonal) set, where a method saves the
        mirroring by it; None: ``gradient_matrix`` serves.
    """

    method: str
    schedule: Optional[str]
    likelihood: Any
    posterior: Any
    log_evidence: float
    n_iter: int
    converged: bool
    gradient_matrix: Optional[Callable[[], np.ndarray]] = None
    info: dict = field(default_factory=dict)
    lower_gradient_matrix: Optional[Callable[[], np.ndarray]] = None

    def __repr__(self):
        """A one-line summary: method (and schedule), n, log evidence, convergence, iterations."""
        method = f"method={self.method!r}"
        if self.schedule is not None:
            method += f", schedule={self.schedule!r}"
        mean = getattr(self.posterior, "mean", None)
        n = "?" if mean is None else len(mean)
        return (f"InferenceResult({method}, n={n}, log_evidence={float(self.log_evidence):.6g}, "
                f"converged={bool(self.converged)}, n_iter={int(self.n_iter)})")

    @property
    def mean(self):
        return self.posterior.mean

    @property
    def cov(self):
        return self.posterior.cov()

    @property
    def site_precision(self):
        return self.posterior.site_precision

    @property
    def site_location(self):
        return self.posterior.site_location

    def log_evidence_gradient(self, contract, lower=False):
        """∂ log_evidence / ∂θ given ``contract(M) = Σ_ij M_ij ∂K_ij/∂θ`` (a kernel's gradient_contract);
        ``lower``: ``contract`` reads only the lower triangle of M (a symmetric contraction)."""
        if self.gradient_matrix is None:
            raise NotImplementedError(f"method {self.method!r} provides no evidence gradient")
        matrix = self.lower_gradient_matrix if lower and self.lower_gradient_matrix else self.gradient_matrix
        return np.asarray(contract(matrix()), dtype=np.float64)

    def __getstate__(self):
        # a method's gradient_matrix may be a closure, which pickle cannot store; a pickled result
        # keeps everything prediction needs and drops such a closure
        state = dict(self.__dict__)
        for key in ("gradient_matrix", "lower_gradient_matrix"):
            g = state.get(key)
            if g is not None and "<locals>" in getattr(g, "__qualname__", ""):
                state[key] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def predict(self, K_cross, k_diag, prior_mean=0.0):
        """Latent predictive mean and variance at test inputs (see SitePosterior.predict)."""
        return self.posterior.predict(K_cross, k_diag, prior_mean)
