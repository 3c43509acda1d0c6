"""The inducing-point geometry every sparse method shares (SEP §2.1-§2.2).

With inducing inputs Z (m x d) and values u = f(Z), K_uu = L Lᵀ is held by its Cholesky factor only
(never inverted).  For a block of rows X_b the module gives

* ``A_b = K_bu L⁻ᵀ`` (rows a_i = L⁻¹ k_i: the whitened form of SEP's v_i = K_uu⁻¹ k_i, v_i = L⁻ᵀ a_i),
* ``s_b = k_ii - |a_i|²``, the FITC conditional variance s_i of SEP eq. (1),

and turns the matrix derivatives of an objective F with respect to K_bu, K_uu and diag K_bb into the
derivative with respect to the kernel's log hyperparameters and to Z.  For the squared exponential
(with or without an amplitude ``c``) this is done here from the kernel values already computed, by
b x m and m x m products (:class:`_SquaredExponential`); other kernels go through their
``gradient_contract`` and ``gradient_inputs`` (no n x m x p tensor is formed either way).
"""

import copy

import numpy as np

from .. import _lapack, _sparse
from .._linalg import cholesky_lower
from ..kernels import RBF, ConstantKernel, Product


class _SquaredExponential:
    """Gradients of c · exp(-½ Σ_d (x_d - z_d)²/ℓ_d²) contracted from the kernel values.

    With W = G ∘ K for a weight matrix G over the pairs (x_i, z_j):

        Σ G ∂K/∂log c = Σ W,
        Σ G ∂K/∂log ℓ_d = Σ_ij W_ij (x_id - z_jd)²/ℓ_d²
                        = [rowsum(W)ᵀ x̃_d² + colsum(W)ᵀ z̃_d² - 2 x̃_dᵀ W z̃_d] / ℓ_d²,
        Σ_i G_ij ∂k(x_i, z_j)/∂z_jd = [(Wᵀ X̃)_jd - colsum(W)_j z̃_jd] / ℓ_d²,

    with x̃, z̃ the inputs shifted by the mean of Z (so the expansion does not cancel).  One b x m
    product with W instead of a pass over a (b + m)² block.  ``order`` is where (log c, log ℓ)
    sit in the kernel's ``theta``.
    """

    def __init__(self, amplitude, rbf, amplitude_first):
        self.c = 1.0 if amplitude is None else float(amplitude.constant_value)
        self.c_free = amplitude is not None and amplitude._free()
        self.ls = np.atleast_1d(np.asarray(rbf.length_scale, dtype=np.float64))
        self.ls_free = rbf._free()
        self.amplitude_first = amplitude_first

    @classmethod
    def of(cls, kernel):
        """The fast path for ``kernel`` when it is RBF or ConstantKernel · RBF, else None."""
        if type(kernel) is RBF:
            return cls(None, kernel, True)
        if type(kernel) is Product:
            a, b = kernel._a, kernel._b
            if type(a) is ConstantKernel and type(b) is RBF:
                return cls(a, b, True)
            if type(a) is RBF and type(b) is ConstantKernel:
                return cls(b, a, False)
        return None

    def at(self, kernel):
        """This fast path for ``kernel``, a :meth:`with_theta` of the kernel it was made for:
        the same form and free parameters, the new values (no re-inspection of the kernel)."""
        new = copy.copy(self)
        if type(kernel) is RBF:
            rbf = kernel
        else:
            amplitude, rbf = ((kernel.k1, kernel.k2) if self.amplitude_first
                              else (kernel.k2, kernel.k1))
            new.c = float(amplitude.constant_value)
        new.ls = np.atleast_1d(np.asarray(rbf.length_scale, dtype=np.float64))
        return new

    def with_theta(self, kernel, theta):
        """``kernel.clone_with_theta(theta)`` for this kernel's form, by shallow copies.

        ``theta`` comes from the kernel's own (validated) theta moved by an optimiser step and
        clipped to its bounds, so the parameter checks of a full clone (a millisecond, as much
        as a b x m x m product at m = 200) are skipped."""
        theta = np.exp(np.asarray(theta, dtype=np.float64))
        if type(kernel) is RBF:
            new = rbf = copy.copy(kernel)
            amplitude = None
        else:
            new = copy.copy(kernel)
            new.k1, new.k2 = copy.copy(kernel.k1), copy.copy(kernel.k2)
            amplitude, rbf = (new.k1, new.k2) if self.amplitude_first else (new.k2, new.k1)
        c_at = 0 if self.amplitude_first or not self.ls_free else self.ls.size
        ls_at = 1 if self.amplitude_first and self.c_free else 0
        if self.c_free:
            amplitude.constant_value = float(theta[c_at])
        if self.ls_free:
            ls = theta[ls_at:ls_at + self.ls.size]
            rbf.length_scale = ls.copy() if np.ndim(rbf.length_scale) > 0 else float(ls[0])
        return new

    def cross(self, X, Z):
        """K(X, Z) = c exp(-½ |x̃ - z̃|²) with x̃ = (x - z̄)/ℓ (shifted by the mean of Z so that
        |x̃|² + |z̃|² - 2 x̃ᵀz̃ does not cancel): one b x d x m product, one pass and one
        vectorised exp."""
        Xs, Zs = self._scaled(X, Z)
        K = Xs @ Zs.T
        _sparse.squared_exponential_exponent(K, np.einsum("ij,ij->i", Xs, Xs),
                                             np.einsum("ij,ij->i", Zs, Zs), np.log(self.c))
        return np.exp(K, out=K)

    def _scaled(self, X, Z):
        shift = Z.mean(axis=0)
        return (X - shift) / self.ls, (Z - shift) / self.ls

    def contract(self, X, Z, K, G, g_diag=None, overwrite=False):
        """(Σ G ∂K/∂θ [+ Σ g_diag ∂k_ii/∂θ], the gradient in Z through K's second argument).

        With ``overwrite`` G (C-contiguous) is used as the scratch for W = G ∘ K."""
        W = G if overwrite else np.array(G, dtype=np.float64, order="C")
        rows, cols = np.empty(W.shape[0]), np.empty(W.shape[1])
        _sparse.hadamard_sums(W, K, rows, cols)
        Xs, Zs = self._scaled(X, Z)
        WZ = W @ Zs
        parts = []
        if self.c_free:
            total = float(rows.sum()) + (self.c * float(np.sum(g_diag)) if g_diag is not None else 0.0)
            parts.append(np.array([total]))
        if self.ls_free:
            per_d = rows @ (Xs * Xs) + cols @ (Zs * Zs) - 2.0 * np.einsum("id,id->d", Xs, WZ)
            parts.append(per_d if self.ls.size > 1 else np.array([per_d.sum()]))
        if not self.amplitude_first:
            parts.reverse()
        g_theta = np.concatenate(parts) if parts else np.empty(0)
        g_Z = (W.T @ Xs - cols[:, None] * Zs) / self.ls
        return g_theta, g_Z


