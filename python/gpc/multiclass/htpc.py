"""HTPC: the heavy-tailed process classifier, RMGPC's third column (RMGPC §4, after Wauthier & Jordan).

RMGPC §4 describes it in one sentence: the prior of each latent function f_k is a Gaussian process
"non-linearly transformed to have marginals that follow hyperbolic secant distributions with scale
parameter b_k", inference is by the Laplace approximation, and γ and the b_k maximise that
approximation's evidence.  What the paper leaves out is written down in docs/derivations-rmgpc.md
("HTPC"); in short:

* the copula transform: u_k ~ GP(0, K), f_k(x) = g_{b_k}(u_k(x)/√κ(x, x)) with
  g_b(u) = (2b/π) log tan(π Φ(u)/2), the inverse CDF of the hyperbolic secant density
  (1/(2b)) sech(π f/(2b)) applied to Φ(u);  g′_b(u) = 2b φ(u)/sin(π Φ(u)) and
  g″_b(u) = −g′_b(u) [u + π φ(u) cot(π Φ(u))];
* the likelihood, which RMGPC does not name: the multinomial logit p(y | f) = exp f_y / Σ_k exp f_k
  (the smooth likelihood the Laplace approximation needs; the argmax of eq. (1) has no curvature);
* Laplace in u: the mode of Ψ(u) = log p(y | g(u)) − ½ Σ_k u_kᵀ K⁻¹ u_k by Newton's method, and
  log Z ≈ Ψ(û) − ½ log |I + W K|, W = −∇²_u log p(y | g(u)) at û (block diagonal in the points,
  l × l per point, not positive semi-definite in general because of g″);
* the predictive distribution: u(x*) | y ≈ N(Q*ᵀ â, κ* − Q*ᵀ (I + W K)⁻¹ W Q*) and
  P(y* = k) = E[softmax(g(u(x*)))] by Monte Carlo with a fixed seed.

Threads: the fit's O((n l)³) work (the whitened Hessian's products and its Cholesky factor) runs
on scipy's BLAS with the threads the thread policy grants the "htpc" engine (gpc._threads.RULES):
the call's workers (the estimator's n_jobs) from n l = ``gpc._threads.HTPC_BLAS_FROM`` on, one
thread below.  Below that size a Newton step is a few milliseconds of calls too small to share
among threads, and idle OpenBLAS threads spin on cores that other work wants
(bench/bench_htpc_threads.py measures the default against one thread).

Memory: the fit holds the l² n curvature blocks, the whitened Hessian and its Cholesky factor,
2 (n l)² doubles at the peak (576 MB at n = 1000, l = 6).  The result keeps only what prediction
needs, (l + 2) n² doubles (64 MB there, where the dense predictive solve kept three (n l)²
matrices): K, the l Cholesky factors of I + D_c^½ K D_c^½ and one n × n factor of a Woodbury
correction (:func:`htpc_latent_moments`, docs/derivations-rmgpc.md).

As ``MultiClassGPC``'s model "heavy-tailed": :func:`evidence` (the Laplace evidence at the
estimator's θ, with a forward-difference gradient) and :func:`predictive`.
"""

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor, cho_solve, cholesky, eigh, solve_triangular
from scipy.linalg.blas import dgemm
from scipy.special import log_ndtr

from .._linalg import cholesky_lower
from .._special import LOG_SQRT_2PI
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from .. import _threads

#: Monte Carlo samples of u(x*) per test point in the predictive integral
N_PREDICT_SAMPLES = 2000
#: the hyperbolic secant scales b_k as hyperparameters: starting value and bounds
SCALE_INIT, SCALE_BOUNDS = 1.0, (1e-2, 1e2)
#: the evidence's gradient is a forward difference in log space with this step; the Newton
#: iteration underneath is run to 1e-9 on û so that the difference is not noise
FD_STEP, NEWTON_TOL = 1e-5, 1e-9


