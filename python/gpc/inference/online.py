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

Numerics.  The recursion is run on Σ(t) = K + K C(t) K and the mean, which is
eq. (12) multiplied through by K: with s' = K s = Σ(t) e_{t+1},

    ⟨a⟩_{t+1} = ⟨a⟩_t + κ1 s',      Σ(t+1) = Σ(t) + κ2 s' s'ᵀ.

The paper's (α, C) form computes σ² = K_{t+1,t+1} + kᵀ C k, a difference of prior-sized terms with
C ≈ −K⁻¹ on the data seen; on a K that is numerically singular (long length scales, large
amplitudes: K passes the kernel check only with jitter) that difference loses every digit and can come
out negative.  In Σ form σ² is read off the
diagonal, the visited point's variance is set to the tilted variance itself, and the returned
posterior is rebuilt from ADF's Gaussian sites through B = I + S K S as EP's is.  A datum whose σ²
is zero to rounding (n ulp of K_tt) is already determined by the data seen: it contributes its
σ² → 0 limit ln P(y | μ) to the evidence and no site.

Further sweeps (``n_sweeps`` > 1) present the data again as if new (the paper's heuristic, §6): they
double-count the data and have no probabilistic justification, so ``log_evidence`` stays the first
sweep's; ``info["sweep_log_z"]`` has every sweep's sum.

Gradient: the evidence depends on θ through the whole recursion; no analytic gradient is implemented
(``gradient_matrix`` is None).  It is a smooth function of K for probit/logit, so an optimiser may use
finite differences of it (its registry entry says ``has_gradient=False``).

Order of presentation.  ADF's evidence is the prequential sum Σ_t ln p(y_{t+1} |
y_1..t) under its Gaussian approximations, and both it and the posterior depend on the order.  On data
sorted by class (the bundled data sets are) it rewards a near-constant latent function, which predicts
"the same label as before" well: type-II ML on crabs in file order went to σ² = 1e4, ℓ = 21.5, with
evidence −27.1 (EP's best: −29.1) and a posterior whose training error is 0.245 (EP's: 0.015); in a
random order the same kernel's evidence is −35.1 and the training error 0.02.  The estimator therefore
presents the data in a seeded random order (``order="random"``).