class InducingFactor:
    """K_uu = L Lᵀ for one kernel and one Z; ``jitter`` (relative to the mean diagonal) is added first.

    Parameters
    ----------
    kernel : gpc.kernels.Kernel
    Z : ndarray (m, d)
    jitter : float
        Added to the diagonal of K_uu as ``jitter * mean(diag K_uu)``; 0 is allowed (the Z = X check).
    fast : the squared exponential's fast path for ``kernel`` when known
        (:meth:`_SquaredExponential.at`)
    """

    def __init__(self, kernel, Z, jitter=1e-8, fast=None):
        self.kernel = kernel
        self.Z = np.ascontiguousarray(Z, dtype=np.float64)
        self.fast = _SquaredExponential.of(kernel) if fast is None else fast
        if self.fast is not None:
            self.Kuu = self.fast.cross(self.Z, self.Z)
            _sparse.mirror_lower(self.Kuu)                    # exactly symmetric,
            np.fill_diagonal(self.Kuu, self.fast.c)           # exactly c on the diagonal
        else:
            self.Kuu = kernel(self.Z)
        m = self.Kuu.shape[0]

        def jittered():
            Kj = self.Kuu.copy()
            Kj.flat[:: m + 1] += jitter * float(np.trace(Kj)) / m
            return Kj

        self.L, _ = cholesky_lower(jittered(), name="K_uu (kernel at the inducing points)",
                                   overwrite=True, rebuild=jittered)
        # L⁻¹, explicit: every product with it is a triangular multiply (dtrmm), which runs at
        # twice the speed of a triangular solve (dtrsm) at m = 200 and serves the whitening, the
        # gradient and the move of q to a new factor alike
        self.Li = self.L.copy()
        _sparse.lower_inverse_in_place(self.Li)   # L has a positive diagonal: never singular

    @property
    def m(self):
        return self.L.shape[0]

    def cross(self, Xb):
        """K_bu (b x m), through the squared exponential's fast path when it applies."""
        if self.fast is not None:
            return self.fast.cross(Xb, self.Z)
        return np.ascontiguousarray(self.kernel(Xb, self.Z))

    def diag(self, Xb):
        """diag K_bb."""
        if self.fast is not None:
            return np.full(Xb.shape[0], self.fast.c)
        return self.kernel.diag(Xb)

    def whiten(self, Xb, keep_cross=False):
        """(A_b, s_b): A_b = K_bu L⁻ᵀ and s_b = diag K_bb - rowsum(A_b²), clipped at 0 (rounding).

        With ``keep_cross`` also K_bu, which :meth:`block_gradient` can reuse."""
        Kbu = self.cross(Xb)
        A = Kbu.copy() if keep_cross else Kbu
        _lapack.multiply_triangular_rows(self.Li, A, False)   # rows a_i = L⁻¹ k_i
        s = self.diag(Xb) - np.einsum("ij,ij->i", A, A)
        np.maximum(s, 0.0, out=s)
        return (A, s, Kbu) if keep_cross else (A, s)

    def block_gradient(self, Xb, G_A, g_s, Kbu=None, overwrite=False):
        """Kernel and Z gradient of the K_bu and diag K_bb parts of dF.

        ``G_A`` is the total ∂F/∂A_b (b x m), the part through s = diag K_bb - rowsum(A²)
        included, and ``g_s`` is ∂F/∂s_b (b,).  Since A_b = K_bu L⁻ᵀ, ∂F/∂K_bu = G_A L⁻¹, and
        ∂F/∂k_ii = g_s.  ``Kbu`` (from :meth:`whiten`) saves recomputing the kernel block; with
        ``overwrite`` G_A (C-contiguous) is the scratch of the products.

        Returns (g_theta (p,), g_Z (m, d)).
        """
        G_bu = G_A if overwrite else np.array(G_A, dtype=np.float64, order="C")
        _lapack.multiply_triangular_rows(self.Li, G_bu, True)   # G_A L⁻¹
        if self.fast is not None:
            return self.fast.contract(Xb, self.Z, self.cross(Xb) if Kbu is None else Kbu, G_bu,
                                      g_s, overwrite=True)
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
        halved.  When F depends on A only through A Aᵀ, AᵀG_A is symmetric and this is
        -L⁻ᵀ AᵀG_A L⁻¹ / 2; SVI's whitened mean makes it non-symmetric.
        """
        # sym(L⁻ᵀ Φ L⁻¹) = L⁻ᵀ sym(Φ) L⁻¹
        G = np.empty_like(self.L)
        _sparse.symmetric_from_upper(np.ascontiguousarray(AtG, dtype=np.float64), G, -0.5)
        return self.uu_gradient_whitened(G, overwrite=True)

    def uu_gradient_whitened(self, G, overwrite=False):
        """Kernel and Z gradient of ∂F/∂K_uu = L⁻ᵀ G L⁻¹ for a symmetric w-space G (m x m): one
        congruence with the explicit L⁻¹ (two dtrmm) and the kernel's contraction.  With
        ``overwrite`` G (C-contiguous) is the scratch."""
        G_uu = G if overwrite else np.array(G, dtype=np.float64, order="C")
        _sparse.congruence(self.Li, G_uu)
        if self.fast is not None:
            # G_uu is symmetric, so both arguments' Z derivatives are equal: twice the second's
            g_theta, g_Z = self.fast.contract(self.Z, self.Z, self.Kuu, G_uu, overwrite=True)
            return g_theta, 2.0 * g_Z
        g_theta = self.kernel.gradient_contract(self.Z, G_uu, symmetric=True)
        # k(z_i, z_j) depends on Z through both arguments: 2 x the first-argument derivative
        g_Z = 2.0 * self.kernel.gradient_inputs(self.Z, self.Z, G_uu)
        return g_theta, g_Z