def _log_sin_pi_half(log_p):
    """log sin(π p/2) for p = exp(log_p) in (0, 1], stable for tiny p (sin x = x · sin x/x)."""
    x = 0.5 * np.pi * np.exp(log_p)
    return np.log(0.5 * np.pi) + log_p + np.log(np.sinc(x / np.pi))


def secant_transform(u, b):
    """g_b(u), g′_b(u) and g″_b(u) of the hyperbolic-secant copula (see the module docstring).

    Written with Φ(−|u|) only, so that no 1 − Φ cancels: g_b(u) = sign(u)(2b/π)[log sin(πΦ(|u|)/2)
    − log sin(πΦ(−|u|)/2)], and sin(πΦ(u)) = sin(πΦ(−|u|)).

    Parameters
    ----------
    u : ndarray
        Standardised Gaussian values.
    b : float or ndarray broadcastable to u
        Scales of the hyperbolic secant marginals (> 0).

    Returns
    -------
    f, g1, g2 : ndarray
        g_b(u), its first and second derivatives.
    """
    u = np.asarray(u, dtype=float)
    a = np.abs(u)
    log_lo = log_ndtr(-a)                      # log Φ(−|u|)
    log_hi = log_ndtr(a)                       # log Φ(|u|)
    f = np.sign(u) * (2.0 * b / np.pi) * (_log_sin_pi_half(log_hi) - _log_sin_pi_half(log_lo))
    log_phi = -0.5 * u * u - LOG_SQRT_2PI
    p_lo = np.exp(log_lo)
    log_sin = np.log(np.pi) + log_lo + np.log(np.sinc(p_lo))         # log sin(π Φ(−|u|))
    ratio = np.exp(log_phi - log_sin)          # φ(u)/sin(π Φ(u)), ≈ |u|/π for large |u|
    g1 = 2.0 * b * ratio
    # π φ(u) cot(π Φ(u)): cot(π Φ(u)) = −sign(u) cot(π Φ(−|u|)) (cot(π − x) = −cot x); formed
    # from the ratio, as 1/sin(π Φ(−|u|)) alone overflows beyond |u| ≈ 37 (and φ(u) underflows)
    pi_phi_cot = -np.sign(u) * np.pi * np.cos(np.pi * p_lo) * ratio
    g2 = -g1 * (u + pi_phi_cot)
    return f, g1, g2


def secant_cdf(f, b):
    """CDF of the hyperbolic secant distribution with scale b: (2/π) arctan(exp(π f/(2b))).

    Parameters
    ----------
    f : ndarray
        Points.
    b : float
        Scale (> 0).
    """
    return (2.0 / np.pi) * np.arctan(np.exp(np.pi * np.asarray(f) / (2.0 * b)))


def _softmax(F):
    F = F - F.max(axis=-1, keepdims=True)
    E = np.exp(F)
    return E / E.sum(axis=-1, keepdims=True)


@dataclass
class HTPCLaplaceResult:
    """The Laplace approximation of HTPC at fixed (K, b), with what prediction needs.

    Attributes
    ----------
    u : ndarray (n, l)
        The posterior mode û of the standardised Gaussian latents.
    a : ndarray (n, l)
        K⁻¹ û, column by column.
    K : ndarray (n, n)
        The prior covariance of every u_k.
    curvature : ndarray (n, l)
        d = g′² π at û: the Gauss–Newton curvature of point i is W_i = diag(d_i) − w_i w_iᵀ
        (positive semi-definite), the curvature of the predictive distribution.
    coupling : ndarray (n, l)
        w = g′ π at û.
    class_factors : ndarray (l, n, n)
        Lower Cholesky factors L_c of I + D_c^½ K D_c^½, D_c = diag(d[:, c]).
    coupling_factor : ndarray (n, n)
        Lower Cholesky factor of S = I − Σ_c W_c P_c W_c, P_c = (K⁻¹ + D_c)⁻¹, W_c = diag(w[:, c]).
    log_evidence : float
        Ψ(û) − ½ log |I + W K| (W the full curvature, with g″).
    n_iter : int
        Newton steps taken.
    converged : bool
        Whether the step tolerance was met.
    """
    u: np.ndarray
    a: np.ndarray
    K: np.ndarray
    curvature: np.ndarray
    coupling: np.ndarray
    class_factors: np.ndarray
    coupling_factor: np.ndarray
    log_evidence: float
    n_iter: int
    converged: bool


