"""Slow, obvious NumPy Laplace (Rasmussen & Williams §3.4, eq. (3.18), (3.27), (3.32) and §5.5.1):
dense solves, explicit n x n x p derivative tensors, no tricks.  Only for tests.

K itself is never inverted: a smooth kernel on a few dozen points has cond(K) ~ 1e10, and K⁻¹ would
cost the reference eight digits (seen: 1e-8 relative error in the gradient against 50-digit
arithmetic).  Every solve below is with B = I + W^½ K W^½ (symmetric, eigenvalues ≥ 1), or with I + W K in the
Newton iteration, where a few digits suffice because the fixed point is what matters.
"""

import numpy as np


def laplace_reference(K, y, log_prob_derivatives, dK=None, m0=None, iters=200):
    n = len(y)
    eye = np.eye(n)
    m0 = np.zeros(n) if m0 is None else m0
    f = m0.copy()
    a = np.zeros(n)
    for _ in range(iters):
        lp, d1, d2, d3 = log_prob_derivatives(y, f)
        W = np.diag(-d2)
        # Newton on Ψ(f) = Σ log p − ½ (f − m0)ᵀ K⁻¹ (f − m0), R&W eq. (3.18):
        # f_new − m0 = (K⁻¹ + W)⁻¹ (W (f − m0) + ∇ log p) = K a,  a = (I + W K)⁻¹ (W (f − m0) + ∇ log p)
        a = np.linalg.solve(eye + W @ K, W @ (f - m0) + d1)
        f_new = m0 + K @ a
        if np.max(np.abs(f_new - f)) < 1e-13:
            f = f_new
            break
        f = f_new
    lp, d1, d2, d3 = log_prob_derivatives(y, f)
    # at the mode ∇Ψ = 0, so a = K⁻¹ (f̂ − m0) = ∇ log p(y|f̂) (R&W eq. (3.17)); taking it from there
    # avoids the ill-conditioned solve with K in directions where K is nearly singular
    a = d1
    W = np.diag(-d2)
    sW = np.sqrt(W)
    B = eye + sW @ K @ sW
    psi = lp.sum() - 0.5 * a @ (f - m0)          # a = K⁻¹ (f − m0)
    log_z = psi - 0.5 * np.linalg.slogdet(B)[1]
    if dK is None:
        return f, log_z
    # (K⁻¹ + W)⁻¹ = K − K W^½ B⁻¹ W^½ K, R&W eq. (3.27); (I + K W)⁻¹ = I − K W^½ B⁻¹ W^½ likewise
    Sigma = K - K @ sW @ np.linalg.solve(B, sW @ K)
    I_KW_inv = eye - K @ sW @ np.linalg.solve(B, sW)
    grad = np.empty(dK.shape[2])
    for k in range(dK.shape[2]):
        C = dK[:, :, k]
        # explicit: ½ aᵀ C a − ½ tr((W⁻¹ + K)⁻¹ C), via tr(B⁻¹ W^½ C W^½)
        explicit = 0.5 * a @ C @ a - 0.5 * np.trace(np.linalg.solve(B, sW @ C @ sW))
        # implicit: ∂ log q/∂f̂ · ∂f̂/∂θ, ∂f̂/∂θ = (I + K W)⁻¹ C ∇ log p   (R&W eq. (5.24))
        dlogq_df = 0.5 * np.diag(Sigma) * d3
        df = I_KW_inv @ (C @ d1)
        grad[k] = explicit + dlogq_df @ df
    return f, log_z, grad
