"""Slow, obvious NumPy Laplace (Rasmussen & Williams §3.4, eq. (3.32) and §5.5.1): explicit inverses,
explicit n x n x p derivative tensors, no tricks.  Only for tests."""

import numpy as np


def laplace_reference(K, y, log_prob_derivatives, dK=None, m0=None, iters=200):
    n = len(y)
    m0 = np.zeros(n) if m0 is None else m0
    Kinv = np.linalg.inv(K)
    f = m0.copy()
    for _ in range(iters):
        lp, d1, d2, d3 = log_prob_derivatives(y, f)
        W = np.diag(-d2)
        # Newton on Ψ(f) = Σ log p − ½ (f − m0)ᵀ K⁻¹ (f − m0)
        grad = d1 - Kinv @ (f - m0)
        H = -(Kinv + W)
        f_new = f - np.linalg.solve(H, grad)
        if np.max(np.abs(f_new - f)) < 1e-13:
            f = f_new
            break
        f = f_new
    lp, d1, d2, d3 = log_prob_derivatives(y, f)
    W = np.diag(-d2)
    sW = np.sqrt(W)
    B = np.eye(n) + sW @ K @ sW
    psi = lp.sum() - 0.5 * (f - m0) @ Kinv @ (f - m0)
    log_z = psi - 0.5 * np.linalg.slogdet(B)[1]
    if dK is None:
        return f, log_z
    Sigma = np.linalg.inv(Kinv + W)
    a = Kinv @ (f - m0)
    grad = np.empty(dK.shape[2])
    for k in range(dK.shape[2]):
        C = dK[:, :, k]
        # explicit: ½ aᵀ C a − ½ tr((W⁻¹ + K)⁻¹ C), via tr(B⁻¹ W^½ C W^½)
        explicit = 0.5 * a @ C @ a - 0.5 * np.trace(np.linalg.solve(B, sW @ C @ sW))
        # implicit: ∂ log q/∂f̂ · ∂f̂/∂θ, ∂f̂/∂θ = (I + K W)⁻¹ C ∇ log p   (R&W eq. (5.24))
        dlogq_df = 0.5 * np.diag(Sigma) * d3
        df = np.linalg.solve(np.eye(n) + K @ W, C @ d1)
        grad[k] = explicit + dlogq_df @ df
    return f, log_z, grad