def _likelihood_terms(U, Y, b, scale):
    """log p(y | g(u)), its gradient in u (n, l), and −∇²_u log p as per-point blocks: W (l, l, n)
    with W[k, j, i] = −∂² log p/∂u_ik ∂u_ij, and its Gauss–Newton part (dropping g″), for U (n, l),
    one-hot Y, scales b (l,) and √κ per point."""
    F, G1, G2 = secant_transform(U / scale[:, None], b[None, :])
    G1, G2 = G1 / scale[:, None], G2 / scale[:, None] ** 2
    P = _softmax(F)
    log_lik = float(np.sum(F[Y] - np.log(np.sum(np.exp(F - F.max(axis=1, keepdims=True)), axis=1))
                           - F.max(axis=1)))
    R = Y - P                                  # ∂ log p/∂f
    grad = G1 * R
    # per point: J (diag π − π πᵀ) J − diag(g″ r), J = diag g′: the Gauss–Newton part is
    # diag(d) − w wᵀ with d = g′² π, w = g′ π
    d, w = G1 ** 2 * P, G1 * P
    W = _gauss_newton_blocks(d, w)
    diag = np.arange(U.shape[1])
    W[diag, diag] -= (G2 * R).T
    return log_lik, grad, W, (d, w)


def _gauss_newton_blocks(d, w):
    """The blocks (l, l, n) of the Gauss–Newton curvature diag(d_i) − w_i w_iᵀ, from d, w (n, l)."""
    W = -w.T[:, None, :] * w.T[None, :, :]
    diag = np.arange(d.shape[1])
    W[diag, diag] += d.T
    return W


def _dense_curvature(W):
    """The blocks W (l, l, n) as the (n l) × (n l) matrix, class-major (index k n + i)."""
    l, _, n = W.shape
    out = np.zeros((l * n, l * n))
    idx = np.arange(n)
    for k in range(l):
        for j in range(l):
            out[k * n + idx, j * n + idx] = W[k, j]
    return out


def _whitened_hessian(W, L, n, l):
    """B = I + (I_l ⊗ L)ᵀ W (I_l ⊗ L): −∇²Ψ in the whitened coordinates w (u_k = L w_k), from the
    curvature blocks W (l, l, n).  Each block Lᵀ diag(W[k, j]) L is one dgemm on scipy's BLAS, the
    library whose threads factor B next (no second pool's threads waiting in between)."""
    B = np.empty((l * n, l * n))
    for k in range(l):
        for j in range(k + 1):      # W is symmetric, so block (j, k) is block (k, j)
            block = dgemm(1.0, L, W[k, j][:, None] * L, trans_a=True)
            B[k * n:(k + 1) * n, j * n:(j + 1) * n] = block
            B[j * n:(j + 1) * n, k * n:(k + 1) * n] = block
    B[np.arange(l * n), np.arange(l * n)] += 1.0
    return B



