"""Online ADF: the sequential algorithm of the MF paper, §5 eq. (10)-(12) (Csató et al.; Opper 1996).

q_t is a Gaussian process with mean ⟨a(x)⟩_t = m0(x) + Σ_j K(x, x_j) α_j(t) and covariance
K_t(x, x') = K(x, x') + Σ_ij K(x, x_i) C_ij(t) K(x_j, x') (MF eq. (10)-(11)).  Datum t+1 is absorbed by
Bayes' rule and projected back on the Gaussians by matching the first two moments:

    s = C(t) k_{t+1} + e_{t+1}
    α(t+1) = α(t) + κ1(t) s,         C(t+1) = C(t) + κ2(t) s sᵀ                         MF eq. (12)
    κ1 = ∂ ln Z_t / ∂μ,  κ2 = ∂² ln Z_t / ∂μ²,  Z_t = ⟨P(y_{t+1} | a_{t+1})⟩_t = ∫ P(y|a) N(a | μ, σ²) da,
    μ = ⟨a_{t+1}⟩_t,  σ² = K_t(x_{t+1}, x_{t+1}).

Our α is the paper's y ∘ α (the paper folds the labels out, eq. (3)), so the update has no "⊗ y".
κ1 and κ2 come from the likelihood's tilted moments (mean', var') of P(y|a) N(a | μ, σ²):
κ1 = (mean' − μ)/σ², κ2 = (var' − σ²)/σ⁴ — the paper's probit/step expressions are the closed forms.
No matrix is inverted.  The evidence is Σ_t ln⟨P(y_{t+1})⟩_t over the first sweep, every datum
included (the paper's sum from t = 1 drops the first datum: an index slip, derivations §4).

Further sweeps (``n_sweeps`` > 1) present the data again as if new (the paper's heuristic, §6): they
double-count the data and have no probabilistic justification, so ``log_evidence`` stays the first
sweep's; ``info["sweep_log_z"]`` has every sweep's sum.

Gradient: the evidence depends on θ through the whole recursion; no analytic gradient is implemented
(``gradient_matrix`` is None).  It is a smooth function of K for probit/logit, so an optimiser may use
finite differences of it (its registry entry says ``has_gradient=False``).

Equivalence: one pass in the natural order equals the first sweep of sequential EP started from zero
sites (each site is visited once, its cavity is the current marginal, moment matching is the same).
"""

import numpy as np

from .. import _meanfield
from ._result import InferenceResult


class OnlinePosterior:
    """The ADF posterior held as (α, C): mean m0 + Kα, covariance K + K C K (MF eq. (10)-(11)).

    Attributes
    ----------
    mean : ndarray (n,)
    alpha : ndarray (n,)
    C : ndarray (n, n)
    site_precision, site_location : ndarray (n,)
        The Gaussian sites that ADF's moment matching added (summed over sweeps); with every
        τ ≥ 0 the posterior equals SitePosterior(K, τ, ν, m0).
    """

    def __init__(self, K, alpha, C, prior_mean, tau, nu):
        self.K = K
        self.alpha = alpha
        self.C = C
        self.prior_mean = prior_mean
        self.mean = prior_mean + K @ alpha
        self.site_precision = tau
        self.site_location = nu
        self._cov = None

    def cov(self):
        """K + K C K (MF eq. (11))."""
        if self._cov is None:
            KC = self.K @ self.C
            self._cov = self.K + KC @ self.K
            self._cov = 0.5 * (self._cov + self._cov.T)
        return self._cov

    def diag_cov(self):
        """diag(K + K C K)."""
        if self._cov is not None:
            return np.diag(self._cov).copy()
        return np.diag(self.K) + np.einsum("ij,ij->j", self.K, self.C @ self.K)

    def predict(self, K_cross, k_diag, prior_mean=0.0):
        """Predictive mean m0* + k*ᵀα and variance k** + k*ᵀ C k* (MF eq. (10)-(11))."""
        mean = prior_mean + K_cross.T @ self.alpha
        var = k_diag + np.einsum("ij,ij->j", K_cross, self.C @ K_cross)
        return mean, np.maximum(var, 0.0)


