"""Slow, obvious NumPy references for the issue-4 tests (KL, VB, mean field, online ADF).

Nothing here is fast or clever: explicit inverses, explicit quadrature, explicit loops, straight from
the papers, so that the package's factored code can be checked against them on small problems.
"""

import itertools

import numpy as np
from scipy.special import expit, log_ndtr
from scipy.stats import multivariate_normal, norm


def rbf(X, amplitude=2.0, length=1.0):
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return amplitude * np.exp(-0.5 * d2 / length ** 2)


def exact_log_z_probit(K, y):
    """ln Z for probit: P(y_i (f_i + ε_i) > 0 ∀i) = orthant probability of N(0, D (K + I) D)."""
    n = len(y)
    C = np.diag(y) @ (K + np.eye(n)) @ np.diag(y)
    p = multivariate_normal(mean=np.zeros(n), cov=C, maxpts=10**7, abseps=1e-12,
                            releps=1e-10).cdf(np.zeros(n))
    return float(np.log(p))


def exact_log_z_quadrature(K, y, log_lik, order=80):
    """ln ∫ Π p(y_i|f_i) N(f|0,K) df by a tensor Gauss-Hermite rule in whitened coordinates f = L x."""
    n = len(y)
    x, w = np.polynomial.hermite_e.hermegauss(order)
    w = w / w.sum()
    L = np.linalg.cholesky(K)
    grids = np.array(list(itertools.product(range(order), repeat=n)))
    X = x[grids]                       # (order^n, n)
    W = np.prod(w[grids], axis=1)
    F = X @ L.T
    lp = log_lik(y[None, :] * F).sum(axis=1)
    mx = lp.max()
    return float(mx + np.log(np.sum(W * np.exp(lp - mx))))


def logit_log_lik(t):
    return -np.logaddexp(0.0, -t)


def probit_log_lik(t):
    return log_ndtr(t)


def kl_bound_explicit(K, y, m, V, log_lik, order=100):
    """ln Z_B = Σ E_q[ln p(y_i|f_i)] − KL(N(m,V) ‖ N(0,K)) with explicit inverses (NR eq. (9), (15))."""
    n = len(y)
    x, w = np.polynomial.hermite_e.hermegauss(order)
    w = w / w.sum()
    v = np.diag(V)
    E = sum(np.sum(w * log_lik(y[i] * (m[i] + np.sqrt(v[i]) * x))) for i in range(n))
    Kinv = np.linalg.inv(K)
    kl = 0.5 * (np.trace(Kinv @ V) + m @ Kinv @ m - n - np.linalg.slogdet(V)[1] + np.linalg.slogdet(K)[1])
    return E - kl


def vb_logit_explicit(K, y, n_iter=2000):
    """Gibbs-MacKay VB for logit with explicit matrices: EM on ς, NR eq. (18)-(19) verbatim."""
    n = len(y)
    xi = np.sqrt(np.diag(K))
    Kinv = np.linalg.inv(K)
    for _ in range(n_iter):
        lam = np.tanh(xi / 2) / (4 * xi)
        A = np.diag(-lam)
        bvec = 0.5 * np.ones(n)
        c = np.log(expit(xi)) - xi / 2 + lam * xi ** 2
        V = np.linalg.inv(Kinv - 2 * A)
        m = V @ (bvec * y)
        xi = np.sqrt(m ** 2 + np.diag(V))
    lam = np.tanh(xi / 2) / (4 * xi)
    A = np.diag(-lam)
    c = np.log(expit(xi)) - xi / 2 + lam * xi ** 2
    by = 0.5 * y
    log_z = (c.sum() + 0.5 * by @ np.linalg.inv(Kinv - 2 * A) @ by
             - 0.5 * np.linalg.slogdet(np.eye(n) - 2 * A @ K)[1])
    return float(log_z), xi


def ep_first_sweep(K, y, tilted_moments, prior_mean=None):
    """First sweep of sequential EP from zero sites, written the obvious way.

    Sites τ = ν = 0; for i = 0..n−1: cavity = current marginal (site i still zero), tilted moments,
    new site from moment matching, Σ and μ refreshed by the rank-one (Sherman-Morrison) update.
    Returns (μ, Σ, τ, ν, Σ_i ln Z_i).
    """
    n = len(y)
    m0 = np.zeros(n) if prior_mean is None else prior_mean
    Sigma = K.copy()
    mu = m0.copy()
    tau = np.zeros(n)
    nu = np.zeros(n)
    total = 0.0
    for i in range(n):
        cav_var = 1.0 / (1.0 / Sigma[i, i] - tau[i])
        cav_mean = cav_var * (mu[i] / Sigma[i, i] - nu[i])
        log_z, mean_t, var_t = (float(a[0]) for a in tilted_moments(np.array([y[i]]), np.array([cav_mean]),
                                                                       np.array([cav_var])))
        total += log_z
        new_tau = 1.0 / var_t - 1.0 / cav_var
        new_nu = mean_t / var_t - cav_mean / cav_var
        d_tau = new_tau - tau[i]
        tau[i], nu[i] = new_tau, new_nu
        si = Sigma[:, i].copy()
        Sigma = Sigma - (d_tau / (1.0 + d_tau * si[i])) * np.outer(si, si)
        # μ = Σ (K⁻¹ m0 + ν), written without K⁻¹ via the sites: μ = m0 + Σ (ν − τ m0)
        mu = m0 + Sigma @ (nu - tau * m0)
    return mu, Sigma, tau, nu, total


def mf_ensemble_free_energy(K, y, m, lam):
    """Variational free energy E_q ln q − E_q ln[π P] for q_j ∝ Θ(y_j a) N(a | m_j, λ_j), from the
    definition term by term (truncated-normal moments), for any (m, λ)."""
    s = np.sqrt(lam)
    z = y * m / s
    r = np.exp(norm.logpdf(z) - norm.logcdf(z))
    mean = m + y * s * r
    var = lam * (1 - r * (z + r))
    e2 = var + (mean - m) ** 2                     # E (a − m)²
    e_log_q = np.sum(-norm.logcdf(z) - 0.5 * np.log(2 * np.pi * lam) - e2 / (2 * lam))
    Kinv = np.linalg.inv(K)
    e_log_prior = (-0.5 * np.linalg.slogdet(2 * np.pi * K)[1] - 0.5 * mean @ Kinv @ mean
                   - 0.5 * np.sum(np.diag(Kinv) * var))
    return float(e_log_q - e_log_prior)