Equivalence: one pass in the natural order equals the first sweep of sequential EP started from zero
sites (each site is visited once, its cavity is the current marginal, moment matching is the same).
"""

import numpy as np

from .. import _meanfield
from ..exceptions import DivergenceError, NotPositiveDefiniteError
from ..posterior import site_posterior
from ._result import InferenceResult


def run(K, y, likelihood, prior_mean, *, schedule=None, max_iter=None, tol=None, n_sweeps=1,
        order=None, random_state=None, warm_start=None):
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
    order : None, "random" or array-like of int, optional
        The order in which the data are presented: natural order (None, the default), a permutation,
        or "random": one permutation drawn with ``random_state``.  ADF's posterior and evidence
        depend on it (see the module docstring); the estimator uses "random".
    random_state : int or None
        Seeds ``order="random"`` (None: seed 0, so that an evidence is a deterministic function of
        K, as type-II ML needs).
    warm_start : dict, optional
        Streaming: ``{"log_evidence", "site_precision", "site_location"}`` from a previous call on
        the first n_old points (``info`` of its result); the new points n_old..n−1 of K and y are then
        absorbed in one pass (``partial_fit``).  Not combinable with ``order``/``n_sweeps``.

    Returns
    -------
    InferenceResult
        ``converged`` is True (a fixed number of passes); ``n_iter`` = passes made.  ``info["alpha"]``
        holds α with mean m0 + K α (MF eq. (10)).
    """
    n = K.shape[0]
    m0 = prior_mean
    n_sweeps = int(n_sweeps)
    if n_sweeps < 1:
        raise ValueError(f"n_sweeps must be >= 1, got {n_sweeps}")
    if max_iter is not None:
        n_sweeps = min(n_sweeps, max_iter)
    if order is not None and warm_start is not None:
        raise ValueError("online: warm_start (streaming) absorbs the new points in the order given; "
                         "it cannot be combined with order")
    if isinstance(order, str):
        if order != "random":
            raise ValueError(f"order must be None, 'random' or a permutation, got {order!r}")
        if random_state is not None and not isinstance(random_state, (int, np.integer)):
            raise TypeError("online: random_state must be an int or None (the order must be the same "
                            f"in every evaluation of the evidence), got {type(random_state).__name__}")
        order = np.random.default_rng(0 if random_state is None else int(random_state)).permutation(n)
    if order is not None:
        perm = np.asarray(order, dtype=np.intp)
        if perm.shape != (n,) or not np.array_equal(np.sort(perm), np.arange(n)):
            raise ValueError("order must be a permutation of range(n)")
        Kp = np.ascontiguousarray(K[np.ix_(perm, perm)])
        res = run(Kp, y[perm], likelihood, m0[perm], n_sweeps=n_sweeps)
        inv = np.empty(n, dtype=np.intp)
        inv[perm] = np.arange(n)
        tau, nu = res.site_precision[inv], res.site_location[inv]
        res.posterior = _posterior(K, tau, nu, m0)
        res.info.update(alpha=res.posterior.alpha, site_precision=tau, site_location=nu, order=perm)
        return res

    tau = np.zeros(n)
    nu = np.zeros(n)
    start = 0
    log_z0 = 0.0
    if warm_start is not None:
        n_old = len(warm_start["site_precision"])
        if n_old > n:
            raise ValueError("warm_start holds more points than K")
        tau[:n_old] = warm_start["site_precision"]
        nu[:n_old] = warm_start["site_location"]
        log_z0 = float(warm_start["log_evidence"])
        start = n_old
        n_sweeps = 1
    if start:                           # the posterior of the points seen so far, over all of K
        prior = _posterior(K, tau, nu, m0)
        Sigma, mean = np.ascontiguousarray(prior.cov()).copy(), prior.mean.copy()
    else:
        Sigma, mean = np.array(K, dtype=np.float64, order="C"), np.array(m0, dtype=np.float64)
    # Σ's lower triangle (C order) is what the rank-one updates keep.  Its entries carry rounding
    # errors of ~n ulp of the prior variance; a σ² below that is zero to rounding
    floor = n * np.finfo(float).eps * np.abs(np.diag(K))
    sweep_log_z = []
    ys = np.empty(1)
    mu_a, var_a = np.empty(1), np.empty(1)
    for sweep in range(n_sweeps):
        total = 0.0
        first = sweep == 0
        for t in range(start if first else 0, n):
            s = np.concatenate([Sigma[t, :t], Sigma[t:, t]])    # Σ(t) e_{t+1} = K s of eq. (12)
            mu, var = mean[t], s[t]                            # ⟨a_{t+1}⟩_t, σ²(t): MF eq. (10)-(11)
            ys[0], mu_a[0] = y[t], mu
            if not var > floor[t]:
                # the data seen determine a_{t+1} to rounding (a nearly singular K): Z_t is its σ² → 0
                # limit P(y_{t+1} | μ), and the datum adds nothing to the posterior
                log_p = float(likelihood.log_prob(ys, mu_a)[0])
                if not np.isfinite(log_p):
                    raise DivergenceError(
                        f"online ADF: datum {t}'s latent value is determined by the data before it "
                        f"(posterior variance {var:.3g}: K is numerically of lower rank) at {mu:.3g}, "
                        f"where its label {y[t]:g} has probability 0 under the {likelihood.name} "
                        "likelihood: the evidence is 0", method="online", index=t, value=var)
                total += log_p
                continue
            var_a[0] = var
            log_z, mean_t, var_t = likelihood.tilted_moments(ys, mu_a, var_a)
            log_z, mean_t, var_t = float(log_z[0]), float(mean_t[0]), float(var_t[0])
            if not (np.isfinite(log_z) and np.isfinite(mean_t) and var_t > 0.0):
                raise DivergenceError(f"online ADF: the {likelihood.name} likelihood's tilted moments at "
                                      f"datum {t} are not a distribution (log Z {log_z:.3g}, mean "
                                      f"{mean_t:.3g}, variance {var_t:.3g})", method="online", index=t,
                                      value=var_t)
            kappa1 = (mean_t - mu) / var                       # ∂ ln Z/∂μ
            kappa2 = (var_t - var) / (var * var)               # ∂² ln Z/∂μ²
            mean += kappa1 * s                                 # MF eq. (12), times K
            _meanfield.syr_lower(Sigma, s, kappa2, n)          # MF eq. (12), K (·) K
            Sigma[t, t] = var_t                                # what the update computes, unrounded
            total += log_z
            # the Gaussian site this step multiplied in (for site_precision / site_location)
            tau[t] += 1.0 / var_t - 1.0 / var
            nu[t] += mean_t / var_t - mu / var
        sweep_log_z.append(total + (log_z0 if first else 0.0))
    posterior = _posterior(K, tau, nu, m0)
    return InferenceResult("online", None, likelihood, posterior, sweep_log_z[0], n_sweeps, True, None,
                           info={"alpha": posterior.alpha, "log_evidence": sweep_log_z[0],
                                 "sweep_log_z": sweep_log_z, "site_precision": tau,
                                 "site_location": nu})


def _posterior(K, tau, nu, m0):
    """q(f) ∝ N(f | m0, K) Π_t exp(−½ τ_t f_t² + ν_t f_t): the prior times the Gaussian factors ADF
    multiplied in, which is its (α, C) posterior exactly, held as every site method's is."""
    try:
        return site_posterior(K, tau, nu, m0)
    except NotPositiveDefiniteError as exc:   # negative sites (non-log-concave likelihood) + rounding
        i = int(np.argmin(tau))
        raise DivergenceError(f"online ADF: its sites do not give a positive definite posterior ({exc}); "
                              f"site {i} has precision {tau[i]:.3g}", method="online", index=i,
                              value=tau[i]) from exc