def run(K, y, likelihood, prior_mean, *, schedule=None, max_iter=None, tol=None, n_sweeps=1,
        order=None, warm_start=None):
    """Assumed-density filtering over the data, MF eq. (10)-(12).

    Parameters
    ----------
    K, y, likelihood, prior_mean
        As for :func:`gpc.inference.infer`; any likelihood with ``tilted_moments``.
    schedule, max_iter, tol
        Accepted for the common signature; a sweep count is ``n_sweeps``, and ``max_iter``, when given,
        caps it.  ``tol`` is unused (ADF is not iterated to convergence).
    n_sweeps : int
        Passes over the data (default 1: the algorithm of the paper; more is its heuristic).
    order : array-like of int, optional
        The order in which the data are presented (default: natural order).
    warm_start : dict, optional
        Streaming: ``{"alpha", "C", "log_evidence", "site_precision", "site_location"}`` from a previous
        call on the first n_old points (``info`` of its result); the new points n_old..n−1 of K and y
        are then absorbed in one pass (``partial_fit``).  Not combinable with ``order``/``n_sweeps``.

    Returns
    -------
    InferenceResult
        ``converged`` is True (a fixed number of passes); ``n_iter`` = passes made.
    """
    n = K.shape[0]
    m0 = prior_mean
    n_sweeps = int(n_sweeps)
    if n_sweeps < 1:
        raise ValueError(f"n_sweeps must be >= 1, got {n_sweeps}")
    if max_iter is not None:
        n_sweeps = min(n_sweeps, max_iter)
    if order is not None:
        perm = np.asarray(order, dtype=np.intp)
        if perm.shape != (n,) or not np.array_equal(np.sort(perm), np.arange(n)):
            raise ValueError("order must be a permutation of range(n)")
        Kp = np.ascontiguousarray(K[np.ix_(perm, perm)])
        res = run(Kp, y[perm], likelihood, m0[perm], n_sweeps=n_sweeps)
        inv = np.empty(n, dtype=np.intp)
        inv[perm] = np.arange(n)
        post = res.posterior
        new_post = OnlinePosterior(K, post.alpha[inv], np.ascontiguousarray(post.C[np.ix_(inv, inv)]),
                                   m0, post.site_precision[inv], post.site_location[inv])
        res.posterior = new_post
        res.info.update(alpha=new_post.alpha, C=new_post.C, order=perm)
        return res

    alpha = np.zeros(n)
    C = np.zeros((n, n))              # lower triangle kept during the sweeps (C order)
    tau = np.zeros(n)
    nu = np.zeros(n)
    start = 0
    log_z0 = 0.0
    if warm_start is not None:
        n_old = len(warm_start["alpha"])
        if n_old > n:
            raise ValueError("warm_start holds more points than K")
        alpha[:n_old] = warm_start["alpha"]
        C[:n_old, :n_old] = np.tril(warm_start["C"])
        tau[:n_old] = warm_start["site_precision"]
        nu[:n_old] = warm_start["site_location"]
        log_z0 = float(warm_start["log_evidence"])
        start = n_old
        n_sweeps = 1
    s = np.zeros(n)
    sweep_log_z = []
    ys = np.empty(1)
    mu_a, var_a = np.empty(1), np.empty(1)
    for sweep in range(n_sweeps):
        total = 0.0
        first = sweep == 0
        for t in range(start if first else 0, n):
            k = K[t]
            # first pass in natural order: C is zero outside the leading t x t block
            a = t if first else n
            s[:] = 0.0
            _meanfield.symv_lower(C, k, s, a)                  # s = C(t) k_{t+1}
            quad = k[:a] @ s[:a]                               # k ᵀ C k
            s[t] += 1.0                                        # + e_{t+1}
            mu = m0[t] + k @ alpha                             # ⟨a_{t+1}⟩_t, MF eq. (10)
            var = K[t, t] + quad                               # σ²(t), MF eq. (11)
            if not var > 0.0:
                raise ArithmeticError(f"online ADF: non-positive predictive variance {var:.3g} at "
                                      f"datum {t} (K not positive definite?)")
            ys[0], mu_a[0], var_a[0] = y[t], mu, var
            log_z, mean_t, var_t = likelihood.tilted_moments(ys, mu_a, var_a)
            log_z, mean_t, var_t = float(log_z[0]), float(mean_t[0]), float(var_t[0])
            kappa1 = (mean_t - mu) / var                       # ∂ ln Z/∂μ
            kappa2 = (var_t - var) / (var * var)               # ∂² ln Z/∂μ²
            b = t + 1 if first else n
            alpha[:b] += kappa1 * s[:b]                        # MF eq. (12)
            _meanfield.syr_lower(C, s, kappa2, b)              # MF eq. (12)
            total += log_z
            # the Gaussian site this step multiplied in (for site_precision / site_location)
            tau[t] += 1.0 / var_t - 1.0 / var
            nu[t] += mean_t / var_t - mu / var
        sweep_log_z.append(total + (log_z0 if first else 0.0))
    C = np.tril(C) + np.tril(C, -1).T
    posterior = OnlinePosterior(K, alpha, C, m0, tau, nu)
    return InferenceResult("online", None, likelihood, posterior, sweep_log_z[0], n_sweeps, True, None,
                           info={"alpha": alpha, "C": C, "log_evidence": sweep_log_z[0],
                                 "sweep_log_z": sweep_log_z, "site_precision": tau,
                                 "site_location": nu})
