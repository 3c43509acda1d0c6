"""The inducing-point geometry every sparse method shares (SEP §2.1-§2.2).

With inducing inputs Z (m x d) and values u = f(Z), K_uu = L Lᵀ is held by its Cholesky factor only
(never inverted).  For a block of rows X_b the module gives

* ``A_b = K_bu L⁻ᵀ`` (rows a_i = L⁻¹ k_i: the whitened form of SEP's v_i = K_uu⁻¹ k_i, v_i = L⁻ᵀ a_i),
* ``s_b = k_ii - |a_i|²``, the FITC conditional variance s_i of SEP eq. (1),

and turns the matrix derivatives of an objective F with respect to K_bu, K_uu and diag K_bb into the
derivative with respect to the kernel's log hyperparameters and to Z, through the kernel's
``gradient_contract`` and ``gradient_inputs`` (no n x m x p tensor is formed).
"""

import numpy as np
from scipy.linalg import solve_triangular

from .._linalg import cholesky_lower


class InducingFactor:
    """K_uu = L Lᵀ for one kernel and one Z; ``jitter`` (relative to the mean diagonal) is added first.

    Parameters
    ----------
    kernel : gpc.kernels.Kernel
    Z : ndarray (m, d)
    jitter : float
        Added to the diagonal of K_uu as ``jitter * mean(diag K_uu)``; 0 is allowed (the Z = X check).
    """

    def __init__(self, kernel, Z, jitter=1e-8):
        self.kernel = kernel
        self.Z = np.ascontiguousarray(Z, dtype=np.float64)
        Kuu = kernel(self.Z)
        m = Kuu.shape[0]
        Kuu.flat[:: m + 1] += jitter * float(np.trace(Kuu)) / m
        self.L, _ = cholesky_lower(Kuu, name="K_uu (kernel at the inducing points)")

    @property
    def m(self):
        return self.L.shape[0]

    def whiten(self, Xb):
        """(A_b, s_b): A_b = K_bu L⁻ᵀ and s_b = diag K_bb - rowsum(A_b²), clipped at 0 (rounding)."""
        Kbu = self.kernel(Xb, self.Z)
        A = solve_triangular(self.L, Kbu.T, lower=True, check_finite=False).T
        s = self.kernel.diag(Xb) - np.einsum("ij,ij->i", A, A)
        return np.ascontiguousarray(A), np.maximum(s, 0.0)

    def unwhiten_rows(self, A):
        """Rows v_i = L⁻ᵀ a_i (SEP eq. (2)'s v_i = K_uu⁻¹ k_i) for the rows a_i of A."""
        return solve_triangular(self.L, A.T, lower=True, trans="T", check_finite=False).T

    def block_gradient(self, Xb, G_A, g_s):
        """Kernel and Z gradient of the K_bu and diag K_bb parts of dF.

        ``G_A`` is the total ∂F/∂A_b (b x m), the part through s = diag K_bb - rowsum(A²)
        included, and ``g_s`` is ∂F/∂s_b (b,).  Since A_b = K_bu L⁻ᵀ, ∂F/∂K_bu = G_A L⁻¹, and
        ∂F/∂k_ii = g_s.

        Returns (g_theta (p,), g_Z (m, d)).
        """
        G_bu = solve_triangular(self.L, G_A.T, lower=True, trans="T", check_finite=False).T
        b, m = G_bu.shape
        # one contraction over the stacked inputs [X_b; Z] of the symmetric block matrix
        # [[diag g_s, G_bu / 2], [G_buᵀ / 2, 0]] gives Σ G_bu ∂K_bu/∂θ + Σ g_s ∂k_ii/∂θ
        M = np.zeros((b + m, b + m))
        M.flat[: b * (b + m + 1): b + m + 1] = g_s
        M[:b, b:] = 0.5 * G_bu
        M[b:, :b] = 0.5 * G_bu.T
        g_theta = self.kernel.gradient_contract(np.vstack([Xb, self.Z]), M, symmetric=True)
        g_Z = self.kernel.gradient_inputs(self.Z, Xb, np.ascontiguousarray(G_bu.T))
        return g_theta, g_Z

    def uu_gradient(self, AtG):
        """Kernel and Z gradient of the K_uu part, given Σ_b A_bᵀ G_A,b (m x m) at fixed K_bu.

        A = K_fu L⁻ᵀ gives ∂F/∂L = -L⁻ᵀ (AᵀG_A)ᵀ, and the Cholesky factor's reverse rule
        (Murray 2016) ∂F/∂K_uu = sym(L⁻ᵀ Φ(Lᵀ ∂F/∂L) L⁻¹), Φ = lower triangle with its diagonal
        halved.  When F depends on A only through A Aᵀ (EP), AᵀG_A is symmetric and this is
        -L⁻ᵀ AᵀG_A L⁻¹ / 2; SVI's whitened mean makes it non-symmetric.
        """
        P = np.tril(-AtG.T)
        P.flat[:: P.shape[0] + 1] *= 0.5
        T = solve_triangular(self.L, P, lower=True, trans="T", check_finite=False)
        G_uu = solve_triangular(self.L, T.T, lower=True, trans="T", check_finite=False).T
        G_uu = 0.5 * (G_uu + G_uu.T)
        g_theta = self.kernel.gradient_contract(self.Z, G_uu, symmetric=True)
        # k(z_i, z_j) depends on Z through both arguments: 2 x the first-argument derivative
        g_Z = 2.0 * self.kernel.gradient_inputs(self.Z, self.Z, G_uu)
        return g_theta, g_Z