def htpc_laplace(K, y, n_classes, b, max_iter=100, tol=1e-8, init=None, max_escapes=5):
    """Laplace approximation of HTPC at fixed K (shared by the classes) and scales b.

    Newton's method on Ψ in whitened coordinates (u_k = L w_k, K = L Lᵀ), where −∇²Ψ is
    B = I + Lᵀ W L.  W is indefinite (the g″ term), so where B is not positive definite the step uses
    the Gauss–Newton B (W without g″, positive semi-definite), always an ascent direction; a line
    search keeps Ψ increasing.  The posterior in u can be multimodal: with l = 2 the symmetric point
    u₁ = −u₂ is a saddle (g′ is smallest at 0, so moving both latents the same way sharpens the
    likelihood), and a stationary point where B is not positive definite is left along B's most
    negative eigenvector (up to ``max_escapes`` times).

    Parameters
    ----------
    K : ndarray (n, n)
        Covariance of every u_k (RMGPC eq. (22)'s shared kernel).
    y : int array (n,)
        Class indices 0 … l−1.
    n_classes : int
        l ≥ 2.
    b : array (l,)
        Hyperbolic secant scales b_k.
    max_iter : int
        Newton steps.
    tol : float
        Stop when the largest change of û is below tol.
    init : HTPCLaplaceResult, optional
        Warm start from its mode.
    max_escapes : int
        Restarts from a saddle point along the negative-curvature direction.

    Returns
    -------
    HTPCLaplaceResult
    """
    with _threads.blas("htpc", len(y) * int(n_classes)):
        return _laplace(K, y, n_classes, b, max_iter, tol, init, max_escapes)


def _laplace(K, y, n_classes, b, max_iter, tol, init, max_escapes):
    """htpc_laplace's Newton iteration."""
    y = np.asarray(y, dtype=np.intp)
    n, l = y.shape[0], int(n_classes)
    b = np.asarray(b, dtype=float)
    Y = np.zeros((n, l), dtype=bool)
    Y[np.arange(n), y] = True
    scale = np.sqrt(np.diag(K))
    L = cholesky_lower(K, name="K")[0]
    Wt = np.zeros((n, l))
    if init is not None and init.u.shape == (n, l):
        Wt = solve_triangular(L, init.u, lower=True)

    def psi(Wt):
        return _likelihood_terms(L @ Wt, Y, b, scale)[0] - 0.5 * float(np.sum(Wt * Wt))

    def flat(M):
        return M.T.ravel()

    value, converged, escapes, it = psi(Wt), False, 0, 0
    while it < max_iter:
        it += 1
        _, grad, W, gauss_newton = _likelihood_terms(L @ Wt, Y, b, scale)
        g_w = flat(L.T @ grad - Wt)
        try:
            direction = cho_solve(cho_factor(_whitened_hessian(W, L, n, l), lower=True,
                                             overwrite_a=True), g_w)
        except np.linalg.LinAlgError:
            W = _gauss_newton_blocks(*gauss_newton)
            direction = cho_solve(cho_factor(_whitened_hessian(W, L, n, l), lower=True,
                                             overwrite_a=True), g_w)
        dW = direction.reshape(l, n).T
        step = 1.0
        for _ in range(40):
            new_value = psi(Wt + step * dW)
            if new_value >= value:
                break
            step *= 0.5
        else:
            step = 0.0
        new = Wt + step * dW
        change = float(np.max(np.abs(L @ (new - Wt))))
        Wt, value = new, max(new_value, value) if step else value
        if change < tol:
            _, _, W, _ = _likelihood_terms(L @ Wt, Y, b, scale)
            B = _whitened_hessian(W, L, n, l)
            try:       # a maximum exactly when B is positive definite; its factor gives the evidence
                factor = cho_factor(B, lower=True)
                converged = True
                break
            except np.linalg.LinAlgError:
                pass
            if escapes == max_escapes:
                break
            escapes += 1      # a saddle: step along the negative curvature, whichever way is up
            v = eigh(B, subset_by_index=[0, 0])[1][:, 0].reshape(l, n).T
            for t in (1.0, -1.0, 0.5, -0.5, 0.25, -0.25):
                trial = psi(Wt + t * v)
                if trial > value:
                    Wt, value = Wt + t * v, trial
                    break
    if not converged:
        warnings.warn(f"HTPC's Newton iteration did not reach a maximum in {max_iter} steps",
                      ConvergenceWarning, stacklevel=2)
    U = L @ Wt
    _, _, W, (d, w) = _likelihood_terms(U, Y, b, scale)
    if not converged:
        try:
            factor = cho_factor(_whitened_hessian(W, L, n, l), lower=True, overwrite_a=True)
        except np.linalg.LinAlgError:
            raise NotPositiveDefiniteError("HTPC's Laplace approximation: the Hessian at the end "
                                           "point is not negative definite (no maximum found)") from None
    logdet = 2.0 * float(np.sum(np.log(np.diag(factor[0]))))
    del factor, W
    A = solve_triangular(L.T, Wt, lower=False)                  # K⁻¹ û = L⁻ᵀ w
    class_factors, coupling_factor = _predictive_factors(K, d, w)
    return HTPCLaplaceResult(u=U, a=A, K=K, curvature=d, coupling=w, class_factors=class_factors,
                             coupling_factor=coupling_factor, log_evidence=value - 0.5 * logdet,
                             n_iter=it, converged=converged)


