"""Annealed importance sampling (Neal 2001) of ln Z = ln ∫ Π_i p(y_i|f_i) N(f | 0, K) df.

The reference evidence of ``nr-bounds`` (Kuss & Rasmussen 2005 and Nickisch & Rasmussen 2008 use AIS
for theirs).  Two paths, both with elliptical slice sampling (ESS; Murray, Adams & MacKay 2010) as the
transition, which leaves N(f | c, S) exp(β g(f)) invariant using only draws of N(0, S) and g:

* from the prior (``ais_log_z``): π_β ∝ N(f | 0, K) p(y|f)^β, g = ln p(y|f);
* from a Gaussian approximation q = N(m, V) with sites W ≥ 0 (``ais_log_z_from_gaussian``):
  π_β ∝ q(f) [p(y|f) N(f|0,K) / q(f)]^β, g = ln p(y|f) + ln N(f|0,K) − ln q(f).  Written without K⁻¹
  (α = K⁻¹m is the posterior's α, V⁻¹ = K⁻¹ + W):
  ln N(f|0,K) − ln N(f|m,V) = −αᵀf + ½αᵀm + ½(f − m)ᵀW(f − m) − ½ ln|I + W^½ K W^½|.
  With q close to the posterior far fewer temperatures are needed; at large σ_f (a highly non-Gaussian
  posterior) the prior path needs very many temperatures and underestimates ln Z with a few thousand.

The estimate is ln mean_c exp(w_c) over chains, w_c = Σ_k (β_k − β_{k−1}) g(f_c^{(k−1)}); its standard
error is the delta-method one, sd(exp w)/(√C mean(exp w)).  All chains run as one (n, C) array.
"""

import numpy as np
from scipy.special import log_ndtr, logsumexp


def log_likelihood_fn(likelihood, y):
    """f (n, C) -> (C,) Σ_i ln p(y_i | f_ic), vectorised over chains: 'probit' and 'logit' in closed
    form, any other gpc Likelihood instance through its ``log_prob`` (e.g. the noisy threshold)."""
    name = getattr(likelihood, "name", likelihood)
    y = np.asarray(y, dtype=float)[:, None]
    if name == "probit":
        return lambda F: log_ndtr(y * F).sum(axis=0)
    if name == "logit":
        return lambda F: -np.logaddexp(0.0, -y * F).sum(axis=0)
    if hasattr(likelihood, "log_prob"):
        def loglik(F):
            labels = np.broadcast_to(y, F.shape).ravel()
            return likelihood.log_prob(labels, F.ravel()).reshape(F.shape).sum(axis=0)
        return loglik
    raise ValueError(f"AIS reference implemented for probit, logit and Likelihood instances, not {name!r}")


def _ess(F, ll, L, loglik, beta, rng, center=None):
    """One elliptical slice sampling step per chain, targeting N(center, L Lᵀ) exp(β ll)."""
    n, C = F.shape
    if center is not None:
        F_c = F - center[:, None]
        F_new, ll_new = _ess(F_c, ll, L, lambda G: loglik(G + center[:, None]), beta, rng)
        return F_new + center[:, None], ll_new
    nu = L @ rng.standard_normal((n, C))
    log_u = beta * ll + np.log(rng.uniform(size=C))
    theta = rng.uniform(0.0, 2.0 * np.pi, size=C)
    lo, hi = theta - 2.0 * np.pi, theta.copy()
    F_new, ll_new = F.copy(), ll.copy()
    active = np.arange(C)
    for _ in range(200):
        if active.size == 0:
            break
        th = theta[active]
        prop = F[:, active] * np.cos(th) + nu[:, active] * np.sin(th)
        llp = loglik(prop)
        acc = beta * llp > log_u[active]
        done = active[acc]
        F_new[:, done] = prop[:, acc]
        ll_new[done] = llp[acc]
        rej = active[~acc]
        th_r = theta[rej]
        neg = th_r < 0
        lo[rej] = np.where(neg, th_r, lo[rej])
        hi[rej] = np.where(neg, hi[rej], th_r)
        theta[rej] = rng.uniform(lo[rej], hi[rej])
        active = rej
    return F_new, ll_new


