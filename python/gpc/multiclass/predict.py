"""RMGPC's predictive distribution, eq. (19)-(20), by vectorised Gauss–Hermite quadrature."""

import numpy as np
from scipy.special import log_ndtr

#: Gauss–Hermite order of the 1-D integral in eq. (19); its integrand Π Φ is smooth and bounded
N_NODES = 64
_GH_X, _GH_W = np.polynomial.hermite.hermgauss(N_NODES)


def argmax_probabilities(means, varis):
    """P(y* = y) = ∫ N(u | m_y, v_y) Π_{k≠y} Φ((u − m_k)/√v_k) du for every y (RMGPC eq. (19)).

    means, varis : (m, l).  One Gauss–Hermite rule in u = m_y + √(2 v_y) x for all points and classes
    at once; the l integrals sum to one exactly, so the quadrature's small error is removed by
    normalising each row.
    """
    u = means[:, :, None] + np.sqrt(2.0 * varis)[:, :, None] * _GH_X            # (m, y, node)
    z = (u[:, :, None, :] - means[:, None, :, None]) / np.sqrt(varis)[:, None, :, None]
    log_cdf = log_ndtr(z)                                                        # (m, y, k, node)
    l = means.shape[1]
    log_cdf[:, np.arange(l), np.arange(l), :] = 0.0                              # no k = y factor
    integrand = np.exp(log_cdf.sum(axis=2))
    probs = integrand @ _GH_W / np.sqrt(np.pi)
    return probs / probs.sum(axis=1, keepdims=True)


def predict_proba(result, K_crosses, k_diags):
    """ρ̄/l + (1 − ρ̄) P(argmax = y) of RMGPC eq. (19), shape (m, l)."""
    moments = [p.latent_moments(Kc, kd) for p, Kc, kd in zip(result.classes, K_crosses, k_diags)]
    means = np.column_stack([m for m, _ in moments])
    varis = np.column_stack([v for _, v in moments])
    l = means.shape[1]
    rho = result.rho_mean
    return rho / l + (1.0 - rho) * argmax_probabilities(means, varis)