def _predictive_factors(K, d, w):
    """The factors :func:`htpc_latent_moments` solves with: L_c of B_c = I + D_c^½ K D_c^½ for every
    class, and L_S of S = I − Σ_c W_c P_c W_c with P_c = (K⁻¹ + D_c)⁻¹ = K − K D_c^½ B_c⁻¹ D_c^½ K
    (docs/derivations-rmgpc.md, "HTPC's predictive covariance")."""
    n, l = d.shape
    factors = np.empty((l, n, n))
    S = np.eye(n)
    for c in range(l):
        sd = np.sqrt(d[:, c])
        B = sd[:, None] * K * sd[None, :]
        B[np.diag_indices(n)] += 1.0
        factors[c] = cholesky(B, lower=True)
        V = solve_triangular(factors[c], sd[:, None] * K, lower=True)     # L_c⁻¹ D_c^½ K
        P = K - dgemm(1.0, V, V, trans_a=True)
        S -= w[:, c][:, None] * P * w[:, c][None, :]
    coupling, _ = cholesky_lower(S, name="HTPC's predictive coupling matrix")
    return factors, coupling


def htpc_latent_moments(result, K_cross, k_diag):
    """Laplace predictive of u(x*): mean Q*ᵀ â and covariance κ* I − Q*ᵀ (𝐊 + W⁻¹)⁻¹ Q*.

    W is the Gauss–Newton curvature (positive semi-definite), so the covariance never exceeds the
    prior's: with the full Hessian, whose g″ term is indefinite, a mode where K⁻¹ + W is nearly
    singular gave latent standard deviations of 26 against a prior 1 on wine (and a balanced class
    rate of 63 % instead of 92 %; docs/derivations-rmgpc.md).  W = D − U Uᵀ is diagonal plus rank n
    (D = diag(g′² π), U stacks the diagonal matrices W_c = diag(g′_c π_c)), and Woodbury's identity
    with E = D^½ (I + D^½ 𝐊 D^½)⁻¹ D^½ (block diagonal, one n × n factor per class) gives

        (𝐊 + W⁻¹)⁻¹ = (I + W 𝐊)⁻¹ W = E − V S⁻¹ Vᵀ,   V = (I − E 𝐊) U,   S = I − Uᵀ (𝐊 − 𝐊 E 𝐊) U,

    which needs no W⁻¹ (W is singular: its rows sum to zero in f) and no (n l)² matrix
    (docs/derivations-rmgpc.md, "HTPC's predictive covariance").

    Parameters
    ----------
    result : HTPCLaplaceResult
        The fitted approximation.
    K_cross : ndarray (m, n)
        k(x*, X).
    k_diag : ndarray (m,)
        k(x*, x*).

    Returns
    -------
    mean : ndarray (m, l)
    cov : ndarray (m, l, l)
        The l classes' covariance at each test point.
    """
    n, l = result.a.shape
    m = K_cross.shape[0]
    mean = K_cross @ result.a
    Kt = np.ascontiguousarray(K_cross.T)                          # (n, m): the columns k*
    quad = np.empty((l, m))                                       # k*ᵀ E_c k*
    J = np.empty((l, n, m))                                       # L_S⁻¹ Vᵀ Q*, class by class
    for c in range(l):
        sd = np.sqrt(result.curvature[:, c])
        T = solve_triangular(result.class_factors[c], sd[:, None] * Kt, lower=True)
        quad[c] = np.einsum("im,im->m", T, T)
        EK = sd[:, None] * solve_triangular(result.class_factors[c], T, lower=True, trans="T")
        H = result.coupling[:, c][:, None] * (Kt - result.K @ EK)   # W_c (I − K E_c) k*
        J[c] = solve_triangular(result.coupling_factor, H, lower=True)
    cov = np.einsum("cim,dim->mcd", J, J)
    cov[:, np.arange(l), np.arange(l)] += (np.asarray(k_diag)[None, :] - quad).T
    return mean, cov