def ais_log_z(K, y, likelihood="probit", n_temps=1000, n_chains=8, n_steps=1, power=4.0, seed=0,
              jitter=0.0):
    """AIS estimate of ln Z; returns (ln Z, standard error, per-chain log weights).

    Parameters
    ----------
    K : (n, n) prior covariance; y : labels ±1; likelihood : "probit" / "logit" (or an instance)
    n_temps : number of temperatures; β_k = (k / (n_temps − 1))^power, dense near 0
    n_chains : independent chains; n_steps : ESS steps per temperature
    """
    rng = np.random.default_rng(seed)
    n = K.shape[0]
    L = np.linalg.cholesky(K + jitter * np.eye(n))
    loglik = log_likelihood_fn(likelihood, y)
    betas = np.linspace(0.0, 1.0, n_temps) ** power
    F = L @ rng.standard_normal((n, n_chains))
    ll = loglik(F)
    logw = np.zeros(n_chains)
    for b_prev, b in zip(betas[:-1], betas[1:]):
        logw += (b - b_prev) * ll
        for _ in range(n_steps):
            F, ll = _ess(F, ll, L, loglik, b, rng)
    log_z = float(logsumexp(logw) - np.log(n_chains))
    w = np.exp(logw - logw.max())
    se = float(w.std(ddof=1) / (np.sqrt(n_chains) * w.mean())) if n_chains > 1 else float("nan")
    return log_z, se, logw


def _anneal(F, g, L, center, n_temps, power, n_steps, rng):
    betas = np.linspace(0.0, 1.0, n_temps) ** power
    ll = g(F)
    logw = np.zeros(F.shape[1])
    for b_prev, b in zip(betas[:-1], betas[1:]):
        logw += (b - b_prev) * ll
        for _ in range(n_steps):
            F, ll = _ess(F, ll, L, g, b, rng, center)
    return logw


def _estimate(logw):
    C = len(logw)
    log_z = float(logsumexp(logw) - np.log(C))
    w = np.exp(logw - logw.max())
    se = float(w.std(ddof=1) / (np.sqrt(C) * w.mean())) if C > 1 else float("nan")
    return log_z, se, logw


def ais_log_z_from_gaussian(K, y, likelihood, mean, site_precision, n_temps=300, n_chains=8,
                            n_steps=1, power=2.0, seed=0, jitter=1e-10):
    """AIS from q = N(m, (K⁻¹ + W)⁻¹) (m = K α, W = diag(site_precision) ≥ 0) to the posterior.

    Returns (ln Z, standard error, per-chain log weights).
    """
    rng = np.random.default_rng(seed)
    n = K.shape[0]
    W = np.asarray(site_precision, dtype=float)
    if np.any(W < 0):
        raise ValueError("AIS from a Gaussian needs non-negative site precisions")
    m = np.asarray(mean, dtype=float)
    sW = np.sqrt(W)
    B = np.eye(n) + sW[:, None] * K * sW[None, :]
    LB = np.linalg.cholesky(B)
    logdet_B = 2.0 * np.log(np.diag(LB)).sum()
    # α = K⁻¹ m from the site form: m = K (ν − W m) ... computed stably as α = b − S B⁻¹ S K b is not
    # available here, so solve (K + jitter) α = m via the Cholesky of K (only α ᵀ f is needed)
    LK = np.linalg.cholesky(K + jitter * np.trace(K) / n * np.eye(n))
    alpha = np.linalg.solve(LK.T, np.linalg.solve(LK, m))
    # V = K − K S B⁻¹ S K
    Vh = np.linalg.solve(LB, sW[:, None] * K)
    V = K - Vh.T @ Vh
    LV = np.linalg.cholesky(0.5 * (V + V.T) + jitter * np.trace(V) / n * np.eye(n))
    loglik = log_likelihood_fn(likelihood, y)
    const = 0.5 * alpha @ m - 0.5 * logdet_B

    def g(F):
        D = F - m[:, None]
        return loglik(F) - alpha @ F + const + 0.5 * np.einsum("ic,i,ic->c", D, W, D)

    F = m[:, None] + LV @ rng.standard_normal((n, n_chains))
    return _estimate(_anneal(F, g, LV, m, n_temps, power, n_steps, rng))
