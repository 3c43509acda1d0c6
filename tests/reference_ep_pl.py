"""Slow, obvious NumPy EP and PL, straight from R&W Alg. 3.5 / eq. (3.65) and PL eq. (9)-(18):
explicit inverses, one site at a time, the evidence through explicit matrices.  Only for tests."""

import numpy as np
from numpy.polynomial.hermite_e import hermegauss


def _posterior(K, tau, nu, m0):
    Kinv = np.linalg.inv(K)
    Sigma = np.linalg.inv(Kinv + np.diag(tau))
    return Sigma, Sigma @ (Kinv @ m0 + nu)


def ep_reference(K, y, likelihood, m0, sweeps, parallel=False):
    n = len(y)
    tau, nu = np.zeros(n), np.zeros(n)
    Sigma, mu = _posterior(K, tau, nu, m0)
    for _ in range(sweeps):
        if parallel:
            tc = 1 / np.diag(Sigma) - tau
            nc = mu / np.diag(Sigma) - nu
            _, mh, vh = likelihood.tilted_moments(y, nc / tc, 1 / tc)
            tau, nu = 1 / vh - tc, mh / vh - nc
            Sigma, mu = _posterior(K, tau, nu, m0)
            continue
        for i in range(n):
            tc = 1 / Sigma[i, i] - tau[i]
            nc = mu[i] / Sigma[i, i] - nu[i]
            _, mh, vh = likelihood.tilted_moments(y[i:i + 1], np.array([nc / tc]), np.array([1 / tc]))
            tau[i], nu[i] = 1 / vh[0] - tc, mh[0] / vh[0] - nc
            Sigma, mu = _posterior(K, tau, nu, m0)   # recomputed from scratch: no rank-one update
    # evidence: log ∫ N(f|m0,K) Π C_i t̃_i(f_i) df with explicit Gaussians
    tc = 1 / np.diag(Sigma) - tau
    nc = mu / np.diag(Sigma) - nu
    log_z, _, _ = likelihood.tilted_moments(y, nc / tc, 1 / tc)
    vc, mc = 1 / tc, nc / tc
    # site normaliser: C_i = Z_i / ∫ N(f|mc, vc) exp(−½ τ f² + ν f) df
    log_int = -0.5 * np.log(1 + tau * vc) + 0.5 * (nu + mc / vc) ** 2 / (tau + 1 / vc) - 0.5 * mc ** 2 / vc
    log_c = log_z - log_int
    Kinv = np.linalg.inv(K)
    h = Kinv @ m0 + nu
    log_prior_int = (0.5 * np.linalg.slogdet(Sigma)[1] - 0.5 * np.linalg.slogdet(K)[1]
                     + 0.5 * h @ Sigma @ h - 0.5 * m0 @ Kinv @ m0)
    return mu, Sigma, tau, nu, float(log_prior_int + log_c.sum())


def pl_reference(K, y, likelihood, m0, sweeps, order=20, sequential=False):
    """Iterated SLR (PL §III-B steps 1-4) and eq. (18) through explicit matrices.

    Parallel: every label relinearised at the same posterior, then one Kalman-type update.
    Sequential: label i relinearised at the current posterior marginal, its pseudo-observation
    y_i ≈ A_i f_i + b_i + e_i replacing the previous one, the posterior recomputed, then label i+1.
    """
    def slr(mean, var):                 # PL eq. (15)-(16)
        mu_y, cov_fy, var_y = likelihood.slr_moments(mean, var)
        A = cov_fy / var
        return A, mu_y - A * mean, var_y - A ** 2 * var

    n = len(y)
    mu, W = m0.copy(), K.copy()
    if sequential:
        Kinv = np.linalg.inv(K)
        tau, nu = np.zeros(n), np.zeros(n)
        for _ in range(sweeps):
            for i in range(n):
                A, b, Om = (v[0] for v in slr(mu[i:i + 1], W[i:i + 1, i]))
                tau[i], nu[i] = A ** 2 / Om, A * (y[i] - b) / Om
                W = np.linalg.inv(Kinv + np.diag(tau))
                mu = W @ (Kinv @ m0 + nu)
    else:
        for _ in range(sweeps):
            A, b, Om = slr(mu, np.diag(W))
            # PL eq. (10)-(11): Kalman-type update with y ≈ A f + b + e, e ~ N(0, Ω)
            S = np.diag(A) @ K @ np.diag(A) + np.diag(Om)
            G = K @ np.diag(A) @ np.linalg.inv(S)
            mu = m0 + G @ (y - A * m0 - b)
            W = K - G @ S @ G.T
    var = np.diag(W)
    A, b, Om = slr(mu, var)
    S = np.diag(A) @ K @ np.diag(A) + np.diag(Om)
    r = y - b - A * m0
    log_p_hat = -0.5 * (r @ np.linalg.solve(S, r) + np.linalg.slogdet(S)[1] + n * np.log(2 * np.pi))
    x, w = hermegauss(order)
    w = w / w.sum()
    corr = 0.0
    for i in range(n):
        f = mu[i] + np.sqrt(var[i]) * x
        p = np.exp(likelihood.log_prob(np.full(len(f), y[i]), f))
        q = np.exp(-0.5 * (y[i] - A[i] * f - b[i]) ** 2 / Om[i]) / np.sqrt(2 * np.pi * Om[i])
        corr += np.log(np.sum(w * p / q))
    return mu, W, float(log_p_hat + corr), log_p_hat