def htpc_predict_proba(result, b, K_cross, k_diag, seed=0):
    """P(y* = k) = E[softmax(g(u*))] under :func:`htpc_latent_moments`, by Monte Carlo.

    Parameters
    ----------
    result : HTPCLaplaceResult
        The fitted approximation.
    b : array (l,)
        The scales b_k used to fit it.
    K_cross : ndarray (m, n)
        k(x*, X).
    k_diag : ndarray (m,)
        k(x*, x*).
    seed : int
        Seed of the Monte Carlo samples (fixed, so predictions are deterministic).

    Returns
    -------
    ndarray (m, l), rows summing to one.
    """
    mean, cov = htpc_latent_moments(result, K_cross, k_diag)
    m, l = mean.shape
    z = np.random.default_rng(seed).standard_normal((N_PREDICT_SAMPLES, l))
    scale = np.sqrt(k_diag)
    probs = np.empty((m, l))
    for j in range(m):
        w, V = np.linalg.eigh(cov[j])
        u = mean[j] + z @ (V * np.sqrt(np.maximum(w, 0.0))).T
        probs[j] = _softmax(secant_transform(u / scale[j], np.asarray(b)[None, :])[0]).mean(axis=0)
    return probs / probs.sum(axis=1, keepdims=True)


def evidence(est, theta, X, y, eval_gradient=True, init=None):
    """HTPC's Laplace approximation at θ = (kernel log θ, log b_k) and, with ``eval_gradient``, its
    log evidence's forward-difference gradient in θ (step :data:`FD_STEP`, each shifted fit
    warm-started from the one at θ); :class:`gpc.multiclass.models.MultiClassModel`'s ``evidence``.
    """
    kernels, scales, _ = est._unpack(theta)
    res = htpc_laplace(kernels[0](X), y, est.n_classes_, scales, max_iter=est.max_iter,
                       tol=NEWTON_TOL, init=init)
    if not eval_gradient:
        return res
    grad = np.empty_like(theta)
    for j in range(theta.size):
        step = np.zeros_like(theta)
        step[j] = FD_STEP
        shifted = evidence(est, theta + step, X, y, eval_gradient=False, init=res)
        grad[j] = (shifted.log_evidence - res.log_evidence) / FD_STEP
    return res, grad


def predictive(est, X):
    """P(y* = k | x*) of the fitted ``est`` at the rows X (:func:`htpc_predict_proba`), BLAS on the
    threads the "htpc" engine is granted for n l."""
    kern = est.kernels_[0]
    size = len(est.classes_) * est.X_train_.shape[0]
    with _threads.blas("htpc", size):
        return htpc_predict_proba(est.ep_result_, est.scales_, kern(X, est.X_train_), kern.diag(X))
